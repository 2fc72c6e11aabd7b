/* bundle — get: a version's tensors over mapped buffers, the lease that
 * keeps them, and the DLPack managed tensors made from them. Also stat, list,
 * stats and delete, the other questions a consumer asks. */
#include "internal.h"
#include "metrics.h"

#include "cudalib.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manifest.h"

/* One tensor of a version: its key and dims point into its tset's store
 * (tensors that came inline) or its manifest mapping (1.4). buf and offset
 * say where its data is, for a bundle whose buffers are mapped elsewhere
 * than where its view was built (see bundle_fill). */
struct btensor {
	const char *key;
	DLTensor t;
	uint64_t offset;
	uint32_t buf;
};

/* A version's tensors and the memory behind their keys and dims: one block
 * for inline tensors, or the read-only mapping of the manifest memfd (10^5
 * tensors then cost 72 bytes each here, their keys and dims not copied). */
struct tset {
	size_t n;
	struct btensor *ts;
	void *store;             /* inline: keys and dims; else NULL */
	void *map;               /* manifest: its mapping; else NULL */
	size_t map_len;
};

/* What a bundle reads: its tensors with their data pointers resolved
 * against the buffers they were built with, and their key index. Private
 * to one bundle, or (1.5) shared read-only by every bundle of a manifest
 * this connection keeps (struct mcache), built by the first of them. */
struct view {
	struct tset set;
	uint32_t *index;         /* keys → 1 + tensor, open addressing; NULL
				  * for a handful of tensors (a scan) */
	size_t index_mask;       /* slots - 1, a power of two minus one */
	int cuda_ordinal;        /* a device of the version, -1 for none */
	size_t nbufs;            /* the buffers it was built with, nbufs of
				  * each, in the same block after the view
				  * (a view of one buffer then fits the
				  * thread's malloc cache) */
	uint64_t *sizes;
	const void **bases;
	uint8_t *cuda_host;
};

struct dlshare_bundle {
	struct lease_ref *lr;
	uint64_t version;
	size_t n;                /* view->set.n */
	struct btensor *ts;      /* view->set.ts, or own */
	struct btensor *own;     /* a copy of a shared view's tensors, for
				  * buffers mapped at other addresses; or
				  * NULL */
	struct view *view;       /* own_view, or mc's */
	struct view *own_view;   /* not shared: freed with the bundle */
	struct mcache *mc;       /* the kept manifest whose view it reads */
	int cuda_ordinal;        /* a device of the version, -1 for none */
	void *chain;             /* ours, after the wait for the producer's
				  * event: later waits wait for it */
};

/* Where a tensor with no bytes points: never read, never NULL. */
static const max_align_t empty_data;

/* Below this many tensors a key is found by a scan. */
#define BUNDLE_INDEX_MIN 16

static uint64_t key_hash(const char *k)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (; *k; k++)
		h = (h ^ (uint8_t)*k) * 0x100000001b3ull;
	return h;
}

/* Indexes v's keys so that dlshare_bundle_find is O(1): a state dict has
 * 10^3-10^5 tensors. Slots are at least twice the tensors; equal keys
 * (several unnamed tensors) keep their order, so the first one is found. */
static int view_index(struct view *v)
{
	size_t slots = BUNDLE_INDEX_MIN, n = v->set.n;

	if (n < BUNDLE_INDEX_MIN || n > UINT32_MAX - 1)
		return 0;
	while (slots < 2 * n)
		slots *= 2;
	v->index = calloc(slots, sizeof(*v->index));
	if (!v->index)
		return DLSHARE_ENOMEM;
	v->index_mask = slots - 1;
	for (size_t i = 0; i < n; i++) {
		size_t j = key_hash(v->set.ts[i].key) & v->index_mask;

		while (v->index[j])
			j = (j + 1) & v->index_mask;
		v->index[j] = (uint32_t)i + 1;
	}
	return 0;
}

/* What a DLManagedTensor(Versioned) of ours carries. */
struct managed {
	union {
		DLManagedTensor plain;
		DLManagedTensorVersioned versioned;
	} m;
	struct lease_ref *lr;
	int64_t shape[CHECK_NDIM_MAX];
	int64_t strides[CHECK_NDIM_MAX];
};

/* Adds to lr's release marker one on the default stream of each other
 * device its CUDA buffers are on (or waits for that stream here). */
static void mark_other_devices(struct lease_ref *lr, void *stream)
{
	for (size_t i = 0; i < lr->npins; i++) {
		const struct ibuf *b = lr->pins[i];
		int seen = b->ordinal == lr->ordinal;
		void *m;

		if (b->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC &&
		    b->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM)
			continue;
		for (size_t j = 0; j < i && !seen; j++)
			seen = lr->pins[j]->ordinal == b->ordinal &&
			       (lr->pins[j]->kind ==
				DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC ||
				lr->pins[j]->kind ==
				DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM);
		if (seen)
			continue;
		if (cuda_event_mark(stream, b->ordinal, &m) == 0)
			lr->event = cuda_chain_add(lr->event, m);
		else
			cuda_stream_wait_host(stream, b->ordinal);
	}
}

static void lease_ref_unref(struct lease_ref *lr)
{
	dlshare_client *c;

	if (atomic_fetch_sub(&lr->refs, 1) != 1)
		return;
	c = lr->c;
	if (client_forked(c)) {
		/* A tensor this process inherited from the one that got it:
		 * the lease is the parent's, and so is the socket a Release
		 * would go to. Our copy of the mapping stays until we exit
		 * (its cache is behind the client's lock, which a parent
		 * thread may have held at the fork). */
		client_warm_free(lr->seed);
		free(lr);
		return;
	}
	/* Release is stream-ordered: the producer may reuse device memory
	 * only after the kernels this consumer queued on it have run. */
	if (lr->ordinal >= 0 && lr->stream != DLSHARE_STREAM_NONE) {
		void *stream = lr->stream;

		/* Another thread's per-thread stream cannot be named here;
		 * the legacy stream of its context waits for it (and for
		 * every other blocking stream there). */
		if (stream == DLSHARE_STREAM_PER_THREAD &&
		    !pthread_equal(lr->thread, pthread_self()))
			stream = DLSHARE_STREAM_LEGACY;
		/* Without a marker, late rather than early: wait here. */
		if (cuda_event_mark(stream, lr->ordinal, &lr->event) != 0)
			cuda_stream_wait_host(stream, lr->ordinal);
		/* The default streams are one per device: a version spanning
		 * devices is released after each device's. */
		if (stream == DLSHARE_STREAM_LEGACY || stream == NULL ||
		    stream == DLSHARE_STREAM_PER_THREAD)
			mark_other_devices(lr, stream);
	}
	if (lr->event) {
		client_warm_free(lr->seed);
		lr->seed = NULL;
		client_release_after(c, lr); /* frees lr */
	} else if (lr->seed) {
		/* 1.7: the next get of the name may take it back. */
		client_warm_keep(c, lr->seed, lr->pins, lr->npins, lr->lease);
		free(lr);
	} else {
		client_unpin_release(c, lr->pins, lr->npins, lr->lease);
		free(lr);
	}
	client_unref(c);
}

static void tset_free(struct tset *s)
{
	free(s->ts);
	free(s->store);
	if (s->map)
		munmap(s->map, s->map_len);
	memset(s, 0, sizeof(*s));
}

/* Sets what bt takes from a (checked) tensor description besides its key
 * and dims: before tensor_resolve, byte_offset holds the offset and
 * device.device_id the buffer index. */
static void btensor_set(struct btensor *bt, const Dlshare__Tensor *wt)
{
	bt->offset = wt->offset;
	bt->buf = wt->buffer;
	bt->t.byte_offset = wt->offset;
	bt->t.device.device_type = kDLCPU;
	bt->t.device.device_id = (int32_t)wt->buffer;
	bt->t.ndim = (int32_t)wt->n_shape;
	bt->t.dtype.code = (uint8_t)wt->dtype->code;
	bt->t.dtype.bits = (uint8_t)wt->dtype->bits;
	bt->t.dtype.lanes = (uint16_t)wt->dtype->lanes;
}

/* Fills s with the n tensors of a reply: inline ones (wire, n of them), or
 * those of the manifest memfd mfd (wire NULL). sizes[] are the sizes of the
 * version's nbuffers buffers: the daemon checked every tensor against its
 * buffer; so do we, since a wrong answer would make the consumer read out
 * of bounds. The tensors' data pointers are not set here: byte_offset holds
 * the offset, device.device_id the buffer index. Returns 0, DLSHARE_EPROTO
 * or DLSHARE_ENOMEM; s needs tset_free either way. */
static int tset_fill(struct tset *s, Dlshare__Tensor *const *wire, size_t n,
		     int mfd, const uint64_t *sizes, size_t nbuffers)
{
	size_t ndims = 0, nkeys = 0;
	char *keys = NULL;
	int64_t *dims = NULL;

	if (n == 0)
		return DLSHARE_EPROTO;
	if (!wire) {
		struct manifest_error me;
		struct stat st;

		/* Its real size, whatever the reply says: a mapping past
		 * the end would fault. */
		if (mfd < 0 || fstat(mfd, &st) || st.st_size <= 0 ||
		    n > UINT32_MAX)
			return DLSHARE_EPROTO;
		s->map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE,
			      mfd, 0);
		if (s->map == MAP_FAILED) {
			s->map = NULL;
			return DLSHARE_ENOMEM;
		}
		s->map_len = (size_t)st.st_size;
		if (manifest_check(s->map, s->map_len, (uint32_t)n, sizes,
				   nbuffers, 0, &me)) {
			errmsg_set(me.msg);
			return DLSHARE_EPROTO;
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			ndims += 2 * wire[i]->n_shape;
			nkeys += (wire[i]->key ? strlen(wire[i]->key) : 0) + 1;
		}
		s->store = malloc(ndims * sizeof(int64_t) + nkeys);
		if (!s->store)
			return DLSHARE_ENOMEM;
		dims = s->store;
		keys = (char *)(dims + ndims);
	}
	s->ts = util_zalloc(n, sizeof(*s->ts));
	if (!s->ts)
		return DLSHARE_ENOMEM;
	s->n = n;
	for (size_t i = 0; i < n; i++) {
		Dlshare__Tensor mt, *wt = &mt;
		Dlshare__DataType mdt;
		struct btensor *bt = &s->ts[i];

		if (wire) {
			size_t klen;

			wt = wire[i];
			if (check_tensor(wt, sizes, nbuffers))
				return DLSHARE_EPROTO;
			klen = wt->key ? strlen(wt->key) : 0;
			memcpy(keys, wt->key ? wt->key : "", klen + 1);
			bt->key = keys;
			keys += klen + 1;
			if (wt->n_shape)
				memcpy(dims, wt->shape,
				       wt->n_shape * sizeof(int64_t));
			bt->t.shape = dims;
			dims += wt->n_shape;
			if (wt->n_strides) {
				memcpy(dims, wt->strides,
				       wt->n_shape * sizeof(int64_t));
				bt->t.strides = dims;
				dims += wt->n_shape;
			}
		} else {
			manifest_tensor(s->map, (uint32_t)i, &mt, &mdt);
			bt->key = wt->key;
			bt->t.shape = wt->shape;
			bt->t.strides = wt->n_strides ? wt->strides : NULL;
		}
		btensor_set(bt, wt);
	}
	return 0;
}

/* Points bt at its data in pins[] (its buf and offset), on the device of
 * its buffer. Returns its CUDA ordinal, or -1 for host memory. */
static int tensor_resolve(struct btensor *bt, struct ibuf **pins)
{
	struct ibuf *pb = pins[bt->buf];

	/* An empty buffer has no mapping, but consumers want a pointer:
	 * libtorch's at::fromDLPack never calls the deleter of a tensor
	 * whose data is NULL, which leaks its lease. */
	bt->t.data = pb->base ? (char *)pb->base + bt->offset :
		     (void *)&empty_data;
	bt->t.byte_offset = 0;
	if (pb->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC ||
	    pb->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM) {
		/* Our own ordinal for the producer's device UUID. */
		bt->t.device.device_type = kDLCUDA;
		bt->t.device.device_id = pb->ordinal;
		return pb->ordinal;
	}
	bt->t.device.device_type = pb->cuda_host ? kDLCUDAHost : kDLCPU;
	bt->t.device.device_id = 0;
	return -1;
}

/* tensor_resolve for ts[0..n). Returns a CUDA ordinal of them, or -1. */
static int tensors_resolve(struct btensor *ts, size_t n, struct ibuf **pins)
{
	int ordinal = -1;

	for (size_t i = 0; i < n; i++) {
		int o = tensor_resolve(&ts[i], pins);

		if (o >= 0)
			ordinal = o;
	}
	return ordinal;
}

static void view_free(struct view *v)
{
	if (!v)
		return;
	tset_free(&v->set);
	free(v->index);
	free(v);
}

/* Builds a view of n tensors (inline ones, wire, or those of the manifest
 * memfd mfd when wire is NULL) over the buffers pins[]. Returns 0 with *out,
 * or a DLSHARE_E* code. */
static int view_build(Dlshare__Tensor *const *wire, size_t n, int mfd,
		      struct ibuf **pins, size_t npins, struct view **out)
{
	struct view *v;
	int err;

	*out = NULL;
	if (npins > CLIENT_PINS_MAX)
		return DLSHARE_EPROTO;
	/* sizeof(*v) keeps the arrays after it 8-byte aligned. */
	v = malloc(sizeof(*v) + npins * (sizeof(*v->sizes) +
					 sizeof(*v->bases) +
					 sizeof(*v->cuda_host)));
	if (!v)
		return DLSHARE_ENOMEM;
	/* Only the view is zeroed: its arrays are written whole below. */
	util_bzero(v, sizeof(*v));
	v->sizes = (uint64_t *)(v + 1);
	v->bases = (const void **)(v->sizes + npins);
	v->cuda_host = (uint8_t *)(v->bases + npins);
	v->nbufs = npins;
	for (size_t i = 0; i < npins; i++) {
		v->bases[i] = pins[i]->base;
		v->sizes[i] = pins[i]->size;
		v->cuda_host[i] = (uint8_t)pins[i]->cuda_host;
	}
	err = tset_fill(&v->set, wire, n, mfd, v->sizes, npins);
	if (!err) {
		v->cuda_ordinal = tensors_resolve(v->set.ts, v->set.n, pins);
		err = view_index(v);
	}
	if (err) {
		view_free(v);
		return err;
	}
	*out = v;
	return 0;
}

struct mcache *mcache_new(uint64_t id, int fd)
{
	struct mcache *m = calloc(1, sizeof(*m));

	if (!m) {
		close(fd);
		return NULL;
	}
	m->id = id;
	atomic_init(&m->refs, 1);
	pthread_mutex_init(&m->mu, NULL);
	m->fd = fd;
	return m;
}

void mcache_unref(struct mcache *m)
{
	if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
		return;
	if (m->fd >= 0)
		close(m->fd);
	view_free(m->built);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

/* The view of a kept manifest (1.5), built by the first get that needs it:
 * mapped, checked against the buffers and indexed once for the life of the
 * version. Returns 0 with *out, or the code its build failed with (every
 * later get of it fails the same way, saying why). */
static int mcache_view(struct mcache *m, size_t n, struct ibuf **pins,
		       size_t npins, struct view **out)
{
	int state;

	pthread_mutex_lock(&m->mu);
	if (m->state == 0) {
		struct view *v = NULL;
		int err = view_build(NULL, n, m->fd, pins, npins, &v);
		const char *why = dlshare_last_error();

		/* The mapping keeps the pages; the fd is not needed. */
		close(m->fd);
		m->fd = -1;
		if (err) {
			snprintf(m->why, sizeof(m->why), "%s",
				 why && *why ? why : "the daemon's manifest "
				 "could not be read");
			m->state = err;
		} else {
			m->built = v;
			m->state = 1;
		}
	}
	state = m->state;
	pthread_mutex_unlock(&m->mu);
	if (state != 1) {
		errmsg_set(m->why);
		return state;
	}
	*out = m->built;
	return 0;
}

/* Fills b's tensors from the reply: its cached manifest mc (1.5), or its
 * manifest's fd mfd (-1 for none), or its inline tensors; pins[] are the
 * reply's buffers in order. */
static int bundle_fill(struct dlshare_bundle *b, Dlshare__GetReply *r,
		       int mfd, struct mcache *mc, struct ibuf **pins,
		       size_t npins)
{
	struct view *v;
	int err, moved = 0;

	if (r->n_buffers != npins || npins > CLIENT_PINS_MAX ||
	    (r->manifest && (r->n_tensors || !r->has_manifest_tensors)) ||
	    (mc && !r->manifest))
		return DLSHARE_EPROTO;
	if (!mc) {
		err = r->manifest ?
		      view_build(NULL, r->manifest_tensors, mfd, pins, npins,
				 &b->own_view) :
		      view_build(r->tensors, r->n_tensors, -1, pins, npins,
				 &b->own_view);
		if (err)
			return err;
		v = b->own_view;
	} else {
		if ((err = mcache_view(mc, r->manifest_tensors, pins, npins,
				       &v)))
			return err;
		/* The daemon's word is not enough to index memory with: the
		 * view was checked against buffers of these sizes. */
		if (v->set.n != r->manifest_tensors || v->nbufs != npins)
			return DLSHARE_EPROTO;
		for (size_t i = 0; i < npins; i++) {
			if (pins[i]->size != v->sizes[i])
				return DLSHARE_EPROTO;
			moved |= pins[i]->base != v->bases[i] ||
				 pins[i]->cuda_host != v->cuda_host[i];
		}
		/* A device mapping closed with its last tensor may come back
		 * elsewhere: then this bundle has its own copy. */
		if (moved) {
			b->own = malloc(v->set.n * sizeof(*b->own));
			if (!b->own)
				return DLSHARE_ENOMEM;
			memcpy(b->own, v->set.ts, v->set.n * sizeof(*b->own));
			tensors_resolve(b->own, v->set.n, pins);
		}
	}
	b->view = v;
	b->n = v->set.n;
	b->ts = b->own ? b->own : v->set.ts;
	b->cuda_ordinal = v->cuda_ordinal;
	return 0;
}

static int get_opts_wire(const dlshare_get_opts *o, Dlshare__Get *g)
{
	switch (o->select) {
	case DLSHARE_LATEST:
		g->select = DLSHARE__SELECT__SELECT_LATEST;
		break;
	case DLSHARE_EXACT:
		g->select = DLSHARE__SELECT__SELECT_EXACT;
		break;
	case DLSHARE_NEWER_THAN:
		g->select = DLSHARE__SELECT__SELECT_NEWER_THAN;
		break;
	default:
		return DLSHARE_EINVAL;
	}
	g->has_select = 1;
	g->has_version = 1;
	g->version = o->version;
	if (o->timeout_ms < 0 && o->timeout_ms != DLSHARE_WAIT_FOREVER)
		return DLSHARE_EINVAL;
	g->has_timeout_ms = o->timeout_ms != 0;
	g->timeout_ms = o->timeout_ms < 0 ? UINT32_MAX : (uint32_t)o->timeout_ms;
	return 0;
}

static int get_call(dlshare_client *c, Dlshare__Frame *f,
		    const dlshare_get_opts *opts, dlshare_bundle **out);
static int get_fetch(dlshare_client *c, const char *name,
		     const dlshare_get_opts *opts, Dlshare__Frame *f,
		     struct reply *r, Dlshare__GetReply **gr,
		     struct warm **seed);
static int get_bundle(dlshare_client *c, const Dlshare__Frame *f,
		      struct reply *r, Dlshare__GetReply *gr, void *stream,
		      struct warm *seed, dlshare_bundle **out);

/* Checks a get's arguments and fills its request f (whose body is g).
 * Returns 0 or DLSHARE_EINVAL. */
static int get_request(dlshare_client *c, const char *name,
		       const dlshare_get_opts *opts, Dlshare__Frame *f,
		       Dlshare__Get *g)
{
	static const dlshare_get_opts dflt = { .select = DLSHARE_LATEST };
	int err;

	errmsg_set(NULL);
	if (!c || client_bad_name(name))
		return DLSHARE_EINVAL;
	g->name = (char *)name;
	if ((err = get_opts_wire(opts ? opts : &dflt, g)))
		return err;
	/* 1.5: manifests are kept by id (a daemon before it ignores this). */
	g->has_manifest_cache = 1;
	g->manifest_cache = 1;
	f->body_case = DLSHARE__FRAME__BODY_GET;
	f->get = g;
	return 0;
}

int dlshare_get(dlshare_client *c, const char *name,
		const dlshare_get_opts *opts, dlshare_bundle **out)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	Dlshare__GetReply *gr;
	struct warm *seed;
	struct reply r;
	int err;

	if (!out) {
		errmsg_set(NULL);
		return DLSHARE_EINVAL;
	}
	*out = NULL;
	if ((err = get_request(c, name, opts, &f, &g)) ||
	    (err = get_fetch(c, name, opts, &f, &r, &gr, &seed)))
		return err;
	return get_bundle(c, &f, &r, gr, opts ? opts->stream : NULL, seed,
			  out);
}

int dlshare_take(dlshare_client *c, const char *name, int32_t timeout_ms,
		 void *stream, dlshare_bundle **out)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Take t = DLSHARE__TAKE__INIT;
	dlshare_get_opts o = { .timeout_ms = timeout_ms, .stream = stream };
	int err;

	errmsg_set(NULL);

	if (!c || !out || client_bad_name(name))
		return DLSHARE_EINVAL;
	*out = NULL;
	if (timeout_ms < 0 && timeout_ms != DLSHARE_WAIT_FOREVER)
		return DLSHARE_EINVAL;
	if ((err = client_need_queues(c)))
		return err;
	t.name = (char *)name;
	t.has_timeout_ms = timeout_ms != 0;
	t.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	f.body_case = DLSHARE__FRAME__BODY_TAKE;
	f.take = &t;
	return get_call(c, &f, &o, out);
}

/* A take this process cannot use (its event cannot be opened, its reply
 * makes no bundle) is no consumption: a 1.6 daemon puts the version back at
 * the head of its queue (Untake) before the take returns its error, which
 * stays the one dlshare_last_error() says. Elsewhere (an older daemon, a
 * get) the lease is released. */
static void lease_give_back(dlshare_client *c, const Dlshare__Frame *req,
			    uint64_t lease)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Untake u = DLSHARE__UNTAKE__INIT;
	char why[512];
	struct reply r;
	int err;

	if (req->body_case != DLSHARE__FRAME__BODY_TAKE || !c->untakes) {
		client_release(c, lease);
		return;
	}
	snprintf(why, sizeof(why), "%s", dlshare_last_error());
	u.n_leases = 1;
	u.leases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_UNTAKE;
	f.untake = &u;
	err = client_call(c, &f, NULL, 0, NULL, &r);
	if (!err)
		reply_free(c, &r);
	else if (err != DLSHARE_ECONN && err != DLSHARE_ECLOSED)
		client_release(c, lease);
	errmsg_set(why);
}

/* Makes the waits a GetReply asks for on the consumer's stream, for
 * tensors on CUDA device ordinal (none for host tensors: the host does not
 * wait). A version spanning devices (1.4) has an event per device: each is
 * waited for on its device (or on the one explicit stream), and the chains
 * form one group. Returns 0 with what the waits made added to *chain. */
static int get_wait_events(const Dlshare__GetReply *gr, int ordinal,
			   void *stream, void **chain)
{
	int err;

	for (size_t i = 0; ordinal >= 0 && i < gr->n_device_events; i++) {
		const Dlshare__DeviceEvent *de = gr->device_events[i];
		void *ch = NULL;
		int ord;

		if (de->uuid.len != CUDA_UUID_BYTES ||
		    de->handle.len != CUDA_IPC_HANDLE_BYTES)
			return DLSHARE_EPROTO;
		if ((ord = cuda_ordinal(de->uuid.data)) < 0)
			return ord;
		if ((err = cuda_wait_event(de->handle.data, ord, stream, &ch)))
			return err;
		*chain = cuda_chain_add(*chain, ch);
	}
	if (ordinal >= 0 && gr->has_event_handle) {
		if (gr->event_handle.len != CUDA_IPC_HANDLE_BYTES)
			return DLSHARE_EPROTO;
		/* Also for DLSHARE_STREAM_NONE (on a stream of the
		 * library's): the chain is what a later dlshare_bundle_wait
		 * waits for, once the producer may be gone. */
		return cuda_wait_event(gr->event_handle.data, ordinal, stream,
				       chain);
	}
	return 0;
}

/* The lease of gr and the pins of r change hands to lr (room for
 * r->npins pins), whose tensors are on CUDA device ordinal (or -1). */
static void lease_ref_take(struct lease_ref *lr, dlshare_client *c,
			   const Dlshare__GetReply *gr, struct reply *r,
			   void *stream, int ordinal)
{
	atomic_init(&lr->refs, 1);
	lr->c = c;
	lr->lease = gr->lease;
	lr->stream = stream;
	lr->thread = pthread_self();
	lr->ordinal = ordinal;
	lr->event = NULL;
	lr->seed = NULL;
	lr->next = NULL;
	lr->npins = r->npins;
	memcpy(lr->pins, r->pins, r->npins * sizeof(r->pins[0]));
	/* kDLCUDAHost pages may be read by the consumer's kernels: their
	 * release is ordered after its stream too, on the stream's device. */
	for (size_t i = 0; i < lr->npins && lr->ordinal < 0; i++)
		if (lr->pins[i]->cuda_host)
			lr->ordinal = cuda_stream_ordinal(lr->stream);
	r->npins = 0;
	client_ref(c);
}

/* Sends f (a Get or a Take) and waits for its GetReply. Returns 0 with
 * *r (reply_free it) and *gr, or a DLSHARE_E* code. */
static int call_expect(dlshare_client *c, Dlshare__Frame *f,
		       Dlshare__Frame__BodyCase want, struct reply *r);

/* A get's or take's reply that came but cannot be used (its fds did not
 * come, its buffers could not be mapped; client_call kept it for this):
 * the lease goes back, a take's to the head of its queue. Returns err. */
static __attribute__((cold, noinline)) int
get_lost(dlshare_client *c, const Dlshare__Frame *f, struct reply *r, int err)
{
	if (r->msg->frame->body_case == DLSHARE__FRAME__BODY_GET_REPLY)
		lease_give_back(c, f, r->msg->frame->get_reply->lease);
	reply_free(c, r);
	return err;
}

static int get_send(dlshare_client *c, Dlshare__Frame *f, struct reply *r,
		    Dlshare__GetReply **gr)
{
	int err = call_expect(c, f, DLSHARE__FRAME__BODY_GET_REPLY, r);

	if (!err)
		*gr = r->msg->frame->get_reply;
	else if (r->msg)
		return get_lost(c, f, r, err);
	return err;
}

/* Makes a bundle of the GetReply gr (in r) that answered f. r is freed
 * either way; on an error the lease goes back. */
static int get_bundle(dlshare_client *c, const Dlshare__Frame *f,
		      struct reply *r, Dlshare__GetReply *gr, void *stream,
		      struct warm *seed, dlshare_bundle **out)
{
	struct dlshare_bundle *b;
	struct lease_ref *lr;
	int err;

	b = util_zalloc(1, sizeof(*b));
	lr = malloc(sizeof(*lr) + r->npins * sizeof(lr->pins[0]));
	if (!b || !lr) {
		err = DLSHARE_ENOMEM;
		goto fail;
	}
	b->cuda_ordinal = -1;
	b->mc = r->mc; /* the reply's reference becomes the bundle's */
	r->mc = NULL;
	if ((err = bundle_fill(b, gr, r->nfds ? r->fds[0] : -1, b->mc,
			       r->pins, r->npins)))
		goto fail;
	if ((err = get_wait_events(gr, b->cuda_ordinal, stream, &b->chain)))
		goto fail;
	lease_ref_take(lr, c, gr, r, stream, b->cuda_ordinal);
	lr->seed = seed;
	b->lr = lr;
	b->version = gr->version;
	reply_free(c, r);
	*out = b;
	return 0;

fail:
	client_warm_free(seed);
	/* The daemon gave us a lease: give it back. */
	lease_give_back(c, f, gr->lease);
	if (b) {
		view_free(b->own_view);
		free(b->own);
		mcache_unref(b->mc);
		cuda_event_drop(b->chain);
	}
	free(b);
	free(lr);
	reply_free(c, r);
	return err;
}

/* Sends f (a Get or a Take) and makes a bundle of its GetReply. */
static int get_call(dlshare_client *c, Dlshare__Frame *f,
		    const dlshare_get_opts *opts, dlshare_bundle **out)
{
	Dlshare__GetReply *gr;
	struct reply r;
	int err;

	if ((err = get_send(c, f, &r, &gr)))
		return err;
	return get_bundle(c, f, &r, gr,
			  opts ? opts->stream : NULL, NULL, out);
}

/* Whether a get asks for the newest version. */
static int get_latest(const dlshare_get_opts *opts)
{
	return !opts || opts->select == DLSHARE_LATEST;
}

/* Answers the Get f of name: from the lease this connection keeps for it
 * when the board says that still holds (1.7), else from the daemon.
 * Returns 0 with *r (reply_free it), *gr and *seed (what the lease keeps
 * at its release, or NULL), or a DLSHARE_E* code. */
static int get_fetch(dlshare_client *c, const char *name,
		     const dlshare_get_opts *opts, Dlshare__Frame *f,
		     struct reply *r, Dlshare__GetReply **gr,
		     struct warm **seed)
{
	struct warm_name wn;
	uint64_t pushed;
	int err;

	*seed = NULL;
	if (!c->board || !get_latest(opts)) /* never one for a Take */
		return get_send(c, f, r, gr);
	client_warm_name(&wn, name);
	if (!client_forked(c) && !client_warm_take(c, &wn, r, seed)) {
		*gr = r->msg->frame->get_reply;
		return 0;
	}
	pushed = client_rel_pushed(c);
	err = get_send(c, f, r, gr);
	/* Leases kept for reuse count toward the quotas (leases, leased
	 * bytes) as any: refused at one, the get asks again with them
	 * released, riding on it, as before 1.7 they would have. So it does
	 * when the receiver thread queued releases after this get went (a
	 * kept lease it found stale meanwhile): those went after the get,
	 * and may be what made room. (The reading comes after let_go's
	 * lock, which orders it after any such queueing.) */
	if (err == DLSHARE_ELIMIT &&
	    (client_warm_let_go(c) || client_rel_pushed(c) != pushed))
		err = get_send(c, f, r, gr);
	if (err)
		return err;
	*seed = client_warm_seed(c, &wn, r);
	return 0;
}

uint64_t dlshare_bundle_version(const dlshare_bundle *b)
{
	return b ? b->version : 0;
}

size_t dlshare_bundle_count(const dlshare_bundle *b)
{
	return b ? b->n : 0;
}

const char *dlshare_bundle_key(const dlshare_bundle *b, size_t i)
{
	return b && i < b->n ? b->ts[i].key : NULL;
}

/* The answer to a key that is not there: NotFound, naming it. */
static int key_not_found(const dlshare_bundle *b, const char *key)
{
	char msg[CHECK_KEY_MAX + 96];

	snprintf(msg, sizeof(msg), "no tensor with key \"%.*s\" in this "
		 "version (%zu tensors)", (int)CHECK_KEY_MAX, key, b->n);
	errmsg_set(msg);
	return DLSHARE_ENOENT;
}

int dlshare_bundle_find(const dlshare_bundle *b, const char *key)
{
	if (!b || !key)
		return DLSHARE_EINVAL;
	if (b->view->index) {
		const uint32_t *index = b->view->index;
		size_t mask = b->view->index_mask, j = key_hash(key) & mask;

		for (; index[j]; j = (j + 1) & mask)
			if (strcmp(b->ts[index[j] - 1].key, key) == 0)
				return (int)(index[j] - 1);
		return key_not_found(b, key);
	}
	for (size_t i = 0; i < b->n; i++)
		if (strcmp(b->ts[i].key, key) == 0)
			return (int)i;
	return key_not_found(b, key);
}

const DLTensor *dlshare_bundle_tensor(const dlshare_bundle *b, size_t i)
{
	return b && i < b->n ? &b->ts[i].t : NULL;
}

int dlshare_bundle_wait(dlshare_bundle *b, void *stream)
{
	CALL_UNCANCELLED;
	int err;

	if (!b)
		return DLSHARE_EINVAL;
	if (client_forked(b->lr->c))
		return fork_refuse();
	if (b->cuda_ordinal < 0 || stream == DLSHARE_STREAM_NONE)
		return 0;
	/* Never the producer's event again: ours, recorded after the wait
	 * for it at get. */
	if (b->chain && (err = cuda_wait_chain(b->chain, b->cuda_ordinal,
					       stream)))
		return err;
	/* Release after this stream's work: the last stream named wins. A
	 * consumer reading on two streams joins them itself. */
	b->lr->stream = stream;
	b->lr->thread = pthread_self();
	return 0;
}

/* forked: client_forked(b->lr->c), which the caller may know already. */
static void bundle_free(dlshare_bundle *b, int forked)
{
	/* A child inherited it: no CUDA here (the chain stays, as does the
	 * mapping, until the child exits). */
	if (!forked)
		cuda_event_drop(b->chain);
	view_free(b->own_view);
	free(b->own);
	/* After the view: a kept manifest may be freed here (BufferGone
	 * came), its mapping with it; the lease goes last. */
	mcache_unref(b->mc);
	lease_ref_unref(b->lr);
	free(b);
}

void dlshare_bundle_free(dlshare_bundle *b)
{
	CALL_UNCANCELLED;

	if (b)
		bundle_free(b, client_forked(b->lr->c));
}

static void managed_delete(DLManagedTensor *self)
{
	CALL_UNCANCELLED;
	struct managed *m = self->manager_ctx;

	lease_ref_unref(m->lr);
	free(m);
}

static void managed_delete_versioned(DLManagedTensorVersioned *self)
{
	CALL_UNCANCELLED;
	struct managed *m = self->manager_ctx;

	lease_ref_unref(m->lr);
	free(m);
}

static struct managed *managed_new(dlshare_bundle *b, size_t i, DLTensor *t)
{
	struct managed *m;

	if (!b || i >= b->n)
		return NULL;
	m = util_zalloc(1, sizeof(*m));
	if (!m)
		return NULL;
	*t = b->ts[i].t;
	if (t->ndim)
		memcpy(m->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
	if (t->strides && t->ndim)
		memcpy(m->strides, t->strides,
		       (size_t)t->ndim * sizeof(int64_t));
	t->shape = m->shape;
	t->strides = b->ts[i].t.strides ? m->strides : NULL;
	m->lr = b->lr;
	atomic_fetch_add(&b->lr->refs, 1);
	return m;
}

static int bundle_export(dlshare_bundle *b, size_t i, DLManagedTensor **out);

int dlshare_bundle_export(dlshare_bundle *b, size_t i, DLManagedTensor **out)
{
	CALL_UNCANCELLED;

	if (!out || !b || i >= b->n)
		return DLSHARE_EINVAL;
	/* A new holder of a lease that is not this process's. */
	if (client_forked(b->lr->c))
		return fork_refuse();
	return bundle_export(b, i, out);
}

/* dlshare_bundle_export of a bundle this process got (no fork check). */
static int bundle_export(dlshare_bundle *b, size_t i, DLManagedTensor **out)
{
	struct managed *m;
	DLTensor t;

	if (!(m = managed_new(b, i, &t)))
		return DLSHARE_ENOMEM;
	m->m.plain.dl_tensor = t;
	m->m.plain.manager_ctx = m;
	m->m.plain.deleter = managed_delete;
	*out = &m->m.plain;
	return 0;
}

static int bundle_export_versioned(dlshare_bundle *b, size_t i,
				   DLManagedTensorVersioned **out);

int dlshare_bundle_export_versioned(dlshare_bundle *b, size_t i,
				    DLManagedTensorVersioned **out)
{
	CALL_UNCANCELLED;

	if (!out || !b || i >= b->n)
		return DLSHARE_EINVAL;
	if (client_forked(b->lr->c))
		return fork_refuse();
	return bundle_export_versioned(b, i, out);
}

/* dlshare_bundle_export_versioned of a bundle this process got. */
static int bundle_export_versioned(dlshare_bundle *b, size_t i,
				   DLManagedTensorVersioned **out)
{
	struct managed *m;
	DLTensor t;

	if (!(m = managed_new(b, i, &t)))
		return DLSHARE_ENOMEM;
	m->m.versioned.version.major = DLPACK_MAJOR_VERSION;
	m->m.versioned.version.minor = DLPACK_MINOR_VERSION;
	m->m.versioned.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
	m->m.versioned.dl_tensor = t;
	m->m.versioned.manager_ctx = m;
	m->m.versioned.deleter = managed_delete_versioned;
	*out = &m->m.versioned;
	return 0;
}

/* Deleters of a managed tensor that shares its block with its lease
 * (get_one): the lease's last reference frees both. */
static void managed_one_delete(DLManagedTensor *self)
{
	CALL_UNCANCELLED;
	struct managed *m = self->manager_ctx;

	lease_ref_unref(m->lr);
}

static void managed_one_delete_versioned(DLManagedTensorVersioned *self)
{
	CALL_UNCANCELLED;
	struct managed *m = self->manager_ctx;

	lease_ref_unref(m->lr);
}

/* Whether get_one can answer a reply: one tensor, inline, over as many
 * buffers as the reply pinned. Anything else goes through a bundle. */
static int get_one_fits(const Dlshare__GetReply *gr, const struct reply *r)
{
	return gr->n_tensors == 1 && !gr->manifest && !r->mc &&
	       gr->n_buffers == r->npins && r->npins <= CLIENT_PINS_MAX;
}

/* dlshare_get_tensor(_versioned)'s answer to a reply of one tensor (see
 * get_one_fits): the managed tensor and its lease in one block, the lease
 * first (lease_ref_unref frees it, and so the block, once released), not
 * a bundle, a view and their tensor set made and freed around it. r is
 * freed either way; on an error the lease goes back. */
static int get_one(dlshare_client *c, const Dlshare__Frame *f,
		   struct reply *r, Dlshare__GetReply *gr, void *stream,
		   struct warm *seed, int versioned, void **out)
{
	const Dlshare__Tensor *wt = gr->tensors[0];
	uint64_t sizes[CLIENT_PINS_MAX];
	size_t off = sizeof(struct lease_ref) +
		     r->npins * sizeof(struct ibuf *);
	struct lease_ref *lr;
	struct managed *m;
	struct btensor bt;
	void *chain = NULL;
	int ordinal, err = DLSHARE_EPROTO;

	off = (off + _Alignof(max_align_t) - 1) &
	      ~(_Alignof(max_align_t) - 1);
	for (size_t i = 0; i < r->npins; i++)
		sizes[i] = r->pins[i]->size;
	/* The daemon checked it against its buffers; so do we, since a
	 * wrong answer would make the consumer read out of bounds. */
	if (check_tensor(wt, sizes, r->npins))
		goto fail;
	if (!(lr = malloc(off + sizeof(*m)))) {
		err = DLSHARE_ENOMEM;
		goto fail;
	}
	m = (struct managed *)((char *)lr + off);
	btensor_set(&bt, wt);
	ordinal = tensor_resolve(&bt, r->pins);
	if ((err = get_wait_events(gr, ordinal, stream, &chain))) {
		cuda_event_drop(chain);
		free(lr);
		goto fail;
	}
	/* The wait is queued on the consumer's stream: the chain is only
	 * a bundle's, for later waits. */
	cuda_event_drop(chain);
	if (wt->n_shape)
		memcpy(m->shape, wt->shape, wt->n_shape * sizeof(int64_t));
	if (wt->n_strides)
		memcpy(m->strides, wt->strides,
		       wt->n_strides * sizeof(int64_t));
	bt.t.shape = m->shape;
	bt.t.strides = wt->n_strides ? m->strides : NULL;
	lease_ref_take(lr, c, gr, r, stream, ordinal);
	lr->seed = seed;
	m->lr = lr;
	if (versioned) {
		DLManagedTensorVersioned *v = &m->m.versioned;

		v->version.major = DLPACK_MAJOR_VERSION;
		v->version.minor = DLPACK_MINOR_VERSION;
		v->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
		v->dl_tensor = bt.t;
		v->manager_ctx = m;
		v->deleter = managed_one_delete_versioned;
		*out = v;
	} else {
		m->m.plain.dl_tensor = bt.t;
		m->m.plain.manager_ctx = m;
		m->m.plain.deleter = managed_one_delete;
		*out = &m->m.plain;
	}
	reply_free(c, r);
	return 0;

fail:
	client_warm_free(seed);
	lease_give_back(c, f, gr->lease);
	reply_free(c, r);
	return err;
}

/* dlshare_get_tensor(_versioned): the first tensor of the version. */
static int get_tensor(dlshare_client *c, const char *name,
		      const dlshare_get_opts *opts, int versioned, void **out)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	void *stream = opts ? opts->stream : NULL;
	Dlshare__GetReply *gr;
	dlshare_bundle *b;
	struct warm *seed;
	struct reply r;
	int err;

	if (!out) {
		errmsg_set(NULL);
		return DLSHARE_EINVAL;
	}
	if ((err = get_request(c, name, opts, &f, &g)) ||
	    (err = get_fetch(c, name, opts, &f, &r, &gr, &seed)))
		return err;
	if (get_one_fits(gr, &r))
		return get_one(c, &f, &r, gr, stream, seed, versioned, out);
	if ((err = get_bundle(c, &f, &r, gr, stream, seed, &b)))
		return err;
	/* b is this process's, just got: no second and third getpid (the
	 * fork check) per get. */
	err = !b->n ? DLSHARE_EINVAL :
	      versioned ? bundle_export_versioned(b, 0,
						  (DLManagedTensorVersioned **)out) :
	      bundle_export(b, 0, (DLManagedTensor **)out);
	bundle_free(b, 0);
	return err;
}

int dlshare_get_tensor(dlshare_client *c, const char *name,
		       const dlshare_get_opts *opts, DLManagedTensor **out)
{
	CALL_UNCANCELLED;

	return get_tensor(c, name, opts, 0, (void **)out);
}

int dlshare_get_tensor_versioned(dlshare_client *c, const char *name,
				 const dlshare_get_opts *opts,
				 DLManagedTensorVersioned **out)
{
	CALL_UNCANCELLED;

	return get_tensor(c, name, opts, 1, (void **)out);
}

/* ---- stat, list, stats, delete ------------------------------------------ */

struct dlshare_manifest {
	size_t n;                /* set.n */
	struct btensor *ts;      /* set.ts */
	struct tset set;
};

static void name_info_copy(dlshare_name_info *d, const Dlshare__NameInfo *s)
{
	memset(d, 0, sizeof(*d));
	strncpy(d->name, s->name, sizeof(d->name) - 1);
	d->latest = s->latest;
	d->versions = s->versions;
	d->tensors = s->tensors;
	d->bytes = s->bytes;
	d->leases = s->leases;
	d->owner_uid = s->owner_uid;
	d->mode = s->mode;
	d->kind = s->has_kind ? (int)s->kind : 0;
	d->exported = s->has_exported && s->exported;
	d->owned = s->has_owned && s->owned;
	d->owner_pid = s->has_owner_pid ? s->owner_pid : 0;
	d->ttl_ms = s->has_ttl_ms ? s->ttl_ms : 0;
	d->expires_in_ms = s->has_expires_in_ms ? s->expires_in_ms : 0;
	/* A node over the limit (a daemon that broke the rule) is cut, never
	 * overrun. */
	if (s->origin_node)
		strncpy(d->origin_node, s->origin_node,
			sizeof(d->origin_node) - 1);
	d->origin_version = s->has_origin_version ? s->origin_version : 0;
}

/* Sends a request and checks that the reply has the expected body. */
static int call_expect(dlshare_client *c, Dlshare__Frame *f,
		       Dlshare__Frame__BodyCase want, struct reply *r)
{
	int err = client_call(c, f, NULL, 0, NULL, r);

	if (err)
		return err;
	if (r->msg->frame->body_case != want) {
		reply_free(c, r);
		return DLSHARE_EPROTO;
	}
	return 0;
}

/* Fills m from a StatReply (and its manifest's fd mfd, or -1). Stat
 * names no buffers: tensors are checked for their own sake only, and get
 * no data pointer (byte_offset is their offset). */
static int manifest_fill(dlshare_manifest *m, Dlshare__StatReply *sr, int mfd)
{
	uint64_t sizes[256];
	int err;

	for (size_t i = 0; i < 256; i++)
		sizes[i] = INT64_MAX;
	if (!sr->manifest && sr->n_tensors == 0)
		return 0;
	if (sr->manifest && (sr->n_tensors || !sr->has_manifest_tensors))
		return DLSHARE_EPROTO;
	err = sr->manifest ?
	      tset_fill(&m->set, NULL, sr->manifest_tensors, mfd, sizes, 256) :
	      tset_fill(&m->set, sr->tensors, sr->n_tensors, -1, sizes, 256);
	m->ts = m->set.ts;
	m->n = m->set.n;
	for (size_t i = 0; !err && i < m->n; i++) {
		m->ts[i].t.data = NULL;
		m->ts[i].t.device.device_type = kDLCPU;
		m->ts[i].t.device.device_id = 0;
	}
	return err;
}

int dlshare_stat(dlshare_client *c, const char *name, dlshare_name_info *info,
		 dlshare_manifest **manifest)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stat s = DLSHARE__STAT__INIT;
	dlshare_manifest *m = NULL;
	struct reply r;
	int err;

	errmsg_set(NULL);

	if (manifest)
		*manifest = NULL;
	if (!c || !info || client_bad_name(name))
		return DLSHARE_EINVAL;
	s.name = (char *)name;
	f.body_case = DLSHARE__FRAME__BODY_STAT;
	f.stat = &s;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_STAT_REPLY, &r)))
		return err;
	name_info_copy(info, r.msg->frame->stat_reply->info);
	if (manifest) {
		m = calloc(1, sizeof(*m));
		err = m ? manifest_fill(m, r.msg->frame->stat_reply,
					r.nfds ? r.fds[0] : -1) :
			  DLSHARE_ENOMEM;
		if (err) {
			dlshare_manifest_free(m);
			m = NULL;
		}
		*manifest = m;
	}
	reply_free(c, &r);
	return err;
}

size_t dlshare_manifest_count(const dlshare_manifest *m)
{
	return m ? m->n : 0;
}

const char *dlshare_manifest_key(const dlshare_manifest *m, size_t i)
{
	return m && i < m->n ? m->ts[i].key : NULL;
}

const DLTensor *dlshare_manifest_tensor(const dlshare_manifest *m, size_t i)
{
	return m && i < m->n ? &m->ts[i].t : NULL;
}

void dlshare_manifest_free(dlshare_manifest *m)
{
	CALL_UNCANCELLED;

	if (!m)
		return;
	tset_free(&m->set);
	free(m);
}

static void queue_info_copy(dlshare_queue_info *d, const Dlshare__NameInfo *s)
{
	memset(d, 0, sizeof(*d));
	d->depth = s->has_queue_depth ? s->queue_depth : 0;
	d->queued = s->queued;
	d->taken = s->taken;
	d->pending = s->queue_pending;
	d->waiting = s->queue_waiting;
}

int dlshare_queue_stat(dlshare_client *c, const char *name,
		       dlshare_queue_info *out)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stat s = DLSHARE__STAT__INIT;
	struct reply r;
	int err;

	errmsg_set(NULL);

	if (!c || !out || client_bad_name(name))
		return DLSHARE_EINVAL;
	s.name = (char *)name;
	f.body_case = DLSHARE__FRAME__BODY_STAT;
	f.stat = &s;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_STAT_REPLY, &r)))
		return err;
	queue_info_copy(out, r.msg->frame->stat_reply->info);
	reply_free(c, &r);
	return 0;
}

struct list_plain {
	dlshare_list_fn fn;
	void *arg;
};

static int list_plain_fn(const dlshare_name_info *info,
			 const dlshare_queue_info *queue, void *arg)
{
	struct list_plain *lp = arg;

	(void)queue;
	return lp->fn(info, lp->arg);
}

int dlshare_list(dlshare_client *c, const char *prefix, dlshare_list_fn fn,
		 void *arg)
{
	CALL_UNCANCELLED;
	struct list_plain lp = { fn, arg };

	if (!fn) {
		errmsg_set(NULL);
		return DLSHARE_EINVAL;
	}
	return dlshare_list_ex(c, prefix, list_plain_fn, &lp);
}

int dlshare_list_ex(dlshare_client *c, const char *prefix,
		    dlshare_list_ex_fn fn, void *arg)
{
	CALL_UNCANCELLED;
	char after[CHECK_NAME_MAX + 1] = "";
	int more = 1, err = 0;

	errmsg_set(NULL);

	if (!c || !fn || check_prefix(prefix))
		return DLSHARE_EINVAL;
	while (more && !err) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__List l = DLSHARE__LIST__INIT;
		Dlshare__ListReply *lr;
		struct reply r;

		l.prefix = (char *)(prefix ? prefix : "");
		l.after = after;
		f.body_case = DLSHARE__FRAME__BODY_LIST;
		f.list = &l;
		if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_LIST_REPLY, &r)))
			return err;
		lr = r.msg->frame->list_reply;
		more = lr->has_more && lr->more && lr->n_names > 0;
		for (size_t i = 0; i < lr->n_names; i++) {
			dlshare_name_info info;
			dlshare_queue_info q;
			int isq = lr->names[i]->has_queue_depth &&
				  lr->names[i]->queue_depth;

			name_info_copy(&info, lr->names[i]);
			queue_info_copy(&q, lr->names[i]);
			if (fn(&info, isq ? &q : NULL, arg)) {
				more = 0;
				break;
			}
		}
		if (lr->n_names)
			strncpy(after, lr->names[lr->n_names - 1]->name,
				sizeof(after) - 1);
		reply_free(c, &r);
	}
	return err;
}

int dlshare_watch(dlshare_client *c, const char *prefix, uint64_t after,
		  int32_t timeout_ms, dlshare_watch_change *changes,
		  size_t max, size_t *n, uint64_t *seq, unsigned *flags)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Watch w = DLSHARE__WATCH__INIT;
	Dlshare__WatchReply *wr;
	struct reply r;
	int err;

	errmsg_set(NULL);

	if (!c || !changes || !max || !n || !seq || check_prefix(prefix) ||
	    (timeout_ms < 0 && timeout_ms != DLSHARE_WAIT_FOREVER))
		return DLSHARE_EINVAL;
	*n = 0;
	if (flags)
		*flags = 0;
	if (!c->watches) {
		errmsg_set("watch: the daemon speaks protocol 1.5 or older; "
			   "Watch needs 1.6");
		return DLSHARE_ENOTSUP;
	}
	w.prefix = (char *)(prefix ? prefix : "");
	w.after = after;
	w.has_timeout_ms = timeout_ms != 0;
	w.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	w.has_max_names = 1;
	w.max_names = max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
	f.body_case = DLSHARE__FRAME__BODY_WATCH;
	f.watch = &w;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_WATCH_REPLY, &r)))
		return err;
	wr = r.msg->frame->watch_reply;
	if (wr->n_changes > max) {
		reply_free(c, &r);
		return DLSHARE_EPROTO;
	}
	for (size_t i = 0; i < wr->n_changes; i++) {
		const Dlshare__WatchChange *ch = wr->changes[i];

		memset(&changes[i], 0, sizeof(changes[i]));
		strncpy(changes[i].name, ch->name, sizeof(changes[i].name) - 1);
		changes[i].version = ch->version;
		changes[i].deleted = ch->has_deleted && ch->deleted;
	}
	*n = wr->n_changes;
	*seq = wr->seq;
	if (flags)
		*flags = (wr->has_more && wr->more ? DLSHARE_WATCH_MORE : 0) |
			 (wr->has_lost && wr->lost ? DLSHARE_WATCH_LOST : 0);
	reply_free(c, &r);
	return 0;
}

int dlshare_stats_get(dlshare_client *c, dlshare_stats *out)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	Dlshare__StatsReply *sr;
	struct reply r;
	int err;

	errmsg_set(NULL);

	if (!c || !out)
		return DLSHARE_EINVAL;
	memset(out, 0, sizeof(*out));
	s.has_max_uids = 1;
	s.max_uids = DLSHARE_STATS_UIDS;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_STATS_REPLY, &r)))
		return err;
	sr = r.msg->frame->stats_reply;
	out->connections = sr->connections;
	out->names = sr->names;
	out->versions = sr->versions;
	out->leases = sr->leases;
	out->buffers = sr->buffers;
	out->bytes = sr->bytes;
	out->parked = sr->parked;
	out->requests = sr->requests;
	out->uptime_ms = sr->uptime_ms;
	out->expired = sr->has_expired ? sr->expired : 0;
	out->orphaned = sr->has_orphaned ? sr->orphaned : 0;
	out->nuids = sr->has_nuids ? sr->nuids : 0;
	for (size_t i = 0; i < sr->n_uids && i < DLSHARE_STATS_UIDS; i++) {
		const Dlshare__UidStats *u = sr->uids[i];

		out->uids[i].uid = u->uid;
		out->uids[i].connections = u->has_connections ?
					   u->connections : 0;
		out->uids[i].names = u->names;
		out->uids[i].versions = u->versions;
		out->uids[i].bytes = u->bytes;
		out->uids[i].leases = u->leases;
		out->nuid_rows = (uint32_t)i + 1;
	}
	reply_free(c, &r);
	return 0;
}

int dlshare_metrics(dlshare_client *c, char **text, size_t *len)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats s = DLSHARE__STATS__INIT;
	struct reply r;
	size_t n;
	int err;

	errmsg_set(NULL);

	if (!text)
		return DLSHARE_EINVAL;
	*text = NULL;
	if (!c)
		return metrics_render(NULL, text, len ? len : &n) ?
		       DLSHARE_ENOMEM : 0;
	s.has_counters = 1;
	s.counters = 1;
	s.has_usage_uids = 1;
	s.usage_uids = DLSHARE_METRICS_UIDS;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &s;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_STATS_REPLY, &r)))
		return err;
	err = metrics_render(r.msg->frame->stats_reply, text, len ? len : &n);
	reply_free(c, &r);
	return err ? DLSHARE_ENOMEM : 0;
}

int dlshare_delete(dlshare_client *c, const char *name)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Delete d = DLSHARE__DELETE__INIT;
	struct reply r;
	int err;

	errmsg_set(NULL);

	if (!c || client_bad_name(name)) {
		size_t len = name ? strlen(name) : 0;

		/* "fg/" is how a prefix looks: say what to do instead. */
		if (c && len && len <= CHECK_NAME_MAX && name[len - 1] == '/') {
			char msg[512];

			snprintf(msg, sizeof(msg), "%s; to delete the names "
				 "under it, use dlshare_delete_prefix()",
				 dlshare_last_error());
			errmsg_set(msg);
		}
		return DLSHARE_EINVAL;
	}
	d.name = (char *)name;
	f.body_case = DLSHARE__FRAME__BODY_DELETE;
	f.delete_ = &d;
	if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_OK, &r)))
		return err;
	reply_free(c, &r);
	return 0;
}

int dlshare_delete_prefix(dlshare_client *c, const char *prefix,
			  uint64_t *deleted, uint64_t *skipped)
{
	CALL_UNCANCELLED;
	uint64_t total = 0, left = 0;
	int more = 1, err = 0;

	errmsg_set(NULL);

	if (deleted)
		*deleted = 0;
	if (skipped)
		*skipped = 0;
	if (!c || !prefix)
		return DLSHARE_EINVAL;
	if (!*prefix) {
		errmsg_set("delete by prefix: the prefix is empty (it would "
			   "delete every name)");
		return DLSHARE_EINVAL;
	}
	if (check_prefix(prefix)) {
		errmsg_set("delete by prefix: no name can start with this "
			   "prefix");
		return DLSHARE_EINVAL;
	}
	if (client_forked(c))
		return fork_refuse();
	if (!c->lifetimes) {
		errmsg_set("delete by prefix needs a daemon of protocol 1.4 "
			   "or later");
		return DLSHARE_ENOTSUP;
	}
	/* The daemon deletes a batch per request: ask until it is done. */
	while (more && !err) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Delete d = DLSHARE__DELETE__INIT;
		const Dlshare__DeleteReply *dr;
		struct reply r;

		d.name = (char *)prefix;
		d.has_prefix = d.prefix = 1;
		f.body_case = DLSHARE__FRAME__BODY_DELETE;
		f.delete_ = &d;
		if ((err = call_expect(c, &f, DLSHARE__FRAME__BODY_DELETE_REPLY,
				       &r)))
			break;
		dr = r.msg->frame->delete_reply;
		total += dr->deleted;
		/* The last walk saw every name under the prefix. */
		left = dr->has_skipped ? dr->skipped : 0;
		more = dr->has_more && dr->more && dr->deleted;
		reply_free(c, &r);
	}
	if (deleted)
		*deleted = total;
	if (skipped)
		*skipped = left;
	return err;
}
