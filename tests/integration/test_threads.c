/* test_threads — one client shared by many threads: 8 threads run get /
 * export / delete-tensor cycles (deleters often on another thread than the
 * one that got the tensor) and publish through the same client, while one
 * thread is parked in a long get that must not hold up the others and
 * another process keeps publishing new versions (store and export) of the
 * name they read. Every tensor read must match its version's data; at the
 * end no lease is left and every export went back to its deleter once.
 * And a push (Retired) that comes while a parked get is the thread reading
 * the socket is handled, and the export's deleter may call back into the
 * client without a deadlock. And a thread cancelled while it reads the
 * socket for its parked get leaves the client working (dlshare.h). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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

#define THREADS 8
#define CYCLES 200
#define MAX_VERSIONS 600

static const int64_t shape[1] = { 4096 };

/* ---- the other process: new versions, store and export in turn ------------------- */

static int versioner(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int slots[MAX_VERSIONS];
	int nslots = 0, n;
	dlshare_bundle *b;

	for (n = 0; n < MAX_VERSIONS; n++) {
		uint64_t v;

		if (n % 2 == 0) {
			dlshare_tensor_spec spec = {
				.dtype = DT_I32, .ndim = 1, .shape = shape,
			};
			dlshare_writer *w;

			/* The data's seed is its version number. */
			CHILD_OK(dlshare_create(c, "th/data", &spec, 1, NULL, &w));
			v = dlshare_writer_version(w);
			harness_fill(dlshare_writer_tensor(w, 0)->data,
				     util_nbytes(DT_I32, 1, shape), (uint32_t)v);
			CHILD_OK(dlshare_seal(w, NULL, NULL));
		} else {
			DLManagedTensor *t;
			dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_NO_COPY };
			dlshare_name_info info;

			/* The next number: we are the only publisher. */
			CHILD_OK(dlshare_stat(c, "th/data", &info, NULL));
			v = info.latest + 1;
			CHILD_OK(dlshare_host_alloc(DT_I32, 1, shape, &t));
			harness_fill(t->dl_tensor.data,
				     util_nbytes(DT_I32, 1, shape), (uint32_t)v);
			slots[nslots++] = util_track(t);
			CHILD_OK(dlshare_publish(c, "th/data", &t, 1, &o, &v));
			CHILD_CHECK(v == info.latest + 1);
		}
		if (n > 0 && dlshare_get(c, "th/stop", NULL, &b) == 0) {
			dlshare_bundle_free(b);
			break;
		}
		util_sleep_ms(1);
	}
	fprintf(stderr, "versioner: %d versions\n", n);
	/* All but the newest retire as the readers let go. */
	for (int i = 0; i + 1 < nslots; i++)
		CHILD_CHECK(util_wait_deleted(slots[i], 1) == 1);
	dlshare_disconnect(c);
	for (int i = 0; i < nslots; i++)
		CHILD_CHECK(util_deleted(slots[i]) == 1);
	return 0;
}

/* ---- the threads ------------------------------------------------------------------------ */

struct shared {
	dlshare_client *c;
	atomic_int failures;
	atomic_int cycles;
	/* Tensors handed from one thread to another, which deletes them. */
	pthread_mutex_t lock;
	DLManagedTensor *handoff[THREADS];
	DLManagedTensorVersioned *handoff_v[THREADS];
};

struct worker {
	struct shared *sh;
	int id;
	char err[256];
};

#define WFAIL(w, ...)                                                         \
	do {                                                                  \
		if (!(w)->err[0])                                             \
			snprintf((w)->err, sizeof((w)->err), __VA_ARGS__);    \
		atomic_fetch_add(&(w)->sh->failures, 1);                      \
		return NULL;                                                  \
	} while (0)

static int check_version(const DLTensor *t, uint64_t v)
{
	return util_check(t, DT_I32, 1, shape, (uint32_t)v);
}

static int noop_list(const dlshare_name_info *info, void *arg)
{
	return 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct shared *sh = w->sh;
	dlshare_client *c = sh->c;
	char own[64];

	snprintf(own, sizeof(own), "th/own/%d", w->id);
	for (int i = 0; i < CYCLES; i++) {
		dlshare_bundle *b;
		DLManagedTensor *m = NULL, *old = NULL;
		DLManagedTensorVersioned *mv = NULL, *oldv = NULL;
		dlshare_stats st;
		uint64_t v;
		int err;

		err = dlshare_get(c, "th/data", NULL, &b);
		if (err)
			WFAIL(w, "cycle %d: get: %s", i, dlshare_strerror(err));
		v = dlshare_bundle_version(b);
		if (check_version(dlshare_bundle_tensor(b, 0), v))
			WFAIL(w, "cycle %d: version %llu: wrong data", i,
			      (unsigned long long)v);
		switch (i % 4) {
		case 0:
			break;
		case 1:
			if ((err = dlshare_bundle_export(b, 0, &m)))
				WFAIL(w, "export: %s", dlshare_strerror(err));
			break;
		case 2:
			if ((err = dlshare_bundle_export_versioned(b, 0, &mv)))
				WFAIL(w, "export_versioned: %s",
				      dlshare_strerror(err));
			break;
		case 3:
			if ((err = dlshare_stats_get(c, &st)) ||
			    (err = dlshare_list(c, "th/", noop_list, NULL)))
				WFAIL(w, "stats/list: %s", dlshare_strerror(err));
			break;
		}
		dlshare_bundle_free(b);
		if (m && check_version(&m->dl_tensor, v))
			WFAIL(w, "cycle %d: managed tensor of %llu changed", i,
			      (unsigned long long)v);
		if (mv && check_version(&mv->dl_tensor, v))
			WFAIL(w, "cycle %d: versioned tensor of %llu changed",
			      i, (unsigned long long)v);
		/* Swap with the previous thread's slot: whoever comes next
		 * deletes the tensor, on its own thread. */
		pthread_mutex_lock(&sh->lock);
		int k = (w->id + i) % THREADS;
		old = sh->handoff[k];
		oldv = sh->handoff_v[k];
		sh->handoff[k] = m;
		sh->handoff_v[k] = mv;
		pthread_mutex_unlock(&sh->lock);
		if (old)
			old->deleter(old);
		if (oldv)
			oldv->deleter(oldv);
		if (i % 50 == 0 &&
		    (err = util_store(c, own, DT_I32, 1, shape, (uint32_t)i,
				      NULL)))
			WFAIL(w, "publish %s: %s", own, dlshare_strerror(err));
		atomic_fetch_add(&sh->cycles, 1);
	}
	return NULL;
}

struct parked {
	struct shared *sh;
	_Atomic int64_t returned_at;
	int err;
	uint64_t version;
	int bad_data;
};

static void *parked_main(void *arg)
{
	struct parked *p = arg;
	dlshare_get_opts o = { .timeout_ms = harness_ms(60000) };
	dlshare_bundle *b;

	p->err = dlshare_get(p->sh->c, "th/late", &o, &b);
	p->returned_at = util_now_ms();
	if (!p->err) {
		p->version = dlshare_bundle_version(b);
		p->bad_data = util_check(dlshare_bundle_tensor(b, 0), DT_I32,
					 1, shape, 99);
		dlshare_bundle_free(b);
	}
	return NULL;
}

static int late_publisher(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_store(c, "th/late", DT_I32, 1, shape, 99, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void many_threads_one_client(void **state)
{
	struct fixture *fx = *state;
	struct shared sh = { .c = harness_connect(&fx->d) };
	struct worker ws[THREADS];
	pthread_t th[THREADS], pth;
	struct parked pk = { .sh = &sh };
	struct util_want w = UTIL_ANY;
	dlshare_get_opts first = { .timeout_ms = harness_ms(10000) };
	dlshare_bundle *b;
	pid_t ver;
	int64_t workers_done;

	/* A watchdog: a deadlock (a parked get that holds up the others, say)
	 * kills the test with SIGALRM instead of hanging it. */
	alarm((unsigned)harness_ms(120000) / 1000);
	pthread_mutex_init(&sh.lock, NULL);
	ver = util_spawn(&fx->d, versioner, NULL);
	assert_int_equal(dlshare_get(sh.c, "th/data", &first, &b), 0);
	dlshare_bundle_free(b);

	assert_int_equal(pthread_create(&pth, NULL, parked_main, &pk), 0);
	w.parked = 1;
	util_assert_want(sh.c, &w);

	for (int i = 0; i < THREADS; i++) {
		ws[i] = (struct worker){ .sh = &sh, .id = i };
		assert_int_equal(pthread_create(&th[i], NULL, worker_main,
						&ws[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	workers_done = util_now_ms();
	for (int i = 0; i < THREADS; i++)
		if (ws[i].err[0])
			fprintf(stderr, "thread %d: %s\n", i, ws[i].err);
	assert_int_equal(atomic_load(&sh.failures), 0);
	assert_int_equal(atomic_load(&sh.cycles), THREADS * CYCLES);
	for (int i = 0; i < THREADS; i++) {
		if (sh.handoff[i])
			sh.handoff[i]->deleter(sh.handoff[i]);
		if (sh.handoff_v[i])
			sh.handoff_v[i]->deleter(sh.handoff_v[i]);
	}

	/* The parked get was there all along, and still is. */
	assert_int_equal(pk.returned_at, 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, late_publisher, NULL)), 0);
	pthread_join(pth, NULL);
	assert_int_equal(pk.err, 0);
	assert_int_equal(pk.version, 1);
	assert_int_equal(pk.bad_data, 0);
	assert_true(pk.returned_at >= workers_done);

	assert_int_equal(util_post(sh.c, "th/stop", 1), 0);
	assert_int_equal(util_wait(ver), 0);
	w.parked = 0;
	w.leases = 0;
	w.connections = 1;
	util_assert_want(sh.c, &w);
	dlshare_disconnect(sh.c);
	pthread_mutex_destroy(&sh.lock);
	alarm(0);
}

/* ---- a push while another thread waits in a parked get ---------------------------- */

static struct {
	dlshare_client *c;
	void (*orig)(DLManagedTensor *);
	atomic_int runs;
} cb;

/* An export's deleter that calls back into its client, as a binding's
 * deleter may. Where it runs, the call may be refused; it must not hang. */
static void calling_deleter(DLManagedTensor *t)
{
	dlshare_stats st;

	(void)dlshare_stats_get(cb.c, &st);
	cb.orig(t);
	atomic_fetch_add(&cb.runs, 1);
}

static void push_while_parked(void **state)
{
	struct fixture *fx = *state;
	struct shared sh = { .c = harness_connect(&fx->d) };
	struct parked pk = { .sh = &sh };
	struct util_want w = UTIL_ANY;
	dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_NO_COPY };
	DLManagedTensor *t;
	pthread_t pth;
	uint64_t v;
	int s2;

	alarm((unsigned)harness_ms(60000) / 1000);
	cb.c = sh.c;
	atomic_store(&cb.runs, 0);
	assert_int_equal(pthread_create(&pth, NULL, parked_main, &pk), 0);
	w.parked = 1;
	util_assert_want(sh.c, &w);

	assert_int_equal(dlshare_host_alloc(DT_I32, 1, shape, &t), 0);
	harness_fill(t->dl_tensor.data, util_nbytes(DT_I32, 1, shape), 1);
	cb.orig = t->deleter;
	t->deleter = calling_deleter;
	assert_int_equal(dlshare_publish(sh.c, "th/push", &t, 1, &o, &v), 0);
	assert_int_equal(v, 1);
	assert_int_equal(util_export(sh.c, "th/push", DT_I32, 1, shape, 2, &v,
				     &s2), 0);
	assert_int_equal(v, 2);
	/* Nobody holds version 1: the daemon retires it. No call of ours is
	 * in flight now but the parked get, so its thread, or the library's,
	 * must read the Retired and run the deleter. */
	for (int i = 0; i < harness_ms(5000) && atomic_load(&cb.runs) == 0; i++)
		util_sleep_ms(1);
	assert_int_equal(atomic_load(&cb.runs), 1);
	assert_int_equal(util_deleted(s2), 0);
	assert_int_equal(pk.returned_at, 0);

	assert_int_equal(util_wait(util_spawn(&fx->d, late_publisher, NULL)), 0);
	pthread_join(pth, NULL);
	assert_int_equal(pk.err, 0);
	assert_int_equal(pk.bad_data, 0);
	dlshare_disconnect(sh.c);
	assert_int_equal(util_deleted(s2), 1);
	assert_int_equal(atomic_load(&cb.runs), 1);
	alarm(0);
}

/* ---- a thread cancelled while it reads for its parked get -------------------------- */

struct cancelled {
	dlshare_client *c;
	int err;
	uint64_t version;
	int bad_data;
};

/* Uninstrumented by ASan: the cancel unwinds this frame without
 * unpoisoning its redzones, and ASan then reports its own writes to that
 * stack as the thread ends (google/sanitizers#1399). */
__attribute__((no_sanitize("address")))
static void *cancelled_main(void *arg)
{
	struct cancelled *k = arg;
	dlshare_get_opts o = { .timeout_ms = harness_ms(60000) };
	dlshare_bundle *b;

	pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, NULL);
	k->err = dlshare_get(k->c, "th/cancel", &o, &b);
	if (!k->err) {
		k->version = dlshare_bundle_version(b);
		k->bad_data = util_check(dlshare_bundle_tensor(b, 0), DT_I32,
					 1, shape, 98);
		dlshare_bundle_free(b);
	}
	/* The cancel, pending since the get, acts here. */
	pthread_testcancel();
	k->err = -1000;
	return NULL;
}

static int cancel_publisher(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_store(c, "th/cancel", DT_I32, 1, shape, 98, NULL));
	dlshare_disconnect(c);
	return 0;
}

/* dlshare.h: a thread cancelled inside a call is not cancelled there (its
 * socket I/O is no cancellation point); the cancel acts after the call
 * returns. Here the cancelled thread is the one reading the socket (a
 * parked get, alone on its client): another thread's calls on the same
 * client go on being served while the cancel is pending, the parked get
 * still gets its version, and the thread ends at its next cancellation
 * point. Were the receive a cancellation point, the thread would end
 * holding the reader role and the stats call below would hang (the
 * watchdog's SIGALRM). */
static void cancel_while_reading(void **state)
{
	struct fixture *fx = *state;
	struct cancelled k = { .c = harness_connect(&fx->d) };
	struct util_want w = UTIL_ANY;
	dlshare_stats st;
	pthread_t th;
	void *ret = NULL;

	alarm((unsigned)harness_ms(60000) / 1000);
	assert_int_equal(pthread_create(&th, NULL, cancelled_main, &k), 0);
	w.parked = 1;
	util_assert_want(k.c, &w);
	assert_int_equal(pthread_cancel(th), 0);
	util_sleep_ms(100);
	for (int i = 0; i < 100; i++)
		assert_int_equal(dlshare_stats_get(k.c, &st), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, cancel_publisher, NULL)),
			 0);
	assert_int_equal(pthread_join(th, &ret), 0);
	assert_ptr_equal(ret, PTHREAD_CANCELED);
	assert_int_equal(k.err, 0);
	assert_int_equal(k.version, 1);
	assert_int_equal(k.bad_data, 0);
	/* The client is whole: calls go on, nothing held. */
	w.parked = 0;
	w.leases = 0;
	util_assert_want(k.c, &w);
	dlshare_disconnect(k.c);
	alarm(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(many_threads_one_client, setup, teardown),
		cmocka_unit_test_setup_teardown(push_while_parked, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_while_reading, setup, teardown),
	};

	return cmocka_run_group_tests_name("threads", tests, NULL, NULL);
}
