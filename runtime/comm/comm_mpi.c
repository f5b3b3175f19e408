/*
 * comm_mpi.c — the MPI communicator backend over host memory: blocking and
 * non-blocking (MPI-3 I*) all-gather, reduce-scatter (Reduce_scatter_block),
 * all-reduce and broadcast on a duplicate of the caller's communicator with
 * MPI_ERRORS_RETURN, so an MPI failure is a zs_status, not an abort; the
 * notices (comm.h) that let a rank which gives up, or drops a micro-batch,
 * tell the others at once; and the control collectives of
 * zs_step_discard's reconciliation on a second duplicate.
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/comm_shm.h"

#include <limits.h>
#include <sched.h>
#include <unistd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct zs__mpi_impl {
  MPI_Comm comm;
  int owns_mpi;     /* counted in zs__mpi_owners */
  MPI_Comm probe_comm; /* the progress thread probes here (never used else) */
  MPI_Comm ctrl_comm;  /* control collectives (comm.h), or MPI_COMM_NULL */
  pthread_t progress;
  int progress_on;
  int progress_stop;   /* atomic */
  int probe_live;      /* probe_comm exists */
  unsigned p2p_seq; /* tag of the next exchange: the same on every rank */
  int tag_ub;
  /* Failure notices: a receive from any rank, posted at creation with this
   * context's own tag on the notice communicator of the caller's
   * communicator (zs__notice_home), and the sends of this rank's notice,
   * never waited for. */
  MPI_Comm notice_comm;      /* not owned; MPI_COMM_NULL: none */
  int notice_tag;
  MPI_Request notice_recv;   /* MPI_REQUEST_NULL once completed */
  char notice_in[ZS__NOTICE_BYTES];
  struct zs__notice_send* notice_sends; /* sent, oldest first */
  /* Host collectives through shared memory (comm_shm.h), or NULL: all on
   * MPI. Point-to-point gathers to users, notices and control collectives
   * stay on MPI. */
  zs__shm* shm[ZS__SHM_LANES]; /* per lane (zs__mpi_lane): lane 0's
                                  collectives and lane 1's exchanges pair up
                                  independently, as on MPI */
} zs__mpi_impl;

/* One notice sent to every other rank: its text and its requests, freed
 * once every send completed (tested at the next notice and at destroy). */
typedef struct zs__notice_send {
  struct zs__notice_send* next;
  char* text;
  MPI_Request* reqs; /* world entries (MPI_REQUEST_NULL for this rank) */
} zs__notice_send;

/* Contexts alive over an MPI that ZeroShard initialized; the last one
 * destroyed finalizes it (zs__comm_mpi_own). */
static int zs__mpi_owners;

/* One MPI request (collectives) or several (point-to-point exchanges). */
struct zs__comm_req {
  zs__shm_op* shm;     /* a shared-memory collective, or NULL */
  MPI_Request request; /* used when many == NULL and shm == NULL */
  int n;               /* requests in many (may be 0: nothing to wait for) */
  MPI_Request* many;
};

static MPI_Comm zs__mpi_comm(zs__comm* c) {
  return ((zs__mpi_impl*)c->impl)->comm;
}

static zs_status zs__mpi_fail(int rc, const char* what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  text[len] = '\0';
  int cls = rc;
  if (MPI_Error_class(rc, &cls) != MPI_SUCCESS) cls = rc;
  /* A truncation in a collective is almost always ranks issuing different
   * collectives at this point (sizes that differ): say so. */
  return zs__error(ZS_ERR_COMM, "MPI %s failed: %s (code %d)%s", what, text, rc,
                   cls == MPI_ERR_TRUNCATE
                       ? "; the ranks issued different collectives here (a "
                         "rank gathered, released or reduced another unit, "
                         "or skipped a call or a step)"
                       : "");
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
    case ZS_DTYPE_COUNT:
    case ZS_DTYPE_AUTO: break;
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

/* ---- Shared-memory host collectives (comm_shm.h) ---------------------- */

/* The segment of lane 0 (collectives) or 1 (exchanges), or NULL. */
static zs__shm* zs__mpi_shm_lane(zs__comm* c, int lane) {
  return ((zs__mpi_impl*)c->impl)->shm[lane];
}
static zs__shm* zs__mpi_shm(zs__comm* c) { return zs__mpi_shm_lane(c, 0); }

/* Completes a queued shared-memory collective (blocking), frees it. */
static zs_status zs__mpi_shm_wait(zs__shm_op* op) {
  while (!zs__shm_done(op)) zs__shm_idle(op, 0.01);
  return zs__shm_finish(op);
}

/* Queues a on lane's worker (the lane zs__mpi_lane gives its call);
 * req == NULL: waits for it. */
static zs_status zs__mpi_shm_post(zs__comm* c, int lane, zs__shm_args a,
                                  zs__comm_req** req) {
  zs__shm_op* op = NULL;
  zs__comm_req* r = NULL;
  if (req != NULL &&
      (r = (zs__comm_req*)calloc(1, sizeof *r)) == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "shared-memory request");
  zs_status st = zs__shm_post(zs__mpi_shm_lane(c, lane), &a, &op);
  if (st != ZS_OK) {
    free(r);
    return st;
  }
  if (r != NULL) {
    r->shm = op;
    *req = r;
    return ZS_OK;
  }
  return zs__mpi_shm_wait(op);
}

/* Offsets of contiguous blocks of `count` (a reduce-scatter's layout). */
static zs_status zs__mpi_shm_blocks(zs__comm* c, size_t count,
                                    size_t** out) {
  *out = (size_t*)malloc((size_t)c->world * sizeof **out);
  if (*out == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "offsets");
  for (int r = 0; r < c->world; r++) (*out)[r] = (size_t)r * count;
  return ZS_OK;
}

static zs_status zs__mpi_reduce_scatter_fixed(zs__comm* c, const void* send,
                                              const size_t* offsets,
                                              void* dst, size_t chunk,
                                              float divisor, zs_dtype dtype,
                                              zs__stream* stream,
                                              zs__comm_req** req) {
  (void)stream;
  zs__shm_args a = {ZS__SHM_REDUCE_SCATTER, send, dst, chunk, dtype,
                    offsets, 0, 0, divisor, 0, 0};
  return zs__mpi_shm_post(c, 1, a, req); /* (as the exchange it stands for) */
}

static zs_status zs__mpi_all_gather(zs__comm* c, const void* send, void* recv,
                                    size_t count, zs_dtype dtype,
                                    zs__stream* stream, zs__comm_req** req) {
  (void)stream;
  if (zs__mpi_shm(c) != NULL) {
    zs__shm_args a = {ZS__SHM_ALL_GATHER, send == ZS__IN_PLACE ? NULL : send,
                      recv, count, dtype, NULL, 0, 0, 1.0f, 0, 0};
    return zs__mpi_shm_post(c, 0, a, req);
  }
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
  if (zs__mpi_shm(c) != NULL && op == ZS__RED_SUM) {
    /* (summed in rank order: one order of the several MPI may pick) */
    size_t* offsets = NULL;
    zs_status st = zs__mpi_shm_blocks(c, count, &offsets);
    if (st != ZS_OK) return st;
    zs__shm_args a = {ZS__SHM_REDUCE_SCATTER, send, recv, count, dtype,
                      offsets, 0, 0, 1.0f, 0, 0};
    st = zs__mpi_shm_post(c, 0, a, req);
    free(offsets);
    return st;
  }
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

/* All-reduce and broadcast on `comm`: the data communicator, or the
 * control one (comm.h, ctrl_*). */
static zs_status zs__mpi_all_reduce_on(MPI_Comm comm, const void* send,
                                       void* recv, size_t count,
                                       zs_dtype dtype, zs__red_op op,
                                       const char* what, zs__comm_req** req) {
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 1, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, what, &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  const void* s = send == ZS__IN_PLACE ? MPI_IN_PLACE : send;
  MPI_Op o = zs__mpi_op(op);
  int rc = r == NULL ? MPI_Allreduce(s, recv, n, t, o, comm)
                     : MPI_Iallreduce(s, recv, n, t, o, comm, r);
  return zs__mpi_finish(rc, what, req);
}

static zs_status zs__mpi_broadcast_on(MPI_Comm comm, void* buf, size_t count,
                                      zs_dtype dtype, int root,
                                      const char* what, zs__comm_req** req) {
  MPI_Datatype t;
  int n = 0;
  MPI_Request* r;
  zs_status st = zs__mpi_type(dtype, 0, &t);
  if (st == ZS_OK) st = zs__mpi_count(count, what, &n);
  if (st == ZS_OK) st = zs__mpi_req(req, &r);
  if (st != ZS_OK) return st;
  int rc = r == NULL ? MPI_Bcast(buf, n, t, root, comm)
                     : MPI_Ibcast(buf, n, t, root, comm, r);
  return zs__mpi_finish(rc, what, req);
}

static zs_status zs__mpi_all_reduce(zs__comm* c, const void* send, void* recv,
                                    size_t count, zs_dtype dtype,
                                    zs__red_op op, zs__stream* stream,
                                    zs__comm_req** req) {
  (void)stream;
  if (zs__mpi_shm(c) != NULL) {
    zs__shm_args a = {ZS__SHM_ALL_REDUCE, send == ZS__IN_PLACE ? NULL : send,
                      recv, count, dtype, NULL, 0, 0, 1.0f, (int)op, 0};
    return zs__mpi_shm_post(c, 0, a, req);
  }
  return zs__mpi_all_reduce_on(zs__mpi_comm(c), send, recv, count, dtype, op,
                               "all-reduce", req);
}

static zs_status zs__mpi_broadcast(zs__comm* c, void* buf, size_t count,
                                   zs_dtype dtype, int root,
                                   zs__stream* stream, zs__comm_req** req) {
  (void)stream;
  if (zs__mpi_shm(c) != NULL) {
    zs__shm_args a = {ZS__SHM_BROADCAST, NULL, buf, count, dtype, NULL,
                      0, 0, 1.0f, 0, root};
    return zs__mpi_shm_post(c, 0, a, req);
  }
  return zs__mpi_broadcast_on(zs__mpi_comm(c), buf, count, dtype, root,
                              "broadcast", req);
}

static void zs__mpi_req_free(zs__comm_req* req) {
  free(req->many);
  free(req);
}

static zs_status zs__mpi_wait(zs__comm* c, zs__comm_req* req) {
  (void)c;
  if (req->shm != NULL) {
    zs_status st = zs__mpi_shm_wait(req->shm);
    free(req);
    return st;
  }
  int rc = req->many != NULL
               ? MPI_Waitall(req->n, req->many, MPI_STATUSES_IGNORE)
               : MPI_Wait(&req->request, MPI_STATUS_IGNORE);
  zs__mpi_req_free(req);
  return rc == MPI_SUCCESS ? ZS_OK : zs__mpi_fail(rc, "wait");
}

static zs_status zs__mpi_test(zs__comm* c, zs__comm_req* req, int* done) {
  (void)c;
  if (req->shm != NULL) {
    *done = zs__shm_done(req->shm);
    if (!*done) return ZS_OK;
    zs_status st = zs__shm_finish(req->shm);
    free(req);
    return st;
  }
  int rc = MPI_SUCCESS;
  if (req->many == NULL)
    rc = MPI_Test(&req->request, done, MPI_STATUS_IGNORE);
  else if (req->n > 0)
    rc = MPI_Testall(req->n, req->many, done, MPI_STATUSES_IGNORE);
  else
    *done = 1;
  if (rc != MPI_SUCCESS) {
    *done = 1;
    zs__mpi_req_free(req);
    return zs__mpi_fail(rc, "test");
  }
  if (*done) zs__mpi_req_free(req);
  return ZS_OK;
}

/* ---- Point-to-point building blocks (exchange, strided all-gather) ---- */

/* A request holding up to 2 * (world - 1) point-to-point requests, and the
 * tag every rank uses for this operation. */
static zs_status zs__mpi_p2p_begin(zs__comm* c, zs__comm_req** req, int* tag) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  *req = (zs__comm_req*)calloc(1, sizeof **req);
  if (*req != NULL)
    (*req)->many = (MPI_Request*)calloc(2 * (size_t)c->world + 1,
                                        sizeof(MPI_Request));
  if (*req == NULL || (*req)->many == NULL) {
    if (*req != NULL) free(*req);
    *req = NULL;
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "MPI request");
  }
  *tag = 1 + (int)(impl->p2p_seq++ % (unsigned)(impl->tag_ub - 1));
  return ZS_OK;
}

/* The start of a p2p operation of `count` elements of dtype each way:
 * the MPI type, the count as an int, the request and the tag. */
static zs_status zs__mpi_p2p_setup(zs__comm* c, zs_dtype dtype, size_t count,
                                   const char* what, MPI_Datatype* t, int* n,
                                   zs__comm_req** r, int* tag) {
  zs_status st = zs__mpi_type(dtype, 0, t);
  if (st == ZS_OK) st = zs__mpi_count(count, what, n);
  if (st == ZS_OK) st = zs__mpi_p2p_begin(c, r, tag);
  return st;
}

/* Completes a started p2p operation if the caller wanted it blocking. */
static zs_status zs__mpi_p2p_end(zs__comm* c, int rc, const char* what,
                                 zs__comm_req* r, zs__comm_req** req) {
  if (rc != MPI_SUCCESS) {
    /* Requests already posted cannot be withdrawn; keep them alive. */
    return zs__mpi_fail(rc, what);
  }
  if (req != NULL) {
    *req = r;
    return ZS_OK;
  }
  return zs__mpi_wait(c, r);
}

static zs_status zs__mpi_exchange(zs__comm* c, const void* send,
                                  const size_t* offsets, void* recv,
                                  size_t chunk, zs_dtype dtype,
                                  zs__stream* stream, zs__comm_req** req) {
  (void)stream;
  if (zs__mpi_shm(c) != NULL) {
    zs__shm_args a = {ZS__SHM_EXCHANGE, send, recv, chunk, dtype, offsets,
                      0, 0, 1.0f, 0, 0};
    return zs__mpi_shm_post(c, 1, a, req);
  }
  MPI_Datatype t;
  int n = 0, tag = 0;
  zs__comm_req* r = NULL;
  zs_status st = zs__mpi_p2p_setup(c, dtype, chunk, "exchange", &t, &n, &r, &tag);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  const char* s = (const char*)send;
  char* d = (char*)recv;
  int rc = MPI_SUCCESS;
  for (int p = 0; p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    rc = MPI_Irecv(d + (size_t)p * chunk * elem, n, t, p, tag,
                   zs__mpi_comm(c), &r->many[r->n++]);
  }
  for (int p = 0; p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    rc = MPI_Isend(s + offsets[p] * elem, n, t, p, tag, zs__mpi_comm(c),
                   &r->many[r->n++]);
  }
  if (chunk > 0)
    memcpy(d + (size_t)c->rank * chunk * elem, s + offsets[c->rank] * elem,
           chunk * elem);
  return zs__mpi_p2p_end(c, rc, "exchange", r, req);
}

static zs_status zs__mpi_all_gather_strided(zs__comm* c, void* buf,
                                            size_t offset, size_t stride,
                                            size_t chunk, zs_dtype dtype,
                                            zs__stream* stream,
                                            zs__comm_req** req) {
  (void)stream;
  if (zs__mpi_shm(c) != NULL) {
    zs__shm_args a = {ZS__SHM_ALL_GATHER_STRIDED, NULL, buf, chunk, dtype,
                      NULL, offset, stride, 1.0f, 0, 0};
    return zs__mpi_shm_post(c, 1, a, req);
  }
  MPI_Datatype t;
  int n = 0, tag = 0;
  zs__comm_req* r = NULL;
  zs_status st = zs__mpi_p2p_setup(c, dtype, chunk, "all-gather", &t, &n, &r,
                                   &tag);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  char* b = (char*)buf;
  char* mine = b + ((size_t)c->rank * stride + offset) * elem;
  int rc = MPI_SUCCESS;
  for (int p = 0; p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    rc = MPI_Irecv(b + ((size_t)p * stride + offset) * elem, n, t, p, tag,
                   zs__mpi_comm(c), &r->many[r->n++]);
  }
  for (int p = 0; p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    rc = MPI_Isend(mine, n, t, p, tag, zs__mpi_comm(c), &r->many[r->n++]);
  }
  return zs__mpi_p2p_end(c, rc, "strided all-gather", r, req);
}

static zs_status zs__mpi_gather_users(zs__comm* c, const void* send,
                                      void* recv, size_t count, zs_dtype dtype,
                                      uint64_t users, zs__stream* stream,
                                      zs__comm_req** req) {
  (void)stream;
  MPI_Datatype t;
  int n = 0, tag = 0;
  zs__comm_req* r = NULL;
  zs_status st = zs__mpi_p2p_setup(c, dtype, count, "gather", &t, &n, &r, &tag);
  if (st != ZS_OK) return st;
  const size_t elem = zs_dtype_size(dtype);
  const int user = (int)(users >> c->rank & 1);
  char* d = (char*)recv;
  int rc = MPI_SUCCESS;
  for (int p = 0; user && p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    rc = MPI_Irecv(d + (size_t)p * count * elem, n, t, p, tag, zs__mpi_comm(c),
                   &r->many[r->n++]);
  }
  for (int p = 0; p < c->world && rc == MPI_SUCCESS; p++) {
    if (p == c->rank || !(users >> p & 1)) continue;
    rc = MPI_Isend(send, n, t, p, tag, zs__mpi_comm(c), &r->many[r->n++]);
  }
  if (user && count > 0)
    memcpy(d + (size_t)c->rank * count * elem, send, count * elem);
  return zs__mpi_p2p_end(c, rc, "gather", r, req);
}

/* ---- The progress thread ---------------------------------------------------
 * While collectives are in flight, an MPI_Iprobe on a private communicator
 * runs Open MPI's progress engine (which advances every pending request)
 * without touching our requests, which only the caller's thread tests and
 * waits for. It polls every 20 us for 2 ms after the last collective was
 * issued, then every 0.5 ms (in_flight also counts collectives MPI finished
 * but ZeroShard has not looked at yet, so polling fast forever would burn a
 * core between steps). Every live progress thread is listed here and
 * stopped at the start of MPI_Finalize, whoever calls it, through the
 * delete callback of an attribute on MPI_COMM_SELF (MPI deletes those
 * first during finalize). */

static pthread_mutex_t zs__progress_lock = PTHREAD_MUTEX_INITIALIZER;
static zs__mpi_impl* zs__progress_live[64];
static int zs__progress_keyval = MPI_KEYVAL_INVALID;

static void zs__mpi_progress_stop(zs__mpi_impl* impl) {
  if (!impl->progress_on) return;
  __atomic_store_n(&impl->progress_stop, 1, __ATOMIC_RELAXED);
  pthread_join(impl->progress, NULL);
  impl->progress_on = 0;
  pthread_mutex_lock(&zs__progress_lock);
  for (int i = 0; i < 64; i++)
    if (zs__progress_live[i] == impl) zs__progress_live[i] = NULL;
  pthread_mutex_unlock(&zs__progress_lock);
}

static int zs__mpi_finalize_hook(MPI_Comm comm, int keyval, void* value,
                                 void* extra) {
  (void)comm;
  (void)keyval;
  (void)value;
  (void)extra;
  for (int i = 0; i < 64; i++) {
    pthread_mutex_lock(&zs__progress_lock);
    zs__mpi_impl* impl = zs__progress_live[i];
    pthread_mutex_unlock(&zs__progress_lock);
    if (impl != NULL) zs__mpi_progress_stop(impl);
  }
  return MPI_SUCCESS;
}

static void* zs__mpi_progress_main(void* arg) {
  zs__comm* c = (zs__comm*)arg;
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  uint64_t last_seq = 0;
  double last_issue = 0;
  while (!__atomic_load_n(&impl->progress_stop, __ATOMIC_RELAXED)) {
    const int busy = __atomic_load_n(&c->in_flight, __ATOMIC_RELAXED) > 0;
    const uint64_t seq = __atomic_load_n(&c->seq_count, __ATOMIC_RELAXED);
    const double now = zs__now();
    if (seq != last_seq) {
      last_seq = seq;
      last_issue = now;
    }
    if (busy) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, impl->probe_comm, &flag,
                 MPI_STATUS_IGNORE);
    }
    /* (shared-memory collectives run on their own worker: only the
     * occasional point-to-point gather needs MPI's progress then) */
    const int fast = busy && now - last_issue < 0.002 && impl->shm[0] == NULL;
    struct timespec ts = {0, fast ? 20000 : 500000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static zs_status zs__mpi_start_progress(zs__comm* c) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE)
    return zs__error(ZS_ERR_UNSUPPORTED,
                     "MPI provides thread level %s, not MPI_THREAD_MULTIPLE: "
                     "no progress thread; collectives progress at ZeroShard "
                     "calls only (initialize MPI with MPI_Init_thread("
                     "MPI_THREAD_MULTIPLE) to overlap them with compute)",
                     level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
                     : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
                     : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                                      : "(unknown)");
  if (impl->progress_on) return ZS_OK;
  pthread_mutex_lock(&zs__progress_lock);
  int slot = -1;
  for (int i = 0; i < 64 && slot < 0; i++)
    if (zs__progress_live[i] == NULL) slot = i;
  if (slot >= 0) zs__progress_live[slot] = impl;
  pthread_mutex_unlock(&zs__progress_lock);
  if (slot < 0)
    return zs__error(ZS_ERR_UNSUPPORTED,
                     "more than 64 contexts with progress threads");
  if (zs__progress_keyval == MPI_KEYVAL_INVALID &&
      (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, zs__mpi_finalize_hook,
                              &zs__progress_keyval, NULL) != MPI_SUCCESS ||
       MPI_Comm_set_attr(MPI_COMM_SELF, zs__progress_keyval, NULL) !=
           MPI_SUCCESS)) {
    zs__progress_live[slot] = NULL;
    return zs__error(ZS_ERR_COMM, "cannot hook the progress thread into "
                     "MPI_Finalize");
  }
  int rc = MPI_Comm_dup(impl->comm, &impl->probe_comm);
  if (rc != MPI_SUCCESS) {
    zs__progress_live[slot] = NULL;
    return zs__mpi_fail(rc, "Comm_dup (progress)");
  }
  if (pthread_create(&impl->progress, NULL, zs__mpi_progress_main, c) != 0) {
    zs__progress_live[slot] = NULL;
    MPI_Comm_free(&impl->probe_comm);
    return zs__error(ZS_ERR_INTERNAL, "cannot start the progress thread");
  }
  impl->progress_on = 1;
  impl->probe_live = 1;
  return ZS_OK;
}

/* ---- Notices (comm.h: notify, poll_notice) --------------------------------
 * Eager-sized point-to-point messages: the sender never waits (its
 * requests are freed once complete, or handed to MPI at destroy), and a
 * receiver tests its one posted receive while it waits in a collective.
 *
 * A notice nobody receives (a rank stops listening at destroy; several
 * ranks failed and sent theirs) must not sit on a communicator that is
 * then freed: Open MPI
 * replays such a message into the next communicator that gets the same
 * context id, where it takes the place of a real message and hangs that
 * communicator's creation (seen here: MPI_Comm_dup never returned after a
 * context whose every rank had failed). So the notice communicator is not
 * per context: each caller communicator gets one (a duplicate, cached in
 * an attribute, made by its first context) that lives until MPI_Finalize,
 * and each context on it uses its own tag, so a stale notice stays
 * unmatched there, harmless. Contexts on a communicator are created in the
 * same order on every rank (creation is collective), so a counter gives
 * every rank the same tag (after tag_ub contexts on one communicator,
 * tags repeat). */

typedef struct zs__notice_home {
  MPI_Comm comm;
  unsigned contexts; /* made on it so far: the next context's tag */
} zs__notice_home;

static pthread_mutex_t zs__notice_lock = PTHREAD_MUTEX_INITIALIZER;
static int zs__notice_keyval = MPI_KEYVAL_INVALID;

/* The caller's communicator is freed (or MPI finalizes): the notice
 * communicator is deliberately not freed, so its context id is never
 * reused while a stale notice may sit on it (see above); one small
 * communicator per caller communicator, left to MPI_Finalize. */
static int zs__notice_home_delete(MPI_Comm comm, int keyval, void* value,
                                  void* extra) {
  (void)comm;
  (void)keyval;
  (void)extra;
  free(value);
  return MPI_SUCCESS;
}

/* This context's notice communicator and tag (collective over `comm`). */
static int zs__notice_join(MPI_Comm comm, int tag_ub, MPI_Comm* out,
                           int* tag) {
  int rc = MPI_SUCCESS;
  pthread_mutex_lock(&zs__notice_lock);
  if (zs__notice_keyval == MPI_KEYVAL_INVALID)
    rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, zs__notice_home_delete,
                                &zs__notice_keyval, NULL);
  pthread_mutex_unlock(&zs__notice_lock);
  if (rc != MPI_SUCCESS) return rc;
  zs__notice_home* home = NULL;
  int found = 0;
  rc = MPI_Comm_get_attr(comm, zs__notice_keyval, &home, &found);
  if (rc != MPI_SUCCESS) return rc;
  if (!found) {
    /* the collective first, so a local failure after it leaves no rank
     * inside it */
    MPI_Comm dup = MPI_COMM_NULL;
    rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS) return rc;
    home = (zs__notice_home*)calloc(1, sizeof *home);
    if (home != NULL) home->comm = dup;
    rc = home == NULL ? MPI_ERR_NO_MEM
                      : MPI_Comm_set_attr(comm, zs__notice_keyval, home);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&dup);
      free(home);
      return rc;
    }
    MPI_Comm_set_errhandler(home->comm, MPI_ERRORS_RETURN);
  }
  *out = home->comm;
  *tag = 1 + (int)(home->contexts++ % (unsigned)(tag_ub - 1));
  return MPI_SUCCESS;
}

/* Frees the notices whose sends all completed; with `leave`, hands the
 * others to MPI (MPI_Request_free: they complete on their own, and their
 * text, which MPI may still read, is not freed). */
static void zs__mpi_notice_reap(zs__mpi_impl* impl, int world, int leave) {
  zs__notice_send** at = &impl->notice_sends;
  while (*at != NULL) {
    zs__notice_send* n = *at;
    int done = 0;
    if (MPI_Testall(world, n->reqs, &done, MPI_STATUSES_IGNORE) !=
        MPI_SUCCESS)
      done = 0;
    if (!done && !leave) {
      at = &n->next;
      continue;
    }
    if (!done)
      for (int p = 0; p < world; p++)
        if (n->reqs[p] != MPI_REQUEST_NULL) MPI_Request_free(&n->reqs[p]);
    *at = n->next;
    if (done) free(n->text);
    free(n->reqs);
    free(n);
  }
}

static void zs__mpi_notify(zs__comm* c, const char* msg) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  if (impl->notice_comm == MPI_COMM_NULL) return;
  zs__mpi_notice_reap(impl, c->world, 0);
  zs__notice_send* n = (zs__notice_send*)calloc(1, sizeof *n);
  const size_t len = strnlen(msg, ZS__NOTICE_BYTES - 1) + 1;
  if (n != NULL) n->text = (char*)malloc(len);
  if (n != NULL)
    n->reqs = (MPI_Request*)malloc((size_t)c->world * sizeof(MPI_Request));
  if (n == NULL || n->text == NULL || n->reqs == NULL) { /* timeouts stay */
    if (n != NULL) free(n->text), free(n->reqs);
    free(n);
    return;
  }
  memcpy(n->text, msg, len - 1);
  n->text[len - 1] = '\0';
  for (int p = 0; p < c->world; p++) {
    n->reqs[p] = MPI_REQUEST_NULL;
    if (p != c->rank)
      MPI_Isend(n->text, (int)len, MPI_CHAR, p, impl->notice_tag,
                impl->notice_comm, &n->reqs[p]);
  }
  n->next = impl->notice_sends;
  impl->notice_sends = n;
}

/* Posts the receive of the next notice from any rank. */
static int zs__mpi_notice_listen(zs__mpi_impl* impl) {
  return MPI_Irecv(impl->notice_in, (int)sizeof impl->notice_in, MPI_CHAR,
                   MPI_ANY_SOURCE, impl->notice_tag, impl->notice_comm,
                   &impl->notice_recv);
}

static int zs__mpi_poll_notice(zs__comm* c, int* rank, char* msg,
                               size_t cap) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  if (impl->notice_recv == MPI_REQUEST_NULL) return 0;
  int flag = 0;
  MPI_Status status;
  if (MPI_Test(&impl->notice_recv, &flag, &status) != MPI_SUCCESS || !flag)
    return 0;
  impl->notice_in[sizeof impl->notice_in - 1] = '\0';
  *rank = status.MPI_SOURCE;
  snprintf(msg, cap, "%s", impl->notice_in);
  /* listen for the next one (another rank may fail at an earlier point) */
  if (zs__mpi_notice_listen(impl) != MPI_SUCCESS)
    impl->notice_recv = MPI_REQUEST_NULL;
  return 1;
}

/* The receive is withdrawn (or completes, if a notice matched it) and the
 * sends are left to MPI; the notice communicator stays. */
static void zs__mpi_notice_end(zs__mpi_impl* impl, int world) {
  if (impl->notice_recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&impl->notice_recv);
    MPI_Wait(&impl->notice_recv, MPI_STATUS_IGNORE);
  }
  zs__mpi_notice_reap(impl, world, 1);
  impl->notice_comm = MPI_COMM_NULL;
}

static void zs__mpi_destroy(zs__comm* c) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  zs__mpi_progress_stop(impl);
  for (int l = 0; l < ZS__SHM_LANES; l++) {
    if (impl->shm[l] == NULL) continue;
    if (c->failed) zs__shm_abort(impl->shm[l], c->failed_why);
    zs__shm_destroy(impl->shm[l]);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    zs__mpi_notice_end(impl, c->world);
    if (impl->probe_live) MPI_Comm_free(&impl->probe_comm);
    /* (after a failure a control collective may still be pending) */
    if (impl->ctrl_comm != MPI_COMM_NULL && !c->failed)
      MPI_Comm_free(&impl->ctrl_comm);
    /* After a failure another rank's messages for a collective this rank
     * never joined may still arrive: freed, the communicator's context id
     * could go to a later one, where Open MPI would deliver them (see the
     * failure notices above). It is left to MPI_Finalize. */
    if (!c->failed) MPI_Comm_free(&impl->comm);
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

static int zs__mpi_alive(const zs__comm* c) {
  (void)c;
  int finalized = 0;
  MPI_Finalized(&finalized); /* callable after MPI_Finalize */
  return !finalized;
}

/* Collectives and point-to-point operations pair up independently. */
static int zs__mpi_lane(zs__comm* c, zs__call call, const void* buf) {
  (void)c;
  (void)buf;
  /* (with shared memory the same: each lane has a segment and a worker of
   * its own) */
  return call == ZS__CALL_EXCHANGE || call == ZS__CALL_ALL_GATHER_STRIDED ||
         call == ZS__CALL_GATHER_USERS;
}

static zs_status zs__mpi_ctrl_all_reduce(zs__comm* c, void* buf,
                                         size_t count, zs_dtype dtype,
                                         zs__red_op op, zs__comm_req** req) {
  return zs__mpi_all_reduce_on(((zs__mpi_impl*)c->impl)->ctrl_comm,
                               ZS__IN_PLACE, buf, count, dtype, op,
                               "control all-reduce", req);
}

static zs_status zs__mpi_ctrl_broadcast(zs__comm* c, void* buf, size_t count,
                                        zs_dtype dtype, int root,
                                        zs__comm_req** req) {
  return zs__mpi_broadcast_on(((zs__mpi_impl*)c->impl)->ctrl_comm, buf, count,
                              dtype, root, "control broadcast", req);
}

zs_status zs__comm_mpi_heartbeat(zs__comm* mpi, zs__comm* owner,
                                 double timeout_s) {
  if (mpi->world == 1 || timeout_s <= 0) return ZS_OK;
  MPI_Comm comm = zs__mpi_comm(mpi);
  zs__heartbeat* hb = NULL;
  zs__hb_record mine;
  zs_status st = zs__hb_listen(mpi->rank, mpi->world, timeout_s, &hb, &mine);
  char why[512] = "";
  if (st != ZS_OK) snprintf(why, sizeof why, "%s", zs__error_body());
  zs__hb_record* all =
      (zs__hb_record*)calloc((size_t)mpi->world, sizeof *all);
  if (all == NULL) mine.ok = 0;
  int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE,
                         all != NULL ? (void*)all : (void*)&mine,
                         all != NULL ? (int)sizeof mine : 0, MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) {
    free(all);
    zs__hb_destroy(hb);
    return zs__mpi_fail(rc, "heartbeat: Allgather of the addresses");
  }
  if (st == ZS_OK && all == NULL)
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "heartbeat: addresses");
  /* (a rank that could not listen is the cause; the others only see
   * that it could not: its own reason is the one to give) */
  int blame = st != ZS_OK ? 3 : 0;
  if (st == ZS_OK) {
    st = zs__hb_start(hb, all);
    blame = zs__hb_blame(hb);
  }
  if (st != ZS_OK && why[0] == '\0')
    snprintf(why, sizeof why, "%s", zs__error_body());
  free(all);
  /* every rank the same outcome: the reason that says most about the
   * cause (its own listen, then reaching its neighbour, then a neighbour
   * that never came), the lowest such rank's */
  int key = st != ZS_OK ? blame * mpi->world + (mpi->world - 1 - mpi->rank)
                        : -1, best = -1;
  rc = MPI_Allreduce(&key, &best, 1, MPI_INT, MPI_MAX, comm);
  if (rc == MPI_SUCCESS && best >= 0) {
    const int first = mpi->world - 1 - best % mpi->world;
    char theirs[512];
    memcpy(theirs, why, sizeof theirs);
    int code = (int)st;
    rc = MPI_Bcast(theirs, (int)sizeof theirs, MPI_CHAR, first, comm);
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&code, 1, MPI_INT, first, comm);
    zs__hb_destroy(hb);
    if (rc != MPI_SUCCESS) return zs__mpi_fail(rc, "heartbeat: Bcast");
    theirs[sizeof theirs - 1] = '\0';
    return zs__error((zs_status)code, "rank %d: %s", first, theirs);
  }
  if (rc != MPI_SUCCESS) {
    zs__hb_destroy(hb);
    return zs__mpi_fail(rc, "heartbeat: Allreduce");
  }
  owner->hb = hb;
  return ZS_OK;
}

/* ---- Shared-memory host collectives: setup ------------------------------ */

static void zs__mpi_abort(zs__comm* c) {
  zs__mpi_impl* impl = (zs__mpi_impl*)c->impl;
  for (int l = 0; l < ZS__SHM_LANES; l++)
    if (impl->shm[l] != NULL) zs__shm_abort(impl->shm[l], c->failed_why);
}

/* The backend with shared-memory host collectives: zs__mpi_ops plus the
 * one-call fixed-order reduce-scatter and the worker's abort. */
static zs__comm_ops zs__mpi_shm_ops;
static pthread_once_t zs__mpi_shm_once = PTHREAD_ONCE_INIT;
static const zs__comm_ops zs__mpi_ops;

static void zs__mpi_idle(zs__comm* c, zs__comm_req* req) {
  (void)c;
  if (req->shm != NULL) zs__shm_idle(req->shm, 0.001);
  else sched_yield();
}

static void zs__mpi_shm_ops_init(void) {
  zs__mpi_shm_ops = zs__mpi_ops;
  zs__mpi_shm_ops.name = "mpi+shm";
  zs__mpi_shm_ops.reduce_scatter_fixed = zs__mpi_reduce_scatter_fixed;
  zs__mpi_shm_ops.abort = zs__mpi_abort;
  zs__mpi_shm_ops.idle = zs__mpi_idle;
}

zs_status zs__comm_mpi_host_collectives(zs__comm* mpi,
                                        zs_host_collectives mode,
                                        size_t* segment_bytes) {
  *segment_bytes = 0;
  zs__mpi_impl* impl = (zs__mpi_impl*)mpi->impl;
  if (mpi->world == 1 || mode == ZS_HOST_COLLECTIVES_MPI || impl->shm[0] != NULL)
    return ZS_OK;
  if (mpi->local_size != mpi->world) {
    if (mode == ZS_HOST_COLLECTIVES_SHM)
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "host_collectives shm: the %d ranks are not all on "
                       "one host (this host has %d of them); shared memory "
                       "needs them on one: use auto or mpi", mpi->world,
                       mpi->local_size);
    return ZS_OK;
  }
  MPI_Comm comm = impl->comm;
  /* rank 0 names and makes a segment per lane; the others attach */
  char path[ZS__SHM_LANES][PATH_MAX];
  int made_here[ZS__SHM_LANES] = {0}; /* rank 0: files to remove */
  memset(path, 0, sizeof path);
  zs__shm* shm[ZS__SHM_LANES] = {NULL};
  zs_status st = ZS_OK;
  if (mpi->rank == 0) {
    static unsigned made;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int l = 0; st == ZS_OK && l < ZS__SHM_LANES; l++) {
      const int n = snprintf(path[l], sizeof path[l],
                             "%s/zeroshard-%d-%u-%lx-%d", zs__shm_dir(),
                             (int)getpid(), made, (unsigned long)ts.tv_nsec,
                             l);
      if (n < 0 || (size_t)n >= sizeof path[l])
        st = zs__error(ZS_ERR_INVALID_ARGUMENT, "shared-memory segment: "
                       "ZS_SHM_DIR is too long (%zu characters; a path "
                       "holds at most %d)", strlen(zs__shm_dir()),
                       PATH_MAX - 1);
      else
        st = zs__shm_open(path[l], 1, 0, mpi->world, &shm[l]);
      made_here[l] = st == ZS_OK;
    }
    made++;
    if (st != ZS_OK) { /* the lanes made are of no use: removed now */
      for (int l = 0; l < ZS__SHM_LANES; l++)
        if (made_here[l]) zs__shm_unlink(path[l]);
      memset(made_here, 0, sizeof made_here);
      path[0][0] = '\0'; /* (tells the others) */
    }
  }
  int rc = MPI_Bcast(path, (int)sizeof path, MPI_CHAR, 0, comm);
  if (rc == MPI_SUCCESS && mpi->rank != 0 && path[0][0] != '\0')
    for (int l = 0; st == ZS_OK && l < ZS__SHM_LANES; l++)
      st = zs__shm_open(path[l], 0, mpi->rank, mpi->world, &shm[l]);
  else if (rc == MPI_SUCCESS && mpi->rank != 0)
    st = zs__error(ZS_ERR_IO, "rank 0 could not make the segment");
  /* every rank the same outcome: the lowest failing rank's reason */
  char why[512] = "";
  if (st != ZS_OK) snprintf(why, sizeof why, "%s", zs__error_body());
  int key = st != ZS_OK ? mpi->world - mpi->rank : 0, best = 0;
  if (rc == MPI_SUCCESS)
    rc = MPI_Allreduce(&key, &best, 1, MPI_INT, MPI_MAX, comm);
  if (rc == MPI_SUCCESS && best > 0)
    rc = MPI_Bcast(why, (int)sizeof why, MPI_CHAR, mpi->world - best, comm);
  for (int l = 0; l < ZS__SHM_LANES; l++)
    if (made_here[l]) zs__shm_unlink(path[l]);
  if (rc != MPI_SUCCESS || best > 0)
    for (int l = 0; l < ZS__SHM_LANES; l++) zs__shm_destroy(shm[l]);
  if (rc != MPI_SUCCESS)
    return zs__mpi_fail(rc, "host collectives: setting up the segment");
  if (best > 0) {
    why[sizeof why - 1] = '\0';
    if (mode == ZS_HOST_COLLECTIVES_SHM)
      return zs__error(ZS_ERR_IO, "host_collectives shm: rank %d: %s",
                       mpi->world - best, why);
    if (mpi->rank == 0)
      zs__log(ZS_LOG_WARN, "host collectives: shared memory unavailable, "
              "using MPI's (rank %d: %s)", mpi->world - best, why);
    return ZS_OK;
  }
  pthread_once(&zs__mpi_shm_once, zs__mpi_shm_ops_init);
  for (int l = 0; l < ZS__SHM_LANES; l++) impl->shm[l] = shm[l];
  mpi->ops = &zs__mpi_shm_ops;
  *segment_bytes = ZS__SHM_LANES * ZS__SHM_RANK_BYTES;
  return ZS_OK;
}

static const zs__comm_ops zs__mpi_ops = {
    "mpi",
    zs__mpi_all_gather,
    zs__mpi_reduce_scatter,
    zs__mpi_all_reduce,
    zs__mpi_broadcast,
    zs__mpi_exchange,
    zs__mpi_all_gather_strided,
    zs__mpi_wait,
    zs__mpi_test,
    zs__mpi_start_progress,
    zs__mpi_destroy,
    zs__mpi_notify,
    zs__mpi_poll_notice,
    NULL, /* MPI requests need no abort: their buffers are kept */
    zs__mpi_alive,
    zs__mpi_lane,
    zs__mpi_ctrl_all_reduce,
    zs__mpi_ctrl_broadcast,
    zs__mpi_gather_users,
    NULL, /* reduce-scatter: an exchange and a sum */
    NULL, /* waits yield */
    NULL, /* host memory: nothing to chain on a device */
    NULL, /* no device timeline */
    NULL, /* reduce-scatter sums at completion */
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
  int* ub = NULL;
  int has_ub = 0;
  MPI_Comm_get_attr(impl->comm, MPI_TAG_UB, &ub, &has_ub);
  impl->tag_ub = has_ub && ub != NULL && *ub > 2 ? *ub : 32767;
  MPI_Comm_rank(impl->comm, &c->rank);
  MPI_Comm_size(impl->comm, &c->world);
  /* The ranks sharing this node (the device backend picks a GPU by it). */
  MPI_Comm node = MPI_COMM_NULL;
  c->local_rank = 0;
  c->local_size = 1;
  if (MPI_Comm_split_type(impl->comm, MPI_COMM_TYPE_SHARED, c->rank,
                          MPI_INFO_NULL, &node) == MPI_SUCCESS &&
      node != MPI_COMM_NULL) {
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
  }
  impl->notice_recv = MPI_REQUEST_NULL;
  impl->notice_comm = MPI_COMM_NULL;
  impl->ctrl_comm = MPI_COMM_NULL;
  if (c->world > 1) {
    rc = zs__notice_join(comm, impl->tag_ub, &impl->notice_comm,
                         &impl->notice_tag);
    if (rc == MPI_SUCCESS) rc = zs__mpi_notice_listen(impl);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(impl->comm, &impl->ctrl_comm);
    if (rc == MPI_SUCCESS)
      MPI_Comm_set_errhandler(impl->ctrl_comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      zs_status st = zs__mpi_fail(rc, "failure-notice setup");
      zs__mpi_notice_end(impl, c->world);
      if (impl->ctrl_comm != MPI_COMM_NULL) MPI_Comm_free(&impl->ctrl_comm);
      MPI_Comm_free(&impl->comm);
      free(c);
      free(impl);
      return st;
    }
  }
  c->ops = &zs__mpi_ops;
  c->impl = impl;
  c->seq_hash = ZS__FNV_SEED;
  c->notice_from = -1;
  c->discard_from = -1;
  c->discard_origin = -1;
  c->max_count = (size_t)INT_MAX; /* MPI counts are ints */
  *out = c;
  return ZS_OK;
}

zs_status zs__comm_mpi_split(zs__comm* mpi, int color, int key,
                             zs__comm** out) {
  zs__mpi_impl* impl = (zs__mpi_impl*)mpi->impl;
  MPI_Comm sub = MPI_COMM_NULL;
  *out = NULL;
  const int rc = MPI_Comm_split(impl->comm, color, key, &sub);
  if (rc != MPI_SUCCESS) return zs__mpi_fail(rc, "Comm_split");
  zs_status st = zs__comm_mpi_create(sub, out);
  MPI_Comm_free(&sub);
  return st;
}

void zs__comm_mpi_name_ranks(zs__comm* mpi, int first, int stride) {
  zs__mpi_impl* impl = (zs__mpi_impl*)mpi->impl;
  mpi->name_first = first;
  mpi->name_stride = stride;
  for (int l = 0; l < ZS__SHM_LANES; l++)
    zs__shm_set_rank_names(impl->shm[l], first, stride);
}
