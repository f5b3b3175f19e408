/*
 * device_host.c — the host device backend: buffers in host memory, plain
 * memcpy/memset, streams and events that are no-ops because every operation
 * is complete when it returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/convert.h"
#include "runtime/device/device.h"

enum { ZS__HOST_ALIGN = 64 };

/* A distinct non-NULL pointer for zero-byte requests. */
static zs_status zs__host_alloc(zs__device* dev, size_t bytes, void** out) {
  (void)dev;
  /* Rounding up near SIZE_MAX would wrap to a tiny block. */
  if (bytes > SIZE_MAX - (ZS__HOST_ALIGN - 1))
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "host alloc of %zu bytes failed",
                     bytes);
  size_t rounded = zs__round_up(bytes == 0 ? 1 : bytes, ZS__HOST_ALIGN);
  void* p = aligned_alloc(ZS__HOST_ALIGN, rounded);
  if (p == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "host alloc of %zu bytes failed",
                     bytes);
  *out = p;
  return ZS_OK;
}

static void zs__host_free(zs__device* dev, void* ptr) {
  (void)dev;
  free(ptr);
}

static zs_status zs__host_copy(zs__device* dev, void* dst, const void* src,
                               size_t bytes, zs__stream* stream) {
  (void)dev;
  (void)stream;
  if (bytes > 0 && dst != src) memmove(dst, src, bytes);
  return ZS_OK;
}

static zs_status zs__host_memset(zs__device* dev, void* dst, int value,
                                 size_t bytes, zs__stream* stream) {
  (void)dev;
  (void)stream;
  if (bytes > 0) memset(dst, value, bytes);
  return ZS_OK;
}

/* 16-bit values are widened to fp32, combined in fp32 and rounded once
 * (to nearest even) when stored. */
static int zs__host_float_type(zs_dtype t) {
  return t == ZS_FLOAT32 || t == ZS_BFLOAT16 || t == ZS_FLOAT16;
}

static zs_status zs__host_div_add(zs__device* dev, void* dst, const void* base,
                                  const void* src, float divisor, size_t n,
                                  zs_dtype dtype, zs__stream* stream) {
  (void)dev;
  (void)stream;
  if (!zs__host_float_type(dtype))
    return zs__error(ZS_ERR_UNSUPPORTED, "host div_add: dtype %s",
                     zs_dtype_name(dtype));
  if (dtype == ZS_FLOAT32) {
    float* d = (float*)dst;
    const float* b = (const float*)base;
    const float* s = (const float*)src;
    if (b == NULL)
      for (size_t i = 0; i < n; i++) d[i] = s[i] / divisor;
    else
      for (size_t i = 0; i < n; i++) d[i] = b[i] + s[i] / divisor;
    return ZS_OK;
  }
  for (size_t i = 0; i < n; i++) {
    float v = zs__load(src, dtype, i) / divisor;
    if (base != NULL) v = zs__load(base, dtype, i) + v;
    zs__store(dst, dtype, i, v);
  }
  return ZS_OK;
}

zs_status zs__host_sum_ranks(void* dst, const void* const* src, int n,
                             size_t count, float divisor, zs_dtype dtype) {
  if (!zs__host_float_type(dtype))
    return zs__error(ZS_ERR_UNSUPPORTED, "host sum of ranks: dtype %s",
                     zs_dtype_name(dtype));
  if (n <= 0) {
    memset(dst, 0, count * zs_dtype_size(dtype));
    return ZS_OK;
  }
  if (dtype == ZS_FLOAT32) {
    /* Blocks that stay in L1: each element is s0 + s1, + s2, ..., then
     * divided, the same operations in the same order as a pass per rank,
     * but dst is written once. */
    enum { BLOCK = 1024 };
    float acc[BLOCK];
    float* d = (float*)dst;
    size_t i0 = 0;
    for (; i0 + BLOCK <= count; i0 += BLOCK) { /* (fixed trips: vectorized) */
      memcpy(acc, (const float*)src[0] + i0, sizeof acc);
      for (int r = 1; r < n; r++) {
        const float* x = (const float*)src[r] + i0;
        for (size_t j = 0; j < BLOCK; j++) acc[j] += x[j];
      }
      if (divisor != 1.0f)
        for (size_t j = 0; j < BLOCK; j++) acc[j] /= divisor;
      memcpy(d + i0, acc, sizeof acc);
    }
    const size_t m = count - i0;
    if (m > 0) {
      memcpy(acc, (const float*)src[0] + i0, m * sizeof(float));
      for (int r = 1; r < n; r++) {
        const float* x = (const float*)src[r] + i0;
        for (size_t j = 0; j < m; j++) acc[j] += x[j];
      }
      if (divisor != 1.0f)
        for (size_t j = 0; j < m; j++) acc[j] /= divisor;
      memcpy(d + i0, acc, m * sizeof(float));
    }
    return ZS_OK;
  }
  for (size_t i = 0; i < count; i++) {
    float v = zs__load(src[0], dtype, i);
    for (int r = 1; r < n; r++) v += zs__load(src[r], dtype, i);
    zs__store(dst, dtype, i, divisor != 1.0f ? v / divisor : v);
  }
  return ZS_OK;
}

static zs_status zs__host_sum_chunks(zs__device* dev, void* dst,
                                     const void* src, int nchunks,
                                     size_t chunk, float divisor,
                                     zs_dtype dtype, zs__stream* stream) {
  (void)dev;
  (void)stream;
  enum { STACK = 64 };
  const void* on_stack[STACK] = {0};
  const void** p = on_stack;
  if (nchunks > STACK &&
      (p = (const void**)malloc((size_t)nchunks * sizeof *p)) == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "host sum_chunks: %d pointers",
                     nchunks);
  const size_t bytes = chunk * zs_dtype_size(dtype);
  for (int r = 0; r < nchunks; r++) p[r] = (const char*)src + (size_t)r * bytes;
  zs_status st = zs__host_sum_ranks(dst, p, nchunks, chunk, divisor, dtype);
  if (p != on_stack) free((void*)p);
  return st;
}

/* Elements per pass of the fused path: small enough that the fp32 gradient
 * chunk and the values stay in L1/L2 between the three sweeps. */
#define ZS__OPT_CHUNK 2048
/* ... and the spans a user's optimizer (zs_model_set_optimizer) gets. */
#define ZS__OPT_FN_SPAN 65536

/* The fast kernels (bitwise the reference, vectorized) on fp32 arrays. */
static zs_status zs__host_kernel(const zs__opt_args* a, float* w,
                                 const float* g, size_t off, size_t n,
                                 int threads) {
  float* s0 = a->s[0] != NULL ? a->s[0] + off : NULL;
  float* s1 = a->s[1] != NULL ? a->s[1] + off : NULL;
  if (a->fn != NULL) { /* the user's rule on [off, off + n) */
    zs_optim_span sp = *a->span;
    sp.param = w;
    sp.grad = g;
    for (int k = 0; k < ZS_OPTIM_MAX_STATES; k++)
      sp.state[k] = a->s[k] != NULL ? a->s[k] + off : NULL;
    sp.n = n;
    sp.offset += off;
    char why[256] = "";
    sp.error = why;
    sp.error_cap = sizeof why;
    const zs_status st = a->fn(a->fn_user, &sp);
    if (st == ZS_OK) return ZS_OK;
    why[sizeof why - 1] = '\0';
    /* a code outside the enum (or REMOTE, which names another rank) is
     * reported as INTERNAL, the value kept in the message */
    const int known = (int)st > 0 && (int)st <= (int)ZS_ERR_CORRUPT &&
                      st != ZS_ERR_REMOTE;
    return zs__error(known ? st : ZS_ERR_INTERNAL,
                     "the optimizer callback returned %s (%d)%s%s (step %lld, "
                     "elements [%zu, %zu) of the tensor)",
                     zs_status_string(st), (int)st, why[0] ? ": " : "", why,
                     (long long)sp.step, sp.offset, sp.offset + n);
  }
  if (a->kind == ZS_OPTIM_SGD)
    return zs_optim_sgd_fast(w, g, s0, n, &a->sgd, a->step, threads);
  return (a->kind == ZS_OPTIM_ADAMW ? zs_optim_adamw_fast : zs_optim_adam_fast)(
      w, g, s0, s1, n, &a->adam, a->step, threads);
}

static zs_status zs__host_optimize(zs__device* dev, const zs__opt_args* a,
                                   zs__stream* stream) {
  (void)dev;
  (void)stream;
  if (a->p16 == NULL && a->gdtype == ZS_FLOAT32 && a->coef == 1.0f &&
      (a->fn == NULL || a->n <= ZS__OPT_FN_SPAN))
    return zs__host_kernel(a, a->w, (const float*)a->g, 0, a->n, a->threads);
  /* Fused, chunk by chunk: widen and scale the gradient, update, round.
   * A user's rule gets spans of up to ZS__OPT_FN_SPAN elements (its
   * gradient buffer on the heap). */
  float stack[ZS__OPT_CHUNK];
  const size_t chunk = a->fn != NULL ? ZS__OPT_FN_SPAN : ZS__OPT_CHUNK;
  float* gbuf = stack;
  if (a->fn != NULL) {
    gbuf = (float*)malloc(chunk * sizeof(float));
    if (gbuf == NULL)
      return zs__error(ZS_ERR_OUT_OF_MEMORY, "optimizer callback: gradient "
                       "span of %zu bytes", chunk * sizeof(float));
  }
  zs_status st = ZS_OK;
  for (size_t off = 0; off < a->n && st == ZS_OK; off += chunk) {
    const size_t n = a->n - off < chunk ? a->n - off : chunk;
    if (a->gdtype == ZS_FLOAT32 && a->coef == 1.0f)
      memcpy(gbuf, (const float*)a->g + off, n * sizeof(float));
    else
      for (size_t j = 0; j < n; j++)
        gbuf[j] = zs__load(a->g, a->gdtype, off + j) * a->coef;
    st = zs__host_kernel(a, a->w + off, gbuf, off, n, 1);
    if (st == ZS_OK && a->p16 != NULL)
      for (size_t j = 0; j < n; j++)
        zs__store(a->p16, a->dtype, off + j, a->w[off + j]);
  }
  if (gbuf != stack) free(gbuf);
  return st;
}

static zs_status zs__host_sumsq(zs__device* dev, const void* src,
                                zs_dtype dtype, size_t n, double* acc) {
  (void)dev;
  if (!zs__host_float_type(dtype))
    return zs__error(ZS_ERR_UNSUPPORTED, "host sumsq: dtype %s",
                     zs_dtype_name(dtype));
  double sum = *acc;
  for (size_t j = 0; j < n; j++) {
    const double v = zs__load(src, dtype, j);
    sum += v * v;
  }
  *acc = sum;
  return ZS_OK;
}

static zs_status zs__host_convert(zs__device* dev, void* dst,
                                  zs_dtype dst_dtype, const void* src,
                                  zs_dtype src_dtype, size_t n,
                                  zs__stream* stream) {
  (void)dev;
  (void)stream;
  return zs_convert(dst, dst_dtype, src, src_dtype, n);
}

/* Streams and events carry no state on the host; a static byte gives them
 * a non-NULL identity. */
static char zs__host_token;

static zs_status zs__host_stream_create(zs__device* dev, zs__stream** out) {
  (void)dev;
  *out = (zs__stream*)&zs__host_token;
  return ZS_OK;
}
static void zs__host_stream_destroy(zs__device* dev, zs__stream* s) {
  (void)dev;
  (void)s;
}
static zs_status zs__host_stream_sync(zs__device* dev, zs__stream* s) {
  (void)dev;
  (void)s;
  return ZS_OK;
}
static zs_status zs__host_event_create(zs__device* dev, zs__event** out) {
  (void)dev;
  *out = (zs__event*)&zs__host_token;
  return ZS_OK;
}
static void zs__host_event_destroy(zs__device* dev, zs__event* e) {
  (void)dev;
  (void)e;
}
static zs_status zs__host_event_record(zs__device* dev, zs__event* e,
                                       zs__stream* s) {
  (void)dev;
  (void)e;
  (void)s;
  return ZS_OK;
}
static zs_status zs__host_stream_wait_event(zs__device* dev, zs__stream* s,
                                            zs__event* e) {
  (void)dev;
  (void)s;
  (void)e;
  return ZS_OK;
}
static void zs__host_destroy(zs__device* dev) { free(dev); }

static zs_status zs__host_register(zs__device* dev, void* p, size_t bytes) {
  (void)dev;
  (void)p;
  (void)bytes;
  return ZS_OK;
}
static void zs__host_unregister(zs__device* dev, void* p) {
  (void)dev;
  (void)p;
}
static void zs__host_pci_busid(zs__device* dev, char* buf, size_t cap) {
  (void)dev;
  if (cap > 0) buf[0] = '\0';
}

static size_t zs__host_release_cached(zs__device* dev) {
  (void)dev;
  return 0;
}

static const zs__device_ops zs__host_ops = {
    "host",
    zs__host_alloc,
    zs__host_free,
    zs__host_release_cached,
    zs__host_copy,
    zs__host_copy, /* upload */
    zs__host_memset,
    zs__host_div_add,
    zs__host_sum_chunks,
    zs__host_optimize,
    zs__host_sumsq,
    zs__host_convert,
    zs__host_stream_create,
    zs__host_stream_destroy,
    zs__host_stream_sync,
    zs__host_event_create,
    zs__host_event_destroy,
    zs__host_event_record,
    zs__host_stream_wait_event,
    zs__host_register,
    zs__host_unregister,
    zs__host_pci_busid,
    zs__host_destroy,
};

zs_status zs__device_host_create(zs__accounting* acct, zs__device** out) {
  zs__device* dev = (zs__device*)calloc(1, sizeof *dev);
  if (dev == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "device: calloc");
  dev->ops = &zs__host_ops;
  dev->kind = ZS_DEVICE_HOST;
  dev->acct = acct;
  *out = dev;
  return ZS_OK;
}
