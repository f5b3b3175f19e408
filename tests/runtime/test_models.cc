// test_models.cc — the parity-test models (see test_models.h), built from
// the GPT-2 example's layer functions.
#include "tests/runtime/test_models.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "examples/gpt2/layers.h"

namespace zstest {

static uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float HashUniform(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = SplitMix(SplitMix(SplitMix(a) ^ b) ^ c);
  return (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

void Model::Init(int t, float* data) const {
  const TensorSpec& s = tensors[t];
  // Weight-like tensors (2-d) get small random values; 1-d tensors named
  // like a norm weight start at 1, other 1-d tensors at small values.
  bool norm_weight = s.shape.size() == 1 &&
                     s.name.find("ln") != std::string::npos &&
                     s.name.find("_w") != std::string::npos;
  for (size_t i = 0; i < s.numel(); i++)
    data[i] = norm_weight ? 1.0f + 0.1f * HashUniform(7, t, i)
                          : 0.3f * HashUniform(11, t, i);
}

// ---- A linear layer + optional GELU, shared by the MLP-like models ----

namespace {

using Buf = std::vector<float>;

// y = act(x W^T + b) for nb rows; saves pre-activations for backward.
struct Linear {
  int in, out;
  bool gelu;
  Buf pre, post;  // (nb, out)
  void Forward(const float* w, const float* b, const float* x, int nb) {
    pre.assign((size_t)nb * out, 0.f);
    post.assign((size_t)nb * out, 0.f);
    gpt2_matmul_forward(pre.data(), x, w, b, nb, in, out);
    if (gelu)
      gpt2_gelu_forward(post.data(), pre.data(), pre.size());
    else
      post = pre;
  }
  const float* Out() const { return post.data(); }
  // dx may be null. dy: (nb, out) gradient of post.
  void Backward(float* dw, float* db, float* dx, const float* dy,
                const float* x, const float* w, int nb) {
    Buf dpre((size_t)nb * out, 0.f);
    if (gelu)
      gpt2_gelu_backward(dpre.data(), pre.data(), dy, dpre.size());
    else
      std::memcpy(dpre.data(), dy, dpre.size() * sizeof(float));
    gpt2_matmul_backward(dx, dw, db, dpre.data(), x, w, nb, in, out);
  }
};

void FillBatch(uint64_t tag, int step, int b0, int nb, int dim, Buf* out) {
  out->resize((size_t)nb * dim);
  for (int i = 0; i < nb; i++)
    for (int d = 0; d < dim; d++)
      (*out)[(size_t)i * dim + d] = HashUniform(tag, step, (uint64_t)(b0 + i) * 1000 + d);
}

// A learnable teacher: target d of a sample is a fixed linear map of the
// sample's inputs, so the loss can fall.
void Teacher(const Buf& x, int nb, int din, int dout, Buf* y) {
  y->assign((size_t)nb * dout, 0.f);
  for (int i = 0; i < nb; i++)
    for (int d = 0; d < dout; d++) {
      const float* xi = &x[(size_t)i * din];
      (*y)[(size_t)i * dout + d] =
          0.5f * xi[d % din] - 0.25f * xi[(d + 3) % din];
    }
}

void AddLinear(Model* m, const std::string& name, int in, int out) {
  int w = (int)m->tensors.size();
  m->tensors.push_back({name + ".w", {out, in}});
  m->tensors.push_back({name + ".b", {out}});
  m->tensors.back().no_decay = true;
  m->units.push_back({name, {w, w + 1}});
}

// ==== MLP: 13 -> 17 -> 19 -> 5, GELU, MSE ================================

class Mlp : public Model {
 public:
  Mlp() {
    AddLinear(this, "l0", 13, 17);
    AddLinear(this, "l1", 17, 19);
    AddLinear(this, "l2", 19, 5);
  }
  float Step(Access& a, int step, int b0, int nb) override {
    Buf x, y;
    FillBatch(1, step, b0, nb, 13, &x);
    Teacher(x, nb, 13, 5, &y);
    Linear l[3] = {{13, 17, true, {}, {}}, {17, 19, true, {}, {}},
                   {19, 5, false, {}, {}}};
    const float* in[3];
    in[0] = x.data();
    for (int u = 0; u < 3; u++) {
      a.BeginForward(u);
      l[u].Forward(a.Param(2 * u), a.Param(2 * u + 1), in[u], nb);
      a.EndForward(u);
      if (u < 2) in[u + 1] = l[u].Out();
    }
    float loss = 0;
    gpt2_mse_forward(&loss, l[2].Out(), y.data(), nb, 5);
    Buf dy((size_t)nb * 5, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, l[2].Out(), y.data(), nb, 5);
    for (int u = 2; u >= 0; u--) {
      Buf dx(u > 0 ? (size_t)nb * l[u].in : 0, 0.f);
      a.BeginBackward(u);
      l[u].Backward(a.Grad(2 * u), a.Grad(2 * u + 1), u > 0 ? dx.data() : nullptr,
                    dy.data(), in[u], a.Param(2 * u), nb);
      a.EndBackward(u);
      dy.swap(dx);
    }
    return loss;
  }
};

// ==== Tiny transformer: embed, one pre-LN block, final LN + tied head ====

class Transformer : public Model {
 public:
  static constexpr int V = 23, T = 6, C = 16, NH = 2;
  enum {
    kWte, kWpe,                                   // unit "embed"
    kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB,   // unit "block"
    kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
    kLnfW, kLnfB, kHead,                          // unit "head"
    kCount
  };
  Transformer() {
    tensors = {{"wte", {V, C}},          {"wpe", {T, C}},
               {"ln1_w", {C}},           {"ln1_b", {C}},
               {"qkv.w", {3 * C, C}},    {"qkv.b", {3 * C}},
               {"proj.w", {C, C}},       {"proj.b", {C}},
               {"ln2_w", {C}},           {"ln2_b", {C}},
               {"fc.w", {4 * C, C}},     {"fc.b", {4 * C}},
               {"fcproj.w", {C, 4 * C}}, {"fcproj.b", {C}},
               {"lnf_w", {C}},           {"lnf_b", {C}},
               {"lm_head", {V, C}, kWte}};
    // The key bias shifts every score of a row equally, which softmax
    // ignores: its true gradient is exactly zero and Adam would amplify the
    // rounding noise. Frozen, as GPT-2 trainers often leave it.
    tensors[kQkvB].frozen = true;
    units = {{"embed", {kWte, kWpe}},
             {"block", {kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W,
                        kLn2B, kFcW, kFcB, kFcProjW, kFcProjB}},
             {"head", {kLnfW, kLnfB, kHead}}};
  }

  float Step(Access& a, int step, int b0, int nb) override {
    const int B = nb, N = B * T;
    std::vector<int> tok((size_t)N), tgt((size_t)N);
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++) {
        float u1 = HashUniform(3, step, (uint64_t)(b0 + b) * 100 + t);
        float u2 = HashUniform(4, step, (uint64_t)(b0 + b) * 100 + t);
        tok[(size_t)b * T + t] = (int)((u1 + 1.f) * 0.5f * V) % V;
        tgt[(size_t)b * T + t] = (int)((u2 + 1.f) * 0.5f * V) % V;
      }
    auto z = [](size_t n) { return Buf(n, 0.f); };
    const size_t NC = (size_t)N * C;
    Buf enc = z(NC), ln1 = z(NC), m1 = z(N), r1 = z(N), qkv = z(3 * NC),
        atty = z(NC), pre = z((size_t)B * NH * T * T),
        att = z((size_t)B * NH * T * T), proj = z(NC), res2 = z(NC),
        ln2 = z(NC), m2 = z(N), r2 = z(N), fch = z(4 * NC), fcg = z(4 * NC),
        fcp = z(NC), res3 = z(NC), lnf = z(NC), mf = z(N), rf = z(N),
        logits = z((size_t)N * V), probs = z((size_t)N * V), losses = z(N);
    // forward
    a.BeginForward(0);
    gpt2_encoder_forward(enc.data(), tok.data(), a.Param(kWte), a.Param(kWpe), B, T, C);
    a.EndForward(0);
    a.BeginForward(1);
    gpt2_layernorm_forward(ln1.data(), m1.data(), r1.data(), enc.data(), a.Param(kLn1W), a.Param(kLn1B), N, C);
    gpt2_matmul_forward(qkv.data(), ln1.data(), a.Param(kQkvW), a.Param(kQkvB), N, C, 3 * C);
    gpt2_attention_forward(atty.data(), pre.data(), att.data(), qkv.data(), B, T, C, NH);
    gpt2_matmul_forward(proj.data(), atty.data(), a.Param(kProjW), a.Param(kProjB), N, C, C);
    gpt2_residual_forward(res2.data(), enc.data(), proj.data(), NC);
    gpt2_layernorm_forward(ln2.data(), m2.data(), r2.data(), res2.data(), a.Param(kLn2W), a.Param(kLn2B), N, C);
    gpt2_matmul_forward(fch.data(), ln2.data(), a.Param(kFcW), a.Param(kFcB), N, C, 4 * C);
    gpt2_gelu_forward(fcg.data(), fch.data(), fch.size());
    gpt2_matmul_forward(fcp.data(), fcg.data(), a.Param(kFcProjW), a.Param(kFcProjB), N, 4 * C, C);
    gpt2_residual_forward(res3.data(), res2.data(), fcp.data(), NC);
    a.EndForward(1);
    a.BeginForward(2);
    gpt2_layernorm_forward(lnf.data(), mf.data(), rf.data(), res3.data(), a.Param(kLnfW), a.Param(kLnfB), N, C);
    gpt2_matmul_forward(logits.data(), lnf.data(), a.Param(kHead), nullptr, N, C, V);
    gpt2_softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V);
    a.EndForward(2);
    float loss = 0;
    for (float l : losses) loss += l;
    loss /= (float)N;
    // backward
    Buf dl(N, 1.0f / (float)N), dlogits = z((size_t)N * V), dlnf = z(NC),
        dres3 = z(NC), dfcp = z(NC), dfcg = z(4 * NC), dfch = z(4 * NC),
        dln2 = z(NC), dres2 = z(NC), dproj = z(NC), datty = z(NC),
        dqkv = z(3 * NC), dpre = z(pre.size()), datt = z(att.size()),
        dln1 = z(NC), denc = z(NC);
    a.BeginBackward(2);
    gpt2_softmax_crossentropy_backward(dlogits.data(), dl.data(), probs.data(), tgt.data(), N, V);
    gpt2_matmul_backward(dlnf.data(), a.Grad(kHead), nullptr, dlogits.data(), lnf.data(), a.Param(kHead), N, C, V);
    gpt2_layernorm_backward(dres3.data(), a.Grad(kLnfW), a.Grad(kLnfB), dlnf.data(), res3.data(), a.Param(kLnfW), mf.data(), rf.data(), N, C);
    a.EndBackward(2);
    a.BeginBackward(1);
    gpt2_residual_backward(dres2.data(), dfcp.data(), dres3.data(), NC);
    gpt2_matmul_backward(dfcg.data(), a.Grad(kFcProjW), a.Grad(kFcProjB), dfcp.data(), fcg.data(), a.Param(kFcProjW), N, 4 * C, C);
    gpt2_gelu_backward(dfch.data(), fch.data(), dfcg.data(), fch.size());
    gpt2_matmul_backward(dln2.data(), a.Grad(kFcW), a.Grad(kFcB), dfch.data(), ln2.data(), a.Param(kFcW), N, C, 4 * C);
    gpt2_layernorm_backward(dres2.data(), a.Grad(kLn2W), a.Grad(kLn2B), dln2.data(), res2.data(), a.Param(kLn2W), m2.data(), r2.data(), N, C);
    gpt2_residual_backward(denc.data(), dproj.data(), dres2.data(), NC);
    gpt2_matmul_backward(datty.data(), a.Grad(kProjW), a.Grad(kProjB), dproj.data(), atty.data(), a.Param(kProjW), N, C, C);
    gpt2_attention_backward(dqkv.data(), dpre.data(), datt.data(), datty.data(), qkv.data(), att.data(), B, T, C, NH);
    gpt2_matmul_backward(dln1.data(), a.Grad(kQkvW), nullptr, dqkv.data(), ln1.data(), a.Param(kQkvW), N, C, 3 * C);
    gpt2_layernorm_backward(denc.data(), a.Grad(kLn1W), a.Grad(kLn1B), dln1.data(), enc.data(), a.Param(kLn1W), m1.data(), r1.data(), N, C);
    a.EndBackward(1);
    a.BeginBackward(0);
    gpt2_encoder_backward(a.Grad(kWte), a.Grad(kWpe), denc.data(), tok.data(), B, T, C);
    a.EndBackward(0);
    return loss;
  }
};

// ==== Degenerate sizes =====================================================
// Unit "odd": a 7-element vector (7 % W != 0 for W = 2, 3, 4) and an empty
// [0, 5] tensor; unit "one": a single element (numel < W: some ranks own
// only padding); unit "mixed": a 3x3 matrix, a scalar and a frozen vector.
// Loss: 0.5 * sum_i c_i * (p_i - target_i)^2 over every trainable element,
// with per-sample targets, averaged over the samples.

class Degenerate : public Model {
 public:
  Degenerate() {
    tensors = {{"odd.v", {7}},  {"odd.empty", {0, 5}}, {"one.s", {1}},
               {"mix.m", {3, 3}}, {"mix.scalar", {}},  {"mix.frozen", {4}}};
    tensors[5].frozen = true;
    units = {{"odd", {0, 1}}, {"one", {2}}, {"mixed", {3, 4, 5}}};
  }
  float Step(Access& a, int step, int b0, int nb) override {
    float loss = 0;
    std::vector<float> targets;
    for (int u = 0; u < (int)units.size(); u++) {
      a.BeginBackward(u);  // gives parameters and gradients
      for (int t : units[u].tensors) {
        if (tensors[t].frozen) continue;
        float* p = a.Param(t);
        float* g = a.Grad(t);
        float frozen_bias = 0;
        if (u == 2) {  // the frozen vector shifts the targets of its unit
          const float* f = a.Param(5);
          for (int k = 0; k < 4; k++) frozen_bias += f[k];
        }
        for (size_t i = 0; i < tensors[t].numel(); i++) {
          float c = 1.0f + 0.5f * (float)(i % 3);
          float acc = 0;
          for (int s = 0; s < nb; s++) {
            float target = HashUniform(5 + t, step, (uint64_t)(b0 + s) * 100 + i) + 0.1f * frozen_bias;
            float d = p[i] - target;
            loss += 0.5f * c * d * d / (float)nb;
            acc += c * d;
          }
          g[i] += acc / (float)nb;
        }
      }
      a.EndBackward(u);
    }
    return loss;
  }
};

// ==== A unit applied twice =================================================
// h = gelu(x W^T + b); y = h W^T + b with the same square W, b (unit "sq"),
// then a head unit; the reduction of "sq" must happen once per step.

class TwiceUsed : public Model {
 public:
  static constexpr int D = 9;
  TwiceUsed() {
    AddLinear(this, "sq", D, D);
    AddLinear(this, "out", D, 3);
  }
  float Step(Access& a, int step, int b0, int nb) override {
    Buf x, y;
    FillBatch(6, step, b0, nb, D, &x);
    Teacher(x, nb, D, 3, &y);
    Linear first{D, D, true, {}, {}}, second{D, D, true, {}, {}},
        head{D, 3, false, {}, {}};
    a.BeginForward(0);
    first.Forward(a.Param(0), a.Param(1), x.data(), nb);
    a.EndForward(0);
    a.BeginForward(0);
    second.Forward(a.Param(0), a.Param(1), first.Out(), nb);
    a.EndForward(0);
    a.BeginForward(1);
    head.Forward(a.Param(2), a.Param(3), second.Out(), nb);
    a.EndForward(1);
    float loss = 0;
    gpt2_mse_forward(&loss, head.Out(), y.data(), nb, 3);
    Buf dy((size_t)nb * 3, 0.f), d2((size_t)nb * D, 0.f), d1((size_t)nb * D, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, head.Out(), y.data(), nb, 3);
    a.BeginBackward(1);
    head.Backward(a.Grad(2), a.Grad(3), d2.data(), dy.data(), second.Out(), a.Param(2), nb);
    a.EndBackward(1);
    a.BeginBackward(0);
    second.Backward(a.Grad(0), a.Grad(1), d1.data(), d2.data(), first.Out(), a.Param(0), nb);
    a.EndBackward(0);
    a.BeginBackward(0);
    first.Backward(a.Grad(0), a.Grad(1), nullptr, d1.data(), x.data(), a.Param(0), nb);
    a.EndBackward(0);
    return loss;
  }
};

// ==== A branch used on odd steps only ======================================

class Branch : public Model {
 public:
  Branch() {
    AddLinear(this, "in", 6, 8);
    AddLinear(this, "branch", 8, 8);
    AddLinear(this, "out", 8, 2);
  }
  float Step(Access& a, int step, int b0, int nb) override {
    const bool use = step % 2 == 1;
    Buf x, y;
    FillBatch(8, step, b0, nb, 6, &x);
    Teacher(x, nb, 6, 2, &y);
    Linear l0{6, 8, true, {}, {}}, lb{8, 8, true, {}, {}}, l2{8, 2, false, {}, {}};
    a.BeginForward(0);
    l0.Forward(a.Param(0), a.Param(1), x.data(), nb);
    a.EndForward(0);
    const float* h = l0.Out();
    if (use) {
      a.BeginForward(1);
      lb.Forward(a.Param(2), a.Param(3), h, nb);
      a.EndForward(1);
      h = lb.Out();
    }
    a.BeginForward(2);
    l2.Forward(a.Param(4), a.Param(5), h, nb);
    a.EndForward(2);
    float loss = 0;
    gpt2_mse_forward(&loss, l2.Out(), y.data(), nb, 2);
    Buf dy((size_t)nb * 2, 0.f), dh((size_t)nb * 8, 0.f), dh0((size_t)nb * 8, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, l2.Out(), y.data(), nb, 2);
    a.BeginBackward(2);
    l2.Backward(a.Grad(4), a.Grad(5), dh.data(), dy.data(), h, a.Param(4), nb);
    a.EndBackward(2);
    if (use) {
      a.BeginBackward(1);
      lb.Backward(a.Grad(2), a.Grad(3), dh0.data(), dh.data(), l0.Out(), a.Param(2), nb);
      a.EndBackward(1);
    } else {
      dh0 = dh;
    }
    a.BeginBackward(0);
    l0.Backward(a.Grad(0), a.Grad(1), nullptr, dh0.data(), x.data(), a.Param(0), nb);
    a.EndBackward(0);
    return loss;
  }
};

// ==== A stack with a branch on odd steps ====================================

// Units: embed (192 -> 32), b0, b1, branch (odd steps only), b2 (32 -> 32,
// GELU), out (32 -> 4). The embedding is about 6 blocks, as GPT-2's token
// embedding is 5.4 of its blocks, so prefetching blocks under a live limit
// of the largest unit fits. Each unit's forward and backward sleeps
// `sleep_us` after its compute (a device kernel's time while the host
// waits; nothing in the results changes).
class BranchStack : public Model {
 public:
  static constexpr int kIn = 192, kD = 32, kOut = 4, kBranch = 3;
  explicit BranchStack(int sleep_us) : sleep_us_(sleep_us) {
    AddLinear(this, "embed", kIn, kD);
    AddLinear(this, "b0", kD, kD);
    AddLinear(this, "b1", kD, kD);
    AddLinear(this, "branch", kD, kD);
    AddLinear(this, "b2", kD, kD);
    AddLinear(this, "out", kD, kOut);
  }
  float Step(Access& a, int step, int b0, int nb) override {
    const bool use = step % 2 == 1;
    Buf x, y;
    FillBatch(9, step, b0, nb, kIn, &x);
    Teacher(x, nb, kIn, kOut, &y);
    const int nu = (int)units.size();
    std::vector<Linear> l;
    for (int u = 0; u < nu; u++)
      l.push_back({u == 0 ? kIn : kD, u == nu - 1 ? kOut : kD, u < nu - 1, {}, {}});
    std::vector<int> path;
    for (int u = 0; u < nu; u++)
      if (u != kBranch || use) path.push_back(u);
    std::vector<const float*> in(nu, nullptr);
    const float* h = x.data();
    for (int u : path) {
      in[u] = h;
      a.BeginForward(u);
      l[u].Forward(a.Param(2 * u), a.Param(2 * u + 1), h, nb);
      Pause();
      a.EndForward(u);
      h = l[u].Out();
    }
    float loss = 0;
    gpt2_mse_forward(&loss, h, y.data(), nb, kOut);
    Buf dy((size_t)nb * kOut, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, h, y.data(), nb, kOut);
    for (size_t k = path.size(); k-- > 0;) {
      const int u = path[k];
      Buf dx(k > 0 ? (size_t)nb * kD : 0, 0.f);
      a.BeginBackward(u);
      l[u].Backward(a.Grad(2 * u), a.Grad(2 * u + 1), k > 0 ? dx.data() : nullptr,
                    dy.data(), in[u], a.Param(2 * u), nb);
      Pause();
      a.EndBackward(u);
      dy.swap(dx);
    }
    return loss;
  }

 private:
  void Pause() const {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
  }
  int sleep_us_;
};

// ==== A mixture of experts ==================================================

}  // namespace

int MoeRoute(int step, int j, int global_batch) {
  // quarters of the batch over the table; entry 4 (expert c) is left out
  // whenever step % 5 == 0, so then no slice uses c
  static const int table[5] = {0, 1, -1, 0, 2};
  const int quarter = j * 4 / global_batch;
  return table[(quarter + step) % 5];
}

namespace {

class Moe : public Model {
 public:
  explicit Moe(int global_batch) : G_(global_batch) {
    AddLinear(this, "in", 6, 8);
    AddLinear(this, "expert.a", 8, 8);
    AddLinear(this, "expert.b", 8, 8);
    AddLinear(this, "expert.c", 8, 8);
    AddLinear(this, "out", 8, 2);
  }
  float Step(Access& a, int step, int b0, int nb) override {
    Buf x, y;
    FillBatch(9, step, b0, nb, 6, &x);
    Teacher(x, nb, 6, 2, &y);
    Linear l0{6, 8, true, {}, {}}, l2{8, 2, false, {}, {}};
    Linear ex[3] = {{8, 8, true, {}, {}}, {8, 8, true, {}, {}}, {8, 8, true, {}, {}}};
    std::vector<int> rows[3];
    for (int i = 0; i < nb; i++) {
      const int e = MoeRoute(step, b0 + i, G_);
      if (e >= 0) rows[e].push_back(i);
    }
    a.BeginForward(0);
    l0.Forward(a.Param(0), a.Param(1), x.data(), nb);
    a.EndForward(0);
    Buf h(l0.Out(), l0.Out() + (size_t)nb * 8);  // identity where no expert
    std::vector<Buf> hin(3);
    for (int e = 0; e < 3; e++) {
      const int u = kExpertUnits[e], w = 2 * u;
      if (rows[e].empty()) {
        a.Unused(u);
        continue;
      }
      const int n = (int)rows[e].size();
      for (int i : rows[e]) hin[e].insert(hin[e].end(), l0.Out() + (size_t)i * 8,
                                          l0.Out() + (size_t)i * 8 + 8);
      a.BeginForward(u);
      ex[e].Forward(a.Param(w), a.Param(w + 1), hin[e].data(), n);
      a.EndForward(u);
      for (int k = 0; k < n; k++)
        std::memcpy(&h[(size_t)rows[e][k] * 8], ex[e].Out() + (size_t)k * 8,
                    8 * sizeof(float));
    }
    a.BeginForward(4);
    l2.Forward(a.Param(8), a.Param(9), h.data(), nb);
    a.EndForward(4);
    float loss = 0;
    gpt2_mse_forward(&loss, l2.Out(), y.data(), nb, 2);
    Buf dy((size_t)nb * 2, 0.f), dh((size_t)nb * 8, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, l2.Out(), y.data(), nb, 2);
    a.BeginBackward(4);
    l2.Backward(a.Grad(8), a.Grad(9), dh.data(), dy.data(), h.data(), a.Param(8), nb);
    a.EndBackward(4);
    Buf dh0 = dh;  // identity rows pass through
    for (int e = 2; e >= 0; e--) {
      if (rows[e].empty()) continue;
      const int u = kExpertUnits[e], w = 2 * u, n = (int)rows[e].size();
      Buf dyc, dxc((size_t)n * 8, 0.f);
      for (int i : rows[e]) dyc.insert(dyc.end(), &dh[(size_t)i * 8], &dh[(size_t)i * 8] + 8);
      a.BeginBackward(u);
      ex[e].Backward(a.Grad(w), a.Grad(w + 1), dxc.data(), dyc.data(), hin[e].data(),
                     a.Param(w), n);
      a.EndBackward(u);
      for (int k = 0; k < n; k++)
        std::memcpy(&dh0[(size_t)rows[e][k] * 8], &dxc[(size_t)k * 8], 8 * sizeof(float));
    }
    a.BeginBackward(0);
    l0.Backward(a.Grad(0), a.Grad(1), nullptr, dh0.data(), x.data(), a.Param(0), nb);
    a.EndBackward(0);
    return loss;
  }

 private:
  int G_;
};

// ==== A unit whose use count grows after the first step ====================

class GrowingUse : public TwiceUsed {
 public:
  float Step(Access& a, int step, int b0, int nb) override {
    if (step > 0) return TwiceUsed::Step(a, step, b0, nb);
    // Step 0: apply "sq" once only.
    Buf x, y;
    FillBatch(6, step, b0, nb, D, &x);
    Teacher(x, nb, D, 3, &y);
    Linear first{D, D, true, {}, {}}, head{D, 3, false, {}, {}};
    a.BeginForward(0);
    first.Forward(a.Param(0), a.Param(1), x.data(), nb);
    a.EndForward(0);
    a.BeginForward(1);
    head.Forward(a.Param(2), a.Param(3), first.Out(), nb);
    a.EndForward(1);
    float loss = 0;
    gpt2_mse_forward(&loss, head.Out(), y.data(), nb, 3);
    Buf dy((size_t)nb * 3, 0.f), d1((size_t)nb * D, 0.f);
    gpt2_mse_backward(dy.data(), 1.0f, head.Out(), y.data(), nb, 3);
    a.BeginBackward(1);
    head.Backward(a.Grad(2), a.Grad(3), d1.data(), dy.data(), first.Out(), a.Param(2), nb);
    a.EndBackward(1);
    a.BeginBackward(0);
    first.Backward(a.Grad(0), a.Grad(1), nullptr, d1.data(), x.data(), a.Param(0), nb);
    a.EndBackward(0);
    return loss;
  }
};

}  // namespace

std::unique_ptr<Model> MakeMlp() { return std::make_unique<Mlp>(); }
std::unique_ptr<Model> MakeTransformer() { return std::make_unique<Transformer>(); }
std::unique_ptr<Model> MakeDegenerate() { return std::make_unique<Degenerate>(); }
std::unique_ptr<Model> MakeTwiceUsed() { return std::make_unique<TwiceUsed>(); }
std::unique_ptr<Model> MakeBranch() { return std::make_unique<Branch>(); }
std::unique_ptr<Model> MakeBranchStack(int sleep_us) {
  return std::make_unique<BranchStack>(sleep_us);
}
std::unique_ptr<Model> MakeGrowingUse() { return std::make_unique<GrowingUse>(); }
std::unique_ptr<Model> MakeMoe(int global_batch) {
  return std::make_unique<Moe>(global_batch);
}

}  // namespace zstest
