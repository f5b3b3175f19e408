// cuda_errors_fake_test.cc — the CUDA backend's bad-input errors, run on
// the CPU stand-ins for the CUDA runtime and NCCL (docs/testing.md): more
// ranks on a node than GPUs, and a device out of memory, each a clear
// error naming the rank, the device and what the rank holds, with nothing
// crashing or hanging and the context usable (or destroyable) after.
#include <gtest/gtest.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "tests/testing/mpi_test.h"

namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class CudaErrorsFakeTest : public ZsMpiTest {};

// One GPU for every rank of the node: each rank takes GPU 0 (local rank
// modulo the GPUs it sees), and the NCCL communicator's check refuses it on
// every rank, naming two ranks and the GPU. With a GPU per rank it works.
TEST_F(CudaErrorsFakeTest, MoreRanksOnANodeThanGpusFailsEveryRank) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  zs_config c = ZS_CONFIG_INIT;
  c.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  setenv("FAKECUDA_DEVICES", "1", 1);
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx),
            ZS_ERR_INVALID_ARGUMENT);
  const std::string err = zs_last_error();
  if (rank_ == 0) std::cout << "the error: " << err << "\n";
  EXPECT_TRUE(Contains(err, "ranks 0 and 1 share one GPU")) << err;
  EXPECT_TRUE(Contains(err, "0000:fe:00.0")) << err;
  EXPECT_TRUE(Contains(err, "1 CUDA device(s) for " + std::to_string(world_) +
                                " ranks")) << err;
  EXPECT_EQ(ctx, nullptr);
  setenv("FAKECUDA_DEVICES", "8", 1);
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
      << zs_last_error();
  zs_context_destroy(ctx);
}

// A model bigger than the device: finalize fails on every rank with
// OUT_OF_MEMORY naming the rank, the buffer, the device with its free and
// total memory, and what the rank holds by category; the context then
// builds a model that fits and reads it back through NCCL's stand-in.
TEST_F(CudaErrorsFakeTest, DeviceOutOfMemoryNamesTheDeviceAndWhatIsHeld) {
  setenv("FAKECUDA_DEVICES", "8", 1);
  setenv("FAKECUDA_MEM_BYTES", "1048576", 1);
  zs_config c = ZS_CONFIG_INIT;
  c.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
      << zs_last_error();
  for (int64_t n : {int64_t{1} << 20, int64_t{1000}}) {
    zs_model* m = nullptr;
    int u = -1, t = -1;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(m, "big", &u), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
    const zs_status st = zs_model_finalize(m);
    if (n > 1000) {
      EXPECT_EQ(st, ZS_ERR_OUT_OF_MEMORY);
      const std::string err = zs_last_error();
      if (rank_ == 0) std::cout << "the error: " << err << "\n";
      if (world_ > 1) {  // one process: no rank to name
        EXPECT_TRUE(Contains(err, "[rank " + std::to_string(rank_) + "]"))
            << err;
      }
      EXPECT_TRUE(Contains(err, "cannot allocate")) << err;
      EXPECT_TRUE(Contains(err, "on cuda")) << err;
      EXPECT_TRUE(Contains(err, "CUDA device " + std::to_string(rank_) +
                                ": cudaMalloc of")) << err;
      EXPECT_TRUE(Contains(err, "of 1048576 bytes free")) << err;
      EXPECT_TRUE(Contains(err, "params")) << err;
    } else {
      EXPECT_EQ(st, ZS_OK) << zs_last_error();
      float x[1000];
      EXPECT_EQ(zs_tensor_get(m, t, ZS_FIELD_PARAM, x), ZS_OK)
          << zs_last_error();
    }
    zs_model_destroy(m);
  }
  zs_context_destroy(ctx);
  unsetenv("FAKECUDA_MEM_BYTES");
}

}  // namespace
