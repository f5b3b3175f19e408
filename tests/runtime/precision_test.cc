// precision_test.cc — mixed precision (16-bit parameters with fp32 master
// weights), loss scaling, global-norm clipping and gradient accumulation,
// at world sizes 1, 2, 3, 4 and 8, stages 0-3 (docs/precision.md).
//
// Tolerances. Accumulation over K micro-batches averages K means of
// B/(W*K) samples where the reference averages one mean of B: different
// rounding, so the foundation issue's per-tensor bound 1e-5 applies. Norms
// are sums of squares in double: the runtime's (rank-ordered partial sums)
// and an independent recomputation from the reduced gradients agree to
// 1e-9 relative. With 16-bit parameters, at W = 1 the sharded run does the
// emulated reference's arithmetic exactly (bitwise); at W > 1 a master
// weight that differs in its last fp32 bit can round to a neighbouring
// bf16 value (2^-8 relative), so 2e-2 relative per tensor is allowed.
// At a fixed world size every stage is bitwise equal to every other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include <zs_mpi.h>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class PrecisionTest : public ZsMpiTest {};

constexpr double kRel = 1e-5;

void ExpectStagesBitwise(const std::vector<TrainResult>& runs,
                         const Model& m) {
  for (size_t s = 1; s < runs.size(); s++)
    for (size_t t = 0; t < m.tensors.size(); t++)
      EXPECT_TRUE(Bitwise(runs[s].params[t], runs[0].params[t]))
          << "stage " << s << " vs stage 0, tensor '" << m.tensors[t].name
          << "'";
}

// 1. K = 4 micro-batches (reduced each, or accumulated locally) equal one
// 4x batch.
TEST_F(PrecisionTest, AccumulationEqualsTheLargerBatch) {
  TrainConfig cfg;
  cfg.steps = 8;
  cfg.global_batch = 48;  // 48 / (W * 4) samples per micro-batch, W <= 4
  if (48 % (world_ * 4) != 0) GTEST_SKIP() << "48 not divisible by 4W";
  auto ref_model = MakeTransformer();
  TrainResult ref = TrainReference(*ref_model, cfg);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  cfg.grad_accum = 4;
  for (int local = 0; local <= 1; local++) {
    cfg.grad_accum_local = local;
    std::vector<TrainResult> runs;
    for (int stage = 0; stage <= 3; stage++) {
      cfg.stage = stage;
      auto model = MakeTransformer();
      runs.push_back(TrainSharded(*model, cfg));
      ASSERT_EQ(runs.back().status, ZS_OK) << runs.back().error;
      for (const zs_step_info& i : runs.back().infos) {
        EXPECT_EQ(i.applied, 1);
        EXPECT_EQ(i.micro_batch, 0);
      }
      for (size_t t = 0; t < ref_model->tensors.size(); t++)
        EXPECT_TRUE(CloseByNorm(runs.back().params[t], ref.params[t], kRel))
            << "local " << local << " stage " << stage << " tensor '"
            << ref_model->tensors[t].name << "'";
      // Reduce-each issues K times the reduce-scatters of local
      // accumulation (the tied-embedding model: 3 units).
      const zs_comm_counters& c = runs.back().step_counters.back();
      const int units = (int)ref_model->units.size();
      EXPECT_EQ(c.calls[ZS_COLL_REDUCE_SCATTER], (uint64_t)(local ? units : 4 * units))
          << "local " << local << " stage " << stage;
    }
    ExpectStagesBitwise(runs, *ref_model);
  }
}

// 2. The clip norm equals the norm recomputed independently from the
// reduced gradients, with clipping active; clipped training matches the
// clipped reference.
TEST_F(PrecisionTest, ClipNormIsTheGlobalNormAndClippingMatchesReference) {
  TrainConfig cfg;
  cfg.steps = 10;
  cfg.max_grad_norm = 0.05;
  auto ref_model = MakeTransformer();
  TrainResult ref = TrainReference(*ref_model, cfg);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  int clipped = 0;
  for (double n : ref.norms) clipped += n > cfg.max_grad_norm;
  ASSERT_GE(clipped, 8) << "clipping must be active in most steps";
  std::vector<TrainResult> runs;
  for (int stage = 0; stage <= 3; stage++) {
    cfg.stage = stage;
    auto model = MakeTransformer();
    runs.push_back(TrainSharded(*model, cfg));
    const TrainResult& r = runs.back();
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    ASSERT_EQ(r.norms.size(), r.infos.size());
    for (size_t s = 0; s < r.infos.size(); s++) {
      EXPECT_NEAR(r.infos[s].grad_norm, r.norms[s], 1e-9 * r.norms[s])
          << "stage " << stage << " step " << s;
      EXPECT_NEAR(r.infos[s].grad_norm, ref.norms[s], 1e-4 * ref.norms[s])
          << "stage " << stage << " step " << s;
    }
    for (size_t t = 0; t < ref_model->tensors.size(); t++)
      EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], kRel))
          << "stage " << stage << " tensor '" << ref_model->tensors[t].name
          << "'";
  }
  ExpectStagesBitwise(runs, *ref_model);
}

// 5. Zero-element tensors, one-element tensors and shards that are all
// padding (W = 8) add 0 to the norm and never make it NaN, even with NaN
// written into every padding element.
TEST_F(PrecisionTest, EmptyTensorsAndPaddingShardsAddNothingToTheNorm) {
  TrainConfig cfg;
  cfg.steps = 4;
  cfg.max_grad_norm = 1e-3;
  cfg.sentinel = true;
  auto ref_model = MakeDegenerate();
  TrainResult ref = TrainReference(*ref_model, cfg);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  for (int stage = 0; stage <= 3; stage++) {
    cfg.stage = stage;
    auto model = MakeDegenerate();
    TrainResult r = TrainSharded(*model, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    for (size_t s = 0; s < r.infos.size(); s++) {
      ASSERT_TRUE(std::isfinite(r.infos[s].grad_norm)) << "stage " << stage;
      EXPECT_NEAR(r.infos[s].grad_norm, r.norms[s], 1e-9 * r.norms[s]);
      EXPECT_NEAR(r.infos[s].grad_norm, ref.norms[s], 1e-4 * ref.norms[s]);
    }
    for (size_t t = 0; t < ref_model->tensors.size(); t++)
      EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], kRel))
          << "stage " << stage << " tensor '" << ref_model->tensors[t].name
          << "'";
  }
}

// bf16 parameters, fp32 gradients: fp32 master weights in the optimizer
// shard; equal to the emulated reference (bitwise at W = 1), stages equal.
TEST_F(PrecisionTest, Bf16MasterWeightsMatchTheEmulatedReference) {
  TrainConfig cfg;
  cfg.steps = 10;
  cfg.param_dtype = ZS_BFLOAT16;
  cfg.reduce_dtype = ZS_FLOAT32;
  auto ref_model = MakeTransformer();
  TrainResult ref = TrainReference(*ref_model, cfg);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  std::vector<TrainResult> runs;
  for (int stage = 0; stage <= 3; stage++) {
    cfg.stage = stage;
    auto model = MakeTransformer();
    runs.push_back(TrainSharded(*model, cfg));
    const TrainResult& r = runs.back();
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    for (size_t t = 0; t < ref_model->tensors.size(); t++) {
      if (world_ == 1)
        EXPECT_TRUE(Bitwise(r.params[t], ref.params[t]))
            << "stage " << stage << " tensor '" << ref_model->tensors[t].name
            << "'";
      else
        EXPECT_TRUE(CloseByNorm(r.params[t], ref.params[t], 2e-2))
            << "stage " << stage << " tensor '" << ref_model->tensors[t].name
            << "'";
    }
    // ZeRO's 2 + 2 + K bytes: 16-bit parameters and gradients... here fp32
    // gradients (reduce_dtype); the master copy is 4 bytes per element of
    // the optimizer span, twice the 16-bit parameter shard at stage 3.
    const zs_memory_stats& ms = r.memory;
    EXPECT_GT(ms.current[ZS_MEM_MASTER_WEIGHTS], 0u) << "stage " << stage;
    if (stage == 3) {
      EXPECT_EQ(ms.current[ZS_MEM_MASTER_WEIGHTS], 2 * ms.current[ZS_MEM_PARAMS]);
    }
    EXPECT_EQ(ms.current[ZS_MEM_OPTIMIZER_STATES],
              2 * ms.current[ZS_MEM_MASTER_WEIGHTS])
        << "stage " << stage;
    EXPECT_LT(r.losses.back(), r.losses.front()) << "stage " << stage;
  }
  ExpectStagesBitwise(runs, *ref_model);
}

// fp16 parameters and fp16 gradients reduced in fp16 (summed in fp32 in
// rank order, rounded once) with dynamic loss scaling: stages equal, and
// training tracks the fp32 reference.
TEST_F(PrecisionTest, Fp16GradientsWithDynamicLossScaling) {
  TrainConfig cfg;
  cfg.steps = 10;
  cfg.param_dtype = ZS_FLOAT16;
  cfg.loss_scaler = ZS_LOSS_SCALE_DYNAMIC;
  cfg.init_scale = 1024;
  auto ref_model = MakeMlp();
  TrainConfig fp32 = cfg;
  fp32.param_dtype = ZS_FLOAT32;
  TrainResult ref = TrainReference(*ref_model, fp32);
  ASSERT_EQ(ref.status, ZS_OK) << ref.error;
  std::vector<TrainResult> runs;
  for (int stage = 0; stage <= 3; stage++) {
    cfg.stage = stage;
    auto model = MakeMlp();
    runs.push_back(TrainSharded(*model, cfg));
    const TrainResult& r = runs.back();
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    for (const zs_step_info& i : r.infos) {
      EXPECT_EQ(i.applied, 1);
      EXPECT_EQ(i.loss_scale, 1024.0);
      EXPECT_TRUE(std::isfinite(i.grad_norm));
    }
    EXPECT_NEAR(r.losses.back(), ref.losses.back(),
                0.05 * std::fabs(ref.losses.back()))
        << "stage " << stage;
  }
  ExpectStagesBitwise(runs, *ref_model);
}

// ---- Small models through the per-step API ---------------------------------

// A context and a finalized model of one unit "u" whose tensors all have
// one dtype; destroyed with the object.
struct OneUnit {
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int unit = -1;
  std::vector<int> t;        // tensor ids
  std::vector<int64_t> n;    // their element counts
  ~OneUnit() {
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
  zs_status Build(const zs_config& c, zs_dtype d,
                  const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    zs_status st = zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx);
    if (st == ZS_OK) st = zs_model_create(ctx, &m);
    if (st == ZS_OK) st = zs_model_add_unit(m, "u", &unit);
    for (size_t k = 0; k < tensors.size() && st == ZS_OK; k++) {
      const auto& shape = tensors[k].second;
      int id = -1;
      st = zs_model_add_tensor(m, unit, tensors[k].first.c_str(), (int)shape.size(),
                               shape.data(), d, 0, &id);
      int64_t numel = 1;
      for (int64_t x : shape) numel *= x;
      t.push_back(id);
      n.push_back(numel);
    }
    if (st == ZS_OK) st = zs_model_finalize(m);
    return st;
  }
  // One step whose gradient of tensor k, element i, is value(k, i)
  // (rounded to the gradient dtype).
  zs_status Step(const std::function<float(size_t, int64_t)>& value,
                 zs_step_info* info) {
    zs_status st = zs_unit_gather(m, unit);
    if (st == ZS_OK) st = zs_unit_grad_acquire(m, unit);
    for (size_t k = 0; k < t.size() && st == ZS_OK; k++) {
      void* g = nullptr;
      st = zs_tensor_grad(m, t[k], &g);
      const zs_dtype gd = zs_tensor_field_dtype(m, t[k], ZS_FIELD_GRAD);
      for (int64_t i = 0; st == ZS_OK && i < n[k]; i++) {
        const float v = value(k, i);
        zs_convert((char*)g + i * zs_dtype_size(gd), gd, &v, ZS_FLOAT32, 1);
      }
    }
    if (st == ZS_OK) st = zs_unit_grad_release(m, unit);
    if (st == ZS_OK) st = zs_unit_release(m, unit);
    if (st == ZS_OK) st = zs_step(m, info);
    return st;
  }
};

// ---- Overflow: inf on one rank only -----------------------------------------

// A direct model: one unit of two odd-sized tensors whose gradient is a
// fixed function of (step, rank) times the loss scale; rank `inf_rank`
// writes +inf into one element at step `inf_step`.
struct OverflowRun {
  std::vector<zs_step_info> infos;
  std::vector<std::vector<uint64_t>> calls;  // per step, per collective op
  std::vector<std::vector<float>> before_inf, after_inf;  // p, m, v per tensor
  zs_status status = ZS_OK;
  std::string error;
  std::vector<zs_status> step_status;
};

OverflowRun RunOverflow(int stage, int inf_step, int inf_rank, int steps,
                        zs_loss_scaler_config ls, zs_dtype dtype,
                        int inf_count = 1) {
  OverflowRun out;
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zs_config c = ZS_CONFIG_INIT;
  c.stage = stage;
  c.loss_scaler = ls;
  c.clip_grad_norm = 1;
  c.max_grad_norm = 1e6;
  OneUnit u;
  zs_status st = u.Build(c, dtype, {{"a", {37}}, {"b", {11}}});
  zs_model* m = u.m;
  const std::vector<int>& t = u.t;
  const std::vector<int64_t>& n = u.n;
  auto snapshot = [&](std::vector<std::vector<float>>& dst) {
    dst.clear();
    for (int k = 0; k < 2 && st == ZS_OK; k++)
      for (zs_field f : {ZS_FIELD_PARAM, ZS_FIELD_EXP_AVG, ZS_FIELD_EXP_AVG_SQ}) {
        std::vector<float> v((size_t)n[k]);
        if (dtype != ZS_FLOAT32 && f == ZS_FIELD_PARAM) {
          std::vector<uint16_t> h((size_t)n[k]);
          st = zs_tensor_get(m, t[k], f, h.data());
          zs_convert(v.data(), ZS_FLOAT32, h.data(), dtype, h.size());
        } else {
          st = zs_tensor_get(m, t[k], f, v.data());
        }
        dst.push_back(v);
      }
  };
  for (int s = 0; s < steps && st == ZS_OK; s++) {
    zs_comm_counters before{}, after{};
    zs_comm_counters_get(u.ctx, &before);
    if (s == inf_step) snapshot(out.before_inf);
    const float scale = (float)zs_model_loss_scale(m);
    zs_step_info info{};
    st = u.Step(
        [&](size_t k, int64_t i) {
          if (s >= inf_step && s < inf_step + inf_count && rank == inf_rank &&
              k == 1 && i == 3)
            return std::numeric_limits<float>::infinity();
          return HashUniform(77, s * 16 + rank, k * 100 + i) * scale;
        },
        &info);
    out.step_status.push_back(st);
    if (st != ZS_OK) break;
    out.infos.push_back(info);
    if (s == inf_step) snapshot(out.after_inf);
    zs_comm_counters_get(u.ctx, &after);
    std::vector<uint64_t> calls(ZS_COLL_OP_COUNT);
    for (int k = 0; k < ZS_COLL_OP_COUNT; k++)
      calls[k] = after.calls[k] - before.calls[k];
    out.calls.push_back(calls);
  }
  if (st != ZS_OK) {
    out.status = st;
    out.error = zs_last_error();
  }
  return out;
}

zs_loss_scaler_config Dynamic(double init) {
  zs_config c = ZS_CONFIG_INIT;
  zs_loss_scaler_config ls = c.loss_scaler;
  ls.mode = ZS_LOSS_SCALE_DYNAMIC;
  ls.init_scale = init;
  ls.growth_interval = 3;
  return ls;
}

// 3. inf on one rank's gradient only: every rank skips the step with
// parameters, moments and step count bitwise unchanged, the scale backs
// off, the collectives are the same on every rank, later steps apply.
TEST_F(PrecisionTest, InfOnOneRankSkipsTheStepOnEveryRank) {
  for (zs_dtype dtype : {ZS_FLOAT32, ZS_FLOAT16}) {
    for (int stage = 0; stage <= 3; stage++) {
      const std::string where = std::string(zs_dtype_name(dtype)) + " stage " +
                                std::to_string(stage);
      OverflowRun r = RunOverflow(stage, 2, world_ - 1, 6, Dynamic(256), dtype);
      ASSERT_EQ(r.status, ZS_OK) << where << ": " << r.error;
      ASSERT_EQ(r.infos.size(), 6u);
      for (int s = 0; s < 6; s++) {
        EXPECT_EQ(r.infos[s].overflow, s == 2) << where << " step " << s;
        EXPECT_EQ(r.infos[s].applied, s != 2) << where << " step " << s;
      }
      EXPECT_EQ(r.infos[1].step, 2);
      EXPECT_EQ(r.infos[2].step, 2);  // the skipped step counts nothing
      EXPECT_EQ(r.infos[3].step, 3);
      // 256, 256 after 2 clean steps, backoff 0.5 -> 128, then growth
      // after 3 clean steps -> 256.
      EXPECT_EQ(r.infos[1].loss_scale, 256.0) << where;
      EXPECT_EQ(r.infos[2].loss_scale, 128.0) << where;
      EXPECT_EQ(r.infos[4].loss_scale, 128.0) << where;
      EXPECT_EQ(r.infos[5].loss_scale, 256.0) << where;
      EXPECT_FALSE(std::isfinite(r.infos[2].grad_norm)) << where;
      ASSERT_EQ(r.before_inf.size(), r.after_inf.size());
      for (size_t k = 0; k < r.before_inf.size(); k++)
        EXPECT_TRUE(Bitwise(r.after_inf[k], r.before_inf[k]))
            << where << " field " << k;
      // The same collectives on every rank, every step.
      for (size_t s = 0; s < r.calls.size(); s++) {
        std::vector<uint64_t> all(r.calls[s].size() * world_);
        MPI_Allgather(r.calls[s].data(), (int)r.calls[s].size(), MPI_UINT64_T,
                      all.data(), (int)r.calls[s].size(), MPI_UINT64_T,
                      MPI_COMM_WORLD);
        for (int q = 1; q < world_; q++)
          for (size_t k = 0; k < r.calls[s].size(); k++)
            EXPECT_EQ(all[q * r.calls[s].size() + k], all[k])
                << where << " step " << s << " op " << k << " rank " << q;
      }
    }
  }
}

// Hysteresis 2: the first overflow is tolerated (scale kept), the second
// backs off.
TEST_F(PrecisionTest, HysteresisDelaysTheBackoff) {
  zs_loss_scaler_config ls = Dynamic(64);
  ls.hysteresis = 2;
  ls.growth_interval = 100;
  OverflowRun r = RunOverflow(3, 1, 0, 4, ls, ZS_FLOAT32, 2);
  ASSERT_EQ(r.status, ZS_OK) << r.error;
  ASSERT_EQ(r.infos.size(), 4u);
  EXPECT_EQ(r.infos[1].overflow, 1);
  EXPECT_EQ(r.infos[1].loss_scale, 64.0);  // tolerated
  EXPECT_EQ(r.infos[2].overflow, 1);
  EXPECT_EQ(r.infos[2].loss_scale, 32.0);  // backed off
  EXPECT_EQ(r.infos[3].applied, 1);
  EXPECT_EQ(r.infos[3].step, 2);
}

// The dynamic scale stays an fp32 number: from 2^100, a growth by 2^30
// after every clean step would reach 2^130, past fp32 (an fp32 loss times
// it is inf, and every other step would be skipped); it stays at 2^100.
TEST_F(PrecisionTest, DynamicScaleNeverGrowsPastFp32) {
  zs_loss_scaler_config ls = Dynamic(std::ldexp(1.0, 100));
  ls.growth_interval = 1;
  ls.growth_factor = std::ldexp(1.0, 30);
  OverflowRun r = RunOverflow(1, -1, 0, 3, ls, ZS_FLOAT32);
  ASSERT_EQ(r.status, ZS_OK) << r.error;
  ASSERT_EQ(r.infos.size(), 3u);
  for (int s = 0; s < 3; s++) {
    EXPECT_EQ(r.infos[s].applied, 1) << "step " << s;
    EXPECT_EQ(r.infos[s].loss_scale, std::ldexp(1.0, 100)) << "step " << s;
  }
}

// Bad input: an overflow at the minimum scale is divergence, on every rank
// at the same step; without a loss scaler an inf gradient is divergence
// too (nothing applied).
TEST_F(PrecisionTest, OverflowAtTheMinimumScaleIsDivergence) {
  zs_loss_scaler_config ls = Dynamic(1);
  ls.min_scale = 1;
  OverflowRun r = RunOverflow(2, 1, world_ - 1, 3, ls, ZS_FLOAT32);
  EXPECT_EQ(r.status, ZS_ERR_DIVERGED);
  EXPECT_NE(r.error.find("diverged"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("min_scale"), std::string::npos) << r.error;
  EXPECT_EQ(r.step_status.size(), 2u);
  zs_loss_scaler_config none = ls;
  none.mode = ZS_LOSS_SCALE_NONE;
  OverflowRun q = RunOverflow(1, 0, 0, 2, none, ZS_FLOAT32);
  EXPECT_EQ(q.status, ZS_ERR_DIVERGED);
  EXPECT_NE(q.error.find("inf/NaN"), std::string::npos) << q.error;
  EXPECT_EQ(q.step_status.size(), 1u);
}

// 2 (second half). fp16 gradients whose norm is about 300: the squares
// (90000 > fp16's 65504) are summed in double, so the norm is exact.
TEST_F(PrecisionTest, Fp16NormOfThreeHundredDoesNotOverflow) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  c.clip_grad_norm = 1;
  c.max_grad_norm = 1e9;
  OneUnit u;  // 10000 elements of 3.0: norm 3 * 100 = 300
  ASSERT_EQ(u.Build(c, ZS_FLOAT16, {{"w", {10000}}}), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_tensor_field_dtype(u.m, u.t[0], ZS_FIELD_GRAD), ZS_FLOAT16);
  zs_step_info info{};
  ASSERT_EQ(u.Step([](size_t, int64_t) { return 3.0f; }, &info), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(info.grad_norm, 300.0);
  EXPECT_EQ(info.applied, 1);
}

// ZeRO's 2 + 2 + 12 bytes per parameter for 16-bit parameters and
// gradients with AdamW (fp32 master + two fp32 moments), per stage: what
// each rank holds is exactly the paper's formula (Rajbhandari et al.,
// section 3), padded per unit.
TEST_F(PrecisionTest, SixteenBitMemoryFollowsTheZeroFormula) {
  for (zs_dtype dtype : {ZS_BFLOAT16, ZS_FLOAT16}) {
    for (int stage = 0; stage <= 3; stage++) {
      zs_config c = ZS_CONFIG_INIT;
      c.stage = stage;
      OneUnit u;
      ASSERT_EQ(u.Build(c, dtype, {{"w", {37, 29}}}), ZS_OK) << zs_last_error();
      zs_model* m = u.m;
      const int t = u.t[0];
      size_t P = 0, S = 0;
      ASSERT_EQ(zs_unit_layout(m, u.unit, nullptr, &P, &S), ZS_OK);
      zs_memory_stats ms{};
      zs_memory_stats_get(u.ctx, &ms);
      const size_t params = stage == 3 ? 2 * S : 2 * P;
      const size_t grads = stage >= 2 ? 2 * S : 2 * P;
      const size_t span = stage == 0 ? P : S;
      const std::string where = std::string(zs_dtype_name(dtype)) + " stage " +
                                std::to_string(stage);
      EXPECT_EQ(ms.current[ZS_MEM_PARAMS], params) << where;
      EXPECT_EQ(ms.current[ZS_MEM_GRADS], grads) << where;
      EXPECT_EQ(ms.current[ZS_MEM_MASTER_WEIGHTS], 4 * span) << where;
      EXPECT_EQ(ms.current[ZS_MEM_OPTIMIZER_STATES], 8 * span) << where;
      EXPECT_EQ(zs_tensor_field_dtype(m, t, ZS_FIELD_PARAM), dtype);
      EXPECT_EQ(zs_tensor_field_dtype(m, t, ZS_FIELD_GRAD), dtype);
      EXPECT_EQ(zs_tensor_field_dtype(m, t, ZS_FIELD_MASTER), ZS_FLOAT32);
    }
  }
}

// zs_tensor_set of one tensor refreshes the master weights of the elements
// it wrote only: the other tensors of the unit keep their fp32 masters.
TEST_F(PrecisionTest, TensorSetKeepsTheOtherTensorsMasters) {
  for (int stage = 0; stage <= 3; stage++) {
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    c.optimizer.lr = 1e-4;
    OneUnit u;
    ASSERT_EQ(u.Build(c, ZS_BFLOAT16, {{"a", {13}}, {"b", {11}}}), ZS_OK)
        << zs_last_error();
    zs_model* m = u.m;
    const int a = u.t[0], b = u.t[1];
    const int64_t na = u.n[0], nb = u.n[1];
    for (int s = 0; s < 3; s++)
      ASSERT_EQ(u.Step([&](size_t k, int64_t i) {
                  return HashUniform(5, s, u.t[k] * 100 + i);
                }, nullptr),
                ZS_OK) << zs_last_error();
    std::vector<float> before((size_t)nb), after((size_t)nb), pa((size_t)na);
    std::vector<uint16_t> ha((size_t)na);
    ASSERT_EQ(zs_tensor_get(m, b, ZS_FIELD_MASTER, before.data()), ZS_OK);
    ASSERT_EQ(zs_tensor_get(m, a, ZS_FIELD_PARAM, ha.data()), ZS_OK);
    ASSERT_EQ(zs_tensor_set(m, a, ha.data()), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_tensor_get(m, b, ZS_FIELD_MASTER, after.data()), ZS_OK);
    EXPECT_TRUE(Bitwise(after, before)) << "stage " << stage;
    // ... and a's masters are now its (16-bit) values.
    ASSERT_EQ(zs_tensor_get(m, a, ZS_FIELD_MASTER, pa.data()), ZS_OK);
    std::vector<float> wa((size_t)na);
    zs_convert(wa.data(), ZS_FLOAT32, ha.data(), ZS_BFLOAT16, ha.size());
    EXPECT_TRUE(Bitwise(pa, wa)) << "stage " << stage;
    // Sanity: the masters carried more than bf16 precision.
    int finer = 0;
    for (float x : before) {
      uint16_t h;
      float r;
      zs_convert(&h, ZS_BFLOAT16, &x, ZS_FLOAT32, 1);
      zs_convert(&r, ZS_FLOAT32, &h, ZS_BFLOAT16, 1);
      finer += r != x;
    }
    EXPECT_GT(finer, 0);
  }
}

// A 16-bit gradient mean is rounded once: the rank-ordered fp32 sum divided
// by ranks * K, then stored (not the rounded sum divided and rounded again).
TEST_F(PrecisionTest, SixteenBitMeanIsRoundedOnce) {
  for (int stage : {0, 2}) {
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    OneUnit u;
    ASSERT_EQ(u.Build(c, ZS_BFLOAT16, {{"w", {53}}}), ZS_OK) << zs_last_error();
    const int t = u.t[0];
    const int64_t n = u.n[0];
    auto value = [](int r, int64_t i) {  // exactly representable in bf16
      float v = HashUniform(9, r, i);
      uint16_t h;
      zs_convert(&h, ZS_BFLOAT16, &v, ZS_FLOAT32, 1);
      zs_convert(&v, ZS_FLOAT32, &h, ZS_BFLOAT16, 1);
      return v;
    };
    ASSERT_EQ(u.Step([&](size_t, int64_t i) { return value(rank_, i); }, nullptr),
              ZS_OK) << zs_last_error();
    std::vector<uint16_t> got((size_t)n);
    ASSERT_EQ(zs_tensor_get(u.m, t, ZS_FIELD_GRAD, got.data()), ZS_OK);
    for (int64_t i = 0; i < n; i++) {
      float sum = value(0, i);
      for (int r = 1; r < world_; r++) sum += value(r, i);
      float mean = sum / (float)world_;
      uint16_t want;
      zs_convert(&want, ZS_BFLOAT16, &mean, ZS_FLOAT32, 1);
      EXPECT_EQ(got[i], want) << "stage " << stage << " element " << i;
    }
  }
}

// Bad input: gradients in a 16-bit type need the fixed reduce order.
TEST_F(PrecisionTest, UnsupportedDtypeCombinationNamesTheUnit) {
  zs_config c = ZS_CONFIG_INIT;
  c.reduce_order = ZS_REDUCE_BACKEND;
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int unit = -1, t = -1;
  const int64_t n = 8;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "half", &unit), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, unit, "w", 1, &n, ZS_BFLOAT16, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_finalize(m), ZS_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(zs_last_error()).find("'half'"), std::string::npos)
      << zs_last_error();
  EXPECT_NE(std::string(zs_last_error()).find("reduce_dtype"), std::string::npos)
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  // A non-float dtype is not a parameter type.
  c = ZS_CONFIG_INIT;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "u", &unit), ZS_OK);
  EXPECT_EQ(zs_model_add_tensor(m, unit, "ids", 1, &n, ZS_INT64, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("ids"), std::string::npos);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

}  // namespace
