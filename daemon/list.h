/* list — List requests: the names under a prefix that the peer may read,
 * after a given name, in order, one page (at most list_page names) per
 * answer. A page costs one walk of the name map and memory for one page,
 * never for every name. Loop thread only.
 */
#ifndef DLSHARE_LIST_H
#define DLSHARE_LIST_H

#include <stdint.h>

#include "peer.h"

/* Answers a List of peer. */
void list_request(struct peer *peer, uint64_t id, const Dlshare__List *m);

#endif
