/* test_board — the version board (protocol 1.7): a get of a name's newest
 * host version, whose last lease this connection released so lately that
 * the release is still queued, is answered by the library without a round
 * trip while the daemon's board says that version is still the newest.
 *
 * What the users rely on, each against a real daemon: warm gets send
 * nothing (the daemon counts no request), yet every answer is the one the
 * daemon would give — a version whose publish returned is seen by the next
 * get of every process that learnt of it; a delete, a withdrawn export or
 * a new mode are seen at once; a state dict of many tensors comes back
 * whole. The board's limit (--board-slots) is crossed and counted; 0 turns
 * it off; DLSHARE_NO_REUSE=1 makes a client ask every time; a forked child
 * never answers from its parent's state; a reader keeps up to eight names
 * warm at once; and the board a peer receives
 * cannot be written through by any means the peer has.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int setup_one_slot(void **state)
{
	static const char *const extra[] = { "--board-slots", "1", NULL };

	return util_setup_fdcheck(state, extra);
}

static int setup_no_board(void **state)
{
	static const char *const extra[] = { "--board-slots", "0", NULL };

	return util_setup_fdcheck(state, extra);
}

static int setup_most_slots(void **state)
{
	static const char *const extra[] = { "--board-slots", "4194303",
					      NULL };

	return util_setup_fdcheck(state, extra);
}

static int setup_three_leases(void **state)
{
	static const char *const extra[] = { "--max-leases", "3", NULL };

	return util_setup_fdcheck(state, extra);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* 256 KiB of int32: big enough that a stale or torn answer shows. */
static const int64_t shape[1] = { 65536 };

/* Requests the daemon served since it started, asked on c (the ask is
 * one more). */
static uint64_t requests(dlshare_client *c)
{
	return util_stats(c).requests;
}

/* n warm gets of name (each checked against seed, version want) and
 * releases on c. */
static void warm_gets(dlshare_client *c, const char *name, int n,
		      uint32_t seed, uint64_t want)
{
	for (int i = 0; i < n; i++) {
		uint64_t v = 0;

		assert_int_equal(util_get_check(c, name, NULL, DT_I32, 1, shape,
						seed, &v), 0);
		assert_int_equal(v, want);
	}
}

/* n warm gets of name on r, as warm_gets, after which the daemon (asked
 * on w) must have served between lo and hi requests, its own stats
 * request included. Callers allow half of n more (that still tells
 * reuse from none): whenever the test thread is descheduled for
 * CLIENT_IDLE_MS (20 ms; a loaded machine, ASan, a daemon under valgrind),
 * the receiver thread sends the kept lease's release by itself, and the
 * next get must ask (57 of 500 under ASan beside another suite). */
static void gets_asking(dlshare_client *w, dlshare_client *r,
			const char *name, int n, uint32_t seed, uint64_t want,
			uint64_t lo, uint64_t hi)
{
	uint64_t before = requests(w);

	warm_gets(r, name, n, seed, want);
	assert_in_range(requests(w) - before, lo, hi);
}

/* ---- reuse, and what it must never hide ------------------------------------ */

static void warm_gets_ask_nothing(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	uint64_t v;

	assert_int_equal(util_store(w, "b/w", DT_I32, 1, shape, 7, &v), 0);
	/* The first get asks, and the daemon posts the name's token. */
	warm_gets(r, "b/w", 1, 7, v);
	/* Only the stats request itself, plus the few gets that came after
	 * the receiver thread sent the queued release (CLIENT_IDLE_MS of
	 * quiet: a descheduled test thread). */
	gets_asking(w, r, "b/w", 2000, 7, v, 1, 1 + 2000 / 2);

	/* A newer version: the next get asks, and answers it. */
	assert_int_equal(util_store(w, "b/w", DT_I32, 1, shape, 8, &v), 0);
	warm_gets(r, "b/w", 1, 8, v);
	/* The lease the reader kept on the old version went: only the
	 * newest is alive, and no lease remains once r is idle. */
	dlshare_disconnect(r);
	util_assert_want(w, &(struct util_want){ -1, 1, 1, 0, -1, -1, -1 });
	dlshare_disconnect(w);
}

static void no_reuse_asks_every_time(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r;
	uint64_t v;

	assert_int_equal(setenv("DLSHARE_NO_REUSE", "1", 1), 0);
	r = harness_connect(&fx->d);
	assert_int_equal(unsetenv("DLSHARE_NO_REUSE"), 0);
	assert_int_equal(util_store(w, "b/n", DT_I32, 1, shape, 9, &v), 0);
	warm_gets(r, "b/n", 1, 9, v);
	gets_asking(w, r, "b/n", 200, 9, v, 201, 201 + 200 / 2);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

/* Readers in several processes, each checking that a version whose
 * publish had returned (the writer says so through shared memory, after
 * its publish returned) is never missed, and that every answer's bytes are
 * its version's. */
#define RACE_READERS 3
#define RACE_VERSIONS 300

struct race {
	_Atomic uint64_t published; /* the newest version whose publish returned */
	_Atomic int done;
	_Atomic uint64_t gets[RACE_READERS];
};

struct race_arg {
	struct race *race;
	int who;
};

static int race_reader(const struct daemon_proc *d, void *arg)
{
	struct race_arg *a = arg;
	struct race *rc = a->race;
	dlshare_client *c = util_child_connect(d);

	while (!atomic_load(&rc->done)) {
		uint64_t seen = atomic_load(&rc->published), v = 0;
		dlshare_bundle *b;
		int err = dlshare_get(c, "b/race", NULL, &b);

		CHILD_OK(err);
		v = dlshare_bundle_version(b);
		if (v < seen)
			CHILD_FAIL("got version %llu after %llu was published",
				   (unsigned long long)v,
				   (unsigned long long)seen);
		CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_I32, 1,
				       shape, (uint32_t)(1000 + v)) == 0);
		dlshare_bundle_free(b);
		atomic_fetch_add(&rc->gets[a->who], 1);
	}
	dlshare_disconnect(c);
	return 0;
}

static void publishes_are_seen_at_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	struct race *rc = mmap(NULL, sizeof(*rc), PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct race_arg args[RACE_READERS];
	pid_t pid[RACE_READERS];
	uint64_t v;

	assert_true(rc != MAP_FAILED);
	memset(rc, 0, sizeof(*rc));
	assert_int_equal(util_store(w, "b/race", DT_I32, 1, shape, 1001, &v), 0);
	atomic_store(&rc->published, v);
	for (int i = 0; i < RACE_READERS; i++) {
		args[i] = (struct race_arg){ rc, i };
		pid[i] = util_spawn(&fx->d, race_reader, &args[i]);
	}
	for (uint64_t k = 2; k <= RACE_VERSIONS; k++) {
		assert_int_equal(util_store(w, "b/race", DT_I32, 1, shape,
					    (uint32_t)(1000 + k), &v), 0);
		assert_int_equal(v, k);
		atomic_store(&rc->published, v);
		/* Now and then, let the readers run warm for a while. */
		if (k % 50 == 0)
			util_sleep_ms(5);
	}
	atomic_store(&rc->done, 1);
	for (int i = 0; i < RACE_READERS; i++) {
		assert_int_equal(util_wait(pid[i]), 0);
		assert_true(atomic_load(&rc->gets[i]) > 0);
	}
	munmap(rc, sizeof(*rc));
	util_assert_want(w, &(struct util_want){ -1, 1, 1, 0, -1, -1, -1 });
	dlshare_disconnect(w);
}

/* A reader that keeps its name warm: gets and releases in a loop, never
 * idle long enough for its queued release to leave on its own, so only the
 * board can tell it the name changed. Until the test sets `changed`, a
 * get must answer the version with the seed (or, once the change is under
 * way, fail with `then`); once it is set (after the change was answered to
 * whoever made it), every get must fail with `then`. */
struct looper {
	const char *name;
	uint32_t seed;
	int then;                 /* the dlshare code once changed */
	_Atomic int changed;
	_Atomic int done;
	_Atomic uint64_t warm;    /* gets before the change */
	_Atomic uint64_t after;   /* gets after it */
};

static int loop_reader(const struct daemon_proc *d, void *arg)
{
	struct looper *l = arg;
	dlshare_client *c = util_child_connect(d);

	while (!atomic_load(&l->done)) {
		int changed = atomic_load(&l->changed);
		dlshare_bundle *b = NULL;
		int err = dlshare_get(c, l->name, NULL, &b);

		if (changed) {
			if (err != l->then)
				CHILD_FAIL("get %s after the change: %s, "
					   "not %s", l->name,
					   dlshare_strerror(err),
					   dlshare_strerror(l->then));
			atomic_fetch_add(&l->after, 1);
			continue;
		}
		/* Between the change and the test saying so: either. */
		if (err == l->then)
			continue;
		CHILD_OK(err);
		CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_I32, 1,
				       shape, l->seed) == 0);
		dlshare_bundle_free(b);
		atomic_fetch_add(&l->warm, 1);
	}
	dlshare_disconnect(c);
	return 0;
}

static struct looper *looper_new(const char *name, uint32_t seed, int then)
{
	struct looper *l = mmap(NULL, sizeof(*l), PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(l != MAP_FAILED);
	memset(l, 0, sizeof(*l));
	l->name = name;
	l->seed = seed;
	l->then = then;
	return l;
}

/* Waits until the looper ran warm for a while. */
static void looper_warm(struct looper *l)
{
	int64_t end = util_now_ms() + harness_ms(20000);

	while (atomic_load(&l->warm) < 200 && util_now_ms() < end)
		util_sleep_ms(1);
	assert_true(atomic_load(&l->warm) >= 200);
}

/* Says the change was made, lets the looper see it a few hundred times,
 * and reaps it. */
static void looper_finish(struct looper *l, pid_t pid)
{
	int64_t end = util_now_ms() + harness_ms(20000);

	atomic_store(&l->changed, 1);
	while (atomic_load(&l->after) < 200 && util_now_ms() < end &&
	       !util_exited(pid, &(int){ 0 }))
		util_sleep_ms(1);
	atomic_store(&l->done, 1);
	assert_int_equal(util_wait(pid), 0);
	assert_true(atomic_load(&l->after) >= 200);
	munmap(l, sizeof(*l));
}

static void a_delete_is_seen_at_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);

	for (int round = 0; round < 5; round++) {
		uint32_t seed = 100 + (uint32_t)round;
		struct looper *l = looper_new("b/d", seed, DLSHARE_ENOENT);
		uint64_t v;
		pid_t p;

		assert_int_equal(util_store(w, "b/d", DT_I32, 1, shape, seed,
					    &v), 0);
		p = util_spawn(&fx->d, loop_reader, l);
		looper_warm(l);
		assert_int_equal(dlshare_delete(w, "b/d"), 0);
		looper_finish(l, p);
	}
	util_assert_want(w, &(struct util_want){ -1, 0, 0, 0, -1, -1, -1 });
	dlshare_disconnect(w);
}

static int exporter(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	uint64_t v;

	(void)arg;
	CHILD_OK(util_export(c, "b/x", DT_I32, 1, shape, 31, &v, NULL));
	CHILD_OK(util_post(c, "b/x.up", 1));
	CHILD_CHECK(util_await(c, "b/x.go", 0, harness_ms(20000), NULL) > 0);
	/* Exits without disconnecting: the export is withdrawn. */
	_exit(0);
}

static void a_withdrawn_export_is_seen_at_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	struct looper *l = looper_new("b/x", 31, DLSHARE_ENOENT);
	pid_t x = util_spawn(&fx->d, exporter, NULL), p;

	assert_true(util_await(w, "b/x.up", 0, harness_ms(20000), NULL) > 0);
	p = util_spawn(&fx->d, loop_reader, l);
	looper_warm(l);
	assert_int_equal(util_post(w, "b/x.go", 1), 0);
	assert_int_equal(util_wait(x), 0);
	/* The producer's connection closing withdraws the export: once the
	 * daemon has seen that (its connection count: w and the looper),
	 * no get may answer it. */
	util_assert_want(w, &(struct util_want){ 2, -1, -1, -1, -1, -1, -1 });
	looper_finish(l, p);
	dlshare_disconnect(w);
}

/* As uid A, who may read b/m until its owner makes it 0600. */
static void a_new_mode_is_seen_at_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w;
	struct looper *l;
	dlshare_tensor_spec spec = { .dtype = DT_I32, .ndim = 1,
				     .shape = shape };
	dlshare_create_opts o = { .device = { kDLCPU, 0 }, .mode = 0644 };
	dlshare_writer *wr;
	pid_t p;

	if (!util_can_switch_uids())
		test_skip("needs root to run peers of other uids");
	w = harness_connect(&fx->d);
	l = looper_new("b/m", 51, DLSHARE_EPERM);
	assert_int_equal(dlshare_create(w, "b/m", &spec, 1, &o, &wr), 0);
	harness_fill(dlshare_writer_tensor(wr, 0)->data,
		     util_nbytes(DT_I32, 1, shape), 51);
	assert_int_equal(dlshare_seal(wr, NULL, NULL), 0);
	p = util_spawn_as(&fx->d, UTIL_UID_A, UTIL_UID_A, loop_reader, l);
	looper_warm(l);
	/* The new mode holds from the create on, for the version before
	 * too: that is the one uid A reads warm. */
	o.mode = 0600;
	assert_int_equal(dlshare_create(w, "b/m", &spec, 1, &o, &wr), 0);
	looper_finish(l, p);
	dlshare_writer_abort(wr);
	dlshare_disconnect(w);
}

/* A state dict: many keyed tensors in one version, got warm, whole. */
#define DICT_N 10000 /* keys of ~60 bytes: a manifest memfd (1.4) */

static void a_state_dict_comes_back_whole(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	static const int64_t tshape[1] = { 256 };
	dlshare_tensor_spec *spec = calloc(DICT_N, sizeof(*spec));
	char (*keys)[64] = calloc(DICT_N, sizeof(*keys));
	dlshare_writer *wr;
	uint64_t v, before, after;

	assert_non_null(spec);
	assert_non_null(keys);
	for (int i = 0; i < DICT_N; i++) {
		snprintf(keys[i], sizeof(keys[i]),
			 "model.layers.%05d.self_attn.q_proj.weight.shard.of.%05d",
			 i, DICT_N);
		spec[i] = (dlshare_tensor_spec){ keys[i], DT_F32, 1, tshape };
	}
	for (int round = 0; round < 3; round++) {
		assert_int_equal(dlshare_create(w, "b/dict", spec, DICT_N, NULL,
						&wr), 0);
		for (int i = 0; i < DICT_N; i++)
			harness_fill(dlshare_writer_tensor(wr, (size_t)i)->data,
				     256 * sizeof(float),
				     (uint32_t)(round * DICT_N + i));
		assert_int_equal(dlshare_seal(wr, NULL, &v), 0);
		before = requests(w);
		for (int g = 0; g < 20; g++) {
			dlshare_bundle *b;

			assert_int_equal(dlshare_get(r, "b/dict", NULL, &b), 0);
			assert_int_equal(dlshare_bundle_version(b), v);
			assert_int_equal(dlshare_bundle_count(b), DICT_N);
			for (int i = 0; i < DICT_N; i += 997) {
				assert_string_equal(dlshare_bundle_key(b,
					(size_t)i), keys[i]);
				assert_int_equal(util_check(
					dlshare_bundle_tensor(b, (size_t)i),
					DT_F32, 1, tshape,
					(uint32_t)(round * DICT_N + i)), 0);
			}
			dlshare_bundle_free(b);
		}
		after = requests(w);
		/* The first get of each round asks; the others need not. */
		assert_in_range(after - before, 2, 2 + 20 / 2);
	}
	free(spec);
	free(keys);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

static int forked_getter(const struct daemon_proc *d, void *arg)
{
	dlshare_client *inherited = arg;
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;
	uint64_t v = 0;

	/* The parent's client is not this process's to use. */
	CHILD_CHECK(dlshare_get(inherited, "b/f", NULL, &b) == DLSHARE_EFORK);
	CHILD_OK(util_get_check(c, "b/f", NULL, DT_I32, 1, shape, 42, &v));
	CHILD_CHECK(v == 2);
	dlshare_disconnect(c);
	dlshare_disconnect(inherited);
	return 0;
}

static void a_fork_answers_nothing_from_its_parent(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	uint64_t v;

	assert_int_equal(util_store(w, "b/f", DT_I32, 1, shape, 41, &v), 0);
	warm_gets(r, "b/f", 3, 41, v);
	assert_int_equal(util_store(w, "b/f", DT_I32, 1, shape, 42, &v), 0);
	/* r is warm on version 1, its release queued, at the fork. */
	assert_int_equal(util_wait(util_spawn(&fx->d, forked_getter, r)), 0);
	/* The parent is still served, and sees version 2. */
	warm_gets(r, "b/f", 3, 42, v);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

/* A reader of several names per turn (a server's encoder and decoder, a
 * flag) keeps each warm, up to CLIENT_WARM_MAX (8) names; one more, read
 * in turn, is always the oldest kept and always asks. */
static void several_names_warm_at_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	static const int64_t small[1] = { 256 };
	char names[9][16];
	uint64_t before, v;
	int turns = 200;

	for (int k = 0; k < 9; k++) {
		snprintf(names[k], sizeof(names[k]), "b/s%d", k);
		assert_int_equal(util_store(w, names[k], DT_I32, 1, small,
					    (uint32_t)(60 + k), &v), 0);
	}
	/* Eight names in turn: after the first turn, none asks. */
	before = requests(w);
	for (int t = 0; t < turns; t++)
		for (int k = 0; k < 8; k++)
			assert_int_equal(util_get_check(r, names[k], NULL, DT_I32,
					 1, small, (uint32_t)(60 + k), &v), 0);
	assert_in_range(requests(w) - before, 1 + 8, 1 + 8 + 8 * turns / 2);
	/* A new version of one of them: its next get answers it, the
	 * others still ask nothing. */
	assert_int_equal(util_store(w, names[3], DT_I32, 1, small, 99, &v), 0);
	before = requests(w);
	for (int t = 0; t < turns; t++)
		for (int k = 0; k < 8; k++) {
			uint64_t got;

			assert_int_equal(util_get_check(r, names[k], NULL,
					 DT_I32, 1, small,
					 k == 3 ? 99 : (uint32_t)(60 + k), &got),
					 0);
			assert_int_equal(got, k == 3 ? 2 : 1);
		}
	assert_in_range(requests(w) - before, 1 + 1, 1 + 1 + 8 * turns / 2);
	/* Nine names in turn: every get asks (but the first turn's eight
	 * kept from before). */
	before = requests(w);
	for (int t = 0; t < turns; t++)
		for (int k = 0; k < 9; k++)
			assert_int_equal(util_get_check(r, names[k], NULL, DT_I32,
					 1, small, k == 3 ? 99 :
					 (uint32_t)(60 + k), &v), 0);
	assert_in_range(requests(w) - before, 1 + 9 * turns - 8,
			1 + 9 * turns + 9 * turns / 2);
	dlshare_disconnect(r);
	/* What the reader kept went with it: only the newest versions. */
	util_assert_want(w, &(struct util_want){ -1, 9, 9, 0, -1, -1, -1 });
	dlshare_disconnect(w);
}

/* A reader that keeps calling (never quiet) must not keep a superseded
 * version alive by the lease it kept: the version goes once a newer one
 * is published, while the reader stays busy. */
static void a_busy_reader_lets_old_versions_go(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	dlshare_name_info info;
	int64_t end;
	uint64_t v;

	assert_int_equal(util_store(w, "b/busy", DT_I32, 1, shape, 71, &v), 0);
	assert_int_equal(util_store(w, "b/other", DT_I32, 1, shape, 72, &v), 0);
	warm_gets(r, "b/busy", 3, 71, 1);
	assert_int_equal(util_store(w, "b/busy", DT_I32, 1, shape, 73, &v), 0);
	end = util_now_ms() + harness_ms(5000);
	do {
		/* Calls of the reader, a few microseconds apart. */
		for (int i = 0; i < 100; i++)
			assert_int_equal(dlshare_stat(r, "b/other", &info,
						      NULL), 0);
		assert_int_equal(dlshare_stat(w, "b/busy", &info, NULL), 0);
	} while (info.versions != 1 && util_now_ms() < end);
	assert_int_equal(info.versions, 1);
	assert_int_equal(info.leases, 0);
	warm_gets(r, "b/busy", 3, 73, 2);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

/* Kept leases count toward the reader's quotas as any lease: at a limit,
 * the get lets them go and asks again, so a reader that freed what it got
 * is never refused for what the library kept. */
static void kept_leases_yield_to_quotas(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	struct util_hits h;
	dlshare_bundle *b[4];
	char names[4][16];
	uint64_t v;

	for (int k = 0; k < 4; k++) {
		snprintf(names[k], sizeof(names[k]), "b/q%d", k);
		assert_int_equal(util_store(w, names[k], DT_I32, 1, shape,
					    (uint32_t)(80 + k), &v), 0);
	}
	for (int t = 0; t < 50; t++)
		for (int k = 0; k < 4; k++)
			assert_int_equal(util_get_check(r, names[k], NULL, DT_I32,
					 1, shape, (uint32_t)(80 + k), &v), 0);
	/* The limit still holds for what the reader really holds. */
	for (int k = 0; k < 3; k++)
		assert_int_equal(dlshare_get(r, names[k], NULL, &b[k]), 0);
	assert_int_equal(dlshare_get(r, names[3], NULL, &b[3]), DLSHARE_ELIMIT);
	for (int k = 0; k < 3; k++)
		dlshare_bundle_free(b[k]);
	util_limit_hits(w, &h);
	assert_true(util_hits_of(&h, "max-leases") >= 1);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

/* The largest board (BOARD_SLOTS_MAX, 32 MiB of words) serves as any. */
static void the_largest_board_serves(void **state)
{
	warm_gets_ask_nothing(state);
}

/* ---- the limit, and no board --------------------------------------------- */

static void one_slot_serves_one_name(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *ra = harness_connect(&fx->d);
	dlshare_client *rb = harness_connect(&fx->d);
	struct util_hits h0, h1;
	uint64_t va, vb;

	assert_int_equal(util_store(w, "b/a", DT_I32, 1, shape, 1, &va), 0);
	assert_int_equal(util_store(w, "b/b", DT_I32, 1, shape, 2, &vb), 0);
	util_limit_hits(w, &h0);
	assert_int_equal(util_hits_of(&h0, "board-slots"), 0);
	/* b/a takes the only slot. */
	warm_gets(ra, "b/a", 1, 1, va);
	gets_asking(w, ra, "b/a", 500, 1, va, 1, 1 + 500 / 2);
	/* b/b finds none: each of its gets asks, and is answered right. */
	gets_asking(w, rb, "b/b", 100, 2, vb, 101, 101 + 100 / 2);
	util_limit_hits(w, &h1);
	assert_int_equal(util_hits_of(&h1, "board-slots"), 100);
	/* b/a deleted, its slot goes back: b/b's next get takes it. */
	assert_int_equal(dlshare_delete(w, "b/a"), 0);
	{
		dlshare_bundle *b;

		assert_int_equal(dlshare_get(ra, "b/a", NULL, &b),
				 DLSHARE_ENOENT);
	}
	/* Leases of b/a are released on ra's next call (that get): the
	 * entry and its slot go with its last version. */
	util_assert_want(w, &(struct util_want){ -1, 1, 1, -1, -1, -1, -1 });
	warm_gets(rb, "b/b", 1, 2, vb);
	gets_asking(w, rb, "b/b", 500, 2, vb, 1, 1 + 500 / 2);
	util_limit_hits(w, &h1);
	assert_int_equal(util_hits_of(&h1, "board-slots"), 100);
	dlshare_disconnect(rb);
	dlshare_disconnect(ra);
	dlshare_disconnect(w);
}

static void no_board_asks_every_time(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *w = harness_connect(&fx->d);
	dlshare_client *r = harness_connect(&fx->d);
	struct util_hits h;
	uint64_t v;

	assert_int_equal(util_store(w, "b/0", DT_I32, 1, shape, 5, &v), 0);
	warm_gets(r, "b/0", 1, 5, v);
	gets_asking(w, r, "b/0", 200, 5, v, 201, 201 + 200 / 2);
	/* No board is no limit crossed. */
	util_limit_hits(w, &h);
	assert_int_equal(util_hits_of(&h, "board-slots"), 0);
	dlshare_disconnect(r);
	dlshare_disconnect(w);
}

/* ---- the board a peer gets cannot be written --------------------------------- */

static void the_board_is_read_only(void **state)
{
	struct fixture *fx = *state;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello hello = DLSHARE__HELLO__INIT;
	dlshare_client *w = harness_connect(&fx->d);
	struct wire_msg *m = NULL;
	const Dlshare__HelloReply *hr;
	int fd = raw_connect(fx->d.sock);
	int board = -1, rw;
	char path[64];
	uint64_t word = 1, v;
	void *p;

	assert_true(fd >= 0);
	hello.major = WIRE_PROTO_MAJOR;
	hello.minor = 7;
	hello.agent = "test_board";
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &hello;
	f.id = 1;
	assert_int_equal(raw_send(fd, &f, NULL, 0, 0), 0);
	assert_int_equal(raw_recv_fd(fd, harness_ms(5000), &m, &board), 0);
	assert_int_equal(m->frame->body_case,
			 DLSHARE__FRAME__BODY_HELLO_REPLY);
	hr = m->frame->hello_reply;
	assert_true(hr->has_board_slots);
	assert_int_equal(hr->board_slots, 65536);
	assert_true(board >= 0);
	wire_msg_free(m);

	/* Readable, all zero before any get. */
	p = mmap(NULL, 65536 * 8, PROT_READ, MAP_SHARED, board, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(((uint64_t *)p)[0], 0);
	/* Not writable through this fd... */
	assert_int_equal(write(board, &word, sizeof(word)), -1);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED,
			 board, 0) == MAP_FAILED);
	assert_true(mprotect(p, 4096, PROT_READ | PROT_WRITE) != 0);
	assert_int_equal(ftruncate(board, 0), -1);
	/* ...nor through a reopen of it for writing: the memfd's seals hold
	 * for every open file. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", board);
	rw = open(path, O_RDWR);
	assert_true(rw >= 0); /* a memfd's mode lets its holder reopen it */
	assert_int_equal(pwrite(rw, &word, sizeof(word), 0), -1);
	assert_int_equal(errno, EPERM);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw,
			 0) == MAP_FAILED);
	assert_int_equal(errno, EPERM);
	assert_int_equal(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE), -1);
	close(rw);
	/* A get posts a token the raw peer sees (and cannot undo). */
	assert_int_equal(util_store(w, "b/ro", DT_I32, 1, shape, 3, &v), 0);
	warm_gets(w, "b/ro", 1, 3, v);
	assert_int_not_equal(((uint64_t *)p)[0], 0);
	munmap(p, 65536 * 8);
	close(board);
	close(fd);
	dlshare_disconnect(w);
}

static int setup_open(void **state)
{
	return util_setup_open(state, NULL);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest acl_tests[] = {
		cmocka_unit_test_setup_teardown(a_new_mode_is_seen_at_once,
						setup_open, teardown),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(warm_gets_ask_nothing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(no_reuse_asks_every_time, setup,
						teardown),
		cmocka_unit_test_setup_teardown(publishes_are_seen_at_once,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_delete_is_seen_at_once, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			a_withdrawn_export_is_seen_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(a_state_dict_comes_back_whole,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_fork_answers_nothing_from_its_parent, setup, teardown),
		cmocka_unit_test_setup_teardown(several_names_warm_at_once,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_busy_reader_lets_old_versions_go, setup, teardown),
		cmocka_unit_test_setup_teardown(kept_leases_yield_to_quotas,
						setup_three_leases, teardown),
		cmocka_unit_test_setup_teardown(one_slot_serves_one_name,
						setup_one_slot, teardown),
		cmocka_unit_test_setup_teardown(the_largest_board_serves,
						setup_most_slots, teardown),
		cmocka_unit_test_setup_teardown(no_board_asks_every_time,
						setup_no_board, teardown),
		cmocka_unit_test_setup_teardown(the_board_is_read_only, setup,
						teardown),
	};

	if (argc > 1 && strcmp(argv[1], "acl") == 0)
		return test_run_group("board_acl", acl_tests, NULL, NULL);
	return test_run_group("board", tests, NULL, NULL);
}
