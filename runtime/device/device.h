/*
 * device.h — the device backend interface: where flat buffers live and how
 * bytes move. One vtable per backend (host here; CUDA in device_cuda.c).
 * The engine calls only these functions, never CUDA directly. Every
 * allocation is counted in the accounting tables under a category.
 *
 * Streams and events order work on a device; on the host they are no-ops
 * (every operation completes before it returns), so host code paths and
 * device code paths are the same sequence of calls.
 *
 * The NULL stream is the backend's compute stream. An operation on it that
 * reads or writes host memory is complete when it returns (its output may
 * be read, its host input reused). An operation on device memory only may
 * still run (CUDA: the host does not wait after each kernel); everything
 * that can read or reuse its output is ordered after it on the device:
 * later compute-stream operations, the user's kernels on the legacy
 * default stream, collectives (NCCL waits for the legacy stream, which
 * waits for the compute stream) and sumsq (reads its value back); a freed
 * buffer is reused by one of these, so free does not wait either. Work on
 * another stream (stream_create) is not ordered with the compute stream:
 * order it after the compute stream with stream_sync(dev, NULL) or an
 * event first, also when it uses a buffer that was freed and allocated
 * again.
 */
#ifndef ZS_RUNTIME_DEVICE_H_
#define ZS_RUNTIME_DEVICE_H_

#include "runtime/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__device zs__device;
typedef struct zs__stream zs__stream; /* opaque; NULL means the default stream */
typedef struct zs__event zs__event;

/* One optimizer update of a tensor piece (device_ops.optimize). Shapes: n
 * elements everywhere. */
typedef struct zs__opt_args {
  zs_optimizer_kind kind;
  zs_adam_hparams adam; /* ADAM/ADAMW */
  zs_sgd_hparams sgd;   /* SGD */
  int64_t step;         /* the step being applied, >= 1 */
  float* w;             /* fp32 values updated in place */
  const void* g;        /* gradient, gdtype */
  zs_dtype gdtype;
  float coef;           /* multiplies the gradient first (unscale, clip) */
  float* s[ZS_OPTIM_MAX_STATES]; /* the states (Adam: exp_avg, exp_avg_sq;
                           SGD: momentum), NULL past the optimizer's */
  /* a user's optimizer (zs_model_set_optimizer), else NULL: called on fp32
   * gradients with `span` filled but for its pointers and n */
  zs_optimizer_fn fn;
  void* fn_user;
  const zs_optim_span* span;
  void* p16;            /* NULL, or receives round(w) in dtype */
  zs_dtype dtype;
  size_t n;
  int threads;          /* host in-place path: OpenMP threads (0: default) */
} zs__opt_args;

typedef struct zs__device_ops {
  const char* name;
  /* Device memory of `bytes` bytes, 64-byte aligned (bytes may be 0: a
   * unique non-NULL pointer is returned). */
  zs_status (*alloc)(zs__device* dev, size_t bytes, void** out);
  void (*free)(zs__device* dev, void* ptr);
  /* Gives the device back what a caching allocator keeps of freed buffers
   * for reuse (CUDA: cudaFree of every cached block, which waits for the
   * device); returns those bytes. Host: nothing cached, 0. */
  size_t (*release_cached)(zs__device* dev);
  /* Copies bytes between any two buffers of this device or host memory,
   * ordered on `stream`. */
  zs_status (*copy)(zs__device* dev, void* dst, const void* src, size_t bytes,
                    zs__stream* stream);
  /* Copies bytes of host memory src (page-locked, for the copy engine to
   * read it asynchronously) into device memory dst, ordered on `stream` as
   * copy, but never waited for, on the compute stream either: src must
   * stay unchanged and allocated until something ordered after the copy
   * has completed (e.g. the collective that reads dst, which the caller
   * waits for). Host: memcpy, complete on return. */
  zs_status (*upload)(zs__device* dev, void* dst, const void* src,
                      size_t bytes, zs__stream* stream);
  zs_status (*memset)(zs__device* dev, void* dst, int value, size_t bytes,
                      zs__stream* stream);
  /* dst[i] = (base ? base[i] : 0) + src[i] / divisor for n elements of
   * dtype (fp32 only for now); dst may alias base or src. Used to turn a
   * reduce-scatter's sum into the mean over ranks. */
  zs_status (*div_add)(zs__device* dev, void* dst, const void* base,
                       const void* src, float divisor, size_t n,
                       zs_dtype dtype, zs__stream* stream);
  /* dst[i] = (((src[0][i] + src[1][i]) + src[2][i]) + ...) / divisor
   * over nchunks chunks of `chunk` elements laid out back to back in src:
   * the rank-ordered sum of the fixed-order reduce-scatter, scaled (the
   * mean over ranks: ncclAvg's role). Computed in fp32 and rounded once to
   * dtype (fp32, bf16, fp16). dst must not overlap src. */
  zs_status (*sum_chunks)(zs__device* dev, void* dst, const void* src,
                          int nchunks, size_t chunk, float divisor,
                          zs_dtype dtype, zs__stream* stream);
  /* The optimizer on n elements of one tensor piece (a->*: this device's
   * memory): gradient times coef, the update of the fp32 values w (master
   * weights, or fp32 parameters) and the states, and the rounding of w
   * into p16 when set. Host: zs_optim_*_fast in place when nothing needs
   * converting, else fused in chunks; bitwise the reference either way. */
  zs_status (*optimize)(zs__device* dev, const struct zs__opt_args* a,
                        zs__stream* stream);
  /* *acc += the sum of squares of n elements of src (fp32/bf16/fp16), in
   * double. Host: added in index order onto *acc, so a running sum over
   * pieces is the same at every stage. Synchronous (the value is read). */
  zs_status (*sumsq)(zs__device* dev, const void* src, zs_dtype dtype,
                     size_t n, double* acc);
  /* dst = src converted between fp32, bf16 and fp16 (zs_convert's rounding:
   * to nearest even); n elements. */
  zs_status (*convert)(zs__device* dev, void* dst, zs_dtype dst_dtype,
                       const void* src, zs_dtype src_dtype, size_t n,
                       zs__stream* stream);
  zs_status (*stream_create)(zs__device* dev, zs__stream** out);
  void (*stream_destroy)(zs__device* dev, zs__stream* stream);
  zs_status (*stream_sync)(zs__device* dev, zs__stream* stream);
  zs_status (*event_create)(zs__device* dev, zs__event** out);
  void (*event_destroy)(zs__device* dev, zs__event* event);
  zs_status (*event_record)(zs__device* dev, zs__event* event,
                            zs__stream* stream);
  /* Makes `stream` wait for `event` without blocking the host. */
  zs_status (*stream_wait_event)(zs__device* dev, zs__stream* stream,
                                 zs__event* event);
  /* Host memory `p` (bytes) made directly usable by the device: on CUDA
   * page-locked and mapped (cudaHostRegister, portable and mapped), so
   * copies to and from it are DMA and kernels may read and write it
   * through the same pointer; a no-op on the host. Undo with
   * host_unregister before freeing p. Errors: DEVICE naming the size. */
  zs_status (*host_register)(zs__device* dev, void* p, size_t bytes);
  void (*host_unregister)(zs__device* dev, void* p);
  /* The device's PCI bus id ("0000:3b:00.0") into buf (cap bytes), or ""
   * for the host: where CPU offload places host memory (the GPU's NUMA
   * node). */
  void (*pci_busid)(zs__device* dev, char* buf, size_t cap);
  void (*destroy)(zs__device* dev);
} zs__device_ops;

struct zs__device {
  const zs__device_ops* ops;
  zs_device_kind kind;
  zs__accounting* acct; /* not owned */
  void* impl;           /* backend state */
  /* When *hold_memory is nonzero (a collective timed out and may still
   * write into runtime buffers), zs__dev_free uncounts but does not free. */
  const int* hold_memory;
};

/* The fixed-order sum on host memory: dst[i] = ((src[0][i] + src[1][i]) +
 * ...) / divisor over n pieces of `count` elements each, in fp32, rounded
 * once to dtype (fp32, bf16, fp16): the host backend's sum_chunks, and the
 * shared-memory reduce-scatter's (comm_shm.c), so both give the same bits.
 * dst must not overlap src. Errors: UNSUPPORTED (another dtype). */
zs_status zs__host_sum_ranks(void* dst, const void* const* src, int n,
                             size_t count, float divisor, zs_dtype dtype);

/* The host backend: 64-byte aligned malloc, memcpy, memset, no-op streams. */
zs_status zs__device_host_create(zs__accounting* acct, zs__device** out);

/* Creates the backend for `kind`; local_rank/local_size: this rank among
 * the ranks of its node (the CUDA backend uses GPU local_rank). Errors:
 * UNSUPPORTED for a backend that is not linked in (CUDA: link
 * //runtime/device:device_cuda) or has no device. */
zs_status zs__device_create(zs_device_kind kind, zs__accounting* acct,
                            int local_rank, int local_size, zs__device** out);

/* The GPU (index among the visible ones) a rank uses: its local rank when
 * the node shows at least local_size GPUs; when it shows fewer (a launcher
 * that gives each rank its own GPU through CUDA_VISIBLE_DEVICES shows
 * one), local_rank % count. Ranks that thereby share a physical GPU are
 * refused by the NCCL communicator, which compares PCI bus ids. */
static inline int zs__cuda_device_index(int local_rank, int local_size,
                                        int count) {
  return count >= local_size || count <= 0 ? local_rank : local_rank % count;
}

/* A backend's constructor, as zs__device_create calls it. */
typedef zs_status (*zs__device_factory)(zs__accounting* acct, int local_rank,
                                        int local_size, zs__device** out);
/* Makes `create` the backend of `kind` (ZS_DEVICE_CUDA) for
 * zs__device_create: the CUDA plugin's, registered when it is loaded
 * (runtime/comm/comm_cuda.c, under its lock). Other kinds are ignored. */
void zs__device_register(zs_device_kind kind, zs__device_factory create);
/* Loads the CUDA backend the first time a CUDA device is asked for
 * without one registered: set by the plugin loader (comm_cuda.c) when the
 * program is loaded; NULL in a program without it. */
extern zs_status (*zs__device_loader)(void);
void zs__device_destroy(zs__device* dev);

/* Allocates `bytes` device bytes counted under category (label names the
 * buffer in leak reports and errors). Zero-filled when zero is set.
 * Errors: OUT_OF_MEMORY naming the label and size. */
zs_status zs__dev_alloc(zs__device* dev, zs_mem_category category,
                        size_t bytes, int zero, const char* label, void** out);
/* Frees and uncounts; NULL is ignored. */
void zs__dev_free(zs__device* dev, void* ptr);

/* Test hook (NULL in programs): called by every zs__dev_alloc before the
 * backend; a status other than ZS_OK (with its message set) fails that
 * allocation exactly as a backend out of memory does, so tests can run one
 * rank out of device memory at a chosen buffer. */
extern zs_status (*zs__dev_alloc_fault)(zs_mem_category category,
                                        size_t bytes, const char* label);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_DEVICE_H_ */
