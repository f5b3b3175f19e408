// Shared-memory host collectives (runtime/comm/comm_shm.c) at 1-4 and 8
// ranks:
//  - every collective the engine issues, on a communicator with the
//    segment and one without, against exact references: the fixed-order
//    reduce-scatter (fp32, bf16, fp16; the mean and the plain sum; one
//    round and many, uneven sizes, a bucket inside a larger buffer) bitwise
//    the MPI path's exchange and sum, all-gathers (separate and in place,
//    strided) and broadcasts exact, all-reduces bitwise a rank-order sum
//    (and max for integers);
//  - ranks that issue different collectives fail with ZS_ERR_MISMATCH
//    naming both, at once, instead of mixing data;
//  - a segment that cannot be made (a directory that does not exist; a
//    full tmpfs, run by shm_full_test.sh): AUTO falls back to MPI
//    (zs_context_config says so) and trains, SHM fails on every rank
//    naming the path and the error;
//  - the choice and the accounting: AUTO picks shm with more than one
//    rank, and comm_segment holds what the estimator says;
//  - training at stages 0-3, fp32 and bf16 with loss scaling, clipping and
//    accumulation: bitwise the same with shm and with MPI.
// A rank dying inside a shared-memory collective: heartbeat_test.sh.
#include <stdlib.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/comm_shm.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/core/core_mem.h"
#include "runtime/device/device.h"
#include "tests/runtime/test_harness.h"
#include "tests/runtime/test_models.h"
#include "tests/testing/mpi_test.h"

namespace {

using zstest::TrainConfig;
using zstest::TrainResult;

// A communicator over MPI_COMM_WORLD with the given host collectives.
struct Comm {
  zs__accounting* acct = nullptr;
  zs__device* dev = nullptr;
  zs__comm* c = nullptr;
  size_t segment = 0;
  zs_status st = ZS_OK;
  explicit Comm(zs_host_collectives mode) {
    st = zs__accounting_create(&acct);
    if (st == ZS_OK) st = zs__device_host_create(acct, &dev);
    if (st == ZS_OK) st = zs__comm_mpi_create(MPI_COMM_WORLD, &c);
    if (st == ZS_OK) {
      c->dev = dev;
      st = zs__comm_mpi_host_collectives(c, mode, &segment);
    }
  }
  ~Comm() {
    if (c != nullptr) zs__comm_destroy(c);
    zs__device_destroy(dev);
    zs__accounting_destroy(acct);
  }
};

class ShmTest : public ZsMpiTest {
 protected:
  void SetUp() override {
    ZsMpiTest::SetUp();
    unsetenv("ZS_HOST_COLLECTIVES");  // the configs below say which
  }
  static bool Contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  }
};

// Rank r's element i: distinct, not exactly summable in any order.
float Value(int r, size_t i) {
  return 1.0f / (float)(1 + (i * 7 + (size_t)r * 13) % 97) +
         (float)r * 0.3f - (float)(i % 5) * 1.7f;
}

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// The fixed-order reduce-scatter of a bucket (rank r's chunk at r * stride
// + offset of a buffer of W * stride elements) on comm c, into dst.
zs_status ReduceScatter(zs__comm* c, const std::vector<uint8_t>& send,
                        size_t offset, size_t stride, size_t chunk,
                        float divisor, zs_dtype dtype,
                        std::vector<uint8_t>* dst) {
  dst->assign(chunk * zs_dtype_size(dtype) + 1, 0xAB);
  zs__coll* op = nullptr;
  zs_status st = zs__comm_ireduce_scatter(
      c, zs__tag(ZS__P_REDUCE, -1, nullptr), ZS__REDUCE_FIXED, send.data(),
      offset, stride, chunk, dst->data(), divisor, dtype, &op);
  return st == ZS_OK ? zs__coll_wait(c, op) : st;
}

TEST_F(ShmTest, ReduceScatterIsBitwiseTheMpiPath) {
  Comm shm(ZS_HOST_COLLECTIVES_SHM), mpi(ZS_HOST_COLLECTIVES_MPI);
  ASSERT_EQ(shm.st, ZS_OK) << zs_last_error();
  ASSERT_EQ(mpi.st, ZS_OK) << zs_last_error();
  EXPECT_EQ(shm.segment, world_ > 1 ? ZS__SHM_LANES * ZS__SHM_RANK_BYTES : 0u);
  const size_t W = (size_t)world_;
  // one element; uneven; one round; several rounds (a round carries
  // ZS__SHM_HALF_BYTES / (W * 4) fp32 elements per rank)
  const size_t many = 3 * ZS__SHM_HALF_BYTES / (W * 4) + 17;
  for (zs_dtype dt : {ZS_FLOAT32, ZS_BFLOAT16, ZS_FLOAT16})
    for (size_t chunk : {(size_t)0, (size_t)1, (size_t)37, (size_t)4096, many})
      for (float divisor : {1.0f, (float)world_}) {
        const size_t offset = 5, stride = chunk + 11, e = zs_dtype_size(dt);
        std::vector<float> f(W * stride);
        for (size_t i = 0; i < f.size(); i++) f[i] = Value(rank_, i);
        std::vector<uint8_t> send(W * stride * e);
        ASSERT_EQ(zs_convert(send.data(), dt, f.data(), ZS_FLOAT32, f.size()),
                  ZS_OK);
        std::vector<uint8_t> a, b;
        ASSERT_EQ(ReduceScatter(shm.c, send, offset, stride, chunk, divisor,
                                dt, &a), ZS_OK) << zs_last_error();
        ASSERT_EQ(ReduceScatter(mpi.c, send, offset, stride, chunk, divisor,
                                dt, &b), ZS_OK) << zs_last_error();
        EXPECT_EQ(a, b) << zs_dtype_name(dt) << " chunk " << chunk
                        << " divisor " << divisor;
        EXPECT_EQ(a.back(), 0xAB) << "wrote past the chunk";
        if (dt != ZS_FLOAT32 || chunk == 0) continue;
        // and the rank-order sum computed here
        std::vector<float> want(chunk);
        for (size_t i = 0; i < chunk; i++) {
          const size_t at = (size_t)rank_ * stride + offset + i;
          float v = Value(0, at);
          for (int r = 1; r < world_; r++) v += Value(r, at);
          want[i] = divisor != 1.0f ? v / divisor : v;
        }
        EXPECT_EQ(Bytes(a.data(), chunk * 4), Bytes(want.data(), chunk * 4))
            << "chunk " << chunk;
      }
}

TEST_F(ShmTest, GathersAndBroadcastsAreExact) {
  Comm shm(ZS_HOST_COLLECTIVES_SHM);
  ASSERT_EQ(shm.st, ZS_OK) << zs_last_error();
  zs__comm* c = shm.c;
  const size_t W = (size_t)world_;
  const auto tag = zs__tag(ZS__P_CHECK, -1, nullptr);
  for (size_t n : {(size_t)0, (size_t)1, (size_t)1001,
                   2 * ZS__SHM_HALF_BYTES / 4 + 3}) {
    std::vector<float> mine(n), out(W * n + 1, -1.0f), want(W * n);
    for (size_t i = 0; i < n; i++) mine[i] = Value(rank_, i);
    for (size_t r = 0; r < W; r++)
      for (size_t i = 0; i < n; i++) want[r * n + i] = Value((int)r, i);
    zs__coll* op = nullptr;
    ASSERT_EQ(zs__comm_iall_gather(c, tag, mine.data(), out.data(), n,
                                   ZS_FLOAT32, &op), ZS_OK);
    ASSERT_EQ(zs__coll_wait(c, op), ZS_OK) << zs_last_error();
    EXPECT_EQ(Bytes(out.data(), W * n * 4), Bytes(want.data(), W * n * 4))
        << "all-gather of " << n;
    EXPECT_EQ(out.back(), -1.0f);
    // in place: this rank's block already in the output
    std::vector<float> inplace(W * n, 0.0f);
    std::memcpy(inplace.data() + (size_t)rank_ * n, mine.data(), n * 4);
    ASSERT_EQ(zs__comm_iall_gather(c, tag, ZS__IN_PLACE, inplace.data(), n,
                                   ZS_FLOAT32, &op), ZS_OK);
    ASSERT_EQ(zs__coll_wait(c, op), ZS_OK) << zs_last_error();
    EXPECT_EQ(inplace, want) << "in-place all-gather of " << n;
    // strided: every rank's chunk of n at r * (n + 9) + 4
    const size_t stride = n + 9, offset = 4;
    std::vector<float> buf(W * stride, 7.0f);
    for (size_t i = 0; i < n; i++)
      buf[(size_t)rank_ * stride + offset + i] = mine[i];
    ASSERT_EQ(zs__comm_iall_gather_strided(c, tag, buf.data(), offset, stride,
                                           n, ZS_FLOAT32, &op), ZS_OK);
    ASSERT_EQ(zs__coll_wait(c, op), ZS_OK) << zs_last_error();
    for (size_t r = 0; r < W; r++)
      for (size_t i = 0; i < stride; i++) {
        const bool in = i >= offset && i < offset + n;
        const float v = in ? Value((int)r, i - offset) : 7.0f;
        if (buf[r * stride + i] != v) {
          ADD_FAILURE() << "strided all-gather of " << n << ": rank " << r
                        << " element " << i;
          r = W;
          break;
        }
      }
    // broadcast from every root
    for (int root = 0; root < world_; root++) {
      std::vector<double> b(n, (double)rank_);
      for (size_t i = 0; rank_ == root && i < n; i++) b[i] = Value(root, i);
      ASSERT_EQ(zs__comm_broadcast(c, tag, b.data(), n, ZS_FLOAT64, root),
                ZS_OK) << zs_last_error();
      for (size_t i = 0; i < n; i++)
        if (b[i] != (double)Value(root, i)) {
          ADD_FAILURE() << "broadcast of " << n << " from " << root
                        << ": element " << i;
          break;
        }
    }
  }
}

TEST_F(ShmTest, AllReducesSumInRankOrder) {
  Comm shm(ZS_HOST_COLLECTIVES_SHM);
  ASSERT_EQ(shm.st, ZS_OK) << zs_last_error();
  const auto tag = zs__tag(ZS__P_CHECK, -1, nullptr);
  for (size_t n : {(size_t)1, (size_t)3, (size_t)999,
                   ZS__SHM_HALF_BYTES / 4 * 2 + 5}) {
    std::vector<float> v(n), want(n);
    std::vector<double> d(n), dwant(n);
    for (size_t i = 0; i < n; i++) {
      v[i] = Value(rank_, i);
      d[i] = (double)Value(rank_, i) / 3.0;
      float s = Value(0, i);
      double ds = (double)Value(0, i) / 3.0;
      for (int r = 1; r < world_; r++) {
        s += Value(r, i);
        ds += (double)Value(r, i) / 3.0;
      }
      want[i] = s;
      dwant[i] = ds;
    }
    ASSERT_EQ(zs__comm_all_reduce(shm.c, tag, ZS__IN_PLACE, v.data(), n,
                                  ZS_FLOAT32, ZS__RED_SUM), ZS_OK)
        << zs_last_error();
    EXPECT_EQ(Bytes(v.data(), n * 4), Bytes(want.data(), n * 4)) << n;
    std::vector<double> dout(n);
    ASSERT_EQ(zs__comm_all_reduce(shm.c, tag, d.data(), dout.data(), n,
                                  ZS_FLOAT64, ZS__RED_SUM), ZS_OK);
    EXPECT_EQ(Bytes(dout.data(), n * 8), Bytes(dwant.data(), n * 8)) << n;
    // integers: max and min
    std::vector<uint64_t> u(n), umax(n);
    std::vector<int64_t> s(n), smin(n);
    for (size_t i = 0; i < n; i++) {
      u[i] = (uint64_t)((i * 31 + (size_t)rank_ * 17) % 101);
      s[i] = -(int64_t)u[i];
      uint64_t m = 0;
      for (int r = 0; r < world_; r++) {
        const uint64_t x = (uint64_t)((i * 31 + (size_t)r * 17) % 101);
        m = x > m ? x : m;
      }
      umax[i] = m;
      smin[i] = -(int64_t)m;
    }
    ASSERT_EQ(zs__comm_all_reduce(shm.c, tag, ZS__IN_PLACE, u.data(), n,
                                  ZS_UINT64, ZS__RED_MAX), ZS_OK);
    ASSERT_EQ(zs__comm_all_reduce(shm.c, tag, ZS__IN_PLACE, s.data(), n,
                                  ZS_INT64, ZS__RED_MIN), ZS_OK);
    EXPECT_EQ(u, umax) << n;
    EXPECT_EQ(s, smin) << n;
  }
}

// Rank 0 gathers 10 elements where the others gather 11: every rank fails
// at once naming the difference (no data is mixed, nothing hangs).
TEST_F(ShmTest, CollectivesThatDoNotPairUpFailEveryRank) {
  if (world_ < 2) GTEST_SKIP() << "needs two ranks";
  Comm shm(ZS_HOST_COLLECTIVES_SHM);
  ASSERT_EQ(shm.st, ZS_OK) << zs_last_error();
  shm.c->timeout_s = 60;
  const size_t n = rank_ == 0 ? 10 : 11;
  std::vector<float> mine(n, 1.0f), out(n * (size_t)world_);
  const double t0 = MPI_Wtime();
  zs_status st = zs__comm_all_gather(shm.c, zs__tag(ZS__P_CHECK, -1, nullptr),
                                     mine.data(), out.data(), n, ZS_FLOAT32);
  const double dt = MPI_Wtime() - t0;
  EXPECT_NE(st, ZS_OK);
  const std::string err = zs_last_error();
  EXPECT_TRUE(Contains(err, "do not pair up") ||
              Contains(err, "another rank failed"))
      << err;
  EXPECT_TRUE(Contains(err, "all-gather of 10 ") ||
              Contains(err, "all-gather of 11 ") || Contains(err, "rank "))
      << err;
  EXPECT_LT(dt, 10.0) << "failed only after " << dt << " s";
  if (getenv("ZS_TEST_PRINT")) printf("rank %d: %s\n", rank_, err.c_str());
}

zs_status CreateContext(zs_host_collectives mode, zs_context** ctx) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.host_collectives = mode;
  return zs_context_create_mpi(&c, MPI_COMM_WORLD, ctx);
}

TEST_F(ShmTest, AutoPicksSharedMemoryAndAccountsForIt) {
  zs_context* ctx = nullptr;
  ASSERT_EQ(CreateContext(ZS_HOST_COLLECTIVES_AUTO, &ctx), ZS_OK)
      << zs_last_error();
  const zs_host_collectives want =
      world_ > 1 ? ZS_HOST_COLLECTIVES_SHM : ZS_HOST_COLLECTIVES_MPI;
  EXPECT_EQ(zs_context_config(ctx)->host_collectives, want);
  zs_memory_stats ms{};
  zs_memory_stats_get(ctx, &ms);
  // the estimator's figure for these ranks on one host
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = world_;
  in.nodes = 1;
  zs_memory_estimate est{};
  est.struct_size = sizeof est;
  ASSERT_EQ(zs_estimate_from_params(1e6, &cfg, &in, &est), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(ms.current[ZS_MEM_COMM_SEGMENT], est.bytes[ZS_MEM_COMM_SEGMENT]);
  EXPECT_EQ(ms.current[ZS_MEM_COMM_SEGMENT],
            world_ > 1 ? ZS__SHM_LANES * ZS__SHM_RANK_BYTES : 0u);
  zs_context_destroy(ctx);
  // forced MPI: no segment, and the estimator knows
  ASSERT_EQ(CreateContext(ZS_HOST_COLLECTIVES_MPI, &ctx), ZS_OK);
  EXPECT_EQ(zs_context_config(ctx)->host_collectives, ZS_HOST_COLLECTIVES_MPI);
  zs_memory_stats_get(ctx, &ms);
  EXPECT_EQ(ms.current[ZS_MEM_COMM_SEGMENT], 0u);
  cfg.host_collectives = ZS_HOST_COLLECTIVES_MPI;
  ASSERT_EQ(zs_estimate_from_params(1e6, &cfg, &in, &est), ZS_OK);
  EXPECT_EQ(est.bytes[ZS_MEM_COMM_SEGMENT], 0u);
  zs_context_destroy(ctx);
}

TEST_F(ShmTest, ASegmentThatCannotBeMadeFallsBackOrFails) {
  if (world_ < 2) GTEST_SKIP() << "one rank makes no segment";
  setenv("ZS_SHM_DIR", "/nonexistent/zeroshard-shm", 1);
  zs_context* ctx = nullptr;
  ASSERT_EQ(CreateContext(ZS_HOST_COLLECTIVES_AUTO, &ctx), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(zs_context_config(ctx)->host_collectives, ZS_HOST_COLLECTIVES_MPI)
      << "auto falls back to MPI";
  // and the fallback works
  zs_model* m = nullptr;
  int u = -1, t = -1;
  int64_t n = 100;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "u", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_tensor(m, u, "w", 1, &n, ZS_FLOAT32, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);
  zs_status st = CreateContext(ZS_HOST_COLLECTIVES_SHM, &ctx);
  EXPECT_EQ(st, ZS_ERR_IO);
  EXPECT_EQ(ctx, nullptr);
  const std::string err = zs_last_error();
  EXPECT_TRUE(Contains(err, "/nonexistent/zeroshard-shm") &&
              Contains(err, "host_collectives shm") &&
              Contains(err, "No such file or directory"))
      << err;
  if (getenv("ZS_TEST_PRINT")) printf("rank %d: %s\n", rank_, err.c_str());
  unsetenv("ZS_SHM_DIR");
}

// Run by shm_full_test.sh, with ZS_TEST_SHM_FULL_DIR a 1 MiB tmpfs: the
// segments do not fit. AUTO falls back to MPI and trains; SHM fails on
// every rank naming the path and the error.
TEST_F(ShmTest, AFullFileSystemFallsBackOrFails) {
  const char* dir = getenv("ZS_TEST_SHM_FULL_DIR");
  if (dir == nullptr || world_ < 2)
    GTEST_SKIP() << "run by shm_full_test.sh (a full tmpfs, 2+ ranks)";
  setenv("ZS_SHM_DIR", dir, 1);
  zs_context* ctx = nullptr;
  ASSERT_EQ(CreateContext(ZS_HOST_COLLECTIVES_AUTO, &ctx), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(zs_context_config(ctx)->host_collectives, ZS_HOST_COLLECTIVES_MPI);
  zs_context_destroy(ctx);
  TrainConfig cfg;
  cfg.stage = 3;
  cfg.steps = 3;
  auto m = zstest::MakeTransformer();
  TrainResult r = zstest::TrainSharded(*m, cfg);
  EXPECT_EQ(r.status, ZS_OK) << r.error;
  zs_status st = CreateContext(ZS_HOST_COLLECTIVES_SHM, &ctx);
  EXPECT_EQ(st, ZS_ERR_IO);
  EXPECT_EQ(ctx, nullptr);
  const std::string err = zs_last_error();
  EXPECT_TRUE(Contains(err, dir) && Contains(err, "No space left on device") &&
              Contains(err, "ZS_SHM_DIR"))
      << err;
  unsetenv("ZS_SHM_DIR");
}

TEST_F(ShmTest, TrainingIsBitwiseTheSameOnMpi) {
  struct Case {
    const char* name;
    void (*set)(TrainConfig*);
  };
  const Case cases[] = {
      {"fp32", [](TrainConfig*) {}},
      {"fp32 clip accumulate",
       [](TrainConfig* c) {
         c->max_grad_norm = 0.05;
         c->grad_accum = 2;
       }},
      {"bf16 loss scale",
       [](TrainConfig* c) {
         c->param_dtype = ZS_BFLOAT16;
         c->loss_scaler = ZS_LOSS_SCALE_DYNAMIC;
       }},
      {"small buckets, backend order",
       [](TrainConfig* c) {
         c->bucket_elements = 37;
         c->reduce_order = ZS_REDUCE_BACKEND;
       }},
  };
  for (const Case& k : cases)
    for (int stage = 0; stage <= 3; stage++) {
      TrainConfig cfg;
      cfg.stage = stage;
      cfg.steps = 4;
      k.set(&cfg);
      if (cfg.grad_accum > 1 && cfg.global_batch % (world_ * cfg.grad_accum))
        continue;
      std::vector<TrainResult> runs;
      for (int mode : {ZS_HOST_COLLECTIVES_SHM, ZS_HOST_COLLECTIVES_MPI}) {
        cfg.host_collectives = mode;
        auto m = zstest::MakeTransformer();
        runs.push_back(zstest::TrainSharded(*m, cfg));
        ASSERT_EQ(runs.back().status, ZS_OK) << runs.back().error;
      }
      auto m = zstest::MakeTransformer();
      if (cfg.reduce_order == ZS_REDUCE_BACKEND) {
        // MPI's reduce-scatter adds in an order of its own: the shm one
        // in rank order, so within the overlap test's tolerance
        for (size_t t = 0; t < runs[0].params.size(); t++)
          EXPECT_TRUE(zstest::CloseByNorm(runs[0].params[t],
                                          runs[1].params[t], 1e-5))
              << k.name << " stage " << stage << " tensor " << t;
        continue;
      }
      zstest::ExpectSameTraining(runs[0], runs[1], *m,
                                 std::string(k.name) + " stage " +
                                     std::to_string(stage) + " shm vs mpi");
    }
}

}  // namespace
