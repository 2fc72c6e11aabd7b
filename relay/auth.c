/* auth — key file and proofs. */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int auth_key_load(struct relay_key *key, const char *path, FILE *err)
{
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		fprintf(err, "dlshare-relay: key file %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		fprintf(err, "dlshare-relay: key file %s: not a regular file\n",
			path);
		goto fail;
	}
	if (st.st_mode & 077) {
		fprintf(err, "dlshare-relay: key file %s has mode %04o: it must "
			"not be accessible by group or other (chmod 600 %s)\n",
			path, (unsigned)(st.st_mode & 07777), path);
		goto fail;
	}
	while (len < sizeof(key->k)) {
		n = read(fd, key->k + len, sizeof(key->k) - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(err, "dlshare-relay: key file %s: %s\n", path,
				strerror(errno));
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	while (len && (key->k[len - 1] == '\n' || key->k[len - 1] == '\r' ||
		       key->k[len - 1] == ' ' || key->k[len - 1] == '\t'))
		len--;
	if (len < RELAY_KEY_MIN) {
		fprintf(err, "dlshare-relay: key file %s: the key has %zu bytes, "
			"fewer than the %d it needs (e.g. head -c 32 /dev/urandom "
			"| base64 > %s)\n", path, len, RELAY_KEY_MIN, path);
		return -1;
	}
	key->len = len;
	return 0;
fail:
	close(fd);
	return -1;
}

int auth_random(void *p, size_t n)
{
	uint8_t *b = p;

	while (n) {
		ssize_t r = getrandom(b, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

void auth_proof(const struct relay_key *key, const char *role,
		const uint8_t nonce_m[RELAY_NONCE_LEN],
		const uint8_t nonce_s[RELAY_NONCE_LEN],
		uint8_t out[SHA256_LEN])
{
	static const char tag[] = "dlshare-relay/1 ";
	const void *parts[4] = { tag, role, nonce_m, nonce_s };
	size_t lens[4] = { sizeof(tag) - 1, strlen(role) + 1, RELAY_NONCE_LEN,
			   RELAY_NONCE_LEN };

	hmac_sha256(key->k, key->len, parts, lens, 4, out);
}
