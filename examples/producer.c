/* producer — publishes a float32 matrix under a name, once a second.
 *
 *   example_producer [NAME] [COUNT]
 *
 * Store mode: the daemon makes the buffer, we write into it, seal it, and
 * the version outlives this process. Start dlshared first; both find the
 * socket by the same default rule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <dlshare/dlshare.h>

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "example/matrix";
	int count = argc > 2 ? atoi(argv[2]) : 3;
	int64_t shape[2] = { 4, 8 };
	dlshare_tensor_spec spec = {
		.key = "matrix",
		.dtype = { .code = kDLFloat, .bits = 32, .lanes = 1 },
		.ndim = 2,
		.shape = shape,
	};
	dlshare_client *c;
	int err;

	if ((err = dlshare_connect(NULL, &c))) {
		fprintf(stderr, "connect: %s\n", dlshare_strerror(err));
		return 1;
	}
	for (int round = 0; round < count; round++) {
		dlshare_writer *w;
		uint64_t version;

		/* 1. Ask the daemon for a buffer laid out for our tensor. */
		if ((err = dlshare_create(c, name, &spec, 1, NULL, &w)))
			break;
		/* 2. Write the data straight into it: no copy later. */
		float *m = dlshare_writer_tensor(w, 0)->data;
		for (int i = 0; i < 4 * 8; i++)
			m[i] = (float)(round * 100 + i);
		/* 3. Seal: the version becomes immutable and visible. */
		if ((err = dlshare_seal(w, NULL, &version)))
			break;
		printf("published %s version %llu\n", name,
		       (unsigned long long)version);
		fflush(stdout);
		if (round + 1 < count)
			sleep(1);
	}
	if (err)
		fprintf(stderr, "%s: %s (%s)\n", name, dlshare_strerror(err),
			dlshare_last_error());
	dlshare_disconnect(c);
	return err ? 1 : 0;
}
