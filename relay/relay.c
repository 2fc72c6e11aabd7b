/* relay — the loop, the peers, serving and mirroring. */
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>
#include <uthash.h>

#include <dlshare/dlshare.h>

#include "auth.h"
#include "msg.h"

#define TICK_MS 100
#define MAX_TENSORS 1000000u   /* per offer, as the daemon's bundles */
#define MAX_NDIM 32
#define COALESCE_GAP 256       /* bytes of padding a get may span */
#define BACKOFF_MIN_MS 50

/* ---- logging (sd-daemon prefixes) ------------------------------------- */

static void logf_(int prio, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void logf_(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "<%d>dlshare-relay: %s\n", prio, line);
}
#define log_err(...) logf_(3, __VA_ARGS__)
#define log_warn(...) logf_(4, __VA_ARGS__)
#define log_info(...) logf_(6, __VA_ARGS__)

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- objects ------------------------------------------------------------ */

struct relay;
struct conn;

/* A name a serving thread has offered, and the version. Thread only. */
struct seen {
	UT_hash_handle hh;
	uint64_t version;
	char name[];
};

/* The newest origin version each mirrored name got. Loop only. */
struct known {
	UT_hash_handle hh;
	uint64_t version;
	char name[];
};

enum sub_state {
	SUB_SCAN,     /* the thread looks for a new version */
	SUB_READY,    /* the thread holds a lease; the loop is to offer it */
	SUB_SENT,     /* offered; the loop waits for DONE */
	SUB_RELEASE,  /* the loop is done with it; the thread frees it */
	SUB_EXITED,   /* the thread ended; the loop joins it */
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
	ucp_mem_h *memh;
	uint32_t nmemh;
	uint64_t sent_ms;
	/* thread only */
	struct seen *seen;
	char hot[256];
	char last[256];
};

struct region {
	uint64_t addr, len;
	const uint8_t *rkey_buf;
	uint32_t rkey_len;
	ucp_rkey_h rkey;
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
};

/* One version being pulled into this node's daemon. */
struct pull {
	struct pull *next;
	struct pull *next_job;    /* r->jobs or r->done, under r->mu */
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
	char why[160];
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
	/* mirroring */
	struct pull *pulls;
	void *close_req;
	bool closed;              /* ucp_ep_close_nbx was called */
	bool flush;               /* close after what was sent went out */
	unsigned recvs;           /* rendezvous receives outstanding */
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
	struct known *known;
	struct sub *zombies;
	unsigned inflight;
	uint64_t next_offer;
	uint32_t nserving;
	/* failed authentications: a window of a minute */
	uint64_t authlog_start;
	uint32_t authlog_n, authlog_dropped;
	bool stop;
	pthread_mutex_t mu;
	struct sub *ready;        /* under mu */
	/* the daemon worker: creates, seals and aborts of pulls, so that the
	 * loop never waits for the daemon (a 256 MiB create populates its
	 * pages) */
	pthread_t worker_th;
	bool worker_started;
	pthread_cond_t jobcv;
	struct pull *jobs, *done;  /* under mu */
	bool worker_stop;          /* under mu */
};

static void conn_fail(struct conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* ---- sending ------------------------------------------------------------ */

static void send_cb(void *req, ucs_status_t st, void *user)
{
	(void)st;
	free(user);
	ucp_request_free(req);
}

/* Sends the finished message w (consumed). Returns 0 or -1. */
static int conn_send(struct conn *c, struct wbuf *w)
{
	ucp_request_param_t p = { 0 };
	ucs_status_ptr_t sp;

	if (wbuf_finish(w)) {
		conn_fail(c, "out of memory building a message");
		return -1;
	}
	if (c->state == C_DEAD || c->closed) {
		free(w->p);
		return -1;
	}
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
			 UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_REPLY;
	p.cb.send = send_cb;
	p.user_data = w->p;
	sp = ucp_am_send_nbx(c->ep, RELAY_AM_ID, NULL, 0, w->p, w->len, &p);
	if (sp == NULL) {
		free(w->p);
		return 0;
	}
	if (UCS_PTR_IS_ERR(sp)) {
		free(w->p);
		conn_fail(c, "send: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
		return -1;
	}
	return 0;
}

static void send_error(struct conn *c, uint32_t code, const char *text)
{
	struct wbuf w;
	size_t n = strlen(text);

	if (n > 512)
		n = 512;
	wbuf_start(&w, MSG_ERROR);
	wbuf_u32(&w, code);
	wbuf_u16(&w, (uint16_t)n);
	wbuf_bytes(&w, text, n);
	conn_send(c, &w);
}

/* ---- connections ---------------------------------------------------------- */

static struct conn *conn_by_id(struct relay *r, uint64_t id)
{
	struct conn *c;

	for (c = r->conns; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

static struct conn *conn_by_ep(struct relay *r, ucp_ep_h ep)
{
	struct conn *c;

	for (c = r->conns; c; c = c->next)
		if (c->ep == ep && c->state != C_DEAD)
			return c;
	return NULL;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
	struct relay *r = arg;
	struct conn *c;

	for (c = r->conns; c; c = c->next)
		if (c->ep == ep && c->state != C_DEAD)
			conn_fail(c, "connection lost: %s", ucs_status_string(st));
}

static struct conn *conn_new(struct relay *r, bool serving, int upstream,
			     const char *peer)
{
	struct conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->r = r;
	c->id = ++r->next_id;
	c->serving = serving;
	c->upstream = upstream;
	c->state = C_HELLO;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	c->deadline_ms = now_ms() + r->cfg->auth_timeout_ms;
	c->next = r->conns;
	r->conns = c;
	return c;
}

static void sub_release(struct relay *r, struct sub *s);

/* Marks c dead: its subscriptions are cancelled, its pulls fail, its
 * endpoint is closed; it is freed once nothing of it is outstanding. */
static void conn_fail(struct conn *c, const char *fmt, ...)
{
	struct relay *r = c->r;
	char why[512];
	struct pull *p;
	struct sub *s;
	va_list ap;

	if (c->state == C_DEAD)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (c->upstream >= 0 && c->state == C_HELLO) {
		/* never answered: said once until a connection succeeds */
		if (!r->up[c->upstream].warned)
			log_warn("cannot connect to %s (%s); retrying, at most "
				 "every %u ms", c->peer, why,
				 r->cfg->reconnect_max_ms);
		r->up[c->upstream].warned = true;
	} else {
		log_warn("peer %s%s%s: %s; disconnected", c->peer,
			 c->node[0] ? " node " : "", c->node, why);
	}
	c->state = C_DEAD;
	while ((s = c->subs)) {
		c->subs = s->next;
		pthread_mutex_lock(&r->mu);
		s->cancel = true;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&r->mu);
		sub_release(r, s);
		s->next = r->zombies;
		r->zombies = s;
	}
	if (c->serving && r->nserving)
		r->nserving--;
	for (p = c->pulls; p; p = p->next)
		if (!p->failed) {
			p->failed = true;
			snprintf(p->why, sizeof(p->why), "the peer went away");
		}
	if (c->upstream >= 0) {
		struct upstream *u = &r->up[c->upstream];
		u->c = NULL;
		u->retry_ms = now_ms() + u->backoff_ms;
		u->backoff_ms = u->backoff_ms * 2 > r->cfg->reconnect_max_ms ?
				r->cfg->reconnect_max_ms : u->backoff_ms * 2;
	}
}

static void close_ep(struct conn *c)
{
	ucp_request_param_t p = { 0 };
	ucs_status_ptr_t sp;

	if (c->closed || !c->ep)
		return;
	c->closed = true;
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = c->flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
	sp = ucp_ep_close_nbx(c->ep, &p);
	if (sp && !UCS_PTR_IS_ERR(sp))
		c->close_req = sp;
}

static void pull_close(struct relay *r, struct pull *p);

/* Frees dead connections whose gets, receives and close are done. */
static void conns_reap(struct relay *r)
{
	struct conn **pc = &r->conns, *c;

	while ((c = *pc)) {
		struct pull **pp = &c->pulls, *p;

		if (c->state != C_DEAD) {
			pc = &c->next;
			continue;
		}
		for (p = *pp; p; p = p->next) {
			if (p->busy || p->inflight || p->st != P_PULLING)
				continue;
			if (!p->failed) {
				p->failed = true;
				snprintf(p->why, sizeof(p->why), "the peer went away");
			}
			pull_close(r, p);
		}
		/* a forced close cancels the gets and receives still
		 * outstanding: their callbacks run with an error */
		close_ep(c);
		if (c->close_req) {
			if (ucp_request_check_status(c->close_req) == UCS_INPROGRESS) {
				pc = &c->next;
				continue;
			}
			ucp_request_free(c->close_req);
			c->close_req = NULL;
		}
		if (!c->closed || c->pulls || c->recvs) {
			pc = &c->next;
			continue;
		}
		*pc = c->next;
		free(c);
	}
}

/* ---- serving: the threads --------------------------------------------------- */

#define PICK_MAX 64   /* names one scan of a prefix collects */

/* One scan: up to PICK_MAX names with a version newer than the one
 * offered, those after the last name offered first (round-robin). */
struct pick {
	struct sub *s;
	size_t n, nafter;
	char name[PICK_MAX][256];
	uint64_t v[PICK_MAX];
};

static int pick_cb(const dlshare_name_info *info, void *arg)
{
	struct pick *k = arg;
	struct seen *e;
	bool after;

	if (!info->latest)
		return 0;
	HASH_FIND_STR(k->s->seen, info->name, e);
	if (e && e->version >= info->latest)
		return 0;
	after = strcmp(info->name, k->s->last) > 0;
	if (k->n == PICK_MAX) {
		/* full: only a name after the last offered may displace
		 * one before it */
		if (!after || k->nafter == PICK_MAX)
			return k->nafter == PICK_MAX;
		k->n--;
	}
	if (after) {
		/* after-names go first, in order */
		memmove(k->name[k->nafter + 1], k->name[k->nafter],
			(k->n - k->nafter) * sizeof(k->name[0]));
		memmove(&k->v[k->nafter + 1], &k->v[k->nafter],
			(k->n - k->nafter) * sizeof(k->v[0]));
		snprintf(k->name[k->nafter], 256, "%s", info->name);
		k->v[k->nafter] = info->latest;
		k->nafter++;
	} else {
		snprintf(k->name[k->n], 256, "%s", info->name);
		k->v[k->n] = info->latest;
	}
	k->n++;
	return 0;
}

static void seen_set(struct sub *s, const char *name, uint64_t v)
{
	struct seen *e;
	size_t n = strlen(name);

	HASH_FIND_STR(s->seen, name, e);
	if (!e) {
		e = calloc(1, sizeof(*e) + n + 1);
		if (!e)
			return;
		memcpy(e->name, name, n + 1);
		HASH_ADD_STR(s->seen, name, e);
	}
	e->version = v;
}

static uint64_t seen_get(struct sub *s, const char *name)
{
	struct seen *e;

	HASH_FIND_STR(s->seen, name, e);
	return e ? e->version : 0;
}

/* Hands b (a lease on name) to the loop and waits until it is done with
 * it. Returns false when cancelled. */
static bool sub_offer(struct sub *s, dlshare_bundle *b, const char *name_in)
{
	struct relay *r = s->r;
	uint64_t one = 1;
	bool cancelled;
	char name[256];

	/* name_in may be s->hot, rewritten below */
	snprintf(name, sizeof(name), "%s", name_in);

	seen_set(s, name, dlshare_bundle_version(b));
	snprintf(s->hot, sizeof(s->hot), "%s", name);
	snprintf(s->last, sizeof(s->last), "%s", name);
	pthread_mutex_lock(&r->mu);
	if (s->cancel) {
		pthread_mutex_unlock(&r->mu);
		dlshare_bundle_free(b);
		return false;
	}
	s->bundle = b;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->state = SUB_READY;
	s->next_ready = r->ready;
	r->ready = s;
	pthread_mutex_unlock(&r->mu);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the loop is awake anyway */
	}
	pthread_mutex_lock(&r->mu);
	while (s->state != SUB_RELEASE)
		pthread_cond_wait(&s->cv, &r->mu);
	s->bundle = NULL;
	s->state = SUB_SCAN;
	cancelled = s->cancel;
	pthread_mutex_unlock(&r->mu);
	dlshare_bundle_free(b);
	return !cancelled;
}

static void *sub_thread(void *arg)
{
	struct sub *s = arg;
	struct relay *r = s->r;
	uint64_t one = 1;
	struct seen *e, *tmp;

	struct pick *k = malloc(sizeof(*k));

	for (; k;) {
		dlshare_bundle *b = NULL;
		dlshare_get_opts o = { 0 };
		const char *name = NULL;
		bool stop = false;
		size_t i;
		int err;

		pthread_mutex_lock(&r->mu);
		if (s->cancel) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		pthread_mutex_unlock(&r->mu);

		k->s = s;
		k->n = k->nafter = 0;
		err = dlshare_list(r->dl, s->prefix, pick_cb, k);
		if (err)
			log_warn("serving %s: list: %s", s->prefix,
				 dlshare_strerror(err));
		for (i = 0; i < k->n && !stop; i++) {
			o = (dlshare_get_opts){ .select = DLSHARE_LATEST };
			b = NULL;
			err = dlshare_get(r->dl, k->name[i], &o, &b);
			if (err) {
				/* deleted, or not ours to read: skip this
				 * version, try the next scan */
				if (err != DLSHARE_ENOENT)
					log_warn("serving %s: get: %s", k->name[i],
						 dlshare_last_error()[0] ?
						 dlshare_last_error() :
						 dlshare_strerror(err));
				seen_set(s, k->name[i], k->v[i]);
				continue;
			}
			if (!sub_offer(s, b, k->name[i]))
				stop = true;
		}
		if (stop)
			break;
		if (k->n)
			continue;
		if (s->hot[0]) {
			/* Nothing new: wait on the name that changed last, the
			 * daemon parks the request; others are seen by the next
			 * scan. */
			o.select = DLSHARE_NEWER_THAN;
			o.version = seen_get(s, s->hot);
			o.timeout_ms = (int32_t)r->cfg->scan_interval_ms;
			err = dlshare_get(r->dl, s->hot, &o, &b);
			if (err == 0)
				name = s->hot;
			else if (err != DLSHARE_ETIMEDOUT)
				s->hot[0] = 0;
		} else {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += (long)(r->cfg->scan_interval_ms % 1000) * 1000000;
			ts.tv_sec += r->cfg->scan_interval_ms / 1000 + ts.tv_nsec / 1000000000;
			ts.tv_nsec %= 1000000000;
			pthread_mutex_lock(&r->mu);
			if (!s->cancel)
				pthread_cond_timedwait(&s->cv, &r->mu, &ts);
			pthread_mutex_unlock(&r->mu);
		}
		if (b && !sub_offer(s, b, name))
			break;
	}
	if (!k)
		log_err("serving %s: out of memory", s->prefix);
	free(k);
	HASH_ITER(hh, s->seen, e, tmp) {
		HASH_DEL(s->seen, e);
		free(e);
	}
	pthread_mutex_lock(&r->mu);
	s->state = SUB_EXITED;
	pthread_mutex_unlock(&r->mu);
	if (write(r->evfd, &one, sizeof(one)) < 0) {
		/* the loop is awake anyway */
	}
	return NULL;
}

/* The loop is done with s's offer (sent and answered, or the peer went):
 * unregisters the memory, lets the thread release the lease. */
static void sub_release(struct relay *r, struct sub *s)
{
	struct sub **pp;
	uint32_t i;

	for (i = 0; i < s->nmemh; i++)
		ucp_mem_unmap(r->ctx, s->memh[i]);
	free(s->memh);
	s->memh = NULL;
	s->nmemh = 0;
	pthread_mutex_lock(&r->mu);
	if (s->state == SUB_READY) {
		for (pp = &r->ready; *pp; pp = &(*pp)->next_ready)
			if (*pp == s) {
				*pp = s->next_ready;
				break;
			}
	}
	if (s->state == SUB_READY || s->state == SUB_SENT) {
		s->state = SUB_RELEASE;
		pthread_cond_signal(&s->cv);
	}
	pthread_mutex_unlock(&r->mu);
}

static void zombies_reap(struct relay *r)
{
	struct sub **pp = &r->zombies, *s;

	while ((s = *pp)) {
		enum sub_state st;

		pthread_mutex_lock(&r->mu);
		st = s->state;
		pthread_mutex_unlock(&r->mu);
		if (st != SUB_EXITED) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		pthread_join(s->th, NULL);
		pthread_cond_destroy(&s->cv);
		free(s);
	}
}

/* ---- serving: offers ---------------------------------------------------------- */

struct span {
	uint64_t addr, len;
	size_t idx;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static bool is_compact(const DLTensor *t)
{
	int64_t want = 1;
	int i;

	if (!t->strides)
		return true;
	for (i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->strides[i] != want)
			return false;
		want *= t->shape[i];
	}
	return true;
}

/* Builds and sends the OFFER of s's lease. Returns 0, or -1 when this
 * version cannot be offered (s is then released, the peer kept). */
static int offer_send(struct relay *r, struct conn *c, struct sub *s)
{
	dlshare_bundle *b = s->bundle;
	size_t n = dlshare_bundle_count(b), i, nspan = 0, nreg = 0;
	struct span *sp = calloc(n ? n : 1, sizeof(*sp));
	uint32_t *reg_of = calloc(n ? n : 1, sizeof(*reg_of));
	uint64_t *reg_addr = NULL, *reg_len = NULL;
	struct wbuf w;
	const char *why = NULL;
	int ret = -1;

	if (!sp || !reg_of) {
		why = "out of memory";
		goto out;
	}
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		uint64_t nb;

		if (!t || dlshare_tensor_nbytes(t, &nb)) {
			why = "a tensor the library refuses";
			goto out;
		}
		if (t->device.device_type != kDLCPU &&
		    t->device.device_type != kDLCUDAHost) {
			why = "a device tensor (the relay moves host tensors)";
			goto out;
		}
		if (!is_compact(t)) {
			why = "a strided tensor (the relay moves compact ones)";
			goto out;
		}
		reg_of[i] = UINT32_MAX;
		if (!nb)
			continue;
		sp[nspan].addr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
		sp[nspan].len = nb;
		sp[nspan].idx = i;
		nspan++;
	}
	qsort(sp, nspan, sizeof(*sp), span_cmp);
	reg_addr = calloc(nspan ? nspan : 1, sizeof(uint64_t));
	reg_len = calloc(nspan ? nspan : 1, sizeof(uint64_t));
	s->memh = calloc(nspan ? nspan : 1, sizeof(ucp_mem_h));
	if (!reg_addr || !reg_len || !s->memh) {
		why = "out of memory";
		goto out;
	}
	/* Tensors whose bytes touch the same or the next page belong to one
	 * mapping: one registration covers them, with no hole. */
	for (i = 0; i < nspan; i++) {
		uint64_t end = sp[i].addr + sp[i].len;

		if (nreg) {
			uint64_t cur_end = reg_addr[nreg - 1] + reg_len[nreg - 1];
			uint64_t page_end = (cur_end + 4095) & ~(uint64_t)4095;

			if (sp[i].addr <= page_end) {
				if (end > cur_end)
					reg_len[nreg - 1] = end - reg_addr[nreg - 1];
				reg_of[sp[i].idx] = (uint32_t)(nreg - 1);
				continue;
			}
		}
		reg_addr[nreg] = sp[i].addr;
		reg_len[nreg] = sp[i].len;
		reg_of[sp[i].idx] = (uint32_t)nreg;
		nreg++;
	}

	wbuf_start(&w, MSG_OFFER);
	wbuf_u32(&w, s->sub_id);
	s->offer_id = ++r->next_offer;
	wbuf_u64(&w, s->offer_id);
	wbuf_u16(&w, (uint16_t)strlen(s->name));
	wbuf_bytes(&w, s->name, strlen(s->name));
	wbuf_u64(&w, dlshare_bundle_version(b));
	wbuf_u32(&w, (uint32_t)nreg);
	wbuf_u32(&w, (uint32_t)n);
	for (i = 0; i < nreg; i++) {
		ucp_mem_map_params_t mp = { 0 };
		void *rk = NULL;
		size_t rklen = 0;
		ucs_status_t st;

		mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
				UCP_MEM_MAP_PARAM_FIELD_LENGTH;
		mp.address = (void *)(uintptr_t)reg_addr[i];
		mp.length = reg_len[i];
		st = ucp_mem_map(r->ctx, &mp, &s->memh[i]);
		if (st != UCS_OK) {
			why = ucs_status_string(st);
			free(w.p);
			goto out;
		}
		s->nmemh++;
		st = ucp_rkey_pack(r->ctx, s->memh[i], &rk, &rklen);
		if (st != UCS_OK) {
			why = ucs_status_string(st);
			free(w.p);
			goto out;
		}
		wbuf_u64(&w, reg_addr[i]);
		wbuf_u64(&w, reg_len[i]);
		wbuf_u32(&w, (uint32_t)rklen);
		wbuf_bytes(&w, rk, rklen);
		ucp_rkey_buffer_release(rk);
	}
	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		const char *key = dlshare_bundle_key(b, i);
		size_t kl = strlen(key);
		uint64_t nb = 0;
		int d;

		dlshare_tensor_nbytes(t, &nb);
		wbuf_u16(&w, (uint16_t)kl);
		wbuf_bytes(&w, key, kl);
		wbuf_u8(&w, t->dtype.code);
		wbuf_u8(&w, t->dtype.bits);
		wbuf_u16(&w, t->dtype.lanes);
		wbuf_u8(&w, (uint8_t)t->ndim);
		for (d = 0; d < t->ndim; d++)
			wbuf_u64(&w, (uint64_t)t->shape[d]);
		wbuf_u32(&w, reg_of[i]);
		wbuf_u64(&w, reg_of[i] == UINT32_MAX ? 0 :
			 (uint64_t)(uintptr_t)t->data + t->byte_offset -
			 reg_addr[reg_of[i]]);
		wbuf_u64(&w, nb);
	}
	if (w.len > r->cfg->max_message) {
		free(w.p);
		why = "its offer is larger than --max-message";
		goto out;
	}
	pthread_mutex_lock(&r->mu);
	s->state = SUB_SENT;
	pthread_mutex_unlock(&r->mu);
	s->sent_ms = now_ms();
	ret = conn_send(c, &w);
	if (ret)
		why = "send failed";
out:
	if (ret) {
		log_warn("serving %s version %" PRIu64 " to %s: not offered: %s",
			 s->name, dlshare_bundle_version(b), c->peer, why);
		sub_release(r, s);
	}
	free(sp);
	free(reg_of);
	free(reg_addr);
	free(reg_len);
	return ret;
}

/* Offers what the threads found. */
static void ready_drain(struct relay *r)
{
	for (;;) {
		struct sub *s;
		struct conn *c;

		pthread_mutex_lock(&r->mu);
		s = r->ready;
		if (s) {
			r->ready = s->next_ready;
			s->next_ready = NULL;
		}
		pthread_mutex_unlock(&r->mu);
		if (!s)
			return;
		c = conn_by_id(r, s->conn_id);
		if (!c || c->state != C_READY) {
			sub_release(r, s);
			continue;
		}
		offer_send(r, c, s);
	}
}

/* ---- mirroring: pulls --------------------------------------------------------- */

static void known_set(struct relay *r, const char *name, uint64_t v)
{
	struct known *k;
	size_t n = strlen(name);

	HASH_FIND_STR(r->known, name, k);
	if (!k) {
		k = calloc(1, sizeof(*k) + n + 1);
		if (!k)
			return;
		memcpy(k->name, name, n + 1);
		HASH_ADD_STR(r->known, name, k);
	}
	k->version = v;
}

static void send_done(struct conn *c, uint64_t offer_id, uint32_t status)
{
	struct wbuf w;

	wbuf_start(&w, MSG_DONE);
	wbuf_u64(&w, offer_id);
	wbuf_u32(&w, status);
	conn_send(c, &w);
}

static void pull_free(struct pull *p)
{
	uint32_t i;

	for (i = 0; p->regions && i < p->nregions; i++)
		if (p->regions[i].rkey)
			ucp_rkey_destroy(p->regions[i].rkey);
	free(p->regions);
	free(p->jobs);
	free(p->spec);
	free(p->shapes);
	free(p->toff);
	free(p->tlen);
	free(p->treg);
	free(p->keys);
	free(p->msg);
	free(p);
}

/* Hands p to the daemon worker (its state says what to do). */
static void pull_post(struct relay *r, struct pull *p)
{
	p->busy = true;
	pthread_mutex_lock(&r->mu);
	p->next_job = NULL;
	{
		struct pull **pp = &r->jobs;
		while (*pp)
			pp = &(*pp)->next_job;
		*pp = p;
	}
	pthread_cond_signal(&r->jobcv);
	pthread_mutex_unlock(&r->mu);
}

/* p has no get outstanding: seal it, or abort it, on the worker. */
static void pull_close(struct relay *r, struct pull *p)
{
	p->st = P_CLOSING;
	pull_post(r, p);
}

static void last_error(char *buf, size_t len, const char *what, int err)
{
	snprintf(buf, len, "%s: %s", what, dlshare_last_error()[0] ?
		 dlshare_last_error() : dlshare_strerror(err));
}

/* The daemon worker: runs blocking libdlshare calls of pulls. */
static void *worker_thread(void *arg)
{
	struct relay *r = arg;
	uint64_t one = 1;

	for (;;) {
		struct pull *p;
		int err;

		pthread_mutex_lock(&r->mu);
		while (!r->jobs && !r->worker_stop)
			pthread_cond_wait(&r->jobcv, &r->mu);
		p = r->jobs;
		if (!p) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		r->jobs = p->next_job;
		pthread_mutex_unlock(&r->mu);

		if (p->st == P_CREATING) {
			dlshare_create_opts co = { 0 };

			co.device.device_type = kDLCPU;
			co.mode = r->cfg->mode;
			/* origin: set when relayops lands
			 * co.origin_node = p->c->node;
			 * co.origin_version = p->origin_version; */
			err = dlshare_create(r->dl, p->name, p->spec, p->ntensors,
					     &co, &p->w);
			if (err) {
				p->w = NULL;
				p->failed = true;
				last_error(p->why, sizeof(p->why), "create", err);
			}
		} else if (!p->failed && p->w) {
			err = dlshare_seal(p->w, NULL, &p->sealed);
			p->w = NULL;
			if (err) {
				p->failed = true;
				last_error(p->why, sizeof(p->why), "seal", err);
			}
		} else if (p->w) {
			dlshare_writer_abort(p->w);
			p->w = NULL;
		}
		pthread_mutex_lock(&r->mu);
		p->next_job = r->done;
		r->done = p;
		pthread_mutex_unlock(&r->mu);
		if (write(r->evfd, &one, sizeof(one)) < 0) {
			/* the loop is awake anyway */
		}
	}
	return NULL;
}

static void pull_unlink(struct pull *p)
{
	struct pull **pp;

	for (pp = &p->c->pulls; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

static void pull_start(struct relay *r, struct pull *p);

/* What the worker finished. */
static void done_drain(struct relay *r)
{
	struct pull *list, *p;

	pthread_mutex_lock(&r->mu);
	list = r->done;
	r->done = NULL;
	pthread_mutex_unlock(&r->mu);
	while ((p = list)) {
		list = p->next_job;
		p->busy = false;
		if (p->st == P_CREATING) {
			if (!p->failed && p->c->state == C_READY) {
				pull_start(r, p);
				continue;
			}
			pull_close(r, p);   /* abort what was created */
			continue;
		}
		pull_unlink(p);
		if (p->failed) {
			log_warn("mirror %s version %" PRIu64 " from %s: aborted, "
				 "nothing published: %s", p->name,
				 p->origin_version, p->c->peer, p->why);
		} else {
			known_set(r, p->name, p->origin_version);
			log_info("mirror %s: origin version %" PRIu64 " from %s is "
				 "local version %" PRIu64 " (%" PRIu64 " bytes)",
				 p->name, p->origin_version,
				 p->c->node[0] ? p->c->node : p->c->peer,
				 p->sealed, p->bytes);
		}
		if (p->c->state == C_READY)
			send_done(p->c, p->offer_id,
				  p->failed ? DONE_FAILED : DONE_OK);
		pull_free(p);
	}
}

static void get_cb(void *req, ucs_status_t st, void *user)
{
	struct pull *p = user;

	p->inflight--;
	p->c->r->inflight--;
	if (st != UCS_OK && !p->failed) {
		p->failed = true;
		snprintf(p->why, sizeof(p->why), "get: %s", ucs_status_string(st));
	}
	ucp_request_free(req);
}

/* Issues gets of p while the relay's limit allows. */
static void pull_pump(struct relay *r, struct pull *p)
{
	while (!p->failed && p->cur < p->njobs &&
	       r->inflight < r->cfg->max_inflight) {
		struct job *j = &p->jobs[p->cur];
		uint64_t len = j->len - p->cur_off;
		ucp_request_param_t rp = { 0 };
		ucs_status_ptr_t sp;

		if (len > r->cfg->chunk_size)
			len = r->cfg->chunk_size;
		rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				  UCP_OP_ATTR_FIELD_USER_DATA;
		rp.cb.send = get_cb;
		rp.user_data = p;
		sp = ucp_get_nbx(p->c->ep, j->dst + p->cur_off, len,
				 j->src + p->cur_off, p->regions[j->region].rkey,
				 &rp);
		if (UCS_PTR_IS_ERR(sp)) {
			p->failed = true;
			snprintf(p->why, sizeof(p->why), "get: %s",
				 ucs_status_string(UCS_PTR_STATUS(sp)));
			break;
		}
		if (sp) {
			p->inflight++;
			r->inflight++;
		}
		p->cur_off += len;
		if (p->cur_off == j->len) {
			p->cur++;
			p->cur_off = 0;
		}
	}
}

/* Pumps every pull, finishes those that are done. */
static void pulls_run(struct relay *r)
{
	struct conn *c;

	for (c = r->conns; c; c = c->next) {
		struct pull **pp = &c->pulls, *p;

		if (c->state != C_READY)
			continue;
		for (p = *pp; p; p = p->next) {
			if (p->busy || p->st != P_PULLING)
				continue;
			pull_pump(r, p);
			if (!p->inflight && (p->failed || p->cur == p->njobs))
				pull_close(r, p);
		}
	}
}

/* The writer exists: unpack the rkeys, plan the gets, start pulling. */
static void pull_start(struct relay *r, struct pull *p)
{
	uint32_t i;

	(void)r;
	p->st = P_PULLING;
	if (dlshare_writer_count(p->w) != p->ntensors) {
		snprintf(p->why, sizeof(p->why), "the writer has %zu tensors, "
			 "the offer %u", dlshare_writer_count(p->w), p->ntensors);
		p->failed = true;
	}
	for (i = 0; i < p->nregions && !p->failed; i++) {
		ucs_status_t st = ucp_ep_rkey_unpack(p->c->ep, p->regions[i].rkey_buf,
						     &p->regions[i].rkey);
		if (st != UCS_OK) {
			p->regions[i].rkey = NULL;
			p->failed = true;
			snprintf(p->why, sizeof(p->why), "rkey: %s",
				 ucs_status_string(st));
		}
		p->regions[i].rkey_buf = NULL;
	}
	/* Jobs: one per tensor, merged with the one before when both sides
	 * continue it across the same padding (the library lays bundles out
	 * alike on both nodes, so a state dict becomes a few large gets). */
	p->njobs = 0;
	for (i = 0; i < p->ntensors && !p->failed; i++) {
		DLTensor *t = dlshare_writer_tensor(p->w, i);
		uint64_t src, len = p->tlen[i];
		uint32_t reg = p->treg[i];
		uint8_t *dst;

		if (!len)
			continue;
		src = p->regions[reg].addr + p->toff[i];
		dst = (uint8_t *)t->data + t->byte_offset;
		p->bytes += len;
		if (p->njobs) {
			struct job *j = &p->jobs[p->njobs - 1];
			uint64_t send = j->src + j->len;
			uint8_t *dend = j->dst + j->len;

			if (j->region == reg && src >= send && dst >= dend &&
			    src - send == (uint64_t)(dst - dend) &&
			    src - send <= COALESCE_GAP) {
				j->len += (src - send) + len;
				continue;
			}
		}
		p->jobs[p->njobs++] = (struct job){ dst, src, len, reg };
	}
}

/* Takes an OFFER (msg, owned) from c. Returns 0, or -1 after failing c. */
static int offer_take(struct relay *r, struct conn *c, void *msg,
		      struct rbuf *rb)
{
	const struct relay_peer_cfg *pc = &r->cfg->peers[c->upstream];
	struct pull *p = calloc(1, sizeof(*p));
	dlshare_tensor_spec *spec = NULL;
	uint32_t *treg = NULL;
	uint64_t *toff = NULL, *tlen = NULL;
	int64_t *shapes = NULL;
	uint32_t ntensors, i, k;
	uint16_t nl;
	const char *name;
	struct known *kn;
	const char *bad = NULL;

	if (!p) {
		free(msg);
		conn_fail(c, "out of memory");
		return -1;
	}
	p->c = c;
	p->msg = msg;
	p->sub_id = rbuf_u32(rb);
	p->offer_id = rbuf_u64(rb);
	nl = rbuf_u16(rb);
	name = rbuf_bytes(rb, nl);
	p->origin_version = rbuf_u64(rb);
	p->nregions = rbuf_u32(rb);
	ntensors = rbuf_u32(rb);
	if (rb->bad || !nl || nl > 255) {
		bad = "a malformed offer";
		goto proto;
	}
	memcpy(p->name, name, nl);
	p->name[nl] = 0;
	if (p->sub_id >= (uint32_t)pc->nprefix ||
	    strncmp(p->name, pc->prefix[p->sub_id], strlen(pc->prefix[p->sub_id]))) {
		bad = "an offer outside the prefixes this relay follows";
		goto proto;
	}
	for (struct pull *q = c->pulls; q; q = q->next)
		if (q->sub_id == p->sub_id) {
			bad = "a second offer for one prefix before DONE";
			goto proto;
		}
	/* every region takes at least 20 bytes, every tensor 27: counts the
	 * message cannot hold are refused before anything is allocated */
	if (p->nregions > rbuf_left(rb) / 20 || ntensors > MAX_TENSORS ||
	    ntensors > rbuf_left(rb) / 27) {
		bad = "an offer whose counts exceed its size";
		goto proto;
	}
	p->regions = calloc(p->nregions ? p->nregions : 1, sizeof(*p->regions));
	spec = calloc(ntensors ? ntensors : 1, sizeof(*spec));
	treg = calloc(ntensors ? ntensors : 1, sizeof(*treg));
	toff = calloc(ntensors ? ntensors : 1, sizeof(*toff));
	tlen = calloc(ntensors ? ntensors : 1, sizeof(*tlen));
	shapes = calloc((size_t)(ntensors ? ntensors : 1) * MAX_NDIM, sizeof(*shapes));
	p->jobs = calloc(ntensors ? ntensors : 1, sizeof(*p->jobs));
	if (!p->regions || !spec || !treg || !toff || !tlen || !shapes || !p->jobs) {
		pull_free(p);
		p = NULL;
		conn_fail(c, "out of memory for an offer of %u tensors", ntensors);
		goto out;
	}
	for (i = 0; i < p->nregions; i++) {
		struct region *g = &p->regions[i];

		g->addr = rbuf_u64(rb);
		g->len = rbuf_u64(rb);
		g->rkey_len = rbuf_u32(rb);
		g->rkey_buf = rbuf_bytes(rb, g->rkey_len);
		if (rb->bad || g->addr + g->len < g->addr) {
			bad = "a malformed region";
			goto proto;
		}
	}
	for (i = 0; i < ntensors; i++) {
		uint16_t kl = rbuf_u16(rb);
		const char *key = rbuf_bytes(rb, kl);
		DLTensor t = { 0 };
		uint64_t nb;

		spec[i].dtype.code = rbuf_u8(rb);
		spec[i].dtype.bits = rbuf_u8(rb);
		spec[i].dtype.lanes = rbuf_u16(rb);
		spec[i].ndim = rbuf_u8(rb);
		if (rb->bad || spec[i].ndim > MAX_NDIM) {
			bad = "a malformed tensor";
			goto proto;
		}
		for (k = 0; k < (uint32_t)spec[i].ndim; k++)
			shapes[(size_t)i * MAX_NDIM + k] = (int64_t)rbuf_u64(rb);
		spec[i].shape = &shapes[(size_t)i * MAX_NDIM];
		treg[i] = rbuf_u32(rb);
		toff[i] = rbuf_u64(rb);
		tlen[i] = rbuf_u64(rb);
		if (rb->bad) {
			bad = "a malformed tensor";
			goto proto;
		}
		/* keys point into msg, not NUL-ended: copied below */
		spec[i].key = key;
		t.dtype = spec[i].dtype;
		t.ndim = spec[i].ndim;
		t.shape = (int64_t *)spec[i].shape;
		if (dlshare_tensor_nbytes(&t, &nb) || nb != tlen[i]) {
			bad = "a tensor whose size does not match its shape";
			goto proto;
		}
		if (nb && (treg[i] >= p->nregions || toff[i] > p->regions[treg[i]].len ||
			   p->regions[treg[i]].len - toff[i] < nb)) {
			bad = "a tensor outside its region";
			goto proto;
		}
		/* the key's length, until the jobs are made */
		p->jobs[i].len = kl;
	}
	if (rbuf_left(rb)) {
		bad = "trailing bytes after an offer";
		goto proto;
	}
	/* NUL-ended keys */
	{
		size_t total = 0;
		char *keys, *q;

		for (i = 0; i < ntensors; i++)
			total += p->jobs[i].len + 1;
		keys = malloc(total ? total : 1);
		if (!keys) {
			pull_free(p);
			p = NULL;
			conn_fail(c, "out of memory");
			goto out;
		}
		for (q = keys, i = 0; i < ntensors; i++) {
			memcpy(q, spec[i].key, p->jobs[i].len);
			q[p->jobs[i].len] = 0;
			spec[i].key = q;
			q += p->jobs[i].len + 1;
		}
		p->keys = keys;
	}

	HASH_FIND_STR(r->known, p->name, kn);
	if (kn && kn->version >= p->origin_version) {
		send_done(c, p->offer_id, DONE_SKIPPED);
		pull_free(p);
		p = NULL;
		goto out;
	}
	p->spec = spec;
	p->shapes = shapes;
	p->toff = toff;
	p->tlen = tlen;
	p->treg = treg;
	p->ntensors = ntensors;
	spec = NULL;
	shapes = NULL;
	toff = tlen = NULL;
	treg = NULL;
	p->st = P_CREATING;
	p->next = c->pulls;
	c->pulls = p;
	pull_post(r, p);
	p = NULL;
out:
	free(spec);
	free(treg);
	free(toff);
	free(tlen);
	free(shapes);
	return 0;
proto:
	pull_free(p);
	free(spec);
	free(treg);
	free(toff);
	free(tlen);
	free(shapes);
	send_error(c, 1, bad);
	conn_fail(c, "%s", bad);
	return -1;
}

/* ---- messages -------------------------------------------------------------- */

static void auth_failed(struct relay *r, struct conn *c, const char *why)
{
	uint64_t t = now_ms();

	if (t - r->authlog_start >= 60000) {
		if (r->authlog_dropped)
			log_warn("%u more failed authentications in the last "
				 "minute were not logged", r->authlog_dropped);
		r->authlog_start = t;
		r->authlog_n = 0;
		r->authlog_dropped = 0;
	}
	if (r->authlog_n < r->cfg->auth_log_per_min) {
		r->authlog_n++;
		log_warn("peer %s: authentication failed: %s", c->peer, why);
	} else {
		r->authlog_dropped++;
	}
	send_error(c, 2, "authentication failed");
	/* conn_fail logs too; keep the line count bounded by marking first */
	c->state = C_DEAD;
	if (c->serving && r->nserving)
		r->nserving--;
	if (c->upstream >= 0) {
		struct upstream *u = &r->up[c->upstream];
		u->c = NULL;
		u->retry_ms = t + r->cfg->reconnect_max_ms;
		u->backoff_ms = r->cfg->reconnect_max_ms;
	}
}

static void server_msg(struct relay *r, struct conn *c, uint16_t type,
		       struct rbuf *rb)
{
	uint8_t mac[SHA256_LEN];
	struct wbuf w;

	switch (c->state) {
	case C_HELLO: {
		uint16_t major, minor;
		const void *nonce;

		if (type != MSG_CHALLENGE)
			goto unexpected;
		major = rbuf_u16(rb);
		minor = rbuf_u16(rb);
		nonce = rbuf_bytes(rb, RELAY_NONCE_LEN);
		(void)minor;
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		if (major != RELAY_PROTO_MAJOR) {
			send_error(c, 3, "unsupported relay protocol major");
			conn_fail(c, "relay protocol %u, this relay speaks %u",
				  major, RELAY_PROTO_MAJOR);
			return;
		}
		memcpy(c->nonce_m, nonce, RELAY_NONCE_LEN);
		if (auth_random(c->nonce_s, RELAY_NONCE_LEN)) {
			conn_fail(c, "getrandom failed");
			return;
		}
		auth_proof(&r->key, "server", c->nonce_m, c->nonce_s, mac);
		wbuf_start(&w, MSG_PROOF_S);
		wbuf_u16(&w, RELAY_PROTO_MAJOR);
		wbuf_u16(&w, RELAY_PROTO_MINOR);
		wbuf_bytes(&w, c->nonce_s, RELAY_NONCE_LEN);
		wbuf_bytes(&w, mac, SHA256_LEN);
		if (!conn_send(c, &w))
			c->state = C_PROOF;
		return;
	}
	case C_PROOF: {
		const void *their;
		size_t nl = strlen(r->node);

		if (type != MSG_PROOF_M)
			goto unexpected;
		their = rbuf_bytes(rb, SHA256_LEN);
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		auth_proof(&r->key, "mirror", c->nonce_m, c->nonce_s, mac);
		if (mem_equal_ct(mac, their, SHA256_LEN)) {
			c->flush = true;
			auth_failed(r, c, "wrong key");
			return;
		}
		c->state = C_READY;
		log_info("peer %s authenticated", c->peer);
		wbuf_start(&w, MSG_WELCOME);
		wbuf_u8(&w, (uint8_t)nl);
		wbuf_bytes(&w, r->node, nl);
		conn_send(c, &w);
		return;
	}
	case C_READY:
		break;
	case C_DEAD:
		return;
	}
	if (type == MSG_SUBSCRIBE) {
		uint32_t id = rbuf_u32(rb);
		uint16_t pl = rbuf_u16(rb);
		const char *pfx = rbuf_bytes(rb, pl);
		struct sub *s;

		if (rb->bad || rbuf_left(rb) || !pl || pl > RELAY_PREFIX_MAX)
			goto malformed;
		if (c->nsubs >= r->cfg->max_subscriptions) {
			send_error(c, 4, "too many subscriptions");
			conn_fail(c, "more than --max-subscriptions %u prefixes",
				  r->cfg->max_subscriptions);
			return;
		}
		for (s = c->subs; s; s = s->next)
			if (s->sub_id == id)
				goto malformed;
		s = calloc(1, sizeof(*s));
		if (!s) {
			conn_fail(c, "out of memory");
			return;
		}
		s->r = r;
		s->conn_id = c->id;
		s->sub_id = id;
		memcpy(s->prefix, pfx, pl);
		s->prefix[pl] = 0;
		s->state = SUB_SCAN;
		pthread_cond_init(&s->cv, NULL);
		if (pthread_create(&s->th, NULL, sub_thread, s)) {
			pthread_cond_destroy(&s->cv);
			free(s);
			conn_fail(c, "cannot start a thread");
			return;
		}
		s->next = c->subs;
		c->subs = s;
		c->nsubs++;
		log_info("peer %s follows '%s'", c->peer, s->prefix);
		return;
	}
	if (type == MSG_DONE) {
		uint64_t id = rbuf_u64(rb);
		uint32_t status = rbuf_u32(rb);
		struct sub *s;

		if (rb->bad || rbuf_left(rb) || status > DONE_FAILED)
			goto malformed;
		for (s = c->subs; s; s = s->next)
			if (s->offer_id == id && s->memh)
				break;
		if (!s)
			goto unexpected;
		if (status == DONE_FAILED)
			log_warn("peer %s could not mirror %s", c->peer, s->name);
		s->offer_id = 0;
		sub_release(r, s);
		return;
	}
	if (type == MSG_ERROR) {
		conn_fail(c, "the peer sent an error");
		return;
	}
unexpected:
	send_error(c, 1, "unexpected message");
	conn_fail(c, "unexpected message type %u", type);
	return;
malformed:
	send_error(c, 1, "malformed message");
	conn_fail(c, "malformed message of type %u", type);
}

static void mirror_msg(struct relay *r, struct conn *c, uint16_t type,
		       struct rbuf *rb, struct inmsg **msg)
{
	const struct relay_peer_cfg *pc = &r->cfg->peers[c->upstream];
	uint8_t mac[SHA256_LEN];
	struct wbuf w;
	int i;

	if (type == MSG_ERROR) {
		uint32_t code = rbuf_u32(rb);
		uint16_t n = rbuf_u16(rb);
		const char *t = rbuf_bytes(rb, n);

		if (code == 2 && c->state != C_READY) {
			auth_failed(r, c, "the peer refused our key");
			return;
		}
		conn_fail(c, "the peer says: %.*s", t ? (int)n : 0, t ? t : "");
		return;
	}
	switch (c->state) {
	case C_HELLO: {
		const void *nonce, *theirs;
		uint16_t major;
		int bad;

		if (type != MSG_PROOF_S)
			goto unexpected;
		major = rbuf_u16(rb);
		(void)rbuf_u16(rb);
		nonce = rbuf_bytes(rb, RELAY_NONCE_LEN);
		theirs = rbuf_bytes(rb, SHA256_LEN);
		if (rb->bad || rbuf_left(rb))
			goto malformed;
		if (major != RELAY_PROTO_MAJOR) {
			conn_fail(c, "relay protocol %u, this relay speaks %u",
				  major, RELAY_PROTO_MAJOR);
			return;
		}
		memcpy(c->nonce_s, nonce, RELAY_NONCE_LEN);
		auth_proof(&r->key, "server", c->nonce_m, c->nonce_s, mac);
		bad = mem_equal_ct(mac, theirs, SHA256_LEN);
		/* Our proof goes out either way, so that a server with another
		 * key logs the refusal too; it is bound to our fresh nonce and
		 * to the role, so a false server gains nothing by it. */
		auth_proof(&r->key, "mirror", c->nonce_m, c->nonce_s, mac);
		wbuf_start(&w, MSG_PROOF_M);
		wbuf_bytes(&w, mac, SHA256_LEN);
		if (conn_send(c, &w))
			return;
		if (bad) {
			c->flush = true;
			auth_failed(r, c, "the server does not know our key");
			return;
		}
		c->state = C_PROOF;
		return;
	}
	case C_PROOF: {
		uint8_t nl;
		const char *node;

		if (type != MSG_WELCOME)
			goto unexpected;
		nl = rbuf_u8(rb);
		node = rbuf_bytes(rb, nl);
		if (rb->bad || rbuf_left(rb) || nl > RELAY_NODE_MAX)
			goto malformed;
		memcpy(c->node, node, nl);
		c->node[nl] = 0;
		c->state = C_READY;
		r->up[c->upstream].backoff_ms = BACKOFF_MIN_MS;
		r->up[c->upstream].warned = false;
		log_info("connected to %s (node %s)", c->peer, c->node);
		for (i = 0; i < pc->nprefix; i++) {
			size_t pl = strlen(pc->prefix[i]);

			wbuf_start(&w, MSG_SUBSCRIBE);
			wbuf_u32(&w, (uint32_t)i);
			wbuf_u16(&w, (uint16_t)pl);
			wbuf_bytes(&w, pc->prefix[i], pl);
			if (conn_send(c, &w))
				return;
		}
		return;
	}
	case C_READY:
		break;
	case C_DEAD:
		return;
	}
	if (type == MSG_OFFER) {
		struct inmsg *m = *msg;

		*msg = NULL;
		offer_take(r, c, m, rb);
		return;
	}
unexpected:
	send_error(c, 1, "unexpected message");
	conn_fail(c, "unexpected message type %u", type);
	return;
malformed:
	send_error(c, 1, "malformed message");
	conn_fail(c, "malformed message of type %u", type);
}

static void in_push(struct relay *r, struct inmsg *m)
{
	m->next = NULL;
	if (r->in_tail)
		r->in_tail->next = m;
	else
		r->in_head = m;
	r->in_tail = m;
}

static void msgs_run(struct relay *r)
{
	struct inmsg *m;

	while ((m = r->in_head)) {
		struct conn *c = conn_by_id(r, m->conn_id);
		struct rbuf rb;
		uint16_t type;

		r->in_head = m->next;
		if (!r->in_head)
			r->in_tail = NULL;
		if (c)
			c->queued -= m->len;
		if (!c || c->state == C_DEAD) {
			free(m);
			continue;
		}
		if (rbuf_open(&rb, m->data, m->len, &type)) {
			conn_fail(c, "a message that is not the relay protocol");
			free(m);
			continue;
		}
		if (c->serving)
			server_msg(r, c, type, &rb);
		else
			mirror_msg(r, c, type, &rb, &m); /* an offer keeps m */
		free(m);
	}
}

struct rndv {
	struct relay *r;
	uint64_t conn_id;
	struct inmsg *m;
};

static void rndv_cb(void *req, ucs_status_t st, size_t len, void *user)
{
	struct rndv *x = user;
	struct conn *c = conn_by_id(x->r, x->conn_id);

	(void)len;
	if (c)
		c->recvs--;
	if (st == UCS_OK && c)
		in_push(x->r, x->m);
	else
		free(x->m);
	free(x);
	if (req)
		ucp_request_free(req);
}

static ucs_status_t am_cb(void *arg, const void *hdr, size_t hlen, void *data,
			  size_t len, const ucp_am_recv_param_t *prm)
{
	struct relay *r = arg;
	struct conn *c = NULL;
	struct inmsg *m;
	size_t limit;

	(void)hdr;
	if (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
		c = conn_by_ep(r, prm->reply_ep);
	if (!c)
		return UCS_OK;    /* no such peer: dropped */
	limit = c->state == C_READY ? r->cfg->max_message : RELAY_PREAUTH_MAX;
	if (hlen || len > limit || c->queued + len > 2 * r->cfg->max_message) {
		conn_fail(c, "a message of %zu bytes (limit %zu, header %zu)",
			  len, limit, hlen);
		return UCS_OK;
	}
	m = malloc(sizeof(*m) + len);
	if (!m) {
		conn_fail(c, "out of memory for a message of %zu bytes", len);
		return UCS_OK;
	}
	m->conn_id = c->id;
	m->len = len;
	c->queued += len;
	if (prm->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		struct rndv *x = malloc(sizeof(*x));
		ucp_request_param_t rp = { 0 };
		ucs_status_ptr_t sp;

		if (!x) {
			free(m);
			conn_fail(c, "out of memory");
			return UCS_OK;
		}
		*x = (struct rndv){ r, c->id, m };
		rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
				  UCP_OP_ATTR_FIELD_USER_DATA;
		rp.cb.recv_am = rndv_cb;
		rp.user_data = x;
		c->recvs++;
		sp = ucp_am_recv_data_nbx(r->worker, data, m->data, len, &rp);
		if (sp == NULL) {
			rndv_cb(NULL, UCS_OK, len, x);
		} else if (UCS_PTR_IS_ERR(sp)) {
			c->recvs--;
			c->queued -= len;
			free(m);
			free(x);
			conn_fail(c, "receive: %s",
				  ucs_status_string(UCS_PTR_STATUS(sp)));
		}
		return UCS_OK;
	}
	memcpy(m->data, data, len);
	in_push(r, m);
	return UCS_OK;
}

/* ---- connecting and accepting ------------------------------------------------ */

static int resolve(const char *addr, bool passive, struct sockaddr_storage *sa,
		   socklen_t *salen)
{
	char host[300], port_s[8];
	struct addrinfo hints = { 0 }, *ai;
	uint16_t port;
	int e;

	if (config_split_addr(addr, host, sizeof(host), &port))
		return -1;
	snprintf(port_s, sizeof(port_s), "%u", port);
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = passive ? AI_PASSIVE : 0;
	e = getaddrinfo(host[0] ? host : NULL, port_s, &hints, &ai);
	if (e) {
		log_err("%s: %s", addr, gai_strerror(e));
		return -1;
	}
	memcpy(sa, ai->ai_addr, ai->ai_addrlen);
	*salen = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

static void upstream_connect(struct relay *r, int i)
{
	struct upstream *u = &r->up[i];
	ucp_ep_params_t ep = { 0 };
	struct conn *c;
	struct wbuf w;
	ucs_status_t st;

	c = conn_new(r, false, i, r->cfg->peers[i].addr);
	if (!c)
		return;
	ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
			UCP_EP_PARAM_FIELD_ERR_HANDLER |
			UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
	ep.sockaddr.addr = (struct sockaddr *)&u->sa;
	ep.sockaddr.addrlen = u->salen;
	ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	ep.err_handler.cb = ep_err_cb;
	ep.err_handler.arg = r;
	u->c = c;
	st = ucp_ep_create(r->worker, &ep, &c->ep);
	if (st != UCS_OK) {
		c->ep = NULL;
		c->closed = true;
		conn_fail(c, "connect: %s", ucs_status_string(st));
		return;
	}
	if (auth_random(c->nonce_m, RELAY_NONCE_LEN)) {
		conn_fail(c, "getrandom failed");
		return;
	}
	wbuf_start(&w, MSG_CHALLENGE);
	wbuf_u16(&w, RELAY_PROTO_MAJOR);
	wbuf_u16(&w, RELAY_PROTO_MINOR);
	wbuf_bytes(&w, c->nonce_m, RELAY_NONCE_LEN);
	conn_send(c, &w);
}

static void conn_req_cb(ucp_conn_request_h req, void *arg)
{
	struct relay *r = arg;
	struct pending_req *p = malloc(sizeof(*p));

	if (!p) {
		ucp_listener_reject(r->listener, req);
		return;
	}
	p->req = req;
	p->next = r->reqs;
	r->reqs = p;
}

static void accept_pending(struct relay *r)
{
	struct pending_req *p;

	while ((p = r->reqs)) {
		ucp_conn_request_attr_t at = { 0 };
		char peer[80] = "?";
		ucp_ep_params_t ep = { 0 };
		struct conn *c;
		ucs_status_t st;

		r->reqs = p->next;
		at.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
		if (ucp_conn_request_query(p->req, &at) == UCS_OK) {
			char host[64] = "?";
			struct sockaddr_storage *ss = &at.client_address;
			uint16_t port = 0;

			if (ss->ss_family == AF_INET) {
				inet_ntop(AF_INET, &((struct sockaddr_in *)ss)->sin_addr,
					  host, sizeof(host));
				port = ntohs(((struct sockaddr_in *)ss)->sin_port);
			} else if (ss->ss_family == AF_INET6) {
				inet_ntop(AF_INET6, &((struct sockaddr_in6 *)ss)->sin6_addr,
					  host, sizeof(host));
				port = ntohs(((struct sockaddr_in6 *)ss)->sin6_port);
			}
			snprintf(peer, sizeof(peer), "%s:%u", host, port);
		}
		if (r->nserving >= r->cfg->max_peers) {
			log_warn("peer %s refused: --max-peers %u reached", peer,
				 r->cfg->max_peers);
			ucp_listener_reject(r->listener, p->req);
			free(p);
			continue;
		}
		c = conn_new(r, true, -1, peer);
		if (!c) {
			ucp_listener_reject(r->listener, p->req);
			free(p);
			continue;
		}
		ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
				UCP_EP_PARAM_FIELD_ERR_HANDLER |
				UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
		ep.conn_request = p->req;
		ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
		ep.err_handler.cb = ep_err_cb;
		ep.err_handler.arg = r;
		free(p);
		r->nserving++;
		st = ucp_ep_create(r->worker, &ep, &c->ep);
		if (st != UCS_OK) {
			c->ep = NULL;
			c->closed = true;
			conn_fail(c, "accept: %s", ucs_status_string(st));
		}
	}
}

/* ---- deadlines ---------------------------------------------------------------- */

static void tick(struct relay *r)
{
	uint64_t t = now_ms();
	struct conn *c;
	int i;

	for (c = r->conns; c; c = c->next) {
		struct sub *s;

		if (c->state == C_HELLO || c->state == C_PROOF) {
			if (t >= c->deadline_ms)
				conn_fail(c, "did not authenticate within "
					  "--auth-timeout-ms %u",
					  r->cfg->auth_timeout_ms);
			continue;
		}
		if (c->state != C_READY)
			continue;
		for (s = c->subs; s; s = s->next)
			if (s->memh && s->offer_id &&
			    t - s->sent_ms > r->cfg->transfer_timeout_ms) {
				conn_fail(c, "held the offer of %s for more than "
					  "--transfer-timeout-ms %u", s->name,
					  r->cfg->transfer_timeout_ms);
				break;
			}
	}
	for (i = 0; i < r->cfg->npeers; i++) {
		struct upstream *u = &r->up[i];

		if (!u->c && t >= u->retry_ms && !r->stop)
			upstream_connect(r, i);
	}
}

/* ---- setup and loop ------------------------------------------------------------ */

static int ucx_init(struct relay *r)
{
	ucp_params_t p = { 0 };
	ucp_worker_params_t wp = { 0 };
	ucp_am_handler_param_t ap = { 0 };
	ucp_config_t *cfg;
	ucs_status_t st;

	/* A restarted relay must bind its port again at once, with the
	 * last one's connections still in TIME_WAIT. */
	setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
	setenv("UCX_RDMA_CM_REUSEADDR", "y", 0);
	st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK)
		goto fail;
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
	p.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
	p.name = "dlshare-relay";
	st = ucp_init(&p, cfg, &r->ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK)
		goto fail;
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(r->ctx, &wp, &r->worker);
	if (st != UCS_OK)
		goto fail;
	st = ucp_worker_get_efd(r->worker, &r->ucx_fd);
	if (st != UCS_OK)
		goto fail;
	ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
			UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
			UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG;
	ap.id = RELAY_AM_ID;
	ap.flags = UCP_AM_FLAG_WHOLE_MSG;
	ap.cb = am_cb;
	ap.arg = r;
	st = ucp_worker_set_am_recv_handler(r->worker, &ap);
	if (st != UCS_OK)
		goto fail;
	return 0;
fail:
	log_err("UCX: %s", ucs_status_string(st));
	return -1;
}

static int listen_start(struct relay *r)
{
	ucp_listener_params_t lp = { 0 };
	ucp_listener_attr_t la = { 0 };
	struct sockaddr_storage sa;
	socklen_t salen;
	ucs_status_t st;

	if (resolve(r->cfg->listen, true, &sa, &salen))
		return -1;
	lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
			UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
	lp.sockaddr.addr = (struct sockaddr *)&sa;
	lp.sockaddr.addrlen = salen;
	lp.conn_handler.cb = conn_req_cb;
	lp.conn_handler.arg = r;
	st = ucp_listener_create(r->worker, &lp, &r->listener);
	if (st != UCS_OK) {
		log_err("listen %s: %s", r->cfg->listen, ucs_status_string(st));
		return -1;
	}
	la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
	if (ucp_listener_query(r->listener, &la) == UCS_OK) {
		char host[64] = "?";
		uint16_t port = 0;

		if (la.sockaddr.ss_family == AF_INET) {
			inet_ntop(AF_INET, &((struct sockaddr_in *)&la.sockaddr)->sin_addr,
				  host, sizeof(host));
			port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
		} else if (la.sockaddr.ss_family == AF_INET6) {
			inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&la.sockaddr)->sin6_addr,
				  host, sizeof(host));
			port = ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
		}
		log_info("listening on %s port %u (node %s)", host, port, r->node);
	}
	return 0;
}

static int ep_add(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void drain_fd(int fd)
{
	uint8_t buf[256];

	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

int relay_run(const struct relay_config *cfg)
{
	struct relay *r = calloc(1, sizeof(*r));
	struct itimerspec its = { { 0, TICK_MS * 1000000L }, { 0, TICK_MS * 1000000L } };
	sigset_t mask;
	int ret = 1, i, err;
	struct conn *c;
	struct known *k, *kt;

	if (!r)
		return 1;
	/* Blocked before any thread starts (UCX's, libdlshare's, ours), so
	 * that only the signalfd sees them. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	sigdelset(&mask, SIGPIPE);
	r->cfg = cfg;
	r->epfd = r->evfd = r->sigfd = r->tfd = r->ucx_fd = -1;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->jobcv, NULL);
	if (auth_key_load(&r->key, cfg->key_file, stderr))
		goto out;
	if (cfg->node_name) {
		snprintf(r->node, sizeof(r->node), "%s", cfg->node_name);
	} else if (gethostname(r->node, sizeof(r->node) - 1)) {
		snprintf(r->node, sizeof(r->node), "unknown");
	}
	if (cfg->socket_path)
		snprintf(r->sock, sizeof(r->sock), "%s", cfg->socket_path);
	else
		dlshare_socket_path(r->sock, sizeof(r->sock));
	err = dlshare_connect(r->sock, &r->dl);
	if (err) {
		log_err("%s", dlshare_last_error()[0] ? dlshare_last_error() :
			dlshare_strerror(err));
		goto out;
	}
	for (i = 0; i < cfg->npeers; i++) {
		if (resolve(cfg->peers[i].addr, false, &r->up[i].sa, &r->up[i].salen))
			goto out;
		r->up[i].backoff_ms = BACKOFF_MIN_MS;
	}
	if (pthread_create(&r->worker_th, NULL, worker_thread, r)) {
		log_err("cannot start a thread");
		goto out;
	}
	r->worker_started = true;
	if (ucx_init(r))
		goto out;
	if (cfg->listen && listen_start(r))
		goto out;

	r->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	r->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->sigfd < 0 || r->evfd < 0 || r->tfd < 0 || r->epfd < 0 ||
	    timerfd_settime(r->tfd, 0, &its, NULL) ||
	    ep_add(r->epfd, r->sigfd) || ep_add(r->epfd, r->evfd) ||
	    ep_add(r->epfd, r->tfd) || ep_add(r->epfd, r->ucx_fd)) {
		log_err("event loop setup: %s", strerror(errno));
		goto out;
	}
	log_info("started: socket %s, %d peer(s) to mirror%s", r->sock,
		 cfg->npeers, cfg->listen ? ", serving" : "");
	tick(r);

	for (;;) {
		struct epoll_event ev[8];
		int n;

		while (ucp_worker_progress(r->worker))
			;
		accept_pending(r);
		msgs_run(r);
		ready_drain(r);
		done_drain(r);
		pulls_run(r);
		conns_reap(r);
		zombies_reap(r);
		if (r->stop && !r->conns && !r->zombies)
			break;
		if (r->in_head || r->reqs)
			continue;
		if (ucp_worker_arm(r->worker) == UCS_ERR_BUSY)
			continue;
		n = epoll_wait(r->epfd, ev, 8, -1);
		if (n < 0 && errno != EINTR) {
			log_err("epoll_wait: %s", strerror(errno));
			break;
		}
		for (i = 0; i < n; i++) {
			int fd = ev[i].data.fd;

			if (fd == r->sigfd) {
				drain_fd(fd);
				if (!r->stop)
					log_info("stopping");
				r->stop = true;
				for (c = r->conns; c; c = c->next)
					conn_fail(c, "the relay stops");
			} else if (fd == r->tfd) {
				drain_fd(fd);
				tick(r);
			} else if (fd == r->evfd) {
				drain_fd(fd);
			}
		}
	}
	ret = 0;
out:
	while (r->reqs) {
		struct pending_req *p = r->reqs;
		r->reqs = p->next;
		ucp_listener_reject(r->listener, p->req);
		free(p);
	}
	while (r->in_head) {
		struct inmsg *m = r->in_head;
		r->in_head = m->next;
		free(m);
	}
	HASH_ITER(hh, r->known, k, kt) {
		HASH_DEL(r->known, k);
		free(k);
	}
	if (r->worker_started) {
		pthread_mutex_lock(&r->mu);
		r->worker_stop = true;
		pthread_cond_signal(&r->jobcv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->worker_th, NULL);
	}
	pthread_cond_destroy(&r->jobcv);
	if (r->listener)
		ucp_listener_destroy(r->listener);
	if (r->worker)
		ucp_worker_destroy(r->worker);
	if (r->ctx)
		ucp_cleanup(r->ctx);
	dlshare_disconnect(r->dl);
	if (r->epfd >= 0) close(r->epfd);
	if (r->evfd >= 0) close(r->evfd);
	if (r->sigfd >= 0) close(r->sigfd);
	if (r->tfd >= 0) close(r->tfd);
	pthread_mutex_destroy(&r->mu);
	memset(&r->key, 0, sizeof(r->key));
	free(r);
	return ret;
}
