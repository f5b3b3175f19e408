// optim_cuda.cu — the CUDA kernels behind optim_cuda.h. Per-element math
// comes from convert.h and optim_scalars.h (ZS__HD functions shared with
// the CPU reference); compiled with -fmad=false so that no multiply-add is
// contracted and the results are the CPU reference's bits.
#include <cuda_runtime.h>

#include "optim/convert.h"
#include "optim/optim_cuda.h"
#include "optim/optim_scalars.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return b > (size_t)kMaxBlocks ? kMaxBlocks : (int)b;
}

#define ZS_GRID_LOOP(i, n)                                              \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void AdamKernel(zs__adam_scalars s, int adamw, int decay, float* w,
                           const void* g, zs_dtype gdtype, float coef,
                           float* s0, float* s1, void* p16, zs_dtype dtype,
                           size_t n) {
  ZS_GRID_LOOP(i, n) {
    float gi = zs__load(g, gdtype, i);
    if (coef != 1.0f) gi = gi * coef;
    float p = w[i];
    if (adamw) {
      p = p * s.decay; /* param.mul_(1 - lr*wd) */
    } else if (decay) {
      gi = gi + s.weight_decay * p; /* grad.add(param, alpha=wd) */
    }
    const float np = zs__adam_update(p, gi, &s0[i], &s1[i], &s);
    w[i] = np;
    if (p16 != nullptr) zs__store(p16, dtype, i, np);
  }
}

__global__ void SgdKernel(zs__sgd_scalars s, int decay, int use_momentum,
                          int first, int nesterov, float* w, const void* g,
                          zs_dtype gdtype, float coef, float* s0, void* p16,
                          zs_dtype dtype, size_t n) {
  ZS_GRID_LOOP(i, n) {
    float gi = zs__load(g, gdtype, i);
    if (coef != 1.0f) gi = gi * coef;
    const float np = zs__sgd_update(w[i], gi, use_momentum ? &s0[i] : nullptr,
                                    &s, decay, use_momentum, first, nesterov);
    w[i] = np;
    if (p16 != nullptr) zs__store(p16, dtype, i, np);
  }
}

__global__ void SumsqPartial(const void* src, zs_dtype dtype, size_t n,
                             double* partial) {
  __shared__ double acc[kThreads];
  double v = 0.0;
  ZS_GRID_LOOP(i, n) {
    const double x = zs__load(src, dtype, i);
    v += x * x;
  }
  acc[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if ((int)threadIdx.x < stride) acc[threadIdx.x] += acc[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}

__global__ void SumsqFinal(const double* partial, int blocks, double* out) {
  double v = 0.0;
  for (int b = 0; b < blocks; b++) v += partial[b];
  *out = v;
}

__global__ void ConvertKernel(void* dst, zs_dtype dt, const void* src,
                              zs_dtype st, size_t n) {
  ZS_GRID_LOOP(i, n) zs__store(dst, dt, i, zs__load(src, st, i));
}

__global__ void DivAddKernel(void* dst, const void* base, const void* src,
                             float divisor, size_t n, zs_dtype dtype) {
  ZS_GRID_LOOP(i, n) {
    float v = zs__load(src, dtype, i) / divisor;
    if (base != nullptr) v = zs__load(base, dtype, i) + v;
    zs__store(dst, dtype, i, v);
  }
}

__global__ void SumChunksKernel(void* dst, const void* src, int nchunks,
                                size_t chunk, float divisor, zs_dtype dtype) {
  ZS_GRID_LOOP(i, chunk) {
    float v = nchunks > 0 ? zs__load(src, dtype, i) : 0.0f;
    for (int r = 1; r < nchunks; r++)
      v += zs__load(src, dtype, (size_t)r * chunk + i);
    if (divisor != 1.0f) v = v / divisor;
    zs__store(dst, dtype, i, v);
  }
}

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

extern "C" int zs_cuda_optimize(int kind, const zs_adam_hparams* adam,
                                const zs_sgd_hparams* sgd, int64_t step,
                                float* w, const void* g, zs_dtype gdtype,
                                float coef, float* s0, float* s1, void* p16,
                                zs_dtype dtype, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  if (kind == ZS_OPTIM_SGD) {
    const zs__sgd_scalars s = zs__sgd_scalars_make(sgd);
    SgdKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(
        s, sgd->weight_decay != 0.0, sgd->momentum != 0.0, step <= 1,
        sgd->nesterov, w, g, gdtype, coef, s0, p16, dtype, n);
  } else {
    const zs__adam_scalars s = zs__adam_scalars_make(adam, step);
    AdamKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(
        s, kind == ZS_OPTIM_ADAMW, adam->weight_decay != 0.0, w, g, gdtype,
        coef, s0, s1, p16, dtype, n);
  }
  return cudaGetLastError();
}

extern "C" size_t zs_cuda_sumsq_scratch(size_t n) { return (size_t)Blocks(n); }

extern "C" int zs_cuda_sumsq(const void* src, zs_dtype dtype, size_t n,
                             double* partial, double* out, void* stream) {
  const int blocks = Blocks(n);
  SumsqPartial<<<blocks, kThreads, 0, S(stream)>>>(src, dtype, n, partial);
  SumsqFinal<<<1, 1, 0, S(stream)>>>(partial, blocks, out);
  return cudaGetLastError();
}

extern "C" int zs_cuda_convert(void* dst, zs_dtype dst_dtype, const void* src,
                               zs_dtype src_dtype, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(dst, dst_dtype, src,
                                                       src_dtype, n);
  return cudaGetLastError();
}

extern "C" int zs_cuda_div_add(void* dst, const void* base, const void* src,
                               float divisor, size_t n, zs_dtype dtype,
                               void* stream) {
  if (n == 0) return cudaSuccess;
  DivAddKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(dst, base, src, divisor,
                                                      n, dtype);
  return cudaGetLastError();
}

extern "C" int zs_cuda_sum_chunks(void* dst, const void* src, int nchunks,
                                  size_t chunk, float divisor, zs_dtype dtype,
                                  void* stream) {
  if (chunk == 0) return cudaSuccess;
  SumChunksKernel<<<Blocks(chunk), kThreads, 0, S(stream)>>>(
      dst, src, nchunks, chunk, divisor, dtype);
  return cudaGetLastError();
}
