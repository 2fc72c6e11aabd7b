/* util — clock, samples, children, daemons. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t util_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t util_cpu_ns(pid_t pid)
{
	char path[64];
	unsigned long long ns = 0;
	FILE *f;

	/* The first field of schedstat: the time the thread ran, in ns (the
	 * main thread's: the daemon's event loop, the floor's server). */
	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/schedstat");
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (fscanf(f, "%llu", &ns) != 1)
		ns = 0;
	fclose(f);
	return (uint64_t)ns;
}

void util_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int samples_add(struct samples *s, double x)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 256;
		double *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = x;
	return 0;
}

void samples_clear(struct samples *s)
{
	s->n = 0;
}

void samples_free(struct samples *s)
{
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double samples_quantile(struct samples *s, double q)
{
	size_t k;

	if (!s->n)
		return 0;
	qsort(s->v, s->n, sizeof(*s->v), cmp_double);
	/* Nearest rank: the smallest value with at least q of the samples at
	 * or below it; for an even count the median is the lower middle. */
	k = (size_t)(q * (double)s->n + 0.999999);
	if (k > 0)
		k--;
	if (k >= s->n)
		k = s->n - 1;
	return s->v[k];
}

double samples_min(const struct samples *s)
{
	double m = s->n ? s->v[0] : 0;

	for (size_t i = 1; i < s->n; i++)
		if (s->v[i] < m)
			m = s->v[i];
	return m;
}

double samples_max(const struct samples *s)
{
	double m = s->n ? s->v[0] : 0;

	for (size_t i = 1; i < s->n; i++)
		if (s->v[i] > m)
			m = s->v[i];
	return m;
}

pid_t util_fork(void)
{
	/* What stdio holds is printed once, not once more by each child. */
	fflush(NULL);
	return child_fork();
}

/* In the child: fd onto target (0-2), or the file path opened with flags
 * when fd < 0. */
static void child_redirect(int fd, const char *path, int flags, int target)
{
	int f = fd >= 0 ? fd : open(path, flags | O_CLOEXEC, 0600);

	if (f < 0)
		return;
	dup2(f, target);
	if (fd < 0)
		close(f);
}

pid_t util_spawn(const char *const *argv, const struct util_spawn_io *io)
{
	static const struct util_spawn_io none = { 0 };
	int p[2] = { -1, -1 };
	pid_t pid;

	if (!io)
		io = &none;
	if (io->out && pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid = util_fork();
	if (pid < 0) {
		if (io->out) {
			close(p[0]);
			close(p[1]);
		}
		return -1;
	}
	if (pid > 0) {
		if (io->out) {
			close(p[1]);
			*io->out = p[0];
		}
		return pid;
	}
	/* The child. setenv is not async-signal-safe, but the benchmarks
	 * fork from one thread (bench/util.h: single-threaded callers). */
	if (io->quiet)
		child_redirect(-1, "/dev/null", O_RDONLY, 0);
	if (io->log)
		child_redirect(-1, io->log, O_WRONLY | O_CREAT | O_TRUNC, 2);
	if (io->out)
		child_redirect(p[1], NULL, 0, 1);
	else if (io->log && io->log_stdout)
		dup2(2, 1);
	else if (io->quiet)
		child_redirect(-1, "/dev/null", O_WRONLY, 1);
	if (io->quiet)
		closefrom(3);
	for (const char *const *e = io->env; e && e[0]; e += 2)
		if (e[1])
			setenv(e[0], e[1], 1);
	execv(argv[0], (char *const *)argv);
	_exit(127);
}

int util_run_capture(const char *const *argv, const char *const *env,
		     char *out, size_t cap)
{
	struct util_spawn_io io = { .env = env };
	char drop[4096];
	int fd;
	pid_t pid;

	io.out = &fd;
	if (cap)
		out[0] = '\0';
	pid = util_spawn(argv, &io);
	if (pid < 0)
		return -1;
	if (util_read_all(fd, out, cap) < 0 && cap)
		out[0] = '\0';
	/* Past cap: read on to the end, so that the child never blocks on
	 * a full pipe while we wait for it. */
	while (util_read_all(fd, drop, sizeof(drop)) > 0)
		;
	close(fd);
	return child_wait(pid);
}

uint64_t util_raise_nofile(uint64_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur >= want)
		return rl.rlim_cur;
	if (rl.rlim_max < want) {
		struct rlimit hard = { want, want };

		/* Only root may raise the hard limit, and only up to
		 * fs.nr_open. */
		if (setrlimit(RLIMIT_NOFILE, &hard) == 0)
			return want;
		want = rl.rlim_max;
	}
	rl.rlim_cur = want;
	setrlimit(RLIMIT_NOFILE, &rl);
	getrlimit(RLIMIT_NOFILE, &rl);
	return rl.rlim_cur;
}

static uint64_t kv_file_bytes(const char *path, const char *key)
{
	char line[256];
	size_t klen = strlen(key);
	uint64_t v = 0;
	FILE *f = fopen(path, "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
			v = strtoull(line + klen + 1, NULL, 10) * 1024;
			break;
		}
	}
	fclose(f);
	return v;
}

uint64_t util_proc_status_bytes(pid_t pid, const char *key)
{
	char path[64];

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	return kv_file_bytes(path, key);
}

uint64_t util_meminfo_bytes(const char *key)
{
	return kv_file_bytes("/proc/meminfo", key);
}

ssize_t util_read_all(int fd, char *buf, size_t cap)
{
	size_t len = 0;

	if (!cap)
		return -1;
	for (;;) {
		ssize_t n = read(fd, buf + len, cap - 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0 || len + (size_t)n >= cap - 1) {
			len += (size_t)n;
			break;
		}
		len += (size_t)n;
	}
	buf[len] = '\0';
	return (ssize_t)len;
}

int util_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---- daemons ------------------------------------------------------------ */

#define DAEMONS_MAX 16

static const char *daemon_bin;
static char *daemon_help;
static struct daemon_proc *live[DAEMONS_MAX];

int daemon_setup(const char *bin)
{
	const char *const argv[] = { bin, "--help", NULL };
	char *buf;

	daemon_bin = bin;
	if (access(bin, X_OK) < 0) {
		fprintf(stderr, "bench: %s: %s\n", bin, strerror(errno));
		return -1;
	}
	buf = malloc(64 * 1024);
	if (buf && util_run_capture(argv, NULL, buf, 64 * 1024) < 0) {
		free(buf);
		buf = NULL;
	}
	daemon_help = buf;
	return buf ? 0 : -1;
}

int daemon_has_option(const char *name)
{
	char opt[80];
	const char *p;
	size_t n;

	if (!daemon_help)
		return 0;
	n = (size_t)snprintf(opt, sizeof(opt), "--%s", name);
	for (p = daemon_help; (p = strstr(p, opt)); p += n) {
		char next = p[n];

		/* "--max-leases" must not match "--max-leases-foo". */
		if (next == ' ' || next == '=' || next == '\n' || next == ',' ||
		    next == '\0')
			return 1;
	}
	return 0;
}

void daemon_log_tail(const struct daemon_proc *d)
{
	char line[512];
	long pos;
	FILE *f = fopen(d->log, "re");

	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	pos = ftell(f);
	fseek(f, pos > 4000 ? pos - 4000 : 0, SEEK_SET);
	fprintf(stderr, "---- %s (tail) ----\n", d->log);
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fprintf(stderr, "----\n");
	fclose(f);
}

int daemon_connect_raw(const struct daemon_proc *d)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = errno;

		if (err == EINTR)
			continue;
		close(fd);
		return -err;
	}
	return fd;
}

static void live_add(struct daemon_proc *d)
{
	for (int i = 0; i < DAEMONS_MAX; i++)
		if (!live[i]) {
			live[i] = d;
			return;
		}
}

static void live_del(struct daemon_proc *d)
{
	for (int i = 0; i < DAEMONS_MAX; i++)
		if (live[i] == d)
			live[i] = NULL;
}

static void dir_remove(struct daemon_proc *d)
{
	unlink(d->sock);
	unlink(d->log);
	rmdir(d->dir);
}

int daemon_start(struct daemon_proc *d, const char *const *extra)
{
	/* Only 0-2 for the daemon; its fd count is ours to read. */
	struct util_spawn_io io = { .log = d->log, .quiet = 1 };
	const char *argv[64];
	int argc = 0;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/dlshare-bench-XXXXXX");
	if (!mkdtemp(d->dir)) {
		perror("bench: mkdtemp");
		return -1;
	}
	snprintf(d->sock, sizeof(d->sock), "%s/dlshared.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);
	argv[argc++] = daemon_bin;
	if (daemon_has_option("config")) {
		/* No /etc/dlshare/dlshared.conf: the defaults and our flags. */
		argv[argc++] = "--config";
		argv[argc++] = "/dev/null";
	}
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--log-level";
	argv[argc++] = "warning";
	for (int i = 0; extra && extra[i] && extra[i + 1] && argc < 60; i += 2) {
		if (!daemon_has_option(extra[i] + 2))
			continue;
		argv[argc++] = extra[i];
		argv[argc++] = extra[i + 1];
	}
	argv[argc] = NULL;
	d->pid = util_spawn(argv, &io);
	if (d->pid < 0) {
		dir_remove(d);
		return -1;
	}
	live_add(d);
	for (int waited = 0; waited < 20000; waited += 5) {
		int fd = daemon_connect_raw(d);

		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			break;
		}
		util_sleep_ms(5);
	}
	fprintf(stderr, "bench: dlshared did not start\n");
	daemon_log_tail(d);
	daemon_stop(d);
	return -1;
}

int daemon_stop(struct daemon_proc *d)
{
	int st = -1;

	if (d->pid > 0) {
		st = child_stop(d->pid, 10000, 5);
		d->pid = 0;
	}
	if (d->dir[0])
		dir_remove(d);
	d->dir[0] = '\0';
	live_del(d);
	return st;
}

void daemon_stop_all(void)
{
	for (int i = 0; i < DAEMONS_MAX; i++) {
		struct daemon_proc *d = live[i];

		if (!d)
			continue;
		if (d->pid > 0) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			d->pid = 0;
		}
		if (d->dir[0])
			dir_remove(d);
		live[i] = NULL;
	}
}

const char *util_size_name(uint64_t b, const char *sep, char *buf,
			   size_t cap)
{
	const char *unit = "B";

	if (b && b % (UINT64_C(1) << 30) == 0) {
		b >>= 30;
		unit = "GiB";
	} else if (b && b % (UINT64_C(1) << 20) == 0) {
		b >>= 20;
		unit = "MiB";
	} else if (b && b % 1024 == 0) {
		b >>= 10;
		unit = "KiB";
	}
	snprintf(buf, cap, "%llu%s%s", (unsigned long long)b, sep, unit);
	return buf;
}

int util_list_has(const char *list, const char *item)
{
	size_t n = strlen(item);
	const char *p = list;

	if (!list)
		return 1;
	while ((p = strstr(p, item))) {
		if ((p == list || p[-1] == ',') && (p[n] == ',' || !p[n]))
			return 1;
		p += n;
	}
	return 0;
}

static void on_fatal_signal(int sig)
{
	daemon_stop_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

void daemon_stop_on_signals(unsigned alarm_s)
{
	signal(SIGINT, on_fatal_signal);
	signal(SIGTERM, on_fatal_signal);
	signal(SIGHUP, on_fatal_signal);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGALRM, on_fatal_signal);
	alarm(alarm_s);
}
