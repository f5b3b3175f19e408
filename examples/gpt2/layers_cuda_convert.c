/*
 * layers_cuda_convert.c: gpt2_cuda_to_fp32 (layers_cuda.h) through
 * ZeroShard's conversion kernel (optim/optim_cuda.h), so the trainer
 * reaches the kernels only through layers_cuda.h.
 */
#include "examples/gpt2/layers_cuda.h"

#include "optim/optim_cuda.h"

int gpt2_cuda_to_fp32(float* dst, const void* src, int src_dtype, size_t n) {
  return zs_cuda_convert(dst, ZS_FLOAT32, src, (zs_dtype)src_dtype, n, NULL) != 0
             ? -1
             : 0;
}
