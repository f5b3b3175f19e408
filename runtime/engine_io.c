/*
 * engine_io.c — moving whole tensors in and out of the sharded storage:
 * initialization from a rank-0 callback or array (broadcast), and reading
 * any field back (all-gather of the owning unit's shards).
 */
#include <stdio.h>
#include <string.h>

#include "runtime/engine.h"

/* A status and its message, broadcast from rank 0 so that a failure there
 * (a callback, a NULL array) ends the call on every rank. */
typedef struct zs__root_status {
  int64_t status;
  char msg[504];
} zs__root_status;

static zs_status zs__share_root_status(zs_model* m, zs_status local,
                                       const char* what) {
  zs__root_status rs;
  memset(&rs, 0, sizeof rs);
  rs.status = local;
  if (local != ZS_OK) snprintf(rs.msg, sizeof rs.msg, "%s", zs_last_error());
  zs_status st =
      zs__comm_broadcast(m->ctx->comm, &rs, sizeof rs, ZS_UINT8, 0);
  if (st != ZS_OK) return st;
  if (rs.status == ZS_OK) return ZS_OK;
  if (m->ctx->rank == 0) return (zs_status)rs.status; /* message is set */
  return zs__error(ZS_ERR_REMOTE, "%s failed on rank 0: %s", what, rs.msg);
}

/* Refuses while a unit is gathered: at stage 3 its gathered copy would go
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
  if (m->ctx->config.stage <= 2)
    return dev->ops->copy(dev, zs__at(u->params_full, begin, u->elem),
                          full, n * u->elem, NULL);
  size_t s0 = zs__layout_shard_begin(&u->layout, m->ctx->rank);
  size_t s1 = s0 + u->layout.shard;
  size_t lo = begin > s0 ? begin : s0, hi = begin + n < s1 ? begin + n : s1;
  if (lo >= hi) return ZS_OK;
  return dev->ops->copy(dev, zs__at(u->params_shard, lo - s0, u->elem),
                        full + (lo - begin) * u->elem, (hi - lo) * u->elem,
                        NULL);
}

zs_status zs_model_init(zs_model* m, zs_init_fn fn, void* user) {
  zs_status st = zs__check_finalized(m, "zs_model_init");
  if (st == ZS_OK) st = zs__check_none_gathered(m, "zs_model_init");
  if (st != ZS_OK) return st;
  zs__device* dev = m->ctx->device;
  char* tmp = NULL;
  for (int ui = 0; ui < m->nunits; ui++) {
    zs__unit* u = &m->units[ui];
    const size_t P = u->layout.padded;
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_OTHER, P * u->elem, 1, "init buffer",
                           (void**)&tmp));
    zs_status local = ZS_OK;
    if (m->ctx->rank == 0 && fn == NULL)
      local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_init: fn is NULL");
    for (int i = 0; i < u->ntensors && local == ZS_OK && m->ctx->rank == 0;
         i++) {
      int t = u->tensors[i];
      if (m->tensors[t].tied_to >= 0) continue;
      zs_tensor_desc desc;
      zs_model_tensor_desc(m, t, &desc);
      local = fn(user, t, &desc, zs__at(tmp, m->tensors[t].offset, u->elem));
      if (local != ZS_OK)
        local = zs__error_prefix(local, "init callback for tensor '%s': ",
                                 m->tensors[t].name);
    }
    ZS_CHECK(zs__share_root_status(m, local, "zs_model_init"));
    ZS_CHECK(zs__comm_broadcast(m->ctx->comm, tmp, P, u->dtype, 0));
    ZS_CHECK(zs__store_params(m, u, tmp, 0, P));
    zs__dev_free(dev, tmp);
    tmp = NULL;
  }
cleanup:
  zs__dev_free(dev, tmp);
  return st;
}

zs_status zs_tensor_set(zs_model* m, int tensor, const void* data) {
  zs_status st = zs__check_finalized(m, "zs_tensor_set");
  if (st == ZS_OK && (tensor < 0 || tensor >= m->ntensors))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_tensor_set: tensor %d does not exist", tensor);
  if (st == ZS_OK) st = zs__check_none_gathered(m, "zs_tensor_set");
  if (st != ZS_OK) return st;
  zs__device* dev = m->ctx->device;
  const zs__tensor* t = &m->tensors[tensor];
  zs__unit* u = &m->units[zs__storage_unit(m, tensor)];
  char* tmp = NULL;
  zs_status local = ZS_OK;
  if (m->ctx->rank == 0 && data == NULL && t->numel > 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_tensor_set: tensor '%s': data is NULL on rank 0",
                      t->name);
  ZS_CHECK(zs__share_root_status(m, local, "zs_tensor_set"));
  ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_OTHER, t->numel * u->elem, 0,
                         "tensor_set buffer", (void**)&tmp));
  if (m->ctx->rank == 0)
    ZS_CHECK(dev->ops->copy(dev, tmp, data, t->numel * u->elem, NULL));
  ZS_CHECK(zs__comm_broadcast(m->ctx->comm, tmp, t->numel, u->dtype, 0));
  ZS_CHECK(zs__store_params(m, u, tmp, t->offset, t->numel));
cleanup:
  zs__dev_free(dev, tmp);
  return st;
}

/* This rank's shard of the buffer behind `field`, or an error naming why
 * the tensor has no such field. */
static zs_status zs__field_shard(zs_model* m, const zs__tensor* t, zs__unit* u,
                                 zs_field field, void** out) {
  const zs_optimizer_config* o = &m->ctx->config.optimizer;
  int frozen = (t->flags & ZS_TENSOR_FROZEN) != 0;
  int adam = o->kind != ZS_OPTIM_SGD;
  switch (field) {
    case ZS_FIELD_PARAM:
      *out = zs__param_shard_ptr(m, u);
      return ZS_OK;
    case ZS_FIELD_GRAD:
      if (frozen) break;
      *out = zs__grad_shard_ptr(m, u);
      return ZS_OK;
    case ZS_FIELD_EXP_AVG:
    case ZS_FIELD_EXP_AVG_SQ:
      if (frozen || !adam) break;
      *out = zs__state_shard_ptr(m, u, field == ZS_FIELD_EXP_AVG ? 0 : 1);
      return ZS_OK;
    case ZS_FIELD_MOMENTUM:
      if (frozen || adam || u->nstates == 0) break;
      *out = zs__state_shard_ptr(m, u, 0);
      return ZS_OK;
  }
  return zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_tensor_get: tensor '%s' has no field %d (frozen, or "
                   "not kept by this optimizer)", t->name, (int)field);
}

zs_status zs_tensor_get(zs_model* m, int tensor, zs_field field, void* out) {
  zs_status st = zs__check_finalized(m, "zs_tensor_get");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(tensor >= 0 && tensor < m->ntensors,
             "zs_tensor_get: tensor %d does not exist", tensor);
  const zs__tensor* t = &m->tensors[tensor];
  ZS_REQUIRE(out != NULL || t->numel == 0,
             "zs_tensor_get: tensor '%s': out is NULL", t->name);
  zs__unit* u = &m->units[zs__storage_unit(m, tensor)];
  const zs__tensor* owner = t->tied_to >= 0 ? &m->tensors[t->tied_to] : t;
  void* shard = NULL;
  st = zs__field_shard(m, owner, u, field, &shard);
  if (st != ZS_OK) return st;
  zs__device* dev = m->ctx->device;
  char* full = NULL;
  ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_OTHER, u->layout.padded * u->elem, 0,
                         "tensor_get buffer", (void**)&full));
  ZS_CHECK(zs__comm_all_gather(m->ctx->comm, shard, full, u->layout.shard,
                               u->dtype));
  ZS_CHECK(dev->ops->copy(dev, out, zs__at(full, t->offset, u->elem),
                          t->numel * u->elem, NULL));
cleanup:
  zs__dev_free(dev, full);
  return st;
}
