/*
 * bench_optimizer.c — `tools/zs bench optimizer`: the CPU AdamW against the
 * memory-bandwidth limit of its own access pattern, in one run.
 *
 * At N fp32 parameters (default 64M: 1 GiB of parameters, gradients and
 * two moments, far beyond any cache), each repetition runs, in turn:
 *   same_bytes  a trivial kernel with AdamW's traffic: read p, g, m, v and
 *               write p, m, v (28 bytes per parameter), all threads;
 *   triad       STREAM's a = b + s*c (12 bytes per element), all threads;
 *   ours        zs_optim_adamw_fast, all threads;
 *   scalar      a plain C AdamW loop (-O2, not vectorized, one thread).
 * Times are the median of the repetitions (interleaved, so drift hits all
 * alike). Ends with one JSON line.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zeroshard.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The same bytes as AdamW, almost no arithmetic. */
__attribute__((noinline)) static void same_bytes(float* restrict p,
                                                 const float* restrict g,
                                                 float* restrict m,
                                                 float* restrict v, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float gi = g[i];
    const float mi = m[i] + gi, vi = v[i] + gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + mi + vi;
  }
}

__attribute__((noinline)) static void triad(float* restrict a,
                                            const float* restrict b,
                                            const float* restrict c, float s,
                                            size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

/* A naive scalar AdamW (what a first C port would be). */
__attribute__((noinline, optimize("no-tree-vectorize"))) static void scalar(
    float* p, const float* g, float* m, float* v, size_t n, float lr,
    float b1, float b2, float eps, float wd, int step) {
  const float bc1 = 1.0f - powf(b1, (float)step);
  const float bc2 = 1.0f - powf(b2, (float)step);
  for (size_t i = 0; i < n; i++) {
    p[i] *= 1.0f - lr * wd;
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] -= lr / bc1 * m[i] / (sqrtf(v[i]) / sqrtf(bc2) + eps);
  }
}

int main(int argc, char** argv) {
  size_t n = (size_t)64 << 20;
  int reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--params") && i + 1 < argc) {
      char* end = NULL;
      const char* v = argv[++i];
      double x = strtod(v, &end);
      if (end == v || *end != '\0' || !(x >= 1 && x <= 4e9) ||
          x != (double)(long long)x) {
        fprintf(stderr, "bench_optimizer: --params: expected a whole number "
                "1..4e9, got '%s'\n", v);
        return 2;
      }
      n = (size_t)x;
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      char* end = NULL;
      const char* v = argv[++i];
      long x = strtol(v, &end, 10);
      if (end == v || *end != '\0' || x < 1 || x > 100) {
        fprintf(stderr, "bench_optimizer: --reps: expected a whole number "
                "1..100, got '%s'\n", v);
        return 2;
      }
      reps = (int)x;
    } else {
      fprintf(stderr, "usage: bench_optimizer [--params N] [--reps R]\n");
      return 2;
    }
  }
  /* The four arrays are touched whole: refuse what the machine's memory
   * cannot hold (the kernel would kill the process part-way instead). */
  const double need = 4.0 * (double)n * sizeof(float);
  const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (ram > 0 && need > 0.8 * ram) {
    fprintf(stderr, "bench_optimizer: --params %zu needs %.1f GB (4 fp32 "
            "arrays), more than 80%% of this machine's %.1f GB of memory\n",
            n, need / 1e9, ram / 1e9);
    return 2;
  }
  float* p = (float*)aligned_alloc(64, n * sizeof(float) + 64);
  float* g = (float*)aligned_alloc(64, n * sizeof(float) + 64);
  float* m = (float*)aligned_alloc(64, n * sizeof(float) + 64);
  float* v = (float*)aligned_alloc(64, n * sizeof(float) + 64);
  if (!p || !g || !m || !v) {
    fprintf(stderr, "bench_optimizer: cannot allocate 4 x %zu floats\n", n);
    return 1;
  }
  /* First touch by the threads that will use the pages. */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    p[i] = 0.01f * (float)(i % 1000);
    g[i] = 1e-3f * (float)((i * 7) % 1000) - 0.5f;
    m[i] = 0.0f;
    v[i] = 0.0f;
  }
  const int threads = omp_get_max_threads();
  zs_adam_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 0.01};
  double* t[4];
  for (int k = 0; k < 4; k++) t[k] = (double*)calloc((size_t)reps, sizeof(double));
  int step = 1;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    same_bytes(p, g, m, v, n);
    t[0][r] = now() - t0;
    t0 = now();
    triad(p, g, m, 0.5f, n);
    t[1][r] = now() - t0;
    t0 = now();
    if (zs_optim_adamw_fast(p, g, m, v, n, &hp, step++, 0) != ZS_OK) {
      fprintf(stderr, "bench_optimizer: %s\n", zs_last_error());
      return 1;
    }
    t[2][r] = now() - t0;
    t0 = now();
    scalar(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
    t[3][r] = now() - t0;
    /* keep the values finite and the moments in range */
    for (size_t i = 0; i < n; i += 4096) if (!isfinite(p[i])) p[i] = 0.0f;
  }
  const double same = median(t[0], reps), tri = median(t[1], reps),
               ours = median(t[2], reps), sc = median(t[3], reps);
  const double N = (double)n;
  printf("{\"bench\":\"optimizer\",\"params\":%zu,\"threads\":%d,\"reps\":%d,"
         "\"same_bytes_gparams_s\":%.4f,\"same_bytes_GBps\":%.3f,"
         "\"stream_triad_GBps\":%.3f,\"ours_gparams_s\":%.4f,"
         "\"ours_GBps\":%.3f,\"scalar_gparams_s\":%.4f,"
         "\"ratio_to_bandwidth\":%.3f,\"ratio_to_stream\":%.3f,"
         "\"ratio_to_scalar\":%.2f,\"goal\":{\"ratio_to_bandwidth\":0.85}}\n",
         n, threads, reps, N / same / 1e9, 28 * N / same / 1e9,
         12 * N / tri / 1e9, N / ours / 1e9, 28 * N / ours / 1e9,
         N / sc / 1e9, same / ours, (28 * N / ours) / (12 * N / tri),
         sc / ours);
  for (int k = 0; k < 4; k++) free(t[k]);
  free(p);
  free(g);
  free(m);
  free(v);
  return 0;
}
