/* test_service — dlshared as systemd runs it, checked without systemd as
 * PID 1: socket activation (under systemd-socket-activate, and with
 * sockets handed over by hand, good and bad), sd_notify messages read from
 * a NOTIFY_SOCKET the test binds, the watchdog, --check-config, log
 * prefixes, the log's rate limit, and no secret in the log.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

#ifndef DLSHARECTL_PATH
#error "DLSHARECTL_PATH must name dlsharectl"
#endif

/* One daemon (or systemd-socket-activate) with its files in a fresh
 * directory: the socket, the log (its stderr) and a notify socket. */
struct proc {
	pid_t pid;
	char dir[64];
	char sock[108];
	char log[108];
	char notify_path[108];
	int notify_fd;          /* ours, bound at notify_path; or -1 */
	char notes[8192];       /* every notify message, '|' between them */
	size_t nnotes;
};

static void proc_init(struct proc *p)
{
	memset(p, 0, sizeof(*p));
	p->notify_fd = -1;
	snprintf(p->dir, sizeof(p->dir), "/tmp/dlshare-svc-XXXXXX");
	assert_non_null(mkdtemp(p->dir));
	snprintf(p->sock, sizeof(p->sock), "%s/dlshared.sock", p->dir);
	snprintf(p->log, sizeof(p->log), "%s/daemon.log", p->dir);
	snprintf(p->notify_path, sizeof(p->notify_path), "%s/notify",
		 p->dir);
}

/* Binds the NOTIFY_SOCKET the daemon will write to: a datagram socket, as
 * systemd's. */
static void notify_bind(struct proc *p)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	p->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(p->notify_fd >= 0);
	memcpy(sa.sun_path, p->notify_path, strlen(p->notify_path) + 1);
	assert_int_equal(bind(p->notify_fd, (struct sockaddr *)&sa,
			      sizeof(sa)), 0);
}

/* Reads notify messages until one contains want, up to timeout_ms.
 * Returns 0, or -1 with every message seen in p->notes. */
static int notify_wait(struct proc *p, const char *want, int timeout_ms)
{
	int64_t end = util_now_ms() + harness_ms(timeout_ms);

	for (;;) {
		struct pollfd pfd = { .fd = p->notify_fd, .events = POLLIN };
		char msg[1024];
		int64_t left = end - util_now_ms();
		ssize_t n;

		if (left <= 0)
			return -1;
		if (poll(&pfd, 1, (int)left) <= 0)
			continue;
		n = recv(p->notify_fd, msg, sizeof(msg) - 1, MSG_DONTWAIT);
		if (n <= 0)
			continue;
		msg[n] = 0;
		if (p->nnotes + (size_t)n + 2 < sizeof(p->notes)) {
			memcpy(p->notes + p->nnotes, msg, (size_t)n);
			p->nnotes += (size_t)n;
			p->notes[p->nnotes++] = '|';
			p->notes[p->nnotes] = 0;
		}
		if (strstr(msg, want))
			return 0;
	}
}

static void assert_notify(struct proc *p, const char *want, int timeout_ms)
{
	if (notify_wait(p, want, timeout_ms))
		fail_msg("no notify message with \"%s\"; got: %s", want,
			 p->notes);
}

/* Starts argv with stdout and stderr into p->log and the "K=V" strings of
 * env (NULL-ended, may be NULL) added to the environment. With ninherit
 * fds, they become fds 3.. of the child, with LISTEN_FDS and LISTEN_PID
 * set as systemd sets them. */
static void proc_start(struct proc *p, const char *const *argv,
		       const char *const *env, const int *inherit,
		       int ninherit)
{
	fflush(NULL);
	p->pid = harness_fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND |
			      O_CLOEXEC, 0600);
		int hi[8];
		char n[16];

		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		unsetenv("LISTEN_FDS");
		unsetenv("LISTEN_PID");
		unsetenv("LISTEN_FDNAMES");
		unsetenv("NOTIFY_SOCKET");
		unsetenv("WATCHDOG_USEC");
		unsetenv("WATCHDOG_PID");
		unsetenv("JOURNAL_STREAM");
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		/* Out of the way first, then into place. */
		for (int i = 0; i < ninherit; i++)
			if ((hi[i] = fcntl(inherit[i], F_DUPFD_CLOEXEC, 100)) < 0)
				_exit(126);
		for (int i = 0; i < ninherit; i++)
			if (dup2(hi[i], 3 + i) < 0)
				_exit(126);
		for (int i = 3 + ninherit; i < 1024; i++)
			close(i);
		if (ninherit) {
			snprintf(n, sizeof(n), "%d", ninherit);
			setenv("LISTEN_FDS", n, 1);
			snprintf(n, sizeof(n), "%d", (int)getpid());
			setenv("LISTEN_PID", n, 1);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
}

/* Polls until a client can connect, the process exits or time runs out.
 * Returns 0 when connected. */
static int proc_wait_serving(struct proc *p)
{
	for (int waited = 0; waited < harness_ms(10000); waited += 10) {
		dlshare_client *c;
		int st;

		if (dlshare_connect(p->sock, &c) == 0) {
			dlshare_disconnect(c);
			return 0;
		}
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return -1;
		}
		util_sleep_ms(10);
	}
	return -1;
}

/* Waits for the process to exit by itself. Returns its status as
 * harness_wait() does, or -1 when it did not exit in time (it is killed). */
static int proc_wait_exit(struct proc *p, int timeout_ms)
{
	for (int waited = 0; waited < harness_ms(timeout_ms); waited += 10) {
		int st;

		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) :
			       128 + WTERMSIG(st);
		}
		util_sleep_ms(10);
	}
	kill(p->pid, SIGKILL);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
	return -1;
}

/* SIGTERM and wait. Returns the exit status (or -1). */
static int proc_stop(struct proc *p)
{
	if (p->pid <= 0)
		return -1;
	kill(p->pid, SIGTERM);
	return proc_wait_exit(p, 10000);
}

static char *proc_log(const struct proc *p)
{
	char *s = util_slurp(p->log, NULL);

	assert_non_null(s);
	return s;
}

/* Kills what is left, removes the files. */
static void proc_done(struct proc *p)
{
	char path[256];

	if (p->pid > 0) {
		kill(p->pid, SIGKILL);
		waitpid(p->pid, NULL, 0);
		p->pid = 0;
	}
	if (p->notify_fd >= 0)
		close(p->notify_fd);
	p->notify_fd = -1;
	unlink(p->sock);
	unlink(p->log);
	unlink(p->notify_path);
	snprintf(path, sizeof(path), "%s/dlshared.conf", p->dir);
	unlink(path);
	rmdir(p->dir);
}

static void assert_contains(const char *text, const char *want)
{
	if (!strstr(text, want))
		fail_msg("want \"%s\" in:\n%s", want, text);
}

static void assert_lacks(const char *text, const char *bad)
{
	if (strstr(text, bad))
		fail_msg("\"%s\" must not be in:\n%s", bad, text);
}

/* A listening SOCK_SEQPACKET (or type) socket bound at path. */
static int listen_socket(const char *path, int type, int do_listen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	if (do_listen)
		assert_int_equal(listen(fd, 16), 0);
	return fd;
}

/* Publishes a tensor and reads it back bit for bit through libdlshare. */
static void serve_one(const char *sock, const char *name)
{
	int64_t shape[2] = { 16, 33 };
	dlshare_client *c = NULL;
	uint64_t v = 0;

	assert_int_equal(dlshare_connect(sock, &c), 0);
	assert_int_equal(util_store(c, name, DT_F32, 2, shape, 7, &v), 0);
	assert_true(v >= 1);
	assert_int_equal(util_get_check(c, name, NULL, DT_F32, 2, shape, 7,
					NULL), 0);
	dlshare_disconnect(c);
}

/* ---- tests -------------------------------------------------------------- */

/* The daemon under systemd-socket-activate --seqpacket, as dlshared.socket
 * starts it: takes the passed socket, says READY=1 with a STATUS= line,
 * keeps STATUS= current, pings the watchdog, serves libdlshare and
 * dlsharectl, says STOPPING=1 on SIGTERM and leaves the socket file to its
 * owner. */
static void socket_activate(void **state)
{
	const char *const argv[] = {
		"/usr/bin/systemd-socket-activate", "--seqpacket", "-l", NULL,
		"-E", NULL, "-E", "WATCHDOG_USEC=400000", "-E", "LANG=C",
		DLSHARED_PATH, "--config", "/dev/null", "--log-level", "debug",
		NULL,
	};
	const char *args[sizeof(argv) / sizeof(argv[0])];
	char notify_env[160], out[256];
	struct proc p;
	char *log;

	(void)state;
#ifndef DLSHARE_HAVE_SYSTEMD
	test_skip("built without libsystemd");
#endif
	if (access(argv[0], X_OK) != 0) {
		test_skip("%s is missing (Debian: systemd)", argv[0]);
	}
	proc_init(&p);
	notify_bind(&p);
	memcpy(args, argv, sizeof(argv));
	args[3] = p.sock;
	snprintf(notify_env, sizeof(notify_env), "NOTIFY_SOCKET=%s",
		 p.notify_path);
	args[5] = notify_env;
	proc_start(&p, args, NULL, NULL, 0);

	/* systemd-socket-activate execs the daemon at the first connection;
	 * the daemon keeps its pid, as under systemd. */
	assert_int_equal(proc_wait_serving(&p), 0);
	assert_notify(&p, "READY=1", 10000);
	assert_contains(p.notes, "STATUS=");
	serve_one(p.sock, "svc/activated");
	/* STATUS= follows the registry; the watchdog's 200 ms ticks bring
	 * it sooner than the 5 s refresh. */
	assert_notify(&p, "STATUS=0 connections, 1 name, 0 leases", 5000);
	assert_notify(&p, "WATCHDOG=1", 2000);

	snprintf(out, sizeof(out), "%s/stats.out", p.dir);
	{
		const char *const ctl[] = { DLSHARECTL_PATH, "--socket",
					    p.sock, "stats", NULL };

		assert_int_equal(util_run(ctl, NULL, out, NULL), 0);
		log = util_slurp(out, NULL);
		assert_non_null(log);
		assert_contains(log, "names 1");
		free(log);
		unlink(out);
	}

	assert_int_equal(proc_stop(&p), 0);
	assert_notify(&p, "STOPPING=1", 2000);
	log = proc_log(&p);
	assert_contains(log, "(socket activation)");
	assert_contains(log, "watchdog: pinging every 200 ms");
	free(log);
	/* The socket file is the socket unit's: still there. */
	{
		struct stat st;

		assert_int_equal(lstat(p.sock, &st), 0);
		assert_true(S_ISSOCK(st.st_mode));
	}
	proc_done(&p);
}

/* The same contract with the socket handed over by hand, so that it is
 * checked also where systemd-socket-activate is missing. */
static void inherited_socket(void **state)
{
	const char *const argv[] = { DLSHARED_PATH, "--config", "/dev/null",
				     NULL };
	char notify_env[160];
	const char *env[] = { notify_env, NULL };
	struct proc p;
	struct stat st;
	char *log;
	int fd;

	(void)state;
#ifndef DLSHARE_HAVE_SYSTEMD
	test_skip("built without libsystemd");
#endif
	proc_init(&p);
	notify_bind(&p);
	snprintf(notify_env, sizeof(notify_env), "NOTIFY_SOCKET=%s",
		 p.notify_path);
	fd = listen_socket(p.sock, SOCK_SEQPACKET, 1);
	proc_start(&p, argv, env, &fd, 1);
	close(fd);
	assert_notify(&p, "READY=1", 10000);
	serve_one(p.sock, "svc/inherited");
	assert_int_equal(proc_stop(&p), 0);
	assert_notify(&p, "STOPPING=1", 2000);
	assert_int_equal(lstat(p.sock, &st), 0);
	log = proc_log(&p);
	assert_contains(log, "listening on ");
	assert_contains(log, "dlshared.sock (socket activation)");
	free(log);
	proc_done(&p);
}

/* Anything but one listening AF_UNIX SOCK_SEQPACKET socket is refused at
 * start, with a line that says what is wrong. */
static void inherited_socket_checked(void **state)
{
	static const struct {
		int type, listen, count;
		const char *error;
	} cases[] = {
		{ SOCK_STREAM, 1, 1, "is not an AF_UNIX SOCK_SEQPACKET socket" },
		{ SOCK_DGRAM, 0, 1, "is not an AF_UNIX SOCK_SEQPACKET socket" },
		{ SOCK_SEQPACKET, 0, 1, "is not listening" },
		{ SOCK_SEQPACKET, 1, 2, "2 sockets passed; dlshared takes one" },
	};
	const char *const argv[] = { DLSHARED_PATH, "--config", "/dev/null",
				     NULL };

	(void)state;
#ifndef DLSHARE_HAVE_SYSTEMD
	test_skip("built without libsystemd");
#endif
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct proc p;
		char second[128];
		int fds[2];
		char *log;

		proc_init(&p);
		fds[0] = listen_socket(p.sock, cases[i].type, cases[i].listen);
		snprintf(second, sizeof(second), "%s/second.sock", p.dir);
		if (cases[i].count > 1)
			fds[1] = listen_socket(second, SOCK_SEQPACKET, 1);
		proc_start(&p, argv, NULL, fds, cases[i].count);
		for (int k = 0; k < cases[i].count; k++)
			close(fds[k]);
		assert_int_equal(proc_wait_exit(&p, 10000), 1);
		log = proc_log(&p);
		assert_contains(log, cases[i].error);
		assert_contains(log, "cannot start");
		free(log);
		unlink(second);
		proc_done(&p);
	}
}

/* --check-config: 0 and one line when valid; 1 and the file's line for
 * each error; a missing --config file is an error. */
static void check_config(void **state)
{
	struct proc p;
	char conf[128], out[128], err[128], *text;
	FILE *f;

	(void)state;
	proc_init(&p);
	snprintf(conf, sizeof(conf), "%s/dlshared.conf", p.dir);
	snprintf(out, sizeof(out), "%s/out", p.dir);
	snprintf(err, sizeof(err), "%s/err", p.dir);

	f = fopen(conf, "w");
	assert_non_null(f);
	fputs("[dlshared]\nmax-connections = 10\nmax-bytes = 1G\n", f);
	fclose(f);
	{
		const char *const argv[] = { DLSHARED_PATH, "--check-config",
					     "--config", conf, NULL };

		assert_int_equal(util_run(argv, NULL, out, err), 0);
		text = util_slurp(out, NULL);
		assert_contains(text, "configuration is valid");
		free(text);
	}

	f = fopen(conf, "w");
	assert_non_null(f);
	fputs("max-connections = 10\nmax-conections = 11\n"
	      "max-fds = many\n", f);
	fclose(f);
	{
		const char *const argv[] = { DLSHARED_PATH, "--config", conf,
					     "--check-config", NULL };
		char want[256];

		assert_int_equal(util_run(argv, NULL, out, err), 1);
		text = util_slurp(err, NULL);
		snprintf(want, sizeof(want), "%s:2: unknown key "
			 "'max-conections'", conf);
		assert_contains(text, want);
		snprintf(want, sizeof(want), "%s:3: max-fds: invalid value "
			 "'many'", conf);
		assert_contains(text, want);
		free(text);
	}
	{
		/* Starting with it fails the same way, before binding. */
		const char *const argv[] = { DLSHARED_PATH, "--config", conf,
					     "--socket", p.sock, NULL };

		assert_int_equal(util_run(argv, NULL, out, err), 2);
		assert_int_equal(access(p.sock, F_OK), -1);
	}
	{
		const char *const argv[] = { DLSHARED_PATH, "--check-config",
					     "--config", "/nonexistent.conf",
					     NULL };

		assert_int_equal(util_run(argv, NULL, out, err), 1);
		text = util_slurp(err, NULL);
		assert_contains(text, "/nonexistent.conf: cannot read");
		free(text);
	}
	{
		/* Flags win over the file; --print-config shows it. */
		const char *const argv[] = { DLSHARED_PATH, "--config", conf,
					     "--max-fds", "24",
					     "--print-config", NULL };

		f = fopen(conf, "w");
		assert_non_null(f);
		fputs("max-fds = 32\nmax-leases = 77\n", f);
		fclose(f);
		assert_int_equal(util_run(argv, NULL, out, err), 0);
		text = util_slurp(out, NULL);
		assert_contains(text, "\nmax-fds = 24\n");
		assert_contains(text, "\nmax-leases = 77\n");
		free(text);
	}
	unlink(out);
	unlink(err);
	proc_done(&p);
}

/* Runs a daemon on its own socket with env and extra flags, stops it, and
 * returns its log (free it). */
static char *run_and_log(const char *const *env, const char *extra)
{
	struct proc p;
	const char *argv[8] = { DLSHARED_PATH, "--config", "/dev/null",
				"--socket", NULL, NULL, NULL };
	struct stat st;
	char js[128], *log;
	const char *envs[4] = { NULL };
	int n = 0;

	proc_init(&p);
	argv[4] = p.sock;
	argv[5] = extra;
	/* Make the log file now, so its device and inode can be named. */
	close(open(p.log, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	assert_int_equal(stat(p.log, &st), 0);
	for (int i = 0; env && env[i]; i++) {
		if (strcmp(env[i], "JOURNAL_STREAM=log") == 0) {
			snprintf(js, sizeof(js), "JOURNAL_STREAM=%llu:%llu",
				 (unsigned long long)st.st_dev,
				 (unsigned long long)st.st_ino);
			envs[n++] = js;
		} else {
			envs[n++] = env[i];
		}
	}
	proc_start(&p, argv, envs, NULL, 0);
	assert_int_equal(proc_wait_serving(&p), 0);
	assert_int_equal(proc_stop(&p), 0);
	log = proc_log(&p);
	proc_done(&p);
	return log;
}

/* Plain lines for a person at a terminal; sd-daemon prefixes when stderr is
 * the journal's stream, or when asked. */
static void log_prefixes(void **state)
{
	const char *const journal[] = { "JOURNAL_STREAM=log", NULL };
	const char *const other[] = { "JOURNAL_STREAM=1:2", NULL };
	char *log;

	(void)state;
	log = run_and_log(NULL, NULL);
	assert_contains(log, "\ndlshared listening on ");
	assert_lacks(log, "<5>");
	free(log);

	log = run_and_log(other, NULL);
	assert_lacks(log, "<5>");
	free(log);

	log = run_and_log(journal, NULL);
	assert_contains(log, "<5>dlshared listening on ");
	assert_contains(log, "<6>dlshared ");
	assert_contains(log, "<5>dlshared stopped");
	free(log);

	log = run_and_log(NULL, "--log-prefix=always");
	assert_contains(log, "<5>dlshared listening on ");
	free(log);

	log = run_and_log(journal, "--log-prefix=never");
	assert_lacks(log, "<5>");
	free(log);
}

/* Peers that keep failing cannot flood the log: past --log-rate-limit
 * lines a second they are counted, and one line says how many. The
 * daemon's own lines are never dropped. */
static void log_rate_limit(void **state)
{
	const char *const argv[] = { DLSHARED_PATH, "--config", "/dev/null",
				     "--log-rate-limit", "5", "--socket",
				     NULL, NULL };
	const char *args[sizeof(argv) / sizeof(argv[0])];
	int64_t start, elapsed_s;
	struct proc p;
	char *log, *s;
	int lines = 0;

	(void)state;
	proc_init(&p);
	memcpy(args, argv, sizeof(argv));
	args[6] = p.sock;
	proc_start(&p, args, NULL, NULL, 0);
	assert_int_equal(proc_wait_serving(&p), 0);
	start = util_now_ms();
	for (int i = 0; i < 41; i++) {
		int fd = raw_connect(p.sock);

		assert_true(fd >= 0);
		/* Not a Hello: a protocol error, and the daemon hangs up. */
		assert_int_equal(raw_send_bytes(fd, "\xff\xff\xff\xff", 4,
						NULL, 0), 0);
		assert_int_equal(raw_expect_hangup(fd, harness_ms(5000),
						   NULL), 0);
		close(fd);
		/* A last failure in a new second tells what was dropped. */
		if (i == 39)
			util_sleep_ms(1100);
	}
	elapsed_s = (util_now_ms() - start) / 1000;
	assert_int_equal(proc_stop(&p), 0);
	log = proc_log(&p);
	for (s = log; (s = strstr(s, "conn ")) != NULL; s++)
		lines++;
	/* 41 failures, two lines each, without the limit. */
	if (lines > 5 * (int)(elapsed_s + 1) || lines < 5)
		fail_msg("%d peer lines in %lld s with a limit of 5 a second:"
			 "\n%s", lines, (long long)elapsed_s + 1, log);
	assert_contains(log, "suppressed ");
	assert_contains(log, " messages (more than 5 a second)");
	assert_contains(log, "dlshared listening on ");
	assert_contains(log, "signal 15: shutting down");
	assert_contains(log, "dlshared stopped");
	free(log);
	proc_done(&p);
}

/* A CUDA IPC handle is a bearer token: whatever the daemon does with a
 * request that carries one, its log (at debug) never shows the bytes. */
static void no_secret_in_log(void **state)
{
	static const char secret[] = "SECRET-IPC-HANDLE-0123456789abcdef";
	static const char event[] = "SECRET-EVENT-HANDLE-0123456789abc";
	const char *const argv[] = { DLSHARED_PATH, "--config", "/dev/null",
				     "--log-level", "debug", "--socket", NULL,
				     NULL };
	const char *args[sizeof(argv) / sizeof(argv[0])];
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish pub = DLSHARE__PUBLISH__INIT;
	Dlshare__Buffer buf = DLSHARE__BUFFER__INIT;
	Dlshare__Buffer *bufs[1] = { &buf };
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	Dlshare__Tensor t = DLSHARE__TENSOR__INIT;
	Dlshare__Tensor *ts[1] = { &t };
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	int64_t shape[1] = { 4 };
	struct wire_msg *m = NULL;
	struct proc p;
	char *log;
	int fd;

	(void)state;
	proc_init(&p);
	memcpy(args, argv, sizeof(argv));
	args[6] = p.sock;
	proc_start(&p, args, NULL, NULL, 0);
	assert_int_equal(proc_wait_serving(&p), 0);
	fd = raw_connect(p.sock);
	assert_true(fd >= 0);
	assert_int_equal(raw_hello(fd), 0);

	dev.type = 2;
	buf.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	buf.size = 4096;
	buf.device = &dev;
	buf.has_ipc_handle = 1;
	buf.ipc_handle.data = (uint8_t *)secret;
	buf.ipc_handle.len = sizeof(secret) - 1;
	dt.code = 2;
	dt.bits = 32;
	dt.lanes = 1;
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = shape;
	pub.name = "svc/secret";
	pub.n_buffers = 1;
	pub.buffers = bufs;
	pub.n_tensors = 1;
	pub.tensors = ts;
	pub.has_event_handle = 1;
	pub.event_handle.data = (uint8_t *)event;
	pub.event_handle.len = sizeof(event) - 1;
	f.id = 2;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &pub;
	assert_int_equal(raw_call(fd, &f, NULL, 0, &m), 0);
	wire_msg_free(m);
	close(fd);

	assert_int_equal(proc_stop(&p), 0);
	log = proc_log(&p);
	assert_contains(log, "hello from raw test client");
	assert_lacks(log, "SECRET");
	/* Nor in hex, either case: "SECRET" is 53 45 43 52 45 54. */
	assert_lacks(log, "534543524554");
	assert_lacks(log, "53:45:43");
	free(log);
	proc_done(&p);
}

/* A peer's strings (its agent, a name it sends) cannot forge log lines:
 * under the journal a newline followed by "<0>" would be an emergency. */
static void no_forged_lines(void **state)
{
	const char *const argv[] = { DLSHARED_PATH, "--config", "/dev/null",
				     "--log-level", "debug", "--log-prefix",
				     "always", "--socket", NULL, NULL };
	const char *args[sizeof(argv) / sizeof(argv[0])];
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	struct wire_msg *m = NULL;
	struct proc p;
	char *log;
	int fd;

	(void)state;
	proc_init(&p);
	memcpy(args, argv, sizeof(argv));
	args[8] = p.sock;
	proc_start(&p, args, NULL, NULL, 0);
	assert_int_equal(proc_wait_serving(&p), 0);
	fd = raw_connect(p.sock);
	assert_true(fd >= 0);
	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = "agent\n<0>forged by agent";
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	assert_int_equal(raw_call(fd, &f, NULL, 0, &m), 0);
	wire_msg_free(m);
	cr.name = "bad\n<0>forged by name";
	f.id = 2;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &cr;
	assert_int_equal(raw_call(fd, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	wire_msg_free(m);
	close(fd);
	assert_int_equal(proc_stop(&p), 0);
	log = proc_log(&p);
	assert_lacks(log, "\n<0>");
	assert_contains(log, "agent?<0>forged by agent");
	assert_contains(log, "bad?<0>forged by name");
	free(log);
	proc_done(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(socket_activate),
		cmocka_unit_test(inherited_socket),
		cmocka_unit_test(inherited_socket_checked),
		cmocka_unit_test(check_config),
		cmocka_unit_test(log_prefixes),
		cmocka_unit_test(log_rate_limit),
		cmocka_unit_test(no_secret_in_log),
		cmocka_unit_test(no_forged_lines),
	};
	int fds_before = harness_fd_count(getpid()), fails;

	signal(SIGPIPE, SIG_IGN);
	fails = test_run_group("service", tests, NULL, NULL);
	/* Each test closes what it opened. */
	if (harness_fd_count(getpid()) != fds_before) {
		fprintf(stderr, "fds: %d before, %d after\n", fds_before,
			harness_fd_count(getpid()));
		fails = fails == TEST_SKIPPED ? 1 : fails + 1;
	}
	return fails;
}
