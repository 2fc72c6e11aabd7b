/* metrics — the daemon's counters for monitoring (protocol 1.5, StatsReply
 * fields 40-49): requests by type, errors by request type and code, limit
 * hits by limit, peers cut off by reason. Each table is fixed in size and
 * indexed by an enum, so a count costs one array increment on the loop and
 * nothing a peer sends can add a row. The names of the rows are the label
 * values `dlsharectl metrics` prints.
 *
 * struct daemon embeds one; dispatch counts through these calls. What the
 * registry already holds (names, buffers by kind and device, per-uid
 * usage) is read from it when a Stats asks. Loop thread only.
 */
#ifndef DLSHARE_METRICS_H
#define DLSHARE_METRICS_H

#include <stdint.h>

/* Request types, the rows of requests and errors. 0 is every frame that
 * is no request the daemon knows, and errors sent outside of one. */
enum metrics_req {
	METRICS_REQ_OTHER = 0,
	METRICS_REQ_HELLO,
	METRICS_REQ_CREATE,
	METRICS_REQ_SEAL,
	METRICS_REQ_ABORT,
	METRICS_REQ_PUBLISH,
	METRICS_REQ_GET,
	METRICS_REQ_TAKE,
	METRICS_REQ_RELEASE,
	METRICS_REQ_DELETE,
	METRICS_REQ_LIST,
	METRICS_REQ_STAT,
	METRICS_REQ_STATS,
	METRICS_REQ_GOODBYE,
	METRICS_REQ_WATCH,
	METRICS_REQ_UNTAKE,
	METRICS_REQ_CHANNEL,
	METRICS_REQ_N
};

/* Error codes: column -code for DLSHARE_EINVAL (-1) .. DLSHARE_EFORK
 * (-18); column 0 for a code outside that range. */
#define METRICS_CODES 19

/* The limits a refusal names, by the option that sets them (the label
 * value). Each place that refuses at a limit says which one (struct
 * refusal, peer_limit_hit), so a new limit is a row here, a name below
 * and its refusals passing it. METRICS_LIMIT_OTHER: an ELIMIT no one
 * named, or a refusal at no limit (a bad fd, a queue of another mode). */
enum metrics_limit {
	METRICS_LIMIT_OTHER = 0,
	METRICS_LIMIT_MAX_CONNECTIONS,
	METRICS_LIMIT_UID_CONNECTIONS,
	METRICS_LIMIT_MAX_INFLIGHT,
	METRICS_LIMIT_MAX_TENSORS,     /* or max-buffers: one refusal */
	METRICS_LIMIT_MAX_BUFFER_BYTES,
	METRICS_LIMIT_MAX_PACKET,      /* a reply would not fit a packet */
	METRICS_LIMIT_MAX_BYTES,
	METRICS_LIMIT_MAX_OPEN_FDS,
	METRICS_LIMIT_MAX_PENDING,
	METRICS_LIMIT_MAX_LEASES,
	METRICS_LIMIT_MAX_OUT_FDS,
	METRICS_LIMIT_MAX_TTL,
	METRICS_LIMIT_MAX_QUEUE_DEPTH,
	METRICS_LIMIT_QUEUE_FULL,      /* a queue name's own depth */
	METRICS_LIMIT_UID_NAMES,
	METRICS_LIMIT_UID_LEASES,
	METRICS_LIMIT_UID_PENDING,
	METRICS_LIMIT_UID_FDS,
	METRICS_LIMIT_UID_OPEN_FDS,
	METRICS_LIMIT_UID_HOST_BYTES,
	METRICS_LIMIT_UID_GPU_BYTES,
	METRICS_LIMIT_UID_LEASED_BYTES,
	METRICS_LIMIT_UID_LEASED_GPU_BYTES,
	METRICS_LIMIT_UID_MANIFEST_BYTES,
	METRICS_LIMIT_BOARD_SLOTS,     /* no refusal: a get answered without
					* a board token (protocol 1.7) */
	METRICS_LIMIT_N
};

/* Why the daemon cut a peer off (conn_fail's reason, classified). A peer
 * that hung up, or a daemon that shuts down, is no cut. */
enum metrics_cut {
	METRICS_CUT_OTHER = 0,
	METRICS_CUT_SLOW_READER,   /* its output or fd queue passed the limit */
	METRICS_CUT_OVERSIZE,      /* a packet over max-packet or max-fds */
	METRICS_CUT_BAD_FRAME,     /* undecodable, or fds not as it said */
	METRICS_CUT_PROTOCOL,      /* no Hello first, id 0, fds where none go */
	METRICS_CUT_VERSION,       /* a protocol major this daemon lacks */
	METRICS_CUT_HELLO_TIMEOUT,
	METRICS_CUT_IO_ERROR,      /* send, receive or poll failed */
	METRICS_CUT_DAEMON_ERROR,  /* out of memory, no fd to dup or to
				    * receive a packet's fds */
	METRICS_CUT_N
};

/* A refusal, as the code that refused says it: the reason its Error
 * gives (a static string, or NULL) and the limit it hit. The registry,
 * conn and peer fill one through their `why` argument; reply_err_why
 * sends it and counts the limit. */
struct refusal {
	const char *why;
	enum metrics_limit limit;
};

struct metrics {
	uint64_t requests[METRICS_REQ_N];
	uint64_t errors[METRICS_REQ_N][METRICS_CODES];
	uint64_t limits[METRICS_LIMIT_N];
	uint64_t cut[METRICS_CUT_N];
};

/* Frame.body_case (a field number below 64) to its request type. */
extern const uint8_t metrics_req_of_body[64];

static inline enum metrics_req metrics_req_of(unsigned body_case)
{
	return body_case < 64 ? (enum metrics_req)metrics_req_of_body[body_case]
			      : METRICS_REQ_OTHER;
}

static inline void metrics_error(struct metrics *m, enum metrics_req req,
				 int code)
{
	unsigned col = code < 0 && code > -METRICS_CODES ? (unsigned)-code : 0;

	m->errors[req < METRICS_REQ_N ? req : 0][col]++;
}

/* The reason a conn failed for (struct conn: why), as a cut; -1 when it is
 * none (the peer hung up, or why is NULL). */
int metrics_cut_of(const char *why);

/* Row names: label values. */
const char *metrics_req_name(enum metrics_req r);
const char *metrics_code_name(unsigned col);
const char *metrics_limit_name(enum metrics_limit l);
const char *metrics_cut_name(enum metrics_cut c);

#endif
