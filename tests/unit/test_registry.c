/* test_registry — module tests of daemon/registry: names, versions, buffers,
 * leases, limits and the ACL, with a registry_ops that records what the
 * registry tells its user. No sockets, no loop.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "fds.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry.h"

#define PAGE 4096u

static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* ---- what the registry tells its user ------------------------------------ */

#define REC_MAX 64

struct rec {
	int npublished;
	char pub_name[REC_MAX][CHECK_NAME_MAX + 1];
	uint64_t pub_number[REC_MAX];
	int nretired;
	struct registry_owner *ret_producer[REC_MAX];
	char ret_name[REC_MAX][CHECK_NAME_MAX + 1];
	uint64_t ret_number[REC_MAX];
	int nfreed;
	uint64_t freed[4 * REC_MAX];
	/* When set, published() takes a lease of this owner on the version. */
	struct registry *r;
	struct registry_owner *lease_on_publish;
	struct lease *last_lease;
};

static void on_published(void *ud, struct entry *e, struct version *v)
{
	struct rec *rc = ud;

	assert_true(rc->npublished < REC_MAX);
	assert_int_equal(v->state, VERSION_SEALED);
	assert_ptr_equal(v->entry, e);
	snprintf(rc->pub_name[rc->npublished], CHECK_NAME_MAX + 1, "%s",
		 e->name);
	rc->pub_number[rc->npublished++] = v->number;
	if (rc->lease_on_publish)
		assert_int_equal(registry_lease(rc->r, rc->lease_on_publish, v,
						&rc->last_lease, NULL), 0);
}

static void on_retired(void *ud, struct registry_owner *producer,
		       const char *name, uint64_t number)
{
	struct rec *rc = ud;

	assert_true(rc->nretired < REC_MAX);
	rc->ret_producer[rc->nretired] = producer;
	snprintf(rc->ret_name[rc->nretired], CHECK_NAME_MAX + 1, "%s", name);
	rc->ret_number[rc->nretired++] = number;
}

static void on_buffer_freed(void *ud, struct rbuffer *b)
{
	struct rec *rc = ud;

	assert_true(rc->nfreed < 4 * REC_MAX);
	rc->freed[rc->nfreed++] = b->id;
}

/* The clock TTLs count on: the tests move it by hand. */
static uint64_t fake_now;

static uint64_t on_now_ms(void *ud)
{
	(void)ud;
	return fake_now;
}

static const struct registry_ops rec_ops = {
	.published = on_published,
	.retired = on_retired,
	.buffer_freed = on_buffer_freed,
	.now_ms = on_now_ms,
};

/* ---- version descriptions ------------------------------------------------ */

#define SPEC_MAXT 8
#define SPEC_MAXB (REGISTRY_BUFFERS_HARD_MAX + 2)

struct tspec {
	struct registry_spec s;
	Dlshare__Device dev;
	Dlshare__DataType dt;
	Dlshare__Buffer b[SPEC_MAXB];
	Dlshare__Buffer *bp[SPEC_MAXB];
	Dlshare__Tensor t[SPEC_MAXT];
	Dlshare__Tensor *tp[SPEC_MAXT];
	int64_t shape[SPEC_MAXT];
	int fds[SPEC_MAXB];
};

/* A version of name with ntensors float32 vectors spread over nbuffers host
 * buffers of size bytes each, every tensor filling its buffer. No fds. */
static struct registry_spec *spec(struct tspec *ts, const char *name,
				  uint32_t mode, size_t ntensors,
				  size_t nbuffers, uint64_t size)
{
	static const Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	static const Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	static const Dlshare__Buffer b = DLSHARE__BUFFER__INIT;
	static const Dlshare__Tensor t = DLSHARE__TENSOR__INIT;

	assert_true(ntensors <= SPEC_MAXT && nbuffers <= SPEC_MAXB);
	memset(ts, 0, sizeof(*ts));
	ts->dev = dev;
	ts->dev.type = 1; /* kDLCPU */
	ts->dt = dt;
	ts->dt.code = 2; /* kDLFloat */
	ts->dt.bits = 32;
	ts->dt.lanes = 1;
	for (size_t i = 0; i < nbuffers; i++) {
		ts->b[i] = b;
		ts->b[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		ts->b[i].size = size;
		ts->b[i].device = &ts->dev;
		ts->bp[i] = &ts->b[i];
		ts->fds[i] = -1;
	}
	for (size_t i = 0; i < ntensors; i++) {
		ts->t[i] = t;
		ts->t[i].key = i ? "t" : NULL;
		ts->t[i].buffer = nbuffers ? (uint32_t)(i % nbuffers) : 0;
		ts->t[i].dtype = &ts->dt;
		ts->shape[i] = (int64_t)(size / 4);
		ts->t[i].n_shape = 1;
		ts->t[i].shape = &ts->shape[i];
		ts->tp[i] = &ts->t[i];
	}
	ts->s.name = name;
	ts->s.mode = mode;
	ts->s.tensors = ts->tp;
	ts->s.ntensors = ntensors;
	ts->s.buffers = ts->bp;
	ts->s.nbuffers = nbuffers;
	ts->s.fds = ts->fds;
	return &ts->s;
}

/* A memfd of size bytes carrying seals, as a client's shareable memory. */
static int make_memfd(uint64_t size, int seals)
{
	int fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	if (seals)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

/* ---- fixture -------------------------------------------------------------- */

struct fix {
	struct registry r;
	struct registry_limits lim;
	struct rec rec;
	struct registry_owner prod;   /* uid 1000 gid 1000 */
	struct registry_owner cons;   /* uid 1000 gid 1000 */
	struct registry_owner other;  /* uid 2000 gid 2000 */
	struct registry_owner mate;   /* uid 3000 gid 1000 */
	struct refusal why;           /* the last refusal */
	int fd_base;
	int done;                     /* the test deinited the registry */
};

static int fix_setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->fd_base = fds_count(getpid());
	registry_limits_default(&f->lim);
	f->lim.max_bytes = UINT64_C(1) << 30;
	registry_init(&f->r, &f->lim, &rec_ops, &f->rec);
	f->rec.r = &f->r;
	registry_owner_init(&f->prod, 1000, 1000, 10);
	registry_owner_init(&f->cons, 1000, 1000, 11);
	registry_owner_init(&f->other, 2000, 2000, 12);
	registry_owner_init(&f->mate, 3000, 1000, 13);
	*state = f;
	return 0;
}

static int fix_teardown(void **state)
{
	struct fix *f = *state;
	int leaked;

	if (!f->done) {
		f->rec.lease_on_publish = NULL;
		registry_owner_drop(&f->r, &f->cons);
		registry_owner_drop(&f->r, &f->other);
		registry_owner_drop(&f->r, &f->mate);
		registry_owner_drop(&f->r, &f->prod);
		registry_deinit(&f->r);
	}
	leaked = fds_count(getpid()) - f->fd_base;
	free(f);
	if (leaked) {
		print_error("%d fd(s) leaked\n", leaked);
		return -1;
	}
	return 0;
}

static struct version *add_ok(struct fix *f, struct registry_owner *o,
			      struct registry_spec *s, int exported)
{
	struct version *v = NULL;

	assert_int_equal(registry_add(&f->r, o, s, exported, &v, NULL), 0);
	assert_non_null(v);
	return v;
}

/* Store mode, one page-sized buffer, created and sealed by o. */
static struct version *publish(struct fix *f, struct registry_owner *o,
			       const char *name, uint32_t mode)
{
	struct tspec ts;
	struct version *v = add_ok(f, o, spec(&ts, name, mode, 1, 1, PAGE), 0);

	assert_int_equal(registry_seal(&f->r, o, name, v->number, 0, NULL, 0), 0);
	return v;
}

/* Export mode, one page: a fresh sealed memfd handed to the registry. */
static struct version *export(struct fix *f, struct registry_owner *o,
			      const char *name, uint32_t mode)
{
	struct tspec ts;
	struct registry_spec *s = spec(&ts, name, mode, 1, 1, PAGE);
	struct version *v;

	ts.fds[0] = make_memfd(PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	v = add_ok(f, o, s, 1);
	assert_int_equal(ts.fds[0], -1);
	return v;
}

static struct version *find(struct fix *f, struct registry_owner *o,
			    const char *name, enum registry_select sel,
			    uint64_t n, int *err)
{
	*err = 12345;
	return registry_find(&f->r, o, name, sel, n, err);
}

static void assert_not_found(struct fix *f, struct registry_owner *o,
			     const char *name, enum registry_select sel,
			     uint64_t n, int want)
{
	int err;

	assert_null(find(f, o, name, sel, n, &err));
	assert_int_equal(err, want);
}

static void assert_found(struct fix *f, struct registry_owner *o,
			 const char *name, enum registry_select sel,
			 uint64_t n, struct version *want)
{
	int err;

	assert_ptr_equal(find(f, o, name, sel, n, &err), want);
	assert_int_equal(err, 0);
}

static void assert_counts(struct fix *f, uint64_t names, uint64_t versions,
			  uint64_t buffers, uint64_t bytes, uint64_t leases)
{
	assert_int_equal(f->r.nnames, names);
	assert_int_equal(f->r.nversions, versions);
	assert_int_equal(f->r.nbuffers, buffers);
	assert_int_equal(f->r.bytes, bytes);
	assert_int_equal(f->r.nleases, leases);
}

static int seals_of(int fd)
{
	int s = fcntl(fd, F_GET_SEALS);

	assert_true(s >= 0);
	return s;
}

/* ---- store mode ------------------------------------------------------------- */

static void test_store_pending_then_seal(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	struct version *v;
	struct stat st;
	int fd;

	v = add_ok(f, &f->prod, spec(&ts, "a/b", 0, 2, 1, 2 * PAGE), 0);
	assert_int_equal(v->number, 1);
	assert_int_equal(v->state, VERSION_PENDING);
	assert_false(v->exported);
	assert_ptr_equal(v->producer, &f->prod);
	assert_int_equal(v->ntensors, 2);
	assert_string_equal(v->tensors[0].key, "");
	assert_string_equal(v->tensors[1].key, "t");
	assert_int_equal(v->tensors[1].shape[0], 2 * PAGE / 4);
	assert_int_equal(v->nbuffers, 1);
	assert_int_equal(registry_bytes(v), 2 * PAGE);
	assert_int_equal(v->mode, REGISTRY_DEFAULT_MODE);
	/* The daemon made a memfd of the right size, sealed against
	 * resizing but still writable. */
	fd = v->buffers[0]->fd;
	assert_true(fd >= 0);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, 2 * PAGE);
	assert_int_equal(seals_of(fd) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE),
			 F_SEAL_SHRINK | F_SEAL_GROW);
	assert_true(v->buffers[0]->daemon_owned);
	assert_ptr_equal(v->buffers[0]->version, v);
	assert_counts(f, 1, 1, 1, 2 * PAGE, 0);
	assert_int_equal(f->r.owned_bytes, 2 * PAGE);

	/* Pending is invisible. */
	assert_not_found(f, &f->cons, "a/b", REG_LATEST, 0, -ENOENT);
	assert_not_found(f, &f->cons, "a/b", REG_EXACT, 1, -ENOENT);
	assert_not_found(f, &f->cons, "a/b", REG_NEWER_THAN, 0, -ENOENT);
	assert_null(registry_entry(&f->r, "a/b")->latest);
	assert_int_equal(f->rec.npublished, 0);

	assert_int_equal(registry_seal(&f->r, &f->prod, "a/b", 1, 0,
				       (const uint8_t *)"ev", 2), 0);
	assert_int_equal(v->state, VERSION_SEALED);
	/* Sealed with a CUDA event: the producer stays attached, to hear
	 * when it may destroy the event. */
	assert_ptr_equal(v->producer, &f->prod);
	assert_ptr_equal(f->prod.versions, v);
	assert_int_equal(v->event_len, 2);
	assert_memory_equal(v->cold->event_handle, "ev", 2);
	assert_true(seals_of(fd) & F_SEAL_WRITE);
	assert_int_equal(f->rec.npublished, 1);
	assert_string_equal(f->rec.pub_name[0], "a/b");
	assert_int_equal(f->rec.pub_number[0], 1);
	assert_found(f, &f->cons, "a/b", REG_LATEST, 0, v);
	assert_found(f, &f->cons, "a/b", REG_EXACT, 1, v);
	assert_ptr_equal(registry_entry(&f->r, "a/b")->latest, v);
	assert_counts(f, 1, 1, 1, 2 * PAGE, 0);
	assert_int_equal(f->rec.nfreed, 0);
	assert_int_equal(f->rec.nretired, 0);

	/* The producer goes: the version stays, its event does not. */
	registry_owner_drop(&f->r, &f->prod);
	assert_null(v->producer);
	assert_null(f->prod.versions);
	assert_int_equal(v->event_len, 0);
	assert_found(f, &f->cons, "a/b", REG_LATEST, 0, v);
	assert_int_equal(f->rec.nretired, 0);
}

/* A store version sealed with an event is retired to its producer when
 * it dies, so that the producer may destroy the event; one sealed without
 * is not. */
static void test_store_event_retired(void **state)
{
	struct fix *f = *state;
	struct tspec ts;

	add_ok(f, &f->prod, spec(&ts, "ev", 0, 1, 1, PAGE), 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "ev", 1, 0,
				       (const uint8_t *)"e1", 2), 0);
	add_ok(f, &f->prod, spec(&ts, "ev", 0, 1, 1, PAGE), 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "ev", 2, 0, NULL, 0), 0);
	/* Version 1 was superseded and nobody held it. */
	assert_int_equal(f->rec.nretired, 1);
	assert_ptr_equal(f->rec.ret_producer[0], &f->prod);
	assert_string_equal(f->rec.ret_name[0], "ev");
	assert_int_equal(f->rec.ret_number[0], 1);
	assert_int_equal(registry_delete(&f->r, &f->prod, "ev"), 0);
	assert_int_equal(f->rec.nretired, 1);
}

/* When its producer goes, a store version forgets the producer's event,
 * and with it the reply get.c keeps packed for warm readers (which names
 * that event): the next reader gets neither. */
static void test_forget_events_drops_kept_reply(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	struct version *v = add_ok(f, &f->prod, spec(&ts, "evk", 0, 1, 1,
						      PAGE), 0);

	assert_int_equal(registry_seal(&f->r, &f->prod, "evk", 1, 0,
				       (const uint8_t *)"e1", 2), 0);
	assert_int_equal(v->event_len, 2);
	/* As get.c keeps it after a warm get. */
	v->reply_tail = malloc(4);
	assert_non_null(v->reply_tail);
	memcpy(v->reply_tail, "tail", 4);
	v->reply_tail_len = 4;
	registry_owner_forget_events(&f->r, &f->prod);
	assert_int_equal(v->event_len, 0);
	assert_null(v->reply_tail);
	assert_int_equal(v->reply_tail_len, 0);
	/* The version lives on, sealed. */
	assert_found(f, &f->cons, "evk", REG_LATEST, 0, v);
}

static void test_seal_errors(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	uint8_t big[REGISTRY_HANDLE_MAX + 1] = { 0 };
	struct version *v;

	v = add_ok(f, &f->prod, spec(&ts, "s", 0, 1, 1, PAGE), 0);
	/* Someone else's pending version does not exist for cons, even with
	 * the same uid. */
	assert_int_equal(registry_seal(&f->r, &f->cons, "s", 1, 0, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->other, "s", 1, 0, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "s", 2, 0, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "nope", 1, 0, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "s", 1, 0, big,
				       sizeof(big)), -EINVAL);
	assert_int_equal(v->state, VERSION_PENDING);
	assert_int_equal(f->rec.npublished, 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "s", 1, 0, big,
				       REGISTRY_HANDLE_MAX), 0);
	assert_int_equal(v->event_len, REGISTRY_HANDLE_MAX);
	assert_int_equal(registry_seal(&f->r, &f->prod, "s", 1, 0, NULL, 0),
			 -EALREADY);
	assert_int_equal(f->rec.npublished, 1);
	/* An export is sealed from birth. */
	export(f, &f->prod, "e", 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "e", 1, 0, NULL, 0),
			 -EALREADY);
}

static void test_seal_busy_while_mapped(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	struct version *v;
	char path[64], c;
	void *p;
	int fd, fd2;

	v = add_ok(f, &f->prod, spec(&ts, "m", 0, 1, 1, PAGE), 0);
	fd = v->buffers[0]->fd;
	p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 'A', PAGE);

	assert_int_equal(registry_seal(&f->r, &f->prod, "m", 1, 0, NULL, 0),
			 -EBUSY);
	assert_int_equal(v->state, VERSION_PENDING);
	assert_ptr_equal(v->producer, &f->prod);
	assert_false(seals_of(fd) & F_SEAL_WRITE);
	assert_int_equal(f->rec.npublished, 0);
	assert_not_found(f, &f->cons, "m", REG_LATEST, 0, -ENOENT);

	assert_int_equal(munmap(p, PAGE), 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "m", 1, 0, NULL, 0), 0);
	assert_found(f, &f->cons, "m", REG_LATEST, 0, v);
	assert_true(seals_of(fd) & F_SEAL_WRITE);

	/* Immutable now: no writable shared mapping, no write, not even
	 * through a read-write reopen via /proc. */
	errno = 0;
	assert_true(mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 0) == MAP_FAILED);
	assert_int_equal(errno, EPERM);
	assert_int_equal(pwrite(fd, "B", 1, 0), -1);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	fd2 = open(path, O_RDWR | O_CLOEXEC);
	assert_true(fd2 >= 0);
	assert_int_equal(write(fd2, "B", 1), -1);
	assert_int_equal(errno, EPERM);
	close(fd2);
	/* What was written before the seal is there to read. */
	p = mmap(NULL, PAGE, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(((char *)p)[0], 'A');
	assert_int_equal(((char *)p)[PAGE - 1], 'A');
	munmap(p, PAGE);
	assert_int_equal(pread(fd, &c, 1, 7), 1);
	assert_int_equal(c, 'A');
}

static void test_versions_supersede(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2, *v3;
	struct tspec ts;
	struct lease *l;
	uint64_t id1, id2, lid;

	v1 = publish(f, &f->prod, "w", 0);
	id1 = v1->buffers[0]->id;
	assert_int_equal(v1->number, 1);
	v2 = add_ok(f, &f->prod, spec(&ts, "w", 0, 1, 1, PAGE), 0);
	assert_int_equal(v2->number, 2);
	/* Pending v2 does not displace v1. */
	assert_found(f, &f->cons, "w", REG_LATEST, 0, v1);
	assert_counts(f, 1, 2, 2, 2 * PAGE, 0);
	assert_int_equal(registry_entry(&f->r, "w")->nversions, 2);

	/* Sealed v2 does, and unleased v1 dies at once. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 2, 0, NULL, 0), 0);
	assert_found(f, &f->cons, "w", REG_LATEST, 0, v2);
	assert_not_found(f, &f->cons, "w", REG_EXACT, 1, -ENOENT);
	assert_int_equal(f->rec.nfreed, 1);
	assert_int_equal(f->rec.freed[0], id1);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->r.owned_bytes, PAGE);
	assert_int_equal(registry_entry(&f->r, "w")->nversions, 1);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);

	/* Leased v2 outlives v3's arrival... */
	id2 = v2->buffers[0]->id;
	assert_int_equal(registry_lease(&f->r, &f->cons, v2, &l, NULL), 0);
	assert_ptr_equal(l->version, v2);
	assert_ptr_equal(l->owner, &f->cons);
	lid = l->id;
	assert_int_equal(v2->leases, 1);
	assert_int_equal(f->cons.nleases, 1);
	v3 = publish(f, &f->prod, "w", 0);
	assert_int_equal(v3->number, 3);
	assert_found(f, &f->cons, "w", REG_LATEST, 0, v3);
	assert_found(f, &f->cons, "w", REG_EXACT, 2, v2);
	assert_int_equal(f->rec.nfreed, 1);
	assert_counts(f, 1, 2, 2, 2 * PAGE, 1);
	assert_int_equal(registry_entry(&f->r, "w")->leases, 1);
	assert_int_equal(fds_count(getpid()), f->fd_base + 2);

	/* ...and dies at its release. Nobody else can release it. */
	assert_int_equal(registry_release(&f->r, &f->other, lid), -ENOENT);
	assert_int_equal(registry_release(&f->r, &f->prod, lid), -ENOENT);
	assert_int_equal(registry_release(&f->r, &f->cons, lid), 0);
	assert_int_equal(f->rec.nfreed, 2);
	assert_int_equal(f->rec.freed[1], id2);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->cons.nleases, 0);
	assert_int_equal(registry_entry(&f->r, "w")->leases, 0);
	assert_int_equal(registry_release(&f->r, &f->cons, lid), -ENOENT);
	assert_not_found(f, &f->cons, "w", REG_EXACT, 2, -ENOENT);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
	/* Store versions are never "retired". */
	assert_int_equal(f->rec.nretired, 0);
	assert_int_equal(f->rec.npublished, 3);
}

/* Lease and charge records are reused, up to REGISTRY_SPARE_MAX of each:
 * a reader's get and release cost no malloc. The owner's lease table
 * keeps an anchor (id 0) while it lives, which is no lease of anyone's:
 * releasing id 0 is refused like any unknown id. */
static void test_lease_records_reused(void **state)
{
	struct fix *f = *state;
	struct lease *l[REGISTRY_SPARE_MAX + 8], *again;
	struct version *v = publish(f, &f->prod, "spare", 0);
	size_t n = sizeof(l) / sizeof(l[0]);

	assert_int_equal(registry_owner_attach(&f->r, &f->cons, NULL), 0);
	assert_int_equal(registry_release(&f->r, &f->cons, 0), -ENOENT);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[i],
						NULL), 0);
	assert_int_equal(f->cons.nleases, n);
	assert_int_equal(registry_release(&f->r, &f->cons, 0), -ENOENT);
	assert_int_equal(f->r.spare_leases.n, 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(registry_release(&f->r, &f->cons, l[i]->id),
				 0);
	assert_int_equal(f->r.spare_leases.n, REGISTRY_SPARE_MAX);
	/* The uid's one charge on v went with its last lease. */
	assert_int_equal(f->r.spare_charges.n, 1);
	assert_null(v->charges);
	assert_int_equal(f->cons.nleases, 0);
	assert_int_equal(v->leases, 0);
	/* The table stays, with its anchor alone. */
	assert_non_null(f->cons.leases);
	assert_int_equal(HASH_COUNT(f->cons.leases), 1);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &again, NULL), 0);
	assert_int_equal(f->r.spare_leases.n, REGISTRY_SPARE_MAX - 1);
	assert_int_equal(f->r.spare_charges.n, 0);
	assert_int_equal(again->take, 0);
	assert_non_null(again->charge);
	assert_int_equal(again->charge->leases, 1);
	assert_int_equal(registry_release(&f->r, &f->cons, 0), -ENOENT);
	assert_int_equal(registry_untake(&f->r, &f->cons, 0), -ENOENT);
	/* Dropping the owner drops its lease and empties its table. */
	registry_owner_drop(&f->r, &f->cons);
	assert_null(f->cons.leases);
	assert_int_equal(v->leases, 0);
	assert_int_equal(f->r.nleases, 0);
}

static void test_find_select(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2, *v3;
	struct tspec ts;
	struct lease *l;

	assert_not_found(f, &f->cons, "q", REG_LATEST, 0, -ENOENT);
	v1 = publish(f, &f->prod, "q", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v1, &l, NULL), 0);
	v2 = publish(f, &f->prod, "q", 0);
	v3 = add_ok(f, &f->prod, spec(&ts, "q", 0, 1, 1, PAGE), 0);
	assert_int_equal(v3->number, 3);

	assert_found(f, &f->cons, "q", REG_LATEST, 0, v2);
	assert_found(f, &f->cons, "q", REG_LATEST, 77, v2);
	/* EXACT reaches a superseded version held by a lease. */
	assert_found(f, &f->cons, "q", REG_EXACT, 1, v1);
	assert_found(f, &f->cons, "q", REG_EXACT, 2, v2);
	assert_not_found(f, &f->cons, "q", REG_EXACT, 3, -ENOENT); /* pending */
	assert_not_found(f, &f->cons, "q", REG_EXACT, 4, -ENOENT);
	assert_not_found(f, &f->cons, "q", REG_EXACT, 0, -ENOENT);
	/* NEWER_THAN n: the newest sealed version, if it is above n. */
	assert_found(f, &f->cons, "q", REG_NEWER_THAN, 0, v2);
	assert_found(f, &f->cons, "q", REG_NEWER_THAN, 1, v2);
	assert_not_found(f, &f->cons, "q", REG_NEWER_THAN, 2, -ENOENT);
	assert_not_found(f, &f->cons, "q", REG_NEWER_THAN, 3, -ENOENT);
	assert_not_found(f, &f->cons, "q", REG_NEWER_THAN, UINT64_MAX,
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "q", 3, 0, NULL, 0), 0);
	assert_found(f, &f->cons, "q", REG_NEWER_THAN, 2, v3);
	assert_found(f, &f->cons, "q", REG_EXACT, 3, v3);
	assert_not_found(f, &f->cons, "q", REG_EXACT, 2, -ENOENT); /* died */
	assert_found(f, &f->cons, "q", REG_EXACT, 1, v1);
	assert_not_found(f, &f->cons, "other", REG_LATEST, 0, -ENOENT);
}

static void test_born_superseded(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2;
	struct tspec ts;
	uint64_t id1;

	v1 = add_ok(f, &f->prod, spec(&ts, "b", 0, 1, 1, PAGE), 0);
	v2 = add_ok(f, &f->prod, spec(&ts, "b", 0, 1, 1, PAGE), 0);
	assert_int_equal(v2->number, 2);
	id1 = v1->buffers[0]->id;
	assert_int_equal(registry_seal(&f->r, &f->prod, "b", 2, 0, NULL, 0), 0);
	/* v1 sealed after v2: visible for an instant, then gone. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "b", 1, 0, NULL, 0), 0);
	assert_int_equal(f->rec.npublished, 2);
	assert_int_equal(f->rec.pub_number[0], 2);
	assert_int_equal(f->rec.pub_number[1], 1);
	assert_found(f, &f->cons, "b", REG_LATEST, 0, v2);
	assert_not_found(f, &f->cons, "b", REG_EXACT, 1, -ENOENT);
	assert_int_equal(f->rec.nfreed, 1);
	assert_int_equal(f->rec.freed[0], id1);
	assert_counts(f, 1, 1, 1, PAGE, 0);

	/* A lease taken in the published callback keeps such a version. */
	v1 = add_ok(f, &f->prod, spec(&ts, "b", 0, 1, 1, PAGE), 0);
	v2 = add_ok(f, &f->prod, spec(&ts, "b", 0, 1, 1, PAGE), 0);
	assert_int_equal(v1->number, 3);
	assert_int_equal(registry_seal(&f->r, &f->prod, "b", 4, 0, NULL, 0), 0);
	f->rec.lease_on_publish = &f->cons;
	assert_int_equal(registry_seal(&f->r, &f->prod, "b", 3, 0, NULL, 0), 0);
	f->rec.lease_on_publish = NULL;
	assert_ptr_equal(f->rec.last_lease->version, v1);
	assert_found(f, &f->cons, "b", REG_EXACT, 3, v1);
	assert_found(f, &f->cons, "b", REG_LATEST, 0, v2);
	assert_counts(f, 1, 2, 2, 2 * PAGE, 1);
	assert_int_equal(registry_release(&f->r, &f->cons,
					  f->rec.last_lease->id), 0);
	assert_not_found(f, &f->cons, "b", REG_EXACT, 3, -ENOENT);
	assert_counts(f, 1, 1, 1, PAGE, 0);
}

static void test_abort(void **state)
{
	struct fix *f = *state;
	struct version *s1, *v;
	struct tspec ts;
	uint64_t id;

	s1 = publish(f, &f->prod, "ab", 0);
	v = add_ok(f, &f->prod, spec(&ts, "ab", 0, 1, 2, PAGE), 0);
	assert_int_equal(v->number, 2);
	id = v->buffers[1]->id;
	assert_int_equal(registry_abort(&f->r, &f->cons, "ab", 2, 0), -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->prod, "ab", 3, 0), -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->prod, "nope", 2, 0), -ENOENT);
	/* Sealed, as Seal says too, to whoever may read it. */
	assert_int_equal(registry_abort(&f->r, &f->prod, "ab", 1, 0),
			 -EALREADY);
	assert_int_equal(registry_abort(&f->r, &f->prod, "ab", 2, 0), 0);
	assert_int_equal(f->rec.nfreed, 2);
	assert_int_equal(f->rec.freed[1], id);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->r.owned_bytes, PAGE);
	assert_null(f->prod.versions);
	assert_int_equal(registry_abort(&f->r, &f->prod, "ab", 2, 0), -ENOENT);
	/* Numbers are not reused after an abort. */
	v = add_ok(f, &f->prod, spec(&ts, "ab", 0, 1, 1, PAGE), 0);
	assert_int_equal(v->number, 3);
	assert_int_equal(registry_abort(&f->r, &f->prod, "ab", 3, 0), 0);
	assert_found(f, &f->cons, "ab", REG_LATEST, 0, s1);
	assert_int_equal(f->rec.npublished, 1);
	/* A name with nothing but a pending version goes with its abort. */
	add_ok(f, &f->prod, spec(&ts, "solo", 0, 1, 1, PAGE), 0);
	assert_int_equal(registry_abort(&f->r, &f->prod, "solo", 1, 0), 0);
	assert_null(registry_entry(&f->r, "solo"));
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
}

/* Seal and Abort name a pending version by its writer id: numbers restart
 * after a Delete, writer ids never do, and another owner's id finds
 * nothing. */
static void test_writer_ids(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2, *p;
	struct tspec ts;
	uint64_t w1, w2;
	int err;

	v1 = add_ok(f, &f->prod, spec(&ts, "w", 0, 1, 1, PAGE), 0);
	w1 = registry_writer(v1);
	assert_true(w1 != 0);
	assert_ptr_equal(registry_pending(&f->r, &f->prod, "w", 1, w1, &err),
			 v1);
	assert_int_equal(err, 0);
	assert_int_equal(registry_delete(&f->r, &f->cons, "w"), 0);
	v2 = add_ok(f, &f->prod, spec(&ts, "w", 0, 1, 1, PAGE), 0);
	w2 = registry_writer(v2);
	assert_int_equal(v2->number, 1);
	assert_true(w2 > w1);

	/* The first writer's version is gone: its id finds nothing, and
	 * harms nothing. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 1, w1, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->prod, "w", 1, w1), -ENOENT);
	/* Another owner's id, even of the same uid; an id with another
	 * number or name; an id never handed out. */
	assert_int_equal(registry_seal(&f->r, &f->cons, "w", 1, w2, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->cons, "w", 1, w2), -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 2, w2, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "v", 1, w2, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 1, w2 + 100,
				       NULL, 0), -ENOENT);
	assert_null(registry_pending(&f->r, &f->other, "w", 1, w2, &err));
	assert_int_equal(err, -ENOENT);
	assert_int_equal(v2->state, VERSION_PENDING);
	assert_int_equal(f->rec.npublished, 0);

	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 1, w2, NULL, 0),
			 0);
	assert_found(f, &f->cons, "w", REG_LATEST, 0, v2);
	/* A sealed writer is gone; by name and number the version is
	 * sealed, to whoever may read it. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 1, w2, NULL, 0),
			 -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->prod, "w", 1, w2), -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "w", 1, 0, NULL, 0),
			 -EALREADY);
	assert_int_equal(registry_abort(&f->r, &f->prod, "w", 1, 0),
			 -EALREADY);
	assert_int_equal(registry_seal(&f->r, &f->other, "w", 1, 0, NULL, 0),
			 -EALREADY);
	/* Who may not read a sealed version learns nothing of it. */
	p = publish(f, &f->prod, "hidden", 0600);
	assert_int_equal(registry_seal(&f->r, &f->other, "hidden", 1, 0,
				       NULL, 0), -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->other, "hidden", 1, 0),
			 -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->other, "hidden", 2, 0,
				       NULL, 0), -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "hidden", 1, 0, NULL,
				       0), -EALREADY);
	assert_found(f, &f->prod, "hidden", REG_LATEST, 0, p);
	/* Exports have no writer. */
	assert_int_equal(registry_writer(export(f, &f->prod, "e", 0)), 0);
}

/* A Delete withdraws a pending version: no Seal reaches it, but a writer
 * lease (daemon-owned cuda-ipc memory its writer still maps) keeps it, and
 * its buffers, until the writer lets go. */
static void test_delete_pending_leased(void **state)
{
	struct fix *f = *state;
	struct version *v;
	struct tspec ts;
	struct lease *l;
	uint64_t lid;

	v = add_ok(f, &f->prod, spec(&ts, "g", 0, 1, 1, PAGE), 0);
	assert_int_equal(registry_lease(&f->r, &f->prod, v, &l, NULL), 0);
	lid = l->id;
	assert_int_equal(registry_delete(&f->r, &f->cons, "g"), 0);
	assert_null(registry_entry(&f->r, "g"));
	assert_counts(f, 0, 1, 1, PAGE, 1);
	assert_int_equal(f->rec.nfreed, 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "g", 1,
				       registry_writer(v), NULL, 0), -ENOENT);
	assert_int_equal(registry_abort(&f->r, &f->prod, "g", 1,
					registry_writer(v)), -ENOENT);
	/* A new "g" numbers after it. */
	assert_int_equal(publish(f, &f->prod, "g", 0)->number, 2);
	assert_int_equal(registry_release(&f->r, &f->prod, lid), 0);
	assert_int_equal(f->rec.nfreed, 1);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->rec.npublished, 1);

	/* Withdrawn and leased when its owner goes: the lease goes first,
	 * and the version with it. */
	v = add_ok(f, &f->prod, spec(&ts, "h", 0, 1, 1, PAGE), 0);
	assert_int_equal(registry_lease(&f->r, &f->prod, v, &l, NULL), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "h"), 0);
	registry_owner_drop(&f->r, &f->prod);
	assert_counts(f, 1, 1, 1, PAGE, 0);
}

/* ---- delete and owners ------------------------------------------------------ */

static void test_delete(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2, *v3, *n1;
	struct tspec ts;
	struct lease *l;
	uint64_t lid;
	int fd1;

	v1 = publish(f, &f->prod, "d", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v1, &l, NULL), 0);
	lid = l->id;
	v2 = publish(f, &f->prod, "d", 0);
	v3 = add_ok(f, &f->prod, spec(&ts, "d", 0, 1, 1, PAGE), 0);
	(void)v2;
	(void)v3;
	fd1 = v1->buffers[0]->fd;
	assert_counts(f, 1, 3, 3, 3 * PAGE, 1);

	assert_int_equal(registry_delete(&f->r, &f->other, "d"), -EPERM);
	assert_int_equal(registry_delete(&f->r, &f->prod, "nope"), -ENOENT);
	assert_int_equal(registry_delete(&f->r, &f->prod, "d"), 0);
	/* Nothing of it can be found any more... */
	assert_null(registry_entry(&f->r, "d"));
	assert_not_found(f, &f->cons, "d", REG_LATEST, 0, -ENOENT);
	assert_not_found(f, &f->cons, "d", REG_EXACT, 1, -ENOENT);
	assert_not_found(f, &f->cons, "d", REG_EXACT, 2, -ENOENT);
	assert_int_equal(registry_delete(&f->r, &f->prod, "d"), -ENOENT);
	assert_int_equal(registry_seal(&f->r, &f->prod, "d", 3, 0, NULL, 0),
			 -ENOENT);
	assert_null(f->prod.versions);
	/* ...but the leased version lives on; the others died. */
	assert_counts(f, 0, 1, 1, PAGE, 1);
	assert_int_equal(f->rec.nfreed, 2);
	assert_int_equal(v1->leases, 1);
	assert_true(v1->entry->detached);
	assert_true(fd_open(fd1));
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);

	/* The name is free for a new entry meanwhile. */
	n1 = publish(f, &f->other, "d", 0600);
	assert_found(f, &f->other, "d", REG_LATEST, 0, n1);
	assert_not_found(f, &f->cons, "d", REG_LATEST, 0, -EPERM);
	assert_counts(f, 1, 2, 2, 2 * PAGE, 1);

	assert_int_equal(registry_release(&f->r, &f->cons, lid), 0);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->rec.nfreed, 3);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
	assert_int_equal(registry_delete(&f->r, &f->other, "d"), 0);
	assert_counts(f, 0, 0, 0, 0, 0);
	assert_int_equal(f->r.owned_bytes, 0);
	assert_int_equal(fds_count(getpid()), f->fd_base);
}

static void test_owner_drop(void **state)
{
	struct fix *f = *state;
	struct version *s1, *s2, *e1, *x1;
	struct tspec ts;
	struct lease *l;
	int freed;

	/* Store: s v1 leased by cons, superseded by s v2. */
	s1 = publish(f, &f->prod, "s", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, s1, &l, NULL), 0);
	s2 = publish(f, &f->prod, "s", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, s2, &l, NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, s2, &l, NULL), 0);
	/* A pending version of prod. */
	add_ok(f, &f->prod, spec(&ts, "p", 0, 1, 1, PAGE), 0);
	/* Exports of prod: e leased by cons, x not. */
	e1 = export(f, &f->prod, "e", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, e1, &l, NULL), 0);
	x1 = export(f, &f->prod, "x", 0);
	(void)x1;
	assert_counts(f, 4, 5, 5, 5 * PAGE, 4);
	assert_int_equal(f->cons.nleases, 4);
	assert_int_equal(fds_count(getpid()), f->fd_base + 5);
	freed = f->rec.nfreed;

	registry_owner_drop(&f->r, &f->prod);
	/* Pending p is gone, and so is its name. */
	assert_null(registry_entry(&f->r, "p"));
	/* The exports are withdrawn: x dies, e lives for its lease, and
	 * neither is "retired" to a producer that is gone. */
	assert_not_found(f, &f->cons, "x", REG_LATEST, 0, -ENOENT);
	assert_null(registry_entry(&f->r, "x"));
	assert_not_found(f, &f->cons, "e", REG_LATEST, 0, -ENOENT);
	assert_not_found(f, &f->cons, "e", REG_NEWER_THAN, 0, -ENOENT);
	assert_null(registry_entry(&f->r, "e")->latest);
	assert_int_equal(e1->leases, 1);
	assert_null(e1->producer);
	assert_null(f->prod.versions);
	assert_int_equal(f->rec.nretired, 0);
	assert_int_equal(f->rec.nfreed, freed + 2);
	/* Sealed store versions are the daemon's: untouched. */
	assert_found(f, &f->cons, "s", REG_LATEST, 0, s2);
	assert_counts(f, 2, 3, 3, 3 * PAGE, 4);
	assert_int_equal(fds_count(getpid()), f->fd_base + 3);

	registry_owner_drop(&f->r, &f->cons);
	assert_int_equal(f->cons.nleases, 0);
	assert_null(f->cons.leases);
	assert_int_equal(f->rec.nretired, 0);
	assert_null(registry_entry(&f->r, "e"));
	assert_not_found(f, &f->cons, "s", REG_EXACT, 1, -ENOENT);
	assert_found(f, &f->cons, "s", REG_LATEST, 0, s2);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(f->rec.nfreed, freed + 4);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
	/* A dropped owner may be dropped again, harmlessly. */
	registry_owner_drop(&f->r, &f->cons);
	registry_owner_drop(&f->r, &f->prod);
	assert_counts(f, 1, 1, 1, PAGE, 0);
}

/* ---- export mode --------------------------------------------------------- */

static void test_export_retired(void **state)
{
	struct fix *f = *state;
	struct version *v1, *v2, *v3;
	struct tspec ts;
	struct lease *l;
	int fd1;

	fd1 = make_memfd(PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	spec(&ts, "x", 0, 1, 1, PAGE);
	ts.fds[0] = fd1;
	v1 = add_ok(f, &f->prod, &ts.s, 1);
	/* Taken over: the spec's fd is cleared, the registry holds it. */
	assert_int_equal(ts.fds[0], -1);
	assert_int_equal(v1->buffers[0]->fd, fd1);
	assert_int_equal(v1->state, VERSION_SEALED);
	assert_true(v1->exported);
	assert_ptr_equal(v1->producer, &f->prod);
	assert_false(v1->buffers[0]->daemon_owned);
	assert_int_equal(v1->number, 1);
	assert_found(f, &f->cons, "x", REG_LATEST, 0, v1);
	assert_int_equal(f->rec.npublished, 1);
	assert_int_equal(f->rec.pub_number[0], 1);
	/* Producer memory does not count as the daemon's bytes. */
	assert_int_equal(f->r.owned_bytes, 0);
	assert_counts(f, 1, 1, 1, PAGE, 0);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);

	/* Superseded and unleased: retired to its producer at once, and the
	 * registry's fd is closed. */
	v2 = export(f, &f->prod, "x", 0);
	assert_int_equal(f->rec.nretired, 1);
	assert_ptr_equal(f->rec.ret_producer[0], &f->prod);
	assert_string_equal(f->rec.ret_name[0], "x");
	assert_int_equal(f->rec.ret_number[0], 1);
	assert_int_equal(f->rec.nfreed, 1);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
	assert_false(fd_open(fd1));

	/* Superseded but leased: retired only at the release. */
	assert_int_equal(registry_lease(&f->r, &f->cons, v2, &l, NULL), 0);
	v3 = export(f, &f->prod, "x", 0);
	assert_int_equal(f->rec.nretired, 1);
	assert_found(f, &f->cons, "x", REG_EXACT, 2, v2);
	assert_found(f, &f->cons, "x", REG_LATEST, 0, v3);
	assert_int_equal(registry_release(&f->r, &f->cons, l->id), 0);
	assert_int_equal(f->rec.nretired, 2);
	assert_ptr_equal(f->rec.ret_producer[1], &f->prod);
	assert_int_equal(f->rec.ret_number[1], 2);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);

	/* A store version superseding an export retires it too. */
	publish(f, &f->cons, "x", 0);
	assert_int_equal(f->rec.nretired, 3);
	assert_int_equal(f->rec.ret_number[2], 3);
	assert_counts(f, 1, 1, 1, PAGE, 0);

	/* Deleting the name retires a live export. */
	export(f, &f->prod, "y", 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "y"), 0);
	assert_int_equal(f->rec.nretired, 4);
	assert_string_equal(f->rec.ret_name[3], "y");
	assert_int_equal(f->rec.ret_number[3], 1);
	assert_int_equal(fds_count(getpid()), f->fd_base + 1);
}

static void refuse_export(struct fix *f, int fd, uint64_t claim)
{
	static struct version sentinel;
	struct tspec ts;
	struct version *v = &sentinel;
	int real = fd >= 0 && fd_open(fd);
	int before = fds_count(getpid());

	spec(&ts, "r", 0, 1, 1, claim);
	ts.fds[0] = fd;
	/* A peer's fd that is no good is -EBADF, with the reason in why. */
	f->why = (struct refusal){ 0 };
	assert_int_equal(registry_add(&f->r, &f->prod, &ts.s, 1, &v, &f->why),
			 fd < 0 ? -EINVAL : -EBADF);
	if (fd >= 0)
		assert_non_null(f->why.why);
	/* Neither taken nor closed. */
	assert_int_equal(ts.fds[0], fd);
	assert_ptr_equal(v, &sentinel);
	if (real)
		assert_true(fd_open(fd));
	assert_int_equal(fds_count(getpid()), before);
	assert_null(registry_entry(&f->r, "r"));
	assert_counts(f, 0, 0, 0, 0, 0);
}

/* A queue name's first add that fails once the name is made (here in
 * store mode: the memfd the caller made for it off the loop is smaller
 * than the buffer) leaves no name behind: before, the empty queue stayed,
 * owned by the failed producer and in queue mode, so that a plain export
 * of the name was refused (-EMEDIUMTYPE) until someone deleted it. */
static void test_queue_first_add_failed_leaves_nothing(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	struct version *v = NULL;
	int made[1] = { 1 };
	int small = make_memfd(PAGE / 2, 0);

	spec(&ts, "q", 0, 1, 1, PAGE);
	ts.s.queue = 1;
	ts.s.made = made;
	ts.fds[0] = small;
	assert_int_equal(registry_add(&f->r, &f->prod, &ts.s, 0, &v, NULL),
			 -EINVAL);
	assert_null(registry_entry(&f->r, "q"));
	assert_counts(f, 0, 0, 0, 0, 0);
	close(small);
	/* The name is free: another producer's plain export makes it. */
	v = export(f, &f->cons, "q", 0);
	assert_non_null(registry_entry(&f->r, "q"));
	assert_null(registry_entry(&f->r, "q")->queue);
}

static void test_export_fd_refused(void **state)
{
	struct fix *f = *state;
	char tmpl[] = "/tmp/test_registry.XXXXXX";
	int p[2], sv[2], nos, shrink, small, reg, ok, ro, wo;
	char path[64];
	struct tspec ts;

	nos = make_memfd(PAGE, 0);
	shrink = make_memfd(PAGE, F_SEAL_SHRINK);
	small = make_memfd(PAGE - 1, F_SEAL_SHRINK | F_SEAL_GROW);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0,
				    sv), 0);
	reg = mkostemp(tmpl, O_CLOEXEC);
	assert_true(reg >= 0);
	unlink(tmpl);
	assert_int_equal(ftruncate(reg, PAGE), 0);

	refuse_export(f, nos, PAGE);
	refuse_export(f, shrink, PAGE);
	refuse_export(f, small, PAGE);
	refuse_export(f, p[0], PAGE);
	refuse_export(f, p[1], 0);
	refuse_export(f, sv[0], PAGE);
	refuse_export(f, reg, PAGE);
	refuse_export(f, -1, PAGE);
	refuse_export(f, 1000000, PAGE); /* not an fd at all */

	/* Regression test: a read-only (or write-only) reopen of a good memfd
	 * was taken, and the seal that keeps readers from writing could not
	 * be added through it: every reader could reopen it read-write. */
	ok = make_memfd(PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", ok);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	wo = open(path, O_WRONLY | O_CLOEXEC);
	assert_true(ro >= 0 && wo >= 0);
	refuse_export(f, ro, PAGE);
	assert_true(strstr(f->why.why, "read-write") != NULL);
	refuse_export(f, wo, PAGE);
	assert_int_equal(fcntl(ok, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW);
	close(ro);
	close(wo);

	/* One good and one bad buffer: the good fd is not taken either. */
	{
		struct version *v = NULL;

		spec(&ts, "r", 0, 2, 2, PAGE);
		ts.fds[0] = ok;
		ts.fds[1] = nos;
		assert_int_equal(registry_add(&f->r, &f->prod, &ts.s, 1, &v,
					      NULL),
				 -EBADF);
		assert_int_equal(ts.fds[0], ok);
		assert_int_equal(ts.fds[1], nos);
		assert_true(fd_open(ok) && fd_open(nos));
		assert_counts(f, 0, 0, 0, 0, 0);
	}
	/* The claim may be smaller than the memfd, and more seals are fine. */
	{
		struct version *v = NULL;

		assert_int_equal(fcntl(shrink, F_ADD_SEALS, F_SEAL_GROW), 0);
		spec(&ts, "r", 0, 1, 1, PAGE / 2);
		ts.fds[0] = shrink;
		assert_int_equal(registry_add(&f->r, &f->prod, &ts.s, 1, &v,
					      NULL), 0);
		assert_int_equal(ts.fds[0], -1);
		assert_int_equal(v->buffers[0]->fd, shrink);
	}
	assert_int_equal(f->rec.nretired, 0);
	close(nos);
	close(small);
	close(p[0]);
	close(p[1]);
	close(sv[0]);
	close(sv[1]);
	close(reg);
	close(ok);
}

/* ---- bad descriptions and limits ------------------------------------------ */

static void expect_add(struct fix *f, struct registry_owner *o,
		       struct registry_spec *s, int exported, int want)
{
	struct version *v = NULL;
	int before = fds_count(getpid());
	uint64_t names = f->r.nnames, versions = f->r.nversions;
	uint64_t buffers = f->r.nbuffers, bytes = f->r.bytes;
	int ret = registry_add(&f->r, o, s, exported, &v, NULL);

	if (ret == 0) {
		/* Accepted as wanted: drop it again to compare. */
		assert_non_null(v);
		if (!exported)
			assert_int_equal(registry_abort(&f->r, o, s->name,
							v->number, 0), 0);
	}
	assert_int_equal(ret, want);
	if (ret)
		assert_null(v);
	/* A refusal leaves no trace. */
	assert_int_equal(fds_count(getpid()), before);
	assert_int_equal(f->r.nnames, names);
	assert_int_equal(f->r.nversions, versions);
	assert_int_equal(f->r.nbuffers, buffers);
	assert_int_equal(f->r.bytes, bytes);
}

static void test_add_invalid(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	uint8_t ev[REGISTRY_HANDLE_MAX + 1] = { 0 };

	expect_add(f, &f->prod, spec(&ts, "a//b", 0, 1, 1, PAGE), 0, -EINVAL);
	expect_add(f, &f->prod, spec(&ts, "", 0, 1, 1, PAGE), 0, -EINVAL);
	expect_add(f, &f->prod, spec(&ts, "ok", 0700, 1, 1, PAGE), 0, -EINVAL);
	expect_add(f, &f->prod, spec(&ts, "ok", 01644, 1, 1, PAGE), 0, -EINVAL);
	expect_add(f, &f->prod, spec(&ts, "ok", 0, 0, 1, PAGE), 0, -EINVAL);
	expect_add(f, &f->prod, spec(&ts, "ok", 0, 1, 0, PAGE), 0, -EINVAL);
	/* A tensor larger than its buffer, or in a buffer that is not. */
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.shape[0]++;
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.t[0].buffer = 1;
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.dt.bits = 12;
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	/* Buffers: kind, device. */
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.b[0].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	expect_add(f, &f->prod, &ts.s, 0, -EOPNOTSUPP);
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.b[0].device = NULL;
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.dev.type = 2; /* kDLCUDA memory is not a host buffer */
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.dev.type = 3; /* kDLCUDAHost is */
	expect_add(f, &f->prod, &ts.s, 0, 0);
	/* An event handle longer than any CUDA handle. */
	spec(&ts, "ok", 0, 1, 1, PAGE);
	ts.s.event_handle = ev;
	ts.s.event_len = sizeof(ev);
	expect_add(f, &f->prod, &ts.s, 0, -EINVAL);
	ts.s.event_len = REGISTRY_HANDLE_MAX;
	expect_add(f, &f->prod, &ts.s, 0, 0);
	assert_int_equal(f->rec.npublished, 0);
}

static void test_limit_tensors_buffers(void **state)
{
	struct fix *f = *state;
	struct tspec ts;

	f->r.limits.max_tensors = 2;
	f->r.limits.max_buffers = 3;
	expect_add(f, &f->prod, spec(&ts, "l", 0, 3, 1, PAGE), 0, -E2BIG);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 2, 1, PAGE), 0, 0);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 2, 4, PAGE), 0, -E2BIG);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 2, 3, PAGE), 0, 0);
	/* Beyond the hard maximum whatever the configured limit says. */
	f->r.limits.max_buffers = UINT32_MAX;
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1,
				     REGISTRY_BUFFERS_HARD_MAX + 1, PAGE), 0,
		   -E2BIG);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1,
				     REGISTRY_BUFFERS_HARD_MAX, PAGE), 0, 0);
}

static void test_limit_buffer_bytes(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	int fd;

	f->r.limits.max_buffer_bytes = 2 * PAGE;
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE + 4), 0,
		   -EFBIG);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE), 0, 0);
	/* The same for exports; the fd stays the caller's. */
	fd = make_memfd(3 * PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	spec(&ts, "l", 0, 1, 1, 3 * PAGE);
	ts.fds[0] = fd;
	expect_add(f, &f->prod, &ts.s, 1, -EFBIG);
	assert_int_equal(ts.fds[0], fd);
	assert_true(fd_open(fd));
	close(fd);
}

static void test_limit_bytes(void **state)
{
	struct fix *f = *state;
	struct version *a, *b;
	struct tspec ts;

	f->r.limits.max_bytes = 4 * PAGE;
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 4 * PAGE + 4), 0,
		   -ENOSPC);
	a = add_ok(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE), 0);
	b = add_ok(f, &f->prod, spec(&ts, "l", 0, 2, 2, PAGE), 0);
	assert_int_equal(f->r.owned_bytes, 4 * PAGE);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 4), 0, -ENOSPC);
	expect_add(f, &f->other, spec(&ts, "m", 0, 1, 1, 4), 0, -ENOSPC);
	/* Exports are producer memory and do not count. */
	export(f, &f->prod, "e", 0);
	assert_int_equal(f->r.owned_bytes, 4 * PAGE);
	/* Bytes come back when a version dies. */
	assert_int_equal(registry_abort(&f->r, &f->prod, "l", a->number, 0), 0);
	assert_int_equal(f->r.owned_bytes, 2 * PAGE);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE + 4), 0,
		   -ENOSPC);
	a = add_ok(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE), 0);
	/* Sealing b then a: b is superseded, dies, and gives its back. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "l", b->number, 0, NULL,
				       0), 0);
	assert_int_equal(registry_seal(&f->r, &f->prod, "l", a->number, 0, NULL,
				       0), 0);
	assert_int_equal(f->r.owned_bytes, 2 * PAGE);
	expect_add(f, &f->prod, spec(&ts, "l", 0, 1, 1, 2 * PAGE), 0, 0);
}

static void test_limit_bytes_overflow(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	struct version *v = NULL;
	int ret;

	/* Regression test (this was a bug, fixed): spec_check sums buffer sizes without an overflow check
	 * (daemon/registry.c, `total += b->size` in spec_check): four
	 * buffers of 2^62 bytes sum to 0 and pass a 1 MiB max_bytes; the
	 * sparse memfds are made and owned_bytes wraps too. dlshared allows
	 * --max-buffer-bytes up to INT64_MAX. */
	f->r.limits.max_bytes = UINT64_C(1) << 20;
	f->r.limits.max_buffer_bytes = INT64_MAX;
	spec(&ts, "huge", 0, 1, 4, UINT64_C(1) << 62);
	ts.shape[0] = 1;
	ret = registry_add(&f->r, &f->prod, &ts.s, 0, &v, NULL);
	if (ret == 0)
		registry_abort(&f->r, &f->prod, "huge", v->number, 0);
	assert_int_equal(ret, -ENOSPC);
}

static void test_limit_leases(void **state)
{
	struct fix *f = *state;
	struct lease *l[3];
	struct version *v;

	f->r.limits.max_leases = 2;
	v = publish(f, &f->prod, "l", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[0], NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[1], NULL), 0);
	assert_int_not_equal(l[0]->id, l[1]->id);
	l[2] = NULL;
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[2], NULL),
			 -EDQUOT);
	assert_null(l[2]);
	assert_int_equal(f->cons.nleases, 2);
	assert_int_equal(v->leases, 2);
	assert_int_equal(f->r.nleases, 2);
	/* Per owner: another one still may. */
	assert_int_equal(registry_lease(&f->r, &f->other, v, &l[2], NULL), 0);
	assert_int_equal(registry_release(&f->r, &f->cons, l[0]->id), 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[0], NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l[0], NULL),
			 -EDQUOT);
	assert_int_equal(v->leases, 3);
}

/* ---- ACL ------------------------------------------------------------------ */

static void test_acl(void **state)
{
	struct fix *f = *state;
	struct registry_owner root;
	struct tspec ts;
	struct version *v;
	struct entry *e;
	int fd;

	registry_owner_init(&root, 0, 0, 1);

	/* 0600: the owner's alone. */
	v = publish(f, &f->prod, "priv", 0600);
	e = registry_entry(&f->r, "priv");
	assert_int_equal(e->mode, 0600);
	assert_int_equal(e->owner_uid, 1000);
	assert_found(f, &f->cons, "priv", REG_LATEST, 0, v); /* same uid */
	assert_not_found(f, &f->other, "priv", REG_LATEST, 0, -EPERM);
	assert_not_found(f, &f->other, "priv", REG_EXACT, 1, -EPERM);
	assert_not_found(f, &f->mate, "priv", REG_LATEST, 0, -EPERM);
	assert_not_found(f, &root, "priv", REG_LATEST, 0, -EPERM);
	assert_false(registry_may(e, &f->other, 4));
	assert_false(registry_may(e, &f->other, 2));
	assert_true(registry_may(e, &f->prod, 4 | 2));
	expect_add(f, &f->other, spec(&ts, "priv", 0, 1, 1, PAGE), 0, -EPERM);
	expect_add(f, &root, spec(&ts, "priv", 0, 1, 1, PAGE), 0, -EPERM);
	assert_int_equal(registry_delete(&f->r, &f->other, "priv"), -EPERM);
	assert_int_equal(registry_delete(&f->r, &f->mate, "priv"), -EPERM);
	/* An export to a name one may not write: refused, fd untouched. */
	fd = make_memfd(PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	spec(&ts, "priv", 0, 1, 1, PAGE);
	ts.fds[0] = fd;
	expect_add(f, &f->other, &ts.s, 1, -EPERM);
	assert_int_equal(ts.fds[0], fd);
	assert_true(fd_open(fd));
	close(fd);
	assert_found(f, &f->prod, "priv", REG_LATEST, 0, v);

	/* 0644 (the default): readable by all, writable by the owner. */
	v = publish(f, &f->prod, "pub", 0);
	assert_int_equal(registry_entry(&f->r, "pub")->mode, 0644);
	assert_found(f, &f->other, "pub", REG_LATEST, 0, v);
	assert_found(f, &f->mate, "pub", REG_LATEST, 0, v);
	expect_add(f, &f->other, spec(&ts, "pub", 0, 1, 1, PAGE), 0, -EPERM);
	expect_add(f, &f->mate, spec(&ts, "pub", 0, 1, 1, PAGE), 0, -EPERM);
	assert_int_equal(registry_delete(&f->r, &f->other, "pub"), -EPERM);

	/* 0640: the group reads. */
	v = publish(f, &f->prod, "grp", 0640);
	assert_found(f, &f->mate, "grp", REG_LATEST, 0, v);
	assert_not_found(f, &f->other, "grp", REG_LATEST, 0, -EPERM);
	expect_add(f, &f->mate, spec(&ts, "grp", 0, 1, 1, PAGE), 0, -EPERM);

	/* 0660: the group writes; only the owner changes the mode. */
	publish(f, &f->prod, "gw", 0660);
	v = publish(f, &f->mate, "gw", 0666);
	assert_int_equal(v->number, 2);
	assert_int_equal(registry_entry(&f->r, "gw")->mode, 0660);
	assert_int_equal(registry_entry(&f->r, "gw")->owner_uid, 1000);
	assert_not_found(f, &f->other, "gw", REG_LATEST, 0, -EPERM);
	v = publish(f, &f->prod, "gw", 0600);
	assert_int_equal(registry_entry(&f->r, "gw")->mode, 0600);
	assert_int_equal(v->mode, 0600);
	assert_not_found(f, &f->mate, "gw", REG_LATEST, 0, -EPERM);

	/* Class bits, not the union: the group of 0604 reads nothing. */
	publish(f, &f->prod, "odd", 0604);
	assert_found(f, &f->other, "odd", REG_LATEST, 0,
		     registry_entry(&f->r, "odd")->latest);
	assert_not_found(f, &f->mate, "odd", REG_LATEST, 0, -EPERM);

	/* 0666: anyone writes, and deletes. */
	publish(f, &f->prod, "all", 0666);
	v = publish(f, &f->other, "all", 0);
	assert_found(f, &f->prod, "all", REG_LATEST, 0, v);
	assert_int_equal(registry_delete(&f->r, &f->other, "all"), 0);

	/* The owner is bound by its own mode too. */
	publish(f, &f->prod, "wo", 0200);
	assert_not_found(f, &f->prod, "wo", REG_LATEST, 0, -EPERM);
	registry_owner_drop(&f->r, &root);
}

/* ---- deinit, and what outlives a delete --------------------------------- */

/* A version's tensors, dims, keys, buffers and CUDA records share one
 * block: every field must come back as given, whatever the mix. */
/* Publishes one producer cuda-ipc buffer of size bytes on the device
 * with UUID 16 bytes of dev, as name. */
static void add_on_device(struct fix *f, const char *name, uint8_t dev,
			  uint64_t size)
{
	static const Dlshare__Buffer b0 = DLSHARE__BUFFER__INIT;
	static const Dlshare__Tensor t0 = DLSHARE__TENSOR__INIT;
	static const Dlshare__Device d0 = DLSHARE__DEVICE__INIT;
	static const Dlshare__DataType dt0 = DLSHARE__DATA_TYPE__INIT;
	uint8_t uuid[16], handle[REGISTRY_HANDLE_MAX];
	Dlshare__Device d = d0;
	Dlshare__DataType dt = dt0;
	Dlshare__Buffer b = b0, *bp = &b;
	Dlshare__Tensor t = t0, *tp = &t;
	int64_t shape = 4;
	int fd = -1;
	struct registry_spec s = { .name = name, .tensors = &tp,
				   .ntensors = 1, .buffers = &bp,
				   .nbuffers = 1, .fds = &fd };

	memset(uuid, dev, sizeof(uuid));
	memset(handle, 7, sizeof(handle));
	d.type = 2;
	d.has_uuid = 1;
	d.uuid.data = uuid;
	d.uuid.len = sizeof(uuid);
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	b.size = size;
	b.device = &d;
	b.has_ipc_handle = 1;
	b.ipc_handle.data = handle;
	b.ipc_handle.len = sizeof(handle);
	b.has_ipc_offset = 1;
	dt.code = 2, dt.bits = 32, dt.lanes = 1;
	t.dtype = &dt;
	t.n_shape = 1;
	t.shape = &shape;
	add_ok(f, &f->prod, &s, 1);
}

/* Live buffers by kind and by device (the metrics): REGISTRY_DEVICES_MAX
 * rows, the devices past them summed in dev_other, a row free again once
 * its device holds nothing, and each buffer taken out of the row it was
 * counted in. */
static void test_device_rows(void **state)
{
	struct fix *f = *state;
	const unsigned n = REGISTRY_DEVICES_MAX + 2;
	const unsigned ipc = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	char name[32];

	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "dev/%u", i);
		add_on_device(f, name, (uint8_t)(i + 1), 1024 * (i + 1));
	}
	assert_int_equal(f->r.kind_buffers[ipc], n);
	for (unsigned i = 0; i < REGISTRY_DEVICES_MAX; i++) {
		assert_int_equal(f->r.devices[i].buffers, 1);
		assert_int_equal(f->r.devices[i].uuid[0], i + 1);
		assert_int_equal(f->r.devices[i].bytes, 1024 * (i + 1));
	}
	assert_int_equal(f->r.dev_other.buffers, 2);
	assert_int_equal(f->r.dev_other.bytes, 1024 * (n - 1 + n));
	/* A second buffer on a counted device joins its row. */
	add_on_device(f, "dev/again", 1, 128);
	assert_int_equal(f->r.devices[0].buffers, 2);
	assert_int_equal(f->r.devices[0].bytes, 1024 + 128);
	/* Device 1 gone: its row is free, and a new device takes it. */
	assert_int_equal(registry_delete(&f->r, &f->prod, "dev/0"), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "dev/again"), 0);
	assert_int_equal(f->r.devices[0].buffers, 0);
	add_on_device(f, "dev/new", 0xee, 64);
	assert_int_equal(f->r.devices[0].uuid[0], 0xee);
	assert_int_equal(f->r.devices[0].buffers, 1);
	/* One counted in dev_other goes from dev_other, not from a row that
	 * now counts its device (the first free one, had there been one). */
	snprintf(name, sizeof(name), "dev/%u", n - 1);
	assert_int_equal(registry_delete(&f->r, &f->prod, name), 0);
	assert_int_equal(f->r.dev_other.buffers, 1);
	assert_int_equal(f->r.dev_other.bytes, 1024 * (n - 1));
	assert_int_equal(f->r.kind_buffers[ipc], n - 1);
	for (unsigned i = 1; i < n - 1; i++) {
		snprintf(name, sizeof(name), "dev/%u", i);
		assert_int_equal(registry_delete(&f->r, &f->prod, name), 0);
	}
	assert_int_equal(registry_delete(&f->r, &f->prod, "dev/new"), 0);
	assert_int_equal(f->r.kind_buffers[ipc], 0);
	assert_int_equal(f->r.kind_bytes[ipc], 0);
	assert_int_equal(f->r.dev_other.buffers, 0);
	for (unsigned i = 0; i < REGISTRY_DEVICES_MAX; i++)
		assert_int_equal(f->r.devices[i].buffers, 0);
}

static void test_version_contents(void **state)
{
	struct fix *f = *state;
	static const Dlshare__Buffer b0 = DLSHARE__BUFFER__INIT;
	static const Dlshare__Tensor t0 = DLSHARE__TENSOR__INIT;
	static const Dlshare__Device d0 = DLSHARE__DEVICE__INIT;
	static const Dlshare__DataType dt0 = DLSHARE__DATA_TYPE__INIT;
	uint8_t uuid[16], handle[REGISTRY_HANDLE_MAX], ev[REGISTRY_HANDLE_MAX];
	Dlshare__Device dev[3] = { d0, d0, d0 };
	Dlshare__DataType dt[3] = { dt0, dt0, dt0 };
	Dlshare__Buffer b[3] = { b0, b0, b0 }, *bp[3];
	Dlshare__Tensor t[4] = { t0, t0, t0, t0 }, *tp[4];
	int64_t shape2[2] = { 3, 5 }, strides2[2] = { 1, 3 }, shape1 = 2;
	int fds[3] = { -1, -1, -1 };
	struct registry_spec s = { .name = "contents", .tensors = tp,
				   .ntensors = 4, .buffers = bp,
				   .nbuffers = 3, .fds = fds,
				   .event_handle = ev,
				   .event_len = sizeof(ev) };
	struct version *v;

	for (size_t i = 0; i < sizeof(uuid); i++)
		uuid[i] = (uint8_t)(0xa0 + i);
	for (size_t i = 0; i < sizeof(handle); i++) {
		handle[i] = (uint8_t)i;
		ev[i] = (uint8_t)(0xff - i);
	}
	/* A host buffer, and two producer CUDA IPC buffers on one device. */
	dev[0].type = 1;
	b[0].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b[0].size = PAGE;
	fds[0] = make_memfd(PAGE, F_SEAL_SHRINK | F_SEAL_GROW);
	for (int i = 1; i < 3; i++) {
		dev[i].type = 2;
		dev[i].has_uuid = 1;
		dev[i].uuid.data = uuid;
		dev[i].uuid.len = sizeof(uuid);
		b[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
		b[i].size = 65536u * (unsigned)i;
		b[i].has_ipc_handle = 1;
		b[i].ipc_handle.data = handle;
		b[i].ipc_handle.len = sizeof(handle);
		b[i].has_ipc_offset = 1;
		b[i].ipc_offset = 1000u * (unsigned)i;
	}
	for (int i = 0; i < 3; i++) {
		b[i].device = &dev[i];
		bp[i] = &b[i];
	}
	/* No key, an empty key, two keys; 0, 1 and 2 dims; strides or not;
	 * dtype fields at their widest. */
	dt[0].code = 2, dt[0].bits = 32, dt[0].lanes = 1;
	dt[1].code = 0, dt[1].bits = 256, dt[1].lanes = 1;
	dt[2].code = 6, dt[2].bits = 8, dt[2].lanes = 1024;
	t[0].dtype = &dt[0];
	t[1].dtype = &dt[1];
	t[1].key = "";
	t[1].buffer = 1;
	t[1].n_shape = 1;
	t[1].shape = &shape1;
	t[2].dtype = &dt[2];
	t[2].key = "layer.0/weight";
	t[2].buffer = 2;
	t[2].offset = 8;
	t[2].n_shape = 2;
	t[2].shape = shape2;
	t[3].dtype = &dt[0];
	t[3].key = "b";
	t[3].buffer = 2;
	t[3].n_shape = 2;
	t[3].shape = shape2;
	t[3].n_strides = 2;
	t[3].strides = strides2;
	for (int i = 0; i < 4; i++)
		tp[i] = &t[i];

	v = add_ok(f, &f->prod, &s, 1);
	assert_int_equal(fds[0], -1);
	assert_int_equal(v->ntensors, 4);
	assert_int_equal(v->nbuffers, 3);
	assert_int_equal(registry_bytes(v), PAGE + 65536 + 131072);
	assert_int_equal(v->event_len, sizeof(ev));
	assert_memory_equal(v->cold->event_handle, ev, sizeof(ev));

	assert_string_equal(v->tensors[0].key, "");
	assert_string_equal(v->tensors[1].key, "");
	assert_string_equal(v->tensors[2].key, "layer.0/weight");
	assert_string_equal(v->tensors[3].key, "b");
	for (int i = 0; i < 4; i++) {
		const struct rtensor *rt = &v->tensors[i];

		assert_int_equal(rt->buffer, t[i].buffer);
		assert_int_equal(rt->offset, t[i].offset);
		assert_int_equal(rt->code, t[i].dtype->code);
		assert_int_equal(rt->bits, t[i].dtype->bits);
		assert_int_equal(rt->lanes, t[i].dtype->lanes);
		assert_int_equal(rt->ndim, t[i].n_shape);
		assert_int_equal(rt->has_strides, t[i].n_strides != 0);
		if (rt->ndim) {
			assert_memory_equal(rt->shape, t[i].shape,
					    rt->ndim * sizeof(int64_t));
			assert_int_equal((uintptr_t)rt->shape %
					 _Alignof(int64_t), 0);
		}
		if (rt->has_strides)
			assert_memory_equal(rt->strides, t[i].strides,
					    rt->ndim * sizeof(int64_t));
	}
	for (int i = 0; i < 3; i++) {
		const struct rbuffer *rb = v->buffers[i];

		assert_int_equal((uintptr_t)rb % _Alignof(struct rbuffer), 0);
		assert_ptr_equal(rb->version, v);
		assert_int_equal(rb->kind, b[i].kind);
		assert_int_equal(rb->size, b[i].size);
		assert_int_equal(rb->dev_type, dev[i].type);
		assert_false(rb->daemon_owned);
		if (i == 0) {
			assert_null(rb->cuda);
			assert_false(rb->has_uuid);
			assert_int_equal(rb->ipc_handle_len, 0);
			assert_true(rb->fd >= 0);
			continue;
		}
		assert_non_null(rb->cuda);
		assert_int_equal((uintptr_t)rb->cuda %
				 _Alignof(struct rbuffer_cuda), 0);
		assert_int_equal(rb->fd, -1);
		assert_true(rb->has_uuid);
		assert_memory_equal(rb->cuda->uuid, uuid, sizeof(uuid));
		assert_int_equal(rb->ipc_handle_len, sizeof(handle));
		assert_memory_equal(rb->cuda->ipc_handle, handle,
				    sizeof(handle));
		assert_int_equal(rb->cuda->ipc_offset, b[i].ipc_offset);
	}
	assert_true(v->buffers[1]->id != v->buffers[2]->id);
	assert_ptr_not_equal(v->buffers[1]->cuda, v->buffers[2]->cuda);
}

static void test_deinit_frees_everything(void **state)
{
	struct fix *f = *state;
	struct tspec ts;
	int freed;

	publish(f, &f->prod, "sealed", 0);
	add_ok(f, &f->prod, spec(&ts, "pending", 0, 3, 3, PAGE), 0);
	add_ok(f, &f->cons, spec(&ts, "sealed", 0, 1, 1, PAGE), 0);
	export(f, &f->prod, "exported", 0);
	export(f, &f->prod, "exported", 0600);
	assert_int_equal(fds_count(getpid()), f->fd_base + 6);
	freed = f->rec.nfreed;
	registry_deinit(&f->r);
	f->done = 1;
	/* Every fd closed, every counter zero, no callback. */
	assert_int_equal(fds_count(getpid()), f->fd_base);
	assert_counts(f, 0, 0, 0, 0, 0);
	assert_int_equal(f->r.owned_bytes, 0);
	assert_null(f->r.names);
	assert_null(f->r.detached);
	assert_int_equal(f->rec.nfreed, freed);
	assert_int_equal(f->rec.nretired, 1); /* the superseded export */
}

static void test_deinit_with_leases(void **state)
{
	struct fix *f = *state;
	struct version *v;
	struct lease *l, *tmp;
	uint32_t left;
	int versions_left;

	v = publish(f, &f->prod, "old", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l, NULL), 0);
	publish(f, &f->prod, "old", 0);
	v = publish(f, &f->prod, "gone", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l, NULL), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "gone"), 0);
	export(f, &f->prod, "ex", 0);
	assert_counts(f, 2, 4, 4, 4 * PAGE, 2);

	registry_deinit(&f->r);
	f->done = 1;
	assert_int_equal(fds_count(getpid()), f->fd_base);
	assert_int_equal(f->r.nnames, 0);
	assert_int_equal(f->r.nversions, 0);
	assert_int_equal(f->r.nbuffers, 0);
	assert_int_equal(f->r.bytes, 0);

	/* Regression test (this was a bug, fixed): registry_deinit ("Frees everything") frees versions but not
	 * the leases on them, which stay in their owner's table pointing at
	 * freed versions, and leaves producer->versions pointing at freed
	 * exports (daemon/registry.c, registry_deinit sets v->producer =
	 * NULL instead of unlinking). A registry_owner_drop afterwards is a
	 * use after free; without one the leases leak. */
	left = f->cons.nleases + (uint32_t)f->r.nleases;
	versions_left = f->prod.versions != NULL;
	HASH_ITER(hh, f->cons.leases, l, tmp) {
		HASH_DEL(f->cons.leases, l);
		free(l);
	}
	assert_int_equal(left, 0);
	assert_false(versions_left);
}

static void test_numbers_after_delete(void **state)
{
	struct fix *f = *state;
	struct version *v1, *n1;
	struct lease *l;
	int err;

	v1 = export(f, &f->prod, "n", 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v1, &l, NULL), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "n"), 0);
	n1 = export(f, &f->prod, "n", 0);
	assert_found(f, &f->cons, "n", REG_LATEST, 0, n1);
	assert_int_equal(registry_release(&f->r, &f->cons, l->id), 0);
	assert_int_equal(f->rec.nretired, 1);
	assert_string_equal(f->rec.ret_name[0], "n");
	assert_int_equal(f->rec.ret_number[0], 1);
	/* Regression test (this was a bug, fixed): a re-created name restarts at version 1 while the deleted
	 * name's leased version 1 still lives (daemon/registry.c,
	 * registry_add: a fresh entry starts from last_number 0). The
	 * producer then hears Retired("n", 1) while its new "n" version 1
	 * is live, and libdlshare matches exports by (name, version)
	 * (client/client.c, the BODY_RETIRED branch): it may run the
	 * deleter of the memory still published. A (name, number) that is
	 * retired must not name a live version. */
	assert_null(registry_find(&f->r, &f->cons, "n", REG_EXACT,
				  f->rec.ret_number[0], &err));
}

/* ---- charges, pending versions, sealing ------------------------------------- */

/* Attaches o to its uid record (quotas apply from now on). */
static struct uid_usage *attach(struct fix *f, struct registry_owner *o)
{
	assert_int_equal(registry_owner_attach(&f->r, o, NULL), 0);
	return o->usage;
}

/* A pending store version of name (one page) of o, or the error. */
static int create(struct fix *f, struct registry_owner *o, const char *name,
		  struct version **v)
{
	struct tspec ts;

	*v = NULL;
	f->why = (struct refusal){ 0 };
	return registry_add(&f->r, o, spec(&ts, name, 0, 1, 1, PAGE), 0, v,
			    &f->why);
}

static void assert_charged(struct uid_usage *u, uint32_t versions,
			   uint64_t bytes, uint32_t leased,
			   uint64_t leased_bytes, uint64_t fds)
{
	assert_int_equal(u->versions, versions);
	assert_int_equal(u->host_bytes, bytes);
	assert_int_equal(u->leased, leased);
	assert_int_equal(u->leased_host_bytes, leased_bytes);
	assert_int_equal(u->fds, fds);
}

/* A version's bytes and fds are its producer's while it is reachable,
 * and each leasing uid's (once per uid) while that uid leases it: what
 * only a lease keeps alive is the leaseholder's. */
static void test_charges(void **state)
{
	struct fix *f = *state;
	struct uid_usage *up = attach(f, &f->prod), *uo = attach(f, &f->other);
	struct lease *l1, *l2, *l3;
	struct version *v1, *v2;

	assert_ptr_equal(attach(f, &f->cons), up); /* the same uid */
	assert_int_equal(create(f, &f->prod, "c", &v1), 0);
	assert_int_equal(v1->nfds, REGISTRY_FDS_HOST);
	assert_int_equal(f->r.nfds, REGISTRY_FDS_HOST);
	assert_int_equal(up->pending, 1);
	assert_int_equal(f->prod.npending, 1);
	assert_charged(up, 1, PAGE, 0, 0, 2);
	assert_int_equal(registry_seal(&f->r, &f->prod, "c", 1, 0, NULL, 0), 0);
	assert_int_equal(up->pending, 0);
	assert_int_equal(f->prod.npending, 0);
	assert_charged(up, 1, PAGE, 0, 0, 2);

	/* Two leases of one uid (two of its connections) and one of
	 * another: each uid pays once. */
	assert_int_equal(registry_lease(&f->r, &f->other, v1, &l1, NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->other, v1, &l2, NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->cons, v1, &l3, NULL), 0);
	assert_charged(uo, 0, 0, 1, PAGE, 2);
	assert_charged(up, 1, PAGE, 1, PAGE, 4);

	/* Superseded: the producer pays for the new one only. */
	v2 = publish(f, &f->prod, "c", 0);
	assert_charged(up, 1, PAGE, 1, PAGE, 4);
	assert_int_equal(f->r.nfds, 2 * REGISTRY_FDS_HOST);
	assert_int_equal(registry_release(&f->r, &f->other, l1->id), 0);
	assert_charged(uo, 0, 0, 1, PAGE, 2);
	assert_int_equal(registry_release(&f->r, &f->other, l2->id), 0);
	assert_charged(uo, 0, 0, 0, 0, 0);
	assert_int_equal(registry_release(&f->r, &f->cons, l3->id), 0);
	assert_charged(up, 1, PAGE, 0, 0, 2);
	assert_int_equal(f->r.nfds, REGISTRY_FDS_HOST);

	/* Deleted while leased: the leaseholder pays, the producer not. */
	assert_int_equal(registry_lease(&f->r, &f->other, v2, &l1, NULL), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "c"), 0);
	assert_charged(up, 0, 0, 0, 0, 0);
	assert_charged(uo, 0, 0, 1, PAGE, 2);
	assert_int_equal(registry_release(&f->r, &f->other, l1->id), 0);
	assert_charged(uo, 0, 0, 0, 0, 0);
	assert_int_equal(f->r.nfds, 0);
	assert_counts(f, 0, 0, 0, 0, 0);

	/* An export costs its fds, not daemon-owned bytes. */
	export(f, &f->prod, "e", 0);
	assert_charged(up, 1, 0, 0, 0, 2);
	assert_int_equal(up->pending, 0);
	/* An abort gives back what a pending version cost. */
	assert_int_equal(create(f, &f->prod, "c", &v1), 0);
	assert_int_equal(registry_abort(&f->r, &f->prod, "c", v1->number, 0), 0);
	assert_charged(up, 1, 0, 0, 0, 2);
	assert_int_equal(up->pending, 0);
}

/* Pending versions per owner and per uid, open fds per uid and of the
 * daemon: each a named limit. */
static void test_limit_pending_fds(void **state)
{
	struct fix *f = *state;
	struct uid_usage *up;
	struct version *v;
	char name[16];

	f->r.limits.max_pending = 3;
	f->r.limits.uid_pending = 4;
	up = attach(f, &f->prod);
	attach(f, &f->cons);
	attach(f, &f->other);
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "p%d", i);
		assert_int_equal(create(f, &f->prod, name, &v), 0);
	}
	assert_int_equal(create(f, &f->prod, "p9", &v), -EDQUOT);
	assert_string_equal(f->why.why, "pending versions per connection");
	assert_int_equal(f->why.limit, METRICS_LIMIT_MAX_PENDING);
	assert_int_equal(create(f, &f->cons, "q0", &v), 0);
	assert_int_equal(create(f, &f->cons, "q1", &v), -EDQUOT);
	assert_string_equal(f->why.why, "pending versions per uid");
	assert_int_equal(f->why.limit, METRICS_LIMIT_UID_PENDING);
	/* Another uid is not touched; exports are not pending. */
	assert_int_equal(create(f, &f->other, "o0", &v), 0);
	export(f, &f->prod, "x", 0);
	/* A sealed one makes room. */
	assert_int_equal(registry_seal(&f->r, &f->prod, "p0", 1, 0, NULL, 0), 0);
	assert_int_equal(create(f, &f->cons, "q1", &v), 0);
	assert_int_equal(up->pending, 4);

	/* The uid holds 6 versions of 2 fds: 12. */
	assert_int_equal(up->fds, 12);
	f->r.limits.uid_pending = 100;
	f->r.limits.max_pending = 100;
	f->r.limits.uid_open_fds = 13;
	assert_int_equal(create(f, &f->prod, "p9", &v), -EDQUOT);
	assert_string_equal(f->why.why, "open fds per uid");
	assert_int_equal(f->why.limit, METRICS_LIMIT_UID_OPEN_FDS);
	/* fds queued in replies count too. */
	f->r.limits.uid_open_fds = 14;
	up->fds_queued = 1;
	assert_int_equal(create(f, &f->prod, "p9", &v), -EDQUOT);
	up->fds_queued = 0;
	assert_int_equal(create(f, &f->prod, "p9", &v), 0);
	/* A get charges the reader's uid the version's fds. */
	f->r.limits.uid_open_fds = 3;
	{
		struct lease *l;
		int err;
		struct version *p0 = registry_find(&f->r, &f->other, "p0",
						   REG_LATEST, 0, &err);

		assert_non_null(p0);
		assert_int_equal(registry_lease(&f->r, &f->other, p0, &l,
						&f->why),
				 -EDQUOT);
		assert_string_equal(f->why.why, "open fds per uid");
		assert_int_equal(f->why.limit, METRICS_LIMIT_UID_OPEN_FDS);
	}
	/* The daemon's budget, over every uid. */
	f->r.limits.uid_open_fds = 0;
	f->r.limits.max_open_fds = (uint32_t)f->r.nfds + 1;
	assert_int_equal(create(f, &f->other, "o1", &v), -ENOSPC);
	assert_string_equal(f->why.why, "open fds of the daemon");
	assert_int_equal(f->why.limit, METRICS_LIMIT_MAX_OPEN_FDS);
	f->r.limits.max_open_fds = 0;
}

/* Leased bytes per uid, host and GPU: checked at the uid's first lease on
 * a version. */
static void test_limit_leased_bytes(void **state)
{
	struct fix *f = *state;
	uint8_t uuid[16] = { 1, 2, 3 };
	struct version *v1, *v2, *g;
	struct lease *l;
	struct tspec ts;

	attach(f, &f->prod);
	attach(f, &f->other);
	f->r.limits.uid_leased_bytes = PAGE;
	v1 = publish(f, &f->prod, "a", 0);
	v2 = publish(f, &f->prod, "b", 0);
	assert_int_equal(registry_lease(&f->r, &f->other, v1, &l, NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->other, v1, &l, NULL), 0);
	assert_int_equal(registry_lease(&f->r, &f->other, v2, &l, &f->why),
			 -EDQUOT);
	assert_string_equal(f->why.why, "leased host bytes per uid");
	assert_int_equal(f->why.limit, METRICS_LIMIT_UID_LEASED_BYTES);
	/* The producer's own quota is another one. */
	assert_int_equal(registry_lease(&f->r, &f->prod, v2, &l, NULL), 0);

	/* A daemon-owned cuda-vmm buffer (its fd: any fd will do here). */
	spec(&ts, "g", 0, 1, 1, PAGE);
	ts.dev.type = 2;
	ts.dev.has_uuid = 1;
	ts.dev.uuid.data = uuid;
	ts.dev.uuid.len = sizeof(uuid);
	ts.b[0].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM;
	ts.fds[0] = make_memfd(PAGE, 0);
	g = add_ok(f, &f->prod, &ts.s, 0);
	assert_int_equal(g->owned_gpu, PAGE);
	assert_int_equal(g->nfds, REGISTRY_FDS_VMM);
	assert_int_equal(f->prod.usage->gpu_bytes, PAGE);
	assert_int_equal(registry_seal(&f->r, &f->prod, "g", 1, 0, NULL, 0), 0);
	f->r.limits.uid_leased_gpu_bytes = PAGE - 1;
	assert_int_equal(registry_lease(&f->r, &f->other, g, &l, &f->why),
			 -EDQUOT);
	assert_string_equal(f->why.why, "leased GPU bytes per uid");
	assert_int_equal(f->why.limit, METRICS_LIMIT_UID_LEASED_GPU_BYTES);
	f->r.limits.uid_leased_gpu_bytes = PAGE;
	assert_int_equal(registry_lease(&f->r, &f->other, g, &l, NULL), 0);
	assert_int_equal(f->other.usage->leased_gpu_bytes, PAGE);
}

/* A version being sealed is invisible, not sealable or abortable again,
 * and cannot die: its producer's going or its name's delete orphan it,
 * and it dies when the seal ends. */
static void test_sealing(void **state)
{
	struct fix *f = *state;
	struct uid_usage *up = attach(f, &f->prod);
	struct version *v, *s;
	uint8_t ev[4] = { 9, 8, 7, 6 };
	int fd;

	/* Ends with an error: pending again, and sealable after. */
	assert_int_equal(create(f, &f->prod, "s", &v), 0);
	assert_int_equal(registry_seal_begin(&f->r, &f->prod, "s", 1, 0, &s), 0);
	assert_ptr_equal(s, v);
	assert_int_equal(registry_seal_begin(&f->r, &f->prod, "s", 1, 0, &s),
			 -EINPROGRESS);
	assert_int_equal(registry_seal(&f->r, &f->prod, "s", 1, 0, NULL, 0),
			 -EINPROGRESS);
	assert_int_equal(registry_abort(&f->r, &f->prod, "s", 1, 0),
			 -EINPROGRESS);
	assert_not_found(f, &f->prod, "s", REG_EXACT, 1, -ENOENT);
	assert_int_equal(registry_seal_end(&f->r, v, -EBUSY, NULL, 0), -EBUSY);
	assert_int_equal(v->state, VERSION_PENDING);
	assert_false(v->sealing);
	assert_int_equal(registry_seal_begin(&f->r, &f->prod, "s", 1, 0, &s), 0);
	assert_int_equal(registry_seal_end(&f->r, v, 0, ev, sizeof(ev)), 0);
	assert_int_equal(v->state, VERSION_SEALED);
	assert_int_equal(v->event_len, sizeof(ev));
	assert_int_equal(f->rec.npublished, 1);
	assert_int_equal(up->pending, 0);

	/* Its producer goes meanwhile: it dies at the end. */
	assert_int_equal(create(f, &f->prod, "t", &v), 0);
	fd = v->buffers[0]->fd;
	assert_int_equal(registry_seal_begin(&f->r, &f->prod, "t", 1, 0, &s), 0);
	registry_owner_drop(&f->r, &f->prod);
	assert_true(v->orphaned);
	assert_true(fd_open(fd)); /* the worker may still use it */
	assert_int_equal(f->prod.npending, 0);
	assert_int_equal(registry_seal_end(&f->r, v, 0, NULL, 0), -ENOENT);
	assert_null(registry_entry(&f->r, "t"));
	assert_false(fd_open(fd));
	assert_int_equal(f->rec.npublished, 1);

	/* Its name is deleted meanwhile: the same. */
	registry_owner_init(&f->prod, 1000, 1000, 10);
	up = attach(f, &f->prod);
	assert_int_equal(create(f, &f->prod, "u", &v), 0);
	assert_int_equal(registry_seal_begin(&f->r, &f->prod, "u", 1, 0, &s), 0);
	assert_int_equal(registry_delete(&f->r, &f->prod, "u"), 0);
	assert_null(registry_entry(&f->r, "u"));
	assert_int_equal(f->r.nversions, 2); /* "s" and the dying "u" */
	assert_int_equal(registry_seal_end(&f->r, v, 0, NULL, 0), -ENOENT);
	assert_int_equal(f->r.nversions, 1);
	assert_int_equal(up->pending, 0);
	assert_int_equal(f->prod.npending, 0);
	assert_charged(up, 1, PAGE, 0, 0, REGISTRY_FDS_HOST); /* "s" */
}

/* Numbers of a name nobody deleted never go back: when its entry dies
 * because an exporter left and, later, the last lease went, the next
 * version numbers after the last (a reader waiting for "newer than 3"
 * must see 4, and (name, 2) must not name new data). A Delete still
 * restarts the numbers; past REGISTRY_TOMBS_MAX the oldest name is
 * forgotten. */
static void test_numbers_survive_an_exporter(void **state)
{
	struct fix *f = *state;
	struct registry_owner e;
	struct version *v;
	struct lease *l;
	uint64_t lid;
	char name[32];

	registry_owner_init(&e, 1000, 1000, 11);
	publish(f, &f->prod, "n", 0);
	v = publish(f, &f->prod, "n", 0);
	assert_int_equal(v->number, 2);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l, NULL), 0);
	lid = l->id;
	assert_int_equal(export(f, &e, "n", 0)->number, 3);
	registry_owner_drop(&f->r, &e);
	assert_non_null(registry_entry(&f->r, "n"));
	assert_int_equal(registry_release(&f->r, &f->cons, lid), 0);
	assert_null(registry_entry(&f->r, "n"));
	assert_int_equal(f->r.ntombs, 1);
	assert_int_equal(publish(f, &f->prod, "n", 0)->number, 4);
	assert_int_equal(f->r.ntombs, 0);

	assert_int_equal(registry_delete(&f->r, &f->prod, "n"), 0);
	assert_int_equal(f->r.ntombs, 0);
	assert_int_equal(publish(f, &f->prod, "n", 0)->number, 1);

	for (unsigned i = 0; i <= REGISTRY_TOMBS_MAX; i++) {
		snprintf(name, sizeof(name), "t/%u", i);
		f->rec.npublished = f->rec.nretired = f->rec.nfreed = 0;
		registry_owner_init(&e, 1000, 1000, 11);
		assert_int_equal(export(f, &e, name, 0)->number, 1);
		registry_owner_drop(&f->r, &e);
	}
	assert_int_equal(f->r.ntombs, REGISTRY_TOMBS_MAX);
	registry_owner_init(&e, 1000, 1000, 11);
	assert_int_equal(export(f, &e, "t/0", 0)->number, 1); /* forgotten */
	assert_int_equal(export(f, &e, "t/1", 0)->number, 2);
	registry_owner_drop(&f->r, &e);
}

/* ---- lifetimes (lifetime.c) ------------------------------------------------ */

/* Store mode with a lifetime, sealed. */
static int publish_life(struct fix *f, struct registry_owner *o,
			const char *name, int owned, uint32_t ttl_ms)
{
	struct tspec ts;
	struct registry_spec *s = spec(&ts, name, 0, 1, 1, PAGE);
	struct version *v;
	int err;

	s->owned = owned;
	s->ttl_ms = ttl_ms;
	f->why = (struct refusal){ 0 };
	/* Many names here: what the recorder keeps does not matter. */
	f->rec.npublished = f->rec.nfreed = f->rec.nretired = 0;
	if ((err = registry_add(&f->r, o, s, 0, &v, &f->why)))
		return err;
	return registry_seal(&f->r, o, name, v->number, 0, NULL, 0);
}

/* Names expire in order of their expiry, at most max per call; a seal
 * moves a name's expiry on; a delete takes it out of the heap. */
static void test_ttl_heap(void **state)
{
	struct fix *f = *state;
	unsigned rnd = 7;
	char name[32];
	enum { N = 300 };
	uint64_t due[N];

	fake_now = 1000;
	for (int i = 0; i < N; i++) {
		uint32_t ttl = 1 + rand_r(&rnd) % 5000;

		snprintf(name, sizeof(name), "ttl/%d", i);
		assert_int_equal(publish_life(f, &f->prod, name, 0, ttl), 0);
		due[i] = fake_now + ttl;
	}
	/* Renew one (a new seal), and delete another. */
	fake_now = 1500;
	assert_int_equal(publish_life(f, &f->prod, "ttl/0", 0, 0), 0);
	due[0] = 1500 + registry_entry(&f->r, "ttl/0")->life->ttl_ms;
	assert_int_equal(registry_delete(&f->r, &f->prod, "ttl/1"), 0);
	due[1] = 0;
	assert_int_equal(registry_expire(&f->r, 999, 1000), 0);
	for (uint64_t now = 1000; now <= 7000; now += 250) {
		uint64_t next;

		do
			f->rec.nfreed = 0;
		while (registry_expire(&f->r, now, 7) == 7);
		next = registry_next_expiry(&f->r);
		assert_true(next > now);
		for (int i = 2; i < N; i++) {
			snprintf(name, sizeof(name), "ttl/%d", i);
			assert_int_equal(registry_entry(&f->r, name) != NULL,
					 due[i] > now);
		}
		snprintf(name, sizeof(name), "ttl/0");
		assert_int_equal(registry_entry(&f->r, name) != NULL,
				 due[0] > now);
	}
	assert_int_equal(f->r.nnames, 0);
	assert_int_equal(f->r.ttl_n, 0);
	assert_int_equal(registry_next_expiry(&f->r), UINT64_MAX);
	assert_int_equal(f->r.nexpired, N - 1);
	/* Past max_ttl_ms: refused, naming it. */
	assert_int_equal(publish_life(f, &f->prod, "ttl/long", 0,
				      f->r.limits.max_ttl_ms + 1), -ERANGE);
	assert_non_null(strstr(f->why.why, "max-ttl"));
	assert_int_equal(f->why.limit, METRICS_LIMIT_MAX_TTL);
	fake_now = 0;
}

/* An owned name goes with its owner, unless taken over; a stranger is
 * refused; a lease keeps the version of a name that went. */
static void test_owned(void **state)
{
	struct fix *f = *state;
	struct registry_owner p2;
	struct lease *l;
	struct version *v;
	int err;

	registry_owner_init(&p2, 1000, 1000, 20);
	assert_int_equal(publish_life(f, &f->prod, "o/a", 1, 0), 0);
	assert_int_equal(publish_life(f, &f->prod, "o/b", 1, 0), 0);
	assert_int_equal(publish_life(f, &f->prod, "o/c", 0, 0), 0);
	assert_int_equal(f->prod.nowned, 2);
	/* Another connection of the same uid: only by taking it over. */
	assert_int_equal(publish_life(f, &p2, "o/a", 0, 0), -EPERM);
	assert_non_null(f->why.why);
	assert_int_equal(publish_life(f, &p2, "o/a", 1, 0), 0);
	assert_int_equal(f->prod.nowned, 1);
	/* Another uid may not take it over. */
	assert_int_equal(publish_life(f, &f->other, "o/b", 1, 0), -EPERM);
	assert_int_equal(publish_life(f, &f->other, "o/c", 1, 0), -EPERM);
	v = registry_find(&f->r, &f->cons, "o/b", REG_LATEST, 0, &err);
	assert_non_null(v);
	assert_int_equal(registry_lease(&f->r, &f->cons, v, &l, NULL), 0);
	registry_owner_drop(&f->r, &f->prod);
	/* Doomed: due at once, deleted by the next expiry batch. */
	assert_non_null(registry_entry(&f->r, "o/b"));
	assert_int_equal(registry_next_expiry(&f->r), 0);
	assert_int_equal(registry_expire(&f->r, 0, 100), 1);
	assert_null(registry_entry(&f->r, "o/b"));
	assert_non_null(registry_entry(&f->r, "o/a"));
	assert_non_null(registry_entry(&f->r, "o/c"));
	assert_int_equal(f->r.nversions, 3); /* o/a, o/c and the leased o/b */
	assert_int_equal(registry_release(&f->r, &f->cons, l->id), 0);
	assert_int_equal(f->r.nversions, 2);
	registry_owner_drop(&f->r, &p2);
	/* A new version of a doomed name makes a new name in its place. */
	assert_int_equal(publish_life(f, &f->cons, "o/a", 0, 0), 0);
	assert_false(entry_doomed(registry_entry(&f->r, "o/a")));
	assert_int_equal(registry_expire(&f->r, 0, 100), 0);
	assert_non_null(registry_entry(&f->r, "o/a"));
	assert_int_equal(registry_delete(&f->r, &f->cons, "o/a"), 0);
	assert_int_equal(f->r.norphaned, 2);
	registry_owner_init(&f->prod, 1000, 1000, 10);
}

/* Delete by prefix: a batch at a time, the caller's writable names only. */
static void test_delete_prefix(void **state)
{
	struct fix *f = *state;
	uint64_t deleted, skipped, total = 0;
	char name[32];
	int more;

	for (int i = 0; i < 250; i++) {
		snprintf(name, sizeof(name), "fg/%d", i);
		assert_int_equal(publish_life(f, &f->prod, name, 0, 0), 0);
	}
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "fg/o%d", i);
		assert_int_equal(publish_life(f, &f->other, name, 0, 0), 0);
	}
	assert_int_equal(publish_life(f, &f->prod, "fgx", 0, 0), 0);
	do {
		f->rec.nfreed = 0;
		more = registry_delete_prefix(&f->r, &f->prod, "fg/", 100,
					      &deleted, &skipped);
		assert_true(deleted <= 100);
		total += deleted;
	} while (more);
	assert_int_equal(total, 250);
	assert_int_equal(skipped, 5);
	assert_int_equal(f->r.nnames, 6);
	assert_non_null(registry_entry(&f->r, "fgx"));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, fix_setup, fix_teardown)
	const struct CMUnitTest tests[] = {
		T(test_store_pending_then_seal),
		T(test_numbers_survive_an_exporter),
		T(test_store_event_retired),
		T(test_forget_events_drops_kept_reply),
		T(test_seal_errors),
		T(test_seal_busy_while_mapped),
		T(test_versions_supersede),
		T(test_lease_records_reused),
		T(test_find_select),
		T(test_born_superseded),
		T(test_abort),
		T(test_writer_ids),
		T(test_delete_pending_leased),
		T(test_delete),
		T(test_owner_drop),
		T(test_export_retired),
		T(test_export_fd_refused),
		T(test_queue_first_add_failed_leaves_nothing),
		T(test_add_invalid),
		T(test_limit_tensors_buffers),
		T(test_limit_buffer_bytes),
		T(test_limit_bytes),
		T(test_limit_bytes_overflow),
		T(test_limit_leases),
		T(test_acl),
		T(test_version_contents),
		T(test_device_rows),
		T(test_deinit_frees_everything),
		T(test_deinit_with_leases),
		T(test_numbers_after_delete),
		T(test_charges),
		T(test_limit_pending_fds),
		T(test_limit_leased_bytes),
		T(test_sealing),
		T(test_ttl_heap),
		T(test_owned),
		T(test_delete_prefix),
	};
#undef T

	return cmocka_run_group_tests(tests, NULL, NULL);
}
