/* jobs — producer and consumer children that several test files use: a
 * version of tensors described by a table, published in store or export
 * mode by one process and checked bit for bit by another. Child side only
 * (they _exit through CHILD_*), except for the tables.
 */
#ifndef DLSHARE_TEST_JOBS_H
#define DLSHARE_TEST_JOBS_H

#include "util.h"

struct tspec {
	const char *key;
	DLDataType dt;
	int ndim;
	int64_t shape[4];
	uint32_t seed;
};

enum { JOB_STORE, JOB_EXPORT };

struct job {
	const char *name;
	const struct tspec *ts;
	size_t n;
	int mode;              /* JOB_STORE or JOB_EXPORT */
	const char *hold;      /* producer: stay connected until this name has
				* a version (export data lives that long) */
	uint64_t after;        /* consumer: a version newer than this */
	int timeout_ms;        /* consumer: how long to wait for it */
	uint64_t want_version; /* consumer: 0 or the version it must get */
	unsigned gets;         /* consumer: gets of it on one connection
				* (0: one); the later ones need no fd */
};

/* Publishes job->ts as one version of job->name; with hold, waits for it
 * and checks that export deleters ran exactly once at disconnect. */
int job_produce(const struct daemon_proc *d, void *job);
/* Gets the version and checks count, keys, dtypes, shapes, strides and
 * bytes, through the bundle and through exported managed tensors that
 * outlive it; as often as job->gets says, each a get of that version. */
int job_consume(const struct daemon_proc *d, void *job);

/* The checks of job_consume on a bundle. Returns 0 or 1. */
int job_check_bundle(const dlshare_bundle *b, const struct tspec *ts,
		     size_t n);

#endif
