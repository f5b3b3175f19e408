/*
 * engine_optim.h — the optimizer on this rank's span of each unit
 * (engine_optim.c): master weights, the in-place step, the staged step of
 * CPU offload with a GPU, the global gradient norm and the loss scaler.
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
 * NULL when absent). The whole span in memory: lo = 0, hi = SIZE_MAX. */
typedef struct zs__opt_view {
  char* p;
  char* g;
  float* master;
  float* s0;
  float* s1;
  size_t lo, hi;
} zs__opt_view;

/* The optimizer on a view, run by the CPU offload workers. Errors: the
 * workers' (each naming the unit). */
zs_status zs__optimize_view(zs_model* m, zs__unit* u, float coef,
                            const zs__opt_view* v);
/* The in-memory optimizer on every trainable unit with coefficient `coef`
 * on the gradients (1 / loss scale, times the clip); with parameter shards
 * on NVMe each shard is read in (the next one ahead), stepped and written
 * back, and every rank agrees on the outcome (collective then). */
zs_status zs__optimize_units(zs_model* m, float coef);
/* The same for CPU offload with the gradients in device memory: each
 * unit's span through two page-locked staging slots, overlapped. */
zs_status zs__optimize_staged(zs_model* m, float coef);

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
