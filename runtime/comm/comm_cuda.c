/*
 * comm_cuda.c — loads the CUDA plugin (comm_cuda.h): the library's side.
 * dlopen of libzeroshard_cuda.so (RTLD_LOCAL: its symbols stay its own),
 * the host table handed over, the plugin's table checked, its device
 * backend registered. A program that links the plugin's archive instead
 * (libzeroshard_cuda.a, or //runtime/cuda:cuda_static in this tree)
 * defines zs_cuda_plugin_open itself, found through a weak reference.
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The plugin linked into the program, if it is (weak: NULL otherwise). */
extern zs_status zs_cuda_plugin_open(const zs__cuda_host* host,
                                     const zs__cuda_plugin** out)
    __attribute__((weak));

static const zs__cuda_host zs__host = {
    .size = sizeof(zs__cuda_host),
    .abi = ZS__CUDA_PLUGIN_ABI,
    .error = zs__error,
    .error_prefix = zs__error_prefix,
    .log = zs__log,
    .dtype_size = zs_dtype_size,
    .dtype_name = zs_dtype_name,
    .comm_agree = zs__comm_agree,
    .comm_all_gather = zs__comm_all_gather,
    .comm_broadcast = zs__comm_broadcast,
    .comm_free = zs__comm_free,
    .adam_scalars_make = zs__adam_scalars_make,
    .sgd_scalars_make = zs__sgd_scalars_make,
    .last_error = zs_last_error,
    .hb_on_lost = zs__hb_on_lost,
};

static pthread_mutex_t zs__cuda_mu = PTHREAD_MUTEX_INITIALIZER;
static int zs__cuda_tried;
static zs_status zs__cuda_status;
static char zs__cuda_msg[1024];
static const zs__cuda_plugin* zs__cuda;

/* The directory of the file (library or program) this code is in. */
static void zs__own_dir(char* dir, size_t cap) {
  Dl_info info;
  dir[0] = '\0';
  if (dladdr((void*)zs__own_dir, &info) == 0 || info.dli_fname == NULL) return;
  char real[PATH_MAX];
  if (realpath(info.dli_fname, real) == NULL) return;
  char* slash = strrchr(real, '/');
  if (slash == NULL) return;
  *slash = '\0';
  snprintf(dir, cap, "%s", real);
}

/* dlopen of the plugin; its open function, or NULL with the reason. */
static zs__cuda_plugin_open_fn zs__cuda_dlopen(char* why, size_t cap) {
  const char* env = getenv("ZS_CUDA_PLUGIN");
  char beside[PATH_MAX + 32];
  char dir[PATH_MAX];
  void* h = NULL;
  if (env != NULL && env[0] != '\0') {
    h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      snprintf(why, cap, "ZS_CUDA_PLUGIN=%.600s does not load: %.600s", env,
               dlerror());
      return NULL;
    }
  } else {
    zs__own_dir(dir, sizeof dir);
    snprintf(beside, sizeof beside, "%s/libzeroshard_cuda.so", dir);
    if (dir[0] != '\0' && access(beside, F_OK) == 0) {
      h = dlopen(beside, RTLD_NOW | RTLD_LOCAL);
      if (h == NULL) {
        /* found but not loadable: its reason names the library missing
         * (libcudart.so.13, ...) */
        snprintf(why, cap, "%.700s does not load: %.700s", beside, dlerror());
        return NULL;
      }
    } else {
      h = dlopen("libzeroshard_cuda.so", RTLD_NOW | RTLD_LOCAL);
      if (h == NULL) {
        snprintf(why, cap,
                 "the CUDA plugin libzeroshard_cuda.so was not found (not "
                 "beside %.600s, not on the dynamic linker's path: %.600s); set "
                 "ZS_CUDA_PLUGIN to its path, or install it with the "
                 "library (docs/install.md)",
                 dir[0] ? dir : "this program", dlerror());
        return NULL;
      }
    }
  }
  zs__cuda_plugin_open_fn open =
      (zs__cuda_plugin_open_fn)dlsym(h, "zs_cuda_plugin_open");
  if (open == NULL) {
    snprintf(why, cap, "the CUDA plugin has no zs_cuda_plugin_open: %s",
             dlerror());
    dlclose(h);
    return NULL;
  }
  return open; /* kept loaded for the life of the process */
}

static zs_status zs__cuda_load_locked(void) {
  char why[1536];
  zs__cuda_plugin_open_fn open = zs_cuda_plugin_open;
  if (open == NULL && (open = zs__cuda_dlopen(why, sizeof why)) == NULL)
    return zs__error(ZS_ERR_UNSUPPORTED, "ZS_DEVICE_CUDA: %s", why);
  const zs__cuda_plugin* p = NULL;
  const zs_status st = open(&zs__host, &p);
  if (st != ZS_OK) return st;
  if (p == NULL || p->abi != ZS__CUDA_PLUGIN_ABI ||
      p->size < sizeof(zs__cuda_plugin) || p->device_create == NULL ||
      p->comm_create == NULL || p->comm_create_staged == NULL)
    return zs__error(ZS_ERR_UNSUPPORTED,
                     "ZS_DEVICE_CUDA: the CUDA plugin is of another release "
                     "(plugin ABI %u, table %zu bytes; this library's: %d, "
                     "%zu): install the plugin that came with this library",
                     p ? p->abi : 0u, p ? p->size : (size_t)0,
                     ZS__CUDA_PLUGIN_ABI, sizeof(zs__cuda_plugin));
  zs__device_register(ZS_DEVICE_CUDA, p->device_create);
  zs__cuda = p;
  zs__log(ZS_LOG_DEBUG, "CUDA plugin loaded (kernels for %s)",
          p->archs ? p->archs : "?");
  return ZS_OK;
}

zs_status zs__cuda_load(const zs__cuda_plugin** out) {
  pthread_mutex_lock(&zs__cuda_mu);
  if (!zs__cuda_tried) {
    zs__cuda_tried = 1;
    zs__cuda_status = zs__cuda_load_locked();
    if (zs__cuda_status != ZS_OK)
      snprintf(zs__cuda_msg, sizeof zs__cuda_msg, "%s", zs__error_body());
  }
  const zs_status st = zs__cuda_status;
  pthread_mutex_unlock(&zs__cuda_mu);
  if (st != ZS_OK) return zs__error(st, "%s", zs__cuda_msg);
  if (out != NULL) *out = zs__cuda;
  return ZS_OK;
}

zs_status zs__cuda_comm_create(zs__comm* host, zs__comm* stage,
                               zs__comm** out) {
  const zs__cuda_plugin* p = NULL;
  zs_status st = zs__cuda_load(&p);
  /* agreed: a rank whose plugin does not load (another node's install)
   * fails every rank at once, instead of leaving them in NCCL's bootstrap */
  st = zs__comm_agree(host, st, "loading the CUDA plugin");
  if (st != ZS_OK) {
    zs__comm_destroy(host);
    if (stage != NULL) zs__comm_destroy(stage);
    return st;
  }
  st = stage != NULL ? p->comm_create_staged(host, stage, out)
                     : p->comm_create(host, out);
  /* ZS_DEVICE_CHAIN, read once per communicator (checked for its values
   * with several ranks: context_mpi.c) */
  const char* chain = getenv("ZS_DEVICE_CHAIN");
  if (st == ZS_OK) (*out)->chain = chain != NULL && strcmp(chain, "1") == 0;
  return st;
}

/* Any CUDA device asked for (a context, or a test creating one directly)
 * loads the plugin first (device.c calls this through zs__device_loader). */
static zs_status zs__cuda_load_device(void) { return zs__cuda_load(NULL); }

__attribute__((constructor)) static void zs__cuda_loader_install(void) {
  zs__device_loader = zs__cuda_load_device;
}
