/* test_limit_hits — each named limit, crossed once, counts in its own row
 * of dlshare_limit_hits_total and in no other: a refusal names its limit
 * where it refuses (struct refusal, peer_limit_hit), so the metric follows
 * the code, not the wording of an error.
 *
 * Four daemons (a daemon under valgrind takes seconds to start), each with
 * a set of small limits that do not get in each other's way: the checks
 * of one refusal run in a fixed order (registry.c: spec_check, then
 * quota_check), and the sizes below are chosen so that each crossing
 * passes every check before its own. Each test leaves nothing behind (no
 * name, lease or pending version), and checks that the family moved by
 * exactly one, in its row, since the test before.
 *
 * Not crossed here: uid-leased-gpu-bytes (GPU memory; uid-gpu-bytes is
 * counted in tests/gpu's store_on_device_refusals), max-out-fds and
 * uid-fds (peers that stop reading: test_security's deaf_peer_fds counts
 * their rows), max-buffers (a refusal counted as max-tensors, as it always
 * was: the library makes one buffer).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#define KIB 1024

/* float32 elements of n KiB */
#define F32_KIB(n) ((int64_t)(n) * KIB / 4)

static const int64_t small[1] = { F32_KIB(1) };

/* The rows as the test before left them. */
static struct util_hits last;

/* Fails unless label moved by exactly one since the last call and every
 * other row stayed. */
static void assert_hit_once(dlshare_client *c, const char *label)
{
	struct util_hits h;
	int found = 0;

	util_limit_hits(c, &h);
	/* Every row is always there (a counter, 0 until hit). */
	assert_true(h.n >= 20);
	for (size_t i = 0; i < h.n; i++) {
		uint64_t before = 0, want;

		for (size_t j = 0; j < last.n; j++)
			if (!strcmp(last.label[j], h.label[i]))
				before = last.value[j];
		want = before + !strcmp(h.label[i], label);
		found |= !strcmp(h.label[i], label);
		if (h.value[i] != want)
			fail_msg("limit %s: %llu hits, want %llu (crossing %s)",
				 h.label[i], (unsigned long long)h.value[i],
				 (unsigned long long)want, label);
	}
	if (!found)
		fail_msg("no row for limit %s", label);
	last = h;
}

static int group_setup(void **state, const char *const *args)
{
	memset(&last, 0, sizeof(last));
	return util_setup(state, args);
}

static int group_teardown(void **state)
{
	return util_teardown(state);
}

static dlshare_client *connect_fx(void **state)
{
	struct fixture *fx = *state;

	return harness_connect(&fx->d);
}

static int store_kib(dlshare_client *c, const char *name, int kib)
{
	const int64_t shape[1] = { F32_KIB(kib) };

	return util_store(c, name, DT_F32, 1, shape, 1, NULL);
}

static int create1(dlshare_client *c, const char *name, const int64_t *shape,
		   const dlshare_create_opts *o, dlshare_writer **w)
{
	dlshare_tensor_spec t = { NULL, DT_F32, 1, shape };

	return dlshare_create(c, name, &t, 1, o, w);
}

/* Nothing left: no name, no lease, no version. */
static void assert_empty(dlshare_client *c)
{
	struct util_want w = UTIL_ANY;

	w.names = 0;
	w.versions = 0;
	w.leases = 0;
	util_assert_want(c, &w);
}

/* ==== one daemon for most ================================================= */

/* Sizes: a buffer over 64 KiB is refused at max-buffer-bytes, a version
 * over 32 KiB at max-bytes, over 16 KiB at uid-host-bytes; a lease of a
 * version over 4 KiB at uid-leased-bytes. Everything else is 1 KiB. */
static int setup_main(void **state)
{
	static const char *const args[] = {
		"--max-tensors", "1", "--max-buffer-bytes", "65536",
		"--max-bytes", "32768", "--uid-host-bytes", "16384",
		"--uid-names", "3", "--max-pending", "1", "--uid-pending", "1",
		"--max-leases", "1", "--uid-leases", "1",
		"--uid-leased-bytes", "4096", "--max-ttl", "60000",
		"--max-queue-depth", "2", "--max-inflight", "1", NULL
	};

	return group_setup(state, args);
}

static void uid_names(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(store_kib(c, "h/a", 1), 0);
	assert_int_equal(store_kib(c, "h/b", 1), 0);
	assert_int_equal(store_kib(c, "h/c", 1), 0);
	assert_int_equal(store_kib(c, "h/d", 1), DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-names");
	assert_int_equal(dlshare_delete_prefix(c, "h/", NULL, NULL), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

static void max_tensors(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_tensor_spec t[2] = { { "x", DT_F32, 1, small },
				     { "y", DT_F32, 1, small } };
	dlshare_writer *w;

	assert_int_not_equal(dlshare_create(c, "h/t", t, 2, NULL, &w), 0);
	assert_hit_once(c, "max-tensors");
	dlshare_disconnect(c);
}

static void max_buffer_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_not_equal(store_kib(c, "h/b", 128), 0);
	assert_hit_once(c, "max-buffer-bytes");
	dlshare_disconnect(c);
}

static void max_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(store_kib(c, "h/b", 48), DLSHARE_ELIMIT);
	assert_hit_once(c, "max-bytes");
	dlshare_disconnect(c);
}

static void uid_host_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(store_kib(c, "h/b", 24), DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-host-bytes");
	dlshare_disconnect(c);
}

static void max_pending(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_writer *w1, *w2;

	assert_int_equal(create1(c, "h/p1", small, NULL, &w1), 0);
	assert_int_equal(create1(c, "h/p2", small, NULL, &w2),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "max-pending");
	dlshare_writer_abort(w1);
	assert_int_equal(dlshare_delete_prefix(c, "h/", NULL, NULL), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

static void uid_pending(void **state)
{
	dlshare_client *c = connect_fx(state), *c2 = connect_fx(state);
	dlshare_writer *w1, *w2;

	/* One each: within max-pending, over the uid's. */
	assert_int_equal(create1(c, "h/p1", small, NULL, &w1), 0);
	assert_int_equal(create1(c2, "h/p2", small, NULL, &w2),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-pending");
	dlshare_writer_abort(w1);
	assert_int_equal(dlshare_delete_prefix(c, "h/", NULL, NULL), 0);
	assert_empty(c);
	dlshare_disconnect(c2);
	dlshare_disconnect(c);
}

static void max_leases(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_bundle *b1, *b2;

	assert_int_equal(store_kib(c, "h/l", 1), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b1), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b2), DLSHARE_ELIMIT);
	assert_hit_once(c, "max-leases");
	dlshare_bundle_free(b1);
	assert_int_equal(dlshare_delete(c, "h/l"), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

static void uid_leases(void **state)
{
	dlshare_client *c = connect_fx(state), *c2 = connect_fx(state);
	dlshare_bundle *b1, *b2;

	/* One each: within max-leases, over the uid's. */
	assert_int_equal(store_kib(c, "h/l", 1), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b1), 0);
	assert_int_equal(dlshare_get(c2, "h/l", NULL, &b2), DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-leases");
	dlshare_bundle_free(b1);
	assert_int_equal(dlshare_delete(c, "h/l"), 0);
	assert_empty(c);
	dlshare_disconnect(c2);
	dlshare_disconnect(c);
}

static void uid_leased_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_bundle *b;

	assert_int_equal(store_kib(c, "h/l", 8), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b), DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-leased-bytes");
	assert_int_equal(dlshare_delete(c, "h/l"), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

static void max_ttl(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_create_opts o = { .device = { kDLCPU, 0 }, .ttl_ms = 120000 };
	dlshare_writer *w;
	int err = create1(c, "h/ttl", small, &o, &w);

	if (err != DLSHARE_ELIMIT)
		fail_msg("%d: %s", err, dlshare_last_error());
	assert_hit_once(c, "max-ttl");
	dlshare_disconnect(c);
}

static void max_queue_depth(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_tensor_spec t = { NULL, DT_F32, 1, small };
	dlshare_queue_opts q = { .depth = 3 };
	dlshare_writer *w;

	assert_int_equal(dlshare_create_queued(c, "h/q", &t, 1, NULL, &q, &w),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "max-queue-depth");
	dlshare_disconnect(c);
}

static void queue_full(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_tensor_spec t = { NULL, DT_F32, 1, small };
	dlshare_queue_opts q = { .depth = 1 };
	dlshare_writer *w;

	assert_int_equal(dlshare_create_queued(c, "h/q", &t, 1, NULL, &q, &w),
			 0);
	assert_int_equal(dlshare_seal(w, NULL, NULL), 0);
	assert_int_equal(dlshare_create_queued(c, "h/q", &t, 1, NULL, &q, &w),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "queue-full");
	assert_int_equal(dlshare_delete(c, "h/q"), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

struct parked {
	dlshare_client *c;
	int err;
};

static void *park(void *arg)
{
	struct parked *p = arg;
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	dlshare_bundle *b;

	p->err = dlshare_get(p->c, "h/w", &o, &b);
	if (!p->err)
		dlshare_bundle_free(b);
	return NULL;
}

static void max_inflight(void **state)
{
	dlshare_client *c = connect_fx(state), *c2 = connect_fx(state);
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	struct util_want want = UTIL_ANY;
	struct parked p = { c2, -1 };
	dlshare_bundle *b;
	pthread_t th;

	/* c2's one request in flight: a get parked for a name to come. */
	assert_int_equal(pthread_create(&th, NULL, park, &p), 0);
	want.parked = 1;
	util_assert_want(c, &want);
	assert_int_equal(dlshare_get(c2, "h/w", &o, &b), DLSHARE_ELIMIT);
	assert_hit_once(c, "max-inflight");
	assert_int_equal(store_kib(c, "h/w", 1), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(p.err, 0);
	assert_int_equal(dlshare_delete(c, "h/w"), 0);
	assert_empty(c);
	dlshare_disconnect(c2);
	dlshare_disconnect(c);
}

/* ==== metadata and packets ================================================== */

static int setup_meta(void **state)
{
	static const char *const args[] = {
		"--uid-manifest-bytes", "4096", "--max-packet", "4096", NULL
	};

	return group_setup(state, args);
}

static void uid_manifest_bytes(void **state)
{
	enum { N = 64 };
	dlshare_client *c = connect_fx(state);
	dlshare_tensor_spec t[N];
	char keys[N][48];
	dlshare_writer *w;

	/* 64 keyed tensors: well over 4 KiB of metadata, inline or in a
	 * manifest memfd. */
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]),
			 "model.layers.%02d.self_attn.q_proj.weight", i);
		t[i] = (dlshare_tensor_spec){ keys[i], DT_F32, 1, small };
	}
	assert_int_equal(dlshare_create(c, "h/m", t, N, NULL, &w),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-manifest-bytes");
	dlshare_disconnect(c);
}

/* A Create that fits a packet, but whose reply (REPLY_OVERHEAD more)
 * would not: refused at max-packet, from a raw client (the library sends
 * nothing past the daemon's max-packet). */
static void max_packet(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = connect_fx(state);
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create m = DLSHARE__CREATE__INIT;
	struct wire_msg *r = NULL;
	char origin[3500];
	int fd;

	memset(origin, 'x', sizeof(origin) - 1);
	origin[sizeof(origin) - 1] = '\0';
	m.name = "h/p";
	m.origin_node = origin;
	f.id = 7;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &m;
	assert_true(dlshare__frame__get_packed_size(&f) < 4096);
	fd = raw_connect(fx->d.sock);
	assert_true(fd >= 0);
	assert_int_equal(raw_hello(fd), 0);
	assert_int_equal(raw_call(fd, &f, NULL, 0, &r), 0);
	assert_int_equal(r->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_int_equal(r->frame->error->code, DLSHARE_E2BIG);
	wire_msg_free(r);
	close(fd);
	assert_hit_once(c, "max-packet");
	dlshare_disconnect(c);
}

/* ==== the daemon's own fds and connections ===================================== */

/* A pending host version holds two fds of the daemon's (its memfd and a
 * read-only one): a second is over 3, the daemon's and the uid's alike;
 * the daemon's is checked first. A third connection is over 2. */
static int setup_daemon_wide(void **state)
{
	static const char *const args[] = {
		"--max-open-fds", "3", "--uid-open-fds", "3",
		"--max-connections", "2", NULL
	};

	return group_setup(state, args);
}

static void two_pending(void **state, const char *label)
{
	dlshare_client *c = connect_fx(state);
	dlshare_writer *w1, *w2;

	assert_int_equal(create1(c, "h/p1", small, NULL, &w1), 0);
	assert_int_equal(create1(c, "h/p2", small, NULL, &w2),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, label);
	dlshare_writer_abort(w1);
	assert_int_equal(dlshare_delete_prefix(c, "h/", NULL, NULL), 0);
	assert_empty(c);
	dlshare_disconnect(c);
}

static void one_too_many(void **state, const char *label)
{
	dlshare_client *c = connect_fx(state), *c2, *c3 = NULL;
	struct fixture *fx = *state;

	assert_int_equal(dlshare_connect(fx->d.sock, &c2), 0);
	assert_int_not_equal(dlshare_connect(fx->d.sock, &c3), 0);
	assert_null(c3);
	assert_hit_once(c, label);
	dlshare_disconnect(c2);
	dlshare_disconnect(c);
}

static void max_open_fds(void **state)
{
	two_pending(state, "max-open-fds");
}

static void max_connections(void **state)
{
	one_too_many(state, "max-connections");
}

/* The same with the uid's limits below the daemon's. */
static int setup_uid_wide(void **state)
{
	static const char *const args[] = {
		"--uid-open-fds", "3", "--uid-connections", "2", NULL
	};

	return group_setup(state, args);
}

static void uid_open_fds(void **state)
{
	two_pending(state, "uid-open-fds");
}

static void uid_connections(void **state)
{
	one_too_many(state, "uid-connections");
}

int main(void)
{
	const struct CMUnitTest main_tests[] = {
		cmocka_unit_test(uid_names),
		cmocka_unit_test(max_tensors),
		cmocka_unit_test(max_buffer_bytes),
		cmocka_unit_test(max_bytes),
		cmocka_unit_test(uid_host_bytes),
		cmocka_unit_test(max_pending),
		cmocka_unit_test(uid_pending),
		cmocka_unit_test(max_leases),
		cmocka_unit_test(uid_leases),
		cmocka_unit_test(uid_leased_bytes),
		cmocka_unit_test(max_ttl),
		cmocka_unit_test(max_queue_depth),
		cmocka_unit_test(queue_full),
		cmocka_unit_test(max_inflight),
	};
	const struct CMUnitTest meta_tests[] = {
		cmocka_unit_test(uid_manifest_bytes),
		cmocka_unit_test(max_packet),
	};
	const struct CMUnitTest daemon_tests[] = {
		cmocka_unit_test(max_open_fds),
		cmocka_unit_test(max_connections),
	};
	const struct CMUnitTest uid_tests[] = {
		cmocka_unit_test(uid_open_fds),
		cmocka_unit_test(uid_connections),
	};
	int failed = 0;

	failed += cmocka_run_group_tests_name("main", main_tests, setup_main,
					      group_teardown);
	failed += cmocka_run_group_tests_name("meta", meta_tests, setup_meta,
					      group_teardown);
	failed += cmocka_run_group_tests_name("daemon", daemon_tests,
					      setup_daemon_wide,
					      group_teardown);
	failed += cmocka_run_group_tests_name("uid", uid_tests,
					      setup_uid_wide, group_teardown);
	return failed;
}
