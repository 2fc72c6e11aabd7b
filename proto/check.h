/* check — what makes a name, a dtype or a tensor description valid.
 *
 * Shared by the daemon (which must never trust a peer) and the client (which
 * fails early with the same answer). Pure functions, any thread.
 */
#ifndef DLSHARE_CHECK_H
#define DLSHARE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "dlshare.pb-c.h"

#define CHECK_NAME_MAX 255u  /* bytes in a name */
#define CHECK_KEY_MAX 255u   /* bytes in a tensor's key inside a bundle */
#define CHECK_NDIM_MAX 32u   /* dimensions of a tensor */
#define CHECK_MODE_MASK 0666u
#define CHECK_ORIGIN_NODE_MAX 64u /* bytes in a version's origin node (1.5) */

/* 0 when name is 1..255 bytes of [A-Za-z0-9._/-] with no leading or trailing
 * '/' and no empty, "." or ".." segment; else -EINVAL. */
int check_name(const char *name);
/* Why check_name refuses name, in a sentence naming the rule; NULL when it
 * is a valid name. */
const char *check_name_why(const char *name);

/* Why a version's origin (protocol 1.5: the node a relay mirrored it from,
 * and its number there) is refused, in a sentence naming the rule; NULL
 * when it is valid. node NULL means none given: then version must be 0.
 * A node is 1..CHECK_ORIGIN_NODE_MAX bytes of printable ASCII (0x21-0x7e:
 * no space, no control byte; a NUL ends a C string, and the wire's string
 * is read as one). */
const char *check_origin_why(const char *node, uint64_t version);

/* 0 when prefix is empty or could start a valid name; else -EINVAL. */
int check_prefix(const char *prefix);

/* The size in bytes of one element of a dtype, or 0 when the daemon does not
 * know the dtype (unknown code, bits not a multiple of 8, lanes 0). */
uint64_t check_dtype_size(uint32_t code, uint32_t bits, uint32_t lanes);

/* Bytes a compact row-major tensor of this shape needs: 0 when a
 * dimension is 0, whatever the others. Returns 0 with *out, or -EINVAL for
 * a negative dimension, or more than INT64_MAX bytes. */
int check_compact_bytes(const int64_t *shape, size_t ndim, uint64_t elem,
			uint64_t *out);

/* The bytes a tensor of non-negative shape, strides (in elements; NULL:
 * compact row-major) and elements of elem bytes reaches, relative to its
 * first element: [*lo, *hi), *lo <= 0 < *hi, or [0, 0) when a dimension is
 * 0. Returns 0, or -EINVAL when an offset overflows an int64_t. */
int check_extent(const int64_t *shape, const int64_t *strides, size_t ndim,
		 uint64_t elem, int64_t *lo, int64_t *hi);

/* Validates a tensor description against its version's buffers: known
 * dtype, ndim <= 32, non-negative shape, strides absent or one per dimension,
 * every byte it can reach inside buffer t->buffer (sizes[i] is buffer i's
 * size), nothing overflowing. Returns 0 or -EINVAL. */
int check_tensor(const Dlshare__Tensor *t, const uint64_t *sizes,
		 size_t nbuffers);

/* Whether the keys of n tensors are unique (empty and absent keys, the
 * unnamed tensors, may repeat), in O(n). Returns 0; -EINVAL when two
 * tensors share a key, *first and *second their indices (the key is
 * t[*first]->key); -ENOMEM. */
int check_keys(Dlshare__Tensor *const *t, size_t n, size_t *first,
	       size_t *second);

#endif
