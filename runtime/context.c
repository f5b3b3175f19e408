/*
 * context.c — context creation over a communicator: config validation and
 * the cross-rank config check, accounting, device backend.
 */
#include "runtime/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  zs__set_log_rank(comm->world > 1 ? comm->rank : -1);

  /* A rank whose config is invalid still joins the check, describing its
   * error instead, so every rank fails together rather than some hanging. */
  char desc[2048];
  zs_status valid = zs_config_validate(config);
  if (valid == ZS_OK) {
    ctx->config = *config;
    zs__log_set_level(config->log_level);
    zs__config_describe(config, desc, sizeof desc);
  } else {
    snprintf(desc, sizeof desc, "invalid config: %s\n", zs_last_error());
  }
  char saved[2048];
  snprintf(saved, sizeof saved, "%s", zs_last_error());
  ZS_CHECK(zs__comm_check_same(comm, "configuration", desc, strlen(desc)));
  if (valid != ZS_OK) ZS_FAIL(valid, "%s", saved);

  ZS_CHECK(zs__accounting_create(&ctx->acct));
  ZS_CHECK(zs__device_create(config->device, ctx->acct, &ctx->device));
  *out = ctx;
  return ZS_OK;
cleanup:
  zs_context_destroy(ctx);
  return st;
}

void zs_context_destroy(zs_context* ctx) {
  if (ctx == NULL) return;
  if (ctx->live_models > 0)
    zs__log(ZS_LOG_WARN,
            "zs_context_destroy: %d model(s) still alive; destroy them first "
            "(their memory is reported as leaked)", ctx->live_models);
  zs__device_destroy(ctx->device);
  zs__accounting_destroy(ctx->acct);
  zs__comm_destroy(ctx->comm);
  free(ctx);
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
  zs__accounting_stats(ctx->acct, out);
  return ZS_OK;
}

void zs_memory_reset_peak(zs_context* ctx) {
  if (ctx != NULL) zs__accounting_reset_peak(ctx->acct);
}

zs_status zs_memory_register(zs_context* ctx, zs_mem_category category,
                             const void* ptr, size_t bytes) {
  ZS_REQUIRE(ctx != NULL, "zs_memory_register: ctx is NULL");
  return zs__accounting_add(ctx->acct, category, ptr, bytes, "user buffer");
}

zs_status zs_memory_unregister(zs_context* ctx, const void* ptr) {
  ZS_REQUIRE(ctx != NULL, "zs_memory_unregister: ctx is NULL");
  return zs__accounting_remove(ctx->acct, ptr, NULL, NULL);
}

zs_status zs_comm_counters_get(const zs_context* ctx, zs_comm_counters* out) {
  ZS_REQUIRE(ctx != NULL && out != NULL,
             "zs_comm_counters_get: ctx and out must not be NULL");
  *out = ctx->comm->counters;
  return ZS_OK;
}
