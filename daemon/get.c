/* get — Get requests: answered at once, or parked until a version is
 * published or the timeout. */
#include "get.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "encode.h"
#include "reply.h"

/* A get waiting for a version that does not exist yet. */
struct park {
	struct peer *peer;
	struct waitq *q;
	uint64_t req_id;
	enum registry_select sel;
	uint64_t number;
	int take;                   /* a Take (queue names), not a Get */
	int mcache;                 /* the Get said manifest_cache (1.5) */
	uint32_t timeout;           /* as asked, for the timeout's message */
	int has_timer;
	uv_timer_t timer;
	struct park *prev, *next;   /* peer->parked */
	struct park *wprev, *wnext; /* q->parks */
};

/* The parked gets of one name (which may not exist yet). */
struct waitq {
	char name[CHECK_NAME_MAX + 1];
	struct park *parks;
	UT_hash_handle hh;
};

/* A GetReply's events per device, in the wire's terms. */
struct reply_events {
	Dlshare__DeviceEvent dev[REGISTRY_BUFFERS_HARD_MAX];
	Dlshare__DeviceEvent *devp[REGISTRY_BUFFERS_HARD_MAX];
};

/* Fills r, a reader's reply for v with lease, from w (v's encoding) and
 * ev; they live as long as r. */
static void get_reply_fill(Dlshare__GetReply *r, struct reply_events *ev,
			   struct encode_version *w, const struct version *v,
			   uint64_t lease)
{
	r->version = v->number;
	r->lease = lease;
	r->read_only = 1;
	if (w->has_manifest) {
		r->manifest = &w->manifest;
		r->has_manifest_tensors = 1;
		r->manifest_tensors = v->ntensors;
	} else {
		r->n_tensors = v->ntensors;
		r->tensors = w->tp;
	}
	r->n_buffers = v->nbuffers;
	r->buffers = w->bp;
	if (v->event_len) {
		r->has_event_handle = 1;
		r->event_handle.data = v->cold->event_handle;
		r->event_handle.len = v->event_len;
	}
	for (size_t i = 0; i < v->ndev_events; i++) {
		uint8_t *de = v->cold->dev_events + i * REGISTRY_DEV_EVENT_LEN;
		Dlshare__DeviceEvent *e = &ev->dev[i];

		dlshare__device_event__init(e);
		e->uuid.data = de;
		e->uuid.len = REGISTRY_UUID_LEN;
		e->handle.data = de + REGISTRY_UUID_LEN;
		e->handle.len = REGISTRY_HANDLE_MAX;
		ev->devp[i] = e;
	}
	r->n_device_events = v->ndev_events;
	r->device_events = ev->devp;
}

/* v's reply to a reader that needs no fd of it (all its buffers' and its
 * manifest's were sent before) is the same but for the request id and the
 * lease: its tail is packed at the first such get and kept with v (see
 * struct version). Returns it, or NULL when v keeps none (over
 * GET_TAIL_MAX bytes, or no memory for it now). */
static const uint8_t *get_tail_pack(struct version *v, size_t *len);

static const uint8_t *get_tail(struct version *v, size_t *len)
{
	if (v->reply_tail) {
		*len = v->reply_tail_len;
		return v->reply_tail;
	}
	if (v->reply_tail_len == REGISTRY_REPLY_TAIL_NONE ||
	    v->state != VERSION_SEALED)
		return NULL;
	return get_tail_pack(v, len);
}

/* get_tail's first time for v, out of line: a warm get of a kept tail
 * sets up none of its structures. */
static __attribute__((noinline)) const uint8_t *
get_tail_pack(struct version *v, size_t *len)
{
	Dlshare__GetReply r = DLSHARE__GET_REPLY__INIT;
	struct reply_events ev;
	struct encode_version w;
	uint8_t *tail;
	int err;

	/* No fd attached; a manifest by its id alone. */
	if (encode_version_init(&w, v, NULL, ENCODE_MANIFEST_KEPT))
		return NULL;
	get_reply_fill(&r, &ev, &w, v, 0);
	err = wire_get_reply_tail(&r, GET_TAIL_MAX, &tail, len);
	encode_version_deinit(&w);
	if (err == -ENOMEM)
		return NULL;
	if (err) { /* too long to keep (or not as expected): never again */
		v->reply_tail_len = REGISTRY_REPLY_TAIL_NONE;
		return NULL;
	}
	v->reply_tail = tail;
	v->reply_tail_len = (uint32_t)*len;
	return tail;
}

/* What a GetReply says of the version board (1.7): token 0 for nothing. */
struct get_board {
	uint32_t slot;
	uint64_t token;
};

/* Sends the reply to a get of v with lease from v's tail (get_tail).
 * Returns 0 when it did (or the connection failed doing it), 1 when v
 * keeps no tail. */
static int get_send_warm(struct peer *peer, uint64_t id, struct version *v,
			 uint64_t lease, const struct get_board *gb)
{
	uint8_t buf[GET_TAIL_MAX + WIRE_GET_REPLY_HEAD_MAX +
		    WIRE_GET_REPLY_BOARD_MAX];
	const uint8_t *tail;
	size_t tlen, len;

	tail = get_tail(v, &tlen);
	if (!tail)
		return 1;
	len = wire_pack_get_reply(id, v->number, lease, tail, tlen, gb->slot,
				  gb->token, buf, sizeof(buf));
	if (!len)
		return 1;
	conn_send_packed(&peer->conn, id, buf, len);
	return 0;
}

/* get_answer's reply encoded from v (the fds in attach, the manifest as
 * mmode says), with lease l (a take's with take): sent, and what it
 * attached recorded as sent to peer; on failure l is given back. */
static void get_send_encoded(struct peer *peer, uint64_t id,
			     struct version *v, struct lease *l, int take,
			     const int *attach, enum encode_manifest mmode,
			     const struct get_board *gb)
{
	struct daemon *d = peer->d;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__GetReply r = DLSHARE__GET_REPLY__INIT;
	struct reply_events ev;
	struct encode_version w;
	int err;

	if (encode_version_init(&w, v, attach, mmode)) {
		reply_err(peer, id, -ENOMEM, take ? "take" : "get",
			  v->entry->name);
		if (take)
			registry_queue_untake(&d->reg, &peer->owner, l);
		else
			registry_release(&d->reg, &peer->owner, l->id);
		return;
	}
	get_reply_fill(&r, &ev, &w, v, l->id);
	if (gb->token) {
		r.has_board_slot = r.has_board_token = 1;
		r.board_slot = gb->slot;
		r.board_token = gb->token;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_GET_REPLY;
	f.get_reply = &r;
	/* Sending frees no buffer; a failed send dooms c, after which its
	 * sent set no longer matters. */
	err = conn_send(&peer->conn, &f, w.fds, w.nfds);
	encode_version_deinit(&w);
	if (err || !conn_open(&peer->conn))
		return;
	for (size_t i = 0; i < v->nbuffers; i++)
		if (attach[i] && v->buffers[i]->fd >= 0 &&
		    peer_sent_add(peer, v->buffers[i]))
			return;
	if (v->manifest_fd >= 0 && mmode == ENCODE_MANIFEST_KEPT_FD)
		peer_sent_add(peer, &v->cold->mbuf);
}

/* Answers a get (or, with take, a Take) with v: takes a lease (the take
 * of v) and sends each buffer's fd the first time this peer needs it, and
 * so the manifest's when the Get said the peer keeps them (mcache, 1.5;
 * else the manifest's fd comes every time). */
static void get_answer(struct peer *peer, uint64_t id, struct version *v,
		       int take, int mcache)
{
	const char *what = take ? "take" : "get";
	struct daemon *d = peer->d;
	struct get_board gb = { 0, 0 };
	int attach[REGISTRY_BUFFERS_HARD_MAX];
	struct refusal why = { 0 };
	struct lease *l;
	int err;

	if (v->manifest_fd >= 0 && peer->minor < 4) {
		conn_send_error(&peer->conn, id, DLSHARE_ENOTSUP,
				"get %s: version %llu has %u tensors, described "
				"in a manifest memfd (protocol 1.4); this client "
				"speaks 1.%u", v->entry->name,
				(unsigned long long)v->number, v->ntensors,
				peer->minor);
		return;
	}
	/* A version with an event per device (1.4) cannot be waited for
	 * by a reader that knows one event only: refused, never handed
	 * over half-synchronised. */
	if (v->ndev_events && peer->minor < 4) {
		conn_send_error(&peer->conn, id, DLSHARE_EVERSION,
				"get %s: version %llu spans %u devices with an "
				"event each, which needs protocol 1.4 (this "
				"client speaks %u.%u)", v->entry->name,
				(unsigned long long)v->number,
				(unsigned)v->ndev_events, WIRE_PROTO_MAJOR,
				peer->minor);
		return;
	}
	unsigned nattach = 0;
	for (size_t i = 0; i < v->nbuffers; i++) {
		struct sent_buf *sb = NULL;

		HASH_FIND(hh, peer->sent, &v->buffers[i]->id, sizeof(uint64_t),
			  sb);
		attach[i] = !sb;
		nattach += attach[i] && v->buffers[i]->fd >= 0;
	}
	/* A manifest goes the way of a buffer to a peer that keeps it
	 * (1.5): a warm get of a 10^5-tensor version then costs no fd, and
	 * the reader no mapping or check. Others get it every time. */
	int mknown = 0;
	if (v->manifest_fd >= 0 && mcache) {
		struct sent_buf *sb = NULL;

		HASH_FIND(hh, peer->sent, &v->cold->mbuf.id, sizeof(uint64_t),
			  sb);
		mknown = sb != NULL;
	}
	nattach += v->manifest_fd >= 0 && !mknown;
	/* A peer that does not read its replies must not make the daemon
	 * hold fds for it without bound. */
	err = conn_may_queue_fds(&peer->conn, nattach, &why);
	if (!err)
		err = registry_lease(&d->reg, &peer->owner, v, &l, &why);
	if (err) {
		reply_err_why(peer, id, err, &why, what, v->entry->name);
		return;
	}
	if (take)
		registry_queue_take(&d->reg, l);
	/* The newest version, to a reader that keeps leases by the board
	 * (1.7): its name's token. */
	if (!take && peer->minor >= 7 && v->entry->latest == v &&
	    registry_board(&d->reg, v->entry, &gb.slot, &gb.token) == -ENOSPC)
		d->metrics.limits[METRICS_LIMIT_BOARD_SLOTS]++;
	/* A warm get (every fd sent before): from v's packed tail. */
	if (!nattach && !get_send_warm(peer, id, v, l->id, &gb))
		return;
	get_send_encoded(peer, id, v, l, take, attach,
			 !mcache ? ENCODE_MANIFEST_FD :
			 mknown ? ENCODE_MANIFEST_KEPT :
			 ENCODE_MANIFEST_KEPT_FD, &gb);
}

/* Says which version a get asked for: "the newest version", "version 7",
 * "a version newer than 7". */
static const char *get_wanted(enum registry_select sel, uint64_t number,
			      char *buf, size_t len)
{
	if (sel == REG_EXACT)
		snprintf(buf, len, "version %llu", (unsigned long long)number);
	else if (sel == REG_NEWER_THAN)
		snprintf(buf, len, "a version newer than %llu",
			 (unsigned long long)number);
	else
		snprintf(buf, len, "the newest version");
	return buf;
}

/* Says what the name holds instead, for a reader that may read it: "no
 * such name", "no version sealed yet", "version 3 was replaced or
 * deleted; the newest is 7", "the newest is 7". */
static void get_found_instead(struct daemon *d, const char *name,
			      enum registry_select sel, uint64_t number,
			      char *buf, size_t len)
{
	struct entry *e = registry_entry(&d->reg, name);
	uint64_t newest;

	if (!e) {
		snprintf(buf, len, "no such name");
		return;
	}
	if (!e->latest) {
		snprintf(buf, len, "no version sealed yet");
		return;
	}
	newest = e->latest->number;
	if (sel == REG_EXACT && number < newest)
		snprintf(buf, len, "version %llu was replaced or deleted; the "
			 "newest is %llu", (unsigned long long)number,
			 (unsigned long long)newest);
	else if (sel == REG_EXACT && number <= e->last_number)
		snprintf(buf, len, "version %llu is not sealed; the newest is "
			 "%llu", (unsigned long long)number,
			 (unsigned long long)newest);
	else if (sel == REG_EXACT)
		snprintf(buf, len, "version %llu was not published yet; the "
			 "newest is %llu", (unsigned long long)number,
			 (unsigned long long)newest);
	else
		snprintf(buf, len, "the newest is %llu",
			 (unsigned long long)newest);
}

/* Answers a get that found nothing (-ENOENT) or waited in vain
 * (-ETIMEDOUT) with what was asked and what there is. Only a peer that
 * may read the name gets here (registry_find says -EPERM first). */
static void get_missing(struct peer *peer, uint64_t id, int err,
			const char *name, enum registry_select sel,
			uint64_t number)
{
	char wanted[64], instead[128];

	get_wanted(sel, number, wanted, sizeof(wanted));
	get_found_instead(peer->d, name, sel, number, instead,
			  sizeof(instead));
	if (err == -ETIMEDOUT)
		conn_send_error(&peer->conn, id, DLSHARE_ETIMEDOUT,
				"get %s: timed out waiting for %s (%s)", name,
				wanted, instead);
	else if (sel == REG_LATEST || !registry_entry(&peer->d->reg, name))
		conn_send_error(&peer->conn, id, DLSHARE_ENOENT, "get %s: %s",
				name, instead);
	else
		conn_send_error(&peer->conn, id, DLSHARE_ENOENT,
				"get %s: no %s: %s", name, wanted, instead);
}

/* A get of a queue name: refused, take is how a queue is read. */
static void reply_not_plain(struct peer *peer, uint64_t id, const char *name)
{
	conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
			"get %s: the name is a queue: take its versions (dlshare_take, Client.take, dlsharectl take); get reads ordinary names only",
			name);
}

static void park_free_cb(uv_handle_t *h)
{
	free(h->data);
}

static void park_remove(struct daemon *d, struct park *p)
{
	struct waitq *q = p->q;

	DL_DELETE(p->peer->parked, p);
	p->peer->inflight--;
	DL_DELETE2(q->parks, p, wprev, wnext);
	if (!q->parks) {
		HASH_DEL(d->waiters, q);
		free(q);
	}
	d->nparked--;
	if (p->has_timer) {
		uv_timer_stop(&p->timer);
		uv_close((uv_handle_t *)&p->timer, park_free_cb);
	} else {
		free(p);
	}
}

static void on_park_timeout(uv_timer_t *t)
{
	struct park *p = t->data;
	struct peer *peer = p->peer;
	struct daemon *d = peer->d;
	uint64_t id = p->req_id;
	enum registry_select sel = p->sel;
	uint64_t number = p->number;
	char name[CHECK_NAME_MAX + 1];
	int take = p->take;
	uint32_t timeout = p->timeout;

	/* p and its wait queue go with park_remove. */
	memcpy(name, p->q->name, sizeof(name));
	park_remove(d, p);
	peer_answering(peer, take ? METRICS_REQ_TAKE : METRICS_REQ_GET);
	if (take)
		conn_send_error(&peer->conn, id, DLSHARE_ETIMEDOUT,
				"take %s: nothing queued within the timeout (%u ms)",
				name, (unsigned)timeout);
	else
		get_missing(peer, id, -ETIMEDOUT, name, sel, number);
	peer_answering(peer, METRICS_REQ_OTHER);
	conn_reap(&d->conns);
}

static int park(struct peer *peer, uint64_t id, const char *name,
		enum registry_select sel, uint64_t number, uint32_t timeout,
		int take, int mcache)
{
	struct daemon *d = peer->d;
	struct waitq *q = NULL;
	struct park *p;

	if (peer->inflight >= d->limits->max_inflight)
		return -EDQUOT;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	HASH_FIND_STR(d->waiters, name, q);
	if (!q) {
		q = calloc(1, sizeof(*q));
		if (!q) {
			free(p);
			return -ENOMEM;
		}
		memcpy(q->name, name, strlen(name) + 1);
		HASH_ADD_STR(d->waiters, name, q);
	}
	p->peer = peer;
	p->q = q;
	p->req_id = id;
	p->sel = sel;
	p->number = number;
	p->take = take;
	p->mcache = mcache;
	p->timeout = timeout;
	DL_APPEND(peer->parked, p);
	peer->inflight++;
	DL_APPEND2(q->parks, p, wprev, wnext);
	d->nparked++;
	if (timeout != UINT32_MAX) {
		p->has_timer = 1;
		uv_timer_init(d->loop, &p->timer);
		p->timer.data = p;
		uv_timer_start(&p->timer, on_park_timeout, timeout, 0);
	}
	return 0;
}

/* The name table's hash of a Get's name. The loop's memo keeps the last
 * Get body it decoded (wire_memo); a Get of the same bytes shares its
 * name, so the hash is computed once for all the Gets of one name in a
 * row, from any peer: ~120 instructions of each (SipHash). */
static unsigned get_name_hash(struct conn_set *set, const Dlshare__Get *m)
{
	struct wire_memo *mo = &set->memo;
	const Dlshare__Get *kept = mo->field == 18 ? mo->body : NULL;

	if (!kept || kept->name != m->name)
		return registry_name_hash(m->name);
	if (!mo->noted) {
		mo->note = registry_name_hash(m->name);
		mo->noted = 1;
	}
	return (unsigned)mo->note;
}

void get_request(struct peer *peer, uint64_t id, const Dlshare__Get *m)
{
	enum registry_select sel;
	struct version *v;
	int err;

	switch (m->select) {
	case DLSHARE__SELECT__SELECT_LATEST:
		sel = REG_LATEST;
		break;
	case DLSHARE__SELECT__SELECT_EXACT:
		sel = REG_EXACT;
		break;
	case DLSHARE__SELECT__SELECT_NEWER_THAN:
		sel = REG_NEWER_THAN;
		break;
	default:
		reply_err(peer, id, -EINVAL, "get (unknown selector)", m->name);
		return;
	}
	/* Every name in the registry passed check_name when it was made:
	 * a name found needs no check, one not found is checked before it
	 * is called missing. */
	if (!m->name) {
		reply_err(peer, id, -EINVAL, "get (invalid name)", NULL);
		return;
	}
	v = registry_find_hashed(&peer->d->reg, &peer->owner, m->name,
				 get_name_hash(peer->conn.set, m), sel,
				 m->version, &err);
	if (v) {
		get_answer(peer, id, v, 0, m->manifest_cache);
		return;
	}
	if (err == -ENOENT && check_name(m->name)) {
		reply_err(peer, id, -EINVAL, "get (invalid name)", NULL);
		return;
	}
	if (err == -EMEDIUMTYPE) {
		reply_not_plain(peer, id, m->name);
		return;
	}
	if (err == -ENOENT && m->timeout_ms > 0 && id != 0) {
		err = park(peer, id, m->name, sel, m->version, m->timeout_ms, 0,
			   m->manifest_cache);
		if (!err)
			return;
		if (err == -EDQUOT) {
			peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
			conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
					"get %s: too many waiting gets on this connection (limit %u)",
					m->name, peer->d->limits->max_inflight);
			return;
		}
	}
	if (err == -ENOENT)
		get_missing(peer, id, err, m->name, sel, m->version);
	else
		reply_err(peer, id, err, "get", m->name);
}

void take_request(struct peer *peer, uint64_t id, const Dlshare__Take *m)
{
	uint32_t timeout = m->has_timeout_ms ? m->timeout_ms : 0;
	struct waitq *q = NULL;
	struct park *p = NULL;
	struct version *v = NULL;
	int err = -ENOENT;

	if (check_name(m->name)) {
		reply_err(peer, id, -EINVAL, "take (invalid name)", NULL);
		return;
	}
	/* Takes parked on the name come first: a new take waits its turn. */
	HASH_FIND_STR(peer->d->waiters, m->name, q);
	if (q)
		DL_FOREACH2(q->parks, p, wnext)
			if (p->take)
				break;
	if (!p)
		v = registry_queue_head(&peer->d->reg, &peer->owner, m->name,
					&err);
	if (v) {
		get_answer(peer, id, v, 1, 0);
		return;
	}
	if (err == -EMEDIUMTYPE) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"take %s: not a queue name (create it with a queue depth; get reads an ordinary name)",
				m->name);
		return;
	}
	if (err == -ENOENT && timeout > 0) {
		err = park(peer, id, m->name, REG_LATEST, 0, timeout, 1, 0);
		if (!err)
			return;
		if (err == -EDQUOT) {
			peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
			conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
					"take %s: too many waiting requests on this connection (limit %u)",
					m->name, peer->d->limits->max_inflight);
			return;
		}
	}
	if (err == -ENOENT)
		conn_send_error(&peer->conn, id, DLSHARE_ENOENT,
				"take %s: %s", m->name,
				registry_entry(&peer->d->reg, m->name) ?
				"nothing queued" : "no such name");
	else
		reply_err(peer, id, err, "take", m->name);
}

void get_published(struct daemon *d, const struct entry *e)
{
	struct waitq *q = NULL;
	struct park *p, *tmp;

	HASH_FIND_STR(d->waiters, e->name, q);
	if (!q)
		return;
	/* Answering may empty and free q: iterate with a saved next, and stop
	 * once the last park took q with it. */
	DL_FOREACH_SAFE2(q->parks, p, tmp, wnext) {
		struct peer *peer = p->peer;
		uint64_t id = p->req_id;
		int last = !tmp, err;
		struct version *found;

		if (!conn_open(&peer->conn)) {
			if (last)
				break;
			continue;
		}
		if (p->take)
			found = registry_queue_head(&d->reg, &peer->owner,
						    e->name, &err);
		else
			found = registry_find(&d->reg, &peer->owner, e->name,
					      p->sel, p->number, &err);
		if (found || err != -ENOENT) {
			int take = p->take, p_mcache = p->mcache;

			park_remove(d, p);
			if (found)
				get_answer(peer, id, found, take, p_mcache);
			else if (err == -EMEDIUMTYPE && !take)
				reply_not_plain(peer, id, e->name);
			else {
				peer_answering(peer, take ? METRICS_REQ_TAKE :
					       METRICS_REQ_GET);
				reply_err(peer, id, err, take ? "take" : "get",
					  e->name);
				peer_answering(peer, METRICS_REQ_OTHER);
			}
		}
		if (last)
			break;
	}
}

void get_peer_closed(struct peer *peer)
{
	while (peer->parked)
		park_remove(peer->d, peer->parked);
}

void get_deinit(struct daemon *d)
{
	struct waitq *q, *tmp;

	/* Conns are all closed, so every park is gone; this is a backstop. */
	HASH_ITER(hh, d->waiters, q, tmp) {
		HASH_DEL(d->waiters, q);
		free(q);
	}
}
