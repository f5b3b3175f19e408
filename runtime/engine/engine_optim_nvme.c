/*
 * engine_optim_nvme.c — NVMe offload of the optimizer states
 * (ZeRO-Infinity, Rajbhandari et al. SC'21, sec. 6): each model's master
 * weights and optimizer states in one swap file, split into sub-groups
 * that stream through a ring of pinned buffers (read k+1 while k steps on
 * the CPU workers and k-1 is written) as the step's store, and the reads and writes of one
 * unit's field for checkpoints and zs_tensor_get/set.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload/aio.h"
#include "offload/offload.h"
#include "offload/swap.h"
#include "runtime/engine/engine_nvme_io.h"
#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"
#include "runtime/engine/engine_optim_nvme.h"

_Static_assert(ZS__NVME_MAX_SLOTS == ZS__SWAP_MAX_SLOTS,
               "the estimator's ring is the pipeline's");

typedef struct zs__nvme_model {
  zs__aio_file* file;
  zs__swap_group* groups;
  int* unit;       /* per group: its unit */
  size_t* lo;      /* per group: its elements [lo, hi) of the unit's span */
  size_t* hi;
  int ngroups;
  int has_master;  /* field 0 is the master weights */
  int nfields;
  int nslots;      /* the pipeline's ring: buffer_count / nfields, 3..16 */
  void* slots[ZS__SWAP_MAX_SLOTS][ZS__SWAP_MAX_FIELDS];
  uint64_t file_bytes;
} zs__nvme_model;

void zs__nvme_model_free(zs_model* m) {
  zs__nvme_model* nm = m->nvme;
  if (nm == NULL) return;
  for (int s = 0; s < ZS__SWAP_MAX_SLOTS; s++)
    for (int f = 0; f < ZS__SWAP_MAX_FIELDS; f++)
      zs__offload_free(m->ctx->offload, nm->slots[s][f]);
  zs__aio_file_close(nm->file, 1); /* the swap file goes with the model */
  free(nm->groups);
  free(nm->unit);
  free(nm->lo);
  free(nm->hi);
  free(nm);
  m->nvme = NULL;
}

zs_status zs__nvme_model_init(zs_model* m) {
  zs__nvme_model_free(m); /* a finalize that failed earlier may have left one */
  zs__nvme* n = m->ctx->engine->nvme;
  const zs_nvme_config* c = &m->ctx->config.nvme;
  zs_status st = ZS_OK;
  int has_master = 0, nstates = 0, ngroups = 0;
  const size_t sg = zs__layout_nvme_sub_group(c->buffer_size, c->sub_group_size);
  uint64_t elems = 0; /* of the spans, to see what the rounding costs */
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    has_master |= u->dtype != ZS_FLOAT32;
    nstates = u->nstates;
    const size_t span = zs__optimize_span_elems(m, u);
    ngroups += (int)((span + sg - 1) / sg);
    elems += span;
  }
  const int nfields = has_master + nstates;
  if (nfields == 0 || ngroups == 0) return ZS_OK; /* nothing to keep */
  if ((size_t)(3 * nfields) > c->buffer_count)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config.nvme.buffer_count %zu is below the %d buffers "
                     "NVMe offload needs here (3 sub-groups in flight at least, x %d "
                     "fields: %s%d optimizer state(s))", c->buffer_count,
                     3 * nfields, nfields, has_master ? "master weights and " : "",
                     nstates);
  zs__nvme_model* nm = (zs__nvme_model*)calloc(1, sizeof *nm);
  if (nm == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe offload");
  m->nvme = nm;
  nm->has_master = has_master;
  nm->nfields = nfields;
  nm->nslots = zs__layout_nvme_slots(c->buffer_count, nfields);
  nm->groups = (zs__swap_group*)calloc((size_t)ngroups, sizeof *nm->groups);
  nm->unit = (int*)calloc((size_t)ngroups, sizeof *nm->unit);
  nm->lo = (size_t*)calloc((size_t)ngroups, sizeof *nm->lo);
  nm->hi = (size_t*)calloc((size_t)ngroups, sizeof *nm->hi);
  if (!nm->groups || !nm->unit || !nm->lo || !nm->hi)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "NVMe offload: %d sub-groups", ngroups);
  uint64_t off = 0;
  size_t most = 0;
  int k = 0;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    if (!u->trainable) continue;
    const size_t span = zs__optimize_span_elems(m, u);
    for (size_t lo = 0; lo < span; lo += sg, k++) {
      const size_t hi = span - lo < sg ? span : lo + sg;
      zs__swap_group* g = &nm->groups[k];
      g->bytes = zs__layout_nvme_round((hi - lo) * sizeof(float));
      for (int f = 0; f < nfields; f++) {
        g->offset[f] = off;
        off += g->bytes;
      }
      if (g->bytes > most) most = g->bytes;
      nm->unit[k] = i;
      nm->lo[k] = lo;
      nm->hi[k] = hi;
    }
  }
  nm->ngroups = ngroups;
  nm->file_bytes = off;
  /* Each sub-group's regions are rounded up to 4 KiB: with small
   * sub-groups that dominates (1 element: 4096 bytes for 4). Allowed (the
   * result is the same), but said once, with the cost. */
  const uint64_t exact = elems * 4 * (uint64_t)nfields;
  if (off > 2 * exact && off - exact > ((uint64_t)1 << 20))
    zs__log(ZS_LOG_WARN, "NVMe offload: sub_group_size %zu: the swap file "
            "takes %llu bytes for %llu bytes of states, because every "
            "sub-group's regions are rounded up to 4 KiB for direct I/O; a "
            "sub_group_size of 1024 elements or more keeps that below 2x",
            sg, (unsigned long long)off, (unsigned long long)exact);
  char path[4096 + 64];
  snprintf(path, sizeof path, "%s/model-%d.swap", zs__nvme_dir(n), zs__nvme_next_file(n));
  ZS_CHECK(zs__aio_file_create(zs__nvme_aio(n), path, off, &nm->file));
  for (int s = 0; s < nm->nslots; s++)
    for (int f = 0; f < nfields; f++)
      ZS_CHECK(zs__offload_alloc_as(m->ctx->offload, most, "NVMe staging",
                                    ZS_MEM_NVME_STAGING, &nm->slots[s][f]));
  zs__log(ZS_LOG_INFO, "NVMe offload: %s: %llu bytes in %d sub-groups of up "
          "to %zu elements", path, (unsigned long long)off, ngroups, sg);
cleanup:
  if (st != ZS_OK) zs__nvme_model_free(m);
  return st;
}

uint64_t zs__nvme_file_bytes(const zs_model* m) {
  return m->nvme != NULL ? m->nvme->file_bytes : 0;
}

/* The NVMe store (engine_optim.h): the swap file's sub-groups, each a
 * chunk, through the ring of pinned slots (offload/swap.h's schedule:
 * sub-group k+1 .. k+nslots-2 read while k steps and k-1 is written). */
typedef struct zs__nvme_store_impl {
  zs__swap swap;
  void* const* bufs; /* the acquired chunk's slot */
} zs__nvme_store_impl;

static void zs__nvme_chunk(const zs__state_store* s, int k, int* unit, size_t* lo,
                           size_t* hi) {
  const zs__nvme_model* nm = s->m->nvme;
  *unit = nm->unit[k];
  *lo = nm->lo[k];
  *hi = nm->hi[k];
}

static zs_status zs__nvme_acquire(zs__state_store* s, int k, float** master,
                                  float* states[ZS_OPTIM_MAX_STATES]) {
  zs__nvme_store_impl* x = (zs__nvme_store_impl*)s->impl;
  const zs__nvme_model* nm = s->m->nvme;
  zs_status st = zs__swap_acquire(&x->swap, k, &x->bufs);
  if (st != ZS_OK) return st;
  const zs__unit* u = &s->m->units[nm->unit[k]];
  /* field 0 is the master weights when the model has any (an fp32 unit
   * leaves its region unused); the states follow */
  const int f = nm->has_master;
  *master = u->policy.master_tier == ZS__TIER_NVME ? (float*)x->bufs[0] : NULL;
  for (int j = 0; j < ZS_OPTIM_MAX_STATES; j++)
    states[j] = j < u->nstates ? (float*)x->bufs[f + j] : NULL;
  return ZS_OK;
}

static zs_status zs__nvme_release(zs__state_store* s, int k) {
  return zs__swap_release(&((zs__nvme_store_impl*)s->impl)->swap, k);
}

static zs_status zs__nvme_finish(zs__state_store* s, zs_status st) {
  zs__nvme_store_impl* x = (zs__nvme_store_impl*)s->impl;
  st = zs__swap_end(&x->swap, st);
  if (st == ZS_OK)
    for (int i = 0; i < s->m->nunits; i++)
      if (s->m->units[i].trainable) s->m->units[i].master_stale = 0;
  free(x);
  s->impl = NULL;
  return st;
}

zs_status zs__nvme_store(zs_model* m, zs__state_store* out) {
  zs__nvme_model* nm = m->nvme;
  memset(out, 0, sizeof *out);
  out->name = "nvme";
  out->m = m;
  out->nchunks = nm->ngroups;
  out->stale_master = 1;
  out->chunk = zs__nvme_chunk;
  out->acquire = zs__nvme_acquire;
  out->release = zs__nvme_release;
  out->finish = zs__nvme_finish;
  zs__nvme_store_impl* x = (zs__nvme_store_impl*)calloc(1, sizeof *x);
  if (x == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe offload step: the store");
  out->impl = x;
  zs_status st = zs__swap_begin(&x->swap, zs__nvme_aio(m->ctx->engine->nvme),
                                nm->file, nm->groups, nm->ngroups, nm->nfields,
                                nm->nslots, nm->slots);
  if (st != ZS_OK) {
    st = zs__swap_end(&x->swap, st);
    free(x);
    out->impl = NULL;
  }
  return st;
}

zs_status zs__nvme_read_field(zs_model* m, zs__unit* u, int field,
                              float** out) {
  *out = NULL;
  zs__nvme_model* nm = m->nvme;
  const int f = field < 0 ? 0 : nm->has_master + field; /* -1: master */
  const size_t span = zs__optimize_span_elems(m, u);
  float* buf = (float*)malloc((span > 0 ? span : 1) * sizeof(float));
  if (buf == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe read-back");
  zs_status st = ZS_OK;
  for (int k = 0; k < nm->ngroups && st == ZS_OK; k++) {
    if (&m->units[nm->unit[k]] != u) continue;
    const zs__swap_group* g = &nm->groups[k];
    st = zs__aio_submit(zs__nvme_aio(m->ctx->engine->nvme), nm->file, 0, nm->slots[0][0],
                        g->bytes, g->offset[f]);
    if (st == ZS_OK) st = zs__aio_wait(zs__nvme_aio(m->ctx->engine->nvme));
    if (st == ZS_OK)
      memcpy(buf + nm->lo[k], nm->slots[0][0],
             (nm->hi[k] - nm->lo[k]) * sizeof(float));
  }
  if (st != ZS_OK) {
    free(buf);
    return st;
  }
  *out = buf;
  return ZS_OK;
}

zs_status zs__nvme_write_field(zs_model* m, zs__unit* u, int field,
                               const float* buf) {
  zs__nvme_model* nm = m->nvme;
  const int f = field < 0 ? 0 : nm->has_master + field;
  zs_status st = ZS_OK;
  for (int k = 0; k < nm->ngroups && st == ZS_OK; k++) {
    if (&m->units[nm->unit[k]] != u) continue;
    const zs__swap_group* g = &nm->groups[k];
    const size_t bytes = (nm->hi[k] - nm->lo[k]) * sizeof(float);
    memcpy(nm->slots[0][0], buf + nm->lo[k], bytes);
    memset((char*)nm->slots[0][0] + bytes, 0, g->bytes - bytes);
    st = zs__aio_submit(zs__nvme_aio(m->ctx->engine->nvme), nm->file, 1, nm->slots[0][0],
                        g->bytes, g->offset[f]);
    if (st == ZS_OK) st = zs__aio_wait(zs__nvme_aio(m->ctx->engine->nvme));
  }
  return st;
}

zs_status zs__nvme_shard(zs_model* m, zs__unit* u, int field, char** out,
                         float** tmp) {
  zs_status st = ZS_OK;
  if (field < 0 && u->master_stale) {
    /* master weights not stepped since the parameters were written are
     * those parameters, widened (what zs__master_refresh would give): no
     * need to read the file */
    char *p, *g;
    st = zs__param_acquire(m, u);
    if (st != ZS_OK) return st;
    const size_t span = zs__optimize_span(m, u, &p, &g);
    *tmp = (float*)malloc((span > 0 ? span : 1) * sizeof(float));
    if (*tmp == NULL) st = zs__error(ZS_ERR_OUT_OF_MEMORY, "NVMe read-back");
    /* the context's device converts where the parameters are; the result
     * comes to the host */
    float* dst = *tmp;
    zs__device* dev = m->ctx->device;
    if (st == ZS_OK && dev != m->ctx->host)
      st = zs__dev_alloc(dev, ZS_MEM_OTHER, (span > 0 ? span : 1) * sizeof(float),
                         0, "NVMe read-back", (void**)&dst);
    if (st == ZS_OK)
      st = dev->ops->convert(dev, dst, ZS_FLOAT32, p, u->dtype, span, NULL);
    if (st == ZS_OK && dst != *tmp)
      st = dev->ops->copy(dev, *tmp, dst, span * sizeof(float), NULL);
    if (dst != *tmp) zs__dev_free(dev, dst);
    zs__param_release(m, u);
  } else {
    st = zs__nvme_read_field(m, u, field, tmp);
  }
  if (st != ZS_OK) return st;
  *out = (char*)(*tmp + zs__span_shard_offset(m, u));
  return st;
}
