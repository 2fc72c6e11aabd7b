/* zalloc — zeroed allocations on hot paths, for the daemon and the library.
 *
 * calloc() in glibc (before 2.41) never takes a block from the thread's
 * cache (tcache): it goes to the arena every time, and the cache then
 * overflows into the arena's bins on free. malloc() + memset() is served
 * from the cache, about a fifth of the instructions for a small block; but
 * gcc folds a memset right after a malloc back into calloc, which an empty
 * asm that hides the pointer's origin prevents. Any thread. */
#ifndef DLSHARE_UTIL_ZALLOC_H
#define DLSHARE_UTIL_ZALLOC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Zeroes n bytes at p, never merged with the malloc that made p. */
static inline void util_bzero(void *p, size_t n)
{
	__asm__("" : "+r"(p));
	memset(p, 0, n);
}

/* n zeroed objects of size bytes. Returns NULL on overflow or when out of
 * memory; free() frees it. */
static inline void *util_zalloc(size_t n, size_t size)
{
	void *p;

	if (size && n > SIZE_MAX / size)
		return NULL;
	p = malloc(n * size);
	if (p)
		util_bzero(p, n * size);
	return p;
}

#endif
