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
/* Before the user's gather of `unit`: if it would take the gathered
 * parameters over max_live_elements, frees the prefetched units not yet
 * used (but `unit`'s tie owners), so that prefetch never pushes them over
 * the limit, also for a unit it did not foresee. Depends only on sizes and
 * prefetch state, the same on every rank. Units some ranks may skip are
 * outside the limit. */
void zs__live_make_room(zs_model* m, int unit);
/* After the user's gather of `unit` (training): a unit gathered on use that
 * is not steady counts in unsteady_live until freed (zs__drop), and in the
 * step's peak of them, from which the limit's room is learned. */
void zs__unsteady_note(zs_model* m, int unit);
/* Elements prefetch leaves free under the live limit for units gathered on
 * use that are not steady. */
size_t zs__live_room(const zs_model* m);
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
