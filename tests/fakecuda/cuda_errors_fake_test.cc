// cuda_errors_fake_test.cc — the CUDA backend's bad-input errors, run on
// the CPU stand-ins for the CUDA runtime and NCCL (docs/testing.md): more
// ranks on a node than GPUs, and a device out of memory, each a clear
// error naming the rank, the device and what the rank holds, with nothing
// crashing or hanging and the context usable (or destroyable) after.
#include <gtest/gtest.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cuda_runtime_api.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "tests/testing/alloc_faults.h"
#include "tests/testing/mpi_test.h"

namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The stand-in's settings are environment variables it reads at each
// call: every test sets what it needs, and they are put back after it
// (also when an ASSERT returns early).
class CudaErrorsFakeTest : public ZsMpiTest {
 protected:
  void TearDown() override {
    unsetenv("FAKECUDA_MEM_BYTES");
    unsetenv("FAKECUDA_DEVICES");
    unsetenv("ZS_DEVICE_CHAIN");
    unsetenv("ZS_DEVICE_COMM");
    ZsMpiTest::TearDown();
  }
};

// A CUDA context at stage 3 with a collective timeout (default 1 s), and
// a model of one unit "u" with one tensor "w" of 64 floats.
void OneUnitAtStage3(zs_context** ctx, zs_model** m, int* u, int* t,
                     double timeout_s = 1.0, double heartbeat_s = 30.0) {
  zs_config c = ZS_CONFIG_INIT;
  c.device = ZS_DEVICE_CUDA;
  c.stage = 3;
  c.collective_timeout_s = timeout_s;
  c.heartbeat_timeout_s = heartbeat_s;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, ctx), ZS_OK)
      << zs_last_error();
  ASSERT_EQ(zs_model_create(*ctx, m), ZS_OK);
  int64_t n = 64;
  ASSERT_EQ(zs_model_add_unit(*m, "u", u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(*m, *u, "w", 1, &n, ZS_FLOAT32, 0, t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(*m), ZS_OK) << zs_last_error();
}

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
}

// One rank out of device memory where the others go on alone (its stage-3
// all-gather buffer; its gradient buffer): the others, whose NCCL
// collectives stay in flight, fail at once naming it (its failure notice
// travels over MPI), the NCCL communicator is aborted, and every rank
// destroys everything (no wait for collective_timeout_s, no hang).
TEST_F(CudaErrorsFakeTest, OutOfMemoryOnOneRankFailsTheOthersAtOnce) {
  if (world_ < 2) GTEST_SKIP() << "needs at least 2 ranks";
  setenv("FAKECUDA_DEVICES", "8", 1);
  for (int where = 0; where < 2; where++) {
    SCOPED_TRACE(where == 0 ? "stage-3 all-gather" : "gradient buffer");
    const int bad = world_ - 1;
    zs_config c = ZS_CONFIG_INIT;
    c.device = ZS_DEVICE_CUDA;
    c.stage = where == 1 ? 2 : 3;
    c.collective_timeout_s = 30;
    zs_context* ctx = nullptr;
    ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
        << zs_last_error();
    zs_model* m = nullptr;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u[2], t[2];
    int64_t n = 40;
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(zs_model_add_unit(m, k ? "b" : "a", &u[k]), ZS_OK);
      ASSERT_EQ(zs_model_add_tensor(m, u[k], k ? "wb" : "wa", 1, &n,
                                    ZS_FLOAT32, 0, &t[k]), ZS_OK);
    }
    ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
    if (rank_ == bad)
      zs__dev_alloc_fault =
          where == 1 ? zstest::FailGradsOfB : zstest::FailGatherOfB;
    const double t0 = MPI_Wtime();
    const zs_status st = zstest::GatherGradReleaseStep(m, u, 2);
    const std::string err = zs_last_error();
    zs__dev_alloc_fault = nullptr;
    EXPECT_LT(MPI_Wtime() - t0, 15.0) << "not at collective_timeout_s";
    if (rank_ == bad) {
      EXPECT_EQ(st, ZS_ERR_OUT_OF_MEMORY) << err;
      EXPECT_TRUE(Contains(err, "they were told")) << err;
    } else {
      EXPECT_EQ(st, ZS_ERR_REMOTE) << err;
      EXPECT_TRUE(Contains(err, "rank " + std::to_string(bad) +
                                    " failed and will not join it") &&
                  Contains(err, "test: no memory for 'b'") &&
                  Contains(err, "on cuda")) << err;
      if (rank_ == 0) std::cout << "the error: " << err << "\n";
    }
    EXPECT_NE(zs_step(m, nullptr), ZS_OK);
    zs_model_destroy(m);
    zs_context_destroy(ctx);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A NCCL collective only one rank issues: that rank times out after
// collective_timeout_s naming the collective, the unit, the GPU and what it
// holds, aborts its NCCL communicator and tells the other, whose next
// collective fails at once; both destroy everything (the abandoned
// collective does not hang the stream's destruction). (The other's next
// call is a step, not the same gather: the stand-in's abandoned
// all-gather would still match that one, where NCCL's abort ends it.)
TEST_F(CudaErrorsFakeTest, NcclCollectiveNobodyJoinsTimesOut) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  setenv("FAKECUDA_DEVICES", "8", 1);
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int u = -1, t = -1;
  OneUnitAtStage3(&ctx, &m, &u, &t);
  if (::testing::Test::HasFatalFailure()) return;
  if (rank_ == 1) {
    const double t0 = MPI_Wtime();
    EXPECT_EQ(zs_unit_gather(m, u), ZS_ERR_TIMEOUT);
    const std::string err = zs_last_error();
    std::cout << "the error: " << err << "\n";
    EXPECT_LT(MPI_Wtime() - t0, 30.0);
    EXPECT_TRUE(Contains(err, "all_gather") && Contains(err, "unit u") &&
                Contains(err, "within 1 s") &&
                Contains(err, "cuda device at PCI 0000:fe:01.0") &&
                Contains(err, "held now: params")) << err;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) {
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_REMOTE) << zs_last_error();
    EXPECT_TRUE(Contains(zs_last_error(), "rank 1 failed and will not join") &&
                Contains(zs_last_error(), "did not complete within 1 s"))
        << zs_last_error();
  }
  EXPECT_NE(zs_step(m, nullptr), ZS_OK);
  EXPECT_TRUE(Contains(zs_last_error(), "cannot be used any more"))
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// Device-side chaining (ZS_DEVICE_CHAIN=1) and a collective that never
// completes: rank 1's gather returns at once (its consumers wait on the
// device, not the host), and rank 0 never issues it. Rank 1 then blocks on
// the device (a copy of the parameters to the host, queued behind the
// all-gather): nothing on the host waits with a timeout there, and the
// communicator's watchdog ends it after collective_timeout_s by aborting
// the communicator, so the copy returns, the next call fails naming the
// watchdog, and rank 0 is told. Through NCCL's stand-in (a GPU per rank)
// and through the staged communicator (both ranks on one GPU).
void WatchdogEndsACollectiveThatNeverCompletes(int rank, bool staged) {
  setenv("FAKECUDA_DEVICES", staged ? "1" : "8", 1);
  setenv("ZS_DEVICE_CHAIN", "1", 1);
  if (staged) setenv("ZS_DEVICE_COMM", "staged", 1);
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int u = -1, t = -1;
  OneUnitAtStage3(&ctx, &m, &u, &t);
  if (::testing::Test::HasFatalFailure()) return;
  if (rank == 1) {
    const double t0 = MPI_Wtime();
    EXPECT_EQ(zs_unit_gather(m, u), ZS_OK) << zs_last_error();
    const double gather_s = MPI_Wtime() - t0;
    EXPECT_LT(gather_s, 0.5) << "the gather waited on the host";
    void* w = nullptr;
    ASSERT_EQ(zs_tensor_data(m, t, &w), ZS_OK) << zs_last_error();
    std::vector<float> host(64);
    const double t1 = MPI_Wtime();
    (void)cudaMemcpy(host.data(), w, host.size() * sizeof(float),
                     cudaMemcpyDeviceToHost);
    const double blocked_s = MPI_Wtime() - t1;
    std::cout << (staged ? "staged" : "NCCL") << ": the gather returned in "
              << gather_s << " s; the copy behind it was blocked "
              << blocked_s << " s\n";
    EXPECT_GE(gather_s + blocked_s, 0.95);
    EXPECT_LT(blocked_s, 30.0);
    (void)zs_unit_release(m, u);
    EXPECT_NE(zs_step(m, nullptr), ZS_OK);
    const std::string err = zs_last_error();
    std::cout << "the error: " << err << "\n";
    EXPECT_TRUE(Contains(err, "watchdog") &&
                Contains(err, "within collective_timeout_s (1 s)") &&
                Contains(err, "all-gather") &&
                Contains(err, staged ? "staged" : "NCCL")) << err;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_REMOTE) << zs_last_error();
    EXPECT_TRUE(Contains(zs_last_error(), "rank 1 failed") &&
                Contains(zs_last_error(), "watchdog"))
        << zs_last_error();
  }
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

TEST_F(CudaErrorsFakeTest, WatchdogEndsANcclCollectiveThatNeverCompletes) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  WatchdogEndsACollectiveThatNeverCompletes(rank_, false);
}

TEST_F(CudaErrorsFakeTest, WatchdogEndsAStagedCollectiveThatNeverCompletes) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  WatchdogEndsACollectiveThatNeverCompletes(rank_, true);
}

// The watchdog leaves collectives a host waits for to that wait, whose
// timeout counts from the wait: rank 0 prefetches, works 1.3 s on the
// host, then gathers; rank 1 joins 1.6 s after the start. The prefetch's
// all-gather is 1.6 s old when it completes, past the 1 s timeout, but no
// wait lasted 1 s: both ranks' gathers return ZS_OK (as on the host
// device) and the step runs. (Before: the watchdog counted from the issue
// and failed the context while rank 0's gather returned ZS_OK over
// incomplete parameters.) NCCL's stand-in and staged.
void SlowPeerWithinTheTimeoutIsNoFailure(int rank, bool staged) {
  setenv("FAKECUDA_DEVICES", staged ? "1" : "8", 1);
  if (staged) setenv("ZS_DEVICE_COMM", "staged", 1);
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int u = -1, t = -1;
  OneUnitAtStage3(&ctx, &m, &u, &t);
  if (::testing::Test::HasFatalFailure()) return;
  if (rank == 0) {
    EXPECT_EQ(zs_unit_prefetch(m, u), ZS_OK) << zs_last_error();
    usleep(1300 * 1000);
  } else {
    usleep(1600 * 1000);
    EXPECT_EQ(zs_unit_prefetch(m, u), ZS_OK) << zs_last_error();
  }
  EXPECT_EQ(zs_unit_gather(m, u), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_unit_release(m, u), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

TEST_F(CudaErrorsFakeTest, NcclSlowPeerWithinTheTimeoutIsNoFailure) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  SlowPeerWithinTheTimeoutIsNoFailure(rank_, false);
}

TEST_F(CudaErrorsFakeTest, StagedSlowPeerWithinTheTimeoutIsNoFailure) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  SlowPeerWithinTheTimeoutIsNoFailure(rank_, true);
}

// With chaining on, a rank that stops (SIGSTOP) while the other's host is
// blocked on the device behind a chained gather: the heartbeats find it
// after heartbeat_timeout_s (1 s) and the watchdog, listening to them,
// aborts the communicator then, not after collective_timeout_s (60 s);
// the next call fails naming the rank. The stopped rank is continued and
// destroys its context. Staged (NCCL's stand-in takes the same path).
TEST_F(CudaErrorsFakeTest, WatchdogEndsAChainedWaitOnAStoppedRank) {
  if (world_ != 2) GTEST_SKIP() << "written for exactly 2 ranks";
  setenv("FAKECUDA_DEVICES", "1", 1);
  setenv("ZS_DEVICE_COMM", "staged", 1);
  setenv("ZS_DEVICE_CHAIN", "1", 1);
  int pids[2] = {0, 0};
  const int mine = (int)getpid();
  MPI_Allgather(&mine, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int u = -1, t = -1;
  OneUnitAtStage3(&ctx, &m, &u, &t, 60.0, 1.0);
  if (HasFatalFailure()) return;
  if (rank_ == 1) {
    raise(SIGSTOP);  // (continued by rank 0)
  } else {
    const double t0 = MPI_Wtime();
    EXPECT_EQ(zs_unit_gather(m, u), ZS_OK) << zs_last_error();
    void* w = nullptr;
    ASSERT_EQ(zs_tensor_data(m, t, &w), ZS_OK) << zs_last_error();
    std::vector<float> host(64);
    (void)cudaMemcpy(host.data(), w, host.size() * sizeof(float),
                     cudaMemcpyDeviceToHost);
    const double blocked_s = MPI_Wtime() - t0;
    std::cout << "the copy behind the gather was blocked " << blocked_s
              << " s\n";
    EXPECT_GE(blocked_s, 0.9);
    EXPECT_LT(blocked_s, 20.0) << "not the heartbeat: the 60 s timeout";
    kill(pids[1], SIGCONT);
    (void)zs_unit_release(m, u);
    EXPECT_NE(zs_step(m, nullptr), ZS_OK);
    const std::string err = zs_last_error();
    std::cout << "the error: " << err << "\n";
    EXPECT_TRUE(Contains(err, "watchdog") && Contains(err, "rank 1") &&
                Contains(err, "sent no heartbeat")) << err;
  }
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

}  // namespace
