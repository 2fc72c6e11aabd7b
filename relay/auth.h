/* auth — the relay's pre-shared key and its challenge-response proofs
 * (docs/protocol.md, "The relay protocol (1.5)"). Main thread. */
#ifndef DLSHARE_RELAY_AUTH_H
#define DLSHARE_RELAY_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "msg.h"
#include "sha256.h"

#define RELAY_KEY_MIN 16    /* bytes of a key, after trailing whitespace */
#define RELAY_KEY_MAX 4096

struct relay_key {
	uint8_t k[RELAY_KEY_MAX];
	size_t len;
};

/* Reads the key from path: refused when the file is readable or writable
 * by group or other (like ssh's private keys), not a regular file, or the
 * key is shorter than RELAY_KEY_MIN. Returns 0 or -1 after a message on
 * err. */
int auth_key_load(struct relay_key *key, const char *path, FILE *err);

/* Fills n random bytes (getrandom). Returns 0 or -errno. */
int auth_random(void *p, size_t n);

/* The proof of role ("server" or "mirror") over both nonces:
 * HMAC-SHA256(key, "dlshare-relay/1 " role 0x00 nonce_m nonce_s). */
void auth_proof(const struct relay_key *key, const char *role,
		const uint8_t nonce_m[RELAY_NONCE_LEN],
		const uint8_t nonce_s[RELAY_NONCE_LEN],
		uint8_t out[SHA256_LEN]);

#endif
