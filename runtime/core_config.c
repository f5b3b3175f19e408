/*
 * core_config.c — configuration defaults, range checks (errors name the
 * field) and the DeepSpeed-style JSON form, parsed with cJSON.
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

#include "runtime/core.h"

/* ==== Versions and frozen layouts ========================================= */

/* zs_config's size in each header release: fields are only appended, so a
 * release's struct is the prefix of this library's of that size (docs/api.md,
 * "Versions and compatibility"). The 0.1 fields end with nvme. */
#define ZS__ALIGN_UP(n, a) (((n) + (a) - 1) / (a) * (a))
#define ZS__CONFIG_SIZE_0_1                                        \
  ZS__ALIGN_UP(offsetof(zs_config, nvme) + sizeof(zs_nvme_config), \
               _Alignof(zs_config))
/* 0.2 appended nothing. */
#define ZS__CONFIG_SIZE_0_2 ZS__CONFIG_SIZE_0_1
/* The releases before this library's minor version, oldest first; this
 * minor's own size is sizeof(zs_config). A release that appends fields
 * adds its predecessor's size here as a constant. */
static const struct {
  unsigned int from_version; /* ZS_VERSION_CODE of the first release */
  size_t size;
} zs__config_sizes[] = {
    {100, ZS__CONFIG_SIZE_0_1},
    {200, ZS__CONFIG_SIZE_0_2},
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
#if ZS_VERSION_MAJOR == 0 && ZS_VERSION_MINOR == 2
_Static_assert(sizeof(zs_config) == ZS__CONFIG_SIZE_0_2,
               "0.2's zs_config is what this table says");
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
}
#undef ZS__DEFAULT

zs_status zs__config_resolved(const zs_config* in, zs_config* out,
                              unsigned int* caller_version) {
  zs_status st = zs__config_accept(in, out, caller_version);
  if (st == ZS_OK) zs__config_resolve(out);
  return st;
}

zs_device_kind zs__config_device(const zs_config* config) {
  zs_config c;
  return zs__config_resolved(config, &c, NULL) == ZS_OK ? c.device
                                                        : ZS_DEVICE_HOST;
}

/* Writes a full config into a caller's struct of its own struct_size (a
 * size this library knows), keeping that struct_size and version. */
static zs_status zs__config_give(const zs_config* full, zs_config* out) {
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
  ZS_REQUIRE(zs__config_known_size(version) == struct_size,
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
zs_status(zs_config_init)(zs_config* config);
zs_status(zs_config_init)(zs_config* config) {
  return zs__config_init(config, ZS__CONFIG_SIZE_0_1, 100);
}

zs_status zs_config_resolve(const zs_config* in, zs_config* out) {
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
  ZS_REQUIRE(c->progress_thread == 0 || c->progress_thread == 1,
             "config.progress_thread: expected 0 or 1, got %d",
             c->progress_thread);
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
  ZS_REQUIRE(c->offload_param == ZS_OFFLOAD_NONE ||
                 (c->stage == 3 && of->device != ZS_OFFLOAD_NONE),
             "config.offload_param: expected none, or cpu / nvme with stage "
             "3 and offload_optimizer.device cpu or nvme (got %d at stage "
             "%d, offload_optimizer.device %d)", (int)c->offload_param,
             c->stage, (int)of->device);
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
                   "config.loss_scaler=%s\nconfig.offload=%s\n",
                   (int)c->reduce_dtype, c->grad_accum_steps, c->grad_accum_local,
                   clip, scaler, offload);
  return k < 0 ? (size_t)n : (size_t)n + (size_t)k;
}

/* ==== JSON ================================================================ */

/* Checks that every key of obj is in `allowed` (NULL-terminated) and none
 * is given twice, so a typo or a repeated setting is an error rather than
 * silently ignored (cJSON keeps both and its lookups see the first). */
static zs_status zs__json_known_keys(const cJSON* obj, const char* path,
                                     const char* const* allowed) {
  for (const cJSON* it = obj->child; it != NULL; it = it->next) {
    int ok = 0;
    for (const char* const* a = allowed; *a != NULL; a++)
      if (strcmp(*a, it->string) == 0) ok = 1;
    if (!ok)
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "config JSON: unknown key \"%s%s%s\"", path,
                       path[0] != '\0' ? "." : "", it->string);
    for (const cJSON* e = obj->child; e != it; e = e->next)
      if (strcmp(e->string, it->string) == 0)
        return zs__error(ZS_ERR_INVALID_ARGUMENT,
                         "config JSON: \"%s%s%s\" is given twice (give each "
                         "key once: one value would be silently ignored)",
                         path, path[0] != '\0' ? "." : "", it->string);
  }
  return ZS_OK;
}

static zs_status zs__json_number(const cJSON* obj, const char* key,
                                 const char* path, double* out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL) return ZS_OK;
  if (!cJSON_IsNumber(v))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s%s%s: expected a number", path,
                     path[0] != '\0' ? "." : "", key);
  *out = v->valuedouble;
  return ZS_OK;
}

/* A non-negative integer count (e.g. elements), up to 2^53. */
static zs_status zs__json_size(const cJSON* obj, const char* key,
                               const char* path, size_t* out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL) return ZS_OK;
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
      v->valuedouble > 9007199254740992.0 ||
      v->valuedouble != floor(v->valuedouble))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s.%s: expected a non-negative integer "
                     "up to 2^53", path, key);
  *out = (size_t)v->valuedouble;
  return ZS_OK;
}

static zs_status zs__json_int(const cJSON* obj, const char* key,
                              const char* path, int lo, int hi, int* out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL) return ZS_OK;
  if (cJSON_IsBool(v) && lo == 0 && hi == 1) { /* a flag (nesterov) only */
    *out = cJSON_IsTrue(v) ? 1 : 0;
  } else if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
             v->valuedouble < lo || v->valuedouble > hi) {
    char got[64];
    if (cJSON_IsNumber(v))
      snprintf(got, sizeof got, "%g", v->valuedouble);
    else
      snprintf(got, sizeof got, "a %s", cJSON_IsBool(v)     ? "boolean"
                                        : cJSON_IsString(v) ? "string"
                                                            : "non-number");
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s%s%s: expected an integer %d..%d, got %s",
                     path, path[0] != '\0' ? "." : "", key, lo, hi, got);
  } else {
    *out = (int)v->valuedouble;
  }
  return ZS_OK;
}

static zs_status zs__json_optimizer(const cJSON* opt, zs_optimizer_config* o) {
  zs_status st = ZS_OK;
  static const char* const keys[] = {"type", "params", NULL};
  ZS_CHECK(zs__json_known_keys(opt, "optimizer", keys));
  const cJSON* type = cJSON_GetObjectItemCaseSensitive(opt, "type");
  if (type != NULL) {
    if (!cJSON_IsString(type))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: optimizer.type: expected a string");
    if (strcasecmp(type->valuestring, "AdamW") == 0) o->kind = ZS_OPTIM_ADAMW;
    else if (strcasecmp(type->valuestring, "Adam") == 0) o->kind = ZS_OPTIM_ADAM;
    else if (strcasecmp(type->valuestring, "SGD") == 0) o->kind = ZS_OPTIM_SGD;
    else
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: optimizer.type: expected \"AdamW\", \"Adam\" or "
              "\"SGD\", got \"%s\"", type->valuestring);
  }
  const cJSON* p = cJSON_GetObjectItemCaseSensitive(opt, "params");
  if (p == NULL) goto cleanup;
  if (!cJSON_IsObject(p))
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "config JSON: optimizer.params: expected an object");
  static const char* const pkeys[] = {"lr",       "betas",     "eps",
                                      "weight_decay", "momentum", "dampening",
                                      "nesterov", NULL};
  ZS_CHECK(zs__json_known_keys(p, "optimizer.params", pkeys));
  const char* path = "optimizer.params";
  ZS_CHECK(zs__json_number(p, "lr", path, &o->lr));
  ZS_CHECK(zs__json_number(p, "eps", path, &o->eps));
  ZS_CHECK(zs__json_number(p, "weight_decay", path, &o->weight_decay));
  /* (-1 is the C API's "the optimizer's default"; JSON has no sentinel) */
  if (cJSON_GetObjectItemCaseSensitive(p, "weight_decay") != NULL &&
      !(o->weight_decay >= 0))
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: "
            "optimizer.params.weight_decay: expected a number >= 0, got %g "
            "(leave it out for the optimizer's default)", o->weight_decay);
  ZS_CHECK(zs__json_number(p, "momentum", path, &o->momentum));
  ZS_CHECK(zs__json_number(p, "dampening", path, &o->dampening));
  ZS_CHECK(zs__json_int(p, "nesterov", path, 0, 1, &o->nesterov));
  const cJSON* betas = cJSON_GetObjectItemCaseSensitive(p, "betas");
  if (betas != NULL) {
    if (!cJSON_IsArray(betas) || cJSON_GetArraySize(betas) != 2 ||
        !cJSON_IsNumber(cJSON_GetArrayItem(betas, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(betas, 1)))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: optimizer.params.betas: expected [beta1, beta2]");
    o->beta1 = cJSON_GetArrayItem(betas, 0)->valuedouble;
    o->beta2 = cJSON_GetArrayItem(betas, 1)->valuedouble;
  }
cleanup:
  return st;
}

/* "device": "none" | "cpu" (| "nvme" where nvme_ok) of an offload block;
 * *out unchanged if absent. */
static zs_status zs__json_offload_device(const cJSON* o, const char* path,
                                         zs_offload_device* out) {
  const cJSON* d = cJSON_GetObjectItemCaseSensitive(o, "device");
  if (d == NULL) return ZS_OK;
  if (cJSON_IsString(d) && strcasecmp(d->valuestring, "cpu") == 0)
    *out = ZS_OFFLOAD_CPU;
  else if (cJSON_IsString(d) && strcasecmp(d->valuestring, "none") == 0)
    *out = ZS_OFFLOAD_NONE;
  else if (cJSON_IsString(d) && strcasecmp(d->valuestring, "nvme") == 0)
    *out = ZS_OFFLOAD_NVME;
  else
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s.device: expected \"none\", \"cpu\" or "
                     "\"nvme\"", path);
  return ZS_OK;
}

/* A string from a config file, kept for the life of the process (the
 * config struct holds a pointer and has no destructor): each distinct
 * value once, in a hash set that grows as needed (an earlier fixed table
 * of 64 failed the 65th distinct path). NULL if out of memory. */
typedef struct zs__kept {
  char** slots; /* open addressing, NULL: empty */
  size_t cap;   /* a power of two */
  size_t n;
} zs__kept;

static size_t zs__kept_find(const zs__kept* k, const char* v, uint64_t h) {
  size_t i = (size_t)h & (k->cap - 1);
  while (k->slots[i] != NULL && strcmp(k->slots[i], v) != 0)
    i = (i + 1) & (k->cap - 1);
  return i;
}

static const char* zs__json_keep(const char* v) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static zs__kept kept;
  const uint64_t h = zs__hash_bytes(ZS__FNV_SEED, v, strlen(v));
  const char* out = NULL;
  pthread_mutex_lock(&lock);
  if (kept.cap == 0 || 2 * (kept.n + 1) > kept.cap) { /* grow: load <= 1/2 */
    zs__kept bigger = {NULL, kept.cap == 0 ? 64 : 2 * kept.cap, kept.n};
    bigger.slots = (char**)calloc(bigger.cap, sizeof *bigger.slots);
    if (bigger.slots == NULL) goto out;
    for (size_t i = 0; i < kept.cap; i++)
      if (kept.slots[i] != NULL) {
        const char* s = kept.slots[i];
        bigger.slots[zs__kept_find(&bigger, s,
                                   zs__hash_bytes(ZS__FNV_SEED, s,
                                                  strlen(s)))] = kept.slots[i];
      }
    free(kept.slots);
    kept = bigger;
  }
  const size_t at = zs__kept_find(&kept, v, h);
  if (kept.slots[at] == NULL && (kept.slots[at] = strdup(v)) != NULL) kept.n++;
  out = kept.slots[at];
out:
  pthread_mutex_unlock(&lock);
  return out;
}

/* An offload section's "nvme_path". The optimizer states and the
 * parameter shards share one swap directory: a second, different path is
 * an error rather than silently ignored. */
static zs_status zs__json_nvme_path(const cJSON* o, const char* p,
                                    const char** path) {
  /* *path: the other section's, or NULL */
  const cJSON* np = cJSON_GetObjectItemCaseSensitive(o, "nvme_path");
  if (np == NULL) return ZS_OK;
  if (!cJSON_IsString(np) || np->valuestring[0] == '\0')
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s.nvme_path: expected a directory's path "
                     "(a non-empty string)", p);
  if (*path != NULL && strcmp(*path, np->valuestring) != 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s.nvme_path '%s' differs from the other "
                     "offload section's '%s': the optimizer states and the "
                     "parameter shards share one swap directory", p,
                     np->valuestring, *path);
  if ((*path = zs__json_keep(np->valuestring)) == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "config JSON: %s.nvme_path", p);
  return ZS_OK;
}

/* zero_optimization.offload_optimizer / offload_param (DeepSpeed's keys,
 * with "numa" and "threads" added). */
static zs_status zs__json_offload(const cJSON* zero, zs_config* c,
                                  const zs_config* r) {
  zs_status st = ZS_OK;
  const char* nvme_path = NULL; /* this file's, from either section */
  const cJSON* oo = cJSON_GetObjectItemCaseSensitive(zero, "offload_optimizer");
  if (oo != NULL) {
    const char* p = "zero_optimization.offload_optimizer";
    if (!cJSON_IsObject(oo))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: %s: expected an object", p);
    static const char* const keys[] = {"device", "pin_memory", "numa",
                                       "threads", "nvme_path",
                                       "buffer_count", "buffer_size", NULL};
    ZS_CHECK(zs__json_known_keys(oo, p, keys));
    ZS_CHECK(zs__json_offload_device(oo, p, &c->offload_optimizer.device));
    ZS_CHECK(zs__json_nvme_path(oo, p, &nvme_path));
    ZS_CHECK(zs__json_size(oo, "buffer_count", p, &c->nvme.buffer_count));
    ZS_CHECK(zs__json_size(oo, "buffer_size", p, &c->nvme.buffer_size));
    ZS_CHECK(zs__json_int(oo, "pin_memory", p, 0, 1,
                          &c->offload_optimizer.pin_memory));
    ZS_CHECK(zs__json_int(oo, "threads", p, 0, 4096,
                          &c->offload_optimizer.threads));
    const cJSON* n = cJSON_GetObjectItemCaseSensitive(oo, "numa");
    if (n != NULL) {
      if (cJSON_IsString(n) && strcasecmp(n->valuestring, "auto") == 0)
        c->offload_optimizer.numa = ZS_OFFLOAD_NUMA_AUTO;
      else if (cJSON_IsString(n) && strcasecmp(n->valuestring, "interleave") == 0)
        c->offload_optimizer.numa = ZS_OFFLOAD_NUMA_INTERLEAVE;
      else
        ZS_CHECK(zs__json_int(oo, "numa", p, 0, 4096, &c->offload_optimizer.numa));
    }
  }
  const cJSON* op = cJSON_GetObjectItemCaseSensitive(zero, "offload_param");
  if (op != NULL) {
    const char* p = "zero_optimization.offload_param";
    if (!cJSON_IsObject(op))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: %s: expected an object", p);
    static const char* const keys[] = {"device", "nvme_path", "buffer_count",
                                       "buffer_size", NULL};
    ZS_CHECK(zs__json_known_keys(op, p, keys));
    ZS_CHECK(zs__json_offload_device(op, p, &c->offload_param));
    ZS_CHECK(zs__json_nvme_path(op, p, &nvme_path));
    ZS_CHECK(zs__json_size(op, "buffer_count", p, &c->nvme.param_buffer_count));
    /* DeepSpeed's offload_param.buffer_size counts elements */
    ZS_CHECK(zs__json_size(op, "buffer_size", p, &c->nvme.param_buffer_elements));
  }
  if (nvme_path != NULL) c->nvme.path = nvme_path;
  /* DeepSpeed accepts the NVMe keys of a section that offloads elsewhere
   * (and so do we, so its files load), but says nothing: say so here */
  const zs_offload_device opt =
      c->offload_optimizer.device != ZS_OFFLOAD_UNSET
          ? c->offload_optimizer.device : r->offload_optimizer.device;
  const zs_offload_device par =
      c->offload_param != ZS_OFFLOAD_UNSET ? c->offload_param : r->offload_param;
  for (int k = 0; k < 2; k++) {
    const cJSON* o = k == 0 ? oo : op;
    const zs_offload_device dev = k == 0 ? opt : par;
    if (o == NULL || dev == ZS_OFFLOAD_NVME) continue;
    const int path = cJSON_GetObjectItemCaseSensitive(o, "nvme_path") != NULL &&
                     opt != ZS_OFFLOAD_NVME && par != ZS_OFFLOAD_NVME;
    const int bufs = cJSON_GetObjectItemCaseSensitive(o, "buffer_count") != NULL ||
                     cJSON_GetObjectItemCaseSensitive(o, "buffer_size") != NULL;
    if (path || bufs)
      zs__log(ZS_LOG_WARN,
              "config JSON: zero_optimization.%s: %s%s%s apply to \"device\": "
              "\"nvme\" only and are ignored here (device \"%s\")",
              k == 0 ? "offload_optimizer" : "offload_param",
              path ? "nvme_path" : "", path && bufs ? ", " : "",
              bufs ? "buffer_count and buffer_size" : "",
              dev == ZS_OFFLOAD_CPU ? "cpu" : "none");
  }
cleanup:
  return st;
}

/* Applies the JSON to c, which may hold UNSET fields; r is c resolved (the
 * current values the keys that depend on them read). A field is written
 * only when its key is given. */
static zs_status zs__json_apply(const cJSON* root, zs_config* c,
                                const zs_config* r) {
  zs_status st = ZS_OK;
  if (!cJSON_IsObject(root))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: the top level must be an object");
  static const char* const keys[] = {"zero_optimization", "device",
                                     "optimizer", "log_level",
                                     "collective_timeout", "progress_thread",
                                     "communication_data_type",
                                     "gradient_accumulation_steps",
                                     "gradient_accumulation_local",
                                     "gradient_clipping", "fp16", "aio", NULL};
  ZS_CHECK(zs__json_known_keys(root, "", keys));
  const cJSON* zero = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
  if (zero != NULL) {
    if (!cJSON_IsObject(zero))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: zero_optimization: expected an object");
    static const char* const zkeys[] = {
        "stage", "reduce_bucket_size", "prefetch_depth",
        "stage3_max_live_parameters", "reshard_after_forward",
        "deterministic_reduction", "offload_optimizer", "offload_param",
        "sub_group_size", NULL};
    const char* zp = "zero_optimization";
    ZS_CHECK(zs__json_known_keys(zero, zp, zkeys));
    ZS_CHECK(zs__json_int(zero, "stage", zp, 0, 3, &c->stage));
    ZS_CHECK(zs__json_size(zero, "reduce_bucket_size", zp, &c->bucket_elements));
    ZS_CHECK(zs__json_int(zero, "prefetch_depth", zp, 0, 64, &c->prefetch_depth));
    ZS_CHECK(zs__json_size(zero, "sub_group_size", zp, &c->nvme.sub_group_size));
    ZS_CHECK(zs__json_size(zero, "stage3_max_live_parameters", zp,
                           &c->max_live_elements));
    ZS_CHECK(zs__json_int(zero, "reshard_after_forward", zp, 0, 1,
                          &c->reshard_after_forward));
    int det = r->reduce_order == ZS_REDUCE_FIXED;
    ZS_CHECK(zs__json_int(zero, "deterministic_reduction", zp, 0, 1, &det));
    if (cJSON_GetObjectItemCaseSensitive(zero, "deterministic_reduction"))
      c->reduce_order = det ? ZS_REDUCE_FIXED : ZS_REDUCE_BACKEND;
    ZS_CHECK(zs__json_offload(zero, c, r));
  }
  const cJSON* dev = cJSON_GetObjectItemCaseSensitive(root, "device");
  if (dev != NULL) {
    if (cJSON_IsString(dev) && strcasecmp(dev->valuestring, "host") == 0)
      c->device = ZS_DEVICE_HOST;
    else if (cJSON_IsString(dev) && strcasecmp(dev->valuestring, "cuda") == 0)
      c->device = ZS_DEVICE_CUDA;
    else
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: device: expected \"host\" or \"cuda\"");
  }
  const cJSON* opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  if (opt != NULL) {
    if (!cJSON_IsObject(opt))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: optimizer: expected an object");
    ZS_CHECK(zs__json_optimizer(opt, &c->optimizer));
  }
  int level = (int)r->log_level;
  ZS_CHECK(zs__json_int(root, "log_level", "", 0, 3, &level));
  if (cJSON_GetObjectItemCaseSensitive(root, "log_level") != NULL)
    c->log_level = (zs_log_level)level;
  ZS_CHECK(zs__json_number(root, "collective_timeout", "",
                           &c->collective_timeout_s));
  ZS_CHECK(zs__json_int(root, "progress_thread", "", 0, 1, &c->progress_thread));
  const cJSON* cdt = cJSON_GetObjectItemCaseSensitive(root,
                                                      "communication_data_type");
  if (cdt != NULL) {
    if (cJSON_IsString(cdt) && (strcasecmp(cdt->valuestring, "fp32") == 0 ||
                                strcasecmp(cdt->valuestring, "float32") == 0))
      c->reduce_dtype = ZS_FLOAT32;
    else if (cJSON_IsNull(cdt))
      c->reduce_dtype = ZS_DTYPE_AUTO;
    else
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: communication_data_type: expected \"fp32\" or "
              "null (the parameters' dtype)");
  }
  ZS_CHECK(zs__json_int(root, "gradient_accumulation_steps", "", 1, 1 << 30,
                        &c->grad_accum_steps));
  ZS_CHECK(zs__json_int(root, "gradient_accumulation_local", "", 0, 1,
                        &c->grad_accum_local));
  /* DeepSpeed: gradient_clipping 0 disables clipping. */
  if (cJSON_GetObjectItemCaseSensitive(root, "gradient_clipping") != NULL) {
    double clip = 0.0;
    ZS_CHECK(zs__json_number(root, "gradient_clipping", "", &clip));
    if (!isfinite(clip) || clip < 0.0)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: gradient_clipping: expected a finite value >= 0 "
              "(0 disables clipping), got %g", clip);
    c->clip_grad_norm = clip > 0.0;
    if (clip > 0.0) c->max_grad_norm = clip;
  }
  /* DeepSpeed's "aio" block (NVMe offload's I/O), with "backend" added */
  const cJSON* aio = cJSON_GetObjectItemCaseSensitive(root, "aio");
  if (aio != NULL) {
    if (!cJSON_IsObject(aio))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: aio: expected an object");
    static const char* const akeys[] = {"block_size", "queue_depth", "backend",
                                        NULL};
    ZS_CHECK(zs__json_known_keys(aio, "aio", akeys));
    ZS_CHECK(zs__json_size(aio, "block_size", "aio", &c->nvme.block_size));
    ZS_CHECK(zs__json_int(aio, "queue_depth", "aio", 1, 4096, &c->nvme.queue_depth));
    const cJSON* b = cJSON_GetObjectItemCaseSensitive(aio, "backend");
    if (b != NULL) {
      if (cJSON_IsString(b) && strcasecmp(b->valuestring, "auto") == 0)
        c->nvme.aio = ZS_AIO_AUTO;
      else if (cJSON_IsString(b) && strcasecmp(b->valuestring, "io_uring") == 0)
        c->nvme.aio = ZS_AIO_IO_URING;
      else if (cJSON_IsString(b) && strcasecmp(b->valuestring, "threads") == 0)
        c->nvme.aio = ZS_AIO_THREADS;
      else
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: aio.backend: expected "
                "\"auto\", \"io_uring\" or \"threads\"");
    }
  }
  const cJSON* fp16 = cJSON_GetObjectItemCaseSensitive(root, "fp16");
  if (fp16 != NULL) {
    if (!cJSON_IsObject(fp16))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "config JSON: fp16: expected an object");
    static const char* const fkeys[] = {"enabled", "loss_scale",
                                        "initial_scale_power",
                                        "loss_scale_window", "hysteresis",
                                        "min_loss_scale", NULL};
    ZS_CHECK(zs__json_known_keys(fp16, "fp16", fkeys));
    zs_loss_scaler_config* ls = &c->loss_scaler;
    const zs_loss_scaler_config* now = &r->loss_scaler;
    int enabled = now->mode != ZS_LOSS_SCALE_NONE;
    ZS_CHECK(zs__json_int(fp16, "enabled", "fp16", 0, 1, &enabled));
    /* DeepSpeed: loss_scale 0 is dynamic, starting at 2^initial_scale_power */
    double fixed = now->mode == ZS_LOSS_SCALE_STATIC ? now->init_scale : 0.0;
    ZS_CHECK(zs__json_number(fp16, "loss_scale", "fp16", &fixed));
    int power = -1;
    ZS_CHECK(zs__json_int(fp16, "initial_scale_power", "fp16", 0, 64,
                          &power));
    ZS_CHECK(zs__json_int(fp16, "loss_scale_window", "fp16", 1, 1 << 30,
                          &ls->growth_interval));
    ZS_CHECK(zs__json_int(fp16, "hysteresis", "fp16", 1, 1 << 30,
                          &ls->hysteresis));
    ZS_CHECK(zs__json_number(fp16, "min_loss_scale", "fp16", &ls->min_scale));
    if (!isfinite(fixed) || fixed < 0.0)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: fp16.loss_scale: expected 0 (dynamic) or a "
              "finite value > 0, got %g", fixed);
    /* Loss-scaling keys without "enabled": true would be ignored by
     * DeepSpeed; here that is an error (a silently ignored setting). */
    if (cJSON_GetObjectItemCaseSensitive(fp16, "enabled") == NULL &&
        now->mode == ZS_LOSS_SCALE_NONE && fp16->child != NULL)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config JSON: fp16: loss-scaling keys without \"enabled\": "
              "true (set it, or remove the fp16 block)");
    if (!enabled) {
      ls->mode = ZS_LOSS_SCALE_NONE;
    } else if (fixed > 0.0) {
      ls->mode = ZS_LOSS_SCALE_STATIC;
      ls->init_scale = fixed;
    } else {
      /* DeepSpeed: dynamic from 2^initial_scale_power, default 16 */
      ls->mode = ZS_LOSS_SCALE_DYNAMIC;
      ls->init_scale = ldexp(1.0, power >= 0 ? power : 16);
    }
  }
cleanup:
  return st;
}

zs_status zs_config_from_json(const char* text, zs_config* config) {
  ZS_REQUIRE(text != NULL && config != NULL,
             "zs_config_from_json: text and config must not be NULL");
  const char* end = NULL;
  cJSON* root = cJSON_ParseWithOpts(text, &end, 1);
  if (root == NULL) {
    size_t off = end != NULL && end >= text ? (size_t)(end - text) : 0;
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: parse error at byte %zu", off);
  }
  /* work: the caller's config at full size, UNSET fields kept (they take
   * the defaults when used); *config unchanged on error */
  zs_config work, now;
  zs_status st = zs__config_accept(config, &work, NULL);
  if (st == ZS_OK) {
    now = work;
    zs__config_resolve(&now);
    st = zs__json_apply(root, &work, &now);
  }
  if (st == ZS_OK) {
    now = work;
    zs__config_resolve(&now);
    st = zs__config_check(&now);
  }
  if (st == ZS_OK) st = zs__config_give(&work, config);
  cJSON_Delete(root);
  return st;
}

zs_status zs_config_from_json_file(const char* path, zs_config* config) {
  ZS_REQUIRE(path != NULL && config != NULL,
             "zs_config_from_json_file: path and config must not be NULL");
  zs_status st = ZS_OK;
  char* text = NULL;
  FILE* f = fopen(path, "rb");
  if (f == NULL)
    ZS_FAIL(ZS_ERR_IO, "config file %s: %s", path, strerror(errno));
  if (fseek(f, 0, SEEK_END) != 0)
    ZS_FAIL(ZS_ERR_IO, "config file %s: cannot seek", path);
  long size = ftell(f);
  if (size < 0 || size > (1L << 24))
    ZS_FAIL(ZS_ERR_IO, "config file %s: unreadable or larger than 16 MiB",
            path);
  rewind(f);
  text = (char*)malloc((size_t)size + 1);
  if (text == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "config file %s", path);
  if (fread(text, 1, (size_t)size, f) != (size_t)size)
    ZS_FAIL(ZS_ERR_IO, "config file %s: short read", path);
  text[size] = '\0';
  st = zs_config_from_json(text, config);
  if (st != ZS_OK) st = zs__error_prefix(st, "%s: ", path);
cleanup:
  free(text);
  if (f != NULL) fclose(f);
  return st;
}
