// checkpoint_test.cc — sharded checkpoints (docs/checkpoint.md), run under
// mpirun at world sizes 1, 2, 3, 4 and 8.
//
// Tolerances: resuming at the same world size and stage replays exactly
// the same arithmetic, so it is BITWISE (parameters, master weights,
// moments, step counts, loss scale and the checkpoint files themselves).
// Resharding to another world size changes how the loss is averaged
// (each rank averages its own samples), so the run after the load is
// compared with continuing at the original size under the foundation
// issue's bound (parity_test.cc): ||a-b|| <= 1e-5 ||b||, max|a-b| <= 1e-5
// max|b|, per tensor.
#include <gtest/gtest.h>
#include <zeroshard.h>
#include <zs_mpi.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;
namespace fs = std::filesystem;

namespace {

constexpr double kRel = 1e-5;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class CheckpointTest : public ZsMpiTest {
 protected:
  void SetUp() override {
    ZsMpiTest::SetUp();
    const char* tmp = std::getenv("TEST_TMPDIR");
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = std::string(tmp ? tmp : "/tmp") + "/ckpt-" + name + "-w" +
           std::to_string(world_);
    if (rank_ == 0) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) fs::remove_all(dir_);
    ZsMpiTest::TearDown();
  }
  std::string dir_;
};

// A context on MPI_COMM_WORLD and a finalized model of `model` with its
// initial values (collective).
zs_status BuildModel(const zs_config& c, Model& model, zs_context** ctx,
                     zs_model** zm) {
  zs_status st = zs_context_create_mpi(&c, MPI_COMM_WORLD, ctx);
  if (st == ZS_OK) st = zs_model_create(*ctx, zm);
  if (st == ZS_OK) st = RegisterModel(model, *zm);
  if (st == ZS_OK) st = zs_model_finalize(*zm);
  if (st == ZS_OK) st = zs_model_init(*zm, InitCallback, &model);
  return st;
}

void ExpectSameState(const TrainResult& a, const TrainResult& b,
                     const Model& m, const std::string& what) {
  ExpectSameTensors(a, b, m, what);
  ASSERT_FALSE(a.infos.empty());
  ASSERT_FALSE(b.infos.empty());
  EXPECT_EQ(a.infos.back().step, b.infos.back().step) << what;
  EXPECT_EQ(a.infos.back().loss_scale, b.infos.back().loss_scale) << what;
  EXPECT_EQ(a.loss_scale, b.loss_scale) << what;
}

// ==== 1. Save, fresh context, load, continue == straight run (bitwise) =====

struct ResumeCase {
  std::string name;
  std::function<std::unique_ptr<Model>()> make;
  zs_optimizer_kind optimizer;
  zs_dtype dtype;
  int loss_scaler;
  int grad_accum;
};

void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name; }

class ResumeTest : public CheckpointTest,
                   public ::testing::WithParamInterface<ResumeCase> {};

TEST_P(ResumeTest, TenStepsEqualFiveSaveLoadFiveAtEveryStage) {
  const ResumeCase& rc = GetParam();
  for (int stage = 0; stage <= 3; stage++) {
    const std::string what = "stage " + std::to_string(stage);
    const std::string a_root = dir_ + "/a" + std::to_string(stage);
    const std::string b_root = dir_ + "/b" + std::to_string(stage);
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.optimizer = rc.optimizer;
    cfg.param_dtype = rc.dtype;
    cfg.loss_scaler = rc.loss_scaler;
    cfg.init_scale = 1024;
    cfg.grad_accum = rc.grad_accum;
    auto model = rc.make();
    // Steps [first, first + steps), loading `load` first, saving at the end.
    auto run = [&](int first, int steps, const std::string& load,
                   const std::string& root, const std::string& name) {
      cfg.first_step = first;
      cfg.steps = steps;
      cfg.load = load;
      cfg.save = root;
      cfg.save_name = name;
      auto m = rc.make();
      TrainResult r = TrainSharded(*m, cfg);
      EXPECT_EQ(r.status, ZS_OK) << what << ": " << r.error;
      return r;
    };
    TrainResult straight = run(0, 10, "", a_root, "end");
    TrainResult first = run(0, 5, "", b_root, "");
    // The root: its `latest` names step-00000005.
    TrainResult resumed = run(5, 5, b_root, b_root, "end");
    ASSERT_EQ(straight.status, ZS_OK);
    ASSERT_EQ(first.status, ZS_OK);
    ASSERT_EQ(resumed.status, ZS_OK);

    ExpectSameState(straight, resumed, *model, what);
    for (int s = 0; s < 5; s++)
      EXPECT_EQ(straight.losses[5 + s], resumed.losses[s])
          << what << " step " << 5 + s;
    // The checkpoints written at the end are the same bytes.
    if (rank_ == 0) {
      EXPECT_TRUE(fs::exists(b_root + "/step-00000005/meta.json"));
      for (int r = 0; r < world_; r++) {
        char name[32];
        std::snprintf(name, sizeof name, "/rank-%05d.bin", r);
        EXPECT_EQ(ReadAll(a_root + "/end" + name), ReadAll(b_root + "/end" + name))
            << what << name;
      }
      EXPECT_EQ(ReadAll(a_root + "/end/meta.json"),
                ReadAll(b_root + "/end/meta.json"))
          << what;
    }
  }
}

const ResumeCase kResumeCases[] = {
    {"TransformerAdamWFp32", MakeTransformer, ZS_OPTIM_ADAMW, ZS_FLOAT32,
     ZS_LOSS_SCALE_NONE, 1},
    {"TransformerAdamWBf16", MakeTransformer, ZS_OPTIM_ADAMW, ZS_BFLOAT16,
     ZS_LOSS_SCALE_NONE, 1},
    {"MlpAdamFp16DynamicScaleAccum2", MakeMlp, ZS_OPTIM_ADAM, ZS_FLOAT16,
     ZS_LOSS_SCALE_DYNAMIC, 2},
    {"DegenerateSgdMomentum", MakeDegenerate, ZS_OPTIM_SGD, ZS_FLOAT32,
     ZS_LOSS_SCALE_NONE, 1},
};

INSTANTIATE_TEST_SUITE_P(Models, ResumeTest, ::testing::ValuesIn(kResumeCases),
                         [](const ::testing::TestParamInfo<ResumeCase>& i) {
                           return i.param.name;
                         });

// ==== 2. Load at another world size and stage ==============================

// Trains 5 steps on `from` ranks at stage s0 and saves; continues 2 steps
// there (the reference) and, separately, loads on `to` ranks at stage s1
// and runs the same 2 steps. Compared on the ranks that ran both.
void Reshard(CheckpointTest* t, int rank, int from, int to, int s0, int s1,
             const std::string& root, MPI_Comm cfrom, MPI_Comm cto) {
  const std::string what = std::to_string(from) + " ranks stage " +
                           std::to_string(s0) + " -> " + std::to_string(to) +
                           " ranks stage " + std::to_string(s1);
  TrainConfig cfg;
  cfg.steps = 5;
  cfg.stage = s0;
  cfg.save = root;
  auto m = MakeTransformer();
  TrainResult ref;
  if (cfrom != MPI_COMM_NULL) {
    cfg.comm = cfrom;
    TrainResult saved = TrainSharded(*m, cfg);
    EXPECT_EQ(saved.status, ZS_OK) << what << ": " << saved.error;
    cfg.save = "";
    cfg.first_step = 5;
    cfg.steps = 2;
    cfg.load = root;
    ref = TrainSharded(*m, cfg);
    EXPECT_EQ(ref.status, ZS_OK) << what << ": " << ref.error;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (cto != MPI_COMM_NULL) {
    TrainConfig c2;
    c2.comm = cto;
    c2.stage = s1;
    c2.first_step = 5;
    c2.steps = 2;
    c2.load = root;
    auto m2 = MakeTransformer();
    TrainResult got = TrainSharded(*m2, c2);
    EXPECT_EQ(got.status, ZS_OK) << what << ": " << got.error;
    if (cfrom != MPI_COMM_NULL && got.status == ZS_OK && ref.status == ZS_OK) {
      for (size_t i = 0; i < m->tensors.size(); i++) {
        const std::string w = what + " tensor '" + m->tensors[i].name + "'";
        EXPECT_TRUE(CloseByNorm(got.params[i], ref.params[i], kRel)) << w;
        EXPECT_TRUE(CloseByNorm(got.state0[i], ref.state0[i], kRel)) << w;
        EXPECT_TRUE(CloseByNorm(got.state1[i], ref.state1[i], kRel)) << w;
      }
      for (int s = 0; s < 2; s++)
        EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s]))
            << what << " step " << 5 + s;
      EXPECT_EQ(got.infos.back().step, 7) << what;
    }
  }
  (void)t;
  (void)rank;
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(CheckpointTest, ReshardToFewerMoreAndOtherStages) {
  // From all ranks to half and to the next smaller size that divides the
  // global batch of 24 (4->2, 4->3, 8->4, 8->6, 3->1, 3->2, 2->1), and from
  // 2 ranks to all (2->3, 2->4, 2->8), with changes of stage as well.
  struct Move { int from, to, s0, s1; };
  std::vector<Move> moves;
  int smaller = world_ - 1;
  while (smaller > 1 && kGlobalBatch % smaller != 0) smaller--;
  if (world_ > 1) moves.push_back({world_, world_ / 2, 3, 3});
  if (world_ > 2) moves.push_back({world_, smaller, 3, 1});
  if (world_ > 2) moves.push_back({2, world_, 1, 3});
  if (world_ == 1) moves.push_back({1, 1, 0, 3});
  int k = 0;
  for (const Move& mv : moves) {
    MPI_Comm cfrom = FirstRanks(mv.from), cto = FirstRanks(mv.to);
    Reshard(this, rank_, mv.from, mv.to, mv.s0, mv.s1,
            dir_ + "/move" + std::to_string(k++), cfrom, cto);
    if (cfrom != MPI_COMM_NULL) MPI_Comm_free(&cfrom);
    if (cto != MPI_COMM_NULL) MPI_Comm_free(&cto);
  }
}

// ==== Weights only ==========================================================

TEST_F(CheckpointTest, WeightsOnlyIntoAnotherOptimizer) {
  TrainConfig cfg;
  cfg.stage = 2;
  cfg.steps = 3;
  cfg.save = dir_ + "/w";
  auto m = MakeTransformer();
  TrainResult saved = TrainSharded(*m, cfg);
  ASSERT_EQ(saved.status, ZS_OK) << saved.error;
  // A full load into an SGD model is refused (different optimizer).
  TrainConfig sgd;
  sgd.stage = 3;
  sgd.optimizer = ZS_OPTIM_SGD;
  sgd.steps = 0;
  sgd.load = cfg.save;
  auto m2 = MakeTransformer();
  TrainResult refused = TrainSharded(*m2, sgd);
  EXPECT_EQ(refused.status, ZS_ERR_MISMATCH);
  EXPECT_NE(refused.error.find("ZS_LOAD_WEIGHTS_ONLY"), std::string::npos)
      << refused.error;
  // Weights only: the parameters, nothing else.
  sgd.load_flags = ZS_LOAD_WEIGHTS_ONLY;
  auto m3 = MakeTransformer();
  TrainResult w = TrainSharded(*m3, sgd);
  ASSERT_EQ(w.status, ZS_OK) << w.error;
  for (size_t t = 0; t < m->tensors.size(); t++) {
    EXPECT_TRUE(Bitwise(w.params[t], saved.params[t])) << m->tensors[t].name;
    for (float x : w.state0[t]) EXPECT_EQ(x, 0.0f) << m->tensors[t].name;
  }
}

// ==== 4. Damaged checkpoints: a clear error naming the file, nothing loaded

class DamageTest : public CheckpointTest {
 protected:
  // Saves a trained Transformer checkpoint into dir_/good.
  void SaveGood() {
    TrainConfig cfg;
    cfg.stage = 3;
    cfg.steps = 2;
    cfg.save = dir_ + "/good";
    cfg.save_name = "ck";
    auto m = MakeTransformer();
    TrainResult r = TrainSharded(*m, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
  }
  // Copies the good checkpoint to dir_/bad/ck (rank 0), damages it with
  // `damage` (rank 0), then loads it into a freshly initialized model at
  // stage `stage` and expects `want` on the rank(s) that found it (REMOTE
  // elsewhere), a message naming `file` on every rank, and the model's
  // parameters and moments unchanged.
  void ExpectRefused(const std::function<void(const std::string&)>& damage,
                     zs_status want, const std::string& file, int stage,
                     const std::string& load_path = "") {
    const std::string bad = dir_ + "/bad";
    if (rank_ == 0) {
      fs::remove_all(bad);
      fs::create_directories(bad);
      fs::copy(dir_ + "/good/ck", bad + "/ck");
      std::ofstream(bad + "/latest") << "ck\n";
      damage(bad + "/ck");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    zs_context* ctx = nullptr;
    zs_model* zm = nullptr;
    auto model = MakeTransformer();
    ASSERT_EQ(BuildModel(c, *model, &ctx, &zm), ZS_OK) << zs_last_error();
    auto snapshot = [&]() {
      std::vector<std::vector<float>> v;
      for (size_t t = 0; t < model->tensors.size(); t++) {
        std::vector<float> p(model->tensors[t].numel());
        EXPECT_EQ(GetFloat(zm, (int)t, ZS_FIELD_PARAM, p), ZS_OK);
        v.push_back(p);
      }
      return v;
    };
    auto before = snapshot();
    zs_status st = zs_checkpoint_load(
        zm, (load_path.empty() ? bad : load_path).c_str(), 0, nullptr, 0,
        nullptr);
    std::string err = zs_last_error();
    EXPECT_NE(st, ZS_OK);
    if (st != ZS_ERR_REMOTE) {
      EXPECT_EQ(st, want) << err;
    }
    EXPECT_NE(err.find(file), std::string::npos)
        << "the error should name " << file << ": " << err;
    auto after = snapshot();
    for (size_t t = 0; t < before.size(); t++)
      EXPECT_TRUE(Bitwise(after[t], before[t])) << model->tensors[t].name;
    zs_model_destroy(zm);
    zs_context_destroy(ctx);
  }
};

std::string RankFile(int r) {
  char b[32];
  std::snprintf(b, sizeof b, "rank-%05d.bin", r);
  return b;
}

void FlipByte(const std::string& path, long at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(at);
  f.write(&c, 1);
}

TEST_F(DamageTest, TruncatedRankFile) {
  SaveGood();
  ExpectRefused([](const std::string& d) {
    fs::resize_file(d + "/" + RankFile(0), fs::file_size(d + "/" + RankFile(0)) / 2);
  }, ZS_ERR_CORRUPT, RankFile(0), 3);
}

TEST_F(DamageTest, FlippedByteInTheLastRankFile) {
  SaveGood();
  const std::string last = RankFile(world_ - 1);
  ExpectRefused([&](const std::string& d) { FlipByte(d + "/" + last, 100); },
                ZS_ERR_CORRUPT, last, 1);
}

TEST_F(DamageTest, MissingRankFile) {
  SaveGood();
  const std::string last = RankFile(world_ - 1);
  ExpectRefused([&](const std::string& d) { fs::remove(d + "/" + last); },
                ZS_ERR_IO, last, 0);
}

TEST_F(DamageTest, FlippedByteInTheMetadata) {
  SaveGood();
  ExpectRefused([](const std::string& d) { FlipByte(d + "/meta.json", 40); },
                ZS_ERR_CORRUPT, "meta.json", 3);
}

// A metadata file far larger than any model's (a sparse 1 GiB here) is
// refused by its size before anything reads it.
TEST_F(DamageTest, HugeMetadataRefusedUnread) {
  SaveGood();
  ExpectRefused([](const std::string& d) {
    fs::resize_file(d + "/meta.json", (uintmax_t)1 << 30);
  }, ZS_ERR_CORRUPT, "meta.json", 0);
}

// A checksum file that does not hold hex digits is named as damaged.
TEST_F(DamageTest, MetadataChecksumNotHex) {
  SaveGood();
  ExpectRefused([](const std::string& d) {
    std::ofstream(d + "/meta.json.xxh64", std::ios::trunc) << "zzzz\n";
  }, ZS_ERR_CORRUPT, "meta.json.xxh64", 0);
}

// Metadata edited by hand with a recomputed checksum: a tensor moved onto
// the one before it (the same elements read for both) is refused.
TEST_F(DamageTest, OverlappingTensorsWithAValidChecksum) {
  SaveGood();
  ExpectRefused([](const std::string& d) {
    std::ifstream in(d + "/meta.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // the second listed tensor offset set to 0, where the first tensor of
    // the same unit starts
    size_t first = text.find("\"offset\":");
    size_t second = text.find("\"offset\":", first + 1);
    ASSERT_NE(second, std::string::npos);
    size_t num = text.find_first_of("0123456789", second);
    size_t end = text.find_first_not_of("0123456789", num);
    text.replace(num, end - num, "0");
    std::ofstream(d + "/meta.json", std::ios::trunc) << text;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  (unsigned long long)XXH64(text.data(), text.size(), 0));
    std::ofstream(d + "/meta.json.xxh64", std::ios::trunc) << hex << "\n";
  }, ZS_ERR_CORRUPT, "overlaps the tensor before it", 0);
}

TEST_F(DamageTest, TruncatedExtras) {
  SaveGood();
  // The checkpoint has no extras: an extra byte is damage as well.
  ExpectRefused([](const std::string& d) {
    std::ofstream(d + "/extras.bin", std::ios::app) << "x";
  }, ZS_ERR_CORRUPT, "extras.bin", 2);
}

TEST_F(DamageTest, MetadataOfADifferentModel) {
  TrainConfig cfg;
  cfg.steps = 1;
  cfg.save = dir_ + "/mlp";
  auto mlp = MakeMlp();
  TrainResult r = TrainSharded(*mlp, cfg);
  ASSERT_EQ(r.status, ZS_OK) << r.error;
  SaveGood();
  ExpectRefused([](const std::string&) {}, ZS_ERR_MISMATCH, "meta.json", 3,
                dir_ + "/mlp");
}

TEST_F(DamageTest, NotACheckpoint) {
  SaveGood();
  ExpectRefused([](const std::string&) {}, ZS_ERR_IO, "nothing-here", 3,
                dir_ + "/nothing-here");
}

// ==== Extras without a model ================================================

// zs_checkpoint_read_extras reads rank 0's extras with no model, context or
// MPI call, after verifying them, and says how large they are when they do
// not fit; damage and a missing checkpoint are named.
// zs_checkpoint_read_tensors lists the saved tensors (names, shapes,
// dtypes, ties) with no model, context or MPI call: exactly the model's
// registration, count first, and refuses a list too small for them.
TEST_F(CheckpointTest, ReadTensorsNeedsNoModel) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  zs_context* ctx = nullptr;
  zs_model* zm = nullptr;
  auto model = MakeTransformer();
  ASSERT_EQ(BuildModel(c, *model, &ctx, &zm), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "ck", nullptr, 0), ZS_OK)
      << zs_last_error();
  const int want = zs_model_tensor_count(zm);
  std::vector<zs_tensor_desc> descs(want);
  for (int i = 0; i < want; i++) ASSERT_EQ(zs_model_tensor_desc(zm, i, &descs[i]), ZS_OK);
  int n = -1;
  ASSERT_EQ(zs_checkpoint_read_tensors(dir_.c_str(), nullptr, 0, &n), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(n, want);
  std::vector<zs_checkpoint_tensor> got(n);
  ASSERT_EQ(zs_checkpoint_read_tensors((dir_ + "/ck").c_str(), got.data(), n, &n), ZS_OK);
  for (int i = 0; i < want; i++) {
    EXPECT_STREQ(got[i].name, descs[i].name);
    EXPECT_EQ(got[i].ndim, descs[i].ndim) << descs[i].name;
    for (int d = 0; d < descs[i].ndim; d++)
      EXPECT_EQ(got[i].shape[d], descs[i].shape[d]) << descs[i].name;
    EXPECT_EQ(got[i].numel, descs[i].numel) << descs[i].name;
    EXPECT_EQ(got[i].dtype, descs[i].dtype) << descs[i].name;
    EXPECT_EQ(got[i].tied_to, descs[i].tied_to) << descs[i].name;
  }
  zs_checkpoint_tensor one;
  std::memset(&one, 0x5a, sizeof one);
  EXPECT_EQ(zs_checkpoint_read_tensors(dir_.c_str(), &one, 1, &n), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, want) << "the count, so the caller can retry";
  EXPECT_EQ(((unsigned char*)&one)[0], 0x5a) << "nothing copied";
  EXPECT_EQ(zs_checkpoint_read_tensors((dir_ + "/nope").c_str(), nullptr, 0, &n),
            ZS_ERR_IO);
  EXPECT_EQ(zs_checkpoint_read_tensors(dir_.c_str(), nullptr, 0, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
}

TEST_F(CheckpointTest, ReadExtrasNeedsNoModel) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  zs_context* ctx = nullptr;
  zs_model* zm = nullptr;
  auto model = MakeTransformer();
  ASSERT_EQ(BuildModel(c, *model, &ctx, &zm), ZS_OK) << zs_last_error();
  const char extras[] = "rank 0's training state";
  const char other[] = "ignored on the other ranks";
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "ck", rank_ == 0 ? extras : other,
                               rank_ == 0 ? sizeof extras : sizeof other),
            ZS_OK) << zs_last_error();
  zs_model_destroy(zm);
  zs_context_destroy(ctx);

  char buf[64] = {0};
  size_t n = 0;
  for (const std::string& path : {dir_, dir_ + "/ck"}) {  // a root, a directory
    memset(buf, 0, sizeof buf);
    EXPECT_EQ(zs_checkpoint_read_extras(path.c_str(), buf, sizeof buf, &n), ZS_OK)
        << zs_last_error();
    EXPECT_EQ(n, sizeof extras);
    EXPECT_STREQ(buf, extras);
  }
  EXPECT_EQ(zs_checkpoint_read_extras(dir_.c_str(), nullptr, 0, &n), ZS_OK);  // verify only
  EXPECT_EQ(n, sizeof extras);
  char small[4] = {'k', 'e', 'e', 'p'};
  EXPECT_EQ(zs_checkpoint_read_extras(dir_.c_str(), small, sizeof small, &n),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, sizeof extras) << "the size, so the caller can retry";
  EXPECT_EQ(std::string(small, 4), "keep") << "nothing copied";
  EXPECT_NE(std::string(zs_last_error()).find("extras are 24 bytes, the buffer holds 4"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs_checkpoint_read_extras(nullptr, buf, sizeof buf, &n), ZS_ERR_INVALID_ARGUMENT);
  const std::string missing = dir_ + "/nothing-here";
  EXPECT_EQ(zs_checkpoint_read_extras(missing.c_str(), buf, sizeof buf, &n), ZS_ERR_IO);
  EXPECT_NE(std::string(zs_last_error()).find(missing), std::string::npos) << zs_last_error();
  EXPECT_EQ(n, 0u);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank_ == 0) FlipByte(dir_ + "/ck/extras.bin", 3);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(zs_checkpoint_read_extras(dir_.c_str(), buf, sizeof buf, &n), ZS_ERR_CORRUPT);
  EXPECT_NE(std::string(zs_last_error()).find("extras.bin"), std::string::npos)
      << zs_last_error();
}

// ==== Save errors ===========================================================

TEST_F(CheckpointTest, SaveRefusesMidAccumulationAndBadNames) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  c.grad_accum_steps = 2;
  zs_context* ctx = nullptr;
  zs_model* zm = nullptr;
  auto model = MakeMlp();
  ASSERT_EQ(BuildModel(c, *model, &ctx, &zm), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "../x", nullptr, 0),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "latest", nullptr, 0),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_checkpoint_save(zm, nullptr, nullptr, nullptr, 0),
            ZS_ERR_INVALID_ARGUMENT);
  zs_step_info info{};
  ASSERT_EQ(zs_step(zm, &info), ZS_OK);  // micro-batch 1 of 2
  EXPECT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "mid", nullptr, 0),
            ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("accumulation"),
            std::string::npos) << zs_last_error();
  ASSERT_EQ(zs_step(zm, &info), ZS_OK);
  // A root that is a file: IO naming it, on every rank.
  const std::string file = dir_ + "/plainfile";
  if (rank_ == 0) std::ofstream(file) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  zs_status st = zs_checkpoint_save(zm, file.c_str(), "a", nullptr, 0);
  EXPECT_TRUE(st == ZS_ERR_IO || st == ZS_ERR_REMOTE) << zs_status_string(st);
  EXPECT_NE(std::string(zs_last_error()).find("plainfile"), std::string::npos)
      << zs_last_error();
  // Extras round trip, and a too-small buffer is refused before loading.
  const char blob[] = "data position 12345";
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "ok", blob, sizeof blob),
            ZS_OK);
  char back[64] = {0};
  size_t got = 0;
  ASSERT_EQ(zs_checkpoint_load(zm, dir_.c_str(), 0, back, sizeof back, &got),
            ZS_OK);
  EXPECT_EQ(got, sizeof blob);
  EXPECT_STREQ(back, blob);
  EXPECT_EQ(zs_checkpoint_load(zm, dir_.c_str(), 0, back, 4, &got),
            ZS_ERR_INVALID_ARGUMENT);
  // Saving again under the same name replaces it whole.
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "ok", nullptr, 0), ZS_OK);
  ASSERT_EQ(zs_checkpoint_load(zm, dir_.c_str(), 0, back, sizeof back, &got),
            ZS_OK);
  EXPECT_EQ(got, 0u);
  if (rank_ == 0) {
    EXPECT_FALSE(fs::exists(dir_ + "/.old-ok"));
    EXPECT_FALSE(fs::exists(dir_ + "/.tmp-ok"));
  }
  // A root inside a checkpoint is refused before anything is written.
  for (const std::string& inner : {dir_ + "/ok", dir_ + "/ok/sub"}) {
    st = zs_checkpoint_save(zm, inner.c_str(), "x", nullptr, 0);
    EXPECT_TRUE(st == ZS_ERR_IO || st == ZS_ERR_REMOTE) << zs_status_string(st);
    EXPECT_NE(std::string(zs_last_error()).find("checkpoint directory"),
              std::string::npos) << zs_last_error();
    if (rank_ == 0) {
      EXPECT_FALSE(fs::exists(dir_ + "/ok/x") || fs::exists(dir_ + "/ok/sub"));
    }
  }
  EXPECT_EQ(zs_checkpoint_check_root((dir_ + "/ok").c_str()), ZS_ERR_IO);
  EXPECT_EQ(zs_checkpoint_check_root(dir_.c_str()), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_checkpoint_check_root((dir_ + "/new/deeper").c_str()), ZS_OK);
  EXPECT_FALSE(fs::exists(dir_ + "/new"));
  EXPECT_EQ(zs_checkpoint_check_root(std::string(3900, 'x').c_str()),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_checkpoint_check_root(""), ZS_ERR_INVALID_ARGUMENT);
  // A moved-aside copy that a crash left beside its replacement, holding a
  // file of the user's: the next save keeps it whole under a visible name
  // (nothing of it removed) instead of half-removing it or stopping on it.
  if (rank_ == 0) {
    fs::create_directory(dir_ + "/.old-ok");
    std::ofstream(dir_ + "/.old-ok/meta.json") << "{}";
    std::ofstream(dir_ + "/.old-ok/notes.txt") << "mine";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "next", nullptr, 0), ZS_OK)
      << zs_last_error();
  if (rank_ == 0) {
    EXPECT_FALSE(fs::exists(dir_ + "/.old-ok"));
    EXPECT_TRUE(fs::exists(dir_ + "/ok.replaced/notes.txt"));
    EXPECT_TRUE(fs::exists(dir_ + "/ok.replaced/meta.json"));
    EXPECT_TRUE(fs::exists(dir_ + "/ok/meta.json"));
  }
  // Another save writing into the root (its flock held here on rank 0): this
  // one fails before clearing or writing anything, on every rank.
  int held = -1;
  if (rank_ == 0) {
    held = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(held, 0);
    ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
    fs::create_directory(dir_ + "/.tmp-other");  // that save's temporary
  }
  MPI_Barrier(MPI_COMM_WORLD);
  st = zs_checkpoint_save(zm, dir_.c_str(), "locked", nullptr, 0);
  EXPECT_TRUE(st == ZS_ERR_IO || st == ZS_ERR_REMOTE) << zs_status_string(st);
  EXPECT_NE(std::string(zs_last_error()).find("another save is writing into"),
            std::string::npos) << zs_last_error();
  if (rank_ == 0) {
    EXPECT_TRUE(fs::exists(dir_ + "/.tmp-other"));
    EXPECT_FALSE(fs::exists(dir_ + "/.tmp-locked") || fs::exists(dir_ + "/locked"));
    close(held);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_EQ(zs_checkpoint_save(zm, dir_.c_str(), "locked", nullptr, 0), ZS_OK)
      << zs_last_error();
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
}

// ==== 3. Consolidation, read back by an independent reader (Python) ========

TEST_F(CheckpointTest, ConsolidatedEqualsGatheredMasterReadByPython) {
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Model>()> make;
    zs_dtype dtype;
  };
  const Case cases[] = {{"transformer_bf16", MakeTransformer, ZS_BFLOAT16},
                        {"degenerate_fp32", MakeDegenerate, ZS_FLOAT32}};
  for (const Case& c : cases) {
    TrainConfig cfg;
    cfg.stage = 3;
    cfg.steps = 3;
    cfg.param_dtype = c.dtype;
    cfg.save = dir_ + "/" + c.name;
    auto m = c.make();
    TrainResult r = TrainSharded(*m, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    if (rank_ != 0) continue;
    // The reference: every tensor's gathered fp32 master (the parameters
    // of fp32 tensors), one raw file each, and the ties.
    const std::string ref = dir_ + "/" + c.name + "-ref";
    fs::create_directories(ref);
    std::ofstream list(ref + "/tensors.txt");
    for (size_t t = 0; t < m->tensors.size(); t++) {
      const TensorSpec& ts = m->tensors[t];
      const std::vector<float>& v =
          r.master[t].empty() ? r.params[t] : r.master[t];
      // Trained 16-bit tensors have a master copy (tied ones read the
      // owner's); frozen ones are their parameters, widened exactly.
      const TensorSpec& own = ts.tie >= 0 ? m->tensors[ts.tie] : ts;
      if (c.dtype != ZS_FLOAT32 && !own.frozen) {
        EXPECT_FALSE(r.master[t].empty()) << ts.name;
      }
      std::ofstream(ref + "/" + ts.name + ".f32", std::ios::binary)
          .write((const char*)v.data(), (std::streamsize)(v.size() * 4));
      list << ts.name << " " << (ts.tie >= 0 ? m->tensors[ts.tie].name : "-");
      for (int64_t d : ts.shape) list << " " << d;
      list << "\n";
    }
    list.close();
    struct Out { const char* file; zs_dtype dtype; int dup; const char* flags; };
    const Out outs[] = {{"fp32.safetensors", ZS_FLOAT32, 0, ""},
                        {"bf16.safetensors", ZS_BFLOAT16, 0, " --bf16"},
                        {"dup.safetensors", ZS_FLOAT32, 1, " --duplicate-tied"}};
    for (const Out& o : outs) {
      const std::string out = dir_ + "/" + c.name + "-" + o.file;
      ASSERT_EQ(zs_checkpoint_consolidate(cfg.save.c_str(), out.c_str(),
                                          o.dtype, o.dup),
                ZS_OK)
          << zs_last_error();
      const std::string cmd = "python3 tests/runtime/safetensors_check.py '" +
                              out + "' '" + ref + "'" + o.flags;
      EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
}

}  // namespace
