/* cmd — dlsharectl's subcommands. */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

/* ---- subcommands ------------------------------------------------------ */

/* Connects to the daemon; on failure says which socket it tried.
 * Returns 0 or CTL_EFAIL. */
int ctl_connect(const struct ctl *ctl, dlshare_client **out)
{
	char path[PATH_MAX];
	int err;

	err = dlshare_connect(ctl->socket, out);
	if (err == 0)
		return CTL_OK;
	if (ctl->socket)
		ctl_report(ctl->cmd->name, err, ctl->socket);
	else if (dlshare_socket_path(path, sizeof(path)) == 0)
		ctl_report(ctl->cmd->name, err, path);
	else
		ctl_report(ctl->cmd->name, err, "the default socket");
	return CTL_EFAIL;
}

/* ls gathers every name before printing, so that a failure halfway through
 * leaves no half-printed table or unterminated JSON array behind. */
struct name_list {
	dlshare_name_info *v;
	dlshare_queue_info *q;	/* depth 0: not a queue */
	size_t n;
	size_t cap;
	int err;
};

static int ls_collect(const dlshare_name_info *info,
		      const dlshare_queue_info *queue, void *arg)
{
	struct name_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		dlshare_name_info *v = reallocarray(l->v, cap, sizeof(*v));
		dlshare_queue_info *q;

		if (!v) {
			l->err = DLSHARE_ENOMEM;
			return 1;
		}
		l->v = v;
		q = reallocarray(l->q, cap, sizeof(*q));
		if (!q) {
			l->err = DLSHARE_ENOMEM;
			return 1;
		}
		l->q = q;
		l->cap = cap;
	}
	if (queue)
		l->q[l->n] = *queue;
	else
		memset(&l->q[l->n], 0, sizeof(l->q[l->n]));
	l->v[l->n] = *info;
	/* It gets printed with %s: make sure it ends. */
	l->v[l->n].name[sizeof(l->v[l->n].name) - 1] = '\0';
	l->n++;
	return 0;
}

static void ls_print_text(const struct name_list *l)
{
	int w = 4;	/* strlen("NAME") */
	size_t i;

	for (i = 0; i < l->n; i++) {
		int len = (int)strlen(l->v[i].name);

		if (len > w)
			w = len;
	}
	printf("%-*s  %8s  %8s  %7s  %14s  %6s  %-8s  %-4s  %5s  %-11s  %s\n",
	       w, "NAME", "LATEST", "VERSIONS", "TENSORS", "BYTES", "LEASES",
	       "KIND", "MODE", "OWNER", "QUEUE", "ORIGIN");
	for (i = 0; i < l->n; i++) {
		const dlshare_name_info *in = &l->v[i];
		const dlshare_queue_info *q = &l->q[i];
		const char *kind = ctl_kind_name(in->kind);
		char queue[48] = "-", origin[96] = "-";

		/* A queue name: how full it is, of its depth. */
		if (q->depth)
			snprintf(queue, sizeof(queue), "%" PRIu32 "/%" PRIu32,
				 q->queued + q->taken + q->pending, q->depth);
		/* A mirrored name (protocol 1.5): node:version it came from. */
		if (in->origin_node[0])
			snprintf(origin, sizeof(origin), "%s:%" PRIu64,
				 in->origin_node, in->origin_version);
		printf("%-*s  %8" PRIu64 "  %8" PRIu32 "  %7" PRIu32 "  %14" PRIu64
		       "  %6" PRIu32 "  %-8s  %04" PRIo32 "  %5" PRIu32
		       "  %-11s  %s\n",
		       w, in->name, in->latest, in->versions, in->tensors,
		       in->bytes, in->leases, kind ? kind : "-",
		       in->mode & 07777, in->owner_uid, queue, origin);
	}
}

/* ,"queue":{...} of a queue name, or ,"queue":null. */
static void json_queue(const dlshare_queue_info *q)
{
	if (!q->depth) {
		fputs(",\"queue\":null", stdout);
		return;
	}
	printf(",\"queue\":{\"depth\":%" PRIu32 ",\"queued\":%" PRIu32
	       ",\"taken\":%" PRIu32 ",\"pending\":%" PRIu32
	       ",\"waiting\":%" PRIu32 "}", q->depth, q->queued, q->taken,
	       q->pending, q->waiting);
}

static void ls_print_json(const struct name_list *l)
{
	size_t i;

	putchar('[');
	for (i = 0; i < l->n; i++) {
		if (i)
			putchar(',');
		ctl_json_name_info(stdout, &l->v[i], true);
		json_queue(&l->q[i]);
		putchar('}');
	}
	fputs("]\n", stdout);
}

int cmd_ls(const struct ctl *ctl)
{
	const char *prefix = ctl->nargs > 0 ? ctl->args[0] : NULL;
	struct name_list list = { .v = NULL };
	dlshare_client *c = NULL;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_list_ex(c, prefix, ls_collect, &list);
	if (err == 0)
		err = list.err;
	if (err < 0) {
		ctl_report("ls", err, prefix);
		ret = CTL_EFAIL;
	} else if (ctl->json) {
		ls_print_json(&list);
	} else {
		ls_print_text(&list);
	}
	free(list.v);
	free(list.q);
	dlshare_disconnect(c);
	return ret;
}

static void stat_print_text(const dlshare_name_info *in,
			    const dlshare_queue_info *q,
			    const dlshare_manifest *m)
{
	const char *kind = ctl_kind_name(in->kind);
	size_t i, n = m ? dlshare_manifest_count(m) : 0;
	char dims[CTL_DIMS_LEN], buf[64];

	printf("name      %s\n", in->name);
	printf("latest    %" PRIu64 "\n", in->latest);
	printf("versions  %" PRIu32 "\n", in->versions);
	printf("tensors   %" PRIu32 "\n", in->tensors);
	printf("bytes     %" PRIu64 "\n", in->bytes);
	printf("leases    %" PRIu32 "\n", in->leases);
	printf("kind      %s\n", kind ? kind : "-");
	printf("mode      %04" PRIo32 "\n", in->mode & 07777);
	printf("owner     %" PRIu32 "\n", in->owner_uid);
	printf("exported  %s\n", in->exported ? "yes" : "no");
	if (in->owned)
		printf("owned     by the connection of pid %" PRIu32
		       " (goes when it closes)\n", in->owner_pid);
	if (in->ttl_ms)
		printf("ttl       %" PRIu32 " ms (expires in %" PRIu64 " ms "
		       "unless a version is sealed)\n", in->ttl_ms,
		       in->expires_in_ms);
	if (in->origin_node[0])
		printf("origin    %s version %" PRIu64 " (mirrored by a relay)\n",
		       in->origin_node, in->origin_version);
	/* A queue name: latest and the manifest are its oldest queued. */
	if (q->depth)
		printf("queue     depth %" PRIu32 ": %" PRIu32 " queued, %" PRIu32
		       " taken, %" PRIu32 " pending, %" PRIu32
		       " producers waiting\n", q->depth, q->queued, q->taken,
		       q->pending, q->waiting);

	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		const char *key = dlshare_manifest_key(m, i);
		int32_t nd;

		if (!t)
			continue;
		nd = t->ndim < 0 ? 0 : t->ndim;
		printf("\ntensor %zu\n", i);
		/* Keys may hold any bytes: quote and escape them. */
		fputs("  key     ", stdout);
		if (key && *key)
			ctl_json_string(stdout, key);
		else
			fputs("(none)", stdout);
		putchar('\n');
		ctl_format_dtype(t->dtype, buf, sizeof(buf));
		printf("  dtype   %s\n", buf);
		ctl_format_device(t->device, buf, sizeof(buf));
		printf("  device  %s\n", buf);
		ctl_format_dims(dims, sizeof(dims), t->shape, nd);
		printf("  shape   %s\n", dims);
		if (t->strides) {
			ctl_format_dims(dims, sizeof(dims), t->strides, nd);
			printf("  strides %s\n", dims);
		}
		printf("  offset  %" PRIu64 "\n", t->byte_offset);
	}
}

static void stat_print_json(const dlshare_name_info *in,
			    const dlshare_queue_info *q,
			    const dlshare_manifest *m)
{
	size_t i, n = m ? dlshare_manifest_count(m) : 0;
	bool first = true;
	char buf[64];

	ctl_json_name_info(stdout, in, false);
	json_queue(q);
	fputs(",\"tensors\":[", stdout);
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		const char *key = dlshare_manifest_key(m, i);
		int32_t nd;

		if (!t)
			continue;
		nd = t->ndim < 0 ? 0 : t->ndim;
		fputs(first ? "{\"key\":" : ",{\"key\":", stdout);
		first = false;
		ctl_json_string(stdout, key ? key : "");
		ctl_format_dtype(t->dtype, buf, sizeof(buf));
		fputs(",\"dtype\":", stdout);
		ctl_json_string(stdout, buf);
		ctl_format_device(t->device, buf, sizeof(buf));
		fputs(",\"device\":", stdout);
		ctl_json_string(stdout, buf);
		fputs(",\"shape\":", stdout);
		ctl_json_dims(stdout, t->shape, nd);
		fputs(",\"strides\":", stdout);
		if (t->strides)
			ctl_json_dims(stdout, t->strides, nd);
		else
			fputs("null", stdout);
		printf(",\"offset\":%" PRIu64 "}", t->byte_offset);
	}
	fputs("]}\n", stdout);
}

int cmd_stat(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_name_info info;
	dlshare_queue_info q;
	dlshare_manifest *m = NULL;
	dlshare_client *c = NULL;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_stat(c, name, &info, &m);
	if (err < 0) {
		ctl_report("stat", err, name);
		ret = CTL_EFAIL;
		goto out;
	}
	info.name[sizeof(info.name) - 1] = '\0';
	/* Gone between the two calls: described as no queue. */
	if (dlshare_queue_stat(c, name, &q) < 0)
		memset(&q, 0, sizeof(q));
	if (ctl->json)
		stat_print_json(&info, &q, m);
	else
		stat_print_text(&info, &q, m);
out:
	/* The header does not promise that NULL is a no-op here. */
	if (m)
		dlshare_manifest_free(m);
	dlshare_disconnect(c);
	return ret;
}

static void stats_print(const dlshare_stats *s, bool json)
{
	const struct {
		const char *key;
		uint64_t val;
	} rows[] = {
		{ "connections", s->connections },
		{ "names", s->names },
		{ "versions", s->versions },
		{ "leases", s->leases },
		{ "buffers", s->buffers },
		{ "bytes", s->bytes },
		{ "parked", s->parked },
		{ "requests", s->requests },
		{ "uptime_ms", s->uptime_ms },
	};
	size_t i, n = sizeof(rows) / sizeof(rows[0]);

	if (json) {
		for (i = 0; i < n; i++)
			printf("%s\"%s\":%" PRIu64, i ? "," : "{", rows[i].key,
			       rows[i].val);
		printf(",\"expired\":%" PRIu64 ",\"orphaned\":%" PRIu64
		       ",\"nuids\":%" PRIu32 ",\"uids\":[", s->expired,
		       s->orphaned, s->nuids);
		for (i = 0; i < s->nuid_rows; i++)
			printf("%s{\"uid\":%" PRIu32 ",\"connections\":%" PRIu32
			       ",\"names\":%" PRIu64 ",\"versions\":%" PRIu64
			       ",\"bytes\":%" PRIu64 ",\"leases\":%" PRIu64 "}",
			       i ? "," : "", s->uids[i].uid,
			       s->uids[i].connections, s->uids[i].names,
			       s->uids[i].versions, s->uids[i].bytes,
			       s->uids[i].leases);
		fputs("]}\n", stdout);
		return;
	}
	for (i = 0; i < n; i++)
		printf("%s %" PRIu64 "\n", rows[i].key, rows[i].val);
	printf("expired %" PRIu64 "\n", s->expired);
	printf("orphaned %" PRIu64 "\n", s->orphaned);
	printf("uids %" PRIu32 "\n", s->nuids);
	if (!s->nuid_rows)
		return;
	printf("%10s %6s %10s %10s %16s %10s\n", "UID", "CONNS", "NAMES",
	       "VERSIONS", "BYTES", "LEASES");
	for (i = 0; i < s->nuid_rows; i++)
		printf("%10" PRIu32 " %6" PRIu32 " %10" PRIu64 " %10" PRIu64
		       " %16" PRIu64 " %10" PRIu64 "\n", s->uids[i].uid,
		       s->uids[i].connections, s->uids[i].names,
		       s->uids[i].versions, s->uids[i].bytes,
		       s->uids[i].leases);
	if (s->nuids > s->nuid_rows)
		printf("(top %" PRIu32 " of %" PRIu32 " uids by bytes)\n",
		       s->nuid_rows, s->nuids);
}

int cmd_stats(const struct ctl *ctl)
{
	dlshare_client *c = NULL;
	dlshare_stats s;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_stats_get(c, &s);
	dlshare_disconnect(c);
	if (err < 0) {
		ctl_report("stats", err, NULL);
		return CTL_EFAIL;
	}
	stats_print(&s, ctl->json);
	return CTL_OK;
}

static int rm_prefix(const struct ctl *ctl, const char *prefix)
{
	dlshare_client *c = NULL;
	uint64_t deleted = 0, skipped = 0;
	int err, ret;

	if (!*prefix) {
		ctl_errmsg("rm", "--prefix: the prefix is empty; it would "
			   "delete every name, so name one");
		return CTL_EUSAGE;
	}
	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_delete_prefix(c, prefix, &deleted, &skipped);
	dlshare_disconnect(c);
	if (err < 0) {
		ctl_report("rm --prefix", err, prefix);
		return CTL_EFAIL;
	}
	if (ctl->json) {
		fputs("{\"prefix\":", stdout);
		ctl_json_string(stdout, prefix);
		printf(",\"deleted\":%" PRIu64 ",\"skipped\":%" PRIu64 "}\n",
		       deleted, skipped);
	} else {
		printf("deleted %" PRIu64 " name(s) under %s", deleted, prefix);
		if (skipped)
			printf("; %" PRIu64 " other(s) you may not delete left",
			       skipped);
		putchar('\n');
	}
	return CTL_OK;
}

int cmd_rm(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_client *c = NULL;
	int err, ret;

	size_t len = strlen(name);

	if (ctl->prefix)
		return rm_prefix(ctl, name);
	/* "fg/" is how a prefix looks, never a name: say so, not EINVAL. */
	if (len && name[len - 1] == '/') {
		ctl_errmsg("rm", "'%s' is not a name (a name never ends in "
			   "'/'); to delete the names under it: "
			   CTL_PROG " rm --prefix %s", name, name);
		return CTL_EUSAGE;
	}
	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_delete(c, name);
	dlshare_disconnect(c);
	if (err < 0) {
		ctl_report("rm", err, name);
		return CTL_EFAIL;
	}
	if (ctl->json) {
		fputs("{\"deleted\":", stdout);
		ctl_json_string(stdout, name);
		fputs("}\n", stdout);
	}
	return CTL_OK;
}

/* Says that the input does not have the size the dtype and shape need. */
static void put_size_error(const char *input, uint64_t have, bool more,
			   uint64_t need, DLDataType dtype,
			   const int64_t *shape, int32_t ndim)
{
	char dt[64], dims[CTL_DIMS_LEN];

	ctl_format_dtype(dtype, dt, sizeof(dt));
	ctl_format_dims(dims, sizeof(dims), shape, ndim);
	ctl_errmsg("put", "%s has %s%" PRIu64 " bytes, but %s %s needs "
		   "exactly %" PRIu64 "; nothing published", input,
		   more ? "more than " : "", have, dt, dims, need);
}

/* Reads the input straight into the writer's mapping (so a large input is
 * never staged in a second buffer), then makes sure it ends right there,
 * counting any excess, up to a limit, for the error message.
 * Returns 0 or -errno; *have and *more say how long the input was. */
static int put_read(int fd, char *dst, uint64_t len, uint64_t *have,
		    bool *more)
{
	char scratch[4096];
	uint64_t extra = 0;
	size_t got;
	int err;

	*more = false;
	err = ctl_read_full(fd, dst, (size_t)len, &got);
	if (err < 0)
		return err;
	if (got < len) {
		*have = got;
		return 0;
	}
	for (;;) {
		err = ctl_read_full(fd, scratch, sizeof(scratch), &got);
		if (err < 0)
			return err;
		extra += got;
		if (got < sizeof(scratch))
			break;
		if (extra > CTL_EXCESS_LIMIT) {
			*more = true;
			break;
		}
	}
	*have = len + extra;
	return 0;
}

/* What put writes: one tensor's spec (its shape lives here too) and size. */
struct put_plan {
	int64_t shape[CTL_MAX_NDIM];
	dlshare_tensor_spec spec;
	dlshare_create_opts copts;
	bool queue;		/* --queue: into a queue name */
	dlshare_queue_opts qopts;
	uint64_t nbytes;
};

/* Parses --dtype, --shape and --mode into *p; says what is wrong.
 * Returns 0 or CTL_EUSAGE. */
static int put_plan_parse(const struct ctl *ctl, struct put_plan *p)
{
	DLTensor want = { 0 };
	int ret;

	memset(p, 0, sizeof(*p));
	p->spec.shape = p->shape;
	p->copts.device.device_type = kDLCPU;
	if (!ctl->dtype)
		return ctl_usage_error(ctl->cmd, "--dtype is required");
	if (!ctl->shape)
		return ctl_usage_error(ctl->cmd, "--shape is required "
				       "(\"\" or \"scalar\" for a 0-d tensor)");
	if (dlshare_dtype_parse(ctl->dtype, &p->spec.dtype) < 0)
		return ctl_usage_error(ctl->cmd, "--dtype: unknown type '%s' "
				       "(e.g. float32, int64, uint8, bfloat16, "
				       "bool)", ctl->dtype);
	ret = ctl_parse_shape(ctl->cmd, ctl->shape, p->shape, &p->spec.ndim);
	if (ret < 0)
		return ret;
	if (ctl->mode) {
		ret = ctl_parse_mode(ctl->cmd, ctl->mode, &p->copts.mode);
		if (ret < 0)
			return ret;
	}
	if (ctl->ttl) {
		ret = ctl_parse_ttl(ctl->cmd, ctl->ttl, &p->copts.ttl_ms);
		if (ret < 0)
			return ret;
	}
	if (ctl->wait && !ctl->queue)
		return ctl_usage_error(ctl->cmd, "--wait is for a queue name "
				       "(with --queue)");
	if (ctl->queue) {
		uint64_t depth;

		/* 0: the daemon's default depth for a new name, any depth of
		 * an existing queue name. */
		ret = ctl_parse_version(ctl->cmd, "--queue", ctl->queue,
					&depth);
		if (ret < 0)
			return ret;
		if (depth > UINT32_MAX)
			return ctl_usage_error(ctl->cmd, "--queue: depth %s is "
					       "too large", ctl->queue);
		p->queue = true;
		p->qopts.depth = (uint32_t)depth;
	}
	if (ctl->wait) {
		ret = ctl_parse_wait(ctl->cmd, ctl->wait, &p->qopts.wait_ms);
		if (ret < 0)
			return ret;
	}
	/* The dtype is one dlshare_dtype_parse knows, and the shape has no
	 * negative dimension (ctl_parse_shape): what is left to refuse is a
	 * size past INT64_MAX bytes. */
	want.dtype = p->spec.dtype;
	want.ndim = p->spec.ndim;
	want.shape = p->shape;
	if (dlshare_tensor_nbytes(&want, &p->nbytes) < 0)
		return ctl_usage_error(ctl->cmd, "--shape: a %s tensor of "
				       "shape %s does not fit in memory",
				       ctl->dtype, ctl->shape);
	return CTL_OK;
}

/* A directory, or a regular file (also as stdin) with the wrong number of
 * bytes left to read, fails here, before a version is created. The read
 * loop checks again: a file may change under us.
 * Returns 0 or CTL_EFAIL, having said why. */
static int put_check_input(int fd, const char *input,
			   const struct put_plan *p)
{
	struct stat st;
	off_t pos;

	if (fstat(fd, &st) < 0)
		return CTL_OK;
	if (S_ISDIR(st.st_mode)) {
		ctl_errmsg("put", "%s: %s", input, strerror(EISDIR));
		return CTL_EFAIL;
	}
	pos = lseek(fd, 0, SEEK_CUR);
	if (S_ISREG(st.st_mode) && pos >= 0 && pos <= st.st_size &&
	    (uint64_t)(st.st_size - pos) != p->nbytes) {
		put_size_error(input, (uint64_t)(st.st_size - pos), false,
			       p->nbytes, p->spec.dtype, p->shape,
			       p->spec.ndim);
		return CTL_EFAIL;
	}
	return CTL_OK;
}

/* Creates the version, reads the input into its mapping, and seals it.
 * An unsealed version is dropped, never published half-written.
 * Returns 0 or CTL_EFAIL, having said why. */
static int put_write(dlshare_client *c, const char *name, int fd,
		     const char *input, const struct put_plan *p,
		     uint64_t *version)
{
	dlshare_writer *w = NULL;
	uint64_t have;
	DLTensor *t;
	char *dst = NULL;
	bool more;
	int err;

	err = p->queue ?
		dlshare_create_queued(c, name, &p->spec, 1, &p->copts,
				      &p->qopts, &w) :
		dlshare_create(c, name, &p->spec, 1, &p->copts, &w);
	if (err < 0) {
		ctl_report("put", err, name);
		return CTL_EFAIL;
	}
	t = dlshare_writer_tensor(w, 0);
	if (t && t->data)
		dst = (char *)t->data + t->byte_offset;
	if (!t || (p->nbytes > 0 && !dst)) {
		ctl_errmsg("put", "the library gave no memory to write to: %s",
			   name);
		goto fail;
	}
	err = put_read(fd, dst, p->nbytes, &have, &more);
	if (err < 0) {
		ctl_errmsg("put", "reading %s: %s", input, strerror(-err));
		goto fail;
	}
	if (have != p->nbytes) {
		put_size_error(input, have, more, p->nbytes, p->spec.dtype,
			       p->shape, p->spec.ndim);
		goto fail;
	}
	err = dlshare_seal(w, NULL, version);	/* consumes w, also on failure */
	if (err < 0) {
		ctl_report("put", err, name);
		return CTL_EFAIL;
	}
	return CTL_OK;
fail:
	dlshare_writer_abort(w);
	return CTL_EFAIL;
}

int cmd_put(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	const char *path = ctl->nargs > 1 ? ctl->args[1] : "-";
	bool from_stdin = strcmp(path, "-") == 0;
	const char *input = from_stdin ? "stdin" : path;
	dlshare_client *c = NULL;
	struct put_plan plan;
	uint64_t version;
	int fd, ret;

	ret = put_plan_parse(ctl, &plan);
	if (ret < 0)
		return ret;
	fd = from_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ctl_errmsg("put", "%s: %s", path, strerror(errno));
		return CTL_EFAIL;
	}
	ret = put_check_input(fd, input, &plan);
	if (ret == CTL_OK)
		ret = ctl_connect(ctl, &c);
	if (ret == CTL_OK)
		ret = put_write(c, name, fd, input, &plan, &version);
	if (ret == CTL_OK && ctl->json) {
		fputs("{\"name\":", stdout);
		ctl_json_string(stdout, name);
		printf(",\"version\":%" PRIu64 "}\n", version);
	} else if (ret == CTL_OK) {
		printf("%s version %" PRIu64 "\n", name, version);
	}
	dlshare_disconnect(c);
	if (!from_stdin)
		close(fd);
	return ret;
}

/* Writes tensor t of what (the name, for messages) to stdout, row-major.
 * The caller's lease keeps t's memory mapped and unchanged meanwhile.
 * Returns 0 or CTL_EFAIL. */
static int cat_tensor(const char *what, const DLTensor *t)
{
	uint64_t nbytes;
	const char *base;
	char buf[64];
	size_t esz;
	int err;

	if (!ctl_host_readable(t->device)) {
		ctl_format_device(t->device, buf, sizeof(buf));
		ctl_errmsg("cat", "%s: the tensor lives in %s memory; cat "
			   "reads only host memory", what, buf);
		return CTL_EFAIL;
	}
	if (t->ndim < 0 || t->ndim > CTL_MAX_NDIM) {
		ctl_errmsg("cat", "%s: the tensor has %d dimensions; at most "
			   "%d are supported", what, (int)t->ndim,
			   CTL_MAX_NDIM);
		return CTL_EFAIL;
	}
	err = dlshare_tensor_nbytes(t, &nbytes);
	if (err < 0) {
		ctl_format_dtype(t->dtype, buf, sizeof(buf));
		ctl_errmsg("cat", "%s: cannot write a %s tensor of this shape",
			   what, buf);
		return CTL_EFAIL;
	}
	if (nbytes == 0)
		return CTL_OK;

	esz = dlshare_dtype_size(t->dtype);
	base = (const char *)t->data + t->byte_offset;
	if (ctl_tensor_is_compact(t))
		err = ctl_write_all(STDOUT_FILENO, base, (size_t)nbytes);
	else
		err = ctl_write_strided(STDOUT_FILENO, base, t, esz);
	if (err == -EPIPE) {
		ctl_errmsg("cat", "%s: stdout was closed before all %" PRIu64
			   " bytes were written (broken pipe)", what, nbytes);
		return CTL_EFAIL;
	}
	if (err < 0) {
		ctl_errmsg("cat", "%s: writing to stdout: %s", what,
			   strerror(-err));
		return CTL_EFAIL;
	}
	return CTL_OK;
}

/* Writes tensor key (NULL: the first) of b, a version of name, to stdout,
 * as cat does. Returns CTL_OK or CTL_EFAIL after saying why. */
static int write_bundle(const char *cmd, const char *name, dlshare_bundle *b,
			const char *key)
{
	const DLTensor *t;
	char what[512];
	size_t i = 0;
	int err;

	/* Messages name the version actually got. */
	snprintf(what, sizeof(what), "%s version %" PRIu64, name,
		 dlshare_bundle_version(b));
	if (key) {
		err = dlshare_bundle_find(b, key);
		if (err < 0) {
			ctl_errmsg(cmd, "%s has no tensor with key '%s'", what,
				   key);
			return CTL_EFAIL;
		}
		i = (size_t)err;
	}
	t = dlshare_bundle_tensor(b, i);
	if (!t) {
		ctl_errmsg(cmd, "%s holds no tensors", what);
		return CTL_EFAIL;
	}
	/* Written before dlshare_bundle_free(): the lease keeps it valid. */
	return cat_tensor(what, t);
}

int cmd_cat(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_get_opts opts = { .select = DLSHARE_LATEST, .timeout_ms = 0 };
	dlshare_client *c = NULL;
	dlshare_bundle *b = NULL;
	char what[512];
	int err, ret;

	if (ctl->at_version && ctl->newer_than)
		return ctl_usage_error(ctl->cmd, "--version and --newer-than "
				       "exclude each other");
	if (ctl->at_version) {
		opts.select = DLSHARE_EXACT;
		ret = ctl_parse_version(ctl->cmd, "--version", ctl->at_version,
					&opts.version);
		if (ret < 0)
			return ret;
		snprintf(what, sizeof(what), "%s version %" PRIu64, name,
			 opts.version);
	} else if (ctl->newer_than) {
		opts.select = DLSHARE_NEWER_THAN;
		ret = ctl_parse_version(ctl->cmd, "--newer-than",
					ctl->newer_than, &opts.version);
		if (ret < 0)
			return ret;
		snprintf(what, sizeof(what), "%s newer than version %" PRIu64,
			 name, opts.version);
	} else {
		snprintf(what, sizeof(what), "%s", name);
	}
	if (ctl->wait) {
		ret = ctl_parse_wait(ctl->cmd, ctl->wait, &opts.timeout_ms);
		if (ret < 0)
			return ret;
	}

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_get(c, name, &opts, &b);
	if (err < 0) {
		ctl_report("cat", err, what);
		ret = CTL_EFAIL;
		goto out;
	}
	ret = write_bundle("cat", name, b, ctl->key);
out:
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return ret;
}

int cmd_take(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	int32_t wait = 0;
	dlshare_client *c = NULL;
	dlshare_bundle *b = NULL;
	int err, ret;

	if (ctl->wait) {
		ret = ctl_parse_wait(ctl->cmd, ctl->wait, &wait);
		if (ret < 0)
			return ret;
	}
	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_take(c, name, wait, NULL, &b);
	if (err < 0) {
		ctl_report("take", err, name);
		ret = CTL_EFAIL;
		goto out;
	}
	/* Freeing the bundle consumes the version, also when writing it
	 * failed: the take is not undone (only a taker that dies is). */
	ret = write_bundle("take", name, b, ctl->key);
out:
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return ret;
}

int cmd_help(const struct ctl *ctl)
{
	ctl_print_help(stdout);
	return CTL_OK;
}
