/*
 * engine_unit.c — a unit's buffers through a step: references on its full
 * parameters (at stage 3 the first allocates them and starts their
 * all-gather, the last frees them), its gradient accumulation buffer and
 * reduction (bucketed non-blocking reduce-scatters into the shard, the
 * mean, the stage-0 all-gather back), progress of what is in flight, and
 * the funnel's end (zs__call_end) every public call that issues
 * collectives goes through.
 *
 *   parameters gathered on use (stage 3):
 *               SHARDED --hold--> GATHERING --ready--> GATHERED
 *               GATHERED --last drop--> SHARDED (freed)
 *   parameters resident (stages 0-2):
 *               RESIDENT --step's refresh--> REFRESHING --ready--> RESIDENT
 *   gradients:  IDLE --prepare--> ACCUM --reduce_start--> REDUCING
 *               REDUCING --reduce_finish--> REDUCED (--prepare--> ACCUM:
 *               re-opened, the new sum adds to the shard)
 * (engine.h's zs__param_state and zs__grad_state; the transitions are
 * checked by zs__param_state_set and zs__grad_state_set.)
 *
 * Every stage reduces the unit's whole buffer with the same buckets, so
 * each element is summed in the same order at every stage (and, with the
 * default fixed reduce order, at every bucket size).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_unit.h"

zs_status zs__call_end(zs_model* m, uint64_t begin, zs_status st) {
  zs__comm* c = m->ctx->comm;
  switch (st) {
    case ZS_ERR_OUT_OF_MEMORY:
    case ZS_ERR_DEVICE:
    case ZS_ERR_IO:
    case ZS_ERR_COMM:
    case ZS_ERR_CORRUPT:
    case ZS_ERR_INTERNAL:
      if (c->agreed_failures != begin || c->world == 1) return st;
      /* First finish what every rank issued, so the others complete it
       * too (a notice ends their waits only for collectives from this
       * rank's next one on); a failure here is theirs, reported already */
      if (!c->failed) {
        char saved[ZS__NOTICE_BYTES];
        snprintf(saved, sizeof saved, "%s", zs__error_body());
        (void)zs__quiesce(m);
        zs__error(st, "%s", saved);
      }
      return zs__comm_abandon(c, st);
    default:
      return st;
  }
}

zs_status zs__public_call(zs_model* m, const char* fn, int unit, int gate,
                   zs__public_body body, void* arg) {
  zs_status st = unit >= 0 ? zs__check_unit(m, unit, fn)
                           : zs__check_finalized(m, fn);
  if (st == ZS_OK && gate) st = zs__check_discarded(m, fn);
  if (st != ZS_OK) return st;
  zs__heartbeat* hb = m->ctx->comm->hb;
  zs__hb_call(hb, fn, unit >= 0 ? m->units[unit].name : NULL);
  const uint64_t begin = zs__call_begin(m);
  st = zs__call_end(m, begin, body(m, unit, arg));
  zs__hb_return(hb);
  return st;
}

/* A unit's all-gather is over (waited for, or never started): the NVMe
 * pool's pin on its shard and the shard's device copy go. */
static void zs__gather_done(zs_model* m, zs__unit* u) {
  zs__param_gather_done(m, u);
  zs__dev_free(m->ctx->device, u->gather_src);
  u->gather_src = NULL;
}

void zs__progress(zs_model* m) {
  zs__comm* c = m->ctx->shard_comm;
  if (c->in_flight == 0 || c->failed) return;
  /* chained gathers that completed (a failure fails the communicator:
   * the next call says so) */
  (void)zs__comm_sweep(c);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    int done;
    /* Errors surface when the owner waits for the op; polling is a hint. */
    if (u->gather_ops.n > 0) (void)zs__inflight_poll(c, &u->gather_ops, &done);
    /* A finished reduction frees its buffers now (local work only). */
    if (u->grad_state == ZS__GRAD_REDUCING &&
        zs__inflight_poll(c, &u->red_ops, &done) == ZS_OK && done)
      (void)zs__grad_reduce_finish(m, u);
    if (u->shard_ops.n > 0) (void)zs__inflight_poll(c, &u->shard_ops, &done);
    zs__param_complete(u);
  }
}

zs_status zs__quiesce(zs_model* m) {
  zs__comm* c = m->ctx->shard_comm;
  zs_status st = zs__comm_drain(c);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    zs_status s2 = zs__inflight_wait(c, &u->gather_ops);
    zs__gather_done(m, u);
    if (st == ZS_OK) st = s2;
    if (u->grad_state == ZS__GRAD_REDUCING) s2 = zs__grad_reduce_finish(m, u);
    if (st == ZS_OK) st = s2;
    s2 = zs__inflight_wait(c, &u->shard_ops);
    if (st == ZS_OK) st = s2;
    zs__param_complete(u);
  }
  return st;
}

/* A unit that may be unused (zs_unit_allow_unused), at stage 3: its
 * all-gather goes to the ranks that use it this time. One all-reduce of a
 * flag per rank agrees which those are (every rank reaches the unit at the
 * same point: a user by zs_unit_gather, the others by zs_unit_mark_unused);
 * then every rank sends its shard to them: the all-gather when all use
 * it, a gather to the users when some do (a rank outside only sends),
 * nothing when none does (*op NULL). dst: the full buffer on a user, NULL
 * on a rank that does not use it. */
static zs_status zs__gather_users(zs_model* m, int unit, const void* src,
                                  void* dst, zs__coll** op) {
  zs__comm* c = m->ctx->shard_comm;
  zs__unit* u = &m->units[unit];
  /* with shard groups each group decides by its own ranks' use: groups
   * issue different gathers here (left out of the context's check; the
   * flags' all-reduce before them every group issues alike) */
  zs__coll_tag tag = zs__tag(ZS__P_GATHER, unit, u->name);
  tag.group_local = c->parent != NULL;
  *op = NULL;
  /* Heap, not stack: a collective's buffer (see zs__comm_free). */
  uint64_t* flags = (uint64_t*)calloc((size_t)c->world, sizeof *flags);
  if (flags == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "gather of unit '%s': users",
                     u->name);
  flags[c->rank] = dst != NULL;
  zs_status st = zs__comm_all_reduce(c, zs__tag(ZS__P_AGREE, unit, u->name),
                                     ZS__IN_PLACE, flags, (size_t)c->world,
                                     ZS_UINT64, ZS__RED_SUM);
  uint64_t users = 0;
  int n = 0;
  for (int r = 0; st == ZS_OK && r < c->world; r++)
    if (flags[r] != 0) {
      users |= (uint64_t)1 << r;
      n++;
    }
  zs__comm_free(c, flags);
  if (st != ZS_OK || n == 0) return st;
  if (n == c->world)
    return zs__comm_iall_gather(c, tag, src, dst, u->layout.shard, u->dtype, op);
  return zs__comm_igather_users(c, tag, src, dst, u->layout.shard, u->dtype,
                                users, op);
}

/* The source of a unit's stage-3 gather: its shard, read from NVMe first
 * when it lives there, and copied to the device when the collective needs
 * device memory (until zs__gather_done). */
static zs_status zs__gather_src(zs_model* m, zs__unit* u, const void** src) {
  zs_status st = zs__param_gather_source(m, u);
  *src = u->params_shard;
  if (st == ZS_OK && u->policy.gather_via_copy)
    st = zs__coll_source(m, u->params_shard, u->layout.shard * u->elem,
                         u->name, 0, &u->gather_src, src);
  return st;
}

/* A unit some ranks may not use: a send of its shard to the users from an
 * earlier zs_unit_mark_unused completes before the unit moves again. */
zs_status zs__unused_send_finish(zs_model* m, zs__unit* u) {
  if (!u->allow_unused || u->gather_refs > 0 || u->gather_ops.n == 0)
    return ZS_OK;
  zs_status st = zs__inflight_wait(m->ctx->shard_comm, &u->gather_ops);
  zs__gather_done(m, u);
  return st;
}

zs_status zs__unused_send(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->policy.gather_on_use) return ZS_OK;
  zs__coll* op = NULL;
  const void* src = NULL;
  zs_status st = zs__unused_send_finish(m, u);
  if (st == ZS_OK) st = zs__gather_src(m, u, &src);
  if (st == ZS_OK) st = zs__gather_users(m, unit, src, NULL, &op);
  if (st == ZS_OK && op != NULL)
    st = zs__inflight_push(m->ctx->shard_comm, &u->gather_ops, op);
  if (st != ZS_OK || op == NULL) zs__gather_done(m, u);
  if (st != ZS_OK)
    return zs__error_prefix(st, "zs_unit_mark_unused: unit '%s': ", u->name);
  return ZS_OK;
}

/* Takes a reference; at stage 3 the first one allocates params_full and
 * starts its all-gather without waiting. */
zs_status zs__hold(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->policy.gather_on_use && u->gather_refs == 0) {
    zs__device* dev = m->ctx->device;
    zs__coll* op = NULL;
    zs_status st = zs__unused_send_finish(m, u);
    if (st == ZS_OK) st = zs__param_state_set(u, ZS__PARAM_GATHERING);
    if (st != ZS_OK) return st;
    /* parameter shards on NVMe: the shard comes into a buffer first;
     * parameter shards in host memory or on NVMe with a GPU: NCCL reads
     * a device copy */
    const void* src = NULL;
    st = zs__gather_src(m, u, &src);
    if (st == ZS_OK)
      st = zs__dev_alloc(dev, ZS_MEM_PARAMS_GATHERED, u->layout.padded * u->elem,
                         0, u->name, &u->params_full);
    if (st == ZS_OK)
      st = u->allow_unused
               ? zs__gather_users(m, unit, src, u->params_full, &op)
               : zs__comm_iall_gather(m->ctx->shard_comm,
                                      zs__tag(ZS__P_GATHER, unit, u->name), src,
                                      u->params_full, u->layout.shard, u->dtype,
                                      &op);
    if (st == ZS_OK) st = zs__inflight_push(m->ctx->shard_comm, &u->gather_ops, op);
    if (st != ZS_OK) {
      /* not started, or completed by zs__inflight_push */
      zs__dev_free(dev, u->params_full);
      u->params_full = NULL;
      zs__gather_done(m, u);
      (void)zs__param_state_set(u, ZS__PARAM_SHARDED);
      return zs__error_prefix(st, "gather of unit '%s': ", u->name);
    }
    /* (a unit some ranks may skip is outside the live limit: the prefetch
     * decisions it feeds must be the same on every rank) */
    if (!u->allow_unused) m->live_elems += u->layout.padded;
  }
  u->gather_refs++;
  return ZS_OK;
}

/* Drops a reference; at stage 3 the last one waits for a gather still in
 * flight (its destination is about to be freed) and frees params_full. */
void zs__drop(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (--u->gather_refs > 0 || !u->policy.gather_on_use) return;
  if (zs__inflight_wait(m->ctx->shard_comm, &u->gather_ops) != ZS_OK)
    zs__log(ZS_LOG_ERROR, "%s", zs_last_error());
  zs__gather_done(m, u);
  if (zs__param_state_set(u, ZS__PARAM_SHARDED) != ZS_OK)
    zs__log(ZS_LOG_ERROR, "%s", zs_last_error());
  zs__dev_free(m->ctx->device, u->params_full);
  u->params_full = NULL;
  if (!u->allow_unused) m->live_elems -= u->layout.padded;
  m->unsteady_live -= u->unsteady_held;
  u->unsteady_held = 0;
}

/* A reference for the user's gather: a prefetch of the unit, if any, is
 * used up (its reference changes hands) instead of taking a new one. */
zs_status zs__hold_for_use(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->prefetch_hold) {
    u->prefetch_hold = 0;
    m->prefetches--;
    return ZS_OK;
  }
  return zs__hold(m, unit);
}

/* Makes a held unit's full parameters complete for their consumers: on
 * a device that can chain (CUDA), the device's later work waits for the
 * all-gather on the device and the host goes on at once (the watchdog
 * finds one that never completes); otherwise, and when the all-gather
 * reads a device copy of a shard kept elsewhere (freed here), the host
 * waits. */
zs_status zs__ready(zs_model* m, zs__unit* u) {
  zs__comm* c = m->ctx->shard_comm;
  zs_status st = zs__comm_sweep(c);
  if (st == ZS_OK)
    st = u->gather_src == NULL ? zs__inflight_chain(c, &u->gather_ops)
                               : zs__inflight_wait(c, &u->gather_ops);
  else
    (void)zs__inflight_wait(c, &u->gather_ops);
  /* (a failure seen while polling, or by the watchdog, may have failed
   * the communicator with nothing left to wait for) */
  if (st == ZS_OK) st = zs__comm_failed_check(c);
  zs__gather_done(m, u);
  if (st == ZS_OK) st = zs__inflight_wait(m->ctx->shard_comm, &u->shard_ops);
  if (st == ZS_OK) zs__param_complete(u);
  return st;
}

void zs__gather_abandon(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->user_gathered) return;
  for (int k = u->nowners - 1; k >= 0; k--) zs__drop(m, u->owners[k]);
  zs__drop(m, unit);
  u->user_gathered = 0;
}

/* The end of a unit's backward also ends a forward hold. */
void zs__forward_hold_end(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->forward_hold) return;
  u->forward_hold = 0;
  zs__drop(m, unit);
}

/* Makes the accumulation buffer ready for a new contribution: zeroed on the
 * first open of the step. A unit opened again after its reduction (it was
 * used more often than recorded) keeps its reduced shard in grad_saved and
 * starts a fresh zeroed buffer; its next reduction adds to the saved shard,
 * which is exact up to one extra rounding of the mean. */
zs_status zs__grad_prepare(zs_model* m, zs__unit* u) {
  zs__device* dev = m->ctx->device;
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
  if (u->policy.accum_transient) {
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_COMM_BUFFERS, P, 1, u->name,
                           &u->grad_accum));
  } else {
    u->grad_accum = u->grads_full;
    ZS_CHECK(dev->ops->memset(dev, u->grad_accum, 0, P, NULL));
  }
  ZS_CHECK(zs__grad_state_set(u, ZS__GRAD_ACCUM));
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
  (void)zs__grad_state_set(u, ZS__GRAD_IDLE); /* (from any state) */
}

/* The divisor of the gradient mean: the shard group's ranks * micro-batches
 * per step (with replicas, the replica all-reduce then takes the mean of
 * the groups' means: zs__replica_reduce). */
static float zs__grad_divisor(const zs_model* m) {
  return (float)m->ctx->shard_ranks * (float)m->ctx->config.grad_accum_steps;
}

/* One reduce-scatter per bucket of the shard, all started now; each sums
 * into this rank's shard (or, for a re-opened unit, into red_sum, added to
 * the saved shard at the end). The accumulation buffer is their send
 * buffer and stays alive until they complete. */
zs_status zs__grad_reduce_start(zs_model* m, zs__unit* u) {
  zs__comm* comm = m->ctx->shard_comm;
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
  ZS_CHECK(zs__grad_state_set(u, ZS__GRAD_REDUCING));
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
  zs__comm* comm = m->ctx->shard_comm;
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
  ZS_CHECK(zs__grad_state_set(u, ZS__GRAD_REDUCED));
cleanup:
  if (st != ZS_OK) st = zs__error_prefix(st, "reduction of unit '%s': ", u->name);
  return st;
}

zs_status zs__grad_gather_start(zs_model* m) {
  zs__comm* comm = m->ctx->shard_comm;
  zs_status st = ZS_OK;
  for (int ui = 0; ui < m->nunits && st == ZS_OK; ui++) {
    zs__unit* u = &m->units[ui];
    for (int b = 0; u->policy.grads_gather_back && b < zs__bucket_count(m, u) &&
                    st == ZS_OK;
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

void zs__grad_abandon(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (!u->user_grad_open) return;
  u->user_grad_open = 0;
  zs__forward_hold_end(m, unit);
  u->grad_refs--;
  for (int k = 0; k < u->nowners; k++) m->units[u->owners[k]].grad_refs--;
}
