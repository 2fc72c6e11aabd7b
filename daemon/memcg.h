/* memcg — the memory cgroup limit this process is under (v1 or v2), read
 * from /proc/self/cgroup, /proc/self/mountinfo and the cgroup files, for
 * the message of a create the daemon could not back. Plain file reads, any
 * thread; called only on that refusal, never per request.
 */
#ifndef DLSHARE_MEMCG_H
#define DLSHARE_MEMCG_H

#include <stddef.h>
#include <stdint.h>

/* The tightest memory limit of this process's memory cgroup and its
 * ancestors: *limit in bytes, *usage of the group that sets it, and where
 * (e.g. "cgroup v2 /system.slice/dlshared.service memory.max", at most n
 * bytes). Returns 0, or -ENOENT when no limit is set or none can be read
 * (no memory controller, no access). */
int memcg_limit(uint64_t *limit, uint64_t *usage, char *where, size_t n);

#endif
