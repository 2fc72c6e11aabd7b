/* internal — what the modules of libdlshare share behind the public API.
 *
 * A dlshare_client owns one socket and one receiver thread. One thread at
 * a time holds the reader role: it reads every packet, in order, imports
 * the buffers a reply names into the cache (so a later reply that names a
 * buffer without its fd always finds it), hands replies to their slots and
 * handles pushes (Retired, BufferGone). A caller that has sent its request
 * and finds no reader takes the role and reads its own reply (and whatever
 * comes before it), then hands the role on to another waiting caller; the
 * receiver thread takes it only while no call is being made, for the
 * pushes. Export deleters (Retired) and queued releases always run on the
 * receiver thread. Deleters never block: they send their Release when the
 * socket is free, else queue it for the receiver thread. Everything in
 * struct dlshare_client below `lock` is protected by it.
 */
#ifndef DLSHARE_CLIENT_INTERNAL_H
#define DLSHARE_CLIENT_INTERNAL_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "hashtab.h"

#include <dlshare/dlshare.h>

#include "check.h"
#include "wire.h"

/* Every public call that may reach a cancellation point (a close, a
 * condition wait, a join, a write to the receiver thread's eventfd) and
 * every deleter runs with cancellation off (dlshare.h, "Threads"): a
 * pthread_cancel() meanwhile acts at the caller's next cancellation point
 * after the call, never inside it, where the thread would end holding its
 * client's locks, reader role or a lease. The calls' socket I/O goes by
 * syscall(2) (wire.c), no cancellation point either way. First line of
 * the function: CALL_UNCANCELLED; (a nested call leaves the state as it
 * found it). */
static inline int cancel_off(void)
{
	int old = PTHREAD_CANCEL_DISABLE;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	return old;
}

static inline void cancel_back(const int *old)
{
	if (*old == PTHREAD_CANCEL_ENABLE)
		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
}

#define CALL_UNCANCELLED \
	const int call_cancel_state __attribute__((cleanup(cancel_back))) = \
		cancel_off()

/* The longest dlshare_last_error() message, with its NUL. */
#define CLIENT_ERRMSG_MAX 512

/* Most buffers one version may have, whatever a daemon says. */
#define CLIENT_PINS_MAX 64

/* One buffer this process has mapped, shared by every tensor on it. */
struct ibuf {
	uint64_t id;
	int kind;                /* DLSHARE__BUFFER_KIND__* */
	void *base;              /* host: mapping (read-only), NULL for size 0;
				  * CUDA: device pointer of the buffer */
	void *cuda_base;         /* CUDA: the opened allocation (cuda.c) */
	int ordinal;             /* CUDA: local device */
	int cuda_host;           /* host mapping registered with CUDA
				  * (kDLCUDAHost) */
	uint64_t size;
	int refs;                /* leases using it (pins) */
	int gone;                /* the daemon freed it: drop at refs 0 */
	UT_hash_handle hh;
};

/* 1.5: a manifest memfd the daemon sent this connection once (Get with
 * manifest_cache), kept by its id in c->mcaches until the daemon frees it
 * (BufferGone), together with what bundle.c built from it the first time:
 * the checked mapping, the tensors and their key index. Bundles share it
 * read-only, so a warm get of a version already seen costs no fd, no
 * mapping and no check. refs is atomic (a bundle may go on any thread);
 * the hash is under c->lock. */
struct mcache {
	uint64_t id;
	atomic_int refs;         /* the cache's, plus one per reply or bundle */
	UT_hash_handle hh;       /* c->mcaches, until BufferGone */
	pthread_mutex_t mu;      /* the first get builds it, others wait */
	int fd;                  /* the memfd until built, then -1 */
	int state;               /* 0: not built, 1: built, else the
				  * DLSHARE_E* its build failed with */
	char why[256];           /* ...and what was wrong */
	void *built;             /* bundle.c's view of it */
};

/* A new cache entry for the manifest memfd fd (taken: closed on failure
 * too) with id; one reference. Returns it or NULL. */
struct mcache *mcache_new(uint64_t id, int fd);
/* Drops a reference; the last frees it. Any thread, no lock. */
void mcache_unref(struct mcache *m);

/* Tensors published without a copy, kept until the daemon retires them. */
struct export {
	char name[CHECK_NAME_MAX + 1];
	uint64_t version;        /* 0 until the PublishReply arrives */
	uint64_t req_id;
	size_t n;
	DLManagedTensor **tensors;
	void *event;             /* CUDA: the event recorded at publish */
	size_t ncuda;
	uint8_t (*cuda_handles)[64]; /* CUDA: allocations exported */
	struct export *next;
};

/* A request waiting for its reply. Its owner and whoever completes it or
 * hands it the reader role hold references, so that a condition variable is
 * signalled after c->lock is dropped and never after its owner freed it. */
struct pending {
	uint64_t id;
	atomic_int refs;
	pthread_cond_t cond;
	struct pending *wnext;   /* a wake list, while referenced for it */
	int done;
	int err;                 /* DLSHARE_E* when done without a reply */
	struct wire_msg *msg;
	int fds[WIRE_FDS_MAX];
	unsigned nfds;
	struct ibuf *pins[CLIENT_PINS_MAX];
	size_t npins;
	struct mcache *mc;       /* GetReply: its cached manifest (1.5) */
	struct export *export;   /* Publish: register it on the reply */
	int lost;                /* the reply came without its fds: this
				  * process had none free (DLSHARE_EMFILE) */
	char why[CLIENT_ERRMSG_MAX]; /* the reader's reason for err, when the
				  * reply came but could not be used ("" for
				  * none): dlshare_last_error() is per thread */
	UT_hash_handle hh;
};

/* Kept gets (struct warm) per connection: of the last names a reader
 * freed, whose releases wait to ride on the next call. A server that
 * reads a few names per request (an encoder's and a decoder's weights, a
 * flag) gets each without a round trip. */
#define CLIENT_WARM_MAX 8
/* Pending store writers of one client whose memfds the library keeps to
 * write-seal them itself at dlshare_seal (the daemon then publishes at
 * once, without a trip to its thread pool); a writer beyond these closes
 * its fd after mapping it, as before, and the daemon seals it on its
 * pool. Bounds the fds the library holds for writers. */
#define CLIENT_SEAL_FDS_MAX 64

/* A get's reply kept for the next get of the same name (protocol 1.7):
 * while the board's word slot holds token, the name's newest version is
 * still the one this reply describes, and its reader may read it. As a
 * lease's seed (struct lease_ref) it holds the reply; once the bundle is
 * freed (kept, in c->warm) also the buffers pinned and the lease, not
 * released: a get of the name takes the lease back instead of asking the
 * daemon, until warm_release_locked queues its release. */
struct warm {
	struct wire_msg *msg;    /* the GetReply's message: a reference */
	struct mcache *mc;       /* its kept manifest, a reference; or NULL */
	uint64_t lease;          /* kept: the lease, still held */
	uint64_t token;
	uint32_t slot;
	uint64_t key;            /* client_warm_name's key of name */
	size_t npins;            /* kept: its buffers, pinned */
	struct ibuf *pins[CLIENT_PINS_MAX];
	char name[256];          /* names are at most 255 bytes: a record
				  * fits any, and is reused (c->warm_spare) */
};

/* A name as the kept set looks it up: computed once per get. */
struct warm_name {
	const char *name;
	size_t len;              /* strlen(name) */
	uint64_t key;            /* equal names, equal keys */
};

struct dlshare_client {
	atomic_int refs;         /* the handle, plus one per lease_ref */
	int fd;
	int wake_fd;             /* eventfd: wakes the receiver thread */
	pthread_t rx;
	int rx_started;
	sem_t *rx_up;            /* posted once the receiver thread runs */
	uint32_t max_packet;     /* largest packet we can receive */
	uint32_t send_max;       /* largest the daemon takes (HelloReply) */
	pthread_mutex_t send_lock;
	uint8_t *rbuf;           /* max_packet bytes, the reader's */
	/* The reader's memory of the last GetReply decoded: a warm get's
	 * reply, the same bytes after its lease each time, is not decoded
	 * again (wire_memo). */
	struct wire_memo memo;
	/* A finished call's pending, kept (its condition variable made) for
	 * the next call: no malloc, zeroing and free of its ~900 bytes per
	 * call. Taken and put back with atomic exchanges, any thread. */
	_Atomic(struct pending *) spare;
	/* The block of the last reply freed, for the next packet's decode
	 * (wire_decode_in): no malloc and free per packet. The same way. */
	_Atomic(struct wire_msg *) spare_msg;

	pthread_mutex_t lock;
	int reading;             /* a thread holds the reader role */
	int rx_reading;          /* ...and it is the receiver thread */
	int piggyback;           /* the daemon takes Frame.releases (1.1) */
	int goodbye;             /* ...and Goodbye (1.2) */
	int manifests;           /* ...and manifest memfds (1.4) */
	int lifetimes;           /* ...and name lifetimes (1.4) */
	int dev_events;          /* ...and events per device (1.4) */
	int queues;              /* ...and queue names (1.4) */
	int origins;             /* ...and versions' origins (1.5) */
	int untakes;             /* ...and Untake (1.6) */
	int watches;             /* ...and Watch (1.6) */
	int unreceived_ok;       /* ...and Frame.unreceived (1.8) */
	uint64_t calls;          /* calls begun, to tell the receiver thread
				  * whether callers are around */
	int closed;              /* dlshare_disconnect() began */
	int dead;                /* the connection is gone */
	int rel_left;            /* dead by dlshare_disconnect only: the
				  * queued releases (nrel) are still its to
				  * send (flush_releases_wait) */
	int64_t deadline;        /* CLOCK_MONOTONIC ms by which the Hello
				  * must be answered, 0 for none */
	int32_t timeout_ms;      /* ...counted from connect() */
	uint64_t next_id;
	/* Calls awaiting their replies, by id, in the order they were
	 * made, after pending_anchor: the anchor (id 0, which no reply
	 * carries) is the table's first entry for the client's life, so
	 * uthash keeps its table (a malloc of 64 bytes and one of 512,
	 * zeroed, and their frees) instead of making it for every call of
	 * a one-call-at-a-time client. oldest_call() (client.c) is the oldest
	 * call. */
	struct pending *pending;
	struct pending pending_anchor;
	/* The call that took the reader role in call_begin, when nobody read
	 * and no other call waited: it reads its own reply and is in no
	 * table (no add, find and delete of it per call). Under lock. */
	struct pending *solo;
	struct ibuf *bufs;
	struct mcache *mcaches;  /* manifests kept by id (1.5) */
	struct export *exports;
	struct export *retired;  /* retired, for the receiver thread to free */
	char fatal_msg[256];     /* the daemon's last word, if any */
	struct lease_ref *deferred; /* released, waiting for their event */
	/* Taken off deferred by the receiver thread, whose releases it has
	 * not queued yet: dlshare_disconnect() waits for them. */
	unsigned deferred_busy;
	uint64_t *rel;           /* lease ids to release */
	size_t nrel, caprel;
	/* Ids of buffers and manifests whose fds a reply attached but this
	 * process could not take (out of fds): told to the daemon on the
	 * next request (Frame.unreceived, 1.8), which then attaches them
	 * again. Under lock. */
	uint64_t *unrecv;
	size_t nunrecv, capunrecv;
	/* Releases ever queued (rel_push; written under lock): a get refused
	 * with ELIMIT asks again when some were queued since it went. */
	_Atomic uint64_t rel_pushed;
	/* The version board (1.7): the daemon's read-only words, mapped at
	 * the Hello; NULL without one (an older daemon, --board-slots 0, or
	 * DLSHARE_NO_REUSE=1 at connect). */
	const _Atomic uint64_t *board;
	uint32_t board_slots;
	/* The request channel (1.9, proto/chan.h), asked for once the
	 * connection made CLIENT_CHAN_AFTER calls that could use it; NULL
	 * before, and without one (an older daemon, --channel 0, or
	 * DLSHARE_NO_CHANNEL=1 at connect). Set under lock. A call that
	 * reads its own reply (solo) and waits for nothing goes through
	 * it. */
	void *chan;
	int chan_efd;            /* wakes the daemon */
	uint32_t chan_seq;       /* requests sent through it (the solo's) */
	int chan_ok;             /* the daemon has them (1.9), and we may ask */
	atomic_uint chan_calls;  /* calls that could have used one */
	/* Packets read from the socket (the reader's) and sent on it (under
	 * send_lock): the order of the socket and the channel. */
	uint64_t rx_packets;
	_Atomic uint64_t tx_packets;
	struct warm *warm[CLIENT_WARM_MAX]; /* the kept leases of the last
				  * names got (oldest first), under lock */
	unsigned nwarm;
	_Atomic(struct warm *) warm_spare; /* one freed record, to reuse */

	/* fork.c's, under its lock: the process that connected, and the
	 * list of its clients whose fds a child closes. */
	pid_t pid;
	unsigned long fork_gen;
	unsigned long fork_token;
	int fork_listed;
	struct dlshare_client *fork_prev, *fork_next;
	/* The memfds of pending host writers, kept to write-seal at
	 * dlshare_seal (producer.c), at most CLIENT_SEAL_FDS_MAX: a child
	 * closes its copies as it starts, as it does the socket's. */
	int seal_fds[CLIENT_SEAL_FDS_MAX];
	unsigned nseal_fds;
};

/* A lease, shared by a bundle and the tensors exported from it. */
struct lease_ref {
	atomic_int refs;
	dlshare_client *c;
	uint64_t lease;
	void *stream;            /* the consumer's stream (CUDA) */
	pthread_t thread;        /* ...named on this thread (the per-thread
				  * default stream is that thread's) */
	int ordinal;             /* a device of the version, -1 for none */
	void *event;             /* marks the consumer's work, once released */
	struct warm *seed;       /* kept at release (1.7), or NULL */
	struct lease_ref *next;  /* c->deferred */
	size_t npins;
	struct ibuf *pins[];
};

/* A reply handed back by client_call(). */
struct reply {
	struct wire_msg *msg;
	int fds[WIRE_FDS_MAX];
	unsigned nfds;
	struct ibuf *pins[CLIENT_PINS_MAX];
	size_t npins;
	struct mcache *mc;       /* GetReply: its cached manifest, or NULL */
};

void client_ref(dlshare_client *c);
void client_unref(dlshare_client *c);

/* Sends req (its id is set here) with fds and waits for the reply, reading
 * the socket itself when no other thread does. An Error reply becomes its
 * code (and the daemon's message, see errmsg_set). export, when set, is
 * registered by whichever thread reads the reply, as it arrives. Any thread
 * but the receiver thread (a deleter it runs gets DLSHARE_EINVAL).
 * Returns 0 with *out (free with reply_free), or a DLSHARE_E* code; also
 * when the reply came but cannot be used (DLSHARE_EMFILE: its fds did not
 * come, this process was out of them; or the code why its buffers could
 * not be mapped), for a Get, Take or Create *out holds the reply, for the
 * caller to give back its lease or pending version, and reply_free. */
int client_call(dlshare_client *c, Dlshare__Frame *req, const int *fds,
		unsigned nfds, struct export *export, struct reply *out);
void reply_free(dlshare_client *c, struct reply *r);

/* Drops pins on buffers (under c->lock) and unmaps those no longer needed. */
void client_unpin(dlshare_client *c, struct ibuf **pins, size_t n);
/* Pins the buffer wb names: cached, or mapped from fd (-1 when none came;
 * the caller keeps fd). For a writer of a daemon-owned device buffer,
 * which the daemon counts among the buffer's holders. Returns 0 or a
 * DLSHARE_E* code. */
int client_pin_buffer(dlshare_client *c, const Dlshare__Buffer *wb, int fd,
		      struct ibuf **out);

/* Queues a lease for release; never blocks. */
void client_release(dlshare_client *c, uint64_t lease);
/* client_unpin, then client_release of lease: under one lock where the
 * lease rides on the next call. Never blocks. */
void client_unpin_release(dlshare_client *c, struct ibuf **pins, size_t n,
			  uint64_t lease);

/* Gets by the version board (1.7). client_warm_seed: a seed for the lease
 * of r, the reply to a get of name (NULL when the reply carries no token,
 * there is no board, or out of memory); it takes references on r's message
 * and manifest. client_warm_keep: instead of client_unpin_release at the
 * lease's end, keeps w with the pins and the lease, unreleased (releases
 * both, freeing w, when the connection is gone or idle). client_warm_name:
 * name as both look it up. client_warm_take:
 * for a get of the newest version of name, the kept reply in *r (pins,
 * message and manifest moved there, nothing to send) with *seed the same
 * record again for the new holder; returns 0, or 1 when nothing kept
 * answers it (then the daemon must). client_warm_free frees a seed. */
void client_warm_name(struct warm_name *wn, const char *name);
struct warm *client_warm_seed(dlshare_client *c, const struct warm_name *wn,
			      const struct reply *r);
void client_warm_keep(dlshare_client *c, struct warm *w, struct ibuf **pins,
		      size_t n, uint64_t lease);
int client_warm_take(dlshare_client *c, const struct warm_name *wn,
		     struct reply *r, struct warm **seed);
void client_warm_free(struct warm *w);
/* Queues the releases of every lease c keeps (they ride on the next
 * call). Returns whether it kept any. */
int client_warm_let_go(dlshare_client *c);
/* How many releases c ever queued (any thread): compare two readings. */
uint64_t client_rel_pushed(dlshare_client *c);

/* Gives up a lease whose tensors may still be read by queued device work:
 * the mapping is closed and the Release sent only once lr->event completed
 * (the receiver thread watches it). Never blocks, except when the receiver
 * thread is gone (after disconnect), where it waits for the event. Frees
 * lr. */
void client_release_after(dlshare_client *c, struct lease_ref *lr);

/* Calls the deleters of an export and frees it. */
void export_free(struct export *e);

/* Remembers the daemon's message for dlshare_last_error() of this thread. */
void errmsg_set(const char *msg);
/* DLSHARE_ENOTSUP, saying so, when c's daemon speaks no queue names
 * (before protocol 1.4); else 0. */
int client_need_queues(dlshare_client *c);
/* Whether name is refused (check_name); if so, dlshare_last_error() says
 * which rule it breaks. Returns 0, or 1. */
int client_bad_name(const char *name);

/* Protocol 1.4: when n tensors t do not fit in a packet of c's (half of
 * what the daemon takes, so that its reply, which describes them too,
 * fits), writes them into a new manifest memfd (proto/manifest.h),
 * unmapped and ready to send: *fd (the caller closes it), *size. Else *fd
 * is -1 and they go inline. Returns 0, DLSHARE_EINVAL (a tensor the
 * format cannot hold), DLSHARE_ELIMIT (too many for the format) or
 * DLSHARE_EIO / DLSHARE_ENOMEM. */
int client_manifest_out(dlshare_client *c, Dlshare__Tensor *const *t,
			size_t n, int *fd, uint64_t *size);

/* Maps a -errno from a system call to a DLSHARE_E* code. */
int client_errno(int err);

/* fork: a client belongs to the process that connected it (see fork.c).
 * fork_hold/fork_unhold: a fork() waits while held; fork_add/fork_del,
 * called with it held, list a client whose fds a child closes at once
 * (fork_add also records this process as the client's). */
void fork_hold(void);
void fork_unhold(void);
void fork_add(dlshare_client *c);
void fork_del(dlshare_client *c);
/* Closes c's socket and eventfd in this process (a child's copies), and
 * the writers' memfds listed by fork_keep_fd. */
void fork_close_fds(dlshare_client *c);
/* Lists fd, a pending writer's memfd, among those a child closes as it
 * starts. Returns 1, or 0 when c lists CLIENT_SEAL_FDS_MAX already (the
 * caller closes fd then, or keeps it unlisted). */
int fork_keep_fd(dlshare_client *c, int fd);
/* Takes fd off c's list (before the caller closes it). */
void fork_forget_fd(dlshare_client *c, int fd);
/* 1 when c was connected by another process (this one is a fork of it):
 * nothing of c may then be used but its memory. */
int client_forked(const dlshare_client *c);
/* Sets this thread's message and returns DLSHARE_EFORK. */
int fork_refuse(void);
/* Maps fd read-write and shared, never inherited by a child
 * (MADV_DONTFORK, made and marked before any fork can split the two).
 * Returns the mapping, or MAP_FAILED with errno. */
void *fork_mmap_writable(size_t size, int fd);

/* hostmem: memory from dlshare_host_alloc(). Finds the allocation holding
 * [p, p+len): its base, its size and a dup of its memfd (the caller closes
 * it). Returns 0, DLSHARE_ENOENT, or DLSHARE_ELIMIT (no fd for the dup). */
int hostmem_find(const void *p, uint64_t len, void **base, uint64_t *size,
		 int *fd);
/* Unmaps a shared mapping of a buffer [p, p+len) that this process is
 * done with. From HOSTMEM_UNMAP_HINT_MIN bytes on it first tells the
 * kernel the mapping's accessed bits are worth nothing (MADV_SEQUENTIAL):
 * otherwise the unmap marks each page it finds young accessed again, and
 * a page already marked (populated, or read through another mapping) is
 * moved to the active LRU list one by one, which made the unmap of a
 * written 1 GiB take twice as long (BENCHMARKS.md, issue 16 session 15).
 * No-op for p NULL. */
#define HOSTMEM_UNMAP_HINT_MIN (64u << 10)
void hostmem_unmap(void *p, size_t len);

/* The compact byte size of t, or a negative code. */
int tensor_bytes(const DLTensor *t, uint64_t *out);
/* The bytes [lo, hi) that t's elements cover, relative to its data pointer
 * (byte_offset included). Returns 0 or DLSHARE_EINVAL. */
int tensor_extent(const DLTensor *t, int64_t *lo, int64_t *hi);

/* copy: a tensor's elements, compact and row-major, in the largest
 * contiguous runs its strides allow (copy.c). The runs of t: run bytes
 * each, count of them, at base plus the walked dims' byte strides. */
struct copy_runs {
	const char *base;
	uint64_t run, elem, count;
	int32_t nd;
	int64_t shape[CHECK_NDIM_MAX];
	int64_t stride[CHECK_NDIM_MAX]; /* bytes */
};
struct copy_iter {
	const struct copy_runs *r;
	const char *p;
	uint64_t left;
	int64_t idx[CHECK_NDIM_MAX];
};
void copy_runs_init(struct copy_runs *r, const DLTensor *t);
void copy_iter_init(struct copy_iter *it, const struct copy_runs *r);
/* Copies t's elements compact to dst (tensor_bytes(t) bytes). */
void copy_to_mem(char *dst, const DLTensor *t);
/* Writes t's elements compact into fd at off (pwrite: no mapping, no page
 * faults). Returns 0 or -errno (EINVAL: the file takes no write(), as
 * hugetlbfs memfds; map it then). */
int copy_to_fd(int fd, uint64_t off, const DLTensor *t);
/* Allocates and maps every page of a fresh writable shared mapping in one
 * call (MADV_POPULATE_WRITE, where the kernel has it), with transparent
 * huge pages where the kernel gives shared memory those on request. Never
 * fails: what it could not do, the writes' faults do. */
void copy_populate(void *p, size_t len);
/* 1 when shmem_enabled is "advise" (read once). */
int copy_shmem_thp_advised(void);

#endif
