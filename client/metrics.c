/* metrics — a StatsReply as Prometheus exposition text. */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Every family, in the order printed. A family's samples may be none (a
 * daemon before 1.5 sends no counters; a machine without GPUs has no
 * device rows). */
enum family {
	F_UP, F_UPTIME, F_CONNECTIONS, F_ACCEPTED, F_NAMES, F_VERSIONS,
	F_LEASES, F_BUFFERS, F_BYTES, F_KIND_BUFFERS, F_KIND_BYTES,
	F_DEV_BUFFERS, F_DEV_BYTES, F_MANIFEST_BYTES, F_PARKED, F_WAITING,
	F_REQUESTS, F_ERRORS, F_LIMITS, F_CUT, F_EXPIRED, F_ORPHANED, F_UIDS,
	F_UID_ROWS, F_N
};

static const struct {
	const char *name, *type, *labels, *help;
} families[F_N] = {
	[F_UP] = { "dlshare_up", "gauge", "",
		   "1 when the daemon answered, 0 when it did not (only "
		   "this sample is written then)" },
	[F_UPTIME] = { "dlshare_uptime_seconds", "gauge", "",
		       "Seconds since the daemon started" },
	[F_CONNECTIONS] = { "dlshare_connections", "gauge", "",
			    "Open client connections" },
	[F_ACCEPTED] = { "dlshare_connections_accepted_total", "counter", "",
			 "Connections accepted since start" },
	[F_NAMES] = { "dlshare_names", "gauge", "", "Live names" },
	[F_VERSIONS] = { "dlshare_versions", "gauge", "",
			 "Live versions (pending, sealed, and superseded "
			 "ones that leases hold)" },
	[F_LEASES] = { "dlshare_leases", "gauge", "",
		       "Leases consumers hold" },
	[F_BUFFERS] = { "dlshare_buffers", "gauge", "",
			"Live buffers, every kind" },
	[F_BYTES] = { "dlshare_buffer_bytes", "gauge", "",
		      "Bytes of the live buffers, every kind" },
	[F_KIND_BUFFERS] = { "dlshare_kind_buffers", "gauge", "kind",
			     "Live buffers by kind (host, cuda-ipc, cuda-vmm)" },
	[F_KIND_BYTES] = { "dlshare_kind_buffer_bytes", "gauge", "kind",
			   "Bytes of the live buffers by kind" },
	[F_DEV_BUFFERS] = { "dlshare_device_buffers", "gauge", "uuid",
			    "Live buffers by CUDA device UUID (at most 16 "
			    "devices; uuid=\"other\" sums the rest)" },
	[F_DEV_BYTES] = { "dlshare_device_buffer_bytes", "gauge", "uuid",
			  "Bytes of the live buffers by CUDA device UUID" },
	[F_MANIFEST_BYTES] = { "dlshare_manifest_bytes", "gauge", "",
			       "Metadata (manifest) bytes the live versions "
			       "hold" },
	[F_PARKED] = { "dlshare_parked_gets", "gauge", "",
		       "Gets and takes waiting for a version" },
	[F_WAITING] = { "dlshare_waiting_producers", "gauge", "",
			"Creates waiting for room in a queue name" },
	[F_REQUESTS] = { "dlshare_requests_total", "counter", "type",
			 "Requests handled, by type" },
	[F_ERRORS] = { "dlshare_errors_total", "counter", "type,code",
		       "Error replies sent, by request type and error code "
		       "(only pairs that happened)" },
	[F_LIMITS] = { "dlshare_limit_hits_total", "counter", "limit",
		       "Requests and connections refused at a limit, by the "
		       "option that sets it (board-slots: gets answered with "
		       "no version-board token, none refused)" },
	[F_CUT] = { "dlshare_peers_cut_off_total", "counter", "reason",
		    "Connections the daemon closed on a peer, by reason" },
	[F_EXPIRED] = { "dlshare_names_expired_total", "counter", "",
			"Names deleted by their TTL" },
	[F_ORPHANED] = { "dlshare_names_orphaned_total", "counter", "",
			 "Owned names deleted with their connection" },
	[F_UIDS] = { "dlshare_uids", "gauge", "",
		     "Uids holding anything (connections, names, leases, "
		     "bytes)" },
	[F_UID_ROWS] = { "dlshare_uid_rows", "gauge", "",
			 "Uids with dlshare_uid_* samples: the 32 nearest a "
			 "quota" },
};

/* The per-uid quotas: what a uid uses (UidUsage) against its limit
 * (QuotaLimits, the same field), in three families each. */
static const struct {
	const char *quota;        /* the quota label; also the option */
	const char *used, *limit; /* family names */
	const char *help;
	size_t used_at, limit_at; /* offsetof the uint64 in each message */
	size_t used_has, limit_has; /* and of its has_ flag */
} quotas[] = {
#define Q(field, quota, used, limit, help) \
	{ quota, used, limit, help, offsetof(Dlshare__UidUsage, field), \
	  offsetof(Dlshare__QuotaLimits, field), \
	  offsetof(Dlshare__UidUsage, has_##field), \
	  offsetof(Dlshare__QuotaLimits, has_##field) }
	Q(connections, "uid-connections", "dlshare_uid_connections",
	  "dlshare_uid_connections_limit", "connections"),
	Q(names, "uid-names", "dlshare_uid_names", "dlshare_uid_names_limit",
	  "names created"),
	Q(leases, "uid-leases", "dlshare_uid_leases",
	  "dlshare_uid_leases_limit", "leases"),
	Q(pending, "uid-pending", "dlshare_uid_pending_versions",
	  "dlshare_uid_pending_versions_limit", "pending versions"),
	Q(host_bytes, "uid-host-bytes", "dlshare_uid_host_bytes",
	  "dlshare_uid_host_limit_bytes",
	  "daemon-owned host bytes of the versions it produced"),
	Q(gpu_bytes, "uid-gpu-bytes", "dlshare_uid_gpu_bytes",
	  "dlshare_uid_gpu_limit_bytes",
	  "daemon-owned GPU bytes of the versions it produced"),
	Q(manifest_bytes, "uid-manifest-bytes", "dlshare_uid_manifest_bytes",
	  "dlshare_uid_manifest_limit_bytes",
	  "metadata (manifest) bytes of the versions it produced"),
	Q(leased_host_bytes, "uid-leased-bytes",
	  "dlshare_uid_leased_host_bytes",
	  "dlshare_uid_leased_host_limit_bytes",
	  "daemon-owned host bytes of the versions it leases"),
	Q(leased_gpu_bytes, "uid-leased-gpu-bytes",
	  "dlshare_uid_leased_gpu_bytes",
	  "dlshare_uid_leased_gpu_limit_bytes",
	  "daemon-owned GPU bytes of the versions it leases"),
	Q(open_fds, "uid-open-fds", "dlshare_uid_open_fds",
	  "dlshare_uid_open_fds_limit",
	  "fds the daemon holds for it (its versions', leased, queued)"),
#undef Q
};
#define NQUOTAS (sizeof(quotas) / sizeof(*quotas))
#define RATIO_FAMILY "dlshare_uid_quota_usage_ratio"

static uint64_t field_at(const void *msg, size_t at)
{
	uint64_t v;

	memcpy(&v, (const char *)msg + at, sizeof(v));
	return v;
}

/* Whether an optional field was sent: its has_ flag at offset at. */
static int has_at(const void *msg, size_t at)
{
	protobuf_c_boolean h;

	memcpy(&h, (const char *)msg + at, sizeof(h));
	return h;
}

/* HELP text: backslash and newline escaped. */
static void put_help(FILE *o, const char *s)
{
	for (; *s; s++)
		if (*s == '\\')
			fputs("\\\\", o);
		else if (*s == '\n')
			fputs("\\n", o);
		else
			fputc(*s, o);
}

/* A label value: backslash, double quote and newline escaped. */
static void put_value(FILE *o, const char *s)
{
	for (; *s; s++)
		if (*s == '\\')
			fputs("\\\\", o);
		else if (*s == '"')
			fputs("\\\"", o);
		else if (*s == '\n')
			fputs("\\n", o);
		else
			fputc(*s, o);
}

static void header(FILE *o, const char *name, const char *type,
		   const char *help)
{
	fprintf(o, "# HELP %s ", name);
	put_help(o, help);
	fprintf(o, "\n# TYPE %s %s\n", name, type);
}

static void fam(FILE *o, enum family f)
{
	header(o, families[f].name, families[f].type, families[f].help);
}

/* name{k1="v1",k2="v2"} value: labels NULL-terminated pairs. */
static void sample(FILE *o, const char *name, const char *const *labels,
		   uint64_t value)
{
	fputs(name, o);
	for (size_t i = 0; labels && labels[i]; i += 2) {
		fprintf(o, "%s%s=\"", i ? "," : "{", labels[i]);
		put_value(o, labels[i + 1]);
		fputc('"', o);
		if (!labels[i + 2])
			fputc('}', o);
	}
	fprintf(o, " %" PRIu64 "\n", value);
}

static void plain(FILE *o, enum family f, uint64_t v)
{
	fam(o, f);
	sample(o, families[f].name, NULL, v);
}

static const char *kind_name(int kind)
{
	switch (kind) {
	case DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST:
		return "host";
	case DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC:
		return "cuda-ipc";
	case DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM:
		return "cuda-vmm";
	default:
		return "unknown";
	}
}

/* As nvidia-smi writes it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void uuid_text(const Dlshare__DeviceStats *d, char *buf, size_t size)
{
	size_t n;

	if (!d->has_uuid || d->uuid.len != 16) {
		snprintf(buf, size, "other");
		return;
	}
	n = (size_t)snprintf(buf, size, "GPU-");
	for (size_t i = 0; i < 16 && n + 3 < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%02x",
				      i == 4 || i == 6 || i == 8 || i == 10 ?
				      "-" : "", d->uuid.data[i]);
}

static void counters(FILE *o, enum family f, const char *label,
		     Dlshare__Counter *const *c, size_t n)
{
	fam(o, f);
	for (size_t i = 0; i < n; i++) {
		const char *l[] = { label, c[i]->label, NULL };

		sample(o, families[f].name, l, c[i]->value);
	}
}

static void uid_families(FILE *o, const Dlshare__StatsReply *sr)
{
	const Dlshare__QuotaLimits *q = sr->quota_limits;
	char uid[16];

	for (size_t k = 0; k < NQUOTAS; k++) {
		char help[160];

		snprintf(help, sizeof(help), "Per uid: %s", quotas[k].help);
		header(o, quotas[k].used, "gauge", help);
		for (size_t i = 0; i < sr->n_usage; i++) {
			const Dlshare__UidUsage *u = sr->usage[i];
			const char *l[] = { "uid", uid, NULL };

			if (!has_at(u, quotas[k].used_has))
				continue;
			snprintf(uid, sizeof(uid), "%" PRIu32, u->uid);
			sample(o, quotas[k].used, l,
			       field_at(u, quotas[k].used_at));
		}
		snprintf(help, sizeof(help), "The per-uid limit (--%s) on %s; "
			 "absent when there is none", quotas[k].quota,
			 quotas[k].help);
		header(o, quotas[k].limit, "gauge", help);
		if (q && has_at(q, quotas[k].limit_has) &&
		    field_at(q, quotas[k].limit_at))
			sample(o, quotas[k].limit, NULL,
			       field_at(q, quotas[k].limit_at));
	}
	header(o, RATIO_FAMILY, "gauge",
	       "Per uid and quota: use over limit (1 = exhausted), for the "
	       "quotas that have a limit");
	for (size_t i = 0; q && i < sr->n_usage; i++) {
		const Dlshare__UidUsage *u = sr->usage[i];

		snprintf(uid, sizeof(uid), "%" PRIu32, u->uid);
		for (size_t k = 0; k < NQUOTAS; k++) {
			uint64_t lim = has_at(q, quotas[k].limit_has) ?
				       field_at(q, quotas[k].limit_at) : 0;

			if (!lim || !has_at(u, quotas[k].used_has))
				continue;
			fprintf(o, RATIO_FAMILY "{uid=\"%s\",quota=\"%s\"} %.6g\n",
				uid, quotas[k].quota,
				(double)field_at(u, quotas[k].used_at) /
				(double)lim);
		}
	}
}

static void render(FILE *o, const Dlshare__StatsReply *sr)
{
	char uuid[48];

	plain(o, F_UP, 1);
	fam(o, F_UPTIME);
	fprintf(o, "%s %.3f\n", families[F_UPTIME].name,
		(double)sr->uptime_ms / 1000.0);
	plain(o, F_CONNECTIONS, sr->connections);
	fam(o, F_ACCEPTED);
	if (sr->has_accepted)
		sample(o, families[F_ACCEPTED].name, NULL, sr->accepted);
	plain(o, F_NAMES, sr->names);
	plain(o, F_VERSIONS, sr->versions);
	plain(o, F_LEASES, sr->leases);
	plain(o, F_BUFFERS, sr->buffers);
	plain(o, F_BYTES, sr->bytes);
	for (int f = F_KIND_BUFFERS; f <= F_KIND_BYTES; f++) {
		fam(o, f);
		for (size_t i = 0; i < sr->n_kinds; i++) {
			const char *l[] = { "kind", kind_name(sr->kinds[i]->kind),
					    NULL };

			sample(o, families[f].name, l, f == F_KIND_BUFFERS ?
			       sr->kinds[i]->buffers : sr->kinds[i]->bytes);
		}
	}
	for (int f = F_DEV_BUFFERS; f <= F_DEV_BYTES; f++) {
		fam(o, f);
		for (size_t i = 0; i < sr->n_devices; i++) {
			const char *l[] = { "uuid", uuid, NULL };

			uuid_text(sr->devices[i], uuid, sizeof(uuid));
			sample(o, families[f].name, l, f == F_DEV_BUFFERS ?
			       sr->devices[i]->buffers :
			       sr->devices[i]->bytes);
		}
	}
	plain(o, F_MANIFEST_BYTES, sr->has_manifest_bytes ?
	      sr->manifest_bytes : 0);
	plain(o, F_PARKED, sr->parked);
	fam(o, F_WAITING);
	if (sr->has_waiting_producers)
		sample(o, families[F_WAITING].name, NULL,
		       sr->waiting_producers);
	counters(o, F_REQUESTS, "type", sr->requests_by_type,
		 sr->n_requests_by_type);
	fam(o, F_ERRORS);
	for (size_t i = 0; i < sr->n_errors; i++) {
		const Dlshare__Counter *c = sr->errors[i];
		const char *l[] = { "type", c->label, "code",
				    c->code ? c->code : "other", NULL };

		sample(o, families[F_ERRORS].name, l, c->value);
	}
	counters(o, F_LIMITS, "limit", sr->limit_hits, sr->n_limit_hits);
	counters(o, F_CUT, "reason", sr->cut_off, sr->n_cut_off);
	plain(o, F_EXPIRED, sr->has_expired ? sr->expired : 0);
	plain(o, F_ORPHANED, sr->has_orphaned ? sr->orphaned : 0);
	plain(o, F_UIDS, sr->has_nuids ? sr->nuids : 0);
	plain(o, F_UID_ROWS, sr->n_usage);
	uid_families(o, sr);
}

int metrics_render(const Dlshare__StatsReply *sr, char **text, size_t *len)
{
	FILE *o = open_memstream(text, len);

	if (!o)
		return -ENOMEM;
	if (sr)
		render(o, sr);
	else
		plain(o, F_UP, 0);
	if (ferror(o)) {
		fclose(o);
		free(*text);
		*text = NULL;
		return -ENOMEM;
	}
	return fclose(o) ? -ENOMEM : 0;
}

/* Text in a man page: a hyphen is \- (a minus, as in an option). */
static void put_man(FILE *out, const char *s)
{
	for (; *s; s++)
		if (*s == '-')
			fputs("\\-", out);
		else if (*s == '\\')
			fputs("\\e", out);
		else
			fputc(*s, out);
}

static void man_family(FILE *out, const char *name, const char *type,
		       const char *labels, const char *help)
{
	fprintf(out, ".TP\n.B %s\n%s", name, type);
	if (*labels)
		fprintf(out, "; labels \\fI%s\\fR", labels);
	fputs(". ", out);
	put_man(out, help);
	fputs(".\n", out);
}

void metrics_print_man(FILE *out)
{
	for (int f = 0; f < F_N; f++)
		man_family(out, families[f].name, families[f].type,
			   families[f].labels, families[f].help);
	for (size_t k = 0; k < NQUOTAS; k++) {
		char help[200];

		snprintf(help, sizeof(help), "Per uid: %s", quotas[k].help);
		man_family(out, quotas[k].used, "gauge", "uid", help);
		snprintf(help, sizeof(help), "The limit --%s of dlshared(8); "
			 "absent when there is none", quotas[k].quota);
		man_family(out, quotas[k].limit, "gauge", "", help);
	}
	man_family(out, RATIO_FAMILY, "gauge", "uid,quota",
		   "Use over limit per uid and quota (1: exhausted); quota is "
		   "the option that sets the limit, e.g. uid-host-bytes");
}
