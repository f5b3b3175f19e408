// optim_fast_test.cc — the fast kernels (optim/optim_cpu.c) against the
// scalar reference (optim/optim_ref.c): bitwise, for every size class
// (empty, below and across vector widths, across thread blocks), several
// steps, hyperparameters that switch each branch, special values, and any
// thread count.
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale,
                          bool positive = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(positive ? 0.0f : -1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = scale * u(rng);
  return v;
}

// Bitwise, except that two NaNs are equal whatever their payloads.
::testing::AssertionResult Same(const std::vector<float>& a,
                                const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); i++) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

const size_t kSizes[] = {0, 1, 7, 8, 15, 16, 17, 63, 1000, 65536, 65537,
                         200003};

TEST(OptimFast, AdamAndAdamWAreBitwiseTheReference) {
  const zs_adam_hparams hps[] = {{1e-3, 0.9, 0.999, 1e-8, 0.01},
                                 {3e-2, 0.8, 0.95, 1e-6, 0.0},
                                 {0.0, 0.0, 0.0, 0.0, 0.5}};
  for (size_t n : kSizes)
    for (int adamw = 0; adamw <= 1; adamw++)
      for (const zs_adam_hparams& hp : hps)
        for (int threads : {1, 3}) {
          auto p = Random(n, 1, 2.0f), m = Random(n, 2, 0.1f),
               v = Random(n, 3, 0.01f, true);
          if (n > 20) {  // special values through every path
            p[3] = -0.0f;
            p[5] = std::numeric_limits<float>::infinity();
            v[7] = 0.0f;
            m[9] = std::numeric_limits<float>::quiet_NaN();
          }
          auto p2 = p, m2 = m, v2 = v;
          for (int step = 1; step <= 3; step++) {
            auto g = Random(n, 10 + step, 0.5f);
            if (n > 20) g[11] = 1e30f;
            auto ref = adamw ? zs_optim_adamw : zs_optim_adam;
            auto fast = adamw ? zs_optim_adamw_fast : zs_optim_adam_fast;
            ASSERT_EQ(ref(p.data(), g.data(), m.data(), v.data(), n, &hp, step),
                      ZS_OK);
            ASSERT_EQ(fast(p2.data(), g.data(), m2.data(), v2.data(), n, &hp,
                           step, threads),
                      ZS_OK);
          }
          const std::string what = "n " + std::to_string(n) + (adamw ? " AdamW" : " Adam") +
                                   " lr " + std::to_string(hp.lr) + " threads " +
                                   std::to_string(threads);
          EXPECT_TRUE(Same(p2, p)) << what;
          EXPECT_TRUE(Same(m2, m)) << what;
          EXPECT_TRUE(Same(v2, v)) << what;
        }
}

TEST(OptimFast, SgdIsBitwiseTheReference) {
  const zs_sgd_hparams hps[] = {{0.1, 0.9, 0.1, 1e-3, 0},
                                {0.05, 0.9, 0.0, 0.0, 1},
                                {0.2, 0.0, 0.0, 0.01, 0}};
  for (size_t n : kSizes)
    for (const zs_sgd_hparams& hp : hps)
      for (int threads : {1, 2}) {
        auto p = Random(n, 4, 1.0f), b = Random(n, 5, 0.3f);
        auto p2 = p, b2 = b;
        for (int step = 1; step <= 3; step++) {
          auto g = Random(n, 20 + step, 0.5f);
          ASSERT_EQ(zs_optim_sgd(p.data(), g.data(), b.data(), n, &hp, step), ZS_OK);
          ASSERT_EQ(zs_optim_sgd_fast(p2.data(), g.data(), b2.data(), n, &hp, step,
                                      threads),
                    ZS_OK);
        }
        EXPECT_TRUE(Same(p2, p)) << "n " << n << " nesterov " << hp.nesterov;
        if (hp.momentum != 0) {
          EXPECT_TRUE(Same(b2, b)) << "n " << n;
        }
      }
}

TEST(OptimFast, BadInputIsTheReferencesError) {
  float x = 0;
  zs_adam_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.0};
  EXPECT_EQ(zs_optim_adamw_fast(&x, &x, &x, &x, 1, &hp, 0, 1), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("step"), std::string::npos);
  EXPECT_EQ(zs_optim_adamw_fast(&x, &x, &x, &x, 1, nullptr, 1, 1),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_optim_adamw_fast(nullptr, &x, &x, &x, 1, &hp, 1, 1),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_optim_adamw_fast(&x, &x, &x, &x, 1, &hp, 1, -2), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("threads"), std::string::npos);
  zs_sgd_hparams sp = {0.1, 0.9, 0.0, 0.0, 0};
  EXPECT_EQ(zs_optim_sgd_fast(&x, &x, nullptr, 1, &sp, 1, 1), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_optim_adamw_fast(nullptr, nullptr, nullptr, nullptr, 0, &hp, 1, 0), ZS_OK);
}

}  // namespace
