/*
 * engine_optim.c — the optimizer on this rank's span of each unit (the
 * whole buffer at stage 0, the shard at 1-3): master-weight refreshes, the
 * in-place step (on the device, or CPU offload's workers), the staged step
 * of CPU offload with a GPU, the global gradient norm and the loss scaler.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"

zs_status zs__master_refresh_range(zs_model* m, zs__unit* u, size_t begin,
                                   size_t n) {
  /* NVMe: the master weights are on disk; the next step takes the whole
   * unit's from its parameters */
  if (u->policy.master_tier == ZS__TIER_NVME && m->nvme != NULL) {
    u->master_stale = 1;
    return ZS_OK;
  }
  if (u->master == NULL || u->master_stale) return ZS_OK; /* all, later */
  char *p, *g;
  const size_t s0 = zs__span_begin(m, u);
  const size_t s1 = s0 + zs__optimize_span(m, u, &p, &g);
  const size_t lo = begin > s0 ? begin : s0;
  const size_t hi = begin + n < s1 ? begin + n : s1;
  if (lo >= hi) return ZS_OK;
  zs_status st = zs__param_acquire(m, u);
  if (st != ZS_OK) return st;
  zs__optimize_span(m, u, &p, &g); /* (acquired: the shard's buffer) */
  zs__device* dev = m->ctx->device;
  st = dev->ops->convert(dev, (float*)u->master + (lo - s0), ZS_FLOAT32,
                         zs__at(p, lo - s0, u->elem), u->dtype, hi - lo,
                         NULL);
  zs__param_release(m, u);
  return st;
}

zs_status zs__master_refresh(zs_model* m, zs__unit* u) {
  if (u->master == NULL || !u->master_stale) return ZS_OK;
  zs_status st = zs__param_acquire(m, u);
  if (st != ZS_OK) return st;
  char *p, *g;
  const size_t n = zs__optimize_span(m, u, &p, &g);
  zs__device* dev = m->ctx->device;
  st = dev->ops->convert(dev, u->master, ZS_FLOAT32, p, u->dtype, n, NULL);
  zs__param_release(m, u);
  if (st == ZS_OK) u->master_stale = 0;
  return st;
}

static zs_status zs__optimize_share(zs_model* m, zs__unit* u, float coef,
                                    int w, int nw, int threads,
                                    zs__device* dev, const zs__opt_view* v) {
  const zs_optimizer_config* o = &m->ctx->config.optimizer;
  char* p = v->p;
  char* g = v->g;
  float* master = v->master;
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
    for (int k = 0; k < ZS_OPTIM_MAX_STATES; k++)
      a.s[k] = v->s[k] != NULL ? v->s[k] + soff : NULL;
    zs_optim_span span;
    if (m->optim_fn != NULL) { /* the user's rule (zs_model_set_optimizer) */
      memset(&span, 0, sizeof span);
      span.struct_size = sizeof span;
      span.nstates = u->nstates;
      span.tensor = u->tensors[pc->tensor];
      span.offset = pc->tensor_offset + (off - pc->span_offset);
      span.group = t->group;
      span.step = a.step;
      span.lr = m->group_lr[t->group];
      span.weight_decay = m->group_wd[t->group];
      span.beta1 = o->beta1;
      span.beta2 = o->beta2;
      span.eps = o->eps;
      a.fn = m->optim_fn;
      a.fn_user = m->optim_user;
      a.span = &span;
    }
    a.p16 = master != NULL ? zs__at(p, off, u->elem) : NULL;
    a.dtype = u->dtype;
    a.n = hi - lo;
    a.threads = threads;
    zs_status st = dev->ops->optimize(dev, &a, NULL);
    if (st != ZS_OK)
      return m->optim_fn != NULL
                 ? zs__error_prefix(st, "rank %d: optimizer '%s' on tensor "
                                    "'%s': ", m->ctx->rank, m->optim_name,
                                    t->name)
                 : zs__error_prefix(st, "optimizer on tensor '%s': ", t->name);
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

/* The in-memory store: one chunk per trainable unit, its whole span, in
 * place (device memory, or CPU offload's host memory). impl: the
 * trainable units' indexes. */
static void zs__memory_chunk(const zs__state_store* s, int k, int* unit, size_t* lo,
                             size_t* hi) {
  *unit = ((const int*)s->impl)[k];
  *lo = 0;
  *hi = zs__optimize_span_elems(s->m, &s->m->units[*unit]);
}

static zs_status zs__memory_acquire(zs__state_store* s, int k, float** master,
                                    float* states[ZS_OPTIM_MAX_STATES]) {
  zs__unit* u = &s->m->units[((const int*)s->impl)[k]];
  *master = (float*)u->master;
  for (int j = 0; j < ZS_OPTIM_MAX_STATES; j++)
    states[j] = j < u->nstates ? (float*)u->state[j] : NULL;
  return ZS_OK;
}

static zs_status zs__memory_release(zs__state_store* s, int k) {
  (void)s;
  (void)k;
  return ZS_OK;
}

static zs_status zs__memory_finish(zs__state_store* s, zs_status st) {
  free(s->impl);
  s->impl = NULL;
  return st;
}

zs_status zs__memory_store(zs_model* m, zs__state_store* out) {
  memset(out, 0, sizeof *out);
  out->name = "memory";
  out->m = m;
  out->chunk = zs__memory_chunk;
  out->acquire = zs__memory_acquire;
  out->release = zs__memory_release;
  out->finish = zs__memory_finish;
  int* units = (int*)malloc(((size_t)m->nunits + 1) * sizeof *units);
  if (units == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "optimizer step: the store");
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].trainable) units[out->nchunks++] = i;
  out->impl = units;
  return ZS_OK;
}

/* The unit of the first chunk after chunk k's unit's chunks, or -1. */
static int zs__state_store_next_unit(const zs__state_store* s, int k) {
  int unit, u2;
  size_t lo, hi;
  s->chunk(s, k, &unit, &lo, &hi);
  for (int j = k + 1; j < s->nchunks; j++) {
    s->chunk(s, j, &u2, &lo, &hi);
    if (u2 != unit) return u2;
  }
  return -1;
}

/* The step's loop (ZeRO-Offload, Ren et al. 2021, sec. 4.1, with
 * DeepSpeed's overlap of copies and the CPU step; ZeRO-Infinity's
 * pipelined sub-groups, Rajbhandari et al. SC'21, sec. 6.2). With CPU
 * offload and the parameters on a device, unit i's gradients come to
 * page-locked staging on a copy stream while the CPU workers step unit
 * i-1, and the updated parameters (rounded from the host master weights,
 * or the fp32 parameters themselves) go back right after their step; two
 * slots, each slot's reuse ordered behind its previous copies by the
 * stream. The values are the in-place path's: the same kernels on the
 * same bits, in every store. */
zs_status zs__optimize(zs_model* m, float coef, zs__state_store* s) {
  zs__device* dev = m->ctx->device;
  const int staged = zs__offload_staged(m);
  /* overlapped (core_policy.h's ZS__LOOP_STAGED) unless the parameter
   * shards are on NVMe too (then one unit at a time, synchronously: a
   * shard is in a pool buffer only between its unit's step begin and
   * end) */
  const int overlap =
      zs__policy_loop(0, staged, m->nvme_params != NULL) == ZS__LOOP_STAGED &&
      s->nchunks > 0;
  zs_status st = ZS_OK;
  int slot = 0, next = -1;
  if (overlap) {
    int unit0;
    size_t lo0, hi0;
    s->chunk(s, 0, &unit0, &lo0, &hi0);
    /* the gradients' last reductions ran on the compute stream, which the
     * copy stream is not ordered with: done before the first span comes */
    st = zs__staging_init(m);
    if (st == ZS_OK) st = dev->ops->stream_sync(dev, NULL);
    if (st == ZS_OK) st = zs__staging_in(m, &m->units[unit0], 0);
  }
  double t0 = 0.0;
  for (int k = 0; k < s->nchunks && st == ZS_OK; k++) {
    int ui;
    size_t lo, hi;
    s->chunk(s, k, &ui, &lo, &hi);
    zs__unit* u = &m->units[ui];
    float* master;
    float* states[ZS_OPTIM_MAX_STATES];
    st = s->acquire(s, k, &master, states);
    if (st != ZS_OK) break;
    if (lo == 0) {
      next = zs__state_store_next_unit(s, k);
      if (m->ctx->prof != NULL) t0 = zs__now();
      /* parameter shards on NVMe: the unit's shard is acquired at its first
       * chunk (the next unit's is read ahead meanwhile) and written back
       * after its last */
      st = zs__param_step_begin(m, u, next);
      if (st != ZS_OK) break;
      if (!s->stale_master && u->master != NULL && u->master_stale) {
        st = zs__master_refresh(m, u);
        /* the refresh's kernel wrote host memory the CPU reads next */
        if (st == ZS_OK && staged) st = dev->ops->stream_sync(dev, NULL);
        if (st != ZS_OK) {
          st = zs__param_step_end(m, u, st);
          break;
        }
      }
    }
    char *p, *g;
    const size_t span = zs__optimize_span(m, u, &p, &g);
    if (overlap && lo == 0) {
      /* this unit's span is here, the previous unit's parameters have left
       * the other slot: the next unit's span may come into it */
      st = dev->ops->stream_sync(dev, m->staging_stream);
      if (st == ZS_OK && next >= 0)
        st = zs__staging_in(m, &m->units[next], 1 - slot);
    } else if (staged && lo == 0) {
      st = zs__staging_unit_in(m, u);
    }
    if (staged) {
      p = (char*)m->staging_p[overlap ? slot : 0];
      g = (char*)m->staging_g[overlap ? slot : 0];
    }
    /* a 16-bit unit's stale master weights on NVMe: from the parameters */
    if (st == ZS_OK && s->stale_master && master != NULL && u->master_stale) {
      zs__device* host = m->ctx->host;
      st = host->ops->convert(host, master, ZS_FLOAT32, zs__at(p, lo, u->elem),
                              u->dtype, hi - lo, NULL);
    }
    zs__opt_view v = {p, g, master, {NULL}, lo, hi};
    memcpy(v.s, states, sizeof v.s);
    if (st == ZS_OK)
      st = m->ctx->offload != NULL
               ? zs__optimize_view(m, u, coef, &v)
               : zs__optimize_share(m, u, coef, 0, 1, 0, dev, &v);
    if (st == ZS_OK) st = s->release(s, k);
    if (st == ZS_OK && staged && hi == span) {
      if (overlap) {
        /* back on the copy stream; waited for below */
        st = zs__staging_out(m, u, slot);
        slot = 1 - slot;
      } else {
        st = zs__staging_unit_out(m, u);
      }
    }
    if (hi == span || st != ZS_OK) {
      st = zs__param_step_end(m, u, st);
      if (m->ctx->prof != NULL)
        zs__profiler_span(m->ctx->prof, 0, "optimizer", "optimizer", t0,
                          zs__now(), u->name, 0, 0, 0);
    }
  }
  st = s->finish(s, st);
  /* no copy may still run into or out of the staging after a return, and
   * the parameters are back on the device before the next forward */
  if (overlap && m->staging_stream != NULL) {
    zs_status s2 = dev->ops->stream_sync(dev, m->staging_stream);
    if (st == ZS_OK) st = s2;
  }
  return st;
}

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
 * MPI all-reduce may add in a rank-dependent order). With replicas (hybrid
 * sharding) the first shard group's sums (ranks 0 .. G-1) are the whole
 * model's: each shard counts once, not once per replica. */
zs_status zs__global_sumsq(zs_model* m, double* out) {
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
  for (int r = 0; r < m->ctx->shard_ranks; r++) sum += v[r];
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
void zs__scaler_update(zs_model* m, int overflow) {
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
