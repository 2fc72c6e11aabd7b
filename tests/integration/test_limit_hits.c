/* test_limit_hits — each named limit, crossed once, counts in its own row
 * of dlshare_limit_hits_total and in no other: a refusal names its limit
 * where it refuses (struct refusal, peer_limit_hit), so the metric follows
 * the code, not the wording of an error. Each test starts a daemon with
 * that one limit small, crosses it, and reads the whole family back.
 *
 * Not crossed here: uid-gpu-bytes and uid-leased-gpu-bytes (GPU memory),
 * max-out-fds and uid-fds (peers that stop reading: test_security's
 * deaf_peer_fds counts their rows), max-buffers (a refusal counted as
 * max-tensors, as it always was: the library makes one buffer).
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

static const int64_t small[1] = { 256 };    /* 1 KiB of float32 */
static const int64_t large[1] = { 4096 };   /* 16 KiB */

/* Fails unless label was hit exactly once and every other limit never. */
static void assert_hit_once(dlshare_client *c, const char *label)
{
	struct util_hits h;
	int found = 0;

	util_limit_hits(c, &h);
	/* Every row is always there (a counter, 0 until hit). */
	assert_true(h.n >= 20);
	for (size_t i = 0; i < h.n; i++) {
		uint64_t want = !strcmp(h.label[i], label);

		found |= (int)want;
		if (h.value[i] != want)
			fail_msg("limit %s: %llu hits, want %llu (crossing %s)",
				 h.label[i], (unsigned long long)h.value[i],
				 (unsigned long long)want, label);
	}
	if (!found)
		fail_msg("no row for limit %s", label);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

#define SETUP(fn, ...)                                                        \
	static int fn(void **state)                                           \
	{                                                                     \
		static const char *const args[] = { __VA_ARGS__, NULL };      \
		return util_setup(state, args);                               \
	}

static dlshare_client *connect_fx(void **state)
{
	struct fixture *fx = *state;

	return harness_connect(&fx->d);
}

static int create1(dlshare_client *c, const char *name, const int64_t *shape,
		   const dlshare_create_opts *o, dlshare_writer **w)
{
	dlshare_tensor_spec t = { NULL, DT_F32, 1, shape };

	return dlshare_create(c, name, &t, 1, o, w);
}

/* ---- names and bytes ------------------------------------------------------ */

SETUP(setup_uid_names, "--uid-names", "1")
static void uid_names(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(util_store(c, "h/a", DT_F32, 1, small, 1, NULL), 0);
	assert_int_equal(util_store(c, "h/b", DT_F32, 1, small, 1, NULL),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-names");
	dlshare_disconnect(c);
}

SETUP(setup_max_tensors, "--max-tensors", "1")
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

SETUP(setup_max_buffer_bytes, "--max-buffer-bytes", "8192")
static void max_buffer_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_not_equal(util_store(c, "h/b", DT_F32, 1, large, 1, NULL),
			     0);
	assert_hit_once(c, "max-buffer-bytes");
	dlshare_disconnect(c);
}

SETUP(setup_max_bytes, "--max-bytes", "8192")
static void max_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(util_store(c, "h/b", DT_F32, 1, large, 1, NULL),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "max-bytes");
	dlshare_disconnect(c);
}

SETUP(setup_uid_host_bytes, "--uid-host-bytes", "8192")
static void uid_host_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);

	assert_int_equal(util_store(c, "h/b", DT_F32, 1, large, 1, NULL),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-host-bytes");
	dlshare_disconnect(c);
}

SETUP(setup_uid_manifest_bytes, "--uid-manifest-bytes", "4096")
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
SETUP(setup_max_packet, "--max-packet", "4096")
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

/* ---- pending versions and fds --------------------------------------------- */

static void two_pending(void **state, const char *label)
{
	dlshare_client *c = connect_fx(state);
	dlshare_writer *w1, *w2;

	assert_int_equal(create1(c, "h/p1", small, NULL, &w1), 0);
	assert_int_equal(create1(c, "h/p2", small, NULL, &w2),
			 DLSHARE_ELIMIT);
	assert_hit_once(c, label);
	dlshare_writer_abort(w1);
	dlshare_disconnect(c);
}

SETUP(setup_max_pending, "--max-pending", "1")
static void max_pending(void **state)
{
	two_pending(state, "max-pending");
}

SETUP(setup_uid_pending, "--uid-pending", "1")
static void uid_pending(void **state)
{
	two_pending(state, "uid-pending");
}

/* Each pending host version holds two fds of the daemon's (its memfd
 * and a read-only one); the uid may have as many as the daemon. */
SETUP(setup_max_open_fds, "--max-open-fds", "3", "--uid-open-fds", "3")
static void max_open_fds(void **state)
{
	two_pending(state, "max-open-fds");
}

SETUP(setup_uid_open_fds, "--uid-open-fds", "3")
static void uid_open_fds(void **state)
{
	two_pending(state, "uid-open-fds");
}

/* ---- leases ----------------------------------------------------------------- */

static void two_leases(void **state, const char *label)
{
	dlshare_client *c = connect_fx(state);
	dlshare_bundle *b1, *b2;

	assert_int_equal(util_store(c, "h/l", DT_F32, 1, small, 1, NULL), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b1), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b2), DLSHARE_ELIMIT);
	assert_hit_once(c, label);
	dlshare_bundle_free(b1);
	dlshare_disconnect(c);
}

SETUP(setup_max_leases, "--max-leases", "1")
static void max_leases(void **state)
{
	two_leases(state, "max-leases");
}

SETUP(setup_uid_leases, "--uid-leases", "1")
static void uid_leases(void **state)
{
	two_leases(state, "uid-leases");
}

SETUP(setup_uid_leased_bytes, "--uid-leased-bytes", "8192")
static void uid_leased_bytes(void **state)
{
	dlshare_client *c = connect_fx(state);
	dlshare_bundle *b;

	assert_int_equal(util_store(c, "h/l", DT_F32, 1, large, 1, NULL), 0);
	assert_int_equal(dlshare_get(c, "h/l", NULL, &b), DLSHARE_ELIMIT);
	assert_hit_once(c, "uid-leased-bytes");
	dlshare_disconnect(c);
}

/* ---- lifetimes and queues ----------------------------------------------------- */

SETUP(setup_max_ttl, "--max-ttl", "60000")
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

SETUP(setup_max_queue_depth, "--max-queue-depth", "2")
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

SETUP(setup_queue_full, "--max-queue-depth", "4")
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
	dlshare_disconnect(c);
}

/* ---- connections and requests in flight --------------------------------------- */

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

SETUP(setup_max_connections, "--max-connections", "2")
static void max_connections(void **state)
{
	one_too_many(state, "max-connections");
}

SETUP(setup_uid_connections, "--uid-connections", "2")
static void uid_connections(void **state)
{
	one_too_many(state, "uid-connections");
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

SETUP(setup_max_inflight, "--max-inflight", "1")
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
	assert_int_equal(util_store(c, "h/w", DT_F32, 1, small, 1, NULL), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(p.err, 0);
	dlshare_disconnect(c2);
	dlshare_disconnect(c);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup_##name, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(uid_names),
		T(max_tensors),
		T(max_buffer_bytes),
		T(max_bytes),
		T(uid_host_bytes),
		T(uid_manifest_bytes),
		T(max_packet),
		T(max_pending),
		T(uid_pending),
		T(max_open_fds),
		T(uid_open_fds),
		T(max_leases),
		T(uid_leases),
		T(uid_leased_bytes),
		T(max_ttl),
		T(max_queue_depth),
		T(queue_full),
		T(max_connections),
		T(uid_connections),
		T(max_inflight),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
