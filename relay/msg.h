/* msg — the relay protocol's messages (docs/protocol.md, "The relay
 * protocol (1.5)"): a fixed 12-byte header and a little-endian body, built
 * with a growable writer and read with a bounds-checked reader that never
 * trusts a length it was sent. Pure; any thread. */
#ifndef DLSHARE_RELAY_MSG_H
#define DLSHARE_RELAY_MSG_H

#include <stddef.h>
#include <stdint.h>

#define RELAY_MAGIC 0x31524c44u  /* "DLR1" little-endian */
#define RELAY_HDR_LEN 12
#define RELAY_AM_ID 0x44         /* the UCP active message id of every message */
#define RELAY_PROTO_MAJOR 1
#define RELAY_PROTO_MINOR 8   /* 6: staged (device) offers, inline versions;
			       * 7: DELETED, ABORT, REFUSED;
			       * 8: CAPS, OFFER_DEVICE */
#define RELAY_NONCE_LEN 32
#define RELAY_NODE_MAX 64        /* bytes of a node name */
#define RELAY_PREFIX_MAX 255     /* bytes of a mirrored prefix */
#define RELAY_PREAUTH_MAX 256    /* bytes of any message before auth */

enum relay_msg_type {
	MSG_CHALLENGE = 1, /* mirror -> server: major, minor, nonce_m */
	MSG_PROOF_S = 2,   /* server -> mirror: major, minor, nonce_s, mac_s */
	MSG_PROOF_M = 3,   /* mirror -> server: mac_m */
	MSG_WELCOME = 4,   /* server -> mirror: node name */
	MSG_SUBSCRIBE = 5, /* mirror -> server: sub id, prefix */
	MSG_OFFER = 6,     /* server -> mirror: one sealed version */
	MSG_DONE = 7,      /* mirror -> server: offer id, status */
	MSG_ERROR = 8,     /* either way, then the sender closes */
	MSG_OFFER_STAGED = 9, /* server -> mirror (minor >= 6): a device
			       * version through a ring of pinned slots */
	MSG_CHUNK = 10,    /* server -> mirror: a slot holds stream bytes */
	MSG_FREE = 11,     /* mirror -> server: the slot was read */
	MSG_ABORT = 14,    /* server -> mirror (minor >= 7): an offer's bytes
			    * will not come (staging failed); reason */
	MSG_REFUSED = 15,  /* server -> mirror (minor >= 7): a SUBSCRIBE is
			    * refused, the connection kept; reason */
	MSG_DELETED = 12,  /* server -> mirror (minor >= 7): sub id, a
			    * name deleted at the origin */
	MSG_DELETED_DONE = 13, /* mirror -> server: sub id: one DELETED of
				* it was handled */
	MSG_CAPS = 16,     /* either way (minor >= 8), once, right after
			    * WELCOME: u32 flags (CAPS_*) */
	MSG_OFFER_DEVICE = 17, /* server -> mirror (minor >= 8, both said
				* CAPS_DEVICE_GET): as OFFER, its rkeys of
				* device memory */
};

/* CAPS flags; bits a relay does not know are ignored. */
enum {
	CAPS_DEVICE_GET = 1u << 0, /* registers device (CUDA) memory with UCX
				    * and gets from and into it */
};

/* DONE status. */
enum {
	DONE_OK = 0,       /* pulled and sealed */
	DONE_SKIPPED = 1,  /* the mirror has this origin version already */
	DONE_FAILED = 2,   /* aborted; nothing published */
};

struct wbuf {
	uint8_t *p;
	size_t len, cap;
	int oom;
};

/* Starts a message of type t (writes the header). */
void wbuf_start(struct wbuf *w, uint16_t t);
void wbuf_u8(struct wbuf *w, uint8_t v);
void wbuf_u16(struct wbuf *w, uint16_t v);
void wbuf_u32(struct wbuf *w, uint32_t v);
void wbuf_u64(struct wbuf *w, uint64_t v);
void wbuf_bytes(struct wbuf *w, const void *p, size_t n);
/* Writes the body length into the header. Returns 0, or -ENOMEM when any
 * write failed (the buffer is then freed). On success the caller owns w->p
 * (free()). */
int wbuf_finish(struct wbuf *w);

struct rbuf {
	const uint8_t *p;
	size_t len, off;
	int bad;           /* a read ran past the end */
};

/* Checks the header of a message of len bytes; on success *type is set and
 * r reads the body. Returns 0 or -EPROTO (bad magic, length mismatch). */
int rbuf_open(struct rbuf *r, const void *msg, size_t len, uint16_t *type);
uint8_t rbuf_u8(struct rbuf *r);
uint16_t rbuf_u16(struct rbuf *r);
uint32_t rbuf_u32(struct rbuf *r);
uint64_t rbuf_u64(struct rbuf *r);
/* A pointer to the next n bytes (NULL and r->bad when fewer remain). */
const void *rbuf_bytes(struct rbuf *r, size_t n);
size_t rbuf_left(const struct rbuf *r);
/* A peer's words (n bytes at t) for our log: at most cap - 1 of them, each
 * byte outside printable ASCII as '?', NUL-terminated in dst. */
void msg_printable(char *dst, size_t cap, const char *t, size_t n);

#endif
