// replicated_test.cc — replicated units inside a sharded model
// (zs_unit_set_strategy, zs_model_set_persistence_threshold): FSDP's
// NO_SHARD for one unit, DeepSpeed's stage3_param_persistence_threshold
// for small ones. At stages 1-3 and 1-4 ranks, a model with replicated and
// sharded units trains bitwise like the rank-order reference, its clip
// norm equals the reference's (a replicated unit's gradient counted once),
// a replicated unit is never all-gathered before use at stage 3, and the
// threshold replicates exactly the units at or below it.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class ReplicatedTest : public ZsMpiTest {};

TEST_F(ReplicatedTest, MixedUnitsAreBitwiseTheRankOrderReference) {
  for (int stage = 1; stage <= 3; stage++) {
    for (int clip = 0; clip <= 1; clip++) {
      auto model = MakeTransformer();
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 5;
      cfg.replicated = {0, (int)model->units.size() - 1};
      cfg.max_grad_norm = clip ? 0.05 : 0;
      cfg.reference_world = world_;
      const std::string w = "stage " + std::to_string(stage) +
                            (clip ? " clipped" : "");
      TrainResult ref = TrainReference(*MakeTransformer(), cfg);
      ASSERT_EQ(ref.status, ZS_OK) << ref.error;
      TrainResult got = TrainSharded(*model, cfg);
      ASSERT_EQ(got.status, ZS_OK) << w << ": " << got.error;
      for (size_t t = 0; t < model->tensors.size(); t++) {
        EXPECT_TRUE(Bitwise(got.params[t], ref.params[t]))
            << w << " tensor " << model->tensors[t].name;
        if (!model->tensors[t].frozen)
          EXPECT_TRUE(Bitwise(got.state0[t], ref.state0[t]))
              << w << " tensor " << model->tensors[t].name << " exp_avg";
      }
      // the norm over shards counts a replicated unit's gradient once
      ASSERT_EQ(got.norms.size(), ref.norms.size()) << w;
      for (size_t s = 0; s < ref.norms.size(); s++)
        EXPECT_NEAR(got.norms[s], ref.norms[s], 1e-6 * ref.norms[s])
            << w << " step " << s;
    }
  }
}

// At stage 3 a replicated unit is resident: the all-gathers per step are
// those of the sharded units only, and its parameters count under
// `params` whole (the others' shards).
TEST_F(ReplicatedTest, ReplicatedUnitsAreNotGathered) {
  auto model = MakeMlp();
  const int n = (int)model->units.size();
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 3;
  cfg.prefetch_depth = 0;
  TrainResult all = TrainSharded(*MakeMlp(), cfg);
  ASSERT_EQ(all.status, ZS_OK) << all.error;
  cfg.replicated = {0};
  TrainResult one = TrainSharded(*model, cfg);
  ASSERT_EQ(one.status, ZS_OK) << one.error;
  for (int s = 1; s < cfg.steps; s++) {
    const uint64_t a = all.step_counters[s].calls[ZS_COLL_ALL_GATHER];
    const uint64_t b = one.step_counters[s].calls[ZS_COLL_ALL_GATHER];
    // each sharded unit is gathered for its forward and its backward; the
    // replicated one not at all (stage 0's gradient all-gather remains)
    EXPECT_LT(b, a) << "step " << s;
    EXPECT_EQ(a / (uint64_t)n * (uint64_t)(n - 1) + 1, b) << "step " << s;
  }
}

// Memory: the model states and the gathered working set of a mixed model at
// stage 3 equal the estimator's (the description marks the replicated
// units "replicated": true).
TEST_F(ReplicatedTest, MemoryEqualsTheEstimate) {
  auto model = MakeTransformer();
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 2;
  cfg.replicated = {0};
  TrainResult r = TrainSharded(*model, cfg);
  ASSERT_EQ(r.status, ZS_OK) << r.error;
  std::string d = DescribeModel(*model);
  const std::string first = "{\"name\": \"" + model->units[0].name + "\"";
  const size_t at = d.find(first);
  ASSERT_NE(at, std::string::npos) << d;
  d.insert(at + 1, "\"replicated\": true, ");
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.optimizer = OptimizerFor(cfg);
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = world_;
  zs_memory_estimate e{};
  e.struct_size = sizeof e;
  ASSERT_EQ(zs_estimate_from_model(d.c_str(), &c, &in, &e), ZS_OK)
      << zs_last_error() << "\n" << d;
  for (int k : {ZS_MEM_PARAMS, ZS_MEM_GRADS, ZS_MEM_OPTIMIZER_STATES,
                ZS_MEM_MASTER_WEIGHTS})
    EXPECT_EQ(r.memory.current[k], e.bytes[k])
        << zs_mem_category_name((zs_mem_category)k);
  EXPECT_EQ(r.memory.model_state_bytes, e.model_state_bytes);
  EXPECT_LE(r.memory.peak[ZS_MEM_PARAMS_GATHERED], e.bytes[ZS_MEM_PARAMS_GATHERED]);
  // without the mark the estimate is a sharded unit's: not the run's
  zs_memory_estimate e2{};
  e2.struct_size = sizeof e2;
  ASSERT_EQ(zs_estimate_from_model(DescribeModel(*model).c_str(), &c, &in, &e2),
            ZS_OK);
  if (world_ > 1) EXPECT_NE(e2.model_state_bytes, e.model_state_bytes);
}

// A checkpoint saved with replicated units loads into the same model all
// sharded (and back): the files are per-rank shards either way, and the
// run continues bitwise the reference.
TEST_F(ReplicatedTest, CheckpointsLoadAcrossStrategies) {
  for (int way = 0; way < 2; way++) {
    TrainConfig cfg;
    cfg.stage = 3;
    cfg.steps = 4;
    cfg.reference_world = world_;
    TrainConfig save = cfg, load = cfg;
    (way == 0 ? save : load).replicated = {0, 2};
    const std::string root = TestDir("replicated_ckpt" + std::to_string(way));
    auto m1 = MakeTransformer();
    TrainSlice(*m1, save, 0, 2, "", root, "save");
    auto m2 = MakeTransformer();
    TrainResult rest = TrainSlice(*m2, load, 2, 2, root, "", "load");
    TrainResult ref = TrainReference(*MakeTransformer(), cfg);
    for (size_t t = 0; t < m2->tensors.size(); t++)
      EXPECT_TRUE(Bitwise(rest.params[t], ref.params[t]))
          << (way ? "sharded -> replicated" : "replicated -> sharded")
          << " tensor " << m2->tensors[t].name;
  }
}

// The threshold replicates the units of at most that many elements.
TEST_F(ReplicatedTest, ThresholdReplicatesSmallUnits) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* m = nullptr;
  int small = -1, big = -1, forced = -1, t = -1;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "ln", &small), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "fc", &big), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "ln2", &forced), ZS_OK);
  const int64_t s64[1] = {64}, s4k[2] = {64, 64};
  ASSERT_EQ(zs_model_add_tensor(m, small, "ln.w", 1, s64, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, big, "fc.w", 2, s4k, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, forced, "ln2.w", 1, s64, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_set_persistence_threshold(m, 64), ZS_OK);
  ASSERT_EQ(zs_unit_set_strategy(m, forced, ZS_UNIT_SHARDED), ZS_OK);
  EXPECT_EQ(zs_unit_set_strategy(m, big, (zs_unit_strategy)7),
            ZS_ERR_INVALID_ARGUMENT);
  zs_model_destroy(m);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "ln", &small), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "fc", &big), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "ln2", &forced), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, small, "ln.w", 1, s64, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, big, "fc.w", 2, s4k, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, forced, "ln2.w", 1, s64, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_set_persistence_threshold(m, 64), ZS_OK);
  ASSERT_EQ(zs_unit_set_strategy(m, forced, ZS_UNIT_SHARDED), ZS_OK);
  EXPECT_EQ(zs_unit_replicated(m, small), -1);  // before finalize
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_replicated(m, small), 1);
  EXPECT_EQ(zs_unit_replicated(m, big), 0);
  EXPECT_EQ(zs_unit_replicated(m, forced), 0);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  // the context's default (zs_config.param_persistence_threshold), and the
  // model's call overriding it
  c.param_persistence_threshold = 64;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  for (size_t over : {(size_t)0, (size_t)64}) {
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "ln", &small), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, small, "ln.w", 1, s64, ZS_FLOAT32, 0, &t), ZS_OK);
    if (over == 0) ASSERT_EQ(zs_model_set_persistence_threshold(m, 0), ZS_OK);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
    EXPECT_EQ(zs_unit_replicated(m, small), over == 0 ? 0 : 1);
    zs_model_destroy(m);
  }
  zs_context_destroy(ctx);
}

}  // namespace
