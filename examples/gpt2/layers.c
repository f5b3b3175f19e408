/*
 * layers.c: CPU fp32 forward and backward passes of the GPT-2 layers declared
 * in layers.h.
 *
 * Determinism rule followed by every loop below: OpenMP splits only over
 * independent output elements, and each output's sum is accumulated by one
 * thread, in a fixed order, into a local that starts at 0. The local is then
 * written (forward) or added once (backward). No reductions, no atomics.
 * Compile with -ffp-contract=off so no multiply-add is fused differently in
 * different code paths.
 */
#include "examples/gpt2/layers.h"

#include <math.h>

#include "examples/gpt2/layers_math.h"

/* Columns handled together when a sum runs down rows: the partial sums of a
 * tile live in a small local array, so the rows are read contiguously while
 * each element's sum stays sequential in the row index. */
#define GPT2_TILE 16

static inline int gpt2__min(int a, int b) { return a < b ? a : b; }

/* ------------------------------------------------------------------------- */
/* Encoder                                                                   */
/* ------------------------------------------------------------------------- */

void gpt2_encoder_forward(float *out, const int *tokens, const float *wte,
                          const float *wpe, int B, int T, int C) {
    const int N = B * T;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const int t = n % T;
        float *out_n = out + (size_t)n * C;                  /* (C) */
        const float *wte_v = wte + (size_t)tokens[n] * C;    /* (C) */
        const float *wpe_t = wpe + (size_t)t * C;            /* (C) */
        for (int c = 0; c < C; c++) {
            out_n[c] = wte_v[c] + wpe_t[c];
        }
    }
}

void gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout,
                           const int *tokens, int B, int T, int C) {
    const int N = B * T;

    /* dwte (V, C): a token may repeat, so a row can be hit by several
     * positions. Split over column tiles instead of positions: each tile's
     * thread walks all positions in order, which keeps writes disjoint. */
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += GPT2_TILE) {
        const int cn = gpt2__min(GPT2_TILE, C - c0);
        for (int n = 0; n < N; n++) {
            float *dwte_v = dwte + (size_t)tokens[n] * C + c0;
            const float *dout_n = dout + (size_t)n * C + c0;
            for (int k = 0; k < cn; k++) {
                dwte_v[k] += dout_n[k];
            }
        }
    }

    /* dwpe (maxT, C): position t is used once per batch row. */
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < C; c++) {
            float s = 0.0f;
            for (int b = 0; b < B; b++) {
                s += dout[((size_t)b * T + t) * C + c];
            }
            dwpe[(size_t)t * C + c] += s;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* LayerNorm                                                                 */
/* ------------------------------------------------------------------------- */

void gpt2_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *inp, const float *weight,
                            const float *bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt2_math_layernorm_row(out + (size_t)n * C, &mean[n], &rstd[n],
                                inp + (size_t)n * C, weight, bias, C);
    }
}

void gpt2_layernorm_backward(float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp,
                             const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    /* dinp (N, C): each row depends only on its own row. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt2_math_layernorm_backward_row(dinp + (size_t)n * C,
                                         dout + (size_t)n * C,
                                         inp + (size_t)n * C, weight, mean[n],
                                         rstd[n], C);
    }

    /* dweight, dbias (C): sums down the N rows in chunks of
     * GPT2_SUM_CHUNK_ROWS (the CUDA kernels' order), one tile of channels
     * per iteration so rows are read contiguously. */
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += GPT2_TILE) {
        const int cn = gpt2__min(GPT2_TILE, C - c0);
        float dw[GPT2_TILE] = {0.0f};
        float db[GPT2_TILE] = {0.0f};
        for (int n0 = 0; n0 < N; n0 += GPT2_SUM_CHUNK_ROWS) {
            const int n1 = gpt2__min(N, n0 + GPT2_SUM_CHUNK_ROWS);
            float pw[GPT2_TILE] = {0.0f};
            float pb[GPT2_TILE] = {0.0f};
            for (int n = n0; n < n1; n++) {
                const float *x = inp + (size_t)n * C + c0;
                const float *dy = dout + (size_t)n * C + c0;
                for (int k = 0; k < cn; k++) {
                    const float xhat = (x[k] - mean[n]) * rstd[n];
                    pw[k] += dy[k] * xhat;
                    pb[k] += dy[k];
                }
            }
            for (int k = 0; k < cn; k++) {
                dw[k] += pw[k];
                db[k] += pb[k];
            }
        }
        for (int k = 0; k < cn; k++) {
            dweight[c0 + k] += dw[k];
            dbias[c0 + k] += db[k];
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Matmul                                                                    */
/* ------------------------------------------------------------------------- */

/*
 * Register-blocked kernels, written once (GPT2__MM_TEMPLATE) with GCC vector
 * extensions and compiled three times: for AVX-512F with 16-float vectors,
 * for AVX2 with 8-float and for the x86-64 baseline (SSE2) with 4-float
 * vectors. gpt2__mm_isa_best picks the best copy the CPU supports at run time.
 * (Each copy uses its ISA's native width: GCC splits wider vectors badly.)
 *
 * Every output element is still ONE sum in the order layers.h documents,
 * which is the order of the plain loops:
 *     s = 0;  s = s + a[k]*b[k] for k ascending;  then out = s + bias
 *     (forward) or g = g + s (backward),
 * each product and each sum rounded on its own (-ffp-contract=off). The lanes
 * of a vector hold DIFFERENT output elements, never parts of one sum, so the
 * vector width, the tile shape, the ISA and the thread count cannot change a
 * bit. Vectors therefore run along an output dimension that is contiguous:
 *     forward   out[n, o..]       o, from a transposed weight tile
 *     dinp      dinp[n, c..]      c, from rows of weight
 *     dweight   dweight[o, c..]   c, from rows of inp
 *     dbias     dbias[o..]        o, from rows of dout
 * A register block is R rows (forward, dinp) or R output channels (dweight)
 * by two vectors of columns; each of the R rows broadcasts one scalar per
 * step of the reduction. OpenMP splits a call into independent tiles of
 * output elements, and one thread computes a tile from start to end.
 */

#define GPT2__MM_W 32    /* output columns per tile */
#define GPT2__MM_NB 64   /* rows n per forward / dinp tile */
#define GPT2__MM_KC 128  /* reduction chunk held in the forward's weight tile */
#define GPT2__MM_OB 16   /* output channels o per dweight tile */
#define GPT2__MM_R 4     /* rows (or channels) per register block */

#define GPT2__INLINE static inline __attribute__((always_inline))

/* The copies of the kernels; their values are those of the internal entry
 * points zs__gpt2_matmul_{forward,backward}_isa. */
enum { GPT2__ISA_BASE = 0, GPT2__ISA_AVX2 = 1, GPT2__ISA_AVX512F = 2 };

/* Arguments of one matmul call, shared read-only by all tiles. */
typedef struct {
    float *out, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout;
    int N, C, OC;
} gpt2__mm;

/* wt (kc, 32) = w (ow, kc)^T, with row stride ldw, zero in columns ow..31. */
GPT2__INLINE void gpt2__mm_transpose(float *wt, const float *w, int ldw,
                                     int ow, int kc) {
    for (int j = 0; j < ow; j++) {
        for (int c = 0; c < kc; c++) {
            wt[c * GPT2__MM_W + j] = w[(size_t)j * ldw + c];
        }
    }
    for (int j = ow; j < GPT2__MM_W; j++) {
        for (int c = 0; c < kc; c++) {
            wt[c * GPT2__MM_W + j] = 0.0f;
        }
    }
}

/* The kernels, written once and instantiated per ISA below. sfx names the
 * copy; V is its register vector type, VM the memory view of V (unaligned,
 * may alias float), L the floats per V, R the rows (or output channels) per
 * register block. A block holds 2*R accumulators of V: 8 of the 32 zmm or 16
 * ymm / xmm registers. ATTR is the copy's target attribute; every function
 * of a copy carries it so that its vector code is compiled for that ISA. */
#define GPT2__MM_TEMPLATE(sfx, V, VM, L, R, ATTR)                            \
/* *v = p[0..n-1], zero-padded to L lanes; reads nothing past p[n-1]. */     \
ATTR GPT2__INLINE void gpt2__ldn_##sfx(V *v, const float *p, int n) {        \
    if (n >= L) {                                                            \
        *v = *(const VM *)(const void *)p;                                   \
        return;                                                              \
    }                                                                        \
    V t = {0.0f};                                                            \
    for (int k = 0; k < n; k++) {                                            \
        t[k] = p[k];                                                         \
    }                                                                        \
    *v = t;                                                                  \
}                                                                            \
                                                                             \
/* p[0..n-1] = lanes 0..n-1 of *v. */                                        \
ATTR GPT2__INLINE void gpt2__stn_##sfx(float *p, const V *v, int n) {        \
    if (n >= L) {                                                            \
        *(VM *)(void *)p = *v;                                               \
        return;                                                              \
    }                                                                        \
    for (int k = 0; k < n; k++) {                                            \
        p[k] = (*v)[k];                                                      \
    }                                                                        \
}                                                                            \
                                                                             \
/* g[0..w0+w1-1] += lanes of s[0], s[1] (w0 <= L, w1 <= L): the single       \
 * g = g + s of a gradient element. */                                       \
ATTR GPT2__INLINE void gpt2__mm_add_##sfx(float *g, const V *s, int w0,      \
                                          int w1) {                          \
    V t;                                                                     \
    gpt2__ldn_##sfx(&t, g, w0);                                              \
    t += s[0];                                                               \
    gpt2__stn_##sfx(g, &t, w0);                                              \
    if (w1 > 0) {                                                            \
        gpt2__ldn_##sfx(&t, g + L, w1);                                      \
        t += s[1];                                                           \
        gpt2__stn_##sfx(g + L, &t, w1);                                      \
    }                                                                        \
}                                                                            \
                                                                             \
/* Forward, one register block: out[n..n+rows-1, o..o+ow-1] (ow <= 2L) over  \
 * the reduction chunk [c0, c0+kc). wt (kc, 32) is the transposed weight     \
 * tile, offset to column o. The sums start at 0 in the first chunk and      \
 * go on from the partial sums parked in out by the previous one (an exact   \
 * round trip); the last chunk adds the bias. */                             \
ATTR GPT2__INLINE void gpt2__mm_fwd_block_##sfx(                             \
    const gpt2__mm *m, const float *wt, int n, int o, int ow, int c0,        \
    int kc, const int rows) {                                                \
    const int C = m->C, OC = m->OC;                                          \
    const int w0 = gpt2__min(ow, L), w1 = ow - w0;                           \
    V acc[R][2];                                                             \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        const float *y = m->out + (size_t)(n + r) * OC + o;                  \
        acc[r][0] = (V){0.0f};                                               \
        acc[r][1] = (V){0.0f};                                               \
        if (c0 > 0) {                                                        \
            gpt2__ldn_##sfx(&acc[r][0], y, w0);                              \
            if (w1 > 0) gpt2__ldn_##sfx(&acc[r][1], y + L, w1);              \
        }                                                                    \
    }                                                                        \
    const float *x = m->inp + (size_t)n * C + c0; /* (rows, C) from c0 */    \
    for (int c = 0; c < kc; c++) {                                           \
        const V wa = *(const VM *)(const void *)(wt + c * GPT2__MM_W);       \
        const V wb = *(const VM *)(const void *)(wt + c * GPT2__MM_W + L);   \
        _Pragma("GCC unroll 4")                                              \
        for (int r = 0; r < rows; r++) {                                     \
            const float xv = x[(size_t)r * C + c];                           \
            acc[r][0] += xv * wa;                                            \
            acc[r][1] += xv * wb;                                            \
        }                                                                    \
    }                                                                        \
    /* without a bias nothing is added: s + 0 would turn -0 into +0 */       \
    const int bias = c0 + kc == C && m->bias != NULL;                        \
    V ba = {0.0f}, bb = {0.0f};                                              \
    if (bias) {                                                              \
        gpt2__ldn_##sfx(&ba, m->bias + o, w0);                               \
        if (w1 > 0) gpt2__ldn_##sfx(&bb, m->bias + o + L, w1);               \
    }                                                                        \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        float *y = m->out + (size_t)(n + r) * OC + o;                        \
        if (bias) {                                                          \
            acc[r][0] += ba;                                                 \
            acc[r][1] += bb;                                                 \
        }                                                                    \
        gpt2__stn_##sfx(y, &acc[r][0], w0);                                  \
        if (w1 > 0) gpt2__stn_##sfx(y + L, &acc[r][1], w1);                  \
    }                                                                        \
}                                                                            \
                                                                             \
/* Forward, one tile: rows n0..n0+63 by output channels o0..o0+31. */        \
ATTR static void gpt2__mm_fwd_##sfx(const gpt2__mm *m, int tile) {           \
    const int N = m->N, C = m->C, OC = m->OC;                                \
    const int otiles = (OC + GPT2__MM_W - 1) / GPT2__MM_W;                   \
    const int n0 = (tile / otiles) * GPT2__MM_NB;                            \
    const int o0 = (tile % otiles) * GPT2__MM_W;                             \
    const int nn = gpt2__min(GPT2__MM_NB, N - n0);                           \
    const int ow = gpt2__min(GPT2__MM_W, OC - o0);                           \
    /* (kc, 32) transposed weight tile: 16 KiB of stack. Transposing costs   \
     * 32*kc moves per 64*32*kc multiply-adds. */                            \
    float wt[GPT2__MM_KC * GPT2__MM_W] __attribute__((aligned(64)));         \
    for (int c0 = 0; c0 < C; c0 += GPT2__MM_KC) {                            \
        const int kc = gpt2__min(GPT2__MM_KC, C - c0);                       \
        gpt2__mm_transpose(wt, m->weight + (size_t)o0 * C + c0, C, ow, kc);  \
        for (int j = 0; j < ow; j += 2 * L) {                                \
            const int bw = gpt2__min(2 * L, ow - j);                         \
            int n = 0;                                                       \
            for (; n + R <= nn; n += R) {                                    \
                gpt2__mm_fwd_block_##sfx(m, wt + j, n0 + n, o0 + j, bw, c0,  \
                                         kc, R);                             \
            }                                                                \
            for (; n < nn; n++) {                                            \
                gpt2__mm_fwd_block_##sfx(m, wt + j, n0 + n, o0 + j, bw, c0,  \
                                         kc, 1);                             \
            }                                                                \
        }                                                                    \
    }                                                                        \
}                                                                            \
                                                                             \
/* dinp, one register block: dinp[n..n+rows-1, c..c+cw-1] (cw <= 2L) +=      \
 * sum over o (ascending) of dout[n, o] * weight[o, c]. full: cw == 2L. */   \
ATTR GPT2__INLINE void gpt2__mm_dinp_block_##sfx(                            \
    const gpt2__mm *m, int n, int c, int cw, const int rows,                 \
    const int full) {                                                        \
    const int C = m->C, OC = m->OC;                                          \
    const int w0 = gpt2__min(cw, L), w1 = cw - w0;                           \
    V acc[R][2];                                                             \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        acc[r][0] = (V){0.0f};                                               \
        acc[r][1] = (V){0.0f};                                               \
    }                                                                        \
    const float *dy = m->dout + (size_t)n * OC; /* (rows, OC) */             \
    const float *w = m->weight + c;             /* (OC, C) from column c */  \
    for (int o = 0; o < OC; o++) {                                           \
        V wa, wb = {0.0f};                                                   \
        if (full) {                                                          \
            wa = *(const VM *)(const void *)(w + (size_t)o * C);             \
            wb = *(const VM *)(const void *)(w + (size_t)o * C + L);         \
        } else {                                                             \
            gpt2__ldn_##sfx(&wa, w + (size_t)o * C, w0);                     \
            if (w1 > 0) gpt2__ldn_##sfx(&wb, w + (size_t)o * C + L, w1);     \
        }                                                                    \
        _Pragma("GCC unroll 4")                                              \
        for (int r = 0; r < rows; r++) {                                     \
            const float d = dy[(size_t)r * OC + o];                          \
            acc[r][0] += d * wa;                                             \
            acc[r][1] += d * wb;                                             \
        }                                                                    \
    }                                                                        \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        gpt2__mm_add_##sfx(m->dinp + (size_t)(n + r) * C + c, acc[r], w0,    \
                           w1);                                              \
    }                                                                        \
}                                                                            \
                                                                             \
/* dinp, one tile: rows n0..n0+63 by input channels c0..c0+31. */            \
ATTR static void gpt2__mm_dinp_##sfx(const gpt2__mm *m, int tile) {          \
    const int ctiles = (m->C + GPT2__MM_W - 1) / GPT2__MM_W;                 \
    const int n0 = (tile / ctiles) * GPT2__MM_NB;                            \
    const int c0 = (tile % ctiles) * GPT2__MM_W;                             \
    const int nn = gpt2__min(GPT2__MM_NB, m->N - n0);                        \
    const int cn = gpt2__min(GPT2__MM_W, m->C - c0);                         \
    for (int j = 0; j < cn; j += 2 * L) {                                    \
        const int bw = gpt2__min(2 * L, cn - j);                             \
        int n = 0;                                                           \
        if (bw == 2 * L) {                                                   \
            for (; n + R <= nn; n += R) {                                    \
                gpt2__mm_dinp_block_##sfx(m, n0 + n, c0 + j, bw, R, 1);      \
            }                                                                \
        }                                                                    \
        for (; n < nn; n++) {                                                \
            gpt2__mm_dinp_block_##sfx(m, n0 + n, c0 + j, bw, 1, 0);          \
        }                                                                    \
    }                                                                        \
}                                                                            \
                                                                             \
/* dweight, one register block: dweight[o..o+rows-1, c..c+cw-1] (cw <= 2L)   \
 * += sum over n (ascending) of dout[n, o] * inp[n, c]. full: cw == 2L. */   \
ATTR GPT2__INLINE void gpt2__mm_dweight_block_##sfx(                         \
    const gpt2__mm *m, int o, int c, int cw, const int rows,                 \
    const int full) {                                                        \
    const int N = m->N, C = m->C, OC = m->OC;                                \
    const int w0 = gpt2__min(cw, L), w1 = cw - w0;                           \
    V acc[R][2];                                                             \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        acc[r][0] = (V){0.0f};                                               \
        acc[r][1] = (V){0.0f};                                               \
    }                                                                        \
    const float *x = m->inp + c;   /* (N, C) from column c */                \
    const float *dy = m->dout + o; /* (N, OC) from column o */               \
    for (int n = 0; n < N; n++) {                                            \
        V xa, xb = {0.0f};                                                   \
        if (full) {                                                          \
            xa = *(const VM *)(const void *)(x + (size_t)n * C);             \
            xb = *(const VM *)(const void *)(x + (size_t)n * C + L);         \
        } else {                                                             \
            gpt2__ldn_##sfx(&xa, x + (size_t)n * C, w0);                     \
            if (w1 > 0) gpt2__ldn_##sfx(&xb, x + (size_t)n * C + L, w1);     \
        }                                                                    \
        _Pragma("GCC unroll 4")                                              \
        for (int r = 0; r < rows; r++) {                                     \
            const float d = dy[(size_t)n * OC + r];                          \
            acc[r][0] += d * xa;                                             \
            acc[r][1] += d * xb;                                             \
        }                                                                    \
    }                                                                        \
    _Pragma("GCC unroll 4")                                                  \
    for (int r = 0; r < rows; r++) {                                         \
        gpt2__mm_add_##sfx(m->dweight + (size_t)(o + r) * C + c, acc[r], w0, \
                           w1);                                              \
    }                                                                        \
}                                                                            \
                                                                             \
/* dweight, one tile: output channels o0..o0+15 by input channels            \
 * c0..c0+31. The tiles with c0 == 0 also own dbias[o0..o0+15]. */           \
ATTR static void gpt2__mm_dweight_##sfx(const gpt2__mm *m, int tile) {       \
    const int N = m->N, OC = m->OC;                                          \
    const int ctiles = (m->C + GPT2__MM_W - 1) / GPT2__MM_W;                 \
    const int o0 = (tile / ctiles) * GPT2__MM_OB;                            \
    const int c0 = (tile % ctiles) * GPT2__MM_W;                             \
    const int on = gpt2__min(GPT2__MM_OB, OC - o0);                          \
    const int cn = gpt2__min(GPT2__MM_W, m->C - c0);                         \
    for (int j = 0; j < cn; j += 2 * L) {                                    \
        const int bw = gpt2__min(2 * L, cn - j);                             \
        int o = 0;                                                           \
        if (bw == 2 * L) {                                                   \
            for (; o + R <= on; o += R) {                                    \
                gpt2__mm_dweight_block_##sfx(m, o0 + o, c0 + j, bw, R, 1);   \
            }                                                                \
        }                                                                    \
        for (; o < on; o++) {                                                \
            gpt2__mm_dweight_block_##sfx(m, o0 + o, c0 + j, bw, 1, 0);       \
        }                                                                    \
    }                                                                        \
    if (c0 > 0 || m->dbias == NULL) {                                        \
        return;                                                              \
    }                                                                        \
    /* in chunks of GPT2_SUM_CHUNK_ROWS rows (layers_math.h) */              \
    for (int j = 0; j < on; j += L) {                                        \
        const int bw = gpt2__min(L, on - j);                                 \
        V s = {0.0f}, d;                                                     \
        for (int n0 = 0; n0 < N; n0 += GPT2_SUM_CHUNK_ROWS) {                \
            const int n1 = gpt2__min(N, n0 + GPT2_SUM_CHUNK_ROWS);           \
            V p = {0.0f};                                                    \
            for (int n = n0; n < n1; n++) {                                  \
                gpt2__ldn_##sfx(&d, m->dout + (size_t)n * OC + o0 + j, bw);  \
                p += d;                                                      \
            }                                                                \
            s += p;                                                          \
        }                                                                    \
        gpt2__mm_add_##sfx(m->dbias + o0 + j, &s, bw, 0);                    \
    }                                                                        \
}                                                                            \
                                                                             \
/* Backward, one tile: the dinp tiles come first (none when dinp is NULL),   \
 * then the dweight (+ dbias) tiles. */                                      \
ATTR static void gpt2__mm_bwd_##sfx(const gpt2__mm *m, int tile) {           \
    const int ctiles = (m->C + GPT2__MM_W - 1) / GPT2__MM_W;                 \
    const int ntiles = (m->N + GPT2__MM_NB - 1) / GPT2__MM_NB;               \
    const int dinp_tiles = m->dinp != NULL ? ntiles * ctiles : 0;            \
    if (tile < dinp_tiles) {                                                 \
        gpt2__mm_dinp_##sfx(m, tile);                                        \
    } else {                                                                 \
        gpt2__mm_dweight_##sfx(m, tile - dinp_tiles);                        \
    }                                                                        \
}

/* One copy per ISA. The register vector types are declared at file scope
 * (a typedef inside the template would need the ISA's vector size to be
 * legal outside it); the memory views are unaligned and may alias float. */
typedef float gpt2__v4 __attribute__((vector_size(16)));
typedef float gpt2__v4m __attribute__((vector_size(16), aligned(4), may_alias));
GPT2__MM_TEMPLATE(base, gpt2__v4, gpt2__v4m, 4, GPT2__MM_R, )

#if defined(__x86_64__) || defined(__i386__)
typedef float gpt2__v8 __attribute__((vector_size(32)));
typedef float gpt2__v8m __attribute__((vector_size(32), aligned(4), may_alias));
typedef float gpt2__v16 __attribute__((vector_size(64)));
typedef float gpt2__v16m
    __attribute__((vector_size(64), aligned(4), may_alias));
GPT2__MM_TEMPLATE(avx2, gpt2__v8, gpt2__v8m, 8, GPT2__MM_R,
                  __attribute__((target("avx2"))))
GPT2__MM_TEMPLATE(avx512f, gpt2__v16, gpt2__v16m, 16, GPT2__MM_R,
                  __attribute__((target("avx512f"))))
#endif

typedef void (*gpt2__mm_tile_fn)(const gpt2__mm *m, int tile);

/* Internal entry points, not in layers.h: gpt2_matmul_forward/backward with
 * the copy of the kernels named by isa (GPT2__ISA_*; the baseline for an
 * unknown value), so that tests can compare the copies bit for bit. isa must
 * be one that zs__gpt2_matmul_isa_supported accepts. */
int zs__gpt2_matmul_isa_supported(int isa);
void zs__gpt2_matmul_forward_isa(int isa, float *out, const float *inp,
                                 const float *weight, const float *bias,
                                 int N, int C, int OC);
void zs__gpt2_matmul_backward_isa(int isa, float *dinp, float *dweight,
                                  float *dbias, const float *dout,
                                  const float *inp, const float *weight,
                                  int N, int C, int OC);

/* 1 when the CPU (and OS) can run that copy, else 0. */
int zs__gpt2_matmul_isa_supported(int isa) {
    switch (isa) {
    case GPT2__ISA_BASE:
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    case GPT2__ISA_AVX2:
        return __builtin_cpu_supports("avx2") != 0;
    case GPT2__ISA_AVX512F:
        return __builtin_cpu_supports("avx512f") != 0;
#endif
    default:
        return 0;
    }
}

static int gpt2__mm_isa_best(void) {
    int isa = GPT2__ISA_AVX512F;
    while (isa > GPT2__ISA_BASE && !zs__gpt2_matmul_isa_supported(isa)) {
        isa--;
    }
    return isa;
}

static void gpt2__mm_kernels(int isa, gpt2__mm_tile_fn *fwd,
                             gpt2__mm_tile_fn *bwd) {
    *fwd = gpt2__mm_fwd_base;
    *bwd = gpt2__mm_bwd_base;
#if defined(__x86_64__) || defined(__i386__)
    if (isa == GPT2__ISA_AVX2) {
        *fwd = gpt2__mm_fwd_avx2;
        *bwd = gpt2__mm_bwd_avx2;
    } else if (isa == GPT2__ISA_AVX512F) {
        *fwd = gpt2__mm_fwd_avx512f;
        *bwd = gpt2__mm_bwd_avx512f;
    }
#endif
}

void zs__gpt2_matmul_forward_isa(int isa, float *out, const float *inp,
                                 const float *weight, const float *bias,
                                 int N, int C, int OC) {
    const gpt2__mm m = {.out = out, .inp = inp, .weight = weight,
                        .bias = bias, .N = N, .C = C, .OC = OC};
    gpt2__mm_tile_fn fwd, bwd;
    gpt2__mm_kernels(isa, &fwd, &bwd);
    const int tiles = (N + GPT2__MM_NB - 1) / GPT2__MM_NB *
                      ((OC + GPT2__MM_W - 1) / GPT2__MM_W);
    /* dynamic: tiles on the edges are cheaper; the split cannot change
     * results since tiles write disjoint elements */
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < tiles; t++) {
        fwd(&m, t);
    }
}

void zs__gpt2_matmul_backward_isa(int isa, float *dinp, float *dweight,
                                  float *dbias, const float *dout,
                                  const float *inp, const float *weight,
                                  int N, int C, int OC) {
    const gpt2__mm m = {.dinp = dinp, .dweight = dweight, .dbias = dbias,
                        .dout = dout, .inp = inp, .weight = weight,
                        .N = N, .C = C, .OC = OC};
    gpt2__mm_tile_fn fwd, bwd;
    gpt2__mm_kernels(isa, &fwd, &bwd);
    const int ctiles = (C + GPT2__MM_W - 1) / GPT2__MM_W;
    const int tiles =
        (dinp != NULL ? (N + GPT2__MM_NB - 1) / GPT2__MM_NB * ctiles : 0) +
        (OC + GPT2__MM_OB - 1) / GPT2__MM_OB * ctiles;
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < tiles; t++) {
        bwd(&m, t);
    }
}

void gpt2_matmul_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC) {
    zs__gpt2_matmul_forward_isa(gpt2__mm_isa_best(), out, inp, weight, bias,
                                N, C, OC);
}

void gpt2_matmul_backward(float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC) {
    zs__gpt2_matmul_backward_isa(gpt2__mm_isa_best(), dinp, dweight, dbias,
                                 dout, inp, weight, N, C, OC);
}

/* ------------------------------------------------------------------------- */
/* Attention                                                                 */
/* ------------------------------------------------------------------------- */

void gpt2_attention_forward(float *out, float *preatt, float *att,
                            const float *inp, int B, int T, int C, int NH) {
    const int C3 = 3 * C;
    const int hs = C / NH;  /* head size */
    const float scale = 1.0f / sqrtf((float)hs);

#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float *q = inp + ((size_t)b * T + t) * C3 + h * hs;
                const size_t row = (((size_t)b * NH + h) * T + t) * T;
                float *pre = preatt + row;  /* (T) */
                float *a = att + row;       /* (T) */

                /* scores of keys 0..t; the softmax subtracts their max */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + C
                                     + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += q[i] * k[i];
                    }
                    s *= scale;
                    pre[t2] = s;
                }

                gpt2_math_causal_softmax_row(a, pre, t, T);

                /* out_t = sum over t2 <= t of att[t2] * v_t2   (hs) */
                float *y = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    y[i] = 0.0f;
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + 2 * C
                                     + h * hs;
                    for (int i = 0; i < hs; i++) {
                        y[i] += a[t2] * v[i];
                    }
                }
            }
        }
    }
}

void gpt2_attention_backward(float *dinp, float *dpreatt, float *datt,
                             const float *dout, const float *inp,
                             const float *att, int B, int T, int C, int NH) {
    const int C3 = 3 * C;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);

    /* Pass 1, per query row (b, h, t): datt and dpreatt over keys t2. */
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const size_t row = (((size_t)b * NH + h) * T + t) * T;
                const float *a = att + row;   /* (T) */
                float *da = datt + row;       /* (T) */
                float *dpre = dpreatt + row;  /* (T) */
                const float *dy = dout + ((size_t)b * T + t) * C + h * hs;

                /* datt[t2] = dout_t . v_t2 */
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = inp + ((size_t)b * T + t2) * C3 + 2 * C
                                     + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += dy[i] * v[i];
                    }
                    da[t2] = s;
                }

                /* softmax backward: dpre = a * (da - sum(a * da)) */
                gpt2_math_causal_softmax_backward_row(dpre, da, a, t, T);
            }
        }
    }

    /* Pass 2, per (b, position p, h): dq of query p (sum over its keys),
     * dk and dv of key p (sums over the queries p..T-1 that see it). The
     * three slices are disjoint across iterations. */
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int p = 0; p < T; p++) {
            for (int h = 0; h < NH; h++) {
                const size_t bh = ((size_t)b * NH + h) * T;  /* (T, T) base */
                const size_t xp = ((size_t)b * T + p) * C3 + h * hs;
                float *dq = dinp + xp;          /* (hs) */
                float *dk = dinp + xp + C;      /* (hs) */
                float *dv = dinp + xp + 2 * C;  /* (hs) */

                for (int i = 0; i < hs; i++) {
                    /* dq_p[i]: keys t2 = 0..p */
                    float sq = 0.0f;
                    for (int t2 = 0; t2 <= p; t2++) {
                        const float k = inp[((size_t)b * T + t2) * C3 + C
                                            + h * hs + i];
                        sq += dpreatt[(bh + p) * T + t2] * k;
                    }
                    /* dk_p[i], dv_p[i]: queries t = p..T-1 */
                    float sk = 0.0f;
                    float sv = 0.0f;
                    for (int t = p; t < T; t++) {
                        const float q = inp[((size_t)b * T + t) * C3
                                            + h * hs + i];
                        const float dy = dout[((size_t)b * T + t) * C
                                              + h * hs + i];
                        sk += dpreatt[(bh + t) * T + p] * q;
                        sv += att[(bh + t) * T + p] * dy;
                    }
                    dq[i] += scale * sq;
                    dk[i] += scale * sk;
                    dv[i] += sv;
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------- */
/* GELU                                                                      */
/* ------------------------------------------------------------------------- */

void gpt2_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        out[i] = gpt2_math_gelu(inp[i]);
    }
}

void gpt2_gelu_backward(float *dinp, const float *inp, const float *dout,
                        size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        dinp[i] += gpt2_math_gelu_grad(inp[i]) * dout[i];
    }
}

/* ------------------------------------------------------------------------- */
/* Residual                                                                  */
/* ------------------------------------------------------------------------- */

void gpt2_residual_forward(float *out, const float *a, const float *b,
                           size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

void gpt2_residual_backward(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ------------------------------------------------------------------------- */
/* Softmax + cross-entropy                                                   */
/* ------------------------------------------------------------------------- */

void gpt2_softmax_crossentropy_forward(float *probs, float *losses,
                                       const float *logits,
                                       const int *targets, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        losses[n] = gpt2_math_softmax_ce_row(probs + (size_t)n * V,
                                             logits + (size_t)n * V,
                                             targets[n], V);
    }
}

void gpt2_softmax_crossentropy_backward(float *dlogits, const float *dlosses,
                                        const float *probs,
                                        const int *targets, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        gpt2_math_softmax_ce_backward_row(dlogits + (size_t)n * V,
                                          probs + (size_t)n * V, targets[n],
                                          dlosses[n], V);
    }
}

/* ------------------------------------------------------------------------- */
/* Mean squared error                                                        */
/* ------------------------------------------------------------------------- */

void gpt2_mse_forward(float *loss, const float *pred, const float *target,
                      int N, int D) {
    const size_t n = (size_t)N * D;
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float d = pred[i] - target[i];
        sum += d * d;
    }
    *loss = sum / (float)n;
}

void gpt2_mse_backward(float *dpred, float dloss, const float *pred,
                       const float *target, int N, int D) {
    const size_t n = (size_t)N * D;
    const float k = 2.0f * dloss / (float)n;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        dpred[i] += k * (pred[i] - target[i]);
    }
}
