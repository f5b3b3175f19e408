/*
 * context_mpi.c — the MPI entry points: zs_context_create over
 * MPI_COMM_WORLD (initializing MPI if needed) and zs_context_create_mpi over
 * a caller's communicator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zs_mpi.h>

#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/comm_cuda.h"
#include "runtime/engine/engine_model.h"

/* The CUDA device's environment variables (docs/cuda.md), read when a
 * context is created: ZS_DEVICE_COMM, how device collectives run with
 * several ranks, "nccl" (the default) or "staged" (through page-locked
 * host memory and an MPI communicator of their own, so ranks may share a
 * GPU), the same on every rank; ZS_DEVICE_CHAIN, "1" (consumers of
 * gathers wait on the device) or "0" (the default). A value that is
 * neither fails every rank, naming it and the rank. */
static zs_status zs__device_env(zs__comm* c, int* staged) {
  const char* v = getenv("ZS_DEVICE_COMM");
  const char* chain = getenv("ZS_DEVICE_CHAIN");
  zs_status local = ZS_OK;
  *staged = 0;
  if (v != NULL && *v != '\0' && strcmp(v, "nccl") != 0) {
    if (strcmp(v, "staged") == 0)
      *staged = 1;
    else
      local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                        "ZS_DEVICE_COMM='%.64s' on rank %d: use nccl (the "
                        "default) or staged", v, c->rank);
  }
  if (local == ZS_OK && chain != NULL && *chain != '\0' &&
      strcmp(chain, "0") != 0 && strcmp(chain, "1") != 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "ZS_DEVICE_CHAIN='%.64s' on rank %d: use 1 (consumers "
                      "wait on the device) or 0 (the default)", chain,
                      c->rank);
  zs_status st = zs__comm_agree(c, local, "the CUDA environment variables");
  if (st != ZS_OK) return st;
  const char* mine = *staged ? "ZS_DEVICE_COMM=staged" : "ZS_DEVICE_COMM=nccl";
  return zs__comm_check_same(c, "ZS_DEVICE_COMM", mine, strlen(mine));
}

/* With the CUDA device, collectives on device memory run on NCCL, or
 * staged (above) on a host communicator of their own: the MPI
 * communicator is wrapped (it keeps serving host-memory collectives). */
static zs_status zs__comm_for_device(const zs_config* config, zs__comm** c) {
  if (zs__config_device(config) != ZS_DEVICE_CUDA) return ZS_OK;
  int staged = 0;
  zs__comm* stage = NULL;
  zs_status st = zs__device_env(*c, &staged);
  if (st == ZS_OK && staged && (*c)->world > 1)
    st = zs__comm_mpi_split(*c, 0, (*c)->rank, &stage);
  if (st != ZS_OK) {
    zs__comm_destroy(*c);
    *c = NULL;
    return st;
  }
  return zs__cuda_comm_create(*c, stage, c); /* loads the CUDA plugin */
}

/* The heartbeats of a new context (zs__comm_mpi_heartbeat), with its
 * resolved heartbeat_timeout_s; on failure the context is destroyed (every
 * rank fails alike) and *out cleared. */
static zs_status zs__heartbeat_start(zs_context* ctx, zs__comm* mpi,
                                     zs__comm* c) {
  zs_status st = zs__comm_mpi_heartbeat(mpi, c, ctx->config.heartbeat_timeout_s);
  if (st == ZS_OK) return ZS_OK;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  zs_context_destroy(ctx);
  return zs__error(st, "zs_context_create: heartbeats (heartbeat_timeout_s "
                   "0 turns them off): %s", saved);
}

/* The host collectives of a new context (zs__comm_mpi_host_collectives,
 * with its resolved host_collectives); on failure the context is
 * destroyed (every rank fails alike) and *out cleared. */
static zs_status zs__host_collectives_start(zs_context* ctx, zs__comm* mpi) {
  size_t bytes = 0;
  zs_status st = zs__comm_mpi_host_collectives(
      mpi, ctx->config.host_collectives, &bytes);
  if (st == ZS_OK) st = zs__context_count_segment(ctx, bytes);
  if (st == ZS_OK) {
    /* zs_context_config tells which one AUTO picked */
    ctx->config.host_collectives =
        bytes > 0 ? ZS_HOST_COLLECTIVES_SHM : ZS_HOST_COLLECTIVES_MPI;
    return ZS_OK;
  }
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  zs_context_destroy(ctx);
  return zs__error(st, "zs_context_create: %s", saved);
}

/* One group communicator of a new context: the context's (parent)
 * bookkeeping, its timeout, device and heartbeats, and
 * host collectives as the context asked for them (shared memory where the
 * group is on one host: `shm` forces it only there, a group across hosts
 * uses MPI). */
static zs_status zs__group_setup(zs_context* ctx, zs__comm* g, zs__group kind,
                                 zs_host_collectives mode) {
  g->parent = ctx->comm;
  g->group = (uint8_t)kind;
  g->timeout_s = ctx->comm->timeout_s;
  g->dev = ctx->device;
  g->hb = ctx->comm->hb; /* (borrowed) */
  size_t bytes = 0;
  zs_status st = zs__comm_mpi_host_collectives(
      g, mode == ZS_HOST_COLLECTIVES_SHM && g->local_size != g->world
             ? ZS_HOST_COLLECTIVES_MPI : mode, &bytes);
  /* (no progress thread of its own: the context's drives Open MPI's
   * progress engine, which advances every request, while any of its
   * groups' collectives is in flight; one per communicator made every
   * rank's threads contend for MPI's lock and poll TCP sockets, 5-10x
   * slower across hosts) */
  if (st == ZS_OK) st = zs__context_count_segment(ctx, bytes);
  return st;
}

/* Hybrid sharding's groups (config.shard_group_size G; docs/running.md,
 * "Shard groups"): the shard group of ranks G*g .. G*g+G-1 and the replica
 * group of ranks j, j+G, ... (MPI_Comm_split of the context's
 * communicator). G must divide the world; ZS_SHARD_GROUP_NODE is the
 * number of ranks on a host, the same on every host, each host's ranks
 * consecutive. Agreed: every rank fails alike, naming the problem. With G
 * equal to the world nothing is made. */
static zs_status zs__groups_start(zs_context* ctx, zs__comm* mpi,
                                  zs_host_collectives mode) {
  const int W = ctx->world, want = ctx->config.shard_group_size;
  int G = want == ZS_SHARD_GROUP_NODE ? mpi->local_size : want;
  if (G == 0) G = W;
  zs_status local = ZS_OK;
  if (W % G != 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "config.shard_group_size: %d %sdoes not divide the %d "
                      "ranks (groups of equal size are needed)", G,
                      want == ZS_SHARD_GROUP_NODE ? "(the ranks of this host) "
                                                  : "", W);
  else if (want == ZS_SHARD_GROUP_NODE && mpi->local_rank != ctx->rank % G)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "config.shard_group_size node: this host's ranks are "
                      "not consecutive (rank %d is rank %d of this host's %d); "
                      "place ranks by host (mpirun --map-by slot, Slurm's "
                      "block distribution)", ctx->rank, mpi->local_rank, G);
  else if (G < W && ctx->device != ctx->host)
    local = zs__error(ZS_ERR_UNSUPPORTED,
                      "config.shard_group_size %d of %d ranks: hybrid "
                      "sharding runs on the host device in this release "
                      "(the CUDA backend's NCCL communicator is not split "
                      "yet)", G, W);
  /* every host the same G (node): the largest and smallest agree */
  uint64_t* v = (uint64_t*)malloc(2 * sizeof *v); /* (a collective's) */
  if (v == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "shard groups");
  v[0] = (uint64_t)G;
  v[1] = ~(uint64_t)G; /* (the max of ~G: ~ the min) */
  zs_status st = zs__comm_all_reduce(ctx->comm, zs__tag(ZS__P_CHECK, -1, NULL),
                                     ZS__IN_PLACE, v, 2, ZS_UINT64, ZS__RED_MAX);
  if (st == ZS_OK && local == ZS_OK && v[0] != ~v[1])
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "config.shard_group_size node: hosts have different "
                      "numbers of ranks (from %llu to %llu); give every host "
                      "as many", (unsigned long long)~v[1],
                      (unsigned long long)v[0]);
  zs__comm_free(ctx->comm, v);
  if (st == ZS_OK) st = zs__comm_agree(ctx->comm, local, "shard groups");
  if (st != ZS_OK) return st;
  ctx->config.shard_group_size = G; /* zs_context_config says what it is */
  if (G == W) return ZS_OK;
  zs__comm *shard = NULL, *rep = NULL;
  st = zs__comm_mpi_split(mpi, ctx->rank / G, ctx->rank, &shard);
  if (st == ZS_OK) st = zs__comm_mpi_split(mpi, ctx->rank % G, ctx->rank, &rep);
  if (st == ZS_OK) {
    ctx->shard_comm = shard;
    ctx->replica_comm = rep;
    ctx->comm->shard_group = shard;
    ctx->shard_rank = shard->rank;
    ctx->shard_ranks = shard->world;
    ctx->replica_rank = rep->rank;
    ctx->replicas = rep->world;
    st = zs__group_setup(ctx, shard, ZS__GROUP_SHARD, mode);
    if (st == ZS_OK) st = zs__group_setup(ctx, rep, ZS__GROUP_REPLICA, mode);
    /* (messages name the context's ranks) */
    zs__comm_mpi_name_ranks(shard, ctx->rank - ctx->rank % G, 1);
    zs__comm_mpi_name_ranks(rep, ctx->rank % G, G);
  } else {
    zs__comm_destroy(shard);
    zs__comm_destroy(rep);
  }
  return st;
}

/* A new context's host collectives, heartbeats and shard groups; on
 * failure the context is destroyed. */
static zs_status zs__context_finish(zs_context* ctx, zs__comm* mpi,
                                    zs__comm* c) {
  const zs_host_collectives mode = ctx->config.host_collectives;
  zs_status st = zs__host_collectives_start(ctx, mpi);
  if (st == ZS_OK) st = zs__heartbeat_start(ctx, mpi, c);
  if (st != ZS_OK) return st; /* (they destroyed it) */
  st = zs__groups_start(ctx, mpi, mode);
  if (st == ZS_OK) return ZS_OK;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  zs_context_destroy(ctx);
  return zs__error(st, "zs_context_create: %s", saved);
}

/* Open MPI reports some failures of non-blocking collectives (a message
 * truncated when ranks' collectives no longer pair up) on MPI_COMM_WORLD,
 * whatever communicator they ran on; with its default handler that ends
 * the job. The caller owns MPI here, so its handler is not changed; it is
 * told once per process (by the communicator's rank 0). */
static void zs__mpi_check_world_errhandler(MPI_Comm comm) {
  static int told;
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  if (told || MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h) != MPI_SUCCESS)
    return;
  const int fatal = h == MPI_ERRORS_ARE_FATAL;
  if (h != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&h);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  told = 1;
  if (fatal && rank == 0)
    zs__log(ZS_LOG_WARN,
            "MPI_COMM_WORLD's error handler is MPI_ERRORS_ARE_FATAL: Open MPI "
            "reports some failures of non-blocking collectives there, which "
            "would end the job instead of coming back as ZS_ERR_COMM; call "
            "MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) after "
            "MPI_Init_thread (docs/wrapping.md)");
}

zs_status zs_context_create_mpi(const zs_config* config, MPI_Comm comm,
                                zs_context** out) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "zs_context_create_mpi: config and out must not be NULL");
  *out = NULL; /* on every failure, as the header says */
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  ZS_REQUIRE(initialized && !finalized,
             "zs_context_create_mpi: MPI is not initialized (or already "
             "finalized); call MPI_Init_thread first or use zs_context_create");
  ZS_REQUIRE(comm != MPI_COMM_NULL,
             "zs_context_create_mpi: comm is MPI_COMM_NULL");
  *out = NULL;
  zs__comm* c = NULL;
  zs_status st = zs__comm_mpi_create(comm, &c);
  zs__comm* mpi = c;
  if (st == ZS_OK) st = zs__comm_for_device(config, &c);
  if (st != ZS_OK) return st;
  st = zs__engine_context_create(config, c, out);
  if (st == ZS_OK) st = zs__context_finish(*out, mpi, c);
  if (st != ZS_OK) *out = NULL;
  if (st == ZS_OK) zs__mpi_check_world_errhandler(comm);
  return st;
}

/* MPI that ZeroShard initialized but no context owns at exit (every
 * zs_context_create failed, or a context was never destroyed) is
 * finalized here, so mpirun sees a clean exit. */
static int zs__mpi_we_initialized;

static void zs__mpi_atexit(void) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

zs_status zs_context_create(const zs_config* config, zs_context** out) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "zs_context_create: config and out must not be NULL");
  *out = NULL; /* on every failure, as the header says */
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  ZS_REQUIRE(!finalized,
             "zs_context_create: MPI was already finalized (MPI cannot be "
             "started twice in one process)");
  *out = NULL;
  if (!initialized) {
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      return zs__error(ZS_ERR_COMM, "MPI_Init_thread failed (code %d)", rc);
    if (!zs__mpi_we_initialized) atexit(zs__mpi_atexit);
    zs__mpi_we_initialized = 1;
    /* Open MPI reports some errors of non-blocking collectives on
     * MPI_COMM_WORLD, whose default handler aborts the job; this MPI is
     * ours, so errors come back as codes. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  zs__comm* c = NULL;
  zs_status st = zs__comm_mpi_create(MPI_COMM_WORLD, &c);
  zs__comm* mpi = c;
  if (st == ZS_OK) st = zs__comm_for_device(config, &c);
  if (st != ZS_OK) return st;
  st = zs__engine_context_create(config, c, out);
  if (st == ZS_OK) st = zs__context_finish(*out, mpi, c);
  if (st != ZS_OK) *out = NULL;
  /* Only a context that exists owns MPI, so a failed create can be retried:
   * MPI stays up, and is finalized at exit if nothing owns it then. */
  if (st == ZS_OK && zs__mpi_we_initialized) zs__comm_mpi_own(mpi);
  return st;
}
