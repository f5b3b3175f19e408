/*
 * engine_optim_nvme.h — NVMe offload of the optimizer states
 * (engine_optim_nvme.c; ZeRO-Infinity): each model's master weights and
 * optimizer states in one swap file, made at finalize (units then keep no
 * master weights or states in memory) and freed with the model's storage
 * (the file removed); the NVMe store the step's loop runs over (its
 * sub-groups through the ring of pinned slots); one unit's field read
 * and written for checkpoints and zs_tensor_get/set.
 */
#ifndef ZS_RUNTIME_ENGINE_OPTIM_NVME_H_
#define ZS_RUNTIME_ENGINE_OPTIM_NVME_H_

#include "runtime/engine/engine.h"
#include "runtime/engine/engine_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__nvme_model zs__nvme_model;
/* The swap file, its sub-groups and pinned slots. Errors: IO,
 * OUT_OF_MEMORY. */
zs_status zs__nvme_model_init(zs_model* m);
void zs__nvme_model_free(zs_model* m);
/* The model's NVMe store for one step (engine_optim.h's zs__state_store):
 * its chunks are the swap file's sub-groups, read ahead and written
 * behind through the ring of pinned slots; its first reads start here.
 * Its finish waits for every write, and marks the stale master weights
 * rebuilt. Errors: IO naming the file, OUT_OF_MEMORY. */
zs_status zs__nvme_store(zs_model* m, zs__state_store* out);
/* A unit's span of one field read back into a malloc'ed buffer (field -1:
 * the master weights; k: state k), and written back from one. Errors: IO,
 * OUT_OF_MEMORY. */
zs_status zs__nvme_read_field(zs_model* m, zs__unit* u, int field,
                              float** out);
zs_status zs__nvme_write_field(zs_model* m, zs__unit* u, int field,
                               const float* buf);
/* read_field, then *out at this rank's shard of it (the optimizer span at
 * stages 1-3 is the shard; at stage 0 the shard is inside it); stale master
 * weights are the parameters widened. *tmp: the caller frees. */
zs_status zs__nvme_shard(zs_model* m, zs__unit* u, int field, char** out,
                         float** tmp);
/* The swap file's size in bytes. */
uint64_t zs__nvme_file_bytes(const zs_model* m);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_OPTIM_NVME_H_ */
