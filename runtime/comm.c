/*
 * comm.c — backend-independent collective wrappers: counting (calls, bytes
 * as nccl-tests counts them, time), the per-step sequence hash, and the
 * cross-rank "same description" check used for configs and layouts.
 */
#include "runtime/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void zs__comm_note(zs__comm* c, zs_coll_op op, size_t count,
                          zs_dtype dtype, int root, double seconds) {
  size_t elem = zs_dtype_size(dtype);
  size_t bytes = count * elem;
  if (op == ZS_COLL_ALL_GATHER || op == ZS_COLL_REDUCE_SCATTER)
    bytes *= (size_t)c->world;
  c->counters.calls[op]++;
  c->counters.bytes[op] += bytes;
  c->counters.seconds[op] += seconds;
  uint64_t rec[4] = {(uint64_t)op, (uint64_t)count, (uint64_t)dtype,
                     (uint64_t)(int64_t)root};
  c->seq_hash = zs__hash_bytes(c->seq_hash, rec, sizeof rec);
  c->seq_count++;
}

void zs__comm_seq_reset(zs__comm* c) {
  c->seq_hash = ZS__FNV_SEED;
  c->seq_count = 0;
}

zs_status zs__comm_all_gather(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype) {
  double t0 = zs__now();
  zs_status st = c->ops->all_gather(c, send, recv, count, dtype, NULL, NULL);
  zs__comm_note(c, ZS_COLL_ALL_GATHER, count, dtype, -1, zs__now() - t0);
  return st;
}

zs_status zs__comm_reduce_scatter(zs__comm* c, const void* send, void* recv,
                                  size_t count, zs_dtype dtype,
                                  zs__red_op op) {
  double t0 = zs__now();
  zs_status st =
      c->ops->reduce_scatter(c, send, recv, count, dtype, op, NULL, NULL);
  zs__comm_note(c, ZS_COLL_REDUCE_SCATTER, count, dtype, -1, zs__now() - t0);
  return st;
}

zs_status zs__comm_all_reduce(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype, zs__red_op op) {
  double t0 = zs__now();
  zs_status st = c->ops->all_reduce(c, send, recv, count, dtype, op, NULL, NULL);
  zs__comm_note(c, ZS_COLL_ALL_REDUCE, count, dtype, -1, zs__now() - t0);
  return st;
}

zs_status zs__comm_broadcast(zs__comm* c, void* buf, size_t count,
                             zs_dtype dtype, int root) {
  double t0 = zs__now();
  zs_status st = c->ops->broadcast(c, buf, count, dtype, root, NULL, NULL);
  zs__comm_note(c, ZS_COLL_BROADCAST, count, dtype, root, zs__now() - t0);
  return st;
}

/* Broadcasts a NUL-terminated copy of `len` bytes from root. */
static zs_status zs__bcast_copy(zs__comm* c, const char* mine, size_t len,
                                int root, char** out) {
  char* buf = (char*)calloc(len + 1, 1);
  if (buf == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "check: calloc");
  if (c->rank == root) memcpy(buf, mine, len);
  zs_status st = zs__comm_broadcast(c, buf, len, ZS_UINT8, root);
  if (st != ZS_OK) {
    free(buf);
    return st;
  }
  *out = buf;
  return ZS_OK;
}

/* Copies line `k` (0-based) of text into out (at most cap bytes). */
static void zs__line(const char* text, size_t k, char* out, size_t cap) {
  const char* p = text;
  for (size_t i = 0; i < k && p != NULL; i++) {
    p = strchr(p, '\n');
    if (p != NULL) p++;
  }
  if (p == NULL || *p == '\0') {
    snprintf(out, cap, "(nothing)");
    return;
  }
  size_t n = strcspn(p, "\n");
  snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
}

/* Index of the first line where a and b differ. */
static size_t zs__first_diff_line(const char* a, const char* b) {
  size_t line = 0;
  for (size_t i = 0; a[i] == b[i] && a[i] != '\0'; i++)
    if (a[i] == '\n') line++;
  return line;
}

zs_status zs__comm_check_same(zs__comm* c, const char* what, const char* desc,
                              size_t len) {
  zs_status st = ZS_OK;
  uint64_t* all = NULL;
  char *ref = NULL, *bad = NULL;
  uint64_t mine[2] = {zs__hash_bytes(ZS__FNV_SEED, desc, len), (uint64_t)len};
  all = (uint64_t*)calloc(2 * (size_t)c->world, sizeof *all);
  if (all == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "check: calloc");
  ZS_CHECK(zs__comm_all_gather(c, mine, all, 2, ZS_UINT64));
  int bad_rank = -1;
  for (int r = 1; r < c->world && bad_rank < 0; r++)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) bad_rank = r;
  if (bad_rank < 0) goto cleanup;
  /* Every rank knows bad_rank and both lengths from the gathered vector, so
   * the two broadcasts below are issued identically everywhere. */
  ZS_CHECK(zs__bcast_copy(c, desc, (size_t)all[1], 0, &ref));
  ZS_CHECK(zs__bcast_copy(c, desc, (size_t)all[2 * bad_rank + 1], bad_rank,
                          &bad));
  size_t k = zs__first_diff_line(ref, bad);
  char line_ref[512], line_bad[512];
  zs__line(ref, k, line_ref, sizeof line_ref);
  zs__line(bad, k, line_bad, sizeof line_bad);
  st = zs__error(ZS_ERR_MISMATCH,
                 "%s differs across ranks: rank %d has '%s' where rank 0 has "
                 "'%s'", what, bad_rank, line_bad, line_ref);
cleanup:
  free(bad);
  free(ref);
  free(all);
  return st;
}

void zs__comm_destroy(zs__comm* c) {
  if (c != NULL) c->ops->destroy(c);
}
