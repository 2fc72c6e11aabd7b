/* create — Create requests: store versions, with GPU buffers and large
 * host buffers made on the thread pool, and the daemon-owned cuda-ipc
 * memory they leave. Host buffers are backed (their pages allocated) as
 * they are made, so that they are charged to the daemon's memory cgroup
 * (host.c). */
#include "create.h"
#include "memcg.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "encode.h"
#include "gpu.h"
#include "host.h"
#include "reply.h"

/* Host bytes of one Create that are made (and backed) on the loop: below
 * this, allocating the pages costs less than a trip to the thread pool. */
#define CREATE_BACK_INLINE_MAX (UINT64_C(1) << 20)

/* Daemon-owned cuda-ipc memory: cudaMalloc memory of the daemon (the
 * fallback where the driver cannot export VMM memory as an fd), by buffer
 * id: freed on the thread pool when the registry frees the buffer. By then
 * every process closed it: readers close their mapping before they release
 * their lease, and the writer holds a lease until it closed its own. */
struct devmem {
	uint64_t id;              /* the buffer's */
	void *ptr;
	int ordinal;
	UT_hash_handle hh;        /* daemon->devmem */
};

struct devmem_free {
	uv_work_t req;
	void *ptr;
	int ordinal;
};

static void devmem_free_work(uv_work_t *req)
{
	struct devmem_free *df = req->data;

	gpu_free_ipc(df->ptr, df->ordinal);
}

static void devmem_free_done(uv_work_t *req, int status)
{
	(void)status;
	free(req->data);
}

/* Frees a cuda-ipc allocation off the loop (cudaFree waits for the
 * device); at once when that cannot be queued. */
static void devmem_free(struct daemon *d, void *ptr, int ordinal)
{
	struct devmem_free *df = calloc(1, sizeof(*df));

	if (df) {
		df->ptr = ptr;
		df->ordinal = ordinal;
		df->req.data = df;
		if (uv_queue_work(d->loop, &df->req, devmem_free_work,
				  devmem_free_done) == 0)
			return;
		free(df);
	}
	gpu_free_ipc(ptr, ordinal);
}

/* A Create whose buffers are being made on the thread pool: a GPU
 * allocation may take long (the driver's first call, a full device), so
 * may allocating the pages of a large host buffer (about 0.1 s per GiB),
 * and the loop never waits. It counts as a request in flight of its peer. */
struct gpu_job {
	uv_work_t req;
	struct daemon *d;
	struct peer *peer;        /* NULL once the peer went */
	struct gpu_job *prev, *next; /* peer->jobs */
	uint64_t id;
	Dlshare__Create *create;  /* a copy of the request */
	struct registry_manifest manifest; /* its checked manifest memfd
					    * (1.4), or fd -1 */
	int made[REGISTRY_BUFFERS_HARD_MAX];     /* mem[i] is ours to free */
	struct gpu_mem mem[REGISTRY_BUFFERS_HARD_MAX];
	int fds[REGISTRY_BUFFERS_HARD_MAX];      /* cuda-vmm: mem[i].fd;
						  * host: the memfd */
	int host[REGISTRY_BUFFERS_HARD_MAX];     /* made[i] is a memfd */
	uint64_t asked[REGISTRY_BUFFERS_HARD_MAX]; /* each buffer's size as
						    * asked (a GPU one is
						    * rounded up when made) */
	uint64_t huge_min;                       /* the registry's */
	uint64_t deadline;        /* of its wait for room (create_resume) */
	int err;
	const char *why;
	struct closer_wait again; /* made once more after the closer's frees */
	uint64_t closer_jobs;     /* closer_jobs_done when it was queued */
	int retried;
};

/* Answers a create whose host memory could not be allocated: how much it
 * wanted, and where the limit is likely to be. */
static void create_refuse_unbacked(struct peer *peer, uint64_t id,
				   const Dlshare__Create *m)
{
	uint64_t host = 0;

	for (size_t i = 0; i < m->n_buffers; i++)
		if (m->buffers[i]->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST)
			host += m->buffers[i]->size;
	uint64_t limit, usage;
	char where[256];

	/* The limit named, where it can be read: memcg_limit reads the
	 * group found at start (three small files), and walks cgroupfs
	 * again only when that answer is stale (memcg.h). */
	if (memcg_limit(&limit, &usage, where, sizeof(where)) == 0) {
		conn_send_error(&peer->conn, id, DLSHARE_ENOMEM,
				"create %s: the daemon could not allocate the "
				"%llu bytes (%.1f MiB) of host memory of this "
				"version: its memory cgroup's limit of %llu "
				"bytes (%.1f MiB, %.1f MiB in use; %s; "
				"MemoryMax), or the machine's memory, is "
				"reached", m->name, (unsigned long long)host,
				(double)host / (1024.0 * 1024.0),
				(unsigned long long)limit,
				(double)limit / (1024.0 * 1024.0),
				(double)usage / (1024.0 * 1024.0), where);
		return;
	}
	conn_send_error(&peer->conn, id, DLSHARE_ENOMEM,
			"create %s: the daemon could not allocate the %llu "
			"bytes (%.1f MiB) of host memory of this version: its "
			"memory cgroup's limit (MemoryMax), or the machine's "
			"memory, is reached", m->name, (unsigned long long)host,
			(double)host / (1024.0 * 1024.0));
}

/* Whether m, refused for a full queue, goes back to wait for room: it
 * asked to wait, and carries no manifest memfd (that would wait with it:
 * such a Create never waits, dispatch.c). */
static int create_may_wait(const struct daemon *d, const Dlshare__Create *m,
			   const struct registry_manifest *manifest)
{
	return d->create_full && m->has_queue_depth && m->has_wait_ms &&
	       m->wait_ms != 0 && !manifest;
}

/* j's Create found its queue full once its buffers were made: it goes back
 * to wait for room, as it was asked (the GPU buffers of j's copy described
 * as before they were made), until its first deadline. What j made is
 * freed with j, as after any refusal; the next try makes its own. */
static void create_wait_again(struct peer *peer, uint64_t id,
			      struct gpu_job *j)
{
	Dlshare__Create *m = j->create;

	for (size_t i = 0; i < m->n_buffers; i++) {
		Dlshare__Buffer *b = m->buffers[i];

		if (!j->made[i] || j->host[i])
			continue;
		b->size = j->asked[i];
		b->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM;
		b->has_ipc_handle = 0;
		b->ipc_handle.data = NULL;
		b->ipc_handle.len = 0;
		b->has_ipc_offset = 0;
		b->ipc_offset = 0;
	}
	peer->d->create_full(peer, id, m, j->deadline);
}

/* Registers a store version whose GPU memory (if any, in j) is made, and
 * answers with every buffer's fd. The version's cuda-vmm buffers count the
 * producer among their holders: it maps them, and must hear when they go.
 * With cuda-ipc buffers the producer gets a writer lease. What the
 * registry did not take stays j's. */
static void create_finish(struct peer *peer, uint64_t id,
			  const Dlshare__Create *m, struct gpu_job *j,
			  struct registry_manifest *manifest)
{
	struct daemon *d = peer->d;
	struct registry_spec spec = {
		.manifest = manifest,
		.name = m->name, .mode = m->mode,
		.owned = m->has_owned && m->owned,
		.ttl_ms = m->has_ttl_ms ? m->ttl_ms : 0,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.fds = j ? j->fds : NULL,
		.made = j ? j->made : NULL,
		.queue = m->has_queue_depth,
		.queue_depth = m->queue_depth,
		.origin_node = m->origin_node,
		.origin_version = m->has_origin_version ? m->origin_version : 0,
	};
	Dlshare__Frame out = DLSHARE__FRAME__INIT;
	Dlshare__CreateReply r = DLSHARE__CREATE_REPLY__INIT;
	int attach[REGISTRY_BUFFERS_HARD_MAX];
	struct encode_version w;
	struct refusal why = { 0 };
	struct version *v;
	struct lease *l;
	int err, ipc = 0;

	err = registry_add(&d->reg, &peer->owner, &spec, 0, &v, &why);
	if (err == HOST_ENOBACK) {
		create_refuse_unbacked(peer, id, m);
		return;
	}
	/* Others filled the queue while j's buffers were made (a Create
	 * made on the loop was let through by the gate this very turn). */
	if (err == -EAGAIN && j && create_may_wait(d, m, manifest)) {
		create_wait_again(peer, id, j);
		return;
	}
	if (err == -EAGAIN) {
		reply_queue_full(peer, id, "create", m->name, 0);
		return;
	}
	if (err) {
		reply_err_why(peer, id, err, &why, "create", m->name);
		return;
	}
	for (size_t i = 0; j && i < v->nbuffers; i++) {
		struct devmem *dm;

		if (!j->made[i] || j->mem[i].kind != GPU_CUDA_IPC)
			continue;
		dm = calloc(1, sizeof(*dm));
		if (!dm) {
			registry_abort(&d->reg, &peer->owner, m->name,
				       v->number, registry_writer(v));
			reply_err(peer, id, -ENOMEM, "create", m->name);
			return;
		}
		dm->id = v->buffers[i]->id;
		dm->ptr = j->mem[i].ptr;
		dm->ordinal = j->mem[i].ordinal;
		HASH_ADD(hh, d->devmem, id, sizeof(dm->id), dm);
		j->made[i] = 0; /* freed with the buffer from here */
		ipc = 1;
	}
	err = ipc ? registry_lease(&d->reg, &peer->owner, v, &l, &why) : 0;
	for (size_t i = 0; i < v->nbuffers; i++)
		attach[i] = 1;
	if (!err && encode_version_init(&w, v, attach,
						ENCODE_MANIFEST_FD))
		err = -ENOMEM;
	if (err) {
		registry_abort(&d->reg, &peer->owner, m->name, v->number,
			       registry_writer(v));
		reply_err_why(peer, id, err, &why, "create", m->name);
		return;
	}
	r.version = v->number;
	r.has_writer = 1;
	r.writer = registry_writer(v);
	r.n_buffers = v->nbuffers;
	r.buffers = w.bp;
	if (ipc) {
		r.has_writer_lease = 1;
		r.writer_lease = l->id;
	}
	out.id = id;
	out.body_case = DLSHARE__FRAME__BODY_CREATE_REPLY;
	out.create_reply = &r;
	/* A failed send dooms c, and its pending version goes with it. The
	 * writer gets its buffers' fds, not the manifest's it sent (last). */
	err = conn_send(&peer->conn, &out, w.fds,
			w.nfds - (unsigned)w.has_manifest);
	encode_version_deinit(&w);
	if (err || !conn_open(&peer->conn))
		return;
	for (size_t i = 0; i < v->nbuffers; i++)
		if (v->buffers[i]->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM &&
		    peer_sent_add(peer, v->buffers[i]))
			return;
}

static int is_gpu_buffer(const Dlshare__Buffer *b)
{
	return b->device && b->device->type == kDLCUDA &&
	       (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_UNSPECIFIED ||
		b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM);
}

/* Frees what j made and nobody took (any thread: cudaFree blocks). */
static void gpu_job_unmake(struct gpu_job *j)
{
	for (size_t i = 0; i < REGISTRY_BUFFERS_HARD_MAX; i++) {
		if (!j->made[i])
			continue;
		if (!j->host[i] && j->mem[i].kind == GPU_CUDA_IPC)
			gpu_free_ipc(j->mem[i].ptr, j->mem[i].ordinal);
		j->made[i] = 0;
	}
	wire_close_fds(j->fds, REGISTRY_BUFFERS_HARD_MAX);
}

/* Thread pool: makes the GPU buffers and the host ones, all or none. */
static void gpu_job_work(uv_work_t *req)
{
	struct gpu_job *j = req->data;
	const Dlshare__Create *m = j->create;

	for (size_t i = 0; i < m->n_buffers && !j->err; i++) {
		const Dlshare__Buffer *b = m->buffers[i];

		if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST) {
			uint64_t actual;
			int fd = host_create(m->name, b->size, j->huge_min,
					     &actual);

			if (fd < 0) {
				j->err = fd;
			} else {
				j->made[i] = 1;
				j->host[i] = 1;
				j->fds[i] = fd;
			}
			continue;
		}
		if (!is_gpu_buffer(b))
			continue;
		j->err = gpu_alloc(b->device->uuid.data, b->size, &j->mem[i],
				   &j->why);
		if (!j->err) {
			j->made[i] = 1;
			j->fds[i] = j->mem[i].fd;
		}
	}
	if (j->err)
		gpu_job_unmake(j);
}

/* Loop thread: frees j, and what it made that nobody took (off the loop:
 * cudaFree waits for the device). */
static void gpu_job_free(struct gpu_job *j)
{
	/* The memfds made for a create that failed after all may be
	 * large: their close frees the pages. */
	daemon_drop_fds(j->d, &j->manifest.fd, 1);
	daemon_drop_fds(j->d, j->fds, REGISTRY_BUFFERS_HARD_MAX);
	for (size_t i = 0; i < REGISTRY_BUFFERS_HARD_MAX; i++)
		if (j->made[i] && !j->host[i] && j->mem[i].kind == GPU_CUDA_IPC)
			devmem_free(j->d, j->mem[i].ptr, j->mem[i].ordinal);
	dlshare__create__free_unpacked(j->create, NULL);
	free(j);
}

static void gpu_job_done(uv_work_t *req, int status);

static void gpu_job_again(struct closer_wait *w)
{
	struct gpu_job *j = (struct gpu_job *)((char *)w -
					       offsetof(struct gpu_job, again));

	/* Fails only without a work callback. */
	(void)uv_queue_work(j->d->loop, &j->req, gpu_job_work, gpu_job_done);
}

/* Loop: answers the Create, unless its peer went meanwhile. */
static void gpu_job_done(uv_work_t *req, int status)
{
	struct gpu_job *j = req->data;
	struct peer *peer = j->peer;
	Dlshare__Create *m = j->create;
	struct daemon *d = j->d;

	if (!peer) {
		gpu_job_free(j);
		return;
	}
	/* The memory may have been short only until the pages of buffers
	 * let go just before were freed, off the loop (closer.c): then the
	 * buffers are made once more, after the frees pending now, or at
	 * once when some finished since the job went. The job stays its
	 * peer's meanwhile. */
	if (!status && j->err == HOST_ENOBACK && !j->retried &&
	    (closer_busy(&d->closer) ||
	     closer_jobs_done(&d->closer) != j->closer_jobs)) {
		j->retried = 1;
		j->err = 0;
		j->again.fn = gpu_job_again;
		if (closer_busy(&d->closer))
			closer_when_idle(&d->closer, &j->again);
		else
			gpu_job_again(&j->again);
		return;
	}
	DL_DELETE(peer->jobs, j);
	peer->inflight--;
	peer_answering(peer, METRICS_REQ_CREATE);
	if (!conn_open(&peer->conn)) {
		/* Doomed meanwhile: nothing to answer. */
	} else if (!status && j->err == HOST_ENOBACK) {
		create_refuse_unbacked(peer, j->id, m);
	} else if (!status && j->err && !j->why) {
		reply_err(peer, j->id, j->err, "create", m->name);
	} else if (status || j->err) {
		conn_send_error(&peer->conn, j->id, status ? DLSHARE_EIO :
				reply_code(j->err), "create %s: %s",
				m->name, status ? uv_strerror(status) : j->why);
	} else {
		for (size_t i = 0; i < m->n_buffers; i++) {
			Dlshare__Buffer *b = m->buffers[i];

			/* A memfd keeps the size asked for (the registry
			 * reads the rounding of huge pages off the fd). */
			if (!j->made[i] || j->host[i])
				continue;
			b->size = j->mem[i].size;
			if (j->mem[i].kind == GPU_CUDA_VMM) {
				b->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM;
				continue;
			}
			b->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
			b->has_ipc_handle = 1;
			b->ipc_handle.data = j->mem[i].handle;
			b->ipc_handle.len = GPU_IPC_HANDLE_LEN;
			b->has_ipc_offset = 1;
			b->ipc_offset = 0;
		}
		create_finish(peer, j->id, m, j,
			      j->manifest.fd >= 0 ? &j->manifest : NULL);
		/* The copy frees what it unpacked, not j's handle bytes (a
		 * GPU buffer of the copy had none: create_gpu). */
		for (size_t i = 0; i < m->n_buffers; i++)
			if (m->buffers[i]->ipc_handle.data == j->mem[i].handle) {
				m->buffers[i]->has_ipc_handle = 0;
				m->buffers[i]->ipc_handle.data = NULL;
			}
	}
	peer_answering(peer, METRICS_REQ_OTHER);
	gpu_job_free(j);
	conn_reap(&d->conns);
}

/* Starts making m's GPU buffers. The request is checked first, so that
 * nothing is allocated for a create that would be refused anyway. */
static void create_gpu(struct peer *peer, uint64_t id, const Dlshare__Create *m,
		       struct registry_manifest *manifest, uint64_t deadline)
{
	struct daemon *d = peer->d;
	struct registry_spec spec = {
		.manifest = manifest,
		.name = m->name, .mode = m->mode,
		.owned = m->has_owned && m->owned,
		.ttl_ms = m->has_ttl_ms ? m->ttl_ms : 0,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.precheck = 1,
		.queue = m->has_queue_depth,
		.queue_depth = m->queue_depth,
		.origin_node = m->origin_node,
		.origin_version = m->has_origin_version ? m->origin_version : 0,
	};
	struct refusal why = { 0 };
	struct gpu_job *j;
	uint8_t *packed;
	size_t len;
	int err;

	/* A GPU buffer is the daemon's to describe: whatever handle the
	 * peer put on it is not kept (nor copied below). */
	for (size_t i = 0; i < m->n_buffers; i++)
		if (is_gpu_buffer(m->buffers[i])) {
			m->buffers[i]->kind =
				DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM;
			m->buffers[i]->has_ipc_handle = 0;
		}
	err = registry_precheck(&d->reg, &peer->owner, &spec, 0, &why);
	/* Full, though the gate found room: back to it (it parks m, or lets
	 * it through again when there is room now; it agrees with the
	 * precheck, so this does not go round). */
	if (err == -EAGAIN && create_may_wait(d, m, manifest)) {
		d->create_full(peer, id, m, deadline);
		return;
	}
	if (err == -EAGAIN) {
		reply_queue_full(peer, id, "create", m->name, 0);
		return;
	}
	if (err) {
		reply_err_why(peer, id, err, &why, "create", m->name);
		return;
	}
	if (peer->inflight >= d->limits->max_inflight) {
		peer_limit_hit(peer, METRICS_LIMIT_MAX_INFLIGHT);
		conn_send_error(&peer->conn, id, DLSHARE_ELIMIT,
				"create %s: too many requests in flight on this connection (limit %u)",
				m->name, d->limits->max_inflight);
		return;
	}
	j = calloc(1, sizeof(*j));
	len = dlshare__create__get_packed_size(m);
	packed = malloc(len ? len : 1);
	if (!j || !packed) {
		free(j);
		free(packed);
		reply_err(peer, id, -ENOMEM, "create", m->name);
		return;
	}
	/* The request's memory goes with its packet: keep a copy. */
	dlshare__create__pack(m, packed);
	j->create = dlshare__create__unpack(NULL, len, packed);
	free(packed);
	if (!j->create) {
		free(j);
		reply_err(peer, id, -ENOMEM, "create", m->name);
		return;
	}
	for (size_t i = 0; i < REGISTRY_BUFFERS_HARD_MAX; i++)
		j->fds[i] = -1;
	for (size_t i = 0; i < j->create->n_buffers; i++)
		j->asked[i] = j->create->buffers[i]->size;
	j->deadline = deadline;
	j->manifest.fd = -1;
	if (manifest) {
		/* The job holds the checked manifest until registry_add. */
		j->manifest = *manifest;
		manifest->fd = -1;
	}
	j->id = id;
	j->d = d;
	j->huge_min = d->reg.limits.huge_min;
	j->peer = peer;
	j->req.data = j;
	j->closer_jobs = closer_jobs_done(&d->closer);
	err = uv_queue_work(d->loop, &j->req, gpu_job_work, gpu_job_done);
	if (err) {
		gpu_job_free(j);
		reply_err(peer, id, -ENOMEM, "create", m->name);
		return;
	}
	DL_APPEND(peer->jobs, j);
	peer->inflight++;
}

/* Makes the version's buffers: on the loop when they are host memory under
 * CREATE_BACK_INLINE_MAX in all (backing them is quick), else on the thread
 * pool; there too while the closer frees let-go buffers, so that a create
 * the memory those hold refuses is made again once they are freed
 * (gpu_job_done). The manifest, when there is one, goes along. */
static void create_route(struct peer *peer, uint64_t id,
			 const Dlshare__Create *m,
			 struct registry_manifest *manifest, uint64_t deadline)
{
	uint64_t host = 0;

	for (size_t i = 0; i < m->n_buffers; i++) {
		const Dlshare__Buffer *b = m->buffers[i];

		if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST &&
		    __builtin_add_overflow(host, b->size, &host))
			host = UINT64_MAX;
		if (is_gpu_buffer(b) || host >= CREATE_BACK_INLINE_MAX) {
			create_gpu(peer, id, m, manifest, deadline);
			return;
		}
	}
	if (host && closer_busy(&peer->d->closer)) {
		create_gpu(peer, id, m, manifest, deadline);
		return;
	}
	create_finish(peer, id, m, NULL, manifest);
}

uint64_t create_wait_deadline(struct daemon *d, const Dlshare__Create *m)
{
	uint64_t now = uv_now(d->loop);

	if (!m->has_wait_ms || m->wait_ms == 0)
		return now;
	return m->wait_ms == UINT32_MAX ? UINT64_MAX : now + m->wait_ms;
}

void create_resume(struct peer *peer, uint64_t id, const Dlshare__Create *m,
		   uint64_t deadline)
{
	if (m->n_buffers > REGISTRY_BUFFERS_HARD_MAX) {
		reply_limit(peer, id, -E2BIG, METRICS_LIMIT_MAX_TENSORS, "create",
			    m->name);
		return;
	}
	if (reply_refuse_same_keys(peer, id, "create", m->name, m->tensors,
				   m->n_tensors))
		return;
	create_route(peer, id, m, NULL, deadline);
}

void create_request(struct peer *peer, const Dlshare__Frame *f,
		    const Dlshare__Create *m)
{
	if (!reply_fits(peer, f)) {
		reply_limit(peer, f->id, -EMSGSIZE, METRICS_LIMIT_MAX_PACKET,
			    "create", m->name);
		return;
	}
	create_resume(peer, f->id, m, create_wait_deadline(peer->d, m));
}

void create_checked(struct peer *peer, const Dlshare__Frame *f, int *fds,
		    unsigned nfds, struct registry_manifest *manifest)
{
	const Dlshare__Create *m = f->create;

	/* A Create carries no fd but its manifest's. */
	if (nfds) {
		daemon_drop_fds(peer->d, fds, nfds);
		conn_send_error(&peer->conn, f->id, DLSHARE_EINVAL,
				"create %s: a Create carries only its "
				"manifest's fd", m->name);
		return;
	}
	create_route(peer, f->id, m, manifest,
		     create_wait_deadline(peer->d, m));
}

void create_buffer_freed(struct daemon *d, const struct rbuffer *b)
{
	struct devmem *dm = NULL;

	if (b->daemon_owned && b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC)
		HASH_FIND(hh, d->devmem, &b->id, sizeof(b->id), dm);
	if (dm) {
		HASH_DEL(d->devmem, dm);
		devmem_free(d, dm->ptr, dm->ordinal);
		free(dm);
	}
}

void create_peer_closed(struct peer *peer)
{
	struct gpu_job *j, *tmp;

	/* A job in the pool finishes on its own, and then finds no peer. */
	DL_FOREACH_SAFE(peer->jobs, j, tmp) {
		DL_DELETE(peer->jobs, j);
		peer->inflight--;
		j->peer = NULL;
	}
}

void create_deinit(struct daemon *d)
{
	struct devmem *dm, *dtmp;

	/* cuda-ipc memory of versions still alive goes with the process (its
	 * readers may still map it: freeing it under them would be worse). */
	HASH_ITER(hh, d->devmem, dm, dtmp) {
		HASH_DEL(d->devmem, dm);
		free(dm);
	}
}
