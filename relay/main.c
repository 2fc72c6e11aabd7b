/* dlshare-relay — mirrors dlshare names between nodes over UCX. */
#include <stdio.h>

#include "config.h"
#include "relay.h"

int main(int argc, char **argv)
{
	struct relay_config cfg;
	int r;

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
