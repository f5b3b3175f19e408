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

/* ---- Memory accounting ---------------------------------------------------- */

/* Byte counters per category plus a registry of live allocations, keyed by
 * pointer, so that frees need no size and leaks are reported by name. */
typedef struct zs__accounting zs__accounting;

/* Who made an entry: the runtime's allocations and the user's registrations
 * live in separate registries (sharing the counters), so a user can neither
 * unregister runtime memory nor block a runtime allocation with a stale
 * registration. */
typedef enum zs__owner { ZS__OWNER_RUNTIME = 0, ZS__OWNER_USER = 1 } zs__owner;

zs_status zs__accounting_create(zs__accounting** out);
/* Logs a warning per live entry (a leak) and frees the tables. */
void zs__accounting_destroy(zs__accounting* acct);
/* Records `bytes` under category for key `ptr` (not dereferenced). label is
 * a static or long-lived string used in leak reports (may be NULL).
 * Errors: INVALID_ARGUMENT (duplicate key), OUT_OF_MEMORY. */
zs_status zs__accounting_add(zs__accounting* acct, zs__owner owner,
                             zs_mem_category category, const void* ptr,
                             size_t bytes, const char* label);
/* Removes the entry of ptr; *category and *bytes (may be NULL) receive it.
 * Errors: INVALID_ARGUMENT if ptr is not recorded. */
zs_status zs__accounting_remove(zs__accounting* acct, zs__owner owner,
                                const void* ptr, zs_mem_category* category,
                                size_t* bytes);
void zs__accounting_stats(const zs__accounting* acct, zs_memory_stats* out);
/* "held now: params 123, grads 456, ... total 579 bytes": what is held at
 * this moment by category (non-zero ones), for error messages (out of
 * memory, a failed or timed-out collective). Writes at most cap bytes. */
void zs__accounting_report(const zs__accounting* acct, char* buf, size_t cap);
/* The step's phase changes (peaks per phase start from what is allocated
 * then); step_done closes the step's phases (zs_step's end) and starts the
 * next step's forward. */
void zs__accounting_phase(zs__accounting* acct, zs_phase phase);
void zs__accounting_step_done(zs__accounting* acct);
/* The process's resident set in bytes (/proc/self/statm), 0 if unknown. */
size_t zs__resident_bytes(void);

/* ---- Profiler (core_profile.c, docs/profiling.md) ---- */
typedef struct zs__profiler zs__profiler;
/* *out = NULL when dir is NULL/empty or cannot be written (a warning, once:
 * profiling never stops a run). Always ZS_OK. */
zs_status zs__profiler_create(const char* dir, int rank, int world,
                              uint64_t run_id, zs__profiler** out);
/* Writes DIR/zs_profile_rank<R>.json (via a temporary and a rename) and
 * frees; final: the accounting at the end (its peaks go in the header). */
void zs__profiler_destroy(zs__profiler* p, const zs_memory_stats* final);
/* A memory counter sample (current bytes per category). NULL p: no-op. */
void zs__profiler_counter(zs__profiler* p, const size_t* current,
                          size_t comm_buckets);
/* The label of reduce-scatter bucket temporaries: the accounting counts
 * them apart inside comm_buffers. */
#define ZS__LABEL_BUCKET "reduce-scatter bucket"
/* A span [t0, t1] (zs__now seconds) on track tid (0 caller, 1 collectives)
 * with an optional unit name and, for collectives, bytes and bandwidths. */
void zs__profiler_span(zs__profiler* p, int tid, const char* name,
                       const char* cat, double t0, double t1,
                       const char* unit, uint64_t bytes, double algbw,
                       double busbw);
/* Every allocation and free of the accounting becomes a counter sample. */
void zs__accounting_set_profiler(zs__accounting* acct, zs__profiler* p);
void zs__accounting_reset_peak(zs__accounting* acct);

/* ---- Configuration --------------------------------------------------------- */

/* A caller's config at this library's size (versioned: zeroshard.h, the
 * rules above zs_config): *out gets its fields, and UNSET for those its
 * release lacks; *caller_version (may be NULL) its header's version.
 * Errors: INVALID_ARGUMENT naming a newer, unknown or malformed version or
 * struct_size. */
zs_status zs__config_accept(const zs_config* in, zs_config* out,
                            unsigned int* caller_version);
/* Replaces every UNSET field (and ZS_WEIGHT_DECAY_DEFAULT) by its
 * default. */
void zs__config_resolve(zs_config* c);
/* accept, then resolve. */
zs_status zs__config_resolved(const zs_config* in, zs_config* out,
                              unsigned int* caller_version);
/* The range checks of zs_config_validate on a resolved config. */
zs_status zs__config_check(const zs_config* c);
/* The resolved device of a caller's config (HOST when it is malformed:
 * context creation reports that). */
zs_device_kind zs__config_device(const zs_config* config);
/* The size of zs_config in the release `version` (0: unknown). */
size_t zs__config_known_size(unsigned int version);

/* A stable text form of the fields that must agree across ranks, one
 * "config.<field>=<value>" line each, for the cross-rank check. Writes
 * at most cap bytes including NUL; returns the length it needed. */
size_t zs__config_describe(const zs_config* config, char* buf, size_t cap);

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
