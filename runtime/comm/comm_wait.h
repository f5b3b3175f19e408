/*
 * comm_wait.h — waiting for collectives (comm_wait.c): the wait, the blocking
 * collectives and agreements built on it, and zs_step_discard's
 * reconciliation, which a wait may join.
 */
#ifndef ZS_RUNTIME_COMM_WAIT_H_
#define ZS_RUNTIME_COMM_WAIT_H_

#include "runtime/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Waits (polling, with the timeout of the blocking wrappers) and completes:
 * finishes a reduce-scatter's sum, logs the completion, frees op. When
 * another rank dropped the micro-batch (zs_step_discard) without issuing
 * op, this rank joins the reconciliation from here, op completes against
 * an empty partner, and the wait returns ZS_ERR_REMOTE naming that rank
 * (the caller's micro-batch must be dropped too). */
zs_status zs__coll_wait(zs__comm* c, zs__coll* op);

/* Hands op's output to its consumers without a host wait: the device's
 * later work (the legacy default stream's, so the compute stream's and
 * the user's kernels too) waits for op on the device (ops->chain,
 * cudaStreamWaitEvent), and op stays in flight, owned by the communicator
 * until zs__comm_sweep sees it done or zs__comm_drain waits for it; a
 * collective that never completes is then the backend's watchdog's to
 * find. Where that cannot be (a backend without chain, host memory, a
 * reduce-scatter whose sum or mean is still to be computed at completion,
 * chaining not asked for: c->chain, set by ZS_DEVICE_CHAIN=1)
 * it is zs__coll_wait. Errors: zs__coll_wait's. */
zs_status zs__coll_chain(zs__comm* c, zs__coll* op);

/* Completes the chained collectives that are done (tests, never waits).
 * Errors: the first failed one's (the communicator is failed then). */
zs_status zs__comm_sweep(zs__comm* c);

/* Waits for every chained collective (zs__coll_wait each, with its
 * timeout). Errors: the first failed one's. */
zs_status zs__comm_drain(zs__comm* c);

/* Each wrapper starts the collective, then waits for it while polling, so
 * that a collective another rank never joins becomes ZS_ERR_TIMEOUT naming
 * the collective and the unit (after c->timeout_s; a warning is logged every
 * minute before that) instead of a silent hang, and ZS_ERR_REMOTE at once
 * when another rank has sent a failure notice (zs__comm_abandon, or its own
 * timeout, which notifies the others too). A collective given up this way
 * cannot be cancelled: the context is unusable afterwards. Every call is
 * counted and folded into c->seq_hash, which is cumulative since the
 * communicator was created. */
zs_status zs__comm_all_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype);
zs_status zs__comm_all_reduce(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype,
                              zs__red_op op);
zs_status zs__comm_broadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                             size_t count, zs_dtype dtype, int root);


/* Collective agreement on a status: ZS_OK on every rank if `local` is ZS_OK
 * everywhere. Otherwise the lowest failing rank's message is broadcast;
 * that rank (and any other failing rank) returns its own status, the others
 * ZS_ERR_REMOTE "<what> failed on rank R: <its message>". One all-reduce of
 * two integers, plus one broadcast on failure. */
zs_status zs__comm_agree(zs__comm* c, zs_status local, const char* what);

/* The two halves of zs__comm_agree, for callers that fold the agreement
 * into an all-reduce of their own: the code this rank contributes (reduce
 * with MAX), and the finish given the reduced code (0: all OK). */
uint64_t zs__comm_agree_code(const zs__comm* c, zs_status local);
zs_status zs__comm_agree_finish(zs__comm* c, zs_status local,
                                uint64_t worst_code, const char* what);

/* Collective. ZS_OK if `desc` (len bytes of '\n'-separated lines) is
 * identical on every rank. Otherwise ZS_ERR_MISMATCH on every rank, with a
 * message naming the first rank that differs from rank 0 and the first line
 * where they differ: "<what> differs across ranks: rank 2 has '...' where
 * rank 0 has '...'". Costs one all-gather of 16 bytes per rank when they
 * agree, plus two broadcasts when they do not. */
zs_status zs__comm_check_same(zs__comm* c, const char* what, const char* desc,
                              size_t len);


/* zs_step_discard's reconciliation. Collective over every rank of c,
 * which may have issued different collectives since the last time the
 * ranks agreed (a rank whose pass failed part-way issued fewer; another
 * waits in one it never joins). Through the control communicator, never
 * the data lanes:
 *   1. every rank's count of collectives per lane (one all-reduce; a rank
 *      still waiting in a data collective is told by a discard notice,
 *      sent when the others do not arrive within 50 ms, and joins from
 *      inside its wait, see zs__coll_wait);
 *   2. where the counts differ, the lowest rank with the most broadcasts
 *      the descriptions of its collectives the others lack (they are in
 *      flight there: nobody can complete them), and each rank checks that
 *      the ones it did issue are the same calls of the same sizes;
 *   3. each rank issues the collectives it lacks with zeroed scratch
 *      buffers (purpose "discard catch-up"), so every collective in flight
 *      has its partners and completes; their results are garbage, dropped
 *      by the discard. Only collectives of a micro-batch may be matched
 *      so: gathers, gradient reductions, checks, agreements, tensor reads.
 * Afterwards every lane count and the sequence hash are equal everywhere.
 * *matched (may be NULL): 1 when step 3 issued or completed anything here.
 * Errors: TIMEOUT (a rank never joined within collective_timeout_s; the
 * others are told), REMOTE (another rank failed), MISMATCH when the
 * collectives already paired differ in call or size, or one to be matched
 * would change parameters (an initialization, zs_tensor_set, a step's
 * update): the communicator is then unusable, as after a timeout. */
zs_status zs__comm_reconcile(zs__comm* c, int* matched);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_WAIT_H_ */
