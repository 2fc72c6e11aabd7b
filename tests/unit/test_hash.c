/* test_hash — util/hash: SipHash against its paper's vectors, a key of its
 * own in every process, and the property the tables need: keys that share
 * a bucket under a public hash (uthash's Jenkins hash, the multiplication
 * the id tables used) spread under ours. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hashtab.h"

/* SipHash-2-4 with the key 00 01 .. 0f, of the messages 00 01 .. (n-1):
 * the first values of the reference implementation's vector table and
 * the paper's worked example (Appendix A, 15 bytes). */
static void test_siphash24_vectors(void **state)
{
	static const struct {
		size_t n;
		uint64_t want;
	} v[] = {
		{ 0, 0x726fdb47dd0e0e31ull },
		{ 1, 0x74f839c593dc67fdull },
		{ 2, 0x0d6c8009d9a94f5aull },
		{ 15, 0xa129ca6149be45e5ull },
	};
	uint64_t key[2];
	unsigned char k[16], msg[64];
	(void)state;

	for (int i = 0; i < 16; i++)
		k[i] = (unsigned char)i;
	memcpy(key, k, sizeof(key)); /* little-endian words */
	for (int i = 0; i < 64; i++)
		msg[i] = (unsigned char)i;
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		assert_int_equal(util_siphash(msg, v[i].n, key, 2, 4),
				 v[i].want);
}

/* Every byte and the length count: no two of these inputs agree. */
static void test_bytes_all_count(void **state)
{
	unsigned char a[40] = { 0 };
	uint64_t seen[41 + 40 * 8];
	size_t n = 0;
	(void)state;

	for (size_t len = 0; len <= 40; len++)
		seen[n++] = util_hash_bytes(a, len);
	for (size_t i = 0; i < 40; i++) {
		for (int b = 0; b < 8; b++) {
			a[i] ^= (unsigned char)(1u << b);
			seen[n++] = util_hash_bytes(a, 40);
			a[i] ^= (unsigned char)(1u << b);
		}
	}
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++)
			assert_true(seen[i] != seen[j]);
}

/* The key is set before main, the multiplier odd, and another process
 * draws another one. */
static void test_key_per_process(void **state)
{
	char line[128], mine[128], self[4096], cmd[4200];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	FILE *p;
	(void)state;

	assert_true(n > 0);
	self[n] = '\0';

	assert_true(util_hash_key[0] | util_hash_key[1]);
	assert_true(util_hash_key[3] & 1);
	snprintf(mine, sizeof(mine), "%016llx%016llx\n",
		 (unsigned long long)util_hash_key[0],
		 (unsigned long long)util_hash_key[1]);
	snprintf(cmd, sizeof(cmd), "'%s' --print-key", self);
	p = popen(cmd, "r");
	assert_non_null(p);
	assert_non_null(fgets(line, sizeof(line), p));
	assert_int_equal(pclose(p), 0);
	assert_int_equal(strlen(line), 33);
	assert_string_not_equal(line, mine);
}

struct item {
	char name[32];
	UT_hash_handle hh;
};

/* The longest chain of a table of n names, as uthash keeps it. */
static unsigned longest_chain(struct item *items, size_t n)
{
	struct item *t = NULL, *it, *tmp;
	unsigned most = 0;

	for (size_t i = 0; i < n; i++)
		HASH_ADD_STR(t, name, &items[i]);
	for (unsigned b = 0; b < t->hh.tbl->num_buckets; b++)
		if (t->hh.tbl->buckets[b].count > most)
			most = t->hh.tbl->buckets[b].count;
	HASH_ITER(hh, t, it, tmp)
		HASH_DEL(t, it);
	return most;
}

#define FLOOD 64
/* Far above what 64 random keys give in uthash's 32 buckets (a chain of
 * 16 has odds below 1e-9), far below the 64 of a flood. */
#define CHAIN_MAX 16

/* Names a peer can make collide without our key: under each public hash
 * below they share one bucket until a table of 4096 buckets (~40,000
 * names), and every lookup there walks them all. Under ours they spread. */
static void test_public_collisions_spread(void **state)
{
	static const char last[] =
		"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._";
	struct item *items = calloc(FLOOD, sizeof(*items));
	uint64_t k0 = 0;
	size_t n = 0;
	(void)state;

	assert_non_null(items);
	/* 8-byte names that differ in their last byte only: the product the
	 * id tables took (k * 0x9e37..15, its high half) buckets them by bits
	 * that byte does not reach. */
	for (int i = 0; i < FLOOD; i++) {
		uint64_t k;

		snprintf(items[i].name, sizeof(items[i].name), "weights%c",
			 last[i]);
		memcpy(&k, items[i].name, 8);
		if (!i)
			k0 = k;
		assert_int_equal(((k * 0x9e3779b97f4a7c15ull) >> 32) & 0xfff,
				 ((k0 * 0x9e3779b97f4a7c15ull) >> 32) & 0xfff);
	}
	assert_true(longest_chain(items, FLOOD) <= CHAIN_MAX);
	/* Names whose Jenkins hash (uthash's own) ends in the same 12 bits:
	 * found by trying, 4096 a name, as a peer would. */
	memset(items, 0, FLOOD * sizeof(*items));
	for (unsigned long i = 0; n < FLOOD; i++) {
		char name[32];
		unsigned h;
		int len = snprintf(name, sizeof(name), "layer%lu.weight", i);

		HASH_JEN(name, (unsigned)len, h);
		if ((h & 0xfff) == 0x7a5)
			memcpy(items[n++].name, name, (size_t)len + 1);
	}
	assert_true(longest_chain(items, FLOOD) <= CHAIN_MAX);
	free(items);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_siphash24_vectors),
		cmocka_unit_test(test_bytes_all_count),
		cmocka_unit_test(test_key_per_process),
		cmocka_unit_test(test_public_collisions_spread),
	};

	if (argc == 2 && strcmp(argv[1], "--print-key") == 0) {
		printf("%016llx%016llx\n", (unsigned long long)util_hash_key[0],
		       (unsigned long long)util_hash_key[1]);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
