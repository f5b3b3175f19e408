/*
 * optim_scalars.h — what the reference kernels (optim_ref.c) and the fast
 * ones (optim_cpu.c) share, so that both compute the same bits: the
 * per-step scalars, each rounded once from double as ATen does, and the
 * per-element Adam update in torch's operation order (optim_ref.c's
 * header says why each step is what it is). The CUDA kernels
 * (optim_cuda.cu) include it too, so the GPU runs the same per-element
 * math the CPU tests check. Internal to optim/.
 */
#ifndef ZS_OPTIM_OPTIM_SCALARS_H_
#define ZS_OPTIM_OPTIM_SCALARS_H_

#include <math.h>
#include <stdint.h>
#include <zeroshard.h>

#include "optim/convert.h" /* ZS__HD: host and device (CUDA) functions */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__adam_scalars {
  float decay;        /* AdamW: 1 - lr*wd */
  float weight_decay; /* Adam: L2 coefficient added to the gradient */
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bc2_sqrt; /* sqrt(1 - beta2^step) */
  float eps;
  float neg_step_size; /* -lr / (1 - beta1^step) */
} zs__adam_scalars;

/* The scalars of one Adam/AdamW step (hp valid, step >= 1). */
zs__adam_scalars zs__adam_scalars_make(const zs_adam_hparams* hp,
                                       int64_t step);

/* One element: each line one ATen op of torch/optim/adam{,w}.py, in
 * torch's order; p already decayed (AdamW) and g already with L2 (Adam).
 * Writes the moments, returns the new parameter. */
static inline ZS__HD float zs__adam_update(float p, float g, float* exp_avg,
                                    float* exp_avg_sq,
                                    const zs__adam_scalars* s) {
  float m = *exp_avg * s->beta1;        /* exp_avg.mul_(beta1) */
  m = m + s->one_minus_beta1 * g;       /* .add_(grad, alpha=1-beta1) */
  float v = *exp_avg_sq * s->beta2;     /* exp_avg_sq.mul_(beta2) */
  v = v + s->one_minus_beta2 * g * g;   /* .addcmul_(grad, grad, 1-beta2) */
  float denom = sqrtf(v) / s->bc2_sqrt; /* exp_avg_sq.sqrt() / bc2_sqrt */
  denom = denom + s->eps;               /* .add_(eps) */
  *exp_avg = m;
  *exp_avg_sq = v;
  /* param.addcdiv_(exp_avg, denom, value=-step_size) */
  return p + s->neg_step_size * m / denom;
}

typedef struct zs__sgd_scalars {
  float weight_decay, momentum, one_minus_dampening, neg_lr;
} zs__sgd_scalars;

zs__sgd_scalars zs__sgd_scalars_make(const zs_sgd_hparams* hp);

/* One SGD element (torch's _single_tensor_sgd): the zero cases are skipped,
 * not multiplied by 0 (which would turn -0 into +0); step 1 is torch's
 * "buffer is None" (a copy of d_p, no dampening). Writes the momentum
 * buffer when momentum is on; returns the new parameter. */
static inline ZS__HD float zs__sgd_update(float p, float g, float* buf,
                                   const zs__sgd_scalars* s, int decay,
                                   int use_momentum, int first, int nesterov) {
  float d_p = g;
  if (decay) d_p = d_p + s->weight_decay * p; /* d_p.add(param, wd) */
  if (use_momentum) {
    float b = d_p;
    if (!first) {
      b = *buf * s->momentum;               /* buf.mul_(momentum) */
      b = b + s->one_minus_dampening * d_p; /* .add_(d_p, 1-dampening) */
    }
    *buf = b;
    /* nesterov: d_p.add(buf, alpha=momentum); else d_p = buf */
    d_p = nesterov ? d_p + s->momentum * b : b;
  }
  return p + s->neg_lr * d_p; /* param.add_(d_p, alpha=-lr) */
}

#ifdef __cplusplus
}
#endif

#endif /* ZS_OPTIM_OPTIM_SCALARS_H_ */
