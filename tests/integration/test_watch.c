/* test_watch — Watch (protocol 1.6): a prefix's changes after a point,
 * woken by a seal of any name under it (not only the last changed one)
 * and by a delete, the timeout, what a watcher may read, the names per
 * reply (--max-watch-names) and the deletions kept (--watch-deletions),
 * many parked watchers and a watcher that goes while parked. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
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

static const int64_t shape4[1] = { 4 };

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int setup_small(void **state)
{
	static const char *const args[] = {
		"--max-watch-names", "4", "--watch-deletions", "2", NULL,
	};

	return util_setup_fdcheck(state, args);
}

static int setup_open(void **state)
{
	return util_setup_open(state, NULL);
}

static int store(dlshare_client *c, const char *name, uint32_t seed)
{
	return util_store(c, name, DT_F32, 1, shape4, seed, NULL);
}

/* Stores a version of name with mode. */
static int store_mode(dlshare_client *c, const char *name, unsigned mode)
{
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape4 };
	dlshare_create_opts o = { .device = { kDLCPU, 0 }, .mode = mode };
	dlshare_writer *w;
	int err = dlshare_create(c, name, &spec, 1, &o, &w);

	return err ? err : dlshare_seal(w, NULL, NULL);
}

/* Waits until the daemon holds want parked requests. Returns 0 or -1. */
static int wait_parked(dlshare_client *c, int64_t want)
{
	int64_t end = util_now_ms() + harness_ms(10000);

	for (;;) {
		dlshare_stats s;

		if (dlshare_stats_get(c, &s))
			return -1;
		if ((int64_t)s.parked == want)
			return 0;
		if (util_now_ms() > end)
			return -1;
		util_sleep_ms(2);
	}
}

/* The daemon's change point now (a watch that answers at once). */
static uint64_t point_now(dlshare_client *c, const char *prefix)
{
	dlshare_watch_change ch[64];
	uint64_t seq = 0, after = 0;
	unsigned flags = DLSHARE_WATCH_MORE;
	size_t n;

	while (flags & DLSHARE_WATCH_MORE) {
		assert_int_equal(dlshare_watch(c, prefix, after, 0, ch, 64, &n,
					       &seq, &flags), 0);
		after = seq;
	}
	return seq;
}

/* A child: once the parent's watch is parked, seals arg (a name). */
static int seal_when_parked(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_CHECK(wait_parked(c, 1) == 0);
	CHILD_OK(store(c, arg, 9));
	dlshare_disconnect(c);
	return 0;
}

static int delete_when_parked(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_CHECK(wait_parked(c, 1) == 0);
	CHILD_OK(dlshare_delete(c, arg));
	dlshare_disconnect(c);
	return 0;
}

/* A seal of a name that is not the prefix's last changed one wakes a
 * parked watch, which names it (and nothing outside the prefix). */
static void woken_by_seal(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_watch_change ch[8];
	uint64_t seq, seq2;
	unsigned flags;
	size_t n;
	pid_t p;

	assert_int_equal(store(c, "w/x", 1), 0);
	assert_int_equal(store(c, "w/y", 2), 0);
	assert_int_equal(store(c, "other/z", 3), 0);
	/* from the start: both names of the prefix, oldest change first */
	assert_int_equal(dlshare_watch(c, "w/", 0, 0, ch, 8, &n, &seq, &flags),
			 0);
	assert_int_equal(n, 2);
	assert_string_equal(ch[0].name, "w/x");
	assert_string_equal(ch[1].name, "w/y");
	assert_int_equal(ch[0].version, 1);
	assert_false(ch[0].deleted);
	assert_int_equal(flags, 0);
	/* nothing new: answered at once, empty */
	assert_int_equal(dlshare_watch(c, "w/", seq, 0, ch, 8, &n, &seq2,
				       &flags), 0);
	assert_int_equal(n, 0);
	assert_int_equal(seq2, seq);

	p = util_spawn(&fx->d, seal_when_parked, "w/x");
	assert_int_equal(dlshare_watch(c, "w/", seq, harness_ms(30000), ch, 8,
				       &n, &seq2, &flags), 0);
	assert_int_equal(n, 1);
	assert_string_equal(ch[0].name, "w/x");
	assert_int_equal(ch[0].version, 2);
	assert_false(ch[0].deleted);
	assert_true(seq2 > seq);
	assert_int_equal(util_wait(p), 0);
	dlshare_disconnect(c);
}

/* A delete wakes it too, and says so. */
static void woken_by_delete(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_watch_change ch[8];
	uint64_t seq, seq2;
	unsigned flags;
	size_t n;
	pid_t p;

	assert_int_equal(store(c, "d/a", 1), 0);
	assert_int_equal(store(c, "d/a", 2), 0);
	assert_int_equal(store(c, "d/b", 3), 0);
	seq = point_now(c, "d/");
	p = util_spawn(&fx->d, delete_when_parked, "d/a");
	assert_int_equal(dlshare_watch(c, "d/", seq, harness_ms(30000), ch, 8,
				       &n, &seq2, &flags), 0);
	assert_int_equal(n, 1);
	assert_string_equal(ch[0].name, "d/a");
	assert_true(ch[0].deleted);
	assert_int_equal(ch[0].version, 2);
	assert_int_equal(util_wait(p), 0);
	/* a new d/a after the delete: reported as a new version */
	assert_int_equal(store(c, "d/a", 4), 0);
	assert_int_equal(dlshare_watch(c, "d/", seq2, 0, ch, 8, &n, &seq,
				       &flags), 0);
	assert_int_equal(n, 1);
	assert_false(ch[0].deleted);
	dlshare_disconnect(c);
}

/* Nothing changes under the prefix (a change elsewhere does not count):
 * the timeout answers, empty, at the same point. */
static void timeout_empty(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_watch_change ch[8];
	uint64_t seq, seq2;
	unsigned flags;
	size_t n;

	assert_int_equal(store(c, "t/a", 1), 0);
	seq = point_now(c, "t/");
	assert_int_equal(store(c, "elsewhere", 2), 0);
	assert_int_equal(dlshare_watch(c, "t/", seq, 50, ch, 8, &n, &seq2,
				       &flags), 0);
	assert_int_equal(n, 0);
	assert_true(seq2 >= seq);
	assert_int_equal(wait_parked(c, 0), 0);
	/* bad arguments */
	assert_int_equal(dlshare_watch(c, "/x", 0, 0, ch, 8, &n, &seq, NULL),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_watch(c, "t/", 0, -5, ch, 8, &n, &seq, NULL),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_watch(c, "t/", 0, 0, ch, 0, &n, &seq, NULL),
			 DLSHARE_EINVAL);
	dlshare_disconnect(c);
}

/* --max-watch-names 4: ten changed names come four at a time, each once,
 * oldest first; a client asking for fewer gets fewer. */
static void names_limit(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_watch_change ch[16];
	uint64_t after = 0, seq;
	unsigned flags = DLSHARE_WATCH_MORE;
	int seen[10] = { 0 }, total = 0, rounds = 0;
	size_t n;

	for (int i = 0; i < 10; i++) {
		char name[32];

		snprintf(name, sizeof(name), "many/%d", i);
		assert_int_equal(store(c, name, (uint32_t)i), 0);
	}
	while (flags & DLSHARE_WATCH_MORE) {
		assert_int_equal(dlshare_watch(c, "many/", after, 0, ch, 16,
					       &n, &seq, &flags), 0);
		assert_true(n <= 4);
		if (flags & DLSHARE_WATCH_MORE)
			assert_int_equal(n, 4);
		for (size_t i = 0; i < n; i++) {
			int k = atoi(ch[i].name + 5);

			assert_int_equal(k, total + (int)i);
			seen[k]++;
		}
		total += (int)n;
		after = seq;
		assert_true(++rounds <= 4);
	}
	assert_int_equal(total, 10);
	for (int i = 0; i < 10; i++)
		assert_int_equal(seen[i], 1);
	assert_int_equal(rounds, 3);
	assert_int_equal(dlshare_watch(c, "many/", 0, 0, ch, 3, &n, &seq,
				       &flags), 0);
	assert_int_equal(n, 3);
	assert_true(flags & DLSHARE_WATCH_MORE);
	dlshare_disconnect(c);
}

/* --watch-deletions 2: three deletions after a point; a watcher from that
 * point hears the two kept and that it lost some. */
static void deletions_lost(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_watch_change ch[8];
	uint64_t seq, seq2;
	unsigned flags;
	size_t n;

	assert_int_equal(store(c, "gone/a", 1), 0);
	assert_int_equal(store(c, "gone/b", 2), 0);
	assert_int_equal(store(c, "gone/c", 3), 0);
	seq = point_now(c, "gone/");
	assert_int_equal(dlshare_delete(c, "gone/a"), 0);
	assert_int_equal(dlshare_delete(c, "gone/b"), 0);
	/* two kept: nothing lost yet */
	assert_int_equal(dlshare_watch(c, "gone/", seq, 0, ch, 8, &n, &seq2,
				       &flags), 0);
	assert_int_equal(n, 2);
	assert_int_equal(flags & DLSHARE_WATCH_LOST, 0);
	assert_int_equal(dlshare_delete(c, "gone/c"), 0);
	assert_int_equal(dlshare_watch(c, "gone/", seq, 0, ch, 8, &n, &seq2,
				       &flags), 0);
	assert_int_equal(n, 2);
	assert_true(flags & DLSHARE_WATCH_LOST);
	assert_string_equal(ch[0].name, "gone/b");
	assert_string_equal(ch[1].name, "gone/c");
	assert_true(ch[0].deleted && ch[1].deleted);
	/* a point from the future (another daemon run): lost too */
	assert_int_equal(dlshare_watch(c, "gone/", seq2 + 1000, 0, ch, 8, &n,
				       &seq, &flags), 0);
	assert_true(flags & DLSHARE_WATCH_LOST);
	dlshare_disconnect(c);
}

/* --watch-deletions 2 with live names between the deletions in the log
 * (the daemon finds the next oldest deletion past them): the newest two
 * deletions are kept, in order, whatever lies between; the live names are
 * all reported; a live name changed again moves past them. */
static void deletions_among_live(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	static const char *const live[] = { "mix/live/x", "mix/live/y",
					    "mix/live/z" };
	char name[32];
	dlshare_watch_change ch[8];
	uint64_t seq, seq0;
	unsigned flags;
	size_t n;

	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "mix/del/%d", i);
		assert_int_equal(store(c, name, (uint32_t)i + 1), 0);
	}
	seq0 = point_now(c, "mix/");
	for (int i = 0; i < 5; i++) {
		if (i < 3)
			assert_int_equal(store(c, live[i], 10), 0);
		snprintf(name, sizeof(name), "mix/del/%d", i);
		assert_int_equal(dlshare_delete(c, name), 0);
		if (i == 3)   /* x changes again: now the newest live name */
			assert_int_equal(store(c, live[0], 11), 0);
	}
	assert_int_equal(dlshare_watch(c, "mix/del/", seq0, 0, ch, 8, &n,
				       &seq, &flags), 0);
	assert_int_equal(n, 2);
	assert_true(flags & DLSHARE_WATCH_LOST);
	assert_string_equal(ch[0].name, "mix/del/3");
	assert_string_equal(ch[1].name, "mix/del/4");
	assert_true(ch[0].deleted && ch[1].deleted);
	assert_int_equal(dlshare_watch(c, "mix/live/", 0, 0, ch, 8, &n, &seq,
				       &flags), 0);
	assert_int_equal(n, 3);
	assert_string_equal(ch[0].name, "mix/live/y");
	assert_string_equal(ch[1].name, "mix/live/z");
	assert_string_equal(ch[2].name, "mix/live/x");
	assert_false(ch[0].deleted || ch[1].deleted || ch[2].deleted);
	for (int i = 0; i < 3; i++)
		assert_int_equal(dlshare_delete(c, live[i]), 0);
	/* five deletions more: still the newest two */
	assert_int_equal(dlshare_watch(c, "mix/", 0, 0, ch, 8, &n, &seq,
				       &flags), 0);
	assert_int_equal(n, 2);
	assert_string_equal(ch[0].name, "mix/live/y");
	assert_string_equal(ch[1].name, "mix/live/z");
	dlshare_disconnect(c);
}

/* ---- many watchers ------------------------------------------------------------ */

/* A child: watches "m/" from the point in arg, wants m/go. */
static int watch_for_go(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_watch_change ch[4];
	uint64_t seq;
	size_t n;

	CHILD_OK(dlshare_watch(c, "m/", *(uint64_t *)arg, harness_ms(60000),
			       ch, 4, &n, &seq, NULL));
	CHILD_CHECK(n == 1);
	CHILD_CHECK(strcmp(ch[0].name, "m/go") == 0);
	dlshare_disconnect(c);
	return 0;
}

/* A child: parks a watch that nothing will answer, until killed. */
static int watch_forever(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_watch_change ch[4];
	uint64_t seq;
	size_t n;

	(void)arg;
	CHILD_OK(dlshare_watch(c, "never/", 0, DLSHARE_WAIT_FOREVER, ch, 4,
			       &n, &seq, NULL));
	return 1;
}

/* Many connections park a watch; one seal wakes every one. One that is
 * killed while parked leaves nothing parked behind. */
static void many_watchers(void **state)
{
	struct fixture *fx = *state;
	enum { N = 24 };
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want w = UTIL_ANY;
	uint64_t seq;
	pid_t p[N], k;

	assert_int_equal(store(c, "m/before", 1), 0);
	seq = point_now(c, "m/");
	for (int i = 0; i < N; i++)
		p[i] = util_spawn(&fx->d, watch_for_go, &seq);
	k = util_spawn(&fx->d, watch_forever, NULL);
	assert_int_equal(wait_parked(c, N + 1), 0);
	/* a change elsewhere wakes none of them */
	assert_int_equal(store(c, "m2/other", 1), 0);
	assert_int_equal(store(c, "m/go", 2), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(util_wait(p[i]), 0);
	assert_int_equal(wait_parked(c, 1), 0);
	util_kill(k);
	w.parked = 0;
	w.connections = 1;
	util_assert_want(c, &w);
	dlshare_disconnect(c);
}

/* ---- who may read ------------------------------------------------------------- */

/* As uid A: watches "acl/" from 0, then from that point; reports through
 * its exit code. Only acl/open may be seen. */
static int watch_as_a(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_watch_change ch[8];
	uint64_t seq, seq2;
	size_t n;

	(void)arg;
	CHILD_OK(dlshare_watch(c, "acl/", 0, 0, ch, 8, &n, &seq, NULL));
	CHILD_CHECK(n == 1);
	CHILD_CHECK(strcmp(ch[0].name, "acl/open") == 0);
	/* the parent seals acl/secret and then acl/open once parked */
	CHILD_OK(util_post(c, "acl-go/parking", 1));
	CHILD_OK(dlshare_watch(c, "acl/", seq, harness_ms(30000), ch, 8, &n,
			       &seq2, NULL));
	CHILD_CHECK(n == 1);
	CHILD_CHECK(strcmp(ch[0].name, "acl/open") == 0);
	CHILD_CHECK(ch[0].version == 2);
	/* the parent deletes both: the deletion of acl/secret is not ours
	 * to see either */
	CHILD_OK(util_post(c, "acl-go/parking", 2));
	CHILD_OK(dlshare_watch(c, "acl/", seq2, harness_ms(30000), ch, 8, &n,
			       &seq, NULL));
	CHILD_CHECK(n == 1);
	CHILD_CHECK(strcmp(ch[0].name, "acl/open") == 0);
	CHILD_CHECK(ch[0].deleted);
	dlshare_disconnect(c);
	return 0;
}

static void acl(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	pid_t a;

	if (!util_can_switch_uids())
		test_skip("needs root to run peers of other uids");
	c = harness_connect(&fx->d);
	assert_int_equal(store_mode(c, "acl/secret", 0600), 0);
	assert_int_equal(store_mode(c, "acl/open", 0644), 0);
	a = util_spawn_as(&fx->d, UTIL_UID_A, UTIL_UID_A, watch_as_a, NULL);
	assert_true(util_await(c, "acl-go/parking", 0, harness_ms(30000),
			       NULL) > 0);
	/* parked: the one-change wait of the child, and then none */
	assert_int_equal(wait_parked(c, 1), 0);
	assert_int_equal(store_mode(c, "acl/secret", 0600), 0);
	assert_int_equal(store_mode(c, "acl/open", 0644), 0);
	assert_true(util_await(c, "acl-go/parking", 1, harness_ms(30000),
			       NULL) > 0);
	assert_int_equal(wait_parked(c, 1), 0);
	assert_int_equal(dlshare_delete(c, "acl/secret"), 0);
	assert_int_equal(dlshare_delete(c, "acl/open"), 0);
	assert_int_equal(util_wait(a), 0);
	dlshare_disconnect(c);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest acl_tests[] = {
		cmocka_unit_test_setup_teardown(acl, setup_open, util_teardown),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(woken_by_seal, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(woken_by_delete, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(timeout_empty, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(names_limit, setup_small,
						util_teardown),
		cmocka_unit_test_setup_teardown(deletions_lost, setup_small,
						util_teardown),
		cmocka_unit_test_setup_teardown(deletions_among_live, setup_small,
						util_teardown),
		cmocka_unit_test_setup_teardown(many_watchers, setup,
						util_teardown),
	};

	if (argc > 1 && strcmp(argv[1], "acl") == 0)
		return test_run_group("watch_acl", acl_tests, NULL, NULL);
	return test_run_group("watch", tests, NULL, NULL);
}
