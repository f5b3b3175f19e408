// local_test.cc — zs_context_create_local (one process, no MPI) trains
// exactly as an MPI context of one rank: at one rank every collective is a
// copy on both, so the results must be BITWISE equal at every stage.
#include <gtest/gtest.h>

#include <string>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class LocalTest : public ZsMpiTest {};

TEST_F(LocalTest, LocalContextTrainsBitwiseAsAnMpiContextOfOneRank) {
  struct Case {
    const char* name;
    std::unique_ptr<Model> (*make)();
    zs_dtype dtype;
    double clip;
  };
  const Case cases[] = {{"mlp fp32", MakeMlp, ZS_FLOAT32, 0.0},
                        {"transformer bf16 clip", MakeTransformer, ZS_BFLOAT16, 0.5}};
  for (const Case& c : cases) {
    for (int stage = 0; stage <= 3; stage++) {
      const std::string what = std::string(c.name) + " stage " +
                               std::to_string(stage);
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 6;
      cfg.param_dtype = c.dtype;
      cfg.max_grad_norm = c.clip;
      cfg.comm = MPI_COMM_SELF;
      auto a = c.make();
      TrainResult mpi = TrainSharded(*a, cfg);
      ASSERT_EQ(mpi.status, ZS_OK) << what << ": " << mpi.error;
      cfg.local_context = true;
      auto b = c.make();
      TrainResult local = TrainSharded(*b, cfg);
      ASSERT_EQ(local.status, ZS_OK) << what << ": " << local.error;
      ExpectSameTraining(local, mpi, *a, what);
      // What the context still holds once the model is gone (its
      // communication log) is the same.
      EXPECT_EQ(local.memory_after_destroy.total_current,
                mpi.memory_after_destroy.total_current) << what;
    }
  }
}

}  // namespace
