/* relay — dlbench's "relay" section: dlshare-relay between daemons on
 * loopback over UCX (UCX_TLS=tcp), beside its floor, ucx_perftest on the
 * same transport in the same run: a large version's propagation over
 * ucp_get of the same size, a 4 KiB version's over a UCX round trip
 * (ucp_am_lat), and one origin to 4 mirrors.
 *
 * Single-threaded caller (dlbench's main); consumers run in children.
 */
#ifndef DLSHARE_BENCH_RELAY_H
#define DLSHARE_BENCH_RELAY_H

/* Declares the section's figures and measures them: quick (smaller sizes,
 * fewer iterations), reps repeats. daemon_bin is dlshared's path, beside
 * which dlshare-relay is looked for (relay/dlshare-relay, dlshare-relay;
 * $DLBENCH_RELAY overrides). Without dlshare-relay the relay figures are
 * null ("skipped: dlshare-relay not built") and only the floors run;
 * without ucx_perftest the floors are null too. Returns 0, or -1 when a
 * measurement failed (said on stderr). */
int relay_section(int quick, int reps, const char *daemon_bin);

#endif
