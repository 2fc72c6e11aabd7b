/* dlshared_manopts — prints text made from dlshared's option table, so that
 * the man pages and the example configuration file cannot drift from the
 * code: "flags" (dlshared(8)), "keys" (dlshared.conf(5)) or "example" (an
 * example dlshared.conf). Run at build time only; not installed. */
#include <stdio.h>
#include <string.h>

#include "config.h"

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "flags") == 0)
		config_print_man(stdout, 0);
	else if (argc == 2 && strcmp(argv[1], "keys") == 0)
		config_print_man(stdout, 1);
	else if (argc == 2 && strcmp(argv[1], "example") == 0)
		config_print_example(stdout);
	else {
		fputs("usage: dlshared_manopts flags|keys|example\n", stderr);
		return 2;
	}
	return fflush(stdout) ? 1 : 0;
}
