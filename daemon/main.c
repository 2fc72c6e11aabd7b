/* dlshared — the dlshare daemon: arguments, signals and the loop. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#ifdef DLSHARE_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <dlshare/dlshare.h>

#include "log.h"
#include "server.h"

static void usage(FILE *out)
{
	fprintf(out,
"Usage: dlshared [OPTION]...\n"
"Serve named tensors to processes on this machine over a Unix socket.\n"
"\n"
"  -s, --socket PATH         listen on PATH (default: $DLSHARE_SOCKET, else\n"
"                            /run/dlshare/dlshared.sock if it exists, else\n"
"                            $XDG_RUNTIME_DIR/dlshare/dlshared.sock, else\n"
"                            /tmp/dlshare-$UID/dlshared.sock)\n"
"      --socket-mode OCTAL   permissions of the socket file (default 0660)\n"
"  -l, --log-level LEVEL     error, warning, notice, info (default), debug\n"
"      --default-mode OCTAL  mode of a name whose publisher gives none\n"
"                            (default 0644: owner read-write, others read)\n"
"\n"
"Limits (a peer past one gets an error, or is disconnected):\n"
"      --max-packet BYTES    size of one packet (default %u)\n"
"      --max-fds N           fds in one packet (default %u)\n"
"      --max-inflight N      waiting gets per connection (default %u)\n"
"      --max-connections N   connections at once (default %u)\n"
"      --max-output BYTES    output queued to one peer (default %u)\n"
"      --list-page N         names per list answer (default %u)\n"
"      --max-tensors N       tensors per version (default %u)\n"
"      --max-buffers N       buffers per version (default %u, at most %u)\n"
"      --max-leases N        leases per connection (default %u)\n"
"      --max-bytes BYTES     daemon-owned buffer bytes (default: half of RAM)\n"
"      --max-buffer-bytes BYTES  size of one buffer (default 1 TiB)\n"
"\n"
"  -h, --help                show this help\n"
"  -V, --version             show the version\n",
		SERVER_MAX_PACKET_DEFAULT, SERVER_MAX_FDS_DEFAULT,
		SERVER_MAX_INFLIGHT_DEFAULT, SERVER_MAX_CONNECTIONS_DEFAULT,
		SERVER_MAX_OUTPUT_DEFAULT, SERVER_LIST_PAGE_DEFAULT,
		REGISTRY_MAX_TENSORS_DEFAULT, REGISTRY_MAX_BUFFERS_DEFAULT,
		REGISTRY_BUFFERS_HARD_MAX, REGISTRY_MAX_LEASES_DEFAULT);
}

enum {
	OPT_SOCKET_MODE = 256, OPT_DEFAULT_MODE, OPT_MAX_PACKET, OPT_MAX_FDS,
	OPT_MAX_INFLIGHT, OPT_MAX_CONNECTIONS, OPT_MAX_OUTPUT, OPT_LIST_PAGE,
	OPT_MAX_TENSORS, OPT_MAX_BUFFERS, OPT_MAX_LEASES, OPT_MAX_BYTES,
	OPT_MAX_BUFFER_BYTES,
};

static const struct option options[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "socket-mode", required_argument, NULL, OPT_SOCKET_MODE },
	{ "log-level", required_argument, NULL, 'l' },
	{ "default-mode", required_argument, NULL, OPT_DEFAULT_MODE },
	{ "max-packet", required_argument, NULL, OPT_MAX_PACKET },
	{ "max-fds", required_argument, NULL, OPT_MAX_FDS },
	{ "max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT },
	{ "max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS },
	{ "max-output", required_argument, NULL, OPT_MAX_OUTPUT },
	{ "list-page", required_argument, NULL, OPT_LIST_PAGE },
	{ "max-tensors", required_argument, NULL, OPT_MAX_TENSORS },
	{ "max-buffers", required_argument, NULL, OPT_MAX_BUFFERS },
	{ "max-leases", required_argument, NULL, OPT_MAX_LEASES },
	{ "max-bytes", required_argument, NULL, OPT_MAX_BYTES },
	{ "max-buffer-bytes", required_argument, NULL, OPT_MAX_BUFFER_BYTES },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

/* Parses an unsigned number in [lo, hi] (base 0: 0x.., 0.., decimal).
 * Returns 0 or -EINVAL. */
static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_mode(const char *s, unsigned mask, unsigned *out)
{
	unsigned long v;
	char *end;

	errno = 0;
	v = strtoul(s, &end, 8);
	if (!*s || errno || *end || (v & ~(unsigned long)mask))
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

static uv_signal_t sig_int, sig_term;
static struct server srv;

static void on_signal(uv_signal_t *h, int signum)
{
	log_notice("signal %d: shutting down", signum);
#ifdef DLSHARE_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1");
#endif
	uv_signal_stop(&sig_int);
	uv_signal_stop(&sig_term);
	uv_close((uv_handle_t *)&sig_int, NULL);
	uv_close((uv_handle_t *)&sig_term, NULL);
	server_shutdown(&srv);
}

static int parse_args(int argc, char **argv, struct server_config *cfg)
{
	struct server_limits *l = &cfg->limits;
	struct registry_limits *r = &cfg->registry;
	uint64_t v = 0;
	unsigned m;
	int c, lvl;

	while ((c = getopt_long(argc, argv, "s:l:hV", options, NULL)) != -1) {
		int bad = 0;

		switch (c) {
		case 's':
			cfg->socket_path = optarg;
			break;
		case OPT_SOCKET_MODE:
			bad = parse_mode(optarg, 0777, &m);
			cfg->socket_mode = m;
			break;
		case 'l':
			lvl = log_parse_level(optarg);
			bad = lvl < 0;
			if (!bad)
				log_set_level(lvl);
			break;
		case OPT_DEFAULT_MODE:
			bad = parse_mode(optarg, 0666, &m) || m == 0;
			r->default_mode = m;
			break;
		case OPT_MAX_PACKET:
			/* Above the kernel's default socket buffer a datagram
			 * cannot be sent at all. */
			bad = parse_u64(optarg, 4096, 200 * 1024, &v);
			l->max_packet = (uint32_t)v;
			break;
		case OPT_MAX_FDS:
			bad = parse_u64(optarg, 1, 64, &v);
			l->max_fds = (uint32_t)v;
			break;
		case OPT_MAX_INFLIGHT:
			bad = parse_u64(optarg, 1, 1u << 20, &v);
			l->max_inflight = (uint32_t)v;
			break;
		case OPT_MAX_CONNECTIONS:
			bad = parse_u64(optarg, 1, 1u << 20, &v);
			l->max_connections = (uint32_t)v;
			break;
		case OPT_MAX_OUTPUT:
			bad = parse_u64(optarg, 64 * 1024, UINT64_C(1) << 34, &v);
			l->max_output = v;
			break;
		case OPT_LIST_PAGE:
			bad = parse_u64(optarg, 1, 4096, &v);
			l->list_page = (uint32_t)v;
			break;
		case OPT_MAX_TENSORS:
			bad = parse_u64(optarg, 1, 1u << 20, &v);
			r->max_tensors = (uint32_t)v;
			break;
		case OPT_MAX_BUFFERS:
			bad = parse_u64(optarg, 1, REGISTRY_BUFFERS_HARD_MAX, &v);
			r->max_buffers = (uint32_t)v;
			break;
		case OPT_MAX_LEASES:
			bad = parse_u64(optarg, 1, 1u << 30, &v);
			r->max_leases = (uint32_t)v;
			break;
		case OPT_MAX_BYTES:
			bad = parse_u64(optarg, 0, UINT64_MAX, &v);
			r->max_bytes = v;
			break;
		case OPT_MAX_BUFFER_BYTES:
			bad = parse_u64(optarg, 1, INT64_MAX, &v);
			r->max_buffer_bytes = v;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("dlshared %s\n", DLSHARE_VERSION_STRING);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
		if (bad) {
			fprintf(stderr, "dlshared: invalid value for %s: '%s'\n",
				argv[optind - 1], optarg);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dlshared: unexpected argument '%s'\n",
			argv[optind]);
		usage(stderr);
		return -EINVAL;
	}
	if (r->max_buffers > l->max_fds) {
		fprintf(stderr, "dlshared: --max-buffers (%u) must not exceed "
			"--max-fds (%u)\n", r->max_buffers, l->max_fds);
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct server_config cfg;
	uv_loop_t *loop = uv_default_loop();
	int err;

	server_config_default(&cfg);
	if (parse_args(argc, argv, &cfg))
		return 2;
	/* libuv does not send with MSG_NOSIGNAL everywhere; we do, but a
	 * stray SIGPIPE must never kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stderr, NULL, _IOLBF, 0);

	err = server_init(&srv, loop, &cfg);
	if (!err)
		err = server_listen(&srv);
	if (err) {
		log_err("cannot start: %s", strerror(-err));
		server_deinit(&srv);
		return 1;
	}
	uv_signal_init(loop, &sig_int);
	uv_signal_init(loop, &sig_term);
	uv_signal_start(&sig_int, on_signal, SIGINT);
	uv_signal_start(&sig_term, on_signal, SIGTERM);
#ifdef DLSHARE_HAVE_SYSTEMD
	sd_notify(0, "READY=1");
#endif
	uv_run(loop, UV_RUN_DEFAULT);
	server_deinit(&srv);
	uv_loop_close(loop);
	log_notice("dlshared stopped");
	return 0;
}
