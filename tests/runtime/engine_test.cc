// engine_test.cc — the engine's contract beyond parity, run under mpirun at
// world sizes 1, 2, 3, 4 and 8: memory accounting equals the ZeRO paper's,
// collectives are counted (a unit used twice is reduced once), padding never
// leaks, cross-rank mismatches are errors on every rank (never hangs), API
// misuse names the unit, and nothing leaks.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zs_mpi.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_shm.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/alloc_faults.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class EngineTest : public ZsMpiTest {
 protected:
  // A context on MPI_COMM_WORLD; the test fails (on every rank) if not OK.
  zs_context* MakeContext(int stage, zs_optimizer_kind opt = ZS_OPTIM_ADAMW) {
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    c.optimizer.kind = opt;
    zs_context* ctx = nullptr;
    EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
        << zs_last_error();
    return ctx;
  }
  // A finalized model of one unit with one fp32 tensor "w" of n elements,
  // on a fresh context (uses > 0: zs_unit_set_grad_uses before finalize).
  struct OneUnit {
    zs_context* ctx = nullptr;
    zs_model* m = nullptr;
    int u = -1, t = -1;
  };
  OneUnit MakeOneUnit(int stage, const char* unit = "u", int64_t n = 4,
                      int uses = 0) {
    OneUnit o;
    o.ctx = MakeContext(stage);
    if (o.ctx == nullptr) return o;
    EXPECT_EQ(zs_model_create(o.ctx, &o.m), ZS_OK);
    EXPECT_EQ(zs_model_add_unit(o.m, unit, &o.u), ZS_OK);
    EXPECT_EQ(zs_model_add_tensor(o.m, o.u, "w", 1, &n, ZS_FLOAT32, 0, &o.t),
              ZS_OK);
    if (uses > 0) {
      EXPECT_EQ(zs_unit_set_grad_uses(o.m, o.u, uses), ZS_OK);
    }
    EXPECT_EQ(zs_model_finalize(o.m), ZS_OK) << zs_last_error();
    return o;
  }
  static void Destroy(OneUnit& o) {
    zs_model_destroy(o.m);
    zs_context_destroy(o.ctx);
  }
  // Bytes the context itself holds (its communication log, under "other"):
  // what is left when no model holds anything.
  // The communication log, and this rank's part of the shared-memory
  // segment when the context's host collectives use one.
  static size_t ContextBytes(zs_context* ctx) {
    return ZS__COMM_LOG_CAP * sizeof(zs__comm_log_entry) +
           (zs_context_config(ctx)->host_collectives == ZS_HOST_COLLECTIVES_SHM
                ? ZS__SHM_LANES * ZS__SHM_RANK_BYTES
                : 0);
  }
  static bool Contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  }
};

// ==== Memory accounting (the ZeRO paper's per-rank model states) ==========

// Ψ fp32 parameters with Adam: params 4Ψ (4Ψ/W at stage 3), grads 4Ψ
// (4Ψ/W at stages 2-3), Adam states 8Ψ (8Ψ/W at stages 1-3). Tensor sizes
// are multiples of 16 * 24 elements, so no world size in {1,2,3,4,8} pads:
// the bytes must equal the formula exactly.
// ZS_DEVICE_CUDA on a machine without a usable GPU: every rank gets a
// clear UNSUPPORTED naming CUDA, no crash (on a GPU machine it works).
// Built without the CUDA toolkit (ZS_TEST_NO_CUDA_PLUGIN), the test has no
// plugin linked in and the message names the missing plugin instead.
TEST_F(EngineTest, CudaDeviceWithoutAGpuIsAClearError) {
  zs_config c = ZS_CONFIG_INIT;
  c.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  zs_status st = zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx);
  if (st == ZS_OK) {
    zs_context_destroy(ctx);
    GTEST_SKIP() << "a CUDA device is usable here";
  }
  EXPECT_EQ(st, ZS_ERR_UNSUPPORTED) << zs_last_error();
#ifdef ZS_TEST_NO_CUDA_PLUGIN
  const char* want = "CUDA plugin libzeroshard_cuda.so was not found";
#else
  const char* want = "CUDA device";
#endif
  EXPECT_NE(std::string(zs_last_error()).find(want), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(ctx, nullptr);
}

TEST_F(EngineTest, ModelStateBytesEqualZeroFormula) {
  const std::vector<std::vector<int64_t>> shapes = {
      {24, 16}, {384}, {48, 32}, {16, 48}, {3, 128}};
  size_t psi = 0;
  for (auto& s : shapes) psi += (size_t)(s[0] * (s.size() > 1 ? s[1] : 1));
  const size_t W = (size_t)world_;
  for (int stage = 0; stage <= 3; stage++) {
    zs_context* ctx = MakeContext(stage);
    ASSERT_NE(ctx, nullptr);
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u0 = -1, u1 = -1, t = -1;
    ASSERT_EQ(zs_model_add_unit(m, "a", &u0), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "b", &u1), ZS_OK);
    for (size_t i = 0; i < shapes.size(); i++)
      ASSERT_EQ(zs_model_add_tensor(m, i < 2 ? u0 : u1,
                                    ("t" + std::to_string(i)).c_str(),
                                    (int)shapes[i].size(), shapes[i].data(),
                                    ZS_FLOAT32, 0, &t),
                ZS_OK);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
    zs_memory_stats st{};
    ASSERT_EQ(zs_memory_stats_get(ctx, &st), ZS_OK);
    const size_t params = stage == 3 ? 4 * psi / W : 4 * psi;
    const size_t grads = stage >= 2 ? 4 * psi / W : 4 * psi;
    const size_t adam = stage >= 1 ? 8 * psi / W : 8 * psi;
    EXPECT_EQ(st.current[ZS_MEM_PARAMS], params) << "stage " << stage;
    EXPECT_EQ(st.current[ZS_MEM_GRADS], grads) << "stage " << stage;
    EXPECT_EQ(st.current[ZS_MEM_OPTIMIZER_STATES], adam) << "stage " << stage;
    EXPECT_EQ(st.current[ZS_MEM_MASTER_WEIGHTS], 0u);
    EXPECT_EQ(st.model_state_bytes, params + grads + adam) << "stage " << stage;
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// With padding the bytes equal the formula up to the padding, computed here
// independently: each tensor starts at a multiple of 16 elements, each unit
// pads to a multiple of 16 * W.
TEST_F(EngineTest, ModelStateBytesWithPaddingAndTransientsAfterSteps) {
  const size_t W = (size_t)world_;
  for (int stage = 0; stage <= 3; stage++) {
    auto model = MakeTransformer();
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 3;
    TrainResult r = TrainSharded(*model, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    size_t psi = 0, padded_total = 0, trainable_padded = 0;
    for (const UnitSpec& u : model->units) {
      size_t cursor = 0;
      bool trainable = false;
      for (int t : u.tensors) {
        const TensorSpec& ts = model->tensors[t];
        if (ts.tie >= 0) continue;
        cursor = (cursor + 15) / 16 * 16 + ts.numel();
        psi += ts.numel();
        trainable |= !ts.frozen;
      }
      size_t padded = (cursor + 16 * W - 1) / (16 * W) * (16 * W);
      padded_total += padded;
      if (trainable) trainable_padded += padded;
    }
    const size_t params = 4 * (stage == 3 ? padded_total / W : padded_total);
    const size_t grads =
        4 * (stage >= 2 ? trainable_padded / W : trainable_padded);
    const size_t adam =
        8 * (stage >= 1 ? trainable_padded / W : trainable_padded);
    EXPECT_EQ(r.memory.current[ZS_MEM_PARAMS], params) << "stage " << stage;
    EXPECT_EQ(r.memory.current[ZS_MEM_GRADS], grads) << "stage " << stage;
    EXPECT_EQ(r.memory.current[ZS_MEM_OPTIMIZER_STATES], adam)
        << "stage " << stage;
    // ... and within the padding of the ZeRO formula on Ψ.
    const double f = stage == 3 ? 1.0 / W : 1.0;
    EXPECT_GE((double)r.memory.current[ZS_MEM_PARAMS], 4.0 * psi * f * 0.999);
    EXPECT_LE(r.memory.current[ZS_MEM_PARAMS],
              4 * (psi + model->units.size() * 16 * (model->tensors.size() + W)));
    // Transient buffers are gone after every step.
    EXPECT_EQ(r.memory.current[ZS_MEM_PARAMS_GATHERED], 0u);
    EXPECT_EQ(r.memory.current[ZS_MEM_COMM_BUFFERS], 0u);
    // The context's own bookkeeping (the communication log) is "other".
    EXPECT_EQ(r.memory.current[ZS_MEM_OTHER],
              r.memory_baseline.current[ZS_MEM_OTHER]);
    if (stage == 3) {
      EXPECT_GT(r.memory.peak[ZS_MEM_PARAMS_GATHERED], 0u);
    } else {
      EXPECT_EQ(r.memory.peak[ZS_MEM_PARAMS_GATHERED], 0u);
    }
    // Nothing leaks: the model's destroy returns every byte.
    EXPECT_EQ(r.memory_after_destroy.total_current,
              r.memory_baseline.total_current);
    EXPECT_EQ(r.memory_after_destroy.allocations, r.memory_baseline.allocations);
    // The total's peak is a peak of the sum: never above the sum of peaks.
    size_t sum_of_peaks = 0;
    for (int c = 0; c < ZS_MEM_CATEGORY_COUNT; c++) sum_of_peaks += r.memory.peak[c];
    EXPECT_LE(r.memory.total_peak, sum_of_peaks);
    EXPECT_GE(r.memory.total_peak, r.memory.model_state_bytes);
  }
}

// ==== Collectives: counted, one reduction per unit per step ===============

TEST_F(EngineTest, UnitUsedTwiceIsReducedOncePerStep) {
  for (int stage = 0; stage <= 3; stage++)
    for (int explicit_uses = 0; explicit_uses <= 1; explicit_uses++) {
      auto model = MakeTwiceUsed();
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 4;
      if (explicit_uses) cfg.uses = {2, 1};
      TrainResult r = TrainSharded(*model, cfg);
      ASSERT_EQ(r.status, ZS_OK) << r.error;
      for (int s = 0; s < cfg.steps; s++) {
        // Two trainable units: exactly two reduce-scatters, whatever the
        // stage, and one all-reduce (the step's consistency check).
        EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_REDUCE_SCATTER], 2u)
            << "stage " << stage << " step " << s;
        EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_ALL_REDUCE], 1u);
        // All-gathers: stage 0 gathers the reduced gradients (2), stages
        // 1-2 the updated parameters (2), stage 3 every use of a unit:
        // "sq" twice forward + twice backward, "out" once each way.
        uint64_t ag = stage == 3 ? 6u : 2u;
        EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_ALL_GATHER], ag)
            << "stage " << stage << " step " << s;
      }
      auto ref_model = MakeTwiceUsed();
      TrainResult ref = TrainReference(*ref_model, cfg);
      for (size_t t = 0; t < ref.params.size(); t++)
        EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], 1e-5))
            << "stage " << stage << " tensor " << t;
    }
}

// The tied LM head: stored once (the head unit holds only its norm), the
// embedding unit reduced once per step with both uses summed.
TEST_F(EngineTest, TiedTensorStoredOnceReducedOnce) {
  for (int stage = 0; stage <= 3; stage++) {
    auto model = MakeTransformer();
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 3;
    TrainResult r = TrainSharded(*model, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    // The tied tensor reads back as its owner, bitwise.
    EXPECT_TRUE(Bitwise(r.params[16], r.params[0]));
    for (int s = 0; s < cfg.steps; s++) {
      EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_REDUCE_SCATTER], 3u)
          << "stage " << stage << " step " << s;
      // Stage 3: forward gathers embed, block, head (+ embed by the tie);
      // backward head (+ embed), block, embed: 8 all-gathers.
      if (stage == 3) {
        EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_ALL_GATHER], 8u);
      }
    }
  }
}

// ==== Padding =============================================================

TEST_F(EngineTest, PaddingSentinelChangesNothing) {
  for (int stage = 0; stage <= 3; stage++) {
    TrainConfig cfg;
    cfg.stage = stage;
    auto m1 = MakeDegenerate();
    TrainResult plain = TrainSharded(*m1, cfg);
    cfg.sentinel = true;
    auto m2 = MakeDegenerate();
    TrainResult nan = TrainSharded(*m2, cfg);
    ASSERT_EQ(plain.status, ZS_OK) << plain.error;
    ASSERT_EQ(nan.status, ZS_OK) << nan.error;
    for (size_t t = 0; t < plain.params.size(); t++) {
      EXPECT_TRUE(Bitwise(nan.params[t], plain.params[t]))
          << "stage " << stage << " tensor " << t;
      EXPECT_TRUE(Bitwise(nan.state0[t], plain.state0[t]))
          << "stage " << stage << " tensor " << t;
      for (float v : nan.params[t]) EXPECT_FALSE(std::isnan(v));
    }
    for (size_t s = 0; s < plain.losses.size(); s++)
      EXPECT_EQ(nan.losses[s], plain.losses[s]);
  }
}

// ==== Use counts that change after the first step =========================

// "sq" is used once in step 0 (recorded: 1) and twice from step 1: its
// reduction starts at the first release, the second use re-opens it, and
// the count is raised to 2 for the next steps.
TEST_F(EngineTest, MoreUsesThanRecordedReopensAndStaysExact) {
  for (int stage = 0; stage <= 3; stage++) {
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 5;
    auto model = MakeGrowingUse();
    TrainResult r = TrainSharded(*model, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    EXPECT_EQ(r.step_counters[0].calls[ZS_COLL_REDUCE_SCATTER], 2u);
    EXPECT_EQ(r.step_counters[1].calls[ZS_COLL_REDUCE_SCATTER], 3u);
    for (int s = 2; s < cfg.steps; s++)
      EXPECT_EQ(r.step_counters[s].calls[ZS_COLL_REDUCE_SCATTER], 2u);
    auto ref_model = MakeGrowingUse();
    TrainResult ref = TrainReference(*ref_model, cfg);
    for (size_t t = 0; t < ref.params.size(); t++) {
      EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], 1e-5))
          << "stage " << stage << " tensor " << t;
      // One rank: sum1 + sum2 in the re-open path is the reference's
      // accumulation order, so even this path is bitwise.
      if (world_ == 1) {
        EXPECT_TRUE(Bitwise(r.params[t], ref.params[t]));
      }
    }
  }
}

// ==== Sub-communicators ===================================================

TEST_F(EngineTest, ContextOnSubCommunicator) {
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank_ % 2, rank_, &half);
  int sub = 0;
  MPI_Comm_size(half, &sub);
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.comm = half;
  cfg.steps = 5;
  auto model = MakeMlp();
  TrainResult r = TrainSharded(*model, cfg);
  EXPECT_EQ(r.status, ZS_OK) << r.error;
  auto ref_model = MakeMlp();
  TrainResult ref = TrainReference(*ref_model, cfg);
  for (size_t t = 0; t < ref.params.size() && r.status == ZS_OK; t++)
    EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], 1e-5));
  MPI_Comm_free(&half);
}

// ==== Cross-rank mismatches: errors on every rank, never a hang ===========

TEST_F(EngineTest, DifferentShapeOnOneRankFailsEveryRankBeforeData) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  zs_context* ctx = MakeContext(3);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  ASSERT_EQ(zs_model_add_unit(m, "block", &u), ZS_OK);
  int64_t a[2] = {4, 5}, b[2] = {4, rank_ == world_ - 1 ? 6 : 5};
  ASSERT_EQ(zs_model_add_tensor(m, u, "w0", 2, a, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w1", 2, b, ZS_FLOAT32, 0, &t), ZS_OK);
  zs_comm_counters before{}, after{};
  zs_comm_counters_get(ctx, &before);
  zs_status st = zs_model_finalize(m);
  zs_comm_counters_get(ctx, &after);
  EXPECT_EQ(st, ZS_ERR_MISMATCH);
  std::string msg = zs_last_error();
  EXPECT_TRUE(Contains(msg, "w1")) << msg;
  EXPECT_TRUE(Contains(msg, "rank " + std::to_string(world_ - 1))) << msg;
  EXPECT_TRUE(Contains(msg, "[4,6]") && Contains(msg, "[4,5]")) << msg;
  // Only the metadata check ran: no reduce-scatter, one all-gather of
  // hashes, two broadcasts of descriptions.
  EXPECT_EQ(after.calls[ZS_COLL_REDUCE_SCATTER] - before.calls[ZS_COLL_REDUCE_SCATTER], 0u);
  EXPECT_EQ(after.calls[ZS_COLL_ALL_GATHER] - before.calls[ZS_COLL_ALL_GATHER], 1u);
  EXPECT_EQ(after.calls[ZS_COLL_BROADCAST] - before.calls[ZS_COLL_BROADCAST], 2u);
  zs_memory_stats ms{};
  zs_memory_stats_get(ctx, &ms);
  EXPECT_EQ(ms.total_current, ContextBytes(ctx)) << "no storage after a failed finalize";
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

TEST_F(EngineTest, DifferentStageOnOneRankFailsEveryRank) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  zs_config c = ZS_CONFIG_INIT;
  c.stage = rank_ == 1 ? 2 : 3;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_ERR_MISMATCH);
  std::string msg = zs_last_error();
  EXPECT_TRUE(Contains(msg, "config.stage=2") && Contains(msg, "config.stage=3"))
      << msg;
  EXPECT_TRUE(Contains(msg, "rank 1")) << msg;
  EXPECT_EQ(ctx, nullptr);
}

TEST_F(EngineTest, InvalidConfigOnOneRankFailsEveryRank) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  zs_config c = ZS_CONFIG_INIT;
  if (rank_ == world_ - 1) c.optimizer.lr = -1;
  zs_context* ctx = nullptr;
  zs_status st = zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx);
  EXPECT_NE(st, ZS_OK);
  EXPECT_TRUE(Contains(zs_last_error(), "optimizer.lr")) << zs_last_error();
  EXPECT_EQ(ctx, nullptr);
}

TEST_F(EngineTest, RegistrationErrorOnOneRankFailsFinalizeEverywhere) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  zs_context* ctx = MakeContext(1);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  int64_t shape[1] = {rank_ == 0 ? -3 : 3};
  zs_status add = zs_model_add_tensor(m, u, "x", 1, shape, ZS_FLOAT32, 0, &t);
  EXPECT_EQ(add, rank_ == 0 ? ZS_ERR_INVALID_ARGUMENT : ZS_OK);
  EXPECT_NE(zs_model_finalize(m), ZS_OK);
  EXPECT_TRUE(Contains(zs_last_error(), "registration failed")) << zs_last_error();
  EXPECT_TRUE(Contains(zs_last_error(), "negative")) << zs_last_error();
  // later calls say finalize failed, not that it was never called
  EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_INVALID_STATE);
  EXPECT_TRUE(Contains(zs_last_error(), "zs_model_finalize failed on this model"))
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// Ranks that use a unit a different number of times would schedule their
// reductions differently from the next step on: zs_step says so on every
// rank instead of letting a later collective hang.
TEST_F(EngineTest, DifferentUseCountsAreAnErrorNotAHang) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  OneUnit o = MakeOneUnit(2, "u", 10);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  const int u = o.u;
  int uses = rank_ == 0 ? 2 : 1;
  for (int k = 0; k < uses; k++) {
    EXPECT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_grad_release(m, u), ZS_OK);
  }
  EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_MISMATCH);
  EXPECT_TRUE(Contains(zs_last_error(), "gradient use counts")) << zs_last_error();
  Destroy(o);
}

// ==== API misuse names the unit ============================================

TEST_F(EngineTest, MisuseReturnsErrorsNamingTheUnit) {
  for (int stage = 0; stage <= 3; stage++) {
    zs_context* ctx = MakeContext(stage);
    ASSERT_NE(ctx, nullptr);
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u = -1, t = -1, f = -1;
    int64_t n = 5;
    ASSERT_EQ(zs_model_add_unit(m, "attn.3", &u), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u, "frozen", 1, &n, ZS_FLOAT32,
                                  ZS_TENSOR_FROZEN, &f), ZS_OK);
    void* p = nullptr;
    // Before finalize.
    EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_INVALID_STATE);
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_STATE);
    int u2 = -1;
    EXPECT_EQ(zs_model_add_unit(m, "late", &u2), ZS_ERR_INVALID_STATE);
    // Parameters.
    EXPECT_EQ(zs_tensor_data(m, t, &p), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3")) << zs_last_error();
    EXPECT_EQ(zs_unit_release(m, u), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3")) << zs_last_error();
    EXPECT_EQ(zs_unit_gather(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3")) << zs_last_error();
    EXPECT_EQ(zs_tensor_data(m, t, &p), ZS_OK);
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3") &&
                Contains(zs_last_error(), "gathered")) << zs_last_error();
    // Gradients.
    EXPECT_EQ(zs_tensor_grad(m, t, &p), ZS_ERR_INVALID_STATE);
    EXPECT_EQ(zs_unit_grad_release(m, u), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3")) << zs_last_error();
    EXPECT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_grad_acquire(m, u), ZS_ERR_INVALID_STATE);
    EXPECT_EQ(zs_tensor_grad(m, f, &p), ZS_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(zs_last_error(), "frozen")) << zs_last_error();
    ASSERT_EQ(zs_tensor_grad(m, t, &p), ZS_OK);
    for (int i = 0; i < 5; i++) static_cast<float*>(p)[i] = 1.0f;
    EXPECT_EQ(zs_unit_release(m, u), ZS_OK);
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(Contains(zs_last_error(), "attn.3") &&
                Contains(zs_last_error(), "acquired")) << zs_last_error();
    // Fixing the misuse makes the same step succeed: nothing was lost.
    EXPECT_EQ(zs_unit_grad_release(m, u), ZS_OK);
    zs_step_info info{};
    EXPECT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
    EXPECT_EQ(info.applied, 1);
    EXPECT_EQ(info.step, 1);
    std::vector<float> g(5);
    EXPECT_EQ(zs_tensor_get(m, t, ZS_FIELD_GRAD, g.data()), ZS_OK);
    for (float v : g) EXPECT_EQ(v, 1.0f);  // mean over ranks of 1
    EXPECT_EQ(zs_tensor_get(m, t, ZS_FIELD_MOMENTUM, g.data()),
              ZS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(zs_tensor_get(m, f, ZS_FIELD_EXP_AVG, g.data()),
              ZS_ERR_INVALID_ARGUMENT);
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// ==== Initialization and export ===========================================

zs_status FailOnSecond(void*, int tensor, const zs_tensor_desc* d,
                       void* data) {
  if (tensor == 1) return ZS_ERR_IO;  // e.g. a weights file went missing
  for (size_t i = 0; i < d->numel; i++) static_cast<float*>(data)[i] = 1.0f;
  return ZS_OK;
}

TEST_F(EngineTest, InitCallbackFailureOnRankZeroReachesEveryRank) {
  zs_context* ctx = MakeContext(3);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  int64_t n = 7;
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "first", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "second", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  zs_status st = zs_model_init(m, FailOnSecond, nullptr);
  EXPECT_EQ(st, rank_ == 0 ? ZS_ERR_IO : ZS_ERR_REMOTE);
  EXPECT_TRUE(Contains(zs_last_error(), "second")) << zs_last_error();
  zs_memory_stats ms{};
  zs_memory_stats_get(ctx, &ms);
  EXPECT_EQ(ms.current[ZS_MEM_OTHER], ZS__COMM_LOG_CAP * sizeof(zs__comm_log_entry)) << "the init buffer is freed";
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// zs_tensor_set from rank 0 and zs_tensor_get on every rank round-trip at
// every stage, for odd sizes, and a tied tensor reads its owner.
TEST_F(EngineTest, TensorSetAndGetRoundTrip) {
  for (int stage = 0; stage <= 3; stage++) {
    zs_context* ctx = MakeContext(stage);
    ASSERT_NE(ctx, nullptr);
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u0 = -1, u1 = -1, a = -1, b = -1, tie = -1;
    int64_t sa[2] = {3, 11}, sb[1] = {5};
    ASSERT_EQ(zs_model_add_unit(m, "u0", &u0), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "u1", &u1), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u0, "a", 2, sa, ZS_FLOAT32, 0, &a), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u1, "b", 1, sb, ZS_FLOAT32, 0, &b), ZS_OK);
    ASSERT_EQ(zs_model_add_tied_tensor(m, u1, "a_tied", a, &tie), ZS_OK);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    std::vector<float> va(33), vb(5);
    for (size_t i = 0; i < va.size(); i++) va[i] = 0.5f * (float)i - 3.0f;
    for (size_t i = 0; i < vb.size(); i++) vb[i] = -1.0f * (float)i;
    // Only rank 0's array counts: the others pass garbage or NULL.
    std::vector<float> junk(33, 99.0f);
    EXPECT_EQ(zs_tensor_set(m, a, rank_ == 0 ? va.data() : junk.data()), ZS_OK);
    EXPECT_EQ(zs_tensor_set(m, b, rank_ == 0 ? vb.data() : nullptr), ZS_OK);
    std::vector<float> ga(33), gb(5), gt(33);
    EXPECT_EQ(zs_tensor_get(m, a, ZS_FIELD_PARAM, ga.data()), ZS_OK);
    EXPECT_EQ(zs_tensor_get(m, b, ZS_FIELD_PARAM, gb.data()), ZS_OK);
    EXPECT_EQ(zs_tensor_get(m, tie, ZS_FIELD_PARAM, gt.data()), ZS_OK);
    EXPECT_TRUE(Bitwise(ga, va)) << "stage " << stage;
    EXPECT_TRUE(Bitwise(gb, vb)) << "stage " << stage;
    EXPECT_TRUE(Bitwise(gt, va)) << "stage " << stage;
    // Gathered views agree with what was set, through the tie too.
    ASSERT_EQ(zs_unit_gather(m, u1), ZS_OK);
    void* p = nullptr;
    ASSERT_EQ(zs_tensor_data(m, tie, &p), ZS_OK);
    EXPECT_EQ(std::memcmp(p, va.data(), 33 * sizeof(float)), 0);
    // Setting while gathered is refused (the gathered copy would go stale).
    EXPECT_EQ(zs_tensor_set(m, a, va.data()), ZS_ERR_INVALID_STATE);
    ASSERT_EQ(zs_unit_release(m, u1), ZS_OK);
    // NULL on rank 0 is an error on every rank.
    zs_status st = zs_tensor_set(m, a, nullptr);
    EXPECT_EQ(st, rank_ == 0 ? ZS_ERR_INVALID_ARGUMENT : ZS_ERR_REMOTE);
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

TEST_F(EngineTest, UserRegisteredActivationsAreCounted) {
  zs_context* ctx = MakeContext(0);
  ASSERT_NE(ctx, nullptr);
  std::vector<float> act(1000);
  zs_memory_stats before{}, during{}, after{};
  zs_memory_stats_get(ctx, &before);
  EXPECT_EQ(zs_memory_register(ctx, ZS_MEM_ACTIVATIONS, act.data(), 4000), ZS_OK);
  EXPECT_EQ(zs_memory_register(ctx, ZS_MEM_ACTIVATIONS, act.data(), 4000),
            ZS_ERR_INVALID_ARGUMENT);
  zs_memory_stats_get(ctx, &during);
  EXPECT_EQ(during.current[ZS_MEM_ACTIVATIONS] - before.current[ZS_MEM_ACTIVATIONS], 4000u);
  EXPECT_EQ(zs_memory_unregister(ctx, act.data()), ZS_OK);
  EXPECT_EQ(zs_memory_unregister(ctx, act.data()), ZS_ERR_INVALID_ARGUMENT);
  zs_memory_stats_get(ctx, &after);
  EXPECT_EQ(after.current[ZS_MEM_ACTIVATIONS], before.current[ZS_MEM_ACTIVATIONS]);
  EXPECT_EQ(after.peak[ZS_MEM_ACTIVATIONS], 4000u);
  zs_memory_reset_peak(ctx);
  zs_memory_stats_get(ctx, &after);
  EXPECT_EQ(after.peak[ZS_MEM_ACTIVATIONS], 0u);
  // the host backend caches nothing (CUDA's: tests/gpu/engine_cuda_test)
  size_t released = 1;
  EXPECT_EQ(zs_memory_release_cached(ctx, &released), ZS_OK);
  EXPECT_EQ(released, 0u);
  EXPECT_EQ(zs_memory_release_cached(nullptr, nullptr), ZS_ERR_INVALID_ARGUMENT);
  zs_context_destroy(ctx);
}

// ==== Collectives that pair up wrongly are caught ==========================

// Two units of the same size used in a rank-dependent order: every
// collective completes (the sizes match), so only the unit tags in the
// sequence hash can tell; zs_step fails on every rank before the optimizer.
TEST_F(EngineTest, SameSizedUnitsInDifferentOrderAreAMismatch) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  for (int stage : {0, 3}) {
    zs_context* ctx = MakeContext(stage);
    ASSERT_NE(ctx, nullptr);
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u[2], t[2];
    int64_t n = 8;
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(zs_model_add_unit(m, k ? "b" : "a", &u[k]), ZS_OK);
      ASSERT_EQ(zs_model_add_tensor(m, u[k], k ? "wb" : "wa", 1, &n, ZS_FLOAT32,
                                    0, &t[k]), ZS_OK);
      ASSERT_EQ(zs_unit_set_grad_uses(m, u[k], 1), ZS_OK);
    }
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    std::vector<float> before(8), after(8);
    ASSERT_EQ(zs_tensor_get(m, t[0], ZS_FIELD_PARAM, before.data()), ZS_OK);
    const int order[2] = {rank_ == 0 ? 0 : 1, rank_ == 0 ? 1 : 0};
    for (int k : order) {
      EXPECT_EQ(zs_unit_gather(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_grad_acquire(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_grad_release(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_release(m, u[k]), ZS_OK);
    }
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_MISMATCH) << "stage " << stage;
    EXPECT_TRUE(Contains(zs_last_error(), "collective sequences")) << zs_last_error();
    EXPECT_TRUE(Contains(zs_last_error(), "zs_step_discard")) << zs_last_error();
    ASSERT_EQ(zs_tensor_get(m, t[0], ZS_FIELD_PARAM, after.data()), ZS_OK);
    EXPECT_TRUE(Bitwise(after, before)) << "no update was applied";
    // The reductions paired a with b: a retry must not apply those sums.
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE) << "stage " << stage;
    EXPECT_TRUE(Contains(zs_last_error(), "drop them with zs_step_discard"))
        << zs_last_error();
    // ... and, refused before its work began, leaves the caller's step
    // info as it was (as 0.1 did)
    zs_step_info kept{};
    kept.struct_size = sizeof kept;
    kept.step = 77;
    kept.loss_scale = 3.0;
    kept.grad_norm = 9.0;
    kept.micro_batch = 5;
    kept.applied = 1;
    EXPECT_EQ(zs_step(m, &kept), ZS_ERR_INVALID_STATE);
    EXPECT_TRUE(kept.step == 77 && kept.loss_scale == 3.0 &&
                kept.grad_norm == 9.0 && kept.micro_batch == 5 &&
                kept.applied == 1)
        << "step " << kept.step << " scale " << kept.loss_scale;
    ASSERT_EQ(zs_tensor_get(m, t[0], ZS_FIELD_PARAM, after.data()), ZS_OK);
    EXPECT_TRUE(Bitwise(after, before)) << "no update was applied on retry";
    // Dropped, the micro-batch redone in one order: training goes on.
    EXPECT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
    for (int k = 0; k < 2; k++) {
      EXPECT_EQ(zs_unit_gather(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_grad_acquire(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_grad_release(m, u[k]), ZS_OK);
      EXPECT_EQ(zs_unit_release(m, u[k]), ZS_OK);
    }
    zs_step_info info{};
    EXPECT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
    EXPECT_EQ(info.applied, 1);
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// Misuse on one rank only: zs_step fails on every rank (naming the rank and
// the unit) instead of leaving the others waiting, and once fixed the same
// step succeeds everywhere.
TEST_F(EngineTest, MisuseOnOneRankFailsEveryRankAndCanBeFixed) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  OneUnit o = MakeOneUnit(0, "blk.7", 4);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  const int u = o.u, t = o.t;
  EXPECT_EQ(zs_unit_gather(m, u), ZS_OK);
  if (rank_ != world_ - 1) {
    EXPECT_EQ(zs_unit_release(m, u), ZS_OK);
  }
  zs_status st = zs_step(m, nullptr);
  EXPECT_EQ(st, rank_ == world_ - 1 ? ZS_ERR_INVALID_STATE : ZS_ERR_REMOTE);
  EXPECT_TRUE(Contains(zs_last_error(), "blk.7")) << zs_last_error();
  if (rank_ != world_ - 1) {
    EXPECT_TRUE(Contains(zs_last_error(), "rank " + std::to_string(world_ - 1)))
        << zs_last_error();
  }
  if (rank_ == world_ - 1) {
    EXPECT_EQ(zs_unit_release(m, u), ZS_OK);
  }
  EXPECT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  // zs_tensor_get with a bad argument on one rank: an error everywhere.
  std::vector<float> out(4);
  st = zs_tensor_get(m, t, ZS_FIELD_PARAM, rank_ == 0 ? nullptr : out.data());
  EXPECT_EQ(st, rank_ == 0 ? ZS_ERR_INVALID_ARGUMENT : ZS_ERR_REMOTE);
  Destroy(o);
}

// A rank that skips zs_step leaves the others in a collective nobody joins:
// after collective_timeout_s they get ZS_ERR_TIMEOUT naming the collective,
// not a silent hang, and the rank that timed out tells the others.
TEST_F(EngineTest, CollectiveNobodyJoinsTimesOutWithAClearError) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  zs_config c = ZS_CONFIG_INIT;
  c.collective_timeout_s = 1.0;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  int64_t n = 4;
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  if (rank_ == 1) {
    double t0 = MPI_Wtime();
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_TIMEOUT);
    EXPECT_LT(MPI_Wtime() - t0, 30.0);
    EXPECT_TRUE(Contains(zs_last_error(), "all_reduce") &&
                Contains(zs_last_error(), "within 1 s")) << zs_last_error();
    // the device, and the memory this rank holds by category at that moment
    EXPECT_TRUE(Contains(zs_last_error(), "on the host device") &&
                Contains(zs_last_error(), "held now: params 128, grads 128, "
                         "optimizer_states 256,")) << zs_last_error();
  }
  // Rank 1's timeout told rank 0, whose step now fails at once with
  // REMOTE naming rank 1 and its timeout (its own timeout would say
  // TIMEOUT), whether or not its first all-reduce completes against rank
  // 1's abandoned one.
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) {
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_REMOTE) << zs_last_error();
    EXPECT_TRUE(Contains(zs_last_error(), "rank 1 failed and will not join") &&
                Contains(zs_last_error(), "did not complete within 1 s"))
        << zs_last_error();
  }
  // Both contexts are unusable now, and say why.
  EXPECT_NE(zs_step(m, nullptr), ZS_OK);
  EXPECT_TRUE(Contains(zs_last_error(), "cannot be used any more"))
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// One rank out of memory where the others go on alone (its unit's stage-3
// all-gather buffer; its gradient buffer in the backward): the others do
// not wait collective_timeout_s in collectives it will never join, they fail
// at once naming it and its error (with the memory it holds by category),
// and every rank can still destroy everything.

TEST_F(EngineTest, OutOfMemoryOnOneRankFailsTheOthersAtOnce) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  // where 2: every rank fails; the notices each sent but nobody took stay
  // unmatched, and "after", the next context must still be made and train
  // (with notices per context, freed at destroy, its MPI_Comm_dup hung: MPI
  // reuses communicator ids) and must not take them for its own
  for (int where = 0; where < 4; where++) {
    SCOPED_TRACE(where == 0 ? "stage-3 all-gather" : where == 1 ?
                 "gradient buffer" : where == 2 ? "every rank" : "after");
    const bool all_bad = where == 2;
    const int bad = all_bad ? rank_ : where == 3 ? -1 : world_ - 1;
    zs_config c = ZS_CONFIG_INIT;
    c.stage = where == 1 ? 2 : 3;
    c.collective_timeout_s = 30; /* broken, this test fails in a minute */
    zs_context* ctx = nullptr;
    ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u[2], t[2];
    int64_t n = 40;
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(zs_model_add_unit(m, k ? "b" : "a", &u[k]), ZS_OK);
      ASSERT_EQ(zs_model_add_tensor(m, u[k], k ? "wb" : "wa", 1, &n,
                                    ZS_FLOAT32, 0, &t[k]), ZS_OK);
    }
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    if (rank_ == bad) zs__dev_alloc_fault = where == 1 ? FailGradsOfB
                                                       : FailGatherOfB;
    // after: the others wait (and listen for notices) while rank 0 sleeps
    if (where == 3 && rank_ == 0) usleep(200 * 1000);
    const double t0 = MPI_Wtime();
    const zs_status st = GatherGradReleaseStep(m, u, 2);
    const std::string err = zs_last_error();
    zs__dev_alloc_fault = nullptr;
    EXPECT_LT(MPI_Wtime() - t0, 15.0) << "not at collective_timeout_s";
    if (where == 3) {
      EXPECT_EQ(st, ZS_OK) << err;
      zs_model_destroy(m);
      zs_context_destroy(ctx);
      continue;
    }
    if (rank_ == bad) {
      EXPECT_EQ(st, ZS_ERR_OUT_OF_MEMORY) << err;
      EXPECT_TRUE(Contains(err, "test: no memory for 'b'") &&
                  Contains(err, "they were told")) << err;
    } else {
      EXPECT_EQ(st, ZS_ERR_REMOTE) << err;
      EXPECT_TRUE(Contains(err, "rank " + std::to_string(bad) +
                                    " failed and will not join it") &&
                  Contains(err, "test: no memory for 'b'") &&
                  Contains(err, "held now:")) << err;
    }
    // No rank can go on, and each says why.
    EXPECT_NE(zs_step(m, nullptr), ZS_OK);
    EXPECT_TRUE(Contains(zs_last_error(), "cannot be used any more"))
        << zs_last_error();
    zs_model_destroy(m);
    zs_context_destroy(ctx);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// The same out-of-memory with one rank: nothing to tell, and the model
// stays usable (the caller may free memory and retry).
TEST_F(EngineTest, OutOfMemoryAtOneRankWorldLeavesTheModelUsable) {
  if (world_ != 1) GTEST_SKIP() << "one rank";
  OneUnit o = MakeOneUnit(3, "b", 40);
  ASSERT_NE(o.m, nullptr);
  zs__dev_alloc_fault = FailGatherOfB;
  EXPECT_EQ(zs_unit_gather(o.m, o.u), ZS_ERR_OUT_OF_MEMORY);
  EXPECT_FALSE(Contains(zs_last_error(), "they were told")) << zs_last_error();
  zs__dev_alloc_fault = nullptr;
  EXPECT_EQ(zs_unit_gather(o.m, o.u), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_release(o.m, o.u), ZS_OK);
  Destroy(o);
}

TEST_F(EngineTest, DifferentLearningRatesAreAMismatch) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  OneUnit o = MakeOneUnit(1, "u", 4);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  EXPECT_EQ(zs_model_set_lr(m, ZS_ALL_GROUPS, rank_ == 0 ? 0.1 : 0.2), ZS_OK);
  EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_MISMATCH);
  EXPECT_TRUE(Contains(zs_last_error(), "learning rates")) << zs_last_error();
  // The gradients are right: with the same rates the step goes on.
  EXPECT_EQ(zs_model_set_lr(m, ZS_ALL_GROUPS, 0.1), ZS_OK);
  EXPECT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  Destroy(o);
}

// ==== Registration and lifetime edge cases ================================

TEST_F(EngineTest, GradUsesAreRegistrationTimeOnly) {
  OneUnit o = MakeOneUnit(2, "u", 4, 2);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  const int u = o.u, t = o.t;
  EXPECT_EQ(zs_unit_set_grad_uses(m, u, 1), ZS_ERR_INVALID_STATE);
  EXPECT_EQ(zs_model_add_tied_tensor(m, u, "x", t, nullptr), ZS_ERR_INVALID_STATE);
  // the declared count stays, and reads back (the estimator's grad_uses)
  EXPECT_EQ(zs_unit_grad_uses(m, u), 2);
  EXPECT_EQ(zs_unit_grad_uses(m, u + 1), -1);
  EXPECT_EQ(zs_unit_grad_uses(nullptr, u), -1);
  Destroy(o);
  // undeclared: unknown until a step records it (one use here)
  OneUnit r = MakeOneUnit(2, "r", 4, 0);
  ASSERT_NE(r.m, nullptr);
  EXPECT_EQ(zs_unit_grad_uses(r.m, r.u), 0);
  ASSERT_EQ(zs_unit_gather(r.m, r.u), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_unit_grad_acquire(r.m, r.u), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_unit_grad_release(r.m, r.u), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_unit_release(r.m, r.u), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_step(r.m, nullptr), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_grad_uses(r.m, r.u), 1);
  Destroy(r);
}

// A unit whose byte size overflows, or whose shard exceeds what one MPI call
// can move, is refused at finalize (not a tiny buffer or a late failure);
// retrying finalize fails the same way without corrupting anything.
TEST_F(EngineTest, OversizedUnitsAreRefusedAtFinalizeRepeatably) {
  zs_context* ctx = MakeContext(3);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int a = -1, b = -1, c = -1, t = -1, big = -1;
  int64_t s1[2] = {1LL << 30, (1LL << 31) - 1}, s2[1] = {(1LL << 31) + 16};
  int64_t s3[1] = {5};
  ASSERT_EQ(zs_model_add_unit(m, "a", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "huge", &b), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "c", &c), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, a, "small", 1, s3, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, b, "h1", 2, s1, ZS_FLOAT32, 0, &big), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, b, "h2", 2, s1, ZS_FLOAT32, 0, &big), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, b, "h3", 1, s2, ZS_FLOAT32, 0, &big), ZS_OK);
  int tie = -1;
  ASSERT_EQ(zs_model_add_tied_tensor(m, c, "small_tied", t, &tie), ZS_OK);
  ASSERT_EQ(zs_model_add_tied_tensor(m, c, "h3_tied", big, &tie), ZS_OK);
  for (int attempt = 0; attempt < 3; attempt++) {
    EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(zs_last_error(), "huge") &&
                Contains(zs_last_error(), "overflow")) << zs_last_error();
  }
  zs_memory_stats ms{};
  zs_memory_stats_get(ctx, &ms);
  EXPECT_EQ(ms.total_current, ContextBytes(ctx));
  zs_model_destroy(m);
  // No overflow, but a shard beyond MPI's int counts at this world size
  // (refused before anything is allocated).
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int64_t s4[1] = {(int64_t)world_ * ((1LL << 31) + 64)};
  ASSERT_EQ(zs_model_add_unit(m, "wide", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, a, "w", 1, s4, ZS_FLOAT32, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_finalize(m), ZS_ERR_UNSUPPORTED);
  EXPECT_TRUE(Contains(zs_last_error(), "wide") &&
              Contains(zs_last_error(), "smaller units")) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

TEST_F(EngineTest, ContextDestroyedBeforeModelIsSafe) {
  OneUnit o = MakeOneUnit(3, "u", 4);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  const int u = o.u;
  zs_context_destroy(o.ctx);
  EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_INVALID_STATE);
  EXPECT_TRUE(Contains(zs_last_error(), "context was destroyed")) << zs_last_error();
  zs_model_destroy(m);
}

// The same error on every rank is that error, not a mismatch between ranks.
TEST_F(EngineTest, SameErrorOnEveryRankIsNotAMismatch) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 5;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(zs_last_error(), "config.stage")) << zs_last_error();
  ctx = MakeContext(0);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1;
  ASSERT_EQ(zs_model_add_unit(m, "dup", &u), ZS_OK);
  EXPECT_EQ(zs_model_add_unit(m, "dup", &u), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(zs_last_error(), "already registered")) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

TEST_F(EngineTest, WeightDecayDefaultFollowsTheOptimizer) {
  for (zs_optimizer_kind k : {ZS_OPTIM_ADAMW, ZS_OPTIM_ADAM, ZS_OPTIM_SGD}) {
    zs_context* ctx = MakeContext(0, k);
    ASSERT_NE(ctx, nullptr);
    EXPECT_EQ(zs_context_config(ctx)->optimizer.weight_decay,
              k == ZS_OPTIM_ADAMW ? 0.01 : 0.0);
    zs_context_destroy(ctx);
  }
}

TEST_F(EngineTest, RuntimeMemoryCannotBeUnregisteredByTheUser) {
  OneUnit o = MakeOneUnit(0, "u", 64);
  ASSERT_NE(o.m, nullptr);
  zs_model* m = o.m;
  const int u = o.u, t = o.t;
  ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
  void* p = nullptr;
  ASSERT_EQ(zs_tensor_data(m, t, &p), ZS_OK);
  EXPECT_EQ(zs_memory_unregister(o.ctx, p), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_unit_release(m, u), ZS_OK);
  zs_model_destroy(m);
  zs_memory_stats ms{};
  zs_memory_stats_get(o.ctx, &ms);
  EXPECT_EQ(ms.total_current, ContextBytes(o.ctx));
  zs_context_destroy(o.ctx);
}

}  // namespace
