/*
 * layers.h: forward and backward passes of every layer of a GPT-2-style
 * transformer, in plain fp32 C11 for the CPU.
 *
 * Used by the single-process GPT-2 trainer, the sharded trainer and the parity
 * tests (tests/examples/gpt2_layers_test.cc). The model is the one of Radford
 * et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2):
 * pre-LayerNorm transformer blocks (Vaswani et al. 2017) with a tanh-GELU MLP.
 *
 * ---------------------------------------------------------------------------
 * Conventions shared by every function below
 * ---------------------------------------------------------------------------
 * Shapes. B batch, T sequence length, C channels, NH attention heads,
 *   V vocabulary size, OC output channels, N = B*T rows. Tensors are dense,
 *   row-major, contiguous fp32; a shape (B, T, C) means element (b, t, c) is at
 *   offset (b*T + t)*C + c. Every size and count is in ELEMENTS, never bytes.
 *
 * Ownership. The caller owns every buffer. No function allocates, frees, keeps
 *   a pointer after it returns, or touches global state. Buffers must not
 *   overlap unless a function says so.
 *
 * Written vs accumulated. Forward outputs are WRITTEN (previous contents
 *   ignored). Gradients named d<x> are ACCUMULATED (+=) so that several users
 *   of a tensor, or several micro-batches, can add into one buffer: zero them
 *   before the first backward of a step. Unless a function says otherwise,
 *   each gradient element is updated exactly once per call,
 *       g = g + s,
 *   where s is this call's contribution, summed from 0 in the fixed order the
 *   function documents. Calling a backward twice into a zeroed buffer
 *   therefore gives exactly 2*s. (The one exception is dwte in
 *   gpt2_encoder_backward; see there.)
 *
 * Threads and determinism. Each function runs OpenMP `parallel for` loops on
 *   the calling thread's team (omp_set_num_threads / OMP_NUM_THREADS) and
 *   returns when all work is done (blocking). Loops are split over
 *   independent output elements only; every sum is done by one thread, in a
 *   fixed sequential order. There are no reductions, atomics or per-thread
 *   partial sums. Results are therefore BITWISE IDENTICAL for any number of
 *   threads (build with -ffp-contract=off so the compiler fuses no
 *   multiply-adds). Functions are reentrant: concurrent calls are safe if
 *   their written buffers do not overlap.
 *
 * Errors. These are hot-path kernels: they validate nothing and return
 *   nothing. Preconditions (non-NULL pointers unless stated, positive sizes,
 *   token and target ids in [0, V), t < maxT, C divisible by NH) are the
 *   caller's; breaking one is undefined behaviour.
 */
#ifndef ZS_EXAMPLES_GPT2_LAYERS_H
#define ZS_EXAMPLES_GPT2_LAYERS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LayerNorm epsilon added to the variance (GPT-2 and PyTorch default). */
#define GPT2_LAYERNORM_EPS 1e-5f

/* ------------------------------------------------------------------------- */
/* Encoder: token embedding + position embedding                             */
/* ------------------------------------------------------------------------- */

/*
 * out(B, T, C) = wte[tokens[b, t], :] + wpe[t, :]
 *
 * out     (B, T, C)  written.
 * tokens  (B, T)     token ids, each in [0, V).
 * wte     (V, C)     token embedding table.
 * wpe     (maxT, C)  position embedding table, T <= maxT.
 * Threads: parallel over the B*T rows.
 * Source: learned token + position embeddings, Radford et al. 2018/2019.
 */
void gpt2_encoder_forward(float *out, const int *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);

/*
 * Backward of gpt2_encoder_forward.
 *
 * dwte    (V, C)     ACCUMULATED. Row tokens[b, t] receives dout[b, t, :].
 *                    Exception to the g = g + s rule: for each element, the
 *                    contributions of all positions holding that token are
 *                    added into dwte one by one, in ascending position order
 *                    (b*T + t): g = ((g + d_first) + d_next) + ...
 *                    This is still deterministic and thread-count independent,
 *                    but calling twice into a zeroed buffer gives 2*s only up
 *                    to fp32 rounding when a token repeats. (Summing first
 *                    would need per-token scratch of N ints.)
 * dwpe    (maxT, C)  ACCUMULATED, rows 0..T-1 only: dwpe[t, c] += s with
 *                    s = sum over b = 0..B-1 (ascending) of dout[b, t, c].
 * dout    (B, T, C)  upstream gradient.
 * tokens  (B, T)     the ids given to the forward.
 * Threads: dwte parallel over column blocks of C, dwpe parallel over (t, c).
 */
void gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout,
                           const int *tokens, int B, int T, int C);

/* ------------------------------------------------------------------------- */
/* LayerNorm                                                                 */
/* ------------------------------------------------------------------------- */

/*
 * Per row n: mean = sum(x)/C, var = sum((x - mean)^2)/C (biased, two-pass),
 * rstd = 1/sqrt(var + GPT2_LAYERNORM_EPS),
 * out[n, c] = (x[n, c] - mean) * rstd * weight[c] + bias[c].
 *
 * out     (N, C)  written.
 * mean    (N)     written; saved for the backward.
 * rstd    (N)     written; saved for the backward.
 * inp     (N, C)  input rows x.
 * weight  (C)     gain;  bias (C) shift.
 * Threads: parallel over rows; each row's sums are sequential in c.
 * Source: Ba, Kiros & Hinton 2016, "Layer Normalization", eq. (4).
 */
void gpt2_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *inp, const float *weight,
                            const float *bias, int N, int C);

/*
 * Backward of gpt2_layernorm_forward. With xhat = (x - mean)*rstd and
 * g = weight * dout (per row):
 *   dinp[n, c]  += rstd * (g[c] - mean_c(g) - xhat[c] * mean_c(g * xhat))
 *   dweight[c]  += sum over n of dout[n, c] * xhat[n, c]
 *   dbias[c]    += sum over n of dout[n, c]
 *   (each sum over n in chunks of GPT2_SUM_CHUNK_ROWS rows, layers_math.h:
 *   every chunk's sum in ascending n, then the chunks' in ascending order)
 *
 * dinp (N, C), dweight (C), dbias (C): ACCUMULATED.
 * dout (N, C) upstream gradient; inp, weight as given to the forward;
 * mean, rstd (N) as written by the forward.
 * Threads: dinp parallel over rows; dweight/dbias parallel over channels.
 * Source: the derivative of Ba et al. 2016 eq. (4) by the chain rule.
 */
void gpt2_layernorm_backward(float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp,
                             const float *weight, const float *mean,
                             const float *rstd, int N, int C);

/* ------------------------------------------------------------------------- */
/* Matmul (fully connected layer)                                            */
/* ------------------------------------------------------------------------- */

/*
 * out(N, OC) = inp(N, C) . weight(OC, C)^T + bias(OC)
 * out[n, o] = s + bias[o], s = sum over c (ascending) of inp[n, c]*weight[o, c].
 *
 * Order of summation, exactly (the same bits as the plain triple loop):
 *   s = 0; for c = 0, 1, ..., C-1: s = s + inp[n, c]*weight[o, c], the
 *   product and the sum each rounded to fp32 (no fused multiply-add);
 *   then out[n, o] = s + bias[o], or s when bias is NULL (nothing added).
 * Each out[n, o] is one such sum by one thread. The kernels exist in three
 * copies, AVX-512F, AVX2 and the x86-64 baseline SSE2, picked at run time by
 * the CPU; a vector's lanes hold different o, never parts of one sum, so all
 * copies give identical bits (tests/examples/gpt2_layers_test.cc,
 * ExactOrder*, compares each copy with a scalar emulation of this order).
 *
 * out     (N, OC)  written.
 * inp     (N, C).
 * weight  (OC, C)  PyTorch nn.Linear layout (one row per output channel).
 * bias    (OC)     may be NULL (no bias).
 * Any N, C, OC >= 1 (no multiple of the vector width needed).
 * Threads: parallel over tiles of 64 rows x 32 output channels. Memory: no
 * allocation; 16 KiB of stack per thread (a transposed weight tile).
 * Speed: register-blocked (4 rows x 32 outputs); tools/bench:matmul_bench.
 */
void gpt2_matmul_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC);

/*
 * Backward of gpt2_matmul_forward.
 *   dinp[n, c]    += sum over o (ascending) of dout[n, o] * weight[o, c]
 *   dweight[o, c] += sum over n (ascending) of dout[n, o] * inp[n, c]
 *   dbias[o]      += sum over n of dout[n, o] (in chunks of
 *                    GPT2_SUM_CHUNK_ROWS rows, as LayerNorm's)
 *
 * Order of summation, exactly (the same bits as the plain loops): each sum
 * starts at s = 0 and adds s = s + (product) for the index ascending, the
 * product and the sum each rounded to fp32 (no fused multiply-add); then the
 * gradient element is updated once, g = g + s. As for the forward, the three
 * copies of the kernels (AVX-512F, AVX2, SSE2) give identical bits, and each
 * element is summed by one thread.
 *
 * dinp     (N, C)   ACCUMULATED; may be NULL when the input needs no gradient
 *                   (e.g. the data fed to an MLP).
 * dweight  (OC, C)  ACCUMULATED.
 * dbias    (OC)     ACCUMULATED; may be NULL (layer without bias).
 * dout (N, OC) upstream gradient; inp, weight as given to the forward.
 * Any N, C, OC >= 1.
 * Threads: one parallel loop over tiles: dinp in tiles of 64 rows x 32
 * channels c, dweight in tiles of 16 channels o x 32 channels c (the tiles
 * at c = 0 also do dbias). Memory: no allocation.
 */
void gpt2_matmul_backward(float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC);

/* ------------------------------------------------------------------------- */
/* Causal multi-head self-attention                                          */
/* ------------------------------------------------------------------------- */

/*
 * Scaled dot-product attention with a causal mask, NH heads of size
 * hs = C/NH. For batch b, head h, query position t and key position t2 <= t:
 *   preatt[b, h, t, t2] = (q_t . k_t2) / sqrt(hs)
 *   att[b, h, t, :]     = softmax over t2 in 0..t of preatt[b, h, t, :]
 *   out[b, t, h*hs + i] = sum over t2 = 0..t (ascending) of att * v_t2[i]
 * Masked entries (t2 > t) of preatt and att are written as 0, so both
 * buffers are fully defined after the call.
 *
 * out     (B, T, C)        written.
 * preatt  (B, NH, T, T)    written; pre-softmax scores (kept for inspection).
 * att     (B, NH, T, T)    written; attention weights, needed by the backward.
 * inp     (B, T, 3C)       qkv: channels [0, C) are q, [C, 2C) k, [2C, 3C) v;
 *                          head h uses channels h*hs .. h*hs + hs - 1 of each.
 * C must be divisible by NH.
 * Threads: parallel over (b, t, h).
 * Source: Vaswani et al. 2017, "Attention Is All You Need", sec. 3.2.1-3.2.2;
 * the causal mask of the decoder (sec. 3.2.3) as used by GPT-2.
 */
void gpt2_attention_forward(float *out, float *preatt, float *att,
                            const float *inp, int B, int T, int C, int NH);

/*
 * Backward of gpt2_attention_forward.
 *
 * dinp     (B, T, 3C)     ACCUMULATED (dq, dk, dv in the qkv layout):
 *   dq_t[i]  += scale * (sum over t2 = 0..t   of dpreatt[t, t2] * k_t2[i])
 *   dk_t2[i] += scale * (sum over t  = t2..T-1 of dpreatt[t, t2] * q_t[i])
 *   dv_t2[i] += sum over t = t2..T-1 of att[t, t2] * dout_t[i]
 *   with scale = 1/sqrt(hs) and every sum ascending.
 * dpreatt  (B, NH, T, T)  scratch, fully OVERWRITTEN (input contents
 *                          ignored; masked entries set to 0). On return it
 *                          holds dL/dpreatt.
 * datt     (B, NH, T, T)  scratch, fully OVERWRITTEN the same way. On return
 *                          it holds dL/datt.
 * dout     (B, T, C)      upstream gradient.
 * inp      (B, T, 3C)     qkv as given to the forward.
 * att      (B, NH, T, T)  as written by the forward.
 * Threads: two passes, each parallel over (b, t, h) (the second writes the
 * disjoint dq, dk, dv slices of position t, head h).
 * Source: chain rule through Vaswani et al. 2017 sec. 3.2.1; softmax
 * backward d_preatt = att * (datt - sum(att * datt)).
 */
void gpt2_attention_backward(float *dinp, float *dpreatt, float *datt,
                             const float *dout, const float *inp,
                             const float *att, int B, int T, int C, int NH);

/* ------------------------------------------------------------------------- */
/* GELU (tanh approximation)                                                 */
/* ------------------------------------------------------------------------- */

/*
 * out[i] = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x = inp[i].
 *
 * out (n) written; inp (n). out may equal inp (in place). n in elements.
 * Threads: parallel over elements.
 * Source: Hendrycks & Gimpel 2016, "Gaussian Error Linear Units (GELUs)",
 * sec. 2, the tanh approximation used by GPT-2.
 */
void gpt2_gelu_forward(float *out, const float *inp, size_t n);

/*
 * Backward of gpt2_gelu_forward: dinp[i] += gelu'(inp[i]) * dout[i].
 *
 * dinp (n) ACCUMULATED; inp (n) the forward's input; dout (n) upstream
 * gradient. n in elements. Threads: parallel over elements.
 */
void gpt2_gelu_backward(float *dinp, const float *inp, const float *dout,
                        size_t n);

/* ------------------------------------------------------------------------- */
/* Residual connection                                                       */
/* ------------------------------------------------------------------------- */

/*
 * out[i] = a[i] + b[i]. out (n) written; may equal a or b. n in elements.
 * Threads: parallel over elements.
 * Source: He et al. 2016 residual connections, as placed by GPT-2.
 */
void gpt2_residual_forward(float *out, const float *a, const float *b,
                           size_t n);

/*
 * Backward of gpt2_residual_forward: da[i] += dout[i]; db[i] += dout[i].
 * da (n), db (n) ACCUMULATED; they must not alias each other or dout.
 * Threads: parallel over elements.
 */
void gpt2_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ------------------------------------------------------------------------- */
/* Softmax + cross-entropy                                                   */
/* ------------------------------------------------------------------------- */

/*
 * Per row n: probs[n, :] = softmax(logits[n, :]) (max-subtracted) and
 * losses[n] = -log(probs[n, targets[n]]), computed stably as
 * log(sum_v exp(logits[n, v] - max)) - (logits[n, targets[n]] - max).
 * Sums over v are ascending.
 *
 * probs   (N, V)  written; needed by the backward.
 * losses  (N)     written; per-row loss in nats (no averaging here).
 * logits  (N, V).
 * targets (N)     class ids in [0, V).
 * Threads: parallel over rows.
 * Source: softmax cross-entropy (maximum likelihood) as in Radford et al. 2019.
 */
void gpt2_softmax_crossentropy_forward(float *probs, float *losses,
                                       const float *logits,
                                       const int *targets, int N, int V);

/*
 * Backward of gpt2_softmax_crossentropy_forward, fused through the softmax:
 *   dlogits[n, v] += (probs[n, v] - [v == targets[n]]) * dlosses[n].
 * The caller picks the loss normalization through dlosses, e.g. 1/N for the
 * mean over rows.
 *
 * dlogits (N, V) ACCUMULATED; dlosses (N) gradient of the loss w.r.t. each
 * row's loss; probs (N, V) as written by the forward; targets (N).
 * Threads: parallel over rows.
 */
void gpt2_softmax_crossentropy_backward(float *dlogits, const float *dlosses,
                                        const float *probs,
                                        const int *targets, int N, int V);

/* ------------------------------------------------------------------------- */
/* Mean squared error                                                        */
/* ------------------------------------------------------------------------- */

/*
 * *loss = (sum over all elements, row-major order, sequential
 *          of (pred - target)^2) / (N*D).
 *
 * loss    (scalar)  written.
 * pred    (N, D); target (N, D).
 * Threads: runs on the calling thread only (a single ordered sum).
 */
void gpt2_mse_forward(float *loss, const float *pred, const float *target,
                      int N, int D);

/*
 * Backward of gpt2_mse_forward:
 *   dpred[i] += dloss * 2 * (pred[i] - target[i]) / (N*D).
 *
 * dpred (N, D) ACCUMULATED; dloss the upstream gradient of the scalar loss
 * (1.0f for a plain loss); pred, target (N, D) as given to the forward.
 * Threads: parallel over elements.
 */
void gpt2_mse_backward(float *dpred, float dloss, const float *pred,
                       const float *target, int N, int D);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZS_EXAMPLES_GPT2_LAYERS_H */
