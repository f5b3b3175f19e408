// timeline_fake_test.cc — the device timeline (ZS_DEVICE_TIMELINE, docs/
// cuda.md "The device timeline") on the CPU stand-ins, at 2-4 ranks on
// one GPU through the staged communicator: one stage-2 step of a chain of
// units writes, per rank, every unit's backward begin and end (marks on
// the legacy stream) in backward order and one exchange per unit (the
// fixed-order reduce-scatter's), each starting on the device no earlier
// than its unit's backward ended and ending no earlier than it started.
// (The stand-in's timestamps are when its lazy streams ran the records:
// they order, they do not measure; the GPU run, tools/gpu/run.sh, shows
// the overlap.)
#include <gtest/gtest.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/mpi_test.h"

namespace {

class TimelineFakeTest : public ZsMpiTest {};

std::string Field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  size_t at = line.find(k);
  if (at == std::string::npos) return "";
  at += k.size();
  if (line[at] == '"') {
    const size_t end = line.find('"', at + 1);
    return line.substr(at + 1, end - at - 1);
  }
  const size_t end = line.find_first_of(",}", at);
  return line.substr(at, end - at);
}

TEST_F(TimelineFakeTest, BackwardMarksAndReductionsInDeviceOrder) {
  if (world_ < 2) GTEST_SKIP() << "the staged communicator needs 2 ranks";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = std::string(tmp != nullptr ? tmp : "/tmp") + "/tl";
  setenv("ZS_DEVICE_TIMELINE", base.c_str(), 1);
  zs_config c = ZS_CONFIG_INIT;
  c.device = ZS_DEVICE_CUDA;
  c.stage = 2;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK)
      << zs_last_error();
  zs_model* m = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  const int kUnits = 4;
  std::vector<int> units;
  for (int u = 0; u < kUnits; u++) {
    int id = -1, t = -1;
    int64_t n = 37 + 5 * u;  // (odd sizes: padded shards)
    const std::string name = "h." + std::to_string(u);
    ASSERT_EQ(zs_model_add_unit(m, name.c_str(), &id), ZS_OK);
    ASSERT_EQ(zs_model_add_tensor(m, id, (name + ".w").c_str(), 1, &n,
                                  ZS_FLOAT32, 0, &t), ZS_OK);
    ASSERT_EQ(zs_unit_set_grad_uses(m, id, 1), ZS_OK);
    units.push_back(id);
  }
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  for (int u = 0; u < kUnits; u++) {
    ASSERT_EQ(zs_unit_gather(m, units[u]), ZS_OK);
    ASSERT_EQ(zs_unit_release(m, units[u]), ZS_OK);
  }
  for (int u = kUnits - 1; u >= 0; u--) {
    ASSERT_EQ(zs_unit_gather(m, units[u]), ZS_OK);
    ASSERT_EQ(zs_unit_grad_acquire(m, units[u]), ZS_OK);
    ASSERT_EQ(zs_unit_grad_release(m, units[u]), ZS_OK);
    ASSERT_EQ(zs_unit_release(m, units[u]), ZS_OK);
  }
  ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
  zs_model_destroy(m);
  zs_context_destroy(ctx);  // writes the timeline
  unsetenv("ZS_DEVICE_TIMELINE");

  std::ifstream in(base + ".rank" + std::to_string(rank_) + ".jsonl");
  ASSERT_TRUE(in.good()) << "no timeline file for rank " << rank_;
  std::vector<std::string> begins, ends;
  std::vector<double> end_ms, ex_start, ex_end;
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    lines++;
    EXPECT_EQ(Field(line, "rank"), std::to_string(rank_)) << line;
    if (Field(line, "kind") == "mark") {
      if (Field(line, "label") == "backward begin") begins.push_back(Field(line, "unit"));
      if (Field(line, "label") == "backward end") {
        ends.push_back(Field(line, "unit"));
        end_ms.push_back(std::stod(Field(line, "ms")));
      }
    } else {
      EXPECT_EQ(Field(line, "kind"), "collective") << line;
      const double a = std::stod(Field(line, "start_ms")),
                   b = std::stod(Field(line, "end_ms"));
      EXPECT_LE(a, b) << line;
      EXPECT_GE(a, 0.0) << line;
      if (Field(line, "op") == "exchange") {
        ex_start.push_back(a);
        ex_end.push_back(b);
      }
    }
  }
  if (rank_ == 0) std::printf("rank 0: %d timeline lines\n", lines);
  const std::vector<std::string> order = {"h.3", "h.2", "h.1", "h.0"};
  EXPECT_EQ(begins, order);
  EXPECT_EQ(ends, order);
  ASSERT_EQ(ex_start.size(), (size_t)kUnits) << "one exchange per unit";
  for (int k = 0; k < kUnits; k++)
    EXPECT_GE(ex_start[k], end_ms[k])
        << "the reduction of " << order[k] << " started on the device "
        << "before its backward ended";
}

}  // namespace
