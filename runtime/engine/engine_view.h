/*
 * engine_view.h — the views of stacked kinds (engine_view.c): per kind one
 * parameter and one gradient view at a fixed address, each a memfd mapping
 * into which a held unit's slices are copied, and whose pages under no held
 * slice are given back to the system (zeroshard.h, "Stacked kinds").
 */
#ifndef ZS_RUNTIME_ENGINE_VIEW_H_
#define ZS_RUNTIME_ENGINE_VIEW_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Maps every kind's views (finalize, after the units' storage): the
 * parameter view always, the gradient view when a slice is trainable.
 * Nothing resident yet. Errors: OUT_OF_MEMORY, IO (memfd, mmap), naming the
 * kind; INVALID_ARGUMENT when a kind's slices disagree on their units'
 * element sizes. */
zs_status zs__views_create(zs_model* m);
/* Unmaps and closes them, removing their accounting (NULL-safe per kind). */
void zs__views_destroy(zs_model* m);
/* A hold on the slices of unit u and of the owners of its tied tensors
 * (what a user's gather or gradient acquire of u covers) in view `which`
 * (ZS__VIEW_PARAMS or _GRADS): at a unit's first (refs 0 -> 1) each slice
 * is copied in from its full parameters (params_full) or its gradient
 * accumulation (grad_accum), and its pages counted resident. Never fails
 * (no allocation). */
void zs__view_hold(zs_model* m, zs__unit* u, int which);
/* Ends such a hold: at a unit's last, gradient slices are copied back into
 * grad_accum (before the unit's reduction may start), and the pages no held
 * slice overlaps are punched out (fallocate PUNCH_HOLE). Errors: IO when
 * the system refuses the punch (the pages then stay resident and counted);
 * the hold ends anyway. */
zs_status zs__view_drop(zs_model* m, zs__unit* u, int which);
/* Where a slice tensor's parameters / gradients live in its kind's view. */
void* zs__view_at(zs_model* m, const zs__tensor* t, int which);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_VIEW_H_ */
