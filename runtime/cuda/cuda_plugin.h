/*
 * cuda_plugin.h — inside the CUDA plugin: the library's table as
 * zs_cuda_plugin_open received it (cuda_plugin.c), for the forwarders of
 * cuda_shim.c.
 */
#ifndef ZS_RUNTIME_CUDA_PLUGIN_H_
#define ZS_RUNTIME_CUDA_PLUGIN_H_

#include "runtime/comm/comm_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const zs__cuda_host* zs__cuda_host_table;

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CUDA_PLUGIN_H_ */
