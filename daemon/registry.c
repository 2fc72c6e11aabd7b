/* registry — names, versions, buffers and leases.
 *
 * Lifetimes: an entry lives while it has versions. A version lives while it
 * is reachable (pending for its producer, or the newest sealed version of a
 * name that was not deleted) or leased; the moment it is neither, it dies
 * with its buffers (version_check). An entry that was deleted is detached
 * from the name map at once and dies with its last version.
 *
 * Charges follow the same rule: a version's cost is its producer's uid's
 * while it is reachable (version_charge, taken back in version_check), and
 * each leasing uid's while that uid leases it (registry_lease, lease_drop).
 */
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "host.h"

/* struct version: nfds is a byte. */
_Static_assert(REGISTRY_BUFFERS_HARD_MAX * REGISTRY_FDS_HOST + 1 <= UINT8_MAX,
	       "a version's fds fit in its nfds");

void registry_limits_default(struct registry_limits *l)
{
	long pages = sysconf(_SC_PHYS_PAGES);
	long psize = sysconf(_SC_PAGESIZE);

	l->max_tensors = REGISTRY_MAX_TENSORS_DEFAULT;
	l->max_buffers = REGISTRY_MAX_BUFFERS_DEFAULT;
	l->max_leases = REGISTRY_MAX_LEASES_DEFAULT;
	l->max_buffer_bytes = REGISTRY_MAX_BUFFER_BYTES_DEFAULT;
	l->max_bytes = (pages > 0 && psize > 0) ?
		(uint64_t)pages * (uint64_t)psize / 2 : (UINT64_C(1) << 32);
	l->default_mode = REGISTRY_DEFAULT_MODE;
	l->uid_connections = REGISTRY_UID_CONNECTIONS_DEFAULT;
	l->uid_names = REGISTRY_UID_NAMES_DEFAULT;
	l->uid_leases = REGISTRY_UID_LEASES_DEFAULT;
	l->uid_host_bytes = 0; /* 0: the same as max_bytes, whatever it is */
	l->uid_gpu_bytes = 0;
	l->huge_min = 0; /* huge pages are the operator's to give */
	l->uid_fds = REGISTRY_UID_FDS_DEFAULT;
	l->max_pending = REGISTRY_MAX_PENDING_DEFAULT;
	l->uid_pending = REGISTRY_UID_PENDING_DEFAULT;
	l->uid_open_fds = 0;         /* the server derives them */
	l->max_open_fds = 0;
	l->uid_leased_bytes = 0;     /* as uid_host_bytes */
	l->uid_leased_gpu_bytes = 0; /* as uid_gpu_bytes */
	l->uid_manifest_bytes = REGISTRY_UID_MANIFEST_BYTES_DEFAULT;
	l->default_ttl_ms = 0;      /* names live until deleted */
	l->max_ttl_ms = REGISTRY_MAX_TTL_MS_DEFAULT;
	l->queue_depth = REGISTRY_QUEUE_DEPTH_DEFAULT;
	l->max_queue_depth = REGISTRY_MAX_QUEUE_DEPTH_DEFAULT;
}

/* The per-uid byte caps in effect, 0 resolved. */

/* A pending store version, found by its writer id (registry_pending). */
struct writer_rec {
	uint64_t id;
	struct version *v;
	UT_hash_handle hh;
};

/* v leaves the pending state (sealed, or gone): its writer id finds
 * nothing from now on. */
static void writer_forget(struct registry *r, struct version *v)
{
	if (!v->wrec)
		return;
	HASH_DEL(r->writers, v->wrec);
	free(v->wrec);
	v->wrec = NULL;
}

uint64_t registry_bytes(const struct version *v)
{
	uint64_t n = 0;

	for (size_t i = 0; i < v->nbuffers; i++)
		n += v->buffers[i]->size;
	return n;
}

uint64_t registry_writer(const struct version *v)
{
	return v->wrec ? v->wrec->id : 0;
}

static uint64_t host_cap(const struct registry_limits *l)
{
	return l->uid_host_bytes ? l->uid_host_bytes : l->max_bytes;
}

static uint64_t gpu_cap(const struct registry_limits *l)
{
	return l->uid_gpu_bytes ? l->uid_gpu_bytes : UINT64_MAX;
}

static uint64_t leased_host_cap(const struct registry_limits *l)
{
	return l->uid_leased_bytes ? l->uid_leased_bytes : host_cap(l);
}

static uint64_t leased_gpu_cap(const struct registry_limits *l)
{
	return l->uid_leased_gpu_bytes ? l->uid_leased_gpu_bytes : gpu_cap(l);
}

void registry_uid_caps(const struct registry *r, uint64_t *host,
		       uint64_t *gpu, uint64_t *leased_host,
		       uint64_t *leased_gpu)
{
	*host = host_cap(&r->limits);
	*gpu = gpu_cap(&r->limits);
	*leased_host = leased_host_cap(&r->limits);
	*leased_gpu = leased_gpu_cap(&r->limits);
}

/* Whether bytes more fit under cap beside used. */
static int fits(uint64_t used, uint64_t bytes, uint64_t cap)
{
	return bytes <= cap && used <= cap - bytes;
}

/* A refusal: err, with the limit it hit and the reason it gives in *why
 * (a static string; why may be NULL). */
static int refuse(struct refusal *why, enum metrics_limit limit,
		  const char *reason, int err)
{
	if (why) {
		why->why = reason;
		why->limit = limit;
	}
	return err;
}

/* Frees a uid's record once it holds nothing. */
static void usage_put(struct registry *r, struct uid_usage *u)
{
	if (u && !u->owners && !u->names && !u->leases && !u->host_bytes &&
	    !u->gpu_bytes && !u->fds_queued && !u->pending && !u->versions &&
	    !u->leased && !u->fds && !u->meta_bytes) {
		HASH_DEL(r->uids, u);
		free(u);
	}
}

int registry_owner_attach(struct registry *r, struct registry_owner *o,
			  struct refusal *why)
{
	struct uid_usage *u = NULL;

	HASH_FIND(hh, r->uids, &o->uid, sizeof(o->uid), u);
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return -ENOMEM;
		u->uid = o->uid;
		HASH_ADD(hh, r->uids, uid, sizeof(u->uid), u);
	}
	if (u->owners >= r->limits.uid_connections) {
		usage_put(r, u);
		return refuse(why, METRICS_LIMIT_UID_CONNECTIONS, "connections per uid", -EDQUOT);
	}
	u->owners++;
	o->usage = u;
	return 0;
}

void registry_init(struct registry *r, const struct registry_limits *l,
		   const struct registry_ops *ops, void *ud)
{
	memset(r, 0, sizeof(*r));
	r->limits = *l;
	r->ops = ops;
	r->ud = ud;
	r->next_writer_id = 1;
	r->next_buffer_id = 1;
	r->next_lease_id = 1;
}

void registry_owner_init(struct registry_owner *o, uid_t uid, gid_t gid,
			 pid_t pid)
{
	memset(o, 0, sizeof(*o));
	o->uid = uid;
	o->gid = gid;
	o->pid = pid;
}

int registry_may(const struct entry *e, const struct registry_owner *o,
		 unsigned want)
{
	unsigned bits;

	if (o->uid == e->owner_uid)
		bits = (e->mode >> 6) & 7;
	else if (o->gid == e->owner_gid)
		bits = (e->mode >> 3) & 7;
	else
		bits = e->mode & 7;
	return (bits & want) == want;
}

struct entry *registry_entry(struct registry *r, const char *name)
{
	struct entry *e = NULL;

	HASH_FIND_STR(r->names, name, e);
	return e;
}

unsigned registry_name_hash(const char *name)
{
	unsigned hashv;

	HASH_VALUE(name, strlen(name), hashv);
	return hashv;
}

/* The fds a buffer of kind may hold (REGISTRY_FDS_*). */
static unsigned buffer_fds(unsigned kind)
{
	switch (kind) {
	case DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST:
		return REGISTRY_FDS_HOST;
	case DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM:
		return REGISTRY_FDS_VMM;
	default:
		return 0;
	}
}

/* ---- queue names: the parts of the model that only they have ---------- */

/* Puts sealed v on e's queue at its place by seal order (a redelivered
 * version goes back before every version sealed after it). */
static void queue_insert(struct entry *e, struct version *v)
{
	struct entry_queue *q = e->queue;
	struct version *at;

	/* A queue version's links are in its cold part (registry_add made
	 * it). */
	DL_FOREACH2(q->head, at, cold->qnext)
		if (at->cold->qseq > v->cold->qseq)
			break;
	if (at)
		DL_PREPEND_ELEM2(q->head, at, v, cold->qprev, cold->qnext);
	else
		DL_APPEND2(q->head, v, cold->qprev, cold->qnext);
	v->queued = 1;
	q->queued++;
}

static void queue_unlink(struct entry *e, struct version *v)
{
	if (!v->queued)
		return;
	DL_DELETE2(e->queue->head, v, cold->qprev, cold->qnext);
	v->queued = 0;
	e->queue->queued--;
}

/* v no longer counts toward its queue's depth: tells whoever waits for
 * room. */
static void queue_unhold(struct registry *r, struct version *v)
{
	struct entry *e = v->entry;

	if (!v->qheld)
		return;
	v->qheld = 0;
	e->queue->held--;
	if (r->ops && r->ops->queue_room)
		r->ops->queue_room(r->ud, e->name);
}

/* v dies: off its queue, and out of its depth. */
static void queue_forget(struct registry *r, struct version *v)
{
	queue_unlink(v->entry, v);
	queue_unhold(r, v);
}

/* l, a take, is released: its version is consumed. The caller drops l
 * next, and the version dies unless another lease holds it. */
static void queue_consume(struct registry *r, struct lease *l)
{
	l->take = 0;
	l->version->entry->queue->taken--;
	queue_unhold(r, l->version);
}

/* l's owner goes without releasing its take l: the version goes back to
 * the head of its queue. Returns 1, or 0 when its name was deleted or it
 * was withdrawn (an export whose producer went): it is consumed then. */
static int queue_return(struct registry *r, struct lease *l)
{
	struct version *v = l->version;
	struct entry *e = v->entry;

	/* An export whose producer went is withdrawn (registry_owner_drop):
	 * it does not come back either. */
	if (e->detached || !v->qheld || (v->exported && !v->producer)) {
		queue_consume(r, l);
		return 0;
	}
	l->take = 0;
	e->queue->taken--;
	queue_insert(e, v);
	return 1;
}

/* registry_add's part for queue names: the mode asked must be the name's,
 * and the name must have room. Returns 0, -EMEDIUMTYPE, -EDQUOT (a depth
 * over max_queue_depth) or -EAGAIN (full); *why says which. */
static int queue_check(struct registry *r, const struct entry *e,
		       const struct registry_spec *s, struct refusal *why)
{
	if (!e) {
		if (s->queue && s->queue_depth > r->limits.max_queue_depth)
			return refuse(why, METRICS_LIMIT_MAX_QUEUE_DEPTH,
				      "queue depth (max-queue-depth)", -EDQUOT);
		return 0;
	}
	if (!e->queue && s->queue)
		return refuse(why, METRICS_LIMIT_OTHER, "the name is not a queue, and this asks "
			      "for one (a name's mode is chosen when it is "
			      "created)", -EMEDIUMTYPE);
	if (e->queue && !s->queue)
		return refuse(why, METRICS_LIMIT_OTHER, "the name is a queue, and this asks for "
			      "an ordinary name (pass its queue depth, or 0 "
			      "for any)", -EMEDIUMTYPE);
	if (e->queue && s->queue_depth && s->queue_depth != e->queue->depth)
		return refuse(why, METRICS_LIMIT_OTHER, "the queue has another depth than this "
			      "asks for", -EMEDIUMTYPE);
	if (e->queue && e->queue->held >= e->queue->depth)
		return refuse(why, METRICS_LIMIT_QUEUE_FULL, "the queue is full", -EAGAIN);
	return 0;
}

int registry_queue_room(struct registry *r, const char *name,
			uint32_t *depth)
{
	struct entry *e = registry_entry(r, name);

	if (!e || !e->queue || e->queue->held < e->queue->depth)
		return 1;
	*depth = e->queue->depth;
	return 0;
}

struct version *registry_queue_head(struct registry *r,
				    struct registry_owner *o,
				    const char *name, int *err)
{
	struct entry *e = registry_entry(r, name);

	*err = -ENOENT;
	if (!e)
		return NULL;
	/* Taking changes the name: it needs read and write. */
	if (!registry_may(e, o, 4) || !registry_may(e, o, 2)) {
		*err = -EPERM;
		return NULL;
	}
	if (!e->queue) {
		*err = -EMEDIUMTYPE;
		return NULL;
	}
	if (!e->queue->head)
		return NULL;
	*err = 0;
	return e->queue->head;
}

void registry_queue_take(struct registry *r, struct lease *l)
{
	struct version *v = l->version;

	(void)r;
	queue_unlink(v->entry, v);
	v->entry->queue->taken++;
	l->take = 1;
}

void registry_queue_untake(struct registry *r, struct registry_owner *o,
			   struct lease *l)
{
	struct version *v = l->version;

	l->take = 0;
	v->entry->queue->taken--;
	queue_insert(v->entry, v);
	registry_release(r, o, l->id);
}

/* Charges u, v's producer's uid (NULL: none), for v: v is reachable. */
static void version_charge(struct version *v, struct uid_usage *u)
{
	v->usage = u;
	if (!u)
		return;
	u->versions++;
	u->meta_bytes += v->meta_bytes;
	u->host_bytes += v->owned_host;
	u->gpu_bytes += v->owned_gpu;
	u->fds += v->nfds;
}

/* Takes back what v's producer's uid was charged for v, if anything: v is
 * no longer reachable, or dies. The uid's record may go. */
static void version_uncharge(struct registry *r, struct version *v)
{
	struct uid_usage *u = v->usage;

	if (!u)
		return;
	v->usage = NULL;
	u->versions--;
	u->meta_bytes -= v->meta_bytes;
	u->host_bytes -= v->owned_host;
	u->gpu_bytes -= v->owned_gpu;
	u->fds -= v->nfds;
	usage_put(r, u);
}

/* v is no longer pending (sealed, or dying): its producer and uid count it
 * no more. Before version_uncharge, which may free the uid's record. */
static void version_unpend(struct version *v)
{
	if (!v->pending)
		return;
	v->pending = 0;
	if (v->producer)
		v->producer->npending--;
	if (v->usage)
		v->usage->pending--;
}

/* The row of registry->devices for uuid: the one counting it, else a free
 * one; 0 when every row counts another device, else its index + 1. */
static uint8_t device_slot(struct registry *r, const uint8_t *uuid)
{
	unsigned free_row = 0;

	for (unsigned i = 0; i < REGISTRY_DEVICES_MAX; i++) {
		struct registry_device *dv = &r->devices[i];

		if (!dv->buffers) {
			if (!free_row)
				free_row = i + 1;
		} else if (!memcmp(dv->uuid, uuid, REGISTRY_UUID_LEN)) {
			return (uint8_t)(i + 1);
		}
	}
	if (free_row)
		memcpy(r->devices[free_row - 1].uuid, uuid, REGISTRY_UUID_LEN);
	return (uint8_t)free_row;
}

/* Counts b (live from now on: add, or gone) in its kind's totals and its
 * device's, for the metrics. */
static void buffer_count(struct registry *r, struct rbuffer *b, int add)
{
	unsigned k = b->kind < REGISTRY_KINDS ? b->kind : 0;
	struct registry_device *dv;

	if (b->has_uuid && add)
		b->dev_slot = device_slot(r, b->cuda->uuid);
	dv = !b->has_uuid ? NULL : b->dev_slot ?
	     &r->devices[b->dev_slot - 1] : &r->dev_other;
	if (add) {
		r->kind_buffers[k]++;
		r->kind_bytes[k] += b->size;
		if (dv) {
			dv->buffers++;
			dv->bytes += b->size;
		}
	} else {
		r->kind_buffers[k]--;
		r->kind_bytes[k] -= b->size;
		if (dv) {
			dv->buffers--;
			dv->bytes -= b->size;
		}
	}
}

/* Closes fd, which a host buffer (or manifest) of size bytes held: a
 * large one off the loop where ops->close_aside takes it. */
static void close_host_fd(struct registry *r, int fd, uint64_t size)
{
	if (fd < 0)
		return;
	if (size >= REGISTRY_CLOSE_ASIDE_MIN && r->ops && r->ops->close_aside)
		r->ops->close_aside(r->ud, fd);
	else
		close(fd);
}

void registry_fds_closed(struct registry *r, size_t n)
{
	r->fds_closing -= n;
}

void registry_fds_closing(struct registry *r, size_t n)
{
	r->fds_closing += n;
}

/* Lets go of what b holds; its memory is its version's. */
static void buffer_drop(struct registry *r, struct rbuffer *b)
{
	if (r->ops && r->ops->buffer_freed)
		r->ops->buffer_freed(r->ud, b);
	if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST) {
		close_host_fd(r, b->fd, b->size);
		close_host_fd(r, b->ro_fd, b->size);
	} else {
		if (b->fd >= 0)
			close(b->fd);
		if (b->ro_fd >= 0)
			close(b->ro_fd);
	}
	r->nbuffers--;
	r->bytes -= b->size;
	buffer_count(r, b, 0);
	r->nfds -= buffer_fds(b->kind);
	if (b->daemon_owned && b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST)
		r->owned_bytes -= b->size;
	else if (b->daemon_owned)
		r->gpu_bytes -= b->size;
}

static void tomb_free(struct registry *r, struct tomb *t)
{
	HASH_DEL(r->tombs, t);
	DL_DELETE(r->tomb_list, t);
	r->ntombs--;
	free(t);
}

/* Remembers the last number of e, which dies without a Delete. Without
 * memory for it the next version numbers from 1 again, as after a Delete. */
static void tomb_add(struct registry *r, const struct entry *e)
{
	size_t len = strlen(e->name);
	struct tomb *t;

	if (r->ntombs >= REGISTRY_TOMBS_MAX)
		tomb_free(r, r->tomb_list);
	t = malloc(offsetof(struct tomb, name) + len + 1);
	if (!t)
		return;
	memcpy(t->name, e->name, len + 1);
	t->last_number = e->last_sealed;
	HASH_ADD_KEYPTR(hh, r->tombs, t->name, len, t);
	DL_APPEND(r->tomb_list, t);
	r->ntombs++;
}

/* What a get of e's newest version answers, or who may ask it, changes
 * now: the token posted for it no longer holds (struct board). */
static void entry_unpost(struct registry *r, struct entry *e)
{
	if (e->bslot)
		board_clear(r->board, e->bslot - 1);
}

/* e's newest version is v (NULL: none) from now on. */
static void entry_latest(struct registry *r, struct entry *e,
			 struct version *v)
{
	entry_unpost(r, e);
	e->latest = v;
}

/* Whether a reader may answer a later get of v itself while v's name's
 * token holds: only a version whose reply never changes and whose reader
 * has nothing to wait for (host memory, no CUDA event). */
static int version_board_ok(const struct version *v)
{
	if (v->event_len || v->ndev_events)
		return 0;
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i]->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST ||
		    v->buffers[i]->dev_type != kDLCPU)
			return 0;
	return 1;
}

int registry_board_post(struct registry *r, struct entry *e, uint32_t *slot,
			uint64_t *token)
{
	uint32_t s;

	if (!r->board || !e->latest || e->detached ||
	    !version_board_ok(e->latest))
		return 0;
	if (!e->bslot) {
		if (board_slot_get(r->board, &s))
			return -ENOSPC;
		e->bslot = s + 1;
	}
	*slot = e->bslot - 1;
	*token = board_post(r->board, *slot);
	return 1;
}

static void entry_maybe_free(struct registry *r, struct entry *e)
{
	if (e->versions)
		return;
	/* A queue name keeps its mode while empty, until deleted. */
	if (e->queue && !e->detached)
		return;
	/* Not deleted, and readers saw its numbers: the name numbers on
	 * after them. (Numbers only ever handed to writers that aborted
	 * are nobody's.) */
	if (!e->detached && e->last_sealed)
		tomb_add(r, e);
	if (!e->detached && r->ops && r->ops->removed)
		r->ops->removed(r->ud, e);
	lifetime_forget(r, e);
	if (e->usage) {
		e->usage->names--;
		usage_put(r, e->usage);
	}
	if (!e->detached) {
		HASH_DEL(r->names, e);
		r->nnames--;
	} else {
		DL_DELETE2(r->detached, e, dprev, dnext);
	}
	if (e->bslot)
		board_slot_put(r->board, e->bslot - 1);
	free(e->queue);
	free(e);
}

/* v's cold part (struct version_cold), made now if it has none. Returns
 * it, or NULL when out of memory. */
static struct version_cold *version_cold(struct version *v)
{
	if (!v->cold)
		v->cold = calloc(1, sizeof(*v->cold));
	return v->cold;
}

/* Frees v's block and its cold part, with its events (not its own
 * events': the caller hands them on). */
static void version_free(struct version *v)
{
	if (v->cold) {
		free(v->cold->event_handle);
		free(v->cold->dev_events);
		free(v->cold);
	}
	free(v); /* its tensors, buffers, dims and keys with it */
}

/* Frees v now, whatever holds it; the caller made sure nothing does. May
 * free v->entry too. */
static void version_destroy(struct registry *r, struct version *v)
{
	struct entry *e = v->entry;
	struct registry_owner *producer = v->producer;
	/* Exports give the producer its memory back; a store version sealed
	 * with a CUDA event lets it destroy the event. */
	int retire = producer && v->state == VERSION_SEALED;
	uint64_t number = v->number;

	version_unpend(v);
	version_uncharge(r, v);
	if (producer)
		DL_DELETE2(producer->versions, v, oprev, onext);
	writer_forget(r, v);
	DL_DELETE(e->versions, v);
	e->nversions--;
	r->nversions--;
	if (e->latest == v)
		entry_latest(r, e, NULL);
	queue_forget(r, v);
	/* A buffer's pointer is set once it is whole (version_buffers). */
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i])
			buffer_drop(r, v->buffers[i]);
	if (v->manifest_fd >= 0) {
		/* Peers that keep it (1.5) forget it: its id is never
		 * named again. */
		if (v->cold->mbuf.id && r->ops && r->ops->buffer_freed)
			r->ops->buffer_freed(r->ud, &v->cold->mbuf);
		close_host_fd(r, v->manifest_fd, v->cold->mbuf.size);
		r->nfds--;
	}
	r->meta_bytes -= v->meta_bytes;
	if (retire && r->ops && r->ops->retired)
		r->ops->retired(r->ud, producer, e->name, number);
	if (v->cold && v->cold->own_events) {
		/* Nothing can name them any more: its leases are gone. */
		if (r->ops && r->ops->events_freed)
			r->ops->events_freed(r->ud, v->cold->own_events);
		else
			free(v->cold->own_events);
	}
	free(v->reply_tail);
	version_free(v);
	entry_maybe_free(r, e);
}

static int version_reachable(const struct version *v)
{
	/* A sealed queue version: until consumed (queued, or taken). */
	if (v->entry->queue && v->state == VERSION_SEALED &&
	    !v->publishing && !v->sealing)
		return !v->entry->detached && v->qheld;
	/* Alive while its publication is being announced, whatever the
	 * callback does with leases. */
	if (v->publishing)
		return 1;
	/* A seal on the thread pool still uses its buffers' fds: it lives
	 * until registry_seal_end. */
	if (v->sealing)
		return 1;
	if (v->state == VERSION_PENDING)
		return !v->withdrawn;
	return !v->entry->detached && v->entry->latest == v;
}

/* Takes back its producer's charge once v is unreachable, and kills v if
 * nothing holds it any more. v may be freed on return. */
static void version_check(struct registry *r, struct version *v)
{
	if (version_reachable(v))
		return;
	/* A withdrawn pending version (its name was deleted) is no longer
	 * one its writer can seal. */
	version_unpend(v);
	version_uncharge(r, v);
	if (v->leases == 0)
		version_destroy(r, v);
}

/* Makes a sealed v visible: the newest version unless a newer one was sealed
 * first. The version it replaces, and v itself if it was born superseded,
 * live on only while leased. */
static void version_publish(struct registry *r, struct version *v)
{
	struct entry *e = v->entry;
	struct version *old = e->latest;

	if (v->number > e->last_sealed)
		e->last_sealed = v->number;
	lifetime_sealed(r, e);
	if (e->queue) {
		/* In seal order, after every version queued so far. */
		v->cold->qseq = ++e->queue->seq;
		queue_insert(e, v);
	} else if (!old || v->number > old->number) {
		entry_latest(r, e, v);
	} else {
		old = NULL;
	}
	if (e->queue)
		old = NULL;
	/* The parked gets are answered before the version v replaces dies:
	 * its death pushes BufferGone to readers and Retired to an exporting
	 * producer, whose freeing of the old memory (O(its pages) in the
	 * kernel) would otherwise race the readers' wakeup. The old version
	 * stays alive through the callback (publishing), and its Retired
	 * still comes before the PublishReply (docs/protocol.md). */
	if (old)
		old->publishing = 1;
	if (r->ops && r->ops->published) {
		v->publishing = 1;
		r->ops->published(r->ud, e, v);
		v->publishing = 0;
	}
	if (old) {
		old->publishing = 0;
		version_check(r, old);
	}
	version_check(r, v);
}

/* A zeroed record of size bytes, a spare one from s when it has one.
 * Returns NULL when out of memory. */
static void *spare_take(struct registry_spares *s, size_t size)
{
	void *p = s->head;

	if (!p)
		return util_zalloc(1, size);
	memcpy(&s->head, p, sizeof(s->head));
	s->n--;
	memset(p, 0, size);
	return p;
}

/* Keeps p (at least a pointer's size) in s, or frees it when s is full. */
static void spare_put(struct registry_spares *s, void *p)
{
	if (s->n >= REGISTRY_SPARE_MAX) {
		free(p);
		return;
	}
	memcpy(p, &s->head, sizeof(s->head));
	s->head = p;
	s->n++;
}

static void spares_free(struct registry_spares *s)
{
	while (s->head) {
		void *p = s->head;

		memcpy(&s->head, p, sizeof(s->head));
		free(p);
	}
	s->n = 0;
}

/* Puts l in o's table, with o's anchor first when the table is empty. */
static void owner_lease_add(struct registry_owner *o, struct lease *l)
{
	if (!o->leases) {
		memset(&o->anchor, 0, sizeof(o->anchor));
		HASH_ADD(hh, o->leases, id, sizeof(o->anchor.id),
			 &o->anchor);
	}
	HASH_ADD(hh, o->leases, id, sizeof(l->id), l);
}

/* Takes o's anchor out of its table (and so frees the table) when o
 * holds no lease: when o is dropped, or lost its leases otherwise. */
static void owner_lease_done(struct registry_owner *o)
{
	if (o->leases && !o->nleases)
		HASH_DEL(o->leases, &o->anchor);
}

/* o's lease with id; never the anchor. */
static struct lease *owner_lease_find(struct registry_owner *o, uint64_t id)
{
	struct lease *l = NULL;

	if (id)
		HASH_FIND(hh, o->leases, &id, sizeof(id), l);
	return l;
}

/* Takes back what l's uid was charged for l's version v, once l is its
 * uid's last lease on v. The uid's record stays: l's owner holds it. */
static void lease_uncharge(struct registry *r, struct version *v,
			   struct lease *l)
{
	struct vcharge *vc = l->charge;
	struct uid_usage *u;

	l->charge = NULL;
	if (!vc || --vc->leases)
		return;
	u = vc->usage;
	u->leased--;
	u->leased_host_bytes -= v->owned_host;
	u->leased_gpu_bytes -= v->owned_gpu;
	u->leased_meta_bytes -= v->meta_bytes;
	u->fds -= v->nfds;
	DL_DELETE(v->charges, vc);
	spare_put(&r->spare_charges, vc);
}

/* Drops every lease on v (a pending version's writer lease), then v. For
 * a pending version: no lease drop can kill it first. */
static void lease_drop(struct registry *r, struct registry_owner *o,
		       struct lease *l);

static void version_kill(struct registry *r, struct version *v)
{
	while (v->lease_list)
		lease_drop(r, v->lease_list->owner, v->lease_list);
	version_destroy(r, v);
}

/* Frees e with every version of it, leases still held included: they are
 * taken out of their owners' tables, so an owner dropped later finds none.
 * An entry has a version as long as it lives; the last one frees it. */
static void entry_destroy(struct registry *r, struct entry *e)
{
	if (!e->versions) {
		/* An empty queue name: freed as any other entry. */
		free(e->queue);
		e->queue = NULL;
		entry_maybe_free(r, e);
		return;
	}
	for (;;) {
		struct version *v = e->versions;
		int last = !v->next;
		struct lease *l, *tmp;

		DL_FOREACH_SAFE2(v->lease_list, l, tmp, vnext) {
			lease_uncharge(r, v, l);
			DL_DELETE2(v->lease_list, l, vprev, vnext);
			HASH_DEL(l->owner->leases, l);
			l->owner->nleases--;
			owner_lease_done(l->owner);
			if (l->owner->usage)
				l->owner->usage->leases--;
			v->leases--;
			v->entry->leases--;
			r->nleases--;
			spare_put(&r->spare_leases, l);
		}
		version_destroy(r, v);
		if (last)
			return;
	}
}

void registry_deinit(struct registry *r)
{
	struct entry *e, *etmp;

	r->ops = NULL;
	HASH_ITER(hh, r->names, e, etmp)
		entry_destroy(r, e);
	while (r->detached)
		entry_destroy(r, r->detached);
	while (r->tomb_list)
		tomb_free(r, r->tomb_list);
	spares_free(&r->spare_leases);
	spares_free(&r->spare_charges);
	free(r->ttl_heap);
	r->ttl_heap = NULL;
	r->ttl_n = r->ttl_cap = 0;
	struct uid_usage *u, *utmp;
	HASH_ITER(hh, r->uids, u, utmp) {
		HASH_DEL(r->uids, u);
		free(u);
	}
}

/* 1.4: a version's events per device (an export spanning devices). Each
 * names, by UUID, a distinct device of one of its buffers, and carries a
 * whole event handle; they replace the one event_handle. */
static int check_dev_events(const struct registry_spec *s)
{
	if (!s->ndev_events)
		return 0;
	if (s->event_len || s->ndev_events > s->nbuffers)
		return -EINVAL;
	for (size_t i = 0; i < s->ndev_events; i++) {
		const Dlshare__DeviceEvent *de = s->dev_events[i];
		int found = 0;

		if (de->uuid.len != REGISTRY_UUID_LEN ||
		    de->handle.len != REGISTRY_HANDLE_MAX)
			return -EINVAL;
		for (size_t j = 0; j < i; j++)
			if (memcmp(s->dev_events[j]->uuid.data, de->uuid.data,
				   REGISTRY_UUID_LEN) == 0)
				return -EINVAL;
		for (size_t b = 0; b < s->nbuffers && !found; b++) {
			const Dlshare__Device *dv = s->buffers[b]->device;

			found = dv && dv->has_uuid &&
				dv->uuid.len == REGISTRY_UUID_LEN &&
				memcmp(dv->uuid.data, de->uuid.data,
				       REGISTRY_UUID_LEN) == 0;
		}
		if (!found)
			return -EINVAL;
	}
	return 0;
}

static int spec_check(struct registry *r, const struct registry_spec *s,
		      int exported, uint64_t *sizes, uint64_t *owned,
		      uint64_t *gpu, struct refusal *why)
{
	const struct registry_limits *l = &r->limits;
	uint64_t total = 0, gtotal = 0;
	const char *bad;
	int err;

	if ((err = check_name(s->name)))
		return err;
	if (s->mode & ~CHECK_MODE_MASK)
		return -EINVAL;
	if ((bad = check_origin_why(s->origin_node, s->origin_version)))
		return refuse(why, METRICS_LIMIT_OTHER, bad, -EINVAL);
	size_t ntensors = s->manifest ? s->manifest->ntensors : s->ntensors;

	if (ntensors == 0 || s->nbuffers == 0 || (s->manifest && s->ntensors))
		return -EINVAL;
	if (ntensors > l->max_tensors || s->nbuffers > l->max_buffers)
		return refuse(why, METRICS_LIMIT_MAX_TENSORS, NULL, -E2BIG);
	if (s->event_len > REGISTRY_HANDLE_MAX)
		return -EINVAL;
	if ((err = check_dev_events(s)))
		return err;
	for (size_t i = 0; i < s->nbuffers; i++) {
		const Dlshare__Buffer *b = s->buffers[i];

		if (!b->device)
			return -EINVAL;
		if (b->size > l->max_buffer_bytes)
			return refuse(why, METRICS_LIMIT_MAX_BUFFER_BYTES,
				      NULL, -EFBIG);
		switch (b->kind) {
		case DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST:
			if (b->device->type != 1 && b->device->type != 3)
				return -EINVAL;
			if (!exported) {
				if (__builtin_add_overflow(total, b->size,
							   &total))
					return -ENOSPC;
			} else if (s->fds[i] < 0) {
				return -EINVAL;
			} else if ((err = host_check_fd(s->fds[i], b->size,
							&bad))) {
				return refuse(why, METRICS_LIMIT_OTHER, bad, err);
			}
			break;
		case DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM:
			/* Daemon-owned device memory: the fd the GPU backend
			 * made (none yet when prechecking). A producer's own
			 * VMM memory is copied into one of these instead. */
			if (exported)
				return -EOPNOTSUPP;
			if (b->device->type != 2 || !b->device->has_uuid ||
			    b->device->uuid.len != 16 ||
			    (!s->precheck && (!s->fds || s->fds[i] < 0)))
				return -EINVAL;
			if (__builtin_add_overflow(gtotal, b->size, &gtotal))
				return -ENOSPC;
			break;
		case DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC:
			/* Producer memory named by a CUDA IPC handle (the
			 * daemon only passes the handle on), or daemon-owned
			 * memory the GPU backend made with legacy IPC (made[i];
			 * a peer can not name one in a Create). */
			if (!exported && !(s->made && s->made[i]))
				return -EOPNOTSUPP;
			if (b->device->type != 2 || !b->device->has_uuid ||
			    b->device->uuid.len != 16 ||
			    (s->fds && s->fds[i] >= 0) || !b->has_ipc_handle ||
			    b->ipc_handle.len != REGISTRY_HANDLE_MAX)
				return -EINVAL;
			if (!exported &&
			    __builtin_add_overflow(gtotal, b->size, &gtotal))
				return -ENOSPC;
			break;
		default:
			return -EOPNOTSUPP;
		}
		sizes[i] = b->size;
	}
	for (size_t i = 0; i < s->ntensors; i++)
		if ((err = check_tensor(s->tensors[i], sizes, s->nbuffers)))
			return err;
	if (total > l->max_bytes || r->owned_bytes > l->max_bytes - total)
		return refuse(why, METRICS_LIMIT_MAX_BYTES, "daemon-owned bytes of the daemon", -ENOSPC);
	*owned = total;
	*gpu = gtotal;
	return 0;
}

/* The fds a spec's buffers may hold (struct version: nfds). */
static uint32_t spec_fds(const struct registry_spec *s)
{
	uint32_t n = s->manifest ? 1 : 0;

	for (size_t i = 0; i < s->nbuffers; i++)
		n += buffer_fds(s->buffers[i]->kind);
	return n;
}

/* The per-owner, per-uid and fd part of registry_add's checks: a version
 * costing bytes, gpu and nfds, pending unless exported. */
static int quota_check(struct registry *r, struct registry_owner *o,
		       int fresh_name, int exported, uint64_t bytes,
		       uint64_t gpu, uint32_t nfds, uint64_t meta,
		       struct refusal *why)
{
	const struct registry_limits *l = &r->limits;
	struct uid_usage *u = o->usage;

	/* Each pending version holds its memfds: a flood of them would take
	 * every fd of the daemon. */
	if (!exported && o->npending >= l->max_pending)
		return refuse(why, METRICS_LIMIT_MAX_PENDING, "pending versions per connection", -EDQUOT);
	if (l->max_open_fds &&
	    r->nfds + r->fds_queued + r->fds_closing + nfds > l->max_open_fds)
		return refuse(why, METRICS_LIMIT_MAX_OPEN_FDS, "open fds of the daemon", -ENOSPC);
	if (!u)
		return 0;
	if (!exported && u->pending >= l->uid_pending)
		return refuse(why, METRICS_LIMIT_UID_PENDING, "pending versions per uid", -EDQUOT);
	if (l->uid_open_fds && u->fds + u->fds_queued + nfds > l->uid_open_fds)
		return refuse(why, METRICS_LIMIT_UID_OPEN_FDS, "open fds per uid", -EDQUOT);
	if (fresh_name && u->names >= l->uid_names)
		return refuse(why, METRICS_LIMIT_UID_NAMES, "names per uid", -EDQUOT);
	if (!fits(u->host_bytes, bytes, host_cap(l)))
		return refuse(why, METRICS_LIMIT_UID_HOST_BYTES, "daemon-owned host bytes per uid", -EDQUOT);
	if (!fits(u->gpu_bytes, gpu, gpu_cap(l)))
		return refuse(why, METRICS_LIMIT_UID_GPU_BYTES, "daemon-owned GPU bytes per uid", -EDQUOT);
	if (!fits(u->meta_bytes, meta, l->uid_manifest_bytes))
		return refuse(why, METRICS_LIMIT_UID_MANIFEST_BYTES, "manifest bytes per uid "
			      "(--uid-manifest-bytes)", -EDQUOT);
	return 0;
}

/* Unnamed tensors share this key; nothing writes it. */
static char empty_key[1];

/* Copies a checked tensor (check_tensor bounds every narrowed field) into d,
 * its dims at *dims and its key at *keys, and moves both cursors on. */
static void tensor_copy(struct rtensor *d, const Dlshare__Tensor *t,
			int64_t **dims, char **keys)
{
	d->buffer = (uint8_t)t->buffer;
	d->offset = t->offset;
	d->code = (uint8_t)t->dtype->code;
	d->bits = (uint16_t)t->dtype->bits;
	d->lanes = (uint16_t)t->dtype->lanes;
	d->ndim = (uint8_t)t->n_shape;
	d->has_strides = t->n_strides != 0;
	d->key = empty_key;
	if (t->key && *t->key) {
		size_t len = strlen(t->key) + 1;

		d->key = memcpy(*keys, t->key, len);
		*keys += len;
	}
	if (!d->ndim)
		return;
	d->shape = memcpy(*dims, t->shape, d->ndim * sizeof(int64_t));
	*dims += d->ndim;
	if (d->has_strides) {
		d->strides = memcpy(*dims, t->strides,
				    d->ndim * sizeof(int64_t));
		*dims += d->ndim;
	}
}

/* Whether b needs a struct rbuffer_cuda: what version_buffers keeps of it
 * beyond a host buffer's fields. */
static int buffer_has_cuda(const Dlshare__Buffer *b)
{
	return (b->device->has_uuid && b->device->uuid.len == 16) ||
	       (b->has_ipc_handle && b->ipc_handle.len > 0 &&
		b->ipc_handle.len <= REGISTRY_HANDLE_MAX);
}

static size_t align_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

/* Makes the block of a version of a checked spec (see struct version): the
 * tensors are copied, the buffers zeroed, their pointers not yet set.
 * Returns it, or NULL when out of memory. No overflow: ntensors is a
 * uint32_t limit, and each tensor adds at most 2 * CHECK_NDIM_MAX dims and
 * CHECK_KEY_MAX + 1 key bytes. */
static struct version *version_alloc(const struct registry_spec *s,
				     int cold, struct rbuffer **bufs,
				     struct rbuffer_cuda **cuda)
{
	size_t ncuda = 0, ndims = 0, nkeys = 0;
	size_t o_ptrs, o_bufs, o_cuda, o_dims, o_keys, size;
	struct version *v;
	int64_t *dims;
	char *base, *keys;

	for (size_t i = 0; i < s->nbuffers; i++)
		ncuda += buffer_has_cuda(s->buffers[i]);
	for (size_t i = 0; i < s->ntensors; i++) {
		const Dlshare__Tensor *t = s->tensors[i];

		ndims += t->n_shape + (t->n_strides ? t->n_shape : 0);
		if (t->key && *t->key)
			nkeys += strlen(t->key) + 1;
	}
	size = sizeof(*v) + s->ntensors * sizeof(struct rtensor);
	o_ptrs = align_up(size, _Alignof(struct rbuffer *));
	size = o_ptrs + s->nbuffers * sizeof(struct rbuffer *);
	o_bufs = align_up(size, _Alignof(struct rbuffer));
	size = o_bufs + s->nbuffers * sizeof(struct rbuffer);
	o_cuda = align_up(size, _Alignof(struct rbuffer_cuda));
	size = o_cuda + ncuda * sizeof(struct rbuffer_cuda);
	o_dims = align_up(size, _Alignof(int64_t));
	size = o_dims + ndims * sizeof(int64_t);
	o_keys = size;
	size += nkeys;
	if (s->origin_node)
		size += strlen(s->origin_node) + 1;

	v = calloc(1, size);
	if (!v)
		return NULL;
	if (cold && !version_cold(v)) {
		free(v);
		return NULL;
	}
	v->manifest_fd = -1;
	v->meta_bytes = s->manifest ? s->manifest->size : size;
	base = (char *)v;
	v->buffers = (struct rbuffer **)(base + o_ptrs);
	*bufs = (struct rbuffer *)(base + o_bufs);
	*cuda = ncuda ? (struct rbuffer_cuda *)(base + o_cuda) : NULL;
	dims = (int64_t *)(base + o_dims);
	keys = base + o_keys;
	v->ntensors = (uint32_t)s->ntensors;
	v->nbuffers = (uint8_t)s->nbuffers;
	for (size_t i = 0; i < s->ntensors; i++)
		tensor_copy(&v->tensors[i], s->tensors[i], &dims, &keys);
	/* The keys end where the origin's node starts. */
	if (s->origin_node) {
		size_t n = strlen(s->origin_node) + 1;

		v->cold->origin_node = memcpy(base + o_keys + nkeys,
					      s->origin_node, n);
		v->cold->origin_version = s->origin_version;
	}
	return v;
}

/* version_buffers failed at buffer n: the caller's fds in the buffers
 * before it stay the caller's. */
static void buffers_untake(struct version *v, size_t n, int exported,
			   const int *made)
{
	for (size_t j = 0; j < n; j++)
		if (exported || v->buffers[j]->kind !=
		    DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST || (made && made[j]))
			v->buffers[j]->fd = -1;
}

/* Builds v's buffers in bufs (and their CUDA records in cuda, as
 * version_alloc made room for them): store mode makes memfds, export mode
 * takes the fds. Returns 0, -EBADF (an export's seal could not be added;
 * *why says so), or host_create's error. */
static int version_buffers(struct registry *r, struct version *v,
			   const struct registry_spec *s, int exported,
			   struct rbuffer *bufs, struct rbuffer_cuda *cuda,
			   struct refusal *why)
{
	for (size_t i = 0; i < s->nbuffers; i++) {
		const Dlshare__Buffer *in = s->buffers[i];
		struct rbuffer *b = &bufs[i];

		b->kind = (uint8_t)in->kind;
		b->size = in->size;
		b->dev_type = (uint8_t)in->device->type;
		b->fd = -1;
		b->ro_fd = -1;
		b->version = v;
		if (buffer_has_cuda(in)) {
			struct rbuffer_cuda *c = cuda++;

			if (in->device->has_uuid &&
			    in->device->uuid.len == 16) {
				memcpy(c->uuid, in->device->uuid.data, 16);
				b->has_uuid = 1;
			}
			if (in->has_ipc_handle && in->ipc_handle.len > 0 &&
			    in->ipc_handle.len <= REGISTRY_HANDLE_MAX) {
				memcpy(c->ipc_handle, in->ipc_handle.data,
				       in->ipc_handle.len);
				b->ipc_handle_len =
					(uint8_t)in->ipc_handle.len;
				c->ipc_offset = in->ipc_offset;
			}
			b->cuda = c;
		}
		if (exported) {
			/* Readers must not write the producer's memory, even
			 * through a reopen of /proc/self/fd: no new writable
			 * mapping of it, ever (the producer's own stays).
			 * Without that seal the export is refused. */
			if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST &&
			    host_seal_future_write(s->fds[i])) {
				buffers_untake(v, i, exported, s->made);
				return refuse(why, METRICS_LIMIT_OTHER,
					      "the daemon could not add "
					      "F_SEAL_FUTURE_WRITE to it",
					      -EBADF);
			}
			b->fd = s->fds[i];
		} else if (b->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST) {
			/* GPU memory the caller made: a cuda-vmm fd, taken
			 * over below once nothing can fail, or a cuda-ipc
			 * allocation the caller frees when told
			 * (buffer_freed). */
			if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM)
				b->fd = s->fds[i];
			b->daemon_owned = 1;
			r->gpu_bytes += b->size;
			v->owned_gpu += b->size;
		} else if (s->made && s->made[i] && s->fds[i] >= 0) {
			/* A memfd the caller made (and backed) off the loop:
			 * taken over below once nothing can fail. */
			struct stat st;

			if (fstat(s->fds[i], &st) < 0 || st.st_size < 0 ||
			    (uint64_t)st.st_size < in->size) {
				buffers_untake(v, i, exported, s->made);
				return -EINVAL;
			}
			b->size = (uint64_t)st.st_size;
			b->fd = s->fds[i];
			b->daemon_owned = 1;
			r->owned_bytes += b->size;
			v->owned_host += b->size;
		} else {
			b->fd = host_create(s->name, in->size,
					    r->limits.huge_min, &b->size);
			if (b->fd < 0) {
				int err = b->fd;

				buffers_untake(v, i, exported, s->made);
				return err;
			}
			b->daemon_owned = 1;
			r->owned_bytes += b->size;
			v->owned_host += b->size;
		}
		b->id = r->next_buffer_id++;
		v->buffers[i] = b;
		v->nfds += buffer_fds(b->kind);
		r->nbuffers++;
		r->bytes += b->size;
		buffer_count(r, b, 1);
		r->nfds += buffer_fds(b->kind);
	}
	/* Only now, when nothing can fail, do the caller's fds change
	 * hands. */
	for (size_t i = 0; s->fds && i < s->nbuffers; i++)
		if (exported || s->buffers[i]->kind !=
		    DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST ||
		    (s->made && s->made[i]))
			s->fds[i] = -1;
	return 0;
}

/* What a spec's tensors will cost (struct version: meta_bytes), close
 * enough for a quota: a manifest's size, or the rough size of the block
 * version_alloc makes. */
static uint64_t spec_meta_bytes(const struct registry_spec *s)
{
	uint64_t n = sizeof(struct version);

	if (s->manifest)
		return s->manifest->size;
	for (size_t i = 0; i < s->ntensors; i++)
		n += sizeof(struct rtensor) + 16 * s->tensors[i]->n_shape +
		     (s->tensors[i]->key ? strlen(s->tensors[i]->key) + 1 : 0);
	return n + s->nbuffers * (sizeof(struct rbuffer) + 8);
}

/* registry_precheck, giving the live entry of the name (or NULL). */
static int add_check(struct registry *r, struct registry_owner *o,
		     const struct registry_spec *s, int exported,
		     struct entry **entry, struct refusal *why)
{
	uint64_t sizes[REGISTRY_BUFFERS_HARD_MAX];
	uint64_t owned, gpu;
	struct entry *e;
	int err;

	if (s->nbuffers > REGISTRY_BUFFERS_HARD_MAX)
		return refuse(why, METRICS_LIMIT_MAX_TENSORS, NULL, -E2BIG);
	if ((err = spec_check(r, s, exported, sizes, &owned, &gpu, why)))
		return err;
	*entry = e = registry_entry(r, s->name);
	/* A doomed name (lifetime.c) is as good as gone: registry_add
	 * deletes it first. */
	if (e && entry_doomed(e))
		*entry = e = NULL;
	if (e && !registry_may(e, o, 2))
		return -EPERM;
	if ((err = lifetime_check(r, o, e, s, why)))
		return err;
	if ((err = queue_check(r, e, s, why)))
		return err;
	return quota_check(r, o, !e, exported, owned, gpu, spec_fds(s),
			   spec_meta_bytes(s), why);
}

int registry_precheck(struct registry *r, struct registry_owner *o,
		      const struct registry_spec *s, int exported,
		      struct refusal *why)
{
	struct entry *e;

	return add_check(r, o, s, exported, &e, why);
}

int registry_add(struct registry *r, struct registry_owner *o,
		 const struct registry_spec *s, int exported,
		 struct version **out, struct refusal *why)
{
	struct rbuffer *bufs;
	struct rbuffer_cuda *cuda;
	struct entry *e;
	struct version *v;
	int err, fresh = 0;

	if (s->precheck)
		return -EINVAL;
	lifetime_reap(r, s->name);
	if ((err = add_check(r, o, s, exported, &e, why)))
		return err;
	if (!e) {
		size_t len = strlen(s->name);

		e = calloc(1, offsetof(struct entry, name) + len + 1);
		if (!e)
			return -ENOMEM;
		if (s->queue && !(e->queue = calloc(1, sizeof(*e->queue)))) {
			free(e);
			return -ENOMEM;
		}
		memcpy(e->name, s->name, len + 1);
		/* A deleted name's versions may live on under leases; a new
		 * name of the same spelling numbers after them, so (name,
		 * number) never means two versions at once. */
		struct entry *d;
		DL_FOREACH2(r->detached, d, dnext)
			if (strcmp(d->name, e->name) == 0 &&
			    d->last_number > e->last_number)
				e->last_number = d->last_number;
		/* A name that died without a Delete numbers on. */
		struct tomb *t;
		HASH_FIND(hh, r->tombs, e->name, len, t);
		if (t) {
			if (t->last_number > e->last_number)
				e->last_number = t->last_number;
			e->last_sealed = t->last_number;
			tomb_free(r, t);
		}
		e->owner_uid = o->uid;
		e->owner_gid = o->gid;
		e->usage = o->usage;
		if (e->usage)
			e->usage->names++;
		e->mode = s->mode ? s->mode : r->limits.default_mode;
		if (s->queue)
			e->queue->depth = s->queue_depth ? s->queue_depth :
					  r->limits.queue_depth <
					  r->limits.max_queue_depth ?
					  r->limits.queue_depth :
					  r->limits.max_queue_depth;
		HASH_ADD_STR(r->names, name, e);
		r->nnames++;
		fresh = 1;
	} else if (s->mode && o->uid == e->owner_uid && s->mode != e->mode) {
		/* Readers it now refuses must ask again. */
		entry_unpost(r, e);
		e->mode = s->mode;
	}

	if (lifetime_prepare(r, e, s, fresh))
		goto fail_entry;
	v = version_alloc(s, s->origin_node || s->manifest || e->queue ||
			     (s->event_len && s->event_handle) ||
			     s->ndev_events, &bufs, &cuda);
	if (!v)
		goto fail_entry;
	v->entry = e;
	r->meta_bytes += v->meta_bytes; /* version_destroy takes it back */
	if (s->event_len && s->event_handle) {
		v->cold->event_handle = malloc(s->event_len);
		if (!v->cold->event_handle)
			goto fail_version;
		memcpy(v->cold->event_handle, s->event_handle, s->event_len);
		v->event_len = (uint8_t)s->event_len;
	}
	if (s->ndev_events) {
		v->cold->dev_events = malloc(s->ndev_events *
					     REGISTRY_DEV_EVENT_LEN);
		if (!v->cold->dev_events)
			goto fail_version;
		for (size_t i = 0; i < s->ndev_events; i++) {
			uint8_t *d = v->cold->dev_events +
				     i * REGISTRY_DEV_EVENT_LEN;

			memcpy(d, s->dev_events[i]->uuid.data, REGISTRY_UUID_LEN);
			memcpy(d + REGISTRY_UUID_LEN,
			       s->dev_events[i]->handle.data,
			       REGISTRY_HANDLE_MAX);
		}
		v->ndev_events = (uint8_t)s->ndev_events;
	}
	v->mode = e->mode;
	v->number = e->last_number + 1;
	v->producer = o;
	v->exported = !!exported;
	v->state = exported ? VERSION_SEALED : VERSION_PENDING;
	/* Version numbers restart after a Delete: a pending version is
	 * named by an id that never does. */
	if (!exported) {
		v->wrec = malloc(sizeof(*v->wrec));
		if (!v->wrec)
			goto fail_version;
		v->wrec->id = r->next_writer_id++;
		v->wrec->v = v;
		HASH_ADD(hh, r->writers, id, sizeof(v->wrec->id), v->wrec);
	}
	DL_APPEND(e->versions, v);
	DL_APPEND2(o->versions, v, oprev, onext);
	e->nversions++;
	r->nversions++;
	if ((err = version_buffers(r, v, s, exported, bufs, cuda, why))) {
		/* Never visible: no Retired for it. A name made for it goes
		 * with it, a queue name too: an empty queue name outlives
		 * its versions, but this one never had any. */
		v->state = VERSION_PENDING;
		if (fresh) {
			free(e->queue);
			e->queue = NULL;
		}
		version_destroy(r, v); /* frees the entry too if fresh */
		return err;
	}
	if (s->manifest) {
		v->manifest_fd = s->manifest->fd;
		s->manifest->fd = -1;
		/* An id from the buffers' space: a client caches manifests
		 * beside buffers, by id (1.5). */
		struct rbuffer *mb = &v->cold->mbuf;

		mb->id = r->next_buffer_id++;
		mb->size = v->meta_bytes;
		mb->version = v;
		mb->fd = -1;
		mb->ro_fd = -1;
		mb->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		mb->dev_type = 1;
		v->ntensors = s->manifest->ntensors;
		v->nfds++;
		r->nfds++;
	}
	e->last_number = v->number;
	if (e->queue) {
		v->qheld = 1;
		e->queue->held++;
	}
	/* Reachable from birth: its producer's uid pays for it. */
	version_charge(v, o->usage);
	if (!exported) {
		v->pending = 1;
		o->npending++;
		if (o->usage)
			o->usage->pending++;
	}
	lifetime_apply(r, o, e, s, fresh);
	*out = v;
	if (exported)
		version_publish(r, v); /* v stays: it is the newest */
	return 0;

fail_version:
	r->meta_bytes -= v->meta_bytes;
	version_free(v);
fail_entry:
	if (fresh) {
		HASH_DEL(r->names, e);
		r->nnames--;
		if (e->usage) {
			e->usage->names--;
			usage_put(r, e->usage);
		}
		lifetime_forget(r, e);
		free(e->queue);
		free(e);
	}
	return -ENOMEM;
}

static struct version *entry_version(struct entry *e, uint64_t number)
{
	struct version *v;

	DL_FOREACH(e->versions, v)
		if (v->number == number)
			return v;
	return NULL;
}

struct version *registry_pending(struct registry *r, struct registry_owner *o,
				 const char *name, uint64_t number,
				 uint64_t writer, int *err)
{
	struct entry *e;
	struct version *v = NULL;

	*err = -ENOENT;
	if (writer) {
		/* Another connection's writer id finds nothing: the same
		 * answer as one never handed out. */
		struct writer_rec *w;

		HASH_FIND(hh, r->writers, &writer, sizeof(writer), w);
		v = w ? w->v : NULL;
		if (!v || v->state != VERSION_PENDING || v->withdrawn ||
		    v->producer != o || v->number != number ||
		    strcmp(v->entry->name, name) != 0)
			return NULL;
		*err = 0;
		return v;
	}
	e = registry_entry(r, name);
	v = e ? entry_version(e, number) : NULL;
	if (!v)
		return NULL;
	if (v->state == VERSION_PENDING) {
		if (v->producer != o || v->withdrawn)
			return NULL;
		*err = 0;
		return v;
	}
	/* Sealed: that much a reader could learn anyway; to anyone else
	 * the version does not exist. */
	if (registry_may(e, o, 4))
		*err = -EALREADY;
	return NULL;
}

/* The pending version a Seal or an Abort names, when no seal of it is
 * under way. Returns 0 with *out, registry_pending's errors, or
 * -EINPROGRESS. */
static int pending_idle(struct registry *r, struct registry_owner *o,
			const char *name, uint64_t number, uint64_t writer,
			struct version **out)
{
	struct version *v;
	int err;

	if (!(v = registry_pending(r, o, name, number, writer, &err)))
		return err;
	if (v->sealing)
		return -EINPROGRESS;
	*out = v;
	return 0;
}

int registry_seal_begin(struct registry *r, struct registry_owner *o,
			const char *name, uint64_t number, uint64_t writer,
			struct version **out)
{
	int err = pending_idle(r, o, name, number, writer, out);

	if (!err)
		(*out)->sealing = 1;
	return err;
}

int registry_seal_end(struct registry *r, struct version *v, int err,
		      const uint8_t *event, size_t event_len)
{
	return registry_seal_end_owned(r, v, err, event, event_len, NULL, 0,
				       NULL);
}

int registry_seal_end_owned(struct registry *r, struct version *v, int err,
			    const uint8_t *event, size_t event_len,
			    const uint8_t *dev_events, size_t ndev_events,
			    void *own)
{
	struct registry_owner *o = v->producer;
	uint8_t *ev = NULL, *dev = NULL;

	v->sealing = 0;
	if (v->orphaned) {
		version_kill(r, v);
		return -ENOENT;
	}
	/* Its name was deleted meanwhile: it is withdrawn, and lives on
	 * only while a writer lease holds it. */
	if (v->withdrawn) {
		version_check(r, v);
		return -ENOENT;
	}
	if (!err && event_len > REGISTRY_HANDLE_MAX)
		err = -EINVAL;
	/* Host buffers are usually sealed with no event: it costs memory only
	 * where there is one. */
	if (!err && ndev_events > v->nbuffers)
		err = -EINVAL;
	if (!err && event_len && !(ev = malloc(event_len)))
		err = -ENOMEM;
	if (!err && ndev_events &&
	    !(dev = malloc(ndev_events * REGISTRY_DEV_EVENT_LEN)))
		err = -ENOMEM;
	if (!err && (ev || dev || own) && !version_cold(v))
		err = -ENOMEM;
	if (err) {
		free(ev);
		free(dev);
		return err;
	}
	if (event_len)
		memcpy(ev, event, event_len);
	if (ndev_events)
		memcpy(dev, dev_events, ndev_events * REGISTRY_DEV_EVENT_LEN);
	if (v->cold) {
		free(v->cold->event_handle);
		v->cold->event_handle = ev;
		free(v->cold->dev_events);
		v->cold->dev_events = dev;
		v->cold->own_events = own;
	}
	v->event_len = (uint8_t)event_len;
	v->ndev_events = (uint8_t)ndev_events;
	version_unpend(v);
	writer_forget(r, v);
	v->state = VERSION_SEALED;
	/* A producer's CUDA event lives in the producer's process: the
	 * producer stays attached, to hear when it may destroy it (Retired),
	 * and the version forgets the event when the producer goes. Events
	 * of the daemon's own (own) need no producer. */
	if (!event_len || own) {
		DL_DELETE2(o->versions, v, oprev, onext);
		v->producer = NULL;
	}
	version_publish(r, v);
	return 0;
}

int registry_seal(struct registry *r, struct registry_owner *o,
		  const char *name, uint64_t number, uint64_t writer,
		  const uint8_t *event, size_t event_len)
{
	struct version *v;
	int err = registry_seal_begin(r, o, name, number, writer, &v);

	if (err)
		return err;
	if (event_len > REGISTRY_HANDLE_MAX)
		err = -EINVAL;
	for (size_t i = 0; i < v->nbuffers && !err; i++)
		if (v->buffers[i]->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST)
			err = host_seal_write(v->buffers[i]->fd);
	return registry_seal_end(r, v, err, event, event_len);
}

int registry_abort(struct registry *r, struct registry_owner *o,
		   const char *name, uint64_t number, uint64_t writer)
{
	struct version *v = NULL;
	int err = pending_idle(r, o, name, number, writer, &v);

	if (err)
		return err;
	/* A writer lease (daemon-owned cuda-ipc memory) goes with it. */
	version_kill(r, v);
	return 0;
}

struct version *registry_find(struct registry *r, struct registry_owner *o,
			      const char *name, enum registry_select sel,
			      uint64_t number, int *err)
{
	return registry_find_hashed(r, o, name, registry_name_hash(name), sel,
				    number, err);
}

struct version *registry_find_hashed(struct registry *r,
				     struct registry_owner *o,
				     const char *name, unsigned hashv,
				     enum registry_select sel,
				     uint64_t number, int *err)
{
	struct entry *e = NULL;
	struct version *v = NULL;

	HASH_FIND_BYHASHVALUE(hh, r->names, name, strlen(name), hashv, e);

	*err = -ENOENT;
	if (!e)
		return NULL;
	if (!registry_may(e, o, 4)) {
		*err = -EPERM;
		return NULL;
	}
	if (e->queue) {
		*err = -EMEDIUMTYPE;
		return NULL;
	}
	switch (sel) {
	case REG_LATEST:
		v = e->latest;
		break;
	case REG_EXACT:
		v = entry_version(e, number);
		if (v && v->state != VERSION_SEALED)
			v = NULL;
		break;
	case REG_NEWER_THAN:
		if (e->latest && e->latest->number > number)
			v = e->latest;
		break;
	}
	if (v)
		*err = 0;
	return v;
}

/* Whether u may be charged v through a lease. Returns 0 or -EDQUOT (*why
 * names the limit). */
static int lease_quota(struct registry *r, const struct uid_usage *u,
		       const struct version *v, struct refusal *why)
{
	const struct registry_limits *l = &r->limits;

	if (!fits(u->leased_host_bytes, v->owned_host, leased_host_cap(l)))
		return refuse(why, METRICS_LIMIT_UID_LEASED_BYTES, "leased host bytes per uid", -EDQUOT);
	if (!fits(u->leased_gpu_bytes, v->owned_gpu, leased_gpu_cap(l)))
		return refuse(why, METRICS_LIMIT_UID_LEASED_GPU_BYTES, "leased GPU bytes per uid", -EDQUOT);
	/* A manifest kept alive only by leases is the leaseholders' (a
	 * 10^5-tensor one is 10 MB): what the uid leases counts against the
	 * same limit as what it produces, apart from it. */
	if (!fits(u->leased_meta_bytes, v->meta_bytes, l->uid_manifest_bytes))
		return refuse(why, METRICS_LIMIT_UID_MANIFEST_BYTES, "leased manifest bytes per uid "
			      "(--uid-manifest-bytes)", -EDQUOT);
	if (l->uid_open_fds &&
	    u->fds + u->fds_queued + v->nfds > l->uid_open_fds)
		return refuse(why, METRICS_LIMIT_UID_OPEN_FDS, "open fds per uid", -EDQUOT);
	return 0;
}

int registry_lease(struct registry *r, struct registry_owner *o,
		   struct version *v, struct lease **out, struct refusal *why)
{
	struct uid_usage *u = o->usage;
	struct vcharge *vc = NULL, *fresh = NULL;
	struct lease *l;
	int err;

	if (o->nleases >= r->limits.max_leases)
		return refuse(why, METRICS_LIMIT_MAX_LEASES, "leases per connection", -EDQUOT);
	if (u && u->leases >= r->limits.uid_leases)
		return refuse(why, METRICS_LIMIT_UID_LEASES, "leases per uid", -EDQUOT);
	/* The uid pays for v once, at its first lease on it: that is when the
	 * limit is checked. A version has leases of a few uids, not many. */
	if (u) {
		DL_FOREACH(v->charges, vc)
			if (vc->usage == u)
				break;
		if (!vc) {
			if ((err = lease_quota(r, u, v, why)))
				return err;
			vc = fresh = spare_take(&r->spare_charges,
						 sizeof(*fresh));
			if (!fresh)
				return -ENOMEM;
		}
	}
	l = spare_take(&r->spare_leases, sizeof(*l));
	if (!l) {
		if (fresh)
			spare_put(&r->spare_charges, fresh);
		return -ENOMEM;
	}
	if (fresh) {
		fresh->usage = u;
		DL_APPEND(v->charges, fresh);
		u->leased++;
		u->leased_host_bytes += v->owned_host;
		u->leased_gpu_bytes += v->owned_gpu;
		u->leased_meta_bytes += v->meta_bytes;
		u->fds += v->nfds;
	}
	if (vc)
		vc->leases++;
	l->charge = vc;
	l->id = r->next_lease_id++;
	l->version = v;
	l->owner = o;
	owner_lease_add(o, l);
	DL_APPEND2(v->lease_list, l, vprev, vnext);
	o->nleases++;
	if (o->usage)
		o->usage->leases++;
	v->leases++;
	v->entry->leases++;
	r->nleases++;
	*out = l;
	return 0;
}

static void lease_drop(struct registry *r, struct registry_owner *o,
		       struct lease *l)
{
	struct version *v = l->version;

	if (l->take)
		queue_consume(r, l);
	lease_uncharge(r, v, l);
	HASH_DEL(o->leases, l);
	DL_DELETE2(v->lease_list, l, vprev, vnext);
	o->nleases--;
	if (o->usage)
		o->usage->leases--;
	v->leases--;
	v->entry->leases--;
	r->nleases--;
	spare_put(&r->spare_leases, l);
	version_check(r, v);
}

int registry_reader_fd(struct rbuffer *b)
{
	if (b->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST ||
	    b->version->state != VERSION_SEALED)
		return b->fd;
	/* Made the first time a reader needs it, kept with the buffer. */
	if (b->ro_fd < 0)
		b->ro_fd = host_reopen_ro(b->fd);
	return b->ro_fd >= 0 ? b->ro_fd : b->fd;
}

int registry_release(struct registry *r, struct registry_owner *o,
		     uint64_t id)
{
	struct lease *l = owner_lease_find(o, id);

	if (!l)
		return -ENOENT;
	lease_drop(r, o, l);
	return 0;
}

int registry_untake(struct registry *r, struct registry_owner *o,
		    uint64_t id)
{
	struct lease *l = owner_lease_find(o, id);
	struct version *v;
	int back;

	if (!l)
		return -ENOENT;
	v = l->version;
	back = l->take && queue_return(r, l);
	lease_drop(r, o, l);
	/* Redelivered: whoever waits to take it may (registry_owner_drop). */
	if (back && r->ops && r->ops->published) {
		v->publishing = 1;
		r->ops->published(r->ud, v->entry, v);
		v->publishing = 0;
		version_check(r, v);
	}
	return 0;
}

int registry_delete(struct registry *r, struct registry_owner *o,
		    const char *name)
{
	struct entry *e = registry_entry(r, name);

	if (!e)
		return -ENOENT;
	if (!registry_may(e, o, 2))
		return -EPERM;
	registry_detach(r, e);
	return 0;
}

void registry_detach(struct registry *r, struct entry *e)
{
	struct version *v, *tmp;

	lifetime_forget(r, e);
	HASH_DEL(r->names, e);
	r->nnames--;
	e->detached = 1;
	if (r->ops && r->ops->removed)
		r->ops->removed(r->ud, e);
	DL_APPEND2(r->detached, e, dprev, dnext);
	/* The name is free again, also for the owner's quota, even while
	 * other uids' leases keep its versions alive. */
	if (e->usage) {
		e->usage->names--;
		usage_put(r, e->usage);
		e->usage = NULL;
	}
	entry_latest(r, e, NULL);
	/* Producers waiting for room in it find a new name. */
	if (e->queue && r->ops && r->ops->queue_room)
		r->ops->queue_room(r->ud, e->name);
	if (!e->versions) {
		entry_maybe_free(r, e); /* an empty queue name */
		return;
	}
	/* Pending versions are withdrawn: their writers' Seals find nothing.
	 * One that a writer lease holds (daemon-owned cuda-ipc memory, which
	 * its writer still maps) dies when that lease goes, like a sealed
	 * version under a reader's lease; one being sealed when its seal
	 * ends. The last version to die frees e; do not touch e after the
	 * loop. */
	DL_FOREACH_SAFE(e->versions, v, tmp) {
		if (v->state == VERSION_PENDING)
			v->withdrawn = 1;
		version_check(r, v);
	}
}

void registry_owner_forget_events(struct registry *r,
				  struct registry_owner *o)
{
	struct version *v, *tmp;

	(void)r;
	DL_FOREACH_SAFE2(o->versions, v, tmp, onext) {
		if (v->state != VERSION_SEALED || v->exported)
			continue;
		/* A store version outlives its producer, but not the
		 * producer's event: later readers get none (the library
		 * waits for its seal events before it says goodbye or
		 * disconnects). */
		DL_DELETE2(o->versions, v, oprev, onext);
		v->producer = NULL;
		if (v->cold) {
			free(v->cold->event_handle);
			v->cold->event_handle = NULL;
		}
		v->event_len = 0;
		/* A warm reader's reply kept from before names the event. */
		free(v->reply_tail);
		v->reply_tail = NULL;
		v->reply_tail_len = 0;
	}
}

void registry_owner_withdraw_exports(struct registry *r,
				     struct registry_owner *o)
{
	struct version *v, *tmp;

	DL_FOREACH_SAFE2(o->versions, v, tmp, onext) {
		if (v->state != VERSION_SEALED || !v->exported)
			continue;
		/* As when o's connection closes, but o stays attached: it
		 * hears Retired once no lease holds the version. */
		if (v->entry->latest == v)
			entry_latest(r, v->entry, NULL);
		if (v->queued)
			queue_forget(r, v);
		version_check(r, v);
	}
}

void registry_owner_drop(struct registry *r, struct registry_owner *o)
{
	struct lease *l, *ltmp;

	HASH_ITER(hh, o->leases, l, ltmp) {
		struct version *v = l->version;
		int back;

		if (l == &o->anchor)
			continue;
		back = l->take && queue_return(r, l);

		lease_drop(r, o, l);
		/* Redelivered: whoever waits to take it may. */
		if (back && r->ops && r->ops->published) {
			v->publishing = 1;
			r->ops->published(r->ud, v->entry, v);
			v->publishing = 0;
			version_check(r, v);
		}
	}
	/* Its owned names go, before its pending versions: those die
	 * either way. */
	lifetime_owner_drop(r, o);
	registry_owner_forget_events(r, o);
	while (o->versions) {
		struct version *v = o->versions;

		if (v->state == VERSION_PENDING && !v->sealing) {
			version_destroy(r, v);
			continue;
		}
		DL_DELETE2(o->versions, v, oprev, onext);
		v->producer = NULL;
		if (v->state == VERSION_PENDING) {
			/* Its seal is on the thread pool: it dies when that
			 * ends. Its uid stays charged until then. */
			if (v->pending)
				o->npending--;
			v->orphaned = 1;
			continue;
		}
		/* An export ends with its producer: withdraw it; leases keep
		 * their mappings, and the producer hears nothing more. A
		 * queued one leaves its queue (a taken one is its taker's
		 * until released). */
		if (v->entry->latest == v)
			entry_latest(r, v->entry, NULL);
		if (v->queued)
			queue_forget(r, v);
		version_check(r, v);
	}
	owner_lease_done(o);
	if (o->usage) {
		o->usage->owners--;
		usage_put(r, o->usage);
		o->usage = NULL;
	}
}
