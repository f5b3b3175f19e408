// gpt2_layers_test.cc: tests of examples/gpt2/layers.{h,c}, the CPU fp32
// forward/backward passes of the GPT-2 layers.
//
// What is checked, per layer:
//   - the forward against a known value or a plain reference loop;
//   - every gradient of the backward against fp32 central finite differences
//     of L = sum(r * out), r random, so every output contributes;
//   - accumulation: backward adds exactly once per call (bitwise g0 + s and
//     2 s), except dwte of the encoder (documented ordered accumulation);
// and across layers:
//   - a GPT-2 block + LM head forward/backward is bitwise identical with 1, 3
//     and 4 OpenMP threads;
//   - attention is causal; cross-entropy of uniform logits is ln(V).
//
// Finite-difference tolerances and their derivation: see ExpectGradNear.
#include "examples/gpt2/layers.h"
#include "examples/gpt2/layers_math.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

// Internal entry points of layers.c (not in layers.h): the matmul with a
// chosen copy of its kernels. isa: 0 x86-64 baseline (SSE2), 1 AVX2,
// 2 AVX-512F; usable when zs__gpt2_matmul_isa_supported(isa) returns 1.
extern "C" {
int zs__gpt2_matmul_isa_supported(int isa);
void zs__gpt2_matmul_forward_isa(int isa, float* out, const float* inp,
                                 const float* weight, const float* bias, int N,
                                 int C, int OC);
void zs__gpt2_matmul_backward_isa(int isa, float* dinp, float* dweight,
                                  float* dbias, const float* dout,
                                  const float* inp, const float* weight, int N,
                                  int C, int OC);
}

namespace {

using Vec = std::vector<float>;

// Small odd shapes (T, V, OC odd; C = 8 with NH = 2 gives head size 4).
constexpr int kB = 2;
constexpr int kT = 5;
constexpr int kC = 8;
constexpr int kNH = 2;
constexpr int kV = 11;
constexpr int kOC = 6;
constexpr int kN = kB * kT;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

Vec Random(size_t n, std::mt19937* rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

std::vector<int> RandomIds(size_t n, int v, std::mt19937* rng) {
  std::uniform_int_distribution<int> dist(0, v - 1);
  std::vector<int> ids(n);
  for (int& x : ids) x = dist(*rng);
  return ids;
}

// Central-difference gradient of L(x) = sum_j r_j * f(x)_j with respect to
// every element of *x, in fp32. out(+h) - out(-h) is taken per output before
// weighting, so the rounding of L's large sum does not enter the difference.
Vec NumericGrad(Vec* x, const Vec& r, const std::function<Vec()>& f, float h) {
  Vec g(x->size());
  for (size_t i = 0; i < x->size(); i++) {
    const float saved = (*x)[i];
    const float xp = saved + h;
    const float xm = saved - h;
    (*x)[i] = xp;
    const Vec op = f();
    (*x)[i] = xm;
    const Vec om = f();
    (*x)[i] = saved;
    float dl = 0.0f;
    for (size_t j = 0; j < r.size(); j++) dl += r[j] * (op[j] - om[j]);
    g[i] = dl / (xp - xm);
  }
  return g;
}

// Tolerance of the gradient check, per element:
//   |analytic - numeric| <= kRtol * |numeric| + kAtol * max_j |numeric_j|
// The numeric gradient is fp32 central differences with step h = 1e-2 on
// inputs of size ~1. Its truncation error is h^2/6 * f''' ~ 2e-5 (relative)
// for the smooth layers and 0 for the linear ones. Its rounding error is
// ~ sqrt(#outputs) * few ulp(out) / (2h), i.e. 1e-6..1e-4 of max|g|, and it
// does not shrink with the element, which is why the bound has a part
// relative to the gradient's largest element (kAtol): an element that is
// itself ~1e-4 of max|g| cannot be resolved to 1% in fp32.
// Measured worst |err| / max|g| (printed by each check): 7.5e-5 for the MSE
// (a scalar loss, so no per-output differencing), <= 5e-5 for the rest.
// kAtol = 1e-3 leaves a >10x margin; kRtol = 1e-2 is the usual fp32 check.
// A missing or wrong term shows up as an O(1) relative error.
constexpr float kFdStep = 1e-2f;
constexpr float kRtol = 1e-2f;
constexpr float kAtol = 1e-3f;

void ExpectGradNear(const std::string& what, const Vec& analytic,
                    const Vec& numeric) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  float scale = 0.0f;
  for (float v : numeric) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0f) << what << ": numeric gradient is all zero";
  float worst = 0.0f;
  for (size_t i = 0; i < analytic.size(); i++) {
    const float err = std::fabs(analytic[i] - numeric[i]);
    worst = std::max(worst, err / scale);
    EXPECT_LE(err, kRtol * std::fabs(numeric[i]) + kAtol * scale)
        << what << "[" << i << "]: analytic " << analytic[i] << " numeric "
        << numeric[i] << " (max|g| " << scale << ")";
  }
  std::printf("  gradcheck %-28s n=%4zu max|g|=%.3g worst |err|/max|g|=%.2e\n",
              what.c_str(), analytic.size(), scale, worst);
}

// Accumulation contract: `backward` adds into the given gradient buffers.
// With s = result of one call into zeros, expects one call into g0 to give
// g0 + s and two calls into zeros to give 2 s. Both are exact in binary fp
// when the layer adds its contribution once per element (fl(s + s) = 2s and
// the test forms g0 + s with the same single rounding), so they are compared
// bitwise unless `exact` is false for that buffer.
void CheckAccumulation(const std::string& layer,
                       const std::vector<size_t>& sizes,
                       const std::function<void(std::vector<Vec>*)>& backward,
                       const std::vector<bool>& exact,
                       const std::vector<Vec>& inexact_tol = {}) {
  std::mt19937 rng(1234);
  std::vector<Vec> once, twice, pre, g0;
  for (size_t n : sizes) {
    once.emplace_back(n, 0.0f);
    twice.emplace_back(n, 0.0f);
    g0.push_back(Random(n, &rng));
  }
  pre = g0;
  backward(&once);
  backward(&twice);
  backward(&twice);
  backward(&pre);
  for (size_t k = 0; k < sizes.size(); k++) {
    for (size_t i = 0; i < sizes[k]; i++) {
      const float want2 = 2.0f * once[k][i];
      const float want_pre = g0[k][i] + once[k][i];
      if (exact[k]) {
        EXPECT_EQ(twice[k][i], want2) << layer << " grad " << k << "[" << i
                                      << "]: two calls != 2 * one call";
        EXPECT_EQ(pre[k][i], want_pre) << layer << " grad " << k << "[" << i
                                       << "]: call into g0 != g0 + s";
      } else {
        EXPECT_NEAR(twice[k][i], want2, inexact_tol[k][i])
            << layer << " grad " << k << "[" << i << "]";
        EXPECT_NEAR(pre[k][i], want_pre, inexact_tol[k][i])
            << layer << " grad " << k << "[" << i << "]";
      }
    }
  }
}

bool BitwiseEqual(const Vec& a, const Vec& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

struct EncoderCase {
  std::mt19937 rng{1};
  std::vector<int> tokens = RandomIds(kN, kV, &rng);
  Vec wte = Random((size_t)kV * kC, &rng);
  Vec wpe = Random((size_t)kT * kC, &rng);
  Vec dout = Random((size_t)kN * kC, &rng);
  EncoderCase() {
    tokens[7] = tokens[2];  // a repeated token must accumulate
  }
  Vec Forward() {
    Vec out((size_t)kN * kC);
    gpt2_encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), kB,
                         kT, kC);
    return out;
  }
};

TEST(Gpt2Encoder, ForwardIsTokenPlusPosition) {
  EncoderCase e;
  const Vec out = e.Forward();
  for (int n = 0; n < kN; n++) {
    for (int c = 0; c < kC; c++) {
      EXPECT_EQ(out[(size_t)n * kC + c],
                e.wte[(size_t)e.tokens[n] * kC + c] +
                    e.wpe[(size_t)(n % kT) * kC + c]);
    }
  }
}

TEST(Gpt2Encoder, GradCheck) {
  EncoderCase e;
  Vec dwte((size_t)kV * kC, 0.0f), dwpe((size_t)kT * kC, 0.0f);
  gpt2_encoder_backward(dwte.data(), dwpe.data(), e.dout.data(),
                        e.tokens.data(), kB, kT, kC);
  auto f = [&] { return e.Forward(); };
  ExpectGradNear("encoder dwte", dwte, NumericGrad(&e.wte, e.dout, f, kFdStep));
  ExpectGradNear("encoder dwpe", dwpe, NumericGrad(&e.wpe, e.dout, f, kFdStep));
}

TEST(Gpt2Encoder, Accumulates) {
  EncoderCase e;
  // dwte adds position by position (documented), so a repeated token's row is
  // a recursive sum: |error| <= k * eps * (|g0| + sum |d_i|) over its k terms.
  Vec tol((size_t)kV * kC, 0.0f);
  std::vector<int> count(kV, 0);
  for (int n = 0; n < kN; n++) count[e.tokens[n]]++;
  for (int n = 0; n < kN; n++) {
    for (int c = 0; c < kC; c++) {
      tol[(size_t)e.tokens[n] * kC + c] +=
          std::fabs(e.dout[(size_t)n * kC + c]);
    }
  }
  for (int v = 0; v < kV; v++) {
    for (int c = 0; c < kC; c++) {
      float& t = tol[(size_t)v * kC + c];
      t = 2.0f * (count[v] + 1) * FLT_EPSILON * (t + 1.0f);  // |g0| <= 1
    }
  }
  CheckAccumulation(
      "encoder", {(size_t)kV * kC, (size_t)kT * kC},
      [&](std::vector<Vec>* g) {
        gpt2_encoder_backward((*g)[0].data(), (*g)[1].data(), e.dout.data(),
                              e.tokens.data(), kB, kT, kC);
      },
      {false, true}, {tol, Vec((size_t)kT * kC, 0.0f)});
}

// ---------------------------------------------------------------------------
// LayerNorm
// ---------------------------------------------------------------------------

struct LayerNormCase {
  std::mt19937 rng{2};
  Vec inp = Random((size_t)kN * kC, &rng, -2.0f, 3.0f);
  Vec weight = Random(kC, &rng, 0.5f, 1.5f);
  Vec bias = Random(kC, &rng);
  Vec dout = Random((size_t)kN * kC, &rng);
  Vec mean = Vec(kN), rstd = Vec(kN);
  Vec Forward() {
    Vec out((size_t)kN * kC);
    gpt2_layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(),
                           weight.data(), bias.data(), kN, kC);
    return out;
  }
};

TEST(Gpt2LayerNorm, ForwardNormalizesRows) {
  LayerNormCase l;
  std::fill(l.weight.begin(), l.weight.end(), 1.0f);
  std::fill(l.bias.begin(), l.bias.end(), 0.0f);
  const Vec out = l.Forward();
  for (int n = 0; n < kN; n++) {
    float m = 0.0f, v = 0.0f, xm = 0.0f;
    for (int c = 0; c < kC; c++) {
      m += out[(size_t)n * kC + c];
      xm += l.inp[(size_t)n * kC + c];
    }
    m /= kC;
    for (int c = 0; c < kC; c++) {
      const float d = out[(size_t)n * kC + c] - m;
      v += d * d;
    }
    v /= kC;
    // fp32 sums of 8 O(1) terms: a few ulp; eps = 1e-5 shrinks var by 1e-5.
    EXPECT_NEAR(m, 0.0f, 1e-6f) << "row " << n;
    EXPECT_NEAR(v, 1.0f, 1e-4f) << "row " << n;
    EXPECT_NEAR(l.mean[n], xm / kC, 1e-6f) << "row " << n;
  }
}

TEST(Gpt2LayerNorm, GradCheck) {
  LayerNormCase l;
  l.Forward();
  Vec dinp((size_t)kN * kC, 0.0f), dw(kC, 0.0f), db(kC, 0.0f);
  gpt2_layernorm_backward(dinp.data(), dw.data(), db.data(), l.dout.data(),
                          l.inp.data(), l.weight.data(), l.mean.data(),
                          l.rstd.data(), kN, kC);
  auto f = [&] { return l.Forward(); };
  ExpectGradNear("layernorm dinp", dinp, NumericGrad(&l.inp, l.dout, f, kFdStep));
  ExpectGradNear("layernorm dweight", dw,
                 NumericGrad(&l.weight, l.dout, f, kFdStep));
  ExpectGradNear("layernorm dbias", db, NumericGrad(&l.bias, l.dout, f, kFdStep));
}

TEST(Gpt2LayerNorm, Accumulates) {
  LayerNormCase l;
  l.Forward();
  CheckAccumulation(
      "layernorm", {(size_t)kN * kC, kC, kC},
      [&](std::vector<Vec>* g) {
        gpt2_layernorm_backward((*g)[0].data(), (*g)[1].data(),
                                (*g)[2].data(), l.dout.data(), l.inp.data(),
                                l.weight.data(), l.mean.data(), l.rstd.data(),
                                kN, kC);
      },
      {true, true, true});
}

// ---------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------

// C = 20 is no multiple of the kernels' vector widths (4, 8, 16) or of their
// 32-column tiles, so every gradient has a partial block.
constexpr int kMmC = 20;

struct MatmulCase {
  std::mt19937 rng{3};
  Vec inp = Random((size_t)kN * kMmC, &rng);
  Vec weight = Random((size_t)kOC * kMmC, &rng);
  Vec bias = Random(kOC, &rng);
  Vec dout = Random((size_t)kN * kOC, &rng);
  Vec Forward(bool with_bias = true) {
    Vec out((size_t)kN * kOC);
    gpt2_matmul_forward(out.data(), inp.data(), weight.data(),
                        with_bias ? bias.data() : nullptr, kN, kMmC, kOC);
    return out;
  }
};

TEST(Gpt2Matmul, ForwardMatchesReference) {
  MatmulCase m;
  for (bool with_bias : {true, false}) {
    const Vec out = m.Forward(with_bias);
    for (int n = 0; n < kN; n++) {
      for (int o = 0; o < kOC; o++) {
        float s = 0.0f;
        for (int c = 0; c < kMmC; c++) {
          s += m.inp[(size_t)n * kMmC + c] * m.weight[(size_t)o * kMmC + c];
        }
        if (with_bias) s += m.bias[o];
        // Same summation order; the library is built with -ffp-contract=off
        // and this file may not be, so allow a few ulp for fused multiply-adds.
        EXPECT_NEAR(out[(size_t)n * kOC + o], s, 1e-5f)
            << "n " << n << " o " << o << " bias " << with_bias;
      }
    }
  }
}

TEST(Gpt2Matmul, GradCheck) {
  MatmulCase m;
  Vec dinp((size_t)kN * kMmC, 0.0f), dw((size_t)kOC * kMmC, 0.0f),
      db(kOC, 0.0f);
  gpt2_matmul_backward(dinp.data(), dw.data(), db.data(), m.dout.data(),
                       m.inp.data(), m.weight.data(), kN, kMmC, kOC);
  auto f = [&] { return m.Forward(); };
  ExpectGradNear("matmul dinp", dinp, NumericGrad(&m.inp, m.dout, f, kFdStep));
  ExpectGradNear("matmul dweight", dw,
                 NumericGrad(&m.weight, m.dout, f, kFdStep));
  ExpectGradNear("matmul dbias", db, NumericGrad(&m.bias, m.dout, f, kFdStep));
}

TEST(Gpt2Matmul, NullBiasAndNullDinp) {
  MatmulCase m;
  Vec dinp((size_t)kN * kMmC, 0.0f), dw((size_t)kOC * kMmC, 0.0f),
      dw_nodinp((size_t)kOC * kMmC, 0.0f), db(kOC, 0.0f);
  gpt2_matmul_backward(dinp.data(), dw.data(), db.data(), m.dout.data(),
                       m.inp.data(), m.weight.data(), kN, kMmC, kOC);
  // dinp == NULL and dbias == NULL skip only those gradients.
  gpt2_matmul_backward(nullptr, dw_nodinp.data(), nullptr, m.dout.data(),
                       m.inp.data(), m.weight.data(), kN, kMmC, kOC);
  EXPECT_TRUE(BitwiseEqual(dw, dw_nodinp));
  // Without a bias, the forward is the biased one minus the bias.
  const Vec with = m.Forward(true), without = m.Forward(false);
  for (int n = 0; n < kN; n++) {
    for (int o = 0; o < kOC; o++) {
      EXPECT_EQ(with[(size_t)n * kOC + o], without[(size_t)n * kOC + o] + m.bias[o]);
    }
  }
}

TEST(Gpt2Matmul, Accumulates) {
  MatmulCase m;
  CheckAccumulation(
      "matmul", {(size_t)kN * kMmC, (size_t)kOC * kMmC, kOC},
      [&](std::vector<Vec>* g) {
        gpt2_matmul_backward((*g)[0].data(), (*g)[1].data(), (*g)[2].data(),
                             m.dout.data(), m.inp.data(), m.weight.data(), kN,
                             kMmC, kOC);
      },
      {true, true, true});
}

// The exact order of operations layers.h documents for the matmul, written
// out in scalar C. Each output element is one sum: s = 0, then
// s = s + a*b for the reduction index ascending (product and sum each
// rounded: this file is built with -ffp-contract=off), then
//   forward:  out = s + bias (nothing added without a bias),
//   backward: g = g + s, once per gradient element.
// Every copy of the kernels (one per ISA) must give these bits exactly.
void EmulateMatmulForward(float* out, const float* inp, const float* weight,
                          const float* bias, int N, int C, int OC) {
  for (int n = 0; n < N; n++) {
    for (int o = 0; o < OC; o++) {
      float s = 0.0f;
      for (int c = 0; c < C; c++) {
        const float p = inp[(size_t)n * C + c] * weight[(size_t)o * C + c];
        s = s + p;
      }
      out[(size_t)n * OC + o] = bias != nullptr ? s + bias[o] : s;
    }
  }
}

void EmulateMatmulBackward(float* dinp, float* dweight, float* dbias,
                           const float* dout, const float* inp,
                           const float* weight, int N, int C, int OC) {
  for (int n = 0; n < N && dinp != nullptr; n++) {
    for (int c = 0; c < C; c++) {
      float s = 0.0f;
      for (int o = 0; o < OC; o++) {
        const float p = dout[(size_t)n * OC + o] * weight[(size_t)o * C + c];
        s = s + p;
      }
      dinp[(size_t)n * C + c] = dinp[(size_t)n * C + c] + s;
    }
  }
  for (int o = 0; o < OC; o++) {
    for (int c = 0; c < C; c++) {
      float s = 0.0f;
      for (int n = 0; n < N; n++) {
        const float p = dout[(size_t)n * OC + o] * inp[(size_t)n * C + c];
        s = s + p;
      }
      dweight[(size_t)o * C + c] = dweight[(size_t)o * C + c] + s;
    }
    if (dbias != nullptr) {  // in chunks of GPT2_SUM_CHUNK_ROWS rows
      float s = 0.0f;
      for (int n0 = 0; n0 < N; n0 += GPT2_SUM_CHUNK_ROWS) {
        float p = 0.0f;
        for (int n = n0; n < N && n < n0 + GPT2_SUM_CHUNK_ROWS; n++)
          p = p + dout[(size_t)n * OC + o];
        s = s + p;
      }
      dbias[o] = dbias[o] + s;
    }
  }
}

// First index where a and b differ bitwise, or -1.
long FirstBitDiff(const Vec& a, const Vec& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return (long)i;
  }
  return -1;
}

#define EXPECT_SAME_BITS(got, want, what)                                 \
  do {                                                                    \
    const long i_ = FirstBitDiff(got, want);                              \
    EXPECT_EQ(i_, -1) << (what) << ": first difference at " << i_ << ": " \
                      << (i_ >= 0 ? (got)[i_] : 0.0f) << " vs "           \
                      << (i_ >= 0 ? (want)[i_] : 0.0f);                   \
  } while (0)

// Runs the copy `isa` (or the public functions for isa < 0) on shapes that
// are small, odd, larger than one tile or one reduction chunk (C > 128,
// 300 = 128 + 128 + 44), with and without bias / dinp / dbias, with gradients
// starting from random values, on 1 and 3 threads; compares bitwise with the
// emulation.
void CheckMatmulExactOrder(int isa) {
  struct Shape {
    int N, C, OC;
  };
  const Shape shapes[] = {{1, 1, 1},   {5, 8, 11},    {3, 17, 33},
                          {7, 33, 5},  {70, 20, 37},  {65, 130, 70},
                          {2, 300, 3}, {64, 128, 64}, {9, 48, 100}};
  const int saved = omp_get_max_threads();
  omp_set_dynamic(0);
  std::mt19937 rng(99);
  for (const Shape& sh : shapes) {
    const int N = sh.N, C = sh.C, OC = sh.OC;
    const Vec inp = Random((size_t)N * C, &rng),
              weight = Random((size_t)OC * C, &rng), bias = Random(OC, &rng),
              dout = Random((size_t)N * OC, &rng),
              dinp0 = Random((size_t)N * C, &rng),
              dw0 = Random((size_t)OC * C, &rng), db0 = Random(OC, &rng);
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      const std::string what = "isa " + std::to_string(isa) + " N " +
                               std::to_string(N) + " C " + std::to_string(C) +
                               " OC " + std::to_string(OC) + " threads " +
                               std::to_string(threads);
      for (bool with_bias : {true, false}) {
        const float* b = with_bias ? bias.data() : nullptr;
        Vec want((size_t)N * OC), got((size_t)N * OC, -7.0f);
        EmulateMatmulForward(want.data(), inp.data(), weight.data(), b, N, C,
                             OC);
        if (isa < 0) {
          gpt2_matmul_forward(got.data(), inp.data(), weight.data(), b, N, C,
                              OC);
        } else {
          zs__gpt2_matmul_forward_isa(isa, got.data(), inp.data(),
                                      weight.data(), b, N, C, OC);
        }
        EXPECT_SAME_BITS(got, want,
                         what + (with_bias ? " out" : " out (no bias)"));
      }
      for (bool full : {true, false}) {  // full: dinp and dbias non-NULL
        Vec want_di = dinp0, want_dw = dw0, want_db = db0;
        Vec di = dinp0, dw = dw0, db = db0;
        float* di_p = full ? di.data() : nullptr;
        float* db_p = full ? db.data() : nullptr;
        EmulateMatmulBackward(full ? want_di.data() : nullptr, want_dw.data(),
                              full ? want_db.data() : nullptr, dout.data(),
                              inp.data(), weight.data(), N, C, OC);
        if (isa < 0) {
          gpt2_matmul_backward(di_p, dw.data(), db_p, dout.data(), inp.data(),
                               weight.data(), N, C, OC);
        } else {
          zs__gpt2_matmul_backward_isa(isa, di_p, dw.data(), db_p, dout.data(),
                                       inp.data(), weight.data(), N, C, OC);
        }
        const std::string tag = full ? "" : " (dinp, dbias NULL)";
        EXPECT_SAME_BITS(di, want_di, what + " dinp" + tag);
        EXPECT_SAME_BITS(dw, want_dw, what + " dweight" + tag);
        EXPECT_SAME_BITS(db, want_db, what + " dbias" + tag);
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Gpt2Matmul, ExactOrderBaselineSse2) { CheckMatmulExactOrder(0); }

TEST(Gpt2Matmul, ExactOrderAvx2) {
  if (!zs__gpt2_matmul_isa_supported(1)) GTEST_SKIP() << "CPU has no AVX2";
  CheckMatmulExactOrder(1);
}

TEST(Gpt2Matmul, ExactOrderAvx512f) {
  if (!zs__gpt2_matmul_isa_supported(2)) GTEST_SKIP() << "CPU has no AVX-512F";
  CheckMatmulExactOrder(2);
}

TEST(Gpt2Matmul, ExactOrderPublicDispatch) { CheckMatmulExactOrder(-1); }

// ---------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------

constexpr size_t kAttSize = (size_t)kB * kNH * kT * kT;

struct AttentionCase {
  std::mt19937 rng{4};
  Vec qkv = Random((size_t)kN * 3 * kC, &rng);
  Vec dout = Random((size_t)kN * kC, &rng);
  Vec preatt = Vec(kAttSize), att = Vec(kAttSize);
  Vec Forward() {
    Vec out((size_t)kN * kC);
    gpt2_attention_forward(out.data(), preatt.data(), att.data(), qkv.data(),
                           kB, kT, kC, kNH);
    return out;
  }
};

// Straightforward causal attention: per (b, h, t) build the scores, softmax,
// weight the values.
Vec ReferenceAttention(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  Vec out((size_t)B * T * C, 0.0f);
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        std::vector<float> w(t + 1);
        for (int t2 = 0; t2 <= t; t2++) {
          float s = 0.0f;
          for (int i = 0; i < hs; i++) {
            s += qkv[((size_t)b * T + t) * 3 * C + h * hs + i] *
                 qkv[((size_t)b * T + t2) * 3 * C + C + h * hs + i];
          }
          w[t2] = s / std::sqrt((float)hs);
        }
        const float mx = *std::max_element(w.begin(), w.end());
        float sum = 0.0f;
        for (float& x : w) sum += (x = std::exp(x - mx));
        for (int i = 0; i < hs; i++) {
          float y = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            y += w[t2] / sum * qkv[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i];
          }
          out[((size_t)b * T + t) * C + h * hs + i] = y;
        }
      }
    }
  }
  return out;
}

TEST(Gpt2Attention, ForwardMatchesReference) {
  AttentionCase a;
  const Vec out = a.Forward();
  const Vec ref = ReferenceAttention(a.qkv, kB, kT, kC, kNH);
  for (size_t i = 0; i < out.size(); i++) {
    // Different but equivalent rounding order (w/sum vs w*(1/sum)): ~ulp.
    EXPECT_NEAR(out[i], ref[i], 1e-5f) << "element " << i;
  }
  // att rows are distributions over t2 <= t; masked entries are written 0.
  for (int bh = 0; bh < kB * kNH; bh++) {
    for (int t = 0; t < kT; t++) {
      float sum = 0.0f;
      for (int t2 = 0; t2 < kT; t2++) {
        const size_t i = ((size_t)bh * kT + t) * kT + t2;
        if (t2 > t) {
          EXPECT_EQ(a.att[i], 0.0f);
          EXPECT_EQ(a.preatt[i], 0.0f);
        }
        sum += a.att[i];
      }
      EXPECT_NEAR(sum, 1.0f, 1e-6f);
    }
  }
}

TEST(Gpt2Attention, IsCausal) {
  AttentionCase a;
  const Vec base = a.Forward();
  std::mt19937 rng(99);
  for (int t = 0; t + 1 < kT; t++) {
    AttentionCase p;
    // perturb q, k and v of position t+1 in every batch row
    for (int b = 0; b < kB; b++) {
      for (int c = 0; c < 3 * kC; c++) {
        p.qkv[((size_t)b * kT + t + 1) * 3 * kC + c] += 0.5f + Random(1, &rng)[0];
      }
    }
    const Vec out = p.Forward();
    for (int b = 0; b < kB; b++) {
      for (int s = 0; s < kT; s++) {
        const float* x = &base[((size_t)b * kT + s) * kC];
        const float* y = &out[((size_t)b * kT + s) * kC];
        const bool same = std::memcmp(x, y, kC * sizeof(float)) == 0;
        if (s <= t) {
          EXPECT_TRUE(same) << "output at " << s << " changed when input at "
                            << t + 1 << " changed (b " << b << ")";
        } else if (s == t + 1) {
          EXPECT_FALSE(same) << "perturbation at " << s << " had no effect";
        }
      }
    }
  }
}

TEST(Gpt2Attention, GradCheckAndScratchOverwritten) {
  AttentionCase a;
  a.Forward();
  Vec dinp((size_t)kN * 3 * kC, 0.0f);
  // scratch starts as NaN: the backward must overwrite every entry
  Vec dpreatt(kAttSize, std::numeric_limits<float>::quiet_NaN());
  Vec datt(kAttSize, std::numeric_limits<float>::quiet_NaN());
  gpt2_attention_backward(dinp.data(), dpreatt.data(), datt.data(),
                          a.dout.data(), a.qkv.data(), a.att.data(), kB, kT,
                          kC, kNH);
  for (size_t i = 0; i < kAttSize; i++) {
    ASSERT_FALSE(std::isnan(dpreatt[i])) << "dpreatt[" << i << "] not written";
    ASSERT_FALSE(std::isnan(datt[i])) << "datt[" << i << "] not written";
  }
  auto f = [&] { return a.Forward(); };
  const Vec num = NumericGrad(&a.qkv, a.dout, f, kFdStep);
  // check q, k and v separately so a failure names the part
  const char* part[3] = {"attention dq", "attention dk", "attention dv"};
  for (int k = 0; k < 3; k++) {
    Vec an, nu;
    for (int n = 0; n < kN; n++) {
      for (int c = 0; c < kC; c++) {
        an.push_back(dinp[(size_t)n * 3 * kC + k * kC + c]);
        nu.push_back(num[(size_t)n * 3 * kC + k * kC + c]);
      }
    }
    ExpectGradNear(part[k], an, nu);
  }
}

TEST(Gpt2Attention, Accumulates) {
  AttentionCase a;
  a.Forward();
  Vec dpreatt(kAttSize), datt(kAttSize);
  CheckAccumulation(
      "attention", {(size_t)kN * 3 * kC},
      [&](std::vector<Vec>* g) {
        gpt2_attention_backward((*g)[0].data(), dpreatt.data(), datt.data(),
                                a.dout.data(), a.qkv.data(), a.att.data(), kB,
                                kT, kC, kNH);
      },
      {true});
}

// ---------------------------------------------------------------------------
// GELU and residual
// ---------------------------------------------------------------------------

TEST(Gpt2Gelu, ForwardKnownValues) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in double (Python math)
  const float x[5] = {-3.0f, -1.0f, 0.0f, 1.0f, 3.0f};
  const float want[5] = {-0.0036373920f, -0.1588080094f, 0.0f, 0.8411919906f,
                         2.9963626080f};
  float out[5];
  gpt2_gelu_forward(out, x, 5);
  for (int i = 0; i < 5; i++) EXPECT_NEAR(out[i], want[i], 1e-6f) << x[i];
}

TEST(Gpt2Gelu, GradCheck) {
  std::mt19937 rng(5);
  const size_t n = (size_t)kN * kC;
  Vec inp = Random(n, &rng, -4.0f, 4.0f), dout = Random(n, &rng);
  Vec dinp(n, 0.0f);
  gpt2_gelu_backward(dinp.data(), inp.data(), dout.data(), n);
  auto f = [&] {
    Vec out(n);
    gpt2_gelu_forward(out.data(), inp.data(), n);
    return out;
  };
  ExpectGradNear("gelu dinp", dinp, NumericGrad(&inp, dout, f, kFdStep));
  CheckAccumulation(
      "gelu", {n},
      [&](std::vector<Vec>* g) {
        gpt2_gelu_backward((*g)[0].data(), inp.data(), dout.data(), n);
      },
      {true});
}

TEST(Gpt2Residual, GradCheck) {
  std::mt19937 rng(6);
  const size_t n = (size_t)kN * kC;
  Vec a = Random(n, &rng), b = Random(n, &rng), dout = Random(n, &rng);
  Vec da(n, 0.0f), db(n, 0.0f);
  gpt2_residual_backward(da.data(), db.data(), dout.data(), n);
  auto f = [&] {
    Vec out(n);
    gpt2_residual_forward(out.data(), a.data(), b.data(), n);
    return out;
  };
  ExpectGradNear("residual da", da, NumericGrad(&a, dout, f, kFdStep));
  ExpectGradNear("residual db", db, NumericGrad(&b, dout, f, kFdStep));
  CheckAccumulation(
      "residual", {n, n},
      [&](std::vector<Vec>* g) {
        gpt2_residual_backward((*g)[0].data(), (*g)[1].data(), dout.data(), n);
      },
      {true, true});
}

// ---------------------------------------------------------------------------
// Softmax + cross-entropy, MSE
// ---------------------------------------------------------------------------

TEST(Gpt2CrossEntropy, UniformLogitsGiveLnV) {
  for (int V : {kV, 50257}) {  // 50257: GPT-2's vocabulary
    const int N = 3;
    Vec logits((size_t)N * V, 0.37f), probs((size_t)N * V), losses(N);
    const std::vector<int> targets = {0, V / 2, V - 1};
    gpt2_softmax_crossentropy_forward(probs.data(), losses.data(),
                                      logits.data(), targets.data(), N, V);
    for (int n = 0; n < N; n++) {
      // sum of V exp(0) = 1 terms is exact below 2^24, so only logf rounds
      EXPECT_NEAR(losses[n], std::log((double)V), 2 * FLT_EPSILON * std::log((double)V))
          << "V " << V;
      EXPECT_NEAR(probs[(size_t)n * V + targets[n]], 1.0f / V, FLT_EPSILON / V);
    }
  }
}

TEST(Gpt2CrossEntropy, GradCheck) {
  std::mt19937 rng(7);
  Vec logits = Random((size_t)kN * kV, &rng, -3.0f, 3.0f);
  const std::vector<int> targets = RandomIds(kN, kV, &rng);
  Vec dlosses = Random(kN, &rng);  // random weights: any normalization works
  Vec probs((size_t)kN * kV), losses(kN);
  auto f = [&] {
    gpt2_softmax_crossentropy_forward(probs.data(), losses.data(),
                                      logits.data(), targets.data(), kN, kV);
    return losses;
  };
  f();
  Vec dlogits((size_t)kN * kV, 0.0f);
  gpt2_softmax_crossentropy_backward(dlogits.data(), dlosses.data(),
                                     probs.data(), targets.data(), kN, kV);
  const Vec num = NumericGrad(&logits, dlosses, f, kFdStep);
  f();  // restore probs for the accumulation check
  ExpectGradNear("crossentropy dlogits", dlogits, num);
  CheckAccumulation(
      "crossentropy", {(size_t)kN * kV},
      [&](std::vector<Vec>* g) {
        gpt2_softmax_crossentropy_backward((*g)[0].data(), dlosses.data(),
                                           probs.data(), targets.data(), kN,
                                           kV);
      },
      {true});
}

TEST(Gpt2Mse, ForwardAndGradCheck) {
  const float pred[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float target[4] = {0.0f, 2.0f, 5.0f, 3.0f};
  float loss = -1.0f;
  gpt2_mse_forward(&loss, pred, target, 2, 2);
  EXPECT_EQ(loss, (1.0f + 0.0f + 4.0f + 1.0f) / 4.0f);

  std::mt19937 rng(8);
  const int D = 7;
  Vec p = Random((size_t)kN * D, &rng), t = Random((size_t)kN * D, &rng);
  const Vec r = {0.7f};  // upstream gradient of the scalar loss
  Vec dp((size_t)kN * D, 0.0f);
  gpt2_mse_backward(dp.data(), r[0], p.data(), t.data(), kN, D);
  auto f = [&] {
    Vec l(1);
    gpt2_mse_forward(l.data(), p.data(), t.data(), kN, D);
    return l;
  };
  ExpectGradNear("mse dpred", dp, NumericGrad(&p, r, f, kFdStep));
  CheckAccumulation(
      "mse", {(size_t)kN * D},
      [&](std::vector<Vec>* g) {
        gpt2_mse_backward((*g)[0].data(), r[0], p.data(), t.data(), kN, D);
      },
      {true});
}

// ---------------------------------------------------------------------------
// Determinism across thread counts: one GPT-2 block + tied LM head
// ---------------------------------------------------------------------------

// Every buffer of a forward + backward pass, by name.
using Buffers = std::vector<std::pair<std::string, Vec>>;

// Odd B, T and a C that leaves partial column tiles (40 = 32 + 8, and
// 16 + 16 + 8 in the layers that tile by 16) so that thread splits and tile
// remainders both vary.
Buffers RunBlock(int threads) {
  const int B = 3, T = 17, C = 40, NH = 4, V = 37, N = B * T;
  const size_t NC = (size_t)N * C, att_n = (size_t)B * NH * T * T;
  std::mt19937 rng(42);
  const std::vector<int> tokens = RandomIds(N, V, &rng);
  const std::vector<int> targets = RandomIds(N, V, &rng);
  auto W = [&](size_t n) { return Random(n, &rng, -0.3f, 0.3f); };
  Vec wte = W((size_t)V * C), wpe = W((size_t)T * C);
  Vec ln1w = W(C), ln1b = W(C), ln2w = W(C), ln2b = W(C), lnfw = W(C),
      lnfb = W(C);
  Vec wqkv = W((size_t)3 * C * C), bqkv = W(3 * C), wproj = W((size_t)C * C),
      bproj = W(C), wfc = W((size_t)4 * C * C), bfc = W(4 * C),
      wfp = W((size_t)C * 4 * C), bfp = W(C);
  Vec mse_target = W(NC);

  omp_set_dynamic(0);
  omp_set_num_threads(threads);
  EXPECT_EQ(omp_get_max_threads(), threads);

  // forward
  Vec x0(NC), ln1(NC), mean1(N), rstd1(N), qkv(3 * NC), preatt(att_n),
      att(att_n), atty(NC), attproj(NC), x1(NC), ln2(NC), mean2(N), rstd2(N),
      fch(4 * NC), fcg(4 * NC), fcproj(NC), x2(NC), lnf(NC), meanf(N),
      rstdf(N), logits((size_t)N * V), probs((size_t)N * V), losses(N),
      mse(1);
  gpt2_encoder_forward(x0.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  gpt2_layernorm_forward(ln1.data(), mean1.data(), rstd1.data(), x0.data(),
                         ln1w.data(), ln1b.data(), N, C);
  gpt2_matmul_forward(qkv.data(), ln1.data(), wqkv.data(), bqkv.data(), N, C, 3 * C);
  gpt2_attention_forward(atty.data(), preatt.data(), att.data(), qkv.data(), B,
                         T, C, NH);
  gpt2_matmul_forward(attproj.data(), atty.data(), wproj.data(), bproj.data(), N, C, C);
  gpt2_residual_forward(x1.data(), x0.data(), attproj.data(), NC);
  gpt2_layernorm_forward(ln2.data(), mean2.data(), rstd2.data(), x1.data(),
                         ln2w.data(), ln2b.data(), N, C);
  gpt2_matmul_forward(fch.data(), ln2.data(), wfc.data(), bfc.data(), N, C, 4 * C);
  gpt2_gelu_forward(fcg.data(), fch.data(), 4 * NC);
  gpt2_matmul_forward(fcproj.data(), fcg.data(), wfp.data(), bfp.data(), N, 4 * C, C);
  gpt2_residual_forward(x2.data(), x1.data(), fcproj.data(), NC);
  gpt2_layernorm_forward(lnf.data(), meanf.data(), rstdf.data(), x2.data(),
                         lnfw.data(), lnfb.data(), N, C);
  gpt2_matmul_forward(logits.data(), lnf.data(), wte.data(), nullptr, N, C, V);
  gpt2_softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(),
                                    targets.data(), N, V);
  gpt2_mse_forward(mse.data(), x2.data(), mse_target.data(), N, C);

  // backward: mean cross-entropy plus the MSE on x2
  Vec dlosses(N, 1.0f / N), dlogits((size_t)N * V, 0.0f), dlnf(NC, 0.0f),
      dwte((size_t)V * C, 0.0f), dwpe((size_t)T * C, 0.0f), dx2(NC, 0.0f),
      dlnfw(C, 0.0f), dlnfb(C, 0.0f), dx1(NC, 0.0f), dfcproj(NC, 0.0f),
      dfcg(4 * NC, 0.0f), dwfp(wfp.size(), 0.0f), dbfp(C, 0.0f),
      dfch(4 * NC, 0.0f), dln2(NC, 0.0f), dwfc(wfc.size(), 0.0f),
      dbfc(4 * C, 0.0f), dln2w(C, 0.0f), dln2b(C, 0.0f), dx0(NC, 0.0f),
      dattproj(NC, 0.0f), datty(NC, 0.0f), dwproj(wproj.size(), 0.0f),
      dbproj(C, 0.0f), dqkv(3 * NC, 0.0f), dpreatt(att_n), datt(att_n),
      dln1(NC, 0.0f), dwqkv(wqkv.size(), 0.0f), dbqkv(3 * C, 0.0f),
      dln1w(C, 0.0f), dln1b(C, 0.0f);
  gpt2_softmax_crossentropy_backward(dlogits.data(), dlosses.data(),
                                     probs.data(), targets.data(), N, V);
  gpt2_matmul_backward(dlnf.data(), dwte.data(), nullptr, dlogits.data(),
                       lnf.data(), wte.data(), N, C, V);
  gpt2_layernorm_backward(dx2.data(), dlnfw.data(), dlnfb.data(), dlnf.data(),
                          x2.data(), lnfw.data(), meanf.data(), rstdf.data(), N, C);
  gpt2_mse_backward(dx2.data(), 1.0f, x2.data(), mse_target.data(), N, C);
  gpt2_residual_backward(dx1.data(), dfcproj.data(), dx2.data(), NC);
  gpt2_matmul_backward(dfcg.data(), dwfp.data(), dbfp.data(), dfcproj.data(),
                       fcg.data(), wfp.data(), N, 4 * C, C);
  gpt2_gelu_backward(dfch.data(), fch.data(), dfcg.data(), 4 * NC);
  gpt2_matmul_backward(dln2.data(), dwfc.data(), dbfc.data(), dfch.data(),
                       ln2.data(), wfc.data(), N, C, 4 * C);
  gpt2_layernorm_backward(dx1.data(), dln2w.data(), dln2b.data(), dln2.data(),
                          x1.data(), ln2w.data(), mean2.data(), rstd2.data(), N, C);
  gpt2_residual_backward(dx0.data(), dattproj.data(), dx1.data(), NC);
  gpt2_matmul_backward(datty.data(), dwproj.data(), dbproj.data(),
                       dattproj.data(), atty.data(), wproj.data(), N, C, C);
  gpt2_attention_backward(dqkv.data(), dpreatt.data(), datt.data(),
                          datty.data(), qkv.data(), att.data(), B, T, C, NH);
  gpt2_matmul_backward(dln1.data(), dwqkv.data(), dbqkv.data(), dqkv.data(),
                       ln1.data(), wqkv.data(), N, C, 3 * C);
  gpt2_layernorm_backward(dx0.data(), dln1w.data(), dln1b.data(), dln1.data(),
                          x0.data(), ln1w.data(), mean1.data(), rstd1.data(), N, C);
  gpt2_encoder_backward(dwte.data(), dwpe.data(), dx0.data(), tokens.data(), B, T, C);

  return {{"x0", x0},         {"ln1", ln1},       {"mean1", mean1},
          {"rstd1", rstd1},   {"qkv", qkv},       {"preatt", preatt},
          {"att", att},       {"atty", atty},     {"attproj", attproj},
          {"x1", x1},         {"fch", fch},       {"fcg", fcg},
          {"fcproj", fcproj}, {"x2", x2},         {"logits", logits},
          {"probs", probs},   {"losses", losses}, {"mse", mse},
          {"dlogits", dlogits}, {"dlnf", dlnf},   {"dlnfw", dlnfw},
          {"dlnfb", dlnfb},   {"dx2", dx2},       {"dwfp", dwfp},
          {"dbfp", dbfp},     {"dfch", dfch},     {"dwfc", dwfc},
          {"dbfc", dbfc},     {"dln2w", dln2w},   {"dln2b", dln2b},
          {"dx1", dx1},       {"dwproj", dwproj}, {"dbproj", dbproj},
          {"dpreatt", dpreatt}, {"datt", datt},   {"dqkv", dqkv},
          {"dwqkv", dwqkv},   {"dbqkv", dbqkv},   {"dln1w", dln1w},
          {"dln1b", dln1b},   {"dx0", dx0},       {"dwte", dwte},
          {"dwpe", dwpe}};
}

TEST(Gpt2Determinism, BitwiseIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  const Buffers one = RunBlock(1);
  for (int threads : {3, 4}) {
    const Buffers many = RunBlock(threads);
    ASSERT_EQ(one.size(), many.size());
    for (size_t k = 0; k < one.size(); k++) {
      EXPECT_TRUE(BitwiseEqual(one[k].second, many[k].second))
          << one[k].first << " differs between 1 and " << threads
          << " threads";
    }
  }
  omp_set_num_threads(saved);
  // sanity: the run produced a real loss and real gradients
  for (const auto& [name, v] : one) {
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

}  // namespace
