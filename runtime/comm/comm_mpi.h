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

/* Moves the host-memory collectives of MPI communicator `mpi` to a
 * shared-memory segment (comm_shm.h) as `mode` says: AUTO when more than
 * one rank and all on this host (MPI_COMM_TYPE_SHARED), SHM the same but
 * an error when they are not; nothing for MPI or one rank. Rank 0 makes
 * the segment (in $ZS_SHM_DIR, else /dev/shm) and broadcasts its name,
 * the others attach, the ranks agree on the outcome (every rank returns
 * the same), and the name is removed at once (nothing is left behind
 * whatever happens later). *segment_bytes: this rank's part (bytes; 0:
 * none), for the accounting. Collective; blocking. Errors (SHM; AUTO falls
 * back to MPI with a warning instead): INVALID_ARGUMENT (ranks on several
 * hosts), IO naming the rank, path and errno (ENOSPC: the file system is
 * full). */
zs_status zs__comm_mpi_host_collectives(zs__comm* mpi,
                                        zs_host_collectives mode,
                                        size_t* segment_bytes);

/* Marks the communicator as one of the owners of an MPI that ZeroShard
 * initialized: destroying the last owner calls MPI_Finalize. */
void zs__comm_mpi_own(zs__comm* c);

/* A communicator of the ranks of mpi (an MPI communicator of
 * zs__comm_mpi_create) with the same `color`, ordered by `key`
 * (MPI_Comm_split; collective over mpi): hybrid sharding's shard and
 * replica groups. Errors: COMM, OUT_OF_MEMORY. */
zs_status zs__comm_mpi_split(zs__comm* mpi, int color, int key,
                             zs__comm** out);

/* Messages about a group's shared-memory peers name its r-th rank as the
 * context's rank first + r * stride. */
void zs__comm_mpi_name_ranks(zs__comm* mpi, int first, int stride);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_MPI_H_ */
