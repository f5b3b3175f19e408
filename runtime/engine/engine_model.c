/*
 * engine_model.c — a model's registration (units, tensors, ties, groups,
 * use counts), finalize (the cross-rank check, the layout of every unit
 * and its storage per stage), destroy, and the queries of its units and
 * tensors.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/offload.h"
#include "runtime/engine/engine_model.h"
#include "runtime/engine/engine_nvme_io.h"
#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"
#include "runtime/engine/engine_optim_nvme.h"
#include "runtime/engine/engine_unit.h"
#include "runtime/engine/engine_view.h"
#include "runtime/core/core_compat.h"

/* Records the first registration error so that finalize fails on every rank
 * (naming this rank) instead of leaving the others waiting. */
static zs_status zs__poison(zs_model* m, zs_status st) {
  if (m != NULL && !m->poisoned) {
    m->poisoned = 1;
    snprintf(m->poison_msg, sizeof m->poison_msg, "%s", zs__error_body());
  }
  return st;
}

static zs_status zs__check_open(zs_model* m, const char* fn) {
  ZS_REQUIRE(m != NULL, "%s: model is NULL", fn);
  if (m->ctx == NULL)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "%s: the model's context was destroyed", fn);
  if (m->finalized)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "%s: the model is finalized; register everything before "
                     "zs_model_finalize", fn);
  return ZS_OK;
}

static zs_status zs__check_name(const zs_model* m, const char* name,
                                const char* what, int is_unit) {
  ZS_REQUIRE(name != NULL && name[0] != '\0', "%s name is NULL or empty",
             what);
  ZS_REQUIRE(strlen(name) < ZS_NAME_MAX, "%s name '%.40s...' is longer than "
             "%d bytes", what, name, ZS_NAME_MAX - 1);
  ZS_REQUIRE(strchr(name, '\n') == NULL, "%s name '%s' contains a newline",
             what, name);
  if (is_unit) {
    for (int i = 0; i < m->nunits; i++)
      ZS_REQUIRE(strcmp(m->units[i].name, name) != 0,
                 "unit name '%s' is already registered (unit %d)", name, i);
  } else {
    for (int i = 0; i < m->ntensors; i++)
      ZS_REQUIRE(strcmp(m->tensors[i].name, name) != 0,
                 "tensor name '%s' is already registered (tensor %d in unit "
                 "'%s')", name, i, m->units[m->tensors[i].unit].name);
  }
  return ZS_OK;
}

/* Grows *arr (elements of size `size`) to hold at least need entries. */
static zs_status zs__reserve(void** arr, int* cap, int need, size_t size) {
  if (need <= *cap) return ZS_OK;
  int ncap = *cap == 0 ? 8 : *cap * 2;
  while (ncap < need) ncap *= 2;
  void* p = realloc(*arr, (size_t)ncap * size);
  if (p == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "registration: realloc");
  memset((char*)p + (size_t)*cap * size, 0, (size_t)(ncap - *cap) * size);
  *arr = p;
  *cap = ncap;
  return ZS_OK;
}

zs_status zs_model_create(zs_context* ctx, zs_model** out) {
  ZS_REQUIRE(ctx != NULL && out != NULL,
             "zs_model_create: ctx and out must not be NULL");
  zs_model* m = (zs_model*)calloc(1, sizeof *m);
  if (m == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_model_create");
  m->ctx = ctx;
  m->group_lr = (double*)malloc(sizeof(double));
  m->group_wd = (double*)malloc(sizeof(double));
  if (m->group_lr == NULL || m->group_wd == NULL) {
    zs_model_destroy(m);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_model_create");
  }
  m->group_lr[0] = ctx->config.optimizer.lr;
  m->group_wd[0] = ctx->config.optimizer.weight_decay;
  m->ngroups = 1;
  const zs_optimizer_kind k = ctx->config.optimizer.kind;
  snprintf(m->optim_name, sizeof m->optim_name, "%s",
           k == ZS_OPTIM_SGD ? "sgd" : k == ZS_OPTIM_ADAM ? "adam" : "adamw");
  const zs_loss_scaler_config* ls = &ctx->config.loss_scaler;
  m->loss_scale = ls->mode == ZS_LOSS_SCALE_NONE ? 1.0 : ls->init_scale;
  m->scale_hysteresis = ls->hysteresis;
  m->persistence_threshold = ctx->config.param_persistence_threshold;
  m->dirty_epoch_seen = zs__dirty_epoch(ctx);
  m->next = ctx->engine->models;
  ctx->engine->models = m;
  *out = m;
  return ZS_OK;
}

/* ==== The engine's state of a context ==================================== */

/* The context's hook: models left alive are detached (their storage freed;
 * zs_model_destroy releases the rest later), then NVMe offload's queue and
 * swap directory go. */
static void zs__engine_context_destroy(void* arg) {
  zs_context* ctx = (zs_context*)arg;
  zs__engine_ctx* e = ctx->engine;
  if (e->models != NULL)
    zs__log(ZS_LOG_WARN,
            "zs_context_destroy: model(s) still alive; their storage is freed "
            "now and zs_model_destroy only releases what remains (destroy "
            "models before their context)");
  while (e->models != NULL) zs__model_detach(e->models);
  zs__nvme_destroy(e->nvme);
  free(e);
  ctx->engine = NULL;
}

static void zs__engine_context_remove_files(void* arg) {
  const zs_context* ctx = (const zs_context*)arg;
  zs__nvme_remove_files(ctx->engine->nvme);
}

static zs_status zs__engine_context_init(zs_context* ctx) {
  zs__engine_ctx* e = (zs__engine_ctx*)calloc(1, sizeof *e);
  if (e == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "context: engine state");
  ctx->engine = e;
  zs_status st = zs__hook_add(&ctx->hooks, zs__engine_context_destroy,
                              zs__engine_context_remove_files, ctx, NULL);
  if (st != ZS_OK) {
    free(e);
    ctx->engine = NULL;
    return st;
  }
  /* NVMe offload: the I/O queue and this rank's swap directory, agreed
   * (an unwritable path on one rank fails every rank) */
  const zs_config* c = &ctx->config;
  if (c->offload_optimizer.device == 2 || c->offload_param == 2) {
    zs_status local = zs__nvme_create(ctx, &e->nvme);
    st = zs__comm_agree(ctx->comm, local, "NVMe offload");
  }
  return st; /* the hook tears down what was made */
}

zs_status zs__engine_context_create(const zs_config* config, zs__comm* comm,
                                    zs_context** out) {
  zs_context* ctx = NULL;
  zs_status st = zs__context_create(config, comm, &ctx);
  if (st != ZS_OK) return st;
  st = zs__engine_context_init(ctx);
  if (st != ZS_OK) {
    zs_context_destroy(ctx);
    return st;
  }
  *out = ctx;
  return ZS_OK;
}

zs_status zs_offload_info_get(const zs_context* ctx, zs_offload_info* user) {
  ZS_REQUIRE(ctx != NULL && user != NULL,
             "zs_offload_info_get: ctx and out must not be NULL");
  size_t size = 0;
  zs_status st = zs__out_size(ZS__OUT_OFFLOAD_INFO, ctx->caller_version, user,
                              "zs_offload_info_get", &size);
  if (st != ZS_OK) return st;
  zs_offload_info full, *out = &full;
  zs__offload_info(ctx->offload, out);
  const zs__engine_ctx* e = ctx->engine;
  if (e != NULL && e->nvme != NULL) {
    out->nvme = 1;
    out->nvme_aio = zs__nvme_aio_name(e->nvme);
    for (const zs_model* m = e->models; m != NULL; m = m->next) {
      out->nvme_file_bytes += zs__nvme_file_bytes(m) + zs__nvme_param_file_bytes(m);
      zs__nvme_param_counts(m, &out->nvme_param_reads,
                            &out->nvme_param_reads_ahead);
    }
  }
  zs__out_write(ZS__OUT_OFFLOAD_INFO, ctx->caller_version, out, user, size);
  return ZS_OK;
}


/* Frees what zs__alloc_unit allocated, from the same policy: each field
 * goes back to the tier it came from. */
static void zs__tier_free(zs_model* m, zs__tier tier, void* p) {
  if (tier == ZS__TIER_HOST) zs__offload_host_free(m, p);
  else if (tier == ZS__TIER_DEVICE) zs__dev_free(m->ctx->device, p);
  /* NVMe: the swap file's pinned buffers are the pool's (engine_optim_nvme.c,
   * engine_nvme_param.c), not the unit's */
}

static void zs__unit_free_storage(zs_model* m, zs__unit* u) {
  zs__device* dev = m->ctx->device;
  const zs__policy* pol = &u->policy;
  zs__grad_drop(m, u);
  for (int k = 0; k < ZS_OPTIM_MAX_STATES; k++) {
    zs__tier_free(m, pol->state_tier, u->state[k]);
    u->state[k] = NULL;
  }
  zs__tier_free(m, pol->master_tier, u->master);
  zs__dev_free(dev, u->grads_shard);
  zs__dev_free(dev, u->grads_full);
  zs__tier_free(m, pol->params_tier, u->params_shard);
  /* (stage 3: a gathered buffer, PARAMS_GATHERED, left by a failed step) */
  zs__dev_free(dev, u->params_full);
  zs__dev_free(dev, u->gather_src);
  u->master = NULL;
  u->grads_shard = u->grads_full = u->params_shard = u->params_full = NULL;
  u->gather_src = NULL;
}

void zs__model_detach(zs_model* m) {
  if (m->ctx == NULL) return;
  /* Nothing may be freed under a collective still writing into it. */
  if (m->finalized && !m->ctx->comm->failed) (void)zs__quiesce(m);
  /* ... nor a host buffer under a queued upload (a gather of an offloaded
   * shard whose collective failed, so was not waited for): the compute
   * stream waits for no collective, so this returns */
  zs__device* dev = m->ctx->device;
  if (dev != m->ctx->host) (void)dev->ops->stream_sync(dev, NULL);
  for (int i = 0; i < m->nunits; i++)
    zs__unit_free_storage(m, &m->units[i]);
  zs__staging_free(m);
  zs__nvme_model_free(m);
  zs__nvme_param_free(m);
  zs__views_destroy(m);
  for (zs_model** p = &m->ctx->engine->models; *p != NULL; p = &(*p)->next)
    if (*p == m) {
      *p = m->next;
      break;
    }
  m->ctx = NULL;
  m->next = NULL;
}

void zs_model_destroy(zs_model* m) {
  if (m == NULL) return;
  /* drivers destroyed after their model (a misuse) are left detached:
   * their buffers freed now, their later calls refused */
  zs__hooks_run(&m->hooks);
  zs__model_detach(m);
  for (int i = 0; i < m->nunits; i++) {
    zs__unit* u = &m->units[i];
    free(u->tensors);
    free(u->owners);
    free(u->opt_pieces);
    free(u->norm_pieces);
    free(u->gather_ops.ops);
    free(u->red_ops.ops);
    free(u->shard_ops.ops);
  }
  free(m->trace);
  free(m->seen);
  free(m->reducing);
  for (int k = 0; k < m->nkinds; k++) free(m->kinds[k].slices);
  free(m->kinds);
  free(m->units);
  free(m->tensors);
  free(m->group_lr);
  free(m->group_wd);
  free(m->rank_blob);
  free(m);
}

zs_status zs_model_add_unit(zs_model* m, const char* name, int* unit) {
  zs_status st = zs__check_open(m, "zs_model_add_unit");
  if (st == ZS_OK) st = zs__check_name(m, name, "unit", 1);
  if (st == ZS_OK && unit == NULL)
    st = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_add_unit: unit is NULL");
  if (st == ZS_OK)
    st = zs__reserve((void**)&m->units, &m->units_cap, m->nunits + 1,
                     sizeof *m->units);
  if (st != ZS_OK) return zs__poison(m, st);
  zs__unit* u = &m->units[m->nunits];
  memset(u, 0, sizeof *u);
  snprintf(u->name, sizeof u->name, "%s", name);
  u->dtype = ZS_DTYPE_COUNT; /* set by the first tensor */
  *unit = m->nunits++;
  return ZS_OK;
}

/* Appends tensor id t to unit u's list. */
zs_status zs_model_add_units(zs_model* m, const char* prefix, int count,
                             int* units) {
  zs_status st = zs__check_open(m, "zs_model_add_units");
  if (st != ZS_OK) return st;
  if (count < 0 || (count > 0 && units == NULL) || prefix == NULL || !prefix[0] ||
      strlen(prefix) >= ZS_NAME_MAX - 12)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_units: count %d must be >= 0, units not NULL and the "
        "prefix 1 to %d bytes", count, ZS_NAME_MAX - 13));
  for (int i = 0; i < count; i++) {
    char name[ZS_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.%d", prefix, i);
    st = zs_model_add_unit(m, name, &units[i]);
    if (st != ZS_OK) return st; /* poisoned there */
  }
  return ZS_OK;
}

static zs_status zs__unit_append(zs__unit* u, int t, int* slot) {
  zs_status st = zs__reserve((void**)&u->tensors, &u->cap, u->ntensors + 1,
                             sizeof *u->tensors);
  if (st != ZS_OK) return st;
  *slot = u->ntensors;
  u->tensors[u->ntensors++] = t;
  return ZS_OK;
}

static zs_status zs__validate_tensor(zs_model* m, int unit, const char* name,
                                     int ndim, const int64_t* shape,
                                     zs_dtype dtype, unsigned int flags,
                                     size_t* numel) {
  zs_status st = zs__check_open(m, "zs_model_add_tensor");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "zs_model_add_tensor '%s': unit %d does not exist (%d units)",
             name != NULL ? name : "(null)", unit, m->nunits);
  st = zs__check_name(m, name, "tensor", 0);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(ndim >= 0 && ndim <= ZS_MAX_DIMS,
             "tensor '%s': ndim %d out of range 0..%d", name, ndim,
             ZS_MAX_DIMS);
  ZS_REQUIRE(ndim == 0 || shape != NULL, "tensor '%s': shape is NULL", name);
  ZS_REQUIRE((flags & ~ZS_TENSOR_FROZEN) == 0,
             "tensor '%s': unknown flags 0x%x", name, flags);
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    ZS_REQUIRE(shape[d] >= 0, "tensor '%s': shape[%d] = %lld is negative",
               name, d, (long long)shape[d]);
    if (shape[d] != 0 && n > SIZE_MAX / 8 / (size_t)shape[d])
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "tensor '%s': element count overflows", name);
    n *= (size_t)shape[d];
  }
  ZS_REQUIRE(dtype == ZS_FLOAT32 || dtype == ZS_BFLOAT16 ||
                 dtype == ZS_FLOAT16,
             "tensor '%s': dtype %d is not a parameter type (use ZS_FLOAT32, "
             "ZS_BFLOAT16 or ZS_FLOAT16)", name, (int)dtype);
  const zs__unit* u = &m->units[unit];
  ZS_REQUIRE(u->dtype == ZS_DTYPE_COUNT || u->dtype == dtype,
             "tensor '%s': dtype %s differs from unit '%s' (%s); a unit is "
             "one flat buffer of one dtype", name, zs_dtype_name(dtype),
             u->name, zs_dtype_name(u->dtype));
  *numel = n;
  return ZS_OK;
}

zs_status zs_model_add_tensor(zs_model* m, int unit, const char* name,
                              int ndim, const int64_t* shape, zs_dtype dtype,
                              unsigned int flags, int* tensor) {
  size_t numel = 0;
  zs_status st =
      zs__validate_tensor(m, unit, name, ndim, shape, dtype, flags, &numel);
  if (st == ZS_OK && tensor == NULL)
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_add_tensor '%s': tensor is NULL", name);
  if (st == ZS_OK)
    st = zs__reserve((void**)&m->tensors, &m->tensors_cap, m->ntensors + 1,
                     sizeof *m->tensors);
  int slot = 0;
  if (st == ZS_OK) st = zs__unit_append(&m->units[unit], m->ntensors, &slot);
  if (st != ZS_OK) return zs__poison(m, st);
  zs__tensor* t = &m->tensors[m->ntensors];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->unit = unit;
  t->slot = slot;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->numel = numel;
  t->dtype = dtype;
  t->flags = flags;
  t->tied_to = -1;
  t->kind = -1;
  t->layer = -1;
  m->units[unit].dtype = dtype;
  *tensor = m->ntensors++;
  return ZS_OK;
}

zs_status zs_model_add_tied_tensor(zs_model* m, int unit, const char* name,
                                   int owner, int* tensor) {
  zs_status st = zs__check_open(m, "zs_model_add_tied_tensor");
  if (st == ZS_OK && tensor == NULL)
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_add_tied_tensor: tensor is NULL");
  if (st == ZS_OK && (owner < 0 || owner >= m->ntensors))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "tied tensor '%s': owner %d does not exist (%d tensors)",
                   name != NULL ? name : "(null)", owner, m->ntensors);
  if (st == ZS_OK && m->tensors[owner].tied_to >= 0)
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "tied tensor '%s': owner '%s' is itself tied; tie to '%s'",
                   name != NULL ? name : "(null)", m->tensors[owner].name,
                   m->tensors[m->tensors[owner].tied_to].name);
  if (st != ZS_OK) return zs__poison(m, st);
  const zs__tensor* o = &m->tensors[owner];
  int64_t shape[ZS_MAX_DIMS];
  memcpy(shape, o->shape, sizeof shape);
  int id = -1;
  /* Validation and storage as an ordinary tensor, then mark it an alias. A
   * tie may cross units of different dtypes only if equal: checked here. */
  st = zs_model_add_tensor(m, unit, name, o->ndim, shape, o->dtype, o->flags,
                           &id);
  if (st != ZS_OK) return st;
  m->tensors[id].tied_to = owner;
  *tensor = id;
  return ZS_OK;
}

/* zs__check_open, and `unit` one of the model's (else the model is
 * poisoned: a per-unit setting missing on one rank must fail finalize). */
static zs_status zs__check_open_unit(zs_model* m, int unit, const char* fn) {
  zs_status st = zs__check_open(m, fn);
  if (st != ZS_OK) return st;
  if (unit < 0 || unit >= m->nunits)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "%s: unit %d does not exist (%d units)", fn, unit, m->nunits));
  return ZS_OK;
}

zs_status zs_unit_set_strategy(zs_model* m, int unit,
                               zs_unit_strategy strategy) {
  zs_status st = zs__check_open_unit(m, unit, "zs_unit_set_strategy");
  if (st != ZS_OK) return st;
  if (strategy != ZS_UNIT_DEFAULT && strategy != ZS_UNIT_SHARDED &&
      strategy != ZS_UNIT_REPLICATED)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_unit_set_strategy: unit '%s': strategy %d is not "
        "ZS_UNIT_DEFAULT, _SHARDED or _REPLICATED", m->units[unit].name,
        (int)strategy));
  m->units[unit].strategy = (int)strategy;
  return ZS_OK;
}

zs_status zs_model_set_persistence_threshold(zs_model* m, size_t elements) {
  zs_status st = zs__check_open(m, "zs_model_set_persistence_threshold");
  if (st != ZS_OK) return st;
  m->persistence_threshold = elements;
  return ZS_OK;
}

zs_status zs_unit_allow_unused(zs_model* m, int unit) {
  zs_status st = zs__check_open_unit(m, unit, "zs_unit_allow_unused");
  if (st != ZS_OK) return st;
  m->units[unit].allow_unused = 1;
  return ZS_OK;
}

int zs_unit_replicated(const zs_model* m, int unit) {
  if (m == NULL || !m->finalized || unit < 0 || unit >= m->nunits) return -1;
  return m->units[unit].replicated;
}

zs_status zs_model_set_optimizer(zs_model* m, const char* name, int nstates,
                                 zs_optimizer_fn fn, void* user) {
  zs_status st = zs__check_open(m, "zs_model_set_optimizer");
  if (st != ZS_OK) return st;
  if (fn == NULL)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_set_optimizer: fn is NULL"));
  if (nstates < 1 || nstates > ZS_OPTIM_MAX_STATES)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_set_optimizer '%s': nstates %d is not 1..%d (fp32 state "
        "buffers per element; a rule without state can ignore its one)",
        name != NULL ? name : "(null)", nstates, ZS_OPTIM_MAX_STATES));
  if (name == NULL || name[0] == '\0' || strlen(name) >= sizeof m->optim_name ||
      strpbrk(name, "\"\\\n") != NULL)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_set_optimizer: name must be 1 to %d bytes without quotes, "
        "backslashes or newlines", (int)sizeof m->optim_name - 1));
  if (strcmp(name, "adamw") == 0 || strcmp(name, "adam") == 0 ||
      strcmp(name, "sgd") == 0)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_set_optimizer: '%s' is a built-in optimizer's name (its "
        "checkpoints would load into yours); name yours otherwise", name));
  m->optim_fn = fn;
  m->optim_user = user;
  m->optim_nstates = nstates;
  snprintf(m->optim_name, sizeof m->optim_name, "%s", name);
  return ZS_OK;
}

double zs_model_lr(const zs_model* m, int group) {
  if (m == NULL || !m->finalized || group < 0 || group >= m->ngroups)
    return -1.0;
  return m->group_lr[group];
}

int64_t zs_model_step_count(const zs_model* m, int group) {
  if (m == NULL || !m->finalized || group < 0 || group >= m->ngroups)
    return -1;
  for (int i = 0; i < m->ntensors; i++) {
    const zs__tensor* t = &m->tensors[i];
    if (t->group == group && t->tied_to < 0 && !(t->flags & ZS_TENSOR_FROZEN))
      return t->step;
  }
  return 0; /* a group without trainable tensors: no update applied */
}

/* ---- Stacked kinds ---- */

zs_status zs_model_add_kind(zs_model* m, const char* name, int ndim,
                            const int64_t* shape, zs_dtype dtype, int* kind) {
  zs_status st = zs__check_open(m, "zs_model_add_kind");
  if (st != ZS_OK) return st;
  const char* nm = name != NULL ? name : "(null)";
  if (m->ctx->config.device != ZS_DEVICE_HOST)
    return zs__poison(m, zs__error(ZS_ERR_UNSUPPORTED, "zs_model_add_kind "
        "'%s': stacked kinds are host memory only; on a CUDA context register "
        "each layer's tensors with zs_model_add_tensor", nm));
  if (name == NULL || name[0] == '\0' || strlen(name) >= ZS_NAME_MAX - 12 ||
      strchr(name, '\n') != NULL)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_add_kind:"
        " name '%.40s' must be 1 to %d bytes without a newline", nm,
        ZS_NAME_MAX - 13));
  for (int k = 0; k < m->nkinds; k++)
    if (strcmp(m->kinds[k].name, name) == 0)
      return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
          "zs_model_add_kind: kind '%s' is already registered (kind %d)",
          name, k));
  if (ndim < 1 || ndim > ZS_MAX_DIMS || shape == NULL || kind == NULL)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_add_kind"
        " '%s': ndim %d must be 1..%d (shape[0] is the layers) and shape and "
        "kind not NULL", name, ndim, ZS_MAX_DIMS));
  if (dtype != ZS_FLOAT32 && dtype != ZS_BFLOAT16 && dtype != ZS_FLOAT16)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_add_kind"
        " '%s': dtype %d is not a parameter type", name, (int)dtype));
  size_t n = 1, per = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || (d == 0 && shape[0] > (1 << 24)))
      return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
          "zs_model_add_kind '%s': shape[%d] = %lld is negative%s", name, d,
          (long long)shape[d], d == 0 ? " or more than 2^24 layers" : ""));
    if (shape[d] != 0 && n > SIZE_MAX / 8 / (size_t)shape[d])
      return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
          "zs_model_add_kind '%s': element count overflows", name));
    n *= (size_t)shape[d];
    if (d > 0) per *= (size_t)shape[d];
  }
  st = zs__reserve((void**)&m->kinds, &m->kinds_cap, m->nkinds + 1,
                   sizeof *m->kinds);
  int* slices = NULL;
  if (st == ZS_OK && shape[0] > 0) {
    slices = (int*)malloc((size_t)shape[0] * sizeof *slices);
    if (slices == NULL)
      st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_model_add_kind '%s'", name);
  }
  if (st != ZS_OK) return zs__poison(m, st);
  zs__kind* kd = &m->kinds[m->nkinds];
  memset(kd, 0, sizeof *kd);
  snprintf(kd->name, sizeof kd->name, "%s", name);
  kd->ndim = ndim;
  for (int d = 0; d < ndim; d++) kd->shape[d] = shape[d];
  kd->numel = n;
  kd->slice_numel = per;
  kd->dtype = dtype;
  kd->slices = slices;
  for (int64_t l = 0; l < shape[0]; l++) slices[l] = -1;
  kd->views[0].fd = kd->views[1].fd = -1;
  *kind = m->nkinds++;
  return ZS_OK;
}

zs_status zs_model_add_slice(zs_model* m, int unit, int kind, int layer,
                             int64_t offset, unsigned int flags, int* tensor) {
  zs_status st = zs__check_open(m, "zs_model_add_slice");
  if (st != ZS_OK) return st;
  if (kind < 0 || kind >= m->nkinds)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind %d does not exist (%d kinds)", kind,
        m->nkinds));
  zs__kind* kd = &m->kinds[kind];
  if (unit < 0 || unit >= m->nunits)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind '%s' layer %d: unit %d does not exist (%d "
        "units)", kd->name, layer, unit, m->nunits));
  if ((flags & ~ZS_TENSOR_FROZEN) != 0)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind '%s' layer %d: unknown flags 0x%x", kd->name,
        layer, flags));
  if (layer < 0 || layer >= kd->shape[0])
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind '%s' layer %d: outside its layers 0..%lld",
        kd->name, layer, (long long)kd->shape[0] - 1));
  if (kd->slices[layer] >= 0) {
    const zs__tensor* o = &m->tensors[kd->slices[layer]];
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind '%s' layer %d is already owned by unit '%s' "
        "(a layer's slice belongs to one unit)", kd->name, layer,
        m->units[o->unit].name));
  }
  const size_t per = kd->slice_numel;
  if (offset < 0 || (size_t)offset > kd->numel || per > kd->numel - (size_t)offset)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_slice: kind '%s' layer %d: the slice [%lld, %lld) lies "
        "outside the kind's %zu elements", kd->name, layer, (long long)offset,
        (long long)offset + (long long)per, kd->numel));
  for (int l = 0; l < kd->shape[0] && per > 0; l++) {
    const int t = kd->slices[l];
    if (t < 0 || m->tensors[t].numel == 0) continue;
    const size_t o = m->tensors[t].kind_offset;
    if ((size_t)offset < o + per && o < (size_t)offset + per)
      return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
          "zs_model_add_slice: kind '%s' layer %d: the slice [%lld, %lld) "
          "overlaps layer %d's [%zu, %zu)", kd->name, layer, (long long)offset,
          (long long)offset + (long long)per, l, o, o + per));
  }
  char name[ZS_NAME_MAX + 16]; /* the kind's name is at most ZS_NAME_MAX-13 */
  snprintf(name, sizeof name, "%s.%d", kd->name, layer);
  int t = -1;
  st = zs_model_add_tensor(m, unit, name, kd->ndim - 1, kd->shape + 1,
                           kd->dtype, flags, &t);
  if (st != ZS_OK) return st; /* poisoned there */
  m->tensors[t].kind = kind;
  m->tensors[t].layer = layer;
  m->tensors[t].kind_offset = (size_t)offset;
  kd->slices[layer] = t;
  if (tensor != NULL) *tensor = t;
  return ZS_OK;
}

zs_status zs_model_add_stacked(zs_model* m, const char* name, int ndim,
                               const int64_t* shape, int64_t layer_stride,
                               zs_dtype dtype, unsigned int flags,
                               const int* units, int* kind) {
  zs_status st = zs__check_open(m, "zs_model_add_stacked");
  if (st != ZS_OK) return st;
  int k = -1;
  st = zs_model_add_kind(m, name, ndim, shape, dtype, &k);
  if (st != ZS_OK) return st;
  const zs__kind* kd = &m->kinds[k];
  if (layer_stride < 0 || (size_t)layer_stride != kd->slice_numel)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_stacked: kind '%s': layer stride %lld elements does not "
        "match the shape (one layer is %zu elements; an irregular layout "
        "adds its slices with zs_model_add_slice)", kd->name,
        (long long)layer_stride, kd->slice_numel));
  if (units == NULL && kd->shape[0] > 0)
    return zs__poison(m, zs__error(ZS_ERR_INVALID_ARGUMENT,
        "zs_model_add_stacked: kind '%s': units is NULL", kd->name));
  for (int l = 0; l < kd->shape[0]; l++) {
    st = zs_model_add_slice(m, units[l], k, l, (int64_t)l * layer_stride,
                            flags, NULL);
    if (st != ZS_OK) return st;
  }
  if (kind != NULL) *kind = k;
  return ZS_OK;
}

static zs_status zs__kind_view(zs_model* m, int kind, int which, void** out,
                               const char* fn) {
  zs_status st = zs__check_finalized(m, fn);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(kind >= 0 && kind < m->nkinds, "%s: kind %d does not exist (%d "
             "kinds)", fn, kind, m->nkinds);
  ZS_REQUIRE(out != NULL, "%s: out is NULL", fn);
  const zs__view* v = &m->kinds[kind].views[which];
  ZS_REQUIRE(v->base != NULL, "%s: kind '%s' has no gradients (no trainable "
             "slice: every slice is frozen, or it has no layers)", fn,
             m->kinds[kind].name);
  *out = v->base;
  return ZS_OK;
}

zs_status zs_kind_data(zs_model* m, int kind, void** data) {
  return zs__kind_view(m, kind, ZS__VIEW_PARAMS, data, "zs_kind_data");
}

zs_status zs_kind_grad(zs_model* m, int kind, void** grad) {
  return zs__kind_view(m, kind, ZS__VIEW_GRADS, grad, "zs_kind_grad");
}

int zs_model_kind_count(const zs_model* m) { return m ? m->nkinds : 0; }

zs_status zs_model_find_kind(const zs_model* m, const char* name, int* kind) {
  ZS_REQUIRE(m != NULL && name != NULL && kind != NULL,
             "zs_model_find_kind: arguments must not be NULL");
  for (int k = 0; k < m->nkinds; k++)
    if (strcmp(m->kinds[k].name, name) == 0) {
      *kind = k;
      return ZS_OK;
    }
  return zs__error(ZS_ERR_INVALID_ARGUMENT, "no stacked kind named '%s'", name);
}

zs_status zs_model_add_param_group(zs_model* m, double lr, double weight_decay,
                                   int* group) {
  zs_status st = zs__check_open(m, "zs_model_add_param_group");
  if (st == ZS_OK && (!isfinite(lr) || lr < 0 || !isfinite(weight_decay) ||
                      weight_decay < 0 || group == NULL))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_add_param_group: lr %g and weight_decay %g must "
                   "be finite and >= 0, group non-NULL", lr, weight_decay);
  if (st != ZS_OK) return zs__poison(m, st);
  double* lr2 = (double*)realloc(m->group_lr, sizeof(double) * (m->ngroups + 1));
  if (lr2 != NULL) m->group_lr = lr2;
  double* wd2 = (double*)realloc(m->group_wd, sizeof(double) * (m->ngroups + 1));
  if (wd2 != NULL) m->group_wd = wd2;
  if (lr2 == NULL || wd2 == NULL)
    return zs__poison(m, zs__error(ZS_ERR_OUT_OF_MEMORY, "param group"));
  m->group_lr[m->ngroups] = lr;
  m->group_wd[m->ngroups] = weight_decay;
  *group = m->ngroups++;
  return ZS_OK;
}

zs_status zs_model_set_tensor_group(zs_model* m, int tensor, int group) {
  zs_status st = zs__check_open(m, "zs_model_set_tensor_group");
  if (st == ZS_OK && (tensor < 0 || tensor >= m->ntensors))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_set_tensor_group: tensor %d does not exist",
                   tensor);
  if (st == ZS_OK && (group < 0 || group >= m->ngroups))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_set_tensor_group: tensor '%s': group %d does not "
                   "exist (%d groups)", m->tensors[tensor].name, group,
                   m->ngroups);
  if (st == ZS_OK && m->tensors[tensor].tied_to >= 0)
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "zs_model_set_tensor_group: tensor '%s' is tied; set the "
                   "group of its owner '%s'", m->tensors[tensor].name,
                   m->tensors[m->tensors[tensor].tied_to].name);
  if (st != ZS_OK) return zs__poison(m, st);
  m->tensors[tensor].group = group;
  return ZS_OK;
}

zs_status zs_unit_set_grad_uses(zs_model* m, int unit, int uses) {
  /* Registration-time only: the counts are compared across ranks at
   * finalize; a later change on one rank would desynchronize reductions. */
  zs_status st = zs__check_open(m, "zs_unit_set_grad_uses");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "zs_unit_set_grad_uses: unit %d does not exist", unit);
  ZS_REQUIRE(uses >= 0, "zs_unit_set_grad_uses: unit '%s': uses %d < 0",
             m->units[unit].name, uses);
  m->units[unit].uses_explicit = uses;
  return ZS_OK;
}

/* Appends printf output to a growing buffer. */
typedef struct zs__sbuf {
  char* data;
  size_t len, cap;
  int oom;
} zs__sbuf;

static void zs__sbuf_printf(zs__sbuf* b, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void zs__sbuf_printf(zs__sbuf* b, const char* fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = b->data != NULL ? vsnprintf(b->data + b->len, room, fmt, ap) : -1;
    va_end(ap);
    if (n >= 0 && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = b->cap == 0 ? 4096 : b->cap * 2;
    if (n >= 0 && b->len + (size_t)n + 1 > ncap) ncap = b->len + (size_t)n + 1;
    char* p = (char*)realloc(b->data, ncap);
    if (p == NULL) {
      b->oom = 1;
      return;
    }
    b->data = p;
    b->cap = ncap;
  }
}

/* The text every rank must agree on: one line per unit, tensor and group. */
static zs_status zs__describe(const zs_model* m, zs__sbuf* b) {
  if (m->poisoned)
    zs__sbuf_printf(b, "registration failed: %s\n", m->poison_msg);
  zs__sbuf_printf(b, "units=%d tensors=%d groups=%d\n", m->nunits,
                  m->ntensors, m->ngroups);
  zs__sbuf_printf(b, "optimizer '%s' states=%d callback=%d\n", m->optim_name,
                  m->optim_nstates, m->optim_fn != NULL);
  for (int g = 0; g < m->ngroups; g++)
    zs__sbuf_printf(b, "group %d lr=%.17g weight_decay=%.17g\n", g, m->group_lr[g],
                    m->group_wd[g]);
  zs__sbuf_printf(b, "persistence_threshold=%zu\n", m->persistence_threshold);
  for (int i = 0; i < m->nunits; i++)
    zs__sbuf_printf(b, "unit %d '%s' tensors=%d grad_uses=%d strategy=%d "
                    "allow_unused=%d\n", i, m->units[i].name,
                    m->units[i].ntensors, m->units[i].uses_explicit,
                    m->units[i].strategy, m->units[i].allow_unused);
  for (int i = 0; i < m->ntensors; i++) {
    const zs__tensor* t = &m->tensors[i];
    zs__sbuf_printf(b, "tensor %d '%s' unit=%d shape=[", i, t->name, t->unit);
    for (int d = 0; d < t->ndim; d++)
      zs__sbuf_printf(b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    zs__sbuf_printf(b, "] dtype=%s flags=%u tied_to=%d group=%d\n",
                    zs_dtype_name(t->dtype), t->flags, t->tied_to, t->group);
    if (t->kind >= 0)
      zs__sbuf_printf(b, "  slice of kind %d layer %d at %zu\n", t->kind,
                      t->layer, t->kind_offset);
  }
  for (int k = 0; k < m->nkinds; k++)
    zs__sbuf_printf(b, "kind %d '%s' numel=%zu\n", k, m->kinds[k].name,
                    m->kinds[k].numel);
  if (b->oom)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "finalize: model description");
  return ZS_OK;
}

/* Offsets, flags and the optimizer pieces of one unit. */
static zs_status zs__layout_one(zs_model* m, zs__unit* u) {
  zs_status st = ZS_OK;
  int n = u->ntensors;
  size_t* numels = (size_t*)calloc((size_t)n + 1, sizeof *numels);
  size_t* offsets = (size_t*)calloc((size_t)n + 1, sizeof *offsets);
  int* alias = (int*)calloc((size_t)n + 1, sizeof *alias);
  int* frozen = (int*)calloc((size_t)n + 1, sizeof *frozen);
  if (!numels || !offsets || !alias || !frozen)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "finalize: layout of unit '%s'", u->name);
  u->trainable = 0;
  for (int i = 0; i < n; i++) {
    const zs__tensor* t = &m->tensors[u->tensors[i]];
    numels[i] = t->numel;
    alias[i] = t->tied_to >= 0;
    frozen[i] = (t->flags & ZS_TENSOR_FROZEN) != 0;
    if (!alias[i] && !frozen[i]) u->trainable = 1;
  }
  if (u->dtype == ZS_DTYPE_COUNT) u->dtype = ZS_FLOAT32; /* empty unit */
  u->elem = zs_dtype_size(u->dtype);
  /* Gradients: in the parameter dtype, or fp32 (reduce_dtype). Reducing
   * 16-bit values in another 16-bit type is not offered; the backend's own
   * reduction (reduce_order BACKEND) has no 16-bit sum in MPI. */
  const zs_config* cfg = &m->ctx->config;
  u->gdtype = cfg->reduce_dtype < 0 ? u->dtype : (zs_dtype)cfg->reduce_dtype;
  if (u->gdtype != ZS_FLOAT32 && u->gdtype != u->dtype)
    ZS_FAIL(ZS_ERR_UNSUPPORTED,
            "unit '%s': %s parameters with reduce_dtype %s: gradients are "
            "accumulated and reduced in the parameter dtype or in fp32",
            u->name, zs_dtype_name(u->dtype), zs_dtype_name(u->gdtype));
  if (u->gdtype != ZS_FLOAT32 && u->trainable &&
      cfg->reduce_order == ZS_REDUCE_BACKEND)
    ZS_FAIL(ZS_ERR_UNSUPPORTED,
            "unit '%s': %s gradients need reduce_order ZS_REDUCE_FIXED (the "
            "MPI backend has no %s sum); or set reduce_dtype to ZS_FLOAT32",
            u->name, zs_dtype_name(u->gdtype), zs_dtype_name(u->gdtype));
  u->gelem = zs_dtype_size(u->gdtype);
  /* Padded for every rank of the context, split over the shard group: with
   * replicas (hybrid sharding) each shard then splits evenly over the
   * replica group too, for its all-reduce (zs__replica_reduce). */
  ZS_CHECK(zs__layout_unit(numels, alias, n, zs__layout_align(u->elem),
                           m->ctx->world, offsets, &u->layout));
  u->layout.shard = u->layout.padded / (size_t)m->ctx->shard_ranks;
  if (u->layout.padded > SIZE_MAX / u->elem)
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "unit '%s': %zu elements of %zu bytes overflow size_t", u->name,
            u->layout.padded, u->elem);
  if (u->layout.shard > m->ctx->shard_comm->max_count)
    ZS_FAIL(ZS_ERR_UNSUPPORTED,
            "unit '%s': its shard of %zu elements exceeds the %s backend's "
            "limit of %zu elements per collective; split it into smaller "
            "units", u->name, u->layout.shard, m->ctx->shard_comm->ops->name,
            m->ctx->shard_comm->max_count);
  for (int i = 0; i < n; i++)
    if (!alias[i]) m->tensors[u->tensors[i]].offset = offsets[i];
  /* The unit's policy: where each field lives, from here on. A replicated
   * unit (its strategy, or the persistence threshold) has stage 0's, and
   * its parameters are never offloaded. */
  u->replicated = u->strategy == ZS_UNIT_REPLICATED ||
                  (u->strategy == ZS_UNIT_DEFAULT && m->persistence_threshold > 0 &&
                   u->layout.used <= m->persistence_threshold);
  const zs__policy_in pin = {
      u->replicated ? 0 : cfg->stage, m->ctx->device == m->ctx->host,
      u->dtype != ZS_FLOAT32, u->trainable,
      (int)cfg->offload_optimizer.device,
      u->replicated ? (int)ZS_OFFLOAD_NONE : (int)cfg->offload_param};
  ZS_CHECK(zs__policy_make(&pin, &u->policy));
  u->param_state =
      u->policy.gather_on_use ? ZS__PARAM_SHARDED : ZS__PARAM_RESIDENT;
  /* The optimizer's span (the whole buffer at stage 0, the shard at 1-3). */
  size_t begin = zs__span_begin(m, u);
  size_t end = begin + zs__optimize_span_elems(m, u);
  free(u->opt_pieces); /* a retried finalize */
  u->opt_pieces = NULL;
  ZS_CHECK(zs__pieces_alloc(offsets, numels, alias, frozen, n, begin, end,
                            u->name, &u->opt_pieces, &u->nopt_pieces));
  /* The norm's pieces: this rank's shard at every stage, so that across
   * ranks each trainable element counts exactly once (never padding). */
  begin = zs__layout_shard_begin(&u->layout, m->ctx->shard_rank);
  end = begin + u->layout.shard;
  free(u->norm_pieces);
  u->norm_pieces = NULL;
  ZS_CHECK(zs__pieces_alloc(offsets, numels, alias, frozen, n, begin, end,
                            u->name, &u->norm_pieces, &u->nnorm_pieces));
cleanup:
  free(frozen);
  free(alias);
  free(offsets);
  free(numels);
  return st;
}

/* Distinct other units whose tensors this unit ties to. */
static zs_status zs__find_owners(zs_model* m, zs__unit* u, int self) {
  free(u->owners); /* a retried finalize */
  u->nowners = 0;
  u->owners = (int*)calloc((size_t)u->ntensors + 1, sizeof *u->owners);
  if (u->owners == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "finalize: owners of '%s'", u->name);
  for (int i = 0; i < u->ntensors; i++) {
    int t = u->tensors[i];
    if (m->tensors[t].tied_to < 0) continue;
    int o = m->tensors[m->tensors[t].tied_to].unit;
    int seen = o == self;
    for (int k = 0; k < u->nowners; k++) seen |= u->owners[k] == o;
    if (!seen) u->owners[u->nowners++] = o;
  }
  return ZS_OK;
}

/* Allocates a persistent field of `bytes` where the policy's tier says:
 * device memory (accounted under cat), CPU offload's host memory, or
 * nothing here (NVMe: the swap file's pool). */
static zs_status zs__tier_alloc(zs_model* m, zs__tier tier,
                                zs_mem_category cat, size_t bytes,
                                const char* label, void** out) {
  if (tier == ZS__TIER_HOST) return zs__offload_host_alloc(m, bytes, label, out);
  if (tier == ZS__TIER_DEVICE)
    return zs__dev_alloc(m->ctx->device, cat, bytes, 1, label, out);
  return ZS_OK;
}

/* Persistent buffers of one unit, as its policy places them. */
static zs_status zs__alloc_unit(zs_model* m, zs__unit* u) {
  const zs__policy* pol = &u->policy;
  /* The sizes are the memory model's (zs__layout_unit_bytes), which the
   * estimator adds up: the two cannot disagree. */
  const zs__unit_bytes b =
      zs__layout_unit_bytes(&u->layout, pol, u->elem, u->gelem);
  zs_status st = ZS_OK;
  /* parameters: the whole buffer, or the shard (on NVMe: in the parameter
   * swap file, zs__nvme_param_init) */
  ZS_CHECK(zs__tier_alloc(m, pol->params_tier, ZS_MEM_PARAMS, b.params, u->name,
                          pol->params == ZS__EXTENT_FULL ? &u->params_full
                                                         : &u->params_shard));
  if (!u->trainable) return ZS_OK;
  ZS_CHECK(zs__tier_alloc(m, ZS__TIER_DEVICE, ZS_MEM_GRADS, b.grads, u->name,
                          pol->grads == ZS__EXTENT_FULL ? &u->grads_full
                                                        : &u->grads_shard));
  /* master weights and optimizer states: on the device, in CPU offload's
   * NUMA-placed host memory, or in the swap file (zs__nvme_model_init);
   * the master copy is filled from the parameters before the first step */
  if (b.master > 0) {
    ZS_CHECK(zs__tier_alloc(m, pol->master_tier, ZS_MEM_MASTER_WEIGHTS,
                            b.master, u->name, &u->master));
    u->master_stale = 1;
  }
  const zs_optimizer_config* o = &m->ctx->config.optimizer;
  u->nstates = m->optim_fn != NULL ? m->optim_nstates
               : o->kind == ZS_OPTIM_SGD ? (o->momentum != 0.0 ? 1 : 0)
                                         : 2;
  for (int k = 0; k < u->nstates; k++)
    ZS_CHECK(zs__tier_alloc(m, pol->state_tier, ZS_MEM_OPTIMIZER_STATES,
                            b.state, u->name, &u->state[k]));
cleanup:
  return st;
}

/* The stage-3 live-elements limit: a limit below the largest unit gathered
 * on use could never be met, so it is raised to it (with a warning).
 * Replicated units are never gathered: they do not count. */
static void zs__set_live_limit(zs_model* m) {
  size_t want = m->ctx->config.max_live_elements, largest = 0;
  int which = -1;
  for (int i = 0; i < m->nunits; i++) {
    if (!m->units[i].policy.gather_on_use) continue;
    size_t need = m->units[i].layout.padded;
    for (int k = 0; k < m->units[i].nowners; k++)
      if (m->units[m->units[i].owners[k]].policy.gather_on_use)
        need += m->units[m->units[i].owners[k]].layout.padded;
    if (need > largest) {
      largest = need;
      which = i;
    }
  }
  m->max_live_elems = want;
  if (want > 0 && want < largest && m->gathers) {
    zs__log(ZS_LOG_WARN,
            "max_live_elements %zu is below unit '%s' (%zu elements with its "
            "tied owners); raised to %zu", want, m->units[which].name, largest,
            largest);
    m->max_live_elems = largest;
  }
}

zs_status zs_model_finalize(zs_model* m) {
  ZS_REQUIRE(m != NULL, "zs_model_finalize: model is NULL");
  if (m->finalized)
    return zs__error(ZS_ERR_INVALID_STATE, "zs_model_finalize: called twice");
  zs_status st = ZS_OK;
  zs__sbuf desc = {0};
  ZS_CHECK(zs__describe(m, &desc));
  /* The first collective of a model: nothing touches data before it. */
  st = zs__comm_check_same(m->ctx->comm, "model registration", desc.data,
                           desc.len);
  if (st != ZS_OK) {
    st = zs__error_prefix(st, "zs_model_finalize: ");
    goto cleanup;
  }
  if (m->poisoned)
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "zs_model_finalize: registration failed earlier on every rank: %s",
            m->poison_msg);
  zs_status local = ZS_OK;
  for (int i = 0; i < m->nunits && local == ZS_OK; i++) {
    local = zs__layout_one(m, &m->units[i]);
    if (local == ZS_OK) local = zs__find_owners(m, &m->units[i], i);
  }
  for (int i = 0; i < m->ntensors; i++)
    if (m->tensors[i].tied_to >= 0) {
      m->tensors[i].offset = m->tensors[m->tensors[i].tied_to].offset;
      m->tensors[i].group = m->tensors[m->tensors[i].tied_to].group;
    }
  /* every layer of a stacked kind belongs to a unit (its slices tile the
   * kind, so zs_kind_set/_get cover it) */
  for (int k = 0; k < m->nkinds && local == ZS_OK; k++)
    for (int l = 0; l < m->kinds[k].shape[0] && local == ZS_OK; l++)
      if (m->kinds[k].slices[l] < 0)
        local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_finalize: stacked "
                          "kind '%s' layer %d has no slice (give every layer "
                          "to a unit with zs_model_add_slice)",
                          m->kinds[k].name, l);
  /* a unit some ranks may not use: its tensors are its own (a tie would
   * make its use the owner's use, which every rank must share), and at
   * stage 3 the gather to its users names them in 64 bits */
  for (int i = 0; i < m->nunits && local == ZS_OK; i++) {
    const zs__unit* u = &m->units[i];
    if (!u->allow_unused) continue;
    int tied = u->nowners > 0;
    for (int j = 0; j < m->nunits && !tied; j++)
      for (int k = 0; k < m->units[j].nowners; k++) tied |= m->units[j].owners[k] == i;
    if (tied)
      local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_model_finalize: unit '%s' "
                        "may be unused (zs_unit_allow_unused) but has tied "
                        "tensors, to or from another unit; such a unit's "
                        "tensors must be its own", u->name);
    else if (m->ctx->shard_ranks > 64 && u->policy.gather_on_use)
      local = zs__error(ZS_ERR_UNSUPPORTED, "zs_model_finalize: unit '%s' may "
                        "be unused (zs_unit_allow_unused): at stage 3 with at "
                        "most 64 ranks in a shard group (this job has %d)",
                        u->name, m->ctx->shard_ranks);
  }
  /* a user's optimizer runs on the host: with a CUDA context only where
   * the policy steps in host memory (CPU or NVMe offload) */
  for (int i = 0; i < m->nunits && local == ZS_OK && m->optim_fn != NULL; i++)
    if (m->units[i].trainable && m->units[i].policy.state_tier == ZS__TIER_DEVICE &&
        m->ctx->config.device != ZS_DEVICE_HOST)
      local = zs__error(ZS_ERR_UNSUPPORTED, "zs_model_finalize: optimizer '%s' "
                        "is a host callback, and this CUDA context steps on "
                        "the device; offload the optimizer "
                        "(zs_config.offload_optimizer.device = ZS_OFFLOAD_CPU "
                        "or ZS_OFFLOAD_NVME) to run it", m->optim_name);
  m->gathers = m->parameters_offloaded = 0;
  for (int i = 0; i < m->nunits && local == ZS_OK; i++) {
    m->gathers |= m->units[i].policy.gather_on_use;
    m->parameters_offloaded |= m->units[i].policy.params_tier != ZS__TIER_DEVICE;
    local = zs__alloc_unit(m, &m->units[i]);
  }
  /* the swap files of the fields the policies put on NVMe */
  int nvme_states = 0, nvme_params = 0;
  for (int i = 0; i < m->nunits; i++) {
    nvme_states |= m->units[i].policy.state_tier == ZS__TIER_NVME;
    nvme_params |= m->units[i].policy.params_tier == ZS__TIER_NVME;
  }
  if (local == ZS_OK && nvme_states) local = zs__nvme_model_init(m);
  if (local == ZS_OK && nvme_params) local = zs__nvme_param_init(m);
  if (local == ZS_OK) local = zs__views_create(m);
  /* Agree on success so that a rank out of memory fails everyone now,
   * rather than hanging them in the first gather. */
  ZS_CHECK(zs__comm_agree(m->ctx->comm, local, "zs_model_finalize"));
  zs__set_live_limit(m);
  m->trace_ok = 1;
  m->finalized = 1;
cleanup:
  if (st != ZS_OK) {
    m->finalize_failed = 1;
    zs__nvme_param_free(m);
    for (int i = 0; i < m->nunits; i++)
      zs__unit_free_storage(m, &m->units[i]);
    zs__nvme_model_free(m);
    zs__views_destroy(m);
  }
  free(desc.data);
  return st;
}

int zs_model_unit_count(const zs_model* m) { return m ? m->nunits : 0; }

int zs_model_tensor_count(const zs_model* m) { return m ? m->ntensors : 0; }

const char* zs_model_unit_name(const zs_model* m, int unit) {
  if (m == NULL || unit < 0 || unit >= m->nunits) return NULL;
  return m->units[unit].name;
}

zs_status zs_model_find_tensor(const zs_model* m, const char* name,
                               int* tensor) {
  ZS_REQUIRE(m != NULL && name != NULL && tensor != NULL,
             "zs_model_find_tensor: arguments must not be NULL");
  for (int i = 0; i < m->ntensors; i++)
    if (strcmp(m->tensors[i].name, name) == 0) {
      *tensor = i;
      return ZS_OK;
    }
  return zs__error(ZS_ERR_INVALID_ARGUMENT, "no tensor named '%s'", name);
}

zs_status zs_unit_layout(const zs_model* m, int unit, size_t* used,
                         size_t* padded, size_t* shard) {
  zs_status st = zs__check_finalized(m, "zs_unit_layout");
  if (st != ZS_OK) return st;
  ZS_REQUIRE(unit >= 0 && unit < m->nunits,
             "zs_unit_layout: unit %d does not exist (%d units)", unit,
             m->nunits);
  const zs__unit_layout* l = &m->units[unit].layout;
  if (used != NULL) *used = l->used;
  if (padded != NULL) *padded = l->padded;
  if (shard != NULL) *shard = l->shard;
  return ZS_OK;
}

zs_status zs_model_set_lr(zs_model* m, int group, double lr) {
  ZS_REQUIRE(m != NULL, "zs_model_set_lr: model is NULL");
  ZS_REQUIRE(isfinite(lr) && lr >= 0,
             "zs_model_set_lr: lr %g must be finite and >= 0", lr);
  ZS_REQUIRE(group == ZS_ALL_GROUPS || (group >= 0 && group < m->ngroups),
             "zs_model_set_lr: group %d does not exist (%d groups)", group,
             m->ngroups);
  for (int g = 0; g < m->ngroups; g++)
    if (group == ZS_ALL_GROUPS || g == group) m->group_lr[g] = lr;
  return ZS_OK;
}
