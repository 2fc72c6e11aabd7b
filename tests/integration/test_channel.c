/* test_channel — the request channel (protocol 1.9, proto/chan.h), against a
 * real daemon: through a raw peer that drives the slots and the eventfd by
 * hand (where the answer goes, the order of the socket and the channel, and
 * what a hostile peer can do with memory and an eventfd it shares with the
 * daemon), and through libdlshare (threads and a publisher replacing
 * versions, so that answers in the slot name buffers whose fds, and pushes
 * that free them, travel on the socket). Each hostile case ends with another
 * client served. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cmocka.h>

#include "chan.h"
#include "content.h"
#include "skip.h"
#include "util.h"
#include "wire.h"

static const int64_t shape[] = { 32, 32 }; /* 4 KiB of F32 */

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int setup_off(void **state)
{
	static const char *const args[] = { "--channel", "0", NULL };

	return util_setup_fdcheck(state, args);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

/* ---- a raw peer's channel ------------------------------------------------ */

struct rawch {
	int sock;
	void *base;               /* the mapped memfd */
	int efd;
	uint32_t seq;             /* requests sent through the slot */
	uint64_t sent;            /* packets sent on the socket */
	uint64_t next_id;
};

/* A raw peer that said Hello. */
static int raw_peer(const struct daemon_proc *d)
{
	int sock = raw_connect(d->sock);

	assert_true(sock >= 0);
	assert_int_equal(raw_hello(sock), 0);
	return sock;
}

/* *f: a Channel request with id. */
static void channel_frame(Dlshare__Frame *f, Dlshare__Channel *ch,
			  uint64_t id)
{
	dlshare__frame__init(f);
	dlshare__channel__init(ch);
	f->id = id;
	f->body_case = DLSHARE__FRAME__BODY_CHANNEL;
	f->channel = ch;
}

/* Sends f on the socket, counting it. */
static void rc_send(struct rawch *r, Dlshare__Frame *f)
{
	assert_int_equal(raw_send(r->sock, f, NULL, 0, 0), 0);
	r->sent++;
}

/* Receives one packet with every fd it carries (the caller closes them).
 * Returns as raw_recv. */
static int rc_recv(struct rawch *r, int timeout_ms, struct wire_msg **m,
		   int *fds, unsigned *nfds)
{
	struct pollfd p = { .fd = r->sock, .events = POLLIN };
	static uint8_t buf[256 * 1024];
	size_t len = 0;
	int err;

	*m = NULL;
	*nfds = 0;
	if (poll(&p, 1, timeout_ms) <= 0)
		return -ETIMEDOUT;
	err = wire_recv(r->sock, buf, sizeof(buf), fds, WIRE_FDS_MAX, &len,
			nfds, MSG_DONTWAIT);
	if (err)
		return err;
	if (len == 0)
		return 1;
	return wire_decode(buf, len, m) ? -EPROTO : 0;
}

/* A raw peer: Hello, then Channel; the channel mapped. */
static void rc_open(struct rawch *r, const struct daemon_proc *d)
{
	Dlshare__Frame f;
	Dlshare__Channel ch;
	struct wire_msg *m;
	int fds[WIRE_FDS_MAX];
	unsigned nfds;
	struct stat st;

	memset(r, 0, sizeof(*r));
	r->sock = raw_peer(d);
	r->sent = 1;
	r->next_id = 2;
	channel_frame(&f, &ch, r->next_id++);
	rc_send(r, &f);
	assert_int_equal(rc_recv(r, harness_ms(5000), &m, fds, &nfds), 0);
	assert_int_equal(m->frame->body_case,
			 DLSHARE__FRAME__BODY_CHANNEL_REPLY);
	assert_int_equal(m->frame->channel_reply->bytes, CHAN_BYTES);
	assert_int_equal(nfds, 2);
	wire_msg_free(m);
	/* The memfd: its size sealed, so that no peer can make the daemon's
	 * mapping fault. */
	assert_int_equal(fstat(fds[0], &st), 0);
	assert_int_equal(st.st_size, CHAN_BYTES);
	assert_int_equal(fcntl(fds[0], F_GET_SEALS) &
			 (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
			 F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(ftruncate(fds[0], 4096), -1);
	assert_int_equal(errno, EPERM);
	r->base = mmap(NULL, CHAN_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED,
		       fds[0], 0);
	assert_true(r->base != MAP_FAILED);
	close(fds[0]);
	r->efd = fds[1];
}

static void rc_close(struct rawch *r)
{
	munmap(r->base, CHAN_BYTES);
	close(r->efd);
	close(r->sock);
}

/* Puts len bytes in the request slot, saying sent packets went before on
 * the socket, and wakes the daemon. */
static void rc_put(struct rawch *r, const void *data, uint32_t len,
		   uint64_t sent)
{
	struct chan_req *rq = chan_req_of(r->base);
	uint64_t one = 1;

	memcpy(chan_req_body(r->base), data, len);
	rq->len = len;
	rq->sock_sent = sent;
	atomic_store(&rq->seq, ++r->seq);
	assert_int_equal(write(r->efd, &one, sizeof(one)), sizeof(one));
}

/* Sends f through the channel. */
static void rc_ask(struct rawch *r, Dlshare__Frame *f)
{
	uint8_t buf[CHAN_REQ_MAX];
	size_t len = dlshare__frame__get_packed_size(f);

	assert_true(len <= sizeof(buf));
	dlshare__frame__pack(f, buf);
	rc_put(r, buf, (uint32_t)len, r->sent);
}

/* Waits up to ms for the answer to the last request of the slot. Returns
 * its chan_how, or 0 when none came. */
static uint32_t rc_answer(struct rawch *r, int ms)
{
	struct chan_rep *rp = chan_rep_of(r->base);
	int64_t until = util_now_ms() + ms;
	uint32_t v;

	while ((v = atomic_load(&rp->seq)) != r->seq) {
		if (util_now_ms() >= until)
			return 0;
		chan_wait(&rp->seq, v, 10);
	}
	return rp->how;
}

/* The answer in the slot, decoded. */
static struct wire_msg *rc_decode(struct rawch *r)
{
	struct chan_rep *rp = chan_rep_of(r->base);
	struct wire_msg *m = NULL;

	assert_true(rp->len > 0 && rp->len <= CHAN_REP_MAX);
	assert_int_equal(wire_decode(chan_rep_body(r->base), rp->len, &m), 0);
	return m;
}

static void get_frame(Dlshare__Frame *f, Dlshare__Get *g, uint64_t id,
		      const char *name)
{
	dlshare__frame__init(f);
	dlshare__get__init(g);
	g->name = (char *)name;
	f->id = id;
	f->body_case = DLSHARE__FRAME__BODY_GET;
	f->get = g;
}

/* Another client is served: a library client that has its own channel
 * gets name and finds seed in it. */
static void others_served(const struct daemon_proc *d, const char *name,
			  uint32_t seed)
{
	dlshare_client *c = harness_connect(d);

	util_channel_open(c);
	for (int i = 0; i < 8; i++)
		assert_int_equal(util_get_check(c, name, NULL, DT_F32, 2, shape,
						seed, NULL), 0);
	dlshare_disconnect(c);
}

/* ---- where answers go, and in what order ----------------------------------------- */

/* A get through the channel: the first attaches its buffer's fd and goes
 * over the socket (the slot says so); the next is answered in the slot,
 * saying how many packets the daemon sent on the socket before it. A
 * request that says more packets went before it on the socket than the
 * daemon read waits for them. */
static void answers_and_order(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	Dlshare__Frame f, rel = DLSHARE__FRAME__INIT;
	Dlshare__Release rr = DLSHARE__RELEASE__INIT;
	Dlshare__Get g;
	struct rawch r;
	struct wire_msg *m;
	int fds[WIRE_FDS_MAX];
	unsigned nfds;
	uint64_t version, lease;

	assert_int_equal(util_store(p, "ch/a", DT_F32, 2, shape, 7, &version),
			 0);
	rc_open(&r, &fx->d);

	get_frame(&f, &g, r.next_id++, "ch/a");
	rc_ask(&r, &f);
	assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_SOCKET);
	assert_int_equal(rc_recv(&r, harness_ms(5000), &m, fds, &nfds), 0);
	assert_int_equal(m->frame->id, f.id);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	assert_int_equal(nfds, 1);
	close(fds[0]);
	wire_msg_free(m);

	get_frame(&f, &g, r.next_id++, "ch/a");
	rc_ask(&r, &f);
	assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_HERE);
	/* HelloReply, ChannelReply, the first GetReply. */
	assert_int_equal(chan_rep_of(r.base)->sock_sent, 3);
	m = rc_decode(&r);
	assert_int_equal(m->frame->id, f.id);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	assert_int_equal(m->frame->get_reply->version, version);
	assert_false(m->frame->get_reply->buffers[0]->fd_attached);
	lease = m->frame->get_reply->lease;
	wire_msg_free(m);

	/* Says one more packet went first on the socket: it waits. */
	get_frame(&f, &g, r.next_id++, "ch/a");
	{
		uint8_t buf[256];
		size_t len = dlshare__frame__pack(&f, buf);

		rc_put(&r, buf, (uint32_t)len, r.sent + 1);
	}
	assert_int_equal(rc_answer(&r, 200), 0);
	/* That packet: a Release (no answer). Now the get is answered. */
	rel.body_case = DLSHARE__FRAME__BODY_RELEASE;
	rel.release = &rr;
	rr.leases = &lease;
	rr.n_leases = 1;
	rc_send(&r, &rel);
	assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_HERE);
	m = rc_decode(&r);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	wire_msg_free(m);
	/* The first get's lease and the last one's: the release was read
	 * first. */
	{
		struct util_want w = UTIL_ANY;

		w.leases = 2;
		util_assert_want(p, &w);
	}
	/* Asked twice: refused, the connection goes on. */
	{
		Dlshare__Frame cf;
		Dlshare__Channel ch;

		channel_frame(&cf, &ch, r.next_id++);
		rc_send(&r, &cf);
		assert_int_equal(rc_recv(&r, harness_ms(5000), &m, fds, &nfds),
				 0);
		assert_int_equal(nfds, 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_ERROR);
		assert_int_equal(m->frame->error->code, DLSHARE_ESTATE);
		wire_msg_free(m);
	}
	get_frame(&f, &g, r.next_id++, "ch/a");
	rc_ask(&r, &f);
	assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_HERE);
	rc_close(&r);
	others_served(&fx->d, "ch/a", 7);
	dlshare_disconnect(p);
}

/* ---- hostile peers ---------------------------------------------------------------- */

/* A peer that says its request is larger than the slot, or puts garbage
 * in it, or claims fds there, or sends a request that wants no answer, is
 * cut off with EPROTO; nobody else notices. */
static void bad_requests(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	uint8_t junk[512];
	struct rawch r;
	int code;

	assert_int_equal(util_store(p, "ch/b", DT_F32, 2, shape, 8, NULL), 0);
	memset(junk, 0xff, sizeof(junk));
	for (int k = 0; k < 5; k++) {
		rc_open(&r, &fx->d);
		if (k == 0) {
			/* Larger than the slot. */
			struct chan_req *rq = chan_req_of(r.base);
			uint64_t one = 1;

			rq->len = CHAN_BYTES;
			atomic_store(&rq->seq, ++r.seq);
			assert_int_equal(write(r.efd, &one, sizeof(one)), 8);
		} else if (k == 1) {
			rc_put(&r, junk, sizeof(junk), r.sent);
		} else if (k == 2) {
			/* Empty. */
			rc_put(&r, junk, 0, r.sent);
		} else if (k == 3) {
			Dlshare__Frame f;
			Dlshare__Get g;

			get_frame(&f, &g, r.next_id++, "ch/b");
			f.has_nfds = 1;
			f.nfds = 1;
			rc_ask(&r, &f);
		} else {
			/* A Release wants no answer (id 0): not here. */
			Dlshare__Frame f = DLSHARE__FRAME__INIT;
			Dlshare__Release rr = DLSHARE__RELEASE__INIT;
			uint64_t lease = 12345;

			f.body_case = DLSHARE__FRAME__BODY_RELEASE;
			f.release = &rr;
			rr.leases = &lease;
			rr.n_leases = 1;
			rc_ask(&r, &f);
		}
		code = 0;
		assert_int_equal(raw_expect_hangup(r.sock, harness_ms(5000),
						   &code), 0);
		assert_int_equal(code, DLSHARE_EPROTO);
		/* The slot says so too: the client need not wait. */
		assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_CLOSED);
		rc_close(&r);
	}
	others_served(&fx->d, "ch/b", 8);
	dlshare_disconnect(p);
}

/* The daemon answers a Stats on a socket of its own within a generous
 * bound: its loop is not blocked. */
static void loop_alive(const struct daemon_proc *d)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Stats st = DLSHARE__STATS__INIT;
	struct wire_msg *m = NULL;
	int sock = raw_peer(d);

	f.id = 2;
	f.body_case = DLSHARE__FRAME__BODY_STATS;
	f.stats = &st;
	assert_int_equal(raw_send(sock, &f, NULL, 0, 0), 0);
	assert_int_equal(raw_recv(sock, harness_ms(5000), &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_STATS_REPLY);
	wire_msg_free(m);
	close(sock);
}

/* The eventfd is one open file for the peer and the daemon: a peer that
 * clears its O_NONBLOCK, wakes the daemon and reads the count back before
 * the daemon does (its own reads by RWF_NOWAIT, which the file's flags do
 * not govern), then goes quiet, would leave a plain read of the daemon's
 * blocked for good; so would a count filled to its top for a write. The
 * daemon's loop serves others after each such burst. (Whether the daemon
 * loses that race here is up to the scheduler: the read that must not
 * block is checked on its own in test_chan.) */
static void shared_eventfd(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	struct rawch r;
	uint64_t top = UINT64_C(0xfffffffffffffffe), one = 1, v;
	struct iovec io = { &v, sizeof(v) };
	unsigned drained = 0;

	assert_int_equal(util_store(p, "ch/c", DT_F32, 2, shape, 9, NULL), 0);
	rc_open(&r, &fx->d);
	assert_int_equal(fcntl(r.efd, F_SETFL,
			       fcntl(r.efd, F_GETFL) & ~O_NONBLOCK), 0);
	for (int burst = 0; burst < 20; burst++) {
		for (int i = 0; i < 100; i++) {
			assert_int_equal(write(r.efd, &one, sizeof(one)),
					 sizeof(one));
			if (preadv2(r.efd, &io, 1, -1, RWF_NOWAIT) ==
			    sizeof(v))
				drained++;
		}
		loop_alive(&fx->d);
	}
	print_message("the peer drained the count first %u times of 2000\n",
		      drained);
	assert_true(drained > 0);
	others_served(&fx->d, "ch/c", 9);
	/* The count at its top: the daemon reads it to zero. */
	assert_int_equal(write(r.efd, &top, sizeof(top)), sizeof(top));
	loop_alive(&fx->d);
	/* And the peer's own channel still works. */
	{
		Dlshare__Frame f;
		Dlshare__Get g;
		struct wire_msg *m;
		int fds[WIRE_FDS_MAX];
		unsigned nfds;

		get_frame(&f, &g, r.next_id++, "ch/c");
		rc_ask(&r, &f);
		assert_int_equal(rc_answer(&r, harness_ms(5000)), CHAN_SOCKET);
		assert_int_equal(rc_recv(&r, harness_ms(5000), &m, fds, &nfds),
				 0);
		assert_int_equal(m->frame->body_case,
				 DLSHARE__FRAME__BODY_GET_REPLY);
		for (unsigned i = 0; i < nfds; i++)
			close(fds[i]);
		wire_msg_free(m);
	}
	rc_close(&r);
	dlshare_disconnect(p);
}

/* ---- --channel 0 ------------------------------------------------------------------ */

static void channel_off(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c = harness_connect(&fx->d);
	Dlshare__Frame f;
	Dlshare__Channel ch;
	struct wire_msg *m;
	int sock, base;

	assert_int_equal(util_store(c, "ch/off", DT_F32, 2, shape, 3, NULL),
			 0);
	sock = raw_peer(&fx->d);
	channel_frame(&f, &ch, 2);
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_int_equal(m->frame->error->code, DLSHARE_ENOTSUP);
	wire_msg_free(m);
	close(sock);
	/* The library goes on over the socket: no fd of a channel (after
	 * the first get, which makes the buffer's read-only reopen). */
	assert_int_equal(util_get_check(c, "ch/off", NULL, DT_F32, 2, shape, 3,
					NULL), 0);
	assert_int_equal(harness_wait_stats(c, -1, 1, NULL), 0);
	base = harness_fd_count(fx->d.pid);
	for (int i = 0; i < 100; i++)
		assert_int_equal(util_get_check(c, "ch/off", NULL, DT_F32, 2,
						shape, 3, NULL), 0);
	assert_int_equal(harness_fd_count(fx->d.pid), base);
	dlshare_disconnect(c);
}

/* ---- the daemon out of fds -------------------------------------------------------- */

/* A channel costs the daemon an fd (and the memfd it sends): asked for
 * while the daemon has none free, it is refused with ELIMIT, the
 * connection goes on over the socket, and the same request works once
 * fds are free. */
static void channel_out_of_fds(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	Dlshare__Frame f, gf;
	Dlshare__Channel ch;
	Dlshare__Get g;
	const char *w = getenv("DLSHARE_TEST_WRAPPER");
	struct rlimit old, low = { 3, 3 };
	struct wire_msg *m;
	struct rawch r;
	int sock;

	if (w && *w) {
		dlshare_disconnect(p);
		test_skip("the daemon runs under %s, whose fds and limits "
			  "are not the daemon's", w);
	}
	assert_int_equal(util_store(p, "ch/fds", DT_F32, 2, shape, 4, NULL),
			 0);
	sock = raw_peer(&fx->d);
	channel_frame(&f, &ch, 2);
	/* No new fd at all below 3: stdin, stdout and stderr are taken. */
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, NULL, &old), 0);
	low.rlim_max = old.rlim_max;
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &low, NULL), 0);
	assert_int_equal(raw_call(sock, &f, NULL, 0, &m), 0);
	assert_int_equal(prlimit(fx->d.pid, RLIMIT_NOFILE, &old, NULL), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_ERROR);
	assert_int_equal(m->frame->error->code, DLSHARE_ELIMIT);
	assert_non_null(strstr(m->frame->error->message, "request channel"));
	wire_msg_free(m);
	/* The connection goes on over the socket. */
	get_frame(&gf, &g, 3, "ch/fds");
	assert_int_equal(raw_call(sock, &gf, NULL, 0, &m), 0);
	assert_int_equal(m->frame->body_case, DLSHARE__FRAME__BODY_GET_REPLY);
	wire_msg_free(m);
	close(sock);
	/* With fds again, a channel is made. */
	rc_open(&r, &fx->d);
	rc_close(&r);
	others_served(&fx->d, "ch/fds", 4);
	dlshare_disconnect(p);
}

/* ---- through libdlshare ------------------------------------------------------------- */

#define NNAMES 4

struct reader_arg {
	dlshare_client *c;
	const atomic_int *stop;
	uint64_t gets;
	int failed;
};

/* Gets the names in turn and checks each against the seed its version
 * says (the publisher stores version v of name i with seed 1000 * i + v). */
static void *reader(void *arg)
{
	struct reader_arg *a = arg;
	char name[32];

	while (!atomic_load(a->stop) && !a->failed) {
		for (int i = 0; i < NNAMES; i++) {
			dlshare_bundle *b;
			uint64_t v;
			int err;

			snprintf(name, sizeof(name), "ch/t%d", i);
			err = dlshare_get(a->c, name, NULL, &b);
			if (err) {
				fprintf(stderr, "get %s: %d %s\n", name, err,
					dlshare_last_error());
				a->failed = 1;
				break;
			}
			v = dlshare_bundle_version(b);
			if (util_check(dlshare_bundle_tensor(b, 0), DT_F32, 2,
				       shape, (uint32_t)(1000 * i) +
				       (uint32_t)v))
				a->failed = 1;
			dlshare_bundle_free(b);
			a->gets++;
		}
	}
	return NULL;
}

/* Readers on one client from several threads (a call that reads its own
 * reply goes through the channel, others over the socket), one on a client
 * of its own, while a publisher replaces every name's version: answers in
 * the slot name buffers whose fds come on the socket, and the pushes that
 * free the old ones come there too. Every read is checked. */
static void threads_and_publisher(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *p = harness_connect(&fx->d);
	dlshare_client *c = harness_connect(&fx->d);
	dlshare_client *solo = harness_connect(&fx->d);
	struct reader_arg a[4];
	pthread_t t[4];
	atomic_int stop = 0;
	char name[32];
	uint64_t v, gets = 0;
	const char *w = getenv("DLSHARE_TEST_WRAPPER");
	int rounds = w && *w ? 40 : 200;

	for (int i = 0; i < NNAMES; i++) {
		snprintf(name, sizeof(name), "ch/t%d", i);
		assert_int_equal(dlshare_delete(p, name), DLSHARE_ENOENT);
	}
	/* Versions count from 1: version v of name i holds 1000 i + v. */
	for (int i = 0; i < NNAMES; i++) {
		snprintf(name, sizeof(name), "ch/t%d", i);
		assert_int_equal(util_store(p, name, DT_F32, 2, shape,
					    (uint32_t)(1000 * i) + 1, &v), 0);
		assert_int_equal(v, 1);
	}
	util_channel_open(c);
	util_channel_open(solo);
	for (int k = 0; k < 4; k++) {
		a[k] = (struct reader_arg){ k == 3 ? solo : c, &stop, 0, 0 };
		assert_int_equal(pthread_create(&t[k], NULL, reader, &a[k]),
				 0);
	}
	for (int r = 2; r < rounds; r++) {
		for (int i = 0; i < NNAMES; i++) {
			snprintf(name, sizeof(name), "ch/t%d", i);
			assert_int_equal(util_store(p, name, DT_F32, 2, shape,
						    (uint32_t)(1000 * i) +
						    (uint32_t)r, &v), 0);
			assert_int_equal(v, (uint64_t)r);
		}
		util_sleep_ms(1);
	}
	atomic_store(&stop, 1);
	for (int k = 0; k < 4; k++) {
		pthread_join(t[k], NULL);
		assert_false(a[k].failed);
		gets += a[k].gets;
	}
	print_message("%llu gets checked over %d versions\n",
		      (unsigned long long)gets, rounds - 1);
	assert_true(a[3].gets > 0);
	dlshare_disconnect(solo);
	dlshare_disconnect(c);
	dlshare_disconnect(p);
}

/* ---- a state dict, version after version ----------------------------------------- */

#define SD_SEED 0x5d17ull
#define SD_BYTES 128 /* float32[32] */

static size_t sd_n(void)
{
	return getenv("DLSHARE_TEST_WRAPPER") ? 2000 : 10000;
}

static int sd_versions(void)
{
	return getenv("DLSHARE_TEST_WRAPPER") ? 4 : 12;
}

/* Key i: ~60 bytes, as a large model's are. */
static void sd_key(char *k, size_t len, size_t i)
{
	snprintf(k, len, "model.layers.%04zu.mlp.experts.%03zu.%s", i / 256,
		 i % 256, i % 2 ? "gate_proj.weight_scale_inv" :
		 "down_proj.weight_scale_inv");
}

/* The trainer: publishes version after version of "ch/sd", each tensor
 * saying (content.h) which version and which tensor it is. */
static int sd_trainer(const struct daemon_proc *d, void *arg)
{
	size_t n = sd_n();
	dlshare_client *c = util_child_connect(d);
	dlshare_tensor_spec *specs = calloc(n, sizeof(*specs));
	char (*keys)[96] = calloc(n, sizeof(*keys));
	const int64_t sd_shape[] = { SD_BYTES / 4 };

	(void)arg;
	CHILD_CHECK(specs && keys);
	for (size_t i = 0; i < n; i++) {
		sd_key(keys[i], sizeof(keys[i]), i);
		specs[i] = (dlshare_tensor_spec){ .key = keys[i],
			.dtype = DT_F32, .ndim = 1, .shape = sd_shape };
	}
	for (int v = 1; v <= sd_versions(); v++) {
		dlshare_writer *w;
		uint64_t got;

		CHILD_OK(dlshare_create(c, "ch/sd", specs, n, NULL, &w));
		for (size_t i = 0; i < n; i++) {
			struct content_hdr h = {
				.name = 0, .who = 0, .seq = (uint32_t)v,
				.token = content_token(SD_SEED, 0, (uint32_t)v),
				.version = (uint64_t)v,
				.ntensors = (uint32_t)n, .index = (uint32_t)i,
				.nbytes = SD_BYTES };

			content_fill(dlshare_writer_tensor(w, i)->data, &h, 0,
				     SD_BYTES);
		}
		CHILD_OK(dlshare_seal(w, NULL, &got));
		CHILD_CHECK(got == (uint64_t)v);
		util_sleep_ms(20);
	}
	free(specs);
	free(keys);
	dlshare_disconnect(c);
	return 0;
}

/* Checks every tensor of b against its key and the version b is. Returns
 * 0, or 1 after saying what differs. */
static int sd_check(dlshare_bundle *b, size_t n)
{
	uint64_t v = dlshare_bundle_version(b);
	char key[96], why[160];

	if (dlshare_bundle_count(b) != n) {
		fprintf(stderr, "version %llu: %zu tensors, want %zu\n",
			(unsigned long long)v, dlshare_bundle_count(b), n);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		struct content_hdr h;

		sd_key(key, sizeof(key), i);
		if (strcmp(dlshare_bundle_key(b, i), key) ||
		    content_check((const char *)t->data + t->byte_offset,
				  SD_BYTES, SD_SEED, &h, why, sizeof(why)) ||
		    h.version != v || h.index != i || h.ntensors != n) {
			fprintf(stderr, "version %llu, tensor %zu (%s): %s\n",
				(unsigned long long)v, i,
				dlshare_bundle_key(b, i), why);
			return 1;
		}
	}
	return 0;
}

/* Weight sync at a real size: a trainer process publishes a state dict of
 * 10^4 tensors with ~60-byte keys (a manifest memfd, protocol 1.4) a dozen
 * times; a reader that asks every time (no board) gets the newest in a
 * loop through its channel and checks every tensor of every get against
 * the version it is. A new version's buffer and manifest fds come on the
 * socket (the slot says so); the gets of a version already held are
 * answered in the slot with the kept manifest's id; the frees of old
 * versions (BufferGone) come on the socket between them. */
static void state_dict_weight_sync(void **state)
{
	struct fixture *fx = *state;
	dlshare_client *c;
	size_t n = sd_n();
	uint64_t last = 0, gets = 0, seen = 0;
	int64_t until;
	pid_t pid;

	setenv("DLSHARE_NO_REUSE", "1", 1);
	c = harness_connect(&fx->d);
	unsetenv("DLSHARE_NO_REUSE");
	util_channel_open(c);
	pid = util_spawn(&fx->d, sd_trainer, NULL);
	until = util_now_ms() + harness_ms(60000);
	while (last < (uint64_t)sd_versions()) {
		dlshare_bundle *b;
		int err = dlshare_get(c, "ch/sd", NULL, &b);

		assert_true(util_now_ms() < until);
		if (err == DLSHARE_ENOENT) {
			util_sleep_ms(1);
			continue;
		}
		assert_int_equal(err, 0);
		assert_int_equal(sd_check(b, n), 0);
		assert_true(dlshare_bundle_version(b) >= last);
		if (dlshare_bundle_version(b) != last)
			seen++;
		last = dlshare_bundle_version(b);
		dlshare_bundle_free(b);
		gets++;
	}
	assert_int_equal(util_wait(pid), 0);
	print_message("%llu gets of %zu tensors checked, %llu versions "
		      "seen of %d\n", (unsigned long long)gets, n,
		      (unsigned long long)seen, sd_versions());
	assert_true(gets > seen);
	dlshare_disconnect(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(answers_and_order, setup,
						teardown),
		cmocka_unit_test_setup_teardown(bad_requests, setup, teardown),
		cmocka_unit_test_setup_teardown(shared_eventfd, setup,
						teardown),
		cmocka_unit_test_setup_teardown(channel_off, setup_off,
						teardown),
		cmocka_unit_test_setup_teardown(channel_out_of_fds, setup,
						teardown),
		cmocka_unit_test_setup_teardown(threads_and_publisher, setup,
						teardown),
		cmocka_unit_test_setup_teardown(state_dict_weight_sync, setup,
						teardown),
	};

	return test_exit(cmocka_run_group_tests_name("channel", tests, NULL,
						     NULL),
			 sizeof(tests) / sizeof(tests[0]));
}
