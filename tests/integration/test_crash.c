/* test_crash — a client that dies (SIGKILL) leaks nothing in the daemon:
 * a consumer's leases and parked gets, a producer's pending version, a
 * producer's exports. After each, the daemon's counters and its open fds
 * are back where they were. Children signal through the daemon's counters
 * (leases held, versions created), so nothing else disturbs them. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

static const int64_t shape[2] = { 256, 1024 }; /* 1 MiB of float32 */
#define NBYTES (256u * 1024u * 4u)

/* Our connection alone, settled: the daemon's fd count as a baseline. */
static int baseline_fds(const struct fixture *fx, dlshare_client *c)
{
	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	return harness_fd_count(fx->d.pid);
}

static void assert_fds(const struct fixture *fx, int want)
{
	assert_int_equal(harness_wait_fds(fx->d.pid, want), want);
}

/* ---- a consumer killed while holding leases --------------------------------- */

static int greedy_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	DLManagedTensor *m;
	DLManagedTensorVersioned *mv;
	dlshare_bundle *b;

	CHILD_OK(dlshare_get(c, "crash/a", NULL, &b));
	CHILD_OK(dlshare_get_tensor(c, "crash/a", NULL, &m));
	CHILD_OK(dlshare_get_tensor_versioned(c, "crash/b", NULL, &mv));
	CHILD_CHECK(util_check(&m->dl_tensor, DT_F32, 2, shape, 1) == 0);
	for (;;)
		pause(); /* until SIGKILL */
}

static void consumer_killed(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want held = UTIL_ANY, after = UTIL_ANY;
	int fds;
	pid_t p;

	assert_int_equal(util_store(c, "crash/a", DT_F32, 2, shape, 1, NULL), 0);
	assert_int_equal(util_export(c, "crash/b", DT_F32, 2, shape, 2, NULL,
				     NULL), 0);
	fds = baseline_fds(fx, c);

	p = util_spawn(&fx->d, greedy_consumer, NULL);
	held.leases = 3;
	held.connections = 2;
	util_assert_want(c, &held);
	/* Newer versions: the old ones now live only by the child's leases. */
	assert_int_equal(util_store(c, "crash/a", DT_F32, 2, shape, 3, NULL), 0);
	assert_int_equal(util_export(c, "crash/b", DT_F32, 2, shape, 4, NULL,
				     NULL), 0);
	held.versions = 4;
	util_assert_want(c, &held);

	util_kill(p);
	after.leases = 0;
	after.connections = 1;
	after.names = 2;
	after.versions = 2;
	after.buffers = 2;
	after.bytes = 2 * NBYTES;
	util_assert_want(c, &after);
	assert_fds(fx, fds);
	dlshare_disconnect(c);
}

/* ---- a consumer killed while its gets are parked ----------------------------------- */

static int parked_consumer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = { .timeout_ms = DLSHARE_WAIT_FOREVER };
	dlshare_bundle *b;

	dlshare_get(c, "crash/never", &o, &b);
	CHILD_FAIL("a get that waits forever returned");
}

static void parked_consumer_killed(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want w = UTIL_ANY;
	int fds = baseline_fds(fx, c);
	pid_t p = util_spawn(&fx->d, parked_consumer, NULL);

	w.parked = 1;
	util_assert_want(c, &w);
	util_kill(p);
	w.parked = 0;
	w.connections = 1;
	util_assert_want(c, &w);
	assert_fds(fx, fds);
	/* Publishing to the name the dead waited for harms no one. */
	assert_int_equal(util_store(c, "crash/never", DT_F32, 2, shape, 1, NULL), 0);
	assert_int_equal(util_get_check(c, "crash/never", NULL, DT_F32, 2,
					shape, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- a producer killed between create and seal --------------------------------------- */

static int unsealed_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 2, .shape = shape };
	dlshare_writer *w;

	CHILD_OK(dlshare_create(c, "crash/pending", &spec, 1, NULL, &w));
	harness_fill(dlshare_writer_tensor(w, 0)->data, NBYTES / 2, 9);
	for (;;)
		pause(); /* until SIGKILL, half written */
}

static void producer_killed_before_seal(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_get_opts wait = { .timeout_ms = harness_ms(200) };
	struct util_want pending = UTIL_ANY, gone = UTIL_ANY;
	dlshare_bundle *b;
	int fds = baseline_fds(fx, c);
	pid_t p = util_spawn(&fx->d, unsealed_producer, NULL);

	pending.versions = 1;
	pending.buffers = 1;
	pending.bytes = NBYTES;
	util_assert_want(c, &pending);
	/* Pending is invisible. */
	assert_int_equal(dlshare_get(c, "crash/pending", NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(dlshare_get(c, "crash/pending", &wait, &b),
			 DLSHARE_ETIMEDOUT);

	util_kill(p);
	gone.connections = 1;
	gone.names = 0;
	gone.versions = 0;
	gone.buffers = 0;
	gone.bytes = 0;
	gone.leases = 0;
	util_assert_want(c, &gone);
	assert_fds(fx, fds);
	assert_int_equal(dlshare_get(c, "crash/pending", NULL, &b), DLSHARE_ENOENT);
	dlshare_disconnect(c);
}

/* ---- a producer of exports killed --------------------------------------------------------- */

static int exporting_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_export(c, "crash/x", DT_F32, 2, shape, 5, NULL, NULL));
	CHILD_OK(util_export(c, "crash/y", DT_F32, 2, shape, 6, NULL, NULL));
	for (;;)
		pause();
}

static void exporter_killed(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want live = UTIL_ANY, w = UTIL_ANY;
	dlshare_bundle *held, *b;
	int fds = baseline_fds(fx, c);
	pid_t p = util_spawn(&fx->d, exporting_producer, NULL);

	live.names = 2;
	live.versions = 2;
	live.buffers = 2;
	util_assert_want(c, &live);
	assert_int_equal(util_get_check(c, "crash/x", NULL, DT_F32, 2, shape,
					5, NULL), 0);
	assert_int_equal(dlshare_get(c, "crash/y", NULL, &held), 0);

	util_kill(p);
	/* Withdrawn: crash/x is gone at once; crash/y lives on our lease. */
	w.connections = 1;
	w.names = 1;
	w.versions = 1;
	w.buffers = 1;
	w.leases = 1;
	util_assert_want(c, &w);
	assert_int_equal(dlshare_get(c, "crash/x", NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(dlshare_get(c, "crash/y", NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(util_check(dlshare_bundle_tensor(held, 0), DT_F32, 2,
				    shape, 6), 0);
	dlshare_bundle_free(held);
	w.names = 0;
	w.versions = 0;
	w.buffers = 0;
	w.bytes = 0;
	w.leases = 0;
	util_assert_want(c, &w);
	assert_fds(fx, fds);
	dlshare_disconnect(c);
}

/* ---- the daemon killed under its clients ----------------------------------------- */

/* Removes what a killed daemon left in its directory. */
static void dir_remove(const char *dir)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/dlshared.sock", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/daemon.log", dir);
	unlink(p);
	rmdir(dir);
}

/* The daemon dies (SIGKILL, the OOM killer; systemd restarts it) while a
 * consumer holds a tensor, a bundle and a kept get, and a producer holds
 * an export and a pending writer. What they got stays readable; every call
 * then fails at once with DLSHARE_ECONN (no hang: a watchdog alarm would
 * end the test); deleters, the writer's abort and dlshare_disconnect()
 * return; the export goes back to its deleter once; nothing of the
 * clients is left open in this process; and a new daemon serves new
 * clients. */
static void daemon_killed(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 2,
				     .shape = shape };
	DLManagedTensor *t, *kept;
	dlshare_writer *w;
	dlshare_bundle *b, *b2;
	dlshare_stats st;
	char old_dir[sizeof(fx->d.dir)];
	int slot, status;

	alarm((unsigned)harness_ms(60000) / 1000);
	assert_int_equal(util_store(p, "crash/s", DT_F32, 2, shape, 3, NULL),
			 0);
	assert_int_equal(util_export(p, "crash/e", DT_F32, 2, shape, 4, NULL,
				     &slot), 0);
	assert_int_equal(dlshare_create(p, "crash/w", &spec, 1, NULL, &w), 0);
	assert_int_equal(dlshare_get_tensor(c, "crash/s", NULL, &t), 0);
	assert_int_equal(dlshare_get(c, "crash/e", NULL, &b), 0);
	/* A get freed at once is kept (1.7) with its lease. */
	assert_int_equal(dlshare_get_tensor(c, "crash/e", NULL, &kept), 0);
	kept->deleter(kept);

	assert_int_equal(kill(fx->d.pid, SIGKILL), 0);
	assert_int_equal(waitpid(fx->d.pid, &status, 0), fx->d.pid);
	fx->d.pid = 0;

	assert_int_equal(util_check(&t->dl_tensor, DT_F32, 2, shape, 3), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 2,
				    shape, 4), 0);
	/* A reader that gets a kept name in a loop answers itself from the
	 * board (1.7) and never asks; it must still learn that the daemon
	 * is gone (the receiver thread reads the socket once no call has
	 * for CLIENT_IDLE_MS), and until then it gets what it had. */
	for (int i = 0;; i++) {
		int err = dlshare_get_tensor(c, "crash/e", NULL, &kept);

		if (err == DLSHARE_ECONN)
			break;
		assert_int_equal(err, 0);
		assert_int_equal(util_check(&kept->dl_tensor, DT_F32, 2,
					    shape, 4), 0);
		kept->deleter(kept);
		assert_true(i < harness_ms(5000));
		util_sleep_ms(1);
	}
	assert_int_equal(dlshare_get(c, "crash/s", NULL, &b2), DLSHARE_ECONN);
	assert_int_equal(dlshare_stats_get(p, &st), DLSHARE_ECONN);
	/* The seal consumes the writer, also when it fails. */
	assert_int_equal(dlshare_seal(w, NULL, NULL), DLSHARE_ECONN);
	t->deleter(t);
	dlshare_disconnect(c);
	/* After the disconnect too, as a binding's garbage collector may. */
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 2,
				    shape, 4), 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(p);
	assert_int_equal(util_deleted(slot), 1);

	/* A new daemon (systemd would start it at the same socket). */
	snprintf(old_dir, sizeof(old_dir), "%s", fx->d.dir);
	dir_remove(old_dir);
	assert_int_equal(harness_daemon_start(&fx->d, NULL), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(dlshare_get(c, "crash/s", NULL, &b), DLSHARE_ENOENT);
	assert_int_equal(util_store(c, "crash/s", DT_F32, 2, shape, 5, NULL),
			 0);
	assert_int_equal(util_get_check(c, "crash/s", NULL, DT_F32, 2, shape,
					5, NULL), 0);
	dlshare_disconnect(c);
	alarm(0);
}

struct chan_get {
	dlshare_client *c;
	int err;
	atomic_int done;
};

static void *chan_get_main(void *arg)
{
	struct chan_get *g = arg;
	dlshare_bundle *b = NULL;

	g->err = dlshare_get(g->c, "crash/ch", NULL, &b);
	if (!g->err && util_check(dlshare_bundle_tensor(b, 0), DT_F32, 2,
				  shape, 6))
		g->err = -1000;
	dlshare_bundle_free(b);
	atomic_store(&g->done, 1);
	return NULL;
}

/* A get through the request channel (1.9) waits on a futex the daemon
 * wakes: a daemon that is stopped for a while still answers it once it
 * runs; one killed meanwhile never wakes it, and the get must still end,
 * with DLSHARE_ECONN (the library reads the socket's hang-up while it
 * waits), not hang. */
static void daemon_killed_in_channel_wait(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	dlshare_client *c;
	struct chan_get g;
	char old_dir[sizeof(fx->d.dir)];
	pthread_t t;
	int status;

	alarm((unsigned)harness_ms(60000) / 1000);
	/* Every get asks the daemon (none is answered from the board). */
	setenv("DLSHARE_NO_REUSE", "1", 1);
	c = harness_connect(&fx->d);
	unsetenv("DLSHARE_NO_REUSE");
	g = (struct chan_get){ .c = c };
	assert_int_equal(util_store(p, "crash/ch", DT_F32, 2, shape, 6, NULL),
			 0);
	util_channel_open(c);
	assert_int_equal(util_get_check(c, "crash/ch", NULL, DT_F32, 2, shape,
					6, NULL), 0);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
		g.err = 0;
		atomic_store(&g.done, 0);
		assert_int_equal(pthread_create(&t, NULL, chan_get_main, &g),
				 0);
		/* Past several of the waiter's looks at the socket. */
		util_sleep_ms(100);
		assert_int_equal(atomic_load(&g.done), 0);
		if (round == 0) {
			assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
			pthread_join(t, NULL);
			assert_int_equal(g.err, 0);
			continue;
		}
		assert_int_equal(kill(fx->d.pid, SIGKILL), 0);
		assert_int_equal(waitpid(fx->d.pid, &status, 0), fx->d.pid);
		fx->d.pid = 0;
		pthread_join(t, NULL);
		assert_int_equal(g.err, DLSHARE_ECONN);
	}
	dlshare_disconnect(c);
	dlshare_disconnect(p);
	/* A new daemon, for the teardown. */
	snprintf(old_dir, sizeof(old_dir), "%s", fx->d.dir);
	dir_remove(old_dir);
	assert_int_equal(harness_daemon_start(&fx->d, NULL), 0);
	alarm(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(consumer_killed, setup, teardown),
		cmocka_unit_test_setup_teardown(parked_consumer_killed, setup, teardown),
		cmocka_unit_test_setup_teardown(producer_killed_before_seal, setup, teardown),
		cmocka_unit_test_setup_teardown(exporter_killed, setup, teardown),
		cmocka_unit_test_setup_teardown(daemon_killed, setup, teardown),
		cmocka_unit_test_setup_teardown(daemon_killed_in_channel_wait,
						setup, teardown),
	};

	return cmocka_run_group_tests_name("crash", tests, NULL, NULL);
}
