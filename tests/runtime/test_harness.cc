// test_harness.cc — reference and sharded training of the test models.
#include "tests/runtime/test_harness.h"

#include <mpi.h>
#include <zs_mpi.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "runtime/engine/engine.h"

namespace zstest {

static double BaseLr(const TrainConfig& cfg) {
  if (cfg.lr > 0) return cfg.lr;
  return cfg.optimizer == ZS_OPTIM_SGD ? 0.1 : 1e-2;
}

zs_optimizer_config OptimizerFor(const TrainConfig& cfg) {
  zs_config c;
  zs_config_init(&c); /* the defaults, readable (the macro leaves them UNSET) */
  zs_optimizer_config o = c.optimizer;
  o.kind = cfg.optimizer;
  o.lr = BaseLr(cfg);
  if (cfg.optimizer == ZS_OPTIM_SGD) {
    o.momentum = 0.9;
    o.dampening = 0.1;
    o.weight_decay = 1e-3;
  } else {
    o.weight_decay = cfg.optimizer == ZS_OPTIM_ADAMW ? 0.05 : 0.01;
  }
  return o;
}

// The learning rate of step s: a linear decay, so zs_model_set_lr is used.
static double LrAt(const TrainConfig& cfg, int s) {
  return BaseLr(cfg) * (1.0 - 0.02 * s);
}

// ==== Reference ============================================================

namespace {

class PlainAccess : public Access {
 public:
  PlainAccess(Model& m) : m_(m), p_(m.tensors.size()), g_(m.tensors.size()) {
    for (size_t t = 0; t < m.tensors.size(); t++) {
      if (m.tensors[t].tie >= 0) continue;
      p_[t].resize(m.tensors[t].numel());
      g_[t].resize(m.tensors[t].numel());
      m.Init((int)t, p_[t].data());
    }
  }
  void BeginForward(int) override {}
  void EndForward(int) override {}
  void BeginBackward(int) override {}
  void EndBackward(int) override {}
  float* Param(int t) override { return p_[Own(t)].data(); }
  float* Grad(int t) override { return g_[Own(t)].data(); }
  void ZeroGrads() {
    for (auto& g : g_) std::fill(g.begin(), g.end(), 0.f);
  }
  std::vector<float>& P(int t) { return p_[Own(t)]; }
  std::vector<float>& G(int t) { return g_[Own(t)]; }

 private:
  int Own(int t) const { return m_.tensors[t].tie >= 0 ? m_.tensors[t].tie : t; }
  Model& m_;
  std::vector<std::vector<float>> p_, g_;
};

}  // namespace

// Rounds v through dtype (fp32: unchanged).
static void RoundTo(zs_dtype dtype, std::vector<float>& v) {
  if (dtype == ZS_FLOAT32 || v.empty()) return;
  std::vector<uint16_t> h(v.size());
  zs_convert(h.data(), dtype, v.data(), ZS_FLOAT32, v.size());
  zs_convert(v.data(), ZS_FLOAT32, h.data(), dtype, v.size());
}

// The sequence number after the last logged collective (0: none yet).
static uint64_t LogEnd(zs_context* ctx) {
  zs_comm_record last{};
  last.struct_size = sizeof last;
  const size_t n = zs_comm_log_get(ctx, nullptr, 0);
  if (n == 0 || zs_comm_log_get(ctx, &last, 1) != 1) return 0;
  return last.seq + 1;
}

// The logged records from sequence number `from` on.
static std::vector<zs_comm_record> LogFrom(zs_context* ctx, uint64_t from) {
  const size_t n = zs_comm_log_get(ctx, nullptr, 0);
  std::vector<zs_comm_record> all(n == 0 ? 1 : n), out;
  all[0].struct_size = sizeof all[0];
  const size_t got = zs_comm_log_get(ctx, all.data(), n);
  for (size_t i = 0; i < got; i++)
    if (all[i].seq >= from) out.push_back(all[i]);
  return out;
}

TrainResult TrainReference(Model& model, const TrainConfig& cfg) {
  TrainResult r;
  PlainAccess a(model);
  const zs_optimizer_config o = OptimizerFor(cfg);
  const size_t n = model.tensors.size();
  std::vector<std::vector<float>> s0(n), s1(n), s2(n), s3(n), master(n);
  std::vector<int64_t> steps(n, 0);
  for (size_t t = 0; t < n; t++) {
    s0[t].assign(model.tensors[t].numel(), 0.f);
    s1[t].assign(model.tensors[t].numel(), 0.f);
    s2[t].assign(model.tensors[t].numel(), 0.f);
    s3[t].assign(model.tensors[t].numel(), 0.f);
    // 16-bit parameters: the model sees their rounding, the optimizer
    // updates fp32 master weights initialized from it.
    if (model.tensors[t].tie >= 0) continue;
    RoundTo(cfg.param_dtype, a.P((int)t));
    master[t] = a.P((int)t);
  }
  for (int s = 0; s < cfg.steps; s++) {
    const int W = cfg.reference_worlds.empty()
                      ? cfg.reference_world
                      : cfg.reference_worlds[std::min<size_t>(
                            (size_t)s, cfg.reference_worlds.size() - 1)];
    if (W > 1) {  // rank by rank, summed in rank order
      const int nb = cfg.global_batch / W;
      const int RG = cfg.reference_group > 0 && cfg.reference_group < W
                         ? cfg.reference_group : 0;
      std::vector<std::vector<float>> sum(n);
      // hybrid: each group's sum (in rank order), per group and tensor
      std::vector<std::vector<float>> group_grads(RG > 0 ? (size_t)(W / RG) * n : 0);
      double loss = 0;
      for (int rank = 0; rank < W; rank++) {
        a.ZeroGrads();
        loss += (double)model.Step(a, s, rank * nb, nb) * nb;
        for (size_t t = 0; t < n; t++) {
          if (model.tensors[t].tie >= 0) continue;
          const std::vector<float>& g = a.G((int)t);
          if (RG > 0) {
            std::vector<float>& gs = group_grads[(size_t)(rank / RG) * n + t];
            if (rank % RG == 0) gs = g;
            else for (size_t i = 0; i < g.size(); i++) gs[i] += g[i];
          }
          if (rank == 0) {
            sum[t] = g;
            continue;
          }
          for (size_t i = 0; i < g.size(); i++) sum[t][i] += g[i];
        }
      }
      const int G = cfg.reference_group > 0 && cfg.reference_group < W
                        ? cfg.reference_group : W;
      for (size_t t = 0; t < n; t++) {
        if (model.tensors[t].tie >= 0) continue;
        if (G == W) {
          for (float& x : sum[t]) x /= (float)W;
        } else {  // groups[g] holds group g's sum, then its mean
          std::vector<float>& out = sum[t];
          for (size_t i = 0; i < out.size(); i++) {
            float total = 0.f;
            for (int g = 0; g < W / G; g++) {
              float gs = group_grads[(size_t)g * n + t][i];
              gs /= (float)G;
              total = g == 0 ? gs : total + gs;
            }
            out[i] = total / (float)(W / G);
          }
        }
        a.G((int)t) = sum[t];
      }
      r.losses.push_back((float)(loss / cfg.global_batch));
    } else {
      a.ZeroGrads();
      r.losses.push_back(model.Step(a, s, 0, cfg.global_batch));
    }
    // The gradient is fp32 here (reduce_dtype fp32 or fp32 parameters).
    float coef = 1.0f;
    if (cfg.max_grad_norm > 0) {
      double sumsq = 0;
      for (size_t t = 0; t < n; t++) {
        const TensorSpec& ts = model.tensors[t];
        if (ts.tie >= 0 || ts.frozen) continue;
        for (float g : a.G((int)t)) sumsq += (double)g * g;
      }
      double norm = std::sqrt(sumsq);
      r.norms.push_back(norm);
      double clip = cfg.max_grad_norm / (norm + 1e-6);
      if (clip < 1.0) coef = (float)clip;
    }
    for (size_t t = 0; t < n; t++) {
      const TensorSpec& ts = model.tensors[t];
      if (ts.tie >= 0 || ts.frozen) continue;
      double wd = ts.no_decay ? 0.0 : o.weight_decay;
      float* p = cfg.param_dtype == ZS_FLOAT32 ? a.P((int)t).data()
                                               : master[t].data();
      if (coef != 1.0f)
        for (float& g : a.G((int)t)) g *= coef;
      const float* g = a.G((int)t).data();
      size_t cnt = ts.numel();
      zs_status st;
      if (cfg.optim_fn != nullptr) {  // the user's rule on the whole tensor
        zs_optim_span sp{};
        sp.struct_size = sizeof sp;
        sp.param = p;
        sp.grad = g;
        std::vector<float>* bufs[4] = {&s0[t], &s1[t], &s2[t], &s3[t]};
        for (int k = 0; k < cfg.optim_nstates; k++) sp.state[k] = bufs[k]->data();
        sp.nstates = cfg.optim_nstates;
        sp.n = cnt;
        sp.tensor = (int)t;
        sp.step = ++steps[t];
        sp.lr = LrAt(cfg, s);
        sp.weight_decay = wd;
        sp.beta1 = o.beta1;
        sp.beta2 = o.beta2;
        sp.eps = o.eps;
        char why[256] = "";
        sp.error = why;
        sp.error_cap = sizeof why;
        st = cfg.optim_fn(cfg.optim_user, &sp);
      } else if (o.kind == ZS_OPTIM_SGD) {
        zs_sgd_hparams hp = {LrAt(cfg, s), o.momentum, o.dampening, wd, o.nesterov};
        st = zs_optim_sgd(p, g, s0[t].data(), cnt, &hp, ++steps[t]);
      } else {
        zs_adam_hparams hp = {LrAt(cfg, s), o.beta1, o.beta2, o.eps, wd};
        st = (o.kind == ZS_OPTIM_ADAMW ? zs_optim_adamw : zs_optim_adam)(
            p, g, s0[t].data(), s1[t].data(), cnt, &hp, ++steps[t]);
      }
      if (st != ZS_OK && r.status == ZS_OK) {
        r.status = st;
        r.error = zs_last_error();
      }
      if (cfg.param_dtype != ZS_FLOAT32) {
        a.P((int)t) = master[t];
        RoundTo(cfg.param_dtype, a.P((int)t));
      }
    }
  }
  for (size_t t = 0; t < n; t++) {
    r.params.push_back(a.P((int)t));
    int own = model.tensors[t].tie >= 0 ? model.tensors[t].tie : (int)t;
    r.state0.push_back(s0[own]);
    if (cfg.optim_fn != nullptr)  // the sharded run reads it the same way
      r.state1.push_back(cfg.optim_nstates > 1 ? s1[own] : std::vector<float>());
  }
  return r;
}

// ==== Sharded ==============================================================

namespace {

class ShardedAccess : public Access {
 public:
  // copy: moves bytes between the runtime's buffers and host memory when
  // they are device memory (NULL: host buffers, read in place).
  ShardedAccess(zs_model* zm, Model& m, double scale = 1.0,
                void (*copy)(void*, const void*, size_t) = nullptr)
      : zm_(zm), m_(m), scale_(scale), copy_(copy), pm_(m.tensors.size()),
        gm_(m.tensors.size()), gdirty_(m.tensors.size(), 0) {
    size_t mx = 1;
    for (auto& t : m.tensors) mx = std::max(mx, t.numel());
    dummy_.assign(mx, 0.f);
  }
  void set_scale(double s) { scale_ = s; }
  void BeginForward(int u) override { Check(zs_unit_gather(zm_, u), "gather"); }
  void EndForward(int u) override { Check(zs_unit_release(zm_, u), "release"); }
  void Unused(int u) override {
    Check(zs_unit_mark_unused(zm_, u), "mark_unused");
  }
  void BeginBackward(int u) override {
    Check(zs_unit_gather(zm_, u), "gather");
    Check(zs_unit_grad_acquire(zm_, u), "grad_acquire");
  }
  void EndBackward(int u) override {
    // The loss scale (the model computes unscaled gradients): exact for a
    // power of two. Only for models that use each unit once per step.
    if (scale_ != 1.0)
      for (int t : m_.units[u].tensors) {
        if (m_.tensors[t].tie >= 0 || m_.tensors[t].frozen) continue;
        float* g = Grad(t);
        for (size_t i = 0; i < m_.tensors[t].numel(); i++)
          g[i] = (float)(g[i] * scale_);
      }
    FlushGrads();
    Check(zs_unit_grad_release(zm_, u), "grad_release");
    Check(zs_unit_release(zm_, u), "release");
  }
  // 16-bit (or device) parameters are read through an fp32 host copy.
  float* Param(int t) override {
    void* p = nullptr;
    if (!Check(zs_tensor_data(zm_, t, &p), "tensor_data")) return dummy_.data();
    zs_dtype d = zs_tensor_field_dtype(zm_, t, ZS_FIELD_PARAM);
    if (d == ZS_FLOAT32 && copy_ == nullptr) return static_cast<float*>(p);
    auto& v = pm_[t];
    v.resize(m_.tensors[t].numel());
    ToHost(v, p, d);
    return v.data();
  }
  // 16-bit gradients are accumulated in an fp32 copy, rounded back at the
  // end of the unit's backward.
  float* Grad(int t) override {
    void* p = nullptr;
    if (!Check(zs_tensor_grad(zm_, t, &p), "tensor_grad")) return dummy_.data();
    zs_dtype d = zs_tensor_field_dtype(zm_, t, ZS_FIELD_GRAD);
    if (d == ZS_FLOAT32 && copy_ == nullptr) return static_cast<float*>(p);
    auto& v = gm_[t];
    if (!gdirty_[t]) {
      v.resize(m_.tensors[t].numel());
      ToHost(v, p, d);
      gdirty_[t] = 1;
      gptr_.push_back({t, p});
    }
    return v.data();
  }

 private:
  // n fp32 values from a runtime buffer of dtype d (through `copy_` when
  // the buffer is device memory), and back.
  void ToHost(std::vector<float>& v, const void* p, zs_dtype d) {
    if (copy_ == nullptr) {
      zs_convert(v.data(), ZS_FLOAT32, p, d, v.size());
      return;
    }
    raw_.resize(v.size() * zs_dtype_size(d));
    copy_(raw_.data(), p, raw_.size());
    zs_convert(v.data(), ZS_FLOAT32, raw_.data(), d, v.size());
  }
  void FromHost(void* p, zs_dtype d, const std::vector<float>& v) {
    if (copy_ == nullptr) {
      zs_convert(p, d, v.data(), ZS_FLOAT32, v.size());
      return;
    }
    raw_.resize(v.size() * zs_dtype_size(d));
    zs_convert(raw_.data(), d, v.data(), ZS_FLOAT32, v.size());
    copy_(p, raw_.data(), raw_.size());
  }
  void FlushGrads() {
    for (auto& [t, p] : gptr_) {
      FromHost(p, zs_tensor_field_dtype(zm_, t, ZS_FIELD_GRAD), gm_[t]);
      gdirty_[t] = 0;
    }
    gptr_.clear();
  }
  bool Check(zs_status st, const char* what) {
    if (st == ZS_OK) return true;
    ADD_FAILURE() << what << ": " << zs_status_string(st) << ": "
                  << zs_last_error();
    return false;
  }
  zs_model* zm_;
  Model& m_;
  double scale_;
  void (*copy_)(void*, const void*, size_t);
  std::vector<char> raw_;
  std::vector<float> dummy_;
  std::vector<std::vector<float>> pm_, gm_;
  std::vector<char> gdirty_;
  std::vector<std::pair<int, void*>> gptr_;
};

}  // namespace

zs_status InitCallback(void* user, int tensor, const zs_tensor_desc* desc,
                       void* data) {
  if (desc->dtype == ZS_FLOAT32) {
    static_cast<Model*>(user)->Init(tensor, static_cast<float*>(data));
    return ZS_OK;
  }
  std::vector<float> v(desc->numel);
  static_cast<Model*>(user)->Init(tensor, v.data());
  return zs_convert(data, desc->dtype, v.data(), ZS_FLOAT32, v.size());
}

// A field of a tensor as fp32 (converting 16-bit values).
zs_status GetFloat(zs_model* zm, int t, zs_field f, std::vector<float>& out) {
  zs_dtype d = zs_tensor_field_dtype(zm, t, f);
  if (d == ZS_FLOAT32 || d == ZS_DTYPE_COUNT)
    return zs_tensor_get(zm, t, f, out.data());
  std::vector<uint16_t> h(out.size());
  zs_status st = zs_tensor_get(zm, t, f, h.data());
  if (st == ZS_OK) st = zs_convert(out.data(), ZS_FLOAT32, h.data(), d, h.size());
  return st;
}

namespace {

// Writes NaN into every element of a unit's local buffers that belongs to
// no tensor (alignment gaps and the padding of the last shard).
void FillPaddingNaN(zs_model* zm) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int stage = zm->ctx->config.stage, rank = zm->ctx->rank;
  for (int ui = 0; ui < zm->nunits; ui++) {
    zs__unit* u = &zm->units[ui];
    if (u->elem != sizeof(float) || u->gelem != sizeof(float)) continue;
    std::vector<char> owned(u->layout.padded, 0);
    for (int i = 0; i < u->ntensors; i++) {
      const zs__tensor* t = &zm->tensors[u->tensors[i]];
      if (t->tied_to >= 0) continue;
      std::fill(owned.begin() + t->offset, owned.begin() + t->offset + t->numel, 1);
    }
    auto fill = [&](void* buf, size_t begin, size_t len) {
      if (buf == nullptr) return;
      float* f = static_cast<float*>(buf);
      for (size_t i = 0; i < len; i++)
        if (!owned[begin + i]) f[i] = nan;
    };
    size_t S = u->layout.shard, P = u->layout.padded, s0 = (size_t)rank * S;
    if (stage <= 2) fill(u->params_full, 0, P); else fill(u->params_shard, s0, S);
    if (stage <= 1) fill(u->grads_full, 0, P); else fill(u->grads_shard, s0, S);
    for (int k = 0; k < u->nstates; k++)
      if (stage == 0) fill(u->state[k], 0, P); else fill(u->state[k], s0, S);
  }
}

zs_comm_counters Diff(const zs_comm_counters& a, const zs_comm_counters& b) {
  zs_comm_counters d{};
  for (int k = 0; k < ZS_COLL_OP_COUNT; k++) {
    d.calls[k] = a.calls[k] - b.calls[k];
    d.bytes[k] = a.bytes[k] - b.bytes[k];
    d.seconds[k] = a.seconds[k] - b.seconds[k];
    d.wait_seconds[k] = a.wait_seconds[k] - b.wait_seconds[k];
  }
  return d;
}

}  // namespace

zs_status RegisterModel(Model& model, zs_model* zm) {
  for (auto& u : model.units) {
    int id = -1;
    zs_status st = zs_model_add_unit(zm, u.name.c_str(), &id);
    if (st != ZS_OK) return st;
  }
  std::vector<int> unit_of(model.tensors.size(), -1);
  for (size_t u = 0; u < model.units.size(); u++)
    for (int t : model.units[u].tensors) unit_of[t] = (int)u;
  int nodecay = -1;
  for (size_t t = 0; t < model.tensors.size(); t++) {
    const TensorSpec& s = model.tensors[t];
    int id = -1;
    zs_status st;
    if (s.tie >= 0) {
      st = zs_model_add_tied_tensor(zm, unit_of[t], s.name.c_str(), s.tie, &id);
    } else {
      st = zs_model_add_tensor(zm, unit_of[t], s.name.c_str(), (int)s.shape.size(),
                               s.shape.data(), model.dtype,
                               s.frozen ? ZS_TENSOR_FROZEN : 0u, &id);
      if (st == ZS_OK && s.no_decay) {
        if (nodecay < 0)
          st = zs_model_add_param_group(
              zm, zs_context_config(zm->ctx)->optimizer.lr, 0.0, &nodecay);
        if (st == ZS_OK) st = zs_model_set_tensor_group(zm, id, nodecay);
      }
    }
    if (st != ZS_OK) return st;
    if (id != (int)t) return ZS_ERR_INTERNAL;
  }
  return ZS_OK;
}

std::string DescribeModel(const Model& model) {
  std::string d = "{\"units\": [";
  for (size_t u = 0; u < model.units.size(); u++) {
    d += (u ? ", " : "") + std::string("{\"name\": \"") + model.units[u].name +
         "\", \"dtype\": \"" + zs_dtype_name(model.dtype) + "\", \"tensors\": [";
    for (size_t k = 0; k < model.units[u].tensors.size(); k++) {
      const TensorSpec& s = model.tensors[model.units[u].tensors[k]];
      d += (k ? ", " : "") + std::string("{\"name\": \"") + s.name + "\", ";
      if (s.tie >= 0)
        d += "\"tied_to\": \"" + model.tensors[s.tie].name + "\"}";
      else
        d += "\"numel\": " + std::to_string(s.numel()) +
             (s.frozen ? ", \"frozen\": true}" : "}");
    }
    d += "]}";
  }
  return d + "]}";
}

TrainResult TrainSharded(Model& model, const TrainConfig& cfg) {
  TrainResult r;
  int rank = 0, world = 1;
  MPI_Comm_rank(cfg.comm, &rank);
  MPI_Comm_size(cfg.comm, &world);
  zs_config c = ZS_CONFIG_INIT;
  c.stage = cfg.stage;
  c.optimizer = OptimizerFor(cfg);
  c.prefetch_depth = cfg.prefetch_depth;
  c.bucket_elements = cfg.bucket_elements;
  c.reduce_order = (zs_reduce_order)cfg.reduce_order;
  c.reshard_after_forward = cfg.reshard_after_forward;
  c.max_live_elements = cfg.max_live_elements;
  c.progress_thread = cfg.progress_thread;
  c.host_collectives = (zs_host_collectives)cfg.host_collectives;
  c.shard_group_size = cfg.shard_group_size;
  c.grad_accum_steps = cfg.grad_accum;
  c.grad_accum_local = cfg.grad_accum_local;
  c.clip_grad_norm = cfg.max_grad_norm > 0;
  if (cfg.max_grad_norm > 0) c.max_grad_norm = cfg.max_grad_norm;
  c.reduce_dtype = (zs_dtype)cfg.reduce_dtype;
  c.loss_scaler.mode = (zs_loss_scaling)cfg.loss_scaler;
  c.loss_scaler.init_scale = cfg.init_scale;
  c.offload_optimizer.device = (zs_offload_device)cfg.offload;
  c.offload_param = (zs_offload_device)cfg.offload_param;
  c.nvme = cfg.nvme;
  c.device = cfg.device;
  model.dtype = cfg.param_dtype;
  zs_context* ctx = nullptr;
  zs_model* zm = nullptr;
  auto fail = [&](zs_status st) {
    r.status = st;
    r.error = zs_last_error();
  };
  zs_status st = cfg.local_context ? zs_context_create_local(&c, &ctx)
                                    : zs_context_create_mpi(&c, cfg.comm, &ctx);
  if (st == ZS_OK) zs_memory_stats_get(ctx, &r.memory_baseline);
  if (st == ZS_OK) st = zs_model_create(ctx, &zm);
  if (st == ZS_OK) st = RegisterModel(model, zm);
  for (size_t k = 0; st == ZS_OK && k < cfg.replicated.size(); k++)
    st = zs_unit_set_strategy(zm, cfg.replicated[k], ZS_UNIT_REPLICATED);
  for (size_t k = 0; st == ZS_OK && k < cfg.allow_unused.size(); k++)
    st = zs_unit_allow_unused(zm, cfg.allow_unused[k]);
  if (st == ZS_OK && cfg.persistence_threshold > 0)
    st = zs_model_set_persistence_threshold(zm, cfg.persistence_threshold);
  if (st == ZS_OK && cfg.optim_fn != nullptr)
    st = zs_model_set_optimizer(zm, cfg.optim_name.c_str(), cfg.optim_nstates,
                                cfg.optim_fn, cfg.optim_user);
  for (size_t u = 0; st == ZS_OK && u < cfg.uses.size(); u++)
    if (cfg.uses[u] > 0) st = zs_unit_set_grad_uses(zm, (int)u, cfg.uses[u]);
  if (st == ZS_OK) st = zs_model_finalize(zm);
  if (st == ZS_OK) st = zs_model_init(zm, InitCallback, &model);
  if (st == ZS_OK && cfg.sentinel) FillPaddingNaN(zm);
  if (st == ZS_OK && !cfg.load.empty())
    st = zs_checkpoint_load(zm, cfg.load.c_str(), cfg.load_flags, nullptr, 0,
                            nullptr);
  // Micro-batch k of rank r: samples [k*G/K + r*nb, +nb), nb = G/(W*K).
  const int K = cfg.grad_accum, nb = cfg.global_batch / (world * K);
  ShardedAccess access(zm, model, 1.0,
                       cfg.device == ZS_DEVICE_HOST ? nullptr : cfg.copy);
  for (int s = cfg.first_step; st == ZS_OK && s < cfg.first_step + cfg.steps;
       s++) {
    zs_comm_counters before{}, after{};
    zs_comm_counters_get(ctx, &before);
    const uint64_t prefetched = zm->prefetch_gathers;
    const uint64_t log_from = LogEnd(ctx);
    st = zs_model_set_lr(zm, ZS_ALL_GROUPS, LrAt(cfg, s));
    double sum = 0, total = 0;
    zs_step_info info{};
    double used_scale = 1.0;
    for (int k = 0; st == ZS_OK && k < K; k++) {
      used_scale = zs_model_loss_scale(zm);
      access.set_scale(used_scale);
      const int b0 = k * (cfg.global_batch / K) + rank * nb;
      sum += (double)model.Step(access, s, b0, nb) * nb;
      st = zs_step(zm, &info);
    }
    zs_comm_counters_get(ctx, &after);
    r.step_counters.push_back(Diff(after, before));
    r.step_prefetched.push_back(zm->prefetch_gathers - prefetched);
    r.step_log.push_back(LogFrom(ctx, log_from));
    r.infos.push_back(info);
    zs_memory_stats ms{};
    zs_memory_stats_get(ctx, &ms);
    r.step_memory.push_back(ms);
    MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, cfg.comm);
    r.losses.push_back((float)(total / cfg.global_batch));
    if (st == ZS_OK && cfg.max_grad_norm > 0) {
      // The independent norm: every trainable tensor's reduced gradient.
      double sumsq = 0;
      for (size_t t = 0; st == ZS_OK && t < model.tensors.size(); t++) {
        const TensorSpec& ts = model.tensors[t];
        if (ts.tie >= 0 || ts.frozen) continue;
        std::vector<float> g(ts.numel());
        st = GetFloat(zm, (int)t, ZS_FIELD_GRAD, g);
        for (float x : g) sumsq += (double)x * x;
      }
      r.norms.push_back(std::sqrt(sumsq) / used_scale);
    }
  }
  if (st == ZS_OK && !cfg.save.empty())
    st = zs_checkpoint_save(zm, cfg.save.c_str(),
                            cfg.save_name.empty() ? nullptr
                                                  : cfg.save_name.c_str(),
                            nullptr, 0);
  if (st != ZS_OK) fail(st);
  if (zm != nullptr) r.loss_scale = zs_model_loss_scale(zm);
  for (size_t t = 0; st == ZS_OK && t < model.tensors.size(); t++) {
    std::vector<float> p(model.tensors[t].numel()), s0(p.size());
    std::vector<float> s1, ms;
    const zs_field f1 =
        cfg.optim_fn != nullptr ? ZS_FIELD_STATE_1 : ZS_FIELD_EXP_AVG_SQ;
    if (zs_tensor_field_dtype(zm, (int)t, f1) == ZS_FLOAT32) {
      s1.resize(p.size());
      st = zs_tensor_get(zm, (int)t, f1, s1.data());
    }
    if (st == ZS_OK &&
        zs_tensor_field_dtype(zm, (int)t, ZS_FIELD_MASTER) == ZS_FLOAT32) {
      ms.resize(p.size());
      st = zs_tensor_get(zm, (int)t, ZS_FIELD_MASTER, ms.data());
    }
    r.state1.push_back(s1);
    r.master.push_back(ms);
    st = GetFloat(zm, (int)t, ZS_FIELD_PARAM, p);
    const TensorSpec& ts = model.tensors[t];
    const TensorSpec& own = ts.tie >= 0 ? model.tensors[ts.tie] : ts;
    zs_field f = cfg.optim_fn != nullptr ? ZS_FIELD_STATE_0
                 : cfg.optimizer == ZS_OPTIM_SGD ? ZS_FIELD_MOMENTUM
                                                 : ZS_FIELD_EXP_AVG;
    if (st == ZS_OK && !own.frozen) st = zs_tensor_get(zm, (int)t, f, s0.data());
    r.params.push_back(p);
    r.state0.push_back(s0);
    if (st != ZS_OK) fail(st);
  }
  if (ctx != nullptr) zs_memory_stats_get(ctx, &r.memory);
  if (ctx != nullptr) zs_offload_info_get(ctx, &r.offload);
  zs_model_destroy(zm);
  if (ctx != nullptr) zs_memory_stats_get(ctx, &r.memory_after_destroy);
  zs_context_destroy(ctx);
  return r;
}

// ==== Comparisons ==========================================================

::testing::AssertionResult CloseByNorm(const std::vector<float>& a,
                                       const std::vector<float>& b,
                                       double rel) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure()
           << "sizes differ: " << a.size() << " vs " << b.size();
  double d2 = 0, b2 = 0, dmax = 0, bmax = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); i++) {
    double d = std::fabs((double)a[i] - (double)b[i]);
    if (!(d <= dmax) || std::isnan(d)) {
      dmax = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
    d2 += d * d;
    b2 += (double)b[i] * b[i];
    bmax = std::max(bmax, std::fabs((double)b[i]));
  }
  if (std::sqrt(d2) <= rel * std::sqrt(b2) && dmax <= rel * bmax)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "||a-b|| = " << std::sqrt(d2) << " > " << rel << " * ||b|| = "
         << rel * std::sqrt(b2) << " or max|a-b| = " << dmax << " > " << rel
         << " * max|b| = " << rel * bmax << "; worst element " << worst
         << ": a = " << (a.empty() ? 0.f : a[worst])
         << ", b = " << (b.empty() ? 0.f : b[worst]);
}

::testing::AssertionResult Bitwise(const std::vector<float>& a,
                                   const std::vector<float>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure()
           << "sizes differ: " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << a[i] << " vs " << b[i]
             << " (hex " << std::hexfloat << a[i] << " vs " << b[i] << ")";
  return ::testing::AssertionSuccess();
}

void ExpectSameTensors(const TrainResult& a, const TrainResult& b,
                       const Model& m, const std::string& what) {
  ASSERT_EQ(a.params.size(), m.tensors.size()) << what;
  ASSERT_EQ(b.params.size(), m.tensors.size()) << what;
  for (size_t t = 0; t < m.tensors.size(); t++) {
    const std::string w = what + " tensor '" + m.tensors[t].name + "'";
    EXPECT_TRUE(Bitwise(a.params[t], b.params[t])) << w;
    EXPECT_TRUE(Bitwise(a.state0[t], b.state0[t])) << w << " state 0";
    EXPECT_TRUE(Bitwise(a.state1[t], b.state1[t])) << w << " state 1";
    EXPECT_TRUE(Bitwise(a.master[t], b.master[t])) << w << " master";
  }
}

std::vector<size_t> GatheredPeaks(const TrainResult& r) {
  std::vector<size_t> out;
  for (const zs_memory_stats& ms : r.step_memory) {
    size_t q = 0;
    for (int ph = 0; ph < ZS_PHASE_CAP; ph++)
      q = std::max(q, ms.phase_peak[ph][ZS_MEM_PARAMS_GATHERED]);
    out.push_back(q);
  }
  return out;
}

void ExpectSameTraining(const TrainResult& a, const TrainResult& b,
                        const Model& m, const std::string& what) {
  ExpectSameTensors(a, b, m, what);
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t s = 0; s < a.losses.size(); s++)
    EXPECT_EQ(a.losses[s], b.losses[s]) << what << " step " << s;
}

TrainResult TrainSlice(Model& model, TrainConfig cfg, int first, int steps,
                       const std::string& load, const std::string& save,
                       const std::string& what) {
  cfg.first_step = first;
  cfg.steps = steps;
  cfg.load = load;
  cfg.save = save;
  cfg.save_name = "";
  TrainResult r = TrainSharded(model, cfg);
  EXPECT_EQ(r.status, ZS_OK) << what << ": " << r.error;
  return r;
}

std::string TestDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string d = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  mkdir(d.c_str(), 0700);
  return d;
}

void ExpectEmptyDir(const std::string& dir, const std::string& what) {
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has removed its own
  EXPECT_EQ(DirEntries(dir), 0u) << what << ": files left in " << dir;
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace zstest
