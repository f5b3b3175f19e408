/*
 * engine.h — the engine's data (the model, its units and tensors, the
 * engine's state of a context) and its base (engine.c): checks of the
 * public calls, in-flight lists, buckets, where shards live. One code path
 * for every stage and backend; the stage only decides which buffers
 * persist (docs/design.md, "Unit state machine"). The engine talks to
 * memory through device.h and to other ranks through comm.h, never to
 * MPI, NCCL or CUDA directly.
 *
 * The engine's files, lowest first (each calls only those before it;
 * tools/layers.txt checks the includes, tools/callgraph.py the calls):
 *   engine.c          this base
 *   engine_nvme_io.c  NVMe offload's I/O queue and swap directory
 *   engine_nvme_param.c  stage-3 parameter shards on NVMe
 *   engine_unit.c     a unit's buffers through a step, progress, the
 *                     public calls' funnel
 *   engine_view.c     stacked kinds' views (memfd mappings)
 *   engine_sched.c    prefetch along the recorded order
 *   engine_optim.c    the optimizer on each rank's span
 *   engine_optim_nvme.c  NVMe offload of the optimizer states
 * and the features, which call only those and never each other:
 *   engine_model.c (registration, finalize, destroy, the engine's state of
 *   a context), engine_gather.c, engine_grad.c, engine_step.c,
 *   engine_io.c (initial values, tensor get/set), engine_ckpt.c.
 */
#ifndef ZS_RUNTIME_ENGINE_H_
#define ZS_RUNTIME_ENGINE_H_

#include "runtime/context/context.h"
#include "runtime/core/core_policy.h"
#include "runtime/layout/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The engine's state of a context (zs_context.engine): its live models and
 * NVMe offload's I/O queue and swap directory (NULL without NVMe offload).
 * Made with the context (zs__engine_context_init, engine_model.h), torn
 * down by a hook on it. */
typedef struct zs__engine_ctx {
  zs_model* models;
  struct zs__nvme* nvme;
} zs__engine_ctx;

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
  int kind;          /* a stacked kind's slice: the kind, else -1 */
  int layer;         /* ... its layer */
  size_t kind_offset; /* ... elements into the kind's views */
  int64_t step;      /* optimizer updates applied (per parameter, as PyTorch) */
} zs__tensor;

/* Gradient state of a unit within one step. */
typedef enum zs__grad_state {
  ZS__GRAD_IDLE = 0,     /* not touched this step */
  ZS__GRAD_ACCUM = 1,    /* accumulation buffer live (zeroed at first open) */
  ZS__GRAD_REDUCING = 2, /* reduce-scatter buckets in flight */
  ZS__GRAD_REDUCED = 3   /* reduced into the shard (mean over ranks) */
} zs__grad_state;

/* Parameter state of a unit (docs/design.md, "State machines"). A policy
 * with the whole buffer resident (stages 0-2) moves between RESIDENT and
 * REFRESHING; one that gathers on use (stage 3) between SHARDED,
 * GATHERING and GATHERED:
 *   RESIDENT --step's all-gather of the updated shards--> REFRESHING
 *   REFRESHING --its completion--> RESIDENT
 *   SHARDED --first hold: full buffer, all-gather started--> GATHERING
 *   GATHERING --its completion--> GATHERED
 *   GATHERING, GATHERED --last drop, or a failed start--> SHARDED (freed)
 * zs__param_state_set refuses any other change. */
typedef enum zs__param_state {
  ZS__PARAM_RESIDENT = 0,   /* the whole buffer, complete */
  ZS__PARAM_REFRESHING = 1, /* the whole buffer, shards being gathered in */
  ZS__PARAM_SHARDED = 2,    /* the shard only */
  ZS__PARAM_GATHERING = 3,  /* a full buffer, its all-gather in flight */
  ZS__PARAM_GATHERED = 4    /* a full buffer, complete */
} zs__param_state;

/* Collectives of one kind in flight for a unit, in issue order. */
typedef struct zs__inflight {
  zs__coll** ops;
  int n;
  int cap;
  /* the first failure zs__inflight_poll saw (its op is gone), for the
   * owner's next wait or chain; ZS_OK: none */
  zs_status failed;
  char failed_msg[512];
} zs__inflight;

/* One view of a stacked kind (engine_view.c): a memfd mapping of the
 * kind's `numel` elements of `elem` bytes, whose pages under no held
 * slice are punched out. live[p]: held slices overlapping page p. */
typedef struct zs__view {
  int fd;           /* -1: no view (before finalize, or no trainable slice) */
  char* base;       /* mapped for `mapped` bytes (whole pages) */
  size_t mapped;
  size_t elem;      /* bytes per element */
  uint32_t* live;   /* one count per page */
  size_t resident;  /* bytes of pages with live > 0 (accounted) */
} zs__view;

/* A stacked kind (zs_model_add_kind). */
typedef struct zs__kind {
  char name[ZS_NAME_MAX];
  int ndim;
  int64_t shape[ZS_MAX_DIMS]; /* shape[0]: layers */
  size_t numel;               /* elements of the whole kind */
  size_t slice_numel;         /* prod(shape[1..]) */
  zs_dtype dtype;
  int* slices;                /* tensor per layer, -1 until added */
  zs__view views[2];          /* ZS__VIEW_PARAMS, ZS__VIEW_GRADS */
} zs__kind;
enum { ZS__VIEW_PARAMS = 0, ZS__VIEW_GRADS = 1 };

/* Steps over which the stage-3 live limit remembers the units gathered on
 * use that were not steady (engine_sched.c). */
#define ZS__RESERVE_WINDOW 8

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
  zs__policy policy; /* where each field lives and how it moves: made once
                        at finalize (core_policy.h); nothing else tests the
                        stage or the offload settings for a unit */

  /* Storage. The policy decides which of these persist (by stage today):
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
  void* state[ZS_OPTIM_MAX_STATES];
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
  zs__grad_state grad_state;  /* changed by zs__grad_state_set only */
  zs__param_state param_state; /* changed by zs__param_state_set only */
  int reopened;       /* opened again after its reduction this step */
  int releases;       /* gradient releases this step (ties count) */
  int view_refs;      /* user gathers holding its stacked slices (ties
                         count): copied in at 0 -> 1, punched at 1 -> 0 */
  int gview_refs;     /* ... gradient acquires holding them */
  int strategy;       /* zs_unit_strategy */
  int allow_unused;   /* zs_unit_allow_unused: ranks may skip it; reduced
                         in zs_step, never prefetched, and at stage 3
                         gathered to its users only (engine_unit.c) */
  int unused;         /* zs_unit_mark_unused in this micro-batch */
  int touched;        /* gathered or acquired in this micro-batch */
  int replicated;     /* at finalize: never sharded (policy of stage 0) */
  int seen_this_step; /* gathered by the user in this training step */
  int streak;         /* consecutive completed steps that gathered it: a
                         unit is prefetched only when it was gathered in
                         each of the last ZS__PREFETCH_STEADY (engine_sched.c)
                         steps with a trace */
  size_t unsteady_held; /* elements it adds to zs_model.unsteady_live while
                           gathered (gathered on use, not steady) */
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
  zs__kind* kinds; /* stacked kinds (zs_model_add_kind) */
  int nkinds;
  int kinds_cap;
  /* zs_model_set_optimizer: the user's update replacing the built-in one
   * (optim_fn NULL: config.optimizer.kind's) */
  zs_optimizer_fn optim_fn;
  void* optim_user;
  int optim_nstates;
  char optim_name[64]; /* the optimizer's name in checkpoints (built-in or
                          the user's) */
  void* rank_blob;        /* zs_checkpoint_set_rank_blob's copy (malloc) */
  size_t rank_blob_bytes;
  double* group_lr; /* per param group */
  double* group_wd;
  int ngroups;
  zs_model* next; /* in the engine's list of the context's models
                     (zs__engine_ctx); NULL ctx: detached (ctx destroyed) */
  zs__hook* hooks; /* what higher layers attached (drivers), torn down by
                      zs_model_destroy (core.h) */
  int finalized;
  int gathers; /* some unit's parameters are gathered on use (its policy's
                  gather_on_use: stage 3): prefetch, the live limit */
  int parameters_offloaded; /* some unit's parameter shards are off the
                               device (its policy's params_tier: host or
                               NVMe) */
  int finalize_failed; /* zs_model_finalize returned an error: later calls
                          say so, not "call zs_model_finalize first" */
  int poisoned; /* a registration call failed on this rank */
  char poison_msg[512];
  int eval;              /* zs_model_set_eval: forward only, outside the
                            step's trace, no prefetch, no forward holds */
  int uses_warned;        /* zs__uses_warn said it (once per model) */
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
  uint64_t prefetch_gathers; /* all-gathers prefetch started, ever (tests) */
  size_t persistence_threshold; /* zs_model_set_persistence_threshold */
  int trace_steps;  /* completed steps recorded (capped): the steadiness
                       window's length so far */
  int* reducing;    /* units in state REDUCING, oldest first */
  int nreducing, reducing_cap;
  size_t live_elems;     /* stage 3: elements of params_full allocated */
  size_t max_live_elems; /* 0: no limit (raised to the largest unit) */
  /* Stage 3, the live limit's room for units gathered on use that are not
   * steady (engine_sched.c): the largest of the last ZS__RESERVE_WINDOW
   * steps' peaks of such units gathered at once (elements). */
  size_t unsteady_elems;
  size_t unsteady_live;      /* such units gathered now */
  size_t unsteady_step_peak; /* ... at most, in this step */
  size_t unsteady_peaks[ZS__RESERVE_WINDOW]; /* the last steps' peaks */
  uint64_t steps_traced;     /* completed steps that gathered a unit */
  /* CPU offload with a GPU: page-locked staging of the step (two slots of
   * the largest span's gradients and parameters) and its copy stream. */
  void* staging_g[2];
  void* staging_p[2];
  zs__stream* staging_stream;
  /* NVMe offload: the swap file and sub-groups (engine_optim_nvme.c); NULL
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
  uint64_t dirty_epoch_seen; /* (zs__dirty_epoch: with shard groups, the
                                 shard group's reconciliations count too) */
  int discard_local;
};

/* ---- The base (engine.c) ---- */
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
/* Optimizer state k of a unit, pointing at this rank's shard (NULL when
 * the state is not in memory). */
void* zs__state_shard_ptr(zs_model* m, zs__unit* u, int k);
/* A 16-bit unit's fp32 master weights for this rank's shard, and their
 * refresh from the parameters after these were written (master_stale). */
void* zs__master_shard_ptr(zs_model* m, zs__unit* u);
zs_status zs__master_refresh(zs_model* m, zs__unit* u);
/* Whether a unit keeps fp32 master weights (in memory, or on NVMe). */
int zs__unit_has_master(const zs_model* m, const zs__unit* u);
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
/* The optimizer span of a unit (the padded buffer at stage 0, the rank's
 * shard at 1-3: returned, in elements) and the device buffers holding its
 * parameters and gradients. */
size_t zs__optimize_span(zs_model* m, zs__unit* u, char** p, char** g);
/* Its element count alone. */
size_t zs__optimize_span_elems(const zs_model* m, const zs__unit* u);
/* The state machines' checked transitions (the diagrams at zs__param_state
 * and zs__grad_state): an illegal change leaves the state as it was and
 * is INVALID_STATE naming the unit and both states. zs__param_complete:
 * GATHERING -> GATHERED and REFRESHING -> RESIDENT once the unit's
 * collectives filling the buffer are done (no-op otherwise). */
zs_status zs__param_state_set(zs__unit* u, zs__param_state to);
void zs__param_complete(zs__unit* u);
zs_status zs__grad_state_set(zs__unit* u, zs__grad_state to);
const char* zs__param_state_name(zs__param_state s);
const char* zs__grad_state_name(zs__grad_state s);
/* The optimizer span's first element in the flat buffer (0, or this
 * rank's shard's first). */
size_t zs__span_begin(const zs_model* m, const zs__unit* u);
/* Elements from the optimizer span's start to this rank's shard in it
 * (rank * shard when the span is the whole buffer, else 0). */
size_t zs__span_shard_offset(const zs_model* m, const zs__unit* u);
/* Test hook: nonzero runs the staged path of CPU offload with the host
 * device too (its copies are memcpy), so CPU tests cover it. */
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
zs_status zs__check_finalized(const zs_model* m, const char* fn);
/* A public call's checks of a unit id (after zs__check_finalized). */
zs_status zs__check_unit(const zs_model* m, int unit, const char* fn);
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
/* The pieces of [begin, end) of a flat buffer (zs__layout_pieces over the
 * given arrays of n tensors: offsets and numels in elements), in a
 * malloc'd array sized to fit: *out (the caller frees), *count. Errors:
 * OUT_OF_MEMORY naming the unit. */
zs_status zs__pieces_alloc(const size_t* offsets, const size_t* numels,
                           const int* alias, const int* skip, int n,
                           size_t begin, size_t end, const char* unit,
                           zs__piece** out, size_t* count);
/* The gradient accumulation runs K micro-batches; this is the K-th. */
static inline int zs__accum_boundary(const zs_model* m) {
  return m->micro + 1 >= m->ctx->config.grad_accum_steps;
}

/* The reconciliations that matched collectives, of the context's
 * communicator and, with shard groups, of the shard group's. */
static inline uint64_t zs__dirty_epoch(const zs_context* ctx) {
  return ctx->comm->dirty_epoch +
         (ctx->shard_comm != ctx->comm ? ctx->shard_comm->dirty_epoch : 0);
}

/* ---- In-flight lists and buckets ---- */
/* Appends op to f; when the list cannot grow (OUT_OF_MEMORY) op is waited
 * for and completed first, so it never runs untracked. */
zs_status zs__inflight_push(zs__comm* c, zs__inflight* f, zs__coll* op);
/* Waits for every op in order; the list ends empty (also on error). */
zs_status zs__inflight_wait(zs__comm* c, zs__inflight* f);
/* Hands every op to its consumers on the device (zs__coll_chain: no host
 * wait where the backend can chain; the communicator owns them then); the
 * list ends empty (also on error). */
zs_status zs__inflight_chain(zs__comm* c, zs__inflight* f);
/* Completes the finished ops at the front of the list; *all_done = 1 when
 * the list is empty. */
zs_status zs__inflight_poll(zs__comm* c, zs__inflight* f, int* all_done);
/* Bucket b of a unit's shard: [*offset, *offset + *count). */
int zs__bucket_count(const zs_model* m, const zs__unit* u);
void zs__bucket(const zs_model* m, const zs__unit* u, int b, size_t* offset,
                size_t* count);


#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_H_ */
