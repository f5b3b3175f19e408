/*
 * check.h — a C test program's checks: CHECK(cond, fmt, ...) counts the
 * check, and on failure prints where and why and counts the failure; the
 * program exits with `failures != 0`.
 */
#ifndef ZS_TESTS_COMPAT_CHECK_H_
#define ZS_TESTS_COMPAT_CHECK_H_

#include <stdio.h>

static int failures, checks;
#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    checks++;                                                             \
    if (!(cond)) {                                                        \
      failures++;                                                         \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                       \
      fputc('\n', stderr);                                                \
    }                                                                     \
  } while (0)

#endif /* ZS_TESTS_COMPAT_CHECK_H_ */
