/* dispatch — requests to their handlers; Hello, Publish, Abort, Release,
 * Delete, Stat, Stats and Goodbye; the registry's and the conns' callbacks. */
#include "dispatch.h"

#include <errno.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "create.h"
#include "encode.h"
#include "get.h"
#include "list.h"
#include "log.h"
#include "peer.h"
#include "queue.h"
#include "reply.h"
#include "seal.h"

/* ---- requests ----------------------------------------------------------- */

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
	r.has_max_queue_depth = 1;
	r.max_queue_depth = d->reg.limits.max_queue_depth;
	f.body_case = DLSHARE__FRAME__BODY_HELLO_REPLY;
	f.hello_reply = &r;
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
			   const Dlshare__Publish *m, int *fds, unsigned nfds)
{
	struct registry_spec spec = {
		.name = m->name, .mode = m->mode,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.event_handle = m->has_event_handle ? m->event_handle.data : NULL,
		.event_len = m->has_event_handle ? m->event_handle.len : 0,
		.queue = m->has_queue_depth,
		.queue_depth = m->queue_depth,
	};
	Dlshare__Frame out = DLSHARE__FRAME__INIT;
	Dlshare__PublishReply r = DLSHARE__PUBLISH_REPLY__INIT;
	int bfds[REGISTRY_BUFFERS_HARD_MAX];
	const char *why = NULL;
	struct version *v;
	unsigned k = 0;
	int err;

	if (m->n_buffers > REGISTRY_BUFFERS_HARD_MAX) {
		wire_close_fds(fds, nfds);
		reply_err(peer, f->id, -E2BIG, "publish", m->name);
		return;
	}
	if (reply_refuse_same_keys(peer, f->id, "publish", m->name, m->tensors,
			     m->n_tensors)) {
		wire_close_fds(fds, nfds);
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
		wire_close_fds(fds, nfds);
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
	err = reply_fits(peer, f) ?
	      registry_add(&peer->d->reg, &peer->owner, &spec, 1, &v, &why) :
	      -EMSGSIZE;
	for (size_t i = 0; i < m->n_buffers; i++)
		if (bfds[i] >= 0)
			close(bfds[i]); /* not taken: failure */
	/* An export never waits for room (it would hold the peer's fds
	 * while parked): a full queue refuses it at once. */
	if (err == -EAGAIN) {
		reply_queue_full(peer, f->id, "publish", m->name, 0);
		return;
	}
	if (err) {
		reply_err_why(peer, f->id, err, why, "publish", m->name);
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

static void handle_delete(struct peer *peer, uint64_t id,
			  const Dlshare__Delete *m)
{
	int err = registry_delete(&peer->d->reg, &peer->owner, m->name);

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
	if (e->queue_depth) {
		ni.has_queue_waiting = 1;
		ni.queue_waiting = queue_waiting(peer->d, e->name);
	}
	r.info = &ni;
	/* A queue name shows its oldest queued version. */
	const struct version *shown = e->queue_depth ? e->qhead : e->latest;
	if (shown) {
		if (encode_version_init(&w, shown, NULL)) {
			reply_err(peer, id, -ENOMEM, "stat", m->name);
			return;
		}
		have_w = 1;
		r.n_tensors = shown->ntensors;
		r.tensors = w.tp;
	}
	f.body_case = DLSHARE__FRAME__BODY_STAT_REPLY;
	f.stat_reply = &r;
	reply_send(peer, id, &f);
	if (have_w)
		encode_version_deinit(&w);
}

static void handle_stats(struct peer *peer, uint64_t id)
{
	struct daemon *d = peer->d;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__StatsReply r = DLSHARE__STATS_REPLY__INIT;

	r.connections = d->conns.n;
	r.names = d->reg.nnames;
	r.versions = d->reg.nversions;
	r.leases = d->reg.nleases;
	r.buffers = d->reg.nbuffers;
	r.bytes = d->reg.bytes;
	r.parked = d->nparked;
	r.requests = d->requests;
	r.uptime_ms = daemon_uptime_ms(d);
	f.body_case = DLSHARE__FRAME__BODY_STATS_REPLY;
	f.stats_reply = &r;
	reply_send(peer, id, &f);
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
		wire_close_fds(fds, nfds);
		conn_send_error(&peer->conn, f->id, DLSHARE_EPROTO,
				"the first message must be Hello");
		conn_fail(&peer->conn, "no Hello");
		return;
	}
	/* Every request but Release wants its reply, so it needs an id. */
	if (f->id == 0 && f->body_case != DLSHARE__FRAME__BODY_RELEASE) {
		wire_close_fds(fds, nfds);
		conn_send_error(&peer->conn, 0, DLSHARE_EPROTO,
				"request id 0 is only for Release");
		conn_fail(&peer->conn, "request with id 0");
		return;
	}
	/* Only Publish carries fds. */
	if (nfds && f->body_case != DLSHARE__FRAME__BODY_PUBLISH) {
		wire_close_fds(fds, nfds);
		conn_send_error(&peer->conn, f->id, DLSHARE_EPROTO,
				"unexpected file descriptors");
		conn_fail(&peer->conn, "unexpected fds");
		return;
	}
	/* Releases riding on a request go first, as if sent before it; an
	 * unknown one is only logged (the request has its own answer). */
	release_leases(peer, f->releases, f->n_releases);
	if (refuse_nul(peer, m)) {
		wire_close_fds(fds, nfds);
		return;
	}
	switch (f->body_case) {
	case DLSHARE__FRAME__BODY_HELLO:
		handle_hello(peer, f->id, f->hello);
		break;
	case DLSHARE__FRAME__BODY_CREATE:
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
		handle_publish(peer, f, f->publish, fds, nfds);
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
		handle_stats(peer, f->id);
		break;
	case DLSHARE__FRAME__BODY_GOODBYE:
		registry_owner_forget_events(&peer->d->reg, &peer->owner);
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
	get_peer_closed(peer);
	queue_peer_closed(peer);
	seal_peer_closed(peer);
	create_peer_closed(peer);
	peer_drop(peer);
}

void dispatch_deinit(struct daemon *d)
{
	seal_deinit(d);
	get_deinit(d);
	queue_deinit(d);
	create_deinit(d);
}

/* ---- registry callbacks --------------------------------------------------- */

static void on_published(void *ud, struct entry *e, struct version *v)
{
	(void)v;
	get_published(ud, e);
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

static void on_queue_room(void *ud, const char *name)
{
	queue_room(ud, name);
}

const struct registry_ops dispatch_registry_ops = {
	.queue_room = on_queue_room,
	.published = on_published,
	.retired = on_retired,
	.buffer_freed = on_buffer_freed,
};

/* ---- conn callbacks ---------------------------------------------------- */

static void on_frame(struct conn *c, const struct wire_msg *m, int *fds,
		     unsigned nfds)
{
	dispatch_frame(peer_of_conn(c), m, fds, nfds);
}

static int on_may_queue_fds(struct conn *c, unsigned nfds, const char **why)
{
	return peer_may_queue_fds(peer_of_conn(c), nfds, why);
}

static void on_queued_fds(struct conn *c, int delta)
{
	peer_queued_fds(peer_of_conn(c), delta);
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
	.closed = on_closed,
	.free = on_free,
};
