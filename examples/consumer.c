/* consumer — follows a name: prints each new version as it is published.
 *
 *   example_consumer [NAME] [COUNT]
 *
 * A get with NEWER_THAN and a timeout parks in the daemon until a newer
 * version exists: nobody polls. The tensor is a DLPack DLManagedTensor;
 * calling its deleter releases the lease.
 */
#include <stdio.h>
#include <stdlib.h>

#include <dlshare/dlshare.h>

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "example/matrix";
	int count = argc > 2 ? atoi(argv[2]) : 3;
	dlshare_get_opts opts = {
		.select = DLSHARE_NEWER_THAN,
		.version = 0,
		.timeout_ms = 10000,
	};
	dlshare_client *c;
	int err = 0;

	if ((err = dlshare_connect(NULL, &c))) {
		fprintf(stderr, "connect: %s\n", dlshare_strerror(err));
		return 1;
	}
	for (int seen = 0; seen < count; seen++) {
		dlshare_bundle *b;
		DLManagedTensor *t;

		if ((err = dlshare_get(c, name, &opts, &b)))
			break;
		opts.version = dlshare_bundle_version(b);
		err = dlshare_bundle_export(b, 0, &t);
		dlshare_bundle_free(b); /* the tensor keeps the lease */
		if (err)
			break;

		const float *m = t->dl_tensor.data;
		printf("%s version %llu: %lld x %lld, first %.1f last %.1f\n",
		       name, (unsigned long long)opts.version,
		       (long long)t->dl_tensor.shape[0],
		       (long long)t->dl_tensor.shape[1], m[0],
		       m[t->dl_tensor.shape[0] * t->dl_tensor.shape[1] - 1]);
		t->deleter(t); /* done reading: release the lease */
	}
	if (err)
		fprintf(stderr, "%s: %s (%s)\n", name, dlshare_strerror(err),
			dlshare_last_error());
	dlshare_disconnect(c);
	return err ? 1 : 0;
}
