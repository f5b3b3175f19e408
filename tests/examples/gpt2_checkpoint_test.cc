// gpt2_checkpoint_test.cc — checkpoints of the GPT-2 trainer across real
// processes (docs/checkpoint.md):
//  - 10 straight steps == 5 steps, --save, new processes, --resume, 5 more:
//    the checkpoints written at step 10 are the same bytes (parameters or
//    fp32 master weights, moments, per-tensor steps, the loss scaler) at
//    stages 0-3, fp32 and 16-bit;
//  - a process killed in the middle of a save (ZS_CKPT_CRASH_AFTER, after
//    each file and rename, on rank 0 and on rank 1) leaves the previous
//    checkpoint loadable and verifiable, and resuming from it reaches the
//    same bytes as the run that was never killed;
//  - tools: zs_ckpt inspect --verify and consolidate on a real checkpoint;
//    bad input (resume with another --seed, a missing checkpoint).
#include <cjson/cJSON.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/examples/process_util.h"

namespace {

using zstest::Mpirun;
using zstest::RunResult;
using zstest::Shell;
using zstest::TmpDir;

std::string g_sharded, g_ckpt, g_data;

const char* kFlags =
    " --layers 2 --channels 32 --heads 2 --seq 16 --batch 12 --eval-every 0 "
    "--sample-bytes 0 --quiet";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

RunResult Train(int ranks, const std::string& flags, const std::string& env = "") {
  return Shell(env + Mpirun(ranks) + (env.empty() ? "" : "-x ZS_CKPT_CRASH_AFTER ") +
               g_sharded + zstest::LastWins(std::string(kFlags) + " --data " +
                                            g_data + " " + flags));
}

// The rank files and metadata of two checkpoint directories are equal.
::testing::AssertionResult SameCheckpoint(const std::string& a,
                                          const std::string& b, int ranks) {
  for (int r = 0; r < ranks; r++) {
    char name[32];
    std::snprintf(name, sizeof name, "/rank-%05d.bin", r);
    std::string x = Slurp(a + name), y = Slurp(b + name);
    if (x.empty() || x != y)
      return ::testing::AssertionFailure()
             << a << name << " and " << b << name << " differ (" << x.size()
             << " vs " << y.size() << " bytes)";
  }
  if (Slurp(a + "/meta.json") != Slurp(b + "/meta.json"))
    return ::testing::AssertionFailure() << a << "/meta.json differs";
  return ::testing::AssertionSuccess();
}

std::string Latest(const std::string& root) {
  std::string s = Slurp(root + "/latest");
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

TEST(Gpt2Checkpoint, ResumeInNewProcessesIsBitwiseAtEveryStage) {
  const char* dtypes[] = {"fp32", "fp16", "fp32", "bf16"};
  for (int stage = 0; stage <= 3; stage++) {
    const std::string what = "stage " + std::to_string(stage) + " " + dtypes[stage];
    const std::string d = TmpDir() + "/resume" + std::to_string(stage);
    Shell("rm -rf " + d);
    const std::string common =
        " --stage " + std::to_string(stage) + " --dtype " + dtypes[stage];
    RunResult a = Train(2, common + " --steps 10 --save " + d + "/a");
    ASSERT_EQ(a.exit_code, 0) << what << a.output;
    RunResult b = Train(2, common + " --steps 5 --save " + d + "/b");
    ASSERT_EQ(b.exit_code, 0) << what << b.output;
    EXPECT_EQ(Latest(d + "/b"), "step-00000005") << what;
    RunResult c = Train(2, common + " --steps 10 --resume " + d + "/b --save " + d +
                               "/b --report " + d + "/c.json");
    ASSERT_EQ(c.exit_code, 0) << what << c.output;
    // tokens/s counts the steps this run trained (5), not the total (10)
    cJSON* rep = cJSON_Parse(Slurp(d + "/c.json").c_str());
    ASSERT_NE(rep, nullptr) << what;
    const double timed = cJSON_GetObjectItem(rep, "steps_timed")->valuedouble;
    const double train_s = cJSON_GetObjectItem(rep, "train_s")->valuedouble;
    EXPECT_EQ(timed, 5) << what;
    EXPECT_NEAR(cJSON_GetObjectItem(rep, "tokens_per_s")->valuedouble,
                5.0 * 12 * 16 / train_s, 1e-6 * 5.0 * 12 * 16 / train_s) << what;
    cJSON_Delete(rep);
    EXPECT_TRUE(SameCheckpoint(d + "/a/step-00000010", d + "/b/step-00000010", 2))
        << what;
  }
}

TEST(Gpt2Checkpoint, KilledDuringASaveLeavesThePreviousLoadable) {
  const std::string d = TmpDir() + "/crash";
  Shell("rm -rf " + d);
  const std::string common = " --stage 3 --steps 4 --save-every 2";
  RunResult ref = Train(2, common + " --save " + d + "/ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Durable steps of a save on rank 0: its rank file, extras.bin,
  // meta.json, meta.json.xxh64, the rename into place, latest (1-6 for the
  // save at step 2, 7-12 for the one at step 4); on rank 1: its rank file.
  struct Crash { int n, rank; };
  const Crash crashes[] = {{7, 0}, {8, 0}, {9, 0}, {10, 0}, {11, 0},
                           {12, 0}, {2, 1}};
  for (const Crash& k : crashes) {
    const std::string what = "killed after durable step " + std::to_string(k.n) +
                             " on rank " + std::to_string(k.rank);
    const std::string root = d + "/r" + std::to_string(k.n) + "_" +
                             std::to_string(k.rank);
    RunResult r = Train(2, common + " --save " + root,
                        "ZS_CKPT_CRASH_AFTER=" + std::to_string(k.n) + ":" +
                            std::to_string(k.rank) + " ");
    EXPECT_NE(r.exit_code, 0) << what << r.output;
    EXPECT_NE(r.output.find("simulated crash"), std::string::npos)
        << what << r.output;
    // `latest` names a complete checkpoint: step 2 until the pointer moved.
    const std::string want = k.n == 12 ? "step-00000004" : "step-00000002";
    EXPECT_EQ(Latest(root), want) << what;
    RunResult v = Shell(g_ckpt + " inspect " + root + " --verify");
    EXPECT_EQ(v.exit_code, 0) << what << v.output;
    EXPECT_NE(v.output.find("verified"), std::string::npos) << what << v.output;
    // Resuming reaches the same bytes as the run that was never killed,
    // and the killed save's leftovers are gone (with `latest` already at
    // step 4 there is nothing left to train: the next save, of a longer
    // run, clears them).
    const std::string more = k.n == 12 ? " --steps 6" : "";
    RunResult c = Train(2, common + more + " --resume " + root + " --save " + root);
    ASSERT_EQ(c.exit_code, 0) << what << c.output;
    EXPECT_EQ(Latest(root), k.n == 12 ? "step-00000006" : "step-00000004")
        << what;
    EXPECT_TRUE(SameCheckpoint(d + "/ref/step-00000004",
                               root + "/step-00000004", 2))
        << what;
    RunResult left = Shell("ls -a " + root);
    EXPECT_EQ(left.output.find(".tmp-"), std::string::npos) << what << left.output;
    EXPECT_EQ(left.output.find(".old-"), std::string::npos) << what << left.output;
  }
}

// Saving again under the name `latest` points at (a rerun from scratch):
// killed after the old copy was moved aside, before the new one took its
// place. The moved-aside copy is found by loads and put back by the next
// save (of any name) into that root.
TEST(Gpt2Checkpoint, KilledWhileReplacingTheLatestCheckpoint) {
  const std::string root = TmpDir() + "/replace";
  Shell("rm -rf " + root);
  RunResult a = Train(2, " --stage 1 --steps 2 --save-every 1 --save " + root);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string before = Slurp(root + "/step-00000002/rank-00000.bin");
  // A rerun from step 1 replaces step 2. Rank 0's durable steps: rank
  // file, extras, meta, checksum, moved aside.
  RunResult k = Train(2, " --stage 1 --steps 2 --lr 0.01 --resume " + root +
                             "/step-00000001 --save " + root,
                      "ZS_CKPT_CRASH_AFTER=5:0 ");
  EXPECT_NE(k.exit_code, 0) << k.output;
  EXPECT_NE(k.output.find("simulated crash"), std::string::npos) << k.output;
  EXPECT_EQ(Latest(root), "step-00000002");
  RunResult v = Shell(g_ckpt + " inspect " + root + " --verify");
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_NE(v.output.find(".old-step-00000002"), std::string::npos) << v.output;
  RunResult c = Train(2, " --stage 1 --steps 3 --resume " + root + " --save " + root);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(Slurp(root + "/step-00000002/rank-00000.bin") == before)
      << "step-00000002 was not restored from its moved-aside copy";
  EXPECT_EQ(Latest(root), "step-00000003");
  RunResult left = Shell("ls -a " + root);
  EXPECT_EQ(left.output.find(".old-"), std::string::npos) << left.output;
}

// A file of the user's inside a checkpoint that gets saved again (a rerun
// from an earlier step) is never deleted, the replaced checkpoint is kept
// whole beside it (not half-removed), and no save fails because of it.
TEST(Gpt2Checkpoint, UserFilesInACheckpointAreKeptAndSavesGoOn) {
  const std::string root = TmpDir() + "/userfiles";
  Shell("rm -rf " + root);
  RunResult a = Train(2, " --stage 2 --steps 4 --save-every 2 --save " + root);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string old4 = Slurp(root + "/step-00000004/rank-00001.bin");
  Shell("echo keep > " + root + "/step-00000004/notes.txt");
  RunResult b = Train(2, " --stage 2 --steps 6 --save-every 2 --lr 0.002 --resume " +
                             root + "/step-00000002 --save " + root);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(Latest(root), "step-00000006");
  EXPECT_NE(b.output.find("kept whole at"), std::string::npos) << b.output;
  // The old step 4, every file of it, with the user's file: still a
  // checkpoint that verifies
  const std::string kept = root + "/step-00000004.replaced";
  EXPECT_EQ(Slurp(kept + "/notes.txt"), "keep\n");
  EXPECT_TRUE(Slurp(kept + "/rank-00001.bin") == old4);
  RunResult v = Shell(g_ckpt + " inspect " + kept + " --verify");
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_FALSE(Slurp(root + "/step-00000004/rank-00001.bin") == old4)
      << "step 4 was not replaced";
  EXPECT_EQ(Shell("ls -a " + root).output.find(".old-"), std::string::npos);
  // Replacing step 4 once more, with a file of the user's in it again: a
  // second kept copy, and the save succeeds.
  Shell("echo keep2 > " + root + "/step-00000004/notes.txt");
  RunResult d = Train(2, " --stage 2 --steps 4 --resume " + root +
                             "/step-00000002 --save " + root);
  ASSERT_EQ(d.exit_code, 0) << d.output;
  EXPECT_EQ(Latest(root), "step-00000004");
  EXPECT_EQ(Slurp(kept + "/notes.txt"), "keep\n");
  EXPECT_EQ(Slurp(kept + ".2/notes.txt"), "keep2\n");
  // The user removes a checkpoint: the next save puts nothing back (a kept
  // copy is not taken for an interrupted replacement).
  Shell("rm -rf " + root + "/step-00000004");
  RunResult e = Train(2, " --stage 2 --steps 8 --resume " + root +
                             "/step-00000006 --save " + root);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(e.output.find("restored"), std::string::npos) << e.output;
  EXPECT_FALSE(std::ifstream(root + "/step-00000004/meta.json").good());
  EXPECT_EQ(Latest(root), "step-00000008");
  EXPECT_EQ(Shell(g_ckpt + " inspect " + root + " --verify").exit_code, 0);
  const std::string left = Shell("ls -a " + root).output;
  EXPECT_EQ(left.find(".tmp-"), std::string::npos) << left;
  EXPECT_EQ(left.find(".old-"), std::string::npos) << left;
}

TEST(Gpt2Checkpoint, ToolsAndBadInput) {
  const std::string d = TmpDir() + "/tools";
  Shell("rm -rf " + d);
  RunResult t = Train(3, " --stage 2 --steps 2 --save " + d);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  RunResult i = Shell(g_ckpt + " inspect " + d);
  EXPECT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("saved by     3 ranks at ZeRO stage 2"), std::string::npos)
      << i.output;
  EXPECT_NE(i.output.find("h.1.fc_w"), std::string::npos) << i.output;
  // --json --verify: stdout is one JSON document
  RunResult j = Shell(g_ckpt + " inspect " + d + " --json --verify 2>/dev/null | "
                      "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"world_size\"])'");
  EXPECT_EQ(j.exit_code, 0) << j.output;
  EXPECT_EQ(j.output, "3\n") << j.output;
  RunResult c = Shell(g_ckpt + " consolidate " + d + " " + d + "/w.safetensors --dtype bf16");
  EXPECT_EQ(c.exit_code, 0) << c.output;
  RunResult py = Shell(
      "python3 -c 'import json,struct,sys; b=open(sys.argv[1],\"rb\").read(); "
      "n=struct.unpack(\"<Q\",b[:8])[0]; h=json.loads(b[8:8+n]); "
      "h.pop(\"__metadata__\"); print(len(h), sorted({v[\"dtype\"] for v in h.values()}))' " +
      d + "/w.safetensors");
  EXPECT_EQ(py.exit_code, 0) << py.output;
  EXPECT_NE(py.output.find("['BF16']"), std::string::npos) << py.output;
  // Resuming with another data order is refused, naming the flags.
  RunResult s = Train(2, " --stage 2 --steps 4 --seed 7 --resume " + d);
  EXPECT_EQ(s.exit_code, 2) << s.output;
  EXPECT_NE(s.output.find("--seed 1337"), std::string::npos) << s.output;
  // Another --heads (same tensor shapes) is refused too.
  RunResult hd = Train(2, " --stage 2 --steps 4 --heads 4 --resume " + d);
  EXPECT_EQ(hd.exit_code, 2) << hd.output;
  EXPECT_NE(hd.output.find("--heads 2"), std::string::npos) << hd.output;
  // Another model: the tensor and both shapes are named, before training
  // (the checkpoint's tensors read without MPI), with no MPI abort.
  RunResult ch = Train(2, " --stage 2 --steps 4 --channels 64 --heads 2 --resume " + d);
  EXPECT_EQ(ch.exit_code, 2) << ch.output;
  EXPECT_EQ(ch.output.find("MPI_ABORT"), std::string::npos) << ch.output;
  EXPECT_NE(ch.output.find("'wte' [256, 32] there, 'wte' [256, 64] here"),
            std::string::npos) << ch.output;
  // A checkpoint already at --steps leaves nothing to train: an error.
  RunResult done = Train(2, " --stage 2 --steps 2 --resume " + d);
  EXPECT_EQ(done.exit_code, 2) << done.output;
  EXPECT_NE(done.output.find("leaves nothing to train"), std::string::npos)
      << done.output;
  // consolidate never writes into the checkpoint it reads.
  RunResult into = Shell(g_ckpt + " consolidate " + d + " " + d +
                         "/step-00000002/rank-00000.bin");
  EXPECT_NE(into.exit_code, 0);
  EXPECT_NE(into.output.find("inside the checkpoint directory"), std::string::npos)
      << into.output;
  RunResult lat = Shell(g_ckpt + " consolidate " + d + " " + d + "/latest");
  EXPECT_NE(lat.exit_code, 0) << lat.output;
  // ... nor over another checkpoint's files (any checkpoint's file name is
  // refused), and names the output once, without a doubled prefix.
  Shell("mkdir -p " + d + "/elsewhere");
  for (const char* name : {"meta.json", "rank-00001.bin", "extras.bin"}) {
    RunResult o = Shell(g_ckpt + " consolidate " + d + " " + d + "/elsewhere/" + name);
    EXPECT_NE(o.exit_code, 0) << o.output;
    EXPECT_NE(o.output.find("has the name of a checkpoint's file"), std::string::npos)
        << o.output;
    EXPECT_EQ(o.output.find("consolidate: consolidate:"), std::string::npos) << o.output;
  }
  EXPECT_EQ(Shell(g_ckpt + " inspect " + d + " --verify").exit_code, 0);
  // A --save that cannot work fails before training, not at the end.
  Shell("touch " + d + "/afile");
  RunResult bad = Train(2, " --steps 50 --save " + d + "/afile");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--save"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("step "), std::string::npos) << bad.output;
  // A missing checkpoint names the path.
  RunResult m = Train(2, " --steps 4 --resume " + d + "/nope");
  EXPECT_EQ(m.exit_code, 2) << m.output;
  EXPECT_NE(m.output.find("--resume " + d + "/nope: "), std::string::npos) << m.output;
  // The same checks without MPI (--check-ranks, which tools/zs demo runs
  // before mpirun): one message each, nothing else.
  const std::string check_flags = std::string(kFlags) + " --data " + g_data +
                                  " --check-ranks 2";
  const std::string check = g_sharded + check_flags;
  for (const auto& [flags, expect] : std::vector<std::pair<std::string, std::string>>{
           {" --steps 4 --seed 7 --resume " + d, "--seed 1337"},
           {" --steps 2 --resume " + d, "leaves nothing to train"},
           {" --steps 4 --resume " + d + "/nope", "--resume " + d + "/nope: "},
           {" --steps 4 --layers 3 --resume " + d,
            "the checkpoint has 28 tensors, the model of these flags 40 (--layers 3)"},
           {" --steps 4 --seq 32 --resume " + d, "the checkpoint was trained with"},
           {" --steps 4 --resume " + d + "/afile", "--resume " + d + "/afile: "},
           {" --steps 4 --describe " + d + "/afile/x.json", "--describe " + d +
                                                                "/afile/x.json: cannot write there"},
           // a new run into a root of an earlier one would replace its
           // checkpoints and move `latest` back
           {" --steps 4 --save " + d, "already holds the checkpoints of an earlier run"},
           // a root inside a checkpoint would put files into it
           {" --steps 4 --resume " + d + " --save " + d + "/step-00000002",
            "is the checkpoint directory"},
           {" --steps 4 --resume " + d + " --save " + d + "/step-00000002/sub",
            "is inside the checkpoint directory"},
           // the files below a root must fit the path limit
           {" --steps 4 --save " + d + "/" + std::string(3900, 'x'), "path limit"}}) {
    RunResult r = Shell(g_sharded + zstest::LastWins(check_flags + flags));
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_EQ(r.output.rfind("train_sharded: ", 0), 0u) << flags << ": " << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << flags << ": " << r.output;
  }
  EXPECT_EQ(Shell(check + " --steps 4 --resume " + d).exit_code, 0);
  // A run refused by its checks creates no --save directory.
  RunResult ns = Shell(g_sharded + zstest::LastWins(check_flags + " --save " + d +
                                                    "/new/sub --data /nonexistent"));
  EXPECT_EQ(ns.exit_code, 2) << ns.output;
  struct stat st;
  EXPECT_NE(stat((d + "/new").c_str(), &st), 0) << "the --save check made a directory";
  RunResult mi = Shell(g_ckpt + " inspect " + d + "/nope");
  EXPECT_EQ(mi.exit_code, 1) << mi.output;
  EXPECT_NE(mi.output.find("does not exist"), std::string::npos) << mi.output;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s TRAIN_SHARDED ZS_CKPT DATA\n", argv[0]);
    return 2;
  }
  g_sharded = argv[1];
  g_ckpt = argv[2];
  g_data = argv[3];
  return RUN_ALL_TESTS();
}
