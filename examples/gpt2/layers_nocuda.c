/*
 * layers_nocuda.c: layers_cuda.h where the build had no CUDA toolkit
 * (third_party/cuda_configure.bzl), so the trainer still builds and runs on
 * the CPU: asking for the GPU (--device cuda) fails at start-up with a
 * message saying why; nothing else of the header may be called then.
 */
#include <stdio.h>

#include "examples/gpt2/layers_cuda.h"

static int not_built(char* err, size_t cap) {
  if (cap > 0)
    snprintf(err, cap, "--device cuda: this trainer was built without the "
             "CUDA toolkit (none was found at build time: docs/building.md, "
             "\"Without the CUDA toolkit\"); rebuild where it is installed");
  return -1;
}

int gpt2_cuda_available(char* err, size_t cap) { return not_built(err, cap); }

int gpt2_cuda_init(char* err, size_t cap) { return not_built(err, cap); }

void gpt2_cuda_shutdown(void) {}

int gpt2_cuda_set_tf32(int on, char* err, size_t cap) {
  (void)on;
  return not_built(err, cap);
}

void gpt2_cuda_kernel_times_enable(int on) { (void)on; }

void gpt2_cuda_kernel_times_reset(void) {}

int gpt2_cuda_kernel_times(gpt2_kernel_time* rows, int cap) {
  (void)rows;
  (void)cap;
  return 0;
}

int gpt2_cuda_to_fp32(float* dst, const void* src, int src_dtype, size_t n) {
  (void)dst;
  (void)src;
  (void)src_dtype;
  (void)n;
  return -1;
}

/* Never used: gpt2_cuda_available fails first. Its name says why. */
const gpt2_layer_ops gpt2_cuda_ops = {.name = "cuda (not built: no CUDA toolkit)"};
