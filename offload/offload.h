/*
 * offload.h — CPU offload (docs/offload.md): where host memory goes
 * (hwloc: the NUMA node local to the rank's GPU by PCI locality, or to the
 * cores the rank is bound to), how it is allocated (libnuma: bound to that
 * node or interleaved; page-locked on request) and the optimizer worker
 * threads bound to that node's cores. Algorithm: ZeRO-Offload (Ren et al.,
 * arXiv:2101.06840): fp32 master weights and optimizer states live in host
 * memory and the step runs on the CPU.
 */
#ifndef ZS_OFFLOAD_OFFLOAD_H_
#define ZS_OFFLOAD_OFFLOAD_H_

#include <hwloc.h>
#include <stddef.h>

#include "runtime/core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The NUMA node (OS index) for a rank's host memory. requested: >= 0 a
 * node, ZS_OFFLOAD_NUMA_AUTO or ZS_OFFLOAD_NUMA_INTERLEAVE. Auto: the node
 * of the GPU at pci_busid ("0000:3b:00.0") when given and found; else the
 * node holding most of the cores in `binding` (the rank's CPU binding; the
 * lowest such node on a tie); else node 0. *node = -1 means interleave over
 * all nodes. *why: a sentence for the log. Pure (no allocation outside
 * hwloc bitmaps). Errors: INVALID_ARGUMENT naming a node that does not
 * exist and the nodes that do. */
zs_status zs__offload_choose_node(hwloc_topology_t topo,
                                  hwloc_const_cpuset_t binding,
                                  const char* pci_busid, int requested,
                                  int* node, char* why, size_t why_cap);

/* Test hook: replaces mlock() for page-locking (NULL restores it), so tests
 * running as root can make pinning fail. */
extern int (*zs__offload_mlock_hook)(const void* addr, size_t len);

typedef struct zs__offload zs__offload;

/* Creates the offload state of a context: the topology, the chosen node,
 * the worker threads (threads: 0 = the node's cores; more than the node's
 * cores is an error), and whether memory is pinned. pci_busid: the rank's
 * GPU ("0000:3b:00.0"), whose NUMA node auto placement prefers; NULL or ""
 * without one. Errors: INVALID_ARGUMENT (a node that does not exist, too
 * many threads), OUT_OF_MEMORY, INTERNAL (hwloc). */
zs_status zs__offload_create(const zs_config* cfg, int rank,
                             const char* pci_busid, zs__accounting* acct,
                             zs__offload** out);
void zs__offload_destroy(zs__offload* o);

/* Host memory on the chosen node (zeroed), accounted as offload_host;
 * page-locked if pin_memory (a refused pin is a warning, once, and the
 * memory stays pageable). Errors: OUT_OF_MEMORY. */
zs_status zs__offload_alloc(zs__offload* o, size_t bytes, const char* label,
                            void** out);
/* The same, accounted under `category` (NVMe offload's pinned pool is
 * ZS_MEM_NVME_STAGING). */
zs_status zs__offload_alloc_as(zs__offload* o, size_t bytes, const char* label,
                               zs_mem_category category, void** out);
/* Frees what zs__offload_alloc returned (NULL accepted). */
void zs__offload_free(zs__offload* o, void* p);

/* Runs fn(arg, worker, nworkers) on every worker thread and waits for all;
 * returns the first non-OK status, with that worker's message as the
 * caller's zs_last_error(). Synchronous; not reentrant. */
zs_status zs__offload_run(zs__offload* o,
                          zs_status (*fn)(void* arg, int worker, int nworkers),
                          void* arg);

/* What the public zs_offload_info_get reports. */
void zs__offload_info(const zs__offload* o, zs_offload_info* out);

#ifdef __cplusplus
}
#endif

#endif /* ZS_OFFLOAD_OFFLOAD_H_ */
