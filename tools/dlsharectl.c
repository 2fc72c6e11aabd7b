/* dlsharectl — the command-line tool of dlshare.
 *
 * Lists, describes, publishes, reads and deletes the names a dlshared daemon
 * holds, through libdlshare's public API only. Single-threaded. Each
 * subcommand is one function that reports its own errors on stderr and
 * returns CTL_OK or a negative CTL_E* code; only main() turns that into an
 * exit status.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#define CTL_PROG "dlsharectl"

#define CTL_MAX_NDIM 32		/* what dlshare_tensor_spec allows */
#define CTL_MAX_ARGS 2		/* positional arguments after any command */
#define CTL_DIMS_LEN 1024	/* "[d0, d1, ...]" for CTL_MAX_NDIM int64s */

/* Linux moves at most ~2 GiB per read()/write(); ask for 1 GiB at a time. */
#define CTL_IO_CHUNK ((size_t)1 << 30)

/* How far past the expected size put keeps counting an over-long input, so
 * that it can say how long the input was without hanging on an endless one. */
#define CTL_EXCESS_LIMIT ((uint64_t)1 << 30)

/* What a subcommand returns to main(). Each has already said why. */
enum {
	CTL_OK = 0,
	CTL_EFAIL = -1,		/* the daemon, library or system failed */
	CTL_EUSAGE = -2,	/* the command line is wrong */
};

/* Long options get values of their own (>= 0x100), apart from the short
 * letters, so that getopt's optopt tells a bad "--socket" from a bad "-s". */
enum {
	OPT_SOCKET = 0x100,
	OPT_JSON,
	OPT_HELP,
	OPT_VERSION,		/* the program's version */
	OPT_DTYPE,
	OPT_SHAPE,
	OPT_MODE,
	OPT_AT_VERSION,		/* cat --version N */
	OPT_NEWER_THAN,
	OPT_KEY,
	OPT_WAIT,
};

struct ctl;

struct ctl_cmd {
	const char *name;
	int (*run)(const struct ctl *ctl);
	int min_args;
	int max_args;
	const char *synopsis;		/* for usage errors */
	const struct option *opts;	/* its own options, or NULL */
};

/* The parsed command line. Option values stay raw strings: the subcommand
 * that takes them parses them, so it can word its own errors. */
struct ctl {
	const char *socket;	/* NULL: the library's default rule */
	bool json;
	bool help;
	bool version;
	const struct ctl_cmd *cmd;
	const char *args[CTL_MAX_ARGS];
	int nargs;		/* may exceed CTL_MAX_ARGS; only counted then */
	const char *dtype;
	const char *shape;
	const char *mode;
	const char *at_version;
	const char *newer_than;
	const char *key;
	const char *wait;
};

/* ---- messages --------------------------------------------------------- */

__attribute__((format(printf, 2, 3)))
static void errmsg(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fputs(CTL_PROG ": ", stderr);
	if (cmd)
		fprintf(stderr, "%s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Reports a libdlshare error as "dlsharectl: CMD: MESSAGE: WHAT", WHAT being
 * the name (or socket) it concerns; NULL leaves it out. */
static void report(const char *cmd, int err, const char *what)
{
	if (what)
		errmsg(cmd, "%s: %s", dlshare_strerror(err), what);
	else
		errmsg(cmd, "%s", dlshare_strerror(err));
}

static void print_usage_line(FILE *f, const struct ctl_cmd *cmd)
{
	if (cmd) {
		fprintf(f, "Usage: " CTL_PROG " [OPTIONS] %s\n", cmd->synopsis);
	} else {
		fputs("Usage: " CTL_PROG " [OPTIONS] COMMAND [ARGS...]\n"
		      "Commands: ls, stat, stats, rm, put, cat, help.\n", f);
	}
	fputs("Run '" CTL_PROG " --help' for more.\n", f);
}

/* Says what is wrong with the command line, then how it should look.
 * Returns CTL_EUSAGE, so that callers can return usage_error(...). */
__attribute__((format(printf, 2, 3)))
static int usage_error(const struct ctl_cmd *cmd, const char *fmt, ...)
{
	va_list ap;

	fputs(CTL_PROG ": ", stderr);
	if (cmd)
		fprintf(stderr, "%s: ", cmd->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	print_usage_line(stderr, cmd);
	return CTL_EUSAGE;
}

static void print_help(FILE *f)
{
	char path[PATH_MAX];

	if (dlshare_socket_path(path, sizeof(path)) < 0)
		snprintf(path, sizeof(path), "(too long to show)");

	fputs("Usage: " CTL_PROG " [OPTIONS] COMMAND [ARGS...]\n"
	      "\n"
	      "Inspect, publish and read the tensors that dlshared shares.\n"
	      "\n"
	      "Commands:\n"
	      "  ls [PREFIX]          list names (those starting with PREFIX, or all)\n"
	      "  stat NAME            show NAME and the tensors of its newest version\n"
	      "  stats                show the daemon's counters\n"
	      "  rm NAME              delete NAME; leased versions live on until released\n"
	      "  put NAME [FILE]      publish FILE (stdin if absent or \"-\") as a new\n"
	      "                       version of NAME; prints the version number\n"
	      "      --dtype TYPE       element type: float32, int64, uint8, bfloat16, bool...\n"
	      "      --shape D0,D1,...  dimensions; \"\" or \"scalar\" for a 0-d tensor\n"
	      "      --mode OCTAL       permission bits, e.g. 0640 (default: the daemon's)\n"
	      "  cat NAME             write one tensor's raw bytes to stdout, row-major\n"
	      "      --version N        version N exactly (default: the newest)\n"
	      "      --newer-than N     the newest version after N\n"
	      "      --wait MS          wait up to MS ms for it; -1 or \"forever\": no limit\n"
	      "                         (default: 0, fail at once when there is none)\n"
	      "      --key KEY          the tensor with this key (default: the first)\n"
	      "  help                 show this help\n"
	      "\n"
	      "Options, before or after COMMAND:\n"
	      "  -s, --socket PATH    the daemon's socket (default: $DLSHARE_SOCKET, else\n"
	      "                       a standard path; here ", f);
	fputs(path, f);
	fputs(")\n"
	      "  -j, --json           print one JSON value instead of text; errors stay\n"
	      "                       text on stderr, and cat still writes raw bytes\n"
	      "  -h, --help           show this help\n"
	      "      --version        show " CTL_PROG "'s version (after \"cat\",\n"
	      "                       --version N picks a version instead)\n"
	      "\n"
	      "put needs exactly prod(shape) * sizeof(TYPE) bytes of input, or publishes\n"
	      "nothing.\n"
	      "\n"
	      "Exit status: 0 on success, 1 on an error, 2 on a usage error.\n", f);
}

/* ---- parsing values --------------------------------------------------- */

/* Parses len bytes of decimal digits, nothing else (strtoull would take
 * "-1", " 7" and "0x10"). Returns 0, -EINVAL or -ERANGE. */
static int parse_u64_n(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	size_t i;

	if (len == 0)
		return -EINVAL;
	for (i = 0; i < len; i++) {
		unsigned d = (unsigned char)s[i] - '0';

		if (d > 9)
			return -EINVAL;
		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	return parse_u64_n(s, strlen(s), out);
}

/* Parses --shape: comma-separated non-negative integers, or "" / "scalar"
 * for a 0-d tensor. Says itself what is wrong.
 * Returns 0 or CTL_EUSAGE. */
static int parse_shape(const struct ctl_cmd *cmd, const char *s,
		       int64_t *shape, int32_t *ndim)
{
	const char *p = s;
	int32_t n = 0;

	if (*s == '\0' || strcmp(s, "scalar") == 0) {
		*ndim = 0;
		return 0;
	}
	for (;;) {
		size_t len = strcspn(p, ",");
		uint64_t v;
		int err;

		if (n == CTL_MAX_NDIM)
			return usage_error(cmd, "--shape: more than %d dimensions",
					   CTL_MAX_NDIM);
		if (len == 0)
			return usage_error(cmd, "--shape: empty dimension in '%s' "
					   "(expected e.g. 2,3,4)", s);
		err = parse_u64_n(p, len, &v);
		if (err == 0 && v > INT64_MAX)
			err = -ERANGE;
		if (err == -ERANGE)
			return usage_error(cmd, "--shape: dimension '%.*s' is "
					   "too large", (int)len, p);
		if (err < 0)
			return usage_error(cmd, "--shape: '%.*s' is not a "
					   "non-negative integer (expected e.g. "
					   "2,3,4)", (int)len, p);
		shape[n++] = (int64_t)v;
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
	*ndim = n;
	return 0;
}

/* Parses --mode: octal permission bits, 1 to 0777. 0 is refused because the
 * library reads it as "the daemon's default", which is not what it says.
 * Returns 0 or CTL_EUSAGE. */
static int parse_mode(const struct ctl_cmd *cmd, const char *s, uint32_t *mode)
{
	uint32_t v = 0;
	const char *p;

	for (p = s; *p; p++) {
		if (*p < '0' || *p > '7' || v > 0777)
			break;
		v = v * 8 + (uint32_t)(*p - '0');
	}
	if (p == s || *p || v > 0777 || v == 0)
		return usage_error(cmd, "--mode: '%s' is not an octal mode "
				   "from 1 to 0777 (e.g. 0640)", s);
	*mode = v;
	return 0;
}

/* Parses --wait: milliseconds, or -1 / "forever" for no limit.
 * Returns 0 or CTL_EUSAGE. */
static int parse_wait(const struct ctl_cmd *cmd, const char *s, int32_t *ms)
{
	uint64_t v;

	if (strcmp(s, "-1") == 0 || strcmp(s, "forever") == 0) {
		*ms = DLSHARE_WAIT_FOREVER;
		return 0;
	}
	if (parse_u64(s, &v) < 0 || v > INT32_MAX)
		return usage_error(cmd, "--wait: '%s' is not a number of "
				   "milliseconds from 0 to %d, -1 or "
				   "\"forever\"", s, INT32_MAX);
	*ms = (int32_t)v;
	return 0;
}

static int parse_version(const struct ctl_cmd *cmd, const char *opt,
			 const char *s, uint64_t *out)
{
	if (parse_u64(s, out) < 0)
		return usage_error(cmd, "%s: '%s' is not a version number", opt, s);
	return 0;
}

/* ---- tensors ---------------------------------------------------------- */

/* Whether t's strides (counted in elements) are the row-major compact ones.
 * Dimensions of size 1 may have any stride: no step is ever taken in them.
 * Only for tensors whose size dlshare_tensor_nbytes() accepted. */
static bool tensor_is_compact(const DLTensor *t)
{
	int64_t want = 1;
	int32_t d;

	if (!t->strides)
		return true;
	for (d = t->ndim - 1; d >= 0; d--) {
		if (t->shape[d] != 1 && t->strides[d] != want)
			return false;
		want *= t->shape[d];
	}
	return true;
}

/* Memory the CPU can read through t->data. */
static bool host_readable(DLDevice dev)
{
	switch (dev.device_type) {
	case kDLCPU:
	case kDLCUDAHost:
	case kDLCUDAManaged:
	case kDLROCMHost:
		return true;
	default:
		return false;
	}
}

static void format_device(DLDevice dev, char *buf, size_t len)
{
	switch (dev.device_type) {
	case kDLCPU:
		snprintf(buf, len, "cpu");
		break;
	case kDLCUDA:
		snprintf(buf, len, "cuda:%d", dev.device_id);
		break;
	case kDLCUDAHost:
		snprintf(buf, len, "cuda-host");
		break;
	case kDLCUDAManaged:
		snprintf(buf, len, "cuda-managed:%d", dev.device_id);
		break;
	case kDLROCM:
		snprintf(buf, len, "rocm:%d", dev.device_id);
		break;
	case kDLROCMHost:
		snprintf(buf, len, "rocm-host");
		break;
	default:
		snprintf(buf, len, "device%d:%d", (int)dev.device_type,
			 dev.device_id);
		break;
	}
}

static void format_dtype(DLDataType dtype, char *buf, size_t len)
{
	if (dlshare_dtype_format(dtype, buf, len) < 0)
		snprintf(buf, len, "%u:%u:%u", dtype.code, dtype.bits,
			 dtype.lanes);
}

/* "[2, 3]"; "[]" for a 0-d tensor. */
static void format_dims(char *buf, size_t len, const int64_t *v, int32_t n)
{
	size_t off;
	int32_t i;
	int k;

	off = (size_t)snprintf(buf, len, "[");
	for (i = 0; i < n && off < len; i++) {
		k = snprintf(buf + off, len - off, "%s%" PRId64, i ? ", " : "",
			     v[i]);
		if (k < 0)
			return;
		off += (size_t)k;
	}
	if (off < len)
		snprintf(buf + off, len - off, "]");
}

/* The name of a DLSHARE_KIND_*, or NULL for one this tool does not know
 * (also when a name has no sealed version yet). */
static const char *kind_name(int kind)
{
	switch (kind) {
	case DLSHARE_KIND_HOST:
		return "host";
	case DLSHARE_KIND_CUDA_IPC:
		return "cuda-ipc";
	case DLSHARE_KIND_CUDA_VMM:
		return "cuda-vmm";
	default:
		return NULL;
	}
}

/* ---- JSON ------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at p (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF), or 0. Reads no further than
 * the first byte that breaks it, so never past a terminating NUL. */
static size_t utf8_len(const unsigned char *p)
{
	unsigned char lo = 0x80, hi = 0xbf;
	size_t n, i;

	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		n = 2;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		n = 3;
		if (p[0] == 0xe0)
			lo = 0xa0;
		else if (p[0] == 0xed)
			hi = 0x9f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		n = 4;
		if (p[0] == 0xf0)
			lo = 0x90;
		else if (p[0] == 0xf4)
			hi = 0x8f;
	} else {
		return 0;
	}
	if (p[1] < lo || p[1] > hi)
		return 0;
	for (i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return n;
}

/* Prints s as a JSON string. Keys inside a version may be any bytes, and
 * JSON must be valid UTF-8: bytes that are not become U+FFFD. */
static void json_string(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n;

	fputc('"', f);
	while (*p) {
		if (*p == '"' || *p == '\\') {
			fputc('\\', f);
			fputc(*p++, f);
		} else if (*p < 0x20 || *p == 0x7f) {
			fprintf(f, "\\u%04x", *p++);
		} else if (*p < 0x80) {
			fputc(*p++, f);
		} else if ((n = utf8_len(p)) > 0) {
			fwrite(p, 1, n, f);
			p += n;
		} else {
			fputs("\\ufffd", f);
			p++;
		}
	}
	fputc('"', f);
}

static void json_dims(FILE *f, const int64_t *v, int32_t n)
{
	int32_t i;

	fputc('[', f);
	for (i = 0; i < n; i++)
		fprintf(f, "%s%" PRId64, i ? "," : "", v[i]);
	fputc(']', f);
}

/* Prints the fields of a name_info after an opening brace, in the order of
 * ls --json; the caller closes the object. stat leaves out the tensor count
 * because it prints the tensors themselves under that key. */
static void json_name_info(FILE *f, const dlshare_name_info *in,
			   bool tensor_count)
{
	const char *kind = kind_name(in->kind);

	fputs("{\"name\":", f);
	json_string(f, in->name);
	fprintf(f, ",\"latest\":%" PRIu64 ",\"versions\":%" PRIu32,
		in->latest, in->versions);
	if (tensor_count)
		fprintf(f, ",\"tensors\":%" PRIu32, in->tensors);
	fprintf(f, ",\"bytes\":%" PRIu64 ",\"leases\":%" PRIu32 ",\"kind\":",
		in->bytes, in->leases);
	if (kind)
		json_string(f, kind);
	else
		fputs("null", f);
	/* JSON has no octal; a string keeps the mode as people write it. */
	fprintf(f, ",\"mode\":\"%04" PRIo32 "\",\"owner_uid\":%" PRIu32
		",\"exported\":%s", in->mode & 07777, in->owner_uid,
		in->exported ? "true" : "false");
}

/* ---- I/O -------------------------------------------------------------- */

/* Waits until fd is ready, for descriptors the caller left non-blocking. */
static int wait_fd(int fd, short events)
{
	struct pollfd pfd = { .fd = fd, .events = events };

	if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

/* Writes all of buf to fd, across short writes and EINTR.
 * Returns 0 or -errno (-EPIPE when the reader went away). */
static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	ssize_t n;
	int err;

	while (len > 0) {
		n = write(fd, p, len < CTL_IO_CHUNK ? len : CTL_IO_CHUNK);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			err = wait_fd(fd, POLLOUT);
			if (err < 0)
				return err;
			continue;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads into buf until it is full or the input ends; *got says how much.
 * Returns 0 or -errno. */
static int read_full(int fd, void *buf, size_t len, size_t *got)
{
	char *p = buf;
	size_t have = 0;
	ssize_t n;
	int err;

	while (have < len) {
		size_t want = len - have;

		if (want > CTL_IO_CHUNK)
			want = CTL_IO_CHUNK;
		n = read(fd, p + have, want);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			err = wait_fd(fd, POLLIN);
			if (err < 0)
				return err;
			continue;
		}
		if (n == 0)
			break;
		have += (size_t)n;
	}
	*got = have;
	return 0;
}

/* Gathers small pieces (single elements of a strided tensor) into large
 * writes: a write() per element would cost a system call per few bytes. */
struct outbuf {
	int fd;
	size_t used;
	char buf[1 << 16];
};

static int outbuf_flush(struct outbuf *ob)
{
	int err = write_all(ob->fd, ob->buf, ob->used);

	ob->used = 0;
	return err;
}

static int outbuf_put(struct outbuf *ob, const void *p, size_t len)
{
	int err;

	if (len > sizeof(ob->buf) - ob->used) {
		err = outbuf_flush(ob);
		if (err < 0)
			return err;
		/* Long runs (whole rows) go out without a copy. */
		if (len >= sizeof(ob->buf))
			return write_all(ob->fd, p, len);
	}
	memcpy(ob->buf + ob->used, p, len);
	ob->used += len;
	return 0;
}

/* Writes the elements of a non-compact tensor in row-major order: an
 * odometer over the outer dimensions, a run along the innermost one. Strides
 * are in elements and may be negative; base is data + byte_offset.
 * Only for tensors with ndim >= 1 and at least one element.
 * Returns 0 or -errno. */
static int write_strided(int fd, const char *base, const DLTensor *t,
			 size_t esz)
{
	int64_t idx[CTL_MAX_NDIM] = { 0 };
	int32_t nd = t->ndim;
	int64_t inner_n = t->shape[nd - 1];
	int64_t inner_s = t->strides[nd - 1];
	int64_t off = 0;	/* element offset of idx[], inner index 0 */
	struct outbuf *ob;
	int32_t d;
	int64_t j;
	int err = 0;

	/* 64 KiB: better on the heap than on the stack of a small tool. */
	ob = malloc(sizeof(*ob));
	if (!ob)
		return -ENOMEM;
	ob->fd = fd;
	ob->used = 0;

	for (;;) {
		const char *row = base + off * (int64_t)esz;

		if (inner_s == 1) {
			err = outbuf_put(ob, row, (size_t)inner_n * esz);
		} else {
			int64_t step = inner_s * (int64_t)esz;

			for (j = 0; j < inner_n && err == 0; j++)
				err = outbuf_put(ob, row + j * step, esz);
		}
		if (err < 0)
			goto out;

		for (d = nd - 2; d >= 0; d--) {
			if (++idx[d] < t->shape[d]) {
				off += t->strides[d];
				break;
			}
			off -= (t->shape[d] - 1) * t->strides[d];
			idx[d] = 0;
		}
		if (d < 0)
			break;
	}
	err = outbuf_flush(ob);
out:
	free(ob);
	return err;
}

/* ---- subcommands ------------------------------------------------------ */

/* Connects to the daemon; on failure says which socket it tried.
 * Returns 0 or CTL_EFAIL. */
static int ctl_connect(const struct ctl *ctl, dlshare_client **out)
{
	char path[PATH_MAX];
	int err;

	err = dlshare_connect(ctl->socket, out);
	if (err == 0)
		return CTL_OK;
	if (ctl->socket)
		report(ctl->cmd->name, err, ctl->socket);
	else if (dlshare_socket_path(path, sizeof(path)) == 0)
		report(ctl->cmd->name, err, path);
	else
		report(ctl->cmd->name, err, "the default socket");
	return CTL_EFAIL;
}

/* ls gathers every name before printing, so that a failure halfway through
 * leaves no half-printed table or unterminated JSON array behind. */
struct name_list {
	dlshare_name_info *v;
	size_t n;
	size_t cap;
	int err;
};

static int ls_collect(const dlshare_name_info *info, void *arg)
{
	struct name_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		dlshare_name_info *v = reallocarray(l->v, cap, sizeof(*v));

		if (!v) {
			l->err = DLSHARE_ENOMEM;
			return 1;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n] = *info;
	/* It gets printed with %s: make sure it ends. */
	l->v[l->n].name[sizeof(l->v[l->n].name) - 1] = '\0';
	l->n++;
	return 0;
}

static void ls_print_text(const struct name_list *l)
{
	int w = 4;	/* strlen("NAME") */
	size_t i;

	for (i = 0; i < l->n; i++) {
		int len = (int)strlen(l->v[i].name);

		if (len > w)
			w = len;
	}
	printf("%-*s  %8s  %8s  %7s  %14s  %6s  %-8s  %-4s  %s\n", w, "NAME",
	       "LATEST", "VERSIONS", "TENSORS", "BYTES", "LEASES", "KIND",
	       "MODE", "OWNER");
	for (i = 0; i < l->n; i++) {
		const dlshare_name_info *in = &l->v[i];
		const char *kind = kind_name(in->kind);

		printf("%-*s  %8" PRIu64 "  %8" PRIu32 "  %7" PRIu32 "  %14" PRIu64
		       "  %6" PRIu32 "  %-8s  %04" PRIo32 "  %" PRIu32 "\n",
		       w, in->name, in->latest, in->versions, in->tensors,
		       in->bytes, in->leases, kind ? kind : "-",
		       in->mode & 07777, in->owner_uid);
	}
}

static void ls_print_json(const struct name_list *l)
{
	size_t i;

	putchar('[');
	for (i = 0; i < l->n; i++) {
		if (i)
			putchar(',');
		json_name_info(stdout, &l->v[i], true);
		putchar('}');
	}
	fputs("]\n", stdout);
}

static int cmd_ls(const struct ctl *ctl)
{
	const char *prefix = ctl->nargs > 0 ? ctl->args[0] : NULL;
	struct name_list list = { .v = NULL };
	dlshare_client *c = NULL;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_list(c, prefix, ls_collect, &list);
	if (err == 0)
		err = list.err;
	if (err < 0) {
		report("ls", err, prefix);
		ret = CTL_EFAIL;
	} else if (ctl->json) {
		ls_print_json(&list);
	} else {
		ls_print_text(&list);
	}
	free(list.v);
	dlshare_disconnect(c);
	return ret;
}

static void stat_print_text(const dlshare_name_info *in,
			    const dlshare_manifest *m)
{
	const char *kind = kind_name(in->kind);
	size_t i, n = m ? dlshare_manifest_count(m) : 0;
	char dims[CTL_DIMS_LEN], buf[64];

	printf("name      %s\n", in->name);
	printf("latest    %" PRIu64 "\n", in->latest);
	printf("versions  %" PRIu32 "\n", in->versions);
	printf("tensors   %" PRIu32 "\n", in->tensors);
	printf("bytes     %" PRIu64 "\n", in->bytes);
	printf("leases    %" PRIu32 "\n", in->leases);
	printf("kind      %s\n", kind ? kind : "-");
	printf("mode      %04" PRIo32 "\n", in->mode & 07777);
	printf("owner     %" PRIu32 "\n", in->owner_uid);
	printf("exported  %s\n", in->exported ? "yes" : "no");

	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		const char *key = dlshare_manifest_key(m, i);
		int32_t nd;

		if (!t)
			continue;
		nd = t->ndim < 0 ? 0 : t->ndim;
		printf("\ntensor %zu\n", i);
		/* Keys may hold any bytes: quote and escape them. */
		fputs("  key     ", stdout);
		if (key && *key)
			json_string(stdout, key);
		else
			fputs("(none)", stdout);
		putchar('\n');
		format_dtype(t->dtype, buf, sizeof(buf));
		printf("  dtype   %s\n", buf);
		format_device(t->device, buf, sizeof(buf));
		printf("  device  %s\n", buf);
		format_dims(dims, sizeof(dims), t->shape, nd);
		printf("  shape   %s\n", dims);
		if (t->strides) {
			format_dims(dims, sizeof(dims), t->strides, nd);
			printf("  strides %s\n", dims);
		}
		printf("  offset  %" PRIu64 "\n", t->byte_offset);
	}
}

static void stat_print_json(const dlshare_name_info *in,
			    const dlshare_manifest *m)
{
	size_t i, n = m ? dlshare_manifest_count(m) : 0;
	bool first = true;
	char buf[64];

	json_name_info(stdout, in, false);
	fputs(",\"tensors\":[", stdout);
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_manifest_tensor(m, i);
		const char *key = dlshare_manifest_key(m, i);
		int32_t nd;

		if (!t)
			continue;
		nd = t->ndim < 0 ? 0 : t->ndim;
		fputs(first ? "{\"key\":" : ",{\"key\":", stdout);
		first = false;
		json_string(stdout, key ? key : "");
		format_dtype(t->dtype, buf, sizeof(buf));
		fputs(",\"dtype\":", stdout);
		json_string(stdout, buf);
		format_device(t->device, buf, sizeof(buf));
		fputs(",\"device\":", stdout);
		json_string(stdout, buf);
		fputs(",\"shape\":", stdout);
		json_dims(stdout, t->shape, nd);
		fputs(",\"strides\":", stdout);
		if (t->strides)
			json_dims(stdout, t->strides, nd);
		else
			fputs("null", stdout);
		printf(",\"offset\":%" PRIu64 "}", t->byte_offset);
	}
	fputs("]}\n", stdout);
}

static int cmd_stat(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_name_info info;
	dlshare_manifest *m = NULL;
	dlshare_client *c = NULL;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_stat(c, name, &info, &m);
	if (err < 0) {
		report("stat", err, name);
		ret = CTL_EFAIL;
		goto out;
	}
	info.name[sizeof(info.name) - 1] = '\0';
	if (ctl->json)
		stat_print_json(&info, m);
	else
		stat_print_text(&info, m);
out:
	/* The header does not promise that NULL is a no-op here. */
	if (m)
		dlshare_manifest_free(m);
	dlshare_disconnect(c);
	return ret;
}

static void stats_print(const dlshare_stats *s, bool json)
{
	const struct {
		const char *key;
		uint64_t val;
	} rows[] = {
		{ "connections", s->connections },
		{ "names", s->names },
		{ "versions", s->versions },
		{ "leases", s->leases },
		{ "buffers", s->buffers },
		{ "bytes", s->bytes },
		{ "parked", s->parked },
		{ "requests", s->requests },
		{ "uptime_ms", s->uptime_ms },
	};
	size_t i, n = sizeof(rows) / sizeof(rows[0]);

	if (json) {
		for (i = 0; i < n; i++)
			printf("%s\"%s\":%" PRIu64, i ? "," : "{", rows[i].key,
			       rows[i].val);
		fputs("}\n", stdout);
	} else {
		for (i = 0; i < n; i++)
			printf("%s %" PRIu64 "\n", rows[i].key, rows[i].val);
	}
}

static int cmd_stats(const struct ctl *ctl)
{
	dlshare_client *c = NULL;
	dlshare_stats s;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_stats_get(c, &s);
	dlshare_disconnect(c);
	if (err < 0) {
		report("stats", err, NULL);
		return CTL_EFAIL;
	}
	stats_print(&s, ctl->json);
	return CTL_OK;
}

static int cmd_rm(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_client *c = NULL;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_delete(c, name);
	dlshare_disconnect(c);
	if (err < 0) {
		report("rm", err, name);
		return CTL_EFAIL;
	}
	if (ctl->json) {
		fputs("{\"deleted\":", stdout);
		json_string(stdout, name);
		fputs("}\n", stdout);
	}
	return CTL_OK;
}

/* Says that the input does not have the size the dtype and shape need. */
static void put_size_error(const char *input, uint64_t have, bool more,
			   uint64_t need, DLDataType dtype,
			   const int64_t *shape, int32_t ndim)
{
	char dt[64], dims[CTL_DIMS_LEN];

	format_dtype(dtype, dt, sizeof(dt));
	format_dims(dims, sizeof(dims), shape, ndim);
	errmsg("put", "%s has %s%" PRIu64 " bytes, but %s %s needs exactly %"
	       PRIu64 "; nothing published", input, more ? "more than " : "",
	       have, dt, dims, need);
}

/* Reads the input straight into the writer's mapping (so a large input is
 * never staged in a second buffer), then makes sure it ends right there,
 * counting any excess, up to a limit, for the error message.
 * Returns 0 or -errno; *have and *more say how long the input was. */
static int put_read(int fd, char *dst, uint64_t len, uint64_t *have,
		    bool *more)
{
	char scratch[4096];
	uint64_t extra = 0;
	size_t got;
	int err;

	*more = false;
	err = read_full(fd, dst, (size_t)len, &got);
	if (err < 0)
		return err;
	if (got < len) {
		*have = got;
		return 0;
	}
	for (;;) {
		err = read_full(fd, scratch, sizeof(scratch), &got);
		if (err < 0)
			return err;
		extra += got;
		if (got < sizeof(scratch))
			break;
		if (extra > CTL_EXCESS_LIMIT) {
			*more = true;
			break;
		}
	}
	*have = len + extra;
	return 0;
}

static int cmd_put(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	const char *path = ctl->nargs > 1 ? ctl->args[1] : "-";
	bool from_stdin = strcmp(path, "-") == 0;
	const char *input = from_stdin ? "stdin" : path;
	int64_t shape[CTL_MAX_NDIM];
	dlshare_tensor_spec spec = { .key = NULL, .shape = shape };
	dlshare_create_opts copts = {
		.device = { .device_type = kDLCPU, .device_id = 0 },
	};
	dlshare_client *c = NULL;
	dlshare_writer *w = NULL;
	uint64_t nbytes, have, version;
	char *dst = NULL;
	DLTensor *t, want = { 0 };
	struct stat st;
	bool more;
	int fd = -1, err, ret;

	if (!ctl->dtype)
		return usage_error(ctl->cmd, "--dtype is required");
	if (!ctl->shape)
		return usage_error(ctl->cmd, "--shape is required "
				   "(\"\" or \"scalar\" for a 0-d tensor)");
	if (dlshare_dtype_parse(ctl->dtype, &spec.dtype) < 0)
		return usage_error(ctl->cmd, "--dtype: unknown type '%s' (e.g. "
				   "float32, int64, uint8, bfloat16, bool)",
				   ctl->dtype);
	ret = parse_shape(ctl->cmd, ctl->shape, shape, &spec.ndim);
	if (ret < 0)
		return ret;
	if (ctl->mode) {
		ret = parse_mode(ctl->cmd, ctl->mode, &copts.mode);
		if (ret < 0)
			return ret;
	}
	/* The dtype is one dlshare_dtype_parse knows, and the shape has no
	 * negative dimension (parse_shape): what is left to refuse is a size
	 * past INT64_MAX bytes. */
	want.dtype = spec.dtype;
	want.ndim = spec.ndim;
	want.shape = shape;
	if (dlshare_tensor_nbytes(&want, &nbytes) < 0)
		return usage_error(ctl->cmd, "--shape: a %s tensor of shape %s "
				   "does not fit in memory", ctl->dtype,
				   ctl->shape);

	if (from_stdin) {
		fd = STDIN_FILENO;
	} else {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			errmsg("put", "%s: %s", path, strerror(errno));
			return CTL_EFAIL;
		}
	}
	/* A directory, or a regular file (also as stdin) with the wrong number
	 * of bytes left to read, fails here, before a version is created. The
	 * read loop checks again: a file may change under us. */
	if (fstat(fd, &st) == 0) {
		off_t pos = lseek(fd, 0, SEEK_CUR);

		if (S_ISDIR(st.st_mode)) {
			errmsg("put", "%s: %s", input, strerror(EISDIR));
			ret = CTL_EFAIL;
			goto out;
		}
		if (S_ISREG(st.st_mode) && pos >= 0 && pos <= st.st_size &&
		    (uint64_t)(st.st_size - pos) != nbytes) {
			put_size_error(input, (uint64_t)(st.st_size - pos),
				       false, nbytes, spec.dtype, shape,
				       spec.ndim);
			ret = CTL_EFAIL;
			goto out;
		}
	}

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		goto out;
	err = dlshare_create(c, name, &spec, 1, &copts, &w);
	if (err < 0) {
		report("put", err, name);
		ret = CTL_EFAIL;
		goto out;
	}
	t = dlshare_writer_tensor(w, 0);
	if (t && t->data)
		dst = (char *)t->data + t->byte_offset;
	if (!t || (nbytes > 0 && !dst)) {
		errmsg("put", "the library gave no memory to write to: %s",
		       name);
		ret = CTL_EFAIL;
		goto out;
	}

	err = put_read(fd, dst, nbytes, &have, &more);
	if (err < 0) {
		errmsg("put", "reading %s: %s", input, strerror(-err));
		ret = CTL_EFAIL;
		goto out;
	}
	if (have != nbytes) {
		put_size_error(input, have, more, nbytes, spec.dtype, shape,
			       spec.ndim);
		ret = CTL_EFAIL;
		goto out;
	}

	err = dlshare_seal(w, NULL, &version);
	w = NULL;	/* seal consumes the writer, also when it fails */
	if (err < 0) {
		report("put", err, name);
		ret = CTL_EFAIL;
		goto out;
	}
	if (ctl->json) {
		fputs("{\"name\":", stdout);
		json_string(stdout, name);
		printf(",\"version\":%" PRIu64 "}\n", version);
	} else {
		printf("%s version %" PRIu64 "\n", name, version);
	}
	ret = CTL_OK;
out:
	/* An unsealed version is dropped, never published half-written. */
	dlshare_writer_abort(w);
	dlshare_disconnect(c);
	if (!from_stdin && fd >= 0)
		close(fd);
	return ret;
}

/* Writes tensor t of what (the name, for messages) to stdout, row-major.
 * The caller's lease keeps t's memory mapped and unchanged meanwhile.
 * Returns 0 or CTL_EFAIL. */
static int cat_tensor(const char *what, const DLTensor *t)
{
	uint64_t nbytes;
	const char *base;
	char buf[64];
	size_t esz;
	int err;

	if (!host_readable(t->device)) {
		format_device(t->device, buf, sizeof(buf));
		errmsg("cat", "%s: the tensor lives in %s memory; cat reads only "
		       "host memory", what, buf);
		return CTL_EFAIL;
	}
	if (t->ndim < 0 || t->ndim > CTL_MAX_NDIM) {
		errmsg("cat", "%s: the tensor has %d dimensions; at most %d are "
		       "supported", what, (int)t->ndim, CTL_MAX_NDIM);
		return CTL_EFAIL;
	}
	err = dlshare_tensor_nbytes(t, &nbytes);
	if (err < 0) {
		format_dtype(t->dtype, buf, sizeof(buf));
		errmsg("cat", "%s: cannot write a %s tensor of this shape", what,
		       buf);
		return CTL_EFAIL;
	}
	if (nbytes == 0)
		return CTL_OK;

	esz = dlshare_dtype_size(t->dtype);
	base = (const char *)t->data + t->byte_offset;
	if (tensor_is_compact(t))
		err = write_all(STDOUT_FILENO, base, (size_t)nbytes);
	else
		err = write_strided(STDOUT_FILENO, base, t, esz);
	if (err == -EPIPE) {
		errmsg("cat", "%s: stdout was closed before all %" PRIu64
		       " bytes were written (broken pipe)", what, nbytes);
		return CTL_EFAIL;
	}
	if (err < 0) {
		errmsg("cat", "%s: writing to stdout: %s", what, strerror(-err));
		return CTL_EFAIL;
	}
	return CTL_OK;
}

static int cmd_cat(const struct ctl *ctl)
{
	const char *name = ctl->args[0];
	dlshare_get_opts opts = { .select = DLSHARE_LATEST, .timeout_ms = 0 };
	dlshare_client *c = NULL;
	dlshare_bundle *b = NULL;
	const DLTensor *t;
	char what[512];
	size_t i = 0;
	int err, ret;

	if (ctl->at_version && ctl->newer_than)
		return usage_error(ctl->cmd, "--version and --newer-than exclude "
				   "each other");
	if (ctl->at_version) {
		opts.select = DLSHARE_EXACT;
		ret = parse_version(ctl->cmd, "--version", ctl->at_version,
				    &opts.version);
		if (ret < 0)
			return ret;
		snprintf(what, sizeof(what), "%s version %" PRIu64, name,
			 opts.version);
	} else if (ctl->newer_than) {
		opts.select = DLSHARE_NEWER_THAN;
		ret = parse_version(ctl->cmd, "--newer-than", ctl->newer_than,
				    &opts.version);
		if (ret < 0)
			return ret;
		snprintf(what, sizeof(what), "%s newer than version %" PRIu64,
			 name, opts.version);
	} else {
		snprintf(what, sizeof(what), "%s", name);
	}
	if (ctl->wait) {
		ret = parse_wait(ctl->cmd, ctl->wait, &opts.timeout_ms);
		if (ret < 0)
			return ret;
	}

	ret = ctl_connect(ctl, &c);
	if (ret < 0)
		return ret;
	err = dlshare_get(c, name, &opts, &b);
	if (err < 0) {
		report("cat", err, what);
		ret = CTL_EFAIL;
		goto out;
	}
	/* From here on, messages name the version actually got. */
	snprintf(what, sizeof(what), "%s version %" PRIu64, name,
		 dlshare_bundle_version(b));

	if (ctl->key) {
		err = dlshare_bundle_find(b, ctl->key);
		if (err < 0) {
			errmsg("cat", "%s has no tensor with key '%s'", what,
			       ctl->key);
			ret = CTL_EFAIL;
			goto out;
		}
		i = (size_t)err;
	}
	t = dlshare_bundle_tensor(b, i);
	if (!t) {
		errmsg("cat", "%s holds no tensors", what);
		ret = CTL_EFAIL;
		goto out;
	}
	/* Written before dlshare_bundle_free(): the lease keeps it valid. */
	ret = cat_tensor(what, t);
out:
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return ret;
}

static int cmd_help(const struct ctl *ctl)
{
	print_help(stdout);
	return CTL_OK;
}

/* ---- command line ----------------------------------------------------- */

/* Accepted before the command. After it, a command's own options come
 * first and shadow these: cat's --version N is not the program's version. */
static const struct option global_opts[] = {
	{ "socket", required_argument, NULL, OPT_SOCKET },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "help", no_argument, NULL, OPT_HELP },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ NULL, 0, NULL, 0 },
};

static const struct option put_opts[] = {
	{ "dtype", required_argument, NULL, OPT_DTYPE },
	{ "shape", required_argument, NULL, OPT_SHAPE },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ NULL, 0, NULL, 0 },
};

static const struct option cat_opts[] = {
	{ "version", required_argument, NULL, OPT_AT_VERSION },
	{ "newer-than", required_argument, NULL, OPT_NEWER_THAN },
	{ "key", required_argument, NULL, OPT_KEY },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ NULL, 0, NULL, 0 },
};

static const struct ctl_cmd ctl_cmds[] = {
	{ "ls", cmd_ls, 0, 1, "ls [PREFIX]", NULL },
	{ "stat", cmd_stat, 1, 1, "stat NAME", NULL },
	{ "stats", cmd_stats, 0, 0, "stats", NULL },
	{ "rm", cmd_rm, 1, 1, "rm NAME", NULL },
	{ "put", cmd_put, 1, 2,
	  "put NAME --dtype TYPE --shape D0,D1,... [--mode OCTAL] [FILE]",
	  put_opts },
	{ "cat", cmd_cat, 1, 1,
	  "cat NAME [--version N | --newer-than N] [--key KEY] [--wait MS]",
	  cat_opts },
	{ "help", cmd_help, 0, 0, "help", NULL },
};

static const struct ctl_cmd *find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++)
		if (strcmp(ctl_cmds[i].name, name) == 0)
			return &ctl_cmds[i];
	return NULL;
}

static bool has_long_opt(const struct option *opts, const char *name)
{
	for (; opts && opts->name; opts++)
		if (strcmp(opts->name, name) == 0)
			return true;
	return false;
}

/* Builds the long options accepted after cmd: its own, then the global ones
 * it does not shadow. cap includes the terminating entry. */
static void build_opts(const struct ctl_cmd *cmd, struct option *out,
		       size_t cap)
{
	const struct option *o;
	size_t n = 0;

	for (o = cmd->opts; o && o->name && n + 1 < cap; o++)
		out[n++] = *o;
	for (o = global_opts; o->name && n + 1 < cap; o++)
		if (!has_long_opt(cmd->opts, o->name))
			out[n++] = *o;
	memset(&out[n], 0, sizeof(out[n]));
}

/* Stores one option getopt_long returned, or says what getopt disliked.
 * argv is the vector getopt scanned. Returns 0 or CTL_EUSAGE. */
static int take_opt(struct ctl *ctl, const struct ctl_cmd *cmd, int c,
		    char *const *argv)
{
	char shortopt[3] = { '-', (char)optopt, '\0' };
	/* Long options have values >= 0x100 or 0, short ones are a letter:
	 * that tells whether argv[optind - 1] is the culprit or only its
	 * neighbour in "-jx". */
	const char *bad = optopt > 0 && optopt < 0x100 ? shortopt
						       : argv[optind - 1];

	switch (c) {
	case 's':
	case OPT_SOCKET:
		ctl->socket = optarg;
		break;
	case 'j':
	case OPT_JSON:
		ctl->json = true;
		break;
	case 'h':
	case OPT_HELP:
		ctl->help = true;
		break;
	case OPT_VERSION:
		ctl->version = true;
		break;
	case OPT_DTYPE:
		ctl->dtype = optarg;
		break;
	case OPT_SHAPE:
		ctl->shape = optarg;
		break;
	case OPT_MODE:
		ctl->mode = optarg;
		break;
	case OPT_AT_VERSION:
		ctl->at_version = optarg;
		break;
	case OPT_NEWER_THAN:
		ctl->newer_than = optarg;
		break;
	case OPT_KEY:
		ctl->key = optarg;
		break;
	case OPT_WAIT:
		ctl->wait = optarg;
		break;
	case ':':
		return usage_error(cmd, "option '%s' needs a value", bad);
	default:
		return usage_error(cmd, "unknown or malformed option '%s'", bad);
	}
	return 0;
}

static void add_arg(struct ctl *ctl, const char *arg)
{
	if (ctl->nargs < CTL_MAX_ARGS)
		ctl->args[ctl->nargs] = arg;
	ctl->nargs++;
}

/* Parses the command line in two passes: global options up to the command
 * ("+": stop at the first non-option), then the rest with the command's own
 * options added, so that global ones may also come after it. The second pass
 * uses "-" to get positional arguments in order even under POSIXLY_CORRECT.
 * Returns 0 (with ctl->help or ctl->version maybe set) or CTL_EUSAGE. */
static int parse_cmdline(int argc, char **argv, struct ctl *ctl)
{
	struct option longopts[16];
	char **sub_argv;
	int c, sub_argc, ret;

	opterr = 0;	/* usage_error() words the complaints */
	while ((c = getopt_long(argc, argv, "+:hjs:", global_opts, NULL)) != -1) {
		ret = take_opt(ctl, NULL, c, argv);
		if (ret < 0)
			return ret;
	}
	if (ctl->help || ctl->version)
		return 0;
	if (optind >= argc)
		return usage_error(NULL, "no command given");
	ctl->cmd = find_cmd(argv[optind]);
	if (!ctl->cmd)
		return usage_error(NULL, "unknown command '%s'", argv[optind]);

	/* The command takes argv[0]'s place; optind = 0 resets getopt. */
	sub_argc = argc - optind;
	sub_argv = argv + optind;
	build_opts(ctl->cmd, longopts, sizeof(longopts) / sizeof(longopts[0]));
	optind = 0;
	while ((c = getopt_long(sub_argc, sub_argv, "-:hjs:", longopts,
				NULL)) != -1) {
		if (c == 1) {
			add_arg(ctl, optarg);
			continue;
		}
		ret = take_opt(ctl, ctl->cmd, c, sub_argv);
		if (ret < 0)
			return ret;
	}
	/* What follows "--" is positional, even if it starts with '-'. */
	for (; optind < sub_argc; optind++)
		add_arg(ctl, sub_argv[optind]);

	if (ctl->help || ctl->version)
		return 0;
	if (ctl->nargs < ctl->cmd->min_args)
		return usage_error(ctl->cmd, "missing argument");
	if (ctl->nargs > ctl->cmd->max_args)
		return usage_error(ctl->cmd, "too many arguments");
	return 0;
}

int main(int argc, char **argv)
{
	struct ctl ctl = { .socket = NULL };
	int ret;

	/* A reader that goes away (dlsharectl cat x | head -c 16) must show
	 * as EPIPE from write(), which cat reports, not kill us silently. */
	signal(SIGPIPE, SIG_IGN);

	ret = parse_cmdline(argc, argv, &ctl);
	if (ret == 0) {
		if (ctl.help)
			print_help(stdout);
		else if (ctl.version)
			printf(CTL_PROG " %s\n", dlshare_version());
		else
			ret = ctl.cmd->run(&ctl);
	}
	/* Buffered text output fails only here, e.g. on a full disk. */
	if (fflush(stdout) == EOF || ferror(stdout)) {
		if (ret == 0) {
			errmsg(ctl.cmd ? ctl.cmd->name : NULL,
			       "writing to stdout: %s", strerror(errno));
			ret = CTL_EFAIL;
		}
	}

	switch (ret) {
	case CTL_OK:
		return 0;
	case CTL_EUSAGE:
		return 2;
	default:
		return 1;
	}
}
