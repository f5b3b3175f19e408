/*
 * engine_nvme_io.c — NVMe offload's per-context state: the asynchronous
 * I/O queue (io_uring, else a thread pool) and this rank's swap directory
 * under config.nvme.path, made at context creation and removed (with every
 * swap file in it) at destroy, also from a signal handler
 * (zs_context_remove_files).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "offload/aio.h"
#include "runtime/engine/engine_nvme_io.h"

_Static_assert(ZS__NVME_ALIGN == ZS__AIO_ALIGN,
               "the layout's rounding is direct I/O's");

struct zs__nvme {
  zs__aio* aio;
  char dir[4096]; /* this rank's swap directory */
  int made_dir;
  int models;     /* swap files made so far (their names' numbers) */
};

zs_status zs__nvme_create(zs_context* ctx, zs__nvme** out) {
  *out = NULL;
  const zs_nvme_config* c = &ctx->config.nvme;
  zs__nvme* n = (zs__nvme*)calloc(1, sizeof *n);
  if (n == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe offload");
  int len = snprintf(n->dir, sizeof n->dir, "%s/zs-%016llx-rank-%05d", c->path,
                     (unsigned long long)ctx->run_id, ctx->rank);
  if (len < 0 || (size_t)len >= sizeof n->dir - 64) {
    free(n);
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "config.nvme.path is too long");
  }
  if (mkdir(n->dir, 0700) != 0) {
    const int e = errno;
    zs_status st = zs__error(ZS_ERR_IO, "NVMe offload: cannot create the "
                             "swap directory %s (config.nvme.path %s): %s",
                             n->dir, c->path, strerror(e));
    free(n);
    return st;
  }
  n->made_dir = 1;
  zs_status st = zs__aio_create(c->queue_depth, c->block_size,
                                (zs__aio_backend)c->aio, &n->aio);
  if (st != ZS_OK) {
    zs__nvme_destroy(n);
    return st;
  }
  zs__log(ZS_LOG_INFO, "NVMe offload: swap files in %s, %s I/O, queue depth %d",
          n->dir, zs__aio_backend_name(n->aio), c->queue_depth);
  *out = n;
  return ZS_OK;
}

void zs__nvme_destroy(zs__nvme* n) {
  if (n == NULL) return;
  zs__aio_destroy(n->aio);
  const int e = n->made_dir && rmdir(n->dir) != 0 ? errno : 0;
  /* gone already (zs_context_remove_files, or the user): nothing to say */
  if (e != 0 && e != ENOENT)
    zs__log(ZS_LOG_WARN, "NVMe offload: cannot remove %s: %s%s", n->dir,
            strerror(e), e == ENOTEMPTY || e == EEXIST
                             ? " (files the runtime did not make are left "
                               "alone)"
                             : "");
  free(n);
}

/* dst (cap bytes) = a + b + the decimal k + c, with nothing but stores:
 * callable from a signal handler. Returns 0 if it did not fit. */
static int zs__path_join(char* dst, size_t cap, const char* a, const char* b,
                         int k, const char* c) {
  char num[16];
  int d = 0;
  do num[d++] = (char)('0' + k % 10);
  while ((k /= 10) > 0 && d < (int)sizeof num);
  const char* parts[3] = {a, b, c};
  size_t len = 0;
  for (int i = 0; i < 3; i++) {
    for (const char* p = parts[i]; *p != '\0'; p++) {
      if (len + 1 >= cap) return 0;
      dst[len++] = *p;
    }
    while (i == 1 && d > 0) { /* the number goes between b and c */
      if (len + 1 >= cap) return 0;
      dst[len++] = num[--d];
    }
  }
  dst[len] = '\0';
  return 1;
}

void zs__nvme_remove_files(zs__nvme* n) {
  if (n == NULL) return;
  char path[sizeof n->dir + 64];
  /* each number names one file, of either kind (engine_nvme_param.c) */
  for (int k = 0; k < n->models; k++) {
    if (zs__path_join(path, sizeof path, n->dir, "/model-", k, ".swap"))
      unlink(path);
    if (zs__path_join(path, sizeof path, n->dir, "/params-", k, ".swap"))
      unlink(path);
  }
  if (n->made_dir && rmdir(n->dir) == 0) n->made_dir = 0;
}

zs__aio* zs__nvme_aio(const zs__nvme* n) { return n->aio; }

const char* zs__nvme_dir(const zs__nvme* n) { return n->dir; }

int zs__nvme_next_file(zs__nvme* n) { return n->models++; }

const char* zs__nvme_aio_name(const zs__nvme* n) {
  return zs__aio_backend_name(n->aio);
}
