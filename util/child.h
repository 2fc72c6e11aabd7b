/* child — child processes tied to their parent, for the programs around
 * dlshare that start others (the test harness, the benchmarks): a fork
 * whose child dies with its parent, and a wait that gives one status.
 * Any thread.
 */
#ifndef DLSHARE_CHILD_H
#define DLSHARE_CHILD_H

#include <sys/types.h>

/* fork() whose child gets SIGKILL when its parent dies (PR_SET_PDEATHSIG;
 * a child whose parent died before that took hold exits 99 at once), so
 * that no child outlives a test or a benchmark that crashed. Returns as
 * fork(). */
pid_t child_fork(void);

/* Waits for child pid, through EINTR. Returns its exit status, 128 + the
 * signal that killed it, or -1 when it cannot be waited for. */
int child_wait(pid_t pid);

/* Stops child pid: SIGTERM, then up to timeout_ms for it to exit (looked
 * at every step_ms), then SIGKILL. It is reaped either way. Returns its
 * exit status, or -1 when a signal ended it (SIGKILL included) or it
 * cannot be waited for. */
int child_stop(pid_t pid, int timeout_ms, int step_ms);

#endif
