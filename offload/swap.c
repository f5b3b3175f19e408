/*
 * swap.c — the three-slot read/step/write pipeline of swap.h.
 */
#include "offload/swap.h"

#include <stdio.h>

/* Queues the reads (write = 0) or writes of group k's fields through slot
 * s; returns the ticket of the last one. */
static zs_status zs__swap_io(zs__aio* a, zs__aio_file* f,
                             const zs__swap_group* g, int nfields,
                             void* const* bufs, int write, uint64_t* ticket) {
  for (int i = 0; i < nfields; i++) {
    zs_status st = zs__aio_submit(a, f, write, bufs[i], g->bytes, g->offset[i]);
    if (st != ZS_OK) return st;
  }
  *ticket = zs__aio_last_ticket(a);
  return ZS_OK;
}

zs_status zs__swap_pipeline(zs__aio* a, zs__aio_file* f,
                            const zs__swap_group* groups, int ngroups,
                            int nfields, void* const slots[3][ZS__SWAP_MAX_FIELDS],
                            zs_status (*step)(void* arg, int k, void* const* bufs),
                            void* arg) {
  ZS_REQUIRE(nfields >= 1 && nfields <= ZS__SWAP_MAX_FIELDS,
             "swap pipeline: %d fields per sub-group (1..%d)", nfields,
             ZS__SWAP_MAX_FIELDS);
  if (ngroups <= 0) return ZS_OK;
  zs_status st = ZS_OK;
  uint64_t read_done = 0; /* ticket of the latest read */
  ZS_CHECK(zs__swap_io(a, f, &groups[0], nfields, slots[0], 0, &read_done));
  for (int k = 0; k < ngroups; k++) {
    /* group k is in; so is everything queued before its read, which
     * includes the write of group k-2 from the slot group k+1 takes */
    ZS_CHECK(zs__aio_wait_until(a, read_done));
    if (k + 1 < ngroups)
      ZS_CHECK(zs__swap_io(a, f, &groups[k + 1], nfields, slots[(k + 1) % 3], 0,
                           &read_done));
    ZS_CHECK(step(arg, k, slots[k % 3]));
    uint64_t unused;
    ZS_CHECK(zs__swap_io(a, f, &groups[k], nfields, slots[k % 3], 1, &unused));
  }
  ZS_CHECK(zs__aio_wait(a));
cleanup:
  if (st != ZS_OK) {
    /* nothing may still read into or write from the caller's buffers */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", zs__error_body());
    (void)zs__aio_wait(a);
    return zs__error(st, "%s", saved);
  }
  return st;
}
