/* mlp.c — the smallest useful ZeroShard trainer: a two-layer MLP (8 -> 32
 * tanh -> 4) regressing a fixed random teacher on synthetic data, sharded
 * at ZeRO stage 3 (or --stage S) over the MPI ranks it is started on.
 *
 *   mpirun -np 2 ./mlp [--steps N] [--stage S] [--seed K]
 *
 * Each step takes a global batch of 48 samples; rank r of W trains on its
 * 48/W of them and ZeroShard averages the gradients over ranks, so the
 * loss curve is that of one process on the whole batch, up to rounding
 * (the sums are ordered differently; docs/install.md gives the bound the
 * tests check). Rank 0 prints "step S loss L" for every step.
 * Builds from an installed ZeroShard: Makefile (pkg-config) or
 * CMakeLists.txt (find_package); docs/install.md. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zeroshard.h>

enum { D = 8, H = 32, O = 4, BATCH = 48, SAMPLES = 480 };

#define CHECK(call)                                                        \
  do {                                                                     \
    zs_status st_ = (call);                                                \
    if (st_ != ZS_OK) {                                                    \
      fprintf(stderr, "mlp: %s: %s\n", #call, zs_last_error());            \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static unsigned long long rng = 42;
static float uniform(void) { /* [-1, 1), the same on every rank */
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((rng >> 40) / 8388608.0 - 1.0);
}

static zs_status init_tensor(void* user, int tensor, const zs_tensor_desc* d,
                             void* data) {
  (void)user, (void)tensor;
  float* w = (float*)data; /* weights ~ U(-1, 1)/sqrt(fan in); biases 0 */
  const float scale = d->ndim == 2 ? 1.0f / sqrtf((float)d->shape[1]) : 0.0f;
  for (size_t i = 0; i < d->numel; i++) w[i] = scale * uniform();
  return ZS_OK;
}

int main(int argc, char** argv) {
  int steps = 40, stage = 3;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    else if (i + 1 < argc && strcmp(argv[i], "--stage") == 0) stage = atoi(argv[i + 1]);
    else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) rng = strtoull(argv[i + 1], NULL, 10);
    else {
      fprintf(stderr, "usage: mlp [--steps N] [--stage S] [--seed K]\n");
      return 2;
    }
  }
  /* the data: x ~ U(-1, 1), y = teacher(x) */
  static float x[SAMPLES][D], y[SAMPLES][O], teacher[O][D];
  for (int o = 0; o < O; o++)
    for (int k = 0; k < D; k++) teacher[o][k] = uniform();
  for (int s = 0; s < SAMPLES; s++) {
    for (int k = 0; k < D; k++) x[s][k] = uniform();
    for (int o = 0; o < O; o++) {
      float t = 0;
      for (int k = 0; k < D; k++) t += teacher[o][k] * x[s][k];
      y[s][o] = sinf(t);
    }
  }

  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = stage;
  cfg.optimizer.lr = 1e-2;
  zs_context* ctx;
  CHECK(zs_context_create(&cfg, &ctx)); /* MPI_COMM_WORLD; inits MPI */
  const int rank = zs_context_rank(ctx), world = zs_context_world_size(ctx);
  if (BATCH % world != 0) {
    fprintf(stderr, "mlp: %d ranks do not divide the batch of %d\n", world, BATCH);
    zs_context_destroy(ctx);
    return 1;
  }
  zs_model* m;
  CHECK(zs_model_create(ctx, &m));
  int l1, l2, w1, b1, w2, b2;
  const int64_t s_w1[2] = {H, D}, s_b1[1] = {H}, s_w2[2] = {O, H}, s_b2[1] = {O};
  CHECK(zs_model_add_unit(m, "hidden", &l1));
  CHECK(zs_model_add_tensor(m, l1, "hidden.w", 2, s_w1, ZS_FLOAT32, 0, &w1));
  CHECK(zs_model_add_tensor(m, l1, "hidden.b", 1, s_b1, ZS_FLOAT32, 0, &b1));
  CHECK(zs_model_add_unit(m, "out", &l2));
  CHECK(zs_model_add_tensor(m, l2, "out.w", 2, s_w2, ZS_FLOAT32, 0, &w2));
  CHECK(zs_model_add_tensor(m, l2, "out.b", 1, s_b2, ZS_FLOAT32, 0, &b2));
  CHECK(zs_model_finalize(m));
  CHECK(zs_model_init(m, init_tensor, NULL));

  const int local = BATCH / world;
  for (int step = 0; step < steps; step++) {
    const int first = (step * BATCH + rank * local) % SAMPLES;
    float *W1, *B1, *W2, *B2, *dW1, *dB1, *dW2, *dB2;
    CHECK(zs_unit_gather(m, l1)); /* stage 3: all-gather the shards */
    CHECK(zs_unit_gather(m, l2));
    CHECK(zs_tensor_data(m, w1, (void**)&W1));
    CHECK(zs_tensor_data(m, b1, (void**)&B1));
    CHECK(zs_tensor_data(m, w2, (void**)&W2));
    CHECK(zs_tensor_data(m, b2, (void**)&B2));
    CHECK(zs_unit_grad_acquire(m, l2));
    CHECK(zs_unit_grad_acquire(m, l1));
    CHECK(zs_tensor_grad(m, w1, (void**)&dW1));
    CHECK(zs_tensor_grad(m, b1, (void**)&dB1));
    CHECK(zs_tensor_grad(m, w2, (void**)&dW2));
    CHECK(zs_tensor_grad(m, b2, (void**)&dB2));
    double loss = 0; /* this rank's mean of 0.5 |out - y|^2 */
    for (int n = 0; n < local; n++) {
      const float* xs = x[(first + n) % SAMPLES];
      const float* ys = y[(first + n) % SAMPLES];
      float h[H], d_out[O], d_h[H];
      for (int j = 0; j < H; j++) {
        float z = B1[j];
        for (int k = 0; k < D; k++) z += W1[j * D + k] * xs[k];
        h[j] = tanhf(z);
      }
      for (int o = 0; o < O; o++) {
        float out = B2[o];
        for (int j = 0; j < H; j++) out += W2[o * H + j] * h[j];
        d_out[o] = (out - ys[o]) / (float)local;
        loss += 0.5 * (out - ys[o]) * (out - ys[o]) / local;
      }
      for (int j = 0; j < H; j++) { /* backward: dW += ... */
        float g = 0;
        for (int o = 0; o < O; o++) {
          dW2[o * H + j] += d_out[o] * h[j];
          g += W2[o * H + j] * d_out[o];
        }
        d_h[j] = g * (1.0f - h[j] * h[j]);
        dB1[j] += d_h[j];
        for (int k = 0; k < D; k++) dW1[j * D + k] += d_h[j] * xs[k];
      }
      for (int o = 0; o < O; o++) dB2[o] += d_out[o];
    }
    CHECK(zs_unit_grad_release(m, l2)); /* reduce-scatter, averaged */
    CHECK(zs_unit_grad_release(m, l1));
    CHECK(zs_unit_release(m, l2));
    CHECK(zs_unit_release(m, l1));
    CHECK(zs_step(m, NULL)); /* AdamW on this rank's shard */
    double global = 0;
    MPI_Allreduce(&loss, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("step %d loss %.9g\n", step, global / world);
  }
  zs_model_destroy(m);
  zs_context_destroy(ctx); /* the last context finalizes MPI */
  return 0;
}
