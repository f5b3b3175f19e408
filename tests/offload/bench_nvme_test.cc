// bench_nvme_test.cc — tools/zs bench nvme runs end to end on a small
// model: it prints its three passes and ends with one JSON line holding
// every figure the docs name (positive, finite; no goal is asserted: the
// figures are the machine's), removes its files, also when the disk is
// full or it is interrupted, and refuses bad flags naming the flag. The
// figures themselves: docs/performance.md.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cjson/cJSON.h>

#include <cmath>
#include <string>

#include "tests/examples/process_util.h"
#include "tests/testing/dirs.h"

namespace {

using zstest::RunResult;
using zstest::Shell;

std::string g_bench;

TEST(BenchNvme, EndsWithOneJsonLineOfEveryFigureAndLeavesNothing) {
  // a directory name JSON must escape: the last line still parses
  const std::string dir = zstest::TmpDir() + "/bench-\"nvme\\";
  ASSERT_EQ(Shell("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").exit_code, 0);
  // 4M parameters: one 16 MiB sub-group per state
  const RunResult r = Shell("timeout 300 " + g_bench + " --path '" + dir +
                            "' --params 4194304 --reps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t nl = r.output.find_last_of('\n', r.output.size() - 2);
  const std::string last = r.output.substr(nl == std::string::npos ? 0 : nl + 1);
  cJSON* j = cJSON_Parse(last.c_str());
  ASSERT_NE(j, nullptr) << r.output;
  for (const char* k :
       {"raw_write_GBps", "raw_read_GBps", "raw_mixed_s", "swap_out_GBps",
        "swap_in_GBps", "ratio_to_raw_write", "ratio_to_raw_read", "step_s",
        "step_bound_s", "step_vs_bound", "step_vs_ideal_overlap",
        "step_vs_serial_bound"}) {
    const cJSON* v = cJSON_GetObjectItem(j, k);
    ASSERT_TRUE(cJSON_IsNumber(v)) << k << " in " << last;
    EXPECT_TRUE(std::isfinite(v->valuedouble) && v->valuedouble > 0) << k << " in " << last;
  }
  EXPECT_EQ(cJSON_GetObjectItem(j, "params")->valuedouble, 4194304.0);
  EXPECT_EQ(cJSON_GetObjectItem(j, "reps")->valuedouble, 2.0);
  EXPECT_STREQ(cJSON_GetObjectItem(j, "path")->valuestring, dir.c_str());
  EXPECT_NE(r.output.find("our swap-out"), std::string::npos) << r.output;
  cJSON_Delete(j);
  EXPECT_EQ(zstest::DirEntries(dir), 0u) << "files left in " << dir;
}

// A 48 MiB tmpfs holds the 32 MiB raw file but not our 32 MiB swap file
// as well: a clear error, and the raw file made before is gone. Needs
// mount(2) (root, or CAP_SYS_ADMIN); skipped with the reason otherwise.
TEST(BenchNvme, AFullDiskFailsClearlyLeavingNothing) {
  const std::string dir = zstest::TmpDir() + "/bench-nvme-small";
  mkdir(dir.c_str(), 0700);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=48m") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << strerror(errno)
                 << "): the full-disk case needs mount(2)";
  const RunResult r = Shell("timeout 120 " + g_bench + " --path " + dir +
                            " --params 4194304 --reps 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no space left"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir + "/zs-bench-nvme-"), std::string::npos) << r.output;
  EXPECT_EQ(zstest::DirEntries(dir), 0u) << "files left in " << dir;
  umount(dir.c_str());
}

// SIGINT or SIGTERM in the middle: the bench stops between passes, says
// so and removes its files and the model's swap directory.
TEST(BenchNvme, AnInterruptedRunLeavesNothing) {
  const std::string dir = zstest::TmpDir() + "/bench-nvme-int";
  ASSERT_EQ(Shell("rm -rf " + dir + " && mkdir -p " + dir).exit_code, 0);
  for (const char* sig : {"INT", "TERM"}) {
    // long enough that the signal comes in the middle (4 repetitions of
    // 1 GiB); waits until the model's swap directory exists
    const RunResult r = Shell(
        "(timeout 300 " + g_bench + " --path " + dir +
        " --params 134217728 --reps 4 & b=$!; "
        "for i in $(seq 600); do ls " + dir + " | grep -q -- '-rank-' && break; sleep 0.1; done; "
        "kill -" + sig + " $b; wait $b)");
    EXPECT_EQ(r.exit_code, 1) << sig << ": " << r.output;
    EXPECT_NE(r.output.find(std::string(sig) == "INT" ? "interrupted" : "terminated"),
              std::string::npos) << r.output;
    EXPECT_EQ(zstest::DirEntries(dir), 0u) << "files left in " << dir << " after SIG" << sig;
  }
}

TEST(BenchNvme, RefusesBadFlags) {
  RunResult r = Shell(g_bench + " --block-size 1000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--block-size must be a multiple of 4096"), std::string::npos)
      << r.output;
  r = Shell(g_bench + " --params 10");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--params must be at least a block's worth"), std::string::npos)
      << r.output;
  // not a whole number in range: named with the value as given (once cast
  // straight to size_t: -5 became 18446744073709551611)
  for (const char* bad : {"--queue-depth 0", "--queue-depth 5000", "--reps 0", "--reps 40",
                          "--params -5", "--params abc", "--params 1e20", "--params 2.5",
                          "--block-size -4096", "--block-size 1e30"}) {
    r = Shell(g_bench + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
    const std::string value = std::string(bad).substr(flag.size() + 1);
    EXPECT_NE(r.output.find(flag + ": expected a whole number"), std::string::npos)
        << bad << ": " << r.output;
    EXPECT_NE(r.output.find("got '" + value + "'"), std::string::npos) << bad << ": " << r.output;
  }
  r = Shell(g_bench + " --path /nonexistent-dir-zs");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent-dir-zs"), std::string::npos) << r.output;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BENCH_NVME\n", argv[0]);
    return 2;
  }
  g_bench = argv[1];
  return RUN_ALL_TESTS();
}
