/*
 * core_mem.h — per-rank memory accounting (core_mem.c): byte counters per
 * category and phase, and a registry of live allocations keyed by pointer.
 */
#ifndef ZS_RUNTIME_CORE_MEM_H_
#define ZS_RUNTIME_CORE_MEM_H_

#include <stddef.h>
#include <stdint.h>

#include <zeroshard.h>

struct zs__profiler;

#ifdef __cplusplus
extern "C" {
#endif

/* Byte counters per category plus a registry of live allocations, keyed by
 * pointer, so that frees need no size and leaks are reported by name. */
typedef struct zs__accounting zs__accounting;

/* Who made an entry: the runtime's allocations and the user's registrations
 * live in separate registries (sharing the counters), so a user can neither
 * unregister runtime memory nor block a runtime allocation with a stale
 * registration. */
typedef enum zs__owner { ZS__OWNER_RUNTIME = 0, ZS__OWNER_USER = 1 } zs__owner;

zs_status zs__accounting_create(zs__accounting** out);
/* Logs a warning per live entry (a leak) and frees the tables. */
void zs__accounting_destroy(zs__accounting* acct);
/* Records `bytes` under category for key `ptr` (not dereferenced). label is
 * a static or long-lived string used in leak reports (may be NULL).
 * Errors: INVALID_ARGUMENT (duplicate key), OUT_OF_MEMORY. */
zs_status zs__accounting_add(zs__accounting* acct, zs__owner owner,
                             zs_mem_category category, const void* ptr,
                             size_t bytes, const char* label);
/* Removes the entry of ptr; *category and *bytes (may be NULL) receive it.
 * Errors: INVALID_ARGUMENT if ptr is not recorded. */
zs_status zs__accounting_remove(zs__accounting* acct, zs__owner owner,
                                const void* ptr, zs_mem_category* category,
                                size_t* bytes);
void zs__accounting_stats(const zs__accounting* acct, zs_memory_stats* out);
/* "held now: params 123, grads 456, ... total 579 bytes": what is held at
 * this moment by category (non-zero ones), for error messages (out of
 * memory, a failed or timed-out collective). Writes at most cap bytes. */
void zs__accounting_report(const zs__accounting* acct, char* buf, size_t cap);
/* The step's phase changes (peaks per phase start from what is allocated
 * then); step_done closes the step's phases (zs_step's end) and starts the
 * next step's forward. */
void zs__accounting_phase(zs__accounting* acct, zs_phase phase);
void zs__accounting_step_done(zs__accounting* acct);
/* What a context holds for its communication log (comm.h: ZS__COMM_LOG_CAP
 * entries of 40 bytes; comm.c checks the two agree), in bytes, counted
 * under ZS_MEM_OTHER: the estimator's figure for it. */
#define ZS__COMM_LOG_BYTES ((size_t)8192 * 40)
/* The shared-memory segments of host collectives (comm_shm.h), one per
 * lane of the MPI backend (its collectives, and its exchanges, pair up
 * independently): per rank a control page and a slot of two halves; each
 * rank accounts its own parts (ZS__SHM_LANES x ZS__SHM_RANK_BYTES, under
 * comm_segment): the estimator's figure too. */
#define ZS__SHM_LANES 2
#define ZS__SHM_HALF_BYTES ((size_t)1 << 20)
#define ZS__SHM_CTRL_BYTES ((size_t)4096)
#define ZS__SHM_RANK_BYTES (ZS__SHM_CTRL_BYTES + 2 * ZS__SHM_HALF_BYTES)
/* The process's resident set in bytes (/proc/self/statm), 0 if unknown. */
size_t zs__resident_bytes(void);
/* The label of reduce-scatter bucket temporaries: the accounting counts
 * them apart inside comm_buffers. */
#define ZS__LABEL_BUCKET "reduce-scatter bucket"
/* Every allocation and free of the accounting becomes a counter sample
 * (NULL: none). */
void zs__accounting_set_profiler(zs__accounting* acct,
                                 struct zs__profiler* p);
/* The peaks start again from what is allocated now (zs_memory_reset_peak). */
void zs__accounting_reset_peak(zs__accounting* acct);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CORE_MEM_H_ */
