/*
 * core_policy.h — the per-unit policy: every decision the ZeRO stage, the
 * device and the offload settings make about one unit's storage and
 * communication, computed once (zs_model_finalize; the estimator and
 * config validation with the same function) and asked everywhere else.
 * docs/design.md, "The policy", has the table.
 *
 * Pure: no allocation, no global state. Sizes are ELEMENTS unless named
 * bytes.
 *
 * The algorithm is ZeRO's (Rajbhandari et al., SC'20, section 5): stage
 * 1 shards the optimizer states, 2 also the gradients, 3 also the
 * parameters; ZeRO-Offload (Ren et al., ATC'21) puts the optimizer states
 * and master weights in host memory and runs the step on the CPU;
 * ZeRO-Infinity (Rajbhandari et al., SC'21) puts them, and the parameter
 * shards, on NVMe.
 */
#ifndef ZS_RUNTIME_CORE_POLICY_H_
#define ZS_RUNTIME_CORE_POLICY_H_

#include <stddef.h>

#include <zeroshard.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Where a field of a unit lives. */
typedef enum zs__tier {
  ZS__TIER_NONE = 0,   /* not held at all */
  ZS__TIER_DEVICE = 1, /* the context's device memory */
  ZS__TIER_HOST = 2,   /* CPU offload: NUMA-placed (pinned) host memory */
  ZS__TIER_NVME = 3    /* NVMe offload: swap files, staged in pinned host
                          buffers */
} zs__tier;

/* How much of a unit's flat buffer one rank keeps of a field. */
typedef enum zs__extent {
  ZS__EXTENT_NONE = 0,  /* nothing (a frozen unit's gradients) */
  ZS__EXTENT_FULL = 1,  /* the whole padded buffer */
  ZS__EXTENT_SHARD = 2  /* this rank's shard (padded / world) */
} zs__extent;

/* How a unit's gradients are reduced across the shard group. */
typedef enum zs__reduce {
  ZS__REDUCE_NONE = 0,    /* not trainable */
  ZS__REDUCE_SCATTER = 1  /* bucketed reduce-scatter to the shard, mean over
                             ranks, in fixed rank order (every stage:
                             docs/design.md, "Reductions") */
} zs__reduce;

/* How a model's step runs its one loop (engine_optim.c's zs__optimize;
 * one mode per model). */
typedef enum zs__optim_loop {
  ZS__LOOP_UNITS = 0,  /* unit by unit where the optimizer span lives (or,
                          with NVMe parameter shards and a device, staged
                          one unit at a time) */
  ZS__LOOP_STAGED = 1, /* CPU offload with a device: spans staged through
                          two pinned slots, CPU workers step one while the
                          next is copied */
  ZS__LOOP_NVME = 2    /* NVMe offload: the store's sub-groups swapped
                          through a ring (staged as above around them) */
} zs__optim_loop;

/* What the policy is computed from. */
typedef struct zs__policy_in {
  int stage;             /* 0..3 */
  int device_is_host;    /* the host backend (no device copies) */
  int lowp;              /* 16-bit parameters (an fp32 master copy) */
  int trainable;         /* has a gradient and an optimizer span */
  int offload_optimizer; /* ZS_OFFLOAD_NONE, _CPU or _NVME */
  int offload_param;     /* ZS_OFFLOAD_NONE, _CPU or _NVME */
} zs__policy_in;

/* One unit's policy. */
typedef struct zs__policy {
  int stage;     /* what it was made from */
  int trainable;
  int lowp;
  /* Parameters. */
  zs__extent params;        /* persistent: FULL (stages 0-2), SHARD (3) */
  zs__tier params_tier;     /* where the persistent ones live */
  int gather_on_use;        /* SHARD: all-gathered into a transient full
                               buffer while used, dropped after */
  int gather_via_copy;      /* the all-gather reads a device copy of a
                               shard in host memory or on NVMe */
  int refresh_after_step;   /* FULL but the optimizer span is the shard
                               (stages 1-2): the updated shards are
                               all-gathered back after the step */
  /* Gradients. */
  zs__extent grads;         /* persistent: FULL (0-1), SHARD (2-3) */
  int accum_transient;      /* backward accumulates into a transient full
                               buffer (grads SHARD), else into the grads */
  zs__reduce reduce;
  int grads_gather_back;    /* the optimizer span is FULL (stage 0): the
                               reduced shards are all-gathered back into
                               the full gradients before the step */
  /* The optimizer. */
  zs__extent opt_span;      /* what it updates: FULL (0), SHARD (1-3);
                               a frozen unit's too (nothing in it moves) */
  zs__tier master_tier;     /* fp32 master weights (16-bit units) */
  zs__tier state_tier;      /* optimizer states (moments) */
  int comm;                 /* 0: the unit's collectives run in the shard
                               group (ctx->shard_comm: the context's
                               communicator without hybrid sharding), its
                               gradients' replica all-reduce in the
                               replica group */
} zs__policy;

/* Computes a unit's policy.
 * - in: the settings (not NULL); out: written on success.
 * - Errors: INVALID_ARGUMENT naming the field for a combination no policy
 *   exists for: stage outside 0..3, an offload value outside 0..2,
 *   parameter offload without stage 3 and optimizer offload (ZeRO-Infinity
 *   offloads the parameters of stage 3 only, and steps them where the
 *   optimizer states are). Config validation asks this function. */
zs_status zs__policy_make(const zs__policy_in* in, zs__policy* out);

/* The elements of the unit's optimizer span (padded or shard). */
static inline size_t zs__policy_span(const zs__policy* p, size_t padded,
                                     size_t shard) {
  return p->opt_span == ZS__EXTENT_FULL ? padded : shard;
}

/* Elements from the start of a field of `extent` to this rank's shard in
 * it: rank * shard for a FULL field, 0 for a SHARD. */
static inline size_t zs__policy_shard_offset(zs__extent extent, int rank,
                                             size_t shard) {
  return extent == ZS__EXTENT_FULL ? (size_t)rank * shard : 0;
}

/* The model's loop mode, from any trainable unit's policy and
 * whether the step is staged (CPU offload with a device, or forced by the
 * offload tests). nvme_optimizer: the model has NVMe optimizer state
 * (a trainable unit with offload_optimizer NVMe); nvme_params: parameter
 * shards on NVMe. */
zs__optim_loop zs__policy_loop(int nvme_optimizer, int staged,
                               int nvme_params);

/* Whether a tier is read through host memory (CPU offload's, or NVMe's
 * pinned buffers): a collective on a device reads a device copy. */
static inline int zs__tier_in_host(zs__tier t) {
  return t == ZS__TIER_HOST || t == ZS__TIER_NVME;
}

/* A tier's name ("none", "device", "host", "nvme"), for logs and tests. */
const char* zs__tier_name(zs__tier t);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CORE_POLICY_H_ */
