// policy_test.cc — runtime/core/core_policy.c (the per-unit policy) and the
// engine's state machines (runtime/engine/engine.c), single process.
//
// The policy of every combination of stage (0-3), device (host, CUDA),
// parameter dtype (fp32, bf16, fp16), trainable or frozen, optimizer
// offload (none, cpu, nvme) and parameter offload (none, cpu, nvme) is
// checked against the table below, written out by hand from ZeRO's
// definitions (stage 1 shards the optimizer states, 2 also the gradients,
// 3 also the parameters; offload moves master weights and states, and at
// stage 3 the parameter shards, to host memory or NVMe), not computed the
// way core_policy.c computes it.
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <string>

#include "runtime/core/core_policy.h"
#include "runtime/engine/engine.h"

namespace {

constexpr zs__extent F = ZS__EXTENT_FULL, S = ZS__EXTENT_SHARD,
                     X = ZS__EXTENT_NONE;  // X: a frozen unit's gradients
constexpr zs__tier D = ZS__TIER_DEVICE, H = ZS__TIER_HOST, N = ZS__TIER_NVME;

// One row: (stage, optimizer offload, parameter offload) and what a
// trainable 16-bit unit gets. valid 0: no policy (an error naming
// config.offload_param).
struct Row {
  int stage, opt, param;
  int valid;
  zs__extent params;
  zs__tier params_tier;
  int gather_on_use, gather_via_copy, refresh_after_step;
  zs__extent grads;
  int accum_transient, grads_gather_back;
  zs__extent opt_span;
  zs__tier state_tier;
};

// clang-format off
const Row kTable[] = {
  // st opt par ok params tier gath copy refr grads acc back span states
  {0, 0, 0, 1, F, D, 0, 0, 0, F, 0, 1, F, D},
  {0, 1, 0, 1, F, D, 0, 0, 0, F, 0, 1, F, H},
  {0, 2, 0, 1, F, D, 0, 0, 0, F, 0, 1, F, N},
  {0, 0, 1, 0},
  {0, 1, 1, 0},
  {0, 2, 1, 0},
  {0, 0, 2, 0},
  {0, 1, 2, 0},
  {0, 2, 2, 0},
  {1, 0, 0, 1, F, D, 0, 0, 1, F, 0, 0, S, D},
  {1, 1, 0, 1, F, D, 0, 0, 1, F, 0, 0, S, H},
  {1, 2, 0, 1, F, D, 0, 0, 1, F, 0, 0, S, N},
  {1, 0, 1, 0},
  {1, 1, 1, 0},
  {1, 2, 1, 0},
  {1, 0, 2, 0},
  {1, 1, 2, 0},
  {1, 2, 2, 0},
  {2, 0, 0, 1, F, D, 0, 0, 1, S, 1, 0, S, D},
  {2, 1, 0, 1, F, D, 0, 0, 1, S, 1, 0, S, H},
  {2, 2, 0, 1, F, D, 0, 0, 1, S, 1, 0, S, N},
  {2, 0, 1, 0},
  {2, 1, 1, 0},
  {2, 2, 1, 0},
  {2, 0, 2, 0},
  {2, 1, 2, 0},
  {2, 2, 2, 0},
  {3, 0, 0, 1, S, D, 1, 0, 0, S, 1, 0, S, D},
  {3, 1, 0, 1, S, D, 1, 0, 0, S, 1, 0, S, H},
  {3, 2, 0, 1, S, D, 1, 0, 0, S, 1, 0, S, N},
  {3, 0, 1, 0},
  {3, 1, 1, 1, S, H, 1, 1, 0, S, 1, 0, S, H},
  {3, 2, 1, 1, S, H, 1, 1, 0, S, 1, 0, S, N},
  {3, 0, 2, 0},
  {3, 1, 2, 1, S, N, 1, 1, 0, S, 1, 0, S, H},
  {3, 2, 2, 1, S, N, 1, 1, 0, S, 1, 0, S, N},
};
// clang-format on

std::string Name(const Row& r, int host, zs_dtype dt, int trainable) {
  return "stage " + std::to_string(r.stage) + ", optimizer offload " +
         std::to_string(r.opt) + ", parameter offload " +
         std::to_string(r.param) + (host ? ", host" : ", cuda") + ", " +
         zs_dtype_name(dt) + (trainable ? ", trainable" : ", frozen");
}

TEST(Policy, EveryCombinationMatchesTheTable) {
  ASSERT_EQ(sizeof kTable / sizeof kTable[0], 4u * 3u * 3u);
  int checked = 0;
  for (const Row& r : kTable)
    for (int host = 0; host <= 1; host++)
      for (zs_dtype dt : {ZS_FLOAT32, ZS_BFLOAT16, ZS_FLOAT16})
        for (int trainable = 0; trainable <= 1; trainable++) {
          SCOPED_TRACE(Name(r, host, dt, trainable));
          const int lowp = dt != ZS_FLOAT32;
          const zs__policy_in in = {r.stage, host, lowp, trainable, r.opt,
                                    r.param};
          zs__policy p;
          const zs_status st = zs__policy_make(&in, &p);
          checked++;
          if (!r.valid) {
            EXPECT_EQ(st, ZS_ERR_INVALID_ARGUMENT);
            EXPECT_NE(std::string(zs_last_error()).find("config.offload_param"),
                      std::string::npos)
                << zs_last_error();
            continue;
          }
          ASSERT_EQ(st, ZS_OK) << zs_last_error();
          EXPECT_EQ(p.stage, r.stage);
          EXPECT_EQ(p.comm, 0);
          // Parameters: the same for frozen and trainable units.
          EXPECT_EQ(p.params, r.params);
          EXPECT_EQ(p.params_tier, r.params_tier);
          EXPECT_EQ(p.gather_on_use, r.gather_on_use);
          EXPECT_EQ(p.gather_via_copy, r.gather_via_copy);
          if (!trainable) {
            // Frozen: no gradients, no optimizer, nothing to refresh.
            EXPECT_EQ(p.grads, X);
            EXPECT_EQ(p.reduce, ZS__REDUCE_NONE);
            EXPECT_EQ(p.accum_transient, 0);
            EXPECT_EQ(p.grads_gather_back, 0);
            EXPECT_EQ(p.refresh_after_step, 0);
            EXPECT_EQ(p.opt_span, r.opt_span);  // its geometry only
            EXPECT_EQ(p.master_tier, ZS__TIER_NONE);
            EXPECT_EQ(p.state_tier, ZS__TIER_NONE);
            continue;
          }
          EXPECT_EQ(p.refresh_after_step, r.refresh_after_step);
          EXPECT_EQ(p.grads, r.grads);
          EXPECT_EQ(p.reduce, ZS__REDUCE_SCATTER);
          EXPECT_EQ(p.accum_transient, r.accum_transient);
          EXPECT_EQ(p.grads_gather_back, r.grads_gather_back);
          EXPECT_EQ(p.opt_span, r.opt_span);
          EXPECT_EQ(p.state_tier, r.state_tier);
          // fp32 units update their parameters directly: no master copy.
          EXPECT_EQ(p.master_tier, lowp ? r.state_tier : ZS__TIER_NONE);
        }
  EXPECT_EQ(checked, 36 * 2 * 3 * 2);
}

TEST(Policy, OutOfRangeSettingsAreNamed) {
  zs__policy p;
  const zs__policy_in stage = {4, 1, 0, 1, 0, 0};
  EXPECT_EQ(zs__policy_make(&stage, &p), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("config.stage"), std::string::npos);
  const zs__policy_in opt = {1, 1, 0, 1, 3, 0};
  EXPECT_EQ(zs__policy_make(&opt, &p), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_optimizer"),
            std::string::npos);
  const zs__policy_in par = {3, 1, 0, 1, 1, -1};
  EXPECT_EQ(zs__policy_make(&par, &p), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("config.offload_param"),
            std::string::npos);
}

TEST(Policy, SpansAndOffsets) {
  zs__policy p;
  const zs__policy_in s0 = {0, 1, 1, 1, 0, 0}, s2 = {2, 1, 1, 1, 0, 0};
  ASSERT_EQ(zs__policy_make(&s0, &p), ZS_OK);
  EXPECT_EQ(zs__policy_span(&p, 96, 32), 96u);
  EXPECT_EQ(zs__policy_shard_offset(p.opt_span, 2, 32), 64u);
  ASSERT_EQ(zs__policy_make(&s2, &p), ZS_OK);
  EXPECT_EQ(zs__policy_span(&p, 96, 32), 32u);
  EXPECT_EQ(zs__policy_shard_offset(p.opt_span, 2, 32), 0u);
  // the memory model per policy: stage 2, bf16 (2 bytes), fp32 grads
  const zs__unit_layout l = {90, 96, 32};
  const zs__unit_bytes b = zs__layout_unit_bytes(&l, &p, 2, 4);
  EXPECT_EQ(b.params, 96u * 2);
  EXPECT_EQ(b.grads, 32u * 4);
  EXPECT_EQ(b.master, 32u * 4);
  EXPECT_EQ(b.state, 32u * 4);
}

TEST(Policy, OptimizerLoop) {
  EXPECT_EQ(zs__policy_loop(0, 0, 0), ZS__LOOP_UNITS);
  EXPECT_EQ(zs__policy_loop(0, 1, 0), ZS__LOOP_STAGED);
  EXPECT_EQ(zs__policy_loop(0, 1, 1), ZS__LOOP_UNITS);  // shards stepped by unit
  EXPECT_EQ(zs__policy_loop(1, 1, 0), ZS__LOOP_NVME);
  EXPECT_EQ(zs__policy_loop(1, 0, 1), ZS__LOOP_NVME);
  EXPECT_STREQ(zs__tier_name(ZS__TIER_NVME), "nvme");
}

// The parameter state machine: every (from, to) pair, legal exactly when
// the diagram in engine.h has the arrow; an illegal one names the unit and
// both states and changes nothing.
TEST(StateMachines, ParameterTransitions) {
  const zs__param_state all[] = {ZS__PARAM_RESIDENT, ZS__PARAM_REFRESHING,
                                 ZS__PARAM_SHARDED, ZS__PARAM_GATHERING,
                                 ZS__PARAM_GATHERED};
  auto legal = [](zs__param_state a, zs__param_state b) {
    return (a == ZS__PARAM_RESIDENT && b == ZS__PARAM_REFRESHING) ||
           (a == ZS__PARAM_REFRESHING && b == ZS__PARAM_RESIDENT) ||
           (a == ZS__PARAM_SHARDED && b == ZS__PARAM_GATHERING) ||
           (a == ZS__PARAM_GATHERING && b == ZS__PARAM_GATHERED) ||
           (a == ZS__PARAM_GATHERING && b == ZS__PARAM_SHARDED) ||
           (a == ZS__PARAM_GATHERED && b == ZS__PARAM_SHARDED);
  };
  int legal_count = 0;
  for (zs__param_state a : all)
    for (zs__param_state b : all) {
      zs__unit u{};
      snprintf(u.name, sizeof u.name, "blk7");
      u.param_state = a;
      const zs_status st = zs__param_state_set(&u, b);
      SCOPED_TRACE(std::string(zs__param_state_name(a)) + " -> " +
                   zs__param_state_name(b));
      if (legal(a, b)) {
        legal_count++;
        EXPECT_EQ(st, ZS_OK);
        EXPECT_EQ(u.param_state, b);
      } else {
        EXPECT_EQ(st, ZS_ERR_INVALID_STATE);
        EXPECT_EQ(u.param_state, a);
        const std::string msg = zs_last_error();
        EXPECT_NE(msg.find("unit 'blk7'"), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::string(zs__param_state_name(a)) + " -> " +
                           zs__param_state_name(b)),
                  std::string::npos)
            << msg;
      }
    }
  EXPECT_EQ(legal_count, 6);
}

TEST(StateMachines, CompletionFollowsTheCollectives) {
  zs__unit u{};
  u.param_state = ZS__PARAM_GATHERING;
  u.gather_ops.n = 1;  // still in flight
  zs__param_complete(&u);
  EXPECT_EQ(u.param_state, ZS__PARAM_GATHERING);
  u.gather_ops.n = 0;
  zs__param_complete(&u);
  EXPECT_EQ(u.param_state, ZS__PARAM_GATHERED);
  zs__param_complete(&u);  // nothing to complete
  EXPECT_EQ(u.param_state, ZS__PARAM_GATHERED);
  u.param_state = ZS__PARAM_REFRESHING;
  u.shard_ops.n = 2;
  zs__param_complete(&u);
  EXPECT_EQ(u.param_state, ZS__PARAM_REFRESHING);
  u.shard_ops.n = 0;
  zs__param_complete(&u);
  EXPECT_EQ(u.param_state, ZS__PARAM_RESIDENT);
}

TEST(StateMachines, GradientTransitions) {
  const zs__grad_state all[] = {ZS__GRAD_IDLE, ZS__GRAD_ACCUM,
                                ZS__GRAD_REDUCING, ZS__GRAD_REDUCED};
  auto legal = [](zs__grad_state a, zs__grad_state b) {
    return b == ZS__GRAD_IDLE ||
           (a == ZS__GRAD_IDLE && b == ZS__GRAD_ACCUM) ||
           (a == ZS__GRAD_REDUCED && b == ZS__GRAD_ACCUM) ||
           (a == ZS__GRAD_ACCUM && b == ZS__GRAD_REDUCING) ||
           (a == ZS__GRAD_REDUCING && b == ZS__GRAD_REDUCED);
  };
  for (zs__grad_state a : all)
    for (zs__grad_state b : all) {
      zs__unit u{};
      snprintf(u.name, sizeof u.name, "head");
      u.grad_state = a;
      const zs_status st = zs__grad_state_set(&u, b);
      SCOPED_TRACE(std::string(zs__grad_state_name(a)) + " -> " +
                   zs__grad_state_name(b));
      if (legal(a, b)) {
        EXPECT_EQ(st, ZS_OK);
        EXPECT_EQ(u.grad_state, b);
      } else {
        EXPECT_EQ(st, ZS_ERR_INVALID_STATE);
        EXPECT_EQ(u.grad_state, a);
        EXPECT_NE(std::string(zs_last_error()).find("unit 'head'"),
                  std::string::npos);
      }
    }
}

}  // namespace
