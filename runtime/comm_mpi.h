/*
 * comm_mpi.h — the MPI communicator backend (host memory). The only
 * runtime file besides context_mpi.c that includes mpi.h.
 */
#ifndef ZS_RUNTIME_COMM_MPI_H_
#define ZS_RUNTIME_COMM_MPI_H_

#include <mpi.h>

#include "runtime/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Duplicates `comm` (so our traffic never matches the caller's), sets
 * MPI_ERRORS_RETURN on the duplicate, and wraps it. If owns_mpi is set,
 * destroying the communicator also calls MPI_Finalize. Collective. */
zs_status zs__comm_mpi_create(MPI_Comm comm, int owns_mpi, zs__comm** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_MPI_H_ */
