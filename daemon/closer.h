/* closer — the daemon's fds of large host buffers, closed off the loop.
 *
 * The close that drops a memfd's last reference frees its pages in the
 * thread that closes (~50 ms per GiB on the machine of BENCHMARKS.md): on
 * the loop, every peer would wait for it, and a peer chooses when (a
 * delete, a newer version, its own exit). The registry hands such fds here
 * (its ops->close_aside); one job on the thread pool at a time closes
 * what was handed over meanwhile, so the frees never hold more than one of
 * the pool's threads away from seals and creates. Embedded in struct
 * daemon. Loop thread only.
 */
#ifndef DLSHARE_CLOSER_H
#define DLSHARE_CLOSER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct registry;

/* Something to do once the closer has closed everything handed to it
 * (closer_when_idle): the caller's, embedded in its own struct. */
struct closer_wait {
	void (*fn)(struct closer_wait *w);
	struct closer_wait *next;
};

struct closer {
	uv_loop_t *loop;
	struct registry *reg;     /* told of each job's fds once closed */
	uv_work_t req;
	int busy;                 /* req is on the pool with job */
	int *wait;                /* handed over since the job began */
	size_t nwait, capwait;
	int *job;                 /* being closed by req */
	size_t njob;
	struct closer_wait *idle; /* to call once nothing is left to close */
	uint64_t jobs_done;       /* jobs finished so far */
};

/* An idle closer for reg's fds on loop's thread pool. */
void closer_init(struct closer *cl, uv_loop_t *loop, struct registry *reg);
/* Takes fd to close off the loop. Returns 0, or -ENOMEM or -ESHUTDOWN
 * (after closer_deinit): fd is then still the caller's to close. */
int closer_take(struct closer *cl, int fd);
/* Whether fds handed over are not all closed yet: their memory may not be
 * free yet either. */
int closer_busy(const struct closer *cl);
/* Moves each time a job finishes (memory may have been freed since). */
uint64_t closer_jobs_done(const struct closer *cl);
/* Calls w->fn once every fd handed over so far, and since, is closed (from
 * the loop, in a later turn). Only while closer_busy. */
void closer_when_idle(struct closer *cl, struct closer_wait *w);
/* Closes, here and now, what was never handed to the pool. Call it once
 * the loop has run to its end (no job in flight). */
void closer_deinit(struct closer *cl);

#endif
