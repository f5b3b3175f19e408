/*
 * comm.h — the communicator backend interface: all-gather, reduce-scatter,
 * all-reduce and broadcast, each blocking (req == NULL) or non-blocking
 * (a request completed by wait/test). One vtable per backend: MPI over host
 * memory (comm_mpi.c), NCCL over device memory (comm_nccl.c), one process
 * (comm_local.c). The engine calls only the zs__comm_* wrappers (comm.c;
 * waiting, blocking collectives and agreements: comm_wait.h), which count
 * every call (calls, bytes as nccl-tests counts them, time) and fold it
 * into a per-step sequence hash so ranks can check they issued the same
 * collectives.
 *
 * Counts are in ELEMENTS of the given dtype.
 */
#ifndef ZS_RUNTIME_COMM_H_
#define ZS_RUNTIME_COMM_H_

#include "runtime/comm/comm_heartbeat.h"
#include "runtime/core/core.h"
#include "runtime/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zs__red_op { ZS__RED_SUM = 0, ZS__RED_MAX = 1, ZS__RED_MIN = 2 } zs__red_op;

/* Marks an in-place send buffer (MPI_IN_PLACE semantics: for all-gather the
 * rank's block is read from recv + rank * count; for all-reduce from recv). */
#define ZS__IN_PLACE ((const void*)(intptr_t)-1)

typedef struct zs__comm zs__comm;
typedef struct zs__comm_req zs__comm_req;

/* The backend call a collective went through (what another rank must call
 * to be its partner). */
typedef enum zs__call {
  ZS__CALL_ALL_GATHER = 0,
  ZS__CALL_REDUCE_SCATTER = 1,
  ZS__CALL_ALL_REDUCE = 2,
  ZS__CALL_BROADCAST = 3,
  ZS__CALL_EXCHANGE = 4,
  ZS__CALL_ALL_GATHER_STRIDED = 5,
  ZS__CALL_GATHER_USERS = 6
} zs__call;

/* Lanes: a backend pairs the collectives of one lane across ranks in issue
 * order, each lane independently of the others (MPI: its collectives, and
 * its point-to-point operations by tag; NCCL: everything on device
 * memory). zs_step_discard matches what some rank issued and others did
 * not lane by lane (zs__comm_reconcile). */
#define ZS__LANES 3

typedef struct zs__comm_ops {
  const char* name;
  /* recv: count * world elements; send: count elements or ZS__IN_PLACE. */
  zs_status (*all_gather)(zs__comm* c, const void* send, void* recv,
                          size_t count, zs_dtype dtype, zs__stream* stream,
                          zs__comm_req** req);
  /* send: count * world elements; recv: count elements (rank's block of the
   * element-wise reduction). send and recv must not overlap. */
  zs_status (*reduce_scatter)(zs__comm* c, const void* send, void* recv,
                              size_t count, zs_dtype dtype, zs__red_op op,
                              zs__stream* stream, zs__comm_req** req);
  /* send, recv: count elements; send may be ZS__IN_PLACE. */
  zs_status (*all_reduce)(zs__comm* c, const void* send, void* recv,
                          size_t count, zs_dtype dtype, zs__red_op op,
                          zs__stream* stream, zs__comm_req** req);
  zs_status (*broadcast)(zs__comm* c, void* buf, size_t count, zs_dtype dtype,
                         int root, zs__stream* stream, zs__comm_req** req);
  /* All-to-all of equal chunks: `chunk` elements from send + offsets[r] go
   * to rank r, which receives them at recv + rank * chunk; recv holds
   * world * chunk elements. offsets: world entries (elements), copied. The
   * building block of the fixed-order reduce-scatter. */
  zs_status (*exchange)(zs__comm* c, const void* send, const size_t* offsets,
                        void* recv, size_t chunk, zs_dtype dtype,
                        zs__stream* stream, zs__comm_req** req);
  /* In-place all-gather of strided chunks: rank r's `chunk` elements live at
   * buf + r * stride + offset (a bucket of every rank's shard). */
  zs_status (*all_gather_strided)(zs__comm* c, void* buf, size_t offset,
                                  size_t stride, size_t chunk, zs_dtype dtype,
                                  zs__stream* stream, zs__comm_req** req);
  /* Completes and frees req. */
  zs_status (*wait)(zs__comm* c, zs__comm_req* req);
  /* Sets *done; a completed req is freed. */
  zs_status (*test)(zs__comm* c, zs__comm_req* req, int* done);
  /* Starts a thread that drives the backend's progress while the caller
   * computes, so non-blocking collectives advance between API calls.
   * Returns UNSUPPORTED (with the reason) when the backend cannot. */
  zs_status (*start_progress)(zs__comm* c);
  void (*destroy)(zs__comm* c);
  /* Notices between ranks (NULL where there is no other rank): notify
   * sends msg (NUL-terminated, cut to ZS__NOTICE_BYTES - 1 bytes) to every
   * other rank and returns at once (it never waits for them; its buffers
   * are freed once MPI is done with them); comm.c sends a failure notice at
   * most once per communicator and a discard notice once per discard.
   * poll_notice never blocks: it returns 1 and sets *rank and msg (cap
   * bytes) for each notice from another rank, once, in arrival order; 0
   * when none is waiting. */
  void (*notify)(zs__comm* c, const char* msg);
  int (*poll_notice)(zs__comm* c, int* rank, char* msg, size_t cap);
  /* Gives up the collectives in flight after a failure, so none keeps the
   * device busy (NCCL: ncclCommAbort); NULL where nothing is needed. */
  void (*abort)(zs__comm* c);
  /* 0 when the backend can no longer run any call (MPI: the caller's
   * MPI_Finalize came before zs_context_destroy, after which any MPI call
   * would end the process); NULL where that cannot happen. */
  int (*alive)(const zs__comm* c);
  /* The lane (0 .. ZS__LANES-1) of a call on buffer buf; NULL: lane 0. */
  int (*lane)(zs__comm* c, zs__call call, const void* buf);
  /* Control collectives on a communicator of their own, which never pair
   * with the collectives above (zs__comm_reconcile agrees through them
   * while some ranks have collectives in flight that others never issued):
   * an in-place all-reduce and a broadcast of host memory, non-blocking,
   * completed by wait/test; not counted, logged or hashed. NULL where
   * there is no other rank. */
  zs_status (*ctrl_all_reduce)(zs__comm* c, void* buf, size_t count,
                               zs_dtype dtype, zs__red_op op,
                               zs__comm_req** req);
  zs_status (*ctrl_broadcast)(zs__comm* c, void* buf, size_t count,
                              zs_dtype dtype, int root, zs__comm_req** req);
  /* An all-gather to the ranks in `users` only (bit r: rank r; world <=
   * 64): every rank sends its `count` elements from send to each user
   * other than itself; a user receives rank r's at recv + r * count (count
   * * world elements) and copies its own there; a rank outside `users`
   * receives nothing (recv NULL). */
  zs_status (*gather_users)(zs__comm* c, const void* send, void* recv,
                            size_t count, zs_dtype dtype, uint64_t users,
                            zs__stream* stream, zs__comm_req** req);
  /* The fixed-order reduce-scatter in one call: dst (chunk elements) gets
   * the sum over ranks r = 0, 1, ..., W-1, in that order, of rank r's
   * send + offsets[rank] (offsets: world entries, elements, copied),
   * divided by divisor, computed as zs__host_sum_ranks does (the same bits
   * as an exchange followed by sum_chunks). It must pair with a partner's
   * exchange of the same chunk (a reconciliation's catch-up issues one).
   * NULL: comm.c runs the exchange and the sum itself. */
  zs_status (*reduce_scatter_fixed)(zs__comm* c, const void* send,
                                    const size_t* offsets, void* dst,
                                    size_t chunk, float divisor,
                                    zs_dtype dtype, zs__stream* stream,
                                    zs__comm_req** req);
  /* Sleeps until req may have completed, for at most about a millisecond
   * (waits call it between tests, instead of yielding the core, so a
   * waiting caller leaves the cores to the ranks' workers). NULL: waits
   * yield. */
  void (*idle)(zs__comm* c, zs__comm_req* req);
  /* Device-side chaining: makes the device's later work (the legacy
   * default stream's, and so every blocking stream's: the compute stream,
   * the user's kernels) wait on the device for req's completion, and
   * returns without waiting; req stays in flight (test or wait completes
   * it). UNSUPPORTED for a request that cannot be waited on so (host
   * memory). NULL: the backend cannot (the host device, MPI). */
  zs_status (*chain)(zs__comm* c, zs__comm_req* req);
  /* The device timeline (comm_nccl.c, ZS_DEVICE_TIMELINE): notes the point
   * the device's work queued so far on the legacy default stream (the
   * user's kernels) has reached, as `label` of `unit` (both copied). NULL
   * where the backend keeps no timeline. */
  void (*mark)(zs__comm* c, const char* label, const char* unit);
  /* Device-side chaining of the fixed-order reduce-scatter's sum: queues
   * dst = the rank-ordered sum of the nchunks chunks of `chunk` elements
   * in tmp (the exchange's output), divided by divisor (device
   * sum_chunks), on the device right after req (the exchange), and moves
   * req's completion after it, so no host sees the exchange complete
   * before the sum is queued. NULL: comm.c sums at completion. */
  zs_status (*chain_sum)(zs__comm* c, zs__comm_req* req, void* dst,
                         const void* tmp, int nchunks, size_t chunk,
                         float divisor, zs_dtype dtype);
} zs__comm_ops;

/* Bytes of one failure notice (the failing rank's error message). */
#define ZS__NOTICE_BYTES 1536

/* One collective in the communication log: what, for whom, how big, when
 * it was issued and when this rank saw it complete (zs__now seconds). */
typedef struct zs__comm_log_entry {
  uint64_t seq;        /* position in this rank's collective sequence */
  uint8_t op;          /* zs_coll_op */
  uint8_t purpose;     /* zs__purpose */
  uint8_t group;       /* zs__group: the communicator it ran on */
  int32_t unit;        /* -1: not about a unit */
  uint64_t bytes;      /* as nccl-tests counts them */
  double t_issue;
  double t_done;       /* 0 while in flight */
} zs__comm_log_entry;

/* Which communicator of a context a collective ran on. */
typedef enum zs__group {
  ZS__GROUP_WORLD = 0,   /* every rank of the context */
  ZS__GROUP_SHARD = 1,   /* the ranks a unit's shards are spread over (all
                            of them without hybrid sharding: then this is
                            the context's communicator too) */
  ZS__GROUP_REPLICA = 2  /* the ranks holding the same shard, one per shard
                            group (hybrid sharding only) */
} zs__group;

/* A short name of a zs__purpose ("param gather", "grad reduce", ...). */
const char* zs__purpose_name(int purpose);

/* The log keeps the most recent ZS__COMM_LOG_CAP entries. */
#define ZS__COMM_LOG_CAP 8192

struct zs__comm {
  const zs__comm_ops* ops;
  int rank;
  int world;
  int local_rank;     /* among the ranks on this node (shared memory) */
  int local_size;
  void* impl;
  zs__device* dev;    /* for reduction temporaries (not owned) */
  zs__comm_log_entry* log; /* ring of ZS__COMM_LOG_CAP entries, or NULL */
  double log_t0;      /* zs__now() when the log started */
  zs__profiler* prof; /* not owned; NULL: no collective spans */
  uint64_t in_flight; /* started and not yet completed collectives (the
                         context's: its groups' too) (read
                         by the progress thread: atomic) */
  uint64_t max_in_flight_gathers; /* most parameter all-gathers in flight */
  uint64_t gathers_in_flight;
  zs_comm_counters counters;
  uint64_t seq_hash;  /* every collective since creation, in order */
  uint64_t seq_count;
  uint64_t check_count; /* the collectives every rank of the context
                         issues alike: seq_count less the groups' own
                         (zs__coll_tag.group_local) */
  uint64_t check_base;  /* check_count when the last reconciliation of this
                         (the context's) communicator ended: with shard
                         groups, groups lined up apart may differ in count
                         before it; after it every rank counts alike */
  double timeout_s;   /* 0: wait forever */
  int failed;         /* a collective timed out, another rank failed, or
                         this rank gave up (zs__comm_abandon): MPI may
                         still write into buffers of collectives in flight,
                         so nothing may be freed or issued */
  char failed_why[512]; /* why, for the errors of later calls */
  zs_status failed_status; /* and their status */
  int notified;       /* this rank sent its failure notice */
  int notice_from;    /* -1, or the rank whose notice names the earliest
                         collective of the notices received so far */
  uint64_t notice_seq; /* that collective's position in the sequence */
  char notice_msg[ZS__NOTICE_BYTES];
  uint64_t agreed_failures; /* agreements that ended in a failure: every
                         rank knows of those (zs__comm_agree_finish) */
  size_t max_count;   /* most elements per rank one collective can move */
  /* Reconciliation (zs__comm_reconcile). */
  uint64_t lane_count[ZS__LANES]; /* collectives issued per lane */
  struct zs__coll* pending_head;  /* collectives in flight, oldest first */
  struct zs__coll* pending_tail;
  uint64_t epoch;       /* reconciliations completed (the same everywhere) */
  uint64_t dirty_epoch; /* ... of which matched missing collectives */
  int reconciling;      /* inside zs__comm_reconcile */
  int discard_origin;   /* the context's rank whose zs_step_discard the
                           next reconciliation runs for, when this rank
                           joins on its behalf (its notice names it); -1:
                           this rank's own */
  int discard_from;     /* -1, or a rank (of the context's communicator)
                           whose discard notice for this
                           epoch arrived: it joins no collective of lane L
                           from discard_lane[L] on until the reconcile */
  uint64_t discard_lane[ZS__LANES];
  zs__heartbeat* hb;    /* the other ranks' liveness (comm_heartbeat.h), or
                           NULL (one rank, heartbeat_timeout_s 0); owned,
                           except a group's (the parent's, borrowed) */
  uint8_t group;        /* zs__group, for the log */
  int name_first, name_stride; /* a group's r-th rank is the context's
                           rank name_first + r * name_stride (messages) */
  zs__comm* shard_group; /* the context's: its shard group's communicator
                           (hybrid sharding), whose discards a wait here
                           joins too; NULL otherwise (not owned) */
  int chain;            /* device-side chaining asked for (ZS_DEVICE_CHAIN=1,
                           read once when its CUDA communicator is made:
                           docs/cuda.md, "Consumers that wait on the
                           device"); off by default: a rank whose host is
                           blocked on the device behind a collective
                           another rank never issues cannot join that
                           rank's zs_step_discard (only the watchdog's
                           timeout ends it), where a host wait joins at
                           once */
  zs__comm* parent;     /* a group's (shard or replica group of hybrid
                           sharding: docs/running.md, "Shard groups"): the
                           context's communicator, which keeps the
                           counters, the log, the collective sequence and
                           the failure notices of both (zs__comm_top);
                           NULL for the context's own */
};

/* The context's rank of c's r-th rank (for messages). */
static inline int zs__comm_rank_name(const zs__comm* c, int r) {
  return c->parent != NULL ? c->name_first + r * c->name_stride : r;
}

/* The communicator that keeps c's counters, log, sequence and failure
 * notices: c's parent for a group, else c. */
static inline zs__comm* zs__comm_top(zs__comm* c) {
  return c->parent != NULL ? c->parent : c;
}

/* ---- Collectives the engine starts ------------------------------------- */

/* What a collective is for. Hashed together with the unit, so that ranks
 * which issue collectives of the same sizes for different units (e.g. two
 * equally sized blocks in a different order) are caught. */
typedef enum zs__purpose {
  ZS__P_CHECK = 1,        /* cross-rank consistency checks */
  ZS__P_AGREE = 2,        /* agreeing on a status */
  ZS__P_GATHER = 3,       /* stage-3 all-gather of a unit's parameters */
  ZS__P_REDUCE = 4,       /* reduce-scatter of a unit's gradients */
  ZS__P_GRAD_GATHER = 5,  /* stage-0 all-gather of reduced gradients */
  ZS__P_PARAM_GATHER = 6, /* stage 1-2 all-gather of updated parameters */
  ZS__P_INIT = 7,         /* initialization broadcasts */
  ZS__P_SET = 8,          /* zs_tensor_set */
  ZS__P_GET = 9,          /* zs_tensor_get */
  ZS__P_NORM = 10,        /* zs_step: gradient norm / overflow agreement */
  ZS__P_CATCH_UP = 11,    /* zs__comm_reconcile: a partner for a collective
                             this rank never issued */
  ZS__P_REPLICA = 12      /* hybrid sharding: the all-reduce of a unit's
                             reduced gradient shard across the replica
                             group (a reduce-scatter and an all-gather) */
} zs__purpose;

typedef struct zs__coll_tag {
  zs__purpose purpose;
  int unit;         /* -1 when not about a unit */
  const char* name; /* the unit's name, for messages (may be NULL) */
  int group_local;  /* a group's collective that depends on its own ranks'
                       data (hybrid sharding's gathers of units some ranks
                       do not use): groups issue different ones, so it is
                       left out of the context-wide check (check_count,
                       seq_hash) */
} zs__coll_tag;

static inline zs__coll_tag zs__tag(zs__purpose p, int unit, const char* name) {
  zs__coll_tag t = {p, unit, name, 0};
  return t;
}

/* ---- Non-blocking collectives ------------------------------------------ */

/* An in-flight collective. Completed (and freed) by zs__coll_wait, or by
 * zs__coll_test once it reports done. */
typedef struct zs__coll zs__coll;

/* Starts an all-gather (as zs__comm_all_gather) and returns at once. */
zs_status zs__comm_iall_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                               void* recv, size_t count, zs_dtype dtype,
                               zs__coll** out);

/* Starts a gather to the ranks in `users` (comm ops' gather_users; counted
 * and logged as ZS_COLL_GATHER, bytes as an all-gather's) and returns at
 * once. recv: NULL on a rank outside `users`. */
zs_status zs__comm_igather_users(zs__comm* c, zs__coll_tag tag,
                                 const void* send, void* recv, size_t count,
                                 zs_dtype dtype, uint64_t users,
                                 zs__coll** out);

/* Starts an in-place all-gather of one bucket of every rank's shard: rank
 * r's `chunk` elements at buf + r * stride + offset. */
zs_status zs__comm_iall_gather_strided(zs__comm* c, zs__coll_tag tag,
                                       void* buf, size_t offset,
                                       size_t stride, size_t chunk,
                                       zs_dtype dtype, zs__coll** out);

/* How reduce-scatter orders its sums. FIXED (default): every element is
 * summed in rank order 0, 1, ..., W-1 (an exchange of the chunks, then a
 * local sum), so results are bitwise independent of bucket sizes, message
 * sizes and the MPI library's algorithm choice. BACKEND: the backend's own
 * reduce-scatter (MPI_Ireduce_scatter_block), whose order may change with
 * message size. */
typedef enum zs__reduce_order {
  ZS__REDUCE_FIXED = 0,
  ZS__REDUCE_BACKEND = 1
} zs__reduce_order;

/* Starts the reduce-scatter of one bucket: every rank contributes
 * send[r * stride + offset .. + chunk) for each rank r, and dst (chunk
 * elements) receives the SUM over ranks of this rank's chunk divided by
 * `divisor` (1: the plain sum; the world size: the mean, ncclAvg's role).
 * FIXED order sums in fp32 and rounds once into dtype; BACKEND divides the
 * backend's sum at completion. send must stay untouched until completion;
 * dst is written at completion. A temporary of world * chunk elements
 * (comm_buffers) lives until then. */
zs_status zs__comm_ireduce_scatter(zs__comm* c, zs__coll_tag tag,
                                   zs__reduce_order order, const void* send,
                                   size_t offset, size_t stride, size_t chunk,
                                   void* dst, float divisor, zs_dtype dtype,
                                   zs__coll** out);

/* Start an all-reduce / a broadcast (as zs__comm_all_reduce,
 * zs__comm_broadcast) and return at once. */
zs_status zs__comm_iall_reduce(zs__comm* c, zs__coll_tag tag, const void* send,
                               void* recv, size_t count, zs_dtype dtype,
                               zs__red_op op, zs__coll** out);
zs_status zs__comm_ibroadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                              size_t count, zs_dtype dtype, int root,
                              zs__coll** out);

/* Completes op if it is done (then *done = 1 and op is freed). */
zs_status zs__coll_test(zs__comm* c, zs__coll* op, int* done);



/* Copies up to cap of the most recent log entries (oldest first) and
 * returns how many the log holds. */
size_t zs__comm_log_read(const zs__comm* c, zs__comm_log_entry* out,
                         size_t cap);

/* This rank failed in a way that makes it skip collectives the other
 * ranks will issue (out of memory for a unit's all-gather buffer, a device
 * error in the step): with more than one rank, marks the communicator
 * failed (as a timeout does: nothing new starts, no buffer of a collective
 * in flight is freed; later calls return INVALID_STATE) and sends every
 * other rank, without waiting, this rank's error message and its
 * seq_count: the first collective of the common sequence it will not
 * join. A rank waiting in that collective or a later one then fails at
 * once with ZS_ERR_REMOTE naming this rank and its message, instead of
 * waiting collective_timeout_s (torch.distributed's watchdog and NCCL's
 * ncclCommAbort play this role in PyTorch); one waiting in an earlier
 * collective goes on waiting, so the caller should first complete what it
 * issued (zs__call_end does). Sent once per communicator, also when it
 * already failed on another rank's notice. Returns st, with the message
 * extended by what happened; with one rank, st == ZS_OK or a notice sent
 * already, returns st untouched. Local, never blocks. */
zs_status zs__comm_abandon(zs__comm* c, zs_status st);

/* ---- What comm_wait.c needs of comm.c ---- */

/* A collective in flight: made by the zs__comm_i* calls, completed and
 * freed by zs__coll_test (which zs__coll_wait polls). */
struct zs__coll {
  zs__comm_req* req;  /* the backend's request */
  zs_coll_op op;
  zs__call call;      /* the backend call (its partners must make it) */
  zs__red_op redop;
  int root;           /* broadcast: the root, else -1 */
  int lane;
  uint64_t lane_seq;  /* position in its lane */
  zs__coll* prev;     /* c->pending_head list: in flight, issue order */
  zs__coll* next;
  zs__coll_tag tag;
  size_t count;       /* elements per rank */
  zs_dtype dtype;
  uint64_t seq;       /* its log entry */
  double t_issue;
  int is_param_gather;
  uint64_t users;     /* gather_users: the receiving ranks */
  void* tmp;          /* reduce-scatter temporary (device memory) */
  void* dst;          /* fixed-order reduce-scatter: the sum goes here */
  void* div_dst;      /* backend reduce-scatter: divided at completion */
  float divisor;      /* reduce-scatter: the sum is divided by this */
  void* host_tmp;     /* a catch-up's scratch in host memory (accounted
                         in the device's accounting), freed at completion */
  int chained;        /* zs__coll_chain: its consumers wait on the device;
                         completed by zs__comm_sweep or zs__comm_drain */
};

/* INVALID_STATE-like status of a failed communicator (its first status,
 * naming why), ZS_OK while it is usable; finds a finalized MPI too. */
zs_status zs__comm_usable(zs__comm* c);
/* zs__comm_usable without asking the heartbeats: for a wait of a
 * collective already issued, which a lost rank may have completed its part
 * of before it went (the wait tests it, then asks them). */
zs_status zs__comm_failed_check(zs__comm* c);
/* The rank the heartbeats lost (zs__hb_lost: with `waiting`, also one
 * that left), with why in `why` (cap bytes), and c failed with
 * ZS_ERR_REMOTE naming it; -1 when none. */
int zs__comm_peer_check(zs__comm* c, int waiting, char* why, size_t cap);
/* "the host device", "the cuda device at PCI ...": for messages. */
void zs__comm_dev_name(const zs__device* dev, char* buf, size_t cap);
/* What this rank holds by category, for messages. */
void zs__comm_report(const zs__comm* c, char* buf, size_t cap);


/* A collective as its partners must make it. Lanes 0 and 1 work on host
 * memory, lane 2 on the device's. */
typedef struct zs__coll_desc {
  uint8_t call;    /* zs__call */
  uint8_t dtype;   /* zs_dtype */
  uint8_t redop;   /* zs__red_op */
  uint8_t purpose; /* zs__purpose */
  uint8_t lane;
  int32_t root;    /* broadcast root, else -1 */
  int32_t unit;    /* -1: not about a unit */
  uint64_t lane_seq;
  uint64_t count;  /* elements per rank (all-gather, reduce-scatter, the
                      exchange's chunk) or in all (all-reduce, broadcast) */
  uint64_t users;  /* gather to users: the receiving ranks, else 0 */
} zs__coll_desc;

/* Copies the descriptions of this rank's collectives in flight on `lane`
 * with lane_seq >= from, in issue order, into out (at most cap); returns
 * how many there are. */
size_t zs__comm_pending(const zs__comm* c, int lane, uint64_t from,
                        zs__coll_desc* out, size_t cap);
/* Starts a partner for d with zeroed scratch buffers of its own (comm
 * buffers, freed at completion), counted and logged as purpose
 * ZS__P_CATCH_UP. Errors: OUT_OF_MEMORY, COMM. */
zs_status zs__comm_icatch_up(zs__comm* c, const zs__coll_desc* d,
                             struct zs__coll** out);
/* Takes in the notices that arrived (comm.c); 1 when a failure notice is
 * among those received so far (c->notice_from, notice_msg). */
int zs__comm_poll_notices(zs__comm* c);
/* Marks c failed with st and why, as a timeout does: nothing new starts,
 * later calls return st naming `why`, the buffers of collectives in flight
 * are kept, and destroy does not wait for them. With notify, tells the
 * other ranks that this rank completes no collective from its from_seq-th
 * on; without, tells no one (every rank found the same, or the others
 * will time out). Local, never blocks. */
void zs__comm_fail(zs__comm* c, zs_status st, const char* why, int notify,
                   uint64_t from_seq);

/* free() for host blocks that a collective used: after a timeout the block
 * is kept (leaked), because the abandoned collective may still write it. */
void zs__comm_free(const zs__comm* c, void* p);

void zs__comm_destroy(zs__comm* c);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_H_ */
