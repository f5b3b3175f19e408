// test_models.h — small models for the runtime's parity tests, written once
// against an abstract parameter access so that the same forward/backward
// code runs (a) as a plain single-process reference on plain arrays and
// (b) sharded through the ZeroShard per-step API.
//
// Data is a seeded synthetic source: sample j of step s is a pure function
// of (seed, s, j), so every rank can make its own slice of the global batch
// and the global batch is the same at every world size.
#ifndef ZS_TESTS_RUNTIME_TEST_MODELS_H_
#define ZS_TESTS_RUNTIME_TEST_MODELS_H_

#include <zeroshard.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zstest {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int tie = -1;       // index of the owner tensor, or -1
  bool frozen = false;
  bool no_decay = false;  // in param group 1 (weight decay 0)
  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= (size_t)d;
    return n;
  }
};

struct UnitSpec {
  std::string name;
  std::vector<int> tensors;  // indices into Model::tensors
};

// How a model reaches its parameters and gradients during one step. The
// model brackets each unit's use: BeginForward/EndForward around its
// forward, BeginBackward/EndBackward around its backward.
class Access {
 public:
  virtual ~Access() = default;
  virtual void BeginForward(int unit) = 0;
  virtual void EndForward(int unit) = 0;
  virtual void BeginBackward(int unit) = 0;
  virtual void EndBackward(int unit) = 0;
  virtual float* Param(int tensor) = 0;  // valid inside a Begin/End pair
  virtual float* Grad(int tensor) = 0;   // valid inside BeginBackward/End
  // This slice of the batch does not use `unit` in this step (a unit that
  // may go unused: zs_unit_mark_unused where it would be gathered).
  virtual void Unused(int unit) { (void)unit; }
};

class Model {
 public:
  virtual ~Model() = default;
  std::vector<TensorSpec> tensors;
  std::vector<UnitSpec> units;
  zs_dtype dtype = ZS_FLOAT32;  // of every registered tensor (RegisterModel)
  // Deterministic initial values of tensor t (numel floats).
  virtual void Init(int t, float* data) const;
  // One forward + backward over samples [b0, b0 + nb) of the global batch
  // of `step`; gradients are of the mean loss over those nb samples.
  // Returns that mean loss.
  virtual float Step(Access& a, int step, int b0, int nb) = 0;
};

// The models of the parity tests.
std::unique_ptr<Model> MakeMlp();          // 3 linear layers, GELU, MSE
std::unique_ptr<Model> MakeTransformer();  // embed, 1 block, tied LM head
std::unique_ptr<Model> MakeDegenerate();   // odd, tiny and empty tensors
std::unique_ptr<Model> MakeTwiceUsed();    // one unit applied twice
std::unique_ptr<Model> MakeBranch();       // a unit used on odd steps only
// embed (about 6 blocks' elements), b0, b1, branch (odd steps only, unit
// 3), b2, out; each unit's forward and backward sleeps sleep_us after its
// compute (the host waiting for a device kernel).
std::unique_ptr<Model> MakeBranchStack(int sleep_us = 0);
// A mixture of experts: "in", experts "expert.a", ".b", ".c" (units 1-3,
// see kExpertUnits), "out". Sample j of step s goes to one expert, or to
// none (identity), by its quarter of the global batch: MoeRoute. A slice of
// the batch uses only the experts its samples go to (Access::Unused for
// the others), so at 2-4 ranks some ranks skip an expert that others use,
// and in some steps no rank uses expert c.
std::unique_ptr<Model> MakeMoe(int global_batch = 24);  // kGlobalBatch
constexpr int kExpertUnits[3] = {1, 2, 3};
// The expert (0-2) of sample j at step s, or -1 for none.
int MoeRoute(int step, int j, int global_batch);
// A unit used once in step 0 and twice from step 1 on: the recorded use
// count is too low, exercising the re-open path.
std::unique_ptr<Model> MakeGrowingUse();

// splitmix64-based uniform float in [-1, 1) from a key.
float HashUniform(uint64_t a, uint64_t b, uint64_t c);

constexpr int kGlobalBatch = 24;  // divisible by 1, 2, 3, 4 and 8

}  // namespace zstest

#endif  // ZS_TESTS_RUNTIME_TEST_MODELS_H_
