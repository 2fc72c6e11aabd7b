/* manifest — write, check and read the flat manifest (see manifest.h). */
#include "manifest.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hash.h"

static uint64_t align8(uint64_t x)
{
	return (x + 7) & ~UINT64_C(7);
}

int manifest_size(Dlshare__Tensor *const *t, size_t n, uint64_t *size)
{
	uint64_t ndims = 0, keys = 0, s;

	if (n > MANIFEST_TENSORS_HARD_MAX)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		size_t klen = t[i]->key ? strlen(t[i]->key) : 0;

		if (klen > CHECK_KEY_MAX || t[i]->n_shape > CHECK_NDIM_MAX ||
		    (t[i]->n_strides && t[i]->n_strides != t[i]->n_shape) ||
		    !t[i]->dtype || t[i]->dtype->code > 255 ||
		    t[i]->dtype->bits > 65535 || t[i]->dtype->lanes > 65535 ||
		    t[i]->buffer > 255)
			return -EINVAL;
		ndims += t[i]->n_shape + t[i]->n_strides;
		keys += klen + 1;
	}
	/* At most 4e6 * (64 dims + 256 key bytes): no overflow, but the
	 * entries' 32-bit offsets must reach. */
	if (ndims > UINT32_MAX || keys > UINT32_MAX)
		return -E2BIG;
	s = sizeof(struct manifest_header) + n * sizeof(struct manifest_entry);
	s = align8(s) + ndims * 8 + keys;
	*size = s;
	return 0;
}

void manifest_write(void *dst, uint64_t size, Dlshare__Tensor *const *t,
		    size_t n)
{
	struct manifest_header *h = dst;
	struct manifest_entry *e;
	int64_t *dims;
	char *keys;
	uint64_t nd = 0, ko = 0;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, MANIFEST_MAGIC, sizeof(h->magic));
	h->format = MANIFEST_FORMAT;
	h->ntensors = (uint32_t)n;
	h->entries_off = sizeof(*h);
	h->dims_off = align8(h->entries_off + n * sizeof(*e));
	for (size_t i = 0; i < n; i++)
		nd += t[i]->n_shape + t[i]->n_strides;
	h->ndims = nd;
	h->keys_off = h->dims_off + nd * 8;
	h->keys_len = size - h->keys_off;
	h->size = size;
	e = (struct manifest_entry *)((char *)dst + h->entries_off);
	dims = (int64_t *)((char *)dst + h->dims_off);
	keys = (char *)dst + h->keys_off;
	memset((char *)dst + h->entries_off, 0, h->dims_off - h->entries_off);
	nd = 0;
	for (size_t i = 0; i < n; i++) {
		const char *k = t[i]->key ? t[i]->key : "";
		size_t klen = strlen(k);

		e[i].offset = t[i]->offset;
		e[i].key_off = (uint32_t)ko;
		e[i].dims = (uint32_t)nd;
		e[i].key_len = (uint16_t)klen;
		e[i].bits = (uint16_t)t[i]->dtype->bits;
		e[i].lanes = (uint16_t)t[i]->dtype->lanes;
		e[i].code = (uint8_t)t[i]->dtype->code;
		e[i].ndim = (uint8_t)t[i]->n_shape;
		e[i].buffer = (uint8_t)t[i]->buffer;
		e[i].flags = t[i]->n_strides ? MANIFEST_FLAG_STRIDES : 0;
		if (t[i]->n_shape)
			memcpy(dims + nd, t[i]->shape, t[i]->n_shape * 8);
		nd += t[i]->n_shape;
		if (t[i]->n_strides)
			memcpy(dims + nd, t[i]->strides, t[i]->n_strides * 8);
		nd += t[i]->n_strides;
		memcpy(keys + ko, k, klen + 1);
		ko += klen + 1;
	}
}

void manifest_tensor(const void *map, uint32_t i, Dlshare__Tensor *t,
		     Dlshare__DataType *dt)
{
	const struct manifest_entry *e = &manifest_entries(map)[i];
	const int64_t *dims = manifest_dims(map) + e->dims;

	dlshare__tensor__init(t);
	dlshare__data_type__init(dt);
	dt->code = e->code;
	dt->bits = e->bits;
	dt->lanes = e->lanes;
	t->dtype = dt;
	t->key = (char *)manifest_keys(map) + e->key_off;
	t->buffer = e->buffer;
	t->offset = e->offset;
	t->n_shape = e->ndim;
	t->shape = (int64_t *)dims;
	t->n_strides = (e->flags & MANIFEST_FLAG_STRIDES) ? e->ndim : 0;
	t->strides = t->n_strides ? (int64_t *)dims + e->ndim : NULL;
}

/* The keys are the producer's choice, and every reader checks them:
 * keyed (hash.h), so that no manifest can make its probes collide. */
static uint64_t key_hash(const char *k, size_t len)
{
	return util_hash_bytes(k, len);
}

static int fail(struct manifest_error *e, int64_t index, const char *fmt,
		...) __attribute__((format(printf, 3, 4)));

static int fail(struct manifest_error *e, int64_t index, const char *fmt, ...)
{
	va_list ap;

	e->index = index;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* The header's bounds: every part inside the used size, in order. */
static int header_check(const struct manifest_header *h, uint64_t map_size,
			uint32_t ntensors, struct manifest_error *e)
{
	uint64_t end;

	if (memcmp(h->magic, MANIFEST_MAGIC, sizeof(h->magic)) != 0)
		return fail(e, -1, "the manifest does not start with \"%s\"",
			    MANIFEST_MAGIC);
	if (h->format != MANIFEST_FORMAT)
		return fail(e, -1, "manifest format %u is unknown (this daemon "
			    "reads %u)", h->format, MANIFEST_FORMAT);
	if (h->ntensors != ntensors)
		return fail(e, -1, "the manifest holds %u tensors, the request "
			    "says %u", h->ntensors, ntensors);
	if (h->size > map_size)
		return fail(e, -1, "the manifest claims %llu bytes, its memfd "
			    "has %llu", (unsigned long long)h->size,
			    (unsigned long long)map_size);
	if (h->entries_off != sizeof(*h))
		return fail(e, -1, "the manifest's entries must follow its "
			    "header");
	end = h->entries_off + (uint64_t)ntensors * sizeof(struct manifest_entry);
	if (h->dims_off < end || h->dims_off % 8 || h->dims_off > h->size ||
	    h->ndims > (h->size - h->dims_off) / 8)
		return fail(e, -1, "the manifest's dims lie outside it or "
			    "overlap its entries");
	end = h->dims_off + h->ndims * 8;
	if (h->keys_off < end || h->keys_off > h->size ||
	    h->keys_len > h->size - h->keys_off)
		return fail(e, -1, "the manifest's keys lie outside it or "
			    "overlap its dims");
	if (h->ndims > UINT32_MAX || h->keys_len > UINT32_MAX)
		return fail(e, -1, "the manifest's dims or keys pass 2^32");
	return 0;
}

int manifest_check(const void *map, uint64_t map_size, uint32_t ntensors,
		   const uint64_t *sizes, size_t nbuffers, int check_keys,
		   struct manifest_error *e)
{
	const struct manifest_header *h = map;
	const struct manifest_entry *ents;
	const int64_t *dims;
	const char *keys;
	uint32_t *table = NULL;
	size_t mask = 0;
	int err;

	e->index = -1;
	e->msg[0] = 0;
	if (map_size < sizeof(*h))
		return fail(e, -1, "the manifest memfd has %llu bytes, less "
			    "than its header", (unsigned long long)map_size);
	if (ntensors == 0 || ntensors > MANIFEST_TENSORS_HARD_MAX)
		return fail(e, -1, "a manifest holds 1 to %u tensors, not %u",
			    MANIFEST_TENSORS_HARD_MAX, ntensors);
	if ((err = header_check(h, map_size, ntensors, e)))
		return err;
	ents = manifest_entries(map);
	dims = manifest_dims(map);
	keys = manifest_keys(map);
	if (check_keys) {
		size_t slots = 16;

		/* ntensors is bounded by the memfd the sender paid for. */
		while (slots < 2 * (size_t)ntensors)
			slots *= 2;
		table = calloc(slots, sizeof(*table));
		if (!table)
			return -ENOMEM;
		mask = slots - 1;
	}
	for (uint32_t i = 0; i < ntensors; i++) {
		const struct manifest_entry *en = &ents[i];
		Dlshare__Tensor t;
		Dlshare__DataType dt;
		uint64_t need;
		const char *k;

		if (en->pad[0] | en->pad[1] | en->pad[2] | en->pad[3] |
		    en->pad[4] | en->pad[5] || (en->flags & ~MANIFEST_FLAG_STRIDES)) {
			err = fail(e, i, "tensor %u: reserved bytes of its "
				   "manifest entry are not zero", i);
			goto out;
		}
		if (en->key_len > CHECK_KEY_MAX) {
			err = fail(e, i, "tensor %u: its key has %u bytes, "
				   "more than the limit of %u", i, en->key_len,
				   CHECK_KEY_MAX);
			goto out;
		}
		if ((uint64_t)en->key_off + en->key_len >= h->keys_len) {
			err = fail(e, i, "tensor %u: its key lies past the "
				   "manifest's keys", i);
			goto out;
		}
		k = keys + en->key_off;
		if (k[en->key_len] != 0 || memchr(k, 0, en->key_len)) {
			err = fail(e, i, "tensor %u: its key is not %u bytes "
				   "ending in a NUL", i, en->key_len);
			goto out;
		}
		if (en->ndim > CHECK_NDIM_MAX) {
			err = fail(e, i, "tensor %u (\"%s\"): %u dimensions, "
				   "more than the limit of %u", i, k, en->ndim,
				   CHECK_NDIM_MAX);
			goto out;
		}
		need = (uint64_t)en->ndim *
		       ((en->flags & MANIFEST_FLAG_STRIDES) ? 2 : 1);
		if ((uint64_t)en->dims + need > h->ndims) {
			err = fail(e, i, "tensor %u (\"%s\"): its shape lies "
				   "past the manifest's dims", i, k);
			goto out;
		}
		manifest_tensor(map, i, &t, &dt);
		if (check_tensor(&t, sizes, nbuffers)) {
			err = fail(e, i, "tensor %u (\"%s\"): its dtype, shape "
				   "or offset %llu do not fit buffer %u (%s)",
				   i, k, (unsigned long long)en->offset,
				   en->buffer, en->buffer < nbuffers ?
				   "it reaches past its end, or the dtype is "
				   "unknown" : "no such buffer");
			goto out;
		}
		(void)dims;
		if (table && en->key_len) {
			size_t j = key_hash(k, en->key_len) & mask;

			for (; table[j]; j = (j + 1) & mask) {
				const struct manifest_entry *o =
					&ents[table[j] - 1];

				if (o->key_len == en->key_len &&
				    memcmp(keys + o->key_off, k,
					   en->key_len) == 0) {
					err = fail(e, i, "tensors %u and %u "
						   "have the same key \"%s\"",
						   table[j] - 1, i, k);
					goto out;
				}
			}
			table[j] = i + 1;
		}
	}
	err = 0;
out:
	free(table);
	return err;
}
