// test_header_cxx — include/dlshare/dlshare.h compiles as C++17 with
// -Wall -Wextra -Wpedantic -Werror (the build fails otherwise), and so does
// the README's "C API in a page" snippet, copied below as it stands there
// (it is C that is also C++: no designated initializers, which C++17 lacks
// and g++ -Wpedantic warns about). The snippet is compiled, not run: it
// needs a daemon. Running the binary checks that it links.
#include <cstdio>

#include <dlshare/dlshare.h>

// ---- README.md, "C API in a page" (keep in step) -------------------------
static void readme_snippet(void)
{
	dlshare_client *c;
	dlshare_connect(NULL, &c);                     /* NULL: the default socket */

	/* Producer, store mode: key, dtype, ndim, shape. */
	int64_t shape[2] = { 4, 8 };
	dlshare_tensor_spec spec = { "w", { kDLFloat, 32, 1 }, 2, shape };
	dlshare_writer *w;
	dlshare_create(c, "model/w", &spec, 1, NULL, &w);
	float *p = (float *)dlshare_writer_tensor(w, 0)->data; /* write here */
	p[0] = 1.0f;
	dlshare_seal(w, NULL, NULL);                   /* immutable and visible */

	/* Consumer: wait up to 5 s for a version newer than 3
	 * (select, version, timeout_ms, stream). */
	dlshare_get_opts o = { DLSHARE_NEWER_THAN, 3, 5000, NULL };
	DLManagedTensor *t;
	int err = dlshare_get_tensor(c, "model/w", &o, &t);
	if (err)
		fprintf(stderr, "%s: %s\n", dlshare_strerror(err), dlshare_last_error());
	else
		t->deleter(t);                         /* releases the lease */

	dlshare_disconnect(c);
}
// ---------------------------------------------------------------------------

int main(int argc, char **)
{
	if (argc > 1) // never: the snippet needs a daemon
		readme_snippet();
	dlshare_connect_opts o = { sizeof(o), 100 };
	(void)o;
	std::printf("dlshare.h %s compiled as C++17\n", DLSHARE_VERSION_STRING);
	return 0;
}
