/* ctl — what the files of dlsharectl share: the parsed command line, the
 * subcommand table's entries, and the helpers each file gives the others.
 * dlsharectl is written against libdlshare's public API only.
 * Single-threaded.
 *
 *   main.c  the command line (getopt_long), the subcommand table, main()
 *   cmd.c   the subcommands: ls, stat, stats, rm, put, cat, take, help
 *   text.c  messages and usage, parsing option values, formatting tensors
 *           as text and JSON
 *   io.c    reading and writing whole buffers and strided tensors
 *   metrics.c  metrics: the daemon's counters for Prometheus, printed or
 *           written atomically into a file
 */
#ifndef DLSHARECTL_CTL_H
#define DLSHARECTL_CTL_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
	OPT_PREFIX,		/* rm --prefix */
	OPT_TTL,		/* put --ttl MS */
	OPT_QUEUE,		/* put --queue DEPTH */
	OPT_OUTPUT,		/* metrics --output FILE */
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
	bool prefix;		/* rm --prefix */
	const char *ttl;	/* put --ttl MS */
	const char *queue;
	const char *output;	/* metrics --output FILE */
};

/* ---- subcommands (cmd.c): each reports its own errors and returns CTL_OK,
 * CTL_EFAIL or CTL_EUSAGE. */
int cmd_ls(const struct ctl *ctl);
int cmd_stat(const struct ctl *ctl);
int cmd_stats(const struct ctl *ctl);
int cmd_rm(const struct ctl *ctl);
int cmd_put(const struct ctl *ctl);
int cmd_cat(const struct ctl *ctl);
int cmd_take(const struct ctl *ctl);
int cmd_help(const struct ctl *ctl);
int cmd_metrics(const struct ctl *ctl);		/* metrics.c */

/* Connects to ctl->socket (NULL: the default), saying why not. Returns
 * CTL_OK or CTL_EFAIL (cmd.c). */
int ctl_connect(const struct ctl *ctl, dlshare_client **out);

/* ---- messages, option values, formatting (text.c) ---------------------- */
__attribute__((format(printf, 2, 3)))
void ctl_errmsg(const char *cmd, const char *fmt, ...);
void ctl_report(const char *cmd, int err, const char *what);
__attribute__((format(printf, 2, 3)))
int ctl_usage_error(const struct ctl_cmd *cmd, const char *fmt, ...);
void ctl_print_help(FILE *f);
int ctl_parse_shape(const struct ctl_cmd *cmd, const char *s,
		       int64_t *shape, int32_t *ndim);
int ctl_parse_mode(const struct ctl_cmd *cmd, const char *s, uint32_t *mode);
int ctl_parse_wait(const struct ctl_cmd *cmd, const char *s, int32_t *ms);
int ctl_parse_ttl(const struct ctl_cmd *cmd, const char *s, uint32_t *ms);
int ctl_parse_version(const struct ctl_cmd *cmd, const char *opt,
			 const char *s, uint64_t *out);
bool ctl_tensor_is_compact(const DLTensor *t);
bool ctl_host_readable(DLDevice dev);
void ctl_format_device(DLDevice dev, char *buf, size_t len);
void ctl_format_dtype(DLDataType dtype, char *buf, size_t len);
void ctl_format_dims(char *buf, size_t len, const int64_t *v, int32_t n);
const char *ctl_kind_name(int kind);
void ctl_json_string(FILE *f, const char *s);
void ctl_json_dims(FILE *f, const int64_t *v, int32_t n);
void ctl_json_name_info(FILE *f, const dlshare_name_info *in,
			   bool tensor_count);

/* ---- I/O (io.c) -------------------------------------------------------- */
int ctl_write_all(int fd, const void *buf, size_t len);
int ctl_read_full(int fd, void *buf, size_t len, size_t *got);
int ctl_write_strided(int fd, const char *base, const DLTensor *t,
			 size_t esz);

#endif
