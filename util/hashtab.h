/* hashtab — uthash as the daemon, the library and the relay use it: their
 * files include this, never <uthash.h> itself, so that every table is made
 * and searched with the same two choices below (a table added to with one
 * hash and searched with another finds nothing). proto/check.c keeps a
 * table of its own (out of memory is an answer there) with the same keyed
 * hash. Any thread (the tables have their owners' locks).
 *
 * - uthash zeroes a new table with memset right after malloc, which gcc
 *   would make a calloc (zalloc.h: no thread cache).
 * - Every key is hashed with the process's secret key (hash.h): names
 *   are a peer's choice, and an unkeyed hash would let it fill one
 *   bucket. A key of 8 bytes (a 64-bit id: a lease, a buffer, a call, a
 *   writer; or an 8-byte name) by util_hash_u64, a handful of instructions
 *   where a hash of 8 bytes as bytes is ~50, a few times per get on each
 *   side; any other (names) by SipHash-1-3. */
#ifndef DLSHARE_UTIL_HASHTAB_H
#define DLSHARE_UTIL_HASHTAB_H

#ifdef UTHASH_H
#error "hashtab.h must come before any other include of <uthash.h>"
#endif

#include <stdint.h>
#include <string.h>

#include "hash.h"
#include "zalloc.h"

#define uthash_bzero(a, n) util_bzero((a), (n))
#define HASH_FUNCTION(keyptr, keylen, hashv)                                  \
	do {                                                                  \
		if ((keylen) == sizeof(uint64_t)) {                           \
			uint64_t hk_;                                         \
			memcpy(&hk_, (keyptr), sizeof(hk_));                  \
			(hashv) = (unsigned)util_hash_u64(hk_);               \
		} else {                                                      \
			(hashv) = (unsigned)util_hash_bytes((keyptr),         \
							    (keylen));        \
		}                                                             \
	} while (0)
#include <uthash.h>

#endif
