/* dispatch — what the daemon does with each request: the meaning layer
 * between conn (packets) and registry (model), including parked gets and the
 * events pushed to peers. Its callbacks are what server.c gives the
 * registry and the conns. Loop thread only.
 */
#ifndef DLSHARE_DISPATCH_H
#define DLSHARE_DISPATCH_H

#include "conn.h"
#include "daemon.h"
#include "peer.h"
#include "registry.h"

/* Registry callbacks (their ud is the struct daemon). */
extern const struct registry_ops dispatch_registry_ops;

/* Conn callbacks: each conn is a struct peer's (peer_new). */
extern const struct conn_ops dispatch_conn_ops;

/* Frees whatever the request modules still keep in d at shutdown. */
void dispatch_deinit(struct daemon *d);

/* The DLSHARE_E* code for a -errno from the registry or a backend. */
int dispatch_code(int err);

/* Answers request id of peer with an Error for err: "WHAT NAME: why"
 * (what and name may be NULL). */
void dispatch_reply_err(struct peer *peer, uint64_t id, int err,
			const char *what, const char *name);

/* The answer to a Seal or Abort that found no pending version: which one
 * it looked for (by writer id, or by name and number), and the ways it can
 * have gone. */
void dispatch_reply_no_pending(struct peer *peer, uint64_t id,
			       const char *what, const char *name,
			       uint64_t number, uint64_t writer);

#endif
