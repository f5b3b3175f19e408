/*
 * layout.c — pure layout math for flat buffers (see layout.h).
 */
#include "runtime/layout/layout.h"

#include <stdint.h>

#include "runtime/core/core.h"

static size_t zs__extent_elems(zs__extent e, const zs__unit_layout* l) {
  return e == ZS__EXTENT_FULL ? l->padded : e == ZS__EXTENT_SHARD ? l->shard : 0;
}

zs__unit_bytes zs__layout_unit_bytes(const zs__unit_layout* l,
                                     const zs__policy* p, size_t elem,
                                     size_t gelem) {
  zs__unit_bytes b = {0, 0, 0, 0};
  b.params = zs__extent_elems(p->params, l) * elem;
  if (!p->trainable) return b;
  const size_t span = zs__policy_span(p, l->padded, l->shard) * sizeof(float);
  b.grads = zs__extent_elems(p->grads, l) * gelem;
  b.master = p->lowp ? span : 0;
  b.state = span;
  return b;
}

size_t zs__layout_align(size_t elem_size) {
  if (elem_size == 0 || elem_size > ZS_LAYOUT_ALIGN_BYTES) return 1;
  return ZS_LAYOUT_ALIGN_BYTES / elem_size;
}

/* x rounded up to a multiple of m, or 0 with *overflow set. */
static size_t zs__round_up_checked(size_t x, size_t m, int* overflow) {
  if (x > SIZE_MAX - (m - 1)) {
    *overflow = 1;
    return 0;
  }
  return (x + m - 1) / m * m;
}

zs_status zs__layout_unit(const size_t* numels, const int* alias, int n,
                          size_t align, int world, size_t* offsets,
                          zs__unit_layout* out) {
  if (align == 0 || world < 1 || n < 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "layout: align %zu, world %d, %d tensors", align, world,
                     n);
  int overflow = 0;
  size_t cursor = 0;
  for (int i = 0; i < n; i++) {
    if (alias[i]) {
      offsets[i] = (size_t)-1;
      continue;
    }
    cursor = zs__round_up_checked(cursor, align, &overflow);
    offsets[i] = cursor;
    if (numels[i] > SIZE_MAX - cursor) overflow = 1;
    cursor += numels[i];
  }
  if (!overflow && align > SIZE_MAX / (size_t)world) overflow = 1;
  size_t padded =
      overflow ? 0 : zs__round_up_checked(cursor, align * (size_t)world,
                                          &overflow);
  if (overflow)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "layout: unit size overflows size_t");
  out->used = cursor;
  out->padded = padded;
  out->shard = padded / (size_t)world;
  return ZS_OK;
}

size_t zs__layout_pieces(const size_t* offsets, const size_t* numels,
                         const int* alias, const int* skip, int n,
                         size_t begin, size_t end, zs__piece* out,
                         size_t cap) {
  size_t count = 0;
  for (int i = 0; i < n; i++) {
    if (alias[i] || (skip != NULL && skip[i]) || numels[i] == 0) continue;
    size_t t0 = offsets[i], t1 = offsets[i] + numels[i];
    size_t lo = t0 > begin ? t0 : begin;
    size_t hi = t1 < end ? t1 : end;
    if (lo >= hi) continue;
    if (count < cap)
      out[count] = (zs__piece){i, lo - t0, lo - begin, hi - lo};
    count++;
  }
  return count;
}
