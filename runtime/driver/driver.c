/*
 * driver.c — the sequential driver (zeroshard.h, "Sequential driver"):
 * runs a model's layers forward and backward through the per-step API,
 * owns their activation buffers, and implements per-layer activation
 * checkpointing (keep each layer's output, recompute its internal
 * activations into one shared scratch before its backward).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/engine.h"

struct zs_driver {
  zs_model* m;      /* NULL once the model was destroyed first */
  zs__hook* hook;   /* on m->hooks: the model's destroy detaches it */
  int forwarded;    /* a training forward ran, its backward not yet */
  int checkpoint;    /* 1: recompute in backward */
  int verify;        /* with checkpoint: compare each recomputed output */
  size_t input_bytes;
  zs_layer_desc* layers;
  int n, cap;
  int allocated;  /* buffers exist; no more layers */
  void* input;
  void** outputs; /* per layer */
  void** scratch; /* per layer (the same pointer when checkpointing) */
  void* grad[2];  /* ping-pong gradients of layer outputs / inputs */
  size_t grad_bytes;
  void* kept[2];  /* verify: host copies of the kept and recomputed output */
};

static void zs__driver_free(zs_driver* d);
static void zs__driver_model_gone(void* arg);

zs_status zs_driver_create(zs_model* m, size_t input_bytes,
                           int checkpoint_activations, zs_driver** out) {
  ZS_REQUIRE(m != NULL && out != NULL,
             "zs_driver_create: model and out must not be NULL");
  ZS_REQUIRE(m->ctx != NULL, "zs_driver_create: the model's context was "
             "destroyed");
  ZS_REQUIRE(checkpoint_activations >= 0 &&
                 checkpoint_activations <= ZS_CHECKPOINT_VERIFY,
             "zs_driver_create: checkpoint_activations must be 0, 1 or "
             "ZS_CHECKPOINT_VERIFY (2), got %d", checkpoint_activations);
  zs_driver* d = (zs_driver*)calloc(1, sizeof *d);
  if (d == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_driver_create");
  d->m = m;
  d->checkpoint = checkpoint_activations != 0;
  d->verify = checkpoint_activations == ZS_CHECKPOINT_VERIFY;
  d->input_bytes = input_bytes;
  zs_status st = zs__hook_add(&m->hooks, zs__driver_model_gone, NULL, d,
                              &d->hook);
  if (st != ZS_OK) {
    free(d);
    return st;
  }
  *out = d;
  return ZS_OK;
}

/* The model's hook: a model destroyed before its driver (a misuse) leaves
 * the driver detached, its buffers freed and its later calls refused. */
static void zs__driver_model_gone(void* arg) {
  zs_driver* d = (zs_driver*)arg;
  zs__driver_free(d);
  d->m = NULL;
  d->hook = NULL; /* freed by the model */
}

void zs_driver_destroy(zs_driver* d) {
  if (d == NULL) return;
  if (d->m != NULL) {
    zs__driver_free(d);
    zs__hook_remove(&d->m->hooks, d->hook);
  }
  free(d->layers);
  free(d);
}

/* Every call but destroy needs the model: one destroyed first (a misuse the
 * header warns of) leaves the driver detached, not dangling. */
#define ZS__DRIVER_LIVE(d, fn)                                              \
  ZS_REQUIRE((d) != NULL, fn ": driver is NULL");                           \
  if ((d)->m == NULL)                                                       \
    return zs__error(ZS_ERR_INVALID_STATE, fn ": the driver's model was "   \
                     "destroyed (destroy the driver first)")

/* Whether a layer on unit `lu` uses unit `u`: its own, or the unit of the
 * owner of one of its tied tensors. */
static int zs__layer_uses(const zs_model* m, int lu, int u) {
  if (lu == u) return 1;
  const zs__unit* x = &m->units[lu];
  for (int i = 0; i < x->ntensors; i++) {
    const zs__tensor* t = &m->tensors[x->tensors[i]];
    if (t->tied_to >= 0 && m->tensors[t->tied_to].unit == u) return 1;
  }
  return 0;
}

/* Declares the use counts of unit `lu` and of the units it ties to, over
 * every layer added so far (layers[0..n], the new one included). */
static zs_status zs__driver_declare_uses(zs_driver* d, int lu) {
  zs_model* m = d->m;
  for (int u = 0; u < m->nunits; u++) {
    if (!zs__layer_uses(m, lu, u)) continue;
    int uses = 0;
    for (int l = 0; l <= d->n; l++) uses += zs__layer_uses(m, d->layers[l].unit, u);
    zs_status st = zs_unit_set_grad_uses(m, u, uses);
    if (st != ZS_OK) return st;
  }
  return ZS_OK;
}

zs_status zs_driver_add_layer(zs_driver* d, const zs_layer_desc* desc,
                              int* layer) {
  ZS__DRIVER_LIVE(d, "zs_driver_add_layer");
  ZS_REQUIRE(desc != NULL, "zs_driver_add_layer: desc must not be NULL");
  ZS_REQUIRE(desc->unit >= 0 && desc->unit < d->m->nunits,
             "zs_driver_add_layer: unit %d does not exist (%d units)",
             desc->unit, d->m->nunits);
  ZS_REQUIRE(desc->forward != NULL && desc->backward != NULL,
             "zs_driver_add_layer: layer %d (unit '%s'): forward and backward "
             "must not be NULL", d->n, d->m->units[desc->unit].name);
  ZS_REQUIRE((desc->flags & ~ZS_LAYER_BACKWARD_NO_PARAMS) == 0,
             "zs_driver_add_layer: layer %d (unit '%s'): unknown flags 0x%x",
             d->n, d->m->units[desc->unit].name, desc->flags);
  if (d->allocated)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_driver_add_layer: the activation buffers exist "
                     "(zs_driver_input, zs_driver_output or zs_driver_forward "
                     "was called); add every layer before those");
  if (d->n == d->cap) {
    int cap = d->cap == 0 ? 8 : 2 * d->cap;
    zs_layer_desc* p =
        (zs_layer_desc*)realloc(d->layers, (size_t)cap * sizeof *p);
    if (p == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_driver_add_layer");
    d->layers = p;
    d->cap = cap;
  }
  d->layers[d->n] = *desc;
  /* Before finalize, the layers declare how often each unit is used: a
   * layer uses its unit and, through tied tensors, their owners' units. */
  if (!d->m->finalized) {
    zs_status st = zs__driver_declare_uses(d, desc->unit);
    if (st != ZS_OK) return st;
  }
  if (layer != NULL) *layer = d->n;
  d->n++;
  return ZS_OK;
}

/* The largest gradient buffer and the largest scratch over the layers. */
static void zs__driver_maxima(const zs_driver* d, size_t* gmax, size_t* smax) {
  *gmax = d->input_bytes;
  *smax = 0;
  for (int l = 0; l < d->n; l++) {
    if (d->layers[l].output_bytes > *gmax) *gmax = d->layers[l].output_bytes;
    if (d->layers[l].scratch_bytes > *smax) *smax = d->layers[l].scratch_bytes;
  }
}

zs_status zs_driver_activation_bytes(const zs_driver* d, int checkpoint,
                                     size_t* bytes) {
  ZS_REQUIRE(d != NULL && bytes != NULL,
             "zs_driver_activation_bytes: driver and bytes must not be NULL");
  size_t gmax, smax, total;
  zs__driver_maxima(d, &gmax, &smax);
  total = d->input_bytes + 2 * gmax + (checkpoint ? smax : 0);
  for (int l = 0; l < d->n; l++)
    total += d->layers[l].output_bytes +
             (checkpoint ? 0 : d->layers[l].scratch_bytes);
  *bytes = total;
  return ZS_OK;
}

static void zs__driver_free(zs_driver* d) {
  zs__device* dev = d->m->ctx != NULL ? d->m->ctx->device : NULL;
  if (dev != NULL && d->outputs != NULL) {
    zs__dev_free(dev, d->input);
    zs__dev_free(dev, d->grad[0]);
    zs__dev_free(dev, d->grad[1]);
    for (int l = 0; l < d->n; l++) {
      zs__dev_free(dev, d->outputs[l]);
      if (!d->checkpoint || l == 0) zs__dev_free(dev, d->scratch[l]);
    }
  }
  zs__device* host = d->m->ctx != NULL ? d->m->ctx->host : NULL;
  if (host != NULL) {
    zs__dev_free(host, d->kept[0]);
    zs__dev_free(host, d->kept[1]);
  }
  d->kept[0] = d->kept[1] = NULL;
  free(d->outputs);
  free(d->scratch);
  d->outputs = d->scratch = NULL;
  d->input = d->grad[0] = d->grad[1] = NULL;
  d->allocated = 0;
}

/* Allocates the activation buffers (activations category) on first use;
 * on failure frees what it allocated, so a later call can retry. */
static zs_status zs__driver_alloc(zs_driver* d) {
  if (d->allocated) return ZS_OK;
  ZS_REQUIRE(d->m->ctx != NULL, "zs_driver: the model's context was destroyed");
  ZS_REQUIRE(d->n > 0, "zs_driver: no layers were added");
  zs__device* dev = d->m->ctx->device;
  zs_status st = ZS_OK;
  d->outputs = (void**)calloc((size_t)d->n + 1, sizeof(void*));
  d->scratch = (void**)calloc((size_t)d->n + 1, sizeof(void*));
  if (d->outputs == NULL || d->scratch == NULL) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "driver buffers");
    goto cleanup;
  }
  size_t gmax, smax;
  zs__driver_maxima(d, &gmax, &smax);
  ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_ACTIVATIONS, d->input_bytes, 1,
                         "driver input", &d->input));
  ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_ACTIVATIONS, gmax, 1, "driver gradient",
                         &d->grad[0]));
  ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_ACTIVATIONS, gmax, 1, "driver gradient",
                         &d->grad[1]));
  d->grad_bytes = gmax;
  for (int l = 0; l < d->n; l++) {
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_ACTIVATIONS, d->layers[l].output_bytes,
                           1, "layer output", &d->outputs[l]));
    if (d->checkpoint && l > 0) {
      d->scratch[l] = d->scratch[0];
      continue;
    }
    ZS_CHECK(zs__dev_alloc(dev, ZS_MEM_ACTIVATIONS,
                           d->checkpoint ? smax : d->layers[l].scratch_bytes,
                           1, d->checkpoint ? "shared scratch" : "layer scratch",
                           &d->scratch[l]));
  }
  if (d->verify) {
    size_t omax = 0;
    for (int l = 0; l < d->n; l++)
      if (d->layers[l].output_bytes > omax) omax = d->layers[l].output_bytes;
    for (int k = 0; k < 2; k++)
      ZS_CHECK(zs__dev_alloc(d->m->ctx->host, ZS_MEM_OTHER, omax, 0,
                             "recompute check", &d->kept[k]));
  }
  d->allocated = 1;
cleanup:
  if (st != ZS_OK) zs__driver_free(d);
  return st;
}

/* ZS_CHECKPOINT_VERIFY: the recomputed output of layer l (in
 * d->outputs[l]) against the first run's, saved in d->kept[0] before the
 * recompute. A difference is the callback's error (agreed across ranks). */
static zs_status zs__driver_verify(zs_driver* d, int l) {
  zs__device* dev = d->m->ctx->device;
  const size_t n = d->layers[l].output_bytes;
  zs_status st = dev->ops->copy(dev, d->kept[1], d->outputs[l], n, NULL);
  if (st == ZS_OK) st = dev->ops->stream_sync(dev, NULL);
  if (st != ZS_OK) return st;
  const unsigned char* a = (const unsigned char*)d->kept[0];
  const unsigned char* b = (const unsigned char*)d->kept[1];
  size_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  if (i == n) return ZS_OK;
  return zs__error(ZS_ERR_MISMATCH,
                   "layer %d (unit '%s'): the recomputed forward's output "
                   "differs from the first run's at byte %zu of %zu: with "
                   "activation checkpointing the forward must be "
                   "deterministic (the same bits from the same input: no "
                   "random numbers drawn per call, no sums whose order "
                   "varies)", l, d->m->units[d->layers[l].unit].name, i, n);
}

zs_status zs_driver_input(zs_driver* d, void** input) {
  ZS__DRIVER_LIVE(d, "zs_driver_input");
  ZS_REQUIRE(input != NULL, "zs_driver_input: input must not be NULL");
  zs_status st = zs__driver_alloc(d);
  if (st == ZS_OK) *input = d->input;
  return st;
}

zs_status zs_driver_output(zs_driver* d, int layer, void** output) {
  ZS__DRIVER_LIVE(d, "zs_driver_output");
  ZS_REQUIRE(output != NULL, "zs_driver_output: output must not be NULL");
  ZS_REQUIRE(layer >= 0 && layer < d->n,
             "zs_driver_output: layer %d does not exist (%d layers)", layer,
             d->n);
  zs_status st = zs__driver_alloc(d);
  if (st == ZS_OK) *output = d->outputs[layer];
  return st;
}

static zs_layer_io zs__driver_io(const zs_driver* d, int l) {
  zs_layer_io io;
  memset(&io, 0, sizeof io);
  io.layer = l;
  io.unit = d->layers[l].unit;
  io.input = l == 0 ? d->input : d->outputs[l - 1];
  io.output = d->outputs[l];
  io.scratch = d->scratch[l];
  return io;
}

/* Calls a layer callback, naming the layer in its error. The message is
 * the callback's own only if it set one (a ZeroShard call that failed in
 * it): the last error is cleared first, so an older message is never
 * passed off as the callback's. */
static zs_status zs__driver_call(zs_driver* d, zs_layer_fn fn,
                                 const zs_layer_io* io, const char* what) {
  (void)zs__error(ZS_OK, "%s", "");
  zs_status st = fn(d->layers[io->layer].user, d->m, io);
  if (st == ZS_OK) return ZS_OK;
  if (zs__error_body()[0] == '\0')
    return zs__error(st, "layer %d (unit '%s') %s returned %s", io->layer,
                     d->m->units[io->unit].name, what, zs_status_string(st));
  return zs__error_prefix(st, "layer %d (unit '%s') %s: ", io->layer,
                          d->m->units[io->unit].name, what);
}

/* A callback that fails on one rank must not hang the others: the failing
 * rank keeps issuing the step's collectives (gathers, releases, gradient
 * reductions) without calling further callbacks, and every rank agrees on
 * the outcome at the end of the pass (one small all-reduce), so the others
 * return ZS_ERR_REMOTE naming the rank. Engine errors (COMM, TIMEOUT,
 * OUT_OF_MEMORY in a gather) stop the pass at once: they are collective
 * failures already, or the rank cannot go on. */
static zs_status zs__driver_agree(zs_driver* d, zs_status engine,
                                  zs_status callback, const char* what) {
  zs_status st = engine != ZS_OK
                     ? engine
                     : zs__comm_agree(d->m->ctx->comm, callback, what);
  /* A failed training pass left this micro-batch's gradients partial (the
   * layers before the failure) or its forward unfinished: zs_step refuses
   * until zs_step_discard drops them (as after a mismatch), on every rank
   * alike, since the outcome was agreed. */
  if (st != ZS_OK && !d->m->eval) {
    d->m->must_discard = 1;
    snprintf(d->m->must_discard_msg, sizeof d->m->must_discard_msg,
             "%s failed in this micro-batch", what);
  }
  return st;
}

zs_status zs_driver_forward(zs_driver* d) {
  ZS__DRIVER_LIVE(d, "zs_driver_forward");
  if (!d->m->finalized)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_driver_forward: call zs_model_finalize first");
  d->forwarded = 0;
  zs_status st = zs__driver_alloc(d);   /* engine status */
  zs_status cb = ZS_OK;                 /* first callback error */
  for (int l = 0; l < d->n && st == ZS_OK; l++) {
    const int unit = d->layers[l].unit;
    st = zs_unit_gather(d->m, unit);
    if (st != ZS_OK) break;
    if (cb == ZS_OK) {
      zs_layer_io io = zs__driver_io(d, l);
      cb = zs__driver_call(d, d->layers[l].forward, &io, "forward");
    }
    st = zs_unit_release(d->m, unit);
  }
  st = zs__driver_agree(d, st, cb, "zs_driver_forward");
  /* (in eval mode there is no backward to follow) */
  d->forwarded = st == ZS_OK && !d->m->eval;
  return st;
}

zs_status zs_driver_backward(zs_driver* d) {
  ZS__DRIVER_LIVE(d, "zs_driver_backward");
  /* Local, as every rank runs the same control flow: the backward reads
   * the outputs and scratch of this micro-batch's forward, once. */
  if (!d->forwarded)
    return zs__error(ZS_ERR_INVALID_STATE,
                     "zs_driver_backward: no zs_driver_forward since the last "
                     "backward (a backward needs its micro-batch's forward, "
                     "in training mode, and runs once per forward)");
  d->forwarded = 0;
  zs_status st = zs__driver_alloc(d);
  if (st != ZS_OK) return st;
  zs__device* dev = d->m->ctx->device;
  zs_status cb = ZS_OK;
  int cur = 0; /* grad[cur]: d loss / d output of the current layer */
  st = dev->ops->memset(dev, d->grad[cur], 0, d->grad_bytes, NULL);
  for (int l = d->n - 1; l >= 0 && st == ZS_OK; l--) {
    const int unit = d->layers[l].unit;
    /* Nothing to recompute for the last layer (its scratch is intact) or a
     * layer without internal activations (its output is kept). */
    const int recompute =
        d->checkpoint && l != d->n - 1 && d->layers[l].scratch_bytes > 0;
    const int gather =
        recompute || !(d->layers[l].flags & ZS_LAYER_BACKWARD_NO_PARAMS);
    if (gather) st = zs_unit_gather(d->m, unit);
    if (st != ZS_OK) break;
    zs_layer_io io = zs__driver_io(d, l);
    st = zs_unit_grad_acquire(d->m, unit);
    if (st == ZS_OK && cb == ZS_OK && recompute && d->verify)
      st = dev->ops->copy(dev, d->kept[0], d->outputs[l],
                          d->layers[l].output_bytes, NULL);
    if (st == ZS_OK && cb == ZS_OK && recompute) {
      io.recompute = 1;
      cb = zs__driver_call(d, d->layers[l].forward, &io, "recomputed forward");
      io.recompute = 0;
      if (cb == ZS_OK && d->verify) {
        /* (a difference is the layer's error; a copy's failure the
         * engine's) */
        const zs_status v = zs__driver_verify(d, l);
        if (v == ZS_ERR_MISMATCH) cb = v;
        else st = v;
      }
    }
    const size_t in_bytes = l == 0 ? d->input_bytes : d->layers[l - 1].output_bytes;
    if (st == ZS_OK) st = dev->ops->memset(dev, d->grad[1 - cur], 0, in_bytes, NULL);
    io.grad_output = d->grad[cur];
    io.grad_input = d->grad[1 - cur];
    if (st == ZS_OK && cb == ZS_OK)
      cb = zs__driver_call(d, d->layers[l].backward, &io, "backward");
    if (d->m->units[unit].user_grad_open) {
      zs_status s2 = zs_unit_grad_release(d->m, unit);
      if (st == ZS_OK) st = s2;
    }
    zs_status s2 = gather ? zs_unit_release(d->m, unit) : ZS_OK;
    if (st == ZS_OK) st = s2;
    cur = 1 - cur;
  }
  return zs__driver_agree(d, st, cb, "zs_driver_backward");
}
