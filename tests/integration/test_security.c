/* test_security — the daemon against peers it must not trust, through the
 * real daemon and real processes: uids without rights (children drop to
 * other uids when the test runs as root), per-uid quotas, a peer that never
 * says Hello, hundreds of clients SIGKILLed while they hold leases, thousands
 * of connect/close cycles, and Publish packets full of fds of the wrong
 * kind. After each: the daemon answers a normal client, and its fd count
 * and counters are back where they were.
 *
 * Cross-uid tests need root (setresuid); without it they print
 * "SKIP: needs root to switch uids", and the quota tests check the one uid
 * they have. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "skip.h"
#include "util.h"

/* Users and groups the children become; nobody needs to exist in
 * /etc/passwd for the kernel. */
#define UID_A 23456u
#define UID_B 23457u
#define UID_C 23458u
#define GID_G 23456u /* A's primary group */
#define GID_H 23458u
#define NO_GROUP ((gid_t)-1)

static const int64_t shape16[1] = { 16 }; /* 64 bytes of float32 */

static int teardown(void **state)
{
	return util_teardown(state);
}

/* ---- switching uids ------------------------------------------------------------- */

/* In a child: becomes uid/gid with at most one supplementary group.
 * Returns 0 or -1. */
static int drop_privileges(uid_t uid, gid_t gid, gid_t supp)
{
	pid_t parent = getppid();

	if (supp == NO_GROUP ? setgroups(0, NULL) : setgroups(1, &supp))
		return -1;
	if (setresgid(gid, gid, gid) || setresuid(uid, uid, uid))
		return -1;
	/* A change of credentials clears both: keep dying with the test,
	 * and keep /proc/self readable. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	prctl(PR_SET_DUMPABLE, 1);
	if (getppid() != parent)
		return -1;
	if (getuid() != uid || geteuid() != uid || getgid() != gid ||
	    getegid() != gid)
		return -1;
	/* Really gone, not only set aside. */
	if (setresuid(0, 0, 0) == 0)
		return -1;
	return 0;
}

/* 1 when this process may run children as other uids. */
static int can_switch_uids(void)
{
	static int cached = -1;
	pid_t pid;
	int st;

	if (cached >= 0)
		return cached;
	if (geteuid() != 0)
		return cached = 0;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return cached = 0;
	if (pid == 0)
		_exit(drop_privileges(UID_A, GID_G, NO_GROUP) ? 1 : 0);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	cached = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	return cached;
}

#define NEED_ROOT()                                                           \
	do {                                                                  \
		if (!can_switch_uids())                                       \
			test_skip("needs root to switch uids");               \
	} while (0)

struct as_user {
	uid_t uid;
	gid_t gid, supp;
	util_child_fn fn;
	void *arg;
};

static int as_user_main(const struct daemon_proc *d, void *arg)
{
	const struct as_user *u = arg;

	if (drop_privileges(u->uid, u->gid, u->supp))
		CHILD_FAIL("cannot become uid %u gid %u: %s", (unsigned)u->uid,
			   (unsigned)u->gid, strerror(errno));
	return u->fn(d, u->arg);
}

/* util_spawn, the child running fn as uid/gid (supp: a supplementary
 * group, or NO_GROUP). The struct lives on our stack; the child has its
 * copy from the fork. */
static pid_t spawn_as(const struct daemon_proc *d, uid_t uid, gid_t gid,
		      gid_t supp, util_child_fn fn, void *arg)
{
	struct as_user u = { uid, gid, supp, fn, arg };

	return util_spawn(d, as_user_main, &u);
}

static int run_as(const struct daemon_proc *d, uid_t uid, gid_t gid,
		  gid_t supp, util_child_fn fn, void *arg)
{
	return util_wait(spawn_as(d, uid, gid, supp, fn, arg));
}

/* ---- small helpers -------------------------------------------------------------- */

/* Open fds of this process, without /proc (which a process that changed
 * its uid may not read). */
static int own_fds(void)
{
	int n = 0;

	for (int fd = 0; fd < 4096; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

/* Store mode, one float32 tensor of n elements filled with seed, with a
 * mode (0: the daemon's default). */
static int store_n(dlshare_client *c, const char *name, int64_t n,
		   uint32_t mode, uint32_t seed, uint64_t *version)
{
	int64_t sh[1] = { n };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = sh };
	dlshare_create_opts o = { .device = { kDLCPU, 0 }, .mode = mode };
	dlshare_writer *w;
	int err;

	if ((err = dlshare_create(c, name, &spec, 1, &o, &w)))
		return err;
	harness_fill(dlshare_writer_tensor(w, 0)->data, (size_t)n * 4, seed);
	return dlshare_seal(w, NULL, version);
}

static int store_mode(dlshare_client *c, const char *name, uint32_t mode,
		      uint32_t seed, uint64_t *version)
{
	return store_n(c, name, 16, mode, seed, version);
}

/* Export mode (shareable memory, no copy) with a mode. */
static int export_mode(dlshare_client *c, const char *name, uint32_t mode,
		       uint32_t seed)
{
	dlshare_publish_opts o = { .mode = mode,
				   .flags = DLSHARE_PUBLISH_NO_COPY };
	DLManagedTensor *t;
	int err;

	if ((err = dlshare_host_alloc(DT_F32, 1, shape16, &t)))
		return err;
	harness_fill(t->dl_tensor.data, 64, seed);
	err = dlshare_publish(c, name, &t, 1, &o, NULL);
	if (err)
		t->deleter(t);
	return err;
}

static void plain_free(DLManagedTensor *t)
{
	free(t->dl_tensor.data);
	free(t);
}

/* Publish of plain malloc memory of bytes uint8: the library copies it
 * into a daemon-owned buffer. */
static int copy_publish(dlshare_client *c, const char *name, int64_t *bytes,
			uint32_t mode)
{
	dlshare_publish_opts o = { .mode = mode };
	DLManagedTensor *t = calloc(1, sizeof(*t));
	int err;

	if (!t)
		return DLSHARE_ENOMEM;
	t->dl_tensor.data = calloc(1, (size_t)bytes[0] + 1);
	t->dl_tensor.device.device_type = kDLCPU;
	t->dl_tensor.dtype = DT_U8;
	t->dl_tensor.ndim = 1;
	t->dl_tensor.shape = bytes;
	t->deleter = plain_free;
	err = dlshare_publish(c, name, &t, 1, &o, NULL);
	if (err)
		plain_free(t);
	return err;
}

struct names {
	char buf[16384];
	size_t len;
};

static int collect(const dlshare_name_info *info, void *arg)
{
	struct names *ns = arg;
	size_t n = strlen(info->name);

	if (ns->len + n + 2 < sizeof(ns->buf)) {
		memcpy(ns->buf + ns->len, info->name, n);
		ns->len += n;
		ns->buf[ns->len++] = '\n';
		ns->buf[ns->len] = '\0';
	}
	return 0;
}

/* 1 when ls (all names) shows name, 0 when not, or a dlshare code. */
static int listed(dlshare_client *c, const char *name)
{
	struct names ns = { .buf = "\n", .len = 1 };
	char want[300];
	int err = dlshare_list(c, NULL, collect, &ns);

	if (err)
		return err;
	snprintf(want, sizeof(want), "\n%s\n", name);
	return strstr(ns.buf, want) != NULL;
}

/* 1 when the last error this thread got names the limit. */
static int says(const char *what)
{
	return strstr(dlshare_last_error(), what) != NULL;
}

/* ---- raw frames ------------------------------------------------------------------- */

#define RAW_OTHER 100   /* a reply of another kind */
#define RAW_HANGUP 101  /* the daemon hung up */
#define RAW_FAILED 102  /* sending or receiving failed */

/* Waits for the answer to id (pushes skipped). Returns 0 for a success
 * reply, the Error's code, or RAW_*; *nfds counts the fds it carried. */
static int raw_answer(int sock, uint64_t id, unsigned *nfds, int *keep)
{
	for (;;) {
		struct wire_msg *m;
		int err = raw_recv_count(sock, harness_ms(10000), &m, nfds, keep);
		int ret;

		if (err == 1)
			return RAW_HANGUP;
		if (err)
			return RAW_FAILED;
		if (m->frame->id != id) {
			if (keep && *keep >= 0)
				close(*keep);
			wire_msg_free(m);
			continue;
		}
		switch (m->frame->body_case) {
		case DLSHARE__FRAME__BODY_ERROR:
			ret = m->frame->error->code;
			break;
		case DLSHARE__FRAME__BODY_GET_REPLY:
		case DLSHARE__FRAME__BODY_PUBLISH_REPLY:
		case DLSHARE__FRAME__BODY_CREATE_REPLY:
		case DLSHARE__FRAME__BODY_STATS_REPLY:
			ret = 0;
			break;
		default:
			ret = RAW_OTHER;
		}
		wire_msg_free(m);
		return ret;
	}
}

static int raw_send_get(int sock, uint64_t id, const char *name,
			uint32_t timeout_ms)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;

	g.name = (char *)name;
	if (timeout_ms) {
		g.has_timeout_ms = 1;
		g.timeout_ms = timeout_ms;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	return raw_send(sock, &f, NULL, 0, 0);
}

/* A raw Get that does not wait. Returns as raw_answer. */
static int raw_get(int sock, uint64_t id, const char *name, unsigned *nfds,
		   int *keep)
{
	if (raw_send_get(sock, id, name, 0))
		return RAW_FAILED;
	return raw_answer(sock, id, nfds, keep);
}

/* Seal (abort 0) or Abort (abort 1) of version 1 of name, by name and
 * number. Returns as raw_answer. */
static int raw_end(int sock, uint64_t id, int abort, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal s = DLSHARE__SEAL__INIT;
	Dlshare__Abort a = DLSHARE__ABORT__INIT;
	unsigned nfds;

	f.id = id;
	if (abort) {
		a.name = (char *)name;
		a.version = 1;
		f.body_case = DLSHARE__FRAME__BODY_ABORT;
		f.abort = &a;
	} else {
		s.name = (char *)name;
		s.version = 1;
		f.body_case = DLSHARE__FRAME__BODY_SEAL;
		f.seal = &s;
	}
	if (raw_send(sock, &f, NULL, 0, 0))
		return RAW_FAILED;
	return raw_answer(sock, id, &nfds, NULL);
}

static int raw_stats_ok(int sock, uint64_t id)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	unsigned nfds;

	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	if (raw_send(sock, &f, NULL, 0, 0))
		return -1;
	return raw_answer(sock, id, &nfds, NULL) == 0 ? 0 : -1;
}

/* A Create or Publish of n buffers of size bytes, tensor i a float32[16]
 * in buffer i; every buffer of a Publish says fd_attached. */
#define VF_MAX 64
struct vframe {
	Dlshare__Frame f;
	Dlshare__Create cr;
	Dlshare__Publish pu;
	Dlshare__Tensor t[VF_MAX], *tp[VF_MAX];
	Dlshare__DataType dt;
	Dlshare__Buffer b[VF_MAX], *bp[VF_MAX];
	Dlshare__Device dev;
	int64_t sh[1];
};

static void vframe_init(struct vframe *v, uint64_t id, int publish,
			const char *name, unsigned n, uint64_t size)
{
	memset(v, 0, sizeof(*v));
	dlshare__frame__init(&v->f);
	dlshare__create__init(&v->cr);
	dlshare__publish__init(&v->pu);
	dlshare__data_type__init(&v->dt);
	dlshare__device__init(&v->dev);
	v->dt.code = kDLFloat;
	v->dt.bits = 32;
	v->dt.lanes = 1;
	v->dev.type = kDLCPU;
	v->sh[0] = 16;
	for (unsigned i = 0; i < n; i++) {
		dlshare__tensor__init(&v->t[i]);
		v->t[i].dtype = &v->dt;
		v->t[i].buffer = i;
		v->t[i].n_shape = 1;
		v->t[i].shape = v->sh;
		v->tp[i] = &v->t[i];
		dlshare__buffer__init(&v->b[i]);
		v->b[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		v->b[i].size = size;
		v->b[i].device = &v->dev;
		if (publish) {
			v->b[i].has_fd_attached = 1;
			v->b[i].fd_attached = 1;
		}
		v->bp[i] = &v->b[i];
	}
	v->f.id = id;
	if (publish) {
		v->pu.name = (char *)name;
		v->pu.n_tensors = n;
		v->pu.tensors = v->tp;
		v->pu.n_buffers = n;
		v->pu.buffers = v->bp;
		v->f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
		v->f.publish = &v->pu;
	} else {
		v->cr.name = (char *)name;
		v->cr.n_tensors = n;
		v->cr.tensors = v->tp;
		v->cr.n_buffers = n;
		v->cr.buffers = v->bp;
		v->f.body_case = DLSHARE__FRAME__BODY_CREATE;
		v->f.create = &v->cr;
	}
}

/* A well-behaved client in its own process. */
static int good_client(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t sh[1] = { 100 };
	char name[64];

	(void)arg;
	snprintf(name, sizeof(name), "good/%d", (int)getpid());
	CHILD_OK(util_store(c, name, DT_F32, 1, sh, 42, NULL));
	CHILD_OK(util_get_check(c, name, NULL, DT_F32, 1, sh, 42, NULL));
	CHILD_OK(dlshare_delete(c, name));
	dlshare_disconnect(c);
	return 0;
}

static void assert_good_client(struct fixture *fx)
{
	assert_int_equal(util_wait(util_spawn(&fx->d, good_client, NULL)), 0);
}

/* ==== 1. ACL across uids ========================================================== */

static int setup_acl(void **state)
{
	return util_setup_open(state, NULL);
}

/* A stranger (uid A, not the owner, not in its group) against root's
 * names: acl/priv 0600, acl/pub 0644, acl/open 0666. */
static int acl_stranger(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts exact = { .select = DLSHARE_EXACT, .version = 1 };
	dlshare_get_opts wait = { .timeout_ms = harness_ms(200) };
	dlshare_name_info info;
	dlshare_bundle *b = NULL;
	DLManagedTensor *m = NULL;
	int64_t bytes[1] = { 64 };
	char said[256];
	unsigned nfds;
	int fds0, sock, keep;
	uint64_t v;

	(void)arg;
	fds0 = own_fds();
	/* No read right: every way of reading is refused, and no fd came. */
	CHILD_ERR(dlshare_get(c, "acl/priv", NULL, &b), DLSHARE_EPERM);
	CHILD_ERR(dlshare_get(c, "acl/priv", &exact, &b), DLSHARE_EPERM);
	CHILD_ERR(dlshare_get(c, "acl/priv", &wait, &b), DLSHARE_EPERM);
	CHILD_ERR(dlshare_get_tensor(c, "acl/priv", NULL, &m), DLSHARE_EPERM);
	CHILD_ERR(dlshare_stat(c, "acl/priv", &info, NULL), DLSHARE_EPERM);
	CHILD_CHECK(own_fds() == fds0);
	/* On the wire: the refusal carries no fd; a readable name does. */
	sock = raw_connect(d->sock);
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	CHILD_CHECK(raw_get(sock, 10, "acl/priv", &nfds, NULL) == DLSHARE_EPERM);
	CHILD_CHECK(nfds == 0);
	CHILD_CHECK(raw_get(sock, 11, "acl/pub", &nfds, &keep) == 0);
	CHILD_CHECK(nfds == 1 && keep >= 0);
	close(keep);
	/* A Seal or Abort of a sealed version says so only to a reader: to
	 * anyone else it is a version that does not exist. */
	CHILD_CHECK(raw_end(sock, 12, 0, "acl/priv") == DLSHARE_ENOENT);
	CHILD_CHECK(raw_end(sock, 13, 1, "acl/priv") == DLSHARE_ENOENT);
	CHILD_CHECK(raw_end(sock, 14, 0, "acl/pub") == DLSHARE_ESTATE);
	CHILD_CHECK(raw_end(sock, 15, 1, "acl/pub") == DLSHARE_ESTATE);
	close(sock);

	/* ls shows what it may read, and only that. */
	CHILD_CHECK(listed(c, "acl/pub") == 1);
	CHILD_CHECK(listed(c, "acl/open") == 1);
	CHILD_CHECK(listed(c, "acl/priv") == 0);

	/* 0644: it reads, but may neither delete nor publish over it. */
	CHILD_OK(util_get_check(c, "acl/pub", NULL, DT_F32, 1, shape16, 2, NULL));
	CHILD_ERR(dlshare_delete(c, "acl/pub"), DLSHARE_EPERM);
	CHILD_ERR(store_mode(c, "acl/pub", 0, 20, NULL), DLSHARE_EPERM);
	/* Whose it is, its mode, and who was refused (test_errors has the
	 * whole message). */
	snprintf(said, sizeof(said), "owned by uid 0 (gid 0) with mode 0644, "
		 "which does not let uid %u (gid %u) write it", UID_A, GID_G);
	if (!strstr(dlshare_last_error(), said))
		CHILD_FAIL("refusal said \"%s\"", dlshare_last_error());
	CHILD_ERR(store_mode(c, "acl/pub", 0666, 20, NULL), DLSHARE_EPERM);
	CHILD_ERR(export_mode(c, "acl/pub", 0, 21), DLSHARE_EPERM);
	CHILD_ERR(copy_publish(c, "acl/pub", bytes, 0), DLSHARE_EPERM);
	CHILD_ERR(dlshare_delete(c, "acl/priv"), DLSHARE_EPERM);
	CHILD_ERR(store_mode(c, "acl/priv", 0, 22, NULL), DLSHARE_EPERM);
	CHILD_ERR(export_mode(c, "acl/priv", 0, 23), DLSHARE_EPERM);

	/* 0666: anyone writes, but only the owner sets the mode. */
	CHILD_OK(store_mode(c, "acl/open", 0600, 30, &v));
	CHILD_CHECK(v == 2);
	CHILD_OK(dlshare_stat(c, "acl/open", &info, NULL));
	if (info.mode != 0666 || info.owner_uid != 0)
		CHILD_FAIL("a non-owner changed acl/open: mode %o owner %u",
			   info.mode, info.owner_uid);
	CHILD_OK(util_get_check(c, "acl/open", NULL, DT_F32, 1, shape16, 30,
				NULL));

	/* A name of its own, closed to everyone else, root included. */
	CHILD_OK(store_mode(c, "acl/mine", 0600, 40, NULL));
	CHILD_OK(dlshare_stat(c, "acl/mine", &info, NULL));
	CHILD_CHECK(info.owner_uid == UID_A && info.mode == 0600);
	CHILD_CHECK(own_fds() == fds0);
	dlshare_disconnect(c);
	return 0;
}

struct try_read {
	const char *name;
	int want;      /* 0 or DLSHARE_EPERM */
	uint32_t seed;
};

/* Reads name (get, stat, ls) and checks the answer is t->want. */
static int try_read(const struct daemon_proc *d, void *arg)
{
	const struct try_read *t = arg;
	dlshare_client *c = util_child_connect(d);
	dlshare_name_info info;
	int fds0 = own_fds(), err;

	err = util_get_check(c, t->name, NULL, DT_F32, 1, shape16, t->seed,
			     NULL);
	if (err != t->want)
		CHILD_FAIL("get %s as uid %u gid %u: %d (%s), want %d", t->name,
			   (unsigned)getuid(), (unsigned)getgid(), err,
			   dlshare_strerror(err), t->want);
	err = dlshare_stat(c, t->name, &info, NULL);
	if (err != t->want)
		CHILD_FAIL("stat %s: %d, want %d", t->name, err, t->want);
	CHILD_CHECK(listed(c, t->name) == (t->want == 0));
	CHILD_CHECK(own_fds() == fds0);
	dlshare_disconnect(c);
	return 0;
}

/* A stranger's gets wait for names that do not exist yet; the names come
 * with mode 0600 (and one with 0644). */
static int acl_parked(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = { .timeout_ms = harness_ms(20000) };
	dlshare_bundle *b = NULL;
	int sock = raw_connect(d->sock), fds0, keep;
	unsigned nfds;

	(void)arg;
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	CHILD_CHECK(raw_send_get(sock, 5, "acl/later.raw",
				 (uint32_t)harness_ms(20000)) == 0);
	CHILD_CHECK(raw_send_get(sock, 6, "acl/later.ok",
				 (uint32_t)harness_ms(20000)) == 0);
	fds0 = own_fds();
	CHILD_ERR(dlshare_get(c, "acl/later", &o, &b), DLSHARE_EPERM);
	CHILD_CHECK(own_fds() == fds0);
	CHILD_CHECK(raw_answer(sock, 5, &nfds, NULL) == DLSHARE_EPERM);
	CHILD_CHECK(nfds == 0);
	CHILD_CHECK(raw_answer(sock, 6, &nfds, &keep) == 0);
	CHILD_CHECK(nfds == 1);
	close(keep);
	close(sock);
	dlshare_disconnect(c);
	return 0;
}

static void acl_modes(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	dlshare_name_info info;
	dlshare_bundle *b;
	struct util_want w = UTIL_ANY;
	pid_t p;

	NEED_ROOT();
	c = harness_connect(&fx->d);
	assert_int_equal(store_mode(c, "acl/priv", 0600, 1, NULL), 0);
	assert_int_equal(store_mode(c, "acl/pub", 0644, 2, NULL), 0);
	assert_int_equal(store_mode(c, "acl/open", 0666, 3, NULL), 0);
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, acl_stranger,
				NULL), 0);

	/* What the stranger could not do did not happen. */
	assert_int_equal(util_get_check(c, "acl/pub", NULL, DT_F32, 1, shape16,
					2, NULL), 0);
	assert_int_equal(util_get_check(c, "acl/priv", NULL, DT_F32, 1, shape16,
					1, NULL), 0);
	assert_int_equal(dlshare_stat(c, "acl/pub", &info, NULL), 0);
	assert_int_equal(info.latest, 1);
	assert_int_equal(dlshare_stat(c, "acl/open", &info, NULL), 0);
	assert_int_equal(info.mode, 0666);
	assert_int_equal(info.owner_uid, 0);

	/* Root is not special: the stranger's 0600 name is closed to it. */
	assert_int_equal(dlshare_get(c, "acl/mine", NULL, &b), DLSHARE_EPERM);
	assert_int_equal(dlshare_stat(c, "acl/mine", &info, NULL), DLSHARE_EPERM);
	assert_int_equal(dlshare_delete(c, "acl/mine"), DLSHARE_EPERM);
	assert_int_equal(store_mode(c, "acl/mine", 0644, 9, NULL), DLSHARE_EPERM);
	assert_int_equal(listed(c, "acl/mine"), 0);

	/* The owner opens its name by republishing with a new mode, and
	 * closes it again. */
	assert_int_equal(store_mode(c, "acl/priv", 0644, 4, NULL), 0);
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, try_read,
				&(struct try_read){ "acl/priv", 0, 4 }), 0);
	assert_int_equal(store_mode(c, "acl/priv", 0600, 5, NULL), 0);
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, try_read,
				&(struct try_read){ "acl/priv", DLSHARE_EPERM, 5 }), 0);

	/* Parked gets of a stranger meet the mode of the name that comes:
	 * an EPERM, no fd; the readable one gets its fd. */
	p = spawn_as(&fx->d, UID_A, GID_G, NO_GROUP, acl_parked, NULL);
	w.parked = 3;
	util_assert_want(c, &w);
	assert_int_equal(store_mode(c, "acl/later.raw", 0600, 6, NULL), 0);
	assert_int_equal(store_mode(c, "acl/later.ok", 0644, 7, NULL), 0);
	assert_int_equal(store_mode(c, "acl/later", 0600, 8, NULL), 0);
	assert_int_equal(util_wait(p), 0);

	w.parked = 0;
	w.leases = 0;
	w.connections = 1;
	util_assert_want(c, &w);
	dlshare_disconnect(c);
	assert_good_client(fx);
}

/* ---- group bits -------------------------------------------------------------------- */

struct pub_as {
	const char *name;
	uint32_t mode;
	uint32_t seed;
};

static int publish_as(const struct daemon_proc *d, void *arg)
{
	const struct pub_as *p = arg;
	dlshare_client *c = util_child_connect(d);
	dlshare_name_info info;

	CHILD_OK(store_mode(c, p->name, p->mode, p->seed, NULL));
	CHILD_OK(dlshare_stat(c, p->name, &info, NULL));
	CHILD_CHECK(info.mode == p->mode && info.owner_uid == getuid());
	dlshare_disconnect(c);
	return 0;
}

/* uid B, primary group G: A's group. */
static int grp_member(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_name_info info;

	(void)arg;
	CHILD_OK(util_get_check(c, "grp/r", NULL, DT_F32, 1, shape16, 11, NULL));
	CHILD_OK(dlshare_stat(c, "grp/r", &info, NULL));
	CHILD_CHECK(info.owner_uid == UID_A && info.mode == 0640);
	CHILD_CHECK(listed(c, "grp/r") == 1 && listed(c, "grp/w") == 1);
	/* Group read is no group write. */
	CHILD_ERR(store_mode(c, "grp/r", 0, 99, NULL), DLSHARE_EPERM);
	CHILD_ERR(dlshare_delete(c, "grp/r"), DLSHARE_EPERM);
	/* Group write lets it publish, not change the mode. */
	CHILD_OK(store_mode(c, "grp/w", 0600, 13, NULL));
	CHILD_OK(dlshare_stat(c, "grp/w", &info, NULL));
	CHILD_CHECK(info.owner_uid == UID_A && info.mode == 0660);
	dlshare_disconnect(c);
	return 0;
}

/* uid C, primary group H, G only as a supplementary group: only the
 * primary gid counts. */
static int grp_outsider(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b = NULL;
	int fds0 = own_fds();

	(void)arg;
	CHILD_ERR(dlshare_get(c, "grp/r", NULL, &b), DLSHARE_EPERM);
	CHILD_ERR(dlshare_get(c, "grp/w", NULL, &b), DLSHARE_EPERM);
	CHILD_CHECK(listed(c, "grp/r") == 0 && listed(c, "grp/w") == 0);
	CHILD_ERR(store_mode(c, "grp/w", 0, 98, NULL), DLSHARE_EPERM);
	CHILD_ERR(dlshare_delete(c, "grp/w"), DLSHARE_EPERM);
	CHILD_CHECK(own_fds() == fds0);
	dlshare_disconnect(c);
	return 0;
}

static void acl_group(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	dlshare_bundle *b;

	NEED_ROOT();
	c = harness_connect(&fx->d);
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, publish_as,
				&(struct pub_as){ "grp/r", 0640, 11 }), 0);
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, publish_as,
				&(struct pub_as){ "grp/w", 0660, 12 }), 0);
	assert_int_equal(run_as(&fx->d, UID_B, GID_G, NO_GROUP, grp_member,
				NULL), 0);
	assert_int_equal(run_as(&fx->d, UID_C, GID_H, GID_G, grp_outsider,
				NULL), 0);
	/* Root is in neither: the other bits (none) apply. */
	assert_int_equal(dlshare_get(c, "grp/r", NULL, &b), DLSHARE_EPERM);

	/* 0604: the group bits apply to the group even though the other
	 * bits give more. */
	assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP, publish_as,
				&(struct pub_as){ "grp/r", 0604, 14 }), 0);
	assert_int_equal(run_as(&fx->d, UID_B, GID_G, NO_GROUP, try_read,
				&(struct try_read){ "grp/r", DLSHARE_EPERM, 14 }), 0);
	assert_int_equal(run_as(&fx->d, UID_C, GID_H, NO_GROUP, try_read,
				&(struct try_read){ "grp/r", 0, 14 }), 0);
	assert_int_equal(util_get_check(c, "grp/r", NULL, DT_F32, 1, shape16,
					14, NULL), 0);
	/* The owner itself, with the owner bits 06. */
	assert_int_equal(run_as(&fx->d, UID_A, GID_H, NO_GROUP, try_read,
				&(struct try_read){ "grp/r", 0, 14 }), 0);
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ==== 2. Per-uid quotas ============================================================= */

static int setup_uid_conns(void **state)
{
	static const char *const args[] = { "--uid-connections", "3", NULL };

	return util_setup_open(state, args);
}

/* Opens n connections (each must work), then one more, which must not.
 * Returns 0 or _exit(1)s. */
static int conns_of_uid(const struct daemon_proc *d, void *arg)
{
	int n = (int)(intptr_t)arg, err, code, sock;
	dlshare_client *c[8] = { NULL }, *x = NULL;

	for (int i = 0; i < n; i++) {
		c[i] = util_child_connect(d);
		CHILD_OK(dlshare_stats_get(c[i], &(dlshare_stats){ 0 }));
	}
	err = dlshare_connect(d->sock, &x);
	if (err == 0) {
		err = dlshare_stats_get(x, &(dlshare_stats){ 0 });
		dlshare_disconnect(x);
		CHILD_CHECK(err != 0);
	}
	if (err != DLSHARE_ELIMIT && err != DLSHARE_ECONN)
		CHILD_FAIL("connection %d of uid %u: %d (%s)", n + 1,
			   (unsigned)getuid(), err, dlshare_strerror(err));
	sock = raw_connect(d->sock);
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_expect_hangup(sock, harness_ms(5000), &code) == 0);
	CHILD_CHECK(code == DLSHARE_ELIMIT);
	close(sock);
	for (int i = 0; i < n; i++)
		CHILD_OK(dlshare_stats_get(c[i], &(dlshare_stats){ 0 }));
	for (int i = 0; i < n; i++)
		dlshare_disconnect(c[i]);
	return 0;
}

static void quota_connections(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c[3], *x = NULL;
	int fds, err;

	c[0] = harness_connect(&fx->d);
	assert_int_equal(harness_wait_stats(c[0], -1, 1, NULL), 0);
	fds = harness_fd_count(fx->d.pid);
	c[1] = harness_connect(&fx->d);
	c[2] = harness_connect(&fx->d);
	/* A fourth of our uid, from here or from another process: no. */
	err = dlshare_connect(fx->d.sock, &x);
	if (err == 0) {
		err = dlshare_stats_get(x, &(dlshare_stats){ 0 });
		dlshare_disconnect(x);
		assert_int_not_equal(err, 0);
	}
	assert_true(err == DLSHARE_ELIMIT || err == DLSHARE_ECONN);
	assert_int_equal(util_wait(util_spawn(&fx->d, conns_of_uid,
					      (void *)(intptr_t)0)), 0);
	/* Another uid has its own allowance, while ours is used up. */
	if (can_switch_uids())
		assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP,
					conns_of_uid, (void *)(intptr_t)3), 0);
	else
		fprintf(stderr, "SKIP (part): needs root to switch uids; "
			"checked one uid only\n");
	for (int i = 0; i < 3; i++)
		util_stats(c[i]);
	/* One leaves, one more of ours may come in. */
	dlshare_disconnect(c[2]);
	assert_int_equal(harness_wait_stats(c[0], -1, 2, NULL), 0);
	c[2] = harness_connect(&fx->d);
	util_stats(c[2]);
	dlshare_disconnect(c[2]);
	dlshare_disconnect(c[1]);
	assert_int_equal(harness_wait_stats(c[0], -1, 1, NULL), 0);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	dlshare_disconnect(c[0]);
}

/* ---- --uid-leases ------------------------------------------------------------------ */

static int setup_uid_leases(void **state)
{
	static const char *const args[] = { "--uid-leases", "5", NULL };

	return util_setup_open(state, args);
}

/* Takes n leases over two connections, then one more on each must fail
 * with "leases per uid". */
static int leases_of_uid(const struct daemon_proc *d, void *arg)
{
	int n = (int)(intptr_t)arg;
	dlshare_client *c[2] = { util_child_connect(d), util_child_connect(d) };
	dlshare_bundle *b[8];
	DLManagedTensor *m;

	for (int i = 0; i < n; i++) {
		const char *name = i % 2 ? "q/x" : "q/s";

		CHILD_OK(dlshare_get(c[i % 2], name, NULL, &b[i]));
		CHILD_CHECK(util_check(dlshare_bundle_tensor(b[i], 0), DT_F32, 1,
				       shape16, i % 2 ? 2 : 1) == 0);
	}
	for (int k = 0; k < 2; k++) {
		CHILD_ERR(dlshare_get(c[k], "q/s", NULL, &b[7]), DLSHARE_ELIMIT);
		if (!says("leases per uid"))
			CHILD_FAIL("the error does not name the limit: \"%s\"",
				   dlshare_last_error());
		CHILD_ERR(dlshare_get_tensor(c[k], "q/x", NULL, &m),
			  DLSHARE_ELIMIT);
	}
	for (int i = 0; i < n; i++)
		dlshare_bundle_free(b[i]);
	dlshare_disconnect(c[0]);
	dlshare_disconnect(c[1]);
	return 0;
}

struct parked_get {
	dlshare_client *c;
	const char *name;
	uint64_t after;
	int err;
};

static void *parked_get(void *arg)
{
	struct parked_get *p = arg;
	dlshare_get_opts o = { .select = DLSHARE_NEWER_THAN,
			       .version = p->after,
			       .timeout_ms = harness_ms(20000) };
	dlshare_bundle *b;

	p->err = dlshare_get(p->c, p->name, &o, &b);
	if (!p->err)
		dlshare_bundle_free(b);
	return NULL;
}

static void quota_leases(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c1 = harness_connect(&fx->d);
	dlshare_client *c2 = harness_connect(&fx->d);
	dlshare_bundle *b[5], *x;
	DLManagedTensor *m;
	struct util_want w = UTIL_ANY;
	struct parked_get pg = { .c = c2, .name = "q/s", .after = 1 };
	pthread_t th;
	int err = -1;

	assert_int_equal(store_mode(c1, "q/s", 0644, 1, NULL), 0);
	assert_int_equal(export_mode(c1, "q/x", 0644, 2), 0);
	/* Five over two connections: 3 + 2, store and export. */
	assert_int_equal(dlshare_get(c1, "q/s", NULL, &b[0]), 0);
	assert_int_equal(dlshare_get(c1, "q/x", NULL, &b[1]), 0);
	assert_int_equal(dlshare_get(c1, "q/s", NULL, &b[2]), 0);
	assert_int_equal(dlshare_get(c2, "q/x", NULL, &b[3]), 0);
	assert_int_equal(dlshare_get_tensor(c2, "q/s", NULL, &m), 0);
	w.leases = 5;
	util_assert_want(c1, &w);
	/* The sixth, on either connection, in any form. */
	assert_int_equal(dlshare_get(c1, "q/s", NULL, &x), DLSHARE_ELIMIT);
	if (!says("leases per uid"))
		fail_msg("the error does not name the limit: \"%s\"",
			 dlshare_last_error());
	assert_int_equal(dlshare_get(c2, "q/x", NULL, &x), DLSHARE_ELIMIT);
	assert_int_equal(dlshare_get_tensor(c1, "q/x", NULL, &m), DLSHARE_ELIMIT);
	/* From another process of the same uid too. */
	assert_int_equal(util_wait(util_spawn(&fx->d, leases_of_uid,
					      (void *)(intptr_t)0)), 0);
	/* Another uid has its own five. */
	if (can_switch_uids())
		assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP,
					leases_of_uid, (void *)(intptr_t)5), 0);
	else
		fprintf(stderr, "SKIP (part): needs root to switch uids; "
			"checked one uid only\n");
	/* A parked get answered while the uid is at its quota. */
	assert_int_equal(pthread_create(&th, NULL, parked_get, &pg), 0);
	w.leases = 5;
	w.parked = 1;
	util_assert_want(c1, &w);
	assert_int_equal(store_mode(c1, "q/s", 0644, 3, NULL), 0);
	pthread_join(th, NULL);
	assert_int_equal(pg.err, DLSHARE_ELIMIT);
	/* Give one back (asynchronously): one more fits again. */
	dlshare_bundle_free(b[1]);
	for (int waited = 0; waited < harness_ms(5000); waited += 10) {
		err = dlshare_get(c2, "q/s", NULL, &x);
		if (err != DLSHARE_ELIMIT)
			break;
		util_sleep_ms(10);
	}
	assert_int_equal(err, 0);
	assert_int_equal(util_check(dlshare_bundle_tensor(x, 0), DT_F32, 1,
				    shape16, 3), 0);
	assert_int_equal(dlshare_get(c1, "q/s", NULL, &b[1]), DLSHARE_ELIMIT);
	dlshare_bundle_free(x);
	dlshare_bundle_free(b[0]);
	dlshare_bundle_free(b[2]);
	dlshare_bundle_free(b[3]);
	m->deleter(m);
	w.leases = 0;
	w.parked = 0;
	util_assert_want(c1, &w);
	dlshare_disconnect(c2);
	dlshare_disconnect(c1);
}

/* ---- --uid-names ---------------------------------------------------------------------- */

static int setup_uid_names(void **state)
{
	static const char *const args[] = { "--uid-names", "3", NULL };

	return util_setup_open(state, args);
}

struct names_of {
	const char *prefix;
	int n;              /* new names that must fit */
	const char *other;  /* an existing name (not its own) to publish over */
};

static int names_of_uid(const struct daemon_proc *d, void *arg)
{
	const struct names_of *q = arg;
	dlshare_client *c = util_child_connect(d);
	char name[64];

	for (int i = 1; i <= q->n; i++) {
		snprintf(name, sizeof(name), "%s/%d", q->prefix, i);
		CHILD_OK(store_mode(c, name, 0, (uint32_t)i, NULL));
	}
	snprintf(name, sizeof(name), "%s/%d", q->prefix, q->n + 1);
	CHILD_ERR(store_mode(c, name, 0, 0, NULL), DLSHARE_ELIMIT);
	if (!says("names per uid"))
		CHILD_FAIL("the error does not name the limit: \"%s\"",
			   dlshare_last_error());
	if (q->other)
		CHILD_OK(store_mode(c, q->other, 0, 77, NULL));
	dlshare_disconnect(c);
	return 0;
}

static void quota_names(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t bytes[1] = { 64 };
	dlshare_name_info info;
	dlshare_writer *w;
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1,
				     .shape = shape16 };
	struct util_want want = UTIL_ANY;

	assert_int_equal(store_mode(c, "n/1", 0666, 1, NULL), 0);
	assert_int_equal(store_mode(c, "n/2", 0, 2, NULL), 0);
	assert_int_equal(export_mode(c, "n/3", 0, 3), 0);
	/* A fourth new name, whichever way it comes. */
	assert_int_equal(store_mode(c, "n/4", 0, 4, NULL), DLSHARE_ELIMIT);
	if (!says("names per uid"))
		fail_msg("the error does not name the limit: \"%s\"",
			 dlshare_last_error());
	assert_int_equal(export_mode(c, "n/4", 0, 4), DLSHARE_ELIMIT);
	assert_int_equal(copy_publish(c, "n/4", bytes, 0), DLSHARE_ELIMIT);
	assert_int_equal(dlshare_stat(c, "n/4", &info, NULL), DLSHARE_ENOENT);
	/* Republishing what it has is no new name. */
	assert_int_equal(store_mode(c, "n/1", 0, 5, NULL), 0);
	assert_int_equal(export_mode(c, "n/3", 0, 6), 0);
	assert_int_equal(store_mode(c, "n/2", 0, 7, NULL), 0);
	/* Another process of the uid shares the quota. */
	assert_int_equal(util_wait(util_spawn(&fx->d, names_of_uid,
			 &(struct names_of){ "n/child", 0, "n/1" })), 0);
	/* Another uid has its own, and publishing over our 0666 name does
	 * not cost it one. */
	if (can_switch_uids()) {
		assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP,
					names_of_uid,
					&(struct names_of){ "o", 3, "n/1" }), 0);
		want.names = 6;
		util_assert_want(c, &want);
	} else {
		fprintf(stderr, "SKIP (part): needs root to switch uids; "
			"checked one uid only\n");
	}
	/* Deleting gives it back. */
	assert_int_equal(dlshare_delete(c, "n/2"), 0);
	assert_int_equal(store_mode(c, "n/4", 0, 8, NULL), 0);
	assert_int_equal(store_mode(c, "n/5", 0, 9, NULL), DLSHARE_ELIMIT);
	/* A pending version holds its name; aborting it gives it back. */
	assert_int_equal(dlshare_delete(c, "n/3"), 0);
	assert_int_equal(dlshare_create(c, "n/5", &spec, 1, NULL, &w), 0);
	assert_int_equal(store_mode(c, "n/6", 0, 10, NULL), DLSHARE_ELIMIT);
	dlshare_writer_abort(w);
	for (int waited = 0; waited < harness_ms(5000); waited += 10) {
		int err = store_mode(c, "n/6", 0, 10, NULL);

		if (err != DLSHARE_ELIMIT) {
			assert_int_equal(err, 0);
			break;
		}
		util_sleep_ms(10);
	}
	assert_int_equal(util_get_check(c, "n/6", NULL, DT_F32, 1, shape16,
					10, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- --uid-host-bytes ------------------------------------------------------------------ */

static int setup_uid_bytes(void **state)
{
	static const char *const args[] = { "--uid-host-bytes", "1M", NULL };

	return util_setup_open(state, args);
}

#define CHUNK_F32 (150 * 1024) /* 600 KiB of float32 */

/* Stores one chunk, then a second must not fit. */
static int bytes_of_uid(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	const char *prefix = arg;
	char a[64], b[64];

	snprintf(a, sizeof(a), "%s/a", prefix);
	snprintf(b, sizeof(b), "%s/b", prefix);
	if (strcmp(prefix, "h") != 0) /* "h": ours are full already */
		CHILD_OK(store_n(c, a, CHUNK_F32, 0, 1, NULL));
	CHILD_ERR(store_n(c, b, CHUNK_F32, 0, 2, NULL), DLSHARE_ELIMIT);
	if (!says("host bytes per uid"))
		CHILD_FAIL("the error does not name the limit: \"%s\"",
			   dlshare_last_error());
	if (strcmp(prefix, "h") != 0)
		CHILD_OK(dlshare_delete(c, a));
	dlshare_disconnect(c);
	return 0;
}

/* Holds a lease on h/a until a byte comes on the pipe. */
static int hold_lease(const struct daemon_proc *d, void *arg)
{
	int fd = *(const int *)arg;
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b;
	char x;

	CHILD_OK(dlshare_get(c, "h/a", NULL, &b));
	CHILD_CHECK(read(fd, &x, 1) == 1);
	dlshare_bundle_free(b);
	dlshare_disconnect(c);
	return 0;
}

static void quota_host_bytes(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t copy[1] = { CHUNK_F32 * 4 }, big[1] = { 2 * 1024 * 1024 };
	struct util_want w = UTIL_ANY;
	int pfd[2], err = -1;
	pid_t p;

	assert_int_equal(store_n(c, "h/a", CHUNK_F32, 0, 1, NULL), 0);
	/* 600 KiB more does not fit under the uid's 1 MiB, store or copy. */
	assert_int_equal(store_n(c, "h/b", CHUNK_F32, 0, 2, NULL), DLSHARE_ELIMIT);
	if (!says("host bytes per uid"))
		fail_msg("the error does not name the limit: \"%s\"",
			 dlshare_last_error());
	assert_int_equal(copy_publish(c, "h/b", copy, 0), DLSHARE_ELIMIT);
	/* Producer memory is not the daemon's. */
	assert_int_equal(util_export(c, "h/x", DT_U8, 1, big, 3, NULL, NULL), 0);
	/* Another process of ours: no; another uid: its own megabyte. */
	assert_int_equal(util_wait(util_spawn(&fx->d, bytes_of_uid, "h")), 0);
	if (can_switch_uids())
		assert_int_equal(run_as(&fx->d, UID_A, GID_G, NO_GROUP,
					bytes_of_uid, "o"), 0);
	else
		fprintf(stderr, "SKIP (part): needs root to switch uids; "
			"checked one uid only\n");

	/* Deleted but leased (by another uid when we can): what only a
	 * lease keeps alive is the leaseholder's (--uid-leased-bytes), so
	 * our bytes come back at once. */
	assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
	p = can_switch_uids() ?
		spawn_as(&fx->d, UID_B, GID_H, NO_GROUP, hold_lease, &pfd[0]) :
		util_spawn(&fx->d, hold_lease, &pfd[0]);
	w.leases = 1;
	util_assert_want(c, &w);
	assert_int_equal(dlshare_delete(c, "h/a"), 0);
	err = store_n(c, "h/b", CHUNK_F32, 0, 2, NULL);
	assert_int_equal(err, 0);
	assert_int_equal(write(pfd[1], "x", 1), 1);
	assert_int_equal(util_wait(p), 0);
	close(pfd[0]);
	close(pfd[1]);
	/* A superseded version gives its bytes back too: 600 K → 150 K,
	 * then another 600 K fits. */
	assert_int_equal(store_n(c, "h/b", CHUNK_F32 / 4, 0, 4, NULL), 0);
	assert_int_equal(store_n(c, "h/c", CHUNK_F32, 0, 5, NULL), 0);
	assert_int_equal(store_n(c, "h/d", CHUNK_F32 / 2, 0, 6, NULL),
			 DLSHARE_ELIMIT);
	w.leases = 0;
	w.connections = 1;
	util_assert_want(c, &w);
	dlshare_disconnect(c);
}

/* ==== 3. Hello timeout ================================================================ */

static char hello_ms[16];

static int setup_hello(void **state)
{
	static const char *args[] = { "--hello-timeout", hello_ms, NULL };

	snprintf(hello_ms, sizeof(hello_ms), "%d", harness_ms(300));
	return util_setup_fdcheck(state, args);
}

#define SILENT 20

static void hello_timeout(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d), *idle;
	int limit = harness_ms(300), socks[SILENT], late, fds;
	int64_t born[SILENT], t0;
	struct util_want w = UTIL_ANY;
	dlshare_stats st;
	int seen = 0;

	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds = harness_fd_count(fx->d.pid);
	idle = harness_connect(&fx->d);
	assert_int_equal(harness_wait_stats(c, -1, 2, NULL), 0);
	t0 = util_now_ms();
	for (int i = 0; i < SILENT; i++) {
		born[i] = util_now_ms();
		socks[i] = raw_connect(fx->d.sock);
		assert_true(socks[i] >= 0);
	}
	late = raw_connect(fx->d.sock);
	assert_true(late >= 0);
	/* They count as connections while they wait. */
	while (util_now_ms() - t0 < limit * 2 / 3) {
		if (dlshare_stats_get(c, &st) == 0 &&
		    st.connections == 2 + SILENT + 1) {
			seen = 1;
			break;
		}
		util_sleep_ms(5);
	}
	assert_true(seen);
	/* One says Hello in time, and then idles far longer than the limit. */
	assert_int_equal(raw_hello(late), 0);
	for (int i = 0; i < SILENT; i++) {
		int64_t gone;

		assert_int_equal(raw_expect_hangup(socks[i], harness_ms(5000),
						   NULL), 0);
		gone = util_now_ms() - born[i];
		/* The daemon's clock is a coarse one: a few ms of slack. */
		if (gone < limit - 10 || gone > limit + harness_ms(3000))
			fail_msg("silent peer %d cut off after %lld ms; the "
				 "limit is %d ms", i, (long long)gone, limit);
		close(socks[i]);
	}
	w.connections = 3;
	util_assert_want(c, &w);
	util_sleep_ms(limit);
	assert_int_equal(raw_stats_ok(late, 50), 0);
	util_stats(idle);
	close(late);
	dlshare_disconnect(idle);
	w.connections = 1;
	util_assert_want(c, &w);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	assert_good_client(fx);
	dlshare_disconnect(c);
}

/* ==== 4. Kill storm ===================================================================== */

#define STORM_WAVES 4
#define STORM_WAVE 50
#define STORM_PARKERS (STORM_WAVE / 4 + (STORM_WAVE % 4 > 1) + \
		       STORM_WAVE / 4 + (STORM_WAVE % 4 > 3))

static int storm_pipe[2];

static void storm_ready(void)
{
	char x = 1;

	CHILD_CHECK(write(storm_pipe[1], &x, 1) == 1);
}

static void storm_forever(void)
{
	for (;;)
		pause();
}

/* Holds leases on both versions, one also exported to DLPack. */
static int storm_holder(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_bundle *b1, *b2;
	DLManagedTensor *m, *e;

	(void)arg;
	CHILD_OK(dlshare_get(c, "ks/s", NULL, &b1));
	CHILD_OK(dlshare_get(c, "ks/x", NULL, &b2));
	CHILD_OK(dlshare_get_tensor(c, "ks/s", NULL, &m));
	CHILD_OK(dlshare_bundle_export(b2, 0, &e));
	CHILD_CHECK(dlshare_bundle_tensor(b1, 0) != NULL);
	storm_ready();
	storm_forever();
	return 1;
}

/* Holds a lease and waits in a parked get when it dies. */
static int storm_parker(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = { .timeout_ms = harness_ms(60000) };
	dlshare_bundle *b;

	(void)arg;
	CHILD_OK(dlshare_get(c, "ks/x", NULL, &b));
	storm_ready();
	dlshare_get(c, "ks/never", &o, &b);
	return 3; /* never: it is killed first */
}

/* Gets, frees, creates and aborts as fast as it can: killed mid-request. */
static int storm_churner(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int64_t sh[1] = { 1024 };
	dlshare_tensor_spec spec = { .dtype = DT_F32, .ndim = 1, .shape = sh };
	dlshare_bundle *b1, *b2;
	dlshare_writer *w;
	char name[64];

	(void)arg;
	snprintf(name, sizeof(name), "ks/pend/%d", (int)getpid());
	for (unsigned i = 0;; i++) {
		CHILD_OK(dlshare_get(c, "ks/s", NULL, &b1));
		CHILD_OK(dlshare_get(c, "ks/x", NULL, &b2));
		CHILD_OK(dlshare_create(c, name, &spec, 1, NULL, &w));
		if (i == 0)
			storm_ready();
		dlshare_bundle_free(b1);
		dlshare_writer_abort(w);
		dlshare_bundle_free(b2);
	}
	return 1;
}

/* A raw peer: a lease with its fd, a pending version with its fd, a parked
 * get, and a request whose answer it never reads. */
static int storm_raw(const struct daemon_proc *d, void *arg)
{
	int sock = raw_connect(d->sock);
	struct vframe v;
	char name[64];
	unsigned nfds;

	(void)arg;
	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	CHILD_CHECK(raw_get(sock, 2, "ks/s", &nfds, NULL) == 0);
	snprintf(name, sizeof(name), "ks/raw/%d", (int)getpid());
	vframe_init(&v, 3, 0, name, 1, 4096);
	CHILD_CHECK(raw_send(sock, &v.f, NULL, 0, 0) == 0);
	CHILD_CHECK(raw_answer(sock, 3, &nfds, NULL) == 0 && nfds == 1);
	CHILD_CHECK(raw_send_get(sock, 4, "ks/never",
				 (uint32_t)harness_ms(60000)) == 0);
	CHILD_CHECK(raw_send_get(sock, 5, "ks/x", 0) == 0);
	storm_ready();
	storm_forever();
	return 1;
}

static const util_child_fn storm_kinds[4] = {
	storm_holder, storm_parker, storm_churner, storm_raw,
};

static int setup_storm(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static void kill_storm(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY, busy = UTIL_ANY;
	pid_t kids[STORM_WAVE];
	int slot[STORM_WAVES], fds;
	int64_t t0 = util_now_ms();
	dlshare_stats st;

	assert_int_equal(store_n(c, "ks/s", 16384, 0, 1, NULL), 0);
	assert_int_equal(util_export(c, "ks/x", DT_F32, 1,
				     (int64_t[1]){ 16384 }, 2, NULL, &slot[0]), 0);
	/* Once read, a buffer keeps a read-only fd in the daemon: read both
	 * before counting. */
	assert_int_equal(util_get_check(c, "ks/s", NULL, DT_F32, 1,
					(int64_t[1]){ 16384 }, 1, NULL), 0);
	assert_int_equal(util_get_check(c, "ks/x", NULL, DT_F32, 1,
					(int64_t[1]){ 16384 }, 2, NULL), 0);
	clean.connections = 1;
	clean.leases = 0;
	clean.parked = 0;
	clean.names = 2;
	clean.versions = 2;
	clean.buffers = 2;
	util_assert_want(c, &clean);
	fds = harness_fd_count(fx->d.pid);
	assert_int_equal(pipe2(storm_pipe, O_CLOEXEC), 0);

	for (int wave = 0; wave < STORM_WAVES; wave++) {
		int ready = 0;

		if (wave > 0) {
			/* New versions: the old ones live on only in the
			 * leases of the doomed. */
			assert_int_equal(store_n(c, "ks/s", 16384, 0,
						 10 + (uint32_t)wave, NULL), 0);
			assert_int_equal(util_export(c, "ks/x", DT_F32, 1,
						     (int64_t[1]){ 16384 },
						     20 + (uint32_t)wave, NULL,
						     &slot[wave]), 0);
		}
		for (int i = 0; i < STORM_WAVE; i++)
			kids[i] = util_spawn(&fx->d, storm_kinds[i % 4], NULL);
		while (ready < STORM_WAVE) {
			struct pollfd p = { .fd = storm_pipe[0], .events = POLLIN };
			char buf[STORM_WAVE];
			ssize_t n;

			if (poll(&p, 1, harness_ms(20000)) <= 0)
				fail_msg("wave %d: %d of %d children ready", wave,
					 ready, STORM_WAVE);
			n = read(storm_pipe[0], buf, sizeof(buf));
			assert_true(n > 0);
			ready += (int)n;
		}
		busy.parked = STORM_PARKERS;
		util_assert_want(c, &busy);
		st = util_stats(c);
		fprintf(stderr, "wave %d: %llu connections, %llu leases, "
			"%llu parked, %llu versions before the kill\n", wave,
			(unsigned long long)st.connections,
			(unsigned long long)st.leases,
			(unsigned long long)st.parked,
			(unsigned long long)st.versions);
		assert_true(st.leases >= STORM_WAVE / 2);
		assert_true(st.connections >= STORM_WAVE);
		/* All at once, whatever they are doing. */
		for (int i = 0; i < STORM_WAVE; i++)
			kill(kids[i], SIGKILL);
		for (int i = 0; i < STORM_WAVE; i++)
			assert_int_equal(util_wait(kids[i]), 128 + SIGKILL);
		util_assert_want(c, &clean);
		assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
		/* The export they held was retired back to its producer. */
		if (wave > 0)
			assert_int_equal(util_wait_deleted(slot[wave - 1], 1), 1);
	}
	close(storm_pipe[0]);
	close(storm_pipe[1]);
	assert_int_equal(util_get_check(c, "ks/s", NULL, DT_F32, 1,
					(int64_t[1]){ 16384 },
					10 + STORM_WAVES - 1, NULL), 0);
	assert_good_client(fx);
	util_assert_want(c, &clean);
	fprintf(stderr, "kill storm: %d clients in %lld ms\n",
		STORM_WAVES * STORM_WAVE, (long long)(util_now_ms() - t0));
	dlshare_disconnect(c);
}

/* ==== 5. Connect storm ===================================================================== */

#define CONNECTORS 4
#define CYCLES 500

static int connector(const struct daemon_proc *d, void *arg)
{
	int idx = (int)(intptr_t)arg;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	uint8_t *hello, junk[64];
	size_t len;

	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = "a connect storm, with a long agent string to cut in half";
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	CHILD_CHECK(wire_encode(&f, 512, &hello, &len) == 0);
	harness_fill(junk, sizeof(junk), (uint32_t)idx);
	junk[0] = 0xff;
	for (int j = 0; j < CYCLES; j++) {
		int sock = raw_connect(d->sock), code;

		if (sock < 0)
			CHILD_FAIL("cycle %d: connect: %s", j, strerror(-sock));
		switch ((j + idx) % 6) {
		case 0: /* nothing at all */
			break;
		case 1: /* half a Hello, and gone */
			raw_send_bytes(sock, hello, len / 2, NULL, 0);
			break;
		case 2: /* garbage, and gone */
			raw_send_bytes(sock, junk, sizeof(junk), NULL, 0);
			break;
		case 3: /* a proper Hello */
			CHILD_CHECK(raw_hello(sock) == 0);
			break;
		case 4: /* a request whose answer nobody reads */
			CHILD_CHECK(raw_hello(sock) == 0);
			CHILD_CHECK(raw_send_get(sock, 2, "cs/none", 0) == 0);
			break;
		case 5: /* half a Hello, and the daemon's answer */
			CHILD_CHECK(raw_send_bytes(sock, hello, len / 2, NULL,
						   0) == 0);
			CHILD_CHECK(raw_expect_hangup(sock, harness_ms(5000),
						      &code) == 0);
			CHILD_CHECK(code == DLSHARE_EPROTO);
			break;
		}
		close(sock);
	}
	free(hello);
	return 0;
}

static int setup_cstorm(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static void connect_storm(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY;
	pid_t kids[CONNECTORS];
	int64_t t0;
	int fds;

	assert_int_equal(store_mode(c, "cs/w", 0, 1, NULL), 0);
	assert_int_equal(util_get_check(c, "cs/w", NULL, DT_F32, 1, shape16, 1,
					NULL), 0);
	clean.connections = 1;
	clean.leases = 0;
	clean.names = 1;
	clean.versions = 1;
	clean.buffers = 1;
	util_assert_want(c, &clean);
	fds = harness_fd_count(fx->d.pid);
	t0 = util_now_ms();
	for (int i = 0; i < CONNECTORS; i++)
		kids[i] = util_spawn(&fx->d, connector, (void *)(intptr_t)i);
	/* Everyone else is served meanwhile. */
	while (util_now_ms() - t0 < 200)
		assert_int_equal(util_get_check(c, "cs/w", NULL, DT_F32, 1,
						shape16, 1, NULL), 0);
	for (int i = 0; i < CONNECTORS; i++)
		assert_int_equal(util_wait(kids[i]), 0);
	fprintf(stderr, "connect storm: %d cycles in %lld ms\n",
		CONNECTORS * CYCLES, (long long)(util_now_ms() - t0));
	util_assert_want(c, &clean);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds), fds);
	assert_good_client(fx);
	assert_int_equal(util_get_check(c, "cs/w", NULL, DT_F32, 1, shape16, 1,
					NULL), 0);
	dlshare_disconnect(c);
}

/* ==== 6. fds of the wrong kind ================================================================= */

static int setup_wrong_fds(void **state)
{
	static const char *const args[] = {
		"--max-fds", "64", "--max-buffers", "64", NULL,
	};

	return util_setup_fdcheck(state, args);
}

enum { FK_GOOD, FK_PIPE_R, FK_PIPE_W, FK_SOCKET, FK_DEVNULL, FK_UNSEALED,
       FK_SHRINK_ONLY, FK_SMALL, FK_DIR, FK_EVENTFD, FK_OPATH, FK_SHMFILE,
       FK_EPOLL, FK_NKINDS };

/* An fd of kind k for a 64-byte buffer; a second fd to close afterwards
 * (the other end of a pipe or socket pair) goes to *other. */
static int make_fd(int k, int *other)
{
	int p[2], fd = -1;

	*other = -1;
	switch (k) {
	case FK_GOOD:
		return raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);
	case FK_PIPE_R:
	case FK_PIPE_W:
		if (pipe2(p, O_CLOEXEC))
			return -1;
		*other = p[k == FK_PIPE_R];
		return p[k != FK_PIPE_R];
	case FK_SOCKET:
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p))
			return -1;
		*other = p[1];
		return p[0];
	case FK_DEVNULL:
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	case FK_UNSEALED:
		return raw_memfd(64, 0);
	case FK_SHRINK_ONLY:
		return raw_memfd(64, F_SEAL_SHRINK);
	case FK_SMALL:
		return raw_memfd(32, F_SEAL_SHRINK | F_SEAL_GROW);
	case FK_DIR:
		return open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	case FK_EVENTFD:
		return eventfd(0, EFD_CLOEXEC);
	case FK_OPATH: {
		char path[64];
		int m = raw_memfd(64, F_SEAL_SHRINK | F_SEAL_GROW);

		if (m < 0)
			return -1;
		snprintf(path, sizeof(path), "/proc/self/fd/%d", m);
		fd = open(path, O_PATH | O_CLOEXEC);
		close(m);
		return fd;
	}
	case FK_SHMFILE:
		/* A tmpfs file that is no memfd: no size seals to be had. */
		fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd < 0)
			fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd >= 0 && ftruncate(fd, 64)) {
			close(fd);
			fd = -1;
		}
		return fd;
	case FK_EPOLL:
		return epoll_create1(EPOLL_CLOEXEC);
	}
	return -1;
}

/* Sends a Publish of n 64-byte buffers whose fds are of kinds[i] (a
 * pattern repeated when shorter), and returns the answer as raw_answer
 * does. tweak may change the frame first. */
static int publish_kinds(int sock, uint64_t id, const char *name, unsigned n,
			 const int *kinds, unsigned nkinds,
			 void (*tweak)(struct vframe *))
{
	struct vframe v;
	int fds[VF_MAX], others[VF_MAX];
	unsigned nfds;
	int ret;

	vframe_init(&v, id, 1, name, n, 64);
	if (tweak)
		tweak(&v);
	for (unsigned i = 0; i < n; i++) {
		fds[i] = make_fd(kinds[i % nkinds], &others[i]);
		if (fds[i] < 0)
			CHILD_FAIL("cannot make an fd of kind %d: %s",
				   kinds[i % nkinds], strerror(errno));
	}
	ret = raw_send(sock, &v.f, fds, n, 0) ? RAW_FAILED :
	      raw_answer(sock, id, &nfds, NULL);
	wire_close_fds(fds, n);
	wire_close_fds(others, n);
	return ret;
}

static const int wrong_kinds[] = {
	FK_PIPE_R, FK_PIPE_W, FK_SOCKET, FK_DEVNULL, FK_UNSEALED,
	FK_SHRINK_ONLY, FK_SMALL, FK_DIR, FK_EVENTFD, FK_OPATH, FK_SHMFILE,
	FK_EPOLL,
};
#define NWRONG (sizeof(wrong_kinds) / sizeof(wrong_kinds[0]))

/* Refused: an EINVAL, or the door. Never a PublishReply. */
#define CHECK_REFUSED(what, ret)                                              \
	do {                                                                  \
		int r_ = (ret);                                               \
		if (r_ != DLSHARE_EINVAL && r_ != RAW_HANGUP)                 \
			CHILD_FAIL("%s: answer %d, want EINVAL (%d) or a "    \
				   "hang-up", what, r_, DLSHARE_EINVAL);      \
	} while (0)

static int hello_sock(const struct daemon_proc *d)
{
	int sock = raw_connect(d->sock);

	CHILD_CHECK(sock >= 0);
	CHILD_CHECK(raw_hello(sock) == 0);
	return sock;
}

/* 64 wrong fds a packet, eight packets: hundreds of fds. */
static int fds_all_wrong(const struct daemon_proc *d, void *arg)
{
	int sock = hello_sock(d);

	(void)arg;
	for (unsigned round = 0; round < 8; round++) {
		int kinds[VF_MAX], ret;

		for (unsigned i = 0; i < VF_MAX; i++)
			kinds[i] = wrong_kinds[(i + round) % NWRONG];
		ret = publish_kinds(sock, 10 + round, "fx/wrong", VF_MAX, kinds,
				    VF_MAX, NULL);
		CHECK_REFUSED("64 fds of wrong kinds", ret);
		if (ret == RAW_HANGUP) {
			close(sock);
			sock = hello_sock(d);
		} else {
			CHILD_CHECK(raw_stats_ok(sock, 100 + round) == 0);
		}
	}
	/* Each kind on its own, in a packet of one. */
	for (unsigned k = 0; k < NWRONG; k++) {
		int ret = publish_kinds(sock, 200 + k, "fx/one", 1,
					&wrong_kinds[k], 1, NULL);

		if (ret != DLSHARE_EINVAL && ret != RAW_HANGUP)
			CHILD_FAIL("an fd of kind %d: answer %d", wrong_kinds[k],
				   ret);
		if (ret == RAW_HANGUP) {
			close(sock);
			sock = hello_sock(d);
		}
	}
	close(sock);
	return 0;
}

/* 63 good ones and a bad one last: none of the good ones is kept. */
static int fds_last_bad(const struct daemon_proc *d, void *arg)
{
	int sock = hello_sock(d), kinds[VF_MAX];

	(void)arg;
	for (int i = 0; i < VF_MAX; i++)
		kinds[i] = FK_GOOD;
	for (unsigned k = 0; k < NWRONG; k += 3) {
		kinds[VF_MAX - 1] = wrong_kinds[k];
		CHECK_REFUSED("63 good fds and a bad one",
			      publish_kinds(sock, 10 + k, "fx/last", VF_MAX,
					    kinds, VF_MAX, NULL));
		close(sock);
		sock = hello_sock(d);
	}
	close(sock);
	return 0;
}

static void tweak_tensor_out(struct vframe *v)
{
	v->t[VF_MAX - 1].offset = 8; /* 64 bytes from 8 in a 64-byte buffer */
}

static void tweak_cuda_ipc(struct vframe *v)
{
	static uint8_t uuid[16], handle[64];
	static Dlshare__Device dev = DLSHARE__DEVICE__INIT;

	v->b[VF_MAX - 1].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	v->b[VF_MAX - 1].has_ipc_handle = 1;
	v->b[VF_MAX - 1].ipc_handle.data = handle;
	v->b[VF_MAX - 1].ipc_handle.len = sizeof(handle);
	/* The device is shared by all buffers: this one gets its own. */
	dev.type = kDLCUDA;
	dev.has_uuid = 1;
	dev.uuid.data = uuid;
	dev.uuid.len = sizeof(uuid);
	v->b[VF_MAX - 1].device = &dev;
}

/* Good fds, bad request: a tensor outside its buffer; an fd on a CUDA IPC
 * buffer. */
static int fds_good_bad_request(const struct daemon_proc *d, void *arg)
{
	int sock = hello_sock(d), good = FK_GOOD;

	(void)arg;
	CHECK_REFUSED("64 good fds, a tensor outside its buffer",
		      publish_kinds(sock, 10, "fx/tensor", VF_MAX, &good, 1,
				    tweak_tensor_out));
	close(sock);
	sock = hello_sock(d);
	CHECK_REFUSED("an fd on a CUDA IPC buffer",
		      publish_kinds(sock, 11, "fx/ipc", VF_MAX, &good, 1,
				    tweak_cuda_ipc));
	close(sock);
	return 0;
}

/* The positive control: 64 good fds are taken, and given back when the
 * producer goes. */
static int fds_all_good(const struct daemon_proc *d, void *arg)
{
	int sock = hello_sock(d), good = FK_GOOD, r;
	unsigned nfds;

	(void)arg;
	CHILD_CHECK(publish_kinds(sock, 10, "fx/good", VF_MAX, &good, 1,
				  NULL) == 0);
	r = hello_sock(d);
	CHILD_CHECK(raw_get(r, 2, "fx/good", &nfds, NULL) == 0);
	CHILD_CHECK(nfds == VF_MAX);
	close(r);
	close(sock);
	return 0;
}

/* 1 when a reader holding fd can change the buffer's bytes. */
static int reader_can_write(int fd)
{
	char path[64];
	void *p;
	int rw;

	p = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p != MAP_FAILED) {
		munmap(p, 64);
		return 1;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR | O_CLOEXEC);
	if (rw < 0)
		return 0;
	p = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
	if (p != MAP_FAILED) {
		munmap(p, 64);
		close(rw);
		return 1;
	}
	if (pwrite(rw, "x", 1, 0) == 1) {
		close(rw);
		return 1;
	}
	close(rw);
	return 0;
}

/* Exports a memfd with the given extra seals and checks that a reader
 * cannot write into it. Returns 0 when the daemon refused the fd, 1 when
 * it took it and readers cannot write, 2 when readers can. */
static int export_then_write(const struct daemon_proc *d, const char *name,
			     int seals)
{
	int sock = hello_sock(d), r, fd = raw_memfd(64, seals), rfd, ret;
	struct vframe v;
	unsigned nfds;

	CHILD_CHECK(fd >= 0);
	vframe_init(&v, 10, 1, name, 1, 64);
	CHILD_CHECK(raw_send(sock, &v.f, &fd, 1, 0) == 0);
	close(fd);
	ret = raw_answer(sock, 10, &nfds, NULL);
	if (ret == DLSHARE_EINVAL) {
		close(sock);
		return 0;
	}
	CHILD_CHECK(ret == 0);
	r = hello_sock(d);
	CHILD_CHECK(raw_get(r, 2, name, &nfds, &rfd) == 0);
	CHILD_CHECK(nfds == 1 && rfd >= 0);
	ret = reader_can_write(rfd) ? 2 : 1;
	close(rfd);
	close(r);
	close(sock);
	return ret;
}

static int fds_write_seal(const struct daemon_proc *d, void *arg)
{
	int ret;

	(void)arg;
	/* The library's kind of memfd: the daemon seals it against new
	 * writable mappings. This also shows the probe can tell. */
	ret = export_then_write(d, "fx/seal/normal", F_SEAL_SHRINK | F_SEAL_GROW);
	if (ret != 1)
		CHILD_FAIL("a plain export: %s", ret ? "a reader can write it" :
			   "refused");
	/* Regression test: a memfd that already carries F_SEAL_SEAL was
	 * accepted, yet the daemon could then add no F_SEAL_FUTURE_WRITE:
	 * every reader could reopen /proc/self/fd/N read-write (memfds are
	 * 0777) and change what the other readers see. It must be refused
	 * (EINVAL), or accepted only with a write seal already on it. */
	ret = export_then_write(d, "fx/seal/sealed",
				F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	if (ret == 2)
		CHILD_FAIL("an export sealed with F_SEAL_SEAL: readers can "
			   "write into it");
	return 0;
}

static void wrong_fds(void **state)
{
	static const struct {
		const char *what;
		util_child_fn fn;
	} cases[] = {
		{ "64 fds of wrong kinds, 8 times", fds_all_wrong },
		{ "63 good fds and a bad one", fds_last_bad },
		{ "good fds, bad request", fds_good_bad_request },
		{ "64 good fds (control)", fds_all_good },
		{ "write seals of exports", fds_write_seal },
	};
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct util_want clean = UTIL_ANY;
	int fds, failed = 0;

	clean.connections = 1;
	clean.names = 0;
	clean.versions = 0;
	clean.buffers = 0;
	util_assert_want(c, &clean);
	fds = harness_fd_count(fx->d.pid);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int st, n;

		fprintf(stderr, "-- %s\n", cases[i].what);
		st = util_wait(util_spawn(&fx->d, cases[i].fn, NULL));
		if (st) {
			fprintf(stderr, "   FAILED (%d)\n", st);
			failed++;
		}
		/* Every fd it sent is closed again in the daemon. */
		util_assert_want(c, &clean);
		n = harness_wait_fds(fx->d.pid, fds);
		if (n != fds)
			fail_msg("%s: the daemon holds %d fds, %d before",
				 cases[i].what, n, fds);
		assert_good_client(fx);
	}
	dlshare_disconnect(c);
	assert_int_equal(failed, 0);
}

/* ---- fds queued to a peer that does not read ---------------------------------- */

#define DEAF_NAMES 800
#define DEAF_MAX_OUT_FDS 4

static int setup_deaf_fds(void **state)
{
	static const char *const args[] = {
		"--max-out-fds", "4", "--uid-fds", "6", "--max-connections", "64",
		NULL,
	};
	struct rlimit rl;

	/* The daemon (our child) holds two fds per name read: room for
	 * them, where the machine's soft limit is 1024. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096 &&
	    rl.rlim_max >= 4096) {
		rl.rlim_cur = 4096;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	return util_setup_fdcheck(state, args);
}

/* Peers ask for many buffers and never read: past what the kernel's socket
 * queues absorb, the daemon would hold one fd per reply for them. It holds
 * at most --max-out-fds per connection and --uid-fds per uid; later gets
 * fail with ELIMIT (without an fd) naming the limit, and the peers are not
 * cut off for it. Two connections of one uid: 4 + 4 would pass the
 * per-connection limit but not the uid's 6. dlshare_limit_hits_total
 * counts each under its limit. */
static void deaf_peer_fds(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int64_t shape[1] = { 16 };
	int fds[2], base, peak = 0, n;
	int with_fd = 0, per_conn = 0, per_uid = 0;
	char name[64];

	for (int i = 0; i < DEAF_NAMES; i++) {
		snprintf(name, sizeof(name), "deaf/%03d", i);
		assert_int_equal(util_store(c, name, DT_F32, 1, shape, i, NULL), 0);
	}
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	base = harness_fd_count(fx->d.pid);
	for (int k = 0; k < 2; k++) {
		fds[k] = raw_connect(fx->d.sock);
		assert_true(fds[k] >= 0);
		assert_int_equal(raw_hello(fds[k]), 0);
	}
	for (int i = 0; i < DEAF_NAMES; i++) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Get g = DLSHARE__GET__INIT;

		snprintf(name, sizeof(name), "deaf/%03d", i);
		g.name = name;
		f.id = (uint64_t)i + 100;
		f.body_case = DLSHARE__FRAME__BODY_GET;
		f.get = &g;
		assert_int_equal(raw_send(fds[i % 2], &f, NULL, 0, 0), 0);
		if (i % 50 == 49) {
			util_sleep_ms(harness_ms(50));
			n = harness_fd_count(fx->d.pid);
			if (n > peak)
				peak = n;
		}
	}
	util_sleep_ms(harness_ms(200));
	n = harness_fd_count(fx->d.pid);
	if (n > peak)
		peak = n;
	/* The daemon's own fds: the peers' sockets, the read-only reopens
	 * it made, and at most 6 queued dups (the uid's quota). */
	assert_true(peak <= base + 2 + DEAF_NAMES + 6);
	/* Now read everything: the first replies carry fds (delivered by the
	 * kernel), the later ones are ELIMIT errors naming the limit. */
	for (int k = 0; k < 2; k++)
		for (;;) {
			struct wire_msg *m;
			Dlshare__Error *e;

			if (raw_recv(fds[k], harness_ms(1000), &m))
				break;
			e = m->frame->error;
			if (m->frame->body_case == DLSHARE__FRAME__BODY_GET_REPLY)
				with_fd++;
			else if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR &&
				 e->code == DLSHARE_ELIMIT && e->message &&
				 strstr(e->message, "fds queued to one connection"))
				per_conn++;
			else if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR &&
				 e->code == DLSHARE_ELIMIT && e->message &&
				 strstr(e->message, "fds queued per uid"))
				per_uid++;
			wire_msg_free(m);
		}
	assert_true(with_fd > 0);
	assert_true(per_conn + per_uid > 0);
	assert_true(per_uid > 0);
	assert_int_equal(with_fd + per_conn + per_uid, DEAF_NAMES);
	/* Each refusal counted in the metrics under its own limit. */
	struct util_hits h;

	util_limit_hits(c, &h);
	assert_int_equal(util_hits_of(&h, "max-out-fds"), per_conn);
	assert_int_equal(util_hits_of(&h, "uid-fds"), per_uid);
	assert_int_equal(util_hits_sum(&h), per_conn + per_uid);
	/* Not cut off: they still get answers. */
	for (int k = 0; k < 2; k++) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Stats st = DLSHARE__STATS__INIT;
		struct wire_msg *m;

		f.id = 1;
		f.body_case = DLSHARE__FRAME__BODY_STATS;
		f.stats = &st;
		assert_int_equal(raw_call(fds[k], &f, NULL, 0, &m), 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_STATS_REPLY);
		wire_msg_free(m);
		close(fds[k]);
	}
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- out of fds on accept ------------------------------------------------------ */

/* CPU time (user + system) of a process, in clock ticks. */
static long proc_cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	/* After the comm field: state, then 10 fields, then utime stime. */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
			 "%lu %lu", &ut, &st) != 2)
		return -1;
	return (long)(ut + st);
}

/* The daemon at its fd limit: connections are taken and hung up on (the
 * spare-fd trick) instead of staying queued with the loop spinning on a
 * readable listener; once fds are free again, clients are served. */
static void accept_emfile(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	struct rlimit old, low;
	int socks[20], hung = 0;
	long t0, t1;
	const char *w = getenv("DLSHARE_TEST_WRAPPER");

	/* Under valgrind the daemon's process holds valgrind's own fds, and
	 * its limits are valgrind's. */
	if (w && *w) {
		dlshare_disconnect(c);
		test_skip("the daemon runs under %s, whose fds and limits "
			  "are not the daemon's", w);
	}
	assert_int_equal(harness_wait_stats(c, 0, 1, NULL), 0);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, NULL, &old), 0);
	low = old;
	/* Exactly what it holds now: the next accept finds no fd. */
	low.rlim_cur = (rlim_t)harness_fd_count(fx->d.pid);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &low, NULL), 0);
	for (int i = 0; i < 20; i++) {
		socks[i] = raw_connect(fx->d.sock);
		assert_true(socks[i] >= 0);
	}
	for (int i = 0; i < 20; i++) {
		struct wire_msg *m;
		int r = raw_recv(socks[i], harness_ms(2000), &m);

		if (r == 1 || r == -ECONNRESET)
			hung++;
		else if (r == 0)
			wire_msg_free(m);
		close(socks[i]);
	}
	assert_int_equal(hung, 20);
	/* Idle now, still at the limit: a loop that spun on the listener
	 * would burn about a CPU-second here. */
	t0 = proc_cpu_ticks(fx->d.pid);
	util_sleep_ms(1000);
	t1 = proc_cpu_ticks(fx->d.pid);
	assert_true(t0 >= 0 && t1 >= 0);
	assert_true(t1 - t0 < sysconf(_SC_CLK_TCK) / 2);
	/* The existing client is still served, and new ones once there are
	 * fds again. */
	util_stats(c);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &old, NULL), 0);
	{
		dlshare_client *c2 = harness_connect(&fx->d);

		util_stats(c2);
		dlshare_disconnect(c2);
	}
	dlshare_disconnect(c);
}

/* The daemon at its fd limit when a peer's packet brings fds (the Publish
 * of an export): the kernel cannot make them in the daemon. The peer hears
 * why (DLSHARE_ELIMIT, "out of file descriptors"), not that it broke the
 * protocol, and is let go (its request cannot be served whole); the
 * daemon's other clients are served, and once fds are free the same
 * publish works. */
static void receive_emfile(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *p = harness_connect(&fx->d);
	dlshare_publish_opts o = { .flags = DLSHARE_PUBLISH_NO_COPY };
	const int64_t shape[1] = { 1024 };
	const char *w = getenv("DLSHARE_TEST_WRAPPER");
	DLManagedTensor *t;
	struct rlimit old, low;
	int err;

	if (w && *w) {
		dlshare_disconnect(c);
		dlshare_disconnect(p);
		test_skip("the daemon runs under %s, whose fds and limits "
			  "are not the daemon's", w);
	}
	assert_int_equal(harness_wait_stats(c, 0, 2, NULL), 0);
	assert_int_equal(dlshare_host_alloc(DT(kDLFloat, 32), 1, shape, &t),
			 0);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, NULL, &old), 0);
	low = old;
	low.rlim_cur = (rlim_t)harness_fd_count(fx->d.pid);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &low, NULL), 0);
	err = dlshare_publish(p, "s/emfile", &t, 1, &o, NULL);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &old, NULL), 0);
	assert_int_equal(err, DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(),
			       "out of file descriptors"));
	dlshare_disconnect(p);
	util_stats(c);
	p = harness_connect(&fx->d);
	assert_int_equal(dlshare_publish(p, "s/emfile", &t, 1, &o, NULL), 0);
	dlshare_disconnect(p);
	dlshare_disconnect(c);
}

/* test_security acl: the tests that need root to run peers as other uids,
 * a ctest of their own (test_security_acl) so that it reads "Skipped"
 * without root; test_security: the rest. */
int main(int argc, char **argv)
{
	const struct CMUnitTest acl[] = {
		cmocka_unit_test_setup_teardown(acl_modes, setup_acl, teardown),
		cmocka_unit_test_setup_teardown(acl_group, setup_acl, teardown),
	};
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(quota_connections, setup_uid_conns, teardown),
		cmocka_unit_test_setup_teardown(quota_leases, setup_uid_leases, teardown),
		cmocka_unit_test_setup_teardown(quota_names, setup_uid_names, teardown),
		cmocka_unit_test_setup_teardown(quota_host_bytes, setup_uid_bytes, teardown),
		cmocka_unit_test_setup_teardown(hello_timeout, setup_hello, teardown),
		cmocka_unit_test_setup_teardown(kill_storm, setup_storm, teardown),
		cmocka_unit_test_setup_teardown(connect_storm, setup_cstorm, teardown),
		cmocka_unit_test_setup_teardown(wrong_fds, setup_wrong_fds, teardown),
		cmocka_unit_test_setup_teardown(deaf_peer_fds, setup_deaf_fds, teardown),
		cmocka_unit_test_setup_teardown(accept_emfile, setup_storm, teardown),
		cmocka_unit_test_setup_teardown(receive_emfile, setup_storm, teardown),
	};

	if (argc > 1 && strcmp(argv[1], "acl") == 0)
		return test_run_group("security_acl", acl, NULL, NULL);
	return test_run_group("security", tests, NULL, NULL);
}
