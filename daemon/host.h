/* host — the host buffer backend: memfds sealed against resizing from
 * birth, write-sealed when their version is sealed, and the checks an fd from
 * a peer must pass. Plain system calls, any thread.
 */
#ifndef DLSHARE_HOST_H
#define DLSHARE_HOST_H

#include <errno.h>
#include <stdint.h>

#ifdef F_SEAL_FUTURE_WRITE
#define HOST_SEAL_FUTURE_WRITE F_SEAL_FUTURE_WRITE
#else
#define HOST_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* Seals every host buffer carries from birth. */
#define HOST_SEALS_BIRTH (F_SEAL_SHRINK | F_SEAL_GROW)

/* host_create: the buffer's pages could not be allocated (the memory
 * cgroup's limit, or the machine's memory). An errno no other step of
 * host_create gives, so that the reply can say so. */
#define HOST_ENOBACK (-ENOSR)

/* The huge page size store buffers may use. */
#define HOST_HUGE_PAGE (UINT64_C(2) << 20)

/* Makes a memfd of at least size bytes named after name, with
 * HOST_SEALS_BIRTH; *actual is its size. From huge_min bytes on (0: never)
 * it is made of HOST_HUGE_PAGE pages, size rounded up, when the kernel's
 * pool (vm.nr_hugepages) has them free: sealing and unmapping then cost
 * 512 times fewer page-table entries. Else of normal pages, exactly size.
 * Its pages are allocated here (fallocate; huge pages are reserved), and
 * charged to the calling process's memory cgroup: this can take a while
 * for a large buffer (about 0.1 s per GiB), so not on the loop.
 * Returns the fd (O_CLOEXEC), or HOST_ENOBACK (no memory for its pages),
 * -EINVAL, -EMFILE, -ENOMEM, -errno. */
int host_create(const char *name, uint64_t size, uint64_t huge_min,
		uint64_t *actual);

/* Forbids writes for good (F_SEAL_WRITE). The kernel waits up to ~150 ms
 * while pages of the file are pinned (vmsplice, O_DIRECT, RDMA), and a
 * peer can pin them: never on the loop. Returns 0, or -EBUSY while some
 * process still has a writable shared mapping of it or pinned pages, or
 * -errno. */
int host_seal_write(int fd);
/* 1 when fd is write-sealed already (F_SEAL_WRITE: the producer added it
 * itself), else 0. One F_GET_SEALS, which never waits. */
int host_write_sealed(int fd);

/* Forbids new writable mappings and write() (F_SEAL_FUTURE_WRITE), keeping
 * the mappings that exist; nothing to do when fd is write-sealed already.
 * Returns 0 or -errno (-EPERM when fd is not open for writing, -EINVAL
 * before Linux 5.1). */
int host_seal_future_write(int fd);

/* A read-only fd of the same memfd (a reopen through /proc/self/fd), for
 * readers: before Linux 6.7 a shared mapping of a write-sealed memfd is
 * refused when the fd is open read-write, even with PROT_READ. Returns the
 * fd, or -errno (the caller then hands out fd itself). */
int host_reopen_ro(int fd);

/* Accepts an fd from a peer only when it is a memfd open read-write (a
 * seal can only be added through a writable fd) carrying HOST_SEALS_BIRTH,
 * at least size bytes long, and still open to a write seal (no F_SEAL_SEAL
 * unless already write-sealed). Returns 0, or -EBADF with *why saying what
 * is wrong (a static string, for the peer). */
int host_check_fd(int fd, uint64_t size, const char **why);

#endif
