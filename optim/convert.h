/*
 * convert.h — per-element conversions between fp32, bf16 (1-8-7) and
 * fp16 (IEEE binary16, 1-5-10), as inline functions usable from host and
 * device code (the CUDA kernels include this header, so the CPU tests
 * exercise the same math the GPU runs). Rounding: to nearest, ties to even.
 */
#ifndef ZS_OPTIM_CONVERT_H_
#define ZS_OPTIM_CONVERT_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <zeroshard.h>

#ifdef __CUDACC__
#define ZS__HD __host__ __device__
#else
#define ZS__HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

static inline ZS__HD uint32_t zs__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline ZS__HD float zs__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* fp32 -> bf16: keep the top 16 bits, rounding the dropped 16 to nearest
 * even; NaN stays NaN (quiet). */
static inline ZS__HD uint16_t zs__f32_to_bf16(float f) {
  uint32_t u = zs__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline ZS__HD float zs__bf16_to_f32(uint16_t h) {
  return zs__f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> fp16 with round to nearest even, overflow to infinity, gradual
 * underflow to subnormals and zero. */
static inline ZS__HD uint16_t zs__f32_to_f16(float f) {
  const uint32_t u = zs__f32_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* >= 65520: inf */
  if (a < 0x38800000u) {                                    /* < 2^-14: subnormal */
    if (a < 0x33000001u) return sign;                       /* <= 2^-25: 0 */
    const uint32_t exp = a >> 23;                           /* 102..112 */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;                      /* 14..24 */
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  /* normal: rebias the exponent, round the 13 dropped bits */
  uint32_t h = ((a - 0x38000000u) >> 13);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

static inline ZS__HD float zs__f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1fu)
    return zs__f32_from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return zs__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return zs__f32_from_bits(sign);
  /* subnormal: mant * 2^-24 */
  float v = (float)mant * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

/* Element i of a buffer of dtype (fp32, bf16 or fp16) as float, and back. */
static inline ZS__HD float zs__load(const void* p, zs_dtype t, size_t i) {
  if (t == ZS_FLOAT32) return ((const float*)p)[i];
  if (t == ZS_BFLOAT16) return zs__bf16_to_f32(((const uint16_t*)p)[i]);
  return zs__f16_to_f32(((const uint16_t*)p)[i]);
}

static inline ZS__HD void zs__store(void* p, zs_dtype t, size_t i, float v) {
  if (t == ZS_FLOAT32) ((float*)p)[i] = v;
  else if (t == ZS_BFLOAT16) ((uint16_t*)p)[i] = zs__f32_to_bf16(v);
  else ((uint16_t*)p)[i] = zs__f32_to_f16(v);
}

#ifdef __cplusplus
}
#endif

#endif /* ZS_OPTIM_CONVERT_H_ */
