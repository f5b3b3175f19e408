/*
 * engine.h — the model and its units: registration, storage per stage, the
 * per-unit state machine, gradient reduction and the optimizer step. One
 * code path for every stage and backend; the stage only decides which
 * buffers persist (docs/design.md, "Unit state machine"). The engine talks
 * to memory through device.h and to other ranks through comm.h, never to
 * MPI, NCCL or CUDA directly.
 */
#ifndef ZS_RUNTIME_ENGINE_H_
#define ZS_RUNTIME_ENGINE_H_

#include "runtime/context.h"
#include "runtime/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs__tensor {
  char name[ZS_NAME_MAX];
  int unit;          /* the unit it was registered in */
  int slot;          /* its index in that unit's tensor list */
  int ndim;
  int64_t shape[ZS_MAX_DIMS];
  size_t numel;      /* elements */
  zs_dtype dtype;
  unsigned int flags;
  int tied_to;       /* owner tensor id, or -1 */
  int group;         /* param group */
  size_t offset;     /* elements into the owning unit's flat buffer */
  int64_t step;      /* optimizer updates applied (per parameter, as PyTorch) */
} zs__tensor;

/* Gradient state of a unit within one step. */
typedef enum zs__grad_state {
  ZS__GRAD_IDLE = 0,    /* not touched this step */
  ZS__GRAD_ACCUM = 1,   /* accumulation buffer live (zeroed at first open) */
  ZS__GRAD_REDUCED = 2  /* reduced into the shard this step */
} zs__grad_state;

typedef struct zs__unit {
  char name[ZS_NAME_MAX];
  int* tensors; /* model tensor ids registered here (aliases too) */
  int ntensors;
  int cap;
  int* owners;  /* other units owning tensors tied from here (finalize) */
  int nowners;
  zs_dtype dtype;
  size_t elem;  /* bytes per element */
  int trainable; /* has an untied, non-frozen tensor: grads + optimizer */
  zs__unit_layout layout;

  /* Storage. The stage decides which of these persist:
   *   params_full  stages 0-2 persistent (PARAMS); stage 3 while gathered
   *                (PARAMS_GATHERED)
   *   params_shard stage 3 persistent (PARAMS)
   *   grads_full   stages 0-1 persistent (GRADS)
   *   grads_shard  stages 2-3 persistent (GRADS)
   *   grad_accum   where backward accumulates: grads_full at stages 0-1, a
   *                transient full buffer (COMM_BUFFERS) at stages 2-3
   *   state[k]     optimizer states: full at stage 0, shard at 1-3 */
  void* params_full;
  void* params_shard;
  void* grads_full;
  void* grads_shard;
  void* grad_accum;
  void* grad_saved; /* a re-opened unit's earlier reduced shard */
  void* state[2];
  int nstates;
  zs__piece* opt_pieces; /* trainable tensor pieces of the optimizer span */
  size_t nopt_pieces;

  /* Per-step state. */
  int user_gathered;  /* the user holds a gather */
  int gather_refs;    /* user + ties holding the parameters */
  int user_grad_open; /* the user holds a grad acquire */
  int grad_refs;      /* user + ties holding the gradient buffers */
  zs__grad_state grad_state;
  int reopened;       /* opened again after its reduction this step */
  int releases;       /* gradient releases this step (ties count) */
  int uses_explicit;  /* zs_unit_set_grad_uses, 0 = record */
  int uses_recorded;  /* most releases seen in a step; 0 = unknown */
} zs__unit;

struct zs_model {
  zs_context* ctx;
  zs__tensor* tensors;
  int ntensors;
  int tensors_cap;
  zs__unit* units;
  int nunits;
  int units_cap;
  double* group_lr; /* per param group */
  double* group_wd;
  int ngroups;
  zs_model* next; /* in ctx->models; NULL ctx: detached (ctx destroyed) */
  int finalized;
  int poisoned; /* a registration call failed on this rank */
  char poison_msg[512];
  int64_t steps_called;  /* zs_step calls that completed */
  int64_t steps_applied; /* ... of which ran the optimizer */
};

/* ---- engine_model.c ---- */
/* Frees a model's storage and unlinks it from its context, leaving only
 * what zs_model_destroy frees (used when the context goes first). */
void zs__model_detach(zs_model* m);
/* The unit whose buffer holds tensor t (its owner's unit for a tie). */
static inline int zs__storage_unit(const zs_model* m, int t) {
  const zs__tensor* x = &m->tensors[t];
  return x->tied_to >= 0 ? m->tensors[x->tied_to].unit : x->unit;
}
static inline char* zs__at(void* base, size_t elems, size_t elem) {
  return (char*)base + elems * elem;
}
/* This rank's shard of a unit's parameters / reduced gradient (elements
 * [rank*shard, (rank+1)*shard) of the flat buffer). */
void* zs__param_shard_ptr(zs_model* m, zs__unit* u);
void* zs__grad_shard_ptr(zs_model* m, zs__unit* u);
/* Optimizer state k of a unit, pointing at this rank's shard. */
void* zs__state_shard_ptr(zs_model* m, zs__unit* u, int k);
zs_status zs__check_finalized(const zs_model* m, const char* fn);

/* ---- engine_step.c ---- */
zs_status zs__unit_gather_internal(zs_model* m, int unit);
void zs__unit_release_internal(zs_model* m, int unit);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_ENGINE_H_ */
