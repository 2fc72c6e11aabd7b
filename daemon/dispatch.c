/* dispatch — routing requests, the small ones, and the callbacks. */
#include "dispatch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

#include "check.h"
#include "encode.h"
#include "get.h"
#include "gpu.h"
#include "list.h"
#include "log.h"
#include "peer.h"
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
	f.body_case = DLSHARE__FRAME__BODY_HELLO_REPLY;
	f.hello_reply = &r;
	reply_send(peer, id, &f);
}

/* ---- daemon-owned cuda-ipc memory ---------------------------------------
 * cudaMalloc memory of the daemon (the fallback where the driver cannot
 * export VMM memory as an fd), by buffer id: freed on the thread pool when
 * the registry frees the buffer. By then every process closed it: readers
 * close their mapping before they release their lease, and the writer
 * holds a lease until it closed its own. */
struct devmem {
	uint64_t id;              /* the buffer's */
	void *ptr;
	int ordinal;
	UT_hash_handle hh;        /* server->devmem */
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

/* A Create whose GPU buffers are being made on the thread pool: a GPU
 * allocation may take long (the driver's first call, a full device), and
 * the loop never waits. It counts as a request in flight of its peer. */
struct gpu_job {
	uv_work_t req;
	struct daemon *d;
	struct peer *peer;        /* NULL once the peer went */
	struct gpu_job *prev, *next; /* peer->jobs */
	uint64_t id;
	Dlshare__Create *create;  /* a copy of the request */
	int made[REGISTRY_BUFFERS_HARD_MAX];     /* mem[i] is ours to free */
	struct gpu_mem mem[REGISTRY_BUFFERS_HARD_MAX];
	int fds[REGISTRY_BUFFERS_HARD_MAX];      /* cuda-vmm: mem[i].fd */
	int err;
	const char *why;
};

/* Registers a store version whose GPU memory (if any, in j) is made, and
 * answers with every buffer's fd. The version's cuda-vmm buffers count the
 * producer among their holders: it maps them, and must hear when they go.
 * With cuda-ipc buffers the producer gets a writer lease. What the
 * registry did not take stays j's. */
static void create_finish(struct peer *peer, uint64_t id,
			  const Dlshare__Create *m, struct gpu_job *j)
{
	struct daemon *d = peer->d;
	struct registry_spec spec = {
		.name = m->name, .mode = m->mode,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.fds = j ? j->fds : NULL,
		.made = j ? j->made : NULL,
	};
	Dlshare__Frame out = DLSHARE__FRAME__INIT;
	Dlshare__CreateReply r = DLSHARE__CREATE_REPLY__INIT;
	int attach[REGISTRY_BUFFERS_HARD_MAX];
	struct encode_version w;
	const char *why = NULL;
	struct version *v;
	struct lease *l;
	int err, ipc = 0;

	err = registry_add(&d->reg, &peer->owner, &spec, 0, &v, &why);
	if (err) {
		reply_err_why(peer, id, err, why, "create", m->name);
		return;
	}
	for (size_t i = 0; j && i < v->nbuffers; i++) {
		struct devmem *dm;

		if (!j->made[i] || j->mem[i].kind != GPU_CUDA_IPC)
			continue;
		dm = calloc(1, sizeof(*dm));
		if (!dm) {
			registry_abort(&d->reg, &peer->owner, m->name,
				       v->number, v->writer);
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
	if (!err && encode_version_init(&w, v, attach))
		err = -ENOMEM;
	if (err) {
		registry_abort(&d->reg, &peer->owner, m->name, v->number,
			       v->writer);
		reply_err_why(peer, id, err, why, "create", m->name);
		return;
	}
	r.version = v->number;
	r.has_writer = 1;
	r.writer = v->writer;
	r.n_buffers = v->nbuffers;
	r.buffers = w.bp;
	if (ipc) {
		r.has_writer_lease = 1;
		r.writer_lease = l->id;
	}
	out.id = id;
	out.body_case = DLSHARE__FRAME__BODY_CREATE_REPLY;
	out.create_reply = &r;
	/* A failed send dooms c, and its pending version goes with it. */
	err = conn_send(&peer->conn, &out, w.fds, w.nfds);
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
		if (j->mem[i].kind == GPU_CUDA_IPC)
			gpu_free_ipc(j->mem[i].ptr, j->mem[i].ordinal);
		j->made[i] = 0;
	}
	wire_close_fds(j->fds, REGISTRY_BUFFERS_HARD_MAX);
}

/* Thread pool: makes the GPU buffers, all or none. */
static void gpu_job_work(uv_work_t *req)
{
	struct gpu_job *j = req->data;
	const Dlshare__Create *m = j->create;

	for (size_t i = 0; i < m->n_buffers && !j->err; i++) {
		const Dlshare__Buffer *b = m->buffers[i];

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
	wire_close_fds(j->fds, REGISTRY_BUFFERS_HARD_MAX);
	for (size_t i = 0; i < REGISTRY_BUFFERS_HARD_MAX; i++)
		if (j->made[i] && j->mem[i].kind == GPU_CUDA_IPC)
			devmem_free(j->d, j->mem[i].ptr, j->mem[i].ordinal);
	dlshare__create__free_unpacked(j->create, NULL);
	free(j);
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
	DL_DELETE(peer->jobs, j);
	peer->inflight--;
	if (!conn_open(&peer->conn)) {
		/* Doomed meanwhile: nothing to answer. */
	} else if (status || j->err) {
		conn_send_error(&peer->conn, j->id, status ? DLSHARE_EIO :
				reply_code(j->err), "create %s: %s",
				m->name, status ? uv_strerror(status) : j->why);
	} else {
		for (size_t i = 0; i < m->n_buffers; i++) {
			Dlshare__Buffer *b = m->buffers[i];

			if (!j->made[i])
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
		create_finish(peer, j->id, m, j);
		/* The copy frees what it unpacked, not j's handle bytes (a
		 * GPU buffer of the copy had none: create_gpu). */
		for (size_t i = 0; i < m->n_buffers; i++)
			if (m->buffers[i]->ipc_handle.data == j->mem[i].handle) {
				m->buffers[i]->has_ipc_handle = 0;
				m->buffers[i]->ipc_handle.data = NULL;
			}
	}
	gpu_job_free(j);
	conn_reap(&d->conns);
}

/* Starts making m's GPU buffers. The request is checked first, so that
 * nothing is allocated for a create that would be refused anyway. */
static void create_gpu(struct peer *peer, uint64_t id, const Dlshare__Create *m)
{
	struct daemon *d = peer->d;
	struct registry_spec spec = {
		.name = m->name, .mode = m->mode,
		.tensors = m->tensors, .ntensors = m->n_tensors,
		.buffers = m->buffers, .nbuffers = m->n_buffers,
		.precheck = 1,
	};
	const char *why = NULL;
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
	if (err) {
		reply_err_why(peer, id, err, why, "create", m->name);
		return;
	}
	if (peer->inflight >= d->limits->max_inflight) {
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
	j->id = id;
	j->d = d;
	j->peer = peer;
	j->req.data = j;
	err = uv_queue_work(d->loop, &j->req, gpu_job_work, gpu_job_done);
	if (err) {
		gpu_job_free(j);
		reply_err(peer, id, -ENOMEM, "create", m->name);
		return;
	}
	DL_APPEND(peer->jobs, j);
	peer->inflight++;
}

static void handle_create(struct peer *peer, const Dlshare__Frame *f,
			  const Dlshare__Create *m)
{
	if (!reply_fits(peer, f)) {
		reply_err(peer, f->id, -EMSGSIZE, "create", m->name);
		return;
	}
	if (m->n_buffers > REGISTRY_BUFFERS_HARD_MAX) {
		reply_err(peer, f->id, -E2BIG, "create", m->name);
		return;
	}
	if (reply_refuse_same_keys(peer, f->id, "create", m->name, m->tensors,
			     m->n_tensors))
		return;
	for (size_t i = 0; i < m->n_buffers; i++)
		if (is_gpu_buffer(m->buffers[i])) {
			create_gpu(peer, f->id, m);
			return;
		}
	create_finish(peer, f->id, m, NULL);
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
		reply_no_pending(peer, id, "abort", m->name,
					  m->version, writer);
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
	r.info = &ni;
	if (e->latest) {
		if (encode_version_init(&w, e->latest, NULL)) {
			reply_err(peer, id, -ENOMEM, "stat", m->name);
			return;
		}
		have_w = 1;
		r.n_tensors = e->latest->ntensors;
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
		handle_create(peer, f, f->create);
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
	struct gpu_job *j, *tmp;

	get_peer_closed(peer);
	seal_peer_closed(peer);
	/* A job in the pool finishes on its own, and then finds no peer. */
	DL_FOREACH_SAFE(peer->jobs, j, tmp) {
		DL_DELETE(peer->jobs, j);
		peer->inflight--;
		j->peer = NULL;
	}
	peer_drop(peer);
}

void dispatch_deinit(struct daemon *d)
{
	struct devmem *dm, *dtmp;

	seal_deinit(d);
	get_deinit(d);
	/* cuda-ipc memory of versions still alive goes with the process (its
	 * readers may still map it: freeing it under them would be worse). */
	HASH_ITER(hh, d->devmem, dm, dtmp) {
		HASH_DEL(d->devmem, dm);
		free(dm);
	}
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
	struct daemon *d = ud;
	struct devmem *dm = NULL;

	if (b->daemon_owned && b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC)
		HASH_FIND(hh, d->devmem, &b->id, sizeof(b->id), dm);
	if (dm) {
		HASH_DEL(d->devmem, dm);
		devmem_free(d, dm->ptr, dm->ordinal);
		free(dm);
	}
	peer_buffer_freed(b);
}

const struct registry_ops dispatch_registry_ops = {
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
