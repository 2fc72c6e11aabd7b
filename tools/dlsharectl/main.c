/* dlsharectl — the command-line tool of dlshare.
 *
 * Lists, describes, publishes, reads and deletes the names a dlshared daemon
 * holds, through libdlshare's public API only. Single-threaded. Each
 * subcommand is one function that reports its own errors on stderr and
 * returns CTL_OK or a negative CTL_E* code; only main() turns that into an
 * exit status.
 */
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
	{ "ttl", required_argument, NULL, OPT_TTL },
	{ "queue", required_argument, NULL, OPT_QUEUE },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ NULL, 0, NULL, 0 },
};

static const struct option rm_opts[] = {
	{ "prefix", no_argument, NULL, OPT_PREFIX },
	{ NULL, 0, NULL, 0 },
};

static const struct option take_opts[] = {
	{ "key", required_argument, NULL, OPT_KEY },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ NULL, 0, NULL, 0 },
};

static const struct option cat_opts[] = {
	{ "version", required_argument, NULL, OPT_AT_VERSION },
	{ "newer-than", required_argument, NULL, OPT_NEWER_THAN },
	{ "key", required_argument, NULL, OPT_KEY },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ NULL, 0, NULL, 0 },
};

static const struct option metrics_opts[] = {
	{ "output", required_argument, NULL, OPT_OUTPUT },
	{ NULL, 0, NULL, 0 },
};

static const struct ctl_cmd ctl_cmds[] = {
	{ "ls", cmd_ls, 0, 1, "ls [PREFIX]", NULL },
	{ "stat", cmd_stat, 1, 1, "stat NAME", NULL },
	{ "stats", cmd_stats, 0, 0, "stats", NULL },
	{ "metrics", cmd_metrics, 0, 0, "metrics [--output FILE]",
	  metrics_opts },
	{ "rm", cmd_rm, 1, 1, "rm NAME | rm --prefix PREFIX", rm_opts },
	{ "put", cmd_put, 1, 2,
	  "put NAME --dtype TYPE --shape D0,D1,... [--mode OCTAL] [--ttl MS] "
	  "[--queue DEPTH [--wait MS]] [FILE]",
	  put_opts },
	{ "cat", cmd_cat, 1, 1,
	  "cat NAME [--version N | --newer-than N] [--key KEY] [--wait MS]",
	  cat_opts },
	{ "take", cmd_take, 1, 1, "take NAME [--key KEY] [--wait MS]",
	  take_opts },
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
	case OPT_PREFIX:
		ctl->prefix = true;
		break;
	case OPT_TTL:
		ctl->ttl = optarg;
		break;
	case OPT_QUEUE:
		ctl->queue = optarg;
		break;
	case OPT_OUTPUT:
		ctl->output = optarg;
		break;
	case ':':
		return ctl_usage_error(cmd, "option '%s' needs a value", bad);
	default:
		return ctl_usage_error(cmd, "unknown or malformed option '%s'",
				       bad);
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

	opterr = 0;	/* ctl_usage_error() words the complaints */
	while ((c = getopt_long(argc, argv, "+:hjs:", global_opts, NULL)) != -1) {
		ret = take_opt(ctl, NULL, c, argv);
		if (ret < 0)
			return ret;
	}
	if (ctl->help || ctl->version)
		return 0;
	if (optind >= argc)
		return ctl_usage_error(NULL, "no command given");
	ctl->cmd = find_cmd(argv[optind]);
	if (!ctl->cmd)
		return ctl_usage_error(NULL, "unknown command '%s'",
				       argv[optind]);

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
		return ctl_usage_error(ctl->cmd, "missing argument");
	if (ctl->nargs > ctl->cmd->max_args)
		return ctl_usage_error(ctl->cmd, "too many arguments");
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
			ctl_print_help(stdout);
		else if (ctl.version)
			printf(CTL_PROG " %s\n", dlshare_version());
		else
			ret = ctl.cmd->run(&ctl);
	}
	/* Buffered text output fails only here, e.g. on a full disk. */
	if (fflush(stdout) == EOF || ferror(stdout)) {
		if (ret == 0) {
			ctl_errmsg(ctl.cmd ? ctl.cmd->name : NULL,
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
