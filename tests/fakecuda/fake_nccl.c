/*
 * fake_nccl.c — libfakenccl.so: the NCCL functions runtime/comm/comm_nccl.c
 * loads (ZS_NCCL_LIBRARY names this file instead of libnccl.so.2),
 * implemented with MPI on the fake CUDA runtime's memory (fakecuda.h), so
 * the NCCL communicator's multi-rank code runs in CI without GPUs.
 *
 * A collective first runs what its stream waits for (comm_nccl.c's
 * event on the legacy stream, and with it every earlier operation of the
 * blocking streams: if that ordering were missing, the inputs would be
 * stale and the results wrong), then posts nonblocking MPI calls into
 * landing buffers and queues on its stream an operation that is done when
 * they complete, and then copies what they received to the destination
 * (and sums a reduction): the collective is in flight until a wait or a
 * query polls it, its output appears only then, and a rank that never
 * joins leaves the others' collectives in flight, as with NCCL. More
 * lenient than NCCL: running what the stream waits for at the call runs
 * the earlier work of every blocking stream on the host there and then,
 * and collectives queued on one stream are posted to MPI at once, not one
 * after the other. ncclCommAbort abandons them (unlike
 * NCCL's, their MPI requests stay posted and may still match another
 * rank's later collective on that communicator). Sums
 * are in rank order, in fp32, rounded once to the dtype. Grouped calls
 * (ncclGroupStart/End) may be Send, Recv and Broadcast on one stream,
 * posted together at ncclGroupEnd. A communicator must span
 * MPI_COMM_WORLD (the unique id
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
  int aborted; /* ncclCommAbort: collectives in flight are abandoned */
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

/* Data a collective received, copied to its destination only when the
 * collective completes (so its output appears at its place in the stream
 * order, not whenever MPI delivers it). */
typedef struct {
  void* dst;
  char* tmp;
  size_t bytes;
} fk_landing;

/* A collective in flight: its MPI requests, the data they receive, and for
 * a reduction the gathered blocks to sum into `out` when they are all
 * here. */
typedef struct {
  ncclComm_t comm;
  MPI_Request* reqs;
  int nreqs;
  fk_landing* land; /* one per request at most */
  int nland;
  char* all; /* reductions: nranks blocks of n elements */
  void* out;
  size_t n;
  ncclDataType_t t;
} fk_flight;

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

/* What the stream waits for before this collective (comm_nccl.c's event on
 * the legacy stream) done, so its inputs are what a GPU would read; not
 * the stream's earlier collectives, which may still be in flight. */
static void fk_prepare(cudaStream_t s) { fakecuda_stream_inputs(s); }

static void* fk_ptr(const void* p, size_t bytes, int* ok) {
  return fakecuda_kernel_ptr(p, bytes, "NCCL", ok);
}

static ncclResult_t fk_sum(void* out, const char* in, int nranks, size_t n,
                           ncclDataType_t t);

/* Done when every request completed (then a reduction sums its blocks), or
 * at once when the communicator was aborted (the requests are abandoned,
 * with their buffers). */
static int fk_poll(void* arg) {
  fk_flight* f = (fk_flight*)arg;
  if (f->comm->aborted) return 1;
  int done = 0;
  MPI_Testall(f->nreqs, f->reqs, &done, MPI_STATUSES_IGNORE);
  if (!done) return 0;
  if (f->all != NULL && fk_sum(f->out, f->all, f->comm->nranks, f->n, f->t) !=
                            ncclSuccess)
    abort(); /* the dtype was checked at issue */
  for (int i = 0; i < f->nland; i++) {
    memcpy(f->land[i].dst, f->land[i].tmp, f->land[i].bytes);
    free(f->land[i].tmp);
  }
  free(f->land);
  free(f->all);
  free(f->reqs);
  f->land = NULL;
  f->nland = 0;
  f->all = NULL;
  f->reqs = NULL;
  return 1;
}

/* A landing buffer for `bytes` received into dst (the fake device's view),
 * holding a copy of what dst holds now (an in-place send reads it); NULL
 * when out of memory. */
static char* fk_land(fk_flight* f, void* dst, size_t bytes) {
  char* tmp = (char*)malloc(bytes > 0 ? bytes : 1);
  if (tmp == NULL) return NULL;
  memcpy(tmp, dst, bytes);
  fk_landing l = {dst, tmp, bytes};
  f->land[f->nland++] = l;
  return tmp;
}

/* Queues the collective whose requests are f's on stream s. */
static ncclResult_t fk_fly(fk_flight* f, cudaStream_t s) {
  return fakecuda_enqueue_poll(s, "NCCL", fk_poll, f) == cudaSuccess
             ? ncclSuccess : ncclUnhandledCudaError;
}

static fk_flight* fk_flight_new(ncclComm_t c, int nreqs) {
  fk_flight* f = (fk_flight*)calloc(1, sizeof *f);
  if (f == NULL) return NULL;
  f->comm = c;
  f->reqs = (MPI_Request*)calloc((size_t)nreqs + 1, sizeof(MPI_Request));
  f->land = (fk_landing*)calloc((size_t)nreqs + 1, sizeof(fk_landing));
  if (f->reqs == NULL || f->land == NULL) {
    free(f->reqs);
    free(f->land);
    free(f);
    return NULL;
  }
  return f;
}

static void fk_flight_free(fk_flight* f) {
  if (f == NULL) return;
  for (int i = 0; i < f->nland; i++) free(f->land[i].tmp);
  free(f->land);
  free(f->all);
  free(f->reqs);
  free(f);
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
 * communicator and the record are left (a test process ends soon after),
 * and collectives in flight are abandoned (fk_poll). */
ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c == NULL) return ncclInvalidArgument;
  c->aborted = 1; /* kept: collectives in flight still name it */
  fakecuda_keep_memory();
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
  fk_prepare(s);
  int ok = 1;
  const int in_place = (const char*)send == (const char*)recv + b * (size_t)c->rank;
  const void* sv = in_place ? NULL : fk_ptr(send, b, &ok);
  void* rv = fk_ptr(recv, b * (size_t)c->nranks, &ok);
  if (!ok) return ncclInvalidArgument;
  fk_flight* f = fk_flight_new(c, 1);
  char* tmp = f != NULL ? fk_land(f, rv, b * (size_t)c->nranks) : NULL;
  if (tmp == NULL) {
    fk_flight_free(f);
    return ncclSystemError;
  }
  f->nreqs = 1;
  if (MPI_Iallgather(in_place ? MPI_IN_PLACE : sv, (int)b, MPI_BYTE, tmp,
                     (int)b, MPI_BYTE, c->mpi, &f->reqs[0]) != MPI_SUCCESS) {
    fk_flight_free(f);
    return ncclSystemError;
  }
  return fk_fly(f, s);
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
  if (t != ncclFloat32 && t != ncclBfloat16 && t != ncclFloat16)
    return fk_bad("sums of this dtype");
  if (c == NULL || count * e * (size_t)c->nranks > INT32_MAX)
    return ncclInvalidArgument;
  fk_prepare(s);
  int ok = 1;
  const size_t in_bytes = count * e * (scatter ? (size_t)c->nranks : 1);
  const void* sv = fk_ptr(send, in_bytes, &ok);
  void* rv = fk_ptr(recv, count * e, &ok);
  if (!ok) return ncclInvalidArgument;
  fk_flight* f = fk_flight_new(c, 1);
  if (f == NULL) return ncclSystemError;
  f->all = (char*)malloc(count * e * (size_t)c->nranks + 1);
  if (f->all == NULL) {
    fk_flight_free(f);
    return ncclSystemError;
  }
  f->nreqs = 1;
  f->out = rv;
  f->n = count;
  f->t = t;
  /* every rank's block for this rank (reduce-scatter), or every rank's
   * whole buffer (all-reduce); summed when they are here */
  const int rc = scatter
      ? MPI_Ialltoall(sv, (int)(count * e), MPI_BYTE, f->all,
                      (int)(count * e), MPI_BYTE, c->mpi, &f->reqs[0])
      : MPI_Iallgather(sv, (int)(count * e), MPI_BYTE, f->all,
                       (int)(count * e), MPI_BYTE, c->mpi, &f->reqs[0]);
  if (rc != MPI_SUCCESS) {
    fk_flight_free(f);
    return ncclSystemError;
  }
  return fk_fly(f, s);
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
  if (fk_nops == 0) return ncclSuccess;
  ncclResult_t r = ncclSuccess;
  for (size_t i = 1; i < fk_nops && r == ncclSuccess; i++)
    if (fk_ops[i].stream != fk_ops[0].stream || fk_ops[i].comm != fk_ops[0].comm)
      r = fk_bad("a group over several streams or communicators");
  fk_flight* f = r == ncclSuccess ? fk_flight_new(fk_ops[0].comm, (int)fk_nops)
                                  : NULL;
  if (r == ncclSuccess && f == NULL) r = ncclSystemError;
  if (r == ncclSuccess) fk_prepare(fk_ops[0].stream);
  for (size_t i = 0; i < fk_nops && r == ncclSuccess; i++) {
    fk_nop* o = &fk_ops[i];
    int ok = 1, rc = MPI_SUCCESS;
    MPI_Request* q = &f->reqs[f->nreqs];
    if (o->kind == 0) {
      const void* sv = fk_ptr(o->send, o->bytes, &ok);
      if (ok) rc = MPI_Isend(sv, (int)o->bytes, MPI_BYTE, o->peer, 0,
                             o->comm->mpi, q);
    } else if (o->kind == 1) {
      void* rv = fk_ptr(o->recv, o->bytes, &ok);
      char* tmp = ok ? fk_land(f, rv, o->bytes) : NULL;
      if (ok && tmp == NULL) rc = MPI_ERR_NO_MEM;
      if (tmp != NULL) rc = MPI_Irecv(tmp, (int)o->bytes, MPI_BYTE, o->peer,
                                      0, o->comm->mpi, q);
    } else {
      void* rv = fk_ptr(o->recv, o->bytes, &ok);
      char* tmp = ok ? fk_land(f, rv, o->bytes) : NULL;
      if (ok && tmp == NULL) rc = MPI_ERR_NO_MEM;
      if (tmp != NULL && o->comm->rank == o->peer && o->send != o->recv) {
        const void* sv = fk_ptr(o->send, o->bytes, &ok);
        if (ok) memcpy(tmp, sv, o->bytes);
      }
      if (ok && tmp != NULL)
        rc = MPI_Ibcast(tmp, (int)o->bytes, MPI_BYTE, o->peer, o->comm->mpi,
                        q);
    }
    if (ok && rc == MPI_SUCCESS) f->nreqs++;
    if (!ok) r = ncclInvalidArgument;
    else if (rc != MPI_SUCCESS) r = ncclSystemError;
  }
  const cudaStream_t s = fk_ops[0].stream;
  fk_nops = 0;
  if (f == NULL) return r;
  if (r != ncclSuccess) {
    /* what was posted completes: no request is left behind */
    MPI_Waitall(f->nreqs, f->reqs, MPI_STATUSES_IGNORE);
    fk_flight_free(f);
    return r;
  }
  return fk_fly(f, s);
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
