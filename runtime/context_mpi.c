/*
 * context_mpi.c — the MPI entry points: zs_context_create over
 * MPI_COMM_WORLD (initializing MPI if needed) and zs_context_create_mpi over
 * a caller's communicator.
 */
#include <zs_mpi.h>

#include "runtime/comm_mpi.h"
#include "runtime/context.h"

zs_status zs_context_create_mpi(const zs_config* config, MPI_Comm comm,
                                zs_context** out) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "zs_context_create_mpi: config and out must not be NULL");
  int initialized = 0;
  MPI_Initialized(&initialized);
  ZS_REQUIRE(initialized, "zs_context_create_mpi: MPI is not initialized; "
             "call MPI_Init_thread first or use zs_context_create");
  ZS_REQUIRE(comm != MPI_COMM_NULL,
             "zs_context_create_mpi: comm is MPI_COMM_NULL");
  zs__comm* c = NULL;
  zs_status st = zs__comm_mpi_create(comm, 0, &c);
  if (st != ZS_OK) return st;
  return zs__context_create(config, c, out);
}

zs_status zs_context_create(const zs_config* config, zs_context** out) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "zs_context_create: config and out must not be NULL");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  ZS_REQUIRE(!finalized, "zs_context_create: MPI was already finalized");
  int owns = 0;
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      return zs__error(ZS_ERR_COMM, "MPI_Init_thread failed (code %d)", rc);
    owns = 1;
  }
  zs__comm* c = NULL;
  zs_status st = zs__comm_mpi_create(MPI_COMM_WORLD, owns, &c);
  if (st != ZS_OK) {
    if (owns) MPI_Finalize();
    return st;
  }
  return zs__context_create(config, c, out);
}
