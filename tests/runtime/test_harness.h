// test_harness.h — trains a test model (test_models.h) either as a plain
// single-process reference (plain arrays, the optim/ kernels per tensor) or
// sharded through ZeroShard on MPI_COMM_WORLD, and compares the results.
#ifndef ZS_TESTS_RUNTIME_TEST_HARNESS_H_
#define ZS_TESTS_RUNTIME_TEST_HARNESS_H_

#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>

#include <string>
#include <vector>

#include "tests/runtime/test_models.h"
#include "tests/testing/dirs.h"

namespace zstest {

struct TrainConfig {
  int stage = 0;
  zs_optimizer_kind optimizer = ZS_OPTIM_ADAMW;
  int steps = 20;
  double lr = 0;  // 0: 1e-2 for Adam/AdamW, 0.1 for SGD
  // 0: record use counts in the first step; > 0: zs_unit_set_grad_uses for
  // every unit that has a count in `uses`.
  std::vector<int> uses;
  bool sentinel = false;  // fill padding and gaps with NaN after finalize
  MPI_Comm comm = MPI_COMM_WORLD;  // the data-parallel group
  // Overlap settings (zs_config), defaults as ZS_CONFIG_INIT.
  int prefetch_depth = 2;
  size_t bucket_elements = (size_t)1 << 22;
  int reduce_order = ZS_REDUCE_FIXED;
  int reshard_after_forward = 1;
  size_t max_live_elements = 0;
  int progress_thread = 1;
  // zs_config.host_collectives (ZS_HOST_COLLECTIVES_*; unset: AUTO, or
  // what ZS_HOST_COLLECTIVES says).
  int host_collectives = ZS_HOST_COLLECTIVES_UNSET;
  // zs_config.shard_group_size (hybrid sharding; 0: all ranks).
  int shard_group_size = 0;
  // Precision, clipping, accumulation (docs/precision.md).
  int global_batch = kGlobalBatch;  // sequences per optimizer step
  int grad_accum = 1;        // K micro-batches per optimizer step
  int grad_accum_local = 0;  // zs_config.grad_accum_local
  double max_grad_norm = 0;  // > 0: clip to it (both runs)
  zs_dtype param_dtype = ZS_FLOAT32;  // of every tensor
  int reduce_dtype = -1;     // zs_config.reduce_dtype
  int loss_scaler = ZS_LOSS_SCALE_NONE;  // sharded run: the model's
  double init_scale = 65536; // gradients are multiplied by the scale
  int offload = 0;           // zs_config.offload_optimizer.device
  int offload_param = 0;     // zs_config.offload_param
  // NVMe offload (offload or offload_param = 2): zs_config.nvme; nvme.path must be set
  zs_nvme_config nvme = {nullptr, 9, (size_t)16 << 20, 0, 16, ZS_AIO_AUTO,
                         (size_t)1 << 20, 5, 0};
  // Checkpoints (docs/checkpoint.md): steps run are [first_step,
  // first_step + steps) of the same data stream and learning-rate schedule.
  int first_step = 0;
  std::string load;          // zs_checkpoint_load this after zs_model_init
  unsigned load_flags = 0;
  std::string save;          // zs_checkpoint_save into this root at the end
  std::string save_name;     // its name ("" = the default, step-N)
  // Where buffers live. With ZS_DEVICE_CUDA the model's host code works on
  // host mirrors of the gathered parameters and gradients, moved with
  // `copy` (e.g. cudaMemcpy with cudaMemcpyDefault; tests/gpu).
  zs_device_kind device = ZS_DEVICE_HOST;
  // zs_context_create_local (one process, no MPI) instead of the MPI
  // context on `comm` (which must then have one rank).
  bool local_context = false;
  // A user's optimizer (zs_model_set_optimizer) instead of `optimizer`:
  // the sharded run registers it, the reference calls it on each whole
  // tensor (hyper-parameters as OptimizerFor's).
  zs_optimizer_fn optim_fn = nullptr;
  void* optim_user = nullptr;
  int optim_nstates = 0;
  std::string optim_name = "custom";
  // TrainReference only: the gradient of each of this many ranks' slices of
  // the global batch computed apart, summed in rank order and divided once
  // by their number (the engine's fixed-order reduce-scatter), so that the
  // reference is bitwise a sharded run at that world size (1: the whole
  // batch at once, bitwise at one rank; within rounding otherwise).
  int reference_world = 1;
  // ... per step (a run resumed at another world size), overriding it;
  // the last entry holds for the later steps.
  std::vector<int> reference_worlds;
  // TrainReference with reference_world W: > 0 and < W groups the ranks
  // as hybrid sharding with shard_group_size G does: each group's G
  // gradients summed in rank order and divided by G, then the W / G group
  // means summed in group order and divided by W / G (the engine's shard
  // group reduce-scatter, then its replica all-reduce).
  int reference_group = 0;
  // Sharded run: units made ZS_UNIT_REPLICATED, and the model's
  // persistence threshold (elements; 0: none).
  std::vector<int> replicated;
  size_t persistence_threshold = 0;
  // Sharded run: units declared with zs_unit_allow_unused (the model's
  // Access::Unused marks them per micro-batch).
  std::vector<int> allow_unused;
  void (*copy)(void* dst, const void* src, size_t bytes) = nullptr;
};

struct TrainResult {
  std::vector<std::vector<float>> params;  // per tensor, after training
  std::vector<std::vector<float>> state0;  // exp_avg / momentum per tensor
  std::vector<float> losses;               // global mean loss per step
  std::vector<zs_comm_counters> step_counters;  // counters diff per step
  std::vector<zs_memory_stats> step_memory;      // right after each zs_step
  std::vector<uint64_t> step_prefetched;  // all-gathers prefetch started
  // sharded: the communication log's records of each optimizer step
  std::vector<std::vector<zs_comm_record>> step_log;
  zs_memory_stats memory_baseline{};       // right after context creation
  zs_memory_stats memory{};                // after training
  zs_memory_stats memory_after_destroy{};  // after zs_model_destroy
  zs_status status = ZS_OK;                // first failure, if any
  std::string error;
  std::vector<zs_step_info> infos;  // sharded: per optimizer step
  // Per optimizer step with clipping: the reference's pre-clip norm, or
  // (sharded) the norm recomputed from the reduced gradients (zs_tensor_get
  // of every trainable tensor's GRAD, sum of squares in double).
  std::vector<double> norms;
  zs_offload_info offload{};  // sharded: at the end of training
  std::vector<std::vector<float>> state1;  // exp_avg_sq per tensor (Adam)
  std::vector<std::vector<float>> master;  // fp32 master (16-bit tensors)
  double loss_scale = 0;                   // sharded: at the end
};

zs_optimizer_config OptimizerFor(const TrainConfig& cfg);

// Single process, whole global batch, plain arrays.
TrainResult TrainReference(Model& model, const TrainConfig& cfg);

// Sharded over MPI_COMM_WORLD (collective).
TrainResult TrainSharded(Model& model, const TrainConfig& cfg);

// One slice of a checkpointed run: `cfg` for steps [first, first+steps) of
// its data stream, loading the checkpoint `load` first and saving into the
// root `save` (the default name) at the end ("": neither); expects the run
// to succeed (what: prefix of the failure message).
TrainResult TrainSlice(Model& model, TrainConfig cfg, int first, int steps,
                       const std::string& load, const std::string& save,
                       const std::string& what);

// A directory `name` under the test's temporary directory ($TEST_TMPDIR,
// else /tmp), made if missing.
std::string TestDir(const std::string& name);
// DirEntries(dir): tests/testing/dirs.h.
// Collective: once every rank is done with `dir` (each removes its own swap
// files), it is empty.
void ExpectEmptyDir(const std::string& dir, const std::string& what);

// Registers `model` on a finalized zs_model (helper for other tests).
zs_status RegisterModel(Model& model, zs_model* zm);

// The model as a description for the memory estimator (zs_estimate_model,
// docs/profiling.md): its units, tensors (numel, frozen, tied_to the
// owner's name) and dtype, as RegisterModel registers them.
std::string DescribeModel(const Model& model);

// zs_model_init callback: Model::Init of each tensor (user: the Model*),
// converted to the tensor's dtype.
zs_status InitCallback(void* user, int tensor, const zs_tensor_desc* desc,
                       void* data);

// A field of a tensor as fp32 (16-bit values converted); out has numel
// elements. Collective (zs_tensor_get).
zs_status GetFloat(zs_model* zm, int t, zs_field f, std::vector<float>& out);

// Per-tensor tolerance check of the foundation issue: ||a-b||_2 <= rel *
// ||b||_2 and max|a-b| <= rel * max|b| (both zero when b is zero).
::testing::AssertionResult CloseByNorm(const std::vector<float>& a,
                                       const std::vector<float>& b,
                                       double rel);
::testing::AssertionResult Bitwise(const std::vector<float>& a,
                                   const std::vector<float>& b);

// Every tensor's parameters, optimizer states and master weights of two
// runs are bitwise equal (what: prefix of the failure messages).
void ExpectSameTensors(const TrainResult& a, const TrainResult& b,
                       const Model& m, const std::string& what);

// ExpectSameTensors, and every step's loss equal.
// Per optimizer step, the largest gathered-parameters size of its phases
// (zs_memory_stats.phase_peak[..][ZS_MEM_PARAMS_GATHERED]), bytes.
std::vector<size_t> GatheredPeaks(const TrainResult& r);

void ExpectSameTraining(const TrainResult& a, const TrainResult& b,
                        const Model& m, const std::string& what);

}  // namespace zstest

#endif  // ZS_TESTS_RUNTIME_TEST_HARNESS_H_
