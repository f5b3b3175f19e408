/*
 * optim_ref.c — scalar CPU reference for the optimizer kernels declared in
 * zeroshard.h ("Optimizer kernels"): zs_optim_adamw, zs_optim_adam,
 * zs_optim_sgd. Every other implementation (vectorized, CUDA) is tested
 * against this one, and this one against torch (tests/optim/).
 *
 * Bitwise contract: each element goes through exactly the float32 operations
 * of PyTorch 1.13's _single_tensor_{adamw,adam,sgd} in the same order, as
 * ATen's scalar CPU kernels evaluate them:
 *   mul_(s)                 self * s
 *   add_(t, alpha=a)        self + a * t         (ufunc/add.h)
 *   addcmul_(t1, t2, v)     self + v * t1 * t2   (PointwiseOpsKernel.cpp)
 *   addcdiv_(t1, t2, v)     self + v * t1 / t2   (PointwiseOpsKernel.cpp)
 *   sqrt(), t / s, add_(s)  correctly rounded float32 ops
 * C's left-to-right evaluation gives the same grouping, e.g. (v * t1) / t2.
 * The Python-side scalars (1 - lr*wd, 1 - beta, bias corrections, step size)
 * are computed in double as Python does and rounded once to float, as ATen
 * does when a Python float meets a float32 tensor. The BUILD file compiles
 * this file with -ffp-contract=off: a fused multiply-add would round once
 * where ATen's scalar kernel rounds twice. (ATen's AVX2 kernels do use FMA
 * for add-with-alpha; tests/optim/optim_ref_test.cc says what that costs.)
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <zeroshard.h>

#include "optim/optim_scalars.h"
#include "runtime/core/core.h"

/* Excess precision (x87) would keep intermediates wider than float. */
#if FLT_EVAL_METHOD != 0
#error "optim_ref.c needs FLT_EVAL_METHOD == 0 (float math in float)"
#endif

/* The one exit for errors: the message goes to zs_last_error(). */
static zs_status optim_error(zs_status status, const char* msg) {
  return zs__error(status, "%s", msg);
}

/* ==== Adam and AdamW ===================================================== */

static zs_status adam_check(const float* param, const float* grad,
                            const float* exp_avg, const float* exp_avg_sq,
                            size_t n, const zs_adam_hparams* hp, int64_t step) {
  if (hp == NULL)
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_adam[w]: hparams is NULL; pass a zs_adam_hparams");
  if (step < 1)
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_adam[w]: step must be >= 1 (1 on the first update)");
  /* Ranges as torch.optim.Adam/AdamW's constructors check them; written
   * as !(ok) so that NaN fails too. */
  if (!(hp->lr >= 0.0) || !(hp->eps >= 0.0) || !(hp->weight_decay >= 0.0))
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_adam[w]: lr, eps and weight_decay must be >= 0");
  if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0) ||
      !(hp->beta2 >= 0.0 && hp->beta2 < 1.0))
    return optim_error(ZS_ERR_INVALID_ARGUMENT,
                       "zs_optim_adam[w]: beta1 and beta2 must be in [0, 1)");
  if (n > 0 &&
      (param == NULL || grad == NULL || exp_avg == NULL || exp_avg_sq == NULL))
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_adam[w]: param, grad, exp_avg and exp_avg_sq must be "
        "non-NULL when n > 0");
  return ZS_OK;
}

zs__adam_scalars zs__adam_scalars_make(const zs_adam_hparams* hp,
                                       int64_t step) {
  /* torch reads the step as a Python float (step_t.item()). */
  const double t = (double)step;
  const double bias_correction1 = 1.0 - pow(hp->beta1, t);
  const double bias_correction2 = 1.0 - pow(hp->beta2, t);
  const double step_size = hp->lr / bias_correction1;
  zs__adam_scalars s;
  s.decay = (float)(1.0 - hp->lr * hp->weight_decay);
  s.weight_decay = (float)hp->weight_decay;
  s.beta1 = (float)hp->beta1;
  s.one_minus_beta1 = (float)(1.0 - hp->beta1);
  s.beta2 = (float)hp->beta2;
  s.one_minus_beta2 = (float)(1.0 - hp->beta2);
  s.bc2_sqrt = (float)sqrt(bias_correction2);
  s.eps = (float)hp->eps;
  s.neg_step_size = (float)(-step_size);
  return s;
}

zs_status zs_optim_adamw(float* param, const float* grad, float* exp_avg,
                         float* exp_avg_sq, size_t n, const zs_adam_hparams* hp,
                         int64_t step) {
  zs_status st = adam_check(param, grad, exp_avg, exp_avg_sq, n, hp, step);
  if (st != ZS_OK) return st;
  const zs__adam_scalars s = zs__adam_scalars_make(hp, step);
  for (size_t i = 0; i < n; i++) {
    /* Decoupled weight decay: param.mul_(1 - lr*wd) before the moments. */
    const float p = param[i] * s.decay;
    param[i] = zs__adam_update(p, grad[i], &exp_avg[i], &exp_avg_sq[i], &s);
  }
  return ZS_OK;
}

zs_status zs_optim_adam(float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, size_t n, const zs_adam_hparams* hp,
                        int64_t step) {
  zs_status st = adam_check(param, grad, exp_avg, exp_avg_sq, n, hp, step);
  if (st != ZS_OK) return st;
  const zs__adam_scalars s = zs__adam_scalars_make(hp, step);
  /* torch skips grad.add(param, alpha=0): -0 + 0*p would turn -0 into +0. */
  const int decay = hp->weight_decay != 0.0;
  for (size_t i = 0; i < n; i++) {
    float g = grad[i];
    if (decay) g = g + s.weight_decay * param[i];
    param[i] = zs__adam_update(param[i], g, &exp_avg[i], &exp_avg_sq[i], &s);
  }
  return ZS_OK;
}

/* ==== SGD ================================================================ */

static zs_status sgd_check(const float* param, const float* grad,
                           const float* momentum_buffer, size_t n,
                           const zs_sgd_hparams* hp, int64_t step) {
  if (hp == NULL)
    return optim_error(ZS_ERR_INVALID_ARGUMENT,
                       "zs_optim_sgd: hparams is NULL; pass a zs_sgd_hparams");
  if (step < 1)
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_sgd: step must be >= 1 (1 on the first update)");
  if (!(hp->lr >= 0.0) || !(hp->momentum >= 0.0) ||
      !(hp->weight_decay >= 0.0) || isnan(hp->dampening))
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_sgd: lr, momentum and weight_decay must be >= 0, "
        "dampening a number");
  /* torch.optim.SGD's rule: Nesterov needs momentum and no dampening. */
  if (hp->nesterov && (hp->momentum <= 0.0 || hp->dampening != 0.0))
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_sgd: nesterov requires momentum > 0 and dampening 0");
  if (n > 0 && (param == NULL || grad == NULL))
    return optim_error(
        ZS_ERR_INVALID_ARGUMENT,
        "zs_optim_sgd: param and grad must be non-NULL when n > 0");
  if (n > 0 && hp->momentum != 0.0 && momentum_buffer == NULL)
    return optim_error(ZS_ERR_INVALID_ARGUMENT,
                       "zs_optim_sgd: momentum_buffer must be non-NULL when "
                       "momentum != 0 and n > 0");
  return ZS_OK;
}

zs__sgd_scalars zs__sgd_scalars_make(const zs_sgd_hparams* hp) {
  zs__sgd_scalars s;
  s.weight_decay = (float)hp->weight_decay;
  s.momentum = (float)hp->momentum;
  s.one_minus_dampening = (float)(1.0 - hp->dampening);
  s.neg_lr = (float)(-hp->lr);
  return s;
}

zs_status zs_optim_sgd(float* param, const float* grad, float* momentum_buffer,
                       size_t n, const zs_sgd_hparams* hp, int64_t step) {
  zs_status st = sgd_check(param, grad, momentum_buffer, n, hp, step);
  if (st != ZS_OK) return st;
  const zs__sgd_scalars s = zs__sgd_scalars_make(hp);
  const int decay = hp->weight_decay != 0.0;
  const int use_momentum = hp->momentum != 0.0;
  for (size_t i = 0; i < n; i++)
    param[i] = zs__sgd_update(param[i], grad[i],
                              use_momentum ? &momentum_buffer[i] : NULL, &s,
                              decay, use_momentum, step <= 1, hp->nesterov);
  return ZS_OK;
}
