/* gen_seeds — writes the seed corpus of the fuzz targets: one valid packet
 * of every message for fuzz_packet, and short sessions in fuzz_daemon's
 * input format (see fuzz_daemon.c) that walk every request type through
 * the daemon. The seeds are committed under tests/fuzz/corpus/; run this
 * again after a change to the protocol:
 *
 *   build/tests/fuzz/fuzz_gen_seeds tests/fuzz/corpus
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dlshare.pb-c.h"
#include "manifest.h"

static const char *outdir;

static void write_file(const char *sub, const char *name, const uint8_t *data,
		       size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", outdir, sub);
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", outdir, sub, name);
	f = fopen(path, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* ---- frames ------------------------------------------------------------ */

static size_t pack(Dlshare__Frame *f, uint8_t *out)
{
	size_t n = dlshare__frame__get_packed_size(f);

	if (n > 8192) {
		fprintf(stderr, "gen_seeds: frame of %zu bytes\n", n);
		exit(1);
	}
	return dlshare__frame__pack(f, out);
}

/* A version description: up to 16 tensors over up to 70 buffers. */
struct vdesc {
	Dlshare__Tensor t[16], *tp[16];
	Dlshare__DataType dt[16];
	int64_t shape[16][32], strides[16][32];
	Dlshare__Buffer b[70], *bp[70];
	Dlshare__Device dev[70];
	uint8_t uuid[16], handle[64];
	size_t nt, nb;
};

static void vd_buffer(struct vdesc *d, int kind, uint64_t size, int attach)
{
	size_t i = d->nb++;

	dlshare__buffer__init(&d->b[i]);
	dlshare__device__init(&d->dev[i]);
	d->b[i].kind = kind;
	d->b[i].size = size;
	d->b[i].device = &d->dev[i];
	d->dev[i].type = 1;
	if (attach) {
		d->b[i].has_fd_attached = 1;
		d->b[i].fd_attached = 1;
	}
	if (kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		memset(d->uuid, 0xa5, sizeof(d->uuid));
		memset(d->handle, 0x5a, sizeof(d->handle));
		d->dev[i].type = 2;
		d->dev[i].has_uuid = 1;
		d->dev[i].uuid.data = d->uuid;
		d->dev[i].uuid.len = sizeof(d->uuid);
		d->b[i].has_ipc_handle = 1;
		d->b[i].ipc_handle.data = d->handle;
		d->b[i].ipc_handle.len = sizeof(d->handle);
		d->b[i].has_ipc_offset = 1;
	}
	d->bp[i] = &d->b[i];
}

static void vd_tensor(struct vdesc *d, const char *key, uint32_t buffer,
		      uint64_t offset, uint32_t code, uint32_t bits,
		      size_t ndim, const int64_t *shape, const int64_t *strides)
{
	size_t i = d->nt++;

	dlshare__tensor__init(&d->t[i]);
	dlshare__data_type__init(&d->dt[i]);
	d->dt[i].code = code;
	d->dt[i].bits = bits;
	d->dt[i].lanes = 1;
	d->t[i].key = (char *)key;
	d->t[i].buffer = buffer;
	d->t[i].offset = offset;
	d->t[i].dtype = &d->dt[i];
	d->t[i].n_shape = ndim;
	d->t[i].shape = d->shape[i];
	memcpy(d->shape[i], shape, ndim * sizeof(int64_t));
	if (strides) {
		d->t[i].n_strides = ndim;
		d->t[i].strides = d->strides[i];
		memcpy(d->strides[i], strides, ndim * sizeof(int64_t));
	}
	d->tp[i] = &d->t[i];
}

/* One f32 [4,4] tensor in one 64-byte host buffer. */
static void vd_simple(struct vdesc *d, int attach)
{
	static const int64_t shape[] = { 4, 4 };

	memset(d, 0, sizeof(*d));
	vd_buffer(d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 64, attach);
	vd_tensor(d, "", 0, 0, 2, 32, 2, shape, NULL);
}

/* One f32 [4,4] tensor in daemon-owned GPU memory (the daemon's choice of
 * kind), on a device the fuzzer's daemon does not have. */
static void vd_gpu(struct vdesc *d)
{
	static const int64_t shape[] = { 4, 4 };

	memset(d, 0, sizeof(*d));
	vd_buffer(d, DLSHARE__BUFFER_KIND__BUFFER_KIND_UNSPECIFIED, 64, 0);
	memset(d->uuid, 0xc3, sizeof(d->uuid));
	d->dev[0].type = 2;
	d->dev[0].has_uuid = 1;
	d->dev[0].uuid.data = d->uuid;
	d->dev[0].uuid.len = sizeof(d->uuid);
	vd_tensor(d, "", 0, 0, 2, 32, 2, shape, NULL);
}

/* A bundle: three tensors over two buffers, one strided, one scalar. */
static void vd_bundle(struct vdesc *d, int attach)
{
	static const int64_t s1[] = { 8, 16 }, st1[] = { 1, 8 };
	static const int64_t s2[] = { 3 };

	memset(d, 0, sizeof(*d));
	vd_buffer(d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 4096, attach);
	vd_buffer(d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 1024, attach);
	vd_tensor(d, "w", 0, 0, 2, 32, 2, s1, st1);
	vd_tensor(d, "b", 1, 64, 0, 64, 1, s2, NULL);
	vd_tensor(d, "scale", 1, 0, 4, 16, 0, NULL, NULL);
}

static size_t f_hello(uint8_t *out, uint64_t id, uint32_t major)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello m = DLSHARE__HELLO__INIT;

	m.major = major;
	m.agent = "gen_seeds";
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &m;
	return pack(&f, out);
}

static size_t f_create(uint8_t *out, uint64_t id, const char *name,
		       struct vdesc *d, uint32_t mode)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Create m = DLSHARE__CREATE__INIT;

	m.name = (char *)name;
	m.n_tensors = d->nt;
	m.tensors = d->tp;
	m.n_buffers = d->nb;
	m.buffers = d->bp;
	if (mode) {
		m.has_mode = 1;
		m.mode = mode;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_CREATE;
	f.create = &m;
	return pack(&f, out);
}

static size_t f_publish(uint8_t *out, uint64_t id, const char *name,
			struct vdesc *d, uint32_t nfds)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish m = DLSHARE__PUBLISH__INIT;

	m.name = (char *)name;
	m.n_tensors = d->nt;
	m.tensors = d->tp;
	m.n_buffers = d->nb;
	m.buffers = d->bp;
	f.id = id;
	f.has_nfds = nfds > 0;
	f.nfds = nfds;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &m;
	return pack(&f, out);
}

/* event: 0 none, else an event handle of that many bytes (64 is right). */
static size_t f_seal(uint8_t *out, uint64_t id, const char *name,
		     uint64_t version, size_t event)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Seal m = DLSHARE__SEAL__INIT;
	static uint8_t ev[128];

	m.name = (char *)name;
	m.version = version;
	if (event) {
		memset(ev, 0x11, sizeof(ev));
		m.has_event_handle = 1;
		m.event_handle.data = ev;
		m.event_handle.len = event;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_SEAL;
	f.seal = &m;
	return pack(&f, out);
}

static size_t f_abort(uint8_t *out, uint64_t id, const char *name,
		      uint64_t version)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Abort m = DLSHARE__ABORT__INIT;

	m.name = (char *)name;
	m.version = version;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_ABORT;
	f.abort = &m;
	return pack(&f, out);
}

static size_t f_get(uint8_t *out, uint64_t id, const char *name,
		    Dlshare__Select sel, uint64_t version, uint32_t timeout)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get m = DLSHARE__GET__INIT;

	m.name = (char *)name;
	if (sel != DLSHARE__SELECT__SELECT_LATEST) {
		m.has_select = 1;
		m.select = sel;
		m.has_version = 1;
		m.version = version;
	}
	if (timeout) {
		m.has_timeout_ms = 1;
		m.timeout_ms = timeout;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &m;
	return pack(&f, out);
}

static size_t f_release(uint8_t *out, uint64_t id, const uint64_t *leases,
			size_t n)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Release m = DLSHARE__RELEASE__INIT;

	m.n_leases = n;
	m.leases = (uint64_t *)leases;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_RELEASE;
	f.release = &m;
	return pack(&f, out);
}

static size_t f_delete(uint8_t *out, uint64_t id, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Delete m = DLSHARE__DELETE__INIT;

	m.name = (char *)name;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_DELETE;
	f.delete_ = &m;
	return pack(&f, out);
}

static size_t f_list(uint8_t *out, uint64_t id, const char *prefix,
		     const char *after, uint32_t limit)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__List m = DLSHARE__LIST__INIT;

	m.prefix = (char *)prefix;
	m.after = (char *)after;
	if (limit) {
		m.has_limit = 1;
		m.limit = limit;
	}
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_LIST;
	f.list = &m;
	return pack(&f, out);
}

static size_t f_stat(uint8_t *out, uint64_t id, const char *name)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stat m = DLSHARE__STAT__INIT;

	m.name = (char *)name;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_STAT;
	f.stat = &m;
	return pack(&f, out);
}

static size_t f_stats(uint8_t *out, uint64_t id)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats m = DLSHARE__STATS__INIT;

	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &m;
	return pack(&f, out);
}

/* A Get carrying releases of leases (Frame.releases). */
static size_t f_get_releasing(uint8_t *out, uint64_t id, const char *name,
			      const uint64_t *leases, size_t n)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get m = DLSHARE__GET__INIT;

	m.name = (char *)name;
	f.id = id;
	f.n_releases = n;
	f.releases = (uint64_t *)leases;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &m;
	return pack(&f, out);
}

/* ---- fuzz_packet: one packet each ------------------------------------------ */

static void emit_packet(const char *name, size_t len, const uint8_t *buf)
{
	write_file("packet", name, buf, len);
}

static void packet_seeds(void)
{
	static const int64_t big[] = { 0, INT64_C(1) << 40, INT64_C(1) << 40 };
	static const int64_t neg[] = { 4, 4 }, negst[] = { -1, 4 };
	static const uint64_t leases[] = { 1, 2, 3 };
	uint8_t buf[8192];
	struct vdesc d;

	emit_packet("hello", f_hello(buf, 1, 1), buf);
	emit_packet("hello-major2", f_hello(buf, 1, 2), buf);
	vd_simple(&d, 0);
	emit_packet("create", f_create(buf, 2, "demo/w", &d, 0640), buf);
	vd_bundle(&d, 0);
	emit_packet("create-bundle", f_create(buf, 2, "model/layer.0", &d, 0),
		    buf);
	vd_simple(&d, 1);
	emit_packet("publish", f_publish(buf, 3, "demo/w", &d, 1), buf);
	vd_bundle(&d, 1);
	emit_packet("publish-bundle", f_publish(buf, 3, "b", &d, 2), buf);
	memset(&d, 0, sizeof(d));
	vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC, 1 << 20, 0);
	vd_tensor(&d, "", 0, 256, 2, 16, 2, neg, NULL);
	emit_packet("publish-cuda-ipc", f_publish(buf, 3, "gpu/kv", &d, 0),
		    buf);
	/* Edge cases of the tensor check: an empty tensor with huge other
	 * dimensions, and a negative stride. */
	memset(&d, 0, sizeof(d));
	vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 64, 0);
	vd_tensor(&d, "empty", 0, 0, 1, 8, 3, big, NULL);
	vd_tensor(&d, "neg", 0, 12, 2, 32, 2, neg, negst);
	emit_packet("create-edges", f_create(buf, 2, "edge", &d, 0), buf);
	emit_packet("seal", f_seal(buf, 4, "demo/w", 1, 0), buf);
	emit_packet("seal-event", f_seal(buf, 4, "demo/w", 1, 64), buf);
	emit_packet("abort", f_abort(buf, 5, "demo/w", 2), buf);
	emit_packet("get", f_get(buf, 6, "demo/w", 0, 0, 0), buf);
	emit_packet("get-exact", f_get(buf, 6, "demo/w",
				       DLSHARE__SELECT__SELECT_EXACT, 1, 0),
		    buf);
	emit_packet("get-newer-wait",
		    f_get(buf, 6, "demo/w", DLSHARE__SELECT__SELECT_NEWER_THAN,
			  1, 5000), buf);
	emit_packet("release", f_release(buf, 0, leases, 3), buf);
	emit_packet("delete", f_delete(buf, 7, "demo/w"), buf);
	emit_packet("list", f_list(buf, 8, "demo/", "demo/a", 10), buf);
	emit_packet("list-all", f_list(buf, 8, NULL, NULL, 0), buf);
	emit_packet("stat", f_stat(buf, 9, "demo/w"), buf);
	emit_packet("stats", f_stats(buf, 10), buf);

	/* What the daemon sends: the client checks these. */
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__HelloReply m = DLSHARE__HELLO_REPLY__INIT;

		m.major = 1;
		m.server = "dlshared 0.1.0";
		m.max_packet = 131072;
		m.max_fds = 16;
		m.max_inflight = 64;
		m.max_tensors = 4096;
		m.max_buffers = 16;
		f.id = 1;
		f.body_case = DLSHARE__FRAME__BODY_HELLO_REPLY;
		f.hello_reply = &m;
		emit_packet("r-hello", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__CreateReply m = DLSHARE__CREATE_REPLY__INIT;

		vd_bundle(&d, 1);
		d.b[0].id = 1;
		d.b[1].id = 2;
		m.version = 1;
		m.n_buffers = d.nb;
		m.buffers = d.bp;
		f.id = 2;
		f.has_nfds = 1;
		f.nfds = 2;
		f.body_case = DLSHARE__FRAME__BODY_CREATE_REPLY;
		f.create_reply = &m;
		emit_packet("r-create", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__GetReply m = DLSHARE__GET_REPLY__INIT;

		vd_bundle(&d, 1);
		d.b[0].id = 1;
		d.b[1].id = 2;
		m.version = 3;
		m.lease = 7;
		m.read_only = 1;
		m.n_tensors = d.nt;
		m.tensors = d.tp;
		m.n_buffers = d.nb;
		m.buffers = d.bp;
		f.id = 6;
		f.has_nfds = 1;
		f.nfds = 2;
		f.body_case = DLSHARE__FRAME__BODY_GET_REPLY;
		f.get_reply = &m;
		emit_packet("r-get", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__ListReply m = DLSHARE__LIST_REPLY__INIT;
		Dlshare__NameInfo ni[2], *np[2];

		for (int i = 0; i < 2; i++) {
			dlshare__name_info__init(&ni[i]);
			ni[i].name = i ? "demo/x" : "demo/w";
			ni[i].latest = 3;
			ni[i].versions = 2;
			ni[i].tensors = 1;
			ni[i].bytes = 64;
			ni[i].mode = 0644;
			ni[i].has_kind = 1;
			ni[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST;
			np[i] = &ni[i];
		}
		m.n_names = 2;
		m.names = np;
		m.has_more = 1;
		f.id = 8;
		f.body_case = DLSHARE__FRAME__BODY_LIST_REPLY;
		f.list_reply = &m;
		emit_packet("r-list", pack(&f, buf), buf);

		Dlshare__StatReply s = DLSHARE__STAT_REPLY__INIT;
		Dlshare__Frame g = DLSHARE__FRAME__INIT;

		vd_simple(&d, 0);
		s.info = &ni[0];
		s.n_tensors = d.nt;
		s.tensors = d.tp;
		g.id = 9;
		g.body_case = DLSHARE__FRAME__BODY_STAT_REPLY;
		g.stat_reply = &s;
		emit_packet("r-stat", pack(&g, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__StatsReply m = DLSHARE__STATS_REPLY__INIT;

		m.connections = 2;
		m.names = 3;
		m.uptime_ms = 12345;
		f.id = 10;
		f.body_case = DLSHARE__FRAME__BODY_STATS_REPLY;
		f.stats_reply = &m;
		emit_packet("r-stats", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Retired m = DLSHARE__RETIRED__INIT;

		m.name = "demo/w";
		m.version = 1;
		f.body_case = DLSHARE__FRAME__BODY_RETIRED;
		f.retired = &m;
		emit_packet("r-retired", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__BufferGone m = DLSHARE__BUFFER_GONE__INIT;
		uint64_t ids[] = { 1, 2 };

		m.n_ids = 2;
		m.ids = ids;
		f.body_case = DLSHARE__FRAME__BODY_BUFFER_GONE;
		f.buffer_gone = &m;
		emit_packet("r-buffer-gone", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Error m = DLSHARE__ERROR__INIT;

		m.code = -2;
		m.message = "get demo/w: No such file or directory";
		f.id = 6;
		f.body_case = DLSHARE__FRAME__BODY_ERROR;
		f.error = &m;
		emit_packet("r-error", pack(&f, buf), buf);
	}
	{
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Ok m = DLSHARE__OK__INIT;

		f.id = 7;
		f.body_case = DLSHARE__FRAME__BODY_OK;
		f.ok = &m;
		emit_packet("r-ok", pack(&f, buf), buf);
	}
}

/* ---- fuzz_daemon: sessions --------------------------------------------------- */

struct sess {
	uint8_t data[16384];
	size_t len;
};

enum {
	OP_HANGUP = 0, OP_SLEEP = 1, OP_PUMP = 2, OP_SHUT_WR = 3,
};
enum {
	FD_GOOD = 0, FD_SMALL = 1, FD_UNSEALED = 2, FD_OTHER = 3,
};

static void s_start(struct sess *s, unsigned flags)
{
	s->len = 0;
	s->data[s->len++] = (uint8_t)flags;
}

/* A packet from peer with nfds fds of kind; the loop runs after it. */
static void s_pkt(struct sess *s, unsigned peer, const uint8_t *pkt,
		  size_t len, unsigned nfds, unsigned kind)
{
	if (s->len + 3 + len > sizeof(s->data) || len > 0xffff) {
		fprintf(stderr, "gen_seeds: session too long\n");
		exit(1);
	}
	s->data[s->len++] = (uint8_t)(peer | nfds << 1 | kind << 4 | 0x40);
	s->data[s->len++] = (uint8_t)(len & 0xff);
	s->data[s->len++] = (uint8_t)(len >> 8);
	memcpy(s->data + s->len, pkt, len);
	s->len += len;
}

static void s_op(struct sess *s, unsigned peer, unsigned op)
{
	s->data[s->len++] = (uint8_t)(0x80 | op << 1 | peer);
}

static void s_emit(struct sess *s, const char *name)
{
	write_file("daemon", name, s->data, s->len);
}

static void daemon_seeds(void)
{
	static const uint64_t l1[] = { 1 }, l12[] = { 1, 2 }, bogus[] = { 99 };
	uint8_t b[8192];
	struct vdesc d;
	struct sess s;
	size_t n;

	s_start(&s, 0);
	s_pkt(&s, 0, b, f_stats(b, 2), 0, 0);
	s_pkt(&s, 1, b, f_list(b, 2, NULL, NULL, 0), 0, 0);
	s_emit(&s, "stats");

	/* Store mode end to end, one peer. */
	s_start(&s, 3 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "demo/w", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "demo/w", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_get(b, 4, "demo/w", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_get(b, 5, "demo/w", DLSHARE__SELECT__SELECT_EXACT,
			      1, 0), 0, 0);
	s_pkt(&s, 0, b, f_stat(b, 6, "demo/w"), 0, 0);
	s_pkt(&s, 0, b, f_list(b, 7, "demo", NULL, 0), 0, 0);
	s_pkt(&s, 0, b, f_release(b, 8, l12, 2), 0, 0);
	s_pkt(&s, 0, b, f_delete(b, 9, "demo/w"), 0, 0);
	s_pkt(&s, 0, b, f_stats(b, 10), 0, 0);
	s_emit(&s, "store");

	/* Gets that release the previous get's lease on the way. */
	s_start(&s, 3 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "ride/w", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "ride/w", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_get_releasing(b, 4, "ride/w", NULL, 0), 0, 0);
	s_pkt(&s, 0, b, f_get_releasing(b, 5, "ride/w", l1, 1), 0, 0);
	s_pkt(&s, 0, b, f_get_releasing(b, 6, "ride/w", l12, 2), 0, 0);
	s_pkt(&s, 0, b, f_stats(b, 7), 0, 0);
	s_emit(&s, "releases-ride");

	/* Store mode on a GPU: the create goes to the thread pool and comes
	 * back refused (no driver), while the peer's next requests are
	 * answered; then a host create on the same name. */
	s_start(&s, 3 << 2);
	vd_gpu(&d);
	s_pkt(&s, 0, b, f_create(b, 2, "gpu/w", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_stats(b, 3), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 4, "gpu/w", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 5, "gpu/w", &d, 0), 0, 0);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 6, "gpu/w", &d, 0), 0, 0);
	s_emit(&s, "store-gpu");

	/* Store mode, sealed version outlives its producer and is read by
	 * the other peer; a second version retires the first. */
	s_start(&s, 0);
	vd_bundle(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "model/l0", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "model/l0", 1, 64), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "model/l0", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 4, "model/l0", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 5, "model/l0", 2, 0), 0, 0);
	s_pkt(&s, 1, b, f_release(b, 0, l1, 1), 0, 0);
	s_op(&s, 0, OP_HANGUP);
	s_pkt(&s, 1, b, f_get(b, 3, "model/l0", 0, 0, 0), 0, 0);
	s_emit(&s, "store-bundle");

	s_start(&s, 0);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "a", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_abort(b, 3, "a", 1), 0, 0);
	s_pkt(&s, 0, b, f_abort(b, 4, "a", 1), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 5, "a", &d, 0), 0, 0);
	s_pkt(&s, 1, b, f_seal(b, 2, "a", 1, 0), 0, 0);
	s_emit(&s, "abort");

	/* Export mode: publish a memfd, another peer leases it, a newer
	 * publish supersedes it, the release retires it. */
	s_start(&s, 0);
	vd_simple(&d, 1);
	d.b[0].size = 4096;
	n = f_publish(b, 2, "e/x", &d, 1);
	s_pkt(&s, 0, b, n, 1, FD_GOOD);
	s_pkt(&s, 1, b, f_get(b, 2, "e/x", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_publish(b, 3, "e/x", &d, 1), 1, FD_GOOD);
	s_pkt(&s, 1, b, f_release(b, 0, l1, 1), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 3, "e/x", 0, 0, 0), 0, 0);
	s_emit(&s, "export");

	/* The exporter hangs up while a reader holds a lease. */
	s_start(&s, 0);
	vd_bundle(&d, 1);
	s_pkt(&s, 0, b, f_publish(b, 2, "e/y", &d, 2), 2, FD_GOOD);
	s_pkt(&s, 1, b, f_get(b, 2, "e/y", 0, 0, 0), 0, 0);
	s_op(&s, 0, OP_HANGUP);
	s_pkt(&s, 1, b, f_get(b, 3, "e/y", 0, 0, 0), 0, 0);
	s_pkt(&s, 1, b, f_stat(b, 4, "e/y"), 0, 0);
	s_pkt(&s, 1, b, f_release(b, 5, l1, 1), 0, 0);
	s_emit(&s, "export-hangup");

	/* fds that must be refused: too small, unsealed, not memfds, too
	 * many, and a count that lies. */
	s_start(&s, 0);
	vd_simple(&d, 1);
	d.b[0].size = 4096;
	n = f_publish(b, 2, "bad", &d, 1);
	s_pkt(&s, 0, b, n, 1, FD_SMALL);
	s_pkt(&s, 0, b, n, 1, FD_UNSEALED);
	s_pkt(&s, 0, b, n, 1, FD_OTHER);
	s_pkt(&s, 1, b, f_publish(b, 2, "bad", &d, 2), 2, FD_GOOD);
	s_pkt(&s, 0, b, n, 7, FD_OTHER);
	s_emit(&s, "bad-fds");

	s_start(&s, 0);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_stats(b, 2), 1, FD_GOOD);
	s_emit(&s, "fds-on-stats");

	/* Parked gets: one answered by a seal, one by a publish, one that
	 * times out, one cut off by its peer's hang-up. */
	s_start(&s, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "p", 0, 0, 60000), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 3, "p", DLSHARE__SELECT__SELECT_NEWER_THAN,
			      1, UINT32_MAX), 0, 0);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "p", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "p", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 4, "p", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 5, "p", 2, 0), 0, 0);
	s_emit(&s, "park");

	s_start(&s, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "t", 0, 0, 1), 0, 0);
	s_op(&s, 1, OP_SLEEP);
	s_pkt(&s, 1, b, f_get(b, 3, "t/u", 0, 0, 60000), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 4, "t/u", 0, 0, 60000), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 5, "t/u", 0, 0, 60000), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 6, "t/u", 0, 0, 60000), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 7, "t/u", 0, 0, 60000), 0, 0);
	s_op(&s, 1, OP_HANGUP);
	vd_simple(&d, 1);
	s_pkt(&s, 0, b, f_publish(b, 2, "t/u", &d, 1), 1, FD_GOOD);
	s_emit(&s, "park-timeout-hangup");

	/* Permissions: peer 1 is another uid in another group. */
	s_start(&s, 2 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "priv/x", &d, 0600), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "priv/x", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 4, "pub/y", &d, 0644), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 5, "pub/y", 1, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "priv/x", 0, 0, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 3, "priv/x", 0, 0, 1000), 0, 0);
	s_pkt(&s, 1, b, f_stat(b, 4, "priv/x"), 0, 0);
	s_pkt(&s, 1, b, f_delete(b, 5, "pub/y"), 0, 0);
	s_pkt(&s, 1, b, f_create(b, 6, "pub/y", &d, 0), 0, 0);
	s_pkt(&s, 1, b, f_list(b, 7, NULL, NULL, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 8, "pub/y", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_delete(b, 6, "pub/y"), 0, 0);
	s_emit(&s, "acl");

	/* Same group, other uid. */
	s_start(&s, 1 << 2);
	s_pkt(&s, 0, b, f_create(b, 2, "g", &d, 0660), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "g", 1, 0), 0, 0);
	s_pkt(&s, 1, b, f_create(b, 2, "g", &d, 0600), 0, 0);
	s_pkt(&s, 1, b, f_seal(b, 3, "g", 2, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 4, "g", 0, 0, 0), 0, 0);
	s_emit(&s, "acl-group");

	/* Paging through a listing. */
	s_start(&s, 3 << 2);
	vd_simple(&d, 0);
	for (int i = 0; i < 10; i++) {
		char name[16];

		snprintf(name, sizeof(name), "l/n%d", i);
		s_pkt(&s, 0, b, f_create(b, 2 + 2 * i, name, &d, 0), 0, 0);
		s_pkt(&s, 0, b, f_seal(b, 3 + 2 * i, name, 1, 0), 0, 0);
	}
	s_pkt(&s, 0, b, f_list(b, 30, "l/", NULL, 3), 0, 0);
	s_pkt(&s, 0, b, f_list(b, 31, "l/", "l/n2", 0), 0, 0);
	s_pkt(&s, 0, b, f_list(b, 32, "l/n", "l/n8", 0), 0, 0);
	s_emit(&s, "list-pages");

	/* CUDA IPC export: the daemon only passes the handle on. */
	s_start(&s, 0);
	memset(&d, 0, sizeof(d));
	{
		static const int64_t shape[] = { 16, 16 };

		vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC,
			  1 << 16, 0);
		vd_tensor(&d, "", 0, 0, 2, 16, 2, shape, NULL);
	}
	s_pkt(&s, 0, b, f_publish(b, 2, "gpu/w", &d, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "gpu/w", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 3, "gpu/w", &d, 0), 0, 0);
	s_emit(&s, "cuda-ipc");

	/* Limits: leases, parks, tensors, bytes. */
	s_start(&s, 3 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "lim", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "lim", 1, 0), 0, 0);
	for (int i = 0; i < 10; i++)
		s_pkt(&s, 0, b, f_get(b, 4 + i, "lim", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_release(b, 20, bogus, 1), 0, 0);
	for (int i = 0; i < 6; i++)
		s_pkt(&s, 0, b, f_get(b, 30 + i, "none", 0, 0, 60000), 0, 0);
	d.b[0].size = 1u << 20;
	for (int i = 0; i < 5; i++)
		s_pkt(&s, 0, b, f_create(b, 40 + i, "big", &d, 0), 0, 0);
	s_emit(&s, "limits");

	/* A peer that never reads: the daemon's output queue fills up to
	 * its limit (Stat replies of a version with many dimensions). */
	s_start(&s, 0x10);
	memset(&d, 0, sizeof(d));
	{
		static const int64_t one[32] = {
			1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
			1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
		};
		int64_t st[32];

		for (int i = 0; i < 32; i++)
			st[i] = INT64_C(1) << 40;
		vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 4096, 0);
		for (int i = 0; i < 4; i++)
			vd_tensor(&d, "t", 0, 0, 2, 32, 32, one, st);
	}
	s_pkt(&s, 0, b, f_create(b, 2, "deaf", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "deaf", 1, 0), 0, 0);
	for (int i = 0; i < 100; i++)
		s_pkt(&s, 1, b, f_stat(b, 2 + i, "deaf"), 0, 0);
	s_pkt(&s, 0, b, f_stats(b, 4), 0, 0);
	s_emit(&s, "deaf");

	/* Seal while the producer still maps its buffer writable (EBUSY),
	 * an event handle too long, then a clean abort. */
	s_start(&s, 0x20 | 3 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "busy", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "busy", 1, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 4, "busy", 1, 65), 0, 0);
	s_pkt(&s, 0, b, f_abort(b, 5, "busy", 1), 0, 0);
	s_emit(&s, "seal-busy");

	/* A Create whose reply would not fit in a packet, and a Publish
	 * with more buffers than any version may have. */
	s_start(&s, 3 << 2);
	memset(&d, 0, sizeof(d));
	{
		int64_t shape[32], st[32];

		for (int i = 0; i < 32; i++) {
			shape[i] = 1;
			st[i] = INT64_C(1) << 50;
		}
		vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 64, 0);
		for (int i = 0; i < 12; i++)
			vd_tensor(&d, "k", 0, 0, 2, 32, 32, shape, st);
	}
	s_pkt(&s, 0, b, f_create(b, 2, "huge", &d, 0), 0, 0);
	vd_simple(&d, 0);
	while (d.nb < 65)
		vd_buffer(&d, DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST, 64, 0);
	s_pkt(&s, 0, b, f_publish(b, 3, "wide", &d, 0), 0, 0);
	s_emit(&s, "too-big");

	/* A name deleted while a reader holds its version, then created
	 * again: numbers go on after the detached entry's. */
	s_start(&s, 0);
	vd_simple(&d, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "re", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "re", 1, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "re", 0, 0, 0), 0, 0);
	s_pkt(&s, 0, b, f_delete(b, 4, "re"), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 5, "re", &d, 0), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 6, "re", 2, 0), 0, 0);
	s_pkt(&s, 1, b, f_get(b, 3, "re", DLSHARE__SELECT__SELECT_EXACT, 1,
			      0), 0, 0);
	s_pkt(&s, 1, b, f_release(b, 4, l1, 1), 0, 0);
	s_emit(&s, "delete-while-leased");

	/* A parked get of a uid that may not read what gets published. */
	s_start(&s, 2 << 2);
	vd_simple(&d, 0);
	s_pkt(&s, 1, b, f_get(b, 2, "secret", 0, 0, 60000), 0, 0);
	s_pkt(&s, 0, b, f_create(b, 2, "secret", &d, 0600), 0, 0);
	s_pkt(&s, 0, b, f_seal(b, 3, "secret", 1, 0), 0, 0);
	s_emit(&s, "park-eperm");

	/* Per-uid quotas: names, leases over two connections of one uid,
	 * host bytes; then the daemon-wide byte limit with another uid. */
	s_start(&s, 0);
	vd_simple(&d, 0);
	for (int i = 0; i < 8; i++) {
		char name[16];

		snprintf(name, sizeof(name), "q/%d", i);
		s_pkt(&s, 0, b, f_create(b, 2 + i, name, &d, 0), 0, 0);
	}
	s_pkt(&s, 0, b, f_seal(b, 20, "q/0", 1, 0), 0, 0);
	for (int i = 0; i < 8; i++) {
		s_pkt(&s, 0, b, f_get(b, 30 + i, "q/0", 0, 0, 0), 0, 0);
		s_pkt(&s, 1, b, f_get(b, 30 + i, "q/0", 0, 0, 0), 0, 0);
	}
	s_emit(&s, "uid-quota");

	s_start(&s, 2 << 2);
	vd_simple(&d, 0);
	d.b[0].size = 1u << 20;
	for (int i = 0; i < 4; i++) {
		char name[16];

		snprintf(name, sizeof(name), "m/%d", i);
		s_pkt(&s, 0, b, f_create(b, 2 + i, name, &d, 0), 0, 0);
		snprintf(name, sizeof(name), "n/%d", i);
		s_pkt(&s, 1, b, f_create(b, 2 + i, name, &d, 0), 0, 0);
	}
	s_emit(&s, "bytes-quota");

	/* Silent peers: no Hello before the sweep. */
	s_start(&s, 3);
	s_op(&s, 0, OP_SLEEP);
	s_pkt(&s, 1, b, f_hello(b, 1, 1), 0, 0);
	s_emit(&s, "hello-timeout");

	/* Handshake failures. */
	s_start(&s, 3);
	s_pkt(&s, 0, b, f_stats(b, 1), 0, 0);
	s_pkt(&s, 1, b, f_hello(b, 1, 2), 0, 0);
	s_emit(&s, "no-hello");

	s_start(&s, 0);
	s_pkt(&s, 0, b, f_hello(b, 2, 1), 0, 0);
	s_pkt(&s, 1, b, f_stats(b, 0), 0, 0);
	s_emit(&s, "hello-twice");

	s_start(&s, 2);
	s_pkt(&s, 1, b, f_hello(b, 1, 1), 1, FD_GOOD);
	s_pkt(&s, 0, (const uint8_t *)"\x08\x01\x52\x02\x08", 5, 0, 0);
	s_emit(&s, "garbage");

	/* Oversized packets, before and after Hello, and a half-close. */
	s_start(&s, 2);
	memset(b, 0, 5000);
	s_pkt(&s, 0, b, 5000, 0, 0);
	s_pkt(&s, 1, b, 600, 0, 0);
	s_emit(&s, "oversized");

	s_start(&s, 0);
	s_pkt(&s, 0, b, f_get(b, 2, "h", 0, 0, 60000), 0, 0);
	s_op(&s, 0, OP_SHUT_WR);
	s_op(&s, 0, OP_PUMP);
	vd_simple(&d, 0);
	s_pkt(&s, 1, b, f_create(b, 2, "h", &d, 0), 0, 0);
	s_pkt(&s, 1, b, f_seal(b, 3, "h", 1, 0), 0, 0);
	s_emit(&s, "half-close");
}

/* ---- manifests (fuzz_manifest) ---------------------------------------- */

/* Writes the manifest of n tensors t, then lets edit change it. */
static void manifest_seed(const char *name, Dlshare__Tensor **t, size_t n,
			  void (*edit)(uint8_t *m, uint64_t size))
{
	uint64_t size;
	uint8_t *m;

	if (manifest_size(t, n, &size) || !(m = calloc(1, size))) {
		fprintf(stderr, "manifest seed %s\n", name);
		exit(1);
	}
	manifest_write(m, size, t, n);
	if (edit)
		edit(m, size);
	write_file("manifest", name, m, size);
	free(m);
}

static void m_past_buffer(uint8_t *m, uint64_t size)
{
	(void)size;
	((struct manifest_entry *)(m + 64))[0].offset = 4096;
}

static void m_dup_key(uint8_t *m, uint64_t size)
{
	struct manifest_entry *e = (struct manifest_entry *)(m + 64);

	(void)size;
	e[2].key_off = e[0].key_off;
	e[2].key_len = e[0].key_len;
}

static void m_truncated(uint8_t *m, uint64_t size)
{
	((struct manifest_header *)(void *)m)->size = size + 1;
}

static void manifest_seeds(void)
{
	struct vdesc d;

	vd_simple(&d, 0);
	manifest_seed("one", d.tp, d.nt, NULL);
	vd_bundle(&d, 0);
	manifest_seed("bundle", d.tp, d.nt, NULL);
	manifest_seed("past-buffer", d.tp, d.nt, m_past_buffer);
	manifest_seed("dup-key", d.tp, d.nt, m_dup_key);
	manifest_seed("truncated", d.tp, d.nt, m_truncated);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];
	packet_seeds();
	daemon_seeds();
	manifest_seeds();
	return 0;
}
