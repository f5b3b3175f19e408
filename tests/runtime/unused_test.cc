// unused_test.cc — units a rank does not use in a micro-batch
// (zs_unit_allow_unused, zs_unit_mark_unused): a mixture of experts
// (test_models.h, MakeMoe) whose ranks route their samples to different
// experts. At stages 0-3, with and without prefetch, training equals the
// rank-order reference bitwise (a rank's share of an expert it did not use
// is zeros, as the reference's zero gradient); with accumulation (reduced
// each micro-batch or locally) it is within the accumulation tolerance of
// the larger batch (precision_test's 1e-5: K means of smaller batches round
// differently) and bitwise alike at every stage. At stage 3 the
// communication log shows no all-gather of an expert on a rank that did
// not use it: every rank sent its shard to the users (one gather), or, when
// every rank used it, one all-gather; when no rank used it, nothing; and a
// user's backward gathers nothing (the forward's parameters are kept).
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <set>
#include <string>
#include <vector>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class UnusedTest : public ZsMpiTest {};

std::vector<int> Experts() {
  return {kExpertUnits[0], kExpertUnits[1], kExpertUnits[2]};
}

// Whether the samples [b0, b0 + nb) of step s use expert e.
bool Uses(int s, int b0, int nb, int e, int global_batch) {
  for (int j = b0; j < b0 + nb; j++)
    if (MoeRoute(s, j, global_batch) == e) return true;
  return false;
}

TEST_F(UnusedTest, ExpertsSkippedBySomeRanksTrainBitwiseTheReference) {
  for (int stage = 0; stage <= 3; stage++) {
    for (int depth : {0, 2}) {
      if (stage < 3 && depth > 0) continue;  // prefetch is stage 3's
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 10;  // every routing of the table, twice
      cfg.prefetch_depth = depth;
      cfg.reference_world = world_;
      cfg.allow_unused = Experts();
      const std::string w = "stage " + std::to_string(stage) + " prefetch " +
                            std::to_string(depth);
      TrainResult ref = TrainReference(*MakeMoe(), cfg);
      ASSERT_EQ(ref.status, ZS_OK) << ref.error;
      auto model = MakeMoe();
      TrainResult got = TrainSharded(*model, cfg);
      ASSERT_EQ(got.status, ZS_OK) << w << ": " << got.error;
      for (size_t t = 0; t < model->tensors.size(); t++) {
        EXPECT_TRUE(Bitwise(got.params[t], ref.params[t]))
            << w << " tensor " << model->tensors[t].name;
        EXPECT_TRUE(Bitwise(got.state0[t], ref.state0[t]))
            << w << " tensor " << model->tensors[t].name << " exp_avg";
      }
      if (stage != 3) continue;
      // The log, step by step: who used each expert decides its collectives.
      const int nb = kGlobalBatch / world_;
      for (int s = 0; s < cfg.steps; s++) {
        for (int e = 0; e < 3; e++) {
          const int u = kExpertUnits[e];
          int users = 0;
          for (int r = 0; r < world_; r++)
            users += Uses(s, r * nb, nb, e, kGlobalBatch);
          const bool mine = Uses(s, rank_ * nb, nb, e, kGlobalBatch);
          int all_gathers = 0, gathers = 0, agreements = 0;
          for (const zs_comm_record& rec : got.step_log[s]) {
            if (rec.unit != u) continue;
            const std::string p = rec.purpose;
            all_gathers += rec.op == ZS_COLL_ALL_GATHER && p == "param gather";
            gathers += rec.op == ZS_COLL_GATHER;
            agreements += rec.op == ZS_COLL_ALL_REDUCE && p == "agreement";
          }
          const std::string at = w + " step " + std::to_string(s) +
                                 " expert " + std::to_string(e) + " (" +
                                 std::to_string(users) + " users, " +
                                 (mine ? "used here)" : "unused here)");
          EXPECT_EQ(agreements, 1) << at;
          if (!mine) {
            EXPECT_EQ(all_gathers, 0) << at;
          }
          if (users == 0) {
            EXPECT_EQ(all_gathers + gathers, 0) << at;
          } else if (users == world_) {
            EXPECT_EQ(all_gathers, 1) << at;  // forward only
            EXPECT_EQ(gathers, 0) << at;
          } else {
            EXPECT_EQ(all_gathers, 0) << at;
            EXPECT_EQ(gathers, 1) << at;
          }
        }
      }
    }
  }
}

// Eval passes: each gather of a unit by the ranks that use it is matched
// by a mark on the others, pass after pass, and nothing carries over into
// training (a helper's trial found the marks and uses stuck after one
// pass).
TEST_F(UnusedTest, EvalPassesLeaveNoMarks) {
  for (int stage : {0, 3}) {
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    zs_context* ctx = nullptr;
    ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
    zs_model* m = nullptr;
    int e = -1, t = -1;
    const int64_t shape[1] = {64};
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "e", &e), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, e, "e.w", 1, shape, ZS_FLOAT32, 0, &t), ZS_OK);
    ASSERT_EQ(zs_unit_allow_unused(m, e), ZS_OK);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_model_set_eval(m, 1), ZS_OK);
    for (int pass = 0; pass < 3; pass++) {
      if ((rank_ + pass) % 2 == 0) {
        ASSERT_EQ(zs_unit_gather(m, e), ZS_OK) << zs_last_error();
        ASSERT_EQ(zs_unit_release(m, e), ZS_OK);
      } else {
        ASSERT_EQ(zs_unit_mark_unused(m, e), ZS_OK) << zs_last_error();
      }
    }
    ASSERT_EQ(zs_model_set_eval(m, 0), ZS_OK) << zs_last_error();
    // training: rank 0 uses it, the others mark it
    if (rank_ == 0) {
      ASSERT_EQ(zs_unit_gather(m, e), ZS_OK) << zs_last_error();
      ASSERT_EQ(zs_unit_release(m, e), ZS_OK);
      ASSERT_EQ(zs_unit_grad_acquire(m, e), ZS_OK);
      ASSERT_EQ(zs_unit_grad_release(m, e), ZS_OK);
    } else {
      ASSERT_EQ(zs_unit_mark_unused(m, e), ZS_OK) << zs_last_error();
    }
    zs_step_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(zs_step(m, &info), ZS_OK) << "stage " << stage << ": "
                                         << zs_last_error();
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// At stage 3 with the parameter shards offloaded (host memory, NVMe with
// two pool buffers: fewer than the experts a rank may skip in one
// micro-batch), a rank that skips an expert sends its shard from there:
// training is bitwise the run without offload, and no swap file is left.
TEST_F(UnusedTest, OffloadedShardsAreSentFromTheirTier) {
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 6;
  cfg.allow_unused = Experts();
  auto names = MakeMoe();
  TrainResult plain = TrainSharded(*MakeMoe(), cfg);
  ASSERT_EQ(plain.status, ZS_OK) << plain.error;
  const std::string dir = TestDir("unused_nvme");
  cfg.offload = 1;
  cfg.nvme.path = dir.c_str();
  cfg.nvme.param_buffer_count = 2;
  for (int param : {1, 2}) {
    cfg.offload_param = param;
    TrainResult off = TrainSharded(*MakeMoe(), cfg);
    const std::string w = param == 1 ? "shards in host memory" : "shards on NVMe";
    ASSERT_EQ(off.status, ZS_OK) << w << ": " << off.error;
    ExpectSameTraining(plain, off, *names, w);
  }
  ExpectEmptyDir(dir, "unused_nvme");
}

// The routing table leaves each case to some step at 2-4 ranks: an expert
// used by some ranks only, by every rank, and by none (what the test above
// checks is not vacuous).
TEST_F(UnusedTest, TheRoutingCoversEveryCase) {
  if (world_ < 2) GTEST_SKIP() << "one rank uses whatever it routes to";
  const int nb = kGlobalBatch / world_;
  std::set<std::string> cases;
  for (int s = 0; s < 10; s++)
    for (int e = 0; e < 3; e++) {
      int users = 0;
      for (int r = 0; r < world_; r++) users += Uses(s, r * nb, nb, e, kGlobalBatch);
      cases.insert(users == 0 ? "none" : users == world_ ? "all" : "some");
    }
  EXPECT_TRUE(cases.count("none")) << world_ << " ranks";
  EXPECT_TRUE(cases.count("some")) << world_ << " ranks";
  if (world_ <= 3) {
    EXPECT_TRUE(cases.count("all")) << world_ << " ranks";
  }
}

// K = 2 micro-batches, reduced each or accumulated locally: the routing
// differs per micro-batch, so an expert is used in one and not the other.
TEST_F(UnusedTest, AccumulationEqualsTheLargerBatch) {
  const int G = 48;  // 48 / (W * 2) samples per micro-batch, W <= 4
  if (G % (world_ * 2) != 0) GTEST_SKIP() << "48 not divisible by 2W";
  TrainConfig cfg;
  cfg.steps = 10;
  cfg.global_batch = G;
  cfg.allow_unused = Experts();
  TrainResult ref = TrainReference(*MakeMoe(G), cfg);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  cfg.grad_accum = 2;
  auto names = MakeMoe(G);
  for (int local = 0; local <= 1; local++) {
    cfg.grad_accum_local = local;
    std::vector<TrainResult> runs;
    for (int stage = 0; stage <= 3; stage++) {
      cfg.stage = stage;
      runs.push_back(TrainSharded(*MakeMoe(G), cfg));
      ASSERT_EQ(runs.back().status, ZS_OK) << runs.back().error;
      for (size_t t = 0; t < names->tensors.size(); t++)
        EXPECT_TRUE(CloseByNorm(runs.back().params[t], ref.params[t], 1e-5))
            << "local " << local << " stage " << stage << " tensor "
            << names->tensors[t].name;
    }
    for (int stage = 1; stage <= 3; stage++)
      for (size_t t = 0; t < names->tensors.size(); t++)
        EXPECT_TRUE(Bitwise(runs[stage].params[t], runs[0].params[t]))
            << "local " << local << " stage " << stage << " vs 0, tensor "
            << names->tensors[t].name;
  }
}

// A bad mark names the unit and changes nothing: undeclared, marked twice,
// marked after its use, used after its mark; the declaration after
// finalize, and a declared unit with a tie, are refused too.
TEST_F(UnusedTest, MisuseIsRefused) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* m = nullptr;
  int a = -1, b = -1, t = -1;
  const int64_t shape[1] = {16};
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "a", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "b", &b), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, a, "a.w", 1, shape, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, b, "b.w", 1, shape, ZS_FLOAT32, 0, &t), ZS_OK);
  EXPECT_EQ(zs_unit_allow_unused(m, 7), ZS_ERR_INVALID_ARGUMENT);
  zs_model_destroy(m);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "a", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "b", &b), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, a, "a.w", 1, shape, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, b, "b.w", 1, shape, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_unit_allow_unused(m, b), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_allow_unused(m, a), ZS_ERR_INVALID_STATE);
  EXPECT_EQ(zs_unit_mark_unused(m, a), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("'a'"), std::string::npos)
      << zs_last_error();
  ASSERT_EQ(zs_unit_mark_unused(m, b), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_mark_unused(m, b), ZS_ERR_INVALID_STATE);
  EXPECT_EQ(zs_unit_gather(m, b), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("marked unused"), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(zs_unit_grad_acquire(m, b), ZS_ERR_INVALID_STATE);
  zs_step_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
  // the next micro-batch: used first, then marked
  ASSERT_EQ(zs_unit_gather(m, b), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_unit_release(m, b), ZS_OK);
  EXPECT_EQ(zs_unit_mark_unused(m, b), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("'b' was gathered"),
            std::string::npos)
      << zs_last_error();
  ASSERT_EQ(zs_unit_grad_acquire(m, b), ZS_OK);
  ASSERT_EQ(zs_unit_grad_release(m, b), ZS_OK);
  ASSERT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
  zs_model_destroy(m);
  // a tie to or from a unit that may be unused
  for (int way = 0; way < 2; way++) {
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "a", &a), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "b", &b), ZS_OK);
    int w = -1;
    ASSERT_EQ(zs_model_add_tensor(m, a, "a.w", 1, shape, ZS_FLOAT32, 0, &w), ZS_OK);
    ASSERT_EQ(zs_model_add_tied_tensor(m, b, "b.w", w, &t), ZS_OK);
    ASSERT_EQ(zs_unit_allow_unused(m, way == 0 ? a : b), ZS_OK);
    EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(zs_last_error()).find("tied"), std::string::npos)
        << zs_last_error();
    zs_model_destroy(m);
  }
  zs_context_destroy(ctx);
}

}  // namespace
