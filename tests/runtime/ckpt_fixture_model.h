// ckpt_fixture_model.h — the small model of the checkpoint format fixtures
// (tests/runtime/testdata/ckpt_v<N>/, written by ckpt_fixture_gen.cc with
// the library of that format): two units, one fp32 and one bf16 (master
// weights), a tied tensor, AdamW, on a context of one rank; initial values
// and gradients are functions of the element index and the step, so any
// build of the library reproduces the same run.
#ifndef ZS_TESTS_RUNTIME_CKPT_FIXTURE_MODEL_H_
#define ZS_TESTS_RUNTIME_CKPT_FIXTURE_MODEL_H_

#include <zeroshard.h>

#include <cmath>
#include <vector>

namespace zsfixture {

struct Fixture {
  zs_context* ctx = nullptr;
  zs_model* m = nullptr;
  int units[2] = {-1, -1};
  std::vector<int> tensors;  // untied, in registration order
};

inline zs_status InitValues(void*, int tensor, const zs_tensor_desc* d,
                            void* data) {
  std::vector<float> v(d->numel);
  for (size_t i = 0; i < d->numel; i++)
    v[i] = 0.05f * std::sin(0.37f * (float)(i + 1) + (float)tensor);
  return zs_convert(data, d->dtype, v.data(), ZS_FLOAT32, d->numel);
}

// Builds, finalizes and initializes the model (stage 1, AdamW lr 1e-2).
inline zs_status Build(Fixture* f) {
  zs_config cfg = ZS_CONFIG_INIT;
  cfg.stage = 1;
  cfg.optimizer.lr = 1e-2;
  zs_status st = zs_context_create_local(&cfg, &f->ctx);
  if (st != ZS_OK) return st;
  if ((st = zs_model_create(f->ctx, &f->m)) != ZS_OK) return st;
  zs_model* m = f->m;
  int t = -1, w = -1, group = -1;
  const int64_t s57[2] = {5, 7}, s7[1] = {7}, s33[1] = {33};
  if ((st = zs_model_add_unit(m, "dense", &f->units[0])) != ZS_OK) return st;
  if ((st = zs_model_add_unit(m, "half", &f->units[1])) != ZS_OK) return st;
  if ((st = zs_model_add_tensor(m, f->units[0], "w", 2, s57, ZS_FLOAT32, 0, &w)) != ZS_OK) return st;
  f->tensors.push_back(w);
  if ((st = zs_model_add_tensor(m, f->units[0], "b", 1, s7, ZS_FLOAT32, 0, &t)) != ZS_OK) return st;
  f->tensors.push_back(t);
  if ((st = zs_model_add_tensor(m, f->units[1], "h", 1, s33, ZS_BFLOAT16, 0, &t)) != ZS_OK) return st;
  f->tensors.push_back(t);
  if ((st = zs_model_add_param_group(m, 3e-3, 0.0, &group)) != ZS_OK) return st;
  if ((st = zs_model_set_tensor_group(m, t, group)) != ZS_OK) return st;
  for (int u : f->units)
    if ((st = zs_unit_set_grad_uses(m, u, 1)) != ZS_OK) return st;
  if ((st = zs_model_finalize(m)) != ZS_OK) return st;
  return zs_model_init(m, InitValues, nullptr);
}

// One optimizer step with gradients g(i, step) (as the tensor's gradient
// dtype: fp32 for "dense", bf16 for "half").
inline zs_status Step(Fixture* f, int step) {
  zs_status st = ZS_OK;
  for (int u : f->units) {
    if ((st = zs_unit_gather(f->m, u)) != ZS_OK) return st;
    if ((st = zs_unit_grad_acquire(f->m, u)) != ZS_OK) return st;
    for (int t : f->tensors) {
      zs_tensor_desc d;
      zs_model_tensor_desc(f->m, t, &d);
      if (d.unit != u) continue;
      void* g = nullptr;
      if ((st = zs_tensor_grad(f->m, t, &g)) != ZS_OK) return st;
      std::vector<float> v(d.numel);
      for (size_t i = 0; i < d.numel; i++)
        v[i] = 0.1f * std::cos(0.11f * (float)i + 0.7f * (float)step + (float)t);
      zs_convert(g, zs_tensor_field_dtype(f->m, t, ZS_FIELD_GRAD), v.data(),
                 ZS_FLOAT32, d.numel);
    }
    if ((st = zs_unit_grad_release(f->m, u)) != ZS_OK) return st;
    if ((st = zs_unit_release(f->m, u)) != ZS_OK) return st;
  }
  return zs_step(f->m, nullptr);
}

inline void Destroy(Fixture* f) {
  zs_model_destroy(f->m);
  zs_context_destroy(f->ctx);
  f->m = nullptr;
  f->ctx = nullptr;
}

}  // namespace zsfixture

#endif  // ZS_TESTS_RUNTIME_CKPT_FIXTURE_MODEL_H_
