/*
 * model.h — a GPT-2-style model in plain C (Radford et al. 2019): token and
 * position embeddings, L pre-LayerNorm blocks (causal multi-head attention
 * and a GELU MLP), a final LayerNorm, an output projection tied to the token
 * embedding, and cross-entropy. Byte-level vocabulary (V = 256).
 *
 * The model is organized in the pieces a sharded trainer wraps as units:
 *   embed     wte (V, C), wpe (maxT, C), lnf_w (C), lnf_b (C)
 *             used twice per step: the encoder at the start and the final
 *             norm + tied output projection at the end
 *   block l   12 tensors (see gpt2_block_params)
 * The plain trainer (train_plain.c) puts all of them in one flat allocation
 * with named views; the sharded trainer (train_sharded.c) gets the same views
 * from ZeroShard. Both call exactly the functions below.
 *
 * Shapes: B batch, T sequence, C channels, NH heads, V vocab, L layers;
 * every count is in ELEMENTS. Forward functions write their activations;
 * backward functions ACCUMULATE (+=) into parameter gradients and into the
 * activation gradients they produce, which the caller zeroes once per step
 * (gpt2_acts_zero_grads). Threads: the layers' OpenMP loops; results are
 * bitwise independent of the thread count.
 */
#ifndef ZS_EXAMPLES_GPT2_MODEL_H
#define ZS_EXAMPLES_GPT2_MODEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPT2_VOCAB 256 /* bytes */

typedef struct gpt2_config {
  int max_seq;  /* maxT: rows of wpe */
  int vocab;    /* V */
  int layers;   /* L */
  int heads;    /* NH, divides channels */
  int channels; /* C */
} gpt2_config;

/* ==== Parameters ========================================================== */

enum { GPT2_EMBED_TENSORS = 4, GPT2_BLOCK_TENSORS = 12 };

typedef struct gpt2_embed_params {
  float* wte;   /* (V, C)    token embedding, also the output projection */
  float* wpe;   /* (maxT, C) position embedding */
  float* lnf_w; /* (C)       final LayerNorm gain */
  float* lnf_b; /* (C)       final LayerNorm shift */
} gpt2_embed_params;

typedef struct gpt2_block_params {
  float* ln1_w;    /* (C) */
  float* ln1_b;    /* (C) */
  float* qkv_w;    /* (3C, C) */
  float* qkv_b;    /* (3C) */
  float* proj_w;   /* (C, C) */
  float* proj_b;   /* (C) */
  float* ln2_w;    /* (C) */
  float* ln2_b;    /* (C) */
  float* fc_w;     /* (4C, C) */
  float* fc_b;     /* (4C) */
  float* fcproj_w; /* (C, 4C) */
  float* fcproj_b; /* (C) */
} gpt2_block_params;

/* Name, rank (1 or 2) and shape of tensor i of the embed unit
 * (i < GPT2_EMBED_TENSORS) or of a block (i < GPT2_BLOCK_TENSORS). The name
 * of a block tensor has no layer prefix ("ln1_w"). Returns the element
 * count. `decay` is set to 1 for matrices (weight decay applies) and 0 for
 * vectors (biases and norm parameters). */
size_t gpt2_embed_tensor(const gpt2_config* c, int i, const char** name,
                         int* ndim, long long shape[2], int* decay);
size_t gpt2_block_tensor(const gpt2_config* c, int i, const char** name,
                         int* ndim, long long shape[2], int* decay);

/* Elements of the embed unit and of one block. */
size_t gpt2_embed_numel(const gpt2_config* c);
size_t gpt2_block_numel(const gpt2_config* c);
/* Elements of the whole model: embed + L blocks. */
size_t gpt2_num_params(const gpt2_config* c);

/* The addresses of a params struct's pointers in tensor order, so views can
 * be filled from anywhere (the sharded trainer fills them from ZeroShard). */
void gpt2_embed_slots(gpt2_embed_params* p, float** slots[GPT2_EMBED_TENSORS]);
void gpt2_block_slots(gpt2_block_params* p, float** slots[GPT2_BLOCK_TENSORS]);

/* Views into a flat buffer laid out as the tensors in order (the plain
 * trainer's layout: embed tensors, then block 0's, block 1's, ...). */
void gpt2_embed_views(const gpt2_config* c, float* base, gpt2_embed_params* p);
void gpt2_block_views(const gpt2_config* c, float* base, gpt2_block_params* p);

/* Deterministic GPT-2 initialization of tensor i of the embed unit or of a
 * block: N(0, 0.02) for wte and wpe and matrices, N(0, 0.02/sqrt(2L)) for the
 * residual projections (proj_w, fcproj_w), 1 for norm gains, 0 for biases.
 * The values depend only on (seed, which, i): which is -1 for embed, l for
 * block l. data: numel floats, written. */
void gpt2_init_tensor(const gpt2_config* c, unsigned long long seed, int which,
                      int i, float* data);

/* ==== Where the layers run ================================================ */

/* The layer functions and the memory operations the model code uses, so the
 * same unit structure (model.c) runs on the CPU (gpt2_cpu_ops: layers.c and
 * libc) or on a GPU (gpt2_cuda_ops in layers_cuda.h: kernels and cuBLAS).
 * Every layer entry has the signature, shapes and semantics of the layers.h
 * function of the same name; pointers are in the memory `alloc` returns
 * (host memory for the CPU, device memory for CUDA). Sizes in BYTES for
 * the memory entries, ELEMENTS elsewhere.
 *
 * Ordering: the CUDA entries are asynchronous, queued in order on one
 * stream; `sum` and `download` wait for the work before them (so reading a
 * loss is the synchronization point). The CPU entries are synchronous.
 * Errors: the layer entries return nothing; a backend records its first
 * failure (a kernel launch or cuBLAS error) and `error` reports it. */
typedef struct gpt2_layer_ops {
  const char* name; /* "cpu" or "cuda" */
  void (*encoder_forward)(float*, const int*, const float*, const float*, int,
                          int, int);
  void (*encoder_backward)(float*, float*, const float*, const int*, int, int,
                           int);
  void (*layernorm_forward)(float*, float*, float*, const float*,
                            const float*, const float*, int, int);
  void (*layernorm_backward)(float*, float*, float*, const float*,
                             const float*, const float*, const float*,
                             const float*, int, int);
  void (*matmul_forward)(float*, const float*, const float*, const float*, int,
                         int, int);
  void (*matmul_backward)(float*, float*, float*, const float*, const float*,
                          const float*, int, int, int);
  void (*attention_forward)(float*, float*, float*, const float*, int, int,
                            int, int);
  void (*attention_backward)(float*, float*, float*, const float*,
                             const float*, const float*, int, int, int, int);
  void (*gelu_forward)(float*, const float*, size_t);
  void (*gelu_backward)(float*, const float*, const float*, size_t);
  void (*residual_forward)(float*, const float*, const float*, size_t);
  void (*softmax_crossentropy_forward)(float*, float*, const float*,
                                       const int*, int, int);
  void (*softmax_crossentropy_backward)(float*, const float*, const float*,
                                        const int*, int, int);
  /* Zeroed memory of `bytes` (NULL if out of memory); free(NULL) is a no-op. */
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*zero)(void* p, size_t bytes);
  /* dst and src both the backend's memory; upload from host memory;
   * download to host memory (synchronous). */
  void (*copy)(void* dst, const void* src, size_t bytes);
  void (*upload)(void* dst, const void* host_src, size_t bytes);
  void (*download)(void* host_dst, const void* src, size_t bytes);
  /* p[i] = value for i < n. */
  void (*fill)(float* p, float value, size_t n);
  /* sum of x[0..n) in double, sequential in i (the same bits on every
   * backend for the same x); synchronous. */
  double (*sum)(const float* x, size_t n);
  /* 0 if nothing failed since the backend was set up; else -1 and the
   * first failure's message in msg (cap bytes). */
  int (*error)(char* msg, size_t cap);
} gpt2_layer_ops;

/* layers.c's functions, calloc/free and libc copies. */
extern const gpt2_layer_ops gpt2_cpu_ops;

/* ==== Activations ========================================================= */

/* Activations of one forward pass at batch B, sequence T, and their
 * gradients, as views into one allocation (gpt2_acts_alloc). Per-layer
 * arrays are indexed [l]. */
typedef struct gpt2_acts {
  int B, T;
  const gpt2_layer_ops* ops; /* where the layers run; NULL: gpt2_cpu_ops */
  float* encoded;     /* (B, T, C) */
  float** ln1;        /* [L] (B, T, C) */
  float** ln1_mean;   /* [L] (B, T) */
  float** ln1_rstd;   /* [L] (B, T) */
  float** qkv;        /* [L] (B, T, 3C) */
  float** atty;       /* [L] (B, T, C) */
  float** att;        /* [L] (B, NH, T, T) */
  float** preatt;     /* [L] (B, NH, T, T) */
  float** proj;       /* [L] (B, T, C) */
  float** res2;       /* [L] (B, T, C) */
  float** ln2;        /* [L] (B, T, C) */
  float** ln2_mean;   /* [L] (B, T) */
  float** ln2_rstd;   /* [L] (B, T) */
  float** fch;        /* [L] (B, T, 4C) */
  float** fch_gelu;   /* [L] (B, T, 4C) */
  float** fcproj;     /* [L] (B, T, C) */
  float** res3;       /* [L] (B, T, C) */
  float* lnf;         /* (B, T, C) */
  float* lnf_mean;    /* (B, T) */
  float* lnf_rstd;    /* (B, T) */
  float* logits;      /* (B, T, V) */
  float* probs;       /* (B, T, V) */
  float* losses;      /* (B, T) */
  /* Gradients of activations (one buffer per kind, reused across layers
   * where the backward allows it). */
  float* dres;        /* (B, T, C) gradient flowing down the residual */
  float* dlnf;        /* (B, T, C) */
  float* dlogits;     /* (B, T, V) */
  float* dlosses;     /* (B, T) */
  float* dln;         /* (B, T, C)  ln1/ln2 outputs */
  float* datty;       /* (B, T, C) */
  float* dqkv;        /* (B, T, 3C) */
  float* dpreatt;     /* (B, NH, T, T) scratch */
  float* datt;        /* (B, NH, T, T) scratch */
  float* dfch;        /* (B, T, 4C) */
  float* dfch_gelu;   /* (B, T, 4C) */
  float* dres2;       /* (B, T, C) gradient of res2 */
  /* The allocation. */
  float* memory;
  size_t bytes;       /* size of memory */
  float** ptrs;       /* the per-layer pointer arrays */
} gpt2_acts;

/* Allocates all activations for batch B and sequence T (T <= max_seq), one
 * allocation (the plain trainer). Returns 0, or -1 if out of memory
 * (nothing allocated). */
int gpt2_acts_alloc(const gpt2_config* c, int B, int T, gpt2_acts* a);
/* Allocates only the pointer tables and the backward's gradient buffers
 * (gpt2_grads_bytes); the forward activations are bound to memory owned by
 * someone else (a driver) with the gpt2_acts_bind_* functions. */
int gpt2_acts_alloc_grads(const gpt2_config* c, int B, int T, gpt2_acts* a);
/* The same with the gradient buffers in `ops`'s memory (ops->alloc); the
 * model functions then run on ops. */
int gpt2_acts_alloc_grads_on(const gpt2_config* c, int B, int T,
                             const gpt2_layer_ops* ops, gpt2_acts* a);
void gpt2_acts_free(gpt2_acts* a);
/* Bytes gpt2_acts_alloc would allocate for the activation memory. */
size_t gpt2_acts_bytes(const gpt2_config* c, int B, int T);

/* The pieces, for memory owned elsewhere, in bytes: a block's internal
 * activations (everything but its output), the head's (final norm, logits,
 * probabilities, losses), and the backward's gradient buffers. */
size_t gpt2_block_scratch_bytes(const gpt2_config* c, int B, int T);
size_t gpt2_head_scratch_bytes(const gpt2_config* c, int B, int T);
size_t gpt2_grads_bytes(const gpt2_config* c, int B, int T);
/* Points block l's activations into scratch (gpt2_block_scratch_bytes),
 * its input (the residual stream it reads: encoded or res3[l-1]) at in and
 * its output res3[l] at out. */
void gpt2_acts_bind_block(const gpt2_config* c, gpt2_acts* a, int l,
                          void* scratch, const float* in, float* out);
/* Points the head's activations into scratch (gpt2_head_scratch_bytes) and
 * its input (res3[L-1], or encoded with no layers) at in. */
void gpt2_acts_bind_head(const gpt2_config* c, gpt2_acts* a, void* scratch,
                         const float* in);

/* ==== Forward and backward, unit by unit =================================== */

/* encoded = wte[tokens] + wpe[t]. tokens (B, T). */
void gpt2_embed_forward(const gpt2_config* c, const gpt2_embed_params* p,
                        const int* tokens, gpt2_acts* a);
/* Block l: residual stream in = (l == 0 ? encoded : res3[l-1]), out res3[l]. */
void gpt2_block_forward(const gpt2_config* c, const gpt2_block_params* p,
                        int l, gpt2_acts* a);
/* Final norm, logits = lnf . wte^T, probabilities and per-position losses
 * (if targets is not NULL). Returns the mean loss over the B*T positions
 * (0 without targets). */
float gpt2_head_forward(const gpt2_config* c, const gpt2_embed_params* p,
                        const int* targets, gpt2_acts* a);

/* Zeroes the activation gradients; call once before a backward pass. */
void gpt2_acts_zero_grads(const gpt2_config* c, gpt2_acts* a);
/* Backward of the head for loss = loss_scale * mean over positions (pass
 * loss_scale = 1 for the mean over this batch). Accumulates dwte (the tied
 * projection), dlnf_w, dlnf_b, and writes dres (the gradient of res3[L-1]). */
void gpt2_head_backward(const gpt2_config* c, const gpt2_embed_params* p,
                        gpt2_embed_params* g, const int* targets,
                        float loss_scale, gpt2_acts* a);
/* Backward of block l: consumes dres (gradient of its output), accumulates
 * the block's parameter gradients, leaves in dres the gradient of its input. */
void gpt2_block_backward(const gpt2_config* c, const gpt2_block_params* p,
                         gpt2_block_params* g, int l, gpt2_acts* a);
/* Backward of the encoder: accumulates dwte and dwpe from dres. */
void gpt2_embed_backward(const gpt2_config* c, gpt2_embed_params* g,
                         const int* tokens, gpt2_acts* a);

/* Checks a configuration; on error writes a message naming the setting into
 * err (cap bytes) and returns -1. */
int gpt2_config_check(const gpt2_config* c, char* err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* ZS_EXAMPLES_GPT2_MODEL_H */
