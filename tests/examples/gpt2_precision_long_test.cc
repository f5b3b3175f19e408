// gpt2_precision_long_test.cc — a long check (tag zs_long, run by
// `tools/zs test --long`): bf16 training of the GPT-2 demo model at 4 ranks,
// ZeRO stage 3, for 200 steps: the mean loss of its last 20 steps is within
// 2% of fp32 training's (the same data, seed and flags otherwise).
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/examples/process_util.h"

namespace {

std::string g_sharded, g_data;

std::vector<double> Losses(const std::string& dtype) {
  const std::string report = zstest::TmpDir() + "/prec_" + dtype + ".json";
  zstest::RunResult r = zstest::Shell(
      zstest::Mpirun(4, 1, 1200) + g_sharded + " --steps 200 --eval-every 0 "
      "--sample-bytes 0 --quiet --stage 3 --dtype " + dtype + " --data " +
      g_data + " --report " + report);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(report);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<double> out;
  cJSON* root = cJSON_Parse(ss.str().c_str());
  if (root == nullptr) return out;
  cJSON* it;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "steps"))
      out.push_back(cJSON_GetObjectItem(it, "loss")->valuedouble);
  cJSON_Delete(root);
  return out;
}

double MeanLast(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); i++) s += v[i];
  return s / (double)n;
}

TEST(Gpt2PrecisionLong, Bf16LastTwentyStepsWithinTwoPercentOfFp32) {
  std::vector<double> f32 = Losses("fp32"), b16 = Losses("bf16");
  ASSERT_EQ(f32.size(), 200u);
  ASSERT_EQ(b16.size(), 200u);
  const double a = MeanLast(f32, 20), b = MeanLast(b16, 20);
  std::printf("mean loss of steps 181-200: fp32 %.4f, bf16 %.4f (ratio %.4f)\n",
              a, b, b / a);
  EXPECT_LE(std::fabs(b - a), 0.02 * a);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TRAIN_SHARDED DATA\n", argv[0]);
    return 2;
  }
  g_sharded = argv[1];
  g_data = argv[2];
  return RUN_ALL_TESTS();
}
