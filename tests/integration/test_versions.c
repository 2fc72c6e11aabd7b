/* test_versions — version numbers and selectors (LATEST, EXACT of a leased
 * and of a dead version, NEWER_THAN), gets parked until another process
 * publishes (with a timeout and forever), timeouts, delete while a
 * consumer still holds a lease; the same Get again, from two clients, finds
 * the name as it is now. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

static const int64_t shape[1] = { 1000 };

#define AWAIT(c, name) CHILD_CHECK(util_await(c, name, 0, harness_ms(20000), NULL) > 0)

/* ---- numbers and selectors ---------------------------------------------------- */

static int holder(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_OK(dlshare_get(c, "v/w", NULL, &b));
	CHILD_CHECK(dlshare_bundle_version(b) == 1);
	CHILD_OK(util_post(c, "v/w.held", 1));
	AWAIT(c, "v/w.release");
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_I32, 1, shape,
			       101) == 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static int selector(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = { 0 };
	dlshare_name_info info;
	dlshare_bundle *b;
	uint64_t v;

	/* LATEST, explicitly and by default. */
	o.select = DLSHARE_LATEST;
	CHILD_OK(util_get_check(c, "v/w", &o, DT_I32, 1, shape, 103, &v));
	CHILD_CHECK(v == 3);
	CHILD_OK(util_get_check(c, "v/w", NULL, DT_I32, 1, shape, 103, &v));
	CHILD_CHECK(v == 3);
	/* EXACT of an old version that another process still leases. */
	o.select = DLSHARE_EXACT;
	o.version = 1;
	CHILD_OK(util_get_check(c, "v/w", &o, DT_I32, 1, shape, 101, &v));
	CHILD_CHECK(v == 1);
	/* EXACT of an old version nobody held: it is gone. */
	o.version = 2;
	CHILD_ERR(dlshare_get(c, "v/w", &o, &b), DLSHARE_ENOENT);
	/* EXACT of one not published yet, without waiting. */
	o.version = 4;
	CHILD_ERR(dlshare_get(c, "v/w", &o, &b), DLSHARE_ENOENT);
	o.version = 3;
	CHILD_OK(util_get_check(c, "v/w", &o, DT_I32, 1, shape, 103, &v));
	/* NEWER_THAN. */
	o.select = DLSHARE_NEWER_THAN;
	o.version = 0;
	CHILD_OK(util_get_check(c, "v/w", &o, DT_I32, 1, shape, 103, &v));
	CHILD_CHECK(v == 3);
	o.version = 1;
	CHILD_OK(util_get_check(c, "v/w", &o, DT_I32, 1, shape, 103, &v));
	CHILD_CHECK(v == 3);
	o.version = 3;
	CHILD_ERR(dlshare_get(c, "v/w", &o, &b), DLSHARE_ENOENT);
	/* A selector the API does not know. */
	o.select = 7;
	CHILD_ERR(dlshare_get(c, "v/w", &o, &b), DLSHARE_EINVAL);
	/* The newest plus the leased one are alive. */
	CHILD_OK(dlshare_stat(c, "v/w", &info, NULL));
	CHILD_CHECK(info.latest == 3);
	CHILD_CHECK(info.versions == 2);
	CHILD_CHECK(info.leases == 1);
	dlshare_disconnect(c);
	return 0;
}

static void numbers_and_selectors(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_get_opts exact1 = { .select = DLSHARE_EXACT, .version = 1 };
	dlshare_name_info info;
	dlshare_bundle *b;
	uint64_t v;
	pid_t h;

	assert_int_equal(util_store(c, "v/w", DT_I32, 1, shape, 101, &v), 0);
	assert_int_equal(v, 1);
	h = util_spawn(&fx->d, holder, NULL);
	assert_true(util_await(c, "v/w.held", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(util_store(c, "v/w", DT_I32, 1, shape, 102, &v), 0);
	assert_int_equal(v, 2);
	assert_int_equal(util_export(c, "v/w", DT_I32, 1, shape, 103, &v, NULL), 0);
	assert_int_equal(v, 3);
	assert_int_equal(util_wait(util_spawn(&fx->d, selector, NULL)), 0);

	assert_int_equal(util_post(c, "v/w.release", 1), 0);
	assert_int_equal(util_wait(h), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	/* Its last lease gone, version 1 is gone too. */
	assert_int_equal(dlshare_get(c, "v/w", &exact1, &b), DLSHARE_ENOENT);
	assert_int_equal(dlshare_stat(c, "v/w", &info, NULL), 0);
	assert_int_equal(info.versions, 1);
	assert_int_equal(info.latest, 3);
	/* Numbers keep counting from where they were. */
	assert_int_equal(util_store(c, "v/w", DT_I32, 1, shape, 104, &v), 0);
	assert_int_equal(v, 4);
	dlshare_disconnect(c);
}

/* ---- parked gets ------------------------------------------------------------------ */

struct waiter {
	const char *name;
	dlshare_get_opts o;
	uint64_t want;
	uint32_t seed;
};

static int waiter(const struct daemon_proc *d, void *arg)
{
	const struct waiter *w = arg;
	dlshare_client *c = util_child_connect(d);
	uint64_t v;

	CHILD_OK(util_get_check(c, w->name, &w->o, DT_I32, 1, shape, w->seed,
				&v));
	if (v != w->want)
		CHILD_FAIL("%s: got version %llu, want %llu", w->name,
			   (unsigned long long)v, (unsigned long long)w->want);
	dlshare_disconnect(c);
	return 0;
}

struct pub {
	const char *name;
	uint32_t seed;
	uint64_t want;
	int export;
};

/* Publishes from its own process, and for an export stays until the
 * version was read: "<name>.read" gets a version. */
static int publisher(const struct daemon_proc *d, void *arg)
{
	const struct pub *p = arg;
	dlshare_client *c = util_child_connect(d);
	char done[300];
	uint64_t v;

	if (p->export)
		CHILD_OK(util_export(c, p->name, DT_I32, 1, shape, p->seed, &v,
				     NULL));
	else
		CHILD_OK(util_store(c, p->name, DT_I32, 1, shape, p->seed, &v));
	CHILD_CHECK(v == p->want);
	if (p->export) {
		snprintf(done, sizeof(done), "%s.read", p->name);
		AWAIT(c, done);
	}
	dlshare_disconnect(c);
	return 0;
}

static void wait_parked(dlshare_client *c, int n)
{
	struct util_want w = UTIL_ANY;

	w.parked = n;
	util_assert_want(c, &w);
}

static void parked_gets(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct waiter newer = {
		"v/p", { .select = DLSHARE_NEWER_THAN, .version = 1,
			 .timeout_ms = harness_ms(5000) }, 2, 202,
	};
	struct waiter forever = {
		"v/fresh", { .select = DLSHARE_LATEST,
			     .timeout_ms = DLSHARE_WAIT_FOREVER }, 1, 301,
	};
	struct waiter exact3 = {
		"v/p", { .select = DLSHARE_EXACT, .version = 3,
			 .timeout_ms = harness_ms(5000) }, 3, 203,
	};
	struct pub p2 = { "v/p", 202, 2, 0 }, p3 = { "v/p", 203, 3, 1 };
	struct pub fresh = { "v/fresh", 301, 1, 0 };
	pid_t w1, w2, w3, pp;

	assert_int_equal(util_store(c, "v/p", DT_I32, 1, shape, 201, NULL), 0);
	w1 = util_spawn(&fx->d, waiter, &newer);
	w2 = util_spawn(&fx->d, waiter, &forever);
	w3 = util_spawn(&fx->d, waiter, &exact3);
	wait_parked(c, 3);

	/* Version 2 wakes the NEWER_THAN 1 waiter, not the EXACT 3 one. */
	assert_int_equal(util_wait(util_spawn(&fx->d, publisher, &p2)), 0);
	assert_int_equal(util_wait(w1), 0);
	wait_parked(c, 2);
	/* A name that did not exist wakes the one waiting forever. */
	assert_int_equal(util_wait(util_spawn(&fx->d, publisher, &fresh)), 0);
	assert_int_equal(util_wait(w2), 0);
	wait_parked(c, 1);
	/* An export wakes the EXACT 3 waiter. */
	pp = util_spawn(&fx->d, publisher, &p3);
	assert_int_equal(util_wait(w3), 0);
	assert_int_equal(util_post(c, "v/p.read", 1), 0);
	assert_int_equal(util_wait(pp), 0);
	wait_parked(c, 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- timeouts ----------------------------------------------------------------------- */

/* libuv keeps its timers on a millisecond loop clock that may run a little
 * behind: a timer can fire up to a few ms before the exact deadline. */
#define CLOCK_SLACK_MS 5

static int timing_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int timeout = harness_ms(400);
	dlshare_get_opts o = { .timeout_ms = timeout };
	dlshare_stats s;
	dlshare_bundle *b;
	int64_t t0, dt;

	/* A missing name, waited for. */
	t0 = util_now_ms();
	CHILD_ERR(dlshare_get(c, "v/missing", &o, &b), DLSHARE_ETIMEDOUT);
	dt = util_now_ms() - t0;
	if (dt < timeout - CLOCK_SLACK_MS)
		CHILD_FAIL("timed out after %lld ms, before %d ms",
			   (long long)dt, timeout);
	/* A newer version than the current one, waited for. */
	o.select = DLSHARE_NEWER_THAN;
	o.version = 1;
	t0 = util_now_ms();
	CHILD_ERR(dlshare_get(c, "v/t", &o, &b), DLSHARE_ETIMEDOUT);
	dt = util_now_ms() - t0;
	if (dt < timeout - CLOCK_SLACK_MS)
		CHILD_FAIL("timed out after %lld ms, before %d ms",
			   (long long)dt, timeout);
	/* Timeout 0: an answer at once, nothing parked. */
	o.select = DLSHARE_LATEST;
	o.timeout_ms = 0;
	CHILD_ERR(dlshare_get(c, "v/missing", &o, &b), DLSHARE_ENOENT);
	o.select = DLSHARE_NEWER_THAN;
	CHILD_ERR(dlshare_get(c, "v/t", &o, &b), DLSHARE_ENOENT);
	CHILD_OK(dlshare_stats_get(c, &s));
	CHILD_CHECK(s.parked == 0);
	/* A negative timeout other than WAIT_FOREVER is invalid. */
	o.timeout_ms = -5;
	CHILD_ERR(dlshare_get(c, "v/t", &o, &b), DLSHARE_EINVAL);
	dlshare_disconnect(c);
	return 0;
}

static void timeouts(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);

	assert_int_equal(util_store(c, "v/t", DT_I32, 1, shape, 1, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, timing_consumer, NULL)), 0);
	wait_parked(c, 0);
	dlshare_disconnect(c);
}

/* ---- delete while leased --------------------------------------------------------------- */

static int delete_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	DLManagedTensor *m;
	dlshare_bundle *b;

	CHILD_OK(dlshare_get_tensor(c, "v/d", NULL, &m));
	CHILD_OK(util_post(c, "v/d.held", 1));
	AWAIT(c, "v/d.deleted");
	CHILD_ERR(dlshare_get(c, "v/d", NULL, &b), DLSHARE_ENOENT);
	/* What we hold is still there, unchanged. */
	CHILD_CHECK(util_check(&m->dl_tensor, DT_I32, 1, shape, 7) == 0);
	m->deleter(m);
	dlshare_disconnect(c);
	return 0;
}

static int count_names(const dlshare_name_info *info, void *arg)
{
	(*(int *)arg)++;
	return 0;
}

static void delete_while_leased(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want empty = UTIL_ANY;
	dlshare_name_info info;
	dlshare_bundle *b;
	int n = 0;
	pid_t p;

	assert_int_equal(util_store(c, "v/d", DT_I32, 1, shape, 7, NULL), 0);
	p = util_spawn(&fx->d, delete_consumer, NULL);
	assert_true(util_await(c, "v/d.held", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(dlshare_delete(c, "v/d"), 0);
	assert_int_equal(dlshare_delete(c, "v/d"), DLSHARE_ENOENT);
	assert_int_equal(dlshare_stat(c, "v/d", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(dlshare_get(c, "v/d", NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(dlshare_list(c, "v/d", count_names, &n), 0);
	assert_int_equal(n, 1); /* v/d.held only */
	assert_int_equal(util_post(c, "v/d.deleted", 1), 0);
	assert_int_equal(util_wait(p), 0);

	assert_int_equal(dlshare_delete(c, "v/d.held"), 0);
	assert_int_equal(dlshare_delete(c, "v/d.deleted"), 0);
	empty.connections = 1;
	empty.names = 0;
	empty.versions = 0;
	empty.leases = 0;
	empty.buffers = 0;
	empty.bytes = 0;
	util_assert_want(c, &empty);
	dlshare_disconnect(c);
}

/* ---- the same Get again ------------------------------------------------------------ */

/* The daemon keeps the last Get body it decoded and the hash of its name
 * (wire_memo, get.c): a Get of the same bytes, from any client, reuses
 * both. Each such get must still find the name as it is now: a new entry
 * after a delete and a new publish, none after a delete, and the name's
 * own after a Get of another name in between. Every get here asks the
 * daemon (no reuse by the version board). */
static void same_get_finds_the_name_as_it_is(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *a, *b;
	dlshare_bundle *bu;
	uint64_t v, made;

	assert_int_equal(setenv("DLSHARE_NO_REUSE", "1", 1), 0);
	a = harness_connect(&fx->d);
	b = harness_connect(&fx->d);
	assert_int_equal(unsetenv("DLSHARE_NO_REUSE"), 0);
	assert_int_equal(util_store(a, "v/other", DT_I32, 1, shape, 2, NULL), 0);
	for (uint32_t round = 0; round < 4; round++) {
		uint32_t seed = 10 + round;

		assert_int_equal(util_store(a, "v/same", DT_I32, 1, shape, seed,
					    &made), 0);
		/* The same Get from both clients, in a row. */
		for (int i = 0; i < 3; i++) {
			assert_int_equal(util_get_check(i % 2 ? b : a, "v/same",
							NULL, DT_I32, 1, shape,
							seed, &v), 0);
			assert_int_equal(v, made);
		}
		/* Another name's Get in between, then the first again. */
		assert_int_equal(util_get_check(b, "v/other", NULL, DT_I32, 1,
						shape, 2, NULL), 0);
		assert_int_equal(util_get_check(b, "v/same", NULL, DT_I32, 1,
						shape, seed, NULL), 0);
		/* Gone: the same bytes find nothing, from either client. */
		assert_int_equal(dlshare_delete(a, "v/same"), 0);
		assert_int_equal(dlshare_get(a, "v/same", NULL, &bu),
				 DLSHARE_ENOENT);
		assert_int_equal(dlshare_get(b, "v/same", NULL, &bu),
				 DLSHARE_ENOENT);
	}
	assert_int_equal(dlshare_delete(a, "v/other"), 0);
	dlshare_disconnect(b);
	dlshare_disconnect(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(numbers_and_selectors, setup, teardown),
		cmocka_unit_test_setup_teardown(parked_gets, setup, teardown),
		cmocka_unit_test_setup_teardown(timeouts, setup, teardown),
		cmocka_unit_test_setup_teardown(delete_while_leased, setup, teardown),
		cmocka_unit_test_setup_teardown(same_get_finds_the_name_as_it_is,
						setup, teardown),
	};

	return cmocka_run_group_tests_name("versions", tests, NULL, NULL);
}
