/* harness — a real daemon for integration tests. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "child.h"
#include "fds.h"

#ifndef DLSHARED_PATH
#error "DLSHARED_PATH must name the daemon binary"
#endif

int harness_ms(int ms)
{
	const char *s = getenv("DLSHARE_TEST_TIMEOUT_SCALE");
	double k = s ? atof(s) : 1.0;

	if (k < 1.0)
		k = 1.0;
	return (int)(ms * k);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

pid_t harness_fork(void)
{
	return child_fork();
}

int harness_wait(pid_t pid)
{
	return child_wait(pid);
}

int harness_daemon_start(struct daemon_proc *d, const char *const *extra)
{
	const char *argv[64];
	char wrapper[512];
	int argc = 0;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/dlshare-test-XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	snprintf(d->sock, sizeof(d->sock), "%s/dlshared.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);

	const char *w = getenv("DLSHARE_TEST_WRAPPER");
	if (w && *w) {
		snprintf(wrapper, sizeof(wrapper), "%s", w);
		for (char *tok = strtok(wrapper, " "); tok && argc < 16;
		     tok = strtok(NULL, " "))
			argv[argc++] = tok;
	}
	argv[argc++] = DLSHARED_PATH;
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	argv[argc++] = "--log-level";
	argv[argc++] = "debug";
	/* Never the machine's /etc/dlshare/dlshared.conf. */
	argv[argc++] = "--config";
	argv[argc++] = "/dev/null";
	for (int i = 0; extra && extra[i] && argc < 62; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;

	d->pid = harness_fork();
	if (d->pid < 0)
		return -1;
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			      0600);

		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		/* The daemon must not inherit the test's fds: only 0-2. */
		for (int i = 3; i < 1024; i++)
			close(i);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	for (int waited = 0; waited < harness_ms(20000); waited += 10) {
		dlshare_client *c;

		if (dlshare_connect(d->sock, &c) == 0) {
			dlshare_disconnect(c);
			return 0;
		}
		if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
			d->pid = 0;
			return -1;
		}
		sleep_ms(10);
	}
	return -1;
}

static void rm_dir(const char *dir)
{
	DIR *dd = opendir(dir);
	struct dirent *de;
	char p[512];

	if (!dd)
		return;
	while ((de = readdir(dd))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		unlink(p);
	}
	closedir(dd);
	rmdir(dir);
}

int harness_daemon_stop(struct daemon_proc *d)
{
	int status = -1;

	if (d->pid > 0) {
		status = child_stop(d->pid, harness_ms(20000), 10);
		d->pid = 0;
	}
	if (status != 0) {
		/* Show why: the daemon's log is the evidence. */
		char line[512];
		FILE *f = fopen(d->log, "r");

		fprintf(stderr, "dlshared exited with %d; its log:\n", status);
		while (f && fgets(line, sizeof(line), f))
			fputs(line, stderr);
		if (f)
			fclose(f);
	}
	rm_dir(d->dir);
	return status;
}

dlshare_client *harness_connect(const struct daemon_proc *d)
{
	dlshare_connect_opts o = { .size = sizeof(o) };
	dlshare_client *c = NULL;
	int err;

	/* A daemon under valgrind answers slower than the default allows. */
	o.timeout_ms = harness_ms(DLSHARE_CONNECT_TIMEOUT_MS);
	err = dlshare_connect_ex(d->sock, &o, &c);

	if (err)
		fail_msg("connect %s: %s", d->sock, dlshare_strerror(err));
	return c;
}

int harness_fd_count(pid_t pid)
{
	return fds_count(pid);
}

int harness_wait_stats(dlshare_client *c, int64_t want_leases,
		       int64_t want_conns, dlshare_stats *last)
{
	dlshare_stats st = { 0 };

	for (int waited = 0; waited <= harness_ms(5000); waited += 10) {
		if (dlshare_stats_get(c, &st) == 0 &&
		    (want_leases < 0 || st.leases == (uint64_t)want_leases) &&
		    (want_conns < 0 || st.connections == (uint64_t)want_conns)) {
			if (last)
				*last = st;
			return 0;
		}
		sleep_ms(10);
	}
	if (last)
		*last = st;
	return -1;
}

int harness_wait_fds(pid_t pid, int want)
{
	int n = -1;

	for (int waited = 0; waited <= harness_ms(5000); waited += 10) {
		n = harness_fd_count(pid);
		if (n == want)
			break;
		sleep_ms(10);
	}
	return n;
}

void harness_fill(void *p, size_t n, uint32_t seed)
{
	uint8_t *b = p;
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		b[i] = (uint8_t)x;
	}
}
