// gpt2_model_test.cc — the plain GPT-2 model's backward against central
// finite differences of its loss, for every parameter of a small model
// (2 blocks, C=8, 2 heads, T=5, B=2, V=256), including the tied output
// projection (wte gets both the encoder's and the head's gradient).
//
// Tolerance: fp32 central differences with h = 3e-2 on a loss of ~5.5
// (ln 256): truncation error O(h^2) of the curvature, and the forward's
// rounding noise (kFloor below). Each element must satisfy
// |analytic - numeric| <= 2e-2 |numeric| + 1e-3 max|numeric| + kFloor, and
// every tensor's largest gradient must be 10x the floor so no check is
// blind; a wrong term (a missing residual, a dropped tie) is off by O(1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "examples/gpt2/data.h"
#include "examples/gpt2/model.h"

namespace {

struct Small {
  gpt2_config cfg{5, GPT2_VOCAB, 2, 2, 8};
  int B = 2, T = 5;
  std::vector<float> params, grads;
  gpt2_embed_params e{}, de{};
  std::vector<gpt2_block_params> b, db;
  gpt2_acts acts{};
  std::vector<int> tokens, targets;

  Small() {
    size_t P = gpt2_num_params(&cfg), E = gpt2_embed_numel(&cfg),
           K = gpt2_block_numel(&cfg);
    params.resize(P);
    grads.resize(P);
    b.resize(cfg.layers);
    db.resize(cfg.layers);
    gpt2_embed_views(&cfg, params.data(), &e);
    gpt2_embed_views(&cfg, grads.data(), &de);
    for (int l = 0; l < cfg.layers; l++) {
      gpt2_block_views(&cfg, params.data() + E + l * K, &b[l]);
      gpt2_block_views(&cfg, grads.data() + E + l * K, &db[l]);
    }
    // Larger-than-GPT-2 weights so gradients are well above fp32 noise.
    for (size_t i = 0; i < P; i++)
      params[i] = 0.4f * std::sin(0.7f * (float)i + 0.3f) +
                  0.1f * std::cos(1.3f * (float)i);
    EXPECT_EQ(gpt2_acts_alloc(&cfg, B, T, &acts), 0);
    for (int i = 0; i < B * T; i++) {
      tokens.push_back((37 * i + 11) % GPT2_VOCAB);
      targets.push_back((53 * i + 7) % GPT2_VOCAB);
    }
  }
  ~Small() { gpt2_acts_free(&acts); }

  float Loss() {
    gpt2_embed_forward(&cfg, &e, tokens.data(), &acts);
    for (int l = 0; l < cfg.layers; l++) gpt2_block_forward(&cfg, &b[l], l, &acts);
    return gpt2_head_forward(&cfg, &e, targets.data(), &acts);
  }
  void Backward() {
    std::fill(grads.begin(), grads.end(), 0.f);
    Loss();
    gpt2_acts_zero_grads(&cfg, &acts);
    gpt2_head_backward(&cfg, &e, &de, targets.data(), 1.0f, &acts);
    for (int l = cfg.layers - 1; l >= 0; l--)
      gpt2_block_backward(&cfg, &b[l], &db[l], l, &acts);
    gpt2_embed_backward(&cfg, &de, tokens.data(), &acts);
  }
};

// The forward's own fp32 rounding moves the loss by a few ulp(5.5) ~ 5e-7
// each; divided by 2h = 0.06 that is an absolute noise floor of ~1e-4.
constexpr double kFloor = 1e-4;

TEST(Gpt2Model, BackwardMatchesFiniteDifferencesForEveryParameter) {
  Small m;
  m.Backward();
  const std::vector<float> analytic = m.grads;
  // Walk the tensors in flat order to report by name.
  size_t off = 0;
  for (int which = -1; which < m.cfg.layers; which++) {
    int n = which < 0 ? GPT2_EMBED_TENSORS : GPT2_BLOCK_TENSORS;
    for (int i = 0; i < n; i++) {
      const char* name;
      int ndim, decay;
      long long shape[2];
      size_t numel = which < 0
                         ? gpt2_embed_tensor(&m.cfg, i, &name, &ndim, shape, &decay)
                         : gpt2_block_tensor(&m.cfg, i, &name, &ndim, shape, &decay);
      std::vector<double> numeric(numel);
      double maxn = 0;
      for (size_t k = 0; k < numel; k++) {
        float& p = m.params[off + k];
        const float keep = p, h = 3e-2f;
        p = keep + h;
        double up = m.Loss();
        p = keep - h;
        double down = m.Loss();
        p = keep;
        numeric[k] = (up - down) / (2.0 * h);
        maxn = std::max(maxn, std::fabs(numeric[k]));
      }
      std::string what = (which < 0 ? std::string("embed.") : "block" + std::to_string(which) + ".") + name;
      EXPECT_GT(maxn, 10 * kFloor) << what << ": gradient too small, the test would be blind";
      std::printf("%-18s max|grad| %.3e\n", what.c_str(), maxn);
      int bad = 0;
      for (size_t k = 0; k < numel && bad < 5; k++) {
        double a = analytic[off + k], num = numeric[k];
        if (std::fabs(a - num) > 2e-2 * std::fabs(num) + 1e-3 * maxn + kFloor) {
          ADD_FAILURE() << what << "[" << k << "]: analytic " << a
                        << " numeric " << num;
          bad++;
        }
      }
      off += numel;
    }
  }
  EXPECT_EQ(off, m.params.size());
}

// The tied projection: zeroing the head's use must change dwte, so both uses
// really reach the one gradient.
TEST(Gpt2Model, TiedEmbeddingGetsBothUses) {
  Small m;
  m.Backward();
  std::vector<float> both(m.de.wte, m.de.wte + GPT2_VOCAB * m.cfg.channels);
  // Encoder only: its gradient lands in the rows of the input tokens.
  std::vector<float> enc_only(both.size(), 0.f);
  gpt2_embed_params de_only = m.de;
  de_only.wte = enc_only.data();
  std::vector<float> dwpe(m.cfg.max_seq * m.cfg.channels, 0.f);
  de_only.wpe = dwpe.data();
  gpt2_embed_backward(&m.cfg, &de_only, m.tokens.data(), &m.acts);
  double diff = 0;
  for (size_t i = 0; i < both.size(); i++) diff += std::fabs(both[i] - enc_only[i]);
  EXPECT_GT(diff, 1e-3) << "dwte holds only the encoder's gradient";
}

TEST(Gpt2Model, ActivationBytesMatchAllocation) {
  gpt2_config c{64, GPT2_VOCAB, 4, 4, 128};
  gpt2_acts a;
  ASSERT_EQ(gpt2_acts_alloc(&c, 4, 64, &a), 0);
  EXPECT_EQ(a.bytes, gpt2_acts_bytes(&c, 4, 64));
  // The last gradient buffer ends exactly at the end of the allocation.
  EXPECT_EQ((char*)(a.dres2 + 4 * 64 * 128), (char*)a.memory + a.bytes);
  gpt2_acts_free(&a);
}

TEST(Gpt2Model, ConfigCheckNamesTheFlag) {
  char err[256];
  gpt2_config c{64, GPT2_VOCAB, 4, 3, 128};
  EXPECT_NE(gpt2_config_check(&c, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find("--heads 3"), std::string::npos) << err;
  c.heads = 4;
  EXPECT_EQ(gpt2_config_check(&c, err, sizeof err), 0);
}

TEST(Gpt2Data, GlobalBatchIsTheSameWhateverTheSlicing) {
  gpt2_data d;
  char err[256];
  // A synthetic file: 2000 bytes.
  std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/d.txt";
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  for (int i = 0; i < 2000; i++) fputc('a' + (i * 7) % 26, f);
  fclose(f);
  ASSERT_EQ(gpt2_data_load(path.c_str(), 16, &d, err, sizeof err), 0) << err;
  EXPECT_EQ(d.train_size, 1800u);
  std::vector<int> all(12 * 16), allt(12 * 16), part(3 * 16), partt(3 * 16);
  gpt2_data_train_batch(&d, 7, 5, 0, 12, 16, all.data(), allt.data());
  for (int r = 0; r < 4; r++) {
    gpt2_data_train_batch(&d, 7, 5, r * 3, 3, 16, part.data(), partt.data());
    EXPECT_EQ(0, std::memcmp(part.data(), all.data() + r * 48, 48 * sizeof(int)));
    EXPECT_EQ(0, std::memcmp(partt.data(), allt.data() + r * 48, 48 * sizeof(int)));
  }
  for (int i = 0; i + 1 < 16; i++) EXPECT_EQ(allt[i], all[i + 1]) << "targets are the next bytes";
  // Val sequences come from the last 10% only.
  gpt2_data_val_batch(&d, 0, 12, 12, 16, all.data(), allt.data());
  gpt2_data_free(&d);
  // Too short for the sequence length: a message naming the file.
  EXPECT_NE(gpt2_data_load(path.c_str(), 500, &d, err, sizeof err), 0);
  EXPECT_NE(std::string(err).find(path), std::string::npos) << err;
}

}  // namespace
