/* host — memfd buffers. */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT */
#endif

/* A memfd of 2 MiB huge pages holding size bytes, rounded up, with its
 * pages reserved from the kernel's pool; or -1 (the pool is short, or the
 * kernel says no): the caller then makes a normal one. */
static int host_create_huge(const char *label, uint64_t size,
			    uint64_t *actual)
{
	uint64_t rounded;
	void *p;
	int fd;

	if (size > INT64_MAX - HOST_HUGE_PAGE)
		return -1;
	rounded = (size + HOST_HUGE_PAGE - 1) / HOST_HUGE_PAGE * HOST_HUGE_PAGE;
	fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB |
			  MFD_HUGE_2MB);
	if (fd < 0)
		return -1;
	/* A shared mapping reserves the file's pages from the pool, and the
	 * reservation stays with the file: a producer's mapping later cannot
	 * fail for want of pages (SIGBUS on a write). */
	if (ftruncate(fd, (off_t)rounded) < 0 ||
	    (p = mmap(NULL, rounded, PROT_READ, MAP_SHARED, fd, 0)) ==
		    MAP_FAILED ||
	    munmap(p, rounded) < 0 ||
	    fcntl(fd, F_ADD_SEALS, HOST_SEALS_BIRTH) < 0) {
		close(fd);
		return -1;
	}
	*actual = rounded;
	return fd;
}

int host_create(const char *name, uint64_t size, uint64_t huge_min,
		uint64_t *actual)
{
	char label[64];
	int fd, err;

	if (size > INT64_MAX)
		return -EINVAL;
	/* The label shows in /proc/PID/fd and maps; it need not be unique. */
	snprintf(label, sizeof(label), "dlshare:%s", name);
	*actual = size;
	if (huge_min && size >= huge_min &&
	    (fd = host_create_huge(label, size, actual)) >= 0)
		return fd;
	fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, HOST_SEALS_BIRTH) < 0) {
		err = -errno;
		close(fd);
		return err == -EFBIG ? -EINVAL : err;
	}
	/* The pages are allocated now, by the daemon, so that they are
	 * charged to its memory cgroup, not to the first process that
	 * touches them (a producer, or a reader of pages nobody wrote), and a
	 * buffer that cannot have them is refused here, before anyone writes,
	 * rather than with a SIGBUS or the OOM killer in a peer later. */
	if (size && fallocate(fd, 0, 0, (off_t)size) < 0) {
		err = -errno;
		close(fd);
		/* ENOSPC: shmem's own accounting (vm.overcommit_memory=2). */
		return err == -ENOSPC || err == -ENOMEM ? HOST_ENOBACK : err;
	}
	return fd;
}

int host_seal_write(int fd)
{
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0)
		return -errno;
	return 0;
}

int host_write_sealed(int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);

	return seals >= 0 && (seals & F_SEAL_WRITE);
}

int host_seal_future_write(int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return -errno;
	if (seals & (F_SEAL_WRITE | HOST_SEAL_FUTURE_WRITE))
		return 0;
	if (fcntl(fd, F_ADD_SEALS, HOST_SEAL_FUTURE_WRITE) < 0)
		return -errno;
	return 0;
}

int host_reopen_ro(int fd)
{
	char path[64];
	int ro;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	return ro < 0 ? -errno : ro;
}

int host_check_fd(int fd, uint64_t size, const char **why)
{
	struct stat st;
	int seals, flags;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		*why = "not a memfd";
		return -EBADF;
	}
	/* Only memfds (and sealable shmem files) answer F_GET_SEALS. */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		*why = "not a memfd";
		return -EBADF;
	}
	if ((seals & HOST_SEALS_BIRTH) != HOST_SEALS_BIRTH) {
		*why = "the memfd lacks F_SEAL_SHRINK and F_SEAL_GROW";
		return -EBADF;
	}
	/* F_ADD_SEALS needs an fd open for writing: through a read-only one
	 * the daemon could not add F_SEAL_FUTURE_WRITE, and any reader could
	 * reopen /proc/self/fd/N read-write (memfds are 0777) and change what
	 * everyone reads. */
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
		*why = "the memfd is not open read-write (O_RDWR), so the "
		       "daemon could not seal it";
		return -EBADF;
	}
	/* With F_SEAL_SEAL and no write seal, the daemon could not stop
	 * readers from mapping it writable (host_seal_future_write). */
	if ((seals & F_SEAL_SEAL) &&
	    !(seals & (F_SEAL_WRITE | HOST_SEAL_FUTURE_WRITE))) {
		*why = "the memfd carries F_SEAL_SEAL without a write seal";
		return -EBADF;
	}
	if (st.st_size < 0 || (uint64_t)st.st_size < size) {
		*why = "the memfd is smaller than the buffer";
		return -EBADF;
	}
	return 0;
}
