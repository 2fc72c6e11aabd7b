/* test_memcg — store memory is charged to the daemon, in a memory cgroup.
 *
 * The daemon runs in a memory cgroup (v1) of its own with a limit, and
 * the producers and a reader in another one. A store version's pages are
 * allocated by the daemon when it creates the buffer, so they are charged
 * to the daemon's group: a producer that wrote and sealed one, and was
 * killed, leaves nothing charged to its group; a reader that reads every
 * page is charged nothing for them; a create over the daemon's limit fails
 * with DLSHARE_ENOMEM and a message naming the bytes, before anyone wrote,
 * and the daemon goes on serving (a second producer publishes).
 *
 * The daemon's group has the OOM killer disabled (memory.oom_control), as
 * the unit's OOMScoreAdjust=-1000 does for a lone daemon: a charge over the
 * limit is then refused (ENOMEM) instead of killing the daemon.
 *
 * Needs root and a writable cgroup v1 memory hierarchy at
 * /sys/fs/cgroup/memory; skipped (77) otherwise, saying why.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../skip.h"
#include "util.h"

#define MEMCG_ROOT "/sys/fs/cgroup/memory"
#define MIB (UINT64_C(1) << 20)
/* The daemon's limit, one version, and a create far over the limit. */
#define DAEMON_LIMIT (160 * MIB)
#define VERSION_BYTES (32 * MIB)
#define TOO_BIG (512 * MIB)

static char group[128], dgroup[160], pgroup[160];

static int write_file(const char *dir, const char *file, const char *val)
{
	char path[256];
	FILE *f;
	int ok;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	f = fopen(path, "w");
	if (!f)
		return -errno;
	ok = fputs(val, f) >= 0;
	ok = (fclose(f) == 0) && ok;
	return ok ? 0 : -EIO;
}

static int64_t read_u64(const char *dir, const char *file)
{
	char path[256];
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%llu", &v) != 1)
		v = 0;
	fclose(f);
	return (int64_t)v;
}

static int join(const char *dir, pid_t pid)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%d", (int)pid);
	return write_file(dir, "cgroup.procs", buf);
}

/* Why the test cannot run here, or NULL once the groups are made. */
static const char *groups_make(void)
{
	char buf[32];

	if (geteuid() != 0)
		return "needs root to make memory cgroups";
	if (access(MEMCG_ROOT "/memory.usage_in_bytes", R_OK) != 0)
		return "no cgroup v1 memory hierarchy at " MEMCG_ROOT
		       " (cgroup v2 is not covered by this test)";
	snprintf(group, sizeof(group), MEMCG_ROOT "/dlshare-test-%d",
		 (int)getpid());
	snprintf(dgroup, sizeof(dgroup), "%s/daemon", group);
	snprintf(pgroup, sizeof(pgroup), "%s/peers", group);
	if (mkdir(group, 0755) < 0)
		return "cannot make a memory cgroup under " MEMCG_ROOT
		       " (read-only, or not delegated here)";
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)DAEMON_LIMIT);
	if (mkdir(dgroup, 0755) < 0 || mkdir(pgroup, 0755) < 0 ||
	    write_file(dgroup, "memory.limit_in_bytes", buf) ||
	    write_file(dgroup, "memory.oom_control", "1"))
		return "cannot set a memory cgroup's limit or oom_control";
	return NULL;
}

static void groups_remove(void)
{
	if (!*group)
		return;
	rmdir(dgroup);
	rmdir(pgroup);
	rmdir(group);
	*group = '\0';
}

/* A producer in the peers' group: creates name (bytes), writes every
 * page, seals, says so, and waits to be killed (or publishes and leaves,
 * with arg). */
static int producer(const struct daemon_proc *d, void *arg)
{
	const char *name = arg;
	int64_t shape[1] = { (int64_t)(VERSION_BYTES / 4) };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape };
	dlshare_client *c;
	dlshare_writer *w;
	DLTensor *t;

	CHILD_CHECK(join(pgroup, getpid()) == 0);
	c = util_child_connect(d);
	CHILD_OK(dlshare_create(c, name, &spec, 1, NULL, &w));
	t = dlshare_writer_tensor(w, 0);
	harness_fill(t->data, VERSION_BYTES, 5);
	CHILD_OK(dlshare_seal(w, NULL, NULL));
	CHILD_OK(util_post(c, "m/sealed", 1));
	for (;;)
		pause();
}

/* A reader in the peers' group: reads every page of m/a. */
static int reader(const struct daemon_proc *d, void *arg)
{
	int64_t shape[1] = { (int64_t)(VERSION_BYTES / 4) };
	dlshare_client *c;

	(void)arg;
	CHILD_CHECK(join(pgroup, getpid()) == 0);
	c = util_child_connect(d);
	CHILD_OK(util_get_check(c, "m/a", NULL, DT_F32, 1, shape, 5, NULL));
	dlshare_disconnect(c);
	return 0;
}

static struct daemon_proc d;

/* Also after a failed assert: no daemon, no group left behind. */
static int teardown(void **state)
{
	(void)state;
	if (d.pid > 0)
		harness_daemon_stop(&d);
	d.pid = 0;
	groups_remove();
	return 0;
}

static void charged_to_daemon(void **state)
{
	const char *why = groups_make();
	int64_t shape[1] = { (int64_t)(TOO_BIG / 4) };
	dlshare_tensor_spec big = { .dtype = DT_F32, .ndim = 1,
				    .shape = shape };
	int64_t base, peers0, after, peers;
	dlshare_writer *w = NULL;
	dlshare_client *c;
	char want[160];
	pid_t p;

	(void)state;
	if (why) {
		groups_remove();
		test_skip("%s", why);
		return;
	}
	assert_int_equal(harness_daemon_start(&d, NULL), 0);
	assert_int_equal(join(dgroup, d.pid), 0);
	c = harness_connect(&d);
	base = read_u64(dgroup, "memory.usage_in_bytes");
	peers0 = read_u64(pgroup, "memory.usage_in_bytes");

	/* A producer writes and seals 32 MiB, and is killed. */
	p = util_spawn(&d, producer, "m/a");
	assert_true(util_await(c, "m/sealed", 0, harness_ms(20000), NULL) > 0);
	util_kill(p);
	after = read_u64(dgroup, "memory.usage_in_bytes");
	peers = read_u64(pgroup, "memory.usage_in_bytes");
	print_message("daemon group %lld -> %lld bytes, peers' group %lld -> "
		      "%lld bytes\n", (long long)base, (long long)after,
		      (long long)peers0, (long long)peers);
	/* The version's pages are the daemon's (give or take what the
	 * daemon's own heap gave back meanwhile); the dead producer's group
	 * keeps less than half of them (its own memory went with it). */
	assert_true(after - base >= (int64_t)VERSION_BYTES * 7 / 8);
	assert_true(peers - peers0 < (int64_t)VERSION_BYTES / 2);

	/* A reader that reads every page is charged none of them. */
	assert_int_equal(util_wait(util_spawn(&d, reader, NULL)), 0);
	peers = read_u64(pgroup, "memory.usage_in_bytes");
	assert_true(peers - peers0 < (int64_t)VERSION_BYTES / 2);

	/* Over the daemon's limit: refused before anyone writes, and said
	 * so; the daemon goes on serving. */
	assert_int_equal(dlshare_create(c, "m/big", &big, 1, NULL, &w),
			 DLSHARE_ENOMEM);
	assert_null(w);
	snprintf(want, sizeof(want), "create m/big: the daemon could not "
		 "allocate the %llu bytes (512.0 MiB) of host memory",
		 (unsigned long long)TOO_BIG);
	print_message("%s\n", dlshare_last_error());
	assert_memory_equal(dlshare_last_error(), want, strlen(want));
	assert_int_equal(kill(d.pid, 0), 0);
	util_stats(c);

	/* A second producer still publishes. */
	p = util_spawn(&d, producer, "m/b");
	assert_true(util_await(c, "m/sealed", 1, harness_ms(20000), NULL) > 0);
	util_kill(p);
	assert_true(read_u64(dgroup, "memory.usage_in_bytes") - base >=
		    2 * (int64_t)VERSION_BYTES * 7 / 8);
	dlshare_disconnect(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
	d.pid = 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(charged_to_daemon, teardown),
	};

	return test_run_group("memcg", tests, NULL, NULL);
}
