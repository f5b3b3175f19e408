/*
 * zs_env.c — `zs env`: what a bug report needs, as DeepSpeed's ds_report:
 * ZeroShard's version, the libraries it runs on (MPI, hwloc, libnuma,
 * liburing, cJSON, xxHash: each version and the file loaded), io_uring,
 * NUMA nodes and cores, and whether the CUDA backend can run (driver,
 * runtime, NCCL, GPUs) and for which GPU architectures its kernels are
 * compiled (ZS_CUDA_ARCHS: runtime/defs.bzl's CUDA_ARCHS, given by the
 * build). The CUDA libraries are looked up with dlopen, so
 * this runs, and says what is missing, on machines without them.
 *
 *   zs env [--help]
 * Exit: 0 (what is missing is reported, not an error); 2 on a usage error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <hwloc.h>
#include <liburing.h>
#include <mpi.h>
#include <numa.h>
#include <xxhash.h>
#include <zeroshard.h>

static const char kUsage[] =
    "usage: zs env\n"
    "  Prints ZeroShard's version, the versions and files of the libraries\n"
    "  it uses, io_uring, NUMA nodes, and whether the CUDA backend can run\n"
    "  (driver, runtime, NCCL, GPUs): what a bug report needs.\n";

/* The file a loaded library came from (its real name carries the
 * version for libraries without a version call), or "" if none matches. */
typedef struct {
  const char* stem;
  char path[PATH_MAX];
} lib_query;

static int find_lib(struct dl_phdr_info* info, size_t size, void* arg) {
  (void)size;
  lib_query* q = (lib_query*)arg;
  const char* slash = strrchr(info->dlpi_name, '/');
  const char* base = slash ? slash + 1 : info->dlpi_name;
  if (strncmp(base, q->stem, strlen(q->stem)) != 0) return 0;
  if (realpath(info->dlpi_name, q->path) == NULL)
    snprintf(q->path, sizeof q->path, "%s", info->dlpi_name);
  return 1;
}

static const char* loaded_from(const char* stem) {
  static lib_query q;
  q.stem = stem;
  q.path[0] = '\0';
  dl_iterate_phdr(find_lib, &q);
  return q.path[0] ? q.path : "(linked statically)";
}

static void row(const char* what, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void row(const char* what, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("  %-16s ", what);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

/* The CUDA driver API, through dlopen (types as in cuda.h). */
typedef int (*cu_int_fn)(int*);
typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_get_fn)(int*, int);
typedef int (*cu_name_fn)(char*, int, int);
typedef int (*cu_mem_fn)(size_t*, int);
typedef int (*cu_attr_fn)(int*, int, int);

static int cuda_report(void) {
  int gpus = -1;
  void* drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (drv == NULL) {
    row("CUDA driver", "not found (libcuda.so.1: %s)", dlerror());
  } else {
    cu_init_fn init = (cu_init_fn)dlsym(drv, "cuInit");
    cu_int_fn version = (cu_int_fn)dlsym(drv, "cuDriverGetVersion");
    cu_int_fn count = (cu_int_fn)dlsym(drv, "cuDeviceGetCount");
    cu_get_fn get = (cu_get_fn)dlsym(drv, "cuDeviceGet");
    cu_name_fn name = (cu_name_fn)dlsym(drv, "cuDeviceGetName");
    cu_mem_fn mem = (cu_mem_fn)dlsym(drv, "cuDeviceTotalMem_v2");
    cu_attr_fn attr = (cu_attr_fn)dlsym(drv, "cuDeviceGetAttribute");
    int v = 0, rc;
    if (init && version && count && get && name && mem && attr) {
      version(&v);
      row("CUDA driver", "%d.%d (%s)", v / 1000, v % 1000 / 10,
          loaded_from("libcuda.so"));
      if ((rc = init(0)) != 0) {
        row("GPUs", "none usable (cuInit: CUDA error %d)", rc);
        gpus = 0;
      } else if (count(&gpus) == 0) {
        row("GPUs", "%d", gpus);
        for (int i = 0; i < gpus; i++) {
          int dev = 0, major = 0, minor = 0;
          char nm[256] = "?";
          size_t bytes = 0;
          get(&dev, i);
          name(nm, (int)sizeof nm, dev);
          mem(&bytes, dev);
          attr(&major, 75, dev); /* COMPUTE_CAPABILITY_MAJOR */
          attr(&minor, 76, dev); /* COMPUTE_CAPABILITY_MINOR */
          printf("    %d: %s, sm_%d%d, %.1f GiB\n", i, nm, major, minor,
                 bytes / 1073741824.0);
        }
      }
    } else {
      row("CUDA driver", "libcuda.so.1 lacks the driver API (%s)",
          loaded_from("libcuda.so"));
    }
  }
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  if (rt == NULL) rt = dlopen("/usr/local/cuda/lib64/libcudart.so.13",
                              RTLD_NOW | RTLD_LOCAL);
  if (rt == NULL) {
    row("CUDA runtime", "not found (libcudart.so.13)");
  } else {
    cu_int_fn rtv = (cu_int_fn)dlsym(rt, "cudaRuntimeGetVersion");
    int v = 0;
    if (rtv) rtv(&v);
    row("CUDA runtime", "%d.%d (%s)", v / 1000, v % 1000 / 10,
        loaded_from("libcudart.so"));
  }
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL)
    nccl = dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL) {
    row("NCCL", "not found (libnccl.so.2)");
  } else {
    cu_int_fn ncv = (cu_int_fn)dlsym(nccl, "ncclGetVersion");
    int v = 0;
    if (ncv) ncv(&v);
    row("NCCL", "%d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100,
        loaded_from("libnccl.so"));
  }
  return (drv != NULL && rt != NULL && gpus > 0) ? gpus : 0;
}

/* The version of the libzeroshard.so installed beside this program
 * (PREFIX/libexec/zeroshard/zs-env -> PREFIX/lib), if there is one. */
static void installed_library(void) {
  char exe[PATH_MAX], lib[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = '\0';
  char* slash = strrchr(exe, '/');
  if (slash == NULL) return;
  *slash = '\0';
  snprintf(lib, sizeof lib, "%s/../../lib/libzeroshard.so.%d", exe,
           ZS_VERSION_MAJOR);
  if (access(lib, F_OK) != 0) return; /* a source tree's build */
  char real[PATH_MAX];
  if (realpath(lib, real) == NULL) snprintf(real, sizeof real, "%.4000s", lib);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    row("installed", "%s does not load: %s", real, dlerror());
    return;
  }
  const char* (*version)(void) =
      (const char* (*)(void))dlsym(h, "zs_version_string");
  row("installed", "%s (%s)", version ? version() : "?", real);
  /* the CUDA plugin beside it (docs/cuda.md, "The plugin") */
  snprintf(lib, sizeof lib, "%s/../../lib/libzeroshard_cuda.so", exe);
  if (realpath(lib, real) == NULL) {
    row("cuda plugin", "none beside the library (%s)", lib);
    return;
  }
  void* p = dlopen(real, RTLD_NOW | RTLD_LOCAL);
  if (p == NULL)
    row("cuda plugin", "%s does not load: %s", real, dlerror());
  else
    row("cuda plugin", "%s loads", real);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(kUsage, stdout);
      return 0;
    }
    fprintf(stderr, "zs env: unexpected argument '%s'\n%s", argv[i], kUsage);
    return 2;
  }
  printf("ZeroShard environment\n");
  row("ZeroShard", "%s (this program's), header %d.%d.%d",
      zs_version_string(), ZS_VERSION_MAJOR, ZS_VERSION_MINOR,
      ZS_VERSION_PATCH);
  installed_library();
  row("compiler", "%s", __VERSION__);

  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len); /* callable before MPI_Init */
  char* nl = strchr(mpi, '\n');
  if (nl) *nl = '\0';
  row("MPI", "%s (%s)", mpi, loaded_from("libmpi.so"));
  unsigned hv = hwloc_get_api_version();
  row("hwloc", "API %u.%u.%u (%s)", hv >> 16, (hv >> 8) & 0xff, hv & 0xff,
      loaded_from("libhwloc.so"));
  row("cJSON", "%s (%s)", cJSON_Version(), loaded_from("libcjson.so"));
  unsigned xv = XXH_versionNumber();
  row("xxHash", "%u.%u.%u (%s)", xv / 10000, xv / 100 % 100, xv % 100,
      loaded_from("libxxhash.so"));
  row("liburing", "%s", loaded_from("liburing.so"));
  struct io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    row("io_uring", "available");
  } else {
    row("io_uring", "not available (io_uring_queue_init: %s): NVMe offload "
        "uses its thread pool", strerror(-rc));
  }
  if (numa_available() < 0)
    row("NUMA", "not available (libnuma: %s)", loaded_from("libnuma.so"));
  else
    row("NUMA", "%d node(s), libnuma API %d (%s)", numa_num_configured_nodes(),
        LIBNUMA_API_VERSION, loaded_from("libnuma.so"));
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) == 0 && hwloc_topology_load(topo) == 0) {
    row("CPU", "%d package(s), %d core(s), %d hardware thread(s)",
        hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE),
        hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE),
        hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
    hwloc_topology_destroy(topo);
  }
  const int gpus = cuda_report();
  row("CUDA code", "%s", ZS_CUDA_ARCHS);
  printf("backends\n");
  row("host", "yes");
  row("cuda", "%s", gpus > 0 ? "yes" :
      "no (needs the CUDA driver, libcudart.so.13 and a GPU: see above)");
  row("nccl", "used by the cuda backend at more than one rank");
  return 0;
}
