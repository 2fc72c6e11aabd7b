/* dlshared — the dlshare daemon: settings, signals, systemd notifications
 * and the loop.
 *
 * Under systemd (Type=notify) it says READY=1 once the socket accepts,
 * keeps a one-line STATUS= current, pings the watchdog from the loop (so a
 * stuck loop gets the service restarted) and says STOPPING=1 on SIGTERM.
 * Loop thread only.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <uv.h>

#ifdef DLSHARE_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <dlshare/dlshare.h>

#include "config.h"
#include "log.h"
#include "memcg.h"
#include "server.h"
#include "wire.h"

/* STATUS= is refreshed this often (or at each watchdog ping when sooner). */
#define STATUS_INTERVAL_MS 5000

static uv_signal_t sig_int, sig_term;
static uv_timer_t tick;
static int ticking;
static struct server srv;

#ifdef DLSHARE_HAVE_SYSTEMD
static char last_status[256];

/* "3 connections, 12 names, 40 leases, 1.5 GiB": what an operator wants
 * from `systemctl status` at a glance. */
static void status_line(char *buf, size_t len)
{
	static const char units[][4] = { "B", "KiB", "MiB", "GiB", "TiB",
					 "PiB", "EiB" };
	double b = (double)srv.d.reg.bytes;
	int u = 0;

	while (b >= 1024 && u < 6) {
		b /= 1024;
		u++;
	}
	snprintf(buf, len, "%u connection%s, %llu name%s, %llu lease%s, "
		 "%.*f %s in buffers", srv.d.conns.n,
		 srv.d.conns.n == 1 ? "" : "s",
		 (unsigned long long)srv.d.reg.nnames,
		 srv.d.reg.nnames == 1 ? "" : "s",
		 (unsigned long long)srv.d.reg.nleases,
		 srv.d.reg.nleases == 1 ? "" : "s", u ? 1 : 0, b, units[u]);
}
#endif

/* The watchdog ping, when systemd asked for one, and STATUS= when it
 * changed: a few snprintfs and at most one datagram. */
static void on_tick(uv_timer_t *t)
{
	(void)t;
	log_flush();
#ifdef DLSHARE_HAVE_SYSTEMD
	char status[sizeof(last_status)], msg[sizeof(status) + 32];
	int wd = sd_watchdog_enabled(0, NULL) > 0;

	status_line(status, sizeof(status));
	if (strcmp(status, last_status) == 0) {
		if (wd)
			sd_notify(0, "WATCHDOG=1");
		return;
	}
	memcpy(last_status, status, sizeof(status));
	snprintf(msg, sizeof(msg), "%sSTATUS=%s", wd ? "WATCHDOG=1\n" : "",
		 status);
	sd_notify(0, msg);
#endif
}

/* Tells systemd we serve, and starts the timer. */
static void notify_ready(uv_loop_t *loop)
{
	uint64_t period = STATUS_INTERVAL_MS;

#ifdef DLSHARE_HAVE_SYSTEMD
	uint64_t usec = 0;
	char msg[sizeof(last_status) + 32];

	status_line(last_status, sizeof(last_status));
	snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", last_status);
	sd_notify(0, msg);
	/* Ping at half the interval systemd gave, as sd_watchdog_enabled(3)
	 * advises; the ping comes from the loop, so it stops with the loop. */
	if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
		uint64_t half = usec / 2000;

		if (half < 1)
			half = 1;
		if (half < period)
			period = half;
		log_info("watchdog: pinging every %llu ms",
			 (unsigned long long)period);
	}
#endif
	uv_timer_init(loop, &tick);
	uv_timer_start(&tick, on_tick, period, period);
	/* The timer alone must not keep the loop alive after shutdown. */
	uv_unref((uv_handle_t *)&tick);
	ticking = 1;
}

static void on_signal(uv_signal_t *h, int signum)
{
	(void)h;
	log_notice("signal %d: shutting down", signum);
#ifdef DLSHARE_HAVE_SYSTEMD
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
#endif
	uv_signal_stop(&sig_int);
	uv_signal_stop(&sig_term);
	uv_close((uv_handle_t *)&sig_int, NULL);
	uv_close((uv_handle_t *)&sig_term, NULL);
	if (ticking) {
		uv_timer_stop(&tick);
		uv_close((uv_handle_t *)&tick, NULL);
		ticking = 0;
	}
	/* Closes every connection: their leases and pending versions go. */
	server_shutdown(&srv);
}

/* Peers' buffers are fds: take every fd the hard limit allows (libuv
 * polls with epoll, so no fd number is too large). Under systemd
 * LimitNOFILE= sets both limits, and nothing is to be done. */
static void raise_nofile(void)
{
	struct rlimit rl;
	rlim_t old;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	old = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_warn("cannot raise RLIMIT_NOFILE from %llu to %llu: %s",
			 (unsigned long long)old,
			 (unsigned long long)rl.rlim_max, strerror(errno));
	else
		log_info("RLIMIT_NOFILE raised from %llu to %llu",
			 (unsigned long long)old,
			 (unsigned long long)rl.rlim_max);
}

/* config_from_args, with its error lines marked "<3>" when stderr is the
 * journal (the service's unit started it with a bad file), so that they
 * are logged as errors. */
static int parse_settings(struct config *cfg, int argc, char **argv,
			  enum config_action *action)
{
	char *errors = NULL, *line, *save = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&errors, &len);
	int r, journal = log_stderr_is_journal();

	r = config_from_args(cfg, argc, argv, stdout, err ? err : stderr,
			     action);
	if (!err)
		return r;
	fclose(err);
	for (line = strtok_r(errors, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save))
		fprintf(stderr, "%s%s\n", journal ? "<3>" : "", line);
	free(errors);
	return r;
}

int main(int argc, char **argv)
{
	struct config cfg;
	enum config_action action;
	uv_loop_t *loop;
	int err;

	config_init(&cfg);
	err = parse_settings(&cfg, argc, argv, &action);
	if (err) {
		config_deinit(&cfg);
		/* --check-config answers yes or no; otherwise 2 is a usage
		 * error, as for any command. */
		return action == CONFIG_CHECK ? 1 : 2;
	}
	switch (action) {
	case CONFIG_EXIT:
		config_deinit(&cfg);
		return 0;
	case CONFIG_CHECK:
		printf("dlshared: configuration is valid (%s)\n",
		       cfg.file ? cfg.file : "no file; defaults and flags");
		config_deinit(&cfg);
		return 0;
	case CONFIG_PRINT:
		config_print(&cfg, stdout);
		config_deinit(&cfg);
		return 0;
	case CONFIG_RUN:
		break;
	}

	log_set_level(cfg.log_level);
	log_set_prefix(cfg.log_prefix);
	log_set_rate_limit(cfg.log_rate);
	/* libuv does not send with MSG_NOSIGNAL everywhere; we do, but a
	 * stray SIGPIPE must never kill the daemon. */
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stderr, NULL, _IOLBF, 0);
	log_info("dlshared %s, configuration: %s", DLSHARE_VERSION_STRING,
		 cfg.file ? cfg.file : "none");

	raise_nofile();
	/* Where a refused create's message finds the memory limit: looked
	 * up once here, not by every refusal (memcg.h). */
	memcg_init();
	loop = uv_default_loop();
	err = server_init(&srv, loop, &cfg.server);
	if (!err)
		err = server_listen(&srv);
	if (err) {
		log_err("cannot start: %s", strerror(-err));
		server_deinit(&srv);
		config_deinit(&cfg);
		return 1;
	}
	uv_signal_init(loop, &sig_int);
	uv_signal_init(loop, &sig_term);
	uv_signal_start(&sig_int, on_signal, SIGINT);
	uv_signal_start(&sig_term, on_signal, SIGTERM);
	notify_ready(loop);
	uv_run(loop, UV_RUN_DEFAULT);
	server_deinit(&srv);
	uv_loop_close(loop);
	log_notice("dlshared stopped");
	log_flush();
	config_deinit(&cfg);
	return 0;
}
