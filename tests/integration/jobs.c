/* jobs — producer and consumer children. */
#include "jobs.h"

#include <stdlib.h>
#include <string.h>

#define JOB_MAX 16

int job_produce(const struct daemon_proc *d, void *arg)
{
	const struct job *j = arg;
	dlshare_client *c = util_child_connect(d);
	uint64_t version = 0;
	int slots[JOB_MAX];

	CHILD_CHECK(j->n <= JOB_MAX);
	if (j->mode == JOB_STORE) {
		dlshare_tensor_spec specs[JOB_MAX];
		dlshare_writer *w;

		for (size_t i = 0; i < j->n; i++) {
			specs[i].key = j->ts[i].key;
			specs[i].dtype = j->ts[i].dt;
			specs[i].ndim = j->ts[i].ndim;
			specs[i].shape = j->ts[i].shape;
		}
		CHILD_OK(dlshare_create(c, j->name, specs, j->n, NULL, &w));
		CHILD_CHECK(dlshare_writer_count(w) == j->n);
		CHILD_CHECK(dlshare_writer_tensor(w, j->n) == NULL);
		for (size_t i = 0; i < j->n; i++) {
			DLTensor *t = dlshare_writer_tensor(w, i);
			size_t nb = util_nbytes(j->ts[i].dt, j->ts[i].ndim,
						j->ts[i].shape);

			CHILD_CHECK(t != NULL);
			CHILD_CHECK(nb == 0 || t->data != NULL);
			/* Compact and aligned, as dlshare_create says. */
			CHILD_CHECK(((uintptr_t)t->data + t->byte_offset) % 64 == 0 ||
				    nb == 0);
			if (nb)
				harness_fill((char *)t->data + t->byte_offset,
					     nb, j->ts[i].seed);
		}
		uint64_t wv = dlshare_writer_version(w);
		CHILD_OK(dlshare_seal(w, NULL, &version));
		CHILD_CHECK(version == wv);
	} else {
		DLManagedTensor *ts[JOB_MAX];
		const char *keys[JOB_MAX];
		dlshare_publish_opts o = {
			.keys = keys, .flags = DLSHARE_PUBLISH_NO_COPY,
		};
		dlshare_name_info info;

		for (size_t i = 0; i < j->n; i++) {
			const struct tspec *s = &j->ts[i];

			CHILD_OK(dlshare_host_alloc(s->dt, s->ndim, s->shape,
						    &ts[i]));
			harness_fill(ts[i]->dl_tensor.data,
				     util_nbytes(s->dt, s->ndim, s->shape),
				     s->seed);
			keys[i] = s->key;
			slots[i] = util_track(ts[i]);
			CHILD_CHECK(slots[i] >= 0);
		}
		CHILD_OK(dlshare_publish(c, j->name, ts, j->n, &o, &version));
		CHILD_OK(dlshare_stat(c, j->name, &info, NULL));
		CHILD_CHECK(info.exported == 1);
		CHILD_CHECK(info.kind == DLSHARE_KIND_HOST);
		CHILD_CHECK(info.tensors == j->n);
		CHILD_CHECK(info.latest == version);
	}
	CHILD_CHECK(version >= 1);
	if (j->hold) {
		int64_t got = util_await(c, j->hold, 0, harness_ms(20000), NULL);

		CHILD_CHECK(got > 0);
		/* Still the newest version: nothing retired it. */
		for (size_t i = 0; j->mode == JOB_EXPORT && i < j->n; i++)
			CHILD_CHECK(util_deleted(slots[i]) == 0);
	}
	dlshare_disconnect(c);
	/* Exports still published go back to their deleters here, once. */
	for (size_t i = 0; j->mode == JOB_EXPORT && i < j->n; i++)
		CHILD_CHECK(util_deleted(slots[i]) == 1);
	return 0;
}

int job_check_bundle(const dlshare_bundle *b, const struct tspec *ts,
		     size_t n)
{
	if (dlshare_bundle_count(b) != n) {
		fprintf(stderr, "bundle has %zu tensors, want %zu\n",
			dlshare_bundle_count(b), n);
		return 1;
	}
	if (dlshare_bundle_tensor(b, n) || dlshare_bundle_key(b, n) ||
	    dlshare_bundle_find(b, "no-such-key") != DLSHARE_ENOENT) {
		fprintf(stderr, "bundle answers out of range\n");
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		const char *key = ts[i].key ? ts[i].key : "";
		int k = dlshare_bundle_find(b, key);

		if (strcmp(dlshare_bundle_key(b, i), key) != 0 ||
		    (*key && k != (int)i)) {
			fprintf(stderr, "tensor %zu: key '%s' (find %d), want "
				"'%s'\n", i, dlshare_bundle_key(b, i), k, key);
			return 1;
		}
		if (util_check(dlshare_bundle_tensor(b, i), ts[i].dt,
			       ts[i].ndim, ts[i].shape, ts[i].seed)) {
			fprintf(stderr, "tensor %zu ('%s') differs\n", i, key);
			return 1;
		}
	}
	return 0;
}

int job_consume(const struct daemon_proc *d, void *arg)
{
	const struct job *j = arg;
	dlshare_client *c = util_child_connect(d);
	dlshare_get_opts o = {
		.select = DLSHARE_NEWER_THAN, .version = j->after,
		.timeout_ms = j->timeout_ms,
	};
	DLManagedTensor *m[JOB_MAX];
	DLManagedTensorVersioned *mv[JOB_MAX];
	dlshare_bundle *b;

	CHILD_CHECK(j->n <= JOB_MAX);
	for (unsigned g = 0; g < (j->gets ? j->gets : 1); g++) {
		CHILD_OK(dlshare_get(c, j->name, &o, &b));
		CHILD_CHECK(dlshare_bundle_version(b) > j->after);
		CHILD_CHECK(!j->want_version ||
			    dlshare_bundle_version(b) == j->want_version);
		CHILD_CHECK(job_check_bundle(b, j->ts, j->n) == 0);
		/* The same version again, from a reader that has its fds. */
		o.select = DLSHARE_EXACT;
		o.version = dlshare_bundle_version(b);
		for (size_t i = 0; i < j->n; i++) {
			CHILD_OK(dlshare_bundle_export(b, i, &m[i]));
			CHILD_OK(dlshare_bundle_export_versioned(b, i, &mv[i]));
		}
		/* The managed tensors hold the lease on their own. */
		dlshare_bundle_free(b);
		for (size_t i = 0; i < j->n; i++) {
			const struct tspec *s = &j->ts[i];

			CHILD_CHECK(util_check(&m[i]->dl_tensor, s->dt, s->ndim,
					       s->shape, s->seed) == 0);
			CHILD_CHECK(util_check(&mv[i]->dl_tensor, s->dt,
					       s->ndim, s->shape, s->seed) == 0);
			CHILD_CHECK(mv[i]->version.major == 1);
			CHILD_CHECK(mv[i]->flags &
				    DLPACK_FLAG_BITMASK_READ_ONLY);
			m[i]->deleter(m[i]);
			mv[i]->deleter(mv[i]);
		}
	}
	dlshare_disconnect(c);
	return 0;
}
