// unmatched_test.cc — one rank skips a unit in the backward, so it issues
// one reduce-scatter (and at stage 3 two all-gathers) fewer: a collective of
// the others has no partner, and no MPI call can cancel it.
//
// Stages 0-2: the skipped reduce-scatter is point-to-point, so zs_step's
// check (a collective) still pairs up and finds that the ranks' collective
// counts differ: MISMATCH on every rank, naming zs_step_discard, which
// gives the collective without partner its partners (comm_reconcile.c);
// the redone micro-batch then trains. (Before: the context could not go
// on.) Stage 3: rank 1's next all-gathers pair with the others' all-gather
// of the skipped unit in issue order, and its check with an all-gather of
// another size: MPI fails (or corrupts, docs/api.md), an error on every
// rank; every later call then says the context is over at once, and
// destroy does not wait collective_timeout_s for the unmatched collective.
//
// Its own binary, one context per process (the stage from ZS_TEST_STAGE):
// an abandoned collective stays in MPI's progress engine and may fail a
// later context's call in the same process, as docs/api.md says (end the
// job).
#include <gtest/gtest.h>
#include <mpi.h>
#include <zs_mpi.h>

#include <cstdlib>
#include <string>

#include "tests/testing/mpi_test.h"

namespace {

class UnmatchedTest : public ZsMpiTest {};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST_F(UnmatchedTest, OneRankSkippingAUnitIsDiscardedOrEndsTheContext) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const char* env = std::getenv("ZS_TEST_STAGE");
  const int stage = env != nullptr ? std::atoi(env) : 3;
  zs_config c = ZS_CONFIG_INIT;
  c.stage = stage;
  c.collective_timeout_s = 60;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u[3], t[3];
  int64_t n = 15;
  for (int k = 0; k < 3; k++) {
    const std::string name = "u" + std::to_string(k);
    ASSERT_EQ(zs_model_add_unit(m, name.c_str(), &u[k]), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u[k], ("w" + name).c_str(), 1, &n,
                                  ZS_FLOAT32, 0, &t[k]), ZS_OK);
    ASSERT_EQ(zs_unit_set_grad_uses(m, u[k], 1), ZS_OK);
  }
  ASSERT_EQ(zs_model_finalize(m), ZS_OK);
  // a pass stops at its first error (at stage 3 the unmatched gathers can
  // fail inside it: MPI reports the truncated message)
  auto pass = [&](int skip) {
    for (int k = 2; k >= 0; k--) {
      if (k == skip) continue;
      zs_status st = zs_unit_gather(m, u[k]);
      if (st == ZS_OK) st = zs_unit_grad_acquire(m, u[k]);
      if (st == ZS_OK) st = zs_unit_grad_release(m, u[k]);
      if (st == ZS_OK) st = zs_unit_release(m, u[k]);
      if (st != ZS_OK) return st;
    }
    return ZS_OK;
  };
  ASSERT_EQ(pass(-1), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  const double t0 = MPI_Wtime();
  const zs_status in_pass = pass(rank_ == 1 ? 1 : -1);
  const zs_status step = zs_step(m, nullptr);
  const std::string why = zs_last_error();
  if (stage < 3) {
    // no collective in the passes' gathers: the step's check finds it
    EXPECT_EQ(in_pass, ZS_OK) << zs_last_error();
    EXPECT_EQ(step, ZS_ERR_MISMATCH) << why;
    EXPECT_TRUE(Contains(why, "numbers of collectives")) << why;
    EXPECT_TRUE(Contains(why, "zs_step_discard")) << why;
    // the discard completes the collective without partner; the redone
    // micro-batch trains
    EXPECT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
    EXPECT_EQ(pass(-1), ZS_OK) << zs_last_error();
    zs_step_info info{};
    EXPECT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
    EXPECT_EQ(info.applied, 1);
    EXPECT_EQ(info.step, 2);
    zs_model_destroy(m);
    zs_context_destroy(ctx);
    EXPECT_LT(MPI_Wtime() - t0, 30.0);
    return;
  } else {
    // the first unmatched all-gather fails (truncated) or the step's
    // check does; either way an error, on every rank
    EXPECT_NE(step, ZS_OK) << why;
  }
  // every later call says the context is over at once, the discard the old
  // message sent callers to included (on MPI the truncated all-gather
  // failed the communicator: "cannot be used any more"; on the
  // shared-memory segment, where the units' equal sizes let the gathers
  // pair up, the step's check found the sequences differ and the discard
  // cannot line them up again: "cannot go on")
  EXPECT_NE(zs_step_discard(m, nullptr), ZS_OK);
  EXPECT_TRUE(Contains(zs_last_error(), "cannot be used any more") ||
              Contains(zs_last_error(), "the context cannot go on"))
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  EXPECT_LT(MPI_Wtime() - t0, 30.0)
      << "a call or destroy waited for the unmatched collective";
}

}  // namespace
