/* dispatch — the front door of the meaning layer between conn (packets)
 * and registry (model). Its conn callbacks take each whole frame of a peer
 * (the framing rules: Hello first, ids, which requests carry fds, no NUL
 * inside a string) to the module that handles it: get.c, list.c, create.c,
 * seal.c, or the small requests here (Hello, Publish, Abort, Release,
 * Delete, Stat, Stats, Goodbye); and cancel a closing peer's requests.
 * Its registry callbacks push what the registry tells: parked gets
 * answered, Retired to an exporter, BufferGone to the peers holding a
 * freed buffer. server.c gives both tables. Loop thread only.
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

/* Wires the request modules' calls to each other that go through d (a
 * Create refused for a full queue after its buffers were made goes back
 * to queue.c's gate: d->create_full). After daemon_init. */
void dispatch_init(struct daemon *d);

/* Frees whatever the request modules still keep in d at shutdown. */
void dispatch_deinit(struct daemon *d);

#endif
