/*
 * core_profile.h — the profiler (core_profile.c, docs/profiling.md): spans and memory
 * counter samples written as one Chrome trace per rank.
 */
#ifndef ZS_RUNTIME_CORE_PROFILE_H_
#define ZS_RUNTIME_CORE_PROFILE_H_

#include <stddef.h>
#include <stdint.h>

#include <zeroshard.h>

#ifdef __cplusplus
extern "C" {
#endif
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
/* A span [t0, t1] (zs__now seconds) on track tid (0 caller, 1 collectives)
 * with an optional unit name and, for collectives, bytes and bandwidths. */
void zs__profiler_span(zs__profiler* p, int tid, const char* name,
                       const char* cat, double t0, double t1,
                       const char* unit, uint64_t bytes, double algbw,
                       double busbw);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CORE_PROFILE_H_ */
