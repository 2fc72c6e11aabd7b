/* consumer — a program built against an installed libdlshare (by
 * test_install.sh, through pkg-config and through find_package): it stores
 * a tensor, reads it back and compares, using only <dlshare/dlshare.h>.
 * Usage: consumer SOCKET NAME. Exit 0 and "ok" when the bytes match. */
#include <stdio.h>
#include <string.h>

#include <dlshare/dlshare.h>

int main(int argc, char **argv)
{
	int64_t shape[2] = { 3, 5 };
	dlshare_tensor_spec spec = { .key = "x", .dtype = { kDLFloat, 32, 1 },
				     .ndim = 2, .shape = shape };
	dlshare_get_opts opts = { .select = DLSHARE_LATEST };
	dlshare_client *c = NULL;
	dlshare_writer *w = NULL;
	DLManagedTensor *t = NULL;
	uint64_t version = 0;
	float *p;
	int err, bad = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: consumer SOCKET NAME\n");
		return 2;
	}
	if ((err = dlshare_connect(argv[1], &c)) != 0 ||
	    (err = dlshare_create(c, argv[2], &spec, 1, NULL, &w)) != 0)
		goto fail;
	p = dlshare_writer_tensor(w, 0)->data;
	for (int i = 0; i < 15; i++)
		p[i] = (float)i * 1.5f;
	if ((err = dlshare_seal(w, NULL, &version)) != 0 ||
	    (err = dlshare_get_tensor(c, argv[2], &opts, &t)) != 0)
		goto fail;
	p = (float *)((char *)t->dl_tensor.data + t->dl_tensor.byte_offset);
	for (int i = 0; i < 15; i++)
		bad |= p[i] != (float)i * 1.5f;
	t->deleter(t);
	dlshare_disconnect(c);
	if (bad) {
		fprintf(stderr, "consumer: the bytes read back differ\n");
		return 1;
	}
	printf("ok %s version %llu (libdlshare %s)\n", argv[2],
	       (unsigned long long)version, dlshare_version());
	return 0;
fail:
	fprintf(stderr, "consumer: %s: %s\n", dlshare_strerror(err),
		dlshare_last_error());
	dlshare_disconnect(c);
	return 1;
}
