/*
 * heartbeat_victim.c — a stage-3 training loop in which one rank (the
 * victim) misbehaves at step 2, for tests/runtime/heartbeat_test.sh:
 *   heartbeat_victim MODE VICTIM HEARTBEAT_S
 *   MODE stop:    the victim stops itself (SIGSTOP) before its gathers,
 *                 1.5 s after its last call returned
 *        kill:    the victim kills itself (SIGKILL)
 *        compute: the victim computes (sleeps, outside every ZeroShard
 *                 call) for 6 x HEARTBEAT_S, then goes on
 *        leave:   the victim destroys its model and context (a rank that
 *                 ends early), then sleeps 30 s
 *        kill_early: the victim kills itself right after its context is
 *                 made, the others wait 1 s before their first
 *                 collective (S counts from then)
 * Every rank prints one line: "rank R: OK" after 5 steps, or
 * "rank R: FAILED after S s: STATUS: MESSAGE" when a call failed, S being
 * the seconds since it entered step 2; a failed rank then ends the job as
 * docs/running.md says (MPI_Abort, after 3 s so that the others print
 * too). The victim prints "rank R: pid P" first.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zeroshard.h>
#include <zs_mpi.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int rank;
static double t_step2;

static void check(zs_status st, const char* what) {
  if (st == ZS_OK) return;
  printf("rank %d: FAILED after %.1f s: %s: %s: %s\n", rank,
         t_step2 > 0 ? now_s() - t_step2 : -1.0, what, zs_status_string(st),
         zs_last_error());
  fflush(stdout);
  sleep(3);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s stop|kill|compute VICTIM HEARTBEAT_S\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  const int victim = atoi(argv[2]);
  const double hb = atof(argv[3]);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.heartbeat_timeout_s = hb;
  c.collective_timeout_s = 600; /* what the heartbeat must beat */
  /* shard groups (hybrid sharding) of this many ranks, when set */
  const char* g = getenv("ZS_TEST_SHARD_GROUP");
  if (g != NULL) c.shard_group_size = atoi(g);
  zs_context* ctx = NULL;
  zs_model* m = NULL;
  check(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), "context");
  if (strcmp(mode, "kill_early") == 0) {
    /* before any collective of the others: they notice it only when they
     * wait for it (their first gathers) */
    t_step2 = now_s();
    if (rank == victim) {
      printf("rank %d: pid %d\n", rank, (int)getpid());
      fflush(stdout);
      raise(SIGKILL);
    }
    sleep(1);
  }
  check(zs_model_create(ctx, &m), "model");
  int units[2], t = -1;
  const int64_t shape[1] = {4096};
  for (int u = 0; u < 2; u++) {
    char name[16];
    snprintf(name, sizeof name, "u%d", u);
    check(zs_model_add_unit(m, name, &units[u]), "unit");
    snprintf(name, sizeof name, "u%d.w", u);
    check(zs_model_add_tensor(m, units[u], name, 1, shape, ZS_FLOAT32, 0, &t),
          "tensor");
    check(zs_unit_set_grad_uses(m, units[u], 1), "uses");
  }
  check(zs_model_finalize(m), "finalize");
  for (int step = 0; step < 5; step++) {
    if (step == 2) {
      t_step2 = now_s();
      if (rank == victim) {
        printf("rank %d: pid %d\n", rank, (int)getpid());
        fflush(stdout);
        /* (after a heartbeat that says what it does: one per second) */
        if (strcmp(mode, "stop") == 0) {
          usleep(1500000);
          raise(SIGSTOP);
        }
        if (strcmp(mode, "kill") == 0) raise(SIGKILL);
        if (strcmp(mode, "compute") == 0) usleep((useconds_t)(6 * hb * 1e6));
        if (strcmp(mode, "leave") == 0) {
          zs_model_destroy(m);
          zs_context_destroy(ctx);
          sleep(30);
          MPI_Finalize();
          return 0;
        }
      }
    }
    for (int u = 0; u < 2; u++) {
      check(zs_unit_gather(m, units[u]), "gather");
      check(zs_unit_release(m, units[u]), "release");
    }
    for (int u = 1; u >= 0; u--) {
      check(zs_unit_gather(m, units[u]), "gather");
      check(zs_unit_grad_acquire(m, units[u]), "grad_acquire");
      float* g = NULL;
      check(zs_tensor_grad(m, u, (void**)&g), "tensor_grad");
      for (int i = 0; i < 4096; i++) g[i] += 1e-3f * (float)(rank + 1);
      check(zs_unit_grad_release(m, units[u]), "grad_release");
      check(zs_unit_release(m, units[u]), "release");
    }
    zs_step_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    check(zs_step(m, &info), "step");
  }
  printf("rank %d: OK\n", rank);
  fflush(stdout);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  MPI_Finalize();
  return 0;
}
