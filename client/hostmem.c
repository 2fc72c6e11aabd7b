/* hostmem — shareable host memory: tensors in sealed memfds that
 * dlshare_publish() hands out without a copy. A process-wide list, any
 * thread. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct halloc {
	DLManagedTensor mt;
	void *base;
	uint64_t size;           /* of the mapping (at least 1 byte) */
	int fd;
	int64_t shape[CHECK_NDIM_MAX];
	struct halloc *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct halloc *allocs;

/* A child inherits the allocations (they are ordinary memory to it, shared
 * with the parent like any MAP_SHARED mapping) and may free them: the list
 * must be whole and its lock free there, whichever thread held it. */
static void on_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void on_parent(void)
{
	pthread_mutex_unlock(&lock);
}

static void on_child(void)
{
	pthread_mutex_init(&lock, NULL);
}

static void hostmem_once(void)
{
	pthread_atfork(on_prepare, on_parent, on_child);
}

void hostmem_unmap(void *p, size_t len)
{
	if (!p)
		return;
	/* VM_SEQ_READ: the unmap leaves the pages' LRU state as it is. A
	 * mapping about to go has no recency worth keeping. */
	if (len >= HOSTMEM_UNMAP_HINT_MIN)
		(void)madvise(p, len, MADV_SEQUENTIAL);
	munmap(p, len);
}

static void halloc_delete(DLManagedTensor *mt)
{
	CALL_UNCANCELLED;
	struct halloc *h = mt->manager_ctx;

	pthread_mutex_lock(&lock);
	for (struct halloc **pp = &allocs; *pp; pp = &(*pp)->next)
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	pthread_mutex_unlock(&lock);
	hostmem_unmap(h->base, h->size);
	close(h->fd);
	free(h);
}

static int host_alloc(DLDataType dtype, int32_t ndim, const int64_t *shape,
		      DLManagedTensor **out)
{
	uint64_t elem, bytes;
	struct halloc *h;
	int err;

	if (!out || ndim < 0 || (uint32_t)ndim > CHECK_NDIM_MAX ||
	    (ndim > 0 && !shape))
		return DLSHARE_EINVAL;
	*out = NULL;
	pthread_once(&once, hostmem_once);
	elem = check_dtype_size(dtype.code, dtype.bits, dtype.lanes);
	if (!elem || check_compact_bytes(shape, (size_t)ndim, elem, &bytes))
		return DLSHARE_EINVAL;
	if (bytes > SIZE_MAX - 1)
		return DLSHARE_ENOMEM;
	h = calloc(1, sizeof(*h));
	if (!h)
		return DLSHARE_ENOMEM;
	/* A zero-sized tensor still gets one byte: an empty mapping is not a
	 * mapping, and the memfd must be findable by address. */
	h->size = bytes ? bytes : 1;
	h->fd = memfd_create("dlshare-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (h->fd < 0) {
		err = client_errno(-errno);
		free(h);
		return err;
	}
	if (ftruncate(h->fd, (off_t)h->size) < 0 ||
	    fcntl(h->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		err = errno == EFBIG || errno == ENOSPC ? DLSHARE_ENOMEM :
		      client_errno(-errno);
		goto fail;
	}
	h->base = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED,
		       h->fd, 0);
	if (h->base == MAP_FAILED) {
		err = DLSHARE_ENOMEM;
		goto fail;
	}
	if (ndim)
		memcpy(h->shape, shape, (size_t)ndim * sizeof(*shape));
	h->mt.dl_tensor.data = h->base;
	h->mt.dl_tensor.device.device_type = kDLCPU;
	h->mt.dl_tensor.ndim = ndim;
	h->mt.dl_tensor.dtype = dtype;
	h->mt.dl_tensor.shape = h->shape;
	h->mt.manager_ctx = h;
	h->mt.deleter = halloc_delete;
	pthread_mutex_lock(&lock);
	h->next = allocs;
	allocs = h;
	pthread_mutex_unlock(&lock);
	*out = &h->mt;
	return 0;

fail:
	close(h->fd);
	free(h);
	return err;
}

int dlshare_host_alloc(DLDataType dtype, int32_t ndim, const int64_t *shape,
		       DLManagedTensor **out)
{
	CALL_UNCANCELLED;

	return host_alloc(dtype, ndim, shape, out);
}

int hostmem_find(const void *p, uint64_t len, void **base, uint64_t *size,
		 int *fd)
{
	uintptr_t a = (uintptr_t)p;
	int err = DLSHARE_ENOENT;

	pthread_mutex_lock(&lock);
	for (struct halloc *h = allocs; h; h = h->next) {
		uintptr_t b = (uintptr_t)h->base;

		if (a < b || a - b > h->size || len > h->size - (a - b))
			continue;
		*fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 3);
		err = *fd < 0 ? client_errno(-errno) : 0;
		*base = h->base;
		*size = h->size;
		break;
	}
	pthread_mutex_unlock(&lock);
	return err;
}
