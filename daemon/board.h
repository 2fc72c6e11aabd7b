/* board — the version board (protocol 1.7): a memfd of 64-bit words that
 * every client maps read-only. The registry gives a name a slot at the
 * first get of its newest version that may use one, and writes a token
 * there; any change to what such a get would answer (a newer version, a
 * delete, a new mode, a withdrawn export) clears it. A reader still holding
 * the lease of a version it got with a token then knows, from one load,
 * whether a get of the name would answer that version again: the library
 * answers such a get itself, without a round trip. Owned by the daemon;
 * loop thread only.
 */
#ifndef DLSHARE_BOARD_H
#define DLSHARE_BOARD_H

#include <stdatomic.h>
#include <stdint.h>

/* Slots of a board unless --board-slots says otherwise: 512 KiB of words,
 * touched only as names use them. */
#define BOARD_SLOTS_DEFAULT 65536u
/* Most slots --board-slots may ask for (32 MiB of words; a name keeps its
 * slot + 1 in 22 bits of struct entry). */
#define BOARD_SLOTS_MAX ((1u << 22) - 1)

struct board {
	int fd;                    /* the memfd, -1 when there is no board */
	int ro_fd;                 /* a read-only reopen of it, for clients
				    * (fd itself where /proc is missing) */
	_Atomic uint64_t *words;   /* its shared writable mapping */
	uint32_t nslots;
	uint32_t next;             /* slots below it were handed out once */
	uint32_t nfree;            /* of free[]: given back, to reuse */
	uint32_t *free;
	uint64_t last_token;       /* tokens are never reused */
};

#define BOARD_NULL { .fd = -1, .ro_fd = -1 }

/* Makes a board of nslots words (0: none, and no error). The clients'
 * view of it is read-only: the memfd is sealed against writes through any
 * new mapping or write(2) (F_SEAL_FUTURE_WRITE), and against resizing.
 * Returns 0 or a -errno. */
int board_init(struct board *b, uint32_t nslots);
void board_deinit(struct board *b);

/* A free slot, cleared, in *slot. Returns 0, or -ENOSPC when every slot is
 * in use (or there is no board). */
int board_slot_get(struct board *b, uint32_t *slot);
/* Clears slot and gives it back. */
void board_slot_put(struct board *b, uint32_t slot);

/* Writes a fresh token into slot and returns it (never 0). */
uint64_t board_post(struct board *b, uint32_t slot);
/* Clears slot: the token it held no longer holds. Before the daemon
 * answers the request that changed the name, so any reader that learns of
 * the change (from the writer, or anyone it told) sees the slot cleared. */
void board_clear(struct board *b, uint32_t slot);

#endif
