/* hash — see hash.h. SipHash as its paper specifies it ("SipHash: a fast
 * short-input PRF", Aumasson and Bernstein, 2012): four 64-bit words of
 * state from the key, each 8-byte little-endian block mixed in with c
 * rounds, the last block holding the length's low byte on top, then d
 * rounds. */
#include "hash.h"

#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t util_hash_key[4];

static inline uint64_t rotl(uint64_t x, int b)
{
	return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                              \
	do {                                                                  \
		v0 += v1;                                                     \
		v1 = rotl(v1, 13);                                            \
		v1 ^= v0;                                                     \
		v0 = rotl(v0, 32);                                            \
		v2 += v3;                                                     \
		v3 = rotl(v3, 16);                                            \
		v3 ^= v2;                                                     \
		v0 += v3;                                                     \
		v3 = rotl(v3, 21);                                            \
		v3 ^= v0;                                                     \
		v2 += v1;                                                     \
		v1 = rotl(v1, 17);                                            \
		v1 ^= v2;                                                     \
		v2 = rotl(v2, 32);                                            \
	} while (0)

/* The rounds as constants where the tables call it (util_hash_bytes), so
 * that the compiler unrolls them: ~75 instructions for a short name where
 * the loops took ~170. */
static inline __attribute__((always_inline)) uint64_t
siphash(const unsigned char *in, size_t n, const uint64_t key[2], int crounds,
	int drounds)
{
	uint64_t v0 = key[0] ^ 0x736f6d6570736575ull;
	uint64_t v1 = key[1] ^ 0x646f72616e646f6dull;
	uint64_t v2 = key[0] ^ 0x6c7967656e657261ull;
	uint64_t v3 = key[1] ^ 0x7465646279746573ull;
	uint64_t m, last = (uint64_t)n << 56;
	const unsigned char *end = in + (n & ~(size_t)7);

	for (; in < end; in += 8) {
		memcpy(&m, in, 8); /* little-endian: x86-64, arm64 */
		v3 ^= m;
		for (int i = 0; i < crounds; i++)
			SIPROUND;
		v0 ^= m;
	}
	switch (n & 7) {
	case 7: last |= (uint64_t)in[6] << 48; /* fall through */
	case 6: last |= (uint64_t)in[5] << 40; /* fall through */
	case 5: last |= (uint64_t)in[4] << 32; /* fall through */
	case 4: last |= (uint64_t)in[3] << 24; /* fall through */
	case 3: last |= (uint64_t)in[2] << 16; /* fall through */
	case 2: last |= (uint64_t)in[1] << 8;  /* fall through */
	case 1: last |= (uint64_t)in[0];       /* fall through */
	default: break;
	}
	v3 ^= last;
	for (int i = 0; i < crounds; i++)
		SIPROUND;
	v0 ^= last;
	v2 ^= 0xff;
	for (int i = 0; i < drounds; i++)
		SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t util_siphash(const void *p, size_t n, const uint64_t key[2],
		      int crounds, int drounds)
{
	return siphash(p, n, key, crounds, drounds);
}

uint64_t util_hash_bytes(const void *p, size_t n)
{
	return siphash(p, n, util_hash_key, 1, 3);
}

/* splitmix64's step: spreads whatever entropy the fallback found. */
static uint64_t mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Before main, and in a dlopen before it returns: no table exists yet. */
__attribute__((constructor)) static void hash_key_init(void)
{
	ssize_t got = getrandom(util_hash_key, sizeof(util_hash_key),
				GRND_NONBLOCK);

	if (got != (ssize_t)sizeof(util_hash_key)) {
		/* No entropy yet (early boot) or no getrandom: the clock, the
		 * pid and where ASLR put us, which a peer cannot read. */
		struct timespec ts;
		uint64_t s;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
		    ((uint64_t)getpid() << 16) ^ (uint64_t)(uintptr_t)&s ^
		    (uint64_t)(uintptr_t)util_hash_key;
		for (size_t i = 0; i < 4; i++)
			util_hash_key[i] ^= mix(&s);
	}
	util_hash_key[3] |= 1;
}
