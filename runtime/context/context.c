/*
 * context.c — context creation over a communicator: config validation and
 * the cross-rank config check, accounting, device backends, CPU offload;
 * its queries (memory, communication log and counters) and teardown.
 */
#define _GNU_SOURCE
#include "runtime/context/context.h"

#include "offload/offload.h"
#include "runtime/core/core_compat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

zs_status zs__context_create(const zs_config* config, zs__comm* comm,
                             zs_context** out) {
  zs_status st = ZS_OK;
  zs_context* ctx = (zs_context*)calloc(1, sizeof *ctx);
  if (ctx == NULL) {
    zs__comm_destroy(comm);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "context: calloc");
  }
  ctx->comm = comm;
  ctx->rank = comm->rank;
  ctx->world = comm->world;
  ctx->shard_comm = comm; /* (until zs__context_set_groups) */
  ctx->shard_rank = comm->rank;
  ctx->shard_ranks = comm->world;
  ctx->replicas = 1;
  zs__set_log_rank(comm->world > 1 ? comm->rank : -1);
  /* The communication log records from the first collective on (the
   * configuration check below); a failed allocation is reported after it. */
  comm->log = (zs__comm_log_entry*)calloc(ZS__COMM_LOG_CAP, sizeof *comm->log);
  comm->log_t0 = zs__now();

  /* A rank whose config is invalid still joins the check, describing its
   * error instead (without the rank prefix, so that the same error on every
   * rank is not a mismatch), so every rank fails together. */
  char desc[2048];
  zs_config resolved;
  zs_status valid = zs__config_resolved(config, &resolved, &ctx->caller_version);
  if (valid == ZS_OK) valid = zs__config_check(&resolved);
  if (valid == ZS_OK) {
    zs__config_describe(&resolved, desc, sizeof desc);
  } else {
    snprintf(desc, sizeof desc, "invalid config: %s\n", zs__error_body());
  }
  char saved[2048];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  ZS_CHECK(zs__comm_check_same(comm, "configuration", desc, strlen(desc)));
  if (valid != ZS_OK) ZS_FAIL(valid, "%s", saved);
  ctx->config = resolved;
  /* zs_context_config gives it back stamped with the caller's release, so
   * a copy of it makes a context that keeps that release's layouts */
  ctx->config.version = ctx->caller_version;
  ctx->config.struct_size = zs__config_known_size(ctx->caller_version);
  comm->timeout_s = resolved.collective_timeout_s;
  zs__log_set_level(resolved.log_level);

  ZS_CHECK(zs__accounting_create(&ctx->acct));
  ZS_CHECK(zs__device_create(resolved.device, ctx->acct, comm->local_rank,
                             comm->local_size, &ctx->device));
  ctx->device->hold_memory = &comm->failed;
  ctx->host = ctx->device;
  if (ctx->device->kind != ZS_DEVICE_HOST) {
    ZS_CHECK(zs__device_host_create(ctx->acct, &ctx->host));
    ctx->host->hold_memory = &comm->failed;
  }
  comm->dev = ctx->device;
  if (comm->log == NULL)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "context: communication log");
  ZS_CHECK(zs__accounting_add(ctx->acct, ZS__OWNER_RUNTIME, ZS_MEM_OTHER,
                              comm->log,
                              ZS__COMM_LOG_CAP * sizeof *comm->log,
                              "communication log"));
  ctx->log_counted = 1;
  /* Profiling: ZS_PROFILE=DIR, else config.profile_dir (not retained). */
  const char* pdir = getenv("ZS_PROFILE");
  if (pdir == NULL || pdir[0] == '\0') pdir = resolved.profile_dir;
  ctx->config.profile_dir = NULL;
  /* A run id from rank 0, the same on every rank (memreport refuses
   * profiles of different runs). One small broadcast, always, so that the
   * collective sequence does not depend on a rank's environment. */
  uint64_t* run_id = (uint64_t*)malloc(sizeof *run_id);
  if (run_id == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "context: run id");
  {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    *run_id = zs__hash_bytes(ZS__FNV_SEED, &ts, sizeof ts) ^
              ((uint64_t)getpid() << 32);
  }
  st = zs__comm_broadcast(comm, zs__tag(ZS__P_CHECK, -1, "run id"), run_id, 1,
                          ZS_UINT64, 0);
  const uint64_t id = *run_id;
  ctx->run_id = id;
  zs__comm_free(comm, run_id);
  if (st != ZS_OK) goto cleanup;
  (void)zs__profiler_create(pdir, comm->rank, comm->world, id, &ctx->prof);
  zs__accounting_set_profiler(ctx->acct, ctx->prof);
  comm->prof = ctx->prof;
  /* CPU offload: placement and workers, agreed (a node missing on one
   * rank's machine fails every rank). */
  if (resolved.offload_optimizer.device >= 1) {
    /* with a GPU, host memory goes to the GPU's NUMA node */
    char busid[32];
    ctx->device->ops->pci_busid(ctx->device, busid, sizeof busid);
    zs_status local = zs__offload_create(&resolved, comm->rank, busid,
                                         ctx->acct, &ctx->offload);
    ZS_CHECK(zs__comm_agree(comm, local, "CPU offload"));
  }
  if (resolved.progress_thread && comm->ops->start_progress != NULL &&
      comm->ops->start_progress(comm) != ZS_OK)
    zs__log(ZS_LOG_WARN, "%s", zs__error_body());
  *out = ctx;
  return ZS_OK;
cleanup:
  zs_context_destroy(ctx);
  return st;
}

zs_status zs__context_count_segment(zs_context* ctx, size_t bytes) {
  if (bytes == 0) return ZS_OK;
  if (ctx->segment_bytes > 0)
    (void)zs__accounting_remove(ctx->acct, ZS__OWNER_RUNTIME,
                                &ctx->segment_bytes, NULL, NULL);
  const size_t total = ctx->segment_bytes + bytes;
  zs_status st = zs__accounting_add(ctx->acct, ZS__OWNER_RUNTIME,
                                    ZS_MEM_COMM_SEGMENT, &ctx->segment_bytes,
                                    total, "shared-memory segments");
  ctx->segment_bytes = st == ZS_OK ? total : 0;
  return st;
}

void zs_context_destroy(zs_context* ctx) {
  if (ctx == NULL) return;
  zs__hooks_run(&ctx->hooks); /* the engine's models and NVMe offload */
  zs__offload_destroy(ctx->offload);
  ctx->offload = NULL;
  if (ctx->log_counted)
    (void)zs__accounting_remove(ctx->acct, ZS__OWNER_RUNTIME, ctx->comm->log,
                                NULL, NULL);
  if (ctx->segment_bytes > 0)
    (void)zs__accounting_remove(ctx->acct, ZS__OWNER_RUNTIME,
                                &ctx->segment_bytes, NULL, NULL);
  if (ctx->host != ctx->device) zs__device_destroy(ctx->host);
  zs__device_destroy(ctx->device);
  if (ctx->prof != NULL) {
    zs_memory_stats final;
    zs__accounting_stats(ctx->acct, &final);
    zs__accounting_set_profiler(ctx->acct, NULL);
    if (ctx->comm != NULL) ctx->comm->prof = NULL;
    zs__profiler_destroy(ctx->prof, &final);
    ctx->prof = NULL;
  }
  zs__accounting_destroy(ctx->acct);
  if (ctx->shard_comm != ctx->comm) zs__comm_destroy(ctx->shard_comm);
  zs__comm_destroy(ctx->replica_comm);
  zs__comm_destroy(ctx->comm);
  free(ctx);
}

void zs_context_remove_files(zs_context* ctx) {
  if (ctx != NULL) zs__hooks_remove_files(ctx->hooks);
}

int zs_context_rank(const zs_context* ctx) { return ctx ? ctx->rank : 0; }
int zs_context_world_size(const zs_context* ctx) {
  return ctx ? ctx->world : 0;
}
const zs_config* zs_context_config(const zs_context* ctx) {
  return ctx ? &ctx->config : NULL;
}

zs_status zs_memory_stats_get(const zs_context* ctx, zs_memory_stats* out) {
  ZS_REQUIRE(ctx != NULL && out != NULL,
             "zs_memory_stats_get: ctx and out must not be NULL");
  size_t size = 0;
  zs_status st = zs__out_size(ZS__OUT_MEMORY_STATS, ctx->caller_version, out,
                              "zs_memory_stats_get", &size);
  if (st != ZS_OK) return st;
  zs_memory_stats full;
  zs__accounting_stats(ctx->acct, &full);
  zs__out_write(ZS__OUT_MEMORY_STATS, ctx->caller_version, &full, out, size);
  return ZS_OK;
}

void zs_memory_reset_peak(zs_context* ctx) {
  if (ctx != NULL) zs__accounting_reset_peak(ctx->acct);
}

zs_status zs_memory_release_cached(zs_context* ctx, size_t* released_bytes) {
  ZS_REQUIRE(ctx != NULL, "zs_memory_release_cached: ctx is NULL");
  const size_t n = ctx->device->ops->release_cached(ctx->device);
  if (released_bytes != NULL) *released_bytes = n;
  return ZS_OK;
}

zs_status zs_memory_register(zs_context* ctx, zs_mem_category category,
                             const void* ptr, size_t bytes) {
  ZS_REQUIRE(ctx != NULL, "zs_memory_register: ctx is NULL");
  return zs__accounting_add(ctx->acct, ZS__OWNER_USER, category, ptr, bytes,
                            "user buffer");
}

zs_status zs_memory_unregister(zs_context* ctx, const void* ptr) {
  ZS_REQUIRE(ctx != NULL, "zs_memory_unregister: ctx is NULL");
  return zs__accounting_remove(ctx->acct, ZS__OWNER_USER, ptr, NULL, NULL);
}

size_t zs_comm_log_get(const zs_context* ctx, zs_comm_record* out,
                       size_t cap) {
  if (ctx == NULL || ctx->comm == NULL || ctx->comm->log == NULL) return 0;
  const zs__comm* c = ctx->comm;
  size_t stride = 0; /* the caller's record size */
  if (out != NULL && cap > 0 &&
      zs__out_size(ZS__OUT_COMM_RECORD, ctx->caller_version, out,
                   "zs_comm_log_get", &stride) != ZS_OK)
    return 0;
  zs__comm_log_entry* tmp =
      (zs__comm_log_entry*)malloc(ZS__COMM_LOG_CAP * sizeof *tmp);
  if (tmp == NULL) return 0;
  size_t n = zs__comm_log_read(c, tmp, ZS__COMM_LOG_CAP);
  if (out == NULL) {
    free(tmp);
    return n;
  }
  const size_t first = n > cap ? n - cap : 0; /* the most recent `cap` */
  for (size_t i = first; i < n; i++) {
    const zs__comm_log_entry* e = &tmp[i];
    zs_comm_record rec, *r = &rec;
    memset(r, 0, sizeof *r);
    r->seq = e->seq;
    r->op = (zs_coll_op)e->op;
    r->purpose = zs__purpose_name(e->purpose);
    r->unit = e->unit;
    r->bytes = e->bytes;
    r->issue_s = e->t_issue - c->log_t0;
    r->done_s = e->t_done > 0 ? e->t_done - c->log_t0 : 0.0;
    const double dt = e->t_done > 0 ? e->t_done - e->t_issue : 0.0;
    r->algbw_GBps = dt > 0 ? (double)e->bytes / dt / 1e9 : 0.0;
    static const char* const groups[3] = {"world", "shard", "replica"};
    const int g = e->group < 3 ? e->group : 0;
    r->group = groups[g];
    r->ranks = g == ZS__GROUP_SHARD     ? ctx->shard_ranks
               : g == ZS__GROUP_REPLICA ? ctx->replicas
                                        : ctx->world;
    r->busbw_GBps = r->algbw_GBps * zs_busbw_factor(r->op, r->ranks);
    zs__out_write(ZS__OUT_COMM_RECORD, ctx->caller_version, r,
                  (char*)out + (i - first) * stride, stride);
  }
  free(tmp);
  return n - first;
}

zs_status zs_comm_counters_get(const zs_context* ctx, zs_comm_counters* out) {
  ZS_REQUIRE(ctx != NULL && out != NULL,
             "zs_comm_counters_get: ctx and out must not be NULL");
  size_t size = 0;
  zs_status st = zs__out_size(ZS__OUT_COMM_COUNTERS, ctx->caller_version, out,
                              "zs_comm_counters_get", &size);
  if (st == ZS_OK)
    zs__out_write(ZS__OUT_COMM_COUNTERS, ctx->caller_version,
                  &ctx->comm->counters, out, size);
  return st;
}
