/* dispatch — what the daemon does with each request: the meaning layer
 * between conn (packets) and registry (model), including parked gets and the
 * events pushed to peers. Loop thread only.
 */
#ifndef DLSHARE_DISPATCH_H
#define DLSHARE_DISPATCH_H

#include "conn.h"
#include "registry.h"

/* Handles one decoded frame of c. Takes over fds (closed or kept). c may be
 * closing on return. */
void dispatch_frame(struct conn *c, Dlshare__Frame *f, int *fds,
		    unsigned nfds);

/* Cancels the parked gets and waiting seals of a closing conn. */
void dispatch_conn_closed(struct conn *c);

/* Frees whatever the waiters map still holds at shutdown. */
void dispatch_deinit(struct server *s);

/* Registry callbacks (the server's ud is the struct server). */
extern const struct registry_ops dispatch_registry_ops;

/* The DLSHARE_E* code for a -errno from the registry or a backend. */
int dispatch_code(int err);

/* Answers request id of c with an Error for err: "WHAT NAME: why", naming
 * the limit and the uid for a quota (what and name may be NULL). */
void dispatch_reply_err(struct conn *c, uint64_t id, int err,
			const char *what, const char *name);

#endif
