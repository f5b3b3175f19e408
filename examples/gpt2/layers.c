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
        const float *x = inp + (size_t)n * C;   /* (C) */
        float *y = out + (size_t)n * C;         /* (C) */

        float sum = 0.0f;
        for (int c = 0; c < C; c++) {
            sum += x[c];
        }
        const float m = sum / (float)C;

        /* Two passes: the variance of centred values does not cancel. */
        float sq = 0.0f;
        for (int c = 0; c < C; c++) {
            const float d = x[c] - m;
            sq += d * d;
        }
        const float var = sq / (float)C;
        const float s = 1.0f / sqrtf(var + GPT2_LAYERNORM_EPS);

        for (int c = 0; c < C; c++) {
            y[c] = ((x[c] - m) * s) * weight[c] + bias[c];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

void gpt2_layernorm_backward(float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp,
                             const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
    /* dinp (N, C): each row depends only on its own row. */
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;    /* (C) */
        const float *dy = dout + (size_t)n * C;  /* (C) */
        float *dx = dinp + (size_t)n * C;        /* (C) */
        const float m = mean[n];
        const float s = rstd[n];

        /* mean over c of g and of g * xhat, with g = weight * dy */
        float g_sum = 0.0f;
        float gx_sum = 0.0f;
        for (int c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s;
            const float g = weight[c] * dy[c];
            g_sum += g;
            gx_sum += g * xhat;
        }
        const float g_mean = g_sum / (float)C;
        const float gx_mean = gx_sum / (float)C;

        for (int c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s;
            const float g = weight[c] * dy[c];
            dx[c] += s * ((g - g_mean) - xhat * gx_mean);
        }
    }

    /* dweight, dbias (C): sums down the N rows, one tile of channels per
     * iteration so rows are read contiguously. */
#pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += GPT2_TILE) {
        const int cn = gpt2__min(GPT2_TILE, C - c0);
        float dw[GPT2_TILE] = {0.0f};
        float db[GPT2_TILE] = {0.0f};
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0;
            const float *dy = dout + (size_t)n * C + c0;
            for (int k = 0; k < cn; k++) {
                const float xhat = (x[k] - mean[n]) * rstd[n];
                dw[k] += dy[k] * xhat;
                db[k] += dy[k];
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

void gpt2_matmul_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int N, int C, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;  /* (C) */
        float *y = out + (size_t)n * OC;       /* (OC) */
        for (int o = 0; o < OC; o++) {
            const float *w = weight + (size_t)o * C;  /* (C) */
            float s = 0.0f;
            for (int c = 0; c < C; c++) {
                s += x[c] * w[c];
            }
            y[o] = bias != NULL ? s + bias[o] : s;
        }
    }
}

void gpt2_matmul_backward(float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC) {
    /* dinp (N, C) = dout (N, OC) . weight (OC, C): the sum over o runs down
     * the rows of weight, so take C in tiles to read them contiguously. */
    if (dinp != NULL) {
#pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float *dy = dout + (size_t)n * OC;  /* (OC) */
            float *dx = dinp + (size_t)n * C;         /* (C) */
            for (int c0 = 0; c0 < C; c0 += GPT2_TILE) {
                const int cn = gpt2__min(GPT2_TILE, C - c0);
                float s[GPT2_TILE] = {0.0f};
                for (int o = 0; o < OC; o++) {
                    const float *w = weight + (size_t)o * C + c0;
                    for (int k = 0; k < cn; k++) {
                        s[k] += dy[o] * w[k];
                    }
                }
                for (int k = 0; k < cn; k++) {
                    dx[c0 + k] += s[k];
                }
            }
        }
    }

    /* dweight (OC, C) = dout^T (OC, N) . inp (N, C); dbias (OC). */
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float *dw = dweight + (size_t)o * C;  /* (C) */
        for (int c0 = 0; c0 < C; c0 += GPT2_TILE) {
            const int cn = gpt2__min(GPT2_TILE, C - c0);
            float s[GPT2_TILE] = {0.0f};
            for (int n = 0; n < N; n++) {
                const float d = dout[(size_t)n * OC + o];
                const float *x = inp + (size_t)n * C + c0;
                for (int k = 0; k < cn; k++) {
                    s[k] += d * x[k];
                }
            }
            for (int k = 0; k < cn; k++) {
                dw[c0 + k] += s[k];
            }
        }
        if (dbias != NULL) {
            float sb = 0.0f;
            for (int n = 0; n < N; n++) {
                sb += dout[(size_t)n * OC + o];
            }
            dbias[o] += sb;
        }
    }
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

                /* scores of keys 0..t, and their max for a stable softmax */
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = inp + ((size_t)b * T + t2) * C3 + C
                                     + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += q[i] * k[i];
                    }
                    s *= scale;
                    pre[t2] = s;
                    if (s > maxval) {
                        maxval = s;
                    }
                }

                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float e = expf(pre[t2] - maxval);
                    a[t2] = e;
                    sum += e;
                }
                const float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] *= inv;
                }
                /* the causal mask: future keys get weight 0 */
                for (int t2 = t + 1; t2 < T; t2++) {
                    pre[t2] = 0.0f;
                    a[t2] = 0.0f;
                }

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
                float ada = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    ada += a[t2] * da[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    dpre[t2] = a[t2] * (da[t2] - ada);
                }
                for (int t2 = t + 1; t2 < T; t2++) {
                    da[t2] = 0.0f;
                    dpre[t2] = 0.0f;
                }
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

#define GPT2_SQRT_2_OVER_PI 0.7978845608028654f  /* sqrt(2/pi) */
#define GPT2_GELU_CUBIC 0.044715f

void gpt2_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GPT2_SQRT_2_OVER_PI * (x + GPT2_GELU_CUBIC * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

void gpt2_gelu_backward(float *dinp, const float *inp, const float *dout,
                        size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float u = GPT2_SQRT_2_OVER_PI * (x + GPT2_GELU_CUBIC * x * x * x);
        const float th = tanhf(u);
        const float du = GPT2_SQRT_2_OVER_PI
                         * (1.0f + 3.0f * GPT2_GELU_CUBIC * x * x);
        /* d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u)
         *                           + 0.5 x (1 - tanh^2 u) du/dx */
        const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] += grad * dout[i];
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
        const float *z = logits + (size_t)n * V;  /* (V) */
        float *p = probs + (size_t)n * V;         /* (V) */

        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) {
            if (z[v] > maxval) {
                maxval = z[v];
            }
        }
        float sum = 0.0f;
        for (int v = 0; v < V; v++) {
            const float e = expf(z[v] - maxval);
            p[v] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        for (int v = 0; v < V; v++) {
            p[v] *= inv;
        }
        /* log-sum-exp form: finite even when the target's prob underflows */
        losses[n] = logf(sum) - (z[targets[n]] - maxval);
    }
}

void gpt2_softmax_crossentropy_backward(float *dlogits, const float *dlosses,
                                        const float *probs,
                                        const int *targets, int N, int V) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;  /* (V) */
        float *dz = dlogits + (size_t)n * V;     /* (V) */
        const float dl = dlosses[n];
        const int y = targets[n];
        for (int v = 0; v < V; v++) {
            const float indicator = v == y ? 1.0f : 0.0f;
            dz[v] += (p[v] - indicator) * dl;
        }
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
