/* wire — packets with fds over SOCK_SEQPACKET, and the capped frame codec. */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* sendto, sendmsg and recvmsg go by syscall(2), not libc's wrappers:
 * those are cancellation points (~45 instructions each around the call,
 * a tenth of the system calls' user-space cost per get on each side).
 * No daemon thread is ever cancelled, and libdlshare's calls run with
 * cancellation off (client/internal.h, CALL_UNCANCELLED: a thread
 * cancelled inside one would leave its client's reader role or locks
 * held), so the points bought nothing there. */
int wire_send(int sock, const void *data, size_t len, const int *fds,
	      unsigned nfds, int flags)
{
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	union {
		char buf[CMSG_SPACE(sizeof(int) * WIRE_FDS_MAX)];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds > WIRE_FDS_MAX)
		return -EINVAL;
	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	/* Without fds, send(2): the kernel then copies no msghdr and no
	 * iovec array in from user space, which sendmsg(2) does for every
	 * packet (a Get, and a warm get's reply, carry none). */
	do {
		if (nfds == 0)
			n = syscall(SYS_sendto, sock, data, len,
				    MSG_NOSIGNAL | flags, NULL, 0);
		else
			n = syscall(SYS_sendmsg, sock, &msg,
				    MSG_NOSIGNAL | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	/* A SEQPACKET send is all or nothing. */
	return (size_t)n == len ? 0 : -EIO;
}

static void drop_close(void *ud, int fd)
{
	(void)ud;
	close(fd);
}

void wire_drop_fds(int *fds, unsigned n, wire_drop_fn *drop, void *ud)
{
	if (!drop)
		drop = drop_close;
	for (unsigned i = 0; i < n; i++) {
		if (fds[i] >= 0)
			drop(ud, fds[i]);
		fds[i] = -1;
	}
}

void wire_close_fds(int *fds, unsigned n)
{
	wire_drop_fds(fds, n, NULL, NULL);
}

/* Collects the fds of every SCM_RIGHTS message, up to max; any beyond max
 * go to drop. The control buffer is rounded up to 8 bytes, so with an odd
 * max the kernel may deliver one fd more than asked without MSG_CTRUNC.
 * Returns the count delivered, which may exceed max. */
static unsigned collect_fds(struct msghdr *msg, int *fds, unsigned max,
			    wire_drop_fn *drop, void *ud)
{
	unsigned n = 0, seen = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		size_t k;
		int *p;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		p = (int *)CMSG_DATA(c);
		for (size_t i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, p + i, sizeof(fd));
			seen++;
			if (n < max)
				fds[n++] = fd;
			else
				drop(ud, fd);
		}
	}
	return seen;
}

int wire_recv_ex(int sock, void *buf, size_t cap, int *fds, unsigned max_fds,
		 size_t *len, unsigned *nfds, int flags, wire_drop_fn *drop,
		 void *ud)
{
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	union {
		char buf[CMSG_SPACE(sizeof(int) * WIRE_FDS_KERNEL_MAX)];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	int all = drop != NULL;
	unsigned got, kept;
	ssize_t n;

	if (!drop)
		drop = drop_close;
	if (max_fds > WIRE_FDS_MAX)
		max_fds = WIRE_FDS_MAX;
	msg.msg_control = ctl.buf;
	/* Room for max_fds, rounded up to 8 bytes: with an odd max_fds the
	 * kernel may deliver one more without MSG_CTRUNC (collect_fds counts
	 * it, and the packet is refused below). With a drop of the caller's:
	 * room for all the kernel may pass. */
	msg.msg_controllen = all ? sizeof(ctl.buf) :
			     max_fds ? CMSG_SPACE(sizeof(int) * max_fds) : 0;
	if (!msg.msg_controllen)
		msg.msg_control = NULL;
	do {
		n = syscall(SYS_recvmsg, sock, &msg, MSG_CMSG_CLOEXEC | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	got = msg.msg_control ? collect_fds(&msg, fds, max_fds, drop, ud) : 0;
	kept = got < max_fds ? got : max_fds;
	if (msg.msg_flags & MSG_TRUNC) {
		wire_drop_fds(fds, kept, drop, ud);
		return -EMSGSIZE;
	}
	if (got > max_fds) {
		wire_drop_fds(fds, kept, drop, ud);
		return -EPROTO;
	}
	if (msg.msg_flags & MSG_CTRUNC) {
		/* With room left for more fds than came, the kernel could
		 * not make one (this process at RLIMIT_NOFILE, or the system
		 * out of files): the packet is whole, the fds from the first
		 * that failed are gone. Else the sender sent more than
		 * max_fds. */
		if (!msg.msg_control || got >= max_fds) {
			wire_drop_fds(fds, kept, drop, ud);
			return -EPROTO;
		}
		*len = (size_t)n;
		*nfds = got;
		return -EMFILE;
	}
	*len = (size_t)n;
	*nfds = got;
	return 0;
}

int wire_recv(int sock, void *buf, size_t cap, int *fds, unsigned max_fds,
	      size_t *len, unsigned *nfds, int flags)
{
	return wire_recv_ex(sock, buf, cap, fds, max_fds, len, nfds, flags,
			    NULL, NULL);
}

int wire_encode(const Dlshare__Frame *f, size_t max, uint8_t **out,
		size_t *len)
{
	size_t n = dlshare__frame__get_packed_size(f);
	uint8_t *buf;

	if (n > max)
		return -E2BIG;
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	*len = dlshare__frame__pack(f, buf);
	*out = buf;
	return 0;
}

/* The arena. Each block has its size in the 8 bytes in front of it, so a
 * free gives the budget back (the cap counts what is live, as protobuf-c
 * frees its scratch slabs while it decodes); the memory itself is only
 * given back whole. Blocks are 8-byte aligned: the widest member of a
 * decoded message is a pointer, a double or a 64-bit integer. Under ASan
 * everything of a chunk but the live blocks is poisoned, so the 8 bytes
 * between blocks are red zones and a freed block stays unreadable. */
#if defined(__SANITIZE_ADDRESS__)
#define WIRE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WIRE_ASAN 1
#endif
#endif
#ifdef WIRE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct wire_chunk {
	struct wire_chunk *next;
	size_t size;
	_Alignas(16) unsigned char data[];
};

/* The first chunk, inside struct wire_msg: room for a usual reply (a
 * GetReply of one tensor takes ~600 bytes) without a second malloc; larger
 * packets get chunks as they need them. */
#define ARENA_FIRST_MAX 4096u
#define ARENA_FIRST(len) \
	((len) * 4 < ARENA_FIRST_MAX - 512 ? 512 + (len) * 4 : ARENA_FIRST_MAX)
#define ARENA_CHUNK 4096u
#define ARENA_HDR 8u

/* Inlined into the hand decoder's readers (10 calls per GetReply); protobuf-c
 * calls it through the allocator. */
static inline __attribute__((always_inline)) void *
capped_alloc(void *opaque, size_t size)
{
	struct wire_msg *m = opaque;
	size_t need;
	unsigned char *p;

	if (size > m->cap - m->used)
		return NULL;
	need = ARENA_HDR + ((size + 7) & ~(size_t)7);
	if (need > (size_t)(m->end - m->cur)) {
		size_t n = need > ARENA_CHUNK ? need : ARENA_CHUNK;
		struct wire_chunk *c = malloc(sizeof(*c) + n);

		if (!c)
			return NULL;
		c->next = m->chunks;
		c->size = n;
		m->chunks = c;
		m->cur = c->data;
		m->end = c->data + n;
		POISON(c->data, n);
	}
	p = m->cur;
	m->cur += need;
	UNPOISON(p, ARENA_HDR + size);
	memcpy(p, &size, sizeof(size));
	POISON(p, ARENA_HDR);
	m->used += size;
	return p + ARENA_HDR;
}

static void capped_free(void *opaque, void *p)
{
	struct wire_msg *m = opaque;
	unsigned char *b = p;
	size_t size;

	if (!p)
		return;
	UNPOISON(b - ARENA_HDR, ARENA_HDR);
	memcpy(&size, b - ARENA_HDR, sizeof(size));
	POISON(b - ARENA_HDR, ARENA_HDR + size);
	m->used -= size;
}

/* Reads a varint at p[*i..len) and moves *i past it. Returns 0, or -1
 * when it does not end in time. */
static int scan_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
	*v = 0;
	for (unsigned shift = 0; *i < len && shift < 64; shift += 7) {
		uint8_t b = p[(*i)++];

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

/* Finds the first string field of the message d in p[0..len) whose bytes
 * hold a NUL, looking into its submessages (the schema has no recursion,
 * so the depth is the schema's). Sets *in to the message that has it.
 * Only run on bytes that decoded, so any oddity just ends the scan.
 * Returns the field, or NULL. */
static const ProtobufCFieldDescriptor *
string_with_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
		size_t len, const ProtobufCMessageDescriptor **in)
{
	size_t i = 0;

	while (i < len) {
		const ProtobufCFieldDescriptor *f, *sub;
		uint64_t key, n;

		if (scan_varint(p, len, &i, &key))
			return NULL;
		switch (key & 7) {
		case PROTOBUF_C_WIRE_TYPE_VARINT:
			if (scan_varint(p, len, &i, &n))
				return NULL;
			break;
		case PROTOBUF_C_WIRE_TYPE_64BIT:
			if (len - i < 8)
				return NULL;
			i += 8;
			break;
		case PROTOBUF_C_WIRE_TYPE_32BIT:
			if (len - i < 4)
				return NULL;
			i += 4;
			break;
		case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
			if (scan_varint(p, len, &i, &n) || n > len - i ||
			    (key >> 3) > UINT32_MAX)
				return NULL;
			f = protobuf_c_message_descriptor_get_field(
				d, (unsigned)(key >> 3));
			if (f && f->type == PROTOBUF_C_TYPE_STRING &&
			    memchr(p + i, 0, n)) {
				*in = d;
				return f;
			}
			if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
			    (sub = string_with_nul(f->descriptor, p + i, n, in)))
				return sub;
			i += n;
			break;
		default:
			return NULL;
		}
	}
	return NULL;
}

/* ---- the hot reply without protobuf-c ------------------------------------
 *
 * A GetReply of host buffers is every get's answer, and protobuf-c's
 * descriptor-driven unpack of it costs the client more than everything
 * else on its side of a get (callgrind: ~6,000 instructions of ~15,000).
 * fast_decode decodes that shape of frame, and the Get that asks for it,
 * straight into the generated structs, in the arena: Frame{id, nfds,
 * releases (packed), get_reply or get} with Get{name, select, version,
 * timeout_ms},
 * GetReply{version, lease, read_only, tensors, buffers}, Tensor{key,
 * buffer, offset, dtype, shape, strides (packed)}, Buffer{id, kind, size,
 * device{type}, fd_attached}. Anything else (another field, a field twice,
 * another wire type, a value out of its type's range, a NUL in a key, a
 * required field missing, a varint longer than protobuf-c takes) returns
 * 1 and the frame goes through protobuf-c, which decides as always:
 * whatever this path accepts, protobuf-c accepts and decodes the same
 * (tests/unit/test_wire.c compares the two). */

/* A key of field num (< 16) and wire type wt: one byte. */
#define KEY(num, wt) ((uint8_t)(((num) << 3) | (wt)))
#define VI PROTOBUF_C_WIRE_TYPE_VARINT
#define LD PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED

struct rd {
	const uint8_t *p, *end;
};

/* A varint of at most max bytes. Returns 0, or 1 (not for us). */
static int rd_varint(struct rd *r, unsigned max, uint64_t *v)
{
	uint64_t x = 0;

	/* Most keys and values of the hot frames fit one byte. */
	if (r->p < r->end && !(*r->p & 0x80) && max) {
		*v = *r->p++;
		return 0;
	}
	for (unsigned i = 0; i < max && r->p < r->end; i++) {
		uint8_t b = *r->p++;

		x |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return 1;
}

/* A field's key; *len for a length-delimited one, with its bytes in sub.
 * Returns 0, or 1 (not for us). Inlined into each reader (~1 KiB of
 * code): a call per field, 20 per GetReply, with its outputs through
 * memory, was a sixth of the library's instructions per get. */
static inline __attribute__((always_inline)) int
rd_field(struct rd *r, uint32_t *num, unsigned *wt, uint64_t *v,
	 struct rd *sub)
{
	uint64_t key;

	if (rd_varint(r, 5, &key) || key > UINT32_MAX || (key >> 3) == 0)
		return 1;
	*num = (uint32_t)(key >> 3);
	*wt = (unsigned)(key & 7);
	if (*wt == PROTOBUF_C_WIRE_TYPE_VARINT)
		return rd_varint(r, 10, v);
	if (*wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
	    rd_varint(r, 10, v) || *v > (uint64_t)(r->end - r->p))
		return 1;
	sub->p = r->p;
	sub->end = r->p + *v;
	r->p += *v;
	return 0;
}

#define FAST_ALLOC(m, type) ((type *)capped_alloc((m), sizeof(type)))

/* Packed int64s. */
static int fast_i64s(struct wire_msg *m, struct rd sub, size_t *n,
		     int64_t **out)
{
	struct rd c = sub;
	size_t k = 0;
	uint64_t v = 0;

	while (c.p < c.end) {
		if (rd_varint(&c, 10, &v))
			return 1;
		k++;
	}
	if (!k)
		return 1; /* protobuf-c's way with an empty one: its own */
	if (!(*out = capped_alloc(m, k * sizeof(int64_t))))
		return 1;
	/* One value (a Get's one riding release, a vector's shape): the
	 * count already read it. */
	if (k == 1)
		(*out)[0] = (int64_t)v;
	for (size_t i = 0; k > 1 && i < k; i++)
		rd_varint(&sub, 10, (uint64_t *)&(*out)[i]);
	*n = k;
	return 0;
}

static int fast_dtype(struct wire_msg *m, struct rd r, Dlshare__DataType **out)
{
	static const Dlshare__DataType init = DLSHARE__DATA_TYPE__INIT;
	Dlshare__DataType *d = FAST_ALLOC(m, Dlshare__DataType);
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;
	struct rd sub;

	if (!d)
		return 1;
	*d = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub) ||
		    wt != PROTOBUF_C_WIRE_TYPE_VARINT || num > 3 ||
		    (seen & (1u << num)) || v > UINT32_MAX)
			return 1;
		seen |= 1u << num;
		if (num == 1)
			d->code = (uint32_t)v;
		else if (num == 2)
			d->bits = (uint32_t)v;
		else
			d->lanes = (uint32_t)v;
	}
	if (seen != 0xe)
		return 1;
	*out = d;
	return 0;
}

static int fast_tensor(struct wire_msg *m, struct rd r, Dlshare__Tensor **out)
{
	static const Dlshare__Tensor init = DLSHARE__TENSOR__INIT;
	Dlshare__Tensor *t = FAST_ALLOC(m, Dlshare__Tensor);
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;
	struct rd sub;

	if (!t)
		return 1;
	*t = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub) || num > 6 ||
		    (seen & (1u << num)))
			return 1;
		seen |= 1u << num;
		switch (num) {
		case 1: /* key */
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    memchr(sub.p, 0, v) ||
			    !(t->key = capped_alloc(m, v + 1)))
				return 1;
			memcpy(t->key, sub.p, v);
			t->key[v] = '\0';
			break;
		case 2:
			if (wt != PROTOBUF_C_WIRE_TYPE_VARINT || v > UINT32_MAX)
				return 1;
			t->buffer = (uint32_t)v;
			break;
		case 3:
			if (wt != PROTOBUF_C_WIRE_TYPE_VARINT)
				return 1;
			t->offset = v;
			break;
		case 4:
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    fast_dtype(m, sub, &t->dtype))
				return 1;
			break;
		case 5:
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    fast_i64s(m, sub, &t->n_shape, &t->shape))
				return 1;
			break;
		case 6:
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    fast_i64s(m, sub, &t->n_strides, &t->strides))
				return 1;
			break;
		default:
			return 1;
		}
	}
	if ((seen & 0x1c) != 0x1c) /* buffer, offset, dtype */
		return 1;
	*out = t;
	return 0;
}

static int fast_buffer(struct wire_msg *m, struct rd r, Dlshare__Buffer **out)
{
	static const Dlshare__Buffer init = DLSHARE__BUFFER__INIT;
	static const Dlshare__Device dinit = DLSHARE__DEVICE__INIT;
	Dlshare__Buffer *b = FAST_ALLOC(m, Dlshare__Buffer);
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;
	struct rd sub;

	if (!b)
		return 1;
	*b = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub) || num > 5 ||
		    (seen & (1u << num)))
			return 1;
		seen |= 1u << num;
		if (num == 4) { /* device: type only */
			struct rd d = sub;
			uint64_t dv = 0;
			unsigned dwt = 0;
			uint32_t dnum = 0;
			struct rd dsub;

			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    !(b->device = FAST_ALLOC(m, Dlshare__Device)))
				return 1;
			*b->device = dinit;
			if (d.p == d.end ||
			    rd_field(&d, &dnum, &dwt, &dv, &dsub) || dnum != 1 ||
			    dwt != PROTOBUF_C_WIRE_TYPE_VARINT ||
			    dv > UINT32_MAX || d.p != d.end)
				return 1;
			b->device->type = (uint32_t)dv;
			continue;
		}
		if (wt != PROTOBUF_C_WIRE_TYPE_VARINT)
			return 1;
		switch (num) {
		case 1:
			b->id = v;
			break;
		case 2:
			if (v > INT32_MAX)
				return 1;
			b->kind = (Dlshare__BufferKind)v;
			break;
		case 3:
			b->size = v;
			break;
		case 5:
			if (v > 1)
				return 1;
			b->has_fd_attached = 1;
			b->fd_attached = (protobuf_c_boolean)v;
			break;
		default:
			return 1;
		}
	}
	if ((seen & 0x1e) != 0x1e) /* id, kind, size, device */
		return 1;
	*out = b;
	return 0;
}

/* Room for one more pointer after the n of the array a, which has room
 * for *cap, in the arena: the room doubles as the array fills (from 1:
 * a GetReply mostly has one tensor and one buffer), so the array is
 * filled as its message is read, in one walk. Returns the array (moved
 * when it grew), or NULL (the budget is spent). */
static void *fast_room(struct wire_msg *m, void *a, size_t n, size_t *cap)
{
	size_t room = *cap ? *cap * 2 : 1;
	void *b;

	if (n < *cap)
		return a;
	if (!(b = capped_alloc(m, room * sizeof(void *))))
		return NULL;
	if (n)
		memcpy(b, a, n * sizeof(void *));
	capped_free(m, a);
	*cap = room;
	return b;
}

static int fast_get_reply_body(struct wire_msg *m, struct rd r,
			       Dlshare__GetReply **out)
{
	static const Dlshare__GetReply init = DLSHARE__GET_REPLY__INIT;
	Dlshare__GetReply *g = FAST_ALLOC(m, Dlshare__GetReply);
	struct rd sub;
	size_t tcap = 0, bcap = 0;
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;

	if (!g)
		return 1;
	*g = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub))
			return 1;
		if (num == 4) {
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    !(g->tensors = fast_room(m, g->tensors,
						     g->n_tensors, &tcap)) ||
			    fast_tensor(m, sub, &g->tensors[g->n_tensors]))
				return 1;
			g->n_tensors++;
			continue;
		}
		if (num == 5) {
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    !(g->buffers = fast_room(m, g->buffers,
						     g->n_buffers, &bcap)) ||
			    fast_buffer(m, sub, &g->buffers[g->n_buffers]))
				return 1;
			g->n_buffers++;
			continue;
		}
		if ((num > 3 && num != 16 && num != 17) ||
		    (seen & (1u << num)) ||
		    wt != PROTOBUF_C_WIRE_TYPE_VARINT)
			return 1;
		seen |= 1u << num;
		if (num == 1) {
			g->version = v;
		} else if (num == 2) {
			g->lease = v;
		} else if (num == 16) {
			if (v > UINT32_MAX)
				return 1;
			g->has_board_slot = 1;
			g->board_slot = (uint32_t)v;
		} else if (num == 17) {
			g->has_board_token = 1;
			g->board_token = v;
		} else {
			if (v > 1)
				return 1;
			g->read_only = (protobuf_c_boolean)v;
		}
	}
	if ((seen & 0xe) != 0xe)
		return 1;
	*out = g;
	return 0;
}

/* The request side: Get{name, select, version, timeout_ms}. */
static int fast_get_body(struct wire_msg *m, struct rd r, Dlshare__Get **out)
{
	static const Dlshare__Get init = DLSHARE__GET__INIT;
	Dlshare__Get *g = FAST_ALLOC(m, Dlshare__Get);
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;
	struct rd sub = { NULL, NULL }; /* set for a length-delimited field */

	if (!g)
		return 1;
	*g = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub))
			return 1;
		if (num == 35) {
			/* 1.5 manifest_cache: a bool, once, 0 or 1 (else
			 * protobuf-c decides). */
			if (wt != PROTOBUF_C_WIRE_TYPE_VARINT || v > 1 ||
			    g->has_manifest_cache)
				return 1;
			g->has_manifest_cache = 1;
			g->manifest_cache = (protobuf_c_boolean)v;
			continue;
		}
		if (num > 4 || (seen & (1u << num)))
			return 1;
		seen |= 1u << num;
		if (num == 1) {
			if (wt != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED ||
			    memchr(sub.p, 0, v) ||
			    !(g->name = capped_alloc(m, v + 1)))
				return 1;
			memcpy(g->name, sub.p, v);
			g->name[v] = '\0';
			continue;
		}
		if (wt != PROTOBUF_C_WIRE_TYPE_VARINT)
			return 1;
		if (num == 2) {
			if (v > INT32_MAX)
				return 1;
			g->has_select = 1;
			g->select = (Dlshare__Select)v;
		} else if (num == 3) {
			g->has_version = 1;
			g->version = v;
		} else {
			if (v > UINT32_MAX)
				return 1;
			g->has_timeout_ms = 1;
			g->timeout_ms = (uint32_t)v;
		}
	}
	if (!(seen & 2))
		return 1;
	*out = g;
	return 0;
}

/* Packed uint64s (Frame.releases). */
static int fast_u64s(struct wire_msg *m, struct rd sub, size_t *n,
		     uint64_t **out)
{
	return fast_i64s(m, sub, n, (int64_t **)out);
}

/* Returns 0 with m->frame set, or 1: protobuf-c's turn. */
static int fast_decode(struct wire_msg *m, const uint8_t *data, size_t len)
{
	static const Dlshare__Frame init = DLSHARE__FRAME__INIT;
	struct rd r = { data, data + len }, sub;
	Dlshare__Frame *f = FAST_ALLOC(m, Dlshare__Frame);
	unsigned seen = 0, wt = 0;
	uint32_t num = 0;
	uint64_t v = 0;

	if (!f)
		return 1;
	*f = init;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &v, &sub))
			return 1;
		if (num == 1 && wt == PROTOBUF_C_WIRE_TYPE_VARINT &&
		    !(seen & 2)) {
			f->id = v;
			seen |= 2;
		} else if (num == 2 && wt == PROTOBUF_C_WIRE_TYPE_VARINT &&
			   !(seen & 4) && v <= UINT32_MAX) {
			f->has_nfds = 1;
			f->nfds = (uint32_t)v;
			seen |= 4;
		} else if (num == 3 &&
			   wt == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED &&
			   !(seen & 16)) {
			if (fast_u64s(m, sub, &f->n_releases, &f->releases))
				return 1;
			seen |= 16;
		} else if (num == 19 &&
			   wt == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED &&
			   !(seen & 8)) {
			if (fast_get_reply_body(m, sub, &f->get_reply))
				return 1;
			f->body_case = DLSHARE__FRAME__BODY_GET_REPLY;
			seen |= 8;
		} else if (num == 18 &&
			   wt == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED &&
			   !(seen & 8)) {
			if (fast_get_body(m, sub, &f->get))
				return 1;
			f->body_case = DLSHARE__FRAME__BODY_GET;
			seen |= 8;
		} else {
			return 1;
		}
	}
	if (!(seen & 2) || !(seen & 8))
		return 1;
	m->frame = f;
	return 0;
}

/* ---- the hot frames in the order their writers use -----------------------
 *
 * Every GetReply the daemon sends (wire_pack_fast, wire_pack_get_reply,
 * protobuf-c) and every Get the library sends (pack_get) has its fields in
 * number order, each key one byte (two for Frame's bodies and
 * Get.manifest_cache). line_decode reads that order straight through: a
 * key is one compare, with no seen masks and no switch on the field
 * number, and each array is allocated once, at its length (callgrind:
 * the readers above were ~1,300 instructions of the client's ~4,300 per
 * get). Anything else (another order, a key written longer, more than
 * LINE_ITEMS_MAX tensors or buffers) returns 1 and the readers above
 * decide: whatever line_decode accepts, fast_decode accepts and decodes
 * the same (tests/unit/test_wire.c compares the three ways). */

/* Most tensors, and buffers, a GetReply may have for line_decode. */
#define LINE_ITEMS_MAX 8

/* A line_decode's use of the reader's memo (struct wire_memo): it either
 * found the body's bytes there (hit), or says which bytes the body it
 * decoded has (field, tail, body) for the memo to keep. */
struct line {
	struct wire_memo *memo;     /* or NULL */
	int hit;
	uint32_t field;             /* of a body decoded here: 18 or 19 */
	struct rd tail;             /* its bytes the memo compares */
	const void *body;
};

/* A body of field (size bytes) from the arena: a copy of the memo's
 * when the memo holds one whose bytes are r's (ln->hit), else init, for
 * the caller to read r into. NULL when the arena is out of budget. */
static inline __attribute__((always_inline)) void *
ln_body(struct wire_msg *m, struct line *ln, uint32_t field, struct rd r,
	const void *init, size_t size)
{
	const struct wire_memo *mo = ln->memo;
	size_t n = (size_t)(r.end - r.p);
	void *b = capped_alloc(m, size);

	if (!b)
		return NULL;
	ln->field = field;
	ln->tail = r;
	if (mo && mo->msg && mo->field == field && mo->len == n &&
	    !memcmp(mo->bytes, r.p, n)) {
		ln->hit = 1;
		memcpy(b, mo->body, size);
	} else {
		memcpy(b, init, size);
		ln->body = b;
	}
	return b;
}

/* Whether the next byte is key k; if so, moves past it. */
static inline __attribute__((always_inline)) int ln_key(struct rd *r,
							uint8_t k)
{
	if (r->p == r->end || *r->p != k)
		return 0;
	r->p++;
	return 1;
}

/* A key of two bytes (fields 16 to 2047). */
static inline __attribute__((always_inline)) int ln_key2(struct rd *r,
							 uint8_t k0,
							 uint8_t k1)
{
	if (r->end - r->p < 2 || r->p[0] != k0 || r->p[1] != k1)
		return 0;
	r->p += 2;
	return 1;
}

/* A varint value. Returns 0, or 1 (not for us). */
static inline __attribute__((always_inline)) int ln_v(struct rd *r,
						      uint64_t *v)
{
	return rd_varint(r, 10, v);
}

/* An optional bool's value, after its key: *has and *val set. Returns 0,
 * or 1 (not 0 or 1: protobuf-c's to read). */
static inline __attribute__((always_inline)) int
ln_bool(struct rd *r, protobuf_c_boolean *has, protobuf_c_boolean *val)
{
	uint64_t v;

	if (ln_v(r, &v) || v > 1)
		return 1;
	*has = 1;
	*val = (protobuf_c_boolean)v;
	return 0;
}

/* A length-delimited field's bytes, after its key. Returns 0, or 1. */
static inline __attribute__((always_inline)) int ln_sub(struct rd *r,
							struct rd *sub)
{
	uint64_t n;

	if (rd_varint(r, 10, &n) || n > (uint64_t)(r->end - r->p))
		return 1;
	sub->p = r->p;
	sub->end = r->p + n;
	r->p += n;
	return 0;
}

/* A string without a NUL, copied with one. Returns 0, or 1. */
static int ln_string(struct wire_msg *m, struct rd *r, char **out)
{
	struct rd sub;
	size_t n;

	if (ln_sub(r, &sub))
		return 1;
	n = (size_t)(sub.end - sub.p);
	if (memchr(sub.p, 0, n) || !(*out = capped_alloc(m, n + 1)))
		return 1;
	memcpy(*out, sub.p, n);
	(*out)[n] = '\0';
	return 0;
}

/* Packed varints, at least one, after their key. Returns 0, or 1. */
static int ln_i64s(struct wire_msg *m, struct rd *r, size_t *n, int64_t **out)
{
	struct rd sub;

	return ln_sub(r, &sub) || fast_i64s(m, sub, n, out);
}

/* Tensor{key?, buffer, offset, dtype{code, bits, lanes}, shape?,
 * strides?}. */
static int ln_tensor(struct wire_msg *m, struct rd r, Dlshare__Tensor **out)
{
	static const Dlshare__Tensor init = DLSHARE__TENSOR__INIT;
	static const Dlshare__DataType dinit = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Tensor *t = capped_alloc(m, sizeof(*t));
	Dlshare__DataType *d = capped_alloc(m, sizeof(*d));
	uint64_t buffer, code, bits, lanes;
	struct rd sub;

	if (!t || !d)
		return 1;
	*t = init;
	*d = dinit;
	if (ln_key(&r, KEY(1, LD)) && ln_string(m, &r, &t->key))
		return 1;
	if (!ln_key(&r, KEY(2, VI)) || ln_v(&r, &buffer) ||
	    buffer > UINT32_MAX || !ln_key(&r, KEY(3, VI)) ||
	    ln_v(&r, &t->offset) || !ln_key(&r, KEY(4, LD)) ||
	    ln_sub(&r, &sub))
		return 1;
	if (!ln_key(&sub, KEY(1, VI)) || ln_v(&sub, &code) ||
	    code > UINT32_MAX || !ln_key(&sub, KEY(2, VI)) ||
	    ln_v(&sub, &bits) || bits > UINT32_MAX ||
	    !ln_key(&sub, KEY(3, VI)) || ln_v(&sub, &lanes) ||
	    lanes > UINT32_MAX || sub.p != sub.end)
		return 1;
	t->buffer = (uint32_t)buffer;
	d->code = (uint32_t)code;
	d->bits = (uint32_t)bits;
	d->lanes = (uint32_t)lanes;
	t->dtype = d;
	if (ln_key(&r, KEY(5, LD)) && ln_i64s(m, &r, &t->n_shape, &t->shape))
		return 1;
	if (ln_key(&r, KEY(6, LD)) &&
	    ln_i64s(m, &r, &t->n_strides, &t->strides))
		return 1;
	if (r.p != r.end)
		return 1;
	*out = t;
	return 0;
}

/* Buffer{id, kind, size, device{type}, fd_attached?}. */
static int ln_buffer(struct wire_msg *m, struct rd r, Dlshare__Buffer **out)
{
	static const Dlshare__Buffer init = DLSHARE__BUFFER__INIT;
	static const Dlshare__Device dinit = DLSHARE__DEVICE__INIT;
	Dlshare__Buffer *b = capped_alloc(m, sizeof(*b));
	Dlshare__Device *d = capped_alloc(m, sizeof(*d));
	uint64_t kind, type;
	struct rd sub;

	if (!b || !d)
		return 1;
	*b = init;
	*d = dinit;
	if (!ln_key(&r, KEY(1, VI)) || ln_v(&r, &b->id) ||
	    !ln_key(&r, KEY(2, VI)) || ln_v(&r, &kind) || kind > INT32_MAX ||
	    !ln_key(&r, KEY(3, VI)) || ln_v(&r, &b->size) ||
	    !ln_key(&r, KEY(4, LD)) || ln_sub(&r, &sub) ||
	    !ln_key(&sub, KEY(1, VI)) || ln_v(&sub, &type) ||
	    type > UINT32_MAX || sub.p != sub.end)
		return 1;
	b->kind = (Dlshare__BufferKind)kind;
	d->type = (uint32_t)type;
	b->device = d;
	if (ln_key(&r, KEY(5, VI)) &&
	    ln_bool(&r, &b->has_fd_attached, &b->fd_attached))
		return 1;
	if (r.p != r.end)
		return 1;
	*out = b;
	return 0;
}

/* A GetReply's bytes after its lease: read_only, tensors*, buffers*,
 * board_slot?, board_token?. */
static int ln_get_reply_tail(struct wire_msg *m, struct rd r,
			     Dlshare__GetReply *g)
{
	Dlshare__Tensor *ts[LINE_ITEMS_MAX];
	Dlshare__Buffer *bs[LINE_ITEMS_MAX];
	size_t nt = 0, nb = 0;
	uint64_t ro;
	struct rd sub;

	if (!ln_key(&r, KEY(3, VI)) || ln_v(&r, &ro) || ro > 1)
		return 1;
	g->read_only = (protobuf_c_boolean)ro;
	while (ln_key(&r, KEY(4, LD)))
		if (nt == LINE_ITEMS_MAX || ln_sub(&r, &sub) ||
		    ln_tensor(m, sub, &ts[nt++]))
			return 1;
	while (ln_key(&r, KEY(5, LD)))
		if (nb == LINE_ITEMS_MAX || ln_sub(&r, &sub) ||
		    ln_buffer(m, sub, &bs[nb++]))
			return 1;
	/* 1.7: the board's slot and token, two-byte keys. */
	if (ln_key2(&r, (uint8_t)((16 << 3) | VI | 0x80),
		    (uint8_t)((16 << 3) >> 7))) {
		if (ln_v(&r, &ro) || ro > UINT32_MAX)
			return 1;
		g->has_board_slot = 1;
		g->board_slot = (uint32_t)ro;
	}
	if (ln_key2(&r, (uint8_t)((17 << 3) | VI | 0x80),
		    (uint8_t)((17 << 3) >> 7))) {
		if (ln_v(&r, &g->board_token))
			return 1;
		g->has_board_token = 1;
	}
	if (r.p != r.end)
		return 1;
	if (nt) {
		if (!(g->tensors = capped_alloc(m, nt * sizeof(*ts))))
			return 1;
		memcpy(g->tensors, ts, nt * sizeof(*ts));
		g->n_tensors = nt;
	}
	if (nb) {
		if (!(g->buffers = capped_alloc(m, nb * sizeof(*bs))))
			return 1;
		memcpy(g->buffers, bs, nb * sizeof(*bs));
		g->n_buffers = nb;
	}
	return 0;
}

/* GetReply{version, lease, read_only, tensors*, buffers*, board_slot?,
 * board_token?}: what follows the lease may be the memo's. */
static int ln_get_reply(struct wire_msg *m, struct rd r, struct line *ln,
			Dlshare__GetReply **out)
{
	static const Dlshare__GetReply init = DLSHARE__GET_REPLY__INIT;
	Dlshare__GetReply *g;
	uint64_t version, lease;

	if (!ln_key(&r, KEY(1, VI)) || ln_v(&r, &version) ||
	    !ln_key(&r, KEY(2, VI)) || ln_v(&r, &lease) ||
	    !(g = ln_body(m, ln, 19, r, &init, sizeof(*g))) ||
	    (!ln->hit && ln_get_reply_tail(m, r, g)))
		return 1;
	g->version = version;
	g->lease = lease;
	*out = g;
	return 0;
}

/* Get{name, select?, version?, timeout_ms?, manifest_cache?}, or the
 * memo's. */
static int ln_get(struct wire_msg *m, struct rd r, struct line *ln,
		  Dlshare__Get **out)
{
	static const Dlshare__Get init = DLSHARE__GET__INIT;
	Dlshare__Get *g = ln_body(m, ln, 18, r, &init, sizeof(*g));
	uint64_t v;

	if (!g)
		return 1;
	if (ln->hit) {
		*out = g;
		return 0;
	}
	if (!ln_key(&r, KEY(1, LD)) || ln_string(m, &r, &g->name))
		return 1;
	if (ln_key(&r, KEY(2, VI))) {
		if (ln_v(&r, &v) || v > INT32_MAX)
			return 1;
		g->has_select = 1;
		g->select = (Dlshare__Select)v;
	}
	if (ln_key(&r, KEY(3, VI))) {
		if (ln_v(&r, &g->version))
			return 1;
		g->has_version = 1;
	}
	if (ln_key(&r, KEY(4, VI))) {
		if (ln_v(&r, &v) || v > UINT32_MAX)
			return 1;
		g->has_timeout_ms = 1;
		g->timeout_ms = (uint32_t)v;
	}
	/* Field 35 (1.5), a two-byte key. */
	if (ln_key2(&r, (uint8_t)((35 << 3) | VI | 0x80),
		    (uint8_t)((35 << 3) >> 7)) &&
	    ln_bool(&r, &g->has_manifest_cache, &g->manifest_cache))
		return 1;
	if (r.p != r.end)
		return 1;
	*out = g;
	return 0;
}

/* Frame{id, nfds?, releases?, get or get_reply}. Returns 0 with m->frame
 * set, or 1. */
static int line_decode(struct wire_msg *m, const uint8_t *data, size_t len,
		       struct line *ln)
{
	static const Dlshare__Frame init = DLSHARE__FRAME__INIT;
	struct rd r = { data, data + len }, sub;
	Dlshare__Frame *f = capped_alloc(m, sizeof(*f));
	uint64_t v;

	if (!f)
		return 1;
	*f = init;
	if (!ln_key(&r, KEY(1, VI)) || ln_v(&r, &f->id))
		goto no;
	if (ln_key(&r, KEY(2, VI))) {
		if (ln_v(&r, &v) || v > UINT32_MAX)
			goto no;
		f->has_nfds = 1;
		f->nfds = (uint32_t)v;
	}
	if (ln_key(&r, KEY(3, LD)) &&
	    ln_i64s(m, &r, &f->n_releases, (int64_t **)&f->releases))
		goto no;
	/* Fields 18 and 19: two-byte keys. */
	if (ln_key2(&r, (uint8_t)((19 << 3) | LD | 0x80),
		    (uint8_t)((19 << 3) >> 7))) {
		if (ln_sub(&r, &sub) || ln_get_reply(m, sub, ln, &f->get_reply))
			goto no;
		f->body_case = DLSHARE__FRAME__BODY_GET_REPLY;
	} else if (ln_key2(&r, (uint8_t)((18 << 3) | LD | 0x80),
			   (uint8_t)((18 << 3) >> 7))) {
		if (ln_sub(&r, &sub) || ln_get(m, sub, ln, &f->get))
			goto no;
		f->body_case = DLSHARE__FRAME__BODY_GET;
	} else {
		goto no;
	}
	if (r.p != r.end)
		goto no;
	m->frame = f;
	return 0;

no:
	return 1; /* what it took of the arena: see decode_into */
}

/* ---- and the reply's encoding -------------------------------------------
 *
 * The daemon's side of the same frame: protobuf-c's pack walks the
 * descriptors twice (get_packed_size, then pack), ~4,500 instructions of
 * the daemon's ~11,000 per get (and ~1,900 of the client's for its Get).
 * wire_pack_fast writes the frames
 * fast_decode reads, byte for byte what protobuf-c writes (fields in
 * number order; tests/unit/test_wire.c compares), and returns 0 for
 * anything else. */

static size_t vlen(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_v(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* A GetReply's board fields (1.7, keys of two bytes), when it has them. */
static size_t board_len(int has, uint32_t slot, uint64_t token)
{
	return has ? 2 + vlen(slot) + 2 + vlen(token) : 0;
}

static uint8_t *put_board(uint8_t *p, uint32_t slot, uint64_t token)
{
	*p++ = (uint8_t)((16 << 3) | VI | 0x80);
	*p++ = (uint8_t)((16 << 3) >> 7);
	p = put_v(p, slot);
	*p++ = (uint8_t)((17 << 3) | VI | 0x80);
	*p++ = (uint8_t)((17 << 3) >> 7);
	return put_v(p, token);
}

static size_t i64s_len(const int64_t *v, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += vlen((uint64_t)v[i]);
	return k;
}

/* Sizes of a tensor's and a buffer's bodies, or 0 when not ours. */
static size_t tensor_len(const Dlshare__Tensor *t, size_t *keylen)
{
	size_t n = 0, k;

	if (t->base.n_unknown_fields || !t->dtype ||
	    t->dtype->base.n_unknown_fields)
		return 0;
	if (t->key) {
		*keylen = strlen(t->key);
		n += 1 + vlen(*keylen) + *keylen;
	}
	n += 1 + vlen(t->buffer) + 1 + vlen(t->offset);
	n += 2 + 3 + vlen(t->dtype->code) + vlen(t->dtype->bits) +
	     vlen(t->dtype->lanes);
	if (t->n_shape) {
		k = i64s_len(t->shape, t->n_shape);
		n += 1 + vlen(k) + k;
	}
	if (t->n_strides) {
		k = i64s_len(t->strides, t->n_strides);
		n += 1 + vlen(k) + k;
	}
	return n;
}

static size_t buffer_len(const Dlshare__Buffer *b)
{
	if (b->base.n_unknown_fields || !b->device || b->has_ipc_handle ||
	    b->has_ipc_offset || b->device->has_uuid ||
	    b->device->base.n_unknown_fields || (int32_t)b->kind < 0)
		return 0;
	return 1 + vlen(b->id) + 1 + vlen((uint64_t)b->kind) + 1 +
	       vlen(b->size) + 2 + 1 + vlen(b->device->type) +
	       (b->has_fd_attached ? 2 : 0);
}

static uint8_t *put_i64s(uint8_t *p, unsigned num, const int64_t *v,
			 size_t n)
{
	if (!n)
		return p;
	*p++ = KEY(num, LD);
	p = put_v(p, i64s_len(v, n));
	for (size_t i = 0; i < n; i++)
		p = put_v(p, (uint64_t)v[i]);
	return p;
}

/* The client's Get, releases riding on it. */
static size_t pack_get(const Dlshare__Frame *f, uint8_t *buf, size_t cap)
{
	const Dlshare__Get *g = f->get;
	size_t body, total, nl, rl = 0;
	uint8_t *p = buf;

	/* Frame.unreceived (1.8, rare): protobuf-c's to write. */
	if (!g || !g->name || g->base.n_unknown_fields || f->n_unreceived ||
	    (g->has_select && (int32_t)g->select < 0))
		return 0;
	nl = strlen(g->name);
	body = 1 + vlen(nl) + nl +
	       (g->has_select ? 1 + vlen((uint64_t)g->select) : 0) +
	       (g->has_version ? 1 + vlen(g->version) : 0) +
	       (g->has_timeout_ms ? 1 + vlen(g->timeout_ms) : 0) +
	       (g->has_manifest_cache ? 3 : 0);
	for (size_t i = 0; i < f->n_releases; i++)
		rl += vlen(f->releases[i]);
	total = 1 + vlen(f->id) + (f->has_nfds ? 1 + vlen(f->nfds) : 0) +
		(f->n_releases ? 1 + vlen(rl) + rl : 0) + 2 + vlen(body) +
		body;
	if (total > cap)
		return 0;
	*p++ = KEY(1, VI);
	p = put_v(p, f->id);
	if (f->has_nfds) {
		*p++ = KEY(2, VI);
		p = put_v(p, f->nfds);
	}
	if (f->n_releases) {
		*p++ = KEY(3, LD);
		p = put_v(p, rl);
		for (size_t i = 0; i < f->n_releases; i++)
			p = put_v(p, f->releases[i]);
	}
	/* Field 18: a two-byte key. */
	*p++ = (uint8_t)((18 << 3) | LD | 0x80);
	*p++ = (uint8_t)((18 << 3) >> 7);
	p = put_v(p, body);
	*p++ = KEY(1, LD);
	p = put_v(p, nl);
	memcpy(p, g->name, nl);
	p += nl;
	if (g->has_select) {
		*p++ = KEY(2, VI);
		p = put_v(p, (uint64_t)g->select);
	}
	if (g->has_version) {
		*p++ = KEY(3, VI);
		p = put_v(p, g->version);
	}
	if (g->has_timeout_ms) {
		*p++ = KEY(4, VI);
		p = put_v(p, g->timeout_ms);
	}
	if (g->has_manifest_cache) {
		/* Field 35 (1.5), a two-byte key, and a bool. */
		*p++ = (uint8_t)((35 << 3) | VI | 0x80);
		*p++ = (uint8_t)((35 << 3) >> 7);
		*p++ = g->manifest_cache ? 1 : 0;
	}
	return (size_t)(p - buf);
}

size_t wire_pack_fast(const Dlshare__Frame *f, uint8_t *buf, size_t cap)
{
	const Dlshare__GetReply *g;
	size_t body = 0, total, keylen;
	uint8_t *p = buf;

	if (f->base.n_unknown_fields)
		return 0;
	if (f->body_case == DLSHARE__FRAME__BODY_GET)
		return pack_get(f, buf, cap);
	if (f->body_case != DLSHARE__FRAME__BODY_GET_REPLY || f->n_releases ||
	    f->n_unreceived)
		return 0;
	g = f->get_reply;
	if (g->base.n_unknown_fields || g->has_event_handle || g->manifest ||
	    g->has_manifest_tensors || g->n_device_events)
		return 0;
	if (g->has_board_slot != g->has_board_token)
		return 0;
	body = 1 + vlen(g->version) + 1 + vlen(g->lease) + 2 +
	       board_len(g->has_board_token, g->board_slot, g->board_token);
	for (size_t i = 0; i < g->n_tensors; i++) {
		size_t n = tensor_len(g->tensors[i], &keylen);

		if (!n)
			return 0;
		body += 1 + vlen(n) + n;
	}
	for (size_t i = 0; i < g->n_buffers; i++) {
		size_t n = buffer_len(g->buffers[i]);

		if (!n)
			return 0;
		body += 1 + vlen(n) + n;
	}
	total = 1 + vlen(f->id) + (f->has_nfds ? 1 + vlen(f->nfds) : 0) +
		2 + vlen(body) + body;
	if (total > cap)
		return 0;
	*p++ = KEY(1, VI);
	p = put_v(p, f->id);
	if (f->has_nfds) {
		*p++ = KEY(2, VI);
		p = put_v(p, f->nfds);
	}
	/* Field 19: a two-byte key. */
	*p++ = (uint8_t)((19 << 3) | LD | 0x80);
	*p++ = (uint8_t)((19 << 3) >> 7);
	p = put_v(p, body);
	*p++ = KEY(1, VI);
	p = put_v(p, g->version);
	*p++ = KEY(2, VI);
	p = put_v(p, g->lease);
	*p++ = KEY(3, VI);
	*p++ = g->read_only ? 1 : 0;
	for (size_t i = 0; i < g->n_tensors; i++) {
		const Dlshare__Tensor *t = g->tensors[i];
		size_t n = tensor_len(t, &keylen);

		*p++ = KEY(4, LD);
		p = put_v(p, n);
		if (t->key) {
			*p++ = KEY(1, LD);
			p = put_v(p, keylen);
			memcpy(p, t->key, keylen);
			p += keylen;
		}
		*p++ = KEY(2, VI);
		p = put_v(p, t->buffer);
		*p++ = KEY(3, VI);
		p = put_v(p, t->offset);
		*p++ = KEY(4, LD);
		*p++ = (uint8_t)(3 + vlen(t->dtype->code) +
				 vlen(t->dtype->bits) + vlen(t->dtype->lanes));
		*p++ = KEY(1, VI);
		p = put_v(p, t->dtype->code);
		*p++ = KEY(2, VI);
		p = put_v(p, t->dtype->bits);
		*p++ = KEY(3, VI);
		p = put_v(p, t->dtype->lanes);
		p = put_i64s(p, 5, t->shape, t->n_shape);
		p = put_i64s(p, 6, t->strides, t->n_strides);
	}
	for (size_t i = 0; i < g->n_buffers; i++) {
		const Dlshare__Buffer *b = g->buffers[i];

		*p++ = KEY(5, LD);
		p = put_v(p, buffer_len(b));
		*p++ = KEY(1, VI);
		p = put_v(p, b->id);
		*p++ = KEY(2, VI);
		p = put_v(p, (uint64_t)b->kind);
		*p++ = KEY(3, VI);
		p = put_v(p, b->size);
		*p++ = KEY(4, LD);
		*p++ = (uint8_t)(1 + vlen(b->device->type));
		*p++ = KEY(1, VI);
		p = put_v(p, b->device->type);
		if (b->has_fd_attached) {
			*p++ = KEY(5, VI);
			*p++ = b->fd_attached ? 1 : 0;
		}
	}
	if (g->has_board_token)
		p = put_board(p, g->board_slot, g->board_token);
	return (size_t)(p - buf);
}

int wire_get_reply_tail(const Dlshare__GetReply *g, size_t max,
			uint8_t **out, size_t *len)
{
	Dlshare__GetReply c = *g;
	size_t n, head;
	uint8_t *b;

	/* The board's fields follow the tail (wire_pack_get_reply). */
	c.has_board_slot = 0;
	c.has_board_token = 0;

	/* Packed with lease 0, it starts with version's and lease's keys
	 * and varints (fields in number order); what follows is the tail. */
	c.lease = 0;
	n = dlshare__get_reply__get_packed_size(&c);
	head = 1 + vlen(c.version) + 2;
	if (n > head && n - head > max)
		return -E2BIG; /* not packed only to be thrown away */
	b = malloc(n);
	if (!b)
		return -ENOMEM;
	dlshare__get_reply__pack(&c, b);
	if (n < head || b[0] != KEY(1, VI) || b[head - 2] != KEY(2, VI) ||
	    b[head - 1] != 0) {
		free(b);
		return -EPROTO;
	}
	memmove(b, b + head, n - head);
	*out = b;
	*len = n - head;
	return 0;
}

size_t wire_pack_get_reply(uint64_t id, uint64_t version, uint64_t lease,
			   const uint8_t *tail, size_t tail_len,
			   uint32_t slot, uint64_t token, uint8_t *buf,
			   size_t cap)
{
	size_t body = 1 + vlen(version) + 1 + vlen(lease) + tail_len +
		      board_len(token != 0, slot, token);
	size_t total = 1 + vlen(id) + 2 + vlen(body) + body;
	uint8_t *p = buf;

	if (total > cap)
		return 0;
	*p++ = KEY(1, VI);
	p = put_v(p, id);
	*p++ = (uint8_t)((19 << 3) | LD | 0x80);
	*p++ = (uint8_t)((19 << 3) >> 7);
	p = put_v(p, body);
	*p++ = KEY(1, VI);
	p = put_v(p, version);
	*p++ = KEY(2, VI);
	p = put_v(p, lease);
	memcpy(p, tail, tail_len);
	if (token)
		put_board(p + tail_len, slot, token);
	return total;
}

/* Frees m's chunks beyond its first. */
static void chunks_free(struct wire_msg *m)
{
	while (m->chunks) {
		struct wire_chunk *c = m->chunks;

		m->chunks = c->next;
		UNPOISON(c->data, c->size);
		free(c);
	}
}

/* Back to an empty arena (after the fast path gave up). */
static void arena_reset(struct wire_msg *m)
{
	chunks_free(m);
	m->used = 0;
	m->cur = m->first;
	m->end = m->first + m->first_size;
	POISON(m->first, m->first_size);
}

int wire_decode(const uint8_t *data, size_t len, struct wire_msg **out)
{
	return wire_decode_ex(data, len, 0, out);
}

/* The first chunk of a block that wire_decode_in makes: ARENA_FIRST's
 * largest, so that it fits every packet. */
#define ARENA_KEEP ARENA_FIRST_MAX

/* The memo keeps m's body, which ln describes (m is new: its reader holds
 * the only other reference). */
static void memo_keep(struct wire_memo *mo, struct wire_msg *m,
		      const struct line *ln)
{
	size_t n = (size_t)(ln->tail.end - ln->tail.p);

	if (n > WIRE_MEMO_MAX)
		return;
	wire_memo_clear(mo);
	atomic_store_explicit(&m->refs, 2, memory_order_relaxed);
	mo->msg = m;
	mo->body = ln->body;
	mo->field = ln->field;
	mo->len = (uint32_t)n;
	memcpy(mo->bytes, ln->tail.p, n);
}

void wire_memo_clear(struct wire_memo *mo)
{
	wire_msg_free(mo->msg);
	mo->msg = NULL;
	mo->body = NULL;
	mo->len = 0;
	mo->noted = 0;
}

/* Decodes into m, whose first chunk (first bytes) is free. */
static int decode_into(struct wire_msg *m, size_t first, const uint8_t *data,
		       size_t len, unsigned flags, struct wire_memo *memo,
		       struct wire_msg **out)
{
	struct line ln = { .memo = memo };

	memset(m, 0, sizeof(*m));
	atomic_init(&m->refs, 1);
	m->cap = len * WIRE_DECODE_FACTOR + WIRE_DECODE_SLACK;
	m->alloc.alloc = capped_alloc;
	m->alloc.free = capped_free;
	m->alloc.allocator_data = m;
	m->first_size = first;
	m->cur = m->first;
	m->end = m->first + first;
	POISON(m->first, first);
	if (!(flags & (WIRE_DECODE_NO_FAST | WIRE_DECODE_NO_LINE)) &&
	    line_decode(m, data, len, &ln) == 0) {
		m->fast = 2;
		if (ln.hit) {
			/* Its frame points into the memo's message. */
			atomic_fetch_add_explicit(&memo->msg->refs, 1,
						  memory_order_relaxed);
			m->shared = memo->msg;
		} else if (memo && ln.body) {
			memo_keep(memo, m, &ln);
		}
		*out = m; /* no string in it holds a NUL */
		return 0;
	}
	if (m->used)
		arena_reset(m);
	if (!(flags & WIRE_DECODE_NO_FAST) && fast_decode(m, data, len) == 0) {
		m->fast = 1;
		*out = m;
		return 0;
	}
	if (m->used)
		arena_reset(m);
	m->frame = dlshare__frame__unpack(&m->alloc, len, data);
	if (!m->frame) {
		wire_msg_free(m);
		return -EPROTO;
	}
	m->nul_field = string_with_nul(&dlshare__frame__descriptor, data, len,
				       &m->nul_in);
	*out = m;
	return 0;
}

int wire_decode_ex(const uint8_t *data, size_t len, unsigned flags,
		   struct wire_msg **out)
{
	size_t first = ARENA_FIRST(len);
	struct wire_msg *m = malloc(sizeof(*m) + first);

	if (!m)
		return -ENOMEM;
	return decode_into(m, first, data, len, flags, NULL, out);
}

int wire_decode_in(struct wire_msg *block, const uint8_t *data, size_t len,
		   unsigned flags, struct wire_memo *memo,
		   struct wire_msg **out)
{
	if (!block && !(block = malloc(sizeof(*block) + ARENA_KEEP)))
		return -ENOMEM;
	return decode_into(block, ARENA_KEEP, data, len, flags, memo, out);
}

/* Drops a reference to m. Returns 1 when it was the last: m is then its
 * caller's to end (msg_end). */
static int msg_unref(struct wire_msg *m)
{
	/* Only a holder adds a reference: when ours is the only one, none
	 * can be added now, and no atomic write is needed. */
	if (atomic_load_explicit(&m->refs, memory_order_acquire) == 1)
		return 1;
	return atomic_fetch_sub_explicit(&m->refs, 1,
					 memory_order_acq_rel) == 1;
}

/* m's last reference went: its extra chunks, and its reference to the
 * message it shares parts of, go; its block stays. */
static void msg_end(struct wire_msg *m)
{
	struct wire_msg *s = m->shared;

	m->shared = NULL;
	/* Everything the frame holds is in the arena: no walk through it
	 * (dlshare__frame__free_unpacked would only give back budget). */
	chunks_free(m);
	UNPOISON(m->first, m->first_size);
	/* A memo keeps only a message that shares nothing: one level. */
	if (s && msg_unref(s)) {
		msg_end(s);
		free(s);
	}
}

struct wire_msg *wire_msg_keep(struct wire_msg *m)
{
	if (!m || !msg_unref(m))
		return NULL;
	/* The block stays, its first chunk as a decode leaves it (poisoned
	 * again by the next). */
	msg_end(m);
	if (m->first_size != ARENA_KEEP) {
		free(m);
		return NULL;
	}
	m->frame = NULL;
	return m;
}

void wire_block_free(struct wire_msg *block)
{
	free(block);
}

void wire_msg_free(struct wire_msg *m)
{
	if (!m || !msg_unref(m))
		return;
	msg_end(m);
	free(m);
}
