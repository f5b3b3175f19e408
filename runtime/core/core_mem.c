/*
 * core_mem.c — per-rank memory accounting: byte counters per category
 * (current and peak, and the peak of the total) and a registry of live
 * allocations keyed by pointer (open addressing, linear probing with
 * backward-shift deletion), so frees need no size and leaks are named.
 * Guarded by a mutex: later layers allocate from worker threads.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/core/core.h"

typedef struct zs__acct_entry {
  const void* key; /* NULL: empty slot */
  size_t bytes;
  zs_mem_category category;
  const char* label;
} zs__acct_entry;

/* One registry: an open-addressing table of entries keyed by pointer. */
typedef struct zs__registry {
  zs__acct_entry* slots;
  size_t cap;   /* power of two */
  size_t count; /* live entries */
} zs__registry;

struct zs__accounting {
  pthread_mutex_t lock;
  zs__registry reg[2]; /* by zs__owner */
  size_t current[ZS_MEM_CATEGORY_COUNT];
  size_t peak[ZS_MEM_CATEGORY_COUNT];
  size_t total_current;
  size_t total_peak;
  /* Peaks per phase of the step in progress (cur) and of the last
   * completed step (last); phase_seen: the phase was entered. */
  int phase;
  double phase_t0; /* zs__now() when the phase began (timeline spans) */
  size_t cur_peak[ZS_PHASE_COUNT][ZS_MEM_CATEGORY_COUNT];
  size_t cur_total[ZS_PHASE_COUNT];
  size_t last_peak[ZS_PHASE_COUNT][ZS_MEM_CATEGORY_COUNT];
  size_t last_total[ZS_PHASE_COUNT];
  int steps_done;
  zs__profiler* prof; /* not owned; NULL: not profiling */
  size_t bucket_current, bucket_peak; /* comm_buffers: bucket temporaries */
};

static int zs__is_bucket(zs_mem_category c, const char* label) {
  return c == ZS_MEM_COMM_BUFFERS && label != NULL &&
         strcmp(label, ZS__LABEL_BUCKET) == 0;
}

void zs__accounting_set_profiler(zs__accounting* a, zs__profiler* p) {
  pthread_mutex_lock(&a->lock);
  a->prof = p;
  a->phase_t0 = zs__now();
  if (p != NULL) zs__profiler_counter(p, a->current, a->bucket_current);
  pthread_mutex_unlock(&a->lock);
}

/* The timeline gets one span per phase of every step (track 2). */
static void zs__phase_span(zs__accounting* a) {
  if (a->prof == NULL) return;
  const double now = zs__now();
  zs__profiler_span(a->prof, 2, zs_phase_name((zs_phase)a->phase), "phase",
                    a->phase_t0, now, NULL, 0, 0, 0);
}

/* A phase starts with what is allocated when it begins. Lock held. */
static void zs__phase_begin(zs__accounting* a, int phase) {
  a->phase = phase;
  a->phase_t0 = zs__now();
  memcpy(a->cur_peak[phase], a->current, sizeof a->current);
  a->cur_total[phase] = a->total_current;
}

void zs__accounting_phase(zs__accounting* a, zs_phase phase) {
  pthread_mutex_lock(&a->lock);
  if ((int)phase != a->phase) {
    zs__phase_span(a);
    zs__phase_begin(a, (int)phase);
  }
  pthread_mutex_unlock(&a->lock);
}

void zs__accounting_step_done(zs__accounting* a) {
  pthread_mutex_lock(&a->lock);
  zs__phase_span(a);
  memcpy(a->last_peak, a->cur_peak, sizeof a->cur_peak);
  memcpy(a->last_total, a->cur_total, sizeof a->cur_total);
  a->steps_done++;
  for (int p = 0; p < ZS_PHASE_COUNT; p++) zs__phase_begin(a, p);
  a->phase = ZS_PHASE_FORWARD;
  pthread_mutex_unlock(&a->lock);
}

static size_t zs__slot_of(const void* key, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)key;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (size_t)h & (cap - 1);
}

zs_status zs__accounting_create(zs__accounting** out) {
  zs__accounting* a = (zs__accounting*)calloc(1, sizeof *a);
  if (a == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "accounting: calloc");
  for (int o = 0; o < 2; o++) {
    a->reg[o].cap = 64;
    a->reg[o].slots = (zs__acct_entry*)calloc(64, sizeof(zs__acct_entry));
    if (a->reg[o].slots == NULL) {
      free(a->reg[0].slots);
      free(a);
      return zs__error(ZS_ERR_OUT_OF_MEMORY, "accounting: calloc");
    }
  }
  pthread_mutex_init(&a->lock, NULL);
  *out = a;
  return ZS_OK;
}

void zs__accounting_destroy(zs__accounting* a) {
  if (a == NULL) return;
  for (int o = 0; o < 2; o++) {
    for (size_t i = 0; i < a->reg[o].cap; i++) {
      const zs__acct_entry* e = &a->reg[o].slots[i];
      if (e->key == NULL) continue;
      zs__log(ZS_LOG_WARN, "leak: %zu bytes of %s (%s%s) still registered at %p",
              e->bytes, zs_mem_category_name(e->category),
              o == ZS__OWNER_USER ? "user registration " : "",
              e->label != NULL ? e->label : "unlabelled", e->key);
    }
    free(a->reg[o].slots);
  }
  pthread_mutex_destroy(&a->lock);
  free(a);
}

static zs__acct_entry* zs__find(zs__registry* r, const void* key) {
  for (size_t i = zs__slot_of(key, r->cap);; i = (i + 1) & (r->cap - 1)) {
    if (r->slots[i].key == key) return &r->slots[i];
    if (r->slots[i].key == NULL) return NULL;
  }
}

static zs_status zs__grow(zs__registry* r) {
  size_t cap = r->cap * 2;
  zs__acct_entry* slots = (zs__acct_entry*)calloc(cap, sizeof *slots);
  if (slots == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "accounting: grow");
  for (size_t i = 0; i < r->cap; i++) {
    if (r->slots[i].key == NULL) continue;
    size_t j = zs__slot_of(r->slots[i].key, cap);
    while (slots[j].key != NULL) j = (j + 1) & (cap - 1);
    slots[j] = r->slots[i];
  }
  free(r->slots);
  r->slots = slots;
  r->cap = cap;
  return ZS_OK;
}

zs_status zs__accounting_add(zs__accounting* a, zs__owner owner,
                             zs_mem_category category, const void* ptr,
                             size_t bytes, const char* label) {
  if (ptr == NULL || (int)category < 0 || category >= ZS_MEM_CATEGORY_COUNT)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "memory accounting: NULL pointer or category %d out of "
                     "range 0..%d", (int)category, ZS_MEM_CATEGORY_COUNT - 1);
  zs_status st = ZS_OK;
  zs__registry* r = &a->reg[owner == ZS__OWNER_USER];
  pthread_mutex_lock(&a->lock);
  if (zs__find(r, ptr) != NULL) {
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "memory accounting: %p (%s) is already registered", ptr,
                   label != NULL ? label : "unlabelled");
    goto cleanup;
  }
  if ((r->count + 1) * 2 > r->cap) ZS_CHECK(zs__grow(r));
  size_t i = zs__slot_of(ptr, r->cap);
  while (r->slots[i].key != NULL) i = (i + 1) & (r->cap - 1);
  r->slots[i] = (zs__acct_entry){ptr, bytes, category, label};
  r->count++;
  a->current[category] += bytes;
  if (a->current[category] > a->peak[category])
    a->peak[category] = a->current[category];
  a->total_current += bytes;
  if (a->total_current > a->total_peak) a->total_peak = a->total_current;
  if (a->current[category] > a->cur_peak[a->phase][category])
    a->cur_peak[a->phase][category] = a->current[category];
  if (a->total_current > a->cur_total[a->phase])
    a->cur_total[a->phase] = a->total_current;
  if (zs__is_bucket(category, label)) {
    a->bucket_current += bytes;
    if (a->bucket_current > a->bucket_peak) a->bucket_peak = a->bucket_current;
  }
  zs__profiler_counter(a->prof, a->current, a->bucket_current);
cleanup:
  pthread_mutex_unlock(&a->lock);
  return st;
}

zs_status zs__accounting_remove(zs__accounting* a, zs__owner owner,
                                const void* ptr, zs_mem_category* category,
                                size_t* bytes) {
  zs__registry* r = &a->reg[owner == ZS__OWNER_USER];
  pthread_mutex_lock(&a->lock);
  zs__acct_entry* e = ptr != NULL ? zs__find(r, ptr) : NULL;
  if (e == NULL) {
    pthread_mutex_unlock(&a->lock);
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "memory accounting: %p is not registered %s", ptr,
                     owner == ZS__OWNER_USER
                         ? "by the user (only buffers given to "
                           "zs_memory_register can be unregistered)"
                         : "as a runtime allocation");
  }
  if (category != NULL) *category = e->category;
  if (bytes != NULL) *bytes = e->bytes;
  a->current[e->category] -= e->bytes;
  a->total_current -= e->bytes;
  if (zs__is_bucket(e->category, e->label)) a->bucket_current -= e->bytes;
  zs__profiler_counter(a->prof, a->current, a->bucket_current);
  r->count--;
  /* Backward-shift deletion keeps probe chains intact without tombstones. */
  size_t hole = (size_t)(e - r->slots);
  for (size_t j = (hole + 1) & (r->cap - 1); r->slots[j].key != NULL;
       j = (j + 1) & (r->cap - 1)) {
    size_t home = zs__slot_of(r->slots[j].key, r->cap);
    size_t dist_j = (j - home) & (r->cap - 1);
    size_t dist_hole = (hole - home) & (r->cap - 1);
    if (dist_hole < dist_j) {
      r->slots[hole] = r->slots[j];
      hole = j;
    }
  }
  r->slots[hole] = (zs__acct_entry){NULL, 0, ZS_MEM_OTHER, NULL};
  pthread_mutex_unlock(&a->lock);
  return ZS_OK;
}

void zs__accounting_stats(const zs__accounting* a_const, zs_memory_stats* out) {
  zs__accounting* a = (zs__accounting*)a_const; /* lock only */
  pthread_mutex_lock(&a->lock);
  memset(out, 0, sizeof *out);
  _Static_assert(ZS_MEM_CATEGORY_COUNT <= ZS_MEM_CATEGORY_CAP &&
                     ZS_PHASE_COUNT <= ZS_PHASE_CAP,
                 "the output arrays' room");
  memcpy(out->current, a->current, sizeof a->current);
  memcpy(out->peak, a->peak, sizeof a->peak);
  out->total_current = a->total_current;
  out->total_peak = a->total_peak;
  out->model_state_bytes =
      a->current[ZS_MEM_PARAMS] + a->current[ZS_MEM_GRADS] +
      a->current[ZS_MEM_MASTER_WEIGHTS] + a->current[ZS_MEM_OPTIMIZER_STATES];
  out->allocations = a->reg[0].count + a->reg[1].count;
  out->comm_bucket_current = a->bucket_current;
  out->comm_bucket_peak = a->bucket_peak;
  /* The last completed step's phases; before the first, the one so far. */
  const int done = a->steps_done > 0;
  for (int p = 0; p < ZS_PHASE_COUNT; p++) {
    for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
      out->phase_peak[p][c] = done ? a->last_peak[p][c] : a->cur_peak[p][c];
    out->phase_peak_total[p] = done ? a->last_total[p] : a->cur_total[p];
  }
  pthread_mutex_unlock(&a->lock);
  out->resident_bytes = zs__resident_bytes();
}

size_t zs__resident_bytes(void) {
  /* /proc/self/statm: size resident shared text lib data dt (pages) */
  FILE* f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  int n = f != NULL ? fscanf(f, "%llu %llu", &size, &resident) : 0;
  if (f != NULL) fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? (size_t)resident * (size_t)page : 0;
}

void zs__accounting_reset_peak(zs__accounting* a) {
  pthread_mutex_lock(&a->lock);
  memcpy(a->peak, a->current, sizeof a->peak);
  a->total_peak = a->total_current;
  a->bucket_peak = a->bucket_current;
  /* the timeline marks it: tools/memreport.py takes its peaks from here */
  if (a->prof != NULL) {
    const double t = zs__now();
    zs__profiler_span(a->prof, 0, "peak reset", "memory", t, t, NULL, 0, 0, 0);
  }
  pthread_mutex_unlock(&a->lock);
}

void zs__accounting_report(const zs__accounting* acct, char* buf, size_t cap) {
  if (cap == 0) return;
  zs_memory_stats ms;
  zs__accounting_stats(acct, &ms);
  size_t n = (size_t)snprintf(buf, cap, "held now:");
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT && n < cap; c++)
    if (ms.current[c] > 0)
      n += (size_t)snprintf(buf + n, cap - n, " %s %zu,",
                            zs_mem_category_name((zs_mem_category)c),
                            ms.current[c]);
  if (n < cap)
    snprintf(buf + n, cap - n, " total %zu bytes", ms.total_current);
}
