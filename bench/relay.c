/* relay — dlbench's "relay" section (relay.h): dlshared and dlshare-relay
 * pairs on loopback, and ucx_perftest beside them as the floor.
 *
 * Node A runs a daemon and `dlshare-relay --listen`; node B a daemon and
 * `dlshare-relay --connect A` with one --mirror per figure (bench/rsmall,
 * bench/rbig, bench/rfan1: each followed name is the only one of its
 * prefix, as a weight-sync name is, so the origin's waiting get is on it;
 * with a daemon before protocol 1.6, a name that is not the last changed
 * one of its prefix is found by the relay's scan, up to
 * --scan-interval-ms later, which these figures would otherwise measure;
 * a 1.6 daemon's Watch finds it at once); nodes F1..F4 the same, mirroring bench/fan (the
 * fan-out). Everything talks UCX over TCP on lo
 * (UCX_TLS=tcp, UCX_NET_DEVICES=lo unless the environment says otherwise),
 * ucx_perftest too, so relay and floor use the same transport.
 *
 * A propagation is timed from just before dlshare_seal() on A (the data
 * written) to the return of a parked get (NEWER_THAN the last version it
 * saw) in a consumer process on B; both read CLOCK_MONOTONIC. The next
 * version is published only once every consumer reported the previous
 * one. Consumers check the bytes (sampled; all of a 4 KiB version).
 */
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "report.h"
#include "util.h"

#define FANOUT 4
#define SMALL_BYTES UINT64_C(4096)

static char work[64];            /* our mkdtemp directory: key, logs */
static char relay_bin[PATH_MAX];
static char perftest_bin[PATH_MAX];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static uint64_t t0_section;

/* A line on stderr with the seconds since the section started. */
static void say(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "relay [%5.1fs]: ",
		(double)(util_now_ns() - t0_section) / 1e9);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- finding the programs ------------------------------------------------ */

static int executable(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode) &&
	       access(p, X_OK) == 0;
}

/* dlshare-relay beside the daemon of this build ($DLBENCH_RELAY first). */
static int find_relay(const char *daemon_bin)
{
	const char *env = getenv("DLBENCH_RELAY");
	char dir[PATH_MAX - 32];
	char *slash;

	if (env && *env) {
		snprintf(relay_bin, sizeof(relay_bin), "%s", env);
		return executable(relay_bin) ? 0 : -1;
	}
	snprintf(dir, sizeof(dir), "%s", daemon_bin);
	slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	snprintf(relay_bin, sizeof(relay_bin), "%s/relay/dlshare-relay", dir);
	if (executable(relay_bin))
		return 0;
	snprintf(relay_bin, sizeof(relay_bin), "%s/dlshare-relay", dir);
	return executable(relay_bin) ? 0 : -1;
}

/* ucx_perftest on PATH ($DLBENCH_UCX_PERFTEST first). */
static int find_perftest(void)
{
	const char *env = getenv("DLBENCH_UCX_PERFTEST");
	const char *path = getenv("PATH");
	char *copy, *dir, *save = NULL;

	if (env && *env) {
		snprintf(perftest_bin, sizeof(perftest_bin), "%s", env);
		return executable(perftest_bin) ? 0 : -1;
	}
	copy = strdup(path ? path : "/usr/bin:/bin");
	for (dir = strtok_r(copy, ":", &save); dir;
	     dir = strtok_r(NULL, ":", &save)) {
		snprintf(perftest_bin, sizeof(perftest_bin), "%s/ucx_perftest",
			 dir);
		if (executable(perftest_bin)) {
			free(copy);
			return 0;
		}
	}
	free(copy);
	return -1;
}

/* ---- processes ----------------------------------------------------------- */

/* A TCP port on 127.0.0.1 free a moment ago (the kernel's pick). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int port = -1;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* Starts argv with UCX on TCP over lo (unless UCX_TLS / UCX_NET_DEVICES
 * are set), stdin from /dev/null, stdout and stderr into log. Returns the
 * pid or -1. */
static pid_t spawn(const char *const *argv, const char *log)
{
	const char *const env[] = {
		"UCX_TLS", getenv("UCX_TLS") ? NULL : "tcp",
		"UCX_NET_DEVICES", getenv("UCX_NET_DEVICES") ? NULL : "lo",
		NULL
	};
	const struct util_spawn_io io = {
		.log = log, .log_stdout = 1, .quiet = 1, .env = env,
	};

	return util_spawn(argv, &io);
}

/* 1 when a TCP socket listens on port (any address, IPv4 or IPv6), from
 * /proc/net/tcp{,6}: connecting to find out would be the accept that an
 * ucx_perftest server waits for, and its "Waiting for connection" sits in
 * its stdout buffer. */
static int tcp_listening(int port)
{
	static const char *const files[] = { "/proc/net/tcp", "/proc/net/tcp6" };
	char line[512], want[8];

	snprintf(want, sizeof(want), ":%04X", port);
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(files[i], "re");

		while (f && fgets(line, sizeof(line), f)) {
			char local[64], remote[64], st[8];

			if (sscanf(line, " %*s %63s %63s %7s", local, remote,
				   st) != 3)
				continue;
			const char *colon = strrchr(local, ':');

			if (colon && strcmp(colon, want) == 0 &&
			    strcmp(st, "0A") == 0) {
				fclose(f);
				return 1;
			}
		}
		if (f)
			fclose(f);
	}
	return 0;
}

/* Prints the last lines of a log on stderr. */
static void log_tail(const char *what, const char *path)
{
	char line[512];
	char ring[12][512];
	int n = 0;
	FILE *f = fopen(path, "re");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		snprintf(ring[n++ % 12], sizeof(ring[0]), "%s", line);
	fclose(f);
	fprintf(stderr, "relay: last lines of %s (%s):\n", what, path);
	for (int i = n > 12 ? n - 12 : 0; i < n; i++)
		fprintf(stderr, "  %s", ring[i % 12]);
}

/* ---- the floor: ucx_perftest --------------------------------------------- */

/* Runs one ucx_perftest pair on loopback: a server, and a client that runs
 * test with size-byte messages, iters iterations after warmup ones. Its
 * "Final:" line gives v[0..7]: iterations, latency 50th percentile,
 * average and overall (us; for *_lat tests one-way, half a round trip),
 * bandwidth average and overall (MB/s), message rate average and overall.
 * Returns 0 or -1 (said on stderr with the client's output). */
static int perftest(const char *test, uint64_t size, long iters, long warmup,
		    const char *wait, double v[8])
{
	char port[16], sz[32], it[32], wu[32], slog[96], clog[96];
	/* wait: NULL, UCX's default (poll: spin on worker progress), or
	 * "sleep" (wait for the worker's wakeup, as the relay's loop does) */
	const char *srv[] = { perftest_bin, "-p", port, wait ? "-E" : NULL,
			      wait, NULL };
	const char *cli[] = { perftest_bin, "-p", port, "127.0.0.1", "-t",
			      test, "-s", sz, "-n", it, "-w", wu,
			      wait ? "-E" : NULL, wait, NULL };
	pid_t s, c;
	int st, rc = -1;
	char *out = NULL, *fin;
	size_t cap = 0;
	FILE *f;

	snprintf(port, sizeof(port), "%d", free_port());
	snprintf(sz, sizeof(sz), "%llu", (unsigned long long)size);
	snprintf(it, sizeof(it), "%ld", iters);
	snprintf(wu, sizeof(wu), "%ld", warmup);
	snprintf(slog, sizeof(slog), "%s/perftest-server.log", work);
	snprintf(clog, sizeof(clog), "%s/perftest-client.log", work);
	s = spawn(srv, slog);
	if (s < 0)
		return -1;
	for (int waited = 0; waited < 10000 && !tcp_listening(atoi(port));
	     waited += 10)
		util_sleep_ms(10);
	if (!tcp_listening(atoi(port))) {
		say("ucx_perftest server did not start listening");
		log_tail("ucx_perftest server", slog);
		child_stop(s, 2000, 20);
		return -1;
	}
	c = spawn(cli, clog);
	st = c < 0 ? -1 : child_wait(c);
	child_stop(s, 5000, 20);
	f = fopen(clog, "re");
	if (f) {
		if (getdelim(&out, &cap, '\0', f) < 0) {
			free(out);
			out = NULL;
		}
		fclose(f);
	}
	fin = out ? strstr(out, "Final:") : NULL;
	if (st == 0 && fin &&
	    sscanf(fin, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &v[0],
		   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8)
		rc = 0;
	else {
		say("ucx_perftest -t %s -s %s failed (status %d)", test, sz, st);
		log_tail("ucx_perftest client", clog);
	}
	free(out);
	return rc;
}

/* ---- nodes: a daemon and its relay --------------------------------------- */

struct node {
	struct daemon_proc d;
	pid_t relay;
	char log[96];
};

static const char *const node_opts[] = { "--log-rate-limit", "0", NULL };

/* Starts a daemon, then its relay: listening on listen, or following
 * mirror on connect. Returns 0 or -1. */
static int node_start(struct node *n, const char *name, const char *listen,
		      const char *connect, const char *mirror,
		      const char *key)
{
	const char *argv[24];
	char prefixes[128], *save = NULL;
	int argc = 0;

	n->relay = -1;
	if (daemon_start(&n->d, node_opts))
		return -1;
	snprintf(n->log, sizeof(n->log), "%s/relay-%s.log", work, name);
	argv[argc++] = relay_bin;
	argv[argc++] = "--socket";
	argv[argc++] = n->d.sock;
	argv[argc++] = "--key-file";
	argv[argc++] = key;
	if (listen) {
		argv[argc++] = "--listen";
		argv[argc++] = listen;
	} else {
		argv[argc++] = "--connect";
		argv[argc++] = connect;
		/* mirror: prefixes separated by commas, one --mirror (one
		 * subscription, one waiting get at the origin) each */
		snprintf(prefixes, sizeof(prefixes), "%s", mirror);
		for (char *p = strtok_r(prefixes, ",", &save);
		     p && argc < 20; p = strtok_r(NULL, ",", &save)) {
			argv[argc++] = "--mirror";
			argv[argc++] = p;
		}
	}
	argv[argc] = NULL;
	n->relay = spawn(argv, n->log);
	return n->relay < 0 ? -1 : 0;
}

static void node_stop(struct node *n, const char *name, int show_log)
{
	if (n->relay > 0) {
		int st = child_stop(n->relay, 5000, 20);

		if (show_log || (st != 0 && st != 128 + SIGTERM))
			log_tail(name, n->log);
		n->relay = -1;
	}
	if (n->d.pid > 0)
		daemon_stop(&n->d);
}

/* ---- publisher and consumers --------------------------------------------- */

/* The value of 64-bit word i of the version published with seed: the
 * seed itself first, so that a consumer knows which version it holds. */
static uint64_t word(uint64_t seed, uint64_t i)
{
	return i == 0 ? seed : seed * UINT64_C(0x9e3779b97f4a7c15) + i;
}

/* Publishes bytes (a multiple of 8) of uint8 on name through a store
 * version filled for seed; *t0: the clock just before the seal. Returns
 * 0 or a DLSHARE_E* code (said on stderr). */
static int publish(dlshare_client *c, const char *name, uint64_t bytes,
		   uint64_t seed, uint64_t *t0)
{
	int64_t shape[] = { (int64_t)bytes };
	dlshare_tensor_spec spec = {
		.dtype = { kDLUInt, 8, 1 }, .ndim = 1, .shape = shape,
	};
	dlshare_writer *w;
	uint64_t *p;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, NULL, &w))) {
		say("create %s: %s", name, dlshare_last_error());
		return err;
	}
	p = dlshare_writer_tensor(w, 0)->data;
	for (uint64_t i = 0; i < bytes / 8; i++)
		p[i] = word(seed, i);
	*t0 = util_now_ns();
	if ((err = dlshare_seal(w, NULL, NULL)))
		say("seal %s: %s", name, dlshare_last_error());
	return err;
}

/* What a consumer reports per version. */
struct seen {
	uint64_t t_ns;   /* when its get returned */
	uint64_t seed;   /* the seed the data was written with */
	int32_t err;     /* 0, a DLSHARE_E* code, or 1: wrong bytes */
	int32_t pad;
};

/* A child that gets n versions of name from the daemon at sock, one after
 * another (NEWER_THAN the last, parked up to timeout_ms), checks each one's
 * bytes (every word of a small version, one word in 512 of a large one)
 * and writes a struct seen per version to fd. */
static pid_t consumer(const char *sock, const char *name, long n,
		      int timeout_ms, int fd)
{
	pid_t pid = util_fork();

	if (pid != 0)
		return pid;
	dlshare_client *c = NULL;
	dlshare_get_opts o = {
		.select = DLSHARE_NEWER_THAN, .timeout_ms = timeout_ms,
	};
	struct seen s = { 0 };

	if ((s.err = dlshare_connect(sock, &c))) {
		util_write_all(fd, &s, sizeof(s));
		_exit(1);
	}
	for (long k = 0; k < n; k++) {
		dlshare_bundle *b;
		const DLTensor *t;

		s.err = dlshare_get(c, name, &o, &b);
		s.t_ns = util_now_ns();
		if (s.err) {
			fprintf(stderr, "relay: consumer of %s on %s: %s\n",
				name, sock, dlshare_last_error());
			util_write_all(fd, &s, sizeof(s));
			_exit(1);
		}
		o.version = dlshare_bundle_version(b);
		t = dlshare_bundle_tensor(b, 0);
		const uint64_t *p = t->data;
		uint64_t words = (uint64_t)t->shape[0] / 8;
		uint64_t step = words * 8 <= SMALL_BYTES ? 1 : 512;

		s.seed = words ? p[0] : 0;
		for (uint64_t i = 0; i < words && !s.err; i += step)
			if (p[i] != word(s.seed, i))
				s.err = 1;
		if (words && p[words - 1] != word(s.seed, words - 1))
			s.err = 1;
		dlshare_bundle_free(b);
		if (util_write_all(fd, &s, sizeof(s)))
			_exit(1);
	}
	dlshare_disconnect(c);
	_exit(0);
}

/* Reads one struct seen from fd, waiting up to ms. Returns 0 or -1. */
static int seen_read(int fd, int ms, struct seen *s)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t got = 0;

	while (got < sizeof(*s)) {
		int r = poll(&p, 1, ms);
		ssize_t n;

		if (r <= 0)
			return -1;
		n = read(fd, (char *)s + got, sizeof(*s) - got);
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

/* A name followed by k consumers. */
struct follow {
	const char *name;
	int k;
	pid_t pid[FANOUT];
	int fd[FANOUT];      /* read ends */
};

static int follow_start(struct follow *f, const char *name,
			struct node *const *nodes, int k, long n,
			int timeout_ms)
{
	f->name = name;
	f->k = 0;
	for (int j = 0; j < k; j++) {
		int p[2];

		if (pipe2(p, O_CLOEXEC))
			return -1;
		f->pid[j] = consumer(nodes[j]->d.sock, name, n, timeout_ms,
				     p[1]);
		close(p[1]);
		if (f->pid[j] < 0) {
			close(p[0]);
			return -1;
		}
		f->fd[j] = p[0];
		f->k++;
	}
	return 0;
}

static void follow_stop(struct follow *f)
{
	for (int j = 0; j < f->k; j++) {
		close(f->fd[j]);
		child_stop(f->pid[j], 2000, 20);
	}
	f->k = 0;
}

/* Publishes one version of bytes on name through a, and waits until every
 * consumer of f got it. *ns: seal to the last consumer's get. Returns 0,
 * or -1 (said on stderr). */
static int propagate(dlshare_client *a, struct follow *f, uint64_t bytes,
		     uint64_t seed, int timeout_ms, double *ns)
{
	uint64_t t0, last = 0;
	struct seen s;

	if (publish(a, f->name, bytes, seed, &t0))
		return -1;
	for (int j = 0; j < f->k; j++) {
		if (seen_read(f->fd[j], timeout_ms + 5000, &s)) {
			say("%s: mirror %d did not get version seed %llu "
			    "within %d ms", f->name, j,
			    (unsigned long long)seed, timeout_ms);
			return -1;
		}
		if (s.err) {
			say("%s: mirror %d: %s", f->name, j,
			    s.err == 1 ? "the bytes differ from what was "
			    "published" : dlshare_strerror(s.err));
			return -1;
		}
		if (s.seed != seed) {
			say("%s: mirror %d got the version of seed %llu, not "
			    "%llu", f->name, j, (unsigned long long)s.seed,
			    (unsigned long long)seed);
			return -1;
		}
		if (s.t_ns > last)
			last = s.t_ns;
	}
	*ns = last > t0 ? (double)(last - t0) : 0;
	return 0;
}

/* ---- the section --------------------------------------------------------- */

struct figs {
	struct fig *floor_big, *big, *big_ratio;
	struct fig *floor_fresh, *big_ratio_fresh;
	struct fig *floor_rtt, *small, *small_ratio;
	struct fig *floor_rtt_sleep, *small_ratio_sleep;
	struct fig *fan1, *fan, *fan_ratio;
};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* What a new version of bytes costs B before any byte arrives, done here
 * as B's daemon and library do it (daemon/host.c, client/copy.c): a
 * memfd, its pages allocated (fallocate), mapped and faulted in
 * (MADV_POPULATE_WRITE, which also clears them). ucx_perftest's floor
 * gets into a buffer it warmed up; a mirrored version cannot. Returns ms,
 * or NAN. */
static double fresh_ms(uint64_t bytes)
{
	uint64_t t0 = util_now_ns();
	int fd = memfd_create("dlbench-fresh", MFD_CLOEXEC);
	void *p = MAP_FAILED;
	double ms = NAN;

	if (fd < 0)
		return NAN;
	if (ftruncate(fd, (off_t)bytes) == 0 &&
	    fallocate(fd, 0, 0, (off_t)bytes) == 0)
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 0);
	if (p != MAP_FAILED) {
		if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0)
			ms = (double)(util_now_ns() - t0) / 1e6;
		munmap(p, bytes);
	}
	close(fd);
	return ms;
}

static void null_all(struct fig **f, const char *why)
{
	for (; *f; f++) {
		(*f)->is_null = 1;
		report_note(*f, "%s", why);
	}
}

static int key_file(char *path, size_t cap)
{
	unsigned char key[32];
	int fd, rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	if (rnd < 0 || read(rnd, key, sizeof(key)) != (ssize_t)sizeof(key)) {
		if (rnd >= 0)
			close(rnd);
		return -1;
	}
	close(rnd);
	snprintf(path, cap, "%s/relay.key", work);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	/* As the README makes one: printable, so it can be copied around. */
	for (size_t i = 0; i < sizeof(key); i++) {
		char hex[3];

		snprintf(hex, sizeof(hex), "%02x", key[i]);
		if (util_write_all(fd, hex, 2)) {
			close(fd);
			return -1;
		}
	}
	return close(fd);
}

/* Removes our mkdtemp directory: the key and the logs we wrote. */
static void work_remove(void)
{
	static const char *const files[] = {
		"relay.key", "perftest-server.log", "perftest-client.log",
		"relay-A.log", "relay-B.log", "relay-F1.log", "relay-F2.log",
		"relay-F3.log", "relay-F4.log", NULL,
	};
	char path[PATH_MAX];

	if (!work[0])
		return;
	for (int i = 0; files[i]; i++) {
		snprintf(path, sizeof(path), "%s/%s", work, files[i]);
		unlink(path);
	}
	rmdir(work);
	work[0] = '\0';
}

int relay_section(int quick, int reps, const char *daemon_bin)
{
	uint64_t big = quick ? UINT64_C(64) << 20 : UINT64_C(1) << 30;
	uint64_t fan_bytes = quick ? UINT64_C(16) << 20 : UINT64_C(256) << 20;
	long small_iters = quick ? 20 : 50;
	long rtt_iters = quick ? 2000 : 10000;
	int timeout_ms = quick ? 60000 : 180000;
	char fanname[32], key[128], listen[32];
	struct node a = { .relay = -1 }, b = { .relay = -1 };
	struct node fan[FANOUT] = { { .relay = -1 }, { .relay = -1 },
				    { .relay = -1 }, { .relay = -1 } };
	struct node *bn[1] = { &b }, *fn[FANOUT] = { &fan[0], &fan[1],
						     &fan[2], &fan[3] };
	struct follow fsmall = { 0 }, fbig = { 0 }, ffan1 = { 0 },
		      ffan = { 0 };
	dlshare_client *pub = NULL;
	struct samples sm = { 0 };
	uint64_t seed = 1;
	int have_relay, have_perftest, rc = -1, failed_relay = 0;
	double v[8];

	t0_section = util_now_ns();
	/* 1 GiB lives in both daemons, twice while a version replaces
	 * another, and in ucx_perftest's two processes. */
	while (big > (UINT64_C(16) << 20) &&
	       util_meminfo_bytes("MemAvailable") < 6 * big)
		big >>= 1;
	util_size_name(fan_bytes, " ", fanname, sizeof(fanname));

	report_section("relay");
	struct figs f;
	char lbig[32];

	util_size_name(big, " ", lbig, sizeof(lbig));
	f.floor_big = report_decl("floor_ucx_get_1GiB_ms", "ms",
		"floor: ucx_perftest -t ucp_get, %s%s, tcp over lo", lbig,
		quick ? " (--quick)" : "");
	f.big = report_decl("relay_1GiB_ms", "ms",
		"relay: %s sealed on A to gettable on B%s", lbig,
		quick ? " (--quick)" : "");
	f.big_ratio = report_decl("relay_1GiB_over_ucx_perftest", "x",
		"relay / ucp_get floor, %s%s", lbig,
		quick ? " (--quick: not 1 GiB)" : "");
	f.floor_fresh = report_decl("floor_fresh_1GiB_ms", "ms",
		"floor: a new %s version's memory (fallocate+populate)",
		lbig);
	f.big_ratio_fresh = report_decl(
		"relay_1GiB_over_ucx_perftest_and_fresh", "x",
		"relay / (ucp_get floor + new memory), %s", lbig);
	f.floor_rtt = report_decl("floor_ucx_rtt_us", "us",
		"floor: UCX round trip, 2 x ucp_am_lat one-way, 4 KiB");
	f.floor_rtt_sleep = report_decl("floor_ucx_rtt_sleep_us", "us",
		"floor: the same, -E sleep (woken, as the relay's loop)");
	f.small = report_decl("relay_4KiB_propagation_us", "us",
		"relay: 4 KiB sealed on A to gettable on B");
	f.small_ratio = report_decl("relay_4KiB_over_ucx_rtt", "x",
		"relay 4 KiB propagation / UCX round trip");
	f.small_ratio_sleep = report_decl("relay_4KiB_over_ucx_rtt_sleep",
		"x", "relay 4 KiB propagation / woken UCX round trip");
	f.fan1 = report_decl("relay_fanout1_ms", "ms",
		"relay: %s to 1 mirror", fanname);
	f.fan = report_decl("relay_fanout4_ms", "ms",
		"relay: %s to 4 mirrors of one origin (all got it)", fanname);
	f.fan_ratio = report_decl("relay_fanout4_over_1", "x",
		"fan-out: 4 mirrors / 1 mirror, %s", fanname);
	report_goal(f.big_ratio, REPORT_GOAL_LE, 1.25);
	report_goal(f.small_ratio, REPORT_GOAL_LE, 3.0);

	struct fig *relay_figs[] = { f.big, f.big_ratio, f.big_ratio_fresh,
		f.small, f.small_ratio, f.small_ratio_sleep, f.fan1, f.fan,
		f.fan_ratio, NULL };
	struct fig *all_figs[] = { f.floor_big, f.floor_fresh, f.floor_rtt,
		f.floor_rtt_sleep, f.big, f.big_ratio, f.big_ratio_fresh,
		f.small, f.small_ratio, f.small_ratio_sleep, f.fan1, f.fan,
		f.fan_ratio, NULL };

	have_perftest = find_perftest() == 0;
	have_relay = find_relay(daemon_bin) == 0;
	if (!have_perftest) {
		say("skipped: ucx_perftest not found (Debian: ucx-utils)");
		null_all(all_figs, "skipped: ucx_perftest not found "
			 "(Debian: ucx-utils)");
		return 0;
	}
	if (!have_relay) {
		say("skipped: dlshare-relay not built (looked beside %s; "
		    "DLBENCH_RELAY names it); measuring the floors only",
		    daemon_bin);
		null_all(relay_figs, "skipped: dlshare-relay not built");
	}
	snprintf(work, sizeof(work), "/tmp/dlbench-relay-XXXXXX");
	if (!mkdtemp(work)) {
		work[0] = '\0';
		say("mkdtemp: %s", strerror(errno));
		return -1;
	}

	if (have_relay) {
		char aname[8];

		if (key_file(key, sizeof(key))) {
			say("cannot write a key file in %s", work);
			goto out;
		}
		snprintf(listen, sizeof(listen), "127.0.0.1:%d", free_port());
		if (node_start(&a, "A", listen, NULL, NULL, key) ||
		    node_start(&b, "B", NULL, listen,
			       "bench/rsmall,bench/rbig,bench/rfan1", key))
			goto fail_relay;
		for (int j = 0; j < FANOUT; j++) {
			snprintf(aname, sizeof(aname), "F%d", j + 1);
			if (node_start(&fan[j], aname, NULL, listen,
				       "bench/fan", key))
				goto fail_relay;
		}
		/* Consumers first (they fork), the publisher after. */
		if (follow_start(&fsmall, "bench/rsmall/x", bn, 1,
				 1 + reps * small_iters, timeout_ms) ||
		    follow_start(&fbig, "bench/rbig/x", bn, 1, 1 + reps,
				 timeout_ms) ||
		    follow_start(&ffan1, "bench/rfan1/x", bn, 1, 1 + reps,
				 timeout_ms) ||
		    follow_start(&ffan, "bench/fan/x", fn, FANOUT, 1 + reps,
				 timeout_ms))
			goto fail_relay;
		if (dlshare_connect(a.d.sock, &pub)) {
			say("connect to A: %s", dlshare_last_error());
			goto fail_relay;
		}
		/* The first version of each name also waits for the relays
		 * to connect and authenticate: not measured. */
		double ns;

		say("waiting for the relays (first versions, not measured)");
		if (propagate(pub, &fsmall, SMALL_BYTES, seed++, timeout_ms,
			      &ns) ||
		    propagate(pub, &fbig, SMALL_BYTES, seed++, timeout_ms,
			      &ns) ||
		    propagate(pub, &ffan1, SMALL_BYTES, seed++, timeout_ms,
			      &ns) ||
		    propagate(pub, &ffan, SMALL_BYTES, seed++, timeout_ms,
			      &ns))
			goto fail_relay;
	}

	for (int r = 0; r < reps; r++) {
		say("repeat %d/%d", r + 1, reps);
		for (int side = 0; side < 2; side++) {
			double ns, rtt = NAN, fl = NAN;

			if ((side == 0) == (r % 2 == 0)) {
				/* One get of the large size, after one
				 * warm-up get (registration, connection). */
				if (perftest("ucp_get", big, 1, 1, NULL, v))
					goto out;
				fl = v[3] / 1e3;
				report_add(f.floor_big, fl);
				if (perftest("ucp_am_lat", SMALL_BYTES,
					     rtt_iters, rtt_iters / 10, NULL,
					     v))
					goto out;
				rtt = 2 * v[1];
				report_add(f.floor_rtt, rtt);
				if (perftest("ucp_am_lat", SMALL_BYTES,
					     rtt_iters, rtt_iters / 10,
					     "sleep", v))
					goto out;
				report_add(f.floor_rtt_sleep, 2 * v[1]);
				report_add(f.floor_fresh, fresh_ms(big));
				continue;
			}
			if (!have_relay || failed_relay)
				continue;
			samples_clear(&sm);
			for (long i = 0; i < small_iters; i++) {
				if (propagate(pub, &fsmall, SMALL_BYTES,
					      seed++, timeout_ms, &ns))
					goto fail_relay;
				samples_add(&sm, ns / 1e3);
			}
			report_add(f.small, samples_quantile(&sm, 0.5));
			if (propagate(pub, &fbig, big, seed++, timeout_ms,
				      &ns))
				goto fail_relay;
			report_add(f.big, ns / 1e6);
			double one, four;

			if (propagate(pub, &ffan1, fan_bytes, seed++,
				      timeout_ms, &one) ||
			    propagate(pub, &ffan, fan_bytes, seed++,
				      timeout_ms, &four))
				goto fail_relay;
			report_add(f.fan1, one / 1e6);
			report_add(f.fan, four / 1e6);
			report_add(f.fan_ratio, four / one);
		}
		/* The ratios of this repeat: relay and floor seconds apart. */
		if (have_relay && !failed_relay) {
			size_t n = f.big->reps.n;

			if (n && f.floor_big->reps.n == n)
				report_add(f.big_ratio,
					   f.big->reps.v[n - 1] /
					   f.floor_big->reps.v[n - 1]);
			n = f.small->reps.n;
			if (n && f.floor_rtt->reps.n == n)
				report_add(f.small_ratio,
					   f.small->reps.v[n - 1] /
					   f.floor_rtt->reps.v[n - 1]);
			if (n && f.floor_rtt_sleep->reps.n == n)
				report_add(f.small_ratio_sleep,
					   f.small->reps.v[n - 1] /
					   f.floor_rtt_sleep->reps.v[n - 1]);
			n = f.big->reps.n;
			if (n && f.floor_big->reps.n == n &&
			    f.floor_fresh->reps.n == n)
				report_add(f.big_ratio_fresh,
					   f.big->reps.v[n - 1] /
					   (f.floor_big->reps.v[n - 1] +
					    f.floor_fresh->reps.v[n - 1]));
		}
	}
	rc = failed_relay ? -1 : 0;
	goto out;

fail_relay:
	/* The relays failed: their figures say so; the floors go on. */
	failed_relay = 1;
	null_all(relay_figs, "not measured: the relays failed (see the "
		 "messages of the run)");
	for (int r = 0; have_perftest && r < reps; r++) {
		if (perftest("ucp_get", big, 1, 1, NULL, v))
			break;
		report_add(f.floor_big, v[3] / 1e3);
		if (perftest("ucp_am_lat", SMALL_BYTES, rtt_iters,
			     rtt_iters / 10, NULL, v))
			break;
		report_add(f.floor_rtt, 2 * v[1]);
		if (perftest("ucp_am_lat", SMALL_BYTES, rtt_iters,
			     rtt_iters / 10, "sleep", v))
			break;
		report_add(f.floor_rtt_sleep, 2 * v[1]);
		report_add(f.floor_fresh, fresh_ms(big));
	}
out:
	samples_free(&sm);
	dlshare_disconnect(pub);
	follow_stop(&fsmall);
	follow_stop(&fbig);
	follow_stop(&ffan1);
	follow_stop(&ffan);
	if (have_relay) {
		node_stop(&b, "relay B", failed_relay);
		for (int j = 0; j < FANOUT; j++)
			node_stop(&fan[j], "relay F", failed_relay);
		node_stop(&a, "relay A", failed_relay);
	}
	work_remove();
	return rc;
}
