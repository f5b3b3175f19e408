/*
 * core_compat.h — output structs in the layout of the caller's release. A
 * context knows the header its caller built against (its config's
 * version): 0.1's output structs had no struct_size, and are written in
 * their 0.1 layout; from 0.2 on, struct_size (0: the size in the caller's
 * release) says how many bytes of this library's struct the caller has,
 * and only those are written (zeroshard.h, "Versions and compatibility").
 */
#ifndef ZS_RUNTIME_CORE_COMPAT_H_
#define ZS_RUNTIME_CORE_COMPAT_H_

#include "runtime/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zs__out_kind {
  ZS__OUT_MEMORY_STATS = 0,
  ZS__OUT_COMM_COUNTERS = 1,
  ZS__OUT_OFFLOAD_INFO = 2,
  ZS__OUT_COMM_RECORD = 3,
  ZS__OUT_STEP_INFO = 4,
  ZS__OUT_MEMORY_ESTIMATE = 5,
  ZS__OUT_COMM_ESTIMATE = 6,
  ZS__OUT_KINDS = 7
} zs__out_kind;

/* The bytes the caller's struct of `kind` has (its struct_size, read only
 * from a release that has one; 0 there: the size in that release).
 * Errors: INVALID_ARGUMENT naming `what` and the sizes it may be. Call it
 * before doing anything, so that a bad struct_size changes nothing. */
zs_status zs__out_size(zs__out_kind kind, unsigned int version,
                       const void* out, const char* what, size_t* size);

/* Writes `full` (this library's layout of `kind`) into the caller's `out`
 * of `size` bytes (from zs__out_size) in the layout of release `version`.
 * Fields past size are not written; struct_size becomes size. */
void zs__out_write(zs__out_kind kind, unsigned int version, const void* full,
                   void* out, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CORE_COMPAT_H_ */
