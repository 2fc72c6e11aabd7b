/* check — validation of names and tensor descriptions. */
#include "check.h"
#include "hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>

/* check_keys runs in the daemon and in the library: out of memory is an
 * answer (its oom is set), never an exit. */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (oom = 1)
/* A request's keys are its sender's choice: keyed (hash.h). */
#define HASH_FUNCTION(keyptr, keylen, hashv) \
	((hashv) = (unsigned)util_hash_bytes((keyptr), (keylen)))
#include <uthash.h>

/* The bytes a name may hold, by value: one load per byte where the
 * comparisons were a dozen (every get checks its name on both sides).
 * 2 for the one that ends a segment. */
static const unsigned char name_chars[256] = {
	['a' ... 'z'] = 1, ['A' ... 'Z'] = 1, ['0' ... '9'] = 1,
	['.'] = 1, ['_'] = 1, ['-'] = 1, ['/'] = 2,
};

static int name_char_ok(char c)
{
	return name_chars[(unsigned char)c];
}

/* Checks characters and segments of s[0..n); partial allows a trailing
 * segment that is still being typed (a prefix). */
static int check_segments(const char *s, size_t n, int partial)
{
	size_t seg = 0;

	for (size_t i = 0; i <= n; i++) {
		if (i < n && !name_char_ok(s[i]))
			return -EINVAL;
		if (i == n || s[i] == '/') {
			size_t len = i - seg;

			if (i == n && partial)
				return 0;
			if (len == 0 || (len == 1 && s[seg] == '.') ||
			    (len == 2 && s[seg] == '.' && s[seg + 1] == '.'))
				return -EINVAL;
			seg = i + 1;
		}
	}
	return 0;
}

int check_name(const char *name)
{
	return check_name_why(name) ? -EINVAL : 0;
}

/* Whether name is a good one, in one pass that stops at its NUL: each
 * byte one table load and one compare while nothing is wrong (strnlen
 * first and then the bytes were ~140 instructions of every get, on both
 * sides). 0 says nothing of why: check_name_why finds that. */
static int name_good(const char *name)
{
	const unsigned char *s = (const unsigned char *)name;
	size_t i = 0, seg = 0;

	for (;; i++) {
		unsigned char c = s[i];

		if (name_chars[c] == 1 && i < CHECK_NAME_MAX)
			continue;
		if (c != '/' && c != '\0')
			return 0;
		/* A segment ends: s[seg..i). */
		if (i == seg || (s[seg] == '.' && (i - seg == 1 ||
		    (i - seg == 2 && s[seg + 1] == '.'))))
			return 0;
		if (c == '\0')
			return 1;
		if (i >= CHECK_NAME_MAX)
			return 0;
		seg = i + 1;
	}
}

const char *check_name_why(const char *name)
{
	size_t n, seg = 0;

	if (!name)
		return "no name (NULL)";
	if (name_good(name))
		return NULL;
	n = strnlen(name, CHECK_NAME_MAX + 1);
	if (n == 0)
		return "a name is 1-255 bytes; this one is empty";
	if (n > CHECK_NAME_MAX)
		return "a name is 1-255 bytes; this one is longer";
	for (size_t i = 0; i <= n; i++) {
		if (i < n && !name_char_ok(name[i]))
			return "a name is made of A-Z a-z 0-9 . _ - and /; this "
			       "one has another character";
		if (i == n || name[i] == '/') {
			size_t len = i - seg;

			if (len == 0)
				return "a name has no empty segment (no leading "
				       "or trailing /, no //)";
			if ((len == 1 && name[seg] == '.') ||
			    (len == 2 && name[seg] == '.' &&
			     name[seg + 1] == '.'))
				return "a name has no . or .. segment";
			seg = i + 1;
		}
	}
	return NULL;
}

const char *check_origin_why(const char *node, uint64_t version)
{
	size_t n;

	if (!node)
		return version ? "an origin version needs an origin node" : NULL;
	n = strnlen(node, CHECK_ORIGIN_NODE_MAX + 1);
	if (n == 0)
		return "an origin node is 1-64 bytes; this one is empty";
	if (n > CHECK_ORIGIN_NODE_MAX)
		return "an origin node is 1-64 bytes; this one is longer";
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)node[i] < 0x21 ||
		    (unsigned char)node[i] > 0x7e)
			return "an origin node is printable ASCII with no space "
			       "or control byte; this one has another byte";
	return NULL;
}

int check_prefix(const char *prefix)
{
	size_t n;

	if (!prefix || !*prefix)
		return 0;
	n = strnlen(prefix, CHECK_NAME_MAX + 1);
	if (n > CHECK_NAME_MAX || prefix[0] == '/')
		return -EINVAL;
	return check_segments(prefix, n, 1);
}

uint64_t check_dtype_size(uint32_t code, uint32_t bits, uint32_t lanes)
{
	switch (code) {
	case kDLInt:
	case kDLUInt:
	case kDLFloat:
	case kDLBfloat:
	case kDLComplex:
	case 6: /* kDLBool (DLPack >= 0.8) */
		break;
	default:
		return 0;
	}
	if (bits == 0 || bits % 8 || bits > 256 || lanes == 0 || lanes > 1024)
		return 0;
	return (uint64_t)bits / 8 * lanes;
}

int check_compact_bytes(const int64_t *shape, size_t ndim, uint64_t elem,
			uint64_t *out)
{
	uint64_t n = elem;

	for (size_t i = 0; i < ndim; i++)
		if (shape[i] < 0)
			return -EINVAL;
	/* An empty tensor has no bytes, as check_tensor sees it: its other
	 * dimensions may multiply to anything. */
	for (size_t i = 0; i < ndim; i++)
		if (shape[i] == 0) {
			*out = 0;
			return 0;
		}
	for (size_t i = 0; i < ndim; i++)
		if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
			return -EINVAL;
	if (n > INT64_MAX)
		return -EINVAL;
	*out = n;
	return 0;
}

int check_tensor(const Dlshare__Tensor *t, const uint64_t *sizes,
		 size_t nbuffers)
{
	uint64_t elem, size;
	int64_t lo, hi; /* bytes reached, relative to the first element */

	if (!t->dtype || t->buffer >= nbuffers)
		return -EINVAL;
	if (t->key && strnlen(t->key, CHECK_KEY_MAX + 1) > CHECK_KEY_MAX)
		return -EINVAL;
	elem = check_dtype_size(t->dtype->code, t->dtype->bits,
				t->dtype->lanes);
	if (!elem || t->n_shape > CHECK_NDIM_MAX)
		return -EINVAL;
	if (t->n_strides && t->n_strides != t->n_shape)
		return -EINVAL;
	size = sizes[t->buffer];
	if (t->offset > size || t->offset > INT64_MAX)
		return -EINVAL;

	for (size_t k = 0; k < t->n_shape; k++)
		if (t->shape[k] < 0)
			return -EINVAL;
	if (check_extent(t->shape, t->n_strides ? t->strides : NULL,
			 t->n_shape, elem, &lo, &hi))
		return -EINVAL;
	/* An empty tensor reaches no byte: whatever its other dimensions and
	 * strides say, there is nothing to bound. */
	if (lo == 0 && hi == 0)
		return 0;
	/* offset + lo >= 0 and offset + hi <= size. */
	int64_t first, end;
	if (__builtin_add_overflow((int64_t)t->offset, lo, &first) ||
	    __builtin_add_overflow((int64_t)t->offset, hi, &end))
		return -EINVAL;
	if (first < 0 || (uint64_t)end > size)
		return -EINVAL;
	return 0;
}

int check_extent(const int64_t *shape, const int64_t *strides, size_t ndim,
		 uint64_t elem, int64_t *lo, int64_t *hi)
{
	int64_t l = 0, h = 0; /* element offsets reached, relative to [0..0] */
	int64_t stride = 1, h1;

	for (size_t k = 0; k < ndim; k++)
		if (shape[k] == 0) {
			*lo = *hi = 0;
			return 0;
		}
	/* The walk is done in elements with overflow checks; a compact tensor
	 * is the special case of row-major strides. */
	for (size_t k = ndim; k-- > 0;) {
		int64_t dim = shape[k], s, reach;

		if (dim < 0)
			return -EINVAL;
		s = strides ? strides[k] : stride;
		if (__builtin_mul_overflow(s, dim - 1, &reach))
			return -EINVAL;
		if (reach < 0 ? __builtin_add_overflow(l, reach, &l)
			      : __builtin_add_overflow(h, reach, &h))
			return -EINVAL;
		if (!strides && __builtin_mul_overflow(stride, dim, &stride))
			return -EINVAL;
	}
	/* Bytes: from l*elem to (h+1)*elem. */
	if (elem > INT64_MAX || __builtin_add_overflow(h, 1, &h1) ||
	    __builtin_mul_overflow(l, (int64_t)elem, lo) ||
	    __builtin_mul_overflow(h1, (int64_t)elem, hi))
		return -EINVAL;
	return 0;
}

/* One named tensor in check_keys' set. */
struct key_seen {
	size_t index;
	UT_hash_handle hh;
};

int check_keys(Dlshare__Tensor *const *t, size_t n, size_t *first,
	       size_t *second)
{
	struct key_seen *seen, *set = NULL, *found;
	int oom = 0, err = 0;

	if (n < 2)
		return 0;
	seen = calloc(n, sizeof(*seen));
	if (!seen)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const char *k = t[i]->key;
		size_t len;

		if (!k || !*k)
			continue;
		len = strlen(k);
		HASH_FIND(hh, set, k, len, found);
		if (found) {
			*first = found->index;
			*second = i;
			err = -EINVAL;
			break;
		}
		seen[i].index = i;
		HASH_ADD_KEYPTR(hh, set, k, len, &seen[i]);
		if (oom) {
			err = -ENOMEM;
			break;
		}
	}
	HASH_CLEAR(hh, set);
	free(seen);
	return err;
}
