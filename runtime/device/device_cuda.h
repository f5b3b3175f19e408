/*
 * device_cuda.h — the CUDA device backend (device_cuda.c), part of the
 * CUDA plugin (runtime/cuda/), which hands this factory to the library.
 */
#ifndef ZS_RUNTIME_DEVICE_CUDA_H_
#define ZS_RUNTIME_DEVICE_CUDA_H_

#include "runtime/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend for local rank `local_rank` of `local_size` on this
 * node: GPU local_rank (modulo the visible GPUs), a caching allocator, a
 * blocking compute stream (docs/cuda.md). A zs__device_factory.
 * Errors: UNSUPPORTED (no usable GPU, with cudaGetDeviceCount's reason:
 * no driver, no device), DEVICE, OUT_OF_MEMORY. */
zs_status zs__device_cuda_create(zs__accounting* acct, int local_rank,
                                 int local_size, zs__device** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_DEVICE_CUDA_H_ */
