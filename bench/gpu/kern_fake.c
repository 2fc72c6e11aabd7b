/* kern_fake — the benchmark's device work for tests/fakecuda (see kern.h):
 * the fake has no kernels, but its device memory is host memory and its
 * streams run host functions in order, so each "kernel" is a host function
 * queued with cudaLaunchHostFunc that works on the memory directly. */
#include "kern.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

struct job {
	uint64_t *p;
	size_t words;
	uint64_t seed;
	unsigned long long *bad;
	uint64_t ns;
};

const char *kern_kind(void)
{
	return "host functions (fakecuda)";
}

cudaError_t kern_init(int dev)
{
	(void)dev;
	return cudaSuccess;
}

/* The job is freed by the host function; if the launch fails, here. */
static cudaError_t launch(cudaStream_t s, cudaHostFn_t fn, struct job *j)
{
	cudaError_t e;

	if (!j)
		return cudaErrorMemoryAllocation;
	e = cudaLaunchHostFunc(s, fn, j);
	if (e != cudaSuccess)
		free(j);
	return e;
}

static void fill_fn(void *arg)
{
	struct job *j = arg;

	for (size_t i = 0; i < j->words; i++)
		j->p[i] = kern_pattern(i, j->seed);
	free(j);
}

static void check_fn(void *arg)
{
	struct job *j = arg;
	unsigned long long bad = 0;

	for (size_t i = 0; i < j->words; i++)
		bad += j->p[i] != kern_pattern(i, j->seed);
	*j->bad += bad;
	free(j);
}

static void spin_fn(void *arg)
{
	struct job *j = arg;
	struct timespec ts = { (time_t)(j->ns / 1000000000u),
			       (long)(j->ns % 1000000000u) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	free(j);
}

cudaError_t kern_fill(void *p, size_t n, uint64_t seed, cudaStream_t s)
{
	struct job *j = calloc(1, sizeof(*j));

	if (j) {
		j->p = p;
		j->words = n / 8;
		j->seed = seed;
	}
	return launch(s, fill_fn, j);
}

cudaError_t kern_check(const void *p, size_t n, uint64_t seed,
		       unsigned long long *bad, cudaStream_t s)
{
	struct job *j = calloc(1, sizeof(*j));

	if (j) {
		/* Read only; the cast only fits the shared job struct. */
		j->p = (uint64_t *)(uintptr_t)p;
		j->words = n / 8;
		j->seed = seed;
		j->bad = bad;
	}
	return launch(s, check_fn, j);
}

cudaError_t kern_spin(uint64_t ns, cudaStream_t s)
{
	struct job *j = calloc(1, sizeof(*j));

	if (j)
		j->ns = ns;
	return launch(s, spin_fn, j);
}
