/* test_lifetimes — names that go by themselves (protocol 1.4): owned names
 * go with their connection, cleanly closed or killed; TTL names go when no
 * version was sealed for that long; delete by prefix, its ACL and its
 * batches; per-uid stats; and producers killed at random, after which the
 * daemon is back at its baseline while a reader's lease still reads.
 *
 * No timed assertion: every wait polls a condition (the daemon's stats)
 * up to a scaled, generous timeout.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

static const int64_t shape16[] = { 16 };

/* Under a wrapper (valgrind) everything is ~30x slower: fewer names. */
static int scaled(int n)
{
	const char *w = getenv("DLSHARE_TEST_WRAPPER");

	return w && *w ? (n / 10 > 0 ? n / 10 : 1) : n;
}

/* Store mode with a lifetime: create, fill with seed, seal. */
static int store_life(dlshare_client *c, const char *name, uint32_t flags,
		      uint32_t ttl_ms, uint32_t seed, uint64_t *version)
{
	dlshare_tensor_spec spec = {
		.dtype = DT_F32, .ndim = 1, .shape = shape16,
	};
	dlshare_create_opts o = {
		.device = { kDLCPU, 0 }, .flags = flags, .ttl_ms = ttl_ms,
	};
	dlshare_writer *w;
	DLTensor *t;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, &o, &w)))
		return err;
	t = dlshare_writer_tensor(w, 0);
	harness_fill(t->data, util_nbytes(DT_F32, 1, shape16), seed);
	return dlshare_seal(w, NULL, version);
}

/* Export mode (producer memory, no copy) with a lifetime. */
static int export_life(dlshare_client *c, const char *name, uint32_t flags,
		       uint32_t ttl_ms, uint32_t seed)
{
	dlshare_publish_opts o = {
		.flags = DLSHARE_PUBLISH_NO_COPY | flags, .ttl_ms = ttl_ms,
	};
	DLManagedTensor *t;
	int err;

	if ((err = dlshare_host_alloc(DT_F32, 1, shape16, &t)))
		return err;
	harness_fill(t->dl_tensor.data, util_nbytes(DT_F32, 1, shape16), seed);
	if ((err = dlshare_publish(c, name, &t, 1, &o, NULL)))
		t->deleter(t);
	return err;
}

static void want_empty(dlshare_client *c)
{
	struct util_want w = UTIL_ANY;

	w.names = 0;
	w.versions = 0;
	w.leases = 0;
	w.buffers = 0;
	w.bytes = 0;
	util_assert_want(c, &w);
}

static void want_names(dlshare_client *c, int64_t names)
{
	struct util_want w = UTIL_ANY;

	w.names = names;
	util_assert_want(c, &w);
}

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

/* The default TTL: long enough for a create, seal, stat and get of the
 * name to come first, also under valgrind. */
static int default_ttl;

static int setup_ttl(void **state)
{
	static char ttl_s[16];
	static const char *const args[] = {
		"--max-ttl", "60000", "--default-ttl", ttl_s, NULL,
	};

	default_ttl = harness_ms(300);
	snprintf(ttl_s, sizeof(ttl_s), "%d", default_ttl);
	return util_setup_fdcheck(state, args);
}

/* Names rm_prefix makes: 10^4, where the daemon may hold 2 fds for each
 * (a host buffer's memfd and its read-only reopen are charged at once). */
static int many_names;

static int setup_many(void **state)
{
	static char room_s[24];
	static const char *args[] = {
		"--max-connections", "64", "--max-open-fds", room_s,
		"--uid-open-fds", room_s, NULL,
	};
	struct rlimit rl;
	rlim_t want = 32768, room;

	/* Root may raise the hard limit (with CAP_SYS_RESOURCE); the daemon
	 * raises its soft limit to the hard one it inherits. */
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -1;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
		struct rlimit up = { rl.rlim_cur, want };

		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			rl = up;
	}
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20))
		rl.rlim_max = 1u << 20;
	/* What max-open-fds would be by default, for one uid alone. */
	room = rl.rlim_max - 128 - 64;
	snprintf(room_s, sizeof(room_s), "%llu", (unsigned long long)room);
	many_names = scaled(10000);
	if ((rlim_t)many_names > (room - 64) / 2) {
		many_names = (int)((room - 64) / 2);
		print_message("rm_prefix: %d names (RLIMIT_NOFILE %llu)\n",
			      many_names, (unsigned long long)rl.rlim_max);
	}
	return util_setup_fdcheck(state, args);
}

static int setup_open(void **state)
{
	return util_setup_open(state, NULL);
}

/* ---- owned names ------------------------------------------------------------- */

/* Owned on a clean close; another connection of the same uid is refused
 * unless it takes the name over, and then the name goes with it. */
static void owned_clean_close(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *a = harness_connect(&fx->d);
	dlshare_client *b = harness_connect(&fx->d);
	dlshare_client *obs = harness_connect(&fx->d);
	dlshare_name_info info;

	assert_int_equal(store_life(a, "own/a", DLSHARE_NAME_OWNED, 0, 1, NULL), 0);
	assert_int_equal(export_life(a, "own/x", DLSHARE_NAME_OWNED, 0, 2), 0);
	assert_int_equal(store_life(a, "own/plain", 0, 0, 3, NULL), 0);
	assert_int_equal(dlshare_stat(obs, "own/a", &info, NULL), 0);
	assert_true(info.owned);
	assert_int_equal(info.owner_pid, (uint32_t)getpid());
	assert_int_equal(info.ttl_ms, 0);

	/* Not the owner's connection, not asking to own it: refused, and
	 * the error says whose it is. */
	assert_int_equal(store_life(b, "own/a", 0, 0, 4, NULL), DLSHARE_EPERM);
	assert_non_null(strstr(dlshare_last_error(), "owned by"));
	/* Asking to own it takes it over: it now goes with b. */
	assert_int_equal(store_life(b, "own/a", DLSHARE_NAME_OWNED, 0, 5, NULL), 0);

	dlshare_disconnect(a);
	/* own/x went with a; own/a is b's now; own/plain stays. */
	want_names(obs, 2);
	assert_int_equal(dlshare_stat(obs, "own/x", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(util_get_check(obs, "own/a", NULL, DT_F32, 1, shape16,
					5, NULL), 0);
	dlshare_disconnect(b);
	want_names(obs, 1);
	assert_int_equal(dlshare_stat(obs, "own/a", &info, NULL), DLSHARE_ENOENT);
	assert_int_equal(dlshare_delete(obs, "own/plain"), 0);
	want_empty(obs);
	assert_true(util_stats(obs).orphaned >= 2);
	dlshare_disconnect(obs);
}

/* A producer that publishes owned names and waits to be killed. */
static int owned_producer(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);

	(void)arg;
	CHILD_OK(store_life(c, "kill/store", DLSHARE_NAME_OWNED, 0, 11, NULL));
	CHILD_OK(export_life(c, "kill/export", DLSHARE_NAME_OWNED, 0, 12));
	CHILD_OK(util_post(c, "kill/ready", 1));
	for (;;)
		pause();
}

/* Owned names go when their producer is SIGKILLed; a lease taken before
 * keeps reading both (store and producer memory) bit-exact. */
static void owned_killed(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_bundle *bs, *be;
	struct util_want w = UTIL_ANY;
	pid_t p;

	p = util_spawn(&fx->d, owned_producer, NULL);
	assert_true(util_await(c, "kill/ready", 0, harness_ms(5000), NULL) > 0);
	assert_int_equal(dlshare_get(c, "kill/store", NULL, &bs), 0);
	assert_int_equal(dlshare_get(c, "kill/export", NULL, &be), 0);
	util_kill(p);
	/* kill/ready stays (not owned); the owned two are gone... */
	want_names(c, 1);
	assert_int_equal(dlshare_get(c, "kill/store", NULL, &(dlshare_bundle *){ NULL }),
			 DLSHARE_ENOENT);
	/* ...but what the leases hold is still there, unchanged. */
	w.names = 1;
	w.leases = 2;
	w.versions = 3;
	util_assert_want(c, &w);
	assert_int_equal(util_check(dlshare_bundle_tensor(bs, 0), DT_F32, 1,
				    shape16, 11), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(be, 0), DT_F32, 1,
				    shape16, 12), 0);
	dlshare_bundle_free(bs);
	dlshare_bundle_free(be);
	assert_int_equal(dlshare_delete(c, "kill/ready"), 0);
	want_empty(c);
	dlshare_disconnect(c);
}

/* ---- TTL ------------------------------------------------------------------------ */

/* Names expire on their own, on one timer; a lease outlives the name; the
 * daemon's default TTL applies to names that ask for none; a TTL past
 * max-ttl is refused, naming the limit. */
static void ttl_expiry(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_name_info info;
	dlshare_bundle *b;
	struct util_want w = UTIL_ANY;
	char name[64];
	int n = scaled(600); /* more than one EXPIRE_BATCH (256) */

	/* Past max-ttl (60 s here). */
	assert_int_equal(store_life(c, "ttl/long", 0, 60001, 1, NULL),
			 DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "max-ttl"));

	/* A long TTL, and a name with the default (300 ms) that a lease
	 * holds when it expires. */
	assert_int_equal(store_life(c, "ttl/keep", 0, 60000, 2, NULL), 0);
	assert_int_equal(dlshare_stat(c, "ttl/keep", &info, NULL), 0);
	assert_int_equal(info.ttl_ms, 60000);
	assert_true(info.expires_in_ms <= 60000);
	assert_int_equal(store_life(c, "ttl/held", 0, 0, 3, NULL), 0);
	assert_int_equal(dlshare_stat(c, "ttl/held", &info, NULL), 0);
	assert_int_equal(info.ttl_ms, (uint32_t)default_ttl);
	assert_int_equal(dlshare_get(c, "ttl/held", NULL, &b), 0);
	/* Many short ones (exports: sealed as they are published; a store
	 * version could see its name expire before its seal, which then
	 * says ENOENT). */
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "ttl/many/%d", i);
		assert_int_equal(export_life(c, name, 0, 50, (uint32_t)i), 0);
	}
	/* A store version whose name expires while it is pending: nothing
	 * is published, and the seal says so. */
	{
		dlshare_tensor_spec spec = {
			.dtype = DT_F32, .ndim = 1, .shape = shape16,
		};
		dlshare_create_opts o = { .device = { kDLCPU, 0 }, .ttl_ms = 1 };
		dlshare_writer *wr;

		assert_int_equal(dlshare_create(c, "ttl/pending", &spec, 1, &o,
						&wr), 0);
		dlshare_name_info pi;
		int gone = 0;

		for (int t = 0; t <= harness_ms(5000) && !gone; t += 5) {
			gone = dlshare_stat(c, "ttl/pending", &pi, NULL) ==
			       DLSHARE_ENOENT;
			if (!gone)
				util_sleep_ms(5);
		}
		assert_true(gone);
		assert_int_equal(dlshare_seal(wr, NULL, NULL), DLSHARE_ENOENT);
	}
	/* Only ttl/keep is left; ttl/held's version lives under the lease. */
	w.names = 1;
	w.versions = 2;
	w.leases = 1;
	util_assert_want(c, &w);
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1,
				    shape16, 3), 0);
	dlshare_bundle_free(b);
	w.versions = 1;
	w.leases = 0;
	util_assert_want(c, &w);
	assert_true(util_stats(c).expired >= (uint64_t)n + 1);
	assert_int_equal(dlshare_delete(c, "ttl/keep"), 0);
	want_empty(c);
	dlshare_disconnect(c);
}

/* default-ttl past max-ttl is a configuration error that names both. */
static void ttl_config(void **state)
{
	char cmd[512];
	FILE *p;
	char out[512] = "";
	size_t n;
	int rc;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s --check-config --max-ttl 5 "
		 "--default-ttl 10 2>&1", DLSHARED_PATH);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	rc = pclose(p);
	assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) != 0);
	assert_non_null(strstr(out, "default-ttl"));
	assert_non_null(strstr(out, "max-ttl"));
}

/* ---- delete by prefix ------------------------------------------------------------ */

static void rm_prefix(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	uint64_t deleted, skipped;
	int n = many_names;
	char name[64];
	int base;

	assert_int_equal(store_life(c, "warm", 0, 0, 1, NULL), 0);
	assert_int_equal(dlshare_delete(c, "warm"), 0);
	want_empty(c);
	base = harness_fd_count(fx->d.pid);

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "fg/batch/%05d", i);
		assert_int_equal(store_life(c, name, 0, 0, (uint32_t)i, NULL), 0);
	}
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "fgx/%d", i);
		assert_int_equal(store_life(c, name, 0, 0, (uint32_t)i, NULL), 0);
	}
	want_names(c, n + 10);
	/* A name that ends in '/' is no name: the error says so. */
	assert_int_equal(dlshare_delete(c, "fg/"), DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "dlshare_delete_prefix"));
	/* An empty prefix would delete everything: refused. */
	assert_int_equal(dlshare_delete_prefix(c, "", &deleted, NULL),
			 DLSHARE_EINVAL);
	/* More than one batch (REGISTRY_DELETE_BATCH is 1024). */
	assert_int_equal(dlshare_delete_prefix(c, "fg/", &deleted, &skipped), 0);
	assert_int_equal(deleted, (uint64_t)n);
	assert_int_equal(skipped, 0);
	want_names(c, 10);
	assert_int_equal(dlshare_delete_prefix(c, "fg/", &deleted, NULL), 0);
	assert_int_equal(deleted, 0);
	assert_int_equal(dlshare_delete_prefix(c, "fgx/", &deleted, NULL), 0);
	assert_int_equal(deleted, 10);
	want_empty(c);
	/* Every buffer's fds went back. */
	assert_int_equal(harness_wait_fds(fx->d.pid, base), base);
	dlshare_disconnect(c);
}

/* ---- per-uid stats, and other uids ----------------------------------------------- */

static void uid_stats(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_bundle *b;
	dlshare_stats s;
	int found = 0;

	assert_int_equal(store_life(c, "us/a", 0, 0, 1, NULL), 0);
	assert_int_equal(store_life(c, "us/b", 0, 0, 2, NULL), 0);
	assert_int_equal(dlshare_get(c, "us/a", NULL, &b), 0);
	s = util_stats(c);
	assert_true(s.nuids >= 1);
	assert_true(s.nuid_rows >= 1 && s.nuid_rows <= DLSHARE_STATS_UIDS);
	for (uint32_t i = 0; i < s.nuid_rows; i++) {
		if (s.uids[i].uid != (uint32_t)getuid())
			continue;
		found = 1;
		assert_int_equal(s.uids[i].names, 2);
		assert_int_equal(s.uids[i].versions, 2);
		assert_int_equal(s.uids[i].leases, 1);
		assert_true(s.uids[i].bytes >= 2 * 64);
		assert_true(s.uids[i].connections >= 1);
	}
	assert_true(found);
	dlshare_bundle_free(b);
	assert_int_equal(dlshare_delete_prefix(c, "us/", NULL, NULL), 0);
	want_empty(c);
	dlshare_disconnect(c);
}

static int publish_as_a(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	char name[64];

	(void)arg;
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "shared/a%d", i);
		CHILD_OK(store_life(c, name, 0, 0, (uint32_t)i, NULL));
	}
	CHILD_OK(util_post(c, "shared/a-ready", 1));
	/* An owned name of uid A, open for anyone to write. */
	{
		dlshare_tensor_spec spec = {
			.dtype = DT_F32, .ndim = 1, .shape = shape16,
		};
		dlshare_create_opts o = {
			.device = { kDLCPU, 0 }, .mode = 0666,
			.flags = DLSHARE_NAME_OWNED,
		};
		dlshare_writer *w;

		CHILD_OK(dlshare_create(c, "open/owned", &spec, 1, &o, &w));
		CHILD_OK(dlshare_seal(w, NULL, NULL));
	}
	CHILD_OK(util_post(c, "shared/a-owned", 1));
	/* Keep the connection (and so open/owned) until told. */
	CHILD_CHECK(util_await(c, "shared/a-done", 0, harness_ms(10000),
			       NULL) > 0);
	/* Its own, not root's shared/a-done (mode 0644). */
	{
		uint64_t deleted, skipped;

		CHILD_OK(dlshare_delete_prefix(c, "shared/", &deleted,
					       &skipped));
		CHILD_CHECK(deleted == 7 && skipped == 1);
	}
	dlshare_disconnect(c);
	return 0;
}

static int delete_as_b(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	uint64_t deleted, skipped;
	char name[64];

	(void)arg;
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "shared/b%d", i);
		CHILD_OK(store_life(c, name, 0, 0, (uint32_t)i, NULL));
	}
	/* Only its own three go; uid A's names (mode 0644) are skipped. */
	CHILD_OK(dlshare_delete_prefix(c, "shared/", &deleted, &skipped));
	CHILD_CHECK(deleted == 3);
	CHILD_CHECK(skipped == 7); /* a0..a4, a-ready, a-owned */
	/* Another uid can neither add to nor take over an owned name, even
	 * one whose mode lets it write. */
	CHILD_ERR(store_life(c, "open/owned", 0, 0, 9, NULL), DLSHARE_EPERM);
	CHILD_ERR(store_life(c, "open/owned", DLSHARE_NAME_OWNED, 0, 9, NULL),
		  DLSHARE_EPERM);
	dlshare_disconnect(c);
	return 0;
}

static void prefix_acl(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	pid_t a;

	if (!util_can_switch_uids())
		test_skip("needs root to run peers of other uids");
	c = harness_connect(&fx->d);
	a = util_spawn_as(&fx->d, UTIL_UID_A, UTIL_UID_A, publish_as_a, NULL);
	assert_true(util_await(c, "shared/a-owned", 0, harness_ms(10000),
			       NULL) > 0);
	assert_int_equal(util_wait(util_spawn_as(&fx->d, UTIL_UID_B, UTIL_UID_B,
						  delete_as_b, NULL)), 0);
	/* Uid A's names survived; open/owned is still A's. */
	for (int i = 0; i < 5; i++) {
		char name[64];
		dlshare_name_info info;

		snprintf(name, sizeof(name), "shared/a%d", i);
		assert_int_equal(dlshare_stat(c, name, &info, NULL), 0);
		assert_int_equal(info.owner_uid, UTIL_UID_A);
	}
	assert_int_equal(util_post(c, "shared/a-done", 1), 0);
	assert_int_equal(util_wait(a), 0);
	/* open/owned went with A's connection. */
	assert_int_equal(dlshare_delete_prefix(c, "shared/", NULL, NULL), 0);
	want_empty(c);
	dlshare_disconnect(c);
}

/* A name of (i + 1) pages, published as uid UTIL_UID_A + 10 + i. */
static int publish_pages(const struct daemon_proc *d, void *arg)
{
	int i = (int)(intptr_t)arg;
	int64_t shape[1] = { (int64_t)(i + 1) * 1024 };
	dlshare_client *c = util_child_connect(d);
	char name[64];

	snprintf(name, sizeof(name), "uids/%d", i);
	CHILD_OK(util_store(c, name, DT_F32, 1, shape, (uint32_t)i, NULL));
	dlshare_disconnect(c);
	return 0;
}

/* More uids than a StatsReply carries rows for: the top ones by bytes,
 * biggest first, and the count of all. */
static void uid_rows(void **state)
{
	struct fixture *fx = *state;
	enum { NUIDS = DLSHARE_STATS_UIDS + 4 };
	dlshare_client *c;
	dlshare_stats s;

	if (!util_can_switch_uids())
		test_skip("needs root to run peers of other uids");
	c = harness_connect(&fx->d);
	for (int i = 0; i < NUIDS; i++)
		assert_int_equal(util_wait(util_spawn_as(&fx->d,
			UTIL_UID_A + 10 + (uid_t)i, UTIL_UID_A + 10 + (gid_t)i,
			publish_pages, (void *)(intptr_t)i)), 0);
	s = util_stats(c);
	assert_true(s.nuids >= NUIDS);
	assert_int_equal(s.nuid_rows, DLSHARE_STATS_UIDS);
	for (uint32_t i = 0; i < s.nuid_rows; i++) {
		/* The biggest first: uid A+10+NUIDS-1 has the most pages. */
		assert_int_equal(s.uids[i].uid, UTIL_UID_A + 10 + NUIDS - 1 - i);
		assert_int_equal(s.uids[i].names, 1);
		assert_int_equal(s.uids[i].versions, 1);
		assert_int_equal(s.uids[i].connections, 0);
		if (i)
			assert_true(s.uids[i].bytes < s.uids[i - 1].bytes);
	}
	dlshare_disconnect(c);
}

/* ---- producers killed at random ---------------------------------------------------- */

struct storm_arg {
	int id;
	unsigned seed;
};

/* Publishes owned and TTL names, in store and export mode, until killed. */
static int storm_producer(const struct daemon_proc *d, void *arg)
{
	const struct storm_arg *a = arg;
	dlshare_client *c = util_child_connect(d);
	char name[64];

	for (unsigned i = 0;; i++) {
		uint32_t seed = a->seed + i;

		snprintf(name, sizeof(name), "storm/%d/own%u", a->id, i % 8);
		if (i % 2)
			CHILD_OK(store_life(c, name, DLSHARE_NAME_OWNED, 0,
					    seed, NULL));
		else
			CHILD_OK(export_life(c, name, DLSHARE_NAME_OWNED, 0,
					     seed));
		snprintf(name, sizeof(name), "storm/%d/ttl%u", a->id, i % 8);
		/* Short enough to expire often; a store version whose name
		 * expired before its seal is no error. */
		{
			int e = store_life(c, name, 0, (uint32_t)harness_ms(100),
					   seed, NULL);

			CHILD_CHECK(e == 0 || e == DLSHARE_ENOENT);
		}
	}
}

/* Producers publish owned and TTL names and are SIGKILLed at random
 * moments, again and again; a reader holds a lease on a dead producer's
 * owned name. At the end the daemon is back at its baseline (no name, no
 * byte, its fd count as before), and the reader read bit-exact until it
 * released. */
static void kill_storm(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *reader = harness_connect(&fx->d);
	int base;
	unsigned rnd = (unsigned)getpid();
	enum { NPROD = 4 };
	pid_t prod[NPROD];
	struct storm_arg args[NPROD];
	int kills = scaled(40);
	dlshare_bundle *held;
	dlshare_bundle *heldx;
	pid_t v;

	print_message("kill_storm: seed %u\n", rnd);
	/* Warm up (the thread pool seals on), then count the daemon's fds. */
	assert_int_equal(store_life(c, "warm", 0, 0, 1, NULL), 0);
	assert_int_equal(dlshare_delete(c, "warm"), 0);
	want_empty(c);
	base = harness_fd_count(fx->d.pid);
	assert_true(base > 0);
	/* The victim: its owned names are leased, then it dies. */
	v = util_spawn(&fx->d, owned_producer, NULL);
	assert_true(util_await(c, "kill/ready", 0, harness_ms(10000), NULL) > 0);
	assert_int_equal(dlshare_get(reader, "kill/store", NULL, &held), 0);
	assert_int_equal(dlshare_get(reader, "kill/export", NULL, &heldx), 0);
	util_kill(v);

	for (int i = 0; i < NPROD; i++) {
		args[i].id = i;
		args[i].seed = rand_r(&rnd);
		prod[i] = util_spawn(&fx->d, storm_producer, &args[i]);
	}
	for (int k = 0; k < kills; k++) {
		int i = (int)(rand_r(&rnd) % NPROD);

		util_sleep_ms((int)(rand_r(&rnd) % 20));
		util_kill(prod[i]);
		args[i].seed = rand_r(&rnd);
		prod[i] = util_spawn(&fx->d, storm_producer, &args[i]);
	}
	for (int i = 0; i < NPROD; i++)
		util_kill(prod[i]);
	assert_int_equal(dlshare_delete(c, "kill/ready"), 0);

	/* Owned names went with their producers, TTL names expired; what
	 * the reader holds of the victim is intact. */
	{
		struct util_want w = UTIL_ANY;

		w.names = 0;
		w.leases = 2;
		w.versions = 2;
		w.connections = 2;
		util_assert_want(c, &w);
	}
	assert_int_equal(util_check(dlshare_bundle_tensor(held, 0), DT_F32, 1,
				    shape16, 11), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(heldx, 0), DT_F32, 1,
				    shape16, 12), 0);
	dlshare_bundle_free(held);
	dlshare_bundle_free(heldx);
	dlshare_disconnect(reader);
	want_empty(c);
	/* The reader's socket (two gets ask for no request channel). */
	assert_int_equal(harness_wait_fds(fx->d.pid, base - 1), base - 1);
	dlshare_disconnect(c);
}

/* ---- large buffers let go off the loop --------------------------------- */

/* daemon/registry.h's REGISTRY_CLOSE_ASIDE_MIN: host buffers from this
 * size on are closed on the daemon's thread pool when let go. */
#define CLOSE_ASIDE_MIN (256u << 10)

/* A store version of one float32 tensor of bytes bytes, its first 4 KiB
 * filled with seed. */
static int store_bytes(dlshare_client *c, const char *name, uint64_t bytes,
		       uint32_t seed)
{
	const int64_t shape[] = { (int64_t)(bytes / 4) };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape };
	dlshare_writer *w;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, NULL, &w)))
		return err;
	harness_fill(dlshare_writer_tensor(w, 0)->data,
		     bytes < 4096 ? bytes : 4096, seed);
	return dlshare_seal(w, NULL, NULL);
}

/* Whether p's first 4 KiB are store_bytes's for seed. */
static int head_is(const void *p, uint32_t seed)
{
	uint8_t want[4096];

	harness_fill(want, sizeof(want), seed);
	return memcmp(p, want, sizeof(want)) == 0;
}

/* CPU time of the daemon's threads in clock ticks: its main thread (the
 * loop: tid == pid) and all the others (the thread pool). */
static void daemon_ticks(pid_t pid, long *loop, long *others)
{
	char path[64];
	FILE *f;
	unsigned long tid;
	char line[256];

	*loop = *others = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);

	assert_non_null(dir);
	for (struct dirent *e; (e = readdir(dir));) {
		long ut = 0, st = 0;
		char stat[96];

		if (sscanf(e->d_name, "%lu", &tid) != 1)
			continue;
		snprintf(stat, sizeof(stat), "%s/%lu/stat", path, tid);
		if (!(f = fopen(stat, "r")))
			continue; /* the thread went */
		if (fgets(line, sizeof(line), f)) {
			/* Fields 14 and 15, after the ")" that ends comm. */
			const char *p = strrchr(line, ')');

			if (p)
				sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u "
				       "%*u %*u %*u %*u %ld %ld", &ut, &st);
		}
		fclose(f);
		if (tid == (unsigned long)pid)
			*loop += ut + st;
		else
			*others += ut + st;
	}
	closedir(dir);
}

/* daemon_ticks once they stopped moving for 100 ms (an fd leaves the
 * table before the close frees its pages), up to a scaled 5 s. */
static void daemon_ticks_settled(pid_t pid, long *loop, long *others)
{
	long l, o;

	daemon_ticks(pid, loop, others);
	for (int waited = 0; waited < harness_ms(5000); waited += 100) {
		util_sleep_ms(100);
		daemon_ticks(pid, &l, &o);
		if (l == *loop && o == *others)
			return;
		*loop = l;
		*others = o;
	}
}

/* Names of host buffers below, at and far above CLOSE_ASIDE_MIN, read by
 * another connection (the daemon then holds each memfd and its read-only
 * reopen) and deleted, one by one, by prefix in a burst (fds handed over
 * while the pool closes others), and by a newer version: the daemon's
 * fd count is back at its baseline each time, the readers read what was
 * written, and a large buffer's pages are freed by the pool's threads, not
 * by the loop's (each peer would wait ~50 ms per GiB for it there). A
 * last large delete right before the daemon stops: it exits cleanly (the
 * teardown checks), no fd or byte left behind under ASan and valgrind. */
static void large_buffers_freed_off_the_loop(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *reader = harness_connect(&fx->d);
	const uint64_t sizes[] = { 4096, CLOSE_ASIDE_MIN - 4096,
				   CLOSE_ASIDE_MIN, 4 * CLOSE_ASIDE_MIN };
	const uint64_t big = UINT64_C(1) << 30;
	enum { BURST = 24 };
	long loop0, others0, loop1, others1;
	char name[32];
	int base;

	assert_int_equal(store_bytes(c, "warm", 4096, 1), 0);
	assert_int_equal(dlshare_delete(c, "warm"), 0);
	want_empty(c);
	base = harness_fd_count(fx->d.pid);
	assert_true(base > 0);

	/* One by one, each read first. */
	for (size_t i = 0; i < sizeof(sizes) / sizeof(*sizes); i++) {
		DLManagedTensor *t;

		snprintf(name, sizeof(name), "aside/%zu", i);
		assert_int_equal(store_bytes(c, name, sizes[i], 7 + (uint32_t)i), 0);
		assert_int_equal(dlshare_get_tensor(reader, name, NULL, &t), 0);
		assert_true(head_is(t->dl_tensor.data, 7 + (uint32_t)i));
		t->deleter(t);
		assert_int_equal(dlshare_delete(c, name), 0);
		assert_int_equal(harness_wait_fds(fx->d.pid, base), base);
	}

	/* A burst, deleted at once. */
	for (int i = 0; i < BURST; i++) {
		DLManagedTensor *t;

		snprintf(name, sizeof(name), "burst/%d", i);
		assert_int_equal(store_bytes(c, name, 4 * CLOSE_ASIDE_MIN,
					     (uint32_t)i), 0);
		assert_int_equal(dlshare_get_tensor(reader, name, NULL, &t), 0);
		t->deleter(t);
	}
	{
		uint64_t n = 0;

		assert_int_equal(dlshare_delete_prefix(c, "burst/", &n, NULL), 0);
		assert_int_equal(n, BURST);
	}
	assert_int_equal(harness_wait_fds(fx->d.pid, base), base);

	/* A newer version retires a large one; the reader gets the new. */
	for (uint32_t v = 0; v < 3; v++) {
		DLManagedTensor *t;

		assert_int_equal(store_bytes(c, "retire", 4 * CLOSE_ASIDE_MIN,
					     20 + v), 0);
		assert_int_equal(dlshare_get_tensor(reader, "retire", NULL, &t),
				 0);
		assert_true(head_is(t->dl_tensor.data, 20 + v));
		t->deleter(t);
	}
	assert_int_equal(dlshare_delete(c, "retire"), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, base), base);

	/* Who frees the pages: the daemon holds the only reference to an
	 * unread version once its producer sealed it. */
	assert_int_equal(store_bytes(c, "aside/big", big, 3), 0);
	daemon_ticks_settled(fx->d.pid, &loop0, &others0);
	assert_int_equal(dlshare_delete(c, "aside/big"), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, base), base);
	daemon_ticks_settled(fx->d.pid, &loop1, &others1);
	print_message("freeing 1 GiB: loop thread %ld ticks, others %ld\n",
		      loop1 - loop0, others1 - others0);
	if ((loop1 - loop0) + (others1 - others0) < 2)
		print_message("SKIP (part): the free took under 2 ticks here, "
			      "too little to say which thread did it\n");
	else
		assert_true(loop1 - loop0 < others1 - others0);

	/* The last one, still being freed when the daemon stops. */
	assert_int_equal(store_bytes(c, "aside/last", big / 2, 4), 0);
	assert_int_equal(dlshare_delete(c, "aside/last"), 0);
	dlshare_disconnect(reader);
	dlshare_disconnect(c);
}

/* A raw Get (or, with stat, a Stat) of name with request id; not waited
 * for. */
static void raw_ask_nowait(int sock, uint64_t id, const char *name, int stat)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	Dlshare__Stat st = DLSHARE__STAT__INIT;

	f.id = id;
	if (stat) {
		f.body_case = DLSHARE__FRAME__BODY_STAT;
		f.stat = &st;
		st.name = (char *)name;
	} else {
		f.body_case = DLSHARE__FRAME__BODY_GET;
		f.get = &g;
		g.name = (char *)name;
	}
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
}

/* A peer that stops reading has its first get of a large buffer's reply
 * queued in the daemon, with the daemon's dup of the buffer's fd. It
 * releases that lease blind (lease ids are sequential), the name is
 * deleted, and the registry lets go of the buffer: the queued dup is now
 * its last reference. When the peer goes, the dup's close frees the
 * pages: on the pool's threads, not the loop's. */
static void queued_dup_freed_off_the_loop(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	const uint64_t big = UINT64_C(1) << 30;
	/* Replies past what the socket holds (the daemon's send buffer: a
	 * connected SEQPACKET socket has no queue-length limit). Stats: no
	 * lease each, little for the loop to drop when the peer goes. */
	enum { FILL = 1500 };
	long loop0, others0, loop1, others1;
	struct wire_msg *m;
	uint64_t lease;
	int sock, base;

	assert_int_equal(store_bytes(c, "dup/small", 4096, 1), 0);
	assert_int_equal(store_bytes(c, "dup/big", big, 2), 0);
	base = harness_fd_count(fx->d.pid);
	sock = raw_connect(fx->d.sock);
	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	/* One get read: its lease id; the big one's is the next (nobody
	 * else takes leases meanwhile). */
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Get g = DLSHARE__GET__INIT;

		f.id = 1;
		f.body_case = DLSHARE__FRAME__BODY_GET;
		f.get = &g;
		g.name = "dup/small";
		assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_GET_REPLY);
		lease = m->frame->get_reply->lease;
		wire_msg_free(m);
	}
	/* Not read from now on: the daemon's output to us backs up. */
	for (int i = 0; i < FILL; i++)
		raw_ask_nowait(sock, 2 + (uint64_t)i, "dup/small", 1);
	raw_ask_nowait(sock, 2 + FILL, "dup/big", 0);
	/* Both gets were handled: 2 leases. */
	assert_int_equal(harness_wait_stats(c, 2, -1, NULL), 0);
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Release r = DLSHARE__RELEASE__INIT;
		uint64_t big_lease = lease + 1;

		f.id = 0;
		f.body_case = DLSHARE__FRAME__BODY_RELEASE;
		f.release = &r;
		r.n_leases = 1;
		r.leases = &big_lease;
		assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	}
	assert_int_equal(harness_wait_stats(c, 1, -1, NULL), 0);
	assert_int_equal(dlshare_delete(c, "dup/big"), 0);
	/* The registry's fds went (closer); the dup and the reopen it was
	 * made from: the dup remains. */
	/* The daemon holds the small buffer's reopen, our socket and the
	 * queued dup of the big one's: the reply is queued indeed. */
	assert_int_equal(harness_wait_fds(fx->d.pid, base + 2), base + 2);
	daemon_ticks_settled(fx->d.pid, &loop0, &others0);
	close(sock);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(dlshare_delete(c, "dup/small"), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, base - 2), base - 2);
	daemon_ticks_settled(fx->d.pid, &loop1, &others1);
	print_message("freeing 1 GiB through a queued dup: loop thread %ld "
		      "ticks, others %ld\n", loop1 - loop0, others1 - others0);
	if ((loop1 - loop0) + (others1 - others0) < 2)
		print_message("SKIP (part): the free took under 2 ticks here, "
			      "too little to say which thread did it\n");
	else
		assert_true(loop1 - loop0 < others1 - others0);
	dlshare_disconnect(c);
}

/* One packet of a peer's carrying n copies of fd, which the daemon
 * refuses: a Stat after Hello (only Publish and a Create's manifest carry
 * fds), n past --max-fds, or a Hello before Hello is said (none may come
 * then). */
enum fd_refusal { FD_UNEXPECTED, FD_TOO_MANY, FD_BEFORE_HELLO };

static void send_refused_fds(int sock, enum fd_refusal how, int fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stat st = DLSHARE__STAT__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	int fds[17];
	unsigned n = how == FD_TOO_MANY ? 17 : 1; /* --max-fds is 16 */

	for (unsigned i = 0; i < n; i++)
		fds[i] = fd;
	f.id = 7;
	if (how == FD_BEFORE_HELLO) {
		h.major = WIRE_PROTO_MAJOR;
		h.minor = WIRE_PROTO_MINOR;
		f.body_case = DLSHARE__FRAME__BODY_HELLO;
		f.hello = &h;
	} else {
		f.body_case = DLSHARE__FRAME__BODY_STAT;
		f.stat = &st;
		st.name = "fds/x";
	}
	assert_int_equal(raw_send(sock, &f, fds, n, 0), 0);
}

/* A peer sends the daemon a large memfd and keeps no reference to it, in
 * a packet the daemon refuses (three ways: send_refused_fds). The daemon
 * holds the last reference (it is stopped while the peer sends and closes
 * its own), and its close frees the pages: on the pool's threads, not the
 * loop's. Before, the kernel dropped fds past the control buffer (and all
 * of them before Hello) inside the loop's own recvmsg. */
static void peer_fds_freed_off_the_loop(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	const uint64_t big = UINT64_C(1) << 30;
	int base;

	assert_int_equal(store_bytes(c, "warm", 4096, 1), 0);
	assert_int_equal(dlshare_delete(c, "warm"), 0);
	base = harness_fd_count(fx->d.pid);
	/* Each way twice: with 4 KiB first, so that what the daemon does
	 * for it has run once (under valgrind, the first run of a code path
	 * costs its thread the translation: tens of ms), then measured. */
	for (int k = 0; k < 6; k++) {
		int how = k / 2, warm = k % 2 == 0;
		uint64_t size = warm ? 4096 : big;
		long loop0, others0, loop1, others1;
		int fd = raw_memfd(size, F_SEAL_SHRINK | F_SEAL_GROW);
		int sock = raw_connect(fx->d.sock);

		assert_true(fd >= 0 && sock >= 0);
		assert_int_equal(fallocate(fd, 0, 0, (off_t)size), 0);
		if (how != FD_BEFORE_HELLO)
			assert_int_equal(raw_hello(sock), 0);
		daemon_ticks_settled(fx->d.pid, &loop0, &others0);
		/* Ours goes before the daemon reads it: the packet's is the
		 * last reference. */
		assert_int_equal(kill(fx->d.pid, SIGSTOP), 0);
		send_refused_fds(sock, (enum fd_refusal)how, fd);
		close(fd);
		assert_int_equal(kill(fx->d.pid, SIGCONT), 0);
		/* Each way is a protocol error: the daemon hangs up. */
		assert_int_equal(raw_expect_hangup(sock, harness_ms(5000), NULL),
				 0);
		close(sock);
		assert_int_equal(harness_wait_fds(fx->d.pid, base), base);
		if (warm)
			continue;
		daemon_ticks_settled(fx->d.pid, &loop1, &others1);
		print_message("freeing 1 GiB a peer sent (way %d): loop thread "
			      "%ld ticks, others %ld\n", how, loop1 - loop0,
			      others1 - others0);
		if ((loop1 - loop0) + (others1 - others0) < 2)
			print_message("SKIP (part): the free took under 2 "
				      "ticks here, too little to say which "
				      "thread did it\n");
		else
			assert_true(loop1 - loop0 < others1 - others0);
	}
	dlshare_disconnect(c);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest acl[] = {
		cmocka_unit_test_setup_teardown(prefix_acl, setup_open,
						util_teardown),
		cmocka_unit_test_setup_teardown(uid_rows, setup_open,
						util_teardown),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(owned_clean_close, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(owned_killed, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(ttl_expiry, setup_ttl,
						util_teardown),
		cmocka_unit_test(ttl_config),
		cmocka_unit_test_setup_teardown(rm_prefix, setup_many,
						util_teardown),
		cmocka_unit_test_setup_teardown(uid_stats, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(kill_storm, setup,
						util_teardown),
		cmocka_unit_test_setup_teardown(large_buffers_freed_off_the_loop,
						setup, util_teardown),
		cmocka_unit_test_setup_teardown(queued_dup_freed_off_the_loop,
						setup, util_teardown),
		cmocka_unit_test_setup_teardown(peer_fds_freed_off_the_loop,
						setup, util_teardown),
	};

	if (argc > 1 && strcmp(argv[1], "acl") == 0)
		return test_run_group("lifetimes_acl", acl, NULL, NULL);
	return test_run_group("lifetimes", tests, NULL, NULL);
}
