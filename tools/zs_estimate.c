/*
 * estimate.c — `tools/zs estimate`: per-rank memory of a ZeRO stage before
 * running anything (zs_estimate_from_params / zs_estimate_from_model,
 * docs/profiling.md).
 *
 *   zs_estimate --params 7.5e9 --ranks 64 --stage 3 --dtype bf16 --json
 *   zs_estimate --model gpt2.json --ranks 4 --stage 3
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <zeroshard.h>

static const char kUsage[] =
    "usage: zs estimate (--params N | --model FILE) --ranks W [flags]\n"
    "       (tools/zs estimate in a source tree)\n"
    "  --params N          parameter count (elements; 7.5e9 accepted)\n"
    "  --model FILE        a model description (docs/profiling.md; the\n"
    "                      GPT-2 demo's: tools/zs demo --describe FILE)\n"
    "  --ranks W           data-parallel ranks (>= 1)\n"
    "  --nodes N           nodes (divides ranks) [1]\n"
    "  --stage S           ZeRO stage 0..3 [3]\n"
    "  --stages            every stage, one row each\n"
    "  --dtype D           parameters fp32|bf16|fp16 [fp32, or the model's]\n"
    "  --reduce-dtype D    gradients: same|fp32 [same]\n"
    "  --optimizer O       adamw|adam|sgd|sgd-momentum [adamw]\n"
    "  --prefetch-depth N  stage-3 prefetch depth 0..64 [2]\n"
    "  --batch B           global batch to scale described activations to\n"
    "  --grad-accum K      micro-batches per step [1]: with --batch, sizes\n"
    "                      the micro-batch; K > 1 adds re-opened units' saved\n"
    "                      and new shard sums to the reduction buffers\n"
    "  --grad-accum-local  with --grad-accum K > 1: accumulate locally,\n"
    "                      reduce at the K-th (FSDP's no_sync): every unit's\n"
    "                      accumulation buffer is held across micro-batches\n"
    "  --offload-optimizer none|cpu|nvme  master weights and optimizer\n"
    "                      states in host memory (ZeRO-Offload), or on disk\n"
    "                      through a pinned pool (nvme; ZeRO-Infinity)\n"
    "                      [none]\n"
    "  --nvme-buffer-size B, --nvme-buffer-count N, --nvme-sub-group N\n"
    "                      as zs_config.nvme [16 MiB, 9, 0]\n"
    "  --offload-param none|cpu|nvme  stage 3: parameter shards too [none]\n"
    "  --nvme-param-buffers N  with --offload-param nvme: pinned buffers of\n"
    "                      the largest shard each [5]\n"
    "  --device host|cuda  where parameters and gradients live; cuda adds\n"
    "                      offload's page-locked staging (two slots of the\n"
    "                      largest span) and, with --offload-param, device\n"
    "                      copies of the gathered shards [host]\n"
    "  --largest-layer N   with --params: the largest layer's elements, at\n"
    "                      most N; sizes the NVMe parameter buffers, the\n"
    "                      CUDA staging, the stage-3 working set, the\n"
    "                      reduction buffers (as for layers of that size;\n"
    "                      without it the count is one unit, and those two\n"
    "                      are left out) and DeepSpeed's stage-3 row (a\n"
    "                      model gives its own)\n"
    "  --shard-group-size G  hybrid sharding: shards within groups of G\n"
    "                      ranks (node: a node's), replicas across [all]\n"
    "  --comm              the communication model instead: per rank and\n"
    "                      step, the log's bytes in the shard group and\n"
    "                      across replicas, the bytes sent within and\n"
    "                      between nodes, and a bound on the step's\n"
    "                      communication time (docs/scaling.md)\n"
    "  --intra-bw GBps     with --comm: a rank's bandwidth within a node\n"
    "                      [100]\n"
    "  --inter-bw GBps     with --comm: a node's link to the others [25]\n"
    "  --json              one JSON object (an array with --stages)\n"
    "Stages 2 and 3 also print DeepSpeed's estimate_zero2/zero3_model_states_\n"
    "mem_needs (offload none, per GPU) for comparison.\n";

/* A zs_estimate error on stderr in this tool's terms: without the
 * library's own "zs_estimate: " prefix (the tool prints one), and the
 * settings it names spelled as this tool's flags. */
static void print_library_error(const char* msg) {
  static const char* const kFlagOf[][2] = {
      {"nvme_param_buffer_count", "--nvme-param-buffers"},
      {"nvme_buffer_count", "--nvme-buffer-count"},
      {"nvme_buffer_size", "--nvme-buffer-size"},
      {"config.shard_group_size", "--shard-group-size"}};
  const size_t nflags = sizeof kFlagOf / sizeof kFlagOf[0];
  if (strncmp(msg, "zs_estimate: ", 13) == 0) msg += 13;
  fputs("zs estimate: ", stderr);
  while (*msg != '\0') {
    size_t k = 0;
    while (k < nflags && strncmp(msg, kFlagOf[k][0], strlen(kFlagOf[k][0])) != 0)
      k++;
    if (k < nflags) {
      fputs(kFlagOf[k][1], stderr);
      msg += strlen(kFlagOf[k][0]);
    } else {
      fputc(*msg++, stderr);
    }
  }
  fputc('\n', stderr);
}

static int fail(const char* msg, const char* arg) {
  fprintf(stderr, "zs estimate: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
  return 2;
}

static int parse_int(const char* v, long lo, long hi, int* out) {
  char* end = NULL;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || errno || x < lo || x > hi) return -1;
  *out = (int)x;
  return 0;
}

static char* read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char* s = n >= 0 && n < (1L << 28) ? (char*)malloc((size_t)n + 1) : NULL;
  if (s != NULL && fread(s, 1, (size_t)n, f) != (size_t)n) {
    free(s);
    s = NULL;
  }
  if (s != NULL) s[n] = '\0';
  fclose(f);
  return s;
}

/* DeepSpeed's own rules of thumb (deepspeed.runtime.zero
 * estimate_zero2_model_states_mem_needs / estimate_zero3_..., offload
 * none, per GPU, fp16 Adam): stage 2: 4 Psi + 16 Psi / N; stage 3:
 * 4 * largest layer + 18 Psi / N. 0 where they do not apply. */
static double deepspeed_gpu_bytes(int stage, double psi, double largest,
                                  int ranks) {
  if (stage == 2) return 4 * psi + floor(16 * psi / ranks);
  if (stage == 3 && largest > 0) return 4 * largest + floor(18 * psi / ranks);
  return 0;
}

/* The flags, as the tool prints them; estimate() turns them into a
 * zs_config and a zs_estimate_input. */
typedef struct opts {
  int ranks, nodes, stage;
  zs_dtype dtype;        /* ZS_DTYPE_AUTO: the description's */
  zs_dtype reduce_dtype; /* ZS_DTYPE_AUTO or ZS_FLOAT32 */
  zs_optimizer_kind optimizer;
  int sgd_momentum;
  int prefetch_depth, global_batch, grad_accum_steps, grad_accum_local;
  zs_offload_device offload_optimizer, offload_params;
  size_t nvme_buffer_size, nvme_sub_group_size, nvme_buffer_count;
  size_t nvme_param_buffer_count, largest_unit_elements;
  zs_device_kind device;
  int shard_group_size; /* 0: all ranks; ZS_SHARD_GROUP_NODE: a node's */
} opts;

/* ---- The communication model (docs/scaling.md) -----------------------
 *
 * zs_estimate_comm_from_params / _from_model give per rank and step the
 * log's bytes by purpose and the bytes sent within and between nodes; the
 * bound is those bytes at the given bandwidths (--intra-bw, a rank's within
 * a node; --inter-bw, a node's link, shared by its ranks), perfectly
 * overlapped: a lower bound on the step's communication time. */
static zs_status estimate(const opts* c, double params, const char* text,
                          zs_memory_estimate* e);
static void config_of(const opts* c, zs_config* cfg, zs_estimate_input* in);

static zs_status comm_of(const opts* c, double params, const char* text,
                         zs_comm_estimate* m) {
  zs_config cfg;
  zs_estimate_input in;
  config_of(c, &cfg, &in);
  memset(m, 0, sizeof *m);
  m->struct_size = sizeof *m;
  return text != NULL ? zs_estimate_comm_from_model(text, &cfg, &in, m)
                      : zs_estimate_comm_from_params(params, &cfg, &in, m);
}

static void print_comm(const opts* c, const zs_comm_estimate* m, int json,
                       double intra_gbps, double inter_gbps, FILE* out) {
  const double shard = (double)m->param_gather_bytes +
                       (double)m->grad_reduce_bytes +
                       (double)m->grad_gather_bytes +
                       (double)m->param_update_gather_bytes;
  const double t_intra = m->intra_node_sent_bytes / (intra_gbps * 1e9);
  const double t_inter = m->inter_node_sent_bytes * (c->ranks / c->nodes) /
                         (inter_gbps * 1e9);
  const double bound = t_intra > t_inter ? t_intra : t_inter;
  if (json) {
    fprintf(out, "{\"ranks\":%d,\"nodes\":%d,\"stage\":%d,"
            "\"shard_group_size\":%d,\"replicas\":%d,"
            "\"log_bytes_per_step\":{\"param_gather\":%llu,"
            "\"grad_reduce\":%llu,\"grad_gather\":%llu,"
            "\"param_update_gather\":%llu,\"shard\":%.0f,"
            "\"replica\":%llu},"
            "\"sent_bytes_per_step\":{\"intra_node\":%.0f,\"inter_node\":%.0f},"
            "\"intra_node_GBps\":%g,\"inter_node_GBps\":%g,"
            "\"step_comm_bound_s\":%.6g}",
            c->ranks, c->nodes, c->stage, m->shard_ranks, m->replicas,
            (unsigned long long)m->param_gather_bytes,
            (unsigned long long)m->grad_reduce_bytes,
            (unsigned long long)m->grad_gather_bytes,
            (unsigned long long)m->param_update_gather_bytes, shard,
            (unsigned long long)m->replica_reduce_bytes,
            m->intra_node_sent_bytes, m->inter_node_sent_bytes, intra_gbps,
            inter_gbps, bound);
    return;
  }
  fprintf(out, "stage %d  %d ranks on %d node(s), shard groups of %d (%d "
          "replica(s)): per rank and step, log %.4g GB in the group + %.4g GB "
          "across replicas; sent %.4g GB within nodes, %.4g GB between; "
          "communication >= %.4g s at %g/%g GB/s\n", c->stage, c->ranks,
          c->nodes, m->shard_ranks, m->replicas, shard / 1e9,
          (double)m->replica_reduce_bytes / 1e9,
          m->intra_node_sent_bytes / 1e9, m->inter_node_sent_bytes / 1e9,
          bound, intra_gbps, inter_gbps);
}

/* The shard group's ranks the flags give (all of them without
 * --shard-group-size). */
static int shard_ranks(const opts* c) {
  return c->shard_group_size == ZS_SHARD_GROUP_NODE ? c->ranks / c->nodes
         : c->shard_group_size == 0                 ? c->ranks
                                                    : c->shard_group_size;
}

/* The library's config and input of the flags. */
static void config_of(const opts* c, zs_config* out, zs_estimate_input* in_out) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = c->stage;
  cfg.device = c->device;
  cfg.optimizer.kind = c->optimizer;
  if (c->sgd_momentum) cfg.optimizer.momentum = 0.9; /* keeps a buffer */
  cfg.prefetch_depth = c->prefetch_depth;
  cfg.reduce_dtype = c->reduce_dtype;
  cfg.grad_accum_steps = c->grad_accum_steps;
  cfg.grad_accum_local = c->grad_accum_local;
  cfg.offload_optimizer.device = c->offload_optimizer;
  cfg.offload_param = c->offload_params;
  cfg.nvme.buffer_size = c->nvme_buffer_size;
  cfg.nvme.sub_group_size = c->nvme_sub_group_size;
  cfg.nvme.buffer_count = c->nvme_buffer_count;
  cfg.nvme.param_buffer_count = c->nvme_param_buffer_count;
  cfg.shard_group_size = c->shard_group_size;
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = c->ranks;
  in.nodes = c->nodes;
  in.param_dtype = c->dtype;
  in.global_batch = c->global_batch;
  in.largest_unit_elements = c->largest_unit_elements;
  *out = cfg;
  *in_out = in;
}

/* One estimate of the library (zs_estimate_from_params / _from_model). */
static zs_status estimate(const opts* c, double params, const char* text,
                          zs_memory_estimate* e) {
  zs_config cfg;
  zs_estimate_input in;
  config_of(c, &cfg, &in);
  memset(e, 0, sizeof *e);
  e->struct_size = sizeof *e;
  return text != NULL ? zs_estimate_from_model(text, &cfg, &in, e)
                      : zs_estimate_from_params(params, &cfg, &in, e);
}

static void print_json(const opts* c, const zs_memory_estimate* e,
                       double ds, FILE* out) {
  /* per-node sums in double: a rank's bytes fit size_t, a node's of many
   * ranks may not (1e15 parameters x 2000 ranks) */
  const double per_node = (double)(c->ranks / c->nodes);
  fprintf(out, "{\"ranks\":%d,\"nodes\":%d,\"shard_group_size\":%d,"
          "\"stage\":%d,\"device\":\"%s\","
          "\"model_state_bytes\":%zu,"
          "\"per_node_model_state_bytes\":%.0f,\"peak_bytes\":{",
          c->ranks, c->nodes, shard_ranks(c), c->stage,
          c->device == ZS_DEVICE_CUDA ? "cuda" : "host", e->model_state_bytes,
          (double)e->model_state_bytes * per_node);
  for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++)
    fprintf(out, "\"%s\":%zu,", zs_mem_category_name((zs_mem_category)k),
            e->bytes[k]);
  fprintf(out, "\"total\":%zu}", e->total);
  const size_t host = e->bytes[ZS_MEM_OFFLOAD_HOST] + e->bytes[ZS_MEM_NVME_STAGING];
  fprintf(out, ",\"device_bytes\":%zu,\"per_node_host_bytes\":%.0f",
          e->total - host, (double)host * per_node);
  if (c->offload_optimizer == ZS_OFFLOAD_NVME || c->offload_params == ZS_OFFLOAD_NVME)
    fprintf(out, ",\"nvme_bytes\":%zu,\"per_node_nvme_bytes\":%.0f",
            (size_t)e->nvme_bytes, (double)e->nvme_bytes * per_node);
  if (ds > 0) fprintf(out, ",\"deepspeed_model_states_bytes\":%.0f", ds);
  fprintf(out, "}");
}

/* bytes as three significant digits in their own decimal unit (B, kB, MB,
 * GB, TB: powers of 1000, as the JSON's bytes divide): "469 MB", "15.0 GB",
 * "1.88 GB". Each number gets its own unit, so a small part next to a large
 * total (a sharded optimizer state beside replicated parameters) still
 * shows its size instead of 0.000. */
static const char* human(double bytes, char* buf, size_t cap) {
  static const char* const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int i = 0;
  double v = bytes;
  while (v >= 999.5 && i < 5) {
    v /= 1000.0;
    i++;
  }
  if (i == 0) snprintf(buf, cap, "%.0f B", v);
  else snprintf(buf, cap, v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s",
                v, units[i]);
  return buf;
}

static void print_row(const opts* c, const zs_memory_estimate* e,
                      double ds, FILE* out) {
  const double per_node = (double)(c->ranks / c->nodes);
  const double device =
      (double)(e->total - e->bytes[ZS_MEM_OFFLOAD_HOST] - e->bytes[ZS_MEM_NVME_STAGING]);
  char b[8][24];
  fprintf(out, "stage %d  %4d ranks  model states %9s/rank  (params %s, grads "
          "%s, master %s, optimizer %s)  device peak %9s/rank  node %s\n",
          c->stage, c->ranks, human((double)e->model_state_bytes, b[0], 24),
          human((double)e->bytes[ZS_MEM_PARAMS], b[1], 24),
          human((double)e->bytes[ZS_MEM_GRADS], b[2], 24),
          human((double)e->bytes[ZS_MEM_MASTER_WEIGHTS], b[3], 24),
          human((double)e->bytes[ZS_MEM_OPTIMIZER_STATES], b[4], 24),
          human(device, b[5], 24), human(device * per_node, b[6], 24));
  if (e->bytes[ZS_MEM_OFFLOAD_HOST] > 0) {
    const double host = (double)e->bytes[ZS_MEM_OFFLOAD_HOST];
    fprintf(out, "         offloaded to host memory: %s/rank, %s/node\n",
            human(host, b[0], 24), human(host * per_node, b[1], 24));
  }
  if (c->offload_optimizer == ZS_OFFLOAD_NVME || c->offload_params == ZS_OFFLOAD_NVME) {
    const double disk = (double)e->nvme_bytes;
    fprintf(out, "         on NVMe: %s/rank, %s/node; pinned staging %s/rank\n",
            human(disk, b[0], 24), human(disk * per_node, b[1], 24),
            human((double)e->bytes[ZS_MEM_NVME_STAGING], b[2], 24));
  }
  const int G = shard_ranks(c);
  if (G < c->ranks)
    fprintf(out, "         shard groups of %d ranks (%d replicas): the states "
            "are divided by %d, not %d\n", G, c->ranks / G, G, c->ranks);
  if (ds > 0)
    fprintf(out, "         DeepSpeed's estimate_zero%d_model_states_mem_needs "
            "(offload none%s): %s/GPU\n", c->stage,
            G < c->ranks ? ", its N the shard group's" : "",
            human(ds, b[0], 24));
}

/* The text output's notes on what the rows assume: the sequences per rank
 * the activations are for, and what a bare count leaves out. */
static void print_notes(const opts* c, const char* description,
                        double largest, FILE* out) {
  if (description == NULL) {
    if (largest <= 0)
      fprintf(out, "note: --params counts the model as one unit: the stage-3 "
              "working set and the reduction buffers are left out, and "
              "per-unit buffers are sized to the whole shard; --largest-layer "
              "N (elements) gives them\n");
    return;
  }
  cJSON* root = cJSON_Parse(description);
  const cJSON* act = cJSON_GetObjectItemCaseSensitive(root, "activations");
  const cJSON* seqs = cJSON_GetObjectItemCaseSensitive(act, "sequences_per_rank");
  if (cJSON_IsNumber(seqs) && c->global_batch > 0)
    fprintf(out, "note: activations scaled to --batch %d: %lld sequences per "
            "rank per micro-batch (described at %.0f)\n", c->global_batch,
            (long long)c->global_batch / ((long long)c->ranks * c->grad_accum_steps),
            seqs->valuedouble);
  else if (cJSON_IsNumber(seqs))
    fprintf(out, "note: activations as described: %.0f sequences per rank "
            "per micro-batch, whatever --ranks (a global batch of %.0f at "
            "%d ranks); --batch B scales them\n", seqs->valuedouble,
            seqs->valuedouble * c->ranks * c->grad_accum_steps, c->ranks);
  else
    fprintf(out, "note: the description has no activations: not counted\n");
  cJSON_Delete(root);
}

int main(int argc, char** argv) {
  /* the library's defaults, at stage 3 */
  opts c = {0, 1, 3, ZS_DTYPE_AUTO, ZS_DTYPE_AUTO, ZS_OPTIM_ADAMW, 0, 2, 0, 1,
            0, ZS_OFFLOAD_NONE, ZS_OFFLOAD_NONE, (size_t)16 << 20, 0, 9, 5,
            0, ZS_DEVICE_HOST, 0};
  double params = -1, largest = 0, intra_gbps = 100, inter_gbps = 25;
  int comm = 0;
  const char* model = NULL;
  int json = 0, all = 0, have_stage = 0, nvme_param_sizes = 0, have_batch = 0;
  const char* nvme_size_flag = NULL; /* the first NVMe sizing flag given */
  /* The flags given so far: a second one is refused rather than silently
   * winning (every flag's value is a setting, never a list). */
  const char* given[64];
  int ngiven = 0;
  for (int i = 1; i < argc; i++) {
    const char* f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int takes = 1;
    for (int k = 0; k < ngiven; k++)
      if (!strcmp(given[k], f)) {
        fprintf(stderr, "zs estimate: %s given twice (give each flag once)\n", f);
        return 2;
      }
    if (ngiven < (int)(sizeof given / sizeof given[0])) given[ngiven++] = f;
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
      fputs(kUsage, stdout);
      return 0;
    } else if (!strcmp(f, "--params")) {
      char* end = NULL;
      params = v ? strtod(v, &end) : -1;
      if (!v || !*v || *end || strpbrk(v, "xXpP") != NULL || !isfinite(params) ||
          params < 1 || params > 1e15 || params != floor(params))
        return fail("--params: expected a whole number 1..1e15", v);
    } else if (!strcmp(f, "--model")) {
      model = v;
      if (!v || strncmp(v, "--", 2) == 0) return fail("--model: expected a file", v);
    } else if (!strcmp(f, "--ranks")) {
      if (parse_int(v, 1, 1 << 24, &c.ranks)) return fail("--ranks: expected an integer >= 1", v);
    } else if (!strcmp(f, "--nodes")) {
      if (parse_int(v, 1, 1 << 24, &c.nodes)) return fail("--nodes: expected an integer >= 1", v);
    } else if (!strcmp(f, "--stage")) {
      if (parse_int(v, 0, 3, &c.stage)) return fail("--stage: expected 0..3", v);
      have_stage = 1;
    } else if (!strcmp(f, "--shard-group-size")) {
      if (v != NULL && !strcmp(v, "node")) c.shard_group_size = ZS_SHARD_GROUP_NODE;
      else if (parse_int(v, 1, 1 << 24, &c.shard_group_size))
        return fail("--shard-group-size: expected an integer >= 1 or node", v);
    } else if (!strcmp(f, "--comm")) {
      comm = 1;
      takes = 0;
    } else if (!strcmp(f, "--intra-bw") || !strcmp(f, "--inter-bw")) {
      char* end = NULL;
      const double bw = v ? strtod(v, &end) : 0;
      if (!v || !*v || *end || !isfinite(bw) || bw <= 0)
        return fail("--intra-bw/--inter-bw: expected GB/s > 0", v);
      *(!strcmp(f, "--intra-bw") ? &intra_gbps : &inter_gbps) = bw;
    } else if (!strcmp(f, "--stages")) {
      all = 1;
      takes = 0;
    } else if (!strcmp(f, "--dtype")) {
      if (v && !strcmp(v, "fp32")) c.dtype = ZS_FLOAT32;
      else if (v && !strcmp(v, "bf16")) c.dtype = ZS_BFLOAT16;
      else if (v && !strcmp(v, "fp16")) c.dtype = ZS_FLOAT16;
      else return fail("--dtype: expected fp32, bf16 or fp16", v);
    } else if (!strcmp(f, "--reduce-dtype")) {
      if (v && !strcmp(v, "same")) c.reduce_dtype = ZS_DTYPE_AUTO;
      else if (v && !strcmp(v, "fp32")) c.reduce_dtype = ZS_FLOAT32;
      else return fail("--reduce-dtype: expected same or fp32", v);
    } else if (!strcmp(f, "--optimizer")) {
      if (v && !strcmp(v, "adamw")) c.optimizer = ZS_OPTIM_ADAMW;
      else if (v && !strcmp(v, "adam")) c.optimizer = ZS_OPTIM_ADAM;
      else if (v && !strcmp(v, "sgd")) c.optimizer = ZS_OPTIM_SGD;
      else if (v && !strcmp(v, "sgd-momentum")) {
        c.optimizer = ZS_OPTIM_SGD;
        c.sgd_momentum = 1;
      } else return fail("--optimizer: expected adamw, adam, sgd or sgd-momentum", v);
    } else if (!strcmp(f, "--prefetch-depth")) {
      if (parse_int(v, 0, 64, &c.prefetch_depth)) return fail("--prefetch-depth: expected 0..64", v);
    } else if (!strcmp(f, "--batch")) {
      if (parse_int(v, 1, 1 << 30, &c.global_batch)) return fail("--batch: expected an integer >= 1", v);
      have_batch = 1;
    } else if (!strcmp(f, "--grad-accum")) {
      if (parse_int(v, 1, 1 << 20, &c.grad_accum_steps)) return fail("--grad-accum: expected an integer >= 1", v);
    } else if (!strcmp(f, "--grad-accum-local")) {
      c.grad_accum_local = 1;
      takes = 0;
    } else if (!strcmp(f, "--offload-optimizer") || !strcmp(f, "--offload-param")) {
      zs_offload_device* dst = !strcmp(f, "--offload-param")
                                   ? &c.offload_params
                                   : &c.offload_optimizer;
      if (v && !strcmp(v, "none")) *dst = ZS_OFFLOAD_NONE;
      else if (v && !strcmp(v, "cpu")) *dst = ZS_OFFLOAD_CPU;
      else if (v && !strcmp(v, "nvme")) *dst = ZS_OFFLOAD_NVME;
      else return fail(!strcmp(f, "--offload-param")
                           ? "--offload-param: expected none, cpu or nvme"
                           : "--offload-optimizer: expected none, cpu or nvme",
                       v);
    } else if (!strcmp(f, "--nvme-param-buffers")) {
      int n = 0;
      if (parse_int(v, 1, 4096, &n))
        return fail("--nvme-param-buffers: expected 1..4096", v);
      c.nvme_param_buffer_count = (size_t)n;
      nvme_param_sizes = 1;
    } else if (!strcmp(f, "--nvme-buffer-size")) {
      char* end = NULL;
      const double b = v ? strtod(v, &end) : -1;
      if (!v || !*v || *end || !(b >= 4096 && b <= 1e15) || fmod(b, 4096) != 0)
        return fail("--nvme-buffer-size: expected a multiple of 4096 bytes "
                    "(at most 1e15)", v);
      c.nvme_buffer_size = (size_t)b;
      if (nvme_size_flag == NULL) nvme_size_flag = f;
    } else if (!strcmp(f, "--nvme-buffer-count")) {
      int n = 0;
      if (parse_int(v, 3, 4096, &n))
        return fail("--nvme-buffer-count: expected 3..4096", v);
      c.nvme_buffer_count = (size_t)n;
      if (nvme_size_flag == NULL) nvme_size_flag = f;
    } else if (!strcmp(f, "--nvme-sub-group")) {
      char* end = NULL;
      const double b = v ? strtod(v, &end) : -1;
      if (!v || !*v || *end || !(b >= 0 && b <= 1e15) || b != floor(b))
        return fail("--nvme-sub-group: expected elements 0..1e15", v);
      c.nvme_sub_group_size = (size_t)b;
      if (nvme_size_flag == NULL) nvme_size_flag = f;
    } else if (!strcmp(f, "--device")) {
      if (v && !strcmp(v, "host")) c.device = ZS_DEVICE_HOST;
      else if (v && !strcmp(v, "cuda")) c.device = ZS_DEVICE_CUDA;
      else return fail("--device: expected host or cuda", v);
    } else if (!strcmp(f, "--largest-layer")) {
      char* end = NULL;
      largest = v ? strtod(v, &end) : -1;
      if (!v || !*v || *end || strpbrk(v, "xXpP") != NULL || !isfinite(largest) ||
          largest < 1 || largest > 1e15 || largest != floor(largest))
        return fail("--largest-layer: expected a whole number of elements 1..1e15", v);
      c.largest_unit_elements = (size_t)largest;
    } else if (!strcmp(f, "--json")) {
      json = 1;
      takes = 0;
    } else {
      fprintf(stderr, "zs estimate: unknown flag '%s' (zs estimate --help "
              "lists the flags)\n", f);
      return 2;
    }
    i += takes;
  }
  if ((params < 0) == (model == NULL))
    return fail("give exactly one of --params N and --model FILE", NULL);
  if (model != NULL && largest > 0)
    return fail("--largest-layer is for --params (a model description gives "
                "its own layers)", NULL);
  if (largest > params && params >= 0)
    return fail("--largest-layer: the largest layer cannot exceed --params",
                NULL);
  if (c.ranks < 1) return fail("--ranks W is required (W >= 1)", NULL);
  if (c.ranks % c.nodes != 0) return fail("--nodes must divide --ranks", NULL);
  if (c.offload_params && !c.offload_optimizer)
    return fail("--offload-param needs --offload-optimizer cpu or nvme (the "
                "optimizer steps the shards on the host)", NULL);
  if (all && have_stage)
    return fail("--stage S and --stages: give one (--stages prints every "
                "stage)", NULL);
  if (nvme_size_flag != NULL && c.offload_optimizer != ZS_OFFLOAD_NVME) {
    fprintf(stderr, "zs estimate: %s sizes the optimizer states' NVMe "
            "offload: it needs --offload-optimizer nvme\n", nvme_size_flag);
    return 2;
  }
  if (have_batch && model == NULL)
    return fail("--batch scales a model description's activations: it "
                "needs --model (a count has none)", NULL);
  if (c.grad_accum_local && c.grad_accum_steps < 2)
    return fail("--grad-accum-local accumulates over micro-batches: it needs "
                "--grad-accum K > 1", NULL);
  if (c.global_batch > 0 &&
      c.global_batch % ((long long)c.ranks * c.grad_accum_steps) != 0) {
    fprintf(stderr, "zs estimate: --batch %d is not divisible by --ranks %d x "
            "--grad-accum %d (each rank takes whole sequences of each "
            "micro-batch, as the trainer requires)\n", c.global_batch,
            c.ranks, c.grad_accum_steps);
    return 2;
  }
  if (nvme_param_sizes && c.offload_params != ZS_OFFLOAD_NVME)
    return fail("--nvme-param-buffers sizes the parameter shards' NVMe "
                "buffers: it needs --offload-param nvme", NULL);
  if (c.offload_params && !all && c.stage != 3)
    return fail("--offload-param needs --stage 3, where parameters are "
                "sharded (or --stages: its stage-3 row has it)", NULL);
  char* text = NULL;
  if (model != NULL && (text = read_file(model)) == NULL) {
    fprintf(stderr, "zs estimate: cannot read the model description %s\n",
            model);
    return 1; /* a runtime error, not a usage error */
  }
  int first = all ? 0 : c.stage, last = all ? 3 : c.stage;
  int rc = 0;
  /* Output is collected and printed only if every stage succeeds. */
  char* buf = NULL;
  size_t buflen = 0;
  FILE* out = open_memstream(&buf, &buflen);
  if (out == NULL) return fail("out of memory", NULL);
  if (json && all) fprintf(out, "[");
  const zs_offload_device offload_params = c.offload_params;
  for (int s = first; s <= last && rc == 0; s++) {
    c.stage = s;
    /* parameter offload is a stage-3 feature: the other rows go without */
    c.offload_params = s == 3 ? offload_params : ZS_OFFLOAD_NONE;
    zs_memory_estimate e;
    zs_status st = estimate(&c, params, text, &e);
    zs_comm_estimate cm;
    if (st == ZS_OK && comm) st = comm_of(&c, params, text, &cm);
    if (st == ZS_OK && comm) {
      if (json && s > first) fprintf(out, ",");
      print_comm(&c, &cm, json, intra_gbps, inter_gbps, out);
      continue;
    }
    if (st != ZS_OK) {
      /* the description file's content: a runtime error (1); what the
       * flags ask for: a usage error (2) */
      rc = strstr(zs_last_error(), "model description") != NULL ? 1 : 2;
      print_library_error(zs_last_error());
      break;
    }
    /* DeepSpeed counts parameters once (ties too) and layers by module. */
    double psi = params;
    if (model != NULL) {
      psi = 0;
      opts one = c;
      one.stage = 0;
      one.ranks = 1;
      one.nodes = 1;
      one.dtype = ZS_FLOAT32;
      one.reduce_dtype = ZS_DTYPE_AUTO;
      one.offload_optimizer = one.offload_params = ZS_OFFLOAD_NONE;
      one.device = ZS_DEVICE_HOST; /* params on the device */
      zs_memory_estimate e1;
      if (estimate(&one, 0, text, &e1) == ZS_OK)
        psi = (double)e1.bytes[ZS_MEM_PARAMS] / 4; /* elements, padded */
    }
    const double big = model != NULL ? (double)e.largest_unit_elements : largest;
    /* (MiCS: DeepSpeed's figure over the shard group) */
    const double ds = deepspeed_gpu_bytes(s, psi, big, shard_ranks(&c));
    if (json) {
      if (s > first) fprintf(out, ",");
      print_json(&c, &e, ds, out);
    } else {
      print_row(&c, &e, ds, out);
    }
  }
  if (json && all) fprintf(out, "]");
  if (json) fprintf(out, "\n");
  if (!json && rc == 0 && !comm) print_notes(&c, text, largest, out);
  fclose(out);
  if (rc == 0) fputs(buf, stdout);
  free(buf);
  free(text);
  return rc;
}
