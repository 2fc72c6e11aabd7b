/* fuzz — what the fuzz targets share: the libFuzzer entry point and an
 * invariant check that aborts, so that libFuzzer (or the replay driver in a
 * normal build) reports the input that broke it. Test code only.
 */
#ifndef DLSHARE_FUZZ_H
#define DLSHARE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Runs one input. Returns 0; a broken invariant aborts. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the code under test that must hold whatever the input. */
#define FUZZ_ASSERT(cond, ...)                                               \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s:%d: invariant broken: %s: ",     \
				__FILE__, __LINE__, #cond);                  \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			abort();                                             \
		}                                                            \
	} while (0)

#endif
