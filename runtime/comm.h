/*
 * comm.h — the communicator backend interface: all-gather, reduce-scatter,
 * all-reduce and broadcast, each blocking (req == NULL) or non-blocking
 * (a request completed by wait/test). One vtable per backend: MPI over host
 * memory (comm_mpi.c) here, NCCL over device memory later. The engine calls
 * only the zs__comm_* wrappers below, which count every call (calls, bytes
 * as nccl-tests counts them, time) and fold it into a per-step sequence
 * hash so ranks can check they issued the same collectives.
 *
 * Counts are in ELEMENTS of the given dtype.
 */
#ifndef ZS_RUNTIME_COMM_H_
#define ZS_RUNTIME_COMM_H_

#include "runtime/core.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zs__red_op { ZS__RED_SUM = 0, ZS__RED_MAX = 1, ZS__RED_MIN = 2 } zs__red_op;

/* Marks an in-place send buffer (MPI_IN_PLACE semantics: for all-gather the
 * rank's block is read from recv + rank * count; for all-reduce from recv). */
#define ZS__IN_PLACE ((const void*)(intptr_t)-1)

typedef struct zs__comm zs__comm;
typedef struct zs__comm_req zs__comm_req;

typedef struct zs__comm_ops {
  const char* name;
  /* recv: count * world elements; send: count elements or ZS__IN_PLACE. */
  zs_status (*all_gather)(zs__comm* c, const void* send, void* recv,
                          size_t count, zs_dtype dtype, zs__stream* stream,
                          zs__comm_req** req);
  /* send: count * world elements; recv: count elements (rank's block of the
   * element-wise reduction). send and recv must not overlap. */
  zs_status (*reduce_scatter)(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype, zs__red_op op,
                              zs__stream* stream, zs__comm_req** req);
  /* send, recv: count elements; send may be ZS__IN_PLACE. */
  zs_status (*all_reduce)(zs__comm* c, const void* send, void* recv,
                          size_t count, zs_dtype dtype, zs__red_op op,
                          zs__stream* stream, zs__comm_req** req);
  zs_status (*broadcast)(zs__comm* c, void* buf, size_t count, zs_dtype dtype,
                         int root, zs__stream* stream, zs__comm_req** req);
  /* Completes and frees req. */
  zs_status (*wait)(zs__comm* c, zs__comm_req* req);
  /* Sets *done; a completed req is freed. */
  zs_status (*test)(zs__comm* c, zs__comm_req* req, int* done);
  void (*destroy)(zs__comm* c);
} zs__comm_ops;

struct zs__comm {
  const zs__comm_ops* ops;
  int rank;
  int world;
  void* impl;
  zs_comm_counters counters;
  uint64_t seq_hash;  /* collectives since the last zs__comm_seq_reset */
  uint64_t seq_count;
};

/* ---- Wrappers the engine calls (count, hash, then dispatch) ---- */

zs_status zs__comm_all_gather(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype);
zs_status zs__comm_reduce_scatter(zs__comm* c, const void* send, void* recv,
                                  size_t count, zs_dtype dtype, zs__red_op op);
zs_status zs__comm_all_reduce(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype, zs__red_op op);
zs_status zs__comm_broadcast(zs__comm* c, void* buf, size_t count,
                             zs_dtype dtype, int root);

/* Starts a new sequence (the engine calls it at the end of every step). */
void zs__comm_seq_reset(zs__comm* c);

/* Collective. ZS_OK if `desc` (len bytes of '\n'-separated lines) is
 * identical on every rank. Otherwise ZS_ERR_MISMATCH on every rank, with a
 * message naming the first rank that differs from rank 0 and the first line
 * where they differ: "<what> differs across ranks: rank 2 has '...' where
 * rank 0 has '...'". Costs one all-gather of 16 bytes per rank when they
 * agree, plus two broadcasts when they do not. */
zs_status zs__comm_check_same(zs__comm* c, const char* what, const char* desc,
                              size_t len);

void zs__comm_destroy(zs__comm* c);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_H_ */
