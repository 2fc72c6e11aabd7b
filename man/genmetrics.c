/* dlshare_manmetrics — prints the metric families of `dlsharectl metrics`
 * (client/metrics.c's table) as man(7) paragraphs for dlsharectl(1), so
 * that the page cannot drift from the code. Run at build time only; not
 * installed. */
#include <stdio.h>

#include "metrics.h"

int main(void)
{
	metrics_print_man(stdout);
	return fflush(stdout) ? 1 : 0;
}
