/* test_dtype — module tests of the library's dtype helpers: the size rule
 * it exports for programs and bindings (dlshare_dtype_size,
 * dlshare_tensor_nbytes), which is proto/check's, and dtype names. No
 * daemon.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <dlshare/dlshare.h>

static DLTensor tensor(uint8_t code, uint8_t bits, uint16_t lanes,
		       int64_t *shape, int32_t ndim)
{
	DLTensor t;

	memset(&t, 0, sizeof(t));
	t.dtype.code = code;
	t.dtype.bits = bits;
	t.dtype.lanes = lanes;
	t.shape = shape;
	t.ndim = ndim;
	return t;
}

static void test_dtype_size(void **state)
{
	DLDataType f32 = { kDLFloat, 32, 1 }, v4 = { kDLFloat, 32, 4 };
	DLDataType b1 = { kDLUInt, 1, 1 }, op = { kDLOpaqueHandle, 64, 1 };
	DLDataType l0 = { kDLInt, 8, 0 };

	(void)state;
	assert_int_equal(dlshare_dtype_size(f32), 4);
	assert_int_equal(dlshare_dtype_size(v4), 16);
	assert_int_equal(dlshare_dtype_size(b1), 0);
	assert_int_equal(dlshare_dtype_size(op), 0);
	assert_int_equal(dlshare_dtype_size(l0), 0);
}

static void test_tensor_nbytes(void **state)
{
	int64_t s[] = { 2, 3, 4 }, neg[] = { 2, -1 };
	int64_t empty[] = { INT64_C(1) << 40, INT64_C(1) << 40, 0 };
	int64_t big[] = { INT64_C(1) << 62, 2 };
	int64_t many[33];
	uint64_t n = 42;
	DLTensor t;

	(void)state;
	t = tensor(kDLFloat, 32, 1, s, 3);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), 0);
	assert_int_equal(n, 96);
	/* Strides and byte_offset do not count. */
	t.byte_offset = 1000;
	t.strides = s;
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), 0);
	assert_int_equal(n, 96);
	t = tensor(kDLInt, 64, 1, NULL, 0);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), 0);
	assert_int_equal(n, 8);
	t = tensor(kDLInt, 8, 1, empty, 3);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), 0);
	assert_int_equal(n, 0);

	n = 42;
	t = tensor(kDLInt, 8, 1, neg, 2);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), DLSHARE_EINVAL);
	t = tensor(kDLInt, 16, 1, big, 2);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), DLSHARE_EINVAL);
	t = tensor(kDLOpaqueHandle, 64, 1, s, 3);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), DLSHARE_EINVAL);
	for (int i = 0; i < 33; i++)
		many[i] = 1;
	t = tensor(kDLInt, 8, 1, many, 33);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), DLSHARE_EINVAL);
	t = tensor(kDLInt, 8, 1, NULL, 2);
	assert_int_equal(dlshare_tensor_nbytes(&t, &n), DLSHARE_EINVAL);
	assert_int_equal(dlshare_tensor_nbytes(NULL, &n), DLSHARE_EINVAL);
	assert_int_equal(dlshare_tensor_nbytes(&t, NULL), DLSHARE_EINVAL);
	assert_int_equal(n, 42);
}

static void test_dtype_names(void **state)
{
	DLDataType d, odd = { kDLFloat, 32, 4 };
	char buf[32];

	(void)state;
	assert_int_equal(dlshare_dtype_parse("bfloat16", &d), 0);
	assert_int_equal(d.code, kDLBfloat);
	assert_int_equal(d.bits, 16);
	assert_int_equal(d.lanes, 1);
	assert_int_equal(dlshare_dtype_parse("float31", &d), DLSHARE_EINVAL);
	assert_int_equal(dlshare_dtype_format(d, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "bfloat16");
	assert_int_equal(dlshare_dtype_format(odd, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "2:32:4");
	assert_int_equal(dlshare_dtype_format(odd, buf, 4), DLSHARE_E2BIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtype_size),
		cmocka_unit_test(test_tensor_nbytes),
		cmocka_unit_test(test_dtype_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
