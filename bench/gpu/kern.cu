/* kern.cu — the benchmark's device work as CUDA kernels (see kern.h). */
#include "kern.h"

static int g_blocks = 1024;

#define THREADS 256

__global__ void k_fill(uint64_t *p, size_t n, uint64_t seed)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		p[i] = kern_pattern(i, seed);
}

__global__ void k_check(const uint64_t *p, size_t n, uint64_t seed,
			unsigned long long *bad)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	unsigned long long mine = 0;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += stride)
		mine += p[i] != kern_pattern(i, seed);
	/* Atomics only where something differs: the common case is a pure
	 * read of the buffer. */
	if (mine)
		atomicAdd(bad, mine);
}

__device__ __forceinline__ uint64_t globaltimer(void)
{
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* One thread spins on the global nanosecond timer. The clock64() bound
 * only guards against a timer that does not advance: the spin then ends
 * after 4 * ns cycles (about 2 * ns at 2 GHz) instead of never. */
__global__ void k_spin(uint64_t ns)
{
	uint64_t t0 = globaltimer();
	long long c0 = clock64();

	while (globaltimer() - t0 < ns &&
	       (uint64_t)(clock64() - c0) < ns * 4)
		;
}

extern "C" const char *kern_kind(void)
{
	return "CUDA kernels";
}

extern "C" cudaError_t kern_init(int dev)
{
	int sms = 0;
	cudaError_t e = cudaDeviceGetAttribute(&sms,
					       cudaDevAttrMultiProcessorCount,
					       dev);

	if (e != cudaSuccess)
		return e;
	/* Enough resident blocks to saturate memory bandwidth. */
	g_blocks = sms > 0 ? sms * 8 : 1024;
	return cudaSuccess;
}

static unsigned grid(size_t words)
{
	size_t need = (words + THREADS - 1) / THREADS;

	return need < (size_t)g_blocks ? (unsigned)(need ? need : 1) :
					 (unsigned)g_blocks;
}

extern "C" cudaError_t kern_fill(void *p, size_t n, uint64_t seed,
				 cudaStream_t s)
{
	k_fill<<<grid(n / 8), THREADS, 0, s>>>((uint64_t *)p, n / 8, seed);
	return cudaGetLastError();
}

extern "C" cudaError_t kern_check(const void *p, size_t n, uint64_t seed,
				  unsigned long long *bad, cudaStream_t s)
{
	k_check<<<grid(n / 8), THREADS, 0, s>>>((const uint64_t *)p, n / 8,
						seed, bad);
	return cudaGetLastError();
}

extern "C" cudaError_t kern_spin(uint64_t ns, cudaStream_t s)
{
	k_spin<<<1, 1, 0, s>>>(ns);
	return cudaGetLastError();
}
