/* serve — this node's names to peers: a thread per followed prefix that
 * leases new versions, offers with registered memory, the serving side of
 * the handshake. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- serving: the threads --------------------------------------------------- */

#define PICK_MAX 64   /* names one scan of a prefix collects */

/* One scan: up to PICK_MAX names with a version newer than the one
 * offered, those after the last name offered first (round-robin). */
struct pick {
	struct sub *s;
	size_t n, nafter;
	char name[PICK_MAX][256];
	uint64_t v[PICK_MAX];
};

static int pick_cb(const dlshare_name_info *info, void *arg)
{
	struct pick *k = arg;
	bool after;

	if (!info->latest || nv_get(k->s->seen, info->name) >= info->latest)
		return 0;
	after = strcmp(info->name, k->s->last) > 0;
	if (k->n == PICK_MAX) {
		/* full: only a name after the last offered may displace
		 * one before it */
		if (!after || k->nafter == PICK_MAX)
			return k->nafter == PICK_MAX;
		k->n--;
	}
	if (after) {
		/* after-names go first, in order */
		memmove(k->name[k->nafter + 1], k->name[k->nafter],
			(k->n - k->nafter) * sizeof(k->name[0]));
		memmove(&k->v[k->nafter + 1], &k->v[k->nafter],
			(k->n - k->nafter) * sizeof(k->v[0]));
		snprintf(k->name[k->nafter], 256, "%s", info->name);
		k->v[k->nafter] = info->latest;
		k->nafter++;
	} else {
		snprintf(k->name[k->n], 256, "%s", info->name);
		k->v[k->n] = info->latest;
	}
	k->n++;
	return 0;
}

/* Hands b (a lease on name) to the loop and waits until it is done with
 * it. Returns false when cancelled. */
static bool sub_offer(struct sub *s, dlshare_bundle *b, const char *name_in)
{
	struct relay *r = s->r;
	uint64_t one = 1;
	bool cancelled;
	char name[256];

	/* name_in may be s->hot, rewritten below */
	snprintf(name, sizeof(name), "%s", name_in);

	nv_set(&s->seen, name, dlshare_bundle_version(b));
	snprintf(s->hot, sizeof(s->hot), "%s", name);
	snprintf(s->last, sizeof(s->last), "%s", name);
	s->staged = false;
	s->direct_offer = false;
	if (dlshare_bundle_count(b) && dlshare_bundle_tensor(b, 0) &&
	    dlshare_bundle_tensor(b, 0)->device.device_type == kDLCUDA &&
	    stage_prepare(s, b)) {
		/* refused (logged): the next version may do */
		dlshare_bundle_free(b);
		return true;
	}
	pthread_mutex_lock(&r->mu);
	if (s->cancel) {
		pthread_mutex_unlock(&r->mu);
		dlshare_bundle_free(b);
		return false;
	}
	s->bundle = b;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->state = SUB_READY;
	s->next_ready = r->ready;
	r->ready = s;
	pthread_mutex_unlock(&r->mu);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the loop is awake anyway */
	}
	pthread_mutex_lock(&r->mu);
	if (s->staged)
		stage_serve(s, b);
	while (s->state != SUB_RELEASE)
		pthread_cond_wait(&s->cv, &r->mu);
	s->bundle = NULL;
	s->state = SUB_SCAN;
	cancelled = s->cancel;
	pthread_mutex_unlock(&r->mu);
	dlshare_bundle_free(b);
	return !cancelled;
}

/* Thread of s: tells the peer that name was deleted here (relay protocol
 * 1.7; the loop drops it for an older peer). Waits while DNOTE_MAX of s's
 * are queued. Returns false when cancelled. */
static bool sub_deleted(struct sub *s, const char *name)
{
	struct relay *r = s->r;
	struct dnote *d = calloc(1, sizeof(*d));
	uint64_t one = 1;
	bool cancelled;

	if (!d) {
		log_err("serving %s: out of memory", s->prefix);
		return true;
	}
	d->s = s;
	d->conn_id = s->conn_id;
	d->sub_id = s->sub_id;
	snprintf(d->name, sizeof(d->name), "%s", name);
	pthread_mutex_lock(&r->mu);
	while (s->ndnotes >= DNOTE_MAX && !s->cancel)
		pthread_cond_wait(&s->cv, &r->mu);
	cancelled = s->cancel;
	if (!cancelled) {
		if (!r->dnotes)
			r->dnotes_tail = &r->dnotes;
		*r->dnotes_tail = d;
		r->dnotes_tail = &d->next;
		s->ndnotes++;
		d = NULL;
	}
	pthread_mutex_unlock(&r->mu);
	free(d);
	if (!cancelled && write(r->evfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the loop is awake anyway */
	}
	return !cancelled;
}

static bool sub_cancelled(struct sub *s)
{
	bool c;

	pthread_mutex_lock(&s->r->mu);
	c = s->cancel;
	pthread_mutex_unlock(&s->r->mu);
	return c;
}

/* Thread of s, olock held: offers b (a lease on name) unless it is not
 * newer than what was offered of name (the other thread offered it).
 * Returns false when cancelled. */
static bool sub_offer_new(struct sub *s, dlshare_bundle *b, const char *name)
{
	if (nv_get(s->seen, name) >= dlshare_bundle_version(b)) {
		dlshare_bundle_free(b);
		return true;
	}
	return sub_offer(s, b, name);
}

/* The hot thread of s (with Watch): a waiting get on the name offered
 * last, as the scan's. A weight-sync name that is the only one changing
 * gets its next version handed over with the lease in one answer; the
 * watcher finds every other change (and this one too, offered once). */
static void *hot_thread(void *arg)
{
	struct sub *s = arg;
	struct relay *r = s->r;

	while (!sub_cancelled(s)) {
		dlshare_get_opts o = { .select = DLSHARE_NEWER_THAN,
				       .timeout_ms = WATCH_WAIT_MS };
		dlshare_bundle *b = NULL;
		char name[256];
		bool ok;
		int err;

		pthread_mutex_lock(&s->olock);
		snprintf(name, sizeof(name), "%s", s->hot);
		o.version = nv_get(s->seen, name);
		ok = !s->hot_stop;
		pthread_mutex_unlock(&s->olock);
		if (!ok)
			err = DLSHARE_ELIMIT;
		else if (name[0])
			err = dlshare_get(r->dl, name, &o, &b);
		else
			err = 0;
		if (err == DLSHARE_ELIMIT) {
			/* the daemon's --max-inflight for this relay's
			 * connection: the watch matters more */
			log_warn("serving %s: no waiting get beside the watch "
				 "(this relay's requests waiting in the daemon "
				 "are at its --max-inflight); new versions come "
				 "by Watch alone", s->prefix);
			break;
		}
		if (!name[0]) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += (long)WATCH_WAIT_MS * 1000000;
			ts.tv_sec += ts.tv_nsec / 1000000000;
			ts.tv_nsec %= 1000000000;
			pthread_mutex_lock(&r->mu);
			if (!s->cancel)
				pthread_cond_timedwait(&s->hcv, &r->mu, &ts);
			pthread_mutex_unlock(&r->mu);
			continue;
		}
		if (err) {
			/* deleted, not ours, the daemon in trouble: the
			 * watcher says what is new; wait for another name */
			pthread_mutex_lock(&s->olock);
			if (err != DLSHARE_ETIMEDOUT && !strcmp(s->hot, name))
				s->hot[0] = 0;
			pthread_mutex_unlock(&s->olock);
			continue;
		}
		pthread_mutex_lock(&s->olock);
		ok = sub_offer_new(s, b, name);
		pthread_mutex_unlock(&s->olock);
		if (!ok)
			break;
	}
	return NULL;
}

/* Thread of s, with a daemon that speaks 1.6: learns of new versions and
 * deletions under the prefix from Watch, which the daemon answers when
 * any name there changes (not only the last changed one, as the scan's
 * parked get). Returns 0 when cancelled, DLSHARE_ENOTSUP when the daemon
 * is older (the caller scans instead). */
static int sub_watch(struct sub *s, dlshare_watch_change *ch)
{
	struct relay *r = s->r;
	uint64_t after = 0;
	int ret = 0;

	for (;;) {
		unsigned flags = 0;
		size_t n = 0, i;
		uint64_t seq = after;
		bool cancel;
		int err;

		pthread_mutex_lock(&r->mu);
		cancel = s->cancel;
		pthread_mutex_unlock(&r->mu);
		if (cancel)
			break;
		err = dlshare_watch(r->dl, s->prefix, after, WATCH_WAIT_MS, ch,
				    PICK_MAX, &n, &seq, &flags);
		if (err == DLSHARE_ENOTSUP) {
			ret = err;
			break;
		}
		if (!err && !s->hot_started) {
			if (pthread_create(&s->hot_th, NULL, hot_thread, s))
				log_warn("serving %s: no hot thread: new "
					 "versions come by Watch alone",
					 s->prefix);
			else
				s->hot_started = true;
		}
		if (err == DLSHARE_ELIMIT && s->hot_started) {
			/* the daemon's --max-inflight for this relay's
			 * connection: the hot thread's waiting get gives
			 * way to the watch */
			pthread_mutex_lock(&s->olock);
			s->hot_stop = true;
			pthread_mutex_unlock(&s->olock);
		}
		if (err) {
			struct timespec ts;

			log_warn("serving %s: watch: %s", s->prefix,
				 dlshare_last_error()[0] ? dlshare_last_error() :
				 dlshare_strerror(err));
			/* not in a hurry: the daemon is in trouble */
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_mutex_lock(&r->mu);
			if (!s->cancel)
				pthread_cond_timedwait(&s->cv, &r->mu, &ts);
			pthread_mutex_unlock(&r->mu);
			continue;
		}
		if ((flags & DLSHARE_WATCH_LOST) && after)
			log_warn("serving %s: deletions this node's daemon no "
				 "longer remembers were not passed on "
				 "(--watch-deletions)", s->prefix);
		for (i = 0; i < n; i++) {
			dlshare_get_opts o = { .select = DLSHARE_LATEST };
			dlshare_bundle *b = NULL;
			bool have, ok;

			if (ch[i].deleted) {
				/* Sent even when the name was made again
				 * since (its numbers start at 1 again): the
				 * peer deletes its copy if it came from this
				 * node and forgets the origin version it had,
				 * and the new version is offered after it
				 * (seen forgotten here too), also when the
				 * hot thread offered it before. */
				pthread_mutex_lock(&s->olock);
				nv_set(&s->seen, ch[i].name, 0);
				pthread_mutex_unlock(&s->olock);
				if (!sub_deleted(s, ch[i].name))
					goto out;
				continue;
			}
			pthread_mutex_lock(&s->olock);
			have = nv_get(s->seen, ch[i].name) >= ch[i].version;
			pthread_mutex_unlock(&s->olock);
			if (have)
				continue;
			err = dlshare_get(r->dl, ch[i].name, &o, &b);
			if (err) {
				/* deleted since, or not ours to read */
				if (err != DLSHARE_ENOENT)
					log_warn("serving %s: get: %s", ch[i].name,
						 dlshare_last_error()[0] ?
						 dlshare_last_error() :
						 dlshare_strerror(err));
				continue;
			}
			pthread_mutex_lock(&s->olock);
			ok = sub_offer_new(s, b, ch[i].name);
			pthread_mutex_unlock(&s->olock);
			if (!ok)
				goto out;
		}
		after = seq;
	}
out:
	if (s->hot_started)
		pthread_join(s->hot_th, NULL);
	s->hot_started = false;
	return ret;
}

static void *sub_thread(void *arg)
{
	struct sub *s = arg;
	struct relay *r = s->r;
	uint64_t one = 1;
	struct pick *k = NULL;
	dlshare_watch_change *ch = malloc(PICK_MAX * sizeof(*ch));

	bool scan = false;

	if (!ch)
		log_err("serving %s: out of memory", s->prefix);
	else if (getenv("DLSHARE_RELAY_NO_WATCH") ||
		 sub_watch(s, ch) == DLSHARE_ENOTSUP)
	{
		/* a daemon before 1.6 (or a test of it) */
		log_info("serving %s: this node's daemon has no Watch "
			 "(protocol 1.6); falls back to a scan every %u ms",
			 s->prefix, r->cfg->scan_interval_ms);
		scan = true;
	}
	free(ch);
	if (scan && !(k = malloc(sizeof(*k))))
		log_err("serving %s: out of memory", s->prefix);

	for (; k;) {
		dlshare_bundle *b = NULL;
		dlshare_get_opts o = { 0 };
		const char *name = NULL;
		bool stop = false;
		size_t i;
		int err;

		pthread_mutex_lock(&r->mu);
		if (s->cancel) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		pthread_mutex_unlock(&r->mu);

		k->s = s;
		k->n = k->nafter = 0;
		err = dlshare_list(r->dl, s->prefix, pick_cb, k);
		if (err)
			log_warn("serving %s: list: %s", s->prefix,
				 dlshare_strerror(err));
		for (i = 0; i < k->n && !stop; i++) {
			o = (dlshare_get_opts){ .select = DLSHARE_LATEST };
			b = NULL;
			err = dlshare_get(r->dl, k->name[i], &o, &b);
			if (err) {
				/* deleted, or not ours to read: skip this
				 * version, try the next scan */
				if (err != DLSHARE_ENOENT)
					log_warn("serving %s: get: %s", k->name[i],
						 dlshare_last_error()[0] ?
						 dlshare_last_error() :
						 dlshare_strerror(err));
				nv_set(&s->seen, k->name[i], k->v[i]);
				continue;
			}
			if (!sub_offer(s, b, k->name[i]))
				stop = true;
		}
		if (stop)
			break;
		if (k->n)
			continue;
		if (s->hot[0]) {
			/* Nothing new: wait on the name that changed last, the
			 * daemon parks the request; others are seen by the next
			 * scan. */
			o.select = DLSHARE_NEWER_THAN;
			o.version = nv_get(s->seen, s->hot);
			o.timeout_ms = (int32_t)r->cfg->scan_interval_ms;
			err = dlshare_get(r->dl, s->hot, &o, &b);
			if (err == 0)
				name = s->hot;
			else if (err != DLSHARE_ETIMEDOUT)
				s->hot[0] = 0;
		} else {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += (long)(r->cfg->scan_interval_ms % 1000) * 1000000;
			ts.tv_sec += r->cfg->scan_interval_ms / 1000 + ts.tv_nsec / 1000000000;
			ts.tv_nsec %= 1000000000;
			pthread_mutex_lock(&r->mu);
			if (!s->cancel)
				pthread_cond_timedwait(&s->cv, &r->mu, &ts);
			pthread_mutex_unlock(&r->mu);
		}
		if (b && !sub_offer(s, b, name))
			break;
	}
	free(k);
	stage_free(s);
	nv_clear(&s->seen);
	pthread_mutex_lock(&r->mu);
	s->state = SUB_EXITED;
	pthread_mutex_unlock(&r->mu);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the loop is awake anyway */
	}
	return NULL;
}

/* The loop is done with s's offer (sent and answered, or the peer went):
 * unregisters the memory, lets the thread release the lease. */
void serve_release(struct relay *r, struct sub *s)
{
	struct sub **pp;
	uint32_t i;

	for (i = 0; i < s->nmemh; i++)
		ucp_mem_unmap(r->ctx, s->memh[i]);
	free(s->memh);
	s->memh = NULL;
	s->nmemh = 0;
	s->stg_out = 0;
	pthread_mutex_lock(&r->mu);
	s->staged = false;
	s->direct_offer = false;
	if (s->state == SUB_READY) {
		for (pp = &r->ready; *pp; pp = &(*pp)->next_ready)
			if (*pp == s) {
				*pp = s->next_ready;
				break;
			}
	}
	if (s->state == SUB_READY || s->state == SUB_SENT) {
		s->state = SUB_RELEASE;
		pthread_cond_signal(&s->cv);
	}
	pthread_mutex_unlock(&r->mu);
}

void serve_reap(struct relay *r)
{
	struct sub **pp = &r->zombies, *s;

	while ((s = *pp)) {
		enum sub_state st;

		pthread_mutex_lock(&r->mu);
		st = s->state;
		pthread_mutex_unlock(&r->mu);
		if (st != SUB_EXITED) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		pthread_join(s->th, NULL);
		/* deletions it queued that were not sent: its peer went */
		pthread_mutex_lock(&r->mu);
		{
			struct dnote **dp = &r->dnotes, *d;

			r->dnotes_tail = NULL;
			while ((d = *dp)) {
				if (d->s == s) {
					*dp = d->next;
					free(d);
					continue;
				}
				r->dnotes_tail = &d->next;
				dp = &d->next;
			}
			if (!r->dnotes_tail)
				r->dnotes_tail = &r->dnotes;
		}
		pthread_mutex_unlock(&r->mu);
		stage_forget(r, s);
		pthread_cond_destroy(&s->cv);
		pthread_cond_destroy(&s->hcv);
		pthread_mutex_destroy(&s->olock);
		free(s);
	}
}

/* ---- serving: offers ---------------------------------------------------------- */

struct span {
	uint64_t addr, len;
	size_t idx;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static bool is_compact(const DLTensor *t)
{
	int64_t want = 1;
	int i;

	if (!t->strides)
		return true;
	for (i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->strides[i] != want)
			return false;
		want *= t->shape[i];
	}
	return true;
}

/* Whether the regions of an offer (nreg, lengths len) travel inline in
 * it (relay protocol 1.6): a mirror that speaks 1.6, and no more than
 * --inline-max bytes in all. Saves the mirror a get's round trip and this
 * relay the registration. Host regions only: offer_send refused device
 * tensors before (a staged device region must never come here). */
static bool offer_inline(struct relay *r, const struct conn *c,
			 const uint64_t *len, size_t nreg)
{
	uint64_t total = 0;
	size_t i;

	if (c->peer_minor < 6 || !r->cfg->inline_max)
		return false;
	for (i = 0; i < nreg; i++) {
		total += len[i];
		if (total > r->cfg->inline_max)
			return false;
	}
	return true;
}

/* An inline region: addr, len, rkey_len 0, then its len bytes (read
 * from the lease's mapping, which the lease keeps valid). */
static void offer_inline_region(struct wbuf *w, uint64_t addr, uint64_t len)
{
	wbuf_u64(w, addr);
	wbuf_u64(w, len);
	wbuf_u32(w, 0);
	wbuf_bytes(w, (const void *)(uintptr_t)addr, len);
}

/* Builds and sends the OFFER of s's lease. Returns 0, or -1 when this
 * version cannot be offered (s is then released, the peer kept). */
static int offer_send(struct relay *r, struct conn *c, struct sub *s)
{
	dlshare_bundle *b = s->bundle;
	size_t n = dlshare_bundle_count(b), i, nspan = 0, nreg = 0;
	struct span *sp = calloc(n ? n : 1, sizeof(*sp));
	uint32_t *reg_of = calloc(n ? n : 1, sizeof(*reg_of));
	uint64_t *reg_addr = NULL, *reg_len = NULL;
	struct wbuf w;
	const char *why = NULL;
	uint64_t stream_len = 0;
	uint32_t nslots = 0, slot_size = 0;
	bool inl = false;
	int ret = -1;

	s->offer_bytes = 0;
	s->abort_sent = false;

	if (!sp || !reg_of) {
		why = "out of memory";
		goto out;
	}
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		uint64_t nb;

		if (!t || dlshare_tensor_nbytes(t, &nb)) {
			why = "a tensor the library refuses";
			goto out;
		}
		s->offer_bytes += nb;
		if (s->staged) {
			if (!is_compact(t)) {
				why = "a strided tensor (the relay moves "
				      "compact ones)";
				goto out;
			}
			/* the ring's stream: tensors back to back */
			reg_of[i] = nb ? 0 : UINT32_MAX;
			sp[i].addr = stream_len;
			stream_len += nb;
			continue;
		}
		/* device tensors only by OFFER_DEVICE (stage_prepare
		 * checked them all) */
		if (t->device.device_type != kDLCPU &&
		    t->device.device_type != kDLCUDAHost && !s->direct_offer) {
			why = "a device tensor (the relay moves host tensors)";
			goto out;
		}
		if (!is_compact(t)) {
			why = "a strided tensor (the relay moves compact ones)";
			goto out;
		}
		reg_of[i] = UINT32_MAX;
		if (!nb)
			continue;
		sp[nspan].addr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
		sp[nspan].len = nb;
		sp[nspan].idx = i;
		nspan++;
	}
	if (s->staged && c->peer_minor < 6) {
		why = "a device version, and the peer's relay (protocol 1."
		      "5) takes host versions only";
		goto out;
	}
	qsort(sp, nspan, sizeof(*sp), span_cmp);
	reg_addr = calloc(nspan ? nspan : 1, sizeof(uint64_t));
	reg_len = calloc(nspan ? nspan : 1, sizeof(uint64_t));
	s->memh = calloc(nspan ? nspan : 1, sizeof(ucp_mem_h));
	if (!reg_addr || !reg_len || !s->memh) {
		why = "out of memory";
		goto out;
	}
	if (s->staged) {
		void *ring;

		stage_ring(s, &ring, &reg_len[0], &nslots, &slot_size);
		reg_addr[0] = (uint64_t)(uintptr_t)ring;
		nreg = 1;
	}
	/* Host tensors whose bytes touch the same or the next page belong to
	 * one mapping: one registration covers them, with no hole. Device
	 * tensors only when they overlap: two allocations of a GPU may lie
	 * side by side, and one registration cannot span both. */
	for (i = 0; i < nspan; i++) {
		uint64_t end = sp[i].addr + sp[i].len;

		if (nreg) {
			uint64_t cur_end = reg_addr[nreg - 1] + reg_len[nreg - 1];
			uint64_t page_end = s->direct_offer ? cur_end - 1 :
					    (cur_end + 4095) & ~(uint64_t)4095;

			if (sp[i].addr <= page_end) {
				if (end > cur_end)
					reg_len[nreg - 1] = end - reg_addr[nreg - 1];
				reg_of[sp[i].idx] = (uint32_t)(nreg - 1);
				continue;
			}
		}
		reg_addr[nreg] = sp[i].addr;
		reg_len[nreg] = sp[i].len;
		reg_of[sp[i].idx] = (uint32_t)nreg;
		nreg++;
	}

	/* a device version is copied through the ring or got from device
	 * memory, never inline: offer_inline reads host memory */
	inl = !s->staged && !s->direct_offer &&
	      offer_inline(r, c, reg_len, nreg);
	wbuf_start(&w, s->staged ? MSG_OFFER_STAGED :
		   s->direct_offer ? MSG_OFFER_DEVICE : MSG_OFFER);
	wbuf_u32(&w, s->sub_id);
	s->offer_id = ++r->next_offer;
	wbuf_u64(&w, s->offer_id);
	wbuf_u16(&w, (uint16_t)strlen(s->name));
	wbuf_bytes(&w, s->name, strlen(s->name));
	wbuf_u64(&w, dlshare_bundle_version(b));
	wbuf_u32(&w, (uint32_t)nreg);
	wbuf_u32(&w, (uint32_t)n);
	if (s->staged) {
		wbuf_u32(&w, nslots);
		wbuf_u32(&w, slot_size);
	}
	for (i = 0; i < nreg; i++) {
		unsigned prot = UCP_MEM_MAP_PROT_LOCAL_READ |
				UCP_MEM_MAP_PROT_REMOTE_READ;
		void *rk = NULL;
		size_t rklen = 0;
		ucs_status_t st;

		if (inl) {
			offer_inline_region(&w, reg_addr[i], reg_len[i]);
			continue;
		}
		/* read-only both here (the lease's mapping is) and for the
		 * peer: its rkey allows gets, never puts (a staging ring is
		 * written by CUDA, not through UCX) */
		st = direct_map(r, (void *)(uintptr_t)reg_addr[i], reg_len[i],
				prot, s->direct_offer ? r->dev_mem_type :
				UCS_MEMORY_TYPE_HOST, &s->memh[i]);
		if (st != UCS_OK) {
			why = ucs_status_string(st);
			free(w.p);
			goto out;
		}
		s->nmemh++;
		st = ucp_rkey_pack(r->ctx, s->memh[i], &rk, &rklen);
		if (st != UCS_OK) {
			why = ucs_status_string(st);
			free(w.p);
			goto out;
		}
		wbuf_u64(&w, reg_addr[i]);
		wbuf_u64(&w, reg_len[i]);
		wbuf_u32(&w, (uint32_t)rklen);
		wbuf_bytes(&w, rk, rklen);
		ucp_rkey_buffer_release(rk);
	}
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		const char *key = dlshare_bundle_key(b, i);
		size_t kl = strlen(key);
		uint64_t nb = 0;
		int d;

		dlshare_tensor_nbytes(t, &nb);
		wbuf_u16(&w, (uint16_t)kl);
		wbuf_bytes(&w, key, kl);
		wbuf_u8(&w, t->dtype.code);
		wbuf_u8(&w, t->dtype.bits);
		wbuf_u16(&w, t->dtype.lanes);
		wbuf_u8(&w, (uint8_t)t->ndim);
		for (d = 0; d < t->ndim; d++)
			wbuf_u64(&w, (uint64_t)t->shape[d]);
		wbuf_u32(&w, reg_of[i]);
		if (s->staged)
			wbuf_u64(&w, reg_of[i] == UINT32_MAX ? 0 : sp[i].addr);
		else
			wbuf_u64(&w, reg_of[i] == UINT32_MAX ? 0 :
				 (uint64_t)(uintptr_t)t->data + t->byte_offset -
				 reg_addr[reg_of[i]]);
		wbuf_u64(&w, nb);
	}
	if (w.len > r->cfg->max_message) {
		free(w.p);
		why = "its offer is larger than --max-message";
		goto out;
	}
	pthread_mutex_lock(&r->mu);
	s->state = SUB_SENT;
	pthread_cond_signal(&s->cv);   /* a staging thread may start */
	pthread_mutex_unlock(&r->mu);
	s->sent_ms = relay_now_ms();
	ret = conn_send(c, &w);
	if (ret)
		why = "send failed";
out:
	if (ret) {
		/* a send that failed closed c (conn_fail counted it), or c
		 * is lost (conns_lost closes it) */
		if (c->state != C_DEAD)
			r->m.serve_failed[c->lost != UCS_OK ? RS_PEER_LOST :
					  RS_NOT_OFFERED]++;
		log_warn("serving %s version %" PRIu64 " to %s: not offered: %s",
			 s->name, dlshare_bundle_version(b), c->peer, why);
		serve_release(r, s);
	}
	free(sp);
	free(reg_of);
	free(reg_addr);
	free(reg_len);
	return ret;
}

/* Sends the deletions the threads found (DELETED, to a peer of relay
 * protocol 1.7 or later; an older one keeps its copies), before the
 * offers: a name deleted and made again is deleted there first. */
static void dnotes_drain(struct relay *r)
{
	struct dnote *list, *d;

	pthread_mutex_lock(&r->mu);
	list = r->dnotes;
	r->dnotes = NULL;
	r->dnotes_tail = &r->dnotes;
	pthread_mutex_unlock(&r->mu);
	while ((d = list)) {
		struct conn *c = conn_by_id(r, d->conn_id);

		list = d->next;
		if (c && c->state == C_READY && c->peer_minor >= 7) {
			struct wbuf w;
			size_t nl = strlen(d->name);

			/* s->ndnotes goes down with the peer's
			 * DELETED_DONE (or s ends with c) */
			wbuf_start(&w, MSG_DELETED);
			wbuf_u32(&w, d->sub_id);
			wbuf_u16(&w, (uint16_t)nl);
			wbuf_bytes(&w, d->name, nl);
			conn_send(c, &w);
		} else {
			pthread_mutex_lock(&r->mu);
			d->s->ndnotes--;
			pthread_cond_signal(&d->s->cv);
			pthread_mutex_unlock(&r->mu);
		}
		free(d);
	}
}

/* Offers what the threads found. */
void serve_drain(struct relay *r)
{
	dnotes_drain(r);
	stage_drain(r);
	for (;;) {
		struct sub *s;
		struct conn *c;

		pthread_mutex_lock(&r->mu);
		s = r->ready;
		if (s) {
			r->ready = s->next_ready;
			s->next_ready = NULL;
		}
		pthread_mutex_unlock(&r->mu);
		if (!s)
			return;
		c = conn_by_id(r, s->conn_id);
		if (!c || c->state != C_READY) {
			serve_release(r, s);
			continue;
		}
		offer_send(r, c, s);
	}
}

/* A SUBSCRIBE beyond --max-subscriptions: logged, and said to a peer of
 * minor 7 (REFUSED); an older one is not told (it knows no such message). */
static void sub_refuse(struct relay *r, struct conn *c, uint32_t id,
		       uint16_t pl, const char *pfx)
{
	char why[128];
	struct wbuf w;
	int n;

	/* an honest relay asks at most RELAY_MAX_MIRROR prefixes of one
	 * peer: one that goes on asking is cut off, not logged on */
	if (++c->refused > RELAY_MAX_MIRROR) {
		conn_error(c, 4, "too many subscriptions");
		conn_fail(c, "more than %u subscriptions refused (--max-"
			  "subscriptions %u)", RELAY_MAX_MIRROR,
			  r->cfg->max_subscriptions);
		return;
	}
	n = snprintf(why, sizeof(why), "more than --max-subscriptions %u "
		     "prefixes", r->cfg->max_subscriptions);
	log_warn("peer %s%s%s: '%.*s' refused: %s", c->peer,
		 c->node[0] ? " node " : "", c->node, (int)pl, pfx, why);
	if (c->peer_minor < 7)
		return;
	wbuf_start(&w, MSG_REFUSED);
	wbuf_u32(&w, id);
	wbuf_u16(&w, (uint16_t)n);
	wbuf_bytes(&w, why, (size_t)n);
	conn_send(c, &w);
}

void serve_msg(struct relay *r, struct conn *c, uint16_t type,
		       struct rbuf *rb)
{
	uint8_t mac[SHA256_LEN];
	struct wbuf w;

	switch (c->state) {
	case C_HELLO: {
		uint16_t major, minor;
		const void *nonce;

		if (type != MSG_CHALLENGE)
			goto unexpected;
		major = rbuf_u16(rb);
		minor = rbuf_u16(rb);
		nonce = rbuf_bytes(rb, RELAY_NONCE_LEN);
		c->peer_minor = minor;
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		if (major != RELAY_PROTO_MAJOR) {
			conn_error(c, 3, "unsupported relay protocol major");
			conn_fail(c, "relay protocol %u, this relay speaks %u",
				  major, RELAY_PROTO_MAJOR);
			return;
		}
		memcpy(c->nonce_m, nonce, RELAY_NONCE_LEN);
		if (auth_random(c->nonce_s, RELAY_NONCE_LEN)) {
			conn_fail(c, "getrandom failed");
			return;
		}
		auth_proof(&r->key, "server", c->nonce_m, c->nonce_s, mac);
		wbuf_start(&w, MSG_PROOF_S);
		wbuf_u16(&w, RELAY_PROTO_MAJOR);
		wbuf_u16(&w, RELAY_PROTO_MINOR);
		wbuf_bytes(&w, c->nonce_s, RELAY_NONCE_LEN);
		wbuf_bytes(&w, mac, SHA256_LEN);
		if (!conn_send(c, &w))
			c->state = C_PROOF;
		return;
	}
	case C_PROOF: {
		const void *their;
		size_t nl = strlen(r->node);

		if (type != MSG_PROOF_M)
			goto unexpected;
		their = rbuf_bytes(rb, SHA256_LEN);
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		auth_proof(&r->key, "mirror", c->nonce_m, c->nonce_s, mac);
		if (mem_equal_ct(mac, their, SHA256_LEN)) {
			c->flush = true;
			conn_auth_failed(r, c, "wrong key");
			return;
		}
		c->state = C_READY;
		log_info("peer %s authenticated", c->peer);
		wbuf_start(&w, MSG_WELCOME);
		wbuf_u8(&w, (uint8_t)nl);
		wbuf_bytes(&w, r->node, nl);
		if (!conn_send(c, &w) && c->peer_minor >= 8)
			direct_caps_send(r, c);
		return;
	}
	case C_READY:
		break;
	case C_DEAD:
		return;
	}
	if (type == MSG_CAPS) {
		if (direct_caps_recv(r, c, rb))
			goto malformed;
		return;
	}
	if (type == MSG_SUBSCRIBE) {
		uint32_t id = rbuf_u32(rb);
		uint16_t pl = rbuf_u16(rb);
		const char *pfx = rbuf_bytes(rb, pl);
		struct sub *s;

		if (rb->bad || rbuf_left(rb) || !pl || pl > RELAY_PREFIX_MAX)
			goto malformed;
		if (c->nsubs >= r->cfg->max_subscriptions) {
			/* refused alone: the prefixes already followed keep
			 * being served */
			sub_refuse(r, c, id, pl, pfx);
			return;
		}
		for (s = c->subs; s; s = s->next)
			if (s->sub_id == id)
				goto malformed;
		s = calloc(1, sizeof(*s));
		if (!s) {
			conn_fail(c, "out of memory");
			return;
		}
		s->r = r;
		s->conn_id = c->id;
		s->sub_id = id;
		memcpy(s->prefix, pfx, pl);
		s->prefix[pl] = 0;
		s->state = SUB_SCAN;
		/* a mirror of minor >= 8 sent its CAPS before any SUBSCRIBE */
		s->direct = (direct_caps(r) & c->peer_caps & CAPS_DEVICE_GET) != 0;
		pthread_cond_init(&s->cv, NULL);
		pthread_cond_init(&s->hcv, NULL);
		pthread_mutex_init(&s->olock, NULL);
		if (pthread_create(&s->th, NULL, sub_thread, s)) {
			pthread_cond_destroy(&s->cv);
			pthread_cond_destroy(&s->hcv);
			pthread_mutex_destroy(&s->olock);
			free(s);
			conn_fail(c, "cannot start a thread");
			return;
		}
		s->next = c->subs;
		c->subs = s;
		c->nsubs++;
		log_info("peer %s follows '%s'", c->peer, s->prefix);
		return;
	}
	if (type == MSG_DONE) {
		uint64_t id = rbuf_u64(rb);
		uint32_t status = rbuf_u32(rb);
		struct sub *s;

		if (rb->bad || rbuf_left(rb) || status > DONE_FAILED)
			goto malformed;
		for (s = c->subs; s; s = s->next)
			if (s->offer_id == id && s->memh)
				break;
		if (!s)
			goto unexpected;
		if (status == DONE_FAILED)
			log_warn("peer %s could not mirror %s", c->peer, s->name);
		if (status == DONE_FAILED && !s->abort_sent)
			r->m.serve_failed[RS_PEER_FAILED]++;
		if (status == DONE_OK) {
			r->m.served++;
			r->m.served_bytes += s->offer_bytes;
			if (s->staged || s->direct_offer)
				r->m.device_versions[0][s->direct_offer]++;
		}
		s->offer_id = 0;
		serve_release(r, s);
		return;
	}
	if (type == MSG_DELETED_DONE) {
		uint32_t id = rbuf_u32(rb);
		struct sub *s;
		bool ok = false;

		if (rb->bad || rbuf_left(rb))
			goto malformed;
		for (s = c->subs; s; s = s->next)
			if (s->sub_id == id)
				break;
		if (s) {
			pthread_mutex_lock(&r->mu);
			if (s->ndnotes) {
				s->ndnotes--;
				pthread_cond_signal(&s->cv);
				ok = true;
			}
			pthread_mutex_unlock(&r->mu);
		}
		if (!ok)
			goto unexpected;
		return;
	}
	if (type == MSG_FREE) {
		uint64_t id = rbuf_u64(rb);
		uint32_t slot = rbuf_u32(rb);

		if (rb->bad || rbuf_left(rb) || stage_freed(r, c, id, slot))
			goto malformed;
		return;
	}
	if (type == MSG_ERROR) {
		conn_fail(c, "the peer sent an error");
		return;
	}
unexpected:
	conn_error(c, 1, "unexpected message");
	conn_fail(c, "unexpected message type %u", type);
	return;
malformed:
	conn_error(c, 1, "malformed message");
	conn_fail(c, "malformed message of type %u", type);
}
