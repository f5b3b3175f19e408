// gpt2_blas_test.cc: tests of examples/gpt2/layers_blas.{h,c}, the GEMM
// composition of matmul and attention that the CUDA backend runs with
// cuBLAS. Here it runs on the CPU with a reference column-major
// strided-batched GEMM (cuBLAS's contract, written as plain loops) and the
// row kernels of layers_math.h, and is compared with layers.c BITWISE: each
// output element is the same sum in the same order (the GEMM sums k from 0
// ascending; the masked attention entries it adds are exact zeros), and
// alpha*s + beta*C with alpha, beta in {1, scale} rounds as layers.c's
// s*scale and g + s do. A wrong transpose, leading dimension or batch
// stride changes the values, so every argument of every GEMM is checked.
// Odd sizes (N = 141, C = 12, OC = 9, T = 7, NH = 3) catch stride bugs that
// square shapes hide; N = 141 rows are two full chunks of the bias
// gradient's GPT2_SUM_CHUNK_ROWS and a partial one.
#include "examples/gpt2/layers_blas.h"

#include <cstring>
#include <random>
#include <vector>

#include "examples/gpt2/layers.h"
#include "examples/gpt2/layers_math.h"
#include "gtest/gtest.h"

namespace {

int gemm_calls = 0;

// C = alpha op(A) op(B) + beta C, column-major, batched with strides.
void RefGemm(void*, int ta, int tb, int m, int n, int k, float alpha,
             const float* A, int lda, long long sa, const float* B, int ldb,
             long long sb, float beta, float* C, int ldc, long long sc,
             int batch) {
  gemm_calls++;
  for (int i = 0; i < batch; i++) {
    const float* a = A + i * sa;
    const float* b = B + i * sb;
    float* c = C + i * sc;
    for (int j = 0; j < n; j++)
      for (int r = 0; r < m; r++) {
        float s = 0.0f;
        for (int p = 0; p < k; p++) {
          const float x = ta ? a[p + (size_t)r * lda] : a[r + (size_t)p * lda];
          const float y = tb ? b[j + (size_t)p * ldb] : b[p + (size_t)j * ldb];
          s += x * y;
        }
        float* out = &c[r + (size_t)j * ldc];
        *out = beta == 0.0f ? alpha * s : alpha * s + beta * *out;
      }
  }
}

void RefBiasForward(void*, float* out, const float* bias, int N, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

// In chunks of GPT2_SUM_CHUNK_ROWS rows, as the bias_backward contract says.
void RefBiasBackward(void*, float* dbias, const float* dout, int N, int OC) {
  for (int o = 0; o < OC; o++) {
    float s = 0.0f;
    for (int n0 = 0; n0 < N; n0 += GPT2_SUM_CHUNK_ROWS) {
      float p = 0.0f;
      for (int n = n0; n < N && n < n0 + GPT2_SUM_CHUNK_ROWS; n++)
        p += dout[(size_t)n * OC + o];
      s += p;
    }
    dbias[o] += s;
  }
}

void RefSoftmax(void*, float* att, float* pre, int rows, int T) {
  for (int r = 0; r < rows; r++)
    gpt2_math_causal_softmax_row(att + (size_t)r * T, pre + (size_t)r * T,
                                 r % T, T);
}

void RefSoftmaxBackward(void*, float* dpre, float* datt, const float* att,
                        int rows, int T) {
  for (int r = 0; r < rows; r++)
    gpt2_math_causal_softmax_backward_row(dpre + (size_t)r * T,
                                          datt + (size_t)r * T,
                                          att + (size_t)r * T, r % T, T);
}

const gpt2_blas kRef = {nullptr,        RefGemm,    RefBiasForward,
                        RefBiasBackward, RefSoftmax, RefSoftmaxBackward};

std::vector<float> Random(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void ExpectBitwise(const std::vector<float>& want, const std::vector<float>& got,
                   const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); i++)
    ASSERT_EQ(0, std::memcmp(&want[i], &got[i], sizeof(float)))
        << what << "[" << i << "]: layers.c " << want[i] << ", GEMM composition "
        << got[i];
}

TEST(Gpt2Blas, MatmulForwardBackwardEqualLayersBitwise) {
  const int N = 141, C = 12, OC = 9;
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    auto inp = Random((size_t)N * C, 1), w = Random((size_t)OC * C, 2);
    auto bias = Random(OC, 3), dout = Random((size_t)N * OC, 4);
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<float> out1((size_t)N * OC), out2((size_t)N * OC, NAN);
    gpt2_matmul_forward(out1.data(), inp.data(), w.data(), b, N, C, OC);
    gpt2_blas_matmul_forward(&kRef, out2.data(), inp.data(), w.data(), b, N, C,
                             OC);
    ExpectBitwise(out1, out2, "out");
    // gradients accumulate: start from the same non-zero values
    auto dinp1 = Random((size_t)N * C, 5), dw1 = Random((size_t)OC * C, 6);
    auto db1 = Random(OC, 7);
    auto dinp2 = dinp1, dw2 = dw1, db2 = db1;
    float* db1p = with_bias ? db1.data() : nullptr;
    float* db2p = with_bias ? db2.data() : nullptr;
    gpt2_matmul_backward(dinp1.data(), dw1.data(), db1p, dout.data(),
                         inp.data(), w.data(), N, C, OC);
    gpt2_blas_matmul_backward(&kRef, dinp2.data(), dw2.data(), db2p,
                              dout.data(), inp.data(), w.data(), N, C, OC);
    ExpectBitwise(dinp1, dinp2, "dinp");
    ExpectBitwise(dw1, dw2, "dweight");
    ExpectBitwise(db1, db2, "dbias");
  }
  // dinp NULL (the input needs no gradient): only dweight and dbias change
  auto inp = Random((size_t)N * C, 1), w = Random((size_t)OC * C, 2);
  auto dout = Random((size_t)N * OC, 4);
  auto dw1 = Random((size_t)OC * C, 6), dw2 = dw1;
  gpt2_matmul_backward(nullptr, dw1.data(), nullptr, dout.data(), inp.data(),
                       w.data(), N, C, OC);
  gpt2_blas_matmul_backward(&kRef, nullptr, dw2.data(), nullptr, dout.data(),
                            inp.data(), w.data(), N, C, OC);
  ExpectBitwise(dw1, dw2, "dweight without dinp");
}

TEST(Gpt2Blas, AttentionForwardBackwardEqualLayersBitwise) {
  const int B = 2, T = 7, C = 12, NH = 3;
  const size_t BTC = (size_t)B * T * C, att = (size_t)B * NH * T * T;
  auto qkv = Random(3 * BTC, 11), dout = Random(BTC, 12);
  std::vector<float> out1(BTC), pre1(att), att1(att);
  std::vector<float> out2(BTC, NAN), pre2(att, NAN), att2(att, NAN);
  gpt2_attention_forward(out1.data(), pre1.data(), att1.data(), qkv.data(), B,
                         T, C, NH);
  gemm_calls = 0;
  gpt2_blas_attention_forward(&kRef, out2.data(), pre2.data(), att2.data(),
                              qkv.data(), B, T, C, NH);
  EXPECT_EQ(2 * B, gemm_calls);
  ExpectBitwise(out1, out2, "out");
  ExpectBitwise(pre1, pre2, "preatt");
  ExpectBitwise(att1, att2, "att");
  auto dinp1 = Random(3 * BTC, 13), dinp2 = dinp1;
  std::vector<float> dpre1(att), datt1(att), dpre2(att, NAN), datt2(att, NAN);
  gpt2_attention_backward(dinp1.data(), dpre1.data(), datt1.data(), dout.data(),
                          qkv.data(), att1.data(), B, T, C, NH);
  gemm_calls = 0;
  gpt2_blas_attention_backward(&kRef, dinp2.data(), dpre2.data(), datt2.data(),
                               dout.data(), qkv.data(), att1.data(), B, T, C,
                               NH);
  EXPECT_EQ(4 * B, gemm_calls);
  ExpectBitwise(datt1, datt2, "datt");
  ExpectBitwise(dpre1, dpre2, "dpreatt");
  ExpectBitwise(dinp1, dinp2, "dqkv");
}

// The reference GEMM itself against a hand-computed product, so the test
// above cannot pass with a reference that mirrors a wrong composition.
TEST(Gpt2Blas, ReferenceGemmFollowsTheColumnMajorContract) {
  // A = [[1, 2], [3, 4]] column-major: {1, 3, 2, 4}; B = [[5, 6], [7, 8]].
  const float A[4] = {1, 3, 2, 4}, B[4] = {5, 7, 6, 8};
  float C[4] = {100, 100, 100, 100};
  RefGemm(nullptr, 0, 0, 2, 2, 2, 1.0f, A, 2, 0, B, 2, 0, 0.0f, C, 2, 0, 1);
  const float AB[4] = {19, 43, 22, 50};  // [[19, 22], [43, 50]]
  for (int i = 0; i < 4; i++) EXPECT_EQ(AB[i], C[i]) << i;
  RefGemm(nullptr, 1, 1, 2, 2, 2, 2.0f, A, 2, 0, B, 2, 0, 1.0f, C, 2, 0, 1);
  // A^T B^T = (BA)^T; BA = [[23, 34], [31, 46]] -> (BA)^T = [[23, 31], [34, 46]]
  const float want[4] = {19 + 46, 43 + 68, 22 + 62, 50 + 92};
  for (int i = 0; i < 4; i++) EXPECT_EQ(want[i], C[i]) << i;
}

}  // namespace
