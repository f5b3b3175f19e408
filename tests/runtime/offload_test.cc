// offload_test.cc — CPU offload (docs/offload.md) at 1, 2, 3 and 4 ranks:
// training with master weights and optimizer states in NUMA-placed host
// memory, stepped by the offload worker threads, is bitwise the training
// without offload at every stage (the kernels are elementwise, so who runs
// which share cannot change a bit); the accounting proves the path ran.
#include <gtest/gtest.h>
#include <zs_mpi.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "offload/aio.h"      /* zs__aio_fault_hook */
#include "runtime/engine/engine.h" /* zs__offload_force_staging */
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class OffloadTest : public ZsMpiTest {};

// The training every offload is compared with: `steps` at `stage` with
// `dtype` parameters (16-bit ones reduce their gradients in fp32).
TrainConfig Config(int stage, zs_dtype dtype, int steps) {
  TrainConfig cfg;
  cfg.steps = steps;
  cfg.stage = stage;
  cfg.param_dtype = dtype;
  cfg.reduce_dtype = dtype == ZS_FLOAT32 ? -1 : ZS_FLOAT32;
  return cfg;
}

// NVMe swap files go under the test's temporary directory.
std::string NvmeDir() { return TestDir("nvme"); }

// model 0: the transformer (tied head, frozen tensor), 1: the degenerate
// model (odd, tiny and empty tensors).
std::unique_ptr<Model> Make(int model) {
  return model ? MakeDegenerate() : MakeTransformer();
}

TEST_F(OffloadTest, OffloadIsBitwiseAndTheAccountingProvesIt) {
  for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16})
    for (int stage = 0; stage <= 3; stage++)
      for (int param : {0, 1}) {
        if (param && stage != 3) continue;
        const std::string where = std::string(zs_dtype_name(dtype)) + " stage " +
                                  std::to_string(stage) +
                                  (param ? " +params" : "");
        TrainConfig cfg = Config(stage, dtype, 6);
        auto m1 = MakeTransformer();
        TrainResult plain = TrainSharded(*m1, cfg);
        ASSERT_EQ(plain.status, ZS_OK) << where << ": " << plain.error;
        cfg.offload = 1;
        cfg.offload_param = param;
        auto m2 = MakeTransformer();
        TrainResult off = TrainSharded(*m2, cfg);
        ASSERT_EQ(off.status, ZS_OK) << where << ": " << off.error;
        for (size_t t = 0; t < plain.params.size(); t++) {
          EXPECT_TRUE(Bitwise(off.params[t], plain.params[t])) << where << " tensor " << t;
          EXPECT_TRUE(Bitwise(off.state0[t], plain.state0[t])) << where << " tensor " << t;
        }
        // offload_host holds exactly what master_weights and
        // optimizer_states held without offload (and the parameter shards
        // with parameter offload); those categories are empty now.
        const zs_memory_stats& a = plain.memory;
        const zs_memory_stats& b = off.memory;
        EXPECT_EQ(b.current[ZS_MEM_OFFLOAD_HOST],
                  a.current[ZS_MEM_MASTER_WEIGHTS] + a.current[ZS_MEM_OPTIMIZER_STATES] +
                      (param ? a.current[ZS_MEM_PARAMS] : 0))
            << where;
        EXPECT_EQ(b.current[ZS_MEM_MASTER_WEIGHTS], 0u) << where;
        EXPECT_EQ(b.current[ZS_MEM_OPTIMIZER_STATES], 0u) << where;
        EXPECT_EQ(b.model_state_bytes + b.current[ZS_MEM_OFFLOAD_HOST],
                  a.model_state_bytes) << where;
        // The step ran on the workers: one run per trainable unit per step.
        EXPECT_EQ(off.offload.enabled, 1);
        EXPECT_GE(off.offload.workers, 1);
        EXPECT_EQ(off.offload.steps_on_workers,
                  (uint64_t)cfg.steps * m1->units.size()) << where;
        EXPECT_EQ(plain.offload.enabled, 0);
      }
}

// Bad input reaches every rank: a NUMA node that does not exist.
// The staged path CPU offload takes when parameters and gradients are in GPU
// memory (engine_step.c: gradients to page-locked staging, the step on the
// workers, parameters back, two slots overlapped across units), forced here
// on the host device, where its copies are memcpy: bitwise the training
// without offload, including the frozen tensor, the tied head and the
// padding the staging carries back untouched (odd ranks and the degenerate
// model's odd sizes), and the staging is counted as offload host memory;
// at stage 3 with the parameter shards in host memory too, each all-gather
// reads a device copy of the shard (NCCL's need), bitwise the same.
TEST_F(OffloadTest, StagedPathForGpusIsBitwise) {
  zs__offload_force_staging = 1;
  for (int model = 0; model < 2; model++)
    for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16})
      for (int stage = 0; stage <= 3; stage++) {
        const std::string where = std::string(model ? "degenerate " : "transformer ") +
                                  zs_dtype_name(dtype) + " stage " +
                                  std::to_string(stage);
        TrainConfig cfg = Config(stage, dtype, 4);
        auto m1 = Make(model);
        TrainResult plain = TrainSharded(*m1, cfg);
        ASSERT_EQ(plain.status, ZS_OK) << where << ": " << plain.error;
        cfg.offload = 1;
        auto m2 = Make(model);
        TrainResult off = TrainSharded(*m2, cfg);
        ASSERT_EQ(off.status, ZS_OK) << where << ": " << off.error;
        ExpectSameTraining(plain, off, *m1, where);
        EXPECT_GT(off.memory.current[ZS_MEM_OFFLOAD_HOST],
                  plain.memory.current[ZS_MEM_MASTER_WEIGHTS] +
                      plain.memory.current[ZS_MEM_OPTIMIZER_STATES])
            << where << ": the staging is offload host memory";
        EXPECT_EQ(off.offload.steps_on_workers,
                  (uint64_t)cfg.steps * m1->units.size()) << where;
        if (stage == 3) {
          // the parameter shards in host memory too: every all-gather (and
          // zs_tensor_get of a host field) reads a device copy of the
          // shard, as NCCL needs
          cfg.offload_param = 1;
          auto m4 = Make(model);
          TrainResult offp = TrainSharded(*m4, cfg);
          ASSERT_EQ(offp.status, ZS_OK) << where << " +params: " << offp.error;
          ExpectSameTraining(plain, offp, *m1, where + " +params");
          EXPECT_EQ(offp.memory.current[ZS_MEM_PARAMS], 0u) << where;
          // the forward reduces nothing: its comm buffers are the copies
          EXPECT_EQ(off.memory.phase_peak[ZS_PHASE_FORWARD][ZS_MEM_COMM_BUFFERS], 0u)
              << where;
          EXPECT_GT(offp.memory.phase_peak[ZS_PHASE_FORWARD][ZS_MEM_COMM_BUFFERS], 0u)
              << where << ": the shards' device copies are comm buffers";
          // and on NVMe, the optimizer on the CPU or on NVMe: each unit's
          // shard is acquired into a pool buffer, staged with its
          // gradients unit by unit, and written back
          const std::string pdir = NvmeDir();
          cfg.offload_param = 2;
          cfg.nvme.path = pdir.c_str();
          cfg.nvme.param_buffer_count = 2;
          for (int opt : {1, 2}) {
            cfg.offload = opt;
            auto m5 = Make(model);
            TrainResult nvp = TrainSharded(*m5, cfg);
            const std::string w = where + " +params on NVMe, optimizer " +
                                  (opt == 2 ? "on NVMe" : "on the CPU");
            ASSERT_EQ(nvp.status, ZS_OK) << w << ": " << nvp.error;
            ExpectSameTraining(plain, nvp, *m1, w);
            EXPECT_GT(nvp.memory.phase_peak[ZS_PHASE_FORWARD][ZS_MEM_COMM_BUFFERS], 0u)
                << w << ": the shards' device copies";
            ExpectEmptyDir(pdir, w);
          }
          cfg.offload = 1;
          cfg.offload_param = 0;
          cfg.nvme.param_buffer_count = 5;
        }
        // NVMe offload with CUDA takes the staging too (a unit's span to
        // the host, its sub-groups stepped, its parameters back)
        const std::string dir = NvmeDir();
        cfg.offload = 2;
        cfg.nvme.path = dir.c_str();
        cfg.nvme.sub_group_size = 7;
        auto m3 = Make(model);
        TrainResult nvme = TrainSharded(*m3, cfg);
        ASSERT_EQ(nvme.status, ZS_OK) << where << " nvme: " << nvme.error;
        ExpectSameTraining(plain, nvme, *m1, where + " nvme");
        EXPECT_GT(nvme.memory.current[ZS_MEM_OFFLOAD_HOST], 0u)
            << where << " nvme: the staging is offload host memory";
      }
  zs__offload_force_staging = 0;
}

// NVMe offload (engine_optim_nvme.c): the optimizer states in a swap file,
// stepped sub-group by sub-group through the pinned slots, train bitwise as
// CPU offload and as no offload (parameters, master weights and moments
// read back from the file, every step's loss) at stages 0-3, fp32 and
// bf16, with several tensors per unit, odd sizes, tied and frozen tensors,
// sub-groups of 1 element (the degenerate model), 7 elements (a sub-group
// boundary inside tensors) and larger than the shard; the swap files and
// directories are gone after the context.
TEST_F(OffloadTest, NvmeIsBitwiseCpuOffloadAndNoOffload) {
  const std::string dir = NvmeDir();
  for (int model = 0; model < 2; model++)
    for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16})
      for (int stage = 0; stage <= 3; stage++) {
        TrainConfig cfg = Config(stage, dtype, 4);
        auto m1 = Make(model);
        TrainResult plain = TrainSharded(*m1, cfg);
        ASSERT_EQ(plain.status, ZS_OK) << plain.error;
        cfg.offload = 1;
        auto m2 = Make(model);
        TrainResult cpu = TrainSharded(*m2, cfg);
        ASSERT_EQ(cpu.status, ZS_OK) << cpu.error;
        for (size_t sub : {(size_t)1, (size_t)7, (size_t)0}) {
          if (sub == 1 && model == 0) continue;  // 4 KiB per element: slow
          const std::string where = std::string(model ? "degenerate " : "transformer ") +
                                    zs_dtype_name(dtype) + " stage " +
                                    std::to_string(stage) + " sub-group " +
                                    std::to_string(sub);
          cfg.offload = 2;
          cfg.nvme.path = dir.c_str();
          cfg.nvme.sub_group_size = sub;
          cfg.nvme.aio = sub == 7 ? ZS_AIO_THREADS : ZS_AIO_AUTO;  // the thread pool too
          auto m3 = Make(model);
          TrainResult nvme = TrainSharded(*m3, cfg);
          ASSERT_EQ(nvme.status, ZS_OK) << where << ": " << nvme.error;
          ExpectSameTraining(plain, nvme, *m1, where);
          ExpectSameTraining(cpu, nvme, *m1, where);
          // the states were on disk, streamed through the pinned pool
          EXPECT_EQ(nvme.memory.current[ZS_MEM_OPTIMIZER_STATES], 0u) << where;
          EXPECT_EQ(nvme.memory.current[ZS_MEM_MASTER_WEIGHTS], 0u) << where;
          EXPECT_GT(nvme.memory.current[ZS_MEM_NVME_STAGING], 0u) << where;
          EXPECT_EQ(nvme.offload.nvme, 1) << where;
          EXPECT_GT(nvme.offload.nvme_file_bytes, 0u) << where;
          // the workers ran one step per sub-group, at least one per unit
          EXPECT_GE(nvme.offload.steps_on_workers, cpu.offload.steps_on_workers) << where;
          ExpectEmptyDir(dir, where);
        }
      }
}

// Checkpoints with NVMe offload: the master weights and moments are read
// from the swap file into the checkpoint and written back at load, so
// 3 steps + save + load + 3 steps equals 6 straight steps bitwise, and a
// checkpoint saved with NVMe offload continues bitwise with CPU offload
// (the same checkpoint format).
TEST_F(OffloadTest, NvmeCheckpointsResumeBitwise) {
  const std::string dir = NvmeDir();
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(t != nullptr ? t : "/tmp") + "/nvme-ckpt";
  for (int stage : {0, 3}) {
    const std::string what = "stage " + std::to_string(stage);
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.param_dtype = ZS_BFLOAT16;
    cfg.reduce_dtype = ZS_FLOAT32;
    cfg.offload = 2;
    cfg.nvme.path = dir.c_str();
    cfg.nvme.sub_group_size = 7;
    auto run = [&](int first, int steps, const std::string& load,
                   const std::string& save, int offload) {
      cfg.offload = offload;
      auto m = MakeTransformer();
      return TrainSlice(*m, cfg, first, steps, load, save, what);
    };
    const std::string ck = root + std::to_string(stage);
    TrainResult straight = run(0, 6, "", "", 2);
    TrainResult first = run(0, 3, "", ck, 2);
    TrainResult resumed = run(3, 3, ck, "", 2);
    TrainResult on_cpu = run(3, 3, ck, "", 1);
    // saved before any step: the master weights are still the parameters
    // widened (not read from the file); loading them trains as straight
    run(0, 0, "", ck + "-init", 2);
    TrainResult from_init = run(0, 6, ck + "-init", "", 2);
    auto m = MakeTransformer();
    ExpectSameTensors(straight, resumed, *m, what + " resumed with NVMe");
    ExpectSameTensors(straight, on_cpu, *m, what + " resumed with CPU offload");
    ExpectSameTensors(straight, from_init, *m, what + " from a checkpoint of step 0");
    for (int s = 0; s < 3; s++)
      EXPECT_EQ(straight.losses[3 + s], resumed.losses[s]) << what << " step " << s;
    ExpectEmptyDir(dir, what);
  }
}

long FailFirstRead(const char*, uint64_t offset, int write, size_t, long result) {
  return !write && offset == 0 ? -EIO : result;
}

// A disk error on one rank during the step: that rank's error names the
// swap file and the offset, the others fail cleanly (another rank failed),
// and the swap files are removed.
TEST_F(OffloadTest, NvmeReadErrorNamesFileAndOffsetAndFailsEveryRank) {
  const std::string dir = NvmeDir();
  TrainConfig cfg;
  cfg.steps = 2;
  cfg.stage = 2;
  cfg.offload = 2;
  cfg.nvme.path = dir.c_str();
  const int bad = world_ - 1;
  if (rank_ == bad) zs__aio_fault_hook = FailFirstRead;
  auto m = MakeTransformer();
  TrainResult r = TrainSharded(*m, cfg);
  zs__aio_fault_hook = nullptr;
  if (rank_ == bad) {
    EXPECT_EQ(r.status, ZS_ERR_IO) << r.error;
    EXPECT_NE(r.error.find("model-0.swap"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("at offset 0 of"), std::string::npos) << r.error;
  } else {
    EXPECT_EQ(r.status, ZS_ERR_REMOTE) << r.error;
  }
  // (the model refuses further steps after such a failure: the next test)
  ExpectEmptyDir(dir, "read error");
}

long g_fault_kind = 0;  // 1: a write fails, 2: a read comes back short
long WriteOrShort(const char*, uint64_t, int write, size_t bytes, long result) {
  if (g_fault_kind == 1 && write) return -EIO;
  if (g_fault_kind == 2 && !write) return (long)bytes / 2;
  return result;
}

// A failed write and a short read through the engine: the failing rank's
// error names the operation, the file and the offset, the others fail
// cleanly, and the swap files are removed.
TEST_F(OffloadTest, NvmeWriteErrorAndShortReadFailEveryRankNamingTheFile) {
  const std::string dir = NvmeDir();
  for (long kind : {1L, 2L}) {
    TrainConfig cfg;
    cfg.steps = 2;
    cfg.stage = 1;
    cfg.param_dtype = ZS_BFLOAT16;
    cfg.reduce_dtype = ZS_FLOAT32;
    cfg.offload = 2;
    cfg.nvme.path = dir.c_str();
    const int bad = 0;
    g_fault_kind = kind;
    if (rank_ == bad) zs__aio_fault_hook = WriteOrShort;
    auto m = MakeTransformer();
    TrainResult r = TrainSharded(*m, cfg);
    zs__aio_fault_hook = nullptr;
    const std::string what = kind == 1 ? "write" : "short read";
    if (rank_ == bad) {
      EXPECT_EQ(r.status, ZS_ERR_IO) << what << ": " << r.error;
      EXPECT_NE(r.error.find(kind == 1 ? "write of " : "short read, got "),
                std::string::npos) << r.error;
      EXPECT_NE(r.error.find("model-0.swap"), std::string::npos) << r.error;
      EXPECT_NE(r.error.find(" at offset "), std::string::npos) << r.error;
    } else {
      EXPECT_EQ(r.status, ZS_ERR_REMOTE) << what << ": " << r.error;
    }
    ExpectEmptyDir(dir, what);
  }
}

// A disk too small for the swap files (a 16 KiB tmpfs): zs_model_finalize
// fails on every rank, the rank whose file did not fit naming it and "no
// space left", and nothing is left on the disk. Needs mount(2) (root);
// skipped with the reason otherwise.
TEST_F(OffloadTest, NvmeDiskFullFailsAtFinalizeOnEveryRank) {
  const std::string dir = NvmeDir() + "/small";
  int mounted = 0;
  if (rank_ == 0) {
    mkdir(dir.c_str(), 0700);
    mounted = mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=16k") == 0;
  }
  MPI_Bcast(&mounted, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!mounted) GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  TrainConfig cfg;
  cfg.steps = 1;
  cfg.stage = 0;  // the whole buffers: the largest files
  cfg.offload = 2;
  cfg.nvme.path = dir.c_str();
  auto m = MakeTransformer();
  TrainResult r = TrainSharded(*m, cfg);
  EXPECT_NE(r.status, ZS_OK);
  int mine = r.status == ZS_ERR_IO && r.error.find("no space left") != std::string::npos &&
             r.error.find(".swap") != std::string::npos;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(any, 1) << "no rank reported the full disk: " << r.error;
  ExpectEmptyDir(dir, "disk full");
  if (rank_ == 0) {
    umount(dir.c_str());
    rmdir(dir.c_str());
  }
}

// After a step failed half-way (a disk error), the model refuses further
// steps on every rank, saying why, instead of training on partly updated
// states; loading a checkpoint makes it whole again.
TEST_F(OffloadTest, NvmeAfterAFailedStepFurtherStepsAreRefused) {
  const std::string dir = NvmeDir();
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  c.offload_optimizer.device = ZS_OFFLOAD_NVME;
  c.nvme.path = dir.c_str();
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK) << zs_last_error();
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  int64_t n = 4096;
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  auto step = [&]() {
    EXPECT_EQ(zs_unit_gather(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_grad_acquire(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_grad_release(m, u), ZS_OK);
    EXPECT_EQ(zs_unit_release(m, u), ZS_OK);
    return zs_step(m, nullptr);
  };
  ASSERT_EQ(step(), ZS_OK) << zs_last_error();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string ck = std::string(tmp != nullptr ? tmp : "/tmp") + "/nvme-broken";
  ASSERT_EQ(zs_checkpoint_save(m, ck.c_str(), nullptr, nullptr, 0), ZS_OK) << zs_last_error();
  g_fault_kind = 1;
  if (rank_ == 0) zs__aio_fault_hook = WriteOrShort;
  EXPECT_NE(step(), ZS_OK);
  zs__aio_fault_hook = nullptr;
  EXPECT_EQ(step(), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("load a checkpoint"), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_checkpoint_load(m, ck.c_str(), 0, nullptr, 0, nullptr), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(step(), ZS_OK) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// A swap path that cannot hold a directory fails every rank at context
// creation, naming it.
TEST_F(OffloadTest, NvmePathThatIsNotADirectoryFailsEveryRank) {
  const std::string file = NvmeDir() + "/not-a-dir";
  if (rank_ == 0) fclose(fopen(file.c_str(), "w"));
  MPI_Barrier(MPI_COMM_WORLD);
  zs_config c = ZS_CONFIG_INIT;
  c.offload_optimizer.device = ZS_OFFLOAD_NVME;
  c.nvme.path = file.c_str();
  zs_context* ctx = nullptr;
  EXPECT_NE(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  EXPECT_EQ(ctx, nullptr);
  if (world_ == 1 || rank_ == 0) {
    EXPECT_NE(std::string(zs_last_error()).find(file), std::string::npos)
        << zs_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) unlink(file.c_str());
}

TEST_F(OffloadTest, MissingNumaNodeFailsEveryRank) {
  zs_config c = ZS_CONFIG_INIT;
  c.offload_optimizer.device = ZS_OFFLOAD_CPU;
  c.offload_optimizer.numa = 4000;
  zs_context* ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("NUMA node 4000 does not exist"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(ctx, nullptr);
  // offload_param without the optimizer's offload, or below stage 3
  c = ZS_CONFIG_INIT;
  c.offload_param = ZS_OFFLOAD_CPU;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_param"), std::string::npos);
}

}  // namespace
