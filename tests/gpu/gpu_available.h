// gpu_available.h — whether the GPU tests can run here, and why not.
#ifndef ZS_TESTS_GPU_GPU_AVAILABLE_H_
#define ZS_TESTS_GPU_GPU_AVAILABLE_H_

#include <cuda_runtime.h>

#include <string>

namespace zstest {

// "" when a CUDA device is usable; else the skip message with the reason.
inline std::string NoGpuReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();
  return std::string("no usable CUDA device (cudaGetDeviceCount: ") +
         (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
         "): GPU tests skipped";
}

}  // namespace zstest

#endif  // ZS_TESTS_GPU_GPU_AVAILABLE_H_
