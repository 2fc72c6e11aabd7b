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
	int walked;              /* a walk's answer is cached */
	int found;               /* it found a limit (else: none is set) */
	int v2;                  /* the hierarchy of the limit found */
	char rel[2][2048];       /* [v2]: the group walked from, "" if none */
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

static const char *lim_file(int v2)
{
	return v2 ? "memory.max" : "memory.limit_in_bytes";
}

static const char *use_file(int v2)
{
	return v2 ? "memory.current" : "memory.usage_in_bytes";
}

/* Walks from cache.rel[v2] up to the hierarchy's root, keeping the
 * tightest limit and which group sets it. Returns 0 or -ENOENT. */
static int memcg_walk(int v2, uint64_t *limit, uint64_t *usage)
{
	const char *mnt = cache.mnt[v2];
	char rel[2048], dir[4096];
	int64_t best = -1;
	size_t len;

	if (!*mnt || !*cache.rel[v2])
		return -ENOENT;
	snprintf(rel, sizeof(rel), "%s", cache.rel[v2]);
	for (;;) {
		int64_t l;

		snprintf(dir, sizeof(dir), "%s%s", mnt,
			 strcmp(rel, "/") == 0 ? "" : rel);
		l = read_num(dir, lim_file(v2));
		if (l >= 0 && (best < 0 || l < best)) {
			int64_t u = read_num(dir, use_file(v2));

			best = l;
			*usage = u < 0 ? 0 : (uint64_t)u;
			snprintf(cache.dir, sizeof(cache.dir), "%s", dir);
			snprintf(cache.where, sizeof(cache.where),
				 "cgroup %s %s %s", v2 ? "v2" : "v1", rel,
				 lim_file(v2));
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
	return 0;
}

/* This process's group in each hierarchy with a mount into rel ("" where
 * it has none). */
static void memcg_groups(char rel[2][2048])
{
	for (int v2 = 0; v2 < 2; v2++)
		if (!*cache.mnt[v2] || memcg_path(v2, rel[v2], sizeof(rel[v2])))
			rel[v2][0] = '\0';
}

/* The walk, v2 where its hierarchy has the memory controller, else v1;
 * its answer, a limit or none, is cached. */
static int memcg_find(uint64_t *limit, uint64_t *usage)
{
	memcg_groups(cache.rel);
	cache.walked = 1;
	cache.walked_ms = now_ms();
	cache.found = 0;
	for (int v2 = 1; v2 >= 0; v2--)
		if (memcg_walk(v2, limit, usage) == 0) {
			cache.found = 1;
			cache.v2 = v2;
			return 0;
		}
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
	char rel[2][2048];
	int64_t l, u;

	if (!cache.init)
		memcg_init();
	/* The cached answer while it is fresh and the process is still in
	 * the groups it was found from: the limit's two files, or nothing
	 * when there was no limit. */
	if (cache.walked && now_ms() - cache.walked_ms < MEMCG_CACHE_MS) {
		memcg_groups(rel);
		if (strcmp(rel[0], cache.rel[0]) == 0 &&
		    strcmp(rel[1], cache.rel[1]) == 0) {
			if (!cache.found)
				return -ENOENT;
			l = read_num(cache.dir, lim_file(cache.v2));
			u = read_num(cache.dir, use_file(cache.v2));
			if (l >= 0) {
				*limit = (uint64_t)l;
				*usage = u < 0 ? 0 : (uint64_t)u;
				snprintf(where, n, "%s", cache.where);
				return 0;
			}
		}
	}
	if (memcg_find(limit, usage))
		return -ENOENT;
	snprintf(where, n, "%s", cache.where);
	return 0;
}
