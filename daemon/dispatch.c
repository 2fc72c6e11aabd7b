/* dispatch — requests to their handlers; Hello, Publish, Abort, Release,
 * Delete, Stat, Stats and Goodbye; the registry's and the conns' callbacks. */
#include "dispatch.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "create.h"
#include "mcheck.h"
#include "encode.h"
#include "expire.h"
#include "get.h"
#include "list.h"
#include "log.h"
#include "peer.h"
#include "queue.h"
#include "reply.h"
#include "seal.h"
#include "stats.h"
#include "watch.h"
#include "chan.h"
#include "check.h"

/* ---- requests ----------------------------------------------------------- */

/* 1.9: the connection's request channel (conn_chan_open). */
static void handle_channel(struct peer *peer, uint64_t id)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__ChannelReply r = DLSHARE__CHANNEL_REPLY__INIT;
	int fds[2], err;

	if (!peer->d->limits->channel) {
		conn_send_error(&peer->conn, id, DLSHARE_ENOTSUP, "request "
				"channels are off (--channel 0, or a kernel "
				"before Linux 5.12)");
		return;
	}
	if (peer->conn.chan) {
		conn_send_error(&peer->conn, id, DLSHARE_ESTATE, "this "
				"connection has its request channel");
		return;
	}
	err = conn_chan_open(&peer->conn, &fds[0], &fds[1]);
	if (err) {
		conn_send_error(&peer->conn, id, err == -ENOMEM ?
				DLSHARE_ENOMEM : err == -EMFILE ||
				err == -ENFILE ? DLSHARE_ELIMIT : DLSHARE_EIO,
				"no request channel: %s", strerror(-err));
		return;
	}
	r.bytes = CHAN_BYTES;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_CHANNEL_REPLY;
	f.channel_reply = &r;
	conn_send(&peer->conn, &f, fds, 2);
	/* conn_send dup'd what it queued; the eventfd is the conn's. */
	close(fds[0]);
}

static void handle_hello(struct peer *peer, uint64_t id,
			 const Dlshare__Hello *h)
{
	const struct daemon *d = peer->d;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__HelloReply r = DLSHARE__HELLO_REPLY__INIT;

	if (peer->conn.hello) {
		conn_send_error(&peer->conn, id, DLSHARE_EPROTO,
				"Hello sent twice");
		conn_fail(&peer->conn, "Hello sent twice");
		return;
	}
	if (h->major != WIRE_PROTO_MAJOR) {
		conn_send_error(&peer->conn, id, DLSHARE_EVERSION,
				"protocol %u.%u not supported; this daemon speaks %u.%u",
				h->major, h->minor, WIRE_PROTO_MAJOR,
				WIRE_PROTO_MINOR);
		conn_fail(&peer->conn, "unsupported protocol major");
		return;
	}
	peer->conn.hello = 1;
	peer->minor = h->minor;
	log_debug("conn %llu: hello from %s, protocol %u.%u",
		  (unsigned long long)peer->conn.id, h->agent ? h->agent : "?",
		  h->major, h->minor);
	r.major = WIRE_PROTO_MAJOR;
	r.minor = WIRE_PROTO_MINOR;
	r.server = "dlshared " DLSHARE_VERSION_STRING;
	r.max_packet = d->limits->max_packet;
	r.max_fds = d->limits->max_fds;
	r.max_inflight = d->limits->max_inflight;
	r.max_tensors = d->reg.limits.max_tensors;
	r.max_buffers = d->reg.limits.max_buffers;
	r.has_max_manifest_bytes = 1;
	r.max_manifest_bytes = d->reg.limits.uid_manifest_bytes;
	r.has_max_ttl_ms = 1;
	r.max_ttl_ms = d->reg.limits.max_ttl_ms;
	r.has_default_ttl_ms = 1;
	r.default_ttl_ms = d->reg.limits.default_ttl_ms;
	r.has_max_queue_depth = 1;
	r.max_queue_depth = d->reg.limits.max_queue_depth;
	f.body_case = DLSHARE__FRAME__BODY_HELLO_REPLY;
	f.hello_reply = &r;
	/* 1.7: the version board, to a reader that knows it. */
	if (h->minor >= 7 && d->board.ro_fd >= 0) {
		r.has_board_slots = 1;
		r.board_slots = d->board.nslots;
		f.id = id;
		conn_send(&peer->conn, &f, &d->board.ro_fd, 1);
		return;
	}
	reply_send(peer, id, &f);
}

/* The write seal may wait on pinned pages: daemon/seal.c does it off the
 * loop and answers. */
static void handle_seal(struct peer *peer, uint64_t id, const Dlshare__Seal *m)
{
	seal_request(peer, id, m);
}

static void handle_abort(struct peer *peer, uint64_t id,
			 const Dlshare__Abort *m)
{
	uint64_t writer = m->has_writer ? m->writer : 0;
	int err = registry_abort(&peer->d->reg, &peer->owner, m->name,
				 m->version, writer);

	if (err == -ENOENT)
		reply_no_pending(peer, id, "abort", m->name, m->version,
				 writer);
	else if (err)
		reply_err(peer, id, err, "abort", m->name);
	else
		reply_ok(peer, id);
}

static void handle_publish(struct peer *peer, const Dlshare__Frame *f,
			   int *fds, unsigned nfds,
			   struct registry_manifest *manifest)
{
	const Dlshare__Publish *m = f->publish;
	struct registry_spec spec = {
		.manifest = manifest,
		.name = m->name, .mode = m->mode,
		.owned = m->has_owned && m->owned,
		.ttl_ms = m->has_ttl_ms ? m->ttl_ms : 0,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.event_handle = m->has_event_handle ? m->event_handle.data : NULL,
		.event_len = m->has_event_handle ? m->event_handle.len : 0,
		.dev_events = m->device_events,
		.ndev_events = m->n_device_events,
		.queue = m->has_queue_depth,
		.queue_depth = m->queue_depth,
		.origin_node = m->origin_node,
		.origin_version = m->has_origin_version ? m->origin_version : 0,
	};
	Dlshare__Frame out = DLSHARE__FRAME__INIT;
	Dlshare__PublishReply r = DLSHARE__PUBLISH_REPLY__INIT;
	int bfds[REGISTRY_BUFFERS_HARD_MAX];
	struct refusal why = { 0 };
	struct version *v;
	unsigned k = 0;
	int err;

	if (m->n_buffers > REGISTRY_BUFFERS_HARD_MAX) {
		daemon_drop_fds(peer->d, fds, nfds);
		reply_limit(peer, f->id, -E2BIG, METRICS_LIMIT_MAX_TENSORS,
			    "publish", m->name);
		return;
	}
	if (reply_refuse_same_keys(peer, f->id, "publish", m->name, m->tensors,
			     m->n_tensors)) {
		daemon_drop_fds(peer->d, fds, nfds);
		return;
	}
	/* The packet's fds belong to the buffers that say fd_attached, in
	 * order; every other count is a lie. */
	unsigned claimed = 0;
	for (size_t i = 0; i < m->n_buffers; i++) {
		bfds[i] = -1;
		if (m->buffers[i]->fd_attached)
			claimed++;
	}
	if (claimed != nfds) {
		daemon_drop_fds(peer->d, fds, nfds);
		reply_err(peer, f->id, -EINVAL,
			  "publish (fds do not match buffers)", m->name);
		return;
	}
	for (size_t i = 0; i < m->n_buffers; i++)
		if (m->buffers[i]->fd_attached) {
			bfds[i] = fds[k];
			fds[k++] = -1;
		}
	spec.fds = bfds;
	if (reply_fits(peer, f))
		err = registry_add(&peer->d->reg, &peer->owner, &spec, 1, &v,
				   &why);
	else {
		why.limit = METRICS_LIMIT_MAX_PACKET;
		err = -EMSGSIZE;
	}
	/* Not taken: failure. */
	daemon_drop_fds(peer->d, bfds, (unsigned)m->n_buffers);
	/* An export never waits for room (it would hold the peer's fds
	 * while parked): a full queue refuses it at once. */
	if (err == -EAGAIN) {
		reply_queue_full(peer, f->id, "publish", m->name, 0);
		return;
	}
	if (err) {
		reply_err_why(peer, f->id, err, &why, "publish", m->name);
		return;
	}
	r.version = v->number;
	out.body_case = DLSHARE__FRAME__BODY_PUBLISH_REPLY;
	out.publish_reply = &r;
	reply_send(peer, f->id, &out);
}

/* Drops c's leases ids (a Release, or Frame.releases). Returns how many
 * were unknown, after logging them. */
static size_t release_leases(struct peer *peer, const uint64_t *ids, size_t n)
{
	size_t unknown = 0;

	for (size_t i = 0; i < n; i++)
		if (registry_release(&peer->d->reg, &peer->owner, ids[i]))
			unknown++;
	if (unknown)
		log_info("conn %llu: release of %zu unknown lease(s)",
			 (unsigned long long)peer->conn.id, unknown);
	return unknown;
}

static void handle_release(struct peer *peer, uint64_t id,
			   const Dlshare__Release *m)
{
	size_t unknown = release_leases(peer, m->leases, m->n_leases);

	if (unknown) {
		if (id)
			conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
					"release: %zu unknown lease(s)", unknown);
		return;
	}
	reply_ok(peer, id);
}

/* 1.6: takes given back unused; other leases released. */
static void handle_untake(struct peer *peer, uint64_t id,
			  const Dlshare__Untake *m)
{
	size_t unknown = 0;

	for (size_t i = 0; i < m->n_leases; i++)
		if (registry_untake(&peer->d->reg, &peer->owner,
				    m->leases[i]))
			unknown++;
	if (unknown) {
		if (id)
			conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
					"untake: %zu unknown lease(s) of %zu",
					unknown, m->n_leases);
		return;
	}
	if (id)
		reply_ok(peer, id);
}

/* Delete with a prefix (1.4): a batch of the names under it that the
 * caller may write; DeleteReply says how many, and whether to ask again. */
static void handle_delete_prefix(struct peer *peer, uint64_t id,
				 const Dlshare__Delete *m)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__DeleteReply r = DLSHARE__DELETE_REPLY__INIT;
	uint64_t deleted, skipped;
	int more;

	if (!*m->name) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"delete by prefix: the prefix is empty (it "
				"would delete every name); name one");
		return;
	}
	if (check_prefix(m->name)) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"delete by prefix %s: no name can start with it",
				m->name);
		return;
	}
	more = registry_delete_prefix(&peer->d->reg, &peer->owner, m->name,
				      REGISTRY_DELETE_BATCH, &deleted,
				      &skipped);
	if (deleted)
		log_info("conn %llu (pid %d, uid %u): deleted %llu name(s) "
			 "under %s%s", (unsigned long long)peer->conn.id,
			 (int)peer->owner.pid, (unsigned)peer->owner.uid,
			 (unsigned long long)deleted, m->name,
			 more ? " (more to come)" : "");
	r.deleted = deleted;
	r.has_more = 1;
	r.more = more;
	r.has_skipped = 1;
	r.skipped = skipped;
	f.body_case = DLSHARE__FRAME__BODY_DELETE_REPLY;
	f.delete_reply = &r;
	reply_send(peer, id, &f);
}

static void handle_delete(struct peer *peer, uint64_t id,
			  const Dlshare__Delete *m)
{
	const char *bad;
	int err;

	if (m->has_prefix && m->prefix) {
		handle_delete_prefix(peer, id, m);
		return;
	}
	/* Say which rule a bad name breaks: "fg/" is a prefix, not a name. */
	if ((bad = check_name_why(m->name))) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"delete %s: not a name: %s%s", m->name, bad,
				*m->name && m->name[strlen(m->name) - 1] == '/' ?
				" (to delete the names under a prefix, "
				"delete by prefix)" : "");
		return;
	}
	err = registry_delete(&peer->d->reg, &peer->owner, m->name);

	if (err)
		reply_err(peer, id, err, "delete", m->name);
	else
		reply_ok(peer, id);
}

static void handle_stat(struct peer *peer, uint64_t id, const Dlshare__Stat *m)
{
	struct entry *e = registry_entry(&peer->d->reg, m->name);
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__StatReply r = DLSHARE__STAT_REPLY__INIT;
	Dlshare__NameInfo ni;
	struct encode_version w;
	int have_w = 0;

	if (!e) {
		reply_err(peer, id, -ENOENT, "stat", m->name);
		return;
	}
	if (!registry_may(e, &peer->owner, 4)) {
		reply_err(peer, id, -EPERM, "stat", m->name);
		return;
	}
	encode_name_info(&ni, e);
	encode_name_lifetime(&ni, &peer->d->reg, e);
	if (e->queue) {
		ni.has_queue_waiting = 1;
		ni.queue_waiting = queue_waiting(peer->d, e->name);
	}
	r.info = &ni;
	/* A queue name shows its oldest queued version. A client before
	 * 1.4 cannot read a manifest memfd: it gets the summary alone. */
	const struct version *shown = e->queue ? e->queue->head : e->latest;
	if (shown && (shown->manifest_fd < 0 || peer->minor >= 4)) {
		if (encode_version_init(&w, shown, NULL,
					ENCODE_MANIFEST_FD)) {
			reply_err(peer, id, -ENOMEM, "stat", m->name);
			return;
		}
		have_w = 1;
		if (w.has_manifest) {
			/* The tensors are in the manifest memfd, whose fd
			 * rides along (1.4). */
			r.manifest = &w.manifest;
			r.has_manifest_tensors = 1;
			r.manifest_tensors = shown->ntensors;
		} else {
			r.n_tensors = shown->ntensors;
			r.tensors = w.tp;
		}
	}
	f.body_case = DLSHARE__FRAME__BODY_STAT_REPLY;
	f.stat_reply = &r;
	if (have_w && w.nfds) {
		struct refusal why = { 0 };
		int err = conn_may_queue_fds(&peer->conn, w.nfds, &why);

		if (err) {
			encode_version_deinit(&w);
			reply_err_why(peer, id, err, &why, "stat", m->name);
			return;
		}
		f.id = id;
		conn_send(&peer->conn, &f, w.fds, w.nfds);
	} else {
		reply_send(peer, id, &f);
	}
	if (have_w)
		encode_version_deinit(&w);
}

/* Refuses a request with a NUL inside one of its strings: the daemon reads
 * strings up to their first NUL, and "ok\0../x" must not pass as "ok". */
static int refuse_nul(struct peer *peer, const struct wire_msg *m)
{
	const Dlshare__Frame *f = m->frame;
	const ProtobufCFieldDescriptor *body;

	if (!m->nul_field)
		return 0;
	body = protobuf_c_message_descriptor_get_field(
		&dlshare__frame__descriptor, (unsigned)f->body_case);
	if (f->id)
		conn_send_error(&peer->conn, f->id, DLSHARE_EINVAL,
				"%s: the string %s.%s holds a NUL byte",
				body ? body->name : "request",
				m->nul_in->short_name, m->nul_field->name);
	return 1;
}

/* Handles one decoded frame of peer (a request with a NUL inside a string
 * is refused, see wire_msg.nul_field). Takes over fds (closed or kept).
 * peer may be failing on return. */
static void dispatch_frame(struct peer *peer, const struct wire_msg *m,
			   int *fds, unsigned nfds)
{
	Dlshare__Frame *f = m->frame;

	peer->d->requests++;
	if (!peer->conn.hello && f->body_case != DLSHARE__FRAME__BODY_HELLO) {
		daemon_drop_fds(peer->d, fds, nfds);
		conn_send_error(&peer->conn, f->id, DLSHARE_EPROTO,
				"the first message must be Hello");
		conn_fail(&peer->conn, "no Hello");
		return;
	}
	/* Every request but Release wants its reply, so it needs an id. */
	if (f->id == 0 && f->body_case != DLSHARE__FRAME__BODY_RELEASE) {
		daemon_drop_fds(peer->d, fds, nfds);
		conn_send_error(&peer->conn, 0, DLSHARE_EPROTO,
				"request id 0 is only for Release");
		conn_fail(&peer->conn, "request with id 0");
		return;
	}
	/* Only Publish carries fds, and a Create its manifest (1.4). */
	if (nfds && f->body_case != DLSHARE__FRAME__BODY_PUBLISH &&
	    !(f->body_case == DLSHARE__FRAME__BODY_CREATE &&
	      f->create->manifest)) {
		daemon_drop_fds(peer->d, fds, nfds);
		conn_send_error(&peer->conn, f->id, DLSHARE_EPROTO,
				"unexpected file descriptors");
		conn_fail(&peer->conn, "unexpected fds");
		return;
	}
	/* Releases riding on a request go first, as if sent before it; an
	 * unknown one is only logged (the request has its own answer). */
	release_leases(peer, f->releases, f->n_releases);
	/* So do the fds it says never came (1.8): its request may be the
	 * get that needs them again. */
	if (f->n_unreceived)
		peer_sent_forget(peer, f->unreceived, f->n_unreceived);
	if (refuse_nul(peer, m)) {
		daemon_drop_fds(peer->d, fds, nfds);
		return;
	}
	switch (f->body_case) {
	case DLSHARE__FRAME__BODY_HELLO:
		handle_hello(peer, f->id, f->hello);
		break;
	case DLSHARE__FRAME__BODY_CREATE:
		if (f->create->manifest) {
			/* A Create with a manifest memfd is checked first; a
			 * full queue then refuses it at once (it never
			 * parks: the memfd would wait with it). */
			mcheck_request(peer, f, fds, nfds, create_checked);
			break;
		}
		/* A full queue name: this waits (parked), or is refused. */
		if (f->create->has_queue_depth && reply_fits(peer, f) &&
		    queue_create_gate(peer, f->id, f->create))
			break;
		create_request(peer, f, f->create);
		break;
	case DLSHARE__FRAME__BODY_TAKE:
		take_request(peer, f->id, f->take);
		break;
	case DLSHARE__FRAME__BODY_SEAL:
		handle_seal(peer, f->id, f->seal);
		break;
	case DLSHARE__FRAME__BODY_ABORT:
		handle_abort(peer, f->id, f->abort);
		break;
	case DLSHARE__FRAME__BODY_PUBLISH:
		if (f->publish->manifest)
			mcheck_request(peer, f, fds, nfds, handle_publish);
		else
			handle_publish(peer, f, fds, nfds, NULL);
		break;
	case DLSHARE__FRAME__BODY_GET:
		get_request(peer, f->id, f->get);
		break;
	case DLSHARE__FRAME__BODY_RELEASE:
		handle_release(peer, f->id, f->release);
		break;
	case DLSHARE__FRAME__BODY_DELETE:
		handle_delete(peer, f->id, f->delete_);
		break;
	case DLSHARE__FRAME__BODY_LIST:
		list_request(peer, f->id, f->list);
		break;
	case DLSHARE__FRAME__BODY_STAT:
		handle_stat(peer, f->id, f->stat);
		break;
	case DLSHARE__FRAME__BODY_STATS:
		stats_request(peer, f->id, f->stats);
		break;
	case DLSHARE__FRAME__BODY_UNTAKE:
		handle_untake(peer, f->id, f->untake);
		break;
	case DLSHARE__FRAME__BODY_WATCH:
		watch_request(peer, f->id, f->watch);
		break;
	case DLSHARE__FRAME__BODY_CHANNEL:
		handle_channel(peer, f->id);
		break;
	case DLSHARE__FRAME__BODY_GOODBYE:
		/* The producer is about to exit: no reply sent from here
		 * on names its events or its memory. */
		registry_owner_forget_events(&peer->d->reg, &peer->owner);
		registry_owner_withdraw_exports(&peer->d->reg, &peer->owner);
		reply_ok(peer, f->id);
		break;
	default:
		conn_send_error(&peer->conn, f->id, DLSHARE_EINVAL,
				"unknown request (body %d)", (int)f->body_case);
		break;
	}
}

/* peer's conn is closing: its parked gets and waiting seals are
 * cancelled, its running jobs and seals end without it, and then it lets go
 * of its stake in the registry. */
static void dispatch_peer_closed(struct peer *peer)
{
	int cut = metrics_cut_of(peer->conn.why);

	if (cut >= 0)
		peer->d->metrics.cut[cut]++;
	get_peer_closed(peer);
	watch_peer_closed(peer);
	queue_peer_closed(peer);
	seal_peer_closed(peer);
	create_peer_closed(peer);
	mcheck_peer_closed(peer);
	peer_drop(peer);
}

void dispatch_init(struct daemon *d)
{
	d->create_full = queue_create_full;
}

void dispatch_deinit(struct daemon *d)
{
	seal_deinit(d);
	get_deinit(d);
	watch_deinit(d);
	queue_deinit(d);
	create_deinit(d);
	mcheck_deinit(d);
}

/* ---- registry callbacks --------------------------------------------------- */

static void on_published(void *ud, struct entry *e, struct version *v)
{
	(void)v;
	get_published(ud, e);
	watch_published(ud, e);
}

static void on_removed(void *ud, struct entry *e)
{
	watch_removed(ud, e);
}

static void on_retired(void *ud, struct registry_owner *producer,
		       const char *name, uint64_t number)
{
	struct peer *peer = peer_of_owner(producer);
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Retired r = DLSHARE__RETIRED__INIT;

	if (!conn_open(&peer->conn))
		return;
	r.name = (char *)name;
	r.version = number;
	f.body_case = DLSHARE__FRAME__BODY_RETIRED;
	f.retired = &r;
	conn_send(&peer->conn, &f, NULL, 0);
}

static void on_buffer_freed(void *ud, struct rbuffer *b)
{
	create_buffer_freed(ud, b);
	peer_buffer_freed(b);
}

static void on_close_aside(void *ud, int fd)
{
	daemon_drop_fds(ud, &fd, 1);
}

static void on_events_freed(void *ud, void *events)
{
	seal_events_free(ud, events);
}

static uint64_t on_now_ms(void *ud)
{
	struct daemon *d = ud;

	return uv_now(d->loop);
}

static void on_expiry_changed(void *ud)
{
	expire_arm(ud);
}

static void on_queue_room(void *ud, const char *name)
{
	queue_room(ud, name);
}

const struct registry_ops dispatch_registry_ops = {
	.queue_room = on_queue_room,
	.removed = on_removed,
	.published = on_published,
	.retired = on_retired,
	.buffer_freed = on_buffer_freed,
	.close_aside = on_close_aside,
	.events_freed = on_events_freed,
	.now_ms = on_now_ms,
	.expiry_changed = on_expiry_changed,
};

/* ---- conn callbacks ---------------------------------------------------- */

static void on_frame(struct conn *c, const struct wire_msg *m, int *fds,
		     unsigned nfds)
{
	struct peer *peer = peer_of_conn(c);
	enum metrics_req req = metrics_req_of(m->frame->body_case);

	/* Metrics: requests by type, and the type the Errors sent while it
	 * is handled answer. */
	peer->d->metrics.requests[req]++;
	peer_answering(peer, req);
	dispatch_frame(peer, m, fds, nfds);
	peer_answering(peer, METRICS_REQ_OTHER);
}

/* Metrics: errors by request type and code, and the limit an Error
 * refusing at one names (or "other" for an ELIMIT no one named). */
static void on_error_sent(struct conn *c, int code)
{
	struct peer *peer = peer_of_conn(c);
	struct metrics *mt = &peer->d->metrics;

	metrics_error(mt, (enum metrics_req)peer->answering, code);
	if (peer->limit_hit || code == DLSHARE_ELIMIT)
		mt->limits[peer->limit_hit < METRICS_LIMIT_N ?
			   peer->limit_hit : 0]++;
	peer->limit_hit = 0;
}

static int on_may_queue_fds(struct conn *c, unsigned nfds,
			   struct refusal *why)
{
	return peer_may_queue_fds(peer_of_conn(c), nfds, why);
}

static void on_queued_fds(struct conn *c, int delta)
{
	peer_queued_fds(peer_of_conn(c), delta);
}

/* An fd a peer sent that the conn layer refused, or a dup that left a
 * peer's queue: either may be the last reference to a large memfd (a peer
 * that closed its own copy; one that stopped reading and had the buffer
 * freed meanwhile), whose close would free the pages on the loop. */
static void on_close_fd(struct conn *c, int fd)
{
	daemon_drop_fds(peer_of_conn(c)->d, &fd, 1);
}

static void on_closed(struct conn *c)
{
	dispatch_peer_closed(peer_of_conn(c));
}

static void on_free(struct conn *c)
{
	peer_free(peer_of_conn(c));
}

const struct conn_ops dispatch_conn_ops = {
	.frame = on_frame,
	.may_queue_fds = on_may_queue_fds,
	.queued_fds = on_queued_fds,
	.close_fd = on_close_fd,
	.closed = on_closed,
	.free = on_free,
	.error_sent = on_error_sent,
};
