/* figures — the dlshare side of the benchmarks: each function measures one
 * figure against a running dlshared, through the public API (libdlshare),
 * in child processes of its own, so the caller stays single-threaded and
 * may fork. The floor side is dlshare-floor (floor.c).
 *
 * Every function returns 0 or -1 (said on stderr). Caller's thread only.
 */
#ifndef DLSHARE_BENCH_FIGURES_H
#define DLSHARE_BENCH_FIGURES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util.h"

/* The name every latency and throughput figure gets: a 4 KiB float32
 * tensor. */
#define FIG_NAME "bench/t"
#define FIG_TENSOR_BYTES 4096u

/* Packet sizes of a get as dlshare sends them: the Get request, its reply
 * (without and with the buffer's fd), and the Release that follows. */
struct fig_packets {
	size_t get, reply, reply_fd, release;
};
void fig_packet_sizes(struct fig_packets *p);

/* Publishes a version of name holding one float32 tensor of bytes bytes
 * (store mode, filled). */
int fig_publish(const struct daemon_proc *d, const char *name,
		uint64_t bytes);

/* get + release of name, whose buffer the client already maps, iters times;
 * the p50 and p99 of one round trip in ns. */
int fig_get_latency(const struct daemon_proc *d, const char *name,
		    long iters, double *p50, double *p99);
/* The same with the client's reuse of a released get on (protocol 1.7,
 * the version board), which dlbench otherwise turns off for every client
 * (DLSHARE_NO_REUSE=1): nothing changes name, so each get after the first
 * is answered by the library. Fails unless the daemon counted fewer
 * requests than a tenth of the gets (reuse did not happen). */
int fig_get_latency_reused(const struct daemon_proc *d, const char *name,
			   long iters, double *p50, double *p99);

/* The first get of a new buffer (fd passing and mapping included): a
 * producer seals a new 4 KiB version, then the consumer gets it; iters
 * times. The p50 and p99 of the get in ns. */
int fig_first_get(const struct daemon_proc *d, long iters, double *p50,
		  double *p99);

/* fig_throughput, each client reading names "NAME.0" .. "NAME.<names-1>"
 * in turn (published by the caller); with reuse, with the version board's
 * reuse on (DLSHARE_NO_REUSE unset). For bench/callgrind-get: more names
 * in turn than a client keeps (8) make every get ask, with reuse on. */
int fig_throughput_names(const struct daemon_proc *d, const char *name,
			 int names, int reuse, int n, long ms,
			 double *ops_per_s);

/* get + release of name by n client processes at once for ms
 * milliseconds: round trips a second, all together. */
int fig_throughput(const struct daemon_proc *d, const char *name, int n,
		   long ms, double *ops_per_s);

/* Seal to consumer: a consumer process waits (parked get) for the next
 * version; the producer writes bytes bytes into a new version and seals
 * it. The time from the call to dlshare_seal() to the consumer's get
 * returning, iters times; each in ns into out (iters entries). With
 * exported, the producer writes a dlshare_host_alloc() tensor instead and
 * the clock starts at dlshare_publish() (export mode, no copy). With evict
 * > 0, the producer also writes evict bytes of other memory of its own
 * before each handoff, as a large version's writes do: the caches and TLBs
 * of the machine are then as cold for the handoff of bytes as for one of
 * evict bytes (see BENCHMARKS.md, "Issue 16, session 6"). */
int fig_handoff(const struct daemon_proc *d, uint64_t bytes, long iters,
		int exported, uint64_t evict, double *out);

/* Another client's worst get+release of a 4 KiB name (ns, into
 * *worst_ns) over 200 ms, 20 ms into which a written version of bytes
 * bytes that nobody maps is deleted: the daemon lets go of its memory then
 * (bytes 0: nothing is deleted, the same reader alone). */
int fig_free(const struct daemon_proc *d, uint64_t bytes, double *worst_ns);

/* dlshare_publish with DLSHARE_PUBLISH_COPY of a float32 tensor of bytes
 * bytes from written private memory, iters times (one name, each version
 * replacing the last): each call's time in ns into out. strided: the
 * tensor comes with explicit compact strides, as torch's do. */
int fig_publish_copy(const struct daemon_proc *d, uint64_t bytes,
		     int strided, long iters, double *out);

/* Registers n names "s/0000000".. (one float32[1] tensor each, store mode)
 * from threads connections at once. *seconds: how long it took. */
int fig_populate(const struct daemon_proc *d, long n, int threads,
		 double *seconds);

/* get + release over 64 of the n names of fig_populate spread evenly
 * (each mapped once first), round robin, iters times: the p50 in ns. */
int fig_get_spread(const struct daemon_proc *d, long n, long iters,
		   double *p50);

/* Starts a process holding n idle connections to d (each said Hello and
 * got its reply). Returns its pid once all are up (stop it with
 * fig_holder_stop), or -1. */
pid_t fig_idle_start(const struct daemon_proc *d, int n);
/* Lets a holder process go (its connections close) and reaps it. */
void fig_holder_stop(pid_t holder);

/* Wire level, without libdlshare: registers n names prefix0000000.. that
 * hold no fd in the daemon (exported cuda-ipc buffers whose handles nobody
 * opens: the registry's own cost, where RLIMIT_NOFILE forbids a memfd per
 * name). The names live while the returned process holds its connection
 * (stop it with fig_holder_stop). *seconds: how long registering took.
 * Returns the pid or -1. */
pid_t fig_raw_register(const struct daemon_proc *d, const char *prefix,
		       long n, double *seconds);
/* Wire level: Get, its reply, Release, over 64 of the n names of
 * fig_raw_register spread evenly (n == 0: the one name prefix), iters
 * times; the p50 in ns. */
int fig_raw_get(const struct daemon_proc *d, const char *prefix, long n,
		long iters, double *p50);

/* Kill storm: n client processes each hold `leases` leases on FIG_NAME;
 * all are SIGKILLed at once. *leases_ms: from the first kill to the
 * daemon's lease count back to 0; *conns_ms: to its connection count back
 * to 1 (the observer); *cpu_ms: the CPU time the daemon's event loop
 * ran from the first kill until the leases were back to 0 (NAN where
 * /proc/PID/schedstat cannot be read). */
int fig_storm(const struct daemon_proc *d, int n, int leases,
	      double *leases_ms, double *conns_ms, double *cpu_ms);

/* A state dict of n float32[16] tensors with 60-byte keys in one version
 * (a manifest memfd, protocol 1.4): the publish from plain memory (a copy
 * into one daemon buffer) in ms, the daemon's CPU time for it in ms, and
 * gets warm gets in ms (get_ms[gets]), each until every tensor is
 * reachable. */
int fig_bundle(const struct daemon_proc *d, long n, int gets,
	       double *publish_ms, double *daemon_cpu_ms, double *get_ms);

#endif
