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

#endif
