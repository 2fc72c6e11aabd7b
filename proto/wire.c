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

/* Every block carries its size in front so free can give the budget back. */
struct block {
	size_t size;
	max_align_t data[];
};

static void *capped_alloc(void *opaque, size_t size)
{
	struct wire_msg *m = opaque;
	struct block *b;

	if (size > m->cap - m->used)
		return NULL;
	b = malloc(sizeof(*b) + size);
	if (!b)
		return NULL;
	b->size = size;
	m->used += size;
	return b->data;
}

static void capped_free(void *opaque, void *p)
{
	struct wire_msg *m = opaque;
	struct block *b;

	if (!p)
		return;
	b = (struct block *)((char *)p - offsetof(struct block, data));
	m->used -= b->size;
	free(b);
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
	struct wire_msg *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	m->cap = len * WIRE_DECODE_FACTOR + WIRE_DECODE_SLACK;
	m->alloc.alloc = capped_alloc;
	m->alloc.free = capped_free;
	m->alloc.allocator_data = m;
	m->frame = dlshare__frame__unpack(&m->alloc, len, data);
	if (!m->frame) {
		free(m);
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
	dlshare__frame__free_unpacked(m->frame, &m->alloc);
	free(m);
}
