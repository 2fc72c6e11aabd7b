/* test_manifest — the flat manifest (proto/manifest.c): what a producer
 * writes reads back the same, tensor by tensor, and every kind of lie is
 * refused with a sentence naming the tensor, its key and the limit. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "check.h"
#include "manifest.h"

static const uint64_t sizes[2] = { 4096, 1024 };

struct fx {
	Dlshare__Tensor t[4], *tp[4];
	Dlshare__DataType dt[4];
	int64_t s0[2], st0[2], s1[1];
	uint8_t *m;
	uint64_t size;
};

/* A strided tensor, a vector, a scalar and an unnamed one. */
static struct fx *fx_new(void)
{
	struct fx *f = calloc(1, sizeof(*f));
	static const char *const keys[4] = { "w", "model.b", "scale", "" };

	assert_non_null(f);
	f->s0[0] = 8; f->s0[1] = 16; f->st0[0] = 1; f->st0[1] = 8;
	f->s1[0] = 3;
	for (int i = 0; i < 4; i++) {
		dlshare__tensor__init(&f->t[i]);
		dlshare__data_type__init(&f->dt[i]);
		f->dt[i].code = 2;
		f->dt[i].bits = 32;
		f->dt[i].lanes = 1;
		f->t[i].dtype = &f->dt[i];
		f->t[i].key = (char *)keys[i];
		f->tp[i] = &f->t[i];
	}
	f->t[0].n_shape = 2; f->t[0].shape = f->s0;
	f->t[0].n_strides = 2; f->t[0].strides = f->st0;
	f->t[1].buffer = 1; f->t[1].offset = 64; f->t[1].n_shape = 1;
	f->t[1].shape = f->s1;
	f->t[3].buffer = 1;
	assert_int_equal(manifest_size(f->tp, 4, &f->size), 0);
	f->m = aligned_alloc(64, (f->size + 63) / 64 * 64);
	assert_non_null(f->m);
	manifest_write(f->m, f->size, f->tp, 4);
	return f;
}

static void fx_free(struct fx *f)
{
	free(f->m);
	free(f);
}

static struct manifest_entry *ent(struct fx *f, int i)
{
	return (struct manifest_entry *)(f->m + 64) + i;
}

static void refused(struct fx *f, uint32_t n, const char *want)
{
	struct manifest_error e;

	assert_int_equal(manifest_check(f->m, f->size, n, sizes, 2, 1, &e),
			 -EINVAL);
	if (!strstr(e.msg, want))
		fail_msg("want \"%s\" in \"%s\"", want, e.msg);
}

static void round_trip(void **state)
{
	struct fx *f = fx_new();
	struct manifest_error e;

	(void)state;
	assert_int_equal(manifest_check(f->m, f->size, 4, sizes, 2, 1, &e), 0);
	for (uint32_t i = 0; i < 4; i++) {
		Dlshare__Tensor t;
		Dlshare__DataType dt;

		manifest_tensor(f->m, i, &t, &dt);
		assert_string_equal(t.key, f->t[i].key);
		assert_int_equal(t.buffer, f->t[i].buffer);
		assert_int_equal(t.offset, f->t[i].offset);
		assert_int_equal(t.n_shape, f->t[i].n_shape);
		assert_int_equal(t.n_strides, f->t[i].n_strides);
		if (t.n_shape)
			assert_memory_equal(t.shape, f->t[i].shape, t.n_shape * 8);
		if (t.n_strides)
			assert_memory_equal(t.strides, f->t[i].strides,
					    t.n_strides * 8);
		assert_int_equal(dt.code, 2);
		assert_int_equal(dt.bits, 32);
	}
	/* A memfd longer than the manifest is fine (page rounding). */
	assert_int_equal(manifest_check(f->m, f->size - 1, 4, sizes, 2, 1, &e),
			 -EINVAL);
	fx_free(f);
}

static void lies(void **state)
{
	struct fx *f;

	(void)state;
	f = fx_new();
	refused(f, 3, "holds 4 tensors, the request says 3");
	refused(f, 0, "1 to 4000000 tensors");
	refused(f, 10000000, "1 to 4000000 tensors");
	fx_free(f);

	f = fx_new();
	ent(f, 1)->offset = 1024 - 8;         /* 3 floats from 1016 > 1024 */
	refused(f, 4, "tensor 1 (\"model.b\")");
	fx_free(f);

	f = fx_new();
	ent(f, 2)->key_off = ent(f, 0)->key_off;
	ent(f, 2)->key_len = ent(f, 0)->key_len;
	refused(f, 4, "tensors 0 and 2 have the same key \"w\"");
	fx_free(f);

	f = fx_new();
	ent(f, 1)->key_len = 10240;
	refused(f, 4, "more than the limit of 255");
	fx_free(f);

	f = fx_new();
	ent(f, 1)->key_len = 3;               /* "mod" then no NUL */
	refused(f, 4, "tensor 1: its key is not 3 bytes");
	fx_free(f);

	f = fx_new();
	ent(f, 0)->ndim = 40;
	refused(f, 4, "40 dimensions, more than the limit of 32");
	fx_free(f);

	f = fx_new();
	ent(f, 1)->dims = 1000;
	refused(f, 4, "tensor 1 (\"model.b\"): its shape lies past");
	fx_free(f);

	f = fx_new();
	ent(f, 1)->buffer = 2;
	refused(f, 4, "no such buffer");
	fx_free(f);

	f = fx_new();
	ent(f, 3)->pad[2] = 1;
	refused(f, 4, "tensor 3: reserved bytes");
	fx_free(f);

	f = fx_new();
	((struct manifest_header *)(void *)f->m)->dims_off = 64;
	refused(f, 4, "overlap its entries");
	fx_free(f);

	f = fx_new();
	((struct manifest_header *)(void *)f->m)->keys_len = 1u << 20;
	refused(f, 4, "keys lie outside");
	fx_free(f);
}

/* Unnamed tensors may repeat, as inline ones may. */
static void unnamed_repeat(void **state)
{
	struct fx *f = fx_new();
	struct manifest_error e;

	(void)state;
	f->t[2].key = "";
	manifest_write(f->m, f->size, f->tp, 4); /* one byte shorter keys */
	assert_int_equal(manifest_check(f->m, f->size, 4, sizes, 2, 1, &e), 0);
	fx_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(round_trip),
		cmocka_unit_test(lies),
		cmocka_unit_test(unnamed_repeat),
	};

	return cmocka_run_group_tests_name("manifest", tests, NULL, NULL);
}
