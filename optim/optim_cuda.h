/*
 * optim_cuda.h — C launchers of the CUDA kernels (optim_cuda.cu): the fused
 * optimizer update, the sum of squares, dtype conversion, and the two
 * reduction helpers of the device backend. Every kernel's per-element math
 * is the inline host+device code of convert.h and optim_scalars.h, the same
 * functions the CPU reference runs, and the kernels are compiled with
 * -fmad=false (no contraction) and IEEE sqrt/division, so on the GPU they
 * produce the CPU reference's bits (tests/gpu/cuda_kernels_test).
 *
 * All pointers are device memory (or managed/mapped memory) unless named
 * host; n counts ELEMENTS. `stream` is a cudaStream_t (NULL: the legacy
 * default stream). Launchers are asynchronous on the stream and return a
 * cudaError_t (0 = cudaSuccess) from the launch; errors of the kernel
 * itself surface at the next synchronization.
 */
#ifndef ZS_OPTIM_OPTIM_CUDA_H_
#define ZS_OPTIM_OPTIM_CUDA_H_

#include <stddef.h>
#include <stdint.h>
#include <zeroshard.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One fused optimizer update of n elements (runtime/device/device.h, zs__opt_args,
 * has the same meaning): g (gdtype) times coef, then Adam/AdamW/SGD on the
 * fp32 values w and the states s0/s1 (NULL when absent), and the rounding
 * of the new w into p16 (dtype) when p16 is not NULL. kind: zs_optimizer_
 * kind; adam/sgd: the hyperparameters of that kind; step >= 1. */
int zs_cuda_optimize(int kind, const zs_adam_hparams* adam,
                     const zs_sgd_hparams* sgd, int64_t step, float* w,
                     const void* g, zs_dtype gdtype, float coef, float* s0,
                     float* s1, void* p16, zs_dtype dtype, size_t n,
                     void* stream);

/* Sum of squares of n elements of src (fp32/bf16/fp16) in double, in a
 * fixed order for a given n (per-block partial sums in partial[0..blocks),
 * then one block adds them in order): the same bits on every run. partial:
 * device scratch of zs_cuda_sumsq_scratch(n) doubles; out: one device
 * double. */
size_t zs_cuda_sumsq_scratch(size_t n);
int zs_cuda_sumsq(const void* src, zs_dtype dtype, size_t n, double* partial,
                  double* out, void* stream);

/* dst[i] = src[i] converted (round to nearest even; convert.h). */
int zs_cuda_convert(void* dst, zs_dtype dst_dtype, const void* src,
                    zs_dtype src_dtype, size_t n, void* stream);

/* dst[i] = (base ? base[i] : 0) + src[i] / divisor (device_ops.div_add). */
int zs_cuda_div_add(void* dst, const void* base, const void* src,
                    float divisor, size_t n, zs_dtype dtype, void* stream);

/* dst[i] = (((src[0][i] + src[1][i]) + ...) / divisor over nchunks chunks
 * of `chunk` elements, summed in fp32 in chunk order and rounded once into
 * dtype (device_ops.sum_chunks; dst must not overlap src). */
int zs_cuda_sum_chunks(void* dst, const void* src, int nchunks, size_t chunk,
                       float divisor, zs_dtype dtype, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* ZS_OPTIM_OPTIM_CUDA_H_ */
