// gpt2_profile_test.cc — a real multi-rank profile (ZS_PROFILE) of the
// GPT-2 trainer, merged by tools/memreport.py: the SVG has one series per
// rank x category that had bytes, and each series' maximum equals the peak
// the trainer measured for that category (its --report). Bad input:
// an unwritable profile directory warns and training continues; memreport
// on a missing directory, a truncated file, a missing rank or files of
// different runs says so and exits non-zero.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "tests/examples/process_util.h"

namespace {

using zstest::Mpirun;
using zstest::RunResult;
using zstest::Shell;
using zstest::TmpDir;

std::string g_sharded, g_memreport, g_data;

const char* kFlags = " --batch 12 --steps 3 --eval-every 0 --sample-bytes 0 --quiet";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the trainer at `ranks` ranks with ZS_PROFILE=dir.
RunResult Profile(int ranks, int stage, const std::string& dir,
                  const std::string& report) {
  Shell("rm -rf " + dir + " && mkdir -p " + dir);
  return Shell("ZS_PROFILE=" + dir + " " + Mpirun(ranks) + "-x ZS_PROFILE " +
               g_sharded + kFlags + " --data " + g_data + " --stage " +
               std::to_string(stage) + " --report " + report);
}

TEST(Gpt2Profile, SvgSeriesMatchTheMeasuredPeaks) {
  const int ranks = 3;
  const std::string dir = TmpDir() + "/prof3", report = TmpDir() + "/prof3.json";
  RunResult r = Profile(ranks, 3, dir, report);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  RunResult m = Shell("python3 " + g_memreport + " " + dir + " --json");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  // The measured peaks, per rank, from the trainer's report.
  cJSON* rep = cJSON_Parse(Slurp(report).c_str());
  ASSERT_NE(rep, nullptr);
  std::map<std::pair<int, std::string>, double> want;
  const cJSON* row;
  cJSON_ArrayForEach(row, cJSON_GetObjectItem(rep, "ranks")) {
    const int rank = (int)cJSON_GetObjectItem(row, "rank")->valuedouble;
    const cJSON* c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(row, "peak_bytes")) {
      if (std::string(c->string) != "total" && c->valuedouble > 0)
        want[{rank, c->string}] = c->valuedouble;
    }
  }
  cJSON_Delete(rep);
  ASSERT_FALSE(want.empty());
  // The series of the picture.
  const std::string svg = Slurp(dir + "/memreport.svg");
  ASSERT_NE(svg.find("<svg"), std::string::npos);
  // zs_model_init's staging is drawn, shaded, before the peaks restart
  EXPECT_NE(svg.find("class=\"before-reset\""), std::string::npos);
  std::regex series(
      "<path class=\"series\" data-rank=\"(\\d+)\" data-category=\"(\\w+)\" "
      "data-max-bytes=\"(\\d+)\"");
  std::map<std::pair<int, std::string>, double> got;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), series);
       it != std::sregex_iterator(); ++it)
    got[{std::stoi((*it)[1]), (*it)[2]}] = std::stod((*it)[3]);
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [key, bytes] : want) {
    ASSERT_TRUE(got.count(key)) << "no series for rank " << key.first << " "
                                << key.second;
    EXPECT_EQ(got[key], bytes) << "rank " << key.first << " " << key.second;
  }
  // comm_buffers in detail: its own counter track in each rank's trace.
  EXPECT_NE(Slurp(dir + "/zs_profile_rank0.json").find("\"comm_buffers detail\""),
            std::string::npos);
  // The communication summary: reduce-scatters of 5 units per step.
  cJSON* j = cJSON_Parse(m.output.c_str());
  ASSERT_NE(j, nullptr) << m.output;
  // Per-step phase peaks from the timeline: 3 steps per rank, and the last
  // one's equal what the trainer measured (zs_memory_stats.phase_peak).
  cJSON* rep2 = cJSON_Parse(Slurp(report).c_str());
  ASSERT_NE(rep2, nullptr);
  const cJSON* per_rank = cJSON_GetObjectItem(j, "phase_peak_total_bytes");
  ASSERT_EQ(cJSON_GetArraySize(per_rank), ranks);
  for (int q = 0; q < ranks; q++) {
    const cJSON* steps = cJSON_GetArrayItem(per_rank, q);
    ASSERT_EQ(cJSON_GetArraySize(steps), 3) << "rank " << q;
    const cJSON* last = cJSON_GetArrayItem(steps, 2);
    const cJSON* measured = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(rep2, "ranks"), q), "phase_peak_bytes");
    for (const char* ph : {"forward", "backward", "step"})
      EXPECT_EQ(cJSON_GetObjectItem(last, ph)->valuedouble,
                cJSON_GetObjectItem(cJSON_GetObjectItem(measured, ph), "total")
                    ->valuedouble)
          << "rank " << q << " " << ph;
  }
  cJSON_Delete(rep2);
  const cJSON* ops = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "comm"), "ops");
  const cJSON* rs = cJSON_GetObjectItem(ops, "reduce_scatter");
  ASSERT_NE(rs, nullptr) << m.output;
  EXPECT_EQ(cJSON_GetObjectItem(rs, "calls_per_step")->valuedouble, 5.0);
  const double alg = cJSON_GetObjectItem(rs, "algbw_GBps")->valuedouble;
  EXPECT_NEAR(cJSON_GetObjectItem(rs, "busbw_GBps")->valuedouble,
              alg * (ranks - 1) / ranks, 1e-12 + 1e-9 * alg);
  cJSON_Delete(j);
}

TEST(Gpt2Profile, UnwritableDirectoryWarnsAndTrainingContinues) {
  const std::string report = TmpDir() + "/prof_bad.json";
  RunResult r = Shell("ZS_PROFILE=/nonexistent/profiles " + Mpirun(2) +
                      "-x ZS_PROFILE " + g_sharded + kFlags + " --data " +
                      g_data + " --report " + report);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("profiling off: cannot write in /nonexistent/profiles"),
            std::string::npos) << r.output;
  struct stat st;
  EXPECT_EQ(stat(report.c_str(), &st), 0) << "the run must finish";
}

TEST(Gpt2Profile, MemreportRefusesBrokenInput) {
  const std::string two = TmpDir() + "/prof2", three = TmpDir() + "/prof3b",
                    other = TmpDir() + "/prof3c";
  ASSERT_EQ(Profile(2, 2, two, TmpDir() + "/p2.json").exit_code, 0);
  ASSERT_EQ(Profile(3, 2, three, TmpDir() + "/p3.json").exit_code, 0);
  ASSERT_EQ(Profile(3, 1, other, TmpDir() + "/p3c.json").exit_code, 0);
  struct Case {
    std::string name, setup, dir, expect;
  } cases[] = {
      {"missing dir", "", "/nonexistent/dir", "not a directory"},
      {"no profiles", "mkdir -p " + TmpDir() + "/empty", TmpDir() + "/empty",
       "no zs_profile_rank"},
      {"truncated", "rm -rf " + TmpDir() + "/t && mkdir " + TmpDir() + "/t && head -c 500 " +
                        two + "/zs_profile_rank0.json > " + TmpDir() +
                        "/t/zs_profile_rank0.json && cp " + two +
                        "/zs_profile_rank1.json " + TmpDir() + "/t/",
       TmpDir() + "/t", "truncated or not JSON"},
      {"missing rank", "rm -rf " + TmpDir() + "/mr && mkdir " + TmpDir() + "/mr && cp " +
                           three + "/zs_profile_rank0.json " + three +
                           "/zs_profile_rank2.json " + TmpDir() + "/mr/",
       TmpDir() + "/mr", "ranks 1 are missing"},
      {"mixed runs", "rm -rf " + TmpDir() + "/mx && mkdir " + TmpDir() + "/mx && cp " +
                         three + "/zs_profile_rank2.json " + two + "/zs_profile_rank0.json " +
                         two + "/zs_profile_rank1.json " + TmpDir() + "/mx/",
       TmpDir() + "/mx", "different runs"},
      // the same world size, another run (a rank left over from a rerun)
      {"same world, other run", "rm -rf " + TmpDir() + "/sw && mkdir " + TmpDir() +
                                    "/sw && cp " + three + "/zs_profile_rank0.json " +
                                    three + "/zs_profile_rank2.json " + other +
                                    "/zs_profile_rank1.json " + TmpDir() + "/sw/",
       TmpDir() + "/sw", "different runs"},
  };
  for (const Case& c : cases) {
    if (!c.setup.empty()) {
      ASSERT_EQ(Shell(c.setup).exit_code, 0) << c.name;
    }
    RunResult r = Shell("python3 " + g_memreport + " " + c.dir);
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.output;  // runtime error
    EXPECT_NE(r.output.find(c.expect), std::string::npos)
        << c.name << ": expected '" << c.expect << "' in " << r.output;
  }
  // A process's later contexts write .ctx<K> files: one context's files
  // are merged, the first's by default (saying others are there), another
  // one's with --context K.
  const std::string cx = TmpDir() + "/ctx";
  ASSERT_EQ(Shell("rm -rf " + cx + " && mkdir " + cx + " && cp " + two + "/zs_profile_rank*.json " +
                  cx + "/ && for r in 0 1 2; do cp " + three + "/zs_profile_rank$r.json " + cx +
                  "/zs_profile_rank$r.ctx2.json; done").exit_code, 0);
  RunResult first = Shell("python3 " + g_memreport + " " + cx + " --json 2>&1 >/dev/null; "
                          "python3 " + g_memreport + " " + cx + " --json 2>/dev/null");
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("--context 2"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("{\"ranks\": 2"), std::string::npos) << first.output;
  RunResult second = Shell("python3 " + g_memreport + " " + cx + " --context 2 --json");
  EXPECT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output.rfind("{\"ranks\": 3", 0), 0u) << second.output;
  RunResult none = Shell("python3 " + g_memreport + " " + cx + " --context 5");
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("no profiles of context 5 (found: 0, 2)"), std::string::npos)
      << none.output;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s TRAIN_SHARDED MEMREPORT DATA\n", argv[0]);
    return 2;
  }
  g_sharded = argv[1];
  g_memreport = argv[2];
  g_data = argv[3];
  return RUN_ALL_TESTS();
}
