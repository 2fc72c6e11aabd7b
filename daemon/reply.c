/* reply — answers: errno to DLSHARE_E* codes, and Error messages that say
 * what the peer cannot see. */
#include "reply.h"

#include <errno.h>
#include <string.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "host.h"
#include "log.h"

/* Room a reply needs beyond the request that described the same version. */
#define REPLY_OVERHEAD 1024u

int reply_code(int err)
{
	switch (err) {
	case 0:
		return DLSHARE_OK;
	case -EINVAL:
	case -EBADF:
		return DLSHARE_EINVAL;
	case -ENOENT:
		return DLSHARE_ENOENT;
	case -ETIMEDOUT:
		return DLSHARE_ETIMEDOUT;
	case -EPERM:
	case -EACCES:
		return DLSHARE_EPERM;
	case -ENOMEM:
	case HOST_ENOBACK:
		return DLSHARE_ENOMEM;
	case -EMSGSIZE:
		return DLSHARE_E2BIG;
	case -E2BIG:
	case -ENOSPC:
	case -EDQUOT:
	case -EFBIG:
	case -EMFILE:
	case -ENFILE:
	case -ERANGE:
		return DLSHARE_ELIMIT;
	case -EPROTO:
		return DLSHARE_EPROTO;
	case -EOPNOTSUPP:
		return DLSHARE_ENOTSUP;
	case -ENODEV:
		return DLSHARE_ENODEV;
	case -EBUSY:
		return DLSHARE_EBUSY;
	case -EALREADY:
	case -EINPROGRESS:
		return DLSHARE_ESTATE;
	case -EMEDIUMTYPE:
		return DLSHARE_EINVAL;
	case -EAGAIN:
		return DLSHARE_ELIMIT;
	default:
		return DLSHARE_EIO;
	}
}

static const char *errno_text(int err)
{
	switch (err) {
	case -EMSGSIZE:
		return "the version's description does not fit in one packet";
	case -E2BIG:
		return "too many tensors or buffers in one version";
	case -ENOSPC:
		return "the daemon's byte limit is reached";
	case -EDQUOT:
		return "a quota is reached";
	case -EFBIG:
		return "buffer larger than the daemon allows";
	case -EOPNOTSUPP:
		return "buffer kind not supported by this daemon";
	case -EBUSY:
		return WIRE_TEXT_SEAL_BUSY;
	case -EALREADY:
		return "version already sealed";
	case -EINPROGRESS:
		return "a seal of this version is in progress";
	case -EBADF:
		return "a buffer's fd is refused";
	case HOST_ENOBACK:
		return "the daemon could not allocate the buffer's memory (its "
		       "memory cgroup's limit, or the machine's)";
	case -EPERM:
		return "permission denied";
	case -ENOENT:
		return "no such name or version";
	case -ETIMEDOUT:
		return "no matching version before the timeout";
	default:
		return strerror(-err);
	}
}

int reply_send(struct peer *peer, uint64_t id, Dlshare__Frame *f)
{
	f->id = id;
	return conn_send(&peer->conn, f, NULL, 0);
}

void reply_ok(struct peer *peer, uint64_t id)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Ok ok = DLSHARE__OK__INIT;

	if (id == 0)
		return;
	f.body_case = DLSHARE__FRAME__BODY_OK;
	f.ok = &ok;
	reply_send(peer, id, &f);
}

void reply_err_why(struct peer *peer, uint64_t id, int err,
		   const struct refusal *refusal, const char *what,
		   const char *name)
{
	const char *why = refusal ? refusal->why : NULL;
	struct entry *e;

	/* Id 0 wants no reply (Release); an Error with id 0 would read as
	 * the notice the daemon sends before it hangs up. */
	if (id == 0)
		return;
	/* Metrics: the limit this refusal hit (counted as it is sent; an
	 * ELIMIT that names none counts as "other"). */
	if (refusal && refusal->limit)
		peer_limit_hit(peer, refusal->limit);
	if (err != -ENOENT && err != -ETIMEDOUT)
		log_info("conn %llu (pid %d): %s %s: %s",
			 (unsigned long long)peer->conn.id,
			 (int)peer->owner.pid, what, name ? name : "",
			 errno_text(err));
	/* For a limit, name it: which one, and that it is this uid's. */
	if ((err == -EDQUOT || err == -ENOSPC || err == -ERANGE) && why)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: limit reached: %s (uid %u)", what,
				name ? " " : "", name ? name : "",
				why, (unsigned)peer->owner.uid);
	/* A lifetime rule (daemon/lifetime.c): which, and whose name. */
	else if (err == -EPERM && why && name &&
		 (e = registry_entry(&peer->d->reg, name)) && e->life &&
		 e->life->owned_by)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s %s: permission denied: %s (owned by uid %u, "
				"connection of pid %d; you are uid %u, pid %d)",
				what, name, why, (unsigned)e->owner_uid,
				(int)e->life->owned_by->pid,
				(unsigned)peer->owner.uid,
				(int)peer->owner.pid);
	else if (err == -EPERM && why && name &&
		 (e = registry_entry(&peer->d->reg, name)))
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s %s: permission denied: %s (owned by uid %u; "
				"you are uid %u)", what, name, why,
				(unsigned)e->owner_uid, (unsigned)peer->owner.uid);
	/* For a refusal, whose name it is and what its mode lets whom:
	 * the caller sees neither. get and stat read; the rest write. */
	else if (err == -EPERM && name &&
		 (e = registry_entry(&peer->d->reg, name)))
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s %s: permission denied: owned by uid %u "
				"(gid %u) with mode %04o, which does not let "
				"uid %u (gid %u) %s it", what, name,
				(unsigned)e->owner_uid, (unsigned)e->owner_gid,
				(unsigned)e->mode, (unsigned)peer->owner.uid,
				(unsigned)peer->owner.gid,
				strncmp(what, "get", 3) && strcmp(what, "stat") ?
				"write" : "read");
	else if (err == -EMEDIUMTYPE && why)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: %s", what, name ? " " : "",
				name ? name : "", why);
	else if (err == -EMEDIUMTYPE)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: the name is not of the kind this needs "
				"(a queue name, or an ordinary one)", what,
				name ? " " : "", name ? name : "");
	/* A malformed field with its rule (an origin, protocol 1.5). */
	else if (err == -EINVAL && why)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: %s", what, name ? " " : "",
				name ? name : "", why);
	else if (err == -EBADF && why)
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: a buffer's fd is refused: %s", what,
				name ? " " : "", name ? name : "", why);
	else
		conn_send_error(&peer->conn, id, reply_code(err),
				"%s%s%s: %s", what, name ? " " : "",
				name ? name : "", errno_text(err));
}

void reply_limit(struct peer *peer, uint64_t id, int err,
		 enum metrics_limit limit, const char *what, const char *name)
{
	const struct refusal r = { NULL, limit };

	reply_err_why(peer, id, err, &r, what, name);
}

void reply_err(struct peer *peer, uint64_t id, int err, const char *what,
	       const char *name)
{
	reply_err_why(peer, id, err, NULL, what, name);
}

int reply_fits(const struct peer *peer, const Dlshare__Frame *f)
{
	return dlshare__frame__get_packed_size(f) + REPLY_OVERHEAD <=
	       peer->d->limits->max_packet;
}

int reply_refuse_same_keys(struct peer *peer, uint64_t id, const char *what,
			   const char *name, Dlshare__Tensor *const *t,
			   size_t n)
{
	size_t a, b;
	int err;

	if (n > peer->d->reg.limits.max_tensors)
		return 0;
	err = check_keys(t, n, &a, &b);
	if (!err)
		return 0;
	if (err == -EINVAL)
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"%s %s: tensors %zu and %zu have the same key \"%s\"",
				what, name, a, b, t[a]->key);
	else
		reply_err(peer, id, err, what, name);
	return 1;
}

void reply_no_pending(struct peer *peer, uint64_t id, const char *what,
		      const char *name, uint64_t number, uint64_t writer)
{
	if (writer)
		conn_send_error(&peer->conn, id, DLSHARE_ENOENT,
				"%s %s version %llu: writer %llu has no pending version on this connection (sealed, aborted, or its name was deleted)",
				what, name, (unsigned long long)number,
				(unsigned long long)writer);
	else
		conn_send_error(&peer->conn, id, DLSHARE_ENOENT,
				"%s %s version %llu: no pending version of this connection",
				what, name, (unsigned long long)number);
}

void reply_queue_full(struct peer *peer, uint64_t id, const char *what,
		      const char *name, uint32_t waited_ms)
{
	struct entry *e = registry_entry(&peer->d->reg, name);
	/* The name may be gone, or no queue any more. */
	const struct entry_queue none = { 0 };
	const struct entry_queue *q = e && e->queue ? e->queue : &none;
	uint32_t pending = q->held - q->queued - q->taken;

	peer_limit_hit(peer, METRICS_LIMIT_QUEUE_FULL);

	if (waited_ms)
		conn_send_error(&peer->conn, id, DLSHARE_ETIMEDOUT,
				"%s %s: the queue stayed full for the whole wait (%u ms): depth %u, with %u queued, %u taken and not released, %u pending",
				what, name, (unsigned)waited_ms,
				(unsigned)q->depth, (unsigned)q->queued,
				(unsigned)q->taken, (unsigned)pending);
	else
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"%s %s: the queue is full: depth %u, with %u queued, %u taken and not released, %u pending (no wait was asked)",
				what, name, (unsigned)q->depth,
				(unsigned)q->queued, (unsigned)q->taken,
				(unsigned)pending);
}
