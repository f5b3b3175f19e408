/*
 * nocuda_probe.c — a host-only program against the installed library,
 * run by install_test.sh where no CUDA library is reachable (a mount
 * namespace): it trains a small model at the ranks it is started on,
 * checks that no CUDA or NCCL library is mapped into it, then asks for
 * ZS_DEVICE_CUDA and prints the error it gets (exit 0 if the refusal is
 * UNSUPPORTED, 1 otherwise).
 *
 *   mpirun -np 2 ./nocuda_probe [--cuda-linked]
 * (--cuda-linked: the program links the CUDA plugin's archive, so the
 * CUDA runtime is mapped; the map is not checked.)
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <zeroshard.h>
#include <zs_mpi.h>

static int mapped_cuda(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strstr(line, "libcuda") != NULL || strstr(line, "libnccl") != NULL) {
      fprintf(stderr, "nocuda_probe: mapped: %s", line);
      found = 1;
    }
  if (f) fclose(f);
  return found;
}

static zs_status ones(void* user, int tensor, const zs_tensor_desc* d,
                      void* data) {
  (void)user, (void)tensor;
  for (size_t i = 0; i < d->numel; i++) ((float*)data)[i] = 1.0f;
  return ZS_OK;
}

#define CHECK(x)                                                      \
  do {                                                                \
    if ((x) != ZS_OK) {                                               \
      fprintf(stderr, "nocuda_probe: %s: %s\n", #x, zs_last_error()); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  zs_context* ctx;
  CHECK(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx));
  zs_model* m;
  int u, t;
  const int64_t shape[1] = {1000};
  CHECK(zs_model_create(ctx, &m));
  CHECK(zs_model_add_unit(m, "u", &u));
  CHECK(zs_model_add_tensor(m, u, "w", 1, shape, ZS_FLOAT32, 0, &t));
  CHECK(zs_model_finalize(m));
  CHECK(zs_model_init(m, ones, NULL));
  for (int step = 0; step < 3; step++) {
    float *w, *g;
    CHECK(zs_unit_gather(m, u));
    CHECK(zs_unit_grad_acquire(m, u));
    CHECK(zs_tensor_data(m, t, (void**)&w));
    CHECK(zs_tensor_grad(m, t, (void**)&g));
    for (int i = 0; i < 1000; i++) g[i] += w[i] * (float)(rank + 1);
    CHECK(zs_unit_grad_release(m, u));
    CHECK(zs_unit_release(m, u));
    CHECK(zs_step(m, NULL));
  }
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  const int cuda_linked = argc > 1 && strcmp(argv[1], "--cuda-linked") == 0;
  if (!cuda_linked && mapped_cuda()) return 1;

  cfg.device = ZS_DEVICE_CUDA;
  const zs_status st = zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx);
  if (rank == 0)
    printf("nocuda_probe: trained 3 steps on the host; ZS_DEVICE_CUDA: %s: "
           "%s\n", zs_status_string(st), st == ZS_OK ? "" : zs_last_error());
  if (st == ZS_OK) zs_context_destroy(ctx);
  MPI_Finalize();
  return st == ZS_ERR_UNSUPPORTED ? 0 : 1;
}
