/*
 * layers_cuda.h: the GPT-2 layers on a CUDA GPU (layers_cuda.cu), as a
 * gpt2_layer_ops table (model.h) the model code runs on unchanged.
 *
 * What runs where: matmul and attention are cuBLAS SGEMMs
 * (cublasSgemmStridedBatched) composed as in layers_blas.c; every other
 * layer is a small kernel whose per-row or per-element math is
 * layers_math.h, the code layers.c runs on the CPU, compiled with
 * -fmad=false (no contraction). cuBLAS runs in CUBLAS_DEFAULT_MATH mode:
 * fp32 GEMMs in fp32, no TF32, so a GPU run matches the CPU run to fp32
 * rounding (the summation order of the GEMMs differs; tests/gpu checks a
 * loss per step within 1e-4 relative over 20 steps).
 *
 * Pointers given to the table's entries are device memory (its alloc);
 * tokens and targets too (upload them). All work is queued in order on the
 * legacy default stream (stream 0). ZeroShard's CUDA backend runs its own
 * operations on blocking streams, which are ordered with the legacy stream
 * both ways, and its NCCL stream waits for the legacy stream's work, so
 * the layers and the engine's gathers, reductions and optimizer steps are
 * ordered without extra events (docs/cuda.md, "Streams and ordering").
 *
 * cuBLAS is loaded at run time (dlopen of libcublas.so.13, or
 * libcublas.so), so programs built with this file start, and run on the
 * CPU, on machines without it. Where the build had no CUDA toolkit,
 * layers_nocuda.c implements this header instead: gpt2_cuda_available
 * and gpt2_cuda_init fail saying so, and nothing else may be called.
 */
#ifndef ZS_EXAMPLES_GPT2_LAYERS_CUDA_H
#define ZS_EXAMPLES_GPT2_LAYERS_CUDA_H

#include <stddef.h>

#include "examples/gpt2/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 0 if a CUDA device is usable here; else -1 with the reason in err (cap
 * bytes), for a clean start-up error before anything is created. */
int gpt2_cuda_available(char* err, size_t cap);

/* Sets up the current CUDA device for gpt2_cuda_ops: loads cuBLAS and
 * creates its handle (stream 0, default math). Call after the device is
 * chosen (zs_context_create with ZS_DEVICE_CUDA selects it) and before
 * any entry of gpt2_cuda_ops. Returns 0, or -1 with a message naming what
 * failed (no usable device, cuBLAS missing, handle creation) in err (cap
 * bytes). Idempotent; not thread-safe. */
int gpt2_cuda_init(char* err, size_t cap);

/* Destroys the cuBLAS handle and unloads cuBLAS; gpt2_cuda_ops must not be
 * used afterwards (until gpt2_cuda_init). NULL-safe to call twice. */
void gpt2_cuda_shutdown(void);

/* on != 0: cuBLAS may run the fp32 GEMMs on TF32 tensor cores
 * (CUBLAS_TF32_TENSOR_OP_MATH: inputs rounded to a 10-bit mantissa, fp32
 * accumulation; PyTorch's allow_tf32); 0: plain fp32 (the default, and
 * what the CPU parity test needs: TF32 results differ from the CPU's by
 * about 1e-3 relative, not fp32 rounding). NVIDIA_TF32_OVERRIDE=0 in the
 * environment keeps fp32 whatever this says. After gpt2_cuda_init.
 * Returns 0, or -1 with a message in err (cap bytes). */
int gpt2_cuda_set_tf32(int on, char* err, size_t cap);

/* GPU time of one kernel (or cuBLAS call) kind, summed over its calls. */
typedef struct gpt2_kernel_time {
  const char* name;  /* e.g. "gemm (matmul)", "layernorm forward" (static) */
  long calls;        /* launches timed */
  double seconds;    /* sum of their GPU times (CUDA events), seconds */
} gpt2_kernel_time;

/* Starts (on != 0) or pauses (0) timing every kernel launch and cuBLAS
 * call of gpt2_cuda_ops: a pair of CUDA events on stream 0 around each,
 * added to per-kind totals (which a pause keeps). Costs two event records
 * per launch and, every 4096 launches, a wait for the device (the events
 * are read back); the tokens/s of a timed run are therefore not the
 * benchmark's. Not thread-safe; off until enabled. */
void gpt2_cuda_kernel_times_enable(int on);

/* Sets the totals to zero (waits for the device to finish the timed
 * launches queued). */
void gpt2_cuda_kernel_times_reset(void);

/* Waits for the timed launches to finish, then writes the totals since the
 * last reset, one row per kind with calls > 0 (at most cap rows, in a fixed
 * order), into rows. Returns the number of such kinds (may exceed cap). */
int gpt2_cuda_kernel_times(gpt2_kernel_time* rows, int cap);

/* dst[i] = src[i] as fp32 for n elements (device memory both; src's
 * dtype is a zs_dtype: ZS_FLOAT32, ZS_BFLOAT16 or ZS_FLOAT16), queued on
 * stream 0 (ZeroShard's kernel: round-trip exact). Returns 0, or -1 if
 * the launch failed. */
int gpt2_cuda_to_fp32(float* dst, const void* src, int src_dtype, size_t n);

/* The layers on the GPU. `error` reports the first failed launch, CUDA
 * call or cuBLAS call since gpt2_cuda_init, naming the layer. */
extern const gpt2_layer_ops gpt2_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif /* ZS_EXAMPLES_GPT2_LAYERS_CUDA_H */
