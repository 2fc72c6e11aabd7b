/* copy — a tensor's elements out, compact and row-major: into memory or
 * into a file at an offset, in the fewest and largest contiguous runs its
 * strides allow, and the fresh shared memory they go to populated in bulk.
 * No state but a process-wide answer read once; any thread. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* How far a gather goes before it is written out: small enough to stay
 * in the L2 cache, large enough that a write's system call is noise. */
#define COPY_BOUNCE (256u << 10)
/* Runs at least this long are written from where they are (pwritev)
 * rather than gathered first. */
#define COPY_DIRECT_RUN 4096u
#define COPY_IOV 1024 /* IOV_MAX on Linux */

void copy_runs_init(struct copy_runs *r, const DLTensor *t)
{
	uint64_t elem = check_dtype_size(t->dtype.code, t->dtype.bits,
					 t->dtype.lanes);
	int64_t run = 1;
	int32_t k = t->ndim - 1;

	memset(r, 0, sizeof(*r));
	r->base = (const char *)t->data + t->byte_offset;
	r->count = 1;
	for (int32_t i = 0; i < t->ndim; i++)
		if (t->shape[i] == 0)
			r->count = 0;
	/* The innermost dims whose strides make them one block with the
	 * dims inside them (dims of extent 1 may have any stride) form the
	 * run; what is left is walked. */
	if (t->strides)
		while (k >= 0 && (t->shape[k] == 1 || t->strides[k] == run))
			run *= t->shape[k--];
	else
		for (; k >= 0; k--)
			run *= t->shape[k];
	r->run = (uint64_t)run * elem;
	r->elem = elem;
	for (int32_t i = 0; i <= k; i++) {
		if (t->shape[i] == 1)
			continue;
		r->shape[r->nd] = t->shape[i];
		r->stride[r->nd] = t->strides[i] * (int64_t)elem;
		r->count *= (uint64_t)t->shape[i];
		r->nd++;
	}
	if (r->count == 0 || r->run == 0) {
		r->count = 0;
		r->run = 0;
	}
}

/* Copies the next n runs of it (n <= what is left) to dst, advancing it.
 * Runs of one small element are copied with a constant size, which the
 * compiler turns into one load and store. Returns the bytes copied. */
static uint64_t runs_copy(struct copy_iter *it, char *dst, uint64_t n)
{
	const struct copy_runs *r = it->r;
	uint64_t run = r->run, done = 0;
	int32_t last = r->nd - 1;

	while (n) {
		/* Along the innermost walked dim, up to its end. */
		int64_t left = last >= 0 ? r->shape[last] - it->idx[last] : 1;
		int64_t step = last >= 0 ? r->stride[last] : 0;
		uint64_t m = (uint64_t)left < n ? (uint64_t)left : n;
		const char *p = it->p;

#define RUNS_LOOP(sz)                                                   \
		for (uint64_t j = 0; j < m; j++, p += step, dst += (sz)) \
			memcpy(dst, p, (sz))
		switch (run) {
		case 1: RUNS_LOOP(1); break;
		case 2: RUNS_LOOP(2); break;
		case 4: RUNS_LOOP(4); break;
		case 8: RUNS_LOOP(8); break;
		case 16: RUNS_LOOP(16); break;
		default: RUNS_LOOP(run); break;
		}
#undef RUNS_LOOP
		done += m * run;
		n -= m;
		it->left -= m;
		if (last < 0)
			break;
		it->idx[last] += (int64_t)m;
		it->p += (int64_t)m * step;
		/* Carry into the outer dims. */
		for (int32_t k = last; k > 0 && it->idx[k] == r->shape[k]; k--) {
			it->p -= r->shape[k] * r->stride[k];
			it->idx[k] = 0;
			it->idx[k - 1]++;
			it->p += r->stride[k - 1];
		}
	}
	return done;
}

void copy_iter_init(struct copy_iter *it, const struct copy_runs *r)
{
	memset(it, 0, sizeof(*it));
	it->r = r;
	it->p = r->base;
	it->left = r->count;
}

/* The start of the iterator's next run, and moves past it. */
static const char *runs_next(struct copy_iter *it)
{
	const struct copy_runs *r = it->r;
	const char *p = it->p;

	it->left--;
	for (int32_t k = r->nd - 1; k >= 0; k--) {
		it->p += r->stride[k];
		if (++it->idx[k] < r->shape[k])
			break;
		it->p -= r->shape[k] * r->stride[k];
		it->idx[k] = 0;
	}
	return p;
}

void copy_to_mem(char *dst, const DLTensor *t)
{
	struct copy_runs r;
	struct copy_iter it;

	copy_runs_init(&r, t);
	if (!r.count)
		return;
	if (r.nd == 0) {
		memcpy(dst, r.base, r.run);
		return;
	}
	copy_iter_init(&it, &r);
	runs_copy(&it, dst, r.count);
}

/* pwrite of all len bytes at off. Returns 0 or -errno. */
static int write_all(int fd, const char *p, uint64_t len, uint64_t off)
{
	while (len) {
		size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t n = pwrite(fd, p, chunk, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* Long runs: written from where they lie, up to COPY_IOV per call. */
static int write_direct(int fd, struct copy_iter *it, uint64_t off)
{
	struct iovec iov[COPY_IOV];
	uint64_t run = it->r->run;

	while (it->left) {
		int n = 0;
		ssize_t got;
		uint64_t want = 0;

		while (n < COPY_IOV && it->left && want < (1u << 30)) {
			iov[n].iov_base = (void *)runs_next(it);
			iov[n].iov_len = run;
			want += run;
			n++;
		}
		do
			got = pwritev(fd, iov, n, (off_t)off);
		while (got < 0 && errno == EINTR);
		if (got < 0)
			return -errno;
		if ((uint64_t)got < want) {
			/* Short (rare): the rest of this batch, run by run. */
			uint64_t skip = (uint64_t)got;

			for (int i = 0; i < n; i++) {
				uint64_t from = skip > run ? run : skip;
				int err;

				skip -= from;
				if (from < run &&
				    (err = write_all(fd, (char *)iov[i].iov_base +
						     from, run - from,
						     off + (uint64_t)i * run +
						     from)))
					return err;
			}
		}
		off += want;
	}
	return 0;
}

int copy_to_fd(int fd, uint64_t off, const DLTensor *t)
{
	struct copy_runs r;
	struct copy_iter it;
	char *bounce;
	int err = 0;

	copy_runs_init(&r, t);
	if (!r.count)
		return 0;
	if (r.nd == 0)
		return write_all(fd, r.base, r.run, off);
	copy_iter_init(&it, &r);
	if (r.run >= COPY_DIRECT_RUN)
		return write_direct(fd, &it, off);
	/* Short runs: gathered into a buffer that stays in cache. */
	bounce = malloc(COPY_BOUNCE);
	if (!bounce)
		return -ENOMEM;
	while (it.left && !err) {
		uint64_t n = COPY_BOUNCE / r.run, bytes;

		if (n > it.left)
			n = it.left;
		bytes = runs_copy(&it, bounce, n);
		err = write_all(fd, bounce, bytes, off);
		off += bytes;
	}
	free(bounce);
	return err;
}

/* ---- populating fresh shared memory ----------------------------------- */

static pthread_once_t thp_once = PTHREAD_ONCE_INIT;
static int thp_advise;

/* Whether the kernel gives shared memory transparent huge pages only where
 * a mapping asks for them (shmem_enabled "advise"): then a writable mapping
 * asks. With "always" or "within_size" it gives them anyway, with "never"
 * or "deny" never. */
static void thp_read(void)
{
	char buf[128];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled",
			"re");

	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f))
		thp_advise = strstr(buf, "[advise]") != NULL;
	fclose(f);
}

int copy_shmem_thp_advised(void)
{
	pthread_once(&thp_once, thp_read);
	return thp_advise;
}

void copy_populate(void *p, size_t len)
{
	if (!p || !len)
		return;
	/* Huge pages where the operator allows them on request: 512 times
	 * fewer faults, and readers map them as huge pages too. */
	if (len >= (2u << 20) && copy_shmem_thp_advised())
		madvise(p, len, MADV_HUGEPAGE);
	/* Every page allocated and mapped in one call, not a fault each.
	 * Before Linux 5.14 (EINVAL) the writes fault them in as ever; a
	 * failure for want of memory shows at the first write too. */
	madvise(p, len, MADV_POPULATE_WRITE);
}
