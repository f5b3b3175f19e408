/*
 * layout.h — pure layout math: tensors -> offsets in a unit's flat buffer,
 * padding to a multiple of the world size, each rank's shard, and the
 * pieces of tensors that fall into any span of the buffer. No MPI, no
 * allocation, no global state: every function is testable on its own.
 *
 * All sizes and offsets are in ELEMENTS of the unit's dtype.
 *
 * A unit's flat buffer:  [t0][gap][t1][gap]...[tn-1][padding]
 *   - each tensor starts at a multiple of `align` elements (64 bytes);
 *   - `used` ends after the last tensor;
 *   - `padded` = round_up(used, world * align), so the buffer splits into
 *     `world` equal shards of `shard` = padded / world elements, each
 *     starting aligned. Gaps and padding belong to no tensor: they are
 *     zero, never read as data, and never counted in norms or checkpoints.
 */
#ifndef ZS_RUNTIME_LAYOUT_H_
#define ZS_RUNTIME_LAYOUT_H_

#include <stddef.h>

#include <zeroshard.h>

#include "runtime/core/core_policy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes every tensor start (and every shard start) is aligned to. */
#define ZS_LAYOUT_ALIGN_BYTES 64

typedef struct zs__unit_layout {
  size_t used;   /* elements up to the end of the last tensor */
  size_t padded; /* elements, a multiple of world * align */
  size_t shard;  /* elements per rank: padded / world */
} zs__unit_layout;

/* A contiguous run of one tensor inside a span of the flat buffer. */
typedef struct zs__piece {
  int tensor;           /* index into the unit's tensor arrays */
  size_t tensor_offset; /* elements from the tensor's start */
  size_t span_offset;   /* elements from the span's start */
  size_t count;         /* elements */
} zs__piece;

/* Alignment in elements for an element size in bytes (64 / elem_size). */
size_t zs__layout_align(size_t elem_size);

/* NVMe offload's staging (engine_optim_nvme.c, and the estimator): a pool of
 * buffer_count buffers gives the step's pipeline a ring of buffer_count /
 * nfields slots of a sub-group's nfields fields (nfields >= 1), at most
 * ZS__NVME_MAX_SLOTS (the engine refuses fewer than 3). */
#define ZS__NVME_MAX_SLOTS 16
static inline int zs__layout_nvme_slots(size_t buffer_count, int nfields) {
  const size_t n = buffer_count / (size_t)nfields;
  return n > ZS__NVME_MAX_SLOTS ? ZS__NVME_MAX_SLOTS : (int)n;
}

/* NVMe offload's unit of direct I/O, in BYTES (offload/aio.h's
 * ZS__AIO_ALIGN): every region of a swap file and every pinned buffer is
 * a multiple of it. zs__layout_nvme_round: `bytes` rounded up to it. */
#define ZS__NVME_ALIGN 4096
static inline size_t zs__layout_nvme_round(size_t bytes) {
  return (bytes + ZS__NVME_ALIGN - 1) / ZS__NVME_ALIGN * ZS__NVME_ALIGN;
}

/* NVMe offload's sub-group, in ELEMENTS: as many fp32 elements as a pool
 * buffer of buffer_size BYTES holds, lowered to sub_group_size when that
 * is set (nonzero) and smaller (DeepSpeed's sub_group_size). */
static inline size_t zs__layout_nvme_sub_group(size_t buffer_size,
                                               size_t sub_group_size) {
  const size_t sg = buffer_size / 4;
  return sub_group_size > 0 && sub_group_size < sg ? sub_group_size : sg;
}

/* BYTES one field (master weights, or one optimizer state) of an
 * optimizer span of `span` elements takes in the swap file: its
 * sub-groups of `sg` elements (sg >= 1), each region rounded up to 4 KiB
 * for direct I/O (engine_optim_nvme.c lays the file out so; the estimator adds
 * it up). */
static inline size_t zs__layout_nvme_span_bytes(size_t span, size_t sg) {
  return span / sg * zs__layout_nvme_round(sg * 4) +
         zs__layout_nvme_round(span % sg * 4);
}

/* Lays out n tensors of a unit. numels[i]: elements of tensor i. alias[i]:
 * nonzero for a tied tensor, which takes no storage (offsets[i] is set to
 * (size_t)-1). align >= 1, world >= 1. offsets: n entries, written.
 * Errors: INVALID_ARGUMENT (bad align/world, size_t overflow). */
zs_status zs__layout_unit(const size_t* numels, const int* alias, int n,
                          size_t align, int world, size_t* offsets,
                          zs__unit_layout* out);

/* First element of rank's shard: rank * shard. */
static inline size_t zs__layout_shard_begin(const zs__unit_layout* l,
                                            int rank) {
  return (size_t)rank * l->shard;
}

/* Most units reducing at once (engine_grad.c finishes the oldest before
 * starting another): the bucket temporaries and accumulation buffers of at
 * most this many units are alive (the estimator counts them). */
#define ZS__MAX_REDUCING 2

/* Bytes of the persistent buffers one rank holds for a unit under its
 * policy (core_policy.h; the paper's memory model, per unit): the
 * parameters (the policy's extent: full at stages 0-2, the shard at 3)
 * and, for a trainable unit, the gradients (full at 0-1, the shard at 2-3;
 * gelem bytes each), the fp32 master copy (16-bit units) and each fp32
 * optimizer state over the optimizer's span (full at stage 0, the shard at
 * 1-3), wherever the policy puts them. The engine allocates exactly these;
 * the estimator adds them up. */
typedef struct zs__unit_bytes {
  size_t params, grads, master, state;
} zs__unit_bytes;

zs__unit_bytes zs__layout_unit_bytes(const zs__unit_layout* l,
                                     const zs__policy* p, size_t elem,
                                     size_t gelem);

/* Writes the pieces of the storage-owning tensors (alias[i] == 0, and
 * skip[i] == 0 when skip is not NULL) that intersect [begin, end), in
 * buffer order, to out (at most cap of them). Returns how many pieces
 * intersect (which may exceed cap: call with cap 0 to size the array). */
size_t zs__layout_pieces(const size_t* offsets, const size_t* numels,
                         const int* alias, const int* skip, int n,
                         size_t begin, size_t end, zs__piece* out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_LAYOUT_H_ */
