/*
 * core_compat.c — output structs in the layout of the caller's release
 * (core_compat.h): 0.1's layouts, kept here for programs built against 0.1's
 * header, and the struct_size rule of the releases since.
 */
#include "runtime/core/core_compat.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ==== 0.1's output structs (no struct_size; arrays sized by the counts
 * of the time) ============================================================= */

#define ZS__V01_CATEGORIES 10
#define ZS__V01_PHASES 3
#define ZS__V01_OPS 4

typedef struct zs__v01_memory_stats {
  size_t current[ZS__V01_CATEGORIES];
  size_t peak[ZS__V01_CATEGORIES];
  size_t total_current;
  size_t total_peak;
  size_t model_state_bytes;
  size_t allocations;
  size_t phase_peak[ZS__V01_PHASES][ZS__V01_CATEGORIES];
  size_t phase_peak_total[ZS__V01_PHASES];
  size_t comm_bucket_current;
  size_t comm_bucket_peak;
  size_t resident_bytes;
} zs__v01_memory_stats;

typedef struct zs__v01_comm_counters {
  uint64_t calls[ZS__V01_OPS];
  uint64_t bytes[ZS__V01_OPS];
  double seconds[ZS__V01_OPS];
  double wait_seconds[ZS__V01_OPS];
} zs__v01_comm_counters;

typedef struct zs__v01_offload_info {
  int enabled;
  int numa_node;
  int workers;
  int pinned;
  uint64_t steps_on_workers;
  int nvme;
  uint64_t nvme_file_bytes;
  const char* nvme_aio;
  uint64_t nvme_param_reads;
  uint64_t nvme_param_reads_ahead;
} zs__v01_offload_info;

typedef struct zs__v01_comm_record {
  uint64_t seq;
  zs_coll_op op;
  const char* purpose;
  int unit;
  uint64_t bytes;
  double issue_s;
  double done_s;
  double algbw_GBps;
  double busbw_GBps;
} zs__v01_comm_record;

typedef struct zs__v01_step_info {
  int applied;
  int64_t step;
  double grad_norm;
  double loss_scale;
  int overflow;
  int micro_batch;
} zs__v01_step_info;

typedef struct zs__v01_memory_estimate {
  size_t bytes[ZS__V01_CATEGORIES];
  size_t model_state_bytes;
  size_t total;
  size_t largest_unit_elements;
  size_t nvme_bytes;
} zs__v01_memory_estimate;

#if defined(__LP64__)
_Static_assert(sizeof(zs__v01_memory_stats) == 480 &&
                   sizeof(zs__v01_memory_estimate) == 112 &&
                   sizeof(zs__v01_comm_counters) == 128 &&
                   sizeof(zs__v01_offload_info) == 64 &&
                   sizeof(zs__v01_comm_record) == 72 &&
                   sizeof(zs__v01_step_info) == 40,
               "0.1's output layouts are what 0.1 programs pass");
#endif

static void zs__v01_write(zs__out_kind kind, const void* full, void* out) {
  switch (kind) {
    case ZS__OUT_MEMORY_STATS: {
      const zs_memory_stats* f = (const zs_memory_stats*)full;
      zs__v01_memory_stats o;
      memset(&o, 0, sizeof o);
      for (int k = 0; k < ZS__V01_CATEGORIES; k++) {
        o.current[k] = f->current[k];
        o.peak[k] = f->peak[k];
        for (int p = 0; p < ZS__V01_PHASES; p++)
          o.phase_peak[p][k] = f->phase_peak[p][k];
      }
      for (int p = 0; p < ZS__V01_PHASES; p++)
        o.phase_peak_total[p] = f->phase_peak_total[p];
      o.total_current = f->total_current;
      o.total_peak = f->total_peak;
      o.model_state_bytes = f->model_state_bytes;
      o.allocations = f->allocations;
      o.comm_bucket_current = f->comm_bucket_current;
      o.comm_bucket_peak = f->comm_bucket_peak;
      o.resident_bytes = f->resident_bytes;
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_COMM_COUNTERS: {
      const zs_comm_counters* f = (const zs_comm_counters*)full;
      zs__v01_comm_counters o;
      for (int k = 0; k < ZS__V01_OPS; k++) {
        o.calls[k] = f->calls[k];
        o.bytes[k] = f->bytes[k];
        o.seconds[k] = f->seconds[k];
        o.wait_seconds[k] = f->wait_seconds[k];
      }
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_OFFLOAD_INFO: {
      const zs_offload_info* f = (const zs_offload_info*)full;
      zs__v01_offload_info o = {f->enabled,          f->numa_node,
                                f->workers,          f->pinned,
                                f->steps_on_workers, f->nvme,
                                f->nvme_file_bytes,  f->nvme_aio,
                                f->nvme_param_reads, f->nvme_param_reads_ahead};
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_COMM_RECORD: {
      const zs_comm_record* f = (const zs_comm_record*)full;
      zs__v01_comm_record o = {f->seq,     f->op,      f->purpose,
                               f->unit,    f->bytes,   f->issue_s,
                               f->done_s,  f->algbw_GBps, f->busbw_GBps};
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_STEP_INFO: {
      const zs_step_info* f = (const zs_step_info*)full;
      zs__v01_step_info o = {f->applied,    f->step,     f->grad_norm,
                             f->loss_scale, f->overflow, f->micro_batch};
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_MEMORY_ESTIMATE: { /* 0.1's zs_estimate_params/_model */
      const zs_memory_estimate* f = (const zs_memory_estimate*)full;
      zs__v01_memory_estimate o;
      for (int k = 0; k < ZS__V01_CATEGORIES; k++) o.bytes[k] = f->bytes[k];
      o.model_state_bytes = f->model_state_bytes;
      o.total = f->total;
      o.largest_unit_elements = f->largest_unit_elements;
      o.nvme_bytes = f->nvme_bytes;
      memcpy(out, &o, sizeof o);
      return;
    }
    case ZS__OUT_KINDS:
      return;
  }
}

/* ==== Sizes per release ==================================================== */

/* Each kind's size per release (the newest release at or below a
 * version); like zs_config, a release only appends fields. 0: the struct
 * did not exist. */
typedef struct zs__out_sizes {
  const char* name;
  struct {
    unsigned int from_version;
    size_t size;
  } at[3];
} zs__out_sizes;

/* 0.2's and 0.3's zs_comm_record: up to busbw_GBps (0.4 appended group
 * and ranks). */
#define ZS__V02_COMM_RECORD_SIZE \
  (offsetof(zs_comm_record, busbw_GBps) + sizeof(double))
_Static_assert(ZS__V02_COMM_RECORD_SIZE == 72 + 8,
               "0.2's zs_comm_record: 0.1's and its struct_size");

static const zs__out_sizes zs__out_table[ZS__OUT_KINDS] = {
    {"zs_memory_stats",
     {{100, sizeof(zs__v01_memory_stats)}, {200, sizeof(zs_memory_stats)}}},
    {"zs_comm_counters",
     {{100, sizeof(zs__v01_comm_counters)}, {200, sizeof(zs_comm_counters)}}},
    {"zs_offload_info",
     {{100, sizeof(zs__v01_offload_info)}, {200, sizeof(zs_offload_info)}}},
    {"zs_comm_record",
     {{100, sizeof(zs__v01_comm_record)}, {200, ZS__V02_COMM_RECORD_SIZE},
      {400, sizeof(zs_comm_record)}}},
    {"zs_step_info",
     {{100, sizeof(zs__v01_step_info)}, {200, sizeof(zs_step_info)}}},
    {"zs_memory_estimate",
     {{100, sizeof(zs__v01_memory_estimate)}, {200, sizeof(zs_memory_estimate)}}},
    {"zs_comm_estimate", {{400, sizeof(zs_comm_estimate)}}},
};

static size_t zs__out_release_size(const zs__out_sizes* t,
                                   unsigned int version) {
  size_t size = 0;
  for (size_t i = 0; i < sizeof t->at / sizeof *t->at; i++)
    if (t->at[i].size != 0 && version >= t->at[i].from_version)
      size = t->at[i].size; /* (unused entries are 0) */
  return size;
}

zs_status zs__out_size(zs__out_kind kind, unsigned int version,
                       const void* out, const char* what, size_t* size) {
  const zs__out_sizes* t = &zs__out_table[kind];
  const size_t want = zs__out_release_size(t, version);
  ZS_REQUIRE(want != 0, "%s: %s does not exist in the caller's release "
             "(%u.%u)", what, t->name, version / 10000, version / 100 % 100);
  *size = want;
  if (version < 200) return ZS_OK; /* no struct_size to read */
  const size_t given = *(const size_t*)out;
  ZS_REQUIRE(given == 0 || given == want,
             "%s: %s.struct_size is %zu, but the struct is %zu bytes in the "
             "caller's release (%u.%u, as its config says): set struct_size "
             "= sizeof(%s), or leave it 0", what, t->name, given, want,
             version / 10000, version / 100 % 100, t->name);
  return ZS_OK;
}

void zs__out_write(zs__out_kind kind, unsigned int version, const void* full,
                   void* out, size_t size) {
  if (version < 200) {
    zs__v01_write(kind, full, out);
    return;
  }
  memcpy(out, full, size);
  *(size_t*)out = size;
}
