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
                            int nfields, int nslots,
                            void* const slots[][ZS__SWAP_MAX_FIELDS],
                            zs_status (*step)(void* arg, int k, void* const* bufs),
                            void* arg) {
  ZS_REQUIRE(nfields >= 1 && nfields <= ZS__SWAP_MAX_FIELDS,
             "swap pipeline: %d fields per sub-group (1..%d)", nfields,
             ZS__SWAP_MAX_FIELDS);
  ZS_REQUIRE(nslots >= 3 && nslots <= ZS__SWAP_MAX_SLOTS,
             "swap pipeline: %d slots (3..%d)", nslots, ZS__SWAP_MAX_SLOTS);
  if (ngroups <= 0) return ZS_OK;
  zs_status st = ZS_OK;
  /* Group k uses slot k % nslots. While k is stepped, k-1 is being
   * written and k+1 .. k+nslots-2 are being read. */
  uint64_t read_done[ZS__SWAP_MAX_SLOTS] = {0}, write_done[ZS__SWAP_MAX_SLOTS] = {0};
  /* The queue returns each failure to one wait only, maybe another
   * caller's (the step's callback does I/O too): a group is stepped only
   * if no transfer failed since the pipeline began. */
  const uint64_t failures = zs__aio_failures(a);
  const int ahead = nslots - 2;
  for (int j = 0; j < ahead && j < ngroups; j++)
    ZS_CHECK(zs__swap_io(a, f, &groups[j], nfields, slots[j], 0, &read_done[j]));
  for (int k = 0; k < ngroups; k++) {
    const int s = k % nslots;
    ZS_CHECK(zs__aio_wait_until(a, read_done[s]));
    if (zs__aio_failures(a) != failures)
      ZS_FAIL(ZS_ERR_IO, "a transfer failed before sub-group %d of %s was "
              "stepped (its error was reported to another waiter)", k,
              zs__aio_file_path(f));
    /* the next read takes the slot of group k-2, whose write must be done */
    const int j = k + ahead;
    if (j < ngroups) {
      const int js = j % nslots;
      if (write_done[js] > 0) ZS_CHECK(zs__aio_wait_until(a, write_done[js]));
      ZS_CHECK(zs__swap_io(a, f, &groups[j], nfields, slots[js], 0, &read_done[js]));
    }
    ZS_CHECK(step(arg, k, slots[s]));
    ZS_CHECK(zs__swap_io(a, f, &groups[k], nfields, slots[s], 1, &write_done[s]));
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
