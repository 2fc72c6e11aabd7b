/* util — what the benchmark programs share: a monotonic clock, samples and
 * their percentiles, children that die with their parent, a dlshared in a
 * fresh mkdtemp directory, and the few /proc readings the figures need.
 *
 * No dlshare code here: the floor program links this too, and must measure
 * the kernel alone. Single-threaded callers only.
 */
#ifndef DLSHARE_BENCH_UTIL_H
#define DLSHARE_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "child.h"

/* CLOCK_MONOTONIC in nanoseconds; comparable across processes. */
uint64_t util_now_ns(void);
/* CPU time the main thread of pid (0: this process) has run, in ns, from
 * /proc/PID/schedstat; 0 where that cannot be read. */
uint64_t util_cpu_ns(pid_t pid);
void util_sleep_ms(int ms);

/* A growable array of doubles. */
struct samples {
	double *v;
	size_t n, cap;
};

/* Appends x; returns 0 or -ENOMEM. */
int samples_add(struct samples *s, double x);
void samples_clear(struct samples *s);
void samples_free(struct samples *s);
/* The q-quantile (0..1, nearest rank) of s, sorting s in place; 0 when
 * empty. */
double samples_quantile(struct samples *s, double q);
double samples_min(const struct samples *s);
double samples_max(const struct samples *s);

/* child_fork() (util/child.h: the child gets SIGKILL when its parent
 * dies), after flushing stdio. Returns as fork(). Wait with child_wait(). */
pid_t util_fork(void);

/* How util_spawn sets up a child's standard fds and environment. With
 * all zero the child inherits ours. */
struct util_spawn_io {
	int *out;               /* stdout into a pipe; its read end here */
	const char *log;        /* stderr into this file (made, truncated) */
	int log_stdout;         /* and stdout into log too */
	int quiet;              /* stdin and any stdout not redirected from
				 * and to /dev/null, and no fd above 2 */
	const char *const *env; /* NAME, VALUE, ..., NULL: set in the child
				 * (a NULL VALUE leaves NAME as it is) */
};

/* Starts the program argv[0] (a path) with argv as util_fork's child,
 * set up as io says (may be NULL). Returns its pid, or -1 with nothing
 * left open. Wait with child_wait(). */
pid_t util_spawn(const char *const *argv, const struct util_spawn_io *io);

/* Runs argv (with env as in struct util_spawn_io, may be NULL) to its end
 * and keeps its stdout in out (cap bytes with the NUL; the rest is read
 * and dropped; "" if it cannot be read). Returns its exit status
 * (child_wait), or -1 when it cannot be started. */
int util_run_capture(const char *const *argv, const char *const *env,
		     char *out, size_t cap);

/* Raises RLIMIT_NOFILE (soft and, when allowed, hard) to at least want.
 * Returns the soft limit in effect afterwards. */
uint64_t util_raise_nofile(uint64_t want);

/* b in the largest binary unit that divides it ("1" sep "GiB", "MiB",
 * "KiB", else "B"), in buf; returns buf. sep: "" for keys, " " for
 * labels. */
const char *util_size_name(uint64_t b, const char *sep, char *buf,
			   size_t cap);

/* 1 when the comma-separated list has item as one of its entries (a NULL
 * list has every item): a benchmark's --only. */
int util_list_has(const char *list, const char *item);

/* Reads "Key:   N kB" from /proc/PID/status (pid 0: self) in bytes, or 0. */
uint64_t util_proc_status_bytes(pid_t pid, const char *key);
/* Reads "Key:   N kB" from /proc/meminfo in bytes, or 0. */
uint64_t util_meminfo_bytes(const char *key);

/* Reads everything a pipe end gives until EOF into buf (NUL-terminated).
 * Returns the length or -1. */
ssize_t util_read_all(int fd, char *buf, size_t cap);
/* Writes all of buf; returns 0 or -1. */
int util_write_all(int fd, const void *buf, size_t len);

/* ---- a dlshared of our own --------------------------------------------- */

struct daemon_proc {
	pid_t pid;
	char dir[64];
	char sock[108];
	char log[96];
};

/* Sets the daemon binary (once). Its --help is read to know which options
 * this build takes, so the benchmarks run on older and newer daemons. */
int daemon_setup(const char *bin);
/* 1 when the daemon takes --NAME. */
int daemon_has_option(const char *name);

/* Starts dlshared on a socket in a fresh /tmp directory with the extra
 * "--option", "value" pairs given (NULL-ended; options this daemon does not
 * know are skipped), waits until it accepts. Returns 0 or -1 (said on
 * stderr, with the daemon's log). */
int daemon_start(struct daemon_proc *d, const char *const *extra);
/* SIGTERM, wait, remove the directory. Returns the exit status or -1. */
int daemon_stop(struct daemon_proc *d);
/* Prints the last lines of the daemon's log on stderr. */
void daemon_log_tail(const struct daemon_proc *d);
/* Connects a raw SOCK_SEQPACKET socket to d (blocking, CLOEXEC).
 * Returns the fd or -errno. */
int daemon_connect_raw(const struct daemon_proc *d);

/* Kills every daemon started and not yet stopped (from an atexit handler
 * or a signal). */
void daemon_stop_all(void);
/* For a benchmark program's main: SIGINT, SIGTERM, SIGHUP and SIGALRM
 * kill every daemon started (daemon_stop_all) and then end the program
 * with that signal; SIGPIPE is ignored; alarm(alarm_s) bounds the whole
 * run, whatever happens (the children die with us). */
void daemon_stop_on_signals(unsigned alarm_s);

#endif
