/*
 * engine_ckpt.c — sharded checkpoints of a model (zeroshard.h,
 * zs_checkpoint_save / zs_checkpoint_load; format in ckpt_format.h,
 * docs/checkpoint.md).
 *
 * Save: every rank writes its shard of every unit (at stage 0 too, so the
 * format is the same at every stage) into a temporary directory, fsyncs it,
 * and rank 0 writes the extras and the metadata, fsyncs, renames the
 * directory into place and then moves the `latest` pointer. With shard
 * groups (hybrid sharding) the first group (ranks 0 .. G-1) writes: the
 * checkpoint is one replica's G rank files, and loads as if G ranks had
 * saved it. A crash at any
 * point leaves the previous checkpoint and the pointer to it intact.
 *
 * Load: every rank reads the metadata, checks it describes this model,
 * verifies the checksums of a share of the files (file i on rank
 * i mod world), and only when every rank agrees reads, for each of its
 * buffers, just the element ranges it holds under the NEW layout (any
 * world size and stage) from the old rank files, tensor by tensor.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "optim/convert.h"
#include "runtime/ckpt/ckpt_format.h"
#include "runtime/engine/engine_nvme_param.h"
#include "runtime/engine/engine_optim.h"
#include "runtime/engine/engine_optim_nvme.h"
#include "runtime/engine/engine_sched.h"
#include "runtime/engine/engine_unit.h"

#define ZS__CKPT_CHUNK ((size_t)1 << 18) /* elements per staging pass */

/* Local preconditions of save and load: between optimizer steps, nothing
 * held, nothing in flight (prefetches dropped on every rank alike). */
static zs_status zs__ckpt_quiet(zs_model* m, const char* fn) {
  zs_status st = zs__quiesce(m);
  if (st == ZS_OK) st = zs__prefetch_drain(m);
  if (st != ZS_OK) return st;
  if (m->micro != 0)
    return zs__error(ZS_ERR_INVALID_STATE, "%s: in the middle of gradient "
                     "accumulation (%d of %d micro-batches done): call it "
                     "after the K-th zs_step", fn, m->micro,
                     m->ctx->config.grad_accum_steps);
  for (int i = 0; i < m->nunits; i++) {
    if (m->units[i].gather_refs > 0)
      return zs__error(ZS_ERR_INVALID_STATE, "%s: unit '%s' is gathered; "
                       "release it first", fn, m->units[i].name);
    if (m->units[i].grad_refs > 0 || m->units[i].grad_state != ZS__GRAD_IDLE)
      return zs__error(ZS_ERR_INVALID_STATE, "%s: unit '%s' has gradients of "
                       "an unfinished step; call zs_step first", fn,
                       m->units[i].name);
  }
  return ZS_OK;
}

static int zs__ckpt_nstates(const zs__unit* u) {
  return u->trainable ? u->nstates : 0;
}

/* ==== Save ================================================================ */

/* Fills the metadata of the model (files' checksums are set later). */
static zs_status zs__ckpt_describe(const zs_model* m, zs__ckpt_meta* cm) {
  const zs_config* c = &m->ctx->config;
  memset(cm, 0, sizeof *cm);
  cm->version = ZS__CKPT_VERSION;
  cm->world = m->ctx->shard_ranks; /* (with replicas: one replica's) */
  cm->stage = c->stage;
  snprintf(cm->optimizer, sizeof cm->optimizer, "%s", m->optim_name);
  cm->grad_accum_steps = c->grad_accum_steps;
  cm->steps_called = m->steps_called;
  cm->iteration = m->steps_called / c->grad_accum_steps;
  cm->steps_applied = m->steps_applied;
  cm->scaler_mode = c->loss_scaler.mode;
  cm->loss_scale = m->loss_scale;
  cm->scale_clean_steps = m->scale_clean_steps;
  cm->scale_hysteresis = m->scale_hysteresis;
  cm->nunits = m->nunits;
  cm->ntensors = m->ntensors;
  cm->units = calloc((size_t)m->nunits + 1, sizeof *cm->units);
  cm->tensors = calloc((size_t)m->ntensors + 1, sizeof *cm->tensors);
  cm->rank_xxh64 = calloc((size_t)cm->world, sizeof *cm->rank_xxh64);
  cm->ngroups = m->ngroups;
  cm->group_lr = calloc((size_t)m->ngroups, sizeof *cm->group_lr);
  cm->group_wd = calloc((size_t)m->ngroups, sizeof *cm->group_wd);
  cm->blob_bytes = calloc((size_t)cm->world, sizeof *cm->blob_bytes);
  cm->blob_xxh64 = calloc((size_t)cm->world, sizeof *cm->blob_xxh64);
  if (cm->units == NULL || cm->tensors == NULL || cm->rank_xxh64 == NULL ||
      cm->group_lr == NULL || cm->group_wd == NULL || cm->blob_bytes == NULL ||
      cm->blob_xxh64 == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_save: metadata");
  memcpy(cm->group_lr, m->group_lr, (size_t)m->ngroups * sizeof *cm->group_lr);
  memcpy(cm->group_wd, m->group_wd, (size_t)m->ngroups * sizeof *cm->group_wd);
  uint64_t off = 0;
  for (int i = 0; i < m->nunits; i++) {
    const zs__unit* u = &m->units[i];
    zs__ckpt_unit* cu = &cm->units[i];
    snprintf(cu->name, sizeof cu->name, "%s", u->name);
    cu->dtype = u->dtype;
    cu->wdtype = zs__unit_has_master(m, u) ? ZS_FLOAT32 : u->dtype;
    cu->used = u->layout.used;
    cu->padded = u->layout.padded;
    cu->shard = u->layout.shard;
    cu->nstates = zs__ckpt_nstates(u);
    if (cu->nstates > cm->nstates) cm->nstates = cu->nstates;
    cu->field_offset[0] = off;
    off += (uint64_t)cu->shard * zs_dtype_size(cu->wdtype);
    for (int k = 0; k < cu->nstates; k++) {
      cu->field_offset[1 + k] = off;
      off += (uint64_t)cu->shard * sizeof(float);
    }
  }
  cm->rank_bytes = off;
  for (int i = 0; i < m->ntensors; i++) {
    const zs__tensor* t = &m->tensors[i];
    zs__ckpt_tensor* ct = &cm->tensors[i];
    snprintf(ct->name, sizeof ct->name, "%s", t->name);
    ct->unit = zs__storage_unit(m, i);
    ct->ndim = t->ndim;
    memcpy(ct->shape, t->shape, sizeof ct->shape);
    ct->numel = t->numel;
    ct->dtype = t->dtype;
    ct->frozen = (t->flags & ZS_TENSOR_FROZEN) != 0;
    ct->tied_to = t->tied_to;
    ct->group = t->group;
    ct->offset = t->offset;
    ct->step = t->step;
  }
  return ZS_OK;
}

/* Writes this rank's shard of every unit (weights, then states) to path. */
static zs_status zs__ckpt_write_rank(zs_model* m, const char* path,
                                     uint64_t* xxh64) {
  zs__device* dev = m->ctx->device;
  zs__ckpt_writer w;
  char* stage = malloc(ZS__CKPT_CHUNK * sizeof(float));
  if (stage == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_save: staging");
  zs_status st = zs__ckpt_writer_open(&w, path);
  if (st != ZS_OK) {
    free(stage);
    return st;
  }
  for (int i = 0; i < m->nunits && st == ZS_OK; i++) {
    zs__unit* u = &m->units[i];
    st = zs__param_acquire(m, u); /* parameter shards on NVMe: read in */
    if (st != ZS_OK) break;
    st = zs__master_refresh(m, u);
    for (int f = 0; f <= zs__ckpt_nstates(u) && st == ZS_OK; f++) {
      const char* src = NULL;
      size_t esz;
      float* nvme_tmp = NULL; /* NVMe offload: the field read back */
      if (f == 0 && zs__unit_has_master(m, u)) {
        if (m->nvme != NULL) st = zs__nvme_shard(m, u, -1, (char**)&src, &nvme_tmp);
        else src = zs__master_shard_ptr(m, u);
        esz = sizeof(float);
      } else if (f == 0) {
        src = zs__param_shard_ptr(m, u);
        esz = u->elem;
      } else {
        if (m->nvme != NULL) st = zs__nvme_shard(m, u, f - 1, (char**)&src, &nvme_tmp);
        else src = zs__state_shard_ptr(m, u, f - 1);
        esz = sizeof(float);
      }
      const size_t bytes = u->layout.shard * esz, chunk = ZS__CKPT_CHUNK * 4;
      for (size_t b = 0; b < bytes && st == ZS_OK; b += chunk) {
        size_t n = bytes - b < chunk ? bytes - b : chunk;
        st = dev->ops->copy(dev, stage, src + b, n, NULL);
        if (st == ZS_OK) st = zs__ckpt_writer_write(&w, stage, n);
      }
      free(nvme_tmp);
    }
    zs__param_release(m, u);
  }
  free(stage);
  if (st != ZS_OK) {
    zs__ckpt_writer_abort(&w);
    return st;
  }
  return zs__ckpt_writer_finish(&w, xxh64);
}

static zs_status zs__ckpt_check_name(const char* name) {
  if (name[0] == '\0' || name[0] == '.' || strchr(name, '/') != NULL ||
      strcmp(name, ZS__CKPT_LATEST) == 0 || strlen(name) > 200)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_save: name '%s' "
                     "is not a plain directory name (non-empty, no '/', not "
                     "starting with '.', not '%s', at most 200 bytes)", name,
                     ZS__CKPT_LATEST);
  return ZS_OK;
}

/* mkdir -p: every missing directory of path, mode 0755. */
static zs_status zs__mkdirs(const char* path) {
  char p[ZS__CKPT_PATH_MAX];
  if (strlen(path) >= sizeof p)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint root too long");
  strcpy(p, path);
  for (char* c = p + 1;; c++) {
    if (*c != '/' && *c != '\0') continue;
    const char keep = *c;
    *c = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      return zs__error(ZS_ERR_IO, "zs_checkpoint_save: cannot create the "
                       "checkpoint root '%s' (at '%s'): %s", path, p,
                       strerror(errno));
    *c = keep;
    if (keep == '\0') break;
  }
  return ZS_OK;
}

/* The longest root zs_checkpoint_check_root accepts (bytes): what a save
 * writes below it, "/.tmp-" NAME (200) "/rank-NNNNNNNN.bin" or
 * "/meta.json.xxh64", fits ZS__CKPT_PATH_MAX with room to spare. */
#define ZS__CKPT_ROOT_MAX 3840

static int zs__ckpt_is_dir_of_checkpoint(const char* dir) {
  char p[ZS__CKPT_PATH_MAX];
  struct stat sb;
  if (zs__ckpt_join(p, sizeof p, dir, ZS__CKPT_META) != ZS_OK ||
      stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
    return 0;
  return zs__ckpt_join(p, sizeof p, dir, ZS__CKPT_META_SUM) == ZS_OK &&
         stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

zs_status zs_checkpoint_check_root(const char* root) {
  if (root == NULL || root[0] == '\0')
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint root is NULL or "
                     "empty");
  const size_t len = strlen(root);
  if (len > ZS__CKPT_ROOT_MAX)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint root '%.60s...' is "
                     "%zu bytes: the files a save writes below it would pass "
                     "the %d-byte path limit (a root may have %d bytes)",
                     root, len, ZS__CKPT_PATH_MAX, ZS__CKPT_ROOT_MAX);
  /* The nearest existing ancestor: a directory we can create entries in. */
  char p[ZS__CKPT_PATH_MAX];
  snprintf(p, sizeof p, "%s", root);
  struct stat sb;
  while (stat(p, &sb) != 0) {
    if (errno != ENOENT)
      return zs__error(ZS_ERR_IO, "checkpoint root '%s': cannot use '%s': %s",
                       root, p, strerror(errno));
    char* slash = strrchr(p, '/');
    if (slash == NULL) snprintf(p, sizeof p, ".");
    else if (slash == p) p[1] = '\0';
    else *slash = '\0';
  }
  if (!S_ISDIR(sb.st_mode))
    return zs__error(ZS_ERR_IO, "checkpoint root '%s': '%s' is not a "
                     "directory", root, p);
  if (access(p, W_OK | X_OK) != 0)
    return zs__error(ZS_ERR_IO, "checkpoint root '%s': cannot create entries "
                     "in '%s': %s", root, p, strerror(errno));
  /* ... and neither it nor a directory above it is a checkpoint. */
  char real[PATH_MAX];
  if (realpath(p, real) == NULL)
    return zs__error(ZS_ERR_IO, "checkpoint root '%s': cannot resolve '%s': "
                     "%s", root, p, strerror(errno));
  for (int self = strcmp(p, root) == 0;; self = 0) {
    if (zs__ckpt_is_dir_of_checkpoint(real))
      return zs__error(ZS_ERR_IO, "checkpoint root '%s' is %s checkpoint "
                       "directory '%s' (a root holds checkpoints: give "
                       "another directory)", root, self ? "the" : "inside the",
                       real);
    char* slash = strrchr(real, '/');
    if (slash == NULL || slash == real) break;
    *slash = '\0';
  }
  return ZS_OK;
}

/* Rank 0: `old` (root/.old-NAME, a replaced checkpoint) holds files that
 * are not a checkpoint's, so it could not be removed: it is kept whole
 * under a visible name, NAME.replaced (or NAME.replaced.2, ...), so that
 * `.old-NAME` keeps meaning only "a save replacing NAME was interrupted"
 * and no later save puts it back or is stopped by it. why: the removal's
 * message. */
static void zs__ckpt_keep_old(const char* root, const char* old,
                              const char* name, const char* why_in) {
  char kept[ZS__CKPT_PATH_MAX], kname[300], why[600];
  snprintf(why, sizeof why, "%s", why_in); /* (the error buffer is reused) */
  struct stat sb;
  for (int i = 1; i < 100; i++) {
    if (i == 1) snprintf(kname, sizeof kname, "%s.replaced", name);
    else snprintf(kname, sizeof kname, "%s.replaced.%d", name, i);
    if (zs__ckpt_join(kept, sizeof kept, root, kname) != ZS_OK) break;
    if (lstat(kept, &sb) == 0) continue;
    if (rename(old, kept) == 0) {
      (void)zs__ckpt_fsync_dir(root); /* (if lost, the next save redoes it) */
      zs__log(ZS_LOG_WARN, "checkpoint '%s/%s' replaced; the old copy "
              "could not be removed, so it is kept whole at '%s': %s", root,
              name, kept, why);
      return;
    }
    break;
  }
  zs__log(ZS_LOG_WARN, "checkpoint '%s/%s' replaced; its old copy stays at "
          "'%s', which stops the next save replacing '%s' until it is "
          "removed: %s", root, name, old, name, why);
}

/* Rank 0: what crashed saves left in the root. A `.tmp-NAME` is an
 * incomplete save: removed. A `.old-NAME` is a checkpoint a save was
 * replacing: put back as NAME if the crash came before the new NAME was in
 * place, else removed. One save at a time per root. */
static zs_status zs__ckpt_recover_root(const char* root) {
  DIR* d = opendir(root);
  if (d == NULL)
    return zs__error(ZS_ERR_IO, "zs_checkpoint_save: cannot open '%s': %s",
                     root, strerror(errno));
  zs_status st = ZS_OK;
  struct dirent* e;
  while (st == ZS_OK && (e = readdir(d)) != NULL) {
    const int is_tmp = strncmp(e->d_name, ".tmp-", 5) == 0;
    const int is_old = strncmp(e->d_name, ".old-", 5) == 0;
    if (!is_tmp && !is_old) continue;
    char p[ZS__CKPT_PATH_MAX], target[ZS__CKPT_PATH_MAX];
    struct stat sb;
    st = zs__ckpt_join(p, sizeof p, root, e->d_name);
    if (st == ZS_OK) st = zs__ckpt_join(target, sizeof target, root,
                                        e->d_name + 5);
    if (st != ZS_OK) break;
    if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue; /* not ours */
    if (is_old && stat(target, &sb) != 0) {
      if (rename(p, target) != 0)
        st = zs__error(ZS_ERR_IO, "zs_checkpoint_save: cannot restore '%s' "
                       "to '%s': %s", p, target, strerror(errno));
      else
        zs__log(ZS_LOG_WARN, "checkpoint '%s' restored from '%s' (a save "
                "replacing it was interrupted)", target, p);
    } else if (zs__ckpt_remove_dir(p) != ZS_OK) {
      /* It holds files that are not a checkpoint's: never deleted. A
       * replaced copy is kept under a visible name; a temporary stays (a
       * save that needs this very name fails on it later, saying so). */
      if (is_old) zs__ckpt_keep_old(root, p, e->d_name + 5, zs__error_body());
      else
        zs__log(ZS_LOG_WARN, "zs_checkpoint_save: leaving '%s': %s", p,
                zs__error_body());
    }
  }
  closedir(d);
  return st;
}

/* Rank 0: the root exists (created if missing), no stale temporary, and
 * nothing in the way of replacing NAME (a `.old-NAME` kept because it holds
 * a user's files stops the save here, before anything is written). */
static zs_status zs__ckpt_prepare(const char* root, const char* name,
                                  const char* tmp, int* lock_fd) {
  zs_status st0 = zs_checkpoint_check_root(root);
  if (st0 != ZS_OK) return zs__error_prefix(st0, "zs_checkpoint_save: ");
  st0 = zs__mkdirs(root);
  if (st0 != ZS_OK) return st0;
  /* One save at a time per root: an exclusive flock on the root directory,
   * held until the save ends, before anything in it is cleared (another
   * save's temporary directory would look like a crashed one's). File
   * systems without flock (some NFS set-ups) go on unlocked. */
  *lock_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (*lock_fd >= 0 && flock(*lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK)
      return zs__error(ZS_ERR_IO, "zs_checkpoint_save: another save is "
                       "writing into '%s' (another process or job saving "
                       "there now; one save at a time per root): nothing "
                       "written", root);
    zs__log(ZS_LOG_DEBUG, "checkpoint root '%s' cannot be locked (%s): saving "
            "unlocked", root, strerror(e));
  }
  st0 = zs__ckpt_recover_root(root);
  if (st0 != ZS_OK) return st0;
  char oldname[256], old[ZS__CKPT_PATH_MAX];
  struct stat osb;
  snprintf(oldname, sizeof oldname, ".old-%s", name);
  st0 = zs__ckpt_join(old, sizeof old, root, oldname);
  if (st0 != ZS_OK) return st0;
  if (lstat(old, &osb) == 0) /* (only if it could not be renamed) */
    return zs__error(ZS_ERR_IO, "zs_checkpoint_save: '%s' is in the way of "
                     "replacing '%s' (it holds files that are not a "
                     "checkpoint's, kept when it was replaced before): move "
                     "them out and remove it", old, name);
  struct stat sb;
  if (stat(root, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return zs__error(ZS_ERR_IO, "zs_checkpoint_save: '%s' is not a directory",
                     root);
  zs_status st = zs__ckpt_remove_dir(tmp); /* a crashed save's leftovers */
  if (st != ZS_OK) return st;
  if (mkdir(tmp, 0755) != 0)
    return zs__error(ZS_ERR_IO, "zs_checkpoint_save: cannot create '%s': %s",
                     tmp, strerror(errno));
  return ZS_OK;
}

/* Rank 0, after every rank file is durable: extras, metadata, checksum,
 * then the directory renamed into place and `latest` moved to it. */
static zs_status zs__ckpt_commit(zs__ckpt_meta* cm, const char* root,
                                 const char* name, const char* tmp,
                                 const void* extras, size_t extras_bytes) {
  char p[ZS__CKPT_PATH_MAX], final_dir[ZS__CKPT_PATH_MAX];
  char old[ZS__CKPT_PATH_MAX], hex[32], oldname[256];
  char* json = NULL;
  zs_status st = ZS_OK;
  ZS_CHECK(zs__ckpt_join(p, sizeof p, tmp, ZS__CKPT_EXTRAS));
  cm->extras_bytes = extras_bytes;
  ZS_CHECK(zs__ckpt_write_small(p, extras, extras_bytes, &cm->extras_xxh64));
  zs__ckpt_crash_point(0, ZS__CKPT_EXTRAS);
  ZS_CHECK(zs__ckpt_meta_json(cm, &json));
  ZS_CHECK(zs__ckpt_join(p, sizeof p, tmp, ZS__CKPT_META));
  uint64_t sum = 0;
  ZS_CHECK(zs__ckpt_write_small(p, json, strlen(json), &sum));
  zs__ckpt_crash_point(0, ZS__CKPT_META);
  snprintf(hex, sizeof hex, "%016llx\n", (unsigned long long)sum);
  ZS_CHECK(zs__ckpt_join(p, sizeof p, tmp, ZS__CKPT_META_SUM));
  ZS_CHECK(zs__ckpt_write_small(p, hex, strlen(hex), NULL));
  zs__ckpt_crash_point(0, ZS__CKPT_META_SUM);
  ZS_CHECK(zs__ckpt_fsync_dir(tmp));
  /* Into place. A checkpoint of the same name is replaced: moved aside,
   * the new one renamed in, then the old one removed. */
  ZS_CHECK(zs__ckpt_join(final_dir, sizeof final_dir, root, name));
  snprintf(oldname, sizeof oldname, ".old-%s", name);
  ZS_CHECK(zs__ckpt_join(old, sizeof old, root, oldname));
  struct stat sb;
  int replaced = 0; /* (zs__ckpt_recover_root left no .old-NAME) */
  if (stat(final_dir, &sb) == 0) {
    if (rename(final_dir, old) != 0)
      ZS_FAIL(ZS_ERR_IO, "zs_checkpoint_save: cannot move the existing '%s' "
              "aside: %s", final_dir, strerror(errno));
    replaced = 1;
    ZS_CHECK(zs__ckpt_fsync_dir(root));
    zs__ckpt_crash_point(0, "move the replaced checkpoint aside");
  }
  if (rename(tmp, final_dir) != 0)
    ZS_FAIL(ZS_ERR_IO, "zs_checkpoint_save: cannot rename '%s' to '%s': %s",
            tmp, final_dir, strerror(errno));
  ZS_CHECK(zs__ckpt_fsync_dir(root));
  zs__ckpt_crash_point(0, "rename into place");
  /* The pointer: a new file renamed over the old one. */
  char lt[ZS__CKPT_PATH_MAX], ltmp[ZS__CKPT_PATH_MAX], line[256];
  ZS_CHECK(zs__ckpt_join(lt, sizeof lt, root, ZS__CKPT_LATEST));
  ZS_CHECK(zs__ckpt_join(ltmp, sizeof ltmp, root, ".latest.tmp"));
  unlink(ltmp);
  snprintf(line, sizeof line, "%s\n", name);
  ZS_CHECK(zs__ckpt_write_small(ltmp, line, strlen(line), NULL));
  if (rename(ltmp, lt) != 0)
    ZS_FAIL(ZS_ERR_IO, "zs_checkpoint_save: cannot rename '%s' to '%s': %s",
            ltmp, lt, strerror(errno));
  ZS_CHECK(zs__ckpt_fsync_dir(root));
  zs__ckpt_crash_point(0, ZS__CKPT_LATEST);
  /* The replaced checkpoint: removed. If it holds files that are not the
   * checkpoint's (a consolidated model kept next to it), nothing of it is
   * deleted: it is kept whole as NAME.replaced, and the save has still
   * succeeded. */
  if (replaced && zs__ckpt_remove_dir(old) != ZS_OK)
    zs__ckpt_keep_old(root, old, name, zs__error_body());
cleanup:
  free(json);
  return st;
}

zs_status zs_checkpoint_save(zs_model* m, const char* root, const char* name,
                             const void* extras, size_t extras_bytes) {
  zs_status st = zs__check_finalized(m, "zs_checkpoint_save");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_checkpoint_save");
  if (st != ZS_OK) return st;
  zs__comm* comm = m->ctx->comm;
  const int rank = m->ctx->rank, world = m->ctx->world;
  /* the first shard group's ranks write (ranks 0 .. G-1: their rank is
   * their shard rank); the other replicas hold the same shards */
  const int writes = rank < m->ctx->shard_ranks;
  char namebuf[64], tmp[ZS__CKPT_PATH_MAX], path[ZS__CKPT_PATH_MAX];
  char tmpname[256], rname[64];
  zs__ckpt_meta cm;
  memset(&cm, 0, sizeof cm);
  uint64_t mine = 0;
  uint64_t* all = NULL; /* every rank's file and blob sums */
  int wrote = 0; /* rank 0 created the temporary directory */
  int lock_fd = -1; /* rank 0: the root, flocked during the save */
  zs_status local = ZS_OK;
  if (root == NULL || root[0] == '\0')
    local = zs__error(ZS_ERR_INVALID_ARGUMENT,
                      "zs_checkpoint_save: root directory is NULL or empty");
  if (name == NULL) {
    snprintf(namebuf, sizeof namebuf, "step-%08lld",
             (long long)(m->steps_called /
                         m->ctx->config.grad_accum_steps));
    name = namebuf;
  }
  if (local == ZS_OK) local = zs__ckpt_check_name(name);
  if (local == ZS_OK && rank == 0 && extras == NULL && extras_bytes > 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_save: extras "
                      "is NULL with extras_bytes %zu", extras_bytes);
  if (local == ZS_OK) local = zs__ckpt_quiet(m, "zs_checkpoint_save");
  if (local == ZS_OK) {
    snprintf(tmpname, sizeof tmpname, ".tmp-%s", name);
    local = zs__ckpt_join(tmp, sizeof tmp, root, tmpname);
  }
  if (local == ZS_OK) local = zs__ckpt_describe(m, &cm);
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_save"));
  if (rank == 0) {
    local = zs__ckpt_prepare(root, name, tmp, &lock_fd);
    wrote = local == ZS_OK;
  }
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_save"));
  wrote = 1;
  zs__ckpt_rank_file(rank, rname, sizeof rname);
  local = zs__ckpt_join(path, sizeof path, tmp, rname);
  if (local == ZS_OK && writes) local = zs__ckpt_write_rank(m, path, &mine);
  if (local == ZS_OK && writes) zs__ckpt_crash_point(rank, rname);
  /* this rank's blob (zs_checkpoint_set_rank_blob), maybe empty */
  uint64_t blob[3] = {0, (uint64_t)m->rank_blob_bytes, 0};
  if (local == ZS_OK && !writes && m->rank_blob_bytes > 0)
    local = zs__error(ZS_ERR_UNSUPPORTED,
                      "zs_checkpoint_save: rank %d set a rank blob "
                      "(zs_checkpoint_set_rank_blob), but with shard groups "
                      "only the first group's ranks (0 .. %d) save theirs; "
                      "keep per-rank state of the other replicas in the "
                      "extras", rank, m->ctx->shard_ranks - 1);
  if (local == ZS_OK && writes) {
    zs__ckpt_blob_file(rank, rname, sizeof rname);
    local = zs__ckpt_join(path, sizeof path, tmp, rname);
  }
  if (local == ZS_OK && writes)
    local = zs__ckpt_write_small(path, m->rank_blob, m->rank_blob_bytes,
                                 &blob[2]);
  if (local == ZS_OK) {
    blob[0] = mine;
    all = malloc((size_t)world * sizeof blob);
    if (all == NULL)
      local = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_save: sums");
  }
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_save"));
  st = zs__comm_all_gather(comm, zs__tag(ZS__P_CHECK, -1, "checkpoint"), blob,
                           all, 3, ZS_UINT64);
  for (int r = 0; st == ZS_OK && r < cm.world; r++) {
    cm.rank_xxh64[r] = all[3 * r];
    cm.blob_bytes[r] = all[3 * r + 1];
    cm.blob_xxh64[r] = all[3 * r + 2];
  }
  ZS_CHECK(st);
  local = ZS_OK;
  if (rank == 0)
    local = zs__ckpt_commit(&cm, root, name, tmp, extras, extras_bytes);
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_save"));
  wrote = 0;
  zs__log(ZS_LOG_INFO, "checkpoint '%s/%s' saved (%d rank files of %llu "
          "bytes)", root, name, cm.world, (unsigned long long)cm.rank_bytes);
cleanup:
  /* A failed save leaves no partial directory (the previous checkpoint and
   * `latest` were never touched). Every rank has finished with the
   * temporary directory once the agreement returned. */
  if (st != ZS_OK && wrote && rank == 0) {
    zs_status keep = st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", zs__error_body());
    zs__ckpt_remove_dir(tmp);
    zs__error(keep, "%s", msg);
  }
  if (lock_fd >= 0) close(lock_fd); /* (releases the flock) */
  free(all);
  zs__ckpt_meta_free(&cm);
  return st;
}

/* ==== Load ================================================================ */

static int zs__ckpt_find(const zs__ckpt_meta* cm, const char* name) {
  for (int i = 0; i < cm->ntensors; i++)
    if (strcmp(cm->tensors[i].name, name) == 0) return i;
  return -1;
}

static void zs__shape_str(const int64_t* shape, int ndim, char* buf,
                          size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "",
                          (long long)shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Checks that the checkpoint describes this model and fills map (model
 * tensor -> checkpoint tensor). */
static zs_status zs__ckpt_match(const zs_model* m, const zs__ckpt_meta* cm,
                                int weights_only, int* map) {
  char file[ZS__CKPT_PATH_MAX + 16];
  snprintf(file, sizeof file, "%s/%s", cm->dir, ZS__CKPT_META);
  for (int j = 0; j < cm->ntensors; j++) {
    int found = 0;
    for (int i = 0; i < m->ntensors && !found; i++)
      found = strcmp(m->tensors[i].name, cm->tensors[j].name) == 0;
    if (!found)
      return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' is of a different "
                       "model: its tensor '%s' is not in this model (%d "
                       "tensors there, %d here)", file, cm->tensors[j].name,
                       cm->ntensors, m->ntensors);
  }
  int states = 0; /* this model's state buffers per element */
  for (int i = 0; i < m->nunits; i++)
    if (zs__ckpt_nstates(&m->units[i]) > states)
      states = zs__ckpt_nstates(&m->units[i]);
  if (!weights_only && (strcmp(cm->optimizer, m->optim_name) != 0 ||
                        (cm->nstates != states && cm->nstates > 0 && states > 0)))
    return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' was saved with "
                     "optimizer '%s' (%d state buffers), this model runs "
                     "'%s' (%d): load its weights only "
                     "(ZS_LOAD_WEIGHTS_ONLY)", file, cm->optimizer,
                     cm->nstates, m->optim_name, states);
  if (!weights_only && cm->ngroups > 0 && cm->ngroups != m->ngroups)
    return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' was saved with %d "
                     "param groups, this model has %d: load its weights only "
                     "(ZS_LOAD_WEIGHTS_ONLY)", file, cm->ngroups, m->ngroups);
  for (int i = 0; i < m->ntensors; i++) {
    const zs__tensor* t = &m->tensors[i];
    int j = zs__ckpt_find(cm, t->name);
    if (j < 0)
      return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' is of a different "
                       "model: it has no tensor '%s'", file, t->name);
    const zs__ckpt_tensor* ct = &cm->tensors[j];
    int same = ct->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = ct->shape[d] == t->shape[d];
    if (!same) {
      char here[160], there[160];
      zs__shape_str(t->shape, t->ndim, here, sizeof here);
      zs__shape_str(ct->shape, ct->ndim, there, sizeof there);
      return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' is of a different "
                       "model: tensor '%s' is %s there, %s here", file,
                       t->name, there, here);
    }
    const char* tie_here = t->tied_to >= 0 ? m->tensors[t->tied_to].name : "";
    const char* tie_there = ct->tied_to >= 0 ? cm->tensors[ct->tied_to].name : "";
    if (strcmp(tie_here, tie_there) != 0)
      return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s' is of a different "
                       "model: tensor '%s' is tied to '%s' there and to '%s' "
                       "here", file, t->name, tie_there[0] ? tie_there : "(none)",
                       tie_here[0] ? tie_here : "(none)");
    const int frozen = (t->flags & ZS_TENSOR_FROZEN) != 0;
    if (!weights_only && t->tied_to < 0 && !frozen) {
      const zs__unit* u = &m->units[t->unit];
      if (ct->frozen || cm->units[ct->unit].nstates != zs__ckpt_nstates(u))
        return zs__error(ZS_ERR_MISMATCH, "checkpoint '%s': tensor '%s' has "
                         "%d optimizer states there%s, %d here: load its "
                         "weights only (ZS_LOAD_WEIGHTS_ONLY)", file, t->name,
                         cm->units[ct->unit].nstates,
                         ct->frozen ? " (frozen)" : "", zs__ckpt_nstates(u));
    }
    map[i] = j;
  }
  return ZS_OK;
}

/* Loads one field into [begin, begin + n) of a unit's flat buffer, whose
 * first element is at dst (device memory of dtype), tensor by tensor from
 * the checkpoint. field 0: weights; k >= 1: optimizer state k - 1. */
static zs_status zs__ckpt_load_span(zs_model* m, zs__unit* u,
                                    zs__ckpt_reader* rd, const int* map,
                                    int field, size_t begin, size_t n,
                                    char* dst, zs_dtype dtype, char* stage) {
  zs__piece* pieces = NULL;
  size_t np = 0;
  zs_status st = zs__unit_pieces(m, u, begin, begin + n, field > 0, &pieces,
                                 &np);
  const size_t esz = zs_dtype_size(dtype);
  zs__device* dev = m->ctx->device;
  for (size_t p = 0; p < np && st == ZS_OK; p++) {
    const int j = map[u->tensors[pieces[p].tensor]];
    const zs__ckpt_tensor* ct = &rd->meta->tensors[j];
    for (size_t i = 0; i < pieces[p].count && st == ZS_OK;
         i += ZS__CKPT_CHUNK) {
      size_t c = pieces[p].count - i;
      if (c > ZS__CKPT_CHUNK) c = ZS__CKPT_CHUNK;
      const size_t first = pieces[p].tensor_offset + i;
      if (field == 0)
        st = zs__ckpt_read_weights(rd, j, first, c, dtype, stage);
      else
        st = zs__ckpt_read(rd, ct->unit, field, ct->offset + first, c, stage);
      if (st == ZS_OK)
        st = dev->ops->copy(dev, dst + (pieces[p].span_offset + i) * esz,
                            stage, c * esz, NULL);
    }
  }
  free(pieces);
  return st;
}

/* A master-weight (which -1) or state (which k) field of a unit's
 * optimizer span [ob, ob + on): into the unit's buffer, or with NVMe
 * offload into the swap file (read, loaded over, written back, so the
 * elements the checkpoint does not hold keep their values). */
static zs_status zs__ckpt_load_field(zs_model* m, zs__unit* u,
                                     zs__ckpt_reader* rd, const int* map,
                                     int field, size_t ob, size_t on,
                                     int which, char* buf) {
  if (m->nvme == NULL)
    return zs__ckpt_load_span(m, u, rd, map, field, ob, on,
                              which < 0 ? u->master : u->state[which],
                              ZS_FLOAT32, buf);
  float* tmp = NULL;
  zs_status st = zs__nvme_read_field(m, u, which, &tmp);
  if (st == ZS_OK)
    st = zs__ckpt_load_span(m, u, rd, map, field, ob, on, (char*)tmp,
                            ZS_FLOAT32, buf);
  if (st == ZS_OK) st = zs__nvme_write_field(m, u, which, tmp);
  free(tmp);
  return st;
}

static zs_status zs__ckpt_load_units(zs_model* m, zs__ckpt_reader* rd,
                                     const int* map, int weights_only) {
  const int rank = m->ctx->shard_rank;
  char* buf = malloc(ZS__CKPT_CHUNK * sizeof(float));
  if (buf == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_load: staging");
  zs_status st = ZS_OK;
  for (int i = 0; i < m->nunits && st == ZS_OK; i++) {
    zs__unit* u = &m->units[i];
    const size_t sb = zs__layout_shard_begin(&u->layout, rank);
    /* Parameters: the persistent ones (the policy's extent: the full
     * buffer at stages 0-2, the shard at 3). */
    if (u->policy.params == ZS__EXTENT_SHARD) {
      st = zs__param_acquire_blank(m, u); /* NVMe: the whole shard loads */
      if (st == ZS_OK)
        st = zs__ckpt_load_span(m, u, rd, map, 0, sb, u->layout.shard,
                                u->params_shard, u->dtype, buf);
      if (st == ZS_OK) st = zs__param_write_back(m, u);
      zs__param_release(m, u);
    } else
      st = zs__ckpt_load_span(m, u, rd, map, 0, 0, u->layout.padded,
                              u->params_full, u->dtype, buf);
    /* Master weights and optimizer states: the optimizer's span. */
    const size_t ob = zs__span_begin(m, u);
    const size_t on = zs__optimize_span_elems(m, u);
    if (st == ZS_OK && zs__unit_has_master(m, u)) {
      st = zs__ckpt_load_field(m, u, rd, map, 0, ob, on, -1, buf);
      if (st == ZS_OK) u->master_stale = 0;
    }
    for (int k = 0; !weights_only && k < zs__ckpt_nstates(u) && st == ZS_OK;
         k++)
      st = zs__ckpt_load_field(m, u, rd, map, 1 + k, ob, on, k, buf);
  }
  free(buf);
  return st;
}

/* Reads and verifies extras.bin into out (cap bytes; NULL: verify only);
 * `who` names the public call in errors. */
/* Reads a small whole file of the checkpoint into out (cap bytes; NULL:
 * verify only), verified first: file -1 is extras.bin, world + R rank R's
 * blob (zs__ckpt_verify_file's numbering). who names the caller. */
static zs_status zs__ckpt_read_whole(const zs__ckpt_meta* cm, int file,
                                     void* out, size_t cap, const char* who) {
  const uint64_t n = file < 0 ? cm->extras_bytes : cm->blob_bytes[file - cm->world];
  char name[64], path[ZS__CKPT_PATH_MAX];
  if (file < 0) snprintf(name, sizeof name, "%s", ZS__CKPT_EXTRAS);
  else zs__ckpt_blob_file(file - cm->world, name, sizeof name);
  /* extras.bin is checked even when empty; an empty blob has no data */
  if (n == 0 && file >= 0) return ZS_OK;
  zs_status st = zs__ckpt_verify_file(cm, file);
  if (st != ZS_OK || out == NULL || n == 0) return st;
  if (n > cap && file < 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "%s: the checkpoint's extras "
                     "are %llu bytes, the buffer holds %zu", who,
                     (unsigned long long)n, cap);
  if (n > cap)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "%s: rank %d's blob is %llu "
                     "bytes, the buffer holds %zu", who, file - cm->world,
                     (unsigned long long)n, cap);
  st = zs__ckpt_join(path, sizeof path, cm->dir, name);
  if (st != ZS_OK) return st;
  FILE* f = fopen(path, "rb");
  if (f == NULL)
    return zs__error(ZS_ERR_IO, "checkpoint file '%s' cannot be opened: %s",
                     path, strerror(errno));
  size_t got = fread(out, 1, (size_t)n, f);
  fclose(f);
  if (got != n)
    return zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s' is truncated", path);
  return ZS_OK;
}

zs_status zs_checkpoint_read_extras(const char* path, void* extras,
                                    size_t extras_cap, size_t* extras_bytes) {
  if (extras_bytes != NULL) *extras_bytes = 0;
  ZS_REQUIRE(path != NULL, "zs_checkpoint_read_extras: path is NULL");
  zs__ckpt_meta cm;
  memset(&cm, 0, sizeof cm);
  zs_status st = zs__ckpt_meta_read(path, &cm);
  if (st == ZS_OK && extras_bytes != NULL)
    *extras_bytes = (size_t)cm.extras_bytes;
  if (st == ZS_OK)
    st = zs__ckpt_read_whole(&cm, -1, extras, extras_cap,
                             "zs_checkpoint_read_extras");
  zs__ckpt_meta_free(&cm);
  return st;
}

zs_status zs_checkpoint_set_rank_blob(zs_model* m, const void* data,
                                      size_t bytes) {
  ZS_REQUIRE(m != NULL, "zs_checkpoint_set_rank_blob: model is NULL");
  ZS_REQUIRE(data != NULL || bytes == 0, "zs_checkpoint_set_rank_blob: data "
             "is NULL with bytes %zu", bytes);
  ZS_REQUIRE(bytes <= ((size_t)1 << 40), "zs_checkpoint_set_rank_blob: %zu "
             "bytes is more than 1 TiB", bytes);
  void* copy = NULL;
  if (bytes > 0) {
    copy = malloc(bytes);
    if (copy == NULL)
      return zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_set_rank_blob: "
                       "%zu bytes", bytes);
    memcpy(copy, data, bytes);
  }
  free(m->rank_blob);
  m->rank_blob = copy;
  m->rank_blob_bytes = bytes;
  return ZS_OK;
}

zs_status zs_checkpoint_read_rank_blob(const char* path, int rank, void* out,
                                       size_t cap, size_t* bytes,
                                       int* saved_ranks) {
  if (bytes != NULL) *bytes = 0;
  if (saved_ranks != NULL) *saved_ranks = 0;
  ZS_REQUIRE(path != NULL, "zs_checkpoint_read_rank_blob: path is NULL");
  zs__ckpt_meta cm;
  memset(&cm, 0, sizeof cm);
  zs_status st = zs__ckpt_meta_read(path, &cm);
  if (st == ZS_OK && saved_ranks != NULL) *saved_ranks = cm.world;
  if (st == ZS_OK && (rank < 0 || rank >= cm.world))
    st = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_read_rank_blob: "
                   "checkpoint '%s' was saved by %d ranks: there is no rank "
                   "%d", cm.dir, cm.world, rank);
  /* version 1: no blobs (every rank's is empty) */
  const uint64_t n = st == ZS_OK && cm.blob_bytes != NULL ? cm.blob_bytes[rank] : 0;
  if (st == ZS_OK && bytes != NULL) *bytes = (size_t)n;
  if (st == ZS_OK && n > 0)
    st = zs__ckpt_read_whole(&cm, cm.world + rank, out, cap,
                             "zs_checkpoint_read_rank_blob");
  zs__ckpt_meta_free(&cm);
  return st;
}

zs_status zs_checkpoint_read_tensors(const char* path,
                                     zs_checkpoint_tensor* out, int cap,
                                     int* count) {
  ZS_REQUIRE(count != NULL, "zs_checkpoint_read_tensors: count is NULL");
  *count = 0;
  ZS_REQUIRE(path != NULL, "zs_checkpoint_read_tensors: path is NULL");
  ZS_REQUIRE(cap >= 0 && (out != NULL || cap == 0),
             "zs_checkpoint_read_tensors: cap %d with out %s", cap,
             out != NULL ? "set" : "NULL");
  zs__ckpt_meta cm;
  memset(&cm, 0, sizeof cm);
  zs_status st = zs__ckpt_meta_read(path, &cm);
  if (st == ZS_OK) {
    *count = cm.ntensors;
    if (cm.ntensors > cap && out != NULL)
      st = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_read_tensors: "
                     "the checkpoint has %d tensors, out holds %d",
                     cm.ntensors, cap);
  }
  for (int i = 0; st == ZS_OK && out != NULL && i < cm.ntensors; i++) {
    const zs__ckpt_tensor* t = &cm.tensors[i];
    zs_checkpoint_tensor* o = &out[i];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", t->name);
    o->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) o->shape[d] = t->shape[d];
    o->numel = t->numel;
    o->dtype = t->dtype;
    o->tied_to = t->tied_to;
    o->frozen = t->frozen;
  }
  zs__ckpt_meta_free(&cm);
  return st;
}

zs_status zs_checkpoint_load(zs_model* m, const char* path, unsigned flags,
                             void* extras, size_t extras_cap,
                             size_t* extras_bytes) {
  zs_status st = zs__check_finalized(m, "zs_checkpoint_load");
  if (st == ZS_OK) st = zs__check_discarded(m, "zs_checkpoint_load");
  if (st != ZS_OK) return st;
  zs__comm* comm = m->ctx->comm;
  const int rank = m->ctx->rank, world = m->ctx->world;
  const int weights_only = (flags & ZS_LOAD_WEIGHTS_ONLY) != 0;
  zs__ckpt_meta cm;
  memset(&cm, 0, sizeof cm);
  zs__ckpt_reader rd = {NULL, NULL};
  int* map = NULL;
  zs_status local = ZS_OK;
  if ((flags & ~(unsigned)ZS_LOAD_WEIGHTS_ONLY) != 0)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_load: unknown "
                      "flags 0x%x", flags);
  if (local == ZS_OK && path == NULL)
    local = zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_load: path is "
                      "NULL");
  if (local == ZS_OK) local = zs__ckpt_quiet(m, "zs_checkpoint_load");
  if (local == ZS_OK) local = zs__ckpt_meta_read(path, &cm);
  if (local == ZS_OK) {
    map = malloc(((size_t)m->ntensors + 1) * sizeof *map);
    if (map == NULL)
      local = zs__error(ZS_ERR_OUT_OF_MEMORY, "zs_checkpoint_load: map");
  }
  if (local == ZS_OK) local = zs__ckpt_match(m, &cm, weights_only, map);
  /* Every file is verified once, by one rank, before anything is loaded
   * (the rank files, and the rank blobs of a version 2 checkpoint). */
  const int nfiles = cm.blob_bytes != NULL ? 2 * cm.world : cm.world;
  for (int f = rank; local == ZS_OK && f < nfiles; f += world)
    local = zs__ckpt_verify_file(&cm, f);
  if (local == ZS_OK)
    local = zs__ckpt_read_whole(&cm, -1, extras, extras_cap, "zs_checkpoint_load");
  if (local == ZS_OK) local = zs__ckpt_reader_open(&rd, &cm);
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_load"));
  local = zs__ckpt_load_units(m, &rd, map, weights_only);
  /* parameter shards on NVMe: written through, or (after a failure) the
   * partly loaded buffers dropped */
  local = local == ZS_OK ? zs__param_flush(m) : zs__param_abort(m, local);
  ZS_CHECK(zs__comm_agree(comm, local, "zs_checkpoint_load"));
  if (!weights_only) {
    for (int i = 0; i < m->ntensors; i++)
      m->tensors[i].step = cm.tensors[map[i]].step;
    /* The iteration carries over (zs_step calls count micro-batches, and
     * the run may go on with another grad_accum_steps). */
    m->steps_called = cm.iteration * m->ctx->config.grad_accum_steps;
    m->steps_applied = cm.steps_applied;
    m->micro = 0;
    m->broken = 0; /* the optimizer states are whole again */
    /* the groups' learning rates (a schedule's position), when saved
     * (version 2) for the same groups */
    for (int g = 0; g < cm.ngroups && cm.ngroups == m->ngroups; g++)
      m->group_lr[g] = cm.group_lr[g];
    /* The scaler's state carries over when the same kind of scaler runs
     * (a static or absent one keeps its configured scale). */
    if (cm.scaler_mode == m->ctx->config.loss_scaler.mode) {
      m->loss_scale = cm.loss_scale;
      m->scale_clean_steps = cm.scale_clean_steps;
      m->scale_hysteresis = cm.scale_hysteresis;
    }
  }
  if (extras_bytes != NULL) *extras_bytes = (size_t)cm.extras_bytes;
  zs__log(ZS_LOG_INFO, "checkpoint '%s' loaded (saved by %d ranks at stage "
          "%d; %s)", cm.dir, cm.world, cm.stage,
          weights_only ? "weights only" : "weights and optimizer state");
cleanup:
  if (rd.fds != NULL) zs__ckpt_reader_close(&rd);
  free(map);
  zs__ckpt_meta_free(&cm);
  return st;
}
