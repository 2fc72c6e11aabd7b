/* memcg — the memory cgroup limit this process is under (v1 or v2), for
 * the message of a create the daemon could not back. memcg_init finds the
 * hierarchies' mounts (/proc/self/mountinfo, once) and the group whose
 * limit is the tightest, at start; a refusal then reads /proc/self/cgroup
 * and that group's two small files (or nothing more when no limit was
 * found), and walks the hierarchy again only when the process moved to
 * another group or the answer is older than MEMCG_CACHE_MS: a peer that
 * keeps making creates fail cannot make the loop parse mountinfo or walk
 * cgroupfs each time. Plain file reads; one thread (the loop's) after
 * memcg_init.
 */
#ifndef DLSHARE_MEMCG_H
#define DLSHARE_MEMCG_H

#include <stddef.h>
#include <stdint.h>

/* How long a walk's answer (which group sets the limit) is trusted. */
#define MEMCG_CACHE_MS 10000

/* Finds the mounts and walks once. Call before memcg_limit (without it,
 * the first memcg_limit does it). */
void memcg_init(void);

/* The tightest memory limit of this process's memory cgroup and its
 * ancestors: *limit in bytes, *usage of the group that sets it, and where
 * (e.g. "cgroup v2 /system.slice/dlshared.service memory.max", at most n
 * bytes). Returns 0, or -ENOENT when no limit is set or none can be read
 * (no memory controller, no access). */
int memcg_limit(uint64_t *limit, uint64_t *usage, char *where, size_t n);

#endif
