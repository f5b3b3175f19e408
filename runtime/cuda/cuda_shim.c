/*
 * cuda_shim.c — the library internals the CUDA plugin's code calls
 * (device_cuda.c, comm_nccl.c, the kernels' launchers), defined inside
 * the plugin over the table the library handed to zs_cuda_plugin_open,
 * so the library exports none of them (docs/cuda.md, "The plugin").
 * Linked only into the plugin's shared library and archive, whose other
 * symbols are all local; a program that builds the plugin's sources in
 * with the library's own objects (//runtime/cuda:cuda_static) calls the
 * originals instead.
 */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/cuda/cuda_plugin.h"

#define ZS__SHIM_MSG 2048

zs_status zs__error(zs_status status, const char* fmt, ...) {
  char text[ZS__SHIM_MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  return zs__cuda_host_table->error(status, "%s", text);
}

zs_status zs__error_prefix(zs_status status, const char* fmt, ...) {
  char text[ZS__SHIM_MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  return zs__cuda_host_table->error_prefix(status, "%s", text);
}

void zs__log(int level, const char* fmt, ...) {
  char text[ZS__SHIM_MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  zs__cuda_host_table->log(level, "%s", text);
}

size_t zs_dtype_size(zs_dtype dtype) {
  return zs__cuda_host_table->dtype_size(dtype);
}

const char* zs_dtype_name(zs_dtype dtype) {
  return zs__cuda_host_table->dtype_name(dtype);
}

zs_status zs__comm_agree(zs__comm* c, zs_status local, const char* what) {
  return zs__cuda_host_table->comm_agree(c, local, what);
}

zs_status zs__comm_all_gather(zs__comm* c, zs__coll_tag tag, const void* send,
                              void* recv, size_t count, zs_dtype dtype) {
  return zs__cuda_host_table->comm_all_gather(c, tag, send, recv, count,
                                              dtype);
}

zs_status zs__comm_broadcast(zs__comm* c, zs__coll_tag tag, void* buf,
                             size_t count, zs_dtype dtype, int root) {
  return zs__cuda_host_table->comm_broadcast(c, tag, buf, count, dtype, root);
}

void zs__comm_free(const zs__comm* c, void* p) {
  zs__cuda_host_table->comm_free(c, p);
}

zs__adam_scalars zs__adam_scalars_make(const zs_adam_hparams* hp,
                                       int64_t step) {
  return zs__cuda_host_table->adam_scalars_make(hp, step);
}

zs__sgd_scalars zs__sgd_scalars_make(const zs_sgd_hparams* hp) {
  return zs__cuda_host_table->sgd_scalars_make(hp);
}

const char* zs_last_error(void) { return zs__cuda_host_table->last_error(); }

void zs__hb_on_lost(zs__heartbeat* hb,
                    void (*fn)(void* arg, int rank, const char* why),
                    void* arg) {
  zs__cuda_host_table->hb_on_lost(hb, fn, arg);
}
