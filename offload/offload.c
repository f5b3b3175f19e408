/*
 * offload.c — CPU offload: NUMA placement (hwloc), node-bound host memory
 * (libnuma), optional page-locking, and a pool of optimizer worker threads
 * bound to the chosen node's cores (offload.h, docs/offload.md).
 */
#define _GNU_SOURCE
#include "offload/offload.h"

#include <errno.h>
#include <numa.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { ZS__HUGE_PAGE = 2 << 20 }; /* bytes: x86-64 and arm64 (4 KiB base pages) */

int (*zs__offload_mlock_hook)(const void* addr, size_t len) = NULL;

/* ==== Placement ============================================================ */

static void zs__node_list(hwloc_topology_t topo, char* buf, size_t cap) {
  size_t k = 0;
  buf[0] = '\0';
  hwloc_obj_t n = NULL;
  while ((n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) != NULL &&
         k + 16 < cap)
    k += (size_t)snprintf(buf + k, cap - k, "%s%u", k ? ", " : "", n->os_index);
}

zs_status zs__offload_choose_node(hwloc_topology_t topo,
                                  hwloc_const_cpuset_t binding,
                                  const char* pci_busid, int requested,
                                  int* node, char* why, size_t why_cap) {
  char nodes[256];
  zs__node_list(topo, nodes, sizeof nodes);
  if (requested == ZS_OFFLOAD_NUMA_INTERLEAVE) {
    *node = -1;
    snprintf(why, why_cap, "interleaved over NUMA nodes %s (as asked)", nodes);
    return ZS_OK;
  }
  if (requested >= 0) {
    if (hwloc_get_numanode_obj_by_os_index(topo, (unsigned)requested) == NULL)
      return zs__error(ZS_ERR_INVALID_ARGUMENT,
                       "offload_optimizer.numa: NUMA node %d does not exist "
                       "(this machine has nodes %s)", requested, nodes);
    *node = requested;
    snprintf(why, why_cap, "NUMA node %d (as asked)", requested);
    return ZS_OK;
  }
  ZS_REQUIRE(requested == ZS_OFFLOAD_NUMA_AUTO,
             "offload_optimizer.numa: expected a node >= 0, "
             "ZS_OFFLOAD_NUMA_AUTO (-1) or ZS_OFFLOAD_NUMA_INTERLEAVE (-2), "
             "got %d", requested);
  /* The GPU's node, by PCI locality. */
  if (pci_busid != NULL && pci_busid[0] != '\0') {
    hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(topo, pci_busid);
    hwloc_obj_t anc = dev != NULL ? hwloc_get_non_io_ancestor_obj(topo, dev) : NULL;
    if (anc != NULL && anc->nodeset != NULL && !hwloc_bitmap_iszero(anc->nodeset)) {
      *node = hwloc_bitmap_first(anc->nodeset);
      snprintf(why, why_cap, "NUMA node %d, local to the GPU at %s", *node,
               pci_busid);
      return ZS_OK;
    }
  }
  /* The node holding most of the rank's cores. */
  int best = -1, best_count = 0;
  hwloc_obj_t n = NULL;
  hwloc_bitmap_t both = hwloc_bitmap_alloc();
  while (binding != NULL &&
         (n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) != NULL) {
    hwloc_bitmap_and(both, n->cpuset, binding);
    const int c = hwloc_bitmap_weight(both);
    if (c > best_count) {
      best_count = c;
      best = (int)n->os_index;
    }
  }
  hwloc_bitmap_free(both);
  if (best >= 0) {
    *node = best;
    snprintf(why, why_cap, "NUMA node %d, holding %d of the rank's cores", best,
             best_count);
    return ZS_OK;
  }
  hwloc_obj_t first = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, NULL);
  *node = first != NULL ? (int)first->os_index : 0;
  snprintf(why, why_cap, "NUMA node %d (no GPU or binding to go by)", *node);
  return ZS_OK;
}

/* ==== Workers ============================================================== */

struct zs__offload {
  hwloc_topology_t topo;
  zs__accounting* acct;
  int node;     /* -1: interleaved */
  int pin;      /* page-lock allocations */
  int pin_warned;
  int nworkers;
  pthread_t* threads;
  pthread_mutex_t lock;
  pthread_cond_t go, done;
  zs_status (*fn)(void*, int, int);
  void* arg;
  unsigned generation;
  int pending;
  int quit;
  zs_status first_error;
  char first_message[512]; /* the failing worker's zs_last_error() */
  uint64_t runs, elements;
};

typedef struct zs__worker_arg {
  zs__offload* o;
  int id;
  hwloc_cpuset_t cpuset;
} zs__worker_arg;

static void* zs__worker_main(void* p) {
  zs__worker_arg* a = (zs__worker_arg*)p;
  zs__offload* o = a->o;
  const int id = a->id;
  if (a->cpuset != NULL) {
    (void)hwloc_set_cpubind(o->topo, a->cpuset, HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(a->cpuset);
  }
  free(a);
  unsigned seen = 0;
  for (;;) {
    pthread_mutex_lock(&o->lock);
    while (!o->quit && o->generation == seen) pthread_cond_wait(&o->go, &o->lock);
    if (o->quit) {
      pthread_mutex_unlock(&o->lock);
      return NULL;
    }
    seen = o->generation;
    zs_status (*fn)(void*, int, int) = o->fn;
    void* arg = o->arg;
    pthread_mutex_unlock(&o->lock);
    zs_status st = fn(arg, id, o->nworkers);
    pthread_mutex_lock(&o->lock);
    if (st != ZS_OK && o->first_error == ZS_OK) {
      o->first_error = st;
      /* the message lives in this thread's error slot: carry it over */
      snprintf(o->first_message, sizeof o->first_message, "%s",
               zs_last_error());
    }
    if (--o->pending == 0) pthread_cond_signal(&o->done);
    pthread_mutex_unlock(&o->lock);
  }
}

zs_status zs__offload_run(zs__offload* o, zs_status (*fn)(void*, int, int),
                          void* arg) {
  pthread_mutex_lock(&o->lock);
  o->fn = fn;
  o->arg = arg;
  o->pending = o->nworkers;
  o->first_error = ZS_OK;
  o->generation++;
  o->runs++;
  pthread_cond_broadcast(&o->go);
  /* a warning every minute, so that a stuck worker is never a silent hang */
  int waited = 0;
  while (o->pending > 0) {
    if (zs__cond_wait_s(&o->done, &o->lock, 60) == ETIMEDOUT) {
      waited += 60;
      zs__log(ZS_LOG_WARN, "offload: %d of %d worker threads still running "
              "after %d s", o->pending, o->nworkers, waited);
    }
  }
  zs_status st = o->first_error;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", o->first_message);
  pthread_mutex_unlock(&o->lock);
  if (st != ZS_OK) zs__error(st, "offload worker: %s", msg);
  return st;
}

zs_status zs__offload_create(const zs_config* cfg, int rank,
                             const char* pci_busid, zs__accounting* acct,
                             zs__offload** out) {
  (void)rank;
  *out = NULL;
  zs_status st = ZS_OK;
  zs__offload* o = (zs__offload*)calloc(1, sizeof *o);
  if (o == NULL) return zs__error(ZS_ERR_OUT_OF_MEMORY, "offload");
  o->acct = acct;
  o->pin = cfg->offload_optimizer.pin_memory;
  pthread_mutex_init(&o->lock, NULL);
  pthread_cond_init(&o->go, NULL);
  pthread_cond_init(&o->done, NULL);
  const int gpu = pci_busid != NULL && pci_busid[0] != '\0';
  if (hwloc_topology_init(&o->topo) != 0 ||
      (gpu && hwloc_topology_set_io_types_filter(
                  o->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0) ||
      hwloc_topology_load(o->topo) != 0) {
    free(o);
    return zs__error(ZS_ERR_INTERNAL, "offload: hwloc cannot load the topology");
  }
  hwloc_bitmap_t binding = hwloc_bitmap_alloc();
  if (hwloc_get_cpubind(o->topo, binding, HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(binding, hwloc_topology_get_allowed_cpuset(o->topo));
  char why[256];
  st = zs__offload_choose_node(o->topo, binding, gpu ? pci_busid : NULL,
                               cfg->offload_optimizer.numa, &o->node, why,
                               sizeof why);
  hwloc_bitmap_free(binding);
  if (st != ZS_OK) goto fail;
  /* The node's cores (all allowed cores when interleaving). */
  hwloc_bitmap_t cores = hwloc_bitmap_alloc();
  if (o->node >= 0) {
    hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(o->topo, (unsigned)o->node);
    hwloc_bitmap_and(cores, n->cpuset, hwloc_topology_get_allowed_cpuset(o->topo));
  } else {
    hwloc_bitmap_copy(cores, hwloc_topology_get_allowed_cpuset(o->topo));
  }
  const int ncores = hwloc_get_nbobjs_inside_cpuset_by_type(o->topo, cores,
                                                            HWLOC_OBJ_CORE);
  int want = cfg->offload_optimizer.threads;
  if (want > (ncores > 0 ? ncores : 1)) {
    hwloc_bitmap_free(cores);
    st = zs__error(ZS_ERR_INVALID_ARGUMENT,
                   "offload_optimizer.threads: %d worker threads, but the "
                   "chosen placement (%s) has %d cores", want, why, ncores);
    goto fail;
  }
  if (want <= 0) want = ncores > 0 ? ncores : 1;
  o->nworkers = want;
  o->threads = (pthread_t*)calloc((size_t)want, sizeof *o->threads);
  if (o->threads == NULL) {
    hwloc_bitmap_free(cores);
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "offload workers");
    goto fail;
  }
  for (int i = 0; i < want; i++) {
    zs__worker_arg* a = (zs__worker_arg*)calloc(1, sizeof *a);
    if (a == NULL) {
      st = zs__error(ZS_ERR_OUT_OF_MEMORY, "offload workers");
      break;
    }
    a->o = o;
    a->id = i;
    /* worker i on core i of the node (round robin) */
    hwloc_obj_t core = hwloc_get_obj_inside_cpuset_by_type(
        o->topo, cores, HWLOC_OBJ_CORE, (unsigned)(ncores > 0 ? i % ncores : 0));
    a->cpuset = core != NULL ? hwloc_bitmap_dup(core->cpuset) : NULL;
    if (pthread_create(&o->threads[i], NULL, zs__worker_main, a) != 0) {
      if (a->cpuset) hwloc_bitmap_free(a->cpuset);
      free(a);
      st = zs__error(ZS_ERR_INTERNAL, "offload: cannot start worker %d", i);
      break;
    }
    o->nworkers = i + 1;
  }
  hwloc_bitmap_free(cores);
  if (st != ZS_OK) goto fail;
  zs__log(ZS_LOG_INFO, "offload: host memory on %s; %d worker threads%s", why,
          o->nworkers, o->pin ? ", page-locked" : "");
  *out = o;
  return ZS_OK;
fail:
  zs__offload_destroy(o);
  return st;
}

void zs__offload_destroy(zs__offload* o) {
  if (o == NULL) return;
  if (o->threads != NULL) {
    pthread_mutex_lock(&o->lock);
    o->quit = 1;
    pthread_cond_broadcast(&o->go);
    pthread_mutex_unlock(&o->lock);
    for (int i = 0; i < o->nworkers; i++) pthread_join(o->threads[i], NULL);
    free(o->threads);
  }
  if (o->topo != NULL) hwloc_topology_destroy(o->topo);
  pthread_cond_destroy(&o->go);
  pthread_cond_destroy(&o->done);
  pthread_mutex_destroy(&o->lock);
  free(o);
}

/* ==== Memory =============================================================== */

zs_status zs__offload_alloc(zs__offload* o, size_t bytes, const char* label,
                            void** out) {
  return zs__offload_alloc_as(o, bytes, label, ZS_MEM_OFFLOAD_HOST, out);
}

zs_status zs__offload_alloc_as(zs__offload* o, size_t bytes, const char* label,
                               zs_mem_category category, void** out) {
  *out = NULL;
  if (bytes == 0) bytes = 1;
  void* p = NULL;
  if (numa_available() >= 0)
    p = o->node >= 0 ? numa_alloc_onnode(bytes, o->node)
                     : numa_alloc_interleaved(bytes);
  else
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
  if (p == NULL || p == MAP_FAILED)
    return zs__error(ZS_ERR_OUT_OF_MEMORY,
                     "offload: %zu bytes of host memory for %s", bytes,
                     label != NULL ? label : "offload");
  /* Transparent huge pages where the kernel gives them on request (THP
   * "madvise" mode, the common default): a 1 MiB direct I/O transfer then
   * pins and maps one page instead of 256. Measured on this project's VM
   * (virtio disk, 16 MiB requests of 1 MiB transfers, queue depth 16, the
   * two kinds of buffer alternating in one run): reads and writes through
   * 4 KiB-page buffers ran at 0.5-0.7 of the speed through huge-page ones.
   * Best effort: a kernel without THP refuses, and the memory stays in
   * small pages. Before the first touch, so that the touch faults in huge
   * pages. */
  if (bytes >= ZS__HUGE_PAGE) (void)madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 0, bytes); /* first touch, under the node's policy */
  if (o->pin) {
    int rc = zs__offload_mlock_hook != NULL ? zs__offload_mlock_hook(p, bytes)
                                            : mlock(p, bytes);
    if (rc != 0 && !o->pin_warned) {
      o->pin_warned = 1;
      zs__log(ZS_LOG_WARN, "offload: page-locking %zu bytes was refused (%s); "
              "continuing with pageable host memory", bytes, strerror(errno));
    }
  }
  zs_status st = zs__accounting_add(o->acct, ZS__OWNER_RUNTIME, category, p,
                                    bytes, label);
  if (st != ZS_OK) {
    numa_available() >= 0 ? numa_free(p, bytes) : (void)munmap(p, bytes);
    return st;
  }
  *out = p;
  return ZS_OK;
}

void zs__offload_free(zs__offload* o, void* p) {
  if (o == NULL || p == NULL) return;
  size_t bytes = 0;
  if (zs__accounting_remove(o->acct, ZS__OWNER_RUNTIME, p, NULL, &bytes) != ZS_OK)
    return;
  /* munlock is implied by unmapping */
  if (numa_available() >= 0) numa_free(p, bytes);
  else munmap(p, bytes);
}

void zs__offload_info(const zs__offload* o, zs_offload_info* out) {
  memset(out, 0, sizeof *out);
  if (o == NULL) return;
  out->enabled = 1;
  out->numa_node = o->node;
  out->workers = o->nworkers;
  out->pinned = o->pin && !o->pin_warned;
  out->steps_on_workers = o->runs;
}
