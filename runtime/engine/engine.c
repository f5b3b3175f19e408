/*
 * engine.c — the engine's base: what every other engine file uses and
 * nothing engine-level below it: the argument and state checks of the
 * public calls, the in-flight lists of collectives and the buckets of a
 * unit's shard, where a unit's shards live (shard pointers, CPU offload's
 * host memory, the optimizer's span), and a collective's source in host
 * memory; the queries of units and tensors that features share. Depends
 * only on the layers below the engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "runtime/engine/engine.h"

zs_status zs__check_finalized(const zs_model* m, const char* fn) {
  ZS_REQUIRE(m != NULL, "%s: model is NULL", fn);
  if (m->ctx == NULL)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "%s: the model's context was destroyed", fn);
  if (!m->finalized && m->finalize_failed)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "%s: zs_model_finalize failed on this model; destroy it "
                     "(zs_model_destroy) and register the model again", fn);
  if (!m->finalized)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "%s: call zs_model_finalize first", fn);
  return ZS_OK;
}

zs_status zs__check_discarded(zs_model* m, const char* fn) {
  if (m->dirty_epoch_seen != zs__dirty_epoch(m->ctx)) {
    /* (only zs_step_discard's own reconciliation leaves its model out) */
    m->dirty_epoch_seen = zs__dirty_epoch(m->ctx);
    m->discard_local = 1;
    m->must_discard = 1;
    snprintf(m->must_discard_msg, sizeof m->must_discard_msg,
             "a zs_step_discard on this context (by another rank, or of "
             "another model) completed collectives against empty partners");
  }
  if (!m->discard_local) return ZS_OK;
  return zs__error(ZS_ERR_INVALID_STATE,
                   "%s: a zs_step_discard on this context (by another rank, "
                   "or of another model) completed collectives of this rank "
                   "against empty partners, so this model's micro-batch "
                   "may be wrong too; call zs_step_discard on this model "
                   "first (it restores the state from before the "
                   "micro-batch)", fn);
}

zs_status zs__check_unit(const zs_model* m, int unit, const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "%s: unit %d does not exist (%d units)", fn, unit, m->nunits);
  return ZS_OK;
}

zs_status zs__inflight_push(zs__comm* c, zs__inflight* f, zs__coll* op) {
  if (f->n == f->cap) {
    int cap = f->cap == 0 ? 4 : 2 * f->cap;
    zs__coll** ops = (zs__coll**)realloc(f->ops, (size_t)cap * sizeof *ops);
    if (ops == NULL) {
      /* untracked, op would leak and its buffers could be freed while it
       * runs: complete it now (every rank issued it) */
      (void)zs__coll_wait(c, op);
      return zs__error(ZS_ERR_OUT_OF_MEMORY, "in-flight list (%d entries)",
                       cap);
    }
    f->ops = ops;
    f->cap = cap;
  }
  f->ops[f->n++] = op;
  return ZS_OK;
}

/* A failure zs__inflight_poll saw, for the owner (once). */
static zs_status zs__inflight_failure(zs__inflight* f) {
  if (f->failed == ZS_OK) return ZS_OK;
  const zs_status st = zs__error(f->failed, "%s", f->failed_msg);
  f->failed = ZS_OK;
  return st;
}

zs_status zs__inflight_wait(zs__comm* c, zs__inflight* f) {
  zs_status st = zs__inflight_failure(f);
  /* After a failure of one op the others are still waited for (each
   * completes or fails on its own, and their buffers may be freed next),
   * unless the communicator failed: then nothing completes any more, and
   * the ops stay pending with their buffers (comm.h). */
  for (int i = 0; i < f->n; i++) {
    zs_status s2 = st == ZS_OK || !c->failed ? zs__coll_wait(c, f->ops[i])
                                             : ZS_OK;
    if (st == ZS_OK) st = s2;
  }
  f->n = 0;
  return st;
}

zs_status zs__inflight_chain(zs__comm* c, zs__inflight* f) {
  zs_status st = zs__inflight_failure(f);
  /* as zs__inflight_wait: after a failure the others are still handed on,
   * unless the communicator failed */
  for (int i = 0; i < f->n; i++) {
    zs_status s2 = st == ZS_OK || !c->failed ? zs__coll_chain(c, f->ops[i])
                                             : ZS_OK;
    if (st == ZS_OK) st = s2;
  }
  f->n = 0;
  return st;
}

zs_status zs__inflight_poll(zs__comm* c, zs__inflight* f, int* all_done) {
  int k = 0;
  zs_status st = ZS_OK;
  while (k < f->n) {
    int done = 0;
    st = zs__coll_test(c, f->ops[k], &done);
    if (st != ZS_OK) {
      k++; /* a failed test has released the op: its owner hears of it */
      if (f->failed == ZS_OK) {
        f->failed = st;
        snprintf(f->failed_msg, sizeof f->failed_msg, "%s", zs__error_body());
      }
      break;
    }
    if (!done) break;
    k++;
  }
  if (k > 0) memmove(f->ops, f->ops + k, (size_t)(f->n - k) * sizeof *f->ops);
  f->n -= k;
  *all_done = f->n == 0;
  return st;
}

int zs__bucket_count(const zs_model* m, const zs__unit* u) {
  const size_t B = m->ctx->config.bucket_elements, S = u->layout.shard;
  return S == 0 ? 1 : (int)((S + B - 1) / B);
}

void zs__bucket(const zs_model* m, const zs__unit* u, int b, size_t* offset,
                size_t* count) {
  const size_t B = m->ctx->config.bucket_elements, S = u->layout.shard;
  *offset = (size_t)b * B;
  *count = S - *offset < B ? S - *offset : B;
}

zs_status zs__offload_host_alloc(zs_model* m, size_t bytes, const char* label,
                                 void** out) {
  return zs__offload_host_alloc_as(m, bytes, label, ZS_MEM_OFFLOAD_HOST, out);
}

zs_status zs__offload_host_alloc_as(zs_model* m, size_t bytes, const char* label,
                                    zs_mem_category category, void** out) {
  zs__device* dev = m->ctx->device;
  zs_status st = zs__offload_alloc_as(m->ctx->offload, bytes, label, category, out);
  if (st == ZS_OK && dev != m->ctx->host) {
    st = dev->ops->host_register(dev, *out, bytes);
    if (st != ZS_OK) {
      zs__offload_free(m->ctx->offload, *out);
      *out = NULL;
      return zs__error_prefix(st, "host memory for '%s': ", label);
    }
  }
  return st;
}

void zs__offload_host_free(zs_model* m, void* p) {
  if (p == NULL) return;
  zs__device* dev = m->ctx->device;
  if (dev != m->ctx->host) dev->ops->host_unregister(dev, p);
  zs__offload_free(m->ctx->offload, p);
}

zs_status zs__pieces_alloc(const size_t* offsets, const size_t* numels,
                           const int* alias, const int* skip, int n,
                           size_t begin, size_t end, const char* unit,
                           zs__piece** out, size_t* count) {
  const size_t np = zs__layout_pieces(offsets, numels, alias, skip, n, begin,
                                      end, NULL, 0);
  *out = (zs__piece*)calloc(np + 1, sizeof **out);
  if (*out == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "pieces of unit '%s'", unit);
  *count = zs__layout_pieces(offsets, numels, alias, skip, n, begin, end, *out,
                             np);
  return ZS_OK;
}

zs_status zs__unit_pieces(const zs_model* m, const zs__unit* u, size_t begin,
                          size_t end, int skip_frozen, zs__piece** out,
                          size_t* count) {
  const int k = u->ntensors;
  size_t* offsets = (size_t*)calloc((size_t)k + 1, sizeof *offsets);
  size_t* numels = (size_t*)calloc((size_t)k + 1, sizeof *numels);
  int* alias = (int*)calloc((size_t)k + 1, sizeof *alias);
  int* skip = (int*)calloc((size_t)k + 1, sizeof *skip);
  zs_status st = ZS_OK;
  *out = NULL;
  *count = 0;
  if (!offsets || !numels || !alias || !skip) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "pieces of unit '%s'", u->name);
  } else {
    for (int i = 0; i < k; i++) {
      const zs__tensor* t = &m->tensors[u->tensors[i]];
      alias[i] = t->tied_to >= 0;
      offsets[i] = alias[i] ? (size_t)-1 : t->offset;
      numels[i] = t->numel;
      skip[i] = skip_frozen && (t->flags & ZS_TENSOR_FROZEN) != 0;
    }
    st = zs__pieces_alloc(offsets, numels, alias, skip, k, begin, end, u->name,
                          out, count);
  }
  free(offsets);
  free(numels);
  free(alias);
  free(skip);
  return st;
}

void* zs__param_shard_ptr(zs_model* m, zs__unit* u) {
  if (u->policy.params == ZS__EXTENT_SHARD) return u->params_shard;
  return zs__at(u->params_full,
                zs__layout_shard_begin(&u->layout, m->ctx->shard_rank), u->elem);
}

void* zs__grad_shard_ptr(zs_model* m, zs__unit* u) {
  if (u->policy.grads == ZS__EXTENT_SHARD) return u->grads_shard;
  return zs__at(u->grads_full, zs__layout_shard_begin(&u->layout, m->ctx->shard_rank),
                u->gelem);
}

const char* zs__param_state_name(zs__param_state s) {
  static const char* const names[] = {"RESIDENT", "REFRESHING", "SHARDED",
                                      "GATHERING", "GATHERED"};
  return (unsigned)s < 5 ? names[s] : "?";
}

const char* zs__grad_state_name(zs__grad_state s) {
  static const char* const names[] = {"IDLE", "ACCUM", "REDUCING", "REDUCED"};
  return (unsigned)s < 4 ? names[s] : "?";
}

zs_status zs__param_state_set(zs__unit* u, zs__param_state to) {
  const zs__param_state from = u->param_state;
  int ok = 0;
  switch (to) {
    case ZS__PARAM_RESIDENT: ok = from == ZS__PARAM_REFRESHING; break;
    case ZS__PARAM_REFRESHING: ok = from == ZS__PARAM_RESIDENT; break;
    case ZS__PARAM_SHARDED:
      ok = from == ZS__PARAM_GATHERING || from == ZS__PARAM_GATHERED;
      break;
    case ZS__PARAM_GATHERING: ok = from == ZS__PARAM_SHARDED; break;
    case ZS__PARAM_GATHERED: ok = from == ZS__PARAM_GATHERING; break;
  }
  if (!ok)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "unit '%s': parameters %s -> %s is not a transition of "
                     "the parameter state machine (docs/design.md, \"State "
                     "machines\")", u->name, zs__param_state_name(from),
                     zs__param_state_name(to));
  u->param_state = to;
  return ZS_OK;
}

void zs__param_complete(zs__unit* u) {
  if (u->param_state == ZS__PARAM_GATHERING && u->gather_ops.n == 0)
    u->param_state = ZS__PARAM_GATHERED;
  else if (u->param_state == ZS__PARAM_REFRESHING && u->shard_ops.n == 0)
    u->param_state = ZS__PARAM_RESIDENT;
}

zs_status zs__grad_state_set(zs__unit* u, zs__grad_state to) {
  const zs__grad_state from = u->grad_state;
  int ok = 0;
  switch (to) {
    case ZS__GRAD_IDLE: ok = 1; break; /* dropped, from any state */
    case ZS__GRAD_ACCUM:
      ok = from == ZS__GRAD_IDLE || from == ZS__GRAD_REDUCED;
      break;
    case ZS__GRAD_REDUCING: ok = from == ZS__GRAD_ACCUM; break;
    case ZS__GRAD_REDUCED: ok = from == ZS__GRAD_REDUCING; break;
  }
  if (!ok)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "unit '%s': gradients %s -> %s is not a transition of "
                     "the gradient state machine (docs/design.md, \"State "
                     "machines\")", u->name, zs__grad_state_name(from),
                     zs__grad_state_name(to));
  u->grad_state = to;
  return ZS_OK;
}

size_t zs__span_begin(const zs_model* m, const zs__unit* u) {
  return u->policy.opt_span == ZS__EXTENT_FULL
             ? 0
             : zs__layout_shard_begin(&u->layout, m->ctx->shard_rank);
}

size_t zs__span_shard_offset(const zs_model* m, const zs__unit* u) {
  return zs__policy_shard_offset(u->policy.opt_span, m->ctx->shard_rank,
                                 u->layout.shard);
}

void* zs__state_shard_ptr(zs_model* m, zs__unit* u, int k) {
  if (u->state[k] == NULL) return NULL;
  return zs__at(u->state[k], zs__span_shard_offset(m, u), sizeof(float));
}

void* zs__master_shard_ptr(zs_model* m, zs__unit* u) {
  if (u->master == NULL) return NULL;
  return zs__at(u->master, zs__span_shard_offset(m, u), sizeof(float));
}

int zs__unit_has_master(const zs_model* m, const zs__unit* u) {
  /* (on NVMe, in the swap file only when the model has one: a model with
   * no trainable unit has none) */
  return u->master != NULL ||
         (u->policy.master_tier == ZS__TIER_NVME && m->nvme != NULL);
}

/* The span the optimizer updates (the policy's opt_span: the whole buffer
 * at stage 0, this rank's shard at 1-3; elements), and the device buffers
 * holding it. */
size_t zs__optimize_span_elems(const zs_model* m, const zs__unit* u) {
  (void)m;
  return zs__policy_span(&u->policy, u->layout.padded, u->layout.shard);
}

size_t zs__optimize_span(zs_model* m, zs__unit* u, char** p, char** g) {
  const int full = u->policy.opt_span == ZS__EXTENT_FULL;
  *p = (char*)(full ? u->params_full : zs__param_shard_ptr(m, u));
  *g = (char*)(full ? u->grads_full : zs__grad_shard_ptr(m, u));
  return zs__optimize_span_elems(m, u);
}

int zs__offload_force_staging = 0;

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

/* ==== Queries the features share (zeroshard.h) ============================ */

int zs_unit_grad_uses(const zs_model* m, int unit) {
  if (m == NULL || unit < 0 || unit >= m->nunits) return -1;
  const zs__unit* u = &m->units[unit];
  return u->uses_explicit > u->uses_recorded ? u->uses_explicit
                                             : u->uses_recorded;
}

zs_status zs_model_tensor_desc(const zs_model* m, int tensor,
                               zs_tensor_desc* out) {
  ZS_REQUIRE(m != NULL && out != NULL,
             "zs_model_tensor_desc: model and out must not be NULL");
  ZS_REQUIRE(tensor >= 0 && tensor < m->ntensors,
             "zs_model_tensor_desc: tensor %d does not exist (%d tensors)",
             tensor, m->ntensors);
  const zs__tensor* t = &m->tensors[tensor];
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->unit = t->unit;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof out->shape);
  out->numel = t->numel;
  out->dtype = t->dtype;
  out->flags = t->flags;
  out->tied_to = t->tied_to;
  out->group = t->tied_to >= 0 ? m->tensors[t->tied_to].group : t->group;
  return ZS_OK;
}
