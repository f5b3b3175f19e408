/*
 * layers_blas.c: matmul and attention as GEMMs plus row kernels
 * (layers_blas.h). Notation: a row-major matrix X (r, c) with row stride ld
 * is the column-major X^T (c, r) with leading dimension ld, so the
 * row-major product Y = P Q is computed as the column-major Y^T = Q^T P^T.
 */
#include "examples/gpt2/layers_blas.h"

#include <math.h>
#include <stddef.h>

enum { N_ = 0, T_ = 1 }; /* op(X) = X, X^T */

void gpt2_blas_matmul_forward(const gpt2_blas* b, float* out, const float* inp,
                              const float* weight, const float* bias, int N,
                              int C, int OC) {
  /* out (N, OC) = inp (N, C) . weight (OC, C)^T */
  b->gemm(b->ctx, T_, N_, OC, N, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out,
          OC, 0, 1);
  if (bias != NULL) b->bias_forward(b->ctx, out, bias, N, OC);
}

void gpt2_blas_matmul_backward(const gpt2_blas* b, float* dinp, float* dweight,
                               float* dbias, const float* dout,
                               const float* inp, const float* weight, int N,
                               int C, int OC) {
  /* dinp (N, C) += dout (N, OC) . weight (OC, C) */
  if (dinp != NULL)
    b->gemm(b->ctx, N_, N_, C, N, OC, 1.0f, weight, C, 0, dout, OC, 0, 1.0f,
            dinp, C, 0, 1);
  /* dweight (OC, C) += dout^T (OC, N) . inp (N, C) */
  b->gemm(b->ctx, N_, T_, C, OC, N, 1.0f, inp, C, 0, dout, OC, 0, 1.0f,
          dweight, C, 0, 1);
  if (dbias != NULL) b->bias_backward(b->ctx, dbias, dout, N, OC);
}

/* Per sequence b, the NH heads are one batched GEMM: head h of q, k, v is
 * a (T, hs) matrix at column h*hs of the (T, 3C) qkv rows (stride hs
 * between heads), of the (T, T) scores at h*T*T. */
void gpt2_blas_attention_forward(const gpt2_blas* b, float* out, float* preatt,
                                 float* att, const float* inp, int B, int T,
                                 int C, int NH) {
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int s = 0; s < B; s++) {
    const float* q = inp + (size_t)s * T * C3;
    /* preatt (T, T) = scale * q (T, hs) . k (T, hs)^T, every head */
    b->gemm(b->ctx, T_, N_, T, T, hs, scale, q + C, C3, hs, q, C3, hs, 0.0f,
            preatt + (size_t)s * NH * TT, T, TT, NH);
  }
  b->causal_softmax(b->ctx, att, preatt, B * NH * T, T);
  for (int s = 0; s < B; s++) {
    const float* v = inp + (size_t)s * T * C3 + 2 * C;
    /* out (T, hs) = att (T, T) . v (T, hs); masked att entries are 0 */
    b->gemm(b->ctx, N_, N_, hs, T, T, 1.0f, v, C3, hs,
            att + (size_t)s * NH * TT, T, TT, 0.0f, out + (size_t)s * T * C,
            C, hs, NH);
  }
}

void gpt2_blas_attention_backward(const gpt2_blas* b, float* dinp,
                                  float* dpreatt, float* datt,
                                  const float* dout, const float* inp,
                                  const float* att, int B, int T, int C,
                                  int NH) {
  const int C3 = 3 * C, hs = C / NH;
  const long long TT = (long long)T * T;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int s = 0; s < B; s++) {
    const float* v = inp + (size_t)s * T * C3 + 2 * C;
    const float* dy = dout + (size_t)s * T * C;
    const float* a = att + (size_t)s * NH * TT;
    /* datt (T, T) = dout (T, hs) . v (T, hs)^T */
    b->gemm(b->ctx, T_, N_, T, T, hs, 1.0f, v, C3, hs, dy, C, hs, 0.0f,
            datt + (size_t)s * NH * TT, T, TT, NH);
    /* dv (T, hs) += att (T, T)^T . dout (T, hs) */
    b->gemm(b->ctx, N_, T_, hs, T, T, 1.0f, dy, C, hs, a, T, TT, 1.0f,
            dinp + (size_t)s * T * C3 + 2 * C, C3, hs, NH);
  }
  b->causal_softmax_backward(b->ctx, dpreatt, datt, att, B * NH * T, T);
  for (int s = 0; s < B; s++) {
    const float* q = inp + (size_t)s * T * C3;
    const float* dp = dpreatt + (size_t)s * NH * TT;
    float* dq = dinp + (size_t)s * T * C3;
    /* dq (T, hs) += scale * dpreatt (T, T) . k (T, hs) */
    b->gemm(b->ctx, N_, N_, hs, T, T, scale, q + C, C3, hs, dp, T, TT, 1.0f,
            dq, C3, hs, NH);
    /* dk (T, hs) += scale * dpreatt (T, T)^T . q (T, hs) */
    b->gemm(b->ctx, N_, T_, hs, T, T, scale, q, C3, hs, dp, T, TT, 1.0f,
            dq + C, C3, hs, NH);
  }
}
