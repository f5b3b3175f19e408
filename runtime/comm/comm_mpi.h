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

/* Starts the heartbeats (comm_heartbeat.h) of MPI communicator `mpi`'s
 * ranks, owned by `owner` (mpi itself, or the communicator wrapping it,
 * whose waits check them): each rank's listening address is all-gathered
 * on mpi's duplicate (MPI_Allgather, not counted or logged), the ring is
 * connected, and the ranks agree on the outcome (MPI_Allreduce), so every
 * rank returns the same status. Nothing with one rank or timeout_s 0.
 * Collective; blocking (at most about 60 s for a peer that does not
 * connect). Errors: COMM naming the rank and address. */
zs_status zs__comm_mpi_heartbeat(zs__comm* mpi, zs__comm* owner,
                                 double timeout_s);

/* Marks the communicator as one of the owners of an MPI that ZeroShard
 * initialized: destroying the last owner calls MPI_Finalize. */
void zs__comm_mpi_own(zs__comm* c);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_MPI_H_ */
