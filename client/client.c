/* client — the connection: Hello, request/reply demux, the receiver thread,
 * the import cache and the release queue. */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "chan.h"
#include "cudalib.h"
#include "paths.h"

/* Lease ids sent in one Release packet (8 bytes each at most). */
#define CLIENT_RELEASE_BATCH 1024
/* Lease ids a request carries at most (Frame.releases). */
#define CLIENT_RELEASE_RIDE 64
/* Requests up to this size are packed on the stack (call_send). */
#define CLIENT_SEND_STACK_MAX 1024

static _Thread_local char errmsg[CLIENT_ERRMSG_MAX];

/* Connections of this process; the last one to go drains the CUDA event
 * pool (cudalib.c), so that a process done with dlshare holds no event. */
static atomic_int live_clients;

void errmsg_set(const char *msg)
{
	size_t n;

	/* Every call clears it first: no printf on the hot path. */
	if (!msg) {
		errmsg[0] = '\0';
		return;
	}
	n = strnlen(msg, sizeof(errmsg) - 1);
	memcpy(errmsg, msg, n);
	errmsg[n] = '\0';
}

const char *dlshare_last_error(void)
{
	return errmsg;
}

int client_errno(int err)
{
	switch (err) {
	case -ENOMEM:
		return DLSHARE_ENOMEM;
	case -EINVAL:
		return DLSHARE_EINVAL;
	case -E2BIG:
	case -EMSGSIZE:
		return DLSHARE_E2BIG;
	case -ENOENT:
	case -ECONNREFUSED:
	case -EPIPE:
	case -ECONNRESET:
	case -ENOTCONN:
		return DLSHARE_ECONN;
	case -EACCES:
	case -EPERM:
		return DLSHARE_EPERM;
	case -EMFILE:
	case -ENFILE:
		return DLSHARE_EMFILE; /* this process's, not the daemon's */
	default:
		return DLSHARE_EIO;
	}
}

int dlshare_socket_path(char *buf, size_t len)
{
	return paths_default_socket(buf, len) ? DLSHARE_E2BIG : 0;
}

void client_ref(dlshare_client *c)
{
	atomic_fetch_add(&c->refs, 1);
}

static void ibuf_unmap(struct ibuf *b)
{
	if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		cuda_close_mem(b->cuda_base, b->ordinal);
		return;
	}
	if (b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM) {
		cuda_vmm_unmap(b->cuda_base, b->size);
		return;
	}
	if (b->cuda_host)
		cuda_host_unregister(b->base);
	hostmem_unmap(b->base, b->size);
}

static void client_free(dlshare_client *c)
{
	struct ibuf *b, *tmp;
	struct mcache *mc, *mtmp;
	struct pending *p;

	/* Their pins go with the buffers below. */
	while (c->nwarm) {
		c->warm[--c->nwarm]->npins = 0;
		client_warm_free(c->warm[c->nwarm]);
	}
	free(atomic_load(&c->warm_spare));
	if (c->board)
		munmap((void *)c->board,
		       (size_t)c->board_slots * sizeof(uint64_t));

	HASH_ITER(hh, c->bufs, b, tmp) {
		HASH_DEL(c->bufs, b);
		ibuf_unmap(b);
		free(b);
	}
	/* Bundles still out keep theirs (they hold a reference). */
	HASH_ITER(hh, c->mcaches, mc, mtmp) {
		HASH_DEL(c->mcaches, mc);
		mcache_unref(mc);
	}
	/* Closed with the fork lock held: a child closes the copies of the
	 * fds it finds listed, and never an fd number we gave up. */
	fork_hold();
	fork_del(c);
	fork_close_fds(c);
	fork_unhold();
	/* No call is left (each holds a reference on c): the anchor only. */
	HASH_CLEAR(hh, c->pending);
	if ((p = atomic_exchange(&c->spare, NULL))) {
		pthread_cond_destroy(&p->cond);
		free(p);
	}
	wire_memo_clear(&c->memo);
	wire_block_free(atomic_exchange(&c->spare_msg, NULL));
	free(c->rel);
	free(c->unrecv);
	free(c->rbuf);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->send_lock);
	free(c);
}

void client_unref(dlshare_client *c)
{
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		client_free(c);
}

/* ---- import cache ------------------------------------------------------- */

static void ibuf_drop(dlshare_client *c, struct ibuf *b)
{
	HASH_DEL(c->bufs, b);
	ibuf_unmap(b);
	free(b);
}

/* Opens a CUDA IPC buffer: the allocation once per process (cuda.c caches
 * and counts), the buffer at its offset in it. */
static int ibuf_open_cuda(struct ibuf *b, const Dlshare__Buffer *wb)
{
	int ordinal, err;

	if (!wb->device || !wb->device->has_uuid ||
	    wb->device->uuid.len != CUDA_UUID_BYTES || !wb->has_ipc_handle ||
	    wb->ipc_handle.len != CUDA_IPC_HANDLE_BYTES)
		return DLSHARE_EPROTO;
	ordinal = cuda_ordinal(wb->device->uuid.data);
	if (ordinal < 0)
		return ordinal;
	err = cuda_open_mem(wb->ipc_handle.data, ordinal, &b->cuda_base);
	if (err)
		return err;
	b->ordinal = ordinal;
	b->base = (char *)b->cuda_base + wb->ipc_offset;
	return 0;
}

/* client_unpin's work, under c->lock. */
static void unpin_locked(dlshare_client *c, struct ibuf **pins, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct ibuf *b = pins[i];

		/* A device mapping closes with its last tensor: the handle
		 * comes with every reply, and an exporter must be able to
		 * free its memory once retired. Host mappings stay cached
		 * until the daemon frees the buffer. */
		if (--b->refs == 0 && (b->gone || c->dead ||
				       b->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC))
			ibuf_drop(c, b);
	}
}

void client_unpin(dlshare_client *c, struct ibuf **pins, size_t n)
{
	pthread_mutex_lock(&c->lock);
	unpin_locked(c, pins, n);
	pthread_mutex_unlock(&c->lock);
}

/* Maps a host buffer from fd, read-only (and registers it with CUDA for
 * kDLCUDAHost). Returns 0 or a DLSHARE_E* code. */
static int ibuf_map_host(struct ibuf *b, const Dlshare__Buffer *wb, int fd)
{
	int e;

	if (wb->size > SIZE_MAX || fd < 0)
		return DLSHARE_EPROTO;
	if (!wb->size)
		return 0;
	b->base = mmap(NULL, wb->size, PROT_READ, MAP_SHARED, fd, 0);
	/* Before Linux 6.7 a shared mapping of a write-sealed memfd fails
	 * when the fd is read-write (a daemon without /proc sends that one);
	 * a private read-only mapping shows the same pages. */
	if (b->base == MAP_FAILED && (errno == EPERM || errno == EACCES))
		b->base = mmap(NULL, wb->size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (b->base == MAP_FAILED) {
		b->base = NULL;
		return client_errno(-errno);
	}
	/* kDLCUDAHost: the producer asks that readers register it with CUDA
	 * too, read-only. Where that cannot be (no CUDA here, or a device
	 * without read-only registration) the reader gets kDLCPU pages:
	 * the data is the same. */
	if (wb->device->type == kDLCUDAHost) {
		e = cuda_host_register(b->base, wb->size, 1);
		if (e == DLSHARE_ENOTSUP)
			return 0;
		if (e) {
			munmap(b->base, wb->size);
			b->base = NULL;
			return e;
		}
		b->cuda_host = 1;
	}
	return 0;
}

/* Maps a cuda-vmm buffer from its fd on the local device of its UUID. */
static int ibuf_map_vmm(struct ibuf *b, const Dlshare__Buffer *wb, int fd,
			int writable)
{
	int ordinal, e;

	if (fd < 0 || !wb->device->has_uuid ||
	    wb->device->uuid.len != CUDA_UUID_BYTES || wb->size == 0)
		return DLSHARE_EPROTO;
	ordinal = cuda_ordinal(wb->device->uuid.data);
	if (ordinal < 0)
		return ordinal;
	b->ordinal = ordinal;
	e = cuda_vmm_import(fd, wb->size, ordinal, writable, &b->cuda_base);
	b->base = b->cuda_base;
	return e;
}

static int ibuf_new(dlshare_client *c, const Dlshare__Buffer *wb, int fd,
		    int writable, struct ibuf **out);

/* Under c->lock: the cached buffer wb names, or a new one mapped from fd
 * (-1 when none came) and added to the cache. Does not pin. A cuda-vmm
 * buffer is mapped writable only for its writer (the first to map it:
 * readers see it only once it is sealed). When a new one fails and why is
 * not NULL, why (whylen bytes) says why: the reader that maps it may be
 * another thread than the caller, whose dlshare_last_error() it is for;
 * the reader's own message is left as it was. */
static int ibuf_get(dlshare_client *c, const Dlshare__Buffer *wb, int fd,
		    int writable, struct ibuf **out, char *why, size_t whylen)
{
	struct ibuf *b = NULL;
	char mine[sizeof(errmsg)];
	int e;

	HASH_FIND(hh, c->bufs, &wb->id, sizeof(wb->id), b);
	if (b) {
		*out = b;
		return 0;
	}
	if (!why)
		return ibuf_new(c, wb, fd, writable, out);
	/* A new mapping (an mmap or a device import follows): the message
	 * a failure leaves is the caller's. */
	memcpy(mine, errmsg, sizeof(mine));
	errmsg[0] = '\0';
	e = ibuf_new(c, wb, fd, writable, out);
	if (e && errmsg[0])
		snprintf(why, whylen, "%s", errmsg);
	else if (e)
		snprintf(why, whylen, "buffer %llu of the version (%llu "
			 "bytes) could not be mapped: %s%s",
			 (unsigned long long)wb->id,
			 (unsigned long long)wb->size, dlshare_strerror(e),
			 e == DLSHARE_ENOMEM ? " (this process's address space "
			 "or map count is full; the same get maps it once "
			 "there is room)" : "");
	memcpy(errmsg, mine, sizeof(mine));
	return e;
}

/* ibuf_get's new buffer. */
static int ibuf_new(dlshare_client *c, const Dlshare__Buffer *wb, int fd,
		    int writable, struct ibuf **out)
{
	struct ibuf *b;
	int e;

	if (!wb->device)
		return DLSHARE_EPROTO;
	if (wb->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_HOST &&
	    wb->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC &&
	    wb->kind != DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM)
		return DLSHARE_ENOTSUP;
	if (!(b = calloc(1, sizeof(*b))))
		return DLSHARE_ENOMEM;
	b->id = wb->id;
	b->kind = wb->kind;
	b->size = wb->size;
	if (wb->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC)
		e = ibuf_open_cuda(b, wb);
	else if (wb->kind == DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_VMM)
		e = ibuf_map_vmm(b, wb, fd, writable);
	else
		e = ibuf_map_host(b, wb, fd);
	if (e) {
		free(b);
		return e;
	}
	HASH_ADD(hh, c->bufs, id, sizeof(b->id), b);
	*out = b;
	return 0;
}

int client_pin_buffer(dlshare_client *c, const Dlshare__Buffer *wb, int fd,
		      struct ibuf **out)
{
	int err;

	pthread_mutex_lock(&c->lock);
	err = ibuf_get(c, wb, fd, 1, out, NULL, 0);
	if (!err)
		(*out)->refs++;
	pthread_mutex_unlock(&c->lock);
	return err;
}

/* Appends id to the fds to tell the daemon never came. Under c->lock.
 * Returns 0 or DLSHARE_ENOMEM. */
static int unreceived_push(dlshare_client *c, uint64_t id)
{
	if (c->nunrecv == c->capunrecv) {
		size_t cap = c->capunrecv ? c->capunrecv * 2 : 16;
		uint64_t *a = realloc(c->unrecv, cap * sizeof(*a));

		if (!a)
			return DLSHARE_ENOMEM;
		c->unrecv = a;
		c->capunrecv = cap;
	}
	c->unrecv[c->nunrecv++] = id;
	return 0;
}

/* Receiver thread, under c->lock: pins the buffers a GetReply names,
 * mapping the fds it brings. Fails (and pins nothing) when a buffer is
 * neither cached nor attached, or a mapping fails. The fd of a manifest
 * memfd (1.4, after the buffers') goes to *manifest_fd, -1 when none. */
static int import_buffers(dlshare_client *c, Dlshare__GetReply *r, int *fds,
			  unsigned nfds, struct pending *p, int *manifest_fd)
{
	unsigned k = 0;
	int err = 0;

	*manifest_fd = -1;
	if (r->n_buffers > CLIENT_PINS_MAX)
		return DLSHARE_EPROTO;
	/* Every buffer is imported even after one failed: the daemon marked
	 * all of them as sent, so one not cached now could never be got
	 * again on this connection. */
	for (size_t i = 0; i < r->n_buffers; i++) {
		Dlshare__Buffer *wb = r->buffers[i];
		struct ibuf *b = NULL;
		int fd = -1, e;

		if (wb->fd_attached) {
			if (k == nfds) {
				err = DLSHARE_EPROTO;
				break;
			}
			fd = fds[k];
			fds[k++] = -1;
		}
		e = ibuf_get(c, wb, fd, 0, &b, err ? NULL : p->why,
			     sizeof(p->why));
		/* The mapping keeps the memory; the fd is no longer needed
		 * (and a duplicate one was never needed). */
		if (fd >= 0)
			close(fd);
		/* Its fd came but could not be mapped (no address space, no
		 * map slot, the device's import failed): as for an fd that
		 * never came, the daemon attaches it again next time (1.8),
		 * so that the same get may work later. */
		if (e && fd >= 0 && c->unreceived_ok &&
		    unreceived_push(c, wb->id) && !err)
			err = DLSHARE_ENOMEM;
		if (e && !err)
			err = e;
		if (!e) {
			b->refs++;
			p->pins[p->npins++] = b;
		}
	}
	/* A manifest with an id (1.5) is kept, also when a buffer failed:
	 * the daemon marked it as sent, and will not send its fd again. */
	if (r->manifest && (err == 0 || r->manifest->id)) {
		uint64_t id = r->manifest->id;
		struct mcache *mc = NULL;
		int fd = -1;

		if (r->manifest->fd_attached) {
			if (k == nfds) {
				err = err ? err : DLSHARE_EPROTO;
				goto out;
			}
			fd = fds[k];
			fds[k++] = -1;
		}
		if (id)
			HASH_FIND(hh, c->mcaches, &id, sizeof(id), mc);
		if (mc) {
			/* Known already: a duplicate fd is not needed. */
			if (fd >= 0)
				close(fd);
		} else if (id && fd >= 0) {
			mc = mcache_new(id, fd);
			if (mc)
				HASH_ADD(hh, c->mcaches, id, sizeof(mc->id), mc);
			else if (!err)
				err = DLSHARE_ENOMEM;
			if (!mc && c->unreceived_ok)
				(void)unreceived_push(c, id);
		} else if (fd >= 0) {
			*manifest_fd = fd; /* a 1.4 daemon's: not kept */
		} else if (!err) {
			err = DLSHARE_EPROTO; /* neither known nor attached */
		}
		if (mc) {
			atomic_fetch_add(&mc->refs, 1);
			p->mc = mc;
		}
	}
out:
	if (err) {
		for (size_t i = 0; i < p->npins; i++)
			if (--p->pins[i]->refs == 0 && p->pins[i]->gone)
				ibuf_drop(c, p->pins[i]);
		p->npins = 0;
		if (*manifest_fd >= 0) {
			close(*manifest_fd);
			*manifest_fd = -1;
		}
		if (p->mc) {
			mcache_unref(p->mc);
			p->mc = NULL;
		}
	}
	wire_close_fds(fds, nfds);
	return err;
}

/* Queues a lease for the receiver thread to release. Under c->lock.
 * Returns 1 when the thread must be woken. */
/* Appends lease to the release queue. Returns 1, or 0 without memory.
 * Under c->lock. */
static int rel_push(dlshare_client *c, uint64_t lease)
{
	if (c->nrel == c->caprel) {
		size_t cap = c->caprel ? c->caprel * 2 : 64;
		uint64_t *n = realloc(c->rel, cap * sizeof(*n));

		if (n) {
			c->rel = n;
			c->caprel = cap;
		}
	}
	/* Without memory for the queue the lease stays held until the
	 * connection closes: a leak bounded by the connection, never a
	 * crash. */
	if (c->nrel == c->caprel)
		return 0;
	c->rel[c->nrel++] = lease;
	/* Under c->lock, the only writer: a plain increment (no locked
	 * read-modify-write per release); atomic for get_fetch's read. */
	atomic_store_explicit(&c->rel_pushed,
			      atomic_load_explicit(&c->rel_pushed,
						   memory_order_relaxed) + 1,
			      memory_order_relaxed);
	return 1;
}

static int queue_release(dlshare_client *c, uint64_t lease)
{
	/* A dead connection took its leases with it. */
	if (c->dead || c->closed)
		return 0;
	return rel_push(c, lease);
}

/* ---- gets by the version board (1.7) --------------------------------------- */

void client_warm_name(struct warm_name *wn, const char *name)
{
	const unsigned char *p = (const unsigned char *)name;
	size_t len = strlen(name), n = len;
	uint64_t h = n, x;

	/* Eight bytes a step: two names of one prefix differ in the key. */
	for (; n >= 8; n -= 8, p += 8) {
		memcpy(&x, p, 8);
		h = (h ^ x) * UINT64_C(0x9e3779b97f4a7c15);
		h ^= h >> 29;
	}
	for (x = 0; n; n--)
		x = x << 8 | p[n - 1];
	h = (h ^ x) * UINT64_C(0x9e3779b97f4a7c15);
	wn->name = name;
	wn->len = len;
	wn->key = h ^ (h >> 32);
}

/* Takes references on a reply's message and kept manifest, for a second
 * holder (a kept record, or the reply a kept record answers). */
static void warm_hold(struct wire_msg *msg, struct mcache *mc)
{
	wire_msg_ref(msg);
	if (mc)
		atomic_fetch_add(&mc->refs, 1);
}

struct warm *client_warm_seed(dlshare_client *c, const struct warm_name *wn,
			      const struct reply *r)
{
	const Dlshare__GetReply *gr = r->msg->frame->get_reply;
	struct warm *w;

	if (!c->board || !gr->has_board_token || !gr->has_board_slot ||
	    gr->board_slot >= c->board_slots || gr->board_token == 0 ||
	    wn->len >= sizeof(w->name))
		return NULL;
	/* The spare record of one that went, else a new one. */
	w = atomic_exchange(&c->warm_spare, NULL);
	if (!w && !(w = malloc(sizeof(*w))))
		return NULL;
	warm_hold(r->msg, r->mc);
	w->msg = r->msg;
	w->mc = r->mc;
	w->lease = 0;
	w->token = gr->board_token;
	w->slot = gr->board_slot;
	w->key = wn->key;
	w->npins = 0;
	memcpy(w->name, wn->name, wn->len + 1);
	return w;
}

/* client_warm_free, keeping the record as c's spare when it has none. */
static void warm_recycle(dlshare_client *c, struct warm *w)
{
	mcache_unref(w->mc);
	wire_msg_free(w->msg);
	free(atomic_exchange(&c->warm_spare, w));
}

void client_warm_free(struct warm *w)
{
	if (!w)
		return;
	mcache_unref(w->mc);
	wire_msg_free(w->msg);
	free(w);
}

/* Takes c's kept record i out of its list (under c->lock). */
static struct warm *warm_remove_locked(dlshare_client *c, unsigned i)
{
	struct warm *w = c->warm[i];

	memmove(&c->warm[i], &c->warm[i + 1],
		(c->nwarm - i - 1) * sizeof(c->warm[0]));
	c->nwarm--;
	return w;
}

/* Takes c's kept record i away (under c->lock), unpinning its buffers:
 * the caller frees it. */
static struct warm *warm_drop_locked(dlshare_client *c, unsigned i)
{
	struct warm *w = warm_remove_locked(c, i);

	unpin_locked(c, w->pins, w->npins);
	w->npins = 0;
	return w;
}

/* Frees every kept record (under c->lock): their leases went with the
 * connection. */
static void warm_clear_locked(dlshare_client *c)
{
	while (c->nwarm)
		client_warm_free(warm_drop_locked(c, c->nwarm - 1));
}

static int rel_push(dlshare_client *c, uint64_t lease);

/* Whether kept record w still answers a get of its name: the board still
 * holds its token. */
static int warm_holds(const dlshare_client *c, const struct warm *w)
{
	return atomic_load_explicit(&c->board[w->slot], memory_order_acquire) ==
	       w->token;
}

/* Gives up kept records (under c->lock), queueing their leases' releases:
 * every one with all set (the callers went quiet), else those whose token
 * no longer holds (their versions may be superseded: they must not live
 * on because this reader keeps calling). */
static void warm_release_locked(dlshare_client *c, int all)
{
	for (unsigned i = c->nwarm; i-- > 0;) {
		struct warm *w;

		if (!all && warm_holds(c, c->warm[i]))
			continue;
		w = warm_drop_locked(c, i);
		/* Without memory for the queue the lease stays held until
		 * the connection closes (as rel_push says). */
		rel_push(c, w->lease);
		warm_recycle(c, w);
	}
}

/* Sends a packet on c's socket (send_lock held), counting it: a request
 * through the channel says how many went before it (proto/chan.h).
 * Returns as wire_send. */
static int sock_send(dlshare_client *c, const uint8_t *data, size_t len,
		     const int *fds, unsigned nfds, int flags)
{
	int err = wire_send(c->fd, data, len, fds, nfds, flags);

	if (!err)
		atomic_fetch_add_explicit(&c->tx_packets, 1,
					  memory_order_relaxed);
	return err;
}

/* ---- the reader role ------------------------------------------------------ */

/* The receiver thread leaves the socket to callers while they keep calling
 * and looks again after this long: a push that comes while nobody calls is
 * handled within about twice that. */
#define CLIENT_IDLE_MS 20
/* A caller reading for its reply wakes this often to see whether another
 * thread finished it (the connection failed, or was closed while a call
 * was in flight). The socket's receive timeout. */
#define CLIENT_LEAD_CHECK_MS 1000
/* A connection asks for its request channel (1.9) at the call that could
 * use one after this many such calls: one that makes a few (a CLI, a
 * short-lived worker) costs the daemon no memfd, mapping and eventfd. */
#define CLIENT_CHAN_AFTER 32

/* Threads to wake once c->lock is dropped: signalled under the lock, a
 * woken thread would block on it at once. Each entry holds a reference on
 * its pending, so its condition variable outlives the signal. */
struct wakeq {
	struct pending *done;    /* completed, linked by wnext */
	struct pending *lead;    /* offered the reader role */
	const struct pending *self; /* the reader's own request: never queued */
	int kick_rx;             /* the receiver thread has work (Retired, or
				  * the connection failed) */
};

/* The last reference makes p c's spare for the next call, if c has
 * none; else p is freed. c is alive (whoever holds p's reference holds
 * one on c). */
static void pending_unref(dlshare_client *c, struct pending *p)
{
	struct pending *none = NULL;

	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	if (atomic_compare_exchange_strong(&c->spare, &none, p))
		return;
	pthread_cond_destroy(&p->cond);
	free(p);
}

/* Under c->lock: the call that has waited longest for its reply (the
 * first after the anchor), or NULL. */
static struct pending *oldest_call(dlshare_client *c)
{
	return c->pending_anchor.hh.next;
}

/* Under c->lock: p is done; wake its owner. A pending completes once, so
 * it is on one list at most. */
static void wakeq_done(struct wakeq *wq, struct pending *p)
{
	if (p == wq->self)
		return;
	atomic_fetch_add(&p->refs, 1);
	p->wnext = wq->done;
	wq->done = p;
}

/* Without c->lock: wakes whom wq names. */
static void wakeq_run(dlshare_client *c, struct wakeq *wq)
{
	struct pending *p = wq->done;
	uint64_t one = 1;

	while (p) {
		struct pending *next = p->wnext;

		pthread_cond_signal(&p->cond);
		pending_unref(c, p);
		p = next;
	}
	wq->done = NULL;
	if (wq->lead) {
		pthread_cond_signal(&wq->lead->cond);
		pending_unref(c, wq->lead);
		wq->lead = NULL;
	}
	if (wq->kick_rx && write(c->wake_fd, &one, sizeof(one)) < 0) {
		/* The counter is full, so the thread is awake anyway. */
	}
	wq->kick_rx = 0;
}

/* Under c->lock, when nobody reads: offers the reader role to the caller
 * that has waited longest (any caller takes it as it comes, too). Without
 * callers the receiver thread takes it once they have gone quiet. */
static void handoff(dlshare_client *c, struct wakeq *wq)
{
	struct pending *p = oldest_call(c);

	if (c->reading || c->dead || !p || wq->lead)
		return;
	atomic_fetch_add(&p->refs, 1);
	wq->lead = p;
}

/* ---- reading ------------------------------------------------------------ */

/* Under c->lock: every waiter gets err; the connection is dead. */
static void fail_all(dlshare_client *c, int err, struct wakeq *wq)
{
	struct pending *p, *tmp;

	c->dead = 1;
	HASH_ITER(hh, c->pending, p, tmp) {
		if (p == &c->pending_anchor)
			continue;
		HASH_DEL(c->pending, p);
		p->done = 1;
		p->err = err;
		wakeq_done(wq, p);
	}
	if ((p = c->solo)) {
		c->solo = NULL;
		p->done = 1;
		p->err = err;
		wakeq_done(wq, p);
	}
}

/* Under c->lock: the connection failed with err (a DLSHARE_E* code, or 0
 * for "someone else found it failed"). Waiters get DLSHARE_ECONN for
 * failures of ours or the wire, the daemon's code for its last word. */
static void conn_fail(dlshare_client *c, int err, struct wakeq *wq)
{
	if (err == 0 || err == DLSHARE_EIO || err == DLSHARE_ENOMEM ||
	    err == DLSHARE_EPROTO)
		err = DLSHARE_ECONN;
	fail_all(c, err, wq);
	c->nrel = 0;
	/* Their leases went with the connection. */
	warm_clear_locked(c);
	wq->kick_rx = 1;
}

/* Sends queued releases without blocking. Returns 0, or -EAGAIN when the
 * socket is full (try again when writable), or -errno. Called with c->lock
 * held. */
static int flush_releases(dlshare_client *c)
{
	/* A lease id takes at most 10 bytes on the wire: a frame of fit ids
	 * fits the daemon's packet, whatever --max-packet it was given (512
	 * bytes until the HelloReply, 4096 at least after it). */
	size_t fit = (c->send_max - 64) / 10;

	if (fit > CLIENT_RELEASE_BATCH)
		fit = CLIENT_RELEASE_BATCH;
	while (c->nrel) {
		size_t n = c->nrel < fit ? c->nrel : fit;
		Dlshare__Frame f = DLSHARE__FRAME__INIT;
		Dlshare__Release r = DLSHARE__RELEASE__INIT;
		uint8_t *data;
		size_t len;
		int err;

		r.n_leases = n;
		r.leases = c->rel;
		f.id = 0; /* no reply wanted */
		f.body_case = DLSHARE__FRAME__BODY_RELEASE;
		f.release = &r;
		err = wire_encode(&f, c->send_max, &data, &len);
		if (err)
			return err;
		pthread_mutex_lock(&c->send_lock);
		err = sock_send(c, data, len, NULL, 0, MSG_DONTWAIT);
		pthread_mutex_unlock(&c->send_lock);
		free(data);
		if (err)
			return err;
		memmove(c->rel, c->rel + n, (c->nrel - n) * sizeof(*c->rel));
		c->nrel -= n;
	}
	return 0;
}

/* Under c->lock. Export deleters may call back into the library, so a
 * Retired export goes to the receiver thread, which frees it outside the
 * lock and outside any call. */
static void handle_push(dlshare_client *c, Dlshare__Frame *f,
			struct wakeq *wq)
{
	if (f->body_case == DLSHARE__FRAME__BODY_BUFFER_GONE) {
		for (size_t i = 0; i < f->buffer_gone->n_ids; i++) {
			struct ibuf *b = NULL;

			struct mcache *mc = NULL;

			/* A manifest (1.5) shares the buffers' ids. */
			HASH_FIND(hh, c->mcaches, &f->buffer_gone->ids[i],
				  sizeof(uint64_t), mc);
			if (mc) {
				HASH_DEL(c->mcaches, mc);
				mcache_unref(mc);
				continue;
			}
			HASH_FIND(hh, c->bufs, &f->buffer_gone->ids[i],
				  sizeof(uint64_t), b);
			if (!b)
				continue;
			b->gone = 1;
			if (b->refs == 0)
				ibuf_drop(c, b);
		}
	} else if (f->body_case == DLSHARE__FRAME__BODY_RETIRED) {
		for (struct export **pp = &c->exports; *pp; pp = &(*pp)->next) {
			struct export *e = *pp;

			if (e->version == f->retired->version &&
			    strcmp(e->name, f->retired->name) == 0) {
				*pp = e->next;
				e->next = c->retired;
				c->retired = e;
				wq->kick_rx = 1;
				break;
			}
		}
	}
}

static void exports_free(struct export *e)
{
	while (e) {
		struct export *next = e->next;

		export_free(e);
		e = next;
	}
}

/* Frees a decoded packet, keeping its block for the next decode when c
 * keeps none yet (any thread). */
static void msg_done(dlshare_client *c, struct wire_msg *m)
{
	struct wire_msg *none = NULL, *b = wire_msg_keep(m);

	if (b && !atomic_compare_exchange_strong(&c->spare_msg, &none, b))
		wire_block_free(b);
}

/* A reply f came without (all) its fds: the daemon counts every buffer
 * (and kept manifest) it attached as this connection's, and will not
 * attach them again unless told (Frame.unreceived, 1.8). Under c->lock.
 * Returns 0, or a DLSHARE_E* code when the connection cannot go on
 * (a daemon before 1.8 has no way to send them again). */
static int unreceived_note(dlshare_client *c, const Dlshare__Frame *f)
{
	const Dlshare__GetReply *g;
	int err = 0;

	if (f->body_case != DLSHARE__FRAME__BODY_GET_REPLY)
		return 0; /* a CreateReply's fds are the writer's, once */
	g = f->get_reply;
	if (!c->unreceived_ok) {
		snprintf(c->fatal_msg, sizeof(c->fatal_msg), "out of file "
			 "descriptors (RLIMIT_NOFILE) for a reply's buffers, "
			 "which a daemon before protocol 1.8 cannot send "
			 "again");
		return DLSHARE_EMFILE;
	}
	for (size_t i = 0; !err && i < g->n_buffers; i++)
		if (g->buffers[i]->fd_attached)
			err = unreceived_push(c, g->buffers[i]->id);
	if (!err && g->manifest && g->manifest->fd_attached &&
	    g->manifest->id)
		err = unreceived_push(c, g->manifest->id);
	return err;
}

/* Hands a reply to its waiting caller (lost: it came without all of its
 * fds). Under c->lock. Returns 1 when a caller was waiting for it, 0 when
 * nobody was (the packet is dropped), or a DLSHARE_E* code when the
 * connection cannot go on. */
static int deliver(dlshare_client *c, struct wire_msg *m, int *fds,
		   unsigned nfds, int lost, struct wakeq *wq)
{
	Dlshare__Frame *f = m->frame;
	struct pending *p = NULL;
	int err = 0;

	if (lost) {
		/* None of the reply's fds is used: its caller fails with
		 * DLSHARE_EMFILE, and the daemon hears which never came. */
		wire_close_fds(fds, nfds);
		nfds = 0;
		if ((err = unreceived_note(c, f))) {
			msg_done(c, m);
			return err;
		}
	}
	if (c->solo && c->solo->id == f->id)
		p = c->solo;
	else
		HASH_FIND(hh, c->pending, &f->id, sizeof(f->id), p);
	if (!p) {
		wire_close_fds(fds, nfds);
		msg_done(c, m);
		return 0;
	}
	if (lost) {
		p->lost = 1;
	} else if (f->body_case == DLSHARE__FRAME__BODY_GET_REPLY) {
		int mfd;

		err = import_buffers(c, f->get_reply, fds, nfds, p, &mfd);
		/* The manifest's fd goes to the caller, as a reply's fds do. */
		nfds = 0;
		if (mfd >= 0)
			fds[nfds++] = mfd;
		/* A lease we cannot use: the caller gives it back as its
		 * kind wants (call_result keeps the reply for it; a take's
		 * goes back to its queue, not consumed). */
	} else if (f->body_case == DLSHARE__FRAME__BODY_PUBLISH_REPLY &&
		   p->export) {
		/* Registered before anything after this reply is read, so
		 * a Retired for it always finds it. */
		p->export->version = f->publish_reply->version;
		p->export->next = c->exports;
		c->exports = p->export;
		p->export = NULL;
	}
	if (p == c->solo)
		c->solo = NULL;
	else
		HASH_DEL(c->pending, p);
	p->msg = m;
	memcpy(p->fds, fds, nfds * sizeof(int));
	p->nfds = nfds;
	p->err = err;
	p->done = 1;
	wakeq_done(wq, p);
	return 1;
}

/* The reader, without c->lock: receives and decodes one packet into
 * c->rbuf, waiting for one at most CLIENT_LEAD_CHECK_MS unless flags has
 * MSG_DONTWAIT. Returns 0 with *m and its fds, 2 the same but with fewer
 * fds than the packet carried (this process was out of fds: the rest are
 * gone), 1 when none came, or a DLSHARE_E* code: the connection is
 * unusable (every fd it brought is closed). */
static int conn_read(dlshare_client *c, struct wire_msg **m, int *fds,
		     unsigned *nfds, int flags)
{
	size_t len = 0;
	int r, lost;

	*m = NULL;
	*nfds = 0;
	r = wire_recv(c->fd, c->rbuf, c->max_packet, fds, WIRE_FDS_MAX, &len,
		      nfds, flags);
	if (r == -EAGAIN)
		return 1;
	lost = r == -EMFILE;
	if ((r && !lost) || (len == 0 && *nfds == 0))
		return r == -EMSGSIZE || r == -EPROTO ? DLSHARE_EPROTO :
		       DLSHARE_ECONN;
	c->rx_packets++;
	if (wire_decode_in(atomic_exchange(&c->spare_msg, NULL), c->rbuf, len,
			   0, &c->memo, m) ||
	    (lost ? (*m)->frame->nfds <= *nfds :
		    (*m)->frame->nfds != *nfds)) {
		if (*m)
			wire_msg_free(*m);
		*m = NULL;
		wire_close_fds(fds, *nfds);
		return DLSHARE_EPROTO;
	}
	return lost ? 2 : 0;
}

/* The reader, under c->lock: handles a packet (and takes it; lost: it
 * came without all of its fds, conn_read's 2). Returns 1 when it answered
 * a waiting call, 0, or a DLSHARE_E* code (the daemon's last word, or why
 * the connection cannot go on). */
static int dispatch(dlshare_client *c, struct wire_msg *m, int *fds,
		    unsigned nfds, int lost, struct wakeq *wq)
{
	Dlshare__Frame *f = m->frame;
	int err = 0;

	if (f->id != 0)
		return deliver(c, m, fds, nfds, lost, wq);
	/* An Error with id 0 is the daemon's last word before it hangs up:
	 * every waiter gets its code. */
	if (f->body_case == DLSHARE__FRAME__BODY_ERROR) {
		err = f->error->code < 0 ? f->error->code : DLSHARE_EPROTO;
		snprintf(c->fatal_msg, sizeof(c->fatal_msg), "%s",
			 f->error->message ? f->error->message : "");
	} else {
		handle_push(c, f, wq);
	}
	wire_close_fds(fds, nfds);
	msg_done(c, m);
	return err;
}

/* ---- the receiver thread ---------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sends the releases whose device work is done. Returns 1 while some still
 * wait. Receiver thread. */
static int deferred_poll(dlshare_client *c)
{
	struct lease_ref *done = NULL, **pp;
	unsigned ndone = 0;
	int waiting = 0;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->deferred; *pp;) {
		struct lease_ref *lr = *pp;

		if (cuda_event_done(lr->event) == 0) {
			waiting = 1;
			pp = &lr->next;
			continue;
		}
		*pp = lr->next;
		lr->next = done;
		done = lr;
		ndone++;
	}
	/* Off the list, and not yet queued: a disconnect now must wait for
	 * them, or it closes the connection first and their releases are
	 * lost (a released take of a queue name would be redelivered). */
	c->deferred_busy += ndone;
	pthread_mutex_unlock(&c->lock);
	while (done) {
		struct lease_ref *lr = done;

		done = lr->next;
		cuda_event_drop(lr->event);
		client_unpin(c, lr->pins, lr->npins);
		client_release(c, lr->lease);
		free(lr);
	}
	if (ndone) {
		pthread_mutex_lock(&c->lock);
		c->deferred_busy -= ndone;
		pthread_mutex_unlock(&c->lock);
	}
	return waiting;
}

/* Waits until the receiver thread queued the releases it took off the
 * deferred list (not from the receiver thread itself). */
static void deferred_settle(dlshare_client *c)
{
	struct timespec ms = { 0, 1000000L };

	if (c->rx_started && pthread_equal(pthread_self(), c->rx))
		return;
	pthread_mutex_lock(&c->lock);
	while (c->deferred_busy) {
		pthread_mutex_unlock(&c->lock);
		nanosleep(&ms, NULL);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
}

void client_release_after(dlshare_client *c, struct lease_ref *lr)
{
	uint64_t one = 1;
	int queued = 0;

	pthread_mutex_lock(&c->lock);
	if (!c->closed && !c->dead) {
		lr->next = c->deferred;
		c->deferred = lr;
		queued = 1;
	}
	pthread_mutex_unlock(&c->lock);
	if (queued) {
		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* Already signalled. */
		}
		return;
	}
	/* Nobody watches events any more: wait here, rather than close a
	 * mapping that queued kernels still read. */
	cuda_event_wait(lr->event);
	cuda_event_drop(lr->event);
	client_unpin(c, lr->pins, lr->npins);
	free(lr);
}

/* Waits for the device work of every deferred release, then unpins its
 * memory, and (release) queues its lease's release; without, the lease
 * goes with the connection. */
static void deferred_drain(dlshare_client *c, int release)
{
	struct lease_ref *lr;

	pthread_mutex_lock(&c->lock);
	lr = c->deferred;
	c->deferred = NULL;
	pthread_mutex_unlock(&c->lock);
	while (lr) {
		struct lease_ref *next = lr->next;

		cuda_event_wait(lr->event);
		cuda_event_drop(lr->event);
		client_unpin(c, lr->pins, lr->npins);
		if (release)
			client_release(c, lr->lease);
		free(lr);
		lr = next;
	}
}

/* Receiver thread: whether dlshare_disconnect() began (it then hangs up
 * itself, once device work on leased memory is done). */
static int closed_here(dlshare_client *c)
{
	int closed;

	pthread_mutex_lock(&c->lock);
	closed = c->closed;
	pthread_mutex_unlock(&c->lock);
	return closed;
}

/* Receiver thread, once the connection failed (a bad packet, a send
 * error, a Hello that timed out) but nobody disconnected: hangs up at
 * once, so that the daemon drops this connection's leases (also those
 * the application released since, which can no longer be sent) and its
 * pending versions, instead of keeping them, and the versions they pin,
 * until dlshare_disconnect(). Device work still queued on leased memory
 * is waited for first, as dlshare_disconnect() does. The fd itself stays
 * open until the client is freed: other threads may still be in a
 * send or receive on it, and its number must not be reused under them;
 * a shut-down socket fails them at once. */
static void hang_up(dlshare_client *c)
{
	deferred_drain(c, 0);
	shutdown(c->fd, SHUT_RDWR);
}

/* The receiver thread: sends queued releases, watches deferred ones, frees
 * retired exports, and reads the socket while no caller does — taking the
 * reader role only once callers have gone quiet for CLIENT_IDLE_MS, and
 * giving it back as soon as it answered one, so that a reply wakes one
 * thread, the caller's own. */
/* The receiver thread's own state. */
struct rx {
	struct wakeq wq;
	uint64_t calls_seen;
	int64_t quiet_since;     /* since when no call began, as far as we saw */
	int reader;              /* this thread reads the socket */
	int want_out;            /* releases wait for room in the socket */
	int timeout;             /* of the next poll, in ms; -1: none */
};

/* Gives the socket back to the callers (called with c->lock held). */
static void rx_step_back(dlshare_client *c, struct rx *x, int64_t now)
{
	c->reading = 0;
	c->rx_reading = 0;
	x->reader = 0;
	x->quiet_since = now;
	handoff(c, &x->wq);
}

/* One turn's bookkeeping: sends queued releases, frees retired exports,
 * and takes the socket over when the callers went quiet. Returns 0 to go
 * on, or 1 to stop with *err. */
static int rx_turn(dlshare_client *c, struct rx *x, int *err)
{
	struct export *retired;
	int64_t now = now_ms();
	int r;

	x->timeout = -1;
	pthread_mutex_lock(&c->lock);
	if (c->closed || c->dead) {
		/* closed: releases still queued go first, as many as the
		 * socket takes without blocking (dlshare_disconnect waits
		 * for room for the rest): a released take of a queue name is
		 * consumed, where the socket's close alone would put it back
		 * for another taker. dead: a caller found the connection
		 * failed. */
		if (c->closed && !c->dead)
			flush_releases(c);
		*err = c->closed ? DLSHARE_ECLOSED : 0;
		pthread_mutex_unlock(&c->lock);
		return 1;
	}
	if (c->calls != x->calls_seen) {
		x->calls_seen = c->calls;
		x->quiet_since = now;
	}
	/* Kept leases (1.7) live while calls come, and while their tokens
	 * hold: once the callers went quiet for CLIENT_IDLE_MS they go. */
	if (c->nwarm)
		warm_release_locked(c, x->reader ||
				       now - x->quiet_since >= CLIENT_IDLE_MS);
	r = flush_releases(c);
	retired = c->retired;
	c->retired = NULL;
	/* Deleters may call into the library: not while callers wait for
	 * us to read their replies. */
	if (retired && x->reader)
		rx_step_back(c, x, now);
	if (!x->reader && !retired && !c->reading) {
		if (now - x->quiet_since >= CLIENT_IDLE_MS) {
			c->reading = 1;
			c->rx_reading = 1;
			x->reader = 1;
		} else {
			x->timeout = (int)(CLIENT_IDLE_MS -
					   (now - x->quiet_since));
		}
	}
	pthread_mutex_unlock(&c->lock);
	wakeq_run(c, &x->wq);
	exports_free(retired);
	x->want_out = r == -EAGAIN;
	if (r && r != -EAGAIN) {
		*err = DLSHARE_ECONN;
		return 1;
	}
	return 0;
}

/* Sleeps until something happens: releases waiting for device work are
 * checked every millisecond; otherwise until the socket or the wake fd
 * says so, or, while callers read, until they may have gone quiet.
 * Returns 1 when a packet may be read, 0 when not, or -1 with *err. */
static int rx_wait(dlshare_client *c, struct rx *x, int *err)
{
	struct pollfd pfd[2];
	uint64_t v;

	if (deferred_poll(c))
		x->timeout = 1;
	else if (!x->reader && x->timeout < 0)
		x->timeout = CLIENT_IDLE_MS; /* a caller reads */
	pfd[0] = (struct pollfd){
		.fd = c->fd,
		.events = (x->reader ? POLLIN : 0) | (x->want_out ? POLLOUT : 0),
	};
	/* Not even a hang-up of the socket is ours while a caller reads
	 * (poll reports one whatever the events). */
	if (!pfd[0].events)
		pfd[0].fd = -1;
	pfd[1] = (struct pollfd){ .fd = c->wake_fd, .events = POLLIN };
	if (poll(pfd, 2, x->timeout) < 0) {
		if (errno == EINTR)
			return 0;
		*err = DLSHARE_EIO;
		return -1;
	}
	if ((pfd[1].revents & POLLIN) &&
	    read(c->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
		*err = DLSHARE_EIO;
		return -1;
	}
	return x->reader && (pfd[0].revents & (POLLIN | POLLHUP | POLLERR));
}

/* Reads one packet and hands it to whoever waits for it. Returns 0, or -1
 * with *err. */
static int rx_read(dlshare_client *c, struct rx *x, int *err)
{
	int fds[WIRE_FDS_MAX];
	unsigned nfds = 0;
	struct wire_msg *m = NULL;
	int r;

	r = conn_read(c, &m, fds, &nfds, MSG_DONTWAIT);
	if (r == 1)
		return 0;
	if (r && r != 2) {
		*err = r;
		return -1;
	}
	pthread_mutex_lock(&c->lock);
	r = dispatch(c, m, fds, nfds, r == 2, &x->wq);
	/* A caller is back: leave the socket to the callers until they go
	 * quiet again. */
	if (r == 1)
		rx_step_back(c, x, now_ms());
	pthread_mutex_unlock(&c->lock);
	x->wq.kick_rx = 0; /* we are the receiver thread */
	wakeq_run(c, &x->wq);
	if (r < 0) {
		*err = r;
		return -1;
	}
	return 0;
}

/* The receiver thread: reads the socket while no caller does (replies
 * for callers, pushes from the daemon), sends queued releases, frees
 * retired exports; on a failure, fails every call and hangs up. */
static void *rx_main(void *arg)
{
	dlshare_client *c = arg;
	struct rx x = { .timeout = -1 };
	struct export *retired;
	int err = 0, r;

	/* The library's own thread holds the reader role at times and runs
	 * export deleters: like a caller's thread in a call, never cancelled
	 * (internal.h, CALL_UNCANCELLED). */
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	/* dlshare_connect waits for this: see there. */
	sem_post(c->rx_up);
	while (!rx_turn(c, &x, &err)) {
		r = rx_wait(c, &x, &err);
		if (r < 0 || (r > 0 && rx_read(c, &x, &err) < 0))
			break;
	}
	pthread_mutex_lock(&c->lock);
	if (x.reader) {
		c->reading = 0;
		c->rx_reading = 0;
	}
	if (!c->dead || oldest_call(c)) {
		size_t nrel = c->nrel;
		int was_dead = c->dead;

		conn_fail(c, err, &x.wq);
		/* Closed, the socket sound: releases the closed-connection
		 * turn could not send without blocking are not dropped but
		 * left to dlshare_disconnect, which waits for room. */
		if (err == DLSHARE_ECLOSED && !was_dead) {
			c->nrel = nrel;
			c->rel_left = 1;
		}
	}
	retired = c->retired;
	c->retired = NULL;
	pthread_mutex_unlock(&c->lock);
	x.wq.kick_rx = 0;
	wakeq_run(c, &x.wq);
	exports_free(retired);
	if (!closed_here(c))
		hang_up(c);
	client_unref(c);
	return NULL;
}

/* ---- calls -------------------------------------------------------------- */

void reply_free(dlshare_client *c, struct reply *r)
{
	wire_close_fds(r->fds, r->nfds);
	r->nfds = 0;
	if (r->npins)
		client_unpin(c, r->pins, r->npins);
	r->npins = 0;
	if (r->mc)
		mcache_unref(r->mc);
	r->mc = NULL;
	msg_done(c, r->msg);
	r->msg = NULL;
}

/* Under c->lock: DLSHARE_ETIMEDOUT when the Hello's deadline passed (and
 * the connection's last word says so), else 0. */
static int hello_overdue(dlshare_client *c)
{
	if (!c->deadline || now_ms() < c->deadline)
		return 0;
	snprintf(c->fatal_msg, sizeof(c->fatal_msg), "the daemon did not "
		 "answer Hello within %d ms (a listener that never accepts, "
		 "or a hung daemon)", (int)c->timeout_ms);
	return DLSHARE_ETIMEDOUT;
}

static void read_until_done(dlshare_client *c, struct pending *p,
			    struct wakeq *wq);

/* A caller that has sent p and found nobody reading, under c->lock: takes
 * the reader role and reads until p is done (its reply came, or the
 * connection failed), dispatching whatever comes first: other callers'
 * replies, pushes. Gives the role up and returns with c->lock held; wq
 * says whom to wake once it is dropped. */
static void lead(dlshare_client *c, struct pending *p, struct wakeq *wq)
{
	c->reading = 1;
	pthread_mutex_unlock(&c->lock);
	read_until_done(c, p, wq);
}

/* The reader, without c->lock: reads one packet (flags as conn_read's)
 * and handles it. Returns 1 with c->lock held when p is done or the
 * connection failed, else 0 without it. */
static int read_step(dlshare_client *c, struct pending *p, struct wakeq *wq,
		     int flags)
{
	int fds[WIRE_FDS_MAX];
	unsigned nfds = 0;
	struct wire_msg *m = NULL;
	int r;

	r = conn_read(c, &m, fds, &nfds, flags);
	pthread_mutex_lock(&c->lock);
	if (r == 0 || r == 2)
		r = dispatch(c, m, fds, nfds, r == 2, wq);
	else if (r == 1)
		r = hello_overdue(c);
	if (r < 0 && !c->dead)
		conn_fail(c, r, wq);
	/* p is done when its reply came, or when another thread failed
	 * every call (the receiver thread, at disconnect). */
	if (p->done || c->dead)
		return 1;
	pthread_mutex_unlock(&c->lock);
	wakeq_run(c, wq);
	return 0;
}

/* lead's loop, entered with the reader role and without c->lock (a solo
 * call enters here straight from its send). Returns with c->lock held. */
static void read_until_done(dlshare_client *c, struct pending *p,
			    struct wakeq *wq)
{
	/* A blocking receive, no poll first: one system call per packet,
	 * like a bare round trip. It times out (SO_RCVTIMEO) so that we see
	 * when another thread failed our call. */
	while (!read_step(c, p, wq, 0))
		;
	c->reading = 0;
	handoff(c, wq);
}

/* A request on its way: what client_call's steps share. */
struct call {
	dlshare_client *c;
	Dlshare__Frame *req;
	struct pending *p;
	struct wakeq wq;
	uint64_t ride[CLIENT_RELEASE_RIDE]; /* releases riding on it (1.1) */
	size_t nride;
	uint64_t *unrecv;        /* Frame.unreceived riding on it (1.8) */
	size_t nunrecv;
	int solo;                /* it took the reader role in call_begin */
	void *chan;              /* c's request channel then, or NULL */
};

/* Registers req as pending with a fresh id, queued releases riding on
 * it. Returns 0, with a reference on c, or a DLSHARE_E* code. */
static int call_begin(struct call *k, struct export *export)
{
	dlshare_client *c = k->c;
	struct pending *p = atomic_exchange(&c->spare, NULL);
	int err;

	if (p) {
		/* A finished call's: what a call reads is set again (hh
		 * is HASH_ADD's, the arrays are read up to their counts). */
		p->wnext = NULL;
		p->done = 0;
		p->err = 0;
		p->msg = NULL;
		p->nfds = 0;
		p->npins = 0;
		p->mc = NULL;
		p->lost = 0;
		p->why[0] = '\0';
	} else {
		if (!(p = util_zalloc(1, sizeof(*p))))
			return DLSHARE_ENOMEM;
		pthread_cond_init(&p->cond, NULL);
	}
	atomic_init(&p->refs, 1);
	k->p = p;
	k->wq.self = p;
	pthread_mutex_lock(&c->lock);
	if (c->closed || c->dead) {
		err = c->closed ? DLSHARE_ECLOSED : DLSHARE_ECONN;
		errmsg_set(c->fatal_msg);
		pthread_mutex_unlock(&c->lock);
		pending_unref(c, p);
		return err;
	}
	p->id = k->req->id = c->next_id++;
	p->export = export;
	/* Kept leases (1.7) ride on any request but a Get (a reader that
	 * asks for its stats, or does anything else, holds no lease it
	 * freed: a release rides on the next call, as before 1.7). A Get
	 * leaves them: a reader of several names keeps each, and those
	 * whose token went leave at the receiver thread's next turn (within
	 * CLIENT_IDLE_MS) or with the next get of their name. */
	if (c->nwarm && k->req->body_case != DLSHARE__FRAME__BODY_GET)
		warm_release_locked(c, 1);
	if (c->piggyback && c->nrel) {
		k->nride = c->nrel < CLIENT_RELEASE_RIDE ? c->nrel :
			   CLIENT_RELEASE_RIDE;
		memcpy(k->ride, c->rel + c->nrel - k->nride,
		       k->nride * sizeof(*k->ride));
		c->nrel -= k->nride;
		k->req->releases = k->ride;
		k->req->n_releases = k->nride;
	}
	/* Fds that never came (1.8) ride too, all of them: the request may
	 * be the get that needs them again. */
	if (c->nunrecv) {
		k->unrecv = c->unrecv;
		k->nunrecv = c->nunrecv;
		c->unrecv = NULL;
		c->nunrecv = c->capunrecv = 0;
		k->req->unreceived = k->unrecv;
		k->req->n_unreceived = k->nunrecv;
	}
	if (!c->reading && HASH_COUNT(c->pending) == 1) {
		/* Nobody reads, and no other call waits (the anchor only):
		 * this one reads its own reply, straight after its send.
		 * Its reply is then the only one that can come, so holding
		 * the role through a send that blocks keeps nobody's reply
		 * unread. */
		c->reading = 1;
		c->solo = p;
		k->solo = 1;
		k->chan = c->chan;
	} else {
		HASH_ADD(hh, c->pending, id, sizeof(p->id), p);
	}
	c->calls++;
	/* We may read the socket and use c until we return, even if another
	 * thread disconnects meanwhile. */
	client_ref(c);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* The unreceived ids k took, back to the client's list for the next
 * request (k's was not sent). */
static void unreceived_back(struct call *k)
{
	dlshare_client *c = k->c;

	pthread_mutex_lock(&c->lock);
	/* Without memory for them, those buffers' gets fail with
	 * DLSHARE_EPROTO on this connection, as before 1.8. */
	for (size_t i = 0; i < k->nunrecv; i++)
		(void)unreceived_push(c, k->unrecv[i]);
	pthread_mutex_unlock(&c->lock);
}

/* Packs k's request into buf (cap bytes), with no malloc: a Get by hand
 * (wire_pack_fast), anything else by protobuf-c. Returns its length, or 0
 * when it does not fit. */
static size_t call_pack(const struct call *k, uint8_t *buf, size_t cap)
{
	size_t len = wire_pack_fast(k->req, buf, cap);

	if (len)
		return len;
	len = dlshare__frame__get_packed_size(k->req);
	return len <= cap ? dlshare__frame__pack(k->req, buf) : 0;
}

/* k's request is packed, and went (sent) or did not: what rode on it is
 * off the frame, and the unreceived ids of one that did not go are back
 * on c's list for the next request. */
static void call_packed(struct call *k, int sent)
{
	k->req->releases = NULL;
	k->req->n_releases = 0;
	if (!k->unrecv)
		return;
	k->req->unreceived = NULL;
	k->req->n_unreceived = 0;
	if (!sent)
		unreceived_back(k);
	free(k->unrecv);
	k->unrecv = NULL;
	k->nunrecv = 0;
}

/* Encodes and sends the request; releases that make it too large go on
 * their own. Returns 0 or -errno. */
static int call_send(struct call *k, const int *fds, unsigned nfds)
{
	dlshare_client *c = k->c;
	uint8_t stack[CLIENT_SEND_STACK_MAX];
	size_t cap = c->send_max < sizeof(stack) ? c->send_max : sizeof(stack);
	uint8_t *data = stack;
	size_t len;
	int err = 0;

	/* A small request is packed on the stack, no malloc. */
	if (!(len = call_pack(k, stack, cap)))
		err = wire_encode(k->req, c->send_max, &data, &len);
	if (err && k->nride) {
		k->req->releases = NULL;
		k->req->n_releases = 0;
		pthread_mutex_lock(&c->lock);
		for (size_t i = 0; i < k->nride; i++)
			queue_release(c, k->ride[i]);
		pthread_mutex_unlock(&c->lock);
		k->nride = 0;
		err = wire_encode(k->req, c->send_max, &data, &len);
	}
	if (!err) {
		pthread_mutex_lock(&c->send_lock);
		err = sock_send(c, data, len, fds, nfds, 0);
		pthread_mutex_unlock(&c->send_lock);
	}
	if (data != stack)
		free(data);
	call_packed(k, !err);
	return err;
}

/* ---- the request channel (1.9, proto/chan.h) ----------------------------- */

/* Whether f may go through a request channel: a get or take that waits
 * for nothing (answered at once: its caller holds the reader role until
 * then), attaching no fds. */
static int chan_wanted(const Dlshare__Frame *f, unsigned nfds)
{
	if (nfds)
		return 0;
	if (f->body_case == DLSHARE__FRAME__BODY_GET)
		return !f->get->timeout_ms;
	if (f->body_case == DLSHARE__FRAME__BODY_TAKE)
		return !f->take->timeout_ms;
	return 0;
}

/* Whether k goes through c's request channel: as chan_wanted, from a call
 * that reads its own reply. */
static int chan_fits(const struct call *k, unsigned nfds)
{
	return k->solo && k->chan && chan_wanted(k->req, nfds);
}

/* Puts k's request (with what rides on it) in the channel's slot and wakes
 * the daemon. Returns 0, or 1 when it does not fit the slot: then nothing
 * changed, and it goes over the socket. */
static int chan_send(struct call *k)
{
	dlshare_client *c = k->c;
	struct chan_req *rq = chan_req_of(k->chan);
	uint8_t *body = chan_req_body(k->chan);
	size_t cap = c->send_max < CHAN_REQ_MAX ? c->send_max : CHAN_REQ_MAX;
	uint64_t one = 1;
	size_t len;

	if (!(len = call_pack(k, body, cap)))
		return 1;
	call_packed(k, 1);
	rq->len = (uint32_t)len;
	/* Whatever went on the socket before: the daemon reads it first. */
	rq->sock_sent = atomic_load_explicit(&c->tx_packets,
					     memory_order_relaxed);
	atomic_store_explicit(&rq->seq, ++c->chan_seq, memory_order_release);
	/* By syscall(2), no cancellation point. A full counter (only a
	 * peer's own doing) has the daemon woken anyway. */
	(void)!syscall(SYS_write, c->chan_efd, &one, sizeof(one));
	return 0;
}

/* Waits for the channel's answer to k with the reader role (a solo call,
 * as read_until_done): the packets the daemon sent on the socket before
 * it first, then the answer; or the socket, when the answer went there.
 * Returns with c->lock held. */
static void chan_read(struct call *k)
{
	dlshare_client *c = k->c;
	struct chan_rep *rp = chan_rep_of(k->chan);
	uint32_t seq = c->chan_seq, v;
	struct wire_msg *m = NULL;
	int fds[1];
	size_t len;
	int r;

	while ((v = atomic_load_explicit(&rp->seq, memory_order_acquire)) !=
	       seq) {
		/* A daemon that was killed says nothing here: every
		 * CLIENT_IDLE_MS the socket is read without waiting (its
		 * hang-up, a push), and another thread's failure seen. */
		if (chan_wait(&rp->seq, v, CLIENT_IDLE_MS) == -ETIMEDOUT &&
		    read_step(c, k->p, &k->wq, MSG_DONTWAIT))
			goto out;
	}
	if (rp->how != CHAN_HERE) {
		/* It attaches fds, or is too large: on the socket. Or the
		 * daemon is closing the connection, and says why there. */
		read_until_done(c, k->p, &k->wq);
		return;
	}
	len = rp->len;
	/* What the daemon sent on the socket before its answer is read
	 * first: the fds of buffers the answer names, pushes. */
	while (c->rx_packets < rp->sock_sent)
		if (read_step(c, k->p, &k->wq, 0))
			goto out;
	/* Bounded by the slot: a length past it would read past the
	 * mapping. */
	r = len && len <= CHAN_REP_MAX && len <= c->max_packet ? 0 :
	    DLSHARE_EPROTO;
	if (!r) {
		memcpy(c->rbuf, chan_rep_body(k->chan), len);
		if (wire_decode_in(atomic_exchange(&c->spare_msg, NULL),
				   c->rbuf, len, 0, &c->memo, &m) ||
		    m->frame->nfds) {
			if (m)
				wire_msg_free(m);
			m = NULL;
			r = DLSHARE_EPROTO;
		}
	}
	pthread_mutex_lock(&c->lock);
	/* An answer nobody waits for here is the daemon's mistake. */
	if (!r && (r = dispatch(c, m, fds, 0, 0, &k->wq)) == 0)
		r = DLSHARE_EPROTO;
	if (r < 0 && !c->dead)
		conn_fail(c, r, &k->wq);
out:
	c->reading = 0;
	handoff(c, &k->wq);
}

/* Waits until the request is answered or failed (called with c->lock
 * held): reads the socket itself when nobody does, else sleeps — in
 * slices while the Hello has a deadline. */
static void call_wait(struct call *k)
{
	dlshare_client *c = k->c;
	struct pending *p = k->p;
	int err;

	while (!p->done) {
		if (!c->reading && !c->dead) {
			lead(c, p, &k->wq);
		} else if (!c->deadline) {
			pthread_cond_wait(&p->cond, &c->lock);
		} else if ((err = hello_overdue(c))) {
			/* The receiver thread reads, and nothing came. */
			conn_fail(c, err, &k->wq);
		} else {
			int64_t left = c->deadline - now_ms();
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			left = left < 0 ? 0 : left > 100 ? 100 : left;
			ts.tv_nsec += (long)left * 1000000;
			ts.tv_sec += ts.tv_nsec / 1000000000;
			ts.tv_nsec %= 1000000000;
			pthread_cond_timedwait(&p->cond, &c->lock, &ts);
		}
	}
}

/* dlshare_last_error() for a reply whose nfds fds did not come. */
static void emfile_message(uint32_t nfds)
{
	struct rlimit rl = { 0 };
	char msg[256];

	getrlimit(RLIMIT_NOFILE, &rl);
	snprintf(msg, sizeof(msg), "this process is out of file descriptors "
		 "(RLIMIT_NOFILE %llu): the %u fd(s) of the reply could not "
		 "be received. Nothing is lost: the same call works again "
		 "once fds are free", (unsigned long long)rl.rlim_cur,
		 (unsigned)nfds);
	errmsg_set(msg);
}

/* Moves the answer of k into out, the daemon's Error into a code and
 * dlshare_last_error(). Returns 0 or a DLSHARE_E* code (out then freed);
 * for a reply that came but cannot be used (DLSHARE_EMFILE: its fds did
 * not come; or why its buffers could not be mapped), out is kept for a
 * Get, Take or Create: its caller gives back what the reply gave. */
static int call_result(struct call *k, struct reply *out)
{
	struct pending *p = k->p;
	int err, lost, unusable;

	out->msg = p->msg;
	memcpy(out->fds, p->fds, p->nfds * sizeof(int));
	out->nfds = p->nfds;
	memcpy(out->pins, p->pins, p->npins * sizeof(p->pins[0]));
	out->npins = p->npins;
	out->mc = p->mc;
	p->mc = NULL;
	err = p->err;
	lost = p->lost;
	/* The reply came but cannot be used: its fds did not come, or its
	 * buffers could not be mapped. */
	unusable = out->msg && (err || lost);
	if (err && p->why[0])
		errmsg_set(p->why);
	pending_unref(k->c, p);
	if (!err && out->msg && out->msg->frame->body_case ==
				  DLSHARE__FRAME__BODY_ERROR) {
		Dlshare__Error *e = out->msg->frame->error;

		errmsg_set(e->message);
		err = e->code < 0 ? e->code : DLSHARE_EPROTO;
	}
	if (!err && lost) {
		emfile_message(out->msg->frame->nfds);
		err = DLSHARE_EMFILE;
	}
	/* A get's, a take's and a create's callers give back what such a
	 * reply gave them (a lease, a pending version). */
	if (unusable && (k->req->body_case == DLSHARE__FRAME__BODY_GET ||
			 k->req->body_case == DLSHARE__FRAME__BODY_TAKE ||
			 k->req->body_case == DLSHARE__FRAME__BODY_CREATE))
		return err;
	if (err)
		reply_free(k->c, out);
	return err;
}

static void chan_open(dlshare_client *c);

int client_call(dlshare_client *c, Dlshare__Frame *req, const int *fds,
		unsigned nfds, struct export *export, struct reply *out)
{
	struct call k;
	int err;

	/* Field by field: k.ride and out's fd and pin arrays (~1.3 KiB
	 * together) are read only up to their counts, and zeroing them was a
	 * tenth of the library's instructions per get. */
	k.c = c;
	k.req = req;
	k.p = NULL;
	memset(&k.wq, 0, sizeof(k.wq));
	k.nride = 0;
	k.unrecv = NULL;
	k.nunrecv = 0;
	k.solo = 0;
	k.chan = NULL;
	out->msg = NULL;
	out->nfds = 0;
	out->npins = 0;
	out->mc = NULL;
	/* Not one byte of a child's goes to its parent's connection. */
	if (client_forked(c))
		return fork_refuse();
	/* A deleter run by our receiver thread (Retired) must not wait for a
	 * reply while the thread that frees exports is blocked. */
	if (c->rx_started && pthread_equal(pthread_self(), c->rx)) {
		errmsg_set("dlshare call from a deleter on the library's thread");
		return DLSHARE_EINVAL;
	}
	/* A connection that keeps asking gets its request channel (the
	 * count stops a little past CLIENT_CHAN_AFTER: no atomic add per
	 * call from then on). */
	if (c->chan_ok && chan_wanted(req, nfds) &&
	    atomic_load_explicit(&c->chan_calls, memory_order_relaxed) <
	    CLIENT_CHAN_AFTER &&
	    atomic_fetch_add(&c->chan_calls, 1) + 1 == CLIENT_CHAN_AFTER)
		chan_open(c);
	errmsg_set(NULL);
	req->nfds = nfds;
	req->has_nfds = nfds > 0;
	if ((err = call_begin(&k, export)))
		return err;
	if (chan_fits(&k, nfds) && chan_send(&k) == 0) {
		chan_read(&k);
	} else if (!(err = call_send(&k, fds, nfds)) && k.solo) {
		read_until_done(c, k.p, &k.wq);
	} else {
		pthread_mutex_lock(&c->lock);
		if (k.solo) {
			/* The role goes back (handoff, below, offers it). */
			c->reading = 0;
			if (c->solo == k.p)
				c->solo = NULL;
		}
	}
	if (err) {
		/* Never sent: nobody will answer. */
		if (!k.p->done && !k.solo)
			HASH_DEL(c->pending, k.p);
		k.p->done = 1;
		k.p->err = err == -E2BIG || err == -EMSGSIZE ? DLSHARE_E2BIG :
			   client_errno(err);
	}
	call_wait(&k);
	if (k.p->err && !k.p->msg)
		errmsg_set(c->fatal_msg);
	/* Whoever offered us the role may have found us done: pass it on. */
	handoff(c, &k.wq);
	/* An export the reply did not register stays the caller's. */
	pthread_mutex_unlock(&c->lock);
	wakeq_run(c, &k.wq);
	err = call_result(&k, out);
	client_unref(c);
	return err;
}

/* Asks for c's request channel and maps it; without it (an error, this
 * process out of fds or address space) requests go over the socket as
 * before, and it is not asked for again. */
static void chan_open(dlshare_client *c)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Channel ch = DLSHARE__CHANNEL__INIT;
	struct reply r;
	struct stat st;
	void *p = MAP_FAILED;

	f.body_case = DLSHARE__FRAME__BODY_CHANNEL;
	f.channel = &ch;
	if (client_call(c, &f, NULL, 0, NULL, &r))
		return;
	if (r.msg->frame->body_case == DLSHARE__FRAME__BODY_CHANNEL_REPLY &&
	    r.msg->frame->channel_reply->bytes == CHAN_BYTES && r.nfds == 2 &&
	    fstat(r.fds[0], &st) == 0 && st.st_size >= CHAN_BYTES)
		p = mmap(NULL, CHAN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED,
			 r.fds[0], 0);
	if (p != MAP_FAILED) {
		/* With the fork lock held, as c's other fds: a child closes
		 * its copy of the eventfd, and unmaps the channel, at once. */
		fork_hold();
		pthread_mutex_lock(&c->lock);
		c->chan_seq = atomic_load(&chan_req_of(p)->seq);
		c->chan_efd = r.fds[1];
		c->chan = p;
		pthread_mutex_unlock(&c->lock);
		fork_unhold();
		r.nfds = 1; /* the eventfd is c's now; the memfd goes */
	}
	reply_free(c, &r);
}

/* Sends one Release from the calling thread when nothing is queued and the
 * socket is free, without waking the receiver thread (a wakeup and a
 * context switch per get otherwise). Never blocks. Returns 0 when sent. */
static int release_now(dlshare_client *c, uint64_t lease)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Release r = DLSHARE__RELEASE__INIT;
	uint8_t buf[64];
	int ok, err;

	pthread_mutex_lock(&c->lock);
	ok = !c->dead && !c->closed && c->nrel == 0;
	pthread_mutex_unlock(&c->lock);
	if (!ok)
		return -1;
	r.n_leases = 1;
	r.leases = &lease;
	f.body_case = DLSHARE__FRAME__BODY_RELEASE;
	f.release = &r;
	if (dlshare__frame__get_packed_size(&f) > sizeof(buf))
		return -1;
	if (pthread_mutex_trylock(&c->send_lock))
		return -1;
	err = sock_send(c, buf, dlshare__frame__pack(&f, buf), NULL, 0,
			MSG_DONTWAIT);
	pthread_mutex_unlock(&c->send_lock);
	return err;
}

/* Wakes the receiver thread. */
static void rx_kick(dlshare_client *c)
{
	uint64_t one = 1;

	if (write(c->wake_fd, &one, sizeof(one)) < 0) {
		/* The counter is full, so the thread is awake anyway. */
	}
}

/* Queues lease for release (c->lock held). Returns whether the receiver
 * thread must be woken to send it. */
static int release_queue_locked(dlshare_client *c, uint64_t lease)
{
	int wake = queue_release(c, lease);

	/* With a daemon that takes releases on requests, a lease waits for
	 * the next call (no packet, no wakeup of its own) while calls come;
	 * the receiver thread sends what is left within CLIENT_IDLE_MS. Only
	 * an idle receiver thread, blocked in poll, must be woken. */
	if (c->piggyback && !c->rx_reading)
		wake = 0;
	return wake;
}

void client_release(dlshare_client *c, uint64_t lease)
{
	int wake;

	if (lease == 0) /* a writer's pin holds no lease */
		return;
	if (!c->piggyback && release_now(c, lease) == 0)
		return;
	pthread_mutex_lock(&c->lock);
	wake = release_queue_locked(c, lease);
	pthread_mutex_unlock(&c->lock);
	if (wake)
		rx_kick(c);
}

void client_unpin_release(dlshare_client *c, struct ibuf **pins, size_t n,
			  uint64_t lease)
{
	int wake;

	/* The lease rides on the next call (1.1): one lock for both, as
	 * client_unpin and client_release would take it one after the
	 * other. Else (or for no lease) their own ways. */
	if (!c->piggyback || lease == 0) {
		client_unpin(c, pins, n);
		client_release(c, lease);
		return;
	}
	pthread_mutex_lock(&c->lock);
	unpin_locked(c, pins, n);
	wake = release_queue_locked(c, lease);
	pthread_mutex_unlock(&c->lock);
	if (wake)
		rx_kick(c);
}

/* The index of the kept record of the name with key, or c->nwarm. Under
 * c->lock. */
static unsigned warm_find(const dlshare_client *c, uint64_t key,
			  const char *name)
{
	unsigned i = 0;

	while (i < c->nwarm && (c->warm[i]->key != key ||
				strcmp(c->warm[i]->name, name) != 0))
		i++;
	return i;
}

void client_warm_keep(dlshare_client *c, struct warm *w, struct ibuf **pins,
		      size_t n, uint64_t lease)
{
	struct warm *old = NULL;
	unsigned i;
	int wake = 0;

	/* A seed exists only with a board (1.7, which implies releases
	 * riding on calls, 1.1), and for at most CLIENT_PINS_MAX pins. */
	pthread_mutex_lock(&c->lock);
	/* A dead connection took the lease with it: nothing to keep. And
	 * the callers went quiet (the receiver thread reads): the lease
	 * goes now, as any other. */
	if (c->dead || c->closed || c->rx_reading) {
		unpin_locked(c, pins, n);
		wake = release_queue_locked(c, lease);
		pthread_mutex_unlock(&c->lock);
		client_warm_free(w);
		if (wake)
			rx_kick(c);
		return;
	}
	/* The name's older record, else the oldest when all are in use,
	 * makes room: its lease goes with the next call. */
	i = warm_find(c, w->key, w->name);
	if (i < c->nwarm || c->nwarm == CLIENT_WARM_MAX) {
		old = warm_drop_locked(c, i < c->nwarm ? i : 0);
		rel_push(c, old->lease);
	}
	memcpy(w->pins, pins, n * sizeof(pins[0]));
	w->npins = n;
	w->lease = lease;
	c->warm[c->nwarm++] = w;
	pthread_mutex_unlock(&c->lock);
	if (old)
		warm_recycle(c, old);
}

uint64_t client_rel_pushed(dlshare_client *c)
{
	return atomic_load_explicit(&c->rel_pushed, memory_order_relaxed);
}

int client_warm_let_go(dlshare_client *c)
{
	unsigned n;

	pthread_mutex_lock(&c->lock);
	n = c->nwarm;
	if (n && !c->dead && !c->closed)
		warm_release_locked(c, 1);
	pthread_mutex_unlock(&c->lock);
	return n != 0;
}

int client_warm_take(dlshare_client *c, const struct warm_name *wn,
		     struct reply *r, struct warm **seed)
{
	struct warm *w;
	unsigned k;

	pthread_mutex_lock(&c->lock);
	k = warm_find(c, wn->key, wn->name);
	if (k == c->nwarm) {
		pthread_mutex_unlock(&c->lock);
		return 1;
	}
	w = c->warm[k];
	/* The name's newest version is still the one it got, for it: else
	 * the daemon answers, and the kept lease goes with that call. */
	if (c->dead || c->closed || !warm_holds(c, w)) {
		w = warm_drop_locked(c, k);
		if (!c->dead && !c->closed)
			rel_push(c, w->lease);
		pthread_mutex_unlock(&c->lock);
		warm_recycle(c, w);
		return 1;
	}
	warm_remove_locked(c, k);
	pthread_mutex_unlock(&c->lock);
	memset(r, 0, sizeof(*r));
	memcpy(r->pins, w->pins, w->npins * sizeof(w->pins[0]));
	r->npins = w->npins;
	w->npins = 0;
	warm_hold(w->msg, w->mc);
	r->msg = w->msg;
	r->mc = w->mc;
	w->lease = 0;
	*seed = w;
	return 0;
}

void export_free(struct export *e)
{
	for (size_t i = 0; i < e->ncuda; i++)
		cuda_unexport_alloc(e->cuda_handles[i]);
	cuda_event_free(e->event);
	for (size_t i = 0; i < e->n; i++)
		if (e->tensors[i] && e->tensors[i]->deleter)
			e->tensors[i]->deleter(e->tensors[i]);
	free(e->cuda_handles);
	free(e->tensors);
	free(e);
}

/* ---- connect / disconnect ------------------------------------------------- */

/* Maps the version board a 1.7 daemon attached to its HelloReply h (the
 * reply r's only fd), unless the caller said no (c->board_slots is then
 * UINT32_MAX). Without it, every get asks the daemon. */
static void board_map(dlshare_client *c, const Dlshare__HelloReply *h,
		      struct reply *r)
{
	size_t len = (size_t)h->board_slots * sizeof(uint64_t);
	struct stat st;
	void *p;

	if (c->board_slots == UINT32_MAX || h->minor < 7 ||
	    !h->has_board_slots || !h->board_slots || r->nfds != 1 ||
	    fstat(r->fds[0], &st) < 0 || (uint64_t)st.st_size < len)
		goto none;
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, r->fds[0], 0);
	if (p == MAP_FAILED)
		goto none;
	c->board = p;
	c->board_slots = h->board_slots;
	return;
none:
	c->board_slots = 0;
}

static int hello(dlshare_client *c)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	struct reply r;
	int err;

	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = "libdlshare " DLSHARE_VERSION_STRING;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	err = client_call(c, &f, NULL, 0, NULL, &r);
	if (err)
		return err;
	if (r.msg->frame->body_case != DLSHARE__FRAME__BODY_HELLO_REPLY) {
		reply_free(c, &r);
		return DLSHARE_EPROTO;
	}
	if (r.msg->frame->hello_reply->major != WIRE_PROTO_MAJOR) {
		snprintf(errmsg, sizeof(errmsg), "the daemon speaks protocol "
			 "%u, this library %u", r.msg->frame->hello_reply->major,
			 (unsigned)WIRE_PROTO_MAJOR);
		err = DLSHARE_EVERSION;
	}
	/* From here on, requests may be as large as the daemon takes; a
	 * larger one fails here, with DLSHARE_E2BIG, instead of costing the
	 * connection. */
	else
		c->send_max = r.msg->frame->hello_reply->max_packet;
	if (!err) {
		c->piggyback = r.msg->frame->hello_reply->minor >= 1;
		c->goodbye = r.msg->frame->hello_reply->minor >= 2;
		c->manifests = r.msg->frame->hello_reply->minor >= 4;
		c->lifetimes = r.msg->frame->hello_reply->minor >= 4;
		c->dev_events = r.msg->frame->hello_reply->minor >= 4;
		c->queues = r.msg->frame->hello_reply->minor >= 4;
		c->origins = r.msg->frame->hello_reply->minor >= 5;
		c->untakes = r.msg->frame->hello_reply->minor >= 6;
		c->unreceived_ok = r.msg->frame->hello_reply->minor >= 8;
		c->watches = r.msg->frame->hello_reply->minor >= 6;
		board_map(c, r.msg->frame->hello_reply, &r);
		c->chan_ok = c->chan_ok &&
			     r.msg->frame->hello_reply->minor >= 9;
	}
	reply_free(c, &r);
	return err;
}

/* Device versions sealed here outlive us, but their events do not. Their
 * writes must be done, and the daemon must have forgotten the events, before
 * this process may exit: a reader handed the event of an exited process
 * waits on nothing (the daemon, seeing only the socket close, may answer a
 * get before it notices). So the library waits for its seal events and then
 * says Goodbye, a round trip after which the daemon hands out none of them.
 * (A 1.6 daemon hands out events of its own for store versions, and says
 * Retired for ours at the seal: none is left here then.) Device exports
 * die with us too: the daemon withdraws them at the Goodbye, so no reply
 * sent after it names their memory or event.
 * From a deleter on the receiver thread no call can wait: there the
 * daemon forgets the events when it sees the close. */
static void goodbye(dlshare_client *c)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Goodbye g = DLSHARE__GOODBYE__INIT;
	struct export *e;
	struct reply r;
	int sealed = 0;

	pthread_mutex_lock(&c->lock);
	for (e = c->exports; e; e = e->next) {
		if (e->n == 0 && e->event) {
			cuda_event_wait(e->event);
			sealed = 1;
		}
		/* An export of device memory: its memory and event die
		 * with us; the daemon withdraws it at the Goodbye. */
		if (e->n && e->event)
			sealed = 1;
	}
	pthread_mutex_unlock(&c->lock);
	if (!sealed || !c->goodbye ||
	    (c->rx_started && pthread_equal(pthread_self(), c->rx)))
		return;
	f.body_case = DLSHARE__FRAME__BODY_GOODBYE;
	f.goodbye = &g;
	/* A failure means the connection is gone, and the daemon forgets
	 * the events as it sees it go. */
	if (client_call(c, &f, NULL, 0, NULL, &r) == 0)
		reply_free(c, &r);
}

/* Says why connecting to path failed: the reader sees neither the path
 * (it may be the default one) nor the system's reason otherwise. */
static void connect_msg(const char *path, const char *why)
{
	snprintf(errmsg, sizeof(errmsg), "connect %s: %s", path, why);
}

int client_need_queues(dlshare_client *c)
{
	if (c->queues)
		return 0;
	errmsg_set("this daemon speaks no queue names (protocol 1.4 needed)");
	return DLSHARE_ENOTSUP;
}

int client_bad_name(const char *name)
{
	const char *why = check_name_why(name);
	char msg[256];

	if (!why)
		return 0;
	snprintf(msg, sizeof(msg), "invalid name \"%.*s\": %s",
		 name ? 64 : 0, name ? name : "", why);
	errmsg_set(msg);
	return 1;
}

/* Sets fd's receive (SO_RCVTIMEO) or send (SO_SNDTIMEO, which bounds a
 * Unix socket's connect too) timeout; 0 ms waits forever. */
static void sock_timeout(int fd, int opt, int64_t ms)
{
	struct timeval tv = { .tv_sec = (time_t)(ms / 1000),
			      .tv_usec = (suseconds_t)(ms % 1000 * 1000) };

	setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof(tv));
}

int dlshare_connect(const char *path, dlshare_client **out)
{
	CALL_UNCANCELLED;

	return dlshare_connect_ex(path, NULL, out);
}

/* The connect timeout opts ask for, in ms (0: none). Returns 0 or
 * DLSHARE_EINVAL, having said why. */
static int connect_timeout(const dlshare_connect_opts *opts, int32_t *out)
{
	int32_t timeout = DLSHARE_CONNECT_TIMEOUT_MS;

	if (opts) {
		/* Only the fields the caller's size covers are read. */
		if (opts->size < offsetof(dlshare_connect_opts, timeout_ms) +
				 sizeof(opts->timeout_ms) ||
		    opts->timeout_ms < DLSHARE_WAIT_FOREVER) {
			errmsg_set("connect: invalid dlshare_connect_opts "
				   "(size not set, or a timeout below -1)");
			return DLSHARE_EINVAL;
		}
		if (opts->timeout_ms)
			timeout = opts->timeout_ms;
	}
	*out = timeout == DLSHARE_WAIT_FOREVER ? 0 : timeout;
	return 0;
}

/* The socket address of path (NULL: the default). Returns 0 or
 * DLSHARE_E2BIG for a path too long for a Unix socket, having said so. */
static int connect_address(const char *path, struct sockaddr_un *sa)
{
	char dflt[sizeof(sa->sun_path)];

	if (!path) {
		if (paths_default_socket(dflt, sizeof(dflt))) {
			errmsg_set("connect: the default socket path is longer "
				   "than a Unix socket path may be");
			return DLSHARE_E2BIG;
		}
		path = dflt;
	}
	if (strlen(path) >= sizeof(sa->sun_path)) {
		snprintf(errmsg, sizeof(errmsg),
			 "connect %.160s...: longer than the %zu bytes a Unix "
			 "socket path may have", path, sizeof(sa->sun_path) - 1);
		return DLSHARE_E2BIG;
	}
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, strlen(path) + 1);
	return 0;
}

/* A client with its socket and wake fd, not connected yet; timeout: the
 * connect timeout (0: none). Returns 0 with *out, or a DLSHARE_E* code
 * (*out then to be freed with client_free, when not NULL). */
static int client_new(const char *path, int32_t timeout, dlshare_client **out)
{
	dlshare_client *c = calloc(1, sizeof(*c));
	int e;

	*out = c;
	if (!c)
		return DLSHARE_ENOMEM;
	atomic_init(&c->refs, 1);
	atomic_init(&c->spare, NULL);
	atomic_init(&c->spare_msg, NULL);
	c->next_id = 1;
	/* Never removed before client_free (see c->pending). */
	c->pending_anchor.id = 0;
	HASH_ADD(hh, c->pending, id, sizeof(c->pending_anchor.id),
		 &c->pending_anchor);
	/* Until the daemon says otherwise it may send the largest packet a
	 * socket buffer allows. */
	c->max_packet = 256 * 1024;
	/* Hello itself must fit what the daemon takes before it. */
	c->send_max = 512;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
	c->chan_efd = -1;
	/* Made with the fork lock held, so that a child closes its copies
	 * of them at once (fork.c). */
	fork_hold();
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->fd = c->wake_fd < 0 ? -1 :
		socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	e = errno;
	fork_add(c);
	fork_unhold();
	if (c->fd < 0) {
		connect_msg(path, strerror(e));
		return client_errno(-e);
	}
	/* Callers read with blocking receives; the receiver thread never
	 * blocks in one. Until the Hello is answered, they wake in time to
	 * see its deadline pass. */
	sock_timeout(c->fd, SO_RCVTIMEO, timeout && timeout < CLIENT_LEAD_CHECK_MS ?
		     timeout : CLIENT_LEAD_CHECK_MS);
	/* A listener whose backlog is full (it does not accept) makes
	 * connect() wait, for as long as the send timeout says. */
	sock_timeout(c->fd, SO_SNDTIMEO, timeout);
	c->timeout_ms = timeout;
	/* The reader's buffer, whichever thread reads. */
	c->rbuf = malloc(c->max_packet);
	return c->rbuf ? 0 : DLSHARE_ENOMEM;
}

/* Connects c's socket to sa. Returns 0 or a DLSHARE_E* code, having said
 * why. */
static int client_dial(dlshare_client *c, const struct sockaddr_un *sa)
{
	int64_t until = c->timeout_ms ? now_ms() + c->timeout_ms : 0;
	char why[128];
	int e;

	for (;;) {
		int64_t left;

		if (connect(c->fd, (const struct sockaddr *)sa,
			    sizeof(*sa)) == 0) {
			sock_timeout(c->fd, SO_SNDTIMEO, 0);
			if (c->timeout_ms)
				c->deadline = now_ms() + c->timeout_ms;
			return 0;
		}
		/* A signal came while the listener's queue was full (a
		 * handler without SA_RESTART, as Python installs them): the
		 * socket is still unconnected; wait again, for what is left
		 * of the time. */
		if ((e = errno) != EINTR)
			break;
		if (!until)
			continue;
		if ((left = until - now_ms()) <= 0) {
			e = EAGAIN;
			break;
		}
		sock_timeout(c->fd, SO_SNDTIMEO, left);
	}
	/* A Unix socket's connect says EAGAIN when the listener's queue
	 * stayed full for the whole send timeout. */
	if (e == EAGAIN && c->timeout_ms) {
		snprintf(why, sizeof(why), "the listener accepted no connection "
			 "within %d ms (its queue is full: a hung daemon?)",
			 (int)c->timeout_ms);
		connect_msg(sa->sun_path, why);
		return DLSHARE_ETIMEDOUT;
	}
	connect_msg(sa->sun_path, strerror(e));
	return e == EACCES ? DLSHARE_EPERM : DLSHARE_ECONN;
}

/* Starts c's receiver thread, which holds its own reference: it may
 * outlive a dlshare_disconnect() made from a deleter running on it.
 * Returns 0 or DLSHARE_ENOMEM. */
static int client_start_rx(dlshare_client *c)
{
	sem_t up;

	client_ref(c);
	sem_init(&up, 0, 0);
	c->rx_up = &up;
	if (pthread_create(&c->rx, NULL, rx_main, c)) {
		sem_destroy(&up);
		atomic_fetch_sub(&c->refs, 1);
		return DLSHARE_ENOMEM;
	}
	/* The thread is running before we return: a program that forks
	 * right after connecting must not fork while the new thread is still
	 * being set up (inside the allocator, with sanitizers), or the child
	 * inherits a lock nobody will release. */
	while (sem_wait(&up) < 0 && errno == EINTR)
		;
	sem_destroy(&up);
	c->rx_up = NULL;
	c->rx_started = 1;
	atomic_fetch_add(&live_clients, 1); /* dlshare_disconnect drops it */
	return 0;
}

int dlshare_connect_ex(const char *path, const dlshare_connect_opts *opts,
		       dlshare_client **out)
{
	CALL_UNCANCELLED;
	struct sockaddr_un sa;
	dlshare_client *c;
	int32_t timeout;
	const char *no_reuse, *no_channel;
	char why[128];
	int err;

	errmsg_set(NULL);
	if (!out)
		return DLSHARE_EINVAL;
	*out = NULL;
	if ((err = connect_timeout(opts, &timeout)) ||
	    (err = connect_address(path, &sa)))
		return err;
	err = client_new(sa.sun_path, timeout, &c);
	if (!err)
		err = client_dial(c, &sa);
	if (!err)
		err = client_start_rx(c);
	if (err) {
		if (c)
			client_free(c);
		return err;
	}
	/* DLSHARE_NO_REUSE=1: every get asks the daemon (see dlshare.h). */
	no_reuse = getenv("DLSHARE_NO_REUSE");
	if (no_reuse && strcmp(no_reuse, "1") == 0)
		c->board_slots = UINT32_MAX; /* hello() maps no board */
	/* DLSHARE_NO_CHANNEL=1: every request over the socket (dlshare.h). */
	no_channel = getenv("DLSHARE_NO_CHANNEL");
	c->chan_ok = !(no_channel && strcmp(no_channel, "1") == 0);
	err = hello(c);
	pthread_mutex_lock(&c->lock);
	c->deadline = 0;
	pthread_mutex_unlock(&c->lock);
	sock_timeout(c->fd, SO_RCVTIMEO, CLIENT_LEAD_CHECK_MS);
	if (err) {
		/* The daemon's own words when it gave some. */
		snprintf(why, sizeof(why), "%.*s", (int)sizeof(why) - 1,
			 *errmsg ? errmsg : dlshare_strerror(err));
		dlshare_disconnect(c);
		connect_msg(sa.sun_path, why);
		return err;
	}
	*out = c;
	return 0;
}

/* dlshare_disconnect, once nobody else sends: sends the releases still
 * queued, waiting for room in the socket up to the connect timeout (a
 * released take must reach the daemon, or the close puts it back in its
 * queue); past it, or on an error, what is left goes with the
 * connection. */
static void flush_releases_wait(dlshare_client *c)
{
	int32_t budget = c->timeout_ms ? c->timeout_ms :
			 DLSHARE_CONNECT_TIMEOUT_MS;
	int64_t end = now_ms() + budget;
	int r;

	for (;;) {
		struct pollfd pfd = { .fd = c->fd, .events = POLLOUT };
		int64_t left;

		pthread_mutex_lock(&c->lock);
		r = (c->dead && !c->rel_left) || !c->nrel ? 0 :
		    flush_releases(c);
		pthread_mutex_unlock(&c->lock);
		left = end - now_ms();
		if (r != -EAGAIN || left <= 0)
			return;
		if (poll(&pfd, 1, (int)left) < 0 && errno != EINTR)
			return;
	}
}

void dlshare_disconnect(dlshare_client *c)
{
	CALL_UNCANCELLED;
	struct export *e, *r;
	uint64_t one = 1;

	if (!c)
		return;
	if (client_forked(c)) {
		/* Inherited: this process is a fork of the one that
		 * connected c, whose connection must not notice. No
		 * Goodbye, no shutdown, no join (the receiver thread does
		 * not exist here), no lock (a parent thread may have held
		 * one at the fork): only our copies of its fds go, where a
		 * fork without handlers left them open. Its memory stays,
		 * for the same reason, until this process exits. */
		fork_close_fds(c);
		return;
	}
	/* Releases waiting for device work: wait for it now, and queue
	 * them while the connection is open, so that they reach the daemon
	 * (rx_main sends what is queued as it ends): a released take of a
	 * queue name is consumed, where the socket's close alone would put
	 * it back for another taker. Those the receiver thread is queueing
	 * right now too. */
	deferred_drain(c, 1);
	deferred_settle(c);
	goodbye(c);
	pthread_mutex_lock(&c->lock);
	c->closed = 1;
	pthread_mutex_unlock(&c->lock);
	if (c->rx_started) {
		if (write(c->wake_fd, &one, sizeof(one)) < 0) {
			/* Already signalled. */
		}
		/* From a deleter on the receiver thread itself: it cannot be
		 * joined; it sees closed and exits when the deleter returns,
		 * dropping its own reference. */
		if (pthread_equal(pthread_self(), c->rx))
			pthread_detach(c->rx);
		else
			pthread_join(c->rx, NULL);
	}
	/* Releases still waiting for device work: their kernels must finish
	 * before the daemon, seeing the socket close, hands the memory back. */
	deferred_drain(c, 0);
	/* What the receiver thread could not send without blocking (the
	 * socket full: a daemon busy, or stopped, while thousands of
	 * releases went) goes from here, waiting for room. */
	flush_releases_wait(c);
	/* The daemon drops our leases and withdraws our exports when the
	 * socket closes; close it now, not when the last tensor goes. */
	shutdown(c->fd, SHUT_RDWR);
	pthread_mutex_lock(&c->lock);
	c->dead = 1;
	e = c->exports;
	c->exports = NULL;
	/* Retired but not yet freed by the receiver thread (when it was
	 * detached above, it frees what comes after). */
	r = c->retired;
	c->retired = NULL;
	/* Mappings no tensor uses go now; the rest with their last tensor. */
	struct ibuf *b, *tmp;
	HASH_ITER(hh, c->bufs, b, tmp)
		if (b->refs == 0)
			ibuf_drop(c, b);
	pthread_mutex_unlock(&c->lock);
	exports_free(r);
	exports_free(e);
	if (atomic_fetch_sub(&live_clients, 1) == 1)
		cuda_event_pool_drain();
	client_unref(c);
}
