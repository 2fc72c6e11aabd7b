/* dlshare-floor — what the kernel can do, with nothing of dlshare in it.
 *
 * The benchmarks measure dlshare against these programs, in the same run on
 * the same machine:
 *
 *   dlshare-floor rt --type seqpacket|stream|shm [--fd] --req B --rep B
 *                    --iters N [--server-cpu C] [--epoll]
 *       a bare round trip over a Unix socket pair: a client sends B bytes,
 *       a server process answers with B bytes (and one fd attached, with
 *       --fd, which the client closes, as a client that maps it would);
 *       prints the p50, p99 and mean in ns. --server-cpu pins the server
 *       to CPU C (the client keeps the affinity it was started with).
 *       --epoll: the server's socket is non-blocking and it waits in
 *       epoll_wait before each request, as an event loop does, instead of
 *       blocking in recvmsg: the kernel's cost of serving from a loop.
 *       --type shm: no socket; the request and the reply go through a
 *       shared mapping and each side wakes the other through an eventfd
 *       (write 8 bytes, read 8 bytes), the server copying the request out
 *       before it answers, as it must with memory a peer can still write:
 *       the kernel's cost of a request path in shared memory (no --fd).
 *   dlshare-floor server --clients N --req B --rep B --ms T
 *       a bare single-threaded epoll server (non-blocking, level-triggered,
 *       at most 32 packets per peer and wakeup) answering N client
 *       processes that each send requests and wait for the reply in a loop
 *       for T ms; prints round trips a second.
 *   dlshare-floor storm --clients N [--shaped]
 *       a kill storm against a bare epoll server: N processes each hold a
 *       connection, all get SIGKILL at once; prints the ms from the first
 *       kill until the server has seen every hang-up and closed its end,
 *       and the server's CPU time for it. --shaped: each client is built
 *       like a dlshare client (a second thread blocked on the socket, a
 *       shared 4 KiB memfd mapped), so its exit tears down as much.
 *   dlshare-floor handoff --bytes B --iters N [--huge 2M|1G]
 *       the kernel's part of a store-mode handoff: a memfd written through a
 *       shared mapping, munmap (after MADV_SEQUENTIAL, as libdlshare
 *       unmaps), F_SEAL_WRITE, its fd sent over a SEQPACKET
 *       socket to another process that maps it read-only; prints the
 *       medians of the whole and of each step in ns. With --huge the memfd
 *       is made of 2 MiB or 1 GiB huge pages (MFD_HUGETLB; the kernel's
 *       pool, vm.nr_hugepages, must hold them): what a fix of the
 *       handoff would use.
 *   dlshare-floor fill --bytes B --iters N
 *       the kernel's fill of fresh shared memory with a copy of B bytes
 *       (a populated private buffer): a new memfd with the store's birth
 *       seals, filled, then F_SEAL_WRITE and close, as a store version's
 *       buffer is. Three ways, each timed N times: through a shared
 *       mapping page fault by page fault (fault_ns), fallocate +
 *       MADV_POPULATE_WRITE + memcpy (populate_ns; "nan" before Linux
 *       5.14), and pwrite into the file (pwrite_ns); the best of their
 *       medians (best_ns), and a memcpy between two populated private
 *       buffers (memcpy_ns), the memory's own speed.
 *
 * Output is one line of key=value pairs on stdout. Exit status 0, or 1 with
 * a message on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

#define FLOOR_PACKET_MAX 4096
#define FLOOR_BATCH 32

static _Noreturn void die(const char *what)
{
	fprintf(stderr, "dlshare-floor: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Sends len bytes and, when fd >= 0, the fd with them. A SEQPACKET send
 * is whole; a stream send is looped. Returns 0 or -1. */
static int send_packet(int sock, const char *buf, size_t len, int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		m.msg_control = ctl.b;
		m.msg_controllen = sizeof(ctl.b);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	while (iov.iov_len) {
		/* Without an fd, send(2): no msghdr or iovec array to copy
		 * in, the cheapest way to move the bytes (as dlshare's wire
		 * sends a packet without fds). */
		ssize_t n = m.msg_control ?
			    sendmsg(sock, &m, MSG_NOSIGNAL) :
			    send(sock, iov.iov_base, iov.iov_len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		iov.iov_base = (char *)iov.iov_base + n;
		iov.iov_len -= (size_t)n;
		m.msg_control = NULL;
		m.msg_controllen = 0;
	}
	return 0;
}

/* Receives exactly len bytes (one packet for SEQPACKET) and closes any fd
 * that came with them, the way a client that has mapped it would. Returns
 * 0, 1 at EOF, or -1. */
static int recv_packet(int sock, char *buf, size_t len, int *got_fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	size_t have = 0;

	*got_fd = -1;
	while (have < len) {
		struct iovec iov = { .iov_base = buf + have,
				     .iov_len = len - have };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = ctl.b,
				    .msg_controllen = sizeof(ctl.b) };
		ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return 1;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c;
		     c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == SOL_SOCKET &&
			    c->cmsg_type == SCM_RIGHTS)
				memcpy(got_fd, CMSG_DATA(c), sizeof(int));
		have += (size_t)n;
	}
	return 0;
}

/* ---- rt ------------------------------------------------------------------ */

/* The rt server, --epoll: waits for each request in epoll_wait on a
 * non-blocking socket, then reads and answers it. Exits at EOF. */
static _Noreturn void rt_serve_epoll(int sock, char *rbuf, size_t req,
				     const char *sbuf, size_t rep, int memfd)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int ep = epoll_create1(EPOLL_CLOEXEC);

	if (ep < 0 || fcntl(sock, F_SETFL, O_NONBLOCK) < 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, sock, &ev) < 0)
		_exit(1);
	for (;;) {
		int fd, r, n = epoll_wait(ep, &ev, 1, -1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n != 1)
			_exit(1);
		r = recv_packet(sock, rbuf, req, &fd);
		if (r)
			_exit(r == 1 ? 0 : 1);
		if (send_packet(sock, sbuf, rep, memfd) < 0)
			_exit(1);
	}
}

/* --type shm: the slots both processes map, and the eventfds. */
struct shm_rt {
	char *req, *rep;            /* FLOOR_PACKET_MAX each */
	int to_server, to_client;   /* eventfds */
};

static int efd_signal(int fd)
{
	uint64_t one = 1;
	ssize_t n;

	while ((n = write(fd, &one, sizeof(one))) < 0 && errno == EINTR)
		;
	return n == sizeof(one) ? 0 : -1;
}

/* Returns 0, 1 when the count read says the other side is done, or -1
 * (EAGAIN included: a non-blocking eventfd with nothing yet). */
static int efd_wait(int fd)
{
	uint64_t v;
	ssize_t n;

	while ((n = read(fd, &v, sizeof(v))) < 0 && errno == EINTR)
		;
	if (n != sizeof(v))
		return -1;
	return v > 1 ? 1 : 0;
}

/* The shm server: each wakeup, copies the request out of the shared
 * slot, writes the reply into the other and wakes the client. With
 * use_epoll it waits in epoll_wait on its non-blocking eventfd first, as
 * an event loop would. Exits when the client says it is done. */
static _Noreturn void shm_serve(struct shm_rt *sh, char *rbuf, size_t req,
				const char *sbuf, size_t rep, int use_epoll)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int ep = -1;

	if (use_epoll &&
	    ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	     fcntl(sh->to_server, F_SETFL, O_NONBLOCK) < 0 ||
	     epoll_ctl(ep, EPOLL_CTL_ADD, sh->to_server, &ev) < 0))
		_exit(1);
	for (;;) {
		int r;

		if (use_epoll) {
			int n = epoll_wait(ep, &ev, 1, -1);

			if (n < 0 && errno == EINTR)
				continue;
			if (n != 1)
				_exit(1);
		}
		r = efd_wait(sh->to_server);
		if (r)
			_exit(r == 1 ? 0 : 1);
		memcpy(rbuf, sh->req, req);
		memcpy(sh->rep, sbuf, rep);
		if (efd_signal(sh->to_client) < 0)
			_exit(1);
	}
}

/* --type shm's client side of one round trip. Returns 0 or -1. */
static int shm_round_trip(struct shm_rt *sh, const char *sbuf, size_t req,
			  char *rbuf, size_t rep)
{
	memcpy(sh->req, sbuf, req);
	if (efd_signal(sh->to_server) < 0 || efd_wait(sh->to_client) != 0)
		return -1;
	memcpy(rbuf, sh->rep, rep);
	return 0;
}

static int floor_rt(int type, int with_fd, size_t req, size_t rep, long iters,
		    int server_cpu, int use_epoll)
{
	struct shm_rt sh = { .to_server = -1, .to_client = -1 };
	char rbuf[FLOOR_PACKET_MAX], sbuf[FLOOR_PACKET_MAX];
	struct samples s = { 0 };
	long warm = iters / 10 + 100;
	int sv[2], memfd = -1;
	pid_t pid;

	memset(sbuf, 0x5a, sizeof(sbuf));
	if (type == 0) {
		/* shm: two slots in one shared mapping, two eventfds. */
		char *m = mmap(NULL, 2 * FLOOR_PACKET_MAX,
			       PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

		if (m == MAP_FAILED || with_fd)
			die("shm");
		sh.req = m;
		sh.rep = m + FLOOR_PACKET_MAX;
		sh.to_server = eventfd(0, EFD_CLOEXEC);
		sh.to_client = eventfd(0, EFD_CLOEXEC);
		if (sh.to_server < 0 || sh.to_client < 0)
			die("eventfd");
		sv[0] = sv[1] = -1;
	} else if (socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, sv) < 0) {
		die("socketpair");
	}
	if (with_fd) {
		memfd = memfd_create("floor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (memfd < 0 || ftruncate(memfd, 4096) < 0)
			die("memfd");
	}
	pid = util_fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		/* The server: answer each request, until EOF. */
		if (sv[0] >= 0)
			close(sv[0]);
		if (server_cpu >= 0) {
			cpu_set_t one;

			CPU_ZERO(&one);
			CPU_SET(server_cpu, &one);
			if (sched_setaffinity(0, sizeof(one), &one) < 0)
				_exit(1);
		}
		if (type == 0)
			shm_serve(&sh, rbuf, req, sbuf, rep, use_epoll);
		if (use_epoll)
			rt_serve_epoll(sv[1], rbuf, req, sbuf, rep, memfd);
		for (;;) {
			int fd, r = recv_packet(sv[1], rbuf, req, &fd);

			if (r)
				_exit(r == 1 ? 0 : 1);
			if (send_packet(sv[1], sbuf, rep, memfd) < 0)
				_exit(1);
		}
	}
	if (sv[1] >= 0)
		close(sv[1]);
	for (long i = 0; i < warm + iters; i++) {
		uint64_t t0 = util_now_ns();
		int fd = -1;

		if (type == 0 ? shm_round_trip(&sh, sbuf, req, rbuf, rep) < 0 :
		    (send_packet(sv[0], sbuf, req, -1) < 0 ||
		     recv_packet(sv[0], rbuf, rep, &fd) != 0))
			die("round trip");
		if (fd >= 0)
			close(fd);
		if (i >= warm && samples_add(&s, (double)(util_now_ns() - t0)))
			die("samples");
	}
	if (type == 0) {
		/* A count above 1 tells the server to exit. */
		uint64_t done = 2;

		if (write(sh.to_server, &done, sizeof(done)) < 0)
			die("eventfd");
		close(sh.to_server);
		close(sh.to_client);
		munmap(sh.req, 2 * FLOOR_PACKET_MAX);
	} else {
		close(sv[0]);
	}
	if (child_wait(pid) != 0) {
		fprintf(stderr, "dlshare-floor: server failed\n");
		return 1;
	}
	double sum = 0;
	for (size_t i = 0; i < s.n; i++)
		sum += s.v[i];
	printf("p50_ns=%.0f p99_ns=%.0f mean_ns=%.0f n=%zu\n",
	       samples_quantile(&s, 0.50), samples_quantile(&s, 0.99),
	       sum / (double)s.n, s.n);
	samples_free(&s);
	if (memfd >= 0)
		close(memfd);
	return 0;
}

/* ---- server ----------------------------------------------------------- */

/* One client process: round trips until the deadline; writes its count. */
static void server_client(int sock, int go, int out, size_t req, size_t rep,
			  const volatile uint64_t *deadline)
{
	char rbuf[FLOOR_PACKET_MAX], sbuf[FLOOR_PACKET_MAX];
	uint64_t ops = 0;
	char c;

	memset(sbuf, 0x5a, sizeof(sbuf));
	/* The parent closing its end releases everyone at once. */
	while (read(go, &c, 1) < 0 && errno == EINTR)
		;
	while (util_now_ns() < *deadline) {
		int fd;

		if (send_packet(sock, sbuf, req, -1) < 0 ||
		    recv_packet(sock, rbuf, rep, &fd) != 0)
			_exit(1);
		ops++;
	}
	if (util_write_all(out, &ops, sizeof(ops)) < 0)
		_exit(1);
	_exit(0);
}

static int floor_server(int nclients, size_t req, size_t rep, long ms)
{
	char rbuf[FLOOR_PACKET_MAX], sbuf[FLOOR_PACKET_MAX];
	struct epoll_event evs[64];
	volatile uint64_t *deadline;
	int go[2], res[2], ep, open_peers = nclients;
	pid_t *pids = calloc((size_t)nclients, sizeof(*pids));
	uint64_t total = 0, t0;

	memset(sbuf, 0x5a, sizeof(sbuf));
	deadline = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!pids || deadline == MAP_FAILED || pipe2(go, O_CLOEXEC) < 0 ||
	    pipe2(res, O_CLOEXEC) < 0)
		die("setup");
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	*deadline = UINT64_MAX;
	for (int i = 0; i < nclients; i++) {
		int sv[2];
		struct epoll_event ev = { .events = EPOLLIN };

		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
			die("socketpair");
		pids[i] = util_fork();
		if (pids[i] < 0)
			die("fork");
		if (pids[i] == 0) {
			close(sv[0]);
			close(go[1]);
			close(res[0]);
			server_client(sv[1], go[0], res[1], req, rep, deadline);
		}
		close(sv[1]);
		fcntl(sv[0], F_SETFL, O_NONBLOCK);
		ev.data.fd = sv[0];
		if (epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev) < 0)
			die("epoll_ctl");
	}
	close(go[0]);
	close(res[1]);
	t0 = util_now_ns();
	*deadline = t0 + (uint64_t)ms * 1000000u;
	close(go[1]);
	while (open_peers > 0) {
		int n = epoll_wait(ep, evs, 64, 1000);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("epoll_wait");
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;

			for (int k = 0; k < FLOOR_BATCH; k++) {
				ssize_t r = recv(fd, rbuf, sizeof(rbuf),
						 MSG_DONTWAIT);

				if (r < 0 && errno == EAGAIN)
					break;
				if (r <= 0) {
					epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
					close(fd);
					open_peers--;
					break;
				}
				if (send(fd, sbuf, rep, MSG_NOSIGNAL |
					 MSG_DONTWAIT) < 0 && errno != EPIPE)
					die("send");
			}
		}
	}
	for (int i = 0; i < nclients; i++) {
		uint64_t ops;

		if (read(res[0], &ops, sizeof(ops)) != sizeof(ops)) {
			fprintf(stderr, "dlshare-floor: a client failed\n");
			return 1;
		}
		total += ops;
	}
	for (int i = 0; i < nclients; i++)
		if (child_wait(pids[i]) != 0)
			return 1;
	printf("ops=%llu ms=%ld ops_per_s=%.0f clients=%d\n",
	       (unsigned long long)total, ms, (double)total * 1000.0 / (double)ms,
	       nclients);
	free(pids);
	return 0;
}

/* ---- storm -------------------------------------------------------------- */

/* A --shaped storm client's second thread: blocked on the socket, as
 * libdlshare's receiver thread is. */
static void *storm_reader(void *arg)
{
	char b[64];

	while (recv(*(int *)arg, b, sizeof(b), 0) != 0)
		;
	return NULL;
}

static int floor_storm(int nclients, int shaped)
{
	struct epoll_event evs[64];
	pid_t *pids = calloc((size_t)nclients, sizeof(*pids));
	int ready[2], ep, open_peers = nclients;
	uint64_t t0, cpu0;

	ep = epoll_create1(EPOLL_CLOEXEC);
	if (!pids || ep < 0 || pipe2(ready, O_CLOEXEC) < 0)
		die("setup");
	for (int i = 0; i < nclients; i++) {
		struct epoll_event ev = { .events = EPOLLIN };
		int sv[2];

		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
			die("socketpair");
		pids[i] = util_fork();
		if (pids[i] < 0)
			die("fork");
		if (pids[i] == 0) {
			char b = 'r';

			close(sv[0]);
			close(ready[0]);
			if (shaped) {
				/* The shape of a dlshare client: a second
				 * thread on the socket and a shared buffer
				 * mapped (what its exit must tear down). */
				static int fd;
				pthread_t th;
				int mfd = memfd_create("floor", MFD_CLOEXEC);

				fd = sv[1];
				if (mfd < 0 || ftruncate(mfd, 4096) < 0 ||
				    mmap(NULL, 4096, PROT_READ, MAP_SHARED,
					 mfd, 0) == MAP_FAILED ||
				    pthread_create(&th, NULL, storm_reader,
						   &fd))
					_exit(1);
			}
			if (util_write_all(ready[1], &b, 1) < 0)
				_exit(1);
			for (;;)
				pause();
		}
		close(sv[1]);
		fcntl(sv[0], F_SETFL, O_NONBLOCK);
		ev.data.fd = sv[0];
		if (epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev) < 0)
			die("epoll_ctl");
	}
	close(ready[1]);
	for (int i = 0; i < nclients; i++) {
		char b;

		if (read(ready[0], &b, 1) != 1)
			die("a client failed");
	}
	cpu0 = util_cpu_ns(0);
	t0 = util_now_ns();
	for (int i = 0; i < nclients; i++)
		kill(pids[i], SIGKILL);
	while (open_peers > 0) {
		int n = epoll_wait(ep, evs, 64, 120000);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("epoll_wait");
		for (int i = 0; i < n; i++) {
			char b[64];
			int fd = evs[i].data.fd;

			if (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
				continue;
			epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
			close(fd);
			open_peers--;
		}
	}
	{
		double ms = (double)(util_now_ns() - t0) / 1e6;
		uint64_t cpu1 = util_cpu_ns(0);

		printf("ms=%.3f cpu_ms=%.3f clients=%d\n", ms,
		       cpu0 && cpu1 ? (double)(cpu1 - cpu0) / 1e6 : -1.0,
		       nclients);
	}
	for (int i = 0; i < nclients; i++)
		child_wait(pids[i]);
	free(pids);
	return 0;
}

/* ---- handoff ------------------------------------------------------------ */

/* memfd_create's huge page size: log2 of it, shifted (linux/memfd.h). */
#define FLOOR_MFD_HUGE(log2) ((unsigned)(log2) << 26)

static int floor_handoff(uint64_t bytes, long iters, int huge)
{
	struct samples tot = { 0 }, unmap = { 0 }, seal = { 0 }, pass = { 0 };
	volatile uint64_t *t_map;
	int sv[2];
	pid_t pid;

	t_map = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (t_map == MAP_FAILED ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		die("setup");
	pid = util_fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		/* The consumer: map each fd it gets read-only, say when. */
		close(sv[0]);
		for (;;) {
			char b[8];
			int fd, r = recv_packet(sv[1], b, sizeof(b), &fd);
			void *p;

			if (r)
				_exit(r == 1 ? 0 : 1);
			p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
			*t_map = util_now_ns();
			if (p == MAP_FAILED)
				_exit(1);
			close(fd);
			munmap(p, bytes);
			if (send_packet(sv[1], b, 1, -1) < 0)
				_exit(1);
		}
	}
	close(sv[1]);
	for (long i = 0; i < iters; i++) {
		int fd = memfd_create("floor", MFD_CLOEXEC | MFD_ALLOW_SEALING |
				      (huge ? MFD_HUGETLB | FLOOR_MFD_HUGE(huge) : 0));
		uint64_t t0, t1, t2;
		char *p, b[8] = "handoff";
		int dummy;

		if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
			die("memfd");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			die("mmap");
		memset(p, (int)i, bytes);
		t0 = util_now_ns();
		/* As libdlshare does (hostmem_unmap): without it the unmap
		 * marks every page accessed, and whichever of the two
		 * unmaps comes second moves each to the active LRU list. */
		madvise(p, bytes, MADV_SEQUENTIAL);
		munmap(p, bytes);
		t1 = util_now_ns();
		if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0)
			die("F_SEAL_WRITE");
		t2 = util_now_ns();
		if (send_packet(sv[0], b, sizeof(b), fd) < 0 ||
		    recv_packet(sv[0], b, 1, &dummy) != 0)
			die("pass");
		close(fd);
		samples_add(&tot, (double)(*t_map - t0));
		samples_add(&unmap, (double)(t1 - t0));
		samples_add(&seal, (double)(t2 - t1));
		samples_add(&pass, (double)(*t_map - t2));
	}
	close(sv[0]);
	if (child_wait(pid) != 0)
		return 1;
	printf("total_ns=%.0f munmap_ns=%.0f seal_ns=%.0f pass_ns=%.0f n=%ld\n",
	       samples_quantile(&tot, 0.5), samples_quantile(&unmap, 0.5),
	       samples_quantile(&seal, 0.5), samples_quantile(&pass, 0.5),
	       iters);
	samples_free(&tot);
	samples_free(&unmap);
	samples_free(&seal);
	samples_free(&pass);
	return 0;
}

/* ---- fill ----------------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* One fill of a fresh memfd with src, by method 0 (fault), 1 (populate)
 * or 2 (pwrite); its time in ns, or -1 (the kernel cannot). */
static double fill_once(const char *src, uint64_t bytes, int method)
{
	uint64_t t0 = util_now_ns();
	int fd = memfd_create("floor-fill", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char *p;

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		die("memfd");
	if (method == 2) {
		for (uint64_t off = 0; off < bytes;) {
			ssize_t n = pwrite(fd, src + off, bytes - off,
					   (off_t)off);

			if (n <= 0)
				die("pwrite");
			off += (uint64_t)n;
		}
	} else {
		if (method == 1 && fallocate(fd, 0, 0, (off_t)bytes) < 0)
			die("fallocate");
		p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			die("mmap");
		if (method == 1 && madvise(p, bytes, MADV_POPULATE_WRITE) < 0) {
			munmap(p, bytes);
			close(fd);
			return -1;
		}
		memcpy(p, src, bytes);
		madvise(p, bytes, MADV_SEQUENTIAL); /* see floor_handoff */
		munmap(p, bytes);
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0)
		die("F_SEAL_WRITE");
	close(fd);
	return (double)(util_now_ns() - t0);
}

static int floor_fill(uint64_t bytes, long iters)
{
	static const char *const names[] = { "fault_ns", "populate_ns",
					     "pwrite_ns" };
	struct samples s[3] = { { 0 } }, mc = { 0 };
	char *src = malloc(bytes), *dst = malloc(bytes);
	double best = NAN;

	if (!src || !dst)
		die("malloc");
	memset(src, 0x5a, bytes);
	memset(dst, 0, bytes);
	for (long i = 0; i < iters; i++) {
		uint64_t t0 = util_now_ns();

		memcpy(dst, src, bytes);
		samples_add(&mc, (double)(util_now_ns() - t0));
		/* The methods in turns, so that none always runs first. */
		for (int k = 0; k < 3; k++) {
			int m = (int)((i + k) % 3);
			double t = fill_once(src, bytes, m);

			if (t >= 0)
				samples_add(&s[m], t);
		}
	}
	for (int m = 0; m < 3; m++) {
		double med = s[m].n ? samples_quantile(&s[m], 0.5) : NAN;

		printf("%s=%.0f ", names[m], med);
		if (!isnan(med) && (isnan(best) || med < best))
			best = med;
		samples_free(&s[m]);
	}
	printf("best_ns=%.0f memcpy_ns=%.0f n=%ld\n", best,
	       samples_quantile(&mc, 0.5), iters);
	samples_free(&mc);
	free(src);
	free(dst);
	return 0;
}

/* ---- main ----------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr,
		"usage: dlshare-floor rt --type seqpacket|stream|shm [--fd] --req B --rep B --iters N [--server-cpu C] [--epoll]\n"
		"       dlshare-floor server --clients N --req B --rep B --ms T\n"
		"       dlshare-floor storm --clients N [--shaped]\n"
		"       dlshare-floor handoff --bytes B --iters N [--huge 2M|1G]\n"
		"       dlshare-floor fill --bytes B --iters N\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "type", required_argument, NULL, 't' },
		{ "fd", no_argument, NULL, 'f' },
		{ "req", required_argument, NULL, 'q' },
		{ "rep", required_argument, NULL, 'p' },
		{ "iters", required_argument, NULL, 'i' },
		{ "clients", required_argument, NULL, 'c' },
		{ "ms", required_argument, NULL, 'm' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "huge", required_argument, NULL, 'H' },
		{ "server-cpu", required_argument, NULL, 's' },
		{ "shaped", no_argument, NULL, 'S' },
		{ "epoll", no_argument, NULL, 'e' },
		{ NULL, 0, NULL, 0 },
	};
	int type = SOCK_SEQPACKET, with_fd = 0, clients = 1, huge = 0, o;
	int server_cpu = -1, shaped = 0, use_epoll = 0;
	long req = 64, rep = 64, iters = 10000, ms = 1000;
	unsigned long long bytes = 4096;
	const char *cmd;

	if (argc < 2)
		usage();
	cmd = argv[1];
	optind = 2;
	while ((o = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (o) {
		case 't':
			if (strcmp(optarg, "seqpacket") == 0)
				type = SOCK_SEQPACKET;
			else if (strcmp(optarg, "stream") == 0)
				type = SOCK_STREAM;
			else if (strcmp(optarg, "shm") == 0)
				type = 0;
			else
				usage();
			break;
		case 'f':
			with_fd = 1;
			break;
		case 'q':
			req = atol(optarg);
			break;
		case 'p':
			rep = atol(optarg);
			break;
		case 'i':
			iters = atol(optarg);
			break;
		case 'c':
			clients = atoi(optarg);
			break;
		case 'm':
			ms = atol(optarg);
			break;
		case 'b':
			bytes = strtoull(optarg, NULL, 0);
			break;
		case 's':
			server_cpu = atoi(optarg);
			break;
		case 'S':
			shaped = 1;
			break;
		case 'e':
			use_epoll = 1;
			break;
		case 'H':
			if (strcmp(optarg, "2M") == 0)
				huge = 21;
			else if (strcmp(optarg, "1G") == 0)
				huge = 30;
			else
				usage();
			break;
		default:
			usage();
		}
	}
	if (req < 1 || req > FLOOR_PACKET_MAX || rep < 1 ||
	    rep > FLOOR_PACKET_MAX || iters < 1 || clients < 1 || ms < 1 ||
	    bytes < 1)
		usage();
	signal(SIGPIPE, SIG_IGN);
	if (strcmp(cmd, "rt") == 0)
		return floor_rt(type, with_fd, (size_t)req, (size_t)rep, iters,
				server_cpu, use_epoll);
	if (strcmp(cmd, "server") == 0)
		return floor_server(clients, (size_t)req, (size_t)rep, ms);
	if (strcmp(cmd, "storm") == 0)
		return floor_storm(clients, shaped);
	if (strcmp(cmd, "fill") == 0)
		return floor_fill(bytes, iters);
	if (strcmp(cmd, "handoff") == 0)
		return floor_handoff(huge ? (bytes + (UINT64_C(1) << huge) - 1) &
				     ~((UINT64_C(1) << huge) - 1) : bytes, iters,
				     huge);
	usage();
	return 2;
}
