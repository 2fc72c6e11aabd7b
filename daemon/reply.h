/* reply — how the daemon answers a request: the DLSHARE_E* code of a
 * -errno, and Error messages that say what the peer cannot see (the limit
 * and the uid of a quota, the owner and mode of a name it may not use, why
 * its fd is refused). Every request module answers through it. Loop thread
 * only.
 */
#ifndef DLSHARE_REPLY_H
#define DLSHARE_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "peer.h"

/* The DLSHARE_E* code for a -errno from the registry or a backend. */
int reply_code(int err);

/* Sends f as the answer to request id. Returns as conn_send. */
int reply_send(struct peer *peer, uint64_t id, Dlshare__Frame *f);

/* Answers request id with Ok; nothing for id 0 (a Release). */
void reply_ok(struct peer *peer, uint64_t id);

/* Answers request id with an Error for err: "WHAT NAME: reason" (what and
 * name may be NULL; nothing for id 0). why is the refusal (registry_add,
 * registry_lease, conn_may_queue_fds; or NULL): for a quota its reason
 * names the limit, with the peer's uid; for a refused fd what is wrong
 * with it. For -EPERM the message names the name's owner and mode. A
 * refusal at a limit counts in the metrics as why->limit says. */
void reply_err_why(struct peer *peer, uint64_t id, int err,
		   const struct refusal *why, const char *what,
		   const char *name);

/* reply_err_why for a refusal at a limit that gives no reason of its own. */
void reply_limit(struct peer *peer, uint64_t id, int err,
		 enum metrics_limit limit, const char *what, const char *name);

/* reply_err_why with no reason. */
void reply_err(struct peer *peer, uint64_t id, int err, const char *what,
	       const char *name);

/* Whether a reply describing the version that f (a Create or a Publish)
 * describes fits in a packet. */
/* Answers id with the error of a full queue name (registry_add's
 * -EAGAIN): the name, its depth, what fills it, and, when it waited
 * (waited_ms > 0), for how long: DLSHARE_ETIMEDOUT then, else
 * DLSHARE_ELIMIT. */
void reply_queue_full(struct peer *peer, uint64_t id, const char *what,
		      const char *name, uint32_t waited_ms);

int reply_fits(const struct peer *peer, const Dlshare__Frame *f);

/* Refuses a version two of whose tensors share a key: the second would be
 * reachable only by its index. Over max_tensors the registry refuses it
 * anyway, and nothing is allocated for it here. Returns 1 when it
 * answered, else 0. */
int reply_refuse_same_keys(struct peer *peer, uint64_t id, const char *what,
			   const char *name, Dlshare__Tensor *const *t,
			   size_t n);

/* The answer to a Seal or Abort that found no pending version: which one
 * it looked for (by writer id, or by name and number), and the ways it can
 * have gone. */
void reply_no_pending(struct peer *peer, uint64_t id, const char *what,
		      const char *name, uint64_t number, uint64_t writer);

#endif
