/*
 * old_caller.c — a program written and built against ZeroShard 0.1's
 * header (commit ef5fbf0's runtime/include/zeroshard.h, kept unchanged in
 * tests/compat/v0_1/), linked with this library: its config, with a
 * non-default value in every field it sets, resolves to those values and
 * the defaults for the rest; it trains with 0.1's output structs (no
 * struct_size, 0.1's array sizes), which must come back in 0.1's layout
 * and never overrun; a copy of its context's config makes a context of
 * 0.1 too; 0.1's estimator calls still run; a config stamped with a newer
 * version is refused, naming both versions. Exit status 0 when every
 * check holds.
 */
#include <stdio.h>
#include <string.h>
#include <zeroshard.h> /* 0.1's */

#include "tests/compat/check.h"

/* Each output struct is followed by canary bytes the library must not
 * touch (0.2's structs are larger than 0.1's). */
#define CANARY 0xC5
#define GUARDED(T) \
  struct {         \
    T v;           \
    unsigned char canary[64]; \
  }
static int canary_intact(const unsigned char* c) {
  for (int i = 0; i < 64; i++)
    if (c[i] != CANARY) return 0;
  return 1;
}

static zs_status init_fn(void* user, int tensor, const zs_tensor_desc* d,
                         void* data) {
  (void)user;
  (void)tensor;
  for (size_t i = 0; i < d->numel; i++) ((float*)data)[i] = 0.25f * (float)i;
  return ZS_OK;
}

int main(void) {
  /* 0.1's zs_config_init (a function in 0.1): 0.1's defaults, stamped 0.1 */
  zs_config init;
  memset(&init, 0x5A, sizeof init);
  CHECK(zs_config_init(&init) == ZS_OK, "%s", zs_last_error());
  CHECK(init.struct_size == sizeof(zs_config), "%zu", init.struct_size);
  CHECK(init.version == ZS_VERSION_CODE, "%u", init.version);
  CHECK(init.optimizer.lr == 1e-3 && init.bucket_elements == ((size_t)1 << 22) &&
            init.nvme.buffer_count == 9 && init.log_level == 1,
        "0.1's defaults");

  /* A non-default value in every field it sets */
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  c.optimizer.kind = ZS_OPTIM_ADAM;
  c.optimizer.lr = 0.05;
  c.optimizer.beta1 = 0.8;
  c.optimizer.beta2 = 0.99;
  c.optimizer.eps = 1e-6;
  c.optimizer.weight_decay = 0.125;
  c.log_level = 0;
  c.collective_timeout_s = 77.0;
  c.bucket_elements = 1000;
  c.prefetch_depth = 3;
  c.max_live_elements = 12345;
  c.reshard_after_forward = 0;
  c.reduce_order = ZS_REDUCE_BACKEND;
  c.progress_thread = 0;
  c.grad_accum_steps = 2;
  c.grad_accum_local = 1;
  c.clip_grad_norm = 1;
  c.max_grad_norm = 0.5;
  c.loss_scaler.mode = ZS_LOSS_SCALE_STATIC;
  c.loss_scaler.init_scale = 128.0;
  c.nvme.queue_depth = 32;
  c.nvme.block_size = (size_t)2 << 20;

  zs_context* ctx = NULL;
  CHECK(zs_context_create_local(&c, &ctx) == ZS_OK, "%s", zs_last_error());
  if (ctx == NULL) return 1;
  const zs_config* r = zs_context_config(ctx);
  CHECK(r->stage == 2 && r->optimizer.kind == ZS_OPTIM_ADAM &&
            r->optimizer.lr == 0.05 && r->optimizer.beta1 == 0.8 &&
            r->optimizer.beta2 == 0.99 && r->optimizer.eps == 1e-6 &&
            r->optimizer.weight_decay == 0.125 && r->log_level == 0 &&
            r->collective_timeout_s == 77.0 && r->bucket_elements == 1000 &&
            r->prefetch_depth == 3 && r->max_live_elements == 12345 &&
            r->reshard_after_forward == 0 &&
            r->reduce_order == ZS_REDUCE_BACKEND && r->progress_thread == 0 &&
            r->grad_accum_steps == 2 && r->grad_accum_local == 1 &&
            r->clip_grad_norm == 1 && r->max_grad_norm == 0.5 &&
            r->loss_scaler.mode == ZS_LOSS_SCALE_STATIC &&
            r->loss_scaler.init_scale == 128.0 && r->nvme.queue_depth == 32 &&
            r->nvme.block_size == ((size_t)2 << 20),
        "the values it set");
  CHECK(r->device == ZS_DEVICE_HOST && r->optimizer.momentum == 0.0 &&
            r->reduce_dtype == -1 && r->loss_scaler.growth_factor == 2.0 &&
            r->loss_scaler.hysteresis == 1 && r->offload_optimizer.device == 0 &&
            r->offload_optimizer.pin_memory == 1 &&
            r->offload_optimizer.numa == ZS_OFFLOAD_NUMA_AUTO &&
            r->offload_param == 0 && r->nvme.buffer_count == 9 &&
            r->nvme.param_buffer_count == 5 && r->profile_dir == NULL,
        "the defaults for the rest");
  printf("resolved: stage %d, optimizer %d lr %g betas %g %g eps %g wd %g, "
         "log_level %d, timeout %g, bucket %zu, prefetch %d, max_live %zu, "
         "reshard %d, reduce_order %d, progress %d, accum %d local %d, clip "
         "%d %g, scaler %d %g, nvme qd %d block %zu; device %d momentum %g "
         "reduce_dtype %d growth %g buffers %zu\n",
         r->stage, (int)r->optimizer.kind, r->optimizer.lr, r->optimizer.beta1,
         r->optimizer.beta2, r->optimizer.eps, r->optimizer.weight_decay,
         r->log_level, r->collective_timeout_s, r->bucket_elements,
         r->prefetch_depth, r->max_live_elements, r->reshard_after_forward,
         r->reduce_order, r->progress_thread, r->grad_accum_steps,
         r->grad_accum_local, r->clip_grad_norm, r->max_grad_norm,
         r->loss_scaler.mode, r->loss_scaler.init_scale, r->nvme.queue_depth,
         r->nvme.block_size, (int)r->device, r->optimizer.momentum,
         r->reduce_dtype, r->loss_scaler.growth_factor, r->nvme.buffer_count);

  /* Two optimizer steps of two micro-batches, with 0.1's output structs */
  zs_model* m = NULL;
  int u = -1, t = -1;
  int64_t n = 10;
  CHECK(zs_model_create(ctx, &m) == ZS_OK, "%s", zs_last_error());
  CHECK(zs_model_add_unit(m, "u", &u) == ZS_OK, "%s", zs_last_error());
  CHECK(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t) == ZS_OK,
        "%s", zs_last_error());
  CHECK(zs_model_finalize(m) == ZS_OK, "%s", zs_last_error());
  CHECK(zs_model_init(m, init_fn, NULL) == ZS_OK, "%s", zs_last_error());
  for (int k = 0; k < 4; k++) {
    float* g = NULL;
    CHECK(zs_unit_gather(m, u) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_unit_grad_acquire(m, u) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_tensor_grad(m, t, (void**)&g) == ZS_OK, "%s", zs_last_error());
    for (int i = 0; g != NULL && i < 10; i++) g[i] += 128.0f * 0.01f * (float)i;
    CHECK(zs_unit_grad_release(m, u) == ZS_OK, "%s", zs_last_error());
    CHECK(zs_unit_release(m, u) == ZS_OK, "%s", zs_last_error());
    GUARDED(zs_step_info) info;
    memset(&info, CANARY, sizeof info);
    CHECK(zs_step(m, &info.v) == ZS_OK, "%s", zs_last_error());
    CHECK(info.v.applied == (k % 2 == 1), "micro-batch %d: applied %d", k,
          info.v.applied);
    CHECK(info.v.step == (k + 1) / 2, "step %lld", (long long)info.v.step);
    CHECK(info.v.micro_batch == (k % 2 == 0), "micro_batch %d",
          info.v.micro_batch);
    CHECK(info.v.loss_scale == 128.0, "loss_scale %g", info.v.loss_scale);
    CHECK(info.v.overflow == 0, "overflow %d", info.v.overflow);
    CHECK(k % 2 == 0 || info.v.grad_norm > 0.0, "grad_norm %g",
          info.v.grad_norm);
    CHECK(canary_intact(info.canary), "zs_step_info overrun");
  }
  size_t used = 0, padded = 0, shard = 0;
  CHECK(zs_unit_layout(m, u, &used, &padded, &shard) == ZS_OK, "%s",
        zs_last_error());
  GUARDED(zs_memory_stats) ms;
  memset(&ms, CANARY, sizeof ms);
  CHECK(zs_memory_stats_get(ctx, &ms.v) == ZS_OK, "%s", zs_last_error());
  CHECK(ms.v.current[ZS_MEM_PARAMS] == padded * 4, "params %zu (padded %zu)",
        ms.v.current[ZS_MEM_PARAMS], padded);
  CHECK(ms.v.current[ZS_MEM_OPTIMIZER_STATES] == 2 * shard * 4, "states %zu",
        ms.v.current[ZS_MEM_OPTIMIZER_STATES]);
  CHECK(ms.v.model_state_bytes ==
            ms.v.current[ZS_MEM_PARAMS] + ms.v.current[ZS_MEM_GRADS] +
                ms.v.current[ZS_MEM_MASTER_WEIGHTS] +
                ms.v.current[ZS_MEM_OPTIMIZER_STATES],
        "model_state_bytes %zu", ms.v.model_state_bytes);
  CHECK(ms.v.current[ZS_MEM_OTHER] > 0 && ms.v.resident_bytes > 0 &&
            ms.v.phase_peak_total[ZS_PHASE_STEP] > 0,
        "other %zu resident %zu", ms.v.current[ZS_MEM_OTHER],
        ms.v.resident_bytes);
  CHECK(canary_intact(ms.canary), "zs_memory_stats overrun");

  /* 0.1's estimator, still linked: the ZeRO formula from a count (fp32
   * AdamW: 16 bytes per parameter, a quarter each on 4 ranks at stage 3),
   * and this model's states byte for byte as the context measured them */
  zs_estimate_config ec = ZS_ESTIMATE_CONFIG_INIT;
  GUARDED(zs_memory_estimate) est;
  memset(&est, CANARY, sizeof est);
  CHECK(zs_estimate_params(1e6, &ec, &est.v) == ZS_OK, "%s", zs_last_error());
  CHECK(est.v.model_state_bytes == 16000000 &&
            est.v.bytes[ZS_MEM_PARAMS] == 4000000 &&
            est.v.total >= est.v.model_state_bytes,
        "1e6 parameters: model states %zu, params %zu, total %zu",
        est.v.model_state_bytes, est.v.bytes[ZS_MEM_PARAMS], est.v.total);
  ec.ranks = 4;
  ec.stage = 3;
  CHECK(zs_estimate_params(1e6, &ec, &est.v) == ZS_OK, "%s", zs_last_error());
  CHECK(est.v.model_state_bytes == 4000000, "stage 3, 4 ranks: %zu",
        est.v.model_state_bytes);
  ec = (zs_estimate_config)ZS_ESTIMATE_CONFIG_INIT;
  ec.stage = 2;
  ec.optimizer = ZS_OPTIM_ADAM;
  ec.grad_accum_steps = 2;
  ec.grad_accum_local = 1;
  CHECK(zs_estimate_model("{\"units\": [{\"name\": \"u\", \"dtype\": "
                          "\"fp32\", \"tensors\": [{\"name\": \"w\", "
                          "\"numel\": 10}]}]}",
                          &ec, &est.v) == ZS_OK,
        "%s", zs_last_error());
  CHECK(est.v.model_state_bytes == ms.v.model_state_bytes,
        "described model states %zu, measured %zu", est.v.model_state_bytes,
        ms.v.model_state_bytes);
  CHECK(canary_intact(est.canary), "zs_memory_estimate overrun");
  ec.ranks = 0;
  CHECK(zs_estimate_params(1e6, &ec, &est.v) == ZS_ERR_INVALID_ARGUMENT &&
            strstr(zs_last_error(), "ranks") != NULL,
        "ranks 0: %s", zs_last_error());
  GUARDED(zs_comm_counters) cc;
  memset(&cc, CANARY, sizeof cc);
  CHECK(zs_comm_counters_get(ctx, &cc.v) == ZS_OK, "%s", zs_last_error());
  /* grad_accum_local: one reduction per optimizer step */
  CHECK(cc.v.calls[ZS_COLL_REDUCE_SCATTER] == 2, "reduce-scatters %llu",
        (unsigned long long)cc.v.calls[ZS_COLL_REDUCE_SCATTER]);
  CHECK(canary_intact(cc.canary), "zs_comm_counters overrun");
  typedef zs_comm_record records3[3];
  GUARDED(records3) log;
  memset(&log, CANARY, sizeof log);
  const size_t got = zs_comm_log_get(ctx, log.v, 3);
  CHECK(got == 3, "%zu records", got);
  for (size_t i = 0; i < got; i++)
    CHECK(log.v[i].purpose != NULL && (i == 0 || log.v[i].seq == log.v[i - 1].seq + 1),
          "record %zu: seq %llu", i, (unsigned long long)log.v[i].seq);
  CHECK(canary_intact(log.canary), "zs_comm_record overrun");
  GUARDED(zs_offload_info) oi;
  memset(&oi, CANARY, sizeof oi);
  CHECK(zs_offload_info_get(ctx, &oi.v) == ZS_OK, "%s", zs_last_error());
  CHECK(oi.v.enabled == 0 && oi.v.nvme == 0 && oi.v.nvme_aio == NULL,
        "offload info");
  CHECK(canary_intact(oi.canary), "zs_offload_info overrun");

  /* A copy of the context's configuration is a 0.1 config: the context
   * made from it writes 0.1's layouts too */
  zs_config again = *zs_context_config(ctx);
  CHECK(again.version == 100 && again.struct_size == sizeof(zs_config),
        "the context's config is stamped version %u, struct_size %zu",
        again.version, again.struct_size);
  zs_context* ctx2 = NULL;
  CHECK(zs_context_create_local(&again, &ctx2) == ZS_OK, "%s",
        zs_last_error());
  if (ctx2 != NULL) {
    GUARDED(zs_memory_stats) ms2;
    memset(&ms2, CANARY, sizeof ms2);
    memset(&ms2.v, 0, sizeof ms2.v);
    CHECK(zs_memory_stats_get(ctx2, &ms2.v) == ZS_OK, "%s", zs_last_error());
    CHECK(ms2.v.current[ZS_MEM_OTHER] > 0, "the copy's context: other %zu",
          ms2.v.current[ZS_MEM_OTHER]);
    CHECK(canary_intact(ms2.canary),
          "zs_memory_stats of the copy's context overrun");
    GUARDED(zs_comm_counters) cc2;
    memset(&cc2, CANARY, sizeof cc2);
    CHECK(zs_comm_counters_get(ctx2, &cc2.v) == ZS_OK, "%s", zs_last_error());
    CHECK(canary_intact(cc2.canary),
          "zs_comm_counters of the copy's context overrun");
    zs_context_destroy(ctx2);
  }
  zs_model_destroy(m);
  zs_context_destroy(ctx);

  /* 0.1 had no UNSET values: a value 0.1 refused is refused still, naming
   * the field, though this release reads it as "unset" */
  zs_config bad = c;
  bad.stage = -2147483647 - 1;
  CHECK(zs_config_validate(&bad) == ZS_ERR_INVALID_ARGUMENT &&
            strstr(zs_last_error(), "config.stage") != NULL,
        "stage INT_MIN in a 0.1 config: %s", zs_last_error());
  bad = c;
  bad.optimizer.lr = -1.0e300;
  CHECK(zs_config_validate(&bad) == ZS_ERR_INVALID_ARGUMENT &&
            strstr(zs_last_error(), "config.optimizer.lr") != NULL,
        "lr -1e300 in a 0.1 config: %s", zs_last_error());
  zs_context* refused = NULL;
  bad = c;
  bad.log_level = -2147483647 - 1;
  CHECK(zs_context_create_local(&bad, &refused) == ZS_ERR_INVALID_ARGUMENT &&
            strstr(zs_last_error(), "config.log_level") != NULL,
        "log_level INT_MIN in a 0.1 config: %s", zs_last_error());
  bad = c;
  bad.optimizer.weight_decay = ZS_WEIGHT_DECAY_DEFAULT; /* 0.1's default */
  CHECK(zs_config_validate(&bad) == ZS_OK, "%s", zs_last_error());

  /* A config from a newer header is refused, naming both versions */
  zs_config newer = c;
  newer.version = 900; /* 0.9.0 */
  zs_context* none = NULL;
  CHECK(zs_context_create_local(&newer, &none) == ZS_ERR_INVALID_ARGUMENT,
        "a 0.9 config accepted");
  const char* e = zs_last_error();
  CHECK(strstr(e, "0.9.0") != NULL && strstr(e, zs_version_string()) != NULL &&
            strstr(e, "newer") != NULL,
        "message: %s", e);
  printf("newer version: %s\n", e);
  newer = c;
  newer.struct_size += 64;
  CHECK(zs_config_validate(&newer) == ZS_ERR_INVALID_ARGUMENT,
        "a larger struct_size accepted");
  CHECK(strstr(zs_last_error(), "larger than this library") != NULL, "%s",
        zs_last_error());
  printf("larger struct_size: %s\n", zs_last_error());
  printf("old caller (0.1 header) against library %s: %d checks, %d failed\n",
         zs_version_string(), checks, failures);
  return failures != 0;
}
