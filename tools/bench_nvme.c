/*
 * bench_nvme.c — tools/zs bench nvme: NVMe offload against the disk, in one
 * run, on one path:
 *   raw      sequential O_DIRECT write and read of the swap volume with
 *            liburing alone (fio's method: block-size requests, queue-depth
 *            in flight), the device's bandwidth here;
 *   swap     our swap-out and swap-in of the same bytes (offload/aio
 *            through the engine's ring of pinned slots, sub-group by
 *            sub-group, as the optimizer step moves them);
 *   step     zs_step of an AdamW model with NVMe offload (fp32: two states
 *            per parameter on disk) against its disk-bound lower bound:
 *            the states must be read and written once, so the step takes
 *            at least the time the device itself needs to read and write
 *            those bytes together (measured with liburing alone, the same
 *            block size and queue depth); the ideal overlap (the slower
 *            direction alone) and the serial bound (their sum) are
 *            printed too.
 * --reps repetitions (default 7), each running the raw passes and ours
 * back to back in alternating order; the ratios are medians of the
 * per-repetition ratios. Ends with one JSON line (ratio_to_raw_read,
 * ratio_to_raw_write: goal >= 0.85; step_vs_bound: goal <= 1.2). Numbers
 * are this machine's: shared machines are noisy, only ratios within one
 * run mean something. Buffers on both sides are in transparent huge pages
 * where the kernel gives them (the engine's allocator asks for them).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <zeroshard.h>

#include "offload/aio.h"
#include "offload/offload.h"
#include "offload/swap.h"
#include "runtime/layout/layout.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v): the middle value, or the mean of the
 * two middle ones for an even n. */
static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* s as a JSON string body (quotes, backslashes and control characters
 * escaped) into out (cap bytes, truncated). */
static const char* json_escape(const char* s, char* out, size_t cap) {
  size_t k = 0;
  for (; *s != '\0' && k + 7 < cap; s++) {
    const unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[k++] = '\\';
      out[k++] = (char)c;
    } else if (c < 0x20) {
      k += (size_t)snprintf(out + k, cap - k, "\\u%04x", c);
    } else {
      out[k++] = (char)c;
    }
  }
  out[k] = '\0';
  return out;
}

/* The median of v[0..n) and its range (sorts v). */
static double median_range(double* v, int n, double* lo, double* hi) {
  const double m = median(v, n);
  *lo = v[0];
  *hi = v[n - 1];
  return m;
}

/* What the bench has made, so that every exit (an error, or Ctrl-C and
 * SIGTERM, taken between passes) removes it: the raw file, our swap file
 * (through its queue) and the model's context (its swap directory). */
static struct {
  char raw[4096];
  int fd;
  zs__aio* aio;
  zs__aio_file* swap;
  zs_context* ctx;
  zs_model* model;
} g = {"", -1, NULL, NULL, NULL, NULL};
static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) { g_stop = sig; }

static void cleanup(void) {
  zs_model_destroy(g.model);
  zs_context_destroy(g.ctx);
  zs__aio_destroy(g.aio); /* waits for what is in flight */
  zs__aio_file_close(g.swap, 1);
  if (g.fd >= 0) close(g.fd);
  if (g.raw[0] != '\0') unlink(g.raw);
  memset(&g, 0, sizeof g);
  g.fd = -1;
}

static void die(const char* what) {
  fprintf(stderr, "zs bench nvme: %s\n", what);
  cleanup();
  exit(1);
}

/* Between passes: a signal received meanwhile ends the bench cleanly. */
static void check_stop(void) {
  if (g_stop) die(g_stop == SIGINT ? "interrupted (SIGINT)" : "terminated");
}

enum { RAW_READ = 0, RAW_WRITE = 1, RAW_MIXED = 2 };

/* Sequential direct I/O of `bytes` in `block` requests, `qd` in flight,
 * with liburing alone: reads, writes, or (RAW_MIXED) the step's traffic,
 * `bytes` read and `bytes` written at the same time (alternating
 * requests; the writes trail the reads by half the file so that no block
 * is read and written at once): the time the device needs for what the
 * step moves, reads and writes overlapping as well as it allows. Returns
 * seconds, or -1. */
static double raw_pass(int fd, int mode, char* buf, size_t bytes,
                       size_t block, int qd) {
  struct io_uring ring;
  if (io_uring_queue_init((unsigned)qd, &ring, 0) != 0) return -1;
  const double t0 = now();
  const size_t n = bytes / block, total = mode == RAW_MIXED ? 2 * n : n;
  size_t next = 0;
  int inflight = 0;
  /* each transfer in flight has its own buffer, as in fio (one per I/O
   * unit): transfers sharing one would find it in the CPU's cache and
   * flatter the baseline */
  int* free_bufs = (int*)malloc((size_t)qd * sizeof *free_bufs);
  if (free_bufs == NULL) {
    io_uring_queue_exit(&ring);
    return -1;
  }
  int nfree = qd;
  for (int i = 0; i < qd; i++) free_bufs[i] = i;
  while (next < total || inflight > 0) {
    while (inflight < qd && next < total) {
      struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const int bi = free_bufs[--nfree];
      char* b = buf + (size_t)bi * block;
      int write = mode == RAW_WRITE;
      size_t at = next;
      if (mode == RAW_MIXED) {
        write = next % 2;
        at = write ? (next / 2 + n / 2) % n : next / 2;
      }
      if (write) io_uring_prep_write(sqe, fd, b, (unsigned)block, at * block);
      else io_uring_prep_read(sqe, fd, b, (unsigned)block, at * block);
      io_uring_sqe_set_data64(sqe, (uint64_t)bi);
      next++;
      inflight++;
    }
    io_uring_submit(&ring);
    struct io_uring_cqe* cqe;
    int rc;
    do rc = io_uring_wait_cqe(&ring, &cqe);
    while (rc == -EINTR);
    if (rc != 0 || cqe->res != (int)block) {
      free(free_bufs);
      io_uring_queue_exit(&ring);
      return -1;
    }
    free_bufs[nfree++] = (int)io_uring_cqe_get_data64(cqe);
    io_uring_cqe_seen(&ring, cqe);
    inflight--;
  }
  const double t = now() - t0;
  free(free_bufs);
  io_uring_queue_exit(&ring);
  return t;
}

/* Our swap path: sub-groups of `group` bytes, `fields` regions each,
 * through the engine's ring of `nslots` slots (as many sub-groups in
 * flight), each region split into block-size transfers by offload/aio. */
static double swap_pass(zs__aio* a, zs__aio_file* f, int write,
                        void* const slots[][4], int nslots, size_t bytes,
                        size_t group, int fields) {
  const double t0 = now();
  const size_t per_field = bytes / (size_t)fields;
  const size_t groups = per_field / group;
  uint64_t ticket[ZS__SWAP_MAX_SLOTS] = {0};
  for (size_t k = 0; k < groups; k++) {
    const int s = (int)(k % (size_t)nslots);
    if (zs__aio_wait_until(a, ticket[s]) != ZS_OK) return -1;
    for (int i = 0; i < fields; i++)
      /* the engine's layout: a sub-group's fields side by side */
      if (zs__aio_submit(a, f, write, slots[s][i], group,
                         ((uint64_t)k * fields + (uint64_t)i) * group) != ZS_OK)
        return -1;
    ticket[s] = zs__aio_last_ticket(a);
  }
  if (zs__aio_wait(a) != ZS_OK) return -1;
  return now() - t0;
}

static zs_status fill(void* user, int tensor, const zs_tensor_desc* d,
                      void* data) {
  (void)user;
  (void)tensor;
  float* w = (float*)data;
  for (size_t i = 0; i < d->numel; i++) w[i] = 0.001f * (float)(i % 1000);
  return ZS_OK;
}

/* One zs_step of the bench model (a gradient of 1e-3 everywhere, written
 * outside the timed region); seconds. */
static double step_time(zs_model* m, int u, int t, size_t params) {
  float* g = NULL;
  if (zs_unit_gather(m, u) != ZS_OK || zs_unit_grad_acquire(m, u) != ZS_OK ||
      zs_tensor_grad(m, t, (void**)&g) != ZS_OK)
    die(zs_last_error());
  for (size_t i = 0; i < params; i++) g[i] = 1e-3f;
  if (zs_unit_grad_release(m, u) != ZS_OK || zs_unit_release(m, u) != ZS_OK)
    die(zs_last_error());
  const double t0 = now();
  if (zs_step(m, NULL) != ZS_OK) die(zs_last_error());
  return now() - t0;
}

/* A flag's value as a whole number in [lo, hi], or exit 2 naming it. */
static double arg_num(const char* flag, const char* v, double lo, double hi) {
  char* end = NULL;
  const double x = strtod(v, &end);
  if (end == v || *end != '\0' || !(x >= lo && x <= hi) || x != (double)(long long)x) {
    fprintf(stderr, "zs bench nvme: %s: expected a whole number %.0f..%.0f, "
            "got '%s'\n", flag, lo, hi, v);
    exit(2);
  }
  return x;
}

int main(int argc, char** argv) {
  const char* path = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
  size_t params = (size_t)32 << 20, block = (size_t)1 << 20;
  int qd = 16, reps = 7;
  for (int i = 1; i < argc; i++) {
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--path") && v) path = argv[++i];
    else if (!strcmp(argv[i], "--params") && v)
      params = (size_t)arg_num(argv[i], argv[i + 1], 1, 1e12), i++;
    else if (!strcmp(argv[i], "--block-size") && v)
      block = (size_t)arg_num(argv[i], argv[i + 1], 1, 1 << 30), i++;
    else if (!strcmp(argv[i], "--queue-depth") && v)
      qd = (int)arg_num(argv[i], argv[i + 1], 1, 4096), i++;
    else if (!strcmp(argv[i], "--reps") && v)
      reps = (int)arg_num(argv[i], argv[i + 1], 1, 32), i++;
    else {
      fprintf(stderr, "usage: %s [--path DIR] [--params N] [--block-size B] "
              "[--queue-depth Q] [--reps R]\n(--params is rounded down to "
              "whole 16 MiB sub-groups per state, at least one: multiples "
              "of 4194304)\n", argv[0]);
      return 2;
    }
  }
  char why[4096 + 256] = "";
  if (block < 4096 || block % 4096)
    snprintf(why, sizeof why, "--block-size must be a multiple of 4096 bytes, got %zu", block);
  else if (qd < 1 || qd > 4096)
    snprintf(why, sizeof why, "--queue-depth must be 1..4096, got %d", qd);
  else if (reps < 1 || reps > 32)
    snprintf(why, sizeof why, "--reps must be 1..32, got %d", reps);
  else if (params < block / 4)
    snprintf(why, sizeof why, "--params must be at least a block's worth "
             "(%zu parameters for --block-size %zu), got %zu", block / 4,
             block, params);
  if (why[0] != '\0') {
    fprintf(stderr, "zs bench nvme: %s\n", why);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  const size_t group = (size_t)16 << 20; /* the engine's default sub-group
                                            (nvme.buffer_size) */
  if (params < group / 4) params = group / 4;
  params = params / (group / 4) * (group / 4); /* whole sub-groups per field
                                                 (printed below) */
  const int fields = 2;                       /* AdamW on fp32: m, v */
  const size_t bytes = params * sizeof(float) * fields;
  char file[4096];
  snprintf(file, sizeof file, "%s/zs-bench-nvme-%d.raw", path, (int)getpid());

  /* ---- raw ---- */
  int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  if (fd < 0) {
    const int e = errno;
    /* Linux may create the file before it refuses O_DIRECT (ramfs); the
     * name is this process's and O_EXCL did not fail, so it is ours */
    if (e == EINVAL) unlink(file);
    snprintf(why, sizeof why, "cannot create %s with O_DIRECT: %s%s", file,
             strerror(e), e == EINVAL ? " (this file system does not support "
             "O_DIRECT, and the bench measures the disk without the page "
             "cache: give --path a directory on a disk)" : "");
    die(why);
  }
  g.fd = fd;
  snprintf(g.raw, sizeof g.raw, "%s", file);
  if (fallocate(fd, 0, 0, (off_t)bytes) != 0) {
    snprintf(why, sizeof why, "cannot reserve %zu bytes for %s: %s", bytes,
             file, strerror(errno));
    die(why);
  }
  /* The raw passes' buffers in huge pages, as the engine's pool is (see
   * below), where the kernel gives them: the device's bandwidth at its
   * best, not a baseline slowed by 4 KiB-page pinning. */
  const size_t rawbytes = (size_t)qd * block;
  char* buf = (char*)mmap(NULL, rawbytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) die("memory");
  (void)madvise(buf, rawbytes, MADV_HUGEPAGE);
  memset(buf, 0x5a, rawbytes);
  double rw[32], rr[32], sw[32], sr[32], st[32], rm[32];
  double ratio_w[32], ratio_r[32], ratio_step[32];

  /* ---- our swap path ---- */
  char swapfile[4096];
  snprintf(swapfile, sizeof swapfile, "%s/zs-bench-nvme-%d.swap", path,
           (int)getpid());
  if (zs__aio_create(qd, block, ZS__AIO_AUTO, &g.aio) != ZS_OK ||
      zs__aio_file_create(g.aio, swapfile, bytes, &g.swap) != ZS_OK)
    die(zs_last_error());
  zs__aio* a = g.aio;
  zs__aio_file* f = g.swap;
  /* the engine's ring for the default pool (zs_config.nvme.buffer_count),
   * from the engine's allocator (NUMA-placed, huge pages, pinned if it
   * can) */
  zs_config defaults; /* readable: the macro leaves the fields UNSET */
  if (zs_config_init(&defaults) != ZS_OK) die(zs_last_error());
  const int nslots = zs__layout_nvme_slots(defaults.nvme.buffer_count, fields);
  zs__accounting* acct = NULL;
  zs__offload* pool = NULL;
  if (zs__accounting_create(&acct) != ZS_OK ||
      zs__offload_create(&defaults, 0, NULL, acct, &pool) != ZS_OK)
    die(zs_last_error());
  void* slots[ZS__SWAP_MAX_SLOTS][4] = {{0}};
  for (int s = 0; s < nslots; s++)
    for (int i = 0; i < fields; i++)
      if (zs__offload_alloc_as(pool, group, "bench slot", ZS_MEM_NVME_STAGING,
                               &slots[s][i]) != ZS_OK)
        die(zs_last_error());

  /* ---- the optimizer step with NVMe offload ---- */
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.offload_optimizer.device = ZS_OFFLOAD_NVME;
  cfg.nvme.path = path;
  cfg.nvme.block_size = block;
  cfg.nvme.queue_depth = qd;
  cfg.log_level = ZS_LOG_ERROR;
  int u = -1, t = -1;
  int64_t n = (int64_t)params;
  if (zs_context_create_local(&cfg, &g.ctx) != ZS_OK ||
      zs_model_create(g.ctx, &g.model) != ZS_OK)
    die(zs_last_error());
  zs_model* m = g.model;
  if (zs_model_add_unit(m, "u", &u) != ZS_OK ||
      zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t) != ZS_OK ||
      zs_model_finalize(m) != ZS_OK || zs_model_init(m, fill, NULL) != ZS_OK)
    die(zs_last_error());
  (void)step_time(m, u, t, params); /* warm-up */
  check_stop();

  /* Each ratio compares neighbours of one repetition, in alternating order
   * (raw first in even repetitions, ours first in odd ones), so that the
   * device's drift on a shared machine (measured here: passes of the same
   * code vary by up to 2x within a minute) and any cost of following the
   * other pass fall on both sides equally; the reported ratios are the
   * medians of the per-repetition ratios. */
  for (int r = 0; r < reps; r++) {
    const int raw_first = r % 2 == 0;
    for (int pass = 0; pass < 2; pass++) {
      if ((pass == 0) == raw_first) {
        rw[r] = raw_pass(fd, RAW_WRITE, buf, bytes, block, qd);
        rr[r] = raw_pass(fd, RAW_READ, buf, bytes, block, qd);
        rm[r] = raw_pass(fd, RAW_MIXED, buf, bytes, block, qd);
        if (rw[r] < 0 || rr[r] < 0 || rm[r] < 0) die("raw I/O failed");
        check_stop();
      } else {
        sw[r] = swap_pass(a, f, 1, slots, nslots, bytes, group, fields);
        sr[r] = swap_pass(a, f, 0, slots, nslots, bytes, group, fields);
        if (sw[r] < 0 || sr[r] < 0) die(zs_last_error());
        st[r] = step_time(m, u, t, params);
        check_stop();
      }
    }
    ratio_w[r] = rw[r] / sw[r];
    ratio_r[r] = rr[r] / sr[r];
    ratio_step[r] = st[r] / rm[r];
  }
  const char* aio = zs__aio_backend_name(a);
  cleanup();
  munmap(buf, rawbytes);
  for (int s = 0; s < nslots; s++)
    for (int i = 0; i < fields; i++) zs__offload_free(pool, slots[s][i]);
  zs__offload_destroy(pool);
  zs__accounting_destroy(acct);

  const double GB = 1e9;
  /* the ratios first: median() sorts its array */
  double lo_w, hi_w, lo_r, hi_r, lo_s, hi_s;
  const double q_w = median_range(ratio_w, reps, &lo_w, &hi_w);
  const double q_r = median_range(ratio_r, reps, &lo_r, &hi_r);
  const double q_s = median_range(ratio_step, reps, &lo_s, &hi_s);
  const double raw_w = bytes / median(rw, reps) / GB, raw_r = bytes / median(rr, reps) / GB;
  const double swp_w = bytes / median(sw, reps) / GB, swp_r = bytes / median(sr, reps) / GB;
  const double step = median(st, reps);
  const double tr = bytes / GB / raw_r, tw = bytes / GB / raw_w;
  /* Three lower bounds for the step's disk traffic (the states read once
   * and written once): the device's own time for that traffic, measured
   * (reads and writes together, as the step issues them: the bound the
   * goal uses); the ideal overlap (the slower direction alone, reached
   * only by a device that reads and writes at full speed at once); and
   * the serial sum. */
  const double mixed = median(rm, reps);
  const double ideal = tr > tw ? tr : tw, serial = tr + tw;
  printf("path %s, %zu parameters (AdamW fp32: %zu bytes of states), "
         "%zu-byte blocks, queue depth %d, %s I/O, %d repetitions "
         "(medians; ratios: the median of each repetition's ratio, its "
         "range in brackets, which noise can set apart from the quotient "
         "of the medians)\n",
         path, params, bytes, block, qd, aio, reps);
  printf("raw O_DIRECT (liburing): write %.3f GB/s, read %.3f GB/s; both "
         "at once %.3f s for the step's bytes (%.3f GB/s each way)\n",
         raw_w, raw_r, mixed, bytes / mixed / GB);
  printf("our swap-out %.3f GB/s (%.2f of raw [%.2f..%.2f]), swap-in %.3f "
         "GB/s (%.2f of raw [%.2f..%.2f])\n",
         swp_w, q_w, lo_w, hi_w, swp_r, q_r, lo_r, hi_r);
  printf("optimizer step with NVMe offload %.3f s; disk-bound lower bound "
         "%.3f s (the device reading and writing the states at once, "
         "measured): %.2fx [%.2f..%.2f]; %.2fx the ideal overlap %.3f s, "
         "%.2fx the serial bound %.3f s\n",
         step, mixed, q_s, lo_s, hi_s, step / ideal, ideal, step / serial,
         serial);
  char jpath[6 * 4096 + 8];
  printf("{\"bench\": \"nvme\", \"path\": \"%s\", \"params\": %zu, \"bytes\": %zu, "
         "\"block_size\": %zu, \"queue_depth\": %d, \"aio\": \"%s\", "
         "\"reps\": %d, "
         "\"raw_write_GBps\": %.4f, \"raw_read_GBps\": %.4f, "
         "\"raw_mixed_s\": %.4f, "
         "\"swap_out_GBps\": %.4f, \"swap_in_GBps\": %.4f, "
         "\"ratio_to_raw_write\": %.4f, \"ratio_to_raw_read\": %.4f, "
         "\"step_s\": %.4f, \"step_bound_s\": %.4f, \"step_vs_bound\": %.4f, "
         "\"step_vs_ideal_overlap\": %.4f, \"step_vs_serial_bound\": %.4f}\n",
         json_escape(path, jpath, sizeof jpath), params, bytes, block, qd,
         aio, reps, raw_w, raw_r, mixed, swp_w, swp_r, q_w, q_r, step, mixed,
         q_s, step / ideal, step / serial);
  return 0;
}
