// comm_model_test.cc — the communication model (zs_estimate_comm_from_model,
// docs/scaling.md) against the communication log, run under mpirun at 1, 2,
// 3, 4, 6 and 8 ranks: for every stage, flat (G = W) and every hybrid shard
// group G that divides W, one optimizer step's logged bytes per purpose
// equal the model's exactly, the shard group's and the replica group's
// collectives are logged in their groups, and flat the model is ZeRO's
// closed form: 2 Psi per rank and step at stages 0-2, 3 Psi at stage 3
// (Psi: the padded buffers' bytes).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class CommModelTest : public ZsMpiTest {
 protected:
  std::vector<int> Groups() const {  // flat first
    std::vector<int> g = {world_};
    for (int G = 1; G < world_; G++)
      if (world_ % G == 0) g.push_back(G);
    return g;
  }
};

// The model's figures for `m` at (stage, G, K).
zs_comm_estimate Model(const zstest::Model& m, int world, int stage, int G,
                       int accum, int accum_local) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = stage;
  c.shard_group_size = G;
  c.grad_accum_steps = accum;
  c.grad_accum_local = accum_local;
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = world;
  zs_comm_estimate e{};
  e.struct_size = sizeof e;
  const std::string d = DescribeModel(m);
  EXPECT_EQ(zs_estimate_comm_from_model(d.c_str(), &c, &in, &e), ZS_OK)
      << zs_last_error();
  return e;
}

struct Logged {
  std::map<std::string, uint64_t> by_purpose;
  std::map<std::string, std::string> group_of;  // purpose -> group seen
  bool mixed = false;                           // a purpose in two groups
};

Logged Sum(const std::vector<zs_comm_record>& log) {
  Logged l;
  for (const zs_comm_record& r : log) {
    l.by_purpose[r.purpose] += r.bytes;
    auto it = l.group_of.find(r.purpose);
    if (it == l.group_of.end()) l.group_of[r.purpose] = r.group;
    else if (it->second != r.group) l.mixed = true;
  }
  return l;
}

// gathers_per_use: 2 when the model's pass uses each unit in a forward and
// a backward (the model's assumption), 1 when only in a backward (the
// degenerate model: the log then has half the model's stage-3 gathers).
void Check(const Logged& l, const zs_comm_estimate& e, int world, int G,
           const std::string& what, int gathers_per_use = 2) {
  auto got = [&](const char* p) {
    auto it = l.by_purpose.find(p);
    return it == l.by_purpose.end() ? (uint64_t)0 : it->second;
  };
  EXPECT_EQ(got("param gather") * (uint64_t)(2 / gathers_per_use),
            e.param_gather_bytes)
      << what;
  EXPECT_EQ(got("grad reduce"), e.grad_reduce_bytes) << what;
  EXPECT_EQ(got("grad gather (stage 0)"), e.grad_gather_bytes) << what;
  EXPECT_EQ(got("param update gather"), e.param_update_gather_bytes) << what;
  EXPECT_EQ(got("replica reduce"), e.replica_reduce_bytes) << what;
  EXPECT_EQ(e.shard_ranks, G) << what;
  EXPECT_EQ(e.replicas, world / G) << what;
  // the groups: flat, everything among all ranks; hybrid, the units'
  // collectives in the shard group and the replicas' in theirs
  for (const auto& pg : l.group_of) {
    const std::string& p = pg.first;
    std::string want = "world";
    if (G < world && (p == "param gather" || p == "grad reduce" ||
                      p == "grad gather (stage 0)" || p == "param update gather"))
      want = "shard";
    if (p == "replica reduce") want = "replica";
    EXPECT_EQ(pg.second, want) << what << ": purpose " << p;
  }
  EXPECT_FALSE(l.mixed) << what;
}

// Every stage, flat and every G: the last step's log equals the model
// (the degenerate model's pass has no forward: each unit is gathered once
// per micro-batch, half the model's stage-3 figure, which assumes a
// forward and a backward).
TEST_F(CommModelTest, LogEqualsTheModel) {
  const char* const names[3] = {"mlp", "transformer", "degenerate"};
  int which = 0;
  for (auto make : {MakeMlp, MakeTransformer, MakeDegenerate}) {
    const std::string name = names[which++];
    for (int G : Groups()) {
      for (int stage = 0; stage <= 3; stage++) {
        TrainConfig cfg;
        cfg.steps = 3;
        cfg.stage = stage;
        cfg.shard_group_size = G == world_ ? 0 : G;
        auto m = make();
        const TrainResult r = TrainSharded(*m, cfg);
        ASSERT_EQ(r.status, ZS_OK) << r.error;
        const std::string what = name + " W " + std::to_string(world_) +
                                 " G " + std::to_string(G) + " stage " +
                                 std::to_string(stage);
        Check(Sum(r.step_log.back()), Model(*m, world_, stage, G, 1, 0),
              world_, G, what, name == "degenerate" ? 1 : 2);
      }
    }
  }
}

// Micro-batches: a reduction per micro-batch (or one, with local
// accumulation) and stage 3's gathers per micro-batch.
TEST_F(CommModelTest, AccumulationCountsEachMicroBatch) {
  for (int G : Groups()) {
    for (int local = 0; local <= 1; local++) {
      for (int stage : {2, 3}) {
        TrainConfig cfg;
        cfg.steps = 3;
        cfg.stage = stage;
        cfg.grad_accum = 2;
        cfg.grad_accum_local = local;
        cfg.shard_group_size = G == world_ ? 0 : G;
        auto m = MakeMlp();
        const TrainResult r = TrainSharded(*m, cfg);
        ASSERT_EQ(r.status, ZS_OK) << r.error;
        Check(Sum(r.step_log.back()), Model(*m, world_, stage, G, 2, local),
              world_, G,
              "K 2 local " + std::to_string(local) + " G " +
                  std::to_string(G) + " stage " + std::to_string(stage));
      }
    }
  }
}

// Flat, the model is ZeRO's closed form (arXiv:1910.02054, sec. 7): per rank
// and step 2 Psi at stages 0-2 (a reduce-scatter and an all-gather) and
// 3 Psi at stage 3 (two all-gathers and a reduce-scatter), Psi the padded
// buffers' bytes (the memory estimate's stage-0 parameters: an MLP with
// every tensor trained, none tied).
TEST_F(CommModelTest, FlatIsZerosClosedForm) {
  auto m = MakeMlp();
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 0;
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = world_;
  zs_memory_estimate mem{};
  mem.struct_size = sizeof mem;
  ASSERT_EQ(zs_estimate_from_model(DescribeModel(*m).c_str(), &c, &in, &mem),
            ZS_OK);
  const uint64_t psi = mem.bytes[ZS_MEM_PARAMS];
  ASSERT_GT(psi, 0u);
  for (int stage = 0; stage <= 3; stage++) {
    const zs_comm_estimate e = Model(*m, world_, stage, world_, 1, 0);
    const uint64_t shard = e.param_gather_bytes + e.grad_reduce_bytes +
                           e.grad_gather_bytes + e.param_update_gather_bytes;
    EXPECT_EQ(shard, (stage == 3 ? 3 : 2) * psi) << "stage " << stage;
    EXPECT_EQ(e.replica_reduce_bytes, 0u);
    // on the wire: (W - 1) / W of it, all within the one node
    EXPECT_DOUBLE_EQ(e.intra_node_sent_bytes,
                     (double)shard * (world_ - 1) / world_);
    EXPECT_EQ(e.inter_node_sent_bytes, 0.0);
  }
  // the count form: 2 Psi / 3 Psi of the parameter bytes, unaligned
  for (int stage = 0; stage <= 3; stage++) {
    zs_config cp = ZS_CONFIG_INIT;
    cp.stage = stage;
    zs_comm_estimate e{};
    e.struct_size = sizeof e;
    ASSERT_EQ(zs_estimate_comm_from_params(7.5e9, &cp, &in, &e), ZS_OK);
    EXPECT_EQ(e.param_gather_bytes + e.grad_reduce_bytes + e.grad_gather_bytes +
                  e.param_update_gather_bytes,
              (uint64_t)((stage == 3 ? 3 : 2) * 7.5e9 * 4))
        << "stage " << stage;
  }
}

}  // namespace
