/*
 * zs_mpi.h — the MPI entry point of ZeroShard, kept out of zeroshard.h so
 * that code which never sees an MPI type need not include mpi.h.
 */
#ifndef ZS_MPI_H_
#define ZS_MPI_H_

#include <mpi.h>

#include "zeroshard.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default) /* exported: see zeroshard.h */
#endif

/* Creates a context over `comm`, the data-parallel group (docs/api.md,
 * "1. Context").
 *  - comm is duplicated: ZeroShard's traffic never matches the caller's;
 *    the caller keeps comm, MPI's initialization and its finalization
 *    (after zs_context_destroy).
 *  - MPI_THREAD_MULTIPLE lets a progress thread overlap collectives.
 *  - Set MPI_ERRORS_RETURN on MPI_COMM_WORLD (Open MPI reports some
 *    collectives' failures there); a warning says so once otherwise.
 *  - Collective over comm. [experimental] across several hosts: nothing
 *    multi-host has run yet.
 * @return as zs_context_create; INVALID_ARGUMENT (MPI_COMM_NULL, MPI not
 *         initialized). */
zs_status zs_context_create_mpi(const zs_config* config, MPI_Comm comm,
                                zs_context** out);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZS_MPI_H_ */
