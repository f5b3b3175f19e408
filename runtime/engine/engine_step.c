/*
 * engine_step.c — zs_step and zs_step_discard: the cross-rank check, the
 * reductions whose last use was not known, the optimizer
 * (engine_optim.c, engine_optim_nvme.c) and the all-gather of updated
 * parameters at stages 1-2, which the next step's gather of each unit
 * waits for; the discard's reconciliation and rollback.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_wait.h"
#include "runtime/core/core_compat.h"
#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"
#include "runtime/engine/engine_optim_nvme.h"
#include "runtime/engine/engine_sched.h"
#include "runtime/engine/engine_unit.h"
#include "runtime/engine/engine_view.h"

/* A step of units used with no gradient use count known (none declared,
 * none learned yet: the first step) held their gradients until zs_step,
 * each unit's accumulation buffer alive at once, so that step's peak
 * comm_buffers is higher than the later ones'. Said once per model, by
 * rank 0 (every rank has the same counts), naming the first such unit and
 * the call that avoids it. */
static void zs__uses_warn(zs_model* m) {
  if (m->uses_warned) return;
  int n = 0, first = -1;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    if (!u->trainable || u->releases == 0 || zs_unit_grad_uses(m, i) > 0 ||
        u->allow_unused)
      continue;
    if (first < 0) first = i;
    n++;
  }
  if (n == 0) return;
  m->uses_warned = 1;
  if (m->ctx->rank == 0)
    zs__log(ZS_LOG_WARN,
            "zs_step: %d unit(s) have no declared gradient use count (the "
            "first: unit '%s', released %d time(s) in this step), so their "
            "gradients were held until zs_step in this first step (a higher "
            "comm_buffers peak than later steps); declare the counts with "
            "zs_unit_set_grad_uses(model, unit, uses) before "
            "zs_model_finalize", n, m->units[first].name,
            m->units[first].releases);
}

double zs_model_loss_scale(const zs_model* m) {
  return m == NULL ? 0.0 : m->loss_scale;
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
    /* (a unit some ranks may not use has counts of its own on each rank,
     * and reduces in zs_step whatever they are) */
    int64_t rec[3] = {u->allow_unused ? 0 : u->releases, u->uses_explicit,
                      u->allow_unused ? 0 : u->uses_recorded};
    uses = zs__hash_bytes(uses, rec, sizeof rec);
  }
  lrs = zs__hash_bytes(lrs, m->group_lr, sizeof(double) * (size_t)m->ngroups);
  lrs = zs__hash_bytes(lrs, m->group_wd, sizeof(double) * (size_t)m->ngroups);
  /* what every rank must agree on */
  enum { STEP, COUNT, SEQ, USES, LRS, K };
  /* (collectives every rank issues alike, since the last reconciliation:
   * with shard groups the groups' counts may differ before it, and each
   * group's own gathers of units some ranks do not use are left out) */
  uint64_t mine[K] = {(uint64_t)m->steps_called,
                      m->ctx->comm->check_count - m->ctx->comm->check_base,
                      m->ctx->comm->seq_hash, uses, lrs};
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
      [STEP] = "step counters",
      [COUNT] = "numbers of collectives (a unit was gathered, released or "
                "had its gradients acquired on some ranks only, so some "
                "collective has no partner yet)",
      [SEQ] = "collective sequences (which units were gathered and reduced, "
              "in which order)",
      [USES] = "gradient use counts",
      [LRS] = "learning rates or weight decays"};
  /* (different counts first: a different sequence follows from them) */
  static const int order[K] = {COUNT, STEP, SEQ, USES, LRS};
  for (int i = 0; i < K; i++) {
    const int k = order[i];
    if (r[2 * k] != ~r[2 * k + 1]) {
      /* Every rank sees the same result and fails here. The sequence hash
       * restarts from the same value everywhere, so a caller that brings
       * its ranks back in line can go on: after zs_step_discard (which also
       * gives every collective without partners its partners) unless only
       * the learning rates differed. */
      m->ctx->comm->seq_hash = ZS__FNV_SEED;
      /* Only differing learning rates leave the reduced gradients right;
       * otherwise reductions were paired across different units (or one
       * rank's had no partner): they must be dropped, not applied. */
      if (k != LRS) { /* on every rank alike */
        m->must_discard = 1;
        snprintf(m->must_discard_msg, sizeof m->must_discard_msg,
                 "zs_step %lld: the ranks disagreed on their %s",
                 (long long)m->steps_called,
                 k == COUNT ? "numbers of collectives" : what[k]);
      }
      char range[128] = "";
      if (k == COUNT)
        snprintf(range, sizeof range, " (from %llu to %llu since the context "
                 "was created or last lined up by zs_step_discard)",
                 (unsigned long long)~r[2 * COUNT + 1],
                 (unsigned long long)r[2 * COUNT]);
      return zs__error(ZS_ERR_MISMATCH,
                       "zs_step %lld: ranks disagree on their %s%s; every "
                       "rank must gather, release and acquire the same units "
                       "in the same order and set the same learning rates "
                       "(control flow must not depend on the rank's data)%s",
                       (long long)m->steps_called, what[k], range,
                       k != LRS
                           ? "; the gradients reduced so far are wrong: drop "
                             "them with zs_step_discard on every rank and "
                             "redo the micro-batch"
                           : "");
    }
  }
  return ZS_OK;
}

static zs_status zs__step_check_closed(const zs_model* m) {
  if (m->eval)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_step: the model is in eval mode; call "
                     "zs_model_set_eval(model, 0) before training");
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

/* Hybrid sharding (docs/running.md, "Shard groups"; FSDP's HYBRID_SHARD,
 * DeepSpeed's MiCS): after the shard group's reduce-scatter each trainable
 * unit's gradient shard holds its group's mean; across the replica group
 * (the ranks holding the same shard, one per group) it becomes the mean
 * of the groups' means. An all-reduce in fixed replica order, as a
 * reduce-scatter and an all-gather (the shard splits evenly into R parts:
 * the layout pads units for every rank of the context): replica r sums
 * part r over replicas 0, 1, ..., R-1 in fp32, divides by R and rounds
 * once, then every replica gathers every part. All units' reduce-scatters
 * start at once, then their all-gathers. Bitwise the same on every
 * replica; without replicas nothing happens. */
static zs_status zs__replica_reduce(zs_model* m) {
  zs__comm* rc = m->ctx->replica_comm;
  const int R = m->ctx->replicas;
  if (rc == NULL || R <= 1) return ZS_OK;
  zs__inflight f = {0};
  zs_status st = ZS_OK;
  for (int pass = 0; pass < 2 && st == ZS_OK; pass++) {
    for (int i = 0; i < m->nunits && st == ZS_OK; i++) {
      zs__unit* u = &m->units[i];
      if (!u->trainable || u->layout.shard == 0) continue;
      const size_t part = u->layout.shard / (size_t)R;
      char* shard = (char*)zs__grad_shard_ptr(m, u);
      const zs__coll_tag tag = zs__tag(ZS__P_REPLICA, i, u->name);
      zs__coll* op = NULL;
      st = pass == 0
               ? zs__comm_ireduce_scatter(
                     rc, tag, ZS__REDUCE_FIXED, shard, 0, part, part,
                     shard + (size_t)m->ctx->replica_rank * part * u->gelem,
                     (float)R, u->gdtype, &op)
               : zs__comm_iall_gather(rc, tag, ZS__IN_PLACE, shard, part,
                                      u->gdtype, &op);
      if (st == ZS_OK) st = zs__inflight_push(rc, &f, op);
      if (st != ZS_OK)
        st = zs__error_prefix(st, "replica all-reduce of unit '%s': ",
                              u->name);
    }
    const zs_status s2 = zs__inflight_wait(rc, &f);
    if (st == ZS_OK) st = s2;
  }
  free(f.ops);
  return st;
}

/* After the reductions of the K-th micro-batch: the norm / overflow
 * agreement (one all-gather, only when clipping or loss scaling is on),
 * then the optimizer. *applied: whether the optimizer ran. */
static zs_status zs__step_apply(zs_model* m, zs_step_info* info,
                                int* applied) {
  const zs_config* cfg = &m->ctx->config;
  const int scaling = cfg->loss_scaler.mode != ZS_LOSS_SCALE_NONE;
  zs_status st = ZS_OK;
  double coef = 1.0 / m->loss_scale;
  if (scaling || cfg->clip_grad_norm) {
    double sumsq = 0.0;
    ZS_CHECK(zs__global_sumsq(m, &sumsq));
    /* the norm of the unscaled gradient; sqrt and the division are exact
     * enough in double for any fp32 result */
    const double norm = sqrt(sumsq) / m->loss_scale;
    info->grad_norm = norm;
    if (!isfinite(sumsq)) {
      info->overflow = 1;
      if (!scaling)
        ZS_FAIL(ZS_ERR_DIVERGED,
                "zs_step %lld: the gradient norm is %g (inf/NaN in the "
                "gradients) and no loss scaler can skip the step; nothing "
                "was applied (call zs_step_discard or fix the model)",
                (long long)m->steps_called, norm);
      if (cfg->loss_scaler.mode == ZS_LOSS_SCALE_DYNAMIC &&
          m->loss_scale <= cfg->loss_scaler.min_scale &&
          m->scale_hysteresis <= 1)
        ZS_FAIL(ZS_ERR_DIVERGED,
                "zs_step %lld: training diverged: the gradients overflow at "
                "the minimum loss scale %g (loss_scaler.min_scale); nothing "
                "was applied", (long long)m->steps_called, m->loss_scale);
      zs__scaler_update(m, 1);
      zs__log(ZS_LOG_INFO, "zs_step %lld: inf/NaN gradients, step skipped; "
              "loss scale now %g", (long long)m->steps_called, m->loss_scale);
      return ZS_OK;
    }
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6),
     * applied when below 1 */
    if (cfg->clip_grad_norm) {
      const double clip = cfg->max_grad_norm / (norm + 1e-6);
      if (clip < 1.0) coef *= clip;
    }
  }
  /* Units whose optimizer span is the whole buffer (stage 0) gather every
   * rank's reduced shards into their full gradients. */
  ZS_CHECK(zs__grad_gather_start(m));
  /* Wait for those, and for the previous step's refresh of resident
   * parameters (stages 1-2), before the optimizer writes. */
  for (int i = 0; i < m->nunits; i++) {
    ZS_CHECK(zs__inflight_wait(m->ctx->shard_comm, &m->units[i].shard_ops));
    zs__param_complete(&m->units[i]);
  }
  /* The step: one loop (zs__optimize) over the store of the master
   * weights and states, the policy's state_tier: in memory (device or CPU
   * offload's host memory), or NVMe offload's swap file. */
  const int nvme = m->nvme != NULL; /* (core_policy.h: ZS__LOOP_NVME) */
  zs__state_store store;
  zs_status local = nvme ? zs__nvme_store(m, &store) : zs__memory_store(m, &store);
  if (local == ZS_OK) local = zs__optimize(m, (float)coef, &store);
  /* agreed where the step can fail on one rank alone after others have
   * updated: NVMe I/O, and a user's optimizer returning an error */
  if (nvme || m->nvme_params != NULL || m->optim_fn != NULL) {
    /* the parameter shards' write-backs complete within the step; a
     * failure on one rank (a disk error) fails every rank here, and the
     * model, whose states are now partly updated */
    if (local == ZS_OK) local = zs__param_flush(m);
    if (local != ZS_OK)
      local = zs__param_abort(
          m, nvme ? zs__error_prefix(local, "NVMe offload step: ") : local);
    st = zs__comm_agree(m->ctx->comm, local,
                        nvme ? "NVMe offload step"
                        : m->nvme_params != NULL
                            ? "optimizer step (NVMe parameters)"
                            : "optimizer step (the optimizer callback)");
    if (st != ZS_OK) {
      m->broken = 1;
      snprintf(m->broken_msg, sizeof m->broken_msg, "%s", zs__error_body());
      goto cleanup;
    }
  } else {
    ZS_CHECK(local);
  }
  /* Resident parameters updated on the shard (stages 1-2): every rank's
   * updated shard goes back into everyone's full buffer, bucket by bucket,
   * without waiting (REFRESHING until done). */
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->policy.refresh_after_step) continue;
    ZS_CHECK(zs__param_state_set(u, ZS__PARAM_REFRESHING));
    for (int b = 0; b < zs__bucket_count(m, u); b++) {
      size_t off, cnt;
      zs__bucket(m, u, b, &off, &cnt);
      zs__coll* op = NULL;
      ZS_CHECK(zs__comm_iall_gather_strided(
          m->ctx->shard_comm, zs__tag(ZS__P_PARAM_GATHER, i, u->name),
          u->params_full, off, u->layout.shard, cnt, u->dtype, &op));
      ZS_CHECK(zs__inflight_push(m->ctx->shard_comm, &u->shard_ops, op));
    }
  }
  for (int i = 0; i < m->ntensors; i++) {
    zs__tensor* t = &m->tensors[i];
    if (t->tied_to < 0 && !(t->flags & ZS_TENSOR_FROZEN)) t->step++;
  }
  m->steps_applied++;
  zs__scaler_update(m, 0);
  *applied = 1;
cleanup:
  return st;
}

/* zs_step. A micro-batch before the K-th reduces (or, with local
 * accumulation, keeps) its gradients and returns; the K-th reduces what is
 * left and applies the optimizer. */
/* The step info a call fills, and whether it did: a call refused before
 * its work began leaves the caller's struct untouched (as 0.1 did). */
typedef struct zs__step_out {
  zs_step_info info;
  int filled;
} zs__step_out;

static zs_status zs__step_body(zs_model* m, int unit, void* arg) {
  (void)unit;
  zs__step_out* out = (zs__step_out*)arg;
  zs_step_info* info = &out->info;
  zs_status st = ZS_OK;
  /* the same on every rank: the failure was agreed */
  if (m->broken)
    return zs__error(ZS_ERR_INVALID_STATE, "zs_step: an earlier step failed "
                     "after updating part of the optimizer states (%s); drop "
                     "the pending gradients (zs_step_discard) and load a "
                     "checkpoint with its optimizer states (zs_checkpoint_load "
                     "without ZS_LOAD_WEIGHTS_ONLY) to go on",
                     m->broken_msg);
  if (m->must_discard)
    return zs__error(ZS_ERR_INVALID_STATE, "zs_step: %s, so the gradients "
                     "reduced since the last step are wrong; drop them with "
                     "zs_step_discard (every rank) and redo the micro-batch",
                     m->must_discard_msg);
  memset(info, 0, sizeof *info);
  info->grad_norm = -1.0;
  out->filled = 1;
  /* Misuse on any rank ends the step on every rank before anything moves;
   * nothing changes, so the caller can fix the order and call again. */
  st = zs__step_consistency(m, zs__step_check_closed(m));
  if (st != ZS_OK) goto out;
  zs__accounting_phase(m->ctx->acct, ZS_PHASE_STEP);
  const double t_step = zs__now();
  const int boundary = zs__accum_boundary(m);
  const int reduce_now = boundary || !m->ctx->config.grad_accum_local;
  int applied = 0;
  /* Unused prefetches and forward holds end with the step, and so do the
   * sends of shards of units this rank did not use (the optimizer writes
   * the shards). */
  ZS_CHECK(zs__prefetch_drain(m));
  for (int i = 0; i < m->nunits; i++)
    ZS_CHECK(zs__unused_send_finish(m, &m->units[i]));
  /* Units whose last use was not known (first step, or fewer uses than
   * recorded, or not used at all: zero gradient) start their reductions
   * now, in unit order, which is the same on every rank; then every
   * reduction in flight is finished, in unit order. A unit some ranks may
   * not use always reduces here: a rank that did not touch it in this
   * micro-batch adds zeros (re-opening it after an earlier micro-batch's
   * reduction, as a user does). */
  for (int i = 0; i < m->nunits && reduce_now; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    if (u->grad_state == ZS__GRAD_IDLE ||
        (u->allow_unused && u->grad_state == ZS__GRAD_REDUCED))
      ZS_CHECK(zs__grad_prepare(m, u));
    if (u->grad_state == ZS__GRAD_ACCUM) ZS_CHECK(zs__grad_reduce_start(m, u));
  }
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (u->grad_state == ZS__GRAD_REDUCING) ZS_CHECK(zs__grad_reduce_finish(m, u));
  }
  zs__uses_warn(m);
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].releases > m->units[i].uses_recorded)
      m->units[i].uses_recorded = m->units[i].releases;
  if (boundary) ZS_CHECK(zs__replica_reduce(m));
  if (boundary) ZS_CHECK(zs__step_apply(m, info, &applied));
cleanup:
  /* A new step starts whatever happened after the reductions began. */
  if (st != ZS_OK) (void)zs__quiesce(m);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    u->releases = 0;
    u->unused = u->touched = 0;
    /* Between micro-batches the reduced shard (or the local sum) is kept;
     * at the boundary and on failure everything goes. */
    if (boundary || st != ZS_OK) zs__grad_drop(m, u);
  }
  zs__trace_end_step(m);
  zs__accounting_step_done(m->ctx->acct);
  if (m->ctx->prof != NULL)
    zs__profiler_span(m->ctx->prof, 0, "zs_step", "step", t_step, zs__now(),
                      NULL, 0, 0, 0);
  m->steps_called++;
  m->micro = boundary || st != ZS_OK ? 0 : m->micro + 1;
  info->applied = applied;
out:
  info->step = m->steps_applied;
  info->loss_scale = m->loss_scale;
  info->micro_batch = m->micro;
  return st;
}

static zs_status zs__step_run(zs_model* m, zs__step_out* out) {
  return zs__public_call(m, "zs_step", -1, 1, zs__step_body, out);
}

/* Runs zs_step or zs_step_discard with the step info in this library's
 * layout, then gives it to the caller in the layout of its release (a bad
 * struct_size fails first, changing nothing; a call refused before its
 * work began writes nothing). */
static zs_status zs__step_call(zs_model* m, zs_step_info* user,
                               zs_status (*run)(zs_model*, zs__step_out*),
                               const char* fn) {
  size_t size = 0; /* 0: info not written (no caller's struct, or no
                       context to say its release: run fails then) */
  if (user != NULL && m != NULL && m->ctx != NULL) {
    zs_status st = zs__out_size(ZS__OUT_STEP_INFO, m->ctx->caller_version,
                                user, fn, &size);
    if (st != ZS_OK) return st;
  }
  zs__step_out full;
  memset(&full, 0, sizeof full);
  const zs_status st = run(m, &full);
  if (size != 0 && full.filled)
    zs__out_write(ZS__OUT_STEP_INFO, m->ctx->caller_version, &full.info, user,
                  size);
  return st;
}

zs_status zs_step(zs_model* m, zs_step_info* info) {
  return zs__step_call(m, info, zs__step_run, "zs_step");
}

/* zs_step_discard: the ranks' collectives lined up (zs__comm_reconcile;
 * already done when a reconciliation completed this rank's collectives
 * from inside a wait), then this rank drops the micro-batch: what the
 * caller still holds is let go, everything in flight completes (it has
 * partners now), the gradients of the micro-batches accumulated so far go,
 * and what the next step's scheduling depends on (recorded use counts, the
 * prefetch trace) stays as it was before the micro-batch. Parameters,
 * optimizer states, step counts and the loss scale are not touched. */
static zs_status zs__discard_body(zs_model* m, int unit, void* arg) {
  (void)unit;
  zs__step_out* out = (zs__step_out*)arg;
  zs_step_info* info = &out->info;
  zs_status st = ZS_OK;
  memset(info, 0, sizeof *info);
  info->grad_norm = -1.0;
  out->filled = 1;
  (void)zs__check_discarded(m, "zs_step_discard"); /* sets discard_local */
  if (!m->discard_local) {
    int matched = 0, more = 0;
    /* (with shard groups: the group's collectives first, the context's,
     * whose partners the others may wait in, after) */
    if (m->ctx->shard_comm != m->ctx->comm)
      st = zs__comm_reconcile(m->ctx->shard_comm, &more);
    if (st == ZS_OK) st = zs__comm_reconcile(m->ctx->comm, &matched);
    matched |= more;
    if (st != ZS_OK) goto out;
    /* the others' models learn of it at their next call; this one is
     * being dropped now */
    m->dirty_epoch_seen = zs__dirty_epoch(m->ctx);
  }
  zs__accounting_phase(m->ctx->acct, ZS_PHASE_STEP);
  const double t_step = zs__now();
  for (int i = 0; i < m->nunits; i++) {
    /* the holds' stacked views too (their gradients are dropped below) */
    zs__unit* u = &m->units[i];
    if (u->user_grad_open) (void)zs__view_drop(m, u, ZS__VIEW_GRADS);
    if (u->user_gathered) (void)zs__view_drop(m, u, ZS__VIEW_PARAMS);
    zs__grad_abandon(m, i);
    zs__gather_abandon(m, i);
  }
  ZS_CHECK(zs__prefetch_drain(m));
  ZS_CHECK(zs__quiesce(m));
cleanup:
  for (int i = 0; i < m->nunits; i++) {
    m->units[i].releases = 0;
    m->units[i].unused = m->units[i].touched = 0;
    zs__grad_drop(m, &m->units[i]);
  }
  zs__trace_drop_step(m);
  zs__accounting_step_done(m->ctx->acct);
  if (m->ctx->prof != NULL)
    zs__profiler_span(m->ctx->prof, 0, "zs_step_discard", "step", t_step,
                      zs__now(), NULL, 0, 0, 0);
  m->steps_called++;
  m->micro = 0;
  if (st == ZS_OK) { /* the wrong sums are gone */
    m->must_discard = 0;
    m->discard_local = 0;
  }
out:
  info->step = m->steps_applied;
  info->loss_scale = m->loss_scale;
  info->micro_batch = m->micro;
  return st;
}

/* (no discard gate: the discard is what the gate asks for) */
static zs_status zs__discard_run(zs_model* m, zs__step_out* out) {
  return zs__public_call(m, "zs_step_discard", -1, 0, zs__discard_body, out);
}

zs_status zs_step_discard(zs_model* m, zs_step_info* info) {
  return zs__step_call(m, info, zs__discard_run, "zs_step_discard");
}
