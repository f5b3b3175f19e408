// convert_test.cc — fp32 <-> bf16 / fp16 conversions against independent
// oracles: the compiler's _Float16 (IEEE binary16, round to nearest even)
// for fp16, and a double-precision nearest-neighbour search for bf16.
// Exhaustive over all 16-bit patterns, and over millions of fp32 values
// including every rounding boundary.
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "optim/convert.h"

namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fp16 oracle: the compiler's _Float16 of the low 16 bits of h, as float.
float HalfOracle(uint32_t h) {
  const uint16_t bits = (uint16_t)h;
  _Float16 x;
  std::memcpy(&x, &bits, 2);
  return (float)x;
}

// bf16 oracle: the nearest of the two bf16 values around f (ties to even).
uint16_t Bf16Oracle(float f) {
  if (std::isnan(f)) return 0;  // callers check NaN separately
  const uint32_t u = Bits(f);
  const uint16_t lo = (uint16_t)(u >> 16);
  const uint16_t hi = (uint16_t)(lo + 1);  // next pattern away from zero
  const double x = f, a = FromBits((uint32_t)lo << 16);
  const double b = (hi & 0x7f80) == 0x7f80 && (hi & 0x7f) == 0
                       ? std::copysign(std::ldexp(1.0, 128), x)  // rounds to inf
                       : (double)FromBits((uint32_t)hi << 16);
  const double da = std::fabs(x - a), db = std::fabs(b - x);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) ? hi : lo;
}

uint16_t F16Oracle(float f) {
  _Float16 h = (_Float16)f;
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

std::vector<float> Samples() {
  std::vector<float> v;
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 4000000; i++) v.push_back(FromBits((uint32_t)rng()));
  // Every boundary between adjacent bf16 / fp16 values, +-1 ulp, in the
  // interesting exponent ranges.
  for (uint32_t h = 0; h < 0x10000; h++) {
    uint32_t mid = ((uint32_t)h << 16) | 0x8000u;  // bf16 tie
    for (int d = -1; d <= 1; d++) v.push_back(FromBits(mid + d));
  }
  for (uint32_t h = 0; h < 0x7c00; h++) {
    float a = HalfOracle(h);
    uint16_t n = (uint16_t)(h + 1);
    float b = HalfOracle(n);
    float mid = (float)(((double)a + (double)b) / 2);  // fp16 tie, exact in fp32
    for (int d = -1; d <= 1; d++) v.push_back(FromBits(Bits(mid) + d));
    v.push_back(-mid);
  }
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f,
                  1e-8f, 5.96e-8f, 2.98e-8f, 3.0e38f, 3.4028235e38f})
    v.push_back(x);
  return v;
}

TEST(Convert, Fp16MatchesTheCompilersBinary16) {
  int bad = 0;
  for (float f : Samples()) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(zs__f16_to_f32(zs__f32_to_f16(f))));
      continue;
    }
    uint16_t got = zs__f32_to_f16(f), want = F16Oracle(f);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << std::hexfloat << f << ": got 0x" << std::hex << got
                    << " want 0x" << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST(Convert, Bf16MatchesNearestEven) {
  int bad = 0;
  for (float f : Samples()) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(zs__bf16_to_f32(zs__f32_to_bf16(f))));
      continue;
    }
    uint16_t got = zs__f32_to_bf16(f), want = Bf16Oracle(f);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << std::hexfloat << f << ": got 0x" << std::hex << got
                    << " want 0x" << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST(Convert, EverySixteenBitPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float b = zs__bf16_to_f32((uint16_t)h);
    if (!std::isnan(b)) {
      EXPECT_EQ(zs__f32_to_bf16(b), h) << std::hex << h;
    }
    float f = zs__f16_to_f32((uint16_t)h);
    float oracle = HalfOracle(h);
    if (std::isnan(oracle)) {
      EXPECT_TRUE(std::isnan(f));
    } else {
      EXPECT_EQ(Bits(f), Bits(oracle)) << std::hex << h;
      EXPECT_EQ(zs__f32_to_f16(f), h) << std::hex << h;
    }
  }
}

TEST(Convert, PublicFunctionConvertsAndValidates) {
  float src[5] = {1.0f, -2.5f, 65520.0f, 1e-9f, 3.0f};
  uint16_t h[5];
  float back[5];
  ASSERT_EQ(zs_convert(h, ZS_FLOAT16, src, ZS_FLOAT32, 5), ZS_OK);
  ASSERT_EQ(zs_convert(back, ZS_FLOAT32, h, ZS_FLOAT16, 5), ZS_OK);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_TRUE(std::isinf(back[2]));
  EXPECT_EQ(back[3], 0.0f);
  uint16_t b[5];
  ASSERT_EQ(zs_convert(b, ZS_BFLOAT16, h, ZS_FLOAT16, 5), ZS_OK);  // 16 -> 16
  EXPECT_EQ(zs__bf16_to_f32(b[4]), 3.0f);
  EXPECT_EQ(zs_convert(b, ZS_INT64, src, ZS_FLOAT32, 5), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_convert(nullptr, ZS_FLOAT32, src, ZS_FLOAT32, 5), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_convert(nullptr, ZS_FLOAT32, nullptr, ZS_FLOAT32, 0), ZS_OK);
}

}  // namespace
