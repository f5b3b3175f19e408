/*
 * engine_optim.h — the optimizer on this rank's span of each unit
 * (engine_optim.c): master weights, the stores and the one step loop over
 * them, the staging of CPU offload with a GPU, the global gradient norm
 * and the loss scaler.
 */
#ifndef ZS_RUNTIME_ENGINE_OPTIM_H_
#define ZS_RUNTIME_ENGINE_OPTIM_H_

#include "runtime/engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the optimizer reads and writes: the span's parameters and
 * gradients (p, g: element 0 of the span), and the fp32 master weights and
 * states of the span's elements [lo, hi) (element `lo` at master[0], ...;
 * NULL when absent). The memory store's: the whole span, lo = 0, hi = its
 * element count. */
typedef struct zs__opt_view {
  char* p;
  char* g;
  float* master;
  float* s[ZS_OPTIM_MAX_STATES]; /* NULL past the unit's nstates */
  size_t lo, hi;
} zs__opt_view;

/* The optimizer on a view, run by the CPU offload workers. Errors: the
 * workers' (each naming the unit). */
zs_status zs__optimize_view(zs_model* m, zs__unit* u, float coef,
                            const zs__opt_view* v);

/* A store: where the step reads and writes a model's master weights and
 * optimizer states (the policy's state_tier), as a sequence of chunks,
 * each a range [lo, hi) of one trainable unit's optimizer span (elements);
 * a unit's chunks are consecutive and cover its span, units in order.
 * Memory (device or CPU offload's host memory: zs__memory_store) gives one
 * chunk per unit, in place; NVMe (zs__nvme_store, engine_optim_nvme.c)
 * gives its swap file's sub-groups through a ring of pinned buffers, read
 * ahead and written behind. Like the device and communicator tables:
 *   chunk    chunk k's unit and range
 *   acquire  waits until chunk k's fields can be read and written and
 *            gives them (element lo at [0]; NULL for a field the unit has
 *            not); may start reading later chunks
 *   release  chunk k is updated: starts writing it back (memory: nothing)
 *   finish   after the last chunk, or on an error (st): waits for every
 *            transfer; returns st, or the first I/O error
 * stale_master: 16-bit units' stale master weights are rebuilt from the
 * parameters chunk by chunk by the loop (NVMe), else per unit beforehand
 * (zs__master_refresh, in memory). */
typedef struct zs__state_store zs__state_store;
struct zs__state_store {
  const char* name; /* "memory", "nvme" (messages) */
  int nchunks;
  int stale_master;
  void (*chunk)(const zs__state_store* s, int k, int* unit, size_t* lo, size_t* hi);
  zs_status (*acquire)(zs__state_store* s, int k, float** master,
                       float* states[ZS_OPTIM_MAX_STATES]);
  zs_status (*release)(zs__state_store* s, int k);
  zs_status (*finish)(zs__state_store* s, zs_status st);
  zs_model* m;
  void* impl;
};

/* The in-memory store of a model (its trainable units, in order; its
 * finish frees it). Errors: OUT_OF_MEMORY. */
zs_status zs__memory_store(zs_model* m, zs__state_store* out);

/* The optimizer step, one loop whatever the store: for each chunk, its
 * unit's parameter shard acquired (NVMe parameters: read ahead, written
 * back after the unit's last chunk), its span staged to the host when the
 * step runs there with the parameters on a device (CPU offload with a
 * GPU: two slots overlapped on a copy stream, or one unit at a time when
 * the parameter shards are offloaded too), the store's chunk acquired,
 * the update run (CPU offload's workers, or the device's kernels), the
 * chunk released and the span staged back. Coefficient `coef` on the
 * gradients (1 / loss scale, times the clip). Local: the caller agrees on
 * the outcome when I/O is involved. Errors: the store's, the staging's
 * (DEVICE), the optimizer's (naming the unit or tensor). */
zs_status zs__optimize(zs_model* m, float coef, zs__state_store* s);

/* A 16-bit unit's master weights from its parameters when stale
 * (master_stale), and after elements [begin, begin + n) of the unit's flat
 * buffer were written: those in this rank's span refreshed. Errors:
 * DEVICE. */
zs_status zs__master_refresh(zs_model* m, zs__unit* u);
zs_status zs__master_refresh_range(zs_model* m, zs__unit* u, size_t begin,
                                   size_t n);

/* The staging of the offloaded step on a GPU, made at the first step
 * (init) and freed with the model's storage (free). */
zs_status zs__staging_init(zs_model* m);
void zs__staging_free(zs_model* m);
/* Queues unit u's gradient span and parameters into staging slot k on the
 * staging stream (ordered after nothing on the compute stream: sync it
 * first); done when the staging stream is synchronized. Errors: DEVICE. */
zs_status zs__staging_in(zs_model* m, zs__unit* u, int k);
/* Queues unit u's parameters back from staging slot k to the device on the
 * staging stream. Errors: DEVICE. */
zs_status zs__staging_out(zs_model* m, zs__unit* u, int k);
/* One unit at a time, synchronously (NVMe offload's step with the
 * parameter shards offloaded too): its gradient span and parameters into
 * staging slot 0 (staging_g[0], staging_p[0]), and its parameters back
 * from there. Errors: DEVICE. */
zs_status zs__staging_unit_in(zs_model* m, zs__unit* u);
zs_status zs__staging_unit_out(zs_model* m, zs__unit* u);

/* The global sum of squares of the gradients (every rank's partial sum
 * all-gathered and added in rank order: the same bits on every rank).
 * Collective. Errors: OUT_OF_MEMORY, COMM, DEVICE. */
zs_status zs__global_sumsq(zs_model* m, double* out);
/* The dynamic loss scale after a step, overflow or not
 * (torch.cuda.amp.GradScaler.update with DeepSpeed's hysteresis). */
void zs__scaler_update(zs_model* m, int overflow);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_OPTIM_H_ */
