/* test_model — a model-based concurrent test: several forked worker
 * processes, each with several threads sharing one client, do random
 * operations on a few shared names against the real daemon, while the test
 * process SIGKILLs workers mid-operation and starts new ones. Every answer
 * is checked against what the contracts (docs in /work/shared/DESIGN.md,
 * include/dlshare/dlshare.h) allow, with no lock between the actors: what
 * they share is a MAP_SHARED page of counters and records, written only
 * after the daemon answered, so every check is one-sided and sound.
 *
 * Operations (DLSHARE_MODEL_OPS names): store (create, write, seal), open
 * (create and write half, keep pending) and seal (write the rest, seal),
 * abort (a kept writer, or create + part + abort), export (dlshare_host_alloc
 * + publish NO_COPY; the tensor's deleter scribbles over the memory before
 * freeing it, so a deleter that runs while a reader still leases the version
 * shows as changed data), copy (publish of malloc memory: copied), latest,
 * exact, newer (gets, timeouts 0..20 ms; some results are held, as a bundle
 * or as exported DLManagedTensors), release (re-verify a held version, then
 * free it), delete, stat, list, fork (a child that makes its own client,
 * publishes and reads), forkexit (a child that exit()s holding the inherited
 * client), forkcall (a child that calls on the inherited client), forkdisc
 * (a child that dlshare_disconnect()s the inherited client), forkfds (a
 * child with its own client that gets a name at its fd limit: success or
 * DLSHARE_EMFILE only, and the same get once fds are free succeeds with
 * the version's content), qput and qtake
 * (a write into, and a take from, one queue name of depth QDEPTH, waiting
 * 0..20 ms; what is taken is checked bit for bit, and its version is the
 * one its writer was told; at the end the queue is drained and checked),
 * kill (the test process SIGKILLs a worker and starts another).
 *
 * The checks, and what each relies on:
 * - Content. Each version's tensors carry a header (writer slot, write
 *   number, name, tensor index and count, size, and for store versions the
 *   number dlshare_writer_version gave) and a stream derived from a token
 *   that is a function of (seed, writer, write number) (content.h). Every
 *   tensor read is checked bit for bit: a version is published whole
 *   (dlshare_seal / dlshare_publish), under the name it was written for,
 *   with keys k0..kn-1, compact CPU tensors.
 * - Identity. A store version's header number equals the version got
 *   (dlshare_writer_version: "the version number the writer will
 *   publish"). Each writer records (token, version, status) after the
 *   daemon answered; a version got must match a recorded publish number,
 *   and a write that was aborted, or whose seal failed, is never seen (a
 *   Seal or Abort never lands on another writer's version, DESIGN.md
 *   "version"; a failed seal publishes nothing).
 * - Deletes and leaves. Per name, every actor counts the deletes it began
 *   and ended. An exporter leaving withdraws its exports, so the newest
 *   version can vanish and, once no version of the name is left (perhaps
 *   only when a reader lets go of an older one, much later), numbers
 *   restart (docs/architecture.md, "Known gaps"): a leave is begun before
 *   the exporter's connection can close (a worker around its disconnect;
 *   the test process for a worker it kills, stopped first with SIGSTOP to
 *   read which names it exported to; a fork child from its first export
 *   on), is done once the daemon saw the close (a settle time, scaled
 *   500 ms, after a kill), and ends only when a version of the name
 *   created after it was done is sealed (from then on the name has a
 *   newest version again). A window of time is quiet for a name when the
 *   begun count at its end equals the ended count at its start.
 * - Order. A thread's successive reads of a name, in a quiet window, never
 *   go back (LATEST returns the newest sealed version, and a sealed newer
 *   one stays while the name is not deleted and its exporter did not
 *   leave); the same number read twice in a quiet window is the same
 *   content. NEWER_THAN N returns a
 *   version > N; EXACT N returns N, or ENOENT / ETIMEDOUT.
 * - Nothing lost. A seal or publish that returned, in a quiet window, is
 *   recorded per name with the window's epoch; a LATEST get, stat or
 *   NEWER_THAN get in a quiet window of the same epoch must find that
 *   version or a newer one (the daemon answered the seal, so it is sealed),
 *   and such a get that waits must not time out when the version was
 *   sealed before its timeout (parked gets are answered at the seal).
 * - Leases. A version held (bundle or exported tensor) keeps its content
 *   until released (re-verified before release; an export's producer never
 *   gets its memory back while leased), and EXACT of it succeeds with the
 *   same content while the window since it was got is quiet ("older
 *   versions stay alive while leases hold them").
 * - Seals. In a quiet window a seal succeeds; outside one it may fail with
 *   ENOENT or ESTATE only (a delete destroys pending versions). EBUSY is
 *   never right (known defect iii: a fork while a writer's buffer is
 *   mapped makes the parent's seal fail with EBUSY).
 * - Fork. A child never harms its parent's connection (the parent's next
 *   call works), a child's call on an inherited client returns an error
 *   promptly, and a child can make its own client and store, export and
 *   read with it (DESIGN.md "Client library"); a child that hangs prints
 *   where.
 * - Errors. Each call returns one of the codes the header allows for it
 *   here, within its timeout plus a scaled 5 s; nothing hangs (a watchdog
 *   fails an operation running for a scaled 15 s).
 * - The end. After all workers left: no lease, no parked get, one
 *   connection, every name has at most its newest version (no pending
 *   version is left), the newest versions read back intact, and after
 *   deleting every name the daemon holds no version, buffer or byte and as
 *   many fds as before the run. Each graceful worker checks that its export
 *   deleters ran exactly once and that its fd count is back to where it was.
 *
 * Environment: DLSHARE_MODEL_SEED (a number, or "random"; printed always),
 * DLSHARE_MODEL_SECONDS (default 3, or 2 with the daemon under a wrapper
 * such as valgrind), DLSHARE_MODEL_OPS ("all", "-fork,-kill" to disable
 * kinds, or "store,latest" to enable only those), DLSHARE_MODEL_WORKERS,
 * DLSHARE_MODEL_THREADS, DLSHARE_MODEL_KILL_MS (mean ms between kills).
 * A long run:
 *   DLSHARE_MODEL_SEED=random DLSHARE_MODEL_SECONDS=600 \
 *     ctest --test-dir build -R test_model --output-on-failure
 * A failure prints the seed, the failed check, and each actor's last
 * operations; the run is concurrent, so a seed replays the choices of each
 * actor, not the interleaving.
 */
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include <cmocka.h>

#include "content.h"
#include "util.h"

#define NAMES 6
#define MAX_SLOTS 2048
#define RING 64
#define LOG_LINES 40
#define LOG_LEN 128
#define MAX_WORKERS 8
#define MAX_THREADS 6
#define MAX_HELD 6
#define MAX_OPEN 2
#define MAX_TENSORS 3

enum op {
	OP_STORE, OP_OPEN, OP_SEAL, OP_ABORT, OP_EXPORT, OP_COPY, OP_LATEST,
	OP_EXACT, OP_NEWER, OP_RELEASE, OP_DELETE, OP_STAT, OP_LIST, OP_FORK,
	OP_FORKEXIT, OP_FORKCALL, OP_FORKDISC, OP_FORKFDS, OP_QPUT, OP_QTAKE,
	OP_KILL, OP_N
};

static const char *const op_names[OP_N] = {
	"store", "open", "seal", "abort", "export", "copy", "latest", "exact",
	"newer", "release", "delete", "stat", "list", "fork", "forkexit",
	"forkcall", "forkdisc", "forkfds", "qput", "qtake", "kill",
};

static const int op_weight[OP_N] = {
	10, 5, 6, 3, 8, 3, 14, 8, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 0,
};

/* What a writer records about one of its writes. */
enum { ST_NONE, ST_PENDING, ST_SEALED, ST_ABORTED, ST_FAILED };

struct ring_ent {
	_Atomic uint64_t token;
	_Atomic uint64_t version;
	_Atomic uint32_t status;
};

struct slot {
	_Atomic int pid;
	_Atomic int64_t op_start; /* run ms + 1 while an operation runs */
	_Atomic uint32_t exported; /* names exported to (a worker's slot) */
	_Atomic uint32_t child_leaves; /* a fork child's open leaves */
	_Atomic uint32_t log_head;
	char log[LOG_LINES][LOG_LEN];
	struct ring_ent ring[RING];
};

struct shm {
	uint64_t seed;
	int64_t t0;
	_Atomic int stop;
	_Atomic int failed;
	_Atomic int fail_slot;
	char fail[2048];
	_Atomic uint32_t nslots;
	_Atomic int64_t inherited_fork; /* run ms of the last child that
					 * touched an inherited client */
	_Atomic uint64_t sealed_max[NAMES]; /* epoch << 32 | version */
	_Atomic uint64_t count[OP_N];
	_Atomic uint64_t reads, bytes_checked, refused;
	_Atomic uint64_t fds_refused; /* forkfds gets refused with EMFILE */
	_Atomic uint64_t del_begin[NAMES][MAX_SLOTS];
	_Atomic uint64_t del_end[NAMES][MAX_SLOTS];
	/* Exporters leaving: begun, done, and closed by a later seal. */
	_Atomic uint64_t leave_begin[NAMES], leave_done[NAMES];
	_Atomic uint64_t leave_end[NAMES];
	/* Each actor's last seal in a quiet window, per name: epoch << 32 |
	 * version, and when it returned (run ms; written first). */
	_Atomic uint64_t last_seal[NAMES][MAX_SLOTS];
	_Atomic int64_t last_seal_ms[NAMES][MAX_SLOTS];
	struct slot slot[MAX_SLOTS];
};

static struct {
	uint64_t seed;
	int seconds, workers, threads, kill_ms, light;
	size_t max_bytes;
	uint32_t ops; /* enabled kinds */
} cfg;

static struct shm *S;
static const struct daemon_proc *D;
/* This process forked a child that touched its inherited client. */
static atomic_int touched_inherited;
/* Fork children of this process alive now. */
static atomic_int forks_here;

static int64_t run_ms(void)
{
	return util_now_ms() - S->t0;
}

static void slog(int slot, const char *fmt, ...)
{
	struct slot *s = &S->slot[slot];
	uint32_t i = atomic_fetch_add(&s->log_head, 1) % LOG_LINES;
	int n = snprintf(s->log[i], LOG_LEN, "%7lld ms ", (long long)run_ms());
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->log[i] + n, LOG_LEN - (size_t)n, fmt, ap);
	va_end(ap);
}

static uint64_t sum_begin(int n)
{
	uint32_t k = atomic_load(&S->nslots);
	uint64_t s = 0;

	for (uint32_t i = 0; i < k; i++)
		s += atomic_load(&S->del_begin[n][i]);
	return s + atomic_load(&S->leave_begin[n]);
}

static uint64_t sum_end(int n)
{
	uint32_t k = atomic_load(&S->nslots);
	uint64_t s = 0;

	for (uint32_t i = 0; i < k; i++)
		s += atomic_load(&S->del_end[n][i]);
	return s + atomic_load(&S->leave_end[n]);
}

static void name_of(int n, char *buf, size_t len)
{
	snprintf(buf, len, "model/n%d", n);
}

static int name_index(const char *name)
{
	if (strncmp(name, "model/n", 7) || !name[7] || name[8])
		return -1;
	return name[7] >= '0' && name[7] < '0' + NAMES ? name[7] - '0' : -1;
}

/* Notes that version v of name n was sealed in a window quiet at epoch e. */
static void sealed_note(int n, uint64_t e, uint64_t v)
{
	uint64_t cur = atomic_load(&S->sealed_max[n]), want = e << 32 | v;

	while ((cur >> 32) < e || ((cur >> 32) == e && (cur & 0xffffffffu) < v))
		if (atomic_compare_exchange_weak(&S->sealed_max[n], &cur, want))
			break;
}

/* A version of name n was sealed, created after ld exporters' leaves were
 * done: those leaves can no longer restart its numbers. */
static void leaves_close(int n, uint64_t ld)
{
	uint64_t cur = atomic_load(&S->leave_end[n]);

	while (cur < ld)
		if (atomic_compare_exchange_weak(&S->leave_end[n], &cur, ld))
			break;
}

/* An exporter's leave begins (before its connection can close) and is
 * done (once the daemon saw it close). */
static void leave_begin(uint32_t mask)
{
	for (int n = 0; n < NAMES; n++)
		if (mask & (1u << n))
			atomic_fetch_add(&S->leave_begin[n], 1);
}

static void leave_done(uint32_t mask)
{
	for (int n = 0; n < NAMES; n++)
		if (mask & (1u << n))
			atomic_fetch_add(&S->leave_done[n], 1);
}

/* ---- actors ---------------------------------------------------------------- */

struct seen {
	int valid;
	uint64_t v, token, e0;
};

struct held {
	int used, name, n;
	uint64_t v, token, e0;
	dlshare_bundle *b;
	DLManagedTensor *m[MAX_TENSORS];
	DLManagedTensorVersioned *mv[MAX_TENSORS];
};

struct version_spec {
	int n;
	DLDataType dt[MAX_TENSORS];
	int ndim[MAX_TENSORS];
	int64_t shape[MAX_TENSORS][2];
	struct content_hdr h[MAX_TENSORS];
	const char *keys[MAX_TENSORS];
};

struct openw {
	int used, name;
	dlshare_writer *w;
	struct version_spec vs;
	uint64_t e0, ld, v;
	uint32_t seq;
};

struct worker;

struct actor {
	struct worker *wk;
	dlshare_client *c;
	int slot, thread, in_child;
	uint32_t child_exported; /* a fork child's exports, by name */
	uint64_t rng;
	uint32_t seq;
	uint32_t qseq;           /* its writes into the queue name */
	enum op op;
	struct seen seen[NAMES];
	struct held held[MAX_HELD];
	struct openw open[MAX_OPEN];
};

struct worker {
	dlshare_client *c;
	int index, proc_slot, nthreads;
	struct actor a[MAX_THREADS];
};

static const char *const keys[MAX_TENSORS] = { "k0", "k1", "k2" };

static uint32_t rnd(struct actor *a)
{
	a->rng = content_mix(a->rng);
	return (uint32_t)(a->rng >> 16);
}

/* Records a failed check, the first one only, and stops the run. Returns
 * -1 for the caller to return. */
static int model_fail(struct actor *a, const char *fmt, ...)
{
	int zero = 0;
	va_list ap;
	char msg[1600];

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (atomic_load(&touched_inherited) && !a->in_child &&
	    (strstr(msg, "connection was lost") ||
	     strstr(msg, "the client was disconnected")))
		snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
			 " (this worker forked a child that touched its "
			 "inherited client: known defect ii?)");
	slog(a->slot, "FAIL %s", msg);
	if (atomic_compare_exchange_strong(&S->failed, &zero, 1)) {
		snprintf(S->fail, sizeof(S->fail), "slot %d (pid %d%s, op %s): %s",
			 a->slot, (int)getpid(),
			 a->in_child ? ", a fork child" : "", op_names[a->op],
			 msg);
		atomic_store(&S->fail_slot, a->slot);
	}
	atomic_store(&S->stop, 1);
	return -1;
}

static const char *code(int err)
{
	static __thread char buf[96];

	snprintf(buf, sizeof(buf), "%d %s [%s]", err, dlshare_strerror(err),
		 dlshare_last_error());
	return buf;
}

static void ring_set(struct actor *a, uint32_t seq, uint64_t token,
		     uint64_t v, uint32_t status)
{
	struct ring_ent *e = &S->slot[a->slot].ring[seq % RING];

	atomic_store(&e->status, ST_NONE);
	atomic_store(&e->token, token);
	atomic_store(&e->version, v);
	atomic_store(&e->status, status);
}

/* A new version's tensors: 1..3, bytes or int32 rows, sizes up to
 * cfg.max_bytes and now and then up to 1 MiB. */
static void spec_make(struct actor *a, int name, uint32_t seq,
		      struct version_spec *vs)
{
	uint64_t token = content_token(cfg.seed, (uint32_t)a->slot, seq);

	memset(vs, 0, sizeof(*vs));
	vs->n = 1 + (int)(rnd(a) % MAX_TENSORS);
	for (int i = 0; i < vs->n; i++) {
		size_t bytes = CONTENT_HDR + rnd(a) % cfg.max_bytes;

		if (!cfg.light && rnd(a) % 64 == 0)
			bytes = (256u << 10) + rnd(a) % (768u << 10);
		if (rnd(a) % 2) {
			vs->dt[i] = DT_U8;
			vs->ndim[i] = 1;
			vs->shape[i][0] = (int64_t)bytes;
		} else {
			vs->dt[i] = DT_I32;
			vs->ndim[i] = 2;
			vs->shape[i][0] = (int64_t)((bytes + 63) / 64);
			vs->shape[i][1] = 16;
		}
		vs->h[i] = (struct content_hdr){
			.name = (uint32_t)name, .who = (uint32_t)a->slot,
			.seq = seq, .token = token, .ntensors = (uint32_t)vs->n,
			.index = (uint32_t)i,
			.nbytes = util_nbytes(vs->dt[i], vs->ndim[i], vs->shape[i]),
		};
		vs->keys[i] = keys[i];
	}
}

/* Checks a version's tensors. keys may be NULL (exported tensors have
 * none). Returns 0 with the version's token in *token, or -1. */
static int verify(struct actor *a, int name, const DLTensor *const *t,
		  const char *const *k, int n, uint64_t version,
		  uint64_t *token, const char *what)
{
	struct content_hdr h0 = { 0 }, h;
	char why[300];

	if (n < 1 || n > MAX_TENSORS)
		return model_fail(a, "%s: model/n%d v%llu has %d tensors", what,
				  name, (unsigned long long)version, n);
	for (int i = 0; i < n; i++) {
		size_t nb;

		if (!t[i])
			return model_fail(a, "%s: tensor %d is NULL", what, i);
		if (t[i]->device.device_type != kDLCPU || t[i]->strides ||
		    !t[i]->data || t[i]->ndim < 1 || t[i]->ndim > 2)
			return model_fail(a, "%s: model/n%d v%llu tensor %d: "
					  "device %d strides %p data %p ndim %d",
					  what, name,
					  (unsigned long long)version, i,
					  (int)t[i]->device.device_type,
					  (void *)t[i]->strides, t[i]->data,
					  (int)t[i]->ndim);
		nb = util_nbytes(t[i]->dtype, t[i]->ndim, t[i]->shape);
		if (content_check((const char *)t[i]->data + t[i]->byte_offset,
				  nb, cfg.seed, &h, why, sizeof(why)))
			return model_fail(a, "%s: model/n%d v%llu tensor %d: %s",
					  what, name,
					  (unsigned long long)version, i, why);
		atomic_fetch_add(&S->bytes_checked, nb);
		if (i == 0)
			h0 = h;
		if (h.who != h0.who || h.seq != h0.seq || h.name != h0.name ||
		    h.version != h0.version || h.ntensors != h0.ntensors ||
		    h.index != (uint32_t)i)
			return model_fail(a, "%s: model/n%d v%llu: tensor %d is "
					  "writer %u write %u tensor %u, tensor 0 "
					  "writer %u write %u (a torn version)",
					  what, name,
					  (unsigned long long)version, i, h.who,
					  h.seq, h.index, h0.who, h0.seq);
		if (k && (!k[i] || strcmp(k[i], keys[i])))
			return model_fail(a, "%s: model/n%d v%llu tensor %d has "
					  "key '%s'", what, name,
					  (unsigned long long)version, i,
					  k[i] ? k[i] : "(null)");
	}
	if (h0.ntensors != (uint32_t)n)
		return model_fail(a, "%s: model/n%d v%llu: %d tensors, written "
				  "with %u (writer %u write %u)", what, name,
				  (unsigned long long)version, n, h0.ntensors,
				  h0.who, h0.seq);
	if (h0.name != (uint32_t)name)
		return model_fail(a, "%s: model/n%d v%llu holds what writer %u "
				  "wrote for model/n%u (write %u)", what, name,
				  (unsigned long long)version, h0.who, h0.name,
				  h0.seq);
	if (h0.version && h0.version != version)
		return model_fail(a, "%s: model/n%d v%llu holds writer %u write "
				  "%u, created as version %llu", what, name,
				  (unsigned long long)version, h0.who, h0.seq,
				  (unsigned long long)h0.version);
	if (h0.who < atomic_load(&S->nslots)) {
		struct ring_ent *e = &S->slot[h0.who].ring[h0.seq % RING];
		uint32_t st = atomic_load(&e->status);
		uint64_t tok = atomic_load(&e->token);
		uint64_t ev = atomic_load(&e->version);

		if (tok == h0.token && atomic_load(&e->status) == st) {
			if (st == ST_ABORTED || st == ST_FAILED)
				return model_fail(a, "%s: model/n%d v%llu is writer "
						  "%u write %u, which was %s",
						  what, name,
						  (unsigned long long)version,
						  h0.who, h0.seq,
						  st == ST_ABORTED ? "aborted" :
						  "refused at seal");
			if (st == ST_SEALED && ev && ev != version)
				return model_fail(a, "%s: model/n%d v%llu is writer "
						  "%u write %u, published as "
						  "version %llu", what, name,
						  (unsigned long long)version,
						  h0.who, h0.seq,
						  (unsigned long long)ev);
		}
	}
	atomic_fetch_add(&S->reads, 1);
	*token = h0.token;
	return 0;
}

static int verify_bundle(struct actor *a, int name, const dlshare_bundle *b,
			 uint64_t *token, const char *what)
{
	const DLTensor *t[MAX_TENSORS] = { 0 };
	const char *k[MAX_TENSORS] = { 0 };
	size_t n = dlshare_bundle_count(b);

	for (size_t i = 0; i < n && i < MAX_TENSORS; i++) {
		t[i] = dlshare_bundle_tensor(b, i);
		k[i] = dlshare_bundle_key(b, i);
		if (dlshare_bundle_find(b, keys[i]) != (int)i)
			return model_fail(a, "%s: model/n%d v%llu: find(%s) = %d",
					  what, name,
					  (unsigned long long)
					  dlshare_bundle_version(b), keys[i],
					  dlshare_bundle_find(b, keys[i]));
	}
	return verify(a, name, t, k, (int)n, dlshare_bundle_version(b), token,
		      what);
}

static int verify_held(struct actor *a, struct held *h, const char *what)
{
	uint64_t token;

	if (h->b) {
		if (dlshare_bundle_version(h->b) != h->v)
			return model_fail(a, "%s: held bundle of model/n%d v%llu "
					  "now says version %llu", what, h->name,
					  (unsigned long long)h->v,
					  (unsigned long long)
					  dlshare_bundle_version(h->b));
		if (verify_bundle(a, h->name, h->b, &token, what))
			return -1;
	} else {
		const DLTensor *t[MAX_TENSORS];

		for (int i = 0; i < h->n; i++)
			t[i] = h->m[i] ? &h->m[i]->dl_tensor :
			       &h->mv[i]->dl_tensor;
		if (verify(a, h->name, t, NULL, h->n, h->v, &token, what))
			return -1;
	}
	if (token != h->token)
		return model_fail(a, "%s: held model/n%d v%llu changed from write "
				  "%016llx to %016llx while leased", what,
				  h->name, (unsigned long long)h->v,
				  (unsigned long long)h->token,
				  (unsigned long long)token);
	return 0;
}

static void held_free(struct held *h)
{
	if (h->b)
		dlshare_bundle_free(h->b);
	for (int i = 0; i < h->n && !h->b; i++) {
		if (h->m[i])
			h->m[i]->deleter(h->m[i]);
		if (h->mv[i])
			h->mv[i]->deleter(h->mv[i]);
	}
	memset(h, 0, sizeof(*h));
}

/* ---- exports: a deleter that scribbles ------------------------------------- */

/* Per process. The producer may reuse exported memory once the daemon
 * retired the version (dlshare.h, dlshare_publish): the deleter writes over
 * it before freeing it, so a retirement while a reader still leases the
 * version shows as changed data. Not at disconnect, which hands exports
 * back while readers may still hold them. */
#define XMAX 1024

static struct {
	DLManagedTensor *t;
	void (*orig)(DLManagedTensor *);
} xw[XMAX];
static int nxw;
static pthread_mutex_t xw_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int x_wrapped, x_ran, x_unknown, leaving;

static void scribble_deleter(DLManagedTensor *t)
{
	void (*orig)(DLManagedTensor *) = NULL;

	pthread_mutex_lock(&xw_lock);
	for (int i = 0; i < nxw; i++)
		if (xw[i].t == t) {
			orig = xw[i].orig;
			xw[i] = xw[--nxw];
			break;
		}
	pthread_mutex_unlock(&xw_lock);
	if (!orig) {
		atomic_fetch_add(&x_unknown, 1);
		return;
	}
	if (!atomic_load(&leaving))
		memset((char *)t->dl_tensor.data + t->dl_tensor.byte_offset,
		       0xEE, util_nbytes(t->dl_tensor.dtype, t->dl_tensor.ndim,
					 t->dl_tensor.shape));
	atomic_fetch_add(&x_ran, 1);
	orig(t);
}

static void scribble_wrap(DLManagedTensor *t)
{
	pthread_mutex_lock(&xw_lock);
	if (nxw < XMAX) {
		xw[nxw].t = t;
		xw[nxw].orig = t->deleter;
		nxw++;
		t->deleter = scribble_deleter;
		atomic_fetch_add(&x_wrapped, 1);
	}
	pthread_mutex_unlock(&xw_lock);
}

/* Several tensors in one dlshare_host_alloc allocation, at byte offsets
 * (they share one buffer: dlshare.h, dlshare_publish); the last view's
 * deleter frees the allocation. */
struct xview {
	DLManagedTensor m;
	int64_t shape[2];
	DLManagedTensor *base;
	atomic_int *refs;
};

static void view_deleter(DLManagedTensor *m)
{
	struct xview *v = (struct xview *)m;

	if (atomic_fetch_sub(v->refs, 1) == 1) {
		v->base->deleter(v->base);
		free(v->refs);
	}
	free(v);
}

/* Plain malloc tensors for the copy path, compact or column-major. */
struct heap_tensor {
	DLManagedTensor m;
	int64_t shape[2];
	int64_t strides[2];
	atomic_int *runs;
};

static void heap_deleter(DLManagedTensor *m)
{
	struct heap_tensor *h = (struct heap_tensor *)m;

	atomic_fetch_add(h->runs, 1);
	free(m->dl_tensor.data);
	free(h);
}

/* ---- operations -------------------------------------------------------------- */

/* After a seal or publish answered: record it, and judge an error. */
static int after_seal(struct actor *a, int name, uint32_t seq, uint64_t token,
		      uint64_t v, uint64_t e0, uint64_t ld, int err,
		      const char *what)
{
	int quiet = sum_begin(name) == e0;
	const char *hint = "";

	if (!err) {
		ring_set(a, seq, token, v, ST_SEALED);
		leaves_close(name, ld);
		if (quiet) {
			sealed_note(name, e0, v);
			atomic_store(&S->last_seal_ms[name][a->slot], run_ms());
			atomic_store(&S->last_seal[name][a->slot], e0 << 32 | v);
		}
		slog(a->slot, "%s model/n%d write %u -> v%llu%s", what, name,
		     seq, (unsigned long long)v, quiet ? "" : " (delete raced)");
		return 0;
	}
	ring_set(a, seq, token, v, ST_FAILED);
	slog(a->slot, "%s model/n%d write %u v%llu -> %s%s", what, name, seq,
	     (unsigned long long)v, code(err), quiet ? "" : " (delete raced)");
	if (!quiet && (err == DLSHARE_ENOENT || err == DLSHARE_ESTATE)) {
		atomic_fetch_add(&S->refused, 1);
		return 0;
	}
	/* Hints for the known defects; the check is the same. */
	if (err == DLSHARE_EBUSY && atomic_load(&forks_here))
		hint = " (known defect iii: a fork while a writer's buffer is "
		       "mapped makes the seal fail with EBUSY)";
	else if (err == DLSHARE_EBUSY || err == DLSHARE_ENOENT ||
		 err == DLSHARE_ESTATE)
		hint = " (known defect i? a pending version is addressed by "
		       "(name, number): after a delete and re-create, a stale "
		       "Seal or Abort of another writer on this connection "
		       "lands on this one, or this one on a version still "
		       "mapped writable)";
	return model_fail(a, "%s of model/n%d v%llu: %s, %s%s", what, name,
			  (unsigned long long)v, code(err),
			  quiet ? "no delete of the name begun since the create" :
			  "a delete of the name raced", hint);
}

static int create_version(struct actor *a, int name, struct openw *o,
			  int half)
{
	char nm[64];
	dlshare_tensor_spec spec[MAX_TENSORS];
	int err;

	name_of(name, nm, sizeof(nm));
	memset(o, 0, sizeof(*o));
	o->name = name;
	o->seq = a->seq++;
	spec_make(a, name, o->seq, &o->vs);
	for (int i = 0; i < o->vs.n; i++)
		spec[i] = (dlshare_tensor_spec){
			.key = keys[i], .dtype = o->vs.dt[i],
			.ndim = o->vs.ndim[i], .shape = o->vs.shape[i],
		};
	ring_set(a, o->seq, o->vs.h[0].token, 0, ST_PENDING);
	o->ld = atomic_load(&S->leave_done[name]);
	o->e0 = sum_end(name);
	err = dlshare_create(a->c, nm, spec, (size_t)o->vs.n, NULL, &o->w);
	if (err)
		return model_fail(a, "create %s (%d tensors): %s", nm, o->vs.n,
				  code(err));
	o->v = dlshare_writer_version(o->w);
	if (dlshare_writer_count(o->w) != (size_t)o->vs.n)
		return model_fail(a, "create %s: writer has %zu tensors, want %d",
				  nm, dlshare_writer_count(o->w), o->vs.n);
	for (int i = 0; i < o->vs.n; i++) {
		DLTensor *t = dlshare_writer_tensor(o->w, (size_t)i);
		size_t nb = (size_t)o->vs.h[i].nbytes;

		o->vs.h[i].version = o->v;
		content_fill((char *)t->data + t->byte_offset, &o->vs.h[i], 0,
			     half ? nb / 2 : nb);
	}
	o->used = 1;
	return 0;
}

static int seal_version(struct actor *a, struct openw *o, const char *what)
{
	uint64_t v = 0;
	int err;

	for (int i = 0; i < o->vs.n; i++) {
		DLTensor *t = dlshare_writer_tensor(o->w, (size_t)i);
		size_t nb = (size_t)o->vs.h[i].nbytes;

		content_fill((char *)t->data + t->byte_offset, &o->vs.h[i],
			     nb / 2, nb);
	}
	err = dlshare_seal(o->w, NULL, &v);
	o->used = 0;
	if (!err && v != o->v)
		return model_fail(a, "seal of model/n%d: version %llu, the writer "
				  "said %llu", o->name, (unsigned long long)v,
				  (unsigned long long)o->v);
	return after_seal(a, o->name, o->seq, o->vs.h[0].token, o->v, o->e0,
			  o->ld, err, what);
}

static int op_store(struct actor *a)
{
	struct openw o;

	if (create_version(a, (int)(rnd(a) % NAMES), &o, 0))
		return -1;
	return seal_version(a, &o, "store");
}

static struct openw *free_open(struct actor *a)
{
	for (int i = 0; i < MAX_OPEN; i++)
		if (!a->open[i].used)
			return &a->open[i];
	return NULL;
}

static struct openw *some_open(struct actor *a)
{
	int k = (int)(rnd(a) % MAX_OPEN);

	for (int i = 0; i < MAX_OPEN; i++)
		if (a->open[(k + i) % MAX_OPEN].used)
			return &a->open[(k + i) % MAX_OPEN];
	return NULL;
}

static int op_open(struct actor *a)
{
	struct openw *o = free_open(a);

	if (!o)
		return 0;
	if (create_version(a, (int)(rnd(a) % NAMES), o, 1))
		return -1;
	slog(a->slot, "open model/n%d write %u v%llu (pending)", o->name,
	     o->seq, (unsigned long long)o->v);
	return 0;
}

static int op_seal(struct actor *a)
{
	struct openw *o = some_open(a);

	return o ? seal_version(a, o, "seal") : 0;
}

static int op_abort(struct actor *a)
{
	struct openw tmp, *o = some_open(a);

	if (!o || rnd(a) % 2) {
		o = &tmp;
		if (create_version(a, (int)(rnd(a) % NAMES), o, 1))
			return -1;
	}
	dlshare_writer_abort(o->w);
	o->used = 0;
	ring_set(a, o->seq, o->vs.h[0].token, o->v, ST_ABORTED);
	slog(a->slot, "abort model/n%d write %u v%llu", o->name, o->seq,
	     (unsigned long long)o->v);
	return 0;
}

static int op_export(struct actor *a)
{
	int name = (int)(rnd(a) % NAMES), packed = (int)(rnd(a) % 2);
	uint32_t seq = a->seq++;
	struct version_spec vs;
	DLManagedTensor *t[MAX_TENSORS];
	dlshare_publish_opts po = { .keys = keys,
				    .flags = DLSHARE_PUBLISH_NO_COPY };
	uint64_t e0, ld, v = 0;
	char nm[64];
	int err;

	name_of(name, nm, sizeof(nm));
	spec_make(a, name, seq, &vs);
	if (packed) {
		/* One allocation, tensors at 8-byte aligned offsets. */
		size_t off[MAX_TENSORS], total = 0;
		int64_t len;
		DLManagedTensor *base;
		atomic_int *refs = malloc(sizeof(*refs));

		for (int i = 0; i < vs.n; i++) {
			off[i] = total + 8 * (rnd(a) % 8);
			total = off[i] + ((size_t)vs.h[i].nbytes + 7) / 8 * 8;
		}
		len = (int64_t)total;
		err = dlshare_host_alloc(DT_U8, 1, &len, &base);
		if (err || !refs)
			return model_fail(a, "host_alloc of %lld bytes: %s",
					  (long long)len, code(err));
		atomic_init(refs, vs.n);
		for (int i = 0; i < vs.n; i++) {
			struct xview *xv = calloc(1, sizeof(*xv));

			if (!xv)
				return model_fail(a, "out of memory");
			xv->shape[0] = vs.shape[i][0];
			xv->shape[1] = vs.shape[i][1];
			xv->base = base;
			xv->refs = refs;
			xv->m.dl_tensor = (DLTensor){
				.data = base->dl_tensor.data,
				.byte_offset = off[i],
				.device = { kDLCPU, 0 }, .ndim = vs.ndim[i],
				.dtype = vs.dt[i], .shape = xv->shape,
			};
			xv->m.deleter = view_deleter;
			content_fill((char *)base->dl_tensor.data + off[i],
				     &vs.h[i], 0, (size_t)vs.h[i].nbytes);
			t[i] = &xv->m;
			scribble_wrap(t[i]);
		}
	} else {
		for (int i = 0; i < vs.n; i++) {
			err = dlshare_host_alloc(vs.dt[i], vs.ndim[i],
						 vs.shape[i], &t[i]);
			if (err)
				return model_fail(a, "host_alloc: %s", code(err));
			content_fill(t[i]->dl_tensor.data, &vs.h[i], 0,
				     (size_t)vs.h[i].nbytes);
			scribble_wrap(t[i]);
		}
	}
	ring_set(a, seq, vs.h[0].token, 0, ST_PENDING);
	/* Its leaving may reset this name: a worker's leave is counted
	 * when it comes (the test process counts it for a worker it kills,
	 * from this mask); a fork child's is open from now, in case it is
	 * killed with its worker, and done when it left. */
	if (!a->in_child) {
		atomic_fetch_or(&S->slot[a->wk->proc_slot].exported, 1u << name);
	} else if (!(a->child_exported & (1u << name))) {
		a->child_exported |= 1u << name;
		leave_begin(1u << name);
		atomic_fetch_or(&S->slot[a->slot].child_leaves, 1u << name);
	}
	ld = atomic_load(&S->leave_done[name]);
	e0 = sum_end(name);
	err = dlshare_publish(a->c, nm, t, (size_t)vs.n, &po, &v);
	if (err) {
		for (int i = 0; i < vs.n; i++)
			t[i]->deleter(t[i]);
	}
	return after_seal(a, name, seq, vs.h[0].token, v, e0, ld, err,
			  packed ? "export packed" : "export");
}

static int op_copy(struct actor *a)
{
	int name = (int)(rnd(a) % NAMES);
	uint32_t seq = a->seq++;
	struct version_spec vs;
	DLManagedTensor *t[MAX_TENSORS];
	dlshare_publish_opts po = { .keys = keys };
	atomic_int runs = 0;
	uint64_t e0, ld, v = 0;
	char nm[64];
	int err;

	name_of(name, nm, sizeof(nm));
	spec_make(a, name, seq, &vs);
	for (int i = 0; i < vs.n; i++) {
		struct heap_tensor *h = calloc(1, sizeof(*h));
		void *data = malloc((size_t)vs.h[i].nbytes);

		if (!h || !data)
			return model_fail(a, "out of memory");
		h->shape[0] = vs.shape[i][0];
		h->shape[1] = vs.shape[i][1];
		h->runs = &runs;
		h->m.dl_tensor = (DLTensor){
			.data = data, .device = { kDLCPU, 0 },
			.ndim = vs.ndim[i], .dtype = vs.dt[i],
			.shape = h->shape,
		};
		h->m.deleter = heap_deleter;
		if (vs.ndim[i] == 2 && rnd(a) % 2) {
			/* Column-major: the copy must come out compact. */
			int64_t rows = vs.shape[i][0], cols = vs.shape[i][1];
			int32_t *tmp = malloc((size_t)vs.h[i].nbytes);
			int32_t *dst = data;

			if (!tmp)
				return model_fail(a, "out of memory");
			content_fill(tmp, &vs.h[i], 0, (size_t)vs.h[i].nbytes);
			for (int64_t r = 0; r < rows; r++)
				for (int64_t k = 0; k < cols; k++)
					dst[k * rows + r] = tmp[r * cols + k];
			free(tmp);
			h->strides[0] = 1;
			h->strides[1] = rows;
			h->m.dl_tensor.strides = h->strides;
		} else {
			content_fill(data, &vs.h[i], 0, (size_t)vs.h[i].nbytes);
		}
		t[i] = &h->m;
	}
	ring_set(a, seq, vs.h[0].token, 0, ST_PENDING);
	ld = atomic_load(&S->leave_done[name]);
	e0 = sum_end(name);
	err = dlshare_publish(a->c, nm, t, (size_t)vs.n, &po, &v);
	if (err) {
		for (int i = 0; i < vs.n; i++)
			t[i]->deleter(t[i]);
	} else if (atomic_load(&runs) != vs.n) {
		return model_fail(a, "copy to %s: %d of %d deleters ran before "
				  "publish returned", nm, atomic_load(&runs),
				  vs.n);
	}
	return after_seal(a, name, seq, vs.h[0].token, v, e0, ld, err, "copy");
}

static struct held *free_held(struct actor *a)
{
	for (int i = 0; i < MAX_HELD; i++)
		if (!a->held[i].used)
			return &a->held[i];
	return NULL;
}

static const char *const sel_names[] = { "latest", "exact", "newer" };

/* A version of name that a LATEST or NEWER_THAN get matches, sealed in a
 * window quiet at epoch e0 and answered before run ms `before`: its
 * number, or 0. (The newest version only grows while the name is not
 * deleted, so such a get has a match from then on; an EXACT one may not:
 * its version may have died, superseded and unleased, before the get came.)
 * Reads the version before the time, which its writer wrote first, so a
 * time never belongs to an older seal than the version. */
static uint64_t sealed_before(int name, uint32_t sel, uint64_t ver,
			      uint64_t e0, int64_t before)
{
	uint32_t k = atomic_load(&S->nslots);

	for (uint32_t i = 0; i < k; i++) {
		uint64_t r = atomic_load(&S->last_seal[name][i]);
		uint64_t v = r & 0xffffffffu;
		int64_t t = atomic_load(&S->last_seal_ms[name][i]);

		if (!r || (r >> 32) != e0 || t >= before)
			continue;
		if ((sel == DLSHARE_LATEST && v > 0) ||
		    (sel == DLSHARE_NEWER_THAN && v > ver))
			return v;
	}
	return 0;
}

static int do_get(struct actor *a, int name, uint32_t sel, uint64_t ver,
		  int timeout)
{
	dlshare_get_opts o = { .select = sel, .version = ver,
			       .timeout_ms = timeout };
	dlshare_bundle *b = NULL;
	uint64_t e0, b1, rec, rv, v, token, lost;
	int64_t t0, r0, dt;
	int err, rec_ok, quiet;
	char nm[64];
	struct seen *s = &a->seen[name];
	struct held *h;

	name_of(name, nm, sizeof(nm));
	e0 = sum_end(name);
	rec = atomic_load(&S->sealed_max[name]);
	t0 = util_now_ms();
	r0 = run_ms();
	err = dlshare_get(a->c, nm, &o, &b);
	dt = util_now_ms() - t0;
	b1 = sum_begin(name);
	quiet = b1 == e0;
	rv = rec & 0xffffffffu;
	rec_ok = quiet && (rec >> 32) == e0 && rv > 0;
	if (dt > timeout + harness_ms(5000))
		return model_fail(a, "get %s %s %llu timeout %d ms took %lld ms",
				  sel_names[sel], nm, (unsigned long long)ver,
				  timeout, (long long)dt);
	if (err) {
		slog(a->slot, "get %s %s %llu t%d -> %s", sel_names[sel], nm,
		     (unsigned long long)ver, timeout, code(err));
		if (err != DLSHARE_ENOENT &&
		    !(err == DLSHARE_ETIMEDOUT && timeout > 0))
			return model_fail(a, "get %s %s %llu timeout %d: %s",
					  sel_names[sel], nm,
					  (unsigned long long)ver, timeout,
					  code(err));
		/* A parked get is answered when a version it matches is
		 * sealed (DESIGN.md: "the daemon parks the request"); libuv
		 * may fire its timer a few ms early. */
		if (err == DLSHARE_ETIMEDOUT && quiet &&
		    (lost = sealed_before(name, sel, ver, e0,
					  r0 + timeout - harness_ms(10))))
			return model_fail(a, "get %s %s %llu timeout %d ms from "
					  "%lld ms: timed out, though v%llu was "
					  "sealed before the timeout and no "
					  "delete of the name began since",
					  sel_names[sel], nm,
					  (unsigned long long)ver, timeout,
					  (long long)r0,
					  (unsigned long long)lost);
		if (sel == DLSHARE_LATEST && rec_ok)
			return model_fail(a, "get latest %s: %s, though v%llu "
					  "was sealed and no delete of the name "
					  "began since", nm, code(err),
					  (unsigned long long)rv);
		if (sel == DLSHARE_NEWER_THAN && rec_ok && rv > ver)
			return model_fail(a, "get newer than %llu %s: %s, though "
					  "v%llu was sealed and no delete of "
					  "the name began since",
					  (unsigned long long)ver, nm,
					  code(err), (unsigned long long)rv);
		for (int i = 0; sel == DLSHARE_EXACT && i < MAX_HELD; i++) {
			h = &a->held[i];
			if (h->used && h->name == name && h->v == ver &&
			    b1 == h->e0)
				return model_fail(a, "get exact %s v%llu: %s, "
						  "though this thread leases it "
						  "and no delete of the name "
						  "began since", nm,
						  (unsigned long long)ver,
						  code(err));
		}
		return 0;
	}
	v = dlshare_bundle_version(b);
	slog(a->slot, "get %s %s %llu t%d -> v%llu", sel_names[sel], nm,
	     (unsigned long long)ver, timeout, (unsigned long long)v);
	if (verify_bundle(a, name, b, &token, sel_names[sel]))
		goto fail;
	if (sel == DLSHARE_EXACT && v != ver) {
		model_fail(a, "get exact %s v%llu returned v%llu", nm,
			   (unsigned long long)ver, (unsigned long long)v);
		goto fail;
	}
	if (sel == DLSHARE_NEWER_THAN && v <= ver) {
		model_fail(a, "get newer than %llu %s returned v%llu", nm,
			   (unsigned long long)ver, (unsigned long long)v);
		goto fail;
	}
	if (sel == DLSHARE_LATEST && rec_ok && v < rv) {
		model_fail(a, "get latest %s returned v%llu, though v%llu was "
			   "sealed and no delete of the name began since", nm,
			   (unsigned long long)v, (unsigned long long)rv);
		goto fail;
	}
	if (s->valid && b1 == s->e0) {
		if (sel == DLSHARE_LATEST && v < s->v) {
			model_fail(a, "get latest %s returned v%llu after this "
				   "thread saw v%llu, no delete of the name "
				   "begun since", nm, (unsigned long long)v,
				   (unsigned long long)s->v);
			goto fail;
		}
		if (v == s->v && token != s->token) {
			model_fail(a, "%s v%llu has write %016llx, this thread "
				   "saw %016llx under that number, no delete "
				   "of the name begun since", nm,
				   (unsigned long long)v,
				   (unsigned long long)token,
				   (unsigned long long)s->token);
			goto fail;
		}
	}
	for (int i = 0; i < MAX_HELD; i++) {
		h = &a->held[i];
		if (h->used && h->name == name && h->v == v && b1 == h->e0 &&
		    h->token != token) {
			model_fail(a, "%s v%llu has write %016llx, this thread "
				   "leases it as %016llx", nm,
				   (unsigned long long)v,
				   (unsigned long long)token,
				   (unsigned long long)h->token);
			goto fail;
		}
	}
	if (sel != DLSHARE_EXACT || !s->valid || b1 != s->e0 || v >= s->v)
		*s = (struct seen){ 1, v, token, e0 };
	if (!a->in_child && (h = free_held(a)) && rnd(a) % 5 < 2) {
		*h = (struct held){ .used = 1, .name = name, .v = v,
				    .token = token, .e0 = e0 };
		if (rnd(a) % 2) {
			h->b = b;
			return 0;
		}
		h->n = (int)dlshare_bundle_count(b);
		for (int i = 0; i < h->n; i++) {
			if (rnd(a) % 2) {
				err = dlshare_bundle_export(b, (size_t)i,
							    &h->m[i]);
			} else {
				err = dlshare_bundle_export_versioned(
					b, (size_t)i, &h->mv[i]);
				if (!err && (h->mv[i]->version.major != 1 ||
					     !(h->mv[i]->flags &
					       DLPACK_FLAG_BITMASK_READ_ONLY))) {
					h->n = i + 1;
					held_free(h);
					model_fail(a, "export_versioned: DLPack "
						   "%u.%u, flags 0x%llx (want 1.x, "
						   "read-only)",
						   h->mv[i]->version.major,
						   h->mv[i]->version.minor,
						   (unsigned long long)
						   h->mv[i]->flags);
					goto fail;
				}
			}
			if (err) {
				h->n = i;
				held_free(h);
				model_fail(a, "bundle_export: %s", code(err));
				goto fail;
			}
		}
	}
	dlshare_bundle_free(b);
	return 0;
fail:
	dlshare_bundle_free(b);
	return -1;
}

static int op_get(struct actor *a, uint32_t sel)
{
	int name = (int)(rnd(a) % NAMES);
	int timeout = rnd(a) % 3 ? 0 : rnd(a) % 10 ? 1 + (int)(rnd(a) % 20) :
		      50 + (int)(rnd(a) % 200);
	uint64_t ver = 0;

	if (sel == DLSHARE_EXACT) {
		struct held *h = &a->held[rnd(a) % MAX_HELD];

		if (h->used && rnd(a) % 2) {
			name = h->name;
			ver = h->v;
		} else if (a->seen[name].valid && rnd(a) % 3) {
			ver = a->seen[name].v - rnd(a) % 2;
		} else {
			ver = 1 + rnd(a) % 8;
		}
		if (!ver)
			ver = 1;
	} else if (sel == DLSHARE_NEWER_THAN) {
		ver = a->seen[name].valid && rnd(a) % 4 ?
		      a->seen[name].v : rnd(a) % 4;
	}
	return do_get(a, name, sel, ver, timeout);
}

static int op_release(struct actor *a)
{
	struct held *h = &a->held[rnd(a) % MAX_HELD];

	if (!h->used)
		return 0;
	if (verify_held(a, h, "release"))
		return -1;
	if (rnd(a) % 2 && do_get(a, h->name, DLSHARE_EXACT, h->v, 0))
		return -1;
	slog(a->slot, "release model/n%d v%llu", h->name,
	     (unsigned long long)h->v);
	held_free(h);
	return 0;
}

static int op_delete(struct actor *a)
{
	int name = (int)(rnd(a) % NAMES);
	char nm[64];
	int err;

	name_of(name, nm, sizeof(nm));
	atomic_fetch_add(&S->del_begin[name][a->slot], 1);
	err = dlshare_delete(a->c, nm);
	atomic_fetch_add(&S->del_end[name][a->slot], 1);
	slog(a->slot, "delete %s -> %s", nm, err ? code(err) : "0");
	if (err && err != DLSHARE_ENOENT)
		return model_fail(a, "delete %s: %s", nm, code(err));
	return 0;
}

static int op_stat(struct actor *a)
{
	int name = (int)(rnd(a) % NAMES);
	dlshare_name_info info;
	uint64_t e0, rec, rv;
	char nm[64];
	int err, rec_ok;

	name_of(name, nm, sizeof(nm));
	e0 = sum_end(name);
	rec = atomic_load(&S->sealed_max[name]);
	err = dlshare_stat(a->c, nm, &info, NULL);
	rv = rec & 0xffffffffu;
	rec_ok = sum_begin(name) == e0 && (rec >> 32) == e0 && rv > 0;
	slog(a->slot, "stat %s -> %s latest %llu", nm, err ? code(err) : "0",
	     err ? 0ull : (unsigned long long)info.latest);
	if (err && err != DLSHARE_ENOENT)
		return model_fail(a, "stat %s: %s", nm, code(err));
	if (rec_ok && (err || info.latest < rv))
		return model_fail(a, "stat %s: %s latest %llu, though v%llu was "
				  "sealed and no delete of the name began since",
				  nm, err ? code(err) : "0",
				  err ? 0ull : (unsigned long long)info.latest,
				  (unsigned long long)rv);
	if (!err && strcmp(info.name, nm))
		return model_fail(a, "stat %s says name '%s'", nm, info.name);
	return 0;
}

static int list_cb(const dlshare_name_info *info, void *arg)
{
	int *bad = arg;

	if (name_index(info->name) < 0)
		*bad = 1;
	return 0;
}

static int op_list(struct actor *a)
{
	int bad = 0, err = dlshare_list(a->c, "model/", list_cb, &bad);

	if (err)
		return model_fail(a, "list: %s", code(err));
	if (bad)
		return model_fail(a, "list model/ named a name nobody made");
	return 0;
}

/* ---- forks -------------------------------------------------------------------- */

/* A child with its own client, as a data-loader worker forked from a
 * busy trainer: a store, an export, a read, then goodbye. */
static void child_own(struct actor *a)
{
	dlshare_client *mine = NULL;
	int err = dlshare_connect(D->sock, &mine);

	a->in_child = 1;
	a->child_exported = 0;
	/* Another thread may have held the wrapper table's lock at the fork:
	 * the child starts a table of its own. (The library's own locks are
	 * the library's business: DESIGN.md lets the child make a client.) */
	pthread_mutex_init(&xw_lock, NULL);
	nxw = 0;
	if (err) {
		model_fail(a, "fork child: connect: %s", code(err));
		_exit(1);
	}
	a->c = mine;
	if (op_store(a) || op_export(a) ||
	    do_get(a, (int)(rnd(a) % NAMES), DLSHARE_LATEST, 0, 0))
		_exit(1);
	atomic_store(&leaving, 1);
	dlshare_disconnect(mine);
	/* Done, unless the test process found it killed and did it. */
	for (int n = 0; n < NAMES; n++)
		if (atomic_fetch_and(&S->slot[a->slot].child_leaves,
				     ~(1u << n)) & (1u << n))
			leave_done(1u << n);
	_exit(0);
}

/* A fork child with a client of its own gets a name with room for 0..2
 * new fds in its process: the get succeeds (the version's buffers fit) or
 * fails with DLSHARE_EMFILE, nothing else, and once fds are free again the
 * same get succeeds with the version's content (the daemon attached the
 * fds that never came again, protocol 1.8). */
static void child_fds(struct actor *a)
{
	dlshare_client *mine = NULL;
	int name = (int)(rnd(a) % NAMES), room = (int)(rnd(a) % 3);
	int taken[3], next, err;
	struct rlimit old, low;
	dlshare_bundle *b;
	uint64_t token;
	char nm[64];

	a->in_child = 1;
	a->child_exported = 0;
	pthread_mutex_init(&xw_lock, NULL);
	nxw = 0;
	if ((err = dlshare_connect(D->sock, &mine))) {
		model_fail(a, "forkfds child: connect: %s", code(err));
		_exit(1);
	}
	a->c = mine;
	name_of(name, nm, sizeof(nm));
	for (int i = 0; i < room; i++)
		taken[i] = dup(0);
	next = dup(0);
	close(next);
	for (int i = 0; i < room; i++)
		close(taken[i]);
	if (next < 0 || getrlimit(RLIMIT_NOFILE, &old)) {
		model_fail(a, "forkfds child: dup or getrlimit: %s",
			   strerror(errno));
		_exit(1);
	}
	low = old;
	low.rlim_cur = (rlim_t)next;
	setrlimit(RLIMIT_NOFILE, &low);
	err = dlshare_get(mine, nm, NULL, &b);
	setrlimit(RLIMIT_NOFILE, &old);
	slog(a->slot, "forkfds child %d: get %s with room for %d fds -> %s",
	     (int)getpid(), nm, room, err ? code(err) : "0");
	if (!err) {
		if (verify_bundle(a, name, b, &token, "forkfds"))
			_exit(1);
		dlshare_bundle_free(b);
	} else if (err != DLSHARE_EMFILE && err != DLSHARE_ENOENT) {
		model_fail(a, "forkfds: get %s at the fd limit: %s (only "
			   "success, EMFILE or ENOENT are right)", nm,
			   code(err));
		_exit(1);
	}
	if (err == DLSHARE_EMFILE) {
		atomic_fetch_add(&S->fds_refused, 1);
		if (do_get(a, name, DLSHARE_LATEST, 0, 0))
			_exit(1);
	}
	dlshare_disconnect(mine);
	_exit(0);
}

/* LeakSanitizer asks this before its check at exit: a child that exit()s
 * holds its parent's heap, which is no leak of its own. */
static volatile int lsan_off;
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
	return lsan_off;
}

/* A fork child that hangs says where, before its alarm ends it. */
static void child_alarm(int sig)
{
	static const char msg[] = "fork child: hung here:\n";
	void *frames[64];
	int n = backtrace(frames, 64);

	(void)!write(2, msg, sizeof(msg) - 1);
	backtrace_symbols_fd(frames, n, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

static int op_fork(struct actor *a, enum op kind)
{
	uint32_t base = a->seq;
	int64_t deadline;
	dlshare_stats st;
	pid_t pid;
	int status = -1, err;

	a->seq += 8; /* the child's writes */
	if (kind != OP_FORK && kind != OP_FORKFDS) {
		atomic_store(&S->inherited_fork, run_ms());
		atomic_store(&touched_inherited, 1);
	}
	atomic_fetch_add(&forks_here, 1);
	fflush(NULL);
	pid = harness_fork();
	if (pid < 0) {
		atomic_fetch_sub(&forks_here, 1);
		return model_fail(a, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		signal(SIGALRM, child_alarm);
		alarm((unsigned)harness_ms(10000) / 1000 + 1);
		a->seq = base;
		switch (kind) {
		case OP_FORK:
			child_own(a);
			break;
		case OP_FORKEXIT:
			lsan_off = 1;
			exit(0); /* atexit handlers and all */
		case OP_FORKCALL:
			err = dlshare_stats_get(a->c, &st);
			slog(a->slot, "fork child %d: stats on the inherited "
			     "client -> %s", (int)getpid(), code(err));
			_exit(err ? 0 : 3);
		case OP_FORKDISC:
			dlshare_disconnect(a->c);
			_exit(0);
		case OP_FORKFDS:
			child_fds(a);
			break;
		default:
			break;
		}
		_exit(4);
	}
	deadline = util_now_ms() + harness_ms(20000);
	while (util_now_ms() < deadline) {
		int st_;

		if (waitpid(pid, &st_, WNOHANG) == pid) {
			status = WIFEXITED(st_) ? WEXITSTATUS(st_) :
				 128 + WTERMSIG(st_);
			break;
		}
		util_sleep_ms(1);
	}
	if (status < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	atomic_fetch_sub(&forks_here, 1);
	slog(a->slot, "%s child %d -> %d", op_names[kind], (int)pid, status);
	if (status == 128 + SIGALRM || status < 0)
		return model_fail(a, "%s: the child hung%s", op_names[kind],
				  kind == OP_FORKCALL ?
				  " in a call on its inherited client (DESIGN.md: "
				  "it gets a clear error)" : "");
	if (status == 3)
		return model_fail(a, "forkcall: a call on an inherited client "
				  "succeeded in the child (DESIGN.md: it gets a "
				  "clear error)");
	if (status)
		return model_fail(a, "%s: the child exited with %d",
				  op_names[kind], status);
	err = dlshare_stats_get(a->c, &st);
	if (err)
		return model_fail(a, "after %s: the parent's client fails: %s%s",
				  op_names[kind], code(err),
				  kind != OP_FORK && kind != OP_FORKFDS ?
				  " (known defect ii: a child "
				  "closing or exiting shuts the shared socket "
				  "down)" : "");
	return 0;
}

/* ---- an actor's life ---------------------------------------------------------- */

static enum op pick(struct actor *a)
{
	int total = 0, r;

	for (int i = 0; i < OP_N; i++)
		if (cfg.ops & (1u << i))
			total += op_weight[i];
	if (!total)
		return OP_LIST;
	r = (int)(rnd(a) % (uint32_t)total);
	for (int i = 0; i < OP_N; i++)
		if (cfg.ops & (1u << i)) {
			r -= op_weight[i];
			if (r < 0)
				return (enum op)i;
		}
	return OP_LIST;
}

/* ---- the queue name ---------------------------------------------------------- */

/* Outside model/, so that the checks of the ordinary names never see it;
 * writers are named slot + MAX_SLOTS in its contents. */
#define QNAME "modelq/q"
#define QINDEX 1000u
#define QDEPTH 4u

static int op_qput(struct actor *a)
{
	int64_t shape[1] = { CONTENT_HDR + (int64_t)(rnd(a) % cfg.max_bytes) };
	dlshare_tensor_spec s = { .key = "k0", .dtype = DT_U8, .ndim = 1,
				  .shape = shape };
	dlshare_queue_opts q = { .depth = QDEPTH,
				 .wait_ms = (int32_t)(rnd(a) % 21) };
	struct content_hdr h = { .magic = CONTENT_MAGIC, .name = QINDEX,
				 .ntensors = 1, .index = 0 };
	dlshare_writer *w;
	DLTensor *t;
	int err;

	h.who = (uint32_t)a->slot + MAX_SLOTS;
	h.seq = a->qseq++;
	h.token = content_token(cfg.seed, h.who, h.seq);
	h.nbytes = (uint64_t)shape[0];
	err = dlshare_create_queued(a->c, QNAME, &s, 1, NULL, &q, &w);
	if (err == DLSHARE_ELIMIT || err == DLSHARE_ETIMEDOUT) {
		slog(a->slot, "qput %u: %s", h.seq, code(err));
		return 0;
	}
	if (err)
		return model_fail(a, "qput create: %s", code(err));
	h.version = dlshare_writer_version(w);
	t = dlshare_writer_tensor(w, 0);
	content_fill((char *)t->data + t->byte_offset, &h, 0,
		     (size_t)h.nbytes);
	err = dlshare_seal(w, NULL, NULL);
	if (err)
		return model_fail(a, "qput seal of v%llu: %s",
				  (unsigned long long)h.version, code(err));
	slog(a->slot, "qput %u -> v%llu", h.seq,
	     (unsigned long long)h.version);
	return 0;
}

/* Checks a version taken from the queue. Returns 0 or model_fail's. */
static int qcheck(struct actor *a, dlshare_bundle *b, const char *what)
{
	const DLTensor *t = dlshare_bundle_tensor(b, 0);
	struct content_hdr h;
	char why[160];

	if (dlshare_bundle_count(b) != 1 || !t || t->ndim != 1)
		return model_fail(a, "%s: v%llu is not one 1-d tensor", what,
				  (unsigned long long)dlshare_bundle_version(b));
	if (content_check((const char *)t->data + t->byte_offset,
			  (size_t)t->shape[0], cfg.seed, &h, why, sizeof(why)))
		return model_fail(a, "%s: v%llu: %s", what,
				  (unsigned long long)dlshare_bundle_version(b),
				  why);
	if (h.name != QINDEX || h.who < MAX_SLOTS)
		return model_fail(a, "%s: v%llu holds what writer %u wrote for "
				  "name %u", what,
				  (unsigned long long)dlshare_bundle_version(b),
				  h.who, h.name);
	/* The version its writer was told it would be. */
	if (h.version != dlshare_bundle_version(b))
		return model_fail(a, "%s: v%llu holds what writer %u wrote as "
				  "v%llu", what,
				  (unsigned long long)dlshare_bundle_version(b),
				  h.who - MAX_SLOTS,
				  (unsigned long long)h.version);
	return 0;
}

static int op_qtake(struct actor *a)
{
	dlshare_bundle *b;
	int err = dlshare_take(a->c, QNAME, (int32_t)(rnd(a) % 21), NULL, &b);

	if (err == DLSHARE_ENOENT || err == DLSHARE_ETIMEDOUT ||
	    err == DLSHARE_ELIMIT) {
		slog(a->slot, "qtake: %s", code(err));
		return 0;
	}
	if (err)
		return model_fail(a, "qtake: %s", code(err));
	slog(a->slot, "qtake v%llu", (unsigned long long)dlshare_bundle_version(b));
	err = qcheck(a, b, "qtake");
	dlshare_bundle_free(b);
	return err;
}

static int run_op(struct actor *a, enum op op)
{
	switch (op) {
	case OP_STORE: return op_store(a);
	case OP_OPEN: return op_open(a);
	case OP_SEAL: return op_seal(a);
	case OP_ABORT: return op_abort(a);
	case OP_EXPORT: return op_export(a);
	case OP_COPY: return op_copy(a);
	case OP_LATEST: return op_get(a, DLSHARE_LATEST);
	case OP_EXACT: return op_get(a, DLSHARE_EXACT);
	case OP_NEWER: return op_get(a, DLSHARE_NEWER_THAN);
	case OP_RELEASE: return op_release(a);
	case OP_DELETE: return op_delete(a);
	case OP_STAT: return op_stat(a);
	case OP_LIST: return op_list(a);
	case OP_FORK: case OP_FORKEXIT: case OP_FORKCALL: case OP_FORKDISC:
	case OP_FORKFDS:
		return op_fork(a, op);
	case OP_QPUT: return op_qput(a);
	case OP_QTAKE: return op_qtake(a);
	default: return 0;
	}
}

static void *actor_main(void *arg)
{
	struct actor *a = arg;
	struct slot *sl = &S->slot[a->slot];

	while (!atomic_load(&S->stop)) {
		a->op = pick(a);
		atomic_store(&sl->op_start, run_ms() + 1);
		if (run_op(a, a->op)) {
			atomic_store(&sl->op_start, 0);
			return NULL;
		}
		atomic_store(&sl->op_start, 0);
		atomic_fetch_add(&S->count[a->op], 1);
	}
	/* Wind down: what is held must still be intact; kept writers are
	 * sealed or aborted. */
	atomic_store(&sl->op_start, run_ms() + 1);
	for (int i = 0; i < MAX_HELD; i++) {
		a->op = OP_RELEASE;
		if (a->held[i].used) {
			if (verify_held(a, &a->held[i], "release at the end"))
				break;
			held_free(&a->held[i]);
		}
	}
	for (int i = 0; i < MAX_OPEN; i++) {
		if (!a->open[i].used)
			continue;
		if (rnd(a) % 2) {
			a->op = OP_SEAL;
			if (seal_version(a, &a->open[i], "seal at the end"))
				break;
		} else {
			dlshare_writer_abort(a->open[i].w);
			a->open[i].used = 0;
			ring_set(a, a->open[i].seq, a->open[i].vs.h[0].token,
				 a->open[i].v, ST_ABORTED);
		}
	}
	atomic_store(&sl->op_start, 0);
	return NULL;
}

static int worker_main(struct worker *wk)
{
	struct slot *ps = &S->slot[wk->proc_slot];
	pthread_t th[MAX_THREADS];
	int fds0 = harness_fd_count(getpid()), fds, err;
	uint32_t mask;

	alarm((unsigned)(cfg.seconds + harness_ms(120000) / 1000));
	atomic_store(&ps->pid, (int)getpid());
	{
		/* Loads what backtrace() needs now, not in a signal handler. */
		void *f[1];

		(void)backtrace(f, 1);
	}
	err = dlshare_connect(D->sock, &wk->c);
	if (err) {
		struct actor tmp = { .slot = wk->proc_slot };

		model_fail(&tmp, "worker %d: connect: %s", wk->index, code(err));
		return 1;
	}
	for (int i = 0; i < wk->nthreads; i++) {
		struct actor *a = &wk->a[i];

		a->wk = wk;
		a->c = wk->c;
		a->thread = i;
		a->rng = content_mix(cfg.seed ^ ((uint64_t)a->slot << 20));
		atomic_store(&S->slot[a->slot].pid, (int)getpid());
		pthread_create(&th[i], NULL, actor_main, a);
	}
	for (int i = 0; i < wk->nthreads; i++)
		pthread_join(th[i], NULL);
	/* Leaving withdraws this worker's exports: count it as a reset of
	 * each name it exported to, around the disconnect. */
	mask = atomic_load(&ps->exported);
	leave_begin(mask);
	atomic_store(&leaving, 1);
	slog(wk->proc_slot, "worker %d disconnects", wk->index);
	dlshare_disconnect(wk->c);
	leave_done(mask);
	if (atomic_load(&S->failed))
		return 1;
	{
		struct actor tmp = { .slot = wk->proc_slot };

		if (atomic_load(&x_unknown) ||
		    atomic_load(&x_ran) != atomic_load(&x_wrapped)) {
			model_fail(&tmp, "worker %d: %d export deleters ran for "
				   "%d exported tensors (%d runs for unknown or "
				   "already freed tensors)", wk->index,
				   atomic_load(&x_ran),
				   atomic_load(&x_wrapped),
				   atomic_load(&x_unknown));
			return 1;
		}
		fds = harness_wait_fds(getpid(), fds0);
		if (fds != fds0) {
			model_fail(&tmp, "worker %d: %d fds open after "
				   "disconnect, %d before connect", wk->index,
				   fds, fds0);
			return 1;
		}
	}
	return 0;
}

/* ---- the test process -------------------------------------------------------- */

struct wslot {
	pid_t pid;
	struct worker wk;
};

struct settle {
	int64_t at;
	int first, n;    /* slots */
	uint32_t leaves; /* the worker's exports */
};

static int alloc_slots(int n)
{
	uint32_t first = atomic_load(&S->nslots);

	if (first + (uint32_t)n > MAX_SLOTS)
		return -1;
	atomic_store(&S->nslots, first + (uint32_t)n);
	return (int)first;
}

static int start_worker(struct wslot *ws, int index)
{
	int first = alloc_slots(1 + cfg.threads);

	if (first < 0)
		return -1;
	memset(&ws->wk, 0, sizeof(ws->wk));
	ws->wk.index = index;
	ws->wk.proc_slot = first;
	ws->wk.nthreads = cfg.threads;
	for (int i = 0; i < cfg.threads; i++)
		ws->wk.a[i].slot = first + 1 + i;
	fflush(NULL);
	ws->pid = harness_fork();
	if (ws->pid < 0)
		fail_msg("fork: %s", strerror(errno));
	if (ws->pid == 0)
		_exit(worker_main(&ws->wk));
	slog(0, "worker %d started: pid %d slots %d..%d", index, (int)ws->pid,
	     first, first + cfg.threads);
	return 0;
}

static void parse_env(void)
{
	const char *s, *w = getenv("DLSHARE_TEST_WRAPPER");

	cfg.light = w && *w;
	cfg.seed = 1;
	s = getenv("DLSHARE_MODEL_SEED");
	if (s && !strcmp(s, "random"))
		cfg.seed = content_mix((uint64_t)time(NULL) ^
				       (uint64_t)getpid() << 32) & 0xffffffffffull;
	else if (s && *s)
		cfg.seed = strtoull(s, NULL, 0);
	s = getenv("DLSHARE_MODEL_SECONDS");
	cfg.seconds = s && *s ? atoi(s) : cfg.light ? 2 : 3;
	s = getenv("DLSHARE_MODEL_WORKERS");
	cfg.workers = s && *s ? atoi(s) : cfg.light ? 2 : 3;
	s = getenv("DLSHARE_MODEL_THREADS");
	cfg.threads = s && *s ? atoi(s) : cfg.light ? 2 : 3;
	s = getenv("DLSHARE_MODEL_KILL_MS");
	cfg.kill_ms = s && *s ? atoi(s) : cfg.light ? 800 : 400;
	cfg.max_bytes = cfg.light ? 4096 : 48 << 10;
	if (cfg.workers < 1 || cfg.workers > MAX_WORKERS)
		cfg.workers = 3;
	if (cfg.threads < 1 || cfg.threads > MAX_THREADS)
		cfg.threads = 3;
	if (cfg.seconds < 1)
		cfg.seconds = 1;
	if (cfg.kill_ms < 10)
		cfg.kill_ms = 10;

	cfg.ops = (1u << OP_N) - 1;
	s = getenv("DLSHARE_MODEL_OPS");
	if (s && *s && strcmp(s, "all")) {
		char buf[512], *save = NULL;
		int first = 1;

		snprintf(buf, sizeof(buf), "%s", s);
		for (char *tok = strtok_r(buf, ", ", &save); tok;
		     tok = strtok_r(NULL, ", ", &save)) {
			int neg = tok[0] == '-', k;

			if (first && !neg)
				cfg.ops = 0;
			first = 0;
			for (k = 0; k < OP_N; k++)
				if (!strcmp(tok + neg, op_names[k]))
					break;
			if (k == OP_N)
				fail_msg("DLSHARE_MODEL_OPS: no operation '%s'",
					 tok + neg);
			if (neg)
				cfg.ops &= ~(1u << k);
			else
				cfg.ops |= 1u << k;
		}
		/* A kept writer is sealed or aborted at the end anyway. */
	}
#ifdef __SANITIZE_ADDRESS__
	/* GCC 12's ASan allocator keeps a lock that fork() does not reset
	 * (newer compiler-rt resets it at fork): a child that allocates,
	 * forked while another thread held it, hangs in calloc. The fork
	 * children that allocate run in the other builds. */
	if (cfg.threads > 1 &&
	    (cfg.ops & ((1u << OP_FORK) | (1u << OP_FORKFDS)))) {
		cfg.ops &= ~((1u << OP_FORK) | (1u << OP_FORKFDS));
		fprintf(stderr, "SKIP (part): no 'fork' or 'forkfds' children "
			"under ASan with %d threads (its allocator is not "
			"fork-safe)\n", cfg.threads);
	}
#endif
}

static void print_report(void)
{
	int fs = atomic_load(&S->fail_slot);
	uint32_t n = atomic_load(&S->nslots);

	fprintf(stderr, "model: FAILED with DLSHARE_MODEL_SEED=%llu "
		"(ops 0x%x, %d workers x %d threads)\n  %s\n",
		(unsigned long long)cfg.seed, cfg.ops, cfg.workers,
		cfg.threads, S->fail);
	if (atomic_load(&S->inherited_fork))
		fprintf(stderr, "  the last child touching an inherited client "
			"ran at %lld ms\n",
			(long long)atomic_load(&S->inherited_fork));
	for (uint32_t i = 0; i < n; i++) {
		struct slot *s = &S->slot[i];
		uint32_t head = atomic_load(&s->log_head);
		/* All of the failed process's actors, a little of the rest. */
		uint32_t show = (int)i == fs || i == 0 ||
				atomic_load(&s->pid) ==
				atomic_load(&S->slot[fs].pid) ? LOG_LINES : 8;

		if (!head)
			continue;
		if (show > head)
			show = head;
		if (show > LOG_LINES)
			show = LOG_LINES;
		fprintf(stderr, "  slot %u (pid %d)%s, last %u of %u:\n", i,
			atomic_load(&s->pid), (int)i == fs ? " FAILED" : "",
			show, head);
		for (uint32_t k = head - show; k < head; k++)
			fprintf(stderr, "    %s\n", s->log[k % LOG_LINES]);
	}
}

static void print_counts(const char *how, int kills)
{
	char line[1024];
	int len = 0;

	for (int i = 0; i < OP_N; i++)
		len += snprintf(line + len, sizeof(line) - (size_t)len, " %s %llu",
				op_names[i],
				(unsigned long long)atomic_load(&S->count[i]));
	fprintf(stderr, "model: %s: seed %llu, %d s, %d workers x %d threads, "
		"%d kills, %llu reads checked (%llu MiB), %llu seals refused "
		"after a racing delete, %llu gets refused at the fd limit "
		"then served;%s\n", how, (unsigned long long)cfg.seed,
		cfg.seconds, cfg.workers, cfg.threads, kills,
		(unsigned long long)atomic_load(&S->reads),
		(unsigned long long)(atomic_load(&S->bytes_checked) >> 20),
		(unsigned long long)atomic_load(&S->refused),
		(unsigned long long)atomic_load(&S->fds_refused), line);
}

static void settle_now(struct settle *st)
{
	for (int s = st->first; s < st->first + st->n; s++) {
		for (int k = 0; k < NAMES; k++) {
			atomic_store(&S->del_end[k][s],
				     atomic_load(&S->del_begin[k][s]));
			/* A fork child killed with its worker. */
			if (atomic_fetch_and(&S->slot[s].child_leaves,
					     ~(1u << k)) & (1u << k))
				leave_done(1u << k);
		}
	}
	leave_done(st->leaves);
	st->at = 0;
}

/* Stops a worker, counts the resets its death causes, kills it, and
 * settles them later. Returns 0, or 1 when it had exited already. */
static int kill_worker(struct wslot *ws, struct settle *st)
{
	int status;
	uint32_t mask;

	kill(ws->pid, SIGSTOP);
	if (waitpid(ws->pid, &status, WUNTRACED) != ws->pid ||
	    !WIFSTOPPED(status)) {
		ws->pid = 0;
		return 1;
	}
	mask = atomic_load(&S->slot[ws->wk.proc_slot].exported);
	leave_begin(mask);
	kill(ws->pid, SIGKILL);
	waitpid(ws->pid, NULL, 0);
	{
		char ops[256];
		int len = 0;

		ops[0] = '\0';
		for (int i = 0; i < ws->wk.nthreads; i++) {
			struct slot *s = &S->slot[ws->wk.a[i].slot];
			uint32_t h = atomic_load(&s->log_head);

			len += snprintf(ops + len, sizeof(ops) - (size_t)len,
					" [slot %d %s: %s]", ws->wk.a[i].slot,
					atomic_load(&s->op_start) ? "busy" :
					"idle",
					h ? s->log[(h - 1) % LOG_LINES] + 11 : "");
			if (len >= (int)sizeof(ops))
				break;
		}
		slog(0, "killed worker %d pid %d (exports to 0x%x):%.80s",
		     ws->wk.index, (int)ws->pid, mask, ops);
	}
	/* Its operations end here, for the watchdog. */
	for (int s = ws->wk.proc_slot; s <= ws->wk.proc_slot + ws->wk.nthreads; s++)
		atomic_store(&S->slot[s].op_start, 0);
	st->at = util_now_ms() + harness_ms(500);
	st->first = ws->wk.proc_slot;
	st->n = 1 + ws->wk.nthreads;
	st->leaves = mask;
	ws->pid = 0;
	return 0;
}

static int count_names(const dlshare_name_info *info, void *arg)
{
	int *n = arg;

	(*n)++;
	return 0;
}

static void final_checks(struct fixture *fx, dlshare_client *c, int fds0)
{
	struct actor me = { .slot = 0, .c = c };
	struct util_want w = UTIL_ANY;
	dlshare_stats st;
	uint64_t versions = 0;
	int names = 0;

	w.connections = 1;
	w.leases = 0;
	w.parked = 0;
	util_assert_want(c, &w);
	/* The queue: whatever is left of it reads back intact, once each
	 * (nobody takes any more), and then it goes. */
	for (int k = 0; k <= (int)QDEPTH; k++) {
		dlshare_bundle *b;
		dlshare_queue_info qi;
		int err = dlshare_take(c, QNAME, 0, NULL, &b);

		if (err == DLSHARE_ENOENT)
			break;
		if (err)
			fail_msg("take %s at the end: %s", QNAME, code(err));
		if (k == (int)QDEPTH)
			fail_msg("%s at the end: more than its depth queued",
				 QNAME);
		if (qcheck(&me, b, "final take"))
			fail_msg("final take of %s: %s", QNAME, S->fail);
		dlshare_bundle_free(b);
		if (dlshare_queue_stat(c, QNAME, &qi) == 0 && qi.taken > 1)
			fail_msg("%s at the end: %u taken", QNAME, qi.taken);
	}
	(void)dlshare_delete(c, QNAME);
	util_assert_want(c, &w);
	st = util_stats(c);
	for (int n = 0; n < NAMES; n++) {
		dlshare_name_info info;
		dlshare_bundle *b;
		uint64_t token;
		char nm[64];
		int err;

		name_of(n, nm, sizeof(nm));
		err = dlshare_stat(c, nm, &info, NULL);
		if (err == DLSHARE_ENOENT)
			continue;
		if (err)
			fail_msg("stat %s at the end: %s", nm, code(err));
		names++;
		versions += info.versions;
		if (info.versions > 1 || info.leases || !info.latest ||
		    info.versions == 0)
			fail_msg("%s at the end: %u versions, %u leases, latest "
				 "%llu (want the newest only, no lease: a pending "
				 "or orphaned version was left)", nm,
				 info.versions, info.leases,
				 (unsigned long long)info.latest);
		err = dlshare_get(c, nm, NULL, &b);
		if (err)
			fail_msg("get %s at the end: %s", nm, code(err));
		if (verify_bundle(&me, n, b, &token, "final read"))
			fail_msg("final read of %s: %s", nm, S->fail);
		dlshare_bundle_free(b);
	}
	if (st.names != (uint64_t)names || st.versions != versions) {
		int all = 0;

		dlshare_list(c, "", count_names, &all);
		fail_msg("at the end the daemon counts %llu names and %llu "
			 "versions; the model's names hold %d and %llu (%d names "
			 "listed)", (unsigned long long)st.names,
			 (unsigned long long)st.versions, names,
			 (unsigned long long)versions, all);
	}
	for (int n = 0; n < NAMES; n++) {
		char nm[64];

		name_of(n, nm, sizeof(nm));
		(void)dlshare_delete(c, nm);
	}
	w.names = 0;
	w.versions = 0;
	w.buffers = 0;
	w.bytes = 0;
	util_assert_want(c, &w);
	assert_int_equal(harness_wait_fds(fx->d.pid, fds0), fds0);
}

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

static void model(void **state)
{
	struct fixture *fx = *state;
	struct wslot ws[MAX_WORKERS];
	struct settle settles[64];
	int nsettle = 0, kills = 0, fds0, can_kill;
	uint64_t prng;
	int64_t end, next_kill, stop_deadline;
	dlshare_client *c;

	parse_env();
	fprintf(stderr, "model: DLSHARE_MODEL_SEED=%llu DLSHARE_MODEL_SECONDS=%d "
		"workers %d threads %d ops 0x%x%s\n",
		(unsigned long long)cfg.seed, cfg.seconds, cfg.workers,
		cfg.threads, cfg.ops, cfg.light ? " (light: daemon wrapped)" : "");
	S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(S != MAP_FAILED);
	S->seed = cfg.seed;
	S->t0 = util_now_ms();
	atomic_store(&S->nslots, 1); /* slot 0: the test process's log */
	D = &fx->d;
	c = harness_connect(&fx->d);
	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	fds0 = harness_fd_count(fx->d.pid);

	memset(ws, 0, sizeof(ws));
	for (int i = 0; i < cfg.workers; i++)
		assert_int_equal(start_worker(&ws[i], i), 0);
	prng = content_mix(cfg.seed ^ 0x6b696c6cull);
	can_kill = !!(cfg.ops & (1u << OP_KILL));
	end = util_now_ms() + cfg.seconds * 1000;
	next_kill = util_now_ms() + cfg.kill_ms / 2 +
		    (int64_t)(prng % (uint64_t)cfg.kill_ms);
	while (util_now_ms() < end && !atomic_load(&S->failed)) {
		int64_t now;

		util_sleep_ms(5);
		now = util_now_ms();
		for (int i = 0; i < cfg.workers; i++) {
			int status;

			if (ws[i].pid > 0 &&
			    waitpid(ws[i].pid, &status, WNOHANG) == ws[i].pid) {
				struct actor tmp = { .slot = 0 };

				model_fail(&tmp, "worker %d (pid %d) exited early "
					   "with status 0x%x", i, (int)ws[i].pid,
					   status);
				ws[i].pid = 0;
			}
		}
		for (uint32_t s = 1; s < atomic_load(&S->nslots); s++) {
			int64_t t = atomic_load(&S->slot[s].op_start);

			if (t && run_ms() + 1 - t > harness_ms(15000)) {
				struct actor tmp = { .slot = (int)s };
				uint32_t h = atomic_load(&S->slot[s].log_head);

				model_fail(&tmp, "an operation hangs for %lld ms "
					   "(its last log line: %s)",
					   (long long)(run_ms() + 1 - t),
					   h ? S->slot[s].log[(h - 1) % LOG_LINES] :
					   "none");
			}
		}
		for (int i = 0; i < nsettle; i++)
			if (settles[i].at && now >= settles[i].at) {
				settle_now(&settles[i]);
				settles[i] = settles[--nsettle];
				i--;
			}
		if (can_kill && now >= next_kill && nsettle < 64) {
			int victim;

			prng = content_mix(prng);
			victim = (int)(prng % (uint64_t)cfg.workers);
			next_kill = now + cfg.kill_ms / 2 +
				    (int64_t)(prng >> 32) % cfg.kill_ms;
			if (ws[victim].pid > 0 &&
			    atomic_load(&S->nslots) + 1 + (uint32_t)cfg.threads <=
			    MAX_SLOTS) {
				if (kill_worker(&ws[victim], &settles[nsettle]) == 0) {
					nsettle++;
					kills++;
					atomic_fetch_add(&S->count[OP_KILL], 1);
				}
				if (start_worker(&ws[victim], victim))
					can_kill = 0;
			}
		}
	}
	atomic_store(&S->stop, 1);
	stop_deadline = util_now_ms() + harness_ms(20000);
	for (int i = 0; i < cfg.workers; i++) {
		int64_t deadline = stop_deadline;
		int status = -1, st_;

		while (ws[i].pid > 0 && util_now_ms() < deadline) {
			if (waitpid(ws[i].pid, &st_, WNOHANG) == ws[i].pid) {
				status = WIFEXITED(st_) ? WEXITSTATUS(st_) :
					 128 + WTERMSIG(st_);
				break;
			}
			util_sleep_ms(5);
		}
		if (ws[i].pid > 0 && status < 0) {
			struct actor tmp = { .slot = ws[i].wk.proc_slot };

			kill(ws[i].pid, SIGKILL);
			waitpid(ws[i].pid, NULL, 0);
			model_fail(&tmp, "worker %d (pid %d) did not stop", i,
				   (int)ws[i].pid);
		} else if (ws[i].pid > 0 && status != 0) {
			struct actor tmp = { .slot = ws[i].wk.proc_slot };

			model_fail(&tmp, "worker %d (pid %d) exited with %d", i,
				   (int)ws[i].pid, status);
		}
		ws[i].pid = 0;
	}
	if (atomic_load(&S->failed)) {
		print_report();
		print_counts("failed", kills);
		dlshare_disconnect(c);
		fail_msg("model check failed (seed %llu): %s",
			 (unsigned long long)cfg.seed, S->fail);
	}
	final_checks(fx, c, fds0);
	print_counts("passed", kills);
	dlshare_disconnect(c);
	munmap(S, sizeof(*S));
	S = NULL;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(model, setup, teardown),
	};

	return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
