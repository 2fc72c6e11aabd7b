/* watch — Watch requests: a log of changes by sequence number, walked from
 * a watcher's point on; parked watches woken by the change that concerns
 * them. */
#include "watch.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "reply.h"

/* The change log, d->wlog (oldest first), links a live name's last change
 * and the deletions still remembered. A live name's link is in its entry
 * (e->wl: no allocation of its own, its name and newest version are the
 * entry's) and moves to the end at each change; a deletion is a record of
 * its own (mark set), which keeps what deciding who may read it needs,
 * since the entry is gone. */
struct wdel {
	struct registry_link l;   /* mark: 1 */
	uint64_t version;         /* the newest sealed version then */
	uint32_t uid, gid;        /* the name's owner */
	uint16_t mode;            /* the name's mode */
	char name[];
};

static struct entry *link_entry(struct registry_link *l)
{
	return l->mark ? NULL :
	       (struct entry *)((char *)l - offsetof(struct entry, wl));
}

static struct wdel *link_del(struct registry_link *l)
{
	return l->mark ? (struct wdel *)l : NULL;
}

static const char *link_name(struct registry_link *l)
{
	return l->mark ? link_del(l)->name : link_entry(l)->name;
}

/* A live name's link moves at each seal of a newest version, which sets
 * last_sealed: the entry's is the version of its last change. */
static uint64_t link_version(struct registry_link *l)
{
	return l->mark ? link_del(l)->version : link_entry(l)->last_sealed;
}

/* A Watch waiting for a change. */
struct wpark {
	struct peer *peer;
	uint64_t req_id;
	uint64_t after;
	uint32_t max_names;
	int has_timer;
	uv_timer_t timer;
	struct wpark *prev, *next;   /* d->wparks */
	struct wpark *pprev, *pnext; /* peer->watches */
	char prefix[CHECK_NAME_MAX + 1];
};

/* Whether o may read a name of owner uid/gid and mode (registry_may's
 * rule, for a deletion whose entry is gone). */
static int may_read(const struct registry_owner *o, uint32_t uid,
		    uint32_t gid, unsigned mode)
{
	unsigned bits;

	if (o->uid == uid)
		bits = (mode >> 6) & 7;
	else if (o->gid == gid)
		bits = (mode >> 3) & 7;
	else
		bits = mode & 7;
	return (bits & 4) == 4;
}

static int node_visible(struct registry_link *n, const struct registry_owner *o)
{
	struct wdel *w = link_del(n);

	if (!w)
		return registry_may(link_entry(n), o, 4);
	return may_read(o, w->uid, w->gid, w->mode);
}

static int has_prefix(const char *name, const char *prefix)
{
	return strncmp(name, prefix, strlen(prefix)) == 0;
}

/* The first node changed after seq after, or NULL. Walks back from the
 * newest change: what it costs is the changes since after, which a
 * watcher that keeps up keeps small. */
static struct registry_link *log_after(struct daemon *d, uint64_t after)
{
	struct registry_link *n, *first = NULL;

	if (!d->wlog)
		return NULL;
	for (n = d->wlog->prev; n->seq > after; n = n->prev) {
		first = n;
		if (n == d->wlog)
			break;
	}
	return first;
}

/* Fills r with the changes under prefix after `after` that peer may read:
 * at most max names, and no more bytes than a packet takes. r->changes
 * points into cs (max entries). Returns the number reported. */
static size_t watch_collect(struct peer *peer, const char *prefix,
			    uint64_t after, uint32_t max,
			    Dlshare__WatchReply *r, Dlshare__WatchChange *cs,
			    Dlshare__WatchChange **csp)
{
	struct daemon *d = peer->d;
	/* the reply's room: the frame's own fields take little */
	size_t room = d->limits->max_packet > 1024 ?
		      d->limits->max_packet - 1024 : d->limits->max_packet / 2;
	size_t n = 0, bytes = 0;
	struct registry_link *w;

	r->seq = d->wseq;
	r->has_lost = 1;
	r->lost = after > d->wseq || (after && after < d->wfloor);
	if (after > d->wseq)
		after = 0;   /* another run's point: everything there is */
	for (w = log_after(d, after); w; w = w->next) {
		size_t len;

		const char *name = link_name(w);

		if (!has_prefix(name, prefix) ||
		    !node_visible(w, &peer->owner))
			continue;
		len = strlen(name) + 24;
		if (n == max || bytes + len > room) {
			/* everything before w was looked at */
			r->seq = w->prev->seq;
			r->has_more = 1;
			r->more = 1;
			break;
		}
		bytes += len;
		dlshare__watch_change__init(&cs[n]);
		cs[n].name = (char *)name;
		cs[n].version = link_version(w);
		if (w->mark) {
			cs[n].has_deleted = 1;
			cs[n].deleted = 1;
		}
		csp[n] = &cs[n];
		n++;
	}
	r->n_changes = n;
	r->changes = csp;
	return n;
}

/* Sends peer the changes after `after`; with only_if_any, nothing when
 * there are none. Returns 1 when it answered, 0 when not, or a negative
 * errno (nothing sent). */
static int watch_answer(struct peer *peer, uint64_t id, const char *prefix,
			uint64_t after, uint32_t max, int only_if_any)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__WatchReply r = DLSHARE__WATCH_REPLY__INIT;
	Dlshare__WatchChange *cs;
	Dlshare__WatchChange **csp;
	size_t n;

	cs = calloc(max, sizeof(*cs));
	csp = calloc(max, sizeof(*csp));
	if (!cs || !csp) {
		free(cs);
		free(csp);
		return -ENOMEM;
	}
	n = watch_collect(peer, prefix, after, max, &r, cs, csp);
	if (n || !only_if_any || r.lost) {
		f.body_case = DLSHARE__FRAME__BODY_WATCH_REPLY;
		f.watch_reply = &r;
		reply_send(peer, id, &f);
	}
	free(cs);
	free(csp);
	return n || !only_if_any || r.lost;
}

static void wpark_free_cb(uv_handle_t *h)
{
	free(h->data);
}

static void wpark_remove(struct daemon *d, struct wpark *p)
{
	DL_DELETE(d->wparks, p);
	DL_DELETE2(p->peer->watches, p, pprev, pnext);
	p->peer->inflight--;
	d->nparked--;
	if (p->has_timer) {
		uv_timer_stop(&p->timer);
		uv_close((uv_handle_t *)&p->timer, wpark_free_cb);
	} else {
		free(p);
	}
}

static void on_wpark_timeout(uv_timer_t *t)
{
	struct wpark *p = t->data;
	struct peer *peer = p->peer;
	struct daemon *d = peer->d;
	char prefix[CHECK_NAME_MAX + 1];
	uint64_t id = p->req_id, after = p->after;
	uint32_t max = p->max_names;

	memcpy(prefix, p->prefix, sizeof(prefix));
	wpark_remove(d, p);
	/* nothing it may see changed: an empty reply, its point moved on */
	if (watch_answer(peer, id, prefix, after, max, 0) < 0)
		reply_err(peer, id, -ENOMEM, "watch", prefix);
	conn_reap(&d->conns);
}

void watch_request(struct peer *peer, uint64_t id, const Dlshare__Watch *m)
{
	struct daemon *d = peer->d;
	const char *prefix = m->prefix ? m->prefix : "";
	uint32_t cap = d->limits->max_watch_names;
	uint32_t max = m->has_max_names && m->max_names &&
		       m->max_names < cap ? m->max_names : cap;
	uint32_t timeout = m->has_timeout_ms ? m->timeout_ms : 0;
	struct wpark *p;
	int err;

	if (*prefix && check_prefix(prefix)) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"watch %s: no name can start with this prefix",
				prefix);
		return;
	}
	err = watch_answer(peer, id, prefix, m->after, max, timeout > 0);
	if (err < 0) {
		reply_err(peer, id, err, "watch", prefix);
		return;
	}
	if (err)
		return;
	if (peer->inflight >= d->limits->max_inflight) {
		peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"watch %s: too many waiting requests on this "
				"connection (limit %u)", prefix,
				d->limits->max_inflight);
		return;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		reply_err(peer, id, -ENOMEM, "watch", prefix);
		return;
	}
	p->peer = peer;
	p->req_id = id;
	/* nothing it may see changed up to now: a later wakeup walks only
	 * what came after */
	p->after = d->wseq;
	p->max_names = max;
	memcpy(p->prefix, prefix, strlen(prefix) + 1);
	DL_APPEND(d->wparks, p);
	DL_APPEND2(peer->watches, p, pprev, pnext);
	peer->inflight++;
	d->nparked++;
	if (timeout != UINT32_MAX) {
		p->has_timer = 1;
		uv_timer_init(d->loop, &p->timer);
		p->timer.data = p;
		uv_timer_start(&p->timer, on_wpark_timeout, timeout, 0);
	}
}

/* Wakes the parked watches that n's change concerns. */
static void watch_wake(struct daemon *d, struct registry_link *n)
{
	struct wpark *p, *tmp;
	char name[CHECK_NAME_MAX + 1];

	/* n may go while answering (no: answering changes no registry
	 * state), but keep the name for safety of the prefix checks */
	memcpy(name, link_name(n), strlen(link_name(n)) + 1);
	DL_FOREACH_SAFE(d->wparks, p, tmp) {
		struct peer *peer = p->peer;
		char prefix[CHECK_NAME_MAX + 1];
		uint64_t id = p->req_id, after = p->after;
		uint32_t max = p->max_names;

		if (!conn_open(&peer->conn) || !has_prefix(name, p->prefix) ||
		    !node_visible(n, &peer->owner))
			continue;
		memcpy(prefix, p->prefix, sizeof(prefix));
		wpark_remove(d, p);
		peer_answering(peer, METRICS_REQ_OTHER);
		if (watch_answer(peer, id, prefix, after, max, 0) < 0)
			reply_err(peer, id, -ENOMEM, "watch", prefix);
	}
}

/* Forgets the oldest deletions past --watch-deletions. d->wdel_oldest
 * is the oldest deletion: a deletion's node never moves, so the next
 * oldest is the next deletion after it in the log. The live names walked
 * over to find it are older than every deletion left; one is walked over
 * again only after its next change moved it to the end, so a trim costs
 * O(1) amortised over the changes, not O(names). */
static void log_trim(struct daemon *d)
{
	while (d->wdeleted > d->limits->watch_deletions && d->wdel_oldest) {
		struct registry_link *n = d->wdel_oldest, *next = n->next;

		while (next && !next->mark)
			next = next->next;
		/* a watcher from before it can no longer be told */
		d->wfloor = n->seq;
		DL_DELETE(d->wlog, n);
		d->wdeleted--;
		d->wdel_oldest = next;
		free(link_del(n));
	}
}

void watch_published(struct daemon *d, struct entry *e)
{
	struct registry_link *n = &e->wl;

	if (e->detached)
		return;   /* a version put back in a deleted queue name */
	if (n->prev)
		DL_DELETE(d->wlog, n);
	n->seq = ++d->wseq;
	n->mark = 0;
	DL_APPEND(d->wlog, n);
	if (d->wparks)
		watch_wake(d, n);
}

void watch_removed(struct daemon *d, struct entry *e)
{
	size_t len = strlen(e->name);
	struct wdel *w;

	if (!e->wl.prev)
		return;   /* never sealed a version: nobody saw it */
	DL_DELETE(d->wlog, &e->wl);
	e->wl.prev = e->wl.next = NULL;
	w = calloc(1, sizeof(*w) + len + 1);
	if (!w) {
		/* The deletion cannot be told: every watcher from before it
		 * is told it lost changes (WatchReply.lost), and looks. */
		d->wfloor = ++d->wseq;
		return;
	}
	memcpy(w->name, e->name, len + 1);
	w->uid = e->owner_uid;
	w->gid = e->owner_gid;
	w->mode = e->mode;
	w->version = e->last_sealed;
	w->l.seq = ++d->wseq;
	w->l.mark = 1;
	DL_APPEND(d->wlog, &w->l);
	d->wdeleted++;
	if (!d->wdel_oldest)
		d->wdel_oldest = &w->l;
	if (d->wparks)
		watch_wake(d, &w->l);
	log_trim(d);
}

void watch_peer_closed(struct peer *peer)
{
	while (peer->watches)
		wpark_remove(peer->d, peer->watches);
}

void watch_deinit(struct daemon *d)
{
	struct registry_link *n, *tmp;

	DL_FOREACH_SAFE(d->wlog, n, tmp) {
		DL_DELETE(d->wlog, n);
		if (n->mark)
			free(link_del(n));
		else
			n->prev = n->next = NULL;
	}
	d->wdel_oldest = NULL;
}
