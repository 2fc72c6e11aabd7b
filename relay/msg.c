/* msg — relay message framing and field codec. */
#include "msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void grow(struct wbuf *w, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (w->oom)
		return;
	if (w->len + n <= w->cap)
		return;
	cap = w->cap ? w->cap : 256;
	while (cap < w->len + n)
		cap *= 2;
	p = realloc(w->p, cap);
	if (!p) {
		w->oom = 1;
		return;
	}
	w->p = p;
	w->cap = cap;
}

static void put(struct wbuf *w, uint64_t v, size_t n)
{
	size_t i;

	grow(w, n);
	if (w->oom)
		return;
	for (i = 0; i < n; i++)
		w->p[w->len++] = (uint8_t)(v >> (8 * i));
}

void wbuf_start(struct wbuf *w, uint16_t t)
{
	memset(w, 0, sizeof(*w));
	put(w, RELAY_MAGIC, 4);
	put(w, t, 2);
	put(w, 0, 2);
	put(w, 0, 4);
}

void wbuf_u8(struct wbuf *w, uint8_t v) { put(w, v, 1); }
void wbuf_u16(struct wbuf *w, uint16_t v) { put(w, v, 2); }
void wbuf_u32(struct wbuf *w, uint32_t v) { put(w, v, 4); }
void wbuf_u64(struct wbuf *w, uint64_t v) { put(w, v, 8); }

void wbuf_bytes(struct wbuf *w, const void *p, size_t n)
{
	grow(w, n);
	if (w->oom || !n)
		return;
	memcpy(w->p + w->len, p, n);
	w->len += n;
}

int wbuf_finish(struct wbuf *w)
{
	size_t body = w->len - RELAY_HDR_LEN;
	int i;

	if (w->oom || body > UINT32_MAX) {
		free(w->p);
		memset(w, 0, sizeof(*w));
		return -ENOMEM;
	}
	for (i = 0; i < 4; i++)
		w->p[8 + i] = (uint8_t)(body >> (8 * i));
	return 0;
}

static uint64_t get(struct rbuf *r, size_t n)
{
	uint64_t v = 0;
	size_t i;

	if (r->bad || r->len - r->off < n) {
		r->bad = 1;
		return 0;
	}
	for (i = 0; i < n; i++)
		v |= (uint64_t)r->p[r->off + i] << (8 * i);
	r->off += n;
	return v;
}

int rbuf_open(struct rbuf *r, const void *msg, size_t len, uint16_t *type)
{
	uint32_t magic, body;

	r->p = msg;
	r->len = len;
	r->off = 0;
	r->bad = 0;
	magic = (uint32_t)get(r, 4);
	*type = (uint16_t)get(r, 2);
	(void)get(r, 2);
	body = (uint32_t)get(r, 4);
	if (r->bad || magic != RELAY_MAGIC || body != len - RELAY_HDR_LEN)
		return -EPROTO;
	return 0;
}

uint8_t rbuf_u8(struct rbuf *r) { return (uint8_t)get(r, 1); }
uint16_t rbuf_u16(struct rbuf *r) { return (uint16_t)get(r, 2); }
uint32_t rbuf_u32(struct rbuf *r) { return (uint32_t)get(r, 4); }
uint64_t rbuf_u64(struct rbuf *r) { return get(r, 8); }

const void *rbuf_bytes(struct rbuf *r, size_t n)
{
	const void *p;

	if (r->bad || r->len - r->off < n) {
		r->bad = 1;
		return NULL;
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

void msg_printable(char *dst, size_t cap, const char *t, size_t n)
{
	size_t i;

	if (n > cap - 1)
		n = cap - 1;
	for (i = 0; i < n; i++)
		dst[i] = t[i] >= 0x20 && t[i] < 0x7f ? t[i] : '?';
	dst[n] = 0;
}

size_t rbuf_left(const struct rbuf *r)
{
	return r->bad ? 0 : r->len - r->off;
}
