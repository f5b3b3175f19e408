/*
 * device.c — what every device backend shares: the factory (the host
 * backend, or the CUDA plugin's, loaded on first use) and the accounted
 * allocations over a backend's alloc/free.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/device/device.h"

/* The backends other than the host's, by kind, as they registered. */
static zs__device_factory zs__factories[ZS_DEVICE_CUDA + 1];
zs_status (*zs__device_loader)(void);

void zs__device_register(zs_device_kind kind, zs__device_factory create) {
  if ((int)kind > ZS_DEVICE_HOST && (int)kind <= ZS_DEVICE_CUDA)
    zs__factories[kind] = create;
}

zs_status zs__device_create(zs_device_kind kind, zs__accounting* acct,
                            int local_rank, int local_size, zs__device** out) {
  if (kind == ZS_DEVICE_HOST) return zs__device_host_create(acct, out);
  if (kind == ZS_DEVICE_CUDA && zs__factories[kind] == NULL) {
    if (zs__device_loader == NULL)
      return zs__error(ZS_ERR_UNSUPPORTED,
                       "device kind %d (CUDA): this program has no CUDA "
                       "plugin loader (it links the device layer without "
                       "//runtime/comm:comm_cuda, which //runtime:zeroshard "
                       "includes)", (int)kind);
    const zs_status st = zs__device_loader(); /* registers the factory */
    if (st != ZS_OK) return st;
  }
  if (kind == ZS_DEVICE_CUDA && zs__factories[kind] != NULL)
    return zs__factories[kind](acct, local_rank, local_size, out);
  return zs__error(ZS_ERR_UNSUPPORTED,
                   "device kind %d: unknown (0: host, 1: CUDA)", (int)kind);
}

void zs__device_destroy(zs__device* dev) {
  if (dev != NULL) dev->ops->destroy(dev);
}

/* ==== Accounted allocation =============================================== */

zs_status (*zs__dev_alloc_fault)(zs_mem_category, size_t, const char*);

zs_status zs__dev_alloc(zs__device* dev, zs_mem_category category,
                        size_t bytes, int zero, const char* label,
                        void** out) {
  void* p = NULL;
  zs_status st = zs__dev_alloc_fault != NULL
                     ? zs__dev_alloc_fault(category, bytes, label)
                     : ZS_OK;
  if (st == ZS_OK) st = dev->ops->alloc(dev, bytes, &p);
  if (st != ZS_OK) {
    /* What this rank holds at this moment, by category, so the error says
     * where the memory went (the backend's own reason first). */
    char why[512], report[600];
    snprintf(why, sizeof why, "%s", zs__error_body());
    zs__accounting_report(dev->acct, report, sizeof report);
    return zs__error(st, "cannot allocate %zu bytes of %s for %s on %s (%s; "
                     "%s)", bytes, zs_mem_category_name(category),
                     label != NULL ? label : "?", dev->ops->name, why, report);
  }
  if (zero && bytes > 0) st = dev->ops->memset(dev, p, 0, bytes, NULL);
  if (st == ZS_OK) st = zs__accounting_add(dev->acct, ZS__OWNER_RUNTIME, category, p,
                                            bytes, label);
  if (st != ZS_OK) {
    dev->ops->free(dev, p);
    return st;
  }
  *out = p;
  return ZS_OK;
}

void zs__dev_free(zs__device* dev, void* ptr) {
  if (ptr == NULL) return;
  if (zs__accounting_remove(dev->acct, ZS__OWNER_RUNTIME, ptr, NULL, NULL) !=
      ZS_OK)
    zs__log(ZS_LOG_ERROR, "internal: freeing untracked device pointer %p", ptr);
  if (dev->hold_memory == NULL || !*dev->hold_memory) dev->ops->free(dev, ptr);
}
