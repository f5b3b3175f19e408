/*
 * comm_local.c — the communicator of a single process without MPI (world
 * size 1, zs_context_create_local): every collective's effect on one rank
 * is a copy (or nothing), done at once. Buffers are host memory (device
 * memory is handled by the CUDA backend's communicator, which wraps this
 * one for its host-memory collectives).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_local.h"

#include "runtime/comm/comm.h"

/* Requests complete at once; one static byte gives them an identity. */
static char zs__local_token;

static zs_status zs__local_done(zs__comm_req** req) {
  if (req != NULL) *req = (zs__comm_req*)&zs__local_token;
  return ZS_OK;
}

static void zs__local_move(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src && src != ZS__IN_PLACE) memmove(dst, src, bytes);
}

static zs_status zs__local_all_gather(zs__comm* c, const void* send,
                                      void* recv, size_t count, zs_dtype dtype,
                                      zs__stream* stream, zs__comm_req** req) {
  (void)c;
  (void)stream;
  zs__local_move(recv, send, count * zs_dtype_size(dtype));
  return zs__local_done(req);
}

static zs_status zs__local_reduce_scatter(zs__comm* c, const void* send,
                                          void* recv, size_t count,
                                          zs_dtype dtype, zs__red_op op,
                                          zs__stream* stream,
                                          zs__comm_req** req) {
  (void)c;
  (void)op; /* sum, max and min over one rank: the value itself */
  (void)stream;
  zs__local_move(recv, send, count * zs_dtype_size(dtype));
  return zs__local_done(req);
}

static zs_status zs__local_all_reduce(zs__comm* c, const void* send,
                                      void* recv, size_t count, zs_dtype dtype,
                                      zs__red_op op, zs__stream* stream,
                                      zs__comm_req** req) {
  (void)c;
  (void)op;
  (void)stream;
  zs__local_move(recv, send, count * zs_dtype_size(dtype));
  return zs__local_done(req);
}

static zs_status zs__local_broadcast(zs__comm* c, void* buf, size_t count,
                                     zs_dtype dtype, int root,
                                     zs__stream* stream, zs__comm_req** req) {
  (void)c;
  (void)buf;
  (void)count;
  (void)dtype;
  (void)root;
  (void)stream;
  return zs__local_done(req);
}

static zs_status zs__local_exchange(zs__comm* c, const void* send,
                                    const size_t* offsets, void* recv,
                                    size_t chunk, zs_dtype dtype,
                                    zs__stream* stream, zs__comm_req** req) {
  (void)c;
  (void)stream;
  const size_t elem = zs_dtype_size(dtype);
  zs__local_move(recv, (const char*)send + offsets[0] * elem, chunk * elem);
  return zs__local_done(req);
}

static zs_status zs__local_all_gather_strided(zs__comm* c, void* buf,
                                              size_t offset, size_t stride,
                                              size_t chunk, zs_dtype dtype,
                                              zs__stream* stream,
                                              zs__comm_req** req) {
  (void)c;
  (void)buf;
  (void)offset;
  (void)stride;
  (void)chunk;
  (void)dtype;
  (void)stream;
  return zs__local_done(req);
}

static zs_status zs__local_gather_users(zs__comm* c, const void* send,
                                        void* recv, size_t count,
                                        zs_dtype dtype, uint64_t users,
                                        zs__stream* stream,
                                        zs__comm_req** req) {
  (void)c;
  (void)stream;
  if ((users & 1) && recv != NULL)
    zs__local_move(recv, send, count * zs_dtype_size(dtype));
  return zs__local_done(req);
}

static zs_status zs__local_wait(zs__comm* c, zs__comm_req* req) {
  (void)c;
  (void)req;
  return ZS_OK;
}

static zs_status zs__local_test(zs__comm* c, zs__comm_req* req, int* done) {
  (void)c;
  (void)req;
  *done = 1;
  return ZS_OK;
}

static void zs__local_destroy(zs__comm* c) { free(c); }

static const zs__comm_ops zs__local_ops = {
    "local",
    zs__local_all_gather,
    zs__local_reduce_scatter,
    zs__local_all_reduce,
    zs__local_broadcast,
    zs__local_exchange,
    zs__local_all_gather_strided,
    zs__local_wait,
    zs__local_test,
    NULL, /* nothing to progress */
    zs__local_destroy,
    NULL, /* no other rank to tell of a failure */
    NULL,
    NULL,
    NULL, /* no MPI: always usable */
    NULL, /* one lane */
    NULL, /* no other rank to agree with */
    NULL,
    zs__local_gather_users,
    NULL, /* reduce-scatter: an exchange and a sum */
    NULL, /* waits yield */
    NULL, /* host memory: nothing to chain on a device */
    NULL, /* no device timeline */
    NULL, /* reduce-scatter sums at completion */
};

zs_status zs__comm_local_create(zs__comm** out) {
  zs__comm* c = (zs__comm*)calloc(1, sizeof *c);
  if (c == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "local communicator");
  c->ops = &zs__local_ops;
  c->rank = 0;
  c->world = 1;
  c->local_rank = 0;
  c->local_size = 1;
  c->seq_hash = ZS__FNV_SEED;
  c->notice_from = -1;
  c->discard_from = -1;
  c->discard_origin = -1;
  c->max_count = SIZE_MAX;
  *out = c;
  return ZS_OK;
}
