/*
 * ckpt_faults.c — fault injection for the crash-safety tests, linked only
 * into test binaries (//tests/examples:train_sharded_faults): with
 * ZS_CKPT_CRASH_AFTER=N[:RANK] set, the N-th durable step of a save (a
 * file finished, a rename; counted per process, from 1) on RANK (default:
 * any) kills the process with SIGKILL, as a crash would. Installed at
 * load through the library's internal hook (runtime/ckpt/ckpt_format.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/ckpt/ckpt_format.h"

static void crash_after(int rank, const char* what) {
  static int count = 0;
  const char* env = getenv("ZS_CKPT_CRASH_AFTER");
  if (env == NULL || env[0] == '\0') return;
  int n = 0, want_rank = -1;
  if (sscanf(env, "%d:%d", &n, &want_rank) < 1) return;
  if (want_rank >= 0 && want_rank != rank) return;
  if (++count == n) {
    fprintf(stderr, "[zs rank %d] ZS_CKPT_CRASH_AFTER=%s: killing this "
            "process after '%s' (a simulated crash in the middle of a save)\n",
            rank, env, what);
    fflush(stderr);
    raise(SIGKILL);
  }
}

__attribute__((constructor)) static void install(void) {
  zs__ckpt_fault_hook = crash_after;
}
