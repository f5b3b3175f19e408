// local_nompi_test.cc — a program that never initializes MPI trains with
// zs_context_create_local: registration, initialization, gather, gradients,
// steps, a checkpoint round trip; MPI stays uninitialized throughout.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

zs_status Fill(void* user, int tensor, const zs_tensor_desc* d, void* data) {
  (void)user;
  float* p = static_cast<float*>(data);
  for (size_t i = 0; i < d->numel; i++) p[i] = 0.01f * (float)(i % 7) - 0.02f * tensor;
  return ZS_OK;
}

TEST(LocalContext, TrainsAndCheckpointsWithoutMpi) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_local(&cfg, &ctx), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_context_rank(ctx), 0);
  EXPECT_EQ(zs_context_world_size(ctx), 1);
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, w = -1;
  ASSERT_EQ(zs_model_add_unit(m, "layer", &u), ZS_OK);
  int64_t shape[2] = {5, 3};
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 2, shape, ZS_FLOAT32, 0, &w), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_model_init(m, Fill, nullptr), ZS_OK) << zs_last_error();
  for (int step = 0; step < 3; step++) {
    ASSERT_EQ(zs_unit_gather(m, u), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
    float* g = nullptr;
    ASSERT_EQ(zs_tensor_grad(m, w, (void**)&g), ZS_OK);
    for (int i = 0; i < 15; i++) g[i] += 0.1f * (float)(i + step);
    ASSERT_EQ(zs_unit_grad_release(m, u), ZS_OK);
    ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
    zs_step_info info{};
    ASSERT_EQ(zs_step(m, &info), ZS_OK) << zs_last_error();
    EXPECT_EQ(info.step, step + 1);
  }
  std::vector<float> before(15), after(15, -1.f);
  ASSERT_EQ(zs_tensor_get(m, w, ZS_FIELD_PARAM, before.data()), ZS_OK);
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/local-ckpt";
  ASSERT_EQ(zs_checkpoint_save(m, root.c_str(), nullptr, nullptr, 0), ZS_OK)
      << zs_last_error();
  ASSERT_EQ(zs_model_init(m, Fill, nullptr), ZS_OK);
  ASSERT_EQ(zs_checkpoint_load(m, root.c_str(), 0, nullptr, 0, nullptr), ZS_OK)
      << zs_last_error();
  ASSERT_EQ(zs_tensor_get(m, w, ZS_FIELD_PARAM, after.data()), ZS_OK);
  EXPECT_EQ(before, after);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 0) << "a local context must not start MPI";
}

// A model whose gradient use counts are not declared holds its units'
// gradients until zs_step in its first step: warned once (naming the first
// unit and zs_unit_set_grad_uses), not again, and not at all when declared.
std::string TrainTwoSteps(bool declare) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 2;
  cfg.log_level = ZS_LOG_WARN;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_local(&cfg, &ctx), ZS_OK) << zs_last_error();
  zs_model* m = nullptr;
  EXPECT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u[2] = {-1, -1}, w[2] = {-1, -1};
  int64_t n = 64;
  EXPECT_EQ(zs_model_add_unit(m, "embed", &u[0]), ZS_OK);
  EXPECT_EQ(zs_model_add_tensor(m, u[0], "embed.w", 1, &n, ZS_FLOAT32, 0, &w[0]), ZS_OK);
  EXPECT_EQ(zs_model_add_unit(m, "head", &u[1]), ZS_OK);
  EXPECT_EQ(zs_model_add_tensor(m, u[1], "head.w", 1, &n, ZS_FLOAT32, 0, &w[1]), ZS_OK);
  if (declare)
    for (int k : u) EXPECT_EQ(zs_unit_set_grad_uses(m, k, 1), ZS_OK);
  EXPECT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_model_init(m, Fill, nullptr), ZS_OK);
  ::testing::internal::CaptureStderr();
  for (int step = 0; step < 2; step++) {
    for (int k : u) {
      EXPECT_EQ(zs_unit_gather(m, k), ZS_OK);
      EXPECT_EQ(zs_unit_grad_acquire(m, k), ZS_OK);
      EXPECT_EQ(zs_unit_grad_release(m, k), ZS_OK);
      EXPECT_EQ(zs_unit_release(m, k), ZS_OK);
    }
    EXPECT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  return err;
}

TEST(LocalContext, UndeclaredUseCountsAreWarnedOnce) {
  if (std::getenv("ZS_LOG_LEVEL") != nullptr) GTEST_SKIP() << "ZS_LOG_LEVEL set";
  const std::string undeclared = TrainTwoSteps(false);
  const size_t at = undeclared.find("2 unit(s) have no declared gradient use count");
  EXPECT_NE(at, std::string::npos) << undeclared;
  EXPECT_NE(undeclared.find("unit 'embed'"), std::string::npos) << undeclared;
  EXPECT_NE(undeclared.find("zs_unit_set_grad_uses"), std::string::npos) << undeclared;
  const std::string phrase = "have no declared gradient use count";
  EXPECT_EQ(undeclared.find(phrase, undeclared.find(phrase) + phrase.size()),
            std::string::npos)
      << "warned twice: " << undeclared;
  const std::string declared = TrainTwoSteps(true);
  EXPECT_EQ(declared.find("gradient use count"), std::string::npos) << declared;
}

}  // namespace
