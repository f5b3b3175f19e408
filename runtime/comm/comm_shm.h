/*
 * comm_shm.h — collectives on host memory among the ranks of one host,
 * through a shared-memory segment (a file in /dev/shm, or ZS_SHM_DIR)
 * mapped by every rank, run by a worker thread per rank so they proceed
 * while the caller computes. The MPI backend (comm_mpi.c) makes the
 * segment, hands these its host collectives when config.host_collectives
 * says so, and keeps point-to-point and control traffic.
 *
 * Algorithm (DeepSpeed's shm_comm and NCCL's SHM transport use the same
 * shape): each rank owns a slot of two halves of ZS__SHM_HALF_BYTES. A
 * collective runs in rounds; in round g every rank writes its piece into
 * half g % 2 of its slot, publishes `written = g`, waits until every rank
 * wrote round g, reads (copies or sums) what it needs from every slot, and
 * publishes `read = g`; before it writes round g it waits until every
 * rank read round g - 2 (the half it is about to overwrite). Waits spin
 * briefly, then sleep on a futex of the shared counter. Sums go in rank
 * order 0, 1, ..., W-1 in fp32 and round once (zs__host_sum_ranks), the
 * MPI path's fixed order, so results are bitwise the same.
 *
 * Every rank must post the same collectives in the same order (the
 * engine's sequence); each round carries a description of its collective,
 * and a rank that finds another's different fails the collective with
 * ZS_ERR_MISMATCH naming both instead of mixing data.
 *
 * Failures: a rank whose process ended (its pid is gone), or that gave up
 * (zs__shm_abort) or left (zs__shm_destroy) while others wait for it,
 * fails their collective with ZS_ERR_REMOTE naming it; after a failure
 * every later collective fails at once with the same error.
 */
#ifndef ZS_RUNTIME_COMM_SHM_H_
#define ZS_RUNTIME_COMM_SHM_H_

#include <stddef.h>
#include <stdint.h>

#include "runtime/core/core.h"
#include "runtime/core/core_mem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The segment's layout: ZS__SHM_HALF_BYTES (a round moves at most this
 * much per rank), ZS__SHM_CTRL_BYTES (a rank's counters, pid and
 * descriptions) and ZS__SHM_RANK_BYTES (one rank's part, accounted on that
 * rank as comm_segment) are in core_mem.h, where the estimator reads them.
 * The segment is world times ZS__SHM_RANK_BYTES. */

typedef struct zs__shm zs__shm;
typedef struct zs__shm_op zs__shm_op;

typedef enum zs__shm_kind {
  ZS__SHM_ALL_GATHER = 0,         /* comm.h's all_gather */
  ZS__SHM_ALL_GATHER_STRIDED = 1, /* ... all_gather_strided (in place) */
  ZS__SHM_EXCHANGE = 2,           /* ... exchange */
  ZS__SHM_REDUCE_SCATTER = 3,     /* rank-ordered sum of exchanged chunks */
  ZS__SHM_ALL_REDUCE = 4,         /* rank-ordered combine, every rank */
  ZS__SHM_BROADCAST = 5
} zs__shm_kind;

/* A collective's arguments; counts in ELEMENTS of dtype. */
typedef struct zs__shm_args {
  zs__shm_kind kind;
  const void* send;       /* NULL: in place (all-gather: recv + rank *
                             count; all-reduce: recv) */
  void* recv;             /* all-gather: count * world; exchange: chunk *
                             world; reduce-scatter: count (the sum);
                             all-reduce, broadcast: count; strided: buf */
  size_t count;           /* per rank (all-gather, the strided, exchanged
                             and reduced chunk), or in all (all-reduce,
                             broadcast) */
  zs_dtype dtype;
  const size_t* offsets;  /* exchange, reduce-scatter: world entries (rank
                             r's chunk is at send + offsets[r]); copied */
  size_t offset, stride;  /* strided: rank r's chunk at recv + r * stride +
                             offset */
  float divisor;          /* reduce-scatter: the sum is divided by it */
  int op;                 /* all-reduce: 0 sum, 1 max, 2 min (zs__red_op) */
  int root;               /* broadcast */
} zs__shm_args;

/* Bytes of the segment for `world` ranks. */
static inline size_t zs__shm_segment_bytes(int world) {
  return (size_t)world * ZS__SHM_RANK_BYTES;
}

/* Creates (create = 1: one rank, before the others attach; O_EXCL, every
 * page allocated now so a full file system fails here, not as SIGBUS
 * later) or attaches to (create = 0) the segment file `path`, and starts
 * this rank's worker thread. The caller unlinks the file (zs__shm_unlink)
 * once every rank attached. Errors: IO naming the path and errno (ENOSPC:
 * /dev/shm full), OUT_OF_MEMORY, INTERNAL (no thread). */
/* Messages name rank r of the segment as the context's rank first + r *
 * stride (a group's ranks; default 0 and 1). NULL is ignored. */
void zs__shm_set_rank_names(zs__shm* s, int first, int stride);

zs_status zs__shm_open(const char* path, int create, int rank, int world,
                       zs__shm** out);
/* Removes the segment's name (the mapping stays); any rank may call it. */
void zs__shm_unlink(const char* path);
/* The directory segments are made in: $ZS_SHM_DIR, else /dev/shm. */
const char* zs__shm_dir(void);

/* Queues a collective and returns at once; the worker runs queued
 * collectives in order. The buffers must stay valid (and send untouched)
 * until zs__shm_done says so. Errors: OUT_OF_MEMORY, INVALID_ARGUMENT (a
 * bad root or dtype for the operation), or a failed segment's error. */
zs_status zs__shm_post(zs__shm* s, const zs__shm_args* a, zs__shm_op** out);
/* 1 once op completed (the worker no longer touches its buffers). Never
 * blocks. */
int zs__shm_done(const zs__shm_op* op);
/* Sleeps until op completes, or for at most max_s seconds. */
void zs__shm_idle(const zs__shm_op* op, double max_s);
/* The status of a completed op (with its error message set in the calling
 * thread), and op freed. */
zs_status zs__shm_finish(zs__shm_op* op);
/* This rank gives up: the collective in progress (at its next wait, within
 * 5 ms) and everything queued fail with ZS_ERR_COMM and `why`, and ranks
 * waiting for this one fail with ZS_ERR_REMOTE. Returns at once (the
 * caller keeps the buffers of collectives in flight, as after any
 * failure: comm.h). Local. */
void zs__shm_abort(zs__shm* s, const char* why);
/* Stops the worker (aborting what is queued) and unmaps the segment;
 * outstanding ops must have been finished. */
void zs__shm_destroy(zs__shm* s);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_SHM_H_ */
