/*
 * comm_cuda.h — the CUDA backend as a plugin (docs/cuda.md, "The plugin"):
 * the device backend (runtime/device/device_cuda.c) and the NCCL
 * communicator (runtime/comm/comm_nccl.c) live in libzeroshard_cuda.so,
 * which the library loads the first time something asks for
 * ZS_DEVICE_CUDA, so that a host-only program needs no CUDA library.
 *
 * The two sides meet through two tables, versioned by their size and
 * ZS__CUDA_PLUGIN_ABI: the library hands the plugin what it may call of
 * the library's internals (zs__cuda_host), and the plugin hands back its
 * entry points (zs__cuda_plugin). The plugin exports one symbol,
 * zs_cuda_plugin_open; the library exports none of its internals.
 */
#ifndef ZS_RUNTIME_COMM_CUDA_H_
#define ZS_RUNTIME_COMM_CUDA_H_

#include "optim/optim_scalars.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a table's meaning changes; appending a member changes only
 * its size, which each side checks against what it knows. */
#define ZS__CUDA_PLUGIN_ABI 1

/* The library's internals the plugin calls (runtime/cuda/cuda_shim.c
 * defines the plugin's functions of these names over this table). */
typedef struct zs__cuda_host {
  size_t size; /* sizeof(zs__cuda_host) of the library */
  unsigned int abi;
  __typeof__(&zs__error) error;
  __typeof__(&zs__error_prefix) error_prefix;
  __typeof__(&zs__log) log;
  __typeof__(&zs_dtype_size) dtype_size;
  __typeof__(&zs_dtype_name) dtype_name;
  __typeof__(&zs__comm_agree) comm_agree;
  __typeof__(&zs__comm_all_gather) comm_all_gather;
  __typeof__(&zs__comm_broadcast) comm_broadcast;
  __typeof__(&zs__comm_free) comm_free;
  __typeof__(&zs__adam_scalars_make) adam_scalars_make;
  __typeof__(&zs__sgd_scalars_make) sgd_scalars_make;
  __typeof__(&zs_last_error) last_error; /* (a staged collective's host
                                            function reads its thread's) */
  __typeof__(&zs__hb_on_lost) hb_on_lost; /* (the watchdog listens) */
} zs__cuda_host;

/* What the plugin provides. */
typedef struct zs__cuda_plugin {
  size_t size; /* sizeof(zs__cuda_plugin) of the plugin */
  unsigned int abi;
  zs__device_factory device_create;                     /* device_cuda.c */
  zs_status (*comm_create)(zs__comm* host, zs__comm** out); /* comm_nccl.c */
  const char* archs; /* the GPU architectures its kernels are compiled for */
  /* comm_nccl.c's staged communicator (zs__comm_staged_create) */
  zs_status (*comm_create_staged)(zs__comm* host, zs__comm* stage,
                                  zs__comm** out);
} zs__cuda_plugin;

/* The plugin's one exported symbol: checks host (its size and ABI), keeps
 * it, and gives the plugin's table in *out (static storage). Errors:
 * UNSUPPORTED (an ABI it does not know; the message is written with
 * host->error). */
typedef zs_status (*zs__cuda_plugin_open_fn)(const zs__cuda_host* host,
                                             const zs__cuda_plugin** out);

/* Loads the CUDA plugin once per process (later calls return the first
 * result): a program that links the plugin's archive has it already;
 * otherwise $ZS_CUDA_PLUGIN (a path), else libzeroshard_cuda.so beside the
 * library (or the program) that holds this code, else the dynamic
 * linker's search. Registers its device backend (zs__device_register).
 * Thread-safe. Errors: UNSUPPORTED naming what is missing (the plugin,
 * with where it looked; the CUDA runtime or another library it needs,
 * with dlopen's reason; an ABI mismatch). */
zs_status zs__cuda_load(const zs__cuda_plugin** out);

/* The NCCL communicator over `host` (comm_nccl.h's zs__comm_nccl_create,
 * through the plugin), or with `stage` (not NULL) the staged one
 * (zs__comm_staged_create): loads the plugin first. Collective: the
 * load's result is agreed (a rank whose plugin does not load fails every
 * rank, the others with REMOTE naming it). Takes `host` and `stage` also
 * on failure. */
zs_status zs__cuda_comm_create(zs__comm* host, zs__comm* stage,
                               zs__comm** out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_COMM_CUDA_H_ */
