// cuda_test.cc — the CUDA kernels and the CUDA device backend against the
// CPU reference (tools/zs test --gpu; tagged zs_gpu). Without a usable GPU
// every test is skipped with the reason (cudaGetDeviceCount's error).
//
// Exactness: the kernels run the same inline per-element functions as the
// CPU (convert.h, optim_scalars.h), compiled with -fmad=false and IEEE
// division and square root, so the optimizer, conversions and reduction
// helpers must be BITWISE equal to the host backend. The sum of squares
// adds in a tree (per-block partials, then in block order): within 1e-12
// relative of the host's sequential double sum, and bitwise the same from
// run to run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optim/convert.h"
#include "optim/optim_cuda.h"
#include "runtime/device/device.h"
#include "tests/gpu/gpu_available.h"

namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = zstest::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_EQ(zs__accounting_create(&acct_), ZS_OK);
    ASSERT_EQ(zs__device_host_create(acct_, &host_), ZS_OK);
    ASSERT_EQ(zs__device_create(ZS_DEVICE_CUDA, acct_, 0, 1, &gpu_), ZS_OK)
        << zs_last_error();
  }
  void TearDown() override {
    zs__device_destroy(gpu_);
    zs__device_destroy(host_);
    if (acct_ != nullptr) zs__accounting_destroy(acct_);
  }
  template <typename T>
  T* Up(const std::vector<T>& v) {
    void* p = nullptr;
    EXPECT_EQ(gpu_->ops->alloc(gpu_, v.size() * sizeof(T) + 1, &p), ZS_OK);
    EXPECT_EQ(gpu_->ops->copy(gpu_, p, v.data(), v.size() * sizeof(T), nullptr),
              ZS_OK);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Down(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(gpu_->ops->copy(gpu_, v.data(), p, n * sizeof(T), nullptr), ZS_OK);
    return v;
  }
  void Free(void* p) { gpu_->ops->free(gpu_, p); }
  // 40 device-only kernels on the compute stream, dy += dx / 2 each (for
  // 64 Mi elements about 30 GB of traffic, tens of milliseconds).
  void QueueLongWork(float* dy, const float* dx, size_t n) {
    for (int i = 0; i < 40; i++)
      ASSERT_EQ(gpu_->ops->div_add(gpu_, dy, dy, dx, 2.0f, n, ZS_FLOAT32,
                                   nullptr), ZS_OK);
  }
  // The compute stream's work is not done: an event recorded on the legacy
  // stream, done once the compute stream's work is, is not complete yet.
  void ExpectComputeStreamBusy(const char* why) {
    cudaEvent_t ev;
    ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ev, cudaStreamLegacy), cudaSuccess);
    const cudaError_t q = cudaEventQuery(ev);
    (void)cudaGetLastError();
    EXPECT_EQ(q, cudaErrorNotReady) << why;
    cudaEventDestroy(ev);  // CUDA releases it once the device is done
  }
  zs__accounting* acct_ = nullptr;
  zs__device* host_ = nullptr;
  zs__device* gpu_ = nullptr;
};

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint16_t> To16(const std::vector<float>& v, zs_dtype t) {
  std::vector<uint16_t> h(v.size());
  zs_convert(h.data(), t, v.data(), ZS_FLOAT32, v.size());
  return h;
}

template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& a,
                                    const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes";
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << " differs";
  return ::testing::AssertionSuccess();
}

struct OptCase {
  zs_optimizer_kind kind;
  zs_dtype gdtype;  // gradient dtype
  zs_dtype pdtype;  // parameters: fp32 (no p16) or a 16-bit write-out
  float coef;
  double wd;
  double momentum;
  int nesterov;
};

TEST_F(CudaTest, OptimizerKernelEqualsTheHostBackendBitwise) {
  const OptCase cases[] = {
      {ZS_OPTIM_ADAMW, ZS_FLOAT32, ZS_FLOAT32, 1.0f, 0.1, 0, 0},
      {ZS_OPTIM_ADAMW, ZS_BFLOAT16, ZS_BFLOAT16, 1.0f, 0.1, 0, 0},
      {ZS_OPTIM_ADAMW, ZS_FLOAT16, ZS_FLOAT16, 1.0f / 1024, 0.0, 0, 0},
      {ZS_OPTIM_ADAM, ZS_FLOAT32, ZS_FLOAT32, 0.5f, 0.01, 0, 0},
      {ZS_OPTIM_SGD, ZS_FLOAT32, ZS_FLOAT32, 1.0f, 0.0, 0.9, 0},
      {ZS_OPTIM_SGD, ZS_BFLOAT16, ZS_BFLOAT16, 0.25f, 0.01, 0.9, 1},
  };
  const size_t n = 100003;  // odd: partial blocks
  for (const OptCase& c : cases) {
    const std::string what = std::to_string((int)c.kind) + "/" +
                             zs_dtype_name(c.gdtype) + "/" +
                             zs_dtype_name(c.pdtype);
    std::vector<float> w = Random(n, 1, 1.f), g = Random(n, 2, 0.1f);
    std::vector<float> s0(n, 0.f), s1(n, 0.f);
    std::vector<uint16_t> g16 = To16(g, c.gdtype == ZS_FLOAT32 ? ZS_BFLOAT16 : c.gdtype);
    std::vector<uint16_t> p16(n, 0);
    zs__opt_args a;
    std::memset(&a, 0, sizeof a);
    a.kind = c.kind;
    a.adam = {1e-3, 0.9, 0.999, 1e-8, c.wd};
    a.sgd = {0.1, c.momentum, 0.0, c.wd, c.nesterov};
    a.gdtype = c.gdtype;
    a.coef = c.coef;
    a.dtype = c.pdtype;
    a.n = n;
    // Three steps on each backend from the same state.
    std::vector<float> hw = w, hs0 = s0, hs1 = s1;
    std::vector<uint16_t> hp16 = p16;
    float* dw = Up(w);
    float* ds0 = Up(s0);
    float* ds1 = Up(s1);
    uint16_t* dp16 = Up(p16);
    void* dg = c.gdtype == ZS_FLOAT32 ? (void*)Up(g) : (void*)Up(g16);
    for (int step = 1; step <= 3; step++) {
      a.step = step;
      zs__opt_args h = a;
      h.w = hw.data();
      h.g = c.gdtype == ZS_FLOAT32 ? (const void*)g.data() : g16.data();
      h.s[0] = hs0.data();
      h.s[1] = c.kind == ZS_OPTIM_SGD ? nullptr : hs1.data();
      h.p16 = c.pdtype == ZS_FLOAT32 ? nullptr : hp16.data();
      ASSERT_EQ(host_->ops->optimize(host_, &h, nullptr), ZS_OK) << what;
      zs__opt_args d = a;
      d.w = dw;
      d.g = dg;
      d.s[0] = ds0;
      d.s[1] = c.kind == ZS_OPTIM_SGD ? nullptr : ds1;
      d.p16 = c.pdtype == ZS_FLOAT32 ? nullptr : dp16;
      ASSERT_EQ(gpu_->ops->optimize(gpu_, &d, nullptr), ZS_OK)
          << what << ": " << zs_last_error();
    }
    EXPECT_TRUE(SameBits(Down(dw, n), hw)) << what << " params";
    EXPECT_TRUE(SameBits(Down(ds0, n), hs0)) << what << " state 0";
    if (c.kind != ZS_OPTIM_SGD) {
      EXPECT_TRUE(SameBits(Down(ds1, n), hs1)) << what << " state 1";
    }
    if (c.pdtype != ZS_FLOAT32) {
      EXPECT_TRUE(SameBits(Down(dp16, n), hp16)) << what << " 16-bit params";
    }
    Free(dw);
    Free(ds0);
    Free(ds1);
    Free(dp16);
    Free(dg);
  }
}

TEST_F(CudaTest, ConversionsAreBitwiseIncludingSpecialValues) {
  std::vector<float> v = Random(70001, 3, 100.f);
  const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 65504.f,
                            65520.f, 1e-8f, 5.96e-8f, 1.0009765625f,
                            3.0e38f, 1.17549435e-38f, 1e-45f};
  for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) v[i] = specials[i];
  const zs_dtype types[] = {ZS_FLOAT32, ZS_BFLOAT16, ZS_FLOAT16};
  for (zs_dtype from : types) {
    for (zs_dtype to : types) {
      const size_t n = v.size();
      std::vector<char> src(n * 4), want(n * 4);
      zs_convert(src.data(), from, v.data(), ZS_FLOAT32, n);
      zs_convert(want.data(), to, src.data(), from, n);
      char* ds = Up(src);
      std::vector<char> zero(n * 4, 0);
      char* dd = Up(zero);
      ASSERT_EQ(gpu_->ops->convert(gpu_, dd, to, ds, from, n, nullptr), ZS_OK);
      std::vector<char> got = Down(dd, n * zs_dtype_size(to));
      want.resize(n * zs_dtype_size(to));
      EXPECT_TRUE(SameBits(got, want)) << zs_dtype_name(from) << " -> "
                                       << zs_dtype_name(to);
      Free(ds);
      Free(dd);
    }
  }
}

TEST_F(CudaTest, SumOfSquaresIsDeterministicAndCloseToTheHost) {
  std::vector<float> v = Random(1234567, 4, 1.f);
  float* d = Up(v);
  double host = 0, a = 0, b = 0;
  ASSERT_EQ(host_->ops->sumsq(host_, v.data(), ZS_FLOAT32, v.size(), &host), ZS_OK);
  ASSERT_EQ(gpu_->ops->sumsq(gpu_, d, ZS_FLOAT32, v.size(), &a), ZS_OK);
  ASSERT_EQ(gpu_->ops->sumsq(gpu_, d, ZS_FLOAT32, v.size(), &b), ZS_OK);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "run to run";
  EXPECT_NEAR(a, host, 1e-12 * host);
  v[17] = NAN;
  float* dn = Up(v);
  double c = 0;
  ASSERT_EQ(gpu_->ops->sumsq(gpu_, dn, ZS_FLOAT32, v.size(), &c), ZS_OK);
  EXPECT_TRUE(std::isnan(c)) << "overflow detection needs NaN to propagate";
  Free(d);
  Free(dn);
}

TEST_F(CudaTest, ReductionHelpersEqualTheHostBackendBitwise) {
  const int W = 3;
  const size_t chunk = 4099;
  for (zs_dtype t : {ZS_FLOAT32, ZS_BFLOAT16, ZS_FLOAT16}) {
    std::vector<float> f = Random(W * chunk, 5, 3.f);
    std::vector<char> src(W * chunk * 4);
    zs_convert(src.data(), t, f.data(), ZS_FLOAT32, f.size());
    const size_t e = zs_dtype_size(t);
    std::vector<char> want(chunk * e), base(chunk * e);
    zs_convert(base.data(), t, Random(chunk, 6, 1.f).data(), ZS_FLOAT32, chunk);
    ASSERT_EQ(host_->ops->sum_chunks(host_, want.data(), src.data(), W, chunk,
                                     (float)W, t, nullptr), ZS_OK);
    char* ds = Up(src);
    std::vector<char> zero(chunk * e, 0);
    char* dd = Up(zero);
    ASSERT_EQ(gpu_->ops->sum_chunks(gpu_, dd, ds, W, chunk, (float)W, t, nullptr),
              ZS_OK);
    EXPECT_TRUE(SameBits(Down(dd, chunk * e), want)) << zs_dtype_name(t);
    std::vector<char> want2(chunk * e);
    ASSERT_EQ(host_->ops->div_add(host_, want2.data(), base.data(), src.data(),
                                  4.0f, chunk, t, nullptr), ZS_OK);
    char* db = Up(base);
    ASSERT_EQ(gpu_->ops->div_add(gpu_, dd, db, ds, 4.0f, chunk, t, nullptr), ZS_OK);
    EXPECT_TRUE(SameBits(Down(dd, chunk * e), want2)) << zs_dtype_name(t);
    Free(ds);
    Free(dd);
    Free(db);
  }
}

// The NULL stream's contract (device.h): operations on device memory only
// are queued without the host waiting; one that reads or writes host
// memory (pageable, or registered and written by a kernel through its
// mapped pointer) is complete when it returns, after everything queued
// before it.
TEST_F(CudaTest, DeviceOnlyOperationsQueueAndHostOnesCompleteOnReturn) {
  const size_t n = (size_t)64 << 20;  // 256 MB per fp32 buffer
  std::vector<float> x = Random(4096, 11, 1.f);
  x.resize(n, 0.5f);
  float* dx = Up(x);
  float* dy = Up(std::vector<float>(n, 0.f));
  ASSERT_NO_FATAL_FAILURE(QueueLongWork(dy, dx, n));
  ASSERT_NO_FATAL_FAILURE(ExpectComputeStreamBusy(
      "the host waited for device-only kernels on the NULL stream"));
  std::vector<float> want(n, 0.f);
  for (int i = 0; i < 40; i++)
    ASSERT_EQ(host_->ops->div_add(host_, want.data(), want.data(), x.data(),
                                  2.0f, n, ZS_FLOAT32, nullptr), ZS_OK);
  // into pageable memory, read at once: after the 40 kernels
  EXPECT_TRUE(SameBits(Down(dy, n), want));
  // a kernel writing registered host memory through its mapped pointer
  std::vector<uint16_t> h16(n, 0), want16(n);
  ASSERT_EQ(gpu_->ops->host_register(gpu_, h16.data(), n * 2), ZS_OK);
  ASSERT_EQ(gpu_->ops->convert(gpu_, h16.data(), ZS_BFLOAT16, dy, ZS_FLOAT32,
                               n, nullptr), ZS_OK);
  zs_convert(want16.data(), ZS_BFLOAT16, want.data(), ZS_FLOAT32, n);
  EXPECT_TRUE(SameBits(h16, want16));
  gpu_->ops->host_unregister(gpu_, h16.data());
  Free(dx);
  Free(dy);
}

// upload (an offloaded shard's device copy for its all-gather) queues the
// copy behind the compute stream's work and returns without waiting for
// it; whatever is ordered after it reads the uploaded bytes.
TEST_F(CudaTest, UploadQueuesBehindTheComputeStreamWithoutWaiting) {
  const size_t n = (size_t)64 << 20;  // 256 MB per fp32 buffer
  std::vector<float> x = Random(4096, 12, 1.f);
  x.resize(n, 0.25f);
  float* dx = Up(x);
  float* dy = Up(std::vector<float>(n, 0.f));
  float* dz = Up(std::vector<float>(n, 0.f));
  std::vector<float> src = Random(n, 13, 1.f);
  ASSERT_EQ(gpu_->ops->host_register(gpu_, src.data(), n * 4), ZS_OK);
  ASSERT_NO_FATAL_FAILURE(QueueLongWork(dy, dx, n));
  ASSERT_EQ(gpu_->ops->upload(gpu_, dz, src.data(), n * 4, nullptr), ZS_OK)
      << zs_last_error();
  ASSERT_NO_FATAL_FAILURE(ExpectComputeStreamBusy("the host waited for an upload"));
  // a device-only kernel after it on the compute stream reads the upload
  ASSERT_EQ(gpu_->ops->div_add(gpu_, dz, dz, dz, 1.0f, n, ZS_FLOAT32, nullptr),
            ZS_OK);
  std::vector<float> want = src;
  ASSERT_EQ(host_->ops->div_add(host_, want.data(), want.data(), want.data(),
                                1.0f, n, ZS_FLOAT32, nullptr), ZS_OK);
  EXPECT_TRUE(SameBits(Down(dz, n), want));
  gpu_->ops->host_unregister(gpu_, src.data());
  Free(dx);
  Free(dy);
  Free(dz);
}

TEST_F(CudaTest, CachingAllocatorReusesBlocksAndReportsOutOfMemory) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(gpu_->ops->alloc(gpu_, 3 << 20, &a), ZS_OK);
  gpu_->ops->free(gpu_, a);
  ASSERT_EQ(gpu_->ops->alloc(gpu_, 3 << 20, &b), ZS_OK);
  EXPECT_EQ(a, b) << "a freed block of the same size class is reused";
  gpu_->ops->free(gpu_, b);
  void* huge = nullptr;
  EXPECT_EQ(gpu_->ops->alloc(gpu_, (size_t)1 << 52, &huge), ZS_ERR_OUT_OF_MEMORY);
  const std::string err = zs_last_error();
  EXPECT_NE(err.find("CUDA device 0"), std::string::npos) << err;
  EXPECT_NE(err.find("free"), std::string::npos) << err;
}

// More ranks on the node than GPUs this rank sees: the rank takes local
// rank modulo the GPUs it sees (a launcher that gives each rank its own
// GPU through CUDA_VISIBLE_DEVICES shows one). Ranks that then share a GPU
// are refused by the NCCL communicator's bus-id check, which needs two
// processes (see docs/cuda.md).
TEST_F(CudaTest, LocalRankBeyondTheVisibleGpusWrapsAround) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(zs__cuda_device_index(count, count + 1, count), 0);
  EXPECT_EQ(zs__cuda_device_index(1, 2, 2), 1);
  zs__device* d = nullptr;
  ASSERT_EQ(zs__device_create(ZS_DEVICE_CUDA, acct_, count, count + 1, &d),
            ZS_OK) << zs_last_error();
  int dev = -1;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(dev, 0);
  zs__device_destroy(d);
}

}  // namespace
