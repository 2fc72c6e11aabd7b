/* roles — the processes of the GPU benchmark. gpubench (the coordinator)
 * never calls CUDA itself: it starts the daemon, then runs each figure in
 * fresh processes of its own binary (fork + exec, --role), a producer and
 * a consumer talking to each other over a socket pair and to dlshared over
 * its socket, or a single process for the floor and the device probe.
 *
 * A role writes its results as lines on res_fd: "sample KEY VALUE" (one
 * repeat of a figure, in the figure's unit), "info TEXT", "device TEXT",
 * "nogpu TEXT". Its exit status: 0 done, 1 failed (said on stderr),
 * 3 the data moved was wrong, 4 no usable GPU (probe).
 */
#ifndef DLSHARE_BENCH_GPU_ROLES_H
#define DLSHARE_BENCH_GPU_ROLES_H

#include <stdint.h>

#define ROLE_EXIT_FAILED 1
#define ROLE_EXIT_WRONG_DATA 3
#define ROLE_EXIT_NO_GPU 4

struct role_args {
	const char *role;    /* probe, floor, producer, consumer */
	const char *figure;  /* import, spin, handoff (producer, consumer) */
	const char *sock;    /* the daemon's socket */
	int res_fd;          /* result lines go here */
	int peer_fd;         /* producer <-> consumer (SOCK_SEQPACKET) */
	uint64_t bytes;      /* tensor size, a multiple of 8 */
	int repeats;         /* timed repeats, after one untimed warm-up */
	int spin_ms;         /* spin: how long the producer's stream runs */
	int warm;            /* handoff: keep the allocation mapped */
	int corrupt;         /* test only: the producer writes a wrong seed */
	const char *tag;     /* suffix of the result keys ("1MiB") */
};

/* Runs one role; returns its exit status. */
int role_main(const struct role_args *a);

#endif
