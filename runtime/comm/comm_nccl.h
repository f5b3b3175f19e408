/*
 * comm_nccl.h — the NCCL communicator backend (comm_nccl.c) used with the
 * CUDA device backend: device-memory collectives on NCCL, host-memory ones
 * on the MPI communicator it wraps.
 */
#ifndef ZS_RUNTIME_COMM_NCCL_H_
#define ZS_RUNTIME_COMM_NCCL_H_

#include "runtime/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds an NCCL communicator over the ranks of `host` (an MPI
 * communicator, whose ownership it takes, also on failure): selects GPU
 * host->local_rank, loads libnccl.so.2 (dlopen), rank 0's ncclGetUniqueId
 * broadcast over MPI, ncclCommInitRank. With one rank no NCCL is loaded:
 * collectives are device copies (the environment variable
 * ZS_NCCL_ONE_RANK=1 makes one rank use NCCL all the same, a one-rank
 * NCCL communicator: how a machine with one GPU checks the NCCL path).
 * Collective. Errors (agreed on every
 * rank): UNSUPPORTED (no usable GPU; NCCL not loadable with several ranks,
 * with dlopen's reason), INVALID_ARGUMENT (more ranks on the node than
 * GPUs, naming the rank), DEVICE, COMM (a NCCL error, named),
 * OUT_OF_MEMORY. */
zs_status zs__comm_nccl_create(zs__comm* host, zs__comm** out);

/* The staged device communicator (ZS_DEVICE_COMM=staged; docs/cuda.md,
 * "Several ranks on one GPU"): as zs__comm_nccl_create, but without NCCL:
 * device collectives are copied through page-locked host buffers and run
 * on `stage` (an MPI communicator of the same ranks, used for nothing
 * else) from host functions queued on the
 * communication stream, so ranks may share a GPU. Takes host and stage,
 * also on failure. Collective. Errors: as zs__comm_nccl_create's, but for
 * NCCL's. */
zs_status zs__comm_staged_create(zs__comm* host, zs__comm* stage,
                                 zs__comm** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_NCCL_H_ */
