/* util — what the integration test files share on top of the harness: a
 * per-test fixture (a fresh daemon, a check that the test process leaks no
 * fd), child processes that report through exit codes, tensors filled with
 * a seeded pattern and checked bit for bit, handshakes between processes
 * through the daemon, waits on the daemon's counters, and a raw protocol
 * client for what the library would never send.
 *
 * Children must never use cmocka's asserts (a failed one would unwind into
 * the child's copy of the test runner): they use CHILD_* and end with
 * _exit(). Test thread only, except where a function says otherwise.
 */
#ifndef DLSHARE_TEST_UTIL_H
#define DLSHARE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "dlshare.pb-c.h"
#include "harness.h"
#include "wire.h"

/* ---- fixture ------------------------------------------------------------ */

struct fixture {
	struct daemon_proc d;
	int self_fds;     /* fds of the test process before the test */
	int check_fds;    /* teardown fails when the count changed */
};

/* Starts a daemon with extra arguments (NULL-ended, may be NULL) into a new
 * fixture in *state. Returns 0 or -1 (cmocka then skips the test). */
int util_setup(void **state, const char *const *extra);
/* The same, and the teardown also checks the test process's fd count. */
int util_setup_fdcheck(void **state, const char *const *extra);
/* util_setup_fdcheck for a daemon every uid can reach: socket 0666 in a
 * 0711 directory (the uid tests' setup). */
int util_setup_open(void **state, const char *const *extra);
/* Kills children still running, stops the daemon and fails unless it
 * exited 0 (and, with the fd check, unless no fd leaked). */
int util_teardown(void **state);

/* ---- children ------------------------------------------------------------ */

#define CHILD_FAIL(...)                                                       \
	do {                                                                  \
		fprintf(stderr, "%s:%d: child %d: ", __FILE__, __LINE__,      \
			(int)getpid());                                       \
		fprintf(stderr, __VA_ARGS__);                                 \
		fputc('\n', stderr);                                          \
		_exit(1);                                                     \
	} while (0)

#define CHILD_CHECK(cond)                                                     \
	do {                                                                  \
		if (!(cond))                                                  \
			CHILD_FAIL("check failed: %s", #cond);                \
	} while (0)

/* expr must return 0 (a dlshare call). */
#define CHILD_OK(expr)                                                        \
	do {                                                                  \
		int e_ = (expr);                                              \
		if (e_)                                                       \
			CHILD_FAIL("%s = %d (%s) [%s]", #expr, e_,            \
				   dlshare_strerror(e_),                      \
				   dlshare_last_error());                     \
	} while (0)

/* expr must return the dlshare code want. */
#define CHILD_ERR(expr, want)                                                 \
	do {                                                                  \
		int e_ = (expr);                                              \
		if (e_ != (want))                                             \
			CHILD_FAIL("%s = %d (%s), want %d (%s)", #expr, e_,   \
				   dlshare_strerror(e_), (int)(want),         \
				   dlshare_strerror(want));                   \
	} while (0)

typedef int (*util_child_fn)(const struct daemon_proc *d, void *arg);

/* Forks a child (which dies with us) that runs fn and _exit()s with its
 * return value. Returns the pid; fails the test if fork fails. */
pid_t util_spawn(const struct daemon_proc *d, util_child_fn fn, void *arg);
/* harness_wait(), and forgets the child. */
int util_wait(pid_t pid);
/* Reaps the child if it has exited: returns 1 with its status as
 * harness_wait() gives it in *status (and forgets it), else 0. */
int util_exited(pid_t pid, int *status);
/* SIGKILLs a child and reaps it. */
void util_kill(pid_t pid);

/* ---- other uids ------------------------------------------------------------ */

/* Uids (and their primary groups) that children become when the test runs
 * as root; nobody needs to exist in /etc/passwd for the kernel. */
#define UTIL_UID_A 23466u
#define UTIL_UID_B 23467u

/* In a child: becomes uid/gid, with no supplementary group, for good, and
 * still dies with its parent. Returns 0 or -1. */
int util_become(uid_t uid, gid_t gid);
/* 1 when this process may run children as other uids (it is root). */
int util_can_switch_uids(void);
/* util_spawn, the child running fn as uid/gid (as util_spawn when uid is
 * ours). */
pid_t util_spawn_as(const struct daemon_proc *d, uid_t uid, gid_t gid,
		    util_child_fn fn, void *arg);

/* In a child: connects to d, or _exit(1). */
dlshare_client *util_child_connect(const struct daemon_proc *d);

/* ---- data ------------------------------------------------------------------ */

#define DT(c, b) ((DLDataType){ .code = (uint8_t)(c), .bits = (uint8_t)(b), .lanes = 1 })
#define DT_F32 DT(kDLFloat, 32)
#define DT_F64 DT(kDLFloat, 64)
#define DT_I64 DT(kDLInt, 64)
#define DT_I32 DT(kDLInt, 32)
#define DT_U8 DT(kDLUInt, 8)
#define DT_I16 DT(kDLInt, 16)

/* Compact bytes of a tensor (no overflow checks: test shapes only). */
size_t util_nbytes(DLDataType dt, int ndim, const int64_t *shape);

/* Publishes one tensor in store mode, filled with harness_fill(seed).
 * Returns 0 or a dlshare code. */
int util_store(dlshare_client *c, const char *name, DLDataType dt, int ndim,
	       const int64_t *shape, uint32_t seed, uint64_t *version);

/* Publishes one tensor in export mode (dlshare_host_alloc memory, filled
 * with harness_fill(seed)), with DLSHARE_PUBLISH_NO_COPY. When slot is not
 * NULL the tensor's deleter is tracked (util_track) and *slot names it.
 * Returns 0 or a dlshare code. */
int util_export(dlshare_client *c, const char *name, DLDataType dt, int ndim,
		const int64_t *shape, uint32_t seed, uint64_t *version,
		int *slot);

/* Counts the runs of t's deleter (which still calls the original one) under
 * a slot number that stays valid after t is freed. Any thread may run the
 * deleter. Returns the slot, or -1 past 1024 tensors per process. */
int util_track(DLManagedTensor *t);
/* How often the deleter tracked in slot ran. Any thread. */
int util_deleted(int slot);
/* Polls until the deleter tracked in slot ran want times, up to a scaled
 * 5 s. Returns the last count. */
int util_wait_deleted(int slot, int want);

/* Checks a tensor: CPU, dtype, shape, strides NULL (compact), and the bytes
 * of harness_fill(seed). Returns 0, or 1 after saying what differs on
 * stderr. */
int util_check(const DLTensor *t, DLDataType dt, int ndim,
	       const int64_t *shape, uint32_t seed);

/* get + check of tensor 0 + free. Returns 0, a dlshare code, or 1. The
 * version got goes to *version when not NULL. */
int util_get_check(dlshare_client *c, const char *name,
		   const dlshare_get_opts *opts, DLDataType dt, int ndim,
		   const int64_t *shape, uint32_t seed, uint64_t *version);

/* ---- handshakes through the daemon ----------------------------------------- */

/* Publishes value (a 0-d int64) as a new version of name. Returns 0 or a
 * dlshare code. */
int util_post(dlshare_client *c, const char *name, int64_t value);
/* Waits up to timeout_ms for a version of name newer than after and reads
 * its value (may be NULL). Returns the version (> 0) or a dlshare code. */
int64_t util_await(dlshare_client *c, const char *name, uint64_t after,
		   int timeout_ms, int64_t *value);

/* Polls dlshare_stat until name exists (no lease taken), up to timeout_ms.
 * Returns 0 or a dlshare code. */
int util_await_name(dlshare_client *c, const char *name, int timeout_ms);

/* ---- the daemon's counters ---------------------------------------------------- */

/* Wanted counters; -1 for "any". */
struct util_want {
	int64_t connections, names, versions, leases, buffers, bytes, parked;
};
#define UTIL_ANY { -1, -1, -1, -1, -1, -1, -1 }

/* Polls stats until every wanted counter matches, up to a scaled 5 s.
 * Returns 0, or -1 (with the last stats in *last when not NULL). */
int util_wait_want(dlshare_client *c, const struct util_want *w,
		   dlshare_stats *last);
/* The same, failing the test (with the counters) on timeout. */
void util_assert_want(dlshare_client *c, const struct util_want *w);
/* Stats or fail the test. */
dlshare_stats util_stats(dlshare_client *c);
/* Makes c ask for its request channel now (protocol 1.9: libdlshare asks
 * once a connection made 32 gets or takes), by gets of a name that does
 * not exist: a test that counts the daemon's fds around c's calls counts
 * the channel's eventfd from the start. */
void util_channel_open(dlshare_client *c);

/* dlshare_limit_hits_total, every row, from the daemon's metrics. */
#define UTIL_HITS_MAX 64
struct util_hits {
	char label[UTIL_HITS_MAX][48];
	uint64_t value[UTIL_HITS_MAX];
	size_t n;
};
/* Reads them into *h, or fails the test. */
void util_limit_hits(dlshare_client *c, struct util_hits *h);
/* The value of the row label, or fails the test when there is none. */
uint64_t util_hits_of(const struct util_hits *h, const char *label);
/* The sum of every row. */
uint64_t util_hits_sum(const struct util_hits *h);

/* Monotonic milliseconds. */
int64_t util_now_ms(void);
void util_sleep_ms(int ms);

/* ---- a raw protocol client ----------------------------------------------------- */

/* Connects a SOCK_SEQPACKET socket to path. Returns the fd or -errno. */
int raw_connect(const char *path);
/* Encodes f (up to 1 MiB, nfds set here) and sends it with fds. Returns 0 or
 * -errno (-EAGAIN with MSG_DONTWAIT in flags when the socket is full). */
int raw_send(int fd, Dlshare__Frame *f, const int *fds, unsigned nfds,
	     int flags);
/* Sends len raw bytes. Returns 0 or -errno. */
int raw_send_bytes(int fd, const void *data, size_t len, const int *fds,
		   unsigned nfds);
/* Waits up to timeout_ms for a packet and decodes it (fds it carried are
 * closed). Returns 0 with *out, 1 when the daemon hung up, -ETIMEDOUT,
 * -EPROTO or -errno. */
int raw_recv(int fd, int timeout_ms, struct wire_msg **out);
/* The same, keeping the packet's first fd in *keep (-1 when none; when
 * keep is not NULL); the others are closed. */
int raw_recv_fd(int fd, int timeout_ms, struct wire_msg **out, int *keep);
/* raw_recv_fd, counting the fds that came with the packet in *count. */
int raw_recv_count(int fd, int timeout_ms, struct wire_msg **out,
		   unsigned *count, int *keep);
/* Says Hello. Returns 0 or -1. */
int raw_hello(int fd);
/* Sends req and waits for the reply with its id (pushes are skipped).
 * Returns 0 with *out, or as raw_recv. */
int raw_call(int fd, Dlshare__Frame *req, const int *fds, unsigned nfds,
	     struct wire_msg **out);
/* Reads until the daemon hangs up, up to timeout_ms. Returns 0 when it did
 * (*code, when not NULL, gets the last Error code seen, else 0), -ETIMEDOUT
 * when it did not. */
int raw_expect_hangup(int fd, int timeout_ms, int *code);
/* A sealed-size memfd of size bytes, as dlshare_host_alloc makes them.
 * Returns the fd or -errno. */
int raw_memfd(uint64_t size, int seals);

/* ---- running programs ------------------------------------------------------------ */

/* Runs argv[0] with stdin from in_path (NULL: /dev/null) and stdout/stderr
 * into out_path/err_path (NULL: /dev/null). Returns its exit status, or 128 +
 * signal. */
int util_run(const char *const *argv, const char *in_path,
	     const char *out_path, const char *err_path);
/* Reads a whole file into a new NUL-terminated buffer (free it); *len gets
 * its size when not NULL. NULL on error. */
char *util_slurp(const char *path, size_t *len);

#endif
