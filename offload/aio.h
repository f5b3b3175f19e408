/*
 * aio.h — asynchronous O_DIRECT file I/O for NVMe offload (docs/offload.md,
 * "NVMe"): a queue of reads and writes between aligned host buffers and
 * swap files, through io_uring (liburing) or, where io_uring is not
 * available (old kernels, seccomp-filtered containers), a pool of threads
 * doing pread/pwrite. The runtime creates, sizes and removes the files.
 * Algorithm: ZeRO-Infinity (Rajbhandari et al., SC'21, sec. 6.2): large
 * aligned direct transfers with a deep queue, no page cache.
 *
 * Units: sizes and offsets in BYTES. Direct I/O needs buffers, offsets and
 * sizes aligned to ZS__AIO_ALIGN (4096); requests that are not are refused
 * (INVALID_ARGUMENT), never silently bounced. On a file system without
 * O_DIRECT (tmpfs) files fall back to buffered I/O, logged once.
 *
 * Threads: one zs__aio is used by one thread at a time (the engine's). Not
 * reentrant.
 */
#ifndef ZS_OFFLOAD_AIO_H_
#define ZS_OFFLOAD_AIO_H_

#include <stddef.h>
#include <stdint.h>

#include "runtime/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZS__AIO_ALIGN 4096

typedef enum zs__aio_backend {
  ZS__AIO_AUTO = 0,    /* io_uring when the kernel allows it, else threads */
  ZS__AIO_URING = 1,   /* io_uring only (an error if unavailable) */
  ZS__AIO_THREADS = 2  /* the thread-pool fallback */
} zs__aio_backend;

typedef struct zs__aio zs__aio;
typedef struct zs__aio_file zs__aio_file;

/* A queue of at most queue_depth transfers in flight (1..4096); requests
 * larger than block_size bytes (a multiple of ZS__AIO_ALIGN; 0: no limit)
 * are split into block_size transfers, so one large request keeps the
 * queue full (DeepSpeed's aio block_size and queue_depth). Errors:
 * INVALID_ARGUMENT (queue depth, block size), UNSUPPORTED (ZS__AIO_URING
 * where the kernel refuses io_uring, with its reason), OUT_OF_MEMORY. */
zs_status zs__aio_create(int queue_depth, size_t block_size,
                         zs__aio_backend backend, zs__aio** out);
/* Waits for what is in flight, then frees. NULL accepted. */
void zs__aio_destroy(zs__aio* a);
/* "io_uring" or "threads". */
const char* zs__aio_backend_name(const zs__aio* a);

/* Creates `path` (it must not exist: O_EXCL, mode 0600) and reserves
 * `bytes` on disk (fallocate, so a full disk fails here and not in the
 * middle of training). On failure nothing is left behind. Errors: IO naming
 * the path and the reason (ENOSPC: "no space left", EACCES, ...). */
zs_status zs__aio_file_create(zs__aio* a, const char* path, uint64_t bytes,
                              zs__aio_file** out);
/* Closes the file and, when remove is set, unlinks it. NULL accepted. */
void zs__aio_file_close(zs__aio_file* f, int remove);
const char* zs__aio_file_path(const zs__aio_file* f);

/* Queues a read (write = 0) or write of `bytes` at `offset` of f into/from
 * buf; returns once it is queued (it waits for a free slot when
 * queue_depth requests are in flight). buf must stay valid until
 * zs__aio_wait. Errors: INVALID_ARGUMENT (alignment, beyond the file's
 * size); a completion error found while waiting for a slot (IO). */
zs_status zs__aio_submit(zs__aio* a, zs__aio_file* f, int write, void* buf,
                         size_t bytes, uint64_t offset);
/* The ticket of the last request zs__aio_submit queued (tickets count
 * requests from 1 in submission order). */
uint64_t zs__aio_last_ticket(const zs__aio* a);
/* Failed transfers since the queue was made (never reset). A caller that
 * must know whether its own transfer failed (each failure is returned by
 * only one wait, which may be another caller's) compares this count before
 * submitting and after waiting: unchanged means it succeeded. */
uint64_t zs__aio_failures(zs__aio* a);
/* Waits until every request with a ticket <= `ticket` has completed (later
 * ones may still run: a pipeline waits for its reads while its writes go
 * on). Returns the first failure recorded so far, as zs__aio_wait does. */
zs_status zs__aio_wait_until(zs__aio* a, uint64_t ticket);

/* Waits for every queued request. Returns the first failure since the
 * last wait: IO naming the operation, the file, the offset and the size
 * ("read of 1048576 bytes at offset 2097152 of /nvme/zs-0/rank-00000.swap:
 * short read, got 4096 bytes"). All requests are complete either way. */
zs_status zs__aio_wait(zs__aio* a);

/* Test hook: when set, called with each completed request's result (bytes
 * transferred, or -errno) and returns the result to use: tests inject I/O
 * errors (-EIO) and short transfers. NULL restores normal operation. */
extern long (*zs__aio_fault_hook)(const char* path, uint64_t offset,
                                  int write, size_t bytes, long result);

#ifdef __cplusplus
}
#endif

#endif /* ZS_OFFLOAD_AIO_H_ */
