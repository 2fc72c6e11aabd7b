/* queue — producers waiting for room in a queue name. */
#include "queue.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "create.h"
#include "reply.h"

/* The waiting creates of one name, oldest first. */
struct qwaitq {
	char name[CHECK_NAME_MAX + 1];
	struct qwait *waits;
	UT_hash_handle hh;        /* daemon->qwaiters */
};

/* A Create waiting for room. Its timer fires at the deadline, or at once
 * when woken (the name may have room). */
struct qwait {
	struct peer *peer;
	struct qwaitq *q;
	uint64_t req_id;
	Dlshare__Create *create;  /* a copy of the request */
	uint64_t deadline;        /* uv_now; UINT64_MAX: none */
	uint32_t timeout;         /* as asked */
	int woken;
	uv_timer_t timer;
	struct qwait *prev, *next;   /* peer->qwaits */
	struct qwait *wprev, *wnext; /* q->waits */
};

static void qwait_free_cb(uv_handle_t *h)
{
	struct qwait *w = h->data;

	if (w->create)
		dlshare__create__free_unpacked(w->create, NULL);
	free(w);
}

static void qwait_remove(struct daemon *d, struct qwait *w)
{
	struct qwaitq *q = w->q;

	DL_DELETE(w->peer->qwaits, w);
	w->peer->inflight--;
	DL_DELETE2(q->waits, w, wprev, wnext);
	if (!q->waits) {
		HASH_DEL(d->qwaiters, q);
		free(q);
	}
	d->nqwaiting--;
	uv_timer_stop(&w->timer);
	uv_close((uv_handle_t *)&w->timer, qwait_free_cb);
}

static void on_qwait_timer(uv_timer_t *t);

/* Wakes the first waiter of q not woken yet, if the name has room. */
static void wake_first(struct daemon *d, struct qwaitq *q)
{
	uint32_t depth;

	if (!q->waits || q->waits->woken ||
	    !registry_queue_room(&d->reg, q->name, &depth))
		return;
	q->waits->woken = 1;
	uv_timer_start(&q->waits->timer, on_qwait_timer, 0, 0);
}

static void on_qwait_timer(uv_timer_t *t)
{
	struct qwait *w = t->data;
	struct peer *peer = w->peer;
	struct daemon *d = peer->d;
	struct qwaitq *q = w->q;
	uint64_t now = uv_now(d->loop);
	uint32_t depth;
	char name[CHECK_NAME_MAX + 1];

	memcpy(name, q->name, sizeof(name));
	if (registry_queue_room(&d->reg, name, &depth) && w == q->waits) {
		Dlshare__Create *m = w->create;
		uint64_t id = w->req_id;
		uint64_t deadline = w->deadline;

		/* Runs as if it came now; w's copy lives until its timer
		 * handle is closed, after this. */
		w->create = NULL;
		qwait_remove(d, w);
		peer_answering(peer, METRICS_REQ_CREATE);
		create_resume(peer, id, m, deadline);
		peer_answering(peer, METRICS_REQ_OTHER);
		dlshare__create__free_unpacked(m, NULL);
		/* More room (a delete, several consumed at once): the next
		 * one too. q may be gone. */
		HASH_FIND_STR(d->qwaiters, name, q);
		if (q)
			wake_first(d, q);
		conn_reap(&d->conns);
		return;
	}
	w->woken = 0;
	if (w->deadline != UINT64_MAX && now >= w->deadline) {
		uint64_t id = w->req_id;
		uint32_t timeout = w->timeout;

		qwait_remove(d, w);
		peer_answering(peer, METRICS_REQ_CREATE);
		reply_queue_full(peer, id, "create", name, timeout);
		peer_answering(peer, METRICS_REQ_OTHER);
		HASH_FIND_STR(d->qwaiters, name, q);
		if (q)
			wake_first(d, q);
		conn_reap(&d->conns);
		return;
	}
	if (w->deadline != UINT64_MAX)
		uv_timer_start(&w->timer, on_qwait_timer, w->deadline - now, 0);
}

/* Parks m of peer behind the waiters of its name, until deadline (uv_now,
 * in the future; UINT64_MAX: none). Returns 0, -EDQUOT (the peer's
 * requests in flight) or -ENOMEM. */
static int qwait_park(struct peer *peer, uint64_t id, const Dlshare__Create *m,
		      uint64_t deadline)
{
	struct daemon *d = peer->d;
	struct qwaitq *q = NULL;
	struct qwait *w;
	uint8_t *packed;
	size_t len;

	if (peer->inflight >= d->limits->max_inflight)
		return -EDQUOT;
	w = calloc(1, sizeof(*w));
	len = dlshare__create__get_packed_size(m);
	packed = malloc(len ? len : 1);
	if (!w || !packed) {
		free(w);
		free(packed);
		return -ENOMEM;
	}
	/* The request's memory goes with its packet: keep a copy. */
	dlshare__create__pack(m, packed);
	w->create = dlshare__create__unpack(NULL, len, packed);
	free(packed);
	if (!w->create) {
		free(w);
		return -ENOMEM;
	}
	HASH_FIND_STR(d->qwaiters, m->name, q);
	if (!q) {
		q = calloc(1, sizeof(*q));
		if (!q) {
			dlshare__create__free_unpacked(w->create, NULL);
			free(w);
			return -ENOMEM;
		}
		memcpy(q->name, m->name, strlen(m->name) + 1);
		HASH_ADD_STR(d->qwaiters, name, q);
	}
	w->peer = peer;
	w->q = q;
	w->req_id = id;
	w->timeout = m->wait_ms;
	w->deadline = deadline;
	uv_timer_init(d->loop, &w->timer);
	w->timer.data = w;
	if (w->deadline != UINT64_MAX)
		uv_timer_start(&w->timer, on_qwait_timer,
			       deadline - uv_now(d->loop), 0);
	DL_APPEND(peer->qwaits, w);
	peer->inflight++;
	DL_APPEND2(q->waits, w, wprev, wnext);
	d->nqwaiting++;
	return 0;
}

/* queue_create_gate, for a wait that ends at deadline (uv_now). */
static int create_gate(struct peer *peer, uint64_t id,
		       const Dlshare__Create *m, uint64_t deadline)
{
	struct daemon *d = peer->d;
	struct qwaitq *q = NULL;
	uint32_t depth;
	int err;

	if (check_name(m->name))
		return 0; /* registry_add says what is wrong */
	HASH_FIND_STR(d->qwaiters, m->name, q);
	if (!q && registry_queue_room(&d->reg, m->name, &depth))
		return 0;
	if (!m->has_wait_ms || m->wait_ms == 0) {
		if (!q)
			return 0; /* registry_add refuses: full */
		reply_queue_full(peer, id, "create", m->name, 0);
		return 1;
	}
	/* Back from the thread pool after its wait ran out (create.c). */
	if (deadline != UINT64_MAX && uv_now(d->loop) >= deadline) {
		reply_queue_full(peer, id, "create", m->name, m->wait_ms);
		return 1;
	}
	err = qwait_park(peer, id, m, deadline);
	if (err == -EDQUOT)
		peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
	if (err == -EDQUOT)
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"create %s: the queue is full, and this connection has too many requests in flight to wait (limit %u)",
				m->name, d->limits->max_inflight);
	else if (err)
		reply_err(peer, id, err, "create", m->name);
	return 1;
}

int queue_create_gate(struct peer *peer, uint64_t id, const Dlshare__Create *m)
{
	return create_gate(peer, id, m, create_wait_deadline(peer->d, m));
}

void queue_create_full(struct peer *peer, uint64_t id,
		       const Dlshare__Create *m, uint64_t deadline)
{
	if (!create_gate(peer, id, m, deadline))
		create_resume(peer, id, m, deadline);
}

uint32_t queue_waiting(struct daemon *d, const char *name)
{
	struct qwaitq *q = NULL;
	struct qwait *w;
	uint32_t n = 0;

	HASH_FIND_STR(d->qwaiters, name, q);
	if (q)
		DL_FOREACH2(q->waits, w, wnext)
			n++;
	return n;
}

void queue_room(struct daemon *d, const char *name)
{
	struct qwaitq *q = NULL;

	HASH_FIND_STR(d->qwaiters, name, q);
	if (q)
		wake_first(d, q);
}

void queue_peer_closed(struct peer *peer)
{
	struct daemon *d = peer->d;

	while (peer->qwaits) {
		struct qwaitq *q = peer->qwaits->q;
		char name[CHECK_NAME_MAX + 1];
		int first = q->waits == peer->qwaits && peer->qwaits->woken;

		memcpy(name, q->name, sizeof(name));
		qwait_remove(d, peer->qwaits);
		/* A woken first waiter that goes passes its turn on. */
		if (first) {
			HASH_FIND_STR(d->qwaiters, name, q);
			if (q)
				wake_first(d, q);
		}
	}
}

void queue_deinit(struct daemon *d)
{
	struct qwaitq *q, *tmp;

	/* Conns are all closed, so every wait is gone; this is a backstop. */
	HASH_ITER(hh, d->qwaiters, q, tmp) {
		HASH_DEL(d->qwaiters, q);
		free(q);
	}
}
