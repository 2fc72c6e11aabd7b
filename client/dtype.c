/* dtype — error strings, the version, dtype names and tensor geometry. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *dlshare_version(void)
{
	return DLSHARE_VERSION_STRING;
}

const char *dlshare_strerror(int err)
{
	switch (err) {
	case DLSHARE_OK: return "success";
	case DLSHARE_EINVAL: return "invalid argument";
	case DLSHARE_ENOENT: return "no such name or version";
	case DLSHARE_ETIMEDOUT: return "timed out waiting for a version";
	case DLSHARE_EPERM: return "permission denied";
	case DLSHARE_ENOMEM: return "out of memory";
	case DLSHARE_ELIMIT: return "a limit of the daemon was reached";
	case DLSHARE_EPROTO: return "protocol error";
	case DLSHARE_ECONN: return "cannot reach the daemon, or the connection was lost";
	case DLSHARE_EVERSION: return "the daemon speaks another protocol version";
	case DLSHARE_ENOTSUP: return "not supported (buffer kind or device)";
	case DLSHARE_EIO: return "system error";
	case DLSHARE_EBUSY: return "the buffer is still mapped writable, or has pinned pages";
	case DLSHARE_ECOPY: return "publishing would copy, and copies were forbidden";
	case DLSHARE_ENODEV: return "the device is not visible to this process";
	case DLSHARE_ESTATE: return "the version is not in the required state";
	case DLSHARE_E2BIG: return "the request does not fit in one packet";
	case DLSHARE_ECLOSED: return "the client was disconnected";
	case DLSHARE_EFORK:
		return "the client was created in another process; make a "
		       "new one in the child";
	case DLSHARE_EMFILE:
		return "this process is out of file descriptors (RLIMIT_NOFILE)";
	default: return "unknown error";
	}
}

static const struct {
	const char *name;
	uint8_t code, bits;
} dtypes[] = {
	{ "bool", 6, 8 },
	{ "int8", kDLInt, 8 }, { "int16", kDLInt, 16 },
	{ "int32", kDLInt, 32 }, { "int64", kDLInt, 64 },
	{ "uint8", kDLUInt, 8 }, { "uint16", kDLUInt, 16 },
	{ "uint32", kDLUInt, 32 }, { "uint64", kDLUInt, 64 },
	{ "float16", kDLFloat, 16 }, { "float32", kDLFloat, 32 },
	{ "float64", kDLFloat, 64 }, { "bfloat16", kDLBfloat, 16 },
	{ "complex64", kDLComplex, 64 }, { "complex128", kDLComplex, 128 },
};

int dlshare_dtype_parse(const char *s, DLDataType *out)
{
	if (!s || !out)
		return DLSHARE_EINVAL;
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (strcmp(s, dtypes[i].name) == 0) {
			out->code = dtypes[i].code;
			out->bits = dtypes[i].bits;
			out->lanes = 1;
			return 0;
		}
	return DLSHARE_EINVAL;
}

int dlshare_dtype_format(DLDataType dtype, char *buf, size_t len)
{
	int n = -1;

	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (dtype.lanes == 1 && dtype.code == dtypes[i].code &&
		    dtype.bits == dtypes[i].bits) {
			n = snprintf(buf, len, "%s", dtypes[i].name);
			break;
		}
	if (n < 0)
		n = snprintf(buf, len, "%u:%u:%u", dtype.code, dtype.bits,
			     dtype.lanes);
	return n < 0 || (size_t)n >= len ? DLSHARE_E2BIG : 0;
}

int tensor_bytes(const DLTensor *t, uint64_t *out)
{
	uint64_t elem = check_dtype_size(t->dtype.code, t->dtype.bits,
					 t->dtype.lanes);

	if (!elem || t->ndim < 0 || (uint32_t)t->ndim > CHECK_NDIM_MAX ||
	    (t->ndim && !t->shape))
		return DLSHARE_EINVAL;
	return check_compact_bytes(t->shape, (size_t)t->ndim, elem, out) ?
	       DLSHARE_EINVAL : 0;
}

int tensor_extent(const DLTensor *t, int64_t *lo, int64_t *hi)
{
	uint64_t elem, bytes;
	int64_t l, h;

	if (tensor_bytes(t, &bytes))
		return DLSHARE_EINVAL;
	elem = check_dtype_size(t->dtype.code, t->dtype.bits, t->dtype.lanes);
	/* byte_offset comes from the caller: the range must not wrap. */
	if (t->byte_offset > INT64_MAX)
		return DLSHARE_EINVAL;
	if (!t->strides || bytes == 0) {
		l = h = 0;
		if (bytes > (uint64_t)INT64_MAX)
			return DLSHARE_EINVAL;
		h = (int64_t)bytes;
	} else if (check_extent(t->shape, t->strides, (size_t)t->ndim, elem,
				&l, &h)) {
		return DLSHARE_EINVAL;
	}
	if (__builtin_add_overflow((int64_t)t->byte_offset, l, lo) ||
	    __builtin_add_overflow((int64_t)t->byte_offset, h, hi))
		return DLSHARE_EINVAL;
	return 0;
}

size_t dlshare_dtype_size(DLDataType dtype)
{
	return (size_t)check_dtype_size(dtype.code, dtype.bits, dtype.lanes);
}

int dlshare_tensor_nbytes(const DLTensor *t, uint64_t *nbytes)
{
	if (!t || !nbytes)
		return DLSHARE_EINVAL;
	return tensor_bytes(t, nbytes);
}
