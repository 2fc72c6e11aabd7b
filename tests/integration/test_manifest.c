/* test_manifest — versions far larger than a packet (protocol 1.4): a
 * 10^5-tensor state dict with realistic keys round-trips bit-exact between
 * two processes, by create+seal, by publish (export, no copy) and by publish
 * with a copy; stat and list describe it; a key that is not there is
 * NotFound naming the key; and manifests that lie get a clear error while
 * the daemon serves everyone else. With the daemon under valgrind the state
 * dict is 5000 tensors (still far past a packet). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobs.h"
#include "manifest.h"

static size_t sd_n(void)
{
	return getenv("DLSHARE_TEST_WRAPPER") ? 5000 : 100000;
}

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* Key i: 50-70 bytes, as a mixture-of-experts model's are. */
static void sd_key(char *k, size_t len, size_t i)
{
	snprintf(k, len, "model.layers.%zu.mlp.experts.%zu.%s", i / 1024,
		 i % 1024, (i % 3) == 0 ? "down_proj.weight_scale_inv" :
		 (i % 3) == 1 ? "gate_proj.weight" : "up_proj.weight");
}

/* Tensor i's shape: 1 to 3 dims, 1 to 24 floats. */
static int sd_shape(size_t i, int64_t *shape)
{
	int ndim = (int)(i % 3) + 1;

	for (int k = 0; k < ndim; k++)
		shape[k] = (int64_t)((i >> (2 * k)) % 2 + 1 + (k == 0 ? i % 3 : 0));
	return ndim;
}

static float sd_value(size_t i, size_t j)
{
	return (float)((i * 2654435761u + j * 40503u) % 1000003u);
}

static size_t numel(int ndim, const int64_t *shape)
{
	size_t n = 1;

	for (int k = 0; k < ndim; k++)
		n *= (size_t)shape[k];
	return n;
}

/* Gets name and checks every tensor, found by its key. Returns 0 or 1. */
static int sd_check(dlshare_client *c, const char *name, size_t n)
{
	dlshare_bundle *b;
	char key[128];
	int err = dlshare_get(c, name, NULL, &b);

	if (err) {
		fprintf(stderr, "get %s: %s (%s)\n", name,
			dlshare_strerror(err), dlshare_last_error());
		return 1;
	}
	if (dlshare_bundle_count(b) != n) {
		fprintf(stderr, "%zu tensors, want %zu\n",
			dlshare_bundle_count(b), n);
		dlshare_bundle_free(b);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t shape[3];
		int ndim = sd_shape(i, shape);
		const DLTensor *t;
		int k;

		sd_key(key, sizeof(key), i);
		k = dlshare_bundle_find(b, key);
		if (k < 0 || strcmp(dlshare_bundle_key(b, (size_t)k), key)) {
			fprintf(stderr, "key %s: %d\n", key, k);
			dlshare_bundle_free(b);
			return 1;
		}
		t = dlshare_bundle_tensor(b, (size_t)k);
		if (t->ndim != ndim || t->dtype.code != kDLFloat ||
		    t->dtype.bits != 32 ||
		    memcmp(t->shape, shape, (size_t)ndim * 8)) {
			fprintf(stderr, "tensor %zu (%s): wrong shape\n", i, key);
			dlshare_bundle_free(b);
			return 1;
		}
		for (size_t j = 0; j < numel(ndim, shape); j++)
			if (((const float *)((const char *)t->data +
					     t->byte_offset))[j] !=
			    sd_value(i, j)) {
				fprintf(stderr, "tensor %zu (%s): element %zu "
					"differs\n", i, key, j);
				dlshare_bundle_free(b);
				return 1;
			}
	}
	/* A key that is not there: NotFound, naming it. */
	err = dlshare_bundle_find(b, "model.layers.0.no_such_tensor");
	if (err != DLSHARE_ENOENT ||
	    !strstr(dlshare_last_error(), "model.layers.0.no_such_tensor")) {
		fprintf(stderr, "missing key: %d (%s)\n", err,
			dlshare_last_error());
		dlshare_bundle_free(b);
		return 1;
	}
	dlshare_bundle_free(b);
	return 0;
}

/* A consumer process: checks the version named by arg. */
static int consume(const struct daemon_proc *d, void *arg)
{
	dlshare_client *c = util_child_connect(d);
	int r = sd_check(c, arg, sd_n());

	dlshare_disconnect(c);
	return r;
}

static void sd_specs(dlshare_tensor_spec *specs, char (*keys)[128],
		     int64_t (*shapes)[3], size_t n)
{
	for (size_t i = 0; i < n; i++) {
		sd_key(keys[i], 128, i);
		specs[i] = (dlshare_tensor_spec){
			.key = keys[i], .dtype = DT_F32,
			.ndim = sd_shape(i, shapes[i]), .shape = shapes[i] };
	}
}

/* A producer process: create, write, seal. */
static int produce_store(const struct daemon_proc *d, void *arg)
{
	size_t n = sd_n();
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_writer *w;
	uint64_t v;

	(void)arg;
	CHILD_CHECK(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	CHILD_OK(dlshare_create(c, "m/store", specs, n, NULL, &w));
	CHILD_CHECK(dlshare_writer_count(w) == n);
	for (size_t i = 0; i < n; i++) {
		DLTensor *t = dlshare_writer_tensor(w, i);

		for (size_t j = 0; j < numel(t->ndim, t->shape); j++)
			((float *)t->data)[j] = sd_value(i, j);
	}
	CHILD_OK(dlshare_seal(w, NULL, &v));
	CHILD_CHECK(v == 1);
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
	return 0;
}

struct listed {
	const char *name;
	uint64_t tensors, bytes;
};

static int on_listed(const dlshare_name_info *info, void *arg)
{
	struct listed *l = arg;

	if (strcmp(info->name, l->name) == 0) {
		l->tensors = info->tensors;
		l->bytes = info->bytes;
	}
	return 0;
}

/* A raw client that says protocol 1.3 gets name: refused, naming why. */
static void old_client_get(const struct daemon_proc *d, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	struct wire_msg *m;
	int sock = raw_connect(d->sock);

	assert_true(sock >= 0);
	h.major = 1;
	h.minor = 3;
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	wire_msg_free(m);
	g.name = (char *)name;
	f.id = 2;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_int_equal(m->frame->error->code, DLSHARE_ENOTSUP);
	assert_non_null(strstr(m->frame->error->message, "protocol 1.4"));
	wire_msg_free(m);
	close(sock);
}

static void state_dict_store(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_manifest *m;
	dlshare_name_info info;
	char key[128];
	size_t n = sd_n();

	assert_int_equal(util_wait(util_spawn(&fx->d, produce_store, NULL)), 0);
	assert_int_equal(util_wait(util_spawn(&fx->d, consume, "m/store")), 0);

	/* stat: the count, the bytes, and every key, without a lease. */
	assert_int_equal(dlshare_stat(c, "m/store", &info, &m), 0);
	assert_int_equal(info.tensors, n);
	assert_true(info.bytes >= n * 4);
	assert_int_equal(dlshare_manifest_count(m), n);
	for (size_t i = 0; i < n; i += 997) {
		int64_t shape[3];
		int ndim = sd_shape(i, shape);

		sd_key(key, sizeof(key), i);
		assert_string_equal(dlshare_manifest_key(m, i), key);
		assert_int_equal(dlshare_manifest_tensor(m, i)->ndim, ndim);
	}
	dlshare_manifest_free(m);

	/* list: its tensor count and bytes. */
	struct listed want = { "m/store", 0, 0 };
	assert_int_equal(dlshare_list(c, "m/", on_listed, &want), 0);
	assert_int_equal(want.tensors, n);
	assert_int_equal(want.bytes, info.bytes);

	/* dlsharectl stat: the count and every tensor, the last one too. */
	{
		char out[256], err[256], *text;
		const char *argv[] = { DLSHARECTL_PATH, "-s", fx->d.sock,
				       "stat", "m/store", NULL };
		size_t len;

		snprintf(out, sizeof(out), "%s/stat.out", fx->d.dir);
		snprintf(err, sizeof(err), "%s/stat.err", fx->d.dir);
		assert_int_equal(util_run(argv, NULL, out, err), 0);
		text = util_slurp(out, &len);
		assert_non_null(text);
		snprintf(key, sizeof(key), "tensors   %zu\n", n);
		assert_non_null(strstr(text, key));
		sd_key(key, sizeof(key), n - 1);
		assert_non_null(strstr(text, key));
		free(text);
		unlink(out);
		unlink(err);
	}

	/* A client before 1.4 cannot read the manifest: a get says so. */
	old_client_get(&fx->d, "m/store");
	dlshare_disconnect(c);
}

/* Export mode: every tensor a slice of one dlshare_host_alloc buffer, laid
 * out aligned; the version shares that one buffer. */
struct slab {
	DLManagedTensor *alloc;
	size_t refs;
};

static void slice_deleter(DLManagedTensor *t)
{
	struct slab *s = t->manager_ctx;

	if (--s->refs == 0) {
		s->alloc->deleter(s->alloc);
		free(s);
	}
	free(t->dl_tensor.shape);
	free(t);
}

/* n slices of one shareable allocation holding the state dict, or with
 * plain, they are malloc'd (a publish then copies them). */
static DLManagedTensor **sd_tensors(size_t n, int plain)
{
	DLManagedTensor **ts = calloc(n, sizeof(*ts));
	struct slab *s = calloc(1, sizeof(*s));
	uint64_t total = 0;
	char *base = NULL;

	assert_true(ts && s);
	for (size_t i = 0; i < n; i++) {
		int64_t shape[3];

		total = (total + 63) / 64 * 64 +
			numel(sd_shape(i, shape), shape) * 4;
	}
	if (!plain) {
		int64_t len = (int64_t)total;

		assert_int_equal(dlshare_host_alloc(DT_U8, 1, &len, &s->alloc), 0);
		base = s->alloc->dl_tensor.data;
	}
	total = 0;
	for (size_t i = 0; i < n; i++) {
		DLManagedTensor *t = calloc(1, sizeof(*t));
		int64_t *shape = calloc(3, sizeof(int64_t));
		int ndim = sd_shape(i, shape);
		size_t ne = numel(ndim, shape);
		float *data;

		assert_true(t && shape);
		total = (total + 63) / 64 * 64;
		data = plain ? malloc(ne * 4) : (float *)(base + total);
		assert_non_null(data);
		for (size_t j = 0; j < ne; j++)
			data[j] = sd_value(i, j);
		t->dl_tensor.data = data;
		t->dl_tensor.device.device_type = kDLCPU;
		t->dl_tensor.ndim = ndim;
		t->dl_tensor.dtype = DT_F32;
		t->dl_tensor.shape = shape;
		if (plain) {
			t->deleter = NULL; /* freed by the test */
		} else {
			t->manager_ctx = s;
			t->deleter = slice_deleter;
			s->refs++;
		}
		total += ne * 4;
		ts[i] = t;
	}
	if (plain)
		free(s);
	return ts;
}

static void state_dict_publish(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	size_t n = sd_n();
	char (*keys)[128] = calloc(n, sizeof(*keys));
	const char **kp = calloc(n, sizeof(*kp));
	DLManagedTensor **ts;
	dlshare_publish_opts po = { .flags = DLSHARE_PUBLISH_NO_COPY };
	dlshare_name_info info;
	uint64_t v;
	int err;

	assert_true(keys && kp);
	for (size_t i = 0; i < n; i++) {
		sd_key(keys[i], 128, i);
		kp[i] = keys[i];
	}
	po.keys = kp;
	/* Export: the consumer maps the producer's one buffer. */
	ts = sd_tensors(n, 0);
	err = dlshare_publish(c, "m/export", ts, n, &po, &v);
	if (err)
		fprintf(stderr, "publish: %s\n", dlshare_last_error());
	assert_int_equal(err, 0);
	free(ts);
	assert_int_equal(util_wait(util_spawn(&fx->d, consume, "m/export")), 0);
	assert_int_equal(dlshare_stat(c, "m/export", &info, NULL), 0);
	assert_int_equal(info.tensors, n);
	assert_true(info.exported);

	/* Copy: plain memory goes into one aligned daemon buffer. */
	ts = sd_tensors(n, 1);
	po.flags = 0;
	assert_int_equal(dlshare_publish(c, "m/copy", ts, n, &po, &v), 0);
	for (size_t i = 0; i < n; i++) {
		free(ts[i]->dl_tensor.data);
		free(ts[i]->dl_tensor.shape);
		free(ts[i]);
	}
	free(ts);
	assert_int_equal(util_wait(util_spawn(&fx->d, consume, "m/copy")), 0);
	assert_int_equal(dlshare_delete(c, "m/export"), 0);
	assert_int_equal(dlshare_delete(c, "m/copy"), 0);
	free(keys);
	free(kp);
	dlshare_disconnect(c);
}

/* ---- manifests that lie ------------------------------------------------ */

#define H_N 64

/* A valid manifest of H_N one-float tensors over a 4 * H_N byte buffer, in
 * a fresh memfd sealed against resizing; *size its size. */
static int hostile_memfd(uint64_t *size, Dlshare__Tensor ***out)
{
	static Dlshare__Tensor t[H_N], *tp[H_N];
	static Dlshare__DataType dt;
	static int64_t shape[1] = { 1 };
	static char keys[H_N][32];
	void *map;
	int fd;

	dlshare__data_type__init(&dt);
	dt.code = kDLFloat;
	dt.bits = 32;
	dt.lanes = 1;
	for (int i = 0; i < H_N; i++) {
		dlshare__tensor__init(&t[i]);
		snprintf(keys[i], sizeof(keys[i]), "k.%d", i);
		t[i].key = keys[i];
		t[i].dtype = &dt;
		t[i].offset = (uint64_t)i * 4;
		t[i].n_shape = 1;
		t[i].shape = shape;
		tp[i] = &t[i];
	}
	*out = tp;
	assert_int_equal(manifest_size(tp, H_N, size), 0);
	fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)*size), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	map = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(map != MAP_FAILED);
	manifest_write(map, *size, tp, H_N);
	munmap(map, *size);
	return fd;
}

/* Edits the manifest in fd (not yet sealed) through a mapping. */
static void *hostile_map(int fd, uint64_t size)
{
	void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	assert_true(map != MAP_FAILED);
	return map;
}

/* Sends a Create of "h/x" with one 4*H_N-byte host buffer and a manifest
 * of mb_size bytes claiming n tensors, fd attached (-1: none), and returns
 * the Error's message ("" for a CreateReply). */
static void hostile_create(int sock, int fd, uint64_t mb_size, uint32_t n,
			   char *msg, size_t len)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create cr = DLSHARE__CREATE__INIT;
	Dlshare__Buffer b = DLSHARE__BUFFER__INIT, *bp = &b;
	Dlshare__Buffer mb = DLSHARE__BUFFER__INIT;
	Dlshare__Device dev = DLSHARE__DEVICE__INIT;
	struct wire_msg *m;
	static uint64_t id = 100;

	dev.type = kDLCPU;
	b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	b.size = 4 * H_N;
	b.device = &dev;
	mb.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
	mb.size = mb_size;
	mb.device = &dev;
	mb.has_fd_attached = 1;
	mb.fd_attached = 1;
	cr.name = "h/x";
	cr.n_buffers = 1;
	cr.buffers = &bp;
	cr.manifest = &mb;
	cr.has_manifest_tensors = 1;
	cr.manifest_tensors = n;
	f.id = ++id;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &cr;
	assert_int_equal(raw_call(sock, &f, fd >= 0 ? &fd : NULL, fd >= 0, &m), 0);
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR)
		snprintf(msg, len, "%s", m->frame->error->message);
	else
		snprintf(msg, len, "%s", "");
	wire_msg_free(m);
}

/* One lie: edit applies it to a fresh valid manifest; the daemon must
 * answer with an error that contains want. */
static void lie(int sock, void (*edit)(void *map, uint64_t size),
		uint32_t n, int64_t size_delta, const char *want)
{
	Dlshare__Tensor **tp;
	uint64_t size;
	int fd = hostile_memfd(&size, &tp);
	char msg[1024];

	if (edit) {
		void *map = hostile_map(fd, size);

		edit(map, size);
		munmap(map, size);
	}
	hostile_create(sock, fd, (uint64_t)((int64_t)size + size_delta), n, msg,
		       sizeof(msg));
	close(fd);
	if (!strstr(msg, want)) {
		fprintf(stderr, "want \"%s\" in \"%s\"\n", want, msg);
		fail();
	}
}

static void past_buffer(void *map, uint64_t size)
{
	struct manifest_entry *e =
		(struct manifest_entry *)manifest_entries(map);

	(void)size;
	e[7].offset = 4 * H_N;  /* one float past the 4*H_N bytes */
}

static void dup_key(void *map, uint64_t size)
{
	struct manifest_entry *e =
		(struct manifest_entry *)manifest_entries(map);

	(void)size;
	e[9].key_off = e[3].key_off; /* "k.9" is as long as "k.3" */
}

static void key_unterminated(void *map, uint64_t size)
{
	struct manifest_entry *e =
		(struct manifest_entry *)manifest_entries(map);

	(void)size;
	e[5].key_len = 2;       /* "k." then no NUL */
}

static void long_key(void *map, uint64_t size)
{
	struct manifest_entry *e =
		(struct manifest_entry *)manifest_entries(map);

	(void)size;
	e[5].key_len = 10240;
}

static void dims_past(void *map, uint64_t size)
{
	struct manifest_entry *e =
		(struct manifest_entry *)manifest_entries(map);

	(void)size;
	e[H_N - 1].dims = 1u << 30;
}

static void header_size(void *map, uint64_t size)
{
	((struct manifest_header *)map)->size = size + 4096;
}

static void bad_magic(void *map, uint64_t size)
{
	(void)size;
	((char *)map)[0] = 'X';
}

static void manifests_that_lie(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	int sock = raw_connect(fx->d.sock);
	int64_t shape[1] = { 3 };
	Dlshare__Tensor **tp;
	uint64_t size;
	char msg[1024];
	int fd;

	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	/* A valid one is taken. */
	fd = hostile_memfd(&size, &tp);
	hostile_create(sock, fd, size, H_N, msg, sizeof(msg));
	close(fd);
	assert_string_equal(msg, "");

	lie(sock, past_buffer, H_N, 0, "tensor 7 (\"k.7\")");
	lie(sock, dup_key, H_N, 0, "tensors 3 and 9 have the same key \"k.3\"");
	lie(sock, key_unterminated, H_N, 0, "tensor 5");
	lie(sock, long_key, H_N, 0, "more than the limit of 255");
	lie(sock, dims_past, H_N, 0, "tensor 63");
	lie(sock, header_size, H_N, 0, "claims");
	lie(sock, bad_magic, H_N, 0, "does not start with");
	lie(sock, NULL, H_N - 1, 0, "holds 64 tensors, the request says 63");
	lie(sock, NULL, 10000000, 0, "more than the limit of 4000000 tensors per version");
	lie(sock, NULL, H_N, 4096, "refused");  /* memfd smaller than claimed */
	lie(sock, NULL, H_N, -8, "request says"); /* larger than claimed */
	/* No fd with it. */
	hostile_create(sock, -1, size, H_N, msg, sizeof(msg));
	assert_non_null(strstr(msg, "not attached"));
	/* A memfd still mapped writable by its sender cannot be sealed. */
	{
		void *map;

		fd = hostile_memfd(&size, &tp);
		map = hostile_map(fd, size);
		hostile_create(sock, fd, size, H_N, msg, sizeof(msg));
		assert_non_null(strstr(msg, "write-sealed"));
		munmap(map, size);
		close(fd);
	}
	/* A read-only fd can not be sealed: refused before any mapping. */
	{
		char path[64];
		int ro;

		fd = hostile_memfd(&size, &tp);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		ro = open(path, O_RDONLY | O_CLOEXEC);
		assert_true(ro >= 0);
		hostile_create(sock, ro, size, H_N, msg, sizeof(msg));
		assert_non_null(strstr(msg, "manifest memfd is refused"));
		close(ro);
		close(fd);
	}
	/* Sealed against new seals: it could never be write-sealed. */
	fd = hostile_memfd(&size, &tp);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL), 0);
	hostile_create(sock, fd, size, H_N, msg, sizeof(msg));
	assert_non_null(strstr(msg, "manifest memfd is refused"));
	close(fd);
	/* Not a memfd at all. */
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	assert_true(fd >= 0);
	hostile_create(sock, fd, size, H_N, msg, sizeof(msg));
	assert_non_null(strstr(msg, "manifest memfd is refused"));
	close(fd);
	/* Several at once wait their turn on the pool (--uid-seals): each is
	 * answered. */
	{
		int fds[4];
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Create cr = DLSHARE__CREATE__INIT;
		Dlshare__Buffer b = DLSHARE__BUFFER__INIT, *bp = &b;
		Dlshare__Buffer mb = DLSHARE__BUFFER__INIT;
		Dlshare__Device dev = DLSHARE__DEVICE__INIT;
		int answered = 0;

		dev.type = kDLCPU;
		b.kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
		b.size = 4 * H_N;
		b.device = &dev;
		mb = b;
		mb.has_fd_attached = 1;
		mb.fd_attached = 1;
		cr.name = "h/many";
		cr.n_buffers = 1;
		cr.buffers = &bp;
		cr.manifest = &mb;
		cr.has_manifest_tensors = 1;
		cr.manifest_tensors = H_N;
		f.body_case = DLSHARE__FRAME__BODY_CREATE;
		f.create = &cr;
		for (int i = 0; i < 4; i++) {
			fds[i] = hostile_memfd(&size, &tp);
			mb.size = size;
			f.id = 1000 + (uint64_t)i;
			assert_int_equal(raw_send(sock, &f, &fds[i], 1, 0), 0);
		}
		while (answered < 4) {
			struct wire_msg *m;

			assert_int_equal(raw_recv(sock, harness_ms(5000), &m), 0);
			if (m->frame->id >= 1000 && m->frame->id < 1004) {
				assert_int_equal(m->frame->body_case,
					DLSHARE__FRAME__BODY_CREATE_REPLY);
				answered++;
			}
			wire_msg_free(m);
		}
		for (int i = 0; i < 4; i++)
			close(fds[i]);
	}
	/* The daemon serves everyone still, the liar included. */
	assert_int_equal(util_store(c, "h/ok", DT_F32, 1, shape, 1, NULL), 0);
	fd = hostile_memfd(&size, &tp);
	hostile_create(sock, fd, size, H_N, msg, sizeof(msg));
	close(fd);
	assert_string_equal(msg, "");
	close(sock);
	dlshare_disconnect(c);
}

/* The per-uid limit on manifest bytes, and --max-tensors: one past each is
 * refused, naming the limit (and the uid). */
static void manifest_quota(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	size_t n = 3000; /* ~250 KiB of manifest, past a packet */
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_writer *w;
	char want[64];
	int err;

	assert_true(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	assert_int_equal(dlshare_create(c, "q/a", specs, n, NULL, &w), 0);
	err = dlshare_create(c, "q/b", specs, n, NULL, NULL);
	assert_int_equal(err, DLSHARE_EINVAL); /* no out */
	dlshare_writer *w2;
	err = dlshare_create(c, "q/b", specs, n, NULL, &w2);
	assert_int_equal(err, DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(), "--uid-manifest-bytes"));
	snprintf(want, sizeof(want), "uid %u", (unsigned)getuid());
	assert_non_null(strstr(dlshare_last_error(), want));
	dlshare_writer_abort(w);
	/* Its bytes came back. */
	assert_int_equal(dlshare_create(c, "q/b", specs, n, NULL, &w2), 0);
	dlshare_writer_abort(w2);
	free(specs);
	free(keys);
	free(shapes);

	/* --max-tensors 5000: one more is refused, naming the limit. */
	n = 5001;
	specs = calloc(n, sizeof(*specs));
	keys = calloc(n, sizeof(*keys));
	shapes = calloc(n, sizeof(*shapes));
	assert_true(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	assert_int_equal(dlshare_create(c, "q/c", specs, n, NULL, &w2),
			 DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(),
			       "more than the limit of 5000 tensors per "
			       "version (--max-tensors)"));

	/* Two tensors with one key in a manifest: the daemon's check names
	 * them (the library leaves a manifest's keys to it). */
	specs[2999].key = keys[7];
	assert_int_equal(dlshare_create(c, "q/d", specs, 3000, NULL, &w2),
			 DLSHARE_EINVAL);
	assert_non_null(strstr(dlshare_last_error(), "tensors 7 and 2999 have "
			       "the same key"));
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
}

/* A raw 1.5 get of name: with manifest_cache or not. Returns the reply's
 * manifest id and, in *nfds, how many fds came with it. */
static uint64_t raw_get_manifest(int sock, const char *name, int cache,
				 unsigned *nfds, uint64_t *lease)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;
	static uint64_t id = 500;
	struct wire_msg *m;
	uint64_t mid;
	int keep = -1;

	g.name = (char *)name;
	g.has_manifest_cache = cache;
	g.manifest_cache = cache;
	f.id = ++id;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	for (;;) {
		assert_int_equal(raw_recv_count(sock, harness_ms(5000), &m, nfds,
						&keep), 0);
		if (keep >= 0)
			close(keep);
		if (m->frame->id == f.id)
			break;
		wire_msg_free(m);
	}
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	assert_non_null(m->frame->get_reply->manifest);
	mid = m->frame->get_reply->manifest->id;
	/* An id only for a get that keeps manifests (1.5). */
	assert_true(cache ? mid != 0 : mid == 0);
	/* fd_attached says exactly whether the fd came (one buffer, whose
	 * fd came with the first get). */
	assert_int_equal(m->frame->get_reply->manifest->fd_attached,
			 *nfds > (unsigned)m->frame->get_reply->buffers[0]->fd_attached);
	*lease = m->frame->get_reply->lease;
	wire_msg_free(m);
	return mid;
}

/* Protocol 1.5: a manifest follows the buffers' rule. A Get that says
 * manifest_cache gets its fd the first time only, with an id; one that
 * does not gets it every time; when the version goes, BufferGone names the
 * id. libdlshare keeps the checked manifest by that id: a warm get points
 * its keys into the same mapping (no fd, no mapping, no check). */
static void manifest_kept(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	size_t n = 3000; /* past a packet */
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_bundle *b1, *b2, *b3;
	dlshare_writer *w;
	uint64_t v, mid, mid2, lease;
	unsigned nfds;
	int sock, gone = 0;

	assert_true(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	assert_int_equal(dlshare_create(c, "k/sd", specs, n, NULL, &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);

	/* The library: the second get shares the first one's view. */
	assert_int_equal(dlshare_get(c, "k/sd", NULL, &b1), 0);
	assert_int_equal(dlshare_get(c, "k/sd", NULL, &b2), 0);
	assert_ptr_equal(dlshare_bundle_key(b1, 0), dlshare_bundle_key(b2, 0));
	assert_ptr_equal(dlshare_bundle_tensor(b1, 7)->data,
			 dlshare_bundle_tensor(b2, 7)->data);
	dlshare_bundle_free(b1);
	/* Still there with b1 gone, and found by key. */
	assert_int_equal(dlshare_bundle_find(b2, keys[2999]), 2999);
	assert_int_equal(dlshare_get(c, "k/sd", NULL, &b3), 0);
	assert_ptr_equal(dlshare_bundle_key(b2, 0), dlshare_bundle_key(b3, 0));
	dlshare_bundle_free(b2);
	dlshare_bundle_free(b3);

	/* The wire. */
	sock = raw_connect(fx->d.sock);
	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	mid = raw_get_manifest(sock, "k/sd", 1, &nfds, &lease);
	assert_int_equal(nfds, 2);     /* the buffer's and the manifest's */
	mid2 = raw_get_manifest(sock, "k/sd", 1, &nfds, &lease);
	assert_int_equal(mid2, mid);
	assert_int_equal(nfds, 0);     /* both known */
	mid2 = raw_get_manifest(sock, "k/sd", 0, &nfds, &lease);
	assert_int_equal(mid2, 0);
	assert_int_equal(nfds, 1);     /* a 1.4 reader's way: every time */
	/* A new version: a new id, its fd once. */
	assert_int_equal(dlshare_create(c, "k/sd", specs, n, NULL, &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	mid2 = raw_get_manifest(sock, "k/sd", 1, &nfds, &lease);
	assert_true(mid2 != mid);
	assert_int_equal(nfds, 2);
	/* On a fresh connection: release the lease, delete the name, and
	 * the version goes; BufferGone names its manifest. */
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Release r = DLSHARE__RELEASE__INIT;
		struct wire_msg *m;

		close(sock);
		sock = raw_connect(fx->d.sock);
		assert_true(sock >= 0);
		assert_int_equal(raw_hello(sock), 0);
		mid = raw_get_manifest(sock, "k/sd", 1, &nfds, &lease);
		assert_int_equal(mid, mid2);
		assert_int_equal(nfds, 2);
		r.n_leases = 1;
		r.leases = &lease;
		f.body_case = DLSHARE__FRAME__BODY_RELEASE;
		f.release = &r;
		assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
		assert_int_equal(dlshare_delete(c, "k/sd"), 0);
		while (!gone) {
			assert_int_equal(raw_recv(sock, harness_ms(5000), &m), 0);
			if (m->frame->body_case ==
			    DLSHARE__FRAME__BODY_BUFFER_GONE)
				for (size_t i = 0;
				     i < m->frame->buffer_gone->n_ids; i++)
					gone |= m->frame->buffer_gone->ids[i] ==
						mid;
			wire_msg_free(m);
		}
	}
	close(sock);
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
}

/* A manifest kept alive only by a lease is the leaseholder's (DESIGN:
 * bytes kept alive only by a lease are charged to the leaseholder): the
 * uid's leased manifest bytes count against --uid-manifest-bytes apart
 * from what it produces, and a get past it is refused, naming the limit;
 * the release gives the bytes back. */
static void leased_manifest_charged_to_leaseholder(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	size_t n = 3000; /* ~250 KiB of manifest of 400K */
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_bundle *b1, *b2;
	dlshare_writer *w;
	uint64_t v;
	char want[64];

	assert_true(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	assert_int_equal(dlshare_create(c, "q/l1", specs, n, NULL, &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	assert_int_equal(dlshare_get(c, "q/l1", NULL, &b1), 0);
	/* Deleted: only the lease keeps it, and the producer pays no more
	 * (its next 250 KiB fit)... */
	assert_int_equal(dlshare_delete(c, "q/l1"), 0);
	assert_int_equal(dlshare_create(c, "q/l2", specs, n, NULL, &w), 0);
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	/* ...the leaseholder does: 2 x 250 KiB leased is past 400K. */
	assert_int_equal(dlshare_get(c, "q/l2", NULL, &b2), DLSHARE_ELIMIT);
	assert_non_null(strstr(dlshare_last_error(),
			       "leased manifest bytes per uid "
			       "(--uid-manifest-bytes)"));
	snprintf(want, sizeof(want), "uid %u", (unsigned)getuid());
	assert_non_null(strstr(dlshare_last_error(), want));
	dlshare_bundle_free(b1);
	/* The release came back (asynchronously: a get waits its turn
	 * behind it on the socket). */
	assert_int_equal(dlshare_get(c, "q/l2", NULL, &b2), 0);
	assert_int_equal(dlshare_bundle_count(b2), n);
	dlshare_bundle_free(b2);
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
}

/* Another uid's producer and reader: 3000 tensors (~250 KiB of manifest,
 * most of a --uid-manifest-bytes of 400K) created, sealed and read back. */
static int other_uid_round_trip(const struct daemon_proc *d, void *arg)
{
	size_t n = 3000;
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_bundle *b;
	dlshare_writer *w;
	uint64_t v;

	(void)arg;
	CHILD_CHECK(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	CHILD_OK(dlshare_create(c, "q/other", specs, n, NULL, &w));
	CHILD_OK(dlshare_seal(w, NULL, &v));
	CHILD_OK(dlshare_get(c, "q/other", NULL, &b));
	CHILD_CHECK(dlshare_bundle_count(b) == n);
	CHILD_CHECK(dlshare_bundle_find(b, keys[n - 1]) == (int)(n - 1));
	dlshare_bundle_free(b);
	CHILD_OK(dlshare_delete(c, "q/other"));
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
	return 0;
}

/* Manifests that lie cost their sender's uid only: a sender holding most
 * of its --uid-manifest-bytes sends lies of every kind (each refused,
 * clearly); its own next large create is refused naming its uid; another
 * uid's large version goes through meanwhile; and once the sender lets go,
 * its quota is whole again (nothing a lie cost stayed charged). */
static void lies_cost_the_liar_only(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	size_t n = 3000;
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[128] = calloc(n, sizeof(*keys));
	int64_t (*shapes)[3] = calloc(n, sizeof(*shapes));
	dlshare_writer *w, *w2;
	char want[64];
	int sock;

	assert_true(specs && keys && shapes);
	sd_specs(specs, keys, shapes, n);
	assert_int_equal(dlshare_create(c, "q/liar", specs, n, NULL, &w), 0);
	sock = raw_connect(fx->d.sock);
	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	lie(sock, past_buffer, H_N, 0, "tensor 7 (\"k.7\")");
	lie(sock, dup_key, H_N, 0, "have the same key");
	lie(sock, NULL, H_N - 1, 0, "the request says 63");
	lie(sock, NULL, 10000000, 0, "10000000 tensors, more than the limit");
	lie(sock, long_key, H_N, 0, "more than the limit of 255");
	/* Its uid's quota is what the pending create holds. */
	assert_int_equal(dlshare_create(c, "q/liar2", specs, n, NULL, &w2),
			 DLSHARE_ELIMIT);
	snprintf(want, sizeof(want), "uid %u", (unsigned)getuid());
	assert_non_null(strstr(dlshare_last_error(), want));
	if (util_can_switch_uids())
		assert_int_equal(util_wait(util_spawn_as(&fx->d, UTIL_UID_B,
							 UTIL_UID_B,
							 other_uid_round_trip,
							 NULL)), 0);
	else
		fprintf(stderr, "SKIP (part): needs root to switch uids; "
			"another uid's version\n");
	dlshare_writer_abort(w);
	close(sock);
	/* Whole again: the lies left nothing charged. */
	assert_int_equal(dlshare_create(c, "q/liar2", specs, n, NULL, &w2), 0);
	dlshare_writer_abort(w2);
	free(specs);
	free(keys);
	free(shapes);
	dlshare_disconnect(c);
}

static int setup_quota(void **state)
{
	static const char *const args[] = { "--uid-manifest-bytes", "400K",
					    "--max-tensors", "5000", NULL };

	return util_setup_fdcheck(state, args);
}

/* setup_quota for a daemon every uid can reach. */
static int setup_quota_open(void **state)
{
	static const char *const args[] = { "--uid-manifest-bytes", "400K",
					    "--max-tensors", "5000", NULL };

	return util_setup_open(state, args);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(state_dict_store, setup,
						teardown),
		cmocka_unit_test_setup_teardown(state_dict_publish, setup,
						teardown),
		cmocka_unit_test_setup_teardown(manifest_kept, setup,
						teardown),
		cmocka_unit_test_setup_teardown(manifests_that_lie, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			leased_manifest_charged_to_leaseholder, setup_quota,
			teardown),
		cmocka_unit_test_setup_teardown(lies_cost_the_liar_only,
						setup_quota_open, teardown),
		cmocka_unit_test_setup_teardown(manifest_quota, setup_quota,
						teardown),
	};

	return cmocka_run_group_tests_name("manifest", tests, NULL, NULL);
}
