/* producer — create/seal (store mode) and publish (export mode, or a copy
 * into store mode when the memory cannot be shared). */
#include "internal.h"

#include "cudalib.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Tensors in a store buffer start on this boundary (a cache line, and
 * enough for any vector load). */
#define PRODUCER_ALIGN 64u

struct wtensor {
	DLTensor t;
	uint64_t offset;         /* in the buffer */
	int64_t shape[CHECK_NDIM_MAX];
};

/* writer_create's flags. WRITER_FD: a host buffer is not mapped; the
 * writer keeps its memfd (w->fd) and fills it with pwrite, which costs no
 * page faults and no munmap before the seal: the copy of publish. */
#define WRITER_FD 1u

struct dlshare_writer {
	dlshare_client *c;
	char name[CHECK_NAME_MAX + 1];
	uint64_t version;
	uint64_t writer;         /* CreateReply.writer: what Seal and Abort
				  * name the version by (0: a daemon before
				  * 1.3, which goes by name and version) */
	void *base;
	int fd;                  /* host: the memfd (WRITER_FD: unmapped;
				  * else kept, when fd_listed, to write-seal
				  * it at dlshare_seal), or -1 */
	int fd_listed;           /* fd is on the client's fork list
				  * (fork_keep_fd) */
	int cuda_host;           /* base is registered with CUDA */
	struct ibuf *dev;        /* device buffer: the library's mapping */
	int ordinal;             /* device buffer: the local device */
	uint64_t lease;          /* daemon-owned cuda-ipc: held until our
				  * mapping is closed (0: none) */
	uint64_t size;
	size_t n;
	struct wtensor *ts;
	int seal_busy;           /* our F_SEAL_WRITE was refused (EBUSY) */
};

/* Wire descriptions of n tensors; lives for one request. */
struct wire_tensors {
	Dlshare__Tensor *t;
	Dlshare__Tensor **tp;
	Dlshare__DataType *dt;
};

static void wire_tensors_free(struct wire_tensors *w)
{
	free(w->t);
	free(w->tp);
	free(w->dt);
}

static int wire_tensors_alloc(struct wire_tensors *w, size_t n)
{
	w->t = calloc(n, sizeof(*w->t));
	w->tp = calloc(n, sizeof(*w->tp));
	w->dt = calloc(n, sizeof(*w->dt));
	if (!w->t || !w->tp || !w->dt) {
		wire_tensors_free(w);
		return DLSHARE_ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		dlshare__tensor__init(&w->t[i]);
		dlshare__data_type__init(&w->dt[i]);
		w->t[i].dtype = &w->dt[i];
		w->tp[i] = &w->t[i];
	}
	return 0;
}

static void wire_tensor_set(Dlshare__Tensor *wt, const char *key,
			    DLDataType dtype, int32_t ndim, int64_t *shape,
			    int64_t *strides, uint32_t buffer, uint64_t offset)
{
	wt->key = (char *)(key ? key : "");
	wt->dtype->code = dtype.code;
	wt->dtype->bits = dtype.bits;
	wt->dtype->lanes = dtype.lanes;
	wt->n_shape = (size_t)ndim;
	wt->shape = shape;
	wt->n_strides = strides ? (size_t)ndim : 0;
	wt->strides = strides;
	wt->buffer = buffer;
	wt->offset = offset;
}

/* The daemon's answer to tensors that share a key, given before asking
 * it. Returns 0, DLSHARE_EINVAL (with the message) or DLSHARE_ENOMEM. */
static int keys_unique(Dlshare__Tensor *const *t, size_t n)
{
	char msg[320];
	size_t a, b;
	int err = check_keys(t, n, &a, &b);

	if (err == -EINVAL) {
		snprintf(msg, sizeof(msg),
			 "tensors %zu and %zu have the same key \"%s\"", a, b,
			 t[a]->key);
		errmsg_set(msg);
		return DLSHARE_EINVAL;
	}
	return err ? DLSHARE_ENOMEM : 0;
}

static int simple_call(dlshare_client *c, Dlshare__Frame *f,
		       Dlshare__Frame__BodyCase want)
{
	struct reply r;
	int err = client_call(c, f, NULL, 0, NULL, &r);

	if (err)
		return err;
	if (r.msg->frame->body_case != want)
		err = DLSHARE_EPROTO;
	reply_free(c, &r);
	return err;
}

/* Drops w's pending version. A clean-up after a failure: the failure is
 * what the caller reports, so its message (dlshare_last_error) stays. */
static void send_abort(dlshare_writer *w)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Abort a = DLSHARE__ABORT__INIT;
	char why[256];

	snprintf(why, sizeof(why), "%s", dlshare_last_error());
	a.name = w->name;
	a.version = w->version;
	a.has_writer = w->writer != 0;
	a.writer = w->writer;
	f.body_case = DLSHARE__FRAME__BODY_ABORT;
	f.abort = &a;
	/* Failure leaves a pending version that dies with the connection. */
	simple_call(w->c, &f, DLSHARE__FRAME__BODY_OK);
	errmsg_set(why);
}

/* Closes w's memfd, taking it off the client's fork list first. */
static void writer_close_fd(dlshare_writer *w)
{
	if (w->fd < 0)
		return;
	if (w->fd_listed)
		fork_forget_fd(w->c, w->fd);
	close(w->fd);
	w->fd = -1;
	w->fd_listed = 0;
}

/* Drops the writable mapping (and its CUDA registration), and with seal
 * (dlshare_seal) write-seals the memfd it kept: F_SEAL_WRITE, which the
 * kernel grants only once no writable mapping of it is left anywhere, is
 * what the daemon would add on its thread pool; finding it there, the
 * daemon publishes at once (daemon/seal.c). Where it fails (a pinned page,
 * another mapping), the daemon's own seal says why. A device buffer's
 * mapping is the import cache's: unpinned, it stays cached until the
 * daemon frees the buffer. */
static void writer_unmap(dlshare_writer *w, int seal)
{
	if (w->dev) {
		client_unpin(w->c, &w->dev, 1);
		client_release(w->c, w->lease);
		w->lease = 0;
		w->dev = NULL;
		w->base = NULL;
		return;
	}
	if (w->cuda_host)
		cuda_host_unregister(w->base);
	w->cuda_host = 0;
	hostmem_unmap(w->base, w->size);
	w->base = NULL;
	if (seal && w->fd >= 0 &&
	    fcntl(w->fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EBUSY)
		w->seal_busy = 1;
	writer_close_fd(w);
}

static void writer_free(dlshare_writer *w)
{
	writer_unmap(w, 0);
	client_unref(w->c);
	free(w->ts);
	free(w);
}

/* Frees a writer this process inherited from the one that created it
 * (this one is a fork of it): the version and the client are the
 * parent's, and the mapping was never ours (MADV_DONTFORK), so an munmap
 * could only hit a mapping of our own made at that address since. */
static void writer_forget(dlshare_writer *w)
{
	free(w->ts);
	free(w);
}

/* Describes a manifest memfd of size bytes, attached (protocol 1.4). */
static void manifest_buffer(Dlshare__Buffer *b, Dlshare__Device *dev,
			    uint64_t size)
{
	dev->type = kDLCPU;
	b->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b->size = size;
	b->device = dev;
	b->has_fd_attached = 1;
	b->fd_attached = 1;
}

/* A name's lifetime (owned, TTL) needs a daemon of protocol 1.4: an older
 * one would ignore it, and the name would live on. Returns 0 or
 * DLSHARE_ENOTSUP. */
static int lifetimes_supported(dlshare_client *c, const char *name)
{
	if (c->lifetimes)
		return 0;
	errmsg_set("owned names and TTLs need a daemon of protocol 1.4 or "
		   "later; this one is older and would keep the name");
	(void)name;
	return DLSHARE_ENOTSUP;
}

/* A version's origin (protocol 1.5): refused here as the daemon would
 * refuse it, and refused for a daemon too old to keep it (it would drop
 * it without a word). Returns 0, DLSHARE_EINVAL or DLSHARE_ENOTSUP
 * (dlshare_last_error() says why). */
static int origin_ok(dlshare_client *c, const char *name, const char *node,
		     uint64_t version)
{
	const char *why = check_origin_why(node, version);
	char msg[512];

	if (why) {
		snprintf(msg, sizeof(msg), "%s: origin_node: %s", name, why);
		errmsg_set(msg);
		return DLSHARE_EINVAL;
	}
	if (node && !c->origins) {
		snprintf(msg, sizeof(msg), "%s: a version's origin needs a "
			 "daemon of protocol 1.5 or later; this one is older "
			 "and would drop it", name);
		errmsg_set(msg);
		return DLSHARE_ENOTSUP;
	}
	return 0;
}

/* ---- store mode ---------------------------------------------------------- */

/* Queue options on the wire (Create and Publish share the fields).
 * Returns 0 or DLSHARE_EINVAL. */
static int queue_wire(const dlshare_queue_opts *q, protobuf_c_boolean *has_depth,
		      uint32_t *depth, protobuf_c_boolean *has_wait,
		      uint32_t *wait)
{
	if (!q)
		return 0;
	if (q->wait_ms < 0 && q->wait_ms != DLSHARE_WAIT_FOREVER)
		return DLSHARE_EINVAL;
	*has_depth = 1;
	*depth = q->depth;
	*has_wait = q->wait_ms != 0;
	*wait = q->wait_ms < 0 ? UINT32_MAX : (uint32_t)q->wait_ms;
	return 0;
}

/* dlshare_create, with queue options (NULL: an ordinary name) and flags
 * (WRITER_*). */
static int writer_create(dlshare_client *c, const char *name,
			 const dlshare_tensor_spec *specs, size_t n,
			 const dlshare_create_opts *opts,
			 const dlshare_queue_opts *q, unsigned flags,
			 dlshare_writer **out);

int dlshare_create(dlshare_client *c, const char *name,
		   const dlshare_tensor_spec *specs, size_t n,
		   const dlshare_create_opts *opts, dlshare_writer **out)
{
	CALL_UNCANCELLED;

	return writer_create(c, name, specs, n, opts, NULL, 0, out);
}

int dlshare_create_queued(dlshare_client *c, const char *name,
			  const dlshare_tensor_spec *specs, size_t n,
			  const dlshare_create_opts *opts,
			  const dlshare_queue_opts *queue, dlshare_writer **out)
{
	CALL_UNCANCELLED;
	static const dlshare_queue_opts dflt = { 0 };

	return writer_create(c, name, specs, n, opts, queue ? queue : &dflt,
			     0, out);
}

/* The arguments of dlshare_create that need no daemon to refuse.
 * Returns 0 or a DLSHARE_E* code. */
static int create_args_check(dlshare_client *c, const char *name,
			     const dlshare_tensor_spec *specs, size_t n,
			     const dlshare_create_opts *opts,
			     const dlshare_queue_opts *q)
{
	char msg[320];
	int err;

	if (!c || client_bad_name(name) || !specs || n == 0)
		return DLSHARE_EINVAL;
	if (client_forked(c))
		return fork_refuse();
	if (opts && opts->device.device_type != kDLCPU &&
	    opts->device.device_type != kDLCUDAHost &&
	    opts->device.device_type != kDLCUDA) {
		snprintf(msg, sizeof(msg), "create %s: device type %d is not "
			 "one a store buffer can be made on (kDLCPU, "
			 "kDLCUDAHost, kDLCUDA; a zeroed "
			 "dlshare_create_opts.device is none of them)", name,
			 (int)opts->device.device_type);
		errmsg_set(msg);
		return DLSHARE_ENOTSUP;
	}
	if (opts && (opts->mode & ~CHECK_MODE_MASK)) {
		snprintf(msg, sizeof(msg), "create %s: mode %#o has bits "
			 "other than permission bits", name,
			 (unsigned)opts->mode);
		errmsg_set(msg);
		return DLSHARE_EINVAL;
	}
	if (opts && (opts->flags & ~DLSHARE_NAME_OWNED)) {
		snprintf(msg, sizeof(msg), "create %s: unknown flags %#x "
			 "(only DLSHARE_NAME_OWNED)", name,
			 (unsigned)opts->flags);
		errmsg_set(msg);
		return DLSHARE_EINVAL;
	}
	if (opts && (opts->ttl_ms || (opts->flags & DLSHARE_NAME_OWNED)) &&
	    (err = lifetimes_supported(c, name)))
		return err;
	if (opts && (err = origin_ok(c, name, opts->origin_node,
				     opts->origin_version)))
		return err;
	if (q && q->wait_ms < 0 && q->wait_ms != DLSHARE_WAIT_FOREVER)
		return DLSHARE_EINVAL;
	if (q && (err = client_need_queues(c)))
		return err;
	return 0;
}

/* A writer for n tensors of name on c, its tensors laid out compact, one
 * after another, aligned, and described in wt; *total: the bytes they
 * span. Returns 0 with *out, or a DLSHARE_E* code. */
static int writer_layout(dlshare_client *c, const char *name,
			 const dlshare_tensor_spec *specs, size_t n,
			 struct wire_tensors *wt, uint64_t *total,
			 dlshare_writer **out)
{
	dlshare_writer *w = calloc(1, sizeof(*w));
	uint64_t end = 0;
	int err;

	if (!w)
		return DLSHARE_ENOMEM;
	w->ts = calloc(n, sizeof(*w->ts));
	if (!w->ts || wire_tensors_alloc(wt, n)) {
		free(w->ts);
		free(w);
		return DLSHARE_ENOMEM;
	}
	w->fd = -1;
	w->c = c;
	client_ref(c);
	w->n = n;
	memcpy(w->name, name, strlen(name) + 1);
	for (size_t i = 0; i < n; i++) {
		const dlshare_tensor_spec *s = &specs[i];
		struct wtensor *t = &w->ts[i];
		uint64_t bytes;

		t->t.dtype = s->dtype;
		t->t.ndim = s->ndim;
		t->t.shape = t->shape;
		if (s->ndim < 0 || (uint32_t)s->ndim > CHECK_NDIM_MAX ||
		    (s->ndim && !s->shape) ||
		    (s->key && strlen(s->key) > CHECK_KEY_MAX)) {
			err = DLSHARE_EINVAL;
			goto fail;
		}
		if (s->ndim)
			memcpy(t->shape, s->shape,
			       (size_t)s->ndim * sizeof(int64_t));
		if ((err = tensor_bytes(&t->t, &bytes)))
			goto fail;
		end = (end + PRODUCER_ALIGN - 1) / PRODUCER_ALIGN *
		      PRODUCER_ALIGN;
		t->offset = end;
		t->t.byte_offset = end; /* until the mapping exists */
		if (__builtin_add_overflow(end, bytes, &end) ||
		    end > INT64_MAX) {
			err = DLSHARE_EINVAL;
			goto fail;
		}
		wire_tensor_set(&wt->t[i], s->key, s->dtype, s->ndim, t->shape,
				NULL, 0, t->t.byte_offset);
	}
	*total = end;
	*out = w;
	return 0;
fail:
	wire_tensors_free(wt);
	writer_free(w);
	return err;
}

/* A Create request and what it points to; lives for one call. */
struct create_msg {
	Dlshare__Frame f;
	Dlshare__Create cr;
	Dlshare__Buffer buf, *bufp;
	Dlshare__Device dev;
	Dlshare__Buffer mbuf;
	Dlshare__Device mdev;
	uint8_t uuid[CUDA_UUID_BYTES];
	int mfd;                 /* the manifest memfd (1.4), or -1 */
};

/* Fills m: one buffer of total bytes on opts' device for w's tensors
 * (described in wt, or in a manifest memfd when they are too many for a
 * packet), the name's mode, lifetime and queue options. Returns 0 or a
 * DLSHARE_E* code; m->mfd is then closed by the caller. */
static int create_msg_fill(struct create_msg *m, dlshare_writer *w,
			   const struct wire_tensors *wt, uint64_t total,
			   const dlshare_create_opts *opts,
			   const dlshare_queue_opts *q)
{
	uint64_t msize;
	int err;

	*m = (struct create_msg){
		.f = DLSHARE__FRAME__INIT, .cr = DLSHARE__CREATE__INIT,
		.buf = DLSHARE__BUFFER__INIT, .dev = DLSHARE__DEVICE__INIT,
		.mbuf = DLSHARE__BUFFER__INIT, .mdev = DLSHARE__DEVICE__INIT,
		.mfd = -1,
	};
	m->bufp = &m->buf;
	/* Keys are checked here for inline tensors; a manifest's, once, by
	 * the daemon (its answer names the two tensors just the same). */
	if ((err = client_manifest_out(w->c, wt->tp, w->n, &m->mfd, &msize)) ||
	    (m->mfd < 0 && (err = keys_unique(wt->tp, w->n))))
		return err;
	/* kDLCUDAHost: host memory that both sides register with CUDA. */
	m->dev.type = opts ? (uint32_t)opts->device.device_type : kDLCPU;
	m->buf.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	m->buf.size = total;
	if (m->dev.type == kDLCUDA) {
		/* Device memory of the daemon's choosing, on this GPU. */
		w->ordinal = opts->device.device_id;
		if ((err = cuda_uuid(w->ordinal, m->uuid)))
			return err;
		m->buf.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_UNSPECIFIED;
		m->dev.has_uuid = 1;
		m->dev.uuid.data = m->uuid;
		m->dev.uuid.len = CUDA_UUID_BYTES;
	}
	m->buf.device = &m->dev;
	m->cr.name = w->name;
	if (m->mfd >= 0) {
		manifest_buffer(&m->mbuf, &m->mdev, msize);
		m->cr.manifest = &m->mbuf;
		m->cr.has_manifest_tensors = 1;
		m->cr.manifest_tensors = (uint32_t)w->n;
	} else {
		m->cr.n_tensors = w->n;
		m->cr.tensors = wt->tp;
	}
	m->cr.n_buffers = 1;
	m->cr.buffers = &m->bufp;
	if (opts && opts->mode) {
		m->cr.has_mode = 1;
		m->cr.mode = opts->mode;
	}
	if (opts && (opts->flags & DLSHARE_NAME_OWNED))
		m->cr.has_owned = m->cr.owned = 1;
	if (opts && opts->ttl_ms) {
		m->cr.has_ttl_ms = 1;
		m->cr.ttl_ms = opts->ttl_ms;
	}
	if (opts && opts->origin_node) {
		m->cr.origin_node = (char *)opts->origin_node;
		m->cr.has_origin_version = 1;
		m->cr.origin_version = opts->origin_version;
	}
	if (queue_wire(q, &m->cr.has_queue_depth, &m->cr.queue_depth,
		       &m->cr.has_wait_ms, &m->cr.wait_ms))
		return DLSHARE_EINVAL;
	m->f.body_case = DLSHARE__FRAME__BODY_CREATE;
	m->f.create = &m->cr;
	return 0;
}

/* Takes the device buffer of a CreateReply (r, consumed): cuda-vmm, the
 * daemon counts us among the buffer's holders, and the mapping stays in
 * the import cache until it frees it (BufferGone); cuda-ipc, the mapping
 * closes when we unpin it, and then the writer lease goes. Returns 0 or a
 * DLSHARE_E* code, the version then aborted. */
static int writer_take_device(dlshare_writer *w, struct reply *r)
{
	Dlshare__CreateReply *rep = r->msg->frame->create_reply;
	Dlshare__Buffer *wb = rep->buffers[0];
	int err;

	w->lease = rep->writer_lease;
	if ((wb->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM &&
	     wb->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) ||
	    wb->size < w->size ||
	    (wb->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM) !=
	    (r->nfds == 1))
		err = DLSHARE_EPROTO;
	else
		err = client_pin_buffer(w->c, wb, r->nfds ? r->fds[0] : -1,
					&w->dev);
	reply_free(w->c, r);
	if (err) {
		send_abort(w);
		w->lease = 0; /* the abort took it */
		return err;
	}
	w->base = w->dev->base;
	w->ordinal = w->dev->ordinal;
	return 0;
}

/* Takes the host buffer of a CreateReply (r, consumed): keeps its memfd
 * (WRITER_FD) or maps it writable. Returns 0 or a DLSHARE_E* code, the
 * version then aborted. */
static int writer_take_host(dlshare_writer *w, struct reply *r,
			    unsigned flags)
{
	Dlshare__Buffer *b = r->msg->frame->create_reply->buffers[0];

	if (!w->size) {
		reply_free(w->c, r);
		return 0;
	}
	/* The whole buffer: the daemon may round it up (huge pages, which
	 * are mapped and unmapped in whole pages). */
	if (b->size < w->size || b->size > SIZE_MAX) {
		reply_free(w->c, r);
		send_abort(w);
		return DLSHARE_EPROTO;
	}
	w->size = b->size;
	if (flags & WRITER_FD) {
		/* Ours now: reply_free closes only what is left. */
		w->fd = r->fds[0];
		r->fds[0] = -1;
		w->fd_listed = fork_keep_fd(w->c, w->fd);
		reply_free(w->c, r);
		return 0;
	}
	/* A child must not inherit it: the daemon can write-seal the buffer
	 * only once no writable mapping of it is left, and a child's would
	 * outlive ours. */
	w->base = fork_mmap_writable(w->size, r->fds[0]);
	/* The fd stays, to write-seal at dlshare_seal, while the client
	 * keeps fewer than CLIENT_SEAL_FDS_MAX; else reply_free closes it
	 * (the mapping holds the memory) and the daemon seals. */
	if (w->base != MAP_FAILED && fork_keep_fd(w->c, r->fds[0])) {
		w->fd = r->fds[0];
		w->fd_listed = 1;
		r->fds[0] = -1;
	}
	reply_free(w->c, r);
	if (w->base == MAP_FAILED) {
		w->base = NULL;
		send_abort(w);
		return DLSHARE_ENOMEM;
	}
	/* The producer writes all of it next: every page in one call rather
	 * than a fault each. */
	copy_populate(w->base, w->size);
	return 0;
}

/* Sends m and takes the daemon's buffer into w. Returns 0 or a DLSHARE_E*
 * code. */
static int writer_request(dlshare_writer *w, struct create_msg *m,
			  unsigned flags)
{
	struct reply r;
	int err;

	err = client_call(w->c, &m->f, m->mfd >= 0 ? &m->mfd : NULL,
			  m->mfd >= 0, NULL, &r);
	if (err && r.msg) {
		/* A reply that came but cannot be used (client_call kept
		 * it: the buffer's fd could not come): the version the
		 * daemon made for us is dropped. */
		if (r.msg->frame->body_case ==
		    DLSHARE__FRAME__BODY_CREATE_REPLY) {
			const Dlshare__CreateReply *cr =
				r.msg->frame->create_reply;

			w->version = cr->version;
			w->writer = cr->has_writer ? cr->writer : 0;
			send_abort(w);
		}
		reply_free(w->c, &r);
		return err;
	}
	if (err)
		return err;
	if (r.msg->frame->body_case != DLSHARE__FRAME__BODY_CREATE_REPLY ||
	    (r.nfds != 1 && m->dev.type != kDLCUDA) || r.nfds > 1 ||
	    r.msg->frame->create_reply->n_buffers != 1) {
		reply_free(w->c, &r);
		return DLSHARE_EPROTO;
	}
	w->version = r.msg->frame->create_reply->version;
	w->writer = r.msg->frame->create_reply->has_writer ?
		    r.msg->frame->create_reply->writer : 0;
	if (m->dev.type == kDLCUDA)
		return writer_take_device(w, &r);
	return writer_take_host(w, &r, flags);
}

/* Points w's tensors into its memory on device dev_type, registering host
 * memory with CUDA for kDLCUDAHost. Returns 0 or a DLSHARE_E* code, the
 * version then aborted. */
static int writer_ready(dlshare_writer *w, uint32_t dev_type)
{
	int err;

	if (w->base && dev_type == kDLCUDAHost) {
		err = cuda_host_register(w->base, w->size, 0);
		if (err) {
			writer_unmap(w, 0);
			send_abort(w);
			return err;
		}
		w->cuda_host = 1;
	}
	for (size_t i = 0; i < w->n; i++) {
		DLTensor *t = &w->ts[i].t;

		t->data = w->base ? (char *)w->base + t->byte_offset : NULL;
		t->byte_offset = 0;
		t->device.device_type = (DLDeviceType)dev_type;
		t->device.device_id = dev_type == kDLCUDA ? w->ordinal : 0;
	}
	return 0;
}

static int writer_create(dlshare_client *c, const char *name,
			 const dlshare_tensor_spec *specs, size_t n,
			 const dlshare_create_opts *opts,
			 const dlshare_queue_opts *q, unsigned flags,
			 dlshare_writer **out)
{
	struct wire_tensors wt = { 0 };
	struct create_msg m = { .mfd = -1 };
	dlshare_writer *w = NULL;
	uint64_t total;
	int err;

	errmsg_set(NULL);
	if (!out)
		return DLSHARE_EINVAL;
	*out = NULL;
	if ((err = create_args_check(c, name, specs, n, opts, q)))
		return err;
	if ((err = writer_layout(c, name, specs, n, &wt, &total, &w)))
		return err;
	w->size = total;
	err = create_msg_fill(&m, w, &wt, total, opts, q);
	if (!err)
		err = writer_request(w, &m, flags);
	if (m.mfd >= 0)
		close(m.mfd);
	wire_tensors_free(&wt);
	if (!err)
		err = writer_ready(w, m.dev.type);
	if (err) {
		writer_free(w);
		return err;
	}
	*out = w;
	return 0;
}

size_t dlshare_writer_count(const dlshare_writer *w)
{
	return w ? w->n : 0;
}

DLTensor *dlshare_writer_tensor(dlshare_writer *w, size_t i)
{
	/* A child does not have the memory (see fork_mmap_writable). */
	if (!w || i >= w->n || client_forked(w->c))
		return NULL;
	return &w->ts[i].t;
}

uint64_t dlshare_writer_version(const dlshare_writer *w)
{
	return w ? w->version : 0;
}

/* Keeps the event a device version was sealed with alive until the daemon
 * retires the version (a Retired names it) or this client disconnects:
 * consumers open it by its handle. Registered before the Seal is sent, so
 * that the Retired always finds it. */
static struct export *seal_event_keep(dlshare_writer *w, void *event)
{
	dlshare_client *c = w->c;
	struct export *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	memcpy(e->name, w->name, strlen(w->name) + 1);
	e->version = w->version;
	e->event = event;
	pthread_mutex_lock(&c->lock);
	e->next = c->exports;
	c->exports = e;
	pthread_mutex_unlock(&c->lock);
	return e;
}

/* Undoes seal_event_keep when the Seal failed: the event goes now. */
static void seal_event_drop(dlshare_client *c, struct export *e)
{
	int found = 0;

	pthread_mutex_lock(&c->lock);
	for (struct export **pp = &c->exports; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	/* Not found: disconnect took it, and frees it. */
	if (found)
		export_free(e);
}

/* After the seal of a device version: the writer's mapping is unpinned
 * once the work queued so far on stream is done (unmapping memory that
 * queued work still writes would fault). */
static void writer_unmap_after(dlshare_writer *w, void *stream)
{
	struct lease_ref *lr = calloc(1, sizeof(*lr) + sizeof(struct ibuf *));

	/* Without a marker, the host waits for the stream first: the
	 * mapping must outlive the writes queued on it. */
	if (lr && stream != DLSHARE_STREAM_NONE &&
	    cuda_event_mark(stream, w->ordinal, &lr->event) == 0) {
		atomic_init(&lr->refs, 1);
		lr->c = w->c;
		lr->lease = w->lease; /* 0 for cuda-vmm: nothing to release */
		w->lease = 0;
		lr->ordinal = w->ordinal;
		lr->npins = 1;
		lr->pins[0] = w->dev;
		w->dev = NULL;
		w->base = NULL;
		client_release_after(w->c, lr); /* frees lr */
		return;
	}
	free(lr);
	cuda_stream_wait_host(stream, w->ordinal);
	writer_unmap(w, 0);
}

int dlshare_seal(dlshare_writer *w, void *stream, uint64_t *version)
{
	CALL_UNCANCELLED;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal s = DLSHARE__SEAL__INIT;
	uint8_t event_handle[CUDA_IPC_HANDLE_BYTES];
	struct export *kept = NULL;
	void *event = NULL;
	int err;

	if (!w)
		return DLSHARE_EINVAL;
	if (client_forked(w->c)) {
		writer_forget(w);
		return fork_refuse();
	}
	s.name = w->name;
	s.version = w->version;
	s.has_writer = w->writer != 0;
	s.writer = w->writer;
	if (w->dev) {
		/* Consumers' streams will wait for what the producer's
		 * stream has queued so far: the host does not. */
		err = cuda_event_record(stream, &w->ordinal, 1, 0, &event,
					event_handle);
		if (!err && event && !(kept = seal_event_keep(w, event)))
			err = DLSHARE_ENOMEM;
		if (err) {
			cuda_event_free(event);
			dlshare_writer_abort(w);
			return err;
		}
		/* No event (beyond the cap): the host waited. */
		s.has_event_handle = event != NULL;
		s.event_handle.data = event_handle;
		s.event_handle.len = CUDA_IPC_HANDLE_BYTES;
	} else {
		/* kDLCUDAHost: the producer's stream may still be copying
		 * into the pages, and host readers have no event to wait
		 * for: the seal waits for that stream first (and the pages
		 * stay registered until then). */
		if (w->cuda_host && stream != DLSHARE_STREAM_NONE) {
			int ord = cuda_stream_ordinal(stream);

			if (ord >= 0)
				cuda_stream_wait_host(stream, ord);
		}
		/* The daemon can only write-seal a memfd nobody maps
		 * writable; we seal it ourselves, right after. */
		writer_unmap(w, 1);
		/* The kernel refused: a writable mapping is left somewhere,
		 * or pages stayed pinned through its wait for them. The
		 * daemon's seal would be refused too, after another such
		 * wait: the version is dropped now. */
		if (w->seal_busy) {
			char msg[CHECK_NAME_MAX + 128];

			snprintf(msg, sizeof(msg), "seal %s: %s", w->name,
				 WIRE_TEXT_SEAL_BUSY);
			errmsg_set(msg);
			send_abort(w);
			writer_free(w);
			return DLSHARE_EBUSY;
		}
	}
	f.body_case = DLSHARE__FRAME__BODY_SEAL;
	f.seal = &s;
	err = simple_call(w->c, &f, DLSHARE__FRAME__BODY_SEAL_REPLY);
	/* A version that stayed pending (EBUSY, no memory for the event) is
	 * dropped; one the daemon did not find (deleted, or sealed) is no
	 * longer ours to drop. */
	if (err && err != DLSHARE_ENOENT && err != DLSHARE_ESTATE &&
	    err != DLSHARE_ECONN && err != DLSHARE_ECLOSED)
		send_abort(w);
	if (err && kept)
		seal_event_drop(w->c, kept);
	if (!err && version)
		*version = w->version;
	if (w->dev)
		writer_unmap_after(w, stream);
	writer_free(w);
	return err;
}

void dlshare_writer_abort(dlshare_writer *w)
{
	CALL_UNCANCELLED;

	if (!w)
		return;
	if (client_forked(w->c)) {
		writer_forget(w);
		return;
	}
	writer_unmap(w, 0);
	send_abort(w);
	writer_free(w);
}

/* ---- export mode ------------------------------------------------------- */

/* A store version shaped like tensors, compact, on device: the target of
 * a copy. Returns 0 with *w, or a DLSHARE_E* code. */
static int create_like(dlshare_client *c, const char *name,
		       DLManagedTensor *const *tensors, size_t n,
		       const dlshare_publish_opts *o,
		       const dlshare_queue_opts *q, DLDevice device,
		       unsigned flags, dlshare_writer **w)
{
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	dlshare_create_opts co = {
		.device = device, .mode = o->mode,
		.flags = o->flags & DLSHARE_NAME_OWNED, .ttl_ms = o->ttl_ms,
		.origin_node = o->origin_node,
		.origin_version = o->origin_version,
	};
	int err;

	if (!specs)
		return DLSHARE_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t = &tensors[i]->dl_tensor;

		specs[i].key = o->keys ? o->keys[i] : NULL;
		specs[i].dtype = t->dtype;
		specs[i].ndim = t->ndim;
		specs[i].shape = t->shape;
	}
	err = writer_create(c, name, specs, n, &co, q, flags, w);
	free(specs);
	return err;
}

/* Fills w's buffer from tensors through its memfd (WRITER_FD). Where the
 * file takes no write() (hugetlbfs), maps it and copies in memory. Returns
 * 0 or a DLSHARE_E* code. */
static int writer_fill(dlshare_writer *w, DLManagedTensor *const *tensors)
{
	int err = 0;

	for (size_t i = 0; w->fd >= 0 && i < w->n && !err; i++)
		err = copy_to_fd(w->fd, w->ts[i].offset, &tensors[i]->dl_tensor);
	if (w->fd < 0 || err == -EINVAL) {
		if (w->fd >= 0) {
			w->base = fork_mmap_writable(w->size, w->fd);
			writer_close_fd(w);
			if (w->base == MAP_FAILED) {
				w->base = NULL;
				return DLSHARE_ENOMEM;
			}
			copy_populate(w->base, w->size);
		}
		for (size_t i = 0; w->base && i < w->n; i++)
			copy_to_mem((char *)w->base + w->ts[i].offset,
				    &tensors[i]->dl_tensor);
		return 0;
	}
	if (err) {
		char msg[160];

		snprintf(msg, sizeof(msg), "writing the copy into the "
			 "daemon's buffer failed: %s", strerror(-err));
		errmsg_set(msg);
		return err == -ENOMEM || err == -ENOSPC || err == -EFBIG ?
		       DLSHARE_ENOMEM : client_errno(err);
	}
	return 0;
}

static int publish_copy(dlshare_client *c, const char *name,
			DLManagedTensor *const *tensors, size_t n,
			const dlshare_publish_opts *o,
			const dlshare_queue_opts *q, uint64_t *version)
{
	dlshare_writer *w;
	int err;

	err = create_like(c, name, tensors, n, o, q, (DLDevice){ kDLCPU, 0 },
			  WRITER_FD, &w);
	if (err)
		return err;
	err = writer_fill(w, tensors);
	if (err) {
		dlshare_writer_abort(w);
		return err;
	}
	err = dlshare_seal(w, o->stream, version);
	if (err)
		return err;
	/* The data lives in the daemon now: the producer's memory is free. */
	for (size_t i = 0; i < n; i++)
		if (tensors[i]->deleter)
			tensors[i]->deleter(tensors[i]);
	return 0;
}

/* Whether a stride of t is negative (on a dimension of extent > 1). */
static int has_negative_stride(const DLTensor *t)
{
	for (int32_t k = 0; t->strides && k < t->ndim; k++)
		if (t->strides[k] < 0 && t->shape[k] > 1)
			return 1;
	return 0;
}

/* Whether t's elements lie row-major and without gaps (dims of extent 1
 * may have any stride). */
static int is_compact(const DLTensor *t)
{
	int64_t want = 1;

	if (!t->strides)
		return 1;
	for (int32_t k = t->ndim - 1; k >= 0; k--) {
		if (t->shape[k] != 1 && t->strides[k] != want)
			return 0;
		want *= t->shape[k];
	}
	return 1;
}

/* Copies device tensors that CUDA IPC cannot share (pool, VMM or managed
 * memory) into a daemon-owned buffer on the same GPU, on the producer's
 * stream. The copy reads the producer's memory, so its deleters run only
 * once the copy is done: this waits for the stream (the one place where
 * publishing waits on the host; sharing without a copy never does). */
static int publish_copy_device(dlshare_client *c, const char *name,
			       DLManagedTensor *const *tensors, size_t n,
			       const dlshare_publish_opts *o,
			       const dlshare_queue_opts *q, uint64_t *version)
{
	DLDevice device = tensors[0]->dl_tensor.device;
	dlshare_writer *w;
	int err;

	for (size_t i = 0; i < n; i++) {
		const DLTensor *t = &tensors[i]->dl_tensor;

		if (t->device.device_type != kDLCUDA ||
		    t->device.device_id != device.device_id) {
			errmsg_set("a copy into the daemon takes tensors of one "
				   "GPU; publish host and device tensors apart");
			return DLSHARE_ENOTSUP;
		}
		if (!is_compact(t)) {
			errmsg_set(has_negative_stride(t) ?
				   "a device tensor with a negative stride is "
				   "never shared (torch cannot take one), and "
				   "a strided one can not be copied yet; make "
				   "it contiguous first" :
				   "a strided device tensor that CUDA IPC "
				   "cannot share can not be copied yet; make "
				   "it contiguous first");
			return DLSHARE_ENOTSUP;
		}
	}
	err = create_like(c, name, tensors, n, o, q, device, 0, &w);
	if (err)
		return err;
	for (size_t i = 0; i < n && !err; i++) {
		const DLTensor *t = &tensors[i]->dl_tensor;
		uint64_t bytes;

		if (!tensor_bytes(t, &bytes) && bytes)
			err = cuda_copy_d2d(w->ts[i].t.data,
					    (const char *)t->data + t->byte_offset,
					    (size_t)bytes, device.device_id,
					    o->stream);
	}
	if (err) {
		errmsg_set("copying a device tensor into the daemon's buffer "
			   "failed");
		dlshare_writer_abort(w);
		return err;
	}
	err = dlshare_seal(w, o->stream, version);
	if (err)
		return err;
	/* The copy ran on the device's stream: once it passed, the source
	 * is the caller's again. */
	cuda_stream_wait_host(o->stream, device.device_id);
	for (size_t i = 0; i < n; i++)
		if (tensors[i]->deleter)
			tensors[i]->deleter(tensors[i]);
	return 0;
}

/* Where one exported tensor's memory is, as a buffer of the version. */
struct xbuf {
	int kind;
	void *base;
	uint64_t size;
	int fd;                  /* host: our dup of the memfd */
	struct cuda_alloc cuda;
};

/* Finds the buffer of tensor t: dlshare_host_alloc() memory for the host,
 * a legacy-IPC allocation for CUDA. Returns 0, DLSHARE_ENOENT (host memory
 * that cannot be shared: copy it), DLSHARE_ECOPY (device memory that
 * cannot), or another code. */
static int xbuf_find(const DLTensor *t, struct xbuf *x)
{
	int64_t lo, hi;

	if (tensor_extent(t, &lo, &hi))
		return DLSHARE_EINVAL;
	memset(x, 0, sizeof(*x));
	x->fd = -1;
	if (t->device.device_type == kDLCUDA) {
		int err = cuda_export_alloc((char *)t->data + lo, &x->cuda);

		if (err)
			return err;
		x->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
		x->base = (void *)x->cuda.base;
		x->size = x->cuda.size;
		if ((uint64_t)hi - (uint64_t)lo > x->size ||
		    (uintptr_t)t->data + lo + (hi - lo) > x->cuda.base + x->size) {
			cuda_unexport_alloc(x->cuda.handle);
			return DLSHARE_EINVAL;
		}
		return 0;
	}
	x->kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	return hostmem_find((char *)t->data + lo, (uint64_t)(hi - lo),
			    &x->base, &x->size, &x->fd);
}

/* Undoes xbuf_find. */
static void xbuf_release(struct xbuf *x)
{
	if (x->fd >= 0)
		close(x->fd);
	x->fd = -1;
	if (x->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC)
		cuda_unexport_alloc(x->cuda.handle);
	x->kind = 0;
}

/* Adds ordinal to the set ords[0..*n). */
static void ordinal_add(int *ords, unsigned *n, int ordinal)
{
	for (unsigned k = 0; k < *n; k++)
		if (ords[k] == ordinal)
			return;
	ords[(*n)++] = ordinal;
}

/* Publishes tensors that all live in shareable memory, without a copy, or
 * says DLSHARE_ENOENT / DLSHARE_ECOPY when one does not (see xbuf_find). */
/* A Publish of producer memory and what it points to; lives for one
 * call. */
struct export_msg {
	Dlshare__Frame f;
	Dlshare__Publish p;
	struct wire_tensors wt;
	/* The version's buffers: one per allocation its tensors live in. */
	Dlshare__Buffer bufs[CLIENT_PINS_MAX], *bufp[CLIENT_PINS_MAX];
	Dlshare__Device devs[CLIENT_PINS_MAX];
	struct xbuf xs[CLIENT_PINS_MAX];
	unsigned nb, ncuda;
	int fds[CLIENT_PINS_MAX + 1]; /* the host buffers', then the manifest's */
	unsigned nfds;
	int mfd;                 /* the manifest memfd (1.4) until in fds */
	Dlshare__Buffer mbuf;
	Dlshare__Device mdev;
	/* CUDA: the devices the event stands for, the event, its handle, and
	 * (1.4) one event per device. */
	int ordinals[CLIENT_PINS_MAX];
	unsigned nord;
	void *event;
	uint8_t event_handle[CUDA_IPC_HANDLE_BYTES];
	Dlshare__DeviceEvent dev_ev[CLIENT_PINS_MAX], *dev_evp[CLIENT_PINS_MAX];
	uint8_t ev_handles[CLIENT_PINS_MAX][CUDA_IPC_HANDLE_BYTES];
	uint8_t ev_uuids[CLIENT_PINS_MAX][CUDA_UUID_BYTES];
};

/* The index in m->xs of the allocation t lives in, added when new.
 * Returns 0 with *index, or a DLSHARE_E* code. */
static int export_buffer_of(struct export_msg *m, const char *name,
			    const DLTensor *t, unsigned *index)
{
	Dlshare__Buffer *wb;
	Dlshare__Device *dev;
	struct xbuf x;
	unsigned b;
	int err;

	if ((err = xbuf_find(t, &x)))
		return err;
	for (b = 0; b < m->nb && (m->xs[b].base != x.base ||
				  m->xs[b].kind != x.kind); b++)
		;
	if (b < m->nb) {
		xbuf_release(&x);
		*index = b;
		return 0;
	}
	if (m->nb == CLIENT_PINS_MAX) {
		char why[CHECK_NAME_MAX + 200];

		xbuf_release(&x);
		snprintf(why, sizeof(why), "publish %s: the tensors live in "
			 "more than %d separate allocations, the most one "
			 "version may share without a copy; allocate them "
			 "together, or publish with a copy", name,
			 CLIENT_PINS_MAX);
		errmsg_set(why);
		return DLSHARE_ELIMIT;
	}
	wb = &m->bufs[b];
	dev = &m->devs[b];
	m->xs[b] = x;
	dlshare__buffer__init(wb);
	dlshare__device__init(dev);
	wb->kind = x.kind;
	wb->size = x.size;
	wb->device = dev;
	if (x.kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		dev->type = kDLCUDA;
		dev->has_uuid = 1;
		dev->uuid.data = m->xs[b].cuda.uuid;
		dev->uuid.len = CUDA_UUID_BYTES;
		wb->has_ipc_handle = 1;
		wb->ipc_handle.data = m->xs[b].cuda.handle;
		wb->ipc_handle.len = CUDA_IPC_HANDLE_BYTES;
		wb->has_ipc_offset = 1;
		wb->ipc_offset = 0;
		m->ncuda++;
		/* The devices the event must stand for. */
		ordinal_add(m->ordinals, &m->nord, x.cuda.ordinal);
	} else {
		dev->type = kDLCPU;
		wb->has_fd_attached = 1;
		wb->fd_attached = 1;
		m->fds[m->nfds++] = x.fd;
	}
	m->bufp[b] = wb;
	m->nb++;
	*index = b;
	return 0;
}

/* Describes each tensor by its allocation and offset in it, then the
 * whole list inline or in a manifest memfd. Returns 0 or a DLSHARE_E*
 * code. */
static int export_describe(struct export_msg *m, dlshare_client *c,
			   const char *name, DLManagedTensor *const *tensors,
			   size_t n, const char *const *keys)
{
	uint64_t msize;
	char msg[160];
	int err;

	if ((err = wire_tensors_alloc(&m->wt, n)))
		return err;
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t = &tensors[i]->dl_tensor;
		const char *key = keys ? keys[i] : NULL;
		unsigned b;

		if (key && strlen(key) > CHECK_KEY_MAX)
			return DLSHARE_EINVAL;
		/* A consumer of a negative stride may die of it: torch 1.13
		 * aborts the process (JAX refuses it). A copy is compact. */
		if (has_negative_stride(t)) {
			snprintf(msg, sizeof(msg), "tensor %zu has a negative "
				 "stride, which is never shared without a copy "
				 "(torch 1.13 aborts the consuming process)", i);
			errmsg_set(msg);
			return t->device.device_type == kDLCUDA ?
			       DLSHARE_ECOPY : DLSHARE_ENOENT;
		}
		if ((err = export_buffer_of(m, name, t, &b)))
			return err;
		wire_tensor_set(&m->wt.t[i], key, t->dtype, t->ndim, t->shape,
				t->strides, b,
				(uint64_t)((char *)t->data + t->byte_offset -
					   (char *)m->xs[b].base));
	}
	/* Keys are checked here for inline tensors; a manifest's, once, by
	 * the daemon (its answer names the two tensors just the same). */
	if ((err = client_manifest_out(c, m->wt.tp, n, &m->mfd, &msize)) ||
	    (m->mfd < 0 && (err = keys_unique(m->wt.tp, n))))
		return err;
	if (m->mfd >= 0) {
		manifest_buffer(&m->mbuf, &m->mdev, msize);
		m->p.manifest = &m->mbuf;
		m->p.has_manifest_tensors = 1;
		m->p.manifest_tensors = (uint32_t)n;
		m->fds[m->nfds++] = m->mfd; /* after the buffers' */
		m->mfd = -1;                /* closed with them */
	} else {
		m->p.n_tensors = n;
		m->p.tensors = m->wt.tp;
	}
	return 0;
}

/* Records on stream the event that consumers' streams will wait for —
 * what the producer's stream has queued so far: the data is ready when
 * their kernels run — one per device to a daemon of 1.4. Beyond the
 * library's cap there is none: the host waited. Returns 0 or a DLSHARE_E*
 * code. */
static int export_events(struct export_msg *m, dlshare_client *c,
			 void *stream)
{
	int ev_ord[CLIENT_PINS_MAX];
	size_t nev;
	int err;

	err = cuda_event_record(stream, m->ordinals, m->nord, c->dev_events,
				&m->event, m->event_handle);
	if (err)
		return err;
	nev = m->event ? cuda_event_handles(m->event, ev_ord, m->ev_handles,
					    CLIENT_PINS_MAX) : 0;
	m->p.has_event_handle = nev == 1;
	m->p.event_handle.data = m->event_handle;
	m->p.event_handle.len = CUDA_IPC_HANDLE_BYTES;
	if (nev <= 1)
		return 0;
	for (size_t i = 0; i < nev; i++) {
		Dlshare__DeviceEvent *de = &m->dev_ev[i];

		dlshare__device_event__init(de);
		m->dev_evp[i] = de;
		if ((err = cuda_uuid(ev_ord[i], m->ev_uuids[i])))
			return err;
		de->uuid.data = m->ev_uuids[i];
		de->uuid.len = CUDA_UUID_BYTES;
		de->handle.data = m->ev_handles[i];
		de->handle.len = CUDA_IPC_HANDLE_BYTES;
	}
	m->p.n_device_events = nev;
	m->p.device_events = m->dev_evp;
	return 0;
}

/* The name's options on the Publish: mode, lifetime, queue. An export
 * never waits for room in a queue: the daemon refuses one at once
 * (wait_ms is not sent). Returns 0 or DLSHARE_EINVAL. */
static int export_options(struct export_msg *m, const char *name,
			  const dlshare_publish_opts *o,
			  const dlshare_queue_opts *q)
{
	protobuf_c_boolean has_wait = 0;
	uint32_t wait = 0;

	m->p.name = (char *)name;
	m->p.n_buffers = m->nb;
	m->p.buffers = m->bufp;
	if (o->mode) {
		m->p.has_mode = 1;
		m->p.mode = o->mode;
	}
	if (o->flags & DLSHARE_NAME_OWNED)
		m->p.has_owned = m->p.owned = 1;
	if (o->ttl_ms) {
		m->p.has_ttl_ms = 1;
		m->p.ttl_ms = o->ttl_ms;
	}
	if (o->origin_node) {
		m->p.origin_node = (char *)o->origin_node;
		m->p.has_origin_version = 1;
		m->p.origin_version = o->origin_version;
	}
	if (queue_wire(q, &m->p.has_queue_depth, &m->p.queue_depth, &has_wait,
		       &wait))
		return DLSHARE_EINVAL;
	m->f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	m->f.publish = &m->p;
	return 0;
}

/* The library's record of an export of n tensors, owning m's event and
 * CUDA allocations. Returns it, or NULL when out of memory. */
static struct export *export_new(struct export_msg *m, const char *name,
				 DLManagedTensor *const *tensors, size_t n)
{
	struct export *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->tensors = calloc(n, sizeof(*e->tensors));
	e->cuda_handles = m->ncuda ? calloc(m->ncuda,
					    sizeof(*e->cuda_handles)) : NULL;
	if (!e->tensors || (m->ncuda && !e->cuda_handles)) {
		free(e->tensors);
		free(e->cuda_handles);
		free(e);
		return NULL;
	}
	memcpy(e->name, name, strlen(name) + 1);
	memcpy(e->tensors, tensors, n * sizeof(*tensors));
	e->n = n;
	e->event = m->event;
	for (unsigned b = 0; b < m->nb; b++)
		if (m->xs[b].kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC)
			memcpy(e->cuda_handles[e->ncuda++], m->xs[b].cuda.handle,
			       CUDA_IPC_HANDLE_BYTES);
	return e;
}

static int publish_export(dlshare_client *c, const char *name,
			  DLManagedTensor *const *tensors, size_t n,
			  const dlshare_publish_opts *o,
			  const dlshare_queue_opts *q, uint64_t *version)
{
	struct export_msg *m = calloc(1, sizeof(*m));
	struct export *e = NULL;
	struct reply r;
	int err;

	if (!m)
		return DLSHARE_ENOMEM;
	m->f = (Dlshare__Frame)DLSHARE__FRAME__INIT;
	m->p = (Dlshare__Publish)DLSHARE__PUBLISH__INIT;
	m->mbuf = (Dlshare__Buffer)DLSHARE__BUFFER__INIT;
	m->mdev = (Dlshare__Device)DLSHARE__DEVICE__INIT;
	m->mfd = -1;
	err = export_describe(m, c, name, tensors, n, o->keys);
	if (!err && m->ncuda)
		err = export_events(m, c, o->stream);
	if (!err)
		err = export_options(m, name, o, q);
	if (!err && !(e = export_new(m, name, tensors, n)))
		err = DLSHARE_ENOMEM;
	if (err)
		goto out;
	/* The export owns the event and the CUDA allocations from here: the
	 * receiver thread may register it (and a Retired free it) before
	 * client_call returns. */
	err = client_call(c, &m->f, m->fds, m->nfds, e, &r);
	if (err) {
		e->event = NULL;
		e->ncuda = 0;
		goto out;
	}
	if (r.msg->frame->body_case != DLSHARE__FRAME__BODY_PUBLISH_REPLY)
		err = DLSHARE_EPROTO;
	else if (version)
		*version = r.msg->frame->publish_reply->version;
	reply_free(c, &r);
	e = NULL; /* registered by the receiver thread */
	m->event = NULL;
	for (unsigned b = 0; b < m->nb; b++)
		m->xs[b].kind = 0; /* the export holds them now */
out:
	if (m->mfd >= 0)
		close(m->mfd);
	if (m->p.manifest)
		close(m->fds[m->nfds - 1]);
	for (unsigned b = 0; b < m->nb; b++)
		xbuf_release(&m->xs[b]);
	cuda_event_free(m->event);
	if (e) {
		free(e->cuda_handles);
		free(e->tensors);
		free(e);
	}
	wire_tensors_free(&m->wt);
	free(m);
	return err;
}

static int publish_impl(dlshare_client *c, const char *name,
			DLManagedTensor *const *tensors, size_t n,
			const dlshare_publish_opts *opts,
			const dlshare_queue_opts *q, uint64_t *version);

int dlshare_publish(dlshare_client *c, const char *name,
		    DLManagedTensor *const *tensors, size_t n,
		    const dlshare_publish_opts *opts, uint64_t *version)
{
	CALL_UNCANCELLED;

	return publish_impl(c, name, tensors, n, opts, NULL, version);
}

int dlshare_publish_queued(dlshare_client *c, const char *name,
			   DLManagedTensor *const *tensors, size_t n,
			   const dlshare_publish_opts *opts,
			   const dlshare_queue_opts *queue, uint64_t *version)
{
	CALL_UNCANCELLED;
	static const dlshare_queue_opts dflt = { 0 };
	int err;

	errmsg_set(NULL);
	if (c && !client_forked(c) && (err = client_need_queues(c)))
		return err;
	return publish_impl(c, name, tensors, n, opts,
			    queue ? queue : &dflt, version);
}

static int publish_impl(dlshare_client *c, const char *name,
			DLManagedTensor *const *tensors, size_t n,
			const dlshare_publish_opts *opts,
			const dlshare_queue_opts *q, uint64_t *version)
{
	static const dlshare_publish_opts dflt = { 0 };
	const dlshare_publish_opts *o = opts ? opts : &dflt;
	int err, cuda_dev = 0;

	errmsg_set(NULL);

	if (!c || client_bad_name(name) || !tensors || n == 0 ||
	    (o->mode & ~CHECK_MODE_MASK))
		return DLSHARE_EINVAL;
	if (client_forked(c))
		return fork_refuse();
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t;
		uint64_t bytes;

		if (!tensors[i])
			return DLSHARE_EINVAL;
		t = &tensors[i]->dl_tensor;
		if (t->device.device_type != kDLCPU &&
		    t->device.device_type != kDLCUDAHost &&
		    t->device.device_type != kDLCUDA)
			return DLSHARE_ENOTSUP;
		if (t->device.device_type == kDLCUDA)
			cuda_dev = 1;
		if (tensor_bytes(t, &bytes) || (bytes && !t->data))
			return DLSHARE_EINVAL;
	}
	if ((o->flags & DLSHARE_PUBLISH_COPY) &&
	    (o->flags & DLSHARE_PUBLISH_NO_COPY))
		return DLSHARE_EINVAL;
	if ((o->ttl_ms || (o->flags & DLSHARE_NAME_OWNED)) &&
	    (err = lifetimes_supported(c, name)))
		return err;
	if ((err = origin_ok(c, name, o->origin_node, o->origin_version)))
		return err;
	err = (o->flags & DLSHARE_PUBLISH_COPY) ? DLSHARE_ENOENT :
		publish_export(c, name, tensors, n, o, q, version);
	if (err != DLSHARE_ENOENT && err != DLSHARE_ECOPY)
		return err;
	if (o->flags & DLSHARE_PUBLISH_NO_COPY)
		return DLSHARE_ECOPY;
	if (cuda_dev)
		return publish_copy_device(c, name, tensors, n, o, q, version);
	return publish_copy(c, name, tensors, n, o, q, version);
}
