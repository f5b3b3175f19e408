/*
 * comm.c — backend-independent collectives: starting them (counting calls,
 * bytes as nccl-tests counts them, and time; the per-step sequence hash;
 * the log), testing and finishing them, failure notices, and partners for
 * collectives other ranks issued (zs_step_discard's catch-ups). Waiting,
 * the blocking collectives built on it and the reconciliation a wait may
 * join are in comm_wait.c.
 */
#include "runtime/comm/comm.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(ZS__COMM_LOG_CAP * sizeof(zs__comm_log_entry) ==
                   ZS__COMM_LOG_BYTES,
               "the estimator's figure for the communication log (core_mem.h)");

/* ==== The collective core: note, start, test, finish ====================== */

const char* zs__purpose_name(int purpose) {
  static const char* const names[] = {
      "other",          "consistency check", "agreement",
      "param gather",   "grad reduce",       "grad gather (stage 0)",
      "param update gather", "init broadcast", "tensor set",
      "tensor get",     "grad norm",         "discard catch-up",
      "replica reduce"};
  if (purpose < 0 || purpose >= (int)(sizeof names / sizeof *names))
    return "other";
  return names[purpose];
}

/* Bytes of a collective as nccl-tests counts them: the full (gathered)
 * size per rank for all-gather and reduce-scatter. */
static size_t zs__coll_bytes(const zs__comm* c, const zs__coll* op) {
  size_t bytes = op->count * zs_dtype_size(op->dtype);
  if (op->op == ZS_COLL_ALL_GATHER || op->op == ZS_COLL_REDUCE_SCATTER ||
      op->op == ZS_COLL_GATHER)
    bytes *= (size_t)c->world;
  return bytes;
}

/* Counts a collective at issue and folds it into the sequence hash (in
 * issue order, which is what ranks must agree on) and the log. */
static void zs__comm_note(zs__comm* c, zs__coll* op, int root) {
  zs__comm* t = zs__comm_top(c); /* (a group's go to the context's) */
  const size_t bytes = zs__coll_bytes(c, op);
  op->root = root;
  op->lane_seq = c->lane_count[op->lane]++;
  op->prev = c->pending_tail;
  op->next = NULL;
  if (c->pending_tail != NULL) c->pending_tail->next = op;
  else c->pending_head = op;
  c->pending_tail = op;
  t->counters.calls[op->op]++;
  t->counters.bytes[op->op] += bytes;
  uint64_t rec[7] = {(uint64_t)op->op,         (uint64_t)op->count,
                     (uint64_t)op->dtype,      (uint64_t)(int64_t)root,
                     (uint64_t)op->tag.purpose, (uint64_t)(int64_t)op->tag.unit,
                     (uint64_t)c->group};
  /* (the group joins the hash only where there are groups: without
   * hybrid sharding the sequence hashes as before) */
  if (!op->tag.group_local) {
    t->seq_hash = zs__hash_bytes(t->seq_hash, rec,
                                 c->parent != NULL ? sizeof rec
                                                   : sizeof rec - sizeof rec[6]);
    t->check_count++;
  }
  op->seq = __atomic_fetch_add(&t->seq_count, 1, __ATOMIC_RELAXED);
  op->t_issue = zs__now();
  if (t->log != NULL) {
    zs__comm_log_entry* e = &t->log[op->seq % ZS__COMM_LOG_CAP];
    *e = (zs__comm_log_entry){op->seq,       (uint8_t)op->op,
                              (uint8_t)op->tag.purpose, c->group,
                              op->tag.unit,  (uint64_t)bytes,
                              op->t_issue,   0.0};
  }
  __atomic_add_fetch(&c->in_flight, 1, __ATOMIC_RELAXED);
  /* (the context's progress thread drives MPI for its groups too) */
  if (t != c) __atomic_add_fetch(&t->in_flight, 1, __ATOMIC_RELAXED);
  if (op->is_param_gather && ++t->gathers_in_flight > t->max_in_flight_gathers)
    t->max_in_flight_gathers = t->gathers_in_flight;
}

/* 1 (and c failed, telling no one: that too would be a call) when the
 * backend can run nothing more: MPI was finalized under a live context. */
static int zs__comm_dead(zs__comm* c) {
  if (c->ops->alive == NULL || c->ops->alive(c)) return 0;
  if (!c->failed)
    zs__comm_fail(c, ZS_ERR_INVALID_STATE, "MPI was finalized while this "
                  "context existed: its collectives cannot run (call "
                  "zs_context_destroy before MPI_Finalize)", 0, 0);
  return 1;
}

/* A rank the heartbeats lost (comm_heartbeat.h) fails the communicator
 * (no notice: the news goes round the ring already). */
int zs__comm_peer_check(zs__comm* c, int waiting, char* why, size_t cap) {
  const int r = zs__hb_lost(zs__comm_top(c)->hb, waiting, why, cap);
  if (r < 0) return -1;
  if (!c->failed) {
    char msg[sizeof c->failed_why];
    snprintf(msg, sizeof msg, "rank %d %.480s", r, why);
    zs__comm_fail(c, ZS_ERR_REMOTE, msg, 0, 0);
  }
  return r;
}

/* After a failure nothing new may start on the communicator; with
 * `peers`, a rank the heartbeats lost is such a failure. */
static zs_status zs__comm_usable_as(zs__comm* c, int peers) {
  (void)zs__comm_dead(c);
  char why[480];
  if (peers) (void)zs__comm_peer_check(c, 0, why, sizeof why);
  /* a group fails with the context's communicator (a failure notice, a
   * timeout or an abandon there), telling no one: it was told there */
  if (!c->failed && c->parent != NULL && c->parent->failed) {
    zs__comm_fail(c, c->parent->failed_status, c->parent->failed_why, 0, 0);
  }
  if (!c->failed) return ZS_OK;
  return zs__error(c->failed_status,
                   "the context cannot be used any more (end the job): %s",
                   c->failed_why);
}

zs_status zs__comm_usable(zs__comm* c) { return zs__comm_usable_as(c, 1); }

zs_status zs__comm_failed_check(zs__comm* c) {
  return zs__comm_usable_as(c, 0);
}

/* Marks c failed (keeping the first status and reason), gives up what is
 * in flight on the device, and with notify tells the other ranks once that
 * this rank will complete no collective from its `from_seq`-th on. The
 * notice's text is "<from_seq> <why>". */
void zs__comm_fail(zs__comm* c, zs_status st, const char* why, int notify,
                   uint64_t from_seq) {
  if (!c->failed) {
    c->failed = 1;
    c->failed_status = st;
    snprintf(c->failed_why, sizeof c->failed_why, "%s", why);
  }
  /* a group's failure is the context's: the notice goes to every rank of
   * it, on the context's communicator, whose sequence from_seq counts */
  if (c->parent != NULL) {
    zs__comm_fail(c->parent, st, why, notify, from_seq);
    notify = 0;
  }
  /* (not when the backend is gone: sending would be a call too) */
  if (notify && !c->notified && c->ops->notify != NULL &&
      (c->ops->alive == NULL || c->ops->alive(c))) {
    c->notified = 1;
    char msg[ZS__NOTICE_BYTES];
    snprintf(msg, sizeof msg, "%llu %s", (unsigned long long)from_seq, why);
    c->ops->notify(c, msg);
  }
  if (c->ops->abort != NULL) c->ops->abort(c);
}

/* A discard notice: "D <epoch> <count of lane 0> <lane 1> <lane 2>
 * <origin>" (origin: the rank of the context's communicator that called
 * zs_step_discard, which a rank joining on its behalf passes on), sent
 * by a rank in zs_step_discard whose reconciliation the others have not
 * joined yet. One of this epoch is kept (the lowest count per lane: that
 * rank joins nothing from there on); older ones are stale (the reconcile
 * they asked for is over). */
static void zs__comm_discard_notice(zs__comm* c, int from, const char* text) {
  unsigned long long e = 0, n[ZS__LANES] = {0};
  int origin = -1; /* the context's rank that called zs_step_discard */
  const int got = sscanf(text, "D %llu %llu %llu %llu %d", &e, &n[0], &n[1],
                         &n[2], &origin);
  if (got < 1 + ZS__LANES || e != c->epoch) return;
  if (got == 2 + ZS__LANES && origin >= 0) from = origin;
  if (c->discard_from < 0) {
    c->discard_from = from;
    for (int l = 0; l < ZS__LANES; l++) c->discard_lane[l] = n[l];
    return;
  }
  for (int l = 0; l < ZS__LANES; l++)
    if (n[l] < c->discard_lane[l]) c->discard_lane[l] = n[l];
}

/* Takes in the notices that have arrived: discard notices (above), and of
 * the failure notices the one naming the earliest collective (several
 * ranks may fail at different points). 1 when any failure notice came:
 * c->notice_from, notice_seq, notice_msg. */
int zs__comm_poll_notices(zs__comm* c) {
  char text[ZS__NOTICE_BYTES];
  int from = -1;
  /* a group: failure notices come on the context's communicator (whose
   * sequence numbers the group's collectives carry); discard notices on
   * the group's own */
  if (c->parent != NULL && zs__comm_poll_notices(c->parent) &&
      (c->notice_from < 0 || c->parent->notice_seq < c->notice_seq)) {
    c->notice_from = c->parent->notice_from;
    c->notice_seq = c->parent->notice_seq;
    snprintf(c->notice_msg, sizeof c->notice_msg, "%s", c->parent->notice_msg);
  }
  while (c->ops->poll_notice != NULL &&
         c->ops->poll_notice(c, &from, text, sizeof text)) {
    if (text[0] == 'D') {
      zs__comm_discard_notice(c, from, text);
      continue;
    }
    char* rest = NULL;
    uint64_t seq = strtoull(text, &rest, 10);
    if (rest == NULL || rest == text) rest = text; /* no number: from 0 */
    if (*rest == ' ') rest++;
    if (c->notice_from < 0 || seq < c->notice_seq) {
      c->notice_from = from;
      c->notice_seq = seq;
      snprintf(c->notice_msg, sizeof c->notice_msg, "%s", rest);
    }
  }
  return c->notice_from >= 0;
}

zs_status zs__comm_abandon(zs__comm* c, zs_status st) {
  /* (failed already on another rank's notice: this rank's own failure may
   * be at an earlier collective, so it is sent too) */
  if (st == ZS_OK || c->world == 1 || c->notified) return st;
  char body[ZS__NOTICE_BYTES - 32];
  snprintf(body, sizeof body, "%s", zs__error_body());
  /* later calls: INVALID_STATE, not st (a caller retrying on
   * OUT_OF_MEMORY would loop) */
  zs__comm_fail(c, ZS_ERR_INVALID_STATE, body, 1, zs__comm_top(c)->seq_count);
  return zs__error(st, "%s (this rank skips collectives the others issue: "
                   "they were told and fail now; the context cannot be "
                   "used any more)", body);
}

void zs__comm_free(const zs__comm* c, void* p) {
  if (!c->failed) free(p);
}

static zs__coll* zs__coll_new(zs__comm* c, zs_coll_op kind, zs__coll_tag tag,
                              size_t count, zs_dtype dtype) {
  zs__coll* op = (zs__coll*)calloc(1, sizeof *op);
  if (op == NULL) return NULL;
  op->op = kind;
  op->tag = tag;
  op->count = count;
  op->dtype = dtype;
  op->is_param_gather =
      (kind == ZS_COLL_ALL_GATHER || kind == ZS_COLL_GATHER) &&
      tag.purpose == ZS__P_GATHER;
  (void)c;
  return op;
}

/* Marks op complete: finishes a fixed-order sum, logs, frees. */
static zs_status zs__coll_finish(zs__comm* c, zs__coll* op) {
  zs_status st = ZS_OK;
  if (op->dst != NULL)
    st = c->dev->ops->sum_chunks(c->dev, op->dst, op->tmp, c->world, op->count,
                                 op->divisor, op->dtype, NULL);
  else if (op->div_dst != NULL && op->divisor != 1.0f)
    st = c->dev->ops->div_add(c->dev, op->div_dst, NULL, op->div_dst,
                              op->divisor, op->count, op->dtype, NULL);
  double now = zs__now();
  zs__comm* t = zs__comm_top(c);
  t->counters.seconds[op->op] += now - op->t_issue;
  if (t->prof != NULL) {
    const size_t bytes = zs__coll_bytes(c, op);
    const double dt = now - op->t_issue;
    const double algbw = dt > 0 ? (double)bytes / dt / 1e9 : 0.0;
    char name[96];
    /* a group's collectives say which (memreport sums them apart) */
    static const char* const groups[3] = {"", "shard", "replica"};
    if (c->group == ZS__GROUP_WORLD || c->group > 2)
      snprintf(name, sizeof name, "%s (%s)", zs_coll_op_name(op->op),
               zs__purpose_name(op->tag.purpose));
    else
      snprintf(name, sizeof name, "%s (%s; %s group of %d)",
               zs_coll_op_name(op->op), zs__purpose_name(op->tag.purpose),
               groups[c->group], c->world);
    zs__profiler_span(t->prof, 1, name, "comm", op->t_issue, now,
                      op->tag.name, bytes, algbw,
                      algbw * zs_busbw_factor(op->op, c->world));
  }
  if (t->log != NULL) {
    zs__comm_log_entry* e = &t->log[op->seq % ZS__COMM_LOG_CAP];
    if (e->seq == op->seq) e->t_done = now;
  }
  __atomic_sub_fetch(&c->in_flight, 1, __ATOMIC_RELAXED);
  if (t != c) __atomic_sub_fetch(&t->in_flight, 1, __ATOMIC_RELAXED);
  if (op->is_param_gather) t->gathers_in_flight--;
  if (op->prev != NULL) op->prev->next = op->next;
  else c->pending_head = op->next;
  if (op->next != NULL) op->next->prev = op->prev;
  else c->pending_tail = op->prev;
  zs__dev_free(c->dev, op->tmp);
  if (op->host_tmp != NULL) {
    if (c->dev != NULL)
      (void)zs__accounting_remove(c->dev->acct, ZS__OWNER_RUNTIME,
                                  op->host_tmp, NULL, NULL);
    free(op->host_tmp);
  }
  free(op);
  return st;
}

/* "the host device" or "the cuda device at PCI 0000:3b:00.0": which
 * device a collective's error is about. */
void zs__comm_dev_name(const zs__device* dev, char* buf, size_t cap) {
  if (dev == NULL) { /* a communicator still being set up */
    snprintf(buf, cap, "no device yet");
    return;
  }
  char busid[32];
  /* a query: the backend changes nothing (its vtable takes it non-const) */
  dev->ops->pci_busid((zs__device*)dev, busid, sizeof busid);
  if (busid[0] != '\0')
    snprintf(buf, cap, "the %s device at PCI %s", dev->ops->name, busid);
  else
    snprintf(buf, cap, "the %s device", dev->ops->name);
}

/* What this rank holds by category, for error messages (a placeholder
 * while the context is set up, before its device exists). */
void zs__comm_report(const zs__comm* c, char* buf, size_t cap) {
  if (c->dev == NULL)
    snprintf(buf, cap, "no device memory yet");
  else
    zs__accounting_report(c->dev->acct, buf, cap);
}

zs_status zs__coll_test(zs__comm* c, zs__coll* op, int* done) {
  *done = 0;
  zs_status st = zs__comm_dead(c) ? zs__comm_usable(c)
                                  : c->ops->test(c, op->req, done);
  if (st != ZS_OK) {
    /* The backend released the request: release the op too (its
     * temporaries are kept if the communicator failed). */
    char saved[1024], report[600], devname[96];
    snprintf(saved, sizeof saved, "%s", zs__error_body());
    zs__comm_report(c, report, sizeof report);
    zs__comm_dev_name(c->dev, devname, sizeof devname);
    const zs_coll_op kind = op->op;
    const size_t count = op->count;
    const zs_dtype dtype = op->dtype;
    char unit[64];
    snprintf(unit, sizeof unit, "%s", op->tag.name != NULL ? op->tag.name : "-");
    op->dst = NULL; /* no sum or mean of a failed collective's output */
    op->div_dst = NULL;
    const uint64_t seq = op->seq;
    (void)zs__coll_finish(c, op);
    *done = 1;
    zs__error(st, "%s (in %s of %zu %s elements for unit %s on %s; %s)",
              saved, zs_coll_op_name(kind), count, zs_dtype_name(dtype), unit,
              devname, report);
    /* A group's collective failed (a peer died, a segment broke): only its
     * ranks saw it; the context fails and tells every other rank, so those
     * of other groups, waiting in the context's collectives, end now too
     * (flat, every rank is in this collective and sees it itself) */
    if (c->parent != NULL && !c->failed) {
      char body[ZS__NOTICE_BYTES - 32];
      snprintf(body, sizeof body, "%s", zs__error_body());
      zs__comm_fail(c, st, body, 1, seq);
      zs__error(st, "%s", body);
    }
    /* A backend's watchdog gave up on a collective (comm_nccl.c): as a
     * wait's own timeout, the context fails and the others hear of it; a
     * rank lost (the heartbeats) fails it too (the others find it
     * themselves) */
    if ((st == ZS_ERR_TIMEOUT || st == ZS_ERR_REMOTE) && !c->failed) {
      char body[ZS__NOTICE_BYTES - 32];
      snprintf(body, sizeof body, "%s", zs__error_body());
      zs__comm_fail(c, st, body, st == ZS_ERR_TIMEOUT, seq);
      zs__error(st, "%s", body);
    }
    return st;
  }
  if (!*done) return ZS_OK;
  return zs__coll_finish(c, op);
}

/* Registers a started backend request on op, or cleans up on failure. */
static zs_status zs__coll_started(zs__comm* c, zs_status st, zs__coll* op,
                                  int root, zs__coll** out) {
  if (st != ZS_OK) {
    zs__dev_free(c->dev, op->tmp);
    free(op);
    return st;
  }
  zs__comm_note(c, op, root);
  *out = op;
  return ZS_OK;
}

#define ZS__COLL_BEGIN(kind, count, dtype)                                  \
  zs_status st = zs__comm_usable(c);                                        \
  if (st != ZS_OK) return st;                                               \
  zs__coll* op = zs__coll_new(c, (kind), tag, (count), (dtype));            \
  if (op == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "collective");

/* The backend call and lane of op (buf: a buffer it works on, which
 * decides the lane where a backend serves host and device memory apart). */
static void zs__coll_call(zs__comm* c, zs__coll* op, zs__call call,
                          zs__red_op redop, const void* buf) {
  op->call = call;
  op->redop = redop;
  op->lane = c->ops->lane != NULL ? c->ops->lane(c, call, buf) : 0;
}

zs_status zs__comm_iall_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                               void* recv, size_t count, zs_dtype dtype,
                               zs__coll** out) {
  ZS__COLL_BEGIN(ZS_COLL_ALL_GATHER, count, dtype);
  zs__coll_call(c, op, ZS__CALL_ALL_GATHER, ZS__RED_SUM, recv);
  st = c->ops->all_gather(c, send, recv, count, dtype, NULL, &op->req);
  return zs__coll_started(c, st, op, -1, out);
}

zs_status zs__comm_igather_users(zs__comm* c, zs__coll_tag tag,
                                 const void* send, void* recv, size_t count,
                                 zs_dtype dtype, uint64_t users,
                                 zs__coll** out) {
  if (c->ops->gather_users == NULL || c->world > 64)
    return zs__error(ZS_ERR_UNSUPPORTED, "gather to some ranks only: not on "
                     "the %s backend with %d ranks (at most 64)", c->ops->name,
                     c->world);
  ZS__COLL_BEGIN(ZS_COLL_GATHER, count, dtype);
  op->users = users;
  zs__coll_call(c, op, ZS__CALL_GATHER_USERS, ZS__RED_SUM, send);
  st = c->ops->gather_users(c, send, recv, count, dtype, users, NULL,
                            &op->req);
  return zs__coll_started(c, st, op, -1, out);
}

zs_status zs__comm_iall_gather_strided(zs__comm* c, zs__coll_tag tag,
                                       void* buf, size_t offset,
                                       size_t stride, size_t chunk,
                                       zs_dtype dtype, zs__coll** out) {
  ZS__COLL_BEGIN(ZS_COLL_ALL_GATHER, chunk, dtype);
  zs__coll_call(c, op, ZS__CALL_ALL_GATHER_STRIDED, ZS__RED_SUM, buf);
  st = c->ops->all_gather_strided(c, buf, offset, stride, chunk, dtype, NULL,
                                  &op->req);
  return zs__coll_started(c, st, op, -1, out);
}

zs_status zs__comm_ireduce_scatter(zs__comm* c, zs__coll_tag tag,
                                   zs__reduce_order order, const void* send,
                                   size_t offset, size_t stride, size_t chunk,
                                   void* dst, float divisor, zs_dtype dtype,
                                   zs__coll** out) {
  ZS__COLL_BEGIN(ZS_COLL_REDUCE_SCATTER, chunk, dtype);
  op->divisor = divisor;
  const size_t elem = zs_dtype_size(dtype), W = (size_t)c->world;
  /* (a backend that sums as it receives needs no temporary) */
  const int in_backend =
      order == ZS__REDUCE_FIXED && c->ops->reduce_scatter_fixed != NULL;
  if (!in_backend)
    st = zs__dev_alloc(c->dev, ZS_MEM_COMM_BUFFERS, W * chunk * elem, 0,
                       ZS__LABEL_BUCKET, &op->tmp);
  size_t* offsets = st == ZS_OK ? (size_t*)malloc(W * sizeof *offsets) : NULL;
  if (st == ZS_OK && offsets == NULL)
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "reduce-scatter offsets");
  for (size_t r = 0; st == ZS_OK && r < W; r++) offsets[r] = r * stride + offset;
  if (st == ZS_OK && in_backend) {
    /* Described as the exchange it pairs with. */
    zs__coll_call(c, op, ZS__CALL_EXCHANGE, ZS__RED_SUM, dst);
    st = c->ops->reduce_scatter_fixed(c, send, offsets, dst, chunk, divisor,
                                      dtype, NULL, &op->req);
  } else if (st == ZS_OK && order == ZS__REDUCE_FIXED) {
    /* Each rank receives every rank's chunk of its shard, then sums them in
     * rank order at completion. */
    op->dst = dst;
    zs__coll_call(c, op, ZS__CALL_EXCHANGE, ZS__RED_SUM, op->tmp);
    st = c->ops->exchange(c, send, offsets, op->tmp, chunk, dtype, NULL,
                          &op->req);
    /* chained: the sum follows the exchange on the device, queued now */
    if (st == ZS_OK && c->ops->chain_sum != NULL && c->chain &&
        c->ops->chain_sum(c, op->req, dst, op->tmp, c->world, chunk, divisor,
                          dtype) == ZS_OK)
      op->dst = NULL;
  } else if (st == ZS_OK) {
    /* The backend needs each rank's block contiguous: pack the bucket. */
    const char* s = (const char*)send;
    for (size_t r = 0; st == ZS_OK && r < W; r++)
      st = c->dev->ops->copy(c->dev, (char*)op->tmp + r * chunk * elem,
                             s + offsets[r] * elem, chunk * elem, NULL);
    op->div_dst = dst;
    zs__coll_call(c, op, ZS__CALL_REDUCE_SCATTER, ZS__RED_SUM, op->tmp);
    if (st == ZS_OK)
      st = c->ops->reduce_scatter(c, op->tmp, dst, chunk, dtype, ZS__RED_SUM,
                                  NULL, &op->req);
  }
  free(offsets);
  return zs__coll_started(c, st, op, -1, out);
}

zs_status zs__comm_iall_reduce(zs__comm* c, zs__coll_tag tag, const void* send,
                               void* recv, size_t count, zs_dtype dtype,
                               zs__red_op rop, zs__coll** out) {
  ZS__COLL_BEGIN(ZS_COLL_ALL_REDUCE, count, dtype);
  zs__coll_call(c, op, ZS__CALL_ALL_REDUCE, rop, recv);
  st = c->ops->all_reduce(c, send, recv, count, dtype, rop, NULL, &op->req);
  return zs__coll_started(c, st, op, -1, out);
}

zs_status zs__comm_ibroadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                              size_t count, zs_dtype dtype, int root,
                              zs__coll** out) {
  ZS__COLL_BEGIN(ZS_COLL_BROADCAST, count, dtype);
  zs__coll_call(c, op, ZS__CALL_BROADCAST, ZS__RED_SUM, buf);
  st = c->ops->broadcast(c, buf, count, dtype, root, NULL, &op->req);
  return zs__coll_started(c, st, op, root, out);
}

/* ==== Partners for collectives other ranks issued (comm_wait.c) ========== */

size_t zs__comm_pending(const zs__comm* c, int lane, uint64_t from,
                        zs__coll_desc* out, size_t cap) {
  size_t n = 0;
  for (const zs__coll* op = c->pending_head; op != NULL; op = op->next) {
    if (op->lane != lane || op->lane_seq < from) continue;
    if (n < cap)
      out[n] = (zs__coll_desc){(uint8_t)op->call,  (uint8_t)op->dtype,
                               (uint8_t)op->redop, (uint8_t)op->tag.purpose,
                               (uint8_t)op->lane,  op->root,
                               op->tag.unit,       op->lane_seq,
                               op->count,          op->users};
    n++;
  }
  return n;
}

/* Zeroed scratch of `bytes` (at least one) for a catch-up on lane `lane`:
 * device memory on the device lane, else host memory, accounted as comm
 * buffers either way. */
static zs_status zs__catch_up_scratch(zs__comm* c, zs__coll* op, int lane,
                                      size_t bytes, void** out) {
  if (bytes == 0) bytes = 1;
  if (lane == 2) {
    zs_status st = zs__dev_alloc(c->dev, ZS_MEM_COMM_BUFFERS, bytes, 1,
                                 "discard catch-up", &op->tmp);
    *out = op->tmp;
    return st;
  }
  op->host_tmp = calloc(1, bytes);
  if (op->host_tmp == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "discard catch-up: %zu bytes",
                     bytes);
  if (c->dev != NULL) {
    zs_status st = zs__accounting_add(c->dev->acct, ZS__OWNER_RUNTIME,
                                      ZS_MEM_COMM_BUFFERS, op->host_tmp,
                                      bytes, "discard catch-up");
    if (st != ZS_OK) {
      free(op->host_tmp);
      op->host_tmp = NULL;
      return st;
    }
  }
  *out = op->host_tmp;
  return ZS_OK;
}

zs_status zs__comm_icatch_up(zs__comm* c, const zs__coll_desc* d,
                             zs__coll** out) {
  const zs__coll_tag tag = zs__tag(ZS__P_CATCH_UP, -1, NULL);
  const zs__call call = (zs__call)d->call;
  const zs_dtype dtype = (zs_dtype)d->dtype;
  const zs_coll_op kind =
      call == ZS__CALL_ALL_GATHER || call == ZS__CALL_ALL_GATHER_STRIDED
          ? ZS_COLL_ALL_GATHER
      : call == ZS__CALL_GATHER_USERS ? ZS_COLL_GATHER
      : call == ZS__CALL_ALL_REDUCE ? ZS_COLL_ALL_REDUCE
      : call == ZS__CALL_BROADCAST  ? ZS_COLL_BROADCAST
                                    : ZS_COLL_REDUCE_SCATTER;
  ZS__COLL_BEGIN(kind, (size_t)d->count, dtype);
  op->call = call;
  op->redop = (zs__red_op)d->redop;
  op->lane = d->lane;
  const size_t n = (size_t)d->count, W = (size_t)c->world;
  const size_t e = zs_dtype_size(dtype);
  char* b = NULL;
  size_t* offsets = NULL;
  switch (call) {
    case ZS__CALL_ALL_GATHER:
      st = zs__catch_up_scratch(c, op, d->lane, W * n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->all_gather(c, ZS__IN_PLACE, b, n, dtype, NULL, &op->req);
      break;
    case ZS__CALL_ALL_GATHER_STRIDED:
      st = zs__catch_up_scratch(c, op, d->lane, W * n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->all_gather_strided(c, b, 0, n, n, dtype, NULL, &op->req);
      break;
    case ZS__CALL_GATHER_USERS: /* sends zeros; a user receives too */
      op->users = d->users;
      st = zs__catch_up_scratch(c, op, d->lane, (W + 1) * n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->gather_users(c, b, (d->users >> c->rank & 1) ? b + n * e
                                                                  : NULL,
                                  n, dtype, d->users, NULL, &op->req);
      break;
    case ZS__CALL_EXCHANGE:
      st = zs__catch_up_scratch(c, op, d->lane, 2 * W * n * e, (void**)&b);
      offsets = st == ZS_OK ? (size_t*)malloc(W * sizeof *offsets) : NULL;
      if (st == ZS_OK && offsets == NULL)
        st = zs__error(ZS_ERR_OUT_OF_MEMORY, "discard catch-up offsets");
      for (size_t r = 0; st == ZS_OK && r < W; r++) offsets[r] = r * n;
      if (st == ZS_OK)
        st = c->ops->exchange(c, b, offsets, b + W * n * e, n, dtype, NULL,
                              &op->req);
      free(offsets);
      break;
    case ZS__CALL_REDUCE_SCATTER:
      st = zs__catch_up_scratch(c, op, d->lane, (W + 1) * n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->reduce_scatter(c, b, b + W * n * e, n, dtype,
                                    (zs__red_op)d->redop, NULL, &op->req);
      break;
    case ZS__CALL_ALL_REDUCE:
      st = zs__catch_up_scratch(c, op, d->lane, n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->all_reduce(c, ZS__IN_PLACE, b, n, dtype,
                                (zs__red_op)d->redop, NULL, &op->req);
      break;
    case ZS__CALL_BROADCAST:
      st = zs__catch_up_scratch(c, op, d->lane, n * e, (void**)&b);
      if (st == ZS_OK)
        st = c->ops->broadcast(c, b, n, dtype, d->root, NULL, &op->req);
      break;
    default:
      st = zs__error(ZS_ERR_INTERNAL, "discard catch-up: call %d", d->call);
  }
  if (st != ZS_OK && op->host_tmp != NULL) {
    if (c->dev != NULL)
      (void)zs__accounting_remove(c->dev->acct, ZS__OWNER_RUNTIME,
                                  op->host_tmp, NULL, NULL);
    free(op->host_tmp);
  }
  return zs__coll_started(c, st, op, d->root, out);
}

size_t zs__comm_log_read(const zs__comm* c, zs__comm_log_entry* out,
                         size_t cap) {
  if (c->log == NULL) return 0;
  uint64_t n = c->seq_count < ZS__COMM_LOG_CAP ? c->seq_count : ZS__COMM_LOG_CAP;
  uint64_t first = c->seq_count - n;
  for (uint64_t i = 0; i < n && i < cap; i++)
    out[i] = c->log[(first + i) % ZS__COMM_LOG_CAP];
  return (size_t)n;
}

void zs__comm_destroy(zs__comm* c) {
  if (c == NULL) return;
  if (c->parent == NULL) zs__hb_destroy(c->hb); /* (a group's is borrowed) */
  c->hb = NULL;
  if (!c->failed) free(c->log);
  c->ops->destroy(c);
}
