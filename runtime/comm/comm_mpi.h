/*
 * comm_mpi.h — the MPI communicator backend (host memory). The only
 * runtime file besides context_mpi.c that includes mpi.h.
 */
#ifndef ZS_RUNTIME_COMM_MPI_H_
#define ZS_RUNTIME_COMM_MPI_H_

#include <mpi.h>

#include "runtime/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Duplicates `comm` (so our traffic never matches the caller's), sets
 * MPI_ERRORS_RETURN on the duplicate, and wraps it. Collective. */
zs_status zs__comm_mpi_create(MPI_Comm comm, zs__comm** out);

/* Marks the communicator as one of the owners of an MPI that ZeroShard
 * initialized: destroying the last owner calls MPI_Finalize. */
void zs__comm_mpi_own(zs__comm* c);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_MPI_H_ */
