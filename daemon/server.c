/* server — listening socket and the set of connections. */
#include "server.h"
#include "watch.h"
#include "chan.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef DLSHARE_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <dlshare/dlshare.h>

#include "conn.h"
#include "dispatch.h"
#include "expire.h"
#include "log.h"
#include "paths.h"
#include "peer.h"

/* Accepts per wakeup, like libuv's own accept loop. */
#define SERVER_ACCEPT_BATCH 32

void server_config_default(struct server_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->socket_mode = 0660;
	cfg->limits.max_packet = SERVER_MAX_PACKET_DEFAULT;
	cfg->limits.max_fds = SERVER_MAX_FDS_DEFAULT;
	cfg->limits.max_inflight = SERVER_MAX_INFLIGHT_DEFAULT;
	cfg->limits.max_connections = SERVER_MAX_CONNECTIONS_DEFAULT;
	cfg->limits.max_output = SERVER_MAX_OUTPUT_DEFAULT;
	cfg->limits.list_page = SERVER_LIST_PAGE_DEFAULT;
	cfg->limits.hello_timeout_ms = SERVER_HELLO_TIMEOUT_DEFAULT;
	cfg->limits.max_out_fds = SERVER_MAX_OUT_FDS_DEFAULT;
	cfg->limits.uid_seals = SERVER_UID_SEALS_DEFAULT;
	cfg->limits.max_watch_names = WATCH_NAMES_DEFAULT;
	cfg->limits.watch_deletions = WATCH_DELETIONS_DEFAULT;
	cfg->limits.board_slots = BOARD_SLOTS_DEFAULT;
	cfg->limits.channel = 1;
	registry_limits_default(&cfg->registry);
}

static void on_sweep(uv_timer_t *t)
{
	struct server *s = t->data;

	conn_sweep(&s->d.conns);
}

int server_fd_limits(struct registry_limits *reg,
		     const struct daemon_limits *lim, uint64_t nofile)
{
	/* A connection's socket, and its request channel's eventfd (1.9). */
	uint64_t fixed = (uint64_t)SERVER_FD_RESERVE +
			 (uint64_t)lim->max_connections * (lim->channel ? 2 : 1);
	uint64_t room = nofile > fixed ? nofile - fixed : 0;
	int short_of_fds = 0;

	if (room < nofile / 4) {
		room = nofile / 4;
		short_of_fds = 1;
	}
	if (room > UINT32_MAX)
		room = UINT32_MAX;
	if (!reg->max_open_fds)
		reg->max_open_fds = room ? (uint32_t)room : 1;
	if (!reg->uid_open_fds)
		reg->uid_open_fds = reg->max_open_fds / 2 ?
				    reg->max_open_fds / 2 : 1;
	return short_of_fds;
}

/* server_fd_limits for this process, and what came of it in the log. */
static void fd_limits(struct server_config *cfg)
{
	struct rlimit rl;
	uint64_t nofile;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		rl.rlim_cur = 1024;
	nofile = rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : rl.rlim_cur;
	if (server_fd_limits(&cfg->registry, &cfg->limits, nofile))
		log_warn("RLIMIT_NOFILE (%llu) leaves few fds beside %u "
			 "connections (max-connections): raise it "
			 "(LimitNOFILE=) or lower max-connections",
			 (unsigned long long)nofile,
			 cfg->limits.max_connections);
	log_info("fds: RLIMIT_NOFILE %llu; buffers may hold %u fds in all "
		 "(max-open-fds), %u for one uid (uid-open-fds)",
		 (unsigned long long)nofile, cfg->registry.max_open_fds,
		 cfg->registry.uid_open_fds);
}

int server_init(struct server *s, uv_loop_t *loop,
		const struct server_config *cfg)
{
	int err;

	memset(s, 0, sizeof(*s));
	s->loop = loop;
	s->cfg = *cfg;
	if (s->cfg.limits.channel && (err = chan_supported())) {
		log_warn("request channels off: this kernel cannot read an "
			 "eventfd without blocking (RWF_NOWAIT: %s; Linux 5.12 "
			 "or later can)", strerror(-err));
		s->cfg.limits.channel = 0;
	}
	fd_limits(&s->cfg);
	s->listen_fd = -1;
	s->spare_fd = -1;
	err = daemon_init(&s->d, loop, &s->cfg.limits, SERVER_HELLO_PACKET_MAX,
			  &s->cfg.registry, &dispatch_registry_ops,
			  &dispatch_conn_ops);
	if (err)
		return err;
	dispatch_init(&s->d);
	/* Housekeeping once a second: cheap, and it needs no timer per
	 * connection. */
	uv_timer_init(loop, &s->sweep);
	s->sweep.data = s;
	uv_timer_start(&s->sweep, on_sweep, 1000, 1000);
	uv_unref((uv_handle_t *)&s->sweep);
	s->sweeping = 1;
	expire_init(&s->d);
	return 0;
}

/* Refuses a peer politely: one Error packet, then the door. */
static void refuse(int fd, const char *why)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Error e = DLSHARE__ERROR__INIT;
	uint8_t *data;
	size_t len;

	e.code = DLSHARE_ELIMIT;
	e.message = (char *)why;
	f.body_case = DLSHARE__FRAME__BODY_ERROR;
	f.error = &e;
	if (wire_encode(&f, SERVER_HELLO_PACKET_MAX, &data, &len) == 0) {
		wire_send(fd, data, len, NULL, 0, MSG_DONTWAIT);
		free(data);
	}
	close(fd);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
	struct server *s = h->data;

	if (status < 0) {
		log_err("accept: %s", uv_strerror(status));
		return;
	}
	for (int i = 0; i < SERVER_ACCEPT_BATCH; i++) {
		int fd = accept4(s->listen_fd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) &&
			    s->spare_fd >= 0) {
				/* Out of fds: the peer would stay queued and
				 * the loop spin. Use the spare fd to take it
				 * and hang up on it, then get the spare back. */
				close(s->spare_fd);
				s->spare_fd = -1;
				fd = accept4(s->listen_fd, NULL, NULL,
					     SOCK_CLOEXEC);
				if (fd >= 0)
					close(fd);
				s->spare_fd = open("/dev/null",
						   O_RDONLY | O_CLOEXEC);
				log_warn("accept: out of file descriptors; "
					 "refused a connection");
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				log_err("accept: %s", strerror(errno));
			return;
		}
		if (s->d.conns.n >= s->cfg.limits.max_connections) {
			log_warn("connection limit (%u) reached; refused one",
				 s->cfg.limits.max_connections);
			s->d.metrics.limits[METRICS_LIMIT_MAX_CONNECTIONS]++;
			refuse(fd, "too many connections");
			continue;
		}
		int err = peer_new(&s->d, fd);
		if (err == -EDQUOT) {
			s->d.metrics.limits[METRICS_LIMIT_UID_CONNECTIONS]++;
			refuse(fd, "too many connections for this uid");
		}
		else if (err)
			log_err("new connection: %s", strerror(-err));
	}
	conn_reap(&s->d.conns);
}

/* For the default path, makes its directory: 0700 and ours, or refuse. */
static int prepare_dir(const char *path, int create)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	dirname(dir);
	if (create && mkdir(dir, 0700) < 0 && errno != EEXIST) {
		log_err("cannot create %s: %s", dir, strerror(errno));
		return -errno;
	}
	if (lstat(dir, &st) < 0) {
		log_err("socket directory %s: %s", dir, strerror(errno));
		return -errno;
	}
	if (create && (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
		       (st.st_mode & 077))) {
		log_err("%s must be a directory of uid %u with mode 0700",
			dir, (unsigned)geteuid());
		return -EPERM;
	}
	return 0;
}

/* A socket file that nobody accepts on is stale; a refused connect proves
 * it. Returns 1 when stale, 0 when alive or not a socket. */
static int socket_is_stale(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, stale = 0;

	if (lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode))
		return 0;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 &&
	    errno == ECONNREFUSED)
		stale = 1;
	close(fd);
	return stale;
}

/* Starts accepting on fd, a listening socket (ours or systemd's). */
static void start_accepting(struct server *s, int fd)
{
	s->listen_fd = fd;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_poll_init(s->loop, &s->listen_poll, fd);
	s->listen_poll.data = s;
	uv_poll_start(&s->listen_poll, UV_READABLE, on_accept);
	s->listening = 1;
}

#ifdef DLSHARE_HAVE_SYSTEMD
/* Checks that fd is what dlshared.socket makes: a listening AF_UNIX
 * SOCK_SEQPACKET socket. Returns 0 or -EINVAL (logged). */
static int check_inherited(int fd)
{
	int domain = 0, type = 0, acc = 0;
	socklen_t len = sizeof(int);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0) {
		log_err("socket activation: fd %d is not a socket: %s", fd,
			strerror(errno));
		return -EINVAL;
	}
	len = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len);
	len = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len);
	if (domain != AF_UNIX || type != SOCK_SEQPACKET) {
		log_err("socket activation: fd %d is not an AF_UNIX "
			"SOCK_SEQPACKET socket (domain %d, type %d); the "
			"socket unit needs ListenSequentialPacket=", fd,
			domain, type);
		return -EINVAL;
	}
	if (!acc) {
		log_err("socket activation: fd %d is not listening "
			"(Accept=yes is not supported)", fd);
		return -EINVAL;
	}
	return 0;
}

/* Takes the socket systemd passed (LISTEN_FDS). Returns 1 when it did, 0
 * when systemd passed none, or -errno (logged). The socket file is
 * systemd's: it is never unlinked here. */
static int listen_inherited(struct server *s)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	int n = sd_listen_fds(1), fd = SD_LISTEN_FDS_START, flags;

	if (n < 0) {
		log_err("socket activation: %s", strerror(-n));
		return n;
	}
	if (n == 0)
		return 0;
	if (n > 1) {
		log_err("socket activation: %d sockets passed; dlshared takes "
			"one (one ListenSequentialPacket= line)", n);
		return -EINVAL;
	}
	if (check_inherited(fd))
		return -EINVAL;
	/* systemd hands it over blocking and inheritable. */
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		int err = -errno;

		log_err("socket activation: fd %d: %s", fd, strerror(-err));
		return err;
	}
	memset(&sa, 0, sizeof(sa));
	if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
	    len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
		snprintf(s->path, sizeof(s->path), "%.*s",
			 (int)(len - offsetof(struct sockaddr_un, sun_path)),
			 sa.sun_path);
	else
		snprintf(s->path, sizeof(s->path), "(unnamed socket)");
	if (s->cfg.socket_path && strcmp(s->cfg.socket_path, s->path) != 0)
		log_warn("socket activation: ignoring socket %s; serving %s, "
			 "which systemd passed", s->cfg.socket_path, s->path);
	s->own_path = 0;
	start_accepting(s, fd);
	log_notice("dlshared listening on %s (socket activation)", s->path);
	return 1;
}
#endif

int server_listen(struct server *s)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, err, dflt = !s->cfg.socket_path;

#ifdef DLSHARE_HAVE_SYSTEMD
	err = listen_inherited(s);
	if (err)
		return err < 0 ? err : 0;
#else
	if (getenv("LISTEN_FDS"))
		log_warn("LISTEN_FDS is set but dlshared was built without "
			 "libsystemd: binding its own socket");
#endif

	if (dflt) {
		err = paths_default_socket(s->path, sizeof(s->path));
	} else if (strlen(s->cfg.socket_path) >= sizeof(s->path)) {
		err = -ENAMETOOLONG;
	} else {
		snprintf(s->path, sizeof(s->path), "%s", s->cfg.socket_path);
		err = 0;
	}
	if (err) {
		log_err("socket path too long (at most %zu bytes)",
			sizeof(sa.sun_path) - 1);
		return err;
	}
	/* Only the per-user fallback directories are ours to make. */
	if ((err = prepare_dir(s->path, dflt && !getenv("DLSHARE_SOCKET") &&
			       strcmp(s->path, PATHS_SYSTEM_SOCKET) != 0)))
		return err;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		err = -errno;
		if (err == -EADDRINUSE && socket_is_stale(s->path)) {
			log_notice("removing stale socket %s", s->path);
			unlink(s->path);
			err = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ?
			      -errno : 0;
		}
		if (err) {
			log_err("cannot bind %s: %s%s", s->path, strerror(-err),
				err == -EADDRINUSE ?
				" (another dlshared serves it)" : "");
			close(fd);
			return err;
		}
	}
	s->own_path = 1;
	if (chmod(s->path, s->cfg.socket_mode) < 0 || listen(fd, 128) < 0) {
		err = -errno;
		log_err("cannot listen on %s: %s", s->path, strerror(-err));
		close(fd);
		unlink(s->path);
		s->own_path = 0;
		return err;
	}
	start_accepting(s, fd);
	log_notice("dlshared listening on %s", s->path);
	return 0;
}

void server_shutdown(struct server *s)
{
	expire_close(&s->d);
	if (s->sweeping) {
		uv_close((uv_handle_t *)&s->sweep, NULL);
		s->sweeping = 0;
	}
	if (s->listening) {
		uv_close((uv_handle_t *)&s->listen_poll, NULL);
		s->listening = 0;
	}
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		s->listen_fd = -1;
	}
	if (s->own_path) {
		unlink(s->path);
		s->own_path = 0;
	}
	while (s->d.conns.conns)
		conn_close(s->d.conns.conns, "daemon shutting down");
	conn_reap(&s->d.conns);
}

void server_deinit(struct server *s)
{
	dispatch_deinit(&s->d);
	daemon_deinit(&s->d);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
}
