/*
 * engine_gather.c — the public parameter calls: zs_unit_gather,
 * zs_unit_release, zs_unit_prefetch, zs_tensor_data and eval mode, over the
 * unit references (engine_unit.c) and the prefetch trace (engine_sched.c).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine_sched.h"
#include "runtime/engine/engine_unit.h"
#include "runtime/engine/engine_view.h"

static zs_status zs__unit_gather(zs_model* m, int unit, void* arg) {
  (void)arg;
  zs_status st = ZS_OK;
  const double t0 = m->ctx->prof != NULL ? zs__now() : 0.0;
  zs__unit* u = &m->units[unit];
  if (u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_gather: unit '%s' is already gathered; release "
                     "it before gathering it again", u->name);
  if (u->unused)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_gather: unit '%s' was marked unused in this "
                     "micro-batch (zs_unit_mark_unused); it can be used "
                     "again after zs_step", u->name);
  zs__progress(m);
  if (m->gathers && !m->eval) {
    st = zs__trace_follow(m, unit);
    if (st != ZS_OK) return st;
    zs__live_make_room(m, unit);
  }
  st = zs__hold_for_use(m, unit);
  if (st != ZS_OK) return st;
  if (m->gathers && !m->eval) zs__unsteady_note(m, unit);
  int held = 0; /* owners holding a reference for this gather */
  while (held < u->nowners && st == ZS_OK) {
    st = zs__hold_for_use(m, u->owners[held]);
    if (st == ZS_OK) held++;
  }
  if (st == ZS_OK && !m->eval) st = zs__prefetch_issue(m);
  if (st == ZS_OK) st = zs__ready(m, u);
  for (int k = 0; k < u->nowners && st == ZS_OK; k++)
    st = zs__ready(m, &m->units[u->owners[k]]);
  if (st != ZS_OK) {
    while (held-- > 0) zs__drop(m, u->owners[held]);
    zs__drop(m, unit);
    return st;
  }
  u->user_gathered = 1;
  if (!m->eval) u->touched = 1; /* (a micro-batch's use; eval has none) */
  /* stacked kinds: the slices of the unit and of its tie owners */
  zs__view_hold(m, u, ZS__VIEW_PARAMS);
  if (m->ctx->prof != NULL)  /* from the call until the parameters are ready */
    zs__profiler_span(m->ctx->prof, 0, "gather", "gather", t0, zs__now(),
                      u->name, 0, 0, 0);
  return ZS_OK;
}

zs_status zs_unit_gather(zs_model* m, int unit) {
  return zs__public_call(m, "zs_unit_gather", unit, 1, zs__unit_gather, NULL);
}

zs_status zs_unit_release(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_release");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (!u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_release: unit '%s' is not gathered (release "
                     "without a matching zs_unit_gather)", u->name);
  st = zs__view_drop(m, u, ZS__VIEW_PARAMS);
  for (int k = u->nowners - 1; k >= 0; k--) zs__drop(m, u->owners[k]);
  /* Released in the forward pass (its gradients not touched yet this
   * step) with reshard_after_forward off: keep it for the backward. A unit
   * some ranks may not use is always kept: the others, which do not
   * gather it in the backward, could not send their shards again. */
  if (u->policy.gather_on_use && !m->eval && !u->forward_hold &&
      u->releases == 0 && !u->user_grad_open &&
      (u->allow_unused || (!m->ctx->config.reshard_after_forward &&
                           u->grad_state == ZS__GRAD_IDLE)))
    u->forward_hold = 1;
  else
    zs__drop(m, unit);
  u->user_gathered = 0;
  zs__progress(m);
  if (m->ctx->prof != NULL) {
    const double t = zs__now();
    zs__profiler_span(m->ctx->prof, 0, "release", "release", t, t, u->name, 0,
                      0, 0);
  }
  return st;
}

zs_status zs_model_set_eval(zs_model* m, int eval) {
  zs_status st = zs__check_finalized(m, "zs_model_set_eval");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(eval == 0 || eval == 1,
             "zs_model_set_eval: eval must be 0 or 1, got %d", eval);
  if (eval == m->eval) return ZS_OK;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    if (u->user_gathered || u->user_grad_open)
      return zs__error(ZS_ERR_INVALID_STATE,
                       "zs_model_set_eval: unit '%s' is still %s; release it "
                       "first", u->name,
                       u->user_gathered ? "gathered" : "acquired for gradients");
  }
  if (eval && m->seen_len > 0)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_model_set_eval: a training step is in progress (%d "
                     "gathers since the last zs_step); evaluate between "
                     "steps", m->seen_len);
  /* Unused prefetches and forward holds belong to the training step. */
  st = zs__prefetch_drain(m);
  /* an eval pass's marks of unused units end with it (sends included) */
  for (int i = 0; i < m->nunits && st == ZS_OK; i++)
    st = zs__unused_send_finish(m, &m->units[i]);
  if (st == ZS_OK) m->eval = eval;
  return st;
}

static zs_status zs__unit_prefetch(zs_model* m, int unit, void* arg) {
  (void)arg;
  if (m->eval) return ZS_OK;
  /* (a unit some ranks may not use is gathered at its use only) */
  if (!m->units[unit].policy.gather_on_use || m->units[unit].gather_refs > 0 ||
      m->units[unit].allow_unused)
    return ZS_OK;
  if (m->max_live_elems > 0 &&
      m->live_elems + zs__live_room(m) + zs__prefetch_cost(m, unit) >
          m->max_live_elems)
    return ZS_OK; /* a hint: the live limit (and its room) wins */
  if (m->prefetches + zs__prefetch_count(m, unit) > m->ctx->config.prefetch_depth)
    return ZS_OK; /* ... and so does the depth */
  return zs__prefetch_one(m, unit);
}

zs_status zs_unit_prefetch(zs_model* m, int unit) {
  return zs__public_call(m, "zs_unit_prefetch", unit, 1, zs__unit_prefetch, NULL);
}

static zs_status zs__unit_mark_unused(zs_model* m, int unit, void* arg) {
  (void)arg;
  zs__unit* u = &m->units[unit];
  if (!u->allow_unused)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_mark_unused: unit '%s' was not declared with "
                     "zs_unit_allow_unused before zs_model_finalize", u->name);
  if (u->unused)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_mark_unused: unit '%s' is already marked unused "
                     "in this micro-batch", u->name);
  if (u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_mark_unused: unit '%s' is gathered; release it "
                     "first", u->name);
  if (u->touched || u->user_grad_open || u->releases > 0)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_mark_unused: unit '%s' was %s in this "
                     "micro-batch; mark it before any use, where the rank "
                     "would gather it", u->name,
                     u->touched ? "gathered" : "given gradients");
  zs__progress(m);
  if (m->gathers && !m->eval) {
    zs_status st = zs__trace_follow(m, unit);
    if (st != ZS_OK) return st;
  }
  zs_status st = zs__unused_send(m, unit);
  /* (in eval mode a mark stands for one gather: nothing carries over) */
  if (st == ZS_OK && !m->eval) u->unused = 1;
  /* the prefetches a gather of the unit would start here, so that every
   * rank issues the same collectives */
  if (st == ZS_OK && !m->eval) st = zs__prefetch_issue(m);
  return st;
}

zs_status zs_unit_mark_unused(zs_model* m, int unit) {
  return zs__public_call(m, "zs_unit_mark_unused", unit, 1,
                         zs__unit_mark_unused, NULL);
}

zs_status zs_tensor_data(zs_model* m, int tensor, void** data) {
  zs_status st = zs__check_finalized(m, "zs_tensor_data");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(tensor >= 0 && tensor < m->ntensors,
             "zs_tensor_data: tensor %d does not exist (%d tensors)", tensor,
             m->ntensors);
  ZS_REQUIRE(data != NULL, "zs_tensor_data: data is NULL");
  const zs__tensor* t = &m->tensors[tensor];
  if (!m->units[t->unit].user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_tensor_data: tensor '%s': its unit '%s' is not "
                     "gathered; call zs_unit_gather first", t->name,
                     m->units[t->unit].name);
  const zs__tensor* o = t->tied_to >= 0 ? &m->tensors[t->tied_to] : t;
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *data = o->kind >= 0 ? zs__view_at(m, o, ZS__VIEW_PARAMS)
                       : zs__at(su->params_full, t->offset, su->elem);
  return ZS_OK;
}
