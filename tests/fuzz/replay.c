/* replay — runs a fuzz target over files without libFuzzer, so that a
 * normal build (gcc, ASan, valgrind) replays the seed corpus and every saved
 * regression through the same target code.
 *
 *   fuzz_X_replay [FILE|DIR]...
 *
 * Without arguments it replays the directories compiled in as
 * FUZZ_REPLAY_DIRS (colon-separated). Directories are read one level deep,
 * in name order, skipping dot files. A broken invariant aborts, which fails
 * the test; a clean run prints how many inputs ran.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static unsigned long ran;

/* Reads path whole. Returns 0 with *out (free it) and *len, or -errno. */
static int slurp(const char *path, uint8_t **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t cap = 0, n = 0;

	if (!f)
		return -errno;
	for (;;) {
		if (n == cap) {
			uint8_t *nb = realloc(buf, cap ? cap * 2 : 4096);

			if (!nb) {
				free(buf);
				fclose(f);
				return -ENOMEM;
			}
			buf = nb;
			cap = cap ? cap * 2 : 4096;
		}
		size_t got = fread(buf + n, 1, cap - n, f);

		n += got;
		if (got == 0)
			break;
	}
	fclose(f);
	*out = buf;
	*len = n;
	return 0;
}

static int run_file(const char *path)
{
	uint8_t *data = NULL;
	size_t len = 0;
	int err = slurp(path, &data, &len);

	if (err) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(-err));
		return 1;
	}
	if (getenv("FUZZ_REPLAY_VERBOSE"))
		fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
	LLVMFuzzerTestOneInput(data, len);
	free(data);
	ran++;
	return 0;
}

static int skip_dot(const struct dirent *de)
{
	return de->d_name[0] != '.';
}

static int run_path(const char *path)
{
	struct dirent **names;
	struct stat st;
	int n, bad = 0;

	if (stat(path, &st) < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path);
	n = scandir(path, &names, skip_dot, alphasort);
	if (n < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	for (int i = 0; i < n; i++) {
		char *p;

		if (asprintf(&p, "%s/%s", path, names[i]->d_name) < 0) {
			bad = 1;
		} else {
			if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
				bad |= run_file(p);
			free(p);
		}
		free(names[i]);
	}
	free(names);
	return bad;
}

int main(int argc, char **argv)
{
	int bad = 0;

	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			bad |= run_path(argv[i]);
	} else {
#ifdef FUZZ_REPLAY_DIRS
		char *dirs = strdup(FUZZ_REPLAY_DIRS), *save = NULL;

		if (!dirs)
			return 1;
		for (char *d = strtok_r(dirs, ":", &save); d;
		     d = strtok_r(NULL, ":", &save))
			bad |= run_path(d);
		free(dirs);
#else
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
#endif
	}
	printf("replay: %lu input(s), %s\n", ran, bad ? "with errors" : "ok");
	return bad;
}
