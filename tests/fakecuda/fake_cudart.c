/*
 * fake_cudart.c — the CUDA runtime API functions ZeroShard's CUDA backend
 * and its GPU tests call, implemented on the CPU (fakecuda.h), so the
 * backend's C code runs in CI without a GPU. It is an ordering model, not
 * an emulator: it is stricter than a GPU where the backend could be wrong
 * and a GPU might still get it right by timing.
 *
 * - Device memory is not host memory. cudaMalloc returns pages mapped
 *   PROT_NONE: host code that dereferences a device pointer crashes, as on
 *   a GPU. The fake device reads and writes them through a second, readable
 *   mapping of the same pages (a memfd). cudaMalloc fails with
 *   cudaErrorMemoryAllocation past FAKECUDA_MEM_BYTES (default 8 GiB).
 * - Streams are lazy: nothing queued runs until something waits for it
 *   (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a
 *   copy with cudaMemcpy into host memory or from registered memory,
 *   cudaFree; and, at more than one rank, an NCCL call of the stand-in
 *   fake_nccl.c, which runs what its stream waits for). Then it runs in an order CUDA allows: first in first out per
 *   stream; an operation of a blocking stream after the legacy default
 *   stream's earlier operations, and one of the legacy stream after every
 *   blocking stream's earlier operations (CUDA's legacy default stream
 *   semantics); non-blocking streams (cudaStreamNonBlocking) after neither;
 *   a cudaStreamWaitEvent after the record it waits for. So reading a
 *   copy's destination, or changing its source, before waiting for it sees
 *   what a slow GPU would: the old data. cudaMemcpyAsync is lazy even with
 *   pageable host memory (the CUDA documentation says only that it "might
 *   be synchronous"); cudaStreamDestroy returns at once and using the
 *   stream after aborts.
 * - cudaEventQuery and cudaStreamQuery return cudaErrorNotReady while the
 *   work is queued, leaving it as the thread's last error as the runtime
 *   does; each such query runs one more operation, so polling finishes.
 * - Kernels (fake_launchers.c, through fakecuda_launch) may read only
 *   device memory and registered host memory; pageable host memory fails
 *   the launch with a message.
 * - Host functions (cudaLaunchHostFunc) run on a thread of their own, as
 *   CUDA's do; a wait for one lets go of the fake's lock while it polls,
 *   so another thread's query (a watchdog's) never waits behind it.
 * Not modelled: concurrent execution, sticky errors, several devices
 * (FAKECUDA_DEVICES sets how many are reported; all share one memory),
 * graphs, managed memory, timing. One mutex guards everything (the
 * engine's progress thread may poll events).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tests/fakecuda/fakecuda.h"

/* ---- state --------------------------------------------------------------- */

typedef struct fk_stream fk_stream;

typedef struct fk_op {
  struct fk_op* next;
  uint64_t seq;
  void (*run)(void* arg); /* NULL: an event record or a stream wait */
  int (*poll)(void* arg); /* or: runs until it returns nonzero */
  void* arg;
  fk_stream* wait_s; /* a stream wait: the record it waits for */
  uint64_t wait_seq;
  int running;          /* a poll under way in some thread, which lets go
                           of the lock between polls */
  struct CUevent_st* ev; /* an event record: the event it completes */
} fk_op;

struct fk_stream {
  int legacy, blocking, dead;
  fk_op *head, *tail;
  fk_stream* next_all;
};

struct CUevent_st { /* cudaEvent_t is a pointer to this (opaque in CUDA) */
  fk_stream* s;     /* the last record's stream, NULL before any */
  uint64_t seq;
  double t;         /* when that record ran (CLOCK_MONOTONIC seconds): the
                       fake's device timestamp (cudaEventElapsedTime) */
};

typedef struct fk_alloc {
  char* dev;   /* PROT_NONE: what cudaMalloc returned */
  char* alias; /* the same pages, readable and writable */
  size_t bytes, mapped;
  struct fk_alloc* next;
} fk_alloc;

typedef struct fk_reg {
  char* p;
  size_t bytes;
  struct fk_reg* next;
} fk_reg;

static pthread_mutex_t fk_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static fk_stream fk_legacy = {1, 1, 0, NULL, NULL, NULL};
/* every stream, destroyed ones too: their queued work still runs */
static fk_stream* fk_streams = &fk_legacy;
static uint64_t fk_seq;
static fk_alloc* fk_allocs;
static fk_reg* fk_regs;
static size_t fk_used;
static int fk_keep; /* fakecuda_keep_memory was called */
static int fk_device;
static __thread cudaError_t fk_last = cudaSuccess;
static __thread int fk_depth; /* times this thread holds fk_mu */

static void fk_lock(void) {
  pthread_mutex_lock(&fk_mu);
  fk_depth++;
}

static void fk_unlock(void) {
  fk_depth--;
  pthread_mutex_unlock(&fk_mu);
}

/* Lets go of fk_mu entirely (for a host function, or between polls of an
 * NCCL collective, which wait for other processes: another thread of this
 * process, such as a watchdog querying an event, must not wait for them
 * behind the lock, as on a GPU it would not); returns the depth to take
 * back with fk_relock. */
static int fk_release(void) {
  const int d = fk_depth;
  for (int i = 0; i < d; i++) fk_unlock();
  return d;
}

static void fk_relock(int d) {
  for (int i = 0; i < d; i++) fk_lock();
}

static cudaError_t fk_err(cudaError_t e) {
  if (e != cudaSuccess) fk_last = e;
  return e;
}

static size_t fk_env(const char* name, size_t dflt) {
  const char* v = getenv(name);
  return v != NULL && *v != '\0' ? (size_t)strtoull(v, NULL, 0) : dflt;
}

static fk_stream* fk_of(cudaStream_t s) {
  if (s == 0 || s == cudaStreamLegacy) return &fk_legacy;
  if (s == cudaStreamPerThread) {
    fprintf(stderr, "fake CUDA: cudaStreamPerThread is not modelled\n");
    abort();
  }
  if (((fk_stream*)s)->dead) {
    fprintf(stderr, "fake CUDA: use of a destroyed stream\n");
    abort();
  }
  return (fk_stream*)s;
}

/* ---- running queued work -------------------------------------------------- */

/* calloc that aborts: the fake has no way to report host memory running
 * out through the CUDA calls that queue work. */
static void* fk_arg(size_t bytes) {
  void* p = calloc(1, bytes);
  if (p == NULL) {
    fprintf(stderr, "fake CUDA: out of host memory\n");
    abort();
  }
  return p;
}

static int fk_pending_upto(const fk_stream* s, uint64_t seq) {
  return s->head != NULL && s->head->seq <= seq;
}

static double fk_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fk_pop(fk_stream* s) {
  fk_op* op = s->head;
  if (op->ev != NULL && op->ev->seq == op->seq) op->ev->t = fk_now();
  s->head = op->next;
  if (s->head == NULL) s->tail = NULL;
  free(op->arg);
  free(op);
}

/* Runs the head of s (its dependencies done): a pollable operation (an
 * NCCL collective, a host function) is polled until it finishes, letting
 * go of the lock between polls (fk_release), the head marked running so
 * that no other thread runs it too. */
static void fk_pop_run(fk_stream* s) {
  fk_op* op = s->head;
  if (op->run != NULL) op->run(op->arg);
  op->running = 1;
  if (op->poll != NULL)
    while (!op->poll(op->arg)) {
      const int d = fk_release();
      sched_yield();
      fk_relock(d);
    }
  fk_pop(s); /* (still the head: a running head is left alone) */
}

/* Another thread runs the head of s: wait a little for it. */
static void fk_yield_to_runner(void) {
  const int d = fk_release();
  sched_yield();
  fk_relock(d);
}

static void fk_run_upto(fk_stream* s, uint64_t seq);

/* The legacy-stream rule: an operation of a blocking stream waits for the
 * legacy stream's earlier work, one of the legacy stream for every
 * blocking stream's. The other stream with work up to `before` that an
 * operation of s (queued after it) waits for by that rule, or NULL. */
static fk_stream* fk_cross_pending(const fk_stream* s, uint64_t before) {
  if (!s->legacy && s->blocking)
    return fk_pending_upto(&fk_legacy, before) ? &fk_legacy : NULL;
  if (s->legacy)
    for (fk_stream* t = fk_streams; t != NULL; t = t->next_all)
      if (t != s && t->blocking && fk_pending_upto(t, before)) return t;
  return NULL;
}

/* Runs what the head of s waits for, then the head (when its sequence
 * number is at most seq; another thread may have run it meanwhile, while
 * this one let go of the lock). Every dependency has a smaller sequence
 * number, so this ends. */
static void fk_run_head(fk_stream* s, uint64_t seq) {
  for (;;) {
    if (!fk_pending_upto(s, seq)) return;
    fk_op* op = s->head;
    if (op->running) {
      fk_yield_to_runner();
      return;
    }
    const uint64_t before = op->seq - 1;
    fk_stream* t = fk_cross_pending(s, before);
    if (t != NULL) {
      fk_run_upto(t, before);
      continue;
    }
    if (op->wait_s != NULL && fk_pending_upto(op->wait_s, op->wait_seq)) {
      fk_run_upto(op->wait_s, op->wait_seq);
      continue;
    }
    fk_pop_run(s);
    return;
  }
}

static void fk_run_upto(fk_stream* s, uint64_t seq) {
  while (fk_pending_upto(s, seq)) fk_run_head(s, seq);
}

/* Runs one operation on the way to (s, seq): the first one with nothing
 * left to wait for. */
static void fk_step(fk_stream* s, uint64_t seq) {
  if (!fk_pending_upto(s, seq)) return;
  const fk_op* op = s->head;
  if (op->running) return; /* another thread's: not done yet */
  fk_stream* t = fk_cross_pending(s, op->seq - 1);
  if (t != NULL) {
    fk_step(t, op->seq - 1);
    return;
  }
  if (op->wait_s != NULL && fk_pending_upto(op->wait_s, op->wait_seq)) {
    fk_step(op->wait_s, op->wait_seq);
    return;
  }
  if (op->poll != NULL) {
    if (op->poll(op->arg)) fk_pop(s); /* polled once: maybe not done */
    return;
  }
  fk_pop_run(s);
}

static void fk_run_all(void) {
  for (fk_stream* t = fk_streams; t != NULL; t = t->next_all)
    fk_run_upto(t, UINT64_MAX);
}

/* Queues an operation; returns its sequence number. */
static uint64_t fk_push(fk_stream* s, void (*run)(void*), void* arg,
                        fk_stream* wait_s, uint64_t wait_seq);

cudaError_t fakecuda_enqueue_poll(cudaStream_t stream, const char* name,
                                  int (*poll)(void* arg), void* arg) {
  (void)name;
  fk_lock();
  fk_stream* s = fk_of(stream);
  fk_push(s, NULL, arg, NULL, 0);
  s->tail->poll = poll;
  fk_unlock();
  return cudaSuccess;
}

/* Host functions (cudaLaunchHostFunc) run on one thread of their own, as
 * CUDA's do, one at a time in the order the streams reach them: a stream
 * reaching one hands it over (its first poll) and is done when it has
 * returned, so a query never blocks in one. */
typedef struct fk_host {
  cudaHostFn_t fn;
  void* arg;
  int state; /* 0 not handed over, 1 handed over, 2 returned (fk_host_mu) */
  struct fk_host* next;
} fk_host;

static pthread_mutex_t fk_host_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_host_cv = PTHREAD_COND_INITIALIZER;
static fk_host *fk_host_head, *fk_host_tail;
static int fk_host_started;

static void* fk_host_thread(void* unused) {
  (void)unused;
  pthread_mutex_lock(&fk_host_mu);
  for (;;) {
    while (fk_host_head == NULL) pthread_cond_wait(&fk_host_cv, &fk_host_mu);
    fk_host* h = fk_host_head;
    fk_host_head = h->next;
    if (fk_host_head == NULL) fk_host_tail = NULL;
    pthread_mutex_unlock(&fk_host_mu);
    h->fn(h->arg);
    pthread_mutex_lock(&fk_host_mu);
    h->state = 2;
  }
  return NULL;
}

static int fk_host_poll(void* arg) {
  fk_host* h = (fk_host*)arg;
  pthread_mutex_lock(&fk_host_mu);
  if (h->state == 0) {
    if (!fk_host_started) {
      pthread_t t;
      if (pthread_create(&t, NULL, fk_host_thread, NULL) != 0) {
        fprintf(stderr, "fake CUDA: no thread for host functions\n");
        abort();
      }
      pthread_detach(t);
      fk_host_started = 1;
    }
    h->state = 1;
    if (fk_host_tail != NULL) fk_host_tail->next = h;
    else fk_host_head = h;
    fk_host_tail = h;
    pthread_cond_signal(&fk_host_cv);
  }
  const int done = h->state == 2;
  pthread_mutex_unlock(&fk_host_mu);
  return done;
}

/* As CUDA: fn(arg) runs once, in stream order, on the host-function
 * thread; it must not call CUDA. */
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                               void* arg) {
  if (fn == NULL) return fk_err(cudaErrorInvalidValue);
  fk_host* h = (fk_host*)fk_arg(sizeof *h);
  h->fn = fn;
  h->arg = arg;
  return fakecuda_enqueue_poll(stream, "host function", fk_host_poll, h);
}

void fakecuda_stream_inputs(cudaStream_t stream) {
  fk_lock();
  fk_stream* s = fk_of(stream);
  /* what an operation queued there now waits for across streams */
  for (fk_stream* t; (t = fk_cross_pending(s, fk_seq)) != NULL;)
    fk_run_upto(t, fk_seq);
  /* and the events its queued operations wait for: collected first, as
   * running them may run (and free) operations of s */
  size_t n = 0, k = 0;
  for (fk_op* op = s->head; op != NULL; op = op->next) n += op->wait_s != NULL;
  fk_op* waits = (fk_op*)fk_arg((n + 1) * sizeof *waits);
  for (fk_op* op = s->head; op != NULL; op = op->next)
    if (op->wait_s != NULL) waits[k++] = *op;
  for (k = 0; k < n; k++) fk_run_upto(waits[k].wait_s, waits[k].wait_seq);
  free(waits);
  fk_unlock();
}

static uint64_t fk_push(fk_stream* s, void (*run)(void*), void* arg,
                        fk_stream* wait_s, uint64_t wait_seq) {
  fk_op* op = (fk_op*)fk_arg(sizeof *op);
  op->seq = ++fk_seq;
  op->run = run;
  op->arg = arg;
  op->wait_s = wait_s;
  op->wait_seq = wait_seq;
  if (s->tail != NULL) s->tail->next = op;
  else s->head = op;
  s->tail = op;
  return op->seq;
}

void fakecuda_keep_memory(void) {
  fk_lock();
  fk_keep = 1;
  fk_unlock();
}

size_t fakecuda_pending(void) {
  fk_lock();
  size_t n = 0;
  for (fk_stream* t = fk_streams; t != NULL; t = t->next_all)
    for (fk_op* op = t->head; op != NULL; op = op->next) n++;
  fk_unlock();
  return n;
}

/* ---- memory --------------------------------------------------------------- */

static fk_alloc* fk_find(const void* p) {
  for (fk_alloc* a = fk_allocs; a != NULL; a = a->next)
    if ((const char*)p >= a->dev && (const char*)p < a->dev + a->mapped)
      return a;
  return NULL;
}

static fk_reg* fk_find_reg(const void* p) {
  for (fk_reg* r = fk_regs; r != NULL; r = r->next)
    if ((const char*)p >= r->p && (const char*)p < r->p + r->bytes) return r;
  return NULL;
}

/* Where the fake device touches [p, p + bytes): device memory through its
 * alias, anything else as it is. Device accesses past an allocation abort
 * (a GPU would fault). */
static char* fk_view(const void* p, size_t bytes) {
  fk_alloc* a = fk_find(p);
  if (a == NULL) return (char*)p;
  const size_t off = (size_t)((const char*)p - a->dev);
  if (off + bytes > a->bytes) {
    fprintf(stderr, "fake CUDA: access of %zu bytes at offset %zu of a "
            "%zu-byte allocation\n", bytes, off, a->bytes);
    abort();
  }
  return a->alias + off;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  fk_lock();
  cudaError_t e = cudaSuccess;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t mapped = ((size > 0 ? size : 1) + page - 1) / page * page;
  fk_alloc* a = NULL;
  int fd = -1;
  if (ptr == NULL) {
    e = cudaErrorInvalidValue;
    goto out;
  }
  *ptr = NULL;
  const size_t limit = fk_env("FAKECUDA_MEM_BYTES", (size_t)8 << 30);
  if (fk_used > limit || size > limit - fk_used) {
    e = cudaErrorMemoryAllocation;
    goto out;
  }
  a = (fk_alloc*)calloc(1, sizeof *a);
  fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (a == NULL || fd < 0 || ftruncate(fd, (off_t)mapped) != 0) {
    e = cudaErrorMemoryAllocation;
    goto out;
  }
  a->dev = (char*)mmap(NULL, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  a->alias = (char*)mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0);
  if (a->dev == MAP_FAILED || a->alias == MAP_FAILED) {
    if (a->dev != MAP_FAILED) munmap(a->dev, mapped);
    if (a->alias != MAP_FAILED) munmap(a->alias, mapped);
    e = cudaErrorMemoryAllocation;
    goto out;
  }
  /* like cudaMalloc, not zeroed: fill with a pattern so that reading
   * memory nobody wrote shows */
  memset(a->alias, 0xA5, mapped);
  a->bytes = size;
  a->mapped = mapped;
  a->next = fk_allocs;
  fk_allocs = a;
  fk_used += size;
  *ptr = a->dev;
  a = NULL;
out:
  if (fd >= 0) close(fd);
  free(a);
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == NULL) return cudaSuccess;
  fk_lock();
  fk_run_all(); /* cudaFree synchronizes the device */
  fk_alloc** pp = &fk_allocs;
  while (*pp != NULL && (*pp)->dev != (char*)ptr) pp = &(*pp)->next;
  cudaError_t e = cudaSuccess;
  if (*pp == NULL) {
    e = cudaErrorInvalidValue;
  } else {
    fk_alloc* a = *pp;
    *pp = a->next;
    munmap(a->dev, a->mapped);
    /* after an abort, abandoned MPI requests may still write the alias */
    if (!fk_keep) munmap(a->alias, a->mapped);
    fk_used -= a->bytes;
    free(a);
  }
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaMemGetInfo(size_t* fr, size_t* total) {
  fk_lock();
  const size_t t = fk_env("FAKECUDA_MEM_BYTES", (size_t)8 << 30);
  if (fr != NULL) *fr = fk_used < t ? t - fk_used : 0;
  if (total != NULL) *total = t;
  fk_unlock();
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  (void)flags;
  if (ptr == NULL || size == 0) return fk_err(cudaErrorInvalidValue);
  fk_lock();
  cudaError_t e = cudaSuccess;
  if (fk_find_reg(ptr) != NULL || fk_find(ptr) != NULL) {
    e = cudaErrorHostMemoryAlreadyRegistered;
  } else {
    fk_reg* r = (fk_reg*)calloc(1, sizeof *r);
    if (r == NULL) {
      e = cudaErrorMemoryAllocation;
    } else {
      r->p = (char*)ptr;
      r->bytes = size;
      r->next = fk_regs;
      fk_regs = r;
    }
  }
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaHostUnregister(void* ptr) {
  fk_lock();
  fk_reg** pp = &fk_regs;
  while (*pp != NULL && (*pp)->p != (char*)ptr) pp = &(*pp)->next;
  cudaError_t e = cudaSuccess;
  if (*pp == NULL) {
    e = cudaErrorHostMemoryNotRegistered;
  } else {
    fk_reg* r = *pp;
    *pp = r->next;
    free(r);
  }
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr,
                                     const void* ptr) {
  if (attr == NULL) return fk_err(cudaErrorInvalidValue);
  fk_lock();
  memset(attr, 0, sizeof *attr);
  attr->device = fk_device;
  if (fk_find(ptr) != NULL) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = (void*)ptr;
  } else if (fk_find_reg(ptr) != NULL) {
    attr->type = cudaMemoryTypeHost;
    attr->devicePointer = (void*)ptr;
    attr->hostPointer = (void*)ptr;
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
  }
  fk_unlock();
  return cudaSuccess;
}

/* ---- copies and memsets ---------------------------------------------------- */

typedef struct {
  char* dst;
  const char* src;
  size_t bytes;
} fk_copy_arg;

static void fk_copy_run(void* p) {
  fk_copy_arg* a = (fk_copy_arg*)p;
  memmove(a->dst, a->src, a->bytes);
}

typedef struct {
  char* dst;
  int value;
  size_t bytes;
} fk_set_arg;

static void fk_set_run(void* p) {
  fk_set_arg* a = (fk_set_arg*)p;
  memset(a->dst, a->value, a->bytes);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind;
  if (count == 0) return cudaSuccess;
  if (dst == NULL || src == NULL) return fk_err(cudaErrorInvalidValue);
  fk_lock();
  fk_copy_arg* a = (fk_copy_arg*)fk_arg(sizeof *a);
  a->dst = fk_view(dst, count);
  a->src = fk_view(src, count);
  a->bytes = count;
  fk_push(fk_of(stream), fk_copy_run, a, NULL, 0);
  fk_unlock();
  return cudaSuccess;
}

/* On the legacy stream, with the CUDA documentation's host behaviour:
 * to device memory from pageable memory, the source is consumed (staged)
 * before it returns but the destination is written later; from device to
 * device, nothing is waited for; otherwise (into host memory, or from
 * registered memory) it is complete when it returns. */
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                       enum cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (dst == NULL || src == NULL) return fk_err(cudaErrorInvalidValue);
  fk_lock();
  const int dst_dev = fk_find(dst) != NULL, src_dev = fk_find(src) != NULL;
  const int src_pageable = !src_dev && fk_find_reg(src) == NULL;
  cudaError_t e = cudaSuccess;
  if (dst_dev && src_pageable) {
    /* the staged source travels with the queued copy (freed with it) */
    fk_copy_arg* a = (fk_copy_arg*)fk_arg(sizeof *a + count);
    memcpy(a + 1, src, count);
    a->dst = fk_view(dst, count);
    a->src = (const char*)(a + 1);
    a->bytes = count;
    fk_push(&fk_legacy, fk_copy_run, a, NULL, 0);
  } else {
    e = cudaMemcpyAsync(dst, src, count, kind, 0);
    if (e == cudaSuccess && !(dst_dev && src_dev))
      fk_run_upto(&fk_legacy, fk_seq);
  }
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  fk_lock();
  cudaError_t e = cudaSuccess;
  if (fk_find(ptr) == NULL) {
    fprintf(stderr, "fake CUDA: cudaMemsetAsync of %p: not device memory\n",
            ptr);
    e = cudaErrorInvalidValue;
  } else {
    fk_set_arg* a = (fk_set_arg*)fk_arg(sizeof *a);
    a->dst = fk_view(ptr, count);
    a->value = value;
    a->bytes = count;
    fk_push(fk_of(stream), fk_set_run, a, NULL, 0);
  }
  fk_unlock();
  return fk_err(e);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  cudaError_t e = cudaMemsetAsync(ptr, value, count, 0);
  return e;
}

/* ---- kernels ---------------------------------------------------------------- */

cudaError_t fakecuda_launch(cudaStream_t stream, const char* name,
                            void (*run)(void* arg), void* arg) {
  (void)name;
  fk_lock();
  fk_push(fk_of(stream), run, arg, NULL, 0);
  fk_unlock();
  return cudaSuccess;
}

void* fakecuda_kernel_ptr(const void* p, size_t bytes, const char* name,
                          int* ok) {
  if (p == NULL) return NULL;
  fk_lock();
  void* v = NULL;
  if (fk_find(p) != NULL) {
    v = fk_view(p, bytes);
  } else {
    fk_reg* r = fk_find_reg(p);
    if (r != NULL && (const char*)p + bytes <= r->p + r->bytes) {
      v = (void*)p;
    } else {
      fprintf(stderr, "fake CUDA: kernel %s: operand %p (%zu bytes) is %s\n",
              name, p, bytes,
              r != NULL ? "past the end of its registered host memory"
                        : "pageable host memory, which a GPU cannot read");
      *ok = 0;
    }
  }
  fk_unlock();
  return v;
}

/* ---- streams and events ------------------------------------------------------ */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  if (out == NULL) return fk_err(cudaErrorInvalidValue);
  fk_stream* s = (fk_stream*)calloc(1, sizeof *s);
  if (s == NULL) return fk_err(cudaErrorMemoryAllocation);
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  fk_lock();
  s->next_all = fk_streams;
  fk_streams = s;
  fk_unlock();
  *out = (cudaStream_t)s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* out) {
  return cudaStreamCreateWithFlags(out, cudaStreamDefault);
}

/* As CUDA: returns at once; the queued work runs when something waits
 * for it. The record stays (events and stream waits may name it); using
 * the handle again aborts. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  fk_lock();
  fk_stream* s = fk_of(stream);
  if (s != &fk_legacy) s->dead = 1;
  fk_unlock();
  return s == &fk_legacy ? fk_err(cudaErrorInvalidResourceHandle)
                         : cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  fk_lock();
  fk_run_upto(fk_of(stream), UINT64_MAX);
  fk_unlock();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  fk_lock();
  fk_stream* s = fk_of(stream);
  const uint64_t last = s->tail != NULL ? s->tail->seq : 0;
  fk_step(s, last);
  const int busy = fk_pending_upto(s, last);
  fk_unlock();
  return busy ? fk_err(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  fk_lock();
  fk_run_all();
  fk_unlock();
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  (void)flags;
  if (out == NULL) return fk_err(cudaErrorInvalidValue);
  struct CUevent_st* ev = (struct CUevent_st*)calloc(1, sizeof *ev);
  if (ev == NULL) return fk_err(cudaErrorMemoryAllocation);
  *out = ev;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* out) {
  return cudaEventCreateWithFlags(out, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (ev == NULL) return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  /* (as CUDA: a record still queued completes without it) */
  for (fk_stream* t = fk_streams; t != NULL; t = t->next_all)
    for (fk_op* op = t->head; op != NULL; op = op->next)
      if (op->ev == ev) op->ev = NULL;
  fk_unlock();
  free(ev);
  return cudaSuccess;
}

/* Milliseconds between two completed records (the times they ran). */
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (ms == NULL || a == NULL || b == NULL || a->s == NULL || b->s == NULL)
    return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  const int busy = fk_pending_upto(a->s, a->seq) || fk_pending_upto(b->s, b->seq);
  fk_unlock();
  if (busy) return fk_err(cudaErrorNotReady);
  *ms = (float)((b->t - a->t) * 1e3);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
  if (ev == NULL) return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  fk_stream* s = fk_of(stream);
  ev->s = s;
  ev->seq = fk_push(s, NULL, NULL, NULL, 0);
  s->tail->ev = ev;
  fk_unlock();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev,
                                unsigned int flags) {
  (void)flags;
  if (ev == NULL) return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  /* a record still queued: wait for it; none, or done: nothing to wait for */
  if (ev->s != NULL && fk_pending_upto(ev->s, ev->seq))
    fk_push(fk_of(stream), NULL, NULL, ev->s, ev->seq);
  fk_unlock();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  if (ev == NULL) return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  int busy = 0;
  if (ev->s != NULL && fk_pending_upto(ev->s, ev->seq)) {
    fk_step(ev->s, ev->seq);
    busy = fk_pending_upto(ev->s, ev->seq);
  }
  fk_unlock();
  return busy ? fk_err(cudaErrorNotReady) : cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (ev == NULL) return fk_err(cudaErrorInvalidResourceHandle);
  fk_lock();
  if (ev->s != NULL) fk_run_upto(ev->s, ev->seq);
  fk_unlock();
  return cudaSuccess;
}

/* ---- devices and errors --------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == NULL) return fk_err(cudaErrorInvalidValue);
  *count = (int)fk_env("FAKECUDA_DEVICES", 1);
  return *count > 0 ? cudaSuccess : fk_err(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= (int)fk_env("FAKECUDA_DEVICES", 1))
    return fk_err(cudaErrorInvalidDevice);
  fk_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == NULL) return fk_err(cudaErrorInvalidValue);
  *device = fk_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* buf, int len, int device) {
  if (buf == NULL || len <= 0 || device < 0 ||
      device >= (int)fk_env("FAKECUDA_DEVICES", 1))
    return fk_err(cudaErrorInvalidValue);
  /* a bus id no machine has: no hwloc locality */
  snprintf(buf, (size_t)len, "0000:fe:%02x.0", device & 0x1f);
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = fk_last;
  fk_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return fk_last; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error (fake CUDA)";
  }
}
