/* hashtab — uthash as the daemon and the library use it: their files
 * include this, never <uthash.h> itself, so that every table is made and
 * searched with the same two choices below (a table added to with one
 * hash and searched with another finds nothing). proto/check.c and the
 * relay keep tables of their own and include uthash their own way. Any
 * thread (the tables have their owners' locks).
 *
 * - uthash zeroes a new table with memset right after malloc, which gcc
 *   would make a calloc (zalloc.h: no thread cache).
 * - A table keyed by 8 bytes is keyed by a 64-bit id (a lease, a buffer,
 *   a call, a writer): a multiplicative hash of it, a handful of
 *   instructions where uthash's Jenkins hash of 8 bytes is ~50, a few
 *   times per get on each side. uthash buckets by the low bits, so the
 *   product's high half is taken: sequential ids spread, and ids 2^k
 *   apart do not share a bucket. Other keys (names) keep Jenkins. */
#ifndef DLSHARE_UTIL_HASHTAB_H
#define DLSHARE_UTIL_HASHTAB_H

#ifdef UTHASH_H
#error "hashtab.h must come before any other include of <uthash.h>"
#endif

#include <stdint.h>
#include <string.h>

#include "zalloc.h"

#define uthash_bzero(a, n) util_bzero((a), (n))
#define HASH_FUNCTION(keyptr, keylen, hashv)                                  \
	do {                                                                  \
		if ((keylen) == sizeof(uint64_t)) {                           \
			uint64_t hk_;                                         \
			memcpy(&hk_, (keyptr), sizeof(hk_));                  \
			(hashv) = (unsigned)((hk_ * 0x9e3779b97f4a7c15ull) >> \
					     32);                             \
		} else {                                                      \
			HASH_JEN((keyptr), (keylen), (hashv));                \
		}                                                             \
	} while (0)
#include <uthash.h>

#endif
