// alloc_faults.h — one rank out of device memory on demand, for the tests
// of what the other ranks then do (tests/runtime/engine_test on the host,
// tests/fakecuda/cuda_errors_fake_test on the CUDA backend): hooks for
// zs__dev_alloc_fault (runtime/device/device.h) and the pass they interrupt.
#ifndef ZS_TESTS_TESTING_ALLOC_FAULTS_H_
#define ZS_TESTS_TESTING_ALLOC_FAULTS_H_

#include <zeroshard.h>

#include <string>

#include "runtime/device/device.h"

namespace zstest {

// Fails the stage-3 all-gather buffer of unit "b".
inline zs_status FailGatherOfB(zs_mem_category category, size_t,
                               const char* label) {
  if (category == ZS_MEM_PARAMS_GATHERED && std::string(label) == "b")
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "test: no memory for '%s'", label);
  return ZS_OK;
}

// Fails the gradient (reduction) buffer of unit "b".
inline zs_status FailGradsOfB(zs_mem_category category, size_t,
                              const char* label) {
  if (category == ZS_MEM_COMM_BUFFERS && std::string(label) == "b")
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "test: no memory for '%s'", label);
  return ZS_OK;
}

// One training pass over units u[0..n): gather, gradients, release, then
// the step; the first error.
inline zs_status GatherGradReleaseStep(zs_model* m, const int* u, int n) {
  zs_status st = ZS_OK;
  for (int k = 0; k < n && st == ZS_OK; k++) {
    st = zs_unit_gather(m, u[k]);
    if (st == ZS_OK) st = zs_unit_grad_acquire(m, u[k]);
    if (st == ZS_OK) st = zs_unit_grad_release(m, u[k]);
    if (st == ZS_OK) st = zs_unit_release(m, u[k]);
  }
  return st == ZS_OK ? zs_step(m, nullptr) : st;
}

}  // namespace zstest

#endif  // ZS_TESTS_TESTING_ALLOC_FAULTS_H_
