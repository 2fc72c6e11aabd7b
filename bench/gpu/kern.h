/* kern — the device work of the GPU benchmark behind one interface: fill a
 * buffer with a pattern, check a buffer against it (counting the words that
 * differ), and keep a stream busy for a while.
 *
 * Two implementations: kern.cu (CUDA kernels, for a real GPU) and
 * kern_fake.c (host functions queued with cudaLaunchHostFunc, for
 * tests/fakecuda, whose "device" memory is host memory and which has no
 * kernels). Everything is queued on the stream given; nothing here waits
 * on the host. The caller's thread only.
 */
#ifndef DLSHARE_BENCH_GPU_KERN_H
#define DLSHARE_BENCH_GPU_KERN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __CUDACC__
#define KERN_HD __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The 8-byte word at index i of a buffer filled with seed: differs with
 * the index (a misplaced page shows) and with the seed (stale data from an
 * earlier repeat shows). One multiply, so fill and check stay memory-bound. */
KERN_HD uint64_t kern_pattern(uint64_t i, uint64_t seed)
{
	return ((i + 1) * UINT64_C(0x9E3779B97F4A7C15)) ^
	       (seed * UINT64_C(0xD1B54A32D192ED03));
}

/* What does the work: "CUDA kernels" or "host functions (fakecuda)". */
const char *kern_kind(void);

/* Once per process, after cudaSetDevice(dev): sizes the launch grids. */
cudaError_t kern_init(int dev);

/* Writes kern_pattern(i, seed) to every 8-byte word of [p, p + n);
 * n is a multiple of 8. */
cudaError_t kern_fill(void *p, size_t n, uint64_t seed, cudaStream_t s);

/* Adds to *bad (device memory, zeroed by the caller) the number of 8-byte
 * words of [p, p + n) that differ from kern_pattern(i, seed). Reads every
 * word. */
cudaError_t kern_check(const void *p, size_t n, uint64_t seed,
		       unsigned long long *bad, cudaStream_t s);

/* Keeps the stream busy for ns nanoseconds of wall time (a spinning
 * kernel on a GPU; a sleeping host function with the fake). */
cudaError_t kern_spin(uint64_t ns, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
