/*
 * model.c — the GPT-2-style model of model.h: parameter tables, views,
 * initialization, the activation allocation, and forward/backward of the
 * embed unit, a block and the head, composed from layers.c.
 */
#include "examples/gpt2/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/gpt2/layers.h"

/* ==== The CPU backend ====================================================== */

static void* gpt2__cpu_alloc(size_t bytes) {
  return calloc(1, bytes ? bytes : 1);
}
static void gpt2__cpu_zero(void* p, size_t bytes) { memset(p, 0, bytes); }
static void gpt2__cpu_copy(void* dst, const void* src, size_t bytes) {
  memcpy(dst, src, bytes);
}
static void gpt2__cpu_fill(float* p, float value, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = value;
}
static double gpt2__cpu_sum(const float* x, size_t n) {
  double sum = 0.0; /* a fixed-order sum: the same on every run */
  for (size_t i = 0; i < n; i++) sum += x[i];
  return sum;
}
static int gpt2__cpu_error(char* msg, size_t cap) {
  (void)msg;
  (void)cap;
  return 0;
}

const gpt2_layer_ops gpt2_cpu_ops = {
    "cpu",
    gpt2_encoder_forward,
    gpt2_encoder_backward,
    gpt2_layernorm_forward,
    gpt2_layernorm_backward,
    gpt2_matmul_forward,
    gpt2_matmul_backward,
    gpt2_attention_forward,
    gpt2_attention_backward,
    gpt2_gelu_forward,
    gpt2_gelu_backward,
    gpt2_residual_forward,
    gpt2_softmax_crossentropy_forward,
    gpt2_softmax_crossentropy_backward,
    gpt2__cpu_alloc,
    free,
    gpt2__cpu_zero,
    gpt2__cpu_copy,
    gpt2__cpu_copy,
    gpt2__cpu_copy,
    gpt2__cpu_fill,
    gpt2__cpu_sum,
    gpt2__cpu_error,
};

static const gpt2_layer_ops* gpt2__ops(const gpt2_acts* a) {
  return a->ops != NULL ? a->ops : &gpt2_cpu_ops;
}

/* ==== Parameter tables ===================================================== */

size_t gpt2_embed_tensor(const gpt2_config* c, int i, const char** name,
                         int* ndim, long long shape[2], int* decay) {
  static const char* const names[GPT2_EMBED_TENSORS] = {"wte", "wpe", "lnf_w",
                                                        "lnf_b"};
  const long long C = c->channels;
  const long long rows[GPT2_EMBED_TENSORS] = {c->vocab, c->max_seq, C, C};
  int two_d = i < 2;
  *name = names[i];
  *ndim = two_d ? 2 : 1;
  shape[0] = rows[i];
  shape[1] = two_d ? C : 1;
  *decay = two_d;
  return (size_t)(shape[0] * shape[1]);
}

size_t gpt2_block_tensor(const gpt2_config* c, int i, const char** name,
                         int* ndim, long long shape[2], int* decay) {
  static const char* const names[GPT2_BLOCK_TENSORS] = {
      "ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w",   "proj_b",
      "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fcproj_w", "fcproj_b"};
  const long long C = c->channels;
  /* rows, cols (0: a vector) */
  const long long dims[GPT2_BLOCK_TENSORS][2] = {
      {C, 0},     {C, 0}, {3 * C, C}, {3 * C, 0}, {C, C},     {C, 0},
      {C, 0},     {C, 0}, {4 * C, C}, {4 * C, 0}, {C, 4 * C}, {C, 0}};
  *name = names[i];
  *ndim = dims[i][1] ? 2 : 1;
  shape[0] = dims[i][0];
  shape[1] = dims[i][1] ? dims[i][1] : 1;
  *decay = dims[i][1] != 0;
  return (size_t)(shape[0] * shape[1]);
}

static size_t gpt2__sum(const gpt2_config* c, int n,
                        size_t (*f)(const gpt2_config*, int, const char**,
                                    int*, long long*, int*)) {
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const char* name;
    int ndim, decay;
    long long shape[2];
    total += f(c, i, &name, &ndim, shape, &decay);
  }
  return total;
}

size_t gpt2_embed_numel(const gpt2_config* c) {
  return gpt2__sum(c, GPT2_EMBED_TENSORS, gpt2_embed_tensor);
}
size_t gpt2_block_numel(const gpt2_config* c) {
  return gpt2__sum(c, GPT2_BLOCK_TENSORS, gpt2_block_tensor);
}
size_t gpt2_num_params(const gpt2_config* c) {
  return gpt2_embed_numel(c) + (size_t)c->layers * gpt2_block_numel(c);
}

void gpt2_embed_slots(gpt2_embed_params* p, float** slots[GPT2_EMBED_TENSORS]) {
  slots[0] = &p->wte;
  slots[1] = &p->wpe;
  slots[2] = &p->lnf_w;
  slots[3] = &p->lnf_b;
}

void gpt2_block_slots(gpt2_block_params* p, float** slots[GPT2_BLOCK_TENSORS]) {
  float** s[GPT2_BLOCK_TENSORS] = {
      &p->ln1_w, &p->ln1_b, &p->qkv_w, &p->qkv_b, &p->proj_w,   &p->proj_b,
      &p->ln2_w, &p->ln2_b, &p->fc_w,  &p->fc_b,  &p->fcproj_w, &p->fcproj_b};
  memcpy(slots, s, sizeof s);
}

void gpt2_embed_views(const gpt2_config* c, float* base, gpt2_embed_params* p) {
  float** v[GPT2_EMBED_TENSORS];
  gpt2_embed_slots(p, v);
  for (int i = 0; i < GPT2_EMBED_TENSORS; i++) {
    const char* name;
    int ndim, decay;
    long long shape[2];
    *v[i] = base;
    base += gpt2_embed_tensor(c, i, &name, &ndim, shape, &decay);
  }
}

void gpt2_block_views(const gpt2_config* c, float* base, gpt2_block_params* p) {
  float** v[GPT2_BLOCK_TENSORS];
  gpt2_block_slots(p, v);
  for (int i = 0; i < GPT2_BLOCK_TENSORS; i++) {
    const char* name;
    int ndim, decay;
    long long shape[2];
    *v[i] = base;
    base += gpt2_block_tensor(c, i, &name, &ndim, shape, &decay);
  }
}

/* ==== Initialization ====================================================== */

static uint64_t gpt2__mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A standard normal from a counter (Box-Muller on two hashed uniforms). */
static float gpt2__normal(uint64_t key, uint64_t k) {
  uint64_t a = gpt2__mix(key ^ gpt2__mix(2 * k));
  uint64_t b = gpt2__mix(key ^ gpt2__mix(2 * k + 1));
  double u1 = ((double)(a >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
  double u2 = (double)(b >> 11) / 9007199254740992.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void gpt2_init_tensor(const gpt2_config* c, unsigned long long seed, int which,
                      int i, float* data) {
  const char* name;
  int ndim, decay;
  long long shape[2];
  size_t n = which < 0 ? gpt2_embed_tensor(c, i, &name, &ndim, shape, &decay)
                       : gpt2_block_tensor(c, i, &name, &ndim, shape, &decay);
  uint64_t key = gpt2__mix(seed ^ gpt2__mix((uint64_t)(which + 2) * 64 + i));
  float std = 0.02f;
  if (strcmp(name, "proj_w") == 0 || strcmp(name, "fcproj_w") == 0)
    std = 0.02f / sqrtf(2.0f * (float)c->layers);
  int gain = strstr(name, "ln") != NULL && name[strlen(name) - 1] == 'w';
  /* element k depends only on (key, k): any split gives the same values */
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < n; k++) {
    if (decay)
      data[k] = std * gpt2__normal(key, k);
    else
      data[k] = gain ? 1.0f : 0.0f;
  }
}

/* ==== Activations ========================================================== */

/* Element counts of the activation pieces for (B, T). */
typedef struct gpt2__sizes {
  size_t NC, N, att, NV;
} gpt2__sizes;

static gpt2__sizes gpt2__sizes_of(const gpt2_config* c, int B, int T) {
  gpt2__sizes s;
  s.N = (size_t)B * T;
  s.NC = s.N * (size_t)c->channels;
  s.att = (size_t)B * c->heads * T * T;
  s.NV = s.N * (size_t)c->vocab;
  return s;
}

/* A block's internal activations, in layout order (its output res3 is not
 * part of them): ln1, ln1 mean, rstd, qkv, atty, att, preatt, proj, res2,
 * ln2, ln2 mean, rstd, fch, fch_gelu, fcproj. */
enum { GPT2__BLOCK_PIECES = 15 };

static void gpt2__block_piece_sizes(const gpt2__sizes* s, size_t n[]) {
  const size_t v[GPT2__BLOCK_PIECES] = {
      s->NC, s->N, s->N, 3 * s->NC, s->NC, s->att, s->att, s->NC,
      s->NC, s->NC, s->N, s->N, 4 * s->NC, 4 * s->NC, s->NC};
  memcpy(n, v, sizeof v);
}

/* The addresses of the per-layer tables of a block's pieces, in order. */
static void gpt2__block_tables(gpt2_acts* a, float*** v[]) {
  float*** s[GPT2__BLOCK_PIECES] = {
      &a->ln1,  &a->ln1_mean, &a->ln1_rstd, &a->qkv,      &a->atty,
      &a->att,  &a->preatt,   &a->proj,     &a->res2,     &a->ln2,
      &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->fcproj};
  memcpy(v, s, sizeof s);
}

size_t gpt2_block_scratch_bytes(const gpt2_config* c, int B, int T) {
  gpt2__sizes s = gpt2__sizes_of(c, B, T);
  return sizeof(float) * (17 * s.NC + 4 * s.N + 2 * s.att);
}

size_t gpt2_head_scratch_bytes(const gpt2_config* c, int B, int T) {
  gpt2__sizes s = gpt2__sizes_of(c, B, T);
  return sizeof(float) * (s.NC + 3 * s.N + 2 * s.NV);
}

size_t gpt2_grads_bytes(const gpt2_config* c, int B, int T) {
  gpt2__sizes s = gpt2__sizes_of(c, B, T);
  /* dres, dlnf, dlogits, dlosses, dln, datty, dqkv, dpreatt, datt, dfch,
   * dfch_gelu, dres2 */
  return sizeof(float) *
         (s.NC + s.NC + s.NV + s.N + s.NC + s.NC + 3 * s.NC + 2 * s.att +
          8 * s.NC + s.NC);
}

size_t gpt2_acts_bytes(const gpt2_config* c, int B, int T) {
  gpt2__sizes s = gpt2__sizes_of(c, B, T);
  return (size_t)c->layers *
             (gpt2_block_scratch_bytes(c, B, T) + sizeof(float) * s.NC) +
         sizeof(float) * s.NC /* encoded */ + gpt2_head_scratch_bytes(c, B, T) +
         gpt2_grads_bytes(c, B, T);
}

void gpt2_acts_bind_block(const gpt2_config* c, gpt2_acts* a, int l,
                          void* scratch, const float* in, float* out) {
  gpt2__sizes s = gpt2__sizes_of(c, a->B, a->T);
  size_t n[GPT2__BLOCK_PIECES];
  float*** tables[GPT2__BLOCK_PIECES];
  gpt2__block_piece_sizes(&s, n);
  gpt2__block_tables(a, tables);
  float* m = (float*)scratch;
  for (int k = 0; k < GPT2__BLOCK_PIECES; k++) {
    (*tables[k])[l] = m;
    m += n[k];
  }
  a->res3[l] = out;
  if (l == 0) a->encoded = (float*)in;
  else a->res3[l - 1] = (float*)in;
}

void gpt2_acts_bind_head(const gpt2_config* c, gpt2_acts* a, void* scratch,
                         const float* in) {
  gpt2__sizes s = gpt2__sizes_of(c, a->B, a->T);
  float* m = (float*)scratch;
  a->lnf = m;
  a->lnf_mean = (m += s.NC);
  a->lnf_rstd = (m += s.N);
  a->logits = (m += s.N);
  a->probs = (m += s.NV);
  a->losses = (m += s.NV);
  if (c->layers > 0) a->res3[c->layers - 1] = (float*)in;
  else a->encoded = (float*)in;
}

/* The per-layer pointer tables and the gradient buffers (at grads). */
static int gpt2__acts_tables(const gpt2_config* c, int B, int T,
                             gpt2_acts* a) {
  const int L = c->layers;
  a->B = B;
  a->T = T;
  a->ptrs = (float**)calloc((size_t)16 * (L + 1), sizeof(float*));
  if (a->ptrs == NULL) return -1;
  float*** all[16] = {&a->ln1,  &a->ln1_mean, &a->ln1_rstd, &a->qkv,
                      &a->atty, &a->att,      &a->preatt,   &a->proj,
                      &a->res2, &a->ln2,      &a->ln2_mean, &a->ln2_rstd,
                      &a->fch,  &a->fch_gelu, &a->fcproj,   &a->res3};
  for (int k = 0; k < 16; k++) *all[k] = a->ptrs + (size_t)k * (L + 1);
  return 0;
}

static void gpt2__bind_grads(const gpt2_config* c, gpt2_acts* a, float* m) {
  gpt2__sizes s = gpt2__sizes_of(c, a->B, a->T);
#define GPT2_TAKE(n) (m += (n), m - (n))
  a->dres = GPT2_TAKE(s.NC);
  a->dlnf = GPT2_TAKE(s.NC);
  a->dlogits = GPT2_TAKE(s.NV);
  a->dlosses = GPT2_TAKE(s.N);
  a->dln = GPT2_TAKE(s.NC);
  a->datty = GPT2_TAKE(s.NC);
  a->dqkv = GPT2_TAKE(3 * s.NC);
  a->dpreatt = GPT2_TAKE(s.att);
  a->datt = GPT2_TAKE(s.att);
  a->dfch = GPT2_TAKE(4 * s.NC);
  a->dfch_gelu = GPT2_TAKE(4 * s.NC);
  a->dres2 = GPT2_TAKE(s.NC);
#undef GPT2_TAKE
}

int gpt2_acts_alloc(const gpt2_config* c, int B, int T, gpt2_acts* a) {
  memset(a, 0, sizeof *a);
  const int L = c->layers;
  gpt2__sizes s = gpt2__sizes_of(c, B, T);
  a->bytes = gpt2_acts_bytes(c, B, T);
  a->memory = (float*)calloc(1, a->bytes);
  if (a->memory == NULL || gpt2__acts_tables(c, B, T, a) != 0) {
    gpt2_acts_free(a);
    return -1;
  }
  /* [block 0 scratch][res3 0]...[encoded][head scratch][gradients] */
  char* m = (char*)a->memory;
  const size_t bs = gpt2_block_scratch_bytes(c, B, T);
  float* encoded = (float*)(m + (size_t)L * (bs + sizeof(float) * s.NC));
  for (int l = 0; l < L; l++) {
    char* base = m + (size_t)l * (bs + sizeof(float) * s.NC);
    const float* in = l == 0 ? encoded : a->res3[l - 1];
    gpt2_acts_bind_block(c, a, l, base, in, (float*)(base + bs));
  }
  a->encoded = encoded;
  char* head = (char*)(encoded + s.NC);
  gpt2_acts_bind_head(c, a, head,
                      L > 0 ? a->res3[L - 1] : encoded);
  gpt2__bind_grads(c, a, (float*)(head + gpt2_head_scratch_bytes(c, B, T)));
  return 0;
}

int gpt2_acts_alloc_grads(const gpt2_config* c, int B, int T, gpt2_acts* a) {
  return gpt2_acts_alloc_grads_on(c, B, T, &gpt2_cpu_ops, a);
}

int gpt2_acts_alloc_grads_on(const gpt2_config* c, int B, int T,
                             const gpt2_layer_ops* ops, gpt2_acts* a) {
  memset(a, 0, sizeof *a);
  a->ops = ops;
  a->bytes = gpt2_grads_bytes(c, B, T);
  a->memory = (float*)ops->alloc(a->bytes);
  if (a->memory == NULL || gpt2__acts_tables(c, B, T, a) != 0) {
    gpt2_acts_free(a);
    return -1;
  }
  gpt2__bind_grads(c, a, a->memory);
  return 0;
}

void gpt2_acts_free(gpt2_acts* a) {
  gpt2__ops(a)->free(a->memory);
  free(a->ptrs);
  memset(a, 0, sizeof *a);
}

void gpt2_acts_zero_grads(const gpt2_config* c, gpt2_acts* a) {
  gpt2__sizes s = gpt2__sizes_of(c, a->B, a->T);
  /* The gradient buffers are contiguous, from dres to the end of dres2. */
  const size_t n = (size_t)((a->dres2 + s.NC) - a->dres);
  gpt2__ops(a)->zero(a->dres, n * sizeof(float));
}

/* ==== Forward ============================================================== */

void gpt2_embed_forward(const gpt2_config* c, const gpt2_embed_params* p,
                        const int* tokens, gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  o->encoder_forward(a->encoded, tokens, p->wte, p->wpe, a->B, a->T,
                     c->channels);
}

void gpt2_block_forward(const gpt2_config* c, const gpt2_block_params* p, int l,
                        gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  const int B = a->B, T = a->T, C = c->channels, N = B * T;
  const size_t NC = (size_t)N * C;
  const float* in = l == 0 ? a->encoded : a->res3[l - 1]; /* (B, T, C) */
  o->layernorm_forward(a->ln1[l], a->ln1_mean[l], a->ln1_rstd[l], in, p->ln1_w,
                       p->ln1_b, N, C);
  o->matmul_forward(a->qkv[l], a->ln1[l], p->qkv_w, p->qkv_b, N, C, 3 * C);
  o->attention_forward(a->atty[l], a->preatt[l], a->att[l], a->qkv[l], B, T, C,
                       c->heads);
  o->matmul_forward(a->proj[l], a->atty[l], p->proj_w, p->proj_b, N, C, C);
  o->residual_forward(a->res2[l], in, a->proj[l], NC);
  o->layernorm_forward(a->ln2[l], a->ln2_mean[l], a->ln2_rstd[l], a->res2[l],
                       p->ln2_w, p->ln2_b, N, C);
  o->matmul_forward(a->fch[l], a->ln2[l], p->fc_w, p->fc_b, N, C, 4 * C);
  o->gelu_forward(a->fch_gelu[l], a->fch[l], 4 * NC);
  o->matmul_forward(a->fcproj[l], a->fch_gelu[l], p->fcproj_w, p->fcproj_b, N,
                    4 * C, C);
  o->residual_forward(a->res3[l], a->res2[l], a->fcproj[l], NC);
}

float gpt2_head_forward(const gpt2_config* c, const gpt2_embed_params* p,
                        const int* targets, gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  const int N = a->B * a->T, C = c->channels, V = c->vocab;
  const float* in = c->layers > 0 ? a->res3[c->layers - 1] : a->encoded;
  o->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, in, p->lnf_w, p->lnf_b,
                       N, C);
  o->matmul_forward(a->logits, a->lnf, p->wte, NULL, N, C, V);
  if (targets == NULL) return 0.0f;
  o->softmax_crossentropy_forward(a->probs, a->losses, a->logits, targets, N,
                                  V);
  return (float)(o->sum(a->losses, (size_t)N) / N);
}

/* ==== Backward ============================================================= */

void gpt2_head_backward(const gpt2_config* c, const gpt2_embed_params* p,
                        gpt2_embed_params* g, const int* targets,
                        float loss_scale, gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  const int N = a->B * a->T, C = c->channels, V = c->vocab;
  const float* in = c->layers > 0 ? a->res3[c->layers - 1] : a->encoded;
  o->fill(a->dlosses, loss_scale / (float)N, (size_t)N);
  o->softmax_crossentropy_backward(a->dlogits, a->dlosses, a->probs, targets, N,
                                   V);
  o->matmul_backward(a->dlnf, g->wte, NULL, a->dlogits, a->lnf, p->wte, N, C,
                     V);
  o->layernorm_backward(a->dres, g->lnf_w, g->lnf_b, a->dlnf, in, p->lnf_w,
                        a->lnf_mean, a->lnf_rstd, N, C);
}

void gpt2_block_backward(const gpt2_config* c, const gpt2_block_params* p,
                         gpt2_block_params* g, int l, gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  const int B = a->B, T = a->T, C = c->channels, N = B * T;
  const size_t NC = (size_t)N * C;
  const float* in = l == 0 ? a->encoded : a->res3[l - 1];
  /* res3 = res2 + fcproj: both get dres. */
  o->copy(a->dres2, a->dres, NC * sizeof(float));
  o->zero(a->dfch_gelu, 4 * NC * sizeof(float));
  o->zero(a->dfch, 4 * NC * sizeof(float));
  o->zero(a->dln, NC * sizeof(float));
  o->matmul_backward(a->dfch_gelu, g->fcproj_w, g->fcproj_b, a->dres,
                     a->fch_gelu[l], p->fcproj_w, N, 4 * C, C);
  o->gelu_backward(a->dfch, a->fch[l], a->dfch_gelu, 4 * NC);
  o->matmul_backward(a->dln, g->fc_w, g->fc_b, a->dfch, a->ln2[l], p->fc_w, N,
                     C, 4 * C);
  o->layernorm_backward(a->dres2, g->ln2_w, g->ln2_b, a->dln, a->res2[l],
                        p->ln2_w, a->ln2_mean[l], a->ln2_rstd[l], N, C);
  /* res2 = in + proj: both get dres2; dres becomes the gradient of `in`. */
  o->copy(a->dres, a->dres2, NC * sizeof(float));
  o->zero(a->datty, NC * sizeof(float));
  o->zero(a->dqkv, 3 * NC * sizeof(float));
  o->zero(a->dln, NC * sizeof(float));
  o->matmul_backward(a->datty, g->proj_w, g->proj_b, a->dres2, a->atty[l],
                     p->proj_w, N, C, C);
  o->attention_backward(a->dqkv, a->dpreatt, a->datt, a->datty, a->qkv[l],
                        a->att[l], B, T, C, c->heads);
  o->matmul_backward(a->dln, g->qkv_w, g->qkv_b, a->dqkv, a->ln1[l], p->qkv_w,
                     N, C, 3 * C);
  o->layernorm_backward(a->dres, g->ln1_w, g->ln1_b, a->dln, in, p->ln1_w,
                        a->ln1_mean[l], a->ln1_rstd[l], N, C);
}

void gpt2_embed_backward(const gpt2_config* c, gpt2_embed_params* g,
                         const int* tokens, gpt2_acts* a) {
  const gpt2_layer_ops* o = gpt2__ops(a);
  o->encoder_backward(g->wte, g->wpe, a->dres, tokens, a->B, a->T, c->channels);
}

int gpt2_config_check(const gpt2_config* c, char* err, size_t cap) {
  if (c->channels <= 0 || c->layers < 0 || c->heads <= 0 || c->max_seq <= 0 ||
      c->vocab <= 0) {
    snprintf(err, cap,
             "--channels (%d), --heads (%d), --seq (%d) must be positive and "
             "--layers (%d) non-negative",
             c->channels, c->heads, c->max_seq, c->layers);
    return -1;
  }
  if (c->channels % c->heads != 0) {
    snprintf(err, cap, "--heads %d does not divide --channels %d", c->heads,
             c->channels);
    return -1;
  }
  return 0;
}
