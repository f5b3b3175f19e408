/*
 * core.h — the lowest internal layer: error reporting, logging, the memory
 * accounting tables, configuration helpers. Depends on nothing but libc and
 * the public header. Internal names use the zs__ prefix.
 */
#ifndef ZS_RUNTIME_CORE_H_
#define ZS_RUNTIME_CORE_H_

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <zeroshard.h>

/* The rest of the layer, which every user of core.h uses too. */
#include "runtime/core/core_config.h"
#include "runtime/core/core_mem.h"
#include "runtime/core/core_profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Errors -------------------------------------------------------------- */

/* Formats the thread's last-error message ("[rank R] " + text), logs it at
 * debug level and returns status, so call sites read
 *   return zs__error(ZS_ERR_INVALID_ARGUMENT, "unit %d: ...", u);      */
zs_status zs__error(zs_status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Keeps the current message but prefixes context ("finalize: ..."). */
zs_status zs__error_prefix(zs_status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message without its "[rank R] " prefix (thread-local), for
 * texts that are compared or forwarded across ranks. */
const char* zs__error_body(void);

/* The rank written into messages and log lines (set by the context). */
void zs__set_log_rank(int rank);

/* One error-propagation idiom: a function declares `zs_status st = ZS_OK;`,
 * has a single `cleanup:` label that frees in reverse order of allocation,
 * and returns st. */
/* Exports a function no current header declares: an older release's
 * symbol that programs built against it still call (runtime/zeroshard.map
 * lists them). The public headers' declarations are exported by them. */
#define ZS__EXPORT __attribute__((visibility("default")))

#define ZS_CHECK(expr)          \
  do {                          \
    st = (expr);                \
    if (st != ZS_OK) goto cleanup; \
  } while (0)

/* Sets st from an error helper and jumps to cleanup. */
#define ZS_FAIL(...)             \
  do {                           \
    st = zs__error(__VA_ARGS__); \
    goto cleanup;                \
  } while (0)

/* Argument check at the API boundary: returns immediately (no cleanup). */
#define ZS_REQUIRE(cond, ...)                              \
  do {                                                     \
    if (!(cond)) return zs__error(ZS_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

/* ---- Logging ------------------------------------------------------------- */

/* (levels: zs_log_level, zeroshard.h) */

/* Current threshold: the ZS_LOG_LEVEL environment variable if set, else the
 * last value given to zs__log_set_level (default: warnings). */
void zs__log_set_level(int level);
int zs__log_level(void);
/* Writes "[zs rank R LEVEL] text\n" to stderr if level <= threshold. */
void zs__log(int level, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- Teardown hooks -------------------------------------------------------
 * An object of a lower layer (a context, a model) keeps a list of what the
 * layers above attached to it (the engine's state of a context, a model's
 * drivers), so that it tears them down without knowing them. */
typedef struct zs__hook {
  void (*destroy)(void* arg);      /* tears down arg */
  void (*remove_files)(void* arg); /* NULL, or unlinks arg's files with
                                      async-signal-safe calls alone */
  void* arg;
  struct zs__hook* next;
} zs__hook;
/* Attaches (destroy, remove_files, arg) at the front of *list; *out (may
 * be NULL) receives the hook for zs__hook_remove. Errors: OUT_OF_MEMORY. */
zs_status zs__hook_add(zs__hook** list, void (*destroy)(void*),
                       void (*remove_files)(void*), void* arg, zs__hook** out);
/* Unlinks and frees h (not run); its owner went first. NULL h: nothing. */
void zs__hook_remove(zs__hook** list, zs__hook* h);
/* Runs and frees every hook, the last attached first; each is unlinked
 * before its destroy runs, so destroy must not remove it. */
void zs__hooks_run(zs__hook** list);
/* Runs every remove_files (signal handlers: no allocation, no locks). */
void zs__hooks_remove_files(const zs__hook* list);

/* ---- Small helpers -------------------------------------------------------- */

/* FNV-1a 64-bit over bytes, chained from `seed` (use ZS__FNV_SEED). */
#define ZS__FNV_SEED 1469598103934665603ull
uint64_t zs__hash_bytes(uint64_t seed, const void* data, size_t n);

/* Monotonic wall clock in seconds. */
double zs__now(void);

/* pthread_cond_timedwait on c (default clock: CLOCK_REALTIME) for at most
 * `seconds` from now; the caller holds mu. Returns its result: 0, or
 * ETIMEDOUT. For waits that warn every so often instead of hanging
 * silently. */
int zs__cond_wait_s(pthread_cond_t* c, pthread_mutex_t* mu, int seconds);

static inline size_t zs__round_up(size_t x, size_t m) {
  return m == 0 ? x : (x + m - 1) / m * m;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZS_RUNTIME_CORE_H_ */
