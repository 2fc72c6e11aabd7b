/* host — memfd buffers. */
#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int host_create(const char *name, uint64_t size)
{
	char label[64];
	int fd, err;

	if (size > INT64_MAX)
		return -EINVAL;
	/* The label shows in /proc/PID/fd and maps; it need not be unique. */
	snprintf(label, sizeof(label), "dlshare:%s", name);
	fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, HOST_SEALS_BIRTH) < 0) {
		err = -errno;
		close(fd);
		return err == -EFBIG ? -EINVAL : err;
	}
	return fd;
}

int host_seal_write(int fd)
{
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0)
		return -errno;
	return 0;
}

int host_seal_future_write(int fd)
{
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

int host_check_fd(int fd, uint64_t size)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return -EINVAL;
	/* Only memfds (and sealable shmem files) answer F_GET_SEALS. */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & HOST_SEALS_BIRTH) != HOST_SEALS_BIRTH)
		return -EINVAL;
	/* With F_SEAL_SEAL and no write seal, the daemon could not stop
	 * readers from mapping it writable (host_seal_future_write). */
	if ((seals & F_SEAL_SEAL) &&
	    !(seals & (F_SEAL_WRITE | HOST_SEAL_FUTURE_WRITE)))
		return -EINVAL;
	if (st.st_size < 0 || (uint64_t)st.st_size < size)
		return -EINVAL;
	return 0;
}
