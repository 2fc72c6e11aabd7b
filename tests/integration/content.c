/* content — self-describing tensor contents. */
#include "content.h"

#include <stdio.h>
#include <string.h>

uint64_t content_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t content_token(uint64_t seed, uint32_t who, uint32_t seq)
{
	return content_mix(content_mix(seed) ^ ((uint64_t)who << 32 | seq));
}

static uint64_t hdr_sum(const struct content_hdr *h)
{
	uint64_t w[7], s = 0x5eed;

	memcpy(w, h, sizeof(w));
	for (int i = 0; i < 7; i++)
		s = content_mix(s ^ w[i]);
	return s;
}

/* The stream's 8-byte word k (counting from the tensor's start). */
static uint64_t word(uint64_t token, uint32_t index, uint64_t k)
{
	return content_mix(token ^ ((uint64_t)index << 48) ^ (k * 0x2545f4914f6cdd1dull));
}

void content_fill(void *p, const struct content_hdr *hin, size_t from,
		  size_t to)
{
	struct content_hdr h = *hin;
	uint8_t *b = p;

	h.magic = CONTENT_MAGIC;
	h.sum = hdr_sum(&h);
	if (to > h.nbytes)
		to = h.nbytes;
	for (size_t i = from; i < to && i < CONTENT_HDR; i++)
		b[i] = ((const uint8_t *)&h)[i];
	if (from < CONTENT_HDR)
		from = CONTENT_HDR;
	while (from < to) {
		uint64_t k = from / 8, w = word(h.token, h.index, k);
		size_t off = from % 8, len = 8 - off;

		if (len > to - from)
			len = to - from;
		memcpy(b + from, (const uint8_t *)&w + off, len);
		from += len;
	}
}

int content_check(const void *p, size_t n, uint64_t seed,
		  struct content_hdr *h, char *why, size_t whylen)
{
	const uint8_t *b = p;
	size_t i;

	if (n < CONTENT_HDR) {
		snprintf(why, whylen, "tensor of %zu bytes, less than a header",
			 n);
		return -1;
	}
	memcpy(h, p, sizeof(*h));
	if (h->magic != CONTENT_MAGIC || h->sum != hdr_sum(h)) {
		uint64_t w0, w1;

		memcpy(&w0, b, 8);
		memcpy(&w1, b + 8, 8);
		snprintf(why, whylen, "no sound header (first bytes %016llx "
			 "%016llx)", (unsigned long long)w0,
			 (unsigned long long)w1);
		return -1;
	}
	if (h->token != content_token(seed, h->who, h->seq)) {
		snprintf(why, whylen, "token %016llx is not that of writer %u "
			 "write %u", (unsigned long long)h->token, h->who,
			 h->seq);
		return -1;
	}
	if (h->nbytes != n) {
		snprintf(why, whylen, "header says %llu bytes, tensor has %zu",
			 (unsigned long long)h->nbytes, n);
		return -1;
	}
	for (i = CONTENT_HDR; i + 8 <= n; i += 8) {
		uint64_t have, want = word(h->token, h->index, i / 8);

		memcpy(&have, b + i, 8);
		if (have != want)
			goto bad;
	}
	if (i < n) {
		uint64_t want = word(h->token, h->index, i / 8);

		if (memcmp(b + i, &want, n - i))
			goto bad;
	}
	return 0;
bad:
	{
		size_t at = i;
		uint64_t want = word(h->token, h->index, i / 8), have = 0;

		memcpy(&have, b + i, n - i < 8 ? n - i : 8);
		snprintf(why, whylen, "bytes %zu.. of %zu are %016llx, want "
			 "%016llx (writer %u write %u tensor %u)", at, n,
			 (unsigned long long)have, (unsigned long long)want,
			 h->who, h->seq, h->index);
	}
	return -1;
}
