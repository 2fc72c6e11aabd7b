/* mcheck — a request's manifest memfd, checked and sealed off the loop. */
#include "mcheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "host.h"
#include "manifest.h"
#include "reply.h"
#include "wire.h"

/* The manifest checks of one uid: at most --uid-seals run on the pool at
 * once (a manifest of 10^6 tensors takes a pool thread for ~0.3 s), the
 * others wait here, first come first served. A uid that floods the daemon
 * with manifests delays its own. */
struct mcheck_uid {
	uid_t uid;
	uint32_t running;
	struct mcheck_job *waiting;     /* by wprev/wnext */
	UT_hash_handle hh;              /* daemon->mcheck_uids */
};

struct mcheck_job {
	uv_work_t req;
	struct daemon *d;
	struct peer *peer;        /* NULL once the peer went */
	struct mcheck_job *prev, *next; /* peer->mchecks */
	struct mcheck_uid *q;     /* its uid's */
	int running;              /* on the pool; else waiting in q */
	struct mcheck_job *wprev, *wnext; /* q->waiting */
	Dlshare__Frame *frame;    /* a copy of the request */
	mcheck_finish_fn finish;
	const char *what;         /* "create" or "publish" */
	const char *name;         /* in frame */
	uid_t uid;
	int fds[WIRE_FDS_MAX];    /* the buffers' */
	unsigned nfds;
	struct registry_manifest manifest;
	uint64_t sizes[REGISTRY_BUFFERS_HARD_MAX];
	size_t nbuffers;
	int err;                  /* the work's verdict: 0 or -errno */
	struct manifest_error e;  /* its reason */
};

/* The most bytes a manifest of n tensors can use: every tensor with the
 * most dims, strides and the longest key. A larger memfd is refused before
 * anything is mapped. */
static uint64_t manifest_bound(uint32_t n)
{
	return sizeof(struct manifest_header) + 8 +
	       (uint64_t)n * (sizeof(struct manifest_entry) +
			      2 * CHECK_NDIM_MAX * 8 + CHECK_KEY_MAX + 1);
}

static void job_free(struct mcheck_job *j)
{
	daemon_drop_fds(j->d, j->fds, j->nfds);
	daemon_drop_fds(j->d, &j->manifest.fd, 1);
	dlshare__frame__free_unpacked(j->frame, NULL);
	free(j);
}

/* Thread pool: seal, map, check, reopen read-only. */
static void mcheck_work(uv_work_t *req)
{
	struct mcheck_job *j = req->data;
	struct registry_manifest *m = &j->manifest;
	struct stat st;
	void *map;
	int fd, err;

	/* Sealed first: what is checked is what every reader will see. */
	if ((err = host_seal_write(m->fd))) {
		j->err = -EBADF;
		snprintf(j->e.msg, sizeof(j->e.msg), "the manifest memfd "
			 "could not be write-sealed (%s): unmap it before "
			 "sending", err == -EBUSY ? "a writable mapping or "
			 "pinned pages remain" : strerror(-err));
		return;
	}
	if (fstat(m->fd, &st) || (uint64_t)st.st_size != m->size) {
		j->err = -EINVAL;
		snprintf(j->e.msg, sizeof(j->e.msg), "the manifest memfd has "
			 "%lld bytes, the request says %llu",
			 (long long)st.st_size, (unsigned long long)m->size);
		return;
	}
	/* Private and read-only: a write-sealed memfd maps shared only
	 * through a read-only fd before Linux 6.7. */
	map = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, m->fd, 0);
	if (map == MAP_FAILED) {
		j->err = -errno;
		snprintf(j->e.msg, sizeof(j->e.msg), "the manifest memfd "
			 "could not be mapped: %s", strerror(errno));
		return;
	}
	j->err = manifest_check(map, m->size, m->ntensors, j->sizes,
				j->nbuffers, 1, &j->e);
	munmap(map, m->size);
	if (j->err)
		return;
	fd = host_reopen_ro(m->fd);
	if (fd >= 0) {
		close(m->fd);
		m->fd = fd;
	}
}

static void mcheck_done(uv_work_t *req, int status);

static void uid_put(struct daemon *d, struct mcheck_uid *q)
{
	if (!q->running && !q->waiting) {
		HASH_DEL(d->mcheck_uids, q);
		free(q);
	}
}

/* Puts j on the pool. Returns 0 or -ENOMEM. */
static int job_run(struct mcheck_job *j)
{
	if (uv_queue_work(j->d->loop, &j->req, mcheck_work, mcheck_done))
		return -ENOMEM;
	j->running = 1;
	j->q->running++;
	return 0;
}

/* A check of q's ended: the next waiting one runs. */
static void uid_next(struct daemon *d, struct mcheck_uid *q)
{
	while (q->waiting && q->running < d->limits->uid_seals) {
		struct mcheck_job *j = q->waiting;

		DL_DELETE2(q->waiting, j, wprev, wnext);
		if (job_run(j) == 0)
			continue;
		DL_DELETE(j->peer->mchecks, j);
		j->peer->inflight--;
		reply_err(j->peer, j->frame->id, -ENOMEM, j->what, j->name);
		job_free(j);
	}
	uid_put(d, q);
}

/* Loop: finishes the request, unless its peer went meanwhile. */
static void mcheck_done(uv_work_t *req, int status)
{
	struct mcheck_job *j = req->data;
	struct peer *peer = j->peer;
	struct daemon *d = j->d;

	j->q->running--;
	uid_next(d, j->q);
	if (!peer) {
		job_free(j);
		return;
	}
	DL_DELETE(peer->mchecks, j);
	peer->inflight--;
	peer_answering(peer, metrics_req_of(j->frame->body_case));
	if (!conn_open(&peer->conn)) {
		/* Doomed meanwhile: nothing to answer. */
	} else if (status) {
		conn_send_error(&peer->conn, j->frame->id, DLSHARE_EIO,
				"%s %s: %s", j->what, j->name,
				uv_strerror(status));
	} else if (j->err == -ENOMEM) {
		reply_err(peer, j->frame->id, -ENOMEM, j->what, j->name);
	} else if (j->err) {
		conn_send_error(&peer->conn, j->frame->id,
				reply_code(j->err),
				"%s %s: manifest refused (uid %u): %s", j->what,
				j->name, (unsigned)j->uid, j->e.msg);
	} else {
		/* The handler takes over the buffers' fds. */
		unsigned n = j->nfds;

		j->nfds = 0;
		j->finish(peer, j->frame, j->fds, n, &j->manifest);
	}
	peer_answering(peer, METRICS_REQ_OTHER);
	job_free(j);
	conn_reap(&d->conns);
}

/* The checks that need no mapping, on the loop. Returns 0 or answers. */
static int precheck(struct peer *peer, const Dlshare__Frame *f,
		    const char *what, const char *name,
		    const Dlshare__Buffer *mb, int has_n, uint32_t n,
		    size_t n_inline, size_t nbuffers, int fd)
{
	struct daemon *d = peer->d;
	const struct registry_limits *l = &d->reg.limits;
	struct uid_usage *u = peer->owner.usage;
	const char *why = NULL;
	uint64_t id = f->id;

	if (!has_n || n_inline || !mb->fd_attached) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"%s %s: a manifest memfd comes attached, with "
				"manifest_tensors and no inline tensors",
				what, name);
		return -1;
	}
	if (n > MANIFEST_TENSORS_HARD_MAX || n > l->max_tensors) {
		peer_limit_hit(peer, METRICS_LIMIT_MAX_TENSORS);
		conn_send_error(&peer->conn, id, reply_code(-E2BIG),
				"%s %s: %u tensors, more than the limit of %u "
				"tensors per version (%s)", what, name, n,
				n > MANIFEST_TENSORS_HARD_MAX ?
				MANIFEST_TENSORS_HARD_MAX : l->max_tensors,
				n > MANIFEST_TENSORS_HARD_MAX ?
				"the protocol's cap" : "--max-tensors");
		return -1;
	}
	if (nbuffers > REGISTRY_BUFFERS_HARD_MAX) {
		reply_limit(peer, id, -E2BIG, METRICS_LIMIT_MAX_TENSORS, what,
			    name);
		return -1;
	}
	if (n == 0 || mb->size < sizeof(struct manifest_header) ||
	    mb->size > manifest_bound(n)) {
		conn_send_error(&peer->conn, id, DLSHARE_EINVAL,
				"%s %s: a manifest of %u tensors can not take "
				"%llu bytes", what, name, n,
				(unsigned long long)mb->size);
		return -1;
	}
	if (mb->size > l->uid_manifest_bytes ||
	    (u && u->meta_bytes > l->uid_manifest_bytes - mb->size)) {
		const struct refusal r = {
			"manifest bytes per uid (--uid-manifest-bytes)",
			METRICS_LIMIT_UID_MANIFEST_BYTES
		};

		reply_err_why(peer, id, -EDQUOT, &r, what, name);
		return -1;
	}
	if (host_check_fd(fd, mb->size, &why)) {
		conn_send_error(&peer->conn, id, reply_code(-EBADF),
				"%s %s: the manifest memfd is refused: %s",
				what, name, why);
		return -1;
	}
	if (peer->inflight >= d->limits->max_inflight) {
		peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"%s %s: too many requests in flight on this "
				"connection (limit %u)", what, name,
				d->limits->max_inflight);
		return -1;
	}
	return 0;
}

void mcheck_request(struct peer *peer, const Dlshare__Frame *f, int *fds,
		    unsigned nfds, mcheck_finish_fn finish)
{
	struct daemon *d = peer->d;
	const Dlshare__Buffer *mb;
	Dlshare__Buffer **bufs;
	const char *what, *name;
	size_t nbufs, n_inline;
	struct mcheck_job *j;
	uint8_t *packed;
	uint32_t n;
	int has_n;
	size_t len;

	if (f->body_case == DLSHARE__FRAME__BODY_CREATE) {
		what = "create";
		name = f->create->name;
		mb = f->create->manifest;
		has_n = f->create->has_manifest_tensors;
		n = f->create->manifest_tensors;
		n_inline = f->create->n_tensors;
		bufs = f->create->buffers;
		nbufs = f->create->n_buffers;
	} else {
		what = "publish";
		name = f->publish->name;
		mb = f->publish->manifest;
		has_n = f->publish->has_manifest_tensors;
		n = f->publish->manifest_tensors;
		n_inline = f->publish->n_tensors;
		bufs = f->publish->buffers;
		nbufs = f->publish->n_buffers;
	}
	if (nfds == 0) {
		conn_send_error(&peer->conn, f->id, DLSHARE_EINVAL,
				"%s %s: the manifest memfd is not attached",
				what, name);
		return;
	}
	if (precheck(peer, f, what, name, mb, has_n, n, n_inline, nbufs,
		     fds[nfds - 1])) {
		daemon_drop_fds(peer->d, fds, nfds);
		return;
	}
	j = calloc(1, sizeof(*j));
	len = dlshare__frame__get_packed_size(f);
	packed = malloc(len ? len : 1);
	if (!j || !packed) {
		free(j);
		free(packed);
		daemon_drop_fds(peer->d, fds, nfds);
		reply_err(peer, f->id, -ENOMEM, what, name);
		return;
	}
	/* The request's memory goes with its packet: keep a copy. */
	dlshare__frame__pack(f, packed);
	j->frame = dlshare__frame__unpack(NULL, len, packed);
	free(packed);
	if (!j->frame) {
		free(j);
		daemon_drop_fds(peer->d, fds, nfds);
		reply_err(peer, f->id, -ENOMEM, what, name);
		return;
	}
	j->name = j->frame->body_case == DLSHARE__FRAME__BODY_CREATE ?
		  j->frame->create->name : j->frame->publish->name;
	j->what = what;
	j->d = d;
	j->peer = peer;
	j->uid = peer->owner.uid;
	j->finish = finish;
	j->nfds = nfds - 1;
	memcpy(j->fds, fds, j->nfds * sizeof(int));
	j->manifest.fd = fds[nfds - 1];
	j->manifest.size = mb->size;
	j->manifest.ntensors = n;
	j->nbuffers = nbufs;
	for (size_t i = 0; i < nbufs; i++)
		j->sizes[i] = bufs[i]->size;
	j->req.data = j;
	HASH_FIND(hh, d->mcheck_uids, &j->uid, sizeof(j->uid), j->q);
	if (!j->q) {
		j->q = calloc(1, sizeof(*j->q));
		if (!j->q) {
			job_free(j);
			reply_err(peer, f->id, -ENOMEM, what, name);
			return;
		}
		j->q->uid = j->uid;
		HASH_ADD(hh, d->mcheck_uids, uid, sizeof(j->q->uid), j->q);
	}
	if (j->q->running < d->limits->uid_seals) {
		if (job_run(j)) {
			uid_put(d, j->q);
			job_free(j);
			reply_err(peer, f->id, -ENOMEM, what, name);
			return;
		}
	} else {
		DL_APPEND2(j->q->waiting, j, wprev, wnext);
	}
	DL_APPEND(peer->mchecks, j);
	peer->inflight++;
}

void mcheck_peer_closed(struct peer *peer)
{
	struct mcheck_job *j, *tmp;

	DL_FOREACH_SAFE(peer->mchecks, j, tmp) {
		DL_DELETE(peer->mchecks, j);
		peer->inflight--;
		if (j->running) {
			j->peer = NULL; /* it ends without its peer */
			continue;
		}
		DL_DELETE2(j->q->waiting, j, wprev, wnext);
		uid_put(j->d, j->q);
		job_free(j);
	}
}

void mcheck_deinit(struct daemon *d)
{
	struct mcheck_uid *q, *tmp;

	/* Empty once every peer closed and the loop ran dry. */
	HASH_ITER(hh, d->mcheck_uids, q, tmp) {
		HASH_DEL(d->mcheck_uids, q);
		free(q);
	}
}
