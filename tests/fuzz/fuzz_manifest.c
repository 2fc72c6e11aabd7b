/* fuzz_manifest — the manifest parser (proto/manifest.c), which the daemon
 * runs on a peer's memfd and every reader on the daemon's.
 *
 * One input is the bytes of a manifest memfd; the tensor count the request
 * claims is the header's when there is one (else 1), and the version has
 * two buffers of 4096 and 1 MiB. The input is copied to an allocation of
 * exactly its size, so ASan catches any read past it. Invariants:
 *  - manifest_check never reads outside the manifest and, when it refuses,
 *    says why;
 *  - when it accepts, every tensor (manifest_tensor) passes check_tensor
 *    against the buffers, its key lies inside the manifest, NUL-terminated,
 *    at most CHECK_KEY_MAX bytes, and no two named tensors share a key;
 *  - writing the accepted tensors again (manifest_size, manifest_write)
 *    gives a manifest that is accepted and describes the same tensors.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz.h"
#include "manifest.h"

static const uint64_t sizes[2] = { 4096, 1u << 20 };

static int same_tensor(const Dlshare__Tensor *a, const Dlshare__Tensor *b)
{
	return strcmp(a->key, b->key) == 0 && a->buffer == b->buffer &&
	       a->offset == b->offset && a->n_shape == b->n_shape &&
	       a->n_strides == b->n_strides &&
	       a->dtype->code == b->dtype->code &&
	       a->dtype->bits == b->dtype->bits &&
	       a->dtype->lanes == b->dtype->lanes &&
	       (!a->n_shape || !memcmp(a->shape, b->shape, a->n_shape * 8)) &&
	       (!a->n_strides ||
		!memcmp(a->strides, b->strides, a->n_strides * 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct manifest_error e;
	uint32_t n = 1;
	uint8_t *m;
	int err;

	/* Aligned as a mapping is, and exactly as long as the input. */
	m = aligned_alloc(64, size ? (size + 63) / 64 * 64 : 64);
	if (!m)
		return 0;
	memcpy(m, data, size);
	if (size >= sizeof(struct manifest_header)) {
		n = ((const struct manifest_header *)(const void *)m)->ntensors;
		/* A count the memfd cannot hold is refused before any loop;
		 * keep the fuzzer's inputs small. */
		if (n > 4096)
			n = 4096;
	}
	err = manifest_check(m, size, n, sizes, 2, 1, &e);
	if (err) {
		FUZZ_ASSERT(err == -EINVAL || err == -ENOMEM, "err %d", err);
		FUZZ_ASSERT(err == -ENOMEM || e.msg[0], "refused without a reason");
		free(m);
		return 0;
	}
	Dlshare__Tensor *t = calloc(n, sizeof(*t));
	Dlshare__Tensor **tp = calloc(n, sizeof(*tp));
	Dlshare__DataType *dt = calloc(n, sizeof(*dt));
	uint64_t size2;

	FUZZ_ASSERT(t && tp && dt, "out of memory");
	for (uint32_t i = 0; i < n; i++) {
		manifest_tensor(m, i, &t[i], &dt[i]);
		tp[i] = &t[i];
		FUZZ_ASSERT(check_tensor(&t[i], sizes, 2) == 0, "tensor %u", i);
		FUZZ_ASSERT((const uint8_t *)t[i].key >= m &&
			    (const uint8_t *)t[i].key + strlen(t[i].key) < m + size,
			    "key %u outside", i);
		FUZZ_ASSERT(strlen(t[i].key) <= CHECK_KEY_MAX, "key %u long", i);
	}
	size_t a, b;
	FUZZ_ASSERT(check_keys(tp, n, &a, &b) != -EINVAL,
		    "tensors %zu and %zu share a key", a, b);
	FUZZ_ASSERT(manifest_size(tp, n, &size2) == 0, "size of accepted");
	uint8_t *m2 = aligned_alloc(64, (size2 + 63) / 64 * 64);
	FUZZ_ASSERT(m2, "out of memory");
	manifest_write(m2, size2, tp, n);
	FUZZ_ASSERT(manifest_check(m2, size2, n, sizes, 2, 1, &e) == 0,
		    "rewritten refused: %s", e.msg);
	for (uint32_t i = 0; i < n; i++) {
		Dlshare__Tensor t2;
		Dlshare__DataType dt2;

		manifest_tensor(m2, i, &t2, &dt2);
		FUZZ_ASSERT(same_tensor(&t[i], &t2), "tensor %u differs", i);
	}
	free(m2);
	free(t);
	free(tp);
	free(dt);
	free(m);
	return 0;
}
