/*
 * engine_unit.h — a unit's buffers through a step (engine_unit.c): the
 * references on its full parameters, its gradient accumulation and
 * reduction, progress of the collectives in flight, and the funnel every
 * public call that issues collectives goes through.
 */
#ifndef ZS_RUNTIME_ENGINE_UNIT_H_
#define ZS_RUNTIME_ENGINE_UNIT_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The funnel ----
 * The calls whose collectives no agreement guards (zs_unit_gather,
 * zs_unit_prefetch, zs_unit_grad_acquire and _release, zs_step's work after
 * its consistency check, zs_model_init's store of a unit before the next
 * unit's agreement) go on alone on each rank. When one of them fails
 * on this rank for a reason of its own (out of memory, a device, disk or
 * MPI error: codes OUT_OF_MEMORY, DEVICE, IO, COMM, CORRUPT, INTERNAL) and
 * no agreement in the call already told every rank, this rank will skip
 * collectives the others issue: zs__call_end abandons the communicator
 * (zs__comm_abandon), so the others fail at once naming this rank instead
 * of waiting collective_timeout_s. Misuse (INVALID_*, identical on every
 * rank in SPMD code, and the model stays usable), agreed failures and an
 * already failed communicator pass through. `begin` is zs__call_begin's
 * value at the start of the call; returns st (with the note). */
static inline uint64_t zs__call_begin(const zs_model* m) {
  return m->ctx->comm->agreed_failures;
}
zs_status zs__call_end(zs_model* m, uint64_t begin, zs_status st);
/* Every public call that issues collectives goes through this: the checks
 * (unit >= 0: zs__check_unit, else zs__check_finalized; each naming fn),
 * with `gate` the discard gate (zs__check_discarded), then
 * body(m, unit, arg) between zs__call_begin and zs__call_end. Returns the
 * first failure. */
typedef zs_status (*zs__public_body)(zs_model* m, int unit, void* arg);
zs_status zs__public_call(zs_model* m, const char* fn, int unit, int gate,
                   zs__public_body body, void* arg);

/* ---- Progress ---- */
/* Completes what finished in flight (a hint: errors surface at the wait);
 * a finished reduction frees its buffers. */
void zs__progress(zs_model* m);
/* Waits for every collective in flight for every unit (reductions are
 * finished), e.g. before reading or freeing buffers outside a step. */
zs_status zs__quiesce(zs_model* m);

/* ---- Parameters: references on a unit's full buffer ---- */
/* Takes a reference; at stage 3 the first one allocates params_full and
 * starts its all-gather without waiting. Errors: OUT_OF_MEMORY, DEVICE,
 * COMM, IO (parameter shards on NVMe), each naming the unit. */
zs_status zs__hold(zs_model* m, int unit);
/* Drops a reference; at stage 3 the last one waits for a gather still in
 * flight (its destination is about to be freed) and frees params_full. */
void zs__drop(zs_model* m, int unit);
/* A reference for the user's gather: a prefetch of the unit, if any, is
 * used up (its reference changes hands) instead of taking a new one. */
zs_status zs__hold_for_use(zs_model* m, int unit);
/* Waits until a held unit's full parameters are complete. */
zs_status zs__ready(zs_model* m, zs__unit* u);
/* The user's gather of a unit ends without a release (zs_step_discard):
 * its references are dropped, and a forward hold is not taken. */
void zs__gather_abandon(zs_model* m, int unit);
/* Ends the forward hold of a unit (at the end of its backward). */
void zs__forward_hold_end(zs_model* m, int unit);
/* A unit some ranks may not use (zs_unit_allow_unused), on a rank that
 * does not (zs_unit_mark_unused), at stage 3: agrees on its users with the
 * others and starts the send of this rank's shard to them (in gather_ops;
 * nothing at stages 0-2). Errors: as zs__hold's, naming the unit. */
zs_status zs__unused_send(zs_model* m, int unit);
/* Completes such a send (before the unit is gathered again, and in
 * zs_step before the optimizer writes the shard). Errors: COMM. */
zs_status zs__unused_send_finish(zs_model* m, zs__unit* u);

/* ---- Gradients ----
 *   IDLE --prepare--> ACCUM --reduce_start--> REDUCING
 *   REDUCING --reduce_finish--> REDUCED (--prepare--> ACCUM: re-opened) */
/* Makes the accumulation buffer ready (zeroed on the step's first open).
 * Errors: OUT_OF_MEMORY, DEVICE. */
zs_status zs__grad_prepare(zs_model* m, zs__unit* u);
/* Frees a unit's gradient accumulation state (any state but REDUCING) and
 * makes it IDLE. */
void zs__grad_drop(zs_model* m, zs__unit* u);
/* Starts the bucketed reduce-scatter of a unit (ACCUM -> REDUCING). */
zs_status zs__grad_reduce_start(zs_model* m, zs__unit* u);
/* Waits for a REDUCING unit and finishes it (-> REDUCED): the mean over
 * ranks, and its accumulation buffer freed. Local work only (no new
 * collective), so it may run whenever the reduction is done. */
zs_status zs__grad_reduce_finish(zs_model* m, zs__unit* u);
/* Stage 0: starts the all-gathers of every unit's reduced shards back into
 * its full gradient (in unit order; zs_step waits for them). */
zs_status zs__grad_gather_start(zs_model* m);
/* The user's gradient acquire of a unit ends without a release
 * (zs_step_discard): no use is counted and no reduction starts. */
void zs__grad_abandon(zs_model* m, int unit);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_UNIT_H_ */
