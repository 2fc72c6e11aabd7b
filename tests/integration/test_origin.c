/* test_origin — a version's origin (protocol 1.5): the node a relay
 * mirrored it from and its number there, given at create or publish,
 * kept per version, and shown for the newest version by stat, list and
 * dlsharectl; a bad origin refused with a message naming the rule, by the
 * library before it sends and by the daemon when a raw peer sends it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

static const int64_t shape16[] = { 16 };

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

/* Store mode: create (with origin node/version when node is not NULL),
 * fill, seal. Returns what dlshare_create or dlshare_seal returned. */
static int store(dlshare_client *c, const char *name, const char *node,
		 uint64_t over, uint64_t *version)
{
	dlshare_tensor_spec spec = {
		.dtype = DT_F32, .ndim = 1, .shape = shape16,
	};
	dlshare_create_opts o = {
		.device = { kDLCPU, 0 }, .origin_node = node,
		.origin_version = over,
	};
	dlshare_writer *w;
	DLTensor *t;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, &o, &w)))
		return err;
	t = dlshare_writer_tensor(w, 0);
	harness_fill(t->data, util_nbytes(DT_F32, 1, shape16), 7);
	return dlshare_seal(w, NULL, version);
}

/* Export mode (producer memory, no copy) with an origin. */
static int export(dlshare_client *c, const char *name, const char *node,
		  uint64_t over)
{
	dlshare_publish_opts o = {
		.flags = DLSHARE_PUBLISH_NO_COPY, .origin_node = node,
		.origin_version = over,
	};
	DLManagedTensor *t;
	int err;

	if ((err = dlshare_host_alloc(DT_F32, 1, shape16, &t)))
		return err;
	harness_fill(t->dl_tensor.data, util_nbytes(DT_F32, 1, shape16), 8);
	if ((err = dlshare_publish(c, name, &t, 1, &o, NULL)))
		t->deleter(t);
	return err;
}

struct found {
	const char *name;
	dlshare_name_info info;
	int n;
};

static int find_cb(const dlshare_name_info *info, void *arg)
{
	struct found *f = arg;

	if (strcmp(info->name, f->name) == 0) {
		f->info = *info;
		f->n++;
	}
	return 0;
}

/* Create and publish with an origin; stat and list show the newest
 * version's, and a version made here (none) replaces it. */
static void origin_kept(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_name_info in;
	struct found f = { .name = "mirror/w" };
	uint64_t v;

	assert_int_equal(store(c, "mirror/w", "node-a.example:9000", 41, &v),
			 0);
	assert_int_equal(dlshare_stat(c, "mirror/w", &in, NULL), 0);
	assert_int_equal(in.latest, v);
	assert_string_equal(in.origin_node, "node-a.example:9000");
	assert_int_equal(in.origin_version, 41);
	assert_int_equal(dlshare_list(c, "mirror/", find_cb, &f), 0);
	assert_int_equal(f.n, 1);
	assert_string_equal(f.info.origin_node, "node-a.example:9000");
	assert_int_equal(f.info.origin_version, 41);

	/* The longest node there may be, through export mode. */
	char node[65];

	memset(node, 'n', 64);
	node[64] = '\0';
	assert_int_equal(export(c, "mirror/w", node, UINT64_MAX), 0);
	assert_int_equal(dlshare_stat(c, "mirror/w", &in, NULL), 0);
	assert_string_equal(in.origin_node, node);
	assert_true(in.origin_version == UINT64_MAX);

	/* A version made here has none: the newest version's is shown. */
	assert_int_equal(store(c, "mirror/w", NULL, 0, NULL), 0);
	assert_int_equal(dlshare_stat(c, "mirror/w", &in, NULL), 0);
	assert_string_equal(in.origin_node, "");
	assert_int_equal(in.origin_version, 0);
	dlshare_disconnect(c);
}

/* The library refuses a bad origin before sending, saying which rule. */
static void origin_refused_by_library(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	char longer[66];
	dlshare_name_info in;

	memset(longer, 'x', 65);
	longer[65] = '\0';
	assert_int_equal(store(c, "bad/o", longer, 1, NULL), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "1-64 bytes"));
	assert_int_equal(store(c, "bad/o", "has space", 1, NULL),
			 DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "printable"));
	assert_int_equal(store(c, "bad/o", "tab\there", 1, NULL),
			 DLSHARE_EINVAL);
	assert_int_equal(store(c, "bad/o", "", 1, NULL), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "empty"));
	assert_int_equal(store(c, "bad/o", NULL, 5, NULL), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "needs an origin node"));
	assert_int_equal(export(c, "bad/o", "caf\xc3\xa9", 1), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "bad/o"));
	/* Nothing was made. */
	assert_int_equal(dlshare_stat(c, "bad/o", &in, NULL), DLSHARE_ENOENT);
	dlshare_disconnect(c);
}

/* A raw Create with a bad origin: the daemon answers with an Error that
 * names the name and the rule, and keeps serving this peer. */
static int raw_create(int sock, uint64_t id, const char *name,
		      const char *node, int with_version,
		      struct wire_msg **out)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	Dlshare__Tensor t = DLSHARE__TENSOR__INIT;
	Dlshare__Tensor *tp = &t;
	Dlshare__Buffer b = DLSHARE__BUFFER__INIT;
	Dlshare__Buffer *bp = &b;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	int64_t shape[] = { 16 };

	dev.type = kDLCPU;
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b.size = 64;
	b.device = &dev;
	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = shape;
	cr.name = (char *)name;
	cr.n_tensors = 1;
	cr.tensors = &tp;
	cr.n_buffers = 1;
	cr.buffers = &bp;
	cr.origin_node = (char *)node;
	cr.has_origin_version = with_version;
	cr.origin_version = 3;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &cr;
	return raw_call(sock, &f, NULL, 0, out);
}

static void origin_refused_by_daemon(void **state)
{
	struct fixture *fx = *state;
	int sock = raw_connect(fx->d.sock);
	struct wire_msg *m;
	const char *bad[] = { "two words", "ctl\x7f", "", NULL };

	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	for (int i = 0; bad[i]; i++) {
		assert_int_equal(raw_create(sock, 10 + i, "raw/o", bad[i], 1,
					    &m), 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_ERROR);
		assert_int_equal(m->frame->error->code, DLSHARE_EINVAL);
		assert_non_null(strstr(m->frame->error->message, "raw/o"));
		assert_non_null(strstr(m->frame->error->message,
				       "origin node"));
		wire_msg_free(m);
	}
	/* A version without a node. */
	assert_int_equal(raw_create(sock, 20, "raw/o", NULL, 1, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_non_null(strstr(m->frame->error->message,
			       "needs an origin node"));
	wire_msg_free(m);
	/* Over 64 bytes. */
	char longer[200];

	memset(longer, 'y', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	assert_int_equal(raw_create(sock, 21, "raw/o", longer, 1, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_non_null(strstr(m->frame->error->message, "1-64 bytes"));
	wire_msg_free(m);
	/* The same peer is served: a good origin is taken. */
	assert_int_equal(raw_create(sock, 22, "raw/o", "node-b", 1, &m), 0);
	assert_int_equal(m->frame->body_case,
			 DLSHARE__FRAME__BODY_CREATE_REPLY);
	wire_msg_free(m);
	close(sock);
}

/* dlsharectl stat and ls (text and --json) show the origin. */
static void origin_in_cli(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	char out[160], err[160];
	char *txt;

	snprintf(out, sizeof(out), "%s/out", fx->d.dir);
	snprintf(err, sizeof(err), "%s/err", fx->d.dir);
	assert_int_equal(store(c, "cli/o", "node-a", 12, NULL), 0);
	assert_int_equal(store(c, "cli/here", NULL, 0, NULL), 0);

	const char *stat[] = { DLSHARECTL_PATH, "-s", fx->d.sock, "stat",
			       "cli/o", NULL };
	assert_int_equal(util_run(stat, NULL, out, err), 0);
	txt = util_slurp(out, NULL);
	assert_non_null(txt);
	assert_non_null(strstr(txt, "origin    node-a version 12"));
	free(txt);

	const char *stat_here[] = { DLSHARECTL_PATH, "-s", fx->d.sock, "stat",
				    "cli/here", NULL };
	assert_int_equal(util_run(stat_here, NULL, out, err), 0);
	txt = util_slurp(out, NULL);
	assert_non_null(txt);
	assert_null(strstr(txt, "origin"));
	free(txt);

	const char *ls[] = { DLSHARECTL_PATH, "-s", fx->d.sock, "ls", "cli/",
			     NULL };
	assert_int_equal(util_run(ls, NULL, out, err), 0);
	txt = util_slurp(out, NULL);
	assert_non_null(txt);
	assert_non_null(strstr(txt, "ORIGIN"));
	assert_non_null(strstr(txt, "node-a:12"));
	free(txt);

	const char *json[] = { DLSHARECTL_PATH, "-s", fx->d.sock, "--json",
			       "ls", "cli/", NULL };
	assert_int_equal(util_run(json, NULL, out, err), 0);
	txt = util_slurp(out, NULL);
	assert_non_null(txt);
	assert_non_null(strstr(txt, "\"origin_node\":\"node-a\","
				    "\"origin_version\":12"));
	free(txt);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(origin_kept, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(origin_refused_by_library,
						setup, util_teardown),
		cmocka_unit_test_setup_teardown(origin_refused_by_daemon,
						setup, util_teardown),
		cmocka_unit_test_setup_teardown(origin_in_cli, setup,
						util_teardown),
	};

	return test_run_group("origin", tests, NULL, NULL);
}
