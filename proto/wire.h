/* wire — dlshare's packet layer, shared by the daemon and the client library.
 *
 * One SOCK_SEQPACKET packet carries one protobuf-c encoded Frame plus the fds
 * it names (SCM_RIGHTS). This module sends and receives such packets and
 * encodes/decodes frames with a capped allocator. It keeps no state: any
 * thread may call it, on sockets the caller serialises.
 */
#ifndef DLSHARE_WIRE_H
#define DLSHARE_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dlshare.pb-c.h"

#define WIRE_PROTO_MAJOR 1
#define WIRE_PROTO_MINOR 9 /* 1: Frame.releases; 2: Goodbye; 3: writer ids;
			    * 4: large manifests (manifest.h), name
			    * lifetimes, events per device, queue names;
			    * 5: versions' origins (relays); 6: the
			    * daemon's own events, Untake, Watch; 7: the
			    * version board (gets without a round trip);
			    * 8: Frame.unreceived (fds a reader could not
			    * take); 9: the request channel (chan.h) */

/* Largest packet either side sends. AF_UNIX refuses a datagram larger than
 * the socket's send buffer (wmem_default, 208 KiB on stock kernels), so the
 * default stays well below that. */
#define WIRE_PACKET_MAX_DEFAULT (128u * 1024u)
/* Why a write seal (F_SEAL_WRITE) was refused, in the daemon's Error and
 * in libdlshare's, which meets the refusal first (dlshare_seal). */
#define WIRE_TEXT_SEAL_BUSY                                                  \
	"a writable mapping or pinned pages (e.g. vmsplice, O_DIRECT, RDMA) " \
	"of a buffer still exist"
/* Most fds one packet may carry. */
#define WIRE_FDS_MAX 64u
/* A decoded frame may cost at most this many times its packet's size. */
#define WIRE_DECODE_FACTOR 8u
#define WIRE_DECODE_SLACK (64u * 1024u)

/* Sends one packet with nfds fds attached. flags are added to
 * MSG_NOSIGNAL (pass MSG_DONTWAIT for a non-blocking send).
 * Returns 0, -EAGAIN when the socket is full, -EMSGSIZE, or another -errno. */
int wire_send(int sock, const void *data, size_t len, const int *fds,
	      unsigned nfds, int flags);

/* Receives one packet into buf (cap bytes) and up to max_fds fds, all opened
 * O_CLOEXEC. On success *len and *nfds are set; *len == 0 with no fds means
 * the peer closed the connection (SEQPACKET has no empty packets we send).
 * A packet larger than cap returns -EMSGSIZE, truncated control data
 * (more fds than max_fds) -EPROTO; in both cases every fd received is
 * closed. -EMFILE: the packet came whole (*len), but the kernel could make
 * only the first *nfds of its fds in this process (RLIMIT_NOFILE, or the
 * system's file table full), which are in fds, the caller's to close; the
 * rest are gone. Returns 0, -EAGAIN, or another -errno. */
int wire_recv(int sock, void *buf, size_t cap, int *fds, unsigned max_fds,
	      size_t *len, unsigned *nfds, int flags);

/* Most fds one SCM_RIGHTS message carries (the kernel's SCM_MAX_FD). */
#define WIRE_FDS_KERNEL_MAX 253u

/* Gives up an fd received but not kept: closes it, or has it closed. */
typedef void wire_drop_fn(void *ud, int fd);
/* Gives up n fds through drop (NULL: close), skipping negative ones and
 * setting each to -1. */
void wire_drop_fds(int *fds, unsigned n, wire_drop_fn *drop, void *ud);

/* wire_recv, for a receiver whose close of a peer's fd must not run where
 * it receives (the close of a memfd's last reference frees its pages):
 * the control buffer has room for as many fds as the kernel passes, so
 * that it never drops any itself (which would free them in this thread),
 * and every fd not handed over in fds (beyond max_fds, or with an error)
 * goes to drop(ud, fd). Also with max_fds 0: a packet that came with fds
 * then returns -EPROTO. */
int wire_recv_ex(int sock, void *buf, size_t cap, int *fds, unsigned max_fds,
		 size_t *len, unsigned *nfds, int flags, wire_drop_fn *drop,
		 void *ud);

/* Closes n fds, skipping negative ones. */
void wire_close_fds(int *fds, unsigned n);

/* Encodes f into a new buffer of at most max bytes. Returns 0 with *out
 * (free() it) and *len, -E2BIG when the frame is larger than max, -ENOMEM. */
int wire_encode(const Dlshare__Frame *f, size_t max, uint8_t **out,
		size_t *len);

/* Encodes f into buf (cap bytes) without protobuf-c when it is a hot
 * frame (a Get, a GetReply of host buffers; see wire.c): the same bytes as
 * dlshare__frame__pack. Returns the length, or 0 when f is not of that
 * shape or does not fit: then pack it with protobuf-c. */
size_t wire_pack_fast(const Dlshare__Frame *f, uint8_t *buf, size_t cap);

/* A GetReply's bytes after its version and lease (read_only, tensors,
 * buffers, events, manifest): the same for every reply that differs from
 * g in those two only, so that a reader's warm get of one version is sent
 * from them (wire_pack_get_reply) without encoding it again. Returns 0
 * with *out (free() it) and *len, -E2BIG when they are over max bytes
 * (then nothing is packed), -ENOMEM, or -EPROTO when g does not encode as
 * expected. */
int wire_get_reply_tail(const Dlshare__GetReply *g, size_t max,
			uint8_t **out, size_t *len);
/* Writes the frame { id, get_reply { version, lease, then tail, then
 * board_slot = slot and board_token = token unless token is 0 } } into
 * buf (cap bytes): the bytes dlshare__frame__pack writes for the frame
 * whose GetReply wire_get_reply_tail made tail of, with those fields set.
 * Returns the length, or 0 when it does not fit. */
size_t wire_pack_get_reply(uint64_t id, uint64_t version, uint64_t lease,
			   const uint8_t *tail, size_t tail_len,
			   uint32_t slot, uint64_t token, uint8_t *buf,
			   size_t cap);
/* What wire_pack_get_reply writes before the tail, at most: the frame's
 * id, key and length, and the version and lease (keys and varints). */
#define WIRE_GET_REPLY_HEAD_MAX (1 + 10 + 2 + 10 + 1 + 10 + 1 + 10)
/* ...and after it: the board's fields (1.7). */
#define WIRE_GET_REPLY_BOARD_MAX (2 + 5 + 2 + 10)

/* A chunk of a decoded frame's arena beyond the one inside struct
 * wire_msg. */
struct wire_chunk;

/* A decoded frame and the allocator that owns its memory: a bump arena
 * (one malloc per frame for the usual small one, more chunks for larger
 * ones), freed whole by wire_msg_free; protobuf-c's frees only give back
 * the budget (used). */
struct wire_msg {
	Dlshare__Frame *frame;
	/* The first string field whose bytes hold a NUL, and the message it
	 * is in; NULL when none does. protobuf-c hands strings over as C
	 * strings, where "ok\0../x" reads as "ok": such a frame must not be
	 * taken at its word. */
	const ProtobufCFieldDescriptor *nul_field;
	const ProtobufCMessageDescriptor *nul_in;
	ProtobufCAllocator alloc;
	size_t used;
	size_t cap;
	unsigned char *cur, *end;   /* the free part of the current chunk */
	struct wire_chunk *chunks;  /* the extra chunks, newest first */
	size_t first_size;
	int fast;                   /* decoded without protobuf-c: 1, or 2
				     * in its writers' order (wire.c) */
	/* Its holders: the reader that decoded it, and a wire_memo that
	 * keeps it, and each message whose frame points into its arena
	 * (shared). Any thread may free it. */
	atomic_uint refs;
	struct wire_msg *shared;    /* a memo's message whose parts this
				     * frame reuses (a reference), or NULL */
	/* Then the first chunk, sized at decode from the packet's length. */
	_Alignas(16) unsigned char first[];
};

/* Decodes a packet. The decoder may allocate at most
 * len * WIRE_DECODE_FACTOR + WIRE_DECODE_SLACK bytes. Returns 0 with *out
 * (free with wire_msg_free; see nul_field), -EPROTO for a malformed packet
 * or one that costs more than that, -ENOMEM. */
int wire_decode(const uint8_t *data, size_t len, struct wire_msg **out);
/* wire_decode with flags: WIRE_DECODE_NO_FAST decodes every frame with
 * protobuf-c, WIRE_DECODE_NO_LINE a hot frame in its writers' order with
 * the readers that take any order (the tests compare the three ways). */
#define WIRE_DECODE_NO_FAST 1u
#define WIRE_DECODE_NO_LINE 2u
int wire_decode_ex(const uint8_t *data, size_t len, unsigned flags,
		   struct wire_msg **out);
void wire_msg_free(struct wire_msg *m);
/* Another reference to m, for wire_msg_free to drop: only one of m's
 * holders may take it. */
static inline void wire_msg_ref(struct wire_msg *m)
{
	atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

/* Most bytes a wire_memo compares. */
#define WIRE_MEMO_MAX 512u

/* A reader's memory of the last hot body it decoded: a Get (its bytes
 * whole), or a GetReply (its bytes after the version and the lease, which
 * the daemon sends from one packed tail for every warm get of a version).
 * The next packet whose body has the same bytes takes the decoded tensors,
 * buffers and name of the remembered one (the decode of the same bytes)
 * instead of decoding them again: ~700 of the library's ~3,600
 * instructions per warm get. Bodies of more than WIRE_MEMO_MAX such bytes
 * are not remembered. A memo belongs to one reader (one thread at a time);
 * the messages decoded with it may be freed by any thread. Zero it to
 * start; wire_memo_clear ends it. */
struct wire_memo {
	struct wire_msg *msg;       /* holds a reference; NULL when empty */
	const void *body;           /* in msg's arena: a Dlshare__Get or a
				     * Dlshare__GetReply */
	uint32_t field;             /* body's field in Frame: 18 or 19 */
	uint32_t len;
	/* The reader's own note about the kept body (the daemon: the hash
	 * of a Get's name in its name table); noted is 0 until the reader
	 * sets it, and again whenever the memo keeps another body. */
	uint64_t note;
	int noted;
	uint8_t bytes[WIRE_MEMO_MAX];
};
void wire_memo_clear(struct wire_memo *memo);

/* Decoding without a malloc per packet: a reader that decodes one packet
 * after another keeps the block of the last one it finished with
 * (wire_msg_keep) and hands it to the next decode. block is NULL (a new
 * one is made) or one wire_msg_keep returned; it becomes *out's (on an
 * error it is freed). Every block wire_decode_in makes can be kept: its
 * first chunk fits any packet's first chunk. memo is NULL, or the reader's
 * (above). Otherwise as wire_decode_ex. */
int wire_decode_in(struct wire_msg *block, const uint8_t *data, size_t len,
		   unsigned flags, struct wire_memo *memo,
		   struct wire_msg **out);
/* Ends m as wire_msg_free does, but returns its block for wire_decode_in
 * when it can be kept (else frees it and returns NULL). NULL: NULL. A
 * kept block not used again goes with wire_block_free. */
struct wire_msg *wire_msg_keep(struct wire_msg *m);
void wire_block_free(struct wire_msg *block);

#endif
