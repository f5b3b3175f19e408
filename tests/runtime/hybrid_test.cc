// hybrid_test.cc — hybrid sharding (zs_config.shard_group_size G): units
// sharded within groups of G ranks and replicated across the W / G groups
// (docs/running.md, "Shard groups"). Run under mpirun at 2, 3, 4, 6 and 8
// ranks; each G that divides W and is below it is tried.
//
// Exactness: the engine sums each group's gradients in rank order and
// divides by G (the shard group's reduce-scatter), then sums the group
// means in group order and divides by W / G (the replica all-reduce), all
// in fp32. TrainReference with reference_group G does exactly that, so
// training is BITWISE equal to it (parameters, first moments), and stages
// 0-3 bitwise equal to each other (second moments too). Against the flat reference (one mean over W ranks) the result
// differs by rounding only: the per-tensor bound of parity_test (1e-5 of
// the norm) holds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <zs_mpi.h>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;
namespace fs = std::filesystem;

namespace {

class HybridTest : public ZsMpiTest {
 protected:
  // The group sizes to try at this world size: divisors of W below W
  // whose groups divide the global batch evenly (as the world must).
  std::vector<int> Groups() const {
    std::vector<int> g;
    for (int G = 1; G < world_; G++)
      if (world_ % G == 0) g.push_back(G);
    return g;
  }
};

constexpr double kRel = 1e-5;

// Every stage at every G: bitwise the grouped reference (parameters and
// both Adam moments), bitwise across stages, within kRel of the flat one.
TEST_F(HybridTest, MatchesTheGroupedReferenceBitwise) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  const char* const names[2] = {"transformer", "degenerate"};
  int which = 0;
  for (auto make : {MakeTransformer, MakeDegenerate}) {
    const std::string name = names[which++];
    for (int G : Groups()) {
      TrainConfig cfg;
      cfg.steps = 6;
      cfg.reference_world = world_;
      cfg.reference_group = G;
      cfg.shard_group_size = G;
      auto rm = make();
      const TrainResult ref = TrainReference(*rm, cfg);
      ASSERT_EQ(ref.status, ZS_OK) << ref.error;
      TrainConfig flat_cfg = cfg;
      flat_cfg.reference_group = 0;
      const TrainResult flat = TrainReference(*make(), flat_cfg);
      std::vector<TrainResult> runs;
      for (int stage = 0; stage <= 3; stage++) {
        cfg.stage = stage;
        auto m = make();
        runs.push_back(TrainSharded(*m, cfg));
        ASSERT_EQ(runs.back().status, ZS_OK)
            << "G " << G << " stage " << stage << ": " << runs.back().error;
        const TrainResult& r = runs.back();
        for (size_t t = 0; t < rm->tensors.size(); t++) {
          const std::string what = name + " G " + std::to_string(G) +
                                   " stage " + std::to_string(stage) +
                                   " tensor '" + rm->tensors[t].name + "'";
          EXPECT_TRUE(Bitwise(r.params[t], ref.params[t])) << what;
          EXPECT_TRUE(Bitwise(r.state0[t], ref.state0[t])) << what << " m";
          EXPECT_TRUE(Bitwise(r.state1[t], runs[0].state1[t]))
              << what << " v vs stage 0";
          EXPECT_TRUE(Bitwise(r.params[t], runs[0].params[t]))
              << what << " vs stage 0";
          EXPECT_TRUE(CloseByNorm(r.params[t], flat.params[t], kRel))
              << what << " vs flat";
        }
        for (int s = 0; s < cfg.steps; s++)
          EXPECT_EQ(r.losses[s], ref.losses[s]) << "step " << s;
      }
    }
  }
}

// Clipping: the norm is the whole model's (each shard counted once, not
// once per replica), the reference's to rounding of a sum in another
// order; clipping applies it bitwise as the reference does.
TEST_F(HybridTest, ClipNormCountsEachShardOnce) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  for (int G : Groups()) {
    TrainConfig cfg;
    cfg.steps = 4;
    cfg.stage = 3;
    cfg.max_grad_norm = 0.05;  // below the norm: clipping applies
    cfg.reference_world = world_;
    cfg.reference_group = G;
    cfg.shard_group_size = G;
    auto rm = MakeTransformer();
    const TrainResult ref = TrainReference(*rm, cfg);
    auto m = MakeTransformer();
    const TrainResult r = TrainSharded(*m, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    ASSERT_EQ(r.infos.size(), ref.norms.size());
    for (size_t s = 0; s < ref.norms.size(); s++) {
      // a sum of squares in double, in another order: 1e-12 relative
      EXPECT_NEAR(r.infos[s].grad_norm, ref.norms[s], 1e-12 * ref.norms[s])
          << "G " << G << " step " << s;
      EXPECT_GT(ref.norms[s], cfg.max_grad_norm);
    }
    for (size_t t = 0; t < rm->tensors.size(); t++)
      EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], kRel))
          << "G " << G << " tensor " << rm->tensors[t].name;
  }
}

// The log: each optimizer step all-reduces every trainable unit's gradient
// shard across the replicas (a reduce-scatter and an all-gather, logged as
// "replica reduce", each of the shard's bytes), and the shard group's
// collectives are those of flat sharding at G ranks.
TEST_F(HybridTest, CommLogSeparatesGroupAndReplicaBytes) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  for (int G : Groups()) {
    for (int stage = 0; stage <= 3; stage++) {
      TrainConfig cfg;
      cfg.steps = 2;
      cfg.stage = stage;
      cfg.shard_group_size = G;
      auto m = MakeTransformer();
      const TrainResult r = TrainSharded(*m, cfg);
      ASSERT_EQ(r.status, ZS_OK) << r.error;
      // every trainable unit's gradient shard (padded for W ranks, split
      // over G): the persistent gradients at stages 2-3, 1 / G of them
      // (the whole padded buffers) at 0-1
      const uint64_t grads = r.memory.current[ZS_MEM_GRADS];
      const uint64_t shard_bytes = stage >= 2 ? grads : grads / (uint64_t)G;
      ASSERT_GT(shard_bytes, 0u);
      const auto& log = r.step_log.back();
      uint64_t replica = 0, replica_rs = 0, replica_ag = 0;
      for (const zs_comm_record& rec : log) {
        if (std::string(rec.purpose) != "replica reduce") continue;
        replica += rec.bytes;
        if (rec.op == ZS_COLL_REDUCE_SCATTER) replica_rs += rec.bytes;
        if (rec.op == ZS_COLL_ALL_GATHER) replica_ag += rec.bytes;
      }
      EXPECT_EQ(replica_rs, shard_bytes) << "G " << G << " stage " << stage;
      EXPECT_EQ(replica_ag, shard_bytes) << "G " << G << " stage " << stage;
      EXPECT_EQ(replica, 2 * shard_bytes);
    }
  }
}

// Memory per rank: the model states of a G-rank shard group (the layout
// padded for all W ranks), as the estimator says for shard_group_size G.
TEST_F(HybridTest, MemoryEqualsTheEstimate) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  for (int G : Groups()) {
    for (int stage = 0; stage <= 3; stage++) {
      TrainConfig cfg;
      cfg.steps = 2;
      cfg.stage = stage;
      cfg.shard_group_size = G;
      auto m = MakeTransformer();
      const TrainResult r = TrainSharded(*m, cfg);
      ASSERT_EQ(r.status, ZS_OK) << r.error;
      zs_config c = ZS_CONFIG_INIT;
      c.stage = stage;
      c.optimizer = OptimizerFor(cfg);
      c.shard_group_size = G;
      zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
      in.ranks = world_;
      zs_memory_estimate e{};
      e.struct_size = sizeof e;
      ASSERT_EQ(zs_estimate_from_model(DescribeModel(*m).c_str(), &c, &in, &e),
                ZS_OK)
          << zs_last_error();
      const std::string what = "G " + std::to_string(G) + " stage " +
                               std::to_string(stage);
      for (int k : {ZS_MEM_PARAMS, ZS_MEM_GRADS, ZS_MEM_OPTIMIZER_STATES,
                    ZS_MEM_MASTER_WEIGHTS, ZS_MEM_COMM_SEGMENT})
        EXPECT_EQ(r.memory.current[k], e.bytes[k])
            << what << " " << zs_mem_category_name((zs_mem_category)k);
      EXPECT_LE(r.memory.peak[ZS_MEM_COMM_BUFFERS], e.bytes[ZS_MEM_COMM_BUFFERS])
          << what;
      EXPECT_LE(r.memory.peak[ZS_MEM_PARAMS_GATHERED],
                e.bytes[ZS_MEM_PARAMS_GATHERED])
          << what;
    }
  }
}

// Micro-batches (K = 2, reduced each micro-batch or, with local
// accumulation, once): bitwise the same at every stage, and within kRel of
// flat sharding with the same micro-batches (the groups' means of means
// round differently from one mean).
TEST_F(HybridTest, AccumulationAtEveryStage) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  for (int local = 0; local <= 1; local++) {
    TrainConfig flat_cfg;
    flat_cfg.steps = 3;
    flat_cfg.grad_accum = 2;
    flat_cfg.grad_accum_local = local;
    auto fm = MakeTransformer();
    const TrainResult flat = TrainSharded(*fm, flat_cfg);
    ASSERT_EQ(flat.status, ZS_OK) << flat.error;
    for (int G : Groups()) {
      std::vector<TrainResult> runs;
      for (int stage = 0; stage <= 3; stage++) {
        TrainConfig cfg = flat_cfg;
        cfg.stage = stage;
        cfg.shard_group_size = G;
        auto m = MakeTransformer();
        runs.push_back(TrainSharded(*m, cfg));
        const TrainResult& r = runs.back();
        const std::string what = "K 2 local " + std::to_string(local) +
                                 " G " + std::to_string(G) + " stage " +
                                 std::to_string(stage);
        ASSERT_EQ(r.status, ZS_OK) << what << ": " << r.error;
        for (size_t t = 0; t < m->tensors.size(); t++) {
          EXPECT_TRUE(Bitwise(r.params[t], runs[0].params[t]))
              << what << " tensor " << m->tensors[t].name << " vs stage 0";
          EXPECT_TRUE(CloseByNorm(r.params[t], flat.params[t], kRel))
              << what << " tensor " << m->tensors[t].name << " vs flat";
        }
      }
    }
  }
}

// Units some ranks do not use (a mixture of experts, zs_unit_mark_unused):
// each shard group gathers an expert to its own users only, so groups
// issue different gathers (left out of the context-wide check); training
// is bitwise the grouped reference at every stage, with and without
// prefetch, and no rank gathers an expert it does not use.
TEST_F(HybridTest, UnusedExpertsPerGroup) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  const std::vector<int> experts = {kExpertUnits[0], kExpertUnits[1],
                                    kExpertUnits[2]};
  for (int G : Groups()) {
    for (int stage = 0; stage <= 3; stage++) {
      for (int depth : {0, 2}) {
        if (stage < 3 && depth > 0) continue;
        TrainConfig cfg;
        cfg.stage = stage;
        cfg.steps = 10;
        cfg.prefetch_depth = depth;
        cfg.reference_world = world_;
        cfg.reference_group = G;
        cfg.shard_group_size = G;
        cfg.allow_unused = experts;
        const std::string w = "G " + std::to_string(G) + " stage " +
                              std::to_string(stage) + " prefetch " +
                              std::to_string(depth);
        const TrainResult ref = TrainReference(*MakeMoe(), cfg);
        ASSERT_EQ(ref.status, ZS_OK) << ref.error;
        auto model = MakeMoe();
        const TrainResult got = TrainSharded(*model, cfg);
        ASSERT_EQ(got.status, ZS_OK) << w << ": " << got.error;
        for (size_t t = 0; t < model->tensors.size(); t++)
          EXPECT_TRUE(Bitwise(got.params[t], ref.params[t]))
              << w << " tensor " << model->tensors[t].name;
        if (stage != 3) continue;
        const int nb = kGlobalBatch / world_;
        for (int s = 0; s < cfg.steps; s++)
          for (int e = 0; e < 3; e++) {
            bool mine = false;
            for (int j = rank_ * nb; j < rank_ * nb + nb; j++)
              mine |= MoeRoute(s, j, kGlobalBatch) == e;
            int gathers = 0;
            for (const zs_comm_record& rec : got.step_log[s])
              gathers += rec.unit == experts[(size_t)e] &&
                         std::string(rec.purpose) == "param gather" &&
                         rec.op == ZS_COLL_ALL_GATHER;
            if (!mine)
              EXPECT_EQ(gathers, 0) << w << " step " << s << " expert " << e;
          }
      }
    }
  }
}

// CPU and NVMe offload (optimizer states, and at stage 3 the parameter
// shards too) with shard groups: the same training as in memory, bitwise
// (the offloaded optimizer steps the same shard with the same kernels).
TEST_F(HybridTest, OffloadTrainsAsInMemory) {
  if (world_ == 1) GTEST_SKIP() << "one rank has no groups";
  const int G = Groups().back();  // the largest G below W
  for (int stage : {1, 3}) {
    TrainConfig cfg;
    cfg.steps = 3;
    cfg.stage = stage;
    cfg.shard_group_size = G;
    auto m0 = MakeTransformer();
    const TrainResult plain = TrainSharded(*m0, cfg);
    ASSERT_EQ(plain.status, ZS_OK) << plain.error;
    const std::string dir = TestDir("hybrid_nvme_" + std::to_string(rank_));
    for (int off : {1, 2}) {
      for (int params : {0, 1}) {
        if (params && stage != 3) continue;
        TrainConfig c = cfg;
        c.offload = off;
        c.offload_param = params ? off : 0;
        c.nvme.path = dir.c_str();
        auto m = MakeTransformer();
        const TrainResult r = TrainSharded(*m, c);
        const std::string what = "G " + std::to_string(G) + " stage " +
                                 std::to_string(stage) + " offload " +
                                 (off == 2 ? "nvme" : "cpu") +
                                 (params ? " +params" : "");
        ASSERT_EQ(r.status, ZS_OK) << what << ": " << r.error;
        ExpectSameTraining(plain, r, *m0, what);
      }
    }
  }
}

// A G that does not divide W, and "node" where hosts differ, are refused
// on every rank with the reason; nothing is left.
TEST_F(HybridTest, GroupSizeThatDoesNotDivideIsRefused) {
  if (world_ == 1) GTEST_SKIP() << "one rank: every G but 1 is refused below";
  zs_config c = ZS_CONFIG_INIT;
  c.shard_group_size = world_ + 1;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(zs_last_error()).find("does not divide"),
            std::string::npos)
      << zs_last_error();
  c.shard_group_size = -5;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("config.shard_group_size"),
            std::string::npos)
      << zs_last_error();
  // node: every rank of this test is on one host: one group of all
  c.shard_group_size = ZS_SHARD_GROUP_NODE;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(zs_context_config(ctx)->shard_group_size, world_);
  zs_context_destroy(ctx);
}

// Checkpoints: saved by the first shard group at (W, G) and loaded at any
// (W', G'): from (4, 2) at (2, 2), (3, 1) and (8, 4) (those the job's
// ranks allow), the run goes on as it does without the reload (within the
// cross-size tolerance: another grouping reduces in another order).
TEST_F(HybridTest, CheckpointsLoadAtAnyWorldAndGroup) {
  if (world_ < 4) GTEST_SKIP() << "saves at 4 ranks";
  const std::string root = TestDir("hybrid_ckpt");
  if (rank_ == 0) fs::remove_all(root + "/s");
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm c4 = FirstRanks(4);
  TrainResult cont;
  if (c4 != MPI_COMM_NULL) {
    TrainConfig cfg;
    cfg.comm = c4;
    cfg.stage = 3;
    cfg.shard_group_size = 2;
    auto m = MakeTransformer();
    TrainSlice(*m, cfg, 0, 3, "", root + "/s", "save at (4, 2)");
    // the checkpoint holds G = 2 rank files (one replica's)
    if (rank_ == 0) {
      int files = 0;
      for (const auto& e : fs::recursive_directory_iterator(root + "/s"))
        files += e.path().extension() == ".bin" &&
                 e.path().filename().string().rfind("rank-", 0) == 0;
      EXPECT_EQ(files, 2) << "rank files of one replica";
    }
    auto m2 = MakeTransformer();
    cont = TrainSlice(*m2, cfg, 3, 2, root + "/s", "", "continue at (4, 2)");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  struct Load { int W, G; };
  for (Load l : {Load{2, 2}, Load{3, 1}, Load{8, 4}, Load{4, 2}}) {
    if (l.W > world_) continue;
    MPI_Comm c = FirstRanks(l.W);
    if (c != MPI_COMM_NULL) {
      TrainConfig cfg;
      cfg.comm = c;
      cfg.stage = l.G == 1 ? 1 : 3;
      cfg.shard_group_size = l.G;
      auto m = MakeTransformer();
      const std::string what = "load at (" + std::to_string(l.W) + ", " +
                               std::to_string(l.G) + ")";
      TrainResult got = TrainSlice(*m, cfg, 3, 2, root + "/s", "", what);
      if (rank_ == 0)
        for (size_t t = 0; t < m->tensors.size(); t++) {
          if (l.W == 4 && l.G == 2)
            EXPECT_TRUE(Bitwise(got.params[t], cont.params[t]))
                << what << " tensor " << m->tensors[t].name;
          EXPECT_TRUE(CloseByNorm(got.params[t], cont.params[t], kRel))
              << what << " tensor " << m->tensors[t].name;
          EXPECT_TRUE(CloseByNorm(got.state1[t], cont.state1[t], kRel))
              << what << " tensor " << m->tensors[t].name;
        }
      MPI_Comm_free(&c);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (c4 != MPI_COMM_NULL) MPI_Comm_free(&c4);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) fs::remove_all(root + "/s");
}

}  // namespace
