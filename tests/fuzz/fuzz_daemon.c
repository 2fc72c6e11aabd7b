/* fuzz_daemon — the daemon's request handling, for real: conn, dispatch,
 * registry and host on a libuv loop, driven by peers over SOCK_SEQPACKET
 * socketpairs.
 *
 * Each input is a short session against a fresh struct server (server_init
 * with small limits, nothing listens) on one loop kept across inputs. Two
 * peers are connected with peer_new(); the input says what they send:
 *
 *   byte 0      flags: bit 0, bit 1: no automatic Hello from peer 0, 1;
 *               bits 2-3: peer 1's identity: 0 the same uid and gid as
 *               peer 0, 1 another uid in the same group, 2 another uid and
 *               gid, 3 no peer 1 at all; bit 4: peer 1 never reads
 *               its replies (until the end), so the daemon's output queue
 *               and its limit come into play; bit 5: peer 0 maps the
 *               buffers a CreateReply gives it writable and keeps them
 *               mapped until it hangs up (Seal then meets EBUSY)
 *   then records, until the input ends:
 *     hdr       bit 0: the peer; bit 7 set: an operation, else a packet.
 *               Packet: bits 1-3: fds to attach (0-7), bits 4-5: their
 *               kind (see make_fd), bit 6: run the loop afterwards;
 *               then 2 bytes of length (little endian) and the packet.
 *               Operation (bits 1-2): 0 the peer hangs up; 1 wait 1.1 ms
 *               (once per input), run the loop and the Hello sweep (its
 *               timeout is 1 ms here): park timers fire, silent peers go;
 *               2 run the loop; 3 the peer shuts down its writing side.
 *
 * Unless the flags say otherwise each peer first sends a valid Hello, so
 * that most inputs get past the handshake. Every reply is read (fds
 * closed) and checked: it decodes, fits max_packet, carries as many fds as
 * it says, and a GetReply's tensors pass check_tensor. At the end both
 * peers hang up and the loop runs until the daemon closed them. Then:
 *  - no conn, park, lease, pending or exported version is left: the peers
 *    went away, so everything they held must be gone; what remains is
 *    sealed store versions (they outlive their producer by design), each
 *    its name's only version; the registry's counters match them, and
 *    each uid is charged for exactly its names and store bytes;
 *  - after server_shutdown and server_deinit every counter is 0, the loop
 *    holds no handle, and the process has exactly the fds it had before.
 * A violation aborts: a leak of leases, versions, buffers, fds or handles.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "conn.h"
#include "fuzz.h"
#include "log.h"
#include "peer.h"
#include "server.h"
#include "wire.h"

#define NPEERS 2
#define FZ_MAX_PACKET 4096u
#define FZ_MEMFD_SIZE (64u * 1024u)
/* The daemon's end of each socketpair: a small send buffer, so that its
 * output queue fills (a packet must still fit: 4 KiB < 16 KiB). */
#define FZ_SNDBUF (16 * 1024)
#define FZ_SEND_TRIES 64
#define FZ_PUMP_ROUNDS 256
/* How long the thread pool's jobs (a seal, a GPU create) may take to end
 * after their peers hung up. Not a count of rounds: on a loaded machine a
 * pool thread may wait that long for a CPU (a 4096-round bound, ~0.4 s,
 * broke the invariant under a load of 12). Under libFuzzer's 10 s
 * timeout, so a job that never ends is still reported. */
#define FZ_DRAIN_MS 5000
#define FZ_SLEEPS_MAX 1 /* each costs 1.1 ms, enough for a 1 ms park */

#define FZ_MAPS_MAX 8

struct fz_peer {
	int fd;               /* our end; -1 once we hung up */
	int eof;              /* the daemon closed its end */
	int deaf;             /* never reads what the daemon sends */
	int keep_maps;        /* maps CreateReply buffers writable */
	unsigned nmaps;
	void *map[FZ_MAPS_MAX];
	size_t map_len[FZ_MAPS_MAX];
};

struct session {
	struct server s;
	struct fz_peer p[NPEERS];
	unsigned sleeps;
};

static uv_loop_t loop;
static int ready;
static uint8_t hello_pkt[64];
static size_t hello_len;
static uint8_t rxbuf[256 * 1024];
static int verbose;

/* Open fds of this process (the directory's own fd included, which is the
 * same for every call). */
static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	FUZZ_ASSERT(d, "cannot read /proc/self/fd");
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void walk_count(uv_handle_t *h, void *arg)
{
	(void)h;
	(*(unsigned *)arg)++;
}

static void setup_once(void)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;

	if (ready)
		return;
	ready = 1;
	signal(SIGPIPE, SIG_IGN);
	verbose = getenv("DLSHARE_FUZZ_LOG") != NULL;
	log_set_level(verbose ? LOG_DEBUG : LOG_CRIT);
	FUZZ_ASSERT(uv_loop_init(&loop) == 0, "uv_loop_init");
	h.major = WIRE_PROTO_MAJOR;
	h.minor = WIRE_PROTO_MINOR;
	h.agent = "fuzz_daemon";
	f.id = 1;
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	hello_len = dlshare__frame__pack(&f, hello_pkt);
}

/* An fd to attach, of kind:
 *  0 a memfd of 64 KiB with the size seals (what a client sends),
 *  1 the same but 64 bytes long (too small for most buffers),
 *  2 a memfd of 64 KiB without seals,
 *  3 something else, by i: a pipe, /dev/null, an eventfd, a memfd sealed
 *    against sealing only.
 * Returns the fd or -1. */
static int make_fd(unsigned kind, unsigned i)
{
	int fd = -1;

	if (kind == 3) {
		switch (i % 4) {
		case 0: {
			int p[2];

			if (pipe2(p, O_CLOEXEC) < 0)
				return -1;
			close(p[1]);
			return p[0];
		}
		case 1:
			return open("/dev/null", O_RDWR | O_CLOEXEC);
		case 2:
			return eventfd(0, EFD_CLOEXEC);
		default:
			fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
			if (fd >= 0)
				fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL);
			return fd;
		}
	}
	fd = memfd_create("fuzz", MFD_CLOEXEC |
			  (kind == 2 ? 0 : MFD_ALLOW_SEALING));
	if (fd < 0)
		return -1;
	if (ftruncate(fd, kind == 1 ? 64 : FZ_MEMFD_SIZE) < 0 ||
	    (kind != 2 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

static int is_reply(Dlshare__Frame__BodyCase b)
{
	switch (b) {
	case DLSHARE__FRAME__BODY_HELLO_REPLY:
	case DLSHARE__FRAME__BODY_CREATE_REPLY:
	case DLSHARE__FRAME__BODY_SEAL_REPLY:
	case DLSHARE__FRAME__BODY_PUBLISH_REPLY:
	case DLSHARE__FRAME__BODY_GET_REPLY:
	case DLSHARE__FRAME__BODY_LIST_REPLY:
	case DLSHARE__FRAME__BODY_STAT_REPLY:
	case DLSHARE__FRAME__BODY_STATS_REPLY:
	case DLSHARE__FRAME__BODY_RETIRED:
	case DLSHARE__FRAME__BODY_BUFFER_GONE:
	case DLSHARE__FRAME__BODY_ERROR:
	case DLSHARE__FRAME__BODY_OK:
		return 1;
	default:
		return 0;
	}
}

static unsigned attached(Dlshare__Buffer **b, size_t n)
{
	unsigned k = 0;

	for (size_t i = 0; i < n; i++)
		k += b[i]->fd_attached ? 1 : 0;
	return k;
}

/* What any client may rely on in a packet from the daemon. */
/* What a producer does with a CreateReply: map each buffer writable. */
static void keep_maps(struct fz_peer *p, const Dlshare__CreateReply *r,
		      const int *fds, unsigned nfds)
{
	unsigned k = 0;

	for (size_t i = 0; i < r->n_buffers && k < nfds; i++) {
		const Dlshare__Buffer *b = r->buffers[i];
		void *m;

		if (!b->fd_attached)
			continue;
		if (p->nmaps < FZ_MAPS_MAX && b->size > 0 &&
		    b->size <= FZ_MEMFD_SIZE * 16) {
			m = mmap(NULL, b->size, PROT_READ | PROT_WRITE,
				 MAP_SHARED, fds[k], 0);
			if (m != MAP_FAILED) {
				p->map[p->nmaps] = m;
				p->map_len[p->nmaps++] = b->size;
			}
		}
		k++;
	}
}

static void reply_check(struct fz_peer *p, int peer, const uint8_t *data,
			size_t len, const int *fds, unsigned nfds)
{
	struct wire_msg *m;
	const Dlshare__Frame *f;

	FUZZ_ASSERT(len <= FZ_MAX_PACKET, "reply of %zu bytes", len);
	FUZZ_ASSERT(wire_decode(data, len, &m) == 0,
		    "the daemon sent a packet that does not decode (%zu bytes)",
		    len);
	f = m->frame;
	if (verbose)
		fprintf(stderr, "peer %d <- id %llu body %d, %zu bytes, %u fds%s%s\n",
			peer, (unsigned long long)f->id, (int)f->body_case,
			len, nfds,
			f->body_case == DLSHARE__FRAME__BODY_ERROR ? ": " : "",
			f->body_case == DLSHARE__FRAME__BODY_ERROR &&
			f->error->message ? f->error->message : "");
	FUZZ_ASSERT(is_reply(f->body_case), "the daemon sent body %d",
		    (int)f->body_case);
	FUZZ_ASSERT(f->nfds == nfds, "frame says %u fds, packet has %u",
		    f->nfds, nfds);
	switch (f->body_case) {
	case DLSHARE__FRAME__BODY_CREATE_REPLY:
		FUZZ_ASSERT(attached(f->create_reply->buffers,
				     f->create_reply->n_buffers) == nfds,
			    "CreateReply fds do not match its buffers");
		if (p->keep_maps)
			keep_maps(p, f->create_reply, fds, nfds);
		break;
	case DLSHARE__FRAME__BODY_GET_REPLY: {
		const Dlshare__GetReply *r = f->get_reply;
		uint64_t sizes[64];

		FUZZ_ASSERT(r->n_buffers >= 1 && r->n_buffers <= 64 &&
			    r->n_tensors >= 1, "GetReply with %zu buffers",
			    r->n_buffers);
		FUZZ_ASSERT(attached(r->buffers, r->n_buffers) == nfds,
			    "GetReply fds do not match its buffers");
		for (size_t i = 0; i < r->n_buffers; i++)
			sizes[i] = r->buffers[i]->size;
		for (size_t i = 0; i < r->n_tensors; i++)
			FUZZ_ASSERT(check_tensor(r->tensors[i], sizes,
						 r->n_buffers) == 0,
				    "GetReply tensor %zu fails check_tensor", i);
		break;
	}
	case DLSHARE__FRAME__BODY_ERROR:
		FUZZ_ASSERT(f->error->code < 0, "Error code %d",
			    f->error->code);
		break;
	default:
		break;
	}
	/* 1.7: the board comes with the HelloReply, alone. */
	if (f->body_case == DLSHARE__FRAME__BODY_HELLO_REPLY)
		FUZZ_ASSERT(nfds == (f->hello_reply->has_board_slots ? 1u : 0u),
			    "HelloReply with %u fds", nfds);
	else if (f->body_case != DLSHARE__FRAME__BODY_CREATE_REPLY &&
		 f->body_case != DLSHARE__FRAME__BODY_GET_REPLY)
		FUZZ_ASSERT(nfds == 0, "fds on body %d", (int)f->body_case);
	wire_msg_free(m);
}

/* Reads and checks every packet waiting for peer i. Returns how many. */
static unsigned peer_drain(struct session *z, int i)
{
	struct fz_peer *p = &z->p[i];
	unsigned got = 0;

	while (p->fd >= 0 && !p->eof && !p->deaf) {
		int fds[WIRE_FDS_MAX];
		unsigned nfds = 0;
		size_t len = 0;
		int err = wire_recv(p->fd, rxbuf, sizeof(rxbuf), fds,
				    WIRE_FDS_MAX, &len, &nfds, MSG_DONTWAIT);

		if (err == -EAGAIN)
			break;
		FUZZ_ASSERT(err != -EMSGSIZE && err != -EPROTO,
			    "the daemon sent an oversized packet (%d)", err);
		if (err || (len == 0 && nfds == 0)) {
			p->eof = 1;
			break;
		}
		reply_check(p, i, rxbuf, len, fds, nfds);
		wire_close_fds(fds, nfds);
		got++;
	}
	return got;
}

static unsigned drain_all(struct session *z)
{
	unsigned got = 0;

	for (int i = 0; i < NPEERS; i++)
		got += peer_drain(z, i);
	return got;
}

/* Runs the loop without blocking until the daemon has nothing more to
 * read or say: a round in which it handled no request and sent nothing
 * leaves nothing for the next (no timer is due this soon). */
static void pump(struct session *z)
{
	for (int round = 0; round < FZ_PUMP_ROUNDS; round++) {
		uint64_t before = z->s.d.requests;

		uv_run(&loop, UV_RUN_NOWAIT);
		if (drain_all(z) == 0 && before == z->s.d.requests)
			break;
	}
}

static void peer_send(struct session *z, int i, const uint8_t *data,
		      size_t len, unsigned nfds, unsigned kind)
{
	int fds[8];
	unsigned n = 0;

	if (z->p[i].fd < 0)
		return;
	for (; n < nfds; n++) {
		fds[n] = make_fd(kind, n);
		if (fds[n] < 0)
			break;
	}
	for (int tries = 0; tries < FZ_SEND_TRIES; tries++) {
		int err = wire_send(z->p[i].fd, data, len, fds, n,
				    MSG_DONTWAIT);

		if (verbose)
			fprintf(stderr, "peer %d -> %zu bytes, %u fds: %d\n", i,
				len, n, err);
		if (err != -EAGAIN)
			break;
		/* The socket is full: let the daemon read. */
		uv_run(&loop, UV_RUN_NOWAIT);
		drain_all(z);
	}
	wire_close_fds(fds, n);
}

static void peer_hangup(struct session *z, int i)
{
	struct fz_peer *p = &z->p[i];

	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
	for (unsigned k = 0; k < p->nmaps; k++)
		munmap(p->map[k], p->map_len[k]);
	p->nmaps = 0;
}

/* Connects peer i to the server the way on_accept does. */
static void peer_connect(struct session *z, int i, unsigned identity,
			 int deaf, int maps)
{
	int sv[2], sndbuf = FZ_SNDBUF;

	FUZZ_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK |
			       SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
		    strerror(errno));
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	FUZZ_ASSERT(peer_new(&z->s.d, sv[1]) == 0, "peer_new");
	z->p[i].fd = sv[0];
	z->p[i].eof = 0;
	z->p[i].deaf = deaf;
	z->p[i].keep_maps = maps;
	if (identity) {
		/* SO_PEERCRED of a socketpair is ourselves; make the peer
		 * someone else, so that the ACL and per-uid paths run: undo
		 * what peer_new charged to our uid and attach it again. */
		/* The one just added. */
		struct conn *c = z->s.d.conns.conns->prev;
		struct registry_owner *o = &peer_of_conn(c)->owner;

		registry_owner_drop(&z->s.d.reg, o);
		registry_owner_init(o, o->uid + 1000,
				    o->gid + (identity == 2 ? 1000 : 0),
				    o->pid);
		FUZZ_ASSERT(registry_owner_attach(&z->s.d.reg, o, NULL) == 0,
			    "registry_owner_attach");
	}
}

static void server_setup(struct session *z)
{
	struct server_config cfg;

	server_config_default(&cfg);
	cfg.limits.max_packet = FZ_MAX_PACKET;
	cfg.limits.max_fds = 4;
	cfg.limits.max_inflight = 4;
	cfg.limits.max_connections = 8;
	cfg.limits.max_output = 32u * 1024u;
	cfg.limits.list_page = 8;
	cfg.limits.hello_timeout_ms = 1;
	cfg.registry.max_tensors = 16;
	cfg.registry.max_buffers = 4;
	cfg.registry.max_leases = 8;
	cfg.registry.uid_names = 6;
	cfg.registry.uid_leases = 12;
	cfg.registry.uid_host_bytes = 3u << 20;
	cfg.registry.max_buffer_bytes = 1u << 20;
	cfg.registry.max_bytes = 4u << 20;
	FUZZ_ASSERT(server_init(&z->s, &loop, &cfg) == 0, "server_init");
}

/* What u is charged for the versions under names in the map (the caller
 * made sure no deleted name is left) as their producer: their count, host
 * bytes and fds; and whether each version is charged to a live record. */
static void charged(struct registry *r, const struct uid_usage *u,
		    uint32_t *versions, uint64_t *bytes, uint64_t *fds)
{
	struct entry *e, *etmp;
	struct version *v;

	*versions = 0;
	*bytes = 0;
	*fds = 0;
	HASH_ITER(hh, r->names, e, etmp)
		DL_FOREACH(e->versions, v) {
			struct uid_usage *live = NULL;

			if (v->usage)
				HASH_FIND(hh, r->uids, &v->usage->uid,
					  sizeof(v->usage->uid), live);
			FUZZ_ASSERT(v->usage && live == v->usage && !v->charges,
				    "name %s v%llu charged to no live uid "
				    "record, or to a leaseholder", e->name,
				    (unsigned long long)v->number);
			if (v->usage != u)
				continue;
			(*versions)++;
			*bytes += v->owned_host;
			*fds += v->nfds;
		}
}

/* What each uid is charged for must be what it still holds: no
 * connection, lease or pending version; the names it created; the bytes
 * and fds of its store versions. A record that holds nothing must be
 * gone. */
static void check_uids(struct registry *r)
{
	struct uid_usage *u, *utmp;
	struct entry *e, *etmp;
	uint32_t versions;
	uint64_t bytes, fds;

	HASH_ITER(hh, r->uids, u, utmp) {
		uint32_t names = 0;

		charged(r, u, &versions, &bytes, &fds);
		HASH_ITER(hh, r->names, e, etmp)
			names += e->usage == u;
		FUZZ_ASSERT(u->owners == 0 && u->leases == 0 &&
			    u->pending == 0 && u->leased == 0 &&
			    u->leased_host_bytes == 0 &&
			    u->leased_gpu_bytes == 0 && u->fds_queued == 0 &&
			    u->names == names && u->versions == versions &&
			    u->host_bytes == bytes && u->fds == fds &&
			    u->gpu_bytes == 0,
			    "uid %u charged for %u conns, %u leases, %u "
			    "pending, %u/%u names, %u/%u versions, %llu/%llu "
			    "bytes, %llu/%llu fds", (unsigned)u->uid,
			    u->owners, u->leases, u->pending, u->names, names,
			    u->versions, versions,
			    (unsigned long long)u->host_bytes,
			    (unsigned long long)bytes,
			    (unsigned long long)u->fds,
			    (unsigned long long)fds);
		FUZZ_ASSERT(names || versions, "uid %u: empty record kept",
			    (unsigned)u->uid);
	}
	/* Versions are checked even when no uid record is left. */
	charged(r, NULL, &versions, &bytes, &fds);
	HASH_ITER(hh, r->names, e, etmp) {
		u = NULL;
		if (e->usage)
			HASH_FIND(hh, r->uids, &e->usage->uid,
				  sizeof(e->usage->uid), u);
		FUZZ_ASSERT(e->usage && u == e->usage,
			    "name %s charged to no live uid record", e->name);
	}
}

static uint64_t fz_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Runs the loop until busy() says nothing is left, or FZ_DRAIN_MS went. */
static void drain(struct session *z, int (*busy)(struct session *))
{
	uint64_t end = fz_now_ms() + FZ_DRAIN_MS;

	for (int i = 0; busy(z) && (i < 64 || fz_now_ms() < end); i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		if (i >= 64 && busy(z))
			usleep(100);
	}
}

static int closing(struct session *z)
{
	return z->s.d.conns.n || z->s.d.seal_uids;
}

static int loop_busy(struct session *z)
{
	(void)z;
	return uv_loop_alive(&loop);
}

/* After every peer left: only sealed store versions may remain. */
static void check_peers_gone(struct session *z)
{
	struct daemon *d = &z->s.d;
	struct registry *r = &d->reg;
	uint64_t names = 0, buffers = 0, bytes = 0, fds = 0;
	struct entry *e, *tmp;

	FUZZ_ASSERT(d->conns.n == 0 && !d->conns.conns && !d->conns.doomed,
		    "%u conns left after every peer hung up", d->conns.n);
	FUZZ_ASSERT(!d->seal_uids && r->fds_queued == 0,
		    "seals or queued fds left after every peer hung up");
	FUZZ_ASSERT(d->nparked == 0 && !d->waiters, "%llu parked gets left",
		    (unsigned long long)d->nparked);
	FUZZ_ASSERT(r->nleases == 0, "%llu leases left",
		    (unsigned long long)r->nleases);
	FUZZ_ASSERT(!r->detached, "a deleted name outlived its versions");
	HASH_ITER(hh, r->names, e, tmp) {
		struct version *v = e->latest;

		FUZZ_ASSERT(!e->detached && e->leases == 0,
			    "name %s: %u leases", e->name, e->leases);
		FUZZ_ASSERT(v && e->versions == v && e->nversions == 1 &&
			    !v->next, "name %s keeps %u versions", e->name,
			    e->nversions);
		FUZZ_ASSERT(v->state == VERSION_SEALED && !v->exported &&
			    !v->producer && v->leases == 0 && !v->lease_list,
			    "name %s v%llu: state %d exported %d leases %u",
			    e->name, (unsigned long long)v->number, v->state,
			    v->exported, v->leases);
		for (size_t i = 0; i < v->nbuffers; i++) {
			struct rbuffer *b = v->buffers[i];

			FUZZ_ASSERT(b && b->version == v && b->daemon_owned &&
				    fcntl(b->fd, F_GETFD) >= 0,
				    "name %s: buffer %zu", e->name, i);
		}
		FUZZ_ASSERT(!v->sealing && !v->pending && !v->orphaned,
			    "name %s v%llu: sealing %d pending %d orphaned %d",
			    e->name, (unsigned long long)v->number, v->sealing,
			    v->pending, v->orphaned);
		names++;
		buffers += v->nbuffers;
		bytes += registry_bytes(v);
		fds += v->nfds;
	}
	check_uids(r);
	FUZZ_ASSERT(r->nfds == fds, "fds counted %llu, versions hold %llu",
		    (unsigned long long)r->nfds, (unsigned long long)fds);
	FUZZ_ASSERT(r->nnames == names && r->nversions == names &&
		    r->nbuffers == buffers && r->bytes == bytes &&
		    r->owned_bytes == bytes,
		    "counters: names %llu/%llu versions %llu buffers %llu/%llu "
		    "bytes %llu/%llu owned %llu",
		    (unsigned long long)r->nnames, (unsigned long long)names,
		    (unsigned long long)r->nversions,
		    (unsigned long long)r->nbuffers,
		    (unsigned long long)buffers, (unsigned long long)r->bytes,
		    (unsigned long long)bytes,
		    (unsigned long long)r->owned_bytes);
}

static void server_teardown(struct session *z)
{
	struct registry *r = &z->s.d.reg;
	unsigned handles = 0;

	server_shutdown(&z->s);
	/* A GPU create's job may still be on the thread pool: give it time
	 * (a few ms at most; the fuzzer's daemon has no GPU). */
	drain(z, loop_busy);
	server_deinit(&z->s);
	FUZZ_ASSERT(!r->names && !r->detached && r->nnames == 0 &&
		    r->nversions == 0 && r->nleases == 0 && r->nbuffers == 0 &&
		    r->bytes == 0 && r->owned_bytes == 0 && r->nfds == 0 &&
		    r->fds_queued == 0 && !r->uids,
		    "registry not empty after deinit");
	uv_walk(&loop, walk_count, &handles);
	FUZZ_ASSERT(handles == 0 && !uv_loop_alive(&loop),
		    "%u libuv handles left", handles);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct session z;
	size_t pos = 0;
	unsigned flags, identity;
	int fds0;

	setup_once();
	fds0 = fd_count();
	memset(&z, 0, sizeof(z));
	server_setup(&z);

	flags = size ? data[pos++] : 0;
	identity = (flags >> 2) & 3;
	for (int i = 0; i < NPEERS; i++)
		z.p[i].fd = -1;
	peer_connect(&z, 0, 0, 0, !!(flags & 0x20));
	if (identity != 3)
		peer_connect(&z, 1, identity, !!(flags & 0x10), 0);
	for (int i = 0; i < NPEERS; i++)
		if (!(flags & (1u << i)))
			peer_send(&z, i, hello_pkt, hello_len, 0, 0);

	while (pos < size) {
		unsigned hdr = data[pos++], peer = hdr & 1;

		if (hdr & 0x80) {
			switch ((hdr >> 1) & 3) {
			case 0:
				pump(&z);
				peer_hangup(&z, peer);
				break;
			case 1:
				if (z.sleeps++ < FZ_SLEEPS_MAX)
					usleep(1100);
				pump(&z);
				/* What the server's sweep timer does once a
				 * second. */
				conn_sweep(&z.s.d.conns);
				pump(&z);
				break;
			case 2:
				pump(&z);
				break;
			default:
				if (z.p[peer].fd >= 0)
					shutdown(z.p[peer].fd, SHUT_WR);
				break;
			}
			continue;
		}
		size_t len = 0;

		if (pos < size)
			len = data[pos++];
		if (pos < size)
			len |= (size_t)data[pos++] << 8;
		if (len > size - pos)
			len = size - pos;
		peer_send(&z, peer, data + pos, len, (hdr >> 1) & 7,
			  (hdr >> 4) & 3);
		pos += len;
		if (hdr & 0x40)
			pump(&z);
	}
	pump(&z);

	/* Everyone hangs up; the daemon must notice and drop their stakes. */
	for (int i = 0; i < NPEERS; i++)
		peer_hangup(&z, i);
	/* A seal on the thread pool ends after its conn: wait for it too. */
	drain(&z, closing);
	check_peers_gone(&z);
	server_teardown(&z);
	FUZZ_ASSERT(fd_count() == fds0, "fds: %d before, %d after", fds0,
		    fd_count());
	return 0;
}
