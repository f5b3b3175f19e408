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

}  // namespace
