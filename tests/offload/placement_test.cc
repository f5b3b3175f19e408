// placement_test.cc — CPU offload placement (offload/offload.c) on
// synthetic hwloc topologies (2 packages x 2 NUMA nodes x 2 cores), on the
// real machine (the pages land on the chosen node: get_mempolicy), and the
// bad input: a node that does not exist, more threads than cores, a
// refused page-lock (through the test hook: the tests run as root).
#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "offload/offload.h"

namespace {

class Synthetic : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(hwloc_topology_init(&topo_), 0);
    ASSERT_EQ(hwloc_topology_set_synthetic(topo_, "pack:2 numa:2 core:2 pu:1"), 0);
    ASSERT_EQ(hwloc_topology_load(topo_), 0);
    ASSERT_EQ(hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE), 4);
  }
  void TearDown() override { hwloc_topology_destroy(topo_); }
  // The cpuset of cores [first, first + n) (PUs are numbered 0..7).
  hwloc_bitmap_t Cores(int first, int n) {
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    for (int i = first; i < first + n; i++) hwloc_bitmap_set(b, (unsigned)i);
    return b;
  }
  hwloc_topology_t topo_;
  char why_[256];
};

TEST_F(Synthetic, RankBoundToOneNodesCoresGetsThatNode) {
  for (int node = 0; node < 4; node++) {
    hwloc_bitmap_t b = Cores(2 * node, 2);
    int got = -9;
    ASSERT_EQ(zs__offload_choose_node(topo_, b, nullptr, ZS_OFFLOAD_NUMA_AUTO,
                                      &got, why_, sizeof why_),
              ZS_OK);
    EXPECT_EQ(got, node) << why_;
    EXPECT_NE(std::string(why_).find("cores"), std::string::npos) << why_;
    hwloc_bitmap_free(b);
  }
}

TEST_F(Synthetic, BindingAcrossNodesTakesTheNodeWithMostCores) {
  hwloc_bitmap_t b = Cores(1, 3);  // core 1 (node 0), cores 2-3 (node 1)
  int got = -9;
  ASSERT_EQ(zs__offload_choose_node(topo_, b, nullptr, ZS_OFFLOAD_NUMA_AUTO, &got,
                                    why_, sizeof why_),
            ZS_OK);
  EXPECT_EQ(got, 1) << why_;
  hwloc_bitmap_free(b);
  b = Cores(3, 2);  // one core each on nodes 1 and 2: the lower
  ASSERT_EQ(zs__offload_choose_node(topo_, b, nullptr, ZS_OFFLOAD_NUMA_AUTO, &got,
                                    why_, sizeof why_),
            ZS_OK);
  EXPECT_EQ(got, 1) << why_;
  hwloc_bitmap_free(b);
}

TEST_F(Synthetic, ExplicitInterleaveAndMissingNode) {
  int got = -9;
  ASSERT_EQ(zs__offload_choose_node(topo_, nullptr, nullptr, 2, &got, why_,
                                    sizeof why_),
            ZS_OK);
  EXPECT_EQ(got, 2);
  ASSERT_EQ(zs__offload_choose_node(topo_, nullptr, nullptr,
                                    ZS_OFFLOAD_NUMA_INTERLEAVE, &got, why_,
                                    sizeof why_),
            ZS_OK);
  EXPECT_EQ(got, -1);
  EXPECT_EQ(zs__offload_choose_node(topo_, nullptr, nullptr, 7, &got, why_,
                                    sizeof why_),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("NUMA node 7 does not exist (this "
                                              "machine has nodes 0, 1, 2, 3)"),
            std::string::npos)
      << zs_last_error();
  // A GPU bus id the topology does not have falls back to the binding.
  hwloc_bitmap_t b = Cores(6, 2);
  ASSERT_EQ(zs__offload_choose_node(topo_, b, "0000:3b:00.0", ZS_OFFLOAD_NUMA_AUTO,
                                    &got, why_, sizeof why_),
            ZS_OK);
  EXPECT_EQ(got, 3) << why_;
  hwloc_bitmap_free(b);
}

// An hwloc XML topology shipped with the tests: 2 packages x 2 NUMA nodes
// x 2 cores, a GPU at 0000:3b:00.0 local to node 0 and one at
// 0000:af:00.0 local to node 2 (tests/offload/topo_2pkg_4numa_2gpu.xml).
// A rank's GPU decides, whatever cores the rank is bound to.
TEST(XmlTopology, GpuPciLocalityChoosesTheGpusNode) {
  const char* dir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  ASSERT_NE(dir, nullptr);
  const std::string path = std::string(dir) + "/" + (ws ? ws : "zeroshard") +
                           "/tests/offload/topo_2pkg_4numa_2gpu.xml";
  hwloc_topology_t topo;
  ASSERT_EQ(hwloc_topology_init(&topo), 0);
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
  ASSERT_EQ(hwloc_topology_set_xml(topo, path.c_str()), 0) << path;
  ASSERT_EQ(hwloc_topology_load(topo), 0);
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  hwloc_bitmap_set_range(b, 6, 7);  // bound to node 3's cores
  char why[256];
  int node = -9;
  const struct {
    const char* busid;
    int node;
  } gpus[] = {{"0000:3b:00.0", 0}, {"0000:af:00.0", 2}};
  for (const auto& g : gpus) {
    ASSERT_EQ(zs__offload_choose_node(topo, b, g.busid, ZS_OFFLOAD_NUMA_AUTO,
                                      &node, why, sizeof why),
              ZS_OK);
    EXPECT_EQ(node, g.node) << g.busid << ": " << why;
    EXPECT_NE(std::string(why).find("GPU"), std::string::npos) << why;
  }
  // Ranks without a GPU there: their cores decide.
  ASSERT_EQ(zs__offload_choose_node(topo, b, "0000:01:00.0", ZS_OFFLOAD_NUMA_AUTO,
                                    &node, why, sizeof why),
            ZS_OK);
  EXPECT_EQ(node, 3) << why;
  hwloc_bitmap_free(b);
  hwloc_topology_destroy(topo);
}

// On this machine: the chosen node, pages on it, workers, bad input.
class RealMachine : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(zs__accounting_create(&acct_), ZS_OK); }
  void TearDown() override {
    zs__offload_mlock_hook = nullptr;
    zs__accounting_destroy(acct_);
  }
  zs__accounting* acct_ = nullptr;
};

TEST_F(RealMachine, PagesLandOnTheChosenNodeAndAreCounted) {
  zs_config cfg;
  zs_config_init(&cfg); // the defaults: zs__offload_create takes a resolved config
  cfg.offload_optimizer.device = ZS_OFFLOAD_CPU;
  cfg.offload_optimizer.numa = 0;
  zs__offload* o = nullptr;
  ASSERT_EQ(zs__offload_create(&cfg, 0, nullptr, acct_, &o), ZS_OK) << zs_last_error();
  void* p = nullptr;
  const size_t bytes = 8u << 20;
  ASSERT_EQ(zs__offload_alloc(o, bytes, "test", &p), ZS_OK);
  zs_memory_stats ms{};
  zs__accounting_stats(acct_, &ms);
  EXPECT_EQ(ms.current[ZS_MEM_OFFLOAD_HOST], bytes);
  if (numa_available() >= 0) {
    for (size_t off = 0; off < bytes; off += bytes / 4) {
      int node = -1;
      ASSERT_EQ(get_mempolicy(&node, nullptr, 0, static_cast<char*>(p) + off,
                              MPOL_F_NODE | MPOL_F_ADDR),
                0);
      EXPECT_EQ(node, 0) << "page at offset " << off;
    }
  }
  zs_offload_info info{};
  zs__offload_info(o, &info);
  EXPECT_EQ(info.enabled, 1);
  EXPECT_EQ(info.numa_node, 0);
  EXPECT_GE(info.workers, 1);
  EXPECT_EQ(info.pinned, 1);
  zs__offload_free(o, p);
  zs__accounting_stats(acct_, &ms);
  EXPECT_EQ(ms.current[ZS_MEM_OFFLOAD_HOST], 0u);
  zs__offload_destroy(o);
}

// Every worker runs each job once; a worker's error reaches the caller with
// its message (errors are thread-local).
TEST_F(RealMachine, WorkersRunEveryJobAndReportErrors) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 cores";
  zs_config cfg;
  zs_config_init(&cfg); // the defaults: zs__offload_create takes a resolved config
  cfg.offload_optimizer.device = ZS_OFFLOAD_CPU;
  cfg.offload_optimizer.threads = 2;
  zs__offload* o = nullptr;
  ASSERT_EQ(zs__offload_create(&cfg, 0, nullptr, acct_, &o), ZS_OK) << zs_last_error();
  static int seen[2];
  seen[0] = seen[1] = 0;
  auto count = [](void*, int w, int nw) -> zs_status {
    if (nw != 2) return ZS_ERR_INTERNAL;
    __atomic_add_fetch(&seen[w], 1, __ATOMIC_RELAXED);
    return ZS_OK;
  };
  for (int k = 0; k < 3; k++) ASSERT_EQ(zs__offload_run(o, count, nullptr), ZS_OK);
  EXPECT_EQ(seen[0], 3);
  EXPECT_EQ(seen[1], 3);
  auto fail = [](void*, int w, int) -> zs_status {
    if (w == 1) return zs__error(ZS_ERR_INVALID_ARGUMENT, "worker one says no");
    return ZS_OK;
  };
  EXPECT_EQ(zs__offload_run(o, fail, nullptr), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("worker one says no"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs__offload_run(o, count, nullptr), ZS_OK);  // usable afterwards
  zs__offload_destroy(o);
}

TEST_F(RealMachine, BadInputIsAClearErrorOrAWarnedFallback) {
  zs_config cfg;
  zs_config_init(&cfg); // the defaults: zs__offload_create takes a resolved config
  cfg.offload_optimizer.device = ZS_OFFLOAD_CPU;
  cfg.offload_optimizer.numa = 999;
  zs__offload* o = nullptr;
  EXPECT_EQ(zs__offload_create(&cfg, 0, nullptr, acct_, &o), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("NUMA node 999 does not exist"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(o, nullptr);
  cfg.offload_optimizer.numa = ZS_OFFLOAD_NUMA_AUTO;
  cfg.offload_optimizer.threads = 100000;
  EXPECT_EQ(zs__offload_create(&cfg, 0, nullptr, acct_, &o), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("offload_optimizer.threads"),
            std::string::npos) << zs_last_error();
  // Pinning refused: a warning, pageable memory, training goes on.
  cfg.offload_optimizer.threads = 1;
  zs__offload_mlock_hook = [](const void*, size_t) { errno = EPERM; return -1; };
  ASSERT_EQ(zs__offload_create(&cfg, 0, nullptr, acct_, &o), ZS_OK);
  void* p = nullptr;
  ASSERT_EQ(zs__offload_alloc(o, 4096, "test", &p), ZS_OK);
  zs_offload_info info{};
  zs__offload_info(o, &info);
  EXPECT_EQ(info.pinned, 0);
  EXPECT_EQ(info.workers, 1);
  zs__offload_free(o, p);
  zs__offload_destroy(o);
}

}  // namespace
