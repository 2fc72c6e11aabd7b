/* test_check — module tests of proto/check (names, dtypes, tensor
 * descriptions) and util/paths (the default socket path rule).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dlpack/dlpack.h>

#include "check.h"
#include "paths.h"
#include "skip.h"

/* ---- names ------------------------------------------------------------ */

static void test_name_valid(void **state)
{
	static const char *ok[] = {
		"a", "A", "0", "_", "-", "weights", "model/layer0.weight",
		"a.b", "...", ".hidden", "a/.x", "a/..b", "a/b../c", "a-b_c.d",
		"ABCxyz0189", "a/b/c/d/e/f", "x/-/y", "..a",
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (check_name(ok[i]) != 0)
			fail_msg("valid name \"%s\" refused", ok[i]);
}

static void test_name_invalid(void **state)
{
	static const char *bad[] = {
		"", ".", "..", "/", "/a", "a/", "/a/", "a//b", "a/./b",
		"a/../b", "./a", "../a", "a/.", "a/..", "a b", "a:b", "a\\b",
		"a*", "a\n", "\xc3\xa9", "a\x7f", "a?b", "a~", "a@b", "a+b",
		"a//", "//", "a\tb",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (check_name(bad[i]) != -EINVAL)
			fail_msg("invalid name \"%s\" accepted", bad[i]);
	assert_int_equal(check_name(NULL), -EINVAL);
}

static void test_name_length(void **state)
{
	char name[CHECK_NAME_MAX + 2];

	memset(name, 'n', sizeof(name));
	name[CHECK_NAME_MAX] = 0;
	assert_int_equal(strlen(name), 255);
	assert_int_equal(check_name(name), 0);
	name[CHECK_NAME_MAX] = 'n';
	name[CHECK_NAME_MAX + 1] = 0;
	assert_int_equal(strlen(name), 256);
	assert_int_equal(check_name(name), -EINVAL);
	/* 255 bytes in many segments. */
	for (size_t i = 0; i < CHECK_NAME_MAX; i++)
		name[i] = (i % 2) ? '/' : 'x';
	name[CHECK_NAME_MAX] = 0;
	assert_int_equal(check_name(name), 0);
	/* A bad segment at the very end is still seen. */
	name[CHECK_NAME_MAX - 1] = '.';
	name[CHECK_NAME_MAX - 2] = '/';
	assert_int_equal(check_name(name), -EINVAL);
}

/* The rules of a name, spelled out: what check_name's one pass must
 * agree with. */
static int name_ok_ref(const char *s)
{
	size_t n = strlen(s), seg = 0;

	if (n == 0 || n > CHECK_NAME_MAX)
		return 0;
	for (size_t i = 0; i <= n; i++) {
		if (i < n && !strchr("abcdefghijklmnopqrstuvwxyz"
				     "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
				     "0123456789._-/", s[i]))
			return 0;
		if (i == n || s[i] == '/') {
			if (i == seg || (i - seg == 1 && s[seg] == '.') ||
			    (i - seg == 2 && s[seg] == '.' && s[seg + 1] == '.'))
				return 0;
			seg = i + 1;
		}
	}
	return 1;
}

/* Every name of up to 6 bytes from a, ., / and !, and names about 255
 * bytes long ending in each of them: check_name and check_name_why agree
 * with the rules. */
static void test_name_every_short(void **state)
{
	static const char abc[] = "a./!";
	char name[CHECK_NAME_MAX + 8];
	unsigned long total = 1;

	for (int len = 1; len <= 6; len++) {
		total *= 4;
		for (unsigned long k = 0; k < total; k++) {
			unsigned long x = k;

			for (int i = 0; i < len; i++, x /= 4)
				name[i] = abc[x % 4];
			name[len] = '\0';
			if ((check_name(name) == 0) != name_ok_ref(name) ||
			    (check_name_why(name) == NULL) != name_ok_ref(name))
				fail_msg("\"%s\": check_name disagrees", name);
		}
	}
	for (size_t n = CHECK_NAME_MAX - 3; n <= CHECK_NAME_MAX + 3; n++) {
		for (int a = 0; a < 4; a++) {
			for (int b = 0; b < 4; b++) {
				memset(name, 'x', n);
				name[n - 2] = abc[a];
				name[n - 1] = abc[b];
				name[n] = '\0';
				if ((check_name(name) == 0) != name_ok_ref(name))
					fail_msg("%zu bytes ending \"%c%c\": "
						 "check_name disagrees", n,
						 abc[a], abc[b]);
			}
		}
	}
}

static void test_prefix(void **state)
{
	static const char *ok[] = {
		"a", "a/", "a/b", "a/b/", "model/la", ".", "..", "a/.", "a/..",
		"a/.hidden",
	};
	static const char *bad[] = {
		"/", "/a", "a//", "a//b", "a/./b", "a/../", "../x", "./",
		"a b", "a:", "a/\xc3",
	};
	char p[CHECK_NAME_MAX + 2];

	assert_int_equal(check_prefix(NULL), 0);
	assert_int_equal(check_prefix(""), 0);
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (check_prefix(ok[i]) != 0)
			fail_msg("valid prefix \"%s\" refused", ok[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (check_prefix(bad[i]) != -EINVAL)
			fail_msg("invalid prefix \"%s\" accepted", bad[i]);
	memset(p, 'p', sizeof(p));
	p[CHECK_NAME_MAX] = 0;
	assert_int_equal(check_prefix(p), 0);
	p[CHECK_NAME_MAX] = 'p';
	p[CHECK_NAME_MAX + 1] = 0;
	assert_int_equal(check_prefix(p), -EINVAL);
}

/* A version's origin (protocol 1.5): 1-64 bytes of 0x21-0x7e. */
static void test_origin(void **state)
{
	char n[CHECK_ORIGIN_NODE_MAX + 2];

	(void)state;
	assert_null(check_origin_why(NULL, 0));
	assert_non_null(check_origin_why(NULL, 1));
	assert_null(check_origin_why("node-a", 0));
	assert_null(check_origin_why("10.0.0.1:13337", UINT64_MAX));
	assert_null(check_origin_why("!~", 3));
	assert_non_null(check_origin_why("", 1));
	assert_non_null(check_origin_why("a b", 1));
	assert_non_null(check_origin_why("a\tb", 1));
	assert_non_null(check_origin_why("a\x7f", 1));
	assert_non_null(check_origin_why("caf\xc3\xa9", 1));
	memset(n, 'n', sizeof(n));
	n[CHECK_ORIGIN_NODE_MAX] = 0;
	assert_null(check_origin_why(n, 1));
	n[CHECK_ORIGIN_NODE_MAX] = 'n';
	n[CHECK_ORIGIN_NODE_MAX + 1] = 0;
	assert_non_null(strstr(check_origin_why(n, 1), "1-64 bytes"));
}

/* ---- dtypes ------------------------------------------------------------- */

static void test_dtype_size(void **state)
{
	assert_int_equal(check_dtype_size(kDLInt, 8, 1), 1);
	assert_int_equal(check_dtype_size(kDLInt, 64, 1), 8);
	assert_int_equal(check_dtype_size(kDLUInt, 16, 1), 2);
	assert_int_equal(check_dtype_size(kDLFloat, 32, 1), 4);
	assert_int_equal(check_dtype_size(kDLFloat, 16, 1), 2);
	assert_int_equal(check_dtype_size(kDLFloat, 64, 1), 8);
	assert_int_equal(check_dtype_size(kDLBfloat, 16, 1), 2);
	assert_int_equal(check_dtype_size(kDLComplex, 64, 1), 8);
	assert_int_equal(check_dtype_size(kDLComplex, 128, 1), 16);
	assert_int_equal(check_dtype_size(6 /* kDLBool */, 8, 1), 1);
	/* Lanes multiply. */
	assert_int_equal(check_dtype_size(kDLFloat, 32, 4), 16);
	assert_int_equal(check_dtype_size(kDLInt, 8, 1024), 1024);
	assert_int_equal(check_dtype_size(kDLInt, 256, 1), 32);

	/* Bits not a multiple of 8 (sub-byte types), or none. */
	assert_int_equal(check_dtype_size(kDLInt, 1, 1), 0);
	assert_int_equal(check_dtype_size(kDLUInt, 4, 2), 0);
	assert_int_equal(check_dtype_size(kDLFloat, 12, 1), 0);
	assert_int_equal(check_dtype_size(kDLFloat, 0, 1), 0);
	assert_int_equal(check_dtype_size(kDLInt, 264, 1), 0);
	/* Lanes 0, or absurdly many. */
	assert_int_equal(check_dtype_size(kDLFloat, 32, 0), 0);
	assert_int_equal(check_dtype_size(kDLInt, 8, 1025), 0);
	assert_int_equal(check_dtype_size(kDLInt, 8, UINT32_MAX), 0);
	/* Unknown codes: kDLOpaqueHandle has no size, and past the end. */
	assert_int_equal(check_dtype_size(kDLOpaqueHandle, 64, 1), 0);
	assert_int_equal(check_dtype_size(7, 8, 1), 0);
	assert_int_equal(check_dtype_size(99, 32, 1), 0);
	assert_int_equal(check_dtype_size(UINT32_MAX, 32, 1), 0);
}

static void test_compact_bytes(void **state)
{
	int64_t s2[] = { 2, 3 };
	int64_t s0[] = { 0, 5 };
	int64_t neg[] = { 4, -1 };
	int64_t negafter0[] = { 0, -1 };
	int64_t ovf[] = { INT64_MAX, 2 };
	int64_t ovf2[] = { INT64_C(1) << 32, INT64_C(1) << 32 };
	int64_t big[] = { INT64_C(1) << 62 };
	int64_t ovf0[] = { INT64_C(1) << 40, INT64_C(1) << 40, 0 };
	uint64_t out = 4242;

	assert_int_equal(check_compact_bytes(s2, 2, 4, &out), 0);
	assert_int_equal(out, 24);
	assert_int_equal(check_compact_bytes(NULL, 0, 8, &out), 0);
	assert_int_equal(out, 8);
	assert_int_equal(check_compact_bytes(s0, 2, 4, &out), 0);
	assert_int_equal(out, 0);
	assert_int_equal(check_compact_bytes(big, 1, 1, &out), 0);
	assert_int_equal(out, UINT64_C(1) << 62);
	/* Empty, wherever its 0 stands: as check_tensor sees it. */
	out = 4242;
	assert_int_equal(check_compact_bytes(ovf0, 3, 4, &out), 0);
	assert_int_equal(out, 0);

	out = 4242;
	assert_int_equal(check_compact_bytes(neg, 2, 4, &out), -EINVAL);
	assert_int_equal(check_compact_bytes(negafter0, 2, 4, &out), -EINVAL);
	assert_int_equal(check_compact_bytes(ovf, 2, 1, &out), -EINVAL);
	assert_int_equal(check_compact_bytes(ovf2, 2, 1, &out), -EINVAL);
	/* 2^62 * 2 = 2^63 does not overflow a uint64 but is past INT64_MAX. */
	assert_int_equal(check_compact_bytes(big, 1, 2, &out), -EINVAL);
	assert_int_equal(check_compact_bytes(big, 1, 4, &out), -EINVAL);
	assert_int_equal(out, 4242);
}

/* ---- tensors ------------------------------------------------------------ */

struct tdesc {
	Dlshare__Tensor t;
	Dlshare__DataType dt;
	int64_t shape[CHECK_NDIM_MAX + 1];
	int64_t strides[CHECK_NDIM_MAX + 1];
};

/* A float32 tensor in buffer 0 at offset; shape and strides (NULL for
 * compact) of ndim entries. */
static Dlshare__Tensor *tdesc(struct tdesc *d, uint64_t offset, size_t ndim,
			      const int64_t *shape, const int64_t *strides)
{
	static const Dlshare__Tensor t = DLSHARE__TENSOR__INIT;
	static const Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;

	assert_true(ndim <= CHECK_NDIM_MAX + 1);
	d->t = t;
	d->dt = dt;
	d->dt.code = kDLFloat;
	d->dt.bits = 32;
	d->dt.lanes = 1;
	d->t.dtype = &d->dt;
	d->t.offset = offset;
	d->t.n_shape = ndim;
	d->t.shape = d->shape;
	for (size_t i = 0; i < ndim; i++)
		d->shape[i] = shape[i];
	if (strides) {
		d->t.n_strides = ndim;
		d->t.strides = d->strides;
		for (size_t i = 0; i < ndim; i++)
			d->strides[i] = strides[i];
	}
	return &d->t;
}

static int check1(const Dlshare__Tensor *t, uint64_t size)
{
	return check_tensor(t, &size, 1);
}

/* check_extent: the one walk check_tensor and the library's
 * tensor_extent share. */
static void test_extent(void **state)
{
	int64_t s23[] = { 2, 3 }, rev[] = { -3, 1 }, gap[] = { 6, 2 };
	int64_t s0[] = { 4, 0 }, huge[] = { INT64_MAX, 2 };
	int64_t lo = 1, hi = 1;

	(void)state;
	assert_int_equal(check_extent(s23, NULL, 2, 4, &lo, &hi), 0);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 24);
	assert_int_equal(check_extent(NULL, NULL, 0, 8, &lo, &hi), 0);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 8);
	/* Rows backwards: the first row starts 3 elements before [0, 0]. */
	assert_int_equal(check_extent(s23, rev, 2, 4, &lo, &hi), 0);
	assert_int_equal(lo, -12);
	assert_int_equal(hi, 12);
	assert_int_equal(check_extent(s23, gap, 2, 2, &lo, &hi), 0);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, (6 + 4 + 1) * 2);
	assert_int_equal(check_extent(s0, gap, 2, 2, &lo, &hi), 0);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 0);
	assert_int_equal(check_extent(huge, NULL, 2, 1, &lo, &hi), -EINVAL);
	assert_int_equal(check_extent(s23, huge, 2, 1, &lo, &hi), -EINVAL);
	assert_int_equal(check_extent(huge, s23, 1, 2, &lo, &hi), -EINVAL);
}

static void test_tensor_compact_fit(void **state)
{
	struct tdesc d;
	int64_t shape[] = { 2, 3 };

	/* 2*3 floats = 24 bytes: exact fit, then one byte short. */
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, NULL), 24), 0);
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, NULL), 23), -EINVAL);
	/* At the end of a larger buffer. */
	assert_int_equal(check1(tdesc(&d, 76, 2, shape, NULL), 100), 0);
	assert_int_equal(check1(tdesc(&d, 77, 2, shape, NULL), 100), -EINVAL);
	/* A scalar needs one element. */
	assert_int_equal(check1(tdesc(&d, 0, 0, NULL, NULL), 4), 0);
	assert_int_equal(check1(tdesc(&d, 0, 0, NULL, NULL), 3), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 4, 0, NULL, NULL), 8), 0);
	assert_int_equal(check1(tdesc(&d, 5, 0, NULL, NULL), 8), -EINVAL);
	/* Lanes and wider types count. */
	tdesc(&d, 0, 2, shape, NULL);
	d.dt.lanes = 2;
	assert_int_equal(check1(&d.t, 48), 0);
	assert_int_equal(check1(&d.t, 47), -EINVAL);
}

static void test_tensor_ndim(void **state)
{
	struct tdesc d;
	int64_t ones[CHECK_NDIM_MAX + 1];

	for (size_t i = 0; i <= CHECK_NDIM_MAX; i++)
		ones[i] = 1;
	assert_int_equal(check1(tdesc(&d, 0, 32, ones, NULL), 4), 0);
	assert_int_equal(check1(tdesc(&d, 0, 32, ones, ones), 4), 0);
	assert_int_equal(check1(tdesc(&d, 0, 33, ones, NULL), 4), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 0, 33, ones, ones), 4), -EINVAL);
}

static void test_tensor_bad_fields(void **state)
{
	struct tdesc d;
	int64_t shape[] = { 2, 3 };
	int64_t negshape[] = { 2, -3 };
	int64_t strides[] = { 3, 1 };
	uint64_t sizes[2] = { 24, 1000 };
	char key[CHECK_KEY_MAX + 2];

	assert_int_equal(check1(tdesc(&d, 0, 2, negshape, NULL), 1000),
			 -EINVAL);
	assert_int_equal(check1(tdesc(&d, 0, 2, negshape, strides), 1000),
			 -EINVAL);
	/* Strides present but not one per dimension. */
	tdesc(&d, 0, 2, shape, strides);
	d.t.n_strides = 1;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.t.n_strides = 3;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.t.n_strides = 2;
	assert_int_equal(check1(&d.t, 1000), 0);
	/* The dtype must be known and present. */
	d.dt.code = kDLOpaqueHandle;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.dt.code = kDLFloat;
	d.dt.bits = 4;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.dt.bits = 32;
	d.dt.lanes = 0;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.dt.lanes = 1;
	d.t.dtype = NULL;
	assert_int_equal(check1(&d.t, 1000), -EINVAL);
	d.t.dtype = &d.dt;
	/* The buffer index picks the size; out of range is refused. */
	tdesc(&d, 100, 2, shape, NULL);
	d.t.buffer = 0;
	assert_int_equal(check_tensor(&d.t, sizes, 2), -EINVAL);
	d.t.buffer = 1;
	assert_int_equal(check_tensor(&d.t, sizes, 2), 0);
	d.t.buffer = 2;
	assert_int_equal(check_tensor(&d.t, sizes, 2), -EINVAL);
	d.t.buffer = UINT32_MAX;
	assert_int_equal(check_tensor(&d.t, sizes, 2), -EINVAL);
	d.t.buffer = 0;
	assert_int_equal(check_tensor(&d.t, sizes, 0), -EINVAL);
	/* Keys up to 255 bytes. */
	tdesc(&d, 0, 2, shape, NULL);
	memset(key, 'k', sizeof(key));
	key[CHECK_KEY_MAX] = 0;
	d.t.key = key;
	assert_int_equal(check1(&d.t, 24), 0);
	key[CHECK_KEY_MAX] = 'k';
	key[CHECK_KEY_MAX + 1] = 0;
	assert_int_equal(check1(&d.t, 24), -EINVAL);
}

static void test_tensor_strides(void **state)
{
	struct tdesc d;
	int64_t shape[] = { 2, 3 };
	int64_t padded[] = { 4, 1 };     /* rows of 4, 3 used */
	int64_t colmajor[] = { 1, 2 };
	int64_t bcast[] = { 0, 0 };
	int64_t shape1[] = { 3 };
	int64_t neg1[] = { -1 };
	int64_t negrows[] = { -4, 1 };

	/* Furthest element: 1*4 + 2*1 = 6, so 7 floats = 28 bytes. */
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, padded), 28), 0);
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, padded), 27), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 8, 2, shape, padded), 36), 0);
	assert_int_equal(check1(tdesc(&d, 8, 2, shape, padded), 35), -EINVAL);
	/* Column-major 2x3: furthest 1 + 4 = 5, 6 floats. */
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, colmajor), 24), 0);
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, colmajor), 23), -EINVAL);
	/* Broadcast: one element however large the shape. */
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, bcast), 4), 0);
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, bcast), 3), -EINVAL);

	/* Negative strides reach below the offset: [0] at 8, [2] at 0. */
	assert_int_equal(check1(tdesc(&d, 8, 1, shape1, neg1), 12), 0);
	assert_int_equal(check1(tdesc(&d, 8, 1, shape1, neg1), 11), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 4, 1, shape1, neg1), 1000), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 0, 1, shape1, neg1), 1000), -EINVAL);
	/* Rows walking backwards: offset 16, reach -4..+2 elements. */
	assert_int_equal(check1(tdesc(&d, 16, 2, shape, negrows), 28), 0);
	assert_int_equal(check1(tdesc(&d, 16, 2, shape, negrows), 27), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 12, 2, shape, negrows), 1000),
			 -EINVAL);
}

static void test_tensor_offset(void **state)
{
	struct tdesc d;
	int64_t shape[] = { 4 };
	uint64_t huge = UINT64_MAX;

	assert_int_equal(check1(tdesc(&d, 1001, 1, shape, NULL), 1000),
			 -EINVAL);
	/* A non-empty tensor at the very end does not fit. */
	assert_int_equal(check1(tdesc(&d, 1000, 1, shape, NULL), 1000),
			 -EINVAL);
	assert_int_equal(check1(tdesc(&d, 984, 1, shape, NULL), 1000), 0);
	assert_int_equal(check1(tdesc(&d, 985, 1, shape, NULL), 1000), -EINVAL);
	/* Offsets past INT64_MAX are refused even in a "huge" buffer. */
	assert_int_equal(check_tensor(tdesc(&d, (uint64_t)INT64_MAX + 1, 1,
					    shape, NULL), &huge, 1), -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, UINT64_MAX, 1, shape, NULL),
				      &huge, 1), -EINVAL);
}

static void test_tensor_zero_size(void **state)
{
	struct tdesc d;
	int64_t shape[] = { 0, 1000000 };
	int64_t shape2[] = { 1000000, 0 };
	int64_t strides[] = { 1000000, 1 };

	/* Nothing is reached: any offset up to the size is fine, also in an
	 * empty buffer. */
	assert_int_equal(check1(tdesc(&d, 0, 2, shape, NULL), 0), 0);
	assert_int_equal(check1(tdesc(&d, 0, 2, shape2, NULL), 0), 0);
	assert_int_equal(check1(tdesc(&d, 16, 2, shape, NULL), 16), 0);
	assert_int_equal(check1(tdesc(&d, 7, 2, shape, strides), 16), 0);
	assert_int_equal(check1(tdesc(&d, 16, 2, shape2, strides), 16), 0);
	/* But not beyond it. */
	assert_int_equal(check1(tdesc(&d, 17, 2, shape, NULL), 16), -EINVAL);
	assert_int_equal(check1(tdesc(&d, 1, 2, shape2, NULL), 0), -EINVAL);
}

static void test_tensor_overflow(void **state)
{
	struct tdesc d;
	uint64_t huge = UINT64_MAX;
	int64_t s_big2[] = { INT64_MAX, 2 };
	int64_t s_4040[] = { INT64_C(1) << 40, INT64_C(1) << 40 };
	int64_t s_61[] = { INT64_C(1) << 61 };
	int64_t s_62[] = { INT64_C(1) << 62 };
	int64_t s_3[] = { 3 };
	int64_t st_half[] = { INT64_MAX / 2 + 1 };
	int64_t st_nhalf[] = { -(INT64_MAX / 2 + 1) };
	int64_t s_222[] = { 2, 2, 2 };
	int64_t st_neg62[] = { -(INT64_C(1) << 62), -(INT64_C(1) << 62),
			       -(INT64_C(1) << 62) };
	int64_t s_22[] = { 2, 2 };
	int64_t st_pos62[] = { INT64_C(1) << 62, INT64_C(1) << 62 };
	int64_t s_max[] = { INT64_MAX };

	/* Element counts that overflow int64. */
	assert_int_equal(check_tensor(tdesc(&d, 0, 2, s_big2, NULL), &huge, 1),
			 -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, 0, 2, s_4040, NULL), &huge, 1),
			 -EINVAL);
	/* 2^61 floats are 2^63 bytes: overflow in the byte conversion. */
	assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_61, NULL), &huge, 1),
			 -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_62, NULL), &huge, 1),
			 -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_max, NULL), &huge, 1),
			 -EINVAL);
	/* Stride times extent overflows, up and down. */
	assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_3, st_half), &huge, 1),
			 -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_3, st_nhalf), &huge, 1),
			 -EINVAL);
	/* Sums of reaches overflow. */
	assert_int_equal(check_tensor(tdesc(&d, 0, 3, s_222, st_neg62), &huge,
				      1), -EINVAL);
	assert_int_equal(check_tensor(tdesc(&d, 0, 2, s_22, st_pos62), &huge,
				      1), -EINVAL);
	/* Something big but representable is judged by size alone. */
	{
		int64_t s_30[] = { INT64_C(1) << 30 };
		uint64_t four_g = UINT64_C(4) << 30;

		assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_30, NULL),
					      &four_g, 1), 0);
		four_g--;
		assert_int_equal(check_tensor(tdesc(&d, 0, 1, s_30, NULL),
					      &four_g, 1), -EINVAL);
	}
}

/* Runs check_tensor in a child, so that a sanitizer abort fails this test
 * alone. Returns its answer, or a positive value when the child died. */
static int check_in_child(const Dlshare__Tensor *t, uint64_t size)
{
	int status;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0)
		_exit(-check_tensor(t, &size, 1));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status))
		return 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	return -WEXITSTATUS(status);
}

/* Keys of one version are unique; unnamed tensors may be many. */
static void test_keys(void **state)
{
	enum { N = 100000 };
	Dlshare__Tensor *t = calloc(N, sizeof(*t)), **tp = calloc(N, sizeof(*tp));
	char (*keys)[24] = calloc(N, sizeof(*keys));
	size_t a = 99, b = 99;

	(void)state;
	assert_non_null(t);
	assert_non_null(tp);
	assert_non_null(keys);
	for (size_t i = 0; i < N; i++) {
		dlshare__tensor__init(&t[i]);
		snprintf(keys[i], sizeof(keys[i]), "layer.%zu.weight", i);
		t[i].key = keys[i];
		tp[i] = &t[i];
	}
	assert_int_equal(check_keys(tp, 0, &a, &b), 0);
	assert_int_equal(check_keys(tp, 1, &a, &b), 0);
	assert_int_equal(check_keys(tp, N, &a, &b), 0);
	assert_int_equal(a, 99);
	/* The last one repeats one far before it. */
	t[N - 1].key = keys[17];
	assert_int_equal(check_keys(tp, N, &a, &b), -EINVAL);
	assert_int_equal(a, 17);
	assert_int_equal(b, N - 1);
	/* Empty and absent keys repeat freely. */
	t[0].key = "";
	t[1].key = "";
	t[2].key = NULL;
	t[3].key = NULL;
	t[N - 1].key = "";
	assert_int_equal(check_keys(tp, N, &a, &b), 0);
	t[3].key = "layer.5.weight";
	assert_int_equal(check_keys(tp, N, &a, &b), -EINVAL);
	assert_int_equal(a, 3);
	assert_int_equal(b, 5);
	free(keys);
	free(tp);
	free(t);
}

static void test_tensor_reach_int64_max(void **state)
{
	struct tdesc d;
	int64_t s_2[] = { 2 };
	int64_t st_max[] = { INT64_MAX };
	int64_t s_22[] = { 2, 2 };
	int64_t st_max1[] = { INT64_MAX - 1, 1 };

	/* Regression test (this was a bug, fixed): the furthest element sits at exactly INT64_MAX elements, and
	 * check_tensor computes `hi + 1` in plain signed arithmetic
	 * (proto/check.c, the __builtin_mul_overflow(hi + 1, ...) line):
	 * signed overflow, undefined behaviour on peer input. The sanitizer
	 * build aborts (the child dies); the answer must be -EINVAL. */
	assert_int_equal(check_in_child(tdesc(&d, 0, 1, s_2, st_max),
					UINT64_MAX), -EINVAL);
	assert_int_equal(check_in_child(tdesc(&d, 0, 2, s_22, st_max1),
					UINT64_MAX), -EINVAL);
}

/* ---- paths -------------------------------------------------------------- */

struct saved_env {
	char *sock, *xdg;
};

static int env_setup(void **state)
{
	struct saved_env *s = calloc(1, sizeof(*s));
	const char *v;

	if (!s)
		return -1;
	if ((v = getenv("DLSHARE_SOCKET")))
		s->sock = strdup(v);
	if ((v = getenv("XDG_RUNTIME_DIR")))
		s->xdg = strdup(v);
	*state = s;
	return 0;
}

static int env_teardown(void **state)
{
	struct saved_env *s = *state;

	if (s->sock)
		setenv("DLSHARE_SOCKET", s->sock, 1);
	else
		unsetenv("DLSHARE_SOCKET");
	if (s->xdg)
		setenv("XDG_RUNTIME_DIR", s->xdg, 1);
	else
		unsetenv("XDG_RUNTIME_DIR");
	free(s->sock);
	free(s->xdg);
	free(s);
	return 0;
}

static void test_paths_env_socket(void **state)
{
	char buf[256];

	setenv("DLSHARE_SOCKET", "/some/where/d.sock", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/some/where/d.sock");
	/* Exactly what fits: strlen + NUL. */
	assert_int_equal(paths_default_socket(buf, strlen("/some/where/d.sock") + 1),
			 0);
	assert_string_equal(buf, "/some/where/d.sock");
	assert_int_equal(paths_default_socket(buf, strlen("/some/where/d.sock")),
			 -ENAMETOOLONG);
}

static void test_paths_xdg_and_tmp(void **state)
{
	char buf[256], want[256];

	if (access(PATHS_SYSTEM_SOCKET, F_OK) == 0) {
		/* The system socket wins over both; nothing else to see. */
		unsetenv("DLSHARE_SOCKET");
		assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
		assert_string_equal(buf, PATHS_SYSTEM_SOCKET);
		test_skip("%s exists, and wins over the other rules",
			  PATHS_SYSTEM_SOCKET);
	}
	/* An empty DLSHARE_SOCKET counts as unset. */
	setenv("DLSHARE_SOCKET", "", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/run/user/4242/dlshare/dlshared.sock");

	unsetenv("DLSHARE_SOCKET");
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/run/user/4242/dlshare/dlshared.sock");

	unsetenv("XDG_RUNTIME_DIR");
	snprintf(want, sizeof(want), "/tmp/dlshare-%u/dlshared.sock",
		 (unsigned)getuid());
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, want);
	setenv("XDG_RUNTIME_DIR", "", 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, want);
	/* Too small a buffer for the /tmp path. */
	assert_int_equal(paths_default_socket(buf, 10), -ENAMETOOLONG);
}

static void test_paths_too_long(void **state)
{
	struct sockaddr_un sa;
	char path[sizeof(sa.sun_path) + 16], buf[512];
	size_t max = sizeof(sa.sun_path) - 1; /* room for the NUL */

	/* The longest path a sockaddr_un holds... */
	memset(path, 'p', sizeof(path));
	path[0] = '/';
	path[max] = 0;
	assert_int_equal(paths_check_socket(path), 0);
	setenv("DLSHARE_SOCKET", path, 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, path);
	/* ...and one byte more, which libuv would silently truncate. */
	path[max] = 'p';
	path[max + 1] = 0;
	assert_int_equal(paths_check_socket(path), -ENAMETOOLONG);
	setenv("DLSHARE_SOCKET", path, 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), -ENAMETOOLONG);

	if (access(PATHS_SYSTEM_SOCKET, F_OK) == 0)
		return;
	/* XDG_RUNTIME_DIR long enough that the socket beneath it does not
	 * fit, though the buffer is large. */
	unsetenv("DLSHARE_SOCKET");
	memset(path, 'x', sizeof(path));
	path[0] = '/';
	path[100] = 0;
	setenv("XDG_RUNTIME_DIR", path, 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), -ENAMETOOLONG);
	/* A shorter one does. */
	path[60] = 0;
	setenv("XDG_RUNTIME_DIR", path, 1);
	assert_int_equal(paths_default_socket(buf, sizeof(buf)), 0);
	assert_int_equal(strncmp(buf, path, 60), 0);
	assert_string_equal(buf + 60, "/dlshare/dlshared.sock");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_name_valid),
		cmocka_unit_test(test_name_invalid),
		cmocka_unit_test(test_name_length),
		cmocka_unit_test(test_name_every_short),
		cmocka_unit_test(test_prefix),
		cmocka_unit_test(test_origin),
		cmocka_unit_test(test_dtype_size),
		cmocka_unit_test(test_compact_bytes),
		cmocka_unit_test(test_extent),
		cmocka_unit_test(test_tensor_compact_fit),
		cmocka_unit_test(test_tensor_ndim),
		cmocka_unit_test(test_tensor_bad_fields),
		cmocka_unit_test(test_tensor_strides),
		cmocka_unit_test(test_tensor_offset),
		cmocka_unit_test(test_tensor_zero_size),
		cmocka_unit_test(test_tensor_overflow),
		cmocka_unit_test(test_tensor_reach_int64_max),
		cmocka_unit_test(test_keys),
		cmocka_unit_test_setup_teardown(test_paths_env_socket,
						env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_paths_xdg_and_tmp,
						env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_paths_too_long,
						env_setup, env_teardown),
	};

	return test_run_group("check", tests, NULL, NULL);
}
