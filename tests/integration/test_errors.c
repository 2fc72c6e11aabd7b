/* test_errors — bad input through the public API gets clean error codes:
 * invalid names, dimensions, shapes, dtypes, modes and devices fail with
 * DLSHARE_EINVAL (or ENOTSUP) before anything is sent to the daemon (its
 * request counter does not move); a request too large for one packet fails
 * with DLSHARE_E2BIG and leaves the connection usable; the daemon's own
 * refusals come with a message. Valid names at the edges of the rules work
 * from one process to another. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

static uint64_t requests(dlshare_client *c)
{
	return util_stats(c).requests;
}

static char long_name[300];

static const char *bad_names[] = {
	"", "/", "/a", "a/", "a//b", ".", "..", "./a", "a/.", "a/./b",
	"../a", "a/../b", "a/..", "a b", "a\tb", "a:b", "a*", "caf\xc3\xa9",
	"a\\b", "a\nb", long_name,
};
#define NBAD (sizeof(bad_names) / sizeof(bad_names[0]))

static void invalid_names(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 4 };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = shape };
	dlshare_name_info info;
	dlshare_manifest *m;
	dlshare_writer *w;
	dlshare_bundle *b;
	DLManagedTensor *t, *mt;
	uint64_t before;

	memset(long_name, 'n', 256); /* one byte too long */
	long_name[256] = '\0';
	assert_int_equal(dlshare_host_alloc(DT_F32, 1, shape, &t), 0);
	before = requests(c);
	for (size_t i = 0; i < NBAD; i++) {
		const char *n = bad_names[i];

		/* Each says which rule the name breaks. */
#define NAME_REFUSED(call)                                                   \
	do {                                                                 \
		assert_int_equal((call), DLSHARE_EINVAL);                     \
		assert_non_null(strstr(dlshare_last_error(), "invalid name")); \
		assert_non_null(strstr(dlshare_last_error(), "a name "));      \
	} while (0)
		NAME_REFUSED(dlshare_create(c, n, &spec, 1, NULL, &w));
		assert_null(w);
		NAME_REFUSED(dlshare_publish(c, n, &t, 1, NULL, NULL));
		NAME_REFUSED(dlshare_get(c, n, NULL, &b));
		NAME_REFUSED(dlshare_get_tensor(c, n, NULL, &mt));
		NAME_REFUSED(dlshare_stat(c, n, &info, &m));
		NAME_REFUSED(dlshare_delete(c, n));
#undef NAME_REFUSED
	}
	assert_int_equal(dlshare_get(c, NULL, NULL, &b), DLSHARE_EINVAL);
	assert_int_equal(dlshare_delete(c, NULL), DLSHARE_EINVAL);
	assert_int_equal(dlshare_create(c, NULL, &spec, 1, NULL, &w),
			 DLSHARE_EINVAL);
	/* Nothing reached the daemon: only the counter's own request. */
	assert_int_equal(requests(c), before + 1);
	/* The tensor was never taken. */
	t->deleter(t);
	dlshare_disconnect(c);
}

/* Names at the edges of the rules are fine. */
static const char *edge_names[] = {
	".a", "a.", "a..b", "...", "x/.../y", "_/-/.x", "A-Z_a-z.0-9",
	"deep/er/and/deeper/still", long_name,
};
#define NEDGE (sizeof(edge_names) / sizeof(edge_names[0]))

static int edge_reader(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t shape[1] = { 4 };

	for (size_t i = 0; i < NEDGE; i++)
		CHILD_OK(util_get_check(c, edge_names[i], NULL, DT_F32, 1,
					shape, (uint32_t)i, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void edge_names_work(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 4 };

	memset(long_name, 'n', 255); /* exactly the limit */
	long_name[255] = '\0';
	for (size_t i = 0; i < NEDGE; i++)
		assert_int_equal(util_store(c, edge_names[i], DT_F32, 1, shape,
					    (uint32_t)i, NULL), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, edge_reader, NULL)), 0);
	dlshare_disconnect(c);
}

/* ---- shapes, dtypes, modes, devices ---------------------------------------------- */

static void plain_free(DLManagedTensor *self)
{
	free(self->dl_tensor.data);
	free(self);
}

static DLManagedTensor *plain(DLDataType dt, int ndim, int64_t *shape)
{
	DLManagedTensor *m = calloc(1, sizeof(*m));

	m->dl_tensor.data = calloc(1, 4096);
	m->dl_tensor.device.device_type = kDLCPU;
	m->dl_tensor.dtype = dt;
	m->dl_tensor.ndim = ndim;
	m->dl_tensor.shape = shape;
	m->deleter = plain_free;
	return m;
}

static void bad_tensors(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t ok[2] = { 2, 3 }, neg[2] = { 2, -3 }, big[2] = { 1LL << 40, 1LL << 40 };
	int64_t dims[33];
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 2, .shape = ok };
	dlshare_create_opts opts = { .device = { kDLCPU, 0 } };
	dlshare_publish_opts popts = { 0 };
	dlshare_get_opts gopts = { 0 };
	char long_key[300];
	dlshare_writer *w;
	dlshare_bundle *b;
	DLManagedTensor *t;
	uint64_t before;

	for (int i = 0; i < 33; i++)
		dims[i] = 1;
	memset(long_key, 'k', 256);
	long_key[256] = '\0';
	before = requests(c);

#define CREATE_BAD(want) \
	assert_int_equal(dlshare_create(c, "e/t", &spec, 1, &opts, &w), want)

	spec.ndim = 33;
	spec.shape = dims;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.ndim = -1;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.ndim = 2;
	spec.shape = neg;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.shape = big;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.shape = NULL;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.shape = ok;
	spec.dtype = DT(42, 32);
	CREATE_BAD(DLSHARE_EINVAL);
	spec.dtype = DT(kDLFloat, 12);
	CREATE_BAD(DLSHARE_EINVAL);
	spec.dtype = DT(kDLFloat, 0);
	CREATE_BAD(DLSHARE_EINVAL);
	spec.dtype = DT_F32;
	spec.dtype.lanes = 0;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.dtype = DT_F32;
	spec.key = long_key;
	CREATE_BAD(DLSHARE_EINVAL);
	spec.key = NULL;
	opts.mode = 01644;
	CREATE_BAD(DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "mode 01644"));
	opts.mode = 0;
	opts.flags = 0x100;
	CREATE_BAD(DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "unknown flags 0x100"));
	opts.flags = 0;
	/* A zeroed device (type 0) is none: said so. */
	opts.device.device_type = 0;
	CREATE_BAD(DLSHARE_ENOTSUP);
	assert_non_null(strstr(dlshare_last_error(), "device type 0"));
	opts.device.device_type = kDLCUDA;
	CREATE_BAD(DLSHARE_ENOTSUP);
	opts.device.device_type = kDLCPU;
	assert_int_equal(dlshare_create(c, "e/t", &spec, 0, &opts, &w),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_create(c, "e/t", NULL, 1, &opts, &w),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_create(c, "e/t", &spec, 1, &opts, NULL),
			 DLSHARE_EINVAL);
#undef CREATE_BAD

	/* dlshare_host_alloc checks the same. */
	assert_int_equal(dlshare_host_alloc(DT_F32, 33, dims, &t), DLSHARE_EINVAL);
	assert_int_equal(dlshare_host_alloc(DT_F32, -1, ok, &t), DLSHARE_EINVAL);
	assert_int_equal(dlshare_host_alloc(DT_F32, 2, neg, &t), DLSHARE_EINVAL);
	assert_int_equal(dlshare_host_alloc(DT(42, 32), 2, ok, &t), DLSHARE_EINVAL);
	assert_int_equal(dlshare_host_alloc(DT(kDLFloat, 12), 2, ok, &t),
			 DLSHARE_EINVAL);
	assert_int_equal(dlshare_host_alloc(DT_F32, 2, NULL, &t), DLSHARE_EINVAL);

	/* dlshare_publish too, and the caller keeps the tensor. */
	t = plain(DT_F32, 33, dims);
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL),
			 DLSHARE_EINVAL);
	t->dl_tensor.ndim = 2;
	t->dl_tensor.shape = neg;
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL),
			 DLSHARE_EINVAL);
	t->dl_tensor.shape = ok;
	t->dl_tensor.dtype = DT(42, 32);
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL),
			 DLSHARE_EINVAL);
	t->dl_tensor.dtype = DT_F32;
	t->dl_tensor.device.device_type = kDLCUDA;
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL),
			 DLSHARE_ENOTSUP);
	t->dl_tensor.device.device_type = kDLCPU;
	popts.mode = 02000;
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, &popts, NULL),
			 DLSHARE_EINVAL);
	void *data = t->dl_tensor.data;
	t->dl_tensor.data = NULL;
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL),
			 DLSHARE_EINVAL);
	t->dl_tensor.data = data;
	assert_int_equal(dlshare_publish(c, "e/t", &t, 0, NULL, NULL),
			 DLSHARE_EINVAL);
	DLManagedTensor *none = NULL;
	assert_int_equal(dlshare_publish(c, "e/t", &none, 1, NULL, NULL),
			 DLSHARE_EINVAL);

	/* Get options. */
	gopts.select = 3;
	assert_int_equal(dlshare_get(c, "e/t", &gopts, &b), DLSHARE_EINVAL);
	gopts.select = DLSHARE_LATEST;
	gopts.timeout_ms = -2;
	assert_int_equal(dlshare_get(c, "e/t", &gopts, &b), DLSHARE_EINVAL);
	assert_int_equal(dlshare_get(c, "e/t", NULL, NULL), DLSHARE_EINVAL);

	assert_int_equal(requests(c), before + 1);
	/* After all that, the tensor is still ours, and publishes. */
	assert_int_equal(dlshare_publish(c, "e/t", &t, 1, NULL, NULL), 0);
	assert_int_equal(dlshare_stat(c, "e/t", &(dlshare_name_info){ 0 }, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- the daemon's refusals ------------------------------------------------------------ */

/* Stores a 1-element tensor under name with mode. */
static int perm_store(dlshare_client *c, const char *name, uint32_t mode)
{
	static const int64_t one[1] = { 1 };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = one };
	dlshare_create_opts o = { .device = { kDLCPU, 0 }, .mode = mode };
	dlshare_writer *w;
	int err = dlshare_create(c, name, &spec, 1, &o, &w);

	return err ? err : dlshare_seal(w, NULL, NULL);
}

/* Whether this thread's last error is the daemon's refusal of what (an
 * operation and a name) by a name of ours with mode, to us, for access. */
static int perm_said(const char *what, uint32_t mode, const char *access)
{
	const char *m = dlshare_last_error();
	char want[256];

	snprintf(want, sizeof(want), "%s: permission denied: owned by uid %u "
		 "(gid %u) with mode %04o, which does not let uid %u (gid %u) "
		 "%s it", what, (unsigned)getuid(), (unsigned)getgid(),
		 (unsigned)mode, (unsigned)getuid(), (unsigned)getgid(), access);
	if (strcmp(m, want) == 0)
		return 1;
	fprintf(stderr, "message: %s\nwanted:  %s\n", m, want);
	return 0;
}

static int refused_reader(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;

	CHILD_ERR(dlshare_get(c, "e/missing", NULL, &b), DLSHARE_ENOENT);
	/* The daemon said why, naming the name. */
	CHILD_CHECK(strstr(dlshare_last_error(), "e/missing") != NULL);
	CHILD_ERR(dlshare_delete(c, "e/missing"), DLSHARE_ENOENT);
	/* A refusal by mode names the name's owner, its mode, and who was
	 * refused what (the owner too: 0444 lets nobody write). */
	CHILD_OK(perm_store(c, "e/ro", 0444));
	CHILD_ERR(perm_store(c, "e/ro", 0), DLSHARE_EPERM);
	CHILD_CHECK(perm_said("create e/ro", 0444, "write"));
	CHILD_ERR(dlshare_delete(c, "e/ro"), DLSHARE_EPERM);
	CHILD_CHECK(perm_said("delete e/ro", 0444, "write"));
	CHILD_OK(perm_store(c, "e/wo", 0200));
	CHILD_ERR(dlshare_get(c, "e/wo", NULL, &b), DLSHARE_EPERM);
	CHILD_CHECK(perm_said("get e/wo", 0200, "read"));
	CHILD_OK(dlshare_stats_get(c, &(dlshare_stats){ 0 }));
	/* A successful call clears it. */
	CHILD_CHECK(dlshare_last_error()[0] == '\0');
	dlshare_disconnect(c);
	return 0;
}

static void daemon_refusals(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(util_wait(util_spawn(&fx->d, refused_reader, NULL)), 0);
}

static void connect_errors(void **state)
{
	struct fixture *fx = *state;
	char path[200], toolong[300], want[512];
	dlshare_client *c = (dlshare_client *)&path; /* must be reset */

	snprintf(path, sizeof(path), "%s/nobody.sock", fx->d.dir);
	assert_int_equal(dlshare_connect(path, &c), DLSHARE_ECONN);
	assert_null(c);
	/* The message names the path and the system's reason. */
	snprintf(want, sizeof(want), "connect %s: %s", path, strerror(ENOENT));
	assert_string_equal(dlshare_last_error(), want);
	/* Not a socket: refused by the system, and said so. */
	snprintf(want, sizeof(want), "connect %s: %s", fx->d.log,
		 strerror(ECONNREFUSED));
	assert_int_equal(dlshare_connect(fx->d.log, &c), DLSHARE_ECONN);
	assert_string_equal(dlshare_last_error(), want);
	memset(toolong, 'x', sizeof(toolong) - 1);
	toolong[0] = '/';
	toolong[sizeof(toolong) - 1] = '\0';
	assert_int_equal(dlshare_connect(toolong, &c), DLSHARE_E2BIG);
	assert_non_null(strstr(dlshare_last_error(), "longer than the 107 bytes"));
	/* A success clears it. */
	assert_int_equal(dlshare_connect(fx->d.sock, &c), 0);
	assert_string_equal(dlshare_last_error(), "");
	dlshare_disconnect(c);
	assert_int_equal(dlshare_connect(fx->d.sock, NULL), DLSHARE_EINVAL);
	dlshare_disconnect(NULL);
	/* Every code has words, also unknown ones. */
	for (int e = 0; e >= -20; e--)
		assert_non_null(dlshare_strerror(e));
	assert_string_equal(dlshare_strerror(DLSHARE_ECOPY),
			    dlshare_strerror(-13));
	assert_string_not_equal(dlshare_strerror(-1000), dlshare_strerror(0));
	assert_string_equal(dlshare_version(), DLSHARE_VERSION_STRING);
}

/* ---- a request that does not fit in one packet ------------------------------------------ */

#define MANY 700

/* About 700 * 270 bytes: above the daemon's 128 KiB packet limit, below
 * the limit on tensors. Before protocol 1.4 the client refused it
 * (DLSHARE_E2BIG); now its tensors travel in a manifest memfd. */
static void request_past_a_packet(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	static dlshare_tensor_spec specs[MANY];
	static char keys[MANY][256];
	int64_t shape[1] = { 1 };
	dlshare_writer *w;
	dlshare_bundle *b;
	uint64_t v;

	for (int i = 0; i < MANY; i++) {
		memset(keys[i], 'k', 250);
		snprintf(keys[i] + 250, 6, "%05d", i);
		specs[i].key = keys[i];
		specs[i].dtype = DT_F32;
		specs[i].ndim = 1;
		specs[i].shape = shape;
	}
	assert_int_equal(dlshare_create(c, "e/big", specs, MANY, NULL, &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	assert_int_equal(dlshare_get(c, "e/big", NULL, &b), 0);
	assert_int_equal(dlshare_bundle_count(b), MANY);
	assert_int_equal(dlshare_bundle_find(b, keys[MANY - 1]), MANY - 1);
	dlshare_bundle_free(b);
	/* The connection is still good. */
	util_stats(c);
	assert_int_equal(util_store(c, "e/small", DT_F32, 1, shape, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- what a failed get says ---------------------------------------------------- */

static void get_messages(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_get_opts o = { 0 };
	int64_t shape[1] = { 4 };
	dlshare_bundle *b;

	assert_int_equal(dlshare_get(c, "e/none", NULL, &b), DLSHARE_ENOENT);
	assert_string_equal(dlshare_last_error(), "get e/none: no such name");
	for (int i = 0; i < 3; i++)
		assert_int_equal(util_store(c, "e/v", DT_F32, 1, shape, 1, NULL),
				 0);
	/* A replaced version: which one is newest. */
	o.select = DLSHARE_EXACT;
	o.version = 1;
	assert_int_equal(dlshare_get(c, "e/v", &o, &b), DLSHARE_ENOENT);
	assert_string_equal(dlshare_last_error(),
			    "get e/v: no version 1: version 1 was replaced or "
			    "deleted; the newest is 3");
	o.version = 9;
	assert_int_equal(dlshare_get(c, "e/v", &o, &b), DLSHARE_ENOENT);
	assert_string_equal(dlshare_last_error(),
			    "get e/v: no version 9: version 9 was not "
			    "published yet; the newest is 3");
	/* A timeout: the name, the selector and the version waited for. */
	o.select = DLSHARE_NEWER_THAN;
	o.version = 3;
	o.timeout_ms = 30;
	assert_int_equal(dlshare_get(c, "e/v", &o, &b), DLSHARE_ETIMEDOUT);
	assert_string_equal(dlshare_last_error(),
			    "get e/v: timed out waiting for a version newer "
			    "than 3 (the newest is 3)");
	o.select = DLSHARE_EXACT;
	o.version = 5;
	assert_int_equal(dlshare_get(c, "e/v", &o, &b), DLSHARE_ETIMEDOUT);
	assert_string_equal(dlshare_last_error(),
			    "get e/v: timed out waiting for version 5 (version "
			    "5 was not published yet; the newest is 3)");
	o.select = DLSHARE_LATEST;
	assert_int_equal(dlshare_get(c, "e/later", &o, &b), DLSHARE_ETIMEDOUT);
	assert_string_equal(dlshare_last_error(),
			    "get e/later: timed out waiting for the newest "
			    "version (no such name)");
	dlshare_disconnect(c);
}

/* ---- a consumer out of file descriptors --------------------------------------------- */

/* Sets this process's soft RLIMIT_NOFILE so that exactly room more fds can
 * be made. Returns the old limit, for setrlimit. */
static struct rlimit fds_exhaust(int room)
{
	struct rlimit old, now;
	int taken[8], next;

	assert_true(room >= 0 && room < 8);
	for (int i = 0; i < room; i++)
		assert_true((taken[i] = dup(0)) >= 0);
	next = dup(0);
	assert_true(next >= 0);
	close(next);
	for (int i = 0; i < room; i++)
		close(taken[i]);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	now = old;
	now.rlim_cur = (rlim_t)next;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &now), 0);
	return old;
}

static void fds_back(const struct rlimit *old)
{
	assert_int_equal(setrlimit(RLIMIT_NOFILE, old), 0);
}

#define FDS_N 3

/* Replies that bring fds into a process at its RLIMIT_NOFILE: the kernel
 * cannot make them (recvmsg sets MSG_CTRUNC; PyTorch users know it as
 * "received 0 items of ancdata"). Each call fails with DLSHARE_EMFILE and
 * says why, and gives back what the daemon gave it: a get's lease, a
 * take's item (to the head of its queue), a create's pending version. The
 * connection stays, and once fds are free the same calls work, the
 * buffers' fds sent again (the daemon is told they never came): for one
 * buffer with no fd to spare, and for three buffers with room for one
 * (the first comes, the rest do not). Nothing leaks, nothing stays
 * leased. */
static void consumer_out_of_fds(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	int64_t shape[1] = { 1024 };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape };
	dlshare_publish_opts no_copy = { .flags = DLSHARE_PUBLISH_NO_COPY };
	DLManagedTensor *ts[FDS_N];
	struct util_want w = UTIL_ANY;
	static float item[1024];
	DLManagedTensor plain = {
		.dl_tensor = { .data = item, .device = { kDLCPU, 0 },
			       .ndim = 1, .dtype = DT_F32, .shape = shape },
	};
	DLManagedTensor *src = &plain;
	dlshare_writer *wr;
	dlshare_client *wr_client = NULL;
	dlshare_stats before;
	struct rlimit old;
	dlshare_bundle *b;
	int slots[FDS_N];
	int err;

	/* The process's own fds: a client's socket, a memfd. */
	old = fds_exhaust(0);
	err = dlshare_connect(fx->d.sock, &wr_client);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);
	old = fds_exhaust(0);
	err = dlshare_host_alloc(DT_F32, 1, shape, &ts[0]);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);

	/* A get: one buffer, no fd to spare. */
	assert_int_equal(util_store(p, "e/fds", DT_F32, 1, shape, 7, NULL), 0);
	old = fds_exhaust(0);
	err = dlshare_get(c, "e/fds", NULL, &b);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);
	assert_non_null(strstr(dlshare_last_error(),
			       "out of file descriptors (RLIMIT_NOFILE"));
	w.leases = 0;
	w.connections = 2;
	util_assert_want(c, &w);
	assert_int_equal(dlshare_get(c, "e/fds", NULL, &b), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1,
				    shape, 7), 0);
	dlshare_bundle_free(b);

	/* Three buffers (an export of three tensors), room for one fd. */
	for (int i = 0; i < FDS_N; i++) {
		assert_int_equal(dlshare_host_alloc(DT_F32, 1, shape, &ts[i]),
				 0);
		harness_fill(ts[i]->dl_tensor.data, sizeof(item),
			     (uint32_t)(20 + i));
		slots[i] = util_track(ts[i]);
	}
	assert_int_equal(dlshare_publish(p, "e/fds3", ts, FDS_N, &no_copy,
					 NULL), 0);
	old = fds_exhaust(1);
	err = dlshare_get(c, "e/fds3", NULL, &b);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);
	assert_int_equal(dlshare_get(c, "e/fds3", NULL, &b), 0);
	assert_int_equal(dlshare_bundle_count(b), FDS_N);
	for (int i = 0; i < FDS_N; i++)
		assert_int_equal(util_check(dlshare_bundle_tensor(b, (size_t)i),
					    DT_F32, 1, shape,
					    (uint32_t)(20 + i)), 0);
	dlshare_bundle_free(b);
	util_assert_want(c, &w);

	/* A take: the item goes back to the head of its queue. */
	harness_fill(item, sizeof(item), 31);
	assert_int_equal(dlshare_publish_queued(p, "e/q", &src, 1, NULL, NULL,
						NULL), 0);
	old = fds_exhaust(0);
	err = dlshare_take(c, "e/q", 0, NULL, &b);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);
	assert_int_equal(dlshare_take(c, "e/q", 0, NULL, &b), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1,
				    shape, 31), 0);
	dlshare_bundle_free(b);

	/* A create: the pending version is dropped. */
	before = util_stats(c);
	old = fds_exhaust(0);
	err = dlshare_create(c, "e/w", &spec, 1, NULL, &wr);
	fds_back(&old);
	assert_int_equal(err, DLSHARE_EMFILE);
	assert_int_equal(util_stats(c).versions, before.versions);
	assert_int_equal(dlshare_create(c, "e/w", &spec, 1, NULL, &wr), 0);
	harness_fill(dlshare_writer_tensor(wr, 0)->data, sizeof(item), 41);
	assert_int_equal(dlshare_seal(wr, NULL, NULL), 0);
	assert_int_equal(dlshare_get(c, "e/w", NULL, &b), 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1,
				    shape, 41), 0);
	dlshare_bundle_free(b);

	util_assert_want(c, &w);
	dlshare_disconnect(c);
	dlshare_disconnect(p);
	for (int i = 0; i < FDS_N; i++)
		assert_int_equal(util_deleted(slots[i]), 1);
}

/* ---- a consumer out of address space ------------------------------------------------ */

#define AS_ELEMS (16 * 1024 * 1024) /* 64 MiB of float32 */

/* This process's virtual size, in bytes (/proc/self/status VmSize). */
static unsigned long long vm_size(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmSize: %llu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb * 1024;
}

static int as_child(const struct daemon_proc *d, void *arg)
{
	const int64_t shape[1] = { AS_ELEMS };
	dlshare_client *c = util_child_connect(d);
	struct rlimit old, low;
	dlshare_bundle *b;
	int err;

	(void)arg;
	CHILD_CHECK(getrlimit(RLIMIT_AS, &old) == 0);
	low = old;
	low.rlim_cur = (rlim_t)(vm_size() + (16u << 20));
	CHILD_CHECK(setrlimit(RLIMIT_AS, &low) == 0);
	err = dlshare_get(c, "e/as", NULL, &b);
	CHILD_CHECK(setrlimit(RLIMIT_AS, &old) == 0);
	if (err != DLSHARE_ENOMEM ||
	    !strstr(dlshare_last_error(), "could not be mapped")) {
		fprintf(stderr, "as_child: get at the limit: %d (%s)\n", err,
			dlshare_last_error());
		return 1;
	}
	CHILD_OK(dlshare_get(c, "e/as", NULL, &b));
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1, shape,
			       9) == 0);
	dlshare_bundle_free(b);
	/* A take whose buffer cannot be mapped is no consumption: the
	 * version goes back to the head of its queue. */
	CHILD_CHECK(setrlimit(RLIMIT_AS, &low) == 0);
	err = dlshare_take(c, "e/asq", 0, NULL, &b);
	CHILD_CHECK(setrlimit(RLIMIT_AS, &old) == 0);
	if (err != DLSHARE_ENOMEM) {
		fprintf(stderr, "as_child: take at the limit: %d (%s)\n", err,
			dlshare_last_error());
		return 1;
	}
	CHILD_OK(dlshare_take(c, "e/asq", 0, NULL, &b));
	CHILD_CHECK(util_check(dlshare_bundle_tensor(b, 0), DT_F32, 1, shape,
			       10) == 0);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

/* A consumer whose address space cannot take a version's buffer (a
 * container's ulimit -v, vm.max_map_count reached): the get fails with
 * DLSHARE_ENOMEM, and once there is room the same get maps it; a take
 * likewise, its version back at the head of its queue meanwhile. The fd
 * came but could not be mapped, so the daemon is told to attach it again,
 * as for fds that never came (protocol 1.8); before, the buffer could
 * never be got again on that connection (its fd was sent once). */
static void consumer_out_of_address_space(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	const int64_t shape[1] = { AS_ELEMS };

#ifdef __SANITIZE_ADDRESS__
	dlshare_disconnect(p);
	test_skip("ASan's shadow memory cannot live under RLIMIT_AS");
#endif
	assert_int_equal(util_store(p, "e/as", DT_F32, 1, shape, 9, NULL), 0);
	{
		float *item = malloc((size_t)AS_ELEMS * sizeof(float));
		DLManagedTensor plain = {
			.dl_tensor = { .data = item, .device = { kDLCPU, 0 },
				       .ndim = 1, .dtype = DT_F32,
				       .shape = (int64_t *)shape },
		};
		DLManagedTensor *src = &plain;

		assert_non_null(item);
		harness_fill(item, (size_t)AS_ELEMS * sizeof(float), 10);
		assert_int_equal(dlshare_publish_queued(p, "e/asq", &src, 1,
							NULL, NULL, NULL), 0);
		free(item);
	}
	assert_int_equal(util_wait(util_spawn(&fx->d, as_child, NULL)), 0);
	dlshare_disconnect(p);
}

/* ---- connect and Hello time out -------------------------------------------------- */

/* A listener at path with backlog: returns its fd. */
static int listener(const char *path, int backlog)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, backlog), 0);
	return fd;
}

static atomic_int usr1_seen;

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&usr1_seen, 1);
}

/* Sends SIGUSR1 to target every 10 ms until stop. */
struct interrupter {
	pthread_t target;
	atomic_int stop;
};

static void *interrupter_main(void *arg)
{
	struct interrupter *in = arg;

	while (!atomic_load(&in->stop)) {
		pthread_kill(in->target, SIGUSR1);
		util_sleep_ms(10);
	}
	return NULL;
}

static void connect_timeouts(void **state)
{
	struct fixture *fx = *state;
	dlshare_connect_opts o = { .size = sizeof(o), .timeout_ms = 200 };
	dlshare_client *c = NULL;
	char path[200], want[300];
	char buf[64];
	int l, a;

	o.timeout_ms = harness_ms(200);
	/* A listener that never accepts: the connection is queued, and the
	 * Hello is never answered. */
	snprintf(path, sizeof(path), "%s/mute.sock", fx->d.dir);
	l = listener(path, 0);
	assert_int_equal(dlshare_connect_ex(path, &o, &c), DLSHARE_ETIMEDOUT);
	assert_null(c);
	snprintf(want, sizeof(want), "connect %s: the daemon did not answer "
		 "Hello within %d ms", path, o.timeout_ms);
	assert_memory_equal(dlshare_last_error(), want, strlen(want));
	/* Its queue (backlog 0) is full now: connect() itself waits. */
	assert_int_equal(dlshare_connect_ex(path, &o, &c), DLSHARE_ETIMEDOUT);
	snprintf(want, sizeof(want), "connect %s: the listener accepted no "
		 "connection within %d ms", path, o.timeout_ms);
	assert_memory_equal(dlshare_last_error(), want, strlen(want));
	/* The same with signals coming all the while to a handler without
	 * SA_RESTART (Python installs its handlers so): connect() returns
	 * EINTR each time, and the wait goes on for what is left of it. */
	{
		struct sigaction sa = { .sa_handler = on_usr1 }, old_sa;
		struct interrupter in = { .target = pthread_self() };
		pthread_t th;

		sigemptyset(&sa.sa_mask);
		assert_int_equal(sigaction(SIGUSR1, &sa, &old_sa), 0);
		atomic_store(&usr1_seen, 0);
		assert_int_equal(pthread_create(&th, NULL, interrupter_main,
						&in), 0);
		assert_int_equal(dlshare_connect_ex(path, &o, &c),
				 DLSHARE_ETIMEDOUT);
		atomic_store(&in.stop, 1);
		pthread_join(th, NULL);
		assert_int_equal(sigaction(SIGUSR1, &old_sa, NULL), 0);
		assert_memory_equal(dlshare_last_error(), want, strlen(want));
		assert_true(atomic_load(&usr1_seen) > 0);
	}
	close(l);
	unlink(path);

	/* One that accepts and never answers: the client hangs up when its
	 * time is up (the listener reads the end of the stream). */
	l = listener(path, 4);
	assert_int_equal(dlshare_connect_ex(path, &o, &c), DLSHARE_ETIMEDOUT);
	snprintf(want, sizeof(want), "connect %s: the daemon did not answer "
		 "Hello within %d ms", path, o.timeout_ms);
	assert_memory_equal(dlshare_last_error(), want, strlen(want));
	a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	assert_true(a >= 0);
	/* The Hello it sent, then the end. */
	assert_true(recv(a, buf, sizeof(buf), 0) > 0);
	assert_int_equal(recv(a, buf, sizeof(buf), 0), 0);
	close(a);
	close(l);
	unlink(path);

	/* Bad options; a real daemon with a timeout, and with none. */
	o.timeout_ms = -2;
	assert_int_equal(dlshare_connect_ex(fx->d.sock, &o, &c), DLSHARE_EINVAL);
	o.size = 0;
	o.timeout_ms = 100;
	assert_int_equal(dlshare_connect_ex(fx->d.sock, &o, &c), DLSHARE_EINVAL);
	o.size = sizeof(o);
	assert_int_equal(dlshare_connect_ex(fx->d.sock, &o, &c), 0);
	util_stats(c);
	dlshare_disconnect(c);
	o.timeout_ms = DLSHARE_WAIT_FOREVER;
	assert_int_equal(dlshare_connect_ex(fx->d.sock, &o, &c), 0);
	dlshare_disconnect(c);
	assert_int_equal(dlshare_connect_ex(fx->d.sock, NULL, &c), 0);
	dlshare_disconnect(c);
}

/* ---- a client whose connection died hangs up at once ------------------------------ */

/* A relay between one client and the daemon: forwards packets and their
 * fds both ways until either side ends (then it closes both), or until
 * told to break the client's side with a packet that is no frame. */
struct relay {
	int listen_fd, cli, dmn;
	const char *daemon_sock;
	atomic_int poison;     /* set: send the client garbage once */
	atomic_int deaf;       /* set: stop reading the client, its side
				* shut for reading (its sends fail with
				* EPIPE, its receives wait) */
	atomic_int client_gone; /* the client hung up */
	int cli_deaf;          /* the relay thread's: deaf was done */
	atomic_int stop;       /* set: the relay ends */
	pthread_t thread;
};

static int relay_one(int from, int to)
{
	static uint8_t buf[256 * 1024]; /* the relay thread's alone */
	int fds[WIRE_FDS_MAX];
	unsigned nfds = 0;
	size_t len = 0;
	int r;

	r = wire_recv(from, buf, sizeof(buf), fds, WIRE_FDS_MAX, &len, &nfds,
		      MSG_DONTWAIT);
	if (r == -EAGAIN)
		return 0;
	if (r || (len == 0 && nfds == 0))
		return -1;
	r = wire_send(to, buf, len, fds, nfds, 0);
	wire_close_fds(fds, nfds);
	return r ? -1 : 0;
}

static void *relay_main(void *arg)
{
	struct relay *rl = arg;

	rl->cli = accept4(rl->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	rl->dmn = raw_connect(rl->daemon_sock);
	for (;;) {
		struct pollfd p[2] = { { .fd = rl->cli, .events = POLLIN },
				       { .fd = rl->dmn, .events = POLLIN } };

		if (atomic_exchange(&rl->poison, 0)) {
			static const uint8_t junk[3] = { 0xff, 0xff, 0xff };

			wire_send(rl->cli, junk, sizeof(junk), NULL, 0, 0);
		}
		if (atomic_exchange(&rl->deaf, 0)) {
			shutdown(rl->cli, SHUT_RD);
			rl->cli_deaf = 1;
		}
		/* Deaf: the client's side is only watched for its hang-up. */
		if (rl->cli_deaf)
			p[0].events = 0;
		if (atomic_load(&rl->stop) || poll(p, 2, 10) < 0)
			break;
		if (rl->cli_deaf && (p[0].revents & POLLHUP)) {
			atomic_store(&rl->client_gone, 1);
			break;
		}
		if (!rl->cli_deaf && p[0].revents &&
		    relay_one(rl->cli, rl->dmn)) {
			atomic_store(&rl->client_gone, 1);
			break;
		}
		if (p[1].revents && relay_one(rl->dmn, rl->cli))
			break;
	}
	close(rl->cli);
	close(rl->dmn);
	return NULL;
}

/* A get that waits forever on the relayed client, in a thread of its own:
 * it must end with the connection. */
static void *forever_get(void *arg)
{
	dlshare_get_opts o = { .timeout_ms = DLSHARE_WAIT_FOREVER };
	dlshare_bundle *b = NULL;
	intptr_t err = dlshare_get(arg, "e/never", &o, &b);

	dlshare_bundle_free(b);
	return (void *)err;
}

static void dead_connection_hangs_up(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d), *via;
	struct relay rl = { .daemon_sock = fx->d.sock };
	int64_t shape[1] = { 1000 };
	DLManagedTensor *kept, *dropped;
	dlshare_bundle *b, *none;
	pthread_t waiter;
	void *ret;
	char path[200];

	snprintf(path, sizeof(path), "%s/relay.sock", fx->d.dir);
	rl.listen_fd = listener(path, 4);
	assert_int_equal(pthread_create(&rl.thread, NULL, relay_main, &rl), 0);
	assert_int_equal(util_store(c, "e/pin", DT_F32, 1, shape, 7, NULL), 0);
	assert_int_equal(dlshare_connect(path, &via), 0);
	assert_int_equal(dlshare_get_tensor(via, "e/pin", NULL, &kept), 0);
	assert_int_equal(dlshare_get_tensor(via, "e/pin", NULL, &dropped), 0);
	assert_int_equal(dlshare_get(via, "e/pin", NULL, &b), 0);
	assert_int_equal(pthread_create(&waiter, NULL, forever_get, via), 0);
	for (int ms = 0; util_stats(c).parked != 1; ms++) {
		assert_true(ms < harness_ms(5000));
		util_sleep_ms(1);
	}
	assert_int_equal(harness_wait_stats(c, 3, 2, NULL), 0);
	/* The client reads a packet that is no frame: for it the connection
	 * is dead. The daemon's side of it is fine. */
	atomic_store(&rl.poison, 1);
	dropped->deleter(dropped); /* can no longer be sent */
	/* It hangs up by itself: the daemon drops every lease of it, while
	 * the client, a tensor and a bundle of it still exist. */
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(pthread_join(rl.thread, NULL), 0);
	assert_true(atomic_load(&rl.client_gone));
	/* The waiting get ended with the connection. */
	assert_int_equal(pthread_join(waiter, &ret), 0);
	assert_int_equal((intptr_t)ret, DLSHARE_ECONN);
	assert_int_equal(dlshare_get(via, "e/pin", NULL, &none),
			 DLSHARE_ECONN);
	/* What it got is still readable. */
	assert_int_equal(util_check(&kept->dl_tensor, DT_F32, 1, shape, 7), 0);
	kept->deleter(kept);
	dlshare_bundle_free(b);
	dlshare_disconnect(via);
	close(rl.listen_fd);
	dlshare_disconnect(c);
}

/* Calls one after another on a client whose sends fail (the relay shut its
 * side for reading): each takes the reader role itself (nobody else reads
 * or waits), fails with DLSHARE_ECONN, and must give the role back. Then
 * the client is idle, and its receiver thread reads the socket: it finds
 * a packet that is no frame and hangs up. A call that kept the role would
 * leave the socket unread, the connection never found dead. */
struct failing_calls {
	dlshare_client *c;
	int n, errs;
	atomic_int done;
};

static void *failing_calls_main(void *arg)
{
	struct failing_calls *fc = arg;

	for (int i = 0; i < fc->n; i++) {
		dlshare_name_info info;

		fc->errs += dlshare_stat(fc->c, "e/pin", &info, NULL) ==
			    DLSHARE_ECONN;
	}
	atomic_store(&fc->done, 1);
	return NULL;
}

static void failed_sends_give_the_socket_back(void **state)
{
	struct fixture *fx = *state;
	struct relay rl = { .daemon_sock = fx->d.sock };
	struct failing_calls fc = { .n = 50 };
	dlshare_name_info info;
	pthread_t t;
	char path[200];

	snprintf(path, sizeof(path), "%s/deaf.sock", fx->d.dir);
	rl.listen_fd = listener(path, 4);
	assert_int_equal(pthread_create(&rl.thread, NULL, relay_main, &rl), 0);
	assert_int_equal(dlshare_connect(path, &fc.c), 0);
	assert_int_equal(dlshare_stat(fc.c, "e/none", &info, NULL),
			 DLSHARE_ENOENT);
	atomic_store(&rl.deaf, 1);
	while (atomic_load(&rl.deaf))
		util_sleep_ms(1);
	assert_int_equal(pthread_create(&t, NULL, failing_calls_main, &fc), 0);
	for (int ms = 0; !atomic_load(&fc.done); ms++) {
		assert_true(ms < harness_ms(10000)); /* else a call hangs */
		util_sleep_ms(1);
	}
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(fc.errs, fc.n);
	atomic_store(&rl.poison, 1);
	for (int ms = 0; !atomic_load(&rl.client_gone); ms++) {
		assert_true(ms < harness_ms(5000)); /* nobody reads */
		util_sleep_ms(1);
	}
	assert_int_equal(dlshare_stat(fc.c, "e/none", &info, NULL),
			 DLSHARE_ECONN);
	dlshare_disconnect(fc.c);
	atomic_store(&rl.stop, 1);
	assert_int_equal(pthread_join(rl.thread, NULL), 0);
	close(rl.listen_fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(invalid_names, setup, teardown),
		cmocka_unit_test_setup_teardown(edge_names_work, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_tensors, setup, teardown),
		cmocka_unit_test_setup_teardown(daemon_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(connect_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(request_past_a_packet, setup, teardown),
		cmocka_unit_test_setup_teardown(get_messages, setup, teardown),
		cmocka_unit_test_setup_teardown(consumer_out_of_fds, setup,
						teardown),
		cmocka_unit_test_setup_teardown(consumer_out_of_address_space,
						setup, teardown),
		cmocka_unit_test_setup_teardown(connect_timeouts, setup, teardown),
		cmocka_unit_test_setup_teardown(dead_connection_hangs_up, setup,
						teardown),
		cmocka_unit_test_setup_teardown(failed_sends_give_the_socket_back,
						setup, teardown),
	};

	return test_run_group("errors", tests, NULL, NULL);
}
