/* sha256 — SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the
 * relay's challenge-response. Pure functions; any thread. */
#ifndef DLSHARE_RELAY_SHA256_H
#define DLSHARE_RELAY_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

struct sha256 {
	uint32_t h[8];
	uint64_t total;     /* bytes hashed so far */
	uint8_t buf[64];
	size_t nbuf;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *p, size_t n);
void sha256_final(struct sha256 *s, uint8_t out[SHA256_LEN]);

/* HMAC-SHA256 of the concatenation of n parts under key. */
void hmac_sha256(const void *key, size_t keylen, const void *const *parts,
		 const size_t *lens, size_t n, uint8_t out[SHA256_LEN]);

/* Compares n bytes in time that does not depend on where they differ.
 * Returns 0 when equal. */
int mem_equal_ct(const void *a, const void *b, size_t n);

#endif
