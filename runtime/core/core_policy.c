/*
 * core_policy.c — the per-unit policy (core_policy.h).
 */
#include "runtime/core/core_policy.h"

#include "runtime/core/core.h"

static zs__tier zs__offload_tier(int offload) {
  return offload == ZS_OFFLOAD_CPU    ? ZS__TIER_HOST
         : offload == ZS_OFFLOAD_NVME ? ZS__TIER_NVME
                                      : ZS__TIER_DEVICE;
}

zs_status zs__policy_make(const zs__policy_in* in, zs__policy* out) {
  if (in->stage < 0 || in->stage > 3)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config.stage: expected 0, 1, 2 or 3, got %d", in->stage);
  if (in->offload_optimizer < ZS_OFFLOAD_NONE ||
      in->offload_optimizer > ZS_OFFLOAD_NVME)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config.offload_optimizer.device: expected none (0), "
                     "cpu (1) or nvme (2), got %d", in->offload_optimizer);
  if (in->offload_param < ZS_OFFLOAD_NONE || in->offload_param > ZS_OFFLOAD_NVME)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config.offload_param: expected none (0), cpu (1) or "
                     "nvme (2), got %d", in->offload_param);
  if (in->offload_param != ZS_OFFLOAD_NONE &&
      (in->stage != 3 || in->offload_optimizer == ZS_OFFLOAD_NONE))
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "config.offload_param: expected none, or cpu / nvme "
                     "with stage 3 and offload_optimizer.device cpu or nvme "
                     "(got %d at stage %d, offload_optimizer.device %d)",
                     in->offload_param, in->stage, in->offload_optimizer);
  zs__policy p = {0};
  p.stage = in->stage;
  p.trainable = in->trainable != 0;
  p.lowp = in->lowp != 0;
  p.comm = 0;
  /* Parameters: whole at stages 0-2; the shard at 3, wherever parameter
   * offload puts it, gathered while used. */
  p.params = in->stage <= 2 ? ZS__EXTENT_FULL : ZS__EXTENT_SHARD;
  p.params_tier = p.params == ZS__EXTENT_FULL
                      ? ZS__TIER_DEVICE
                      : zs__offload_tier(in->offload_param);
  p.gather_on_use = p.params == ZS__EXTENT_SHARD;
  p.gather_via_copy = p.gather_on_use && p.params_tier != ZS__TIER_DEVICE;
  /* The optimizer's span: the whole buffer at stage 0, the shard at 1-3
   * (also a frozen unit's: the geometry of its pieces and checkpoint
   * spans, with nothing in it to update). */
  p.opt_span = in->stage == 0 ? ZS__EXTENT_FULL : ZS__EXTENT_SHARD;
  if (!p.trainable) return *out = p, ZS_OK;
  /* Gradients: whole at stages 0-1, the shard at 2-3; always a
   * reduce-scatter. */
  p.grads = in->stage <= 1 ? ZS__EXTENT_FULL : ZS__EXTENT_SHARD;
  p.accum_transient = p.grads == ZS__EXTENT_SHARD;
  p.reduce = ZS__REDUCE_SCATTER;
  p.grads_gather_back = p.opt_span == ZS__EXTENT_FULL;
  p.refresh_after_step =
      p.params == ZS__EXTENT_FULL && p.opt_span == ZS__EXTENT_SHARD;
  p.state_tier = zs__offload_tier(in->offload_optimizer);
  p.master_tier = p.lowp ? p.state_tier : ZS__TIER_NONE;
  *out = p;
  return ZS_OK;
}

zs__optim_loop zs__policy_loop(int nvme_optimizer, int staged,
                               int nvme_params) {
  if (nvme_optimizer) return ZS__LOOP_NVME;
  if (staged && !nvme_params) return ZS__LOOP_STAGED;
  return ZS__LOOP_UNITS;
}

const char* zs__tier_name(zs__tier t) {
  switch (t) {
    case ZS__TIER_NONE: return "none";
    case ZS__TIER_DEVICE: return "device";
    case ZS__TIER_HOST: return "host";
    case ZS__TIER_NVME: return "nvme";
  }
  return "?";
}
