/*
 * engine_step.c — zs_step: the cross-rank check, the reductions whose last
 * use was not known, the optimizer on this rank's span, and the (bucketed,
 * non-blocking) all-gather of updated parameters at stages 1-2, which the
 * next step's gather of each unit waits for. Gathers live in
 * engine_gather.c, gradients in engine_grad.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"

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
  /* Unused prefetches and forward holds end with the step. */
  ZS_CHECK(zs__prefetch_drain(m));
  /* Units whose last use was not known (first step, or fewer uses than
   * recorded, or not used at all: zero gradient) start their reductions
   * now, in unit order, which is the same on every rank; then every
   * reduction in flight is finished, in unit order. */
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    if (u->grad_state == ZS__GRAD_IDLE) ZS_CHECK(zs__grad_prepare(m, u));
    if (u->grad_state == ZS__GRAD_ACCUM) ZS_CHECK(zs__grad_reduce_start(m, u));
  }
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (u->grad_state == ZS__GRAD_REDUCING) ZS_CHECK(zs__grad_reduce_finish(m, u));
  }
  /* Stage 0 updates full buffers: gather every rank's reduced shards. */
  if (m->ctx->config.stage == 0) ZS_CHECK(zs__grad_gather_start(m));
  /* Wait for those, and for stage 1-2's parameter all-gathers of the
   * previous step, before the optimizer writes. */
  for (int i = 0; i < m->nunits; i++)
    ZS_CHECK(zs__inflight_wait(m->ctx->comm, &m->units[i].shard_ops));
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].releases > m->units[i].uses_recorded)
      m->units[i].uses_recorded = m->units[i].releases;
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].trainable) ZS_CHECK(zs__optimize_unit(m, &m->units[i]));
  /* Stages 1-2 keep full parameters: every rank's updated shard goes back
   * into everyone's full buffer, bucket by bucket, without waiting. */
  if (m->ctx->config.stage == 1 || m->ctx->config.stage == 2)
    for (int i = 0; i < m->nunits; i++) {
      zs__unit* u = &m->units[i];
      for (int b = 0; u->trainable && b < zs__bucket_count(m, u); b++) {
        size_t off, cnt;
        zs__bucket(m, u, b, &off, &cnt);
        zs__coll* op = NULL;
        ZS_CHECK(zs__comm_iall_gather_strided(
            m->ctx->comm, zs__tag(ZS__P_PARAM_GATHER, i, u->name),
            u->params_full, off, u->layout.shard, cnt, u->dtype, &op));
        ZS_CHECK(zs__inflight_push(&u->shard_ops, op));
      }
    }
  for (int i = 0; i < m->ntensors; i++) {
    zs__tensor* t = &m->tensors[i];
    if (t->tied_to < 0 && !(t->flags & ZS_TENSOR_FROZEN)) t->step++;
  }
  m->steps_applied++;
cleanup:
  /* A new step starts whatever happened after the reductions began. */
  if (st != ZS_OK) (void)zs__quiesce(m);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    u->releases = 0;
    if (u->grad_state == ZS__GRAD_ACCUM) { /* a failed reduction */
      if (u->grad_accum != u->grads_full)
        zs__dev_free(m->ctx->device, u->grad_accum);
      zs__dev_free(m->ctx->device, u->grad_saved);
      zs__dev_free(m->ctx->device, u->red_sum);
      u->grad_accum = u->grad_saved = u->red_sum = NULL;
      u->reopened = 0;
    }
    u->grad_state = ZS__GRAD_IDLE;
  }
  zs__trace_end_step(m);
  m->steps_called++;
  if (info != NULL) {
    info->applied = st == ZS_OK;
    info->step = m->steps_applied;
    info->grad_norm = -1.0;
    info->loss_scale = 1.0;
  }
  return st;
}
