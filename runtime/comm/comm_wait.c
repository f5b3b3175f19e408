/*
 * comm_wait.c — waiting for collectives, and what waits: zs__coll_wait
 * (polling; timeouts; other ranks' failure notices; joining another rank's
 * zs_step_discard), the blocking collectives and agreements built on it,
 * and zs_step_discard's reconciliation (zs__comm_reconcile), which a wait
 * joins and which itself waits; one file, since the two call each other.
 *
 * The reconciliation: after the ranks issued different collectives in a
 * micro-batch (a pass that failed part-way on one rank, ranks that used
 * different units), every rank learns through the control communicator
 * which collectives some rank has in flight that others never issued, and
 * those others issue partners for them with scratch buffers, so that
 * everything in flight completes and the ranks' sequences line up again.
 * MPI pairs the collectives of a communicator in issue order, and its
 * point-to-point messages by tag (NCCL: everything in issue order), so a
 * collective without partners can be neither cancelled nor skipped; it can
 * only be completed. Lanes (comm.h) are reconciled independently.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/comm_wait.h"

/* ==== Waiting ============================================================= */

/* "all_gather of 1376 fp32 elements for unit u0 (param gather)". */
static void zs__coll_text(const zs__coll* op, char* buf, size_t cap) {
  snprintf(buf, cap, "%s of %zu %s elements for unit %s (%s)",
           zs_coll_op_name(op->op), op->count, zs_dtype_name(op->dtype),
           op->tag.name != NULL ? op->tag.name : "-",
           zs__purpose_name(op->tag.purpose));
}

/* When the heartbeats lost a rank (within `grace` seconds): c failed and
 * ZS_ERR_REMOTE naming it, for the wait of op; ZS_OK otherwise. */
static zs_status zs__coll_peer_lost(zs__comm* c, const zs__coll* op,
                                    double grace) {
  char why[ZS__NOTICE_BYTES - 64];
  const double until = zs__now() + grace;
  int r = zs__comm_peer_check(c, 1, why, sizeof why);
  while (r < 0 && zs__now() < until) {
    sched_yield();
    r = zs__comm_peer_check(c, 1, why, sizeof why);
  }
  if (r < 0) return ZS_OK;
  char report[600], devname[96];
  zs__comm_report(c, report, sizeof report);
  zs__comm_dev_name(c->dev, devname, sizeof devname);
  zs__hb_wait(c->hb, NULL);
  return zs__error(ZS_ERR_REMOTE,
                   "%s of %zu %s elements for unit %s (%s) on %s cannot "
                   "complete: rank %d %s; the context cannot be used any "
                   "more: end the job (MPI_Abort: docs/running.md) (%s)",
                   zs_coll_op_name(op->op), op->count, zs_dtype_name(op->dtype),
                   op->tag.name != NULL ? op->tag.name : "-",
                   zs__purpose_name(op->tag.purpose), devname, r, why, report);
}

/* Waits for a started collective, polling (and yielding the core after a
 * short spin, which matters when ranks oversubscribe the cores). */
zs_status zs__coll_wait(zs__comm* c, zs__coll* op) {
  /* A failed communicator completes nothing more: waiting could only end
   * at the timeout (op stays pending, its buffers kept) */
  zs_status usable = zs__comm_failed_check(c);
  if (usable != ZS_OK) return usable;
  const double t0 = zs__now();
  const zs_coll_op kind = op->op;
  /* (a failed test frees op: its description for the messages after) */
  const zs__coll desc = *op;
  double warn_at = t0 + 60.0;
  int dropped_by = -1; /* a rank that discarded without issuing op */
  int lost_seen = 0;   /* the heartbeats lost a rank (below) */
  char what[160];
  what[0] = '\0';
  for (unsigned spins = 0;; spins++) {
    int done = 0;
    zs_status st = zs__coll_test(c, op, &done);
    if (st != ZS_OK || done) {
      zs__comm_top(c)->counters.wait_seconds[kind] += zs__now() - t0;
      if (spins >= 256) zs__hb_wait(c->hb, NULL);
      /* MPI's own error about a peer that died: name the peer when the
       * heartbeats know it */
      if (st != ZS_OK && c->hb != NULL) {
        char saved[ZS__NOTICE_BYTES];
        snprintf(saved, sizeof saved, "%s", zs__error_body());
        const zs_status s2 = zs__coll_peer_lost(c, &desc, 2.0);
        if (s2 != ZS_OK) return s2;
        zs__error(st, "%s", saved);
      }
      if (st != ZS_OK || dropped_by < 0) return st;
      return zs__error(ZS_ERR_REMOTE,
                       "%s: rank %d dropped this micro-batch (zs_step_discard) "
                       "without issuing it; it completed against an empty "
                       "partner, so this rank's micro-batch is wrong too: "
                       "call zs_step_discard here as well (every rank does; "
                       "it restores the state from before the micro-batch)",
                       what, dropped_by);
    }
    if (spins < 256) continue;
    const char* name = op->tag.name != NULL ? op->tag.name : "-";
    if (spins == 256 && c->hb != NULL) { /* a wait that lasts: say on what */
      char on[160];
      zs__coll_text(op, on, sizeof on);
      snprintf(on + strlen(on), sizeof on - strlen(on), ", collective %llu",
               (unsigned long long)op->seq);
      zs__hb_wait(c->hb, on);
    }
    if (c->ops->idle != NULL && op->req != NULL) c->ops->idle(c, op->req);
    else sched_yield();
    if ((spins & 63) != 0) continue;
    double now = zs__now();
    /* Another rank failed and will not join this collective (one it
     * issued before failing still completes: wait for that): give up
     * now. The request stays pending, so every buffer is kept. */
    const int failure = zs__comm_poll_notices(c);
    /* With shard groups a discard reconciles the shard group's
     * collectives first, then the context's: a rank of the group waiting
     * in either joins both, in that order (the discarding rank waits in
     * the first for it). */
    zs__comm* sg = c->parent != NULL ? (c->group == ZS__GROUP_SHARD ? c : NULL)
                                     : c->shard_group;
    if (!failure && sg != NULL && !sg->reconciling &&
        !zs__comm_top(c)->reconciling) {
      if (sg != c) (void)zs__comm_poll_notices(sg);
      if (sg->discard_from >= 0) {
        dropped_by = sg->discard_from;
        zs__coll_text(op, what, sizeof what);
        /* (this rank's notices name the rank it joins for) */
        zs__comm_top(c)->discard_origin = dropped_by;
        zs_status rs = zs__comm_reconcile(sg, NULL);
        if (rs == ZS_OK) rs = zs__comm_reconcile(zs__comm_top(c), NULL);
        zs__comm_top(c)->discard_origin = -1;
        if (rs != ZS_OK) return rs; /* failed: op stays pending */
        continue;
      }
    }
    /* Another rank is in zs_step_discard and never issued this one: join
     * its reconciliation, which gives op its partners (once). */
    if (!failure && !c->reconciling && c->discard_from >= 0 &&
        op->lane_seq >= c->discard_lane[op->lane]) {
      dropped_by = c->discard_from;
      zs__coll_text(op, what, sizeof what);
      zs_status rs = zs__comm_reconcile(c, NULL);
      if (rs != ZS_OK) return rs; /* failed: op stays pending, as above */
      continue;
    }
    if (failure && op->seq >= c->notice_seq) {
      const int from = c->notice_from;
      /* (a timed-out rank's notice ends as this message does: once) */
      char notice[ZS__NOTICE_BYTES];
      snprintf(notice, sizeof notice, "%s", c->notice_msg);
      char* tail = strstr(notice, "; the context cannot be used any more");
      if (tail != NULL) *tail = '\0';
      char report[600], devname[96], why[160];
      zs__comm_report(c, report, sizeof report);
      zs__comm_dev_name(c->dev, devname, sizeof devname);
      snprintf(why, sizeof why, "rank %d failed (%.100s)", from, notice);
      zs__comm_fail(c, ZS_ERR_REMOTE, why, 0, 0);
      return zs__error(ZS_ERR_REMOTE,
                       "%s of %zu %s elements for unit %s (%s) on %s cannot "
                       "complete: rank %d failed and will not join it: %s; "
                       "the context cannot be used any more (%s)",
                       zs_coll_op_name(op->op), op->count,
                       zs_dtype_name(op->dtype), name,
                       zs__purpose_name(op->tag.purpose), devname, from,
                       notice, report);
    }
    /* A rank whose heartbeat stopped, or whose process ended: it will
     * join nothing (a failure notice, above, says more and comes first;
     * the collective timeout stays for ranks that are alive but issued
     * something else) */
    if (c->hb != NULL) {
      /* a lost rank may have done its part of op before it went (its data
       * arrived, the backend has yet to take it): op gets one more round
       * of tests (64, with the backend's idle between) before the loss
       * fails it; the next collective then fails at once */
      char gone[64];
      if (!lost_seen) {
        lost_seen = zs__hb_lost(zs__comm_top(c)->hb, 1, gone, sizeof gone) >= 0;
      } else {
        const zs_status lost = zs__coll_peer_lost(c, op, 0.0);
        if (lost != ZS_OK) return lost;
      }
    }
    if (c->timeout_s > 0 && now - t0 > c->timeout_s) {
      char report[600], devname[96], body[ZS__NOTICE_BYTES - 32];
      zs__comm_report(c, report, sizeof report);
      zs__comm_dev_name(c->dev, devname, sizeof devname);
      zs__error(ZS_ERR_TIMEOUT,
                "%s of %zu %s elements for unit %s (%s) on %s did not "
                "complete within %g s: another rank is probably waiting in "
                "a different collective (it skipped or added a gather, "
                "release or step, or failed); the context cannot be used any "
                "more (%s)",
                zs_coll_op_name(op->op), op->count, zs_dtype_name(op->dtype),
                name, zs__purpose_name(op->tag.purpose), devname,
                c->timeout_s, report);
      /* The others may be waiting in that different collective: they
       * hear of it now instead of at their own timeout (the message set
       * above stays this call's error) */
      snprintf(body, sizeof body, "%s", zs__error_body());
      zs__comm_fail(c, ZS_ERR_TIMEOUT, body, 1, op->seq);
      return ZS_ERR_TIMEOUT;
    }
    if (now > warn_at) {
      zs__log(ZS_LOG_WARN,
              "still waiting after %.0f s in %s for unit %s; another rank "
              "may have issued a different collective",
              now - t0, zs_coll_op_name(op->op), name);
      warn_at = now + 60.0;
    }
  }
}

/* ==== Chaining on the device ============================================= */

zs_status zs__coll_chain(zs__comm* c, zs__coll* op) {
  if (c->ops->chain == NULL || op->dst != NULL || op->div_dst != NULL ||
      op->host_tmp != NULL || c->failed || !c->chain)
    return zs__coll_wait(c, op);
  int done = 0;
  zs_status st = zs__coll_test(c, op, &done);
  if (st != ZS_OK || done) return st;
  /* (UNSUPPORTED: host memory; another error: the host waits instead) */
  if (c->ops->chain(c, op->req) != ZS_OK) return zs__coll_wait(c, op);
  op->chained = 1;
  return ZS_OK;
}

zs_status zs__comm_sweep(zs__comm* c) {
  zs__coll* op = c->pending_head;
  while (op != NULL) {
    zs__coll* next = op->next;
    if (op->chained) {
      int done = 0;
      zs_status st = zs__coll_test(c, op, &done);
      if (st != ZS_OK) {
        /* its consumers on the device got no data: nothing may go on (the
         * next call says why) */
        if (!c->failed) {
          char body[ZS__NOTICE_BYTES - 32];
          snprintf(body, sizeof body, "%s", zs__error_body());
          zs__comm_fail(c, st, body, 0, 0);
          zs__error(st, "%s", body);
        }
        return st;
      }
      if (!done) break; /* (later ones complete after it on the device) */
    }
    op = next;
  }
  return ZS_OK;
}

zs_status zs__comm_drain(zs__comm* c) {
  zs_status st = ZS_OK;
  zs__coll* op = c->pending_head;
  while (op != NULL && st == ZS_OK) {
    zs__coll* next = op->next;
    if (op->chained) {
      st = zs__coll_wait(c, op);
      next = c->pending_head; /* (a wait may complete others: again) */
    }
    op = next;
  }
  return st;
}

/* ==== Blocking collectives and agreements ================================ */

zs_status zs__comm_all_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype) {
  zs__coll* op = NULL;
  zs_status st = zs__comm_iall_gather(c, tag, send, recv, count, dtype, &op);
  return st == ZS_OK ? zs__coll_wait(c, op) : st;
}

zs_status zs__comm_all_reduce(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype,
                              zs__red_op rop) {
  zs__coll* op = NULL;
  zs_status st = zs__comm_iall_reduce(c, tag, send, recv, count, dtype, rop,
                                      &op);
  return st == ZS_OK ? zs__coll_wait(c, op) : st;
}

zs_status zs__comm_broadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                             size_t count, zs_dtype dtype, int root) {
  zs__coll* op = NULL;
  zs_status st = zs__comm_ibroadcast(c, tag, buf, count, dtype, root, &op);
  return st == ZS_OK ? zs__coll_wait(c, op) : st;
}

uint64_t zs__comm_agree_code(const zs__comm* c, zs_status local) {
  return local != ZS_OK ? (uint64_t)(c->world - c->rank) : 0;
}

zs_status zs__comm_agree_finish(zs__comm* c, zs_status local,
                                uint64_t worst_code, const char* what) {
  if (worst_code == 0) return ZS_OK;
  const int failing = c->world - (int)worst_code;
  enum { CAP = 1024 };
  char saved[CAP];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  char* msg = (char*)calloc(CAP, 1); /* heap: a collective's buffer */
  if (msg == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "agree: calloc");
  snprintf(msg, CAP, "%s", saved);
  zs_status st = zs__comm_broadcast(c, zs__tag(ZS__P_AGREE, -1, NULL), msg,
                                    CAP, ZS_UINT8, failing);
  if (st == ZS_OK) {
    /* every rank has the failure now (zs__call_end sends no notice) */
    c->agreed_failures++;
    msg[CAP - 1] = '\0';
    if (local != ZS_OK)
      st = zs__error(local, "%s", saved);
    else
      st = zs__error(ZS_ERR_REMOTE, "%s failed on rank %d: %s", what, failing,
                     msg);
  }
  zs__comm_free(c, msg);
  return st;
}

zs_status zs__comm_agree(zs__comm* c, zs_status local, const char* what) {
  /* MAX of (world - rank) over failing ranks names the lowest one. */
  uint64_t* code = (uint64_t*)malloc(sizeof *code);
  if (code == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "agree: malloc");
  *code = zs__comm_agree_code(c, local);
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", zs__error_body());
  zs_status st = zs__comm_all_reduce(c, zs__tag(ZS__P_AGREE, -1, NULL),
                                     ZS__IN_PLACE, code, 1, ZS_UINT64,
                                     ZS__RED_MAX);
  uint64_t worst = *code;
  zs__comm_free(c, code);
  if (st != ZS_OK) return st;
  if (local != ZS_OK) zs__error(local, "%s", saved); /* restore the message */
  return zs__comm_agree_finish(c, local, worst, what);
}

/* Broadcasts a NUL-terminated copy of `len` bytes from root. */
static zs_status zs__bcast_copy(zs__comm* c, const char* mine, size_t len,
                                int root, char** out) {
  char* buf = (char*)calloc(len + 1, 1);
  if (buf == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "check: calloc");
  if (c->rank == root) memcpy(buf, mine, len);
  zs_status st = zs__comm_broadcast(c, zs__tag(ZS__P_CHECK, -1, NULL), buf,
                                    len, ZS_UINT8, root);
  if (st != ZS_OK) {
    zs__comm_free(c, buf);
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
  /* Heap, not stack: a collective's buffers (see zs__comm_free). */
  all = (uint64_t*)calloc(2 * (size_t)c->world + 2, sizeof *all);
  if (all == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "check: calloc");
  uint64_t* mine = all + 2 * (size_t)c->world;
  mine[0] = zs__hash_bytes(ZS__FNV_SEED, desc, len);
  mine[1] = (uint64_t)len;
  ZS_CHECK(zs__comm_all_gather(c, zs__tag(ZS__P_CHECK, -1, NULL), mine, all,
                               2, ZS_UINT64));
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
  zs__comm_free(c, bad);
  zs__comm_free(c, ref);
  zs__comm_free(c, all);
  return st;
}

/* ==== zs_step_discard's reconciliation ==================================== */

/* A rank in zs_step_discard whose reconciliation the others have not
 * joined within this time tells them (a discard notice): they may be
 * waiting in a collective it never issued. In the usual case every rank
 * discards at about the same time, and no notice is sent (W - 1 messages
 * per rank). */
#define ZS__DISCARD_NOTICE_AFTER_S 0.05

/* Descriptions travel as four words each. */
#define ZS__DESC_WORDS 4

static void zs__desc_pack(const zs__coll_desc* d, uint64_t* w) {
  w[0] = (uint64_t)d->call | (uint64_t)d->dtype << 8 |
         (uint64_t)d->redop << 16 | (uint64_t)d->purpose << 24 |
         (uint64_t)d->lane << 32;
  w[1] = d->count;
  w[2] = (uint64_t)(uint32_t)(d->root + 1) | (uint64_t)(uint32_t)d->unit << 32;
  w[3] = d->users;
}

static zs__coll_desc zs__desc_unpack(const uint64_t* w, uint64_t lane_seq) {
  zs__coll_desc d;
  d.call = (uint8_t)w[0];
  d.dtype = (uint8_t)(w[0] >> 8);
  d.redop = (uint8_t)(w[0] >> 16);
  d.purpose = (uint8_t)(w[0] >> 24);
  d.lane = (uint8_t)(w[0] >> 32);
  d.count = w[1];
  d.root = (int32_t)(uint32_t)w[2] - 1;
  d.unit = (int32_t)(uint32_t)(w[2] >> 32);
  d.users = w[3];
  d.lane_seq = lane_seq;
  return d;
}

/* The same call of the same size: partners of each other. */
static int zs__desc_same(const zs__coll_desc* a, const zs__coll_desc* b) {
  return a->call == b->call && a->dtype == b->dtype && a->redop == b->redop &&
         a->lane == b->lane && a->root == b->root && a->count == b->count &&
         a->users == b->users;
}

static const char* zs__call_name(int call) {
  static const char* const names[] = {
      "all-gather", "reduce-scatter", "all-reduce",
      "broadcast",  "exchange (fixed-order reduce-scatter)",
      "strided all-gather", "gather to the unit's users"};
  return call >= 0 && call < (int)(sizeof names / sizeof *names) ? names[call]
                                                                : "?";
}

static void zs__desc_text(const zs__coll_desc* d, char* buf, size_t cap) {
  snprintf(buf, cap, "%s of %llu %s elements (%s, unit %d)",
           zs__call_name(d->call), (unsigned long long)d->count,
           zs_dtype_name((zs_dtype)d->dtype), zs__purpose_name(d->purpose),
           (int)d->unit);
}

/* Whether a collective may be completed against empty partners: only
 * those whose results a dropped micro-batch throws away. An
 * initialization, zs_tensor_set or a step's update would leave ranks with
 * different parameters. */
static int zs__catch_up_safe(int purpose) {
  switch (purpose) {
    case ZS__P_CHECK:
    case ZS__P_AGREE:
    case ZS__P_GATHER:
    case ZS__P_REDUCE:
    case ZS__P_REPLICA:
    case ZS__P_GET:
    case ZS__P_CATCH_UP:
      return 1;
    default:
      return 0;
  }
}

/* Runs one control collective to completion: polling, ending with REMOTE
 * at another rank's failure notice and with TIMEOUT (the others told)
 * after collective_timeout_s; `notice` (may be NULL) is sent once after
 * ZS__DISCARD_NOTICE_AFTER_S. On failure the communicator is marked
 * failed and buf must not be freed (zs__comm_free keeps it). */
static zs_status zs__ctrl_run(zs__comm* c, zs_status st, zs__comm_req* req,
                              const char* what, const char* notice) {
  if (st != ZS_OK) {
    char body[ZS__NOTICE_BYTES - 32];
    snprintf(body, sizeof body, "%s", zs__error_body());
    zs__comm_fail(c, st, body, 1, zs__comm_top(c)->seq_count);
    return st;
  }
  const double t0 = zs__now();
  int sent = notice == NULL;
  for (unsigned spins = 0;; spins++) {
    int done = 0;
    st = c->ops->test(c, req, &done);
    if (st != ZS_OK) {
      char body[ZS__NOTICE_BYTES - 32];
      snprintf(body, sizeof body, "zs_step_discard (%s): %s", what,
               zs__error_body());
      zs__comm_fail(c, st, body, 1, zs__comm_top(c)->seq_count);
      return zs__error(st, "%s", body);
    }
    if (done) return ZS_OK;
    if (spins < 256) continue;
    sched_yield();
    if ((spins & 63) != 0) continue;
    const double now = zs__now();
    if (!sent && now - t0 > ZS__DISCARD_NOTICE_AFTER_S) {
      c->ops->notify(c, notice);
      sent = 1;
    }
    char lost[480];
    if (zs__comm_peer_check(c, 0, lost, sizeof lost) >= 0)
      return zs__error(ZS_ERR_REMOTE, "zs_step_discard (%s) cannot complete: "
                       "%s; the context cannot be used any more", what,
                       c->failed_why);
    if (zs__comm_poll_notices(c)) {
      char why[ZS__NOTICE_BYTES];
      snprintf(why, sizeof why, "rank %d failed (%.1200s)", c->notice_from,
               c->notice_msg);
      zs__comm_fail(c, ZS_ERR_REMOTE, why, 0, 0);
      return zs__error(ZS_ERR_REMOTE,
                       "zs_step_discard (%s) cannot complete: %s; the context "
                       "cannot be used any more", what, why);
    }
    if (c->timeout_s > 0 && now - t0 > c->timeout_s) {
      char body[ZS__NOTICE_BYTES - 32];
      snprintf(body, sizeof body,
               "zs_step_discard (%s): not every rank joined within %.0f s "
               "(collective_timeout_s): a rank neither called "
               "zs_step_discard nor waits in a ZeroShard call; the context "
               "cannot be used any more", what, c->timeout_s);
      zs__comm_fail(c, ZS_ERR_TIMEOUT, body, 1, zs__comm_top(c)->seq_count);
      return zs__error(ZS_ERR_TIMEOUT, "%s", body);
    }
  }
}

static zs_status zs__ctrl_all_reduce_max(zs__comm* c, uint64_t* v, size_t n,
                                         const char* what,
                                         const char* notice) {
  zs__comm_req* req = NULL;
  zs_status st = c->ops->ctrl_all_reduce(c, v, n, ZS_UINT64, ZS__RED_MAX, &req);
  return zs__ctrl_run(c, st, req, what, notice);
}

static zs_status zs__ctrl_broadcast(zs__comm* c, void* buf, size_t bytes,
                                    int root, const char* what) {
  zs__comm_req* req = NULL;
  zs_status st = c->ops->ctrl_broadcast(c, buf, bytes, ZS_UINT8, root, &req);
  return zs__ctrl_run(c, st, req, what, NULL);
}

/* Every rank found the same reason not to go on. */
static zs_status zs__reconcile_refuse(zs__comm* c, const char* why) {
  char msg[ZS__NOTICE_BYTES - 32];
  snprintf(msg, sizeof msg,
           "zs_step_discard cannot line up the ranks' collectives: %s; the "
           "context cannot go on: destroy the model and the context and "
           "resume from a checkpoint", why);
  zs__comm_fail(c, ZS_ERR_MISMATCH, msg, 0, 0);
  return zs__error(ZS_ERR_MISMATCH, "%s", msg);
}

/* Lane l needs partners: the lowest rank with the most collectives
 * broadcasts the descriptions of those in [lo, hi) (in flight there);
 * this rank checks the ones it issued itself against them. *ok: 0 (with
 * why) when they differ, or the lowest rank could not list them. The
 * descriptions (hi - lo of them) are returned in *out (the caller frees
 * it). */
static zs_status zs__reconcile_lane(zs__comm* c, int l, int root, uint64_t lo,
                                    uint64_t hi, zs__coll_desc** out, int* ok,
                                    char* why, size_t cap) {
  const size_t n = (size_t)(hi - lo);
  zs_status st = ZS_OK;
  /* (A broadcast's root may complete before its receivers joined, and so
   * not be listed: then the ranks cannot be lined up. No collective a
   * micro-batch issues is a broadcast.) */
  zs__coll_desc* mine = NULL;
  *out = NULL;
  *ok = 1;
  /* Heap, not stack: a collective's buffer (see zs__comm_free). Word 0:
   * the root could list them (1). */
  uint64_t* w = (uint64_t*)calloc(1 + n * ZS__DESC_WORDS, sizeof *w);
  zs__coll_desc* all = (zs__coll_desc*)calloc(n ? n : 1, sizeof *all);
  if (w == NULL || all == NULL) {
    free(all);
    free(w);
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: %zu "
                     "collective descriptions", n);
  }
  if (c->rank == root) {
    const size_t got = zs__comm_pending(c, l, lo, all, n);
    w[0] = got == n;
    for (size_t i = 0; i < n && w[0]; i++) {
      if (all[i].lane_seq != lo + i) w[0] = 0;
      zs__desc_pack(&all[i], w + 1 + i * ZS__DESC_WORDS);
    }
  }
  st = zs__ctrl_broadcast(c, w, (1 + n * ZS__DESC_WORDS) * sizeof *w, root,
                          "descriptions");
  if (st != ZS_OK) goto out; /* w is kept: MPI may still write it */
  if (!w[0]) {
    *ok = 0;
    snprintf(why, cap, "rank %d cannot list its collectives %llu..%llu of "
             "lane %d (completed or failed)", zs__comm_rank_name(c, root),
             (unsigned long long)lo, (unsigned long long)hi - 1, l);
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    all[i] = zs__desc_unpack(w + 1 + i * ZS__DESC_WORDS, lo + i);
  /* Those this rank issued itself are in flight here too, and were paired
   * with the root's: the same calls of the same sizes, or the data already
   * went wrong (MPI truncates or overruns) and no discard can help. */
  const uint64_t own = c->lane_count[l];
  const size_t k = own > lo ? (size_t)(own - lo) : 0;
  mine = (zs__coll_desc*)calloc(k ? k : 1, sizeof *mine);
  if (mine == NULL) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: descriptions");
    goto out;
  }
  if (k > 0 && zs__comm_pending(c, l, lo, mine, k) < k) {
    *ok = 0;
    snprintf(why, cap, "rank %d cannot list its collectives %llu..%llu of "
             "lane %d (completed or failed)", zs__comm_rank_name(c, c->rank),
             (unsigned long long)lo, (unsigned long long)own - 1, l);
    goto out;
  }
  for (size_t i = 0; i < k; i++)
    if (!zs__desc_same(&mine[i], &all[i])) {
      char a[160], b[160];
      zs__desc_text(&mine[i], a, sizeof a);
      zs__desc_text(&all[i], b, sizeof b);
      *ok = 0;
      snprintf(why, cap, "collective %llu of lane %d is a %s on rank %d but "
               "a %s on rank %d: they were paired already (the ranks issued "
               "different collectives in a different order)",
               (unsigned long long)(lo + i), l, a,
               zs__comm_rank_name(c, c->rank), b, zs__comm_rank_name(c, root));
      break;
    }
out:
  free(mine);
  zs__comm_free(c, w);
  if (st == ZS_OK && *ok) *out = all;
  else free(all);
  return st;
}

zs_status zs__comm_reconcile(zs__comm* c, int* matched) {
  enum { L = ZS__LANES, NV = 2 * L + 2 };
  if (matched != NULL) *matched = 0;
  zs_status st = ZS_OK;
  if (c->failed)
    return zs__error(c->failed_status, "the context cannot be used any more "
                     "(end the job): %s", c->failed_why);
  if (c->world == 1 || c->ops->ctrl_all_reduce == NULL) {
    c->epoch++;
    c->discard_from = -1;
    c->seq_hash = ZS__FNV_SEED;
    if (c->parent == NULL) c->check_base = c->check_count;
    return ZS_OK;
  }
  c->reconciling = 1;
  uint64_t max[L], min[L];
  zs__coll_desc* desc[L] = {NULL};
  zs__coll** ups = NULL;
  size_t nups = 0;
  /* 1. Lane counts and the epoch, each with its complement (MAX of both
   * gives max and min). */
  uint64_t* v = (uint64_t*)malloc(NV * sizeof *v);
  if (v == NULL) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: agreement");
    goto fail;
  }
  for (int l = 0; l < L; l++) {
    v[2 * l] = c->lane_count[l];
    v[2 * l + 1] = ~c->lane_count[l];
  }
  v[2 * L] = c->epoch;
  v[2 * L + 1] = ~c->epoch;
  char notice[128];
  zs__comm* top = zs__comm_top(c);
  snprintf(notice, sizeof notice, "D %llu %llu %llu %llu %d",
           (unsigned long long)c->epoch, (unsigned long long)c->lane_count[0],
           (unsigned long long)c->lane_count[1],
           (unsigned long long)c->lane_count[2],
           top->discard_origin >= 0 ? top->discard_origin : top->rank);
  st = zs__ctrl_all_reduce_max(c, v, NV, "collective counts", notice);
  if (st != ZS_OK) goto fail; /* v is kept: MPI may still write it */
  int need = 0;
  for (int l = 0; l < L; l++) {
    max[l] = v[2 * l];
    min[l] = ~v[2 * l + 1];
    need |= max[l] != min[l];
  }
  const int epochs_differ = v[2 * L] != ~v[2 * L + 1];
  zs__comm_free(c, v);
  if (epochs_differ) {
    st = zs__reconcile_refuse(c, "the ranks are at different discards "
                              "(some called zs_step_discard more often)");
    goto fail;
  }
  if (need) {
    /* 2. Per lane that needs it, the lowest rank with the most. */
    uint64_t* r = (uint64_t*)calloc(L, sizeof *r);
    if (r == NULL) {
      st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: agreement");
      goto fail;
    }
    for (int l = 0; l < L; l++)
      r[l] = c->lane_count[l] == max[l] ? (uint64_t)(c->world - c->rank) : 0;
    st = zs__ctrl_all_reduce_max(c, r, L, "lowest rank", NULL);
    if (st != ZS_OK) goto fail;
    int root[L];
    for (int l = 0; l < L; l++) root[l] = c->world - (int)r[l];
    zs__comm_free(c, r);
    /* 3. Their descriptions, checked against what this rank issued; then
     * every rank agrees whether all lanes are fine (one all-reduce: the
     * lowest rank that found a difference says why). */
    int ok = 1;
    char why[600] = "";
    for (int l = 0; l < L && st == ZS_OK; l++) {
      if (max[l] == min[l]) continue;
      int lane_ok = 1;
      char lane_why[600];
      st = zs__reconcile_lane(c, l, root[l], min[l], max[l], &desc[l],
                              &lane_ok, lane_why, sizeof lane_why);
      if (st == ZS_OK && !lane_ok && ok) {
        ok = 0;
        snprintf(why, sizeof why, "%s", lane_why);
      }
    }
    if (st != ZS_OK) goto fail;
    uint64_t* bad = (uint64_t*)calloc(1, sizeof *bad);
    if (bad == NULL) {
      st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: agreement");
      goto fail;
    }
    *bad = ok ? 0 : (uint64_t)(c->world - c->rank);
    st = zs__ctrl_all_reduce_max(c, bad, 1, "check", NULL);
    if (st != ZS_OK) goto fail;
    const int bad_rank = *bad != 0 ? c->world - (int)*bad : -1;
    zs__comm_free(c, bad);
    if (bad_rank >= 0) {
      char* text = (char*)calloc(1, sizeof why);
      if (text == NULL) {
        st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: message");
        goto fail;
      }
      if (c->rank == bad_rank) snprintf(text, sizeof why, "%s", why);
      st = zs__ctrl_broadcast(c, text, sizeof why, bad_rank, "message");
      if (st != ZS_OK) goto fail;
      text[sizeof why - 1] = '\0';
      snprintf(why, sizeof why, "%s", text);
      zs__comm_free(c, text);
      st = zs__reconcile_refuse(c, why);
      goto fail;
    }
    /* Every rank has the same descriptions: the same verdict on them. */
    for (int l = 0; l < L; l++)
      for (uint64_t i = 0; max[l] != min[l] && i < max[l] - min[l]; i++)
        if (!zs__catch_up_safe(desc[l][i].purpose)) {
          char d[160];
          zs__desc_text(&desc[l][i], d, sizeof d);
          snprintf(why, sizeof why, "rank %d issued a %s that some rank did "
                   "not: completed against empty partners it would leave the "
                   "ranks with different parameters",
                   zs__comm_rank_name(c, root[l]), d);
          st = zs__reconcile_refuse(c, why);
          goto fail;
        }
    /* 4. The partners this rank owes, issued all at once (each lane in
     * order), then waited for; everything in flight anywhere completes. */
    for (int l = 0; l < L; l++) nups += (size_t)(max[l] - c->lane_count[l]);
    ups = (zs__coll**)calloc(nups ? nups : 1, sizeof *ups);
    if (ups == NULL) {
      st = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_step_discard: catch-ups");
      goto fail;
    }
    size_t k = 0;
    for (int l = 0; l < L; l++)
      while (st == ZS_OK && c->lane_count[l] < max[l]) {
        const uint64_t at = c->lane_count[l];
        st = zs__comm_icatch_up(c, &desc[l][at - min[l]], &ups[k]);
        if (st == ZS_OK) k++;
      }
    for (size_t i = 0; i < k; i++) {
      zs_status s2 = st == ZS_OK ? zs__coll_wait(c, ups[i]) : ZS_OK;
      if (st == ZS_OK) st = s2;
    }
    if (st != ZS_OK) {
      char body[ZS__NOTICE_BYTES - 32];
      snprintf(body, sizeof body, "%s", zs__error_body());
      zs__comm_fail(c, st, body, 1, zs__comm_top(c)->seq_count);
      goto fail;
    }
    if (matched != NULL) *matched = 1;
    c->dirty_epoch++;
  }
  for (int l = 0; l < L; l++) free(desc[l]);
  free(ups);
  c->epoch++;
  c->discard_from = -1;
  /* Every lane count is the same everywhere now, and which units the
   * dropped collectives were for no longer matters. */
  c->seq_hash = ZS__FNV_SEED;
  if (c->parent == NULL) c->check_base = c->check_count;
  c->reconciling = 0;
  zs__log(ZS_LOG_INFO, "zs_step_discard: collectives lined up%s",
          need ? " (partners issued for those some rank lacked)" : "");
  return ZS_OK;
fail:
  for (int l = 0; l < L; l++) free(desc[l]);
  free(ups);
  c->reconciling = 0;
  return st;
}
