// finalize_first_test.cc — the caller's MPI_Finalize before
// zs_context_destroy (a misuse): every later ZeroShard call returns an
// error naming it instead of making an MPI call, which would end the
// process; destroy still frees everything. Run as a plain test binary
// (MPI singleton), not under mpirun: MPI can be finalized once per process.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <string>

namespace {

zs_status Ones(void*, int, const zs_tensor_desc* d, void* data) {
  for (size_t i = 0; i < d->numel; i++) static_cast<float*>(data)[i] = 1.0f;
  return ZS_OK;
}

bool Names(const char* what) {
  return std::string(zs_last_error()).find(what) != std::string::npos;
}

TEST(FinalizeFirst, LaterCallsFailNamingItAndNothingEndsTheProcess) {
  int provided = 0;
  ASSERT_EQ(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
            MPI_SUCCESS);
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK) << zs_last_error();
  zs_model* m = nullptr;
  int u = -1, v = -1, t = -1, s = -1;
  int64_t n = 1000;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "v", &v), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, v, "x", 1, &n, ZS_FLOAT32, 0, &s), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_model_init(m, Ones, nullptr), ZS_OK);
  ASSERT_EQ(zs_unit_gather(m, u), ZS_OK);
  ASSERT_EQ(zs_unit_release(m, u), ZS_OK);
  ASSERT_EQ(zs_unit_prefetch(m, v), ZS_OK);  // may be in flight at finalize

  ASSERT_EQ(MPI_Finalize(), MPI_SUCCESS);  // the misuse

  EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_INVALID_STATE);
  EXPECT_TRUE(Names("MPI was finalized while this context existed")) << zs_last_error();
  EXPECT_TRUE(Names("call zs_context_destroy before MPI_Finalize")) << zs_last_error();
  // (v's prefetched all-gather may have completed before MPI_Finalize: its
  // use then needs no MPI call)
  if (zs_unit_gather(m, v) == ZS_OK) {
    EXPECT_EQ(zs_unit_release(m, v), ZS_OK);
  }
  EXPECT_NE(zs_step(m, nullptr), ZS_OK);
  EXPECT_TRUE(Names("MPI was finalized")) << zs_last_error();
  EXPECT_NE(zs_checkpoint_save(m, "/tmp/zs-finalize-first-ckpt", nullptr, nullptr, 0), ZS_OK);
  // A new context is refused, and *out is cleared on that path too.
  zs_context* other = reinterpret_cast<zs_context*>(0x1);
  EXPECT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &other), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(other, nullptr);
  other = reinterpret_cast<zs_context*>(0x1);
  EXPECT_EQ(zs_context_create(&cfg, &other), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(other, nullptr);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

}  // namespace
