/* test_queue — queue names (protocol 1.4): versions taken oldest first,
 * each by exactly one taker (threads and forked processes at once), the
 * depth as backpressure (a producer waits for room, or fails with the
 * queue's depth and its wait named), a taker that dies before releasing
 * (its version goes back to the head), several producers each keeping
 * their order, delete of a queue, the mode kept for the name's life, and
 * the daemon's limits on depth, and producers that wait while their
 * large versions are made on the daemon's thread pool. Every item is
 * checked bit for bit. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#define ITEM_LEN 256
static const int64_t item_shape[1] = { ITEM_LEN };

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int setup_limits(void **state)
{
	static const char *const extra[] = { "--max-queue-depth=4",
					     "--queue-depth=3", NULL };

	return util_setup_fdcheck(state, extra);
}

static int setup_inflight(void **state)
{
	static const char *const extra[] = { "--max-inflight=2", NULL };

	return util_setup_fdcheck(state, extra);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* Writes item idx (element k = idx * 1000 + k) into a queue name of the
 * given depth, waiting up to wait_ms for room. Returns 0 or a dlshare
 * code. */
static int qput(dlshare_client *c, const char *name, uint32_t depth,
		int32_t wait_ms, int32_t idx)
{
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = item_shape };
	dlshare_queue_opts q = { .depth = depth, .wait_ms = wait_ms };
	dlshare_writer *w;
	DLTensor *t;
	int err;

	if ((err = dlshare_create_queued(c, name, &s, 1, NULL, &q, &w)))
		return err;
	t = dlshare_writer_tensor(w, 0);
	for (int k = 0; k < ITEM_LEN; k++)
		((int32_t *)t->data)[k] = idx * 1000 + k;
	return dlshare_seal(w, NULL, NULL);
}

/* The item a bundle holds, or -1 when a byte is not what qput wrote. */
static int32_t qitem(const dlshare_bundle *b)
{
	const DLTensor *t = dlshare_bundle_tensor(b, 0);
	const int32_t *p;

	if (!t || t->ndim != 1 || t->shape[0] != ITEM_LEN ||
	    t->dtype.code != kDLInt || t->dtype.bits != 32)
		return -1;
	p = (const int32_t *)((const char *)t->data + t->byte_offset);
	for (int k = 0; k < ITEM_LEN; k++)
		if (p[k] != p[0] + k)
			return -1;
	return p[0] / 1000;
}

/* take + check + release: the item, or a negative dlshare code (-1000
 * when its bytes are wrong). */
static int32_t qtake(dlshare_client *c, const char *name, int32_t timeout)
{
	dlshare_bundle *b;
	int32_t idx;
	int err = dlshare_take(c, name, timeout, NULL, &b);

	if (err)
		return err;
	idx = qitem(b);
	dlshare_bundle_free(b);
	return idx < 0 ? -1000 : idx;
}

static struct util_want empty_want(int64_t connections)
{
	struct util_want w = UTIL_ANY;

	w.connections = connections;
	w.versions = 0;
	w.leases = 0;
	w.buffers = 0;
	w.parked = 0;
	return w;
}

/* ---- order and modes ------------------------------------------------------ */

static void fifo_and_modes(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = item_shape };
	dlshare_queue_opts other = { .depth = 5 };
	dlshare_name_info info;
	dlshare_queue_info qi;
	dlshare_writer *w;
	dlshare_bundle *b;

	for (int i = 1; i <= 6; i++)
		assert_int_equal(qput(c, "q/fifo", 8, 0, i), 0);
	assert_int_equal(dlshare_queue_stat(c, "q/fifo", &qi), 0);
	assert_int_equal(qi.depth, 8);
	assert_int_equal(qi.queued, 6);
	assert_int_equal(qi.taken, 0);
	assert_int_equal(qi.pending, 0);
	/* stat describes the oldest queued version. */
	assert_int_equal(dlshare_stat(c, "q/fifo", &info, NULL), 0);
	assert_int_equal(info.latest, 1);
	/* The mode is the name's for life: the other kind, or another
	 * depth, is refused with what is wrong said. */
	assert_int_equal(dlshare_create(c, "q/fifo", &s, 1, NULL, &w),
			 DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "is a queue"));
	assert_int_equal(dlshare_create_queued(c, "q/fifo", &s, 1, NULL,
					       &other, &w), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "another depth"));
	assert_int_equal(util_store(c, "q/plain", DT_I32, 1, item_shape, 1,
				    NULL), 0);
	assert_int_equal(dlshare_create_queued(c, "q/plain", &s, 1, NULL, NULL,
					       &w), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "not a queue"));
	assert_int_equal(dlshare_take(c, "q/plain", 0, NULL, &b),
			 DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "not a queue"));
	/* get reads ordinary names only. */
	assert_int_equal(dlshare_get(c, "q/fifo", NULL, &b), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "take"));

	/* Oldest first, each once, bit for bit. */
	for (int i = 1; i <= 6; i++)
		assert_int_equal(qtake(c, "q/fifo", 0), i);
	assert_int_equal(dlshare_take(c, "q/fifo", 0, NULL, &b),
			 DLSHARE_ENOENT);
	assert_non_null(strstr(dlshare_last_error(), "nothing queued"));
	assert_int_equal(dlshare_take(c, "q/fifo", 50, NULL, &b),
			 DLSHARE_ETIMEDOUT);
	assert_non_null(strstr(dlshare_last_error(), "q/fifo"));
	/* The empty queue name lives on, with its mode. */
	assert_int_equal(dlshare_queue_stat(c, "q/fifo", &qi), 0);
	assert_int_equal(qi.depth, 8);
	assert_int_equal(qi.queued + qi.taken + qi.pending, 0);
	assert_int_equal(dlshare_create(c, "q/fifo", &s, 1, NULL, &w),
			 DLSHARE_EINVAL);
	/* Depth 0 asks for any depth of an existing queue name. */
	assert_int_equal(qput(c, "q/fifo", 0, 0, 7), 0);
	assert_int_equal(qtake(c, "q/fifo", 0), 7);

	assert_int_equal(dlshare_delete(c, "q/fifo"), 0);
	assert_int_equal(dlshare_delete(c, "q/plain"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- exactly once, with many takers ------------------------------------------ */

#define EO_ITEMS 60
#define EO_PROCS 3
#define EO_THREADS 3

struct eo_ctx {
	const struct daemon_proc *d;
	int pipe_w;
};

/* Takes until a sentinel (item 0), writing each item taken to the pipe. */
static int eo_taker_loop(dlshare_client *c, int pipe_w)
{
	for (;;) {
		int32_t idx = qtake(c, "q/eo", harness_ms(20000));

		if (idx < 0) {
			fprintf(stderr, "taker %d: take: %d (%s)\n",
				(int)getpid(), (int)idx,
				dlshare_last_error());
			return 1;
		}
		if (idx == 0)
			return 0;
		if (write(pipe_w, &idx, sizeof(idx)) != sizeof(idx))
			return 1;
	}
}

static int eo_taker(const struct daemon_proc *d, void *arg)
{
	struct eo_ctx *x = arg;
	dlshare_client *c = util_child_connect(d);
	int rc = eo_taker_loop(c, x->pipe_w);

	dlshare_disconnect(c);
	return rc;
}

static void *eo_thread(void *arg)
{
	struct eo_ctx *x = arg;
	dlshare_client *c = harness_connect(x->d);
	intptr_t rc = c ? eo_taker_loop(c, x->pipe_w) : 1;

	dlshare_disconnect(c);
	return (void *)rc;
}

static int eo_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	(void)arg;
	for (int i = 1; i <= EO_ITEMS; i++)
		CHILD_OK(qput(c, "q/eo", 4, DLSHARE_WAIT_FOREVER, i));
	for (int i = 0; i < EO_PROCS + EO_THREADS; i++)
		CHILD_OK(qput(c, "q/eo", 4, DLSHARE_WAIT_FOREVER, 0));
	dlshare_disconnect(c);
	return 0;
}

static void exactly_once(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int seen[EO_ITEMS + 1] = { 0 };
	pthread_t th[EO_THREADS];
	pid_t takers[EO_PROCS], prod;
	int fds[2];
	struct eo_ctx x;

	assert_int_equal(pipe(fds), 0);
	x.d = &fx->d;
	x.pipe_w = fds[1];
	/* Takers first: they wait for a name that does not exist yet. Every
	 * fork comes before the threads: a child forked while a thread of
	 * ours is inside the library is another test's matter (issue 19,
	 * "Forks and writers"). */
	for (int i = 0; i < EO_PROCS; i++)
		takers[i] = util_spawn(&fx->d, eo_taker, &x);
	prod = util_spawn(&fx->d, eo_producer, NULL);
	for (int i = 0; i < EO_THREADS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, eo_thread, &x), 0);
	assert_int_equal(util_wait(prod), 0);
	for (int i = 0; i < EO_PROCS; i++)
		assert_int_equal(util_wait(takers[i]), 0);
	for (int i = 0; i < EO_THREADS; i++) {
		void *rc;

		assert_int_equal(pthread_join(th[i], &rc), 0);
		assert_null(rc);
	}
	close(fds[1]);
	for (int n = 0; n < EO_ITEMS; n++) {
		int32_t idx;

		assert_int_equal(read(fds[0], &idx, sizeof(idx)), sizeof(idx));
		assert_true(idx >= 1 && idx <= EO_ITEMS);
		seen[idx]++;
	}
	int32_t extra;
	assert_int_equal(read(fds[0], &extra, sizeof(extra)), 0);
	close(fds[0]);
	for (int i = 1; i <= EO_ITEMS; i++)
		assert_int_equal(seen[i], 1);

	assert_int_equal(dlshare_delete(c, "q/eo"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- backpressure ----------------------------------------------------------- */

static int bp_waiter(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	(void)arg;
	/* Parked in the daemon until the parent takes one. */
	CHILD_OK(qput(c, "q/bp", 2, DLSHARE_WAIT_FOREVER, 3));
	dlshare_disconnect(c);
	return 0;
}

static void backpressure(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = item_shape };
	dlshare_queue_opts q = { .depth = 2 };
	dlshare_queue_info qi;
	dlshare_writer *w, *w2;
	dlshare_bundle *b;
	dlshare_stats st0, st1;
	pid_t p;

	/* A pending version counts: one pending and one sealed fill it. */
	assert_int_equal(qput(c, "q/bp", 2, 0, 1), 0);
	assert_int_equal(dlshare_create_queued(c, "q/bp", &s, 1, NULL, &q, &w),
			 0);
	assert_int_equal(dlshare_queue_stat(c, "q/bp", &qi), 0);
	assert_int_equal(qi.queued, 1);
	assert_int_equal(qi.pending, 1);
	st0 = util_stats(c);
	/* No wait asked: refused at once, naming the queue and its depth. */
	assert_int_equal(dlshare_create_queued(c, "q/bp", &s, 1, NULL, &q,
					       &w2), DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "q/bp"));
	assert_non_null(strstr(dlshare_last_error(), "depth 2"));
	/* A wait that runs out: the queue, its depth and the wait named. */
	q.wait_ms = 30;
	assert_int_equal(dlshare_create_queued(c, "q/bp", &s, 1, NULL, &q,
					       &w2), DLSHARE_ETIMEDOUT);
	assert_non_null(strstr(dlshare_last_error(), "q/bp"));
	assert_non_null(strstr(dlshare_last_error(), "depth 2"));
	assert_non_null(strstr(dlshare_last_error(), "30 ms"));
	/* A copying publish (of ordinary memory) waits the same way, and
	 * says the same. */
	{
		static int32_t data[ITEM_LEN];
		DLManagedTensor plain = {
			.dl_tensor = { .data = data, .device = { kDLCPU, 0 },
				       .ndim = 1, .dtype = DT_I32,
				       .shape = (int64_t *)item_shape },
			.deleter = NULL,
		};
		DLManagedTensor *src = &plain;

		assert_int_equal(dlshare_publish_queued(c, "q/bp", &src, 1,
							NULL, &q, NULL),
				 DLSHARE_ETIMEDOUT);
		assert_non_null(strstr(dlshare_last_error(), "q/bp"));
		assert_non_null(strstr(dlshare_last_error(), "depth 2"));
		assert_non_null(strstr(dlshare_last_error(), "30 ms"));
		q.wait_ms = 0;
		assert_int_equal(dlshare_publish_queued(c, "q/bp", &src, 1,
							NULL, &q, NULL),
				 DLSHARE_ELIMIT);
		assert_non_null(strstr(dlshare_last_error(), "depth 2"));
		q.wait_ms = 30;
	}
	/* Refusals cost no memory. */
	st1 = util_stats(c);
	assert_int_equal(st1.buffers, st0.buffers);
	assert_int_equal(st1.bytes, st0.bytes);
	/* A taken, unreleased version still counts. */
	for (int k = 0; k < ITEM_LEN; k++)
		((int32_t *)dlshare_writer_tensor(w, 0)->data)[k] = 2000 + k;
	assert_int_equal(dlshare_seal(w, NULL, NULL), 0);
	assert_int_equal(dlshare_take(c, "q/bp", 0, NULL, &b), 0);
	assert_int_equal(qitem(b), 1);
	assert_int_equal(dlshare_create_queued(c, "q/bp", &s, 1, NULL, &q,
					       &w2), DLSHARE_ETIMEDOUT);
	/* A producer waiting forever, parked in the daemon. */
	p = util_spawn(&fx->d, bp_waiter, NULL);
	for (int i = 0; i < harness_ms(20000) / 10; i++) {
		assert_int_equal(dlshare_queue_stat(c, "q/bp", &qi), 0);
		if (qi.waiting == 1)
			break;
		util_sleep_ms(10);
	}
	assert_int_equal(qi.waiting, 1);
	assert_int_equal(qi.taken, 1);
	assert_int_equal(qi.queued, 1);
	/* Releasing the take makes room: the waiter goes on. */
	dlshare_bundle_free(b);
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(qtake(c, "q/bp", 0), 2); /* the one sealed above */
	assert_int_equal(qtake(c, "q/bp", harness_ms(20000)), 3);

	assert_int_equal(dlshare_delete(c, "q/bp"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- a taker that dies --------------------------------------------------------- */

static int dying_taker(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_OK(dlshare_take(c, "q/death", 0, NULL, &b));
	CHILD_CHECK(qitem(b) == (int32_t)(intptr_t)arg);
	CHILD_OK(util_post(c, "q/death.held", 1));
	/* Killed here, never releasing. */
	pause();
	return 1;
}

struct parked_take {
	const struct daemon_proc *d;
	int32_t got;
};

static void *parked_take_run(void *arg)
{
	struct parked_take *pt = arg;
	dlshare_client *c = harness_connect(pt->d);

	pt->got = c ? qtake(c, "q/death", harness_ms(20000)) : -1;
	dlshare_disconnect(c);
	return NULL;
}

static void taker_death(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_queue_info qi;
	pid_t p;

	for (int i = 1; i <= 3; i++)
		assert_int_equal(qput(c, "q/death", 4, 0, i), 0);
	p = util_spawn(&fx->d, dying_taker, (void *)(intptr_t)1);
	assert_true(util_await(c, "q/death.held", 0, harness_ms(20000), NULL) > 0);
	assert_int_equal(dlshare_queue_stat(c, "q/death", &qi), 0);
	assert_int_equal(qi.taken, 1);
	assert_int_equal(qi.queued, 2);
	util_kill(p);
	/* Once the daemon saw the connection go, item 1 is back at the
	 * head, before 2 and 3. */
	struct util_want one = UTIL_ANY;
	one.connections = 1;
	util_assert_want(c, &one);
	assert_int_equal(qtake(c, "q/death", harness_ms(20000)), 1);
	assert_int_equal(qtake(c, "q/death", 0), 2);
	assert_int_equal(qtake(c, "q/death", 0), 3);
	/* Exactly once: redelivered to one taker, and nothing else left. */
	assert_int_equal(qtake(c, "q/death", 0), DLSHARE_ENOENT);
	assert_int_equal(dlshare_queue_stat(c, "q/death", &qi), 0);
	assert_int_equal(qi.queued + qi.taken + qi.pending, 0);

	/* A taker parked meanwhile gets the redelivered version. */
	assert_int_equal(qput(c, "q/death", 4, 0, 4), 0);
	p = util_spawn(&fx->d, dying_taker, (void *)(intptr_t)4);
	assert_true(util_await(c, "q/death.held", 1, harness_ms(20000), NULL) > 1);
	struct parked_take pt = { .d = &fx->d };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, parked_take_run, &pt), 0);
	struct util_want parked = UTIL_ANY;
	parked.parked = 1;
	util_assert_want(c, &parked);
	util_kill(p);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(pt.got, 4);
	/* The parked taker released it: consumed, not delivered again. */
	assert_int_equal(qtake(c, "q/death", 0), DLSHARE_ENOENT);
	assert_int_equal(dlshare_queue_stat(c, "q/death", &qi), 0);
	assert_int_equal(qi.queued + qi.taken + qi.pending, 0);

	assert_int_equal(dlshare_delete(c, "q/death"), 0);
	assert_int_equal(dlshare_delete(c, "q/death.held"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- several producers -------------------------------------------------------- */

#define MP_PRODUCERS 3
#define MP_ITEMS 20

static int mp_producer(const struct daemon_proc *d, void *arg)
{
	int who = (int)(intptr_t)arg;
	dlshare_client *c = util_child_connect(d);

	for (int i = 0; i < MP_ITEMS; i++)
		CHILD_OK(qput(c, "q/mp", 3, DLSHARE_WAIT_FOREVER,
			      who * 100 + i));
	dlshare_disconnect(c);
	return 0;
}

static void producers_keep_order(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int next[MP_PRODUCERS + 1] = { 0 };
	pid_t p[MP_PRODUCERS];

	for (int i = 0; i < MP_PRODUCERS; i++)
		p[i] = util_spawn(&fx->d, mp_producer, (void *)(intptr_t)(i + 1));
	for (int n = 0; n < MP_PRODUCERS * MP_ITEMS; n++) {
		int32_t idx = qtake(c, "q/mp", harness_ms(20000));
		int who = idx / 100;

		assert_true(idx >= 100);
		assert_true(who >= 1 && who <= MP_PRODUCERS);
		/* Each producer's items come in its order, none missing. */
		assert_int_equal(idx % 100, next[who]);
		next[who]++;
	}
	for (int i = 0; i < MP_PRODUCERS; i++)
		assert_int_equal(util_wait(p[i]), 0);
	for (int i = 1; i <= MP_PRODUCERS; i++)
		assert_int_equal(next[i], MP_ITEMS);

	assert_int_equal(dlshare_delete(c, "q/mp"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- delete ---------------------------------------------------------------- */

static void queue_delete(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *c2 = harness_connect(&fx->d);
	dlshare_queue_info qi;
	dlshare_bundle *b, *b2;

	for (int i = 1; i <= 3; i++)
		assert_int_equal(qput(c, "q/del", 4, 0, i), 0);
	assert_int_equal(dlshare_take(c, "q/del", 0, NULL, &b), 0);
	assert_int_equal(dlshare_take(c2, "q/del", 0, NULL, &b2), 0);
	/* A version being written when the queue is deleted is withdrawn:
	 * its seal finds nothing, and nothing is queued. */
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = item_shape };
	dlshare_queue_opts q = { .depth = 4 };
	dlshare_writer *w;
	assert_int_equal(dlshare_create_queued(c2, "q/del", &s, 1, NULL, &q,
					       &w), 0);
	assert_int_equal(dlshare_delete(c, "q/del"), 0);
	assert_int_equal(dlshare_seal(w, NULL, NULL), DLSHARE_ENOENT);
	dlshare_bundle *none;
	assert_int_equal(dlshare_take(c, "q/del", 0, NULL, &none),
			 DLSHARE_ENOENT);
	assert_int_equal(dlshare_queue_stat(c, "q/del", &qi), DLSHARE_ENOENT);
	/* What was taken stays readable until released. */
	assert_int_equal(qitem(b), 1);
	assert_int_equal(qitem(b2), 2);
	/* The name is new again, of any mode. */
	assert_int_equal(util_store(c, "q/del", DT_I32, 1, item_shape, 1,
				    NULL), 0);
	dlshare_bundle_free(b);
	/* A taker whose queue was deleted goes: nothing comes back. */
	dlshare_disconnect(c2);
	dlshare_bundle_free(b2);
	assert_int_equal(dlshare_delete(c, "q/del"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* A producer waiting for room when its queue is deleted: its Create runs
 * again and finds the name gone, so it makes a new queue of its depth,
 * and its version is the new queue's first. */
static int dw_waiter(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	(void)arg;
	CHILD_OK(qput(c, "q/dw", 1, DLSHARE_WAIT_FOREVER, 2));
	dlshare_disconnect(c);
	return 0;
}

static void delete_while_producer_waits(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_queue_info qi = { 0 };
	dlshare_bundle *b;
	pid_t p;

	assert_int_equal(qput(c, "q/dw", 1, 0, 1), 0);
	p = util_spawn(&fx->d, dw_waiter, NULL);
	for (int i = 0; i < harness_ms(20000) / 10; i++) {
		assert_int_equal(dlshare_queue_stat(c, "q/dw", &qi), 0);
		if (qi.waiting == 1)
			break;
		util_sleep_ms(10);
	}
	assert_int_equal(qi.waiting, 1);
	assert_int_equal(dlshare_delete(c, "q/dw"), 0);
	assert_int_equal(util_wait(p), 0);
	/* Item 1 died with the old name; item 2 is the new queue's. */
	assert_int_equal(dlshare_queue_stat(c, "q/dw", &qi), 0);
	assert_int_equal(qi.depth, 1);
	assert_int_equal(qi.queued, 1);
	assert_int_equal(qtake(c, "q/dw", 0), 2);
	assert_int_equal(dlshare_take(c, "q/dw", 0, NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(dlshare_delete(c, "q/dw"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- limits -------------------------------------------------------------------- */

static void limits(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = item_shape };
	dlshare_queue_opts q = { .depth = 5 };
	dlshare_queue_info qi;
	dlshare_writer *w;

	/* Past --max-queue-depth: refused, the limit named. */
	assert_int_equal(dlshare_create_queued(c, "q/lim", &s, 1, NULL, &q, &w),
			 DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "max-queue-depth"));
	assert_int_equal(qput(c, "q/lim", 4, 0, 1), 0);
	assert_int_equal(dlshare_queue_stat(c, "q/lim", &qi), 0);
	assert_int_equal(qi.depth, 4);
	/* --queue-depth is the default. */
	assert_int_equal(qput(c, "q/dflt", 0, 0, 1), 0);
	assert_int_equal(dlshare_queue_stat(c, "q/dflt", &qi), 0);
	assert_int_equal(qi.depth, 3);
	for (int i = 2; i <= 3; i++)
		assert_int_equal(qput(c, "q/dflt", 0, 0, i), 0);
	assert_int_equal(qput(c, "q/dflt", 0, 0, 4), DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "depth 3"));
	/* Waiting producers count as requests in flight of their connection
	 * (--max-inflight): bounded like parked gets. */
	assert_int_equal(dlshare_delete(c, "q/lim"), 0);
	assert_int_equal(dlshare_delete(c, "q/dflt"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* Creates waiting for room count as requests in flight of their
 * connection: one past --max-inflight is refused at once, naming it. */
struct waiter {
	dlshare_client *c;
	int32_t idx;
	int err;
};

static void *waiter_run(void *arg)
{
	struct waiter *w = arg;

	w->err = qput(w->c, "q/inflight", 1, DLSHARE_WAIT_FOREVER, w->idx);
	return NULL;
}

static void waits_in_flight(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *shared = harness_connect(&fx->d);
	struct waiter w[2] = { { shared, 2, -1 }, { shared, 3, -1 } };
	pthread_t th[2];
	dlshare_queue_info qi;

	assert_int_equal(qput(c, "q/inflight", 1, 0, 1), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, waiter_run, &w[i]),
				 0);
	for (int i = 0; i < harness_ms(20000) / 10; i++) {
		assert_int_equal(dlshare_queue_stat(c, "q/inflight", &qi), 0);
		if (qi.waiting == 2)
			break;
		util_sleep_ms(10);
	}
	assert_int_equal(qi.waiting, 2);
	assert_int_equal(qput(shared, "q/inflight", 1, DLSHARE_WAIT_FOREVER, 4),
			 DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "limit 2"));
	/* Room for one at a time: the waiters go on, in their order. */
	int32_t first = qtake(c, "q/inflight", 0);
	assert_int_equal(first, 1);
	int32_t a = qtake(c, "q/inflight", harness_ms(20000));
	int32_t b = qtake(c, "q/inflight", harness_ms(20000));
	assert_true((a == 2 && b == 3) || (a == 3 && b == 2));
	for (int i = 0; i < 2; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(w[i].err, 0);
	}
	assert_int_equal(dlshare_delete(c, "q/inflight"), 0);
	dlshare_disconnect(shared);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* An export into a queue name: queued like a copy; its producer's leaving
 * withdraws it from the queue, as from an ordinary name. */
static void export_queue(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_NO_COPY };
	dlshare_queue_opts q = { .depth = 2 };
	dlshare_queue_info qi;
	DLManagedTensor *t;
	dlshare_bundle *b;

	for (int i = 1; i <= 3; i++) {
		assert_int_equal(dlshare_host_alloc(DT_I32, 1, item_shape, &t), 0);
		for (int k = 0; k < ITEM_LEN; k++)
			((int32_t *)t->dl_tensor.data)[k] = i * 1000 + k;
		int err = dlshare_publish_queued(p, "q/exp", &t, 1, &o, &q, NULL);
		if (i <= 2) {
			assert_int_equal(err, 0);
		} else {
			/* Full: an export never waits. */
			assert_int_equal(err, DLSHARE_ELIMIT);
			t->deleter(t);
		}
	}
	assert_int_equal(dlshare_take(c, "q/exp", 0, NULL, &b), 0);
	assert_int_equal(qitem(b), 1);
	dlshare_disconnect(p);
	/* Item 2 left with its producer; item 1 stays its taker's. */
	struct util_want one = UTIL_ANY;
	one.connections = 1;
	util_assert_want(c, &one);
	assert_int_equal(dlshare_queue_stat(c, "q/exp", &qi), 0);
	assert_int_equal(qi.queued, 0);
	assert_int_equal(qi.taken, 1);
	assert_int_equal(qitem(b), 1);
	dlshare_bundle_free(b);

	/* A taker that goes without releasing an export whose producer
	 * went: nothing to redeliver, the version is consumed. */
	dlshare_client *p2 = harness_connect(&fx->d);
	dlshare_client *t2 = harness_connect(&fx->d);
	assert_int_equal(dlshare_host_alloc(DT_I32, 1, item_shape, &t), 0);
	for (int k = 0; k < ITEM_LEN; k++)
		((int32_t *)t->dl_tensor.data)[k] = 5000 + k;
	assert_int_equal(dlshare_publish_queued(p2, "q/exp", &t, 1, &o, &q,
						NULL), 0);
	assert_int_equal(dlshare_take(t2, "q/exp", 0, NULL, &b), 0);
	assert_int_equal(qitem(b), 5);
	dlshare_disconnect(p2);
	dlshare_disconnect(t2);
	util_assert_want(c, &one);
	assert_int_equal(dlshare_queue_stat(c, "q/exp", &qi), 0);
	assert_int_equal(qi.queued + qi.taken + qi.pending, 0);
	assert_int_equal(qitem(b), 5); /* the mapping stays the holder's */
	dlshare_bundle_free(b);
	assert_int_equal(dlshare_delete(c, "q/exp"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

/* ---- waiters racing for room on the thread pool ------------------------------ */

/* Items of 2 MiB: a Create of more than 1 MiB of host memory has its
 * buffers made on the daemon's thread pool, so that between the check for
 * room and the version's registration other producers may fill the queue.
 * A producer that asked to wait must then wait again, not fail. */
#define BIG_LEN (512 * 1024) /* int32 elements: 2 MiB */
#define BIG_PRODUCERS 4
static const int64_t big_shape[1] = { BIG_LEN };

static int big_items(void)
{
	/* The daemon under valgrind: fewer items, as large. */
	return getenv("DLSHARE_TEST_WRAPPER") ? 3 : 12;
}

static uint32_t big_word(int32_t idx, int k)
{
	return (uint32_t)idx * 2654435761u ^ (uint32_t)k * 40503u;
}

struct big_producer {
	const struct daemon_proc *d;
	int first;                /* its items: first, first + 1, ... */
	int forever;              /* waits forever, or for a minute */
	int err;                  /* the first failure, or 0 */
	char why[256];
};

static void *big_producer_run(void *arg)
{
	struct big_producer *p = arg;
	dlshare_client *c = harness_connect(p->d);
	dlshare_tensor_spec s = { .dtype = DT_I32, .ndim = 1,
				  .shape = big_shape };
	/* Half wait forever, half for long (a deadline carried through each
	 * new wait). */
	dlshare_queue_opts q = { .depth = 2,
				 .wait_ms = p->forever ? DLSHARE_WAIT_FOREVER :
				 harness_ms(60000) };

	if (!c) {
		p->err = -1;
		return NULL;
	}
	for (int i = 0; i < big_items() && !p->err; i++) {
		int32_t idx = p->first + i;
		dlshare_writer *w;
		uint32_t *data;

		p->err = dlshare_create_queued(c, "q/big", &s, 1, NULL, &q, &w);
		if (p->err) {
			snprintf(p->why, sizeof(p->why), "create of item %d: %s",
				 (int)idx, dlshare_last_error());
			break;
		}
		data = dlshare_writer_tensor(w, 0)->data;
		data[0] = (uint32_t)idx;
		for (int k = 1; k < BIG_LEN; k++)
			data[k] = big_word(idx, k);
		p->err = dlshare_seal(w, NULL, NULL);
		if (p->err)
			snprintf(p->why, sizeof(p->why), "seal of item %d: %s",
				 (int)idx, dlshare_last_error());
	}
	dlshare_disconnect(c);
	return NULL;
}

/* The item of a big bundle, or -1 when a byte is not what was written. */
static int32_t big_item(const dlshare_bundle *b)
{
	const DLTensor *t = dlshare_bundle_tensor(b, 0);
	const uint32_t *p;

	if (!t || t->ndim != 1 || t->shape[0] != BIG_LEN)
		return -1;
	p = (const uint32_t *)((const char *)t->data + t->byte_offset);
	for (int k = 1; k < BIG_LEN; k++)
		if (p[k] != big_word((int32_t)p[0], k))
			return -1;
	return (int32_t)p[0];
}

/* How many fds the daemon holds, or -1. */
static int daemon_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(dir = opendir(path)))
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

static void waiters_race_on_pool(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct big_producer prod[BIG_PRODUCERS];
	pthread_t th[BIG_PRODUCERS];
	int total = BIG_PRODUCERS * big_items();
	int *seen = calloc((size_t)total, sizeof(*seen));
	int fds0, fds1 = -1;

	assert_non_null(c);
	assert_non_null(seen);
	fds0 = daemon_fds(fx->d.pid);
	assert_true(fds0 > 0);
	for (int i = 0; i < BIG_PRODUCERS; i++) {
		prod[i] = (struct big_producer){ .d = &fx->d,
						 .first = i * big_items(),
						 .forever = i % 2 == 0 };
		assert_int_equal(pthread_create(&th[i], NULL, big_producer_run,
						&prod[i]), 0);
	}
	/* One slow taker: the producers pile up behind the depth of 2, and
	 * every take lets the parked ones race for one place. */
	for (int n = 0; n < total; n++) {
		dlshare_bundle *b;
		int32_t idx;
		int err = dlshare_take(c, "q/big", harness_ms(20000), NULL, &b);

		if (err) {
			/* A producer that failed is the likelier story. */
			for (int i = 0; i < BIG_PRODUCERS; i++) {
				assert_int_equal(pthread_join(th[i], NULL), 0);
				if (prod[i].err)
					fail_msg("producer %d: %d: %s", i,
						 prod[i].err, prod[i].why);
			}
			fail_msg("take %d of %d: %s", n, total,
				 dlshare_last_error());
		}
		idx = big_item(b);
		dlshare_bundle_free(b);
		assert_true(idx >= 0 && idx < total);
		seen[idx]++;
		usleep(2000);
	}
	for (int i = 0; i < BIG_PRODUCERS; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		if (prod[i].err)
			fail_msg("producer %d: %d: %s", i, prod[i].err,
				 prod[i].why);
	}
	for (int i = 0; i < total; i++)
		assert_int_equal(seen[i], 1);
	free(seen);

	assert_int_equal(dlshare_delete(c, "q/big"), 0);
	struct util_want want = empty_want(1);
	want.names = 0;
	util_assert_want(c, &want);
	/* Every memfd made, also those of the tries that found the queue
	 * full and were dropped, is closed (the producers' conns go soon
	 * after their Goodbye). */
	for (int waited = 0; waited <= harness_ms(5000); waited += 10) {
		if ((fds1 = daemon_fds(fx->d.pid)) == fds0)
			break;
		usleep(10 * 1000);
	}
	assert_int_equal(fds1, fds0);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(fifo_and_modes, setup, teardown),
		cmocka_unit_test_setup_teardown(exactly_once, setup, teardown),
		cmocka_unit_test_setup_teardown(backpressure, setup, teardown),
		cmocka_unit_test_setup_teardown(taker_death, setup, teardown),
		cmocka_unit_test_setup_teardown(producers_keep_order, setup,
						teardown),
		cmocka_unit_test_setup_teardown(queue_delete, setup, teardown),
		cmocka_unit_test_setup_teardown(delete_while_producer_waits, setup,
						teardown),
		cmocka_unit_test_setup_teardown(limits, setup_limits, teardown),
		cmocka_unit_test_setup_teardown(waits_in_flight, setup_inflight,
						teardown),
		cmocka_unit_test_setup_teardown(export_queue, setup, teardown),
		cmocka_unit_test_setup_teardown(waiters_race_on_pool, setup,
						teardown),
	};

	return cmocka_run_group_tests_name("queue", tests, NULL, NULL);
}
