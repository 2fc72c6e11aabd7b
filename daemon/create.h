/* create — Create requests: a pending store version whose buffers the
 * daemon makes. Host buffers are memfds made at once (registry_add). GPU
 * buffers are made on the thread pool (a gpu_job: the driver's first call,
 * or a full device, may take long, and the loop never waits), after the
 * request was checked, and the Create is answered when they are; a job
 * counts as a request in flight of its peer. cuda-vmm memory is an fd the
 * registry holds; cuda-ipc memory (where the driver cannot export VMM
 * memory) is the daemon's own allocation, kept here by buffer id and
 * freed off the loop once the registry frees its buffer. A Create that may
 * wait for room in a queue name and finds it full once its buffers are
 * made goes back to wait through daemon->create_full (queue.c's: create.c
 * does not include queue.h). Loop thread only.
 */
#ifndef DLSHARE_CREATE_H
#define DLSHARE_CREATE_H

#include "daemon.h"
#include "peer.h"

struct devmem;
struct gpu_job;

/* Handles a Create of peer (f is its frame, for the size of the answer):
 * answered now, or once its GPU buffers are made. */
void create_request(struct peer *peer, const Dlshare__Frame *f,
		    const Dlshare__Create *m);

/* Finishes a Create whose manifest memfd mcheck checked (mcheck_finish_fn;
 * it carries no other fd). */
void create_checked(struct peer *peer, const Dlshare__Frame *f, int *fds,
		    unsigned nfds, struct registry_manifest *manifest);
/* Handles a Create whose size was checked already: one that waited for
 * room in a queue name (queue.c) comes back here. deadline (uv_now;
 * UINT64_MAX: none) is when its wait for room ends, create_wait_deadline's
 * when it first came: should the queue be full again once its buffers are
 * made, it goes back to wait (daemon->create_full) until then. */
void create_resume(struct peer *peer, uint64_t id, const Dlshare__Create *m,
		   uint64_t deadline);

/* When a wait for room of m, starting now, ends (uv_now): UINT64_MAX for
 * a wait forever; now when m asks for no wait. */
uint64_t create_wait_deadline(struct daemon *d, const Dlshare__Create *m);

/* The registry frees b: the daemon-owned cuda-ipc memory behind it, if
 * any, is freed on the thread pool. */
void create_buffer_freed(struct daemon *d, const struct rbuffer *b);

/* peer is closing: its jobs on the pool finish without it, and free what
 * they made. */
void create_peer_closed(struct peer *peer);

/* Forgets the cuda-ipc memory of versions still alive at shutdown: it goes
 * with the process. */
void create_deinit(struct daemon *d);

#endif
