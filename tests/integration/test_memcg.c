/* test_memcg — store memory is charged to the daemon, in a memory cgroup.
 *
 * The daemon runs in a memory cgroup of its own with a limit, and the
 * producers and a reader in another one. A store version's pages are
 * allocated by the daemon when it creates the buffer, so they are charged
 * to the daemon's group: a producer that wrote and sealed one, and was
 * killed, leaves nothing charged to its group; a reader that reads every
 * page is charged nothing for them; a create over the daemon's limit fails
 * with DLSHARE_ENOMEM and a message naming the bytes and the limit, before
 * anyone wrote, and the daemon goes on serving (a second producer
 * publishes).
 *
 * small_group: producers in a group whose limit is smaller than what they
 * publish (as a container's would be) publish past it until the daemon
 * refuses with DLSHARE_ENOMEM naming the daemon's limit; none is
 * OOM-killed; once the first is killed (its owned names go with it), a
 * second one in the same group publishes.
 *
 * cgroup v2 where its hierarchy (/sys/fs/cgroup) has the memory controller
 * (cgroup.controllers), else the v1 memory hierarchy (/sys/fs/cgroup/memory).
 * The daemon must not be its group's OOM victim, so that a charge over the
 * limit is refused (ENOMEM) instead: v1 disables the group's OOM killer
 * (memory.oom_control); v2 has no such switch, and the daemon gets
 * oom_score_adj -1000, as the unit's OOMScoreAdjust=-1000 does.
 *
 * Needs root and a writable memory cgroup hierarchy; skipped (77)
 * otherwise, saying which hierarchy was looked for and why it cannot be
 * used.
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

#define MIB (UINT64_C(1) << 20)
/* The daemon's limit, one version, and a create far over the limit. */
#define DAEMON_LIMIT (160 * MIB)
#define VERSION_BYTES (32 * MIB)
#define TOO_BIG (512 * MIB)
/* small_group: the peers' limit, and the versions they publish. */
#define PEERS_LIMIT (48 * MIB)
#define SMALL_BYTES (16 * MIB)

static int v2;                  /* which hierarchy */
static char root[64];           /* its mount point */
static char group[128], dgroup[160], pgroup[160];

#define USAGE (v2 ? "memory.current" : "memory.usage_in_bytes")
#define LIMIT (v2 ? "memory.max" : "memory.limit_in_bytes")

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

/* Whether dir's cgroup.controllers lists the memory controller. */
static int has_memory(const char *dir)
{
	char path[128], buf[512];
	FILE *f;
	int yes = 0;

	snprintf(path, sizeof(path), "%s/cgroup.controllers", dir);
	if (!(f = fopen(path, "r")))
		return 0;
	if (fgets(buf, sizeof(buf), f))
		for (char *t = strtok(buf, " \n"); t; t = strtok(NULL, " \n"))
			yes |= strcmp(t, "memory") == 0;
	fclose(f);
	return yes;
}

/* Whether dir's cgroup.subtree_control enables memory for its children. */
static int has_memory_enabled(const char *dir)
{
	char path[128], buf[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/cgroup.subtree_control", dir);
	if (!(f = fopen(path, "r")))
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	return strstr(buf, "memory") != NULL;
}

static int join(const char *dir, pid_t pid)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%d", (int)pid);
	return write_file(dir, "cgroup.procs", buf);
}

/* Why the test cannot run here, or NULL once the hierarchy is chosen. */
static const char *hierarchy_find(void)
{
	if (has_memory("/sys/fs/cgroup")) {
		v2 = 1;
		snprintf(root, sizeof(root), "/sys/fs/cgroup");
	} else if (access("/sys/fs/cgroup/memory/memory.usage_in_bytes",
			  R_OK) == 0) {
		v2 = 0;
		snprintf(root, sizeof(root), "/sys/fs/cgroup/memory");
	} else {
		return "no memory cgroup: neither cgroup v2 with the memory "
		       "controller (/sys/fs/cgroup/cgroup.controllers) nor a "
		       "cgroup v1 memory hierarchy (/sys/fs/cgroup/memory)";
	}
	if (geteuid() != 0)
		return v2 ? "needs root to make memory cgroups (cgroup v2)" :
			    "needs root to make memory cgroups (cgroup v1)";
	return NULL;
}

/* Why the test cannot run here, or NULL once the groups are made: the
 * daemon's with DAEMON_LIMIT, the peers' with peers_limit (0: none). */
static const char *groups_make(uint64_t peers_limit)
{
	const char *why = hierarchy_find();
	char buf[32];

	if (why)
		return why;
	snprintf(group, sizeof(group), "%s/dlshare-test-%d", root,
		 (int)getpid());
	snprintf(dgroup, sizeof(dgroup), "%s/daemon", group);
	snprintf(pgroup, sizeof(pgroup), "%s/peers", group);
	/* v2: the controller must be enabled for the children of each
	 * level (the root may have it on already). */
	if (v2 && !has_memory_enabled(root) &&
	    write_file(root, "cgroup.subtree_control", "+memory"))
		return "cannot enable the memory controller under "
		       "/sys/fs/cgroup (cgroup v2 cgroup.subtree_control)";
	if (mkdir(group, 0755) < 0)
		return v2 ? "cannot make a cgroup under /sys/fs/cgroup "
			    "(cgroup v2: read-only, or not delegated here)" :
			    "cannot make a memory cgroup under "
			    "/sys/fs/cgroup/memory (cgroup v1: read-only, or "
			    "not delegated here)";
	if (v2 && write_file(group, "cgroup.subtree_control", "+memory"))
		return "cannot enable the memory controller for a new "
		       "cgroup's children (cgroup v2 cgroup.subtree_control)";
	if (mkdir(dgroup, 0755) < 0 || mkdir(pgroup, 0755) < 0)
		return "cannot make the test's child cgroups";
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)DAEMON_LIMIT);
	if (write_file(dgroup, LIMIT, buf) ||
	    (!v2 && write_file(dgroup, "memory.oom_control", "1")))
		return v2 ? "cannot set a cgroup's memory.max (cgroup v2)" :
			    "cannot set a memory cgroup's limit or "
			    "oom_control (cgroup v1)";
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)peers_limit);
	if (peers_limit && write_file(pgroup, LIMIT, buf))
		return "cannot set the peers' cgroup's memory limit";
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

/* Puts the daemon in its group, where the kernel refuses a charge over the
 * limit instead of killing it. Returns 0 or -errno. */
static int daemon_join(pid_t pid)
{
	char path[64];
	FILE *f;
	int err = join(dgroup, pid);

	if (err || !v2)
		return err; /* v1: memory.oom_control */
	snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)pid);
	if (!(f = fopen(path, "w")))
		return -errno;
	err = fputs("-1000", f) >= 0 ? 0 : -EIO;
	return fclose(f) == 0 ? err : -EIO;
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
	const char *why = groups_make(0);
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
	assert_int_equal(daemon_join(d.pid), 0);
	c = harness_connect(&d);
	base = read_u64(dgroup, USAGE);
	peers0 = read_u64(pgroup, USAGE);

	/* A producer writes and seals 32 MiB, and is killed. */
	p = util_spawn(&d, producer, "m/a");
	assert_true(util_await(c, "m/sealed", 0, harness_ms(20000), NULL) > 0);
	util_kill(p);
	after = read_u64(dgroup, USAGE);
	peers = read_u64(pgroup, USAGE);
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
	peers = read_u64(pgroup, USAGE);
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
	assert_true(read_u64(dgroup, USAGE) - base >=
		    2 * (int64_t)VERSION_BYTES * 7 / 8);
	dlshare_disconnect(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
	d.pid = 0;
}

/* ---- producers in a group smaller than what they publish -------------------- */

/* Polls dir's usage until it is below below, up to a scaled 5 s. Returns
 * whether it got there. */
static int usage_drops(const char *dir, int64_t below)
{
	for (int waited = 0; waited < harness_ms(5000); waited += 5) {
		if (read_u64(dir, USAGE) < below)
			return 1;
		util_sleep_ms(5);
	}
	return read_u64(dir, USAGE) < below;
}

struct small_result {
	int count;          /* versions sealed */
	int err;            /* the create that failed */
	char msg[480];      /* and its message */
};

struct small_arg {
	int pipe_w;
	int want;           /* 0: until refused; else this many, then exit */
	const char *prefix;
};

/* A producer in the peers' group: creates owned names of SMALL_BYTES,
 * writes every page and seals, until a create fails (or want are made);
 * reports on the pipe, then waits to be killed (or exits). */
static int small_producer(const struct daemon_proc *dp, void *arg)
{
	struct small_arg *a = arg;
	int64_t shape[1] = { (int64_t)(SMALL_BYTES / 4) };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape };
	dlshare_create_opts o = { .device = { kDLCPU, 0 },
				  .flags = DLSHARE_NAME_OWNED };
	struct small_result r = { 0 };
	dlshare_client *c;

	CHILD_CHECK(join(pgroup, getpid()) == 0);
	c = util_child_connect(dp);
	for (;;) {
		char name[64];
		dlshare_writer *w;
		DLTensor *t;

		if (a->want && r.count == a->want)
			break;
		snprintf(name, sizeof(name), "%s%d", a->prefix, r.count);
		r.err = dlshare_create(c, name, &spec, 1, &o, &w);
		if (r.err) {
			snprintf(r.msg, sizeof(r.msg), "%s",
				 dlshare_last_error());
			break;
		}
		t = dlshare_writer_tensor(w, 0);
		harness_fill(t->data, SMALL_BYTES, r.count);
		CHILD_OK(dlshare_seal(w, NULL, NULL));
		r.count++;
	}
	CHILD_CHECK(write(a->pipe_w, &r, sizeof(r)) == sizeof(r));
	if (a->want) {
		dlshare_disconnect(c);
		return 0;
	}
	for (;;)
		pause();
}

static void small_group(void **state)
{
	const char *why = groups_make(PEERS_LIMIT);
	struct small_result r;
	struct small_arg a = { .prefix = "s/a" };
	dlshare_client *c;
	int64_t base, peers0;
	char want[96];
	int fds[2], st;
	pid_t p;

	(void)state;
	if (why) {
		groups_remove();
		test_skip("%s", why);
		return;
	}
	assert_int_equal(harness_daemon_start(&d, NULL), 0);
	assert_int_equal(daemon_join(d.pid), 0);
	c = harness_connect(&d);
	base = read_u64(dgroup, USAGE);
	peers0 = read_u64(pgroup, USAGE);
	assert_int_equal(pipe(fds), 0);
	a.pipe_w = fds[1];

	/* Publishes past its own group's limit (the versions are the
	 * daemon's), until the daemon's limit refuses: an error that names
	 * it, and no OOM kill. */
	p = util_spawn(&d, small_producer, &a);
	assert_int_equal(read(fds[0], &r, sizeof(r)), sizeof(r));
	print_message("%d versions of %llu MiB, then %d: %s\n", r.count,
		      (unsigned long long)(SMALL_BYTES / MIB), r.err, r.msg);
	assert_int_equal(util_exited(p, &st), 0);
	assert_true((uint64_t)r.count * SMALL_BYTES > PEERS_LIMIT);
	assert_int_equal(r.err, DLSHARE_ENOMEM);
	snprintf(want, sizeof(want), "memory cgroup's limit of %llu bytes",
		 (unsigned long long)DAEMON_LIMIT);
	assert_non_null(strstr(r.msg, want));
	assert_non_null(strstr(r.msg, v2 ? "memory.max" :
				      "memory.limit_in_bytes"));
	assert_true(read_u64(pgroup, USAGE) - peers0 <
		    (int64_t)PEERS_LIMIT / 2);

	/* Killed: its owned names go, and their memory with them. */
	util_kill(p);
	struct util_want none = UTIL_ANY;
	none.connections = 1;
	none.names = 0;
	none.buffers = 0;
	util_assert_want(c, &none);

	/* A second producer in the same group publishes as much, at once:
	 * the dead one's pages are freed by the daemon's thread pool
	 * (daemon/closer.c) a few ms after its names went, and a create the
	 * memory still held refuses is made again after those frees. */
	a.prefix = "s/b";
	a.want = r.count;
	p = util_spawn(&d, small_producer, &a);
	assert_int_equal(read(fds[0], &r, sizeof(r)), sizeof(r));
	assert_int_equal(util_wait(p), 0);
	assert_int_equal(r.err, 0);
	assert_int_equal(r.count, a.want);
	close(fds[0]);
	close(fds[1]);
	util_assert_want(c, &none);
	/* Both producers' memory went with their names. */
	assert_true(usage_drops(dgroup, base + (int64_t)SMALL_BYTES));

	/* Room for one large version only, deleted and made again at
	 * once: the new one's pages are asked for while the old one's may
	 * still be being freed on the pool. Every create must succeed. This
	 * does not show the daemon's retry of such a create (gpu_job_done)
	 * at work: the kernel frees pages faster than it zeroes new ones,
	 * so one free stays ahead of one create's charges (it passed with
	 * the retry off, also at 1 GiB in a 1.25 GiB group). The retry is
	 * for several creates charging at once on a larger machine. */
	for (int i = 0; i < 4; i++) {
		const int64_t shape[] = { (int64_t)(DAEMON_LIMIT * 5 / 8 / 4) };
		dlshare_tensor_spec spec = { .dtype = { kDLFloat, 32, 1 },
					     .ndim = 1, .shape = shape };
		dlshare_writer *w;

		assert_int_equal(dlshare_create(c, "s/room", &spec, 1, NULL,
						&w), 0);
		assert_int_equal(dlshare_seal(w, NULL, NULL), 0);
		assert_int_equal(dlshare_delete(c, "s/room"), 0);
	}
	util_assert_want(c, &none);
	dlshare_disconnect(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
	d.pid = 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(charged_to_daemon, teardown),
		cmocka_unit_test_teardown(small_group, teardown),
	};

	return test_run_group("memcg", tests, NULL, NULL);
}
