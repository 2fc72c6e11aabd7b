/* test_config — dlshared's settings (daemon/config.c): the INI file, flags
 * over the file, errors that name their line, and the texts made from the
 * option table. Module tests: no daemon, no socket. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"

/* A file with the given text in a fresh temporary directory. */
struct tmpfile {
	char dir[64];
	char path[96];
};

static void tmp_write(struct tmpfile *t, const char *text)
{
	FILE *f;

	snprintf(t->dir, sizeof(t->dir), "/tmp/dlshare-cfg-XXXXXX");
	assert_non_null(mkdtemp(t->dir));
	snprintf(t->path, sizeof(t->path), "%s/dlshared.conf", t->dir);
	f = fopen(t->path, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

static void tmp_remove(struct tmpfile *t)
{
	unlink(t->path);
	rmdir(t->dir);
}

/* Errors written to a memory stream. */
struct errbuf {
	char *text;
	size_t len;
	FILE *f;
};

static void err_open(struct errbuf *e)
{
	e->text = NULL;
	e->f = open_memstream(&e->text, &e->len);
	assert_non_null(e->f);
}

static char *err_close(struct errbuf *e)
{
	fclose(e->f);
	return e->text;
}

/* Loads text as a file; returns config_load_file's result and the errors
 * (free them). */
static int load(struct config *c, const char *text, char **errors,
		struct tmpfile *t)
{
	struct errbuf e;
	int r;

	tmp_write(t, text);
	err_open(&e);
	r = config_load_file(c, t->path, e.f);
	*errors = err_close(&e);
	return r;
}

/* Asserts that errors holds "PATH:LINE: " followed by what. */
static void assert_error_at(const char *errors, const struct tmpfile *t,
			    int line, const char *what)
{
	char want[512];

	snprintf(want, sizeof(want), "%s:%d: %s", t->path, line, what);
	if (!strstr(errors, want))
		fail_msg("want \"%s\" in:\n%s", want, errors);
}

static void defaults(void **state)
{
	struct config c;
	struct server_config s;

	(void)state;
	config_init(&c);
	server_config_default(&s);
	assert_memory_equal(&c.server.limits, &s.limits, sizeof(s.limits));
	assert_memory_equal(&c.server.registry, &s.registry,
			    sizeof(s.registry));
	assert_int_equal(c.server.socket_mode, s.socket_mode);
	assert_null(c.server.socket_path);
	assert_int_equal(c.log_level, LOG_INFO);
	assert_int_equal(c.log_prefix, LOG_PREFIX_AUTO);
	assert_int_equal(c.log_rate, CONFIG_LOG_RATE_DEFAULT);
	config_deinit(&c);
}

static void every_key(void **state)
{
	struct config c;
	struct tmpfile t;
	char *errors;

	(void)state;
	config_init(&c);
	assert_int_equal(load(&c,
		"# a comment\n"
		"; another\n"
		"\n"
		"socket = /run/x/y.sock\n"
		"[dlshared]\n"
		"socket-mode = 0600\n"
		"default-mode=0640\n"
		"log-level = debug\n"
		"log-prefix = always\n"
		"log-rate-limit = 0\n"
		"max-packet = 64K\n"
		"max-fds = 32 ; inline comment\n"
		"max-inflight = 0x10\n"
		"max-connections = 7\n"
		"max-output = 1MiB\n"
		"list-page = 9\n"
		"max-tensors = 10\n"
		"max-buffers = 11\n"
		"max-leases = 12\n"
		"max-bytes = 3G\n"
		"max-buffer-bytes = 2T\n", &errors, &t), 0);
	assert_string_equal(errors, "");
	assert_string_equal(c.server.socket_path, "/run/x/y.sock");
	assert_int_equal(c.server.socket_mode, 0600);
	assert_int_equal(c.server.registry.default_mode, 0640);
	assert_int_equal(c.log_level, LOG_DEBUG);
	assert_int_equal(c.log_prefix, LOG_PREFIX_ALWAYS);
	assert_int_equal(c.log_rate, 0);
	assert_int_equal(c.server.limits.max_packet, 64 * 1024);
	assert_int_equal(c.server.limits.max_fds, 32);
	assert_int_equal(c.server.limits.max_inflight, 16);
	assert_int_equal(c.server.limits.max_connections, 7);
	assert_int_equal(c.server.limits.max_output, 1024 * 1024);
	assert_int_equal(c.server.limits.list_page, 9);
	assert_int_equal(c.server.registry.max_tensors, 10);
	assert_int_equal(c.server.registry.max_buffers, 11);
	assert_int_equal(c.server.registry.max_leases, 12);
	assert_true(c.server.registry.max_bytes == UINT64_C(3) << 30);
	assert_true(c.server.registry.max_buffer_bytes == UINT64_C(2) << 40);
	/* Where each value came from, for errors about two of them. */
	assert_int_equal(c.src[0], 4);
	assert_string_equal(c.file, t.path);
	assert_int_equal(config_validate(&c, NULL), 0);
	free(errors);
	tmp_remove(&t);
	config_deinit(&c);
}

static void unknown_key_names_line(void **state)
{
	struct config c;
	struct tmpfile t;
	char *errors;

	(void)state;
	config_init(&c);
	assert_int_equal(load(&c, "max-fds = 8\n\nmax-fd = 9\n", &errors, &t),
			 -EINVAL);
	assert_error_at(errors, &t, 3, "unknown key 'max-fd'");
	/* The good line still applied; the caller refuses to run anyway. */
	assert_int_equal(c.server.limits.max_fds, 8);
	free(errors);
	tmp_remove(&t);
	config_deinit(&c);
}

static void bad_values_name_line(void **state)
{
	static const struct {
		const char *line;
		const char *error;
	} cases[] = {
		{ "max-fds = 65", "max-fds: invalid value '65': expected an "
				  "integer from 1 to 64" },
		{ "max-fds = 0", "max-fds: invalid value '0'" },
		{ "max-fds = -1", "max-fds: invalid value '-1'" },
		{ "max-fds = 8x", "max-fds: invalid value '8x'" },
		{ "max-fds = 8K", "max-fds: invalid value '8K'" },
		{ "max-fds =", "max-fds: invalid value ''" },
		{ "max-packet = 1M", "max-packet: invalid value '1M': "
				     "expected a size from 4K to 200K" },
		{ "max-bytes = 99999999999T", "max-bytes: invalid value" },
		{ "max-bytes = 18446744073709551616", "max-bytes: invalid" },
		{ "max-output = 1Q", "max-output: invalid value '1Q'" },
		{ "socket-mode = 0999", "socket-mode: invalid value '0999'" },
		{ "socket-mode = 01777", "socket-mode: invalid value" },
		{ "default-mode = 0", "default-mode: invalid value '0': "
				      "expected octal permission bits "
				      "within 0666, not 0" },
		{ "default-mode = 0700", "default-mode: invalid value" },
		{ "log-level = loud", "log-level: invalid value 'loud': "
				      "expected error, warning, notice, "
				      "info or debug" },
		{ "log-prefix = sometimes", "log-prefix: invalid value" },
		/* BOARD_SLOTS_MAX: a name keeps its slot in 22 bits. */
		{ "board-slots = 4194304", "board-slots: invalid value "
					   "'4194304': expected an integer "
					   "from 0 to 4194303" },
		{ "socket = /tmp/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		  "aaaaaa", "socket: invalid value" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct config c;
		struct tmpfile t;
		char text[512], *errors;

		config_init(&c);
		snprintf(text, sizeof(text), "# line 1\n%s\n", cases[i].line);
		assert_int_equal(load(&c, text, &errors, &t), -EINVAL);
		assert_error_at(errors, &t, 2, cases[i].error);
		free(errors);
		tmp_remove(&t);
		config_deinit(&c);
	}
}

static void syntax_errors_name_lines(void **state)
{
	struct config c;
	struct tmpfile t;
	char *errors;
	char longline[400];

	(void)state;
	memset(longline, 'x', sizeof(longline));
	memcpy(longline, "socket = /", 10);
	longline[sizeof(longline) - 2] = '\n';
	longline[sizeof(longline) - 1] = 0;
	config_init(&c);
	{
		char text[1024];

		snprintf(text, sizeof(text),
			 "max-fds = 8\n"            /* 1 */
			 "this is not a setting\n"  /* 2 */
			 "[dlshared\n"              /* 3 */
			 "= 5\n"                    /* 4 */
			 "max-fds = 9\n"            /* 5 */
			 "max-leases = 7\n"         /* 6 */
			 "  max-tensors = 3\n"      /* 7 */
			 "[other]\n"                /* 8 */
			 "max-inflight = 3\n"       /* 9 */
			 "%s"                       /* 10 */
			 "[dlshared]\n"             /* 11 */
			 "list-page = 5\n",         /* 12 */
			 longline);
		assert_int_equal(load(&c, text, &errors, &t), -EINVAL);
	}
	assert_error_at(errors, &t, 2, "syntax error");
	assert_error_at(errors, &t, 3, "syntax error");
	assert_error_at(errors, &t, 4, "syntax error");
	assert_error_at(errors, &t, 5, "max-fds is already set on line 1");
	assert_error_at(errors, &t, 7, "an indented line continues "
			"'max-leases' from line 6");
	assert_error_at(errors, &t, 9, "unknown section [other]");
	assert_error_at(errors, &t, 10, "line too long");
	/* Line numbers stay right after a long line. */
	assert_int_equal(c.server.limits.list_page, 5);
	assert_int_equal(c.src[config_option_count() - 1], 0);
	free(errors);
	tmp_remove(&t);
	config_deinit(&c);
}

/* Runs config_from_args on a NULL-ended argument list. */
static int from_args(struct config *c, enum config_action *action,
		     char **errors, ...)
{
	char *argv[32];
	int argc = 0, r;
	struct errbuf e;
	va_list ap;

	argv[argc++] = "dlshared";
	va_start(ap, errors);
	while (argc < 31 && (argv[argc] = va_arg(ap, char *)) != NULL)
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	err_open(&e);
	r = config_from_args(c, argc, argv, e.f, e.f, action);
	*errors = err_close(&e);
	return r;
}

static void flags_override_file(void **state)
{
	struct config c;
	struct tmpfile t;
	enum config_action act;
	char *errors;

	(void)state;
	tmp_write(&t, "max-fds = 8\nmax-leases = 100\nlog-level = debug\n");
	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--config", t.path,
				   "--max-fds", "4", "-l", "error",
				   "--max-connections=9", "--max-buffers",
				   "2", NULL), 0);
	assert_string_equal(errors, "");
	assert_int_equal(act, CONFIG_RUN);
	assert_int_equal(c.server.limits.max_fds, 4);
	assert_int_equal(c.server.registry.max_leases, 100);
	assert_int_equal(c.log_level, LOG_ERR);
	assert_int_equal(c.server.limits.max_connections, 9);
	assert_int_equal(c.src[0], 0);
	free(errors);
	config_deinit(&c);

	/* Order on the command line does not matter: --config comes first. */
	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--max-fds", "20",
				   "-c", t.path, "--check-config", NULL), 0);
	assert_int_equal(act, CONFIG_CHECK);
	assert_int_equal(c.server.limits.max_fds, 20);
	free(errors);
	config_deinit(&c);
	tmp_remove(&t);
}

static void command_line_errors(void **state)
{
	struct config c;
	enum config_action act;
	char *errors;

	(void)state;
	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--config",
				   "/nonexistent/dlshared.conf", NULL),
			 -EINVAL);
	assert_non_null(strstr(errors, "/nonexistent/dlshared.conf: cannot "
				       "read: No such file or directory"));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--max-fds", "99",
				   "--check-config", NULL), -EINVAL);
	assert_int_equal(act, CONFIG_CHECK);
	assert_non_null(strstr(errors, "dlshared: --max-fds: invalid value "
				       "'99': expected an integer from 1 to "
				       "64"));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--bogus",
				   "--check-config", NULL), -EINVAL);
	assert_int_equal(act, CONFIG_CHECK);
	assert_non_null(strstr(errors, "unknown option '--bogus'"));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "--max-fds", NULL),
			 -EINVAL);
	assert_non_null(strstr(errors, "--max-fds needs a value"));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "stray", NULL), -EINVAL);
	assert_non_null(strstr(errors, "unexpected argument 'stray'"));
	free(errors);
	config_deinit(&c);
}

static void cross_check_names_sources(void **state)
{
	struct config c;
	struct tmpfile t;
	enum config_action act;
	char *errors, want[256];

	(void)state;
	tmp_write(&t, "\nmax-buffers = 20\n");
	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "-c", t.path, NULL),
			 -EINVAL);
	snprintf(want, sizeof(want), "max-buffers (20, from %s:2) must not "
		 "exceed max-fds (16, from the default)", t.path);
	assert_non_null(strstr(errors, want));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "-c", t.path,
				   "--max-fds", "8", NULL), -EINVAL);
	assert_non_null(strstr(errors, "max-fds (8, from --max-fds)"));
	free(errors);
	config_deinit(&c);

	config_init(&c);
	assert_int_equal(from_args(&c, &act, &errors, "-c", t.path,
				   "--max-fds", "20", NULL), 0);
	free(errors);
	config_deinit(&c);
	tmp_remove(&t);
}

/* --print-config writes a file that reads back to the same settings. */
static void print_reads_back(void **state)
{
	struct config a, b;
	struct tmpfile t;
	enum config_action act;
	char *errors, *text;
	size_t len;
	FILE *f;

	(void)state;
	config_init(&a);
	assert_int_equal(from_args(&a, &act, &errors, "--socket", "/tmp/s",
				   "--max-bytes", "12345", "--max-output",
				   "3M", "--log-prefix", "never",
				   "--default-mode", "0600", "--print-config",
				   NULL), 0);
	assert_int_equal(act, CONFIG_PRINT);
	free(errors);
	f = open_memstream(&text, &len);
	config_print(&a, f);
	fclose(f);
	config_init(&b);
	assert_int_equal(load(&b, text, &errors, &t), 0);
	assert_string_equal(errors, "");
	assert_memory_equal(&a.server.limits, &b.server.limits,
			    sizeof(a.server.limits));
	assert_memory_equal(&a.server.registry, &b.server.registry,
			    sizeof(a.server.registry));
	assert_string_equal(b.server.socket_path, "/tmp/s");
	assert_int_equal(b.log_prefix, LOG_PREFIX_NEVER);
	free(errors);
	free(text);
	tmp_remove(&t);
	config_deinit(&a);
	config_deinit(&b);
}

/* The help, the man page text and the example file come from the same
 * table: every option is in each, and the example file parses (with its
 * keys uncommented) to the defaults. */
static void texts_from_one_table(void **state)
{
	char *help, *flags, *man, *example, *p;
	size_t len;
	FILE *f;

	(void)state;
	assert_true(config_option_count() >= 17);
	assert_null(config_option_name(config_option_count()));
	f = open_memstream(&help, &len);
	config_usage(f);
	fclose(f);
	f = open_memstream(&flags, &len);
	config_print_man(f, 0);
	fclose(f);
	f = open_memstream(&man, &len);
	config_print_man(f, 1);
	fclose(f);
	f = open_memstream(&example, &len);
	config_print_example(f);
	fclose(f);
	for (int i = 0; i < config_option_count(); i++) {
		const char *key = config_option_name(i);
		char want[160], roffname[96];
		size_t n = 0;

		for (const char *k = key; *k && n < 90; k++) {
			if (*k == '-')
				roffname[n++] = '\\';
			roffname[n++] = *k;
		}
		roffname[n] = 0;
		snprintf(want, sizeof(want), "--%s ", key);
		assert_non_null(strstr(help, want));
		snprintf(want, sizeof(want), "\\fB\\-\\-%s\\fR", roffname);
		assert_non_null(strstr(flags, want));
		snprintf(want, sizeof(want), "\\fB%s\\fR = ", roffname);
		assert_non_null(strstr(man, want));
		snprintf(want, sizeof(want), "\n#%s =", key);
		assert_non_null(strstr(example, want));
	}
	assert_non_null(strstr(help, "--max-packet BYTES    size of one "
				     "packet (default: 128K)"));

	/* Uncomment every "#key = value" with a value and read it back. */
	for (p = example; (p = strstr(p, "\n#")) != NULL; p++)
		if (p[2] >= 'a' && p[2] <= 'z' && strstr(p, " = ") &&
		    strchr(p + 2, '\n') > strstr(p, " = ") + 3)
			memmove(p + 1, p + 2, strlen(p + 2) + 1);
	{
		struct config c, d;
		struct tmpfile t;
		char *errors;

		config_init(&c);
		config_init(&d);
		if (load(&c, example, &errors, &t) != 0)
			fail_msg("the example file does not read back:\n%s",
				 errors);
		assert_string_equal(errors, "");
		assert_memory_equal(&c.server.limits, &d.server.limits,
				    sizeof(d.server.limits));
		free(errors);
		tmp_remove(&t);
		config_deinit(&c);
		config_deinit(&d);
	}
	free(help);
	free(flags);
	free(man);
	free(example);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults),
		cmocka_unit_test(every_key),
		cmocka_unit_test(unknown_key_names_line),
		cmocka_unit_test(bad_values_name_line),
		cmocka_unit_test(syntax_errors_name_lines),
		cmocka_unit_test(flags_override_file),
		cmocka_unit_test(command_line_errors),
		cmocka_unit_test(cross_check_names_sources),
		cmocka_unit_test(print_reads_back),
		cmocka_unit_test(texts_from_one_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
