/* gpubench — dlshare's GPU benchmarks: import costs, a get while the
 * producer's stream is busy, an end-to-end handoff of a large tensor
 * beside its one-process floor, and torch.multiprocessing as a peer.
 * Prints a table on stdout (progress on stderr) and, with --json FILE,
 * writes every figure with its repeats. BENCHMARKS.md explains them.
 *
 * Built twice (bench/gpu/CMakeLists.txt): dlshare-gpubench against the
 * CUDA runtime with real kernels, and dlshare-gpubench-fake against
 * tests/fakecuda (host functions for kernels; a smoke test of the program
 * and its data checks, whose figures mean nothing).
 *
 * This process never calls CUDA (a process that did must not fork CUDA
 * users): it starts dlshared in a mkdtemp directory and runs every figure
 * in fresh processes of its own binary (roles.h). Single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "report.h"
#include "roles.h"
#include "util.h"

#ifdef GPUBENCH_FAKE
#define VARIANT "fakecuda"
#else
#define VARIANT "gpu"
#endif

/* ---- notes and ratios ------------------------------------------------------- */

#define NOTES_MAX 32

static char *notes[NOTES_MAX];
static int nnotes;

__attribute__((format(printf, 1, 2)))
static void note(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "gpubench: %s\n", buf);
	if (nnotes < NOTES_MAX)
		notes[nnotes++] = strdup(buf);
}

/* A figure of ratios a[r] / b[r], repeat by repeat. */
static void fig_ratio(const char *key, const char *label, const char *a,
		      const char *b)
{
	struct fig *fa = report_find(a), *fb = report_find(b);
	struct fig *f = report_decl(key, "x", "%s", label);

	if (!fa || !fb || fa->reps.n != fb->reps.n || !fa->reps.n)
		return;
	for (size_t r = 0; r < fa->reps.n; r++)
		if (fb->reps.v[r] > 0)
			report_add(f, fa->reps.v[r] / fb->reps.v[r]);
}

/* ---- running roles ------------------------------------------------------------- */

struct plan {
	uint64_t bytes;           /* handoff size */
	uint64_t import_small;    /* the small import size */
	int repeats;
	int spin_ms;
	int smoke;
	int corrupt;
	int timeout_s;            /* per figure */
	const char *python;
	const char *torch_script;
	const char *torch_device; /* "cuda"; "cpu" tries the plumbing */
	const char *only;
};

static struct plan pl;
static struct daemon_proc g_d;
static char self_exe[4096];
static int wrong_data;            /* a role saw wrong data */
static char device_line[512];
static char skip_line[256];       /* the torch peer's "skip" reason */

/* One line of a role's (or the torch peer's) output. */
static void handle_line(char *line, const char *who)
{
	char *sp = strchr(line, ' ');

	if (!sp)
		return;
	*sp++ = '\0';
	if (strcmp(line, "sample") == 0) {
		char *v = strchr(sp, ' ');
		struct fig *f;

		if (!v)
			return;
		*v++ = '\0';
		f = report_find(sp);
		if (!f) {
			fprintf(stderr, "gpubench: %s: unexpected figure %s\n",
				who, sp);
			return;
		}
		report_add(f, strtod(v, NULL));
	} else if (strcmp(line, "info") == 0) {
		note("%s: %s", who, sp);
	} else if (strcmp(line, "device") == 0 || strcmp(line, "nogpu") == 0) {
		snprintf(device_line, sizeof(device_line), "%s", sp);
	} else if (strcmp(line, "skip") == 0) {
		snprintf(skip_line, sizeof(skip_line), "%s", sp);
	}
}

/* Reads lines from fd until every writer closed it or the figure's time
 * is up. Returns 0, or -1 on timeout. */
static int read_results(int fd, const char *who)
{
	uint64_t end = util_now_ns() + (uint64_t)pl.timeout_s * 1000000000u;
	char buf[8192];
	size_t len = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t now = util_now_ns();
		ssize_t n;
		char *nl;
		int rc;

		if (now >= end)
			return -1;
		rc = poll(&p, 1, (int)((end - now) / 1000000u) + 1);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0)
			continue; /* the deadline is checked above */
		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		len += (size_t)n;
		buf[len] = '\0';
		while ((nl = strchr(buf, '\n'))) {
			*nl = '\0';
			handle_line(buf, who);
			len -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, len + 1);
		}
		if (len == sizeof(buf) - 1)
			len = 0; /* a line this long is nobody's: drop it */
	}
}

/* Makes fd survive exec (it was made O_CLOEXEC). */
static void keep_fd(int fd)
{
	if (fd >= 0)
		fcntl(fd, F_SETFD, 0);
}

static pid_t spawn_role(const char *role, const char *figure, int res_w,
			int peer, uint64_t bytes, int warm, const char *tag)
{
	char res_s[16], peer_s[16], bytes_s[32], reps_s[16], spin_s[16];
	const char *argv[32];
	int argc = 0;
	pid_t pid;

	snprintf(res_s, sizeof(res_s), "%d", res_w);
	snprintf(peer_s, sizeof(peer_s), "%d", peer);
	snprintf(bytes_s, sizeof(bytes_s), "%llu", (unsigned long long)bytes);
	snprintf(reps_s, sizeof(reps_s), "%d", pl.repeats);
	snprintf(spin_s, sizeof(spin_s), "%d", pl.spin_ms);
	argv[argc++] = self_exe;
	argv[argc++] = "--role";
	argv[argc++] = role;
	argv[argc++] = "--figure";
	argv[argc++] = figure;
	argv[argc++] = "--socket";
	argv[argc++] = g_d.sock[0] ? g_d.sock : "-";
	argv[argc++] = "--res-fd";
	argv[argc++] = res_s;
	argv[argc++] = "--peer-fd";
	argv[argc++] = peer_s;
	argv[argc++] = "--bytes";
	argv[argc++] = bytes_s;
	argv[argc++] = "--repeats";
	argv[argc++] = reps_s;
	argv[argc++] = "--spin-ms";
	argv[argc++] = spin_s;
	argv[argc++] = "--tag";
	argv[argc++] = tag;
	if (warm)
		argv[argc++] = "--warm";
	/* Only the producer: the floor checks its own writes in one
	 * process, and a wrong seed there would fail the run even when the
	 * consumer's check of what crossed over were broken. */
	if (pl.corrupt && strcmp(role, "producer") == 0)
		argv[argc++] = "--corrupt";
	argv[argc] = NULL;

	pid = util_fork();
	if (pid == 0) {
		keep_fd(res_w);
		keep_fd(peer);
		execv(self_exe, (char *const *)argv);
		fprintf(stderr, "gpubench: exec %s: %s\n", self_exe,
			strerror(errno));
		_exit(127);
	}
	if (pid < 0)
		perror("gpubench: fork");
	return pid;
}

static const char *exit_text(int st)
{
	static char buf[64];

	switch (st) {
	case 0:
		return "done";
	case ROLE_EXIT_WRONG_DATA:
		return "WRONG DATA";
	case ROLE_EXIT_NO_GPU:
		return "no GPU";
	default:
		if (st > 128)
			snprintf(buf, sizeof(buf), "killed by signal %d", st - 128);
		else
			snprintf(buf, sizeof(buf), "failed (exit %d)", st);
		return buf;
	}
}

/* Runs a figure: a producer and a consumer (pair), or one process (role
 * "floor" or "probe"). Returns 0, ROLE_EXIT_NO_GPU (probe), or -1. */
static int run_role(const char *role, const char *figure, uint64_t bytes,
		    int warm, const char *tag)
{
	int pair = strcmp(role, "pair") == 0;
	int res[2], sp[2] = { -1, -1 }, rc = 0, timed_out;
	pid_t pids[2] = { -1, -1 };
	const char *names[2] = { pair ? "producer" : role, "consumer" };

	if (pipe2(res, O_CLOEXEC) < 0)
		return -1;
	if (pair && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
		close(res[0]);
		close(res[1]);
		return -1;
	}
	pids[0] = spawn_role(names[0], figure, res[1], sp[0], bytes, warm, tag);
	if (pair && pids[0] > 0)
		pids[1] = spawn_role(names[1], figure, res[1], sp[1], bytes, warm,
				     tag);
	close(res[1]);
	if (pair) {
		close(sp[0]);
		close(sp[1]);
	}
	timed_out = read_results(res[0], figure) < 0;
	close(res[0]);
	for (int i = 0; i < 2; i++) {
		int st;

		if (pids[i] <= 0) {
			if (i == 0 || pair)
				rc = -1;
			continue;
		}
		if (timed_out)
			kill(pids[i], SIGKILL);
		st = child_wait(pids[i]);
		if (st == ROLE_EXIT_NO_GPU && !pair) {
			rc = ROLE_EXIT_NO_GPU;
			continue;
		}
		if (st == ROLE_EXIT_WRONG_DATA)
			wrong_data = 1;
		if (st != 0 || timed_out) {
			fprintf(stderr, "gpubench: %s %s%s%s: %s\n", figure,
				names[i], tag[0] ? ", " : "", tag,
				timed_out ? "timed out" : exit_text(st));
			rc = -1;
		}
	}
	if (timed_out)
		note("%s %s: no result within %d s; stopped", figure, tag,
		     pl.timeout_s);
	return rc;
}

/* ---- sections --------------------------------------------------------------- */

static int section_import(uint64_t bytes)
{
	char tag[32], k[64];

	util_size_name(bytes, "", tag, sizeof(tag));
	report_section("import");
	snprintf(k, sizeof(k), "import_cold_%s", tag);
	report_decl(k, "us", "cold import, %s: first get of a new allocation", tag);
	snprintf(k, sizeof(k), "import_warm_%s", tag);
	report_decl(k, "us", "warm import, %s: new version, allocation open", tag);
	snprintf(k, sizeof(k), "import_cached_%s", tag);
	report_decl(k, "us", "cached get, %s: the same version again", tag);
	fprintf(stderr, "gpubench: import, %s\n", tag);
	return run_role("pair", "import", bytes, 0, tag);
}

static int section_spin(void)
{
	char tag[32];

	util_size_name(pl.import_small, "", tag, sizeof(tag));
	report_section("stream-ordered get");
	report_decl("spin_alone", "ms", "producer: spin kernel alone (launch + sync)");
	report_decl("spin_publish", "us", "producer: publish behind %d ms of queued work",
		    pl.spin_ms);
	report_decl("spin_get", "us", "consumer: get returns after (%s, cold)", tag);
	report_decl("spin_sync", "ms", "consumer: cudaStreamSynchronize after get");
	report_decl("spin_done", "ms", "consumer's stream done, from producer's queue");
	fprintf(stderr, "gpubench: stream-ordered get, %d ms spin\n", pl.spin_ms);
	return run_role("pair", "spin", pl.import_small, 0, "");
}

static int section_handoff(void)
{
	char tag[32];
	int rc = 0;

	util_size_name(pl.bytes, "", tag, sizeof(tag));
	report_section("handoff");
	report_decl("floor", "ms", "floor: write + read %s in one process", tag);
	report_decl("handoff_cold", "ms", "handoff %s, consumer maps it each time", tag);
	report_decl("handoff_warm", "ms", "handoff %s, allocation kept mapped", tag);
	report_decl("handoff_cold_get", "us", "  consumer's get returned (cold), from t0");
	report_decl("handoff_warm_get", "us", "  consumer's get returned (warm), from t0");
	report_decl("handoff_cold_publish", "us", "  producer's publish call (cold)");
	report_decl("handoff_warm_publish", "us", "  producer's publish call (warm)");
	fprintf(stderr, "gpubench: handoff floor, %s\n", tag);
	if (run_role("floor", "floor", pl.bytes, 0, ""))
		rc = -1;
	fprintf(stderr, "gpubench: handoff, %s, cold\n", tag);
	if (run_role("pair", "handoff", pl.bytes, 0, ""))
		rc = -1;
	fprintf(stderr, "gpubench: handoff, %s, warm\n", tag);
	if (run_role("pair", "handoff", pl.bytes, 1, ""))
		rc = -1;
	fig_ratio("handoff_cold_over_floor", "handoff (cold) / floor",
		  "handoff_cold", "floor");
	fig_ratio("handoff_warm_over_floor", "handoff (warm) / floor",
		  "handoff_warm", "floor");
	return rc;
}

/* The torch.multiprocessing peer: a Python script run as a child, which
 * prints the same kind of lines as a role. */
static int section_torch(void)
{
	char tag[32], bytes_s[32], reps_s[16], tmo_s[16];
	struct fig *fh, *ff;
	int p[2], st, timed_out;
	pid_t pid;

	util_size_name(pl.bytes, "", tag, sizeof(tag));
	report_section("torch.multiprocessing");
	ff = report_decl("torch_floor", "ms", "torch floor: fill_ + aminmax of %s, one "
			 "process", tag);
	fh = report_decl("torch_handoff", "ms", "torch.mp Queue handoff %s (fill_ .. "
			 "aminmax)", tag);
#ifdef GPUBENCH_FAKE
	/* Only the peer's plumbing can be tried here, on CPU tensors. */
	if (strcmp(pl.torch_device, "cpu") != 0) {
		report_note(ff, "skipped: fake CUDA");
		report_note(fh, "skipped: fake CUDA");
		return 0;
	}
#endif
	if (!pl.python || access(pl.torch_script, R_OK) < 0) {
		report_note(fh, "skipped: %s", !pl.python ? "no --python" :
			    "torch_peer.py not found");
		report_note(ff, "%s", fh->note);
		note("torch.multiprocessing: %s", fh->note);
		return 0;
	}
	fprintf(stderr, "gpubench: torch.multiprocessing peer (%s)\n", pl.python);
	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	snprintf(bytes_s, sizeof(bytes_s), "%llu", (unsigned long long)pl.bytes);
	snprintf(reps_s, sizeof(reps_s), "%d", pl.repeats);
	snprintf(tmo_s, sizeof(tmo_s), "%d", pl.timeout_s);
	pid = util_fork();
	if (pid == 0) {
		dup2(p[1], 1);
		execl(pl.python, pl.python, pl.torch_script, "--bytes", bytes_s,
		      "--repeats", reps_s, "--timeout", tmo_s, "--device",
		      pl.torch_device, (char *)NULL);
		fprintf(stderr, "gpubench: exec %s: %s\n", pl.python,
			strerror(errno));
		_exit(127);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return -1;
	}
	timed_out = read_results(p[0], "torch") < 0;
	close(p[0]);
	if (timed_out)
		kill(pid, SIGKILL);
	st = child_wait(pid);
	if (skip_line[0] && !fh->reps.n && st == 0) {
		/* "skip <why>": no torch, or no CUDA in it. */
		report_note(fh, "skipped: %.140s", skip_line);
		report_note(ff, "%s", fh->note);
		note("torch.multiprocessing: skipped: %s", skip_line);
		return 0;
	}
	if (st == ROLE_EXIT_WRONG_DATA)
		wrong_data = 1;
	if (st != 0 || timed_out) {
		fprintf(stderr, "gpubench: torch peer: %s\n",
			timed_out ? "timed out" : exit_text(st));
		return -1;
	}
	fig_ratio("torch_over_floor", "torch.mp handoff / torch floor",
		  "torch_handoff", "torch_floor");
	fig_ratio("dlshare_cold_over_torch", "dlshare handoff (cold) / torch.mp",
		  "handoff_cold", "torch_handoff");
	fig_ratio("dlshare_warm_over_torch", "dlshare handoff (warm) / torch.mp",
		  "handoff_warm", "torch_handoff");
	return 0;
}

/* ---- output ------------------------------------------------------------------ */

static void fmt_val(char *buf, size_t cap, double v, const char *unit)
{
	if (isnan(v))
		snprintf(buf, cap, "-");
	else if (strcmp(unit, "x") == 0)
		snprintf(buf, cap, "%.2f", v);
	else if (fabs(v) < 10)
		snprintf(buf, cap, "%.3f", v);
	else if (fabs(v) < 1000)
		snprintf(buf, cap, "%.1f", v);
	else
		snprintf(buf, cap, "%.0f", v);
}

/* gpubench's table: its column widths and how values are written. */
static const struct report_style table_style = {
	.label_w = 56, .median_w = 10, .spread_w = 24, .unit_w = 4,
	.unit_head = "unit", .fmt = fmt_val,
};

/* The figures, then the notes the roles sent. */
static void print_table(FILE *o)
{
	report_print_table(o, &table_style);
	for (int i = 0; i < nnotes; i++)
		fprintf(o, "%s %s\n", i ? "     " : "notes:", notes[i]);
}

static int write_json(const char *path, double secs, int failed)
{
	FILE *o = fopen(path, "we");

	if (!o) {
		fprintf(stderr, "gpubench: %s: %s\n", path, strerror(errno));
		return -1;
	}
	fprintf(o, "{\n  \"variant\": \"%s\",\n  \"meaningful\": %s,\n",
		VARIANT, strcmp(VARIANT, "gpu") == 0 ? "true" : "false");
	fprintf(o, "  \"device\": ");
	report_json_str(o, device_line);
	fprintf(o, ",\n  \"bytes\": %llu,\n  \"repeats\": %d,\n  \"spin_ms\": "
		"%d,\n  \"seconds\": %.1f,\n  \"failed\": %s,\n  "
		"\"wrong_data\": %s,\n  \"notes\": [",
		(unsigned long long)pl.bytes, pl.repeats, pl.spin_ms, secs,
		failed ? "true" : "false", wrong_data ? "true" : "false");
	for (int i = 0; i < nnotes; i++) {
		fprintf(o, i ? ", " : "");
		report_json_str(o, notes[i]);
	}
	fprintf(o, "],\n");
	report_json_figures(o);
	fprintf(o, "}\n");
	return fclose(o) == 0 ? 0 : -1;
}

/* ---- main --------------------------------------------------------------------- */

static void usage(FILE *o)
{
	fprintf(o,
		"usage: %s [--daemon PATH] [--json FILE] [--repeats N]\n"
		"         [--bytes N] [--spin-ms MS] [--only SECTIONS] [--smoke]\n"
		"         [--python PATH] [--torch-script PATH] [--timeout S]\n"
		"         [--torch-device cuda|cpu]\n"
		"  sections: import,spin,handoff,torch\n"
		"  --bytes: the handoff size (default 1 GiB); --smoke: 1 MiB,\n"
		"  1 repeat, a 20 ms spin, no torch (checks the program works).\n"
		"  Without a GPU: prints \"no GPU: skipped\" and exits 0.\n",
		VARIANT[0] == 'g' ? "dlshare-gpubench" : "dlshare-gpubench-fake");
}

static int parse_role(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "role", required_argument, NULL, 'R' },
		{ "figure", required_argument, NULL, 'F' },
		{ "socket", required_argument, NULL, 'S' },
		{ "res-fd", required_argument, NULL, 'o' },
		{ "peer-fd", required_argument, NULL, 'p' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "repeats", required_argument, NULL, 'r' },
		{ "spin-ms", required_argument, NULL, 's' },
		{ "tag", required_argument, NULL, 't' },
		{ "warm", no_argument, NULL, 'w' },
		{ "corrupt", no_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	struct role_args a = { .res_fd = -1, .peer_fd = -1, .tag = "",
			       .figure = "-" };
	int o;

	while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (o) {
		case 'R': a.role = optarg; break;
		case 'F': a.figure = optarg; break;
		case 'S': a.sock = optarg; break;
		case 'o': a.res_fd = atoi(optarg); break;
		case 'p': a.peer_fd = atoi(optarg); break;
		case 'b': a.bytes = strtoull(optarg, NULL, 0); break;
		case 'r': a.repeats = atoi(optarg); break;
		case 's': a.spin_ms = atoi(optarg); break;
		case 't': a.tag = optarg; break;
		case 'w': a.warm = 1; break;
		case 'c': a.corrupt = 1; break;
		default: return 2;
		}
	}
	if (!a.role || a.res_fd < 0)
		return 2;
	return role_main(&a);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "json", required_argument, NULL, 'j' },
		{ "repeats", required_argument, NULL, 'r' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "spin-ms", required_argument, NULL, 's' },
		{ "only", required_argument, NULL, 'o' },
		{ "smoke", no_argument, NULL, 'S' },
		{ "python", required_argument, NULL, 'p' },
		{ "torch-script", required_argument, NULL, 'T' },
		{ "torch-device", required_argument, NULL, 'D' },
		{ "timeout", required_argument, NULL, 't' },
		{ "corrupt", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *daemon_bin = GPUBENCH_DLSHARED, *json = NULL;
	uint64_t t_start;
	int o, failed = 0, rc;
	ssize_t n;

	if (argc > 1 && strcmp(argv[1], "--role") == 0)
		return parse_role(argc, argv);
#ifdef GPUBENCH_FAKE
	/* libdlshare loads CUDA at run time: the same fake as ours (the
	 * roles inherit this). */
	setenv("DLSHARE_CUDA_RUNTIME", GPUBENCH_FAKECUDA_LIB, 0);
	setenv("DLSHARE_CUDA_DRIVER", GPUBENCH_FAKECUDA_LIB, 0);
#endif

	pl.bytes = UINT64_C(1) << 30;
	pl.import_small = UINT64_C(1) << 20;
	pl.repeats = 10;
	pl.spin_ms = 100;
	pl.timeout_s = 300;
	pl.torch_script = GPUBENCH_TORCH_SCRIPT;
	pl.torch_device = "cuda";
	while ((o = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (o) {
		case 'd': daemon_bin = optarg; break;
		case 'j': json = optarg; break;
		case 'r': pl.repeats = atoi(optarg); break;
		case 'b': pl.bytes = strtoull(optarg, NULL, 0); break;
		case 's': pl.spin_ms = atoi(optarg); break;
		case 'o': pl.only = optarg; break;
		case 'S': pl.smoke = 1; break;
		case 'p': pl.python = optarg; break;
		case 'T': pl.torch_script = optarg; break;
		case 'D': pl.torch_device = optarg; break;
		case 't': pl.timeout_s = atoi(optarg); break;
		case 'c': pl.corrupt = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (pl.smoke) {
		pl.bytes = UINT64_C(1) << 20;
		pl.repeats = 1;
		pl.spin_ms = 20;
		pl.python = NULL;
	}
	if (pl.repeats < 1 || pl.spin_ms < 1 || pl.timeout_s < 1 ||
	    pl.bytes < 8 || pl.bytes % 8) {
		fprintf(stderr, "gpubench: --repeats, --spin-ms and --timeout must "
			"be positive, --bytes a multiple of 8\n");
		return 2;
	}
	if (pl.import_small > pl.bytes)
		pl.import_small = pl.bytes;
	n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
	if (n <= 0) {
		perror("gpubench: /proc/self/exe");
		return 1;
	}
	self_exe[n] = '\0';

	daemon_stop_on_signals((unsigned)pl.timeout_s * 8 + 60);
	t_start = util_now_ns();

#ifdef GPUBENCH_FAKE
	printf("FAKE CUDA (tests/fakecuda): host functions stand in for kernels "
	       "and device memory is host memory. The figures below are "
	       "MEANINGLESS; this run only shows that the benchmark works and "
	       "moves the right data.\n");
	fflush(stdout);
#endif
	/* Is there a GPU? Asked in a child: this process stays CUDA-free. */
	rc = run_role("probe", "probe", 8, 0, "");
	if (rc == ROLE_EXIT_NO_GPU) {
		printf("gpubench: no GPU: skipped (%s)\n",
		       device_line[0] ? device_line : "no CUDA device");
		return 0;
	}
	if (rc) {
		fprintf(stderr, "gpubench: the device probe failed\n");
		return 1;
	}
	fprintf(stderr, "gpubench: %s\n", device_line);
	if (daemon_setup(daemon_bin) || daemon_start(&g_d, NULL))
		return 1;

	if (util_list_has(pl.only, "import")) {
		if (section_import(pl.import_small))
			failed = 1;
		if (pl.bytes != pl.import_small && section_import(pl.bytes))
			failed = 1;
	}
	if (util_list_has(pl.only, "spin") && section_spin())
		failed = 1;
	if (util_list_has(pl.only, "handoff") && section_handoff())
		failed = 1;
	if (util_list_has(pl.only, "torch") && section_torch())
		failed = 1;
	if (daemon_stop(&g_d) != 0) {
		fprintf(stderr, "gpubench: dlshared did not exit cleanly\n");
		failed = 1;
	}

	double secs = (double)(util_now_ns() - t_start) / 1e9;
	char size[32];

	util_size_name(pl.bytes, "", size, sizeof(size));
	printf("dlshare GPU benchmarks (%s%s, %d repeat%s, %s, %d ms spin, "
	       "%.0f s)\n%s\n", VARIANT, pl.smoke ? ", --smoke" : "",
	       pl.repeats, pl.repeats == 1 ? "" : "s", size, pl.spin_ms, secs,
	       device_line);
	print_table(stdout);
	if (wrong_data)
		printf("\nWRONG DATA: a consumer read something other than what "
		       "the producer wrote (see the messages above)\n");
	else if (failed)
		printf("\nSOME BENCHMARKS FAILED (see the messages above)\n");
	else
		printf("\nall data checked bit-exact (every 8-byte word of every "
		       "transfer)\n");
	if (json && write_json(json, secs, failed || wrong_data))
		failed = 1;
	return wrong_data ? ROLE_EXIT_WRONG_DATA : failed;
}
