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
  uint64_t seq_hash;  /* every collective since creation, in order */
  uint64_t seq_count;
  double timeout_s;   /* 0: wait forever */
  int failed;         /* a collective timed out: MPI may still write into
                         its buffers, so nothing may be freed or issued */
  size_t max_count;   /* most elements per rank one collective can move */
};

/* ---- Wrappers the engine calls ------------------------------------------ */

/* What a collective is for. Hashed together with the unit, so that ranks
 * which issue collectives of the same sizes for different units (e.g. two
 * equally sized blocks in a different order) are caught. */
typedef enum zs__purpose {
  ZS__P_CHECK = 1,        /* cross-rank consistency checks */
  ZS__P_AGREE = 2,        /* agreeing on a status */
  ZS__P_GATHER = 3,       /* stage-3 all-gather of a unit's parameters */
  ZS__P_REDUCE = 4,       /* reduce-scatter of a unit's gradients */
  ZS__P_GRAD_GATHER = 5,  /* stage-0 all-gather of reduced gradients */
  ZS__P_PARAM_GATHER = 6, /* stage 1-2 all-gather of updated parameters */
  ZS__P_INIT = 7,         /* initialization broadcasts */
  ZS__P_SET = 8,          /* zs_tensor_set */
  ZS__P_GET = 9           /* zs_tensor_get */
} zs__purpose;

typedef struct zs__coll_tag {
  zs__purpose purpose;
  int unit;         /* -1 when not about a unit */
  const char* name; /* the unit's name, for messages (may be NULL) */
} zs__coll_tag;

static inline zs__coll_tag zs__tag(zs__purpose p, int unit, const char* name) {
  zs__coll_tag t = {p, unit, name};
  return t;
}

/* Each wrapper starts the collective, then waits for it while polling, so
 * that a collective another rank never joins becomes ZS_ERR_TIMEOUT naming
 * the collective and the unit (after c->timeout_s; a warning is logged every
 * minute before that) instead of a silent hang. A timed-out collective
 * cannot be cancelled: the context is unusable afterwards. Every call is
 * counted and folded into c->seq_hash, which is cumulative since the
 * communicator was created. */
zs_status zs__comm_all_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype);
zs_status zs__comm_reduce_scatter(zs__comm* c, zs__coll_tag tag,
                                  const void* send, void* recv, size_t count,
                                  zs_dtype dtype, zs__red_op op);
zs_status zs__comm_all_reduce(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype,
                              zs__red_op op);
zs_status zs__comm_broadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                             size_t count, zs_dtype dtype, int root);

/* Collective agreement on a status: ZS_OK on every rank if `local` is ZS_OK
 * everywhere. Otherwise the lowest failing rank's message is broadcast;
 * that rank (and any other failing rank) returns its own status, the others
 * ZS_ERR_REMOTE "<what> failed on rank R: <its message>". One all-reduce of
 * two integers, plus one broadcast on failure. */
zs_status zs__comm_agree(zs__comm* c, zs_status local, const char* what);

/* The two halves of zs__comm_agree, for callers that fold the agreement
 * into an all-reduce of their own: the code this rank contributes (reduce
 * with MAX), and the finish given the reduced code (0: all OK). */
uint64_t zs__comm_agree_code(const zs__comm* c, zs_status local);
zs_status zs__comm_agree_finish(zs__comm* c, zs_status local,
                                uint64_t worst_code, const char* what);

/* Collective. ZS_OK if `desc` (len bytes of '\n'-separated lines) is
 * identical on every rank. Otherwise ZS_ERR_MISMATCH on every rank, with a
 * message naming the first rank that differs from rank 0 and the first line
 * where they differ: "<what> differs across ranks: rank 2 has '...' where
 * rank 0 has '...'". Costs one all-gather of 16 bytes per rank when they
 * agree, plus two broadcasts when they do not. */
zs_status zs__comm_check_same(zs__comm* c, const char* what, const char* desc,
                              size_t len);

/* free() for host blocks that a collective used: after a timeout the block
 * is kept (leaked), because the abandoned collective may still write it. */
void zs__comm_free(const zs__comm* c, void* p);

void zs__comm_destroy(zs__comm* c);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_H_ */
