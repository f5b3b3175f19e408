/*
 * estimate.c — per-rank memory before running anything (zeroshard.h,
 * "Memory estimator"): model states from the same layout code the engine
 * uses (so they are exact), plus the stage-3 gathered working set, the
 * gradient reduction buffers and described activations (estimates).
 * Model states follow the ZeRO paper (Rajbhandari et al., arXiv:1910.02054,
 * section 3 and Figure 1).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/core/core_compat.h"
#include "runtime/core/core.h"
#include "runtime/layout/layout.h"

/* The estimator's view of a configuration and its inputs: flat, as the
 * engine's allocations need them (zs__estimate_config_of builds it from a
 * zs_config and a zs_estimate_input). */
typedef struct zs__estimate_config {
  int ranks;
  int nodes;
  int stage;
  zs_dtype dtype; /* ZS_DTYPE_COUNT: the description's (fp32 for a count) */
  int reduce_dtype; /* -1 or ZS_FLOAT32 */
  zs_optimizer_kind optimizer;
  int sgd_momentum; /* SGD keeps a momentum buffer */
  int prefetch_depth;
  int global_batch;
  int grad_accum_steps;
  int offload_optimizer; /* 0 none, 1 cpu, 2 nvme */
  int offload_params;
  size_t nvme_buffer_size;
  size_t nvme_sub_group_size;
  size_t nvme_buffer_count;
  size_t nvme_param_buffer_count;
  size_t nvme_param_buffer_elements;
  size_t largest_unit_elements;
  zs_device_kind device;
  int grad_accum_local;
  /* (0.1's zs_estimate_config ends here: zs__estimate_v01 copies that
   * much of a 0.1 caller's struct and sets the fields below) */
  int host_shm;  /* host collectives through the shared-memory segment:
                    more than one rank, all on one host, the host device,
                    host_collectives not MPI */
  int rs_temps;  /* reduce-scatters hold bucket temporaries (all but the
                    segment's fixed-order one, which sums as it reads) */
  int shard_ranks; /* G: the shard group (hybrid sharding); ranks: flat */
  int segments;  /* communicators with a shared-memory segment: the
                    context's, and each of its groups' on one host */
  int replica_temps; /* replicas all-reduce over MPI: the step holds a
                    fixed-order reduce-scatter temporary of every trainable
                    unit's gradient shard (engine_step.c) */
} zs__estimate_config;

/* A unit's policy (core_policy.h), as the engine makes it at finalize;
 * lowp and trainable 1 give the model's placement (the tiers and extents
 * depend on them only to say that a unit holds no master weights, or no
 * gradients and optimizer states). The configuration was checked first
 * (zs__estimate_check makes the same policy). */
static zs__policy zs__est_policy(const zs__estimate_config* c, int lowp,
                                 int trainable) {
  const zs__policy_in in = {c->stage, c->device == ZS_DEVICE_HOST, lowp,
                            trainable, c->offload_optimizer, c->offload_params};
  zs__policy p;
  if (zs__policy_make(&in, &p) != ZS_OK) memset(&p, 0, sizeof p);
  return p;
}

/* A described unit's settings: the config's, or stage 0's for a
 * replicated unit (zs_unit_set_strategy), whose parameters are never
 * offloaded. */
static zs__estimate_config zs__est_unit_config(const zs__estimate_config* c,
                                               int replicated) {
  zs__estimate_config uc = *c;
  if (replicated) {
    uc.stage = 0;
    uc.offload_params = ZS_OFFLOAD_NONE;
  }
  return uc;
}

/* What each rank holds for a unit: the sizes the engine allocates
 * (zs__layout_unit_bytes), added up per category. */
static void zs__estimate_states(const zs__estimate_config* c,
                                const zs__unit_layout* l, size_t elem,
                                size_t gelem, int lowp, int trainable,
                                int nstates, zs_memory_estimate* out) {
  const zs__policy pol = zs__est_policy(c, lowp, trainable);
  const zs__unit_bytes b = zs__layout_unit_bytes(l, &pol, elem, gelem);
  out->bytes[ZS_MEM_PARAMS] += b.params;
  out->bytes[ZS_MEM_GRADS] += b.grads;
  out->bytes[ZS_MEM_MASTER_WEIGHTS] += b.master;
  out->bytes[ZS_MEM_OPTIMIZER_STATES] += (size_t)nstates * b.state;
}

static int zs__estimate_nstates(const zs__estimate_config* c) {
  if (c->optimizer == ZS_OPTIM_SGD) return c->sgd_momentum ? 1 : 0;
  return 2;
}

static zs_status zs__estimate_check(const zs__estimate_config* c) {
  ZS_REQUIRE(c != NULL, "zs_estimate: config is NULL");
  ZS_REQUIRE(c->ranks >= 1, "zs_estimate: input.ranks must be >= 1, got %d",
             c->ranks);
  ZS_REQUIRE(c->nodes >= 1 && c->ranks % c->nodes == 0,
             "zs_estimate: input.nodes must be >= 1 and divide ranks %d, got %d",
             c->ranks, c->nodes);
  ZS_REQUIRE(c->shard_ranks >= 1 && c->ranks % c->shard_ranks == 0,
             "zs_estimate: config.shard_group_size %d does not divide ranks "
             "%d", c->shard_ranks, c->ranks);
  ZS_REQUIRE(c->stage >= 0 && c->stage <= 3,
             "zs_estimate: config.stage must be 0..3, got %d", c->stage);
  ZS_REQUIRE(c->dtype == ZS_FLOAT32 || c->dtype == ZS_BFLOAT16 ||
                 c->dtype == ZS_FLOAT16 || c->dtype == ZS_DTYPE_COUNT,
             "zs_estimate: input.param_dtype must be fp32, bf16, fp16 or "
             "ZS_DTYPE_AUTO, got %d",
             (int)c->dtype);
  ZS_REQUIRE(c->reduce_dtype == -1 || c->reduce_dtype == ZS_FLOAT32,
             "zs_estimate: config.reduce_dtype must be ZS_DTYPE_AUTO or "
             "ZS_FLOAT32, got %d",
             c->reduce_dtype);
  ZS_REQUIRE(c->optimizer == ZS_OPTIM_ADAMW || c->optimizer == ZS_OPTIM_ADAM ||
                 c->optimizer == ZS_OPTIM_SGD,
             "zs_estimate: unknown config.optimizer.kind %d", (int)c->optimizer);
  ZS_REQUIRE(c->prefetch_depth >= 0 && c->prefetch_depth <= 64,
             "zs_estimate: config.prefetch_depth must be 0..64, got %d",
             c->prefetch_depth);
  ZS_REQUIRE(c->grad_accum_steps >= 1,
             "zs_estimate: config.grad_accum_steps must be >= 1, got %d",
             c->grad_accum_steps);
  ZS_REQUIRE(c->grad_accum_local == 0 || c->grad_accum_local == 1,
             "zs_estimate: config.grad_accum_local must be 0 or 1, got %d",
             c->grad_accum_local);
  ZS_REQUIRE(c->global_batch >= 0 &&
                 c->global_batch % ((long long)c->ranks * c->grad_accum_steps) == 0,
             "zs_estimate: input.global_batch %d is not divisible by ranks "
             "%d x "
             "grad_accum_steps %d (each rank takes whole sequences of each "
             "micro-batch)", c->global_batch, c->ranks, c->grad_accum_steps);
  ZS_REQUIRE(c->offload_optimizer >= 0 && c->offload_optimizer <= 2,
             "zs_estimate: config.offload_optimizer.device must be none, "
             "cpu or nvme, "
             "got %d", c->offload_optimizer);
  ZS_REQUIRE(c->offload_optimizer != 2 || c->nvme_buffer_count >= 3,
             "zs_estimate: config.nvme.buffer_count must be >= 3 (three "
             "sub-groups "
             "in flight), got %zu", c->nvme_buffer_count);
  ZS_REQUIRE(c->offload_optimizer != 2 ||
                 (c->nvme_buffer_size >= 4096 && c->nvme_buffer_size % 4096 == 0),
             "zs_estimate: config.nvme.buffer_size must be a multiple of "
             "4096, got "
             "%zu", c->nvme_buffer_size);
  ZS_REQUIRE(c->offload_params >= 0 && c->offload_params <= 2,
             "zs_estimate: config.offload_param must be none, cpu or nvme, "
             "got %d", c->offload_params);
  {
    /* the combinations a policy exists for (core_policy.c) */
    const zs__policy_in in = {c->stage, c->device == ZS_DEVICE_HOST, 1, 1,
                              c->offload_optimizer, c->offload_params};
    zs__policy pol;
    if (zs__policy_make(&in, &pol) != ZS_OK)
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "zs_estimate: config.offload_param needs stage 3 and "
                       "offload_optimizer (got offload_param %d, stage %d)",
                       c->offload_params, c->stage);
  }
  ZS_REQUIRE(c->device == ZS_DEVICE_HOST || c->device == ZS_DEVICE_CUDA,
             "zs_estimate: config.device must be ZS_DEVICE_HOST or "
             "ZS_DEVICE_CUDA, "
             "got %d", (int)c->device);
  ZS_REQUIRE(c->offload_params != 2 || (c->nvme_param_buffer_count >= 1 &&
                                        c->nvme_param_buffer_count <= 4096),
             "zs_estimate: config.nvme.param_buffer_count must be 1..4096, "
             "got %zu",
             c->nvme_param_buffer_count);
  return ZS_OK;
}

/* What the offload terms need of the units (engine_optim_nvme.c and
 * engine_nvme_param.c lay their files out from the same quantities;
 * engine_step.c's zs__staging_init and engine_gather.c's zs__hold size the
 * CUDA staging from them). */
typedef struct zs__est_offload {
  size_t largest_span;              /* elements: the largest trainable
                                       optimizer span */
  size_t state_field_bytes;         /* one field of every trainable span
                                       in the swap file, rounded per
                                       sub-group (zs__layout_nvme_span_bytes) */
  size_t largest_param_shard_bytes; /* the largest parameter shard */
  size_t param_file_bytes;          /* the shards, each rounded to 4 KiB */
  size_t widest_elem;               /* the widest parameter dtype, bytes */
  size_t span_grad_bytes;  /* the largest trainable span's gradients */
  size_t span_param_bytes; /* ... and parameters (not always one unit's) */
  size_t gather_src_bytes; /* stage 3: the working set's shards */
  int nstates;             /* optimizer state fields per element: the
                              config's optimizer's, or a description's
                              "optimizer_states" (a callback's) */
  size_t grad_shard_bytes; /* every trainable unit's gradient shard: the
                              replica all-reduce's temporaries over MPI */
} zs__est_offload;

/* Whether reductions run one at a time, none beside the next unit's
 * accumulation: with one rank on the host a reduction is a local copy,
 * complete before the next unit's acquire finishes it (engine_grad.c polls
 * there). With CUDA it runs on the communication stream and may still be
 * in flight; with more ranks ZS__MAX_REDUCING of them may be. */
static int zs__est_serial_reductions(const zs__estimate_config* c) {
  return c->ranks == 1 && c->device != ZS_DEVICE_CUDA;
}

/* ZeRO-Offload (Ren et al., arXiv:2101.06840): master weights and
 * optimizer states move to host memory (offload_host); with parameter
 * offload (ZeRO-Infinity's CPU tier) the parameter shards too; NVMe
 * offload (ZeRO-Infinity, SC'21) moves them to the swap files (nvme_bytes,
 * their size on disk) through pinned staging. The fields mean what
 * zs_memory_stats means: model_state_bytes counts the four model-state
 * categories (not offload_host), total every category. Errors:
 * INVALID_ARGUMENT (too few NVMe buffers for the fields). */
static zs_status zs__estimate_total(zs_memory_estimate* out,
                                    const zs__estimate_config* c,
                                    const zs__est_offload* nv) {
  const zs__policy pol = zs__est_policy(c, 1, 1);
  if (pol.state_tier == ZS__TIER_NVME) {
    /* NVMe: the swap file holds them, each field's span in sub-groups
     * rounded up to 4 KiB; each slot of the pinned pool's ring holds a
     * sub-group's fields (engine_optim_nvme.c) */
    const size_t master = out->bytes[ZS_MEM_MASTER_WEIGHTS];
    const size_t fields = (master > 0) + (size_t)nv->nstates;
    ZS_REQUIRE(fields == 0 || c->nvme_buffer_count >= 3 * fields,
               "zs_estimate: nvme_buffer_count %zu is below the %zu buffers "
               "NVMe offload needs here (3 sub-groups in flight at least, x "
               "%zu fields: %soptimizer states), which the engine refuses",
               c->nvme_buffer_count, 3 * fields, fields,
               master > 0 ? "master weights and " : "");
    const size_t exact = master + out->bytes[ZS_MEM_OPTIMIZER_STATES];
    out->nvme_bytes = exact > 0 ? fields * nv->state_field_bytes : 0;
    size_t sg = zs__layout_nvme_sub_group(c->nvme_buffer_size,
                                          c->nvme_sub_group_size);
    if (nv->largest_span < sg) sg = nv->largest_span;
    const size_t slot = zs__layout_nvme_round(sg * 4);
    /* the ring of the pool (zs__layout_nvme_slots) */
    const int ring = fields > 0 ? zs__layout_nvme_slots(c->nvme_buffer_count, (int)fields) : 0;
    if (exact > 0)
      out->bytes[ZS_MEM_NVME_STAGING] += (size_t)ring * fields * slot;
    out->bytes[ZS_MEM_MASTER_WEIGHTS] = out->bytes[ZS_MEM_OPTIMIZER_STATES] = 0;
  } else if (pol.state_tier == ZS__TIER_HOST) {
    out->bytes[ZS_MEM_OFFLOAD_HOST] += out->bytes[ZS_MEM_MASTER_WEIGHTS] +
                                       out->bytes[ZS_MEM_OPTIMIZER_STATES];
    out->bytes[ZS_MEM_MASTER_WEIGHTS] = out->bytes[ZS_MEM_OPTIMIZER_STATES] = 0;
  }
  if (pol.params_tier == ZS__TIER_NVME) {
    /* NVMe: the shards in the parameter swap file; a pool of pinned
     * buffers, each the largest shard rounded up to 4 KiB unless set
     * (engine_nvme_param.c) */
    out->nvme_bytes += nv->param_file_bytes;
    size_t buf = zs__layout_nvme_round(nv->largest_param_shard_bytes);
    if (buf < ZS__NVME_ALIGN) buf = ZS__NVME_ALIGN;
    if (c->nvme_param_buffer_elements > 0)
      buf = zs__layout_nvme_round(c->nvme_param_buffer_elements * nv->widest_elem);
    out->bytes[ZS_MEM_NVME_STAGING] += c->nvme_param_buffer_count * buf;
    out->bytes[ZS_MEM_PARAMS] = 0;
  } else if (pol.params_tier == ZS__TIER_HOST) {
    out->bytes[ZS_MEM_OFFLOAD_HOST] += out->bytes[ZS_MEM_PARAMS];
    out->bytes[ZS_MEM_PARAMS] = 0;
  }
  /* with replicas over MPI, the step's replica all-reduce holds a
   * temporary of every gradient shard, when nothing else of the comm
   * buffers is held (engine_step.c, zs__replica_reduce) */
  if (c->replica_temps && nv->grad_shard_bytes > out->bytes[ZS_MEM_COMM_BUFFERS])
    out->bytes[ZS_MEM_COMM_BUFFERS] = nv->grad_shard_bytes;
  /* every context's communication log (context.c), on every rank */
  out->bytes[ZS_MEM_OTHER] += ZS__COMM_LOG_BYTES;
  /* this rank's part of the host collectives' segment (comm_shm.h) */
  out->bytes[ZS_MEM_COMM_SEGMENT] +=
      (size_t)c->segments * ZS__SHM_LANES * ZS__SHM_RANK_BYTES;
  if (c->device == ZS_DEVICE_CUDA) {
    /* The optimizer steps on the host while parameters and gradients stay
     * in device memory: two slots of page-locked staging, each the largest
     * span's gradients and parameters (CPU and NVMe offload alike); NCCL
     * reads an offloaded shard from a device copy, one per unit gathered. */
    if (pol.state_tier != ZS__TIER_DEVICE)
      out->bytes[ZS_MEM_OFFLOAD_HOST] += 2 * (nv->span_grad_bytes + nv->span_param_bytes);
    if (pol.gather_via_copy) out->bytes[ZS_MEM_COMM_BUFFERS] += nv->gather_src_bytes;
  }
  out->total = 0;
  for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++) out->total += out->bytes[k];
  out->model_state_bytes =
      out->bytes[ZS_MEM_PARAMS] + out->bytes[ZS_MEM_GRADS] +
      out->bytes[ZS_MEM_MASTER_WEIGHTS] + out->bytes[ZS_MEM_OPTIMIZER_STATES];
  return ZS_OK;
}

/* The wire bytes of m's log bytes (docs/scaling.md): (n - 1) / n of a
 * collective among n ranks, spread evenly over the peers; shard groups of
 * consecutive ranks aligned with nodes of L ranks. */
static void zs__est_comm_sent(const zs__estimate_config* c,
                              zs_comm_estimate* m) {
  const int W = c->ranks, L = c->ranks / c->nodes, G = c->shard_ranks;
  const int R = W / G;
  m->shard_ranks = G;
  m->replicas = R;
  const double shard = (double)m->param_gather_bytes +
                       (double)m->grad_reduce_bytes +
                       (double)m->grad_gather_bytes +
                       (double)m->param_update_gather_bytes;
  const double gsent = G > 1 ? shard * (G - 1) / G : 0;
  const double gintra = G <= L ? 1.0 : (double)(L - 1) / (G - 1);
  const double rsent = R > 1 ? (double)m->replica_reduce_bytes * (R - 1) / R : 0;
  const double rintra = R > 1 && G < L ? ((double)L / G - 1) / (R - 1) : 0;
  m->intra_node_sent_bytes = gsent * gintra + rsent * rintra;
  m->inter_node_sent_bytes = gsent * (1 - gintra) + rsent * (1 - rintra);
}

/* Adds one unit's collectives of a step to m (zs_comm_estimate's rules):
 * padded and shard in elements, elem / gelem the parameters' and the
 * gradients' bytes, p its policy; `gathers` the times its parameters are
 * all-gathered per micro-batch at stage 3 (2, plus 2 for each unit tied
 * to it). */
static void zs__est_comm_unit(const zs__estimate_config* c, const zs__policy* p,
                              int trainable, size_t padded, size_t shard,
                              size_t elem, size_t gelem, int gathers,
                              zs_comm_estimate* m) {
  const uint64_t K = (uint64_t)c->grad_accum_steps;
  const uint64_t P = (uint64_t)padded * elem, Pg = (uint64_t)padded * gelem;
  if (p->gather_on_use) m->param_gather_bytes += K * (uint64_t)gathers * P;
  if (!trainable) return;
  /* a reduction per micro-batch, or once with local accumulation */
  m->grad_reduce_bytes += (c->grad_accum_local ? 1 : K) * Pg;
  if (p->grads_gather_back) m->grad_gather_bytes += Pg;
  if (p->refresh_after_step) m->param_update_gather_bytes += P;
  if (c->ranks > c->shard_ranks)
    m->replica_reduce_bytes += 2 * (uint64_t)shard * gelem;
}

static zs_status zs__estimate_params(double params,
                                     const zs__estimate_config* c,
                                     zs_memory_estimate* out,
                                     zs_comm_estimate* comm) {
  zs_status st = zs__estimate_check(c);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(out != NULL, "zs_estimate_from_params: out is NULL");
  /* 1e15 elements keep every byte count (16 per element at most, times
   * nodes' ranks) far below 2^64. */
  ZS_REQUIRE(isfinite(params) && params >= 0 && params <= 1e15 &&
                 params == floor(params),
             "zs_estimate_from_params: params must be a whole number 0..1e15, "
             "got %g", params);
  memset(out, 0, sizeof *out);
  const zs_dtype dt = c->dtype == ZS_DTYPE_COUNT ? ZS_FLOAT32 : c->dtype;
  const zs_dtype gdt = c->reduce_dtype < 0 ? dt : ZS_FLOAT32;
  /* The paper's Psi: no alignment, the shard rounded up (over the shard
   * group: with hybrid sharding the replicas hold the same shard). */
  const size_t n = (size_t)params, W = (size_t)c->shard_ranks;
  const zs__unit_layout l = {n, n, (n + W - 1) / W};
  zs__estimate_states(c, &l, zs_dtype_size(dt), zs_dtype_size(gdt),
                      dt != ZS_FLOAT32, n > 0, zs__estimate_nstates(c), out);
  /* the parameter buffers hold the largest unit's shard: the whole count
   * unless the largest unit is given */
  const size_t lu = c->largest_unit_elements > 0 && c->largest_unit_elements < n
                        ? c->largest_unit_elements : n;
  /* one span: the rounding of each unit's last sub-group and shard (under
   * 4 KiB per unit and field) is not known without the units */
  const zs__policy pol = zs__est_policy(c, 1, 1);
  if (comm != NULL) {
    zs__est_comm_unit(c, &pol, n > 0, l.padded, l.shard, zs_dtype_size(dt),
                      zs_dtype_size(gdt), 2, comm);
    zs__est_comm_sent(c, comm);
  }
  const size_t span = zs__policy_span(&pol, l.padded, l.shard);
  const size_t sg = zs__layout_nvme_sub_group(c->nvme_buffer_size,
                                              c->nvme_sub_group_size);
  /* the CUDA staging: the largest unit's span */
  const size_t lu_span = zs__policy_span(&pol, lu, (lu + W - 1) / W);
  zs__est_offload nv = {
      span, span > 0 && sg > 0 ? zs__layout_nvme_span_bytes(span, sg) : 0,
      (lu + W - 1) / W * zs_dtype_size(dt),
      zs__layout_nvme_round(l.shard * zs_dtype_size(dt)), zs_dtype_size(dt),
      n > 0 ? lu_span * zs_dtype_size(gdt) : 0,
      n > 0 ? lu_span * zs_dtype_size(dt) : 0, 0, zs__estimate_nstates(c),
      l.shard * zs_dtype_size(gdt)};
  if (c->largest_unit_elements > 0 && n > 0) {
    /* Units given by their largest: the transient terms as for a
     * description of ceil(n / lu) units of lu elements (no ties): the
     * working set of 1 + prefetch_depth gathered units (and with
     * offload_params their shards' device copies), the reduction's
     * ZS__MAX_REDUCING units with their bucket temporaries and, at stages
     * 2-3, accumulation buffers, plus the next unit's (with micro-batches:
     * the re-opened units' saved and new shard sums, or with local
     * accumulation every unit's buffer, as for a description below). */
    const size_t units = (n + lu - 1) / lu;
    const size_t gathered = units < (size_t)c->prefetch_depth + 1
                                ? units : (size_t)c->prefetch_depth + 1;
    const int serial = zs__est_serial_reductions(c);
    const size_t maxred = serial ? 1 : ZS__MAX_REDUCING;
    const size_t reducing = units < maxred ? units : maxred;
    const size_t g = lu * zs_dtype_size(gdt);
    const size_t accum = pol.accum_transient, micro = c->grad_accum_steps > 1;
    const size_t s = (micro && !c->grad_accum_local)
                         ? (lu + W - 1) / W * zs_dtype_size(gdt) : 0;
    if (pol.gather_on_use) {
      out->bytes[ZS_MEM_PARAMS_GATHERED] = gathered * lu * zs_dtype_size(dt);
      nv.gather_src_bytes = gathered * ((lu + W - 1) / W) * zs_dtype_size(dt);
    }
    const size_t temps = c->rs_temps ? g : 0;
    out->bytes[ZS_MEM_COMM_BUFFERS] =
        micro && c->grad_accum_local
            ? reducing * temps + accum * units * g
            : reducing * (temps + accum * g + 2 * s) +
                  (!serial && units > reducing) * (accum * g + s);
  }
  return zs__estimate_total(out, c, &nv);
}

/* ---- A model description ---------------------------------------------- */

typedef struct zs__est_unit {
  size_t padded, shard, elem, gelem;
  int lowp, trainable;
  int replicated; /* "replicated": true (zs_unit_set_strategy): stage 0's
                     policy, parameters never offloaded */
  size_t grad_uses; /* "grad_uses": acquire/release pairs per micro-batch */
  int* owners; /* units owning tensors tied from this one */
  int nowners;
} zs__est_unit;

static zs_status zs__parse_dtype(const cJSON* v, const char* where,
                                 zs_dtype* out) {
  if (v == NULL) return ZS_OK;
  const char* s = cJSON_IsString(v) ? v->valuestring : "";
  if (strcmp(s, "fp32") == 0) *out = ZS_FLOAT32;
  else if (strcmp(s, "bf16") == 0) *out = ZS_BFLOAT16;
  else if (strcmp(s, "fp16") == 0) *out = ZS_FLOAT16;
  else
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "model description: %s: dtype must be \"fp32\", \"bf16\" "
                     "or \"fp16\"", where);
  return ZS_OK;
}

/* A non-negative whole number field (0 if absent and optional). */
static zs_status zs__json_count(const cJSON* obj, const char* key,
                                const char* where, int required, size_t* out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = 0;
  if (v == NULL) {
    if (required)
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "model description: %s: \"%s\" is missing", where, key);
    return ZS_OK;
  }
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e18 ||
      v->valuedouble != floor(v->valuedouble))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "model description: %s: \"%s\" must be a whole number "
                     ">= 0", where, key);
  *out = (size_t)v->valuedouble;
  return ZS_OK;
}

/* obj's keys are among `allowed` (NULL-terminated) and none is given
 * twice: a misspelled key ("forzen") must not be silently ignored, as in
 * zs_config_from_json. */
static zs_status zs__json_keys(const cJSON* obj, const char* const* allowed,
                               const char* where) {
  const cJSON* k;
  cJSON_ArrayForEach(k, obj) {
    int known = 0;
    for (int i = 0; allowed[i] != NULL && !known; i++)
      known = strcmp(k->string, allowed[i]) == 0;
    if (!known) {
      char list[256] = "";
      for (int i = 0; allowed[i] != NULL; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"",
                 i > 0 ? ", " : "", allowed[i]);
      return zs__error(ZS_ERR_INVALID_ARGUMENT, "model description: %s: "
                       "unknown key \"%s\" (known: %s)", where, k->string,
                       list);
    }
    for (const cJSON* j = k->next; j != NULL; j = j->next)
      if (strcmp(j->string, k->string) == 0)
        return zs__error(ZS_ERR_INVALID_ARGUMENT, "model description: %s: "
                         "\"%s\" is given twice", where, k->string);
  }
  return ZS_OK;
}

/* A stacked kind's slice in a description ("kind", "kind_offset"). */
typedef struct zs__est_slice {
  const char* kind; /* NULL: not a slice */
  size_t offset;    /* elements into the kind */
  size_t numel;
  int unit;
  int grads;        /* has a gradient (trainable unit, not frozen) */
} zs__est_slice;

typedef struct zs__est_run {
  const char* kind;
  size_t first, last; /* pages */
} zs__est_run;

static int zs__est_run_cmp(const void* a, const void* b) {
  const zs__est_run* x = (const zs__est_run*)a;
  const zs__est_run* y = (const zs__est_run*)b;
  const int k = strcmp(x->kind, y->kind);
  if (k != 0) return k;
  return x->first < y->first ? -1 : x->first > y->first;
}

/* Stacked kinds' views (engine_view.c): the pages under held slices are
 * resident, one page size of this machine each. A unit held with its tie
 * owners, parameters and gradients at once (its backward), is the largest
 * moment: the peak is the largest such set's pages (units held one at a
 * time, as the driver and examples/stacked hold them). */
static zs_status zs__estimate_views(const zs__est_slice* sl, int nsl,
                                    const zs__est_unit* units, int nunits,
                                    size_t* out) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (page == 0 || page == (size_t)-1) page = 4096;
  *out = 0;
  zs__est_run* runs = (zs__est_run*)malloc(((size_t)nsl + 1) * sizeof *runs);
  if (runs == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "model description: views");
  for (int u = 0; u < nunits; u++) {
    size_t bytes = 0;
    for (int which = 0; which < 2; which++) {
      int n = 0;
      for (int i = 0; i < nsl; i++) {
        if (sl[i].kind == NULL || sl[i].numel == 0) continue;
        if (which == 1 && !sl[i].grads) continue;
        int in = sl[i].unit == u;
        for (int k = 0; k < units[u].nowners; k++)
          in |= sl[i].unit == units[u].owners[k];
        if (!in) continue;
        const size_t e = which == 0 ? units[sl[i].unit].elem
                                    : units[sl[i].unit].gelem;
        const size_t a = sl[i].offset * e, b = (sl[i].offset + sl[i].numel) * e;
        runs[n++] = (zs__est_run){sl[i].kind, a / page, (b - 1) / page};
      }
      qsort(runs, (size_t)n, sizeof *runs, zs__est_run_cmp);
      for (int i = 0; i < n;) { /* the union of each kind's page runs */
        size_t first = runs[i].first, last = runs[i].last;
        int j = i + 1;
        for (; j < n && strcmp(runs[j].kind, runs[i].kind) == 0 &&
               runs[j].first <= last + 1; j++)
          if (runs[j].last > last) last = runs[j].last;
        /* runs touching but not overlapping are separate pages: fine */
        bytes += (last - first + 1) * page;
        i = j;
      }
    }
    if (bytes > *out) *out = bytes;
  }
  free(runs);
  return ZS_OK;
}

static zs_status zs__estimate_model(const char* description,
                                    const zs__estimate_config* c,
                                    zs_memory_estimate* out,
                                    zs_comm_estimate* comm) {
  zs_status st = zs__estimate_check(c);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(description != NULL && out != NULL,
             "zs_estimate_from_model: description and out must not be NULL");
  memset(out, 0, sizeof *out);
  const char* parse_end = NULL;
  cJSON* root = cJSON_ParseWithOpts(description, &parse_end, 1);
  zs__est_unit* units = NULL;
  size_t* numels = NULL;
  size_t* offsets = NULL;
  int* alias = NULL;
  zs__est_slice* slices = NULL;
  int nunits = 0;
  zs__est_offload nv = {0, 0, 0, 0, 1, 0, 0, 0, zs__estimate_nstates(c)};
  const zs__policy pol = zs__est_policy(c, 1, 1);
  const size_t sg = zs__layout_nvme_sub_group(c->nvme_buffer_size,
                                              c->nvme_sub_group_size);
  char** tnames = NULL; /* tensor name -> unit, for ties */
  int* tunit = NULL;
  int ntn = 0;
  double total_elems = 0;
  if (root == NULL || !cJSON_IsObject(root))
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "model description: not one JSON object (truncated, not JSON, or "
            "text after it?)");
  {
    static const char* const top[] = {"format", "version", "units",
                                      "activations", "other_bytes",
                                      "optimizer_states", NULL};
    ZS_CHECK(zs__json_keys(root, top, "the top level"));
    /* a model whose optimizer is a callback (zs_model_set_optimizer):
     * its state buffers per element */
    const cJSON* os = cJSON_GetObjectItemCaseSensitive(root, "optimizer_states");
    if (os != NULL) {
      if (!cJSON_IsNumber(os) || os->valuedouble < 1 ||
          os->valuedouble > ZS_OPTIM_MAX_STATES ||
          os->valuedouble != floor(os->valuedouble))
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: "
                "\"optimizer_states\" must be a whole number 1..%d (a "
                "callback optimizer's state buffers per element)",
                ZS_OPTIM_MAX_STATES);
      nv.nstates = (int)os->valuedouble;
    }
    /* what the model code itself registers per rank outside activations
     * (zs_memory_register as "other", e.g. an fp32 copy of a 16-bit unit's
     * parameters) */
    size_t other = 0;
    ZS_CHECK(zs__json_count(root, "other_bytes", "the top level", 0, &other));
    if (other > 1e18)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: \"other_bytes\" "
              "must be at most 1e18");
    out->bytes[ZS_MEM_OTHER] += other;
    const cJSON* f = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (f != NULL && (!cJSON_IsString(f) ||
                      strcmp(f->valuestring, "zeroshard-model-description") != 0))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: \"format\" must "
              "be \"zeroshard-model-description\"");
    const cJSON* v = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (v != NULL && (!cJSON_IsNumber(v) || v->valuedouble != 1))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: \"version\" must "
              "be 1 (this estimator's format)");
  }
  const cJSON* ju = cJSON_GetObjectItemCaseSensitive(root, "units");
  if (!cJSON_IsArray(ju) || cJSON_GetArraySize(ju) == 0)
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
            "model description: \"units\" must be a non-empty array");
  nunits = cJSON_GetArraySize(ju);
  units = (zs__est_unit*)calloc((size_t)nunits, sizeof *units);
  int total_tensors = 0;
  const cJSON* it;
  cJSON_ArrayForEach(it, ju) {
    const cJSON* jt = cJSON_GetObjectItemCaseSensitive(it, "tensors");
    total_tensors += cJSON_IsArray(jt) ? cJSON_GetArraySize(jt) : 0;
  }
  tnames = (char**)calloc((size_t)total_tensors + 1, sizeof *tnames);
  tunit = (int*)calloc((size_t)total_tensors + 1, sizeof *tunit);
  numels = (size_t*)calloc((size_t)total_tensors + 1, sizeof *numels);
  offsets = (size_t*)calloc((size_t)total_tensors + 1, sizeof *offsets);
  alias = (int*)calloc((size_t)total_tensors + 1, sizeof *alias);
  slices = (zs__est_slice*)calloc((size_t)total_tensors + 1, sizeof *slices);
  if (!units || !tnames || !tunit || !numels || !offsets || !alias || !slices)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "model description");
  /* Pass 1: every unit and tensor has a unique name (as the engine
   * requires); pass 2 checks ties against these names. */
  int ui = 0;
  cJSON_ArrayForEach(it, ju) {
    char uwhere[48];
    snprintf(uwhere, sizeof uwhere, "unit %d", ui);
    if (!cJSON_IsObject(it))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: not an object",
              uwhere);
    static const char* const ukeys[] = {"name", "dtype", "grad_dtype",
                                        "grad_uses", "tensors", "replicated",
                                        NULL};
    ZS_CHECK(zs__json_keys(it, ukeys, uwhere));
    const cJSON* un = cJSON_GetObjectItemCaseSensitive(it, "name");
    if (!cJSON_IsString(un) || un->valuestring[0] == '\0')
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "model description: unit %d: \"name\" must be a non-empty string",
              ui);
    const cJSON* other;
    int k = 0;
    cJSON_ArrayForEach(other, ju) {
      if (k++ >= ui) break;
      const cJSON* on = cJSON_GetObjectItemCaseSensitive(other, "name");
      if (cJSON_IsString(on) && strcmp(on->valuestring, un->valuestring) == 0)
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                "model description: unit name '%s' is used twice",
                un->valuestring);
    }
    const cJSON* jt = cJSON_GetObjectItemCaseSensitive(it, "tensors");
    const cJSON* t;
    int tn = 0;
    cJSON_ArrayForEach(t, jt) {
      static const char* const tkeys[] = {"name", "numel", "tied_to", "frozen",
                                          "kind", "kind_offset", NULL};
      char twhere[96];
      snprintf(twhere, sizeof twhere, "unit %d tensor %d", ui, tn++);
      if (!cJSON_IsObject(t))
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: not an "
                "object", twhere);
      ZS_CHECK(zs__json_keys(t, tkeys, twhere));
      const cJSON* name = cJSON_GetObjectItemCaseSensitive(t, "name");
      if (!cJSON_IsString(name) || name->valuestring[0] == '\0')
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                "model description: unit '%s': every tensor needs a non-empty "
                "\"name\"", un->valuestring);
      for (int q = 0; q < ntn; q++)
        if (strcmp(tnames[q], name->valuestring) == 0)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                  "model description: tensor name '%s' is used twice",
                  name->valuestring);
      tnames[ntn] = name->valuestring;
      tunit[ntn++] = ui;
    }
    ui++;
  }
  ui = 0;
  int gi = 0; /* the tensor's index in the whole description */
  cJSON_ArrayForEach(it, ju) {
    char where[96];
    snprintf(where, sizeof where, "unit %d", ui);
    if (!cJSON_IsObject(it))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: not an object",
              where);
    zs_dtype dt = ZS_FLOAT32;
    ZS_CHECK(zs__parse_dtype(cJSON_GetObjectItemCaseSensitive(it, "dtype"),
                             where, &dt));
    if (c->dtype != ZS_DTYPE_COUNT) dt = c->dtype; /* an override */
    const cJSON* jt = cJSON_GetObjectItemCaseSensitive(it, "tensors");
    if (!cJSON_IsArray(jt))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "model description: %s: \"tensors\" must be an array", where);
    zs__est_unit* u = &units[ui];
    u->owners = (int*)calloc((size_t)cJSON_GetArraySize(jt) + 1, sizeof(int));
    if (u->owners == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "model description");
    /* a unit used twice per micro-batch (zs_unit_grad_uses: shared layers,
     * or an embedding that also serves the output head) accumulates from
     * its first use in the backward to its last */
    const cJSON* jg = cJSON_GetObjectItemCaseSensitive(it, "grad_uses");
    if (jg != NULL &&
        (!cJSON_IsNumber(jg) || !(jg->valuedouble >= 1) ||
         jg->valuedouble > (1u << 20) || jg->valuedouble != floor(jg->valuedouble)))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: \"grad_uses\" "
              "must be a whole number 1..1048576", where);
    u->grad_uses = jg != NULL ? (size_t)jg->valuedouble : 1;
    int n = 0;
    const cJSON* t;
    cJSON_ArrayForEach(t, jt) {
      snprintf(where, sizeof where, "unit %d tensor %d", ui, n);
      const cJSON* tied = cJSON_GetObjectItemCaseSensitive(t, "tied_to");
      const cJSON* frozen = cJSON_GetObjectItemCaseSensitive(t, "frozen");
      alias[n] = tied != NULL;
      numels[n] = 0;
      if (frozen != NULL && !cJSON_IsBool(frozen))
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: \"frozen\" "
                "must be true or false", where);
      if (tied != NULL &&
          (cJSON_GetObjectItemCaseSensitive(t, "numel") != NULL || frozen != NULL ||
           cJSON_GetObjectItemCaseSensitive(t, "kind") != NULL ||
           cJSON_GetObjectItemCaseSensitive(t, "kind_offset") != NULL))
        ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: a tied tensor "
                "has its owner's \"numel\", \"frozen\" and \"kind\": give "
                "none", where);
      if (tied != NULL) {
        int owner = -1, oi = -1;
        for (int k = 0; cJSON_IsString(tied) && k < ntn; k++)
          if (strcmp(tnames[k], tied->valuestring) == 0) {
            owner = tunit[k];
            oi = k;
          }
        if (owner < 0)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                  "model description: %s: tied_to names no tensor", where);
        /* the owner must be an untied tensor (not itself) */
        const cJSON* ou = cJSON_GetArrayItem(ju, owner);
        const cJSON* ot;
        cJSON_ArrayForEach(ot, cJSON_GetObjectItemCaseSensitive(ou, "tensors")) {
          const cJSON* on = cJSON_GetObjectItemCaseSensitive(ot, "name");
          if (cJSON_IsString(on) && strcmp(on->valuestring, tnames[oi]) == 0 &&
              cJSON_GetObjectItemCaseSensitive(ot, "tied_to") != NULL)
            ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                    "model description: %s: tied_to '%s' is itself tied (tie "
                    "to an untied tensor)", where, tnames[oi]);
        }
        /* zs_model_add_tied_tensor takes the owner's id: it is registered
         * first (gi: this tensor's place in the description) */
        if (oi >= gi)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                  "model description: %s: tied_to '%s' comes later (the owner "
                  "is registered before the tensors tied to it)", where,
                  tnames[oi]);
        /* one dtype per unit (engine_model.c): the owner's unit has this
         * unit's (without an override, which sets every unit's) */
        zs_dtype odt = ZS_FLOAT32;
        ZS_CHECK(zs__parse_dtype(cJSON_GetObjectItemCaseSensitive(ou, "dtype"),
                                 where, &odt));
        if (c->dtype == ZS_DTYPE_COUNT && odt != dt)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: tied to "
                  "'%s', a %s tensor, in a %s unit (a unit is one flat buffer "
                  "of one dtype)", where, tnames[oi], zs_dtype_name(odt),
                  zs_dtype_name(dt));
        int seen = owner == ui;
        for (int k = 0; k < u->nowners; k++) seen |= u->owners[k] == owner;
        if (!seen) u->owners[u->nowners++] = owner;
      } else {
        ZS_CHECK(zs__json_count(t, "numel", where, 1, &numels[n]));
        /* a stacked kind's slice: its place in the kind's views */
        const cJSON* jk = cJSON_GetObjectItemCaseSensitive(t, "kind");
        const int has_off = cJSON_GetObjectItemCaseSensitive(t, "kind_offset") != NULL;
        if (jk != NULL && (!cJSON_IsString(jk) || jk->valuestring[0] == '\0'))
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: \"kind\" "
                  "must be a non-empty string (a stacked kind's name)", where);
        if ((jk != NULL) != has_off)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: a slice "
                  "of a stacked kind gives both \"kind\" and \"kind_offset\"",
                  where);
        if (jk != NULL) {
          slices[gi].kind = jk->valuestring;
          ZS_CHECK(zs__json_count(t, "kind_offset", where, 1, &slices[gi].offset));
          slices[gi].numel = numels[n];
          slices[gi].unit = ui;
          slices[gi].grads = !cJSON_IsTrue(frozen);
        }
        total_elems += numels[n];
        if (numels[n] > 1e15 || total_elems > 1e15)
          ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
                  "model description: %s: more than 1e15 elements in all",
                  where);
        if (!cJSON_IsTrue(frozen)) u->trainable = 1;
      }
      n++;
      gi++;
    }
    /* Gradients: reduce_dtype fp32 wins; else the unit's "grad_dtype"
     * ("fp32" or its parameter dtype), else the parameter dtype. */
    zs_dtype gdt = dt;
    snprintf(where, sizeof where, "unit %d", ui);
    ZS_CHECK(zs__parse_dtype(cJSON_GetObjectItemCaseSensitive(it, "grad_dtype"),
                             where, &gdt));
    if (gdt != ZS_FLOAT32 && gdt != dt)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "model description: %s: grad_dtype %s must be fp32 or the "
              "parameter dtype, %s%s", where, zs_dtype_name(gdt),
              zs_dtype_name(dt), c->dtype != ZS_DTYPE_COUNT
                  ? " (set for every unit by the dtype override, --dtype)" : "");
    u->elem = zs_dtype_size(dt);
    u->lowp = dt != ZS_FLOAT32;
    u->gelem = c->reduce_dtype < 0 ? zs_dtype_size(gdt) : 4;
    const cJSON* rep = cJSON_GetObjectItemCaseSensitive(it, "replicated");
    if (rep != NULL && !cJSON_IsBool(rep))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: %s: \"replicated\" "
              "must be true or false", where);
    u->replicated = cJSON_IsTrue(rep);
    /* a replicated unit: the policy of stage 0 (zs_unit_set_strategy) */
    const zs__estimate_config uc = zs__est_unit_config(c, u->replicated);
    const zs__policy upol = zs__est_policy(&uc, 1, 1);
    zs__unit_layout l;
    ZS_CHECK(zs__layout_unit(numels, alias, n, zs__layout_align(u->elem),
                             c->ranks, offsets, &l));
    l.shard = l.padded / (size_t)c->shard_ranks; /* (as the engine) */
    u->padded = l.padded;
    u->shard = l.shard;
    if (u->trainable) {
      nv.grad_shard_bytes += l.shard * u->gelem;
      const size_t sp = zs__policy_span(&upol, l.padded, l.shard);
      if (sp > nv.largest_span) nv.largest_span = sp;
      if (sp * u->gelem > nv.span_grad_bytes) nv.span_grad_bytes = sp * u->gelem;
      if (sp * u->elem > nv.span_param_bytes) nv.span_param_bytes = sp * u->elem;
      if (sp > 0 && sg > 0) nv.state_field_bytes += zs__layout_nvme_span_bytes(sp, sg);
    }
    if (l.padded > out->largest_unit_elements)
      out->largest_unit_elements = l.padded;
    if (l.shard * u->elem > nv.largest_param_shard_bytes)
      nv.largest_param_shard_bytes = l.shard * u->elem;
    nv.param_file_bytes += zs__layout_nvme_round(l.shard * u->elem);
    if (u->elem > nv.widest_elem) nv.widest_elem = u->elem;
    zs__estimate_states(&uc, &l, u->elem, u->gelem, u->lowp, u->trainable,
                        nv.nstates, out);
    ui++;
  }
  {
    size_t views = 0;
    ZS_CHECK(zs__estimate_views(slices, gi, units, nunits, &views));
    out->bytes[ZS_MEM_STACKED_VIEWS] += views;
  }
  /* Stage 3: the unit in use and `prefetch_depth` prefetched ones, each
   * with its tie owners (the working set). A unit gathered for two reasons
   * (in use, and the owner of another's tied tensor) is one buffer: the
   * engine counts references (engine_gather.c), so it is counted once.
   * The set is chosen greedily, each time the unit adding the most bytes
   * not yet counted (its own buffer and its owners'). */
  if (pol.gather_on_use) {
    unsigned char* counted = (unsigned char*)calloc(2 * (size_t)nunits, 1);
    if (counted == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "model description");
    unsigned char* picked = counted + nunits;
    /* full buffer and shard (the device copy NCCL reads with
     * offload_params on a GPU) of unit i, 0 if already counted */
#define ZS__EST_FULL(i) (counted[i] ? 0 : units[i].padded * units[i].elem)
#define ZS__EST_SRC(i) (counted[i] ? 0 : units[i].shard * units[i].elem)
    for (int k = 0; k <= c->prefetch_depth && k < nunits; k++) {
      int best = -1;
      size_t best_gain = 0;
      for (int i = 0; i < nunits; i++) {
        if (picked[i] || units[i].replicated) continue; /* resident */
        size_t gain = ZS__EST_FULL(i);
        for (int j = 0; j < units[i].nowners; j++) {
          const int o = units[i].owners[j];
          if (o != i && !units[o].replicated) gain += ZS__EST_FULL(o);
        }
        if (best < 0 || gain > best_gain) {
          best = i;
          best_gain = gain;
        }
      }
      if (best < 0) break;
      picked[best] = 1;
      for (int j = -1; j < units[best].nowners; j++) {
        const int o = j < 0 ? best : units[best].owners[j];
        if (units[o].replicated) continue;
        out->bytes[ZS_MEM_PARAMS_GATHERED] += ZS__EST_FULL(o);
        nv.gather_src_bytes += ZS__EST_SRC(o);
        counted[o] = 1;
      }
    }
#undef ZS__EST_FULL
#undef ZS__EST_SRC
    free(counted);
  }
  /* Gradient reduction (engine_grad.c): ZS__MAX_REDUCING units reducing
   * (the oldest is finished before another starts), each with its bucket
   * temporaries (the whole buffer, world x shard) and at stages 2-3 a full
   * accumulation buffer, while the next unit accumulates. Some units
   * accumulate all along the backward: those owning tensors tied from
   * another unit and those with grad_uses > 1 (their gradients come from
   * two places), and with local accumulation over micro-batches every
   * unit (its buffer is kept until the K-th). With micro-batches each
   * reduced (grad_accum_local 0), a unit re-opened in the second and later
   * micro-batches also holds its saved shard sum from its acquire (s) and
   * its new one while reducing (s). The largest such set: every unit
   * accumulating all along, then the ZS__MAX_REDUCING units that add the
   * most by reducing, then the largest other unit accumulating next. At
   * stages 0-1 the accumulation buffer is the gradients themselves. */
  {
    size_t* gain = (size_t*)calloc((size_t)nunits, sizeof *gain);
    int* along = (int*)calloc((size_t)nunits, sizeof *along);
    if (gain == NULL || along == NULL) {
      free(gain);
      free(along);
      ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "model description");
    }
    const int accum = pol.accum_transient, micro = c->grad_accum_steps > 1;
    const size_t reopen = micro && !c->grad_accum_local;
    const int serial = zs__est_serial_reductions(c);
    const int reducing = serial ? 1 : ZS__MAX_REDUCING;
    for (int i = 0; i < nunits; i++) {
      along[i] |= units[i].grad_uses > 1 || (micro && c->grad_accum_local);
      for (int k = 0; k < units[i].nowners; k++) along[units[i].owners[k]] = 1;
    }
    size_t sum = 0;
    for (int i = 0; i < nunits; i++) {
      const size_t g = units[i].trainable ? units[i].padded * units[i].gelem : 0;
      const size_t s = units[i].trainable ? units[i].shard * units[i].gelem : 0;
      /* a replicated unit accumulates in its resident gradients (stage 0) */
      const int acc = accum && !units[i].replicated;
      /* accumulating all along: the buffer and the saved sum; reducing:
       * the temporaries and the new sum (the rest once, below) */
      const size_t temps = c->rs_temps ? g : 0;
      sum += along[i] ? (acc ? g : 0) + reopen * s : 0;
      gain[i] = along[i] ? temps + reopen * s
                         : (acc ? g : 0) + temps + 2 * reopen * s;
    }
    for (int k = 0; k <= reducing && k < nunits; k++) {
      if (k == reducing) { /* the next: accumulating, not all along */
        if (serial) break;
        for (int i = 0; i < nunits; i++) {
          const int trainable = units[i].trainable;
          gain[i] = along[i] || gain[i] == 0 || !trainable
                        ? 0
                        : (accum && !units[i].replicated
                               ? units[i].padded * units[i].gelem
                               : 0) +
                              reopen * units[i].shard * units[i].gelem;
        }
      }
      int best = 0;
      for (int i = 1; i < nunits; i++) if (gain[i] > gain[best]) best = i;
      sum += gain[best];
      gain[best] = 0;
    }
    out->bytes[ZS_MEM_COMM_BUFFERS] += sum;
    free(along);
    free(gain);
  }
  /* Activations, when described: measured at the describing run's
   * sequences per rank and micro-batch, scaled linearly to this one. */
  const cJSON* act = cJSON_GetObjectItemCaseSensitive(root, "activations");
  if (act != NULL) {
    static const char* const akeys[] = {"bytes_per_rank", "fixed_bytes",
                                        "sequences_per_rank", NULL};
    if (!cJSON_IsObject(act))
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: \"activations\" "
              "must be an object");
    ZS_CHECK(zs__json_keys(act, akeys, "activations"));
    size_t bytes = 0, seqs = 0, fixed = 0;
    ZS_CHECK(zs__json_count(act, "bytes_per_rank", "activations", 1, &bytes));
    ZS_CHECK(zs__json_count(act, "fixed_bytes", "activations", 0, &fixed));
    ZS_CHECK(zs__json_count(act, "sequences_per_rank", "activations", 1, &seqs));
    if (seqs == 0 || fixed > bytes)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "model description: activations: sequences_per_rank must be "
              "> 0 and fixed_bytes <= bytes_per_rank");
    double scale = 1.0;
    if (c->global_batch > 0) {
      const double mine = (double)c->global_batch /
                          ((double)c->ranks * (double)c->grad_accum_steps);
      scale = mine / (double)seqs;
    }
    const double scaled = (double)fixed + (double)(bytes - fixed) * scale;
    if (scaled > 1e18)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "model description: activations: "
              "%.3g bytes per rank at this batch, more than 1e18", scaled);
    out->bytes[ZS_MEM_ACTIVATIONS] =
        fixed + (size_t)llround((double)(bytes - fixed) * scale);
  }
  if (comm != NULL) {
    /* a unit's tensors tied to another unit's gather that owner with it */
    for (int i = 0; i < nunits; i++) {
      const zs__estimate_config uc = zs__est_unit_config(c, units[i].replicated);
      const zs__policy up = zs__est_policy(&uc, 1, 1);
      int gathers = 2;
      for (int j = 0; j < nunits; j++)
        for (int k = 0; k < units[j].nowners; k++)
          gathers += units[j].owners[k] == i ? 2 : 0;
      zs__est_comm_unit(c, &up, units[i].trainable, units[i].padded,
                        units[i].shard, units[i].elem, units[i].gelem,
                        gathers, comm);
    }
    zs__est_comm_sent(c, comm);
  }
  ZS_CHECK(zs__estimate_total(out, c, &nv));
cleanup:
  for (int i = 0; units != NULL && i < nunits; i++) free(units[i].owners);
  free(units);
  free(tnames);
  free(tunit);
  free(numels);
  free(offsets);
  free(alias);
  free(slices);
  cJSON_Delete(root);
  return st;
}

/* ==== The public entry points ============================================== */

static const struct {
  unsigned int from_version;
  size_t size;
} zs__input_sizes[] = {{200, sizeof(zs_estimate_input)}};

/* host_shm and rs_temps of c (its ranks, nodes and device set) for the
 * config's host_collectives and reduce_order, as the context decides. */
static void zs__est_host_collectives(zs__estimate_config* c,
                                     zs_host_collectives mode,
                                     zs_reduce_order order) {
  const int G = c->shard_ranks > 0 ? c->shard_ranks : c->ranks;
  const int per_node = c->ranks / (c->nodes > 0 ? c->nodes : 1);
  if (G <= 0 || c->ranks % G != 0) { /* (refused by zs__estimate_check) */
    c->shard_ranks = G;
    return;
  }
  const int ok = c->device != ZS_DEVICE_CUDA && mode != ZS_HOST_COLLECTIVES_MPI;
  /* the context's communicator; with groups, a shard group within a host
   * and a replica group when the job is on one host (context_mpi.c) */
  const int world_shm = ok && c->ranks > 1 && c->nodes == 1;
  const int shard_shm = G < c->ranks ? ok && G > 1 && per_node % G == 0
                                     : world_shm;
  const int replica_shm = G < c->ranks && ok && c->nodes == 1;
  c->shard_ranks = G;
  c->host_shm = shard_shm; /* (the reduce-scatters run in the shard group) */
  c->segments = world_shm + (G < c->ranks ? shard_shm + replica_shm : 0);
  c->replica_temps = G < c->ranks && !replica_shm;
  c->rs_temps = !(c->host_shm && order == ZS_REDUCE_FIXED);
}

/* The estimator's view of (config, input): the config resolved (its own
 * rules, docs/profiling.md, are checked by zs__estimate_check), the input's
 * UNSET fields at their defaults. */
static zs_status zs__estimate_config_of(const zs_config* config,
                                        const zs_estimate_input* in,
                                        const char* fn,
                                        zs__estimate_config* out,
                                        unsigned int* version) {
  ZS_REQUIRE(config != NULL && in != NULL, "%s: config and input must not "
             "be NULL", fn);
  zs_config c;
  zs_status st = zs__config_resolved(config, &c, version);
  if (st != ZS_OK) return zs__error_prefix(st, "%s: ", fn);
  size_t want = 0;
  for (size_t i = 0; i < sizeof zs__input_sizes / sizeof *zs__input_sizes; i++)
    if (in->version >= zs__input_sizes[i].from_version)
      want = zs__input_sizes[i].size;
  ZS_REQUIRE(in->version <= ZS_VERSION_CODE && want != 0 &&
                 in->struct_size == want,
             "%s: input.struct_size %zu / version %u is not a zs_estimate_input "
             "of this library (version %d, %zu bytes): initialize it with "
             "ZS_ESTIMATE_INPUT_INIT", fn, in->struct_size, in->version,
             ZS_VERSION_CODE, sizeof(zs_estimate_input));
  memset(out, 0, sizeof *out);
  out->ranks = in->ranks == ZS_UNSET_INT ? 1 : in->ranks;
  out->nodes = in->nodes == ZS_UNSET_INT ? 1 : in->nodes;
  out->dtype = in->param_dtype == ZS_DTYPE_AUTO ? ZS_DTYPE_COUNT
                                                : in->param_dtype;
  out->global_batch = in->global_batch == ZS_UNSET_INT ? 0 : in->global_batch;
  out->largest_unit_elements =
      in->largest_unit_elements == ZS_UNSET_SIZE ? 0 : in->largest_unit_elements;
  out->stage = c.stage;
  out->reduce_dtype = (int)c.reduce_dtype;
  out->optimizer = c.optimizer.kind;
  out->sgd_momentum = c.optimizer.kind == ZS_OPTIM_SGD &&
                      c.optimizer.momentum != 0.0; /* as the engine */
  out->prefetch_depth = c.prefetch_depth;
  out->grad_accum_steps = c.grad_accum_steps;
  out->grad_accum_local = c.grad_accum_local;
  out->offload_optimizer = (int)c.offload_optimizer.device;
  out->offload_params = (int)c.offload_param;
  out->nvme_buffer_size = c.nvme.buffer_size;
  out->nvme_sub_group_size = c.nvme.sub_group_size;
  out->nvme_buffer_count = c.nvme.buffer_count;
  out->nvme_param_buffer_count = c.nvme.param_buffer_count;
  out->nvme_param_buffer_elements = c.nvme.param_buffer_elements;
  out->device = c.device;
  /* the shard group: checked by zs__estimate_check */
  out->shard_ranks = c.shard_group_size == ZS_SHARD_GROUP_NODE
                         ? out->ranks / (out->nodes > 0 ? out->nodes : 1)
                         : c.shard_group_size == 0 ? out->ranks
                                                   : c.shard_group_size;
  zs__est_host_collectives(out, c.host_collectives, c.reduce_order);
  return ZS_OK;
}

/* Runs the estimate into this library's layout (the memory's, and the
 * communication's), then gives the caller what its release's struct of
 * `kind` (ZS__OUT_MEMORY_ESTIMATE or _COMM_ESTIMATE) holds. */
static zs_status zs__estimate_run(double params, const char* description,
                                  const zs_config* config,
                                  const zs_estimate_input* input,
                                  zs__out_kind kind, void* user,
                                  const char* fn) {
  zs__estimate_config c;
  unsigned int version = 0;
  zs_status st = zs__estimate_config_of(config, input, fn, &c, &version);
  if (st != ZS_OK) return st;
  ZS_REQUIRE(user != NULL, "%s: out is NULL", fn);
  size_t size = 0;
  st = zs__out_size(kind, version, user, fn, &size);
  if (st != ZS_OK) return st;
  zs_memory_estimate mem;
  zs_comm_estimate comm;
  memset(&mem, 0, sizeof mem);
  memset(&comm, 0, sizeof comm);
  zs_comm_estimate* want = kind == ZS__OUT_COMM_ESTIMATE ? &comm : NULL;
  st = description != NULL ? zs__estimate_model(description, &c, &mem, want)
                           : zs__estimate_params(params, &c, &mem, want);
  if (st == ZS_OK)
    zs__out_write(kind, version, want != NULL ? (void*)&comm : (void*)&mem,
                  user, size);
  return st;
}

zs_status zs_estimate_comm_from_params(double params, const zs_config* config,
                                       const zs_estimate_input* input,
                                       zs_comm_estimate* out) {
  return zs__estimate_run(params, NULL, config, input, ZS__OUT_COMM_ESTIMATE,
                          out, "zs_estimate_comm_from_params");
}

zs_status zs_estimate_comm_from_model(const char* description,
                                      const zs_config* config,
                                      const zs_estimate_input* input,
                                      zs_comm_estimate* out) {
  ZS_REQUIRE(description != NULL,
             "zs_estimate_comm_from_model: description is NULL");
  return zs__estimate_run(0, description, config, input, ZS__OUT_COMM_ESTIMATE,
                          out, "zs_estimate_comm_from_model");
}

zs_status zs_estimate_from_params(double params, const zs_config* config,
                                  const zs_estimate_input* input,
                                  zs_memory_estimate* out) {
  return zs__estimate_run(params, NULL, config, input, ZS__OUT_MEMORY_ESTIMATE,
                          out, "zs_estimate_from_params");
}

zs_status zs_estimate_from_model(const char* description,
                                 const zs_config* config,
                                 const zs_estimate_input* input,
                                 zs_memory_estimate* out) {
  ZS_REQUIRE(description != NULL,
             "zs_estimate_from_model: description is NULL");
  return zs__estimate_run(0.0, description, config, input,
                          ZS__OUT_MEMORY_ESTIMATE, out, "zs_estimate_from_model");
}

/* ==== ZeroShard 0.1's estimator ============================================
 * The symbols programs built against 0.1's header call, so that they keep
 * running (docs/api.md, "Versions and compatibility"): 0.1's
 * zs_estimate_config is zs__estimate_config field for field, and its
 * zs_memory_estimate is written in 0.1's layout (core_compat.c). The same
 * computation as zs_estimate_from_params and _from_model. */
static zs_status zs__estimate_v01(double params, const char* description,
                                  const zs__estimate_config* config,
                                  void* out, const char* fn) {
  ZS_REQUIRE(config != NULL && out != NULL,
             "%s: config and out must not be NULL", fn);
  size_t size = 0;
  zs_status st = zs__out_size(ZS__OUT_MEMORY_ESTIMATE, 100, out, fn, &size);
  if (st != ZS_OK) return st;
  /* 0.1's fields, and host collectives as 0.1's defaults make them */
  zs__estimate_config c;
  memset(&c, 0, sizeof c);
  memcpy(&c, config, offsetof(zs__estimate_config, host_shm));
  zs__est_host_collectives(&c, ZS_HOST_COLLECTIVES_AUTO, ZS_REDUCE_FIXED);
  zs_memory_estimate full;
  memset(&full, 0, sizeof full);
  st = description != NULL ? zs__estimate_model(description, &c, &full, NULL)
                           : zs__estimate_params(params, &c, &full, NULL);
  if (st == ZS_OK) zs__out_write(ZS__OUT_MEMORY_ESTIMATE, 100, &full, out, size);
  return st;
}

ZS__EXPORT zs_status zs_estimate_params(double params,
                                        const zs__estimate_config* config,
                                        void* out);
zs_status zs_estimate_params(double params, const zs__estimate_config* config,
                             void* out) {
  return zs__estimate_v01(params, NULL, config, out, "zs_estimate_params");
}

ZS__EXPORT zs_status zs_estimate_model(const char* description,
                                       const zs__estimate_config* config,
                                       void* out);
zs_status zs_estimate_model(const char* description,
                            const zs__estimate_config* config, void* out) {
  ZS_REQUIRE(description != NULL, "zs_estimate_model: description is NULL");
  return zs__estimate_v01(0.0, description, config, out, "zs_estimate_model");
}
