// fakecuda_test.cc — the CPU stand-in for the CUDA runtime (fake_cudart.c)
// catches what it exists to catch: work read before it was waited for,
// device memory touched by the host, streams and events ordered other than
// CUDA orders them, kernels given pageable memory.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "optim/optim_cuda.h"
#include "tests/fakecuda/fakecuda.h"

namespace {

constexpr size_t kN = 4096;

struct Bufs {
  std::vector<char> src = std::vector<char>(kN, 7);
  std::vector<char> dst = std::vector<char>(kN, 0);
  void* dev = nullptr;
  Bufs() { EXPECT_EQ(cudaMalloc(&dev, kN), cudaSuccess); }
  ~Bufs() { cudaFree(dev); }
  bool DstIs(char v) const {
    for (char c : dst)
      if (c != v) return false;
    return true;
  }
};

TEST(FakeCuda, QueuedCopiesRunOnlyWhenWaitedFor) {
  Bufs b;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.dev, b.src.data(), kN, cudaMemcpyDefault, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.dst.data(), b.dev, kN, cudaMemcpyDefault, s),
            cudaSuccess);
  EXPECT_TRUE(b.DstIs(0)) << "read before the stream was waited for";
  EXPECT_EQ(fakecuda_pending(), 2u);
  b.src.assign(kN, 9);  // changing the source before the copy ran
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(b.DstIs(9));
  EXPECT_EQ(fakecuda_pending(), 0u);
  cudaStreamDestroy(s);
}

TEST(FakeCuda, DeviceMemoryIsNotHostMemory) {
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  EXPECT_DEATH(*static_cast<volatile char*>(dev) = 1, "");
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(dev) + 10),
            cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  int x = 0;
  ASSERT_EQ(cudaPointerGetAttributes(&a, &x), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  ASSERT_EQ(cudaHostRegister(&x, sizeof x, cudaHostRegisterMapped), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, &x), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaHostUnregister(&x), cudaSuccess);
  cudaFree(dev);
}

// A blocking stream runs after the legacy stream's earlier work; a
// non-blocking one does not wait for it.
TEST(FakeCuda, BlockingStreamsFollowTheLegacyStreamNonBlockingOnesDoNot) {
  for (unsigned flags : {cudaStreamDefault, cudaStreamNonBlocking}) {
    Bufs b;
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(b.dev, 0, kN, 0), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b.dev, b.src.data(), kN, cudaMemcpyDefault,
                              cudaStreamLegacy), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b.dst.data(), b.dev, kN, cudaMemcpyDefault, s),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (flags == cudaStreamDefault)
      EXPECT_TRUE(b.DstIs(7));
    else
      EXPECT_TRUE(b.DstIs(static_cast<char>(0xA5)))
          << "a non-blocking stream ran after the legacy stream's work";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaStreamDestroy(s);
  }
}

// The legacy stream runs after every blocking stream's earlier work:
// cudaMemcpy to the host sees what another stream queued before it.
TEST(FakeCuda, TheLegacyStreamFollowsBlockingStreams) {
  Bufs b;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.dev, b.src.data(), kN, cudaMemcpyDefault, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.dst.data(), b.dev, kN, cudaMemcpyDefault), cudaSuccess);
  EXPECT_TRUE(b.DstIs(7));
  cudaStreamDestroy(s);
}

TEST(FakeCuda, StreamWaitEventOrdersTwoStreams) {
  for (int wait = 0; wait <= 1; wait++) {
    Bufs b;
    cudaStream_t s1, s2;
    cudaEvent_t ev;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(b.dev, b.src.data(), kN, cudaMemcpyDefault, s1),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ev, s1), cudaSuccess);
    if (wait) {
      ASSERT_EQ(cudaStreamWaitEvent(s2, ev, 0), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(b.dst.data(), b.dev, kN, cudaMemcpyDefault, s2),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
    EXPECT_TRUE(b.DstIs(wait ? 7 : static_cast<char>(0xA5))) << wait;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaEventDestroy(ev);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
  }
}

// As the CUDA runtime: a query of unfinished work is cudaErrorNotReady and
// leaves it as the last error; polling finishes.
TEST(FakeCuda, EventQueryIsNotReadyUntilTheWorkRanAndPollingEnds) {
  Bufs b;
  cudaEvent_t ev;
  ASSERT_EQ(cudaEventCreate(&ev), cudaSuccess);
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(cudaMemcpyAsync(b.dev, b.src.data(), kN, cudaMemcpyDefault, 0),
              cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, 0), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int polls = 1;
  while (cudaEventQuery(ev) == cudaErrorNotReady) polls++;
  EXPECT_GE(polls, 2);
  EXPECT_LE(polls, 5);
  cudaGetLastError();
  cudaEventDestroy(ev);
}

// cudaStreamDestroy returns at once; the stream's queued work still runs
// when something waits for it.
TEST(FakeCuda, DestroyingAStreamDoesNotRunItsWork) {
  Bufs b;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.dst.data(), b.src.data(), kN, cudaMemcpyDefault,
                            s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_TRUE(b.DstIs(0));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(b.DstIs(7));
}

// cudaMemcpy from pageable memory to the device consumes the source before
// it returns, but writes the destination in stream order (CUDA's
// documented behaviour); into host memory it is complete on return.
TEST(FakeCuda, SynchronousCopyToTheDeviceLandsInStreamOrder) {
  Bufs b;
  cudaStream_t nb;
  ASSERT_EQ(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.dev, b.src.data(), kN, cudaMemcpyHostToDevice),
            cudaSuccess);
  b.src.assign(kN, 9);  // consumed already: changes nothing
  // a non-blocking stream is not ordered after the legacy stream's copy
  ASSERT_EQ(cudaMemcpyAsync(b.dst.data(), b.dev, kN, cudaMemcpyDefault, nb),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nb), cudaSuccess);
  EXPECT_TRUE(b.DstIs(static_cast<char>(0xA5)));
  ASSERT_EQ(cudaMemcpy(b.dst.data(), b.dev, kN, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(b.DstIs(7));
  cudaStreamDestroy(nb);
}

TEST(FakeCuda, KernelsReadOnlyDeviceOrRegisteredHostMemory) {
  std::vector<float> f(kN, 1.5f);
  std::vector<uint16_t> h(kN, 0);
  EXPECT_NE(zs_cuda_convert(h.data(), ZS_BFLOAT16, f.data(), ZS_FLOAT32, kN,
                            nullptr),
            cudaSuccess) << "a kernel was given pageable memory";
  ASSERT_EQ(cudaHostRegister(f.data(), kN * 4, 0), cudaSuccess);
  ASSERT_EQ(cudaHostRegister(h.data(), kN * 2, 0), cudaSuccess);
  ASSERT_EQ(zs_cuda_convert(h.data(), ZS_BFLOAT16, f.data(), ZS_FLOAT32, kN,
                            nullptr), cudaSuccess);
  EXPECT_EQ(h[0], 0) << "ran before it was waited for";
  ASSERT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  EXPECT_EQ(h[kN - 1], 0x3FC0);  // 1.5 in bf16
  cudaHostUnregister(f.data());
  cudaHostUnregister(h.data());
}

TEST(FakeCuda, AllocationsBeyondTheMemoryLimitFail) {
  setenv("FAKECUDA_MEM_BYTES", "1048576", 1);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 2 << 20), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  size_t fr = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&fr, &total), cudaSuccess);
  EXPECT_EQ(total, 1048576u);
  EXPECT_EQ(fr, 1048576u - 4096);
  cudaFree(p);
  unsetenv("FAKECUDA_MEM_BYTES");
}

}  // namespace
