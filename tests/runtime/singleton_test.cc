// singleton_test.cc — world size 1 without mpirun: zs_context_create
// initializes MPI itself (a singleton), trains, and finalizes MPI in
// zs_context_destroy. Run as a plain test binary, not under mpirun.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>

#include <string>
#include <vector>

namespace {

zs_status Ones(void*, int, const zs_tensor_desc* d, void* data) {
  for (size_t i = 0; i < d->numel; i++) static_cast<float*>(data)[i] = 1.0f;
  return ZS_OK;
}

TEST(Singleton, ContextInitializesAndFinalizesMpi) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ASSERT_EQ(initialized, 0) << "this test must run without MPI_Init";
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 7;
  zs_context* ctx = nullptr;
  // A failed create leaves MPI up, so the caller can fix the config and
  // retry in the same process.
  EXPECT_EQ(zs_context_create(&cfg, &ctx), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  int finalized = 0;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
  cfg.stage = 3;
  cfg.optimizer.kind = ZS_OPTIM_SGD;
  cfg.optimizer.lr = 0.5;
  cfg.optimizer.weight_decay = 0.0;
  ASSERT_EQ(zs_context_create(&cfg, &ctx), ZS_OK) << zs_last_error();
  // A second context over the same MPI: destroying the first must not
  // finalize MPI under the second.
  zs_context* other = nullptr;
  ASSERT_EQ(zs_context_create(&cfg, &other), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_context_world_size(ctx), 1);
  EXPECT_EQ(zs_context_rank(ctx), 0);
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 1);

  zs_model* m = nullptr;
  int u = -1, t = -1;
  int64_t n = 3;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_model_init(m, Ones, nullptr), ZS_OK);
  // One SGD step on L = sum(w^2)/2: w <- w - 0.5 * w = 0.5.
  ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
  ASSERT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
  void *p = nullptr, *g = nullptr;
  ASSERT_EQ(zs_tensor_data(m, t, &p), ZS_OK);
  ASSERT_EQ(zs_tensor_grad(m, t, &g), ZS_OK);
  for (int i = 0; i < 3; i++)
    static_cast<float*>(g)[i] += static_cast<float*>(p)[i];
  ASSERT_EQ(zs_unit_grad_release(m, u), ZS_OK);
  ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  std::vector<float> w(3);
  ASSERT_EQ(zs_tensor_get(m, t, ZS_FIELD_PARAM, w.data()), ZS_OK);
  for (float v : w) EXPECT_EQ(v, 0.5f);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0) << "another context still uses MPI";
  zs_model* m2 = nullptr;
  ASSERT_EQ(zs_model_create(other, &m2), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m2, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m2, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_finalize(m2), ZS_OK) << zs_last_error();  // collective
  zs_model_destroy(m2);
  zs_context_destroy(other);
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 1) << "the last context over ZeroShard's MPI finalizes it";
  // MPI cannot start twice in one process: a clear error, not a crash.
  EXPECT_EQ(zs_context_create(&cfg, &ctx), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("finalized"), std::string::npos)
      << zs_last_error();
}

}  // namespace
