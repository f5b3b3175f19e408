// stacked_train_test.cc — the stacked-layout trainers (examples/stacked)
// end to end, as processes: the wrapped trainer at one rank trains bitwise
// like the plain one at every stage (the final parameters and every
// printed loss), and at 2 and 4 ranks bitwise alike across stages 0-3; a
// batch the ranks do not divide is refused. Paths come in argv (runfiles).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/examples/process_util.h"

namespace {

using zstest::Mpirun;
using zstest::RunResult;
using zstest::Shell;
using zstest::TmpDir;

std::string g_plain, g_sharded, g_data;
const char* kFlags = " --steps 6 --layers 3 --channels 64 --heads 4 --seq 32 --batch 8";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The "step N loss X" lines of a run's output.
std::vector<std::string> Losses(const std::string& out) {
  std::vector<std::string> v;
  size_t at = 0;
  while ((at = out.find("step ", at)) != std::string::npos) {
    size_t end = out.find('\n', at);
    v.push_back(out.substr(at, end - at));
    at = end;
  }
  return v;
}

struct Outcome {
  std::string params, output;
  std::vector<std::string> losses;
};

Outcome Sharded(int ranks, int stage, const std::string& more = "") {
  const std::string dump = TmpDir() + "/stacked_" + std::to_string(ranks) +
                           "_" + std::to_string(stage) + ".bin";
  RunResult r = Shell(Mpirun(ranks) + g_sharded + kFlags + more + " --data " + g_data +
                      " --stage " + std::to_string(stage) + " --dump " + dump);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return {Read(dump), r.output, Losses(r.output)};
}

// (--layers 1 too: the stacked kinds of one layer belong to the block's
// unit, not to the embedding's)
TEST(StackedTrain, OneRankIsBitwiseThePlainTrainer) {
  for (const std::string layers : {"", " --layers 1"}) {
    const std::string dump = TmpDir() + "/stacked_plain.bin";
    RunResult p = Shell(g_plain + kFlags + layers + " --data " + g_data +
                        " --dump " + dump);
    ASSERT_EQ(p.exit_code, 0) << p.output;
    const std::string plain = Read(dump);
    ASSERT_GT(plain.size(), 60000u);
    ASSERT_EQ(Losses(p.output).size(), 6u) << p.output;
    for (int stage = 0; stage <= 3; stage++) {
      Outcome s = Sharded(1, stage, layers);
      EXPECT_TRUE(s.params == plain) << "stage " << stage << layers
                                     << ": final parameters differ";
      EXPECT_EQ(s.losses, Losses(p.output)) << "stage " << stage << layers;
    }
  }
}

TEST(StackedTrain, RanksAreBitwiseAcrossStages) {
  for (int ranks : {2, 4}) {
    Outcome s0 = Sharded(ranks, 0);
    ASSERT_GT(s0.params.size(), 100000u) << s0.output;
    ASSERT_EQ(s0.losses.size(), 6u) << s0.output;
    for (int stage = 1; stage <= 3; stage++) {
      Outcome s = Sharded(ranks, stage);
      EXPECT_TRUE(s.params == s0.params)
          << ranks << " ranks, stage " << stage << ": parameters differ from "
          << "stage 0's";
      EXPECT_EQ(s.losses, s0.losses) << ranks << " ranks, stage " << stage;
    }
  }
}

TEST(StackedTrain, BatchNotDividedIsRefused) {
  RunResult r = Shell(Mpirun(3) + g_sharded + kFlags + " --data " + g_data);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bad model"), std::string::npos) << r.output;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s TRAIN_PLAIN TRAIN_SHARDED DATA\n", argv[0]);
    return 2;
  }
  g_plain = argv[1];
  g_sharded = argv[2];
  g_data = argv[3];
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  return RUN_ALL_TESTS();
}
