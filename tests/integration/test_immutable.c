/* test_immutable — a sealed version cannot change: a consumer's mapping is
 * read-only (writing kills it with SIGSEGV; mprotect cannot make it
 * writable), the producer's writable mapping is gone after seal, a seal
 * with a writable mapping still alive elsewhere is refused, and the
 * daemon's memfd, reopened through /proc, cannot be mapped writable. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

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

static const int64_t shape[2] = { 300, 100 };

/* The permissions ("r--s") of the mapping holding p, from /proc/self/maps;
 * "" when p is not mapped. */
static void maps_perms(const void *p, char perms[5])
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	uintptr_t a = (uintptr_t)p;

	perms[0] = '\0';
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char pm[5];

		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, pm) == 3 &&
		    a >= lo && a < hi) {
			memcpy(perms, pm, 5);
			break;
		}
	}
	if (f)
		fclose(f);
}

/* Count of writable mappings of memfds whose name contains label. */
static int writable_maps(const char *label)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	while (f && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char pm[5];

		if (sscanf(line, "%lx-%lx %4s", &lo, &hi, pm) == 3 &&
		    pm[1] == 'w' && strstr(line, label))
			n++;
	}
	if (f)
		fclose(f);
	return n;
}

struct writer_arg {
	const char *name;
	int export;
};

/* Gets name, checks the mapping is read-only and cannot be made writable,
 * then writes into it: the write must kill us. */
static int scribbler(const struct daemon_proc *d, void *arg)
{
	const struct writer_arg *w = arg;
	dlshare_client *c = util_child_connect(d);
	DLManagedTensor *m;
	volatile uint8_t *p;
	char perms[5];

	CHILD_OK(dlshare_get_tensor(c, w->name, NULL, &m));
	CHILD_CHECK(util_check(&m->dl_tensor, DT_U8, 2, shape, 7) == 0);
	p = (volatile uint8_t *)m->dl_tensor.data + m->dl_tensor.byte_offset;
	maps_perms((const void *)p, perms);
	if (perms[0] != 'r' || perms[1] != '-')
		CHILD_FAIL("mapping of %s is '%s', want read-only", w->name,
			   perms);
	if (!w->export) {
		/* Write-sealed: not even mprotect can open it up. */
		void *page = (void *)((uintptr_t)p & ~(uintptr_t)4095);

		CHILD_CHECK(mprotect(page, 4096, PROT_READ | PROT_WRITE) < 0);
	}
	/* ASan (in the sanitizer build) would turn the fault into exit(1). */
	signal(SIGSEGV, SIG_DFL);
	p[0] = (uint8_t)(p[0] + 1);
	p[1000] = 0x5a;
	CHILD_FAIL("wrote into a sealed tensor of %s", w->name);
}

static void readers_cannot_write(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct writer_arg store = { "imm/store", 0 }, exp = { "imm/export", 1 };
	pid_t p;

	assert_int_equal(util_store(c, "imm/store", DT_U8, 2, shape, 7, NULL), 0);
	assert_int_equal(util_export(c, "imm/export", DT_U8, 2, shape, 7, NULL,
				     NULL), 0);
	p = util_spawn(&fx->d, scribbler, &store);
	assert_int_equal(util_wait(p), 128 + SIGSEGV);
	p = util_spawn(&fx->d, scribbler, &exp);
	assert_int_equal(util_wait(p), 128 + SIGSEGV);
	/* The data is unchanged for everyone else. */
	assert_int_equal(util_get_check(c, "imm/store", NULL, DT_U8, 2, shape,
					7, NULL), 0);
	assert_int_equal(util_get_check(c, "imm/export", NULL, DT_U8, 2, shape,
					7, NULL), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- the producer's side ------------------------------------------------------- */

static int sealing_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec spec = { .dtype = DT_U8, .ndim = 2, .shape = shape };
	dlshare_name_info info;
	dlshare_writer *w;
	DLTensor *t;
	void *data;
	pid_t keeper;

	/* Writable while pending, gone at seal. */
	CHILD_OK(dlshare_create(c, "imm/sealed", &spec, 1, NULL, &w));
	t = dlshare_writer_tensor(w, 0);
	data = t->data;
	harness_fill(data, util_nbytes(DT_U8, 2, shape), 7);
	CHILD_CHECK(writable_maps("dlshare:imm/sealed") == 1);
	CHILD_OK(dlshare_seal(w, NULL, NULL));
	CHILD_CHECK(writable_maps("dlshare:imm/sealed") == 0);

	/* A writable mapping that lives on in another process (here a fork
	 * that inherited it) makes the seal fail, and nothing is published.
	 * The library keeps its mappings from children (MADV_DONTFORK,
	 * test_fork): undone here, so that this one is inherited. */
	CHILD_OK(dlshare_create(c, "imm/busy", &spec, 1, NULL, &w));
	CHILD_CHECK(madvise(dlshare_writer_tensor(w, 0)->data,
			    util_nbytes(DT_U8, 2, shape), MADV_DOFORK) == 0);
	keeper = harness_fork();
	CHILD_CHECK(keeper >= 0);
	if (keeper == 0) {
		pause();
		_exit(0);
	}
	{
		dlshare_stats s0, s1, s2;

		/* Requests the daemon served: two Stats in a row, as a
		 * baseline; then around the seal, which the library's own
		 * F_SEAL_WRITE refuses: only its Abort goes (the daemon's
		 * seal would be refused too, after another wait for pins). */
		CHILD_OK(dlshare_stats_get(c, &s0));
		CHILD_OK(dlshare_stats_get(c, &s1));
		CHILD_ERR(dlshare_seal(w, NULL, NULL), DLSHARE_EBUSY);
		/* The reason, not the abort's that followed. */
		CHILD_CHECK(strstr(dlshare_last_error(), "seal imm/busy"));
		CHILD_CHECK(strstr(dlshare_last_error(), "writable mapping"));
		CHILD_OK(dlshare_stats_get(c, &s2));
		CHILD_CHECK(s2.requests - s1.requests ==
			    (s1.requests - s0.requests) + 1);
	}
	kill(keeper, SIGKILL);
	CHILD_CHECK(harness_wait(keeper) == 128 + SIGKILL);
	CHILD_ERR(dlshare_stat(c, "imm/busy", &info, NULL), DLSHARE_ENOENT);
	dlshare_disconnect(c);
	return 0;
}

/* Opens the daemon's memfd of label through /proc/PID/fd and checks that it
 * carries the write seal and cannot be written or mapped writable. */
static int reopen_checker(const struct daemon_proc *d, void *arg)
{
	const char *label = arg;
	char p[64], link[256];
	int found = 0;

	for (int fd = 0; fd < 4096 && !found; fd++) {
		ssize_t n;
		int rw, seals;
		void *map;

		snprintf(p, sizeof(p), "/proc/%d/fd/%d", (int)d->pid, fd);
		n = readlink(p, link, sizeof(link) - 1);
		if (n < 0)
			continue;
		link[n] = '\0';
		if (!strstr(link, label))
			continue;
		found = 1;
		rw = open(p, O_RDWR | O_CLOEXEC);
		if (rw < 0) {
			/* No access to another process's fds here (a
			 * ptrace policy): nothing more to check. */
			fprintf(stderr, "open %s: %s; skipped\n", p,
				strerror(errno));
			return 0;
		}
		seals = fcntl(rw, F_GET_SEALS);
		CHILD_CHECK(seals >= 0);
		CHILD_CHECK(seals & F_SEAL_WRITE);
		CHILD_CHECK(seals & F_SEAL_SHRINK);
		CHILD_CHECK(seals & F_SEAL_GROW);
		map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
		CHILD_CHECK(map == MAP_FAILED);
		CHILD_CHECK(pwrite(rw, "x", 1, 0) < 0);
		CHILD_CHECK(ftruncate(rw, 0) < 0);
		close(rw);
	}
	CHILD_CHECK(found);
	return 0;
}

static void sealed_means_immutable(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct writer_arg w = { "imm/sealed", 0 };

	assert_int_equal(util_wait(util_spawn(&fx->d, sealing_producer, NULL)), 0);
	assert_int_equal(util_get_check(c, "imm/sealed", NULL, DT_U8, 2, shape,
					7, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, scribbler, &w)),
			 128 + SIGSEGV);
	assert_int_equal(util_wait(util_spawn(&fx->d, reopen_checker,
					      "dlshare:imm/sealed")), 0);
	assert_int_equal(util_get_check(c, "imm/sealed", NULL, DT_U8, 2, shape,
					7, NULL), 0);
	/* The refused version left nothing behind. */
	struct util_want want = UTIL_ANY;
	want.names = 1;
	want.versions = 1;
	want.buffers = 1;
	want.leases = 0;
	util_assert_want(c, &want);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(readers_cannot_write, setup, teardown),
		cmocka_unit_test_setup_teardown(sealed_means_immutable, setup, teardown),
	};

	return cmocka_run_group_tests_name("immutable", tests, NULL, NULL);
}
