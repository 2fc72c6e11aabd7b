/* peer — a client of the daemon: its conn, registry stake and sent set. */
#include "peer.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"

int peer_new(struct daemon *d, int fd)
{
	struct peer *peer = calloc(1, sizeof(*peer));
	struct conn *c = &peer->conn;
	struct refusal why = { 0 };
	int err;

	if (!peer) {
		close(fd);
		return -ENOMEM;
	}
	err = conn_init(c, &d->conns, fd);
	if (err) {
		close(fd);
		free(peer);
		return err;
	}
	peer->d = d;
	registry_owner_init(&peer->owner, c->uid, c->gid, c->pid);
	err = registry_owner_attach(&d->reg, &peer->owner, &why);
	if (err == -EDQUOT) {
		log_warn("uid %u: %s reached (%u); refused a connection",
			 (unsigned)c->uid, why.why, d->reg.limits.uid_connections);
		free(peer);
		return err; /* the caller refuses fd */
	}
	if (err) {
		close(fd);
		free(peer);
		return err;
	}
	err = conn_start(c);
	if (err) {
		registry_owner_drop(&d->reg, &peer->owner);
		close(fd);
		free(peer);
		return err;
	}
	return 0;
}

int peer_sent_add(struct peer *peer, struct rbuffer *rb)
{
	struct sent_buf *sb = calloc(1, sizeof(*sb)), *h;

	if (!sb) {
		conn_fail(&peer->conn, "out of memory");
		return -ENOMEM;
	}
	sb->id = rb->id;
	sb->peer = peer;
	sb->buf = rb;
	HASH_ADD(hh, peer->sent, id, sizeof(sb->id), sb);
	h = rb->holders;
	DL_APPEND2(h, sb, bprev, bnext);
	rb->holders = h;
	return 0;
}

/* Forgets that sb's peer has sb's buffer, and frees sb. */
static void sent_drop(struct sent_buf *sb)
{
	struct sent_buf *h = sb->buf->holders;

	HASH_DEL(sb->peer->sent, sb);
	DL_DELETE2(h, sb, bprev, bnext);
	sb->buf->holders = h;
	free(sb);
}

void peer_sent_forget(struct peer *peer, const uint64_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct sent_buf *sb = NULL;

		HASH_FIND(hh, peer->sent, &ids[i], sizeof(ids[i]), sb);
		if (sb)
			sent_drop(sb);
	}
}

void peer_buffer_freed(struct rbuffer *b)
{
	/* Only the peers that have the buffer's fd hear of it. */
	while (b->holders) {
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__BufferGone g = DLSHARE__BUFFER_GONE__INIT;
		struct sent_buf *sb = b->holders;
		struct conn *c = &sb->peer->conn;

		sent_drop(sb);
		if (!conn_open(c))
			continue;
		g.n_ids = 1;
		g.ids = &b->id;
		f.body_case = DLSHARE__FRAME__BODY_BUFFER_GONE;
		f.buffer_gone = &g;
		conn_send(c, &f, NULL, 0);
	}
}

int peer_may_queue_fds(struct peer *peer, unsigned nfds,
		       struct refusal *why)
{
	struct uid_usage *u = peer->owner.usage;

	if (u && u->fds_queued + nfds > peer->d->reg.limits.uid_fds) {
		*why = (struct refusal){ "fds queued per uid",
					 METRICS_LIMIT_UID_FDS };
		return -EDQUOT;
	}
	return 0;
}

void peer_queued_fds(struct peer *peer, int delta)
{
	peer->d->reg.fds_queued += delta;
	if (peer->owner.usage)
		peer->owner.usage->fds_queued += delta;
}

void peer_drop(struct peer *peer)
{
	struct sent_buf *b, *tmp;

	/* Dropping the stake may free buffers: buffer_freed skips closing
	 * conns, and our sent set goes below. */
	registry_owner_drop(&peer->d->reg, &peer->owner);
	HASH_ITER(hh, peer->sent, b, tmp)
		sent_drop(b);
}

void peer_free(struct peer *peer)
{
	free(peer);
}
