/*
 * swap.c — the three-slot read/step/write pipeline of swap.h.
 */
#include "offload/swap.h"

#include <stdio.h>
#include <string.h>

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

zs_status zs__swap_begin(zs__swap* s, zs__aio* a, zs__aio_file* f,
                         const zs__swap_group* groups, int ngroups,
                         int nfields, int nslots,
                         void* const slots[][ZS__SWAP_MAX_FIELDS]) {
  memset(s, 0, sizeof *s);
  s->a = a;
  s->f = f;
  s->groups = groups;
  s->ngroups = ngroups;
  s->nfields = nfields;
  s->nslots = nslots;
  s->slots = slots;
  ZS_REQUIRE(nfields >= 1 && nfields <= ZS__SWAP_MAX_FIELDS,
             "swap pipeline: %d fields per sub-group (1..%d)", nfields,
             ZS__SWAP_MAX_FIELDS);
  ZS_REQUIRE(nslots >= 3 && nslots <= ZS__SWAP_MAX_SLOTS,
             "swap pipeline: %d slots (3..%d)", nslots, ZS__SWAP_MAX_SLOTS);
  /* The queue returns each failure to one wait only, maybe another
   * caller's (the caller's loop does I/O too): a group is given out only
   * if no transfer failed since the schedule began. */
  s->failures = zs__aio_failures(a);
  /* Group k uses slot k % nslots. While k is stepped, k-1 is being
   * written and k+1 .. k+nslots-2 are being read. */
  const int ahead = nslots - 2;
  for (int j = 0; j < ahead && j < ngroups; j++) {
    zs_status st = zs__swap_io(a, f, &groups[j], nfields, slots[j], 0,
                               &s->read_done[j]);
    if (st != ZS_OK) return st;
  }
  return ZS_OK;
}

zs_status zs__swap_acquire(zs__swap* s, int k, void* const** bufs) {
  const int slot = k % s->nslots;
  zs_status st = zs__aio_wait_until(s->a, s->read_done[slot]);
  if (st != ZS_OK) return st;
  if (zs__aio_failures(s->a) != s->failures)
    return zs__error(ZS_ERR_IO, "a transfer failed before sub-group %d of %s "
                     "was stepped (its error was reported to another waiter)",
                     k, zs__aio_file_path(s->f));
  /* the next read takes the slot of group k-2, whose write must be done */
  const int j = k + s->nslots - 2;
  if (j < s->ngroups) {
    const int js = j % s->nslots;
    if (s->write_done[js] > 0) {
      st = zs__aio_wait_until(s->a, s->write_done[js]);
      if (st != ZS_OK) return st;
    }
    st = zs__swap_io(s->a, s->f, &s->groups[j], s->nfields, s->slots[js], 0,
                     &s->read_done[js]);
    if (st != ZS_OK) return st;
  }
  *bufs = s->slots[slot];
  return ZS_OK;
}

zs_status zs__swap_release(zs__swap* s, int k) {
  const int slot = k % s->nslots;
  return zs__swap_io(s->a, s->f, &s->groups[k], s->nfields, s->slots[slot], 1,
                     &s->write_done[slot]);
}

zs_status zs__swap_end(zs__swap* s, zs_status st) {
  if (st == ZS_OK) return zs__aio_wait(s->a);
  /* nothing may still read into or write from the caller's buffers */
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  (void)zs__aio_wait(s->a);
  return zs__error(st, "%s", saved);
}

zs_status zs__swap_pipeline(zs__aio* a, zs__aio_file* f,
                            const zs__swap_group* groups, int ngroups,
                            int nfields, int nslots,
                            void* const slots[][ZS__SWAP_MAX_FIELDS],
                            zs_status (*step)(void* arg, int k, void* const* bufs),
                            void* arg) {
  zs__swap s;
  zs_status st = zs__swap_begin(&s, a, f, groups, ngroups, nfields, nslots,
                                slots);
  for (int k = 0; k < ngroups && st == ZS_OK; k++) {
    void* const* bufs = NULL;
    st = zs__swap_acquire(&s, k, &bufs);
    if (st == ZS_OK) st = step(arg, k, bufs);
    if (st == ZS_OK) st = zs__swap_release(&s, k);
  }
  return zs__swap_end(&s, st);
}
