/* manifest — the flat binary form of a large version's tensors (protocol
 * 1.4): what a producer writes into a memfd when its tensors do not fit in a
 * packet, what the daemon checks once and seals, and what every reader maps
 * read-only and parses in place.
 *
 * Layout (host byte order; both ends are on one machine):
 *   header   64 bytes (struct manifest_header)
 *   entries  ntensors * 32 bytes (struct manifest_entry)
 *   dims     ndims int64_t, 8-aligned: each tensor's shape, then its strides
 *   keys     keys_len bytes: each key NUL-terminated
 * Pure functions, no allocation but the duplicate-key table of
 * manifest_check; any thread.
 */
#ifndef DLSHARE_MANIFEST_H
#define DLSHARE_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "dlshare.pb-c.h"

#define MANIFEST_MAGIC "DLSMAN1"  /* 8 bytes with its NUL */
#define MANIFEST_FORMAT 1u
/* Most tensors a manifest may hold, whatever a limit says: 10^7 is refused
 * on the wire before anything is mapped. */
#define MANIFEST_TENSORS_HARD_MAX 4000000u
#define MANIFEST_FLAG_STRIDES 1u

struct manifest_header {
	char magic[8];
	uint32_t format;
	uint32_t ntensors;
	uint64_t entries_off;    /* always sizeof(struct manifest_header) */
	uint64_t dims_off;       /* 8-aligned, at or after the entries */
	uint64_t ndims;          /* int64_t values at dims_off */
	uint64_t keys_off;       /* at or after the dims */
	uint64_t keys_len;
	uint64_t size;           /* bytes used, <= the memfd's size */
};

struct manifest_entry {
	uint64_t offset;         /* byte offset of element [0,...,0] */
	uint32_t key_off;        /* into the keys; key NUL-terminated there */
	uint32_t dims;           /* index of its shape in dims */
	uint16_t key_len;        /* bytes before the NUL, <= CHECK_KEY_MAX */
	uint16_t bits;
	uint16_t lanes;
	uint8_t code;
	uint8_t ndim;            /* <= CHECK_NDIM_MAX */
	uint8_t buffer;          /* index into the version's buffers */
	uint8_t flags;           /* MANIFEST_FLAG_STRIDES: strides follow shape */
	uint8_t pad[6];          /* zero */
};

_Static_assert(sizeof(struct manifest_header) == 64, "header is 64 bytes");
_Static_assert(sizeof(struct manifest_entry) == 32, "entry is 32 bytes");

/* Bytes the manifest of n tensors t needs. Returns 0 with *size, or
 * -EINVAL (a tensor check_tensor's field widths refuse: ndim, key length,
 * dtype fields, buffer index) or -E2BIG (the sizes overflow the format). */
int manifest_size(Dlshare__Tensor *const *t, size_t n, uint64_t *size);

/* Writes the manifest of n tensors into dst (size bytes, as manifest_size
 * said). The tensors were accepted by manifest_size. */
void manifest_write(void *dst, uint64_t size, Dlshare__Tensor *const *t,
		    size_t n);

/* What manifest_check says about a manifest that lies. */
struct manifest_error {
	int64_t index;           /* the tensor at fault, or -1 */
	char msg[400];           /* a sentence naming it, its key and the
				  * limit it breaks */
};

/* Checks the manifest at map (map_size bytes, the whole memfd) against
 * what the request says (ntensors) and the version's buffers (sizes[i] is
 * buffer i's size): the header's bounds, every tensor as check_tensor
 * checks one, every key NUL-terminated, at most CHECK_KEY_MAX bytes and,
 * with check_keys, unique among the named tensors. Returns 0, -EINVAL with
 * *e filled, or -ENOMEM. */
int manifest_check(const void *map, uint64_t map_size, uint32_t ntensors,
		   const uint64_t *sizes, size_t nbuffers, int check_keys,
		   struct manifest_error *e);

/* The parts of a checked manifest. */
static inline const struct manifest_entry *
manifest_entries(const void *map)
{
	const struct manifest_header *h = map;

	return (const struct manifest_entry *)((const char *)map +
					       h->entries_off);
}

static inline const int64_t *manifest_dims(const void *map)
{
	const struct manifest_header *h = map;

	return (const int64_t *)((const char *)map + h->dims_off);
}

static inline const char *manifest_keys(const void *map)
{
	const struct manifest_header *h = map;

	return (const char *)map + h->keys_off;
}

/* Tensor i of a checked manifest as a wire view (pointers into map): fills
 * *t and *dt (t->dtype = dt). */
void manifest_tensor(const void *map, uint32_t i, Dlshare__Tensor *t,
		     Dlshare__DataType *dt);

#endif
