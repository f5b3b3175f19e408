/*
 * matmul_bench.c: single-thread GFLOP/s of gpt2_matmul_forward and
 * gpt2_matmul_backward (examples/gpt2/layers.c) on the GPT-2 demo shapes,
 * against the plain loops they replaced (kept below as the baseline and
 * measured in the same run), plus a bitwise comparison of the two.
 *
 * Usage: bazel run -c opt //tools/bench:matmul_bench [-- SECONDS]
 *   SECONDS: minimum time per implementation and shape (default 0.2),
 *   taken as 5 rounds; the best round counts.
 * Output: one table line per shape, then one JSON line:
 *   {"bench":"gpt2_matmul","threads":1,"results":[{"N":..,"C":..,"OC":..,
 *    "fwd_gflops":..,"fwd_ref_gflops":..,"fwd_speedup":..,
 *    "bwd_gflops":..,"bwd_ref_gflops":..,"bwd_speedup":..,"bitwise":true},..],
 *    "geomean_fwd_speedup":..,"geomean_bwd_speedup":..,"all_bitwise":true}
 * FLOPs counted: forward 2*N*C*OC (+ N*OC bias adds); backward 2*N*C*OC for
 * dinp, 2*N*C*OC for dweight, N*OC for dbias.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/gpt2/layers.h"
#include "examples/gpt2/layers_math.h"

/* ------------------------------------------------------------------------- */
/* Baseline: the loops of layers.c before the register-blocked kernels       */
/* ------------------------------------------------------------------------- */

#define REF_TILE 16

static int ref_min(int a, int b) { return a < b ? a : b; }

static void ref_matmul_forward(float *out, const float *inp,
                               const float *weight, const float *bias, int N,
                               int C, int OC) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) {
            const float *w = weight + (size_t)o * C;
            float s = 0.0f;
            for (int c = 0; c < C; c++) {
                s += x[c] * w[c];
            }
            y[o] = bias != NULL ? s + bias[o] : s;
        }
    }
}

static void ref_matmul_backward(float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp,
                                const float *weight, int N, int C, int OC) {
    if (dinp != NULL) {
#pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float *dy = dout + (size_t)n * OC;
            float *dx = dinp + (size_t)n * C;
            for (int c0 = 0; c0 < C; c0 += REF_TILE) {
                const int cn = ref_min(REF_TILE, C - c0);
                float s[REF_TILE] = {0.0f};
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
#pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float *dw = dweight + (size_t)o * C;
        for (int c0 = 0; c0 < C; c0 += REF_TILE) {
            const int cn = ref_min(REF_TILE, C - c0);
            float s[REF_TILE] = {0.0f};
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
        if (dbias != NULL) { /* in chunks of GPT2_SUM_CHUNK_ROWS rows */
            float sb = 0.0f;
            for (int n0 = 0; n0 < N; n0 += GPT2_SUM_CHUNK_ROWS) {
                float p = 0.0f;
                for (int n = n0; n < N && n < n0 + GPT2_SUM_CHUNK_ROWS; n++) {
                    p += dout[(size_t)n * OC + o];
                }
                sb += p;
            }
            dbias[o] += sb;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Timing                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct {
    int N, C, OC;
    float *inp, *weight, *bias, *dout; /* inputs */
    float *out, *dinp, *dweight, *dbias; /* outputs */
} case_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const case_t *k, int backward, int ref) {
    if (!backward) {
        (ref ? ref_matmul_forward : gpt2_matmul_forward)(
            k->out, k->inp, k->weight, k->bias, k->N, k->C, k->OC);
    } else {
        (ref ? ref_matmul_backward : gpt2_matmul_backward)(
            k->dinp, k->dweight, k->dbias, k->dout, k->inp, k->weight, k->N,
            k->C, k->OC);
    }
}

/* Seconds per call of one round: repeated calls for >= min_s. */
static double time_round(const case_t *k, int backward, int ref,
                         double min_s) {
    int reps = 0;
    const double t0 = now_s();
    double t;
    do {
        run(k, backward, ref);
        reps++;
        t = now_s() - t0;
    } while (t < min_s);
    return t / reps;
}

/* best[0..3]: best seconds per call of forward, forward baseline, backward,
 * backward baseline over 5 rounds. The four alternate within each round so
 * that a change of machine load hits new code and baseline alike. */
static void time_case(const case_t *k, double min_s, double best[4]) {
    for (int j = 0; j < 4; j++) best[j] = 1e30;
    for (int round = 0; round < 5; round++) {
        for (int j = 0; j < 4; j++) {
            const double t = time_round(k, j / 2, j % 2, min_s / 5);
            if (t < best[j]) best[j] = t;
        }
    }
}

static float *filled(size_t n, unsigned *seed) {
    float *p = malloc(n * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "matmul_bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        p[i] = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return p;
}

/* Forward and one backward into zeroed gradients with both implementations;
 * 1 when every output is bitwise equal. */
static int same_bits(case_t *k) {
    const size_t nout = (size_t)k->N * k->OC, ninp = (size_t)k->N * k->C,
                 nw = (size_t)k->OC * k->C;
    float *buf[2][4];
    for (int ref = 0; ref < 2; ref++) {
        memset(k->dinp, 0, ninp * sizeof(float));
        memset(k->dweight, 0, nw * sizeof(float));
        memset(k->dbias, 0, (size_t)k->OC * sizeof(float));
        run(k, 0, ref);
        run(k, 1, ref);
        const float *src[4] = {k->out, k->dinp, k->dweight, k->dbias};
        const size_t len[4] = {nout, ninp, nw, (size_t)k->OC};
        for (int j = 0; j < 4; j++) {
            buf[ref][j] = malloc(len[j] * sizeof(float));
            memcpy(buf[ref][j], src[j], len[j] * sizeof(float));
        }
    }
    const size_t len[4] = {nout, ninp, nw, (size_t)k->OC};
    int same = 1;
    for (int j = 0; j < 4; j++) {
        same &= memcmp(buf[0][j], buf[1][j], len[j] * sizeof(float)) == 0;
        free(buf[0][j]);
        free(buf[1][j]);
    }
    return same;
}

int main(int argc, char **argv) {
    const double min_s = argc > 1 ? atof(argv[1]) : 0.2;
    static const int shapes[][2] = {
        {128, 384}, {128, 128}, {128, 512}, {512, 128}, {128, 256}};
    static const int rows[] = {256, 1024};
    enum { NSHAPE = 5, NROWS = 2, NCASE = NSHAPE * NROWS };
    double res[NCASE][4];
    int bits[NCASE];
    omp_set_dynamic(0);
    omp_set_num_threads(1);

    printf("%5s %4s %4s | %9s %9s %7s | %9s %9s %7s | %s\n", "N", "C", "OC",
           "fwd GF/s", "ref GF/s", "speedup", "bwd GF/s", "ref GF/s",
           "speedup", "bitwise");
    double lf = 0.0, lb = 0.0;
    int all_bits = 1;
    for (int i = 0; i < NCASE; i++) {
        unsigned seed = 7u + (unsigned)i;
        case_t k = {.N = rows[i / NSHAPE], .C = shapes[i % NSHAPE][0],
                    .OC = shapes[i % NSHAPE][1]};
        const size_t nout = (size_t)k.N * k.OC, ninp = (size_t)k.N * k.C,
                     nw = (size_t)k.OC * k.C;
        k.inp = filled(ninp, &seed);
        k.weight = filled(nw, &seed);
        k.bias = filled((size_t)k.OC, &seed);
        k.dout = filled(nout, &seed);
        k.out = filled(nout, &seed);
        k.dinp = filled(ninp, &seed);
        k.dweight = filled(nw, &seed);
        k.dbias = filled((size_t)k.OC, &seed);

        bits[i] = same_bits(&k);
        all_bits &= bits[i];
        const double mac = (double)k.N * k.C * k.OC;
        const double ffwd = 2.0 * mac + (double)nout;
        const double fbwd = 4.0 * mac + (double)nout;
        double best[4];
        time_case(&k, min_s, best);
        for (int j = 0; j < 4; j++) {
            res[i][j] = (j < 2 ? ffwd : fbwd) / best[j] * 1e-9;
        }
        lf += log(res[i][0] / res[i][1]);
        lb += log(res[i][2] / res[i][3]);
        printf("%5d %4d %4d | %9.2f %9.2f %6.2fx | %9.2f %9.2f %6.2fx | %s\n",
               k.N, k.C, k.OC, res[i][0], res[i][1], res[i][0] / res[i][1],
               res[i][2], res[i][3], res[i][2] / res[i][3],
               bits[i] ? "yes" : "NO");
        float *bufs[] = {k.inp, k.weight, k.bias, k.dout,
                         k.out, k.dinp, k.dweight, k.dbias};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) free(bufs[j]);
    }

    printf("{\"bench\":\"gpt2_matmul\",\"threads\":1,\"results\":[");
    for (int i = 0; i < NCASE; i++) {
        printf("%s{\"N\":%d,\"C\":%d,\"OC\":%d,\"fwd_gflops\":%.3f,"
               "\"fwd_ref_gflops\":%.3f,\"fwd_speedup\":%.3f,"
               "\"bwd_gflops\":%.3f,\"bwd_ref_gflops\":%.3f,"
               "\"bwd_speedup\":%.3f,\"bitwise\":%s}",
               i ? "," : "", rows[i / NSHAPE], shapes[i % NSHAPE][0],
               shapes[i % NSHAPE][1], res[i][0], res[i][1],
               res[i][0] / res[i][1], res[i][2], res[i][3],
               res[i][2] / res[i][3], bits[i] ? "true" : "false");
    }
    printf("],\"geomean_fwd_speedup\":%.3f,\"geomean_bwd_speedup\":%.3f,"
           "\"all_bitwise\":%s}\n",
           exp(lf / NCASE), exp(lb / NCASE), all_bits ? "true" : "false");
    return all_bits ? 0 : 1;
}
