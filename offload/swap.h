/*
 * swap.h — the pipelined sub-group schedule of NVMe offload (ZeRO-Infinity,
 * Rajbhandari et al. SC'21, sec. 6.2; DeepSpeed's pipelined optimizer
 * swapper): the optimizer states of the next sub-groups are read while
 * sub-group k is stepped on the CPU and sub-group k-1 is written back,
 * through a ring of slots of aligned host buffers (three or more).
 *
 * A sub-group is `nfields` regions of one swap file (say the fp32 master
 * weights, exp_avg and exp_avg_sq of a range of elements), each `bytes`
 * long at its own offset; sizes and offsets in BYTES, multiples of
 * ZS__AIO_ALIGN. The caller owns the file, the queue and the slot buffers.
 * Synchronous: returns when every write has completed.
 */
#ifndef ZS_OFFLOAD_SWAP_H_
#define ZS_OFFLOAD_SWAP_H_

#include <stddef.h>
#include <stdint.h>

#include "offload/aio.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { ZS__SWAP_MAX_FIELDS = 4, ZS__SWAP_MAX_SLOTS = 16 };

typedef struct zs__swap_group {
  uint64_t offset[ZS__SWAP_MAX_FIELDS]; /* each field's region in the file */
  size_t bytes;                          /* of each region */
} zs__swap_group;

/* The schedule one sub-group at a time, for a caller that runs its own
 * loop (the engine's optimizer step over its stores): zs__swap_begin
 * starts the first reads; for k = 0 .. ngroups-1 in order,
 * zs__swap_acquire waits for group k's reads (and starts the read of
 * k + nslots - 2 once its slot's write completed) and gives its buffers;
 * zs__swap_release starts group k's writes; zs__swap_end waits for every
 * request. The order, the errors and the guarantees are
 * zs__swap_pipeline's below (which is these four calls). The caller owns
 * `s` (no allocation); its arguments must outlive zs__swap_end. After an
 * error from begin, acquire or release, call zs__swap_end with that error:
 * it waits for what is in flight and returns the error. */
typedef struct zs__swap {
  zs__aio* a;
  zs__aio_file* f;
  const zs__swap_group* groups;
  int ngroups, nfields, nslots;
  void* const (*slots)[ZS__SWAP_MAX_FIELDS];
  uint64_t read_done[ZS__SWAP_MAX_SLOTS], write_done[ZS__SWAP_MAX_SLOTS];
  uint64_t failures; /* zs__aio_failures at begin */
} zs__swap;

zs_status zs__swap_begin(zs__swap* s, zs__aio* a, zs__aio_file* f,
                         const zs__swap_group* groups, int ngroups,
                         int nfields, int nslots,
                         void* const slots[][ZS__SWAP_MAX_FIELDS]);
zs_status zs__swap_acquire(zs__swap* s, int k, void* const** bufs);
zs_status zs__swap_release(zs__swap* s, int k);
zs_status zs__swap_end(zs__swap* s, zs_status st);

/* Runs step(arg, k, bufs) for k = 0 .. ngroups-1 in order, bufs[f] holding
 * field f of sub-group k as read from the file; what step leaves in bufs
 * is written back to the same regions. Order: with nslots slots (3 ..
 * ZS__SWAP_MAX_SLOTS), the reads of k+1 .. k+nslots-2 are in flight while
 * step(k) runs, and so is write(k-1); a slot is reused only after its
 * write completed. slots[s][f] (s < nslots, f < nfields): buffers of at
 * least the largest group's bytes, ZS__AIO_ALIGN-aligned.
 *
 * Errors: the first I/O failure (IO, naming the file, offset and size) or
 * step's status; no step runs on a sub-group whose read failed, and every
 * request has completed when this returns. After an error the file holds
 * the sub-groups stepped before it updated and the rest as they were (the
 * caller reports the state as inconsistent). INVALID_ARGUMENT for nfields
 * outside 1..ZS__SWAP_MAX_FIELDS or nslots outside 3..ZS__SWAP_MAX_SLOTS. */
zs_status zs__swap_pipeline(zs__aio* a, zs__aio_file* f,
                            const zs__swap_group* groups, int ngroups,
                            int nfields, int nslots,
                            void* const slots[][ZS__SWAP_MAX_FIELDS],
                            zs_status (*step)(void* arg, int k, void* const* bufs),
                            void* arg);

#ifdef __cplusplus
}
#endif

#endif /* ZS_OFFLOAD_SWAP_H_ */
