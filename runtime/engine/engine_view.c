/*
 * engine_view.c — the views of stacked kinds. Each view is a memfd mapping
 * (MAP_SHARED) of the kind's whole extent: its address never changes, and
 * pages can be given back with fallocate(PUNCH_HOLE) while the mapping
 * stays (the next write faults in a zeroed page). A per-page count of the
 * held slices overlapping it decides which pages are resident: exactly
 * those under some held slice (boundary pages shared by two slices stay
 * while either is held). ZS_MEM_STACKED_VIEWS counts them, and the
 * estimator (estimate.c) computes the same pages from the offsets.
 */
#define _GNU_SOURCE
#include "runtime/engine/engine_view.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t zs__page(void) {
  static size_t page = 0;
  if (page == 0) {
    const long p = sysconf(_SC_PAGESIZE);
    page = p > 0 ? (size_t)p : 4096;
  }
  return page;
}

/* Accounting of a view's resident pages: one entry keyed by its base,
 * replaced when the count changes. */
static void zs__view_account(zs_model* m, zs__view* v, size_t before,
                             const char* label) {
  if (before == v->resident) return;
  zs__accounting* a = m->ctx->acct;
  if (before > 0) (void)zs__accounting_remove(a, ZS__OWNER_RUNTIME, v->base,
                                              NULL, NULL);
  if (v->resident > 0)
    (void)zs__accounting_add(a, ZS__OWNER_RUNTIME, ZS_MEM_STACKED_VIEWS,
                             v->base, v->resident, label);
}

static zs_status zs__view_map(zs__view* v, const zs__kind* k, size_t elem,
                              const char* what) {
  const size_t page = zs__page();
  const size_t bytes = k->numel * elem;
  const size_t pages = bytes == 0 ? 1 : (bytes + page - 1) / page;
  char name[ZS_NAME_MAX + 16];
  snprintf(name, sizeof name, "zs-%s-%s", what, k->name);
  v->fd = memfd_create(name, MFD_CLOEXEC);
  if (v->fd < 0)
    return zs__error(ZS_ERR_IO, "stacked kind '%s': memfd_create of its %s "
                     "view failed: %s", k->name, what, strerror(errno));
  v->mapped = pages * page;
  v->elem = elem;
  if (ftruncate(v->fd, (off_t)v->mapped) != 0)
    return zs__error(ZS_ERR_IO, "stacked kind '%s': sizing its %s view to "
                     "%zu bytes failed: %s", k->name, what, v->mapped,
                     strerror(errno));
  void* p = mmap(NULL, v->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
  if (p == MAP_FAILED)
    return zs__error(errno == ENOMEM ? ZS_ERR_OUT_OF_MEMORY : ZS_ERR_IO,
                     "stacked kind '%s': mapping its %s view (%zu bytes) "
                     "failed: %s", k->name, what, v->mapped, strerror(errno));
  v->base = (char*)p;
  /* the releases give pages back this way: refuse now if it cannot */
  if (fallocate(v->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                (off_t)page) != 0)
    return zs__error(ZS_ERR_UNSUPPORTED, "stacked kind '%s': this system "
                     "cannot give back pages of a memfd (fallocate "
                     "PUNCH_HOLE: %s)", k->name, strerror(errno));
  v->live = (uint32_t*)calloc(pages, sizeof *v->live);
  if (v->live == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "stacked kind '%s': page table of "
                     "its %s view", k->name, what);
  return ZS_OK;
}

zs_status zs__views_create(zs_model* m) {
  for (int k = 0; k < m->nkinds; k++) {
    zs__kind* kd = &m->kinds[k];
    size_t elem = 0, gelem = 0;
    for (int l = 0; l < (int)kd->shape[0]; l++) {
      const int t = kd->slices[l];
      if (t < 0) continue;
      const zs__unit* u = &m->units[m->tensors[t].unit];
      elem = u->elem;
      if (!u->trainable || (m->tensors[t].flags & ZS_TENSOR_FROZEN)) continue;
      if (gelem != 0 && gelem != u->gelem)
        return zs__error(ZS_ERR_INVALID_ARGUMENT, "stacked kind '%s': its "
                         "slices' units have gradients of different dtypes "
                         "(unit '%s': %s)", kd->name, u->name,
                         zs_dtype_name(u->gdtype));
      gelem = u->gelem;
    }
    if (elem == 0) elem = zs_dtype_size(kd->dtype);
    zs_status st = zs__view_map(&kd->views[ZS__VIEW_PARAMS], kd, elem,
                                "parameter");
    if (st == ZS_OK && gelem > 0)
      st = zs__view_map(&kd->views[ZS__VIEW_GRADS], kd, gelem, "gradient");
    if (st != ZS_OK) return st;
  }
  return ZS_OK;
}

void zs__views_destroy(zs_model* m) {
  for (int k = 0; k < m->nkinds; k++)
    for (int w = 0; w < 2; w++) {
      zs__view* v = &m->kinds[k].views[w];
      if (v->resident > 0 && m->ctx != NULL)
        (void)zs__accounting_remove(m->ctx->acct, ZS__OWNER_RUNTIME, v->base,
                                    NULL, NULL);
      if (v->base != NULL) munmap(v->base, v->mapped);
      if (v->fd >= 0) close(v->fd);
      free(v->live);
      memset(v, 0, sizeof *v);
      v->fd = -1;
    }
}

void* zs__view_at(zs_model* m, const zs__tensor* t, int which) {
  const zs__view* v = &m->kinds[t->kind].views[which];
  return v->base + t->kind_offset * v->elem;
}

/* Slice i of unit u's tensors in view `which`: whether it takes part
 * (a non-empty slice, with a gradient for the gradient view), its view,
 * the unit's buffer holding it there (*buf) and its bytes in the view,
 * [*a, *b). */
static int zs__slice(zs_model* m, zs__unit* u, int i, int which,
                     zs__view** v, char** buf, size_t* a, size_t* b) {
  const zs__tensor* t = &m->tensors[u->tensors[i]];
  if (t->kind < 0 || t->tied_to >= 0 || t->numel == 0) return 0;
  *v = &m->kinds[t->kind].views[which];
  if ((*v)->fd < 0) return 0;
  if (which == ZS__VIEW_PARAMS) {
    *buf = zs__at(u->params_full, t->offset, u->elem);
  } else {
    if (!u->trainable || (t->flags & ZS_TENSOR_FROZEN) || u->grad_accum == NULL)
      return 0;
    *buf = zs__at(u->grad_accum, t->offset, u->gelem);
  }
  *a = t->kind_offset * (*v)->elem;
  *b = *a + t->numel * (*v)->elem;
  return 1;
}

static const char* zs__slice_kind(const zs_model* m, const zs__unit* u, int i) {
  return m->kinds[m->tensors[u->tensors[i]].kind].name;
}

static void zs__view_hold_one(zs_model* m, zs__unit* u, int which) {
  int* refs = which == ZS__VIEW_PARAMS ? &u->view_refs : &u->gview_refs;
  if ((*refs)++ > 0) return;
  const size_t page = zs__page();
  zs__view* v;
  char* src;
  size_t a, b;
  for (int i = 0; i < u->ntensors; i++) {
    if (!zs__slice(m, u, i, which, &v, &src, &a, &b)) continue;
    const size_t before = v->resident;
    for (size_t p = a / page; p <= (b - 1) / page; p++)
      if (v->live[p]++ == 0) v->resident += page;
    memcpy(v->base + a, src, b - a);
    zs__view_account(m, v, before, zs__slice_kind(m, u, i));
  }
}

static zs_status zs__view_drop_one(zs_model* m, zs__unit* u, int which) {
  int* refs = which == ZS__VIEW_PARAMS ? &u->view_refs : &u->gview_refs;
  if (*refs <= 0 || --(*refs) > 0) return ZS_OK;
  zs_status st = ZS_OK;
  const size_t page = zs__page();
  zs__view* v;
  char* dst;
  size_t a, b;
  for (int i = 0; i < u->ntensors; i++) {
    if (!zs__slice(m, u, i, which, &v, &dst, &a, &b)) continue;
    const char* kind = zs__slice_kind(m, u, i);
    if (which == ZS__VIEW_GRADS) memcpy(dst, v->base + a, b - a);
    const size_t before = v->resident;
    /* runs of pages no held slice overlaps any more, punched out */
    size_t run = 0, n = 0;
    for (size_t p = a / page; p <= (b - 1) / page + 1; p++) {
      const int freed = p <= (b - 1) / page && --v->live[p] == 0;
      if (freed) {
        if (n++ == 0) run = p;
        continue;
      }
      if (n == 0) continue;
      if (fallocate(v->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)(run * page), (off_t)(n * page)) == 0) {
        v->resident -= n * page;
      } else if (st == ZS_OK) {
        st = zs__error(ZS_ERR_IO, "stacked kind '%s': giving back %zu pages "
                       "of its %s view failed (they stay resident): %s",
                       kind, n, which == ZS__VIEW_PARAMS ? "parameter"
                       : "gradient", strerror(errno));
      }
      n = 0;
    }
    zs__view_account(m, v, before, kind);
  }
  return st;
}

void zs__view_hold(zs_model* m, zs__unit* u, int which) {
  zs__view_hold_one(m, u, which);
  for (int k = 0; k < u->nowners; k++)
    zs__view_hold_one(m, &m->units[u->owners[k]], which);
}

zs_status zs__view_drop(zs_model* m, zs__unit* u, int which) {
  zs_status st = zs__view_drop_one(m, u, which);
  for (int k = 0; k < u->nowners; k++) {
    const zs_status s2 = zs__view_drop_one(m, &m->units[u->owners[k]], which);
    if (st == ZS_OK) st = s2;
  }
  return st;
}
