/*
 * context_local.c — zs_context_create_local: a context of one process
 * without MPI (world size 1). On the CUDA device the NCCL communicator's
 * one-rank mode wraps the local one, so no NCCL and no MPI are needed.
 */
#include <zeroshard.h>

#include "runtime/comm/comm_local.h"
#include "runtime/comm/comm_cuda.h"
#include "runtime/engine/engine_model.h"

zs_status zs_context_create_local(const zs_config* config, zs_context** out) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "zs_context_create_local: config and out must not be NULL");
  *out = NULL;
  zs__comm* c = NULL;
  zs_status st = zs__comm_local_create(&c);
  if (st == ZS_OK && zs__config_device(config) == ZS_DEVICE_CUDA)
    st = zs__cuda_comm_create(c, NULL, &c); /* takes c, also on failure */
  if (st != ZS_OK) return st;
  st = zs__engine_context_create(config, c, out);
  /* one rank: one shard group of it */
  if (st == ZS_OK && (*out)->config.shard_group_size > 1) {
    const int g = (*out)->config.shard_group_size;
    zs_context_destroy(*out);
    *out = NULL;
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_context_create: config.shard_group_size %d does not "
                     "divide the 1 rank of a context without MPI", g);
  }
  if (st == ZS_OK) (*out)->config.shard_group_size = 1;
  return st;
}
