/*
 * train_plain.c — ordinary single-process GPT-2 training in C: one flat
 * parameter allocation with named views, forward, backward, AdamW.
 *
 * This is the "existing C model code" that train_sharded.c wraps with
 * ZeroShard; docs/wrapping.md walks through the diff between the two.
 *
 *   bazel run //examples/gpt2:train_plain -- --steps 100
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/gpt2/data.h"
#include "examples/gpt2/model.h"
#include "examples/gpt2/train_common.h"

typedef struct model {
  gpt2_config cfg;
  float* params; /* all parameters, one allocation */
  float* grads;
  float* m;      /* AdamW first moment */
  float* v;      /* AdamW second moment */
  gpt2_embed_params embed, dembed;
  gpt2_block_params *blocks, *dblocks;
  gpt2_acts acts;
  int64_t step;
} model;

/* ==== Parameters ============================================================ */

static int model_build(model* m, const gpt2_args* a) {
  m->cfg = gpt2_args_model(a);
  const gpt2_config* c = &m->cfg;
  size_t P = gpt2_num_params(c), E = gpt2_embed_numel(c),
         K = gpt2_block_numel(c);
  m->params = (float*)malloc(P * sizeof(float));
  m->grads = (float*)calloc(P, sizeof(float));
  m->m = (float*)calloc(P, sizeof(float));
  m->v = (float*)calloc(P, sizeof(float));
  m->blocks = (gpt2_block_params*)calloc((size_t)c->layers + 1, sizeof *m->blocks);
  m->dblocks = (gpt2_block_params*)calloc((size_t)c->layers + 1, sizeof *m->blocks);
  if (!m->params || !m->grads || !m->m || !m->v || !m->blocks || !m->dblocks)
    return -1;
  gpt2_embed_views(c, m->params, &m->embed);
  gpt2_embed_views(c, m->grads, &m->dembed);
  for (int l = 0; l < c->layers; l++) {
    gpt2_block_views(c, m->params + E + (size_t)l * K, &m->blocks[l]);
    gpt2_block_views(c, m->grads + E + (size_t)l * K, &m->dblocks[l]);
  }
  /* Initialize tensor by tensor, in the flat order. */
  float* p = m->params;
  for (int which = -1; which < c->layers; which++) {
    int n = which < 0 ? GPT2_EMBED_TENSORS : GPT2_BLOCK_TENSORS;
    for (int i = 0; i < n; i++) {
      const char* name;
      int ndim, decay;
      long long shape[2];
      size_t numel = which < 0 ? gpt2_embed_tensor(c, i, &name, &ndim, shape, &decay)
                               : gpt2_block_tensor(c, i, &name, &ndim, shape, &decay);
      gpt2_init_tensor(c, a->seed, which, i, p);
      p += numel;
    }
  }
  return 0;
}

static void model_free(model* m) {
  gpt2_acts_free(&m->acts);
  free(m->params);
  free(m->grads);
  free(m->m);
  free(m->v);
  free(m->blocks);
  free(m->dblocks);
}

/* AdamW on every tensor; weight decay on matrices and embeddings only. */
static void model_update(model* m, double lr, double weight_decay) {
  const gpt2_config* c = &m->cfg;
  m->step++;
  size_t off = 0;
  for (int which = -1; which < c->layers; which++) {
    int n = which < 0 ? GPT2_EMBED_TENSORS : GPT2_BLOCK_TENSORS;
    for (int i = 0; i < n; i++) {
      const char* name;
      int ndim, decay;
      long long shape[2];
      size_t numel = which < 0 ? gpt2_embed_tensor(c, i, &name, &ndim, shape, &decay)
                               : gpt2_block_tensor(c, i, &name, &ndim, shape, &decay);
      zs_adam_hparams hp = {lr, 0.9, 0.999, 1e-8, decay ? weight_decay : 0.0};
      zs_optim_adamw(m->params + off, m->grads + off, m->m + off, m->v + off,
                     numel, &hp, m->step);
      off += numel;
    }
  }
}

/* ==== Forward and backward ================================================ */

static float model_forward(model* m, gpt2_acts* a, const int* tokens,
                           const int* targets) {
  gpt2_embed_forward(&m->cfg, &m->embed, tokens, a);
  for (int l = 0; l < m->cfg.layers; l++)
    gpt2_block_forward(&m->cfg, &m->blocks[l], l, a);
  return gpt2_head_forward(&m->cfg, &m->embed, targets, a);
}

static void model_backward(model* m, const int* tokens, const int* targets) {
  gpt2_acts* a = &m->acts;
  memset(m->grads, 0, gpt2_num_params(&m->cfg) * sizeof(float));
  gpt2_acts_zero_grads(&m->cfg, a);
  gpt2_head_backward(&m->cfg, &m->embed, &m->dembed, targets, 1.0f, a);
  for (int l = m->cfg.layers - 1; l >= 0; l--)
    gpt2_block_backward(&m->cfg, &m->blocks[l], &m->dblocks[l], l, a);
  gpt2_embed_backward(&m->cfg, &m->dembed, tokens, a);
}

/* Mean loss over the fixed val sequences, `batch` at a time. */
static double model_eval(model* m, const gpt2_data* d, const gpt2_args* a,
                         int* tokens, int* targets) {
  const int total = a->val_batches * a->batch;
  double sum = 0;
  for (int k = 0; k < a->val_batches; k++) {
    gpt2_data_val_batch(d, k * a->batch, a->batch, total, a->seq, tokens,
                        targets);
    sum += model_forward(m, &m->acts, tokens, targets);
  }
  return sum / a->val_batches;
}

/* Samples `n` bytes after a newline, with a context of at most T bytes. */
static char* model_sample(model* m, const gpt2_args* a, int n) {
  gpt2_acts one;
  char* text = (char*)calloc((size_t)n + 1, 1);
  int* ctx = (int*)calloc((size_t)a->seq, sizeof(int));
  float* probs = (float*)malloc(GPT2_VOCAB * sizeof(float));
  if (!text || !ctx || !probs || gpt2_acts_alloc(&m->cfg, 1, a->seq, &one)) {
    free(text);
    free(ctx);
    free(probs);
    return NULL;
  }
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
  one.T = a->seq;
  gpt2_acts_free(&one);
  free(ctx);
  free(probs);
  return text;
}

/* ==== Main ================================================================= */

int main(int argc, char** argv) {
  gpt2_args args;
  char err[1024];
  int rc = gpt2_args_parse(argc, argv, 0, &args, err, sizeof err, 1);
  if (rc != 0) {
    if (rc < 0) fprintf(stderr, "train_plain: %s\n", err);
    return rc < 0 ? 2 : 0;
  }
  gpt2_config cfg = gpt2_args_model(&args);
  gpt2_data data;
  if (gpt2_config_check(&cfg, err, sizeof err) != 0 ||
      gpt2_report_check(args.report, args.data, err, sizeof err) != 0 ||
      gpt2_data_load(args.data, args.seq, &data, err, sizeof err) != 0) {
    fprintf(stderr, "train_plain: %s\n", err);
    return 2;
  }
  const int B = args.batch, T = args.seq;
  model m;
  memset(&m, 0, sizeof m);
  int* tokens = (int*)malloc((size_t)B * T * sizeof(int));
  int* targets = (int*)malloc((size_t)B * T * sizeof(int));
  if (!tokens || !targets || model_build(&m, &args) != 0 ||
      gpt2_acts_alloc(&m.cfg, B, T, &m.acts) != 0) {
    fprintf(stderr, "train_plain: out of memory\n");
    return 1;
  }
  const int threads = omp_get_max_threads();
  if (!args.quiet) gpt2_args_print(&args, "plain", 1, threads, stdout);
  gpt2_report* report = gpt2_report_create(&args, "plain", 1, threads,
                                           gpt2_num_params(&cfg));
  double t_start = gpt2_now(), t_train = 0;
  for (int step = 0; step < args.steps; step++) {
    double t0 = gpt2_now();
    gpt2_data_train_batch(&data, args.seed, step, 0, B, T, tokens, targets);
    float loss = model_forward(&m, &m.acts, tokens, targets);
    model_backward(&m, tokens, targets);
    if (!isfinite(loss)) {
      fprintf(stderr, "train_plain: the loss is %g at step %d: training "
              "diverged (try a lower --lr)\n", loss, step + 1);
      return 1;
    }
    model_update(&m, args.lr, args.weight_decay);
    t_train += gpt2_now() - t0;
    gpt2_report_step(report, step + 1, loss, args.lr);
    double tps = (double)(step + 1) * B * T / t_train;
    if (!args.quiet && ((step + 1) % args.log_every == 0 || step == 0))
      gpt2_print_progress(stdout, step + 1, args.steps, loss, args.lr, tps,
                          (args.steps - step - 1) * (double)B * T / tps);
    int last = step + 1 == args.steps;
    if ((args.eval_every > 0 && (step + 1) % args.eval_every == 0) || last) {
      double val = model_eval(&m, &data, &args, tokens, targets);
      gpt2_report_val(report, step + 1, val);
      if (!args.quiet) printf("val loss %.4f at step %d\n", val, step + 1);
    }
  }
  double wall = gpt2_now() - t_start;
  zs_memory_stats mem;
  memset(&mem, 0, sizeof mem);
  size_t P = gpt2_num_params(&cfg) * sizeof(float);
  mem.peak[ZS_MEM_PARAMS] = mem.current[ZS_MEM_PARAMS] = P;
  mem.peak[ZS_MEM_GRADS] = mem.current[ZS_MEM_GRADS] = P;
  mem.peak[ZS_MEM_OPTIMIZER_STATES] = mem.current[ZS_MEM_OPTIMIZER_STATES] = 2 * P;
  mem.peak[ZS_MEM_ACTIVATIONS] = m.acts.bytes;
  mem.model_state_bytes = 4 * P;
  mem.total_peak = 4 * P + m.acts.bytes;
  gpt2_report_rank(report, 0, &mem);
  gpt2_report_timing(report, args.steps, (double)B * T, t_train, wall);
  if (!args.quiet) gpt2_print_memory_table(stdout, &mem, 1);
  if (args.sample_bytes > 0) {
    char* text = model_sample(&m, &args, args.sample_bytes);
    if (text == NULL) {
      fprintf(stderr, "train_plain: out of memory for sampling; no sample\n");
    } else {
      if (!args.quiet) gpt2_print_text(stdout, text, (size_t)args.sample_bytes);
      gpt2_report_text(report, text, (size_t)args.sample_bytes);
      free(text);
    }
  }
  if (!args.quiet) printf("wall time %.1f s\n", wall);
  rc = 0;
  if (args.report != NULL &&
      gpt2_report_write(report, args.report, err, sizeof err) != 0) {
    fprintf(stderr, "train_plain: %s\n", err);
    rc = 1;
  }
  gpt2_report_free(report);
  model_free(&m);
  gpt2_data_free(&data);
  free(tokens);
  free(targets);
  return rc;
}
