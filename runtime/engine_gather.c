/*
 * engine_gather.c — parameters: gather/release of a unit, stage-3
 * prefetch along the order recorded in the first step, the prefetch hint,
 * reshard-after-forward, and progress of in-flight collectives.
 *
 *   stage 3:  SHARDED --gather/prefetch--> GATHERING --wait--> GATHERED
 *             GATHERED --last reference dropped--> SHARDED (freed)
 *   stages 0-2: parameters are resident; gather waits for the previous
 *             step's parameter all-gather of the unit, if still in flight.
 *
 * A unit's full buffer is held by references: the user's gather, gathers
 * of units that tie to it, a prefetch not yet used, and (with
 * reshard_after_forward off) a hold from its forward until its backward.
 * Prefetch decisions depend only on the trace, on sizes and on the order
 * of calls, never on timing, so every rank issues the same collectives.
 */
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

/* ==== Progress ================================================================ */

/* A unit's all-gather is over (waited for, or never started): the NVMe
 * pool's pin on its shard and the shard's device copy go. */
static void zs__gather_done(zs_model* m, zs__unit* u) {
  zs__param_gather_done(m, u);
  zs__dev_free(m->ctx->device, u->gather_src);
  u->gather_src = NULL;
}

void zs__progress(zs_model* m) {
  zs__comm* c = m->ctx->comm;
  if (c->in_flight == 0 || c->failed) return;
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
  }
}

zs_status zs__quiesce(zs_model* m) {
  zs__comm* c = m->ctx->comm;
  zs_status st = ZS_OK;
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    zs_status s2 = zs__inflight_wait(c, &u->gather_ops);
    zs__gather_done(m, u);
    if (st == ZS_OK) st = s2;
    if (u->grad_state == ZS__GRAD_REDUCING) s2 = zs__grad_reduce_finish(m, u);
    if (st == ZS_OK) st = s2;
    s2 = zs__inflight_wait(c, &u->shard_ops);
    if (st == ZS_OK) st = s2;
  }
  return st;
}

/* ==== References on a unit's full parameters ================================= */

/* Takes a reference; at stage 3 the first one allocates params_full and
 * starts its all-gather without waiting. */
static zs_status zs__hold(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (m->ctx->config.stage == 3 && u->gather_refs == 0) {
    zs__device* dev = m->ctx->device;
    zs__coll* op = NULL;
    /* parameter shards on NVMe: the shard comes into a buffer first */
    zs_status st = zs__param_gather_source(m, u);
    if (st != ZS_OK) return zs__error_prefix(st, "gather of unit '%s': ", u->name);
    /* parameter shards in host memory with a GPU: NCCL reads a device
     * copy */
    const void* src = u->params_shard;
    if (m->ctx->config.offload_param)
      st = zs__coll_source(m, u->params_shard, u->layout.shard * u->elem,
                           u->name, 0, &u->gather_src, &src);
    if (st == ZS_OK)
      st = zs__dev_alloc(dev, ZS_MEM_PARAMS_GATHERED, u->layout.padded * u->elem,
                         0, u->name, &u->params_full);
    if (st == ZS_OK)
      st = zs__comm_iall_gather(m->ctx->comm, zs__tag(ZS__P_GATHER, unit, u->name),
                                src, u->params_full, u->layout.shard, u->dtype,
                                &op);
    if (st == ZS_OK) st = zs__inflight_push(m->ctx->comm, &u->gather_ops, op);
    if (st != ZS_OK) {
      /* not started, or completed by zs__inflight_push */
      zs__dev_free(dev, u->params_full);
      u->params_full = NULL;
      zs__gather_done(m, u);
      return zs__error_prefix(st, "gather of unit '%s': ", u->name);
    }
    m->live_elems += u->layout.padded;
  }
  u->gather_refs++;
  return ZS_OK;
}

/* Drops a reference; at stage 3 the last one waits for a gather still in
 * flight (its destination is about to be freed) and frees params_full. */
static void zs__drop(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (--u->gather_refs > 0 || m->ctx->config.stage != 3) return;
  if (zs__inflight_wait(m->ctx->comm, &u->gather_ops) != ZS_OK)
    zs__log(ZS_LOG_ERROR, "%s", zs_last_error());
  zs__gather_done(m, u);
  zs__dev_free(m->ctx->device, u->params_full);
  u->params_full = NULL;
  m->live_elems -= u->layout.padded;
}

/* A reference for the user's gather: a prefetch of the unit, if any, is
 * used up (its reference changes hands) instead of taking a new one. */
static zs_status zs__hold_for_use(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  if (u->prefetch_hold) {
    u->prefetch_hold = 0;
    m->prefetches--;
    return ZS_OK;
  }
  return zs__hold(m, unit);
}

/* Waits until a held unit's full parameters are complete. */
static zs_status zs__ready(zs_model* m, zs__unit* u) {
  zs_status st = zs__inflight_wait(m->ctx->comm, &u->gather_ops);
  zs__gather_done(m, u);
  if (st == ZS_OK) st = zs__inflight_wait(m->ctx->comm, &u->shard_ops);
  return st;
}

/* ==== Prefetch ================================================================ */

/* Size in elements a prefetch of `unit` would add (itself and the owners
 * of its ties that are not gathered). */
static size_t zs__prefetch_cost(const zs_model* m, int unit) {
  const zs__unit* u = &m->units[unit];
  size_t cost = u->gather_refs == 0 ? u->layout.padded : 0;
  for (int k = 0; k < u->nowners; k++)
    if (m->units[u->owners[k]].gather_refs == 0)
      cost += m->units[u->owners[k]].layout.padded;
  return cost;
}

/* All-gathers a prefetch of `unit` would start (itself and the owners of
 * its ties that are not gathered), each counting against prefetch_depth. */
static int zs__prefetch_count(const zs_model* m, int unit) {
  const zs__unit* u = &m->units[unit];
  int n = u->gather_refs == 0;
  for (int k = 0; k < u->nowners; k++) n += m->units[u->owners[k]].gather_refs == 0;
  return n;
}

static zs_status zs__prefetch_one(zs_model* m, int unit) {
  zs__unit* u = &m->units[unit];
  zs_status st = zs__hold(m, unit);
  if (st != ZS_OK) return st;
  u->prefetch_hold = 1;
  m->prefetches++;
  /* Owners of its ties come along, each as its own prefetch. */
  for (int k = 0; k < u->nowners && st == ZS_OK; k++) {
    zs__unit* o = &m->units[u->owners[k]];
    if (o->gather_refs > 0) continue;
    st = zs__hold(m, u->owners[k]);
    if (st == ZS_OK) {
      o->prefetch_hold = 1;
      m->prefetches++;
    }
  }
  return st;
}

/* Parameter shards on NVMe: reads the shards of the next units of the
 * trace that are not gathered into free buffers, ahead of their
 * all-gathers (ZeRO-Infinity's read-ahead). Each buffer a read-ahead takes
 * stays until its unit is used, so this stops at the first unit that
 * finds none. */
static void zs__param_trace_read_ahead(zs_model* m) {
  if (m->nvme_params == NULL) return;
  for (int j = m->trace_pos; j < m->trace_len; j++) {
    const int v = m->trace[j];
    if (m->units[v].gather_refs > 0) continue;
    if (!zs__param_read_ahead(m, v)) break;
  }
}

/* Issues all-gathers for the next units of the trace that are not
 * gathered, while fewer than prefetch_depth prefetches are unused and the
 * live-elements limit allows; then reads ahead (above). */
static zs_status zs__prefetch_issue(zs_model* m) {
  const int depth = m->ctx->config.prefetch_depth;
  if (m->ctx->config.stage != 3 || !m->trace_valid || !m->trace_ok)
    return ZS_OK;
  for (int j = m->trace_pos; j < m->trace_len && m->prefetches < depth; j++) {
    const int v = m->trace[j];
    if (m->units[v].gather_refs > 0) continue;
    const size_t cost = zs__prefetch_cost(m, v);
    if (m->max_live_elems > 0 && m->live_elems + cost > m->max_live_elems)
      break;
    /* never more than `depth` prefetched all-gathers, ties included */
    if (m->prefetches + zs__prefetch_count(m, v) > depth) break;
    zs_status st = zs__prefetch_one(m, v);
    if (st != ZS_OK) return st;
  }
  zs__param_trace_read_ahead(m);
  return ZS_OK;
}

zs_status zs__prefetch_drain(zs_model* m) {
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (u->prefetch_hold) {
      u->prefetch_hold = 0;
      m->prefetches--;
      zs__drop(m, i);
    }
    if (u->forward_hold) {
      u->forward_hold = 0;
      zs__drop(m, i);
    }
  }
  return ZS_OK;
}

static zs_status zs__grow_ints(int** arr, int* cap, int need) {
  if (need <= *cap) return ZS_OK;
  int ncap = *cap == 0 ? 64 : 2 * *cap;
  while (ncap < need) ncap *= 2;
  int* p = (int*)realloc(*arr, (size_t)ncap * sizeof(int));
  if (p == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "gather trace");
  *arr = p;
  *cap = ncap;
  return ZS_OK;
}

void zs__trace_end_step(zs_model* m) {
  /* A step that followed the trace to its end keeps it; otherwise this
   * step's order becomes the trace (recorded again). */
  const int matched =
      m->trace_valid && m->trace_ok && m->trace_pos == m->trace_len;
  if (!matched && zs__grow_ints(&m->trace, &m->trace_cap, m->seen_len) == ZS_OK) {
    if (m->seen_len > 0)
      memcpy(m->trace, m->seen, (size_t)m->seen_len * sizeof(int));
    m->trace_len = m->seen_len;
    m->trace_valid = m->seen_len > 0;
  }
  m->seen_len = 0;
  m->trace_pos = 0;
  m->trace_ok = 1;
}

void zs__trace_drop_step(zs_model* m) {
  m->seen_len = 0;
  m->trace_pos = 0;
  m->trace_ok = 1;
}

/* Follows the trace with the user's gather of `unit`; a gather out of
 * order ends prefetching for this step (unused prefetches are dropped). */
static zs_status zs__trace_follow(zs_model* m, int unit) {
  zs_status st = zs__grow_ints(&m->seen, &m->seen_cap, m->seen_len + 1);
  if (st != ZS_OK) return st;
  m->seen[m->seen_len++] = unit;
  if (!m->trace_valid || !m->trace_ok) return ZS_OK;
  if (m->trace_pos < m->trace_len && m->trace[m->trace_pos] == unit) {
    m->trace_pos++;
    return ZS_OK;
  }
  zs__log(ZS_LOG_INFO,
          "gather of unit '%s' departs from the recorded order at position "
          "%d: prefetch stops for this step and the order is recorded again",
          m->units[unit].name, m->trace_pos);
  m->trace_ok = 0;
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    if (!u->prefetch_hold) continue;
    u->prefetch_hold = 0;
    m->prefetches--;
    zs__drop(m, i);
  }
  return ZS_OK;
}

/* ==== The public calls ======================================================= */

static zs_status zs__unit_gather(zs_model* m, int unit) {
  zs_status st = ZS_OK;
  const double t0 = m->ctx->prof != NULL ? zs__now() : 0.0;
  zs__unit* u = &m->units[unit];
  if (u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_gather: unit '%s' is already gathered; release "
                     "it before gathering it again", u->name);
  zs__progress(m);
  if (m->ctx->config.stage == 3 && !m->eval) {
    st = zs__trace_follow(m, unit);
    if (st != ZS_OK) return st;
  }
  st = zs__hold_for_use(m, unit);
  if (st != ZS_OK) return st;
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
  if (m->ctx->prof != NULL)  /* from the call until the parameters are ready */
    zs__profiler_span(m->ctx->prof, 0, "gather", "gather", t0, zs__now(),
                      u->name, 0, 0, 0);
  return ZS_OK;
}

zs_status zs_unit_gather(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_gather");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_unit_gather");
  if (st != ZS_OK) return st;
  const uint64_t begin = zs__call_begin(m);
  return zs__call_end(m, begin, zs__unit_gather(m, unit));
}

zs_status zs_unit_release(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_release");
  if (st != ZS_OK) return st;
  zs__unit* u = &m->units[unit];
  if (!u->user_gathered)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_unit_release: unit '%s' is not gathered (release "
                     "without a matching zs_unit_gather)", u->name);
  for (int k = u->nowners - 1; k >= 0; k--) zs__drop(m, u->owners[k]);
  /* Released in the forward pass (its gradients not touched yet this
   * step) with reshard_after_forward off: keep it for the backward. */
  if (m->ctx->config.stage == 3 && !m->ctx->config.reshard_after_forward &&
      !m->eval && !u->forward_hold && u->grad_state == ZS__GRAD_IDLE && u->releases == 0 &&
      !u->user_grad_open)
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
  return ZS_OK;
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
  if (st == ZS_OK) m->eval = eval;
  return st;
}

static zs_status zs__unit_prefetch(zs_model* m, int unit) {
  if (m->eval) return ZS_OK;
  if (m->ctx->config.stage != 3 || m->units[unit].gather_refs > 0) return ZS_OK;
  if (m->max_live_elems > 0 &&
      m->live_elems + zs__prefetch_cost(m, unit) > m->max_live_elems)
    return ZS_OK; /* a hint: the live limit wins */
  if (m->prefetches + zs__prefetch_count(m, unit) > m->ctx->config.prefetch_depth)
    return ZS_OK; /* ... and so does the depth */
  return zs__prefetch_one(m, unit);
}

zs_status zs_unit_prefetch(zs_model* m, int unit) {
  zs_status st = zs__check_unit(m, unit, "zs_unit_prefetch");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_unit_prefetch");
  if (st != ZS_OK) return st;
  const uint64_t begin = zs__call_begin(m);
  return zs__call_end(m, begin, zs__unit_prefetch(m, unit));
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
  zs__unit* su = &m->units[zs__storage_unit(m, tensor)];
  *data = zs__at(su->params_full, t->offset, su->elem);
  return ZS_OK;
}
