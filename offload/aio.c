/*
 * aio.c — O_DIRECT file I/O through io_uring or a thread pool (aio.h).
 */
#define _GNU_SOURCE
#include "offload/aio.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

long (*zs__aio_fault_hook)(const char* path, uint64_t offset, int write,
                           size_t bytes, long result) = NULL;

struct zs__aio_file {
  int fd;
  int direct; /* opened with O_DIRECT */
  uint64_t bytes;
  char path[4096];
};

typedef struct zs__aio_req {
  zs__aio_file* f;
  int write;
  void* buf;
  size_t bytes;
  uint64_t off;
  int busy;
  uint64_t ticket;
} zs__aio_req;

struct zs__aio {
  zs__aio_backend backend; /* URING or THREADS once created */
  int qd;
  size_t block;      /* requests are split into transfers of at most this */
  zs__aio_req* reqs; /* qd slots */
  int inflight;
  uint64_t tickets;  /* requests submitted so far */
  zs_status err;     /* first failure since the last wait */
  uint64_t failures; /* failed transfers since creation (never reset) */
  char msg[4096 + 256];
  struct io_uring ring;
  int unsubmitted;   /* prepared entries not yet given to the kernel */
  /* threads */
  pthread_t* th;
  int nth;
  pthread_mutex_t mu;
  pthread_cond_t work, done;
  int* queue; /* ring of slot indices, qd entries */
  int qhead, qcount;
  int quit;
};

/* ==== Completion (both backends) ========================================== */

/* Records request `slot`'s outcome; the caller holds mu (threads). */
static void zs__aio_complete(zs__aio* a, int slot, long res) {
  zs__aio_req* r = &a->reqs[slot];
  if (zs__aio_fault_hook != NULL)
    res = zs__aio_fault_hook(r->f->path, r->off, r->write, r->bytes, res);
  if (res != (long)r->bytes) a->failures++;
  if (res != (long)r->bytes && a->err == ZS_OK) {
    const char* op = r->write ? "write" : "read";
    if (res < 0)
      snprintf(a->msg, sizeof a->msg, "%s of %zu bytes at offset %llu of %s: %s",
               op, r->bytes, (unsigned long long)r->off, r->f->path,
               strerror((int)-res));
    else
      snprintf(a->msg, sizeof a->msg,
               "%s of %zu bytes at offset %llu of %s: short %s, got %ld bytes",
               op, r->bytes, (unsigned long long)r->off, r->f->path, op, res);
    a->err = ZS_ERR_IO;
  }
  r->busy = 0;
  a->inflight--;
}

/* ==== io_uring ============================================================== */

/* Gives the prepared entries to the kernel in one call, so that the block
 * layer sees (and merges) a request's consecutive transfers together. A
 * refused submission fails those entries. */
static void zs__uring_flush(zs__aio* a) {
  if (a->unsubmitted == 0) return;
  int rc;
  do rc = io_uring_submit(&a->ring);
  while (rc == -EINTR);
  if (rc >= 0) {
    a->unsubmitted = 0;
    return;
  }
  /* nothing was queued: fail what is in flight and not completed */
  for (int i = 0; i < a->qd; i++)
    if (a->reqs[i].busy && a->reqs[i].ticket > a->tickets - (uint64_t)a->unsubmitted)
      zs__aio_complete(a, i, rc);
  a->unsubmitted = 0;
}

/* A wait that has lasted `waited` seconds: says which transfer it is on
 * (the oldest in flight), so that a stuck device is never a silent hang.
 * Threads: the caller holds mu. */
static void zs__aio_warn_waiting(const zs__aio* a, int waited) {
  const zs__aio_req* old = NULL;
  for (int i = 0; i < a->qd; i++)
    if (a->reqs[i].busy && (old == NULL || a->reqs[i].ticket < old->ticket))
      old = &a->reqs[i];
  if (old == NULL) return;
  zs__log(ZS_LOG_WARN, "NVMe offload: still waiting after %d s for the %s of "
          "%zu bytes at offset %llu of %s (%d transfers in flight)", waited,
          old->write ? "write" : "read", old->bytes,
          (unsigned long long)old->off, old->f->path, a->inflight);
}

enum { ZS__AIO_WARN_S = 60 }; /* seconds between the warnings above */

static void zs__uring_reap_one(zs__aio* a) {
  zs__uring_flush(a);
  if (a->inflight == 0) return;
  struct io_uring_cqe* cqe = NULL;
  int rc, waited = 0;
  for (;;) {
    struct __kernel_timespec ts = {ZS__AIO_WARN_S, 0};
    rc = io_uring_wait_cqe_timeout(&a->ring, &cqe, &ts);
    if (rc == -EINTR) continue;
    if (rc != -ETIME) break;
    waited += ZS__AIO_WARN_S;
    zs__aio_warn_waiting(a, waited);
  }
  if (rc < 0) { /* the ring itself failed: fail every request in flight */
    for (int i = 0; i < a->qd; i++)
      if (a->reqs[i].busy) zs__aio_complete(a, i, rc);
    return;
  }
  const int slot = (int)io_uring_cqe_get_data64(cqe);
  const long res = cqe->res;
  io_uring_cqe_seen(&a->ring, cqe);
  zs__aio_complete(a, slot, res);
}

/* ==== Thread pool =========================================================== */

/* The whole transfer, retrying partial ones; -errno, or fewer bytes at end
 * of file. */
static long zs__aio_rw(zs__aio_req* r) {
  size_t done = 0;
  while (done < r->bytes) {
    ssize_t n = r->write
                    ? pwrite(r->f->fd, (char*)r->buf + done, r->bytes - done,
                             (off_t)(r->off + done))
                    : pread(r->f->fd, (char*)r->buf + done, r->bytes - done,
                            (off_t)(r->off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += (size_t)n;
  }
  return (long)done;
}

static void* zs__aio_worker(void* arg) {
  zs__aio* a = (zs__aio*)arg;
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (a->qcount == 0 && !a->quit) pthread_cond_wait(&a->work, &a->mu);
    if (a->qcount == 0 && a->quit) break;
    const int slot = a->queue[a->qhead];
    a->qhead = (a->qhead + 1) % a->qd;
    a->qcount--;
    pthread_mutex_unlock(&a->mu);
    const long res = zs__aio_rw(&a->reqs[slot]);
    pthread_mutex_lock(&a->mu);
    zs__aio_complete(a, slot, res);
    pthread_cond_broadcast(&a->done);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

/* ==== The queue ============================================================= */

zs_status zs__aio_create(int queue_depth, size_t block_size,
                         zs__aio_backend backend, zs__aio** out) {
  *out = NULL;
  ZS_REQUIRE(block_size == 0 || block_size % ZS__AIO_ALIGN == 0,
             "block_size: expected a multiple of %d bytes, got %zu",
             ZS__AIO_ALIGN, block_size);
  ZS_REQUIRE(queue_depth >= 1 && queue_depth <= 4096,
             "queue_depth: expected 1..4096 requests in flight, got %d",
             queue_depth);
  zs__aio* a = (zs__aio*)calloc(1, sizeof *a);
  if (a == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "I/O queue");
  a->qd = queue_depth;
  a->block = block_size;
  a->reqs = (zs__aio_req*)calloc((size_t)queue_depth, sizeof *a->reqs);
  a->queue = (int*)calloc((size_t)queue_depth, sizeof *a->queue);
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->work, NULL);
  pthread_cond_init(&a->done, NULL);
  if (a->reqs == NULL || a->queue == NULL) {
    zs__aio_destroy(a);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "I/O queue of %d", queue_depth);
  }
  if (backend != ZS__AIO_THREADS) {
    const int rc = io_uring_queue_init((unsigned)queue_depth, &a->ring, 0);
    if (rc == 0) {
      a->backend = ZS__AIO_URING;
      *out = a;
      return ZS_OK;
    }
    if (backend == ZS__AIO_URING) {
      zs__aio_destroy(a);
      return zs__error(ZS_ERR_UNSUPPORTED,
                       "io_uring is not available here (io_uring_queue_init: "
                       "%s); the thread-pool backend works everywhere",
                       strerror(-rc));
    }
    zs__log(ZS_LOG_INFO, "NVMe offload: io_uring unavailable (%s); using the "
            "thread-pool I/O backend", strerror(-rc));
  }
  a->backend = ZS__AIO_THREADS;
  const int want = queue_depth < 8 ? queue_depth : 8;
  a->th = (pthread_t*)calloc((size_t)want, sizeof *a->th);
  if (a->th == NULL) {
    zs__aio_destroy(a);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "I/O threads");
  }
  for (int i = 0; i < want; i++) {
    if (pthread_create(&a->th[i], NULL, zs__aio_worker, a) != 0) {
      zs__aio_destroy(a);
      return zs__error(ZS_ERR_INTERNAL, "cannot start I/O thread %d", i);
    }
    a->nth = i + 1;
  }
  *out = a;
  return ZS_OK;
}

void zs__aio_destroy(zs__aio* a) {
  if (a == NULL) return;
  if (a->backend == ZS__AIO_URING) {
    while (a->inflight > 0) zs__uring_reap_one(a);
    io_uring_queue_exit(&a->ring);
  } else {
    pthread_mutex_lock(&a->mu);
    a->quit = 1;
    pthread_cond_broadcast(&a->work);
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; i < a->nth; i++) pthread_join(a->th[i], NULL);
  }
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->work);
  pthread_cond_destroy(&a->done);
  free(a->th);
  free(a->queue);
  free(a->reqs);
  free(a);
}

const char* zs__aio_backend_name(const zs__aio* a) {
  return a->backend == ZS__AIO_URING ? "io_uring" : "threads";
}

static zs_status zs__aio_submit_one(zs__aio* a, zs__aio_file* f, int write,
                                    void* buf, size_t bytes, uint64_t offset);

/* A free request slot (one exists: fewer than qd are in flight), filled in
 * with the next ticket and counted in flight (threads: the caller holds
 * mu). */
static int zs__aio_claim(zs__aio* a, zs__aio_file* f, int write, void* buf,
                         size_t bytes, uint64_t offset) {
  int slot = 0;
  while (a->reqs[slot].busy) slot++;
  a->reqs[slot] = (zs__aio_req){f, write, buf, bytes, offset, 1, ++a->tickets};
  a->inflight++;
  return slot;
}

zs_status zs__aio_submit(zs__aio* a, zs__aio_file* f, int write, void* buf,
                         size_t bytes, uint64_t offset) {
  zs_status st = ZS_OK;
  if (a->block == 0 || bytes <= a->block) {
    st = zs__aio_submit_one(a, f, write, buf, bytes, offset);
  } else {
    /* block-size transfers keep queue_depth of them in flight */
    for (size_t o = 0; o < bytes && st == ZS_OK; o += a->block) {
      const size_t n = bytes - o < a->block ? bytes - o : a->block;
      st = zs__aio_submit_one(a, f, write, (char*)buf + o, n, offset + o);
    }
  }
  if (a->backend == ZS__AIO_URING) zs__uring_flush(a);
  return st;
}

static zs_status zs__aio_submit_one(zs__aio* a, zs__aio_file* f, int write,
                                    void* buf, size_t bytes, uint64_t offset) {
  ZS_REQUIRE(((uintptr_t)buf % ZS__AIO_ALIGN) == 0 &&
                 bytes % ZS__AIO_ALIGN == 0 && offset % ZS__AIO_ALIGN == 0,
             "%s of %s: buffer %p, size %zu and offset %llu must be multiples "
             "of %d bytes (direct I/O)", write ? "write" : "read", f->path,
             buf, bytes, (unsigned long long)offset, ZS__AIO_ALIGN);
  ZS_REQUIRE(bytes > 0 && bytes <= ((size_t)1 << 30) &&
                 offset + bytes <= f->bytes,
             "%s of %zu bytes at offset %llu of %s: outside its %llu bytes "
             "(or over 1 GiB in one request)", write ? "write" : "read",
             bytes, (unsigned long long)offset, f->path,
             (unsigned long long)f->bytes);
  if (a->backend == ZS__AIO_URING) {
    while (a->inflight >= a->qd) zs__uring_reap_one(a);
    struct io_uring_sqe* sqe = io_uring_get_sqe(&a->ring);
    if (sqe == NULL) { /* cannot happen: entries == qd >= inflight + 1 */
      return zs__error(ZS_ERR_INTERNAL, "io_uring: no submission entry");
    }
    const int slot = zs__aio_claim(a, f, write, buf, bytes, offset);
    if (write) io_uring_prep_write(sqe, f->fd, buf, (unsigned)bytes, offset);
    else io_uring_prep_read(sqe, f->fd, buf, (unsigned)bytes, offset);
    io_uring_sqe_set_data64(sqe, (uint64_t)slot);
    a->unsubmitted++; /* given to the kernel at the end of zs__aio_submit */
    return ZS_OK;
  }
  pthread_mutex_lock(&a->mu);
  while (a->inflight >= a->qd) pthread_cond_wait(&a->done, &a->mu);
  const int slot = zs__aio_claim(a, f, write, buf, bytes, offset);
  a->queue[(a->qhead + a->qcount) % a->qd] = slot;
  a->qcount++;
  pthread_cond_signal(&a->work);
  pthread_mutex_unlock(&a->mu);
  return ZS_OK;
}

uint64_t zs__aio_last_ticket(const zs__aio* a) { return a->tickets; }

uint64_t zs__aio_failures(zs__aio* a) {
  if (a->backend == ZS__AIO_URING) return a->failures;
  pthread_mutex_lock(&a->mu);
  const uint64_t n = a->failures;
  pthread_mutex_unlock(&a->mu);
  return n;
}

/* Whether a request with a ticket <= t is still in flight. */
static int zs__aio_pending_upto(const zs__aio* a, uint64_t t) {
  for (int i = 0; i < a->qd; i++)
    if (a->reqs[i].busy && a->reqs[i].ticket <= t) return 1;
  return 0;
}

/* Takes the recorded failure (threads: the caller holds mu, so that a
 * worker recording one meanwhile cannot be lost). */
static zs_status zs__aio_take_error(zs__aio* a, char* msg, size_t cap) {
  const zs_status st = a->err;
  a->err = ZS_OK;
  if (st != ZS_OK) snprintf(msg, cap, "%s", a->msg);
  return st;
}

/* Waits until no request with a ticket <= upto is in flight (UINT64_MAX:
 * none at all) and takes the recorded failure. */
static zs_status zs__aio_wait_upto(zs__aio* a, uint64_t upto) {
  char msg[sizeof a->msg];
  zs_status st;
  if (a->backend == ZS__AIO_URING) {
    while (upto == UINT64_MAX ? a->inflight > 0 : zs__aio_pending_upto(a, upto))
      zs__uring_reap_one(a);
    st = zs__aio_take_error(a, msg, sizeof msg);
  } else {
    pthread_mutex_lock(&a->mu);
    int waited = 0;
    while (upto == UINT64_MAX ? a->inflight > 0 : zs__aio_pending_upto(a, upto))
      if (zs__cond_wait_s(&a->done, &a->mu, ZS__AIO_WARN_S) == ETIMEDOUT) {
        waited += ZS__AIO_WARN_S;
        zs__aio_warn_waiting(a, waited);
      }
    st = zs__aio_take_error(a, msg, sizeof msg);
    pthread_mutex_unlock(&a->mu);
  }
  if (st != ZS_OK) return zs__error(st, "%s", msg);
  return ZS_OK;
}

zs_status zs__aio_wait_until(zs__aio* a, uint64_t ticket) {
  return zs__aio_wait_upto(a, ticket);
}

zs_status zs__aio_wait(zs__aio* a) { return zs__aio_wait_upto(a, UINT64_MAX); }

/* ==== Files ================================================================= */

zs_status zs__aio_file_create(zs__aio* a, const char* path, uint64_t bytes,
                              zs__aio_file** out) {
  (void)a;
  *out = NULL;
  ZS_REQUIRE(strlen(path) < sizeof(((zs__aio_file*)0)->path),
             "swap file path too long: %s", path);
  zs__aio_file* f = (zs__aio_file*)calloc(1, sizeof *f);
  if (f == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "swap file %s", path);
  snprintf(f->path, sizeof f->path, "%s", path);
  f->bytes = bytes;
  f->direct = 1;
  f->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (f->fd < 0 && errno == EINVAL) { /* no O_DIRECT here (ramfs, old tmpfs) */
    static int warned = 0;
    if (!warned++)
      zs__log(ZS_LOG_WARN, "NVMe offload: %s does not support O_DIRECT; "
              "using buffered I/O (the page cache) there", path);
    f->direct = 0;
    f->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    /* Linux creates the file before it checks O_DIRECT (ramfs): O_EXCL did
     * not fail first, so the file is the one that call made; an empty
     * regular file of ours is opened as it is */
    struct stat sb;
    if (f->fd < 0 && errno == EEXIST) {
      f->fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (f->fd >= 0 && (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
                         sb.st_size != 0 || sb.st_uid != geteuid())) {
        close(f->fd);
        f->fd = -1;
        errno = EEXIST;
      }
    }
  }
  if (f->fd < 0) {
    const int e = errno;
    free(f);
    return zs__error(ZS_ERR_IO, "cannot create swap file %s: %s", path,
                     strerror(e));
  }
  if (bytes > 0 && fallocate(f->fd, 0, 0, (off_t)bytes) != 0) {
    int e = errno;
    if (e == EOPNOTSUPP && ftruncate(f->fd, (off_t)bytes) == 0) e = 0;
    if (e != 0) {
      zs__aio_file_close(f, 1);
      return zs__error(ZS_ERR_IO, "cannot reserve %llu bytes for swap file "
                       "%s: %s", (unsigned long long)bytes, path,
                       e == ENOSPC ? "no space left on the device (disk full)"
                                   : strerror(e));
    }
  }
  *out = f;
  return ZS_OK;
}

void zs__aio_file_close(zs__aio_file* f, int remove) {
  if (f == NULL) return;
  if (f->fd >= 0) close(f->fd);
  if (remove) unlink(f->path);
  free(f);
}

const char* zs__aio_file_path(const zs__aio_file* f) { return f->path; }
