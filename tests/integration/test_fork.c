/* test_fork — a child never harms its parent's connection. A child that
 * inherited a client (data-loader workers are forks) may disconnect it or
 * just exit, and the parent's calls go on working; its calls on the
 * inherited client fail with DLSHARE_EFORK, and dropping the tensors it
 * inherited sends nothing; closing it returns at once even while a parent
 * thread was parked in a get at the fork, and that get still completes. A
 * fork while a writer's store buffer is mapped (by create, or by a copying
 * publish on another thread) does not hand the child that writable mapping,
 * nor the buffer's memfd the library keeps for the seal, so the parent's
 * seal succeeds. A child made without the fork handlers
 * (_Fork, as a raw clone) is refused too, and so is its own child on the
 * client it connected. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
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

static const int64_t shape[1] = { 1024 };

/* Waits up to ms (scaled) for a child to exit. Returns its status, or -1
 * after killing it when it hung. */
static int wait_within(pid_t pid, int ms)
{
	int st;

	for (int waited = 0; waited <= harness_ms(ms); waited += 5) {
		if (util_exited(pid, &st))
			return st;
		util_sleep_ms(5);
	}
	util_kill(pid);
	return -1;
}

/* ---- the child disconnects, or just exits --------------------------------- */

struct leave {
	dlshare_client *c;
	int how;                 /* 0: disconnect and _exit, 1: exit() only */
};

static int child_leave(const struct daemon_proc *d, void *arg)
{
	struct leave *l = arg;
	int64_t t0 = util_now_ms();

	if (l->how == 1)
		exit(0); /* a normal exit: atexit handlers, stdio flushed */
	dlshare_disconnect(l->c);
	CHILD_CHECK(util_now_ms() - t0 < harness_ms(500));
	return 0;
}

static void child_leaves_parent_works(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	uint64_t v;

	assert_int_equal(util_store(c, "fork/a", DT_F32, 1, shape, 1, &v), 0);
	for (int how = 0; how < 2; how++) {
		struct leave l = { .c = c, .how = how };
		pid_t pid = util_spawn(&fx->d, child_leave, &l);

		assert_int_equal(wait_within(pid, 3000), 0);
		/* The parent's connection did not notice. */
		assert_int_equal(util_get_check(c, "fork/a", NULL, DT_F32, 1,
						shape, 1 + how, NULL), 0);
		assert_int_equal(util_store(c, "fork/a", DT_F32, 1, shape,
					    2 + how, &v), 0);
		assert_int_equal(util_get_check(c, "fork/a", NULL, DT_F32, 1,
						shape, 2 + how, NULL), 0);
	}
	util_assert_want(c, &(struct util_want){ .connections = 1,
		.names = -1, .versions = -1, .leases = 0, .buffers = -1,
		.bytes = -1, .parked = -1 });
	dlshare_disconnect(c);
}

/* ---- the child's calls on what it inherited ------------------------------- */

struct inherit {
	dlshare_client *c;
	DLManagedTensor *t;      /* a lease of the parent's */
	dlshare_bundle *b;       /* another */
	dlshare_writer *w;       /* the parent's pending version */
};

#define CHILD_EFORK(expr)                                                     \
	do {                                                                  \
		CHILD_ERR(expr, DLSHARE_EFORK);                               \
		CHILD_CHECK(strstr(dlshare_last_error(), "another process")); \
	} while (0)

static int child_calls(const struct daemon_proc *d, void *arg)
{
	struct inherit *in = arg;
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = shape };
	dlshare_get_opts wait = { .timeout_ms = 100 };
	DLManagedTensor *mine, *t;
	dlshare_writer *w;
	dlshare_bundle *b;
	dlshare_stats st;
	dlshare_client *own;

	/* What the parent got is still readable here... */
	CHILD_CHECK(util_check(&in->t->dl_tensor, DT_F32, 1, shape, 1) == 0);
	/* ...but every call on the parent's client is refused, again and
	 * again, while the parent keeps calling on it. */
	for (int i = 0; i < 50; i++) {
		CHILD_EFORK(dlshare_get(in->c, "fork/b", NULL, &b));
		CHILD_EFORK(dlshare_get(in->c, "fork/none", &wait, &b));
		CHILD_EFORK(dlshare_stats_get(in->c, &st));
	}
	CHILD_EFORK(dlshare_get_tensor(in->c, "fork/b", NULL, &t));
	CHILD_EFORK(dlshare_create(in->c, "fork/c", &spec, 1, NULL, &w));
	CHILD_EFORK(dlshare_delete(in->c, "fork/b"));
	CHILD_OK(dlshare_host_alloc(DT_F32, 1, shape, &mine));
	CHILD_EFORK(dlshare_publish(in->c, "fork/c", &mine, 1, NULL, NULL));
	mine->deleter(mine); /* still ours after a failure */
	CHILD_EFORK(dlshare_bundle_export(in->b, 0, &t));
	CHILD_EFORK(dlshare_bundle_wait(in->b, NULL));
	/* The pending version is the parent's: no memory of it here, and
	 * sealing it here is refused (and consumes only our copy). */
	CHILD_CHECK(dlshare_writer_tensor(in->w, 0) == NULL);
	CHILD_EFORK(dlshare_seal(in->w, NULL, NULL));
	/* Dropping the inherited tensors sends no Release: the parent's
	 * leases stay (it checks). */
	in->t->deleter(in->t);
	dlshare_bundle_free(in->b);
	dlshare_disconnect(in->c);
	/* A client of its own works. */
	own = util_child_connect(d);
	CHILD_OK(util_get_check(own, "fork/b", NULL, DT_F32, 1, shape, 1, NULL));
	dlshare_disconnect(own);
	return 0;
}

static void child_calls_refused(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = shape };
	struct inherit in = { .c = c };
	int st = -1, rounds = 0;
	uint64_t v;
	pid_t pid;

	assert_int_equal(util_store(c, "fork/b", DT_F32, 1, shape, 1, &v), 0);
	assert_int_equal(dlshare_get_tensor(c, "fork/b", NULL, &in.t), 0);
	assert_int_equal(dlshare_get(c, "fork/b", NULL, &in.b), 0);
	assert_int_equal(dlshare_create(c, "fork/w", &spec, 1, NULL, &in.w), 0);
	harness_fill(dlshare_writer_tensor(in.w, 0)->data,
		     util_nbytes(DT_F32, 1, shape), 7);
	pid = util_spawn(&fx->d, child_calls, &in);
	/* The parent calls all along: never a reply of the child's, never a
	 * protocol error. */
	for (;;) {
		assert_int_equal(util_get_check(c, "fork/b", NULL, DT_F32, 1,
						shape, 1, NULL), 0);
		rounds++;
		if (util_exited(pid, &st))
			break;
		assert_true(rounds < 100000);
	}
	assert_int_equal(st, 0);
	/* The child's deleters sent nothing: both leases are still ours. */
	util_assert_want(c, &(struct util_want){ .connections = 1,
		.names = -1, .versions = -1, .leases = 2, .buffers = -1,
		.bytes = -1, .parked = -1 });
	assert_int_equal(dlshare_seal(in.w, NULL, &v), 0);
	assert_int_equal(util_get_check(c, "fork/w", NULL, DT_F32, 1, shape,
					7, NULL), 0);
	in.t->deleter(in.t);
	dlshare_bundle_free(in.b);
	util_assert_want(c, &(struct util_want){ .connections = 1,
		.names = -1, .versions = -1, .leases = 0, .buffers = -1,
		.bytes = -1, .parked = -1 });
	dlshare_disconnect(c);
}

/* ---- a fork while a parent thread is parked in a get ----------------------- */

struct parked {
	dlshare_client *c;
	int err;
	uint64_t version;
};

static void *parked_main(void *arg)
{
	struct parked *p = arg;
	dlshare_get_opts o = { .timeout_ms = harness_ms(10000) };

	p->err = util_get_check(p->c, "fork/later", &o, DT_F32, 1, shape, 9,
				&p->version);
	return NULL;
}

static int child_close(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = arg;
	int64_t t0 = util_now_ms();

	/* Neither joins a thread the child does not have, nor takes a lock
	 * the parked thread held at the fork. */
	dlshare_disconnect(c);
	CHILD_CHECK(util_now_ms() - t0 < harness_ms(500));
	return 0;
}

static void fork_while_parked(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *other = harness_connect(&fx->d);
	struct parked p = { .c = c, .err = -100 };
	pthread_t th;
	uint64_t v;
	pid_t pid;

	assert_int_equal(pthread_create(&th, NULL, parked_main, &p), 0);
	util_assert_want(other, &(struct util_want){ .connections = -1,
		.names = -1, .versions = -1, .leases = -1, .buffers = -1,
		.bytes = -1, .parked = 1 });
	pid = util_spawn(&fx->d, child_close, c);
	assert_int_equal(wait_within(pid, 3000), 0);
	/* The parked get is still the parent's, and completes. */
	assert_int_equal(util_store(other, "fork/later", DT_F32, 1, shape, 9,
				    &v), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(p.err, 0);
	assert_int_equal(p.version, v);
	assert_int_equal(util_get_check(c, "fork/later", NULL, DT_F32, 1,
					shape, 9, NULL), 0);
	dlshare_disconnect(other);
	dlshare_disconnect(c);
}

/* ---- writable mappings do not follow a fork --------------------------------- */

struct holder {
	dlshare_writer *w;
	void *base;
	size_t len;
	unsigned long ino;   /* the buffer's memfd's inode */
	int pipe[2];
};

/* The inode of the file mapped at base (from /proc/self/maps), or 0. */
static unsigned long mapped_inode(const void *base)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	unsigned long lo, ino = 0, got;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%*x %*s %*s %*s %lu", &lo, &got) == 2 &&
		    lo == (unsigned long)base) {
			ino = got;
			break;
		}
	fclose(f);
	return ino;
}

/* How many of this process's fds are open on inode ino. */
static int fds_on_inode(unsigned long ino)
{
	int n = 0;

	for (int fd = 0; fd < 1024; fd++) {
		struct stat st;

		if (fstat(fd, &st) == 0 && st.st_ino == ino &&
		    S_ISREG(st.st_mode))
			n++;
	}
	return n;
}

static int child_holds(const struct daemon_proc *d, void *arg)
{
	struct holder *h = arg;
	char b;

	/* Alive while the parent seals: before then, nothing here may keep
	 * the buffer mapped writable, nor hold its memfd (the library keeps
	 * it, to write-seal it at dlshare_seal: a child's copy would keep
	 * the buffer alive after the daemon let it go). */
	CHILD_CHECK(fds_on_inode(h->ino) == 0);
	CHILD_CHECK(read(h->pipe[0], &b, 1) == 1);
	CHILD_CHECK(dlshare_writer_tensor(h->w, 0) == NULL);
	CHILD_CHECK(msync(h->base, h->len, MS_ASYNC) < 0 && errno == ENOMEM);
	dlshare_writer_abort(h->w); /* only frees our copy */
	return 0;
}

static void fork_while_writer_mapped(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	static const int64_t big[1] = { 1 << 18 };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = big };
	struct holder h = { 0 };
	DLTensor *t;
	uint64_t v;
	pid_t pid;

	assert_int_equal(pipe(h.pipe), 0);
	assert_int_equal(dlshare_create(c, "fork/mapped", &spec, 1, NULL, &h.w),
			 0);
	t = dlshare_writer_tensor(h.w, 0);
	h.base = t->data;
	h.len = util_nbytes(DT_F32, 1, big);
	harness_fill(t->data, h.len, 3);
	h.ino = mapped_inode(h.base);
	assert_true(h.ino != 0);
	/* Ours holds it (the library's fd, kept for the seal). */
	assert_int_equal(fds_on_inode(h.ino), 1);
	pid = util_spawn(&fx->d, child_holds, &h);
	assert_int_equal(dlshare_seal(h.w, NULL, &v), 0);
	/* Closed at the seal, after its F_SEAL_WRITE. */
	assert_int_equal(fds_on_inode(h.ino), 0);
	assert_int_equal(write(h.pipe[1], "x", 1), 1);
	assert_int_equal(wait_within(pid, 3000), 0);
	assert_int_equal(util_get_check(c, "fork/mapped", NULL, DT_F32, 1, big,
					3, NULL), 0);
	close(h.pipe[0]);
	close(h.pipe[1]);
	dlshare_disconnect(c);
}

/* A copying publish maps a store buffer for the copy: forks at any moment
 * of it must not make its seal fail. */
struct copier {
	dlshare_client *c;
	atomic_int stop;
	int err;
	int published;
	char msg[256];
};

static void *copier_main(void *arg)
{
	struct copier *cp = arg;
	static const int64_t big[1] = { 1 << 20 };
	size_t n = util_nbytes(DT_F32, 1, big);
	DLManagedTensor t = {
		.dl_tensor = { .device = { kDLCPU, 0 }, .ndim = 1,
			       .dtype = DT_F32, .shape = (int64_t *)big },
	};

	t.dl_tensor.data = malloc(n);
	if (!t.dl_tensor.data) {
		cp->err = DLSHARE_ENOMEM;
		return NULL;
	}
	harness_fill(t.dl_tensor.data, n, 5);
	while (!atomic_load(&cp->stop) && !cp->err) {
		DLManagedTensor *tp = &t; /* no deleter: the memory stays ours */

		cp->err = dlshare_publish(cp->c, "fork/copied", &tp, 1, NULL,
					  NULL);
		if (cp->err)
			snprintf(cp->msg, sizeof(cp->msg), "%s",
				 dlshare_last_error());
		else
			cp->published++;
	}
	free(t.dl_tensor.data);
	return NULL;
}

static int child_lingers(const struct daemon_proc *d, void *arg)
{
	util_sleep_ms(20);
	return 0;
}

static void fork_during_copying_publish(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct copier cp = { .c = c };
	pthread_t th;
	int forks = 0;

	assert_int_equal(pthread_create(&th, NULL, copier_main, &cp), 0);
	for (int64_t end = util_now_ms() + harness_ms(1500);
	     util_now_ms() < end && !cp.err; forks++) {
		pid_t pid = util_spawn(&fx->d, child_lingers, NULL);

		assert_int_equal(wait_within(pid, 3000), 0);
	}
	atomic_store(&cp.stop, 1);
	assert_int_equal(pthread_join(th, NULL), 0);
	if (cp.err)
		fail_msg("publish after %d copies and %d forks: %s (%s)",
			 cp.published, forks, dlshare_strerror(cp.err), cp.msg);
	assert_true(cp.published > 0);
	dlshare_disconnect(c);
}

/* ---- a child made without the fork handlers -------------------------------- */

/* _Fork (glibc 2.34) runs no pthread_atfork handlers, as a raw clone does
 * not: the library knows the child only by what the kernel gives it (its
 * page wiped on fork, or its pid), not by its child handler. */
#if defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 34)
#define HAVE_UNHANDLED_FORK 1
#endif
#endif

#ifdef HAVE_UNHANDLED_FORK
static pid_t spawn_unhandled(const struct daemon_proc *d, util_child_fn fn,
			     void *arg)
{
	pid_t pid;

	fflush(NULL);
	pid = _Fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(120); /* a hung child must not hang the suite */
		_exit(fn(d, arg));
	}
	return pid;
}

/* The grandchild: the client its parent connected is not its own. */
static int grandchild_unhandled(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = arg;
	dlshare_bundle *b;
	dlshare_stats st;

	(void)d;
	CHILD_EFORK(dlshare_stats_get(c, &st));
	CHILD_EFORK(dlshare_get(c, "fork/u", NULL, &b));
	return 0;
}

static int child_unhandled(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = arg, *own;
	dlshare_bundle *b;
	dlshare_stats st;
	int status = -1;
	pid_t pid;

	/* Its fds were not closed (no handler ran), and it must not use
	 * them: refused before the socket. */
	CHILD_EFORK(dlshare_stats_get(c, &st));
	CHILD_EFORK(dlshare_get(c, "fork/u", NULL, &b));
	own = util_child_connect(d);
	CHILD_OK(util_get_check(own, "fork/u", NULL, DT_F32, 1, shape, 3,
				NULL));
	pid = spawn_unhandled(d, grandchild_unhandled, own);
	CHILD_CHECK(pid > 0);
	CHILD_CHECK(waitpid(pid, &status, 0) == pid);
	CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* The grandchild's exit left our connection alone. */
	CHILD_OK(util_get_check(own, "fork/u", NULL, DT_F32, 1, shape, 3,
				NULL));
	dlshare_disconnect(own);
	return 0;
}
#endif

static void child_without_handlers_refused(void **state)
{
#ifndef HAVE_UNHANDLED_FORK
	(void)state;
	skip();
#else
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	uint64_t v;
	pid_t pid;

	assert_int_equal(util_store(c, "fork/u", DT_F32, 1, shape, 3, &v), 0);
	pid = spawn_unhandled(&fx->d, child_unhandled, c);
	assert_true(pid > 0);
	assert_int_equal(wait_within(pid, 10000), 0);
	assert_int_equal(util_get_check(c, "fork/u", NULL, DT_F32, 1, shape, 3,
					NULL), 0);
	dlshare_disconnect(c);
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(child_leaves_parent_works, setup,
						teardown),
		cmocka_unit_test_setup_teardown(child_calls_refused, setup,
						teardown),
		cmocka_unit_test_setup_teardown(fork_while_parked, setup,
						teardown),
		cmocka_unit_test_setup_teardown(fork_while_writer_mapped, setup,
						teardown),
		cmocka_unit_test_setup_teardown(fork_during_copying_publish,
						setup, teardown),
		cmocka_unit_test_setup_teardown(child_without_handlers_refused,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
