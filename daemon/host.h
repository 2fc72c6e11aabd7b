/* host — the host buffer backend: memfds sealed against resizing from
 * birth, write-sealed when their version is sealed, and the checks an fd from
 * a peer must pass. Plain system calls, any thread.
 */
#ifndef DLSHARE_HOST_H
#define DLSHARE_HOST_H

#include <stdint.h>

#ifdef F_SEAL_FUTURE_WRITE
#define HOST_SEAL_FUTURE_WRITE F_SEAL_FUTURE_WRITE
#else
#define HOST_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* Seals every host buffer carries from birth. */
#define HOST_SEALS_BIRTH (F_SEAL_SHRINK | F_SEAL_GROW)

/* Makes a memfd of size bytes named after name, with HOST_SEALS_BIRTH.
 * Returns the fd (O_CLOEXEC), or -EINVAL, -EMFILE, -ENOMEM, -errno. */
int host_create(const char *name, uint64_t size);

/* Forbids writes for good (F_SEAL_WRITE). Returns 0, or -EBUSY while some
 * process still has a writable shared mapping of it, or -errno. */
int host_seal_write(int fd);

/* Forbids new writable mappings and write() (F_SEAL_FUTURE_WRITE), keeping
 * the mappings that exist. Best effort: returns 0 or -errno. */
int host_seal_future_write(int fd);

/* A read-only fd of the same memfd (a reopen through /proc/self/fd), for
 * readers: before Linux 6.7 a shared mapping of a write-sealed memfd is
 * refused when the fd is open read-write, even with PROT_READ. Returns the
 * fd, or -errno (the caller then hands out fd itself). */
int host_reopen_ro(int fd);

/* Accepts an fd from a peer only when it is a memfd carrying
 * HOST_SEALS_BIRTH, at least size bytes long, and still open to a write
 * seal (no F_SEAL_SEAL unless already write-sealed). Returns 0 or -EINVAL. */
int host_check_fd(int fd, uint64_t size);

#endif
