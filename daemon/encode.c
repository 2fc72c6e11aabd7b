/* encode — the model as protobuf-c structs. */
#include "encode.h"

#include <errno.h>
#include <stdlib.h>

void encode_version_deinit(struct encode_version *w)
{
	free(w->block);
	w->block = NULL;
}

int encode_version_init(struct encode_version *w, const struct version *v,
			const int *attach, enum encode_manifest mmode)
{
	size_t nt = v->manifest_fd >= 0 ? 0 : v->ntensors, nb = v->nbuffers;

	w->block = NULL;
	w->nfds = 0;
	w->has_manifest = v->manifest_fd >= 0;
	if (nt <= ENCODE_VERSION_SMALL && nb <= ENCODE_VERSION_SMALL) {
		w->t = w->small.t;
		w->tp = w->small.tp;
		w->dt = w->small.dt;
		w->b = w->small.b;
		w->bp = w->small.bp;
		w->dev = w->small.dev;
	} else {
		/* One block, each part aligned as its type wants: pointers
		 * and the protobuf-c structs are all pointer-aligned. */
		char *p = calloc(1, nt * (sizeof(*w->t) + sizeof(*w->tp) +
					  sizeof(*w->dt)) +
				    nb * (sizeof(*w->b) + sizeof(*w->bp) +
					  sizeof(*w->dev)));

		if (!p)
			return -ENOMEM;
		w->block = p;
		w->t = (Dlshare__Tensor *)p;
		p += nt * sizeof(*w->t);
		w->tp = (Dlshare__Tensor **)p;
		p += nt * sizeof(*w->tp);
		w->dt = (Dlshare__DataType *)p;
		p += nt * sizeof(*w->dt);
		w->b = (Dlshare__Buffer *)p;
		p += nb * sizeof(*w->b);
		w->bp = (Dlshare__Buffer **)p;
		p += nb * sizeof(*w->bp);
		w->dev = (Dlshare__Device *)p;
	}
	for (size_t i = 0; i < nt; i++) {
		const struct rtensor *rt = &v->tensors[i];
		Dlshare__Tensor *t = &w->t[i];

		dlshare__tensor__init(t);
		dlshare__data_type__init(&w->dt[i]);
		w->dt[i].code = rt->code;
		w->dt[i].bits = rt->bits;
		w->dt[i].lanes = rt->lanes;
		t->key = rt->key;
		t->buffer = rt->buffer;
		t->offset = rt->offset;
		t->dtype = &w->dt[i];
		t->n_shape = rt->ndim;
		t->shape = rt->shape;
		if (rt->has_strides) {
			t->n_strides = rt->ndim;
			t->strides = rt->strides;
		}
		w->tp[i] = t;
	}
	for (size_t i = 0; i < v->nbuffers; i++) {
		struct rbuffer *rb = v->buffers[i];
		Dlshare__Buffer *b = &w->b[i];

		dlshare__buffer__init(b);
		dlshare__device__init(&w->dev[i]);
		w->dev[i].type = rb->dev_type;
		if (rb->has_uuid) {
			w->dev[i].has_uuid = 1;
			w->dev[i].uuid.data = rb->cuda->uuid;
			w->dev[i].uuid.len = sizeof(rb->cuda->uuid);
		}
		b->id = rb->id;
		b->kind = rb->kind;
		b->size = rb->size;
		b->device = &w->dev[i];
		if (rb->ipc_handle_len) {
			b->has_ipc_handle = 1;
			b->ipc_handle.data = rb->cuda->ipc_handle;
			b->ipc_handle.len = rb->ipc_handle_len;
			b->has_ipc_offset = 1;
			b->ipc_offset = rb->cuda->ipc_offset;
		}
		if (attach && attach[i] && rb->fd >= 0) {
			b->has_fd_attached = 1;
			b->fd_attached = 1;
			/* Readers of a sealed version get the read-only fd;
			 * the producer of a pending one the writable one. */
			w->fds[w->nfds++] = registry_reader_fd(rb);
		}
		w->bp[i] = b;
	}
	if (w->has_manifest) {
		dlshare__buffer__init(&w->manifest);
		dlshare__device__init(&w->manifest_dev);
		w->manifest_dev.type = 1;
		/* An id only to a peer that keeps manifests by it (and
		 * hears BufferGone of it): anyone else keeps nothing. */
		if (mmode != ENCODE_MANIFEST_FD)
			w->manifest.id = v->cold->mbuf.id;
		w->manifest.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		w->manifest.size = v->meta_bytes;
		w->manifest.device = &w->manifest_dev;
		if (mmode != ENCODE_MANIFEST_KEPT) {
			w->manifest.has_fd_attached = 1;
			w->manifest.fd_attached = 1;
			w->fds[w->nfds++] = v->manifest_fd;
		}
	}
	return 0;
}

void encode_name_info(Dlshare__NameInfo *ni, const struct entry *e)
{
	/* A queue name shows its oldest queued version. */
	const struct version *v = e->queue ? e->queue->head : e->latest;

	dlshare__name_info__init(ni);
	ni->name = (char *)e->name;
	ni->latest = v ? v->number : 0;
	ni->versions = e->nversions;
	ni->tensors = v ? (uint32_t)v->ntensors : 0;
	ni->bytes = v ? registry_bytes(v) : 0;
	ni->has_manifest_bytes = v != NULL;
	ni->manifest_bytes = v ? v->meta_bytes : 0;
	ni->leases = e->leases;
	ni->owner_uid = e->owner_uid;
	ni->mode = e->mode;
	if (v && v->cold && v->cold->origin_node) {
		ni->origin_node = (char *)v->cold->origin_node;
		ni->has_origin_version = 1;
		ni->origin_version = v->cold->origin_version;
	}
	if (v) {
		ni->has_kind = 1;
		ni->kind = v->buffers[0]->kind;
		ni->has_exported = 1;
		ni->exported = v->exported;
	}
	if (e->queue) {
		const struct entry_queue *q = e->queue;

		ni->has_queue_depth = ni->has_queued = ni->has_taken = 1;
		ni->has_queue_pending = 1;
		ni->queue_depth = q->depth;
		ni->queued = q->queued;
		ni->taken = q->taken;
		ni->queue_pending = q->held - q->queued - q->taken;
	}
}

void encode_name_lifetime(Dlshare__NameInfo *ni, const struct registry *r,
			  const struct entry *e)
{
	uint64_t left = lifetime_left(r, e);

	if (e->life && e->life->owned_by) {
		ni->has_owned = ni->owned = 1;
		ni->has_owner_pid = 1;
		ni->owner_pid = (uint32_t)e->life->owned_by->pid;
	}
	if (left != UINT64_MAX) {
		ni->has_ttl_ms = 1;
		ni->ttl_ms = e->life->ttl_ms;
		ni->has_expires_in_ms = 1;
		ni->expires_in_ms = left;
	}
}
