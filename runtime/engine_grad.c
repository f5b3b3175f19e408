/*
 * engine_grad.c — gradients: acquire/release of a unit's accumulation
 * buffer, and its reduction after the last use of the step, as bucketed
 * non-blocking reduce-scatters that overlap whatever the caller computes
 * next (the backward of the units before it).
 *
 *   IDLE --acquire--> ACCUM --last release--> REDUCING --done--> REDUCED
 *   REDUCED --acquire--> ACCUM (re-opened: the new sum adds to the shard)
 *
 * Every stage reduces the unit's whole buffer with the same buckets, so
 * each element is summed in the same order at every stage (and, with the
 * default fixed reduce order, at every bucket size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"

/* ==== In-flight lists ======================================================== */

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

zs_status zs__inflight_wait(zs__comm* c, zs__inflight* f) {
  zs_status st = ZS_OK;
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

zs_status zs__inflight_poll(zs__comm* c, zs__inflight* f, int* all_done) {
  int k = 0;
  zs_status st = ZS_OK;
  while (k < f->n) {
    int done = 0;
    st = zs__coll_test(c, f->ops[k], &done);
    if (st != ZS_OK) {
      k++; /* a failed test has released the op */
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

/* ==== Buckets =============================================================== */

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

/* ==== Accumulation buffers ================================================== */

/* Makes the accumulation buffer ready for a new contribution: zeroed on the
 * first open of the step. A unit opened again after its reduction (it was
 * used more often than recorded) keeps its reduced shard in grad_saved and
 * starts a fresh zeroed buffer; its next reduction adds to the saved shard,
 * which is exact up to one extra rounding of the mean. */
zs_status zs__grad_prepare(zs_model* m, zs__unit* u) {
  zs__device* dev = m->ctx->device;
  const int stage = m->ctx->config.stage;
  const size_t S = u->layout.shard * u->gelem, P = u->layout.padded * u->gelem;
  zs_status st = ZS_OK;
  if (u->grad_state == ZS__GRAD_ACCUM) return ZS_OK;
  if (u->grad_state == ZS__GRAD_REDUCING)
    ZS_CHECK(zs__grad_reduce_finish(m, u));
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

void zs__grad_drop(zs_model* m, zs__unit* u) {
  if (u->grad_accum != u->grads_full) zs__dev_free(m->ctx->device, u->grad_accum);
  zs__dev_free(m->ctx->device, u->grad_saved);
  zs__dev_free(m->ctx->device, u->red_sum);
  u->grad_accum = u->grad_saved = u->red_sum = NULL;
  u->reopened = 0;
  u->grad_state = ZS__GRAD_IDLE;
}

/* ==== Reduction ============================================================= */

/* The divisor of the gradient mean: ranks * micro-batches per step. */
static float zs__grad_divisor(const zs_model* m) {
  return (float)m->ctx->world * (float)m->ctx->config.grad_accum_steps;
}

/* One reduce-scatter per bucket of the shard, all started now; each sums
 * into this rank's shard (or, for a re-opened unit, into red_sum, added to
 * the saved shard at the end). The accumulation buffer is their send
 * buffer and stays alive until they complete. */
zs_status zs__grad_reduce_start(zs_model* m, zs__unit* u) {
  zs__comm* comm = m->ctx->comm;
  const int ui = (int)(u - m->units);
  const zs__coll_tag tag = zs__tag(ZS__P_REDUCE, ui, u->name);
  const zs__reduce_order order = (zs__reduce_order)m->ctx->config.reduce_order;
  char* dst = (char*)zs__grad_shard_ptr(m, u);
  zs_status st = ZS_OK;
  /* At most ZS__MAX_REDUCING units reducing: the oldest is finished before
   * this one starts (its collectives were issued that many units ago and
   * precede this one's in the stream anyway), which bounds the memory of
   * bucket temporaries and accumulation buffers. */
  while (m->nreducing >= ZS__MAX_REDUCING) {
    st = zs__grad_reduce_finish(m, &m->units[m->reducing[0]]);
    if (st != ZS_OK) return st; /* its message names its unit */
  }
  if (u->reopened) {
    ZS_CHECK(zs__dev_alloc(m->ctx->device, ZS_MEM_COMM_BUFFERS,
                           u->layout.shard * u->gelem, 0, u->name, &u->red_sum));
    dst = (char*)u->red_sum;
  }
  for (int b = 0; b < zs__bucket_count(m, u); b++) {
    size_t off, cnt;
    zs__bucket(m, u, b, &off, &cnt);
    zs__coll* op = NULL;
    ZS_CHECK(zs__comm_ireduce_scatter(comm, tag, order, u->grad_accum, off,
                                      u->layout.shard, cnt,
                                      dst + off * u->gelem,
                                      zs__grad_divisor(m), u->gdtype, &op));
    ZS_CHECK(zs__inflight_push(comm, &u->red_ops, op));
  }
  u->grad_state = ZS__GRAD_REDUCING;
  if (m->nreducing == m->reducing_cap) {
    int cap = m->reducing_cap == 0 ? 8 : 2 * m->reducing_cap;
    int* q = (int*)realloc(m->reducing, (size_t)cap * sizeof *q);
    if (q == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "reduction queue");
    m->reducing = q;
    m->reducing_cap = cap;
  }
  m->reducing[m->nreducing++] = ui;
cleanup:
  if (st != ZS_OK) {
    /* Buckets already started read grad_accum: finish them before anyone
     * frees it. The unit counts as REDUCING so the step's cleanup waits. */
    if (u->red_ops.n > 0 && u->grad_state != ZS__GRAD_REDUCING) {
      char saved[1024];
      snprintf(saved, sizeof saved, "%s", zs__error_body());
      (void)zs__inflight_wait(comm, &u->red_ops);
      zs__error(st, "%s", saved);
    }
    st = zs__error_prefix(st, "reduction of unit '%s': ", u->name);
  }
  return st;
}

static void zs__reducing_remove(zs_model* m, int ui) {
  for (int i = 0; i < m->nreducing; i++)
    if (m->reducing[i] == ui) {
      memmove(m->reducing + i, m->reducing + i + 1,
              (size_t)(m->nreducing - i - 1) * sizeof *m->reducing);
      m->nreducing--;
      return;
    }
}

/* Waits for the buckets, takes the mean over ranks and releases the
 * accumulation buffer. */
zs_status zs__grad_reduce_finish(zs_model* m, zs__unit* u) {
  zs__device* dev = m->ctx->device;
  zs__comm* comm = m->ctx->comm;
  void* shard = zs__grad_shard_ptr(m, u);
  zs_status st = ZS_OK;
  zs__reducing_remove(m, (int)(u - m->units));
  /* The buckets deliver the mean (sum / (ranks * K), one rounding); a
   * re-opened unit adds its new mean to the saved one. */
  ZS_CHECK(zs__inflight_wait(comm, &u->red_ops));
  if (u->reopened)
    ZS_CHECK(dev->ops->div_add(dev, shard, u->grad_saved, u->red_sum, 1.0f,
                               u->layout.shard, u->gdtype, NULL));
  if (u->grad_accum != u->grads_full) zs__dev_free(dev, u->grad_accum);
  u->grad_accum = NULL;
  zs__dev_free(dev, u->grad_saved);
  zs__dev_free(dev, u->red_sum);
  u->grad_saved = u->red_sum = NULL;
  u->reopened = 0;
  u->grad_state = ZS__GRAD_REDUCED;
cleanup:
  if (st != ZS_OK) st = zs__error_prefix(st, "reduction of unit '%s': ", u->name);
  return st;
}

zs_status zs__grad_gather_start(zs_model* m) {
  zs__comm* comm = m->ctx->comm;
  zs_status st = ZS_OK;
  for (int ui = 0; ui < m->nunits && st == ZS_OK; ui++) {
    zs__unit* u = &m->units[ui];
    for (int b = 0; u->trainable && b < zs__bucket_count(m, u) && st == ZS_OK;
         b++) {
      size_t off, cnt;
      zs__bucket(m, u, b, &off, &cnt);
      zs__coll* op = NULL;
      st = zs__comm_iall_gather_strided(
          comm, zs__tag(ZS__P_GRAD_GATHER, ui, u->name), u->grads_full, off,
          u->layout.shard, cnt, u->gdtype, &op);
      if (st == ZS_OK) st = zs__inflight_push(comm, &u->shard_ops, op);
    }
  }
  return st;
}

/* ==== Acquire / release ===================================================== */

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
  if (u->trainable && u->grad_refs == 0 && expected > 0 &&
      u->releases >= expected && u->grad_state == ZS__GRAD_ACCUM)
    return zs__grad_reduce_start(m, u);
  return ZS_OK;
}

static zs_status zs__check_unit(const zs_model* m, int unit, const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "%s: unit %d does not exist (%d units)", fn, unit, m->nunits);
  return ZS_OK;
}

static zs_status zs__unit_grad_acquire(zs_model* m, int unit) {
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
  return ZS_OK;
}

zs_status zs_unit_grad_acquire(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_grad_acquire");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_unit_grad_acquire");
  if (st != ZS_OK) return st;
  const uint64_t begin = zs__call_begin(m);
  return zs__call_end(m, begin, zs__unit_grad_acquire(m, unit));
}

static zs_status zs__unit_grad_release(zs_model* m, int unit) {
  zs_status st = ZS_OK;
  zs__unit* u = &m->units[unit];
  if (!u->user_grad_open)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_grad_release: gradients of unit '%s' were not "
                     "acquired", u->name);
  u->user_grad_open = 0;
  zs__forward_hold_end(m, unit);
  /* Close everything even if a reduction fails, so refcounts stay exact. */
  st = zs__grad_close(m, unit, 1);
  for (int k = 0; k < u->nowners; k++) {
    zs_status s2 = zs__grad_close(m, u->owners[k], st == ZS_OK);
    if (st == ZS_OK) st = s2;
  }
  zs__progress(m);
  return st;
}

zs_status zs_unit_grad_release(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_grad_release");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_unit_grad_release");
  if (st != ZS_OK) return st;
  const uint64_t begin = zs__call_begin(m);
  return zs__call_end(m, begin, zs__unit_grad_release(m, unit));
}

void zs__grad_abandon(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->user_grad_open) return;
  u->user_grad_open = 0;
  zs__forward_hold_end(m, unit);
  u->grad_refs--;
  for (int k = 0; k < u->nowners; k++) m->units[u->owners[k]].grad_refs--;
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
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *grad = zs__at(su->grad_accum, t->offset, su->gelem);
  return ZS_OK;
}
