/*
 * engine_nvme_io.h — NVMe offload's per-context state (engine_nvme_io.c):
 * the asynchronous I/O queue and this rank's swap directory, made with the
 * context when config.nvme.path is set (zs__engine_context_init) and
 * removed with it, every swap file the context made included.
 */
#ifndef ZS_RUNTIME_ENGINE_NVME_IO_H_
#define ZS_RUNTIME_ENGINE_NVME_IO_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zs__aio;
typedef struct zs__nvme zs__nvme;

/* Makes the swap directory <nvme.path>/zs-<run id>-rank-<rank> and the I/O
 * queue (config.nvme.aio, queue_depth, block_size). Local: the caller
 * agrees across ranks. Errors: INVALID_ARGUMENT (path too long), IO
 * (mkdir), OUT_OF_MEMORY, and the queue's. */
zs_status zs__nvme_create(zs_context* ctx, zs__nvme** out);
/* Closes the queue and removes the directory (a warning if files the
 * runtime did not make are left in it). NULL: nothing. */
void zs__nvme_destroy(zs__nvme* n);
/* The queue's backend name ("io_uring", "threads"). */
const char* zs__nvme_aio_name(const zs__nvme* n);
/* The context's I/O queue and swap directory, and the next swap file's
 * number (each call takes one). */
struct zs__aio* zs__nvme_aio(const zs__nvme* n);
const char* zs__nvme_dir(const zs__nvme* n);
int zs__nvme_next_file(zs__nvme* n);
/* Unlinks every swap file the context made and its swap directory, with
 * unlink/rmdir alone (async-signal-safe): zs_context_remove_files. */
void zs__nvme_remove_files(zs__nvme* n);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_NVME_IO_H_ */
