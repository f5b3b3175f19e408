// gpu_available.h — whether the GPU tests can run here, and why not.
#ifndef ZS_TESTS_GPU_GPU_AVAILABLE_H_
#define ZS_TESTS_GPU_GPU_AVAILABLE_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace zstest {

// "" when a CUDA device is usable; else the skip message with the reason.
// A machine with an NVIDIA GPU (its device nodes exist) where CUDA is not
// usable (say, a driver older than the CUDA 13 runtime needs) is a test
// FAILURE, not a skip: the GPU checks must not pass vacuously there.
inline std::string NoGpuReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();
  const std::string why =
      std::string("no usable CUDA device (cudaGetDeviceCount: ") +
      (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")";
  if (access("/dev/nvidia0", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0)
    ADD_FAILURE() << "an NVIDIA GPU is present (/dev/nvidia*) but " << why;
  return why + ": GPU tests skipped";
}

}  // namespace zstest

#endif  // ZS_TESTS_GPU_GPU_AVAILABLE_H_
