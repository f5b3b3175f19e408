/*
 * train_sharded.c — train_plain.c wrapped with ZeroShard: the same model
 * code, sharded across MPI ranks at any ZeRO stage. ZeroShard owns the
 * parameters, gradients and AdamW states; its sequential driver runs the
 * model's layers (the embedding, the blocks, the head) forward and backward,
 * gathering and prefetching each layer's unit, starting each unit's
 * reduce-scatter after its last use, and (with --checkpoint-activations)
 * recomputing each block's activations before its backward.
 * docs/wrapping.md walks through the diff with train_plain.c.
 *
 *   mpirun -np 4 bazel-bin/examples/gpt2/train_sharded --stage 3
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <mpi.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include <zs_mpi.h>

#include "examples/gpt2/data.h"
#include "examples/gpt2/layers_cuda.h"
#include "examples/gpt2/model.h"
#include "examples/gpt2/train_common.h"

/* The context, for the abnormal ends below: MPI_Abort and SIGTERM/SIGINT
 * (mpirun forwards Ctrl-C as SIGTERM) skip zs_context_destroy, so they
 * remove this rank's NVMe swap files first. Volatile: the signal handler
 * reads it, and it is cleared before zs_context_destroy starts. */
static zs_context* volatile g_ctx = NULL;

static void on_signal(int sig) {
  zs_context_remove_files(g_ctx); /* async-signal-safe */
  signal(sig, SIG_DFL);
  raise(sig);
}

/* A failed ZeroShard call ends the program with the library's message. */
#define CHECK(call)                                                     \
  do {                                                                  \
    zs_status st_ = (call);                                             \
    if (st_ != ZS_OK) {                                                 \
      fprintf(stderr, "train_sharded: %s: %s\n  %s\n", #call,           \
              zs_status_string(st_), zs_last_error());                  \
      zs_context_remove_files(g_ctx);                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                     \
    }                                                                   \
  } while (0)

/* Out of host memory in the trainer itself: nothing sensible to continue. */
#define DIE(what)                                                       \
  do {                                                                  \
    fprintf(stderr, "train_sharded: out of memory (%s)\n", what);       \
    zs_context_remove_files(g_ctx);                                     \
    MPI_Abort(MPI_COMM_WORLD, 1);                                       \
  } while (0)

/* What a checkpoint's extras hold for this trainer: where the data stream
 * is (the batch of step s is a pure function of seed, s and the batch
 * shape, so the position is the step) and what fixes the data order. */
static const char kStateMagic[8] = {'z', 's', 'g', 'p', 't', '2', 0, 1};
typedef struct train_state {
  char magic[8];
  int64_t next_step; /* optimizer steps done */
  uint64_t seed;
  int32_t batch, seq;
  int32_t heads;     /* the one model setting the tensor shapes miss */
  int32_t pad;
} train_state;

typedef struct model {
  gpt2_config cfg;
  zs_context* ctx;
  zs_model* zm;     /* ZeroShard owns parameters, gradients, AdamW states */
  zs_driver* drv;   /* runs the layers: embed, block 0..L-1, head */
  int embed;        /* unit of wte, wpe, lnf */
  int* first;       /* first tensor id of unit u */
  int* t_which;     /* tensor id -> its block (-1: the embed unit) ... */
  int* t_index;     /* ... and its index there (gpt2_block_tensor's i) */
  int ln_units;     /* --persistence-threshold: each block's LayerNorms in
                       a unit of their own, tied into the block */
  gpt2_acts acts;   /* the backward's gradient buffers; the forward's are
                       bound to the driver's buffers layer by layer */
  const gpt2_layer_ops* ops; /* where the layers run: CPU or CUDA */
  const int* targets; /* the head's targets, in ops's memory */
  int* targets_dev;   /* CUDA: the device copy of the targets */
  unsigned long long seed;
  zs_dtype dtype;   /* parameter dtype */
  float* pcopy;     /* 16-bit parameters: fp32 copy of one unit at a time */
  size_t pcopy_elems;
} model;

/* ==== Parameters ============================================================ */

static zs_status init_tensor(void* user, int tensor, const zs_tensor_desc* d,
                             void* data) {
  model* m = (model*)user;
  const int which = m->t_which[tensor], i = m->t_index[tensor];
  if (d->dtype == ZS_FLOAT32) {
    gpt2_init_tensor(&m->cfg, m->seed, which, i, (float*)data);
    return ZS_OK;
  }
  /* 16-bit parameters: initialize in fp32, round once */
  float* tmp = (float*)malloc((d->numel > 0 ? d->numel : 1) * sizeof(float));
  if (tmp == NULL) return ZS_ERR_OUT_OF_MEMORY;
  gpt2_init_tensor(&m->cfg, m->seed, which, i, tmp);
  zs_status st = zs_convert(data, d->dtype, tmp, ZS_FLOAT32, d->numel);
  free(tmp);
  return st;
}

/* Tensor i of the embed unit (which = -1) or of block `which` as this
 * trainer registers it: its name ("wte", "h.3.qkv_w"), dimensions, shape
 * and whether weight decay applies. */
static void tensor_spec(const gpt2_config* cfg, int which, int i,
                        char name[64], int* ndim, long long s[2], int* decay) {
  const char* tname;
  if (which < 0) gpt2_embed_tensor(cfg, i, &tname, ndim, s, decay);
  else gpt2_block_tensor(cfg, i, &tname, ndim, s, decay);
  if (which < 0) snprintf(name, 64, "%s", tname);
  else snprintf(name, 64, "h.%d.%s", which, tname);
}

/* Whether block tensor i is a LayerNorm's (ln1_w, ln1_b, ln2_w, ln2_b). */
static int is_layernorm(int i) {
  const char* name;
  int ndim, decay;
  long long s[2];
  (void)gpt2_block_tensor(&(gpt2_config){.channels = 1}, i, &name, &ndim, s,
                          &decay);
  return strncmp(name, "ln", 2) == 0;
}

/* Tensor k of the model as registered (embed's, then per block: with
 * ln_units its LayerNorms' unit, then the block's): its block (-1: embed),
 * index in gpt2_block_tensor's order, name, and the tensor it is tied to
 * (-1: none; a block's LayerNorm with ln_units: the owner in the unit
 * before). Returns 0 when k is past the last tensor. */
static int tensor_plan(const gpt2_config* cfg, int ln_units, int k, int* which,
                       int* i, char name[64], int* ndim, long long s[2],
                       int* decay, int* tied_to) {
  const int per_block = GPT2_BLOCK_TENSORS + (ln_units ? 4 : 0);
  *tied_to = -1;
  if (k < GPT2_EMBED_TENSORS) {
    *which = -1;
    *i = k;
  } else {
    const int b = (k - GPT2_EMBED_TENSORS) / per_block;
    const int r = (k - GPT2_EMBED_TENSORS) % per_block;
    if (b >= cfg->layers) return 0;
    *which = b;
    if (ln_units && r < 4) { /* the LayerNorms' unit: the r-th of them */
      int nth = -1;
      for (*i = 0; *i < GPT2_BLOCK_TENSORS; (*i)++)
        if (is_layernorm(*i) && ++nth == r) break;
    } else {
      *i = r - (ln_units ? 4 : 0);
      if (ln_units && is_layernorm(*i)) {
        int nth = 0;
        for (int j = 0; j < *i; j++) nth += is_layernorm(j);
        *tied_to = GPT2_EMBED_TENSORS + b * per_block + nth;
      }
    }
  }
  tensor_spec(cfg, *which, *i, name, ndim, s, decay);
  if (*tied_to >= 0) strncat(name, ".tied", 63 - strlen(name));
  return 1;
}

/* Tensors the model registers (tensor_plan's count). */
static int model_tensor_count(const gpt2_config* cfg, int ln_units) {
  return GPT2_EMBED_TENSORS +
         cfg->layers * (GPT2_BLOCK_TENSORS + (ln_units ? 4 : 0));
}

/* Registers the units of the embedding (which = -1) or of block `which`:
 * the block's unit, and with m->ln_units its LayerNorms' unit before it
 * (its owners of ties: a gather of the block holds it too). Returns the
 * unit the block's layer uses. */
static int add_unit(model* m, int which, int no_decay) {
  char name[64];
  int unit = -1, ln = -1;
  const int n = which < 0 ? GPT2_EMBED_TENSORS
                          : GPT2_BLOCK_TENSORS + (m->ln_units ? 4 : 0);
  const int k0 = which < 0 ? 0 : zs_model_tensor_count(m->zm);
  if (which >= 0 && m->ln_units) {
    snprintf(name, sizeof name, "block.%d.ln", which);
    CHECK(zs_model_add_unit(m->zm, name, &ln));
    /* used once per step, through the block's ties */
    CHECK(zs_unit_set_grad_uses(m->zm, ln, 1));
  }
  snprintf(name, sizeof name, which < 0 ? "embed" : "block.%d", which);
  CHECK(zs_model_add_unit(m->zm, name, &unit));
  size_t elems = 0, ln_elems = 0;
  for (int k = k0; k < k0 + n; k++) {
    int w, i, ndim, decay, tie, t;
    long long s[2];
    (void)tensor_plan(&m->cfg, m->ln_units, k, &w, &i, name, &ndim, s, &decay,
                      &tie);
    int64_t shape[2] = {s[0], s[1]};
    const int in_ln = ln >= 0 && k - k0 < 4;
    if (tie >= 0)
      CHECK(zs_model_add_tied_tensor(m->zm, unit, name, tie, &t));
    else
      CHECK(zs_model_add_tensor(m->zm, in_ln ? ln : unit, name, ndim, shape,
                                m->dtype, 0, &t));
    if (t != k) {
      fprintf(stderr, "train_sharded: tensor %s registered as %d, planned "
              "%d\n", name, t, k);
      zs_context_remove_files(g_ctx);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    m->t_which[t] = w;
    m->t_index[t] = i;
    if (k - k0 == (ln >= 0 ? 4 : 0)) m->first[unit] = t;
    if (!decay && tie < 0) CHECK(zs_model_set_tensor_group(m->zm, t, no_decay));
    *(in_ln ? &ln_elems : &elems) += (size_t)s[0] * (ndim == 2 ? (size_t)s[1] : 1);
  }
  if (ln >= 0) m->first[ln] = k0;
  if (elems > m->pcopy_elems) m->pcopy_elems = elems;
  return unit;
}

/* Views of a unit's parameters (or gradients) in tensor order. Gradients
 * are fp32 (reduce_dtype). 16-bit parameters are read through an fp32 copy
 * of the unit (the model code computes in fp32, as autocast would on a
 * CPU): one unit's copy at a time, which is all a layer uses. */
static zs_status unit_views(model* m, int unit, int n, float** slots[],
                            int grads) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    const int t = m->first[unit] + i;
    zs_status st = grads ? zs_tensor_grad(m->zm, t, (void**)slots[i])
                         : zs_tensor_data(m->zm, t, (void**)slots[i]);
    if (st != ZS_OK) return st;
    if (grads || m->dtype == ZS_FLOAT32) continue;
    zs_tensor_desc d;
    st = zs_model_tensor_desc(m->zm, t, &d);
    if (st == ZS_OK && off + d.numel > m->pcopy_elems)
      return ZS_ERR_INTERNAL;
    if (st == ZS_OK && m->ops == &gpt2_cuda_ops) {
      if (gpt2_cuda_to_fp32(m->pcopy + off, *slots[i], m->dtype, d.numel) != 0)
        st = ZS_ERR_DEVICE;
    } else if (st == ZS_OK) {
      st = zs_convert(m->pcopy + off, ZS_FLOAT32, *slots[i], m->dtype, d.numel);
    }
    if (st != ZS_OK) return st;
    *slots[i] = m->pcopy + off;
    off += d.numel;
  }
  return ZS_OK;
}

static zs_status embed_views(model* m, gpt2_embed_params* p, int grads) {
  float** s[GPT2_EMBED_TENSORS];
  gpt2_embed_slots(p, s);
  return unit_views(m, m->embed, GPT2_EMBED_TENSORS, s, grads);
}

static zs_status block_views(model* m, int unit, gpt2_block_params* p,
                             int grads) {
  float** s[GPT2_BLOCK_TENSORS];
  gpt2_block_slots(p, s);
  return unit_views(m, unit, GPT2_BLOCK_TENSORS, s, grads);
}

/* ==== The layers, as driver callbacks ======================================== */
/* Layer 0 is the embedding, layers 1..L the blocks, layer L+1 the head. The
 * driver's input buffer holds the tokens; each layer's output is the
 * residual stream (B, T, C), the head's the mean loss. */

static size_t stream_bytes(const model* m) {
  return (size_t)m->acts.B * m->acts.T * m->cfg.channels * sizeof(float);
}

/* After a layer: a failed kernel or cuBLAS call (the layers return nothing)
 * becomes a device error, its message printed. */
static zs_status layer_status(const model* m) {
  char msg[512];
  if (m->ops->error(msg, sizeof msg) == 0) return ZS_OK;
  fprintf(stderr, "train_sharded: %s\n", msg);
  return ZS_ERR_DEVICE;
}

static zs_status embed_forward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  gpt2_embed_params e;
  zs_status st = embed_views(m, &e, 0);
  if (st != ZS_OK) return st;
  m->acts.encoded = (float*)io->output;
  gpt2_embed_forward(&m->cfg, &e, (const int*)io->input, &m->acts);
  return layer_status(m);
}

static zs_status embed_backward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  gpt2_embed_params de;
  zs_status st = embed_views(m, &de, 1);
  if (st != ZS_OK) return st;
  m->ops->copy(m->acts.dres, io->grad_output, stream_bytes(m));
  gpt2_embed_backward(&m->cfg, &de, (const int*)io->input, &m->acts);
  return layer_status(m);
}

static zs_status block_forward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  const int l = io->layer - 1;
  gpt2_block_params b;
  zs_status st = block_views(m, io->unit, &b, 0);
  if (st != ZS_OK) return st;
  gpt2_acts_bind_block(&m->cfg, &m->acts, l, io->scratch, io->input, io->output);
  gpt2_block_forward(&m->cfg, &b, l, &m->acts);
  return layer_status(m);
}

static zs_status block_backward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  const int l = io->layer - 1;
  gpt2_block_params b, db;
  zs_status st = block_views(m, io->unit, &b, 0);
  if (st == ZS_OK) st = block_views(m, io->unit, &db, 1);
  if (st != ZS_OK) return st;
  gpt2_acts_bind_block(&m->cfg, &m->acts, l, io->scratch, io->input, io->output);
  m->ops->copy(m->acts.dres, io->grad_output, stream_bytes(m));
  gpt2_block_backward(&m->cfg, &b, &db, l, &m->acts);
  m->ops->copy(io->grad_input, m->acts.dres, stream_bytes(m));
  return layer_status(m);
}

static zs_status head_forward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  gpt2_embed_params e;
  zs_status st = embed_views(m, &e, 0);
  if (st != ZS_OK) return st;
  gpt2_acts_bind_head(&m->cfg, &m->acts, io->scratch, io->input);
  const float loss = gpt2_head_forward(&m->cfg, &e, m->targets, &m->acts);
  m->ops->upload(io->output, &loss, sizeof loss);
  return layer_status(m);
}

static zs_status head_backward(void* user, zs_model* zm, const zs_layer_io* io) {
  (void)zm;
  model* m = (model*)user;
  gpt2_embed_params e, de;
  zs_status st = embed_views(m, &e, 0);
  if (st == ZS_OK) st = embed_views(m, &de, 1);
  if (st != ZS_OK) return st;
  gpt2_acts_bind_head(&m->cfg, &m->acts, io->scratch, io->input);
  gpt2_acts_zero_grads(&m->cfg, &m->acts);
  /* fp16: the loss gradient carries the loss scale; zs_step removes it */
  gpt2_head_backward(&m->cfg, &e, &de, m->targets,
                     (float)zs_model_loss_scale(m->zm), &m->acts);
  m->ops->copy(io->grad_input, m->acts.dres, stream_bytes(m));
  return layer_status(m);
}

/* Registers the units and the driver's layers (before finalize, so the
 * layers declare how often each unit is used: the embedding twice). */
static void model_build(model* m, const gpt2_args* a, int Bl) {
  const int L = a->layers, T = a->seq;
  m->cfg = gpt2_args_model(a);
  m->seed = a->seed;
  m->ln_units = a->persistence_threshold >= 0;
  const size_t ntensors = (size_t)model_tensor_count(&m->cfg, m->ln_units);
  m->first = (int*)calloc(2 * (size_t)L + 2, sizeof(int));
  m->t_which = (int*)calloc(ntensors, sizeof(int));
  m->t_index = (int*)calloc(ntensors, sizeof(int));
  if (m->first == NULL || m->t_which == NULL || m->t_index == NULL ||
      gpt2_acts_alloc_grads_on(&m->cfg, Bl, T, m->ops, &m->acts) != 0)
    DIE("model buffers");
  if (m->ops != &gpt2_cpu_ops) {
    m->targets_dev = (int*)m->ops->alloc((size_t)Bl * T * sizeof(int));
    if (m->targets_dev == NULL) DIE("targets on the GPU");
  }
  CHECK(zs_memory_register(m->ctx, ZS_MEM_ACTIVATIONS, m->acts.memory, m->acts.bytes));
  CHECK(zs_model_create(m->ctx, &m->zm));
  int no_decay;
  CHECK(zs_model_add_param_group(m->zm, a->lr, 0.0, &no_decay));
  CHECK(zs_driver_create(m->zm, (size_t)Bl * T * sizeof(int),
                         a->checkpoint_verify ? ZS_CHECKPOINT_VERIFY
                                              : a->checkpoint_activations,
                         &m->drv));
  if (m->ln_units)
    CHECK(zs_model_set_persistence_threshold(m->zm,
                                             (size_t)a->persistence_threshold));
  m->embed = add_unit(m, -1, no_decay);
  const size_t stream = stream_bytes(m);
  /* The encoder's backward needs no parameters: no gather for it. */
  zs_layer_desc embed = {m->embed, embed_forward, embed_backward, m, stream, 0,
                         ZS_LAYER_BACKWARD_NO_PARAMS};
  CHECK(zs_driver_add_layer(m->drv, &embed, NULL));
  for (int l = 0; l < L; l++) {
    zs_layer_desc block = {add_unit(m, l, no_decay), block_forward,
                           block_backward, m, stream,
                           gpt2_block_scratch_bytes(&m->cfg, Bl, T), 0};
    CHECK(zs_driver_add_layer(m->drv, &block, NULL));
  }
  zs_layer_desc head = {m->embed, head_forward, head_backward, m, sizeof(float),
                        gpt2_head_scratch_bytes(&m->cfg, Bl, T), 0};
  CHECK(zs_driver_add_layer(m->drv, &head, NULL));
  CHECK(zs_model_finalize(m->zm));
  CHECK(zs_model_init(m->zm, init_tensor, m));
  if (m->dtype != ZS_FLOAT32) {
    m->pcopy = (float*)m->ops->alloc(m->pcopy_elems * sizeof(float));
    if (m->pcopy == NULL) DIE("parameter copy");
    CHECK(zs_memory_register(m->ctx, ZS_MEM_OTHER, m->pcopy,
                             m->pcopy_elems * sizeof(float)));
  }
}

/* The model description for tools/zs estimate --model: every unit with its
 * tensors, and the activation bytes this rank holds (the driver's buffers
 * and the model's backward buffers), which scale with the sequences per
 * rank and micro-batch (all but the 4-byte loss). Rank 0 writes it. */
/* Frees what model_build made, in the order the runtime needs (the driver
 * before its model, the model before its context). */
static void model_free(model* m) {
  zs_driver_destroy(m->drv);
  CHECK(zs_memory_unregister(m->ctx, m->acts.memory));
  gpt2_acts_free(&m->acts);
  if (m->pcopy != NULL) CHECK(zs_memory_unregister(m->ctx, m->pcopy));
  m->ops->free(m->pcopy);
  m->ops->free(m->targets_dev);
  zs_model_destroy(m->zm);
  g_ctx = NULL;
  zs_context_destroy(m->ctx);
  free(m->first);
  free(m->t_which);
  free(m->t_index);
}

static int model_describe(model* m, const char* path, int Bl,
                          int checkpoint) {
  static const char* const dtypes[3] = {"fp32", "bf16", "fp16"};
  cJSON* root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", "zeroshard-model-description");
  cJSON_AddNumberToObject(root, "version", 1);
  cJSON* units = cJSON_AddArrayToObject(root, "units");
  for (int u = 0; u < zs_model_unit_count(m->zm); u++) {
    cJSON* ju = cJSON_CreateObject();
    cJSON_AddStringToObject(ju, "name", zs_model_unit_name(m->zm, u));
    cJSON_AddStringToObject(ju, "dtype", dtypes[m->dtype % 3]);
    /* the trainer's gradients are fp32 whatever the parameters (it sets
     * reduce_dtype to fp32) */
    cJSON_AddStringToObject(ju, "grad_dtype", "fp32");
    /* the embedding serves the output head too: two uses per micro-batch */
    if (zs_unit_grad_uses(m->zm, u) > 1)
      cJSON_AddNumberToObject(ju, "grad_uses", zs_unit_grad_uses(m->zm, u));
    cJSON* ts = cJSON_AddArrayToObject(ju, "tensors");
    for (int t = 0; t < zs_model_tensor_count(m->zm); t++) {
      zs_tensor_desc d;
      CHECK(zs_model_tensor_desc(m->zm, t, &d));
      if (d.unit != u) continue;
      cJSON* jt = cJSON_CreateObject();
      cJSON_AddStringToObject(jt, "name", d.name);
      if (d.tied_to >= 0) {
        zs_tensor_desc o;
        CHECK(zs_model_tensor_desc(m->zm, d.tied_to, &o));
        cJSON_AddStringToObject(jt, "tied_to", o.name);
      } else {
        cJSON_AddNumberToObject(jt, "numel", (double)d.numel);
        if (d.flags & ZS_TENSOR_FROZEN) cJSON_AddBoolToObject(jt, "frozen", 1);
      }
      cJSON_AddItemToArray(ts, jt);
    }
    cJSON_AddItemToArray(units, ju);
  }
  /* 16-bit parameters: the fp32 copy of one unit's registered as "other" */
  if (m->pcopy != NULL)
    cJSON_AddNumberToObject(root, "other_bytes",
                            (double)(m->pcopy_elems * sizeof(float)));
  size_t drv = 0;
  CHECK(zs_driver_activation_bytes(m->drv, checkpoint, &drv));
  cJSON* act = cJSON_AddObjectToObject(root, "activations");
  cJSON_AddNumberToObject(act, "bytes_per_rank", (double)(drv + m->acts.bytes));
  cJSON_AddNumberToObject(act, "fixed_bytes", (double)sizeof(float));
  cJSON_AddNumberToObject(act, "sequences_per_rank", Bl);
  char* text = cJSON_Print(root);
  cJSON_Delete(root);
  errno = 0;
  const int oom = text == NULL;
  FILE* f = !oom ? fopen(path, "w") : NULL;
  int ok = f != NULL && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  if (f != NULL && fclose(f) != 0) ok = 0;
  const int e = errno;
  cJSON_free(text);
  if (!ok)
    fprintf(stderr, "train_sharded: --describe %s: cannot write it: %s\n",
            path, oom ? "out of memory" : strerror(e));
  return ok ? 0 : 1;
}

/* ==== Forward, backward, evaluation, sampling ================================ */

static float model_forward(model* m, const int* tokens, const int* targets) {
  void *in = NULL, *out = NULL;
  const size_t bytes = (size_t)m->acts.B * m->acts.T * sizeof(int);
  CHECK(zs_driver_input(m->drv, &in));
  m->ops->upload(in, tokens, bytes);
  m->targets = targets;
  if (targets != NULL && m->targets_dev != NULL) {
    m->ops->upload(m->targets_dev, targets, bytes);
    m->targets = m->targets_dev;
  }
  CHECK(zs_driver_forward(m->drv));
  CHECK(zs_driver_output(m->drv, m->cfg.layers + 1, &out));
  float loss = 0;
  m->ops->download(&loss, out, sizeof loss);
  CHECK(layer_status(m));
  return loss;
}

/* Mean loss over the fixed val sequences; each rank takes its slice of
 * every `batch` of them, in micro-batches of Bm sequences (the activation
 * buffers' size). */
static double model_eval(model* m, const gpt2_data* d, const gpt2_args* a,
                         int* tokens, int* targets, int rank, int world) {
  const int total = a->val_batches * a->batch, K = a->grad_accum;
  const int Bm = a->batch / world / K;
  double sum = 0, all = 0;
  CHECK(zs_model_set_eval(m->zm, 1)); /* not part of the training trace */
  for (int k = 0; k < a->val_batches; k++)
    for (int j = 0; j < K; j++) {
      gpt2_data_val_batch(d, k * a->batch + j * (a->batch / K) + rank * Bm, Bm,
                          total, a->seq, tokens, targets);
      sum += model_forward(m, tokens, targets);
    }
  CHECK(zs_model_set_eval(m->zm, 0));
  MPI_Allreduce(&sum, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return all / world / K / a->val_batches;
}

/* Samples `n` bytes after a newline on every rank identically (the gathers
 * are collective): the context sits in row 0 of the batch, and the logits
 * of its last position give the next byte. Returns NULL if out of memory. */
static char* model_sample(model* m, const gpt2_args* a, int n) {
  const int T = a->seq, B = m->acts.B;
  char* text = (char*)calloc((size_t)n + 1, 1);
  int* ctx = (int*)calloc((size_t)B * T, sizeof(int));
  float* probs = (float*)malloc(GPT2_VOCAB * sizeof(float));
  float* logits = (float*)malloc(GPT2_VOCAB * sizeof(float));
  if (!text || !ctx || !probs || !logits) {
    free(logits);
    free(text);
    free(ctx);
    free(probs);
    return NULL;
  }
  int len = 1;
  ctx[0] = '\n';
  CHECK(zs_model_set_eval(m->zm, 1));
  for (int k = 0; k < n; k++) {
    model_forward(m, ctx, NULL);
    m->ops->download(logits, m->acts.logits + (size_t)(len - 1) * GPT2_VOCAB,
                     GPT2_VOCAB * sizeof(float));
    CHECK(layer_status(m));
    gpt2_softmax(logits, probs, GPT2_VOCAB);
    int b = gpt2_sample_byte(probs, GPT2_VOCAB, a->seed, k);
    text[k] = (char)b;
    if (len == T) memmove(ctx, ctx + 1, (size_t)(len - 1) * sizeof(int));
    else len++;
    ctx[len - 1] = b;
  }
  CHECK(zs_model_set_eval(m->zm, 0));
  free(ctx);
  free(probs);
  free(logits);
  return text;
}

/* ==== Main ================================================================= */

/* Frees the model (and its context), the GPU's layers, the data and the
 * token buffers, and finalizes MPI: the end of a run that stops before
 * training. */
static void run_end(model* m, const gpt2_args* a, gpt2_data* data,
                    int* tokens, int* targets) {
  model_free(m);
  if (a->device) gpt2_cuda_shutdown();
  gpt2_data_free(data);
  free(tokens);
  free(targets);
  MPI_Finalize();
}

/* Every rank checks its own flags and data; the lowest failing rank's
 * message is printed once and every rank exits. Then the flags must be the
 * same everywhere: ranks started differently would issue different
 * collectives. */
static int agree(int failed, const char* err, int rank, int world) {
  int mine = failed ? world - rank : 0, worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst != 0 && rank == world - worst) {
    if (world > 1) fprintf(stderr, "train_sharded: [rank %d] %s\n", rank, err);
    else fprintf(stderr, "train_sharded: %s\n", err);
  }
  return worst != 0;
}

static int same_flags(int argc, char** argv) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 1; i < argc; i++)
    for (const char* p = argv[i]; ; p++) {
      h = (h ^ (unsigned char)*p) * 1099511628211ull;
      if (*p == '\0') break;
    }
  uint64_t v[2] = {h, ~h}, r[2];
  MPI_Allreduce(v, r, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return r[0] == ~r[1];
}

/* ZeroShard's configuration for the flags (already parsed). */
static zs_config sharded_config(const gpt2_args* a) {
  zs_config z = ZS_CONFIG_INIT;
  z.stage = a->stage;
  z.optimizer.lr = a->lr;
  z.optimizer.weight_decay = a->weight_decay;
  z.prefetch_depth = a->prefetch_depth;
  z.bucket_elements = (size_t)a->bucket_elements;
  z.progress_thread = a->progress_thread;
  if (a->collective_timeout >= 0) z.collective_timeout_s = a->collective_timeout;
  if (a->heartbeat_timeout >= 0) z.heartbeat_timeout_s = a->heartbeat_timeout;
  if (a->host_collectives >= 0)
    z.host_collectives = (zs_host_collectives)a->host_collectives;
  if (a->shard_group_size != 0)
    z.shard_group_size = a->shard_group_size < 0 ? ZS_SHARD_GROUP_NODE
                                                 : a->shard_group_size;
  z.grad_accum_steps = a->grad_accum;
  z.grad_accum_local = a->grad_accum_local;
  z.clip_grad_norm = a->clip > 0;
  if (a->clip > 0) z.max_grad_norm = a->clip;
  /* 16-bit parameters: fp32 gradients (the model code writes fp32) and
   * fp32 master weights; fp16 needs loss scaling, bf16 does not. */
  z.reduce_dtype = ZS_FLOAT32;
  if (a->dtype == ZS_FLOAT16) z.loss_scaler.mode = ZS_LOSS_SCALE_DYNAMIC;
  z.offload_optimizer.device = (zs_offload_device)a->offload; /* 0, 1, 2 */
  z.nvme.path = a->nvme_path;
  z.nvme.sub_group_size = (size_t)a->nvme_sub_group;
  z.offload_param = (zs_offload_device)a->offload_param;
  z.nvme.param_buffer_count = (size_t)a->nvme_param_buffers;
  if (a->device) z.device = ZS_DEVICE_CUDA;
  return z;
}

/* Adds the bytes of this rank's collectives from sequence *from on to
 * bytes[group] (0 world, 1 shard, 2 replica: zs_comm_record.group; bytes
 * NULL: skips them) and moves *from past them. The log keeps the last
 * 8192: a step issues far fewer. */
static void comm_group_bytes(zs_context* ctx, uint64_t* from, double bytes[3]) {
  const size_t n = zs_comm_log_get(ctx, NULL, 0);
  zs_comm_record* recs = n > 0 ? (zs_comm_record*)calloc(n, sizeof *recs) : NULL;
  if (recs == NULL) return;
  recs[0].struct_size = sizeof *recs;
  const size_t got = zs_comm_log_get(ctx, recs, n);
  for (size_t i = 0; i < got; i++) {
    if (recs[i].seq < *from) continue;
    const int g = strcmp(recs[i].group, "shard") == 0     ? 1
                  : strcmp(recs[i].group, "replica") == 0 ? 2
                                                          : 0;
    if (bytes != NULL) bytes[g] += (double)recs[i].bytes;
    *from = recs[i].seq + 1;
  }
  free(recs);
}

/* The configuration checked before any rank starts: the flags' own checks
 * name the flags; this catches what only the library knows, in its terms.
 * Returns 0, or -1 with the message in err. */
static int sharded_config_check(const zs_config* z, char* err, size_t cap) {
  if (zs_config_validate(z) == ZS_OK) return 0;
  snprintf(err, cap, "the flags give an invalid ZeroShard configuration: %s",
           zs_last_error());
  return -1;
}

/* The trainer's state saved in a checkpoint's extras (got bytes) against
 * the flags: this trainer wrote it, with the settings the data order and
 * the model depend on, and short of --steps. Returns 0, or -1 with the
 * message in err. */
static int train_state_check(const gpt2_args* a, const train_state* ts,
                             size_t got, char* err, size_t cap) {
  if (got != sizeof *ts || memcmp(ts->magic, kStateMagic, sizeof ts->magic) != 0 ||
      ts->next_step < 0) {
    snprintf(err, cap, "--resume %s: the checkpoint was not written by this "
             "trainer (its extras are %zu bytes)", a->resume, got);
    return -1;
  }
  if (ts->seed != a->seed || ts->batch != a->batch || ts->seq != a->seq ||
      ts->heads != a->heads) {
    snprintf(err, cap, "--resume %s: the checkpoint was trained with --seed "
             "%llu --batch %d --seq %d --heads %d; pass the same values (they "
             "fix the data order and the model)", a->resume,
             (unsigned long long)ts->seed, ts->batch, ts->seq, ts->heads);
    return -1;
  }
  if (ts->next_step >= a->steps) {
    snprintf(err, cap, "--resume %s: the checkpoint is at step %lld; --steps "
             "%d leaves nothing to train (--steps is the total to reach)",
             a->resume, (long long)ts->next_step, a->steps);
    return -1;
  }
  return 0;
}

/* The checkpoint's tensors (ct, n of them) against the ones the flags'
 * model registers (add_unit's names and shapes, in its order). Returns 0,
 * or -1 with the message in err. */
static int resume_tensors_check(const gpt2_args* a, const gpt2_config* cfg,
                                const zs_checkpoint_tensor* ct, int n,
                                char* err, size_t cap) {
  const int ln_units = a->persistence_threshold >= 0;
  const int want = model_tensor_count(cfg, ln_units);
  if (n != want) {
    snprintf(err, cap, "--resume %s: the checkpoint has %d tensors, the "
             "model of these flags %d (--layers %d%s): pass the --layers "
             "(and --persistence-threshold, or none) it was trained with",
             a->resume, n, want, cfg->layers,
             ln_units ? ", LayerNorms in units of their own" : "");
    return -1;
  }
  for (int k = 0; k < n; k++) {
    int which, i, ndim, decay, tie;
    long long s[2];
    char name[64];
    (void)tensor_plan(cfg, ln_units, k, &which, &i, name, &ndim, s, &decay,
                      &tie);
    const zs_checkpoint_tensor* t = &ct[k];
    const int same = strcmp(t->name, name) == 0 && t->ndim == ndim &&
                     t->shape[0] == s[0] && (ndim < 2 || t->shape[1] == s[1]) &&
                     t->tied_to == tie;
    if (!same) {
      char there[64], here[64];
      snprintf(there, sizeof there, t->ndim == 2 ? "[%lld, %lld]" : "[%lld]",
               (long long)t->shape[0], (long long)(t->ndim == 2 ? t->shape[1] : 0));
      snprintf(here, sizeof here, ndim == 2 ? "[%lld, %lld]" : "[%lld]", s[0],
               ndim == 2 ? s[1] : 0);
      snprintf(err, cap, "--resume %s: the checkpoint is of another model: "
               "tensor %d is '%s' %s there, '%s' %s here (pass the --layers, "
               "--channels and --seq it was trained with)",
               a->resume, k, t->name, there, name, here);
      return -1;
    }
  }
  return 0;
}

/* --resume PATH: the checkpoint is there, its state passes
 * train_state_check and its tensors are this model's. Read without a model
 * or MPI (zs_checkpoint_read_extras, zs_checkpoint_read_tensors), so a
 * wrong path or flag fails before the ranks start; zs_checkpoint_load
 * checks the tensors again later. Returns 0, or -1 with the message in
 * err. */
static int resume_check(const gpt2_args* a, const gpt2_config* cfg, char* err,
                        size_t cap) {
  if (a->resume == NULL) return 0;
  train_state ts;
  size_t got = 0;
  memset(&ts, 0, sizeof ts);
  zs_status st = zs_checkpoint_read_extras(a->resume, &ts, sizeof ts, &got);
  if (st != ZS_OK && !(st == ZS_ERR_INVALID_ARGUMENT && got > sizeof ts)) {
    snprintf(err, cap, "--resume %s: %s", a->resume, zs_last_error());
    return -1;
  }
  if (train_state_check(a, &ts, got, err, cap) != 0) return -1;
  /* room for this model's tensors: a checkpoint with more is another
   * model (read_tensors says how many, copying nothing) */
  const int want = model_tensor_count(cfg, a->persistence_threshold >= 0);
  zs_checkpoint_tensor* ct = (zs_checkpoint_tensor*)calloc((size_t)want, sizeof *ct);
  if (ct == NULL) {
    snprintf(err, cap, "--resume %s: out of memory", a->resume);
    return -1;
  }
  int n = 0, rc = 0;
  st = zs_checkpoint_read_tensors(a->resume, ct, want, &n);
  if (st != ZS_OK && !(st == ZS_ERR_INVALID_ARGUMENT && n > want)) {
    snprintf(err, cap, "--resume %s: %s", a->resume, zs_last_error());
    rc = -1;
  } else {
    rc = resume_tensors_check(a, cfg, ct, n, err, cap);
  }
  free(ct);
  return rc;
}

/* --save ROOT: what zs_checkpoint_save needs of the root (creating
 * nothing: the first save makes it), and, for a run that does not resume,
 * that the root holds no checkpoints of an earlier run (a `latest`): the
 * new run would replace them one by one and move `latest` back. Returns 0,
 * or -1 with the message in err. */
static int save_check(const gpt2_args* a, char* err, size_t cap) {
  if (a->save == NULL) return 0;
  if (zs_checkpoint_check_root(a->save) != ZS_OK) {
    /* (a path too long is cut here, so the reason still fits) */
    snprintf(err, cap, "--save %.200s%s: %s", a->save,
             strlen(a->save) > 200 ? "..." : "", zs_last_error());
    return -1;
  }
  char latest[4200];
  struct stat sb;
  snprintf(latest, sizeof latest, "%s/latest", a->save);
  if (a->resume == NULL && stat(latest, &sb) == 0) {
    snprintf(err, cap, "--save %s already holds the checkpoints of an earlier "
             "run (it has a 'latest'): pass --resume %s to continue that run, "
             "or give another --save directory (a new run would replace "
             "those checkpoints and move 'latest' back)", a->save, a->save);
    return -1;
  }
  return 0;
}

/* What a rank checks before training (after the flags parsed): the batch's
 * split over `world` ranks, the model's shape, ZeroShard's configuration,
 * the GPU, the report, description and checkpoint paths (rank 0), the
 * checkpoint to resume, the NVMe directory, and the data, loaded into
 * *data. Returns 0, or -1 with the message in err. */
static int precheck(const gpt2_args* a, const gpt2_config* cfg,
                    const zs_config* z, int world, int rank, gpt2_data* data,
                    char* err, size_t cap) {
  if (a->batch % (world * a->grad_accum) != 0) {
    snprintf(err, cap, "--batch %d is not divisible by the %d ranks x %d "
             "micro-batches (each rank takes batch/(ranks*grad-accum) "
             "sequences per micro-batch: pass a --batch divisible by %d%s)",
             a->batch, world, a->grad_accum, world * a->grad_accum,
             a->resume != NULL ? "; a resumed run keeps its checkpoint's "
             "--batch, so resume on a number of ranks x micro-batches that "
             "divides it" : "");
    return -1;
  }
  if (a->shard_group_size > 0 && world % a->shard_group_size != 0) {
    snprintf(err, cap, "--shard-group-size %d does not divide the %d ranks "
             "(shard groups are of equal size)", a->shard_group_size, world);
    return -1;
  }
  return gpt2_config_check(cfg, err, cap) != 0 ||
                 sharded_config_check(z, err, cap) != 0 ||
                 (a->device && gpt2_cuda_available(err, cap) != 0) ||
                 (rank == 0 && gpt2_report_check(a->report, a->data, err, cap) != 0) ||
                 (rank == 0 && save_check(a, err, cap) != 0) ||
                 (rank == 0 && gpt2_output_check("--describe", a->describe,
                                                 a->data, err, cap) != 0) ||
                 resume_check(a, cfg, err, cap) != 0 ||
                 gpt2_nvme_path_check(a->nvme_path, err, cap) != 0 ||
                 gpt2_data_load(a->data, a->seq, data, err, cap) != 0
             ? -1
             : 0;
}

/* --check-ranks W: rank 0's checks of a W-rank run, in this one process
 * without MPI (tools/zs demo runs it before mpirun, so a bad flag gets its
 * message alone, not mpirun's report of failed ranks). Exit status 0, or
 * 2 with the message. */
static int check_only(int argc, char** argv) {
  gpt2_args args;
  char err[1024] = "";
  const int rc = gpt2_args_parse(argc, argv, 1, &args, err, sizeof err, 1);
  if (rc == 1) return 0;
  gpt2_config cfg = gpt2_args_model(&args);
  const zs_config zcfg = sharded_config(&args);
  gpt2_data data;
  memset(&data, 0, sizeof data);
  const int bad = rc < 0 || precheck(&args, &cfg, &zcfg, args.check_ranks, 0,
                                     &data, err, sizeof err) != 0;
  gpt2_data_free(&data);
  if (bad) fprintf(stderr, "train_sharded: %s\n", err);
  return bad ? 2 : 0;
}

/* --kernel-times: rank 0's GPU time per kernel kind over `steps` steps of
 * train_s seconds, into the report and (unless quiet) a table, longest
 * first. */
static void report_kernel_times(gpt2_report* report, int steps, double train_s,
                                int quiet) {
  gpt2_kernel_time rows[64];
  int n = gpt2_cuda_kernel_times(rows, 64);
  if (n > 64) n = 64;
  const char* names[64];
  long calls[64];
  double secs[64];
  for (int i = 0; i < n; i++) {
    names[i] = rows[i].name;
    calls[i] = rows[i].calls;
    secs[i] = rows[i].seconds;
  }
  gpt2_report_kernel_times(report, steps, train_s, n, names, calls, secs);
  if (quiet) return;
  /* longest first (insertion sort of at most 64 rows) */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && rows[j].seconds > rows[j - 1].seconds; j--) {
      gpt2_kernel_time t = rows[j];
      rows[j] = rows[j - 1];
      rows[j - 1] = t;
    }
  double sum = 0;
  for (int i = 0; i < n; i++) sum += rows[i].seconds;
  printf("GPU time per kernel, %d step%s of %.3f s (rank 0):\n", steps,
         steps == 1 ? "" : "s", train_s);
  printf("  %-36s %8s %10s %7s\n", "kernel", "calls", "ms/step", "share");
  for (int i = 0; i < n; i++)
    printf("  %-36s %8ld %10.3f %6.1f%%\n", rows[i].name, rows[i].calls,
           steps > 0 ? 1e3 * rows[i].seconds / steps : 0,
           train_s > 0 ? 100 * rows[i].seconds / train_s : 0);
  printf("  %-36s %8s %10.3f %6.1f%%\n", "(all kernels)", "",
         steps > 0 ? 1e3 * sum / steps : 0, train_s > 0 ? 100 * sum / train_s : 0);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--check-ranks") == 0) return check_only(argc, argv);
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  /* Open MPI reports some collective failures on MPI_COMM_WORLD: returned,
   * they reach ZeroShard's error messages instead of ending the job */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  gpt2_args args;
  char err[1024] = "";
  int rc = gpt2_args_parse(argc, argv, 1, &args, err, sizeof err, rank == 0);
  gpt2_config cfg = gpt2_args_model(&args);
  gpt2_data data;
  memset(&data, 0, sizeof data);
  const zs_config zcfg = sharded_config(&args);
  const int failed =
      rc < 0 || (rc == 0 && precheck(&args, &cfg, &zcfg, world, rank, &data,
                                     err, sizeof err) != 0);
  if (agree(failed, err, rank, world) || rc == 1) {
    gpt2_data_free(&data);
    MPI_Finalize();
    return rc == 1 ? 0 : 2;
  }
  if (!same_flags(argc, argv)) {
    if (rank == 0)
      fprintf(stderr, "train_sharded: the ranks were started with different "
              "flags; every rank must run the same command\n");
    MPI_Finalize();
    return 2;
  }
  model m;
  memset(&m, 0, sizeof m);
  m.dtype = (zs_dtype)args.dtype;
  /* on the GPU: one per rank, chosen by the context (by local rank) */
  m.ops = args.device ? &gpt2_cuda_ops : &gpt2_cpu_ops;
  CHECK(zs_context_create_mpi(&zcfg, MPI_COMM_WORLD, &m.ctx));
  args.host_collectives_used =
      zs_context_config(m.ctx)->host_collectives == ZS_HOST_COLLECTIVES_SHM
          ? "shm" : "mpi";
  g_ctx = m.ctx;
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  if (args.device &&
      agree(gpt2_cuda_init(err, sizeof err) != 0 ||
                (args.tf32 && gpt2_cuda_set_tf32(1, err, sizeof err) != 0),
            err, rank, world)) {
    gpt2_cuda_shutdown(); /* (NULL-safe after a failed init) */
    g_ctx = NULL;
    zs_context_destroy(m.ctx);
    gpt2_data_free(&data);
    MPI_Finalize();
    return 2;
  }
  /* Bl: sequences per rank per micro-batch */
  const int Bl = args.batch / world / args.grad_accum, T = args.seq;
  int* tokens = (int*)malloc((size_t)Bl * T * sizeof(int));
  int* targets = (int*)malloc((size_t)Bl * T * sizeof(int));
  if (!tokens || !targets) DIE("token buffers");
  model_build(&m, &args, Bl);
  if (args.describe != NULL) {
    int bad = rank == 0 ? model_describe(&m, args.describe, Bl,
                                         args.checkpoint_activations)
                        : 0;
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    run_end(&m, &args, &data, tokens, targets);
    return bad ? 1 : 0;
  }
  /* Resume: weights, optimizer state and step counts from the checkpoint
   * (any world size and stage); the data position and the settings the
   * data order depends on from its extras. */
  int start = 0;
  if (args.resume != NULL) {
    train_state ts;
    size_t got = 0;
    memset(&ts, 0, sizeof ts);
    /* A failure fails every rank (the load agrees first): each exits. */
    err[0] = '\0';
    if (zs_checkpoint_load(m.zm, args.resume, 0, &ts, sizeof ts, &got) != ZS_OK)
      snprintf(err, sizeof err, "--resume %s: %s", args.resume, zs_last_error());
    else
      (void)train_state_check(&args, &ts, got, err, sizeof err);
    if (err[0] != '\0') {
      if (rank == 0) fprintf(stderr, "train_sharded: %s\n", err);
      run_end(&m, &args, &data, tokens, targets);
      return 2;
    }
    start = (int)ts.next_step;
    /* The checkpoint brings back its learning rates; this trainer's rate
     * is its --lr flag, the one given now. */
    CHECK(zs_model_set_lr(m.zm, ZS_ALL_GROUPS, args.lr));
    if (rank == 0 && !args.quiet)
      printf("resumed from %s at step %d\n", args.resume, start);
  }
  const int threads = omp_get_max_threads();
  if (rank == 0 && !args.quiet) gpt2_args_print(&args, "sharded", world, threads, stdout);
  gpt2_report* report = gpt2_report_create(&args, "sharded", world, threads,
                                           gpt2_num_params(&cfg));
  double t_start = gpt2_now(), t_train = 0;
  /* --kernel-times: the steps after this run's first (its cuBLAS set-up
   * and first allocations are not the steady state), or the only one */
  const int times_from = args.steps - start > 1 ? start + 1 : start;
  double times_t0 = 0;
  /* this rank's collective bytes of the training steps, by group */
  double group_bytes[3] = {0, 0, 0};
  uint64_t log_from = 0;
  comm_group_bytes(m.ctx, &log_from, NULL); /* (set-up's: not a step's) */
  for (int step = start; step < args.steps; step++) {
    if (args.kernel_times && step == times_from) {
      gpt2_cuda_kernel_times_reset();
      times_t0 = t_train;
    }
    if (args.kernel_times && step >= times_from) gpt2_cuda_kernel_times_enable(1);
    double t0 = gpt2_now();
    /* Micro-batch k of the global batch: sequences [k*batch/K, +batch/K),
     * split across the ranks; zs_step after each, the optimizer after the
     * K-th. */
    float local = 0;
    zs_step_info info = {0}; /* struct_size 0: this header's */
    for (int k = 0; k < args.grad_accum; k++) {
      gpt2_data_train_batch(&data, args.seed, step,
                            k * (args.batch / args.grad_accum) + rank * Bl, Bl,
                            T, tokens, targets);
      local += model_forward(&m, tokens, targets);
      CHECK(zs_driver_backward(m.drv));
      CHECK(zs_step(m.zm, &info));
    }
    const double step_s = gpt2_now() - t0;
    t_train += step_s;
    comm_group_bytes(m.ctx, &log_from, group_bytes);
    if (args.kernel_times) gpt2_cuda_kernel_times_enable(0); /* not eval's */
    if (info.overflow && rank == 0 && !args.quiet)
      printf("step %d: inf/NaN gradients, skipped; loss scale now %g\n",
             step + 1, info.loss_scale);
    float loss = 0; /* the global batch's mean loss */
    MPI_Allreduce(&local, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    loss /= (float)world * (float)args.grad_accum;
    if (!isfinite(loss)) {
      if (rank == 0)
        fprintf(stderr, "train_sharded: the loss is %g at step %d: training "
                "diverged (try a lower --lr)\n", loss, step + 1);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    gpt2_report_step(report, step + 1, loss, args.lr);
    gpt2_report_step_seconds(report, step_s);
    gpt2_report_step_info(report, &info, args.dtype == ZS_FLOAT16);
    double tps = (double)(step + 1 - start) * args.batch * T / t_train;
    if (rank == 0 && !args.quiet && ((step + 1) % args.log_every == 0 || step == 0))
      gpt2_print_progress(stdout, step + 1, args.steps, loss, args.lr, tps,
                          (args.steps - step - 1) * (double)args.batch * T / tps);
    int last = step + 1 == args.steps;
    int aside = 0; /* an evaluation or a save issued collectives */
    if ((args.eval_every > 0 && (step + 1) % args.eval_every == 0) || last) {
      aside = 1;
      double val = model_eval(&m, &data, &args, tokens, targets, rank, world);
      gpt2_report_val(report, step + 1, val);
      if (rank == 0 && !args.quiet) printf("val loss %.4f at step %d\n", val, step + 1);
    }
    if (args.save != NULL &&
        (last || (args.save_every > 0 && (step + 1) % args.save_every == 0))) {
      train_state ts;
      memset(&ts, 0, sizeof ts);
      memcpy(ts.magic, kStateMagic, sizeof ts.magic);
      ts.next_step = step + 1;
      ts.seed = args.seed;
      ts.batch = args.batch;
      ts.seq = args.seq;
      ts.heads = args.heads;
      aside = 1;
      CHECK(zs_checkpoint_save(m.zm, args.save, NULL, &ts, sizeof ts));
      if (rank == 0 && !args.quiet)
        printf("saved checkpoint %s/step-%08d\n", args.save, step + 1);
    }
    /* (not the next step's bytes) */
    if (aside) comm_group_bytes(m.ctx, &log_from, NULL);
  }
  double wall = gpt2_now() - t_start;
  /* Memory of the training (before sampling), from every rank. */
  zs_memory_stats mine = {0};
  zs_memory_stats* rows = (zs_memory_stats*)calloc((size_t)world, sizeof mine);
  CHECK(zs_memory_stats_get(m.ctx, &mine));
  MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, rows, (int)sizeof mine, MPI_BYTE,
             0, MPI_COMM_WORLD);
  /* ... and NVMe offload's counters */
  zs_offload_info oi = {0};
  CHECK(zs_offload_info_get(m.ctx, &oi));
  uint64_t nv_mine[3] = {oi.nvme_file_bytes, oi.nvme_param_reads,
                         oi.nvme_param_reads_ahead};
  uint64_t* nv = (uint64_t*)calloc((size_t)world * 3, sizeof *nv);
  MPI_Gather(nv_mine, 3, MPI_UINT64_T, nv, 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  char* text = args.sample_bytes > 0 ? model_sample(&m, &args, args.sample_bytes) : NULL;
  rc = 0;
  if (rank == 0) {
    for (int r = 0; r < world; r++) gpt2_report_rank(report, r, &rows[r]);
    for (int r = 0; r < world && oi.nvme; r++) gpt2_report_nvme(report, r, nv + 3 * r);
    /* this run's steps (a resumed run starts at `start`) */
    const int ran = args.steps - start;
    gpt2_report_timing(report, ran, (double)args.batch * T, t_train, wall);
    zs_comm_counters cc = {0};
    CHECK(zs_comm_counters_get(m.ctx, &cc));
    gpt2_report_comm(report, &cc, world, ran);
    {
      const int G = zs_context_config(m.ctx)->shard_group_size;
      gpt2_report_comm_groups(report, group_bytes, ran, G, G > 0 ? world / G : 1);
    }
    if (args.kernel_times) report_kernel_times(report, args.steps - times_from,
                                               t_train - times_t0, args.quiet);
    /* What the activations would take without (with) checkpointing: the
     * measured peak with the driver's share swapped. */
    size_t with = 0, without = 0;
    CHECK(zs_driver_activation_bytes(m.drv, 1, &with));
    CHECK(zs_driver_activation_bytes(m.drv, 0, &without));
    const size_t peak = rows[0].peak[ZS_MEM_ACTIVATIONS];
    const size_t mine_drv = args.checkpoint_activations ? with : without;
    gpt2_report_activations(report, args.checkpoint_activations, peak,
                            peak - mine_drv + without);
    if (!args.quiet) {
      gpt2_print_memory_table(stdout, rows, world);
      if (text != NULL) gpt2_print_text(stdout, text, (size_t)args.sample_bytes);
      printf("wall time %.1f s\n", wall);
    }
    if (text != NULL) gpt2_report_text(report, text, (size_t)args.sample_bytes);
    if (args.report != NULL &&
        gpt2_report_write(report, args.report, err, sizeof err) != 0) {
      fprintf(stderr, "train_sharded: %s\n", err);
      rc = 1;
    }
  }
  gpt2_report_free(report);
  free(text);
  free(rows);
  free(nv);
  model_free(&m);
  if (args.device) gpt2_cuda_shutdown();
  gpt2_data_free(&data);
  free(tokens);
  free(targets);
  MPI_Finalize();
  return rc;
}
