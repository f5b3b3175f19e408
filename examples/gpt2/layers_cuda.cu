// layers_cuda.cu: the GPT-2 layers on a CUDA GPU (layers_cuda.h). Every
// kernel's arithmetic is a layers_math.h function or a loop that mirrors
// layers.c's; matmul and attention are layers_blas.c's composition run with
// cuBLAS. Kernels that sum run one thread per output element and sum
// sequentially in layers.c's order (no atomics): deterministic, and the
// same bits as the CPU. One exception: the attention softmax (forward and
// backward), whose rows run one warp each with a fixed shuffle tree for
// their sums, since one thread per row was a quarter of a GPT-2 step
// (docs/performance.md): deterministic, and within fp32 rounding of the
// CPU (the attention tests' tolerance).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include "examples/gpt2/layers_blas.h"
#include "examples/gpt2/layers_cuda.h"
#include "examples/gpt2/layers_math.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

// cuBLAS, loaded at run time.
struct Cublas {
  void* lib = nullptr;
  cublasHandle_t handle = nullptr;
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*sgemm_strided_batched)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
      const float*, const float*, int, long long, const float*, int,
      long long, const float*, float*, int, long long, int) = nullptr;
  double* sum = nullptr;  // device scratch of gpt2_cuda_ops.sum
  float* scratch = nullptr;  // device scratch of the gradient chunk sums
  size_t scratch_n = 0;      // its capacity, floats
};
Cublas g_blas;
char g_error[512] = "";

void Fail(const char* fmt, ...) {
  if (g_error[0] != '\0') return;  // the first failure is the cause
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
}

void CheckLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    Fail("gpt2 CUDA layers: %s: %s", what, cudaGetErrorString(e));
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    Fail("gpt2 CUDA layers: %s: %s", what, cudaGetErrorString(e));
}

// The layers' own device scratch, at least n floats (grown on demand: the
// first call of a shape allocates, later ones reuse), or nullptr after
// recording the error.
float* Scratch(size_t n) {
  if (n <= g_blas.scratch_n) return g_blas.scratch;
  // Kernels queued on stream 0 may still read the old buffer: wait for
  // them before freeing it (only when the buffer grows).
  if (g_blas.scratch != nullptr) {
    CheckCuda(cudaStreamSynchronize(0), "cudaStreamSynchronize (scratch)");
    cudaFree(g_blas.scratch);
  }
  g_blas.scratch = nullptr;
  g_blas.scratch_n = 0;
  if (cudaMalloc((void**)&g_blas.scratch, n * sizeof(float)) != cudaSuccess) {
    cudaGetLastError();
    g_blas.scratch = nullptr;
    Fail("gpt2 CUDA layers: out of GPU memory for %zu bytes of scratch "
         "(gradient chunk sums)", n * sizeof(float));
    return nullptr;
  }
  g_blas.scratch_n = n;
  return g_blas.scratch;
}

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return b > (size_t)kMaxBlocks ? kMaxBlocks : (int)b;
}

// One thread per item, every block needed (kernels without a grid loop).
int BlocksAll(size_t n) { return (int)((n + kThreads - 1) / kThreads); }

// Chunks of GPT2_SUM_CHUNK_ROWS rows in N rows (the gradient sums).
int SumChunks(int N) {
  return (N + GPT2_SUM_CHUNK_ROWS - 1) / GPT2_SUM_CHUNK_ROWS;
}

// One thread per row or column (kernels that sum sequentially): blocks of
// one warp, so that a few thousand threads spread over every
// multiprocessor instead of filling a dozen.
constexpr int kRowThreads = 32;
int RowBlocks(size_t n) { return (int)((n + kRowThreads - 1) / kRowThreads); }

// One warp per row (the attention softmax).
constexpr int kWarpThreads = 256;
int WarpBlocks(size_t rows) {
  return (int)((rows * 32 + kWarpThreads - 1) / kWarpThreads);
}

// Column sums read this many rows' elements before adding them, in order:
// the loads are in flight together, the sum's order is unchanged.
constexpr int kUnroll = 8;

#define GPT2_GRID_LOOP(i, n)                                              \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

__device__ size_t ThreadIndex() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

// ---- Per-kernel GPU time (gpt2_cuda_kernel_times) -------------------------
// A pair of CUDA events around every kernel launch and cuBLAS call while
// enabled; the pairs are read back (after waiting for the last) every
// kPendingMax launches and when the totals are asked for.

enum KernelId {
  kEncoderForward, kEncoderBackwardWte, kEncoderBackwardWpe,
  kLayernormForward, kLayernormBackwardInput, kLayernormBackwardParams,
  kGemm, kGemmBatched, kBiasForward, kBiasBackward, kAttentionSoftmax,
  kAttentionSoftmaxBackward, kGeluForward, kGeluBackward, kResidualForward,
  kSoftmaxCeForward, kSoftmaxCeBackward, kFill, kLossSum, kKernelCount
};
const char* const kKernelNames[kKernelCount] = {
    "encoder forward", "encoder backward (wte)", "encoder backward (wpe)",
    "layernorm forward", "layernorm backward (input)",
    "layernorm backward (weight, bias)", "gemm (matmul)",
    "gemm (attention, batched)", "bias forward", "bias backward",
    "attention softmax", "attention softmax backward", "gelu forward",
    "gelu backward", "residual forward", "softmax cross-entropy forward",
    "softmax cross-entropy backward", "fill", "loss sum"};

struct Timed {
  int kernel;
  cudaEvent_t start, stop;
};
struct KernelTimes {
  bool on = false;
  std::vector<Timed> pending;
  std::vector<cudaEvent_t> spare;
  long calls[kKernelCount] = {};
  double seconds[kKernelCount] = {};
};
KernelTimes g_times;
bool g_in_attention = false;  // gemm calls come from attention
constexpr size_t kPendingMax = 4096;

cudaEvent_t TakeEvent() {
  cudaEvent_t e = nullptr;
  if (!g_times.spare.empty()) {
    e = g_times.spare.back();
    g_times.spare.pop_back();
  } else if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}

// Adds every pending pair's elapsed time to the totals (waits for the
// device to reach the last one).
void DrainTimes() {
  if (g_times.pending.empty()) return;
  cudaEventSynchronize(g_times.pending.back().stop);
  for (const Timed& t : g_times.pending) {
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, t.start, t.stop) == cudaSuccess) {
      g_times.calls[t.kernel]++;
      g_times.seconds[t.kernel] += ms * 1e-3;
    } else {
      cudaGetLastError();
    }
    g_times.spare.push_back(t.start);
    g_times.spare.push_back(t.stop);
  }
  g_times.pending.clear();
}

// Times the launches of its scope on stream 0 as `kernel`, when enabled.
class Timer {
 public:
  explicit Timer(int kernel) : t_{kernel, nullptr, nullptr} {
    if (!g_times.on) return;
    t_.start = TakeEvent();
    t_.stop = TakeEvent();
    if (t_.start != nullptr && t_.stop != nullptr)
      cudaEventRecord(t_.start, 0);
  }
  ~Timer() {
    if (t_.start == nullptr || t_.stop == nullptr) {
      if (t_.start != nullptr) g_times.spare.push_back(t_.start);
      if (t_.stop != nullptr) g_times.spare.push_back(t_.stop);
      return;
    }
    cudaEventRecord(t_.stop, 0);
    g_times.pending.push_back(t_);
    if (g_times.pending.size() >= kPendingMax) DrainTimes();
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  Timed t_;
};

void FreeTimes() {
  DrainTimes();
  for (cudaEvent_t e : g_times.spare) cudaEventDestroy(e);
  g_times = KernelTimes();
}

// ---- Kernels ---------------------------------------------------------------

__global__ void EncoderForward(float* out, const int* tokens, const float* wte,
                               const float* wpe, int T, int C, size_t n) {
  GPT2_GRID_LOOP(i, n) {
    const size_t row = i / C, c = i % C;
    const int t = (int)(row % T);
    out[i] = wte[(size_t)tokens[row] * C + c] + wpe[(size_t)t * C + c];
  }
}

// dwte: one thread per channel walks the positions in order (a token may
// repeat), as layers.c does per column tile.
__global__ void EncoderBackwardWte(float* dwte, const float* dout,
                                   const int* tokens, int N, int C) {
  const size_t c = ThreadIndex();
  if (c >= (size_t)C) return;
  for (int n = 0; n < N; n++)
    dwte[(size_t)tokens[n] * C + c] += dout[(size_t)n * C + c];
}

__global__ void EncoderBackwardWpe(float* dwpe, const float* dout, int B,
                                   int T, int C) {
  const size_t i = ThreadIndex();
  if (i >= (size_t)T * C) return;
  const size_t t = i / C, c = i % C;
  float s = 0.0f;
  for (int b = 0; b < B; b++) s += dout[((size_t)b * T + t) * C + c];
  dwpe[i] += s;
}

__global__ void LayernormForward(float* out, float* mean, float* rstd,
                                 const float* inp, const float* weight,
                                 const float* bias, int N, int C) {
  const size_t n = ThreadIndex();
  if (n >= (size_t)N) return;
  gpt2_math_layernorm_row(out + n * C, &mean[n], &rstd[n], inp + n * C, weight,
                          bias, C);
}

__global__ void LayernormBackwardInput(float* dinp, const float* dout,
                                       const float* inp, const float* weight,
                                       const float* mean, const float* rstd,
                                       int N, int C) {
  const size_t n = ThreadIndex();
  if (n >= (size_t)N) return;
  gpt2_math_layernorm_backward_row(dinp + n * C, dout + n * C, inp + n * C,
                                   weight, mean[n], rstd[n], C);
}

// LayerNorm's dweight and dbias in layers.c's order, in two kernels: one
// thread per (chunk of GPT2_SUM_CHUNK_ROWS rows, channel) sums its chunk
// into part_w/part_b (chunks x C), then one thread per channel adds the
// chunks' sums in order.
__global__ void LayernormBackwardParamsChunks(float* __restrict__ part_w,
                                              float* __restrict__ part_b,
                                              const float* __restrict__ dout,
                                              const float* __restrict__ inp,
                                              const float* __restrict__ mean,
                                              const float* __restrict__ rstd,
                                              int N, int C, int chunks) {
  const size_t i = ThreadIndex();
  if (i >= (size_t)chunks * C) return;
  const int chunk = (int)(i / C), c = (int)(i % C);
  const int n0 = chunk * GPT2_SUM_CHUNK_ROWS;
  const int n1 = min(N, n0 + GPT2_SUM_CHUNK_ROWS);
  float pw = 0.0f, pb = 0.0f;
  int n = n0;
  for (; n + kUnroll <= n1; n += kUnroll) {
    float dy[kUnroll], xhat[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; j++) {
      dy[j] = dout[(size_t)(n + j) * C + c];
      xhat[j] = (inp[(size_t)(n + j) * C + c] - mean[n + j]) * rstd[n + j];
    }
#pragma unroll
    for (int j = 0; j < kUnroll; j++) {
      pw += dy[j] * xhat[j];
      pb += dy[j];
    }
  }
  for (; n < n1; n++) {
    const float dy = dout[(size_t)n * C + c];
    const float xhat = (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
    pw += dy * xhat;
    pb += dy;
  }
  part_w[i] = pw;
  part_b[i] = pb;
}

// dst[c] += the chunks' sums part[k, c] (chunks x C), in chunk order.
__global__ void AddChunkSums(float* __restrict__ dst,
                             const float* __restrict__ part, int C,
                             int chunks) {
  const size_t c = ThreadIndex();
  if (c >= (size_t)C) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; k++) s += part[(size_t)k * C + c];
  dst[c] += s;
}

__global__ void BiasForward(float* out, const float* bias, int OC, size_t n) {
  GPT2_GRID_LOOP(i, n) out[i] = out[i] + bias[i % OC];
}

// The bias gradient's chunk sums (layers.c's order, as LayerNorm's
// above): part[k, o] = sum of dout[n, o] over chunk k's rows; then
// AddChunkSums adds them to dbias.
__global__ void BiasBackwardChunks(float* __restrict__ part,
                                   const float* __restrict__ dout, int N,
                                   int OC, int chunks) {
  const size_t i = ThreadIndex();
  if (i >= (size_t)chunks * OC) return;
  const int chunk = (int)(i / OC), o = (int)(i % OC);
  const int n0 = chunk * GPT2_SUM_CHUNK_ROWS;
  const int n1 = min(N, n0 + GPT2_SUM_CHUNK_ROWS);
  float s = 0.0f;
  int n = n0;
  for (; n + kUnroll <= n1; n += kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; j++) v[j] = dout[(size_t)(n + j) * OC + o];
#pragma unroll
    for (int j = 0; j < kUnroll; j++) s += v[j];
  }
  for (; n < n1; n++) s += dout[(size_t)n * OC + o];
  part[i] = s;
}

__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// gpt2_math_causal_softmax_row with one warp per row: lane l takes
// elements l, l+32, ...; the max is exact, the sum a fixed shuffle tree
// over the lanes' sequential sums.
__global__ void CausalSoftmax(float* __restrict__ att, float* __restrict__ pre,
                              int rows, int T) {
  const size_t r = ThreadIndex() / 32;
  const int lane = (int)(threadIdx.x % 32);
  if (r >= (size_t)rows) return;  // the whole warp: r is the warp's
  const int t = (int)(r % T);
  float* a = att + r * T;
  float* p = pre + r * T;
  float m = -INFINITY;
  for (int i = lane; i <= t; i += 32)
    if (p[i] > m) m = p[i];
  m = WarpMax(m);
  float sum = 0.0f;
  for (int i = lane; i <= t; i += 32) {
    const float e = expf(p[i] - m);
    a[i] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int i = lane; i <= t; i += 32) a[i] *= inv;
  for (int i = t + 1 + lane; i < T; i += 32) {
    p[i] = 0.0f;
    a[i] = 0.0f;
  }
}

// gpt2_math_causal_softmax_backward_row, one warp per row as above.
__global__ void CausalSoftmaxBackward(float* __restrict__ dpre,
                                      float* __restrict__ datt,
                                      const float* __restrict__ att, int rows,
                                      int T) {
  const size_t r = ThreadIndex() / 32;
  const int lane = (int)(threadIdx.x % 32);
  if (r >= (size_t)rows) return;
  const int t = (int)(r % T);
  const float* a = att + r * T;
  float* da = datt + r * T;
  float* dp = dpre + r * T;
  float ada = 0.0f;
  for (int i = lane; i <= t; i += 32) ada += a[i] * da[i];
  ada = WarpSum(ada);
  for (int i = lane; i <= t; i += 32) dp[i] = a[i] * (da[i] - ada);
  for (int i = t + 1 + lane; i < T; i += 32) {
    da[i] = 0.0f;
    dp[i] = 0.0f;
  }
}

__global__ void GeluForward(float* out, const float* inp, size_t n) {
  GPT2_GRID_LOOP(i, n) out[i] = gpt2_math_gelu(inp[i]);
}

__global__ void GeluBackward(float* dinp, const float* inp, const float* dout,
                             size_t n) {
  GPT2_GRID_LOOP(i, n) dinp[i] += gpt2_math_gelu_grad(inp[i]) * dout[i];
}

__global__ void ResidualForward(float* out, const float* a, const float* b,
                                size_t n) {
  GPT2_GRID_LOOP(i, n) out[i] = a[i] + b[i];
}

__global__ void SoftmaxCeForward(float* probs, float* losses,
                                 const float* logits, const int* targets,
                                 int N, int V) {
  const size_t n = ThreadIndex();
  if (n >= (size_t)N) return;
  losses[n] = gpt2_math_softmax_ce_row(probs + n * V, logits + n * V,
                                       targets[n], V);
}

__global__ void SoftmaxCeBackward(float* dlogits, const float* dlosses,
                                  const float* probs, const int* targets,
                                  int N, int V) {
  const size_t n = ThreadIndex();
  if (n >= (size_t)N) return;
  gpt2_math_softmax_ce_backward_row(dlogits + n * V, probs + n * V, targets[n],
                                    dlosses[n], V);
}

__global__ void Fill(float* p, float value, size_t n) {
  GPT2_GRID_LOOP(i, n) p[i] = value;
}

// One thread: the sequential double sum of gpt2_cpu_ops.sum, same bits.
__global__ void SumSequential(const float* x, size_t n, double* out) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += x[i];
  *out = s;
}

// ---- gpt2_blas on cuBLAS and the kernels above ----------------------------

void Gemm(void*, int ta, int tb, int m, int n, int k, float alpha,
          const float* A, int lda, long long sa, const float* B, int ldb,
          long long sb, float beta, float* C, int ldc, long long sc,
          int batch) {
  Timer timer(g_in_attention ? kGemmBatched : kGemm);
  cublasStatus_t st = g_blas.sgemm_strided_batched(
      g_blas.handle, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, lda, sa, B, ldb, sb,
      &beta, C, ldc, sc, batch);
  if (st != CUBLAS_STATUS_SUCCESS)
    Fail("gpt2 CUDA layers: cublasSgemmStridedBatched(m=%d, n=%d, k=%d, "
         "batch=%d) failed with cuBLAS status %d",
         m, n, k, batch, (int)st);
}

void BlasBiasForward(void*, float* out, const float* bias, int N, int OC) {
  const size_t n = (size_t)N * OC;
  Timer timer(kBiasForward);
  BiasForward<<<Blocks(n), kThreads>>>(out, bias, OC, n);
  CheckLaunch("bias forward");
}

void BlasBiasBackward(void*, float* dbias, const float* dout, int N, int OC) {
  Timer timer(kBiasBackward);
  const int chunks = SumChunks(N);
  float* part = Scratch((size_t)chunks * OC);
  if (part == nullptr) return;
  const size_t parts = (size_t)chunks * OC;
  BiasBackwardChunks<<<BlocksAll(parts), kThreads>>>(part, dout, N, OC,
                                                     chunks);
  AddChunkSums<<<RowBlocks(OC), kRowThreads>>>(dbias, part, OC, chunks);
  CheckLaunch("bias backward");
}

void BlasSoftmax(void*, float* att, float* pre, int rows, int T) {
  Timer timer(kAttentionSoftmax);
  CausalSoftmax<<<WarpBlocks(rows), kWarpThreads>>>(att, pre, rows, T);
  CheckLaunch("attention softmax");
}

void BlasSoftmaxBackward(void*, float* dpre, float* datt, const float* att,
                         int rows, int T) {
  Timer timer(kAttentionSoftmaxBackward);
  CausalSoftmaxBackward<<<WarpBlocks(rows), kWarpThreads>>>(dpre, datt, att,
                                                             rows, T);
  CheckLaunch("attention softmax backward");
}

const gpt2_blas kBlas = {nullptr,          Gemm,        BlasBiasForward,
                         BlasBiasBackward, BlasSoftmax, BlasSoftmaxBackward};

// ---- The gpt2_layer_ops entries --------------------------------------------

void OpEncoderForward(float* out, const int* tokens, const float* wte,
                      const float* wpe, int B, int T, int C) {
  const size_t n = (size_t)B * T * C;
  Timer timer(kEncoderForward);
  EncoderForward<<<Blocks(n), kThreads>>>(out, tokens, wte, wpe, T, C, n);
  CheckLaunch("encoder forward");
}

void OpEncoderBackward(float* dwte, float* dwpe, const float* dout,
                       const int* tokens, int B, int T, int C) {
  {
    Timer timer(kEncoderBackwardWte);
    EncoderBackwardWte<<<RowBlocks(C), kRowThreads>>>(dwte, dout, tokens,
                                                      B * T, C);
  }
  Timer timer(kEncoderBackwardWpe);
  EncoderBackwardWpe<<<BlocksAll((size_t)T * C), kThreads>>>(dwpe, dout, B, T,
                                                             C);
  CheckLaunch("encoder backward");
}

void OpLayernormForward(float* out, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int N, int C) {
  Timer timer(kLayernormForward);
  LayernormForward<<<RowBlocks(N), kRowThreads>>>(out, mean, rstd, inp, weight,
                                               bias, N, C);
  CheckLaunch("layernorm forward");
}

void OpLayernormBackward(float* dinp, float* dweight, float* dbias,
                         const float* dout, const float* inp,
                         const float* weight, const float* mean,
                         const float* rstd, int N, int C) {
  {
    Timer timer(kLayernormBackwardInput);
    LayernormBackwardInput<<<RowBlocks(N), kRowThreads>>>(dinp, dout, inp, weight,
                                                       mean, rstd, N, C);
  }
  Timer timer(kLayernormBackwardParams);
  const int chunks = SumChunks(N);
  float* part = Scratch((size_t)2 * chunks * C);
  if (part == nullptr) return;
  const size_t parts = (size_t)chunks * C;
  LayernormBackwardParamsChunks<<<BlocksAll(parts), kThreads>>>(
      part, part + parts, dout, inp, mean, rstd, N, C, chunks);
  AddChunkSums<<<RowBlocks(C), kRowThreads>>>(dweight, part, C, chunks);
  AddChunkSums<<<RowBlocks(C), kRowThreads>>>(dbias, part + parts, C, chunks);
  CheckLaunch("layernorm backward");
}

void OpMatmulForward(float* out, const float* inp, const float* weight,
                     const float* bias, int N, int C, int OC) {
  gpt2_blas_matmul_forward(&kBlas, out, inp, weight, bias, N, C, OC);
}

void OpMatmulBackward(float* dinp, float* dweight, float* dbias,
                      const float* dout, const float* inp, const float* weight,
                      int N, int C, int OC) {
  gpt2_blas_matmul_backward(&kBlas, dinp, dweight, dbias, dout, inp, weight, N,
                            C, OC);
}

void OpAttentionForward(float* out, float* preatt, float* att, const float* inp,
                        int B, int T, int C, int NH) {
  g_in_attention = true;
  gpt2_blas_attention_forward(&kBlas, out, preatt, att, inp, B, T, C, NH);
  g_in_attention = false;
}

void OpAttentionBackward(float* dinp, float* dpreatt, float* datt,
                         const float* dout, const float* inp, const float* att,
                         int B, int T, int C, int NH) {
  g_in_attention = true;
  gpt2_blas_attention_backward(&kBlas, dinp, dpreatt, datt, dout, inp, att, B,
                               T, C, NH);
  g_in_attention = false;
}

void OpGeluForward(float* out, const float* inp, size_t n) {
  Timer timer(kGeluForward);
  GeluForward<<<Blocks(n), kThreads>>>(out, inp, n);
  CheckLaunch("gelu forward");
}

void OpGeluBackward(float* dinp, const float* inp, const float* dout,
                    size_t n) {
  Timer timer(kGeluBackward);
  GeluBackward<<<Blocks(n), kThreads>>>(dinp, inp, dout, n);
  CheckLaunch("gelu backward");
}

void OpResidualForward(float* out, const float* a, const float* b, size_t n) {
  Timer timer(kResidualForward);
  ResidualForward<<<Blocks(n), kThreads>>>(out, a, b, n);
  CheckLaunch("residual forward");
}

void OpSoftmaxCeForward(float* probs, float* losses, const float* logits,
                        const int* targets, int N, int V) {
  Timer timer(kSoftmaxCeForward);
  SoftmaxCeForward<<<RowBlocks(N), kRowThreads>>>(probs, losses, logits, targets,
                                               N, V);
  CheckLaunch("softmax cross-entropy forward");
}

void OpSoftmaxCeBackward(float* dlogits, const float* dlosses,
                         const float* probs, const int* targets, int N,
                         int V) {
  Timer timer(kSoftmaxCeBackward);
  SoftmaxCeBackward<<<RowBlocks(N), kRowThreads>>>(dlogits, dlosses, probs,
                                                targets, N, V);
  CheckLaunch("softmax cross-entropy backward");
}

void* OpAlloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) bytes = 1;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // out of memory is the caller's to report
    return nullptr;
  }
  if (cudaMemset(p, 0, bytes) != cudaSuccess) {
    cudaFree(p);
    return nullptr;
  }
  return p;
}

void OpFree(void* p) {
  if (p != nullptr) CheckCuda(cudaFree(p), "cudaFree");
}

void OpZero(void* p, size_t bytes) {
  CheckCuda(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
}

void OpCopy(void* dst, const void* src, size_t bytes) {
  CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0),
            "cudaMemcpyAsync (device to device)");
}

// Synchronous: the host buffer may be reused as soon as this returns.
void OpUpload(void* dst, const void* src, size_t bytes) {
  CheckCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy (host to device)");
}

void OpDownload(void* dst, const void* src, size_t bytes) {
  CheckCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy (device to host)");
}

void OpFill(float* p, float value, size_t n) {
  Timer timer(kFill);
  Fill<<<Blocks(n), kThreads>>>(p, value, n);
  CheckLaunch("fill");
}

double OpSum(const float* x, size_t n) {
  {
    Timer timer(kLossSum);
    SumSequential<<<1, 1>>>(x, n, g_blas.sum);
    CheckLaunch("loss sum");
  }
  double s = 0.0;
  CheckCuda(cudaMemcpy(&s, g_blas.sum, sizeof s, cudaMemcpyDeviceToHost),
            "cudaMemcpy (loss sum)");
  return s;
}

int OpError(char* msg, size_t cap) {
  if (g_error[0] == '\0') {
    // errors of kernels already queued surface here too
    cudaError_t e = cudaPeekAtLastError();
    if (e == cudaSuccess) return 0;
    CheckLaunch("a queued kernel");
  }
  if (cap > 0) snprintf(msg, cap, "%s", g_error);
  return -1;
}

int InitFail(char* err, size_t cap, const char* fmt, const char* detail) {
  if (cap > 0) snprintf(err, cap, fmt, detail);
  gpt2_cuda_shutdown();
  return -1;
}

}  // namespace

extern "C" {

const gpt2_layer_ops gpt2_cuda_ops = {
    "cuda",
    OpEncoderForward,
    OpEncoderBackward,
    OpLayernormForward,
    OpLayernormBackward,
    OpMatmulForward,
    OpMatmulBackward,
    OpAttentionForward,
    OpAttentionBackward,
    OpGeluForward,
    OpGeluBackward,
    OpResidualForward,
    OpSoftmaxCeForward,
    OpSoftmaxCeBackward,
    OpAlloc,
    OpFree,
    OpZero,
    OpCopy,
    OpUpload,
    OpDownload,
    OpFill,
    OpSum,
    OpError,
};

int gpt2_cuda_available(char* err, size_t cap) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 0;
  cudaGetLastError();
  if (cap > 0)
    snprintf(err, cap, "--device cuda: no usable CUDA device here "
             "(cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  return -1;
}

int gpt2_cuda_init(char* err, size_t cap) {
  if (g_blas.handle != nullptr) return 0;
  if (gpt2_cuda_available(err, cap) != 0) return -1;
  g_blas.lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (g_blas.lib == nullptr)
    g_blas.lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
  if (g_blas.lib == nullptr)
    return InitFail(err, cap,
                    "--device cuda: cannot load cuBLAS (libcublas.so.13): %s "
                    "(put the CUDA 13 libraries on LD_LIBRARY_PATH)",
                    dlerror());
  struct {
    void** slot;
    const char* name;
  } syms[] = {
      {(void**)&g_blas.create, "cublasCreate_v2"},
      {(void**)&g_blas.destroy, "cublasDestroy_v2"},
      {(void**)&g_blas.set_stream, "cublasSetStream_v2"},
      {(void**)&g_blas.set_math_mode, "cublasSetMathMode"},
      {(void**)&g_blas.sgemm_strided_batched, "cublasSgemmStridedBatched"},
  };
  for (auto& s : syms)
    if ((*s.slot = dlsym(g_blas.lib, s.name)) == nullptr)
      return InitFail(err, cap, "--device cuda: cuBLAS lacks %s", s.name);
  cublasStatus_t st = g_blas.create(&g_blas.handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    g_blas.handle = nullptr;
    char code[32];
    snprintf(code, sizeof code, "%d", (int)st);
    return InitFail(err, cap, "--device cuda: cublasCreate failed (status %s)",
                    code);
  }
  if (g_blas.set_stream(g_blas.handle, 0) != CUBLAS_STATUS_SUCCESS ||
      g_blas.set_math_mode(g_blas.handle, CUBLAS_DEFAULT_MATH) !=
          CUBLAS_STATUS_SUCCESS)
    return InitFail(err, cap, "--device cuda: %s",
                    "cannot set the cuBLAS stream or math mode");
  if (cudaMalloc((void**)&g_blas.sum, sizeof(double)) != cudaSuccess) {
    cudaGetLastError();
    g_blas.sum = nullptr;
    return InitFail(err, cap, "--device cuda: %s",
                    "out of GPU memory for 8 bytes of scratch");
  }
  g_error[0] = '\0';
  return 0;
}

int gpt2_cuda_set_tf32(int on, char* err, size_t cap) {
  if (g_blas.handle == nullptr) {
    if (cap > 0) snprintf(err, cap, "--tf32: the GPU layers are not set up");
    return -1;
  }
  const cublasStatus_t st = g_blas.set_math_mode(
      g_blas.handle, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (cap > 0)
      snprintf(err, cap, "--tf32: cublasSetMathMode failed (status %d)",
               (int)st);
    return -1;
  }
  return 0;
}

void gpt2_cuda_kernel_times_enable(int on) { g_times.on = on != 0; }

void gpt2_cuda_kernel_times_reset(void) {
  DrainTimes();
  for (int k = 0; k < kKernelCount; k++) {
    g_times.calls[k] = 0;
    g_times.seconds[k] = 0.0;
  }
}

int gpt2_cuda_kernel_times(gpt2_kernel_time* rows, int cap) {
  DrainTimes();
  int n = 0;
  for (int k = 0; k < kKernelCount; k++) {
    if (g_times.calls[k] == 0) continue;
    if (n < cap) {
      rows[n].name = kKernelNames[k];
      rows[n].calls = g_times.calls[k];
      rows[n].seconds = g_times.seconds[k];
    }
    n++;
  }
  return n;
}

void gpt2_cuda_shutdown(void) {
  FreeTimes();
  if (g_blas.scratch != nullptr) cudaFree(g_blas.scratch);
  if (g_blas.sum != nullptr) cudaFree(g_blas.sum);
  if (g_blas.handle != nullptr) g_blas.destroy(g_blas.handle);
  if (g_blas.lib != nullptr) dlclose(g_blas.lib);
  g_blas = Cublas();
}

}  // extern "C"
