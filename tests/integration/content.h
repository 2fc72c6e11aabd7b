/* content — self-describing tensor contents for tests whose readers must
 * verify what they get without asking anyone: a 64-byte header (who wrote
 * it, which of its writes, for which name, which tensor of how many, the
 * version number when the writer knew it) followed by a pseudo-random
 * stream that is a function of the header's token and the tensor's index
 * alone. A reader recomputes everything from the header, and the header's
 * token from (seed, who, seq), so a torn, stale, zeroed, half-written or
 * misplaced tensor never passes. Any thread, any process.
 */
#ifndef DLSHARE_TEST_CONTENT_H
#define DLSHARE_TEST_CONTENT_H

#include <stddef.h>
#include <stdint.h>

#define CONTENT_MAGIC 0x434d4c44u /* "DLMC" */
#define CONTENT_HDR 64            /* a tensor holds at least this much */

struct content_hdr {
	uint32_t magic;
	uint32_t name;      /* the test's index of the name written to */
	uint32_t who;       /* the writer (a slot, a worker) */
	uint32_t seq;       /* the writer's count of its writes */
	uint64_t token;     /* content_token(seed, who, seq) */
	uint64_t version;   /* the version number, 0 when not known yet */
	uint32_t ntensors;  /* tensors in the version */
	uint32_t index;     /* this tensor's index */
	uint64_t nbytes;    /* this tensor's size */
	uint64_t extra;     /* the test's own (a batch number, say) */
	uint64_t sum;       /* a check of the 56 bytes before it */
};

/* The token of a writer's seq-th write in a run with this seed. */
uint64_t content_token(uint64_t seed, uint32_t who, uint32_t seq);

/* Writes the bytes [from, to) of a tensor of h->nbytes bytes described by
 * h (the header is bytes 0..63, the stream the rest). Writing [0, n/2) and
 * later [n/2, n) gives what one call over [0, n) gives. */
void content_fill(void *p, const struct content_hdr *h, size_t from,
		  size_t to);

/* Checks n bytes at p: a sound header whose token matches seed, nbytes
 * n, and the stream. Returns 0 and the header in *h, or -1 with a
 * sentence in why. */
int content_check(const void *p, size_t n, uint64_t seed,
		  struct content_hdr *h, char *why, size_t whylen);

/* A fast generator for the tests' own choices (splitmix64). */
uint64_t content_mix(uint64_t x);

#endif
