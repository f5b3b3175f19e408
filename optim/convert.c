/*
 * convert.c — element conversions between fp32, bf16 and fp16
 * (zeroshard.h, zs_convert): round to nearest, ties to even, like the
 * hardware conversions (and torch's .to()); infinities and NaN preserved,
 * fp16 overflow to infinity, fp16 subnormals exact. Scalar reference code,
 * the same math the CUDA kernels use (zs__f32_to_bf16 etc. in convert.h).
 */
#include "optim/convert.h"

#include <string.h>

#include "runtime/core/core.h"

zs_status zs_convert(void* dst, zs_dtype dst_dtype, const void* src,
                     zs_dtype src_dtype, size_t n) {
  const int ok_dst = dst_dtype == ZS_FLOAT32 || dst_dtype == ZS_BFLOAT16 ||
                     dst_dtype == ZS_FLOAT16;
  const int ok_src = src_dtype == ZS_FLOAT32 || src_dtype == ZS_BFLOAT16 ||
                     src_dtype == ZS_FLOAT16;
  if (!ok_dst || !ok_src)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_convert: %s -> %s: only fp32, bf16 and fp16",
                     zs_dtype_name(src_dtype), zs_dtype_name(dst_dtype));
  if (n > 0 && (dst == NULL || src == NULL))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_convert: NULL buffer with %zu elements", n);
  if (n == 0) return ZS_OK;
  if (dst_dtype == src_dtype) {
    memmove(dst, src, n * zs_dtype_size(dst_dtype));
    return ZS_OK;
  }
  for (size_t i = 0; i < n; i++)
    zs__store(dst, dst_dtype, i, zs__load(src, src_dtype, i));
  return ZS_OK;
}
