/*
 * engine.h — the model and its units: registration, storage per stage, the
 * per-unit state machine, gradient reduction and the optimizer step. One
 * code path for every stage and backend; the stage only decides which
 * buffers persist (docs/design.md, "Unit state machine"). The engine talks
 * to memory through device.h and to other ranks through comm.h, never to
 * MPI, NCCL or CUDA directly.
 */
#ifndef ZS_RUNTIME_ENGINE_H_
#define ZS_RUNTIME_ENGINE_H_

#include "runtime/context.h"
#include "runtime/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__tensor {
  char name[ZS_NAME_MAX];
  int unit;          /* the unit it was registered in */
  int slot;          /* its index in that unit's tensor list */
  int ndim;
  int64_t shape[ZS_MAX_DIMS];
  size_t numel;      /* elements */
  zs_dtype dtype;
  unsigned int flags;
  int tied_to;       /* owner tensor id, or -1 */
  int group;         /* param group */
  size_t offset;     /* elements into the owning unit's flat buffer */
  int64_t step;      /* optimizer updates applied (per parameter, as PyTorch) */
} zs__tensor;

/* Gradient state of a unit within one step. */
typedef enum zs__grad_state {
  ZS__GRAD_IDLE = 0,     /* not touched this step */
  ZS__GRAD_ACCUM = 1,    /* accumulation buffer live (zeroed at first open) */
  ZS__GRAD_REDUCING = 2, /* reduce-scatter buckets in flight */
  ZS__GRAD_REDUCED = 3   /* reduced into the shard (mean over ranks) */
} zs__grad_state;

/* Collectives of one kind in flight for a unit, in issue order. */
typedef struct zs__inflight {
  zs__coll** ops;
  int n;
  int cap;
} zs__inflight;

typedef struct zs__unit {
  char name[ZS_NAME_MAX];
  int* tensors; /* model tensor ids registered here (aliases too) */
  int ntensors;
  int cap;
  int* owners;  /* other units owning tensors tied from here (finalize) */
  int nowners;
  zs_dtype dtype;
  size_t elem;  /* bytes per parameter element */
  zs_dtype gdtype; /* gradients: dtype (elem) or fp32 (config.reduce_dtype) */
  size_t gelem;    /* bytes per gradient element */
  int trainable; /* has an untied, non-frozen tensor: grads + optimizer */
  zs__unit_layout layout;

  /* Storage. The stage decides which of these persist:
   *   params_full  stages 0-2 persistent (PARAMS); stage 3 while gathered
   *                (PARAMS_GATHERED)
   *   params_shard stage 3 persistent (PARAMS)
   *   grads_full   stages 0-1 persistent (GRADS)
   *   grads_shard  stages 2-3 persistent (GRADS)
   *   grad_accum   where backward accumulates: grads_full at stages 0-1, a
   *                transient full buffer (COMM_BUFFERS) at stages 2-3
   *   state[k]     optimizer states: full at stage 0, shard at 1-3 */
  void* params_full;
  void* params_shard;
  void* gather_src; /* stage 3, parameter shards in host memory with a
                       device that is not the host: the shard's device
                       copy its all-gather reads, until the gather is
                       done (zs__coll_source) */
  void* grads_full;
  void* grads_shard;
  void* grad_accum;
  void* grad_saved; /* a re-opened unit's earlier reduced shard */
  void* state[2];
  int nstates;
  zs__piece* opt_pieces; /* trainable tensor pieces of the optimizer span */
  size_t nopt_pieces;
  zs__piece* norm_pieces; /* ... of this rank's shard (every stage) */
  size_t nnorm_pieces;
  void* master;     /* 16-bit units: fp32 master weights of the optimizer
                       span (MASTER_WEIGHTS), the values the optimizer
                       updates; params hold their rounding */
  int master_stale; /* the master copy was never filled: it is, from the
                       parameters, before the first optimizer step (later
                       writes refresh the elements they write) */

  /* Collectives in flight. */
  zs__inflight gather_ops; /* stage 3: the all-gather filling params_full */
  zs__inflight red_ops;    /* reduce-scatter buckets (state REDUCING) */
  zs__inflight shard_ops;  /* all-gathers of shards back into full buffers:
                              stage-0 gradients, stage 1-2 parameters */
  void* red_sum;           /* a re-opened unit's new sum (shard-sized) */

  /* Per-step state. */
  int user_gathered;  /* the user holds a gather */
  int gather_refs;    /* user + ties + holds below keeping params_full */
  int prefetch_hold;  /* a prefetch holds a gather ref (not yet used) */
  int forward_hold;   /* reshard_after_forward off: kept for backward */
  int user_grad_open; /* the user holds a grad acquire */
  int grad_refs;      /* user + ties holding the gradient buffers */
  zs__grad_state grad_state;
  int reopened;       /* opened again after its reduction this step */
  int releases;       /* gradient releases this step (ties count) */
  int uses_explicit;  /* zs_unit_set_grad_uses, 0 = record */
  int uses_recorded;  /* most releases seen in a step; 0 = unknown */
} zs__unit;

struct zs_model {
  zs_context* ctx;
  zs__tensor* tensors;
  int ntensors;
  int tensors_cap;
  zs__unit* units;
  int nunits;
  int units_cap;
  double* group_lr; /* per param group */
  double* group_wd;
  int ngroups;
  zs_model* next; /* in ctx->models; NULL ctx: detached (ctx destroyed) */
  struct zs_driver* drivers; /* detached when the model is destroyed */
  int finalized;
  int finalize_failed; /* zs_model_finalize returned an error: later calls
                          say so, not "call zs_model_finalize first" */
  int poisoned; /* a registration call failed on this rank */
  char poison_msg[512];
  int eval;              /* zs_model_set_eval: forward only, outside the
                            step's trace, no prefetch, no forward holds */
  int64_t steps_called;  /* zs_step calls that completed */
  int micro;             /* micro-batches accumulated toward the next
                            optimizer step (0..K-1) */
  double loss_scale;     /* loss scaler state (config.loss_scaler) */
  int scale_clean_steps; /* applied steps since the last growth/backoff */
  int scale_hysteresis;  /* overflows still tolerated before backing off */
  int64_t steps_applied; /* ... of which ran the optimizer */

  /* Stage-3 prefetch: the order of the user's gathers recorded in a step
   * (trace), this step's gathers so far (seen), and the position in the
   * trace this step has matched. Every decision depends only on these and
   * on sizes, never on timing, so all ranks issue the same collectives. */
  int* trace;
  int trace_len, trace_cap;
  int trace_valid;  /* a trace from an earlier step is in use */
  int* seen;
  int seen_len, seen_cap;
  int trace_pos;
  int trace_ok;     /* this step has matched the trace so far */
  int prefetches;   /* units holding a prefetch (issued, not yet used) */
  int* reducing;    /* units in state REDUCING, oldest first */
  int nreducing, reducing_cap;
  size_t live_elems;     /* stage 3: elements of params_full allocated */
  size_t max_live_elems; /* 0: no limit (raised to the largest unit) */
  /* CPU offload with a GPU: page-locked staging of the step (two slots of
   * the largest span's gradients and parameters) and its copy stream. */
  void* staging_g[2];
  void* staging_p[2];
  zs__stream* staging_stream;
  /* NVMe offload: the swap file and sub-groups (engine_nvme.c); NULL
   * without it. */
  struct zs__nvme_model* nvme;
  /* Stage-3 parameter shards on NVMe (engine_nvme_param.c); NULL without
   * offload_param = 2. Their params_shard then points into its buffer
   * pool while acquired, and is NULL otherwise. */
  struct zs__nvme_params* nvme_params;
  /* A step failed after it had changed the optimizer states on some ranks
   * (an NVMe I/O error): further steps are refused with this message until
   * a checkpoint with optimizer state is loaded. */
  int broken;
  char broken_msg[512];
  /* zs_step found the ranks' collectives, use counts or step counters
   * different: the gradients reduced so far were summed across different
   * units (or none at all on some rank), so zs_step is refused with this
   * message until zs_step_discard drops them. */
  int must_discard;
  char must_discard_msg[256];
  /* The communicator's dirty_epoch this model has seen: a reconciliation
   * since (zs__comm_reconcile) completed collectives of this rank against
   * empty partners, so this model's micro-batch must be dropped here
   * (discard_local: by zs_step_discard on this rank alone, the ranks'
   * collectives being lined up already), and no call that issues a
   * collective may run before that. */
  uint64_t dirty_epoch_seen;
  int discard_local;
};

/* ---- engine_model.c ---- */
/* Frees a model's storage and unlinks it from its context, leaving only
 * what zs_model_destroy frees (used when the context goes first). */
void zs__model_detach(zs_model* m);
/* driver.c: frees a driver's activation buffers and unlinks it from its
 * model (zs_model_destroy before zs_driver_destroy); later driver calls
 * return INVALID_STATE. */
void zs__driver_detach(struct zs_driver* d);
/* The unit whose buffer holds tensor t (its owner's unit for a tie). */
static inline int zs__storage_unit(const zs_model* m, int t) {
  const zs__tensor* x = &m->tensors[t];
  return x->tied_to >= 0 ? m->tensors[x->tied_to].unit : x->unit;
}
static inline char* zs__at(void* base, size_t elems, size_t elem) {
  return (char*)base + elems * elem;
}
/* This rank's shard of a unit's parameters / reduced gradient (elements
 * [rank*shard, (rank+1)*shard) of the flat buffer). */
void* zs__param_shard_ptr(zs_model* m, zs__unit* u);
void* zs__grad_shard_ptr(zs_model* m, zs__unit* u);
/* Optimizer state k of a unit, pointing at this rank's shard. */
void* zs__state_shard_ptr(zs_model* m, zs__unit* u, int k);
/* A 16-bit unit's fp32 master weights for this rank's shard, and their
 * refresh from the parameters after these were written (master_stale). */
void* zs__master_shard_ptr(zs_model* m, zs__unit* u);
zs_status zs__master_refresh(zs_model* m, zs__unit* u);
/* CPU offload memory (offload.h's NUMA-placed host memory) registered with
 * the context's device (page-locked and mapped on CUDA: DMA copies, and
 * kernels reach it), and its release. Errors: OUT_OF_MEMORY, DEVICE. */
zs_status zs__offload_host_alloc(zs_model* m, size_t bytes, const char* label,
                                 void** out);
/* The same, accounted under `category` (the NVMe parameter pool:
 * ZS_MEM_NVME_STAGING). */
zs_status zs__offload_host_alloc_as(zs_model* m, size_t bytes, const char* label,
                                    zs_mem_category category, void** out);
void zs__offload_host_free(zs_model* m, void* p);
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

/* The optimizer span of a unit (the padded buffer at stage 0, the rank's
 * shard at 1-3: returned, in elements) and the device buffers holding its
 * parameters and gradients. */
size_t zs__optimize_span(zs_model* m, zs__unit* u, char** p, char** g);
/* Its element count alone. */
size_t zs__optimize_span_elems(const zs_model* m, const zs__unit* u);
/* The optimizer on a view, run by the CPU offload workers. */
zs_status zs__optimize_view(zs_model* m, zs__unit* u, float coef,
                            const zs__opt_view* v);

/* NVMe offload (engine_nvme.c). Context: the I/O queue and the rank's
 * swap directory (removed at destroy). Model: the swap file of the
 * optimizer states, its sub-groups and the pinned slots, made at
 * finalize (units then keep no master weights or states in memory), freed
 * with the model's storage (the file removed). Step: the pipelined
 * sub-group step. read_field: a unit's span of one field read back into a
 * malloc'ed buffer (field -1: the master weights; k: state k). */
typedef struct zs__nvme zs__nvme;
typedef struct zs__nvme_model zs__nvme_model;
zs_status zs__nvme_create(zs_context* ctx, zs__nvme** out);
void zs__nvme_destroy(zs__nvme* n);
zs_status zs__nvme_model_init(zs_model* m);
void zs__nvme_model_free(zs_model* m);
zs_status zs__nvme_step(zs_model* m, float coef);
zs_status zs__nvme_read_field(zs_model* m, zs__unit* u, int field,
                              float** out);
uint64_t zs__nvme_file_bytes(const zs_model* m);
/* Writes a unit's span of one field (as read_field's) back to the file. */
zs_status zs__nvme_write_field(zs_model* m, zs__unit* u, int field,
                               const float* buf);
/* read_field, then *out at this rank's shard of it (the optimizer span at
 * stages 1-3 is the shard; at stage 0 the shard is inside it); stale master
 * weights are the parameters widened. *tmp: the caller frees. */
zs_status zs__nvme_shard(zs_model* m, zs__unit* u, int field, char** out,
                         float** tmp);
/* Whether a unit keeps fp32 master weights (in memory, or on NVMe). */
int zs__unit_has_master(const zs_model* m, const zs__unit* u);
const char* zs__nvme_aio_name(const zs__nvme* n);
/* The context's I/O queue and swap directory, and the next swap file's
 * number (each call takes one). */
struct zs__aio* zs__nvme_aio(const zs__nvme* n);
const char* zs__nvme_dir(const zs__nvme* n);
int zs__nvme_next_file(zs__nvme* n);
/* Unlinks every swap file the context made and its swap directory, with
 * unlink/rmdir alone (async-signal-safe): zs_context_remove_files. */
void zs__nvme_remove_files(zs__nvme* n);

/* Stage-3 parameter shards on NVMe (engine_nvme_param.c; offload_param =
 * 2). Without it (m->nvme_params NULL) every call below does nothing and
 * returns ZS_OK, so callers use them unconditionally.
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
 *     gather_done after the all-gather was waited for. */
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
/* Around one unit's optimizer step (both step paths): begin acquires its
 * shard and reads the unit `next` ahead (-1: none); end writes the shard
 * back if st is OK and releases it, returning the first failure. Both are
 * no-ops (end returns st) without parameter shards on NVMe. */
zs_status zs__param_step_begin(zs_model* m, zs__unit* u, int next);
zs_status zs__param_step_end(zs_model* m, zs__unit* u, zs_status st);
void zs__param_gather_done(zs_model* m, zs__unit* u);

/* The staging of the offloaded step on a GPU (engine_step.c), freed with
 * the model's storage. Test hook: nonzero runs the staged path with the
 * host device too (its copies are memcpy), so CPU tests cover it. */
void zs__staging_free(zs_model* m);
extern int zs__offload_force_staging;
/* Whether the offloaded step goes through the staging (gradients in
 * device memory, or the test hook): two slots, the next unit's span
 * coming while one steps; NVMe offload's step with the parameter shards
 * offloaded too stages unit by unit, synchronously (with the shards on
 * NVMe, inside each unit's acquire/write-back of its shard). */
int zs__offload_staged(const zs_model* m);
/* A collective's source in host memory (offloaded parameter shards,
 * master weights, optimizer states): with a device that is not the host
 * (NCCL reads device memory), or the staging test hook, *use is a device
 * copy of its `bytes` BYTES, complete on return if `wait`, else queued on
 * the compute stream (device_ops.upload: src must not change or be freed
 * until the collective that reads it has completed), which *staged also
 * holds for the caller to free with zs__dev_free once the collective is
 * done; otherwise *use is src and *staged NULL. Errors: OUT_OF_MEMORY
 * (device), DEVICE. */
zs_status zs__coll_source(zs_model* m, const void* src, size_t bytes,
                          const char* label, int wait, void** staged,
                          const void** use);
zs_status zs__staging_init(zs_model* m);
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
/* After elements [begin, begin + n) of the unit's flat buffer were written:
 * refreshes the master weights of those that are in this rank's span. */
zs_status zs__master_refresh_range(zs_model* m, zs__unit* u, size_t begin,
                                   size_t n);
zs_status zs__check_finalized(const zs_model* m, const char* fn);

/* The calls whose collectives no agreement guards (zs_unit_gather,
 * zs_unit_prefetch, zs_unit_grad_acquire and _release, zs_step's work after
 * its consistency check, zs_model_init's store of a unit before the next
 * unit's agreement) go on alone on each rank. When one of them fails
 * on this rank for a reason of its own (out of memory, a device, disk or
 * MPI error: codes OUT_OF_MEMORY, DEVICE, IO, COMM, CORRUPT, INTERNAL) and
 * no agreement in the call already told every rank, this rank will skip
 * collectives the others issue: zs__call_end abandons the communicator
 * (zs__comm_abandon), so the others fail at once naming this rank instead
 * of waiting collective_timeout_s. Misuse (INVALID_*, identical on every
 * rank in SPMD code, and the model stays usable), agreed failures and an
 * already failed communicator pass through. `begin` is zs__call_begin's
 * value at the start of the call; returns st (with the note). */
static inline uint64_t zs__call_begin(const zs_model* m) {
  return m->ctx->comm->agreed_failures;
}
zs_status zs__call_end(zs_model* m, uint64_t begin, zs_status st);
/* Calls that issue collectives start with this: INVALID_STATE (naming fn)
 * while the model's micro-batch must be dropped on this rank alone because
 * a reconciliation matched its collectives (see dirty_epoch_seen). */
zs_status zs__check_discarded(zs_model* m, const char* fn);
/* The pieces of a unit's storage-owning tensors (frozen ones skipped when
 * skip_frozen) in [begin, end) of its flat buffer, after finalize:
 * malloc'd into *out (free it), *count of them. Errors: OUT_OF_MEMORY. */
zs_status zs__unit_pieces(const zs_model* m, const zs__unit* u, size_t begin,
                          size_t end, int skip_frozen, zs__piece** out,
                          size_t* count);

/* ---- engine_gather.c ---- */
/* Drops every unused prefetch (waiting for its all-gather) and, at the end
 * of a step, adopts this step's gathers as the trace when the old one did
 * not match. */
zs_status zs__prefetch_drain(zs_model* m);
/* Ends the forward hold of a unit (at the end of its backward). */
void zs__forward_hold_end(zs_model* m, int unit);
void zs__trace_end_step(zs_model* m);
/* Forgets this step's gathers: the trace recorded before the step stays
 * (zs_step_discard). */
void zs__trace_drop_step(zs_model* m);
/* The user's gather of a unit ends without a release (zs_step_discard):
 * its references are dropped, and a forward hold is not taken. */
void zs__gather_abandon(zs_model* m, int unit);
/* Waits for every collective in flight for every unit (reductions are
 * finished), e.g. before reading or freeing buffers outside a step. */
zs_status zs__quiesce(zs_model* m);

/* ---- engine_grad.c ---- */
/* Starts the bucketed reduce-scatter of a unit (ACCUM -> REDUCING). */
zs_status zs__grad_reduce_start(zs_model* m, zs__unit* u);
/* Waits for a REDUCING unit and finishes it (-> REDUCED): the mean over
 * ranks, and its accumulation buffer freed. Local work only (no new
 * collective), so it may run whenever the reduction is done. */
zs_status zs__grad_reduce_finish(zs_model* m, zs__unit* u);
/* Stage 0: starts the all-gathers of every unit's reduced shards back into
 * its full gradient (in unit order; zs_step waits for them). */
zs_status zs__grad_gather_start(zs_model* m);
/* The gradient accumulation runs K micro-batches; this is the K-th. */
static inline int zs__accum_boundary(const zs_model* m) {
  return m->micro + 1 >= m->ctx->config.grad_accum_steps;
}
/* Frees a unit's gradient accumulation state (any state but REDUCING) and
 * makes it IDLE. */
void zs__grad_drop(zs_model* m, zs__unit* u);
/* Makes the accumulation buffer ready (zeroed on the step's first open). */
zs_status zs__grad_prepare(zs_model* m, zs__unit* u);
/* The user's gradient acquire of a unit ends without a release
 * (zs_step_discard): no use is counted and no reduction starts. */
void zs__grad_abandon(zs_model* m, int unit);

/* ---- in-flight lists ---- */
/* Appends op to f; when the list cannot grow (OUT_OF_MEMORY) op is waited
 * for and completed first, so it never runs untracked. */
zs_status zs__inflight_push(zs__comm* c, zs__inflight* f, zs__coll* op);
/* Waits for every op in order; the list ends empty (also on error). */
zs_status zs__inflight_wait(zs__comm* c, zs__inflight* f);
/* Completes the finished ops at the front of the list; *all_done = 1 when
 * the list is empty. */
zs_status zs__inflight_poll(zs__comm* c, zs__inflight* f, int* all_done);
/* Progress at an API call: completes whatever has finished. */
void zs__progress(zs_model* m);
/* Bucket b of a unit's shard: [*offset, *offset + *count). */
int zs__bucket_count(const zs_model* m, const zs__unit* u);
void zs__bucket(const zs_model* m, const zs__unit* u, int b, size_t* offset,
                size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_H_ */
