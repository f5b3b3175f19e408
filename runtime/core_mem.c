/*
 * core_mem.c — per-rank memory accounting: byte counters per category
 * (current and peak, and the peak of the total) and a registry of live
 * allocations keyed by pointer (open addressing, linear probing with
 * backward-shift deletion), so frees need no size and leaks are named.
 * Guarded by a mutex: later layers allocate from worker threads.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core.h"

typedef struct zs__acct_entry {
  const void* key; /* NULL: empty slot */
  size_t bytes;
  zs_mem_category category;
  const char* label;
} zs__acct_entry;

struct zs__accounting {
  pthread_mutex_t lock;
  zs__acct_entry* slots;
  size_t cap;   /* power of two */
  size_t count; /* live entries */
  size_t current[ZS_MEM_CATEGORY_COUNT];
  size_t peak[ZS_MEM_CATEGORY_COUNT];
  size_t total_current;
  size_t total_peak;
};

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
  a->cap = 64;
  a->slots = (zs__acct_entry*)calloc(a->cap, sizeof *a->slots);
  if (a->slots == NULL) {
    free(a);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "accounting: calloc");
  }
  pthread_mutex_init(&a->lock, NULL);
  *out = a;
  return ZS_OK;
}

void zs__accounting_destroy(zs__accounting* a) {
  if (a == NULL) return;
  for (size_t i = 0; i < a->cap; i++) {
    const zs__acct_entry* e = &a->slots[i];
    if (e->key == NULL) continue;
    zs__log(ZS_LOG_WARN, "leak: %zu bytes of %s (%s) still registered at %p",
            e->bytes, zs_mem_category_name(e->category),
            e->label != NULL ? e->label : "unlabelled", e->key);
  }
  pthread_mutex_destroy(&a->lock);
  free(a->slots);
  free(a);
}

static zs__acct_entry* zs__find(zs__accounting* a, const void* key) {
  for (size_t i = zs__slot_of(key, a->cap);; i = (i + 1) & (a->cap - 1)) {
    if (a->slots[i].key == key) return &a->slots[i];
    if (a->slots[i].key == NULL) return NULL;
  }
}

static zs_status zs__grow(zs__accounting* a) {
  size_t cap = a->cap * 2;
  zs__acct_entry* slots = (zs__acct_entry*)calloc(cap, sizeof *slots);
  if (slots == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "accounting: grow");
  for (size_t i = 0; i < a->cap; i++) {
    if (a->slots[i].key == NULL) continue;
    size_t j = zs__slot_of(a->slots[i].key, cap);
    while (slots[j].key != NULL) j = (j + 1) & (cap - 1);
    slots[j] = a->slots[i];
  }
  free(a->slots);
  a->slots = slots;
  a->cap = cap;
  return ZS_OK;
}

zs_status zs__accounting_add(zs__accounting* a, zs_mem_category category,
                             const void* ptr, size_t bytes, const char* label) {
  if (ptr == NULL || (int)category < 0 || category >= ZS_MEM_CATEGORY_COUNT)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "memory accounting: NULL pointer or category %d out of "
                     "range 0..%d", (int)category, ZS_MEM_CATEGORY_COUNT - 1);
  zs_status st = ZS_OK;
  pthread_mutex_lock(&a->lock);
  if (zs__find(a, ptr) != NULL) {
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "memory accounting: %p (%s) is already registered", ptr,
                   label != NULL ? label : "unlabelled");
    goto cleanup;
  }
  if ((a->count + 1) * 2 > a->cap) ZS_CHECK(zs__grow(a));
  size_t i = zs__slot_of(ptr, a->cap);
  while (a->slots[i].key != NULL) i = (i + 1) & (a->cap - 1);
  a->slots[i] = (zs__acct_entry){ptr, bytes, category, label};
  a->count++;
  a->current[category] += bytes;
  if (a->current[category] > a->peak[category])
    a->peak[category] = a->current[category];
  a->total_current += bytes;
  if (a->total_current > a->total_peak) a->total_peak = a->total_current;
cleanup:
  pthread_mutex_unlock(&a->lock);
  return st;
}

zs_status zs__accounting_remove(zs__accounting* a, const void* ptr,
                                zs_mem_category* category, size_t* bytes) {
  pthread_mutex_lock(&a->lock);
  zs__acct_entry* e = ptr != NULL ? zs__find(a, ptr) : NULL;
  if (e == NULL) {
    pthread_mutex_unlock(&a->lock);
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "memory accounting: %p is not registered", ptr);
  }
  if (category != NULL) *category = e->category;
  if (bytes != NULL) *bytes = e->bytes;
  a->current[e->category] -= e->bytes;
  a->total_current -= e->bytes;
  a->count--;
  /* Backward-shift deletion keeps probe chains intact without tombstones. */
  size_t hole = (size_t)(e - a->slots);
  for (size_t j = (hole + 1) & (a->cap - 1); a->slots[j].key != NULL;
       j = (j + 1) & (a->cap - 1)) {
    size_t home = zs__slot_of(a->slots[j].key, a->cap);
    size_t dist_j = (j - home) & (a->cap - 1);
    size_t dist_hole = (hole - home) & (a->cap - 1);
    if (dist_hole < dist_j) {
      a->slots[hole] = a->slots[j];
      hole = j;
    }
  }
  a->slots[hole] = (zs__acct_entry){NULL, 0, ZS_MEM_OTHER, NULL};
  pthread_mutex_unlock(&a->lock);
  return ZS_OK;
}

void zs__accounting_stats(const zs__accounting* a_const, zs_memory_stats* out) {
  zs__accounting* a = (zs__accounting*)a_const; /* lock only */
  pthread_mutex_lock(&a->lock);
  memset(out, 0, sizeof *out);
  memcpy(out->current, a->current, sizeof a->current);
  memcpy(out->peak, a->peak, sizeof a->peak);
  out->total_current = a->total_current;
  out->total_peak = a->total_peak;
  out->model_state_bytes =
      a->current[ZS_MEM_PARAMS] + a->current[ZS_MEM_GRADS] +
      a->current[ZS_MEM_MASTER_WEIGHTS] + a->current[ZS_MEM_OPTIMIZER_STATES];
  out->allocations = a->count;
  pthread_mutex_unlock(&a->lock);
}

void zs__accounting_reset_peak(zs__accounting* a) {
  pthread_mutex_lock(&a->lock);
  memcpy(a->peak, a->current, sizeof a->peak);
  a->total_peak = a->total_current;
  pthread_mutex_unlock(&a->lock);
}
