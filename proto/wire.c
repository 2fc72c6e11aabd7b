/* wire — packets with fds over SOCK_SEQPACKET, and the capped frame codec. */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
	do {
		n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	/* A SEQPACKET send is all or nothing. */
	return (size_t)n == len ? 0 : -EIO;
}

void wire_close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

/* Collects the fds of every SCM_RIGHTS message, up to max; any beyond max
 * are closed. The control buffer is rounded up to 8 bytes, so with an odd
 * max the kernel may deliver one fd more than asked without MSG_CTRUNC.
 * Returns the count delivered, which may exceed max. */
static unsigned collect_fds(struct msghdr *msg, int *fds, unsigned max)
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
				close(fd);
		}
	}
	return seen;
}

int wire_recv(int sock, void *buf, size_t cap, int *fds, unsigned max_fds,
	      size_t *len, unsigned *nfds, int flags)
{
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	union {
		char buf[CMSG_SPACE(sizeof(int) * WIRE_FDS_MAX)];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	unsigned got;
	ssize_t n;

	if (max_fds > WIRE_FDS_MAX)
		max_fds = WIRE_FDS_MAX;
	msg.msg_control = ctl.buf;
	/* Room for max_fds, rounded up to 8 bytes: with an odd max_fds the
	 * kernel may deliver one more without MSG_CTRUNC (collect_fds counts
	 * it, and the packet is refused below). */
	msg.msg_controllen = max_fds ? CMSG_SPACE(sizeof(int) * max_fds) : 0;
	if (!max_fds)
		msg.msg_control = NULL;
	do {
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	got = max_fds ? collect_fds(&msg, fds, max_fds) : 0;
	if (msg.msg_flags & MSG_TRUNC) {
		wire_close_fds(fds, got < max_fds ? got : max_fds);
		return -EMSGSIZE;
	}
	if ((msg.msg_flags & MSG_CTRUNC) || got > max_fds) {
		wire_close_fds(fds, got < max_fds ? got : max_fds);
		return -EPROTO;
	}
	*len = (size_t)n;
	*nfds = got;
	return 0;
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
#define ARENA_FIRST(len) ((len) * 4 < 3584 ? 512 + (len) * 4 : 4096)
#define ARENA_CHUNK 4096u
#define ARENA_HDR 8u

static void *capped_alloc(void *opaque, size_t size)
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

int wire_decode(const uint8_t *data, size_t len, struct wire_msg **out)
{
	size_t first = ARENA_FIRST(len);
	struct wire_msg *m = malloc(sizeof(*m) + first);

	if (!m)
		return -ENOMEM;
	memset(m, 0, sizeof(*m));
	m->cap = len * WIRE_DECODE_FACTOR + WIRE_DECODE_SLACK;
	m->alloc.alloc = capped_alloc;
	m->alloc.free = capped_free;
	m->alloc.allocator_data = m;
	m->first_size = first;
	m->cur = m->first;
	m->end = m->first + first;
	POISON(m->first, first);
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

void wire_msg_free(struct wire_msg *m)
{
	if (!m)
		return;
	/* Everything the frame holds is in the arena: no walk through it
	 * (dlshare__frame__free_unpacked would only give back budget). */
	while (m->chunks) {
		struct wire_chunk *c = m->chunks;

		m->chunks = c->next;
		UNPOISON(c->data, c->size);
		free(c);
	}
	UNPOISON(m->first, m->first_size);
	free(m);
}
