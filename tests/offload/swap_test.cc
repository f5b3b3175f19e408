// swap_test.cc — offload/swap: NVMe offload's pipelined sub-group schedule.
// Seven sub-groups of odd sizes, three fields each, through rings of 3, 5
// and 16 slots (more than the sub-groups) on both I/O backends: every step
// sees its sub-group's data, the reads of sub-groups k+1 .. k+slots-2 are
// queued before step k runs (the overlap), the file ends with every
// sub-group updated once; an injected read error stops before the failing
// sub-group is stepped and names the file and offset; a step's error is
// returned; after either, earlier sub-groups are written and later ones
// untouched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "offload/aio.h"
#include "offload/swap.h"

namespace {

constexpr int kGroups = 7, kFields = 3;

size_t GroupBytes(int k) { return 4096u * (size_t)(1 + (k * 5) % 3); }

float Original(int field, int k, size_t i) {
  return (float)(field * 100000 + k * 1000) + (float)(i % 997);
}

struct Fixture {
  zs__aio* a = nullptr;
  zs__aio_file* f = nullptr;
  std::string path;
  std::vector<zs__swap_group> groups;
  void* slots[ZS__SWAP_MAX_SLOTS][ZS__SWAP_MAX_FIELDS] = {};
  std::vector<int> stepped;
  std::vector<uint64_t> tickets_at_step;
  int fail_step = -1;
  int consume_at = -1;  // this step makes a transfer fail and takes its error
};

long g_scratch_offset = -1;
long FailScratch(const char*, uint64_t offset, int write, size_t, long result) {
  return !write && (long)offset == g_scratch_offset ? -EIO : result;
}

zs_status Step(void* arg, int k, void* const* bufs) {
  Fixture* x = (Fixture*)arg;
  x->stepped.push_back(k);
  x->tickets_at_step.push_back(zs__aio_last_ticket(x->a));
  if (k == x->fail_step) return zs__error(ZS_ERR_INTERNAL, "step %d failed", k);
  if (k == x->consume_at) {
    // another user of the queue: its read fails, and its own wait takes
    // the error, so no wait of the pipeline will return it
    void* scratch = nullptr;
    if (posix_memalign(&scratch, ZS__AIO_ALIGN, 4096) != 0) return ZS_ERR_OUT_OF_MEMORY;
    g_scratch_offset = (long)x->groups[0].offset[0];
    zs__aio_fault_hook = FailScratch;
    zs_status st = zs__aio_submit(x->a, x->f, 0, scratch, 4096, x->groups[0].offset[0]);
    if (st == ZS_OK) st = zs__aio_wait(x->a);
    zs__aio_fault_hook = nullptr;
    free(scratch);
    if (st != ZS_ERR_IO) ADD_FAILURE() << "the scratch read did not fail";
  }
  const size_t n = x->groups[k].bytes / sizeof(float);
  for (int f = 0; f < kFields; f++) {
    float* v = (float*)bufs[f];
    for (size_t i = 0; i < n; i++) {
      if (v[i] != Original(f, k, i)) {
        ADD_FAILURE() << "group " << k << " field " << f << " [" << i << "] = " << v[i];
        return ZS_ERR_INTERNAL;
      }
      v[i] += (float)(k + 1);
    }
  }
  return ZS_OK;
}

class SwapTest
    : public ::testing::TestWithParam<std::tuple<zs__aio_backend, int>> {
 protected:
  int Slots() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    x_.path = std::string(t ? t : "/tmp") + "/swap-" +
              std::to_string(std::get<0>(GetParam())) + "-" + std::to_string(Slots()) + ".swap";
    unlink(x_.path.c_str());
    ASSERT_EQ(zs__aio_create(8, 0, std::get<0>(GetParam()), &x_.a), ZS_OK) << zs_last_error();
    uint64_t off = 0;
    for (int k = 0; k < kGroups; k++) {
      zs__swap_group g{};
      g.bytes = GroupBytes(k);
      x_.groups.push_back(g);
    }
    for (int f = 0; f < kFields; f++)  // field-major, as the engine lays out
      for (int k = 0; k < kGroups; k++) {
        x_.groups[k].offset[f] = off;
        off += x_.groups[k].bytes;
      }
    ASSERT_EQ(zs__aio_file_create(x_.a, x_.path.c_str(), off, &x_.f), ZS_OK);
    for (int s = 0; s < Slots(); s++)
      for (int f = 0; f < kFields; f++)
        ASSERT_EQ(posix_memalign(&x_.slots[s][f], ZS__AIO_ALIGN, 3 * 4096), 0);
    // the initial contents
    for (int k = 0; k < kGroups; k++)
      for (int f = 0; f < kFields; f++) {
        float* v = (float*)x_.slots[0][0];
        for (size_t i = 0; i < GroupBytes(k) / 4; i++) v[i] = Original(f, k, i);
        ASSERT_EQ(zs__aio_submit(x_.a, x_.f, 1, v, GroupBytes(k), x_.groups[k].offset[f]), ZS_OK);
        ASSERT_EQ(zs__aio_wait(x_.a), ZS_OK);
      }
  }
  void TearDown() override {
    zs__aio_fault_hook = nullptr;
    for (auto& s : x_.slots)
      for (void* p : s) free(p);
    zs__aio_file_close(x_.f, 1);
    zs__aio_destroy(x_.a);
  }
  // +k+1 for the groups below updated_below, the original elsewhere
  void ExpectFile(int updated_below) {
    void* buf = nullptr;
    ASSERT_EQ(posix_memalign(&buf, ZS__AIO_ALIGN, 3 * 4096), 0);
    for (int k = 0; k < kGroups; k++)
      for (int f = 0; f < kFields; f++) {
        ASSERT_EQ(zs__aio_submit(x_.a, x_.f, 0, buf, GroupBytes(k), x_.groups[k].offset[f]), ZS_OK);
        ASSERT_EQ(zs__aio_wait(x_.a), ZS_OK) << zs_last_error();
        const float* v = (const float*)buf;
        for (size_t i = 0; i < GroupBytes(k) / 4; i++) {
          const float want = Original(f, k, i) + (k < updated_below ? (float)(k + 1) : 0.0f);
          ASSERT_EQ(v[i], want) << "group " << k << " field " << f << " [" << i << "]";
        }
      }
    free(buf);
  }
  Fixture x_;
};

TEST_P(SwapTest, EveryGroupSteppedOnceWithTheNextReadInFlight) {
  ASSERT_EQ(zs__swap_pipeline(x_.a, x_.f, x_.groups.data(), kGroups, kFields, Slots(),
                              x_.slots, Step, &x_), ZS_OK) << zs_last_error();
  ASSERT_EQ((int)x_.stepped.size(), kGroups);
  const uint64_t before = 3 * kGroups;  // the setup's writes
  for (int k = 0; k < kGroups; k++) {
    EXPECT_EQ(x_.stepped[k], k);
    // reads of 0..k+slots-2 and writes of 0..k-1 were queued before step k
    const int reads = k + Slots() - 1 < kGroups ? k + Slots() - 1 : kGroups;
    EXPECT_EQ(x_.tickets_at_step[k], before + (uint64_t)kFields * (reads + k)) << k;
  }
  ExpectFile(kGroups);
}

long g_bad_offset = -1;
long FailRead(const char*, uint64_t offset, int write, size_t, long result) {
  return !write && (long)offset == g_bad_offset ? -EIO : result;
}

TEST_P(SwapTest, AReadErrorStopsBeforeThatGroupNamingFileAndOffset) {
  g_bad_offset = (long)x_.groups[4].offset[1];
  zs__aio_fault_hook = FailRead;
  EXPECT_EQ(zs__swap_pipeline(x_.a, x_.f, x_.groups.data(), kGroups, kFields, Slots(),
                              x_.slots, Step, &x_), ZS_ERR_IO);
  const std::string e = zs_last_error();
  EXPECT_NE(e.find("offset " + std::to_string(g_bad_offset) + " of " + x_.path),
            std::string::npos) << e;
  zs__aio_fault_hook = nullptr;
  // the steps before it ran in order; with three slots exactly 0..3 (the
  // failing read is the only one in flight when group 4 is waited for);
  // with deeper rings the failure may be found while waiting for an
  // earlier group, which then is not stepped either
  const int n = (int)x_.stepped.size();
  EXPECT_LE(n, 4);
  if (Slots() == 3) {
    EXPECT_EQ(n, 4);
  }
  for (int k = 0; k < n; k++) EXPECT_EQ(x_.stepped[k], k);
  ExpectFile(n);
}

TEST_P(SwapTest, AStepErrorIsReturnedAndLaterGroupsAreUntouched) {
  x_.fail_step = 2;
  EXPECT_EQ(zs__swap_pipeline(x_.a, x_.f, x_.groups.data(), kGroups, kFields, Slots(),
                              x_.slots, Step, &x_), ZS_ERR_INTERNAL);
  EXPECT_NE(std::string(zs_last_error()).find("step 2 failed"), std::string::npos)
      << zs_last_error();
  ExpectFile(2);
}

// A transfer that failed while the pipeline ran, its error taken by
// another wait: the pipeline still stops before stepping the next group.
TEST_P(SwapTest, AFailureReportedElsewhereStopsThePipeline) {
  x_.consume_at = 2;
  EXPECT_EQ(zs__swap_pipeline(x_.a, x_.f, x_.groups.data(), kGroups, kFields, Slots(),
                              x_.slots, Step, &x_), ZS_ERR_IO);
  EXPECT_NE(std::string(zs_last_error()).find("reported to another waiter"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(x_.stepped, (std::vector<int>{0, 1, 2}));
  ExpectFile(3);
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapTest,
                         ::testing::Combine(::testing::Values(ZS__AIO_AUTO, ZS__AIO_THREADS),
                                            ::testing::Values(3, 5, 16)),
                         [](const ::testing::TestParamInfo<std::tuple<zs__aio_backend, int>>& i) {
                           return std::string(std::get<0>(i.param) == ZS__AIO_AUTO ? "Auto"
                                                                                : "Threads") +
                                  std::to_string(std::get<1>(i.param)) + "Slots";
                         });

}  // namespace
