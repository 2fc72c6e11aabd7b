/* internal — what the relay's loop and connections (relay.c), serving
 * (serve.c) and mirroring (mirror.c) share: the objects, and the functions
 * each calls in the others. Loop thread, unless a comment says otherwise.
 */
#ifndef DLSHARE_RELAY_INTERNAL_H
#define DLSHARE_RELAY_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>
#include "hashtab.h" /* uthash with keyed hashes: names come from peers */

#include <dlshare/dlshare.h>

#include "auth.h"
#include "config.h"
#include "msg.h"

#define TICK_MS 100
#define MAX_TENSORS 1000000u   /* per offer, as the daemon's bundles */
#define MAX_NDIM 32
#define COALESCE_GAP 256       /* bytes of padding a get may span */
#define BACKOFF_MIN_MS 50
#define STAGE_SLOTS_MAX 32   /* --stage-slots' upper bound; a u32 mask */
#define WATCH_WAIT_MS 500    /* a serving thread's Watch waits this long
			      * at most, so that it notices a cancel */
#define DNOTE_MAX 64         /* DELETEDs of a subscription queued or not
			      * yet answered (DELETED_DONE): its thread
			      * waits at this many, a mirror that gets
			      * more fails the peer */

/* Lines on stderr with sd-daemon priority prefixes. Any thread. */
void relay_log(int prio, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
#define log_err(...) relay_log(3, __VA_ARGS__)
#define log_warn(...) relay_log(4, __VA_ARGS__)
#define log_info(...) relay_log(6, __VA_ARGS__)

/* CLOCK_MONOTONIC in ms. Any thread. */
uint64_t relay_now_ms(void);


struct relay;
struct conn;

/* Why a pull failed (dlshare_relay_transfers_failed_total{side="mirror"}) */
enum relay_fail {
	RF_PEER_LOST, RF_ORIGIN_ABORT, RF_DAEMON, RF_TRANSFER, RF_CUDA,
	RF_OTHER, RF_MIRROR_N
};
/* ... and why an offer was not pulled ({side="serve"}) */
enum relay_serve_fail {
	RS_PEER_LOST, RS_PEER_FAILED, RS_TIMEOUT, RS_STAGING, RS_NOT_OFFERED,
	RS_N
};

/* The relay's counters (metrics.c writes them); loop only unless said. */
struct relay_metrics {
	uint64_t mirrored, skipped, pulled_bytes;
	uint64_t served, served_bytes;
	uint64_t mirror_failed[RF_MIRROR_N];
	uint64_t serve_failed[RS_N];
	uint64_t not_offered_threads;   /* serving threads' refusals; atomic */
	uint64_t auth_failures;
	uint64_t device_versions[2][2]; /* [side: 0 serve, 1 mirror]
					 * [path: 0 stage, 1 direct] */
	uint64_t next_ms;               /* the next write */
	bool warned;
};

/* A version by name, in a uthash table: what a subscription offered
 * (serve.c, its thread only), the newest origin version each mirrored name
 * got (mirror.c, the loop only). nv_set keeps the old entry when out of
 * memory; nv_get says 0 for a name not there. */
struct name_version {
	UT_hash_handle hh;
	uint64_t version;
	char name[];
};

void nv_set(struct name_version **t, const char *name, uint64_t v);
uint64_t nv_get(struct name_version *t, const char *name);
void nv_clear(struct name_version **t);

enum sub_state {
	SUB_SCAN,     /* the thread looks for a new version */
	SUB_READY,    /* the thread holds a lease; the loop is to offer it */
	SUB_SENT,     /* offered; the loop waits for DONE */
	SUB_RELEASE,  /* the loop is done with it; the thread frees it */
	SUB_EXITED,   /* the thread ended; the loop joins it */
};

/* A deletion at this node for a peer's subscription (relay protocol 1.7),
 * from the subscription's thread to the loop: r->dnotes, under r->mu. */
struct dnote {
	struct dnote *next;
	struct sub *s;
	uint64_t conn_id;
	uint32_t sub_id;
	char name[256];
};

/* One prefix one peer follows on this (serving) node: a thread that finds
 * new versions and leases them, one at a time. */
struct sub {
	struct relay *r;
	struct sub *next_ready;   /* r->ready, under r->mu */
	struct sub *next;         /* the conn's or r->zombies; loop only */
	uint64_t conn_id;
	uint32_t sub_id;
	char prefix[RELAY_PREFIX_MAX + 1];
	pthread_t th;
	pthread_cond_t cv;
	/* under r->mu */
	enum sub_state state;
	bool cancel;
	dlshare_bundle *bundle;
	char name[256];
	/* loop only */
	uint64_t offer_id;
	uint64_t offer_bytes;     /* the offer's tensor bytes (metrics) */
	bool abort_sent;          /* its staging failed (metrics) */
	ucp_mem_h *memh;
	uint32_t nmemh;
	uint64_t sent_ms;
	unsigned ndnotes;         /* its DELETEDs queued or unanswered;
				   * under r->mu */
	/* With Watch, two threads: the watcher (th) and the hot thread
	 * (hot_th, a waiting get on the name offered last, which hands its
	 * next version over one daemon round trip sooner than a watch and a
	 * get). olock serialises their offers and guards seen, hot and
	 * last; hcv is the hot thread's own sleep. */
	pthread_t hot_th;
	bool hot_started;         /* watcher only */
	bool hot_stop;            /* the daemon refused the watch for lack
				   * of room (ELIMIT): the hot thread ends;
				   * under olock */
	pthread_mutex_t olock;
	pthread_cond_t hcv;
	/* thread only (the scan), or under olock (Watch) */
	struct name_version *seen;
	char hot[256];
	char last[256];
	/* a device version staged through pinned host memory (stage.c) */
	struct stage *stg;        /* the thread's ring; NULL until needed */
	bool staged;              /* the offer is staged; set by the thread
				   * before SUB_READY, read by the loop */
	uint32_t stg_free;        /* slots the peer gave back; under r->mu */
	struct stage_chunk {
		uint64_t off;
		uint32_t slot, len;
	} stg_q[STAGE_SLOTS_MAX]; /* copied chunks for the loop; under r->mu */
	unsigned stg_nq;          /* under r->mu */
	bool stg_queued;          /* on r->chunky; under r->mu */
	struct sub *next_chunky;  /* under r->mu */
	/* a device version got straight from device memory (direct.c) */
	bool direct;              /* set at SUBSCRIBE: both relays said
				   * CAPS_DEVICE_GET; immutable */
	bool direct_offer;        /* the offer is of device memory; set by
				   * the thread before SUB_READY */
	uint32_t stg_out;         /* slots sent to the peer, not yet freed;
				   * loop only */
	bool stg_failed;          /* staging failed: the loop tells the peer
				   * (ABORT, minor >= 7); under r->mu */
	char stg_why[120];        /* why; under r->mu */
};

struct region {
	uint64_t addr, len;
	const uint8_t *data;      /* inline (1.6): len bytes in the OFFER */
	const uint8_t *rkey_buf;
	uint32_t rkey_len;
	ucp_rkey_h rkey;
};

/* A staged offer's chunk on the mirroring side: one ring slot. */
struct pchunk {
	struct pull *p;
	uint64_t off;             /* in the version's byte stream */
	uint32_t len;
	unsigned pending;         /* gets outstanding */
	enum { PC_EMPTY, PC_QUEUED, PC_ISSUED, PC_COPYING } st;
	size_t ct;                /* the tensor and offset it starts at */
	uint64_t ctoff;
	int copied;               /* the host→device copy ran (atomic: set
				   * by a CUDA host function) */
};

struct job {
	uint8_t *dst;
	uint64_t src;
	uint64_t len;
	uint32_t region;
};

enum pull_state {
	P_CREATING,  /* dlshare_create on the daemon worker */
	P_PULLING,   /* gets */
	P_CLOSING,   /* dlshare_seal or dlshare_writer_abort on the worker */
	P_DELETING,  /* a DELETED: stat and delete on the daemon worker */
};

/* One version being pulled into this node's daemon. */
struct pull {
	struct pull *next;
	struct pull *next_job;    /* r->jobs or r->done, under r->mu */
	struct pull *next_early;  /* r->early, under r->mu */
	bool released;            /* DONE sent early (inline); loop only */
	enum pull_state st;
	bool busy;                /* on the worker: not to be freed */
	uint64_t sealed;          /* the local version, once sealed */
	/* the create's inputs, until it ran */
	dlshare_tensor_spec *spec;
	int64_t *shapes;
	uint64_t *toff, *tlen;
	uint32_t *treg;
	uint32_t ntensors;
	struct conn *c;
	void *msg;                /* the OFFER (rkeys point into it) */
	char *keys;               /* NUL-ended copies of its keys */
	uint32_t sub_id;
	uint64_t offer_id;
	char name[256];
	uint64_t origin_version;
	struct region *regions;
	uint32_t nregions;
	dlshare_writer *w;
	struct job *jobs;
	size_t njobs, cur;
	uint64_t cur_off;
	uint64_t bytes;
	unsigned inflight;
	bool failed;
	bool all_inline;          /* every region inline: the worker copies */
	bool check_origin;        /* no record of the name: stat it first */
	bool skipped;             /* the daemon has it already: DONE 1 */
	char why[160];
	/* a staged offer (MSG_OFFER_STAGED): bytes come through the serving
	 * relay's ring of pinned slots, in stream order (stage.c) */
	bool staged;
	uint32_t nslots, slot_size;
	uint64_t stream_len;      /* all tensors' bytes, back to back */
	uint64_t recv_pos;        /* end of the last CHUNK announced */
	uint64_t issue_pos;       /* end of the last chunk whose gets went out */
	uint64_t got;             /* bytes of chunks whose gets completed */
	size_t cur_t;             /* the tensor issue_pos is in, and where */
	uint64_t cur_toff;
	struct pchunk *chunks;    /* nslots */
	/* --device cuda:N: gets land in this pinned ring (the slots'
	 * layout), then are copied host→device on mstream (stage.c) */
	void *mring, *mstream;
	/* an OFFER_DEVICE (direct.c): gets from the peer's device memory,
	 * into the writer's device memory (wmemh, registered) or host */
	bool direct;
	ucp_mem_h wmemh;
	unsigned copies;          /* host functions queued (loop) */
	unsigned copies_done;     /* ... and run (atomic) */
	char aborted[160];        /* the origin's ABORT (minor 7) of a busy
				   * pull, until the worker gave it back;
				   * loop only */
};

enum conn_state {
	C_HELLO,     /* server: awaiting CHALLENGE; mirror: awaiting PROOF_S */
	C_PROOF,     /* server: awaiting PROOF_M; mirror: awaiting WELCOME */
	C_READY,
	C_DEAD,      /* closing: waits for its gets and close to finish */
};

struct inmsg {
	struct inmsg *next;
	uint64_t conn_id;
	size_t len;
	uint8_t data[];
};

struct conn {
	struct conn *next;
	struct relay *r;
	uint64_t id;
	ucp_ep_h ep;
	bool serving;             /* accepted on --listen */
	int upstream;             /* mirror: index of the --connect, else -1 */
	enum conn_state state;
	char peer[80];
	char node[RELAY_NODE_MAX + 1];
	uint8_t nonce_m[RELAY_NONCE_LEN], nonce_s[RELAY_NONCE_LEN];
	uint64_t deadline_ms;     /* to authenticate */
	size_t queued;            /* bytes of received, unhandled messages */
	/* serving */
	struct sub *subs;
	uint32_t nsubs;
	uint32_t refused;         /* SUBSCRIBEs refused (--max-subscriptions) */
	/* mirroring */
	struct pull *pulls;
	void *close_req;
	bool closed;              /* ucp_ep_close_nbx was called */
	uint16_t peer_minor;      /* the relay protocol minor the peer speaks */
	bool flush;               /* close after what was sent went out */
	ucs_status_t lost;        /* the endpoint failed (UCS_OK: no) */
	unsigned recvs;           /* rendezvous receives outstanding */
	unsigned ndeleting;       /* mirror: DELETEDs not yet answered */
	uint32_t peer_caps;       /* the peer's CAPS (0: none, or minor < 8) */
	bool caps_got;            /* its CAPS came (at most one) */
	uint32_t caps_sent;       /* what our CAPS said */
};

struct upstream {
	struct conn *c;
	uint64_t retry_ms;
	uint32_t backoff_ms;
	struct sockaddr_storage sa;
	socklen_t salen;
	bool warned;
};

struct pending_req {
	struct pending_req *next;
	ucp_conn_request_h req;
};

struct relay {
	const struct relay_config *cfg;
	struct relay_key key;
	char node[RELAY_NODE_MAX + 1];
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_listener_h listener;
	int epfd, ucx_fd, evfd, sigfd, tfd;
	dlshare_client *dl;
	char sock[108];
	struct conn *conns;
	uint64_t next_id;
	struct inmsg *in_head, *in_tail;
	struct pending_req *reqs;
	struct upstream up[RELAY_MAX_CONNECT];
	struct name_version *known;
	struct sub *zombies;
	unsigned inflight;
	uint64_t next_offer;
	uint32_t nserving;
	/* failed authentications: a window of a minute */
	uint64_t authlog_start;
	uint32_t authlog_n, authlog_dropped;
	bool stop;
	/* direct.c: whether this relay says CAPS_DEVICE_GET, and the UCX
	 * memory type it registers device memory as */
	bool gpu_direct;
	ucs_memory_type_t dev_mem_type;
	pthread_mutex_t mu;
	struct sub *ready;        /* under mu */
	struct sub *chunky;       /* subs with staged chunks to send; under mu */
	struct dnote *dnotes, **dnotes_tail; /* deletions to send; under mu */
	/* the daemon worker: creates, seals and aborts of pulls, so that the
	 * loop never waits for the daemon (a 256 MiB create populates its
	 * pages) */
	pthread_t worker_th;
	bool worker_started;
	pthread_cond_t jobcv;
	struct pull *jobs, *done;  /* under mu */
	struct pull *early;        /* inline pulls copied, not yet sealed */
	bool worker_stop;          /* under mu */
	struct relay_metrics m;
};

/* relay.c: connections */

/* Marks c dead (once; the reason is logged): its subscriptions are
 * cancelled, its pulls fail, its endpoint is closed; it is freed once
 * nothing of it is outstanding. */
void conn_fail(struct conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Sends the finished message w (consumed). Returns 0 or -1 (c failed). */
int conn_send(struct conn *c, struct wbuf *w);
/* Sends ERROR code text. */
void conn_error(struct conn *c, uint32_t code, const char *text);
struct conn *conn_by_id(struct relay *r, uint64_t id);
/* A failed authentication: logged (rate-limited), ERROR 2, c dead. */
void conn_auth_failed(struct relay *r, struct conn *c, const char *why);

/* serve.c: this node's names to peers */

/* The loop is done with s's offer: unregisters its memory, lets the
 * thread release the lease. */
void serve_release(struct relay *r, struct sub *s);
/* Offers what the serving threads found. */
void serve_drain(struct relay *r);
/* Joins the threads of cancelled subscriptions that ended. */
void serve_reap(struct relay *r);
/* A message from a peer that connected to --listen. */
void serve_msg(struct relay *r, struct conn *c, uint16_t type,
	       struct rbuf *rb);

/* mirror.c: peers' names into this node */

/* p has no get outstanding: seal it, or abort it, on the worker. */
void mirror_close(struct relay *r, struct pull *p);
/* What the daemon worker finished: pulls started, answered, freed. */
void mirror_done(struct relay *r);
/* Issues gets of every pull, closes those that are done. */
void mirror_run(struct relay *r);
/* The daemon worker thread (creates, seals, aborts). */
void *mirror_worker(void *arg);
/* A message from a peer this relay connected to; an OFFER keeps *msg. */
void mirror_msg(struct relay *r, struct conn *c, uint16_t type,
		struct rbuf *rb, struct inmsg **msg);

/* direct.c: device versions straight between device memories */

/* After ucx_init: whether this relay can register device memory (its UCX
 * context's memory types hold CUDA, or the test hook), and what
 * --gpu-path makes of it. Returns 0, or -1 after logging why --gpu-path
 * direct cannot be had. */
int direct_init(struct relay *r);
/* The CAPS flags this relay says to a peer. */
uint32_t direct_caps(const struct relay *r);
/* Sends our CAPS to c (a peer of minor >= 8). */
void direct_caps_send(struct relay *r, struct conn *c);
/* A CAPS from c. Returns 0, or -1 (a second one: a protocol error). */
int direct_caps_recv(struct relay *r, struct conn *c, struct rbuf *rb);
/* Registers len bytes at addr, memory of the given type (host, or
 * r->dev_mem_type for device memory), for gets (prot: UCP's LOCAL/REMOTE
 * READ/WRITE bits). Returns UCS_OK or the UCX error. */
ucs_status_t direct_map(struct relay *r, void *addr, uint64_t len,
			unsigned prot, ucs_memory_type_t type, ucp_mem_h *out);
/* Mirroring side, loop: p's writer is of device memory: registers its
 * buffer, into which the gets go. Returns 0 or -1 (p->why set). */
int direct_pull_map(struct relay *r, struct pull *p);
/* Mirroring side, loop: p's registration goes (before its seal). */
void direct_pull_unmap(struct relay *r, struct pull *p);

/* metrics.c: --metrics-file */

/* Writes the file when --metrics-interval-s passed since the last write,
 * or at once when now. */
void metrics_tick(struct relay *r, bool now);
/* The reason of a pull's failure, from its why. */
enum relay_fail metrics_reason_of(const char *why);

/* stage.c: device versions through pinned host memory */

/* Thread of s: b holds device tensors. Loads CUDA, makes s's stream and,
 * unless s->direct, its ring (once per subscription), and orders the
 * stream after the producer's work: a staged offer's copies wait for it,
 * a direct one's gets after the host waited for it here. Returns 0
 * (s->staged or s->direct_offer set), or -1 after logging why b cannot be
 * offered. */
int stage_prepare(struct sub *s, dlshare_bundle *b);
/* Thread of s, r->mu held: copies chunks of b into free slots and queues
 * them for the loop until the loop released s. */
void stage_serve(struct sub *s, dlshare_bundle *b);
/* Thread of s, at its end: frees the ring (no longer registered). */
void stage_free(struct sub *s);
/* Loop: the ring's address and size, for the offer. */
void stage_ring(struct sub *s, void **addr, uint64_t *len, uint32_t *nslots,
		uint32_t *slot_size);
/* Loop: s is about to be freed: off r->chunky. */
void stage_forget(struct relay *r, struct sub *s);
/* Loop: sends the CHUNK messages the threads queued. */
void stage_drain(struct relay *r);
/* Loop: a FREE from the peer. Returns 0, or -1 (not a slot it holds). */
int stage_freed(struct relay *r, struct conn *c, uint64_t offer_id,
		uint32_t slot);
/* Mirroring side, loop: an ABORT of one of c's pulls (the origin's
 * staging failed): the pull fails with the origin's reason. */
void stage_aborted(struct relay *r, struct conn *c, struct rbuf *rb);
/* Mirroring side, loop: a REFUSED subscription: logged. */
void mirror_refused(struct relay *r, struct conn *c, struct rbuf *rb);
/* Mirroring side, loop: a CHUNK for one of c's pulls. Returns 0, or -1
 * after failing c. */
int stage_chunk(struct relay *r, struct conn *c, struct rbuf *rb);
/* Mirroring side, loop: issues gets of announced chunks, sends FREE for
 * those done. */
void stage_pump(struct relay *r, struct pull *p);
/* Mirroring side, loop: nothing of p is outstanding (gets, copies). */
bool stage_idle(struct pull *p);
/* Mirroring side, daemon worker: after the create of a pull into a GPU,
 * its stream (the seal's) and, for a staged pull, its pinned ring.
 * Returns 0 or -1 (p->why set). */
int stage_mirror_setup(struct relay *r, struct pull *p);
/* Mirroring side, daemon worker: waits for p's copies, frees the ring. */
void stage_mirror_teardown(struct pull *p);

#endif
