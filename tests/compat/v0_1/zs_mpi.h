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

/* Creates a context over `comm`, the data-parallel group (e.g. one of the
 * sub-communicators of a tensor/pipeline-parallel layout). The communicator
 * is duplicated (MPI_Comm_dup), so ZeroShard's traffic never matches the
 * caller's messages; the caller keeps ownership of `comm` and may free it
 * after this call. MPI must already be initialized, and the caller
 * finalizes it after zs_context_destroy. MPI_THREAD_MULTIPLE (from
 * MPI_Init_thread) lets a progress thread advance collectives while the
 * caller computes; at a lower level ZeroShard makes every MPI call from the
 * calling thread and says once that there is no progress thread.
 * Set MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) after
 * MPI_Init: Open MPI reports some failures of non-blocking collectives on
 * MPI_COMM_WORLD whatever communicator they ran on, and its default handler
 * would end the job where ZeroShard returns ZS_ERR_COMM (zs_context_create,
 * which starts MPI itself, sets it; this call warns once when it is not
 * set, and leaves the caller's handler alone). Collective over comm.
 * Otherwise as zs_context_create. Errors: INVALID_ARGUMENT (MPI_COMM_NULL,
 * MPI not initialized), and those of zs_context_create. */
zs_status zs_context_create_mpi(const zs_config* config, MPI_Comm comm,
                                zs_context** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZS_MPI_H_ */
