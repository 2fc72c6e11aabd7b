/* dlbench — runs every dlshare benchmark beside its floor, in one run on
 * one machine, and prints a table (and, with --json FILE, writes it).
 *
 * Each figure is measured over repeats; a repeat of dlshare and the
 * repeat of its floor run next to each other (their order alternating), so
 * a ratio is taken between measurements seconds apart. A figure's value is
 * the median over repeats, its spread the min..max. bench/run builds this
 * and calls it; BENCHMARKS.md explains every figure.
 *
 * Single-threaded: the figures run in child processes (figures.c) and the
 * floors in dlshare-floor (floor.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <sched.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "figures.h"
#include "relay.h"
#include "report.h"
#include "util.h"

static uint64_t t_start;

/* ---- plan ------------------------------------------------------------------ */

struct plan {
	int quick;
	int reps;
	long rt_iters;        /* round trips per repeat (floor and get) */
	long first_iters;     /* first gets per repeat */
	long tp_ms;           /* throughput window */
	uint64_t big;         /* handoff: the large size */
	long small_iters;     /* handoffs of 4 KiB per repeat */
	long scale_max;       /* most names */
	long spread_iters;    /* gets per scale point and repeat */
	int idle_n;
	int storm_n;
	int storm_leases;
	int storm_reps;
	long pub_iters;       /* publishes of 256 MiB per repeat */
};

static const char *floor_bin;
static const char *only;


static void progress(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%4.0fs] ", (double)(util_now_ns() - t_start) / 1e9);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- placement --------------------------------------------------------------- */

static cpu_set_t all_cpus;

/* Pins this process (so the children it forks from now on) to CPU 0 and
 * the daemon to CPU 1: client and server apart, in the same places for
 * every run. Returns 0, or -1 unless CPUs 0 and 1 are both ours (nothing
 * pinned). */
static int pin_apart(pid_t daemon)
{
	cpu_set_t a, b;

	if (!CPU_ISSET(0, &all_cpus) || !CPU_ISSET(1, &all_cpus))
		return -1;
	CPU_ZERO(&a);
	CPU_SET(0, &a);
	CPU_ZERO(&b);
	CPU_SET(1, &b);
	sched_setaffinity(0, sizeof(cpu_set_t), &a);
	if (daemon > 0)
		sched_setaffinity(daemon, sizeof(cpu_set_t), &b);
	return 0;
}

/* Pins this process (and so the children it forks from now on) and the
 * daemon to one CPU, or back to all (cpu < 0). */
static void pin(pid_t daemon, int cpu)
{
	cpu_set_t one;

	CPU_ZERO(&one);
	CPU_SET(cpu < 0 ? 0 : cpu, &one);
	sched_setaffinity(0, sizeof(cpu_set_t), cpu < 0 ? &all_cpus : &one);
	if (daemon > 0)
		sched_setaffinity(daemon, sizeof(cpu_set_t),
				  cpu < 0 ? &all_cpus : &one);
}

/* ---- the floor program ------------------------------------------------------ */

/* Runs dlshare-floor with args (NULL-ended) and returns its output line in
 * out. Returns 0 or -1. */
static int floor_run(char *out, size_t cap, ...)
{
	const char *argv[24];
	int argc = 0;
	va_list ap;

	argv[argc++] = floor_bin;
	va_start(ap, cap);
	while (argc < 23 && (argv[argc] = va_arg(ap, const char *)))
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	if (util_run_capture(argv, NULL, out, cap) != 0) {
		fprintf(stderr, "bench: dlshare-floor %s failed\n", argv[1]);
		return -1;
	}
	return 0;
}

/* The value of "key=" in a floor output line, or NAN. */
static double kv(const char *line, const char *key)
{
	size_t n = strlen(key);

	for (const char *p = line; (p = strstr(p, key)); p += n)
		if ((p == line || p[-1] == ' ') && p[n] == '=')
			return strtod(p + n + 1, NULL);
	return NAN;
}

static char *num(char *buf, size_t cap, double v)
{
	snprintf(buf, cap, "%.0f", v);
	return buf;
}

/* ---- latency: round trips, get, first get ------------------------------------ */

/* How floor_rt's server runs. */
enum {
	RT_FD = 1,    /* one fd with each reply */
	RT_APART = 2, /* the server on CPU 1 (see pin_apart) */
	RT_EPOLL = 4, /* the server waits in epoll_wait, as an event loop */
};

static int floor_rt(const char *type, int how, size_t req, size_t rep,
		    long iters, double *p50, double *p99)
{
	char out[512], a[32], b[32], c[32];
	const char *argv[16];
	int n = 0;

	num(a, sizeof(a), (double)req);
	num(b, sizeof(b), (double)rep);
	num(c, sizeof(c), (double)iters);
	argv[n++] = "--req";
	argv[n++] = a;
	argv[n++] = "--rep";
	argv[n++] = b;
	argv[n++] = "--iters";
	argv[n++] = c;
	if (how & RT_FD)
		argv[n++] = "--fd";
	if (how & RT_APART) {
		argv[n++] = "--server-cpu";
		argv[n++] = "1";
	}
	if (how & RT_EPOLL)
		argv[n++] = "--epoll";
	while (n < 10)
		argv[n++] = NULL;
	if (floor_run(out, sizeof(out), "rt", "--type", type, argv[0], argv[1],
		      argv[2], argv[3], argv[4], argv[5], argv[6], argv[7],
		      argv[8], argv[9], (const char *)NULL))
		return -1;
	*p50 = kv(out, "p50_ns") / 1e3;
	*p99 = kv(out, "p99_ns") / 1e3;
	return isnan(*p50) ? -1 : 0;
}

static const char *const default_opts[] = {
	"--log-rate-limit", "0",
	NULL, NULL,
};

/* A daemon whose large store buffers are 2 MiB huge pages. */
static const char *const huge_opts[] = {
	"--log-rate-limit", "0", "--huge-page-min", "2M",
	NULL,
};

/* What one placement measures, p50s in us. */
struct placed {
	double floor;      /* the SEQPACKET round trip */
	double get;        /* dlshare's get+release */
	double floor_loop; /* the round trip to an epoll server */
	double wire;       /* get+release at the wire level */
	double floor_shm;  /* a round trip through shared memory and
			    * eventfds to an epoll server (rt --type shm) */
};

/* The floor round trip (how as floor_rt's) and dlshare's get+release, as
 * placed now, in the order of repeat r; with all, the epoll floor and the
 * wire-level get too. Returns 0 or -1. */
static int placed_pair(struct daemon_proc *d, const struct plan *pl,
		       const struct fig_packets *pk, int r, int how, int all,
		       struct placed *out)
{
	double p99;

	for (int side = 0; side < 2; side++) {
		int err;

		if ((side == 0) == (r % 2 == 0)) {
			err = floor_rt("seqpacket", how, pk->get, pk->reply,
				       pl->rt_iters, &out->floor, &p99);
			if (!err && all)
				err = floor_rt("seqpacket", how | RT_EPOLL,
					       pk->get, pk->reply, pl->rt_iters,
					       &out->floor_loop, &p99);
			if (!err && all)
				err = floor_rt("shm", how | RT_EPOLL, pk->get,
					       pk->reply, pl->rt_iters,
					       &out->floor_shm, &p99);
		} else {
			err = fig_get_latency(d, FIG_NAME, pl->rt_iters,
					      &out->get, &p99);
			if (!err && all)
				err = fig_raw_get(d, FIG_NAME, 0, pl->rt_iters,
						  &out->wire);
		}
		if (err)
			return -1;
	}
	out->get /= 1e3;
	out->wire /= 1e3;
	return 0;
}

static int section_latency(const struct plan *pl, const struct fig_packets *pk)
{
	struct daemon_proc d;
	int rc = -1;

	report_section("latency");
	struct fig *fs50 = report_decl("floor_rt_seqpacket_p50_us", "us",
		"floor: SEQPACKET round trip %zu/%zu B, p50", pk->get, pk->reply);
	struct fig *fs99 = report_decl("floor_rt_seqpacket_p99_us", "us",
		"floor: SEQPACKET round trip, p99");
	struct fig *ft50 = report_decl("floor_rt_stream_p50_us", "us",
		"floor: STREAM round trip %zu/%zu B, p50", pk->get, pk->reply);
	struct fig *ft99 = report_decl("floor_rt_stream_p99_us", "us",
		"floor: STREAM round trip, p99");
	struct fig *fsf50 = report_decl("floor_rt_seqpacket_fd_p50_us", "us",
		"floor: SEQPACKET round trip + 1 fd (%zu B), p50", pk->reply_fd);
	struct fig *ftf50 = report_decl("floor_rt_stream_fd_p50_us", "us",
		"floor: STREAM round trip + 1 fd, p50");
	struct fig *g50 = report_decl("get_p50_us", "us",
		"get+release, buffer already mapped, p50");
	struct fig *g99 = report_decl("get_p99_us", "us",
		"get+release, buffer already mapped, p99");
	struct fig *r50 = report_decl("get_p50_over_floor_unpinned", "x",
		"get p50 / SEQPACKET floor p50");
	struct fig *r99 = report_decl("get_p99_over_floor", "x",
		"get p99 / SEQPACKET floor p99");
	struct fig *w50 = report_decl("wire_get_p50_us", "us",
		"Get+Release at the wire level (no libdlshare), p50");
	struct fig *wr = report_decl("wire_get_p50_over_floor", "x",
		"wire-level get p50 / SEQPACKET floor p50");
	struct fig *p_fl = report_decl("floor_rt_seqpacket_p50_1cpu_us", "us",
		"floor: SEQPACKET round trip, all on one CPU, p50");
	struct fig *p_dl = report_decl("get_p50_1cpu_us", "us",
		"get+release, all on one CPU, p50");
	struct fig *p_r = report_decl("get_p50_over_floor_one_cpu", "x",
		"get p50 / floor p50, all on one CPU");
	struct fig *p_efl = report_decl("floor_rt_epoll_p50_1cpu_us", "us",
		"floor: round trip to an epoll-waiting server, one CPU, p50");
	struct fig *p_er = report_decl("get_p50_over_epoll_floor_one_cpu", "x",
		"get p50 / epoll-server floor p50, all on one CPU");
	struct fig *p_sfl = report_decl("floor_rt_shm_epoll_p50_1cpu_us", "us",
		"floor: shared memory + eventfds, epoll server, one CPU, p50");
	struct fig *p_sr = report_decl("floor_shm_over_epoll_floor_one_cpu", "x",
		"shared-memory floor / epoll-server floor, one CPU");
	/* The get goes through the request channel (1.9) once its client
	 * asked for one: its own mechanism's floor is this one. */
	struct fig *p_gs = report_decl("get_p50_over_shm_floor_one_cpu", "x",
		"get p50 / shared-memory floor p50, all on one CPU");
	struct fig *p_w = report_decl("wire_get_p50_1cpu_us", "us",
		"Get+Release at the wire level, all on one CPU, p50");
	struct fig *p_wr = report_decl("wire_get_p50_over_epoll_floor_one_cpu",
		"x", "wire-level get p50 / epoll-server floor p50, one CPU");
	struct fig *a_fl = report_decl("floor_rt_seqpacket_p50_apart_us", "us",
		"floor: SEQPACKET round trip, client CPU 0, server CPU 1, p50");
	struct fig *a_dl = report_decl("get_p50_apart_us", "us",
		"get+release, client CPU 0, daemon CPU 1, p50");
	struct fig *a_r = report_decl("get_p50_over_floor", "x",
		"get p50 / floor p50, client and server on CPUs 0 and 1");
	struct fig *a_efl = report_decl("floor_rt_epoll_p50_apart_us", "us",
		"floor: round trip to an epoll-waiting server, apart, p50");
	struct fig *a_er = report_decl("get_p50_over_epoll_floor_apart", "x",
		"get p50 / epoll-server floor p50, apart");
	struct fig *a_sfl = report_decl("floor_rt_shm_epoll_p50_apart_us", "us",
		"floor: shared memory + eventfds, epoll server, apart, p50");
	struct fig *a_sr = report_decl("floor_shm_over_epoll_floor_apart", "x",
		"shared-memory floor / epoll-server floor, apart");
	struct fig *a_w = report_decl("wire_get_p50_apart_us", "us",
		"Get+Release at the wire level, apart, p50");
	struct fig *a_wr = report_decl("wire_get_p50_over_epoll_floor_apart",
		"x", "wire-level get p50 / epoll-server floor p50, apart");
	struct fig *u50 = report_decl("get_reused_p50_1cpu_us", "us",
		"get+release reused by the version board (1.7), one CPU, p50");
	struct fig *u99 = report_decl("get_reused_p99_1cpu_us", "us",
		"get+release reused by the version board, one CPU, p99");
	struct fig *ur = report_decl("get_reused_p50_over_floor_one_cpu", "x",
		"reused get p50 / SEQPACKET floor p50, one CPU");
	struct fig *f50 = report_decl("first_get_p50_us", "us",
		"first get of a new 4 KiB buffer (fd + mmap), p50");
	struct fig *f99 = report_decl("first_get_p99_us", "us",
		"first get of a new buffer, p99");
	struct fig *rf = report_decl("first_get_p50_over_floor_fd", "x",
		"first get p50 / SEQPACKET+fd floor p50");
	/* Issue 16's goals. */
	report_goal(a_r, REPORT_GOAL_LE, 1.1);
	report_goal(p_r, REPORT_GOAL_LE, 1.3);

	if (daemon_start(&d, default_opts) ||
	    fig_publish(&d, FIG_NAME, FIG_TENSOR_BYTES))
		goto out;
	for (int r = 0; r < pl->reps; r++) {
		double a50, a99, b50, b99, c50, c99, e50, e99, x50, x99, y50, y99;
		double z50, u50_v, u99_v;
		struct placed one;
		int err;

		progress("latency: repeat %d/%d", r + 1, pl->reps);
		/* Alternate which side goes first, so drift cancels. */
		for (int side = 0; side < 2; side++) {
			if ((side == 0) == (r % 2 == 0)) {
				if (floor_rt("seqpacket", 0, pk->get, pk->reply,
					     pl->rt_iters, &a50, &a99) ||
				    floor_rt("stream", 0, pk->get, pk->reply,
					     pl->rt_iters, &b50, &b99) ||
				    floor_rt("seqpacket", RT_FD, pk->get,
					     pk->reply_fd, pl->first_iters * 4,
					     &c50, &c99) ||
				    floor_rt("stream", RT_FD, pk->get, pk->reply_fd,
					     pl->first_iters * 4, &e50, &e99))
					goto out;
			} else {
				if (fig_get_latency(&d, FIG_NAME, pl->rt_iters,
						    &x50, &x99) ||
				    fig_raw_get(&d, FIG_NAME, 0, pl->rt_iters,
						&z50) ||
				    fig_first_get(&d, pl->first_iters, &y50,
						  &y99))
					goto out;
				z50 /= 1e3;
				x50 /= 1e3;
				x99 /= 1e3;
				y50 /= 1e3;
				y99 /= 1e3;
			}
		}
		report_add(fs50, a50);
		report_add(fs99, a99);
		report_add(ft50, b50);
		report_add(ft99, b99);
		report_add(fsf50, c50);
		report_add(ftf50, e50);
		report_add(g50, x50);
		report_add(g99, x99);
		report_add(r50, x50 / a50);
		report_add(r99, x99 / a99);
		report_add(f50, y50);
		report_add(f99, y99);
		report_add(rf, y50 / c50);
		report_add(w50, z50);
		report_add(wr, z50 / a50);

		/* The same on one CPU: no cross-CPU wakeups (on a VM those
		 * cost tens of microseconds and come and go with the
		 * scheduler's placement), only the work itself. */
		pin(d.pid, 0);
		err = placed_pair(&d, pl, pk, r, 0, 1, &one) ||
		      fig_get_latency_reused(&d, FIG_NAME, pl->rt_iters, &u50_v,
					     &u99_v);
		pin(d.pid, -1);
		if (err)
			goto out;
		report_add(u50, u50_v / 1e3);
		report_add(u99, u99_v / 1e3);
		report_add(ur, u50_v / 1e3 / one.floor);
		report_add(p_fl, one.floor);
		report_add(p_dl, one.get);
		report_add(p_r, one.get / one.floor);
		report_add(p_efl, one.floor_loop);
		report_add(p_er, one.get / one.floor_loop);
		report_add(p_sfl, one.floor_shm);
		report_add(p_sr, one.floor_shm / one.floor_loop);
		report_add(p_gs, one.get / one.floor_shm);
		report_add(p_w, one.wire);
		report_add(p_wr, one.wire / one.floor_loop);

		/* Apart, but always in the same places: unpinned, whether a
		 * pair shares a CPU changes from run to run, and with it the
		 * wakeup cost (the key figure compares like with like). */
		if (pin_apart(d.pid))
			continue;
		err = placed_pair(&d, pl, pk, r, RT_APART, 1, &one);
		pin(d.pid, -1);
		if (err)
			goto out;
		report_add(a_fl, one.floor);
		report_add(a_dl, one.get);
		report_add(a_r, one.get / one.floor);
		/* What of the gap apart is the event loop's own wait: its
		 * epoll_wait returns on a wakeup, then recvmsg reads. */
		report_add(a_efl, one.floor_loop);
		report_add(a_er, one.get / one.floor_loop);
		report_add(a_sfl, one.floor_shm);
		report_add(a_sr, one.floor_shm / one.floor_loop);
		report_add(a_w, one.wire);
		report_add(a_wr, one.wire / one.floor_loop);
	}
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

/* ---- throughput --------------------------------------------------------------- */

static int section_throughput(const struct plan *pl,
			      const struct fig_packets *pk)
{
	static const int ns[] = { 1, 4, 16, 64 };
	static const char *const kf[] = { "floor_server_ops_1", "floor_server_ops_4",
		"floor_server_ops_16", "floor_server_ops_64" };
	static const char *const kd[] = { "throughput_ops_1", "throughput_ops_4",
		"throughput_ops_16", "throughput_ops_64" };
	static const char *const kr[] = { "throughput_over_floor_1",
		"throughput_over_floor_4", "throughput_over_floor",
		"throughput_over_floor_64" };
	struct fig *ff[4], *fd[4], *fr[4];
	struct daemon_proc d;
	int rc = -1;

	report_section("throughput");
	for (int i = 0; i < 4; i++) {
		ff[i] = report_decl(kf[i], "ops/s",
			"floor: epoll server, %d client processes", ns[i]);
		fd[i] = report_decl(kd[i], "ops/s",
			"get+release, %d client processes", ns[i]);
		fr[i] = report_decl(kr[i], "x",
			"throughput / floor, %d clients", ns[i]);
	}
	report_goal(fr[2], REPORT_GOAL_GE, 0.85);
	if (daemon_start(&d, default_opts) ||
	    fig_publish(&d, FIG_NAME, FIG_TENSOR_BYTES))
		goto out;
	/* A warm-up of both sides, not counted: the first run after the
	 * daemon's start (page faults, the allocator's arenas, the CPU's
	 * frequency) would otherwise be the first repeat's. */
	{
		char out[512], a[16], b[16], c[16];
		double dl;

		if (floor_run(out, sizeof(out), "server", "--clients", "16",
			      "--req", num(a, sizeof(a), (double)pk->get),
			      "--rep", num(b, sizeof(b), (double)pk->reply),
			      "--ms", num(c, sizeof(c), 200.0),
			      (const char *)NULL) ||
		    fig_throughput(&d, FIG_NAME, 16, 200, &dl))
			goto out;
	}
	for (int r = 0; r < pl->reps; r++) {
		progress("throughput: repeat %d/%d", r + 1, pl->reps);
		for (int i = 0; i < 4; i++) {
			char out[512], a[16], b[16], c[16], m[16];
			double fl = NAN, dl = NAN;

			for (int side = 0; side < 2; side++) {
				if ((side == 0) == (r % 2 == 0)) {
					if (floor_run(out, sizeof(out), "server",
						      "--clients", num(a, sizeof(a), ns[i]),
						      "--req", num(b, sizeof(b), (double)pk->get),
						      "--rep", num(c, sizeof(c), (double)pk->reply),
						      "--ms", num(m, sizeof(m), (double)pl->tp_ms),
						      (const char *)NULL))
						goto out;
					fl = kv(out, "ops_per_s");
				} else if (fig_throughput(&d, FIG_NAME, ns[i],
							  pl->tp_ms, &dl)) {
					goto out;
				}
			}
			report_add(ff[i], fl);
			report_add(fd[i], dl);
			report_add(fr[i], dl / fl);
		}
	}
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

/* ---- handoff --------------------------------------------------------------------- */

/* A number from a sysfs file, or -1. */
static long read_long(const char *path)
{
	FILE *f = fopen(path, "re");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

/* 1 when the kernel's pool has free huge pages of 2^log2 bytes for bytes. */
static int huge_free(int log2, uint64_t bytes)
{
	char path[128];
	long n;

	snprintf(path, sizeof(path),
		 "/sys/kernel/mm/hugepages/hugepages-%llukB/free_hugepages",
		 (unsigned long long)((UINT64_C(1) << log2) >> 10));
	n = read_long(path);
	return n > 0 && (uint64_t)n << log2 >= bytes;
}

/* The median of n values, in ns, divided by div. */
static double median_of(const double *v, long n, double div)
{
	struct samples s = { 0 };
	double m;

	for (long i = 0; i < n; i++)
		samples_add(&s, v[i]);
	m = samples_quantile(&s, 0.5) / div;
	samples_free(&s);
	return m;
}

static int section_handoff(const struct plan *pl)
{
	char big[32], bb[32], it[32], out[512];
	/* Zeroed: daemon_stop() of one never started does nothing. */
	struct daemon_proc d = { 0 }, dh = { 0 };
	double *v = calloc((size_t)pl->small_iters, sizeof(*v));
	int rc = -1, is_gib = pl->big == (UINT64_C(1) << 30);
	int huge2 = huge_free(21, pl->big), huge1 = huge_free(30, pl->big);

	report_section("handoff");
	util_size_name(pl->big, " ", big, sizeof(big));
	struct fig *fs = report_decl("floor_handoff_4KiB_us", "us",
		"floor: munmap+seal+send fd+mmap, 4 KiB");
	struct fig *fb = report_decl("floor_handoff_big_ms", "ms",
		"floor: munmap+seal+send fd+mmap, %s", big);
	struct fig *fbu = report_decl("floor_handoff_big_munmap_ms", "ms",
		"floor: of which munmap of the written %s", big);
	struct fig *fbs = report_decl("floor_handoff_big_seal_ms", "ms",
		"floor: of which F_SEAL_WRITE on %s", big);
	struct fig *fr = report_decl("floor_handoff_big_over_4KiB", "x",
		"floor: %s / 4 KiB", big);
	struct fig *fh2 = report_decl("floor_handoff_big_2MiB_pages_ms", "ms",
		"floor: %s in 2 MiB huge pages", big);
	struct fig *fh1 = report_decl("floor_handoff_big_1GiB_pages_ms", "ms",
		"floor: %s in 1 GiB huge pages", big);
	struct fig *ds = report_decl("handoff_4KiB_us", "us",
		"store: seal to consumer holding it, 4 KiB");
	struct fig *db = report_decl("handoff_big_ms", "ms",
		"store: seal to consumer holding it, %s", big);
	/* At 1 GiB the key below is this figure. */
	struct fig *dr = is_gib ? NULL :
		report_decl("handoff_big_over_4KiB", "x",
			    "store: handoff %s / 4 KiB", big);
	struct fig *key = report_decl("handoff_1GiB_over_4KiB", "x",
		"store: handoff 1 GiB / 4 KiB");
	struct fig *hb = report_decl("handoff_big_huge_ms", "ms",
		"store, --huge-page-min 2M: seal to consumer holding it, %s",
		big);
	struct fig *hr = report_decl("handoff_big_huge_over_4KiB", "x",
		"store, --huge-page-min 2M: %s / 4 KiB", big);
	struct fig *es = report_decl("export_handoff_4KiB_us", "us",
		"export: publish to consumer holding it, 4 KiB");
	struct fig *eb = report_decl("export_handoff_big_ms", "ms",
		"export: publish to consumer holding it, %s", big);
	/* At 1 GiB the key export_handoff_1GiB_over_4KiB is this figure. */
	struct fig *er = is_gib ? NULL :
		report_decl("export_handoff_big_over_4KiB", "x",
			    "export: handoff %s / 4 KiB", big);
	struct fig *ekey = report_decl("export_handoff_1GiB_over_4KiB", "x",
		"export: handoff 1 GiB / 4 KiB");
	/* The same 4 KiB export handoff after the producer wrote as much
	 * other memory as the large version holds: the large side's caches
	 * and TLBs are cold from its writes, the 4 KiB side's above are hot
	 * from the previous handoff. This ratio is what grows with size in
	 * the handoff itself (BENCHMARKS.md, "Issue 16, session 6"). */
	struct fig *ec = report_decl("export_handoff_4KiB_evicted_us", "us",
		"export: 4 KiB after the producer wrote %s elsewhere", big);
	struct fig *ecr = report_decl("export_handoff_big_over_4KiB_evicted",
		"x", "export: handoff %s / 4 KiB, both after writing %s",
		big, big);
	/* The daemon letting go of a large version nobody maps: its pages
	 * are freed by whoever closes the last reference (since session 15
	 * a pool thread, before it the loop: every peer waited). */
	struct fig *fz0 = report_decl("free_none_worst_get_ms", "ms",
		"free: a client's worst get in 200 ms, nothing freed");
	struct fig *fz = report_decl("free_big_worst_get_ms", "ms",
		"free: the same while the daemon frees a written %s", big);
	struct fig *fzr = report_decl("free_big_worst_get_over_none", "x",
		"free: worst get while freeing %s / nothing freed", big);
	report_goal(key, REPORT_GOAL_LE, 1.2);
	report_goal(ekey, REPORT_GOAL_LE, 1.2);
	if (!is_gib) {
		key->is_null = 1;
		report_note(key, "not measured: %s used instead (not enough "
			    "free memory)", big);
		ekey->is_null = 1;
		report_note(ekey, "not measured: %s used instead (not enough "
			    "free memory)", big);
	}
	if (!huge2) {
		fh2->is_null = 1;
		report_note(fh2, "not measured: no free 2 MiB pages (vm.nr_hugepages)");
		hb->is_null = 1;
		report_note(hb, "not measured: no free 2 MiB pages (vm.nr_hugepages)");
		hr->is_null = 1;
		report_note(hr, "not measured");
	}
	if (!huge1) {
		fh1->is_null = 1;
		report_note(fh1, "not measured: no free 1 GiB page (hugepages-1048576kB)");
	}
	num(bb, sizeof(bb), (double)pl->big);
	num(it, sizeof(it), (double)pl->small_iters);
	if (!v || daemon_start(&d, default_opts) ||
	    (huge2 && daemon_start(&dh, huge_opts)))
		goto out;
	for (int r = 0; r < pl->reps; r++) {
		double s_fl = NAN, b_fl = NAN, s_dl = NAN, b_dl = NAN;
		double s_ex = NAN, b_ex = NAN, b_hp = NAN, c_ex = NAN;
		double z0, z;

		progress("handoff: repeat %d/%d (%s)", r + 1, pl->reps, big);
		for (int side = 0; side < 2; side++) {
			if ((side == 0) == (r % 2 == 0)) {
				if (floor_run(out, sizeof(out), "handoff",
					      "--bytes", "4096", "--iters", it,
					      (const char *)NULL))
					goto out;
				s_fl = kv(out, "total_ns") / 1e3;
				if (floor_run(out, sizeof(out), "handoff",
					      "--bytes", bb, "--iters", "1",
					      (const char *)NULL))
					goto out;
				b_fl = kv(out, "total_ns") / 1e6;
				report_add(fbu, kv(out, "munmap_ns") / 1e6);
				report_add(fbs, kv(out, "seal_ns") / 1e6);
				if (huge2 && floor_run(out, sizeof(out), "handoff",
						       "--bytes", bb, "--iters", "1",
						       "--huge", "2M",
						       (const char *)NULL) == 0)
					report_add(fh2,
						   kv(out, "total_ns") / 1e6);
				if (huge1 && floor_run(out, sizeof(out), "handoff",
						       "--bytes", bb, "--iters", "1",
						       "--huge", "1G",
						       (const char *)NULL) == 0)
					report_add(fh1,
						   kv(out, "total_ns") / 1e6);
			} else {
				double one, three[3];

				if (fig_handoff(&d, 4096, pl->small_iters, 0, 0, v))
					goto out;
				s_dl = median_of(v, pl->small_iters, 1e3);
				if (fig_handoff(&d, pl->big, 1, 0, 0, &one))
					goto out;
				b_dl = one / 1e6;
				if (fig_handoff(&d, 4096, pl->small_iters, 1, 0, v))
					goto out;
				s_ex = median_of(v, pl->small_iters, 1e3);
				/* Export mode is cheap at any size: the median of
				 * three, like the 4 KiB side's median, not one
				 * cold sample against a warm median. */
				if (fig_handoff(&d, pl->big, 3, 1, 0, three))
					goto out;
				b_ex = median_of(three, 3, 1e6);
				if (fig_handoff(&d, 4096, 3, 1, pl->big, three))
					goto out;
				c_ex = median_of(three, 3, 1e3);
				/* The pool was checked to hold the buffer; the
				 * floor's pages are back by now. */
				if (huge2 &&
				    fig_handoff(&dh, pl->big, 1, 0, 0, &one) == 0)
					b_hp = one / 1e6;
			}
		}
		report_add(fs, s_fl);
		report_add(fb, b_fl);
		report_add(fr, b_fl * 1e3 / s_fl);
		report_add(ds, s_dl);
		report_add(db, b_dl);
		if (dr)
			report_add(dr, b_dl * 1e3 / s_dl);
		if (is_gib)
			report_add(key, b_dl * 1e3 / s_dl);
		report_add(es, s_ex);
		report_add(eb, b_ex);
		report_add(is_gib ? ekey : er, b_ex * 1e3 / s_ex);
		report_add(ec, c_ex);
		report_add(ecr, b_ex * 1e3 / c_ex);
		if (!isnan(b_hp)) {
			report_add(hb, b_hp);
			report_add(hr, b_hp * 1e3 / s_dl);
		}
		if (fig_free(&d, 0, &z0) || fig_free(&d, pl->big, &z))
			goto out;
		report_add(fz0, z0 / 1e6);
		report_add(fz, z / 1e6);
		report_add(fzr, z / z0);
	}
	rc = 0;
out:
	free(v);
	daemon_stop(&d);
	daemon_stop(&dh);
	return rc;
}

/* ---- scale: names ---------------------------------------------------------------- */

static uint64_t nofile_limit;

/* One point of the scale section: a daemon holding n names. */
struct scale_point {
	long n;
	int raw;                 /* fd-less names, read at the wire level */
	int up;
	struct daemon_proc d;
	pid_t holder;            /* raw: the producer keeping them alive */
	struct fig *mem, *kern, *rate, *get;
};

static int scale_fill(struct scale_point *sp, const char *const *opts)
{
	uint64_t rss0, rss1, k0, k1;
	double secs;

	progress("scale: registering %ld %s names", sp->n,
		 sp->raw ? "fd-less" : "host");
	if (daemon_start(&sp->d, opts))
		return -1;
	sp->up = 1;
	/* The tables exist before the baseline. */
	if (fig_publish(&sp->d, "warm/x", 4))
		return -1;
	util_sleep_ms(50);
	rss0 = util_proc_status_bytes(sp->d.pid, "VmRSS");
	k0 = util_meminfo_bytes("Slab") + util_meminfo_bytes("Shmem");
	if (sp->raw) {
		sp->holder = fig_raw_register(&sp->d, "r/", sp->n, &secs);
		if (sp->holder < 0)
			return -1;
	} else if (fig_populate(&sp->d, sp->n, 4, &secs)) {
		return -1;
	}
	util_sleep_ms(50);
	rss1 = util_proc_status_bytes(sp->d.pid, "VmRSS");
	k1 = util_meminfo_bytes("Slab") + util_meminfo_bytes("Shmem");
	report_add(sp->mem, ((double)rss1 - (double)rss0) / (double)sp->n);
	/* /proc/meminfo moves in steps too coarse for 100 names, and other
	 * processes move it too: an estimate at 10^4 and up. */
	if (sp->kern && sp->n >= 10000)
		report_add(sp->kern, ((double)k1 - (double)k0) / (double)sp->n);
	else if (sp->kern)
		report_note(sp->kern, "too few names to see in /proc/meminfo");
	report_add(sp->rate, (double)sp->n / secs);
	return 0;
}

static int section_scale(const struct plan *pl)
{
	static const long sizes[] = { 100, 10000, 1000000 };
	static const char *const kmem[] = { "mem_per_tensor_bytes_100",
		"mem_per_tensor_bytes_10k", "mem_per_tensor_bytes_1M" };
	static const char *const kslab[] = { "kernel_per_tensor_bytes_100",
		"kernel_per_tensor_bytes_10k", "kernel_per_tensor_bytes_1M" };
	static const char *const kget[] = { "get_p50_us_100", "get_p50_us_10k",
		"get_p50_us_1M" };
	static const char *const krate[] = { "register_per_s_100",
		"register_per_s_10k", "register_per_s_1M" };
	static const char *const rmem[] = { "registry_mem_per_tensor_bytes_100",
		"registry_mem_per_tensor_bytes_10k",
		"registry_mem_per_tensor_bytes_1M" };
	static const char *const rget[] = { "registry_get_p50_us_100",
		"registry_get_p50_us_10k", "registry_get_p50_us_1M" };
	static const char *const rrate[] = { "registry_register_per_s_100",
		"registry_register_per_s_10k", "registry_register_per_s_1M" };
	static const char *const lbl[] = { "10^2", "10^4", "10^6" };
	struct scale_point sp[6];
	int rc = -1, top = -1;
	char uidn[32];

	report_section("scale");
	memset(sp, 0, sizeof(sp));
	snprintf(uidn, sizeof(uidn), "%ld", pl->scale_max * 2 + 1000);
	const char *const opts[] = {
		"--log-rate-limit", "0",
		"--uid-names", uidn,
		/* Only the daemon-wide fd limit (derived from RLIMIT_NOFILE)
		 * applies: every name here is one uid's. */
		"--uid-open-fds", "1073741824",
		NULL, NULL,
	};
	struct fig *fmem = report_decl("mem_per_tensor_bytes", "B",
		"daemon memory per registered tensor (largest N)");
	report_goal(fmem, REPORT_GOAL_LT, 512);
	for (int i = 0; i < 3; i++) {
		struct scale_point *h = &sp[i], *w = &sp[3 + i];

		h->n = w->n = sizes[i];
		w->raw = 1;
		h->mem = report_decl(kmem[i], "B",
			"host names: daemon RSS per tensor, %s", lbl[i]);
		h->kern = report_decl(kslab[i], "B",
			"host names: kernel (Slab+Shmem) per tensor, %s", lbl[i]);
		h->rate = report_decl(krate[i], "/s",
			"host names: registered a second (create+seal), %s",
			lbl[i]);
		h->get = report_decl(kget[i], "us",
			"host names: get+release p50 among %s", lbl[i]);
	}
	struct fig *r4 = report_decl("get_p50_10k_over_100", "x",
		"host names: get p50 at 10^4 / at 10^2");
	struct fig *r6h = report_decl("host_get_p50_1M_over_100", "x",
		"host names: get p50 at 10^6 / at 10^2");
	for (int i = 0; i < 3; i++) {
		struct scale_point *w = &sp[3 + i];

		w->mem = report_decl(rmem[i], "B",
			"fd-less names: daemon RSS per tensor, %s", lbl[i]);
		w->rate = report_decl(rrate[i], "/s",
			"fd-less names: registered a second (wire), %s", lbl[i]);
		w->get = report_decl(rget[i], "us",
			"fd-less names: Get+Release p50 (wire) among %s",
			lbl[i]);
	}
	struct fig *w4 = report_decl("registry_get_p50_10k_over_100", "x",
		"fd-less names: Get p50 at 10^4 / at 10^2");
	struct fig *w6 = report_decl("registry_get_p50_1M_over_100", "x",
		"fd-less names: Get p50 at 10^6 / at 10^2");
	struct fig *key = report_decl("get_p50_1M_over_100", "x",
		"get p50 at 10^6 names / at 10^2");
	report_goal(key, REPORT_GOAL_LE, 1.2);

	for (int j = 0; j < 6; j++) {
		struct scale_point *p = &sp[j];
		int i = j % 3;

		if (p->n > pl->scale_max) {
			p->mem->is_null = p->rate->is_null = p->get->is_null = 1;
			if (p->kern)
				p->kern->is_null = 1;
			report_note(p->get, "not measured (%s)",
				    pl->quick ? "--quick" : "--scale-max");
			continue;
		}
		/* A host buffer holds two fds in the daemon: its memfd and
		 * the read-only reopen readers get. */
		if (!p->raw && 2 * (uint64_t)p->n + 4096 > nofile_limit) {
			p->mem->is_null = p->rate->is_null = p->get->is_null = 1;
			p->kern->is_null = 1;
			report_note(p->get, "not measured: RLIMIT_NOFILE %llu < 2 x "
				    "names (two fds per name in the daemon)",
				    (unsigned long long)nofile_limit);
			continue;
		}
		if (scale_fill(p, opts))
			goto out;
		if (!p->raw)
			top = i;
	}
	if (top >= 0) {
		report_add(fmem, sp[top].mem->reps.v[0]);
		report_note(fmem, "host names, at %s; one float32[1] tensor "
			    "each", lbl[top]);
	}
	for (int r = 0; r < pl->reps; r++) {
		double p[6] = { NAN, NAN, NAN, NAN, NAN, NAN };

		progress("scale: repeat %d/%d", r + 1, pl->reps);
		/* Alternate the order of the daemons between repeats. */
		for (int k = 0; k < 6; k++) {
			int j = r % 2 ? 5 - k : k;
			struct scale_point *s = &sp[j];
			int err;

			if (!s->up)
				continue;
			err = s->raw ? fig_raw_get(&s->d, "r/", s->n,
						   pl->spread_iters, &p[j]) :
			      fig_get_spread(&s->d, s->n, pl->spread_iters,
					     &p[j]);
			if (err)
				goto out;
			report_add(s->get, p[j] / 1e3);
		}
		/* Quick mode's key: host names where the fds allow, else
		 * the registry alone (fd-less names). */
		if (sp[1].up)
			report_add(r4, p[1] / p[0]);
		else if (sp[4].up)
			report_add(r4, p[4] / p[3]);
		if (sp[2].up)
			report_add(r6h, p[2] / p[0]);
		if (sp[4].up)
			report_add(w4, p[4] / p[3]);
		if (sp[5].up)
			report_add(w6, p[5] / p[3]);
		/* The goal's figure: host names where this machine allows a
		 * memfd each, else the registry alone. */
		if (sp[2].up)
			report_add(key, p[2] / p[0]);
		else if (sp[5].up)
			report_add(key, p[5] / p[3]);
	}
	if (!sp[2].up && sp[5].up)
		report_note(key, "fd-less names (host names need "
			    "RLIMIT_NOFILE > 2 x 10^6)");
	if (!sp[1].up && sp[4].up)
		report_note(r4, "fd-less names (host names need "
			    "RLIMIT_NOFILE > 2 x 10^4 + 4096)");
	if (!sp[2].up && !sp[5].up) {
		key->is_null = 1;
		report_note(key, "not measured (%s); see get_p50_10k_over_100",
			    pl->quick ? "--quick" : "limits");
	}
	if (!sp[2].up) {
		r6h->is_null = 1;
		report_note(r6h, "not measured");
	}
	if (!sp[5].up) {
		w6->is_null = 1;
		report_note(w6, "not measured");
	}
	rc = 0;
out:
	for (int j = 0; j < 6; j++) {
		fig_holder_stop(sp[j].holder);
		if (sp[j].up)
			daemon_stop(&sp[j].d);
	}
	return rc;
}

/* ---- idle connections ----------------------------------------------------------- */

static int section_idle(const struct plan *pl)
{
	struct daemon_proc a, b;
	char maxc[32];
	pid_t holder = -1;
	int rc = -1, a_up = 0, b_up = 0;
	uint64_t rss0, rss1, t0;

	report_section("idle");
	snprintf(maxc, sizeof(maxc), "%d", pl->idle_n + 100);
	const char *const opts[] = {
		"--log-rate-limit", "0",
		"--max-connections", maxc,
		"--uid-connections", maxc,
		NULL, NULL,
	};
	struct fig *fa = report_decl("idle_get_p50_alone_us", "us",
		"get+release p50, daemon with no other connection");
	struct fig *fb = report_decl("idle_get_p50_beside_us", "us",
		"get+release p50 beside %d idle connections", pl->idle_n);
	struct fig *fr = report_decl("idle_get_p50_over_alone", "x",
		"p50 beside %d idle / alone", pl->idle_n);
	struct fig *fm = report_decl("idle_mem_per_conn_bytes", "B",
		"daemon RSS per idle connection");
	struct fig *fc = report_decl("idle_connect_per_s", "/s",
		"connections + Hello a second (one process)");

	if ((uint64_t)pl->idle_n + 4096 > nofile_limit) {
		fr->is_null = 1;
		report_note(fr, "not measured: RLIMIT_NOFILE %llu",
			    (unsigned long long)nofile_limit);
		return 0;
	}
	if (daemon_start(&a, opts))
		goto out;
	a_up = 1;
	if (daemon_start(&b, opts))
		goto out;
	b_up = 1;
	if (fig_publish(&a, FIG_NAME, FIG_TENSOR_BYTES) ||
	    fig_publish(&b, FIG_NAME, FIG_TENSOR_BYTES))
		goto out;
	progress("idle: opening %d connections", pl->idle_n);
	util_sleep_ms(50);
	rss0 = util_proc_status_bytes(b.pid, "VmRSS");
	t0 = util_now_ns();
	holder = fig_idle_start(&b, pl->idle_n);
	if (holder < 0)
		goto out;
	report_add(fc, pl->idle_n / ((double)(util_now_ns() - t0) / 1e9));
	util_sleep_ms(50);
	rss1 = util_proc_status_bytes(b.pid, "VmRSS");
	report_add(fm, ((double)rss1 - (double)rss0) / pl->idle_n);
	for (int r = 0; r < pl->reps; r++) {
		double pa = NAN, pb = NAN, x;

		progress("idle: repeat %d/%d", r + 1, pl->reps);
		for (int side = 0; side < 2; side++) {
			if ((side == 0) == (r % 2 == 0)) {
				if (fig_get_latency(&a, FIG_NAME, pl->rt_iters,
						    &pa, &x))
					goto out;
			} else if (fig_get_latency(&b, FIG_NAME, pl->rt_iters,
						   &pb, &x)) {
				goto out;
			}
		}
		report_add(fa, pa / 1e3);
		report_add(fb, pb / 1e3);
		report_add(fr, pb / pa);
	}
	rc = 0;
out:
	fig_holder_stop(holder);
	if (b_up)
		daemon_stop(&b);
	if (a_up)
		daemon_stop(&a);
	return rc;
}

/* ---- a state dict in one version ------------------------------------------------- */

static const char *peers_venv_python;
static int run_peers(const struct daemon_proc *d, const char *python,
		     const char *part, int reps, char *out, size_t cap);


static int section_bundle(const struct plan *pl)
{
	struct daemon_proc d;
	const long n = 100000;
	int rc = -1;

	report_section("bundle");
	struct fig *fp = report_decl("bundle_100k_publish_ms", "ms",
		"publish of 10^5 float32[16] tensors, 60-byte keys (copy)");
	struct fig *fc = report_decl("bundle_100k_publish_daemon_cpu_ms", "ms",
		"daemon CPU for that publish (manifest checked and sealed)");
	struct fig *fg = report_decl("bundle_100k_get_ms", "ms",
		"warm get of it until every tensor is reachable");
	struct fig *fl = report_decl("bundle_100k_load_state_dict_ms", "ms",
		"Python: get + load_state_dict into 10^5 NumPy arrays");
	static char out[16384];

	if (daemon_start(&d, NULL))
		return -1;
	for (int r = 0; r < pl->reps; r++) {
		double p, c, g[5];

		progress("bundle: repeat %d/%d", r + 1, pl->reps);
		if (fig_bundle(&d, n, 5, &p, &c, g))
			goto out;
		report_add(fp, p);
		report_add(fc, c);
		for (int i = 0; i < 5; i++)
			report_add(fg, g[i]);
	}
	progress("bundle: load_state_dict, %d repeats", pl->reps);
	if (run_peers(&d, peers_venv_python, "load_state_dict", pl->reps, out,
		      sizeof(out)) == 0) {
		for (char *line = strtok(out, "\n"); line;
		     line = strtok(NULL, "\n"))
			if (!isnan(kv(line, "load_ns")))
				report_add(fl, kv(line, "load_ns") / 1e6);
	} else {
		fl->is_null = 1;
		report_note(fl, "not measured: peers.py load_state_dict under "
			    "%s failed or found no NumPy", peers_venv_python);
	}
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

/* ---- kill storm ------------------------------------------------------------------- */

static int section_storm(const struct plan *pl)
{
	struct daemon_proc d;
	char maxc[32], leases[32], n[16], out[256];
	int rc = -1;

	report_section("storm");
	snprintf(maxc, sizeof(maxc), "%d", pl->storm_n + 100);
	snprintf(leases, sizeof(leases), "%d",
		 pl->storm_n * pl->storm_leases * 2 + 1000);
	const char *const opts[] = {
		"--log-rate-limit", "0",
		"--max-connections", maxc,
		"--uid-connections", maxc,
		"--uid-leases", leases,
		NULL, NULL,
	};
	struct fig *fl = report_decl("storm_reclaim_ms", "ms",
		"kill storm: %d clients x %d leases, until leases = 0",
		pl->storm_n, pl->storm_leases);
	struct fig *fc = report_decl("storm_conns_ms", "ms",
		"kill storm: until the daemon has closed every connection");
	struct fig *ff = report_decl("floor_storm_ms", "ms",
		"floor: epoll server, %d clients killed, all hang-ups seen",
		pl->storm_n);
	struct fig *fdc = report_decl("storm_daemon_cpu_ms", "ms",
		"kill storm: daemon's loop on CPU, kill to leases = 0");
	struct fig *ffc = report_decl("floor_storm_server_cpu_ms", "ms",
		"floor: epoll server on CPU, kill to last hang-up");
	struct fig *fsh = report_decl("floor_storm_shaped_ms", "ms",
		"floor: the same, clients shaped like dlshare's (--shaped)");
	/* The key is taken over the shaped floor: most of the window is the
	 * kernel tearing down the killed processes, and a client that holds
	 * leases has what the shaped one has (the library's receiver thread,
	 * the buffer mapped), so only the shaped floor does the same
	 * teardown. The bare floor's ratio (the key's meaning until
	 * 2026-12-03, session 6) stays beside it; BENCHMARKS.md, "Issue 16,
	 * session 6". */
	struct fig *fr = report_decl("kill_storm_over_floor", "x",
		"kill storm reclaim / shaped floor");
	struct fig *frb = report_decl("kill_storm_over_bare_floor", "x",
		"kill storm reclaim / bare floor");
	struct fig *fcr = report_decl("kill_storm_cpu_over_floor", "x",
		"kill storm: daemon's loop CPU / floor server's");
	report_goal(fr, REPORT_GOAL_LE, 1.2);

	if ((uint64_t)pl->storm_n * 3 + 4096 > nofile_limit) {
		fl->is_null = 1;
		report_note(fl, "not measured: RLIMIT_NOFILE");
		return 0;
	}
	if (daemon_start(&d, opts) ||
	    fig_publish(&d, FIG_NAME, FIG_TENSOR_BYTES))
		goto out;
	for (int r = 0; r < pl->storm_reps; r++) {
		double lms = NAN, cms = NAN, fms = NAN, dcpu = NAN, fcpu = NAN;
		double sms = NAN;

		progress("storm: repeat %d/%d (%d clients)", r + 1,
			 pl->storm_reps, pl->storm_n);
		/* Three sides, in an order that turns with each repeat. */
		for (int k = 0; k < 3; k++) {
			int side = (k + r) % 3;

			if (side == 0) {
				if (floor_run(out, sizeof(out), "storm",
					      "--clients",
					      num(n, sizeof(n), pl->storm_n),
					      (const char *)NULL))
					goto out;
				fms = kv(out, "ms");
				fcpu = kv(out, "cpu_ms");
				if (fcpu < 0)
					fcpu = NAN;
			} else if (side == 1) {
				if (floor_run(out, sizeof(out), "storm",
					      "--clients",
					      num(n, sizeof(n), pl->storm_n),
					      "--shaped", (const char *)NULL))
					goto out;
				sms = kv(out, "ms");
			} else if (fig_storm(&d, pl->storm_n, pl->storm_leases,
					     &lms, &cms, &dcpu)) {
				goto out;
			}
		}
		report_add(fl, lms);
		report_add(fc, cms);
		report_add(ff, fms);
		report_add(fdc, dcpu);
		report_add(ffc, fcpu);
		report_add(fsh, sms);
		report_add(fr, lms / sms);
		report_add(frb, lms / fms);
		report_add(fcr, dcpu / fcpu);
	}
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

/* ---- publish (copy) --------------------------------------------------------------- */

#define PUB_BYTES (UINT64_C(256) << 20)

/* The interpreter that runs bench/publish_sources.py (torch and NumPy),
 * and where it finds the dlshare package. */
static const char *pub_python = "/usr/bin/python3";
#ifdef DLBENCH_PYTHONPATH
static const char *pub_pythonpath = DLBENCH_PYTHONPATH;
#else
static const char *pub_pythonpath;
#endif

/* Runs python on the bench script argv[0] (in bench/) with the rest of
 * argv, PYTHONPATH set to where the package is; its stdout into out.
 * Returns 0, 77 (its interpreter lacks torch, NumPy or safetensors, or
 * is missing) or -1. */
static int run_python(const char *python, const char *const *argv,
		      char *out, size_t cap)
{
	char script[PATH_MAX];
	const char *const env[] = { "PYTHONPATH", pub_pythonpath, NULL };
	const char *args[16];
	int st, n = 0;

	if (access(python, X_OK) != 0)
		return 77;
	snprintf(script, sizeof(script), "%s/%s", DLBENCH_SRC_DIR, argv[0]);
	args[n++] = python;
	args[n++] = script;
	for (int i = 1; argv[i] && n < 15; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	st = util_run_capture(args, env, out, cap);
	return st == 0 ? 0 : st == 77 ? 77 : -1;
}

/* Runs bench/publish_sources.py against d: torch and NumPy sources.
 * Returns as run_python. */
static int run_sources(const struct daemon_proc *d, long iters, char *out,
		       size_t cap)
{
	char bytes[32], it[32];
	const char *argv[] = { "publish_sources.py", "--socket", d->sock,
			       "--bytes", bytes, "--iters", it, NULL };

	num(bytes, sizeof(bytes), (double)PUB_BYTES);
	num(it, sizeof(it), (double)iters);
	return run_python(pub_python, argv, out, cap);
}

static int section_publish(const struct plan *pl)
{
	char bb[32], it[32], out[512];
	struct daemon_proc d = { 0 };
	double *v = calloc((size_t)pl->pub_iters, sizeof(*v));
	int rc = -1, sources = 1;

	report_section("publish");
	struct fig *fb = report_decl("floor_fill_256MiB_ms", "ms",
		"floor: fill fresh shared memory, best way, 256 MiB");
	struct fig *ff = report_decl("floor_fill_fault_256MiB_ms", "ms",
		"floor: of which mapped, a page fault a page");
	struct fig *fp = report_decl("floor_fill_populate_256MiB_ms", "ms",
		"floor: of which fallocate+MADV_POPULATE_WRITE+memcpy");
	struct fig *fw = report_decl("floor_fill_pwrite_256MiB_ms", "ms",
		"floor: of which pwrite into the memfd");
	struct fig *fm = report_decl("memcpy_256MiB_ms", "ms",
		"memcpy between populated private buffers, 256 MiB");
	struct fig *pc = report_decl("publish_copy_256MiB_ms", "ms",
		"publish (copy), 256 MiB, no strides");
	struct fig *ps = report_decl("publish_copy_strided_256MiB_ms", "ms",
		"publish (copy), 256 MiB, explicit compact strides");
	struct fig *key = report_decl("publish_copy_over_floor", "x",
		"publish (copy) rate / floor fill rate");
	struct fig *pt = report_decl("publish_torch_256MiB_ms", "ms",
		"Python: publish a torch tensor, 256 MiB");
	struct fig *pn = report_decl("publish_numpy_256MiB_ms", "ms",
		"Python: publish its NumPy view, 256 MiB");
	struct fig *ptn = report_decl("publish_torch_over_numpy", "x",
		"Python: publish torch / NumPy source");
	struct fig *tc = report_decl("torch_clone_256MiB_ms", "ms",
		"Python: torch clone(), 256 MiB");
	struct fig *nc = report_decl("numpy_copy_256MiB_ms", "ms",
		"Python: numpy.array(copy=True), 256 MiB");
	report_goal(key, REPORT_GOAL_GE, 0.8);
	report_goal(ptn, REPORT_GOAL_LE, 1.1);
	num(bb, sizeof(bb), (double)PUB_BYTES);
	num(it, sizeof(it), (double)pl->pub_iters);
	if (!v || daemon_start(&d, default_opts))
		goto out;
	for (int r = 0; r < pl->reps; r++) {
		double fl = NAN, dl = NAN;

		progress("publish: repeat %d/%d (256 MiB)", r + 1, pl->reps);
		for (int side = 0; side < 2; side++) {
			if ((side == 0) == (r % 2 == 0)) {
				if (floor_run(out, sizeof(out), "fill",
					      "--bytes", bb, "--iters", it,
					      (const char *)NULL))
					goto out;
				fl = kv(out, "best_ns") / 1e6;
				report_add(fb, fl);
				report_add(ff, kv(out, "fault_ns") / 1e6);
				report_add(fp, kv(out, "populate_ns") / 1e6);
				report_add(fw, kv(out, "pwrite_ns") / 1e6);
				report_add(fm, kv(out, "memcpy_ns") / 1e6);
			} else {
				if (fig_publish_copy(&d, PUB_BYTES, 0,
						     pl->pub_iters, v))
					goto out;
				dl = median_of(v, pl->pub_iters, 1e6);
				report_add(pc, dl);
				if (fig_publish_copy(&d, PUB_BYTES, 1,
						     pl->pub_iters, v))
					goto out;
				report_add(ps, median_of(v, pl->pub_iters, 1e6));
			}
		}
		report_add(key, fl / dl);
		if (!sources)
			continue;
		switch (run_sources(&d, pl->pub_iters, out, sizeof(out))) {
		case 0: {
			double t = kv(out, "torch_ns") / 1e6;
			double n = kv(out, "numpy_ns") / 1e6;

			report_add(pt, t);
			report_add(pn, n);
			report_add(ptn, t / n);
			report_add(tc, kv(out, "torch_clone_ns") / 1e6);
			report_add(nc, kv(out, "numpy_copy_ns") / 1e6);
			break;
		}
		default:
			sources = 0;
			for (struct fig **f = (struct fig *[]){ pt, pn, ptn, tc,
				     nc, NULL }; *f; f++) {
				(*f)->is_null = 1;
				report_note(*f, "not measured: publish_sources"
					    ".py under %s failed or found no "
					    "torch and NumPy", pub_python);
			}
		}
	}
	rc = 0;
out:
	free(v);
	daemon_stop(&d);
	return rc;
}

/* ---- peers: torch.multiprocessing and safetensors --------------------------------- */

/* The interpreter with NumPy and PyPI safetensors: the tests' venv. */
static const char *peers_venv_python = DLBENCH_SRC_DIR "/../.venv/bin/python";


/* Runs bench/peers.py PART under python against d, reps repeats; its
 * lines into out. Returns 0, 77 (no torch, NumPy or safetensors) or -1. */
static int run_peers(const struct daemon_proc *d, const char *python,
		     const char *part, int reps, char *out, size_t cap)
{
	char it[32];
	const char *argv[] = { "peers.py", part, "--socket", d->sock,
			       "--iters", it, NULL };

	num(it, sizeof(it), (double)reps);
	return run_python(python, argv, out, cap);
}

/* Each line of out (dlshare_ns=... <other>=...) into dl, other, ratio. */
static int peers_add(char *out, const char *other, struct fig *dl,
		     struct fig *ot, struct fig *ratio)
{
	int n = 0;

	for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
		double a = kv(line, "dlshare_ns") / 1e6;
		double b = kv(line, other) / 1e6;

		if (isnan(a) || isnan(b))
			continue;
		report_add(dl, a);
		report_add(ot, b);
		report_add(ratio, a / b);
		n++;
	}
	return n ? 0 : -1;
}

static void peers_skip(struct fig **f, const char *python, const char *what)
{
	for (; *f; f++) {
		(*f)->is_null = 1;
		report_note(*f, "not measured: peers.py under %s failed or "
			    "found no %s", python, what);
	}
}

static int section_peers(const struct plan *pl)
{
	static char out[16384];
	struct daemon_proc d = { 0 };
	int rc = -1;

	report_section("peers");
	struct fig *md = report_decl("bundle_10k_mp_dlshare_ms", "ms",
		"10^4 x 4 KiB state dict to a process: dlshare");
	struct fig *mt = report_decl("bundle_10k_mp_torch_ms", "ms",
		"... torch.multiprocessing (share_memory_ + Queue)");
	struct fig *mk = report_decl("bundle_10k_over_torch_mp", "x",
		"10^4 handoff: dlshare / torch.multiprocessing");
	struct fig *sd = report_decl("bundle_100k_py_get_ms", "ms",
		"10^5 x float32[16]: get, every tensor a NumPy array");
	struct fig *ss = report_decl("bundle_100k_safetensors_ms", "ms",
		"... safe_open in /dev/shm + get_tensor of each");
	struct fig *sk = report_decl("bundle_100k_over_safetensors", "x",
		"10^5 consumer: dlshare / safetensors");
	report_goal(mk, REPORT_GOAL_LE, 0.1);
	report_goal(sk, REPORT_GOAL_LE, 1.0);
	if (daemon_start(&d, default_opts))
		goto out;
	progress("peers: torch.multiprocessing, %d repeats", pl->reps);
	switch (run_peers(&d, pub_python, "torch_mp", pl->reps, out,
			  sizeof(out))) {
	case 0:
		if (peers_add(out, "torch_mp_ns", md, mt, mk) == 0)
			break;
		/* fall through */
	default:
		peers_skip((struct fig *[]){ md, mt, mk, NULL }, pub_python,
			   "torch");
	}
	progress("peers: safetensors, %d repeats", pl->reps);
	switch (run_peers(&d, peers_venv_python, "safetensors", pl->reps,
			  out, sizeof(out))) {
	case 0:
		if (peers_add(out, "safetensors_ns", sd, ss, sk) == 0)
			break;
		/* fall through */
	default:
		peers_skip((struct fig *[]){ sd, ss, sk, NULL },
			   peers_venv_python, "NumPy and safetensors");
	}
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

/* ---- output ---------------------------------------------------------------------- */

static void fmt_val(char *buf, size_t cap, double v, const char *unit)
{
	if (isnan(v))
		snprintf(buf, cap, "-");
	else if (strcmp(unit, "x") == 0)
		snprintf(buf, cap, "%.2f", v);
	else if (strcmp(unit, "ops/s") == 0 || strcmp(unit, "/s") == 0 ||
		 strcmp(unit, "B") == 0)
		snprintf(buf, cap, "%.0f", v);
	else if (fabs(v) < 10)
		snprintf(buf, cap, "%.2f", v);
	else
		snprintf(buf, cap, "%.1f", v);
}

/* dlbench's table: its column widths and how values are written. */
static const struct report_style table_style = {
	.label_w = 58, .median_w = 12, .spread_w = 23, .unit_w = 5,
	.unit_head = "unit  goal", .fmt = fmt_val,
};

struct machine {
	char cpu[128];
	long cores;
	char kernel[200];
	uint64_t mem;
};

static void machine_read(struct machine *m)
{
	struct utsname u;
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "re");

	snprintf(m->cpu, sizeof(m->cpu), "unknown");
	while (f && fgets(line, sizeof(line), f)) {
		char *p = strchr(line, ':');

		if (strncmp(line, "model name", 10) == 0 && p) {
			p += 2;
			p[strcspn(p, "\n")] = '\0';
			snprintf(m->cpu, sizeof(m->cpu), "%s", p);
			break;
		}
	}
	if (f)
		fclose(f);
	m->cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (uname(&u) == 0)
		snprintf(m->kernel, sizeof(m->kernel), "%.64s %.64s",
			 u.sysname, u.release);
	m->mem = util_meminfo_bytes("MemTotal");
}

static int write_json(const char *path, const struct plan *pl,
		      const struct machine *m, const struct fig_packets *pk,
		      double secs)
{
	static const char *const keys[] = { "get_p50_over_floor",
		"get_p50_over_floor_one_cpu", "throughput_over_floor",
		"handoff_1GiB_over_4KiB", "export_handoff_1GiB_over_4KiB",
		"kill_storm_over_floor", "get_p50_1M_over_100",
		"get_p50_10k_over_100", "mem_per_tensor_bytes",
		"publish_copy_over_floor", "publish_torch_over_numpy",
		"relay_1GiB_over_ucx_perftest", "relay_4KiB_propagation_us" };
	FILE *o = fopen(path, "we");

	if (!o) {
		fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(o, "{\n  \"mode\": \"%s\",\n  \"repeats\": %d,\n",
		pl->quick ? "quick" : "full", pl->reps);
	fprintf(o, "  \"seconds\": %.1f,\n", secs);
	fprintf(o, "  \"machine\": {\"cpu\": ");
	report_json_str(o, m->cpu);
	fprintf(o, ", \"cores\": %ld, \"kernel\": ", m->cores);
	report_json_str(o, m->kernel);
	fprintf(o, ", \"mem_bytes\": %llu},\n", (unsigned long long)m->mem);
	fprintf(o, "  \"packets\": {\"get\": %zu, \"get_reply\": %zu, "
		"\"get_reply_fd\": %zu, \"release\": %zu},\n",
		pk->get, pk->reply, pk->reply_fd, pk->release);
	fprintf(o, "  \"handoff_big_bytes\": %llu,\n",
		(unsigned long long)pl->big);
	/* The goal keys at the top, each the median (null: not measured). */
	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		const struct fig *f = report_find(keys[k]);
		double med = NAN, lo, hi;

		if (report_has(f))
			report_summary(f, &med, &lo, &hi);
		fprintf(o, "  \"%s\": ", keys[k]);
		report_json_num(o, med);
		fprintf(o, ",\n");
	}
	/* The same keys' spread: min and max over the repeats, and n (each
	 * repeat's values are under "figures"). */
	fprintf(o, "  \"spread\": {");
	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		const struct fig *f = report_find(keys[k]);
		double med = NAN, lo = NAN, hi = NAN;

		if (report_has(f))
			report_summary(f, &med, &lo, &hi);
		fprintf(o, "%s\n    \"%s\": {\"min\": ", k ? "," : "", keys[k]);
		report_json_num(o, lo);
		fprintf(o, ", \"max\": ");
		report_json_num(o, hi);
		fprintf(o, ", \"n\": %zu}", report_has(f) ? f->reps.n : 0);
	}
	fprintf(o, "\n  },\n");
	report_json_figures(o);
	fprintf(o, "}\n");
	return fclose(o) == 0 ? 0 : -1;
}

/* ---- main ------------------------------------------------------------------------ */

static void usage(FILE *o)
{
	fprintf(o,
		"usage: dlbench --daemon PATH --floor PATH [--quick] [--json FILE]\n"
		"               [--only SECTIONS] [--repeats N] [--scale-max N]\n"
		"               [--python PATH] [--pythonpath DIR] [--venv-python PATH]\n"
		"       dlbench --daemon PATH --floor PATH --loop N [--loop-ms MS] [--pin]\n"
		"               [--loop-names K] [--loop-reuse]\n"
		"  sections: latency,throughput,handoff,scale,idle,storm,bundle,publish,\n"
		"            peers,relay\n"
		"  --python: the interpreter (with torch and NumPy) that\n"
		"  measures publish from torch and NumPy and the handoff against\n"
		"  torch.multiprocessing (/usr/bin/python3);\n"
		"  --venv-python: the one with NumPy and safetensors (the\n"
		"  source tree's .venv/bin/python);\n"
		"  --pythonpath: where it finds the dlshare package.\n"
		"  --loop N: for a profiler, only get+release from N client\n"
		"  processes for MS ms (default 5000), printing the daemon's pid\n"
		"  first and the round trips a second at the end; --pin puts\n"
		"  everything on CPU 0; --loop-names K reads K names in turn;\n"
		"  --loop-reuse turns the version board's reuse on (every\n"
		"  other figure runs with DLSHARE_NO_REUSE=1).\n");
}

/* The steady state alone, for perf or valgrind to look at: names > 0
 * reads that many names in turn, reuse turns the version board's reuse
 * on. */
static int loop(int n, long ms, int pinned, int names, int reuse)
{
	struct daemon_proc d;
	char name[64];
	double ops;
	int rc = 1;

	if (daemon_start(&d, default_opts) ||
	    (!names && fig_publish(&d, FIG_NAME, FIG_TENSOR_BYTES)))
		goto out;
	for (int k = 0; k < names; k++) {
		snprintf(name, sizeof(name), "%s.%d", FIG_NAME, k);
		if (fig_publish(&d, name, FIG_TENSOR_BYTES))
			goto out;
	}
	if (pinned)
		pin(d.pid, 0);
	printf("daemon_pid=%d\n", (int)d.pid);
	fflush(stdout);
	if (fig_throughput_names(&d, FIG_NAME, names, reuse, n, ms, &ops))
		goto out;
	printf("clients=%d ms=%ld ops_per_s=%.0f\n", n, ms, ops);
	rc = 0;
out:
	daemon_stop(&d);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "floor", required_argument, NULL, 'f' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", required_argument, NULL, 'j' },
		{ "only", required_argument, NULL, 'o' },
		{ "repeats", required_argument, NULL, 'r' },
		{ "scale-max", required_argument, NULL, 's' },
		{ "loop", required_argument, NULL, 'l' },
		{ "loop-ms", required_argument, NULL, 'L' },
		{ "pin", no_argument, NULL, 'p' },
		{ "loop-names", required_argument, NULL, 'K' },
		{ "loop-reuse", no_argument, NULL, 'U' },
		{ "python", required_argument, NULL, 'P' },
		{ "pythonpath", required_argument, NULL, 'Y' },
		{ "venv-python", required_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *daemon_bin = NULL, *json = NULL;
	struct plan pl = { 0 };
	struct fig_packets pk;
	struct machine m;
	int o, reps = 0, failed = 0, loop_n = 0, pinned = 0, loop_names = 0;
	int loop_reuse = 0;
	long scale_max = 0, loop_ms = 5000;
	char big[32];

	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (o) {
		case 'd':
			daemon_bin = optarg;
			break;
		case 'f':
			floor_bin = optarg;
			break;
		case 'q':
			pl.quick = 1;
			break;
		case 'j':
			json = optarg;
			break;
		case 'o':
			only = optarg;
			break;
		case 'r':
			reps = atoi(optarg);
			break;
		case 's':
			scale_max = atol(optarg);
			break;
		case 'l':
			loop_n = atoi(optarg);
			break;
		case 'L':
			loop_ms = atol(optarg);
			break;
		case 'p':
			pinned = 1;
			break;
		case 'K':
			loop_names = atoi(optarg);
			break;
		case 'U':
			loop_reuse = 1;
			break;
		case 'P':
			pub_python = optarg;
			break;
		case 'Y':
			pub_pythonpath = optarg;
			break;
		case 'V':
			peers_venv_python = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!daemon_bin || !floor_bin || optind != argc || loop_names < 0 ||
	    loop_names > 4096) {
		usage(stderr);
		return 2;
	}
	/* Every figure but the reused get's measures a get that asks the
	 * daemon (issue 16 keys among them): no client here reuses a
	 * released get by the version board (protocol 1.7), unless
	 * fig_get_latency_reused turns it back on for its own. */
	setenv("DLSHARE_NO_REUSE", "1", 1);
	t_start = util_now_ns();
	if (pl.quick) {
		pl.reps = 3;
		pl.rt_iters = 5000;
		pl.first_iters = 300;
		pl.tp_ms = 1000;
		pl.small_iters = 20;
		pl.scale_max = 10000;
		pl.spread_iters = 3000;
		pl.idle_n = 10000;
		pl.storm_n = 1000;
		pl.storm_leases = 10;
		pl.storm_reps = 3;
		pl.pub_iters = 3;
	} else {
		pl.reps = 5;
		pl.rt_iters = 20000;
		pl.first_iters = 1000;
		pl.tp_ms = 2000;
		pl.small_iters = 50;
		pl.scale_max = 1000000;
		pl.spread_iters = 20000;
		pl.idle_n = 10000;
		pl.storm_n = 1000;
		pl.storm_leases = 10;
		pl.storm_reps = 5;
		pl.pub_iters = 5;
	}
	if (reps > 0)
		pl.reps = pl.storm_reps = reps;
	if (scale_max > 0)
		pl.scale_max = scale_max;
	/* 1 GiB, unless the machine cannot spare four times that. */
	pl.big = UINT64_C(1) << 30;
	while (pl.big > (UINT64_C(1) << 24) &&
	       util_meminfo_bytes("MemAvailable") < 4 * pl.big)
		pl.big >>= 1;

	daemon_stop_on_signals(pl.quick ? 900 : 5400);

	/* A memfd per name and a socket per connection, in the daemon and
	 * here; fs.nr_open is the ceiling. */
	{
		FILE *f = fopen("/proc/sys/fs/nr_open", "re");
		unsigned long long nr = 1048576;

		if (f) {
			if (fscanf(f, "%llu", &nr) != 1)
				nr = 1048576;
			fclose(f);
		}
		nofile_limit = util_raise_nofile(nr);
	}
	sched_getaffinity(0, sizeof(all_cpus), &all_cpus);
	if (daemon_setup(daemon_bin))
		return 1;
	if (loop_n > 0)
		return loop(loop_n, loop_ms, pinned, loop_names, loop_reuse);
	machine_read(&m);
	fig_packet_sizes(&pk);
	util_size_name(pl.big, " ", big, sizeof(big));
	progress("dlbench %s: %s, %ld cores, %s; %d repeats; handoff %s%s",
		 pl.quick ? "--quick" : "full run", m.cpu, m.cores, m.kernel,
		 pl.reps, big, pl.big == (UINT64_C(1) << 30) ? "" :
		 " (smaller than 1 GiB: not enough free memory)");
	progress("packets: Get %zu B, GetReply %zu B (%zu B with its fd), "
		 "Release %zu B", pk.get, pk.reply, pk.reply_fd, pk.release);

	if (util_list_has(only, "latency") && section_latency(&pl, &pk))
		failed = 1;
	if (util_list_has(only, "throughput") && section_throughput(&pl, &pk))
		failed = 1;
	if (util_list_has(only, "handoff") && section_handoff(&pl))
		failed = 1;
	if (util_list_has(only, "scale") && section_scale(&pl))
		failed = 1;
	if (util_list_has(only, "idle") && section_idle(&pl))
		failed = 1;
	if (util_list_has(only, "storm") && section_storm(&pl))
		failed = 1;
	if (util_list_has(only, "bundle") && section_bundle(&pl))
		failed = 1;
	if (util_list_has(only, "publish") && section_publish(&pl))
		failed = 1;
	if (util_list_has(only, "peers") && section_peers(&pl))
		failed = 1;
	if (util_list_has(only, "relay") &&
	    relay_section(pl.quick, pl.reps, daemon_bin))
		failed = 1;
	daemon_stop_all();

	double secs = (double)(util_now_ns() - t_start) / 1e9;
	printf("dlshare benchmarks (%s, %d repeats, %.0f s): %s, %ld cores, %s\n",
	       pl.quick ? "--quick" : "full", pl.reps, secs, m.cpu, m.cores,
	       m.kernel);
	report_print_table(stdout, &table_style);
	if (failed)
		printf("\nSOME BENCHMARKS FAILED (see the messages above)\n");
	if (json && write_json(json, &pl, &m, &pk, secs))
		failed = 1;
	return failed;
}
