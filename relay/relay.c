/* relay — the loop, connections, messages in and out, connecting and
 * accepting, deadlines. */
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

void nv_set(struct name_version **t, const char *name, uint64_t v)
{
	struct name_version *e;
	size_t n = strlen(name);

	HASH_FIND_STR(*t, name, e);
	if (!e) {
		e = calloc(1, sizeof(*e) + n + 1);
		if (!e)
			return;
		memcpy(e->name, name, n + 1);
		HASH_ADD_STR(*t, name, e);
	}
	e->version = v;
}

uint64_t nv_get(struct name_version *t, const char *name)
{
	struct name_version *e;

	HASH_FIND_STR(t, name, e);
	return e ? e->version : 0;
}

void nv_clear(struct name_version **t)
{
	struct name_version *e, *tmp;

	HASH_ITER(hh, *t, e, tmp) {
		HASH_DEL(*t, e);
		free(e);
	}
}

/* ---- logging (sd-daemon prefixes) ------------------------------------- */

void relay_log(int prio, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "<%d>dlshare-relay: %s\n", prio, line);
}

uint64_t relay_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- sending ------------------------------------------------------------ */

static void send_cb(void *req, ucs_status_t st, void *user)
{
	(void)st;
	free(user);
	ucp_request_free(req);
}

/* Sends the finished message w (consumed). Returns 0 or -1. */
int conn_send(struct conn *c, struct wbuf *w)
{
	ucp_request_param_t p = { 0 };
	ucs_status_ptr_t sp;

	if (wbuf_finish(w)) {
		conn_fail(c, "out of memory building a message");
		return -1;
	}
	if (c->state == C_DEAD || c->closed || c->lost != UCS_OK) {
		/* a lost one is failed by conns_lost, with its reason */
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

void conn_error(struct conn *c, uint32_t code, const char *text)
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

struct conn *conn_by_id(struct relay *r, uint64_t id)
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

/* The peer's end: noted, and the connection failed by conns_lost after
 * the messages it sent before were handled (a mirror with a wrong key
 * sends its proof and closes at once: the proof is still refused, and
 * logged, as such). */
static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
	struct relay *r = arg;
	struct conn *c;

	for (c = r->conns; c; c = c->next)
		if (c->ep == ep && c->state != C_DEAD && c->lost == UCS_OK)
			c->lost = st;
}

static void conns_lost(struct relay *r)
{
	struct conn *c;

	for (c = r->conns; c; c = c->next)
		if (c->lost != UCS_OK && c->state != C_DEAD)
			conn_fail(c, "connection lost: %s",
				  ucs_status_string(c->lost));
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
	c->deadline_ms = relay_now_ms() + r->cfg->auth_timeout_ms;
	c->next = r->conns;
	r->conns = c;
	return c;
}


/* Marks c dead: its subscriptions are cancelled, its pulls fail, its
 * endpoint is closed; it is freed once nothing of it is outstanding. */
void conn_fail(struct conn *c, const char *fmt, ...)
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
		if (s->memh && s->offer_id && !s->abort_sent)
			r->m.serve_failed[RS_PEER_LOST]++;
		pthread_mutex_lock(&r->mu);
		s->cancel = true;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&r->mu);
		serve_release(r, s);
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
		u->retry_ms = relay_now_ms() + u->backoff_ms;
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
			mirror_close(r, p);
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
/* ---- authentication ---------------------------------------------------------- */

void conn_auth_failed(struct relay *r, struct conn *c, const char *why)
{
	uint64_t t = relay_now_ms();

	r->m.auth_failures++;
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
	conn_error(c, 2, "authentication failed");
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
			serve_msg(r, c, type, &rb);
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

/* An active message of an id the relay does not use: its peer is cut
 * off, the data dropped. */
static ucs_status_t am_stray_cb(void *arg, const void *hdr, size_t hlen,
				void *data, size_t len,
				const ucp_am_recv_param_t *prm)
{
	struct relay *r = arg;
	struct conn *c = NULL;

	(void)hdr;
	(void)hlen;
	(void)data;
	if (prm->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
		c = conn_by_ep(r, prm->reply_ep);
	if (c)
		conn_fail(c, "an active message of %zu bytes with an id the "
			  "relay does not use", len);
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
	uint64_t t = relay_now_ms();
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
				if (!s->abort_sent)
					r->m.serve_failed[RS_TIMEOUT]++;
				s->abort_sent = true;   /* counted */
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
	metrics_tick(r, false);
}

/* ---- setup and loop ------------------------------------------------------------ */

static int ucx_init(struct relay *r)
{
	ucp_params_t p = { 0 };
	ucp_worker_params_t wp = { 0 };
	ucp_am_handler_param_t ap = { 0 };
	ucp_config_t *cfg;
	ucs_status_t st;
	int id;

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
	ap.flags = UCP_AM_FLAG_WHOLE_MSG;
	ap.arg = r;
	/* Every other id a peer could send (UCP's are 16 bits) gets a
	 * handler that cuts it off: UCX 1.13 crashed in
	 * ucp_am_long_first_handler on a message for an id nobody
	 * registered (tests/relay: test_hostile_ucx). The highest first,
	 * so that the table grows once. */
	for (id = 0xffff; id >= 0; id--) {
		ap.id = (unsigned)id;
		ap.cb = id == RELAY_AM_ID ? am_cb : am_stray_cb;
		st = ucp_worker_set_am_recv_handler(r->worker, &ap);
		if (st != UCS_OK)
			goto fail;
	}
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
	if (pthread_create(&r->worker_th, NULL, mirror_worker, r)) {
		log_err("cannot start a thread");
		goto out;
	}
	r->worker_started = true;
	if (ucx_init(r) || direct_init(r))
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
		conns_lost(r);
		serve_drain(r);
		mirror_done(r);
		mirror_run(r);
		conns_reap(r);
		serve_reap(r);
		if (r->stop && !r->conns && !r->zombies) {
			metrics_tick(r, true);   /* the final values */
			break;
		}
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
	nv_clear(&r->known);
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
