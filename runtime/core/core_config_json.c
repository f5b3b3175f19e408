/*
 * core_config_json.c — the DeepSpeed-style JSON form of the configuration
 * (zs_config_from_json, zs_config_from_json_file), parsed with cJSON:
 * unknown and repeated keys are errors, strings are kept for the process.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/core.h"

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
              "config JSON: zero_optimization.%s: %s%s%s %s to \"device\": "
              "\"nvme\" only and %s ignored here (device \"%s\")",
              k == 0 ? "offload_optimizer" : "offload_param",
              path ? "nvme_path" : "", path && bufs ? ", " : "",
              bufs ? "buffer_count and buffer_size" : "",
              path && !bufs ? "applies" : "apply", path && !bufs ? "is" : "are",
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
                                     "collective_timeout", "heartbeat_timeout",
                                     "host_collectives", "shard_group_size",
                                     "progress_thread",
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
        "sub_group_size", "stage3_param_persistence_threshold",
        "mics_shard_size", NULL};
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
    ZS_CHECK(zs__json_size(zero, "stage3_param_persistence_threshold", zp,
                           &c->param_persistence_threshold));
    /* DeepSpeed MiCS's shard group (-1: all ranks, as 0 here) */
    int mics = 0;
    ZS_CHECK(zs__json_int(zero, "mics_shard_size", zp, -1, 1 << 30, &mics));
    if (cJSON_GetObjectItemCaseSensitive(zero, "mics_shard_size") != NULL)
      c->shard_group_size = mics < 0 ? 0 : mics;
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
  ZS_CHECK(zs__json_number(root, "heartbeat_timeout", "",
                           &c->heartbeat_timeout_s));
  ZS_CHECK(zs__json_int(root, "progress_thread", "", 0, 1, &c->progress_thread));
  const cJSON* hc = cJSON_GetObjectItemCaseSensitive(root, "host_collectives");
  if (hc != NULL &&
      !zs__host_collectives_parse(cJSON_GetStringValue(hc),
                                  &c->host_collectives))
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "config JSON: host_collectives: expected \"auto\", \"shm\" or "
            "\"mpi\"");
  const cJSON* sg = cJSON_GetObjectItemCaseSensitive(root, "shard_group_size");
  const cJSON* zs0 = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
  if (sg != NULL && cJSON_IsObject(zs0) &&
      cJSON_GetObjectItemCaseSensitive(zs0, "mics_shard_size") != NULL)
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "config JSON: shard_group_size and "
            "zero_optimization.mics_shard_size both set the shard group: "
            "give one");
  if (cJSON_IsString(sg) && strcasecmp(sg->valuestring, "node") == 0)
    c->shard_group_size = ZS_SHARD_GROUP_NODE;
  else if (sg != NULL && !cJSON_IsNumber(sg))
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "config JSON: shard_group_size: expected a rank count or "
            "\"node\"");
  else
    ZS_CHECK(zs__json_int(root, "shard_group_size", "", 0, 1 << 30,
                          &c->shard_group_size));
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
    /* The scale is written when a key says it (loss_scale > 0: that
     * scale; initial_scale_power: 2^power), or when the block turns the
     * scaler dynamic from another mode (DeepSpeed's default 2^16); a
     * dynamic scaler set in C keeps its init_scale otherwise. */
    const int scale_given =
        cJSON_GetObjectItemCaseSensitive(fp16, "loss_scale") != NULL;
    if (!enabled) {
      ls->mode = ZS_LOSS_SCALE_NONE;
    } else if (fixed > 0.0) {
      if (power >= 0)
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                "config JSON: fp16.initial_scale_power %d applies to dynamic "
                "loss scaling, but the loss scale is static (%s %g): set "
                "fp16.loss_scale to 0 for dynamic scaling, or drop "
                "initial_scale_power", power,
                scale_given ? "fp16.loss_scale" : "config.loss_scaler, scale",
                fixed);
      ls->mode = ZS_LOSS_SCALE_STATIC;
      if (scale_given) ls->init_scale = fixed;
    } else {
      ls->mode = ZS_LOSS_SCALE_DYNAMIC;
      if (power >= 0)
        ls->init_scale = ldexp(1.0, power);
      else if (now->mode != ZS_LOSS_SCALE_DYNAMIC)
        ls->init_scale = ldexp(1.0, 16);
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
  /* a key whose field the caller's release lacks would be lost */
  static const struct {
    const char* block;
    const char* key;
    size_t end;
    const char* release; /* that added its field */
  } newer[] = {
      {"zero_optimization", "stage3_param_persistence_threshold",
       offsetof(zs_config, param_persistence_threshold) + sizeof(size_t), "0.3"},
      {NULL, "heartbeat_timeout",
       offsetof(zs_config, heartbeat_timeout_s) + sizeof(double), "0.3"},
      {NULL, "host_collectives",
       offsetof(zs_config, host_collectives) + sizeof(zs_host_collectives), "0.3"},
      {NULL, "shard_group_size",
       offsetof(zs_config, shard_group_size) + sizeof(int), "0.4"},
      {"zero_optimization", "mics_shard_size",
       offsetof(zs_config, shard_group_size) + sizeof(int), "0.4"},
  };
  for (size_t i = 0; st == ZS_OK && i < sizeof newer / sizeof *newer; i++) {
    const cJSON* o = newer[i].block != NULL
                         ? cJSON_GetObjectItemCaseSensitive(root, newer[i].block)
                         : root;
    if (config->struct_size < newer[i].end && cJSON_IsObject(o) &&
        cJSON_GetObjectItemCaseSensitive(o, newer[i].key) != NULL)
      st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config JSON: %s%s%s: this program's zs_config (version "
                     "%u.%u, %zu bytes) has no field for it (%s added it): "
                     "rebuild against this library's header, or drop the key",
                     newer[i].block != NULL ? newer[i].block : "",
                     newer[i].block != NULL ? "." : "", newer[i].key,
                     config->version / 10000, config->version / 100 % 100,
                     config->struct_size, newer[i].release);
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
