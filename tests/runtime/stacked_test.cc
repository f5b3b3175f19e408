// stacked_test.cc — stacked kinds (zs_model_add_stacked, zeroshard.h):
//   - bad input fails naming the kind and the layer;
//   - on llm.c's GPT-2 layout (16 kinds, 12 stacked over L layers), held
//     the way the example trainer holds its units, at every stage: a held
//     unit's slices hold its values in the parameter view, gradients
//     written into the gradient view are what zs_step reduces, and the
//     pages resident in the views (measured: Rss of each mapping in
//     /proc/self/smaps) are exactly ZS_MEM_STACKED_VIEWS, and zero after
//     the release;
//   - at stage 3 the accounting's peak of the views, the parameters, the
//     gradients and the optimizer states equals the estimator's prediction
//     of the same layout (zs_estimate_from_model with "kind"/"kind_offset").
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>
#include <zeroshard.h>
#include <zs_mpi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/mpi_test.h"

namespace {

#define EXPECT_LAST_ERROR_HAS(text)                                     \
  EXPECT_NE(std::string(zs_last_error()).find(text), std::string::npos) \
      << "last error: " << zs_last_error()

class StackedTest : public ZsMpiTest {
 protected:
  zs_context* Context(int stage) {
    zs_config cfg = ZS_CONFIG_INIT;
    cfg.stage = stage;
    cfg.optimizer.lr = 1e-2;
    cfg.optimizer.weight_decay = 0.0;
    zs_context* ctx = nullptr;
    EXPECT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK)
        << zs_last_error();
    return ctx;
  }
};

// ---- Bad input: each a clear error naming the kind and the layer ----------

TEST_F(StackedTest, BadInputNamesKindAndLayer) {
  zs_context* ctx = Context(0);
  ASSERT_NE(ctx, nullptr);
  const int64_t shape[2] = {3, 10};
  int u0, u1, kind, t;
  auto fresh = [&](zs_model** m) {
    ASSERT_EQ(zs_model_create(ctx, m), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(*m, "a", &u0), ZS_OK);
    ASSERT_EQ(zs_model_add_unit(*m, "b", &u1), ZS_OK);
  };
  zs_model* m = nullptr;

  // overlapping slices
  fresh(&m);
  ASSERT_EQ(zs_model_add_kind(m, "qkvw", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u0, kind, 0, 0, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u1, kind, 1, 5, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'qkvw' layer 1");
  EXPECT_LAST_ERROR_HAS("overlaps layer 0's [0, 10)");
  // and finalize says so on every rank instead of hanging
  EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("overlaps");
  zs_model_destroy(m);

  // a slice outside its kind
  fresh(&m);
  ASSERT_EQ(zs_model_add_kind(m, "ln1w", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u0, kind, 2, 25, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'ln1w' layer 2");
  EXPECT_LAST_ERROR_HAS("outside the kind's 30 elements");
  zs_model_destroy(m);

  // a layer outside the kind's layers
  fresh(&m);
  ASSERT_EQ(zs_model_add_kind(m, "ln1b", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u0, kind, 3, 0, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'ln1b' layer 3: outside its layers 0..2");
  zs_model_destroy(m);

  // a stride that does not match the shape
  fresh(&m);
  const int owners[3] = {u0, u1, u0};
  EXPECT_EQ(zs_model_add_stacked(m, "fcw", 2, shape, 9, ZS_FLOAT32, 0, owners,
                                 &kind),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'fcw': layer stride 9 elements does not match "
                        "the shape (one layer is 10 elements");
  zs_model_destroy(m);

  // a layer owned twice
  fresh(&m);
  ASSERT_EQ(zs_model_add_kind(m, "fcb", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u0, kind, 1, 10, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u1, kind, 1, 20, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'fcb' layer 1 is already owned by unit 'a'");
  zs_model_destroy(m);

  // names: a kind twice, a slice's tensor name taken, an unknown kind
  fresh(&m);
  ASSERT_EQ(zs_model_add_kind(m, "wte", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_kind(m, "wte", 2, shape, ZS_FLOAT32, &kind),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'wte' is already registered");
  zs_model_destroy(m);
  fresh(&m);
  const int64_t one[1] = {10};
  ASSERT_EQ(zs_model_add_tensor(m, u0, "wpe.0", 1, one, ZS_FLOAT32, 0, &t),
            ZS_OK);
  ASSERT_EQ(zs_model_add_kind(m, "wpe", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, u1, kind, 0, 0, 0, &t),
            ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("tensor name 'wpe.0' is already registered");
  zs_model_destroy(m);
  fresh(&m);
  EXPECT_EQ(zs_model_add_slice(m, u0, 7, 0, 0, 0, &t), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 7 does not exist");
  zs_model_destroy(m);

  // views before finalize, a frozen kind's gradients, a bad unit prefix
  fresh(&m);
  int frozen = -1;
  void* p = nullptr;
  ASSERT_EQ(zs_model_add_stacked(m, "frozen", 2, shape, 10, ZS_FLOAT32,
                                 ZS_TENSOR_FROZEN, owners, &frozen),
            ZS_OK);
  EXPECT_EQ(zs_kind_data(m, frozen, &p), ZS_ERR_INVALID_STATE);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  EXPECT_EQ(zs_kind_data(m, frozen, &p), ZS_OK);
  EXPECT_EQ(zs_kind_grad(m, frozen, &p), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("kind 'frozen' has no gradients");
  int found = -1;
  EXPECT_EQ(zs_model_find_kind(m, "frozen", &found), ZS_OK);
  EXPECT_EQ(found, frozen);
  EXPECT_EQ(zs_model_kind_count(m), 1);
  zs_model_destroy(m);
  fresh(&m);
  int us[2];
  EXPECT_EQ(zs_model_add_units(m, "", 2, us), ZS_ERR_INVALID_ARGUMENT);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// ---- llm.c's layout ---------------------------------------------------------

constexpr int kV = 256, kMaxT = 64, kL = 4, kC = 64;
const char* const kNames[16] = {"wte",  "wpe",  "ln1w",     "ln1b",
                                "qkvw", "qkvb", "attprojw", "attprojb",
                                "ln2w", "ln2b", "fcw",      "fcb",
                                "fcprojw", "fcprojb", "lnfw", "lnfb"};
size_t KindNumel(int k) {
  const size_t s[16] = {kV * kC,         kMaxT * kC,  kL * kC,     kL * kC,
                        kL * 3 * kC * kC, kL * 3 * kC, kL * kC * kC, kL * kC,
                        kL * kC,         kL * kC,     kL * 4 * kC * kC,
                        kL * 4 * kC,     kL * kC * 4 * kC, kL * kC, kC, kC};
  return s[k];
}
int KindLayers(int k) { return k >= 2 && k < 14 ? kL : 1; }

struct Gpt2 {
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int E = -1, U[kL] = {};
  int kinds[16] = {};
  void* pv[16] = {};
  void* gv[16] = {};
};

float InitValue(int k, size_t i) { return 0.001f * (float)(k + 1) + 1e-6f * (float)(i % 997); }
float GradValue(int rank, int k, size_t i) {
  return 0.25f * (float)(rank + 1) + 0.01f * (float)k + 1e-5f * (float)(i % 101);
}

void Build(zs_context* ctx, Gpt2* g) {
  g->ctx = ctx;
  ASSERT_EQ(zs_model_create(ctx, &g->m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(g->m, "embed", &g->E), ZS_OK);
  ASSERT_EQ(zs_model_add_units(g->m, "block", kL, g->U), ZS_OK);
  for (int k = 0; k < 16; k++) {
    const int64_t L = KindLayers(k), shape[2] = {L, (int64_t)KindNumel(k) / L};
    ASSERT_EQ(zs_model_add_stacked(g->m, kNames[k], 2, shape, shape[1],
                                   ZS_FLOAT32, 0, k >= 2 && k < 14 ? g->U : &g->E,
                                   &g->kinds[k]),
              ZS_OK)
        << zs_last_error();
  }
  ASSERT_EQ(zs_unit_set_grad_uses(g->m, g->E, 2), ZS_OK);
  for (int l = 0; l < kL; l++)
    ASSERT_EQ(zs_unit_set_grad_uses(g->m, g->U[l], 1), ZS_OK);
  ASSERT_EQ(zs_model_finalize(g->m), ZS_OK) << zs_last_error();
  std::vector<float> init;
  for (int k = 0; k < 16; k++) {
    init.assign(KindNumel(k), 0.0f);
    for (size_t i = 0; i < init.size(); i++) init[i] = InitValue(k, i);
    ASSERT_EQ(zs_kind_set(g->m, g->kinds[k], init.data()), ZS_OK);
    ASSERT_EQ(zs_kind_data(g->m, g->kinds[k], &g->pv[k]), ZS_OK);
    ASSERT_EQ(zs_kind_grad(g->m, g->kinds[k], &g->gv[k]), ZS_OK);
  }
}

// Rss of each mapping by its start address, in bytes (/proc/self/smaps).
std::map<uintptr_t, size_t> Rss() {
  std::map<uintptr_t, size_t> rss;
  std::ifstream f("/proc/self/smaps");
  std::string line;
  uintptr_t at = 0;
  while (std::getline(f, line)) {
    if (line.rfind("Rss:", 0) == 0)
      rss[at] = (size_t)std::stoull(line.substr(4)) * 1024;
    else if (!line.empty() && std::isxdigit((unsigned char)line[0]) &&
             line.find('-') != std::string::npos &&
             line.find(':') > line.find(' '))
      at = (uintptr_t)std::stoull(line.substr(0, line.find('-')), nullptr, 16);
  }
  return rss;
}

size_t MappingRss(const void* base) {
  const std::map<uintptr_t, size_t> rss = Rss();
  auto it = rss.find((uintptr_t)base);
  return it == rss.end() ? 0 : it->second;
}

size_t ViewsRss(const Gpt2& g) {
  const std::map<uintptr_t, size_t> rss = Rss();
  size_t n = 0;
  for (int k = 0; k < 16; k++)
    for (const void* b : {g.pv[k], g.gv[k]}) {
      auto it = rss.find((uintptr_t)b);
      n += it == rss.end() ? 0 : it->second;
    }
  return n;
}

size_t ViewsAccounted(zs_context* ctx) {
  zs_memory_stats s{};
  s.struct_size = sizeof s;
  zs_memory_stats_get(ctx, &s);
  return s.current[ZS_MEM_STACKED_VIEWS];
}

// Unit u's kinds (the blocks' 12 stacked kinds, or the embedding unit's 4)
// and their layer.
std::vector<int> KindsOf(const Gpt2& g, int unit, int* layer) {
  std::vector<int> ks;
  *layer = 0;
  for (int l = 0; l < kL; l++)
    if (g.U[l] == unit) *layer = l;
  for (int k = 0; k < 16; k++)
    if ((KindLayers(k) > 1) == (unit != g.E)) ks.push_back(k);
  return ks;
}

// Holds a unit as the example trainer does, checking what the views show.
// grads: acquire the gradients too and add this rank's values. expect:
// the parameters the slices must hold (nullptr: skip).
void Use(StackedTest* t, Gpt2& g, int unit, bool grads, int rank,
         const std::vector<std::vector<float>>* expect) {
  (void)t;
  ASSERT_EQ(zs_unit_gather(g.m, unit), ZS_OK) << zs_last_error();
  if (grads) {
    ASSERT_EQ(zs_unit_grad_acquire(g.m, unit), ZS_OK);
  }
  int l = 0;
  const std::vector<int> ks = KindsOf(g, unit, &l);
  for (int k : ks) {
    const size_t per = KindNumel(k) / KindLayers(k);
    const float* p = (const float*)g.pv[k] + l * per;
    if (expect != nullptr) {
      size_t bad = 0;
      for (size_t i = 0; i < per; i++) bad += p[i] != (*expect)[k][l * per + i];
      EXPECT_EQ(bad, 0u) << kNames[k] << " layer " << l;
    }
    // zs_tensor_data of the slice is the view's address
    char name[64];
    std::snprintf(name, sizeof name, "%s.%d", kNames[k], l);
    int tid = -1;
    void* data = nullptr;
    EXPECT_EQ(zs_model_find_tensor(g.m, name, &tid), ZS_OK);
    EXPECT_EQ(zs_tensor_data(g.m, tid, &data), ZS_OK);
    EXPECT_EQ(data, (const void*)p) << name;
    if (grads) {
      float* d = (float*)g.gv[k] + l * per;
      void* gp = nullptr;
      EXPECT_EQ(zs_tensor_grad(g.m, tid, &gp), ZS_OK);
      EXPECT_EQ(gp, (void*)d) << name;
      for (size_t i = 0; i < per; i++) d[i] += GradValue(rank, k, i);
    }
  }
  // resident: exactly what the accounting says (views of this unit only)
  EXPECT_EQ(ViewsRss(g), ViewsAccounted(g.ctx));
  EXPECT_GT(ViewsAccounted(g.ctx), 0u);
  if (grads) {
    ASSERT_EQ(zs_unit_grad_release(g.m, unit), ZS_OK);
  }
  ASSERT_EQ(zs_unit_release(g.m, unit), ZS_OK);
  EXPECT_EQ(ViewsAccounted(g.ctx), 0u);
  EXPECT_EQ(ViewsRss(g), 0u) << "pages still resident after the release";
}

// One step as examples/stacked/train_sharded.c runs it.
void Step(StackedTest* t, Gpt2& g, int rank,
          const std::vector<std::vector<float>>* expect) {
  Use(t, g, g.E, false, rank, expect);
  for (int l = 0; l < kL; l++) Use(t, g, g.U[l], false, rank, expect);
  Use(t, g, g.E, false, rank, expect);
  Use(t, g, g.E, true, rank, expect);
  for (int l = kL - 1; l >= 0; l--) Use(t, g, g.U[l], true, rank, expect);
  Use(t, g, g.E, true, rank, expect);
  ASSERT_EQ(zs_step(g.m, nullptr), ZS_OK) << zs_last_error();
}

TEST_F(StackedTest, ViewsHoldSlicesAndGiveBackPages) {
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    zs_context* ctx = Context(stage);
    ASSERT_NE(ctx, nullptr);
    Gpt2 g;
    Build(ctx, &g);
    std::vector<std::vector<float>> init(16);
    for (int k = 0; k < 16; k++) {
      init[k].resize(KindNumel(k));
      for (size_t i = 0; i < init[k].size(); i++) init[k][i] = InitValue(k, i);
    }
    EXPECT_EQ(ViewsAccounted(ctx), 0u);
    EXPECT_EQ(ViewsRss(g), 0u);
    Step(this, g, rank_, &init);
    // the gradients written into the views are the ones reduced: the mean
    // over ranks of what each rank added (the embedding twice)
    std::vector<float> got;
    for (int k = 0; k < 16; k++) {
      got.assign(KindNumel(k), -1.0f);
      ASSERT_EQ(zs_kind_get(g.m, g.kinds[k], ZS_FIELD_GRAD, got.data()), ZS_OK);
      const size_t per = KindNumel(k) / KindLayers(k);
      const int uses = KindLayers(k) > 1 ? 1 : 2;
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); i++) {
        double want = 0;
        for (int r = 0; r < world_; r++) want += uses * GradValue(r, k, i % per);
        want /= world_;
        bad += std::fabs(got[i] - want) > 1e-6 * std::fabs(want);
      }
      EXPECT_EQ(bad, 0u) << kNames[k];
    }
    // a second step sees the updated parameters in the views
    std::vector<std::vector<float>> now(16);
    for (int k = 0; k < 16; k++) {
      now[k].resize(KindNumel(k));
      ASSERT_EQ(zs_kind_get(g.m, g.kinds[k], ZS_FIELD_PARAM, now[k].data()),
                ZS_OK);
      EXPECT_NE(now[k][0], init[k][0]) << kNames[k] << " was not updated";
    }
    Step(this, g, rank_, &now);
    zs_model_destroy(g.m);
    zs_context_destroy(ctx);
  }
}

// The description of the same model for zs_estimate_from_model.
std::string Describe(const Gpt2& g) {
  std::ostringstream d;
  d << "{\"format\": \"zeroshard-model-description\", \"version\": 1, "
       "\"units\": [";
  for (int u = 0; u <= kL; u++) {
    const int unit = u == 0 ? g.E : g.U[u - 1];
    int l = 0;
    const std::vector<int> ks = KindsOf(g, unit, &l);
    d << (u ? ", " : "") << "{\"name\": \"" << zs_model_unit_name(g.m, unit)
      << "\", \"grad_uses\": " << (unit == g.E ? 2 : 1) << ", \"tensors\": [";
    for (size_t i = 0; i < ks.size(); i++) {
      const size_t per = KindNumel(ks[i]) / KindLayers(ks[i]);
      d << (i ? ", " : "") << "{\"name\": \"" << kNames[ks[i]] << "." << l
        << "\", \"numel\": " << per << ", \"kind\": \"" << kNames[ks[i]]
        << "\", \"kind_offset\": " << l * per << "}";
    }
    d << "]}";
  }
  d << "]}";
  return d.str();
}

TEST_F(StackedTest, AccountingEqualsEstimateAtStage3) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 3;
  cfg.optimizer.weight_decay = 0.0;
  zs_context* ctx = nullptr;
  ASSERT_EQ(zs_context_create_mpi(&cfg, MPI_COMM_WORLD, &ctx), ZS_OK);
  Gpt2 g;
  Build(ctx, &g);
  for (int s = 0; s < 2; s++) Step(this, g, rank_, nullptr);
  zs_memory_stats st{};
  st.struct_size = sizeof st;
  ASSERT_EQ(zs_memory_stats_get(ctx, &st), ZS_OK);

  const std::string desc = Describe(g);
  zs_estimate_input in = ZS_ESTIMATE_INPUT_INIT;
  in.ranks = world_;
  zs_memory_estimate e{};
  e.struct_size = sizeof e;
  ASSERT_EQ(zs_estimate_from_model(desc.c_str(), &cfg, &in, &e), ZS_OK)
      << zs_last_error() << "\n" << desc;
  // the views: pages of the largest unit's slices, parameters and
  // gradients, boundary pages included (a block's ln1w slice is 256 bytes)
  EXPECT_EQ(st.peak[ZS_MEM_STACKED_VIEWS], e.bytes[ZS_MEM_STACKED_VIEWS]);
  EXPECT_GT(e.bytes[ZS_MEM_STACKED_VIEWS], 0u);
  for (int c : {ZS_MEM_PARAMS, ZS_MEM_GRADS, ZS_MEM_OPTIMIZER_STATES,
                ZS_MEM_PARAMS_GATHERED})
    EXPECT_EQ(st.peak[c], e.bytes[c]) << zs_mem_category_name((zs_mem_category)c);
  if (rank_ == 0)
    std::printf("stage 3, %d ranks: stacked views peak %zu bytes (estimated "
                "%zu), model states %zu (estimated %zu)\n",
                world_, st.peak[ZS_MEM_STACKED_VIEWS],
                e.bytes[ZS_MEM_STACKED_VIEWS], st.model_state_bytes,
                e.model_state_bytes);
  // the page arithmetic by hand for one block: every stacked kind's slice
  // with its boundary pages, once for parameters and once for gradients
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t embed = 0;
  for (int k : {0, 1, 14, 15}) embed += (KindNumel(k) * 4 + page - 1) / page * page;
  size_t most = 0;
  for (int l = 0; l < kL; l++) {
    size_t b = 0;
    for (int k = 2; k < 14; k++) {
      const size_t per = KindNumel(k) / kL * 4;
      b += ((l * per + per - 1) / page - (l * per) / page + 1) * page;
    }
    if (b > most) most = b;
  }
  EXPECT_EQ(e.bytes[ZS_MEM_STACKED_VIEWS], 2 * std::max(most, embed));
  zs_model_destroy(g.m);
  zs_context_destroy(ctx);
}

// zs_step_discard with a unit held (gathered, gradients acquired) ends
// its views' holds too: nothing stays resident or counted, the next hold
// copies the current values in, and the next step reduces what it wrote.
TEST_F(StackedTest, DiscardEndsTheViewsHolds) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    zs_context* ctx = Context(stage);
    ASSERT_NE(ctx, nullptr);
    zs_model* m = nullptr;
    int U[2], kind;
    ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
    ASSERT_EQ(zs_model_add_units(m, "blk", 2, U), ZS_OK);
    const int64_t shape[2] = {2, 4};
    ASSERT_EQ(zs_model_add_stacked(m, "w", 2, shape, 4, ZS_FLOAT32, 0, U, &kind),
              ZS_OK);
    for (int u : U) ASSERT_EQ(zs_unit_set_grad_uses(m, u, 1), ZS_OK);
    ASSERT_EQ(zs_model_finalize(m), ZS_OK);
    const float init[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ASSERT_EQ(zs_kind_set(m, kind, init), ZS_OK);
    float *w = nullptr, *dw = nullptr;
    ASSERT_EQ(zs_kind_data(m, kind, (void**)&w), ZS_OK);
    ASSERT_EQ(zs_kind_grad(m, kind, (void**)&dw), ZS_OK);
    ASSERT_EQ(zs_unit_gather(m, U[0]), ZS_OK);
    ASSERT_EQ(zs_unit_grad_acquire(m, U[0]), ZS_OK);
    dw[0] = 100.0f;
    ASSERT_EQ(zs_step_discard(m, nullptr), ZS_OK) << zs_last_error();
    EXPECT_EQ(ViewsAccounted(ctx), 0u);
    EXPECT_EQ(MappingRss(w) + MappingRss(dw), 0u);
    for (int step = 0; step < 2; step++) {
      std::vector<float> now(8);
      ASSERT_EQ(zs_kind_get(m, kind, ZS_FIELD_PARAM, now.data()), ZS_OK);
      for (int l = 0; l < 2; l++) {
        ASSERT_EQ(zs_unit_gather(m, U[l]), ZS_OK);
        ASSERT_EQ(zs_unit_grad_acquire(m, U[l]), ZS_OK);
        for (int i = 0; i < 4; i++) {
          EXPECT_EQ(w[4 * l + i], now[4 * l + i]) << "step " << step;
          EXPECT_EQ(dw[4 * l + i], 0.0f) << "step " << step;
          dw[4 * l + i] += 1.0f;
        }
        ASSERT_EQ(zs_unit_grad_release(m, U[l]), ZS_OK);
        ASSERT_EQ(zs_unit_release(m, U[l]), ZS_OK);
      }
      ASSERT_EQ(zs_step(m, nullptr), ZS_OK) << zs_last_error();
      std::vector<float> g(8);
      ASSERT_EQ(zs_kind_get(m, kind, ZS_FIELD_GRAD, g.data()), ZS_OK);
      for (float x : g) EXPECT_EQ(x, 1.0f) << "step " << step;
      EXPECT_EQ(ViewsAccounted(ctx), 0u);
    }
    zs_model_destroy(m);
    zs_context_destroy(ctx);
  }
}

// Every layer of a kind needs a slice: finalize says which one lacks it.
TEST_F(StackedTest, FinalizeNamesALayerWithoutASlice) {
  zs_context* ctx = Context(0);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  int u, kind, t;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "a", &u), ZS_OK);
  const int64_t shape[2] = {3, 5};
  ASSERT_EQ(zs_model_add_kind(m, "fcb", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  ASSERT_EQ(zs_model_add_slice(m, u, kind, 0, 0, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_slice(m, u, kind, 2, 10, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_add_slice(m, 99, kind, 1, 5, 0, &t), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("zs_model_add_slice: kind 'fcb' layer 1: unit 99 does not exist");
  zs_model_destroy(m);
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "a", &u), ZS_OK);
  ASSERT_EQ(zs_model_add_kind(m, "fcb", 2, shape, ZS_FLOAT32, &kind), ZS_OK);
  ASSERT_EQ(zs_model_add_slice(m, u, kind, 0, 0, 0, &t), ZS_OK);
  ASSERT_EQ(zs_model_add_slice(m, u, kind, 2, 10, 0, &t), ZS_OK);
  EXPECT_EQ(zs_model_finalize(m), ZS_ERR_INVALID_ARGUMENT);
  EXPECT_LAST_ERROR_HAS("stacked kind 'fcb' layer 1 has no slice");
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

// A tied tensor's unit holds its owner's slices too.
TEST_F(StackedTest, TieHoldsTheOwnersSlices) {
  zs_context* ctx = Context(3);
  ASSERT_NE(ctx, nullptr);
  zs_model* m = nullptr;
  int a, head, kind, tied;
  ASSERT_EQ(zs_model_create(ctx, &m), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "embed", &a), ZS_OK);
  ASSERT_EQ(zs_model_add_unit(m, "head", &head), ZS_OK);
  const int64_t shape[2] = {1, 3000};
  ASSERT_EQ(zs_model_add_stacked(m, "wte", 2, shape, 3000, ZS_FLOAT32, 0, &a,
                                 &kind),
            ZS_OK);
  int wte = -1;
  ASSERT_EQ(zs_model_find_tensor(m, "wte.0", &wte), ZS_OK);
  ASSERT_EQ(zs_model_add_tied_tensor(m, head, "lm_head", wte, &tied), ZS_OK);
  ASSERT_EQ(zs_model_finalize(m), ZS_OK) << zs_last_error();
  std::vector<float> v(3000);
  for (size_t i = 0; i < v.size(); i++) v[i] = (float)i;
  ASSERT_EQ(zs_kind_set(m, kind, v.data()), ZS_OK);
  void* base = nullptr;
  ASSERT_EQ(zs_kind_data(m, kind, &base), ZS_OK);
  ASSERT_EQ(zs_unit_gather(m, head), ZS_OK);
  void* p = nullptr;
  EXPECT_EQ(zs_tensor_data(m, tied, &p), ZS_OK);
  EXPECT_EQ(p, base);
  EXPECT_EQ(std::memcmp(base, v.data(), v.size() * 4), 0);
  EXPECT_EQ(ViewsAccounted(ctx), (3000 * 4 + (size_t)sysconf(_SC_PAGESIZE) - 1) /
                                     sysconf(_SC_PAGESIZE) * sysconf(_SC_PAGESIZE));
  ASSERT_EQ(zs_unit_release(m, head), ZS_OK);
  EXPECT_EQ(ViewsAccounted(ctx), 0u);
  EXPECT_EQ(MappingRss(base), 0u);
  zs_model_destroy(m);
  zs_context_destroy(ctx);
}

}  // namespace

namespace {

// zs_model_init's staging (and zs_tensor_set's before the first step) is
// not a training peak: the peaks restart when they end. After the first
// step, zs_tensor_set's staging counts like any other allocation.
TEST_F(StackedTest, InitializationStagingIsNotAPeak) {
  zs_context* ctx = Context(3);
  ASSERT_NE(ctx, nullptr);
  Gpt2 g;
  Build(ctx, &g);  // zs_kind_set: zs_tensor_set of every slice
  zs_memory_stats s{};
  s.struct_size = sizeof s;
  ASSERT_EQ(zs_memory_stats_get(ctx, &s), ZS_OK);
  EXPECT_EQ(s.peak[ZS_MEM_OTHER], s.current[ZS_MEM_OTHER]);
  EXPECT_EQ(s.total_peak, s.total_current);
  zs_init_fn zeros = [](void*, int, const zs_tensor_desc*, void*) -> zs_status {
    return ZS_OK;  // the zeroed buffer as it is
  };
  ASSERT_EQ(zs_model_init(g.m, zeros, nullptr), ZS_OK) << zs_last_error();
  ASSERT_EQ(zs_memory_stats_get(ctx, &s), ZS_OK);
  EXPECT_EQ(s.peak[ZS_MEM_OTHER], s.current[ZS_MEM_OTHER]);
  Step(this, g, rank_, nullptr);
  int t = -1;
  ASSERT_EQ(zs_model_find_tensor(g.m, "wte.0", &t), ZS_OK);
  std::vector<float> v(KindNumel(0), 0.5f);
  ASSERT_EQ(zs_tensor_set(g.m, t, v.data()), ZS_OK);
  ASSERT_EQ(zs_memory_stats_get(ctx, &s), ZS_OK);
  EXPECT_GE(s.peak[ZS_MEM_OTHER], s.current[ZS_MEM_OTHER] + v.size() * 4)
      << "zs_tensor_set's staging after a step is a peak like any other";
  zs_model_destroy(g.m);
  zs_context_destroy(ctx);
}

}  // namespace
