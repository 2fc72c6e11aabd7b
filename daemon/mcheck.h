/* mcheck — the manifest memfd of a Create or Publish (protocol 1.4), made
 * ready on libuv's thread pool: write-sealed (which waits while a peer
 * pins its pages), mapped, checked entry by entry (manifest_check: bounds,
 * keys, duplicates; ~30 ms per 10^5 tensors) and reopened read-only for
 * readers. At most --uid-seals checks of one uid run at once; the others
 * wait, first come first served. The loop only starts the job and finishes
 * the request: the
 * Create or Publish handler runs once more with the checked manifest. A
 * job counts as a request in flight of its peer. Loop thread only
 * (mcheck_work excepted).
 */
#ifndef DLSHARE_MCHECK_H
#define DLSHARE_MCHECK_H

#include "daemon.h"
#include "peer.h"

struct mcheck_job;

/* Finishes a request whose manifest was checked: m is the request (a copy
 * the job owns), fds its buffers' fds (the callee takes them over),
 * manifest what registry_add takes. */
typedef void (*mcheck_finish_fn)(struct peer *peer, const Dlshare__Frame *f,
				 int *fds, unsigned nfds,
				 struct registry_manifest *manifest);

/* Handles the manifest of f (a Create or Publish whose manifest field is
 * set): the last of fds[0..nfds) is the manifest's memfd, the others are
 * the buffers'. Takes over every fd. Answers with an error now or after
 * the check, or calls finish. */
void mcheck_request(struct peer *peer, const Dlshare__Frame *f, int *fds,
		    unsigned nfds, mcheck_finish_fn finish);

/* peer is closing: its running jobs end without it, its waiting ones are
 * dropped. */
void mcheck_peer_closed(struct peer *peer);

/* Frees what is left at shutdown (nothing, once the loop ran dry). */
void mcheck_deinit(struct daemon *d);

#endif
