/* hash — the keyed hashes behind every hash table that holds what a peer
 * chose: names (the registry, its tombs, the parked gets and takes), a
 * request's tensor keys (check_keys), a manifest's keys (manifest_check).
 *
 * With a hash anyone can compute, a peer picks keys that all fall in one
 * bucket, and every lookup there walks all of them: 65,536 names of one uid
 * in one chain make each Get of a name in it tens of thousands of compares
 * on the daemon's loop (hash flooding). The key below is random per process
 * (getrandom at load, before any table is made), so nobody outside the
 * process can tell which keys share a bucket.
 *
 * - util_hash_bytes: SipHash-1-3 (Aumasson and Bernstein's SipHash with one
 *   compression and three finalization rounds, as CPython's str hash), ~100
 *   instructions for a 20-byte name, what uthash's Jenkins hash took.
 * - util_hash_u64: an 8-byte key (a daemon-made id, or an 8-byte name) in a
 *   few instructions: the 128-bit product of the key and a secret odd
 *   multiplier, both halves folded, the key XORed with a second secret
 *   first. Not a PRF, but a peer that does not know the secrets cannot
 *   steer its keys' low bits, which is what the tables bucket by.
 *
 * Any thread. */
#ifndef DLSHARE_UTIL_HASH_H
#define DLSHARE_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The process's secrets, set before main (and before a dlopen returns):
 * [0] and [1] SipHash's key, [2] and [3] (odd) util_hash_u64's. */
extern uint64_t util_hash_key[4];

/* SipHash-c-d of p[0..n) under util_hash_key[0..1]: crounds and drounds
 * are 1 and 3 for the tables (util_hash_bytes); the tests run the
 * reference 2-4 against its published vectors. */
uint64_t util_siphash(const void *p, size_t n, const uint64_t key[2],
		      int crounds, int drounds);

uint64_t util_hash_bytes(const void *p, size_t n);

static inline uint64_t util_hash_u64(uint64_t k)
{
	unsigned __int128 x = (unsigned __int128)(k ^ util_hash_key[2]) *
			      util_hash_key[3];

	return (uint64_t)x ^ (uint64_t)(x >> 64);
}

#endif
