/*
 * engine_sched.h — stage-3 prefetch along the recorded order of gathers
 * (engine_sched.c). Every decision depends only on the trace, on sizes and
 * on the order of calls, never on timing, so every rank issues the same
 * collectives.
 */
#ifndef ZS_RUNTIME_ENGINE_SCHED_H_
#define ZS_RUNTIME_ENGINE_SCHED_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size in elements a prefetch of `unit` would add (itself and the owners
 * of its ties that are not gathered), and the all-gathers it would start
 * (each counting against prefetch_depth). */
size_t zs__prefetch_cost(const zs_model* m, int unit);
int zs__prefetch_count(const zs_model* m, int unit);
/* Holds `unit` and the owners of its ties as prefetches (their all-gathers
 * start now). Errors: zs__hold's. */
zs_status zs__prefetch_one(zs_model* m, int unit);
/* Issues all-gathers for the next units of the trace that are not
 * gathered, while fewer than prefetch_depth prefetches are unused and the
 * live-elements limit allows, then reads parameter shards on NVMe ahead.
 * Errors: zs__hold's. */
zs_status zs__prefetch_issue(zs_model* m);
/* Drops every unused prefetch and forward hold (waiting for their
 * all-gathers). */
zs_status zs__prefetch_drain(zs_model* m);
/* Follows the trace with the user's gather of `unit`; a gather out of
 * order ends prefetching for this step (unused prefetches are dropped).
 * Errors: OUT_OF_MEMORY. */
zs_status zs__trace_follow(zs_model* m, int unit);
/* At the end of a step: adopts this step's gathers as the trace when the
 * old one did not match. */
void zs__trace_end_step(zs_model* m);
/* Forgets this step's gathers: the trace recorded before the step stays
 * (zs_step_discard). */
void zs__trace_drop_step(zs_model* m);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_SCHED_H_ */
