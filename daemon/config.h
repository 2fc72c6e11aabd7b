/* config — dlshared's settings: one table of options (name, value syntax,
 * default, help) that drives the command line, the INI file read with
 * libinih, --help, --print-config and the generated man page text, so that
 * no two of them can drift apart.
 *
 * Defaults < the configuration file < flags. A struct config owns its
 * strings. Main thread, before the loop starts (getopt is not reentrant).
 */
#ifndef DLSHARE_CONFIG_H
#define DLSHARE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "server.h"

#ifndef DLSHARE_CONFIG_FILE
#define DLSHARE_CONFIG_FILE "/etc/dlshare/dlshared.conf"
#endif

/* Warning, info and debug lines per second before the log drops some. */
#define CONFIG_LOG_RATE_DEFAULT 100u

/* Options in the table; config_option_count() says how many. */
#define CONFIG_MAX_OPTIONS 48

struct config {
	struct server_config server; /* server.socket_path points into path */
	int log_level;               /* LOG_ERR .. LOG_DEBUG */
	enum log_prefix log_prefix;
	uint32_t log_rate;           /* lines per second; 0: no limit */
	char *path;                  /* the socket path given, or NULL */
	char *file;                  /* the configuration file read, or NULL */
	/* Where each option got its value: 0 the default, > 0 that line of
	 * file, -1 a flag. */
	int src[CONFIG_MAX_OPTIONS];
};

/* What main() should do once the configuration is parsed. */
enum config_action {
	CONFIG_RUN,                  /* serve */
	CONFIG_EXIT,                 /* --help or --version: done */
	CONFIG_CHECK,                /* --check-config */
	CONFIG_PRINT,                /* --print-config */
};

/* Fills every default; nothing to free yet. */
void config_init(struct config *c);
/* Frees what c owns; c can be initialized again. */
void config_deinit(struct config *c);

/* Reads the command line, then the file that --config names (an error when
 * it is missing) or else DLSHARE_CONFIG_FILE when it exists, then applies the
 * flags over the file, then checks options against each other. --help and
 * --version print to out. Every error is one line on err, naming the flag or
 * the file and line. *action is set even on failure. Returns 0, -EINVAL
 * (errors reported) or -ENOMEM. */
int config_from_args(struct config *c, int argc, char **argv, FILE *out,
		     FILE *err, enum config_action *action);

/* Applies an INI file: keys are the long option names, at the top or under
 * [dlshared]. Returns 0; -ENOENT when it does not exist (nothing reported);
 * -EINVAL when some line is wrong (each reported on err as "PATH:LINE:
 * ..."); or -errno when it cannot be read (reported). */
int config_load_file(struct config *c, const char *path, FILE *err);

/* Sets option key (its long name) from text. where names the source in an
 * error ("--max-fds" or "PATH:LINE"); src is recorded as in c->src. Returns
 * 0, -ENOENT for an unknown key, or -EINVAL for a bad value (both
 * reported on err). */
int config_set(struct config *c, const char *key, const char *value,
	       const char *where, int src, FILE *err);

/* Checks options against each other. Returns 0 or -EINVAL (reported). */
int config_validate(const struct config *c, FILE *err);

/* --help. */
void config_usage(FILE *out);
/* The effective settings as an INI file that config_load_file reads back. */
void config_print(const struct config *c, FILE *out);
/* An example file: every key commented out, with its help and default. */
void config_print_example(FILE *out);
/* roff paragraphs (.TP) for the man pages: keys (dlshared.conf(5)) when
 * keys is non-zero, else flags (dlshared(8)). */
void config_print_man(FILE *out, int keys);

int config_option_count(void);
/* The long name of option i (0 .. config_option_count() - 1), or NULL. */
const char *config_option_name(int i);

#endif
