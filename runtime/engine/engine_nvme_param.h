/*
 * engine_nvme_param.h — stage-3 parameter shards on NVMe
 * (engine_nvme_param.c; offload_param = 2). Without it (m->nvme_params
 * NULL) every call below does nothing and returns ZS_OK, so callers use
 * them unconditionally.
 *   init/free: the parameter swap file (one region per unit) and the pool
 *     of config.nvme.param_buffer_count pinned buffers; free waits for
 *     the transfers in flight and removes the file.
 *   acquire: u->params_shard points at a buffer holding the unit's shard
 *     (read from the file if no buffer has it; synchronous) until the
 *     matching release. Re-entrant (pins count). Errors: IO naming the
 *     file and offset, INVALID_STATE when every buffer is pinned.
 *   write_back: queues the write of the acquired shard to its region
 *     (asynchronous; the buffer is reused only after it completed).
 *   flush: waits for every transfer; after a failure, abort.
 *   read_ahead: starts reading a unit's shard into a free buffer, if one
 *     is free without waiting; returns 0 when none is (1: started, or
 *     already in a buffer). Never fails: a failure is found again by the
 *     acquire that needs the shard.
 *   gather_source: acquire for an all-gather, agreed across ranks
 *     (collective: one all-reduce); the buffer stays pinned until
 *     gather_done after the all-gather was waited for.
 */
#ifndef ZS_RUNTIME_ENGINE_NVME_PARAM_H_
#define ZS_RUNTIME_ENGINE_NVME_PARAM_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__nvme_params zs__nvme_params;
zs_status zs__nvme_param_init(zs_model* m);
void zs__nvme_param_free(zs_model* m);
uint64_t zs__nvme_param_file_bytes(const zs_model* m);
/* Adds the shards read so far, and those read ahead, to *reads, *ahead. */
void zs__nvme_param_counts(const zs_model* m, uint64_t* reads, uint64_t* ahead);
zs_status zs__param_acquire(zs_model* m, zs__unit* u);
/* acquire for a caller that overwrites the whole shard: no read. */
zs_status zs__param_acquire_blank(zs_model* m, zs__unit* u);
void zs__param_release(zs_model* m, zs__unit* u);
zs_status zs__param_write_back(zs_model* m, zs__unit* u);
zs_status zs__param_flush(zs_model* m);
/* After an operation failed with st: waits for every transfer and
 * all-gather using a buffer, and drops every buffer and pin (the shards
 * are re-read from the file; unwritten changes are lost). Returns st with
 * its message kept. */
zs_status zs__param_abort(zs_model* m, zs_status st);
int zs__param_read_ahead(zs_model* m, int unit);
zs_status zs__param_gather_source(zs_model* m, zs__unit* u);
void zs__param_gather_done(zs_model* m, zs__unit* u);
/* Around one unit's optimizer step (both step paths): begin acquires its
 * shard and reads the unit `next` ahead (-1: none); end writes the shard
 * back if st is OK and releases it, returning the first failure. Both are
 * no-ops (end returns st) without parameter shards on NVMe. */
zs_status zs__param_step_begin(zs_model* m, zs__unit* u, int next);
zs_status zs__param_step_end(zs_model* m, zs__unit* u, zs_status st);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_NVME_PARAM_H_ */
