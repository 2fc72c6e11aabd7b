/* server — dlshared's listening socket, and the daemon put together.
 *
 * The server owns the daemon's state (struct daemon: the registry, the
 * connections, what requests keep) and wires its parts: the registry's and
 * the conns' callbacks are dispatch's. It accepts peers under a uv_poll_t
 * (SOCK_SEQPACKET is not a libuv stream), refusing those over a limit with
 * one Error packet, and sweeps the peers that never said Hello. Loop
 * thread only.
 */
#ifndef DLSHARE_SERVER_H
#define DLSHARE_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "daemon.h"
#include "registry.h"

#define SERVER_MAX_PACKET_DEFAULT (128u * 1024u)
#define SERVER_MAX_FDS_DEFAULT 16u
#define SERVER_MAX_INFLIGHT_DEFAULT 64u
#define SERVER_MAX_CONNECTIONS_DEFAULT 1024u
#define SERVER_MAX_OUTPUT_DEFAULT (4u * 1024u * 1024u)
#define SERVER_LIST_PAGE_DEFAULT 256u
#define SERVER_HELLO_TIMEOUT_DEFAULT 10000u
#define SERVER_MAX_OUT_FDS_DEFAULT 256u
/* One of the pool's UV_THREADPOOL_SIZE (4) threads per uid: a seal is
 * usually a few microseconds, and a uid whose seals wait on pinned pages
 * delays only its own. */
#define SERVER_UID_SEALS_DEFAULT 1u
/* Before Hello a peer gets a much smaller packet. */
#define SERVER_HELLO_PACKET_MAX 512u
/* fds of the daemon's own (stdio, listener, spare, epoll, libuv's, the
 * CUDA driver's), and room for accepts: never given to peers' buffers. */
#define SERVER_FD_RESERVE 128u

struct server_config {
	const char *socket_path;  /* NULL: the default rule */
	unsigned socket_mode;     /* permission bits of the socket file */
	struct daemon_limits limits;
	struct registry_limits registry;
};

struct server {
	uv_loop_t *loop;
	struct server_config cfg;
	struct daemon d;          /* d.limits and d.reg.limits are cfg's */
	char path[108];
	int listen_fd;
	int spare_fd;             /* kept open to survive EMFILE on accept */
	int own_path;             /* we bound path: unlink it on exit */
	uv_poll_t listen_poll;
	int listening;
	uv_timer_t sweep;         /* housekeeping: Hello timeouts */
	int sweeping;
};

void server_config_default(struct server_config *cfg);

/* Fills the fd limits left 0 in reg (max_open_fds, uid_open_fds) for a
 * process that may open nofile fds: what is left after SERVER_FD_RESERVE
 * and one fd per connection, and half of that for one uid, so that one uid
 * can never starve another, nor stop a new peer from being accepted and
 * served. Returns 1 when nofile is too small for max_connections to leave
 * that room (a quarter of nofile is used then), else 0. */
int server_fd_limits(struct registry_limits *reg,
		     const struct daemon_limits *lim, uint64_t nofile);

/* Prepares s; nothing listens yet. Fd limits left 0 are derived from the
 * process's RLIMIT_NOFILE (server_fd_limits). Returns 0 or -ENOMEM. */
int server_init(struct server *s, uv_loop_t *loop,
		const struct server_config *cfg);

/* Starts accepting. Under socket activation (built with libsystemd and
 * LISTEN_FDS set for us) it takes the one socket systemd passed, after
 * checking it is a listening AF_UNIX SOCK_SEQPACKET socket, and leaves its
 * file to systemd. Otherwise it binds and listens on the configured path,
 * creating its directory for the default path (0700, must be ours),
 * replacing a stale socket only when a connect proves nobody serves it.
 * Returns 0 or -errno (-EADDRINUSE when a live daemon holds the path,
 * -EINVAL when systemd passed the wrong kind or number of sockets). */
int server_listen(struct server *s);

/* Closes the listener and every connection; the loop must then run until
 * their handles are closed. */
void server_shutdown(struct server *s);

/* Frees what is left after the loop finished. */
void server_deinit(struct server *s);

#endif
