/* seal — Seal requests, write-sealed on the thread pool (or at once, when
 * the producer write-sealed its buffers itself). */
#include "seal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "gpu.h"
#include "host.h"
#include "log.h"
#include "reply.h"

/* The seals of one uid: how many run on the pool, and those waiting for
 * their turn. Lives while it has either. */
struct seal_uid {
	uid_t uid;
	uint32_t running;
	struct seal_job *waiting;       /* first come, first served */
	UT_hash_handle hh;              /* daemon->seal_uids */
};

/* One Seal, from its request to its answer. */
struct seal_job {
	uv_work_t req;
	struct daemon *d;
	struct peer *peer;              /* NULL once the peer went */
	struct seal_uid *q;             /* its uid's */
	struct version *v;              /* sealing: alive until
					 * registry_seal_end (seal_finish) */
	struct seal_job *prev, *next;   /* peer->seals */
	struct seal_job *qprev, *qnext; /* q->waiting, until it runs */
	uint64_t id;                    /* the request's */
	uint64_t number;                /* v's, for the answer */
	int running;                    /* on the pool */
	int err;                        /* the worker's: 0 or -errno */
	unsigned nfds;
	int fds[REGISTRY_BUFFERS_HARD_MAX]; /* v's host buffers' (v owns
					     * them; the worker only reads
					     * this copy) */
	size_t event_len;
	uint8_t event[REGISTRY_HANDLE_MAX];
	/* 1.6: a device version sealed with the producer's event gets
	 * events of the daemon's own, one per device of its buffers (see
	 * gpu_events_relay), made by the worker. */
	unsigned ndev;
	uint8_t uuids[REGISTRY_BUFFERS_HARD_MAX][GPU_UUID_LEN];
	uint8_t handles[REGISTRY_BUFFERS_HARD_MAX][GPU_IPC_HANDLE_LEN];
	struct gpu_events *gev;         /* the worker's, until taken */
	const char *why;                /* the worker's, with err */
	char name[CHECK_NAME_MAX + 1];  /* for the Retired */
	char label[CHECK_NAME_MAX + 32];  /* "NAME vN", for answers */
};

struct events_free {
	uv_work_t req;
	struct gpu_events *g;
};

static void events_free_work(uv_work_t *req)
{
	struct events_free *ef = req->data;

	gpu_events_free(ef->g);
}

static void events_free_done(uv_work_t *req, int status)
{
	(void)status;
	free(req->data);
}

void seal_events_free(struct daemon *d, void *g)
{
	struct events_free *ef;

	if (!g || !(g = gpu_events_recycle(g)))
		return;
	ef = calloc(1, sizeof(*ef));
	if (ef) {
		ef->g = g;
		ef->req.data = ef;
		if (uv_queue_work(d->loop, &ef->req, events_free_work,
				  events_free_done) == 0)
			return;
		free(ef);
	}
	gpu_events_free(g); /* brief driver calls; never waits for the GPU */
}

/* Frees q once it has nothing running or waiting. */
static void seal_uid_put(struct daemon *d, struct seal_uid *q)
{
	if (!q->running && !q->waiting) {
		HASH_DEL(d->seal_uids, q);
		free(q);
	}
}

/* Thread pool: the system calls that may wait on pinned pages. */
static void seal_work(uv_work_t *req)
{
	struct seal_job *j = req->data;

	for (unsigned i = 0; i < j->nfds && !j->err; i++)
		j->err = host_seal_write(j->fds[i]);
	if (!j->err && j->ndev)
		j->err = gpu_events_relay((const uint8_t (*)[GPU_UUID_LEN])
					  j->uuids, j->ndev, j->event,
					  j->handles, &j->gev, &j->why);
}

/* Loop: ends j's seal with the daemon's events (j->gev) in place of the
 * producer's; they are the version's from here, or freed. */
static int seal_end_relayed(struct seal_job *j)
{
	struct daemon *d = j->d;
	uint8_t dev[REGISTRY_BUFFERS_HARD_MAX * REGISTRY_DEV_EVENT_LEN];
	int err;

	if (j->ndev == 1) {
		err = registry_seal_end_owned(&d->reg, j->v, 0, j->handles[0],
					      GPU_IPC_HANDLE_LEN, NULL, 0,
					      j->gev);
	} else {
		for (unsigned k = 0; k < j->ndev; k++) {
			uint8_t *e = dev + k * REGISTRY_DEV_EVENT_LEN;

			memcpy(e, j->uuids[k], REGISTRY_UUID_LEN);
			memcpy(e + REGISTRY_UUID_LEN, j->handles[k],
			       REGISTRY_HANDLE_MAX);
		}
		err = registry_seal_end_owned(&d->reg, j->v, 0, NULL, 0, dev,
					      j->ndev, j->gev);
	}
	if (err)
		seal_events_free(d, j->gev);
	j->gev = NULL;
	return err;
}

/* Tells peer that the event it sealed j's version with is no longer
 * needed: the daemon's stream waits for it already (a Retired, which a
 * library registered before it sent the Seal). */
static void seal_retire_event(struct peer *peer, struct seal_job *j)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Retired r = DLSHARE__RETIRED__INIT;

	r.name = j->name;
	r.version = j->number;
	f.body_case = DLSHARE__FRAME__BODY_RETIRED;
	f.retired = &r;
	conn_send(&peer->conn, &f, NULL, 0);
}

/* Loop: ends j's seal with err (the version is published, pending again,
 * or dies when it was orphaned), answers its peer if that is still open,
 * and frees j. */
static void seal_finish(struct seal_job *j, int err)
{
	struct daemon *d = j->d;
	struct peer *peer = j->peer;

	if (peer) {
		DL_DELETE(peer->seals, j);
		peer->inflight--;
	}
	/* May publish, which answers parked gets; may free j->v. */
	if (!err && j->gev)
		err = seal_end_relayed(j);
	else
		err = registry_seal_end(&d->reg, j->v, err,
					j->ndev ? NULL : j->event,
					j->ndev ? 0 : j->event_len);
	if (j->gev) { /* the seal failed before it could take them */
		seal_events_free(d, j->gev);
		j->gev = NULL;
	}
	if (peer && conn_open(&peer->conn)) {
		/* Not when the version went meanwhile: that is the
		 * answer then (ENOENT, nothing was published). */
		if (err && j->why && err != -ENOENT) {
			peer_answering(peer, METRICS_REQ_SEAL);
			log_info("conn %llu (pid %d): seal %s: %s",
				 (unsigned long long)peer->conn.id,
				 (int)peer->owner.pid, j->label, j->why);
			conn_send_error(&peer->conn, j->id, reply_code(err),
					"seal %s: the daemon cannot make the "
					"CUDA event readers wait on: %s; "
					"nothing was published", j->label,
					j->why);
			peer_answering(peer, METRICS_REQ_OTHER);
		} else if (err) {
			peer_answering(peer, METRICS_REQ_SEAL);
			reply_err(peer, j->id, err, "seal", j->label);
			peer_answering(peer, METRICS_REQ_OTHER);
		} else {
			Dlshare__Frame f = DLSHARE__FRAME__INIT;
			Dlshare__SealReply r = DLSHARE__SEAL_REPLY__INIT;

			r.version = j->number;
			f.id = j->id;
			f.body_case = DLSHARE__FRAME__BODY_SEAL_REPLY;
			f.seal_reply = &r;
			if (j->ndev)
				seal_retire_event(peer, j);
			conn_send(&peer->conn, &f, NULL, 0);
		}
	}
	free(j);
}

static void seal_done(uv_work_t *req, int status);

/* Starts q's waiting seals while its uid has room on the pool. */
static void seal_pump(struct daemon *d, struct seal_uid *q)
{
	while (q->running < d->limits->uid_seals && q->waiting) {
		struct seal_job *j = q->waiting;

		DL_DELETE2(q->waiting, j, qprev, qnext);
		j->running = 1;
		q->running++;
		if (uv_queue_work(d->loop, &j->req, seal_work, seal_done)) {
			/* Only for a bad argument; pending again. */
			q->running--;
			seal_finish(j, -ENOMEM);
		}
	}
}

static void seal_done(uv_work_t *req, int status)
{
	struct seal_job *j = req->data;
	struct daemon *d = j->d;
	struct seal_uid *q = j->q;

	q->running--;
	seal_finish(j, status ? -EIO : j->err);
	seal_pump(d, q);
	seal_uid_put(d, q);
	conn_reap(&d->conns);
}

/* The distinct devices of v's CUDA device buffers, into uuids (when not
 * NULL), in the order of its buffers. Returns how many. */
static unsigned seal_devices(const struct version *v,
			     uint8_t (*uuids)[GPU_UUID_LEN])
{
	uint8_t seen[REGISTRY_BUFFERS_HARD_MAX][GPU_UUID_LEN];
	unsigned n = 0;

	for (size_t i = 0; i < v->nbuffers; i++) {
		const struct rbuffer *b = v->buffers[i];
		unsigned k;

		if (b->dev_type != kDLCUDA || !b->has_uuid)
			continue;
		for (k = 0; k < n; k++)
			if (memcmp(seen[k], b->cuda->uuid, GPU_UUID_LEN) == 0)
				break;
		if (k < n)
			continue;
		memcpy(seen[n], b->cuda->uuid, GPU_UUID_LEN);
		if (uuids)
			memcpy(uuids[n], b->cuda->uuid, GPU_UUID_LEN);
		n++;
	}
	return n;
}

/* Whether every host buffer of j is write-sealed already: libdlshare
 * adds F_SEAL_WRITE itself at dlshare_seal, after its munmap (the kernel
 * refuses the seal while any writable mapping is left, anywhere), so the
 * buffer is as immutable as the pool's own seal would make it, and asking
 * that costs one F_GET_SEALS each, which never waits. */
static int seal_done_already(const struct seal_job *j)
{
	for (unsigned i = 0; i < j->nfds; i++)
		if (!host_write_sealed(j->fds[i]))
			return 0;
	return 1;
}

void seal_request(struct peer *peer, uint64_t id, const Dlshare__Seal *m)
{
	struct daemon *d = peer->d;
	size_t event_len = m->has_event_handle ? m->event_handle.len : 0;
	struct seal_uid *q = NULL;
	struct seal_job *j = NULL;
	struct version *v;
	int err;

	if (peer->inflight >= d->limits->max_inflight) {
		peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"seal %s: too many requests in flight on this connection (limit %u)",
				m->name, d->limits->max_inflight);
		return;
	}
	err = registry_seal_begin(&d->reg, &peer->owner, m->name, m->version,
				  m->has_writer ? m->writer : 0, &v);
	if (err == -ENOENT) {
		reply_no_pending(peer, id, "seal", m->name, m->version,
					  m->has_writer ? m->writer : 0);
		return;
	}
	if (err) {
		reply_err(peer, id, err, "seal", m->name);
		return;
	}
	/* v is sealing from here: every way out ends the seal. */
	if (event_len > REGISTRY_HANDLE_MAX) {
		err = -EINVAL;
	} else if (event_len && seal_devices(v, NULL) &&
		   event_len != GPU_IPC_HANDLE_LEN) {
		err = -EINVAL; /* no CUDA IPC event handle */
	} else {
		HASH_FIND(hh, d->seal_uids, &peer->owner.uid, sizeof(uid_t), q);
		if (!q && (q = calloc(1, sizeof(*q)))) {
			q->uid = peer->owner.uid;
			HASH_ADD(hh, d->seal_uids, uid, sizeof(q->uid), q);
		}
		j = q ? calloc(1, sizeof(*j)) : NULL;
		if (!j)
			err = -ENOMEM;
	}
	if (err) {
		if (q)
			seal_uid_put(d, q);
		err = registry_seal_end(&d->reg, v, err, NULL, 0);
		reply_err(peer, id, err, "seal", m->name);
		return;
	}
	j->d = d;
	j->peer = peer;
	j->q = q;
	j->v = v;
	j->id = id;
	j->number = v->number;
	j->req.data = j;
	/* Readers of a device version get events of the daemon's own: the
	 * producer's dies with its process. One with no device buffer needs
	 * none (its host buffers were written before the Seal). */
	if (event_len && (j->ndev = seal_devices(v, j->uuids)) == 0)
		event_len = 0;
	j->event_len = event_len;
	if (event_len)
		memcpy(j->event, m->event_handle.data, event_len);
	snprintf(j->name, sizeof(j->name), "%s", v->entry->name);
	snprintf(j->label, sizeof(j->label), "%s v%" PRIu64, v->entry->name,
		 v->number);
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i]->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST)
			j->fds[j->nfds++] = v->buffers[i]->fd;
	DL_APPEND(peer->seals, j);
	peer->inflight++;
	if (!j->ndev && seal_done_already(j)) {
		/* Nothing left that could wait in the kernel: sealed here,
		 * without the trip to the pool and back (two thread
		 * wakeups), and not behind the uid's waiting seals. */
		seal_finish(j, 0);
		seal_uid_put(d, q);
		return;
	}
	DL_APPEND2(q->waiting, j, qprev, qnext);
	seal_pump(d, q);
	seal_uid_put(d, q);
}

void seal_peer_closed(struct peer *peer)
{
	struct daemon *d = peer->d;
	struct seal_job *j, *tmp;

	DL_FOREACH_SAFE(peer->seals, j, tmp) {
		struct seal_uid *q = j->q;

		DL_DELETE(peer->seals, j);
		peer->inflight--;
		j->peer = NULL;
		if (j->running)
			continue; /* ends in seal_done, orphaned */
		/* Never ran: its version is pending again, and goes with the
		 * conn's other pending versions. */
		DL_DELETE2(q->waiting, j, qprev, qnext);
		seal_finish(j, -ECANCELED);
		seal_uid_put(d, q);
	}
}

void seal_deinit(struct daemon *d)
{
	struct seal_uid *q, *tmp;

	/* The loop ran until every job was done; a backstop. */
	HASH_ITER(hh, d->seal_uids, q, tmp) {
		HASH_DEL(d->seal_uids, q);
		free(q);
	}
}
