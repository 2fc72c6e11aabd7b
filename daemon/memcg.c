/* memcg — see memcg.h. */
#include "memcg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A v1 limit at or above this is "none" (the kernel shows the page
 * counter's maximum, 2^63 rounded down to a page). */
#define MEMCG_V1_NONE (UINT64_C(1) << 62)

/* The group's path in the hierarchy (v2: "0::/x"; v1: "N:...memory...:/x")
 * into path. Returns 0 or -ENOENT. */
static int memcg_path(int v2, char *path, size_t n)
{
	char line[1024];
	FILE *f = fopen("/proc/self/cgroup", "re");
	int found = 0;

	if (!f)
		return -ENOENT;
	while (!found && fgets(line, sizeof(line), f)) {
		char *ctl = strchr(line, ':'), *p;

		if (!ctl || !(p = strchr(++ctl, ':')))
			continue;
		*p++ = '\0';
		p[strcspn(p, "\n")] = '\0';
		if (v2 ? strcmp(line, "0") == 0 && *ctl == '\0' :
			 strstr(ctl, "memory") != NULL) {
			snprintf(path, n, "%s", p);
			found = 1;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* The mount point of the hierarchy (v2: fstype cgroup2; v1: cgroup with
 * the memory option) into mnt. Returns 0 or -ENOENT. */
static int memcg_mount(int v2, char *mnt, size_t n)
{
	char line[2048];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	int found = 0;

	if (!f)
		return -ENOENT;
	while (!found && fgets(line, sizeof(line), f)) {
		char *sep = strstr(line, " - "), *fields[5] = { 0 }, *save;
		char *tok, *rest, *type, *opts;
		int i = 0;

		if (!sep)
			continue;
		*sep = '\0';
		rest = sep + 3;
		for (tok = strtok_r(line, " ", &save); tok && i < 5;
		     tok = strtok_r(NULL, " ", &save))
			fields[i++] = tok;
		type = strtok_r(rest, " ", &save);
		(void)strtok_r(NULL, " ", &save); /* the source */
		opts = strtok_r(NULL, " \n", &save);
		if (i < 5 || !type)
			continue;
		if (v2 ? strcmp(type, "cgroup2") == 0 :
			 strcmp(type, "cgroup") == 0 && opts &&
			 strstr(opts, "memory")) {
			snprintf(mnt, n, "%s", fields[4]);
			found = 1;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* The number in dir/file; "max" and unreadable files are none (-1). */
static int64_t read_num(const char *dir, const char *file)
{
	char path[4096 + 64], buf[64];
	FILE *f;
	char *end;
	unsigned long long v;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (!(f = fopen(path, "re")))
		return -1;
	if (!fgets(buf, sizeof(buf), f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	v = strtoull(buf, &end, 10);
	if (end == buf)
		return -1;
	return v >= MEMCG_V1_NONE ? -1 : (int64_t)v;
}

/* What memcg_init found, and the last walk's answer. */
static struct {
	int init;
	char mnt[2][1024];       /* [v2]: the hierarchy's mount, "" if none */
	int v2;                  /* the hierarchy of the cached answer */
	int have;                /* an answer is cached */
	char rel[2048];          /* the process's group when it was walked */
	char dir[4096];          /* the group that sets the limit */
	char where[2048 + 64];
	uint64_t walked_ms;
} cache;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Walks from the group rel up to the hierarchy's root, keeping the
 * tightest limit, and caches which group it is. Returns 0 or -ENOENT. */
static int memcg_walk(int v2, const char *group, uint64_t *limit,
		      uint64_t *usage)
{
	const char *lim_file = v2 ? "memory.max" : "memory.limit_in_bytes";
	const char *use_file = v2 ? "memory.current" : "memory.usage_in_bytes";
	const char *mnt = cache.mnt[v2];
	char rel[2048], dir[4096];
	int64_t best = -1;
	size_t len;

	if (!*mnt)
		return -ENOENT;
	snprintf(rel, sizeof(rel), "%s", group);
	for (;;) {
		int64_t l;

		snprintf(dir, sizeof(dir), "%s%s", mnt,
			 strcmp(rel, "/") == 0 ? "" : rel);
		l = read_num(dir, lim_file);
		if (l >= 0 && (best < 0 || l < best)) {
			int64_t u = read_num(dir, use_file);

			best = l;
			*usage = u < 0 ? 0 : (uint64_t)u;
			snprintf(cache.dir, sizeof(cache.dir), "%s", dir);
			snprintf(cache.where, sizeof(cache.where),
				 "cgroup %s %s %s", v2 ? "v2" : "v1", rel,
				 lim_file);
		}
		if (strcmp(rel, "/") == 0 || !*rel)
			break;
		len = strlen(rel);
		while (len > 1 && rel[len - 1] != '/')
			len--;
		rel[len > 1 ? len - 1 : 1] = '\0';
	}
	if (best < 0)
		return -ENOENT;
	*limit = (uint64_t)best;
	cache.v2 = v2;
	cache.have = 1;
	snprintf(cache.rel, sizeof(cache.rel), "%s", group);
	cache.walked_ms = now_ms();
	return 0;
}

/* The walk, v2 where its hierarchy has the memory controller, else v1. */
static int memcg_find(uint64_t *limit, uint64_t *usage)
{
	char rel[2048];

	cache.have = 0;
	for (int v2 = 1; v2 >= 0; v2--)
		if (memcg_path(v2, rel, sizeof(rel)) == 0 &&
		    memcg_walk(v2, rel, limit, usage) == 0)
			return 0;
	return -ENOENT;
}

void memcg_init(void)
{
	uint64_t limit, usage;

	cache.init = 1;
	for (int v2 = 0; v2 < 2; v2++)
		if (memcg_mount(v2, cache.mnt[v2], sizeof(cache.mnt[v2])))
			cache.mnt[v2][0] = '\0';
	memcg_find(&limit, &usage);
}

int memcg_limit(uint64_t *limit, uint64_t *usage, char *where, size_t n)
{
	const char *lim_file, *use_file;
	char rel[2048];
	int64_t l, u;

	if (!cache.init)
		memcg_init();
	/* The cached group, while the process is still in the group it was
	 * found from and the answer is fresh: its two files only. */
	if (cache.have && now_ms() - cache.walked_ms < MEMCG_CACHE_MS &&
	    memcg_path(cache.v2, rel, sizeof(rel)) == 0 &&
	    strcmp(rel, cache.rel) == 0) {
		lim_file = cache.v2 ? "memory.max" : "memory.limit_in_bytes";
		use_file = cache.v2 ? "memory.current" :
				      "memory.usage_in_bytes";
		l = read_num(cache.dir, lim_file);
		u = read_num(cache.dir, use_file);
		if (l >= 0) {
			*limit = (uint64_t)l;
			*usage = u < 0 ? 0 : (uint64_t)u;
			snprintf(where, n, "%s", cache.where);
			return 0;
		}
	}
	if (memcg_find(limit, usage))
		return -ENOENT;
	snprintf(where, n, "%s", cache.where);
	return 0;
}
