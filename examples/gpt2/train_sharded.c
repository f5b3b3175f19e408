/*
 * train_sharded.c — train_plain.c wrapped with ZeroShard: the same model
 * code, sharded across MPI ranks at any ZeRO stage. Each unit's forward and
 * backward is bracketed by gather/release (and gradient acquire/release);
 * ZeroShard owns the parameters, gradients and AdamW states.
 * docs/wrapping.md walks through the diff with train_plain.c.
 *
 *   mpirun -np 4 bazel-bin/examples/gpt2/train_sharded --stage 3
 */
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zeroshard.h>

#include "examples/gpt2/data.h"
#include "examples/gpt2/model.h"
#include "examples/gpt2/train_common.h"

/* A failed ZeroShard call ends the program with the library's message. */
#define CHECK(call)                                                     \
  do {                                                                  \
    zs_status st_ = (call);                                             \
    if (st_ != ZS_OK) {                                                 \
      fprintf(stderr, "train_sharded: %s: %s\n  %s\n", #call,           \
              zs_status_string(st_), zs_last_error());                  \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

typedef struct model {
  gpt2_config cfg;
  zs_context* ctx;
  zs_model* zm;  /* ZeroShard owns parameters, gradients, AdamW states */
  int embed;     /* unit id of wte, wpe, lnf */
  int* blocks;   /* unit id of block l */
  int* first;    /* first tensor id of unit u */
  gpt2_acts acts;
  unsigned long long seed;
} model;

/* ==== Parameters ============================================================ */

static zs_status init_tensor(void* user, int tensor, const zs_tensor_desc* d,
                             void* data) {
  (void)d;
  model* m = (model*)user;
  int which = tensor < GPT2_EMBED_TENSORS
                  ? -1
                  : (tensor - GPT2_EMBED_TENSORS) / GPT2_BLOCK_TENSORS;
  int i = which < 0 ? tensor
                    : (tensor - GPT2_EMBED_TENSORS) % GPT2_BLOCK_TENSORS;
  gpt2_init_tensor(&m->cfg, m->seed, which, i, (float*)data);
  return ZS_OK;
}

/* Registers one unit: the embed unit (which = -1) or block `which`. */
static void add_unit(model* m, int which, int no_decay) {
  char name[64];
  int unit, n = which < 0 ? GPT2_EMBED_TENSORS : GPT2_BLOCK_TENSORS;
  snprintf(name, sizeof name, which < 0 ? "embed" : "block.%d", which);
  CHECK(zs_model_add_unit(m->zm, name, &unit));
  for (int i = 0; i < n; i++) {
    const char* tname;
    int ndim, decay, t;
    long long s[2];
    if (which < 0) gpt2_embed_tensor(&m->cfg, i, &tname, &ndim, s, &decay);
    else gpt2_block_tensor(&m->cfg, i, &tname, &ndim, s, &decay);
    int64_t shape[2] = {s[0], s[1]};
    if (which < 0) snprintf(name, sizeof name, "%s", tname);
    else snprintf(name, sizeof name, "h.%d.%s", which, tname);
    CHECK(zs_model_add_tensor(m->zm, unit, name, ndim, shape, ZS_FLOAT32, 0, &t));
    if (i == 0) m->first[unit] = t;
    if (!decay) CHECK(zs_model_set_tensor_group(m->zm, t, no_decay));
  }
  if (which < 0) m->embed = unit;
  else m->blocks[which] = unit;
}

static void model_build(model* m, const gpt2_args* a) {
  m->cfg = gpt2_args_model(a);
  m->seed = a->seed;
  m->blocks = (int*)calloc((size_t)m->cfg.layers + 1, sizeof(int));
  m->first = (int*)calloc((size_t)m->cfg.layers + 2, sizeof(int));
  if (m->blocks == NULL || m->first == NULL) CHECK(ZS_ERR_OUT_OF_MEMORY);
  CHECK(zs_model_create(m->ctx, &m->zm));
  int no_decay;
  CHECK(zs_model_add_param_group(m->zm, a->lr, 0.0, &no_decay));
  add_unit(m, -1, no_decay);
  for (int l = 0; l < m->cfg.layers; l++) add_unit(m, l, no_decay);
  /* Known use counts let every reduction start at its unit's last use from
   * the first step on (otherwise the first step records them and holds all
   * gradients until zs_step). The embedding unit is used twice: the
   * encoder and the tied output projection. */
  CHECK(zs_unit_set_grad_uses(m->zm, m->embed, 2));
  for (int l = 0; l < m->cfg.layers; l++)
    CHECK(zs_unit_set_grad_uses(m->zm, m->blocks[l], 1));
  CHECK(zs_model_finalize(m->zm));
  CHECK(zs_model_init(m->zm, init_tensor, m));
}

/* Gathers a unit and fills its views (and gradient views if dslots). */
static void use_unit(model* m, int unit, int n, float** slots[],
                     float** dslots[]) {
  CHECK(zs_unit_gather(m->zm, unit));
  if (dslots != NULL) CHECK(zs_unit_grad_acquire(m->zm, unit));
  for (int i = 0; i < n; i++) {
    CHECK(zs_tensor_data(m->zm, m->first[unit] + i, (void**)slots[i]));
    if (dslots != NULL)
      CHECK(zs_tensor_grad(m->zm, m->first[unit] + i, (void**)dslots[i]));
  }
}

static void done_unit(model* m, int unit, int grads) {
  if (grads) CHECK(zs_unit_grad_release(m->zm, unit));
  CHECK(zs_unit_release(m->zm, unit));
}

static void use_embed(model* m, gpt2_embed_params* p, gpt2_embed_params* g) {
  float **s[GPT2_EMBED_TENSORS], **ds[GPT2_EMBED_TENSORS];
  gpt2_embed_slots(p, s);
  if (g != NULL) gpt2_embed_slots(g, ds);
  use_unit(m, m->embed, GPT2_EMBED_TENSORS, s, g != NULL ? ds : NULL);
}

static void use_block(model* m, int l, gpt2_block_params* p,
                      gpt2_block_params* g) {
  float **s[GPT2_BLOCK_TENSORS], **ds[GPT2_BLOCK_TENSORS];
  gpt2_block_slots(p, s);
  if (g != NULL) gpt2_block_slots(g, ds);
  use_unit(m, m->blocks[l], GPT2_BLOCK_TENSORS, s, g != NULL ? ds : NULL);
}

/* ==== Forward and backward ================================================ */

static float model_forward(model* m, gpt2_acts* a, const int* tokens,
                           const int* targets) {
  gpt2_embed_params e;
  gpt2_block_params b;
  use_embed(m, &e, NULL);
  gpt2_embed_forward(&m->cfg, &e, tokens, a);
  done_unit(m, m->embed, 0);
  for (int l = 0; l < m->cfg.layers; l++) {
    use_block(m, l, &b, NULL);
    gpt2_block_forward(&m->cfg, &b, l, a);
    done_unit(m, m->blocks[l], 0);
  }
  use_embed(m, &e, NULL);
  float loss = gpt2_head_forward(&m->cfg, &e, targets, a);
  done_unit(m, m->embed, 0);
  return loss;
}

static void model_backward(model* m, const int* tokens, const int* targets) {
  gpt2_acts* a = &m->acts;
  gpt2_embed_params e, de;
  gpt2_block_params b, db;
  gpt2_acts_zero_grads(&m->cfg, a);
  use_embed(m, &e, &de);
  gpt2_head_backward(&m->cfg, &e, &de, targets, 1.0f, a);
  done_unit(m, m->embed, 1);
  for (int l = m->cfg.layers - 1; l >= 0; l--) {
    use_block(m, l, &b, &db);
    gpt2_block_backward(&m->cfg, &b, &db, l, a);
    done_unit(m, m->blocks[l], 1);
  }
  use_embed(m, &e, &de);
  gpt2_embed_backward(&m->cfg, &de, tokens, a);
  done_unit(m, m->embed, 1);
}

/* Mean loss over the fixed val sequences; each rank takes its slice of
 * every `batch` of them. */
static double model_eval(model* m, const gpt2_data* d, const gpt2_args* a,
                         int* tokens, int* targets, int rank, int world) {
  const int total = a->val_batches * a->batch, Bl = a->batch / world;
  double sum = 0, all = 0;
  for (int k = 0; k < a->val_batches; k++) {
    gpt2_data_val_batch(d, k * a->batch + rank * Bl, Bl, total, a->seq, tokens,
                        targets);
    sum += model_forward(m, &m->acts, tokens, targets);
  }
  MPI_Allreduce(&sum, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return all / world / a->val_batches;
}

/* Samples `n` bytes after a newline (every rank, identically: the gathers
 * are collective). */
static char* model_sample(model* m, const gpt2_args* a, int n) {
  gpt2_acts one;
  char* text = (char*)calloc((size_t)n + 1, 1);
  int* ctx = (int*)calloc((size_t)a->seq, sizeof(int));
  float* probs = (float*)malloc(GPT2_VOCAB * sizeof(float));
  if (!text || !ctx || !probs || gpt2_acts_alloc(&m->cfg, 1, a->seq, &one))
    CHECK(ZS_ERR_OUT_OF_MEMORY);
  CHECK(zs_memory_register(m->ctx, ZS_MEM_ACTIVATIONS, one.memory, one.bytes));
  int len = 1;
  ctx[0] = '\n';
  for (int k = 0; k < n; k++) {
    one.T = len;
    model_forward(m, &one, ctx, NULL);
    gpt2_softmax(one.logits + (size_t)(len - 1) * GPT2_VOCAB, probs, GPT2_VOCAB);
    int b = gpt2_sample_byte(probs, GPT2_VOCAB, a->seed, k);
    text[k] = (char)b;
    if (len == a->seq) memmove(ctx, ctx + 1, (size_t)(len - 1) * sizeof(int));
    else len++;
    ctx[len - 1] = b;
  }
  CHECK(zs_memory_unregister(m->ctx, one.memory));
  one.T = a->seq;
  gpt2_acts_free(&one);
  free(ctx);
  free(probs);
  return text;
}

/* ==== Main ================================================================= */

/* Before MPI is up, only the launcher's rank variable says who prints. */
static int launch_rank(void) {
  const char* r = getenv("OMPI_COMM_WORLD_RANK");
  if (r == NULL) r = getenv("PMI_RANK");
  return r != NULL ? atoi(r) : 0;
}

int main(int argc, char** argv) {
  gpt2_args args;
  char err[1024];
  int rc = gpt2_args_parse(argc, argv, 1, &args, err, sizeof err);
  if (rc != 0) {
    if (rc < 0 && launch_rank() == 0) fprintf(stderr, "train_sharded: %s\n", err);
    return rc < 0 ? 2 : 0;
  }
  gpt2_config cfg = gpt2_args_model(&args);
  gpt2_data data;
  if (gpt2_config_check(&cfg, err, sizeof err) != 0 ||
      gpt2_data_load(args.data, args.seq, &data, err, sizeof err) != 0) {
    if (launch_rank() == 0) fprintf(stderr, "train_sharded: %s\n", err);
    return 2;
  }
  zs_config zcfg = ZS_CONFIG_INIT;
  zcfg.stage = args.stage;
  zcfg.optimizer.kind = ZS_OPTIM_ADAMW;
  zcfg.optimizer.lr = args.lr;
  zcfg.optimizer.weight_decay = args.weight_decay;
  model m;
  memset(&m, 0, sizeof m);
  CHECK(zs_context_create(&zcfg, &m.ctx));
  const int rank = zs_context_rank(m.ctx), world = zs_context_world_size(m.ctx);
  if (args.batch % world != 0) {
    if (rank == 0)
      fprintf(stderr, "train_sharded: --batch %d is not divisible by the %d "
              "ranks\n", args.batch, world);
    zs_context_destroy(m.ctx);
    return 2;
  }
  const int Bl = args.batch / world, T = args.seq;
  int* tokens = (int*)malloc((size_t)Bl * T * sizeof(int));
  int* targets = (int*)malloc((size_t)Bl * T * sizeof(int));
  if (!tokens || !targets || gpt2_acts_alloc(&cfg, Bl, T, &m.acts) != 0)
    CHECK(ZS_ERR_OUT_OF_MEMORY);
  CHECK(zs_memory_register(m.ctx, ZS_MEM_ACTIVATIONS, m.acts.memory, m.acts.bytes));
  model_build(&m, &args);
  const int threads = omp_get_max_threads();
  if (rank == 0 && !args.quiet) gpt2_args_print(&args, "sharded", world, threads, stdout);
  gpt2_report* report = gpt2_report_create(&args, "sharded", world, threads,
                                           gpt2_num_params(&cfg));
  double t_start = gpt2_now(), t_train = 0;
  for (int step = 0; step < args.steps; step++) {
    double t0 = gpt2_now();
    gpt2_data_train_batch(&data, args.seed, step, rank * Bl, Bl, T, tokens, targets);
    float local = model_forward(&m, &m.acts, tokens, targets);
    model_backward(&m, tokens, targets);
    CHECK(zs_model_set_lr(m.zm, ZS_ALL_GROUPS, args.lr));
    CHECK(zs_step(m.zm, NULL));
    t_train += gpt2_now() - t0;
    float loss = 0; /* the global batch's mean loss */
    MPI_Allreduce(&local, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    loss /= (float)world;
    gpt2_report_step(report, step, loss, args.lr);
    double tps = (double)(step + 1) * args.batch * T / t_train;
    if (rank == 0 && !args.quiet && ((step + 1) % args.log_every == 0 || step == 0))
      gpt2_print_progress(stdout, step + 1, args.steps, loss, args.lr, tps,
                          (args.steps - step - 1) * (double)args.batch * T / tps);
    int last = step + 1 == args.steps;
    if ((args.eval_every > 0 && (step + 1) % args.eval_every == 0) || last) {
      double val = model_eval(&m, &data, &args, tokens, targets, rank, world);
      gpt2_report_val(report, step + 1, val);
      if (rank == 0 && !args.quiet) printf("val loss %.4f at step %d\n", val, step + 1);
    }
  }
  double wall = gpt2_now() - t_start;
  char* text = args.sample_bytes > 0 ? model_sample(&m, &args, args.sample_bytes) : NULL;
  zs_memory_stats mine, *rows = (zs_memory_stats*)calloc((size_t)world, sizeof mine);
  CHECK(zs_memory_stats_get(m.ctx, &mine));
  MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, rows, (int)sizeof mine, MPI_BYTE,
             0, MPI_COMM_WORLD);
  rc = 0;
  if (rank == 0) {
    for (int r = 0; r < world; r++) gpt2_report_rank(report, r, &rows[r]);
    gpt2_report_timing(report, t_train > 0 ? args.steps * (double)args.batch * T / t_train : 0, wall);
    if (!args.quiet) {
      gpt2_print_memory_table(stdout, rows, world);
      if (text != NULL) gpt2_print_text(stdout, text);
      printf("wall time %.1f s\n", wall);
    }
    if (text != NULL) gpt2_report_text(report, text);
    if (args.report != NULL &&
        gpt2_report_write(report, args.report, err, sizeof err) != 0) {
      fprintf(stderr, "train_sharded: %s\n", err);
      rc = 1;
    }
  }
  gpt2_report_free(report);
  free(text);
  free(rows);
  CHECK(zs_memory_unregister(m.ctx, m.acts.memory));
  gpt2_acts_free(&m.acts);
  zs_model_destroy(m.zm);
  zs_context_destroy(m.ctx);
  gpt2_data_free(&data);
  free(tokens);
  free(targets);
  free(m.blocks);
  free(m.first);
  return rc;
}
