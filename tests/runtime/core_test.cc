// core_test.cc — the lowest runtime layers, single process, no MPI:
//  - runtime/core/core.c: status strings, the thread-local last error,
//    version, dtype / memory category / collective names;
//  - runtime/core/core_config.c: zs_config_init, zs_config_validate, the JSON
//    form (zs_config_from_json, zs_config_from_json_file);
//  - runtime/core/core_mem.c: the accounting tables (zs__accounting_*);
//  - runtime/device/device_host.c: the host device backend and the accounted
//    allocation wrappers (zs__dev_alloc, zs__dev_free).
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/core.h"
#include "runtime/device/device.h"

// The huge-allocation tests expect a NULL from the allocator, not a
// sanitizer abort.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
#endif

namespace {

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Asserts that the thread's last error contains `needle`, printing both.
#define EXPECT_LAST_ERROR_HAS(needle)                                    \
  EXPECT_PRED2(Contains, std::string(zs_last_error()), std::string(needle))

// ==== Status strings and the last error ==================================

TEST(Status, EveryCodeHasItsString) {
  struct Row {
    zs_status status;
    int value;
    const char* text;
  };
#define ZS_TEST_ROW(name, value, text) {name, value, text},
  const Row rows[] = {ZS_STATUS_LIST(ZS_TEST_ROW)};
#undef ZS_TEST_ROW
  ASSERT_EQ(sizeof rows / sizeof rows[0], 14u);
  for (const Row& r : rows) {
    EXPECT_EQ(static_cast<int>(r.status), r.value);
    EXPECT_STREQ(zs_status_string(r.status), r.text) << "value " << r.value;
  }
  // The values are fixed forever; spot-check a few by number.
  EXPECT_STREQ(zs_status_string(static_cast<zs_status>(0)), "success");
  EXPECT_STREQ(zs_status_string(static_cast<zs_status>(1)),
               "invalid argument");
  EXPECT_STREQ(zs_status_string(static_cast<zs_status>(13)),
               "corrupt or inconsistent data");
  // Strings are distinct.
  for (const Row& a : rows) {
    for (const Row& b : rows) {
      if (a.value != b.value) {
        EXPECT_STRNE(zs_status_string(a.status), zs_status_string(b.status));
      }
    }
  }
}

TEST(Status, UnknownValue) {
  for (int v : {14, 99, -1, 1 << 20}) {
    EXPECT_STREQ(zs_status_string(static_cast<zs_status>(v)),
                 "unknown status")
        << "value " << v;
  }
}

TEST(LastError, SetByErrorAndReturnsStatus) {
  EXPECT_EQ(zs__error(ZS_ERR_IO, "file %s at byte %d", "a.json", 42),
            ZS_ERR_IO);
  EXPECT_STREQ(zs_last_error(), "file a.json at byte 42");
  EXPECT_EQ(zs__error(ZS_ERR_MISMATCH, "second"), ZS_ERR_MISMATCH);
  EXPECT_STREQ(zs_last_error(), "second");
}

TEST(LastError, PrefixAndRank) {
  zs__error(ZS_ERR_IO, "inner detail");
  EXPECT_EQ(zs__error_prefix(ZS_ERR_CORRUPT, "outer %d: ", 7), ZS_ERR_CORRUPT);
  EXPECT_STREQ(zs_last_error(), "outer 7: inner detail");

  zs__set_log_rank(2);
  zs__error(ZS_ERR_COMM, "peer gone");
  EXPECT_STREQ(zs_last_error(), "[rank 2] peer gone");
  zs__error_prefix(ZS_ERR_COMM, "step: ");
  EXPECT_STREQ(zs_last_error(), "[rank 2] step: peer gone")
      << "the rank prefix must not be doubled";
  zs__set_log_rank(-1);
  zs__error(ZS_ERR_COMM, "no rank");
  EXPECT_STREQ(zs_last_error(), "no rank");
}

TEST(LastError, LongMessagesAreTruncatedNotOverrun) {
  std::string big(10000, 'x');
  zs__error(ZS_ERR_INTERNAL, "%s", big.c_str());
  size_t len = std::strlen(zs_last_error());
  EXPECT_GT(len, 1000u);
  EXPECT_LT(len, 4096u);
  zs__error(ZS_ERR_INTERNAL, "short");
  zs__error_prefix(ZS_ERR_INTERNAL, "%s", big.c_str());
  EXPECT_LT(std::strlen(zs_last_error()), 4096u);
}

TEST(LastError, IsThreadLocal) {
  zs__error(ZS_ERR_IO, "main thread message");
  std::string seen_before, seen_after;
  std::thread t([&] {
    seen_before = zs_last_error();
    zs__error(ZS_ERR_TIMEOUT, "worker thread message");
    seen_after = zs_last_error();
  });
  t.join();
  EXPECT_EQ(seen_before, "") << "a new thread starts with an empty message";
  EXPECT_EQ(seen_after, "worker thread message");
  EXPECT_STREQ(zs_last_error(), "main thread message");
}

// ==== Version and names ==================================================

TEST(Version, MatchesTheMacros) {
  EXPECT_EQ(zs_version(), ZS_VERSION_CODE);
  EXPECT_EQ(ZS_VERSION_CODE,
            ZS_VERSION_MAJOR * 10000 + ZS_VERSION_MINOR * 100 +
                ZS_VERSION_PATCH);
  std::string want = std::to_string(ZS_VERSION_MAJOR) + "." +
                     std::to_string(ZS_VERSION_MINOR) + "." +
                     std::to_string(ZS_VERSION_PATCH);
  ASSERT_NE(zs_version_string(), nullptr);
  EXPECT_EQ(std::string(zs_version_string()), want);
}

TEST(Names, Dtypes) {
  struct {
    zs_dtype dtype;
    size_t size;
    const char* name;
  } rows[] = {{ZS_FLOAT32, 4, "fp32"}, {ZS_BFLOAT16, 2, "bf16"},
              {ZS_FLOAT16, 2, "fp16"}, {ZS_UINT8, 1, "u8"},
              {ZS_INT64, 8, "i64"},    {ZS_UINT64, 8, "u64"},
              {ZS_FLOAT64, 8, "f64"}};
  ASSERT_EQ(sizeof rows / sizeof rows[0], static_cast<size_t>(ZS_DTYPE_COUNT));
  for (const auto& r : rows) {
    EXPECT_EQ(zs_dtype_size(r.dtype), r.size) << r.name;
    EXPECT_STREQ(zs_dtype_name(r.dtype), r.name);
  }
  for (int v : {static_cast<int>(ZS_DTYPE_COUNT), -1, 100}) {
    EXPECT_EQ(zs_dtype_size(static_cast<zs_dtype>(v)), 0u) << "value " << v;
    EXPECT_STREQ(zs_dtype_name(static_cast<zs_dtype>(v)), "invalid")
        << "value " << v;
  }
}

TEST(Names, MemoryCategories) {
  const char* want[] = {"params",         "params_gathered",  "grads",
                        "master_weights", "optimizer_states", "comm_buffers",
                        "activations",    "offload_host",     "nvme_staging",
                        "other",          "stacked_views",    "comm_segment"};
  ASSERT_EQ(sizeof want / sizeof want[0],
            static_cast<size_t>(ZS_MEM_CATEGORY_COUNT));
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
    EXPECT_STREQ(zs_mem_category_name(static_cast<zs_mem_category>(c)),
                 want[c])
        << "category " << c;
  EXPECT_STREQ(zs_mem_category_name(ZS_MEM_OPTIMIZER_STATES),
               "optimizer_states");
  for (int v : {static_cast<int>(ZS_MEM_CATEGORY_COUNT), -1, 1000})
    EXPECT_STREQ(zs_mem_category_name(static_cast<zs_mem_category>(v)),
                 "invalid")
        << "value " << v;
}

TEST(Names, CollectiveOps) {
  EXPECT_STREQ(zs_coll_op_name(ZS_COLL_ALL_GATHER), "all_gather");
  EXPECT_STREQ(zs_coll_op_name(ZS_COLL_REDUCE_SCATTER), "reduce_scatter");
  EXPECT_STREQ(zs_coll_op_name(ZS_COLL_ALL_REDUCE), "all_reduce");
  EXPECT_STREQ(zs_coll_op_name(ZS_COLL_BROADCAST), "broadcast");
  EXPECT_STREQ(zs_coll_op_name(ZS_COLL_GATHER), "gather");
  for (int v : {static_cast<int>(ZS_COLL_OP_COUNT), -1, 77})
    EXPECT_STREQ(zs_coll_op_name(static_cast<zs_coll_op>(v)), "invalid")
        << "value " << v;
}

// ==== Configuration: init and validate ===================================

// Equal values, or both NaN (a NaN field must compare equal to itself).
bool SameDouble(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// The defaults, readable (zs_config_init; ZS_CONFIG_INIT leaves the
// fields UNSET for the library to resolve).
zs_config Defaults() {
  zs_config c;
  zs_config_init(&c);
  return c;
}

// Field-by-field comparison that prints every differing field.
template <typename E>
int RawInt(const E* e) {
  static_assert(sizeof(E) == sizeof(int), "enum is int-sized");
  int v;
  std::memcpy(&v, e, sizeof v);
  return v;
}

void ExpectConfigEq(const zs_config& a, const zs_config& b) {
  EXPECT_EQ(a.struct_size, b.struct_size);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.stage, b.stage);
  // Compared as raw ints: tests store out-of-range enum values on purpose,
  // and loading those as the enum type is undefined behaviour in C++.
  EXPECT_EQ(RawInt(&a.device), RawInt(&b.device));
  EXPECT_EQ(RawInt(&a.optimizer.kind), RawInt(&b.optimizer.kind));
  EXPECT_PRED2(SameDouble, a.optimizer.lr, b.optimizer.lr);
  EXPECT_PRED2(SameDouble, a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_PRED2(SameDouble, a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_PRED2(SameDouble, a.optimizer.eps, b.optimizer.eps);
  EXPECT_PRED2(SameDouble, a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_PRED2(SameDouble, a.optimizer.momentum, b.optimizer.momentum);
  EXPECT_PRED2(SameDouble, a.optimizer.dampening, b.optimizer.dampening);
  EXPECT_EQ(a.optimizer.nesterov, b.optimizer.nesterov);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.collective_timeout_s, b.collective_timeout_s);
  EXPECT_EQ(a.bucket_elements, b.bucket_elements);
  EXPECT_EQ(a.prefetch_depth, b.prefetch_depth);
  EXPECT_EQ(a.max_live_elements, b.max_live_elements);
  EXPECT_EQ(a.reshard_after_forward, b.reshard_after_forward);
  EXPECT_EQ(a.reduce_order, b.reduce_order);
  EXPECT_EQ(a.progress_thread, b.progress_thread);
  EXPECT_EQ(a.reduce_dtype, b.reduce_dtype);
  EXPECT_EQ(a.grad_accum_steps, b.grad_accum_steps);
  EXPECT_EQ(a.grad_accum_local, b.grad_accum_local);
  EXPECT_EQ(a.clip_grad_norm, b.clip_grad_norm);
  EXPECT_PRED2(SameDouble, a.max_grad_norm, b.max_grad_norm);
  EXPECT_EQ(a.loss_scaler.mode, b.loss_scaler.mode);
  EXPECT_PRED2(SameDouble, a.loss_scaler.init_scale, b.loss_scaler.init_scale);
  EXPECT_PRED2(SameDouble, a.loss_scaler.growth_factor,
               b.loss_scaler.growth_factor);
  EXPECT_PRED2(SameDouble, a.loss_scaler.backoff_factor,
               b.loss_scaler.backoff_factor);
  EXPECT_EQ(a.loss_scaler.growth_interval, b.loss_scaler.growth_interval);
  EXPECT_PRED2(SameDouble, a.loss_scaler.min_scale, b.loss_scaler.min_scale);
  EXPECT_EQ(a.loss_scaler.hysteresis, b.loss_scaler.hysteresis);
  EXPECT_EQ(a.param_persistence_threshold, b.param_persistence_threshold);
  EXPECT_PRED2(SameDouble, a.heartbeat_timeout_s, b.heartbeat_timeout_s);
  EXPECT_EQ(a.host_collectives, b.host_collectives);
  EXPECT_EQ(a.shard_group_size, b.shard_group_size);
}

// Precision settings: defaults, ranges (errors name the field) and the
// DeepSpeed-style JSON keys.
TEST(Config, PrecisionDefaultsAndRanges) {
  zs_config c = Defaults();
  EXPECT_EQ(c.reduce_dtype, -1);
  EXPECT_EQ(c.grad_accum_steps, 1);
  EXPECT_EQ(c.clip_grad_norm, 0);
  EXPECT_EQ(c.loss_scaler.mode, ZS_LOSS_SCALE_NONE);
  EXPECT_EQ(c.loss_scaler.init_scale, 65536.0);
  EXPECT_EQ(c.loss_scaler.hysteresis, 1);
  ASSERT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  struct Bad {
    void (*set)(zs_config*);
    const char* field;
  } bad[] = {
      {[](zs_config* x) { x->grad_accum_steps = 0; }, "grad_accum_steps"},
      {[](zs_config* x) { x->reduce_dtype = ZS_BFLOAT16; }, "reduce_dtype"},
      {[](zs_config* x) { x->grad_accum_local = 2; }, "grad_accum_local"},
      {[](zs_config* x) { x->clip_grad_norm = 1; x->max_grad_norm = 0; },
       "max_grad_norm"},
      {[](zs_config* x) { x->clip_grad_norm = 1; x->max_grad_norm = -1; },
       "max_grad_norm"},
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
         x->loss_scaler.backoff_factor = 1.0;
       }, "backoff_factor"},
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
         x->loss_scaler.init_scale = 0.5;
       }, "init_scale"},
      // below fp32's normal range the unscale coefficient 1/scale is inf:
      // every parameter NaN after a step that reported success
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_STATIC;
         x->loss_scaler.init_scale = 1e-39;
       }, "init_scale: expected a value in fp32's normal range"},
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
         x->loss_scaler.min_scale = 1e-60;
         x->loss_scaler.init_scale = 1e-50;
       }, "min_scale: expected a value in fp32's normal range"},
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_STATIC;
         x->loss_scaler.init_scale = 1e39;
       }, "init_scale"},
      {[](zs_config* x) {
         x->loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
         x->loss_scaler.hysteresis = 0;
       }, "hysteresis"},
      {[](zs_config* x) { x->loss_scaler.mode = (zs_loss_scaling)7; }, "loss_scaler.mode"},
  };
  for (const Bad& b : bad) {
    zs_config x = Defaults();
    b.set(&x);
    EXPECT_EQ(zs_config_validate(&x), ZS_ERR_INVALID_ARGUMENT) << b.field;
    EXPECT_LAST_ERROR_HAS(b.field);
  }
  zs_config j = Defaults();
  ASSERT_EQ(zs_config_from_json(
                R"({"gradient_accumulation_steps": 4, "gradient_clipping": 1.5,
                    "communication_data_type": "fp32",
                    "fp16": {"enabled": true, "loss_scale": 0,
                             "initial_scale_power": 12, "hysteresis": 2,
                             "loss_scale_window": 100, "min_loss_scale": 4}})",
                &j),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(j.grad_accum_steps, 4);
  EXPECT_EQ(j.clip_grad_norm, 1);
  EXPECT_EQ(j.max_grad_norm, 1.5);
  EXPECT_EQ(j.reduce_dtype, ZS_FLOAT32);
  EXPECT_EQ(j.loss_scaler.mode, ZS_LOSS_SCALE_DYNAMIC);
  EXPECT_EQ(j.loss_scaler.init_scale, 4096.0);
  EXPECT_EQ(j.loss_scaler.hysteresis, 2);
  EXPECT_EQ(j.loss_scaler.growth_interval, 100);
  EXPECT_EQ(j.loss_scaler.min_scale, 4.0);
  ASSERT_EQ(zs_config_from_json(R"({"fp16": {"loss_scale": 128}})", &j), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(j.loss_scaler.mode, ZS_LOSS_SCALE_STATIC);
  EXPECT_EQ(j.loss_scaler.init_scale, 128.0);
  zs_config d = Defaults();
  EXPECT_EQ(zs_config_from_json(R"({"fp16": {"loss_scale": 128}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("enabled");
  ASSERT_EQ(zs_config_from_json(R"({"fp16": {"enabled": true}})", &d), ZS_OK);
  EXPECT_EQ(d.loss_scaler.mode, ZS_LOSS_SCALE_DYNAMIC);
  EXPECT_EQ(d.loss_scaler.init_scale, 65536.0);  // DeepSpeed's 2^16
  EXPECT_EQ(zs_config_from_json(
                R"({"fp16": {"enabled": true, "initial_scale_power": 200}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("initial_scale_power");
  // A field is written only when a key says so: a dynamic scaler set in C
  // keeps its scale when the block sets another key; a static one refuses
  // a power it would ignore; loss_scale 0 turns a static one dynamic from
  // DeepSpeed's 2^16.
  for (double scale : {1024.0, 8.0, 3e4}) {
    zs_config s = Defaults();
    s.loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
    s.loss_scaler.init_scale = scale;
    ASSERT_EQ(zs_config_from_json(R"({"fp16": {"loss_scale_window": 100}})", &s),
              ZS_OK) << zs_last_error();
    EXPECT_EQ(s.loss_scaler.mode, ZS_LOSS_SCALE_DYNAMIC);
    EXPECT_EQ(s.loss_scaler.init_scale, scale);
    EXPECT_EQ(s.loss_scaler.growth_interval, 100);
    ASSERT_EQ(zs_config_from_json(R"({"fp16": {"enabled": true}})", &s), ZS_OK);
    EXPECT_EQ(s.loss_scaler.init_scale, scale);
    ASSERT_EQ(zs_config_from_json(R"({"fp16": {"initial_scale_power": 5}})", &s),
              ZS_OK) << zs_last_error();
    EXPECT_EQ(s.loss_scaler.init_scale, 32.0);
    zs_config t = Defaults();
    t.loss_scaler.mode = ZS_LOSS_SCALE_STATIC;
    t.loss_scaler.init_scale = scale;
    EXPECT_EQ(zs_config_from_json(
                  R"({"fp16": {"enabled": true, "initial_scale_power": 8}})", &t),
              ZS_ERR_INVALID_ARGUMENT);
    EXPECT_LAST_ERROR_HAS("fp16.initial_scale_power 8 applies to dynamic");
    EXPECT_EQ(t.loss_scaler.mode, ZS_LOSS_SCALE_STATIC);  // unchanged
    EXPECT_EQ(t.loss_scaler.init_scale, scale);
    ASSERT_EQ(zs_config_from_json(R"({"fp16": {"hysteresis": 3}})", &t), ZS_OK);
    EXPECT_EQ(t.loss_scaler.mode, ZS_LOSS_SCALE_STATIC);
    EXPECT_EQ(t.loss_scaler.init_scale, scale);
    ASSERT_EQ(zs_config_from_json(R"({"fp16": {"loss_scale": 0}})", &t), ZS_OK);
    EXPECT_EQ(t.loss_scaler.mode, ZS_LOSS_SCALE_DYNAMIC);
    EXPECT_EQ(t.loss_scaler.init_scale, 65536.0);
  }
  ASSERT_EQ(zs_config_from_json(R"({"gradient_clipping": 0})", &j), ZS_OK);
  EXPECT_EQ(j.clip_grad_norm, 0);
  EXPECT_EQ(zs_config_from_json(R"({"gradient_clipping": -1})", &j),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("gradient_clipping");
  EXPECT_EQ(zs_config_from_json(R"({"gradient_accumulation_steps": 0})", &j),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("gradient_accumulation_steps");
  EXPECT_EQ(zs_config_from_json(R"({"communication_data_type": "bf16"})", &j),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("communication_data_type");
}

// Offload with the CUDA backend: the optimizer's (cpu or nvme) and, at
// stage 3, the parameter shards' (in host memory or on NVMe) all pass the
// config check; the check's other rules still hold (stage 3, an offloaded
// optimizer).
TEST(Config, OffloadWithCudaPassesTheCheck) {
  zs_config c = Defaults();
  c.device = ZS_DEVICE_CUDA;
  c.stage = 3;
  c.nvme.path = "/tmp";
  for (int opt : {1, 2})
    for (int param : {0, 1, 2}) {
      c.offload_optimizer.device = (zs_offload_device)opt;
      c.offload_param = (zs_offload_device)param;
      EXPECT_EQ(zs_config_validate(&c), ZS_OK)
          << "optimizer " << opt << " param " << param << ": " << zs_last_error();
    }
  c.stage = 2;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_param"), std::string::npos)
      << zs_last_error();
}

// zs_config_from_json keeps each distinct nvme_path for the process's
// life, however many (a fixed table of 64 once made the 65th distinct path
// OUT_OF_MEMORY): 10,000 configs with distinct paths in one process, each
// with its own string, and a repeated path gets the string kept for it.
TEST(Config, JsonKeepsAnyNumberOfDistinctPaths) {
  const char* first = nullptr;
  for (int i = 0; i < 10000; i++) {
    zs_config c = ZS_CONFIG_INIT;
    const std::string path = "/tmp/zs-json-path-" + std::to_string(i);
    const std::string json =
        R"({"zero_optimization": {"offload_optimizer": {"device": "nvme", )"
        R"("nvme_path": ")" + path + R"("}}})";
    ASSERT_EQ(zs_config_from_json(json.c_str(), &c), ZS_OK)
        << "config " << i << ": " << zs_last_error();
    ASSERT_NE(c.nvme.path, nullptr) << i;
    ASSERT_STREQ(c.nvme.path, path.c_str()) << i;
    if (i == 0) first = c.nvme.path;
  }
  zs_config c = ZS_CONFIG_INIT;
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"offload_optimizer":
      {"device": "nvme", "nvme_path": "/tmp/zs-json-path-0"}}})", &c), ZS_OK);
  EXPECT_EQ(c.nvme.path, first);
  EXPECT_STREQ(first, "/tmp/zs-json-path-0");
}

TEST(Config, InitEqualsInitializerMacro) {
  zs_config macro = ZS_CONFIG_INIT;
  zs_config init;
  std::memset(&init, 0x5A, sizeof init);
  ASSERT_EQ(zs_config_init(&init), ZS_OK) << zs_last_error();
  // the macro leaves every field UNSET, init fills the defaults: both
  // resolve to the same configuration
  zs_config a = init, b = macro;
  ASSERT_EQ(zs_config_resolve(&init, &a), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_config_resolve(&macro, &b), ZS_OK) << zs_last_error();
  ExpectConfigEq(a, b);
  // The documented defaults.
  EXPECT_EQ(init.struct_size, sizeof(zs_config));
  EXPECT_EQ(init.version, static_cast<unsigned>(ZS_VERSION_CODE));
  EXPECT_EQ(init.stage, 0);
  EXPECT_EQ(init.device, ZS_DEVICE_HOST);
  EXPECT_EQ(init.optimizer.kind, ZS_OPTIM_ADAMW);
  EXPECT_EQ(init.optimizer.lr, 1e-3);
  EXPECT_EQ(init.optimizer.beta1, 0.9);
  EXPECT_EQ(init.optimizer.beta2, 0.999);
  EXPECT_EQ(init.optimizer.eps, 1e-8);
  EXPECT_EQ(init.optimizer.weight_decay, ZS_WEIGHT_DECAY_DEFAULT);
  EXPECT_EQ(init.log_level, 1);
  EXPECT_EQ(init.collective_timeout_s, 1800.0);
  EXPECT_EQ(zs_config_init(nullptr), ZS_ERR_INVALID_ARGUMENT);
}

TEST(Config, ValidateAcceptsGoodConfigs) {
  zs_config c = Defaults();
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  for (int stage = 0; stage <= 3; stage++) {
    c = Defaults();
    c.stage = stage;
    EXPECT_EQ(zs_config_validate(&c), ZS_OK) << "stage " << stage << ": "
                                             << zs_last_error();
  }
  for (int level = 0; level <= 3; level++) {
    c = Defaults();
    c.log_level = (zs_log_level)level;
    EXPECT_EQ(zs_config_validate(&c), ZS_OK) << "log_level " << level << ": "
                                             << zs_last_error();
  }
  c = Defaults();
  c.device = ZS_DEVICE_CUDA;
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  c = Defaults();
  c.optimizer.kind = ZS_OPTIM_ADAM;
  c.optimizer.lr = 0.0;
  c.optimizer.beta1 = 0.0;
  c.optimizer.weight_decay = 0.0;
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  c = Defaults();
  c.optimizer.kind = ZS_OPTIM_SGD;
  c.optimizer.momentum = 0.9;
  c.optimizer.nesterov = 1;
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  c.optimizer.nesterov = 0;
  c.optimizer.dampening = 0.5;
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
}

TEST(Config, ValidateRejectsEachBadFieldByName) {
  const double kNaN = std::numeric_limits<double>::quiet_NaN();
  const double kInf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* what;
    void (*mutate)(zs_config*);
    const char* field;  // must appear in the message
  };
  static double nan_v, inf_v;
  nan_v = kNaN;
  inf_v = kInf;
  const Case cases[] = {
      {"stage 4", [](zs_config* c) { c->stage = 4; }, "config.stage"},
      {"prefetch_depth 65", [](zs_config* c) { c->prefetch_depth = 65; },
       "config.prefetch_depth"},
      {"prefetch_depth -1", [](zs_config* c) { c->prefetch_depth = -1; },
       "config.prefetch_depth"},
      {"bucket_elements 0", [](zs_config* c) { c->bucket_elements = 0; },
       "config.bucket_elements"},
      {"bucket_elements 2^31", [](zs_config* c) { c->bucket_elements = (size_t)1 << 31; },
       "config.bucket_elements"},
      {"reshard_after_forward 2",
       [](zs_config* c) { c->reshard_after_forward = 2; },
       "config.reshard_after_forward"},
      {"reduce_order 2", [](zs_config* c) { c->reduce_order = (zs_reduce_order)2; },
       "config.reduce_order"},
      {"progress_thread 3", [](zs_config* c) { c->progress_thread = 3; },
       "config.progress_thread"},
      {"collective_timeout_s -1",
       [](zs_config* c) { c->collective_timeout_s = -1; },
       "config.collective_timeout_s"},
      {"stage -1", [](zs_config* c) { c->stage = -1; }, "config.stage"},
      {"device 7",
       [](zs_config* c) { c->device = static_cast<zs_device_kind>(7); },
       "config.device"},
      {"optimizer kind 9",
       [](zs_config* c) {
         c->optimizer.kind = static_cast<zs_optimizer_kind>(9);
       },
       "config.optimizer.kind"},
      {"lr -1", [](zs_config* c) { c->optimizer.lr = -1; },
       "config.optimizer.lr"},
      {"lr NaN", [](zs_config* c) { c->optimizer.lr = nan_v; },
       "config.optimizer.lr"},
      {"lr inf", [](zs_config* c) { c->optimizer.lr = inf_v; },
       "config.optimizer.lr"},
      {"weight_decay -0.1",
       [](zs_config* c) { c->optimizer.weight_decay = -0.1; },
       "config.optimizer.weight_decay"},
      {"beta1 1.0", [](zs_config* c) { c->optimizer.beta1 = 1.0; },
       "config.optimizer.beta1"},
      {"beta1 -0.5", [](zs_config* c) { c->optimizer.beta1 = -0.5; },
       "config.optimizer.beta1"},
      {"beta2 1.5", [](zs_config* c) { c->optimizer.beta2 = 1.5; },
       "config.optimizer.beta2"},
      {"eps 0", [](zs_config* c) { c->optimizer.eps = 0; },
       "config.optimizer.eps"},
      {"eps NaN", [](zs_config* c) { c->optimizer.eps = nan_v; },
       "config.optimizer.eps"},
      {"sgd momentum -1",
       [](zs_config* c) {
         c->optimizer.kind = ZS_OPTIM_SGD;
         c->optimizer.momentum = -1;
       },
       "config.optimizer.momentum"},
      {"sgd nesterov with dampening",
       [](zs_config* c) {
         c->optimizer.kind = ZS_OPTIM_SGD;
         c->optimizer.momentum = 0.9;
         c->optimizer.dampening = 0.1;
         c->optimizer.nesterov = 1;
       },
       "config.optimizer.nesterov"},
      {"sgd nesterov without momentum",
       [](zs_config* c) {
         c->optimizer.kind = ZS_OPTIM_SGD;
         c->optimizer.nesterov = 1;
       },
       "config.optimizer.nesterov"},
      {"sgd nesterov 2",
       [](zs_config* c) {
         c->optimizer.kind = ZS_OPTIM_SGD;
         c->optimizer.momentum = 0.9;
         c->optimizer.nesterov = 2;
       },
       "config.optimizer.nesterov"},
      {"struct_size mismatch",
       [](zs_config* c) { c->struct_size = sizeof(zs_config) - 8; },
       "config.struct_size"},
      {"version from another major",
       [](zs_config* c) { c->version = ZS_VERSION_CODE + 10000; },
       "config.version"},
      {"version 0 (not initialized)", [](zs_config* c) { c->version = 0; },
       "config.version is 0: the config was not initialized"},
      {"log_level 5", [](zs_config* c) { c->log_level = (zs_log_level)5; },
       "config.log_level"},
      {"log_level -1", [](zs_config* c) { c->log_level = (zs_log_level)-1; },
       "config.log_level"},
  };
  for (const Case& k : cases) {
    zs_config c = Defaults();
    k.mutate(&c);
    zs_config before = c;
    EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT) << k.what;
    EXPECT_PRED2(Contains, std::string(zs_last_error()),
                 std::string(k.field))
        << k.what;
    SCOPED_TRACE(k.what);
    ExpectConfigEq(c, before);  // validate has no side effects
  }
  EXPECT_EQ(zs_config_validate(nullptr), ZS_ERR_INVALID_ARGUMENT);
  // The sized initializer refuses sizes of no release, 0 among them.
  zs_config s;
  for (size_t size : {(size_t)0, (size_t)8, sizeof(zs_config) + 8}) {
    EXPECT_EQ(zs_config_init_sized(&s, size), ZS_ERR_INVALID_ARGUMENT) << size;
    EXPECT_LAST_ERROR_HAS("struct_size");
  }
  zs_config d = Defaults();
  EXPECT_EQ(zs_config_resolve(&d, nullptr), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("zs_config_resolve");
}

// ==== Configuration: JSON ================================================

// A config with every field away from its default, to detect changes.
zs_config Distinctive() {
  zs_config c = Defaults();
  c.stage = 1;
  c.optimizer.kind = ZS_OPTIM_ADAM;
  c.optimizer.lr = 0.25;
  c.optimizer.beta1 = 0.5;
  c.optimizer.beta2 = 0.75;
  c.optimizer.eps = 1e-5;
  c.optimizer.weight_decay = 0.125;
  c.optimizer.momentum = 0.3;
  c.optimizer.dampening = 0.2;
  c.log_level = ZS_LOG_ERROR;
  return c;
}

// Copies src field by field into *dst after zeroing it, so that every byte
// of *dst (padding too) is defined and memcmp can prove that a failed call
// left the config bit-for-bit unchanged.
void DefinedCopy(const zs_config& src, zs_config* dst) {
  std::memset(dst, 0, sizeof *dst);
  dst->struct_size = src.struct_size;
  dst->version = src.version;
  dst->stage = src.stage;
  dst->device = src.device;
  dst->optimizer.kind = src.optimizer.kind;
  dst->optimizer.lr = src.optimizer.lr;
  dst->optimizer.beta1 = src.optimizer.beta1;
  dst->optimizer.beta2 = src.optimizer.beta2;
  dst->optimizer.eps = src.optimizer.eps;
  dst->optimizer.weight_decay = src.optimizer.weight_decay;
  dst->optimizer.momentum = src.optimizer.momentum;
  dst->optimizer.dampening = src.optimizer.dampening;
  dst->optimizer.nesterov = src.optimizer.nesterov;
  dst->log_level = src.log_level;
  dst->collective_timeout_s = src.collective_timeout_s;
  dst->bucket_elements = src.bucket_elements;
  dst->prefetch_depth = src.prefetch_depth;
  dst->max_live_elements = src.max_live_elements;
  dst->reshard_after_forward = src.reshard_after_forward;
  dst->reduce_order = src.reduce_order;
  dst->progress_thread = src.progress_thread;
  dst->reduce_dtype = src.reduce_dtype;
  dst->grad_accum_steps = src.grad_accum_steps;
  dst->grad_accum_local = src.grad_accum_local;
  dst->clip_grad_norm = src.clip_grad_norm;
  dst->max_grad_norm = src.max_grad_norm;
  dst->loss_scaler.mode = src.loss_scaler.mode;
  dst->loss_scaler.init_scale = src.loss_scaler.init_scale;
  dst->loss_scaler.growth_factor = src.loss_scaler.growth_factor;
  dst->loss_scaler.backoff_factor = src.loss_scaler.backoff_factor;
  dst->loss_scaler.growth_interval = src.loss_scaler.growth_interval;
  dst->loss_scaler.min_scale = src.loss_scaler.min_scale;
  dst->loss_scaler.hysteresis = src.loss_scaler.hysteresis;
  dst->param_persistence_threshold = src.param_persistence_threshold;
  dst->heartbeat_timeout_s = src.heartbeat_timeout_s;
  dst->host_collectives = src.host_collectives;
  dst->shard_group_size = src.shard_group_size;
}

TEST(ConfigJson, FullDeepSpeedStyleExample) {
  const char* text = R"({
    "zero_optimization": {"stage": 3},
    "optimizer": {
      "type": "AdamW",
      "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                 "weight_decay": 0.1}
    },
    "device": "cuda",
    "log_level": 2
  })";
  zs_config c = Defaults();
  ASSERT_EQ(zs_config_from_json(text, &c), ZS_OK) << zs_last_error();
  zs_config want = Defaults();
  want.stage = 3;
  want.device = ZS_DEVICE_CUDA;
  want.optimizer.kind = ZS_OPTIM_ADAMW;
  want.optimizer.lr = 3e-4;
  want.optimizer.beta1 = 0.8;
  want.optimizer.beta2 = 0.95;
  want.optimizer.eps = 1e-6;
  want.optimizer.weight_decay = 0.1;
  want.log_level = ZS_LOG_INFO;
  ExpectConfigEq(c, want);
}

// NVMe offload from JSON: DeepSpeed's keys (offload_optimizer.nvme_path,
// buffer_count, zero_optimization.sub_group_size, aio.block_size and
// queue_depth) plus buffer_size and aio.backend.
TEST(ConfigJson, NvmeOffloadKeys) {
  zs_config c = Defaults();
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "sub_group_size": 1000000, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/local_nvme", "buffer_count": 12, "buffer_size": 8388608}},
      "aio": {"block_size": 2097152, "queue_depth": 32, "backend": "threads"}})",
                                &c), ZS_OK) << zs_last_error();
  EXPECT_EQ(c.offload_optimizer.device, 2);
  EXPECT_STREQ(c.nvme.path, "/local_nvme");
  EXPECT_EQ(c.nvme.buffer_count, 12u);
  EXPECT_EQ(c.nvme.buffer_size, 8388608u);
  EXPECT_EQ(c.nvme.sub_group_size, 1000000u);
  EXPECT_EQ(c.nvme.block_size, 2097152u);
  EXPECT_EQ(c.nvme.queue_depth, 32);
  EXPECT_EQ(c.nvme.aio, 2);
  // offload_param: DeepSpeed's device, nvme_path, buffer_count and
  // buffer_size (elements, as DeepSpeed's); one swap directory for both
  // sections
  zs_config d = Defaults();
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme",
      "nvme_path": "/local_nvme", "buffer_count": 7, "buffer_size": 100000000}}})",
                                &d), ZS_OK) << zs_last_error();
  EXPECT_EQ(d.offload_param, 2);
  EXPECT_EQ(d.offload_optimizer.device, 1);
  EXPECT_STREQ(d.nvme.path, "/local_nvme");
  EXPECT_EQ(d.nvme.param_buffer_count, 7u);
  EXPECT_EQ(d.nvme.param_buffer_elements, 100000000u);  // elements, as DeepSpeed's
  d = Defaults();
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
      "offload_param": {"device": "nvme", "nvme_path": "/b"}}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("share one swap directory");
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme"}}})",
                                &d), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("config.nvme.path");
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "disk"}}})",
                                &d), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("offload_param.device");
  EXPECT_EQ(zs_config_from_json(R"({"aio": {"backend": "libaio"}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("aio.backend");
  EXPECT_EQ(zs_config_from_json(
                R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("config.nvme.path");
  EXPECT_EQ(d.offload_optimizer.device, 0);  // unchanged on error
  // a path whose swap files would pass the path limit: refused by validate
  zs_config lp = Defaults();
  const std::string longpath(4001, 'p');
  lp.offload_optimizer.device = ZS_OFFLOAD_NVME;
  lp.nvme.path = longpath.c_str();
  EXPECT_EQ(zs_config_validate(&lp), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("config.nvme.path is 4001 bytes: at most 4000");
  const std::string fits(4000, 'p');
  lp.nvme.path = fits.c_str();
  EXPECT_EQ(zs_config_validate(&lp), ZS_OK) << zs_last_error();
}

// NVMe keys in a section that does not offload to NVMe are accepted, as
// DeepSpeed accepts them, with a warning naming them; a path the other
// section uses is not warned about.
TEST(ConfigJson, NvmeKeysOfAnotherDeviceAreWarnedAbout) {
  zs_config c = Defaults();
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme",
      "buffer_count": 4}}})", &c), ZS_OK) << zs_last_error();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("zero_optimization.offload_optimizer: nvme_path, "
                     "buffer_count and buffer_size apply to \"device\": \"nvme\" "
                     "only and are ignored here (device \"cpu\")"),
            std::string::npos) << err;
  c = Defaults();
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme"}}})", &c), ZS_OK) << zs_last_error();
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("ignored"), std::string::npos) << err;
  EXPECT_STREQ(c.nvme.path, "/local_nvme");
}

TEST(ConfigJson, SgdParamsAndBooleanNesterov) {
  const char* text = R"({"optimizer": {"type": "SGD", "params": {
      "lr": 0.1, "momentum": 0.9, "dampening": 0, "nesterov": true,
      "weight_decay": 0.0005}}, "device": "host"})";
  zs_config c = Distinctive();
  c.device = ZS_DEVICE_CUDA;
  ASSERT_EQ(zs_config_from_json(text, &c), ZS_OK) << zs_last_error();
  zs_config want = Distinctive();
  want.device = ZS_DEVICE_HOST;
  want.optimizer.kind = ZS_OPTIM_SGD;
  want.optimizer.lr = 0.1;
  want.optimizer.momentum = 0.9;
  want.optimizer.dampening = 0;
  want.optimizer.nesterov = 1;
  want.optimizer.weight_decay = 0.0005;
  ExpectConfigEq(c, want);
  // nesterov also takes 0/1 and false.
  ASSERT_EQ(zs_config_from_json(
                R"({"optimizer": {"params": {"nesterov": false}}})", &c),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.optimizer.nesterov, 0);
  ASSERT_EQ(zs_config_from_json(R"({"optimizer": {"params": {"nesterov": 1}}})",
                                &c),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.optimizer.nesterov, 1);
}

TEST(ConfigJson, OptimizerTypeIsCaseInsensitive) {
  struct {
    const char* type;
    zs_optimizer_kind kind;
  } rows[] = {{"AdamW", ZS_OPTIM_ADAMW}, {"adamw", ZS_OPTIM_ADAMW},
              {"ADAMW", ZS_OPTIM_ADAMW}, {"Adam", ZS_OPTIM_ADAM},
              {"adam", ZS_OPTIM_ADAM},   {"aDaM", ZS_OPTIM_ADAM},
              {"SGD", ZS_OPTIM_SGD},     {"sgd", ZS_OPTIM_SGD},
              {"Sgd", ZS_OPTIM_SGD}};
  for (const auto& r : rows) {
    std::string text =
        std::string(R"({"optimizer": {"type": ")") + r.type + "\"}}";
    zs_config c = Defaults();
    c.optimizer.kind = static_cast<zs_optimizer_kind>(
        (static_cast<int>(r.kind) + 1) % 3);
    ASSERT_EQ(zs_config_from_json(text.c_str(), &c), ZS_OK)
        << r.type << ": " << zs_last_error();
    EXPECT_EQ(c.optimizer.kind, r.kind) << r.type;
  }
}

TEST(ConfigJson, EmptyObjectKeepsEverything) {
  zs_config c;
  DefinedCopy(Distinctive(), &c);
  zs_config before;
  std::memcpy(&before, &c, sizeof c);
  ASSERT_EQ(zs_config_from_json("{}", &c), ZS_OK) << zs_last_error();
  ExpectConfigEq(c, before);
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {}, "optimizer": {}})",
                                &c),
            ZS_OK)
      << zs_last_error();
  ExpectConfigEq(c, before);
}

TEST(ConfigJson, StageValues) {
  for (int stage = 0; stage <= 3; stage++) {
    std::string text = "{\"zero_optimization\": {\"stage\": " +
                       std::to_string(stage) + "}}";
    zs_config c = Defaults();
    ASSERT_EQ(zs_config_from_json(text.c_str(), &c), ZS_OK) << text;
    EXPECT_EQ(c.stage, stage);
  }
  // 2.0 is an integer in JSON's number model.
  zs_config c = Defaults();
  ASSERT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 2.0}})",
                                &c),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.stage, 2);
}

// Expects text to fail with INVALID_ARGUMENT, a message containing each of
// `needles`, and a config that is bit-for-bit unchanged.
void ExpectJsonError(const char* text, std::vector<std::string> needles) {
  zs_config c;
  DefinedCopy(Distinctive(), &c);
  zs_config before;
  std::memcpy(&before, &c, sizeof c);
  EXPECT_EQ(zs_config_from_json(text, &c), ZS_ERR_INVALID_ARGUMENT) << text;
  for (const std::string& n : needles)
    EXPECT_PRED2(Contains, std::string(zs_last_error()), n) << text;
  EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0)
      << text << ": config changed on error";
  ExpectConfigEq(c, before);
}

TEST(ConfigJson, UnknownKeysNameTheFullPath) {
  ExpectJsonError(R"({"zero_optimisation": {"stage": 1}})",
                  {"unknown key", "\"zero_optimisation\""});
  ExpectJsonError(R"({"zero_optimization": {"stag": 1}})",
                  {"unknown key", "\"zero_optimization.stag\""});
  ExpectJsonError(R"({"zero_optimization": {"stage": 1, "offload": {}}})",
                  {"\"zero_optimization.offload\""});
  ExpectJsonError(R"({"optimizer": {"typ": "Adam"}})",
                  {"unknown key", "\"optimizer.typ\""});
  ExpectJsonError(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.1,
                      "learning_rate": 0.1}}})",
                  {"unknown key", "\"optimizer.params.learning_rate\""});
  ExpectJsonError(R"({"optimizer": {"params": {"beta1": 0.9}}})",
                  {"\"optimizer.params.beta1\""});
  ExpectJsonError(R"({"train_batch_size": 8})", {"\"train_batch_size\""});
  // Keys are case-sensitive.
  ExpectJsonError(R"({"Device": "host"})", {"\"Device\""});
}

// DeepSpeed keys without a counterpart here (docs/config.md lists them)
// are unknown keys, never silently ignored.
// A key given twice: cJSON keeps both and its lookups see the first, so
// the second would be silently ignored.
TEST(ConfigJson, KeysGivenTwiceAreRefused) {
  ExpectJsonError(R"({"zero_optimization": {"stage": 1, "stage": 2}})",
                  {"\"zero_optimization.stage\" is given twice"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 1}, "zero_optimization": {"stage": 2}})",
                  {"\"zero_optimization\" is given twice"});
  ExpectJsonError(R"({"optimizer": {"params": {"lr": 0.1, "lr": 0.2}}})",
                  {"optimizer.params.lr\" is given twice"});
}

// 0.3's fields: defaults, ranges, JSON keys (DeepSpeed's
// stage3_param_persistence_threshold; heartbeat_timeout beside
// collective_timeout), and a 0.2 caller's struct that lacks them.
TEST(ConfigJson, PersistenceThresholdAndHeartbeat) {
  zs_config c = Defaults();
  EXPECT_EQ(c.param_persistence_threshold, 0u);
  EXPECT_EQ(c.heartbeat_timeout_s, 30.0);
  ASSERT_EQ(zs_config_from_json(
                R"({"zero_optimization": {"stage3_param_persistence_threshold": )"
                R"(1000}, "heartbeat_timeout": 5})", &c),
            ZS_OK) << zs_last_error();
  EXPECT_EQ(c.param_persistence_threshold, 1000u);
  EXPECT_EQ(c.heartbeat_timeout_s, 5.0);
  for (double bad : {-1.0, 0.5, 1e6}) {
    zs_config b = Defaults();
    b.heartbeat_timeout_s = bad;
    EXPECT_EQ(zs_config_validate(&b), ZS_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(zs_last_error()).find("config.heartbeat_timeout_s"),
              std::string::npos) << zs_last_error();
  }
  zs_config off = Defaults();
  off.heartbeat_timeout_s = 0;  // off
  EXPECT_EQ(zs_config_validate(&off), ZS_OK) << zs_last_error();
  // a caller of 0.2 (328 bytes, version 200): the keys have no field there
  alignas(zs_config) unsigned char raw[sizeof(zs_config)] = {0};
  zs_config* old = reinterpret_cast<zs_config*>(raw);
  ASSERT_EQ(zs_config_init_sized(old, 328), ZS_OK) << zs_last_error();
  EXPECT_LT(old->version, 300u);
  EXPECT_EQ(zs_config_from_json(R"({"heartbeat_timeout": 5})", old),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("0.3 added it"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"stage": 1}})", old),
            ZS_OK) << zs_last_error();
  for (size_t i = 328; i < sizeof raw; i++) EXPECT_EQ(raw[i], 0) << i;
}

// host_collectives (0.3): default AUTO, the JSON words, bad values named,
// ZS_HOST_COLLECTIVES overriding the config (and refused when it is not
// one of the words), and a 0.2 caller's struct that lacks the field.
TEST(ConfigJson, HostCollectives) {
  unsetenv("ZS_HOST_COLLECTIVES");
  zs_config c = Defaults();
  EXPECT_EQ(c.host_collectives, ZS_HOST_COLLECTIVES_AUTO);
  const struct {
    const char* word;
    zs_host_collectives want;
  } words[] = {{"shm", ZS_HOST_COLLECTIVES_SHM},
               {"mpi", ZS_HOST_COLLECTIVES_MPI},
               {"auto", ZS_HOST_COLLECTIVES_AUTO}};
  for (const auto& w : words) {
    ASSERT_EQ(zs_config_from_json(
                  (std::string(R"({"host_collectives": ")") + w.word + "\"}")
                      .c_str(), &c),
              ZS_OK) << zs_last_error();
    EXPECT_EQ(c.host_collectives, w.want) << w.word;
  }
  ExpectJsonError(R"({"host_collectives": "SHM"})",
                  {"host_collectives: expected \"auto\""});
  ExpectJsonError(R"({"host_collectives": 1})",
                  {"host_collectives: expected \"auto\""});
  zs_config b = Defaults();
  b.host_collectives = (zs_host_collectives)7;
  EXPECT_EQ(zs_config_validate(&b), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("config.host_collectives"),
            std::string::npos) << zs_last_error();
  // the environment wins over the config, and a bad word is refused
  zs_config in = ZS_CONFIG_INIT, out = Defaults();
  in.host_collectives = ZS_HOST_COLLECTIVES_SHM;
  setenv("ZS_HOST_COLLECTIVES", "mpi", 1);
  ASSERT_EQ(zs_config_resolve(&in, &out), ZS_OK) << zs_last_error();
  EXPECT_EQ(out.host_collectives, ZS_HOST_COLLECTIVES_MPI);
  setenv("ZS_HOST_COLLECTIVES", "fast", 1);
  EXPECT_EQ(zs_config_validate(&in), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("ZS_HOST_COLLECTIVES=fast"),
            std::string::npos) << zs_last_error();
  unsetenv("ZS_HOST_COLLECTIVES");
  EXPECT_EQ(zs_config_validate(&in), ZS_OK) << zs_last_error();
  // a 0.2 caller has no field for the key
  alignas(zs_config) unsigned char raw[sizeof(zs_config)] = {0};
  zs_config* old = reinterpret_cast<zs_config*>(raw);
  ASSERT_EQ(zs_config_init_sized(old, 328), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_config_from_json(R"({"host_collectives": "mpi"})", old),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("0.3 added it"),
            std::string::npos) << zs_last_error();
}

// shard_group_size (0.4): default 0 (all ranks), a rank count or "node"
// (ZS_SHARD_GROUP_NODE), DeepSpeed MiCS's zero_optimization.mics_shard_size
// (-1: all ranks), bad values named, and a caller of 0.3 (352 bytes) or
// 0.2 refused the keys, its struct untouched past its end.
TEST(ConfigJson, ShardGroupSize) {
  zs_config c = Defaults();
  EXPECT_EQ(c.shard_group_size, 0);
  ASSERT_EQ(zs_config_from_json(R"({"shard_group_size": 4})", &c), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.shard_group_size, 4);
  ASSERT_EQ(zs_config_from_json(R"({"shard_group_size": "node"})", &c), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.shard_group_size, ZS_SHARD_GROUP_NODE);
  ASSERT_EQ(zs_config_from_json(R"({"shard_group_size": 0})", &c), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.shard_group_size, 0);
  ASSERT_EQ(zs_config_from_json(
                R"({"zero_optimization": {"mics_shard_size": 2}})", &c),
            ZS_OK) << zs_last_error();
  EXPECT_EQ(c.shard_group_size, 2);
  ASSERT_EQ(zs_config_from_json(
                R"({"zero_optimization": {"mics_shard_size": -1}})", &c),
            ZS_OK) << zs_last_error();
  EXPECT_EQ(c.shard_group_size, 0);  // -1: all ranks
  // (the word in any case, as the other string options)
  ASSERT_EQ(zs_config_from_json(R"({"shard_group_size": "Node"})", &c), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.shard_group_size, ZS_SHARD_GROUP_NODE);
  ExpectJsonError(R"({"shard_group_size": 2, "zero_optimization": {"mics_shard_size": 4}})",
                  {"both set the shard group"});
  ExpectJsonError(R"({"shard_group_size": "nodes"})",
                  {"shard_group_size: expected a rank count or \"node\""});
  ExpectJsonError(R"({"shard_group_size": true})",
                  {"shard_group_size: expected a rank count or \"node\""});
  ExpectJsonError(R"({"shard_group_size": -1})",
                  {"shard_group_size: expected an integer"});
  ExpectJsonError(R"({"shard_group_size": 2.5})",
                  {"shard_group_size: expected an integer"});
  ExpectJsonError(R"({"zero_optimization": {"mics_shard_size": -2}})",
                  {"zero_optimization.mics_shard_size: expected an integer"});
  ExpectJsonError(R"({"zero_optimization": {"mics_shard_size": "2"}})",
                  {"zero_optimization.mics_shard_size: expected an integer"});
  for (int bad : {-2, -7, ZS_UNSET_INT + 1}) {
    zs_config b = Defaults();
    b.shard_group_size = bad;
    EXPECT_EQ(zs_config_validate(&b), ZS_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(zs_last_error()).find("config.shard_group_size"),
              std::string::npos) << zs_last_error();
  }
  for (int good : {0, 1, 3, ZS_SHARD_GROUP_NODE}) {
    zs_config g = Defaults();
    g.shard_group_size = good;
    EXPECT_EQ(zs_config_validate(&g), ZS_OK) << good << ": " << zs_last_error();
  }
  zs_config unset = ZS_CONFIG_INIT, resolved = Defaults();
  ASSERT_EQ(zs_config_resolve(&unset, &resolved), ZS_OK) << zs_last_error();
  EXPECT_EQ(resolved.shard_group_size, 0);
  // callers of 0.3 (352 bytes) and 0.2 (328) have no field for the keys
  for (size_t size : {352u, 328u}) {
    alignas(zs_config) unsigned char raw[sizeof(zs_config)] = {0};
    zs_config* old = reinterpret_cast<zs_config*>(raw);
    ASSERT_EQ(zs_config_init_sized(old, size), ZS_OK) << zs_last_error();
    EXPECT_EQ(old->struct_size, size);
    EXPECT_LT(old->version, 400u);
    for (const char* text :
         {R"({"shard_group_size": 2})", R"({"shard_group_size": "node"})",
          R"({"zero_optimization": {"mics_shard_size": 2}})"}) {
      unsigned char before[sizeof raw];
      std::memcpy(before, raw, sizeof raw);
      EXPECT_EQ(zs_config_from_json(text, old), ZS_ERR_INVALID_ARGUMENT)
          << size << ": " << text;
      const std::string e = zs_last_error();
      EXPECT_NE(e.find(std::strstr(text, "mics") != nullptr
                           ? "zero_optimization.mics_shard_size"
                           : "shard_group_size"),
                std::string::npos) << e;
      EXPECT_NE(e.find(std::to_string(size) + " bytes"), std::string::npos)
          << e;
      EXPECT_EQ(std::memcmp(raw, before, sizeof raw), 0)
          << size << ": " << text << ": config changed on error";
    }
    if (size == 352) {  // 0.3's own key still sets 0.3's field
      EXPECT_EQ(old->version, 300u);
      ASSERT_EQ(zs_config_from_json(R"({"host_collectives": "mpi"})", old),
                ZS_OK) << zs_last_error();
      EXPECT_EQ(old->host_collectives, ZS_HOST_COLLECTIVES_MPI);
      EXPECT_EQ(old->struct_size, 352u);
    }
    for (size_t i = size; i < sizeof raw; i++) EXPECT_EQ(raw[i], 0) << i;
  }
}

TEST(ConfigJson, DeepSpeedKeysWithoutACounterpartAreRefused) {
  for (const char* key : {"thread_count", "single_submit", "overlap_events"})
    ExpectJsonError((std::string(R"({"aio": {")") + key + R"(": 1}})").c_str(),
                    {"unknown key", std::string("\"aio.") + key + "\""});
  for (const char* key : {"pipeline_read", "pipeline_write", "fast_init", "ratio"})
    ExpectJsonError((std::string(R"({"zero_optimization": {"offload_optimizer": )"
                                 R"({"device": "nvme", "nvme_path": "/x", ")") +
                     key + R"(": 1}}})").c_str(),
                    {"unknown key",
                     std::string("\"zero_optimization.offload_optimizer.") + key + "\""});
  ExpectJsonError(R"({"zero_optimization": {"stage": 3, "offload_param": )"
                  R"({"device": "cpu", "max_in_cpu": 1}}})",
                  {"\"zero_optimization.offload_param.max_in_cpu\""});
}

TEST(ConfigJson, WrongTypesNameTheKey) {
  ExpectJsonError(R"({"zero_optimization": 3})", {"zero_optimization"});
  ExpectJsonError(R"({"zero_optimization": {"stage": "3"}})",
                  {"zero_optimization.stage"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 2.5}})",
                  {"zero_optimization.stage"});
  ExpectJsonError(R"({"zero_optimization": {"stage": true}})",
                  {"zero_optimization.stage"});
  ExpectJsonError(R"({"zero_optimization": {"stage": null}})",
                  {"zero_optimization.stage"});
  ExpectJsonError(R"({"optimizer": "adam"})", {"optimizer"});
  ExpectJsonError(R"({"optimizer": {"type": 1}})", {"optimizer.type"});
  ExpectJsonError(R"({"optimizer": {"type": "Lamb"}})",
                  {"optimizer.type", "Lamb"});
  ExpectJsonError(R"({"optimizer": {"params": [0.1]}})",
                  {"optimizer.params"});
  ExpectJsonError(R"({"optimizer": {"params": {"lr": "0.1"}}})",
                  {"optimizer.params.lr"});
  ExpectJsonError(R"({"optimizer": {"params": {"eps": null}}})",
                  {"optimizer.params.eps"});
  ExpectJsonError(R"({"optimizer": {"params": {"weight_decay": [0]}}})",
                  {"optimizer.params.weight_decay"});
  ExpectJsonError(R"({"optimizer": {"params": {"momentum": {}}}})",
                  {"optimizer.params.momentum"});
  ExpectJsonError(R"({"optimizer": {"params": {"dampening": false}}})",
                  {"optimizer.params.dampening"});
  ExpectJsonError(R"({"optimizer": {"params": {"betas": 0.9}}})",
                  {"optimizer.params.betas"});
  ExpectJsonError(R"({"optimizer": {"params": {"betas": [0.9]}}})",
                  {"optimizer.params.betas"});
  ExpectJsonError(R"({"optimizer": {"params": {"betas": [0.9, 0.99, 0.5]}}})",
                  {"optimizer.params.betas"});
  ExpectJsonError(R"({"optimizer": {"params": {"betas": [0.9, "x"]}}})",
                  {"optimizer.params.betas"});
  ExpectJsonError(R"({"optimizer": {"params": {"nesterov": 2}}})",
                  {"optimizer.params.nesterov"});
  ExpectJsonError(R"({"optimizer": {"params": {"nesterov": "yes"}}})",
                  {"optimizer.params.nesterov"});
  ExpectJsonError(R"({"device": "gpu"})", {"device"});
  ExpectJsonError(R"({"device": "cuda0"})", {"device"});
  ExpectJsonError(R"({"device": 1})", {"device"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 5}})",
                  {"zero_optimization.stage", "0..3", "got 5"});
  ExpectJsonError(R"({"log_level": true})", {"log_level", "got a boolean"});
  ExpectJsonError(R"({"log_level": "2"})", {"log_level"});
  ExpectJsonError(R"({"log_level": true})", {"log_level"});
  ExpectJsonError("[]", {"top level"});
  ExpectJsonError("3", {"top level"});
  ExpectJsonError("\"stage\"", {"top level"});
  ExpectJsonError("null", {"top level"});
}

TEST(ConfigJson, OutOfRangeValues) {
  // (-1 is the C sentinel for the optimizer's default: not a JSON value)
  ExpectJsonError(R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": -1}}})",
                  {"optimizer.params.weight_decay", ">= 0", "got -1"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 5}})",
                  {"zero_optimization.stage", "0..3"});
  ExpectJsonError(R"({"zero_optimization": {"stage": -1}})",
                  {"zero_optimization.stage", "0..3"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 1e10}})",
                  {"zero_optimization.stage"});
  ExpectJsonError(R"({"log_level": 7})", {"log_level", "0..3"});
  // Range checks of zs_config_validate apply to the merged result.
  ExpectJsonError(R"({"optimizer": {"params": {"lr": -1}}})",
                  {"config.optimizer.lr"});
  ExpectJsonError(R"({"optimizer": {"params": {"betas": [1.0, 0.999]}}})",
                  {"config.optimizer.beta1"});
  ExpectJsonError(R"({"optimizer": {"params": {"eps": 0}}})",
                  {"config.optimizer.eps"});
  ExpectJsonError(R"({"optimizer": {"type": "SGD", "params": {
                      "momentum": 0.9, "dampening": 0.1, "nesterov": true}}})",
                  {"config.optimizer.nesterov"});
}

TEST(ConfigJson, ErrorAfterValidSettingsChangesNothing) {
  // Valid keys come first; the error is in the last one read.
  ExpectJsonError(R"({"zero_optimization": {"stage": 3}, "device": "cuda",
                      "optimizer": {"type": "SGD", "params": {"lr": 0.2,
                      "momentum": "x"}}})",
                  {"optimizer.params.momentum"});
  ExpectJsonError(R"({"zero_optimization": {"stage": 3},
                      "optimizer": {"type": "SGD"}, "log_level": 9})",
                  {"log_level"});
}

TEST(ConfigJson, ParseErrorsGiveTheBytePosition) {
  struct {
    const char* text;
    size_t bad;  // index of the offending byte
  } cases[] = {
      {"", 0},
      {"{} x", 3},
      {R"({"stage": })", 10},
      {R"({"a" 1})", 5},
      {"{\n  \"zero_optimization\": {\"stage\": 2,}\n}", 37},
      {"{\"optimizer\": {\"type\": \"Adam\"", 29},
  };
  for (const auto& k : cases) {
    zs_config c;
    DefinedCopy(Distinctive(), &c);
    zs_config before;
    std::memcpy(&before, &c, sizeof c);
    EXPECT_EQ(zs_config_from_json(k.text, &c), ZS_ERR_INVALID_ARGUMENT)
        << k.text;
    std::string msg = zs_last_error();
    size_t at = msg.find("parse error at byte ");
    ASSERT_NE(at, std::string::npos) << msg;
    size_t pos = std::strtoul(msg.c_str() + at + 20, nullptr, 10);
    // cJSON reports the offending byte or the one after it.
    EXPECT_GE(pos, k.bad) << "text: " << k.text << "\nmessage: " << msg;
    EXPECT_LE(pos, k.bad + 1) << "text: " << k.text << "\nmessage: " << msg;
    EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0) << k.text;
  }
}

TEST(ConfigJson, NullArguments) {
  zs_config c = Defaults();
  EXPECT_EQ(zs_config_from_json(nullptr, &c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_config_from_json("{}", nullptr), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_config_from_json_file(nullptr, &c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_config_from_json_file("x.json", nullptr),
            ZS_ERR_INVALID_ARGUMENT);
}

std::string TempDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr && d[0] != '\0' ? d : "/tmp";
}

// Writes text to a fresh file under the temp dir; returns its path.
std::string WriteTemp(const std::string& text) {
  std::string tmpl = TempDir() + "/zs_config_XXXXXX";
  std::vector<char> path(tmpl.begin(), tmpl.end());
  path.push_back('\0');
  int fd = mkstemp(path.data());
  EXPECT_GE(fd, 0) << "mkstemp " << tmpl << ": " << std::strerror(errno);
  if (fd < 0) return "";
  EXPECT_EQ(write(fd, text.data(), text.size()),
            static_cast<ssize_t>(text.size()));
  close(fd);
  return path.data();
}

TEST(ConfigJsonFile, MissingFileIsAnIoErrorNamingIt) {
  std::string path = TempDir() + "/no_such_dir/zs_missing_config.json";
  zs_config c;
  DefinedCopy(Distinctive(), &c);
  zs_config before;
  std::memcpy(&before, &c, sizeof c);
  EXPECT_EQ(zs_config_from_json_file(path.c_str(), &c), ZS_ERR_IO);
  EXPECT_LAST_ERROR_HAS(path);
  EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0);
}

TEST(ConfigJsonFile, ReadsARealFile) {
  std::string path = WriteTemp(R"({"zero_optimization": {"stage": 2},
      "optimizer": {"type": "adam", "params": {"lr": 0.002}}})");
  ASSERT_FALSE(path.empty());
  zs_config c = Defaults();
  ASSERT_EQ(zs_config_from_json_file(path.c_str(), &c), ZS_OK)
      << zs_last_error();
  zs_config want = Defaults();
  want.stage = 2;
  want.optimizer.kind = ZS_OPTIM_ADAM;
  want.optimizer.lr = 0.002;
  ExpectConfigEq(c, want);
  unlink(path.c_str());
}

TEST(ConfigJsonFile, ErrorsInsideAFileNameTheFileAndTheKey) {
  std::string path = WriteTemp(R"({"zero_optimization": {"stag": 2}})");
  ASSERT_FALSE(path.empty());
  zs_config c;
  DefinedCopy(Distinctive(), &c);
  zs_config before;
  std::memcpy(&before, &c, sizeof c);
  EXPECT_EQ(zs_config_from_json_file(path.c_str(), &c),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS(path);
  EXPECT_LAST_ERROR_HAS("zero_optimization.stag");
  EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0);
  unlink(path.c_str());

  std::string empty = WriteTemp("");
  ASSERT_FALSE(empty.empty());
  EXPECT_EQ(zs_config_from_json_file(empty.c_str(), &c),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS(empty);
  EXPECT_LAST_ERROR_HAS("parse error at byte 0");
  EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0);
  unlink(empty.c_str());
}

// ==== Memory accounting ==================================================

// Owns an accounting table for one test.
class Accounting : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(zs__accounting_create(&acct_), ZS_OK) << zs_last_error();
  }
  void TearDown() override { zs__accounting_destroy(acct_); }
  zs_memory_stats Stats() {
    zs_memory_stats s{};
    std::memset(&s, 0xEE, sizeof s);
    zs__accounting_stats(acct_, &s);
    return s;
  }
  zs__accounting* acct_ = nullptr;
  // Distinct keys; never dereferenced by the tables.
  char keys_[64] = {};
};

TEST_F(Accounting, StartsEmpty) {
  zs_memory_stats s = Stats();
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++) {
    EXPECT_EQ(s.current[c], 0u) << zs_mem_category_name((zs_mem_category)c);
    EXPECT_EQ(s.peak[c], 0u) << zs_mem_category_name((zs_mem_category)c);
  }
  EXPECT_EQ(s.total_current, 0u);
  EXPECT_EQ(s.total_peak, 0u);
  EXPECT_EQ(s.model_state_bytes, 0u);
  EXPECT_EQ(s.allocations, 0u);
}

TEST_F(Accounting, AddAndRemove) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 100, "w"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, &keys_[1], 30, "g"),
            ZS_OK);
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_PARAMS], 100u);
  EXPECT_EQ(s.current[ZS_MEM_GRADS], 30u);
  EXPECT_EQ(s.total_current, 130u);
  EXPECT_EQ(s.allocations, 2u);

  zs_mem_category cat = ZS_MEM_OTHER;
  size_t bytes = 0;
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], &cat, &bytes), ZS_OK);
  EXPECT_EQ(cat, ZS_MEM_PARAMS);
  EXPECT_EQ(bytes, 100u);
  s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_PARAMS], 0u);
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 100u);
  EXPECT_EQ(s.current[ZS_MEM_GRADS], 30u);
  EXPECT_EQ(s.total_current, 30u);
  EXPECT_EQ(s.total_peak, 130u);
  EXPECT_EQ(s.allocations, 1u);
  // The out parameters may be NULL.
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[1], nullptr, nullptr), ZS_OK);
  EXPECT_EQ(Stats().total_current, 0u);
  EXPECT_EQ(Stats().allocations, 0u);
}

TEST_F(Accounting, ZeroByteEntriesAreCounted) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_OTHER, &keys_[0], 0, "empty"),
            ZS_OK);
  EXPECT_EQ(Stats().allocations, 1u);
  EXPECT_EQ(Stats().total_current, 0u);
  size_t bytes = 99;
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, &bytes), ZS_OK);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(Stats().allocations, 0u);
}

TEST_F(Accounting, DuplicateKeyIsAnError) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 100, "w"),
            ZS_OK);
  EXPECT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, &keys_[0], 7, "again"),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("already registered");
  EXPECT_LAST_ERROR_HAS("again");
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_PARAMS], 100u);
  EXPECT_EQ(s.current[ZS_MEM_GRADS], 0u) << "the failed add was counted";
  EXPECT_EQ(s.total_current, 100u);
  EXPECT_EQ(s.allocations, 1u);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr), ZS_OK);
}

TEST_F(Accounting, RemovingAnUnknownKeyIsAnError) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 100, "w"),
            ZS_OK);
  zs_mem_category cat = ZS_MEM_ACTIVATIONS;
  size_t bytes = 55;
  EXPECT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[1], &cat, &bytes),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("not registered");
  EXPECT_EQ(cat, ZS_MEM_ACTIVATIONS) << "outputs written on error";
  EXPECT_EQ(bytes, 55u) << "outputs written on error";
  EXPECT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, nullptr, nullptr, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Stats().total_current, 100u);
  EXPECT_EQ(Stats().allocations, 1u);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr), ZS_OK);
  // Removing twice fails the second time.
  EXPECT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
}

TEST_F(Accounting, RejectsNullKeyAndBadCategory) {
  EXPECT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, nullptr, 1, "n"),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_CATEGORY_COUNT, &keys_[0], 1, "c"),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("category " + std::to_string(ZS_MEM_CATEGORY_COUNT));
  EXPECT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, static_cast<zs_mem_category>(-1),
                               &keys_[0], 1, "c"),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Stats().allocations, 0u);
  EXPECT_EQ(Stats().total_current, 0u);
}

TEST_F(Accounting, CurrentAndPeakPerCategory) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 10, "a"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[1], 20, "b"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr), ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[2], 5, "c"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_COMM_BUFFERS, &keys_[3], 7, "d"),
            ZS_OK);
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_PARAMS], 25u);
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 30u);
  EXPECT_EQ(s.current[ZS_MEM_COMM_BUFFERS], 7u);
  EXPECT_EQ(s.peak[ZS_MEM_COMM_BUFFERS], 7u);
  EXPECT_EQ(s.current[ZS_MEM_GRADS], 0u);
  EXPECT_EQ(s.peak[ZS_MEM_GRADS], 0u);
  EXPECT_EQ(s.total_current, 32u);
  EXPECT_EQ(s.total_peak, 32u);
  for (int i = 1; i <= 3; i++)
    ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[i], nullptr, nullptr), ZS_OK);
}

TEST_F(Accounting, TotalPeakIsThePeakOfTheSum) {
  // params peaks at 100 while grads is 0; grads peaks at 80 after params
  // is freed: sum of peaks 180, peak of the sum 100.
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 100, "p"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr), ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, &keys_[1], 80, "g"),
            ZS_OK);
  zs_memory_stats s = Stats();
  size_t sum_of_peaks = 0;
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++) sum_of_peaks += s.peak[c];
  EXPECT_EQ(sum_of_peaks, 180u);
  EXPECT_EQ(s.total_peak, 100u);
  EXPECT_NE(s.total_peak, sum_of_peaks);
  EXPECT_EQ(s.total_current, 80u);
  // Overlap grows the total past the earlier peak.
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[2], 30, "p2"),
            ZS_OK);
  s = Stats();
  EXPECT_EQ(s.total_peak, 110u);
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 100u);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[1], nullptr, nullptr), ZS_OK);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[2], nullptr, nullptr), ZS_OK);
}

TEST_F(Accounting, ResetPeak) {
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[0], 100, "p"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, &keys_[1], 80, "g"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[0], nullptr, nullptr), ZS_OK);
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 100u);
  EXPECT_EQ(s.total_peak, 180u);
  zs__accounting_reset_peak(acct_);
  s = Stats();
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 0u);
  EXPECT_EQ(s.peak[ZS_MEM_GRADS], 80u);
  EXPECT_EQ(s.total_peak, 80u);
  EXPECT_EQ(s.total_current, 80u);
  // Peaks grow again from the reset point.
  ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, &keys_[2], 5, "p"),
            ZS_OK);
  s = Stats();
  EXPECT_EQ(s.peak[ZS_MEM_PARAMS], 5u);
  EXPECT_EQ(s.total_peak, 85u);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[1], nullptr, nullptr), ZS_OK);
  ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[2], nullptr, nullptr), ZS_OK);
}

TEST_F(Accounting, ModelStateBytes) {
  // One entry per category with bytes 2^category: model state is the sum of
  // params (1), grads (4), master weights (8) and optimizer states (16).
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
    ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, static_cast<zs_mem_category>(c),
                                 &keys_[c], size_t{1} << c, "x"),
              ZS_OK);
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.model_state_bytes, 1u + 4u + 8u + 16u);
  EXPECT_EQ(s.total_current, (size_t{1} << ZS_MEM_CATEGORY_COUNT) - 1);
  EXPECT_EQ(s.allocations, static_cast<size_t>(ZS_MEM_CATEGORY_COUNT));
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
    ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &keys_[c], nullptr, nullptr),
              ZS_OK);
  EXPECT_EQ(Stats().model_state_bytes, 0u);
}

TEST_F(Accounting, ManyEntriesInRandomOrder) {
  constexpr size_t kN = 10000;
  std::vector<char> storage(kN);
  std::vector<size_t> order(kN);
  size_t want_current[ZS_MEM_CATEGORY_COUNT] = {};
  size_t want_total = 0;
  for (size_t i = 0; i < kN; i++) order[i] = i;
  std::mt19937 rng(12345);
  std::shuffle(order.begin(), order.end(), rng);
  auto category_of = [](size_t i) {
    return static_cast<zs_mem_category>(i % ZS_MEM_CATEGORY_COUNT);
  };
  for (size_t i : order) {
    ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, category_of(i), &storage[i], i + 1,
                                 "many"),
              ZS_OK)
        << "entry " << i << ": " << zs_last_error();
    want_current[category_of(i)] += i + 1;
    want_total += i + 1;
  }
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.allocations, kN);
  EXPECT_EQ(s.total_current, want_total);
  EXPECT_EQ(s.total_peak, want_total);
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
    EXPECT_EQ(s.current[c], want_current[c]) << "category " << c;
  // Every key is still found after the table grew.
  for (size_t i = 0; i < kN; i++)
    ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_OTHER, &storage[i], 1, "dup"),
              ZS_ERR_INVALID_ARGUMENT)
        << "entry " << i << " lost";

  std::shuffle(order.begin(), order.end(), rng);
  for (size_t k = 0; k < kN; k++) {
    size_t i = order[k];
    zs_mem_category cat = ZS_MEM_CATEGORY_COUNT;
    size_t bytes = 0;
    ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &storage[i], &cat, &bytes), ZS_OK)
        << "entry " << i << " (removal " << k << "): " << zs_last_error();
    ASSERT_EQ(cat, category_of(i)) << "entry " << i;
    ASSERT_EQ(bytes, i + 1) << "entry " << i;
    want_current[cat] -= bytes;
    want_total -= bytes;
    if (k == kN / 2) {
      s = Stats();
      EXPECT_EQ(s.allocations, kN - k - 1);
      EXPECT_EQ(s.total_current, want_total);
      for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
        EXPECT_EQ(s.current[c], want_current[c]) << "category " << c;
      // The entries not yet removed are all still there.
      for (size_t j = k + 1; j < kN; j++)
        ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_OTHER, &storage[order[j]],
                                     1, "dup"),
                  ZS_ERR_INVALID_ARGUMENT)
            << "entry " << order[j] << " lost after deletions";
    }
  }
  s = Stats();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.total_current, 0u);
  EXPECT_EQ(s.model_state_bytes, 0u);
  for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++)
    EXPECT_EQ(s.current[c], 0u) << "category " << c;
  EXPECT_EQ(s.total_peak, static_cast<size_t>(kN) * (kN + 1) / 2);
}

TEST_F(Accounting, InterleavedAddsAndRemovesMatchAModel) {
  // Random adds and removes over a small key space exercise probe chains
  // and backward-shift deletion; a std::map is the reference.
  constexpr size_t kKeys = 3000;
  std::vector<char> storage(kKeys);
  std::map<size_t, size_t> live;  // key index -> bytes
  std::mt19937 rng(777);
  size_t want_total = 0;
  for (int op = 0; op < 60000; op++) {
    size_t i = rng() % kKeys;
    auto it = live.find(i);
    if (it == live.end()) {
      size_t bytes = rng() % 1000;
      ASSERT_EQ(zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_ACTIVATIONS, &storage[i],
                                   bytes, "x"),
                ZS_OK)
          << "op " << op;
      live[i] = bytes;
      want_total += bytes;
    } else {
      size_t bytes = 0;
      ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &storage[i], nullptr, &bytes),
                ZS_OK)
          << "op " << op << " key " << i;
      ASSERT_EQ(bytes, it->second) << "op " << op << " key " << i;
      want_total -= bytes;
      live.erase(it);
    }
  }
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.allocations, live.size());
  EXPECT_EQ(s.total_current, want_total);
  EXPECT_EQ(s.current[ZS_MEM_ACTIVATIONS], want_total);
  for (const auto& kv : live)
    ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &storage[kv.first], nullptr,
                                    nullptr),
              ZS_OK);
  EXPECT_EQ(Stats().allocations, 0u);
}

TEST_F(Accounting, ConcurrentThreads) {
  constexpr int kThreads = 4;
  constexpr size_t kPer = 2000;
  std::vector<char> storage(kThreads * kPer);
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < kPer; i++)
        if (zs__accounting_add(acct_, ZS__OWNER_RUNTIME, ZS_MEM_COMM_BUFFERS,
                               &storage[t * kPer + i], 3, "t") != ZS_OK)
          failures[t]++;
      for (size_t i = 0; i < kPer; i += 2)
        if (zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &storage[t * kPer + i], nullptr,
                                  nullptr) != ZS_OK)
          failures[t]++;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; t++) EXPECT_EQ(failures[t], 0) << "thread " << t;
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.allocations, kThreads * kPer / 2);
  EXPECT_EQ(s.current[ZS_MEM_COMM_BUFFERS], 3 * kThreads * kPer / 2);
  for (size_t k = 1; k < storage.size(); k += 2)
    ASSERT_EQ(zs__accounting_remove(acct_, ZS__OWNER_RUNTIME, &storage[k], nullptr, nullptr),
              ZS_OK);
}

TEST(AccountingDestroy, WithLiveEntriesLogsLeaksAndDoesNotCrash) {
  zs__accounting* acct = nullptr;
  ASSERT_EQ(zs__accounting_create(&acct), ZS_OK);
  static char a, b;
  ASSERT_EQ(zs__accounting_add(acct, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, &a, 4096, "leaky_grads"),
            ZS_OK);
  ASSERT_EQ(zs__accounting_add(acct, ZS__OWNER_RUNTIME, ZS_MEM_OTHER, &b, 8, nullptr), ZS_OK);
  int old_level = zs__log_level();
  zs__log_set_level(ZS_LOG_WARN);
  ::testing::internal::CaptureStderr();
  zs__accounting_destroy(acct);
  std::string err = ::testing::internal::GetCapturedStderr();
  zs__log_set_level(old_level);
  if (std::getenv("ZS_LOG_LEVEL") == nullptr) {
    EXPECT_PRED2(Contains, err, std::string("leak"));
    EXPECT_PRED2(Contains, err, std::string("4096 bytes of grads"));
    EXPECT_PRED2(Contains, err, std::string("leaky_grads"));
    EXPECT_PRED2(Contains, err, std::string("unlabelled"));
  }
  zs__accounting_destroy(nullptr);  // accepted
}

// ==== Host device ========================================================

class HostDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(zs__accounting_create(&acct_), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs__device_create(ZS_DEVICE_HOST, acct_, 0, 1, &dev_), ZS_OK)
        << zs_last_error();
  }
  void TearDown() override {
    if (dev_ != nullptr) {
      zs_memory_stats s{};
      zs__accounting_stats(acct_, &s);
      EXPECT_EQ(s.allocations, 0u) << "the test leaked device allocations";
    }
    zs__device_destroy(dev_);
    zs__accounting_destroy(acct_);
  }
  zs_memory_stats Stats() {
    zs_memory_stats s{};
    zs__accounting_stats(acct_, &s);
    return s;
  }
  zs__accounting* acct_ = nullptr;
  zs__device* dev_ = nullptr;
};

TEST_F(HostDevice, Identity) {
  EXPECT_EQ(dev_->kind, ZS_DEVICE_HOST);
  ASSERT_NE(dev_->ops, nullptr);
  EXPECT_STREQ(dev_->ops->name, "host");
  EXPECT_EQ(dev_->acct, acct_);
}

TEST_F(HostDevice, AllocZeroFillsWhenAsked) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096}, size_t{100000}}) {
    // Dirty memory first so a reused block would show stale bytes.
    void* dirty = nullptr;
    ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_OTHER, bytes, 0, "dirty", &dirty),
              ZS_OK);
    std::memset(dirty, 0xAB, bytes);
    zs__dev_free(dev_, dirty);
    void* p = nullptr;
    ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_GRADS, bytes, 1, "zeroed", &p),
              ZS_OK)
        << zs_last_error();
    const unsigned char* u = static_cast<const unsigned char*>(p);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i++) nonzero += u[i] != 0;
    EXPECT_EQ(nonzero, 0u) << bytes << " bytes";
    zs__dev_free(dev_, p);
  }
}

TEST_F(HostDevice, AllocCountsUnderTheCategoryAndFreeUncounts) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_OPTIMIZER_STATES, 1000, 0, "m", &a),
            ZS_OK);
  ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_PARAMS, 24, 1, "w", &b), ZS_OK);
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_OPTIMIZER_STATES], 1000u);
  EXPECT_EQ(s.current[ZS_MEM_PARAMS], 24u);
  EXPECT_EQ(s.total_current, 1024u);
  EXPECT_EQ(s.model_state_bytes, 1024u);
  EXPECT_EQ(s.allocations, 2u);
  zs__dev_free(dev_, a);
  s = Stats();
  EXPECT_EQ(s.current[ZS_MEM_OPTIMIZER_STATES], 0u);
  EXPECT_EQ(s.peak[ZS_MEM_OPTIMIZER_STATES], 1000u);
  EXPECT_EQ(s.total_current, 24u);
  EXPECT_EQ(s.allocations, 1u);
  zs__dev_free(dev_, b);
  EXPECT_EQ(Stats().total_current, 0u);
  zs__dev_free(dev_, nullptr);  // ignored
  EXPECT_EQ(Stats().allocations, 0u);
}

TEST_F(HostDevice, AllocationsAre64ByteAligned) {
  std::vector<void*> ptrs;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{3}, size_t{63},
                       size_t{64}, size_t{65}, size_t{1000}, size_t{4097}}) {
    for (int rep = 0; rep < 4; rep++) {
      void* p = nullptr;
      ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_OTHER, bytes, rep % 2, "a", &p),
                ZS_OK);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u)
          << bytes << " bytes at " << p;
      // The whole requested range is writable.
      if (bytes > 0) std::memset(p, 0x11, bytes);
      ptrs.push_back(p);
    }
  }
  for (void* p : ptrs) zs__dev_free(dev_, p);
}

TEST_F(HostDevice, ZeroByteAllocationsAreDistinctAndNonNull) {
  void* p[3] = {nullptr, nullptr, nullptr};
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_ACTIVATIONS, 0, 1, "empty", &p[i]),
              ZS_OK)
        << zs_last_error();
  for (int i = 0; i < 3; i++) {
    EXPECT_NE(p[i], nullptr) << i;
    for (int j = 0; j < i; j++) EXPECT_NE(p[i], p[j]) << i << " vs " << j;
  }
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.current[ZS_MEM_ACTIVATIONS], 0u);
  for (void* q : p) zs__dev_free(dev_, q);
  EXPECT_EQ(Stats().allocations, 0u);
}

TEST_F(HostDevice, ImpossibleSizesAreOutOfMemoryNotACrash) {
  // What is held is reported with the failure, by category.
  void* held = nullptr;
  ASSERT_EQ(zs__dev_alloc(dev_, ZS_MEM_GRADS, 4096, 0, "held", &held), ZS_OK);
  void* q = nullptr;
  EXPECT_EQ(zs__dev_alloc(dev_, ZS_MEM_PARAMS, SIZE_MAX / 2, 0, "unit 'x'", &q),
            ZS_ERR_OUT_OF_MEMORY);
  EXPECT_LAST_ERROR_HAS("held now: grads 4096, total 4096 bytes");
  EXPECT_LAST_ERROR_HAS("unit 'x'");
  zs__dev_free(dev_, held);
  // SIZE_MAX must not wrap to a small block when rounded to 64 bytes.
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 63,
                       SIZE_MAX / 2 + 1}) {
    void* p = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(zs__dev_alloc(dev_, ZS_MEM_PARAMS, bytes, 1, "giant", &p),
              ZS_ERR_OUT_OF_MEMORY)
        << bytes << " bytes";
    EXPECT_EQ(p, reinterpret_cast<void*>(0x1)) << "out written on error";
    EXPECT_LAST_ERROR_HAS("giant");
    EXPECT_LAST_ERROR_HAS(std::to_string(bytes));
  }
  zs_memory_stats s = Stats();
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.total_current, 0u);
}

TEST_F(HostDevice, CopyMemsetStreamsAndEvents) {
  const zs__device_ops* ops = dev_->ops;
  unsigned char buf[32];
  for (int i = 0; i < 32; i++) buf[i] = static_cast<unsigned char>(i);
  // Overlapping copy behaves like memmove.
  ASSERT_EQ(ops->copy(dev_, buf + 4, buf, 16, nullptr), ZS_OK);
  for (int i = 0; i < 16; i++) EXPECT_EQ(buf[4 + i], i) << "byte " << 4 + i;
  ASSERT_EQ(ops->memset(dev_, buf, 0x7F, 8, nullptr), ZS_OK);
  for (int i = 0; i < 8; i++) EXPECT_EQ(buf[i], 0x7F) << "byte " << i;
  EXPECT_EQ(buf[8], 4);
  zs__stream* stream = nullptr;
  zs__event* event = nullptr;
  ASSERT_EQ(ops->stream_create(dev_, &stream), ZS_OK);
  ASSERT_EQ(ops->event_create(dev_, &event), ZS_OK);
  EXPECT_NE(stream, nullptr);
  EXPECT_NE(event, nullptr);
  EXPECT_EQ(ops->event_record(dev_, event, stream), ZS_OK);
  EXPECT_EQ(ops->stream_wait_event(dev_, nullptr, event), ZS_OK);
  EXPECT_EQ(ops->stream_sync(dev_, stream), ZS_OK);
  EXPECT_EQ(ops->stream_sync(dev_, nullptr), ZS_OK);
  ops->event_destroy(dev_, event);
  ops->stream_destroy(dev_, stream);
}

TEST_F(HostDevice, DivAdd) {
  constexpr size_t kN = 37;
  std::vector<float> base(kN), src(kN), dst(kN, -1.0f);
  for (size_t i = 0; i < kN; i++) {
    base[i] = 0.5f * static_cast<float>(i) - 3.0f;
    src[i] = 1.0f / static_cast<float>(i + 1) + static_cast<float>(i % 5);
  }
  const float d = 3.0f;
  ASSERT_EQ(dev_->ops->div_add(dev_, dst.data(), base.data(), src.data(), d,
                               kN, ZS_FLOAT32, nullptr),
            ZS_OK)
      << zs_last_error();
  for (size_t i = 0; i < kN; i++) {
    float q = src[i] / d;  // one rounding
    float want = base[i] + q;  // a second rounding
    EXPECT_EQ(dst[i], want) << "element " << i;
  }
  // NULL base: dst = src / divisor.
  ASSERT_EQ(dev_->ops->div_add(dev_, dst.data(), nullptr, src.data(), 4.0f, kN,
                               ZS_FLOAT32, nullptr),
            ZS_OK);
  for (size_t i = 0; i < kN; i++)
    EXPECT_EQ(dst[i], src[i] / 4.0f) << "element " << i;
  // dst may alias base (accumulate) or src (in-place mean).
  std::vector<float> acc = base;
  ASSERT_EQ(dev_->ops->div_add(dev_, acc.data(), acc.data(), src.data(), 2.0f,
                               kN, ZS_FLOAT32, nullptr),
            ZS_OK);
  for (size_t i = 0; i < kN; i++) {
    float q = src[i] / 2.0f;
    EXPECT_EQ(acc[i], base[i] + q) << "element " << i;
  }
  std::vector<float> inplace = src;
  ASSERT_EQ(dev_->ops->div_add(dev_, inplace.data(), nullptr, inplace.data(),
                               8.0f, kN, ZS_FLOAT32, nullptr),
            ZS_OK);
  for (size_t i = 0; i < kN; i++)
    EXPECT_EQ(inplace[i], src[i] / 8.0f) << "element " << i;
  // n = 0 touches nothing.
  std::vector<float> untouched = dst;
  EXPECT_EQ(dev_->ops->div_add(dev_, dst.data(), base.data(), src.data(), 2.0f,
                               0, ZS_FLOAT32, nullptr),
            ZS_OK);
  EXPECT_EQ(dst, untouched);
  // 16-bit: widened, combined in fp32, rounded once (bf16 1.5 / 2 + 1 =
  // 1.75 exactly; 3 / 3 = 1).
  const uint16_t b16[2] = {0x3fc0 /* 1.5 */, 0x4040 /* 3 */};
  const uint16_t one16[2] = {0x3f80, 0x3f80};
  uint16_t out16[2] = {0, 0};
  ASSERT_EQ(dev_->ops->div_add(dev_, out16, one16, b16, 2.0f, 2, ZS_BFLOAT16,
                               nullptr),
            ZS_OK);
  EXPECT_EQ(out16[0], 0x3fe0);  // 1.75
  EXPECT_EQ(out16[1], 0x4020);  // 2.5
  // Integer types are not summed.
  EXPECT_EQ(dev_->ops->div_add(dev_, dst.data(), nullptr, src.data(), 2.0f,
                               kN, ZS_UINT8, nullptr),
            ZS_ERR_UNSUPPORTED);
  EXPECT_LAST_ERROR_HAS("u8");
  EXPECT_EQ(dst, untouched);
}

// core_test links no CUDA plugin loader (//runtime/comm:comm_cuda): asking
// for CUDA says so.
TEST(DeviceCreate, CudaIsUnsupportedWithoutTheCudaBackend) {
  zs__accounting* acct = nullptr;
  ASSERT_EQ(zs__accounting_create(&acct), ZS_OK);
  zs__device* dev = nullptr;
  EXPECT_EQ(zs__device_create(ZS_DEVICE_CUDA, acct, 0, 1, &dev),
            ZS_ERR_UNSUPPORTED);
  EXPECT_EQ(dev, nullptr);
  EXPECT_NE(std::string(zs_last_error()), "");
  EXPECT_LAST_ERROR_HAS("device kind 1");
  EXPECT_LAST_ERROR_HAS("no CUDA plugin loader");
  EXPECT_EQ(zs__device_create(static_cast<zs_device_kind>(5), acct, 0, 1,
                              &dev),
            ZS_ERR_UNSUPPORTED);
  EXPECT_LAST_ERROR_HAS("device kind 5");
  EXPECT_EQ(dev, nullptr);
  zs__device_destroy(nullptr);  // accepted
  zs__accounting_destroy(acct);
}

// User registrations and runtime allocations are separate registries: a
// user cannot unregister runtime memory, and a stale user registration at an
// address does not block a runtime allocation there.
TEST(AccountingOwners, UserAndRuntimeRegistriesAreSeparate) {
  zs__accounting* a = nullptr;
  ASSERT_EQ(zs__accounting_create(&a), ZS_OK);
  static char buf[16];
  ASSERT_EQ(zs__accounting_add(a, ZS__OWNER_RUNTIME, ZS_MEM_PARAMS, buf, 8, "p"), ZS_OK);
  EXPECT_EQ(zs__accounting_remove(a, ZS__OWNER_USER, buf, nullptr, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("zs_memory_register"), std::string::npos)
      << zs_last_error();
  ASSERT_EQ(zs__accounting_add(a, ZS__OWNER_USER, ZS_MEM_ACTIVATIONS, buf + 8, 4, "u"), ZS_OK);
  // The runtime can use an address the user registered (and forgot).
  EXPECT_EQ(zs__accounting_add(a, ZS__OWNER_RUNTIME, ZS_MEM_GRADS, buf + 8, 2, "g"), ZS_OK);
  zs_memory_stats st{};
  zs__accounting_stats(a, &st);
  EXPECT_EQ(st.total_current, 14u);
  EXPECT_EQ(st.allocations, 3u);
  EXPECT_EQ(zs__accounting_remove(a, ZS__OWNER_RUNTIME, buf + 8, nullptr, nullptr), ZS_OK);
  EXPECT_EQ(zs__accounting_remove(a, ZS__OWNER_USER, buf + 8, nullptr, nullptr), ZS_OK);
  EXPECT_EQ(zs__accounting_remove(a, ZS__OWNER_RUNTIME, buf, nullptr, nullptr), ZS_OK);
  zs__accounting_stats(a, &st);
  EXPECT_EQ(st.total_current, 0u);
  zs__accounting_destroy(a);
}

TEST(Config, WeightDecayDefaultsPerOptimizer) {
  zs_config c = Defaults();
  zs__config_resolve(&c);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);  // AdamW
  for (zs_optimizer_kind k : {ZS_OPTIM_ADAM, ZS_OPTIM_SGD}) {
    zs_config d = Defaults();
    d.optimizer.kind = k;
    zs__config_resolve(&d);
    EXPECT_EQ(d.optimizer.weight_decay, 0.0) << "kind " << k;
  }
  zs_config e = Defaults();
  e.optimizer.weight_decay = 0.3;
  zs__config_resolve(&e);
  EXPECT_EQ(e.optimizer.weight_decay, 0.3);
}

TEST(ConfigJson, OverlapKeys) {
  zs_config c = Defaults();
  ASSERT_EQ(zs_config_from_json(R"({
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000,
                          "prefetch_depth": 4,
                          "stage3_max_live_parameters": 5000000,
                          "reshard_after_forward": false,
                          "deterministic_reduction": false},
    "progress_thread": 0, "collective_timeout": 60})", &c), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(c.bucket_elements, 1000u);
  EXPECT_EQ(c.prefetch_depth, 4);
  EXPECT_EQ(c.max_live_elements, 5000000u);
  EXPECT_EQ(c.reshard_after_forward, 0);
  EXPECT_EQ(c.reduce_order, ZS_REDUCE_BACKEND);
  EXPECT_EQ(c.progress_thread, 0);
  EXPECT_EQ(c.collective_timeout_s, 60.0);
  zs_config d = Defaults();
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"prefetch_depth": 99}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("zero_optimization.prefetch_depth"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"reduce_bucket_size": -5}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("reduce_bucket_size"), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(zs_config_from_json(R"({"zero_optimization": {"reduce_bucket_size": 0}})", &d),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("bucket_elements"), std::string::npos)
      << zs_last_error();
}

}  // namespace
