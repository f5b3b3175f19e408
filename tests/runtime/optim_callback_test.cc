// optim_callback_test.cc — a user's optimizer (zs_model_set_optimizer) and
// the state a resume needs:
//   - Lion (Chen et al. 2023, arXiv:2302.06675) and AdamW computed as
//     llm.c's train_gpt2.c does (float betas, 1.0f - beta, m_hat / (sqrtf
//     (v_hat) + eps) + wd * param) through the callback equal the same rule
//     applied by hand to each whole tensor on one process, bitwise, at
//     stages 0-3, with CPU offload off and on, and with NVMe offload in 3
//     sub-groups (1-4 ranks; the reference sums the ranks' gradients in rank
//     order, as the engine does);
//   - a callback run saved at one world size and loaded at another continues
//     bitwise like the reference (the harness's checkpoints at W and 3);
//   - learning rates, step counts and per-rank blobs round-trip; the
//     checkpoint of format version 1 (tests/runtime/testdata/ckpt_v1) loads
//     bitwise;
//   - bad input: a callback failing on one rank fails every rank naming it
//     (and the next steps are refused until a load), a NULL callback, zero
//     or too many state buffers, a mismatched optimizer on load.
#include <gtest/gtest.h>
#include <mpi.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/runtime/ckpt_fixture_model.h"
#include "tests/runtime/test_harness.h"
#include "tests/testing/mpi_test.h"

using namespace zstest;

namespace {

// Lion: c = b1*m + (1-b1)*g; p -= lr*(sign(c) + wd*p); m = b2*m + (1-b2)*g.
// Float math throughout (the hyper-parameters rounded to float once).
zs_status Lion(void*, const zs_optim_span* s) {
  const float lr = (float)s->lr, wd = (float)s->weight_decay;
  const float b1 = (float)s->beta1, b2 = (float)s->beta2;
  float* m = s->state[0];
  for (size_t i = 0; i < s->n; i++) {
    const float g = s->grad[i];
    const float c = b1 * m[i] + (1.0f - b1) * g;
    const float sign = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : 0.0f;
    s->param[i] -= lr * (sign + wd * s->param[i]);
    m[i] = b2 * m[i] + (1.0f - b2) * g;
  }
  return ZS_OK;
}

// AdamW as llm.c's gpt2_update computes it.
zs_status LlmcAdamW(void*, const zs_optim_span* s) {
  const float lr = (float)s->lr, wd = (float)s->weight_decay;
  const float beta1 = (float)s->beta1, beta2 = (float)s->beta2;
  const float eps = (float)s->eps;
  const float c1 = 1.0f - powf(beta1, (float)s->step);
  const float c2 = 1.0f - powf(beta2, (float)s->step);
  float *mm = s->state[0], *vv = s->state[1];
  for (size_t i = 0; i < s->n; i++) {
    const float param = s->param[i], grad = s->grad[i];
    const float m = beta1 * mm[i] + (1.0f - beta1) * grad;
    const float v = beta2 * vv[i] + (1.0f - beta2) * grad * grad;
    const float m_hat = m / c1, v_hat = v / c2;
    mm[i] = m;
    vv[i] = v;
    s->param[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + wd * param);
  }
  return ZS_OK;
}

struct Rule {
  const char* name;
  zs_optimizer_fn fn;
  int nstates;
};
const Rule kRules[] = {{"lion", Lion, 1}, {"llmc-adamw", LlmcAdamW, 2}};

void UseRule(TrainConfig* cfg, const Rule& r) {
  cfg->optim_fn = r.fn;
  cfg->optim_nstates = r.nstates;
  cfg->optim_name = r.name;
  cfg->steps = 6;
}

// Params and every state buffer of the sharded run equal the reference's.
void ExpectSameAsReference(const TrainResult& ref, const TrainResult& got,
                           const Model& m, int nstates, const std::string& w) {
  ASSERT_EQ(got.status, ZS_OK) << w << ": " << got.error;
  ASSERT_EQ(ref.params.size(), got.params.size()) << w;
  for (size_t t = 0; t < m.tensors.size(); t++) {
    const TensorSpec& ts = m.tensors[t];
    const TensorSpec& own = ts.tie >= 0 ? m.tensors[ts.tie] : ts;
    const std::string where = w + " tensor '" + ts.name + "'";
    EXPECT_TRUE(Bitwise(got.params[t], ref.params[t])) << where;
    if (own.frozen) continue;
    EXPECT_TRUE(Bitwise(got.state0[t], ref.state0[t])) << where << " state 0";
    if (nstates > 1) {
      EXPECT_TRUE(Bitwise(got.state1[t], ref.state1[t])) << where << " state 1";
    }
  }
}

class OptimCallbackTest : public ZsMpiTest {};

// The largest unit's optimizer span at this world size and stage, so that
// a sub-group of a third of it makes 3 sub-groups.
size_t LargestSpan(Model& model, int stage) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = stage;
  zs_context* ctx = nullptr;
  zs_model* zm = nullptr;
  size_t most = 0;
  if (zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx) != ZS_OK) return 0;
  if (zs_model_create(ctx, &zm) == ZS_OK && RegisterModel(model, zm) == ZS_OK &&
      zs_model_finalize(zm) == ZS_OK)
    for (int u = 0; u < zs_model_unit_count(zm); u++) {
      size_t used, padded, shard;
      zs_unit_layout(zm, u, &used, &padded, &shard);
      const size_t span = stage == 0 ? padded : shard;
      if (span > most) most = span;
    }
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
  return most;
}

TEST_F(OptimCallbackTest, LionAndLlmcAdamWAreBitwiseTheRuleByHand) {
  struct Named {
    const char* name;
    std::unique_ptr<Model> (*make)();
  };
  for (const Named& mk : {Named{"transformer", MakeTransformer},
                          Named{"degenerate", MakeDegenerate}}) {
    auto make = mk.make;
    for (const Rule& r : kRules) {
      for (int stage = 0; stage <= 3; stage++) {
        for (int offload = 0; offload <= 2; offload++) {
          auto model = make();
          TrainConfig cfg;
          cfg.stage = stage;
          UseRule(&cfg, r);
          cfg.offload = offload;
          std::string dir;
          if (offload == 2) {
            dir = TestDir("optim_cb_nvme");
            cfg.nvme.path = dir.c_str();
            const size_t span = LargestSpan(*model, stage);
            cfg.nvme.sub_group_size = span / 3 + (span % 3 != 0);
          }
          const std::string w = std::string(mk.name) + " " + r.name + " stage " +
                                std::to_string(stage) + " offload " +
                                std::to_string(offload);
          cfg.reference_world = world_;
          TrainResult ref = TrainReference(*make(), cfg);
          ASSERT_EQ(ref.status, ZS_OK) << w << ": " << ref.error;
          TrainResult got = TrainSharded(*model, cfg);
          ExpectSameAsReference(ref, got, *model, r.nstates, w);
          if (offload == 2) ExpectEmptyDir(dir, w);
        }
      }
    }
  }
}

// Saved at this world size, loaded at 3 ranks (the ranks past 3 idle on a
// sub-communicator), continued: bitwise the reference of the whole run.
TEST_F(OptimCallbackTest, ResumeAtAnotherWorldSizeIsBitwise) {
  for (const Rule& r : kRules) {
    for (int stage : {1, 3}) {
      auto model = MakeTransformer();
      TrainConfig cfg;
      cfg.stage = stage;
      UseRule(&cfg, r);
      const std::string root = TestDir("optim_cb_resume_" + std::string(r.name) +
                                       std::to_string(stage));
      const std::string w = std::string(r.name) + " stage " +
                            std::to_string(stage);
      TrainResult first = TrainSlice(*model, cfg, 0, 3, "", root, w + " save");
      // continue on 3 ranks (or fewer when the world is smaller): the
      // reference of W ranks' gradients for the first 3 steps, then of n's
      const int n = world_ < 3 ? world_ : 3;
      MPI_Comm sub = MPI_COMM_NULL;
      MPI_Comm_split(MPI_COMM_WORLD, rank_ < n ? 0 : MPI_UNDEFINED, rank_, &sub);
      TrainConfig rc = cfg;
      rc.reference_worlds = {world_, world_, world_, n};
      TrainResult ref = TrainReference(*MakeTransformer(), rc);
      if (sub != MPI_COMM_NULL) {
        auto m2 = MakeTransformer();
        TrainConfig c2 = cfg;
        c2.comm = sub;
        TrainResult rest = TrainSlice(*m2, c2, 3, 3, root, "", w + " load");
        ExpectSameAsReference(ref, rest, *m2, r.nstates, w + " resumed at " +
                              std::to_string(n) + " ranks");
        MPI_Comm_free(&sub);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

// One rank's callback fails at the second step: every rank's zs_step fails
// (the failing one naming its reason, the others naming that rank), the
// next steps are refused until a checkpoint is loaded, and then training
// goes on.
struct FailAt {
  int rank;
  int64_t step;
};
zs_status FailingLion(void* user, const zs_optim_span* s) {
  const FailAt* f = (const FailAt*)user;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == f->rank && s->step == f->step) {
    snprintf(s->error, s->error_cap, "NaN in the update of tensor %d", s->tensor);
    return ZS_ERR_INVALID_ARGUMENT;
  }
  return Lion(nullptr, s);
}

TEST_F(OptimCallbackTest, AFailingCallbackFailsEveryRankNamingIt) {
  FailAt fail = {world_ - 1, 2};
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 2;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  auto model = MakeMlp();
  zs_model* zm = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &zm), ZS_OK);
  ASSERT_EQ(RegisterModel(*model, zm), ZS_OK);
  ASSERT_EQ(zs_model_set_optimizer(zm, "lion", 1, FailingLion, &fail), ZS_OK);
  ASSERT_EQ(zs_model_finalize(zm), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_model_init(zm, InitCallback, model.get()), ZS_OK);
  const std::string root = TestDir("optim_cb_fail");
  ASSERT_EQ(zs_checkpoint_save(zm, root.c_str(), "start", nullptr, 0), ZS_OK);
  // gradients of 1 everywhere: the model's own forward is not needed
  auto step = [&]() {
    for (int u = 0; u < zs_model_unit_count(zm); u++) {
      EXPECT_EQ(zs_unit_gather(zm, u), ZS_OK);
      EXPECT_EQ(zs_unit_grad_acquire(zm, u), ZS_OK);
      for (int t = 0; t < zs_model_tensor_count(zm); t++) {
        zs_tensor_desc d;
        zs_model_tensor_desc(zm, t, &d);
        void* g = nullptr;
        if (d.unit != u || d.tied_to >= 0 || (d.flags & ZS_TENSOR_FROZEN) ||
            zs_tensor_grad(zm, t, &g) != ZS_OK)
          continue;
        for (size_t i = 0; i < d.numel; i++) ((float*)g)[i] = 1.0f;
      }
      EXPECT_EQ(zs_unit_grad_release(zm, u), ZS_OK);
      EXPECT_EQ(zs_unit_release(zm, u), ZS_OK);
    }
    return zs_step(zm, nullptr);
  };
  EXPECT_EQ(step(), ZS_OK) << zs_last_error();
  const zs_status st = step();
  const std::string err = zs_last_error();
  EXPECT_NE(st, ZS_OK);
  if (rank_ == fail.rank) {
    EXPECT_NE(err.find("NaN in the update of tensor"), std::string::npos) << err;
    EXPECT_NE(err.find("optimizer 'lion'"), std::string::npos) << err;
  } else {
    EXPECT_EQ(st, ZS_ERR_REMOTE) << err;
    EXPECT_NE(err.find("rank " + std::to_string(fail.rank)), std::string::npos)
        << err;
  }
  EXPECT_EQ(zs_step_discard(zm, nullptr), ZS_OK) << zs_last_error();
  EXPECT_EQ(step(), ZS_ERR_INVALID_STATE);
  EXPECT_NE(std::string(zs_last_error()).find("load a checkpoint"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs_step_discard(zm, nullptr), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_checkpoint_load(zm, root.c_str(), 0, nullptr, 0, nullptr), ZS_OK)
      << zs_last_error();
  fail.step = -1;
  EXPECT_EQ(step(), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_model_step_count(zm, 0), 1);
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
}

// The estimator with the description's "optimizer_states": a Lion model's
// optimizer states (one buffer) to the byte; without it, AdamW's two.
TEST_F(OptimCallbackTest, EstimateCountsTheCallbacksBuffers) {
  for (int stage : {0, 3}) {
    auto model = MakeTransformer();
    TrainConfig cfg;
    cfg.stage = stage;
    cfg.steps = 1;
    UseRule(&cfg, kRules[0]);
    TrainResult r = TrainSharded(*model, cfg);
    ASSERT_EQ(r.status, ZS_OK) << r.error;
    std::string d = DescribeModel(*model);
    d.insert(1, "\"optimizer_states\": 1, ");
    zs_config c = ZS_CONFIG_INIT;
    c.stage = stage;
    c.optimizer = OptimizerFor(cfg);
    zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
    in.ranks = world_;
    zs_memory_estimate e{}, e2{};
    e.struct_size = e2.struct_size = sizeof e;
    ASSERT_EQ(zs_estimate_from_model(d.c_str(), &c, &in, &e), ZS_OK)
        << zs_last_error();
    EXPECT_EQ(r.memory.current[ZS_MEM_OPTIMIZER_STATES],
              e.bytes[ZS_MEM_OPTIMIZER_STATES]) << "stage " << stage;
    EXPECT_EQ(r.memory.model_state_bytes, e.model_state_bytes);
    ASSERT_EQ(zs_estimate_from_model(DescribeModel(*model).c_str(), &c, &in, &e2),
              ZS_OK);
    EXPECT_EQ(e2.bytes[ZS_MEM_OPTIMIZER_STATES],
              2 * e.bytes[ZS_MEM_OPTIMIZER_STATES]);
    d.replace(d.find("1, "), 1, "9");
    EXPECT_EQ(zs_estimate_from_model(d.c_str(), &c, &in, &e2),
              ZS_ERR_INVALID_ARGUMENT);
  }
}

zs_status ReturnsNinetyNine(void*, const zs_optim_span*) {
  return (zs_status)99;
}

// A code outside zs_status comes back as INTERNAL with the value named.
TEST_F(OptimCallbackTest, AnUnknownCodeBecomesInternal) {
  auto model = MakeMlp();
  TrainConfig cfg;
  cfg.optim_fn = ReturnsNinetyNine;
  cfg.optim_nstates = 1;
  cfg.steps = 1;
  TrainResult r = TrainSharded(*model, cfg);
  if (world_ == 1) {
    EXPECT_EQ(r.status, ZS_ERR_INTERNAL) << r.error;
    EXPECT_NE(r.error.find("returned unknown status (99)"), std::string::npos)
        << r.error;
  } else {
    EXPECT_NE(r.status, ZS_OK);
  }
}

TEST_F(OptimCallbackTest, BadInput) {
  zs_config c = ZS_CONFIG_INIT;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  zs_model* zm = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &zm), ZS_OK);
  EXPECT_EQ(zs_model_set_optimizer(zm, "lion", 1, nullptr, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("fn is NULL"), std::string::npos);
  zs_model_destroy(zm);
  ASSERT_EQ(zs_model_create(ctx, &zm), ZS_OK);
  EXPECT_EQ(zs_model_set_optimizer(zm, "lion", 0, Lion, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("nstates 0 is not 1..4"),
            std::string::npos) << zs_last_error();
  EXPECT_EQ(zs_model_set_optimizer(zm, "lion", 5, Lion, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_model_set_optimizer(zm, "", 1, Lion, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zs_model_set_optimizer(zm, "adamw", 2, LlmcAdamW, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("a built-in optimizer's name"),
            std::string::npos) << zs_last_error();
  zs_model_destroy(zm);
  zs_context_destroy(ctx);

  // a checkpoint of another optimizer, or of another number of buffers
  auto model = MakeTransformer();
  TrainConfig cfg;
  cfg.stage = 1;
  cfg.steps = 2;
  const std::string root = TestDir("optim_cb_mismatch");
  TrainSlice(*model, cfg, 0, 2, "", root, "adamw save");
  for (const Rule& r : kRules) {
    ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
    auto m2 = MakeTransformer();
    ASSERT_EQ(zs_model_create(ctx, &zm), ZS_OK);
    ASSERT_EQ(RegisterModel(*m2, zm), ZS_OK);
    ASSERT_EQ(zs_model_set_optimizer(zm, r.name, r.nstates, r.fn, nullptr), ZS_OK);
    ASSERT_EQ(zs_model_finalize(zm), ZS_OK);
    EXPECT_EQ(zs_checkpoint_load(zm, root.c_str(), 0, nullptr, 0, nullptr),
              ZS_ERR_MISMATCH);
    const std::string err = zs_last_error();
    EXPECT_NE(err.find("saved with optimizer 'adamw' (2 state buffers), this "
                       "model runs '" + std::string(r.name) + "' (" +
                       std::to_string(r.nstates) + ")"),
              std::string::npos) << err;
    // the weights alone load
    EXPECT_EQ(zs_checkpoint_load(zm, root.c_str(), ZS_LOAD_WEIGHTS_ONLY, nullptr,
                                 0, nullptr),
              ZS_OK) << zs_last_error();
    zs_model_destroy(zm);
    zs_context_destroy(ctx);
  }
}

// Learning rates, step counts and per-rank blobs come back, at the same
// world size and at one rank (every rank reads any saved rank's blob).
TEST_F(OptimCallbackTest, LearningRatesStepsAndRankBlobsRoundTrip) {
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&c, MPI_COMM_WORLD, &ctx), ZS_OK);
  auto model = MakeMlp();
  zs_model* zm = nullptr;
  ASSERT_EQ(zs_model_create(ctx, &zm), ZS_OK);
  ASSERT_EQ(RegisterModel(*model, zm), ZS_OK);
  int g1 = -1;
  ASSERT_EQ(zs_model_add_param_group(zm, 1e-3, 0.0, &g1), ZS_OK);
  ASSERT_EQ(zs_model_finalize(zm), ZS_OK);
  ASSERT_EQ(zs_model_init(zm, InitCallback, model.get()), ZS_OK);
  EXPECT_EQ(zs_model_step_count(zm, 0), 0);
  EXPECT_EQ(zs_model_step_count(zm, 7), -1);
  ASSERT_EQ(zs_model_set_lr(zm, 0, 2.5e-4), ZS_OK);
  ASSERT_EQ(zs_model_set_lr(zm, g1, 7.5e-5), ZS_OK);
  const std::string blob = "rank " + std::to_string(rank_) + " data position " +
                           std::string((size_t)rank_ * 100, 'x');
  ASSERT_EQ(zs_checkpoint_set_rank_blob(zm, blob.data(), blob.size()), ZS_OK);
  const std::string root = TestDir("optim_cb_blobs");
  ASSERT_EQ(zs_checkpoint_save(zm, root.c_str(), "s", "extras", 6), ZS_OK)
      << zs_last_error();
  // every rank reads every saved rank's blob, without a model
  for (int r = 0; r < world_; r++) {
    size_t bytes = 0;
    int ranks = 0;
    std::vector<char> out(1000);
    ASSERT_EQ(zs_checkpoint_read_rank_blob(root.c_str(), r, out.data(),
                                           out.size(), &bytes, &ranks),
              ZS_OK) << zs_last_error();
    EXPECT_EQ(ranks, world_);
    const std::string want = "rank " + std::to_string(r) + " data position " +
                             std::string((size_t)r * 100, 'x');
    EXPECT_EQ(std::string(out.data(), bytes), want);
  }
  EXPECT_EQ(zs_checkpoint_read_rank_blob(root.c_str(), world_, nullptr, 0,
                                         nullptr, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zs_last_error()).find("there is no rank"),
            std::string::npos);
  // a buffer too small: the size is told, nothing copied
  size_t bytes = 0;
  char small[4];
  EXPECT_EQ(zs_checkpoint_read_rank_blob(root.c_str(), 0, small, sizeof small,
                                         &bytes, nullptr),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bytes, std::string("rank 0 data position ").size());
  // loaded into a fresh model (this world size, then one rank)
  for (int ranks : {world_, 1}) {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank_ < ranks ? 0 : MPI_UNDEFINED, rank_, &sub);
    if (sub != MPI_COMM_NULL) {
      zs_context* c2 = nullptr;
      ASSERT_EQ(zs_context_create_mpi(&c, sub, &c2), ZS_OK);
      zs_model* m2 = nullptr;
      auto model2 = MakeMlp();
      ASSERT_EQ(zs_model_create(c2, &m2), ZS_OK);
      ASSERT_EQ(RegisterModel(*model2, m2), ZS_OK);
      int h1 = -1;
      ASSERT_EQ(zs_model_add_param_group(m2, 1e-3, 0.0, &h1), ZS_OK);
      ASSERT_EQ(zs_model_finalize(m2), ZS_OK);
      EXPECT_EQ(zs_model_lr(m2, 0), c.optimizer.lr == ZS_UNSET_DOUBLE
                                        ? 1e-3 : c.optimizer.lr);
      ASSERT_EQ(zs_checkpoint_load(m2, root.c_str(), 0, nullptr, 0, nullptr),
                ZS_OK) << zs_last_error();
      EXPECT_EQ(zs_model_lr(m2, 0), 2.5e-4);
      EXPECT_EQ(zs_model_lr(m2, h1), 7.5e-5);
      EXPECT_EQ(zs_model_step_count(m2, 0), 0);
      zs_model_destroy(m2);
      zs_context_destroy(c2);
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  zs_model_destroy(zm);
  zs_context_destroy(ctx);
}

// The checkpoint of format version 1 (tests/runtime/testdata/ckpt_v1,
// written by ckpt_fixture_gen.cc with the library of that format) loads:
// parameters, master weights and moments bitwise the same 2 steps run
// here, step counts back, its extras read, its blobs empty, the groups'
// rates left as they are (version 1 did not save them); and it continues
// bitwise.
TEST_F(OptimCallbackTest, FormatVersion1StillLoadsBitwise) {
  if (rank_ != 0) return;  // one-rank local contexts, no collectives
  std::string dir = std::string(std::getenv("TEST_SRCDIR") ? std::getenv("TEST_SRCDIR") : ".") +
                    "/" + (std::getenv("TEST_WORKSPACE") ? std::getenv("TEST_WORKSPACE") : "__main__") +
                    "/tests/runtime/testdata/ckpt_v1";
  zsfixture::Fixture a, b;
  ASSERT_EQ(zsfixture::Build(&a), ZS_OK) << zs_last_error();
  ASSERT_EQ(zsfixture::Build(&b), ZS_OK) << zs_last_error();
  for (int s = 0; s < 2; s++) ASSERT_EQ(zsfixture::Step(&a, s), ZS_OK);
  char extras[64] = {0};
  size_t n = 0;
  ASSERT_EQ(zs_checkpoint_load(b.m, dir.c_str(), 0, extras, sizeof extras, &n),
            ZS_OK) << zs_last_error();
  EXPECT_STREQ(extras, "fixture extras");
  EXPECT_EQ(zs_model_step_count(b.m, 0), 2);
  EXPECT_EQ(zs_model_lr(b.m, 0), 1e-2);  // not saved by version 1
  size_t bytes = 1;
  int ranks = 0;
  EXPECT_EQ(zs_checkpoint_read_rank_blob(dir.c_str(), 0, nullptr, 0, &bytes, &ranks),
            ZS_OK);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(ranks, 1);
  for (int round = 0; round < 2; round++) {
    for (int t : a.tensors)
      for (zs_field f : {ZS_FIELD_PARAM, ZS_FIELD_EXP_AVG, ZS_FIELD_EXP_AVG_SQ,
                         ZS_FIELD_MASTER}) {
        if (zs_tensor_field_dtype(a.m, t, f) == ZS_DTYPE_COUNT) continue;
        zs_tensor_desc d;
        zs_model_tensor_desc(a.m, t, &d);
        const size_t sz = zs_dtype_size(zs_tensor_field_dtype(a.m, t, f)) * d.numel;
        std::vector<char> x(sz), y(sz);
        ASSERT_EQ(zs_tensor_get(a.m, t, f, x.data()), ZS_OK);
        ASSERT_EQ(zs_tensor_get(b.m, t, f, y.data()), ZS_OK);
        EXPECT_EQ(x, y) << "tensor " << d.name << " field " << (int)f
                        << (round ? " after one more step" : " as loaded");
      }
    ASSERT_EQ(zsfixture::Step(&a, 2), ZS_OK);
    ASSERT_EQ(zsfixture::Step(&b, 2), ZS_OK);
  }
  zsfixture::Destroy(&a);
  zsfixture::Destroy(&b);
}

}  // namespace
