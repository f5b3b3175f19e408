/*
 * engine_io.c — moving whole tensors in and out of the sharded storage:
 * initialization from a rank-0 callback or array (broadcast), and reading
 * any field back (all-gather of the owning unit's shards).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"
#include "runtime/engine/engine_optim_nvme.h"
#include "runtime/engine/engine_sched.h"
#include "runtime/engine/engine_unit.h"

/* Refuses while the user holds a gathered unit (after prefetches and
 * forward holds were dropped): at stage 3 its gathered copy would go
 * stale, and the same code must behave the same at every stage. */
static zs_status zs__check_none_gathered(const zs_model* m, const char* fn) {
  for (int i = 0; i < m->nunits; i++)
    if (m->units[i].gather_refs > 0)
      return zs__error(ZS_ERR_INVALID_STATE,
                       "%s: unit '%s' is gathered; release it first", fn,
                       m->units[i].name);
  return ZS_OK;
}

/* Copies elements [begin, begin+n) of a unit's full flat buffer `full` into
 * this rank's persistent parameter storage. */
static zs_status zs__store_params(zs_model* m, zs__unit* u, const char* full,
                                  size_t begin, size_t n) {
  zs__device* dev = m->ctx->device;
  zs_status st = ZS_OK;
  if (u->policy.params == ZS__EXTENT_FULL) {
    st = dev->ops->copy(dev, zs__at(u->params_full, begin, u->elem), full,
                        n * u->elem, NULL);
  } else {
    size_t s0 = zs__layout_shard_begin(&u->layout, m->ctx->shard_rank);
    size_t s1 = s0 + u->layout.shard;
    size_t lo = begin > s0 ? begin : s0, hi = begin + n < s1 ? begin + n : s1;
    if (lo >= hi) return ZS_OK;
    /* parameter shards on NVMe: into the unit's buffer (read first
     * unless the whole shard is written), then its file */
    st = lo == s0 && hi == s1 ? zs__param_acquire_blank(m, u)
                              : zs__param_acquire(m, u);
    if (st != ZS_OK) return st;
    st = dev->ops->copy(dev, zs__at(u->params_shard, lo - s0, u->elem),
                        full + (lo - begin) * u->elem, (hi - lo) * u->elem,
                        NULL);
    if (st == ZS_OK) st = zs__master_refresh_range(m, u, begin, n);
    if (st == ZS_OK) st = zs__param_write_back(m, u);
    zs__param_release(m, u);
    return st;
  }
  /* The written elements' master weights follow (only those: the others
   * keep their fp32 precision). */
  if (st == ZS_OK) st = zs__master_refresh_range(m, u, begin, n);
  return st;
}

/* With parameter shards on NVMe a store reads and writes the disk, which
 * may fail on one rank only: every rank agrees on the outcome (no other
 * rank is left waiting in the next collective). Otherwise local. */
static zs_status zs__agree_store(zs_model* m, zs_status local,
                                 const char* what) {
  if (m->nvme_params == NULL) return local;
  return zs__comm_agree(m->ctx->comm, local, what);
}

typedef struct zs__init_args {
  zs_init_fn fn;
  void* user;
} zs__init_args;

static zs_status zs__model_init(zs_model* m, int unit, void* arg) {
  (void)unit;
  const zs_init_fn fn = ((zs__init_args*)arg)->fn;
  void* user = ((zs__init_args*)arg)->user;
  zs_status st = ZS_OK;
  zs__comm* comm = m->ctx->comm;
  /* Local checks are agreed on, so a rank that fails them fails everyone
   * instead of leaving the others in a broadcast. */
  zs_status local = zs__quiesce(m);
  /* Prefetched or forward-held copies would go stale: drop them (every
   * rank does, so the next gathers stay the same everywhere). */
  if (local == ZS_OK) local = zs__prefetch_drain(m);
  if (local == ZS_OK) local = zs__check_none_gathered(m, "zs_model_init");
  if (local == ZS_OK && m->ctx->rank == 0 && fn == NULL)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_init: fn is NULL");
  /* The callback fills host memory (the user's code runs on the host),
   * broadcast from there; zs__store_params copies it to the device. */
  zs__device* dev = m->ctx->host;
  char* tmp = NULL;
  ZS_CHECK(zs__comm_agree(comm, local, "zs_model_init"));
  for (int ui = 0; ui < m->nunits; ui++) {
    zs__unit* u = &m->units[ui];
    const size_t P = u->layout.padded;
    local = zs__dev_alloc(dev, ZS_MEM_OTHER, P * u->elem, 1, "init buffer",
                          (void**)&tmp);
    for (int i = 0; i < u->ntensors && local == ZS_OK && m->ctx->rank == 0;
         i++) {
      int t = u->tensors[i];
      if (m->tensors[t].tied_to >= 0) continue;
      zs_tensor_desc desc;
      zs_model_tensor_desc(m, t, &desc);
      local = fn(user, t, &desc, zs__at(tmp, m->tensors[t].offset, u->elem));
      if (local != ZS_OK)
        local = zs__error(local, "init callback for tensor '%s' returned %s",
                          m->tensors[t].name, zs_status_string(local));
    }
    ZS_CHECK(zs__comm_agree(comm, local, "zs_model_init"));
    ZS_CHECK(zs__comm_broadcast(comm, zs__tag(ZS__P_INIT, ui, u->name), tmp, P,
                                u->dtype, 0));
    ZS_CHECK(zs__agree_store(m, zs__store_params(m, u, tmp, 0, P),
                             "zs_model_init"));
    zs__dev_free(dev, tmp);
    tmp = NULL;
  }
  ZS_CHECK(zs__agree_store(m, zs__param_flush(m), "zs_model_init"));
cleanup:
  zs__dev_free(dev, tmp);
  return st;
}

/* A unit's store failing on one rank (a device copy) leaves the others in
 * the next unit's agreement: zs__call_end tells them. */
/* Initialization is not training: before the first zs_step, the peaks
 * restart once it is done, so that they do not count its staging buffers
 * (memreport shows the part before the restart apart). */
static zs_status zs__init_done(zs_model* m, zs_status st) {
  if (st == ZS_OK && m->steps_called == 0)
    zs__accounting_reset_peak(m->ctx->acct);
  return st;
}

zs_status zs_model_init(zs_model* m, zs_init_fn fn, void* user) {
  zs__init_args args = {fn, user};
  return zs__init_done(m, zs__public_call(m, "zs_model_init", -1, 1,
                                          zs__model_init, &args));
}

zs_status zs_tensor_set(zs_model* m, int tensor, const void* data) {
  zs_status st = zs__check_finalized(m, "zs_tensor_set");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_tensor_set");
  if (st != ZS_OK) return st;
  zs_status local = ZS_OK;
  if (tensor < 0 || tensor >= m->ntensors)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_tensor_set: tensor %d does not exist", tensor);
  if (local == ZS_OK) local = zs__quiesce(m);
  if (local == ZS_OK) local = zs__prefetch_drain(m);
  if (local == ZS_OK) local = zs__check_none_gathered(m, "zs_tensor_set");
  if (local == ZS_OK && m->ctx->rank == 0 && data == NULL &&
      m->tensors[tensor].numel > 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_tensor_set: tensor '%s': data is NULL on rank 0",
                      m->tensors[tensor].name);
  zs__device* dev = m->ctx->host; /* the user's data, broadcast from host */
  char* tmp = NULL;
  ZS_CHECK(zs__comm_agree(m->ctx->comm, local, "zs_tensor_set"));
  const zs__tensor* t = &m->tensors[tensor];
  const int su = zs__storage_unit(m, tensor);
  zs__unit* u = &m->units[su];
  local = zs__dev_alloc(dev, ZS_MEM_OTHER, t->numel * u->elem, 0,
                        "tensor_set buffer", (void**)&tmp);
  if (local == ZS_OK && m->ctx->rank == 0)
    local = dev->ops->copy(dev, tmp, data, t->numel * u->elem, NULL);
  ZS_CHECK(zs__comm_agree(m->ctx->comm, local, "zs_tensor_set"));
  ZS_CHECK(zs__comm_broadcast(m->ctx->comm, zs__tag(ZS__P_SET, su, u->name),
                              tmp, t->numel, u->dtype, 0));
  ZS_CHECK(zs__agree_store(m, zs__store_params(m, u, tmp, t->offset, t->numel),
                           "zs_tensor_set"));
  ZS_CHECK(zs__agree_store(m, zs__param_flush(m), "zs_tensor_set"));
cleanup:
  zs__dev_free(dev, tmp);
  return zs__init_done(m, st);
}

static const char* zs__field_name(zs_field f) {
  switch (f) {
    case ZS_FIELD_PARAM: return "param";
    case ZS_FIELD_GRAD: return "grad";
    case ZS_FIELD_EXP_AVG: return "exp_avg";
    case ZS_FIELD_EXP_AVG_SQ: return "exp_avg_sq";
    case ZS_FIELD_MOMENTUM: return "momentum";
    case ZS_FIELD_MASTER: return "master";
    case ZS_FIELD_STATE_0: return "state 0";
    case ZS_FIELD_STATE_1: return "state 1";
    case ZS_FIELD_STATE_2: return "state 2";
    case ZS_FIELD_STATE_3: return "state 3";
  }
  return "unknown";
}

/* The one place that says which fields a tensor has: the field's dtype,
 * or ZS_DTYPE_COUNT with *why saying what is missing. */
static zs_dtype zs__field_dtype(const zs_model* m, const zs__tensor* owner,
                                const zs__unit* u, zs_field field,
                                const char** why) {
  const int frozen = (owner->flags & ZS_TENSOR_FROZEN) != 0;
  const int custom = m->optim_fn != NULL;
  const int adam = !custom && m->ctx->config.optimizer.kind != ZS_OPTIM_SGD;
  const int sgd = !custom && !adam;
  *why = "it is frozen";
  switch (field) {
    case ZS_FIELD_STATE_0:
    case ZS_FIELD_STATE_1:
    case ZS_FIELD_STATE_2:
    case ZS_FIELD_STATE_3:
      if (!frozen && (int)field - ZS_FIELD_STATE_0 >= u->nstates)
        *why = "its optimizer keeps fewer state buffers";
      return frozen || (int)field - ZS_FIELD_STATE_0 >= u->nstates
                 ? ZS_DTYPE_COUNT
                 : ZS_FLOAT32;
    case ZS_FIELD_PARAM:
      return u->dtype;
    case ZS_FIELD_GRAD:
      return frozen ? ZS_DTYPE_COUNT : u->gdtype;
    case ZS_FIELD_EXP_AVG:
    case ZS_FIELD_EXP_AVG_SQ:
      if (!frozen && !adam)
        *why = custom ? "the model's optimizer is a callback (read its "
                        "buffers as ZS_FIELD_STATE_k)"
                      : "SGD keeps no Adam moments";
      return frozen || !adam ? ZS_DTYPE_COUNT : ZS_FLOAT32;
    case ZS_FIELD_MOMENTUM:
      if (!frozen && adam) *why = "Adam/AdamW keep no momentum buffer";
      if (!frozen && sgd) *why = "SGD runs without momentum";
      if (!frozen && custom)
        *why = "the model's optimizer is a callback (read its buffers as "
               "ZS_FIELD_STATE_k)";
      return frozen || !sgd || u->nstates == 0 ? ZS_DTYPE_COUNT : ZS_FLOAT32;
    case ZS_FIELD_MASTER: {
      /* with NVMe offload a 16-bit unit's master weights are on disk */
      const int has = zs__unit_has_master(m, u);
      if (!frozen && !has)
        *why = "it is fp32 (its parameters are the master weights)";
      return frozen || !has ? ZS_DTYPE_COUNT : ZS_FLOAT32;
    }
  }
  *why = "unknown field";
  return ZS_DTYPE_COUNT;
}

/* Parameter shards on NVMe: a copy of the unit's shard in *tmp (malloc'ed,
 * the caller frees), so that no buffer stays pinned meanwhile. */
static zs_status zs__param_shard_copy(zs_model* m, zs__unit* u, void** out,
                                      float** tmp) {
  const size_t bytes = u->layout.shard * u->elem;
  zs_status st = zs__param_acquire(m, u);
  if (st != ZS_OK) return st;
  *tmp = (float*)malloc(bytes > 0 ? bytes : 1);
  if (*tmp == NULL) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_tensor_get: %zu bytes", bytes);
  } else {
    memcpy(*tmp, u->params_shard, bytes);
    *out = *tmp;
  }
  zs__param_release(m, u);
  return st;
}

/* This rank's shard of the buffer behind `field` and its dtype, or an
 * error naming why the tensor has no such field. */
static zs_status zs__field_shard(zs_model* m, const zs__tensor* t,
                                 const zs__tensor* owner, zs__unit* u,
                                 zs_field field, void** out, zs_dtype* dtype,
                                 float** tmp) {
  const char* why = NULL;
  *dtype = zs__field_dtype(m, owner, u, field, &why);
  if (*dtype == ZS_DTYPE_COUNT)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_tensor_get: tensor '%s'%s%s%s has no field '%s' (%d): "
                     "%s", t->name, t != owner ? " (tied to '" : "",
                     t != owner ? owner->name : "", t != owner ? "')" : "",
                     zs__field_name(field), (int)field, why);
  switch (field) {
    case ZS_FIELD_PARAM:
      if (m->nvme_params != NULL) return zs__param_shard_copy(m, u, out, tmp);
      *out = zs__param_shard_ptr(m, u);
      break;
    case ZS_FIELD_GRAD:
      *out = zs__grad_shard_ptr(m, u);
      break;
    case ZS_FIELD_EXP_AVG:
    case ZS_FIELD_MOMENTUM:
    case ZS_FIELD_EXP_AVG_SQ:
    case ZS_FIELD_STATE_0:
    case ZS_FIELD_STATE_1:
    case ZS_FIELD_STATE_2:
    case ZS_FIELD_STATE_3:
    case ZS_FIELD_MASTER:
      if (m->nvme != NULL)
        return zs__nvme_shard(m, u,
                              field == ZS_FIELD_MASTER ? -1
                              : field == ZS_FIELD_EXP_AVG_SQ ? 1
                              : field >= ZS_FIELD_STATE_0
                                  ? (int)field - ZS_FIELD_STATE_0
                                  : 0,
                              (char**)out, tmp);
      break;
  }
  switch (field) {
    case ZS_FIELD_EXP_AVG:
    case ZS_FIELD_MOMENTUM:
      *out = zs__state_shard_ptr(m, u, 0);
      break;
    case ZS_FIELD_EXP_AVG_SQ:
      *out = zs__state_shard_ptr(m, u, 1);
      break;
    case ZS_FIELD_STATE_0:
    case ZS_FIELD_STATE_1:
    case ZS_FIELD_STATE_2:
    case ZS_FIELD_STATE_3:
      *out = zs__state_shard_ptr(m, u, (int)field - ZS_FIELD_STATE_0);
      break;
    case ZS_FIELD_MASTER: {
      zs_status st = zs__master_refresh(m, u);
      if (st != ZS_OK) return st;
      *out = zs__master_shard_ptr(m, u);
      break;
    }
    default:
      break;
  }
  return ZS_OK;
}

zs_dtype zs_tensor_field_dtype(const zs_model* m, int tensor, zs_field field) {
  if (m == NULL || !m->finalized || tensor < 0 || tensor >= m->ntensors)
    return ZS_DTYPE_COUNT;
  const zs__tensor* t = &m->tensors[tensor];
  const zs__tensor* owner = t->tied_to >= 0 ? &m->tensors[t->tied_to] : t;
  const char* why = NULL;
  return zs__field_dtype(m, owner, &m->units[zs__storage_unit(m, tensor)],
                         field, &why);
}

zs_status zs_tensor_get(zs_model* m, int tensor, zs_field field, void* out) {
  zs_status st = zs__check_finalized(m, "zs_tensor_get");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_tensor_get");
  if (st != ZS_OK) return st;
  zs_status local = zs__quiesce(m);
  void* shard = NULL;
  float* nvme_tmp = NULL; /* NVMe offload: the field read back */
  zs_dtype dtype = ZS_FLOAT32;
  if (local != ZS_OK) {
    /* the message is set */
  } else if (tensor < 0 || tensor >= m->ntensors) {
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_tensor_get: tensor %d does not exist", tensor);
  } else if (out == NULL && m->tensors[tensor].numel > 0) {
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_tensor_get: tensor '%s': out is NULL",
                      m->tensors[tensor].name);
  } else {
    const zs__tensor* t = &m->tensors[tensor];
    const zs__tensor* owner = t->tied_to >= 0 ? &m->tensors[t->tied_to] : t;
    local = zs__field_shard(m, t, owner, &m->units[zs__storage_unit(m, tensor)],
                            field, &shard, &dtype, &nvme_tmp);
  }
  zs__device* dev = m->ctx->device;
  char* full = NULL;
  void* staged = NULL; /* the shard's device copy, when it is in host memory */
  if (local == ZS_OK) {
    zs__unit* u = &m->units[zs__storage_unit(m, tensor)];
    /* host memory: offloaded parameter shards, master weights and states
     * (NVMe's read back into a malloc'ed copy); NCCL reads device memory */
    const int on_host =
        nvme_tmp != NULL ||
        (field == ZS_FIELD_PARAM
             ? zs__tier_in_host(u->policy.params_tier)
             : field != ZS_FIELD_GRAD && zs__tier_in_host(u->policy.state_tier));
    const void* use = shard;
    /* a complete copy: nvme_tmp is freed on every path, also when the
     * agreement below fails before the all-gather */
    if (on_host)
      local = zs__coll_source(m, shard, u->layout.shard * zs_dtype_size(dtype),
                              "tensor_get shard", 1, &staged, &use);
    shard = (void*)use;
    if (local == ZS_OK)
      local = zs__dev_alloc(dev, ZS_MEM_OTHER,
                            u->layout.padded * zs_dtype_size(dtype), 0,
                            "tensor_get buffer", (void**)&full);
  }
  ZS_CHECK(zs__comm_agree(m->ctx->comm, local, "zs_tensor_get"));
  const zs__tensor* t = &m->tensors[tensor];
  const int su = zs__storage_unit(m, tensor);
  zs__unit* u = &m->units[su];
  const size_t elem = zs_dtype_size(dtype);
  ZS_CHECK(zs__comm_all_gather(m->ctx->shard_comm, zs__tag(ZS__P_GET, su, u->name),
                               shard, full, u->layout.shard, dtype));
  ZS_CHECK(dev->ops->copy(dev, out, zs__at(full, t->offset, elem),
                          t->numel * elem, NULL));
cleanup:
  zs__dev_free(dev, full);
  zs__dev_free(dev, staged);
  free(nvme_tmp);
  return st;
}

/* ---- Stacked kinds: the whole kind through its slices ---- */

static zs_status zs__kind_check(zs_model* m, int kind, const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(kind >= 0 && kind < m->nkinds, "%s: kind %d does not exist (%d "
             "kinds)", fn, kind, m->nkinds);
  const zs__kind* kd = &m->kinds[kind];
  for (int l = 0; l < kd->shape[0]; l++)
    ZS_REQUIRE(kd->slices[l] >= 0, "%s: kind '%s' layer %d has no slice "
               "(zs_model_add_slice)", fn, kd->name, l);
  return ZS_OK;
}

zs_status zs_kind_set(zs_model* m, int kind, const void* data) {
  zs_status st = zs__kind_check(m, kind, "zs_kind_set");
  if (st != ZS_OK) return st;
  const zs__kind* kd = &m->kinds[kind];
  const size_t elem = zs_dtype_size(kd->dtype);
  const int root = m->ctx->rank == 0;
  for (int l = 0; l < kd->shape[0] && st == ZS_OK; l++) {
    const zs__tensor* t = &m->tensors[kd->slices[l]];
    st = zs_tensor_set(m, kd->slices[l],
                       root && data != NULL
                           ? (const char*)data + t->kind_offset * elem
                           : NULL);
  }
  return st;
}

zs_status zs_kind_get(zs_model* m, int kind, zs_field field, void* out) {
  zs_status st = zs__kind_check(m, kind, "zs_kind_get");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(out != NULL, "zs_kind_get: out is NULL");
  const zs__kind* kd = &m->kinds[kind];
  for (int l = 0; l < kd->shape[0] && st == ZS_OK; l++) {
    const int t = kd->slices[l];
    const size_t elem = zs_dtype_size(zs_tensor_field_dtype(m, t, field));
    st = zs_tensor_get(m, t, field,
                       (char*)out + m->tensors[t].kind_offset * elem);
  }
  return st;
}
