/*
 * comm_shm.c — host collectives through a shared-memory segment
 * (comm_shm.h has the algorithm).
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "runtime/device/device.h"

/* A rank's control page: counters on cache lines of their own (each is a
 * futex other ranks sleep on), then what the others read about it. */
typedef struct zs__shm_ctrl {
  uint32_t written; /* last round whose piece is in the slot */
  char pad0[60];
  uint32_t read;    /* last round this rank finished reading */
  char pad1[60];
  uint32_t reduced; /* all-reduce: last round whose slice of the sum is in
                       this rank's slot */
  char pad2[60];
  int32_t pid;
  uint32_t gone;    /* 1: left (destroy), 2: gave up (abort) */
  uint64_t desc[2]; /* the collective of the last round per half */
  uint64_t extra[2]; /* ... its reduction and root */
  uint64_t pidns;   /* its pid namespace (the inode of /proc/self/ns/pid),
                       0 if unknown: pids are compared only within one */
  char why[256];    /* why it gave up */
  char host[64];    /* for messages */
} zs__shm_ctrl;

_Static_assert(sizeof(zs__shm_ctrl) <= ZS__SHM_CTRL_BYTES,
               "control page too small");

struct zs__shm_op {
  zs__shm_args a;
  size_t* offsets;     /* a.offsets' copy */
  zs__shm_op* next;    /* queue */
  int done;            /* atomic: the worker is finished with it */
  int stream;          /* copies into the output are non-temporal */
  zs_status status;
  char why[512];
};

struct zs__shm {
  int rank, world;
  int name_first, name_stride; /* rank r is named first + r * stride (the
                                  context's rank of a group's r-th) */
  int fd;              /* while opening; -1 after (the mapping stays) */
  char* base;          /* the mapping */
  size_t bytes;
  uint64_t round;      /* rounds completed (the same on every rank); the
                          shared counters hold its low 32 bits */
  int check_pids;      /* every rank's pid is visible from here */
  int pids_checked;    /* (looked at the first post) */
  pthread_t worker;
  int worker_on;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  zs__shm_op* head;    /* queued, oldest first */
  zs__shm_op* tail;
  int stop;            /* destroy: the worker exits once idle */
  int abort;           /* atomic: give up what is queued and running */
  zs_status broken;    /* a collective failed: every later one fails */
  char broken_why[512];
};

static zs__shm_ctrl* zs__shm_ctrl_of(const zs__shm* s, int r) {
  return (zs__shm_ctrl*)(s->base + (size_t)r * ZS__SHM_RANK_BYTES);
}

static char* zs__shm_half(const zs__shm* s, int r, uint32_t round) {
  return s->base + (size_t)r * ZS__SHM_RANK_BYTES + ZS__SHM_CTRL_BYTES +
         (size_t)(round & 1) * ZS__SHM_HALF_BYTES;
}

const char* zs__shm_dir(void) {
  const char* d = getenv("ZS_SHM_DIR");
  return d != NULL && d[0] != '\0' ? d : "/dev/shm";
}

static const char* zs__shm_kind_name(int kind) {
  static const char* const names[] = {"all-gather", "strided all-gather",
                                      "exchange", "reduce-scatter",
                                      "all-reduce", "broadcast"};
  return kind >= 0 && kind < 6 ? names[kind] : "(unknown collective)";
}

/* ---- Futex waits on the shared counters -------------------------------- */

/* A spin-wait hint to the core (x86 PAUSE, Arm YIELD). */
static inline void zs__shm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

/* Yields of a wait before it sleeps on the futex. */
#ifndef ZS__SHM_YIELDS
#define ZS__SHM_YIELDS 200
#endif

static void zs__shm_wake(uint32_t* addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void zs__shm_publish(uint32_t* addr, uint32_t v) {
  __atomic_store_n(addr, v, __ATOMIC_RELEASE);
  zs__shm_wake(addr);
}

/* (wrap-safe) v has reached target */
static int zs__shm_reached(uint32_t v, uint32_t target) {
  return (int32_t)(v - target) >= 0;
}

/* Whether process pid has ended: it does not exist, or it is a zombie
 * (its parent, the launcher, has not reaped it yet). */
static int zs__shm_pid_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')'); /* (the name may hold anything) */
  return p != NULL && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* "rank R (host H, pid P)", as the heartbeats name a rank. */
/* The context's rank of this segment's r-th rank (a group's: docs/running.md,
 * "Shard groups"). */
static int zs__shm_name(const zs__shm* s, int r) {
  return s->name_first + r * s->name_stride;
}

static void zs__shm_peer_name(const zs__shm* s, const zs__shm_ctrl* peer,
                              int r, char* buf, size_t cap) {
  char host[sizeof peer->host];
  memcpy(host, peer->host, sizeof host);
  host[sizeof host - 1] = '\0';
  snprintf(buf, cap, "rank %d (host %s, pid %d)", zs__shm_name(s, r), host,
           (int)peer->pid);
}

void zs__shm_set_rank_names(zs__shm* s, int first, int stride) {
  if (s == NULL) return;
  s->name_first = first;
  s->name_stride = stride;
}

/* Waits until rank r's counter at `field` reaches target. Fails (setting
 * op's status) when this rank aborts, r gave up or left without reaching
 * it, or r's process is gone. */
static zs_status zs__shm_wait(zs__shm* s, zs__shm_op* op, int r,
                              uint32_t* field, uint32_t target,
                              const char* what) {
  zs__shm_ctrl* peer = zs__shm_ctrl_of(s, r);
  double last_pid_check = 0, gave_up_seen = 0;
  for (unsigned spins = 0;; spins++) {
    uint32_t v = __atomic_load_n(field, __ATOMIC_ACQUIRE);
    if (zs__shm_reached(v, target)) return ZS_OK;
    if (spins < 64) {
      zs__shm_cpu_relax();
      continue;
    }
    /* then give the core to whoever may be about to write it (ranks may
     * outnumber the cores), for a while, before sleeping */
    if (spins < 64 + ZS__SHM_YIELDS) {
      sched_yield();
      continue;
    }
    if (__atomic_load_n(&s->abort, __ATOMIC_ACQUIRE)) {
      op->status = ZS_ERR_COMM;
      snprintf(op->why, sizeof op->why, "%s", s->broken_why);
      return op->status;
    }
    const uint32_t gone = __atomic_load_n(&peer->gone, __ATOMIC_ACQUIRE);
    const double now = zs__now();
    /* A rank that gave up sent its failure notice first (comm.c), which
     * names the collective it will not join: it is given a moment to
     * arrive, and this rank's abort to follow. */
    if (gone == 2 && gave_up_seen == 0) gave_up_seen = now;
    if (gone == 1 || (gone == 2 && now - gave_up_seen > 2.0)) {
      /* (its last counters may have come with its departure) */
      v = __atomic_load_n(field, __ATOMIC_ACQUIRE);
      if (zs__shm_reached(v, target)) return ZS_OK;
      char why[sizeof peer->why], name[128];
      memcpy(why, peer->why, sizeof why);
      why[sizeof why - 1] = '\0';
      zs__shm_peer_name(s, peer, r, name, sizeof name);
      op->status = ZS_ERR_REMOTE;
      if (gone == 1)
        snprintf(op->why, sizeof op->why,
                 "%s left the context (zs_context_destroy) while this rank "
                 "waited for it to %s in a shared-memory %s, so it joins no "
                 "collective any more: the ranks' calls differ (one ended "
                 "early)", name, what, zs__shm_kind_name(op->a.kind));
      else
        snprintf(op->why, sizeof op->why, "%s gave up a shared-memory %s: %s",
                 name, zs__shm_kind_name(op->a.kind), why);
      return op->status;
    }
    if (s->check_pids && now - last_pid_check > 0.25) {
      last_pid_check = now;
      if (zs__shm_pid_gone((pid_t)peer->pid)) {
        char name[128];
        zs__shm_peer_name(s, peer, r, name, sizeof name);
        op->status = ZS_ERR_REMOTE;
        snprintf(op->why, sizeof op->why,
                 "%s is gone: its process ended while this rank waited for "
                 "it to %s in a shared-memory %s",
                 name, what, zs__shm_kind_name(op->a.kind));
        return op->status;
      }
    }
    /* sleep until the counter moves (or 5 ms, to look again) */
    struct timespec ts = {0, 5000000};
    syscall(SYS_futex, field, FUTEX_WAIT, v, &ts, NULL, 0);
  }
}

/* ---- One collective ----------------------------------------------------- */

/* Outputs of at least this many bytes are written with non-temporal
 * stores: they would only push the segment out of the cache, and the
 * stores skip reading the destination lines first (a third less memory
 * traffic for a copy). Smaller ones stay in the cache for their reader. */
#define ZS__SHM_STREAM_BYTES ((size_t)4 << 20)

#ifdef __SSE2__
#include <emmintrin.h>
static void zs__shm_copy_stream(void* dst, const void* src, size_t n) {
  char* d = (char*)dst;
  const char* s = (const char*)src;
  const size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (n < head + 64) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128((const __m128i*)(s + i));
    const __m128i b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    const __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32));
    const __m128i e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a);
    _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c);
    _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  memcpy(d + i, s + i, n - i);
}
static void zs__shm_stream_fence(void) { _mm_sfence(); }
#else
static void zs__shm_copy_stream(void* dst, const void* src, size_t n) {
  memcpy(dst, src, n);
}
static void zs__shm_stream_fence(void) {}
#endif

/* Copies a piece into the op's output. */
static void zs__shm_out(const zs__shm_op* op, void* dst, const void* src,
                        size_t n) {
  if (op->stream) zs__shm_copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}

/* Elements per round per rank (and per destination for the exchange and
 * reduce-scatter). */
static size_t zs__shm_piece(const zs__shm* s, const zs__shm_args* a) {
  const size_t e = zs_dtype_size(a->dtype);
  const int per_dest =
      a->kind == ZS__SHM_EXCHANGE || a->kind == ZS__SHM_REDUCE_SCATTER;
  return ZS__SHM_HALF_BYTES / (e * (per_dest ? (size_t)s->world : 1));
}

/* What a round carries, to compare across ranks. A reduce-scatter
 * writes what an exchange does (each rank's piece for every rank) and
 * pairs with one: a reconciliation's catch-up partner for it is an
 * exchange (comm.h, reduce_scatter_fixed). */
static uint64_t zs__shm_desc(const zs__shm_args* a) {
  const int kind =
      a->kind == ZS__SHM_REDUCE_SCATTER ? ZS__SHM_EXCHANGE : (int)a->kind;
  return ((uint64_t)kind << 56) | ((uint64_t)(a->dtype & 0xff) << 48) |
         ((uint64_t)a->count & 0xffffffffffffull);
}

static void zs__shm_desc_text(uint64_t d, char* buf, size_t cap) {
  const int kind = (int)(d >> 56), dtype = (int)((d >> 48) & 0xff);
  snprintf(buf, cap, "%s of %llu %s elements",
           kind == ZS__SHM_EXCHANGE ? "exchange or reduce-scatter"
                                    : zs__shm_kind_name(kind),
           (unsigned long long)(d & 0xffffffffffffull),
           dtype < ZS_DTYPE_COUNT ? zs_dtype_name((zs_dtype)dtype) : "?");
}

/* dst[i] = combine over ranks in rank order (all-reduce of a dtype or an
 * operation zs__host_sum_ranks does not cover). */
#define ZS__SHM_COMBINE(T)                                                 \
  do {                                                                     \
    T* d = (T*)dst;                                                        \
    memcpy(d, src[0], n * sizeof(T));                                      \
    for (int r = 1; r < w; r++) {                                          \
      const T* x = (const T*)src[r];                                       \
      for (size_t i = 0; i < n; i++)                                       \
        d[i] = op == 0 ? d[i] + x[i]                                       \
             : op == 1 ? (x[i] > d[i] ? x[i] : d[i])                       \
                       : (x[i] < d[i] ? x[i] : d[i]);                      \
    }                                                                      \
  } while (0)

static zs_status zs__shm_combine(void* dst, const void* const* src, int w,
                                 size_t n, zs_dtype dtype, int op) {
  if (op == 0 && (dtype == ZS_FLOAT32 || dtype == ZS_BFLOAT16 ||
                  dtype == ZS_FLOAT16))
    return zs__host_sum_ranks(dst, src, w, n, 1.0f, dtype);
  switch (dtype) {
    case ZS_FLOAT32: ZS__SHM_COMBINE(float); return ZS_OK;
    case ZS_FLOAT64: ZS__SHM_COMBINE(double); return ZS_OK;
    case ZS_INT64: ZS__SHM_COMBINE(int64_t); return ZS_OK;
    case ZS_UINT64: ZS__SHM_COMBINE(uint64_t); return ZS_OK;
    case ZS_UINT8: ZS__SHM_COMBINE(uint8_t); return ZS_OK;
    default:
      return zs__error(ZS_ERR_UNSUPPORTED, "shared-memory all-reduce: %s "
                       "of dtype %s", op == 0 ? "sum" : op == 1 ? "max" : "min",
                       zs_dtype_name(dtype));
  }
}

/* Round k's piece: elements [k * piece, + len). */
static void zs__shm_write(zs__shm* s, const zs__shm_op* op, size_t at,
                          size_t len, char* half) {
  const zs__shm_args* a = &op->a;
  const size_t e = zs_dtype_size(a->dtype), W = (size_t)s->world,
               me = (size_t)s->rank;
  const char* send = (const char*)a->send;
  char* recv = (char*)a->recv;
  switch (a->kind) {
    case ZS__SHM_ALL_GATHER: {
      const char* mine = send != NULL ? send : recv + me * a->count * e;
      memcpy(half, mine + at * e, len * e);
      break;
    }
    case ZS__SHM_ALL_GATHER_STRIDED:
      memcpy(half, recv + (me * a->stride + a->offset + at) * e, len * e);
      break;
    case ZS__SHM_EXCHANGE:
    case ZS__SHM_REDUCE_SCATTER: {
      const size_t piece = zs__shm_piece(s, a);
      for (size_t d = 0; d < W; d++) /* (its own piece it reads at home) */
        if (d != me)
          memcpy(half + d * piece * e, send + (op->offsets[d] + at) * e,
                 len * e);
      break;
    }
    case ZS__SHM_ALL_REDUCE:
      memcpy(half, (send != NULL ? send : recv) + at * e, len * e);
      break;
    case ZS__SHM_BROADCAST:
      if ((int)me == a->root) memcpy(half, recv + at * e, len * e);
      break;
  }
}

/* Whether rank r's piece of a round is copied as soon as r wrote it
 * (all-gathers, exchanges, broadcasts), rather than summed once every rank
 * wrote (reduce-scatters, all-reduces: in rank order). */
static int zs__shm_copies(zs__shm_kind k) {
  return k != ZS__SHM_REDUCE_SCATTER && k != ZS__SHM_ALL_REDUCE;
}

/* Copies what this rank takes from rank r's piece of a round. */
static void zs__shm_copy_from(zs__shm* s, const zs__shm_op* op, size_t at,
                              size_t len, uint32_t round, int r) {
  const zs__shm_args* a = &op->a;
  const int me = s->rank;
  const size_t e = zs_dtype_size(a->dtype);
  char* recv = (char*)a->recv;
  const char* half = zs__shm_half(s, r, round);
  switch (a->kind) {
    case ZS__SHM_ALL_GATHER:
      if (r == me && a->send == NULL) return;
      zs__shm_out(op, recv + ((size_t)r * a->count + at) * e, half, len * e);
      return;
    case ZS__SHM_ALL_GATHER_STRIDED:
      if (r != me)
        zs__shm_out(op, recv + ((size_t)r * a->stride + a->offset + at) * e,
                    half, len * e);
      return;
    case ZS__SHM_EXCHANGE:
      zs__shm_out(op, recv + ((size_t)r * a->count + at) * e,
                  r == me ? (const char*)a->send + (op->offsets[me] + at) * e
                          : half + (size_t)me * zs__shm_piece(s, a) * e,
                  len * e);
      return;
    case ZS__SHM_BROADCAST:
      if (r == a->root && me != a->root)
        zs__shm_out(op, recv + at * e, half, len * e);
      return;
    default:
      return;
  }
}

/* Sums a round's pieces (every rank wrote it), in rank order. */
static zs_status zs__shm_sum(zs__shm* s, const zs__shm_op* op, size_t at,
                             size_t len, uint32_t round) {
  const zs__shm_args* a = &op->a;
  const int W = s->world, me = s->rank;
  const size_t e = zs_dtype_size(a->dtype);
  char* recv = (char*)a->recv;
  const void* src[256];
  if (a->kind == ZS__SHM_REDUCE_SCATTER) {
    const size_t piece = zs__shm_piece(s, a);
    for (int r = 0; r < W; r++)
      src[r] = r == me ? (const char*)a->send + (op->offsets[me] + at) * e
                       : zs__shm_half(s, r, round) + (size_t)me * piece * e;
    if (!op->stream)
      return zs__host_sum_ranks(recv + at * e, src, W, len, a->divisor,
                                a->dtype);
    /* a large output: summed where this rank's own piece would be in its
     * slot (it never writes it there), which the cache holds, then
     * streamed out */
    char* sum = zs__shm_half(s, me, round) + (size_t)me * piece * e;
    zs_status st = zs__host_sum_ranks(sum, src, W, len, a->divisor, a->dtype);
    if (st == ZS_OK) zs__shm_out(op, recv + at * e, sum, len * e);
    return st;
  }
  /* all-reduce: this rank's slice of the piece, summed in rank order into
   * its output, then published in its own slot (zs__shm_run) */
  const size_t lo = len * (size_t)me / (size_t)W,
               hi = len * (size_t)(me + 1) / (size_t)W;
  for (int r = 0; r < W; r++) src[r] = zs__shm_half(s, r, round) + lo * e;
  zs_status st = zs__shm_combine(recv + (at + lo) * e, src, W, hi - lo,
                                 a->dtype, a->op);
  if (st == ZS_OK)
    memcpy(zs__shm_half(s, me, round) + lo * e, recv + (at + lo) * e,
           (hi - lo) * e);
  return st;
}

static void zs__shm_run(zs__shm* s, zs__shm_op* op) {
  const zs__shm_args* a = &op->a;
  zs__shm_ctrl* mine = zs__shm_ctrl_of(s, s->rank);
  const size_t piece = zs__shm_piece(s, a);
  const uint64_t desc = zs__shm_desc(a);
  /* (a broadcast's root and an all-reduce's operation must agree too) */
  const uint64_t extra =
      a->kind == ZS__SHM_BROADCAST ? (uint64_t)a->root + 1
      : a->kind == ZS__SHM_ALL_REDUCE ? ((uint64_t)a->op + 1) << 32 : 0;
  for (size_t at = 0; at < a->count; at += piece) {
    const size_t len = a->count - at < piece ? a->count - at : piece;
    const uint32_t g = (uint32_t)(s->round + 1);
    /* every rank is done with the half this round overwrites */
    if (s->round >= 2)
      for (int r = 0; r < s->world; r++)
        if (zs__shm_wait(s, op, r, &zs__shm_ctrl_of(s, r)->read, g - 2,
                         "finish reading an earlier round") != ZS_OK)
          return;
    zs__shm_write(s, op, at, len, zs__shm_half(s, s->rank, g));
    mine->desc[g & 1] = desc;
    mine->extra[g & 1] = extra;
    zs__shm_publish(&mine->written, g);
    /* each peer's piece as soon as it is there (others first, own last) */
    const int copies = zs__shm_copies(a->kind);
    for (int k = 1; k <= s->world; k++) {
      const int r = (s->rank + k) % s->world;
      zs__shm_ctrl* peer = zs__shm_ctrl_of(s, r);
      if (zs__shm_wait(s, op, r, &peer->written, g, "write its piece") !=
          ZS_OK)
        return;
      const uint64_t theirs = peer->desc[g & 1];
      if (theirs != desc || peer->extra[g & 1] != extra) {
        char t0[96], t1[96];
        zs__shm_desc_text(desc, t0, sizeof t0);
        zs__shm_desc_text(theirs, t1, sizeof t1);
        op->status = ZS_ERR_MISMATCH;
        snprintf(op->why, sizeof op->why,
                 "shared-memory collectives do not pair up: this rank "
                 "issued %s, rank %d %s (the ranks issued different "
                 "collectives)", t0, zs__shm_name(s, r), t1);
        return;
      }
      if (copies) zs__shm_copy_from(s, op, at, len, g, r);
    }
    zs_status st = copies ? ZS_OK : zs__shm_sum(s, op, at, len, g);
    if (st == ZS_OK && a->kind == ZS__SHM_ALL_REDUCE) {
      /* (a reduce-scatter, then an all-gather of the slices: each
       * element still summed in rank order, by one rank) */
      zs__shm_publish(&mine->reduced, g);
      const size_t e = zs_dtype_size(a->dtype);
      for (int r = 0; r < s->world; r++) {
        if (zs__shm_wait(s, op, r, &zs__shm_ctrl_of(s, r)->reduced, g,
                         "sum its slice") != ZS_OK)
          return;
        if (r == s->rank) continue;
        const size_t lo = len * (size_t)r / (size_t)s->world,
                     hi = len * (size_t)(r + 1) / (size_t)s->world;
        zs__shm_out(op, (char*)a->recv + (at + lo) * e,
                    zs__shm_half(s, r, g) + lo * e, (hi - lo) * e);
      }
    }
    if (op->stream) zs__shm_stream_fence();
    if (st != ZS_OK) {
      op->status = st;
      snprintf(op->why, sizeof op->why, "%s", zs__error_body());
      return;
    }
    s->round++;
    zs__shm_publish(&mine->read, g);
  }
}

/* The first failure (s->lock held): every later collective fails with it,
 * and the other ranks read in this rank's control page that it gave up. */
static void zs__shm_break_locked(zs__shm* s, zs_status st, const char* why) {
  if (s->broken != ZS_OK) return;
  s->broken = st;
  snprintf(s->broken_why, sizeof s->broken_why, "%s", why);
  zs__shm_ctrl* mine = zs__shm_ctrl_of(s, s->rank);
  snprintf(mine->why, sizeof mine->why, "%.255s", why);
  __atomic_store_n(&mine->gone, 2, __ATOMIC_RELEASE);
}

static void zs__shm_complete(zs__shm* s, zs__shm_op* op) {
  if (op->status != ZS_OK) {
    /* nothing after a failed collective can pair up any more */
    pthread_mutex_lock(&s->lock);
    zs__shm_break_locked(s, op->status, op->why);
    pthread_mutex_unlock(&s->lock);
  }
  __atomic_store_n(&op->done, 1, __ATOMIC_RELEASE);
  syscall(SYS_futex, &op->done, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void* zs__shm_main(void* arg) {
  zs__shm* s = (zs__shm*)arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
    if (s->head == NULL) break;
    zs__shm_op* op = s->head;
    s->head = op->next;
    if (s->head == NULL) s->tail = NULL;
    const zs_status broken = s->broken;
    pthread_mutex_unlock(&s->lock);
    if (broken != ZS_OK) {
      op->status = broken;
      snprintf(op->why, sizeof op->why, "%s", s->broken_why);
    } else {
      zs__shm_run(s, op);
    }
    zs__shm_complete(s, op);
    pthread_mutex_lock(&s->lock);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* ---- Segment ------------------------------------------------------------ */

/* This process's pid namespace, 0 if unknown. */
static uint64_t zs__shm_pidns(void) {
  char link[64];
  ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
  unsigned long long ino = 0;
  if (n <= 0) return 0;
  link[n] = '\0';
  return sscanf(link, "pid:[%llu]", &ino) == 1 ? (uint64_t)ino : 0;
}

zs_status zs__shm_open(const char* path, int create, int rank, int world,
                       zs__shm** out) {
  *out = NULL;
  if (world < 1 || world > 256 || rank < 0 || rank >= world)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "shared-memory collectives: "
                     "rank %d of %d (at most 256 ranks)", rank, world);
  zs__shm* s = (zs__shm*)calloc(1, sizeof *s);
  if (s == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "shared-memory collectives");
  s->rank = rank;
  s->world = world;
  s->name_stride = 1;
  s->bytes = zs__shm_segment_bytes(world);
  s->fd = open(path,
               O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_EXCL : 0),
               0600);
  zs_status st = ZS_OK;
  if (s->fd < 0) {
    st = zs__error(ZS_ERR_IO, "shared-memory segment %s: %s: %s", path,
                   create ? "cannot create it" : "cannot open it",
                   strerror(errno));
  } else if (create) {
    /* every page now: a full /dev/shm fails here, not as SIGBUS later */
    int rc = posix_fallocate(s->fd, 0, (off_t)s->bytes);
    if (rc != 0) {
      st = zs__error(ZS_ERR_IO, "shared-memory segment %s: cannot allocate "
                     "%zu bytes: %s%s", path, s->bytes, strerror(rc),
                     rc == ENOSPC ? " (set ZS_SHM_DIR to a larger tmpfs, or "
                                    "host_collectives to mpi)" : "");
      unlink(path);
    }
  }
  if (st == ZS_OK) { /* (a mapping past the file's end would be SIGBUS) */
    off_t size = lseek(s->fd, 0, SEEK_END);
    if (size < (off_t)s->bytes)
      st = zs__error(ZS_ERR_IO, "shared-memory segment %s: %lld bytes, "
                     "expected %zu (made for another world size?)", path,
                     (long long)size, s->bytes);
  }
  if (st == ZS_OK) {
    void* p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd,
                   0);
    if (p == MAP_FAILED)
      st = zs__error(ZS_ERR_IO, "shared-memory segment %s: mmap of %zu "
                     "bytes: %s", path, s->bytes, strerror(errno));
    else
      s->base = (char*)p;
  }
  if (s->fd >= 0) close(s->fd); /* (the mapping stays) */
  s->fd = -1;
  if (st == ZS_OK) {
    zs__shm_ctrl* mine = zs__shm_ctrl_of(s, rank);
    mine->pid = (int32_t)getpid();
    mine->pidns = zs__shm_pidns();
    if (gethostname(mine->host, sizeof mine->host - 1) != 0)
      snprintf(mine->host, sizeof mine->host, "?");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->broken = ZS_OK;
    if (pthread_create(&s->worker, NULL, zs__shm_main, s) != 0) {
      pthread_mutex_destroy(&s->lock);
      pthread_cond_destroy(&s->cond);
      st = zs__error(ZS_ERR_INTERNAL, "shared-memory collectives: cannot "
                     "start the worker thread");
    } else {
      s->worker_on = 1;
    }
  }
  if (st != ZS_OK) {
    if (s->base != NULL) munmap(s->base, s->bytes);
    free(s);
    return st;
  }
  *out = s;
  return ZS_OK;
}

void zs__shm_unlink(const char* path) { unlink(path); }

/* After every rank attached: their pids mean something here only if every
 * rank is in this rank's pid namespace (a rank that died since is then
 * found by its first wait, not taken for one in another namespace). */
static void zs__shm_check_pids(zs__shm* s) {
  const uint64_t mine = zs__shm_ctrl_of(s, s->rank)->pidns;
  s->check_pids = mine != 0;
  for (int r = 0; r < s->world; r++) {
    const zs__shm_ctrl* c = zs__shm_ctrl_of(s, r);
    if (c->pid <= 0 || c->pidns != mine) s->check_pids = 0;
  }
}


zs_status zs__shm_post(zs__shm* s, const zs__shm_args* a, zs__shm_op** out) {
  *out = NULL;
  if (a->kind == ZS__SHM_BROADCAST && (a->root < 0 || a->root >= s->world))
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "shared-memory broadcast: root "
                     "%d of %d ranks", a->root, s->world);
  if ((int)a->dtype < 0 || a->dtype >= ZS_DTYPE_COUNT)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "shared-memory %s: dtype %d",
                     zs__shm_kind_name(a->kind), (int)a->dtype);
  zs__shm_op* op = (zs__shm_op*)calloc(1, sizeof *op);
  if (op == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "shared-memory collective");
  op->a = *a;
  {
    const size_t e = zs_dtype_size(a->dtype), W = (size_t)s->world;
    const size_t bytes = a->kind == ZS__SHM_ALL_GATHER ||
                               a->kind == ZS__SHM_ALL_GATHER_STRIDED ||
                               a->kind == ZS__SHM_EXCHANGE
                           ? a->count * W * e
                           : a->count * e;
    op->stream = bytes >= ZS__SHM_STREAM_BYTES;
  }
  if (a->kind == ZS__SHM_EXCHANGE || a->kind == ZS__SHM_REDUCE_SCATTER) {
    op->offsets = (size_t*)malloc((size_t)s->world * sizeof *op->offsets);
    if (op->offsets == NULL) {
      free(op);
      return zs__error(ZS_ERR_OUT_OF_MEMORY, "shared-memory collective");
    }
    memcpy(op->offsets, a->offsets, (size_t)s->world * sizeof *op->offsets);
    op->a.offsets = op->offsets;
  }
  pthread_mutex_lock(&s->lock);
  if (!s->pids_checked) { /* (by the first collective every rank is in) */
    zs__shm_check_pids(s);
    s->pids_checked = 1;
  }
  if (s->tail != NULL) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  *out = op;
  return ZS_OK;
}

int zs__shm_done(const zs__shm_op* op) {
  return __atomic_load_n(&op->done, __ATOMIC_ACQUIRE);
}

void zs__shm_idle(const zs__shm_op* op, double max_s) {
  /* (yield first: a small collective completes within a few) */
  for (int i = 0; i < 16; i++) {
    if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) return;
    sched_yield();
  }
  if (__atomic_load_n(&op->done, __ATOMIC_ACQUIRE)) return;
  struct timespec ts = {(time_t)max_s,
                        (long)((max_s - (double)(time_t)max_s) * 1e9)};
  syscall(SYS_futex, &op->done, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
}

zs_status zs__shm_finish(zs__shm_op* op) {
  zs_status st = op->status;
  if (st != ZS_OK) zs__error(st, "%s", op->why);
  free(op->offsets);
  free(op);
  return st;
}

void zs__shm_abort(zs__shm* s, const char* why) {
  pthread_mutex_lock(&s->lock);
  zs__shm_break_locked(s, ZS_ERR_COMM, why);
  __atomic_store_n(&s->abort, 1, __ATOMIC_RELEASE);
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

void zs__shm_destroy(zs__shm* s) {
  if (s == NULL) return;
  zs__shm_ctrl* mine = zs__shm_ctrl_of(s, s->rank);
  pthread_mutex_lock(&s->lock);
  if (s->head != NULL) { /* (only after a failure) */
    s->broken = s->broken != ZS_OK ? s->broken : ZS_ERR_COMM;
    __atomic_store_n(&s->abort, 1, __ATOMIC_RELEASE);
  }
  s->stop = 1;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  if (s->worker_on) pthread_join(s->worker, NULL);
  if (__atomic_load_n(&mine->gone, __ATOMIC_ACQUIRE) == 0)
    __atomic_store_n(&mine->gone, 1, __ATOMIC_RELEASE);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  munmap(s->base, s->bytes);
  free(s);
}
