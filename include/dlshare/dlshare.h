/* dlshare.h — the public C API of libdlshare.
 *
 * libdlshare talks to the dlshared daemon over a Unix socket and turns what it
 * sends into DLPack tensors. Every function may be called from any thread; one
 * dlshare_client may be shared by many threads. Errors are negative
 * DLSHARE_E* codes (see dlshare_strerror()); nothing here aborts or exits.
 *
 * Threads and pthread_cancel(): every call that may wait or close anything,
 * and every deleter of a tensor it hands out, runs with cancellation off, so
 * a thread cancelled inside one finishes the call (a waiting get waits for
 * its version or its timeout) and the cancel acts at the thread's next
 * cancellation point after it returns, with the client whole. Callbacks the
 * library calls (dlshare_list()'s, a deleter of an exported tensor) run with
 * cancellation off too. A thread that must stop promptly waits with a
 * timeout (dlshare_get_opts.timeout_ms) and checks its own flag between
 * calls.
 */
#ifndef DLSHARE_DLSHARE_H
#define DLSHARE_DLSHARE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLSHARE_VERSION_MAJOR 0
#define DLSHARE_VERSION_MINOR 1
#define DLSHARE_VERSION_PATCH 0
#define DLSHARE_VERSION_STRING "0.1.0"

#if defined(DLSHARE_BUILDING)
#define DLSHARE_API __attribute__((visibility("default")))
#else
#define DLSHARE_API
#endif

/* DLPack 1.x ABI, for dlpack headers older than 1.0 (Debian 12 ships 0.6).
 * The layout is the one fixed by DLPack 1.0's dlpack.h. */
#ifndef DLPACK_MAJOR_VERSION
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
typedef struct DLPackVersion {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#endif

/* Error codes. Every function that can fail returns 0 or one of these. */
enum {
	DLSHARE_OK = 0,
	DLSHARE_EINVAL = -1,    /* an argument or a request is invalid */
	DLSHARE_ENOENT = -2,    /* no such name or version */
	DLSHARE_ETIMEDOUT = -3, /* the wait for a version timed out */
	DLSHARE_EPERM = -4,     /* the name's mode forbids this */
	DLSHARE_ENOMEM = -5,    /* out of memory (here or in the daemon) */
	DLSHARE_ELIMIT = -6,    /* a limit or quota of the daemon was reached */
	DLSHARE_EPROTO = -7,    /* the peer broke the protocol */
	DLSHARE_ECONN = -8,     /* no daemon there, or the connection was lost */
	DLSHARE_EVERSION = -9,  /* the daemon speaks another protocol major */
	DLSHARE_ENOTSUP = -10,  /* the buffer kind or device is not supported */
	DLSHARE_EIO = -11,      /* a system call failed */
	DLSHARE_EBUSY = -12,    /* the buffer is still mapped writable, or
				 * has pinned pages (vmsplice, O_DIRECT) */
	DLSHARE_ECOPY = -13,    /* publishing would copy, and copies were forbidden */
	DLSHARE_ENODEV = -14,   /* the device is not visible to this process */
	DLSHARE_ESTATE = -15,   /* the version is not in the state this needs */
	DLSHARE_E2BIG = -16,    /* the request does not fit in one packet */
	DLSHARE_ECLOSED = -17,  /* the client was disconnected */
	DLSHARE_EFORK = -18,    /* the client was created in another process
				 * (this one is a fork of it) */
	DLSHARE_EMFILE = -19,   /* this process had no free file descriptor
				 * (RLIMIT_NOFILE, or the system's table was
				 * full): for a reply's buffers (the connection
				 * stays, and the same call works again once
				 * fds are free), or for a socket or memfd of
				 * its own (connect, host_alloc, a copy) */
};

/* The message for an error code; never NULL, also for unknown codes. */
DLSHARE_API const char *dlshare_strerror(int err);

/* The daemon's explanation of the last error a call in this thread got
 * ("get weights/x: no such name"), or "" when it gave none. Valid until the
 * thread's next call. */
DLSHARE_API const char *dlshare_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH". */
DLSHARE_API const char *dlshare_version(void);

/* Writes the socket path that dlshared and clients use when given none:
 * $DLSHARE_SOCKET, else /run/dlshare/dlshared.sock if it exists, else
 * $XDG_RUNTIME_DIR/dlshare/dlshared.sock, else /tmp/dlshare-$UID/dlshared.sock.
 * Returns 0, or DLSHARE_E2BIG when it does not fit in len bytes. */
DLSHARE_API int dlshare_socket_path(char *buf, size_t len);

/* CUDA streams are passed as void * (a cudaStream_t), so this header needs
 * no CUDA. The DLPack conventions apply: NULL or DLSHARE_STREAM_LEGACY is
 * the legacy default stream, DLSHARE_STREAM_PER_THREAD the per-thread
 * default stream, DLSHARE_STREAM_NONE asks for no synchronisation. */
#define DLSHARE_STREAM_LEGACY ((void *)1)
#define DLSHARE_STREAM_PER_THREAD ((void *)2)
#define DLSHARE_STREAM_NONE ((void *)(intptr_t)-1)

/* ---- connections ------------------------------------------------------ */

typedef struct dlshare_client dlshare_client;

/* Connects to the daemon at path (NULL: dlshare_socket_path()) and says Hello.
 * On success *out is a client the caller frees with dlshare_disconnect().
 * Waits at most DLSHARE_CONNECT_TIMEOUT_MS (see dlshare_connect_ex()).
 * Returns 0, DLSHARE_ECONN (nobody listening), DLSHARE_EPERM (no access to
 * the socket), DLSHARE_E2BIG (path longer than the 107 bytes a Unix socket
 * path may have), DLSHARE_ETIMEDOUT (nobody answered in time),
 * DLSHARE_EVERSION, DLSHARE_ENOMEM, DLSHARE_EMFILE (no fd left here for
 * the socket) or DLSHARE_EIO; dlshare_last_error() then names the path and
 * the reason ("connect /run/x.sock: No such file or directory"). */
DLSHARE_API int dlshare_connect(const char *path, dlshare_client **out);

/* How long dlshare_connect() waits, in all, for the socket's listener to
 * take the connection and for the daemon's answer to Hello, unless told
 * otherwise: a socket whose listener never accepts, or a hung daemon, then
 * fails with DLSHARE_ETIMEDOUT instead of blocking forever. */
#define DLSHARE_CONNECT_TIMEOUT_MS 5000

/* Options of dlshare_connect_ex(). Zero-initialise it and set size to
 * sizeof(dlshare_connect_opts): later versions may add fields at the end,
 * and a library reads only the fields size covers. */
typedef struct dlshare_connect_opts {
	uint32_t size;          /* sizeof(dlshare_connect_opts) */
	int32_t timeout_ms;     /* connect + Hello: 0 the default
				 * (DLSHARE_CONNECT_TIMEOUT_MS), > 0 this long,
				 * DLSHARE_WAIT_FOREVER (-1) no limit */
} dlshare_connect_opts;

/* dlshare_connect() with options (opts may be NULL: the defaults).
 * Returns what dlshare_connect() does, and DLSHARE_ETIMEDOUT when the
 * listener did not take the connection, or the daemon did not answer
 * Hello, within the timeout (dlshare_last_error() names the path and
 * which of the two it was); DLSHARE_EINVAL for a size of 0 or a timeout
 * below -1. */
DLSHARE_API int dlshare_connect_ex(const char *path,
				   const dlshare_connect_opts *opts,
				   dlshare_client **out);

/* Closes the connection. Releases of tensors already freed are sent first
 * (for a device tensor, once its consumer's stream passed its work), so a
 * released take of a queue name is consumed (when the socket is full, this
 * waits for room, at most the connect timeout: see dlshare_connect_ex());
 * leases still held go with the
 * connection (a take then goes back to its queue). Calls in other threads
 * fail with DLSHARE_ECLOSED.
 * Tensors obtained from this client stay valid: their deleters may run later
 * (their leases went with the connection). Exported tensors whose versions
 * were still published are handed back to their deleters here. NULL is a
 * no-op. Must not be called while another thread is still inside a call on c.
 * In a child that inherited c (see fork() above) it only closes the child's
 * copies of c's fds, if still open, and returns at once: the parent's
 * connection, its threads and its exports are untouched. */
DLSHARE_API void dlshare_disconnect(dlshare_client *c);

/* ---- publishing, store mode: the daemon owns the memory ---------------- */

/* Describes one tensor to create. */
typedef struct dlshare_tensor_spec {
	const char *key;        /* name inside the version; NULL or "" for none */
	DLDataType dtype;
	int32_t ndim;           /* 0..32 */
	const int64_t *shape;   /* ndim entries, each >= 0 */
} dlshare_tensor_spec;

/* Name lifetimes (protocol 1.4; with an older daemon a create or publish
 * that asks for one fails with DLSHARE_ENOTSUP).
 *
 * DLSHARE_NAME_OWNED, in dlshare_create_opts.flags or
 * dlshare_publish_opts.flags: the name belongs to this connection and is
 * deleted when it closes, cleanly or because the process died; leased
 * versions live on until their leases are released. Another connection
 * may add versions to an owned name only if it is of the name's owner uid
 * and asks for ownership too (the name then goes with that connection);
 * anyone else gets DLSHARE_EPERM.
 *
 * ttl_ms: the name is deleted when no version of it was sealed for that
 * long (a name never sealed: since it was created). 0 leaves the name's
 * TTL as it is (a new name gets the daemon's --default-ttl). More than the
 * daemon's --max-ttl fails with DLSHARE_ELIMIT. */
#define DLSHARE_NAME_OWNED 0x4u

typedef struct dlshare_create_opts {
	DLDevice device;        /* {kDLCPU, 0} (the default), {kDLCUDAHost, 0},
				 * or {kDLCUDA, ordinal}: device memory on
				 * that GPU of this process */
	uint32_t mode;          /* permission bits (0640 style); 0: daemon default */
	uint32_t flags;         /* DLSHARE_NAME_OWNED or 0 */
	uint32_t ttl_ms;        /* the name's TTL; 0: unchanged / default */
	/* Protocol 1.5: where this version came from, for a program that
	 * mirrors names from another machine (dlshare-relay): that node's
	 * name, 1-64 bytes of printable ASCII without spaces, and the
	 * version's number there. NULL and 0: none (made here). Shown by
	 * dlshare_stat() and dlshare_list() (dlshare_name_info). A bad node
	 * gives DLSHARE_EINVAL, a daemon older than 1.5 DLSHARE_ENOTSUP
	 * (dlshare_last_error() says which rule). */
	const char *origin_node;
	uint64_t origin_version;
} dlshare_create_opts;

typedef struct dlshare_writer dlshare_writer;

/* Creates a pending version of name holding n tensors, laid out compact and
 * 64-byte aligned in one daemon-owned buffer that this process maps writable.
 * Write the data through dlshare_writer_tensor(), then dlshare_seal(). A
 * host buffer's pages are allocated and mapped here in one call where the
 * kernel can (MADV_POPULATE_WRITE, Linux 5.14+), not a fault per page.
 * The version is invisible to get until sealed, and dropped if the writer is
 * aborted or the connection closes first. opts may be NULL. With a kDLCUDA
 * device the buffer is GPU memory the daemon allocates on that GPU (by its
 * UUID; cuda-vmm), which outlives this process once sealed. A host writer
 * holds the buffer's memfd until the seal (up to 64 pending writers per
 * client; a forked child closes its copies as it starts), to write-seal it
 * itself there.
 * Returns 0 and a writer in *out, or DLSHARE_EINVAL, DLSHARE_ELIMIT,
 * DLSHARE_E2BIG, DLSHARE_EPERM, DLSHARE_ENOMEM, DLSHARE_ECONN,
 * DLSHARE_EMFILE (no free fd here for the buffer's: the version is dropped,
 * the connection stays); for a device,
 * also DLSHARE_ENODEV (no such GPU here or at the daemon) and
 * DLSHARE_ENOTSUP (no CUDA here, or a daemon without GPU support). */
DLSHARE_API int dlshare_create(dlshare_client *c, const char *name,
			       const dlshare_tensor_spec *tensors, size_t n,
			       const dlshare_create_opts *opts,
			       dlshare_writer **out);

/* The number of tensors of a writer, and tensor i (writable; the writer owns
 * it and it dies with the writer). Its data is compact row-major (strides
 * NULL) and byte_offset is 0. NULL when i is out of range, and in a child
 * that inherited w: a host writer's memory is mapped with MADV_DONTFORK, so
 * that no child can keep it writable and make the seal fail (DLSHARE_EBUSY);
 * there the child's pointers into it fault. */
DLSHARE_API size_t dlshare_writer_count(const dlshare_writer *w);
DLSHARE_API DLTensor *dlshare_writer_tensor(dlshare_writer *w, size_t i);

/* The version number the writer will publish. */
DLSHARE_API uint64_t dlshare_writer_version(const dlshare_writer *w);

/* Drops the writable mapping and seals the version: from now on it is
 * immutable and visible to get. A host buffer is write-sealed here
 * (F_SEAL_WRITE) before the Seal goes, so that the daemon publishes at
 * once rather than on its thread pool; when the kernel refuses that seal
 * (the kernel first waits a while for pinned pages), the version is
 * dropped without asking the daemon, and DLSHARE_EBUSY returned. stream is the producer's CUDA stream for
 * device buffers and ignored for host ones (pass NULL): an event recorded
 * on it orders the consumers' streams after the writes queued so far, and
 * the host does not wait (the writer's mapping goes once the stream passed
 * the seal). Always consumes w.
 * Returns 0 and the version in *version (may be NULL), or DLSHARE_ENOENT
 * (the name was deleted while the version was pending: nothing was
 * published), DLSHARE_EBUSY (a writable mapping or pinned pages (vmsplice,
 * O_DIRECT, RDMA) of the buffer still exist somewhere), DLSHARE_EINVAL or
 * DLSHARE_ENOTSUP for a device version whose event the daemon (protocol
 * 1.6) cannot wait on with an event of its own (it cannot open the
 * producer's event: another IPC namespace; or it cannot have a CUDA context
 * on the device), DLSHARE_ECONN,
 * DLSHARE_ESTATE (a daemon before protocol 1.3 found the version sealed
 * already), DLSHARE_EFORK (w was inherited: only this process's copy is
 * consumed, the parent's version is untouched). dlshare_last_error() then
 * says why the seal failed. */
DLSHARE_API int dlshare_seal(dlshare_writer *w, void *stream,
			     uint64_t *version);

/* Drops a pending version without publishing it. NULL is a no-op. For a
 * device writer, call it only once the work queued on the buffer is done
 * (its mapping goes at once). */
DLSHARE_API void dlshare_writer_abort(dlshare_writer *w);

/* ---- queue names --------------------------------------------------------
 *
 * A queue name keeps every sealed version until one taker takes it
 * (dlshare_take), oldest first; an ordinary name keeps only its newest.
 * Whether a name is a queue, and its depth, is chosen when the name is
 * first created and kept until it is deleted: a create or publish that asks
 * for the other kind, or another depth, fails with DLSHARE_EINVAL. At most
 * depth versions of a queue name exist at once — pending (created, not
 * sealed), queued (sealed, not taken), and taken but not yet released each
 * count one — so a producer ahead of its consumer waits for room, up to
 * wait_ms, instead of growing memory. The daemon keeps each producer's
 * order: versions are queued in the order their seals completed. get on a
 * queue name fails with DLSHARE_EINVAL: take it. */

#define DLSHARE_WAIT_FOREVER (-1)

typedef struct dlshare_queue_opts {
	uint32_t depth;   /* the queue's depth; 0: the daemon's default
			   * (dlshared --queue-depth) for a new name, and any
			   * depth for an existing queue name. Over the
			   * daemon's --max-queue-depth: DLSHARE_ELIMIT */
	int32_t wait_ms;  /* when the queue is full: 0 fail at once
			   * (DLSHARE_ELIMIT), > 0 wait up to this long for
			   * room (then DLSHARE_ETIMEDOUT), or
			   * DLSHARE_WAIT_FOREVER. The daemon parks the
			   * request; nobody polls */
} dlshare_queue_opts;

/* dlshare_create() into a queue name (made one if new). queue may be NULL
 * (the default depth, no wait). Waits for room as queue->wait_ms says; a
 * GPU create (kDLCUDA) that finds the queue filled meanwhile fails with
 * DLSHARE_ELIMIT. Returns what dlshare_create() returns; and
 * DLSHARE_ETIMEDOUT when the queue stayed full for the whole wait, or
 * DLSHARE_ELIMIT when it is full and no wait was asked
 * (dlshare_last_error() names the queue, its depth, what fills it and the
 * wait). */
DLSHARE_API int dlshare_create_queued(dlshare_client *c, const char *name,
				      const dlshare_tensor_spec *tensors,
				      size_t n, const dlshare_create_opts *opts,
				      const dlshare_queue_opts *queue,
				      dlshare_writer **out);

/* ---- publishing, export mode: the producer owns the memory ------------- */

/* Allocates a compact host tensor in shareable memory (a sealed memfd), so
 * dlshare_publish() can hand it out without a copy. The caller owns *out and
 * frees it with its deleter. A child of fork() sees and shares it like any
 * MAP_SHARED memory (it is never write-sealed, so that harms no seal).
 * Returns 0, DLSHARE_EINVAL, DLSHARE_ENOMEM or DLSHARE_EMFILE (no fd left
 * in this process for the memfd). */
DLSHARE_API int dlshare_host_alloc(DLDataType dtype, int32_t ndim,
				   const int64_t *shape,
				   DLManagedTensor **out);

#define DLSHARE_PUBLISH_NO_COPY 0x1u /* fail with DLSHARE_ECOPY, never copy */
#define DLSHARE_PUBLISH_COPY 0x2u    /* always copy host tensors into a
				      * daemon buffer, even shareable ones */

typedef struct dlshare_publish_opts {
	const char *const *keys; /* n names inside the version, or NULL */
	uint32_t mode;           /* permission bits; 0: daemon default */
	uint32_t flags;          /* DLSHARE_PUBLISH_*, DLSHARE_NAME_OWNED */
	void *stream;            /* producer's CUDA stream; NULL for host */
	uint32_t ttl_ms;         /* the name's TTL; 0: unchanged / default */
	const char *origin_node; /* 1.5: as in dlshare_create_opts; NULL: none */
	uint64_t origin_version; /* 1.5: its number at origin_node */
} dlshare_publish_opts;

/* Publishes n tensors as one new version of name (a bundle when n > 1).
 * Tensors in memory from dlshare_host_alloc() are shared without a copy: the
 * library keeps them and calls their deleters once the daemon retires the
 * version (a newer one replaced it, or the name was deleted, and no lease
 * holds it) or this client disconnects; so are cudaMalloc allocations (CUDA
 * IPC, ordered by an event on opts->stream). Any other memory is copied into
 * a daemon-owned buffer and its deleter runs before this returns, unless
 * DLSHARE_PUBLISH_NO_COPY forbids that: host memory by the CPU; device memory
 * (pool, VMM, managed) on opts->stream into GPU memory of the daemon on the
 * same device, after which this waits for that stream. A host copy is
 * written into the daemon's memfd (pwrite: no mapping, no page faults) in
 * the longest contiguous runs the strides allow: one for a compact tensor,
 * with or without explicit strides, one per row of a row-contiguous view.
 * On success the library owns all n
 * tensors; on failure the caller still does. opts may be NULL.
 * Shared tensors keep their strides, but one with a negative stride is never
 * shared (torch 1.13 aborts a consuming process on one, JAX refuses it): a
 * host tensor is copied compact (DLSHARE_ECOPY under NO_COPY), a device one
 * fails with DLSHARE_ENOTSUP. What consumers get has byte_offset 0.
 * Returns 0 and the version in *version (may be NULL), or DLSHARE_EINVAL,
 * DLSHARE_ECOPY, DLSHARE_ENOTSUP, DLSHARE_ELIMIT, DLSHARE_E2BIG, DLSHARE_EPERM,
 * DLSHARE_ECONN. */
/* The deleters of exported tensors run on the library's receiver thread:
 * they must not call dlshare functions that wait for the daemon (those fail
 * there with DLSHARE_EINVAL). */
DLSHARE_API int dlshare_publish(dlshare_client *c, const char *name,
				DLManagedTensor *const *tensors, size_t n,
				const dlshare_publish_opts *opts,
				uint64_t *version);

/* dlshare_publish() into a queue name (made one if new). queue may be NULL.
 * A copy (the usual case) waits for room as queue->wait_ms says, like
 * dlshare_create_queued(); an export without a copy (memory from
 * dlshare_host_alloc(), cudaMalloc) never waits: on a full queue it fails
 * with DLSHARE_ELIMIT at once. Returns what dlshare_publish() and
 * dlshare_create_queued() return. */
DLSHARE_API int dlshare_publish_queued(dlshare_client *c, const char *name,
				       DLManagedTensor *const *tensors,
				       size_t n,
				       const dlshare_publish_opts *opts,
				       const dlshare_queue_opts *queue,
				       uint64_t *version);

/* ---- consuming ---------------------------------------------------------- */

enum {
	DLSHARE_LATEST = 0,     /* the newest sealed version */
	DLSHARE_EXACT = 1,      /* exactly opts.version */
	DLSHARE_NEWER_THAN = 2, /* the newest version > opts.version */
};

typedef struct dlshare_get_opts {
	uint32_t select;    /* DLSHARE_LATEST, DLSHARE_EXACT, DLSHARE_NEWER_THAN */
	uint64_t version;   /* for EXACT and NEWER_THAN */
	int32_t timeout_ms; /* 0: fail at once when there is none; > 0: wait up to
			     * this long for it; DLSHARE_WAIT_FOREVER */
	void *stream;       /* consumer's CUDA stream; NULL for host */
} dlshare_get_opts;

typedef struct dlshare_bundle dlshare_bundle;

/* Gets a version of name and takes a lease on it: its memory stays valid
 * and unchanged while the bundle or any tensor exported from it lives.
 * A waiting get does not block other threads' calls on c. opts may be NULL
 * (the latest version, no wait). Returns 0 and a bundle the caller frees with
 * dlshare_bundle_free(), or DLSHARE_ENOENT, DLSHARE_ETIMEDOUT, DLSHARE_EPERM,
 * DLSHARE_ELIMIT, DLSHARE_ECONN, DLSHARE_EPROTO, DLSHARE_ENOMEM; or
 * DLSHARE_EMFILE when this process had no free fd for the fds of buffers it
 * had not mapped yet (RLIMIT_NOFILE): the lease went back, the connection
 * stays, and the same get works once fds are free (protocol 1.8). So does
 * DLSHARE_ENOMEM for a buffer this process could not map (its address
 * space or map count full): the same get maps it once there is room.
 *
 * Gets without a round trip (protocol 1.7): a connection keeps the gets
 * it freed (the bundle and every tensor from it) of the newest versions
 * of the last 8 names, host tensors only, with their leases. A get of the
 * newest version of such a name takes the lease back instead of asking
 * the daemon when the daemon's version board says the version is still
 * the newest and still readable by this client: the same answer, no
 * message (0.14 us p50, where a get that asks costs 4.1 us, all on one
 * CPU of an Intel Xeon: BENCHMARKS.md). A kept lease is released with the
 * next call that is not a get, within 20 ms once its name changed (or
 * with the next get of that name), and after 20 ms without calls (a freed
 * lease that is not kept: with the next call of any kind). A loop that gets, reads and frees a few names
 * is answered so on every turn, and holds nothing once it stops.
 * DLSHARE_NO_REUSE=1 in the environment when the client connects makes
 * every get ask (the daemon's metrics then count every get).
 *
 * The request channel (protocol 1.9): once a connection has made 32 gets
 * or takes that wait for nothing, it asks the daemon for a channel (a
 * shared memfd and an eventfd), and from then on such a call, when no
 * other call of the client waits, reaches the daemon through it instead of
 * the socket (~1.05x a bare socket round trip on one CPU, ~1.45x over the
 * socket). Answers that carry fds still come over the socket; nothing else
 * changes. DLSHARE_NO_CHANNEL=1 in the environment when the client
 * connects keeps it from asking. */
DLSHARE_API int dlshare_get(dlshare_client *c, const char *name,
			    const dlshare_get_opts *opts, dlshare_bundle **out);

DLSHARE_API uint64_t dlshare_bundle_version(const dlshare_bundle *b);
DLSHARE_API size_t dlshare_bundle_count(const dlshare_bundle *b);
/* The key of tensor i ("" when it has none), NULL when out of range. */
DLSHARE_API const char *dlshare_bundle_key(const dlshare_bundle *b, size_t i);
/* Index of the tensor with this key (the first, for keys given twice), or
 * DLSHARE_ENOENT (dlshare_last_error() then names the key); DLSHARE_EINVAL
 * for a NULL b or key. O(1): a bundle of more than a few tensors is indexed
 * by key when it is received. A version of up to 10^6 tensors is one
 * bundle: past a packet its descriptions travel in a sealed manifest memfd
 * (protocol 1.4) that the bundle maps, so keys and shapes are not copied. */
DLSHARE_API int dlshare_bundle_find(const dlshare_bundle *b, const char *key);
/* A borrowed, read-only view of tensor i, valid until dlshare_bundle_free();
 * NULL when out of range. The library checked that every element it reaches
 * lies inside the mapped buffer. */
DLSHARE_API const DLTensor *dlshare_bundle_tensor(const dlshare_bundle *b,
						  size_t i);

/* Takes the oldest queued version of the queue name: this client alone
 * gets it, as a bundle like dlshare_get()'s. Freeing the bundle and every
 * tensor exported from it (the lease's release) consumes the version and
 * frees its room in the queue; if this client's connection closes first
 * (the process died, or dlshare_disconnect()), the version goes back to
 * the head of the queue for the next taker. timeout_ms: 0 fails at once
 * with DLSHARE_ENOENT when nothing is queued, > 0 waits up to this long
 * (DLSHARE_ETIMEDOUT), or DLSHARE_WAIT_FOREVER; a name that does not exist
 * yet is waited for too. Takers waiting on one name are served in the
 * order they came. stream: as dlshare_get_opts.stream. Taking needs read
 * and write permission on the name. Returns 0 and a bundle the caller
 * frees with dlshare_bundle_free(), or DLSHARE_ENOENT, DLSHARE_ETIMEDOUT,
 * DLSHARE_EINVAL (not a queue name), DLSHARE_EPERM, DLSHARE_ELIMIT,
 * DLSHARE_ECONN, DLSHARE_EPROTO, DLSHARE_ENOMEM, DLSHARE_EMFILE (as for a
 * get; the version goes back to the head of its queue). Any thread; a
 * waiting take does not block other threads' calls on c. */
DLSHARE_API int dlshare_take(dlshare_client *c, const char *name,
			     int32_t timeout_ms, void *stream,
			     dlshare_bundle **out);

/* Makes a DLManagedTensor of tensor i for a DLPack consumer. It holds the
 * lease on its own (the bundle may be freed first); its deleter releases it
 * and may be called from any thread, also after dlshare_disconnect(). The
 * release reaches the daemon with this client's next request, or within
 * 20 ms when none comes (a device tensor's once the consumer's stream
 * passed its work).
 * The memory is mapped read-only. data is never NULL, also for a tensor of
 * no bytes (libtorch's at::fromDLPack never runs the deleter of a tensor
 * whose data is NULL). Returns 0, DLSHARE_EINVAL, DLSHARE_ENOMEM. */
DLSHARE_API int dlshare_bundle_export(dlshare_bundle *b, size_t i,
				      DLManagedTensor **out);
/* The same as a DLPack 1.x DLManagedTensorVersioned, flagged read-only. */
DLSHARE_API int dlshare_bundle_export_versioned(dlshare_bundle *b, size_t i,
						DLManagedTensorVersioned **out);

/* Makes another CUDA stream wait for the producer's work on this version
 * (DLPack stream rules; the host does not wait), for a consumer whose
 * stream is known only after the get (the DLPack exchange protocol passes
 * it to __dlpack__). The lease's release is then ordered after that
 * stream's work too. A no-op for host versions and DLSHARE_STREAM_NONE.
 * Returns 0, DLSHARE_EINVAL, or a CUDA error as DLSHARE_E* code. */
DLSHARE_API int dlshare_bundle_wait(dlshare_bundle *b, void *stream);

/* Frees the bundle; the lease goes once no exported tensor holds it.
 * NULL is a no-op. */
DLSHARE_API void dlshare_bundle_free(dlshare_bundle *b);

/* Shorthands for a version's first tensor: get + export + free. */
DLSHARE_API int dlshare_get_tensor(dlshare_client *c, const char *name,
				   const dlshare_get_opts *opts,
				   DLManagedTensor **out);
DLSHARE_API int dlshare_get_tensor_versioned(dlshare_client *c,
					     const char *name,
					     const dlshare_get_opts *opts,
					     DLManagedTensorVersioned **out);

/* ---- looking inside ----------------------------------------------------- */

enum {
	DLSHARE_KIND_HOST = 1,
	DLSHARE_KIND_CUDA_IPC = 2,
	DLSHARE_KIND_CUDA_VMM = 3,
};

typedef struct dlshare_name_info {
	char name[256];
	uint64_t latest;     /* newest sealed version, 0 when none yet */
	uint32_t versions;   /* live versions (newest plus those still leased) */
	uint32_t tensors;    /* tensors in the newest version */
	uint64_t bytes;      /* buffer bytes of the newest version */
	uint32_t leases;     /* leases on all its versions */
	uint32_t owner_uid;
	uint32_t mode;
	int kind;            /* DLSHARE_KIND_* of the newest version */
	int exported;        /* the newest version is producer memory */
	int owned;           /* goes when its owner's connection closes */
	uint32_t owner_pid;  /* owned: the process of that connection */
	uint32_t ttl_ms;     /* its TTL, 0 when none */
	uint64_t expires_in_ms; /* with a TTL: ms until it is deleted unless
				 * a version is sealed first */
	/* Protocol 1.5: the newest version's origin, when a relay mirrored it
	 * from another node (dlshare_create_opts.origin_node): that node's
	 * name, NUL-terminated, and the version's number there. "" and 0:
	 * made here (or a daemon before 1.5). */
	char origin_node[65];
	uint64_t origin_version;
} dlshare_name_info;

/* Called once per name; return non-zero to stop early. */
typedef int (*dlshare_list_fn)(const dlshare_name_info *info, void *arg);

/* Lists the names that start with prefix (NULL or "": all), in byte order,
 * fetching them page by page. Returns 0 (also when fn stopped early), or an
 * error code. */
DLSHARE_API int dlshare_list(dlshare_client *c, const char *prefix,
			     dlshare_list_fn fn, void *arg);

/* One change a watch reports (protocol 1.6): name got a new newest version
 * (version), or was deleted (deleted set; version its last one). */
typedef struct dlshare_watch_change {
	char name[256];
	uint64_t version;
	int deleted;
} dlshare_watch_change;

/* dlshare_watch() flags. */
#define DLSHARE_WATCH_MORE 1u  /* stopped at max: call again at once */
#define DLSHARE_WATCH_LOST 2u  /* changes since after may be missing (a
				* deletion the daemon no longer remembers,
				* or after is from an earlier daemon run):
				* list the prefix again */

/* Waits until some name under prefix (NULL or "": every name) that this
 * client may read changes after the point after, and says which (protocol
 * 1.6). A change is a version sealed as a name's newest, or the name
 * deleted; each name comes once, with its last change, oldest first.
 * Points are the daemon's change counter: pass 0 the first time (every
 * name there is), then the *seq of the last answer. timeout_ms: 0 answers
 * at once, DLSHARE_WAIT_FOREVER waits without end; the daemon parks the
 * request, nobody polls. Fills changes[0..*n) (at most max, and at most
 * the daemon's --max-watch-names; *flags says DLSHARE_WATCH_MORE when it
 * stopped there). Returns 0 (*n 0: the timeout passed), DLSHARE_EINVAL,
 * DLSHARE_ELIMIT (too many requests waiting on this connection),
 * DLSHARE_ENOTSUP (a daemon before 1.6), DLSHARE_ECONN. Any thread;
 * other calls on c go on while it waits. */
DLSHARE_API int dlshare_watch(dlshare_client *c, const char *prefix,
			      uint64_t after, int32_t timeout_ms,
			      dlshare_watch_change *changes, size_t max,
			      size_t *n, uint64_t *seq, unsigned *flags);

/* What fills a queue name. */
typedef struct dlshare_queue_info {
	uint32_t depth;      /* its depth; 0: the name is not a queue */
	uint32_t queued;     /* sealed, waiting to be taken */
	uint32_t taken;      /* taken, not yet released */
	uint32_t pending;    /* created, not yet sealed */
	uint32_t waiting;    /* creates waiting for room (dlshare_queue_stat
			      * only; 0 in listings) */
} dlshare_queue_info;

/* Called once per name; queue is NULL unless the name is a queue. Return
 * non-zero to stop early. */
typedef int (*dlshare_list_ex_fn)(const dlshare_name_info *info,
				  const dlshare_queue_info *queue, void *arg);

/* dlshare_list() that also says what fills each queue name. */
DLSHARE_API int dlshare_list_ex(dlshare_client *c, const char *prefix,
				dlshare_list_ex_fn fn, void *arg);

/* What fills the queue name (out->depth 0: name is not a queue). For a
 * queue name dlshare_stat() describes its oldest queued version. Returns
 * 0, DLSHARE_ENOENT, DLSHARE_EPERM, DLSHARE_ECONN. */
DLSHARE_API int dlshare_queue_stat(dlshare_client *c, const char *name,
				   dlshare_queue_info *out);

/* The manifest of a version: keys and tensor shapes, without data. */
typedef struct dlshare_manifest dlshare_manifest;
DLSHARE_API size_t dlshare_manifest_count(const dlshare_manifest *m);
DLSHARE_API const char *dlshare_manifest_key(const dlshare_manifest *m,
					     size_t i);
/* Tensor i, with data NULL and byte_offset its offset in its buffer. */
DLSHARE_API const DLTensor *dlshare_manifest_tensor(const dlshare_manifest *m,
						    size_t i);
/* NULL is a no-op. */
DLSHARE_API void dlshare_manifest_free(dlshare_manifest *m);

/* Describes name without taking a lease. manifest may be NULL; else it gets
 * the newest version's manifest (with no tensors when no version is sealed
 * yet), freed with dlshare_manifest_free(). info->name is NUL-terminated;
 * info->kind is 0 while no version is sealed.
 * Returns 0, DLSHARE_ENOENT, DLSHARE_EPERM, DLSHARE_ECONN. */
DLSHARE_API int dlshare_stat(dlshare_client *c, const char *name,
			     dlshare_name_info *info,
			     dlshare_manifest **manifest);

#define DLSHARE_STATS_UIDS 16 /* per-uid rows dlshare_stats holds */

typedef struct dlshare_stats {
	uint64_t connections;
	uint64_t names;
	uint64_t versions;
	uint64_t leases;
	uint64_t buffers;
	uint64_t bytes;      /* bytes of all live buffers */
	uint64_t parked;     /* gets waiting for a version */
	uint64_t requests;   /* requests served since start */
	uint64_t uptime_ms;
	uint64_t expired;    /* names deleted by their TTL since start (1.4) */
	uint64_t orphaned;   /* owned names deleted with their connection */
	uint32_t nuids;      /* uids holding anything */
	uint32_t nuid_rows;  /* rows filled in uids[], the top by bytes */
	struct dlshare_uid_stats {
		uint32_t uid;
		uint32_t connections;
		uint64_t names;    /* names the uid created (live) */
		uint64_t versions; /* versions charged to it as producer */
		uint64_t bytes;    /* daemon-owned bytes of those */
		uint64_t leases;   /* leases its connections hold */
	} uids[DLSHARE_STATS_UIDS];
} dlshare_stats;

/* The daemon's counters, and what the DLSHARE_STATS_UIDS uids holding the
 * most bytes hold (a daemon before 1.4 sends no rows). Returns 0 or an
 * error code. */
DLSHARE_API int dlshare_stats_get(dlshare_client *c, dlshare_stats *out);

/* Uids whose per-uid quota usage dlshare_metrics() writes at most: the
 * ones nearest a quota (by their largest share of one). */
#define DLSHARE_METRICS_UIDS 32

/* The daemon's gauges and counters (protocol 1.5; a 1.4 daemon's text
 * lacks the counters) in the Prometheus text exposition format, version
 * 0.0.4: every family is named and documented in dlsharectl(1). *text is
 * NUL-terminated, *len bytes long (len may be NULL), and the caller's to
 * free(). With c NULL, the text holds only "dlshare_up 0" (for a
 * collector's file when the daemon cannot be reached).
 * Returns 0, DLSHARE_EINVAL, DLSHARE_ENOMEM, DLSHARE_ECONN. */
DLSHARE_API int dlshare_metrics(dlshare_client *c, char **text, size_t *len);

/* Removes name: its versions can no longer be got; their memory goes when
 * the last lease does. Returns 0, DLSHARE_ENOENT, DLSHARE_EPERM, DLSHARE_ECONN. */
DLSHARE_API int dlshare_delete(dlshare_client *c, const char *name);

/* Deletes every name that starts with prefix and that this client's uid
 * may write (the rule of dlshare_delete); names it may not are left alone
 * and counted in *skipped. The daemon deletes a bounded batch per request;
 * this asks until none are left. *deleted and *skipped may be NULL.
 * prefix must not be empty. Returns 0 (also when nothing matched),
 * DLSHARE_EINVAL (an empty or impossible prefix), DLSHARE_ENOTSUP (a daemon
 * before protocol 1.4), DLSHARE_ECONN. */
DLSHARE_API int dlshare_delete_prefix(dlshare_client *c, const char *prefix,
				      uint64_t *deleted, uint64_t *skipped);

/* This process's cache of opened CUDA IPC allocations: how many are open
 * now (each stays open while a tensor on it lives) and how many were opened
 * since the process started. Both 0 without CUDA. */
DLSHARE_API void dlshare_cuda_cache_stats(unsigned long *open_now,
					  unsigned long *opened_total);

/* ---- DLPack helpers ------------------------------------------------------ */

/* Parses a dtype such as "float32", "int8", "uint16", "bfloat16", "bool",
 * "complex64". Returns 0 or DLSHARE_EINVAL. */
DLSHARE_API int dlshare_dtype_parse(const char *s, DLDataType *out);
/* Formats dtype into buf ("float32", or "code:bits:lanes" when unnamed).
 * Returns 0 or DLSHARE_E2BIG. */
DLSHARE_API int dlshare_dtype_format(DLDataType dtype, char *buf, size_t len);

/* The bytes of one element of dtype (bits / 8 * lanes), or 0 for a dtype
 * dlshare cannot share: an unknown type code, bits not a multiple of 8 or
 * over 256, lanes 0 or over 1024. The same rule the daemon applies. Any
 * thread. */
DLSHARE_API size_t dlshare_dtype_size(DLDataType dtype);

/* The bytes t's elements take laid out compact (row-major, no gaps): 0 when
 * a dimension is 0, whatever the others; strides and byte_offset do not
 * count. The same rule the library and the daemon apply to every tensor
 * they share. Returns 0 with *nbytes, or DLSHARE_EINVAL (t or nbytes NULL,
 * a dtype dlshare_dtype_size refuses, ndim outside 0..32, a NULL shape
 * with ndim > 0, a negative dimension, or more than INT64_MAX bytes). Any
 * thread; t stays the caller's. */
DLSHARE_API int dlshare_tensor_nbytes(const DLTensor *t, uint64_t *nbytes);

#ifdef __cplusplus
}
#endif

#endif
