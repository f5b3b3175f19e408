/*
 * ckpt_consolidate.c — a sharded checkpoint's full weights as one
 * safetensors file (zeroshard.h, zs_checkpoint_consolidate). Format:
 * huggingface/safetensors README, "Format": u64 little-endian N, N bytes of
 * JSON header {name: {dtype, shape, data_offsets: [begin, end)}, ...,
 * "__metadata__": {string: string}}, then the byte buffer; offsets are
 * relative to the buffer, tensors may not overlap.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/ckpt/ckpt_format.h"
#include "runtime/core/core.h"

static int zs__stored(const zs__ckpt_tensor* t, int duplicate_tied) {
  return t->tied_to < 0 || duplicate_tied;
}

/* The header: tensors in registration order, offsets back to back. */
static zs_status zs__st_header(const zs__ckpt_meta* cm, zs_dtype dtype,
                               int duplicate_tied, char** out) {
  const size_t esz = zs_dtype_size(dtype);
  const char* dname = dtype == ZS_FLOAT32 ? "F32" : "BF16";
  char key[ZS_NAME_MAX + 16], num[32];
  uint64_t off = 0;
  cJSON* root = cJSON_CreateObject();
  cJSON* meta = cJSON_AddObjectToObject(root, "__metadata__");
  if (root == NULL || meta == NULL) goto oom;
  if (cJSON_AddStringToObject(meta, "format", "pt") == NULL) goto oom;
  if (cJSON_AddStringToObject(meta, "zeroshard.source", cm->dir) == NULL)
    goto oom;
  snprintf(num, sizeof num, "%lld", (long long)cm->iteration);
  if (cJSON_AddStringToObject(meta, "zeroshard.iteration", num) == NULL)
    goto oom;
  for (int i = 0; i < cm->ntensors; i++) {
    const zs__ckpt_tensor* t = &cm->tensors[i];
    if (!zs__stored(t, duplicate_tied)) {
      snprintf(key, sizeof key, "tied:%s", t->name);
      if (cJSON_AddStringToObject(meta, key, cm->tensors[t->tied_to].name) ==
          NULL)
        goto oom;
      continue;
    }
    cJSON* o = cJSON_AddObjectToObject(root, t->name);
    if (o == NULL || cJSON_AddStringToObject(o, "dtype", dname) == NULL)
      goto oom;
    cJSON* sh = cJSON_AddArrayToObject(o, "shape");
    cJSON* dof = cJSON_AddArrayToObject(o, "data_offsets");
    if (sh == NULL || dof == NULL) goto oom;
    for (int d = 0; d < t->ndim; d++) {
      cJSON* n = cJSON_CreateNumber((double)t->shape[d]);
      if (n == NULL) goto oom;
      cJSON_AddItemToArray(sh, n);
    }
    cJSON* b = cJSON_CreateNumber((double)off);
    off += (uint64_t)t->numel * esz;
    cJSON* e = cJSON_CreateNumber((double)off);
    if (b == NULL || e == NULL) goto oom;
    cJSON_AddItemToArray(dof, b);
    cJSON_AddItemToArray(dof, e);
  }
  *out = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (*out == NULL) goto oom_nofree;
  return ZS_OK;
oom:
  cJSON_Delete(root);
oom_nofree:
  return zs__error(ZS_ERR_OUT_OF_MEMORY, "consolidate: header");
}

/* The output must not be a file of the checkpoint or of its root, nor of
 * any other checkpoint: it is refused when its directory is the checkpoint
 * directory, when its name is one a checkpoint's file or root pointer has
 * (meta.json, rank-00000.bin, latest, ...), or when it is a hidden entry of
 * the root. */
static zs_status zs__st_check_out(const zs__ckpt_meta* cm, const char* out) {
  char dir[ZS__CKPT_PATH_MAX + 8], rdir[PATH_MAX], rck[PATH_MAX];
  char rroot[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", out);
  char* slash = strrchr(dir, '/');
  char base[ZS__CKPT_PATH_MAX];
  snprintf(base, sizeof base, "%s", slash ? slash + 1 : out);
  if (slash == dir) dir[1] = '\0';
  else if (slash) *slash = '\0';
  else snprintf(dir, sizeof dir, ".");
  if (base[0] == '\0')
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "consolidate: output '%s' "
                     "names a directory, not a file", out);
  if (realpath(dir, rdir) == NULL)
    return zs__error(ZS_ERR_IO, "consolidate: output directory '%s': %s", dir,
                     strerror(errno));
  if (realpath(cm->dir, rck) != NULL && strcmp(rdir, rck) == 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "consolidate: output '%s' is "
                     "inside the checkpoint directory '%s'; write it "
                     "elsewhere", out, cm->dir);
  snprintf(dir, sizeof dir, "%s/..", cm->dir);
  if (realpath(dir, rroot) != NULL && strcmp(rdir, rroot) == 0 &&
      (strcmp(base, ZS__CKPT_LATEST) == 0 || base[0] == '.'))
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "consolidate: output '%s' "
                     "would replace a file of the checkpoint root", out);
  /* a checkpoint's own file names, wherever: writing one could destroy
   * another checkpoint (its meta.json or a rank file) */
  if (zs__ckpt_own_name(base) || strcmp(base, ZS__CKPT_LATEST) == 0 ||
      strcmp(base, ".latest.tmp") == 0)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "consolidate: output '%s' has "
                     "the name of a checkpoint's file ('%s'); give the "
                     "safetensors file another name", out, base);
  struct stat sb;
  if (stat(out, &sb) == 0 && !S_ISREG(sb.st_mode))
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "consolidate: output '%s' "
                     "exists and is not a regular file", out);
  return ZS_OK;
}

zs_status zs_checkpoint_consolidate(const char* path, const char* out_file,
                                    zs_dtype dtype, int duplicate_tied) {
  if (path == NULL || out_file == NULL || out_file[0] == '\0')
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "zs_checkpoint_consolidate: NULL or empty path");
  if (dtype != ZS_FLOAT32 && dtype != ZS_BFLOAT16)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "zs_checkpoint_consolidate: "
                     "dtype %s: only fp32 and bf16", zs_dtype_name(dtype));
  const uint16_t probe = 1;
  if (*(const uint8_t*)&probe != 1)
    return zs__error(ZS_ERR_UNSUPPORTED, "zs_checkpoint_consolidate: "
                     "big-endian hosts are not supported");
  zs__ckpt_meta cm;
  zs__ckpt_reader rd = {NULL, NULL};
  zs__ckpt_writer w;
  memset(&w, 0, sizeof w);
  w.fd = -1;
  char* header = NULL;
  char* buf = NULL;
  char tmp[ZS__CKPT_PATH_MAX];
  zs_status st = zs__ckpt_meta_read(path, &cm);
  if (st != ZS_OK) goto cleanup;
  for (int f = -1; f < cm.world; f++) ZS_CHECK(zs__ckpt_verify_file(&cm, f));
  ZS_CHECK(zs__ckpt_reader_open(&rd, &cm));
  ZS_CHECK(zs__st_header(&cm, dtype, duplicate_tied, &header));
  ZS_CHECK(zs__st_check_out(&cm, out_file));
  int n = snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out_file, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof tmp)
    ZS_FAIL(ZS_ERR_INVALID_ARGUMENT, "consolidate: output path too long");
  ZS_CHECK(zs__ckpt_writer_open(&w, tmp)); /* O_EXCL: never over a file */
  size_t hlen = strlen(header);
  const size_t padded = (hlen + 7) / 8 * 8;
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  ZS_CHECK(zs__ckpt_writer_write(&w, len8, 8));
  ZS_CHECK(zs__ckpt_writer_write(&w, header, hlen));
  ZS_CHECK(zs__ckpt_writer_write(&w, "        ", padded - hlen));
  const size_t chunk = (size_t)1 << 18, esz = zs_dtype_size(dtype);
  buf = malloc(chunk * esz);
  if (buf == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "consolidate: buffer");
  for (int i = 0; i < cm.ntensors; i++) {
    const zs__ckpt_tensor* t = &cm.tensors[i];
    if (!zs__stored(t, duplicate_tied)) continue;
    for (size_t e = 0; e < t->numel; e += chunk) {
      size_t c = t->numel - e < chunk ? t->numel - e : chunk;
      ZS_CHECK(zs__ckpt_read_weights(&rd, i, e, c, dtype, buf));
      ZS_CHECK(zs__ckpt_writer_write(&w, buf, c * esz));
    }
  }
  st = zs__ckpt_writer_finish(&w, NULL);
  if (st != ZS_OK) {
    unlink(tmp);
    goto cleanup;
  }
  if (rename(tmp, out_file) != 0) {
    st = zs__error(ZS_ERR_IO, "consolidate: cannot rename '%s' to '%s': %s",
                   tmp, out_file, strerror(errno));
    unlink(tmp);
  }
cleanup:
  if (st != ZS_OK && w.fd >= 0) zs__ckpt_writer_abort(&w);
  if (rd.fds != NULL) zs__ckpt_reader_close(&rd);
  zs__ckpt_meta_free(&cm);
  free(header);
  free(buf);
  return st;
}
