/* registry — the daemon's model: names → versions → tensors → buffers, and
 * the leases consumers hold on versions.
 *
 * It knows nothing of sockets: a connection appears as a struct
 * registry_owner that the caller embeds and drops when the peer goes. The
 * registry owns every entry, version, buffer and lease, and tells its user
 * through struct registry_ops when a version was published, when an exported
 * version is retired and when a buffer is freed. Loop thread only.
 */
#ifndef DLSHARE_REGISTRY_H
#define DLSHARE_REGISTRY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hashtab.h"
#include <utlist.h>

#include "check.h"
#include "dlshare.pb-c.h"
#include "board.h"
#include "metrics.h"

#define REGISTRY_HANDLE_MAX 64u /* bytes of a CUDA IPC mem/event handle */
/* Protocol 1.4, a version spanning devices: one event per device, stored
 * as the device's UUID then its event handle (REGISTRY_HANDLE_MAX bytes). */
#define REGISTRY_UUID_LEN 16u
#define REGISTRY_DEV_EVENT_LEN (REGISTRY_UUID_LEN + REGISTRY_HANDLE_MAX)

struct registry;
struct version;

/* What a buffer on a CUDA device carries beyond a host buffer; part of its
 * version's allocation, and there only for a buffer that names a device UUID
 * or a CUDA IPC handle, so a host buffer pays 8 bytes (the pointer) for it.
 * Which parts are set, struct rbuffer says. */
struct rbuffer_cuda {
	uint64_t ipc_offset;
	uint8_t uuid[16];
	uint8_t ipc_handle[REGISTRY_HANDLE_MAX];
};

/* The memory behind (part of) a version; lives in its version's allocation
 * (see struct version). */
struct rbuffer {
	uint64_t id;             /* daemon-wide, never reused */
	uint64_t size;
	struct version *version; /* the one version this buffer belongs to */
	void *holders;           /* the registry's user's (dispatch: the
				  * peers that have its fd); untouched here */
	struct rbuffer_cuda *cuda; /* NULL when it names no device UUID and
				    * carries no IPC handle */
	int fd;                  /* host, cuda-vmm: the daemon's fd; else -1 */
	int ro_fd;               /* host, once sealed: read-only fd for
				  * readers, or -1 (then fd is handed out) */
	uint8_t kind;            /* DLSHARE__BUFFER_KIND__* */
	uint8_t dev_type;        /* DLDeviceType: 1, 2 or 3 (spec_check) */
	uint8_t daemon_owned;    /* store mode: counts against max_bytes */
	uint8_t has_uuid;        /* cuda->uuid is set */
	uint8_t ipc_handle_len;  /* bytes of cuda->ipc_handle (and
				  * cuda->ipc_offset is set); 0: none */
	uint8_t dev_slot;        /* with has_uuid: its row in
				  * registry->devices + 1; 0: dev_other */
};

/* Field widths are those check_tensor allows: code <= 6, bits <= 256,
 * lanes <= 1024, ndim <= CHECK_NDIM_MAX, buffer < REGISTRY_BUFFERS_HARD_MAX. */
struct rtensor {
	char *key;               /* never NULL; "" when unnamed (shared,
				  * never written), else in the version's
				  * allocation */
	uint64_t offset;
	/* ndim each, in the version's allocation; NULL when ndim is 0 (shape)
	 * or when the tensor has no strides (strides). */
	int64_t *shape;
	int64_t *strides;
	uint16_t bits, lanes;
	uint8_t code;
	uint8_t ndim;
	uint8_t buffer;          /* index into version->buffers */
	uint8_t has_strides;
};

enum version_state {
	VERSION_PENDING,         /* created, being written, invisible to get
				  * (also while sealing: see struct version) */
	VERSION_SEALED,          /* immutable and visible */
};

struct registry_owner;

struct entry;
struct uid_usage;

/* A uid's stake in a version it holds leases on: its first lease charges
 * the uid what the version costs (struct version), its last one takes it
 * back, however many leases come between. */
struct vcharge {
	struct uid_usage *usage;
	uint32_t leases;         /* the uid's leases on the version */
	struct vcharge *prev, *next; /* version->charges */
};

/* One allocation holds a version, its tensors (the flexible array at the
 * end), the buffer pointers, the buffers, their CUDA records and the
 * tensors' dims and keys: a name with one small tensor costs one block.
 *
 * What a version costs (owned_host, owned_gpu, nfds) is charged to its
 * producer's uid while the version is reachable (pending, or its name's
 * newest), and to each uid holding a lease on it (once per uid, however
 * many leases): the bytes and fds that only a lease keeps alive are the
 * leaseholder's.
 *
 * Sealing: a Seal write-seals the buffers off the loop (daemon/seal.c).
 * Meanwhile the version is still pending but sealing: not visible, not
 * sealable again, not abortable, and it cannot die. A producer that goes,
 * or a delete of its name, only marks it orphaned; it dies when the seal
 * ends (registry_seal_end). */
struct writer_rec;

#define REGISTRY_REPLY_TAIL_NONE UINT32_MAX

/* What only some versions carry, out of line: made when a version first
 * needs a part of it (registry_add, or a seal with events) and freed with
 * the version. A host or CUDA tensor with no event, no manifest, no queue
 * and no origin has none (struct version: cold is NULL), and no get that
 * any version answers from its packed reply reads it. */
struct version_cold {
	uint8_t *event_handle;   /* event_len bytes, an allocation of its
				  * own (set at seal); NULL when none */
	uint8_t *dev_events;     /* 1.4: ndev_events entries of
				  * REGISTRY_DEV_EVENT_LEN bytes; NULL when
				  * none */
	void *own_events;        /* 1.6, store mode: the daemon's own CUDA
				  * events that event_handle or dev_events
				  * name (daemon/gpu.h), handed to
				  * ops->events_freed when v goes; else
				  * NULL */
	/* Queue names (see struct entry_queue): */
	uint64_t qseq;           /* its place in the queue: seal order */
	struct version *qprev, *qnext; /* entry->queue->head */
	/* 1.5: the node a relay mirrored it from (in the version's
	 * allocation), and its number there; NULL and 0 when it was made
	 * here. */
	const char *origin_node;
	uint64_t origin_version;
	struct rbuffer mbuf;     /* 1.5, with manifest_fd: the manifest as a
				  * buffer to the peers it was sent to (id,
				  * size, holders: they hear BufferGone when
				  * the version goes); its fd stays
				  * manifest_fd, mbuf.fd is -1. id 0: no
				  * manifest */
};

struct version {
	struct entry *entry;
	uint64_t number;
	struct writer_rec *wrec; /* registry->writers' record of it (and its
				  * writer id: registry_writer), while
				  * pending in store mode; else NULL */
	struct registry_owner *producer; /* pending, exported, or sealed with
					  * its CUDA event; else NULL */
	struct uid_usage *usage; /* its producer's uid while charged (it is
				  * reachable); else NULL */
	struct vcharge *charges; /* the uids its leases charge */
	uint64_t owned_host;     /* daemon-owned host bytes of its buffers */
	uint64_t owned_gpu;      /* daemon-owned GPU bytes of its buffers */
	struct rbuffer **buffers;              /* nbuffers of them */
	struct lease *lease_list;              /* the leases on it */
	struct version *prev, *next;           /* entry->versions */
	struct version *oprev, *onext;         /* producer->versions */
	uint64_t meta_bytes;     /* what its tensors' description costs: its
				  * manifest memfd's size, or the bytes of
				  * this block (charged to its producer's
				  * uid against uid_manifest_bytes) */
	/* get.c's GetReply of it for readers that hold every fd it needs
	 * (wire_get_reply_tail), packed at the first such get of the sealed
	 * version and freed with it: reply_tail_len bytes, or
	 * REGISTRY_REPLY_TAIL_NONE when it is not kept (too long). */
	uint8_t *reply_tail;
	struct version_cold *cold; /* NULL when it carries none of it */
	uint32_t reply_tail_len;
	int manifest_fd;         /* protocol 1.4: the sealed manifest memfd
				  * holding its tensors (tensors[] is then
				  * empty), handed to every reader; else -1.
				  * cold->mbuf is its buffer. */
	uint32_t ntensors;
	uint32_t leases;
	uint16_t mode;
	uint8_t nfds;            /* fds its buffers and manifest may hold
				  * (REGISTRY_FDS_*): <= 2 *
				  * REGISTRY_BUFFERS_HARD_MAX + 1 */
	uint8_t nbuffers;        /* <= REGISTRY_BUFFERS_HARD_MAX */
	uint8_t event_len;       /* <= REGISTRY_HANDLE_MAX: of
				  * cold->event_handle */
	uint8_t ndev_events;     /* <= its CUDA buffers: of cold->dev_events */
	uint8_t state;           /* enum version_state */
	/* Flags, a bit each: */
	uint8_t exported : 1;    /* producer memory: retired back to it */
	uint8_t publishing : 1;  /* in ops->published */
	uint8_t withdrawn : 1;   /* pending, but its name was deleted: no
				  * Seal or Abort reaches it, and it lives
				  * only while a writer lease holds it (or
				  * its seal is under way) */
	uint8_t pending : 1;     /* counted in its producer's and uid's
				  * pending versions */
	uint8_t sealing : 1;     /* between registry_seal_begin and _end */
	uint8_t orphaned : 1;    /* its producer went while sealing: it dies
				  * at registry_seal_end */
	/* Queue names (see struct entry_queue): */
	uint8_t qheld : 1;       /* counts toward its queue's depth: from
				  * create until consumed (or it dies) */
	uint8_t queued : 1;      /* sealed, on entry->queue->head, not
				  * taken */
	struct rtensor tensors[];
};

/* A link of a list the registry's user keeps of entries (and of records
 * of its own, told apart by mark): see entry.wl. */
struct registry_link {
	struct registry_link *prev, *next;
	uint64_t seq : 63;
	uint64_t mark : 1;
};

/* A name's lifetime (daemon/lifetime.c), only for a name that has one:
 * made by lifetime_prepare for a name that is owned or has a TTL, and
 * freed when the name leaves the map or dies (lifetime_forget). */
struct entry_life {
	/* The connection it belongs to (it goes with it). */
	struct registry_owner *owned_by;
	struct entry *owprev, *ownext; /* owned_by->owned */
	/* When it expires (ttl_ms after its last seal, or its creation),
	 * and its place in registry->ttl_heap. */
	uint64_t expires_ms;     /* when ttl_ms is set */
	uint32_t ttl_ms;         /* 0: no TTL */
	uint32_t heap_slot;      /* index in registry->ttl_heap + 1; 0: none */
	uint8_t doomed;          /* owned, and its owner went: due at once in
				  * the heap, deleted in the timer's batches;
				  * a new version of the name replaces it */
};

/* A queue name's state, made with its entry (a name's mode is chosen
 * when it is made) and freed with it: sealed versions wait on head,
 * oldest first, until taken; the entry lives on while empty. held counts
 * its versions that are pending, queued, or taken and not released: at
 * most depth. */
struct entry_queue {
	uint32_t depth;          /* > 0 */
	uint32_t held;
	uint32_t queued;         /* on head */
	uint32_t taken;          /* held by take leases */
	uint64_t seq;            /* last seal order handed out */
	struct version *head;
};

/* What every name carries; what only some do (a lifetime, a queue) is
 * out of line, a pointer each, NULL for a name without it. */
struct entry {
	uint64_t last_number;    /* highest version number handed out */
	uint64_t last_sealed;    /* highest version number made visible */
	struct version *latest;  /* newest sealed version, or NULL */
	struct version *versions;
	struct uid_usage *usage; /* charged for this name */
	UT_hash_handle hh;       /* registry->names */
	union {
		/* registry->detached, once deleted */
		struct {
			struct entry *dprev, *dnext;
		};
		/* while in the name map: its place in the registry's user's
		 * change log (watch.c), untouched here; prev is NULL while
		 * it is in none. The user takes it out (ops->removed) before
		 * the entry is detached. */
		struct registry_link wl;
	};
	uint32_t nversions;
	uint32_t leases;
	uint32_t owner_uid, owner_gid;
	struct entry_life *life; /* NULL: not owned, no TTL */
	struct entry_queue *queue; /* NULL: not a queue name */
	/* One word (the name starts right after it): */
	uint32_t mode : 9;       /* within CHECK_MODE_MASK */
	uint32_t detached : 1;   /* deleted: out of the name map, dying */
	uint32_t bslot : 22;     /* 1 + its slot on the board, 0 for none
				  * (BOARD_SLOTS_MAX fits).
				  * The word there holds a token, or 0: a
				  * get of its newest version would answer
				  * latest, to the same readers, while one
				  * is posted (registry_board) */
	char name[];             /* as long as it is; allocated from
				  * offsetof(struct entry, name) */
};
_Static_assert(CHECK_MODE_MASK < (1u << 9), "struct entry: mode is 9 bits");
_Static_assert(BOARD_SLOTS_MAX < (1u << 22), "struct entry: bslot is 22 bits");

/* Whether e is owned and its owner went (struct entry_life). */
static inline int entry_doomed(const struct entry *e)
{
	return e->life && e->life->doomed;
}

struct lease {
	uint64_t id;
	struct version *version;
	struct registry_owner *owner;
	struct vcharge *charge;  /* its uid's on the version; NULL when the
				  * owner has no uid record */
	uint8_t take;            /* a take of a queue version: its release
				  * consumes the version, its owner's end
				  * puts it back at the head */
	UT_hash_handle hh;       /* owner->leases */
	struct lease *vprev, *vnext; /* version->lease_list */
};

/* What one uid holds, over all its connections: quotas are per uid, so a
 * user cannot get around them by opening more connections. */
struct uid_usage {
	uid_t uid;
	uint32_t owners;         /* registry owners (connections) of the uid */
	uint32_t names;          /* names it created */
	uint32_t leases;
	uint32_t pending;        /* its pending versions (sealing included) */
	uint32_t versions;       /* versions charged to it as their producer
				  * (the reachable ones) */
	uint32_t leased;         /* versions charged to it through leases */
	uint64_t host_bytes;     /* daemon-owned host memory of the versions
				  * charged to it as their producer */
	uint64_t gpu_bytes;      /* daemon-owned GPU memory of those */
	uint64_t meta_bytes;     /* metadata bytes (struct version:
				  * meta_bytes) of the versions charged to it
				  * as their producer */
	uint64_t leased_host_bytes; /* the same, of the versions it leases */
	uint64_t leased_meta_bytes; /* meta_bytes of the versions it leases
				     * (against uid_manifest_bytes too) */
	uint64_t leased_gpu_bytes;
	uint64_t fds;            /* fds of the versions charged to it, either
				  * way (struct version: nfds) */
	uint32_t fds_queued;     /* fds in replies not yet sent to it */
	UT_hash_handle hh;       /* registry->uids */
};

/* One peer's stake in the registry; embedded by the caller. */
struct registry_owner {
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct uid_usage *usage; /* set by registry_owner_attach */
	/* Its leases by id, and with them its anchor (id 0, never a
	 * lease's, no version) whenever the table is not empty, until the
	 * owner is dropped: uthash frees a table when its last item goes,
	 * and a reader that holds one lease at a time would have it made
	 * and freed on every get. */
	struct lease *leases;
	struct lease anchor;
	uint32_t nleases;
	uint32_t npending;        /* its pending versions (sealing included) */
	struct version *versions; /* pending, exported, and sealed with a
				   * CUDA event, by this owner */
	struct entry *owned;      /* names that go with it (lifetime.c) */
	uint32_t nowned;
};

struct registry_ops {
	/* A version became visible: wake whoever waits for it. It is alive
	 * during the call; the callee may take leases on it. */
	void (*published)(void *ud, struct entry *e, struct version *v);
	/* A sealed version that names its producer is gone: an export's
	 * memory is the producer's again, a store version's CUDA event may
	 * be destroyed. */
	void (*retired)(void *ud, struct registry_owner *producer,
			const char *name, uint64_t number);
	/* A version's own_events (registry_seal_end_owned) are no longer
	 * named by it: the callee destroys them (off the loop). Without ops
	 * (registry_deinit) they are free()d. */
	void (*events_freed)(void *ud, void *events);
	/* A buffer is about to be freed: forget it. */
	void (*buffer_freed)(void *ud, struct rbuffer *b);
	/* Takes fd, of a host buffer of at least REGISTRY_CLOSE_ASIDE_MIN
	 * bytes the registry let go, and closes it off the loop where it
	 * can; until then it counts the fd (registry_fds_closing and
	 * registry_fds_closed). NULL: closed at once. */
	void (*close_aside)(void *ud, int fd);
	/* The clock TTLs are counted on, in ms (monotonic); NULL: always 0. */
	uint64_t (*now_ms)(void *ud);
	/* The earliest TTL expiry may have moved earlier: the caller's timer
	 * should wake at registry_next_expiry(). */
	void (*expiry_changed)(void *ud);
	/* The queue name may have room now (a version was consumed or died,
	 * or the name was deleted): producers waiting for room may retry.
	 * The callee must not change the registry from inside the call. */
	void (*queue_room)(void *ud, const char *name);
	/* e leaves the name map: deleted, or its last version died (1.6,
	 * watches). Called once per entry, before it is freed; the callee
	 * must not change the registry from inside the call. */
	void (*removed)(void *ud, struct entry *e);
};

struct registry_limits {
	uint32_t max_tensors;       /* tensors per version */
	uint32_t max_buffers;       /* buffers per version */
	uint32_t max_leases;        /* leases per owner */
	uint32_t uid_connections;   /* owners (connections) per uid */
	uint32_t uid_names;         /* names created per uid */
	uint32_t uid_leases;        /* leases per uid, all connections */
	uint64_t uid_host_bytes;    /* daemon-owned host bytes per uid;
				     * 0: the same as max_bytes */
	uint64_t uid_gpu_bytes;     /* daemon-owned GPU bytes per uid (0: no
				     * cap but the devices' memory) */
	uint32_t uid_fds;           /* fds queued to one uid's connections */
	uint32_t max_pending;       /* pending versions per owner */
	uint32_t uid_pending;       /* pending versions per uid */
	uint32_t uid_open_fds;      /* fds held for one uid: its versions',
				     * its leased versions' and those queued
				     * to it; 0: no cap (the server derives
				     * one from RLIMIT_NOFILE) */
	uint32_t max_open_fds;      /* the same for every uid together; 0: no
				     * cap (derived, as uid_open_fds) */
	uint64_t uid_leased_bytes;  /* daemon-owned host bytes of versions one
				     * uid leases; 0: as uid_host_bytes */
	uint64_t uid_leased_gpu_bytes; /* daemon-owned GPU bytes of versions
					* one uid leases; 0: as uid_gpu_bytes */
	uint64_t max_buffer_bytes;  /* size of one buffer */
	uint64_t max_bytes;         /* daemon-owned bytes, all buffers */
	uint32_t default_mode;      /* mode of a name when the publisher gives 0 */
	uint64_t uid_manifest_bytes; /* metadata bytes (manifests) of the
				      * versions one uid produced */
	uint64_t huge_min;          /* store host buffers from this size on are
				     * huge pages when the pool has them; 0:
				     * never */
	uint32_t default_ttl_ms;    /* TTL of a new name that asks for none;
				     * 0: none */
	uint32_t max_ttl_ms;        /* longest TTL a request may ask for */
	uint32_t queue_depth;       /* depth of a queue name that asks for
				     * the default (queue_depth 0) */
	uint32_t max_queue_depth;   /* the most a queue name's depth may be */
};

/* A whole state dict in one version: 10^5 tensors is a large MoE model. */
#define REGISTRY_MAX_TENSORS_DEFAULT 1000000u
/* A 10^6-tensor manifest with 60-byte keys takes about 110 MB: a few of
 * them per uid, beside the descriptions of many small versions (~330 B
 * each: 10^6 one-tensor names fit). */
#define REGISTRY_UID_MANIFEST_BYTES_DEFAULT (UINT64_C(1) << 30)
#define REGISTRY_MAX_BUFFERS_DEFAULT 16u
#define REGISTRY_BUFFERS_HARD_MAX 64u /* max_buffers can not go above */
#define REGISTRY_MAX_LEASES_DEFAULT 16384u
#define REGISTRY_MAX_BUFFER_BYTES_DEFAULT (UINT64_C(1) << 40)
#define REGISTRY_DEFAULT_MODE 0644u
#define REGISTRY_UID_CONNECTIONS_DEFAULT 256u
#define REGISTRY_UID_NAMES_DEFAULT 65536u
#define REGISTRY_UID_LEASES_DEFAULT 65536u
#define REGISTRY_UID_FDS_DEFAULT 4096u
/* A data loader keeps a few batches ahead of its trainer. */
#define REGISTRY_QUEUE_DEPTH_DEFAULT 8u
#define REGISTRY_MAX_QUEUE_DEPTH_DEFAULT 1024u
/* A producer writes a few versions at once (double buffering, a thread
 * or two per connection); thousands are a flood, each holding a memfd. */
#define REGISTRY_MAX_PENDING_DEFAULT 256u
#define REGISTRY_UID_PENDING_DEFAULT 1024u
/* The fds one buffer may cost: a host buffer its memfd and the read-only
 * reopen readers get (made at the first get), a cuda-vmm buffer its fd, a
 * cuda-ipc buffer none. */
#define REGISTRY_FDS_HOST 2u
#define REGISTRY_FDS_VMM 1u

/* Host buffers from this size on are closed off the loop when the
 * registry lets them go (ops->close_aside): the close of a memfd's last
 * reference frees its pages in the closing thread, ~0.2 µs a page on the
 * machine of BENCHMARKS.md (~50 µs here, ~50 ms for 1 GiB). Below it a
 * close on the loop costs less than handing the fd to another thread. */
#define REGISTRY_CLOSE_ASIDE_MIN (256u << 10)

/* A name's TTL is at most a week unless the operator says otherwise
 * (--max-ttl); the wire's uint32 ms reach 49 days. */
#define REGISTRY_MAX_TTL_MS_DEFAULT (7u * 24 * 3600 * 1000)

/* Most names whose last number the registry remembers after their entry
 * died without a Delete (struct tomb); past it the oldest is forgotten. */
#define REGISTRY_TOMBS_MAX 16384u

/* The last sealed (visible) version number of a name whose entry died
 * without a Delete (an exporter left, and later the last lease went): the
 * name's next version numbers after it, so that (name, number) never names two
 * different versions of a name nobody deleted. */
struct tomb {
	uint64_t last_number;
	UT_hash_handle hh;       /* registry->tombs, by name */
	struct tomb *prev, *next; /* registry->tomb_list, oldest first */
	char name[];
};

/* Rows of live buffers per CUDA device (by UUID) the registry counts, at
 * most: the devices of one machine, with room to spare. A row is free
 * again once its device holds no buffer; past the cap (a peer may name
 * UUIDs no device has) buffers count in registry->dev_other. */
#define REGISTRY_DEVICES_MAX 16u

/* Live buffers of one device (uuid), or of those past the cap. */
struct registry_device {
	uint8_t uuid[REGISTRY_UUID_LEN];
	uint64_t buffers;        /* 0: the row is free */
	uint64_t bytes;
};

/* Buffer kinds counted, by DLSHARE__BUFFER_KIND__* (0: unknown). */
#define REGISTRY_KINDS 4u

/* Records a registry keeps for reuse, of each kind (struct registry). */
#define REGISTRY_SPARE_MAX 64

/* Freed records of one kind, kept for reuse: each links to the next
 * through its first bytes. */
struct registry_spares {
	void *head;
	uint32_t n;              /* <= REGISTRY_SPARE_MAX */
};

struct registry {
	struct uid_usage *uids;   /* what each uid holds */
	struct tomb *tombs;       /* by name */
	struct tomb *tomb_list;   /* oldest first */
	uint32_t ntombs;
	struct entry *names;
	struct entry *detached;   /* deleted names whose versions live on */
	struct writer_rec *writers; /* pending store versions by writer id
				     * (a record each, only while pending:
				     * a sealed version carries no hash
				     * handle) */
	uint64_t next_writer_id;
	uint64_t next_buffer_id;
	uint64_t next_lease_id;
	/* Lease and charge records freed lately, up to REGISTRY_SPARE_MAX
	 * of each, for the next leases: a get takes a lease and its release
	 * drops it, and malloc and free of both cost ~500 instructions. */
	struct registry_spares spare_leases, spare_charges;
	uint64_t nnames, nversions, nleases, nbuffers, bytes, owned_bytes;
	uint64_t meta_bytes;      /* struct version: meta_bytes, all versions */
	uint64_t gpu_bytes;       /* daemon-owned GPU bytes (not in max_bytes) */
	uint64_t nfds;            /* fds the live buffers may hold (struct
				   * version: nfds), for max_open_fds */
	uint64_t fds_queued;      /* fds in replies not yet sent (conn.c) */
	uint64_t fds_closing;     /* fds being closed off the loop
				   * (registry_fds_closing): still open,
				   * so counted against max_open_fds */
	/* Names with a TTL: a binary min-heap on expires_ms (lifetime.c). */
	struct entry **ttl_heap;
	uint32_t ttl_n, ttl_cap;
	/* Live buffers by kind and by device (metrics, protocol 1.5). */
	uint64_t kind_buffers[REGISTRY_KINDS], kind_bytes[REGISTRY_KINDS];
	struct registry_device devices[REGISTRY_DEVICES_MAX];
	struct registry_device dev_other;
	uint64_t nexpired;        /* names deleted by their TTL */
	uint64_t norphaned;       /* owned names deleted with their owner */
	struct registry_limits limits;
	const struct registry_ops *ops;
	void *ud;
	struct board *board;      /* the version board (1.7), or NULL */
};

/* Fills the defaults; max_bytes is half the machine's memory. */
void registry_limits_default(struct registry_limits *l);

void registry_init(struct registry *r, const struct registry_limits *l,
		   const struct registry_ops *ops, void *ud);
/* Frees everything, leases still held included (their owners' tables are
 * emptied of them); callbacks are not called. Owners attached with
 * registry_owner_attach must be dropped first. */
void registry_deinit(struct registry *r);
/* n fds of the daemon's were handed to be closed off the loop (its
 * buffers' through ops->close_aside, and any other it let go): still
 * open, they count against max_open_fds until registry_fds_closed. */
void registry_fds_closing(struct registry *r, size_t n);
void registry_fds_closed(struct registry *r, size_t n);

void registry_owner_init(struct registry_owner *o, uid_t uid, gid_t gid,
			 pid_t pid);
/* Counts o against its uid's connection quota. Returns 0, -EDQUOT (the uid
 * has uid_connections owners already; *why names the limit) or -ENOMEM.
 * Undone by registry_owner_drop. */
int registry_owner_attach(struct registry *r, struct registry_owner *o,
			  struct refusal *why);
/* Forgets the CUDA events of the store versions o sealed and detaches o
 * from them (they live on without a producer, and o hears no Retired for
 * them): o's process may exit, and no reader must be handed its events. */
void registry_owner_forget_events(struct registry *r,
				  struct registry_owner *o);
/* Withdraws the versions o exported (producer memory): no reader is handed
 * them any more; leases keep theirs, and o hears Retired for each once no
 * lease holds it. For a producer about to exit (Goodbye), whose memory and
 * events die with it. */
void registry_owner_withdraw_exports(struct registry *r,
				     struct registry_owner *o);
/* Drops every lease of o, every pending version and every exported version
 * it produced. Versions that lose their last reachability die here. */
void registry_owner_drop(struct registry *r, struct registry_owner *o);

/* A large version's tensors: a manifest memfd (proto/manifest.h) that the
 * caller sealed and checked with manifest_check against the spec's
 * buffers. fd is taken over by registry_add on success (set to -1). */
struct registry_manifest {
	int fd;
	uint64_t size;
	uint32_t ntensors;
};

/* A version as a request describes it. Buffers' fds (host/vmm) are taken
 * over by registry_add on success only. */
struct registry_spec {
	const char *name;
	uint32_t mode;
	Dlshare__Tensor **tensors;
	size_t ntensors;
	Dlshare__Buffer **buffers;
	size_t nbuffers;
	int *fds;                /* one per buffer, -1 where none */
	const uint8_t *event_handle;
	size_t event_len;
	Dlshare__DeviceEvent **dev_events; /* 1.4 export: one per device */
	size_t ndev_events;
	int precheck;            /* registry_precheck: cuda-vmm buffers'
				  * fds are not made yet */
	struct registry_manifest *manifest; /* NULL: tensors, else none */
	const int *made;         /* store mode, one per buffer or NULL: the
				  * caller made this buffer's GPU memory
				  * (cuda-ipc: its handle is in the buffer;
				  * the caller frees it on buffer_freed) */
	int owned;               /* 1.4: the name belongs to the caller's
				  * connection (lifetime.c) */
	uint32_t ttl_ms;         /* 1.4: the name's TTL; 0: unchanged */
	int queue;               /* the name is (to be) a queue name */
	uint32_t queue_depth;    /* with queue: its depth; 0: the default
				  * for a new name, any for an existing one */
	const char *origin_node; /* 1.5: the node it was mirrored from, or
				  * NULL (check_origin_why) */
	uint64_t origin_version; /* 1.5: its number there, 0 with no node */
};

/* The checks of registry_add (name, ACL, tensors against buffers, limits
 * and quotas), changing nothing: for a request whose buffers must be made
 * first (GPU memory, off the loop). registry_add checks again. Returns as
 * registry_add. */
int registry_precheck(struct registry *r, struct registry_owner *o,
		      const struct registry_spec *s, int exported,
		      struct refusal *why);

/* Adds a version of spec->name owned by o: pending (store mode: host
 * buffers are made here, cuda-vmm ones come as fds made by the GPU backend)
 * or, with exported, sealed at once (producer memory; each host fd gets
 * F_SEAL_FUTURE_WRITE).
 * Checks the name, the ACL, every tensor against the buffers and the limits.
 * On success the registry owns spec->fds (they are set to -1) and *out is the
 * new version. Returns 0, -EINVAL, -EBADF (a peer's fd is refused), -EPERM,
 * -E2BIG (a limit on tensors or buffers), -ENOSPC (a limit of the daemon),
 * -EDQUOT (a limit of o or its uid), -EFBIG (a buffer over
 * max_buffer_bytes), -EOPNOTSUPP (a buffer kind this daemon cannot hold),
 * -ENOMEM, -EMEDIUMTYPE (the request's queue mode is not the name's;
 * *why says how), -EAGAIN (a full queue name). With -EBADF, *why says what is wrong with the fd; with -EDQUOT
 * and -ENOSPC, it names the limit (a static string), except for a sum of
 * buffer sizes that overflows, which leaves it alone. why may be NULL; a
 * caller that reads it sets it to NULL first. */
int registry_add(struct registry *r, struct registry_owner *o,
		 const struct registry_spec *spec, int exported,
		 struct version **out, struct refusal *why);

/* Finds the pending version o created that a Seal or Abort names: by
 * writer, the id registry_add gave it (name and number must match too), or,
 * when writer is 0 (a client before protocol 1.3), by name and number,
 * which a Delete and a Create of the same name make ambiguous. Returns it,
 * or NULL with *err -ENOENT (no such pending version of o), or -EALREADY
 * (found by name and number, sealed, and o may read it: to a peer that
 * may not, a sealed version does not exist). */
struct version *registry_pending(struct registry *r, struct registry_owner *o,
				 const char *name, uint64_t number,
				 uint64_t writer, int *err);

/* The bytes of v's buffers (its manifest not counted). */
uint64_t registry_bytes(const struct version *v);

/* The writer id registry_add gave v, a pending store version (a Seal or
 * Abort names it by it); 0 for any other. */
uint64_t registry_writer(const struct version *v);

/* Begins sealing the pending version registry_pending finds: it is
 * sealing from now on (see struct version) and in *out, until
 * registry_seal_end. The caller write-seals its host buffers in between,
 * off the loop: the kernel waits there while pages are pinned. Returns 0,
 * the errors of registry_pending, or -EINPROGRESS (a seal of it is under
 * way). */
int registry_seal_begin(struct registry *r, struct registry_owner *o,
			const char *name, uint64_t number, uint64_t writer,
			struct version **out);

/* Ends the seal begun on v. With err 0 (every host buffer has
 * F_SEAL_WRITE) v becomes sealed and visible, the newest version unless a
 * newer one was sealed meanwhile, with the event handle given (copied).
 * Otherwise v is pending again. An orphaned v dies here, and a withdrawn
 * one unless a writer lease holds it. Returns 0, -ENOENT (v was orphaned
 * or withdrawn meanwhile: nothing was published), err, -EINVAL (event_len
 * over REGISTRY_HANDLE_MAX) or -ENOMEM (no room for the event); v stays
 * pending on any error but -ENOENT. */
int registry_seal_end(struct registry *r, struct version *v, int err,
		      const uint8_t *event, size_t event_len);

/* registry_seal_end, where the events readers get are the daemon's own
 * (1.6): one event_handle (event, event_len), or ndev_events entries of
 * REGISTRY_DEV_EVENT_LEN bytes (a device's UUID, then its event's handle)
 * in dev_events; own (non-NULL) is what holds them, taken over on success
 * only (then handed to ops->events_freed when v goes). v then names no
 * producer event: its producer is detached at once, like a version sealed
 * with no event, and hears no Retired for it. Returns as
 * registry_seal_end. */
int registry_seal_end_owned(struct registry *r, struct version *v, int err,
			    const uint8_t *event, size_t event_len,
			    const uint8_t *dev_events, size_t ndev_events,
			    void *own);

/* registry_seal_begin, F_SEAL_WRITE on each host buffer, registry_seal_end:
 * in one call, which blocks while a buffer's pages are pinned. Never on the
 * loop (the daemon uses daemon/seal.c); for tools and tests. Returns as
 * registry_seal_begin and _end; -EBUSY when a writable mapping or pinned
 * pages of a buffer still exist (the version stays pending). */
int registry_seal(struct registry *r, struct registry_owner *o,
		  const char *name, uint64_t number, uint64_t writer,
		  const uint8_t *event, size_t event_len);

/* Drops the pending version registry_pending finds. Returns 0, its
 * errors, or -EINPROGRESS (it is being sealed). */
int registry_abort(struct registry *r, struct registry_owner *o,
		   const char *name, uint64_t number, uint64_t writer);

enum registry_select { REG_LATEST, REG_EXACT, REG_NEWER_THAN };

/* ---- queue names ---- */

/* Whether name (a queue) has room for one more version: 1, or 0 with
 * *depth its depth; 1 also when name is no queue or does not exist (then
 * registry_add decides). */
int registry_queue_room(struct registry *r, const char *name,
			uint32_t *depth);

/* The oldest queued version of the queue name, for o to take. Returns it,
 * or NULL with *err -ENOENT (no such name, or nothing queued yet), -EPERM
 * (o may not read and write it), or -EMEDIUMTYPE (name is no queue). */
struct version *registry_queue_head(struct registry *r,
				    struct registry_owner *o,
				    const char *name, int *err);

/* Makes l (a fresh lease on a queued version) its take: the version leaves
 * the queue; releasing l consumes it, the end of l's owner puts it back at
 * the head. */
void registry_queue_take(struct registry *r, struct lease *l);

/* o gives back its lease id unused (1.6 Untake): a take's version goes back
 * to the head of its queue, unconsumed (as when o goes), and whoever waits
 * to take it may; any other lease is released. The version may die.
 * Returns 0 or -ENOENT. */
int registry_untake(struct registry *r, struct registry_owner *o,
		    uint64_t id);

/* Undoes registry_queue_take (the answer could not be sent) and drops l. */
void registry_queue_untake(struct registry *r, struct registry_owner *o,
			   struct lease *l);

/* Finds a sealed, live version of name. Returns it or NULL; *err is -ENOENT
 * when nothing matches (yet) or -EPERM when o may not read the name. */
struct version *registry_find(struct registry *r, struct registry_owner *o,
			      const char *name, enum registry_select sel,
			      uint64_t number, int *err);
/* registry_find with the name table's hash of name (registry_name_hash),
 * which a caller that looks the same name up again may keep. */
struct version *registry_find_hashed(struct registry *r,
				     struct registry_owner *o,
				     const char *name, unsigned hashv,
				     enum registry_select sel,
				     uint64_t number, int *err);
/* The name table's hash of name: a keyed hash of its bytes (SECURITY.md),
 * the same for the same bytes while the daemon runs. */
unsigned registry_name_hash(const char *name);

/* The board's slot and token for a get of e's newest version (protocol
 * 1.7), posting a token if e has none now (and taking a slot if e has
 * none). Returns 1 with *slot and *token; 0 when there is no board (or e
 * has no newest version); -ENOSPC when every slot is taken. Without 1,
 * the reply carries no token; 0 too when e's newest version is not one
 * a reader may answer again by itself (device memory, an event: struct
 * board). The token stays posted until anything changes what such a get
 * answers, or who may ask it: a newer version, a delete, a new mode, a
 * withdrawn export. */
int registry_board_post(struct registry *r, struct entry *e, uint32_t *slot,
			uint64_t *token);

/* registry_board's common case inline: a token posted and still there. */
static inline int registry_board(struct registry *r, struct entry *e,
				 uint32_t *slot, uint64_t *token)
{
	if (e->bslot) {
		/* Only this thread writes the word. */
		uint64_t t = atomic_load_explicit(&r->board->words[e->bslot - 1],
						  memory_order_relaxed);

		if (t) {
			*slot = e->bslot - 1;
			*token = t;
			return 1;
		}
	}
	return registry_board_post(r, e, slot, token);
}

/* Takes a lease of o on v. The first lease of o's uid on v charges the uid
 * v's bytes and fds. Returns 0 with *out, -EDQUOT (o holds max_leases, or
 * its uid uid_leases, or the leased bytes or open fds of its uid would
 * pass their limit; *why names it, why may be NULL), -ENOMEM. */
int registry_lease(struct registry *r, struct registry_owner *o,
		   struct version *v, struct lease **out, struct refusal *why);

/* The fd to hand a reader of b: for a sealed host buffer a read-only
 * reopen (made once, see host_reopen_ro), else b->fd (-1 when none). */
int registry_reader_fd(struct rbuffer *b);

/* Drops o's lease id; the version may die. Returns 0 or -ENOENT. */
int registry_release(struct registry *r, struct registry_owner *o,
		     uint64_t id);

/* Removes name: no version of it can be got any more. Returns 0, -ENOENT,
 * -EPERM. */
int registry_delete(struct registry *r, struct registry_owner *o,
		    const char *name);

/* Takes e out of the name map (a Delete that was allowed): no version of
 * it can be got any more; each dies once unreachable and unleased, and e
 * with the last. Do not touch e afterwards. */
void registry_detach(struct registry *r, struct entry *e);

/* ---- name lifetimes (daemon/lifetime.c) ------------------------------- */

/* Whether o may add a version with spec s's lifetime to e (NULL: a new
 * name): an owned name takes versions only from its owner's connection, or
 * from another connection of the name's owner uid that asks to own it;
 * a TTL is at most max_ttl_ms. Returns 0, -EPERM or -ERANGE (*why says
 * which rule, a static string). */
int lifetime_check(const struct registry *r, const struct registry_owner *o,
		   const struct entry *e, const struct registry_spec *s,
		   struct refusal *why);
/* Makes e's lifetime record (struct entry_life) when s gives e a
 * lifetime and it has none yet; before anything else of a registry_add
 * changes (fresh: e is new). Returns 0 or -ENOMEM. */
int lifetime_prepare(const struct registry *r, struct entry *e,
		     const struct registry_spec *s, int fresh);
/* Applies s's lifetime to e after o added a version to it (fresh: e is new),
 * lifetime_prepare having made its record. Cannot fail. */
void lifetime_apply(struct registry *r, struct registry_owner *o,
		    struct entry *e, const struct registry_spec *s, int fresh);
/* A version of e was sealed: its TTL starts again. */
void lifetime_sealed(struct registry *r, struct entry *e);
/* e leaves the name map or dies: it is no one's and has no TTL any more. */
void lifetime_forget(struct registry *r, struct entry *e);
/* o goes: the names it owns are doomed, due at once: registry_expire
 * deletes them a batch at a time (their leased versions live on until
 * released), so that one connection's close costs the loop little. */
void lifetime_owner_drop(struct registry *r, struct registry_owner *o);
/* Deletes name now if it is doomed, so that a Create or Publish makes a
 * new name in its place. */
void lifetime_reap(struct registry *r, const char *name);
/* Deletes at most max names whose TTL passed by now. Returns how many it
 * deleted; registry_next_expiry tells whether more wait. */
size_t registry_expire(struct registry *r, uint64_t now, size_t max);
/* When the next name expires (ms on ops->now_ms's clock); UINT64_MAX when
 * no name has a TTL. */
uint64_t registry_next_expiry(const struct registry *r);
/* ms until e expires (0 when due); UINT64_MAX when it has no TTL. */
uint64_t lifetime_left(const struct registry *r, const struct entry *e);

/* Names deleted by one Delete with a prefix, at most: the rest waits for
 * the next request (DeleteReply.more), so one request's work is bounded
 * by a walk of the map and this many deletions. */
#define REGISTRY_DELETE_BATCH 1024u

/* Deletes up to max names that start with prefix and that o may write
 * (the Delete rule), in the map's order; the others it counts in *skipped.
 * *deleted is how many went. Returns 1 when it stopped at max with more to
 * delete (then *skipped counts only the names walked so far), else 0. */
int registry_delete_prefix(struct registry *r, struct registry_owner *o,
			   const char *prefix, size_t max, uint64_t *deleted,
			   uint64_t *skipped);

/* The per-uid byte quotas in force, with the defaults of struct
 * registry_limits resolved: UINT64_MAX where there is none. */
void registry_uid_caps(const struct registry *r, uint64_t *host,
		       uint64_t *gpu, uint64_t *leased_host,
		       uint64_t *leased_gpu);

/* The live entry of name, or NULL. */
struct entry *registry_entry(struct registry *r, const char *name);

/* 1 when o may read (want 4) or write (want 2) entry e. */
int registry_may(const struct entry *e, const struct registry_owner *o,
		 unsigned want);

#endif
