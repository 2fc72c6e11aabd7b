/* dispatch — what the daemon does with each request: the meaning layer
 * between conn (packets) and registry (model), including parked gets and the
 * events pushed to peers. Loop thread only.
 */
#ifndef DLSHARE_DISPATCH_H
#define DLSHARE_DISPATCH_H

#include "conn.h"
#include "registry.h"

/* Handles one decoded frame of c (a request with a NUL inside a string is
 * refused, see wire_msg.nul_field). Takes over fds (closed or kept). c may
 * be closing on return. */
void dispatch_frame(struct conn *c, const struct wire_msg *m, int *fds,
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
/* The answer to a Seal or Abort that found no pending version: which one
 * it looked for (by writer id, or by name and number), and the ways it can
 * have gone. */
void dispatch_reply_no_pending(struct conn *c, uint64_t id, const char *what,
			       const char *name, uint64_t number,
			       uint64_t writer);
void dispatch_reply_err(struct conn *c, uint64_t id, int err,
			const char *what, const char *name);

#endif
