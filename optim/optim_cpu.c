/*
 * optim_cpu.c — the fast CPU optimizer kernels (zeroshard.h, "Optimizer
 * kernels", zs_optim_*_fast): the same per-element float32 operations as
 * the scalar reference (optim_ref.c), in the same order, so the results are
 * bitwise identical; vectorized by the compiler for AVX-512, AVX2 and the
 * baseline, with the best chosen at run time (GCC target_clones, an ifunc
 * resolver), and split across OpenMP threads in contiguous blocks (no
 * reduction, so the thread count never changes a bit).
 *
 * Why this is exact: -ffp-contract=off keeps every multiply and add a
 * separate rounding (no FMA); -fno-math-errno lets sqrtf become the
 * correctly rounded vector square root instead of a libm call; vector
 * division and square root are IEEE-exact like their scalar forms. The
 * BUILD file compiles this file with those flags and -O3.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <zeroshard.h>

#include "optim/optim_scalars.h"
#include "runtime/core/core.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define ZS__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZS__CLONES
#endif

/* Blocks of this many elements are the unit of work of one thread (a
 * multiple of every vector width, large enough to stream). */
#define ZS__BLOCK ((size_t)1 << 16)

typedef struct zs__adam_k {
  zs__adam_scalars s;
  int adamw, l2;
} zs__adam_k;

ZS__CLONES
static void zs__adam_block(float* restrict p, const float* restrict g,
                           float* restrict m, float* restrict v, size_t n,
                           const zs__adam_k* k) {
  const zs__adam_scalars s = k->s;
  if (k->adamw) {
    for (size_t i = 0; i < n; i++)
      p[i] = zs__adam_update(p[i] * s.decay, g[i], &m[i], &v[i], &s);
  } else if (k->l2) {
    for (size_t i = 0; i < n; i++)
      p[i] = zs__adam_update(p[i], g[i] + s.weight_decay * p[i], &m[i], &v[i], &s);
  } else {
    for (size_t i = 0; i < n; i++)
      p[i] = zs__adam_update(p[i], g[i], &m[i], &v[i], &s);
  }
}

static int zs__threads(int threads, size_t n) {
  int t = threads > 0 ? threads : omp_get_max_threads();
  const size_t blocks = (n + ZS__BLOCK - 1) / ZS__BLOCK;
  if ((size_t)t > blocks) t = blocks > 0 ? (int)blocks : 1;
  return t < 1 ? 1 : t;
}

static zs_status zs__adam_fast(int adamw, float* param, const float* grad,
                               float* exp_avg, float* exp_avg_sq, size_t n,
                               const zs_adam_hparams* hp, int64_t step,
                               int threads) {
  /* The reference checks the arguments and computes nothing for n = 0:
   * one call on an empty range validates exactly as it does. */
  zs_status st = (adamw ? zs_optim_adamw : zs_optim_adam)(
      param, grad, exp_avg, exp_avg_sq, 0, hp, step);
  if (st != ZS_OK) return st;
  if (n > 0 && (!param || !grad || !exp_avg || !exp_avg_sq))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_optim_adam[w]_fast: param, grad, exp_avg and "
                     "exp_avg_sq must be non-NULL when n > 0");
  if (threads < 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_optim_adam[w]_fast: threads must be >= 0 (0: "
                     "OpenMP's default), got %d", threads);
  zs__adam_k k;
  k.s = zs__adam_scalars_make(hp, step); /* the reference's, bit for bit */
  k.adamw = adamw;
  k.l2 = hp->weight_decay != 0.0;
  const size_t blocks = (n + ZS__BLOCK - 1) / ZS__BLOCK;
  const int nt = zs__threads(threads, n);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (size_t b = 0; b < blocks; b++) {
    const size_t o = b * ZS__BLOCK;
    const size_t c = n - o < ZS__BLOCK ? n - o : ZS__BLOCK;
    zs__adam_block(param + o, grad + o, exp_avg + o, exp_avg_sq + o, c, &k);
  }
  return ZS_OK;
}

zs_status zs_optim_adamw_fast(float* param, const float* grad, float* exp_avg,
                              float* exp_avg_sq, size_t n,
                              const zs_adam_hparams* hp, int64_t step,
                              int threads) {
  return zs__adam_fast(1, param, grad, exp_avg, exp_avg_sq, n, hp, step,
                       threads);
}

zs_status zs_optim_adam_fast(float* param, const float* grad, float* exp_avg,
                             float* exp_avg_sq, size_t n,
                             const zs_adam_hparams* hp, int64_t step,
                             int threads) {
  return zs__adam_fast(0, param, grad, exp_avg, exp_avg_sq, n, hp, step,
                       threads);
}

/* ==== SGD ================================================================ */

typedef struct zs__sgd_k {
  zs__sgd_scalars s;
  int decay, use_momentum, first, nesterov;
} zs__sgd_k;

ZS__CLONES
static void zs__sgd_block(float* restrict p, const float* restrict g,
                          float* restrict buf, size_t n, const zs__sgd_k* k) {
  const zs__sgd_scalars s = k->s;
  const int decay = k->decay, mom = k->use_momentum, first = k->first,
            nest = k->nesterov;
  for (size_t i = 0; i < n; i++)
    p[i] = zs__sgd_update(p[i], g[i], mom ? &buf[i] : NULL, &s, decay, mom,
                          first, nest);
}

zs_status zs_optim_sgd_fast(float* param, const float* grad,
                            float* momentum_buffer, size_t n,
                            const zs_sgd_hparams* hp, int64_t step,
                            int threads) {
  zs_status st = zs_optim_sgd(param, grad, momentum_buffer, 0, hp, step);
  if (st != ZS_OK) return st;
  if (n > 0 && (!param || !grad || (hp->momentum != 0.0 && !momentum_buffer)))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_optim_sgd_fast: param and grad (and momentum_buffer "
                     "with momentum) must be non-NULL when n > 0");
  if (threads < 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_optim_sgd_fast: threads must be >= 0, got %d",
                     threads);
  zs__sgd_k k;
  k.s = zs__sgd_scalars_make(hp);
  k.decay = hp->weight_decay != 0.0;
  k.use_momentum = hp->momentum != 0.0;
  k.first = step <= 1;
  k.nesterov = hp->nesterov != 0;
  const size_t blocks = (n + ZS__BLOCK - 1) / ZS__BLOCK;
  const int nt = zs__threads(threads, n);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (size_t b = 0; b < blocks; b++) {
    const size_t o = b * ZS__BLOCK;
    const size_t c = n - o < ZS__BLOCK ? n - o : ZS__BLOCK;
    zs__sgd_block(param + o, grad + o,
                  momentum_buffer != NULL ? momentum_buffer + o : NULL, c, &k);
  }
  return ZS_OK;
}
