/* text — dlsharectl's messages, option values and formatting. */
#include "ctl.h"

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

/* ---- messages --------------------------------------------------------- */

__attribute__((format(printf, 2, 3)))
void ctl_errmsg(const char *cmd, const char *fmt, ...)
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
void ctl_report(const char *cmd, int err, const char *what)
{
	/* The daemon's explanation names what the code cannot (a queue's
	 * depth, a limit, an owner): add it when there is one. */
	const char *why = dlshare_last_error();

	if (what && why && *why)
		ctl_errmsg(cmd, "%s: %s (%s)", dlshare_strerror(err), what,
			   why);
	else if (what)
		ctl_errmsg(cmd, "%s: %s", dlshare_strerror(err), what);
	else
		ctl_errmsg(cmd, "%s", dlshare_strerror(err));
}

static void print_usage_line(FILE *f, const struct ctl_cmd *cmd)
{
	if (cmd) {
		fprintf(f, "Usage: " CTL_PROG " [OPTIONS] %s\n", cmd->synopsis);
	} else {
		fputs("Usage: " CTL_PROG " [OPTIONS] COMMAND [ARGS...]\n"
		      "Commands: ls, stat, stats, metrics, rm, put, cat, take, help.\n", f);
	}
	fputs("Run '" CTL_PROG " --help' for more.\n", f);
}

/* Says what is wrong with the command line, then how it should look.
 * Returns CTL_EUSAGE, so that callers can return ctl_usage_error(...). */
__attribute__((format(printf, 2, 3)))
int ctl_usage_error(const struct ctl_cmd *cmd, const char *fmt, ...)
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

void ctl_print_help(FILE *f)
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
	      "  stat NAME            show NAME and the tensors of its newest version (a\n"
	      "                       queue name: its oldest queued one, and its depth)\n"
	      "  stats                show the daemon's counters\n"
	      "  metrics              the daemon's counters in Prometheus's text format\n"
	      "      --output FILE      write them to FILE atomically (for node_exporter's\n"
	      "                         textfile collector), not to stdout\n"
	      "  rm NAME              delete NAME; leased versions live on until released\n"
	      "  rm --prefix PREFIX   delete every name under PREFIX that you may write\n"
	      "  put NAME [FILE]      publish FILE (stdin if absent or \"-\") as a new\n"
	      "                       version of NAME; prints the version number\n"
	      "      --dtype TYPE       element type: float32, int64, uint8, bfloat16, bool...\n"
	      "      --shape D0,D1,...  dimensions; \"\" or \"scalar\" for a 0-d tensor\n"
	      "      --mode OCTAL       permission bits, e.g. 0640 (default: the daemon's)\n"
	      "      --ttl MS           delete the name when no version was sealed for MS ms\n"
	      "      --queue DEPTH      into a queue name of this depth (0: the daemon's\n"
	      "                         default, or any depth of an existing queue)\n"
	      "      --wait MS          a full queue: wait up to MS ms for room; -1 or\n"
	      "                         \"forever\": no limit (default: 0, fail at once)\n"
	      "  cat NAME             write one tensor's raw bytes to stdout, row-major\n"
	      "      --version N        version N exactly (default: the newest)\n"
	      "      --newer-than N     the newest version after N\n"
	      "      --wait MS          wait up to MS ms for it; -1 or \"forever\": no limit\n"
	      "                         (default: 0, fail at once when there is none)\n"
	      "      --key KEY          the tensor with this key (default: the first)\n"
	      "  take NAME            take the oldest version of a queue name, write it\n"
	      "                       as cat does, and release it: it is consumed\n"
	      "      --wait MS          wait up to MS ms for one; -1 or \"forever\": no limit\n"
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
int ctl_parse_shape(const struct ctl_cmd *cmd, const char *s,
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
			return ctl_usage_error(cmd, "--shape: more than %d "
					       "dimensions", CTL_MAX_NDIM);
		if (len == 0)
			return ctl_usage_error(cmd, "--shape: empty dimension "
					       "in '%s' (expected e.g. 2,3,4)",
					       s);
		err = parse_u64_n(p, len, &v);
		if (err == 0 && v > INT64_MAX)
			err = -ERANGE;
		if (err == -ERANGE)
			return ctl_usage_error(cmd, "--shape: dimension '%.*s' "
					       "is too large", (int)len, p);
		if (err < 0)
			return ctl_usage_error(cmd, "--shape: '%.*s' is not a "
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
int ctl_parse_mode(const struct ctl_cmd *cmd, const char *s, uint32_t *mode)
{
	uint32_t v = 0;
	const char *p;

	for (p = s; *p; p++) {
		if (*p < '0' || *p > '7' || v > 0777)
			break;
		v = v * 8 + (uint32_t)(*p - '0');
	}
	if (p == s || *p || v > 0777 || v == 0)
		return ctl_usage_error(cmd, "--mode: '%s' is not an octal mode "
				       "from 1 to 0777 (e.g. 0640)", s);
	*mode = v;
	return 0;
}

/* Parses --wait: milliseconds, or -1 / "forever" for no limit.
 * Returns 0 or CTL_EUSAGE. */
int ctl_parse_wait(const struct ctl_cmd *cmd, const char *s, int32_t *ms)
{
	uint64_t v;

	if (strcmp(s, "-1") == 0 || strcmp(s, "forever") == 0) {
		*ms = DLSHARE_WAIT_FOREVER;
		return 0;
	}
	if (parse_u64(s, &v) < 0 || v > INT32_MAX)
		return ctl_usage_error(cmd, "--wait: '%s' is not a number of "
				       "milliseconds from 0 to %d, -1 or "
				       "\"forever\"", s, INT32_MAX);
	*ms = (int32_t)v;
	return 0;
}

int ctl_parse_ttl(const struct ctl_cmd *cmd, const char *s, uint32_t *ms)
{
	uint64_t v;

	if (parse_u64(s, &v) < 0 || v == 0 || v > UINT32_MAX)
		return ctl_usage_error(cmd, "--ttl: '%s' is not a number of "
				       "milliseconds from 1 to %u", s,
				       (unsigned)UINT32_MAX);
	*ms = (uint32_t)v;
	return 0;
}

int ctl_parse_version(const struct ctl_cmd *cmd, const char *opt,
			 const char *s, uint64_t *out)
{
	if (parse_u64(s, out) < 0)
		return ctl_usage_error(cmd, "%s: '%s' is not a version number",
				       opt, s);
	return 0;
}

/* ---- tensors ---------------------------------------------------------- */

/* Whether t's strides (counted in elements) are the row-major compact ones.
 * Dimensions of size 1 may have any stride: no step is ever taken in them.
 * Only for tensors whose size dlshare_tensor_nbytes() accepted. */
bool ctl_tensor_is_compact(const DLTensor *t)
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
bool ctl_host_readable(DLDevice dev)
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

void ctl_format_device(DLDevice dev, char *buf, size_t len)
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

void ctl_format_dtype(DLDataType dtype, char *buf, size_t len)
{
	if (dlshare_dtype_format(dtype, buf, len) < 0)
		snprintf(buf, len, "%u:%u:%u", dtype.code, dtype.bits,
			 dtype.lanes);
}

/* "[2, 3]"; "[]" for a 0-d tensor. */
void ctl_format_dims(char *buf, size_t len, const int64_t *v, int32_t n)
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
const char *ctl_kind_name(int kind)
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
void ctl_json_string(FILE *f, const char *s)
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

void ctl_json_dims(FILE *f, const int64_t *v, int32_t n)
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
void ctl_json_name_info(FILE *f, const dlshare_name_info *in,
			   bool tensor_count)
{
	const char *kind = ctl_kind_name(in->kind);

	fputs("{\"name\":", f);
	ctl_json_string(f, in->name);
	fprintf(f, ",\"latest\":%" PRIu64 ",\"versions\":%" PRIu32,
		in->latest, in->versions);
	if (tensor_count)
		fprintf(f, ",\"tensors\":%" PRIu32, in->tensors);
	fprintf(f, ",\"bytes\":%" PRIu64 ",\"leases\":%" PRIu32 ",\"kind\":",
		in->bytes, in->leases);
	if (kind)
		ctl_json_string(f, kind);
	else
		fputs("null", f);
	/* JSON has no octal; a string keeps the mode as people write it. */
	fprintf(f, ",\"mode\":\"%04" PRIo32 "\",\"owner_uid\":%" PRIu32
		",\"exported\":%s", in->mode & 07777, in->owner_uid,
		in->exported ? "true" : "false");
	fprintf(f, ",\"owned\":%s", in->owned ? "true" : "false");
	if (in->owned)
		fprintf(f, ",\"owner_pid\":%" PRIu32, in->owner_pid);
	if (in->ttl_ms)
		fprintf(f, ",\"ttl_ms\":%" PRIu32 ",\"expires_in_ms\":%" PRIu64,
			in->ttl_ms, in->expires_in_ms);
	/* 1.5: where a relay mirrored the newest version from. */
	if (in->origin_node[0]) {
		fputs(",\"origin_node\":", f);
		ctl_json_string(f, in->origin_node);
		fprintf(f, ",\"origin_version\":%" PRIu64, in->origin_version);
	}
}
