/*
 * context.h — the context object shared by the layers above: validated
 * configuration, rank and world size, accounting, device and communicator,
 * CPU offload's workers. It knows nothing of models, drivers or NVMe
 * offload: the engine keeps its state in ctx->engine and attaches its
 * teardown to ctx->hooks.
 */
#ifndef ZS_RUNTIME_CONTEXT_H_
#define ZS_RUNTIME_CONTEXT_H_

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/core/core.h"
#include "runtime/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zs_context {
  zs_config config;
  int rank;
  int world;
  zs__accounting* acct; /* owned */
  int log_counted;       /* the communication log is in the accounting */
  size_t segment_bytes;  /* this rank's part of the shared-memory segment
                            of host collectives, in the accounting
                            (comm_segment) under its own address; 0: none */
  zs__device* device;   /* owned */
  zs__device* host;     /* the host backend, for buffers in host memory
                           (CPU offload); == device on the host backend,
                           else owned */
  zs__comm* comm;       /* owned; may finalize MPI when destroyed */
  /* Hybrid sharding (config.shard_group_size G; docs/running.md, "Shard
   * groups"): units are sharded over the shard group (ranks G*g ..
   * G*g+G-1, this rank its shard_rank-th) and replicated across the
   * replica group (ranks j, j+G, j+2G, ...: one per shard group, this rank
   * its replica_rank-th). Without it the shard group is every rank. */
  zs__comm* shard_comm;   /* == comm (G == world), or owned */
  zs__comm* replica_comm; /* NULL (one replica), or owned */
  int shard_rank, shard_ranks;   /* this rank in its shard group; G */
  int replica_rank, replicas;    /* this rank in its replica group; W / G */
  zs__profiler* prof;   /* owned; NULL: not profiling */
  struct zs__offload* offload; /* owned; NULL: no CPU offload */
  struct zs__engine_ctx* engine; /* the engine's state (its models, NVMe
                                    offload's queue): made and torn down
                                    by the engine (a hook below) */
  zs__hook* hooks;        /* what the layers above attached, run by
                             zs_context_destroy (last attached first) */
  uint64_t run_id;        /* the same on every rank */
  unsigned int caller_version; /* ZS_VERSION_CODE of the header the caller
                                  built against (its config's version):
                                  the layout of the output structs it
                                  passes (core_compat.c) */
};

/* Counts `bytes` more of the communicators' shared-memory segments under
 * comm_segment (removed by zs_context_destroy). Errors: OUT_OF_MEMORY. */
zs_status zs__context_count_segment(zs_context* ctx, size_t bytes);

/* Builds a context around an existing communicator (takes ownership of comm
 * even on failure). Validates the config and checks it is identical on every
 * rank (collective). */
zs_status zs__context_create(const zs_config* config, zs__comm* comm,
                             zs_context** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CONTEXT_H_ */
