/* mirror — peers' names into this node: offers checked, versions created
 * on the daemon worker, pulled with one-sided gets, sealed or aborted. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- mirroring: pulls --------------------------------------------------------- */

static void send_done(struct conn *c, uint64_t offer_id, uint32_t status)
{
	struct wbuf w;

	wbuf_start(&w, MSG_DONE);
	wbuf_u64(&w, offer_id);
	wbuf_u32(&w, status);
	conn_send(c, &w);
}

static void pull_free(struct pull *p)
{
	uint32_t i;

	for (i = 0; p->regions && i < p->nregions; i++)
		if (p->regions[i].rkey)
			ucp_rkey_destroy(p->regions[i].rkey);
	free(p->regions);
	free(p->chunks);
	free(p->jobs);
	free(p->spec);
	free(p->shapes);
	free(p->toff);
	free(p->tlen);
	free(p->treg);
	free(p->keys);
	free(p->msg);
	free(p);
}

/* Hands p to the daemon worker (its state says what to do). */
static void pull_post(struct relay *r, struct pull *p)
{
	p->busy = true;
	pthread_mutex_lock(&r->mu);
	p->next_job = NULL;
	{
		struct pull **pp = &r->jobs;
		while (*pp)
			pp = &(*pp)->next_job;
		*pp = p;
	}
	pthread_cond_signal(&r->jobcv);
	pthread_mutex_unlock(&r->mu);
}

/* p has no get outstanding: seal it, or abort it, on the worker. */
void mirror_close(struct relay *r, struct pull *p)
{
	/* no get writes into the writer any more: its registration goes
	 * before the seal drops the mapping */
	direct_pull_unmap(r, p);
	p->st = P_CLOSING;
	pull_post(r, p);
}

static void last_error(char *buf, size_t len, const char *what, int err)
{
	snprintf(buf, len, "%s: %s", what, dlshare_last_error()[0] ?
		 dlshare_last_error() : dlshare_strerror(err));
}

/* Worker, p->busy: whether this node's daemon already has p's version
 * (or a newer one) of the same origin: the name's newest version was
 * mirrored from p's peer node, at an origin version >= the offered one.
 * A relay that restarted keeps no record of what it mirrored; the daemon
 * keeps the origin with each version (1.5), so nothing is pulled twice. */
static bool pull_have(struct relay *r, struct pull *p)
{
	dlshare_name_info info;

	if (!p->c->node[0] || dlshare_stat(r->dl, p->name, &info, NULL))
		return false;   /* no such name (or no answer): pull it */
	return info.latest && !strcmp(info.origin_node, p->c->node) &&
	       info.origin_version >= p->origin_version;
}

/* Worker, p->busy: every region of p came inline, so no get is needed:
 * the bytes are copied into the writer's mapping and the version sealed
 * (or aborted) here, without going back to the loop between the create
 * and the seal. p is left P_CLOSING, for mirror_done to finish. */
static void pull_inline(struct relay *r, struct pull *p)
{
	uint64_t one = 1;
	uint32_t i;
	int err;

	if (dlshare_writer_count(p->w) != p->ntensors) {
		snprintf(p->why, sizeof(p->why), "the writer has %zu tensors, "
			 "the offer %u", dlshare_writer_count(p->w), p->ntensors);
		p->failed = true;
	}
	for (i = 0; i < p->ntensors && !p->failed; i++) {
		DLTensor *t = dlshare_writer_tensor(p->w, i);

		if (!p->tlen[i])
			continue;
		memcpy((uint8_t *)t->data + t->byte_offset,
		       p->regions[p->treg[i]].data + p->toff[i], p->tlen[i]);
		p->bytes += p->tlen[i];
	}
	p->st = P_CLOSING;
	if (p->failed) {
		dlshare_writer_abort(p->w);
		p->w = NULL;
		return;
	}
	/* The bytes are here: the server's lease is no longer needed, so the
	 * loop answers DONE now (1.6), not after the seal, whose reply the
	 * daemon sends only after it woke this version's readers. The next
	 * offer of this prefix is then created after this seal (the worker
	 * runs jobs in order): at most two pulls a prefix. */
	pthread_mutex_lock(&r->mu);
	p->next_early = r->early;
	r->early = p;
	pthread_mutex_unlock(&r->mu);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the loop is awake anyway */
	}
	err = dlshare_seal(p->w, NULL, &p->sealed);
	p->w = NULL;
	if (err) {
		p->failed = true;
		last_error(p->why, sizeof(p->why), "seal", err);
	}
}

/* Worker, p->busy: a DELETED: deletes this node's copy of p->name when
 * its newest version came from p's peer node (a name made here, or
 * mirrored from another node, stays). p->why says what happened. */
static void pull_delete(struct relay *r, struct pull *p)
{
	dlshare_name_info info;
	int err;

	if (!p->c->node[0]) {
		snprintf(p->why, sizeof(p->why), "kept: the peer named no node");
		return;
	}
	err = dlshare_stat(r->dl, p->name, &info, NULL);
	if (err) {
		snprintf(p->why, sizeof(p->why), "nothing to delete (%s)",
			 dlshare_strerror(err));
		return;
	}
	if (strcmp(info.origin_node, p->c->node)) {
		snprintf(p->why, sizeof(p->why), "kept: its newest version "
			 "is %.40s%.40s, not from this peer",
			 info.origin_node[0] ? "from node " : "made here",
			 info.origin_node);
		return;
	}
	err = dlshare_delete(r->dl, p->name);
	if (err) {
		p->failed = true;
		last_error(p->why, sizeof(p->why), "delete", err);
		return;
	}
	snprintf(p->why, sizeof(p->why), "deleted (its origin version %"
		 PRIu64 " from node %s)", info.origin_version, p->c->node);
}

/* The daemon worker: runs blocking libdlshare calls of pulls. */
void *mirror_worker(void *arg)
{
	struct relay *r = arg;
	uint64_t one = 1;

	for (;;) {
		struct pull *p;
		int err;

		pthread_mutex_lock(&r->mu);
		while (!r->jobs && !r->worker_stop)
			pthread_cond_wait(&r->jobcv, &r->mu);
		p = r->jobs;
		if (!p) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		r->jobs = p->next_job;
		pthread_mutex_unlock(&r->mu);

		if (p->st == P_DELETING) {
			pull_delete(r, p);
		} else if (p->st == P_CREATING && p->check_origin &&
		    pull_have(r, p)) {
			p->skipped = true;
		} else if (p->st == P_CREATING) {
			dlshare_create_opts co = { 0 };

			co.device.device_type = kDLCPU;
			if ((p->staged || p->direct) && r->cfg->device >= 0) {
				/* --device cuda:N: a device version there */
				co.device.device_type = kDLCUDA;
				co.device.device_id = r->cfg->device;
			}
			co.mode = r->cfg->mode;
			/* stat on this node names where the version came from */
			co.origin_node = p->c->node[0] ? p->c->node : NULL;
			co.origin_version = co.origin_node ? p->origin_version : 0;
			err = dlshare_create(r->dl, p->name, p->spec, p->ntensors,
					     &co, &p->w);
			if (err) {
				p->w = NULL;
				p->failed = true;
				last_error(p->why, sizeof(p->why), "create", err);
			} else if (co.device.device_type == kDLCUDA &&
				   stage_mirror_setup(r, p)) {
				p->failed = true;
			} else if (p->all_inline) {
				pull_inline(r, p);
			}
		} else if (!p->failed && p->w) {
			/* device copies are ordered before the seal's event */
			err = dlshare_seal(p->w, p->mstream, &p->sealed);
			p->w = NULL;
			if (err) {
				p->failed = true;
				last_error(p->why, sizeof(p->why), "seal", err);
			}
			stage_mirror_teardown(p);
		} else if (p->w) {
			/* no copy may still write into what is aborted */
			stage_mirror_teardown(p);
			dlshare_writer_abort(p->w);
			p->w = NULL;
		} else {
			stage_mirror_teardown(p);
		}
		pthread_mutex_lock(&r->mu);
		p->next_job = r->done;
		r->done = p;
		pthread_mutex_unlock(&r->mu);
		if (write(r->evfd, &one, sizeof(one)) < 0) {
			/* the loop is awake anyway */
		}
	}
	return NULL;
}

static void pull_unlink(struct pull *p)
{
	struct pull **pp;

	for (pp = &p->c->pulls; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

static void pull_start(struct relay *r, struct pull *p);

/* What the worker finished. */
void mirror_done(struct relay *r)
{
	struct pull *list, *early, *p;

	/* both at once: a pull in list has its early notice in early, or
	 * in one taken before */
	pthread_mutex_lock(&r->mu);
	early = r->early;
	r->early = NULL;
	list = r->done;
	r->done = NULL;
	pthread_mutex_unlock(&r->mu);
	while ((p = early)) {
		early = p->next_early;
		p->released = true;
		if (p->c->state == C_READY)
			send_done(p->c, p->offer_id, DONE_OK);
	}
	while ((p = list)) {
		list = p->next_job;
		p->busy = false;
		if (p->st == P_DELETING) {
			pull_unlink(p);
			p->c->ndeleting--;
			if (p->c->state == C_READY) {
				struct wbuf w;

				wbuf_start(&w, MSG_DELETED_DONE);
				wbuf_u32(&w, p->sub_id);
				conn_send(p->c, &w);
			}
			if (p->failed)
				log_warn("mirror %s: deleted at node %s, but "
					 "not here: %s", p->name, p->c->node,
					 p->why);
			else
				log_info("mirror %s: deleted at node %s: %s",
					 p->name, p->c->node, p->why);
			pull_free(p);
			continue;
		}
		if (p->skipped) {
			pull_unlink(p);
			r->m.skipped++;
			nv_set(&r->known, p->name, p->origin_version);
			log_info("mirror %s: origin version %" PRIu64 " from %s is "
				 "here already; not pulled again", p->name,
				 p->origin_version, p->c->node);
			if (p->c->state == C_READY)
				send_done(p->c, p->offer_id, DONE_SKIPPED);
			pull_free(p);
			continue;
		}
		if (p->aborted[0] && !p->failed) {
			p->failed = true;   /* the origin's ABORT came meanwhile */
			snprintf(p->why, sizeof(p->why), "%s", p->aborted);
		}
		if (p->st == P_CREATING) {
			if (!p->failed && p->c->state == C_READY) {
				pull_start(r, p);
				continue;
			}
			mirror_close(r, p);   /* abort what was created */
			continue;
		}
		pull_unlink(p);
		if (p->failed) {
			r->m.mirror_failed[metrics_reason_of(p->why)]++;
			log_warn("mirror %s version %" PRIu64 " from %s: aborted, "
				 "nothing published: %s", p->name,
				 p->origin_version, p->c->peer, p->why);
		} else {
			r->m.mirrored++;
			r->m.pulled_bytes += p->bytes;
			if (p->staged || p->direct)
				r->m.device_versions[1][p->direct]++;
			nv_set(&r->known, p->name, p->origin_version);
			log_info("mirror %s: origin version %" PRIu64 " from %s is "
				 "local version %" PRIu64 " (%" PRIu64 " bytes%s)",
				 p->name, p->origin_version,
				 p->c->node[0] ? p->c->node : p->c->peer,
				 p->sealed, p->bytes,
				 p->all_inline ? ", in the offer" : "");
		}
		if (p->c->state == C_READY && !p->released)
			send_done(p->c, p->offer_id,
				  p->failed ? DONE_FAILED : DONE_OK);
		pull_free(p);
	}
}

static void get_cb(void *req, ucs_status_t st, void *user)
{
	struct pull *p = user;

	p->inflight--;
	p->c->r->inflight--;
	if (st != UCS_OK && !p->failed) {
		p->failed = true;
		snprintf(p->why, sizeof(p->why), "get: %s", ucs_status_string(st));
	}
	ucp_request_free(req);
}

/* Issues gets of p while the relay's limit allows. */
static void pull_pump(struct relay *r, struct pull *p)
{
	while (!p->failed && p->cur < p->njobs &&
	       r->inflight < r->cfg->max_inflight) {
		struct job *j = &p->jobs[p->cur];
		uint64_t len = j->len - p->cur_off;
		ucp_request_param_t rp = { 0 };
		ucs_status_ptr_t sp;

		if (len > r->cfg->chunk_size)
			len = r->cfg->chunk_size;
		rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				  UCP_OP_ATTR_FIELD_USER_DATA;
		rp.cb.send = get_cb;
		rp.user_data = p;
		if (p->wmemh) {
			/* into the writer's device buffer (direct.c) */
			rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH |
					   UCP_OP_ATTR_FIELD_MEMORY_TYPE;
			rp.memh = p->wmemh;
			rp.memory_type = r->dev_mem_type;
		}
		sp = ucp_get_nbx(p->c->ep, j->dst + p->cur_off, len,
				 j->src + p->cur_off, p->regions[j->region].rkey,
				 &rp);
		if (UCS_PTR_IS_ERR(sp)) {
			p->failed = true;
			snprintf(p->why, sizeof(p->why), "get: %s",
				 ucs_status_string(UCS_PTR_STATUS(sp)));
			break;
		}
		if (sp) {
			p->inflight++;
			r->inflight++;
		}
		p->cur_off += len;
		if (p->cur_off == j->len) {
			p->cur++;
			p->cur_off = 0;
		}
	}
}

/* Pumps every pull, finishes those that are done. */
void mirror_run(struct relay *r)
{
	struct conn *c;

	for (c = r->conns; c; c = c->next) {
		struct pull **pp = &c->pulls, *p;

		if (c->state != C_READY)
			continue;
		for (p = *pp; p; p = p->next) {
			if (p->busy || p->st != P_PULLING)
				continue;
			if (p->staged) {
				stage_pump(r, p);
				if (stage_idle(p) &&
				    (p->failed || p->got == p->stream_len))
					mirror_close(r, p);
				continue;
			}
			pull_pump(r, p);
			if (!p->inflight && (p->failed || p->cur == p->njobs))
				mirror_close(r, p);
		}
	}
}

/* The writer exists: unpack the rkeys, plan the gets, start pulling. */
static void pull_start(struct relay *r, struct pull *p)
{
	uint32_t i;

	p->st = P_PULLING;
	if (dlshare_writer_count(p->w) != p->ntensors) {
		snprintf(p->why, sizeof(p->why), "the writer has %zu tensors, "
			 "the offer %u", dlshare_writer_count(p->w), p->ntensors);
		p->failed = true;
	}
	for (i = 0; i < p->nregions && !p->failed; i++) {
		ucs_status_t st;

		if (p->regions[i].data)
			continue;
		st = ucp_ep_rkey_unpack(p->c->ep, p->regions[i].rkey_buf,
						     &p->regions[i].rkey);
		if (st != UCS_OK) {
			p->regions[i].rkey = NULL;
			p->failed = true;
			snprintf(p->why, sizeof(p->why), "rkey: %s",
				 ucs_status_string(st));
		}
		p->regions[i].rkey_buf = NULL;
	}
	if (p->staged) {
		/* the bytes come chunk by chunk (stage.c) */
		p->bytes = p->stream_len;
		return;
	}
	if (!p->failed && direct_pull_map(r, p))
		p->failed = true;
	/* Jobs: one per tensor, merged with the one before when both sides
	 * continue it across the same padding (the library lays bundles out
	 * alike on both nodes, so a state dict becomes a few large gets). */
	p->njobs = 0;
	for (i = 0; i < p->ntensors && !p->failed; i++) {
		DLTensor *t = dlshare_writer_tensor(p->w, i);
		uint64_t src, len = p->tlen[i];
		uint32_t reg = p->treg[i];
		uint8_t *dst;

		if (!len)
			continue;
		src = p->regions[reg].addr + p->toff[i];
		dst = (uint8_t *)t->data + t->byte_offset;
		p->bytes += len;
		if (p->regions[reg].data) {
			memcpy(dst, p->regions[reg].data + p->toff[i], len);
			continue;
		}
		if (p->njobs) {
			struct job *j = &p->jobs[p->njobs - 1];
			uint64_t send = j->src + j->len;
			uint8_t *dend = j->dst + j->len;

			if (j->region == reg && src >= send && dst >= dend &&
			    src - send == (uint64_t)(dst - dend) &&
			    src - send <= COALESCE_GAP) {
				j->len += (src - send) + len;
				continue;
			}
		}
		p->jobs[p->njobs++] = (struct job){ dst, src, len, reg };
	}
}

/* Takes an OFFER (msg, owned) from c. Returns 0, or -1 after failing c. */
static int offer_take(struct relay *r, struct conn *c, void *msg,
		      struct rbuf *rb, uint16_t type)
{
	bool staged = type == MSG_OFFER_STAGED;
	const struct relay_peer_cfg *pc = &r->cfg->peers[c->upstream];
	struct pull *p = calloc(1, sizeof(*p));
	dlshare_tensor_spec *spec = NULL;
	uint32_t *treg = NULL;
	uint64_t *toff = NULL, *tlen = NULL;
	int64_t *shapes = NULL;
	size_t ndims = 0;
	uint32_t ntensors, i, k;
	uint16_t nl;
	const char *name;
	uint64_t known;
	const char *bad = NULL;
	uint32_t ninline = 0;

	if (!p) {
		free(msg);
		conn_fail(c, "out of memory");
		return -1;
	}
	p->c = c;
	p->msg = msg;
	p->sub_id = rbuf_u32(rb);
	p->offer_id = rbuf_u64(rb);
	nl = rbuf_u16(rb);
	name = rbuf_bytes(rb, nl);
	p->origin_version = rbuf_u64(rb);
	p->nregions = rbuf_u32(rb);
	ntensors = rbuf_u32(rb);
	if (staged) {
		p->staged = true;
		p->nslots = rbuf_u32(rb);
		p->slot_size = rbuf_u32(rb);
	}
	if (rb->bad || !nl || nl > 255) {
		bad = "a malformed offer";
		goto proto;
	}
	p->direct = type == MSG_OFFER_DEVICE;
	if (p->direct && !(c->caps_sent & CAPS_DEVICE_GET)) {
		bad = "an offer of device memory, and this relay said it "
		      "cannot get device memory";
		goto proto;
	}
	if (staged && (p->nregions != 1 || !p->nslots ||
		       p->nslots > STAGE_SLOTS_MAX || !p->slot_size)) {
		bad = "a staged offer without one ring of at most 32 slots";
		goto proto;
	}
	memcpy(p->name, name, nl);
	p->name[nl] = 0;
	if (p->sub_id >= (uint32_t)pc->nprefix ||
	    strncmp(p->name, pc->prefix[p->sub_id], strlen(pc->prefix[p->sub_id]))) {
		bad = "an offer outside the prefixes this relay follows";
		goto proto;
	}
	for (struct pull *q = c->pulls; q; q = q->next)
		if (q->sub_id == p->sub_id && !q->released) {
			bad = "a second offer for one prefix before DONE";
			goto proto;
		}
	/* every region takes at least 20 bytes, every tensor 27: counts the
	 * message cannot hold are refused before anything is allocated */
	if (p->nregions > rbuf_left(rb) / 20 || ntensors > MAX_TENSORS ||
	    ntensors > rbuf_left(rb) / 27) {
		bad = "an offer whose counts exceed its size";
		goto proto;
	}
	p->regions = calloc(p->nregions ? p->nregions : 1, sizeof(*p->regions));
	spec = calloc(ntensors ? ntensors : 1, sizeof(*spec));
	treg = calloc(ntensors ? ntensors : 1, sizeof(*treg));
	toff = calloc(ntensors ? ntensors : 1, sizeof(*toff));
	tlen = calloc(ntensors ? ntensors : 1, sizeof(*tlen));
	/* every dimension takes 8 bytes of the message: what is left of it
	 * bounds them all, whatever the counts say */
	shapes = calloc(rbuf_left(rb) / 8 + 1, sizeof(*shapes));
	p->jobs = calloc(ntensors ? ntensors : 1, sizeof(*p->jobs));
	if (staged) {
		p->chunks = calloc(p->nslots, sizeof(*p->chunks));
		for (i = 0; p->chunks && i < p->nslots; i++)
			p->chunks[i].p = p;
	}
	if (!p->regions || !spec || !treg || !toff || !tlen || !shapes ||
	    !p->jobs || (staged && !p->chunks)) {
		pull_free(p);
		p = NULL;
		conn_fail(c, "out of memory for an offer of %u tensors", ntensors);
		goto out;
	}
	for (i = 0; i < p->nregions; i++) {
		struct region *g = &p->regions[i];

		g->addr = rbuf_u64(rb);
		g->len = rbuf_u64(rb);
		g->rkey_len = rbuf_u32(rb);
		if (!rb->bad && !g->rkey_len && p->direct) {
			bad = "an inline region in an offer of device memory";
			goto proto;
		}
		if (!rb->bad && !g->rkey_len) {
			/* inline (1.6): the region's bytes follow */
			if (g->len > rbuf_left(rb)) {
				bad = "an inline region longer than its offer";
				goto proto;
			}
			g->data = rbuf_bytes(rb, (size_t)g->len);
			ninline++;
		} else {
			g->rkey_buf = rbuf_bytes(rb, g->rkey_len);
		}
		if (rb->bad || g->addr + g->len < g->addr) {
			bad = "a malformed region";
			goto proto;
		}
		if (staged && g->len != (uint64_t)p->nslots * p->slot_size) {
			bad = "a staged offer whose ring is not its slots";
			goto proto;
		}
	}
	for (i = 0; i < ntensors; i++) {
		uint16_t kl = rbuf_u16(rb);
		const char *key = rbuf_bytes(rb, kl);
		DLTensor t = { 0 };
		uint64_t nb;

		spec[i].dtype.code = rbuf_u8(rb);
		spec[i].dtype.bits = rbuf_u8(rb);
		spec[i].dtype.lanes = rbuf_u16(rb);
		spec[i].ndim = rbuf_u8(rb);
		if (rb->bad || spec[i].ndim > MAX_NDIM) {
			bad = "a malformed tensor";
			goto proto;
		}
		if ((size_t)spec[i].ndim > rbuf_left(rb) / 8) {
			bad = "a malformed tensor";
			goto proto;
		}
		spec[i].shape = &shapes[ndims];
		for (k = 0; k < (uint32_t)spec[i].ndim; k++)
			shapes[ndims++] = (int64_t)rbuf_u64(rb);
		treg[i] = rbuf_u32(rb);
		toff[i] = rbuf_u64(rb);
		tlen[i] = rbuf_u64(rb);
		if (rb->bad) {
			bad = "a malformed tensor";
			goto proto;
		}
		/* keys point into msg, not NUL-ended: copied below */
		spec[i].key = key;
		t.dtype = spec[i].dtype;
		t.ndim = spec[i].ndim;
		t.shape = (int64_t *)spec[i].shape;
		if (dlshare_tensor_nbytes(&t, &nb) || nb != tlen[i]) {
			bad = "a tensor whose size does not match its shape";
			goto proto;
		}
		if (staged && nb) {
			/* stream order: each tensor right after the last */
			if (treg[i] != 0 || toff[i] != p->stream_len) {
				bad = "a staged tensor out of stream order";
				goto proto;
			}
			p->stream_len += nb;
		} else if (nb && (treg[i] >= p->nregions ||
				  toff[i] > p->regions[treg[i]].len ||
				  p->regions[treg[i]].len - toff[i] < nb)) {
			bad = "a tensor outside its region";
			goto proto;
		}
		/* the key's length, until the jobs are made */
		p->jobs[i].len = kl;
	}
	if (rbuf_left(rb)) {
		bad = "trailing bytes after an offer";
		goto proto;
	}
	/* NUL-ended keys */
	{
		size_t total = 0;
		char *keys, *q;

		for (i = 0; i < ntensors; i++)
			total += p->jobs[i].len + 1;
		keys = malloc(total ? total : 1);
		if (!keys) {
			pull_free(p);
			p = NULL;
			conn_fail(c, "out of memory");
			goto out;
		}
		for (q = keys, i = 0; i < ntensors; i++) {
			memcpy(q, spec[i].key, p->jobs[i].len);
			q[p->jobs[i].len] = 0;
			spec[i].key = q;
			q += p->jobs[i].len + 1;
		}
		p->keys = keys;
	}

	known = nv_get(r->known, p->name);
	if (known >= p->origin_version) {
		r->m.skipped++;
		send_done(c, p->offer_id, DONE_SKIPPED);
		pull_free(p);
		p = NULL;
		goto out;
	}
	/* no record (a restarted relay): the worker asks the daemon what
	 * the name's newest version came from before it creates one */
	p->check_origin = !known;
	p->spec = spec;
	p->shapes = shapes;
	p->toff = toff;
	p->tlen = tlen;
	p->treg = treg;
	p->ntensors = ntensors;
	p->all_inline = ninline == p->nregions;
	spec = NULL;
	shapes = NULL;
	toff = tlen = NULL;
	treg = NULL;
	p->st = P_CREATING;
	p->next = c->pulls;
	c->pulls = p;
	pull_post(r, p);
	p = NULL;
out:
	free(spec);
	free(treg);
	free(toff);
	free(tlen);
	free(shapes);
	return 0;
proto:
	pull_free(p);
	free(spec);
	free(treg);
	free(toff);
	free(tlen);
	free(shapes);
	conn_error(c, 1, bad);
	conn_fail(c, "%s", bad);
	return -1;
}

void mirror_refused(struct relay *r, struct conn *c, struct rbuf *rb)
{
	const struct relay_peer_cfg *pc = &r->cfg->peers[c->upstream];
	uint32_t id = rbuf_u32(rb);
	uint16_t n = rbuf_u16(rb);
	const char *t = rbuf_bytes(rb, n);
	char why[160];

	if (rb->bad || rbuf_left(rb) || n > 512 ||
	    id >= (uint32_t)pc->nprefix) {
		conn_error(c, 1, "a malformed refusal");
		conn_fail(c, "a malformed refusal");
		return;
	}
	msg_printable(why, sizeof(why), t, n);
	log_err("mirror '%s' from %s: refused by the peer: %s; the other "
		"prefixes are followed", pc->prefix[id],
		c->node[0] ? c->node : c->peer, why);
}

void mirror_msg(struct relay *r, struct conn *c, uint16_t type,
		       struct rbuf *rb, struct inmsg **msg)
{
	const struct relay_peer_cfg *pc = &r->cfg->peers[c->upstream];
	uint8_t mac[SHA256_LEN];
	struct wbuf w;
	int i;

	if (type == MSG_ERROR) {
		uint32_t code = rbuf_u32(rb);
		uint16_t n = rbuf_u16(rb);
		const char *t = rbuf_bytes(rb, n);

		if (code == 2 && c->state != C_READY) {
			conn_auth_failed(r, c, "the peer refused our key");
			return;
		}
		conn_fail(c, "the peer says: %.*s", t ? (int)n : 0, t ? t : "");
		return;
	}
	switch (c->state) {
	case C_HELLO: {
		const void *nonce, *theirs;
		uint16_t major;
		int bad;

		if (type != MSG_PROOF_S)
			goto unexpected;
		major = rbuf_u16(rb);
		c->peer_minor = rbuf_u16(rb);
		nonce = rbuf_bytes(rb, RELAY_NONCE_LEN);
		theirs = rbuf_bytes(rb, SHA256_LEN);
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		if (major != RELAY_PROTO_MAJOR) {
			conn_fail(c, "relay protocol %u, this relay speaks %u",
				  major, RELAY_PROTO_MAJOR);
			return;
		}
		memcpy(c->nonce_s, nonce, RELAY_NONCE_LEN);
		auth_proof(&r->key, "server", c->nonce_m, c->nonce_s, mac);
		bad = mem_equal_ct(mac, theirs, SHA256_LEN);
		/* Our proof goes out either way, so that a server with another
		 * key logs the refusal too; it is bound to our fresh nonce and
		 * to the role, so a false server gains nothing by it. */
		auth_proof(&r->key, "mirror", c->nonce_m, c->nonce_s, mac);
		wbuf_start(&w, MSG_PROOF_M);
		wbuf_bytes(&w, mac, SHA256_LEN);
		if (conn_send(c, &w))
			return;
		if (bad) {
			c->flush = true;
			conn_auth_failed(r, c, "the server does not know our key");
			return;
		}
		c->state = C_PROOF;
		return;
	}
	case C_PROOF: {
		uint8_t nl;
		const char *node;

		if (type != MSG_WELCOME)
			goto unexpected;
		nl = rbuf_u8(rb);
		node = rbuf_bytes(rb, nl);
		if (rb->bad || rbuf_left(rb) || nl > RELAY_NODE_MAX)
			goto malformed;
		memcpy(c->node, node, nl);
		c->node[nl] = 0;
		c->state = C_READY;
		r->up[c->upstream].backoff_ms = BACKOFF_MIN_MS;
		r->up[c->upstream].warned = false;
		log_info("connected to %s (node %s)", c->peer, c->node);
		/* before the SUBSCRIBEs: the server decides with it how the
		 * subscriptions' device versions travel */
		if (c->peer_minor >= 8)
			direct_caps_send(r, c);
		for (i = 0; i < pc->nprefix; i++) {
			size_t pl = strlen(pc->prefix[i]);

			wbuf_start(&w, MSG_SUBSCRIBE);
			wbuf_u32(&w, (uint32_t)i);
			wbuf_u16(&w, (uint16_t)pl);
			wbuf_bytes(&w, pc->prefix[i], pl);
			if (conn_send(c, &w))
				return;
		}
		return;
	}
	case C_READY:
		break;
	case C_DEAD:
		return;
	}
	if (type == MSG_OFFER || type == MSG_OFFER_STAGED ||
	    type == MSG_OFFER_DEVICE) {
		struct inmsg *m = *msg;

		*msg = NULL;
		offer_take(r, c, m, rb, type);
		return;
	}
	if (type == MSG_CAPS) {
		if (direct_caps_recv(r, c, rb))
			goto malformed;
		return;
	}
	if (type == MSG_CHUNK) {
		stage_chunk(r, c, rb);
		return;
	}
	if (type == MSG_ABORT) {
		stage_aborted(r, c, rb);
		return;
	}
	if (type == MSG_REFUSED) {
		mirror_refused(r, c, rb);
		return;
	}
	if (type == MSG_DELETED) {
		uint32_t sub = rbuf_u32(rb);
		uint16_t nl = rbuf_u16(rb);
		const char *name = rbuf_bytes(rb, nl);
		struct pull *p;

		if (rb->bad || rbuf_left(rb) || !nl || nl > 255 ||
		    sub >= (uint32_t)pc->nprefix || memchr(name, 0, nl))
			goto malformed;
		if (nl < strlen(pc->prefix[sub]) ||
		    memcmp(name, pc->prefix[sub], strlen(pc->prefix[sub]))) {
			conn_error(c, 1, "a deletion outside the prefix");
			conn_fail(c, "DELETED of a name outside '%s'",
				  pc->prefix[sub]);
			return;
		}
		/* the server waits for DELETED_DONE at DNOTE_MAX a
		 * subscription: more is a peer that does not */
		if (c->ndeleting >= DNOTE_MAX * (unsigned)pc->nprefix) {
			conn_error(c, 1, "too many deletions unanswered");
			conn_fail(c, "more than %u DELETED unanswered",
				  DNOTE_MAX * (unsigned)pc->nprefix);
			return;
		}
		p = calloc(1, sizeof(*p));
		if (!p) {
			conn_fail(c, "out of memory");
			return;
		}
		c->ndeleting++;
		p->c = c;
		p->sub_id = sub;
		memcpy(p->name, name, nl);
		p->name[nl] = 0;
		/* numbers start at 1 again if the origin makes the name
		 * anew: an offer after this one is not "had already" (the
		 * worker stats the name after deleting it) */
		nv_set(&r->known, p->name, 0);
		p->st = P_DELETING;
		p->next = c->pulls;
		c->pulls = p;
		/* after the creates and seals posted before it */
		pull_post(r, p);
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
