/* test_chan — the request channel's memory and wakeups (proto/chan.c): the
 * memfd sealed at its size, an eventfd read that never blocks whatever a
 * peer set on the file, and futex waits and wakes across two mappings of
 * the memfd (as the client's and the daemon's are). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chan.h"

static void test_make(void **state)
{
	void *base;
	int mfd, efd;
	struct stat st;

	(void)state;
	assert_int_equal(chan_make(&base, &mfd, &efd), 0);
	assert_int_equal(fstat(mfd, &st), 0);
	assert_int_equal(st.st_size, CHAN_BYTES);
	assert_int_equal(fcntl(mfd, F_GET_SEALS),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(ftruncate(mfd, 0), -1);
	assert_int_equal(errno, EPERM);
	assert_true(fcntl(efd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(mfd, F_GETFD) & FD_CLOEXEC);
	assert_true(fcntl(efd, F_GETFD) & FD_CLOEXEC);
	/* The slots fit the memfd, the heads aligned for their atomics. */
	assert_true(CHAN_REQ_OFF + sizeof(struct chan_req) + CHAN_REQ_MAX <=
		    CHAN_REP_OFF);
	assert_int_equal(CHAN_REP_OFF + sizeof(struct chan_rep) + CHAN_REP_MAX,
			 CHAN_BYTES);
	assert_int_equal(atomic_load(&chan_req_of(base)->seq), 0);
	munmap(base, CHAN_BYTES);
	close(mfd);
	close(efd);
}

static void on_alarm(int sig)
{
	(void)sig;
	/* chan_drain blocked: fail loudly. */
	static const char msg[] = "chan_drain blocked on an empty eventfd\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(1);
}

/* A peer cleared O_NONBLOCK on the shared file: the drain still returns
 * at once when the count is 0 (a plain read would block), and reads a
 * count at its top to zero. */
static void test_drain_never_blocks(void **state)
{
	void *base;
	int mfd, efd;
	uint64_t top = UINT64_C(0xfffffffffffffffe), v;

	(void)state;
	assert_int_equal(chan_supported(), 0);
	assert_int_equal(chan_make(&base, &mfd, &efd), 0);
	assert_int_equal(fcntl(efd, F_SETFL,
			       fcntl(efd, F_GETFL) & ~O_NONBLOCK), 0);
	signal(SIGALRM, on_alarm);
	alarm(5);
	assert_int_equal(chan_drain(efd), 0);
	assert_int_equal(write(efd, &top, sizeof(top)), sizeof(top));
	assert_int_equal(chan_drain(efd), 0);
	assert_int_equal(chan_drain(efd), 0);
	alarm(0);
	/* Drained: the count is 0 (a non-blocking read says so). */
	assert_int_equal(fcntl(efd, F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(read(efd, &v, sizeof(v)), -1);
	assert_int_equal(errno, EAGAIN);
	munmap(base, CHAN_BYTES);
	close(mfd);
	close(efd);
}

struct waiter {
	_Atomic uint32_t *w;
	int woke;
};

static void *wait_for_1(void *arg)
{
	struct waiter *a = arg;

	while (atomic_load(a->w) != 1)
		(void)chan_wait(a->w, 0, 10000);
	a->woke = 1;
	return NULL;
}

/* A wait on one mapping is woken by a store and a wake through another
 * mapping of the same memfd (a shared futex, keyed by the file). */
static void test_wait_wake(void **state)
{
	void *a, *b;
	int mfd, efd;
	pthread_t t;
	struct waiter w = { 0 };
	_Atomic uint32_t *wa, *wb;

	(void)state;
	assert_int_equal(chan_make(&a, &mfd, &efd), 0);
	b = mmap(NULL, CHAN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	assert_true(b != MAP_FAILED);
	wa = &chan_rep_of(a)->seq;
	wb = &chan_rep_of(b)->seq;
	assert_ptr_not_equal((void *)wa, (void *)wb);
	/* Nothing wakes it: it times out. */
	assert_int_equal(chan_wait(wb, 0, 20), -ETIMEDOUT);
	/* The word no longer holds the value: no wait at all. */
	atomic_store(wa, 5);
	assert_int_equal(chan_wait(wb, 0, 10000), 0);
	atomic_store(wa, 0);
	w.w = wb;
	assert_int_equal(pthread_create(&t, NULL, wait_for_1, &w), 0);
	usleep(20000);
	assert_int_equal(w.woke, 0);
	atomic_store(wa, 1);
	chan_wake(wa);
	pthread_join(t, NULL);
	assert_int_equal(w.woke, 1);
	munmap(a, CHAN_BYTES);
	munmap(b, CHAN_BYTES);
	close(mfd);
	close(efd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_make),
		cmocka_unit_test(test_drain_never_blocks),
		cmocka_unit_test(test_wait_wake),
	};

	return cmocka_run_group_tests_name("chan", tests, NULL, NULL);
}
