/*
 * engine_step.c — the per-step state machine: gather/release of parameters,
 * acquire/release of gradient buffers, the reduce-scatter after a unit's
 * last use, and zs_step (deferred reductions, the cross-rank sequence
 * check, the optimizer on this rank's span, the parameter all-gather).
 *
 *   params:  SHARDED --gather--> GATHERED --release--> SHARDED (stage 3)
 *            stages 0-2 stay resident; gather/release only count users.
 *   grads:   IDLE --acquire--> ACCUM --last release--> REDUCED --step--> IDLE
 *            (an acquire after REDUCED re-opens: see zs__grad_prepare)
 *
 * Every stage reduces with the same reduce-scatter of the unit's whole flat
 * buffer, so each element is summed in the same order at every stage; the
 * stages differ only in which buffers persist (engine.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"

static zs_status zs__check_unit(const zs_model* m, int unit, const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "%s: unit %d does not exist (%d units)", fn, unit, m->nunits);
  return ZS_OK;
}

static zs_status zs__check_tensor(const zs_model* m, int tensor,
                                  const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(tensor >= 0 && tensor < m->ntensors,
             "%s: tensor %d does not exist (%d tensors)", fn, tensor,
             m->ntensors);
  return ZS_OK;
}

/* ==== Parameters: gather / release ======================================== */

zs_status zs__unit_gather_internal(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->gather_refs == 0 && m->ctx->config.stage == 3) {
    zs__device* dev = m->ctx->device;
    zs_status st =
        zs__dev_alloc(dev, ZS_MEM_PARAMS_GATHERED, u->layout.padded * u->elem,
                      0, u->name, &u->params_full);
    if (st == ZS_OK)
      st = zs__comm_all_gather(m->ctx->comm,
                               zs__tag(ZS__P_GATHER, unit, u->name),
                               u->params_shard, u->params_full,
                               u->layout.shard, u->dtype);
    if (st != ZS_OK) {
      zs__dev_free(dev, u->params_full);
      u->params_full = NULL;
      return zs__error_prefix(st, "gather of unit '%s': ", u->name);
    }
  }
  u->gather_refs++;
  return ZS_OK;
}

void zs__unit_release_internal(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (--u->gather_refs == 0 && m->ctx->config.stage == 3) {
    zs__dev_free(m->ctx->device, u->params_full);
    u->params_full = NULL;
  }
}

zs_status zs_unit_gather(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_gather");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_gather: unit '%s' is already gathered; release "
                     "it before gathering it again", u->name);
  st = zs__unit_gather_internal(m, unit);
  if (st != ZS_OK) return st;
  for (int k = 0; k < u->nowners; k++) {
    st = zs__unit_gather_internal(m, u->owners[k]);
    if (st != ZS_OK) {
      while (k-- > 0) zs__unit_release_internal(m, u->owners[k]);
      zs__unit_release_internal(m, unit);
      return st;
    }
  }
  u->user_gathered = 1;
  return ZS_OK;
}

zs_status zs_unit_release(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_release");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (!u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_release: unit '%s' is not gathered (release "
                     "without a matching zs_unit_gather)", u->name);
  for (int k = u->nowners - 1; k >= 0; k--)
    zs__unit_release_internal(m, u->owners[k]);
  zs__unit_release_internal(m, unit);
  u->user_gathered = 0;
  return ZS_OK;
}

zs_status zs_tensor_data(zs_model* m, int tensor, void** data) {
  zs_status st = zs__check_tensor(m, tensor, "zs_tensor_data");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(data != NULL, "zs_tensor_data: data is NULL");
  const zs__tensor* t = &m->tensors[tensor];
  if (!m->units[t->unit].user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_tensor_data: tensor '%s': its unit '%s' is not "
                     "gathered; call zs_unit_gather first", t->name,
                     m->units[t->unit].name);
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *data = zs__at(su->params_full, t->offset, su->elem);
  return ZS_OK;
}

/* ==== Gradients: acquire / release / reduce =============================== */

/* Makes the accumulation buffer ready for a new contribution: zeroed on the
 * first open of the step. A unit opened again after its reduction (it was
 * used more often than recorded) keeps its reduced shard in grad_saved and
 * starts a fresh zeroed buffer; its next reduction adds to the saved shard,
 * which is exact up to one extra rounding of the mean. */
static zs_status zs__grad_prepare(zs_model* m, zs__unit* u) {
  zs__device* dev = m->ctx->device;
  const int stage = m->ctx->config.stage;
  const size_t S = u->layout.shard * u->elem, P = u->layout.padded * u->elem;
  zs_status st = ZS_OK;
  if (u->grad_state == ZS__GRAD_ACCUM) return ZS_OK;
  if (u->grad_state == ZS__GRAD_REDUCED) {
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_COMM_BUFFERS, S, 0, u->name,
                           &u->grad_saved));
    ZS_CHECK(dev->ops->copy(dev, u->grad_saved, zs__grad_shard_ptr(m, u), S,
                            NULL));
    u->reopened = 1;
  }
  if (stage >= 2) {
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_COMM_BUFFERS, P, 1, u->name,
                           &u->grad_accum));
  } else {
    u->grad_accum = u->grads_full;
    ZS_CHECK(dev->ops->memset(dev, u->grad_accum, 0, P, NULL));
  }
  u->grad_state = ZS__GRAD_ACCUM;
cleanup:
  if (st != ZS_OK) {
    zs__dev_free(dev, u->grad_saved);
    u->grad_saved = NULL;
    u->reopened = 0;
  }
  return st;
}

/* Reduce-scatter of the unit's accumulation buffer into its gradient shard,
 * divided by the world size (the mean over ranks). Stage 0 then all-gathers
 * the shards back into the full gradient. */
static zs_status zs__grad_reduce(zs_model* m, zs__unit* u) {
  const int ui = (int)(u - m->units);
  const zs__coll_tag tag = zs__tag(ZS__P_REDUCE, ui, u->name);
  zs__device* dev = m->ctx->device;
  zs__comm* comm = m->ctx->comm;
  const int stage = m->ctx->config.stage;
  const float world = (float)m->ctx->world;
  const size_t S = u->layout.shard;
  void* shard = zs__grad_shard_ptr(m, u);
  void* tmp = NULL;
  zs_status st = ZS_OK;
  if (stage >= 2 && !u->reopened) {
    ZS_CHECK(zs__comm_reduce_scatter(comm, tag, u->grad_accum, shard, S,
                                     u->dtype, ZS__RED_SUM));
    ZS_CHECK(dev->ops->div_add(dev, shard, NULL, shard, world, S, u->dtype,
                               NULL));
  } else {
    /* The shard lies inside the accumulation buffer (stages 0-1) or must be
     * added to (re-opened): reduce into a temporary first. */
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_COMM_BUFFERS, S * u->elem, 0, u->name,
                           &tmp));
    ZS_CHECK(zs__comm_reduce_scatter(comm, tag, u->grad_accum, tmp, S,
                                     u->dtype, ZS__RED_SUM));
    ZS_CHECK(dev->ops->div_add(dev, shard, u->grad_saved, tmp, world, S,
                               u->dtype, NULL));
  }
  if (stage == 0)
    ZS_CHECK(zs__comm_all_gather(comm, zs__tag(ZS__P_GRAD_GATHER, ui, u->name),
                                 ZS__IN_PLACE, u->grads_full, S, u->dtype));
  if (stage >= 2) zs__dev_free(dev, u->grad_accum);
  u->grad_accum = NULL;
  zs__dev_free(dev, u->grad_saved);
  u->grad_saved = NULL;
  u->reopened = 0;
  u->grad_state = ZS__GRAD_REDUCED;
cleanup:
  zs__dev_free(dev, tmp);
  if (st != ZS_OK) st = zs__error_prefix(st, "reduction of unit '%s': ", u->name);
  return st;
}

static zs_status zs__grad_open(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->trainable) {
    zs_status st = zs__grad_prepare(m, u);
    if (st != ZS_OK) return st;
  }
  u->grad_refs++;
  return ZS_OK;
}

static int zs__expected_uses(const zs__unit* u) {
  return u->uses_explicit > 0 ? u->uses_explicit : u->uses_recorded;
}

static zs_status zs__grad_close(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  u->grad_refs--;
  u->releases++;
  int expected = zs__expected_uses(u);
  if (u->trainable && u->grad_refs == 0 && expected > 0 &&
      u->releases >= expected && u->grad_state == ZS__GRAD_ACCUM)
    return zs__grad_reduce(m, u);
  return ZS_OK;
}

zs_status zs_unit_grad_acquire(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_grad_acquire");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (u->user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_acquire: gradients of unit '%s' are already "
                     "acquired; release them first", u->name);
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
  return ZS_OK;
}

zs_status zs_unit_grad_release(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_grad_release");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (!u->user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_release: gradients of unit '%s' were not "
                     "acquired", u->name);
  u->user_grad_open = 0;
  /* Close everything even if a reduction fails, so refcounts stay exact. */
  st = zs__grad_close(m, unit);
  for (int k = 0; k < u->nowners; k++) {
    zs_status s2 = zs__grad_close(m, u->owners[k]);
    if (st == ZS_OK) st = s2;
  }
  return st;
}

zs_status zs_tensor_grad(zs_model* m, int tensor, void** grad) {
  zs_status st = zs__check_tensor(m, tensor, "zs_tensor_grad");
  if (st != ZS_OK) return st;
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
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *grad = zs__at(su->grad_accum, t->offset, su->elem);
  return ZS_OK;
}

/* ==== Step ================================================================= */

/* The optimizer on this rank's span of a unit: the whole buffer at stage 0,
 * the shard at 1-3, one call per piece of a trainable tensor (pieces never
 * include gaps or padding). */
static zs_status zs__optimize_unit(zs_model* m, zs__unit* u) {
  const zs_optimizer_config* o = &m->ctx->config.optimizer;
  const int stage = m->ctx->config.stage;
  float* p = (float*)(stage == 0 ? u->params_full : zs__param_shard_ptr(m, u));
  float* g = (float*)(stage == 0 ? u->grads_full : zs__grad_shard_ptr(m, u));
  float* s0 = (float*)u->state[0];
  float* s1 = (float*)u->state[1];
  for (size_t i = 0; i < u->nopt_pieces; i++) {
    const zs__piece* pc = &u->opt_pieces[i];
    const zs__tensor* t = &m->tensors[u->tensors[pc->tensor]];
    size_t off = pc->span_offset;
    int64_t step = t->step + 1;
    zs_status st;
    if (o->kind == ZS_OPTIM_SGD) {
      zs_sgd_hparams hp = {m->group_lr[t->group], o->momentum, o->dampening,
                           m->group_wd[t->group], o->nesterov};
      st = zs_optim_sgd(p + off, g + off, s0 != NULL ? s0 + off : NULL,
                        pc->count, &hp, step);
    } else {
      zs_adam_hparams hp = {m->group_lr[t->group], o->beta1, o->beta2, o->eps,
                            m->group_wd[t->group]};
      st = (o->kind == ZS_OPTIM_ADAMW ? zs_optim_adamw : zs_optim_adam)(
          p + off, g + off, s0 + off, s1 + off, pc->count, &hp, step);
    }
    if (st != ZS_OK)
      return zs__error_prefix(st, "optimizer on tensor '%s': ", t->name);
  }
  return ZS_OK;
}

/* One all-reduce (MAX of each value and its complement gives max and min)
 * that every rank is at the same step, has issued the same collectives for
 * the same units since the context was created, used every unit the same
 * number of times this step, will schedule reductions the same way, and
 * uses the same learning rates. Runs before anything of the step moves. */
static zs_status zs__step_consistency(zs_model* m, zs_status local) {
  uint64_t uses = ZS__FNV_SEED, lrs = ZS__FNV_SEED;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    int64_t rec[3] = {u->releases, u->uses_explicit, u->uses_recorded};
    uses = zs__hash_bytes(uses, rec, sizeof rec);
  }
  lrs = zs__hash_bytes(lrs, m->group_lr, sizeof(double) * (size_t)m->ngroups);
  lrs = zs__hash_bytes(lrs, m->group_wd, sizeof(double) * (size_t)m->ngroups);
  enum { K = 4 };
  uint64_t mine[K] = {(uint64_t)m->steps_called, m->ctx->comm->seq_hash, uses,
                      lrs};
  /* Heap, not stack: a collective's buffer (see zs__comm_free). */
  uint64_t* v = (uint64_t*)malloc((2 * K + 1) * sizeof *v);
  if (v == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step: malloc");
  for (int k = 0; k < K; k++) {
    v[2 * k] = mine[k];
    v[2 * k + 1] = ~mine[k];
  }
  /* The same all-reduce agrees on local misuse (zs__comm_agree). */
  v[2 * K] = zs__comm_agree_code(m->ctx->comm, local);
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  zs_status st = zs__comm_all_reduce(m->ctx->comm,
                                     zs__tag(ZS__P_CHECK, -1, NULL),
                                     ZS__IN_PLACE, v, 2 * K + 1, ZS_UINT64,
                                     ZS__RED_MAX);
  uint64_t r[2 * K + 1];
  memcpy(r, v, sizeof r);
  zs__comm_free(m->ctx->comm, v);
  if (st != ZS_OK) return st;
  if (local != ZS_OK) zs__error(local, "%s", saved);
  st = zs__comm_agree_finish(m->ctx->comm, local, r[2 * K], "zs_step");
  if (st != ZS_OK) return st;
  static const char* const what[K] = {
      "step counters",
      "collective sequences (which units were gathered and reduced, in "
      "which order)",
      "gradient use counts", "learning rates or weight decays"};
  for (int k = 0; k < K; k++)
    if (r[2 * k] != ~r[2 * k + 1])
      return zs__error(ZS_ERR_MISMATCH,
                       "zs_step %lld: ranks disagree on their %s; every rank "
                       "must gather, release and acquire the same units in "
                       "the same order and set the same learning rates "
                       "(control flow must not depend on the rank's data)",
                       (long long)m->steps_called, what[k]);
  return ZS_OK;
}

static zs_status zs__step_check_closed(const zs_model* m) {
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    if (u->user_gathered)
      return zs__error(ZS_ERR_INVALID_STATE,
                       "zs_step: unit '%s' is still gathered; release it "
                       "before the step", u->name);
    if (u->user_grad_open)
      return zs__error(ZS_ERR_INVALID_STATE,
                       "zs_step: gradients of unit '%s' are still acquired; "
                       "release them before the step", u->name);
  }
  return ZS_OK;
}

zs_status zs_step(zs_model* m, zs_step_info* info) {
  zs_status st = zs__check_finalized(m, "zs_step");
  if (st != ZS_OK) return st;
  /* Misuse on any rank ends the step on every rank before anything moves;
   * nothing changes, so the caller can fix the order and call again. */
  st = zs__step_consistency(m, zs__step_check_closed(m));
  if (st != ZS_OK) return st;
  /* Units whose last use was not known (first step, or fewer uses than
   * recorded, or not used at all: zero gradient) are reduced now, in unit
   * order, which is the same on every rank. */
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable || u->grad_state == ZS__GRAD_REDUCED) continue;
    ZS_CHECK(zs__grad_prepare(m, u));
    ZS_CHECK(zs__grad_reduce(m, u));
  }
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].releases > m->units[i].uses_recorded)
      m->units[i].uses_recorded = m->units[i].releases;
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].trainable) ZS_CHECK(zs__optimize_unit(m, &m->units[i]));
  /* Stages 1-2 keep full parameters: every rank's updated shard goes back
   * into everyone's full buffer. */
  if (m->ctx->config.stage == 1 || m->ctx->config.stage == 2)
    for (int i = 0; i < m->nunits; i++) {
      zs__unit* u = &m->units[i];
      if (u->trainable)
        ZS_CHECK(zs__comm_all_gather(
            m->ctx->comm, zs__tag(ZS__P_PARAM_GATHER, i, u->name),
            ZS__IN_PLACE, u->params_full, u->layout.shard, u->dtype));
    }
  for (int i = 0; i < m->ntensors; i++) {
    zs__tensor* t = &m->tensors[i];
    if (t->tied_to < 0 && !(t->flags & ZS_TENSOR_FROZEN)) t->step++;
  }
  m->steps_applied++;
cleanup:
  /* A new step starts whatever happened after the reductions began. */
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    u->releases = 0;
    if (u->grad_state == ZS__GRAD_ACCUM) { /* a failed reduction */
      if (u->grad_accum != u->grads_full)
        zs__dev_free(m->ctx->device, u->grad_accum);
      zs__dev_free(m->ctx->device, u->grad_saved);
      u->grad_accum = u->grad_saved = NULL;
      u->reopened = 0;
    }
    u->grad_state = ZS__GRAD_IDLE;
  }
  m->steps_called++;
  if (info != NULL) {
    info->applied = st == ZS_OK;
    info->step = m->steps_applied;
    info->grad_norm = -1.0;
    info->loss_scale = 1.0;
  }
  return st;
}
