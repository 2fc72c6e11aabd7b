/* harness — what the integration tests share: a real dlshared started in a
 * fresh mkdtemp directory, children that die with their parent, fd counts
 * from /proc, and timeouts that scale from one variable.
 *
 * DLSHARE_TEST_TIMEOUT_SCALE (default 1) multiplies every timeout;
 * DLSHARE_TEST_WRAPPER (e.g. "valgrind --error-exitcode=99 -q") runs the
 * daemon under a wrapper. Test thread only.
 */
#ifndef DLSHARE_TEST_HARNESS_H
#define DLSHARE_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include <dlshare/dlshare.h>

struct daemon_proc {
	pid_t pid;
	char dir[64];
	char sock[108];
	char log[96];
};

/* ms scaled by DLSHARE_TEST_TIMEOUT_SCALE. */
int harness_ms(int ms);

/* Starts dlshared on dir/dlshared.sock with extra arguments (NULL-ended
 * list, may be NULL), waits until a client can connect. Returns 0 or -1. */
int harness_daemon_start(struct daemon_proc *d, const char *const *extra);

/* SIGTERM, wait (the daemon must exit 0), remove the directory. Returns the
 * daemon's exit status, or -1 when it died of a signal or hung. */
int harness_daemon_stop(struct daemon_proc *d);

/* Connects to d; fails the test on error. */
dlshare_client *harness_connect(const struct daemon_proc *d);

/* Open fds of a process (from /proc/PID/fd), or -1. */
int harness_fd_count(pid_t pid);

/* child_fork and child_wait (util/child.h), under the harness's names. */
pid_t harness_fork(void);
int harness_wait(pid_t pid);

/* Polls the daemon's stats until leases == want_leases and connections ==
 * want_conns (-1: any), up to a scaled 5 s. Returns 0, or -1 on timeout
 * (with the last stats in *last when not NULL). */
int harness_wait_stats(dlshare_client *c, int64_t want_leases,
		       int64_t want_conns, dlshare_stats *last);

/* Polls /proc/PID/fd until it holds want fds, up to a scaled 5 s. Returns
 * the last count. */
int harness_wait_fds(pid_t pid, int want);

/* Fills n bytes with a pattern derived from seed. */
void harness_fill(void *p, size_t n, uint32_t seed);

#endif
