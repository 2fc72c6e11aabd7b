/* stage — device versions through pinned host memory, for a UCX that is not
 * CUDA-aware (Debian's 1.13): the serving thread copies a version's bytes,
 * in stream order (every tensor's bytes back to back, in tensor order),
 * device→host into a ring of --stage-slots pinned chunks of --chunk-size,
 * and the loop announces each filled slot (CHUNK); the peer gets it with
 * ucp_get_nbx into its writer and gives it back (FREE), and the thread
 * refills it. With two or more slots the copy of one chunk overlaps the
 * transfer of the others. The thread owns the ring and the CUDA stream;
 * the loop owns the ring's registration (once per offer, in serve.c) and
 * the messages. The mirroring half (stage_chunk, stage_pump) runs on the
 * loop.
 *
 * CUDA is the runtime, loaded at run time (util/cudaload: libcudart, or
 * DLSHARE_CUDA_RUNTIME): the relay links no CUDA and runs without it,
 * refusing device versions with a log line.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudaload.h"
#include "internal.h"

/* ---- CUDA runtime -------------------------------------------------------- */

/* The few runtime calls used, by their C ABI (a cudaError_t is an int,
 * streams are pointers), so that the relay builds without a toolkit. */
struct cudart {
	int (*set_device)(int);
	int (*stream_create)(void **, unsigned);
	int (*stream_destroy)(void *);
	int (*stream_sync)(void *);
	int (*malloc_host)(void **, size_t);
	int (*free_host)(void *);
	int (*memcpy_async)(void *, const void *, size_t, int, void *);
	int (*launch_host_func)(void *, void (*)(void *), void *);
	const char *(*errstr)(int);
};

#define CUDA_MEMCPY_DEFAULT 4       /* cudaMemcpyDefault */
#define CUDA_STREAM_NON_BLOCKING 1u /* cudaStreamNonBlocking */

static struct cudart rt;
static const char *rt_why;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

#define RT_SYM(dst, name)                                          \
	do {                                                       \
		*(void **)&(dst) = dlsym(h, name);                 \
		if (!(dst)) {                                      \
			rt_why = "the CUDA runtime lacks " name;   \
			return;                                    \
		}                                                  \
	} while (0)

static void rt_load(void)
{
	void *h = cudaload_runtime();

	if (!h) {
		rt_why = "no CUDA runtime (libcudart) could be loaded";
		return;
	}
	RT_SYM(rt.set_device, "cudaSetDevice");
	RT_SYM(rt.stream_create, "cudaStreamCreateWithFlags");
	RT_SYM(rt.stream_destroy, "cudaStreamDestroy");
	RT_SYM(rt.stream_sync, "cudaStreamSynchronize");
	RT_SYM(rt.malloc_host, "cudaMallocHost");
	RT_SYM(rt.free_host, "cudaFreeHost");
	RT_SYM(rt.memcpy_async, "cudaMemcpyAsync");
	RT_SYM(rt.errstr, "cudaGetErrorString");
	RT_SYM(rt.launch_host_func, "cudaLaunchHostFunc");
}

static const char *cuda_str(int e)
{
	const char *s = rt.errstr ? rt.errstr(e) : NULL;

	return s ? s : "CUDA error";
}

/* ---- serving: the thread ------------------------------------------------- */

struct stage {
	void *ring;
	void *stream;
	int device;
	uint32_t nslots, slot_size;
	/* the version being staged */
	size_t cur_t;
	uint64_t cur_toff, pos, len;
};

void stage_free(struct sub *s)
{
	struct stage *g = s->stg;

	if (!g)
		return;
	if (g->stream) {
		rt.stream_sync(g->stream);
		rt.stream_destroy(g->stream);
	}
	if (g->ring)
		rt.free_host(g->ring);
	free(g);
	s->stg = NULL;
}

int stage_prepare(struct sub *s, dlshare_bundle *b)
{
	struct relay *r = s->r;
	size_t n = dlshare_bundle_count(b), i;
	struct stage *g;
	const char *why = NULL;
	int device = -1, e;
	uint64_t len = 0;

	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		uint64_t nb = 0;

		if (!t || dlshare_tensor_nbytes(t, &nb)) {
			why = "a tensor the library refuses";
			goto refuse;
		}
		if (t->device.device_type != kDLCUDA) {
			why = "a version mixing device kinds";
			goto refuse;
		}
		if (device >= 0 && t->device.device_id != device) {
			why = "a version on several GPUs";
			goto refuse;
		}
		device = t->device.device_id;
		len += nb;
	}
	pthread_once(&rt_once, rt_load);
	if (rt_why) {
		why = rt_why;
		goto refuse;
	}
	g = s->stg;
	if (g && g->device != device) {
		stage_free(s);
		g = NULL;
	}
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g) {
			why = "out of memory";
			goto refuse;
		}
		s->stg = g;
		g->device = device;
		g->nslots = r->cfg->stage_slots;
		g->slot_size = (uint32_t)(r->cfg->chunk_size > (1u << 30) ?
					  (1u << 30) : r->cfg->chunk_size);
		e = rt.set_device(device);
		if (!e)
			e = rt.stream_create(&g->stream, CUDA_STREAM_NON_BLOCKING);
		/* a direct subscription's peer gets the device memory
		 * itself (direct.c): no ring */
		if (!e && !s->direct)
			e = rt.malloc_host(&g->ring,
					   (size_t)g->nslots * g->slot_size);
		if (e) {
			why = cuda_str(e);
			g->ring = NULL;
			stage_free(s);
			goto refuse;
		}
		if (s->direct)
			log_info("serving '%s': device versions of GPU %d go "
				 "direct, their memory registered with UCX",
				 s->prefix, device);
		else
			log_info("serving '%s': device versions of GPU %d staged "
				 "through %u pinned chunks of %u bytes", s->prefix,
				 device, g->nslots, g->slot_size);
	}
	/* the copies wait for the producer's writes (its event); the peer's
	 * gets of a direct offer cannot, so this thread waits before it
	 * hands the lease to the loop */
	e = dlshare_bundle_wait(b, g->stream);
	if (!e && s->direct && (e = rt.stream_sync(g->stream)))
		why = cuda_str(e);
	else if (e)
		why = dlshare_strerror(e);
	if (e)
		goto refuse;
	g->cur_t = 0;
	g->cur_toff = 0;
	g->pos = 0;
	g->len = len;
	if (s->direct)
		s->direct_offer = true;
	else
		s->staged = true;
	return 0;
refuse:
	__atomic_add_fetch(&r->m.not_offered_threads, 1, __ATOMIC_RELAXED);
	log_warn("serving %s version %" PRIu64 ": not offered: %s",
		 s->hot[0] ? s->hot : s->prefix, dlshare_bundle_version(b), why);
	return -1;
}

/* Copies the next chunk of b into slot. Returns its length, or 0 after a
 * CUDA error (logged, and said in why). */
static uint32_t stage_copy(struct sub *s, dlshare_bundle *b, uint32_t slot,
			   char *why, size_t whylen)
{
	struct stage *g = s->stg;
	uint8_t *dst = (uint8_t *)g->ring + (size_t)slot * g->slot_size;
	uint32_t filled = 0;
	int e = 0;

	while (filled < g->slot_size && g->pos + filled < g->len && !e) {
		const DLTensor *t = dlshare_bundle_tensor(b, g->cur_t);
		uint64_t nb = 0, n;

		dlshare_tensor_nbytes(t, &nb);
		if (g->cur_toff == nb) {
			g->cur_t++;
			g->cur_toff = 0;
			continue;
		}
		n = nb - g->cur_toff;
		if (n > g->slot_size - filled)
			n = g->slot_size - filled;
		e = rt.memcpy_async(dst + filled, (const uint8_t *)t->data +
				    t->byte_offset + g->cur_toff, n,
				    CUDA_MEMCPY_DEFAULT, g->stream);
		filled += (uint32_t)n;
		g->cur_toff += n;
	}
	if (!e)
		e = rt.stream_sync(g->stream);
	if (e) {
		snprintf(why, whylen, "device-to-host copy on GPU %d: %s",
			 g->device, cuda_str(e));
		log_err("serving %s version %" PRIu64 ": %s", s->name,
			dlshare_bundle_version(b), why);
		return 0;
	}
	return filled;
}

void stage_serve(struct sub *s, dlshare_bundle *b)
{
	struct relay *r = s->r;
	struct stage *g = s->stg;
	uint64_t one = 1;

	s->stg_free = g->nslots >= 32 ? UINT32_MAX : (1u << g->nslots) - 1;
	s->stg_nq = 0;
	s->stg_failed = false;
	while (s->state != SUB_RELEASE) {
		char why[sizeof(s->stg_why)];
		uint32_t slot, len;
		uint64_t off;

		if (s->cancel || s->state != SUB_SENT || !s->stg_free ||
		    g->pos == g->len) {
			pthread_cond_wait(&s->cv, &r->mu);
			continue;
		}
		slot = (uint32_t)__builtin_ctz(s->stg_free);
		s->stg_free &= ~(1u << slot);
		pthread_mutex_unlock(&r->mu);
		off = g->pos;
		len = stage_copy(s, b, slot, why, sizeof(why));
		g->pos += len;
		pthread_mutex_lock(&r->mu);
		if (s->state == SUB_RELEASE)
			break;
		if (!len) {
			/* no more bytes come: the loop tells the peer after
			 * the chunks queued before (ABORT; a minor-6 peer
			 * waits until --transfer-timeout-ms ends the offer) */
			g->pos = g->len;
			s->stg_failed = true;
			memcpy(s->stg_why, why, sizeof(s->stg_why));
		} else {
			s->stg_q[s->stg_nq++] =
				(struct stage_chunk){ off, slot, len };
		}
		if (!s->stg_queued) {
			s->stg_queued = true;
			s->next_chunky = r->chunky;
			r->chunky = s;
		}
		pthread_mutex_unlock(&r->mu);
		if (write(r->evfd, &one, sizeof(one)) < 0) {
			/* the loop is awake anyway */
		}
		pthread_mutex_lock(&r->mu);
	}
	/* the loop no longer looks at this offer's chunks (serve_release
	 * cleared s->staged) */
	s->stg_nq = 0;
	s->stg_failed = false;
}

/* ---- serving: the loop ---------------------------------------------------- */

void stage_ring(struct sub *s, void **addr, uint64_t *len, uint32_t *nslots,
		uint32_t *slot_size)
{
	*addr = s->stg->ring;
	*len = (uint64_t)s->stg->nslots * s->stg->slot_size;
	*nslots = s->stg->nslots;
	*slot_size = s->stg->slot_size;
}

/* The staging of s's offer failed (why): a peer of minor 7 is told at
 * once (ABORT) and answers DONE 2, which releases the lease as any DONE;
 * an older one is not, and --transfer-timeout-ms ends the offer. */
static void stage_abort_send(struct relay *r, struct conn *c, struct sub *s,
			     uint64_t offer_id, const char *why)
{
	size_t n = strnlen(why, 512);
	struct wbuf w;

	s->abort_sent = true;
	r->m.serve_failed[RS_STAGING]++;
	if (c->peer_minor < 7) {
		log_warn("serving %s to %s: staging failed; the peer's relay "
			 "(protocol 1.%u) cannot be told, --transfer-timeout-ms "
			 "%u ends the offer", s->name, c->peer, c->peer_minor,
			 r->cfg->transfer_timeout_ms);
		return;
	}
	log_warn("serving %s to %s: staging failed; the peer is told", s->name,
		 c->peer);
	wbuf_start(&w, MSG_ABORT);
	wbuf_u64(&w, offer_id);
	wbuf_u16(&w, (uint16_t)n);
	wbuf_bytes(&w, why, n);
	conn_send(c, &w);
}

void stage_drain(struct relay *r)
{
	for (;;) {
		struct stage_chunk q[STAGE_SLOTS_MAX];
		char why[sizeof(((struct sub *)0)->stg_why)];
		bool failed;
		unsigned nq, i;
		uint64_t offer_id;
		struct conn *c;
		struct sub *s;

		pthread_mutex_lock(&r->mu);
		s = r->chunky;
		if (s) {
			r->chunky = s->next_chunky;
			s->stg_queued = false;
		}
		if (!s) {
			pthread_mutex_unlock(&r->mu);
			return;
		}
		nq = s->stg_nq;
		memcpy(q, s->stg_q, nq * sizeof(q[0]));
		s->stg_nq = 0;
		failed = s->stg_failed;
		s->stg_failed = false;
		memcpy(why, s->stg_why, sizeof(why));
		/* a sub is freed only after its thread exited, which it does
		 * only once released: SUB_SENT means the offer stands */
		offer_id = s->state == SUB_SENT ? s->offer_id : 0;
		pthread_mutex_unlock(&r->mu);
		c = conn_by_id(r, s->conn_id);
		if (!c || c->state != C_READY || !offer_id)
			continue;
		for (i = 0; i < nq; i++) {
			struct wbuf w;

			s->stg_out |= 1u << q[i].slot;
			wbuf_start(&w, MSG_CHUNK);
			wbuf_u64(&w, offer_id);
			wbuf_u64(&w, q[i].off);
			wbuf_u32(&w, q[i].slot);
			wbuf_u32(&w, q[i].len);
			if (conn_send(c, &w))
				break;
		}
		if (failed)
			stage_abort_send(r, c, s, offer_id, why);
	}
}

void stage_forget(struct relay *r, struct sub *s)
{
	struct sub **pp;

	pthread_mutex_lock(&r->mu);
	if (s->stg_queued)
		for (pp = &r->chunky; *pp; pp = &(*pp)->next_chunky)
			if (*pp == s) {
				*pp = s->next_chunky;
				break;
			}
	s->stg_queued = false;
	pthread_mutex_unlock(&r->mu);
}

int stage_freed(struct relay *r, struct conn *c, uint64_t offer_id,
		uint32_t slot)
{
	struct sub *s;

	for (s = c->subs; s; s = s->next)
		if (s->offer_id == offer_id && s->memh && s->staged)
			break;
	if (!s)
		return 0;   /* a FREE that crossed our release: nothing to do */
	if (slot >= STAGE_SLOTS_MAX || !(s->stg_out & (1u << slot)))
		return -1;
	s->stg_out &= ~(1u << slot);
	pthread_mutex_lock(&r->mu);
	s->stg_free |= 1u << slot;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* ---- mirroring ------------------------------------------------------------- */

int stage_chunk(struct relay *r, struct conn *c, struct rbuf *rb)
{
	uint64_t offer_id = rbuf_u64(rb), off = rbuf_u64(rb);
	uint32_t slot = rbuf_u32(rb), len = rbuf_u32(rb);
	struct pchunk *ch;
	struct pull *p;

	(void)r;
	if (rb->bad || rbuf_left(rb))
		goto bad;
	for (p = c->pulls; p; p = p->next)
		if (p->offer_id == offer_id)
			break;
	if (!p)
		return 0;   /* crossed our DONE of a failed pull */
	if (!p->staged)
		goto bad;
	if (p->st == P_CLOSING || p->failed)
		return 0;   /* failing: the DONE tells the server */
	if (slot >= p->nslots || !len || len > p->slot_size ||
	    off != p->recv_pos || p->stream_len - off < len)
		goto bad;
	ch = &p->chunks[slot];
	if (ch->st != PC_EMPTY)
		goto bad;
	ch->off = off;
	ch->len = len;
	ch->st = PC_QUEUED;
	p->recv_pos += len;
	return 0;
bad:
	conn_error(c, 1, "a malformed or unexpected chunk");
	conn_fail(c, "a malformed or unexpected chunk");
	return -1;
}

void stage_aborted(struct relay *r, struct conn *c, struct rbuf *rb)
{
	uint64_t offer_id = rbuf_u64(rb);
	uint16_t n = rbuf_u16(rb);
	const char *t = rbuf_bytes(rb, n);
	char why[160];
	struct pull *p;

	(void)r;
	if (rb->bad || rbuf_left(rb) || n > 512) {
		conn_error(c, 1, "a malformed abort");
		conn_fail(c, "a malformed abort");
		return;
	}
	/* the origin's words, printable only, for our log */
	msg_printable(why, sizeof(why), t, n);
	for (p = c->pulls; p; p = p->next)
		if (p->offer_id == offer_id)
			break;
	if (!p || !p->staged)
		return;   /* answered already: it crossed our DONE */
	if (p->busy) {
		/* on the worker (p->failed is its own until it is back): a
		 * create is failed by mirror_done after it; a seal or abort
		 * answers the offer anyway */
		if (p->st == P_CREATING)
			snprintf(p->aborted, sizeof(p->aborted), "the origin "
				 "%.24s aborted the transfer: %.100s", c->node,
				 why);
		return;
	}
	if (p->st == P_CLOSING || p->failed)
		return;   /* failing already: the DONE answers it */
	p->failed = true;
	snprintf(p->why, sizeof(p->why), "the origin %.24s aborted the "
		 "transfer: %.100s", c->node, why);
}

static void chunk_cb(void *req, ucs_status_t st, void *user)
{
	struct pchunk *ch = user;
	struct pull *p = ch->p;

	ch->pending--;
	p->inflight--;
	p->c->r->inflight--;
	if (st != UCS_OK && !p->failed) {
		p->failed = true;
		snprintf(p->why, sizeof(p->why), "get: %s", ucs_status_string(st));
	}
	ucp_request_free(req);
}

static void get_failed(struct pull *p, ucs_status_ptr_t sp)
{
	p->failed = true;
	snprintf(p->why, sizeof(p->why), "get: %s",
		 ucs_status_string(UCS_PTR_STATUS(sp)));
}

static void get_post(struct relay *r, struct pull *p, struct pchunk *ch,
		     void *dst, uint64_t len, uint64_t src)
{
	ucp_request_param_t rp = { 0 };
	ucs_status_ptr_t sp;

	rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
			  UCP_OP_ATTR_FIELD_USER_DATA;
	rp.cb.send = chunk_cb;
	rp.user_data = ch;
	sp = ucp_get_nbx(p->c->ep, dst, len, src, p->regions[0].rkey, &rp);
	if (UCS_PTR_IS_ERR(sp)) {
		get_failed(p, sp);
		return;
	}
	if (sp) {
		ch->pending++;
		p->inflight++;
		r->inflight++;
	}
}

/* Issues the gets of ch from the slot in the peer's ring: into the pieces
 * of the tensors its stream bytes fall in (a host writer), or whole into
 * the same slot of our own pinned ring (a device writer). */
static void chunk_issue(struct relay *r, struct pull *p, struct pchunk *ch,
			uint32_t slot)
{
	uint64_t done = 0, src = p->regions[0].addr +
				 (uint64_t)slot * p->slot_size;

	ch->ct = p->cur_t;
	ch->ctoff = p->cur_toff;
	if (p->mring)
		get_post(r, p, ch, (uint8_t *)p->mring +
			 (size_t)slot * p->slot_size, ch->len, src);
	while (done < ch->len && !p->failed) {
		DLTensor *t = dlshare_writer_tensor(p->w, p->cur_t);
		uint64_t left = p->tlen[p->cur_t] - p->cur_toff, n;

		if (!left) {
			p->cur_t++;
			p->cur_toff = 0;
			continue;
		}
		n = ch->len - done < left ? ch->len - done : left;
		if (!p->mring)
			get_post(r, p, ch, (uint8_t *)t->data + t->byte_offset +
				 p->cur_toff, n, src + done);
		done += n;
		p->cur_toff += n;
	}
	p->issue_pos += ch->len;
	ch->st = PC_ISSUED;
}

static void copied_cb(void *arg)
{
	struct pchunk *ch = arg;
	struct relay *r = ch->p->c->r;
	uint64_t one = 1;

	__atomic_store_n(&ch->copied, 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&ch->p->copies_done, 1, __ATOMIC_RELEASE);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the loop is awake anyway */
	}
}

/* Queues the host→device copies of ch (now in our ring) into the writer's
 * device buffers, and a host function that says when they ran. Neither
 * call waits: the source is pinned. Returns 0 or -1 (p failed). */
static int chunk_copy(struct relay *r, struct pull *p, struct pchunk *ch,
		      uint32_t slot)
{
	const uint8_t *src = (uint8_t *)p->mring + (size_t)slot * p->slot_size;
	size_t ti = ch->ct;
	uint64_t toff = ch->ctoff, done = 0;
	int e = rt.set_device(r->cfg->device);

	while (!e && done < ch->len) {
		DLTensor *t = dlshare_writer_tensor(p->w, ti);
		uint64_t left = p->tlen[ti] - toff, n;

		if (!left) {
			ti++;
			toff = 0;
			continue;
		}
		n = ch->len - done < left ? ch->len - done : left;
		e = rt.memcpy_async((uint8_t *)t->data + t->byte_offset + toff,
				    src + done, n, CUDA_MEMCPY_DEFAULT,
				    p->mstream);
		done += n;
		toff += n;
	}
	if (!e) {
		ch->copied = 0;
		e = rt.launch_host_func(p->mstream, copied_cb, ch);
	}
	if (e) {
		p->failed = true;
		snprintf(p->why, sizeof(p->why), "host-to-device copy: %s",
			 cuda_str(e));
		return -1;
	}
	p->copies++;
	ch->st = PC_COPYING;
	return 0;
}

bool stage_idle(struct pull *p)
{
	return !p->inflight &&
	       p->copies == __atomic_load_n(&p->copies_done, __ATOMIC_ACQUIRE);
}

int stage_mirror_setup(struct relay *r, struct pull *p)
{
	uint64_t ring = (uint64_t)p->nslots * p->slot_size;
	uint64_t limit = (uint64_t)r->cfg->stage_slots * r->cfg->chunk_size;
	int e;

	/* a direct pull (nslots 0) needs the seal's stream alone: the gets
	 * write the device buffer themselves */
	/* the peer names the ring's size: pinned memory here is bounded by
	 * this relay's own staging settings, not by the peer's */
	if (ring > limit) {
		snprintf(p->why, sizeof(p->why), "the peer's staging ring of "
			 "%" PRIu64 " bytes exceeds this relay's --stage-slots "
			 "x --chunk-size, %" PRIu64 " bytes", ring, limit);
		return -1;
	}

	pthread_once(&rt_once, rt_load);
	if (rt_why) {
		snprintf(p->why, sizeof(p->why), "%s", rt_why);
		return -1;
	}
	e = rt.set_device(r->cfg->device);
	if (!e)
		e = rt.stream_create(&p->mstream, CUDA_STREAM_NON_BLOCKING);
	if (!e && !p->direct)
		e = rt.malloc_host(&p->mring, (size_t)p->nslots * p->slot_size);
	if (e) {
		p->mring = NULL;
		snprintf(p->why, sizeof(p->why), "staging on GPU %d: %s",
			 r->cfg->device, cuda_str(e));
		stage_mirror_teardown(p);
		return -1;
	}
	return 0;
}

void stage_mirror_teardown(struct pull *p)
{
	if (p->mstream) {
		rt.stream_sync(p->mstream);
		rt.stream_destroy(p->mstream);
		p->mstream = NULL;
	}
	if (p->mring)
		rt.free_host(p->mring);
	p->mring = NULL;
}

void stage_pump(struct relay *r, struct pull *p)
{
	uint32_t i;
	bool more = true;

	/* in stream order: the chunk that starts where the last one ended */
	while (more && !p->failed) {
		more = false;
		for (i = 0; i < p->nslots; i++)
			if (p->chunks[i].st == PC_QUEUED &&
			    p->chunks[i].off == p->issue_pos) {
				chunk_issue(r, p, &p->chunks[i], i);
				more = true;
			}
	}
	for (i = 0; i < p->nslots; i++) {
		struct pchunk *ch = &p->chunks[i];
		struct wbuf w;

		if (ch->st == PC_ISSUED && !ch->pending && p->mring &&
		    !p->failed) {
			/* in our ring: on to the device, then FREE */
			chunk_copy(r, p, ch, i);
			continue;
		}
		if (ch->st == PC_COPYING &&
		    __atomic_load_n(&ch->copied, __ATOMIC_ACQUIRE))
			ch->st = PC_ISSUED;
		if (ch->st != PC_ISSUED || ch->pending)
			continue;
		ch->st = PC_EMPTY;
		if (p->failed)
			continue;
		p->got += ch->len;
		wbuf_start(&w, MSG_FREE);
		wbuf_u64(&w, p->offer_id);
		wbuf_u32(&w, i);
		if (conn_send(p->c, &w))
			return;
	}
}
