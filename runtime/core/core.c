/*
 * core.c — status strings, the thread-local last-error message,
 * version, type and category names, logging, teardown hooks, hashing
 * and the clock.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/core/core.h"

/* ==== Version ============================================================ */

int zs_version(void) { return ZS_VERSION_CODE; }

#define ZS__STR2(x) #x
#define ZS__STR(x) ZS__STR2(x)
const char* zs_version_string(void) {
  return ZS__STR(ZS_VERSION_MAJOR) "." ZS__STR(ZS_VERSION_MINOR) "." ZS__STR(
      ZS_VERSION_PATCH);
}

/* ==== Status and last error ============================================== */

const char* zs_status_string(zs_status status) {
  switch (status) {
#define ZS__STATUS_CASE(name, value, text) \
  case name:                               \
    return text;
    ZS_STATUS_LIST(ZS__STATUS_CASE)
#undef ZS__STATUS_CASE
  }
  return "unknown status";
}

enum { ZS__MSG_CAP = 2048 };
static _Thread_local char zs__last_msg[ZS__MSG_CAP];
static _Thread_local char zs__last_body[ZS__MSG_CAP];
static int zs__rank = -1;

void zs__set_log_rank(int rank) { zs__rank = rank; }

const char* zs_last_error(void) { return zs__last_msg; }

const char* zs__error_body(void) { return zs__last_body; }

static void zs__vset(const char* fmt, va_list ap) {
  char text[ZS__MSG_CAP];
  vsnprintf(text, sizeof text, fmt, ap);
  snprintf(zs__last_body, sizeof zs__last_body, "%s", text);
  if (zs__rank >= 0)
    snprintf(zs__last_msg, sizeof zs__last_msg, "[rank %d] %.2000s", zs__rank,
             text);
  else
    snprintf(zs__last_msg, sizeof zs__last_msg, "%s", text);
}

zs_status zs__error(zs_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  zs__vset(fmt, ap);
  va_end(ap);
  zs__log(ZS_LOG_DEBUG, "error (%s): %s", zs_status_string(status),
          zs__last_msg);
  return status;
}

zs_status zs__error_prefix(zs_status status, const char* fmt, ...) {
  /* The new text goes before the old body (not the old "[rank R] "). */
  char old[ZS__MSG_CAP];
  snprintf(old, sizeof old, "%s", zs__last_body);
  char text[ZS__MSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  snprintf(zs__last_body, sizeof zs__last_body, "%.1000s%.1000s", text, old);
  if (zs__rank >= 0)
    snprintf(zs__last_msg, sizeof zs__last_msg, "[rank %d] %.1000s%.1000s",
             zs__rank, text, old);
  else
    snprintf(zs__last_msg, sizeof zs__last_msg, "%.1000s%.1000s", text, old);
  return status;
}

/* ==== Names ============================================================== */

size_t zs_dtype_size(zs_dtype dtype) {
  switch (dtype) {
    case ZS_FLOAT32: return 4;
    case ZS_BFLOAT16: return 2;
    case ZS_FLOAT16: return 2;
    case ZS_UINT8: return 1;
    case ZS_INT64: return 8;
    case ZS_UINT64: return 8;
    case ZS_FLOAT64: return 8;
    case ZS_DTYPE_COUNT:
    case ZS_DTYPE_AUTO: break;
  }
  return 0;
}

const char* zs_dtype_name(zs_dtype dtype) {
  static const char* const names[ZS_DTYPE_COUNT] = {"fp32", "bf16", "fp16",
                                                    "u8",   "i64",  "u64",
                                                    "f64"};
  if ((int)dtype < 0 || dtype >= ZS_DTYPE_COUNT) return "invalid";
  return names[dtype];
}

const char* zs_mem_category_name(zs_mem_category category) {
  static const char* const names[ZS_MEM_CATEGORY_COUNT] = {
      "params",       "params_gathered", "grads",        "master_weights",
      "optimizer_states", "comm_buffers", "activations", "offload_host",
      "nvme_staging", "other", "stacked_views", "comm_segment"};
  if ((int)category < 0 || category >= ZS_MEM_CATEGORY_COUNT) return "invalid";
  return names[category];
}

double zs_busbw_factor(zs_coll_op op, int ranks) {
  if (ranks < 1) return 0.0;
  const double n = ranks;
  switch (op) {
    case ZS_COLL_ALL_GATHER:
    case ZS_COLL_GATHER:
    case ZS_COLL_REDUCE_SCATTER: return (n - 1) / n;
    case ZS_COLL_ALL_REDUCE: return 2 * (n - 1) / n;
    case ZS_COLL_BROADCAST: return 1.0;
    default: return 0.0;
  }
}

const char* zs_phase_name(zs_phase phase) {
  static const char* const names[ZS_PHASE_COUNT] = {"forward", "backward",
                                                    "step"};
  if ((int)phase < 0 || phase >= ZS_PHASE_COUNT) return "unknown";
  return names[phase];
}

const char* zs_coll_op_name(zs_coll_op op) {
  static const char* const names[ZS_COLL_OP_COUNT] = {
      "all_gather", "reduce_scatter", "all_reduce", "broadcast", "gather"};
  if ((int)op < 0 || op >= ZS_COLL_OP_COUNT) return "invalid";
  return names[op];
}

/* ==== Logging ============================================================ */

static int zs__level = ZS_LOG_WARN;

void zs__log_set_level(int level) { zs__level = level; }

int zs__log_level(void) {
  const char* env = getenv("ZS_LOG_LEVEL");
  if (env != NULL && env[0] >= '0' && env[0] <= '3' && env[1] == '\0')
    return env[0] - '0';
  return zs__level;
}

void zs__log(int level, const char* fmt, ...) {
  if (level > zs__log_level()) return;
  static const char* const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char text[ZS__MSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (zs__rank >= 0)
    fprintf(stderr, "[zs rank %d %s] %s\n", zs__rank, tags[level], text);
  else
    fprintf(stderr, "[zs %s] %s\n", tags[level], text);
}

/* ==== Teardown hooks ===================================================== */

zs_status zs__hook_add(zs__hook** list, void (*destroy)(void*),
                       void (*remove_files)(void*), void* arg, zs__hook** out) {
  zs__hook* h = (zs__hook*)calloc(1, sizeof *h);
  if (h == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "teardown hook");
  h->destroy = destroy;
  h->remove_files = remove_files;
  h->arg = arg;
  h->next = *list;
  *list = h;
  if (out != NULL) *out = h;
  return ZS_OK;
}

void zs__hook_remove(zs__hook** list, zs__hook* h) {
  for (zs__hook** p = list; h != NULL && *p != NULL; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      free(h);
      return;
    }
}

void zs__hooks_run(zs__hook** list) {
  while (*list != NULL) {
    zs__hook* h = *list;
    *list = h->next;
    if (h->destroy != NULL) h->destroy(h->arg);
    free(h);
  }
}

void zs__hooks_remove_files(const zs__hook* list) {
  for (const zs__hook* h = list; h != NULL; h = h->next)
    if (h->remove_files != NULL) h->remove_files(h->arg);
}

/* ==== Helpers ============================================================ */

uint64_t zs__hash_bytes(uint64_t seed, const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  uint64_t h = seed;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

int zs__cond_wait_s(pthread_cond_t* c, pthread_mutex_t* mu, int seconds) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += seconds;
  return pthread_cond_timedwait(c, mu, &t);
}

double zs__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
