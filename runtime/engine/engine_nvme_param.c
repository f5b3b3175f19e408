/*
 * engine_nvme_param.c — stage-3 parameter shards on NVMe (offload_param =
 * nvme; ZeRO-Infinity, Rajbhandari et al. SC'21, sec. 5-6, and DeepSpeed's
 * partitioned-parameter swapper): each unit's shard lives in its own
 * 4 KiB-aligned region of one parameter swap file per model. A pool of
 * param_buffer_count pinned buffers caches shards:
 *
 *   on disk --read (demand, or ahead along the prefetch trace)--> buffer
 *   buffer --all-gather--> params_full (the buffer is pinned until the
 *                                       all-gather is waited for; with a
 *                                       GPU the all-gather reads a device
 *                                       copy of it: zs__coll_source)
 *   buffer --optimizer step, init, tensor_set, checkpoint load--> written
 *            back to the file (asynchronously; the buffer is reused only
 *            after its write completed)
 *
 * A buffer's reuse takes the least recently used one that nothing holds.
 * Every choice depends only on the order of calls (never on timing), so
 * ranks hold the same shards in their buffers and read from disk at the
 * same points. Before each all-gather every rank agrees on its shard (a
 * failed read on one rank fails the gather on every rank instead of
 * leaving the others waiting in the collective).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/aio.h"
#include "offload/offload.h"
#include "runtime/engine/engine_nvme_io.h"
#include "runtime/engine/engine_nvme_param.h"

typedef struct zs__pslot {
  void* buf;
  int unit;              /* the unit whose shard it holds, -1 none */
  int pins;              /* holders that read or write it now */
  int gather_pin;        /* an all-gather of the unit reads it */
  int ahead;             /* read ahead, not used since */
  int dirty;             /* holds changes the file may not have: set at a
                            write-back, cleared once it is known to have
                            reached the file */
  uint64_t read_ticket;  /* its read (0: none in flight) */
  uint64_t write_ticket; /* its latest write-back (0: none) */
  uint64_t read_mark;    /* the queue's failure count when each was */
  uint64_t write_mark;   /* submitted (zs__aio_failures) */
  uint64_t used;         /* clock of its last use (least recently used) */
} zs__pslot;

struct zs__nvme_params {
  zs__aio_file* file;
  uint64_t* offset; /* per unit: its region of the file */
  size_t* bytes;    /* per unit: the shard's bytes rounded up to 4 KiB */
  int* slot;        /* per unit: the buffer holding it, -1: on disk only */
  zs__pslot* slots;
  int nslots;
  uint64_t clock;
  uint64_t file_bytes;
  uint64_t reads;   /* shards read from the file (zs_offload_info) */
  uint64_t ahead;   /* ... of which read ahead */
};


static zs__aio* zs__param_aio(const zs_model* m) {
  return zs__nvme_aio(m->ctx->engine->nvme);
}

/* ==== Setup ================================================================== */

void zs__nvme_param_free(zs_model* m) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return;
  (void)zs__aio_wait(zs__param_aio(m)); /* nothing may still use a buffer */
  for (int s = 0; np->slots != NULL && s < np->nslots; s++)
    zs__offload_host_free(m, np->slots[s].buf);
  for (int i = 0; i < m->nunits; i++) m->units[i].params_shard = NULL;
  zs__aio_file_close(np->file, 1);
  free(np->slots);
  free(np->offset);
  free(np->bytes);
  free(np->slot);
  free(np);
  m->nvme_params = NULL;
}

zs_status zs__nvme_param_init(zs_model* m) {
  zs__nvme_param_free(m); /* a finalize that failed earlier */
  const zs_nvme_config* c = &m->ctx->config.nvme;
  zs_status st = ZS_OK;
  zs__nvme_params* np = (zs__nvme_params*)calloc(1, sizeof *np);
  if (np == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe parameters");
  m->nvme_params = np;
  const int n = m->nunits > 0 ? m->nunits : 1;
  np->offset = (uint64_t*)calloc((size_t)n, sizeof *np->offset);
  np->bytes = (size_t*)calloc((size_t)n, sizeof *np->bytes);
  np->slot = (int*)calloc((size_t)n, sizeof *np->slot);
  np->nslots = (int)c->param_buffer_count;
  np->slots = (zs__pslot*)calloc((size_t)np->nslots, sizeof *np->slots);
  if (!np->offset || !np->bytes || !np->slot || !np->slots)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "NVMe parameters: %d units", m->nunits);
  size_t most = ZS__NVME_ALIGN, widest = 1;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    np->bytes[i] = zs__layout_nvme_round(u->layout.shard * u->elem);
    np->offset[i] = np->file_bytes;
    np->file_bytes += np->bytes[i];
    np->slot[i] = -1;
    if (np->bytes[i] > most) most = np->bytes[i];
    if (u->elem > widest) widest = u->elem;
    if (c->param_buffer_elements != 0 && u->layout.shard > c->param_buffer_elements)
      ZS_FAIL(ZS_ERR_INVALID_ARGUMENT,
              "config.nvme.param_buffer_elements %zu is below the shard of "
              "unit '%s' (%zu elements): raise it, or use 0 for the largest "
              "shard", c->param_buffer_elements, u->name, u->layout.shard);
  }
  if (c->param_buffer_elements != 0)
    most = zs__layout_nvme_round(c->param_buffer_elements * widest);
  char path[4096 + 64];
  snprintf(path, sizeof path, "%s/params-%d.swap", zs__nvme_dir(m->ctx->engine->nvme),
           zs__nvme_next_file(m->ctx->engine->nvme));
  ZS_CHECK(zs__aio_file_create(zs__param_aio(m), path,
                               np->file_bytes > 0 ? np->file_bytes : ZS__NVME_ALIGN,
                               &np->file));
  for (int s = 0; s < np->nslots; s++) {
    np->slots[s].unit = -1;
    /* registered with a GPU: copies and kernels reach it */
    ZS_CHECK(zs__offload_host_alloc_as(m, most, "NVMe parameters",
                                       ZS_MEM_NVME_STAGING, &np->slots[s].buf));
  }
  zs__log(ZS_LOG_INFO, "NVMe offload: %s: parameter shards of %d units, %llu "
          "bytes; %d buffers of %zu bytes", path, m->nunits,
          (unsigned long long)np->file_bytes, np->nslots, most);
cleanup:
  if (st != ZS_OK) zs__nvme_param_free(m);
  return st;
}

uint64_t zs__nvme_param_file_bytes(const zs_model* m) {
  return m->nvme_params != NULL ? m->nvme_params->file_bytes : 0;
}

void zs__nvme_param_counts(const zs_model* m, uint64_t* reads, uint64_t* ahead) {
  if (m->nvme_params == NULL) return;
  *reads += m->nvme_params->reads;
  *ahead += m->nvme_params->ahead;
}

/* ==== Buffers ================================================================ */

/* Waits for slot s's read (write = 0) or latest write-back and makes sure
 * it succeeded. A failure the wait returns is the error (IO, naming file
 * and offset). But the queue returns each failure to one wait only, which
 * may have been another caller's: so if the wait succeeds while some
 * transfer failed since this one was submitted, this one is done again,
 * synchronously (up to twice). A write redone holds the buffer's current
 * contents, which are the newest. */
static zs_status zs__pslot_settle(zs_model* m, int s, int write) {
  zs__nvme_params* np = m->nvme_params;
  zs__pslot* b = &np->slots[s];
  zs__aio* aio = zs__param_aio(m);
  uint64_t* ticket = write ? &b->write_ticket : &b->read_ticket;
  uint64_t* mark = write ? &b->write_mark : &b->read_mark;
  /* a dirty buffer with no write in flight: its last write failed (and
   * was reported); it is written again now */
  const int retry = write && b->dirty && *ticket == 0;
  if (*ticket == 0 && !retry) return ZS_OK;
  zs_status st = ZS_OK;
  int redo = retry;
  if (!retry) {
    st = zs__aio_wait_until(aio, *ticket);
    /* a failure this wait returns is reported as it is (it names its
     * transfer); one that went to another wait is redone here */
    redo = st == ZS_OK && zs__aio_failures(aio) != *mark;
  }
  for (int tries = 0; redo && tries < 2; tries++) {
    *mark = zs__aio_failures(aio);
    st = zs__aio_submit(aio, np->file, write, b->buf, np->bytes[b->unit],
                        np->offset[b->unit]);
    if (st == ZS_OK) st = zs__aio_wait_until(aio, zs__aio_last_ticket(aio));
    redo = st == ZS_OK && zs__aio_failures(aio) != *mark;
  }
  if (redo)
    st = zs__error(ZS_ERR_IO, "NVMe parameters: the %s of unit '%s' (%zu "
                   "bytes at offset %llu of %s) kept failing", write ? "write"
                   : "read", m->units[b->unit].name, np->bytes[b->unit],
                   (unsigned long long)np->offset[b->unit],
                   zs__aio_file_path(np->file));
  *ticket = 0;
  if (write && st == ZS_OK) b->dirty = 0; /* the file has it */
  return st;
}

/* Forgets what slot s holds: makes sure its latest write-back reached the
 * file, waits for a read into it (it is about to be reused) and detaches
 * its unit. A buffer whose changes cannot reach the file stays with its
 * unit (the error is returned; nothing is dropped). */
static zs_status zs__pslot_evict(zs_model* m, int s) {
  zs__nvme_params* np = m->nvme_params;
  zs__pslot* b = &np->slots[s];
  /* the file must hold what the buffer held; a read's contents go */
  zs_status st = b->unit >= 0 ? zs__pslot_settle(m, s, 1) : ZS_OK;
  if (b->dirty) return st;
  if (b->read_ticket > 0) {
    const zs_status r = zs__aio_wait_until(zs__param_aio(m), b->read_ticket);
    if (st == ZS_OK) st = r;
  }
  if (b->unit >= 0) {
    np->slot[b->unit] = -1;
    m->units[b->unit].params_shard = NULL;
  }
  b->unit = -1;
  b->ahead = b->dirty = 0;
  b->read_ticket = b->write_ticket = 0;
  return st;
}

/* A slot for a new shard: an empty one, else the least recently used one
 * that nothing pins. A demand (ahead = 0) may take one that an all-gather
 * still reads, or one whose write-back is in flight (it waits for them); a
 * read-ahead takes only a clean one with nothing in flight (so it never
 * waits, nor takes another read-ahead's). -1: none. */
static int zs__pslot_choose(const zs_model* m, int ahead) {
  const zs__nvme_params* np = m->nvme_params;
  int best = -1;
  for (int s = 0; s < np->nslots; s++) {
    const zs__pslot* b = &np->slots[s];
    if (b->unit < 0) return s;
    if (b->pins > 0) continue;
    if (ahead && (b->gather_pin || b->ahead || b->dirty || b->write_ticket ||
                  b->read_ticket))
      continue;
    if (best < 0 || b->used < np->slots[best].used) best = s;
  }
  return best;
}

/* Gives slot s to unit ui (the slot is evicted first) and, unless blank,
 * starts reading the unit's shard into it. */
static zs_status zs__pslot_read(zs_model* m, int ui, int s, int blank) {
  zs__nvme_params* np = m->nvme_params;
  zs__pslot* b = &np->slots[s];
  zs__unit* owner = b->unit >= 0 ? &m->units[b->unit] : NULL;
  if (owner != NULL && b->gather_pin) {
    /* the all-gather reading it finishes first (every rank waits for the
     * same one: the choice depends only on the order of calls) */
    zs_status st = zs__inflight_wait(m->ctx->shard_comm, &owner->gather_ops);
    b->gather_pin = 0;
    if (st != ZS_OK) return st;
  }
  zs_status st = zs__pslot_evict(m, s);
  if (st != ZS_OK) return st;
  if (b->unit >= 0) /* cannot happen: a clean eviction detaches */
    return zs__error(ZS_ERR_INTERNAL, "NVMe parameters: slot %d still holds "
                     "unit '%s'", s, m->units[b->unit].name);
  b->unit = ui;
  np->slot[ui] = s;
  b->used = ++np->clock;
  if (np->bytes[ui] > 0 && !blank) {
    b->read_mark = zs__aio_failures(zs__param_aio(m));
    st = zs__aio_submit(zs__param_aio(m), np->file, 0, b->buf, np->bytes[ui],
                        np->offset[ui]);
    if (st != ZS_OK) {
      np->slot[ui] = -1;
      b->unit = -1;
      return st;
    }
    b->read_ticket = zs__aio_last_ticket(zs__param_aio(m));
    np->reads++;
  }
  return ZS_OK;
}

/* A transfer failed while unit u needed its shard (its own, or another
 * one found while waiting): every transfer is waited for, which also
 * clears the failure from the queue (it is reported once, here), and the
 * unit's slot (if any) is dropped, its contents not being the shard. */
static zs_status zs__param_io_failed(zs_model* m, zs__unit* u, int s,
                                     zs_status st) {
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  (void)zs__aio_wait(zs__param_aio(m));
  if (s >= 0) (void)zs__pslot_evict(m, s);
  return zs__error(st, "NVMe parameters of unit '%s': %s", u->name, saved);
}

static zs_status zs__param_take(zs_model* m, zs__unit* u, int blank) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return ZS_OK;
  const int ui = (int)(u - m->units);
  int s = np->slot[ui];
  zs_status st = ZS_OK;
  if (s < 0) {
    s = zs__pslot_choose(m, 0);
    if (s < 0)
      return zs__error(ZS_ERR_INVALID_STATE,
                       "NVMe parameters: all %d buffers are in use; unit '%s' "
                       "needs one (config.nvme.param_buffer_count)",
                       np->nslots, u->name);
    st = zs__pslot_read(m, ui, s, blank);
    if (st != ZS_OK) return zs__param_io_failed(m, u, np->slot[ui], st);
  }
  zs__pslot* b = &np->slots[s];
  st = zs__pslot_settle(m, s, 0);
  if (st != ZS_OK) return zs__param_io_failed(m, u, s, st);
  b->pins++;
  b->ahead = 0;
  b->used = ++np->clock;
  u->params_shard = b->buf;
  return ZS_OK;
}

zs_status zs__param_acquire(zs_model* m, zs__unit* u) {
  return zs__param_take(m, u, 0);
}

zs_status zs__param_acquire_blank(zs_model* m, zs__unit* u) {
  return zs__param_take(m, u, 1);
}

void zs__param_release(zs_model* m, zs__unit* u) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return;
  const int s = np->slot[u - m->units];
  if (s >= 0 && np->slots[s].pins > 0) np->slots[s].pins--;
}

zs_status zs__param_write_back(zs_model* m, zs__unit* u) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return ZS_OK;
  const int ui = (int)(u - m->units), s = np->slot[ui];
  if (s < 0 || np->bytes[ui] == 0) return ZS_OK;
  zs__pslot* b = &np->slots[s];
  /* an earlier write of the region completes first: two writes of one
   * region in flight together may land in either order */
  zs_status st = b->write_ticket != 0 ? zs__pslot_settle(m, s, 1) : ZS_OK;
  if (st != ZS_OK) /* the buffer stays dirty: written again later */
    return zs__error_prefix(st, "NVMe parameters of unit '%s': ", u->name);
  /* the padding past the shard goes to disk as zeros, never stale bytes */
  const size_t used = u->layout.shard * u->elem;
  memset((char*)b->buf + used, 0, np->bytes[ui] - used);
  b->write_mark = zs__aio_failures(zs__param_aio(m));
  st = zs__aio_submit(zs__param_aio(m), np->file, 1, b->buf, np->bytes[ui],
                      np->offset[ui]);
  if (st != ZS_OK)
    return zs__error_prefix(st, "NVMe parameters of unit '%s': ", u->name);
  b->write_ticket = zs__aio_last_ticket(zs__param_aio(m));
  b->dirty = 1;
  return ZS_OK;
}

zs_status zs__param_flush(zs_model* m) {
  if (m->nvme_params == NULL) return ZS_OK;
  zs__nvme_params* np = m->nvme_params;
  zs_status st = zs__aio_wait(zs__param_aio(m));
  /* each transfer's own outcome (a failure may have gone to another
   * waiter; settle redoes it) */
  for (int s = 0; s < np->nslots; s++) {
    if (np->slots[s].unit < 0) continue;
    const zs_status w = zs__pslot_settle(m, s, 1);
    const zs_status r = zs__pslot_settle(m, s, 0);
    if (st == ZS_OK) st = w != ZS_OK ? w : r;
  }
  if (st != ZS_OK) {
    /* after a failed transfer no buffer is trusted */
    return zs__param_abort(m, zs__error_prefix(st, "NVMe parameters: "));
  }
  return ZS_OK;
}

zs_status zs__param_abort(zs_model* m, zs_status st) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return st;
  char saved[1024]; /* the caller's error stays the one reported */
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  (void)zs__aio_wait(zs__param_aio(m));
  for (int s = 0; s < np->nslots; s++) {
    zs__pslot* b = &np->slots[s];
    if (b->gather_pin && b->unit >= 0)
      (void)zs__inflight_wait(m->ctx->shard_comm, &m->units[b->unit].gather_ops);
    /* changes not on disk are lost here: the caller reports the failure */
    b->pins = b->gather_pin = b->dirty = 0;
    b->read_ticket = b->write_ticket = 0;
    (void)zs__pslot_evict(m, s);
  }
  return zs__error(st, "%s", saved);
}

int zs__param_read_ahead(zs_model* m, int unit) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL || np->slot[unit] >= 0) return 1;
  const int s = zs__pslot_choose(m, 1);
  if (s < 0) return 0;
  /* an error here is found again by the acquire that needs the shard */
  if (zs__pslot_read(m, unit, s, 0) == ZS_OK) {
    np->slots[s].ahead = 1;
    np->ahead++;
  }
  return 1;
}

/* ==== Around a unit's optimizer step ========================================= */

zs_status zs__param_step_begin(zs_model* m, zs__unit* u, int next) {
  if (m->nvme_params == NULL) return ZS_OK;
  zs_status st = zs__param_acquire(m, u);
  if (st == ZS_OK && next >= 0) zs__param_read_ahead(m, next);
  return st;
}

zs_status zs__param_step_end(zs_model* m, zs__unit* u, zs_status st) {
  if (m->nvme_params == NULL) return st;
  if (st == ZS_OK) st = zs__param_write_back(m, u);
  zs__param_release(m, u);
  return st;
}

/* ==== The all-gather's source ================================================ */

zs_status zs__param_gather_source(zs_model* m, zs__unit* u) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL) return ZS_OK;
  zs_status local = zs__param_acquire(m, u);
  /* Every rank agrees on the shard before the all-gather (one small
   * all-reduce): a rank whose read failed must not leave the others
   * waiting in the collective. Agreeing on every gather, not only on those
   * that read, keeps this true even if an earlier failure left the ranks'
   * buffers holding different shards. */
  zs_status st = zs__comm_agree(m->ctx->comm, local, "NVMe parameter read");
  if (st != ZS_OK) {
    if (local == ZS_OK) zs__param_release(m, u);
    return st;
  }
  const int s = np->slot[u - m->units];
  np->slots[s].gather_pin = 1;
  np->slots[s].pins--; /* the all-gather's pin holds it from here */
  return ZS_OK;
}

void zs__param_gather_done(zs_model* m, zs__unit* u) {
  zs__nvme_params* np = m->nvme_params;
  if (np == NULL || u->gather_ops.n > 0) return;
  const int s = np->slot[u - m->units];
  if (s >= 0) np->slots[s].gather_pin = 0;
}
