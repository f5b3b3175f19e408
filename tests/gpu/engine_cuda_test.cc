// engine_cuda_test.cc — the engine on the CUDA backend (device buffers, the
// kernels, NCCL) trains the parity models exactly as on the host backend
// (tools/zs test --gpu; one rank: NCCL refuses two ranks on one GPU).
// Skipped with the reason when no GPU is usable.
//
// Exactness: at one rank every collective is a copy and every kernel
// computes the host's bits (tests/gpu/cuda_test), so with the same data the
// CUDA run must be BITWISE the host run at every stage, for fp32 and bf16
// parameters (no clipping: the norm is the one value summed in another
// order), with and without CPU or NVMe offload of the optimizer (and at
// stage 3 with the parameter shards in host memory or on NVMe too).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/comm/comm.h"
#include "runtime/context/context.h"
#include "tests/gpu/gpu_available.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

void CudaCopy(void* dst, const void* src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) ADD_FAILURE() << "cudaMemcpy: " << cudaGetErrorString(e);
}

class EngineCudaTest : public ZsMpiTest {
 protected:
  void SetUp() override {
    ZsMpiTest::SetUp();
    const std::string why = zstest::NoGpuReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// A collective's completion is polled with cudaEventQuery, which leaves
// cudaErrorNotReady as the thread's last CUDA error while it is not done.
// That must not reach the next launch: the engine's kernels and the model
// code check cudaGetLastError after every launch, and read it as "device
// not ready" (every reduce-scatter's sum and the first GPT-2 kernel after
// a gather would fail).
TEST_F(EngineCudaTest, WaitingForACollectiveLeavesNoCudaError) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_local(&cfg, &ctx), ZS_OK) << zs_last_error();
  zs__device* dev = ctx->device;
  const size_t n = (size_t)64 << 20; /* 256 MiB of fp32 */
  void *a = nullptr, *b = nullptr, *big = nullptr;
  ASSERT_EQ(dev->ops->alloc(dev, n * 4, &a), ZS_OK);
  ASSERT_EQ(dev->ops->alloc(dev, n * 4, &b), ZS_OK);
  ASSERT_EQ(cudaMalloc(&big, (size_t)1 << 30), cudaSuccess);
  for (int round = 0; round < 3; round++) {
    // work on the legacy stream first: the collective waits for it, so
    // the first polls see it not ready
    ASSERT_EQ(cudaMemsetAsync(big, round, (size_t)1 << 30, 0), cudaSuccess);
    zs__coll* op = nullptr;
    ASSERT_EQ(zs__comm_iall_gather(ctx->comm, zs__tag(ZS__P_CHECK, -1, "t"), a,
                                   b, n, ZS_FLOAT32, &op), ZS_OK)
        << zs_last_error();
    ASSERT_EQ(zs__coll_wait(ctx->comm, op), ZS_OK) << zs_last_error();
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess)
        << cudaGetErrorString(cudaPeekAtLastError());
    // the engine's next kernel, as after a reduce-scatter
    EXPECT_EQ(dev->ops->convert(dev, b, ZS_BFLOAT16, a, ZS_FLOAT32, n, nullptr),
              ZS_OK) << zs_last_error();
  }
  cudaFree(big);
  dev->ops->free(dev, a);
  dev->ops->free(dev, b);
  zs_context_destroy(ctx);
}

// zs_memory_release_cached gives the device back the blocks the caching
// allocator keeps (a training step's gathered parameters, reduction
// buffers, ...), so the model code's own cudaMalloc can use them.
TEST_F(EngineCudaTest, ReleaseCachedGivesFreedBlocksBackToTheDevice) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_local(&cfg, &ctx), ZS_OK) << zs_last_error();
  zs__device* dev = ctx->device;
  const size_t n = (size_t)64 << 20;  // a multiple of the 2 MiB size class
  void* a = nullptr;
  ASSERT_EQ(dev->ops->alloc(dev, n, &a), ZS_OK);
  size_t free_before = 0, free_after = 0, total = 0;
  dev->ops->free(dev, a);  // cached: still the runtime's
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  size_t released = 0;
  ASSERT_EQ(zs_memory_release_cached(ctx, &released), ZS_OK) << zs_last_error();
  EXPECT_GE(released, n);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after, free_before + n);
  ASSERT_EQ(zs_memory_release_cached(ctx, &released), ZS_OK);
  EXPECT_EQ(released, 0u);  // nothing left
  EXPECT_EQ(zs_memory_release_cached(nullptr, &released), ZS_ERR_INVALID_ARGUMENT);
  zs_context_destroy(ctx);
}

TEST_F(EngineCudaTest, EveryStageTrainsBitwiseAsOnTheHost) {
  struct Case {
    const char* name;
    std::unique_ptr<Model> (*make)();
    zs_dtype dtype;
  };
  const Case cases[] = {{"mlp fp32", MakeMlp, ZS_FLOAT32},
                        {"transformer fp32", MakeTransformer, ZS_FLOAT32},
                        {"transformer bf16", MakeTransformer, ZS_BFLOAT16}};
  for (const Case& c : cases) {
    for (int stage = 0; stage <= 3; stage++) {
      const std::string what = std::string(c.name) + " stage " +
                               std::to_string(stage);
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 5;
      cfg.param_dtype = c.dtype;
      auto hm = c.make();
      TrainResult host = TrainSharded(*hm, cfg);
      ASSERT_EQ(host.status, ZS_OK) << what << ": " << host.error;
      cfg.device = ZS_DEVICE_CUDA;
      cfg.copy = CudaCopy;
      // on the GPU alone, and with CPU offload of the optimizer (master
      // weights and states in page-locked host memory, the step on the
      // CPU workers, staged copies of gradients and parameters)
      // (2: NVMe offload, the states in a swap file under TEST_TMPDIR,
      // each unit's span staged through the host; at stage 3, CPU offload
      // with the parameter shards 3: in page-locked host memory too, 4: on
      // NVMe, each all-gather reading a device copy of the shard)
      const char* t = std::getenv("TEST_TMPDIR");
      const std::string dir = std::string(t != nullptr ? t : "/tmp");
      for (int offload = 0; offload <= 4; offload++) {
        if (offload >= 3 && stage != 3) continue;
        const std::string w = what + (offload == 4   ? " +parameters on NVMe"
                                      : offload == 3 ? " +CPU offload of parameters"
                                      : offload == 2 ? " +NVMe offload"
                                      : offload == 1 ? " +CPU offload"
                                                     : "");
        cfg.offload = offload >= 3 ? 1 : offload;
        cfg.offload_param = offload >= 3 ? offload - 2 : 0;
        cfg.nvme.path = dir.c_str();
        cfg.nvme.sub_group_size = 1000;
        auto gm = c.make();
        TrainResult gpu = TrainSharded(*gm, cfg);
        ASSERT_EQ(gpu.status, ZS_OK) << w << ": " << gpu.error;
        ExpectSameTraining(gpu, host, *hm, w);
        // Nothing left on the device after the model is gone.
        EXPECT_EQ(gpu.memory_after_destroy.current[ZS_MEM_PARAMS], 0u) << w;
        if (offload == 1) {
          EXPECT_EQ(gpu.offload.steps_on_workers,
                    (uint64_t)cfg.steps * hm->units.size()) << w;
        }
      }
    }
  }
}

// The memory estimator for a GPU (zs_config.device = CUDA)
// against the run, for every way of offloading: the model states, the host
// memory of offload (master weights and optimizer states, and the
// page-locked staging: two slots of the largest span's gradients and
// parameters) and NVMe's pinned pool, each to the byte. The estimate for
// the host backend misses the staging: less than the run. With the
// parameter shards offloaded, NCCL reads device copies of the gathered
// units' shards: the comm-buffer estimate (bucket temporaries,
// accumulation buffers and those copies, each at its own peak) bounds the
// run's peak. (On the stand-in, where a collective completes only when
// waited for, that bound fails if the engine starts a unit's reduction
// before finishing the oldest of ZS__MAX_REDUCING: tried.)
TEST_F(EngineCudaTest, MemoryEstimateOfOffloadMatchesTheRun) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp");
  for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16}) {
    for (int stage = 0; stage <= 3; stage++) {
      for (int offload = 1; offload <= 4; offload++) {
        if (offload >= 3 && stage != 3) continue;
        const std::string what =
            std::string(zs_dtype_name(dtype)) + " stage " + std::to_string(stage) +
            (offload == 4   ? " parameters on NVMe"
             : offload == 3 ? " CPU offload of parameters"
             : offload == 2 ? " NVMe offload"
                            : " CPU offload");
        TrainConfig cfg;
        cfg.stage = stage;
        cfg.steps = 2;
        cfg.param_dtype = dtype;
        cfg.device = ZS_DEVICE_CUDA;
        cfg.copy = CudaCopy;
        cfg.offload = offload >= 3 ? 1 : offload;
        cfg.offload_param = offload >= 3 ? offload - 2 : 0;
        cfg.nvme.path = dir.c_str();
        cfg.nvme.sub_group_size = 1000;
        auto m = MakeTransformer();
        TrainResult r = TrainSharded(*m, cfg);
        ASSERT_EQ(r.status, ZS_OK) << what << ": " << r.error;

        zs_config ec = ZS_CONFIG_INIT;
        ec.stage = stage;
        ec.prefetch_depth = cfg.prefetch_depth;
        ec.offload_optimizer.device = (zs_offload_device)cfg.offload;
        ec.offload_param = (zs_offload_device)cfg.offload_param;
        ec.nvme = cfg.nvme;
        ec.device = ZS_DEVICE_CUDA;
        zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
        in.ranks = world;
        in.param_dtype = dtype;
        const std::string desc = DescribeModel(*m);
        zs_memory_estimate e{}, on_host{};
        ASSERT_EQ(zs_estimate_from_model(desc.c_str(), &ec, &in, &e), ZS_OK)
            << what << ": " << zs_last_error();
        // the peaks of training (the harness's reads afterwards stage
        // shards through the device too)
        ASSERT_EQ(r.step_memory.size(), (size_t)cfg.steps) << what;
        const zs_memory_stats& got = r.step_memory.back();
        EXPECT_EQ(e.model_state_bytes, got.model_state_bytes) << what;
        EXPECT_EQ(e.bytes[ZS_MEM_OFFLOAD_HOST], got.peak[ZS_MEM_OFFLOAD_HOST]) << what;
        EXPECT_GT(got.peak[ZS_MEM_OFFLOAD_HOST], 0u) << what;
        EXPECT_EQ(e.bytes[ZS_MEM_NVME_STAGING], got.peak[ZS_MEM_NVME_STAGING]) << what;
        EXPECT_LE(got.peak[ZS_MEM_COMM_BUFFERS], e.bytes[ZS_MEM_COMM_BUFFERS]) << what;
        ec.device = ZS_DEVICE_HOST;
        ASSERT_EQ(zs_estimate_from_model(desc.c_str(), &ec, &in, &on_host), ZS_OK);
        EXPECT_LT(on_host.bytes[ZS_MEM_OFFLOAD_HOST], got.peak[ZS_MEM_OFFLOAD_HOST])
            << what;
        if (cfg.offload_param) {
          EXPECT_LT(on_host.bytes[ZS_MEM_COMM_BUFFERS], e.bytes[ZS_MEM_COMM_BUFFERS])
              << what;
        }
      }
    }
  }
}

}  // namespace

// Stacked kinds are host memory only (their views are memfd mappings the
// engine copies slices into): a CUDA context refuses them at registration,
// saying what to do instead, and finalize then fails naming it.
TEST_F(EngineCudaTest, StackedKindsAreRefusedWithAClearMessage) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.device = ZS_DEVICE_CUDA;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_local(&cfg, &ctx), ZS_OK) << zs_last_error();
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int unit = -1, kind = -1;
  ASSERT_EQ(zs_model_add_unit(m, "block", &unit), ZS_OK);
  const int64_t shape[2] = {2, 8};
  const int owners[2] = {unit, unit};
  EXPECT_EQ(zs_model_add_stacked(m, "qkvw", 2, shape, 8, ZS_FLOAT32, 0, owners,
                                 &kind),
            ZS_ERR_UNSUPPORTED);
  const std::string err = zs_last_error();
  EXPECT_NE(err.find("'qkvw': stacked kinds are host memory only"),
            std::string::npos) << err;
  EXPECT_NE(err.find("zs_model_add_tensor"), std::string::npos) << err;
  EXPECT_NE(zs_model_finalize(m), ZS_OK);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// Lion (Chen et al. 2023) as a user's optimizer: float math on the
// callback's spans.
zs_status LionForCuda(void*, const zs_optim_span* s) {
  const float lr = (float)s->lr, wd = (float)s->weight_decay;
  const float b1 = (float)s->beta1, b2 = (float)s->beta2;
  for (size_t i = 0; i < s->n; i++) {
    const float g = s->grad[i], c = b1 * s->state[0][i] + (1.0f - b1) * g;
    s->param[i] -= lr * ((c > 0.0f) - (c < 0.0f) + wd * s->param[i]);
    s->state[0][i] = b2 * s->state[0][i] + (1.0f - b2) * g;
  }
  return ZS_OK;
}

// A user's optimizer is a host callback: with the optimizer offloaded (the
// step in host memory) a CUDA run trains bitwise as on the host at every
// stage; with the step on the device, finalize refuses it, saying to
// offload.
TEST_F(EngineCudaTest, CallbackOptimizerRunsWhenTheStepIsOnTheHost) {
  for (int stage = 0; stage <= 3; stage++) {
    const std::string what = "stage " + std::to_string(stage);
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 4;
    cfg.optim_fn = LionForCuda;
    cfg.optim_nstates = 1;
    cfg.optim_name = "lion";
    cfg.offload = 1;
    auto hm = MakeTransformer();
    TrainResult host = TrainSharded(*hm, cfg);
    ASSERT_EQ(host.status, ZS_OK) << what << ": " << host.error;
    cfg.device = ZS_DEVICE_CUDA;
    cfg.copy = CudaCopy;
    auto gm = MakeTransformer();
    TrainResult gpu = TrainSharded(*gm, cfg);
    ASSERT_EQ(gpu.status, ZS_OK) << what << ": " << gpu.error;
    ExpectSameTraining(gpu, host, *hm, what + " CUDA with CPU offload");
    cfg.offload = 0;
    auto dm = MakeTransformer();
    TrainResult refused = TrainSharded(*dm, cfg);
    EXPECT_EQ(refused.status, ZS_ERR_UNSUPPORTED) << what;
    EXPECT_NE(refused.error.find("optimizer 'lion' is a host callback"),
              std::string::npos) << refused.error;
    EXPECT_NE(refused.error.find("offload_optimizer"), std::string::npos)
        << refused.error;
  }
}
