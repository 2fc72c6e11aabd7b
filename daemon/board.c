/* board — the version board's memfd and its slots. */
#include "board.h"

#include "host.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int board_init(struct board *b, uint32_t nslots)
{
	size_t len = (size_t)nslots * sizeof(uint64_t);
	void *p = MAP_FAILED;
	int err;

	*b = (struct board)BOARD_NULL;
	if (!nslots)
		return 0;
	if (nslots > BOARD_SLOTS_MAX)
		return -EINVAL;
	b->free = malloc((size_t)nslots * sizeof(*b->free));
	if (!b->free)
		return -ENOMEM;
	b->fd = memfd_create("dlshare:board", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (b->fd < 0)
		goto fail;
	/* The daemon's mapping is made first: F_SEAL_FUTURE_WRITE leaves
	 * it writable and refuses every later writable one, so a client
	 * cannot write through the fd it is sent, nor through a reopen of
	 * it by /proc (the seal is the file's, not the fd's). */
	if (ftruncate(b->fd, (off_t)len) < 0)
		goto fail;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	if (fcntl(b->fd, F_ADD_SEALS, HOST_SEALS_BIRTH |
		  HOST_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
		goto fail;
	b->words = p;
	b->nslots = nslots;
	/* A read-only fd cannot punch holes in it either. */
	b->ro_fd = host_reopen_ro(b->fd);
	if (b->ro_fd < 0)
		b->ro_fd = b->fd;
	return 0;

fail:
	err = -errno;
	if (p != MAP_FAILED)
		munmap(p, len);
	if (b->fd >= 0)
		close(b->fd);
	free(b->free);
	*b = (struct board)BOARD_NULL;
	return err;
}

void board_deinit(struct board *b)
{
	if (b->words)
		munmap((void *)b->words, (size_t)b->nslots * sizeof(uint64_t));
	if (b->ro_fd >= 0 && b->ro_fd != b->fd)
		close(b->ro_fd);
	if (b->fd >= 0)
		close(b->fd);
	free(b->free);
	*b = (struct board)BOARD_NULL;
}

int board_slot_get(struct board *b, uint32_t *slot)
{
	if (b->nfree)
		*slot = b->free[--b->nfree];
	else if (b->next < b->nslots)
		*slot = b->next++;
	else
		return -ENOSPC;
	return 0;
}

void board_slot_put(struct board *b, uint32_t slot)
{
	board_clear(b, slot);
	b->free[b->nfree++] = slot;
}

uint64_t board_post(struct board *b, uint32_t slot)
{
	uint64_t token = ++b->last_token;

	atomic_store_explicit(&b->words[slot], token, memory_order_release);
	return token;
}

void board_clear(struct board *b, uint32_t slot)
{
	atomic_store_explicit(&b->words[slot], 0, memory_order_release);
}
