/* chan — the request channel's memory and wakeups (protocol 1.9). */
#include "chan.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Shared futexes (not FUTEX_PRIVATE_FLAG): the word is in a memfd both
 * processes map, and the kernel keys it by the file and offset. */
void chan_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

int chan_wait(_Atomic uint32_t *w, uint32_t v, int ms)
{
	struct timespec ts = {
		.tv_sec = ms / 1000,
		.tv_nsec = (long)(ms % 1000) * 1000000,
	};

	/* By syscall(2): no cancellation point (client/internal.h,
	 * CALL_UNCANCELLED), as the library's socket I/O. */
	if (syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0) == 0)
		return 0;
	if (errno == EAGAIN)
		return 0; /* *w no longer held v */
	return errno == ETIMEDOUT ? -ETIMEDOUT : -EINTR;
}

int chan_drain(int efd)
{
	uint64_t v;
	struct iovec io = { &v, sizeof(v) };

	/* RWF_NOWAIT: the eventfd is one open file for both processes, and
	 * the peer may have cleared its O_NONBLOCK (and read it empty since
	 * the loop saw it readable); this read never blocks whatever the
	 * file's flags say. */
	if (preadv2(efd, &io, 1, -1, RWF_NOWAIT) == (ssize_t)sizeof(v))
		return 0;
	return errno == EAGAIN ? 0 : -errno;
}

int chan_supported(void)
{
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), err;

	if (fd < 0)
		return -errno;
	err = chan_drain(fd);
	close(fd);
	return err;
}

int chan_make(void **base, int *mfd, int *efd)
{
	int fd, ev, err;
	void *m = MAP_FAILED;

	/* Not a pipe, whose write end would raise SIGPIPE in a client
	 * writing after the daemon died; an eventfd's write never does. Made
	 * first: the memfd, closed once sent, then leaves no hole below the
	 * eventfd's number. */
	ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ev < 0)
		return -errno;
	fd = memfd_create("dlshare:channel", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto fail;
	/* Sealed at its size before anyone else has it: a peer's ftruncate
	 * would otherwise turn the daemon's next access into a SIGBUS. */
	if (ftruncate(fd, CHAN_BYTES) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
		  F_SEAL_SEAL) < 0)
		goto fail;
	m = mmap(NULL, CHAN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		goto fail;
	*base = m;
	*mfd = fd;
	*efd = ev;
	return 0;
fail:
	err = -errno;
	if (fd >= 0)
		close(fd);
	close(ev);
	return err;
}
