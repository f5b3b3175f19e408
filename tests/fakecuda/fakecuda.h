/*
 * fakecuda.h — a CPU stand-in for the CUDA runtime (fake_cudart.c) and for
 * the kernels behind optim/optim_cuda.h (fake_launchers.c), with NCCL's
 * stand-in (fake_nccl.c), so that the CUDA backend's own C code
 * (runtime/device/device_cuda.c, runtime/comm/comm_nccl.c) and the engine's CUDA
 * paths run in CI on machines without a GPU, under an ordering model that
 * runs queued work only when waited for (fake_cudart.c says what is
 * modelled, and where it is more lenient). Test-only: //tests/fakecuda.
 */
#ifndef ZS_TESTS_FAKECUDA_FAKECUDA_H_
#define ZS_TESTS_FAKECUDA_FAKECUDA_H_

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues run(arg) on `stream` as a kernel; run is called once, when some
 * wait needs it, and free(arg) after. Returns cudaSuccess, or an error as
 * a launch would (and sets the last error). `name` names the kernel in
 * the fake's messages. */
cudaError_t fakecuda_launch(cudaStream_t stream, const char* name,
                            void (*run)(void* arg), void* arg);

/* The address the fake's device reads `bytes` bytes of a kernel operand
 * through: device memory's readable alias, or registered host memory
 * itself. NULL stays NULL. Pageable host memory, or a range past its
 * allocation, is what a GPU cannot read: *ok is set to 0 and the problem
 * printed. */
void* fakecuda_kernel_ptr(const void* p, size_t bytes, const char* name,
                          int* ok);

/* Queues on `stream` an operation that is done when poll(arg) returns
 * nonzero (an NCCL collective in flight): a wait for it polls until then,
 * a query polls once. free(arg) after. */
cudaError_t fakecuda_enqueue_poll(cudaStream_t stream, const char* name,
                                  int (*poll)(void* arg), void* arg);

/* Runs what the operations queued on `stream` wait for on other streams
 * (its event waits; for a blocking stream, the legacy stream's earlier
 * work), but not the stream's own queue: the inputs of work about to be
 * queued there are then ready, as a GPU would have them when it runs. */
void fakecuda_stream_inputs(cudaStream_t stream);

/* From now on cudaFree leaves the pages readable where the fake device
 * writes them (NCCL's stand-in calls it at ncclCommAbort: its abandoned
 * MPI requests may still complete into freed buffers). */
void fakecuda_keep_memory(void);

/* Operations queued and not yet run, on every stream. */
size_t fakecuda_pending(void);

#ifdef __cplusplus
}
#endif

#endif /* ZS_TESTS_FAKECUDA_FAKECUDA_H_ */
