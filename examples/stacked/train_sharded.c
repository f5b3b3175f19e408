/*
 * train_sharded.c — train_plain.c wrapped with ZeroShard: the same code,
 * with each kind registered once as a stacked kind (one unit per layer plus
 * one for the embeddings and the final norm), the views pointed at
 * ZeroShard's once, each layer's unit held around its forward and backward,
 * and AdamW run by zs_step on each rank's shard. Any ZeRO stage, any number
 * of MPI ranks dividing the batch; docs/wrapping.md, "Stacked tensors",
 * walks through `diff -u train_plain.c train_sharded.c`.
 *
 *   mpirun -np 4 bazel-bin/examples/stacked/train_sharded --stage 3
 *   options: those of train_plain, and --stage S (0..3)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zeroshard.h>
#include <zs_mpi.h> /* and mpi.h */

#include "examples/gpt2/data.h"
#include "examples/gpt2/layers.h"

#define NUM_PARAMETER_TENSORS 16
#define MAX_LAYERS 64
#define CHECK(call) ((call) != ZS_OK ? fail(#call) : (void)0)
static void fail(const char* call) { fprintf(stderr, "%s: %s\n", call, zs_last_error()), MPI_Abort(MPI_COMM_WORLD, 1); }

/* A layer's unit held around its forward (g 0) or backward (g 1). */
static zs_model* zm;
static zs_context* ctx;
static void use(int u, int g) { CHECK(zs_unit_gather(zm, u)), g ? CHECK(zs_unit_grad_acquire(zm, u)) : (void)0; }
static void done(int u, int g) { g ? CHECK(zs_unit_grad_release(zm, u)) : (void)0, CHECK(zs_unit_release(zm, u)); }

typedef struct {
  int V, maxT, L, NH, C;
} GPT2Config;

typedef struct {
  float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w,
      *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
} ParameterTensors;

static const char* const kParamNames[NUM_PARAMETER_TENSORS] = {
    "wte",  "wpe", "ln1w",    "ln1b",    "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",    "fcb",     "fcprojw", "fcprojb", "lnfw", "lnfb"};

/* Kind k's view pointer. */
static float** view(ParameterTensors* p, int k) {
  float** ptrs[] = {&p->wte,  &p->wpe,      &p->ln1w,    &p->ln1b,
                    &p->qkvw, &p->qkvb,     &p->attprojw, &p->attprojb,
                    &p->ln2w, &p->ln2b,     &p->fcw,     &p->fcb,
                    &p->fcprojw, &p->fcprojb, &p->lnfw,  &p->lnfb};
  return ptrs[k];
}

static void fill_in_parameter_sizes(size_t* s, GPT2Config c) {
  const size_t V = c.V, maxT = c.maxT, L = c.L, C = c.C;
  s[0] = V * C;             /* wte */
  s[1] = maxT * C;          /* wpe */
  s[2] = L * C;             /* ln1w */
  s[3] = L * C;             /* ln1b */
  s[4] = L * (3 * C) * C;   /* qkvw */
  s[5] = L * (3 * C);       /* qkvb */
  s[6] = L * C * C;         /* attprojw */
  s[7] = L * C;             /* attprojb */
  s[8] = L * C;             /* ln2w */
  s[9] = L * C;             /* ln2b */
  s[10] = L * (4 * C) * C;  /* fcw */
  s[11] = L * (4 * C);      /* fcb */
  s[12] = L * C * (4 * C);  /* fcprojw */
  s[13] = L * C;            /* fcprojb */
  s[14] = C;                /* lnfw */
  s[15] = C;                /* lnfb */
}

/* One allocation for all 16 kinds, the views pointing into it. */
static float* malloc_and_point(ParameterTensors* p, const size_t* sizes) {
  size_t n = 0;
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) n += sizes[k];
  float* mem = (float*)calloc(n, sizeof(float));
  float* it = mem;
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
    *view(p, k) = it;
    it += sizes[k];
  }
  return mem;
}

/* N(0, 1) from xorshift64* and Box-Muller. */
static float randn(unsigned long long* s) {
  double u[2];
  for (int i = 0; i < 2; i++) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    u[i] = ((*s * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
  }
  return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

/* LayerNorm weights 1, biases 0, matrices N(0, 0.02). */
static void init_params(ParameterTensors* p, const size_t* sizes,
                        unsigned long long seed) {
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
    const int ln_weight = k == 2 || k == 8 || k == 14;
    const int bias = k == 3 || k == 5 || k == 7 || k == 9 || k == 11 ||
                     k == 13 || k == 15;
    float* x = *view(p, k);
    for (size_t i = 0; i < sizes[k]; i++)
      x[i] = ln_weight ? 1.0f : bias ? 0.0f : 0.02f * randn(&seed);
  }
}

/* llm.c's activations, stacked over the layers like the parameters. */
#define NUM_ACTIVATION_TENSORS 23
typedef struct {
  float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *preatt, *att,
      *attproj, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu,
      *fcproj, *residual3, *lnf, *lnf_mean, *lnf_rstd, *logits, *probs,
      *losses;
} ActivationTensors;

static float* malloc_activations(ActivationTensors* a, GPT2Config c, int B,
                                 int T, size_t* total) {
  const size_t BT = (size_t)B * T, L = c.L, C = c.C, NH = c.NH, V = c.V;
  const size_t s[NUM_ACTIVATION_TENSORS] = {
      BT * C,     L * BT * C, L * BT,         L * BT,     L * BT * 3 * C,
      L * BT * C, L * B * NH * T * T, L * B * NH * T * T, L * BT * C,
      L * BT * C, L * BT * C, L * BT,         L * BT,     L * BT * 4 * C,
      L * BT * 4 * C, L * BT * C, L * BT * C, BT * C,     BT,
      BT,         BT * V,     BT * V,         BT};
  *total = 0;
  for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) *total += s[i];
  float* mem = (float*)calloc(*total, sizeof(float));
  float** ptrs = (float**)a; /* the struct is 23 float pointers */
  for (int i = 0, off = 0; i < NUM_ACTIVATION_TENSORS; off += (int)s[i], i++)
    ptrs[i] = mem + off;
  return mem;
}

typedef struct {
  GPT2Config config;
  ParameterTensors params, grads;
  float *params_memory, *grads_memory, *m_memory, *v_memory;
  size_t param_sizes[NUM_PARAMETER_TENSORS], num_parameters;
  ActivationTensors acts, grads_acts;
  float *acts_memory, *grads_acts_memory;
  size_t num_activations;
  int B, T;
} GPT2;

/* ==== Forward ============================================================= */

static void embed_forward(GPT2* m, const int* tokens) {
  gpt2_encoder_forward(m->acts.encoded, tokens, m->params.wte, m->params.wpe,
                       m->B, m->T, m->config.C);
}

static void block_forward(GPT2* m, int l) {
  const int B = m->B, T = m->T, C = m->config.C, NH = m->config.NH, N = B * T;
  ParameterTensors p = m->params;
  ActivationTensors a = m->acts;
  float* residual = l == 0 ? a.encoded : a.residual3 + (size_t)(l - 1) * N * C;
  float* l_ln1w = p.ln1w + l * C;
  float* l_ln1b = p.ln1b + l * C;
  float* l_qkvw = p.qkvw + (size_t)l * 3 * C * C;
  float* l_qkvb = p.qkvb + l * 3 * C;
  float* l_attprojw = p.attprojw + (size_t)l * C * C;
  float* l_attprojb = p.attprojb + l * C;
  float* l_ln2w = p.ln2w + l * C;
  float* l_ln2b = p.ln2b + l * C;
  float* l_fcw = p.fcw + (size_t)l * 4 * C * C;
  float* l_fcb = p.fcb + l * 4 * C;
  float* l_fcprojw = p.fcprojw + (size_t)l * C * 4 * C;
  float* l_fcprojb = p.fcprojb + l * C;
  float* l_ln1 = a.ln1 + (size_t)l * N * C;
  float* l_ln1_mean = a.ln1_mean + (size_t)l * N;
  float* l_ln1_rstd = a.ln1_rstd + (size_t)l * N;
  float* l_qkv = a.qkv + (size_t)l * N * 3 * C;
  float* l_atty = a.atty + (size_t)l * N * C;
  float* l_preatt = a.preatt + (size_t)l * B * NH * T * T;
  float* l_att = a.att + (size_t)l * B * NH * T * T;
  float* l_attproj = a.attproj + (size_t)l * N * C;
  float* l_residual2 = a.residual2 + (size_t)l * N * C;
  float* l_ln2 = a.ln2 + (size_t)l * N * C;
  float* l_ln2_mean = a.ln2_mean + (size_t)l * N;
  float* l_ln2_rstd = a.ln2_rstd + (size_t)l * N;
  float* l_fch = a.fch + (size_t)l * N * 4 * C;
  float* l_fch_gelu = a.fch_gelu + (size_t)l * N * 4 * C;
  float* l_fcproj = a.fcproj + (size_t)l * N * C;
  float* l_residual3 = a.residual3 + (size_t)l * N * C;
  gpt2_layernorm_forward(l_ln1, l_ln1_mean, l_ln1_rstd, residual, l_ln1w,
                         l_ln1b, N, C);
  gpt2_matmul_forward(l_qkv, l_ln1, l_qkvw, l_qkvb, N, C, 3 * C);
  gpt2_attention_forward(l_atty, l_preatt, l_att, l_qkv, B, T, C, NH);
  gpt2_matmul_forward(l_attproj, l_atty, l_attprojw, l_attprojb, N, C, C);
  gpt2_residual_forward(l_residual2, residual, l_attproj, (size_t)N * C);
  gpt2_layernorm_forward(l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, l_ln2w,
                         l_ln2b, N, C);
  gpt2_matmul_forward(l_fch, l_ln2, l_fcw, l_fcb, N, C, 4 * C);
  gpt2_gelu_forward(l_fch_gelu, l_fch, (size_t)N * 4 * C);
  gpt2_matmul_forward(l_fcproj, l_fch_gelu, l_fcprojw, l_fcprojb, N, 4 * C, C);
  gpt2_residual_forward(l_residual3, l_residual2, l_fcproj, (size_t)N * C);
}

/* The final LayerNorm, the logits through the tied wte, the mean loss. */
static float head_forward(GPT2* m, const int* targets) {
  const int N = m->B * m->T, C = m->config.C, V = m->config.V;
  ParameterTensors p = m->params;
  ActivationTensors a = m->acts;
  float* residual = a.residual3 + (size_t)(m->config.L - 1) * N * C;
  gpt2_layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, p.lnfw,
                         p.lnfb, N, C);
  gpt2_matmul_forward(a.logits, a.lnf, p.wte, NULL, N, C, V);
  gpt2_softmax_crossentropy_forward(a.probs, a.losses, a.logits, targets, N, V);
  float loss = 0.0f;
  for (int i = 0; i < N; i++) loss += a.losses[i];
  return loss / N;
}

/* ==== Backward ============================================================ */

static void head_backward(GPT2* m, const int* targets) {
  const int N = m->B * m->T, C = m->config.C, V = m->config.V;
  ParameterTensors p = m->params, g = m->grads;
  ActivationTensors a = m->acts, ga = m->grads_acts;
  for (int i = 0; i < N; i++) ga.losses[i] = 1.0f / N;
  gpt2_softmax_crossentropy_backward(ga.logits, ga.losses, a.probs, targets, N,
                                     V);
  gpt2_matmul_backward(ga.lnf, g.wte, NULL, ga.logits, a.lnf, p.wte, N, C, V);
  float* residual = a.residual3 + (size_t)(m->config.L - 1) * N * C;
  float* dresidual = ga.residual3 + (size_t)(m->config.L - 1) * N * C;
  gpt2_layernorm_backward(dresidual, g.lnfw, g.lnfb, ga.lnf, residual, p.lnfw,
                          a.lnf_mean, a.lnf_rstd, N, C);
}

static void block_backward(GPT2* m, int l) {
  const int B = m->B, T = m->T, C = m->config.C, NH = m->config.NH, N = B * T;
  ParameterTensors p = m->params, g = m->grads;
  ActivationTensors a = m->acts, ga = m->grads_acts;
  float* residual = l == 0 ? a.encoded : a.residual3 + (size_t)(l - 1) * N * C;
  float* dresidual =
      l == 0 ? ga.encoded : ga.residual3 + (size_t)(l - 1) * N * C;
  float* l_ln1w = p.ln1w + l * C;
  float* l_qkvw = p.qkvw + (size_t)l * 3 * C * C;
  float* l_attprojw = p.attprojw + (size_t)l * C * C;
  float* l_ln2w = p.ln2w + l * C;
  float* l_fcw = p.fcw + (size_t)l * 4 * C * C;
  float* l_fcprojw = p.fcprojw + (size_t)l * C * 4 * C;
  float* dl_ln1w = g.ln1w + l * C;
  float* dl_ln1b = g.ln1b + l * C;
  float* dl_qkvw = g.qkvw + (size_t)l * 3 * C * C;
  float* dl_qkvb = g.qkvb + l * 3 * C;
  float* dl_attprojw = g.attprojw + (size_t)l * C * C;
  float* dl_attprojb = g.attprojb + l * C;
  float* dl_ln2w = g.ln2w + l * C;
  float* dl_ln2b = g.ln2b + l * C;
  float* dl_fcw = g.fcw + (size_t)l * 4 * C * C;
  float* dl_fcb = g.fcb + l * 4 * C;
  float* dl_fcprojw = g.fcprojw + (size_t)l * C * 4 * C;
  float* dl_fcprojb = g.fcprojb + l * C;
  float* l_ln1 = a.ln1 + (size_t)l * N * C;
  float* l_ln1_mean = a.ln1_mean + (size_t)l * N;
  float* l_ln1_rstd = a.ln1_rstd + (size_t)l * N;
  float* l_qkv = a.qkv + (size_t)l * N * 3 * C;
  float* l_atty = a.atty + (size_t)l * N * C;
  float* l_att = a.att + (size_t)l * B * NH * T * T;
  float* l_residual2 = a.residual2 + (size_t)l * N * C;
  float* l_ln2 = a.ln2 + (size_t)l * N * C;
  float* l_ln2_mean = a.ln2_mean + (size_t)l * N;
  float* l_ln2_rstd = a.ln2_rstd + (size_t)l * N;
  float* l_fch = a.fch + (size_t)l * N * 4 * C;
  float* l_fch_gelu = a.fch_gelu + (size_t)l * N * 4 * C;
  float* dl_ln1 = ga.ln1 + (size_t)l * N * C;
  float* dl_qkv = ga.qkv + (size_t)l * N * 3 * C;
  float* dl_atty = ga.atty + (size_t)l * N * C;
  float* dl_preatt = ga.preatt + (size_t)l * B * NH * T * T;
  float* dl_att = ga.att + (size_t)l * B * NH * T * T;
  float* dl_attproj = ga.attproj + (size_t)l * N * C;
  float* dl_residual2 = ga.residual2 + (size_t)l * N * C;
  float* dl_ln2 = ga.ln2 + (size_t)l * N * C;
  float* dl_fch = ga.fch + (size_t)l * N * 4 * C;
  float* dl_fch_gelu = ga.fch_gelu + (size_t)l * N * 4 * C;
  float* dl_fcproj = ga.fcproj + (size_t)l * N * C;
  float* dl_residual3 = ga.residual3 + (size_t)l * N * C;
  gpt2_residual_backward(dl_residual2, dl_fcproj, dl_residual3, (size_t)N * C);
  gpt2_matmul_backward(dl_fch_gelu, dl_fcprojw, dl_fcprojb, dl_fcproj,
                       l_fch_gelu, l_fcprojw, N, 4 * C, C);
  gpt2_gelu_backward(dl_fch, l_fch, dl_fch_gelu, (size_t)N * 4 * C);
  gpt2_matmul_backward(dl_ln2, dl_fcw, dl_fcb, dl_fch, l_ln2, l_fcw, N, C,
                       4 * C);
  gpt2_layernorm_backward(dl_residual2, dl_ln2w, dl_ln2b, dl_ln2, l_residual2,
                          l_ln2w, l_ln2_mean, l_ln2_rstd, N, C);
  gpt2_residual_backward(dresidual, dl_attproj, dl_residual2, (size_t)N * C);
  gpt2_matmul_backward(dl_atty, dl_attprojw, dl_attprojb, dl_attproj, l_atty,
                       l_attprojw, N, C, C);
  gpt2_attention_backward(dl_qkv, dl_preatt, dl_att, dl_atty, l_qkv, l_att, B,
                          T, C, NH);
  gpt2_matmul_backward(dl_ln1, dl_qkvw, dl_qkvb, dl_qkv, l_ln1, l_qkvw, N, C,
                       3 * C);
  gpt2_layernorm_backward(dresidual, dl_ln1w, dl_ln1b, dl_ln1, residual,
                          l_ln1w, l_ln1_mean, l_ln1_rstd, N, C);
}

static void embed_backward(GPT2* m, const int* tokens) {
  gpt2_encoder_backward(m->grads.wte, m->grads.wpe, m->grads_acts.encoded,
                        tokens, m->B, m->T, m->config.C);
}

/* ==== Update ============================================================== */

static void update(GPT2* m, float lr, int t) {
  (void)m, (void)lr, (void)t, CHECK(zs_step(zm, NULL)); /* on each rank's shard */
}

/* ==== Main ================================================================ */

int main(int argc, char** argv) {
  GPT2Config c = {256, 64, 4, 4, 64}; /* bytes as tokens */
  int steps = 20, B = 8, T = 64, stage = 0, provided, rank, size, E, U[MAX_LAYERS], kinds[16];
  unsigned long long seed = 1;
  float lr = 1e-3f;
  const char* dump = NULL;
  const char* path = "data/tinyshakespeare.txt";
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    if (!strcmp(k, "--steps")) steps = atoi(v);
    else if (!strcmp(k, "--layers")) c.L = atoi(v);
    else if (!strcmp(k, "--channels")) c.C = atoi(v);
    else if (!strcmp(k, "--heads")) c.NH = atoi(v);
    else if (!strcmp(k, "--seq")) T = c.maxT = atoi(v);
    else if (!strcmp(k, "--batch")) B = atoi(v);
    else if (!strcmp(k, "--seed")) seed = strtoull(v, NULL, 10);
    else if (!strcmp(k, "--lr")) lr = (float)atof(v);
    else if (!strcmp(k, "--dump")) dump = v;
    else if (!strcmp(k, "--data")) path = v;
    else if (!strcmp(k, "--stage")) stage = atoi(v);
    else {
      fprintf(stderr, "unknown option %s\n", k);
      return 2;
    }
  }
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank > 0) freopen("/dev/null", "w", stdout), dump = NULL; /* rank 0 reports */
  if (c.L < 1 || c.L > MAX_LAYERS || c.C % c.NH != 0 || B < 1 || B % size || T < 2) {
    fprintf(stderr, "bad model: layers 1..%d, channels a multiple of heads, "
            "a batch >= 1 that the ranks divide\n", MAX_LAYERS);
    return 2;
  }
  gpt2_data data;
  char err[256];
  if (gpt2_data_load(path, T, &data, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }

  B /= size; /* this rank's part of the batch */
  GPT2 m = {0};
  m.config = c;
  m.B = B;
  m.T = T;
  fill_in_parameter_sizes(m.param_sizes, c);
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++)
    m.num_parameters += m.param_sizes[k];
  zs_config zc = ZS_CONFIG_INIT; /* AdamW, betas 0.9/0.999, eps 1e-8 */
  zc.stage = stage, zc.optimizer.lr = lr, zc.optimizer.weight_decay = 0.0;
  CHECK(zs_context_create_mpi(&zc, MPI_COMM_WORLD, &ctx)), CHECK(zs_model_create(ctx, &zm));
  CHECK(zs_model_add_unit(zm, "embed", &E)); /* wte, wpe, lnfw, lnfb */
  CHECK(zs_model_add_units(zm, "block", c.L, U)); /* block.0 .. block.L-1 */
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) { /* kinds 2..13: (L, ...) */
    const int64_t L = k >= 2 && k < 14 ? c.L : 1, shape[2] = {L, (int64_t)m.param_sizes[k] / L};
    CHECK(zs_model_add_stacked(zm, kParamNames[k], 2, shape, shape[1], ZS_FLOAT32, 0, k >= 2 && k < 14 ? U : &E, &kinds[k]));
  }
  CHECK(zs_unit_set_grad_uses(zm, E, 2)); /* gradient uses per step: embedding and head */
  for (int l = 0; l < c.L; l++) CHECK(zs_unit_set_grad_uses(zm, U[l], 1));
  CHECK(zs_model_finalize(zm));
  m.params_memory = malloc_and_point(&m.params, m.param_sizes);
  init_params(&m.params, m.param_sizes, seed);
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) { /* rank 0's values in, then the views */
    CHECK(zs_kind_set(zm, kinds[k], *view(&m.params, k)));
    CHECK(zs_kind_data(zm, kinds[k], (void**)view(&m.params, k))), CHECK(zs_kind_grad(zm, kinds[k], (void**)view(&m.grads, k)));
  }
  m.acts_memory = malloc_activations(&m.acts, c, B, T, &m.num_activations);
  m.grads_acts_memory =
      malloc_activations(&m.grads_acts, c, B, T, &m.num_activations);
  int* tokens = (int*)malloc(sizeof(int) * B * T);
  int* targets = (int*)malloc(sizeof(int) * B * T);
  printf("%zu parameters, %d layers, %d channels\n", m.num_parameters, c.L,
         c.C);
  for (int k = 0; k < NUM_PARAMETER_TENSORS; k++)
    printf("%s%s %zu%s", k ? ", " : "kinds (elements): ", kParamNames[k],
           m.param_sizes[k], k + 1 < NUM_PARAMETER_TENSORS ? "" : "\n");

  for (int step = 0; step < steps; step++) {
    gpt2_data_train_batch(&data, seed, step, rank * B, B, T, tokens, targets);
    memset(m.grads_acts_memory, 0, m.num_activations * sizeof(float));
    use(E, 0), embed_forward(&m, tokens), done(E, 0);
    for (int l = 0; l < c.L; l++) use(U[l], 0), block_forward(&m, l), done(U[l], 0);
    use(E, 0); float loss = head_forward(&m, targets); done(E, 0);
    use(E, 1), head_backward(&m, targets), done(E, 1);
    for (int l = c.L - 1; l >= 0; l--) use(U[l], 1), block_backward(&m, l), done(U[l], 1);
    use(E, 1), embed_backward(&m, tokens), done(E, 1);
    update(&m, lr, step + 1);
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), loss /= size;
    printf("step %d loss %.6f\n", step, loss);
  }

  for (size_t k = 0, off = 0; k < NUM_PARAMETER_TENSORS; off += m.param_sizes[k++]) /* the trained values */
    CHECK(zs_kind_get(zm, kinds[k], ZS_FIELD_PARAM, *view(&m.params, k) = m.params_memory + off));
  if (dump != NULL) {
    FILE* f = fopen(dump, "wb");
    for (int k = 0; f != NULL && k < NUM_PARAMETER_TENSORS; k++)
      fwrite(*view(&m.params, k), sizeof(float), m.param_sizes[k], f);
    if (f == NULL || fclose(f) != 0) perror(dump);
  }
  free(tokens);
  free(targets);
  free(m.params_memory);
  free(m.grads_memory);
  free(m.m_memory);
  free(m.v_memory);
  free(m.acts_memory);
  free(m.grads_acts_memory);
  gpt2_data_free(&data);
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
  MPI_Finalize();
  return 0;
}
