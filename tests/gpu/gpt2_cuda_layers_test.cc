// gpt2_cuda_layers_test.cc: every entry of gpt2_cuda_ops (the GPT-2 layers
// on the GPU, examples/gpt2/layers_cuda.cu) against gpt2_cpu_ops (layers.c)
// on the same random inputs. Tagged zs_gpu; skipped with the reason when no
// CUDA device is usable.
//
// Tolerances, by what the GPU computes differently:
//   - bitwise: kernels whose math is only +, -, *, / and sqrt in layers.c's
//     order, compiled with -fmad=false and IEEE division and square root
//     (encoder, layernorm, residual, bias sums, fill, the loss sum);
//   - 4 ulp-scale (rtol 2e-6): kernels through expf/tanhf/logf, whose CUDA
//     versions are within 2 ulp of glibc's (GELU, softmax, cross-entropy);
//   - rtol 1e-5 + atol 1e-5 * max|x|: cuBLAS GEMMs (matmul, attention), whose
//     summation order is cuBLAS's: fp32 sums of k <= 64 terms of N(0,1)
//     products differ by a few ulp of the largest partial sum; the
//     attention's softmax (one warp per row, a shuffle tree for the row
//     sums) is checked with the attention, at rtol 1e-4.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "examples/gpt2/layers_cuda.h"
#include "examples/gpt2/model.h"
#include "tests/gpu/gpu_available.h"

namespace {

const gpt2_layer_ops& kCpu = gpt2_cpu_ops;
const gpt2_layer_ops& kGpu = gpt2_cuda_ops;

class Gpt2CudaLayers : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = zstest::NoGpuReason();
    if (!why.empty()) {
      GTEST_SKIP() << why;
    }
    gpu_ = true;
    char err[512];
    ASSERT_EQ(0, gpt2_cuda_init(err, sizeof err)) << err;
  }
  void TearDown() override {
    char msg[512] = "";
    if (gpu_) {
      EXPECT_EQ(0, kGpu.error(msg, sizeof msg)) << msg;
    }
    for (void* p : device_) kGpu.free(p);
  }
  // A device copy of host data.
  template <typename T>
  T* Dev(const std::vector<T>& h) {
    void* p = kGpu.alloc(h.size() * sizeof(T));
    EXPECT_NE(nullptr, p);
    kGpu.upload(p, h.data(), h.size() * sizeof(T));
    device_.push_back(p);
    return (T*)p;
  }
  template <typename T>
  std::vector<T> Host(const T* d, size_t n) {
    std::vector<T> h(n);
    kGpu.download(h.data(), d, n * sizeof(T));
    return h;
  }
  std::vector<void*> device_;
  bool gpu_ = false;
};

std::vector<float> Random(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<int> Tokens(size_t n, int V, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<int> v(n);
  for (auto& x : v) x = (int)(g() % (unsigned)V);
  return v;
}

// |gpu - cpu| <= atol_scale * max|cpu| + rtol * |cpu|; bitwise when both 0.
void ExpectNear(const std::vector<float>& cpu, const std::vector<float>& gpu,
                double rtol, double atol_scale, const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  double amax = 0;
  for (float x : cpu) amax = std::fmax(amax, std::fabs(x));
  for (size_t i = 0; i < cpu.size(); i++) {
    if (rtol == 0 && atol_scale == 0) {
      ASSERT_EQ(0, std::memcmp(&cpu[i], &gpu[i], sizeof(float)))
          << what << "[" << i << "]: cpu " << cpu[i] << ", gpu " << gpu[i];
      continue;
    }
    const double tol = atol_scale * amax + rtol * std::fabs(cpu[i]);
    ASSERT_LE(std::fabs((double)gpu[i] - cpu[i]), tol)
        << what << "[" << i << "]: cpu " << cpu[i] << ", gpu " << gpu[i];
  }
}

// N = 171 rows: two full chunks of the gradient sums' GPT2_SUM_CHUNK_ROWS
// and a partial one (whose 43 rows leave a tail after the kernels'
// 8-row unrolled loads).
constexpr int B = 3, T = 57, C = 48, NH = 4, V = 67, N = B * T;

TEST_F(Gpt2CudaLayers, EncoderAndLayernormAreBitwise) {
  auto tok = Tokens(N, V, 1);
  auto wte = Random((size_t)V * C, 2), wpe = Random((size_t)T * C, 3);
  std::vector<float> out((size_t)N * C);
  kCpu.encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  float* dout = Dev(std::vector<float>((size_t)N * C));
  kGpu.encoder_forward(dout, Dev(tok), Dev(wte), Dev(wpe), B, T, C);
  ExpectNear(out, Host(dout, out.size()), 0, 0, "encoder out");

  auto g = Random((size_t)N * C, 4);
  auto dwte = Random((size_t)V * C, 5), dwpe = Random((size_t)T * C, 6);
  float* gdwte = Dev(dwte);
  float* gdwpe = Dev(dwpe);
  kCpu.encoder_backward(dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
  kGpu.encoder_backward(gdwte, gdwpe, Dev(g), Dev(tok), B, T, C);
  ExpectNear(dwte, Host(gdwte, dwte.size()), 0, 0, "dwte");
  ExpectNear(dwpe, Host(gdwpe, dwpe.size()), 0, 0, "dwpe");

  auto x = Random((size_t)N * C, 7), w = Random(C, 8), b = Random(C, 9);
  std::vector<float> y((size_t)N * C), mean(N), rstd(N);
  kCpu.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                         b.data(), N, C);
  float* gy = Dev(std::vector<float>(y.size()));
  float* gm = Dev(std::vector<float>(N));
  float* gr = Dev(std::vector<float>(N));
  float *gx = Dev(x), *gw = Dev(w);
  kGpu.layernorm_forward(gy, gm, gr, gx, gw, Dev(b), N, C);
  ExpectNear(y, Host(gy, y.size()), 0, 0, "layernorm out");
  ExpectNear(mean, Host(gm, N), 0, 0, "layernorm mean");
  ExpectNear(rstd, Host(gr, N), 0, 0, "layernorm rstd");

  auto dx = Random((size_t)N * C, 10), dw = Random(C, 11), db = Random(C, 12);
  float *gdx = Dev(dx), *gdw = Dev(dw), *gdb = Dev(db);
  kCpu.layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(),
                          w.data(), mean.data(), rstd.data(), N, C);
  kGpu.layernorm_backward(gdx, gdw, gdb, Dev(g), gx, gw, gm, gr, N, C);
  ExpectNear(dx, Host(gdx, dx.size()), 0, 0, "layernorm dinp");
  ExpectNear(dw, Host(gdw, C), 0, 0, "layernorm dweight");
  ExpectNear(db, Host(gdb, C), 0, 0, "layernorm dbias");

  std::vector<float> r(x.size());
  kCpu.residual_forward(r.data(), x.data(), g.data(), r.size());
  float* gres = Dev(std::vector<float>(r.size()));
  kGpu.residual_forward(gres, gx, Dev(g), r.size());
  ExpectNear(r, Host(gres, r.size()), 0, 0, "residual");
}

TEST_F(Gpt2CudaLayers, MatmulAndAttentionMatchWithinGemmRounding) {
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    const int OC = 3 * C;
    auto inp = Random((size_t)N * C, 20), w = Random((size_t)OC * C, 21);
    auto bias = Random(OC, 22), dout = Random((size_t)N * OC, 23);
    std::vector<float> out((size_t)N * OC);
    kCpu.matmul_forward(out.data(), inp.data(), w.data(),
                        with_bias ? bias.data() : nullptr, N, C, OC);
    float* gout = Dev(std::vector<float>(out.size()));
    float *ginp = Dev(inp), *gw = Dev(w);
    kGpu.matmul_forward(gout, ginp, gw, with_bias ? Dev(bias) : nullptr, N, C,
                        OC);
    ExpectNear(out, Host(gout, out.size()), 1e-5, 1e-5, "matmul out");
    auto dinp = Random((size_t)N * C, 24), dw = Random((size_t)OC * C, 25);
    auto db = Random(OC, 26);
    float *gdinp = Dev(dinp), *gdw = Dev(dw), *gdb = Dev(db);
    kCpu.matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr,
                         dout.data(), inp.data(), w.data(), N, C, OC);
    kGpu.matmul_backward(gdinp, gdw, with_bias ? gdb : nullptr, Dev(dout), ginp,
                         gw, N, C, OC);
    ExpectNear(dinp, Host(gdinp, dinp.size()), 1e-5, 1e-5, "matmul dinp");
    ExpectNear(dw, Host(gdw, dw.size()), 1e-5, 1e-5, "matmul dweight");
    ExpectNear(db, Host(gdb, OC), 0, 0, "matmul dbias");
  }
  const size_t att = (size_t)B * NH * T * T, btc = (size_t)N * C;
  auto qkv = Random(3 * btc, 30), dy = Random(btc, 31);
  std::vector<float> out(btc), pre(att), a(att);
  kCpu.attention_forward(out.data(), pre.data(), a.data(), qkv.data(), B, T, C,
                         NH);
  float* gout = Dev(std::vector<float>(btc));
  float* gpre = Dev(std::vector<float>(att));
  float* gatt = Dev(std::vector<float>(att));
  float* gqkv = Dev(qkv);
  kGpu.attention_forward(gout, gpre, gatt, gqkv, B, T, C, NH);
  ExpectNear(pre, Host(gpre, att), 1e-5, 1e-5, "preatt");
  ExpectNear(a, Host(gatt, att), 1e-4, 1e-5, "att");
  ExpectNear(out, Host(gout, btc), 1e-4, 1e-5, "attention out");
  auto dqkv = Random(3 * btc, 32);
  float* gdqkv = Dev(dqkv);
  std::vector<float> dpre(att), datt(att);
  kCpu.attention_backward(dqkv.data(), dpre.data(), datt.data(), dy.data(),
                          qkv.data(), a.data(), B, T, C, NH);
  // the GPU backward from the CPU's att, so only the backward differs
  kGpu.attention_backward(gdqkv, Dev(std::vector<float>(att)),
                          Dev(std::vector<float>(att)), Dev(dy), gqkv, Dev(a),
                          B, T, C, NH);
  ExpectNear(dqkv, Host(gdqkv, dqkv.size()), 1e-4, 1e-5, "attention dqkv");
}

TEST_F(Gpt2CudaLayers, TranscendentalKernelsMatchWithinUlps) {
  const size_t n = (size_t)N * 4 * C;
  auto x = Random(n, 40, 2.0f), d = Random(n, 41), acc = Random(n, 42);
  std::vector<float> y(n);
  kCpu.gelu_forward(y.data(), x.data(), n);
  float* gy = Dev(std::vector<float>(n));
  float* gx = Dev(x);
  kGpu.gelu_forward(gy, gx, n);
  ExpectNear(y, Host(gy, n), 2e-6, 1e-7, "gelu");
  float* gacc = Dev(acc);
  kCpu.gelu_backward(acc.data(), x.data(), d.data(), n);
  kGpu.gelu_backward(gacc, gx, Dev(d), n);
  // a tanhf 1-2 ulps apart (CUDA's is documented at 2 ulps) moves the
  // gradient by up to ~0.5 * ulp * |x| * 2 * du/dx * |dout| (~2e-6 at
  // |x| ~ 3, |dout| ~ 4), which can exceed 1e-7 of the largest value where
  // the result is near 0: 1e-6 of it (a wrong formula is off by O(1))
  ExpectNear(acc, Host(gacc, n), 2e-6, 1e-6, "gelu backward");

  auto logits = Random((size_t)N * V, 43, 3.0f);
  auto tg = Tokens(N, V, 44);
  std::vector<float> probs((size_t)N * V), losses(N);
  kCpu.softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(),
                                    tg.data(), N, V);
  float* gp = Dev(std::vector<float>(probs.size()));
  float* gl = Dev(std::vector<float>(N));
  int* gt = Dev(tg);
  kGpu.softmax_crossentropy_forward(gp, gl, Dev(logits), gt, N, V);
  ExpectNear(probs, Host(gp, probs.size()), 2e-6, 1e-7, "probs");
  ExpectNear(losses, Host(gl, N), 2e-6, 1e-7, "losses");
  // the loss sum: sequential double on both, so bitwise for equal losses
  EXPECT_EQ(kCpu.sum(losses.data(), N), kGpu.sum(Dev(losses), N));
  std::vector<float> dl(N, 1.0f / N), dz = Random(probs.size(), 45);
  float* gdl = Dev(std::vector<float>(N));
  kGpu.fill(gdl, 1.0f / N, N);
  ExpectNear(dl, Host(gdl, N), 0, 0, "fill");
  float* gdz = Dev(dz);
  kCpu.softmax_crossentropy_backward(dz.data(), dl.data(), probs.data(),
                                     tg.data(), N, V);
  kGpu.softmax_crossentropy_backward(gdz, gdl, Dev(probs), gt, N, V);
  ExpectNear(dz, Host(gdz, dz.size()), 0, 0, "dlogits (same probs)");
}

}  // namespace
