/*
 * engine_step.c — zs_step: the cross-rank check, the reductions whose last
 * use was not known, the optimizer on this rank's span, and the (bucketed,
 * non-blocking) all-gather of updated parameters at stages 1-2, which the
 * next step's gather of each unit waits for. Gathers live in
 * engine_gather.c, gradients in engine_grad.c.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "runtime/compat.h"
#include "runtime/engine.h"

/* ==== Step ================================================================= */

/* The optimizer on this rank's span of a unit: the whole buffer at stage 0,
 * the shard at 1-3, one device call per piece of a trainable tensor (pieces
 * never include gaps or padding). coef multiplies the gradient first
 * (loss-scale removal and clipping: one fp32 multiply per element, as
 * torch's unscale_ and clip_grad_norm_ do; with power-of-two scales the
 * single product rounds the same as their two); the device updates the
 * fp32 master (or fp32 parameter) and rounds the master into the 16-bit
 * parameter in the same pass (zs__device_ops.optimize). Worker `w` of `nw`
 * takes the same contiguous share of every piece; the update is
 * elementwise, so the split never changes a bit. */


static zs_status zs__optimize_share(zs_model* m, zs__unit* u, float coef,
                                    int w, int nw, int threads,
                                    zs__device* dev, const zs__opt_view* v) {
  const zs_optimizer_config* o = &m->ctx->config.optimizer;
  char* p = v->p;
  char* g = v->g;
  float* master = v->master;
  float* s0 = v->s0;
  float* s1 = v->s1;
  for (size_t i = 0; i < u->nopt_pieces; i++) {
    const zs__piece* pc = &u->opt_pieces[i];
    const zs__tensor* t = &m->tensors[u->tensors[pc->tensor]];
    /* the piece's part inside the view's range, then this worker's share */
    const size_t b = pc->span_offset > v->lo ? pc->span_offset : v->lo;
    const size_t e0 = pc->span_offset + pc->count;
    const size_t e = e0 < v->hi ? e0 : v->hi;
    if (b >= e) continue;
    const size_t cnt = e - b;
    const size_t lo = cnt * (size_t)w / (size_t)nw;
    const size_t hi = cnt * (size_t)(w + 1) / (size_t)nw;
    if (lo >= hi) continue;
    const size_t off = b + lo;      /* in the span */
    const size_t soff = off - v->lo; /* in the master/state buffers */
    zs__opt_args a;
    memset(&a, 0, sizeof a);
    a.kind = o->kind;
    a.adam.lr = a.sgd.lr = m->group_lr[t->group];
    a.adam.weight_decay = a.sgd.weight_decay = m->group_wd[t->group];
    a.adam.beta1 = o->beta1;
    a.adam.beta2 = o->beta2;
    a.adam.eps = o->eps;
    a.sgd.momentum = o->momentum;
    a.sgd.dampening = o->dampening;
    a.sgd.nesterov = o->nesterov;
    a.step = t->step + 1;
    a.w = master != NULL ? master + soff : (float*)p + off;
    a.g = zs__at(g, off, u->gelem);
    a.gdtype = u->gdtype;
    a.coef = coef;
    a.s0 = s0 != NULL ? s0 + soff : NULL;
    a.s1 = s1 != NULL ? s1 + soff : NULL;
    a.p16 = master != NULL ? zs__at(p, off, u->elem) : NULL;
    a.dtype = u->dtype;
    a.n = hi - lo;
    a.threads = threads;
    zs_status st = dev->ops->optimize(dev, &a, NULL);
    if (st != ZS_OK)
      return zs__error_prefix(st, "optimizer on tensor '%s': ", t->name);
  }
  return ZS_OK;
}

typedef struct zs__opt_job {
  zs_model* m;
  zs__unit* u;
  float coef;
  zs__opt_view view; /* host memory */
} zs__opt_job;

/* An offload worker: master weights, states and the step live in host
 * memory, so the host backend's kernels run them (one thread each). */
static zs_status zs__optimize_worker(void* arg, int w, int nw) {
  const zs__opt_job* j = (const zs__opt_job*)arg;
  return zs__optimize_share(j->m, j->u, j->coef, w, nw, 1, j->m->ctx->host,
                            &j->view);
}

zs_status zs__optimize_view(zs_model* m, zs__unit* u, float coef,
                            const zs__opt_view* v) {
  zs__opt_job job = {m, u, coef, *v};
  zs_status st = zs__offload_run(m->ctx->offload, zs__optimize_worker, &job);
  if (st != ZS_OK)
    return zs__error_prefix(st, "optimizer on unit '%s': ", u->name);
  return ZS_OK;
}

/* The unit's own buffers as a view of the whole span. */
static zs__opt_view zs__unit_view(zs__unit* u, char* p, char* g) {
  zs__opt_view v = {p, g, (float*)u->master, (float*)u->state[0],
                    (float*)u->state[1], 0, SIZE_MAX};
  return v;
}

/* The span the optimizer updates: the whole buffer at stage 0, this rank's
 * shard at 1-3 (elements), and the device buffers holding it. */
size_t zs__optimize_span_elems(const zs_model* m, const zs__unit* u) {
  return m->ctx->config.stage == 0 ? u->layout.padded : u->layout.shard;
}

size_t zs__optimize_span(zs_model* m, zs__unit* u, char** p, char** g) {
  const int stage = m->ctx->config.stage;
  *p = (char*)(stage == 0 ? u->params_full : zs__param_shard_ptr(m, u));
  *g = (char*)(stage == 0 ? u->grads_full : zs__grad_shard_ptr(m, u));
  return zs__optimize_span_elems(m, u);
}

/* The optimizer on this rank's span of a unit (zs__optimize_share). With
 * CPU offload the CPU worker threads (bound to the host memory's NUMA node)
 * share the work; otherwise the context's device runs it (on the host: the
 * calling thread, the fast kernels on OpenMP's threads). */
static zs_status zs__optimize_unit(zs_model* m, zs__unit* u, float coef) {
  zs_status st = zs__master_refresh(m, u);
  if (st != ZS_OK) return st;
  char *p, *g;
  (void)zs__optimize_span(m, u, &p, &g);
  /* CPU offload with a GPU and the parameter shards on NVMe (the shard is
   * in a pool buffer now): the gradients come to the host staging, and so
   * do the parameters, which go back to the buffer after the step
   * (synchronous, one unit at a time; the refresh above wrote host memory,
   * so it completed on return) */
  const int staged = zs__offload_staged(m);
  if (staged) {
    st = zs__staging_unit_in(m, u);
    if (st != ZS_OK) return st;
    p = (char*)m->staging_p[0];
    g = (char*)m->staging_g[0];
  }
  const zs__opt_view v = zs__unit_view(u, p, g);
  if (m->ctx->offload != NULL) {
    zs__opt_job job = {m, u, coef, v};
    st = zs__offload_run(m->ctx->offload, zs__optimize_worker, &job);
    if (st != ZS_OK)
      return zs__error_prefix(st, "optimizer on unit '%s': ", u->name);
    return staged ? zs__staging_unit_out(m, u) : ZS_OK;
  }
  return zs__optimize_share(m, u, coef, 0, 1, 0, m->ctx->device, &v);
}

/* The in-memory optimizer on every trainable unit; with parameter shards
 * on NVMe each shard is read in (the next one ahead), stepped and written
 * back, and every rank agrees on the outcome (a disk error on one rank
 * fails all; the model is then refused further steps, see m->broken). */
static zs_status zs__optimize_units(zs_model* m, float coef) {
  zs_status st = ZS_OK;
  for (int i = 0; i < m->nunits && st == ZS_OK; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    const double t0 = m->ctx->prof != NULL ? zs__now() : 0.0;
    int next = i + 1;
    while (next < m->nunits && !m->units[next].trainable) next++;
    st = zs__param_step_begin(m, u, next < m->nunits ? next : -1);
    if (st != ZS_OK) break;
    st = zs__param_step_end(m, u, zs__optimize_unit(m, u, coef));
    if (m->ctx->prof != NULL)
      zs__profiler_span(m->ctx->prof, 0, "optimizer", "optimizer", t0,
                        zs__now(), u->name, 0, 0, 0);
  }
  if (m->nvme_params == NULL) return st;
  st = st == ZS_OK ? zs__param_flush(m) : zs__param_abort(m, st);
  return zs__comm_agree(m->ctx->comm, st, "optimizer step (NVMe parameters)");
}

/* ==== CPU offload with a GPU ================================================= */

int zs__offload_force_staging = 0;

/* Two slots of page-locked host staging (each: the largest span's
 * gradients and parameters) and the copy stream, made at the first step. */
zs_status zs__staging_init(zs_model* m) {
  if (m->staging_stream != NULL) return ZS_OK;
  zs__device* dev = m->ctx->device;
  zs_status st = ZS_OK;
  size_t gb = 0, pb = 0;
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    const size_t n = zs__optimize_span_elems(m, u);
    if (n * u->gelem > gb) gb = n * u->gelem;
    if (n * u->elem > pb) pb = n * u->elem;
  }
  for (int k = 0; k < 2; k++) {
    ZS_CHECK(zs__offload_host_alloc(m, gb, "staging (gradients)",
                                    &m->staging_g[k]));
    ZS_CHECK(zs__offload_host_alloc(m, pb, "staging (parameters)",
                                    &m->staging_p[k]));
  }
  ZS_CHECK(dev->ops->stream_create(dev, &m->staging_stream));
cleanup:
  if (st != ZS_OK) zs__staging_free(m);
  return st;
}

void zs__staging_free(zs_model* m) {
  for (int k = 0; k < 2; k++) {
    zs__offload_host_free(m, m->staging_g[k]);
    zs__offload_host_free(m, m->staging_p[k]);
    m->staging_g[k] = m->staging_p[k] = NULL;
  }
  if (m->staging_stream != NULL)
    m->ctx->device->ops->stream_destroy(m->ctx->device, m->staging_stream);
  m->staging_stream = NULL;
}

/* Device to host, on the staging stream: unit u's gradient span and its
 * parameters into slot k. The parameters come too because the whole span
 * goes back after the step: fp32 parameters are their own master weights,
 * and the elements the optimizer skips (padding, frozen and tied ranges)
 * must go back unchanged. */
zs_status zs__staging_in(zs_model* m, zs__unit* u, int k) {
  zs__device* dev = m->ctx->device;
  char *p, *g;
  const size_t n = zs__optimize_span(m, u, &p, &g);
  zs_status st = dev->ops->copy(dev, m->staging_g[k], g, n * u->gelem,
                                m->staging_stream);
  if (st == ZS_OK)
    st = dev->ops->copy(dev, m->staging_p[k], p, n * u->elem,
                        m->staging_stream);
  return st;
}

int zs__offload_staged(const zs_model* m) {
  return m->ctx->offload != NULL &&
         (m->ctx->device != m->ctx->host || zs__offload_force_staging);
}

zs_status zs__coll_source(zs_model* m, const void* src, size_t bytes,
                          const char* label, int wait, void** staged,
                          const void** use) {
  *staged = NULL;
  *use = src;
  zs__device* dev = m->ctx->device;
  if (dev == m->ctx->host && !zs__offload_force_staging) return ZS_OK;
  zs_status st = zs__dev_alloc(dev, ZS_MEM_COMM_BUFFERS, bytes, 0, label, staged);
  /* queued: the host goes on (the collective reading it is waited for
   * before src changes: zs__quiesce, the step's prefetch drain) */
  if (st == ZS_OK)
    st = wait ? dev->ops->copy(dev, *staged, src, bytes, NULL)
              : dev->ops->upload(dev, *staged, src, bytes, NULL);
  if (st != ZS_OK) {
    zs__dev_free(dev, *staged);
    *staged = NULL;
    return st;
  }
  *use = *staged;
  return ZS_OK;
}

zs_status zs__staging_unit_in(zs_model* m, zs__unit* u) {
  zs_status st = zs__staging_init(m);
  /* the copy stream is not ordered with the compute stream, where the
   * gradients' last reduction may still run (device.h) */
  if (st == ZS_OK) st = m->ctx->device->ops->stream_sync(m->ctx->device, NULL);
  if (st == ZS_OK) st = zs__staging_in(m, u, 0);
  if (st == ZS_OK) st = m->ctx->device->ops->stream_sync(m->ctx->device, m->staging_stream);
  return st;
}

zs_status zs__staging_out(zs_model* m, zs__unit* u, int k) {
  zs__device* dev = m->ctx->device;
  char *p, *g;
  const size_t n = zs__optimize_span(m, u, &p, &g);
  return dev->ops->copy(dev, p, m->staging_p[k], n * u->elem, m->staging_stream);
}

zs_status zs__staging_unit_out(zs_model* m, zs__unit* u) {
  zs_status st = zs__staging_out(m, u, 0);
  if (st == ZS_OK) st = m->ctx->device->ops->stream_sync(m->ctx->device, m->staging_stream);
  return st;
}

/* The optimizer with CPU offload when the parameters and gradients are in
 * device memory (ZeRO-Offload, Ren et al. 2021, sec. 4.1, with DeepSpeed's
 * overlap of copies and the CPU step across sub-groups; here a sub-group
 * is a unit): unit i's gradients come to page-locked staging on a copy
 * stream while the CPU workers step unit i-1, and the updated parameters
 * (rounded from the host master weights, or the fp32 parameters
 * themselves) go back to the device right after their step. Two slots;
 * each slot's reuse is ordered behind its previous copies by the stream.
 * The values are the in-place path's: the same kernels on the same bits. */
static zs_status zs__optimize_staged(zs_model* m, float coef) {
  zs__device* dev = m->ctx->device;
  zs_status st = ZS_OK;
  ZS_CHECK(zs__staging_init(m));
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].trainable) ZS_CHECK(zs__master_refresh(m, &m->units[i]));
  /* the refreshes' kernels wrote host memory, and the gradients' last
   * reductions ran on the compute stream, which the copy stream is not
   * ordered with: all done before the CPU reads and the copies start */
  ZS_CHECK(dev->ops->stream_sync(dev, NULL));
  int next = 0;
  while (next < m->nunits && !m->units[next].trainable) next++;
  if (next < m->nunits) ZS_CHECK(zs__staging_in(m, &m->units[next], 0));
  int slot = 0;
  while (next < m->nunits) {
    zs__unit* u = &m->units[next];
    const double t0 = m->ctx->prof != NULL ? zs__now() : 0.0;
    /* this unit's inputs are here; the previous unit's output has left */
    ZS_CHECK(dev->ops->stream_sync(dev, m->staging_stream));
    do next++;
    while (next < m->nunits && !m->units[next].trainable);
    if (next < m->nunits)
      ZS_CHECK(zs__staging_in(m, &m->units[next], 1 - slot));
    zs__opt_job job = {m, u, coef,
                       zs__unit_view(u, (char*)m->staging_p[slot],
                                     (char*)m->staging_g[slot])};
    st = zs__offload_run(m->ctx->offload, zs__optimize_worker, &job);
    if (st != ZS_OK) {
      st = zs__error_prefix(st, "optimizer on unit '%s': ", u->name);
      goto cleanup;
    }
    ZS_CHECK(zs__staging_out(m, u, slot));
    if (m->ctx->prof != NULL)
      zs__profiler_span(m->ctx->prof, 0, "optimizer", "optimizer", t0,
                        zs__now(), u->name, 0, 0, 0);
    slot = 1 - slot;
  }
cleanup:
  /* no copy may still run into or out of the staging after a return */
  if (m->staging_stream != NULL) {
    zs_status s2 = dev->ops->stream_sync(dev, m->staging_stream);
    if (st == ZS_OK) st = s2;
  }
  return st;
}

/* ==== Gradient norm, overflow and the loss scaler =========================== */

/* Sum of squares, in double, of this rank's trainable shard elements (each
 * element of the model is in exactly one rank's shard; padding and tied or
 * frozen ranges are not in any piece). Elements are added in offset order,
 * so the value is the same at every stage. inf/NaN propagate. */
static zs_status zs__local_sumsq(zs_model* m, double* out) {
  zs__device* dev = m->ctx->device;
  double sum = 0.0;
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    const void* g = zs__grad_shard_ptr(m, u);
    for (size_t k = 0; k < u->nnorm_pieces; k++) {
      const zs__piece* pc = &u->norm_pieces[k];
      /* norm pieces' offsets are relative to the shard */
      zs_status st = dev->ops->sumsq(dev, zs__at((void*)g, pc->span_offset,
                                                 u->gelem),
                                     u->gdtype, pc->count, &sum);
      if (st != ZS_OK) return st;
    }
  }
  *out = sum;
  return ZS_OK;
}

/* The global sum of squares: one all-gather of every rank's partial sum,
 * added in rank order on every rank, so every rank gets the same bits (an
 * MPI all-reduce may add in a rank-dependent order). */
static zs_status zs__global_sumsq(zs_model* m, double* out) {
  const int W = m->ctx->world;
  /* Heap, not stack: a collective's buffer (see zs__comm_free). */
  double* v = (double*)malloc((size_t)(W + 1) * sizeof *v);
  if (v == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step: norm buffer");
  zs_status st = zs__local_sumsq(m, &v[W]);
  if (st != ZS_OK) {
    free(v);
    return st;
  }
  st = zs__comm_all_gather(m->ctx->comm,
                                     zs__tag(ZS__P_NORM, -1, NULL),
                                     &v[W], v, 1, ZS_FLOAT64);
  double sum = 0.0;
  for (int r = 0; r < W; r++) sum += v[r];
  zs__comm_free(m->ctx->comm, v);
  *out = sum;
  return st;
}

/* Updates the dynamic loss scale after a step (overflow or not), following
 * torch.cuda.amp.GradScaler.update with DeepSpeed's hysteresis: an overflow
 * spends one unit of hysteresis and, when none is left, multiplies the
 * scale by backoff_factor (not below min_scale) and restores the
 * hysteresis; growth_interval clean steps in a row multiply it by
 * growth_factor and restore the hysteresis. Deterministic, so identical on
 * every rank. */
static void zs__scaler_update(zs_model* m, int overflow) {
  const zs_loss_scaler_config* c = &m->ctx->config.loss_scaler;
  if (c->mode != ZS_LOSS_SCALE_DYNAMIC) return;
  if (overflow) {
    m->scale_clean_steps = 0;
    if (--m->scale_hysteresis > 0) return;
    m->scale_hysteresis = c->hysteresis;
    m->loss_scale *= c->backoff_factor;
    if (m->loss_scale < c->min_scale) m->loss_scale = c->min_scale;
    return;
  }
  if (++m->scale_clean_steps >= c->growth_interval) {
    m->scale_clean_steps = 0;
    m->scale_hysteresis = c->hysteresis;
    /* the scale stays an fp32 number (torch keeps it in an fp32 tensor):
     * callers multiply an fp32 loss by it */
    const double grown = m->loss_scale * c->growth_factor;
    if (grown <= FLT_MAX) m->loss_scale = grown;
  }
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
    int64_t rec[3] = {u->releases, u->uses_explicit, u->uses_recorded};
    uses = zs__hash_bytes(uses, rec, sizeof rec);
  }
  lrs = zs__hash_bytes(lrs, m->group_lr, sizeof(double) * (size_t)m->ngroups);
  lrs = zs__hash_bytes(lrs, m->group_wd, sizeof(double) * (size_t)m->ngroups);
  /* what every rank must agree on */
  enum { STEP, COUNT, SEQ, USES, LRS, K };
  uint64_t mine[K] = {(uint64_t)m->steps_called, m->ctx->comm->seq_count,
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
      char range[96] = "";
      if (k == COUNT)
        snprintf(range, sizeof range, " (from %llu to %llu since the context "
                 "was created)", (unsigned long long)~r[2 * COUNT + 1],
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
  /* Stage 0 updates full buffers: gather every rank's reduced shards. */
  if (cfg->stage == 0) ZS_CHECK(zs__grad_gather_start(m));
  /* Wait for those, and for stage 1-2's parameter all-gathers of the
   * previous step, before the optimizer writes. */
  for (int i = 0; i < m->nunits; i++)
    ZS_CHECK(zs__inflight_wait(m->ctx->comm, &m->units[i].shard_ops));
  /* CPU offload with the parameters and gradients in device memory: the
   * staged, overlapped path (the test hook runs it on the host too). */
  const int staged = zs__offload_staged(m);
  if (m->nvme != NULL) {
    /* NVMe offload: a failure on one rank (a disk error) fails every rank
     * here, and the model, whose states are now partly updated */
    zs_status local = zs__nvme_step(m, (float)coef);
    st = zs__comm_agree(m->ctx->comm, local, "NVMe offload step");
    if (st != ZS_OK) {
      m->broken = 1;
      snprintf(m->broken_msg, sizeof m->broken_msg, "%s", zs__error_body());
      goto cleanup;
    }
  } else if (staged && m->nvme_params == NULL) {
    ZS_CHECK(zs__optimize_staged(m, (float)coef));
  } else {
    st = zs__optimize_units(m, (float)coef);
    if (st != ZS_OK && m->nvme_params != NULL) {
      m->broken = 1;
      snprintf(m->broken_msg, sizeof m->broken_msg, "%s", zs__error_body());
    }
    if (st != ZS_OK) goto cleanup;
  }
  /* Stages 1-2 keep full parameters: every rank's updated shard goes back
   * into everyone's full buffer, bucket by bucket, without waiting. */
  if (cfg->stage == 1 || cfg->stage == 2)
    for (int i = 0; i < m->nunits; i++) {
      zs__unit* u = &m->units[i];
      for (int b = 0; u->trainable && b < zs__bucket_count(m, u); b++) {
        size_t off, cnt;
        zs__bucket(m, u, b, &off, &cnt);
        zs__coll* op = NULL;
        ZS_CHECK(zs__comm_iall_gather_strided(
            m->ctx->comm, zs__tag(ZS__P_PARAM_GATHER, i, u->name),
            u->params_full, off, u->layout.shard, cnt, u->dtype, &op));
        ZS_CHECK(zs__inflight_push(m->ctx->comm, &u->shard_ops, op));
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
static zs_status zs__step_run(zs_model* m, zs_step_info* info) {
  zs_status st = zs__check_finalized(m, "zs_step");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_step");
  if (st != ZS_OK) return st;
  /* the same on every rank: the failure was agreed */
  if (m->broken)
    return zs__error(ZS_ERR_INVALID_STATE, "zs_step: an earlier step failed "
                     "after updating part of the optimizer states (%s); drop "
                     "the pending gradients (zs_step_discard) and load a "
                     "checkpoint (zs_checkpoint_load) to go on",
                     m->broken_msg);
  if (m->must_discard)
    return zs__error(ZS_ERR_INVALID_STATE, "zs_step: %s, so the gradients "
                     "reduced since the last step are wrong; drop them with "
                     "zs_step_discard (every rank) and redo the micro-batch",
                     m->must_discard_msg);
  memset(info, 0, sizeof *info);
  info->grad_norm = -1.0;
  const uint64_t begin = zs__call_begin(m);
  /* Misuse on any rank ends the step on every rank before anything moves;
   * nothing changes, so the caller can fix the order and call again. */
  st = zs__step_consistency(m, zs__step_check_closed(m));
  if (st != ZS_OK) goto out;
  zs__accounting_phase(m->ctx->acct, ZS_PHASE_STEP);
  const double t_step = zs__now();
  const int boundary = zs__accum_boundary(m);
  const int reduce_now = boundary || !m->ctx->config.grad_accum_local;
  int applied = 0;
  /* Unused prefetches and forward holds end with the step. */
  ZS_CHECK(zs__prefetch_drain(m));
  /* Units whose last use was not known (first step, or fewer uses than
   * recorded, or not used at all: zero gradient) start their reductions
   * now, in unit order, which is the same on every rank; then every
   * reduction in flight is finished, in unit order. */
  for (int i = 0; i < m->nunits && reduce_now; i++) {
    zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    if (u->grad_state == ZS__GRAD_IDLE) ZS_CHECK(zs__grad_prepare(m, u));
    if (u->grad_state == ZS__GRAD_ACCUM) ZS_CHECK(zs__grad_reduce_start(m, u));
  }
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (u->grad_state == ZS__GRAD_REDUCING) ZS_CHECK(zs__grad_reduce_finish(m, u));
  }
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].releases > m->units[i].uses_recorded)
      m->units[i].uses_recorded = m->units[i].releases;
  if (boundary) ZS_CHECK(zs__step_apply(m, info, &applied));
cleanup:
  /* A new step starts whatever happened after the reductions began. */
  if (st != ZS_OK) (void)zs__quiesce(m);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    u->releases = 0;
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
  return zs__call_end(m, begin, st);
}

/* Runs zs_step or zs_step_discard with the step info in this library's
 * layout, then gives it to the caller in the layout of its release (a bad
 * struct_size fails first, changing nothing). */
static zs_status zs__step_call(zs_model* m, zs_step_info* user,
                               zs_status (*run)(zs_model*, zs_step_info*),
                               const char* fn) {
  size_t size = 0; /* 0: info not written (no caller's struct, or no
                       context to say its release: run fails then) */
  if (user != NULL && m != NULL && m->ctx != NULL) {
    zs_status st = zs__out_size(ZS__OUT_STEP_INFO, m->ctx->caller_version,
                                user, fn, &size);
    if (st != ZS_OK) return st;
  }
  zs_step_info full;
  memset(&full, 0, sizeof full);
  const zs_status st = run(m, &full);
  if (size != 0)
    zs__out_write(ZS__OUT_STEP_INFO, m->ctx->caller_version, &full, user, size);
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
static zs_status zs__discard_run(zs_model* m, zs_step_info* info) {
  zs_status st = zs__check_finalized(m, "zs_step_discard");
  if (st != ZS_OK) return st;
  memset(info, 0, sizeof *info);
  info->grad_norm = -1.0;
  const uint64_t begin = zs__call_begin(m);
  (void)zs__check_discarded(m, "zs_step_discard"); /* sets discard_local */
  if (!m->discard_local) {
    int matched = 0;
    st = zs__comm_reconcile(m->ctx->comm, &matched);
    if (st != ZS_OK) goto out;
    /* the others' models learn of it at their next call; this one is
     * being dropped now */
    m->dirty_epoch_seen = m->ctx->comm->dirty_epoch;
  }
  zs__accounting_phase(m->ctx->acct, ZS_PHASE_STEP);
  const double t_step = zs__now();
  for (int i = 0; i < m->nunits; i++) {
    zs__grad_abandon(m, i);
    zs__gather_abandon(m, i);
  }
  ZS_CHECK(zs__prefetch_drain(m));
  ZS_CHECK(zs__quiesce(m));
cleanup:
  for (int i = 0; i < m->nunits; i++) {
    m->units[i].releases = 0;
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
  return zs__call_end(m, begin, st);
}

zs_status zs_step_discard(zs_model* m, zs_step_info* info) {
  return zs__step_call(m, info, zs__discard_run, "zs_step_discard");
}
