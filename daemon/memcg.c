/* memcg — see memcg.h. */
#include "memcg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Walks from the group up to the hierarchy's root, keeping the tightest
 * limit. Returns 0 or -ENOENT. */
static int memcg_walk(int v2, uint64_t *limit, uint64_t *usage, char *where,
		      size_t n)
{
	const char *lim_file = v2 ? "memory.max" : "memory.limit_in_bytes";
	const char *use_file = v2 ? "memory.current" : "memory.usage_in_bytes";
	char mnt[1024], rel[2048], dir[4096];
	int64_t best = -1;
	size_t len;

	if (memcg_mount(v2, mnt, sizeof(mnt)) || memcg_path(v2, rel,
							     sizeof(rel)))
		return -ENOENT;
	for (;;) {
		int64_t l;

		snprintf(dir, sizeof(dir), "%s%s", mnt,
			 strcmp(rel, "/") == 0 ? "" : rel);
		l = read_num(dir, lim_file);
		if (l >= 0 && (best < 0 || l < best)) {
			best = l;
			*usage = (uint64_t)(read_num(dir, use_file) < 0 ? 0 :
					    read_num(dir, use_file));
			snprintf(where, n, "cgroup %s %s %s", v2 ? "v2" : "v1",
				 rel, lim_file);
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

int memcg_limit(uint64_t *limit, uint64_t *usage, char *where, size_t n)
{
	/* v2 where its hierarchy has the memory controller; else v1. */
	if (memcg_walk(1, limit, usage, where, n) == 0)
		return 0;
	return memcg_walk(0, limit, usage, where, n);
}
