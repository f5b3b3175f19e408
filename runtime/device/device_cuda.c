/*
 * device_cuda.c — the CUDA device backend (device.h): flat buffers in GPU
 * memory from a caching allocator, copies, memsets and the element-wise
 * operations as kernels (optim/optim_cuda.h), streams and events.
 *
 * Allocation: freed blocks are kept in per-size free lists (sizes rounded up
 * to 512 bytes below 1 MiB, to 2 MiB above) and reused, so the transient
 * buffers of stage 3 (a unit's gathered parameters, every step) never call
 * cudaMalloc after the first step (PyTorch's caching allocator works the
 * same way). When cudaMalloc fails, the cached blocks are released and the
 * allocation retried once; then OUT_OF_MEMORY names the device, the size
 * and the device's free/total memory.
 *
 * Ordering: an operation on stream NULL runs on the backend's compute
 * stream. When it reads or writes host memory (pageable, registered or
 * managed: cudaPointerGetAttributes) it is complete when the call returns,
 * the host semantics the engine's host code relies on (a copy into host
 * memory may be read, a host source reused, right after). An operation on
 * device memory only is asynchronous: the host does not wait for it, and
 * whatever reads or reuses its output is ordered after it on the GPU —
 * later operations on the compute stream by stream order; the user's
 * kernels on the legacy default stream and NCCL's collectives (whose
 * stream waits for an event recorded on the legacy stream,
 * comm_nccl.c) because the compute stream is a blocking stream, ordered
 * with the legacy stream both ways; sum of squares because it reads its
 * value back. A freed block goes back to the cache at once: whatever
 * reuses it is one of those, so it is ordered after the work queued
 * before the free (the engine's copy stream is not, and starts only after
 * a stream_sync of the compute stream: device.h). So the host waits only
 * where it reads, not after every kernel; an error of an asynchronous
 * operation is reported by the next call that waits, naming the last
 * operation queued without a wait.
 * Operations on a given stream are asynchronous; the engine orders them
 * with events (event_record / stream_wait_event) or a stream_sync. Streams
 * made by stream_create are blocking streams too.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_cuda.h"
#include "runtime/device/device.h"
#include "runtime/device/device_cuda.h"

#define ZS__CUDA_BINS 64

typedef struct zs__cuda_block {
  void* ptr;
  size_t bytes; /* rounded size */
  struct zs__cuda_block* next;
  cudaEvent_t freed; /* recorded on the compute stream at each free: where
                        work on another stream (the upload stream) may
                        reuse the block; NULL before the first free */
} zs__cuda_block;

typedef struct zs__cuda_impl {
  int device;
  cudaStream_t compute;
  cudaStream_t upload;       /* parameter shards from host memory to the
                                device (upload), off the compute stream;
                                made at the first upload */
  cudaEvent_t uploaded;      /* reused: the compute stream waits for it */
  zs__cuda_block* free_list; /* cached blocks (any size), most recent first */
  zs__cuda_block* live;      /* handed out */
  size_t cached_bytes;
  double* sumsq_scratch;     /* device doubles for zs_cuda_sumsq */
  size_t sumsq_cap;
  const char* last_async;    /* the last operation queued without a wait */
} zs__cuda_impl;

static zs__cuda_impl* zs__impl(zs__device* dev) {
  return (zs__cuda_impl*)dev->impl;
}

static zs_status zs__cuda_fail(zs__device* dev, cudaError_t e,
                               const char* what) {
  /* reported here: cleared, so a later launch's check does not report it
   * again (a sticky error stays whatever is done) */
  (void)cudaGetLastError();
  return zs__error(ZS_ERR_DEVICE, "CUDA device %d: %s failed: %s (%s)",
                   zs__impl(dev)->device, what, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

/* A wait (for `what`) that failed: an asynchronous operation queued
 * before it may be the one that failed, which the message says. */
static zs_status zs__cuda_wait_fail(zs__device* dev, cudaError_t e,
                                    const char* what) {
  const zs__cuda_impl* c = zs__impl(dev);
  char w[256];
  snprintf(w, sizeof w, "waiting for %s (the failing operation may be an "
           "earlier asynchronous one; the last queued without a wait: %s; "
           "CUDA_LAUNCH_BLOCKING=1 reports a kernel's error where it is "
           "launched)", what, c->last_async != NULL ? c->last_async : "none");
  return zs__cuda_fail(dev, e, w);
}

static size_t zs__round(size_t bytes) {
  const size_t small = 512, large = (size_t)2 << 20;
  if (bytes == 0) bytes = 1;
  if (bytes < ((size_t)1 << 20)) return (bytes + small - 1) / small * small;
  return (bytes + large - 1) / large * large;
}

static void zs__cuda_release_cache(zs__cuda_impl* c) {
  while (c->free_list != NULL) {
    zs__cuda_block* b = c->free_list;
    c->free_list = b->next;
    cudaFree(b->ptr);
    if (b->freed != NULL) cudaEventDestroy(b->freed);
    c->cached_bytes -= b->bytes;
    free(b);
  }
}

static zs_status zs__cuda_alloc(zs__device* dev, size_t bytes, void** out) {
  zs__cuda_impl* c = zs__impl(dev);
  const size_t need = zs__round(bytes);
  zs__cuda_block** pp = &c->free_list;
  while (*pp != NULL && (*pp)->bytes != need) pp = &(*pp)->next;
  zs__cuda_block* b = *pp;
  if (b != NULL) {
    *pp = b->next;
    c->cached_bytes -= b->bytes;
  } else {
    b = (zs__cuda_block*)calloc(1, sizeof *b);
    if (b == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "CUDA block record");
    b->bytes = need;
    cudaError_t e = cudaMalloc(&b->ptr, need);
    if (e == cudaErrorMemoryAllocation && c->free_list != NULL) {
      cudaGetLastError(); /* clear it */
      zs__cuda_release_cache(c);
      e = cudaMalloc(&b->ptr, need);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t fr = 0, total = 0;
      cudaMemGetInfo(&fr, &total);
      free(b);
      return zs__error(e == cudaErrorMemoryAllocation ? ZS_ERR_OUT_OF_MEMORY
                                                      : ZS_ERR_DEVICE,
                       "CUDA device %d: cudaMalloc of %zu bytes failed: %s "
                       "(%zu of %zu bytes free)", c->device, need,
                       cudaGetErrorString(e), fr, total);
    }
  }
  b->next = c->live;
  c->live = b;
  *out = b->ptr;
  return ZS_OK;
}

static void zs__cuda_free(zs__device* dev, void* ptr) {
  zs__cuda_impl* c = zs__impl(dev);
  zs__cuda_block** pp = &c->live;
  while (*pp != NULL && (*pp)->ptr != ptr) pp = &(*pp)->next;
  zs__cuda_block* b = *pp;
  if (b == NULL) {
    zs__log(ZS_LOG_ERROR, "CUDA device %d: free of unknown pointer %p",
            c->device, ptr);
    return;
  }
  *pp = b->next;
  /* Cached at once, though work queued on the compute stream may still use
   * it: its next user is ordered after that work on the device (the
   * header comment), as with PyTorch's caching allocator, which reuses a
   * block on its stream without waiting. The upload stream's next use
   * waits for this point of the compute stream (an event; without one it
   * waits for the whole compute stream). */
  cudaError_t e = b->freed != NULL
                      ? cudaSuccess
                      : cudaEventCreateWithFlags(&b->freed,
                                                 cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(b->freed, c->compute);
  if (e != cudaSuccess) {
    /* (cleared only then: a model's own launch error stays for it) */
    (void)cudaGetLastError();
    if (b->freed != NULL) cudaEventDestroy(b->freed);
    b->freed = NULL;
  }
  b->next = c->free_list;
  c->free_list = b;
  c->cached_bytes += b->bytes;
}

/* The stream an operation runs on. */
static cudaStream_t zs__on(zs__device* dev, zs__stream* s) {
  return s != NULL ? (cudaStream_t)s : zs__impl(dev)->compute;
}

/* Whether p is host memory (pageable, registered, managed: anything but
 * device memory). NULL (an absent operand) is not. */
static int zs__host_mem(const void* p) {
  if (p == NULL) return 0;
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* unknown to CUDA: treated as host memory */
    return 1;
  }
  return a.type != cudaMemoryTypeDevice;
}

/* Ends an operation launched with status e on stream s: an operation on
 * the compute stream (s NULL) that touches host memory (`host`: one of
 * its operands is, zs__host_mem) is waited for; the rest stay
 * asynchronous (the header comment says why that is safe). */
static zs_status zs__finish(zs__device* dev, zs__stream* s, cudaError_t e,
                            const char* what, int host) {
  if (e != cudaSuccess) return zs__cuda_fail(dev, e, what);
  if (s == NULL && host) {
    e = cudaStreamSynchronize(zs__impl(dev)->compute);
    if (e != cudaSuccess) return zs__cuda_wait_fail(dev, e, what);
  } else {
    zs__impl(dev)->last_async = what;
  }
  return ZS_OK;
}

/* copy, or (upload) a host-to-device copy the host never waits for */
static zs_status zs__cuda_memcpy(zs__device* dev, void* dst, const void* src,
                                 size_t bytes, zs__stream* s, int upload) {
  if (bytes == 0) return ZS_OK;
  return zs__finish(dev, s,
                    cudaMemcpyAsync(dst, src, bytes,
                                    upload ? cudaMemcpyHostToDevice
                                           : cudaMemcpyDefault,
                                    zs__on(dev, s)),
                    upload ? "cudaMemcpyAsync (upload)" : "cudaMemcpyAsync",
                    !upload && (zs__host_mem(dst) || zs__host_mem(src)));
}

static zs_status zs__cuda_copy(zs__device* dev, void* dst, const void* src,
                               size_t bytes, zs__stream* s) {
  return zs__cuda_memcpy(dev, dst, src, bytes, s, 0);
}

/* An upload on the compute stream's behalf (s NULL) runs on the upload
 * stream: after the point where the compute stream freed dst's block (its
 * event; the whole compute stream when it has none, or dst is not a block
 * start), so the copy overlaps the compute work queued before it, and the
 * compute stream, and with it every later user (NCCL's stream waits for
 * the legacy stream, which follows it), waits for the copy on the device.
 * The host does not wait. */
static zs_status zs__cuda_upload(zs__device* dev, void* dst, const void* src,
                                 size_t bytes, zs__stream* s) {
  zs__cuda_impl* c = zs__impl(dev);
  if (s != NULL || bytes == 0) return zs__cuda_memcpy(dev, dst, src, bytes, s, 1);
  cudaError_t e = cudaSuccess;
  if (c->upload == NULL) {
    e = cudaStreamCreateWithFlags(&c->upload, cudaStreamNonBlocking);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags(&c->uploaded, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      if (c->upload != NULL) cudaStreamDestroy(c->upload);
      c->upload = NULL;
      return zs__cuda_fail(dev, e, "creating the upload stream");
    }
  }
  const zs__cuda_block* b = c->live;
  while (b != NULL && b->ptr != dst) b = b->next;
  if (b != NULL && b->freed != NULL) {
    e = cudaStreamWaitEvent(c->upload, b->freed, 0);
  } else { /* (a block not reused, or not a block: after everything) */
    e = cudaEventRecord(c->uploaded, c->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->upload, c->uploaded, 0);
  }
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->upload);
  if (e == cudaSuccess) e = cudaEventRecord(c->uploaded, c->upload);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(c->compute, c->uploaded, 0);
  if (e != cudaSuccess) return zs__cuda_fail(dev, e, "upload on its stream");
  c->last_async = "cudaMemcpyAsync (upload stream)";
  return ZS_OK;
}

static zs_status zs__cuda_memset(zs__device* dev, void* dst, int value,
                                 size_t bytes, zs__stream* s) {
  if (bytes == 0) return ZS_OK;
  return zs__finish(dev, s, cudaMemsetAsync(dst, value, bytes, zs__on(dev, s)),
                    "cudaMemsetAsync",
                    zs__host_mem(dst));
}

static zs_status zs__cuda_div_add(zs__device* dev, void* dst, const void* base,
                                  const void* src, float divisor, size_t n,
                                  zs_dtype dtype, zs__stream* s) {
  return zs__finish(dev, s,
                    (cudaError_t)zs_cuda_div_add(dst, base, src, divisor, n,
                                                 dtype, zs__on(dev, s)),
                    "div_add kernel",
                    zs__host_mem(dst) || zs__host_mem(base) ||
                        zs__host_mem(src));
}

static zs_status zs__cuda_sum_chunks(zs__device* dev, void* dst,
                                     const void* src, int nchunks,
                                     size_t chunk, float divisor,
                                     zs_dtype dtype, zs__stream* s) {
  return zs__finish(dev, s,
                    (cudaError_t)zs_cuda_sum_chunks(dst, src, nchunks, chunk,
                                                    divisor, dtype,
                                                    zs__on(dev, s)),
                    "sum_chunks kernel",
                    zs__host_mem(dst) || zs__host_mem(src));
}

static zs_status zs__cuda_optimize(zs__device* dev, const zs__opt_args* a,
                                   zs__stream* s) {
  if (a->fn != NULL) /* refused at finalize (engine_model.c) */
    return zs__error(ZS_ERR_UNSUPPORTED, "an optimizer callback runs on the "
                     "host, not on a CUDA device");
  return zs__finish(dev, s,
                    (cudaError_t)zs_cuda_optimize(
                        a->kind, &a->adam, &a->sgd, a->step, a->w, a->g,
                        a->gdtype, a->coef, a->s[0], a->s[1], a->p16, a->dtype,
                        a->n, zs__on(dev, s)),
                    "optimizer kernel",
                    zs__host_mem(a->w) || zs__host_mem(a->g) ||
                        zs__host_mem(a->s[0]) || zs__host_mem(a->s[1]) ||
                        zs__host_mem(a->p16));
}

static zs_status zs__cuda_sumsq(zs__device* dev, const void* src,
                                zs_dtype dtype, size_t n, double* acc) {
  zs__cuda_impl* c = zs__impl(dev);
  if (n == 0) return ZS_OK;
  const size_t need = zs_cuda_sumsq_scratch(n) + 1;
  if (need > c->sumsq_cap) {
    /* through the cache: its out-of-memory retry releases cached blocks */
    if (c->sumsq_scratch != NULL) zs__cuda_free(dev, c->sumsq_scratch);
    c->sumsq_scratch = NULL;
    c->sumsq_cap = 0;
    void* p = NULL;
    zs_status st = zs__cuda_alloc(dev, need * sizeof(double), &p);
    if (st != ZS_OK)
      return zs__error_prefix(st, "sum of squares scratch (%zu doubles): ",
                              need);
    c->sumsq_scratch = (double*)p;
    c->sumsq_cap = need;
  }
  double* out = c->sumsq_scratch + need - 1;
  cudaError_t e = (cudaError_t)zs_cuda_sumsq(src, dtype, n, c->sumsq_scratch,
                                             out, c->compute);
  double v = 0;
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(&v, out, sizeof v, cudaMemcpyDeviceToHost, c->compute);
  if (e != cudaSuccess) return zs__cuda_fail(dev, e, "sum of squares kernel");
  e = cudaStreamSynchronize(c->compute);
  if (e != cudaSuccess) return zs__cuda_wait_fail(dev, e, "sum of squares");
  *acc += v;
  return ZS_OK;
}

static zs_status zs__cuda_convert(zs__device* dev, void* dst,
                                  zs_dtype dst_dtype, const void* src,
                                  zs_dtype src_dtype, size_t n,
                                  zs__stream* s) {
  return zs__finish(dev, s,
                    (cudaError_t)zs_cuda_convert(dst, dst_dtype, src,
                                                 src_dtype, n, zs__on(dev, s)),
                    "convert kernel",
                    zs__host_mem(dst) || zs__host_mem(src));
}

static zs_status zs__cuda_stream_create(zs__device* dev, zs__stream** out) {
  cudaStream_t st;
  /* blocking, like the compute stream: work queued on the legacy default
   * stream (the user's kernels) before it is done before its work starts */
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamDefault);
  if (e != cudaSuccess) return zs__cuda_fail(dev, e, "cudaStreamCreate");
  *out = (zs__stream*)st;
  return ZS_OK;
}
static void zs__cuda_stream_destroy(zs__device* dev, zs__stream* s) {
  (void)dev;
  if (s != NULL) cudaStreamDestroy((cudaStream_t)s);
}
static zs_status zs__cuda_stream_sync(zs__device* dev, zs__stream* s) {
  cudaError_t e = cudaStreamSynchronize(zs__on(dev, s));
  return e == cudaSuccess ? ZS_OK
                          : zs__cuda_wait_fail(dev, e, "a stream");
}
static zs_status zs__cuda_event_create(zs__device* dev, zs__event** out) {
  cudaEvent_t ev;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return zs__cuda_fail(dev, e, "cudaEventCreate");
  *out = (zs__event*)ev;
  return ZS_OK;
}
static void zs__cuda_event_destroy(zs__device* dev, zs__event* ev) {
  (void)dev;
  if (ev != NULL) cudaEventDestroy((cudaEvent_t)ev);
}
static zs_status zs__cuda_event_record(zs__device* dev, zs__event* ev,
                                       zs__stream* s) {
  cudaError_t e = cudaEventRecord((cudaEvent_t)ev, zs__on(dev, s));
  return e == cudaSuccess ? ZS_OK : zs__cuda_fail(dev, e, "cudaEventRecord");
}
static zs_status zs__cuda_stream_wait_event(zs__device* dev, zs__stream* s,
                                            zs__event* ev) {
  cudaError_t e = cudaStreamWaitEvent(zs__on(dev, s), (cudaEvent_t)ev, 0);
  return e == cudaSuccess ? ZS_OK : zs__cuda_fail(dev, e, "cudaStreamWaitEvent");
}

static void zs__cuda_destroy(zs__device* dev) {
  zs__cuda_impl* c = zs__impl(dev);
  if (c != NULL) {
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->compute);
    if (c->upload != NULL) {
      cudaStreamSynchronize(c->upload);
      cudaStreamDestroy(c->upload);
      cudaEventDestroy(c->uploaded);
    }
    zs__cuda_release_cache(c);
    while (c->live != NULL) { /* leaked by the caller: reported by the
                                 accounting; freed here */
      zs__cuda_block* b = c->live;
      c->live = b->next;
      cudaFree(b->ptr);
      if (b->freed != NULL) cudaEventDestroy(b->freed);
      free(b);
    }
    /* the sum-of-squares scratch is one of the live blocks freed above */
    cudaStreamDestroy(c->compute);
    free(c);
  }
  free(dev);
}

static zs_status zs__cuda_host_register(zs__device* dev, void* p,
                                        size_t bytes) {
  if (bytes == 0) return ZS_OK;
  cudaError_t e = cudaHostRegister(
      p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return zs__error(ZS_ERR_DEVICE,
                     "CUDA device %d: cudaHostRegister of %zu bytes of "
                     "offloaded host memory failed: %s (page-locked memory "
                     "is limited by the system: see ulimit -l)",
                     zs__impl(dev)->device, bytes, cudaGetErrorString(e));
  }
  return ZS_OK;
}
static void zs__cuda_host_unregister(zs__device* dev, void* p) {
  (void)dev;
  if (p != NULL && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}
static void zs__cuda_pci_busid(zs__device* dev, char* buf, size_t cap) {
  if (cap == 0) return;
  if (cudaDeviceGetPCIBusId(buf, (int)cap, zs__impl(dev)->device) !=
      cudaSuccess) {
    cudaGetLastError();
    buf[0] = '\0';
  }
}

static size_t zs__cuda_release_cached(zs__device* dev) {
  zs__cuda_impl* c = zs__impl(dev);
  const size_t bytes = c->cached_bytes;
  zs__cuda_release_cache(c);
  return bytes;
}

static const zs__device_ops zs__cuda_ops = {
    "cuda",
    zs__cuda_alloc,
    zs__cuda_free,
    zs__cuda_release_cached,
    zs__cuda_copy,
    zs__cuda_upload,
    zs__cuda_memset,
    zs__cuda_div_add,
    zs__cuda_sum_chunks,
    zs__cuda_optimize,
    zs__cuda_sumsq,
    zs__cuda_convert,
    zs__cuda_stream_create,
    zs__cuda_stream_destroy,
    zs__cuda_stream_sync,
    zs__cuda_event_create,
    zs__cuda_event_destroy,
    zs__cuda_event_record,
    zs__cuda_stream_wait_event,
    zs__cuda_host_register,
    zs__cuda_host_unregister,
    zs__cuda_pci_busid,
    zs__cuda_destroy,
};

zs_status zs__device_cuda_create(zs__accounting* acct, int local_rank,
                                 int local_size, zs__device** out) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return zs__error(ZS_ERR_UNSUPPORTED,
                     "CUDA device requested but none is usable on this node "
                     "(local rank %d): cudaGetDeviceCount: %s",
                     local_rank, e != cudaSuccess ? cudaGetErrorString(e)
                                                  : "0 devices");
  }
  /* fewer visible GPUs than ranks here: shared GPUs were refused by the
   * NCCL communicator's bus-id check before this runs */
  const int gpu = zs__cuda_device_index(local_rank, local_size, count);
  e = cudaSetDevice(gpu);
  if (e != cudaSuccess)
    return zs__error(ZS_ERR_DEVICE, "cudaSetDevice(%d) (local rank %d): %s",
                     gpu, local_rank, cudaGetErrorString(e));
  zs__device* dev = (zs__device*)calloc(1, sizeof *dev);
  zs__cuda_impl* c = (zs__cuda_impl*)calloc(1, sizeof *c);
  if (dev == NULL || c == NULL) {
    free(dev);
    free(c);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "CUDA device record");
  }
  c->device = gpu;
  dev->ops = &zs__cuda_ops;
  dev->kind = ZS_DEVICE_CUDA;
  dev->acct = acct;
  dev->impl = c;
  /* A blocking stream: ordered with the legacy default stream, where user
   * layer code runs its kernels (docs/cuda.md), in both directions. */
  e = cudaStreamCreateWithFlags(&c->compute, cudaStreamDefault);
  if (e != cudaSuccess) {
    zs_status st = zs__cuda_fail(dev, e, "cudaStreamCreate (compute)");
    free(c);
    free(dev);
    return st;
  }
  *out = dev;
  return ZS_OK;
}

