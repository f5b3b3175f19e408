// offload_test.cc — CPU offload (docs/offload.md) at 1, 2, 3 and 4 ranks:
// training with master weights and optimizer states in NUMA-placed host
// memory, stepped by the offload worker threads, is bitwise the training
// without offload at every stage (the kernels are elementwise, so who runs
// which share cannot change a bit); the accounting proves the path ran.
#include <gtest/gtest.h>
#include <zs_mpi.h>

#include <string>

#include "runtime/engine.h" /* zs__offload_force_staging */
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class OffloadTest : public ZsMpiTest {};

TEST_F(OffloadTest, OffloadIsBitwiseAndTheAccountingProvesIt) {
  for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16})
    for (int stage = 0; stage <= 3; stage++)
      for (int param : {0, 1}) {
        if (param && stage != 3) continue;
        const std::string where = std::string(zs_dtype_name(dtype)) + " stage " +
                                  std::to_string(stage) +
                                  (param ? " +params" : "");
        TrainConfig cfg;
        cfg.steps = 6;
        cfg.stage = stage;
        cfg.param_dtype = dtype;
        cfg.reduce_dtype = dtype == ZS_FLOAT32 ? -1 : ZS_FLOAT32;
        auto m1 = MakeTransformer();
        TrainResult plain = TrainSharded(*m1, cfg);
        ASSERT_EQ(plain.status, ZS_OK) << where << ": " << plain.error;
        cfg.offload = 1;
        cfg.offload_param = param;
        auto m2 = MakeTransformer();
        TrainResult off = TrainSharded(*m2, cfg);
        ASSERT_EQ(off.status, ZS_OK) << where << ": " << off.error;
        for (size_t t = 0; t < plain.params.size(); t++) {
          EXPECT_TRUE(Bitwise(off.params[t], plain.params[t])) << where << " tensor " << t;
          EXPECT_TRUE(Bitwise(off.state0[t], plain.state0[t])) << where << " tensor " << t;
        }
        // offload_host holds exactly what master_weights and
        // optimizer_states held without offload (and the parameter shards
        // with parameter offload); those categories are empty now.
        const zs_memory_stats& a = plain.memory;
        const zs_memory_stats& b = off.memory;
        EXPECT_EQ(b.current[ZS_MEM_OFFLOAD_HOST],
                  a.current[ZS_MEM_MASTER_WEIGHTS] + a.current[ZS_MEM_OPTIMIZER_STATES] +
                      (param ? a.current[ZS_MEM_PARAMS] : 0))
            << where;
        EXPECT_EQ(b.current[ZS_MEM_MASTER_WEIGHTS], 0u) << where;
        EXPECT_EQ(b.current[ZS_MEM_OPTIMIZER_STATES], 0u) << where;
        EXPECT_EQ(b.model_state_bytes + b.current[ZS_MEM_OFFLOAD_HOST],
                  a.model_state_bytes) << where;
        // The step ran on the workers: one run per trainable unit per step.
        EXPECT_EQ(off.offload.enabled, 1);
        EXPECT_GE(off.offload.workers, 1);
        EXPECT_EQ(off.offload.steps_on_workers,
                  (uint64_t)cfg.steps * m1->units.size()) << where;
        EXPECT_EQ(plain.offload.enabled, 0);
      }
}

// Bad input reaches every rank: a NUMA node that does not exist.
// The staged path CPU offload takes when parameters and gradients are in GPU
// memory (engine_step.c: gradients to page-locked staging, the step on the
// workers, parameters back, two slots overlapped across units), forced here
// on the host device, where its copies are memcpy: bitwise the training
// without offload, including the frozen tensor, the tied head and the
// padding the staging carries back untouched (odd ranks and the degenerate
// model's odd sizes), and the staging is counted as offload host memory.
TEST_F(OffloadTest, StagedPathForGpusIsBitwise) {
  zs__offload_force_staging = 1;
  for (int model = 0; model < 2; model++)
    for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16})
      for (int stage = 0; stage <= 3; stage++) {
        const std::string where = std::string(model ? "degenerate " : "transformer ") +
                                  zs_dtype_name(dtype) + " stage " +
                                  std::to_string(stage);
        TrainConfig cfg;
        cfg.steps = 4;
        cfg.stage = stage;
        cfg.param_dtype = dtype;
        cfg.reduce_dtype = dtype == ZS_FLOAT32 ? -1 : ZS_FLOAT32;
        auto m1 = model ? MakeDegenerate() : MakeTransformer();
        TrainResult plain = TrainSharded(*m1, cfg);
        ASSERT_EQ(plain.status, ZS_OK) << where << ": " << plain.error;
        cfg.offload = 1;
        auto m2 = model ? MakeDegenerate() : MakeTransformer();
        TrainResult off = TrainSharded(*m2, cfg);
        ASSERT_EQ(off.status, ZS_OK) << where << ": " << off.error;
        ExpectSameTraining(plain, off, *m1, where);
        EXPECT_GT(off.memory.current[ZS_MEM_OFFLOAD_HOST],
                  plain.memory.current[ZS_MEM_MASTER_WEIGHTS] +
                      plain.memory.current[ZS_MEM_OPTIMIZER_STATES])
            << where << ": the staging is offload host memory";
        EXPECT_EQ(off.offload.steps_on_workers,
                  (uint64_t)cfg.steps * m1->units.size()) << where;
      }
  zs__offload_force_staging = 0;
}

TEST_F(OffloadTest, MissingNumaNodeFailsEveryRank) {
  zs_config c = ZS_CONFIG_INIT;
  c.offload_optimizer.device = 1;
  c.offload_optimizer.numa = 4000;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("NUMA node 4000 does not exist"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(ctx, nullptr);
  // offload_param without the optimizer's offload, or below stage 3
  c = ZS_CONFIG_INIT;
  c.offload_param = 1;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_param"), std::string::npos);
}

}  // namespace
