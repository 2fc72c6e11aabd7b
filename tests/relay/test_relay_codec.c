/* test_relay_codec — the relay's SHA-256 and HMAC against FIPS 180-4 and
 * RFC 4231 vectors, its message codec against truncation and lies about
 * lengths, and its key file rules. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "config.h"
#include "msg.h"
#include "sha256.h"
#include "skip.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
	size_t i;

	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha(const char *msg, size_t n, const char *want)
{
	struct sha256 s;
	uint8_t d[32];
	char h[65];
	size_t i;

	sha256_init(&s);
	for (i = 0; i < n; i++)   /* in odd pieces */
		sha256_update(&s, msg, strlen(msg));
	sha256_final(&s, d);
	hex(d, 32, h);
	assert_string_equal(h, want);
}

static void test_sha256(void **state)
{
	(void)state;
	sha("", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	sha("abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
	    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	sha("a", 1000000,
	    "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_hmac(void **state)
{
	/* RFC 4231 test cases 1 and 6 (a key longer than a block) */
	uint8_t key1[20], key6[131], d[32];
	const char *m1 = "Hi There";
	const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
	const void *parts[2];
	size_t lens[2];
	char h[65];

	(void)state;
	memset(key1, 0x0b, sizeof(key1));
	memset(key6, 0xaa, sizeof(key6));
	parts[0] = m1;
	lens[0] = 3;
	parts[1] = m1 + 3;
	lens[1] = strlen(m1) - 3;
	hmac_sha256(key1, sizeof(key1), parts, lens, 2, d);
	hex(d, 32, h);
	assert_string_equal(h, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	parts[0] = m6;
	lens[0] = strlen(m6);
	hmac_sha256(key6, sizeof(key6), parts, lens, 1, d);
	hex(d, 32, h);
	assert_string_equal(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

/* A peer's words for our log: control bytes and non-ASCII become '?', and
 * no more than the buffer holds is written. */
static void test_printable(void **state)
{
	static const char in[] = "ok\n\x1b[2J\xff end";
	char out[8];

	(void)state;
	memset(out, 'x', sizeof(out));
	msg_printable(out, sizeof(out), in, sizeof(in) - 1);
	assert_string_equal(out, "ok??[2J");
	msg_printable(out, sizeof(out), in, 2);
	assert_string_equal(out, "ok");
	msg_printable(out, 1, in, sizeof(in) - 1);
	assert_string_equal(out, "");
}

static void test_codec(void **state)
{
	struct wbuf w;
	struct rbuf r;
	uint16_t type;
	size_t cut;

	(void)state;
	wbuf_start(&w, MSG_DONE);
	wbuf_u64(&w, 0x0102030405060708ull);
	wbuf_u32(&w, 2);
	wbuf_bytes(&w, "xy", 2);
	assert_int_equal(wbuf_finish(&w), 0);
	assert_int_equal(w.len, RELAY_HDR_LEN + 14);
	assert_int_equal(rbuf_open(&r, w.p, w.len, &type), 0);
	assert_int_equal(type, MSG_DONE);
	assert_int_equal(rbuf_u64(&r), 0x0102030405060708ull);
	assert_int_equal(rbuf_u32(&r), 2);
	assert_memory_equal(rbuf_bytes(&r, 2), "xy", 2);
	assert_int_equal(rbuf_left(&r), 0);
	assert_null(rbuf_bytes(&r, 1));
	assert_true(r.bad);
	/* every truncation, and a longer buffer, lie about the length */
	for (cut = 0; cut < w.len; cut++)
		assert_int_equal(rbuf_open(&r, w.p, cut, &type), -EPROTO);
	w.p[0] ^= 1;
	assert_int_equal(rbuf_open(&r, w.p, w.len, &type), -EPROTO);
	free(w.p);
}

static void test_key_file(void **state)
{
	char dir[] = "/tmp/relaykeyXXXXXX", path[64];
	struct relay_key k;
	FILE *devnull = fopen("/dev/null", "w");
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/key", dir);
	fd = open(path, O_WRONLY | O_CREAT, 0600);
	assert_int_equal(write(fd, "short\n", 6), 6);
	close(fd);
	assert_int_equal(auth_key_load(&k, path, devnull), -1);
	fd = open(path, O_WRONLY | O_TRUNC);
	assert_int_equal(write(fd, "0123456789abcdefXYZ\n\n", 21), 21);
	close(fd);
	assert_int_equal(auth_key_load(&k, path, devnull), 0);
	assert_int_equal(k.len, 19);
	chmod(path, 0640);
	assert_int_equal(auth_key_load(&k, path, devnull), -1);
	unlink(path);
	rmdir(dir);
	fclose(devnull);
}

static void test_addr(void **state)
{
	char host[64];
	uint16_t port;

	(void)state;
	assert_int_equal(config_split_addr("10.0.0.1:7000", host, sizeof(host), &port), 0);
	assert_string_equal(host, "10.0.0.1");
	assert_int_equal(port, 7000);
	assert_int_equal(config_split_addr("[::1]:9", host, sizeof(host), &port), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(config_split_addr("host", host, sizeof(host), &port), -1);
	assert_int_equal(config_split_addr("h:0", host, sizeof(host), &port), -1);
	assert_int_equal(config_split_addr("h:70000", host, sizeof(host), &port), -1);
}

static int parse(struct relay_config *c, FILE *err, ...)
{
	char *argv[32];
	va_list ap;
	int n = 0;

	argv[n++] = "dlshare-relay";
	va_start(ap, err);
	while ((argv[n] = va_arg(ap, char *)))
		n++;
	va_end(ap);
	config_init(c);
	return config_parse(c, n, argv, err, err);
}

static void test_config(void **state)
{
	char dir[] = "/tmp/relaycfgXXXXXX", path[64];
	struct relay_config c;
	FILE *devnull = fopen("/dev/null", "w"), *f;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/relay.conf", dir);
	f = fopen(path, "w");
	fputs("[relay]\nsocket = /tmp/a.sock\nkey-file = /k\nconnect = 10.0.0.1:7000\n"
	      "mirror = weights/\nmirror = data/\nchunk-size = 8M\nmode = 0600\n", f);
	fclose(f);
	/* the file, and the command line over it */
	assert_int_equal(parse(&c, devnull, "--config", path, "--max-inflight",
			       "4", "--mode", "0640", (char *)NULL), 0);
	assert_string_equal(c.socket_path, "/tmp/a.sock");
	assert_int_equal(c.npeers, 1);
	assert_int_equal(c.peers[0].nprefix, 2);
	assert_string_equal(c.peers[0].prefix[1], "data/");
	assert_int_equal(c.chunk_size, 8u << 20);
	assert_int_equal(c.max_inflight, 4);
	assert_int_equal(c.mode, 0640);
	config_deinit(&c);
	/* --help prints and says so */
	assert_int_equal(parse(&c, devnull, "--help", (char *)NULL), 1);
	config_deinit(&c);
	/* errors: a --mirror before any --connect, no key, a limit crossed,
	 * an unknown key in the file */
	assert_int_equal(parse(&c, devnull, "--mirror", "x/", "--connect",
			       "h:1", "--key-file", "k", (char *)NULL), -1);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", (char *)NULL), -1);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--max-inflight", "0", (char *)NULL), -1);
	config_deinit(&c);
	/* --inline-max: 64K by default, 0 and 1M allowed, 1M + 1 refused */
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", (char *)NULL), 0);
	assert_int_equal(c.inline_max, 64u << 10);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--inline-max", "0", (char *)NULL), 0);
	assert_int_equal(c.inline_max, 0);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--inline-max", "1M", (char *)NULL), 0);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--inline-max", "1048577", (char *)NULL), -1);
	config_deinit(&c);
	/* --metrics-file: none by default; --metrics-interval-s 15 by
	 * default, 1 to 3600; both from the INI file too */
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", (char *)NULL), 0);
	assert_null(c.metrics_file);
	assert_int_equal(c.metrics_interval_s, 15);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--metrics-interval-s", "0", (char *)NULL), -1);
	config_deinit(&c);
	assert_int_equal(parse(&c, devnull, "--listen", ":7000", "--key-file",
			       "k", "--metrics-interval-s", "3601", (char *)NULL),
			 -1);
	config_deinit(&c);
	f = fopen(path, "w");
	fputs("listen = :1\nkey-file = k\nmetrics-file = /run/r.prom\n"
	      "metrics-interval-s = 3600\n", f);
	fclose(f);
	assert_int_equal(parse(&c, devnull, "--config", path, (char *)NULL), 0);
	assert_string_equal(c.metrics_file, "/run/r.prom");
	assert_int_equal(c.metrics_interval_s, 3600);
	config_deinit(&c);
	f = fopen(path, "w");
	fputs("listen = :1\nkey-file = k\nbogus = 1\n", f);
	fclose(f);
	assert_int_equal(parse(&c, devnull, "--config", path, (char *)NULL), -1);
	config_deinit(&c);
	unlink(path);
	rmdir(dir);
	fclose(devnull);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256),
		cmocka_unit_test(test_hmac),
		cmocka_unit_test(test_codec),
		cmocka_unit_test(test_printable),
		cmocka_unit_test(test_key_file),
		cmocka_unit_test(test_addr),
		cmocka_unit_test(test_config),
	};

	return test_run_group("relay_codec", tests, NULL, NULL);
}
