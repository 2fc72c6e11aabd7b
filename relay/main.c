/* dlshare-relay — mirrors dlshare names between nodes over UCX. */
#include <signal.h>
#include <stdio.h>

#include "config.h"
#include "relay.h"

int main(int argc, char **argv)
{
	struct relay_config cfg;
	sigset_t mask;
	int r;

	/* SIGINT and SIGTERM are read from a signalfd by the loop: blocked
	 * from the start, so that one that comes early still stops the
	 * relay cleanly (relay_run blocks them in every thread it starts) */
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	config_init(&cfg);
	r = config_parse(&cfg, argc, argv, stdout, stderr);
	if (r) {
		config_deinit(&cfg);
		return r > 0 ? 0 : 2;
	}
	r = relay_run(&cfg);
	config_deinit(&cfg);
	return r;
}
