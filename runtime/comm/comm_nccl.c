/*
 * comm_nccl.c — the NCCL communicator backend (comm.h) for the CUDA device
 * backend (one rank: a local mode of device copies, without NCCL). Collectives on device memory run on NCCL on a dedicated
 * communication stream; collectives on host memory (the engine's small
 * agreements, consistency checks and norm partial sums) go to an MPI
 * communicator over the same ranks, so the engine calls one interface for
 * both.
 *
 * Bootstrap (NCCL's documented pattern): rank 0 creates the unique id,
 * MPI_Bcast sends it, every rank selects GPU local_rank and calls
 * ncclCommInitRank. Ordering: before each NCCL call the communication
 * stream waits for an event recorded on the legacy default stream, which
 * follows all work of blocking streams (the caller's kernels that wrote a
 * gradient bucket, the engine's synchronous operations); a request is an
 * event recorded after the call, completed by cudaEventQuery. While a
 * request is pending, ncclCommGetAsyncError is checked, and a NCCL error
 * becomes ZS_ERR_COMM naming it (comm.c adds the collective and unit, and
 * turns a wait past collective_timeout_s into ZS_ERR_TIMEOUT, or another
 * rank's failure notice, sent through the MPI communicator, into
 * ZS_ERR_REMOTE; the communicator is then aborted so no kernel keeps
 * waiting).
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_nccl.h"
#include "runtime/comm/comm_wait.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NCCL is loaded at run time (dlopen of libnccl.so.2, or of the file
 * ZS_NCCL_LIBRARY names: another NCCL build, or the tests' stand-in), so
 * programs do not depend on it: a single GPU needs no NCCL (the local
 * mode below), and a machine with only the CUDA driver runs them. */
static struct {
  __typeof__(&ncclAllGather) AllGather;
  __typeof__(&ncclAllReduce) AllReduce;
  __typeof__(&ncclBroadcast) Broadcast;
  __typeof__(&ncclCommAbort) CommAbort;
  __typeof__(&ncclCommDestroy) CommDestroy;
  __typeof__(&ncclCommGetAsyncError) CommGetAsyncError;
  __typeof__(&ncclCommInitRank) CommInitRank;
  __typeof__(&ncclGetErrorString) GetErrorString;
  __typeof__(&ncclGetUniqueId) GetUniqueId;
  __typeof__(&ncclGroupEnd) GroupEnd;
  __typeof__(&ncclGroupStart) GroupStart;
  __typeof__(&ncclRecv) Recv;
  __typeof__(&ncclReduceScatter) ReduceScatter;
  __typeof__(&ncclSend) Send;
} zs__nccl_fn;
static pthread_once_t zs__nccl_once = PTHREAD_ONCE_INIT;
static char zs__nccl_why[512];

static void zs__nccl_load(void) {
  const char* path = getenv("ZS_NCCL_LIBRARY");
  void* h = NULL;
  if (path != NULL && *path != '\0') {
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  } else {
    h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
  }
  if (h == NULL) {
    snprintf(zs__nccl_why, sizeof zs__nccl_why, "%s%s%s", dlerror(),
             path != NULL && *path != '\0' ? "; from ZS_NCCL_LIBRARY=" : "",
             path != NULL && *path != '\0' ? path : "");
    return;
  }
#define ZS__SYM(name)                                                    \
  if ((*(void**)&zs__nccl_fn.name = dlsym(h, "nccl" #name)) == NULL) {   \
    snprintf(zs__nccl_why, sizeof zs__nccl_why, "libnccl has no nccl%s", \
             #name);                                                     \
    return;                                                              \
  }
  ZS__SYM(AllGather) ZS__SYM(AllReduce) ZS__SYM(Broadcast)
  ZS__SYM(CommAbort) ZS__SYM(CommDestroy) ZS__SYM(CommGetAsyncError)
  ZS__SYM(CommInitRank) ZS__SYM(GetErrorString) ZS__SYM(GetUniqueId)
  ZS__SYM(GroupEnd) ZS__SYM(GroupStart) ZS__SYM(Recv)
  ZS__SYM(ReduceScatter) ZS__SYM(Send)
#undef ZS__SYM
}

typedef struct zs__stage_job zs__stage_job;
typedef struct zs__stage_buf zs__stage_buf;

typedef struct zs__nccl_impl {
  ncclComm_t comm;
  cudaStream_t stream;
  zs__comm* host; /* MPI over the same ranks, for host buffers (owned) */
  int device;
  int local;      /* one rank: collectives are device copies, no NCCL */
  cudaEvent_t order; /* reused: the legacy stream's point each call waits
                        for (cudaStreamWaitEvent takes the event's state at
                        the call, so one event serves every call) */
  /* Staged mode (ZS_DEVICE_COMM=staged; see the section below): device
   * collectives through page-locked host buffers and `stage`, a host
   * communicator of the same ranks (MPI), so several
   * ranks may share one GPU. NULL: NCCL. */
  zs__comm* stage;
  zs__stage_buf* cache; /* staging blocks free for reuse */
  atomic_int aborted;   /* given up (a timeout, another rank's failure, the
                           watchdog): nothing in flight completes */
  /* The watchdog (zs__nccl_watchdog): the device requests in flight,
   * checked against collective_timeout_s and NCCL's asynchronous errors
   * from a thread of their own. */
  pthread_mutex_t wd_mu;
  pthread_cond_t wd_cv;
  pthread_t wd;
  int wd_tried, wd_running, wd_stop;
  int hb_listening;     /* zs__nccl_lost listens to the heartbeats */
  zs__comm_req* wd_head;
  atomic_int wd_fired;  /* set after wd_why and wd_status, before aborted */
  zs_status wd_status;  /* TIMEOUT, REMOTE (a lost rank) or COMM */
  char wd_why[1200];
  int lost_rank;        /* -1, or a rank the heartbeats lost (wd_mu) */
  char lost_why[512];
  /* The device timeline (ZS_DEVICE_TIMELINE=PATH; see zs__tl_write):
   * timing events of every device collective and of the marks, written to
   * PATH.rank<R>.jsonl when the communicator is destroyed. */
  char* tl_path;
  cudaEvent_t tl_base;  /* recorded (and waited for) at creation */
  cudaEvent_t tl_start; /* the collective being queued: its start */
  struct zs__tl_item* tl;
  size_t tl_n, tl_cap;
} zs__nccl_impl;

typedef struct zs__tl_item {
  cudaEvent_t a, b;  /* start and end (a mark: a only) */
  const char* what;  /* "all-gather", ...; a mark's label (static) */
  char unit[48];     /* a mark's unit */
  size_t bytes;
  int mark;
} zs__tl_item;

struct zs__comm_req {
  zs__comm_req* host_req; /* a host collective's MPI request, or NULL */
  cudaEvent_t done;       /* after the NCCL call */
  zs__stage_job* job;     /* staged mode: the host part and its buffers */
  /* the watchdog's list (under wd_mu) */
  zs__comm_req *wd_prev, *wd_next;
  int wd_listed;
  double t_issue;         /* zs__mono() at the call */
  double t_chain;         /* zs__mono() when the device's later work was
                             made to wait for it (zs__nccl_chain), else 0:
                             a host waits for it, with the wait's timeout */
  const char* what;       /* "all-gather", ... */
  size_t bytes;
};

/* Seconds on a monotonic clock (the plugin's own: zs__now is the
 * library's). */
static double zs__mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zs__nccl_impl* zs__nimpl(zs__comm* c) { return (zs__nccl_impl*)c->impl; }

static void zs__nccl_watchdog_start(zs__comm* c);

static zs_status zs__nccl_fail(ncclResult_t r, const char* what) {
  return zs__error(ZS_ERR_COMM, "NCCL %s failed: %s (%d)", what,
                   zs__nccl_fn.GetErrorString != NULL
                       ? zs__nccl_fn.GetErrorString(r)
                       : "NCCL not loaded",
                   (int)r);
}

static int zs__nccl_type(zs_dtype d, ncclDataType_t* out) {
  switch (d) {
    case ZS_FLOAT32: *out = ncclFloat32; return 1;
    case ZS_BFLOAT16: *out = ncclBfloat16; return 1;
    case ZS_FLOAT16: *out = ncclFloat16; return 1;
    case ZS_UINT8: *out = ncclUint8; return 1;
    case ZS_INT64: *out = ncclInt64; return 1;
    case ZS_UINT64: *out = ncclUint64; return 1;
    case ZS_FLOAT64: *out = ncclFloat64; return 1;
    case ZS_DTYPE_COUNT:
    case ZS_DTYPE_AUTO: break;
  }
  return 0;
}

static ncclRedOp_t zs__nccl_op(zs__red_op op) {
  return op == ZS__RED_MAX ? ncclMax : op == ZS__RED_MIN ? ncclMin : ncclSum;
}

/* Host memory (not device or managed memory): served by MPI. */
static int zs__is_host(const void* p) {
  if (p == NULL || p == ZS__IN_PLACE) return 0;
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

/* Before a NCCL call: the dtype's NCCL type into *t, and the communication
 * stream made to wait for the work queued so far. */
static zs_status zs__nccl_begin(zs__comm* c, zs_dtype dtype, const char* what,
                                ncclDataType_t* t) {
  if (!zs__nccl_type(dtype, t))
    return zs__error(ZS_ERR_UNSUPPORTED, "NCCL %s: dtype %s", what,
                     zs_dtype_name(dtype));
  zs__nccl_impl* n = zs__nimpl(c);
  cudaError_t e = cudaSuccess;
  if (n->order == NULL)
    e = cudaEventCreateWithFlags(&n->order, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(n->order, cudaStreamLegacy);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(n->stream, n->order, 0);
  if (e == cudaSuccess && n->tl_path != NULL && n->tl_start == NULL &&
      cudaEventCreate(&n->tl_start) == cudaSuccess &&
      cudaEventRecord(n->tl_start, n->stream) != cudaSuccess) {
    (void)cudaGetLastError(); /* (the timeline only: no item) */
    cudaEventDestroy(n->tl_start);
    n->tl_start = NULL;
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* reported here */
    return zs__error(ZS_ERR_DEVICE, "NCCL %s: ordering event: %s (the "
                     "failing operation may be an earlier asynchronous one "
                     "on this device)", what, cudaGetErrorString(e));
  }
  return ZS_OK;
}

/* ==== The device timeline ===============================================
 *
 * ZS_DEVICE_TIMELINE=PATH: each device collective is bracketed by two
 * timing events on the communication stream (its start: after the wait
 * for the legacy stream; its end), and the engine marks where the user's
 * backward of each unit begins and ends on the legacy stream (grad
 * acquire and release: comm ops' mark). When the communicator is
 * destroyed every item is written to PATH.rank<R>.jsonl, one JSON object
 * a line, in milliseconds from an event recorded at creation:
 *   {"rank":0,"kind":"collective","op":"reduce-scatter","bytes":N,
 *    "start_ms":1.25,"end_ms":1.75}
 *   {"rank":0,"kind":"mark","label":"backward end","unit":"h.3","ms":1.5}
 * Device timestamps, not the host's: a collective whose interval
 * intersects another unit's backward ran during that compute
 * (tools/gpu/timeline.py). At most ZS__TL_CAP items (the first ones). */

#define ZS__TL_CAP 200000

static zs__tl_item* zs__tl_next(zs__nccl_impl* n) {
  if (n->tl_n == n->tl_cap) {
    if (n->tl_cap >= ZS__TL_CAP) return NULL;
    const size_t cap = n->tl_cap == 0 ? 1024 : 2 * n->tl_cap;
    zs__tl_item* p = (zs__tl_item*)realloc(n->tl, cap * sizeof *p);
    if (p == NULL) return NULL;
    n->tl = p;
    n->tl_cap = cap;
  }
  zs__tl_item* it = &n->tl[n->tl_n];
  memset(it, 0, sizeof *it);
  return it;
}

/* The collective just queued: its start event (zs__nccl_begin's) and an
 * end event after it. */
static void zs__tl_collective(zs__nccl_impl* n, const char* what,
                              size_t bytes) {
  if (n->tl_start == NULL) return;
  cudaEvent_t a = n->tl_start, b = NULL;
  n->tl_start = NULL;
  zs__tl_item* it = zs__tl_next(n);
  if (it == NULL || cudaEventCreate(&b) != cudaSuccess ||
      cudaEventRecord(b, n->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaEventDestroy(a);
    if (b != NULL) cudaEventDestroy(b);
    return;
  }
  it->a = a;
  it->b = b;
  it->what = what;
  it->bytes = bytes;
  n->tl_n++;
}

static void zs__nccl_mark(zs__comm* c, const char* label, const char* unit) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (n->tl_path == NULL) return;
  zs__tl_item* it = zs__tl_next(n);
  cudaEvent_t a = NULL;
  if (it == NULL || cudaEventCreate(&a) != cudaSuccess ||
      cudaEventRecord(a, cudaStreamLegacy) != cudaSuccess) {
    (void)cudaGetLastError();
    if (a != NULL) cudaEventDestroy(a);
    return;
  }
  it->a = a;
  it->what = label;
  snprintf(it->unit, sizeof it->unit, "%s", unit != NULL ? unit : "-");
  it->mark = 1;
  n->tl_n++;
}

/* ms from the base to ev, or -1 when it did not complete (an aborted
 * collective). */
static double zs__tl_ms(zs__nccl_impl* n, cudaEvent_t ev) {
  float ms = 0.0f;
  if (cudaEventQuery(ev) != cudaSuccess ||
      cudaEventElapsedTime(&ms, n->tl_base, ev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1.0;
  }
  return (double)ms;
}

/* At destroy: waits for the device (unless aborted: then what completed),
 * writes the items, frees them. A file that cannot be written is a
 * warning. */
static void zs__tl_write(zs__comm* c) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (n->tl_path == NULL) return;
  if (!atomic_load(&n->aborted)) {
    cudaStreamSynchronize(n->stream);
    cudaStreamSynchronize(cudaStreamLegacy);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s.rank%d.jsonl", n->tl_path, c->rank);
  FILE* f = fopen(path, "w");
  if (f == NULL)
    zs__log(ZS_LOG_WARN, "ZS_DEVICE_TIMELINE: cannot write %s", path);
  for (size_t i = 0; i < n->tl_n; i++) {
    const zs__tl_item* it = &n->tl[i];
    const double a = zs__tl_ms(n, it->a);
    if (f != NULL && it->mark && a >= 0)
      fprintf(f, "{\"rank\":%d,\"kind\":\"mark\",\"label\":\"%s\","
              "\"unit\":\"%s\",\"ms\":%.4f}\n", c->rank, it->what, it->unit, a);
    else if (f != NULL && !it->mark) {
      const double b = zs__tl_ms(n, it->b);
      if (a >= 0 && b >= 0)
        fprintf(f, "{\"rank\":%d,\"kind\":\"collective\",\"op\":\"%s\","
                "\"bytes\":%zu,\"start_ms\":%.4f,\"end_ms\":%.4f}\n", c->rank,
                it->what, it->bytes, a, b);
    }
    cudaEventDestroy(it->a);
    if (it->b != NULL) cudaEventDestroy(it->b);
  }
  if (f != NULL) fclose(f);
  free(n->tl);
  n->tl = NULL;
  n->tl_n = n->tl_cap = 0;
  if (n->tl_start != NULL) cudaEventDestroy(n->tl_start);
  cudaEventDestroy(n->tl_base);
  free(n->tl_path);
  n->tl_path = NULL;
}

/* The watchdog's list of device requests in flight (zs__nccl_watchdog). */
static void zs__wd_add(zs__nccl_impl* n, zs__comm_req* q) {
  if (!n->wd_running) return;
  pthread_mutex_lock(&n->wd_mu);
  q->wd_prev = NULL;
  q->wd_next = n->wd_head;
  if (n->wd_head != NULL) n->wd_head->wd_prev = q;
  n->wd_head = q;
  q->wd_listed = 1;
  pthread_mutex_unlock(&n->wd_mu);
}

static void zs__wd_remove(zs__nccl_impl* n, zs__comm_req* q) {
  if (!q->wd_listed) return;
  pthread_mutex_lock(&n->wd_mu);
  if (q->wd_prev != NULL) q->wd_prev->wd_next = q->wd_next;
  else n->wd_head = q->wd_next;
  if (q->wd_next != NULL) q->wd_next->wd_prev = q->wd_prev;
  q->wd_listed = 0;
  pthread_mutex_unlock(&n->wd_mu);
}

/* Records the request's event after the call(s) queued on the
 * communication stream (a staged collective's job rides along), and gives
 * it to the watchdog; blocking when req is NULL. */
static zs_status zs__nccl_end_job(zs__comm* c, ncclResult_t r,
                                  const char* what, size_t bytes,
                                  zs__stage_job* job, zs__comm_req** req) {
  if (r != ncclSuccess) return zs__nccl_fail(r, what);
  zs__comm_req* q = (zs__comm_req*)calloc(1, sizeof *q);
  if (q == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NCCL request");
  cudaError_t e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(q->done, zs__nimpl(c)->stream);
  if (e != cudaSuccess) {
    free(q);
    return zs__error(ZS_ERR_DEVICE, "NCCL backend: %s: event: %s", what,
                     cudaGetErrorString(e));
  }
  q->job = job;
  q->what = what;
  q->bytes = bytes;
  q->t_issue = zs__mono();
  zs__tl_collective(zs__nimpl(c), what, bytes);
  zs__nccl_watchdog_start(c);
  zs__wd_add(zs__nimpl(c), q);
  if (req != NULL) {
    *req = q;
    return ZS_OK;
  }
  return c->ops->wait(c, q);
}

/* One rank (local mode): a collective's effect is a device copy (none when
 * dst == src), ordered on the communication stream like a NCCL call. */
static zs_status zs__local_copy(zs__comm* c, void* dst, const void* src,
                                size_t bytes, const char* what,
                                zs__comm_req** req) {
  if (bytes > 0 && dst != src) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                    zs__nimpl(c)->stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* reported here, not by the next launch */
      return zs__error(ZS_ERR_DEVICE, "%s (one rank): copy: %s", what,
                       cudaGetErrorString(e));
    }
  }
  return zs__nccl_end_job(c, ncclSuccess, what, bytes, NULL, req);
}

/* ==== Staged mode: several ranks on one GPU ==============================
 *
 * NCCL needs one GPU per rank. With ZS_DEVICE_COMM=staged the device
 * collectives go through page-locked host memory instead: on the
 * communication stream, after the wait for the legacy stream, the device
 * operands are copied to host staging buffers, a host function
 * (cudaLaunchHostFunc) runs the host communicator's collective on them
 * (MPI: `stage`, split off the context's communicator, of its own so
 * these never pair with the engine's host collectives), and the results
 * are copied back; the request's event follows. Everything is queued at
 * the call, so the host never waits and a consumer can wait on the device
 * (the event), as with NCCL. The host functions run in stream order, so
 * every rank starts the staged collectives in issue order. Sums are the
 * host backend's (the fixed-order reduce-scatter is an exchange and the
 * device's rank-ordered sum, as with NCCL): the same bits as NCCL's path
 * where that one is bitwise. Staging blocks are cached by size for the
 * communicator's life.
 */

struct zs__stage_buf {
  zs__stage_buf* next;
  size_t bytes;
  void* p; /* page-locked (cudaHostRegister) */
};

struct zs__stage_job {
  zs__nccl_impl* n;
  zs__call call;          /* what the host communicator runs */
  void* send;             /* host staging buffers */
  void* recv;
  size_t count;
  zs_dtype dtype;
  zs__red_op op;
  int root;
  uint64_t users;
  size_t* offsets;        /* exchange: p * count */
  zs__stage_buf* buf[2];
  atomic_int state;       /* 0 queued, 1 running, 2 done, 3 failed */
  char why[512];          /* 3: why */
};

/* A page-locked block of at least `bytes` bytes: the smallest cached one
 * that fits, else a new one. */
static zs_status zs__stage_take(zs__nccl_impl* n, size_t bytes,
                                zs__stage_buf** out) {
  zs__stage_buf** best = NULL;
  for (zs__stage_buf** b = &n->cache; *b != NULL; b = &(*b)->next)
    if ((*b)->bytes >= bytes && (best == NULL || (*b)->bytes < (*best)->bytes))
      best = b;
  if (best != NULL) {
    *out = *best;
    *best = (*best)->next;
    (*out)->next = NULL;
    return ZS_OK;
  }
  const size_t size = (bytes + 4095) / 4096 * 4096 + (bytes == 0 ? 4096 : 0);
  zs__stage_buf* b = (zs__stage_buf*)calloc(1, sizeof *b);
  void* p = NULL;
  if (b == NULL || posix_memalign(&p, 4096, size) != 0) {
    free(b);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "staged collective: %zu bytes of "
                     "host staging memory", size);
  }
  cudaError_t e = cudaHostRegister(p, size, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    free(p);
    free(b);
    return zs__error(ZS_ERR_DEVICE, "staged collective: page-locking %zu "
                     "bytes of host staging memory: %s", size,
                     cudaGetErrorString(e));
  }
  b->p = p;
  b->bytes = size;
  *out = b;
  return ZS_OK;
}

static void zs__stage_give(zs__nccl_impl* n, zs__stage_buf* b) {
  if (b == NULL) return;
  b->next = n->cache;
  n->cache = b;
}

static void zs__stage_cache_free(zs__nccl_impl* n) {
  while (n->cache != NULL) {
    zs__stage_buf* b = n->cache;
    n->cache = b->next;
    cudaHostUnregister(b->p);
    free(b->p);
    free(b);
  }
}

/* The host part, on CUDA's host-function thread in stream order: the host
 * communicator's collective, polled to its end (or until the communicator
 * is aborted: then its request is left to the host communicator, which
 * is failed too and keeps it). Calls no CUDA function. */
static void CUDART_CB zs__stage_run(void* arg) {
  zs__stage_job* j = (zs__stage_job*)arg;
  zs__nccl_impl* n = j->n;
  zs__comm* h = n->stage;
  zs__comm_req* q = NULL;
  zs_status st = ZS_OK;
  if (atomic_load(&n->aborted)) {
    snprintf(j->why, sizeof j->why, "the communicator was aborted before "
             "this collective started");
    atomic_store(&j->state, 3);
    return;
  }
  atomic_store(&j->state, 1);
  switch (j->call) {
    case ZS__CALL_ALL_GATHER:
      st = h->ops->all_gather(h, ZS__IN_PLACE, j->recv, j->count, j->dtype,
                              NULL, &q);
      break;
    case ZS__CALL_REDUCE_SCATTER:
      st = h->ops->reduce_scatter(h, j->send, j->recv, j->count, j->dtype,
                                  j->op, NULL, &q);
      break;
    case ZS__CALL_ALL_REDUCE:
      st = h->ops->all_reduce(h, ZS__IN_PLACE, j->recv, j->count, j->dtype,
                              j->op, NULL, &q);
      break;
    case ZS__CALL_BROADCAST:
      st = h->ops->broadcast(h, j->recv, j->count, j->dtype, j->root, NULL,
                             &q);
      break;
    case ZS__CALL_EXCHANGE:
      st = h->ops->exchange(h, j->send, j->offsets, j->recv, j->count,
                            j->dtype, NULL, &q);
      break;
    case ZS__CALL_GATHER_USERS:
      st = h->ops->gather_users(h, j->send, j->recv, j->count, j->dtype,
                                j->users, NULL, &q);
      break;
    default:
      st = zs__error(ZS_ERR_INTERNAL, "staged collective: call %d", (int)j->call);
  }
  while (st == ZS_OK) {
    int done = 0;
    st = h->ops->test(h, q, &done);
    if (st != ZS_OK || done) break;
    if (atomic_load(&n->aborted)) {
      /* (its request stays posted: the host communicator is kept at
       * destroy, failed) */
      snprintf(j->why, sizeof j->why, "the communicator was aborted while "
               "this collective waited for the other ranks");
      atomic_store(&j->state, 3);
      return;
    }
    if (h->ops->idle != NULL) h->ops->idle(h, q);
    else sched_yield();
  }
  if (st != ZS_OK)
    snprintf(j->why, sizeof j->why, "the host collective failed: %s",
             zs_last_error());
  atomic_store(&j->state, st == ZS_OK ? 2 : 3);
}

/* A job for `call` with staging blocks of b0 and b1 bytes (b1 0: none). */
static zs_status zs__stage_job_new(zs__nccl_impl* n, zs__call call,
                                   size_t b0, size_t b1, size_t count,
                                   zs_dtype dtype, zs__stage_job** out) {
  zs__stage_job* j = (zs__stage_job*)calloc(1, sizeof *j);
  if (j == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "staged collective: job");
  j->n = n;
  j->call = call;
  j->count = count;
  j->dtype = dtype;
  j->root = -1;
  zs_status st = zs__stage_take(n, b0, &j->buf[0]);
  if (st == ZS_OK && b1 > 0) st = zs__stage_take(n, b1, &j->buf[1]);
  if (st != ZS_OK) {
    zs__stage_give(n, j->buf[0]);
    free(j);
    return st;
  }
  *out = j;
  return ZS_OK;
}

/* A job whose blocks nothing queued references any more. */
static void zs__stage_job_free(zs__nccl_impl* n, zs__stage_job* j) {
  if (j == NULL) return;
  zs__stage_give(n, j->buf[0]);
  zs__stage_give(n, j->buf[1]);
  free(j->offsets);
  free(j);
}

/* One asynchronous copy on the communication stream (device to staging,
 * or back). */
static zs_status zs__stage_copy(zs__nccl_impl* n, void* dst, const void* src,
                                size_t bytes, const char* what) {
  if (bytes == 0) return ZS_OK;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                  n->stream);
  if (e == cudaSuccess) return ZS_OK;
  (void)cudaGetLastError(); /* reported here */
  return zs__error(ZS_ERR_DEVICE, "staged %s: copy of %zu bytes: %s", what,
                   bytes, cudaGetErrorString(e));
}

/* Queues the job's host part (after its copies in). */
static zs_status zs__stage_launch(zs__nccl_impl* n, zs__stage_job* j,
                                  const char* what) {
  cudaError_t e = cudaLaunchHostFunc(n->stream, zs__stage_run, j);
  if (e == cudaSuccess) return ZS_OK;
  (void)cudaGetLastError();
  return zs__error(ZS_ERR_DEVICE, "staged %s: cudaLaunchHostFunc: %s", what,
                   cudaGetErrorString(e));
}

/* The common sequence of one staged collective: one copy in (bytes_in
 * from in_src to in_dst; none when 0), the host part, one copy out, the
 * request (a job queued is the request's; on an error after the first
 * copy the job is leaked: a queued copy may still touch its blocks). */
static zs_status zs__stage_go(zs__comm* c, zs__stage_job* j, const char* what,
                              void* in_dst, const void* in_src,
                              size_t bytes_in, void* out_dst,
                              const void* out_src, size_t bytes_out,
                              size_t bytes, zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  zs_status st = zs__stage_copy(n, in_dst, in_src, bytes_in, what);
  if (st == ZS_OK) st = zs__stage_launch(n, j, what);
  if (st == ZS_OK) st = zs__stage_copy(n, out_dst, out_src, bytes_out, what);
  if (st != ZS_OK) return st;
  return zs__nccl_end_job(c, ncclSuccess, what, bytes, j, req);
}

/* The exchange's and the strided all-gather's copies are many: they
 * queue them themselves. */
#define ZS__STAGE_TRY(expr) \
  do {                      \
    st = (expr);            \
    if (st != ZS_OK) return st; \
  } while (0)

static zs_status zs__staged_all_gather(zs__comm* c, const void* send,
                                       void* recv, size_t count,
                                       zs_dtype dtype, zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t b = count * zs_dtype_size(dtype), W = (size_t)c->world;
  zs__stage_job* j = NULL;
  zs_status st = zs__stage_job_new(n, ZS__CALL_ALL_GATHER, W * b, 0, count,
                                   dtype, &j);
  if (st != ZS_OK) return st;
  char* h = (char*)j->buf[0]->p;
  j->recv = h;
  const void* own = send == ZS__IN_PLACE
                        ? (const char*)recv + (size_t)c->rank * b
                        : send;
  return zs__stage_go(c, j, "all-gather", h + (size_t)c->rank * b, own, b,
                      recv, h, W * b, W * b, req);
}

static zs_status zs__staged_reduce_scatter(zs__comm* c, const void* send,
                                           void* recv, size_t count,
                                           zs_dtype dtype, zs__red_op op,
                                           zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t b = count * zs_dtype_size(dtype), W = (size_t)c->world;
  zs__stage_job* j = NULL;
  zs_status st = zs__stage_job_new(n, ZS__CALL_REDUCE_SCATTER, W * b, b,
                                   count, dtype, &j);
  if (st != ZS_OK) return st;
  j->send = j->buf[0]->p;
  j->recv = j->buf[1]->p;
  j->op = op;
  return zs__stage_go(c, j, "reduce-scatter", j->send, send, W * b, recv,
                      j->recv, b, W * b, req);
}

static zs_status zs__staged_all_reduce(zs__comm* c, const void* send,
                                       void* recv, size_t count,
                                       zs_dtype dtype, zs__red_op op,
                                       zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t b = count * zs_dtype_size(dtype);
  zs__stage_job* j = NULL;
  zs_status st = zs__stage_job_new(n, ZS__CALL_ALL_REDUCE, b, 0, count, dtype,
                                   &j);
  if (st != ZS_OK) return st;
  j->recv = j->buf[0]->p;
  j->op = op;
  return zs__stage_go(c, j, "all-reduce", j->recv,
                      send == ZS__IN_PLACE ? recv : send, b, recv, j->recv, b,
                      b, req);
}

/* (the root copies in, the others out) */
static zs_status zs__staged_broadcast(zs__comm* c, void* buf, size_t count,
                                      zs_dtype dtype, int root,
                                      zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t b = count * zs_dtype_size(dtype);
  zs__stage_job* j = NULL;
  zs_status st = zs__stage_job_new(n, ZS__CALL_BROADCAST, b, 0, count, dtype,
                                   &j);
  if (st != ZS_OK) return st;
  j->recv = j->buf[0]->p;
  j->root = root;
  const int is_root = c->rank == root;
  return zs__stage_go(c, j, "broadcast", j->recv, buf, is_root ? b : 0, buf,
                      j->recv, is_root ? 0 : b, b, req);
}

static zs_status zs__staged_exchange(zs__comm* c, const void* send,
                                     const size_t* offsets, void* recv,
                                     size_t chunk, zs_dtype dtype,
                                     zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t elem = zs_dtype_size(dtype), b = chunk * elem;
  const size_t W = (size_t)c->world;
  zs__stage_job* j = NULL;
  zs_status st;
  ZS__STAGE_TRY(zs__stage_job_new(n, ZS__CALL_EXCHANGE, W * b, W * b, chunk,
                                  dtype, &j));
  j->offsets = (size_t*)malloc(W * sizeof *j->offsets);
  if (j->offsets == NULL) {
    zs__stage_job_free(n, j);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "staged exchange: offsets");
  }
  j->send = j->buf[0]->p;
  j->recv = j->buf[1]->p;
  for (size_t p = 0; p < W; p++) {
    j->offsets[p] = p * chunk;
    ZS__STAGE_TRY(zs__stage_copy(n, (char*)j->send + p * b,
                                 (const char*)send + offsets[p] * elem, b,
                                 "exchange"));
  }
  ZS__STAGE_TRY(zs__stage_launch(n, j, "exchange"));
  ZS__STAGE_TRY(zs__stage_copy(n, recv, j->recv, W * b, "exchange"));
  return zs__nccl_end_job(c, ncclSuccess, "exchange", W * b, j, req);
}

static zs_status zs__staged_all_gather_strided(zs__comm* c, void* buf,
                                               size_t offset, size_t stride,
                                               size_t chunk, zs_dtype dtype,
                                               zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t elem = zs_dtype_size(dtype), b = chunk * elem;
  const size_t W = (size_t)c->world;
  zs__stage_job* j = NULL;
  zs_status st;
  ZS__STAGE_TRY(zs__stage_job_new(n, ZS__CALL_ALL_GATHER, W * b, 0, chunk,
                                  dtype, &j));
  char* h = (char*)j->buf[0]->p;
  j->recv = h;
  char* d = (char*)buf;
  const size_t r = (size_t)c->rank;
  ZS__STAGE_TRY(zs__stage_copy(n, h + r * b, d + (r * stride + offset) * elem,
                               b, "strided all-gather"));
  ZS__STAGE_TRY(zs__stage_launch(n, j, "strided all-gather"));
  for (size_t p = 0; p < W; p++)
    if (p != r)
      ZS__STAGE_TRY(zs__stage_copy(n, d + (p * stride + offset) * elem,
                                   h + p * b, b, "strided all-gather"));
  return zs__nccl_end_job(c, ncclSuccess, "strided all-gather", W * b, j, req);
}

static zs_status zs__staged_gather_users(zs__comm* c, const void* send,
                                         void* recv, size_t count,
                                         zs_dtype dtype, uint64_t users,
                                         zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  const size_t b = count * zs_dtype_size(dtype), W = (size_t)c->world;
  const int user = (int)(users >> c->rank & 1);
  zs__stage_job* j = NULL;
  zs_status st = zs__stage_job_new(n, ZS__CALL_GATHER_USERS, b,
                                   user ? W * b : 0, count, dtype, &j);
  if (st != ZS_OK) return st;
  j->send = j->buf[0]->p;
  j->recv = user ? j->buf[1]->p : NULL;
  j->users = users;
  return zs__stage_go(c, j, "gather", j->send, send, b, recv, j->recv,
                      user ? W * b : 0, W * b, req);
}

#undef ZS__STAGE_TRY

/* A host-memory collective through MPI, wrapped into a request of ours. */
#define ZS__NCCL_HOST(call)                                                 \
  do {                                                                      \
    zs__comm_req* q_ = NULL;                                                \
    zs_status st_ = (call);                                                 \
    if (st_ != ZS_OK || req == NULL) return st_;                            \
    *req = (zs__comm_req*)calloc(1, sizeof **req);                          \
    if (*req == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NCCL request"); \
    (*req)->host_req = q_;                                                  \
    return ZS_OK;                                                           \
  } while (0)

static zs_status zs__nccl_all_gather(zs__comm* c, const void* send, void* recv,
                                     size_t count, zs_dtype dtype,
                                     zs__stream* stream, zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(recv))
    ZS__NCCL_HOST(n->host->ops->all_gather(n->host, send, recv, count, dtype,
                                           stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "all-gather", &t);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  const void* s = send == ZS__IN_PLACE
                      ? (const char*)recv + (size_t)c->rank * count * elem
                      : send;
  if (n->local) return zs__local_copy(c, recv, s, count * elem, "all-gather", req);
  if (n->stage != NULL) return zs__staged_all_gather(c, send, recv, count, dtype, req);
  return zs__nccl_end_job(c, zs__nccl_fn.AllGather(s, recv, count, t, n->comm, n->stream),
                          "all-gather", count * elem * (size_t)c->world, NULL, req);
}


static zs_status zs__nccl_reduce_scatter(zs__comm* c, const void* send,
                                         void* recv, size_t count,
                                         zs_dtype dtype, zs__red_op op,
                                         zs__stream* stream,
                                         zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(recv))
    ZS__NCCL_HOST(n->host->ops->reduce_scatter(n->host, send, recv, count,
                                               dtype, op, stream,
                                               req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "reduce-scatter", &t);
  if (st != ZS_OK) return st;
  if (n->local)
    return zs__local_copy(c, recv, send, count * zs_dtype_size(dtype),
                          "reduce-scatter", req);
  if (n->stage != NULL)
    return zs__staged_reduce_scatter(c, send, recv, count, dtype, op, req);
  return zs__nccl_end_job(c,
                          zs__nccl_fn.ReduceScatter(send, recv, count, t, zs__nccl_op(op),
                                                    n->comm, n->stream),
                          "reduce-scatter",
                          count * zs_dtype_size(dtype) * (size_t)c->world, NULL, req);
}

static zs_status zs__nccl_all_reduce(zs__comm* c, const void* send, void* recv,
                                     size_t count, zs_dtype dtype,
                                     zs__red_op op, zs__stream* stream,
                                     zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(recv))
    ZS__NCCL_HOST(n->host->ops->all_reduce(n->host, send, recv, count, dtype,
                                           op, stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "all-reduce", &t);
  if (st != ZS_OK) return st;
  if (n->local)
    return zs__local_copy(c, recv, send == ZS__IN_PLACE ? recv : send,
                          count * zs_dtype_size(dtype), "all-reduce", req);
  if (n->stage != NULL)
    return zs__staged_all_reduce(c, send, recv, count, dtype, op, req);
  return zs__nccl_end_job(c,
                          zs__nccl_fn.AllReduce(send == ZS__IN_PLACE ? recv : send, recv,
                                                count, t, zs__nccl_op(op), n->comm,
                                                n->stream),
                          "all-reduce", count * zs_dtype_size(dtype), NULL, req);
}

static zs_status zs__nccl_broadcast(zs__comm* c, void* buf, size_t count,
                                    zs_dtype dtype, int root,
                                    zs__stream* stream, zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(buf))
    ZS__NCCL_HOST(n->host->ops->broadcast(n->host, buf, count, dtype, root,
                                          stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "broadcast", &t);
  if (st != ZS_OK) return st;
  if (n->local) return zs__local_copy(c, buf, buf, 0, "broadcast", req);
  if (n->stage != NULL)
    return zs__staged_broadcast(c, buf, count, dtype, root, req);
  return zs__nccl_end_job(c,
                          zs__nccl_fn.Broadcast(buf, buf, count, t, root, n->comm,
                                                n->stream),
                          "broadcast", count * zs_dtype_size(dtype), NULL, req);
}

/* This rank's own block of an exchange or gather: a device copy on the
 * communication stream, after the NCCL calls. */
static zs_status zs__nccl_own_copy(zs__nccl_impl* n, void* dst, const void* src,
                                   size_t bytes, const char* what) {
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, n->stream) ==
      cudaSuccess)
    return ZS_OK;
  return zs__error(ZS_ERR_DEVICE, "NCCL %s: local copy: %s", what,
                   cudaGetErrorString(cudaGetLastError()));
}

static zs_status zs__nccl_exchange(zs__comm* c, const void* send,
                                   const size_t* offsets, void* recv,
                                   size_t chunk, zs_dtype dtype,
                                   zs__stream* stream, zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(recv))
    ZS__NCCL_HOST(n->host->ops->exchange(n->host, send, offsets, recv, chunk,
                                         dtype, stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "exchange", &t);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  const char* s = (const char*)send;
  char* d = (char*)recv;
  if (n->local)
    return zs__local_copy(c, d, s + offsets[0] * elem, chunk * elem,
                          "exchange", req);
  if (n->stage != NULL)
    return zs__staged_exchange(c, send, offsets, recv, chunk, dtype, req);
  ncclResult_t r = zs__nccl_fn.GroupStart();
  for (int p = 0; p < c->world && r == ncclSuccess; p++) {
    if (p == c->rank) continue;
    r = zs__nccl_fn.Send(s + offsets[p] * elem, chunk, t, p, n->comm, n->stream);
    if (r == ncclSuccess)
      r = zs__nccl_fn.Recv(d + (size_t)p * chunk * elem, chunk, t, p, n->comm,
                   n->stream);
  }
  ncclResult_t r2 = zs__nccl_fn.GroupEnd();
  if (r == ncclSuccess) r = r2;
  if (r == ncclSuccess) {
    st = zs__nccl_own_copy(n, d + (size_t)c->rank * chunk * elem,
                           s + offsets[c->rank] * elem, chunk * elem, "exchange");
    if (st != ZS_OK) return st;
  }
  return zs__nccl_end_job(c, r, "exchange", chunk * elem * (size_t)c->world,
                          NULL, req);
}

static zs_status zs__nccl_gather_users(zs__comm* c, const void* send,
                                       void* recv, size_t count,
                                       zs_dtype dtype, uint64_t users,
                                       zs__stream* stream,
                                       zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(send))
    ZS__NCCL_HOST(n->host->ops->gather_users(n->host, send, recv, count, dtype,
                                             users, stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "gather", &t);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  const int user = (int)(users >> c->rank & 1);
  char* d = (char*)recv;
  if (n->local)
    return zs__local_copy(c, user ? d : NULL, send, user ? count * elem : 0,
                          "gather", req);
  if (n->stage != NULL)
    return zs__staged_gather_users(c, send, recv, count, dtype, users, req);
  ncclResult_t r = zs__nccl_fn.GroupStart();
  for (int p = 0; p < c->world && r == ncclSuccess; p++) {
    if (p == c->rank) continue;
    if (users >> p & 1)
      r = zs__nccl_fn.Send(send, count, t, p, n->comm, n->stream);
    if (r == ncclSuccess && user)
      r = zs__nccl_fn.Recv(d + (size_t)p * count * elem, count, t, p, n->comm,
                           n->stream);
  }
  ncclResult_t r2 = zs__nccl_fn.GroupEnd();
  if (r == ncclSuccess) r = r2;
  if (r == ncclSuccess && user && count > 0) {
    st = zs__nccl_own_copy(n, d + (size_t)c->rank * count * elem, send,
                           count * elem, "gather");
    if (st != ZS_OK) return st;
  }
  return zs__nccl_end_job(c, r, "gather", count * elem * (size_t)c->world,
                          NULL, req);
}

static zs_status zs__nccl_all_gather_strided(zs__comm* c, void* buf,
                                             size_t offset, size_t stride,
                                             size_t chunk, zs_dtype dtype,
                                             zs__stream* stream,
                                             zs__comm_req** req) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (zs__is_host(buf))
    ZS__NCCL_HOST(n->host->ops->all_gather_strided(
        n->host, buf, offset, stride, chunk, dtype, stream, req ? &q_ : NULL));
  ncclDataType_t t;
  zs_status st = zs__nccl_begin(c, dtype, "strided all-gather", &t);
  if (st != ZS_OK) return st;
  if (n->local) return zs__local_copy(c, buf, buf, 0, "strided all-gather", req);
  if (n->stage != NULL)
    return zs__staged_all_gather_strided(c, buf, offset, stride, chunk, dtype,
                                         req);
  const size_t elem = zs_dtype_size(dtype);
  ncclResult_t r = zs__nccl_fn.GroupStart();
  for (int p = 0; p < c->world && r == ncclSuccess; p++) {
    char* at = (char*)buf + ((size_t)p * stride + offset) * elem;
    r = zs__nccl_fn.Broadcast(at, at, chunk, t, p, n->comm, n->stream);
  }
  ncclResult_t r2 = zs__nccl_fn.GroupEnd();
  return zs__nccl_end_job(c, r == ncclSuccess ? r2 : r, "strided all-gather",
                          chunk * elem * (size_t)c->world, NULL, req);
}

/* After a timeout or another rank's failure: NCCL kernels waiting for a
 * peer that will not come would keep the communication stream busy for
 * ever (and the stream synchronize at destroy with it); ncclCommAbort ends
 * them (NCCL's documented way out). Staged: the host functions in flight
 * see the flag and return. Once; from any thread (the watchdog's too). */
static void zs__nccl_abort_impl(zs__nccl_impl* n) {
  if (n->local || atomic_exchange(&n->aborted, 1)) return;
  if (n->stage == NULL && n->comm != NULL) zs__nccl_fn.CommAbort(n->comm);
}

static void zs__nccl_abort(zs__comm* c) { zs__nccl_abort_impl(zs__nimpl(c)); }

/* A completed (or given up) device request: off the watchdog's list, its
 * event and, when nothing queued can touch them any more (keep 0), its
 * staging blocks. */
static void zs__nccl_req_free(zs__nccl_impl* n, zs__comm_req* req, int keep) {
  zs__wd_remove(n, req);
  if (keep) return; /* (the event too: a host function may still run) */
  cudaEventDestroy(req->done);
  zs__stage_job_free(n, req->job);
  free(req);
}

static zs_status zs__nccl_test(zs__comm* c, zs__comm_req* req, int* done) {
  zs__nccl_impl* n = zs__nimpl(c);
  *done = 0;
  if (req->host_req != NULL) {
    zs_status st = n->host->ops->test(n->host, req->host_req, done);
    if (st == ZS_OK && *done) free(req);
    return st;
  }
  /* Aborted (a timeout, another rank's failure, the watchdog: then its
   * reason, set before the abort): a collective's event completes, but
   * its data never came. */
  if (!n->local && atomic_load(&n->aborted)) {
    zs__nccl_req_free(n, req, 1);
    if (atomic_load(&n->wd_fired))
      return zs__error(n->wd_status, "%s", n->wd_why);
    return zs__error(ZS_ERR_COMM, "%s collective: the communicator was "
                     "aborted before it completed",
                     n->stage != NULL ? "staged" : "NCCL");
  }
  cudaError_t e = cudaEventQuery(req->done);
  if (e == cudaSuccess) {
    zs__stage_job* j = req->job;
    if (j != NULL && atomic_load(&j->state) != 2) {
      char why[sizeof j->why];
      snprintf(why, sizeof why, "%s", j->why);
      zs__nccl_abort_impl(n);
      zs__nccl_req_free(n, req, 1);
      return zs__error(ZS_ERR_COMM, "staged collective: %s (the communicator "
                       "was aborted)", why);
    }
    zs__nccl_req_free(n, req, 0);
    *done = 1;
    return ZS_OK;
  }
  /* The runtime keeps even cudaErrorNotReady as the thread's last error:
   * cleared, or the next launch's cudaGetLastError (ours, or the model
   * code's) would report "device not ready" (PyTorch clears it the same
   * way after its event queries). */
  (void)cudaGetLastError();
  /* On an error the caller frees the collective's buffers: the
   * communicator is aborted first, so no NCCL kernel still writes them. */
  if (e != cudaErrorNotReady) {
    zs__nccl_abort(c);
    zs__nccl_req_free(n, req, 1);
    return zs__error(ZS_ERR_DEVICE, "NCCL collective: CUDA error %s (the "
                     "failing operation may be an earlier asynchronous one "
                     "on this device)", cudaGetErrorString(e));
  }
  if (n->local || n->stage != NULL) return ZS_OK;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = zs__nccl_fn.CommGetAsyncError(n->comm, &async);
  if (r != ncclSuccess) {
    zs__nccl_abort(c);
    zs__nccl_req_free(n, req, 1);
    return zs__nccl_fail(r, "ncclCommGetAsyncError (the communicator was "
                         "aborted)");
  }
  if (async != ncclSuccess && async != ncclInProgress) {
    zs__nccl_abort(c);
    zs__nccl_req_free(n, req, 1);
    return zs__nccl_fail(async, "collective (asynchronous error; the "
                         "communicator was aborted)");
  }
  return ZS_OK;
}

/* Makes the legacy default stream, and with it every blocking stream's
 * later work (the compute stream, the user's kernels), wait on the device
 * for req's completion: the consumer of a collective's output is queued
 * at once, without a host wait (comm.h's chain). The request stays in
 * flight (its test completes it later). Host requests: UNSUPPORTED. */
static zs_status zs__nccl_chain(zs__comm* c, zs__comm_req* req) {
  if (req->host_req != NULL)
    return zs__error(ZS_ERR_UNSUPPORTED, "a host collective has no event");
  cudaError_t e = cudaStreamWaitEvent(cudaStreamLegacy, req->done, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return zs__error(ZS_ERR_DEVICE, "chaining a collective on the device: "
                     "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
  }
  zs__nccl_impl* n = zs__nimpl(c);
  pthread_mutex_lock(&n->wd_mu); /* (the watchdog reads it) */
  req->t_chain = zs__mono();
  pthread_mutex_unlock(&n->wd_mu);
  return ZS_OK;
}

/* The fixed-order reduce-scatter's sum on the communication stream, right
 * after its exchange (comm.h's chain_sum): the device backend's sum_chunks
 * (a CUDA zs__stream is its cudaStream_t), then req's event again, after
 * it. Device memory only. */
static zs_status zs__nccl_chain_sum(zs__comm* c, zs__comm_req* req, void* dst,
                                    const void* tmp, int nchunks, size_t chunk,
                                    float divisor, zs_dtype dtype) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (req->host_req != NULL || c->dev == NULL || c->dev->kind != ZS_DEVICE_CUDA)
    return zs__error(ZS_ERR_UNSUPPORTED, "chain_sum: not on the device");
  zs_status st = c->dev->ops->sum_chunks(c->dev, dst, tmp, nchunks, chunk,
                                         divisor, dtype,
                                         (zs__stream*)n->stream);
  if (st != ZS_OK) return st;
  cudaError_t e = cudaEventRecord(req->done, n->stream);
  if (e == cudaSuccess) return ZS_OK;
  (void)cudaGetLastError();
  return zs__error(ZS_ERR_DEVICE, "chain_sum: event: %s", cudaGetErrorString(e));
}

/* The watchdog (PyTorch's NCCL watchdog's role): a thread that, every 20
 * ms, queries the event of every device request in flight (as PyTorch's
 * does: cheap on a GPU; on the CPU stand-in, whose streams run only when
 * something waits, this is what moves a rank's collectives on while its
 * host is busy elsewhere, as a GPU would). A request the device's later
 * work waits for (zs__nccl_chain: no host waits for it, so no wait's
 * timeout or heartbeat check applies) that has not completed
 * collective_timeout_s after it was chained, or any such request once the
 * heartbeats lost a rank (zs__nccl_lost), and for NCCL an asynchronous
 * error, make it abort the communicator (ncclCommAbort; staged: the host
 * functions give up), so no kernel, copy or host function waits for ever
 * and a host blocked on the device behind it returns; the next test of
 * any request then fails with the reason (TIMEOUT, REMOTE or COMM), and
 * comm.c fails the context. Requests a host waits for are left to that
 * wait (its timeout counts from the wait, not the issue). */
static void* zs__nccl_watchdog(void* arg) {
  zs__comm* c = (zs__comm*)arg;
  zs__nccl_impl* n = zs__nimpl(c);
  if (cudaSetDevice(n->device) != cudaSuccess) (void)cudaGetLastError();
  pthread_mutex_lock(&n->wd_mu);
  while (!n->wd_stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&n->wd_cv, &n->wd_mu, &until);
    if (n->wd_stop || atomic_load(&n->aborted) || n->wd_head == NULL) continue;
    double limit;
    __atomic_load(&c->timeout_s, &limit, __ATOMIC_RELAXED);
    const double now = zs__mono();
    char why[sizeof n->wd_why];
    why[0] = '\0';
    zs_status status = ZS_ERR_TIMEOUT;
    for (zs__comm_req* q = n->wd_head; q != NULL && why[0] == '\0';
         q = q->wd_next) {
      const cudaError_t e = cudaEventQuery(q->done);
      (void)cudaGetLastError();
      if (e != cudaErrorNotReady || q->t_chain == 0) continue;
      if (n->lost_rank >= 0) {
        status = ZS_ERR_REMOTE;
        snprintf(why, sizeof why,
                 "the %s %s of %zu bytes that the device waits for cannot "
                 "complete: rank %d %s; the communicator's watchdog aborted "
                 "the communicator",
                 n->stage != NULL ? "staged" : "NCCL", q->what, q->bytes,
                 n->lost_rank, n->lost_why);
      } else if (limit > 0 && now - q->t_chain > limit) {
        snprintf(why, sizeof why,
                 "the %s %s of %zu bytes that the device waits for did not "
                 "complete within collective_timeout_s (%g s) of the wait "
                 "(issued %.1f s ago): another rank is probably waiting in a "
                 "different collective, or died; the communicator's "
                 "watchdog aborted the communicator",
                 n->stage != NULL ? "staged" : "NCCL", q->what, q->bytes,
                 limit, now - q->t_issue);
      }
    }
    if (why[0] == '\0' && n->stage == NULL && n->comm != NULL) {
      ncclResult_t async = ncclSuccess;
      if (zs__nccl_fn.CommGetAsyncError(n->comm, &async) == ncclSuccess &&
          async != ncclSuccess && async != ncclInProgress) {
        status = ZS_ERR_COMM;
        snprintf(why, sizeof why, "NCCL reported an asynchronous error: %s "
                 "(%d); the communicator's watchdog aborted it",
                 zs__nccl_fn.GetErrorString(async), (int)async);
      }
    }
    if (why[0] != '\0') {
      memcpy(n->wd_why, why, sizeof why);
      n->wd_status = status;
      atomic_store(&n->wd_fired, 1); /* (before aborted: zs__nccl_test) */
      pthread_mutex_unlock(&n->wd_mu);
      zs__nccl_abort_impl(n);
      pthread_mutex_lock(&n->wd_mu);
    }
  }
  pthread_mutex_unlock(&n->wd_mu);
  return NULL;
}

/* The heartbeats lost a rank (zs__hb_on_lost; the heartbeat thread or a
 * wait's): the watchdog's next look fails what the device waits for. */
static void zs__nccl_lost(void* arg, int rank, const char* why) {
  zs__nccl_impl* n = (zs__nccl_impl*)arg;
  pthread_mutex_lock(&n->wd_mu);
  if (n->lost_rank < 0) {
    n->lost_rank = rank;
    snprintf(n->lost_why, sizeof n->lost_why, "%s", why);
    pthread_cond_signal(&n->wd_cv);
  }
  pthread_mutex_unlock(&n->wd_mu);
}

static void zs__nccl_watchdog_stop(zs__nccl_impl* n) {
  if (!n->wd_running) return;
  pthread_mutex_lock(&n->wd_mu);
  n->wd_stop = 1;
  pthread_cond_signal(&n->wd_cv);
  pthread_mutex_unlock(&n->wd_mu);
  pthread_join(n->wd, NULL);
  n->wd_running = 0;
}

/* (no timeout here: comm.c's waits have it, and the watchdog aborts a
 * collective past it, which ends this loop too) */
static zs_status zs__nccl_wait(zs__comm* c, zs__comm_req* req) {
  for (;;) {
    int done = 0;
    zs_status st = zs__nccl_test(c, req, &done);
    if (st != ZS_OK || done) return st;
    sched_yield();
  }
}

/* Notices and control collectives go through the MPI communicator of the
 * same ranks. */
static void zs__nccl_notify(zs__comm* c, const char* msg) {
  zs__comm* h = zs__nimpl(c)->host;
  if (h->ops->notify != NULL) h->ops->notify(h, msg);
}

static int zs__nccl_poll_notice(zs__comm* c, int* rank, char* msg,
                                size_t cap) {
  zs__comm* h = zs__nimpl(c)->host;
  return h->ops->poll_notice != NULL && h->ops->poll_notice(h, rank, msg, cap);
}

/* Host memory goes to MPI's two lanes, device memory to NCCL's one. */
static int zs__nccl_lane(zs__comm* c, zs__call call, const void* buf) {
  zs__comm* h = zs__nimpl(c)->host;
  if (!zs__is_host(buf)) return 2;
  return h->ops->lane != NULL ? h->ops->lane(h, call, buf) : 0;
}

static zs_status zs__nccl_ctrl_all_reduce(zs__comm* c, void* buf,
                                          size_t count, zs_dtype dtype,
                                          zs__red_op op, zs__comm_req** req) {
  zs__comm* h = zs__nimpl(c)->host;
  if (h->ops->ctrl_all_reduce == NULL)
    return zs__error(ZS_ERR_INTERNAL, "NCCL: no control communicator");
  ZS__NCCL_HOST(h->ops->ctrl_all_reduce(h, buf, count, dtype, op, &q_));
}

static zs_status zs__nccl_ctrl_broadcast(zs__comm* c, void* buf, size_t count,
                                         zs_dtype dtype, int root,
                                         zs__comm_req** req) {
  zs__comm* h = zs__nimpl(c)->host;
  if (h->ops->ctrl_broadcast == NULL)
    return zs__error(ZS_ERR_INTERNAL, "NCCL: no control communicator");
  ZS__NCCL_HOST(h->ops->ctrl_broadcast(h, buf, count, dtype, root, &q_));
}

static void zs__nccl_destroy(zs__comm* c) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (n != NULL) {
    zs__nccl_watchdog_stop(n);
    /* a failed communicator's collectives in flight are given up first */
    if (c->failed) zs__nccl_abort_impl(n);
    zs__tl_write(c);
    if (n->stage != NULL) {
      /* host functions return at once when aborted: none may run after */
      if (n->stream != NULL) cudaStreamSynchronize(n->stream);
    } else if (n->comm != NULL && !atomic_load(&n->aborted)) {
      cudaStreamSynchronize(n->stream);
      zs__nccl_fn.CommDestroy(n->comm);
    }
    if (n->stream != NULL) cudaStreamDestroy(n->stream);
    if (n->order != NULL) cudaEventDestroy(n->order);
    if (n->stage != NULL) {
      n->stage->failed |= c->failed | atomic_load(&n->aborted);
      n->stage->ops->destroy(n->stage);
    }
    /* (after the stream's synchronize nothing queued references a cached
     * block: the blocks of collectives given up are their jobs', kept) */
    zs__stage_cache_free(n);
    if (n->host != NULL) {
      n->host->failed |= c->failed; /* its MPI communicator is kept then */
      n->host->ops->destroy(n->host);
    }
    pthread_mutex_destroy(&n->wd_mu);
    pthread_cond_destroy(&n->wd_cv);
    free(n);
  }
  free(c);
}

/* NCCL needs its MPI communicator for host collectives and notices. */
static int zs__nccl_alive(const zs__comm* c) {
  const zs__comm* h = ((const zs__nccl_impl*)c->impl)->host;
  return h == NULL || h->ops->alive == NULL || h->ops->alive(h);
}

#define ZS__NCCL_OPS(name)                                   \
  {                                                          \
    name, zs__nccl_all_gather, zs__nccl_reduce_scatter,      \
        zs__nccl_all_reduce, zs__nccl_broadcast,             \
        zs__nccl_exchange, zs__nccl_all_gather_strided,      \
        zs__nccl_wait, zs__nccl_test,                        \
        NULL, /* NCCL (staged: the host functions) progresses on its own */ \
        zs__nccl_destroy, zs__nccl_notify, zs__nccl_poll_notice, \
        zs__nccl_abort, zs__nccl_alive, zs__nccl_lane,       \
        zs__nccl_ctrl_all_reduce, zs__nccl_ctrl_broadcast,   \
        zs__nccl_gather_users,                               \
        NULL, /* reduce-scatter: an exchange and a sum */    \
        NULL, /* waits yield */                              \
        zs__nccl_chain, zs__nccl_mark, zs__nccl_chain_sum,   \
  }

static const zs__comm_ops zs__nccl_ops = ZS__NCCL_OPS("nccl");
static const zs__comm_ops zs__staged_ops = ZS__NCCL_OPS("staged");

/* One GPU per rank, as NCCL requires: every rank's machine (the kernel's
 * boot id, which containers on one machine share and two machines never
 * do; the host name where it cannot be read) and its GPU's PCI bus id,
 * gathered; two ranks on one GPU fail every rank, naming both (more ranks
 * on a node than it has GPUs lands here too). Collective. */
static zs_status zs__nccl_check_gpus(zs__comm* host, int device, int count) {
  enum { REC = 128 };
  char* all = (char*)calloc((size_t)host->world + 1, REC);
  if (all == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NCCL: GPU check");
  char* mine = all + (size_t)host->world * REC;
  char name[64] = "", bus[32] = "?";
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == NULL || fgets(name, sizeof name, f) == NULL) name[0] = '\0';
  if (f != NULL) fclose(f);
  name[strcspn(name, "\n")] = '\0';
  if (name[0] == '\0') gethostname(name, sizeof name - 1);
  if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device) != cudaSuccess)
    (void)cudaGetLastError();
  snprintf(mine, REC, "%s %s", name, bus);
  zs_status st = zs__comm_all_gather(host, zs__tag(ZS__P_CHECK, -1, "gpus"),
                                     mine, all, REC, ZS_UINT8);
  for (int a = 0; st == ZS_OK && a < host->world; a++)
    for (int b = a + 1; b < host->world; b++)
      if (strncmp(all + (size_t)a * REC, all + (size_t)b * REC, REC) == 0) {
        st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "ranks %d and %d share one GPU (machine and PCI bus "
                       "id '%.100s'; this node shows rank %d %d CUDA "
                       "device(s) for %d ranks): NCCL needs one GPU per "
                       "rank; start at most one rank per GPU on each node",
                       a, b, all + (size_t)a * REC, host->rank, count,
                       host->local_size);
        break;
      }
  zs__comm_free(host, all);
  return st;
}

/* The device timeline's base (ZS_DEVICE_TIMELINE), at creation. */
static void zs__tl_start(zs__comm* c) {
  zs__nccl_impl* n = zs__nimpl(c);
  const char* tl = getenv("ZS_DEVICE_TIMELINE");
  if (tl == NULL || *tl == '\0' || n->local) return;
  if (cudaEventCreate(&n->tl_base) == cudaSuccess &&
      cudaEventRecord(n->tl_base, n->stream) == cudaSuccess &&
      cudaEventSynchronize(n->tl_base) == cudaSuccess &&
      (n->tl_path = strdup(tl)) != NULL) {
    zs__log(ZS_LOG_INFO, "rank %d: device timeline to %s.rank%d.jsonl",
            c->rank, tl, c->rank);
    return;
  }
  (void)cudaGetLastError();
  zs__log(ZS_LOG_WARN, "rank %d: ZS_DEVICE_TIMELINE: no timeline (CUDA "
          "events)", c->rank);
}

/* The watchdog of a communicator of several ranks, started with its first
 * device collective (after the context set its timeout; a warning when no
 * thread can be made), and its listener to the heartbeats once they run
 * (the main thread: the heartbeats start after the communicator). */
static void zs__nccl_watchdog_start(zs__comm* c) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (n->local) return;
  if (!n->hb_listening && c->hb != NULL) {
    zs__hb_on_lost(c->hb, zs__nccl_lost, n);
    n->hb_listening = 1;
  }
  if (n->wd_tried) return;
  n->wd_tried = 1;
  if (pthread_create(&n->wd, NULL, zs__nccl_watchdog, c) == 0) {
    n->wd_running = 1;
    return;
  }
  zs__log(ZS_LOG_WARN, "rank %d: no watchdog thread for the %s communicator: "
          "a collective that never completes is found only by a wait's "
          "timeout", c->rank, c->ops->name);
}

/* NCCL (stage NULL) or staged (docs/cuda.md, "Several ranks on one GPU")
 * over `host`'s ranks; takes host and stage, also on failure. */
static zs_status zs__nccl_create(zs__comm* host, zs__comm* stage,
                                 zs__comm** out) {
  zs__comm* c = (zs__comm*)calloc(1, sizeof *c);
  zs__nccl_impl* n = (zs__nccl_impl*)calloc(1, sizeof *n);
  if (c == NULL || n == NULL) {
    free(c);
    free(n);
    host->ops->destroy(host);
    if (stage != NULL) stage->ops->destroy(stage);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "NCCL communicator");
  }
  *c = *host; /* rank, world, local rank and size, counters' initial state */
  c->pending_head = c->pending_tail = NULL; /* (the host's: none in flight) */
  c->ops = stage != NULL ? &zs__staged_ops : &zs__nccl_ops;
  c->impl = n;
  n->host = host;
  n->stage = stage;
  n->lost_rank = -1;
  pthread_mutex_init(&n->wd_mu, NULL);
  pthread_cond_init(&n->wd_cv, NULL);
  zs_status local = ZS_OK;
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  n->device = zs__cuda_device_index(host->local_rank, host->local_size, count);
  if (ce != cudaSuccess || count == 0) {
    cudaGetLastError();
    local = zs__error(ZS_ERR_UNSUPPORTED, "device CUDA: no usable CUDA device "
                      "on this node (rank %d; cudaGetDeviceCount: %s)",
                      host->rank,
                      ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
  } else if (cudaSetDevice(n->device) != cudaSuccess ||
             cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) !=
                 cudaSuccess) {
    local = zs__error(ZS_ERR_DEVICE, "NCCL: cannot use GPU %d (rank %d): %s",
                      n->device, host->rank,
                      cudaGetErrorString(cudaGetLastError()));
  }
  /* One rank: no NCCL at all (unless ZS_NCCL_ONE_RANK=1 asks for it, to
   * check the NCCL path on a one-GPU machine). Staged: no NCCL, and ranks
   * may share a GPU. Otherwise NCCL must load on every rank. */
  const char* one = getenv("ZS_NCCL_ONE_RANK");
  n->local = stage == NULL && host->world == 1 &&
             !(one != NULL && strcmp(one, "1") == 0);
  if (local == ZS_OK && !n->local && stage == NULL) {
    pthread_once(&zs__nccl_once, zs__nccl_load);
    if (zs__nccl_fn.Send == NULL)
      local = zs__error(ZS_ERR_UNSUPPORTED, "NCCL is needed for %d rank%s on "
                        "CUDA%s but cannot be loaded (%s) on rank %d",
                        host->world, host->world == 1 ? "" : "s",
                        host->world == 1 ? " (ZS_NCCL_ONE_RANK=1)" : "",
                        zs__nccl_why, host->rank);
  }
  zs_status st = zs__comm_agree(host, local, stage != NULL
                                                 ? "staged device communicator setup"
                                                 : "NCCL setup");
  if (st == ZS_OK && !n->local && stage == NULL)
    st = zs__nccl_check_gpus(host, n->device, count);
  if (st == ZS_OK && (n->local || stage != NULL)) {
    c->seq_hash = host->seq_hash;
    zs__tl_start(c);
    *out = c;
    return ZS_OK;
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (st == ZS_OK && host->rank == 0) {
    ncclResult_t r = zs__nccl_fn.GetUniqueId(&id);
    local = r == ncclSuccess ? ZS_OK : zs__nccl_fail(r, "ncclGetUniqueId");
  }
  if (st == ZS_OK) st = zs__comm_agree(host, local, "NCCL unique id");
  if (st == ZS_OK)
    st = zs__comm_broadcast(host, zs__tag(ZS__P_CHECK, -1, "nccl id"), &id,
                            sizeof id, ZS_UINT8, 0);
  if (st == ZS_OK) {
    ncclResult_t r = zs__nccl_fn.CommInitRank(&n->comm, host->world, id, host->rank);
    local = r == ncclSuccess ? ZS_OK : zs__nccl_fail(r, "ncclCommInitRank");
    st = zs__comm_agree(host, local, "NCCL communicator");
  }
  if (st != ZS_OK) {
    zs__nccl_destroy(c);
    return st;
  }
  c->seq_hash = host->seq_hash;
  zs__tl_start(c);
  *out = c;
  return ZS_OK;
}

zs_status zs__comm_nccl_create(zs__comm* host, zs__comm** out) {
  return zs__nccl_create(host, NULL, out);
}

zs_status zs__comm_staged_create(zs__comm* host, zs__comm* stage,
                                 zs__comm** out) {
  return zs__nccl_create(host, stage, out);
}
