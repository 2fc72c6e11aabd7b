/* skip — a skipped test reads as skipped. A cmocka test that cannot run
 * here calls test_skip("why"): the reason is printed and cmocka lists the
 * test as SKIPPED. main returns test_run_group(...), which is 77 when every
 * test of the group skipped and none failed: ctest (SKIP_RETURN_CODE 77,
 * set for every cmocka test in tests/CMakeLists.txt) then reports the test
 * as "Skipped", not "Passed". A group where only some tests skipped reads
 * "Passed" (ctest has no partial skip), with the SKIPPED lines in its log;
 * a group that should show up as skipped on its own (test_security's ACL
 * tests without root) is registered as a ctest of its own.
 *
 * Header only, for the one file of a test binary that holds its tests and
 * main. Test thread only.
 */
#ifndef DLSHARE_TEST_SKIP_H
#define DLSHARE_TEST_SKIP_H

#include <stddef.h>

/* What ctest's SKIP_RETURN_CODE is set to, as automake's harness uses. */
#define TEST_SKIPPED 77

static int test_skips;

/* Skips the running test, saying why (a printf format and arguments). */
#define test_skip(...)                                                        \
	do {                                                                  \
		print_message("SKIP: " __VA_ARGS__);                          \
		print_message("\n");                                          \
		test_skips++;                                                 \
		skip();                                                       \
	} while (0)

/* What main returns for a group of n tests of which failed failed. */
static inline int test_exit(int failed, size_t n)
{
	if (failed == 0 && n > 0 && (size_t)test_skips >= n)
		return TEST_SKIPPED;
	return failed;
}

/* cmocka_run_group_tests_name, returning TEST_SKIPPED when every test of
 * the group skipped. */
#define test_run_group(name, tests, setup, teardown)                          \
	test_exit(_cmocka_run_group_tests(name, tests,                        \
					  sizeof(tests) / sizeof((tests)[0]), \
					  setup, teardown),                   \
		  sizeof(tests) / sizeof((tests)[0]))

#endif
