/*
 * bench_comm.c — tools/zs bench comm: ZeroShard's host collectives against
 * Open MPI's and against memcpy, in one run, under mpirun.
 *
 * For all-gather, reduce-scatter and all-reduce of fp32, sizes 1 KiB ..
 * 256 MiB (nccl-tests' size: the all-gather's output, the reduce-scatter's
 * input, the all-reduce's buffer), three contenders:
 *   zs       ZeroShard's collective as the engine issues it (zs__comm_i*,
 *            then zs__coll_wait; the reduce-scatter in the fixed rank
 *            order) on the host collectives chosen (--host-collectives
 *            shm, the default, or mpi);
 *   mpi      the raw MPI call with Open MPI's default settings:
 *            MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce;
 *   memcpy   every rank at once copies the bytes a rank must receive
 *            (nccl-tests' bus bytes: (W-1)/W of the size, twice that for
 *            the all-reduce) from one private buffer to another: the
 *            memory system's bound on this machine, now.
 * Each repetition (--reps, default 7) runs the three back to back, in an
 * order that rotates per repetition; a contender's time is the slowest
 * rank's mean over the repetition's iterations (as many as move about
 * 256 MiB, at least one). The table (nccl-tests'
 * columns: size, count, type, redop, time in us, algbw and busbw in GB/s)
 * shows medians; the ratios zs/mpi and zs/memcpy (busbw) are medians of
 * the per-repetition ratios, with their range. Results are checked
 * (#wrong: elements that differ from the exact expected values) once per
 * size. Ends with one JSON line. Only ratios within one run mean
 * something: the machine is shared.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zeroshard.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/core/core_mem.h"
#include "runtime/device/device.h"

enum { AG = 0, RS = 1, AR = 2, NCOLL = 3 };
enum { ZS = 0, MPI = 1, MEMCPY = 2, NWHO = 3 };
static const char* const kColl[NCOLL] = {"all_gather", "reduce_scatter",
                                         "all_reduce"};

static int rank_, world_;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char* what) {
  fprintf(stderr, "bench comm (rank %d): %s: %s\n", rank_, what,
          zs_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
  zs__comm* c;
  size_t size;  /* bytes, nccl-tests' size */
  size_t count; /* elements per rank (AG, RS) or in all (AR) */
  float* send;
  float* recv;
  float* copy_src; /* memcpy contender */
  float* copy_dst;
  size_t copy_bytes;
} bench_t;

/* One run of `who` doing collective k. */
static void run_once(bench_t* b, int k, int who) {
  const size_t n = b->count;
  zs__coll* op = NULL;
  zs_status st = ZS_OK;
  int rc = MPI_SUCCESS;
  switch (who) {
    case ZS:
      if (k == AG)
        st = zs__comm_iall_gather(b->c, zs__tag(ZS__P_CHECK, -1, NULL),
                                  b->send, b->recv, n, ZS_FLOAT32, &op);
      else if (k == RS)
        st = zs__comm_ireduce_scatter(b->c, zs__tag(ZS__P_REDUCE, -1, NULL),
                                      ZS__REDUCE_FIXED, b->send, 0, n, n,
                                      b->recv, 1.0f, ZS_FLOAT32, &op);
      else
        st = zs__comm_iall_reduce(b->c, zs__tag(ZS__P_CHECK, -1, NULL),
                                  b->send, b->recv, n, ZS_FLOAT32,
                                  ZS__RED_SUM, &op);
      if (st == ZS_OK) st = zs__coll_wait(b->c, op);
      if (st != ZS_OK) die(kColl[k]);
      break;
    case MPI:
      if (k == AG)
        rc = MPI_Allgather(b->send, (int)n, MPI_FLOAT, b->recv, (int)n,
                           MPI_FLOAT, MPI_COMM_WORLD);
      else if (k == RS)
        rc = MPI_Reduce_scatter_block(b->send, b->recv, (int)n, MPI_FLOAT,
                                      MPI_SUM, MPI_COMM_WORLD);
      else
        rc = MPI_Allreduce(b->send, b->recv, (int)n, MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD);
      if (rc != MPI_SUCCESS) {
        fprintf(stderr, "bench comm: MPI %s failed (%d)\n", kColl[k], rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      break;
    case MEMCPY:
      memcpy(b->copy_dst, b->copy_src, b->copy_bytes);
      break;
  }
}

/* Seconds per call of the slowest rank over iters calls. */
static double timed(bench_t* b, int k, int who, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  for (int i = 0; i < iters; i++) run_once(b, k, who);
  double dt = (now() - t0) / iters, slowest = 0;
  MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

/* Inputs: rank r's element i is (r + 1) + (i % 7) * 0.25 (exact in fp32,
 * and so are the sums of up to 256 ranks); returns the elements of the
 * result that differ from the exact values, summed over ranks. */
static long check(bench_t* b, int k, int who) {
  const size_t n = b->count, W = (size_t)world_;
  const size_t in = k == AG ? n : k == RS ? n * W : n;
  for (size_t i = 0; i < in; i++)
    b->send[i] = (float)(rank_ + 1) + (float)(i % 7) * 0.25f;
  const size_t out = k == AG ? n * W : n;
  memset(b->recv, 0, out * sizeof(float));
  run_once(b, k, who);
  long wrong = 0;
  const double ranksum = (double)W * (W + 1) / 2;
  for (size_t i = 0; i < out; i++) {
    double want;
    if (k == AG)
      want = (double)(i / n + 1) + (double)((i % n) % 7) * 0.25;
    else if (k == RS)
      want = ranksum + (double)W * (double)((rank_ * n + i) % 7) * 0.25;
    else
      want = ranksum + (double)W * (double)(i % 7) * 0.25;
    wrong += (double)b->recv[i] != want;
  }
  long all = 0;
  MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  int reps = 7;
  size_t min_size = 1024, max_size = (size_t)256 << 20;
  zs_host_collectives mode = ZS_HOST_COLLECTIVES_SHM;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--min-bytes") == 0 && i + 1 < argc) {
      min_size = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc) {
      max_size = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--host-collectives") == 0 && i + 1 < argc) {
      const char* m = argv[++i];
      if (strcmp(m, "shm") == 0) mode = ZS_HOST_COLLECTIVES_SHM;
      else if (strcmp(m, "mpi") == 0) mode = ZS_HOST_COLLECTIVES_MPI;
      else { reps = -1; break; }
    } else {
      reps = -1;
      break;
    }
  }
  if (reps < 1 || reps > 1000 || min_size < 4 || max_size < min_size ||
      max_size > ((size_t)1 << 31)) {
    if (rank_ == 0)
      fprintf(stderr, "usage: bench_comm [--reps 1..1000] [--min-bytes B] "
              "[--max-bytes B <= 2 GiB] [--host-collectives shm|mpi]\n");
    MPI_Finalize();
    return 2;
  }
  if (world_ < 2) {
    if (rank_ == 0)
      fprintf(stderr, "bench comm: run it under mpirun with 2 or more ranks "
              "(tools/zs bench comm does, at 4)\n");
    MPI_Finalize();
    return 2;
  }
  zs__accounting* acct = NULL;
  zs__device* dev = NULL;
  bench_t b = {0};
  size_t seg = 0;
  if (zs__accounting_create(&acct) != ZS_OK ||
      zs__device_host_create(acct, &dev) != ZS_OK ||
      zs__comm_mpi_create(MPI_COMM_WORLD, &b.c) != ZS_OK)
    die("setup");
  b.c->dev = dev;
  if (zs__comm_mpi_host_collectives(b.c, mode, &seg) != ZS_OK)
    die("host collectives");
  if (b.c->ops->start_progress != NULL) (void)b.c->ops->start_progress(b.c);
  const size_t W = (size_t)world_;
  /* the largest buffers: AG's output, RS's input */
  const size_t max_elems = max_size / sizeof(float);
  b.send = (float*)aligned_alloc(64, (max_elems + 64) * sizeof(float));
  b.recv = (float*)aligned_alloc(64, (max_elems + 64) * sizeof(float));
  b.copy_src = (float*)aligned_alloc(64, (max_elems * 2 + 64) * sizeof(float));
  b.copy_dst = (float*)aligned_alloc(64, (max_elems * 2 + 64) * sizeof(float));
  if (!b.send || !b.recv || !b.copy_src || !b.copy_dst) {
    fprintf(stderr, "bench comm: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(b.send, 0, max_elems * sizeof(float));
  memset(b.recv, 0, max_elems * sizeof(float));
  memset(b.copy_src, 1, max_elems * 2 * sizeof(float));
  memset(b.copy_dst, 0, max_elems * 2 * sizeof(float));
  if (rank_ == 0) {
    printf("# ZeroShard host collectives (%s, %s) vs Open MPI's vs memcpy: "
           "%d ranks, fp32, %d repetitions, medians\n",
           b.c->ops->name, seg > 0 ? "shared-memory segment" : "MPI",
           world_, reps);
    printf("# %-10s %10s %6s %5s | %9s %7s %7s | %9s %7s %7s | %7s | %-20s "
           "%-20s %6s\n", "size", "count", "type", "redop", "zs:time",
           "algbw", "busbw", "mpi:time", "algbw", "busbw", "memcpy",
           "zs/mpi (range)", "zs/memcpy (range)", "#wrong");
    printf("# %-10s %10s %6s %5s | %9s %7s %7s | %9s %7s %7s | %7s |\n", "(B)",
           "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)",
           "(GB/s)", "(GB/s)", "busbw");
  }
  double* t = (double*)calloc((size_t)reps * NWHO, sizeof *t);
  double* r1 = (double*)calloc((size_t)reps, sizeof *r1);
  double* r2 = (double*)calloc((size_t)reps, sizeof *r2);
  char json[65536];
  size_t jn = 0;
  jn += (size_t)snprintf(json + jn, sizeof json - jn,
                         "{\"bench\": \"comm\", \"ranks\": %d, \"host_"
                         "collectives\": \"%s\", \"reps\": %d, \"rows\": [",
                         world_, seg > 0 ? "shm" : "mpi", reps);
  int first_row = 1;
  for (int k = 0; k < NCOLL; k++) {
    for (size_t size = min_size; size <= max_size; size *= 4) {
      /* per-rank count: AG's output and RS's input are size bytes */
      const size_t count = k == AR ? size / sizeof(float)
                                   : size / sizeof(float) / W;
      if (count == 0) continue;
      const size_t bytes = k == AR ? count * sizeof(float)
                                   : count * W * sizeof(float);
      b.size = bytes;
      b.count = count;
      const double factor = zs_busbw_factor(
          k == AG ? ZS_COLL_ALL_GATHER
                  : k == RS ? ZS_COLL_REDUCE_SCATTER : ZS_COLL_ALL_REDUCE,
          world_);
      b.copy_bytes = (size_t)((double)bytes * factor);
      long wrong = check(&b, k, ZS);
      /* iterations: about 256 MiB of data per timing, at least 1 */
      int iters = (int)(((size_t)256 << 20) / bytes);
      if (iters < 1) iters = 1;
      if (iters > 200) iters = 200;
      for (int w = 0; w < NWHO; w++) (void)timed(&b, k, w, 1); /* warm */
      for (int r = 0; r < reps; r++)
        for (int j = 0; j < NWHO; j++) {
          const int w = (j + r) % NWHO;
          t[r * NWHO + w] = timed(&b, k, w, iters);
        }
      double med[NWHO], busbw[NWHO];
      for (int w = 0; w < NWHO; w++) {
        double v[1000];
        for (int r = 0; r < reps; r++) v[r] = t[r * NWHO + w];
        med[w] = median(v, reps);
        busbw[w] = med[w] > 0 ? (double)bytes * factor / med[w] / 1e9 : 0;
      }
      /* paired ratios of busbw (= inverse time ratios) */
      double lo1 = 1e300, hi1 = 0, lo2 = 1e300, hi2 = 0;
      for (int r = 0; r < reps; r++) {
        r1[r] = t[r * NWHO + MPI] / t[r * NWHO + ZS];
        r2[r] = t[r * NWHO + MEMCPY] / t[r * NWHO + ZS];
        if (r1[r] < lo1) lo1 = r1[r];
        if (r1[r] > hi1) hi1 = r1[r];
        if (r2[r] < lo2) lo2 = r2[r];
        if (r2[r] > hi2) hi2 = r2[r];
      }
      const double m1 = median(r1, reps), m2 = median(r2, reps);
      if (rank_ == 0) {
        char a[32], c2[32];
        snprintf(a, sizeof a, "%.2f (%.2f-%.2f)", m1, lo1, hi1);
        snprintf(c2, sizeof c2, "%.2f (%.2f-%.2f)", m2, lo2, hi2);
        printf("  %-10zu %10zu %6s %5s | %9.1f %7.2f %7.2f | %9.1f %7.2f "
               "%7.2f | %7.2f | %-20s %-20s %6ld  %s\n",
               bytes, k == AR ? count : count * W, "float",
               k == AG ? "none" : "sum", med[ZS] * 1e6,
               (double)bytes / med[ZS] / 1e9, busbw[ZS], med[MPI] * 1e6,
               (double)bytes / med[MPI] / 1e9, busbw[MPI], busbw[MEMCPY], a,
               c2, wrong, kColl[k]);
        fflush(stdout);
        jn += (size_t)snprintf(
            json + jn, sizeof json - jn,
            "%s{\"op\": \"%s\", \"bytes\": %zu, \"zs_busbw\": %.3f, "
            "\"mpi_busbw\": %.3f, \"memcpy_busbw\": %.3f, \"zs_over_mpi\": "
            "%.3f, \"zs_over_mpi_range\": [%.3f, %.3f], \"zs_over_memcpy\": "
            "%.3f, \"zs_over_memcpy_range\": [%.3f, %.3f], \"wrong\": %ld}",
            first_row ? "" : ", ", kColl[k], bytes, busbw[ZS], busbw[MPI],
            busbw[MEMCPY], m1, lo1, hi1, m2, lo2, hi2, wrong);
        first_row = 0;
      }
    }
  }
  if (rank_ == 0) {
    snprintf(json + jn, sizeof json - jn,
             "], \"goal\": {\"bytes\": %d, \"reduce_scatter.zs_over_mpi\": "
             "4.0, \"all_gather.zs_over_mpi\": 1.5}}",
             64 << 20);
    printf("%s\n", json);
  }
  free(t);
  free(r1);
  free(r2);
  zs__comm_destroy(b.c);
  zs__device_destroy(dev);
  zs__accounting_destroy(acct);
  free(b.send);
  free(b.recv);
  free(b.copy_src);
  free(b.copy_dst);
  MPI_Finalize();
  return 0;
}
