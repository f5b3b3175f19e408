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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

typedef struct zs__nccl_impl {
  ncclComm_t comm;
  cudaStream_t stream;
  zs__comm* host; /* MPI over the same ranks, for host buffers (owned) */
  int device;
  int local;      /* one rank: collectives are device copies, no NCCL */
  cudaEvent_t order; /* reused: the legacy stream's point each call waits
                        for (cudaStreamWaitEvent takes the event's state at
                        the call, so one event serves every call) */
} zs__nccl_impl;

struct zs__comm_req {
  zs__comm_req* host_req; /* a host collective's MPI request, or NULL */
  cudaEvent_t done;       /* after the NCCL call */
};

static zs__nccl_impl* zs__nimpl(zs__comm* c) { return (zs__nccl_impl*)c->impl; }

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
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* reported here */
    return zs__error(ZS_ERR_DEVICE, "NCCL %s: ordering event: %s (the "
                     "failing operation may be an earlier asynchronous one "
                     "on this device)", what, cudaGetErrorString(e));
  }
  return ZS_OK;
}

/* Records the request's event after the NCCL call(s); blocking when req is
 * NULL. */
static zs_status zs__nccl_end(zs__comm* c, ncclResult_t r, const char* what,
                              zs__comm_req** req) {
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
  return zs__nccl_end(c, ncclSuccess, what, req);
}

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
  return zs__nccl_end(c, zs__nccl_fn.AllGather(s, recv, count, t, n->comm, n->stream),
                      "all-gather", req);
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
  return zs__nccl_end(c,
                      zs__nccl_fn.ReduceScatter(send, recv, count, t, zs__nccl_op(op),
                                        n->comm, n->stream),
                      "reduce-scatter", req);
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
  return zs__nccl_end(c,
                      zs__nccl_fn.AllReduce(send == ZS__IN_PLACE ? recv : send, recv,
                                    count, t, zs__nccl_op(op), n->comm,
                                    n->stream),
                      "all-reduce", req);
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
  return zs__nccl_end(c,
                      zs__nccl_fn.Broadcast(buf, buf, count, t, root, n->comm,
                                    n->stream),
                      "broadcast", req);
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
  return zs__nccl_end(c, r, "exchange", req);
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
  return zs__nccl_end(c, r, "gather", req);
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
  const size_t elem = zs_dtype_size(dtype);
  ncclResult_t r = zs__nccl_fn.GroupStart();
  for (int p = 0; p < c->world && r == ncclSuccess; p++) {
    char* at = (char*)buf + ((size_t)p * stride + offset) * elem;
    r = zs__nccl_fn.Broadcast(at, at, chunk, t, p, n->comm, n->stream);
  }
  ncclResult_t r2 = zs__nccl_fn.GroupEnd();
  return zs__nccl_end(c, r == ncclSuccess ? r2 : r, "strided all-gather", req);
}

/* After a timeout or another rank's failure: NCCL kernels waiting for a
 * peer that will not come would keep the communication stream busy for
 * ever (and the stream synchronize at destroy with it); ncclCommAbort ends
 * them (NCCL's documented way out). */
static void zs__nccl_abort(zs__comm* c) {
  zs__nccl_impl* n = zs__nimpl(c);
  if (n->local || n->comm == NULL) return;
  zs__nccl_fn.CommAbort(n->comm);
  n->comm = NULL;
}

static zs_status zs__nccl_test(zs__comm* c, zs__comm_req* req, int* done) {
  zs__nccl_impl* n = zs__nimpl(c);
  *done = 0;
  if (req->host_req != NULL) {
    zs_status st = n->host->ops->test(n->host, req->host_req, done);
    if (st == ZS_OK && *done) free(req);
    return st;
  }
  /* Aborted (a timeout, another rank's failure): a collective's event
   * completes, but its data never came. */
  if (!n->local && n->comm == NULL)
    return zs__error(ZS_ERR_COMM, "NCCL collective: the communicator was "
                     "aborted before it completed");
  cudaError_t e = cudaEventQuery(req->done);
  if (e == cudaSuccess) {
    cudaEventDestroy(req->done);
    free(req);
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
    return zs__error(ZS_ERR_DEVICE, "NCCL collective: CUDA error %s (the "
                     "failing operation may be an earlier asynchronous one "
                     "on this device)", cudaGetErrorString(e));
  }
  if (n->local) return ZS_OK;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = zs__nccl_fn.CommGetAsyncError(n->comm, &async);
  if (r != ncclSuccess) {
    zs__nccl_abort(c);
    return zs__nccl_fail(r, "ncclCommGetAsyncError (the communicator was "
                         "aborted)");
  }
  if (async != ncclSuccess && async != ncclInProgress) {
    zs__nccl_abort(c);
    return zs__nccl_fail(async, "collective (asynchronous error; the "
                         "communicator was aborted)");
  }
  return ZS_OK;
}

static zs_status zs__nccl_wait(zs__comm* c, zs__comm_req* req) {
  for (;;) {
    int done = 0;
    zs_status st = zs__nccl_test(c, req, &done);
    if (st != ZS_OK || done) return st;
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
    if (n->comm != NULL) {
      cudaStreamSynchronize(n->stream);
      zs__nccl_fn.CommDestroy(n->comm);
    }
    cudaStreamDestroy(n->stream);
    if (n->order != NULL) cudaEventDestroy(n->order);
    if (n->host != NULL) {
      n->host->failed |= c->failed; /* its MPI communicator is kept then */
      n->host->ops->destroy(n->host);
    }
    free(n);
  }
  free(c);
}

/* NCCL needs its MPI communicator for host collectives and notices. */
static int zs__nccl_alive(const zs__comm* c) {
  const zs__comm* h = ((const zs__nccl_impl*)c->impl)->host;
  return h == NULL || h->ops->alive == NULL || h->ops->alive(h);
}

static const zs__comm_ops zs__nccl_ops = {
    "nccl",
    zs__nccl_all_gather,
    zs__nccl_reduce_scatter,
    zs__nccl_all_reduce,
    zs__nccl_broadcast,
    zs__nccl_exchange,
    zs__nccl_all_gather_strided,
    zs__nccl_wait,
    zs__nccl_test,
    NULL, /* NCCL progresses on its own */
    zs__nccl_destroy,
    zs__nccl_notify,
    zs__nccl_poll_notice,
    zs__nccl_abort,
    zs__nccl_alive,
    zs__nccl_lane,
    zs__nccl_ctrl_all_reduce,
    zs__nccl_ctrl_broadcast,
    zs__nccl_gather_users,
    NULL, /* reduce-scatter: an exchange and a sum */
    NULL, /* waits yield */
};

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

zs_status zs__comm_nccl_create(zs__comm* host, zs__comm** out) {
  zs__comm* c = (zs__comm*)calloc(1, sizeof *c);
  zs__nccl_impl* n = (zs__nccl_impl*)calloc(1, sizeof *n);
  if (c == NULL || n == NULL) {
    free(c);
    free(n);
    host->ops->destroy(host);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "NCCL communicator");
  }
  *c = *host; /* rank, world, local rank and size, counters' initial state */
  c->pending_head = c->pending_tail = NULL; /* (the host's: none in flight) */
  c->ops = &zs__nccl_ops;
  c->impl = n;
  n->host = host;
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
   * check the NCCL path on a one-GPU machine). Otherwise NCCL must load on
   * every rank. */
  const char* one = getenv("ZS_NCCL_ONE_RANK");
  n->local = host->world == 1 && !(one != NULL && strcmp(one, "1") == 0);
  if (local == ZS_OK && !n->local) {
    pthread_once(&zs__nccl_once, zs__nccl_load);
    if (zs__nccl_fn.Send == NULL)
      local = zs__error(ZS_ERR_UNSUPPORTED, "NCCL is needed for %d rank%s on "
                        "CUDA%s but cannot be loaded (%s) on rank %d",
                        host->world, host->world == 1 ? "" : "s",
                        host->world == 1 ? " (ZS_NCCL_ONE_RANK=1)" : "",
                        zs__nccl_why, host->rank);
  }
  zs_status st = zs__comm_agree(host, local, "NCCL setup");
  if (st == ZS_OK && !n->local)
    st = zs__nccl_check_gpus(host, n->device, count);
  if (st == ZS_OK && n->local) {
    c->seq_hash = host->seq_hash;
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
  *out = c;
  return ZS_OK;
}
