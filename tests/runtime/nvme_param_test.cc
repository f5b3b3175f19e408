// nvme_param_test.cc — stage-3 parameter shards on NVMe (offload_param =
// nvme; docs/offload.md, "Parameter shards on NVMe") at 1, 2, 3 and 4
// ranks: training with every unit's shard in a swap file, read into a pool
// of pinned buffers before its all-gather and written back after the step,
// is bitwise the training without offload, with the optimizer states in
// host memory or on NVMe too, with one buffer (every shard re-read at
// every use) or enough for all; checkpoints resume; a disk error in a
// gather or in the step fails every rank, naming the file and offset on
// the failing one; the swap files are gone afterwards.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zs_mpi.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "offload/aio.h" /* zs__aio_fault_hook */
/* the buffer pool, for the failure test */
#include "runtime/engine/engine_nvme_io.h"
#include "runtime/engine/engine_nvme_param.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

class NvmeParamTest : public ZsMpiTest {};

std::string NvmeDir() { return TestDir("nvme-param"); }

// Two units "a" and "b" of one fp32 tensor each (odd sizes), stage 3, the
// optimizer on the CPU, the parameter shards on NVMe through one buffer
// (every use of a shard reads it again), finalized.
size_t TwoUnitsNumel(int world) { return 1024 * (size_t)world + 3; }
void TwoUnits(const std::string& dir, zs_context** ctx, zs_model** m, int u[2]) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.offload_optimizer.device = ZS_OFFLOAD_CPU;
  c.offload_param = ZS_OFFLOAD_NVME;
  c.nvme.path = dir.c_str();
  c.nvme.param_buffer_count = 1;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, ctx), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_model_create(*ctx, m), ZS_OK);
  int64_t n = (int64_t)TwoUnitsNumel(world);
  for (int i = 0; i < 2; i++) {
    int t = -1;
    ASSERT_EQ(zs_model_add_unit(*m, i ? "b" : "a", &u[i]), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(*m, u[i], i ? "b.w" : "a.w", 1, &n, ZS_FLOAT32, 0, &t),
              ZS_OK) << zs_last_error();
  }
  ASSERT_EQ(zs_model_finalize(*m), ZS_OK) << zs_last_error();
}

TrainConfig Stage3(zs_dtype dtype, int steps) {
  TrainConfig cfg;
  cfg.steps = steps;
  cfg.stage = 3;
  cfg.param_dtype = dtype;
  cfg.reduce_dtype = dtype == ZS_FLOAT32 ? -1 : ZS_FLOAT32;
  return cfg;
}

// model 0: the transformer (tied head, frozen tensor, several tensors per
// unit), 1: the degenerate model (odd, tiny and empty tensors).
std::unique_ptr<Model> Make(int model) {
  return model ? MakeDegenerate() : MakeTransformer();
}

TEST_F(NvmeParamTest, ParameterShardsOnNvmeTrainBitwiseAsNoOffload) {
  const std::string dir = NvmeDir();
  for (int model = 0; model < 2; model++)
    for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16}) {
      TrainConfig cfg = Stage3(dtype, 4);
      auto m1 = Make(model);
      TrainResult plain = TrainSharded(*m1, cfg);
      ASSERT_EQ(plain.status, ZS_OK) << plain.error;
      cfg.offload_param = 2;
      cfg.nvme.path = dir.c_str();
      // 1 buffer: every shard is read at every use and the read-ahead
      // finds none free; 2: read-ahead along the trace; 64: all cached
      for (int opt : {1, 2})
        for (size_t buffers : {(size_t)1, (size_t)2, (size_t)64}) {
          const std::string where =
              std::string(model ? "degenerate " : "transformer ") +
              zs_dtype_name(dtype) + " optimizer on " + (opt == 1 ? "cpu" : "nvme") +
              ", " + std::to_string(buffers) + " parameter buffers";
          cfg.offload = opt;
          cfg.nvme.param_buffer_count = buffers;
          // 64 buffers: sized in elements (DeepSpeed's buffer_size) well
          // above the largest shard; otherwise exactly the largest shard
          cfg.nvme.param_buffer_elements = buffers == 64 ? 100000 : 0;
          cfg.nvme.sub_group_size = 7;  // sub-group boundaries inside tensors
          cfg.nvme.aio = buffers == 2 ? ZS_AIO_THREADS : ZS_AIO_AUTO;  // the thread pool too
          auto m2 = Make(model);
          TrainResult nvme = TrainSharded(*m2, cfg);
          ASSERT_EQ(nvme.status, ZS_OK) << where << ": " << nvme.error;
          ExpectSameTraining(plain, nvme, *m1, where);
          // the parameter shards were on disk, in the pinned pool while used
          EXPECT_EQ(nvme.memory.current[ZS_MEM_PARAMS], 0u) << where;
          EXPECT_GT(nvme.memory.current[ZS_MEM_NVME_STAGING], 0u) << where;
          EXPECT_EQ(nvme.offload.nvme, 1) << where;
          EXPECT_GE(nvme.offload.nvme_file_bytes,
                    plain.memory.current[ZS_MEM_PARAMS]) << where;
          // zs_model_init writes every shard without reading it; with a
          // buffer per unit nothing is read again, with fewer the shards
          // are re-read (two buffers: read ahead along the trace)
          if (buffers == 64) {
            EXPECT_EQ(nvme.offload.nvme_param_reads, 0u) << where;
          } else {
            EXPECT_GT(nvme.offload.nvme_param_reads, 0u) << where;
          }
          if (buffers == 2 && model == 0) {
            EXPECT_GT(nvme.offload.nvme_param_reads_ahead, 0u) << where;
          }
          ExpectEmptyDir(dir, where);
        }
    }
}

// Prefetch off, and reshard_after_forward off (the gathered copy kept from
// forward to backward): the same training.
TEST_F(NvmeParamTest, PrefetchOffAndKeptGathersAreBitwise) {
  const std::string dir = NvmeDir();
  for (int variant = 0; variant < 2; variant++) {
    TrainConfig cfg = Stage3(ZS_BFLOAT16, 3);
    cfg.prefetch_depth = variant == 0 ? 0 : 3;
    cfg.reshard_after_forward = variant == 0 ? 1 : 0;
    auto m1 = MakeTransformer();
    TrainResult plain = TrainSharded(*m1, cfg);
    ASSERT_EQ(plain.status, ZS_OK) << plain.error;
    cfg.offload = 2;
    cfg.offload_param = 2;
    cfg.nvme.path = dir.c_str();
    cfg.nvme.param_buffer_count = 2;
    auto m2 = MakeTransformer();
    TrainResult nvme = TrainSharded(*m2, cfg);
    const std::string where = variant == 0 ? "prefetch off" : "kept gathers";
    ASSERT_EQ(nvme.status, ZS_OK) << where << ": " << nvme.error;
    ExpectSameTraining(plain, nvme, *m1, where);
    ExpectEmptyDir(dir, where);
  }
}

// 3 steps + save + load + 3 steps equals 6 straight steps bitwise, and the
// checkpoint (the same format) continues bitwise without offload.
TEST_F(NvmeParamTest, CheckpointsResumeBitwise) {
  const std::string dir = NvmeDir();
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string ck = std::string(t != nullptr ? t : "/tmp") + "/nvme-param-ckpt";
  for (zs_dtype dtype : {ZS_FLOAT32, ZS_BFLOAT16}) {
    const std::string what = zs_dtype_name(dtype);
    TrainConfig cfg = Stage3(dtype, 0);
    cfg.nvme.path = dir.c_str();
    cfg.nvme.param_buffer_count = 1;
    auto run = [&](int first, int steps, const std::string& load,
                   const std::string& save, int offload) {
      cfg.offload = offload;
      cfg.offload_param = offload ? 2 : 0;
      auto m = MakeTransformer();
      return TrainSlice(*m, cfg, first, steps, load, save, what);
    };
    const std::string root = ck + what;
    TrainResult straight = run(0, 6, "", "", 2);
    TrainResult straight_plain = run(0, 6, "", "", 0);
    run(0, 3, "", root, 2);
    TrainResult resumed = run(3, 3, root, "", 2);
    TrainResult plain = run(3, 3, root, "", 0);
    auto m = MakeTransformer();
    ExpectSameTraining(straight_plain, straight, *m, what + " straight");
    ExpectSameTensors(straight, resumed, *m, what + " resumed with NVMe");
    ExpectSameTensors(straight, plain, *m, what + " resumed without offload");
    for (int s = 0; s < 3; s++)
      EXPECT_EQ(straight.losses[3 + s], resumed.losses[s]) << what << " step " << s;
    ExpectEmptyDir(dir, what);
  }
}

// Fault injection on the parameter swap file of one rank: the n-th read at
// offset 0 (unit 0's shard; with one buffer it is re-read at each use),
// or any write (the step's write-back).
long g_kind = 0;  // 1: the 2nd read at offset 0 fails, 2: comes back short,
                  // 3: a write fails
int g_reads = 0;
long ParamFault(const char* path, uint64_t offset, int write, size_t bytes,
                long result) {
  if (strstr(path, "params-") == nullptr) return result;
  if (g_kind == 3 && write) return -EIO;
  if (g_kind != 3 && !write && offset == 0 && ++g_reads == 2)
    return g_kind == 1 ? -EIO : (long)bytes / 2;
  return result;
}

// Read errors surface in the all-gather that needed the shard: every rank
// agrees on the read before the collective, so none is left waiting in
// it; a write error fails the step on every rank, which then refuses
// further steps until a checkpoint is loaded. The failing rank names the
// file and the offset; the others fail cleanly (ZS_ERR_REMOTE).
TEST_F(NvmeParamTest, DiskErrorsFailEveryRankNamingFileAndOffset) {
  const std::string dir = NvmeDir();
  for (long kind : {1L, 2L, 3L}) {
    const std::string what = kind == 1 ? "read error" : kind == 2 ? "short read"
                                                                  : "write error";
    zs_context* ctx = nullptr;
    zs_model* m = nullptr;
    int u[2];
    ASSERT_NO_FATAL_FAILURE(TwoUnits(dir, &ctx, &m, u));
    // zs_model_init writes whole shards without reading them; with one
    // buffer the first read at offset 0 is the forward's gather of unit
    // "a", the second (the failing one) the backward's
    auto init = [](void*, int, const zs_tensor_desc* d, void* data) {
      for (size_t k = 0; k < d->numel; k++) static_cast<float*>(data)[k] = 0.5f;
      return ZS_OK;
    };
    ASSERT_EQ(zs_model_init(m, init, nullptr), ZS_OK) << zs_last_error();
    const int bad = world_ - 1;
    g_kind = kind;
    g_reads = 0;
    if (rank_ == bad) zs__aio_fault_hook = ParamFault;
    zs_status st = ZS_OK;
    for (int i = 0; i < 2 && st == ZS_OK; i++) {
      st = zs_unit_gather(m, u[i]);
      if (st == ZS_OK) st = zs_unit_release(m, u[i]);
    }
    for (int i = 1; i >= 0 && st == ZS_OK; i--) {
      st = zs_unit_gather(m, u[i]);
      if (st == ZS_OK) st = zs_unit_grad_acquire(m, u[i]);
      if (st == ZS_OK) st = zs_unit_grad_release(m, u[i]);
      if (st == ZS_OK) st = zs_unit_release(m, u[i]);
    }
    const bool in_step = st == ZS_OK;
    if (st == ZS_OK) st = zs_step(m, nullptr);
    zs__aio_fault_hook = nullptr;
    const std::string err = zs_last_error();
    EXPECT_EQ(in_step, kind == 3) << what << ": " << err;
    if (rank_ == bad) {
      EXPECT_EQ(st, ZS_ERR_IO) << what << ": " << err;
      EXPECT_NE(err.find("params-0.swap"), std::string::npos) << err;
      EXPECT_NE(err.find(" at offset 0 of "), std::string::npos) << err;
      if (kind != 3) {
        EXPECT_NE(err.find("gather of unit 'a'"), std::string::npos) << err;
      }
    } else {
      EXPECT_EQ(st, ZS_ERR_REMOTE) << what << ": " << err;
    }
    if (kind == 3) {  // the shards on disk may be stale now: refused
      EXPECT_EQ(zs_step(m, nullptr), ZS_ERR_INVALID_STATE) << what;
    }
    zs_model_destroy(m);
    zs_context_destroy(ctx);
    ExpectEmptyDir(dir, what);
  }
}

// zs_context_remove_files (for abnormal ends) unlinks the context's swap
// file and swap directory at once, and only its own; the file stays open,
// so the model trains on (the same values as an untouched twin) and the
// destroy after it is clean; a context without NVMe and NULL are no-ops.
TEST_F(NvmeParamTest, RemoveFilesUnlinksEverythingAndTrainingGoesOn) {
  const std::string dir = NvmeDir();
  zs_context* ctx[2] = {nullptr, nullptr};
  zs_model* m[2] = {nullptr, nullptr};
  int u[2][2];
  auto init = [](void*, int, const zs_tensor_desc* d, void* data) {
    for (size_t k = 0; k < d->numel; k++) static_cast<float*>(data)[k] = 0.25f + 1e-3f * k;
    return ZS_OK;
  };
  for (int i = 0; i < 2; i++) {
    ASSERT_NO_FATAL_FAILURE(TwoUnits(dir, &ctx[i], &m[i], u[i]));
    ASSERT_EQ(zs_model_init(m[i], init, nullptr), ZS_OK) << zs_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(DirEntries(dir), 2u * world_) << "two contexts' swap directories per rank";
  MPI_Barrier(MPI_COMM_WORLD);
  zs_context_remove_files(ctx[0]);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(DirEntries(dir), 1u * world_) << "only the untouched context's";
  // train both two steps; the one without names equals its twin
  for (int i = 0; i < 2; i++)
    for (int step = 0; step < 2; step++) {
      for (int k = 1; k >= 0; k--) {
        float* g = nullptr;
        ASSERT_EQ(zs_unit_gather(m[i], u[i][k]), ZS_OK) << zs_last_error();
        ASSERT_EQ(zs_unit_grad_acquire(m[i], u[i][k]), ZS_OK) << zs_last_error();
        zs_tensor_desc d;
        ASSERT_EQ(zs_model_tensor_desc(m[i], k, &d), ZS_OK);
        ASSERT_EQ(zs_tensor_grad(m[i], k, (void**)&g), ZS_OK) << zs_last_error();
        for (size_t e = 0; e < d.numel; e++) g[e] = 1e-2f * (float)((e + step) % 7);
        ASSERT_EQ(zs_unit_grad_release(m[i], u[i][k]), ZS_OK) << zs_last_error();
        ASSERT_EQ(zs_unit_release(m[i], u[i][k]), ZS_OK) << zs_last_error();
      }
      ASSERT_EQ(zs_step(m[i], nullptr), ZS_OK) << zs_last_error();
    }
  const size_t n = TwoUnitsNumel(world_);
  for (int k = 0; k < 2; k++) {
    std::vector<float> a(n), b(n);
    ASSERT_EQ(zs_tensor_get(m[0], k, ZS_FIELD_PARAM, a.data()), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_tensor_get(m[1], k, ZS_FIELD_PARAM, b.data()), ZS_OK) << zs_last_error();
    EXPECT_EQ(0, memcmp(a.data(), b.data(), n * sizeof(float))) << "tensor " << k;
  }
  for (int i = 0; i < 2; i++) {
    zs_model_destroy(m[i]);
    zs_context_destroy(ctx[i]);
  }
  ExpectEmptyDir(dir, "after remove_files and destroy");
  zs_context_remove_files(nullptr);
  zs_config c = ZS_CONFIG_INIT;
  zs_context* plain = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &plain), ZS_OK);
  zs_context_remove_files(plain);
  zs_context_destroy(plain);
}

// Tiny sub-groups: each one's regions are rounded up to 4 KiB in the swap
// file (1 element: 4096 bytes per field), which the engine says once with
// the sizes; a sub-group of 1024 fp32 elements has no rounding to say.
TEST_F(NvmeParamTest, TinySubGroupsInflatingTheFileAreWarned) {
  if (rank_ != 0) GTEST_SKIP() << "a local context, on rank 0";
  const std::string dir = NvmeDir();
  for (size_t sub : {(size_t)1, (size_t)1024}) {
    zs_config c = ZS_CONFIG_INIT;
    c.offload_optimizer.device = ZS_OFFLOAD_NVME;
    c.nvme.path = dir.c_str();
    c.nvme.sub_group_size = sub;
    c.log_level = ZS_LOG_WARN;
    zs_context* ctx = nullptr;
    zs_model* m = nullptr;
    ASSERT_EQ(zs_context_create_local(&c, &ctx), ZS_OK) << zs_last_error();
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    int u = -1, t = -1;
    int64_t n = 2048;
    ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
    ::testing::internal::CaptureStderr();
    const zs_status st = zs_model_finalize(m);
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_EQ(st, ZS_OK) << zs_last_error();
    zs_offload_info oi{};
    ASSERT_EQ(zs_offload_info_get(ctx, &oi), ZS_OK);
    // AdamW on fp32: two fields of 2048 elements
    EXPECT_EQ(oi.nvme_file_bytes, sub == 1 ? 2u * 2048u * 4096u : 2u * 2048u * 4u) << sub;
    if (std::getenv("ZS_LOG_LEVEL") == nullptr) {
      if (sub == 1)
        EXPECT_NE(err.find("sub_group_size 1: the swap file takes 16777216 bytes for "
                           "16384 bytes of states"), std::string::npos) << err;
      else
        EXPECT_EQ(err.find("sub_group_size"), std::string::npos) << err;
    }
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// The queue returns each failure to one wait, which may be another
// caller's. A shard whose read or write failed while someone else
// consumed the error is still never trusted: the buffer pool notices the
// failure count moved and does the transfer again.
long g_fail_offset = -1;  // fail the next transfer at this offset (once)
int g_fail_write = 0;
int g_transfers_at = 0;   // transfers seen at that offset
long FailOnceAt(const char* path, uint64_t offset, int write, size_t, long result) {
  if (strstr(path, "params-") == nullptr || (long)offset != g_fail_offset ||
      write != g_fail_write)
    return result;
  g_transfers_at++;
  return g_transfers_at == 1 ? -EIO : result;
}

TEST_F(NvmeParamTest, AFailureReportedToAnotherWaiterIsStillCaught) {
  const std::string dir = NvmeDir();
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int u[2];
  ASSERT_NO_FATAL_FAILURE(TwoUnits(dir, &ctx, &m, u));
  const size_t n = TwoUnitsNumel(world_);
  auto init = [](void*, int tensor, const zs_tensor_desc* d, void* data) {
    for (size_t k = 0; k < d->numel; k++) static_cast<float*>(data)[k] = tensor ? 0.5f : 0.25f;
    return ZS_OK;
  };
  ASSERT_EQ(zs_model_init(m, init, nullptr), ZS_OK) << zs_last_error();
  zs__unit* a = &m->units[u[0]];
  zs__unit* b = &m->units[u[1]];
  zs__aio* aio = zs__nvme_aio(ctx->engine->nvme);
  const long b_offset = (long)((a->layout.shard * 4 + 4095) / 4096 * 4096);
  auto expect_b = [&](const std::string& what) {
    ASSERT_EQ(zs__param_acquire(m, b), ZS_OK) << what << ": " << zs_last_error();
    const float* v = (const float*)b->params_shard;
    const size_t begin = zs__layout_shard_begin(&b->layout, rank_);
    for (size_t k = 0; k < b->layout.shard && begin + k < n; k++)
      ASSERT_EQ(v[k], 0.5f) << what << " [" << k << "]";
    zs__param_release(m, b);
  };
  zs__aio_fault_hook = FailOnceAt;
  // a read ahead of "b" fails; another wait takes the error
  ASSERT_EQ(zs__param_acquire(m, a), ZS_OK) << zs_last_error();  // "a" in the buffer
  zs__param_release(m, a);
  g_fail_offset = b_offset;
  g_fail_write = 0;
  g_transfers_at = 0;
  EXPECT_EQ(zs__param_read_ahead(m, u[1]), 1);
  EXPECT_EQ(zs__aio_wait(aio), ZS_ERR_IO);  // someone else's wait
  expect_b("read failed, reported elsewhere");
  EXPECT_EQ(g_transfers_at, 2) << "the read was not done again";
  // a write-back of "b" fails; another wait takes the error; the buffer
  // goes to "a", and "b" read back is what was written
  g_transfers_at = 0;
  g_fail_write = 1;
  ASSERT_EQ(zs__param_acquire(m, b), ZS_OK);
  for (size_t k = 0; k < b->layout.shard; k++) ((float*)b->params_shard)[k] = 0.5f;
  ASSERT_EQ(zs__param_write_back(m, b), ZS_OK);
  zs__param_release(m, b);
  EXPECT_EQ(zs__aio_wait(aio), ZS_ERR_IO);
  // a read-ahead never takes a buffer whose changes may not be on disk
  EXPECT_EQ(zs__param_read_ahead(m, u[0]), 0);
  EXPECT_EQ(g_transfers_at, 1);
  ASSERT_EQ(zs__param_acquire(m, a), ZS_OK) << zs_last_error();
  zs__param_release(m, a);
  EXPECT_EQ(g_transfers_at, 2) << "the write was not done again";
  g_fail_offset = -1;
  expect_b("write failed, reported elsewhere");
  zs__aio_fault_hook = nullptr;
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  ExpectEmptyDir(dir, "failures reported elsewhere");
}

TEST_F(NvmeParamTest, BadConfigurationsAreRefusedNamingTheField) {
  const std::string dir = NvmeDir();
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.offload_optimizer.device = ZS_OFFLOAD_CPU;
  c.offload_param = ZS_OFFLOAD_NVME;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);  // no path
  EXPECT_NE(std::string(zs_last_error()).find("config.nvme.path"), std::string::npos)
      << zs_last_error();
  c.nvme.path = dir.c_str();
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();
  c.nvme.param_buffer_count = 0;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("param_buffer_count"), std::string::npos);
  c.nvme.param_buffer_count = 5000;
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("param_buffer_count"), std::string::npos);
  c.nvme.param_buffer_count = 5;
  c.stage = 2;  // parameter shards exist at stage 3 only
  EXPECT_EQ(zs_config_validate(&c), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_param"), std::string::npos);
  c.stage = 3;
  c.device = ZS_DEVICE_CUDA;  // with a GPU too (staged through the host)
  EXPECT_EQ(zs_config_validate(&c), ZS_OK) << zs_last_error();

  // A buffer smaller than a unit's shard fails finalize on every rank,
  // naming the unit, and leaves nothing behind.
  c.device = ZS_DEVICE_HOST;
  c.nvme.param_buffer_elements = 1024;  // elements, as DeepSpeed's buffer_size
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK) << zs_last_error();
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  int u = -1, t = -1;
  int64_t n = 1024 * world_ + 1;  // a shard of 1025 elements
  ASSERT_EQ(zs_model_add_unit(m, "big", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  EXPECT_NE(zs_model_finalize(m), ZS_OK);
  EXPECT_NE(std::string(zs_last_error()).find("'big'"), std::string::npos)
      << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  EXPECT_NE(std::string(zs_last_error()).find("param_buffer_elements"), std::string::npos)
      << zs_last_error();
  ExpectEmptyDir(dir, "param_buffer_elements too small");

  // A path that is not a directory fails the context on every rank, naming
  // the path and the setting.
  const std::string file = dir + "/not-a-dir-" + std::to_string(rank_);
  { std::ofstream(file) << "x"; }
  c.nvme.param_buffer_elements = 0;
  c.nvme.path = file.c_str();
  ctx = nullptr;
  EXPECT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_ERR_IO);
  EXPECT_EQ(ctx, nullptr);
  const std::string msg = zs_last_error();
  EXPECT_NE(msg.find("cannot create the swap directory " + file + "/zs-"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("(config.nvme.path " + file + "): Not a directory"),
            std::string::npos) << msg;
  unlink(file.c_str());
}

}  // namespace
