/*
 * core_config.c — configuration versions, defaults and range checks
 * (errors name the field); the JSON form is in core_config_json.c.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/core.h"
#include "runtime/core/core_policy.h"

/* ==== Versions and frozen layouts ========================================= */

/* zs_config's size in each header release: fields are only appended, so a
 * release's struct is the prefix of this library's of that size (docs/api.md,
 * "Versions and compatibility"). The 0.1 fields end with nvme. */
#define ZS__ALIGN_UP(n, a) (((n) + (a) - 1) / (a) * (a))
#define ZS__CONFIG_SIZE_0_1                                        \
  ZS__ALIGN_UP(offsetof(zs_config, nvme) + sizeof(zs_nvme_config), \
               _Alignof(zs_config))
/* 0.2 appended nothing. 0.3 appended param_persistence_threshold,
 * heartbeat_timeout_s, host_collectives and reserved_0_3 (which ends the
 * struct without padding: an int appended later must not fit in 0.3's
 * padding, or the two releases' sizes would be equal). */
#define ZS__CONFIG_SIZE_0_2 ZS__CONFIG_SIZE_0_1
#define ZS__CONFIG_SIZE_0_3                                           \
  ZS__ALIGN_UP(offsetof(zs_config, reserved_0_3) + sizeof(int),        \
               _Alignof(zs_config))
/* 0.4 appended shard_group_size and reserved_0_4. */
#define ZS__CONFIG_SIZE_0_4                                           \
  ZS__ALIGN_UP(offsetof(zs_config, reserved_0_4) + sizeof(int),        \
               _Alignof(zs_config))
/* The releases before this library's minor version, oldest first; this
 * minor's own size is sizeof(zs_config). A release that appends fields
 * adds its predecessor's size here as a constant. */
static const struct {
  unsigned int from_version; /* ZS_VERSION_CODE of the first release */
  size_t size;
} zs__config_sizes[] = {
    {100, ZS__CONFIG_SIZE_0_1},
    {200, ZS__CONFIG_SIZE_0_2},
    {300, ZS__CONFIG_SIZE_0_3},
    {400, ZS__CONFIG_SIZE_0_4}, /* (used once this library is 0.5 or later) */
};
#define ZS__NCONFIG_SIZES (sizeof zs__config_sizes / sizeof *zs__config_sizes)
#define ZS__THIS_MINOR (ZS_VERSION_MAJOR * 10000 + ZS_VERSION_MINOR * 100)

/* The layout of every field released so far, on LP64 (x86-64, aarch64):
 * a field inserted anywhere, or an embedded struct that grows, fails the
 * build here, naming the field (tests/compat/abi_layout_test.sh inserts
 * one to show it). Appending to zs_config does not. */
#if defined(__LP64__)
#define ZS__FIELD_AT(S, f, at)                                        \
  _Static_assert(offsetof(S, f) == (at), #S "." #f " moved: released " \
                 "fields are frozen; append new fields to zs_config's end")
ZS__FIELD_AT(zs_config, struct_size, 0);
ZS__FIELD_AT(zs_config, version, 8);
ZS__FIELD_AT(zs_config, stage, 12);
ZS__FIELD_AT(zs_config, device, 16);
ZS__FIELD_AT(zs_config, optimizer, 24);
ZS__FIELD_AT(zs_config, log_level, 96);
ZS__FIELD_AT(zs_config, collective_timeout_s, 104);
ZS__FIELD_AT(zs_config, bucket_elements, 112);
ZS__FIELD_AT(zs_config, prefetch_depth, 120);
ZS__FIELD_AT(zs_config, max_live_elements, 128);
ZS__FIELD_AT(zs_config, reshard_after_forward, 136);
ZS__FIELD_AT(zs_config, reduce_order, 140);
ZS__FIELD_AT(zs_config, progress_thread, 144);
ZS__FIELD_AT(zs_config, reduce_dtype, 148);
ZS__FIELD_AT(zs_config, grad_accum_steps, 152);
ZS__FIELD_AT(zs_config, grad_accum_local, 156);
ZS__FIELD_AT(zs_config, clip_grad_norm, 160);
ZS__FIELD_AT(zs_config, max_grad_norm, 168);
ZS__FIELD_AT(zs_config, loss_scaler, 176);
ZS__FIELD_AT(zs_config, profile_dir, 232);
ZS__FIELD_AT(zs_config, offload_optimizer, 240);
ZS__FIELD_AT(zs_config, offload_param, 256);
ZS__FIELD_AT(zs_config, nvme, 264);
ZS__FIELD_AT(zs_optimizer_config, kind, 0);
ZS__FIELD_AT(zs_optimizer_config, lr, 8);
ZS__FIELD_AT(zs_optimizer_config, beta1, 16);
ZS__FIELD_AT(zs_optimizer_config, beta2, 24);
ZS__FIELD_AT(zs_optimizer_config, eps, 32);
ZS__FIELD_AT(zs_optimizer_config, weight_decay, 40);
ZS__FIELD_AT(zs_optimizer_config, momentum, 48);
ZS__FIELD_AT(zs_optimizer_config, dampening, 56);
ZS__FIELD_AT(zs_optimizer_config, nesterov, 64);
ZS__FIELD_AT(zs_loss_scaler_config, mode, 0);
ZS__FIELD_AT(zs_loss_scaler_config, init_scale, 8);
ZS__FIELD_AT(zs_loss_scaler_config, growth_factor, 16);
ZS__FIELD_AT(zs_loss_scaler_config, backoff_factor, 24);
ZS__FIELD_AT(zs_loss_scaler_config, growth_interval, 32);
ZS__FIELD_AT(zs_loss_scaler_config, min_scale, 40);
ZS__FIELD_AT(zs_loss_scaler_config, hysteresis, 48);
ZS__FIELD_AT(zs_offload_config, device, 0);
ZS__FIELD_AT(zs_offload_config, pin_memory, 4);
ZS__FIELD_AT(zs_offload_config, numa, 8);
ZS__FIELD_AT(zs_offload_config, threads, 12);
ZS__FIELD_AT(zs_nvme_config, path, 0);
ZS__FIELD_AT(zs_nvme_config, buffer_count, 8);
ZS__FIELD_AT(zs_nvme_config, buffer_size, 16);
ZS__FIELD_AT(zs_nvme_config, sub_group_size, 24);
ZS__FIELD_AT(zs_nvme_config, queue_depth, 32);
ZS__FIELD_AT(zs_nvme_config, aio, 36);
ZS__FIELD_AT(zs_nvme_config, block_size, 40);
ZS__FIELD_AT(zs_nvme_config, param_buffer_count, 48);
ZS__FIELD_AT(zs_nvme_config, param_buffer_elements, 56);
_Static_assert(sizeof(zs_optimizer_config) == 72 &&
                   sizeof(zs_loss_scaler_config) == 56 &&
                   sizeof(zs_offload_config) == 16 &&
                   sizeof(zs_nvme_config) == 64,
               "an embedded config struct changed size: they are frozen");
_Static_assert(ZS__CONFIG_SIZE_0_1 == 328, "zs_config's 0.1 prefix moved");
ZS__FIELD_AT(zs_config, param_persistence_threshold, 328);
ZS__FIELD_AT(zs_config, heartbeat_timeout_s, 336);
ZS__FIELD_AT(zs_config, host_collectives, 344);
ZS__FIELD_AT(zs_config, reserved_0_3, 348);
_Static_assert(ZS__CONFIG_SIZE_0_3 == 352,
               "0.3's zs_config: 0.2's and the four fields it appended");
ZS__FIELD_AT(zs_config, shard_group_size, 352);
ZS__FIELD_AT(zs_config, reserved_0_4, 356);
#if ZS_VERSION_MAJOR == 0 && ZS_VERSION_MINOR == 4
_Static_assert(sizeof(zs_config) == ZS__CONFIG_SIZE_0_4 &&
                   ZS__CONFIG_SIZE_0_4 == 360,
               "0.4's zs_config: 0.3's and the two fields it appended");
#endif
#undef ZS__FIELD_AT
#endif
_Static_assert(sizeof(zs_device_kind) == sizeof(int) &&
                   sizeof(zs_log_level) == sizeof(int) &&
                   sizeof(zs_offload_device) == sizeof(int) &&
                   sizeof(zs_dtype) == sizeof(int),
               "config enums must be int-sized (0.1 stored them as int)");

size_t zs__config_known_size(unsigned int version) {
  if (version >= ZS__THIS_MINOR && version <= ZS_VERSION_CODE)
    return sizeof(zs_config);
  size_t size = 0;
  for (size_t i = 0; i < ZS__NCONFIG_SIZES; i++)
    if (version >= zs__config_sizes[i].from_version &&
        zs__config_sizes[i].from_version < ZS__THIS_MINOR)
      size = zs__config_sizes[i].size;
  return size;
}

static void zs__version_text(unsigned int v, char* buf, size_t cap) {
  snprintf(buf, cap, "%u.%u.%u", v / 10000, v / 100 % 100, v % 100);
}

zs_status zs__config_accept(const zs_config* in, zs_config* out,
                            unsigned int* caller_version) {
  ZS_REQUIRE(in != NULL, "config is NULL");
  const size_t head = offsetof(zs_config, version) + sizeof in->version;
  ZS_REQUIRE(in->struct_size >= head && in->struct_size <= ((size_t)1 << 20),
             "config.struct_size is %zu: initialize the config with "
             "ZS_CONFIG_INIT or zs_config_init", in->struct_size);
  char theirs[32], ours[32];
  zs__version_text(in->version, theirs, sizeof theirs);
  zs__version_text(ZS_VERSION_CODE, ours, sizeof ours);
  ZS_REQUIRE(in->version <= ZS_VERSION_CODE,
             "config.version %s (struct_size %zu) is from a newer "
             "ZeroShard header than this library (version %s, struct_size "
             "%zu): build against this library's header, or use the newer "
             "library", theirs, in->struct_size, ours, sizeof(zs_config));
  ZS_REQUIRE(in->struct_size <= sizeof(zs_config),
             "config.struct_size %zu is larger than this library's "
             "zs_config (version %s, struct_size %zu), though the config "
             "says version %s: a newer header, or a struct_size set by "
             "hand; initialize the config with ZS_CONFIG_INIT or "
             "zs_config_init", in->struct_size, ours, sizeof(zs_config),
             theirs);
  const size_t want = zs__config_known_size(in->version);
  ZS_REQUIRE(in->version != 0,
             "config.version is 0: the config was not initialized; "
             "initialize it with ZS_CONFIG_INIT or zs_config_init");
  ZS_REQUIRE(in->version / 10000 == ZS_VERSION_MAJOR && want != 0,
             "config.version %u (%s) is not a version of this library's "
             "major version %d: initialize the config with ZS_CONFIG_INIT "
             "or zs_config_init", in->version, theirs, ZS_VERSION_MAJOR);
  ZS_REQUIRE(in->struct_size == want,
             "config.struct_size is %zu, but zs_config of version %s is %zu "
             "bytes: initialize the config with ZS_CONFIG_INIT or "
             "zs_config_init (header/library mismatch?)", in->struct_size,
             theirs, want);
  const zs_config unset = ZS_CONFIG_INIT;
  zs_config full = unset;
  memcpy(&full, in, in->struct_size);
  full.struct_size = sizeof(zs_config);
  full.version = ZS_VERSION_CODE;
  if (caller_version != NULL) *caller_version = in->version;
  *out = full;
  return ZS_OK;
}

/* An UNSET field takes its default. */
#define ZS__DEFAULT(field, unset, value) \
  if ((field) == (unset)) (field) = (value)

void zs__config_resolve(zs_config* c) {
  ZS__DEFAULT(c->stage, ZS_UNSET_INT, 0);
  ZS__DEFAULT(c->device, ZS_DEVICE_UNSET, ZS_DEVICE_HOST);
  zs_optimizer_config* o = &c->optimizer;
  ZS__DEFAULT(o->kind, ZS_OPTIM_UNSET, ZS_OPTIM_ADAMW);
  ZS__DEFAULT(o->lr, ZS_UNSET_DOUBLE, 1e-3);
  ZS__DEFAULT(o->beta1, ZS_UNSET_DOUBLE, 0.9);
  ZS__DEFAULT(o->beta2, ZS_UNSET_DOUBLE, 0.999);
  ZS__DEFAULT(o->eps, ZS_UNSET_DOUBLE, 1e-8);
  if (o->weight_decay == ZS_UNSET_DOUBLE ||
      o->weight_decay == ZS_WEIGHT_DECAY_DEFAULT)
    o->weight_decay = o->kind == ZS_OPTIM_ADAMW ? 0.01 : 0.0;
  ZS__DEFAULT(o->momentum, ZS_UNSET_DOUBLE, 0.0);
  ZS__DEFAULT(o->dampening, ZS_UNSET_DOUBLE, 0.0);
  ZS__DEFAULT(o->nesterov, ZS_UNSET_INT, 0);
  ZS__DEFAULT(c->log_level, ZS_LOG_UNSET, ZS_LOG_WARN);
  ZS__DEFAULT(c->collective_timeout_s, ZS_UNSET_DOUBLE, 1800.0);
  ZS__DEFAULT(c->bucket_elements, ZS_UNSET_SIZE, (size_t)1 << 22);
  ZS__DEFAULT(c->prefetch_depth, ZS_UNSET_INT, 2);
  ZS__DEFAULT(c->max_live_elements, ZS_UNSET_SIZE, 0);
  ZS__DEFAULT(c->reshard_after_forward, ZS_UNSET_INT, 1);
  ZS__DEFAULT(c->reduce_order, ZS_REDUCE_UNSET, ZS_REDUCE_FIXED);
  ZS__DEFAULT(c->progress_thread, ZS_UNSET_INT, 1);
  ZS__DEFAULT(c->grad_accum_steps, ZS_UNSET_INT, 1);
  ZS__DEFAULT(c->grad_accum_local, ZS_UNSET_INT, 0);
  ZS__DEFAULT(c->clip_grad_norm, ZS_UNSET_INT, 0);
  ZS__DEFAULT(c->max_grad_norm, ZS_UNSET_DOUBLE, 1.0);
  zs_loss_scaler_config* ls = &c->loss_scaler;
  ZS__DEFAULT(ls->mode, ZS_LOSS_SCALE_UNSET, ZS_LOSS_SCALE_NONE);
  ZS__DEFAULT(ls->init_scale, ZS_UNSET_DOUBLE, 65536.0);
  ZS__DEFAULT(ls->growth_factor, ZS_UNSET_DOUBLE, 2.0);
  ZS__DEFAULT(ls->backoff_factor, ZS_UNSET_DOUBLE, 0.5);
  ZS__DEFAULT(ls->growth_interval, ZS_UNSET_INT, 2000);
  ZS__DEFAULT(ls->min_scale, ZS_UNSET_DOUBLE, 1.0);
  ZS__DEFAULT(ls->hysteresis, ZS_UNSET_INT, 1);
  zs_offload_config* of = &c->offload_optimizer;
  ZS__DEFAULT(of->device, ZS_OFFLOAD_UNSET, ZS_OFFLOAD_NONE);
  ZS__DEFAULT(of->pin_memory, ZS_UNSET_INT, 1);
  ZS__DEFAULT(of->numa, ZS_UNSET_INT, ZS_OFFLOAD_NUMA_AUTO);
  ZS__DEFAULT(of->threads, ZS_UNSET_INT, 0);
  ZS__DEFAULT(c->offload_param, ZS_OFFLOAD_UNSET, ZS_OFFLOAD_NONE);
  zs_nvme_config* nv = &c->nvme;
  ZS__DEFAULT(nv->buffer_count, ZS_UNSET_SIZE, 9);
  ZS__DEFAULT(nv->buffer_size, ZS_UNSET_SIZE, (size_t)16 << 20);
  ZS__DEFAULT(nv->sub_group_size, ZS_UNSET_SIZE, 0);
  ZS__DEFAULT(nv->queue_depth, ZS_UNSET_INT, 16);
  ZS__DEFAULT(nv->aio, ZS_AIO_UNSET, ZS_AIO_AUTO);
  ZS__DEFAULT(nv->block_size, ZS_UNSET_SIZE, (size_t)1 << 20);
  ZS__DEFAULT(nv->param_buffer_count, ZS_UNSET_SIZE, 5);
  ZS__DEFAULT(nv->param_buffer_elements, ZS_UNSET_SIZE, 0);
  ZS__DEFAULT(c->param_persistence_threshold, ZS_UNSET_SIZE, 0);
  ZS__DEFAULT(c->heartbeat_timeout_s, ZS_UNSET_DOUBLE, 30.0);
  ZS__DEFAULT(c->host_collectives, ZS_HOST_COLLECTIVES_UNSET,
              ZS_HOST_COLLECTIVES_AUTO);
  ZS__DEFAULT(c->shard_group_size, ZS_UNSET_INT, 0);
  /* (the environment wins: whole test suites run in either mode; a bad
   * value is refused by zs__config_check) */
  (void)zs__host_collectives_parse(getenv("ZS_HOST_COLLECTIVES"),
                                   &c->host_collectives);
}
#undef ZS__DEFAULT

int zs__host_collectives_parse(const char* word, zs_host_collectives* out) {
  static const char* const words[3] = {"auto", "shm", "mpi"};
  for (int k = 0; word != NULL && k < 3; k++)
    if (strcmp(word, words[k]) == 0) {
      *out = (zs_host_collectives)(ZS_HOST_COLLECTIVES_AUTO + k);
      return 1;
    }
  return 0;
}

zs_status zs__config_resolved(const zs_config* in, zs_config* out,
                              unsigned int* caller_version) {
  unsigned int version = 0;
  zs_status st = zs__config_accept(in, out, &version);
  if (st != ZS_OK) return st;
  if (caller_version != NULL) *caller_version = version;
  /* 0.1 had no UNSET values: its fields are checked as they are, as 0.1
   * did, so a value 0.1 refused that now reads as unset (INT_MIN,
   * SIZE_MAX, -1e300) is refused still instead of taking the default */
  if (version < 200) {
    zs_config check = *out;
    zs__config_resolve(&check); /* fields appended since 0.1 */
    memcpy(&check, out, ZS__CONFIG_SIZE_0_1);
    if (check.optimizer.weight_decay == ZS_WEIGHT_DECAY_DEFAULT)
      check.optimizer.weight_decay = 0.0;
    st = zs__config_check(&check);
    if (st != ZS_OK) return st;
  }
  zs__config_resolve(out);
  return ZS_OK;
}

zs_device_kind zs__config_device(const zs_config* config) {
  zs_config c;
  return zs__config_resolved(config, &c, NULL) == ZS_OK ? c.device
                                                        : ZS_DEVICE_HOST;
}

/* Writes a full config into a caller's struct of its own struct_size (a
 * size this library knows), keeping that struct_size and version. */
zs_status zs__config_give(const zs_config* full, zs_config* out) {
  zs_config check;
  zs_status st = zs__config_accept(out, &check, NULL);
  if (st != ZS_OK) return st;
  const size_t size = out->struct_size;
  const unsigned int version = out->version;
  memcpy(out, full, size);
  out->struct_size = size;
  out->version = version;
  return ZS_OK;
}

/* The defaults, readable, into a config of the given release. */
static zs_status zs__config_init(zs_config* config, size_t struct_size,
                                 unsigned int version) {
  ZS_REQUIRE(config != NULL, "zs_config_init: config is NULL");
  ZS_REQUIRE(struct_size != 0 && zs__config_known_size(version) == struct_size,
             "zs_config_init: struct_size %zu is not the size of zs_config "
             "in any release of this library (this one's is %zu)",
             struct_size, sizeof(zs_config));
  zs_config full = ZS_CONFIG_INIT;
  zs__config_resolve(&full);
  /* (weight decay stays "the optimizer's default": it follows the kind the
   * caller may still change) */
  full.optimizer.weight_decay = ZS_WEIGHT_DECAY_DEFAULT;
  memcpy(config, &full, struct_size);
  config->struct_size = struct_size;
  config->version = version;
  return ZS_OK;
}

zs_status zs_config_init_sized(zs_config* config, size_t struct_size) {
  /* the newest release whose zs_config has this size */
  unsigned int version = 0;
  for (size_t i = 0; i < ZS__NCONFIG_SIZES; i++)
    if (zs__config_sizes[i].size == struct_size &&
        zs__config_sizes[i].from_version < ZS__THIS_MINOR)
      version = zs__config_sizes[i].from_version;
  if (struct_size == sizeof(zs_config)) version = ZS_VERSION_CODE;
  return zs__config_init(config, struct_size, version);
}

/* The symbol 0.1 programs call (their header had no macro): a 0.1 config,
 * stamped 0.1, so their context keeps 0.1's output structs. */
ZS__EXPORT zs_status(zs_config_init)(zs_config* config);
zs_status(zs_config_init)(zs_config* config) {
  return zs__config_init(config, ZS__CONFIG_SIZE_0_1, 100);
}

zs_status zs_config_resolve(const zs_config* in, zs_config* out) {
  ZS_REQUIRE(in != NULL && out != NULL,
             "zs_config_resolve: in and out must not be NULL");
  zs_config full;
  zs_status st = zs__config_resolved(in, &full, NULL);
  if (st != ZS_OK) return zs__error_prefix(st, "zs_config_resolve: ");
  return zs__config_give(&full, out);
}

static int zs__finite_nonneg(double x) { return isfinite(x) && x >= 0.0; }

/* The range checks of a resolved config. */
zs_status zs__config_check(const zs_config* c) {
  ZS_REQUIRE(c->stage >= 0 && c->stage <= 3,
             "config.stage: expected 0..3, got %d", c->stage);
  ZS_REQUIRE(c->device == ZS_DEVICE_HOST || c->device == ZS_DEVICE_CUDA,
             "config.device: expected ZS_DEVICE_HOST (0) or ZS_DEVICE_CUDA "
             "(1), got %d", (int)c->device);
  const zs_optimizer_config* o = &c->optimizer;
  ZS_REQUIRE(o->kind == ZS_OPTIM_ADAMW || o->kind == ZS_OPTIM_ADAM ||
                 o->kind == ZS_OPTIM_SGD,
             "config.optimizer.kind: expected 0 (AdamW), 1 (Adam) or 2 (SGD), "
             "got %d", (int)o->kind);
  ZS_REQUIRE(zs__finite_nonneg(o->lr), "config.optimizer.lr: expected a "
             "finite value >= 0, got %g", o->lr);
  ZS_REQUIRE(zs__finite_nonneg(o->weight_decay) ||
                 o->weight_decay == ZS_WEIGHT_DECAY_DEFAULT,
             "config.optimizer.weight_decay: expected a finite value >= 0 "
             "(or ZS_WEIGHT_DECAY_DEFAULT), got %g", o->weight_decay);
  if (o->kind != ZS_OPTIM_SGD) {
    ZS_REQUIRE(o->beta1 >= 0.0 && o->beta1 < 1.0,
               "config.optimizer.beta1: expected [0, 1), got %g", o->beta1);
    ZS_REQUIRE(o->beta2 >= 0.0 && o->beta2 < 1.0,
               "config.optimizer.beta2: expected [0, 1), got %g", o->beta2);
    ZS_REQUIRE(isfinite(o->eps) && o->eps > 0.0,
               "config.optimizer.eps: expected a finite value > 0, got %g",
               o->eps);
  } else {
    ZS_REQUIRE(zs__finite_nonneg(o->momentum),
               "config.optimizer.momentum: expected a finite value >= 0, got "
               "%g", o->momentum);
    ZS_REQUIRE(isfinite(o->dampening), "config.optimizer.dampening: expected "
               "a finite value, got %g", o->dampening);
    ZS_REQUIRE(o->nesterov == 0 || o->nesterov == 1,
               "config.optimizer.nesterov: expected 0 or 1, got %d",
               o->nesterov);
    ZS_REQUIRE(!o->nesterov || (o->momentum > 0.0 && o->dampening == 0.0),
               "config.optimizer.nesterov needs momentum > 0 and dampening 0 "
               "(got momentum %g, dampening %g)", o->momentum, o->dampening);
  }
  ZS_REQUIRE(c->log_level >= ZS_LOG_ERROR && c->log_level <= ZS_LOG_DEBUG,
             "config.log_level: expected ZS_LOG_ERROR (0) .. ZS_LOG_DEBUG "
             "(3), got %d", (int)c->log_level);
  ZS_REQUIRE(c->bucket_elements >= 1 && c->bucket_elements <= 2147483647u,
             "config.bucket_elements: expected 1..2^31-1 elements, got %zu",
             c->bucket_elements);
  ZS_REQUIRE(c->prefetch_depth >= 0 && c->prefetch_depth <= 64,
             "config.prefetch_depth: expected 0..64, got %d",
             c->prefetch_depth);
  ZS_REQUIRE(c->reshard_after_forward == 0 || c->reshard_after_forward == 1,
             "config.reshard_after_forward: expected 0 or 1, got %d",
             c->reshard_after_forward);
  ZS_REQUIRE(c->reduce_order == ZS_REDUCE_FIXED ||
                 c->reduce_order == ZS_REDUCE_BACKEND,
             "config.reduce_order: expected ZS_REDUCE_FIXED (0) or "
             "ZS_REDUCE_BACKEND (1), got %d", (int)c->reduce_order);
  ZS_REQUIRE(c->host_collectives >= ZS_HOST_COLLECTIVES_AUTO &&
                 c->host_collectives <= ZS_HOST_COLLECTIVES_MPI,
             "config.host_collectives: expected ZS_HOST_COLLECTIVES_AUTO "
             "(0), _SHM (1) or _MPI (2), got %d", (int)c->host_collectives);
  {
    const char* hc = getenv("ZS_HOST_COLLECTIVES");
    zs_host_collectives ignored;
    ZS_REQUIRE(hc == NULL || zs__host_collectives_parse(hc, &ignored),
               "environment: ZS_HOST_COLLECTIVES=%s: expected auto, shm or "
               "mpi", hc);
  }
  ZS_REQUIRE(c->shard_group_size >= 0 ||
                 c->shard_group_size == ZS_SHARD_GROUP_NODE,
             "config.shard_group_size: expected a rank count (>= 1; 0: all "
             "ranks) or ZS_SHARD_GROUP_NODE (-1), got %d",
             c->shard_group_size);
  ZS_REQUIRE(c->progress_thread == 0 || c->progress_thread == 1,
             "config.progress_thread: expected 0 or 1, got %d",
             c->progress_thread);
  ZS_REQUIRE(zs__finite_nonneg(c->heartbeat_timeout_s) &&
                 (c->heartbeat_timeout_s == 0.0 ||
                  (c->heartbeat_timeout_s >= 1.0 &&
                   c->heartbeat_timeout_s <= 86400.0)),
             "config.heartbeat_timeout_s: expected 0 (off) or 1..86400 "
             "seconds, got %g", c->heartbeat_timeout_s);
  ZS_REQUIRE(zs__finite_nonneg(c->collective_timeout_s),
             "config.collective_timeout_s: expected a finite value >= 0 "
             "(0: no timeout), got %g", c->collective_timeout_s);
  ZS_REQUIRE(c->reduce_dtype == ZS_DTYPE_AUTO || c->reduce_dtype == ZS_FLOAT32,
             "config.reduce_dtype: expected ZS_DTYPE_AUTO (-1: the "
             "parameters' dtype) or ZS_FLOAT32 (%d), got %d", (int)ZS_FLOAT32,
             (int)c->reduce_dtype);
  ZS_REQUIRE(c->grad_accum_steps >= 1,
             "config.grad_accum_steps: expected >= 1 micro-batches per "
             "optimizer step, got %d", c->grad_accum_steps);
  ZS_REQUIRE(c->grad_accum_local == 0 || c->grad_accum_local == 1,
             "config.grad_accum_local: expected 0 or 1, got %d",
             c->grad_accum_local);
  ZS_REQUIRE(c->clip_grad_norm == 0 || c->clip_grad_norm == 1,
             "config.clip_grad_norm: expected 0 or 1, got %d",
             c->clip_grad_norm);
  ZS_REQUIRE(!c->clip_grad_norm ||
                 (isfinite(c->max_grad_norm) && c->max_grad_norm > 0.0),
             "config.max_grad_norm: expected a finite value > 0 when "
             "clip_grad_norm is on, got %g", c->max_grad_norm);
  const zs_offload_config* of = &c->offload_optimizer;
  ZS_REQUIRE(of->device >= ZS_OFFLOAD_NONE && of->device <= ZS_OFFLOAD_NVME,
             "config.offload_optimizer.device: expected ZS_OFFLOAD_NONE (0), "
             "_CPU (1) or _NVME (2), got %d", (int)of->device);
  ZS_REQUIRE(c->offload_param >= ZS_OFFLOAD_NONE &&
                 c->offload_param <= ZS_OFFLOAD_NVME,
             "config.offload_param: expected ZS_OFFLOAD_NONE (0), _CPU (1) or "
             "_NVME (2), got %d", (int)c->offload_param);
  if (of->device == ZS_OFFLOAD_NVME || c->offload_param == ZS_OFFLOAD_NVME) {
    const zs_nvme_config* nv = &c->nvme;
    ZS_REQUIRE(nv->path != NULL && nv->path[0] != '\0',
               "config.nvme.path: NVMe offload needs a directory for the "
               "swap files");
    /* its swap directory and files below it fit the 4096-byte path limit */
    ZS_REQUIRE(strlen(nv->path) <= 4000,
               "config.nvme.path is %zu bytes: at most 4000 (the swap files "
               "below it must fit the 4096-byte path limit)",
               strlen(nv->path));
    ZS_REQUIRE(nv->buffer_count >= 3,
               "config.nvme.buffer_count: expected >= 3 (three sub-groups in "
               "flight), got %zu", nv->buffer_count);
    ZS_REQUIRE(nv->buffer_size >= 4096 && nv->buffer_size % 4096 == 0,
               "config.nvme.buffer_size: expected a multiple of 4096 bytes "
               "(direct I/O), got %zu", nv->buffer_size);
    ZS_REQUIRE(nv->queue_depth >= 1 && nv->queue_depth <= 4096,
               "config.nvme.queue_depth: expected 1..4096, got %d",
               nv->queue_depth);
    ZS_REQUIRE(nv->block_size >= 4096 && nv->block_size % 4096 == 0,
               "config.nvme.block_size: expected a multiple of 4096 bytes, "
               "got %zu", nv->block_size);
    ZS_REQUIRE(nv->aio >= ZS_AIO_AUTO && nv->aio <= ZS_AIO_THREADS,
               "config.nvme.aio: expected ZS_AIO_AUTO (0), _IO_URING (1) or "
               "_THREADS (2), got %d", (int)nv->aio);
    ZS_REQUIRE(nv->param_buffer_count >= 1 && nv->param_buffer_count <= 4096,
               "config.nvme.param_buffer_count: expected 1..4096 parameter "
               "buffers, got %zu", nv->param_buffer_count);
    ZS_REQUIRE(nv->param_buffer_elements <= ((size_t)1 << 40),
               "config.nvme.param_buffer_elements: expected 0 (the largest "
               "shard) or a count of elements up to 2^40, got %zu",
               nv->param_buffer_elements);
  }
  ZS_REQUIRE(of->pin_memory == 0 || of->pin_memory == 1,
             "config.offload_optimizer.pin_memory: expected 0 or 1, got %d",
             of->pin_memory);
  ZS_REQUIRE(of->numa >= ZS_OFFLOAD_NUMA_INTERLEAVE,
             "config.offload_optimizer.numa: expected a node >= 0, "
             "ZS_OFFLOAD_NUMA_AUTO (-1) or ZS_OFFLOAD_NUMA_INTERLEAVE (-2), "
             "got %d", of->numa);
  ZS_REQUIRE(of->threads >= 0,
             "config.offload_optimizer.threads: expected >= 0 (0: the NUMA "
             "node's cores), got %d", of->threads);
  {
    /* the combinations a policy exists for (core_policy.c) */
    const zs__policy_in pin = {c->stage, c->device == ZS_DEVICE_HOST, 0, 1,
                               (int)of->device, (int)c->offload_param};
    zs__policy pol;
    zs_status pst = zs__policy_make(&pin, &pol);
    if (pst != ZS_OK) return pst;
  }
  const zs_loss_scaler_config* ls = &c->loss_scaler;
  ZS_REQUIRE(ls->mode == ZS_LOSS_SCALE_NONE || ls->mode == ZS_LOSS_SCALE_STATIC ||
                 ls->mode == ZS_LOSS_SCALE_DYNAMIC,
             "config.loss_scaler.mode: expected ZS_LOSS_SCALE_NONE (0), "
             "STATIC (1) or DYNAMIC (2), got %d", (int)ls->mode);
  if (ls->mode != ZS_LOSS_SCALE_NONE) {
    /* The scale and its reciprocal (the unscale coefficient) are fp32
     * numbers: fp32's normal range keeps both finite and non-zero (1e-39
     * unscaled by an infinite coefficient, silently NaN everywhere). */
    ZS_REQUIRE(ls->min_scale >= FLT_MIN && ls->min_scale <= FLT_MAX,
               "config.loss_scaler.min_scale: expected a value in fp32's "
               "normal range [%g, %g] (it and its reciprocal fit in fp32), "
               "got %g", (double)FLT_MIN, (double)FLT_MAX, ls->min_scale);
    ZS_REQUIRE(ls->init_scale >= FLT_MIN && ls->init_scale <= FLT_MAX &&
                   (ls->mode == ZS_LOSS_SCALE_STATIC ||
                    ls->init_scale >= ls->min_scale),
               "config.loss_scaler.init_scale: expected a value in fp32's "
               "normal range [%g, %g] (it and its reciprocal fit in fp32; "
               ">= min_scale %g when dynamic), got %g", (double)FLT_MIN,
               (double)FLT_MAX, ls->min_scale, ls->init_scale);
    ZS_REQUIRE(isfinite(ls->growth_factor) && ls->growth_factor > 1.0,
               "config.loss_scaler.growth_factor: expected a finite value "
               "> 1, got %g", ls->growth_factor);
    ZS_REQUIRE(ls->backoff_factor > 0.0 && ls->backoff_factor < 1.0,
               "config.loss_scaler.backoff_factor: expected (0, 1), got %g",
               ls->backoff_factor);
    ZS_REQUIRE(ls->growth_interval >= 1,
               "config.loss_scaler.growth_interval: expected >= 1 steps, got "
               "%d", ls->growth_interval);
    ZS_REQUIRE(ls->hysteresis >= 1,
               "config.loss_scaler.hysteresis: expected >= 1, got %d",
               ls->hysteresis);
  }
  return ZS_OK;
}

zs_status zs_config_validate(const zs_config* config) {
  zs_config c;
  zs_status st = zs__config_resolved(config, &c, NULL);
  return st == ZS_OK ? zs__config_check(&c) : st;
}

size_t zs__config_describe(const zs_config* c, char* buf, size_t cap) {
  const zs_optimizer_config* o = &c->optimizer;
  int n = snprintf(buf, cap,
                   "config.stage=%d\nconfig.device=%d\n"
                   "config.optimizer.kind=%d\nconfig.optimizer.lr=%.17g\n"
                   "config.optimizer.beta1=%.17g\nconfig.optimizer.beta2=%.17g\n"
                   "config.optimizer.eps=%.17g\n"
                   "config.optimizer.weight_decay=%.17g\n"
                   "config.optimizer.momentum=%.17g\n"
                   "config.optimizer.dampening=%.17g\n"
                   "config.optimizer.nesterov=%d\n"
                   "config.collective_timeout_s=%.17g\n"
                   "config.bucket_elements=%zu\nconfig.prefetch_depth=%d\n"
                   "config.max_live_elements=%zu\n"
                   "config.reshard_after_forward=%d\n"
                   "config.reduce_order=%d\nconfig.progress_thread=%d\n",
                   c->stage, (int)c->device, (int)o->kind, o->lr, o->beta1,
                   o->beta2, o->eps, o->weight_decay, o->momentum,
                   o->dampening, o->nesterov, c->collective_timeout_s,
                   c->bucket_elements, c->prefetch_depth, c->max_live_elements,
                   c->reshard_after_forward, (int)c->reduce_order,
                   c->progress_thread);
  if (n < 0) return 0;
  /* Settings of a feature that is off are not compared: ranks may differ
   * in them harmlessly. */
  const zs_loss_scaler_config* ls = &c->loss_scaler;
  char clip[64] = "off", scaler[160] = "off", offload[160] = "off";
  if (c->clip_grad_norm) snprintf(clip, sizeof clip, "%.17g", c->max_grad_norm);
  if (ls->mode != ZS_LOSS_SCALE_NONE)
    snprintf(scaler, sizeof scaler, "%d %.17g %.17g %.17g %d %.17g %d",
             (int)ls->mode, ls->init_scale, ls->growth_factor, ls->backoff_factor,
             ls->growth_interval, ls->min_scale, ls->hysteresis);
  if (c->offload_optimizer.device)
    snprintf(offload, sizeof offload, "%d %d %d %d %d %zu %zu %zu %zu %zu",
             (int)c->offload_optimizer.device, c->offload_optimizer.pin_memory,
             c->offload_optimizer.numa, c->offload_optimizer.threads,
             (int)c->offload_param, c->nvme.buffer_count, c->nvme.buffer_size,
             c->nvme.sub_group_size, c->nvme.param_buffer_count,
             c->nvme.param_buffer_elements);
  int k = snprintf(buf == NULL ? NULL : buf + ((size_t)n < cap ? (size_t)n : cap),
                   (size_t)n < cap ? cap - (size_t)n : 0,
                   "config.reduce_dtype=%d\nconfig.grad_accum_steps=%d\n"
                   "config.grad_accum_local=%d\nconfig.clip=%s\n"
                   "config.loss_scaler=%s\nconfig.offload=%s\n"
                   "config.param_persistence_threshold=%zu\n"
                   "config.heartbeat_timeout_s=%.17g\n"
                   "config.host_collectives=%d\n"
                   "config.shard_group_size=%d\n",
                   (int)c->reduce_dtype, c->grad_accum_steps, c->grad_accum_local,
                   clip, scaler, offload, c->param_persistence_threshold,
                   c->heartbeat_timeout_s, (int)c->host_collectives,
                   c->shard_group_size);
  return k < 0 ? (size_t)n : (size_t)n + (size_t)k;
}
