/* util — shared helpers of the integration tests. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

/* ---- fixture ------------------------------------------------------------ */

#define UTIL_MAX_CHILDREN 64

static pid_t children[UTIL_MAX_CHILDREN];

static void child_forget(pid_t pid)
{
	for (int i = 0; i < UTIL_MAX_CHILDREN; i++)
		if (children[i] == pid)
			children[i] = 0;
}

static int setup(void **state, const char *const *extra, int check_fds)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	fx->check_fds = check_fds;
	fx->self_fds = harness_fd_count(getpid());
	if (harness_daemon_start(&fx->d, extra)) {
		fprintf(stderr, "cannot start dlshared\n");
		if (fx->d.pid > 0)
			harness_daemon_stop(&fx->d);
		free(fx);
		return -1;
	}
	*state = fx;
	return 0;
}

int util_setup(void **state, const char *const *extra)
{
	return setup(state, extra, 0);
}

int util_setup_fdcheck(void **state, const char *const *extra)
{
	return setup(state, extra, 1);
}

int util_setup_open(void **state, const char *const *extra)
{
	const char *args[24] = { "--socket-mode", "0666" };
	struct fixture *fx;
	int n = 2;

	for (int i = 0; extra && extra[i] && n < 23; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	if (util_setup_fdcheck(state, args))
		return -1;
	fx = *state;
	if (chmod(fx->d.dir, 0711)) {
		fprintf(stderr, "chmod %s: %s\n", fx->d.dir, strerror(errno));
		return -1;
	}
	return 0;
}

int util_teardown(void **state)
{
	struct fixture *fx = *state;
	int status, fds, want_fds, check;

	for (int i = 0; i < UTIL_MAX_CHILDREN; i++)
		if (children[i] > 0) {
			fprintf(stderr, "teardown: killing child %d\n",
				(int)children[i]);
			util_kill(children[i]);
		}
	fds = harness_fd_count(getpid());
	status = harness_daemon_stop(&fx->d);
	*state = NULL;
	if (fx->check_fds && fds != fx->self_fds) {
		char p[64], link[256];

		fprintf(stderr, "test process fds: %d before, %d after:\n",
			fx->self_fds, fds);
		for (int fd = 0; fd < 1024; fd++) {
			ssize_t n;

			snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
			n = readlink(p, link, sizeof(link) - 1);
			if (n >= 0) {
				link[n] = '\0';
				fprintf(stderr, "  %d -> %s\n", fd, link);
			}
		}
	}
	want_fds = fx->self_fds;
	check = fx->check_fds;
	free(fx);
	assert_int_equal(status, 0);
	if (check)
		assert_int_equal(fds, want_fds);
	return 0;
}

/* ---- children ------------------------------------------------------------ */

pid_t util_spawn(const struct daemon_proc *d, util_child_fn fn, void *arg)
{
	pid_t pid;

	/* Buffered output would be written twice, once by each process. */
	fflush(NULL);
	pid = harness_fork();
	if (pid < 0)
		fail_msg("fork: %s", strerror(errno));
	if (pid == 0) {
		alarm(120); /* a hung child must not hang the suite */
		_exit(fn(d, arg));
	}
	for (int i = 0; i < UTIL_MAX_CHILDREN; i++)
		if (!children[i]) {
			children[i] = pid;
			break;
		}
	return pid;
}

int util_wait(pid_t pid)
{
	int st = harness_wait(pid);

	child_forget(pid);
	return st;
}

int util_exited(pid_t pid, int *status)
{
	int st;

	if (waitpid(pid, &st, WNOHANG) != pid)
		return 0;
	*status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	child_forget(pid);
	return 1;
}

void util_kill(pid_t pid)
{
	kill(pid, SIGKILL);
	harness_wait(pid);
	child_forget(pid);
}

/* ---- other uids ------------------------------------------------------------ */

int util_become(uid_t uid, gid_t gid)
{
	pid_t parent = getppid();

	if (setgroups(0, NULL) || setresgid(gid, gid, gid) ||
	    setresuid(uid, uid, uid))
		return -1;
	/* New credentials clear both: die with the test, as before, and let
	 * the test read /proc/PID of this process. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	prctl(PR_SET_DUMPABLE, 1);
	if (getppid() != parent || geteuid() != uid || getegid() != gid)
		return -1;
	/* Gone for good, not only set aside. */
	return setresuid(0, 0, 0) == 0 ? -1 : 0;
}

int util_can_switch_uids(void)
{
	static int known = -1;
	pid_t pid;

	if (known >= 0)
		return known;
	if (geteuid() != 0)
		return known = 0;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return known = 0;
	if (pid == 0)
		_exit(util_become(UTIL_UID_A, UTIL_UID_A) ? 1 : 0);
	return known = harness_wait(pid) == 0;
}

struct as_uid {
	uid_t uid;
	gid_t gid;
	util_child_fn fn;
	void *arg;
};

static int as_uid_main(const struct daemon_proc *d, void *arg)
{
	const struct as_uid *a = arg;

	if (util_become(a->uid, a->gid))
		CHILD_FAIL("cannot become uid %u gid %u: %s", (unsigned)a->uid,
			   (unsigned)a->gid, strerror(errno));
	return a->fn(d, a->arg);
}

pid_t util_spawn_as(const struct daemon_proc *d, uid_t uid, gid_t gid,
		    util_child_fn fn, void *arg)
{
	/* The child has its copy from the fork. */
	struct as_uid a = { uid, gid, fn, arg };

	if (uid == geteuid())
		return util_spawn(d, fn, arg);
	return util_spawn(d, as_uid_main, &a);
}

dlshare_client *util_child_connect(const struct daemon_proc *d)
{
	dlshare_connect_opts o = { .size = sizeof(o) };
	dlshare_client *c = NULL;

	/* A daemon under valgrind answers slower than the default allows. */
	o.timeout_ms = harness_ms(DLSHARE_CONNECT_TIMEOUT_MS);
	CHILD_OK(dlshare_connect_ex(d->sock, &o, &c));
	return c;
}

/* ---- data ------------------------------------------------------------------ */

size_t util_nbytes(DLDataType dt, int ndim, const int64_t *shape)
{
	size_t n = (size_t)dt.bits / 8 * dt.lanes;

	for (int i = 0; i < ndim; i++)
		n *= (size_t)shape[i];
	return n;
}

int util_store(dlshare_client *c, const char *name, DLDataType dt, int ndim,
	       const int64_t *shape, uint32_t seed, uint64_t *version)
{
	dlshare_tensor_spec spec = {
		.key = NULL, .dtype = dt, .ndim = ndim, .shape = shape,
	};
	dlshare_writer *w;
	DLTensor *t;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, NULL, &w)))
		return err;
	t = dlshare_writer_tensor(w, 0);
	if (t->data)
		harness_fill((char *)t->data + t->byte_offset,
			     util_nbytes(dt, ndim, shape), seed);
	return dlshare_seal(w, NULL, version);
}

/* Deleters counted per slot; a slot outlives its tensor, and a new tensor
 * at a recycled address gets a new slot. */
#define TRACK_MAX 1024

static struct {
	DLManagedTensor *t;
	void (*orig)(DLManagedTensor *);
	atomic_int runs;
} tracked[TRACK_MAX];
static int ntracked;
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;

static void tracked_deleter(DLManagedTensor *t)
{
	void (*orig)(DLManagedTensor *) = NULL;
	int slot = -1;

	pthread_mutex_lock(&track_lock);
	for (int i = ntracked - 1; i >= 0; i--)
		if (tracked[i].t == t && atomic_load(&tracked[i].runs) == 0) {
			slot = i;
			break;
		}
	if (slot < 0) /* a second run: count it against the newest */
		for (int i = ntracked - 1; i >= 0 && slot < 0; i--)
			if (tracked[i].t == t)
				slot = i;
	if (slot >= 0) {
		orig = tracked[slot].orig;
		atomic_fetch_add(&tracked[slot].runs, 1);
	}
	pthread_mutex_unlock(&track_lock);
	/* A second run must not free twice: the count is the evidence. */
	if (orig && atomic_load(&tracked[slot].runs) == 1)
		orig(t);
}

int util_track(DLManagedTensor *t)
{
	int slot = -1;

	pthread_mutex_lock(&track_lock);
	if (ntracked < TRACK_MAX) {
		slot = ntracked++;
		tracked[slot].t = t;
		tracked[slot].orig = t->deleter;
		atomic_store(&tracked[slot].runs, 0);
		t->deleter = tracked_deleter;
	}
	pthread_mutex_unlock(&track_lock);
	return slot;
}

int util_deleted(int slot)
{
	return slot >= 0 && slot < TRACK_MAX ?
	       atomic_load(&tracked[slot].runs) : -1;
}

int util_wait_deleted(int slot, int want)
{
	int n = util_deleted(slot);

	for (int waited = 0; n != want && waited <= harness_ms(5000);
	     waited += 5) {
		util_sleep_ms(5);
		n = util_deleted(slot);
	}
	return n;
}

int util_export(dlshare_client *c, const char *name, DLDataType dt, int ndim,
		const int64_t *shape, uint32_t seed, uint64_t *version,
		int *slot)
{
	dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_NO_COPY };
	DLManagedTensor *t;
	int err, s = -1;

	if ((err = dlshare_host_alloc(dt, ndim, shape, &t)))
		return err;
	harness_fill(t->dl_tensor.data, util_nbytes(dt, ndim, shape), seed);
	if (slot)
		*slot = s = util_track(t);
	err = dlshare_publish(c, name, &t, 1, &o, version);
	if (err) {
		/* Still ours. */
		t->deleter(t);
		if (s >= 0)
			atomic_store(&tracked[s].runs, 0);
	}
	return err;
}

int util_check(const DLTensor *t, DLDataType dt, int ndim,
	       const int64_t *shape, uint32_t seed)
{
	size_t n = util_nbytes(dt, ndim, shape);
	uint8_t *want;
	const uint8_t *have;

	if (!t) {
		fprintf(stderr, "util_check: no tensor\n");
		return 1;
	}
	if (t->device.device_type != kDLCPU || t->dtype.code != dt.code ||
	    t->dtype.bits != dt.bits || t->dtype.lanes != dt.lanes ||
	    t->ndim != ndim || t->strides) {
		fprintf(stderr, "util_check: device %d dtype %u:%u:%u ndim %d "
			"strides %p; want dtype %u:%u:%u ndim %d\n",
			(int)t->device.device_type, t->dtype.code,
			t->dtype.bits, t->dtype.lanes, (int)t->ndim,
			(void *)t->strides, dt.code, dt.bits, dt.lanes, ndim);
		return 1;
	}
	for (int i = 0; i < ndim; i++)
		if (t->shape[i] != shape[i]) {
			fprintf(stderr, "util_check: shape[%d] %lld, want %lld\n",
				i, (long long)t->shape[i], (long long)shape[i]);
			return 1;
		}
	if (n == 0)
		return 0;
	if (!t->data) {
		fprintf(stderr, "util_check: data NULL for %zu bytes\n", n);
		return 1;
	}
	want = malloc(n);
	if (!want)
		return 1;
	harness_fill(want, n, seed);
	have = (const uint8_t *)t->data + t->byte_offset;
	if (memcmp(have, want, n)) {
		size_t i = 0;

		while (have[i] == want[i])
			i++;
		fprintf(stderr, "util_check: byte %zu of %zu is %u, want %u "
			"(seed %u)\n", i, n, have[i], want[i], seed);
		free(want);
		return 1;
	}
	free(want);
	return 0;
}

int util_get_check(dlshare_client *c, const char *name,
		   const dlshare_get_opts *opts, DLDataType dt, int ndim,
		   const int64_t *shape, uint32_t seed, uint64_t *version)
{
	dlshare_bundle *b;
	int err;

	if ((err = dlshare_get(c, name, opts, &b)))
		return err;
	if (version)
		*version = dlshare_bundle_version(b);
	err = util_check(dlshare_bundle_tensor(b, 0), dt, ndim, shape, seed);
	dlshare_bundle_free(b);
	return err;
}

/* ---- handshakes ------------------------------------------------------------- */

int util_post(dlshare_client *c, const char *name, int64_t value)
{
	/* A 0-d tensor needs no shape; pass one anyway, so that a
	 * handshake never depends on the NULL-shape path (test_e2e tests
	 * that one on its own). */
	static const int64_t none[1] = { 0 };
	dlshare_tensor_spec spec = { .dtype = DT_I64, .ndim = 0, .shape = none };
	dlshare_writer *w;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, NULL, &w)))
		return err;
	memcpy(dlshare_writer_tensor(w, 0)->data, &value, sizeof(value));
	return dlshare_seal(w, NULL, NULL);
}

int64_t util_await(dlshare_client *c, const char *name, uint64_t after,
		   int timeout_ms, int64_t *value)
{
	dlshare_get_opts o = {
		.select = DLSHARE_NEWER_THAN, .version = after,
		.timeout_ms = timeout_ms,
	};
	dlshare_bundle *b;
	int64_t v;
	int err;

	if ((err = dlshare_get(c, name, &o, &b)))
		return err;
	v = (int64_t)dlshare_bundle_version(b);
	if (value)
		memcpy(value, dlshare_bundle_tensor(b, 0)->data, sizeof(*value));
	dlshare_bundle_free(b);
	return v;
}

int util_await_name(dlshare_client *c, const char *name, int timeout_ms)
{
	dlshare_name_info info;
	int err;

	for (int waited = 0;; waited += 5) {
		err = dlshare_stat(c, name, &info, NULL);
		if (err != DLSHARE_ENOENT || waited >= timeout_ms)
			return err;
		util_sleep_ms(5);
	}
}

/* ---- counters ------------------------------------------------------------------ */

static int want_match(const struct util_want *w, const dlshare_stats *s)
{
	return (w->connections < 0 || s->connections == (uint64_t)w->connections) &&
	       (w->names < 0 || s->names == (uint64_t)w->names) &&
	       (w->versions < 0 || s->versions == (uint64_t)w->versions) &&
	       (w->leases < 0 || s->leases == (uint64_t)w->leases) &&
	       (w->buffers < 0 || s->buffers == (uint64_t)w->buffers) &&
	       (w->bytes < 0 || s->bytes == (uint64_t)w->bytes) &&
	       (w->parked < 0 || s->parked == (uint64_t)w->parked);
}

int util_wait_want(dlshare_client *c, const struct util_want *w,
		   dlshare_stats *last)
{
	dlshare_stats s = { 0 };

	for (int waited = 0; waited <= harness_ms(5000); waited += 5) {
		if (dlshare_stats_get(c, &s) == 0 && want_match(w, &s)) {
			if (last)
				*last = s;
			return 0;
		}
		util_sleep_ms(5);
	}
	if (last)
		*last = s;
	return -1;
}

void util_assert_want(dlshare_client *c, const struct util_want *w)
{
	dlshare_stats s;

	if (util_wait_want(c, w, &s))
		fail_msg("daemon counters: connections %llu names %llu "
			 "versions %llu leases %llu buffers %llu bytes %llu "
			 "parked %llu; wanted %lld %lld %lld %lld %lld %lld %lld "
			 "(-1: any)",
			 (unsigned long long)s.connections,
			 (unsigned long long)s.names,
			 (unsigned long long)s.versions,
			 (unsigned long long)s.leases,
			 (unsigned long long)s.buffers,
			 (unsigned long long)s.bytes,
			 (unsigned long long)s.parked,
			 (long long)w->connections, (long long)w->names,
			 (long long)w->versions, (long long)w->leases,
			 (long long)w->buffers, (long long)w->bytes,
			 (long long)w->parked);
}

void util_channel_open(dlshare_client *c)
{
	for (int i = 0; i < 64; i++) {
		dlshare_bundle *b = NULL;

		assert_int_equal(dlshare_get(c, "util/channel/none", NULL, &b),
				 DLSHARE_ENOENT);
	}
}

dlshare_stats util_stats(dlshare_client *c)
{
	dlshare_stats s;
	int err = dlshare_stats_get(c, &s);

	if (err)
		fail_msg("stats: %s", dlshare_strerror(err));
	return s;
}

void util_limit_hits(dlshare_client *c, struct util_hits *h)
{
	static const char fam[] = "dlshare_limit_hits_total{limit=\"";
	char *text = NULL, *p;
	size_t len;
	int err = dlshare_metrics(c, &text, &len);

	if (err)
		fail_msg("metrics: %s", dlshare_strerror(err));
	h->n = 0;
	for (p = text; (p = strstr(p, fam)); ) {
		char *end;

		p += sizeof(fam) - 1;
		end = strchr(p, '"');
		if (!end || h->n == UTIL_HITS_MAX ||
		    (size_t)(end - p) >= sizeof(h->label[0]) ||
		    strncmp(end, "\"} ", 3) != 0) {
			free(text);
			fail_msg("a dlshare_limit_hits_total sample that does "
				 "not parse");
		}
		memcpy(h->label[h->n], p, (size_t)(end - p));
		h->label[h->n][end - p] = '\0';
		h->value[h->n++] = strtoull(end + 3, &p, 10);
	}
	free(text);
}

uint64_t util_hits_of(const struct util_hits *h, const char *label)
{
	for (size_t i = 0; i < h->n; i++)
		if (!strcmp(h->label[i], label))
			return h->value[i];
	fail_msg("no dlshare_limit_hits_total row for %s", label);
	return 0;
}

uint64_t util_hits_sum(const struct util_hits *h)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < h->n; i++)
		sum += h->value[i];
	return sum;
}

int64_t util_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void util_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* ---- raw client ---------------------------------------------------------------- */

#define RAW_MAX (1u << 20)

int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

int raw_send(int fd, Dlshare__Frame *f, const int *fds, unsigned nfds,
	     int flags)
{
	uint8_t *data;
	size_t len;
	int err;

	f->nfds = nfds;
	f->has_nfds = nfds > 0;
	if ((err = wire_encode(f, RAW_MAX, &data, &len)))
		return err;
	err = wire_send(fd, data, len, fds, nfds, flags);
	free(data);
	return err;
}

int raw_send_bytes(int fd, const void *data, size_t len, const int *fds,
		   unsigned nfds)
{
	return wire_send(fd, data, len, fds, nfds, 0);
}

int raw_recv(int fd, int timeout_ms, struct wire_msg **out)
{
	return raw_recv_fd(fd, timeout_ms, out, NULL);
}

int raw_recv_fd(int fd, int timeout_ms, struct wire_msg **out, int *keep)
{
	unsigned nfds;

	return raw_recv_count(fd, timeout_ms, out, &nfds, keep);
}

int raw_recv_count(int fd, int timeout_ms, struct wire_msg **out,
		   unsigned *count, int *keep)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint8_t *buf;
	int fds[WIRE_FDS_MAX];
	unsigned nfds = 0;
	size_t len = 0;
	int err;

	*out = NULL;
	*count = 0;
	if (keep)
		*keep = -1;
	err = poll(&p, 1, timeout_ms);
	if (err < 0)
		return -errno;
	if (err == 0)
		return -ETIMEDOUT;
	buf = malloc(RAW_MAX);
	if (!buf)
		return -ENOMEM;
	err = wire_recv(fd, buf, RAW_MAX, fds, WIRE_FDS_MAX, &len, &nfds,
			MSG_DONTWAIT);
	*count = nfds;
	if (err == -ECONNRESET) {
		free(buf);
		return 1;
	}
	if (err) {
		free(buf);
		return err;
	}
	if (len == 0) {
		wire_close_fds(fds, nfds);
		free(buf);
		return 1;
	}
	err = wire_decode(buf, len, out);
	free(buf);
	if (!err && keep && nfds > 0) {
		*keep = fds[0];
		fds[0] = -1;
	}
	wire_close_fds(fds, nfds);
	return err;
}

int raw_hello(int fd)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	struct wire_msg *m = NULL;
	int ok;

	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = "raw test client";
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	f.id = 1;
	if (raw_call(fd, &f, NULL, 0, &m))
		return -1;
	ok = m->frame->body_case == DLSHARE__FRAME__BODY_HELLO_REPLY;
	wire_msg_free(m);
	return ok ? 0 : -1;
}

int raw_call(int fd, Dlshare__Frame *req, const int *fds, unsigned nfds,
	     struct wire_msg **out)
{
	int err = raw_send(fd, req, fds, nfds, 0);

	*out = NULL;
	if (err)
		return err;
	for (;;) {
		struct wire_msg *m;

		err = raw_recv(fd, harness_ms(5000), &m);
		if (err)
			return err;
		if (m->frame->id == req->id) {
			*out = m;
			return 0;
		}
		wire_msg_free(m);
	}
}

int raw_expect_hangup(int fd, int timeout_ms, int *code)
{
	int64_t end = util_now_ms() + timeout_ms;

	if (code)
		*code = 0;
	for (;;) {
		int64_t left = end - util_now_ms();
		struct wire_msg *m;
		int err;

		if (left < 0)
			return -ETIMEDOUT;
		err = raw_recv(fd, (int)left, &m);
		if (err == 1)
			return 0;
		if (err == -ETIMEDOUT)
			return err;
		if (err < 0)
			return 0; /* a reset is a hang-up too */
		if (code && m->frame->body_case == DLSHARE__FRAME__BODY_ERROR)
			*code = m->frame->error->code;
		wire_msg_free(m);
	}
}

int raw_memfd(uint64_t size, int seals)
{
	int fd = memfd_create("dlshare-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    (seals && fcntl(fd, F_ADD_SEALS, seals) < 0)) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

/* ---- programs ---------------------------------------------------------------------- */

static int redirect(const char *path, int target, int flags)
{
	int fd = open(path ? path : "/dev/null", flags, 0600);

	if (fd < 0)
		return -1;
	if (fd != target) {
		dup2(fd, target);
		close(fd);
	}
	return 0;
}

int util_run(const char *const *argv, const char *in_path,
	     const char *out_path, const char *err_path)
{
	pid_t pid;
	int st;

	fflush(NULL);
	pid = harness_fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		if (redirect(in_path, 0, O_RDONLY) ||
		    redirect(out_path, 1, O_WRONLY | O_CREAT | O_TRUNC) ||
		    redirect(err_path, 2, O_WRONLY | O_CREAT | O_TRUNC))
			_exit(126);
		for (int i = 3; i < 1024; i++)
			close(i);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	st = harness_wait(pid);
	return st;
}

char *util_slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0, cap = 0;

	if (!f)
		return NULL;
	for (;;) {
		size_t got;

		if (cap - n < 4096) {
			char *nb = realloc(buf, cap + 65536 + 1);

			if (!nb) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = nb;
			cap += 65536;
		}
		got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (got == 0)
			break;
	}
	fclose(f);
	if (!buf)
		buf = malloc(1);
	if (buf)
		buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}
