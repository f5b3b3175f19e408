/*
 * layers_blas.h: the matmul and attention layers of layers.h composed from
 * a column-major strided-batched GEMM (the BLAS convention of cuBLAS's
 * cublasSgemmStridedBatched) and four small row kernels. The CUDA backend
 * (layers_cuda.cu) runs them with cuBLAS and its kernels; the tests run the
 * very same composition with a plain reference GEMM and layers_math.h on
 * the CPU (tests/examples/gpt2_blas_test.cc), so every transpose, leading
 * dimension and batch stride below is checked on machines without a GPU.
 *
 * Shapes and semantics are those of the layers.h function of the same name
 * (row-major fp32, counts in ELEMENTS, d<x> ACCUMULATED). A row-major
 * (rows, cols) matrix with row stride ld is, read column-major, its
 * transpose with leading dimension ld; every call below is derived from
 * that identity (comments give the row-major product each GEMM computes).
 *
 * Ordering: the functions only issue calls through `b`, in order; whether
 * they are synchronous is the backend's (CUDA: asynchronous on its stream).
 * Attention issues 2*B GEMMs forward and 4*B backward (each batched over
 * the NH heads) because one stride cannot step over both heads (hs) and
 * sequences (T*3C).
 */
#ifndef ZS_EXAMPLES_GPT2_LAYERS_BLAS_H
#define ZS_EXAMPLES_GPT2_LAYERS_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt2_blas {
  void* ctx; /* passed to every call */
  /* For each of `batch` problems i (pointers advanced by i*stride, in
   * elements): C = alpha * op(A) op(B) + beta * C, column-major, op(X) = X
   * (trans 0) or X^T (trans 1); op(A) is m x k, op(B) k x n, C m x n. With
   * beta == 0, C is not read. */
  void (*gemm)(void* ctx, int trans_a, int trans_b, int m, int n, int k,
               float alpha, const float* A, int lda, long long stride_a,
               const float* B, int ldb, long long stride_b, float beta,
               float* C, int ldc, long long stride_c, int batch);
  /* out[n, o] = out[n, o] + bias[o] for n < N, o < OC. */
  void (*bias_forward)(void* ctx, float* out, const float* bias, int N,
                       int OC);
  /* dbias[o] += sum over n of dout[n, o], in chunks of
   * GPT2_SUM_CHUNK_ROWS rows (layers_math.h): each chunk's sum from 0 in
   * ascending n, then the chunks' sums in ascending order. */
  void (*bias_backward)(void* ctx, float* dbias, const float* dout, int N,
                        int OC);
  /* For each of `rows` rows r (query position t = r % T) of (rows, T)
   * matrices: gpt2_math_causal_softmax_row(att + r*T, pre + r*T, t, T). */
  void (*causal_softmax)(void* ctx, float* att, float* pre, int rows, int T);
  /* Likewise gpt2_math_causal_softmax_backward_row(dpre + r*T, datt + r*T,
   * att + r*T, t, T). */
  void (*causal_softmax_backward)(void* ctx, float* dpre, float* datt,
                                  const float* att, int rows, int T);
} gpt2_blas;

void gpt2_blas_matmul_forward(const gpt2_blas* b, float* out, const float* inp,
                              const float* weight, const float* bias, int N,
                              int C, int OC);
void gpt2_blas_matmul_backward(const gpt2_blas* b, float* dinp, float* dweight,
                               float* dbias, const float* dout,
                               const float* inp, const float* weight, int N,
                               int C, int OC);
void gpt2_blas_attention_forward(const gpt2_blas* b, float* out, float* preatt,
                                 float* att, const float* inp, int B, int T,
                                 int C, int NH);
void gpt2_blas_attention_backward(const gpt2_blas* b, float* dinp,
                                  float* dpreatt, float* datt,
                                  const float* dout, const float* inp,
                                  const float* att, int B, int T, int C,
                                  int NH);

#ifdef __cplusplus
}
#endif

#endif /* ZS_EXAMPLES_GPT2_LAYERS_BLAS_H */
