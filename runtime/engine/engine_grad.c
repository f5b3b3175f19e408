/*
 * engine_grad.c — the public gradient calls: zs_unit_grad_acquire and
 * _release (the reduction starts at a unit's last use of the step) and
 * zs_tensor_grad, over the unit's buffers (engine_unit.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine_unit.h"
#include "runtime/engine/engine_view.h"

static zs_status zs__grad_open(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->trainable) {
    zs_status st = zs__grad_prepare(m, u);
    if (st != ZS_OK) return st;
  }
  u->grad_refs++;
  return ZS_OK;
}

/* Uses per step (zs_unit_grad_uses): the declared count, raised by any
 * step that used the unit more often (recorded).
 * reduce 0: only the counts (after a failure no reduction may start: the
 * other ranks' collectives would no longer match this rank's) */
static zs_status zs__grad_close(zs_model* m, int unit, int reduce) {
  zs__unit* u = &m->units[unit];
  u->grad_refs--;
  u->releases++;
  if (!reduce) return ZS_OK;
  const int expected = zs_unit_grad_uses(m, unit);
  /* Local accumulation reduces at the K-th micro-batch only. */
  if (m->ctx->config.grad_accum_local && !zs__accum_boundary(m)) return ZS_OK;
  /* A unit some ranks may not use reduces in zs_step, on every rank. */
  if (u->allow_unused) return ZS_OK;
  if (u->trainable && u->grad_refs == 0 && expected > 0 &&
      u->releases >= expected && u->grad_state == ZS__GRAD_ACCUM)
    return zs__grad_reduce_start(m, u);
  return ZS_OK;
}

static zs_status zs__unit_grad_acquire(zs_model* m, int unit, void* arg) {
  (void)arg;
  zs_status st = ZS_OK;
  zs__progress(m);
  zs__unit* u = &m->units[unit];
  if (m->eval)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_acquire: unit '%s': the model is in eval "
                     "mode (zs_model_set_eval(model, 0) before training)",
                     u->name);
  if (u->user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_acquire: gradients of unit '%s' are already "
                     "acquired; release them first", u->name);
  if (u->unused)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_acquire: unit '%s' was marked unused in "
                     "this micro-batch (zs_unit_mark_unused)", u->name);
  zs__accounting_phase(m->ctx->acct, ZS_PHASE_BACKWARD);
  st = zs__grad_open(m, unit);
  if (st != ZS_OK) return st;
  for (int k = 0; k < u->nowners; k++) {
    st = zs__grad_open(m, u->owners[k]);
    if (st != ZS_OK) {
      /* Undo without counting a use. */
      while (k-- > 0) m->units[u->owners[k]].grad_refs--;
      u->grad_refs--;
      return st;
    }
  }
  u->user_grad_open = 1;
  u->touched = 1;
  zs__view_hold(m, u, ZS__VIEW_GRADS);
  zs__comm* c = m->ctx->shard_comm;
  if (c->ops->mark != NULL) c->ops->mark(c, "backward begin", u->name);
  return ZS_OK;
}

zs_status zs_unit_grad_acquire(zs_model* m, int unit) {
  return zs__public_call(m, "zs_unit_grad_acquire", unit, 1, zs__unit_grad_acquire,
                  NULL);
}

static zs_status zs__unit_grad_release(zs_model* m, int unit, void* arg) {
  (void)arg;
  zs_status st = ZS_OK;
  zs__unit* u = &m->units[unit];
  if (!u->user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_release: gradients of unit '%s' were not "
                     "acquired", u->name);
  u->user_grad_open = 0;
  zs__comm* c = m->ctx->shard_comm;
  if (c->ops->mark != NULL) c->ops->mark(c, "backward end", u->name);
  zs__forward_hold_end(m, unit);
  /* stacked kinds: the views' gradient slices back into the accumulation
   * buffers before a reduction reads them */
  const zs_status vst = zs__view_drop(m, u, ZS__VIEW_GRADS);
  /* Close everything even if a reduction fails, so refcounts stay exact. */
  st = zs__grad_close(m, unit, 1);
  for (int k = 0; k < u->nowners; k++) {
    zs_status s2 = zs__grad_close(m, u->owners[k], st == ZS_OK);
    if (st == ZS_OK) st = s2;
  }
  zs__progress(m);
  return st != ZS_OK ? st : vst;
}

zs_status zs_unit_grad_release(zs_model* m, int unit) {
  return zs__public_call(m, "zs_unit_grad_release", unit, 1, zs__unit_grad_release,
                  NULL);
}

zs_status zs_tensor_grad(zs_model* m, int tensor, void** grad) {
  zs_status st = zs__check_finalized(m, "zs_tensor_grad");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(tensor >= 0 && tensor < m->ntensors,
             "zs_tensor_grad: tensor %d does not exist (%d tensors)", tensor,
             m->ntensors);
  ZS_REQUIRE(grad != NULL, "zs_tensor_grad: grad is NULL");
  const zs__tensor* t = &m->tensors[tensor];
  if (!m->units[t->unit].user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_tensor_grad: tensor '%s': gradients of its unit '%s' "
                     "are not acquired; call zs_unit_grad_acquire first",
                     t->name, m->units[t->unit].name);
  if (t->flags & ZS_TENSOR_FROZEN)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_tensor_grad: tensor '%s' is frozen: it has no "
                     "gradient", t->name);
  const zs__tensor* o = t->tied_to >= 0 ? &m->tensors[t->tied_to] : t;
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *grad = o->kind >= 0 ? zs__view_at(m, o, ZS__VIEW_GRADS)
                       : zs__at(su->grad_accum, t->offset, su->gelem);
  return ZS_OK;
}
