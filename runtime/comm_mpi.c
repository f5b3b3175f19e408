/*
 * comm_mpi.c — the MPI communicator backend over host memory: blocking and
 * non-blocking (MPI-3 I*) all-gather, reduce-scatter (Reduce_scatter_block),
 * all-reduce and broadcast on a duplicate of the caller's communicator with
 * MPI_ERRORS_RETURN, so an MPI failure is a zs_status, not an abort.
 */
#include "runtime/comm_mpi.h"

#include <limits.h>
#include <stdlib.h>

typedef struct zs__mpi_impl {
  MPI_Comm comm;
  int owns_mpi; /* counted in zs__mpi_owners */
} zs__mpi_impl;

/* Contexts alive over an MPI that ZeroShard initialized; the last one
 * destroyed finalizes it (zs__comm_mpi_own). */
static int zs__mpi_owners;

struct zs__comm_req {
  MPI_Request request;
};

static MPI_Comm zs__mpi_comm(zs__comm* c) {
  return ((zs__mpi_impl*)c->impl)->comm;
}

static zs_status zs__mpi_fail(int rc, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  return zs__error(ZS_ERR_COMM, "MPI %s failed: %s (code %d)", what, text, rc);
}

static zs_status zs__mpi_type(zs_dtype dtype, int reducing, MPI_Datatype* out) {
  switch (dtype) {
    case ZS_FLOAT32: *out = MPI_FLOAT; return ZS_OK;
    case ZS_FLOAT64: *out = MPI_DOUBLE; return ZS_OK;
    case ZS_INT64: *out = MPI_INT64_T; return ZS_OK;
    case ZS_UINT64: *out = MPI_UINT64_T; return ZS_OK;
    case ZS_UINT8: *out = MPI_UINT8_T; return ZS_OK;
    case ZS_BFLOAT16:
    case ZS_FLOAT16:
      /* Moving 16-bit floats is a copy of 16-bit words; summing them needs
       * a user-defined MPI_Op, which this backend does not have yet. */
      if (reducing)
        return zs__error(ZS_ERR_UNSUPPORTED,
                         "MPI backend: reductions of %s are not supported; "
                         "reduce in fp32", zs_dtype_name(dtype));
      *out = MPI_UINT16_T;
      return ZS_OK;
    case ZS_DTYPE_COUNT: break;
  }
  return zs__error(ZS_ERR_INVALID_ARGUMENT, "MPI backend: dtype %d", (int)dtype);
}

static MPI_Op zs__mpi_op(zs__red_op op) {
  return op == ZS__RED_MAX ? MPI_MAX : op == ZS__RED_MIN ? MPI_MIN : MPI_SUM;
}

static zs_status zs__mpi_count(size_t count, const char* what, int* out) {
  if (count > (size_t)INT_MAX)
    return zs__error(ZS_ERR_UNSUPPORTED,
                     "MPI %s of %zu elements per rank exceeds MPI's int count "
                     "limit (%d); use smaller units", what, count, INT_MAX);
  *out = (int)count;
  return ZS_OK;
}

/* Allocates the request for a non-blocking call (req != NULL). */
static zs_status zs__mpi_req(zs__comm_req** req, MPI_Request** out) {
  *out = NULL;
  if (req == NULL) return ZS_OK;
  *req = (zs__comm_req*)calloc(1, sizeof **req);
  if (*req == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "MPI request");
  *out = &(*req)->request;
  return ZS_OK;
}

static zs_status zs__mpi_finish(int rc, const char* what, zs__comm_req** req) {
  if (rc == MPI_SUCCESS) return ZS_OK;
  if (req != NULL) {
    free(*req);
    *req = NULL;
  }
  return zs__mpi_fail(rc, what);
}

static zs_status zs__mpi_all_gather(zs__comm* c, const void* send, void* recv,
                                    size_t count, zs_dtype dtype,
                                    zs__stream* stream, zs__comm_req** req) {
  (void)stream;
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 0, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, "all-gather", &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  const void* s = send == ZS__IN_PLACE ? MPI_IN_PLACE : send;
  int rc = r == NULL
               ? MPI_Allgather(s, n, t, recv, n, t, zs__mpi_comm(c))
               : MPI_Iallgather(s, n, t, recv, n, t, zs__mpi_comm(c), r);
  return zs__mpi_finish(rc, "all-gather", req);
}

static zs_status zs__mpi_reduce_scatter(zs__comm* c, const void* send,
                                        void* recv, size_t count,
                                        zs_dtype dtype, zs__red_op op,
                                        zs__stream* stream,
                                        zs__comm_req** req) {
  (void)stream;
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 1, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, "reduce-scatter", &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  MPI_Op o = zs__mpi_op(op);
  int rc = r == NULL ? MPI_Reduce_scatter_block(send, recv, n, t, o,
                                                zs__mpi_comm(c))
                     : MPI_Ireduce_scatter_block(send, recv, n, t, o,
                                                 zs__mpi_comm(c), r);
  return zs__mpi_finish(rc, "reduce-scatter", req);
}

static zs_status zs__mpi_all_reduce(zs__comm* c, const void* send, void* recv,
                                    size_t count, zs_dtype dtype,
                                    zs__red_op op, zs__stream* stream,
                                    zs__comm_req** req) {
  (void)stream;
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 1, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, "all-reduce", &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  const void* s = send == ZS__IN_PLACE ? MPI_IN_PLACE : send;
  MPI_Op o = zs__mpi_op(op);
  int rc = r == NULL ? MPI_Allreduce(s, recv, n, t, o, zs__mpi_comm(c))
                     : MPI_Iallreduce(s, recv, n, t, o, zs__mpi_comm(c), r);
  return zs__mpi_finish(rc, "all-reduce", req);
}

static zs_status zs__mpi_broadcast(zs__comm* c, void* buf, size_t count,
                                   zs_dtype dtype, int root,
                                   zs__stream* stream, zs__comm_req** req) {
  (void)stream;
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 0, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, "broadcast", &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  int rc = r == NULL ? MPI_Bcast(buf, n, t, root, zs__mpi_comm(c))
                     : MPI_Ibcast(buf, n, t, root, zs__mpi_comm(c), r);
  return zs__mpi_finish(rc, "broadcast", req);
}

static zs_status zs__mpi_wait(zs__comm* c, zs__comm_req* req) {
  (void)c;
  int rc = MPI_Wait(&req->request, MPI_STATUS_IGNORE);
  free(req);
  return rc == MPI_SUCCESS ? ZS_OK : zs__mpi_fail(rc, "wait");
}

static zs_status zs__mpi_test(zs__comm* c, zs__comm_req* req, int* done) {
  (void)c;
  int rc = MPI_Test(&req->request, done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    *done = 1;
    free(req);
    return zs__mpi_fail(rc, "test");
  }
  if (*done) free(req);
  return ZS_OK;
}

static void zs__mpi_destroy(zs__comm* c) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_free(&impl->comm);
    if (impl->owns_mpi && --zs__mpi_owners == 0) MPI_Finalize();
  }
  free(impl);
  free(c);
}

void zs__comm_mpi_own(zs__comm* c) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  if (!impl->owns_mpi) {
    impl->owns_mpi = 1;
    zs__mpi_owners++;
  }
}

static const zs__comm_ops zs__mpi_ops = {
    "mpi",
    zs__mpi_all_gather,
    zs__mpi_reduce_scatter,
    zs__mpi_all_reduce,
    zs__mpi_broadcast,
    zs__mpi_wait,
    zs__mpi_test,
    zs__mpi_destroy,
};

zs_status zs__comm_mpi_create(MPI_Comm comm, zs__comm** out) {
  zs__comm* c = (zs__comm*)calloc(1, sizeof *c);
  zs__mpi_impl* impl = (zs__mpi_impl*)calloc(1, sizeof *impl);
  if (c == NULL || impl == NULL) {
    free(c);
    free(impl);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "MPI communicator");
  }
  int rc = MPI_Comm_dup(comm, &impl->comm);
  if (rc != MPI_SUCCESS) {
    free(c);
    free(impl);
    return zs__mpi_fail(rc, "Comm_dup");
  }
  MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(impl->comm, &c->rank);
  MPI_Comm_size(impl->comm, &c->world);
  c->ops = &zs__mpi_ops;
  c->impl = impl;
  c->seq_hash = ZS__FNV_SEED;
  c->max_count = (size_t)INT_MAX; /* MPI counts are ints */
  *out = c;
  return ZS_OK;
}
