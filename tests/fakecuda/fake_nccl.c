/*
 * fake_nccl.c — libfakenccl.so: the NCCL functions runtime/comm_nccl.c
 * loads (ZS_NCCL_LIBRARY names this file instead of libnccl.so.2),
 * implemented with MPI on the fake CUDA runtime's memory (fakecuda.h), so
 * the NCCL communicator's multi-rank code runs in CI without GPUs.
 *
 * A collective first waits for its stream (cudaStreamSynchronize), which
 * runs what the stream waits for (comm_nccl.c's event on the legacy
 * stream, and with it every earlier operation of the blocking streams:
 * if that ordering were missing, the inputs would be stale and the
 * results wrong), then runs at once on the host with blocking MPI; so it
 * is complete when the call returns (a real one may still run; the event
 * comm_nccl.c records after it is still waited for). Sums are in rank
 * order, in fp32, rounded once to the dtype. Grouped calls
 * (ncclGroupStart/End) may be Send, Recv and Broadcast, posted together
 * at ncclGroupEnd. A communicator must span MPI_COMM_WORLD (the unique id
 * cannot name an MPI communicator). Operands must be device or registered
 * host memory, as NCCL needs. Unresolved symbols (MPI, the fake runtime,
 * zs_convert) come from the test binary, linked with -rdynamic.
 */
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zeroshard.h>

#include "tests/fakecuda/fakecuda.h"

struct ncclComm {
  MPI_Comm mpi;
  int rank, nranks;
};

typedef struct {
  int kind; /* 0 send, 1 recv, 2 broadcast */
  const void* send;
  void* recv;
  size_t bytes;
  int peer; /* send/recv: the peer; broadcast: the root */
  ncclComm_t comm;
  cudaStream_t stream;
} fk_nop;

static __thread int fk_depth;
static __thread fk_nop* fk_ops;
static __thread size_t fk_nops, fk_cap;

static size_t fk_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

static ncclResult_t fk_bad(const char* what) {
  fprintf(stderr, "fake NCCL: %s\n", what);
  return ncclInvalidUsage;
}

/* The stream's earlier work (and what it waits for) done; the fake
 * device's view of an operand. */
static ncclResult_t fk_prepare(cudaStream_t s) {
  return cudaStreamSynchronize(s) == cudaSuccess ? ncclSuccess
                                                 : ncclUnhandledCudaError;
}

static void* fk_ptr(const void* p, size_t bytes, int* ok) {
  return fakecuda_kernel_ptr(p, bytes, "NCCL", ok);
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake NCCL)";
    case ncclSystemError: return "unhandled system error (fake NCCL)";
    case ncclInternalError: return "internal error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    case ncclInvalidUsage: return "invalid usage (fake NCCL)";
    default: return "unknown result (fake NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == NULL) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-nccl-%d", (int)getpid());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id,
                              int rank) {
  (void)id;
  int init = 0, world = 0;
  MPI_Initialized(&init);
  if (!init) return fk_bad("MPI is not initialized");
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world)
    return fk_bad("a communicator must span MPI_COMM_WORLD");
  if (out == NULL || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  struct ncclComm* c = (struct ncclComm*)calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS) {
    free(c);
    return ncclSystemError;
  }
  c->rank = rank;
  c->nranks = nranks;
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == NULL) return ncclInvalidArgument;
  MPI_Comm_free(&c->mpi);
  free(c);
  return ncclSuccess;
}

/* The other ranks may never come to a collective MPI_Comm_free: the MPI
 * communicator is left (a test process ends soon after). */
ncclResult_t ncclCommAbort(ncclComm_t c) {
  free(c);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* async) {
  if (c == NULL || async == NULL) return ncclInvalidArgument;
  *async = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                           ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  const size_t b = count * fk_size(t);
  if (fk_depth > 0) return fk_bad("ncclAllGather in a group");
  if (c == NULL || fk_size(t) == 0 || b > INT32_MAX) return ncclInvalidArgument;
  ncclResult_t r = fk_prepare(s);
  if (r != ncclSuccess) return r;
  int ok = 1;
  const int in_place = (const char*)send == (const char*)recv + b * (size_t)c->rank;
  const void* sv = in_place ? NULL : fk_ptr(send, b, &ok);
  void* rv = fk_ptr(recv, b * (size_t)c->nranks, &ok);
  if (!ok) return ncclInvalidArgument;
  return MPI_Allgather(in_place ? MPI_IN_PLACE : sv, (int)b, MPI_BYTE, rv,
                       (int)b, MPI_BYTE, c->mpi) == MPI_SUCCESS
             ? ncclSuccess : ncclSystemError;
}

/* out[i] = sum over ranks r of in[r][i], in rank order in fp32; in holds
 * nranks blocks of n elements of t. */
static ncclResult_t fk_sum(void* out, const char* in, int nranks, size_t n,
                           ncclDataType_t t) {
  zs_dtype d = t == ncclFloat32 ? ZS_FLOAT32 : t == ncclBfloat16 ? ZS_BFLOAT16
               : t == ncclFloat16 ? ZS_FLOAT16 : ZS_DTYPE_COUNT;
  if (d == ZS_DTYPE_COUNT) return fk_bad("sums of this dtype");
  float* acc = (float*)calloc(n > 0 ? n : 1, sizeof(float));
  float* x = (float*)calloc(n > 0 ? n : 1, sizeof(float));
  if (acc == NULL || x == NULL) {
    free(acc);
    free(x);
    return ncclSystemError;
  }
  for (int p = 0; p < nranks; p++) {
    zs_convert(x, ZS_FLOAT32, in + (size_t)p * n * fk_size(t), d, n);
    for (size_t i = 0; i < n; i++) acc[i] = p == 0 ? x[i] : acc[i] + x[i];
  }
  zs_convert(out, d, acc, ZS_FLOAT32, n);
  free(acc);
  free(x);
  return ncclSuccess;
}

static ncclResult_t fk_reduce(const void* send, void* recv, size_t count,
                              ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                              cudaStream_t s, int scatter) {
  const size_t e = fk_size(t);
  if (fk_depth > 0) return fk_bad("a reduction in a group");
  if (op != ncclSum) return fk_bad("reductions other than ncclSum");
  if (c == NULL || e == 0 || count * e * (size_t)c->nranks > INT32_MAX)
    return ncclInvalidArgument;
  ncclResult_t r = fk_prepare(s);
  if (r != ncclSuccess) return r;
  int ok = 1;
  const size_t in_bytes = count * e * (scatter ? (size_t)c->nranks : 1);
  const void* sv = fk_ptr(send, in_bytes, &ok);
  void* rv = fk_ptr(recv, count * e, &ok);
  if (!ok) return ncclInvalidArgument;
  char* all = (char*)malloc(count * e * (size_t)c->nranks + 1);
  if (all == NULL) return ncclSystemError;
  /* every rank's block for this rank (reduce-scatter), or every rank's
   * whole buffer (all-reduce) */
  const int rc = scatter
      ? MPI_Alltoall(sv, (int)(count * e), MPI_BYTE, all, (int)(count * e),
                     MPI_BYTE, c->mpi)
      : MPI_Allgather(sv, (int)(count * e), MPI_BYTE, all, (int)(count * e),
                      MPI_BYTE, c->mpi);
  r = rc == MPI_SUCCESS ? fk_sum(rv, all, c->nranks, count, t) : ncclSystemError;
  free(all);
  return r;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t s) {
  return fk_reduce(send, recv, count, t, op, c, s, 1);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                           ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
  return fk_reduce(send, recv, count, t, op, c, s, 0);
}

static ncclResult_t fk_group_add(int kind, const void* send, void* recv,
                                 size_t count, ncclDataType_t t, int peer,
                                 ncclComm_t c, cudaStream_t s) {
  if (c == NULL || fk_size(t) == 0 || count * fk_size(t) > INT32_MAX)
    return ncclInvalidArgument;
  if (fk_nops == fk_cap) {
    const size_t cap = fk_cap ? 2 * fk_cap : 16;
    fk_nop* p = (fk_nop*)realloc(fk_ops, cap * sizeof *p);
    if (p == NULL) return ncclSystemError;
    fk_ops = p;
    fk_cap = cap;
  }
  fk_nop o = {kind, send, recv, count * fk_size(t), peer, c, s};
  fk_ops[fk_nops++] = o;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  fk_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (fk_depth == 0) return fk_bad("ncclGroupEnd without ncclGroupStart");
  if (--fk_depth > 0) return ncclSuccess;
  ncclResult_t r = ncclSuccess;
  MPI_Request* reqs = (MPI_Request*)calloc(fk_nops + 1, sizeof *reqs);
  if (reqs == NULL) r = ncclSystemError;
  for (size_t i = 0; i < fk_nops && r == ncclSuccess; i++)
    r = fk_prepare(fk_ops[i].stream);
  size_t n = 0;
  for (size_t i = 0; i < fk_nops && r == ncclSuccess; i++) {
    fk_nop* o = &fk_ops[i];
    int ok = 1, rc = MPI_SUCCESS;
    if (o->kind == 0) {
      const void* sv = fk_ptr(o->send, o->bytes, &ok);
      if (ok) rc = MPI_Isend(sv, (int)o->bytes, MPI_BYTE, o->peer, 0,
                             o->comm->mpi, &reqs[n++]);
    } else if (o->kind == 1) {
      void* rv = fk_ptr(o->recv, o->bytes, &ok);
      if (ok) rc = MPI_Irecv(rv, (int)o->bytes, MPI_BYTE, o->peer, 0,
                             o->comm->mpi, &reqs[n++]);
    } else {
      void* rv = fk_ptr(o->recv, o->bytes, &ok);
      if (ok && o->comm->rank == o->peer && o->send != o->recv) {
        const void* sv = fk_ptr(o->send, o->bytes, &ok);
        if (ok) memmove(rv, sv, o->bytes);
      }
      if (ok) rc = MPI_Ibcast(rv, (int)o->bytes, MPI_BYTE, o->peer,
                              o->comm->mpi, &reqs[n++]);
    }
    if (!ok) r = ncclInvalidArgument;
    else if (rc != MPI_SUCCESS) r = ncclSystemError;
  }
  /* what was posted completes even after an error: no request is left */
  if (n > 0 && MPI_Waitall((int)n, reqs, MPI_STATUSES_IGNORE) != MPI_SUCCESS &&
      r == ncclSuccess)
    r = ncclSystemError;
  free(reqs);
  fk_nops = 0;
  return r;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t,
                      int peer, ncclComm_t c, cudaStream_t s) {
  if (fk_depth == 0) return fk_bad("ncclSend outside a group");
  return fk_group_add(0, send, NULL, count, t, peer, c, s);
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t c, cudaStream_t s) {
  if (fk_depth == 0) return fk_bad("ncclRecv outside a group");
  return fk_group_add(1, NULL, recv, count, t, peer, c, s);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                           ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
  if (fk_depth > 0) return fk_group_add(2, send, recv, count, t, root, c, s);
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess) r = fk_group_add(2, send, recv, count, t, root, c, s);
  ncclResult_t r2 = ncclGroupEnd();
  return r != ncclSuccess ? r : r2;
}
