/* test_cli — dlsharectl against a real daemon: put from a file, a FIFO or
 * stdin and cat back the exact bytes (also of a version an API producer
 * published, and of an older version by number), put with the wrong byte
 * count publishes nothing, stats --json is one JSON object of integer
 * counters, ls / stat / rm, and the exit codes of failures. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "util.h"

#ifndef DLSHARECTL_PATH
#error "DLSHARECTL_PATH must name the dlsharectl binary"
#endif

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* Paths of files in the daemon's directory (removed with it). */
struct paths {
	char in[128], out[128], err[128], fifo[128];
};

static void paths_init(struct paths *p, const struct daemon_proc *d)
{
	snprintf(p->in, sizeof(p->in), "%s/in", d->dir);
	snprintf(p->out, sizeof(p->out), "%s/out", d->dir);
	snprintf(p->err, sizeof(p->err), "%s/err", d->dir);
	snprintf(p->fifo, sizeof(p->fifo), "%s/fifo", d->dir);
}

static void write_file(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

/* Runs dlsharectl -s SOCK args... with stdin from in (NULL: /dev/null),
 * stdout and stderr into p->out and p->err. Returns its exit status. */
static int ctl(const struct daemon_proc *d, const struct paths *p,
	       const char *in, ...)
{
	const char *argv[32] = { DLSHARECTL_PATH, "-s", d->sock };
	int argc = 3;
	va_list ap;

	va_start(ap, in);
	while (argc < 31 && (argv[argc] = va_arg(ap, const char *)))
		argc++;
	va_end(ap);
	argv[argc] = NULL;
	return util_run(argv, in, p->out, p->err);
}

#define CTL(...) ctl(&fx->d, &p, __VA_ARGS__, (const char *)NULL)

/* Fails unless file path holds exactly n bytes equal to data. */
static void assert_file(const char *path, const void *data, size_t n)
{
	size_t len;
	char *got = util_slurp(path, &len);

	assert_non_null(got);
	assert_int_equal(len, n);
	assert_memory_equal(got, data, n);
	free(got);
}

static size_t file_size(const char *path)
{
	size_t len = 0;
	char *got = util_slurp(path, &len);

	free(got);
	return got ? len : (size_t)-1;
}

/* ---- put and cat ---------------------------------------------------------------- */

static const int64_t shape[2] = { 3, 1000 };
#define NBYTES (3 * 1000 * 4)

static int api_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_store(c, "cli/api", DT_F32, 2, shape, 55, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void put_then_cat(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	uint8_t *one = malloc(NBYTES), *two = malloc(NBYTES);
	char *out;

	paths_init(&p, &fx->d);
	harness_fill(one, NBYTES, 1);
	harness_fill(two, NBYTES, 2);

	/* From a file... */
	write_file(p.in, one, NBYTES);
	assert_int_equal(CTL(NULL, "put", "cli/t", p.in, "--dtype", "float32",
			     "--shape", "3,1000"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(out);
	assert_non_null(strstr(out, "cli/t version 1"));
	free(out);
	/* ...and from stdin, a second version. */
	write_file(p.in, two, NBYTES);
	assert_int_equal(CTL(p.in, "put", "cli/t", "--dtype", "float32",
			     "--shape", "3,1000"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "cli/t version 2"));
	free(out);

	/* cat writes the raw bytes: the newest, or a version by number. */
	assert_int_equal(CTL(NULL, "cat", "cli/t"), 0);
	assert_file(p.out, two, NBYTES);
	assert_int_equal(CTL(NULL, "cat", "cli/t", "--version", "2"), 0);
	assert_file(p.out, two, NBYTES);
	/* Version 1 is gone (nobody held it): a clear failure. */
	assert_int_equal(CTL(NULL, "cat", "cli/t", "--version", "1"), 1);
	assert_int_equal(file_size(p.out), 0);
	assert_true(file_size(p.err) > 0);
	assert_int_equal(CTL(NULL, "cat", "cli/t", "--version", "3"), 1);
	assert_true(file_size(p.err) > 0);

	/* A version published through the API reads the same. */
	assert_int_equal(util_wait(util_spawn(&fx->d, api_producer, NULL)), 0);
	assert_int_equal(CTL(NULL, "cat", "cli/api"), 0);
	harness_fill(one, NBYTES, 55);
	assert_file(p.out, one, NBYTES);

	/* A 0-d scalar round trip. */
	int64_t scalar = 0x0123456789abcdefLL;
	write_file(p.in, &scalar, sizeof(scalar));
	assert_int_equal(CTL(NULL, "put", "cli/s", p.in, "--dtype", "int64",
			     "--shape", "scalar"), 0);
	assert_int_equal(CTL(NULL, "cat", "cli/s"), 0);
	assert_file(p.out, &scalar, sizeof(scalar));
	free(one);
	free(two);
}

/* A version held by a lease while put makes newer ones stays readable by
 * number. */
static int holder(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_OK(dlshare_get(c, "cli/h", NULL, &b));
	CHILD_CHECK(dlshare_bundle_version(b) == 1);
	CHILD_OK(util_post(c, "cli/h.held", 1));
	CHILD_CHECK(util_await(c, "cli/h.done", 0, harness_ms(20000), NULL) > 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void cat_old_version(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	uint8_t one[NBYTES], two[NBYTES];
	dlshare_client *c = harness_connect(&fx->d);
	pid_t h;

	paths_init(&p, &fx->d);
	harness_fill(one, NBYTES, 11);
	harness_fill(two, NBYTES, 12);
	write_file(p.in, one, NBYTES);
	assert_int_equal(CTL(NULL, "put", "cli/h", p.in, "--dtype", "uint8",
			     "--shape", "12000"), 0);
	h = util_spawn(&fx->d, holder, NULL);
	assert_true(util_await(c, "cli/h.held", 0, harness_ms(20000), NULL) > 0);
	write_file(p.in, two, NBYTES);
	assert_int_equal(CTL(NULL, "put", "cli/h", p.in, "--dtype", "uint8",
			     "--shape", "12000"), 0);
	assert_int_equal(CTL(NULL, "cat", "--version", "1", "cli/h"), 0);
	assert_file(p.out, one, NBYTES);
	assert_int_equal(CTL(NULL, "cat", "cli/h"), 0);
	assert_file(p.out, two, NBYTES);
	assert_int_equal(CTL(NULL, "cat", "cli/h", "--newer-than", "1"), 0);
	assert_file(p.out, two, NBYTES);
	assert_int_equal(util_post(c, "cli/h.done", 1), 0);
	assert_int_equal(util_wait(h), 0);
	dlshare_disconnect(c);
}

/* ---- put with the wrong byte count ---------------------------------------------------- */

/* Writes n bytes into the FIFO (for put to read), then ends. */
static int fifo_writer(const struct daemon_proc *d, void *arg)
{
	const char *fifo = ((const char **)arg)[0];
	size_t n = (size_t)(uintptr_t)((const char **)arg)[1];
	uint8_t *buf = calloc(1, n + 1);
	int fd = open(fifo, O_WRONLY | O_CLOEXEC);
	size_t done = 0;

	CHILD_CHECK(fd >= 0 && buf);
	while (done < n) {
		ssize_t w = write(fd, buf + done, n - done);

		if (w < 0 && errno == EPIPE)
			break; /* put stopped reading: fine */
		CHILD_CHECK(w > 0);
		done += (size_t)w;
	}
	close(fd);
	free(buf);
	return 0;
}

static void put_wrong_size(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want nothing = UTIL_ANY;
	dlshare_name_info info;
	uint8_t *data = calloc(1, NBYTES + 1);
	const char *arg[2];

	paths_init(&p, &fx->d);
	/* A file one byte short, one byte long; stdin too. */
	write_file(p.in, data, NBYTES - 1);
	assert_int_equal(CTL(NULL, "put", "cli/w", p.in, "--dtype", "float32",
			     "--shape", "3,1000"), 1);
	assert_true(file_size(p.err) > 0);
	write_file(p.in, data, NBYTES + 1);
	assert_int_equal(CTL(NULL, "put", "cli/w", p.in, "--dtype", "float32",
			     "--shape", "3,1000"), 1);
	assert_int_equal(CTL(p.in, "put", "cli/w", "--dtype", "float32",
			     "--shape", "3,1000"), 1);
	/* From a FIFO the size shows only while reading, after the version
	 * was created: it must be dropped, not published. */
	assert_int_equal(mkfifo(p.fifo, 0600), 0);
	for (int extra = -1; extra <= 1; extra += 2) {
		pid_t w;

		arg[0] = p.fifo;
		arg[1] = (const char *)(uintptr_t)(NBYTES + extra);
		w = util_spawn(&fx->d, fifo_writer, arg);
		assert_int_equal(CTL(NULL, "put", "cli/w", p.fifo, "--dtype",
				     "float32", "--shape", "3,1000"), 1);
		assert_true(file_size(p.err) > 0);
		assert_int_equal(util_wait(w), 0);
	}
	assert_int_equal(dlshare_stat(c, "cli/w", &info, NULL), DLSHARE_ENOENT);
	nothing.connections = 1;
	nothing.names = 0;
	nothing.versions = 0;
	nothing.buffers = 0;
	nothing.bytes = 0;
	util_assert_want(c, &nothing);
	/* Usage errors exit 2. */
	assert_int_equal(CTL(NULL, "put", "cli/w", p.in, "--shape", "3"), 2);
	assert_int_equal(CTL(NULL, "put", "cli/w", p.in, "--dtype", "float99",
			     "--shape", "3"), 2);
	free(data);
	dlshare_disconnect(c);
}

/* ---- stats --json ----------------------------------------------------------------------- */

/* The integer value of "key": in a JSON object, or -1. */
static long long json_int(const char *json, const char *key)
{
	char pat[64];
	const char *s;
	char *end;
	long long v;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	s = strstr(json, pat);
	if (!s)
		return -1;
	s += strlen(pat);
	while (*s == ' ')
		s++;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	while (*end == ' ')
		end++;
	if (errno || (*end != ',' && *end != '}'))
		return -1;
	return v;
}

static void stats_json(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	dlshare_client *c = harness_connect(&fx->d);
	static const char *const keys[] = {
		"connections", "names", "versions", "leases", "buffers", "bytes",
	};
	size_t len;
	char *out;
	dlshare_bundle *b;

	paths_init(&p, &fx->d);
	assert_int_equal(util_store(c, "cli/j1", DT_F32, 2, shape, 1, NULL), 0);
	assert_int_equal(util_store(c, "cli/j2", DT_F32, 2, shape, 2, NULL), 0);
	assert_int_equal(dlshare_get(c, "cli/j1", NULL, &b), 0);

	for (int where = 0; where < 2; where++) {
		if (where == 0)
			assert_int_equal(CTL(NULL, "stats", "--json"), 0);
		else
			assert_int_equal(CTL(NULL, "--json", "stats"), 0);
		out = util_slurp(p.out, &len);
		assert_non_null(out);
		/* One object, one line. */
		assert_true(len >= 2);
		assert_int_equal(out[0], '{');
		while (len && (out[len - 1] == '\n' || out[len - 1] == ' '))
			out[--len] = '\0';
		assert_int_equal(out[len - 1], '}');
		assert_null(strchr(out, '\n'));
		/* Flat, but for the per-uid rows (1.4) at its end. */
		{
			char *u = strstr(out, ",\"uids\":[");
			char *o = strchr(out + 1, '{');

			assert_non_null(u);
			assert_true(!o || o > u);
		}
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			if (json_int(out, keys[i]) < 0)
				fail_msg("no integer \"%s\" in %s", keys[i], out);
		/* The tool's own connection counts too. */
		assert_int_equal(json_int(out, "connections"), 2);
		assert_int_equal(json_int(out, "names"), 2);
		assert_int_equal(json_int(out, "versions"), 2);
		assert_int_equal(json_int(out, "leases"), 1);
		assert_int_equal(json_int(out, "buffers"), 2);
		assert_int_equal(json_int(out, "bytes"), 2 * NBYTES);
		free(out);
	}
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
}

/* ---- ls, stat, rm ------------------------------------------------------------------------- */

static int ls_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	CHILD_OK(util_store(c, "cli/a", DT_F32, 2, shape, 1, NULL));
	CHILD_OK(util_store(c, "cli/b/x", DT_I64, 0, shape, 2, NULL));
	CHILD_OK(util_store(c, "other", DT_U8, 2, shape, 3, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void ls_stat_rm(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	dlshare_client *c;
	dlshare_name_info info;
	char *out;

	paths_init(&p, &fx->d);
	assert_int_equal(util_wait(util_spawn(&fx->d, ls_producer, NULL)), 0);

	assert_int_equal(CTL(NULL, "ls"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "cli/a"));
	assert_non_null(strstr(out, "cli/b/x"));
	assert_non_null(strstr(out, "other"));
	assert_true(strstr(out, "cli/a") < strstr(out, "cli/b/x"));
	assert_true(strstr(out, "cli/b/x") < strstr(out, "other"));
	free(out);
	assert_int_equal(CTL(NULL, "ls", "cli/"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "cli/a"));
	assert_non_null(strstr(out, "cli/b/x"));
	assert_null(strstr(out, "other"));
	free(out);
	assert_int_equal(CTL(NULL, "ls", "--json", "cli/b"), 0);
	out = util_slurp(p.out, NULL);
	assert_int_equal(out[0], '[');
	assert_non_null(strstr(out, "\"cli/b/x\""));
	assert_null(strstr(out, "\"cli/a\""));
	free(out);

	assert_int_equal(CTL(NULL, "stat", "cli/a"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "cli/a"));
	assert_non_null(strstr(out, "float32"));
	assert_non_null(strstr(out, "3, 1000"));
	free(out);
	assert_int_equal(CTL(NULL, "stat", "--json", "cli/b/x"), 0);
	out = util_slurp(p.out, NULL);
	assert_int_equal(out[0], '{');
	assert_non_null(strstr(out, "\"int64\""));
	assert_int_equal(json_int(out, "latest"), 1);
	free(out);
	assert_int_equal(CTL(NULL, "stat", "cli/none"), 1);
	assert_true(file_size(p.err) > 0);

	assert_int_equal(CTL(NULL, "rm", "cli/a"), 0);
	c = harness_connect(&fx->d);
	assert_int_equal(dlshare_stat(c, "cli/a", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(dlshare_stat(c, "other", &info, NULL), 0);
	assert_int_equal(CTL(NULL, "rm", "cli/a"), 1);
	assert_true(file_size(p.err) > 0);
	assert_int_equal(CTL(NULL, "ls", "cli/"), 0);
	out = util_slurp(p.out, NULL);
	assert_null(strstr(out, "cli/a"));
	assert_non_null(strstr(out, "cli/b/x"));
	free(out);
	/* "cli/" is a prefix, not a name: rm says so and names --prefix. */
	assert_int_equal(CTL(NULL, "rm", "cli/"), 2);
	out = util_slurp(p.err, NULL);
	assert_non_null(strstr(out, "not a name"));
	assert_non_null(strstr(out, "rm --prefix cli/"));
	free(out);
	assert_int_equal(CTL(NULL, "rm", "--prefix", "cli/"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "deleted 1 name(s) under cli/"));
	free(out);
	assert_int_equal(dlshare_stat(c, "cli/b/x", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(dlshare_stat(c, "other", &info, NULL), 0);
	assert_int_equal(CTL(NULL, "--json", "rm", "--prefix", "cli/"), 0);
	out = util_slurp(p.out, NULL);
	assert_int_equal(json_int(out, "deleted"), 0);
	free(out);
	dlshare_disconnect(c);
}

/* ---- failures ------------------------------------------------------------------------------ */

static void cat_failures(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	const char *argv[] = { DLSHARECTL_PATH, "-s", NULL, "stats", NULL };
	char nobody[128];

	paths_init(&p, &fx->d);
	assert_int_equal(CTL(NULL, "cat", "cli/missing"), 1);
	assert_int_equal(file_size(p.out), 0);
	assert_true(file_size(p.err) > 0);
	assert_int_equal(CTL(NULL, "cat", "bad//name"), 1);
	assert_true(file_size(p.err) > 0);
	/* Waiting for a version that never comes. */
	assert_int_equal(CTL(NULL, "cat", "cli/missing", "--wait", "50"), 1);
	assert_true(file_size(p.err) > 0);
	/* Usage: no name, an unknown command, an unknown option. */
	assert_int_equal(CTL(NULL, "cat"), 2);
	assert_int_equal(CTL(NULL, "frobnicate"), 2);
	assert_int_equal(CTL(NULL, "ls", "--bogus"), 2);
	/* Nobody at the socket. */
	snprintf(nobody, sizeof(nobody), "%s/nobody.sock", fx->d.dir);
	argv[2] = nobody;
	assert_int_equal(util_run(argv, NULL, p.out, p.err), 1);
	assert_true(file_size(p.err) > 0);
}

/* ---- queue names -------------------------------------------------------------- */

static void queue_put_take(void **state)
{
	struct fixture *fx = *state;
	struct paths p;
	uint8_t *one = malloc(NBYTES), *two = malloc(NBYTES);
	char *out;

	paths_init(&p, &fx->d);
	harness_fill(one, NBYTES, 1);
	harness_fill(two, NBYTES, 2);
	write_file(p.in, one, NBYTES);
	assert_int_equal(CTL(p.in, "put", "cli/q", "--dtype", "float32",
			     "--shape", "3,1000", "--queue", "2"), 0);
	write_file(p.in, two, NBYTES);
	assert_int_equal(CTL(p.in, "put", "cli/q", "--dtype", "float32",
			     "--shape", "3,1000", "--queue", "0"), 0);
	/* Full: refused, naming the queue's depth; a wait that runs out. */
	assert_int_equal(CTL(p.in, "put", "cli/q", "--dtype", "float32",
			     "--shape", "3,1000", "--queue", "2"), 1);
	out = util_slurp(p.err, NULL);
	assert_non_null(strstr(out, "depth 2"));
	free(out);
	assert_int_equal(CTL(p.in, "put", "cli/q", "--dtype", "float32",
			     "--shape", "3,1000", "--queue", "2", "--wait",
			     "20"), 1);
	out = util_slurp(p.err, NULL);
	assert_non_null(strstr(out, "20 ms"));
	free(out);
	/* ls and stat show how full it is. */
	assert_int_equal(CTL(NULL, "ls", "cli/"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "QUEUE"));
	assert_non_null(strstr(out, "2/2"));
	free(out);
	assert_int_equal(CTL(NULL, "stat", "cli/q"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "queue     depth 2: 2 queued"));
	free(out);
	assert_int_equal(CTL(NULL, "--json", "stat", "cli/q"), 0);
	out = util_slurp(p.out, NULL);
	assert_non_null(strstr(out, "\"queue\":{\"depth\":2,\"queued\":2"));
	free(out);
	/* cat refuses a queue name; take consumes, oldest first. */
	assert_int_equal(CTL(NULL, "cat", "cli/q"), 1);
	assert_int_equal(CTL(NULL, "take", "cli/q"), 0);
	assert_file(p.out, one, NBYTES);
	assert_int_equal(CTL(NULL, "take", "cli/q", "--wait", "1000"), 0);
	assert_file(p.out, two, NBYTES);
	assert_int_equal(CTL(NULL, "take", "cli/q"), 1);
	assert_int_equal(CTL(NULL, "take", "cli/q", "--wait", "20"), 1);
	/* Usage: --wait on put needs --queue. */
	assert_int_equal(CTL(p.in, "put", "cli/q", "--dtype", "float32",
			     "--shape", "3,1000", "--wait", "20"), 2);
	assert_int_equal(CTL(NULL, "take"), 2);
	assert_int_equal(CTL(NULL, "rm", "cli/q"), 0);
	free(one);
	free(two);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(put_then_cat, setup, teardown),
		cmocka_unit_test_setup_teardown(cat_old_version, setup, teardown),
		cmocka_unit_test_setup_teardown(put_wrong_size, setup, teardown),
		cmocka_unit_test_setup_teardown(stats_json, setup, teardown),
		cmocka_unit_test_setup_teardown(ls_stat_rm, setup, teardown),
		cmocka_unit_test_setup_teardown(cat_failures, setup, teardown),
		cmocka_unit_test_setup_teardown(queue_put_take, setup, teardown),
	};

	return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
