/* producer — create/seal (store mode) and publish (export mode, or a copy
 * into store mode when the memory cannot be shared). */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Tensors in a store buffer start on this boundary (a cache line, and
 * enough for any vector load). */
#define PRODUCER_ALIGN 64u

struct wtensor {
	DLTensor t;
	int64_t shape[CHECK_NDIM_MAX];
};

struct dlshare_writer {
	dlshare_client *c;
	char name[CHECK_NAME_MAX + 1];
	uint64_t version;
	void *base;
	uint64_t size;
	size_t n;
	struct wtensor *ts;
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

static void send_abort(dlshare_client *c, const char *name, uint64_t version)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Abort a = DLSHARE__ABORT__INIT;

	a.name = (char *)name;
	a.version = version;
	f.body_case = DLSHARE__FRAME__BODY_ABORT;
	f.abort = &a;
	/* Failure leaves a pending version that dies with the connection. */
	simple_call(c, &f, DLSHARE__FRAME__BODY_OK);
}

static void writer_free(dlshare_writer *w)
{
	if (w->base)
		munmap(w->base, w->size);
	client_unref(w->c);
	free(w->ts);
	free(w);
}

/* ---- store mode ---------------------------------------------------------- */

int dlshare_create(dlshare_client *c, const char *name,
		   const dlshare_tensor_spec *specs, size_t n,
		   const dlshare_create_opts *opts, dlshare_writer **out)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	Dlshare__Buffer buf = DLSHARE__BUFFER__INIT;
	Dlshare__Buffer *bufp = &buf;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	Dlshare__CreateReply *rep;
	struct wire_tensors wt = { 0 };
	dlshare_writer *w;
	uint64_t total = 0;
	struct reply r;
	int err;

	if (!out)
		return DLSHARE_EINVAL;
	*out = NULL;
	if (!c || check_name(name) || !specs || n == 0)
		return DLSHARE_EINVAL;
	if (opts && opts->device.device_type != kDLCPU)
		return DLSHARE_ENOTSUP;
	if (opts && (opts->mode & ~CHECK_MODE_MASK))
		return DLSHARE_EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return DLSHARE_ENOMEM;
	w->ts = calloc(n, sizeof(*w->ts));
	if (!w->ts || wire_tensors_alloc(&wt, n)) {
		free(w->ts);
		free(w);
		return DLSHARE_ENOMEM;
	}
	w->c = c;
	client_ref(c);
	w->n = n;
	memcpy(w->name, name, strlen(name) + 1);

	/* Lay the tensors out compact, one after another, aligned. */
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
		memcpy(t->shape, s->shape, (size_t)s->ndim * sizeof(int64_t));
		if ((err = tensor_bytes(&t->t, &bytes)))
			goto fail;
		total = (total + PRODUCER_ALIGN - 1) / PRODUCER_ALIGN *
			PRODUCER_ALIGN;
		t->t.byte_offset = total; /* until the mapping exists */
		if (__builtin_add_overflow(total, bytes, &total) ||
		    total > INT64_MAX) {
			err = DLSHARE_EINVAL;
			goto fail;
		}
		wire_tensor_set(&wt.t[i], s->key, s->dtype, s->ndim, t->shape,
				NULL, 0, t->t.byte_offset);
	}
	dev.type = kDLCPU;
	buf.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	buf.size = total;
	buf.device = &dev;
	cr.name = w->name;
	cr.n_tensors = n;
	cr.tensors = wt.tp;
	cr.n_buffers = 1;
	cr.buffers = &bufp;
	if (opts && opts->mode) {
		cr.has_mode = 1;
		cr.mode = opts->mode;
	}
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &cr;
	err = client_call(c, &f, NULL, 0, NULL, &r);
	if (err)
		goto fail;
	if (r.msg->frame->body_case != DLSHARE__FRAME__BODY_CREATE_REPLY ||
	    r.nfds != 1 || r.msg->frame->create_reply->n_buffers != 1) {
		reply_free(c, &r);
		err = DLSHARE_EPROTO;
		goto fail;
	}
	rep = r.msg->frame->create_reply;
	w->version = rep->version;
	w->size = total;
	if (total) {
		w->base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED,
			       r.fds[0], 0);
		if (w->base == MAP_FAILED) {
			w->base = NULL;
			reply_free(c, &r);
			send_abort(c, w->name, w->version);
			err = DLSHARE_ENOMEM;
			goto fail;
		}
	}
	reply_free(c, &r); /* closes the fd: the mapping holds the memory */
	for (size_t i = 0; i < n; i++) {
		DLTensor *t = &w->ts[i].t;

		t->data = w->base ? (char *)w->base + t->byte_offset : NULL;
		t->byte_offset = 0;
		t->device.device_type = kDLCPU;
	}
	wire_tensors_free(&wt);
	*out = w;
	return 0;

fail:
	wire_tensors_free(&wt);
	writer_free(w);
	return err;
}

size_t dlshare_writer_count(const dlshare_writer *w)
{
	return w ? w->n : 0;
}

DLTensor *dlshare_writer_tensor(dlshare_writer *w, size_t i)
{
	return w && i < w->n ? &w->ts[i].t : NULL;
}

uint64_t dlshare_writer_version(const dlshare_writer *w)
{
	return w ? w->version : 0;
}

int dlshare_seal(dlshare_writer *w, void *stream, uint64_t *version)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal s = DLSHARE__SEAL__INIT;
	int err;

	if (!w)
		return DLSHARE_EINVAL;
	/* The daemon can only write-seal a memfd nobody maps writable. */
	if (w->base) {
		munmap(w->base, w->size);
		w->base = NULL;
	}
	s.name = w->name;
	s.version = w->version;
	f.body_case = DLSHARE__FRAME__BODY_SEAL;
	f.seal = &s;
	err = simple_call(w->c, &f, DLSHARE__FRAME__BODY_SEAL_REPLY);
	if (err && err != DLSHARE_ECONN && err != DLSHARE_ECLOSED)
		send_abort(w->c, w->name, w->version);
	if (!err && version)
		*version = w->version;
	writer_free(w);
	return err;
}

void dlshare_writer_abort(dlshare_writer *w)
{
	if (!w)
		return;
	if (w->base) {
		munmap(w->base, w->size);
		w->base = NULL;
	}
	send_abort(w->c, w->name, w->version);
	writer_free(w);
}

/* ---- export mode ------------------------------------------------------- */

/* Copies t's elements, in row-major order, to dst (compact). */
static void copy_compact(char *dst, const DLTensor *t)
{
	uint64_t elem = check_dtype_size(t->dtype.code, t->dtype.bits,
					 t->dtype.lanes);
	const char *src = (const char *)t->data + t->byte_offset;
	int64_t idx[CHECK_NDIM_MAX] = { 0 };
	uint64_t bytes;

	if (tensor_bytes(t, &bytes) || bytes == 0)
		return;
	if (!t->strides) {
		memcpy(dst, src, bytes);
		return;
	}
	for (uint64_t done = 0; done < bytes; done += elem) {
		int64_t off = 0;

		for (int32_t k = 0; k < t->ndim; k++)
			off += idx[k] * t->strides[k];
		memcpy(dst + done, src + off * (int64_t)elem, elem);
		for (int32_t k = t->ndim - 1; k >= 0; k--) {
			if (++idx[k] < t->shape[k])
				break;
			idx[k] = 0;
		}
	}
}

static int publish_copy(dlshare_client *c, const char *name,
			DLManagedTensor *const *tensors, size_t n,
			const dlshare_publish_opts *o, uint64_t *version)
{
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	dlshare_create_opts co = { .device = { kDLCPU, 0 }, .mode = o->mode };
	dlshare_writer *w;
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
	err = dlshare_create(c, name, specs, n, &co, &w);
	free(specs);
	if (err)
		return err;
	for (size_t i = 0; i < n; i++)
		if (w->ts[i].t.data)
			copy_compact(w->ts[i].t.data, &tensors[i]->dl_tensor);
	err = dlshare_seal(w, o->stream, version);
	if (err)
		return err;
	/* The data lives in the daemon now: the producer's memory is free. */
	for (size_t i = 0; i < n; i++)
		if (tensors[i]->deleter)
			tensors[i]->deleter(tensors[i]);
	return 0;
}

/* Describes tensors that all live in dlshare_host_alloc() memory, or says
 * DLSHARE_ENOENT when one does not (the caller then copies). */
static int publish_export(dlshare_client *c, const char *name,
			  DLManagedTensor *const *tensors, size_t n,
			  const dlshare_publish_opts *o, uint64_t *version)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish p = DLSHARE__PUBLISH__INIT;
	Dlshare__Buffer bufs[CLIENT_PINS_MAX], *bufp[CLIENT_PINS_MAX];
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	void *bases[CLIENT_PINS_MAX];
	int fds[CLIENT_PINS_MAX];
	struct wire_tensors wt = { 0 };
	struct export *e = NULL;
	unsigned nb = 0;
	struct reply r;
	int err;

	if ((err = wire_tensors_alloc(&wt, n)))
		return err;
	dev.type = kDLCPU;
	for (size_t i = 0; i < n; i++) {
		DLTensor *t = &tensors[i]->dl_tensor;
		const char *key = o->keys ? o->keys[i] : NULL;
		int64_t lo, hi;
		uint64_t size;
		void *base;
		unsigned b;
		int fd;

		if (tensor_extent(t, &lo, &hi) ||
		    (key && strlen(key) > CHECK_KEY_MAX)) {
			err = DLSHARE_EINVAL;
			goto out;
		}
		err = hostmem_find((char *)t->data + lo, (uint64_t)(hi - lo),
				   &base, &size, &fd);
		if (err)
			goto out;
		for (b = 0; b < nb && bases[b] != base; b++)
			;
		if (b < nb) {
			close(fd);
		} else if (nb == CLIENT_PINS_MAX) {
			close(fd);
			err = DLSHARE_ELIMIT;
			goto out;
		} else {
			dlshare__buffer__init(&bufs[nb]);
			bufs[nb].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
			bufs[nb].size = size;
			bufs[nb].device = &dev;
			bufs[nb].has_fd_attached = 1;
			bufs[nb].fd_attached = 1;
			bufp[nb] = &bufs[nb];
			bases[nb] = base;
			fds[nb++] = fd;
		}
		wire_tensor_set(&wt.t[i], key, t->dtype, t->ndim, t->shape,
				t->strides, b,
				(uint64_t)((char *)t->data + t->byte_offset -
					   (char *)base));
	}
	e = calloc(1, sizeof(*e));
	if (e)
		e->tensors = calloc(n, sizeof(*e->tensors));
	if (!e || !e->tensors) {
		err = DLSHARE_ENOMEM;
		goto out;
	}
	memcpy(e->name, name, strlen(name) + 1);
	memcpy(e->tensors, tensors, n * sizeof(*tensors));
	e->n = n;
	p.name = (char *)name;
	p.n_tensors = n;
	p.tensors = wt.tp;
	p.n_buffers = nb;
	p.buffers = bufp;
	if (o->mode) {
		p.has_mode = 1;
		p.mode = o->mode;
	}
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &p;
	err = client_call(c, &f, fds, nb, e, &r);
	if (!err) {
		/* The receiver thread registered e when the reply came. */
		if (r.msg->frame->body_case != DLSHARE__FRAME__BODY_PUBLISH_REPLY)
			err = DLSHARE_EPROTO;
		else if (version)
			*version = r.msg->frame->publish_reply->version;
		reply_free(c, &r);
		e = NULL;
	}
out:
	wire_close_fds(fds, nb);
	if (e) {
		free(e->tensors);
		free(e);
	}
	wire_tensors_free(&wt);
	return err;
}

int dlshare_publish(dlshare_client *c, const char *name,
		    DLManagedTensor *const *tensors, size_t n,
		    const dlshare_publish_opts *opts, uint64_t *version)
{
	static const dlshare_publish_opts dflt = { 0 };
	const dlshare_publish_opts *o = opts ? opts : &dflt;
	int err;

	if (!c || check_name(name) || !tensors || n == 0 ||
	    (o->mode & ~CHECK_MODE_MASK))
		return DLSHARE_EINVAL;
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t;
		uint64_t bytes;

		if (!tensors[i])
			return DLSHARE_EINVAL;
		t = &tensors[i]->dl_tensor;
		if (t->device.device_type != kDLCPU)
			return DLSHARE_ENOTSUP;
		if (tensor_bytes(t, &bytes) || (bytes && !t->data))
			return DLSHARE_EINVAL;
	}
	err = publish_export(c, name, tensors, n, o, version);
	if (err != DLSHARE_ENOENT)
		return err;
	if (o->flags & DLSHARE_PUBLISH_NO_COPY)
		return DLSHARE_ECOPY;
	return publish_copy(c, name, tensors, n, o, version);
}
