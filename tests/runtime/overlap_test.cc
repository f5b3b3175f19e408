// overlap_test.cc — communication overlap (run under mpirun at world sizes
// 1, 2, 3, 4 and 8): results are bitwise identical with prefetch on or off,
// at any prefetch depth, bucket size (fixed reduce order), reshard policy
// and progress mode; prefetch really issues the next unit's all-gather
// before the current unit's compute ends and never has more all-gathers in
// flight than allowed; a unit used only on odd steps leaves nothing behind;
// the sequential driver reduces a shared unit once per step, also when it
// recomputes (activation checkpointing), and is bitwise identical with and
// without checkpointing.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zs_mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "examples/gpt2/layers.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class OverlapTest : public ZsMpiTest {};

struct NamedModel {
  std::string name;
  std::function<std::unique_ptr<Model>()> make;
};

const NamedModel kModels[] = {{"mlp", MakeMlp},
                              {"transformer", MakeTransformer},
                              {"degenerate", MakeDegenerate},
                              {"twice_used", MakeTwiceUsed},
                              {"branch", MakeBranch}};

// Every overlap knob changes when collectives run, never what is summed in
// which order: all runs are bitwise equal to the baseline (no prefetch,
// one bucket per unit).
TEST_F(OverlapTest, KnobsDoNotChangeOneBit) {
  struct Variant {
    std::string name;
    std::function<void(TrainConfig*)> set;
    bool stage3_only;  // prefetch and reshard only act at stage 3
  };
  const Variant variants[] = {
      {"prefetch_1", [](TrainConfig* c) { c->prefetch_depth = 1; }, true},
      {"prefetch_4", [](TrainConfig* c) { c->prefetch_depth = 4; }, true},
      {"keep_after_forward", [](TrainConfig* c) { c->reshard_after_forward = 0; }, true},
      {"max_live_1", [](TrainConfig* c) { c->max_live_elements = 1; }, true},
      {"bucket_13", [](TrainConfig* c) { c->bucket_elements = 13; }, false},
      {"bucket_64", [](TrainConfig* c) { c->bucket_elements = 64; }, false},
      {"no_progress_thread", [](TrainConfig* c) { c->progress_thread = 0; }, false},
  };
  for (const NamedModel& nm : kModels)
    for (int stage = 0; stage <= 3; stage++) {
      TrainConfig base;
      base.stage = stage;
      base.steps = 5;
      base.prefetch_depth = 0;
      auto m0 = nm.make();
      TrainResult ref = TrainSharded(*m0, base);
      ASSERT_EQ(ref.status, ZS_OK) << ref.error;
      std::vector<Variant> todo(std::begin(variants), std::end(variants));
      // One-element buckets split every shard into single elements: cheap
      // only for the model of tiny units.
      if (nm.name == "degenerate")
        todo.push_back({"bucket_1", [](TrainConfig* c) { c->bucket_elements = 1; }, false});
      for (const Variant& v : todo) {
        if (v.stage3_only && stage != 3) continue;
        TrainConfig cfg = base;
        v.set(&cfg);
        auto m = nm.make();
        TrainResult r = TrainSharded(*m, cfg);
        ASSERT_EQ(r.status, ZS_OK) << nm.name << " " << v.name << ": " << r.error;
        for (size_t t = 0; t < ref.params.size(); t++)
          EXPECT_TRUE(Bitwise(r.params[t], ref.params[t]))
              << nm.name << " stage " << stage << " " << v.name << " tensor " << t;
      }
    }
}

// The backend's reduce-scatter (MPI's own algorithm) may order sums
// differently for other message sizes: across bucket sizes it stays within
// the foundation issue's tolerance of the fixed order.
TEST_F(OverlapTest, BackendReduceOrderIsWithinTolerance) {
  for (size_t bucket : {(size_t)1 << 22, (size_t)37, (size_t)100}) {
    TrainConfig fixed, backend;
    fixed.stage = backend.stage = 2;
    backend.reduce_order = ZS_REDUCE_BACKEND;
    backend.bucket_elements = bucket;
    auto m1 = MakeTransformer(), m2 = MakeTransformer();
    TrainResult a = TrainSharded(*m1, fixed), b = TrainSharded(*m2, backend);
    ASSERT_EQ(b.status, ZS_OK) << b.error;
    for (size_t t = 0; t < a.params.size(); t++)
      EXPECT_TRUE(CloseByNorm(b.params[t], a.params[t], 1e-5))
          << "bucket " << bucket << " tensor " << t;
  }
}

// A unit used only on odd steps: parity with the reference, and after every
// step no gathered parameters, no reduction buffers, the same total bytes.
TEST_F(OverlapTest, BranchOnOddStepsLeavesNothingBehind) {
  for (int stage = 0; stage <= 3; stage++) {
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 8;
    auto m = MakeBranch(), mr = MakeBranch();
    TrainResult r = TrainSharded(*m, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    TrainResult ref = TrainReference(*mr, cfg);
    for (size_t t = 0; t < ref.params.size(); t++)
      EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], 1e-5)) << "tensor " << t;
    for (int s = 0; s < cfg.steps; s++) {
      EXPECT_EQ(r.step_memory[s].current[ZS_MEM_PARAMS_GATHERED], 0u) << "step " << s;
      EXPECT_EQ(r.step_memory[s].current[ZS_MEM_COMM_BUFFERS], 0u) << "step " << s;
      EXPECT_EQ(r.step_memory[s].total_current, r.step_memory[0].total_current)
          << "stage " << stage << " step " << s;
    }
  }
}

// Prefetch on a model whose path changes every step (the branch unit only
// on odd steps): the branch is not steady, so it is gathered on use and
// never prefetched, and the rest is prefetched as on a stable model. After
// the first two steps every step issues exactly the all-gathers of
// prefetch off (before this: a wrong guess and a departure every step, 52
// all-gathers over steps 2-9 against 40 at 2 ranks; this test failed
// there). Results bitwise prefetch off. With the live limit at the largest
// unit (max_live_elements 1: raised to it), each step's gathered peak and
// all-gathers are prefetch off's: the limit keeps room for the branch,
// gathered on use (without that room the branch came beside a prefetched
// unit: 640 bytes against 384 at 2 ranks, 768 against 512 at 4; and once
// unused prefetches were freed for it, every odd step gathered them
// again; this test failed both ways).
TEST_F(OverlapTest, PrefetchLearnsAnAlternatingBranch) {
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 10;
  std::vector<TrainResult> runs;
  for (size_t limit : {0, 0, 1}) {
    cfg.prefetch_depth = runs.empty() ? 0 : 2;
    cfg.max_live_elements = limit;
    auto m = MakeBranch();
    runs.push_back(TrainSharded(*m, cfg));
    ASSERT_EQ(runs.back().status, ZS_OK) << runs.back().error;
  }
  const TrainResult &off = runs[0], &on = runs[1], &limited = runs[2];
  auto mr = MakeBranch();
  ExpectSameTraining(on, off, *mr, "prefetch 2 vs 0");
  ExpectSameTraining(limited, off, *mr, "prefetch 2 under the limit vs 0");
  const std::vector<size_t> peak_off = GatheredPeaks(off),
                            peak_lim = GatheredPeaks(limited);
  for (int s = 2; s < cfg.steps; s++) {
    EXPECT_EQ(peak_lim[s], peak_off[s]) << "step " << s << ": gathered peak";
    EXPECT_EQ(limited.step_counters[s].calls[ZS_COLL_ALL_GATHER],
              off.step_counters[s].calls[ZS_COLL_ALL_GATHER])
        << "step " << s << ": all-gathers under the limit vs prefetch off";
  }
  uint64_t gathers_off = 0, gathers_on = 0;
  double wait_off = 0, wait_on = 0;
  for (int s = 2; s < cfg.steps; s++) {
    wait_off += off.step_counters[s].wait_seconds[ZS_COLL_ALL_GATHER];
    wait_on += on.step_counters[s].wait_seconds[ZS_COLL_ALL_GATHER];
    EXPECT_EQ(on.step_counters[s].calls[ZS_COLL_ALL_GATHER],
              off.step_counters[s].calls[ZS_COLL_ALL_GATHER])
        << "step " << s << ": all-gathers with prefetch vs without";
    gathers_off += off.step_counters[s].calls[ZS_COLL_ALL_GATHER];
    gathers_on += on.step_counters[s].calls[ZS_COLL_ALL_GATHER];
  }
  // (without the limit the gathered memory's peak is prefetch's own working
  // set, and the time the caller waited for all-gathers is timing: printed,
  // not asserted)
  if (rank_ == 0)
    std::printf("alternating branch, stage 3, %d ranks, steps 2-%d: %llu "
                "all-gathers with prefetch (depth 2), %llu without; peak "
                "gathered %zu vs %zu bytes; all-gather wait %.1f vs %.1f "
                "us\n",
                world_, cfg.steps - 1, (unsigned long long)gathers_on,
                (unsigned long long)gathers_off,
                on.memory.peak[ZS_MEM_PARAMS_GATHERED],
                off.memory.peak[ZS_MEM_PARAMS_GATHERED], wait_on * 1e6,
                wait_off * 1e6);
}

// The alternating branch in a stack shaped like GPT-2 (an embedding of
// about 6 blocks), with the live limit at the largest unit (max_live_elements
// 1: raised to it). The limit keeps room for the branch, which is gathered
// on use, so after the first mismatch (steps 2 on) each step's gathered peak
// is prefetch off's, each issues prefetch off's all-gathers, and prefetch
// still starts some of them ahead: the blocks fit beside the embedding's
// size. (Here the room is never short: without it this test still passes;
// PrefetchLearnsAnAlternatingBranch is the one that needs it.) Without the
// limit, prefetch holds its working set: printed. Results bitwise prefetch
// off, which is bitwise the rank-order reference. (What prefetch saves in
// wait time is timing: tools/zs bench prefetch.)
TEST_F(OverlapTest, PrefetchUnderTheLiveLimitKeepsPrefetchOffsPeak) {
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 6;
  struct Run { const char* name; int depth; size_t max_live; TrainResult r; };
  std::vector<Run> runs = {{"off", 0, 0, {}}, {"depth 2", 2, 0, {}},
                           {"depth 2, limit", 2, 1, {}}};
  for (Run& run : runs) {
    cfg.prefetch_depth = run.depth;
    cfg.max_live_elements = run.max_live;
    auto m = MakeBranchStack();
    run.r = TrainSharded(*m, cfg);
    ASSERT_EQ(run.r.status, ZS_OK) << run.name << ": " << run.r.error;
  }
  const TrainResult &off = runs[0].r, &limited = runs[2].r;
  auto mr = MakeBranchStack();
  TrainConfig rc = cfg;
  rc.reference_world = world_;
  const TrainResult ref = TrainReference(*mr, rc);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  for (size_t t = 0; t < mr->tensors.size(); t++) {
    EXPECT_TRUE(Bitwise(off.params[t], ref.params[t]))
        << "prefetch 0 vs the rank-order reference, tensor " << t;
    EXPECT_TRUE(Bitwise(off.state0[t], ref.state0[t])) << "tensor " << t << " m";
  }
  for (int s = 0; s < cfg.steps; s++) EXPECT_EQ(off.losses[s], ref.losses[s]) << "step " << s;
  ExpectSameTraining(limited, off, *mr, "prefetch 2 under the limit vs 0");
  ExpectSameTraining(runs[1].r, off, *mr, "prefetch 2 vs 0");
  const std::vector<size_t> peak_off = GatheredPeaks(off),
                            peak_lim = GatheredPeaks(limited);
  uint64_t prefetched = 0;
  for (int s = 2; s < cfg.steps; s++) {
    EXPECT_EQ(peak_lim[s], peak_off[s]) << "step " << s << ": gathered peak";
    EXPECT_EQ(limited.step_counters[s].calls[ZS_COLL_ALL_GATHER],
              off.step_counters[s].calls[ZS_COLL_ALL_GATHER]) << "step " << s;
    EXPECT_EQ(off.step_prefetched[s], 0u) << "step " << s;
    prefetched += limited.step_prefetched[s];
  }
  EXPECT_GT(prefetched, 0u) << "the limit left no room to prefetch";
  for (const Run& run : runs) {
    uint64_t ahead = 0;
    size_t peak = 0;
    const std::vector<size_t> peaks = GatheredPeaks(run.r);
    for (int s = 2; s < cfg.steps; s++) {
      ahead += run.r.step_prefetched[s];
      peak = std::max(peak, peaks[s]);
    }
    if (rank_ == 0)
      std::printf("branch stack, stage 3, %d ranks, steps 2-%d, %s: gathered "
                  "peak %zu bytes, %llu all-gathers prefetched\n", world_,
                  cfg.steps - 1, run.name, peak, (unsigned long long)ahead);
  }
}

// A model of one-tensor units of given sizes (elements) whose path is set
// per step: groups of units, each group's units gathered together
// (nested), forward in order, backward in reverse.
class PathModel : public Model {
 public:
  using Path = std::function<std::vector<std::vector<int>>(int step)>;
  PathModel(const std::vector<int>& sizes, Path path) : path_(std::move(path)) {
    for (size_t i = 0; i < sizes.size(); i++) {
      tensors.push_back({"t" + std::to_string(i), {sizes[i]}});
      units.push_back({"u" + std::to_string(i), {(int)i}});
    }
  }
  float Step(Access& a, int step, int b0, int nb) override {
    (void)nb;
    const std::vector<std::vector<int>> groups = path_(step);
    for (const auto& g : groups) {
      for (int u : g) a.BeginForward(u);
      for (size_t k = g.size(); k-- > 0;) a.EndForward(g[k]);
    }
    for (size_t gi = groups.size(); gi-- > 0;) {
      const auto& g = groups[gi];
      for (int u : g) {
        a.BeginBackward(u);
        const float* w = a.Param(u);
        float* gr = a.Grad(u);
        for (size_t i = 0; i < tensors[u].numel(); i++)
          gr[i] = 1e-3f * (float)((b0 + (int)i) % 7) + 1e-4f * w[i];
      }
      for (size_t k = g.size(); k-- > 0;) a.EndBackward(g[k]);
    }
    return 0.f;
  }

 private:
  Path path_;
};

// The live limit at the largest unit (max_live_elements 1) holds on paths
// that change: from the first step on, each step's gathered peak under the
// limit with prefetch depth 2 is at most prefetch off's, results bitwise.
// Where the path repeats (a branch on odd steps, every third step, two
// branches, a nested branch, reshard_after_forward 0) every step from the
// third issues prefetch off's all-gathers: the limit keeps room for the
// branch (the nested one: room for both its units; with room for one
// unit, 16 all-gathers against 14 at 4 ranks). A branch first taken at
// step 4 is met by freeing the unused prefetches (zs__live_make_room):
// before that, its first step peaked at 1.37x prefetch off's at 2 ranks;
// that step, and step 3 of the branch every third step, may issue more
// all-gathers. A unit gathered in step 1 only leaves no room behind: from
// step 10 prefetch is as if it never came (with room kept for every unit
// ever gathered, it blocked prefetch for the rest of the run). A
// replicated largest unit does not set the limit (it did: the peak went
// 1.2x over prefetch off's). Scenarios from a break-it trial.
TEST_F(OverlapTest, LiveLimitHoldsOnChangingPaths) {
  using Groups = std::vector<std::vector<int>>;
  // embed 600, small 50, blocks 300, branch 500, head 10
  const std::vector<int> kSizes = {600, 50, 300, 500, 300, 10};
  auto around = [](const std::vector<int>& branch) {
    Groups p = {{0}, {1}};
    if (!branch.empty()) p.push_back(branch);
    p.push_back({2});
    p.push_back({4});
    p.push_back({5});
    return p;
  };
  struct Scenario {
    const char* name;
    std::vector<int> sizes;
    PathModel::Path path;
    std::function<void(TrainConfig*)> tweak;
    int steps;
    std::vector<int> extra_gather_steps;  // may issue more all-gathers
  };
  const std::vector<Scenario> scenarios = {
      {"odd steps", kSizes,
       [&](int s) { return around(s % 2 ? std::vector<int>{3} : std::vector<int>{}); },
       nullptr, 8, {}},
      // (in step 0 every unit counts as steady: step 3 is the first mismatch)
      {"every third step", kSizes,
       [&](int s) { return around(s % 3 == 0 ? std::vector<int>{3} : std::vector<int>{}); },
       nullptr, 10, {3}},
      {"first at step 4, then even steps", kSizes,
       [&](int s) { return around(s >= 4 && s % 2 == 0 ? std::vector<int>{3} : std::vector<int>{}); },
       nullptr, 8, {4}},
      {"two alternating branches", {600, 50, 300, 500, 500, 300, 10},
       [](int s) { return Groups{{0}, {1}, {s % 2 ? 3 : 4}, {2}, {5}, {6}}; },
       nullptr, 8, {}},
      {"nested branch", {600, 50, 250, 300, 300, 250, 10},
       [](int s) {
         Groups p = {{0}, {1}};
         if (s % 2) p.push_back({3, 4});
         p.push_back({2});
         p.push_back({5});
         p.push_back({6});
         return p;
       },
       nullptr, 8, {}},
      {"reshard_after_forward 0", kSizes,
       [&](int s) { return around(s % 2 ? std::vector<int>{3} : std::vector<int>{}); },
       [](TrainConfig* c) { c->reshard_after_forward = 0; }, 8, {}},
      {"step 1 only", kSizes,
       [&](int s) { return around(s == 1 ? std::vector<int>{3} : std::vector<int>{}); },
       nullptr, 13, {}},
      {"replicated largest unit", {900, 50, 300, 300, 300, 10},
       [](int) { return Groups{{0}, {1}, {2}, {3}, {4}, {5}}; },
       [](TrainConfig* c) { c->replicated = {0}; }, 6, {}},
  };
  for (const Scenario& sc : scenarios) {
    TrainConfig cfg;
    cfg.stage = 3;
    cfg.steps = sc.steps;
    if (sc.tweak) sc.tweak(&cfg);
    std::vector<TrainResult> r;
    for (int limit : {0, 1}) {
      cfg.prefetch_depth = limit ? 2 : 0;
      cfg.max_live_elements = limit;
      PathModel m(sc.sizes, sc.path);
      r.push_back(TrainSharded(m, cfg));
      ASSERT_EQ(r.back().status, ZS_OK) << sc.name << ": " << r.back().error;
    }
    PathModel mr(sc.sizes, sc.path);
    ExpectSameTraining(r[1], r[0], mr, sc.name);
    const std::vector<size_t> off = GatheredPeaks(r[0]), lim = GatheredPeaks(r[1]);
    uint64_t prefetched = 0;
    std::string peaks;
    for (int s = 0; s < sc.steps; s++) {
      EXPECT_LE(lim[s], off[s]) << sc.name << " step " << s << ": gathered peak";
      peaks += " " + std::to_string(lim[s]) + "/" + std::to_string(off[s]);
      const bool extra = std::find(sc.extra_gather_steps.begin(),
                                   sc.extra_gather_steps.end(), s) !=
                         sc.extra_gather_steps.end();
      if (s >= 2 && !extra)
        EXPECT_EQ(r[1].step_counters[s].calls[ZS_COLL_ALL_GATHER],
                  r[0].step_counters[s].calls[ZS_COLL_ALL_GATHER])
            << sc.name << " step " << s << ": all-gathers";
      if (s >= 2) prefetched += r[1].step_prefetched[s];
    }
    if (std::string(sc.name) == "step 1 only") {
      // from step 10 on (8 steps after it) prefetch as if it never came
      PathModel mn(sc.sizes, [&](int) { return around({}); });
      cfg.prefetch_depth = 2;
      cfg.max_live_elements = 1;
      const TrainResult never = TrainSharded(mn, cfg);
      ASSERT_EQ(never.status, ZS_OK) << never.error;
      for (int s = 10; s < sc.steps; s++)
        EXPECT_EQ(r[1].step_prefetched[s], never.step_prefetched[s]) << "step " << s;
      EXPECT_GT(never.step_prefetched[sc.steps - 1], 0u);
    }
    if (rank_ == 0)
      std::printf("live limit, %d ranks, %s: %llu all-gathers prefetched from "
                  "step 2; gathered peak per step, limit/off (bytes):%s\n",
                  world_, sc.name, (unsigned long long)prefetched, peaks.c_str());
  }
}

// ==== Prefetch evidence from the communication log ===========================

// A chain of equally shaped linear units run with the per-step API; the
// test notes the collective sequence number when each unit's compute ends.
struct Chain {
  static constexpr int kUnits = 5, kD = 24;
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  std::vector<int> units, weights;
};

void BuildChain(Chain* c, int depth) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  cfg.prefetch_depth = depth;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &c->ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(c->ctx, &c->m), ZS_OK);
  for (int u = 0; u < Chain::kUnits; u++) {
    int id = -1, t = -1;
    int64_t shape[2] = {Chain::kD, Chain::kD};
    std::string name = "lin" + std::to_string(u);
    ASSERT_EQ(zs_model_add_unit(c->m, name.c_str(), &id), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(c->m, id, (name + ".w").c_str(), 2, shape,
                                  ZS_FLOAT32, 0, &t), ZS_OK);
    ASSERT_EQ(zs_unit_set_grad_uses(c->m, id, 1), ZS_OK);
    c->units.push_back(id);
    c->weights.push_back(t);
  }
  ASSERT_EQ(zs_model_finalize(c->m), ZS_OK);
}

TEST_F(OverlapTest, PrefetchIssuesTheNextGatherBeforeComputeEnds) {
  for (int depth : {1, 2, 3}) {
    Chain c;
    BuildChain(&c, depth);
    zs__comm* comm = c.ctx->comm;
    // end_seq[step][k]: collectives issued when the k-th use (forward then
    // backward) finished computing.
    std::vector<std::vector<uint64_t>> end_seq;
    std::vector<uint64_t> step_start;
    for (int step = 0; step < 3; step++) {
      step_start.push_back(comm->seq_count);
      std::vector<uint64_t> ends;
      std::vector<int> order;
      for (int u = 0; u < Chain::kUnits; u++) order.push_back(u);
      for (int u = Chain::kUnits - 1; u >= 0; u--) order.push_back(u);
      for (size_t k = 0; k < order.size(); k++) {
        const int u = order[k];
        const bool bwd = k >= (size_t)Chain::kUnits;
        ASSERT_EQ(zs_unit_gather(c.m, c.units[u]), ZS_OK);
        if (bwd) {
          ASSERT_EQ(zs_unit_grad_acquire(c.m, c.units[u]), ZS_OK);
        }
        void* w = nullptr;
        ASSERT_EQ(zs_tensor_data(c.m, c.weights[u], &w), ZS_OK);  // "compute"
        ends.push_back(comm->seq_count);
        if (bwd) {
          ASSERT_EQ(zs_unit_grad_release(c.m, c.units[u]), ZS_OK);
        }
        ASSERT_EQ(zs_unit_release(c.m, c.units[u]), ZS_OK);
      }
      ASSERT_EQ(zs_step(c.m, nullptr), ZS_OK) << zs_last_error();
      end_seq.push_back(ends);
    }
    // From the log: the issue sequence number of every stage-3 gather.
    std::vector<zs__comm_log_entry> log(ZS__COMM_LOG_CAP);
    size_t n = zs__comm_log_read(comm, log.data(), log.size());
    for (int step = 1; step < 3; step++) {
      // The gathers of this step, in issue order.
      std::vector<zs__comm_log_entry> gathers;
      for (size_t i = 0; i < n; i++)
        if (log[i].purpose == ZS__P_GATHER && log[i].seq >= step_start[step] &&
            (step + 1 >= (int)step_start.size() || log[i].seq < step_start[step + 1]))
          gathers.push_back(log[i]);
      // Forward uses 0..kUnits-1: the all-gather of unit k+1 was issued
      // before unit k's compute ended.
      for (int k = 0; k + 1 < Chain::kUnits; k++) {
        bool found = false;
        for (const auto& g : gathers)
          if (g.unit == c.units[k + 1] && g.seq < end_seq[step][k]) found = true;
        EXPECT_TRUE(found) << "depth " << depth << " step " << step
                           << ": unit " << k + 1
                           << "'s all-gather was not issued before unit " << k
                           << "'s compute ended";
      }
    }
    // Never more all-gathers in flight than the prefetches allowed plus the
    // one the caller waits for.
    EXPECT_LE(comm->max_in_flight_gathers, (uint64_t)depth + 1) << "depth " << depth;
    EXPECT_GE(comm->max_in_flight_gathers, 1u);
    // Nothing remains gathered after the steps.
    zs_memory_stats ms{};
    zs_memory_stats_get(c.ctx, &ms);
    EXPECT_EQ(ms.current[ZS_MEM_PARAMS_GATHERED], 0u);
    zs_model_destroy(c.m);
    zs_context_destroy(c.ctx);
  }
}

// A prefetch of a unit with a tied tensor brings its owner's unit along:
// both count against prefetch_depth, so unused prefetched all-gathers
// never exceed it. Hints obey the same bound.
TEST_F(OverlapTest, PrefetchDepthCountsTieOwnersAndBoundsHints) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  cfg.prefetch_depth = 1;
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int e = -1, a = -1, h = -1, we = -1, wa = -1, wh = -1;
  const int64_t shape[2] = {6, 5};
  ASSERT_EQ(zs_model_add_unit(m, "E", &e), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "A", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "H", &h), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, e, "E.w", 2, shape, ZS_FLOAT32, 0, &we), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, a, "A.w", 2, shape, ZS_FLOAT32, 0, &wa), ZS_OK);
  ASSERT_EQ(zs_model_add_tied_tensor(m, h, "H.w", we, &wh), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  const int fwd[3] = {e, a, h}, bwd[3] = {h, a, e};
  for (int step = 0; step < 3; step++) {
    for (int u : fwd) {
      ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
      EXPECT_LE(m->prefetches, 1) << "step " << step << " unit " << u;
      ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
    }
    for (int u : bwd) {
      ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
      EXPECT_LE(m->prefetches, 1) << "step " << step << " unit " << u;
      ASSERT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
      ASSERT_EQ(zs_unit_grad_release(m, u), ZS_OK);
      ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
    }
    ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  }
  // A hint for H (2 all-gathers with its owner E) does not fit depth 1.
  ASSERT_EQ(zs_unit_prefetch(m, h), ZS_OK);
  EXPECT_EQ(m->prefetches, 0);
  ASSERT_EQ(zs_unit_prefetch(m, a), ZS_OK);
  EXPECT_EQ(m->prefetches, 1);
  ASSERT_EQ(zs_unit_prefetch(m, e), ZS_OK);  // depth reached: a no-op
  EXPECT_EQ(m->prefetches, 1);
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();  // drops it
  zs_memory_stats ms{};
  zs_memory_stats_get(ctx, &ms);
  EXPECT_EQ(ms.current[ZS_MEM_PARAMS_GATHERED], 0u);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// The public communication log: every collective with its size (the full
// size per rank, as the counters), issue and completion times, algbw and
// busbw by nccl-tests' factors; the log adds up to the counters.
TEST_F(OverlapTest, CommunicationLogAddsUpToTheCounters) {
  Chain c;
  BuildChain(&c, 2);
  for (int step = 0; step < 2; step++) {
    for (int u = 0; u < Chain::kUnits; u++) {
      ASSERT_EQ(zs_unit_gather(c.m, c.units[u]), ZS_OK);
      ASSERT_EQ(zs_unit_release(c.m, c.units[u]), ZS_OK);
    }
    for (int u = Chain::kUnits - 1; u >= 0; u--) {
      ASSERT_EQ(zs_unit_gather(c.m, c.units[u]), ZS_OK);
      ASSERT_EQ(zs_unit_grad_acquire(c.m, c.units[u]), ZS_OK);
      ASSERT_EQ(zs_unit_grad_release(c.m, c.units[u]), ZS_OK);
      ASSERT_EQ(zs_unit_release(c.m, c.units[u]), ZS_OK);
    }
    ASSERT_EQ(zs_step(c.m, nullptr), ZS_OK) << zs_last_error();
  }
  const size_t n = zs_comm_log_get(c.ctx, nullptr, 0);
  ASSERT_EQ(n, (size_t)c.ctx->comm->seq_count);
  std::vector<zs_comm_record> log(n);
  ASSERT_EQ(zs_comm_log_get(c.ctx, log.data(), log.size()), n);
  zs_comm_counters cc{};
  ASSERT_EQ(zs_comm_counters_get(c.ctx, &cc), ZS_OK);
  uint64_t bytes[ZS_COLL_OP_COUNT] = {0}, calls[ZS_COLL_OP_COUNT] = {0};
  int gathers = 0, reduces = 0;
  for (size_t i = 0; i < n; i++) {
    const zs_comm_record& r = log[i];
    bytes[r.op] += r.bytes;
    calls[r.op]++;
    EXPECT_EQ(r.seq, (uint64_t)i);
    EXPECT_GE(r.done_s, r.issue_s) << i;
    EXPECT_GT(r.done_s, 0.0) << i;
    EXPECT_DOUBLE_EQ(r.busbw_GBps, r.algbw_GBps * zs_busbw_factor(r.op, world_));
    gathers += std::string(r.purpose) == "param gather";
    reduces += std::string(r.purpose) == "grad reduce";
  }
  for (int k = 0; k < ZS_COLL_OP_COUNT; k++) {
    EXPECT_EQ(bytes[k], cc.bytes[k]) << zs_coll_op_name((zs_coll_op)k);
    EXPECT_EQ(calls[k], cc.calls[k]) << zs_coll_op_name((zs_coll_op)k);
  }
  EXPECT_EQ(gathers, 2 * 2 * Chain::kUnits);  // forward + backward, 2 steps
  EXPECT_EQ(reduces, 2 * Chain::kUnits);
  // The most recent 3 only.
  std::vector<zs_comm_record> last(3);
  ASSERT_EQ(zs_comm_log_get(c.ctx, last.data(), 3), 3u);
  EXPECT_EQ(last[2].seq, log[n - 1].seq);
  EXPECT_DOUBLE_EQ(zs_busbw_factor(ZS_COLL_ALL_REDUCE, 4), 1.5);
  EXPECT_DOUBLE_EQ(zs_busbw_factor(ZS_COLL_REDUCE_SCATTER, 4), 0.75);
  zs_model_destroy(c.m);
  zs_context_destroy(c.ctx);
}

// config.profile_dir: each rank writes its Chrome trace when the context
// is destroyed, with memory counters and collective spans.
TEST_F(OverlapTest, ProfileDirFromTheConfigWritesEachRanksTrace) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp");
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  cfg.profile_dir = dir.c_str();
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  const int64_t n = 100;
  ASSERT_EQ(zs_model_add_unit(m, "prof_unit", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
  ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  const std::string path = dir + "/zs_profile_rank" + std::to_string(rank_) + ".json";
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr) << path;
  std::string text;
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, k);
  std::fclose(f);
  EXPECT_NE(text.find("\"format\":\"zeroshard-profile\""), std::string::npos);
  EXPECT_NE(text.find("\"ph\":\"C\""), std::string::npos);  // memory counters
  EXPECT_NE(text.find("\"cat\":\"gather\""), std::string::npos);
  EXPECT_NE(text.find("\"unit\":\"prof_unit\""), std::string::npos);
  EXPECT_NE(text.find("\"cat\":\"comm\""), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");  // complete
}

// Without prefetch a unit's all-gather is issued only at its use.
TEST_F(OverlapTest, NoPrefetchGathersOnlyAtUse) {
  Chain c;
  BuildChain(&c, 0);
  for (int step = 0; step < 2; step++) {
    for (int u = 0; u < Chain::kUnits; u++) {
      uint64_t before = c.ctx->comm->seq_count;
      ASSERT_EQ(zs_unit_gather(c.m, c.units[u]), ZS_OK);
      EXPECT_EQ(c.ctx->comm->seq_count, before + 1) << "one all-gather, its own";
      ASSERT_EQ(zs_unit_release(c.m, c.units[u]), ZS_OK);
    }
    ASSERT_EQ(zs_step(c.m, nullptr), ZS_OK);
  }
  EXPECT_EQ(c.ctx->comm->max_in_flight_gathers, 1u);
  zs_model_destroy(c.m);
  zs_context_destroy(c.ctx);
}

// A limit below the largest unit could never be met: it is raised to it.
TEST_F(OverlapTest, MaxLiveBelowTheLargestUnitIsRaised) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  cfg.max_live_elements = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  int64_t n = 1000;
  ASSERT_EQ(zs_model_add_unit(m, "big", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  size_t padded = 0;
  ASSERT_EQ(zs_unit_layout(m, u, nullptr, &padded, nullptr), ZS_OK);
  EXPECT_EQ(m->max_live_elems, padded);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// ==== The sequential driver ===================================================

// Layers: lin A, lin B, lin A again (shared weights), head C with an MSE
// loss. Each linear layer is out = gelu(in W^T), its scratch the
// pre-activation.
struct DriverNet {
  static constexpr int kD = 10, kOut = 3;
  int nb = 0, step = 0, b0 = 0;
  bool fail_now = false;    // LinBackward fails (a user error on one rank)
  std::vector<int> weight;  // tensor id per unit (A, B, C)
  std::vector<float> target;
  float loss = 0;
};

float Input(int step, int sample, int d) {
  return HashUniform(41, step, (uint64_t)sample * 100 + d);
}

zs_status LinForward(void* user, zs_model* m, const zs_layer_io* io) {
  DriverNet* n = static_cast<DriverNet*>(user);
  void* w = nullptr;
  zs_status st = zs_tensor_data(m, n->weight[io->unit], &w);
  if (st != ZS_OK) return st;
  const int D = DriverNet::kD;
  float* pre = static_cast<float*>(io->scratch);
  gpt2_matmul_forward(pre, static_cast<const float*>(io->input),
                      static_cast<float*>(w), nullptr, n->nb, D, D);
  gpt2_gelu_forward(static_cast<float*>(io->output), pre, (size_t)n->nb * D);
  return ZS_OK;
}

zs_status LinBackward(void* user, zs_model* m, const zs_layer_io* io) {
  DriverNet* n = static_cast<DriverNet*>(user);
  if (n->fail_now) return ZS_ERR_INVALID_ARGUMENT;
  void *w = nullptr, *dw = nullptr;
  zs_status st = zs_tensor_data(m, n->weight[io->unit], &w);
  if (st == ZS_OK) st = zs_tensor_grad(m, n->weight[io->unit], &dw);
  if (st != ZS_OK) return st;
  const int D = DriverNet::kD;
  std::vector<float> dpre((size_t)n->nb * D, 0.f);
  gpt2_gelu_backward(dpre.data(), static_cast<const float*>(io->scratch),
                     static_cast<const float*>(io->grad_output), dpre.size());
  gpt2_matmul_backward(static_cast<float*>(io->grad_input),
                       static_cast<float*>(dw), nullptr, dpre.data(),
                       static_cast<const float*>(io->input),
                       static_cast<float*>(w), n->nb, D, D);
  return ZS_OK;
}

zs_status HeadForward(void* user, zs_model* m, const zs_layer_io* io) {
  DriverNet* n = static_cast<DriverNet*>(user);
  void* w = nullptr;
  zs_status st = zs_tensor_data(m, n->weight[io->unit], &w);
  if (st != ZS_OK) return st;
  float* pred = static_cast<float*>(io->scratch);
  gpt2_matmul_forward(pred, static_cast<const float*>(io->input),
                      static_cast<float*>(w), nullptr, n->nb, DriverNet::kD,
                      DriverNet::kOut);
  gpt2_mse_forward(&n->loss, pred, n->target.data(), n->nb, DriverNet::kOut);
  *static_cast<float*>(io->output) = n->loss;
  return ZS_OK;
}

zs_status HeadBackward(void* user, zs_model* m, const zs_layer_io* io) {
  DriverNet* n = static_cast<DriverNet*>(user);
  void *w = nullptr, *dw = nullptr;
  zs_status st = zs_tensor_data(m, n->weight[io->unit], &w);
  if (st == ZS_OK) st = zs_tensor_grad(m, n->weight[io->unit], &dw);
  if (st != ZS_OK) return st;
  std::vector<float> dpred((size_t)n->nb * DriverNet::kOut, 0.f);
  gpt2_mse_backward(dpred.data(), 1.0f, static_cast<const float*>(io->scratch),
                    n->target.data(), n->nb, DriverNet::kOut);
  gpt2_matmul_backward(static_cast<float*>(io->grad_input),
                       static_cast<float*>(dw), nullptr, dpred.data(),
                       static_cast<const float*>(io->input),
                       static_cast<float*>(w), n->nb, DriverNet::kD,
                       DriverNet::kOut);
  return ZS_OK;
}

zs_status InitWeights(void*, int tensor, const zs_tensor_desc* d, void* data) {
  for (size_t i = 0; i < d->numel; i++)
    static_cast<float*>(data)[i] = 0.4f * HashUniform(43, tensor, i);
  return ZS_OK;
}

struct DriverRun {
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> gathers;     // all-gathers per training step
  int trace_valid_at_end = 0, trace_len_at_end = 0;
  std::vector<uint64_t> reductions;  // reduce-scatters per step
  zs_memory_stats memory{};
  int host_collectives = -1;  // zs_context_config's: what the context used
  zs_status status = ZS_OK;
  std::string error;
};

// fail_step: at that step the last rank's LinBackward fails; every rank
// must see an error from zs_driver_backward, then zs_step_discard.
// skip_step: that step's data is not trained on at all.
DriverRun RunDriverNet(int stage, int checkpoint, MPI_Comm comm, int steps,
                       int fail_step = -1, int skip_step = -1,
                       bool eval_between = false) {
  DriverRun out;
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = stage;
  cfg.optimizer.lr = 1e-2;
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  zs_driver* d = nullptr;
  DriverNet net;
  net.nb = kGlobalBatch / world;
  net.b0 = rank * net.nb;
  const int D = DriverNet::kD;
  auto fail = [&](zs_status st) {
    if (out.status == ZS_OK) {
      out.status = st;
      out.error = zs_last_error();
    }
  };
  zs_status st = zs_context_create_mpi(&cfg, comm, &ctx);
  if (st == ZS_OK) st = zs_model_create(ctx, &m);
  int units[3];
  for (int u = 0; u < 3 && st == ZS_OK; u++) {
    int t = -1;
    int64_t shape[2] = {u == 2 ? DriverNet::kOut : D, D};
    const char* names[3] = {"A", "B", "C"};
    st = zs_model_add_unit(m, names[u], &units[u]);
    if (st == ZS_OK)
      st = zs_model_add_tensor(m, units[u], (std::string(names[u]) + ".w").c_str(),
                               2, shape, ZS_FLOAT32, 0, &t);
    net.weight.push_back(t);
  }
  if (st == ZS_OK)
    st = zs_driver_create(m, (size_t)net.nb * D * sizeof(float), checkpoint, &d);
  const size_t act = (size_t)net.nb * D * sizeof(float);
  zs_layer_desc layers[4] = {
      {units[0], LinForward, LinBackward, &net, act, act, 0},
      {units[1], LinForward, LinBackward, &net, act, act, 0},
      {units[0], LinForward, LinBackward, &net, act, act, 0},
      {units[2], HeadForward, HeadBackward, &net, sizeof(float),
       (size_t)net.nb * DriverNet::kOut * sizeof(float), 0}};
  for (int l = 0; l < 4 && st == ZS_OK; l++) st = zs_driver_add_layer(d, &layers[l], nullptr);
  if (st == ZS_OK) st = zs_model_finalize(m);
  if (st == ZS_OK) st = zs_model_init(m, InitWeights, nullptr);
  for (int s = 0; s < steps && st == ZS_OK; s++) {
    void* in = nullptr;
    st = zs_driver_input(d, &in);
    if (st != ZS_OK) break;
    net.target.assign((size_t)net.nb * DriverNet::kOut, 0.f);
    for (int i = 0; i < net.nb; i++) {
      for (int k = 0; k < D; k++)
        static_cast<float*>(in)[i * D + k] = Input(s, net.b0 + i, k);
      for (int k = 0; k < DriverNet::kOut; k++)
        net.target[(size_t)i * DriverNet::kOut + k] = 0.5f * Input(s, net.b0 + i, k);
    }
    if (s == skip_step) continue;
    zs_comm_counters before{}, after{};
    zs_comm_counters_get(ctx, &before);
    net.fail_now = s == fail_step && rank == world - 1;
    st = zs_driver_forward(d);
    if (st == ZS_OK) st = zs_driver_backward(d);
    if (s == fail_step) {
      const zs_status want = rank == world - 1 ? ZS_ERR_INVALID_ARGUMENT
                                               : ZS_ERR_REMOTE;
      EXPECT_EQ(st, want) << "rank " << rank << ": " << zs_last_error();
      if (st != ZS_OK) {
        EXPECT_NE(std::string(zs_last_error()).find(
                      rank == world - 1 ? "backward" : "failed on rank"),
                  std::string::npos)
            << zs_last_error();
      }
      net.fail_now = false;
      zs_step_info info{};
      st = zs_step_discard(m, &info);
      EXPECT_EQ(info.applied, 0);
      continue;
    }
    if (st == ZS_OK) st = zs_step(m, nullptr);
    zs_comm_counters_get(ctx, &after);
    out.reductions.push_back(after.calls[ZS_COLL_REDUCE_SCATTER] -
                             before.calls[ZS_COLL_REDUCE_SCATTER]);
    out.gathers.push_back(after.calls[ZS_COLL_ALL_GATHER] -
                          before.calls[ZS_COLL_ALL_GATHER]);
    if (eval_between && st == ZS_OK) {
      // A forward-only pass (validation) between steps, in eval mode.
      st = zs_model_set_eval(m, 1);
      if (st == ZS_OK) st = zs_driver_forward(d);
      if (st == ZS_OK) {
        EXPECT_EQ(zs_unit_grad_acquire(m, units[0]), ZS_ERR_INVALID_STATE);
        EXPECT_NE(std::string(zs_last_error()).find("eval mode"),
                  std::string::npos);
        zs_step_info info{};
        EXPECT_EQ(zs_step(m, &info), ZS_ERR_INVALID_STATE);
        EXPECT_NE(std::string(zs_last_error()).find("eval mode"),
                  std::string::npos);
      }
      if (st == ZS_OK) st = zs_model_set_eval(m, 0);
    }
  }
  if (st != ZS_OK) fail(st);
  for (int u = 0; u < 3 && out.status == ZS_OK; u++) {
    std::vector<float> p(u == 2 ? DriverNet::kOut * D : D * D);
    st = zs_tensor_get(m, net.weight[u], ZS_FIELD_PARAM, p.data());
    if (st != ZS_OK) fail(st);
    out.params.push_back(p);
  }
  if (ctx != nullptr) zs_memory_stats_get(ctx, &out.memory);
  if (ctx != nullptr)
    out.host_collectives = zs_context_config(ctx)->host_collectives;
  if (m != nullptr) {
    out.trace_valid_at_end = m->trace_valid;
    out.trace_len_at_end = m->trace_len;
  }
  zs_driver_destroy(d);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  return out;
}

// The shared unit A is reduced exactly once per step (3 units: 3
// reduce-scatters), with and without recompute, and checkpointing changes
// no bit of the result while keeping one shared scratch.
TEST_F(OverlapTest, DriverReducesSharedUnitOnceAndCheckpointingIsExact) {
  for (int stage = 0; stage <= 3; stage++) {
    DriverRun plain = RunDriverNet(stage, 0, MPI_COMM_WORLD, 5);
    DriverRun ck = RunDriverNet(stage, 1, MPI_COMM_WORLD, 5);
    ASSERT_EQ(plain.status, ZS_OK) << plain.error;
    ASSERT_EQ(ck.status, ZS_OK) << ck.error;
    for (size_t s = 0; s < plain.reductions.size(); s++) {
      EXPECT_EQ(plain.reductions[s], 3u) << "stage " << stage << " step " << s;
      EXPECT_EQ(ck.reductions[s], 3u) << "stage " << stage << " step " << s;
    }
    for (size_t u = 0; u < plain.params.size(); u++)
      EXPECT_TRUE(Bitwise(ck.params[u], plain.params[u])) << "stage " << stage
                                                          << " unit " << u;
    // ZS_CHECKPOINT_VERIFY: every recompute of these deterministic layers
    // matches its first run, so the results are the same bits
    DriverRun verified = RunDriverNet(stage, ZS_CHECKPOINT_VERIFY, MPI_COMM_WORLD, 5);
    ASSERT_EQ(verified.status, ZS_OK) << verified.error;
    for (size_t u = 0; u < plain.params.size(); u++)
      EXPECT_TRUE(Bitwise(verified.params[u], plain.params[u]))
          << "stage " << stage << " unit " << u;
    // Without checkpointing each of the 4 layers has its own scratch; with
    // it, one scratch of the largest.
    const size_t act = (size_t)(kGlobalBatch / world_) * DriverNet::kD * sizeof(float);
    EXPECT_EQ(plain.memory.peak[ZS_MEM_ACTIVATIONS] - ck.memory.peak[ZS_MEM_ACTIVATIONS],
              2 * act + (size_t)(kGlobalBatch / world_) * DriverNet::kOut * sizeof(float))
        << "stage " << stage;
  }
}

// A layer callback that fails on one rank does not hang the others: the
// failing rank keeps issuing the pass's collectives, every rank gets an
// error (REMOTE naming the rank elsewhere), and after zs_step_discard
// training goes on exactly as if the failed step had never happened.
TEST_F(OverlapTest, DriverCallbackFailureOnOneRankIsAgreedAndDiscarded) {
  for (int stage : {0, 3}) {
    DriverRun failed = RunDriverNet(stage, 1, MPI_COMM_WORLD, 5, 2, -1);
    DriverRun skipped = RunDriverNet(stage, 1, MPI_COMM_WORLD, 5, -1, 2);
    ASSERT_EQ(failed.status, ZS_OK) << failed.error;
    ASSERT_EQ(skipped.status, ZS_OK) << skipped.error;
    for (size_t u = 0; u < skipped.params.size(); u++)
      EXPECT_TRUE(Bitwise(failed.params[u], skipped.params[u]))
          << "stage " << stage << " unit " << u;
  }
}

// Eval mode between steps (validation): gradients and zs_step are refused,
// the forward-only pass is not part of the recorded order, so training
// steps keep their trace (the same all-gathers per step as without eval)
// and their results, bitwise.
TEST_F(OverlapTest, EvalPassesBetweenStepsKeepTheTraceAndTheResults) {
  for (int stage : {1, 3}) {
    DriverRun plain = RunDriverNet(stage, 0, MPI_COMM_WORLD, 5);
    DriverRun ev = RunDriverNet(stage, 0, MPI_COMM_WORLD, 5, -1, -1, true);
    ASSERT_EQ(plain.status, ZS_OK) << plain.error;
    ASSERT_EQ(ev.status, ZS_OK) << ev.error;
    EXPECT_EQ(ev.gathers, plain.gathers) << "stage " << stage;
    EXPECT_EQ(ev.trace_valid_at_end, plain.trace_valid_at_end);
    EXPECT_EQ(ev.trace_len_at_end, plain.trace_len_at_end);
    if (stage == 3) {
      EXPECT_EQ(ev.trace_valid_at_end, 1);
      EXPECT_GT(ev.trace_len_at_end, 0);
    }
    for (size_t u = 0; u < plain.params.size(); u++)
      EXPECT_TRUE(Bitwise(ev.params[u], plain.params[u])) << "stage " << stage;
  }
}

// Per-phase peaks of the last step: at stage 3 the forward holds gathered
// parameters and no reduction buffers, the backward the reduction buffers,
// the optimizer step neither; the resident set covers what is counted.
TEST_F(OverlapTest, PhasePeaksSeparateForwardBackwardAndStep) {
  DriverRun r = RunDriverNet(3, 0, MPI_COMM_WORLD, 3);
  ASSERT_EQ(r.status, ZS_OK) << r.error;
  const zs_memory_stats& m = r.memory;
  EXPECT_GT(m.phase_peak[ZS_PHASE_FORWARD][ZS_MEM_PARAMS_GATHERED], 0u);
  EXPECT_EQ(m.phase_peak[ZS_PHASE_FORWARD][ZS_MEM_COMM_BUFFERS], 0u);
  EXPECT_GT(m.phase_peak[ZS_PHASE_BACKWARD][ZS_MEM_COMM_BUFFERS], 0u);
  EXPECT_GT(m.phase_peak[ZS_PHASE_BACKWARD][ZS_MEM_PARAMS_GATHERED], 0u);
  EXPECT_EQ(m.phase_peak[ZS_PHASE_STEP][ZS_MEM_PARAMS_GATHERED], 0u);
  for (int p = 0; p < ZS_PHASE_COUNT; p++) {
    size_t sum = 0;
    for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++) {
      EXPECT_LE(m.phase_peak[p][k], m.peak[k]) << zs_phase_name((zs_phase)p);
      sum += m.phase_peak[p][k];
    }
    EXPECT_LE(m.phase_peak_total[p], sum) << zs_phase_name((zs_phase)p);
    EXPECT_GE(m.phase_peak_total[p], m.phase_peak[p][ZS_MEM_PARAMS]);
    EXPECT_LE(m.phase_peak_total[p], m.total_peak);
  }
  EXPECT_GT(m.resident_bytes, m.total_current);
  // Inside comm_buffers: the bucket temporaries, and at stage 3 also the
  // units' full accumulation buffers (so less than the whole). The
  // shared-memory segment's reduce-scatter sums as it reads: no
  // temporaries there.
  if (r.host_collectives == ZS_HOST_COLLECTIVES_SHM)
    EXPECT_EQ(m.comm_bucket_peak, 0u);
  else
    EXPECT_GT(m.comm_bucket_peak, 0u);
  EXPECT_LT(m.comm_bucket_peak, m.peak[ZS_MEM_COMM_BUFFERS]);
  EXPECT_EQ(m.comm_bucket_current, 0u);
  EXPECT_STREQ(zs_phase_name(ZS_PHASE_BACKWARD), "backward");
  EXPECT_STREQ(zs_phase_name((zs_phase)7), "unknown");
}

// Layers added before finalize declare use counts, ties included: a head
// unit whose weight is tied to the embedding's uses the embedding unit too.
TEST_F(OverlapTest, DriverDeclaresUsesOfTieOwners) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  zs_driver* d = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int e = -1, h = -1, w = -1, tied = -1;
  const int64_t shape[2] = {4, 3};
  ASSERT_EQ(zs_model_add_unit(m, "embed", &e), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "head", &h), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, e, "wte", 2, shape, ZS_FLOAT32, 0, &w), ZS_OK);
  ASSERT_EQ(zs_model_add_tied_tensor(m, h, "lm_head", w, &tied), ZS_OK);
  ASSERT_EQ(zs_driver_create(m, 16, 0, &d), ZS_OK);
  zs_layer_desc le = {e, LinForward, LinBackward, nullptr, 16, 0, 0};
  zs_layer_desc lh = {h, LinForward, LinBackward, nullptr, 16, 0, 0};
  ASSERT_EQ(zs_driver_add_layer(d, &le, nullptr), ZS_OK);
  ASSERT_EQ(zs_driver_add_layer(d, &lh, nullptr), ZS_OK);
  EXPECT_EQ(m->units[e].uses_explicit, 2);
  EXPECT_EQ(m->units[h].uses_explicit, 1);
  zs_driver_destroy(d);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// Callbacks of the order test: count the calls; `fail` makes forward
// return an error without a message of its own.
struct OrderNet {
  int forwards = 0, backwards = 0;
  bool fail = false;
  bool nondeterministic = false;  // the output counts the calls
};
zs_status OrderForward(void* user, zs_model*, const zs_layer_io* io) {
  OrderNet* n = static_cast<OrderNet*>(user);
  n->forwards++;
  float* out = static_cast<float*>(io->output);
  for (int k = 0; k < 4; k++)
    out[k] = n->nondeterministic && k == 3 ? (float)n->forwards : 1.0f + k;
  return n->fail ? ZS_ERR_IO : ZS_OK;
}
zs_status OrderBackward(void* user, zs_model*, const zs_layer_io*) {
  static_cast<OrderNet*>(user)->backwards++;
  return ZS_OK;
}

// A context at `stage`, a model with one unit per name (one fp32 tensor of
// 8 elements each) and a driver with one OrderNet layer per unit (16-byte
// output and scratch), not finalized. The test destroys them.
struct OrderModel {
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  zs_driver* d = nullptr;
  std::vector<int> units;
  OrderNet net;
  zs_status Build(int stage, const std::vector<std::string>& names,
                  int checkpoint) {
    zs_config cfg = ZS_CONFIG_INIT;
    cfg.stage = stage;
    zs_status st = zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx);
    if (st == ZS_OK) st = zs_model_create(ctx, &m);
    const int64_t n = 8;
    for (size_t k = 0; k < names.size() && st == ZS_OK; k++) {
      int u = -1, t = -1;
      st = zs_model_add_unit(m, names[k].c_str(), &u);
      if (st == ZS_OK)
        st = zs_model_add_tensor(m, u, ("w" + names[k]).c_str(), 1, &n,
                                 ZS_FLOAT32, 0, &t);
      units.push_back(u);
    }
    if (st == ZS_OK) st = zs_driver_create(m, 16, checkpoint, &d);
    for (size_t k = 0; k < units.size() && st == ZS_OK; k++) {
      zs_layer_desc l = {units[k], OrderForward, OrderBackward, &net, 16, 16, 0};
      st = zs_driver_add_layer(d, &l, nullptr);
    }
    return st;
  }
};

// Out-of-order passes are refused on every rank alike, before anything
// runs: a backward without its forward (it would read another micro-batch's
// activations) or twice for one forward (it would add the gradients twice
// and raise the unit's use count); an eval-mode forward has no backward. A
// callback's error without a message says which layer returned what, not
// an older error's text, and does not grow on retries. A model destroyed
// before its driver (a misuse) leaves the driver refusing calls, not
// reading freed memory (ASan run).
TEST_F(OverlapTest, DriverRefusesOutOfOrderPassesAndNamesCallbackErrors) {
  for (int stage : {0, 3}) {
    OrderModel om;
    ASSERT_EQ(om.Build(stage, {"blk"}, 1), ZS_OK) << zs_last_error();
    zs_context* ctx = om.ctx;
    zs_model* m = om.m;
    zs_driver* d = om.d;
    OrderNet& net = om.net;
    EXPECT_EQ(zs_driver_forward(d), ZS_ERR_INVALID_STATE);
    EXPECT_NE(std::string(zs_last_error()).find(
                  "zs_driver_forward: call zs_model_finalize first"),
              std::string::npos) << zs_last_error();
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    auto refused = [&](const char* when) {
      EXPECT_EQ(zs_driver_backward(d), ZS_ERR_INVALID_STATE) << when;
      EXPECT_NE(std::string(zs_last_error()).find("no zs_driver_forward since "
                                                  "the last backward"),
                std::string::npos) << when << ": " << zs_last_error();
    };
    refused("before any forward");
    ASSERT_EQ(zs_driver_forward(d), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_driver_backward(d), ZS_OK) << zs_last_error();
    refused("a second backward");
    EXPECT_EQ(net.backwards, 1);
    ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_model_set_eval(m, 1), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_driver_forward(d), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_model_set_eval(m, 0), ZS_OK);
    refused("after an eval-mode forward");
    // a forward run again before its backward replaces the first: fine
    ASSERT_EQ(zs_driver_forward(d), ZS_OK);
    ASSERT_EQ(zs_driver_forward(d), ZS_OK);
    ASSERT_EQ(zs_driver_backward(d), ZS_OK);
    zs_step_info info{};
    ASSERT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
    EXPECT_EQ(info.applied, 1);
    // a callback error with no message, after an unrelated older error
    EXPECT_EQ(zs_model_set_lr(m, 9, 0.1), ZS_ERR_INVALID_ARGUMENT);
    net.fail = true;
    for (int retry = 0; retry < 2; retry++) {
      EXPECT_EQ(zs_driver_forward(d), ZS_ERR_IO);
      const std::string e = zs_last_error();
      EXPECT_NE(e.find("layer 0 (unit 'blk') forward returned"), std::string::npos) << e;
      EXPECT_EQ(e.find("zs_model_set_lr"), std::string::npos) << e;
      EXPECT_EQ(e.find("forward: layer"), std::string::npos) << "grew: " << e;
    }
    net.fail = false;
    refused("after a failed forward");
    // the failed pass must be dropped, not stepped (AdamW would still
    // decay the weights)
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE);
    EXPECT_NE(std::string(zs_last_error()).find("zs_driver_forward failed in "
                                                "this micro-batch"),
              std::string::npos) << zs_last_error();
    ASSERT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
    // the model destroyed first: the driver is detached, its calls refused
    zs_model_destroy(m);
    EXPECT_EQ(zs_driver_forward(d), ZS_ERR_INVALID_STATE);
    EXPECT_NE(std::string(zs_last_error()).find("the driver's model was destroyed"),
              std::string::npos) << zs_last_error();
    void* in = nullptr;
    EXPECT_EQ(zs_driver_input(d, &in), ZS_ERR_INVALID_STATE);
    zs_driver_destroy(d);
    zs_memory_stats stats{};
    ASSERT_EQ(zs_memory_stats_get(ctx, &stats), ZS_OK);
    EXPECT_EQ(stats.current[ZS_MEM_ACTIVATIONS], 0u)
        << "the driver's buffers were freed with its model";
    zs_context_destroy(ctx);
  }
}

// ZS_CHECKPOINT_VERIFY catches a forward that is not deterministic (its
// recompute differs from the first run): the backward fails on the rank
// that saw it, naming the layer and the byte, and REMOTE on the others
// (here every rank sees it); zs_step_discard then drops the step.
TEST_F(OverlapTest, CheckpointVerifyCatchesANonDeterministicForward) {
  OrderModel om;
  ASSERT_EQ(om.Build(3, {"a", "b"}, ZS_CHECKPOINT_VERIFY), ZS_OK) << zs_last_error();
  zs_context* ctx = om.ctx;
  zs_model* m = om.m;
  zs_driver* d = om.d;
  OrderNet& net = om.net;
  zs_driver* other = nullptr;
  EXPECT_EQ(zs_driver_create(m, 16, 3, &other), ZS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  ASSERT_EQ(zs_driver_forward(d), ZS_OK);
  ASSERT_EQ(zs_driver_backward(d), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK);
  net.nondeterministic = true;
  ASSERT_EQ(zs_driver_forward(d), ZS_OK);
  EXPECT_EQ(zs_driver_backward(d), ZS_ERR_MISMATCH);
  const std::string e = zs_last_error();
  // (the 4th float differs: bytes 12-15, the first differing one of them)
  EXPECT_NE(e.find("layer 0 (unit 'a'): the recomputed forward's output "
                   "differs from the first run's at byte 1"),
            std::string::npos) << e;
  EXPECT_NE(e.find(" of 16"), std::string::npos) << e;
  EXPECT_NE(e.find("deterministic"), std::string::npos) << e;
  // the layers before the failure left partial gradients: not steppable
  EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("zs_driver_backward failed"),
            std::string::npos) << zs_last_error();
  ASSERT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_driver_forward(d), ZS_OK);
  EXPECT_EQ(zs_driver_backward(d), ZS_ERR_MISMATCH);  // (still not deterministic)
  ASSERT_EQ(zs_step_discard(m, nullptr), ZS_OK);
  net.nondeterministic = false;
  ASSERT_EQ(zs_driver_forward(d), ZS_OK);
  ASSERT_EQ(zs_driver_backward(d), ZS_OK) << zs_last_error();
  zs_step_info info{};
  ASSERT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
  EXPECT_EQ(info.applied, 1);
  zs_driver_destroy(d);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// The driver at W ranks equals the driver at one rank (a single-process
// run of the same layers) within the foundation issue's tolerance.
TEST_F(OverlapTest, DriverMatchesSingleRank) {
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, rank_, 0, &self);
  DriverRun one = RunDriverNet(0, 0, self, 5);
  MPI_Comm_free(&self);
  DriverRun all = RunDriverNet(3, 1, MPI_COMM_WORLD, 5);
  ASSERT_EQ(one.status, ZS_OK) << one.error;
  ASSERT_EQ(all.status, ZS_OK) << all.error;
  for (size_t u = 0; u < one.params.size(); u++) {
    if (world_ == 1) {
      EXPECT_TRUE(Bitwise(all.params[u], one.params[u])) << "unit " << u;
    } else {
      EXPECT_TRUE(CloseByNorm(all.params[u], one.params[u], 1e-5)) << "unit " << u;
    }
  }
}

}  // namespace
