// discard_test.cc — zs_step_discard after the ranks did different things in
// a micro-batch (run under mpirun at world sizes 1, 2, 3 and 4):
//
//   moe:  a mixture-of-experts model whose ranks route to different
//         experts; each rank gathers, acquires and releases only the
//         experts it used, so zs_step finds a mismatch on every rank;
//   stop: rank 1's pass fails part-way (after expert A's forward, still
//         holding A); it calls zs_step_discard at once, and the others
//         find out from the ZeroShard call they are in (an all-gather
//         rank 1 never issues at stage 3, zs_step's check otherwise) and
//         discard too.
//
// Every rank then discards, redoes the micro-batch the documented way
// (every rank gathers, acquires and releases every expert; unused ones
// contribute zero gradients) and trains on. The result must equal a run
// without the fault and a rank-order reference (each rank's gradient in
// plain C, summed in rank order and divided once, then the public AdamW)
// bitwise, at stages 0-3, with declared and with recorded use counts, the
// fault in the first step (when the use counts are still being recorded)
// and in a later one; and the discard must leave the parameters, optimizer
// states, step count, use counts and prefetch trace as they were before
// the micro-batch.
//
// Built twice: here on the host backend, and in tests/fakecuda with
// ZS_TEST_CUDA on the CUDA backend's stand-in through NCCL's (device
// memory the host cannot touch: the passes work on host mirrors), so the
// reconciliation also lines up NCCL's lane and the host collectives beside
// it.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zs_mpi.h>

#include <cstring>
#include <string>
#include <vector>

#ifdef ZS_TEST_CUDA
#include <cuda_runtime.h>

#include "tests/gpu/gpu_available.h"
#endif

#include "runtime/engine/engine.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

#ifdef ZS_TEST_CUDA
constexpr zs_device_kind kDevice = ZS_DEVICE_CUDA;
void Copy(void* dst, const void* src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) ADD_FAILURE() << "cudaMemcpy: " << cudaGetErrorString(e);
}
#else
constexpr zs_device_kind kDevice = ZS_DEVICE_HOST;
void Copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
#endif

class DiscardTest : public ZsMpiTest {
 protected:
  void SetUp() override {
    ZsMpiTest::SetUp();
#ifdef ZS_TEST_CUDA
    const std::string why = zstest::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << why;
#endif
  }
};

constexpr int kD = 5;  // input features
constexpr int kH = 3;  // expert outputs (an expert holds kH*kD + kH = 18)
constexpr int kSteps = 5;
constexpr double kLr = 1e-2;
constexpr double kWd = 0.01;
constexpr int kStopper = 1;  // the rank whose pass fails (scenario stop)

// Tensors: 0 A.w (kH, kD), 1 A.b (kH), 2 B.w, 3 B.b, 4 head.v (kH),
// 5 head.c (1). Units: 0 expert.a, 1 expert.b, 2 head.
const int64_t kNumel[6] = {kH * kD, kH, kH * kD, kH, kH, 1};

float X(int s, int j, int k) { return HashUniform(101, (uint64_t)s * 1000 + j, k); }
float Y(int s, int j) { return HashUniform(202, (uint64_t)s * 1000 + j, 0); }
// Sample j goes to expert A iff it is in rank 0's slice: rank 0 uses A
// only, every other rank B only.
int Route(int j, int world) { return j < kGlobalBatch / world ? 0 : 1; }

// One rank's slice of a step and its activations.
struct Slice {
  int s = 0, b0 = 0, nb = 0, world = 1;
  std::vector<float> h, dh;  // (nb, kH)
};

// The pass in pieces, each used alike by the reference (plain arrays) and
// the sharded run (pointers from zs_tensor_data / zs_tensor_grad), so both
// do the same float operations in the same order.
void ExpertForward(int e, const float* w, const float* b, Slice& sl) {
  for (int i = 0; i < sl.nb; i++) {
    if (Route(sl.b0 + i, sl.world) != e) continue;
    for (int k = 0; k < kH; k++) {
      float acc = b[k];
      for (int d = 0; d < kD; d++) acc += w[k * kD + d] * X(sl.s, sl.b0 + i, d);
      sl.h[(size_t)i * kH + k] = acc;
    }
  }
}

float HeadForwardBackward(const float* v, const float* c, float* dv, float* dc,
                          Slice& sl) {
  float loss = 0.f;
  for (int i = 0; i < sl.nb; i++) {
    float out = c[0];
    for (int k = 0; k < kH; k++) out += v[k] * sl.h[(size_t)i * kH + k];
    const float err = out - Y(sl.s, sl.b0 + i);
    loss += 0.5f * err * err / (float)sl.nb;
    const float dout = err / (float)sl.nb;
    for (int k = 0; k < kH; k++) {
      dv[k] += dout * sl.h[(size_t)i * kH + k];
      sl.dh[(size_t)i * kH + k] = dout * v[k];
    }
    dc[0] += dout;
  }
  return loss;
}

void ExpertBackward(int e, float* dw, float* db, const Slice& sl) {
  for (int i = 0; i < sl.nb; i++) {
    if (Route(sl.b0 + i, sl.world) != e) continue;
    for (int k = 0; k < kH; k++) {
      const float g = sl.dh[(size_t)i * kH + k];
      for (int d = 0; d < kD; d++) dw[k * kD + d] += g * X(sl.s, sl.b0 + i, d);
      db[k] += g;
    }
  }
}

Slice MakeSlice(int s, int rank, int world) {
  Slice sl;
  sl.s = s;
  sl.world = world;
  sl.nb = kGlobalBatch / world;
  sl.b0 = rank * sl.nb;
  sl.h.assign((size_t)sl.nb * kH, 0.f);
  sl.dh.assign((size_t)sl.nb * kH, 0.f);
  return sl;
}

float Init(int t, int i) { return 0.3f * HashUniform(11, t, i); }

struct Result {
  std::vector<std::vector<float>> params, m1, m2;
};

// The rank-order reference of `world` ranks: each rank's gradient (of its
// slice's mean loss) computed as the sharded run computes it, summed over
// ranks in rank order and divided once by the world size (the engine's
// fixed-order reduce-scatter), then AdamW per tensor.
Result RankOrderReference(int world, int steps) {
  Result r;
  r.params.resize(6);
  r.m1.resize(6);
  r.m2.resize(6);
  for (int t = 0; t < 6; t++) {
    for (int i = 0; i < kNumel[t]; i++) r.params[t].push_back(Init(t, i));
    r.m1[t].assign((size_t)kNumel[t], 0.f);
    r.m2[t].assign((size_t)kNumel[t], 0.f);
  }
  for (int s = 0; s < steps; s++) {
    std::vector<std::vector<float>> sum(6);
    for (int rank = 0; rank < world; rank++) {
      std::vector<std::vector<float>> g(6);
      for (int t = 0; t < 6; t++) g[t].assign((size_t)kNumel[t], 0.f);
      Slice sl = MakeSlice(s, rank, world);
      const std::vector<std::vector<float>>& p = r.params;
      ExpertForward(0, p[0].data(), p[1].data(), sl);
      ExpertForward(1, p[2].data(), p[3].data(), sl);
      HeadForwardBackward(p[4].data(), p[5].data(), g[4].data(), g[5].data(), sl);
      ExpertBackward(1, g[2].data(), g[3].data(), sl);
      ExpertBackward(0, g[0].data(), g[1].data(), sl);
      for (int t = 0; t < 6; t++) {
        if (rank == 0) {
          sum[t] = g[t];
          continue;
        }
        for (size_t i = 0; i < g[t].size(); i++) sum[t][i] += g[t][i];
      }
    }
    for (int t = 0; t < 6; t++) {
      if (world > 1)
        for (float& x : sum[t]) x /= (float)world;
      zs_adam_hparams hp = {kLr, 0.9, 0.999, 1e-8, kWd};
      EXPECT_EQ(zs_optim_adamw(r.params[t].data(), sum[t].data(), r.m1[t].data(),
                               r.m2[t].data(), sum[t].size(), &hp, s + 1),
                ZS_OK);
    }
  }
  return r;
}

enum Fault { kNone, kMoe, kStop };

struct Opts {
  int stage = 0;
  bool declared = false;  // zs_unit_set_grad_uses(1) for every unit
  Fault fault = kNone;
  int fault_step = 0;
  int prefetch_depth = 2;
  int shard_group_size = 0;  // hybrid sharding's G (0: all ranks)
};

struct Sharded {
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int unit[3] = {-1, -1, -1};
  int t[6] = {-1, -1, -1, -1, -1, -1};
  int rank = 0, world = 1;
  // Host mirrors of the gathered parameters and acquired gradients.
  std::vector<float> p[6], g[6];
};

zs_status InitFn(void* user, int tensor, const zs_tensor_desc* desc, void* data) {
  (void)user;
  float* f = static_cast<float*>(data);
  for (size_t i = 0; i < desc->numel; i++) f[i] = Init(tensor, (int)i);
  return ZS_OK;
}

zs_status Build(const Opts& o, Sharded* z) {
  MPI_Comm_rank(MPI_COMM_WORLD, &z->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &z->world);
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = o.stage;
  cfg.optimizer.lr = kLr;
  cfg.optimizer.weight_decay = kWd;
  cfg.prefetch_depth = o.prefetch_depth;
  cfg.shard_group_size = o.shard_group_size;
  cfg.collective_timeout_s = 120;
  cfg.device = kDevice;
  zs_status st = zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &z->ctx);
  if (st == ZS_OK) st = zs_model_create(z->ctx, &z->m);
  const char* units[3] = {"expert.a", "expert.b", "head"};
  const char* names[6] = {"a.w", "a.b", "b.w", "b.b", "head.v", "head.c"};
  for (int u = 0; u < 3 && st == ZS_OK; u++) {
    st = zs_model_add_unit(z->m, units[u], &z->unit[u]);
    for (int k = 0; k < 2 && st == ZS_OK; k++) {
      const int t = 2 * u + k;
      int64_t shape[2] = {kH, kD};
      int ndim = t % 2 == 0 && u < 2 ? 2 : 1;
      if (ndim == 1) shape[0] = kNumel[t];
      st = zs_model_add_tensor(z->m, z->unit[u], names[t], ndim, shape,
                               ZS_FLOAT32, 0, &z->t[t]);
    }
    if (st == ZS_OK && o.declared) st = zs_unit_set_grad_uses(z->m, z->unit[u], 1);
  }
  if (st == ZS_OK) st = zs_model_finalize(z->m);
  if (st == ZS_OK) st = zs_model_init(z->m, InitFn, nullptr);
  return st;
}

// The gathered parameters of tensor t, in its host mirror.
float* Data(Sharded& z, int t) {
  void* p = nullptr;
  EXPECT_EQ(zs_tensor_data(z.m, z.t[t], &p), ZS_OK) << zs_last_error();
  z.p[t].assign((size_t)kNumel[t], 0.f);
  if (p != nullptr) Copy(z.p[t].data(), p, z.p[t].size() * sizeof(float));
  return z.p[t].data();
}
// Its gradient accumulation buffer, in its host mirror; Put writes the
// mirror back.
float* Grad(Sharded& z, int t) {
  void* g = nullptr;
  EXPECT_EQ(zs_tensor_grad(z.m, z.t[t], &g), ZS_OK) << zs_last_error();
  z.g[t].assign((size_t)kNumel[t], 0.f);
  if (g != nullptr) Copy(z.g[t].data(), g, z.g[t].size() * sizeof(float));
  return z.g[t].data();
}
void Put(Sharded& z, int t) {
  void* g = nullptr;
  EXPECT_EQ(zs_tensor_grad(z.m, z.t[t], &g), ZS_OK) << zs_last_error();
  if (g != nullptr) Copy(g, z.g[t].data(), z.g[t].size() * sizeof(float));
}

// One micro-batch through the per-step API. `uses[e]`: whether this rank
// touches expert e at all (the documented way: every rank touches both);
// `stop_after_a`: the pass fails right after expert A's forward, with A
// still gathered. Returns the first failing call's status.
zs_status Pass(Sharded& z, int s, const bool uses[2], bool stop_after_a) {
  Slice sl = MakeSlice(s, z.rank, z.world);
  zs_model* m = z.m;
#define ZS_PASS(call)                   \
  do {                                  \
    zs_status st_ = (call);             \
    if (st_ != ZS_OK) return st_;       \
  } while (0)
  for (int e = 0; e < 2; e++) {
    if (!uses[e]) continue;
    ZS_PASS(zs_unit_gather(m, z.unit[e]));
    ExpertForward(e, Data(z, 2 * e), Data(z, 2 * e + 1), sl);
    if (e == 0 && stop_after_a) return ZS_ERR_INVALID_ARGUMENT;
    ZS_PASS(zs_unit_release(m, z.unit[e]));
  }
  ZS_PASS(zs_unit_gather(m, z.unit[2]));
  ZS_PASS(zs_unit_grad_acquire(m, z.unit[2]));
  HeadForwardBackward(Data(z, 4), Data(z, 5), Grad(z, 4), Grad(z, 5), sl);
  Put(z, 4);
  Put(z, 5);
  ZS_PASS(zs_unit_grad_release(m, z.unit[2]));
  ZS_PASS(zs_unit_release(m, z.unit[2]));
  for (int e = 1; e >= 0; e--) {
    if (!uses[e]) continue;
    ZS_PASS(zs_unit_gather(m, z.unit[e]));
    ZS_PASS(zs_unit_grad_acquire(m, z.unit[e]));
    ExpertBackward(e, Grad(z, 2 * e), Grad(z, 2 * e + 1), sl);
    Put(z, 2 * e);
    Put(z, 2 * e + 1);
    ZS_PASS(zs_unit_grad_release(m, z.unit[e]));
    ZS_PASS(zs_unit_release(m, z.unit[e]));
  }
#undef ZS_PASS
  return ZS_OK;
}

Result Read(Sharded& z) {
  Result r;
  r.params.resize(6);
  r.m1.resize(6);
  r.m2.resize(6);
  for (int t = 0; t < 6; t++) {
    r.params[t].resize((size_t)kNumel[t]);
    r.m1[t].resize((size_t)kNumel[t]);
    r.m2[t].resize((size_t)kNumel[t]);
    EXPECT_EQ(GetFloat(z.m, z.t[t], ZS_FIELD_PARAM, r.params[t]), ZS_OK)
        << zs_last_error();
    EXPECT_EQ(GetFloat(z.m, z.t[t], ZS_FIELD_EXP_AVG, r.m1[t]), ZS_OK);
    EXPECT_EQ(GetFloat(z.m, z.t[t], ZS_FIELD_EXP_AVG_SQ, r.m2[t]), ZS_OK);
  }
  return r;
}

void ExpectSame(const Result& a, const Result& b, const std::string& what) {
  for (int t = 0; t < 6; t++) {
    EXPECT_TRUE(Bitwise(a.params[t], b.params[t])) << what << " tensor " << t;
    EXPECT_TRUE(Bitwise(a.m1[t], b.m1[t])) << what << " exp_avg " << t;
    EXPECT_TRUE(Bitwise(a.m2[t], b.m2[t])) << what << " exp_avg_sq " << t;
  }
}

std::string Name(const Opts& o) {
  return std::string(o.fault == kMoe ? "moe" : o.fault == kStop ? "stop" : "clean") +
         " stage " + std::to_string(o.stage) +
         (o.declared ? " declared" : " recorded") + " at step " +
         std::to_string(o.fault_step) + " prefetch " +
         std::to_string(o.prefetch_depth);
}

// What the next steps' scheduling depends on, on this rank.
struct Schedule {
  std::vector<int> uses;
  std::vector<int> trace;
  int trace_valid = 0;
  bool operator==(const Schedule& o) const {
    return uses == o.uses && trace == o.trace && trace_valid == o.trace_valid;
  }
};

Schedule ScheduleOf(const Sharded& z) {
  Schedule s;
  for (int u = 0; u < 3; u++) s.uses.push_back(zs_unit_grad_uses(z.m, z.unit[u]));
  s.trace.assign(z.m->trace, z.m->trace + z.m->trace_len);
  s.trace_valid = z.m->trace_valid;
  return s;
}

// How many collectives of the communication log were partners issued by
// zs_step_discard for collectives other ranks had and this one lacked.
int CatchUps(const Sharded& z) {
  std::vector<zs_comm_record> log(8192);
  const size_t n = zs_comm_log_get(z.ctx, log.data(), log.size());
  int k = 0;
  for (size_t i = 0; i < n; i++)
    k += std::string(log[i].purpose) == "discard catch-up";
  return k;
}

// The faulty micro-batch of step s, then zs_step_discard on every rank.
void Fail(Sharded& z, const Opts& o, int s) {
  const std::string what = Name(o) + " rank " + std::to_string(z.rank);
  const int catch_ups = CatchUps(z);
  if (o.fault == kMoe) {
    // (a slice routes all its samples to one expert: rank 0's to A)
    const int e = Route(MakeSlice(s, z.rank, z.world).b0, z.world);
    const bool mine[2] = {e == 0, e == 1};
    EXPECT_EQ(Pass(z, s, mine, false), ZS_OK) << what << ": " << zs_last_error();
    EXPECT_EQ(zs_step(z.m, nullptr), ZS_ERR_MISMATCH) << what;
    EXPECT_NE(std::string(zs_last_error()).find("zs_step_discard"),
              std::string::npos) << what << ": " << zs_last_error();
  } else {
    const bool both[2] = {true, true};
    zs_status st = Pass(z, s, both, z.rank == kStopper);
    if (z.rank == kStopper) {
      EXPECT_EQ(st, ZS_ERR_INVALID_ARGUMENT) << what;
    } else {
      // A wait in the pass (stage 3: rank 1 never issues the all-gather of
      // expert B), else zs_step's check, fails naming the rank
      if (st == ZS_OK) st = zs_step(z.m, nullptr);
      EXPECT_EQ(st, ZS_ERR_REMOTE) << what << ": " << zs_last_error();
      const std::string e = zs_last_error();
      EXPECT_NE(e.find("rank 1 dropped this micro-batch (zs_step_discard)"),
                std::string::npos) << what << ": " << e;
      // until this rank discards, nothing that issues a collective runs
      EXPECT_EQ(zs_unit_gather(z.m, z.unit[0]), ZS_ERR_INVALID_STATE) << what;
      zs_step_info kept{};  // refused before its work: left as it was
      kept.struct_size = sizeof kept;
      kept.step = 77;
      kept.loss_scale = 3.0;
      EXPECT_EQ(zs_step(z.m, &kept), ZS_ERR_INVALID_STATE) << what;
      EXPECT_TRUE(kept.step == 77 && kept.loss_scale == 3.0) << what;
    }
  }
  zs_step_info info{};
  EXPECT_EQ(zs_step_discard(z.m, &info), ZS_OK) << what << ": " << zs_last_error();
  EXPECT_EQ(info.applied, 0) << what;
  EXPECT_EQ(info.step, s) << what << ": step count unchanged";
  // The stopping rank lacked what the others issued after its failure (at
  // least zs_step's check or an all-gather of B) and issued partners for
  // them; nobody else did, and with the experts the counts were equal.
  // (With shard groups the stopper's group partner may lack the context's
  // collectives the others issued while it waited in the group's: it
  // issues partners too; nobody in another group does.)
  const int issued = CatchUps(z) - catch_ups;
  const bool partner = o.shard_group_size > 0 &&
                       z.rank / o.shard_group_size == kStopper / o.shard_group_size;
  if (o.fault == kStop && z.rank == kStopper) {
    EXPECT_GT(issued, 0) << what;
  } else if (o.fault != kStop || !partner) {
    EXPECT_EQ(issued, 0) << what;
  }
}

// Trains kSteps steps; at o.fault_step the faulty micro-batch comes first
// and is discarded, then redone the documented way.
Result Train(const Opts& o) {
  Sharded z;
  const std::string what = Name(o);
  zs_status st = Build(o, &z);
  EXPECT_EQ(st, ZS_OK) << what << ": " << zs_last_error();
  Result out;
  const bool both[2] = {true, true};
  for (int s = 0; s < kSteps && st == ZS_OK; s++) {
    if (o.fault != kNone && s == o.fault_step && z.world > 1) {
      const Result before = Read(z);
      const Schedule sched = ScheduleOf(z);
      Fail(z, o, s);
      ExpectSame(Read(z), before, what + ": state after the discard");
      EXPECT_TRUE(ScheduleOf(z) == sched)
          << what << ": use counts and prefetch trace after the discard";
      // every rank has the same schedule (the next step depends on it)
      Schedule s0 = ScheduleOf(z);
      std::vector<int> all(s0.uses.size() * (size_t)z.world);
      MPI_Allgather(s0.uses.data(), (int)s0.uses.size(), MPI_INT, all.data(),
                    (int)s0.uses.size(), MPI_INT, MPI_COMM_WORLD);
      for (int r = 1; r < z.world; r++)
        EXPECT_TRUE(std::equal(s0.uses.begin(), s0.uses.end(),
                               all.begin() + (long)r * (long)s0.uses.size()))
            << what << ": use counts of rank " << r;
    }
    st = Pass(z, s, both, false);
    EXPECT_EQ(st, ZS_OK) << what << " step " << s << ": " << zs_last_error();
    zs_step_info info{};
    if (st == ZS_OK) st = zs_step(z.m, &info);
    EXPECT_EQ(st, ZS_OK) << what << " step " << s << ": " << zs_last_error();
    EXPECT_EQ(info.applied, 1) << what << " step " << s;
  }
  if (st == ZS_OK) out = Read(z);
  zs_model_destroy(z.m);
  zs_context_destroy(z.ctx);
  return out;
}

// The reference itself: a clean sharded run equals it at every stage.
TEST_F(DiscardTest, CleanRunEqualsTheRankOrderReference) {
  const Result ref = RankOrderReference(world_, kSteps);
  for (int stage = 0; stage <= 3; stage++) {
    Opts o;
    o.stage = stage;
    ExpectSame(Train(o), ref, Name(o));
  }
}

void RunScenario(Fault fault, int world) {
  if (world < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const Result ref = RankOrderReference(world, kSteps);
  for (int stage = 0; stage <= 3; stage++)
    for (bool declared : {false, true})
      for (int step : {0, 2})
        for (int depth : {2, 0}) {
          // (stage 3 prefetch along a trace that one rank then leaves
          // pairs experts with the head, whose sizes differ: the misuse no
          // check can catch in time, docs/api.md; the first step has no
          // trace yet)
          if (fault == kMoe && stage == 3 && step > 0 && depth > 0) continue;
          if (stage < 3 && depth == 0) continue;
          Opts o;
          o.stage = stage;
          o.declared = declared;
          o.fault = fault;
          o.fault_step = step;
          o.prefetch_depth = depth;
          ExpectSame(Train(o), ref, Name(o) + " vs the rank-order reference");
        }
}

TEST_F(DiscardTest, RanksUsingDifferentExpertsRecoverAtTheFirstRedo) {
  RunScenario(kMoe, world_);
}

TEST_F(DiscardTest, APassThatFailedPartWayOnOneRankRecoversAtTheFirstRedo) {
  RunScenario(kStop, world_);
}

// With shard groups (hybrid sharding) the discard lines up the shard
// group's collectives as well as the context's: after either fault the run
// equals the clean run with the same groups bitwise (hybrid sharding
// reduces in another order than the flat reference, docs/running.md).
TEST_F(DiscardTest, WithShardGroupsRecoversToTheCleanRun) {
#ifdef ZS_TEST_CUDA
  GTEST_SKIP() << "hybrid sharding runs on the host device in this release";
#endif
  if (world_ < 4 || world_ % 2 != 0) GTEST_SKIP() << "needs 2 groups of >= 2";
  for (int stage = 0; stage <= 3; stage++) {
    Opts clean;
    clean.stage = stage;
    clean.shard_group_size = world_ / 2;
    const Result want = Train(clean);
    for (Fault fault : {kMoe, kStop}) {
      Opts o = clean;
      o.fault = fault;
      o.fault_step = 2;
      o.prefetch_depth = stage == 3 && fault == kMoe ? 0 : 2;
      ExpectSame(Train(o), want, Name(o) + " with shard groups");
    }
  }
}

}  // namespace
