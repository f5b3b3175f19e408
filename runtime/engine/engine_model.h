/*
 * engine_model.h — the engine's side of a context and a model's storage
 * (engine_model.c).
 */
#ifndef ZS_RUNTIME_ENGINE_MODEL_H_
#define ZS_RUNTIME_ENGINE_MODEL_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A context over comm (zs__context_create: takes comm, also on failure)
 * with the engine's state attached (ctx->engine: its model list, and NVMe
 * offload's I/O queue and swap directory when NVMe offload is on, agreed
 * across ranks) and its teardown registered on ctx->hooks
 * (zs_context_destroy detaches the models left, zs_context_remove_files
 * removes the swap files). Collective. *out is set on success only.
 * Errors: zs__context_create's, OUT_OF_MEMORY, zs__nvme_create's (agreed:
 * every rank fails). */
zs_status zs__engine_context_create(const zs_config* config, zs__comm* comm,
                                    zs_context** out);
/* Frees a model's storage and unlinks it from its context, leaving only
 * what zs_model_destroy frees (used when the context goes first). */
void zs__model_detach(zs_model* m);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_MODEL_H_ */
