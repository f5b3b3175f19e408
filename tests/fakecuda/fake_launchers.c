/*
 * fake_launchers.c — the C launchers of optim/optim_cuda.h for the fake
 * CUDA runtime (fakecuda.h): each queues, on its stream, the host
 * backend's implementation of the same operation (device_host.c), which
 * the real kernels equal bitwise (tests/gpu/cuda_test), except the sum of
 * squares, which the host adds in index order. Operands are checked as a
 * GPU would need them (device or registered host memory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_cuda.h"
#include "runtime/device/device.h"
#include "tests/fakecuda/fakecuda.h"

static zs__device* fk_host(void) {
  static zs__device* host;
  static zs__accounting* acct;
  if (host == NULL) {
    if (zs__accounting_create(&acct) != ZS_OK ||
        zs__device_host_create(acct, &host) != ZS_OK) {
      fprintf(stderr, "fake CUDA: cannot create the host backend\n");
      abort();
    }
  }
  return host;
}

static void fk_check(zs_status st, const char* what) {
  if (st != ZS_OK) {
    /* a kernel cannot fail on a GPU once its arguments were accepted */
    fprintf(stderr, "fake CUDA: %s failed on the host: %s\n", what,
            zs_last_error());
    abort();
  }
}

static void* fk_alloc_arg(size_t bytes) {
  void* p = calloc(1, bytes);
  if (p == NULL) abort();
  return p;
}

/* Queues run(k) on stream: unless an operand was refused (!ok: the launch
 * fails as on a GPU) or there is nothing to do (n == 0); k is freed then. */
static int fk_launch(void* k, int ok, size_t n, void* stream,
                     const char* name, void (*run)(void*)) {
  if (!ok || n == 0) {
    free(k);
    return ok ? cudaSuccess : cudaErrorInvalidValue;
  }
  return fakecuda_launch((cudaStream_t)stream, name, run, k);
}

/* ---- the optimizer ----------------------------------------------------------- */

typedef struct {
  zs__opt_args a;
} fk_opt;

static void fk_opt_run(void* p) {
  fk_opt* k = (fk_opt*)p;
  zs__device* h = fk_host();
  fk_check(h->ops->optimize(h, &k->a, NULL), "optimizer kernel");
}

int zs_cuda_optimize(int kind, const zs_adam_hparams* adam,
                     const zs_sgd_hparams* sgd, int64_t step, float* w,
                     const void* g, zs_dtype gdtype, float coef, float* s0,
                     float* s1, void* p16, zs_dtype dtype, size_t n,
                     void* stream) {
  if (n == 0) return cudaSuccess;
  int ok = 1;
  fk_opt* k = (fk_opt*)fk_alloc_arg(sizeof *k);
  const char* name = "optimize";
  k->a.kind = (zs_optimizer_kind)kind;
  if (adam != NULL) k->a.adam = *adam;
  if (sgd != NULL) k->a.sgd = *sgd;
  k->a.step = step;
  k->a.w = (float*)fakecuda_kernel_ptr(w, n * 4, name, &ok);
  k->a.g = fakecuda_kernel_ptr(g, n * zs_dtype_size(gdtype), name, &ok);
  k->a.gdtype = gdtype;
  k->a.coef = coef;
  k->a.s[0] = (float*)fakecuda_kernel_ptr(s0, n * 4, name, &ok);
  /* SGD never reads s1 */
  k->a.s[1] = kind == ZS_OPTIM_SGD
                ? NULL
                : (float*)fakecuda_kernel_ptr(s1, n * 4, name, &ok);
  k->a.p16 = fakecuda_kernel_ptr(p16, n * zs_dtype_size(dtype), name, &ok);
  k->a.dtype = dtype;
  k->a.n = n;
  return fk_launch(k, ok, n, stream, name, fk_opt_run);
}

/* ---- sum of squares ------------------------------------------------------------ */

typedef struct {
  const void* src;
  zs_dtype dtype;
  size_t n;
  double* out;
} fk_sumsq;

static void fk_sumsq_run(void* p) {
  fk_sumsq* k = (fk_sumsq*)p;
  zs__device* h = fk_host();
  double acc = 0.0;
  fk_check(h->ops->sumsq(h, k->src, k->dtype, k->n, &acc), "sumsq kernel");
  memcpy(k->out, &acc, sizeof acc);
}

/* As optim_cuda.cu: one partial per block of 256 threads, at most 1024. */
static size_t fk_blocks(size_t n) {
  size_t b = (n + 255) / 256;
  if (b < 1) b = 1;
  return b > 1024 ? 1024 : b;
}

size_t zs_cuda_sumsq_scratch(size_t n) { return fk_blocks(n); }

int zs_cuda_sumsq(const void* src, zs_dtype dtype, size_t n, double* partial,
                  double* out, void* stream) {
  int ok = 1;
  const char* name = "sumsq";
  fk_sumsq* k = (fk_sumsq*)fk_alloc_arg(sizeof *k);
  (void)fakecuda_kernel_ptr(partial, fk_blocks(n) * sizeof(double), name,
                           &ok);
  k->src = fakecuda_kernel_ptr(src, n * zs_dtype_size(dtype), name, &ok);
  k->dtype = dtype;
  k->n = n;
  k->out = (double*)fakecuda_kernel_ptr(out, sizeof(double), name, &ok);
  /* runs also for n == 0: the kernel writes 0 to *out */
  return fk_launch(k, ok && k->out != NULL, 1, stream, name, fk_sumsq_run);
}

/* ---- conversions and the reduction helpers ------------------------------------- */

typedef struct {
  int op; /* 0 convert, 1 div_add, 2 sum_chunks */
  void* dst;
  const void* src;
  const void* base;
  zs_dtype dtype, src_dtype;
  float divisor;
  int nchunks;
  size_t n;
} fk_elem;

static void fk_elem_run(void* p) {
  fk_elem* k = (fk_elem*)p;
  zs__device* h = fk_host();
  switch (k->op) {
    case 0:
      fk_check(h->ops->convert(h, k->dst, k->dtype, k->src, k->src_dtype,
                               k->n, NULL), "convert kernel");
      break;
    case 1:
      fk_check(h->ops->div_add(h, k->dst, k->base, k->src, k->divisor, k->n,
                               k->dtype, NULL), "div_add kernel");
      break;
    default:
      fk_check(h->ops->sum_chunks(h, k->dst, k->src, k->nchunks, k->n,
                                  k->divisor, k->dtype, NULL),
               "sum_chunks kernel");
      break;
  }
}

static int fk_elem_launch(fk_elem* k, int ok, void* stream, const char* name) {
  return fk_launch(k, ok, k->n, stream, name, fk_elem_run);
}

int zs_cuda_convert(void* dst, zs_dtype dst_dtype, const void* src,
                    zs_dtype src_dtype, size_t n, void* stream) {
  int ok = 1;
  fk_elem* k = (fk_elem*)fk_alloc_arg(sizeof *k);
  k->op = 0;
  k->dst = fakecuda_kernel_ptr(dst, n * zs_dtype_size(dst_dtype), "convert", &ok);
  k->src = fakecuda_kernel_ptr(src, n * zs_dtype_size(src_dtype), "convert", &ok);
  k->dtype = dst_dtype;
  k->src_dtype = src_dtype;
  k->n = n;
  return fk_elem_launch(k, ok, stream, "convert");
}

int zs_cuda_div_add(void* dst, const void* base, const void* src,
                    float divisor, size_t n, zs_dtype dtype, void* stream) {
  int ok = 1;
  const size_t bytes = n * zs_dtype_size(dtype);
  fk_elem* k = (fk_elem*)fk_alloc_arg(sizeof *k);
  k->op = 1;
  k->dst = fakecuda_kernel_ptr(dst, bytes, "div_add", &ok);
  k->base = fakecuda_kernel_ptr(base, bytes, "div_add", &ok);
  k->src = fakecuda_kernel_ptr(src, bytes, "div_add", &ok);
  k->divisor = divisor;
  k->dtype = dtype;
  k->n = n;
  return fk_elem_launch(k, ok, stream, "div_add");
}

int zs_cuda_sum_chunks(void* dst, const void* src, int nchunks, size_t chunk,
                       float divisor, zs_dtype dtype, void* stream) {
  int ok = 1;
  if (nchunks < 1) return cudaErrorInvalidValue;
  const size_t bytes = chunk * zs_dtype_size(dtype);
  fk_elem* k = (fk_elem*)fk_alloc_arg(sizeof *k);
  k->op = 2;
  k->dst = fakecuda_kernel_ptr(dst, bytes, "sum_chunks", &ok);
  k->src = fakecuda_kernel_ptr(src, bytes * (size_t)nchunks, "sum_chunks", &ok);
  k->nchunks = nchunks;
  k->divisor = divisor;
  k->dtype = dtype;
  k->n = chunk;
  return fk_elem_launch(k, ok, stream, "sum_chunks");
}
