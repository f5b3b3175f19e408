/*
 * cuda_plugin.c — the CUDA plugin's entry point (runtime/comm/comm_cuda.h):
 * libzeroshard_cuda.so exports zs_cuda_plugin_open and nothing else. It
 * keeps the library's table (cuda_shim.c calls through it) and hands back
 * the device backend (runtime/device/device_cuda.c) and the NCCL
 * communicator (runtime/comm/comm_nccl.c).
 */
#include "runtime/cuda/cuda_plugin.h"

#include <stddef.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/device/device_cuda.h"

#ifndef ZS_CUDA_ARCHS
#define ZS_CUDA_ARCHS "?"
#endif

const zs__cuda_host* zs__cuda_host_table;

static const zs__cuda_plugin zs__plugin = {
    .size = sizeof(zs__cuda_plugin),
    .abi = ZS__CUDA_PLUGIN_ABI,
    .device_create = zs__device_cuda_create,
    .comm_create = zs__comm_nccl_create,
    .archs = ZS_CUDA_ARCHS,
    .comm_create_staged = zs__comm_staged_create,
};

__attribute__((visibility("default"))) zs_status zs_cuda_plugin_open(
    const zs__cuda_host* host, const zs__cuda_plugin** out);
zs_status zs_cuda_plugin_open(const zs__cuda_host* host,
                              const zs__cuda_plugin** out) {
  if (host == NULL || out == NULL) return ZS_ERR_INVALID_ARGUMENT;
  if (host->abi != ZS__CUDA_PLUGIN_ABI || host->size < sizeof(zs__cuda_host)) {
    /* a library of another release: its error function, if its table
     * reaches that far, says so */
    const int can_say = host->size >= offsetof(zs__cuda_host, error) +
                                           sizeof(host->error) &&
                        host->error != NULL;
    if (!can_say) return ZS_ERR_UNSUPPORTED;
    return host->error(ZS_ERR_UNSUPPORTED,
                       "the CUDA plugin is of another release (plugin ABI "
                       "%d, table %zu bytes; the library's: %u, %zu): install "
                       "the plugin that came with the library",
                       ZS__CUDA_PLUGIN_ABI, sizeof(zs__cuda_host), host->abi,
                       host->size);
  }
  zs__cuda_host_table = host;
  *out = &zs__plugin;
  return ZS_OK;
}
