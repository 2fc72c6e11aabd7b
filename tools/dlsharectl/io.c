/* io — dlsharectl's reads and writes. */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

/* ---- I/O -------------------------------------------------------------- */

/* Waits until fd is ready, for descriptors the caller left non-blocking. */
static int wait_fd(int fd, short events)
{
	struct pollfd pfd = { .fd = fd, .events = events };

	if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

/* Writes all of buf to fd, across short writes and EINTR.
 * Returns 0 or -errno (-EPIPE when the reader went away). */
int ctl_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	ssize_t n;
	int err;

	while (len > 0) {
		n = write(fd, p, len < CTL_IO_CHUNK ? len : CTL_IO_CHUNK);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			err = wait_fd(fd, POLLOUT);
			if (err < 0)
				return err;
			continue;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads into buf until it is full or the input ends; *got says how much.
 * Returns 0 or -errno. */
int ctl_read_full(int fd, void *buf, size_t len, size_t *got)
{
	char *p = buf;
	size_t have = 0;
	ssize_t n;
	int err;

	while (have < len) {
		size_t want = len - have;

		if (want > CTL_IO_CHUNK)
			want = CTL_IO_CHUNK;
		n = read(fd, p + have, want);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			err = wait_fd(fd, POLLIN);
			if (err < 0)
				return err;
			continue;
		}
		if (n == 0)
			break;
		have += (size_t)n;
	}
	*got = have;
	return 0;
}

/* Gathers small pieces (single elements of a strided tensor) into large
 * writes: a write() per element would cost a system call per few bytes. */
struct outbuf {
	int fd;
	size_t used;
	char buf[1 << 16];
};

static int outbuf_flush(struct outbuf *ob)
{
	int err = ctl_write_all(ob->fd, ob->buf, ob->used);

	ob->used = 0;
	return err;
}

static int outbuf_put(struct outbuf *ob, const void *p, size_t len)
{
	int err;

	if (len > sizeof(ob->buf) - ob->used) {
		err = outbuf_flush(ob);
		if (err < 0)
			return err;
		/* Long runs (whole rows) go out without a copy. */
		if (len >= sizeof(ob->buf))
			return ctl_write_all(ob->fd, p, len);
	}
	memcpy(ob->buf + ob->used, p, len);
	ob->used += len;
	return 0;
}

/* Writes the elements of a non-compact tensor in row-major order: an
 * odometer over the outer dimensions, a run along the innermost one. Strides
 * are in elements and may be negative; base is data + byte_offset.
 * Only for tensors with ndim >= 1 and at least one element.
 * Returns 0 or -errno. */
int ctl_write_strided(int fd, const char *base, const DLTensor *t,
			 size_t esz)
{
	int64_t idx[CTL_MAX_NDIM] = { 0 };
	int32_t nd = t->ndim;
	int64_t inner_n = t->shape[nd - 1];
	int64_t inner_s = t->strides[nd - 1];
	int64_t off = 0;	/* element offset of idx[], inner index 0 */
	struct outbuf *ob;
	int32_t d;
	int64_t j;
	int err = 0;

	/* 64 KiB: better on the heap than on the stack of a small tool. */
	ob = malloc(sizeof(*ob));
	if (!ob)
		return -ENOMEM;
	ob->fd = fd;
	ob->used = 0;

	for (;;) {
		const char *row = base + off * (int64_t)esz;

		if (inner_s == 1) {
			err = outbuf_put(ob, row, (size_t)inner_n * esz);
		} else {
			int64_t step = inner_s * (int64_t)esz;

			for (j = 0; j < inner_n && err == 0; j++)
				err = outbuf_put(ob, row + j * step, esz);
		}
		if (err < 0)
			goto out;

		for (d = nd - 2; d >= 0; d--) {
			if (++idx[d] < t->shape[d]) {
				off += t->strides[d];
				break;
			}
			off -= (t->shape[d] - 1) * t->strides[d];
			idx[d] = 0;
		}
		if (d < 0)
			break;
	}
	err = outbuf_flush(ob);
out:
	free(ob);
	return err;
}
