/*
 * layers_math.h: the per-row and per-element math of the GPT-2 layers,
 * written once as inline functions that compile for the host (layers.c) and
 * for the GPU (layers_cuda.cu, where one thread runs one row or element).
 * The CPU tests of layers.c therefore exercise the arithmetic the CUDA
 * kernels run, in the same operation order. (Transcendentals differ: the
 * CUDA expf/tanhf/logf are within 2 ulp of glibc's, so GPU results match
 * the CPU's to rounding, not bitwise.)
 *
 * Conventions are those of layers.h: fp32, row-major, counts in ELEMENTS,
 * gradients named d<x> ACCUMULATED, every sum sequential from 0 in
 * ascending index. No function allocates, keeps a pointer or validates its
 * arguments. Internal to examples/gpt2.
 */
#ifndef ZS_EXAMPLES_GPT2_LAYERS_MATH_H
#define ZS_EXAMPLES_GPT2_LAYERS_MATH_H

#include <math.h>
#include <stddef.h>

#include "examples/gpt2/layers.h" /* GPT2_LAYERNORM_EPS */

#ifdef __CUDACC__
#define GPT2_HD __host__ __device__ static inline
#else
#define GPT2_HD static inline
#endif

/* The parameter-gradient sums down the rows (LayerNorm's dweight and
 * dbias, the matmul's dbias) go in chunks of this many rows: each chunk's
 * sum from 0 in row order, then the chunks' sums in chunk order. layers.c
 * and the CUDA kernels both sum so (same bits); the GPU runs one thread
 * per (chunk, channel) instead of one per channel. */
#define GPT2_SUM_CHUNK_ROWS 64

#define GPT2_SQRT_2_OVER_PI 0.7978845608028654f /* sqrt(2/pi) */
#define GPT2_GELU_CUBIC 0.044715f

/* LayerNorm of one row x (C): writes y (C), *mean and *rstd
 * (Ba et al. 2016 eq. 4; two passes, biased variance). */
GPT2_HD void gpt2_math_layernorm_row(float *y, float *mean, float *rstd,
                                     const float *x, const float *weight,
                                     const float *bias, int C) {
  float sum = 0.0f;
  for (int c = 0; c < C; c++) sum += x[c];
  const float m = sum / (float)C;
  /* Two passes: the variance of centred values does not cancel. */
  float sq = 0.0f;
  for (int c = 0; c < C; c++) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float var = sq / (float)C;
  const float s = 1.0f / sqrtf(var + GPT2_LAYERNORM_EPS);
  for (int c = 0; c < C; c++) y[c] = ((x[c] - m) * s) * weight[c] + bias[c];
  *mean = m;
  *rstd = s;
}

/* The input gradient of one LayerNorm row: with xhat = (x - m)*s and
 * g = weight*dy, dx[c] += s*((g - mean(g)) - xhat*mean(g*xhat)). */
GPT2_HD void gpt2_math_layernorm_backward_row(float *dx, const float *dy,
                                              const float *x,
                                              const float *weight, float m,
                                              float s, int C) {
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = 0; c < C; c++) {
    const float xhat = (x[c] - m) * s;
    const float g = weight[c] * dy[c];
    g_sum += g;
    gx_sum += g * xhat;
  }
  const float g_mean = g_sum / (float)C;
  const float gx_mean = gx_sum / (float)C;
  for (int c = 0; c < C; c++) {
    const float xhat = (x[c] - m) * s;
    const float g = weight[c] * dy[c];
    dx[c] += s * ((g - g_mean) - xhat * gx_mean);
  }
}

/* tanh-GELU of x (Hendrycks & Gimpel 2016, sec. 2). */
GPT2_HD float gpt2_math_gelu(float x) {
  const float u = GPT2_SQRT_2_OVER_PI * (x + GPT2_GELU_CUBIC * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu(x) / dx: 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx. */
GPT2_HD float gpt2_math_gelu_grad(float x) {
  const float u = GPT2_SQRT_2_OVER_PI * (x + GPT2_GELU_CUBIC * x * x * x);
  const float th = tanhf(u);
  const float du = GPT2_SQRT_2_OVER_PI * (1.0f + 3.0f * GPT2_GELU_CUBIC * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

/* Causal softmax of query row t (the attention of Vaswani et al. 2017,
 * sec. 3.2.1/3.2.3): pre[0..t] holds the scaled scores; writes a[0..T) with
 * a[t2] = exp(pre[t2] - max)/sum for t2 <= t and 0 beyond, and sets the
 * masked pre[t+1..T) to 0. */
GPT2_HD void gpt2_math_causal_softmax_row(float *a, float *pre, int t, int T) {
  float maxval = -INFINITY;
  for (int t2 = 0; t2 <= t; t2++)
    if (pre[t2] > maxval) maxval = pre[t2];
  float sum = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    const float e = expf(pre[t2] - maxval);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
  for (int t2 = t + 1; t2 < T; t2++) {
    pre[t2] = 0.0f;
    a[t2] = 0.0f;
  }
}

/* Backward of gpt2_math_causal_softmax_row: da[0..t] holds dL/da; writes
 * dpre[t2] = a[t2]*(da[t2] - sum(a*da)) for t2 <= t, and 0 beyond in both
 * dpre and da. */
GPT2_HD void gpt2_math_causal_softmax_backward_row(float *dpre, float *da,
                                                   const float *a, int t,
                                                   int T) {
  float ada = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) ada += a[t2] * da[t2];
  for (int t2 = 0; t2 <= t; t2++) dpre[t2] = a[t2] * (da[t2] - ada);
  for (int t2 = t + 1; t2 < T; t2++) {
    da[t2] = 0.0f;
    dpre[t2] = 0.0f;
  }
}

/* Softmax and cross-entropy of one row of logits z (V): writes p (V) and
 * returns the loss log(sum exp(z - max)) - (z[y] - max). */
GPT2_HD float gpt2_math_softmax_ce_row(float *p, const float *z, int y,
                                       int V) {
  float maxval = -INFINITY;
  for (int v = 0; v < V; v++)
    if (z[v] > maxval) maxval = z[v];
  float sum = 0.0f;
  for (int v = 0; v < V; v++) {
    const float e = expf(z[v] - maxval);
    p[v] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int v = 0; v < V; v++) p[v] *= inv;
  /* log-sum-exp form: finite even when the target's prob underflows */
  return logf(sum) - (z[y] - maxval);
}

/* Backward of one row: dz[v] += (p[v] - [v == y]) * dl. */
GPT2_HD void gpt2_math_softmax_ce_backward_row(float *dz, const float *p,
                                               int y, float dl, int V) {
  for (int v = 0; v < V; v++) {
    const float indicator = v == y ? 1.0f : 0.0f;
    dz[v] += (p[v] - indicator) * dl;
  }
}

#endif /* ZS_EXAMPLES_GPT2_LAYERS_MATH_H */
