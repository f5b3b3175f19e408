/*
 * ckpt_format.c — the checkpoint format (ckpt_format.h): metadata to and from JSON
 * (cJSON), checksums (xxHash64 from libxxhash), positioned reads across
 * rank files, and durable file writes (write, fsync, directory fsync).
 */
#define _GNU_SOURCE
#include "runtime/ckpt/ckpt_format.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "optim/convert.h"
#include "runtime/core/core.h"

/* ==== Names and paths ===================================================== */

void zs__ckpt_rank_file(int rank, char* buf, size_t cap) {
  snprintf(buf, cap, "rank-%05d.bin", rank);
}

void zs__ckpt_blob_file(int rank, char* buf, size_t cap) {
  snprintf(buf, cap, "rank-%05d.blob", rank);
}

zs_status zs__ckpt_join(char* out, size_t cap, const char* a, const char* b) {
  int n = snprintf(out, cap, "%s/%s", a, b);
  if (n < 0 || (size_t)n >= cap)
    return zs__error(ZS_ERR_INVALID_ARGUMENT,
                     "checkpoint path '%s/%s' is longer than %zu bytes", a, b,
                     cap - 1);
  return ZS_OK;
}

static int zs__dtype_from_name(const char* s, zs_dtype* out) {
  for (int d = 0; d < ZS_DTYPE_COUNT; d++)
    if (strcmp(s, zs_dtype_name((zs_dtype)d)) == 0) {
      *out = (zs_dtype)d;
      return 1;
    }
  return 0;
}

/* ==== Whole-file helpers ================================================== */

/* Reads a whole (small) file of at most `max` bytes into a NUL-terminated
 * malloc'd buffer; a larger one is CORRUPT, refused before reading (a
 * damaged or wrong file must not take every rank's memory). */
static zs_status zs__read_whole(const char* path, size_t max, char** out,
                                size_t* bytes) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd < 0)
    return zs__error(ZS_ERR_IO, "checkpoint: cannot open '%s': %s", path,
                     strerror(errno));
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return zs__error(ZS_ERR_CORRUPT, "checkpoint: '%s' is not a regular file",
                     path);
  }
  if ((uint64_t)sb.st_size > (uint64_t)max) {
    close(fd);
    return zs__error(ZS_ERR_CORRUPT, "checkpoint: '%s' is %lld bytes, more "
                     "than such a file can be (%zu): it is damaged or not a "
                     "checkpoint's", path, (long long)sb.st_size, max);
  }
  FILE* f = fdopen(fd, "rb");
  if (f == NULL) {
    close(fd);
    return zs__error(ZS_ERR_IO, "checkpoint: cannot open '%s': %s", path,
                     strerror(errno));
  }
  zs_status st = ZS_OK;
  size_t cap = 4096, n = 0;
  char* buf = malloc(cap);
  while (buf != NULL) {
    if (n + 1 >= cap) {
      char* b2 = realloc(buf, cap * 2);
      if (b2 == NULL) break;
      buf = b2;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - n - 1, f);
    n += k;
    if (k == 0) break;
  }
  if (buf == NULL || n + 1 >= cap) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint: reading '%s'", path);
  } else if (ferror(f)) {
    st = zs__error(ZS_ERR_IO, "checkpoint: reading '%s': %s", path,
                   strerror(errno));
  }
  fclose(f);
  if (st != ZS_OK) {
    free(buf);
    return st;
  }
  buf[n] = '\0';
  *out = buf;
  if (bytes) *bytes = n;
  return ZS_OK;
}

static int zs__is_file(const char* path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ==== JSON helpers ======================================================== */

/* Reads an integral number in [lo, hi] (exact up to 2^53) from obj[key]. */
static zs_status zs__j_int(const char* file, const cJSON* obj, const char* key,
                           double lo, double hi, double* out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(v))
    return zs__error(ZS_ERR_CORRUPT, "checkpoint metadata '%s': field '%s' "
                     "is missing or not a number", file, key);
  double d = v->valuedouble;
  if (!(d >= lo && d <= hi) || d != (double)(int64_t)d ||
      d > 9007199254740992.0)
    return zs__error(ZS_ERR_CORRUPT, "checkpoint metadata '%s': field '%s' = "
                     "%.17g is not an integer in [%.0f, %.0f]", file, key, d,
                     lo, hi);
  *out = d;
  return ZS_OK;
}

static zs_status zs__j_str(const char* file, const cJSON* obj, const char* key,
                           const char** out) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsString(v))
    return zs__error(ZS_ERR_CORRUPT, "checkpoint metadata '%s': field '%s' "
                     "is missing or not a string", file, key);
  *out = v->valuestring;
  return ZS_OK;
}

static zs_status zs__j_hex(const char* file, const cJSON* obj, const char* key,
                           uint64_t* out) {
  const char* s = NULL;
  zs_status st = zs__j_str(file, obj, key, &s);
  if (st != ZS_OK) return st;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 16);
  if (strlen(s) != 16 || errno != 0 || end == NULL || *end != '\0')
    return zs__error(ZS_ERR_CORRUPT, "checkpoint metadata '%s': field '%s' = "
                     "'%s' is not 16 hex digits", file, key, s);
  *out = (uint64_t)v;
  return ZS_OK;
}

static void zs__hex(uint64_t v, char buf[17]) {
  snprintf(buf, 17, "%016llx", (unsigned long long)v);
}

/* ==== Metadata: write ===================================================== */

#define ZS__J(expr)                \
  do {                             \
    if ((expr) == NULL) goto oom;  \
  } while (0)

zs_status zs__ckpt_meta_json(const zs__ckpt_meta* m, char** out) {
  *out = NULL;
  char hex[17], fname[64];
  cJSON* root = cJSON_CreateObject();
  if (root == NULL) goto oom;
  ZS__J(cJSON_AddStringToObject(root, "format", ZS__CKPT_FORMAT));
  ZS__J(cJSON_AddNumberToObject(root, "version", m->version));
  ZS__J(cJSON_AddStringToObject(root, "library", zs_version_string()));
  ZS__J(cJSON_AddNumberToObject(root, "world_size", m->world));
  ZS__J(cJSON_AddNumberToObject(root, "stage", m->stage));
  ZS__J(cJSON_AddStringToObject(root, "optimizer", m->optimizer));
  ZS__J(cJSON_AddNumberToObject(root, "optimizer_states", m->nstates));
  ZS__J(cJSON_AddNumberToObject(root, "iteration", (double)m->iteration));
  ZS__J(cJSON_AddNumberToObject(root, "steps_called", (double)m->steps_called));
  ZS__J(cJSON_AddNumberToObject(root, "steps_applied", (double)m->steps_applied));
  ZS__J(cJSON_AddNumberToObject(root, "grad_accum_steps", m->grad_accum_steps));
  cJSON* ls = cJSON_AddObjectToObject(root, "loss_scaler");
  ZS__J(ls);
  ZS__J(cJSON_AddNumberToObject(ls, "mode", m->scaler_mode));
  ZS__J(cJSON_AddNumberToObject(ls, "scale", m->loss_scale));
  ZS__J(cJSON_AddNumberToObject(ls, "clean_steps", m->scale_clean_steps));
  ZS__J(cJSON_AddNumberToObject(ls, "hysteresis", m->scale_hysteresis));

  cJSON* units = cJSON_AddArrayToObject(root, "units");
  ZS__J(units);
  for (int i = 0; i < m->nunits; i++) {
    const zs__ckpt_unit* u = &m->units[i];
    cJSON* o = cJSON_CreateObject();
    ZS__J(o);
    cJSON_AddItemToArray(units, o);
    ZS__J(cJSON_AddStringToObject(o, "name", u->name));
    ZS__J(cJSON_AddStringToObject(o, "dtype", zs_dtype_name(u->dtype)));
    ZS__J(cJSON_AddStringToObject(o, "weights_dtype", zs_dtype_name(u->wdtype)));
    ZS__J(cJSON_AddNumberToObject(o, "used", (double)u->used));
    ZS__J(cJSON_AddNumberToObject(o, "padded", (double)u->padded));
    ZS__J(cJSON_AddNumberToObject(o, "shard", (double)u->shard));
    ZS__J(cJSON_AddNumberToObject(o, "states", u->nstates));
    ZS__J(cJSON_AddNumberToObject(o, "weights_offset", (double)u->field_offset[0]));
    cJSON* so = cJSON_AddArrayToObject(o, "state_offsets");
    ZS__J(so);
    for (int k = 0; k < u->nstates; k++) {
      cJSON* n = cJSON_CreateNumber((double)u->field_offset[1 + k]);
      ZS__J(n);
      cJSON_AddItemToArray(so, n);
    }
  }

  cJSON* tensors = cJSON_AddArrayToObject(root, "tensors");
  ZS__J(tensors);
  for (int i = 0; i < m->ntensors; i++) {
    const zs__ckpt_tensor* t = &m->tensors[i];
    cJSON* o = cJSON_CreateObject();
    ZS__J(o);
    cJSON_AddItemToArray(tensors, o);
    ZS__J(cJSON_AddStringToObject(o, "name", t->name));
    ZS__J(cJSON_AddNumberToObject(o, "unit", t->unit));
    cJSON* sh = cJSON_AddArrayToObject(o, "shape");
    ZS__J(sh);
    for (int d = 0; d < t->ndim; d++) {
      cJSON* n = cJSON_CreateNumber((double)t->shape[d]);
      ZS__J(n);
      cJSON_AddItemToArray(sh, n);
    }
    ZS__J(cJSON_AddStringToObject(o, "dtype", zs_dtype_name(t->dtype)));
    ZS__J(cJSON_AddNumberToObject(o, "numel", (double)t->numel));
    if (t->tied_to >= 0) {
      ZS__J(cJSON_AddStringToObject(o, "tied_to", m->tensors[t->tied_to].name));
    } else {
      ZS__J(cJSON_AddNumberToObject(o, "offset", (double)t->offset));
    }
    ZS__J(cJSON_AddBoolToObject(o, "frozen", t->frozen));
    ZS__J(cJSON_AddNumberToObject(o, "group", t->group));
    ZS__J(cJSON_AddNumberToObject(o, "step", (double)t->step));
  }

  cJSON* files = cJSON_AddArrayToObject(root, "files");
  ZS__J(files);
  for (int r = 0; r < m->world; r++) {
    cJSON* o = cJSON_CreateObject();
    ZS__J(o);
    cJSON_AddItemToArray(files, o);
    zs__ckpt_rank_file(r, fname, sizeof fname);
    ZS__J(cJSON_AddStringToObject(o, "name", fname));
    ZS__J(cJSON_AddNumberToObject(o, "bytes", (double)m->rank_bytes));
    zs__hex(m->rank_xxh64[r], hex);
    ZS__J(cJSON_AddStringToObject(o, "xxh64", hex));
  }
  cJSON* ex = cJSON_AddObjectToObject(root, "extras");
  ZS__J(ex);
  ZS__J(cJSON_AddStringToObject(ex, "name", ZS__CKPT_EXTRAS));
  ZS__J(cJSON_AddNumberToObject(ex, "bytes", (double)m->extras_bytes));
  zs__hex(m->extras_xxh64, hex);
  ZS__J(cJSON_AddStringToObject(ex, "xxh64", hex));
  cJSON* groups = cJSON_AddArrayToObject(root, "groups");
  ZS__J(groups);
  for (int g = 0; g < m->ngroups; g++) {
    cJSON* o = cJSON_CreateObject();
    ZS__J(o);
    cJSON_AddItemToArray(groups, o);
    ZS__J(cJSON_AddNumberToObject(o, "lr", m->group_lr[g]));
    ZS__J(cJSON_AddNumberToObject(o, "weight_decay", m->group_wd[g]));
  }
  cJSON* blobs = cJSON_AddArrayToObject(root, "rank_blobs");
  ZS__J(blobs);
  for (int r = 0; r < m->world; r++) {
    cJSON* o = cJSON_CreateObject();
    ZS__J(o);
    cJSON_AddItemToArray(blobs, o);
    zs__ckpt_blob_file(r, fname, sizeof fname);
    ZS__J(cJSON_AddStringToObject(o, "name", fname));
    ZS__J(cJSON_AddNumberToObject(o, "bytes", (double)m->blob_bytes[r]));
    zs__hex(m->blob_xxh64[r], hex);
    ZS__J(cJSON_AddStringToObject(o, "xxh64", hex));
  }

  *out = cJSON_Print(root);
  cJSON_Delete(root);
  if (*out == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint: printing metadata");
  return ZS_OK;
oom:
  cJSON_Delete(root);
  return zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint: building metadata");
}

/* ==== Metadata: read ====================================================== */

void zs__ckpt_meta_free(zs__ckpt_meta* m) {
  if (m == NULL) return;
  free(m->units);
  free(m->tensors);
  free(m->rank_xxh64);
  free(m->group_lr);
  free(m->group_wd);
  free(m->blob_bytes);
  free(m->blob_xxh64);
  m->units = NULL;
  m->tensors = NULL;
  m->rank_xxh64 = NULL;
  m->group_lr = m->group_wd = NULL;
  m->blob_bytes = m->blob_xxh64 = NULL;
}

/* Finds the checkpoint directory: path itself when it has meta.json, else
 * the directory its `latest` names. */
static zs_status zs__resolve(const char* path, char* dir, size_t cap) {
  char p[ZS__CKPT_PATH_MAX];
  zs_status st = zs__ckpt_join(p, sizeof p, path, ZS__CKPT_META);
  if (st != ZS_OK) return st;
  if (zs__is_file(p)) {
    if (strlen(path) >= cap)
      return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint path too long");
    strcpy(dir, path);
    return ZS_OK;
  }
  st = zs__ckpt_join(p, sizeof p, path, ZS__CKPT_LATEST);
  if (st != ZS_OK) return st;
  if (!zs__is_file(p)) {
    struct stat sb;
    if (stat(path, &sb) != 0)
      return zs__error(ZS_ERR_IO, "checkpoint '%s' does not exist", path);
    if (lstat(p, &sb) == 0)
      return zs__error(ZS_ERR_CORRUPT, "checkpoint pointer '%s' is not a "
                       "regular file", p);
    return zs__error(ZS_ERR_IO, "'%s' is not a checkpoint: it has neither %s "
                     "(a checkpoint directory) nor %s (a checkpoint root)",
                     path, ZS__CKPT_META, ZS__CKPT_LATEST);
  }
  char* text = NULL;
  st = zs__read_whole(p, 4096, &text, NULL); /* latest: one name */
  if (st != ZS_OK) return st;
  size_t n = strcspn(text, "\r\n");
  text[n] = '\0';
  int printable = 1;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)text[i] < 0x20 || (unsigned char)text[i] > 0x7e)
      printable = 0;
  if (n == 0 || n > 200 || !printable || strchr(text, '/') != NULL ||
      text[0] == '.') {
    st = zs__error(ZS_ERR_CORRUPT, "checkpoint pointer '%s' does not name a "
                   "checkpoint directory (%s)", p,
                   printable && n <= 200 ? text : "unprintable contents");
  } else {
    st = zs__ckpt_join(dir, cap, path, text);
  }
  /* `latest` names a checkpoint that a crashed save was replacing: the
   * complete copy is the one it had moved aside (.old-NAME), which the next
   * save puts back. */
  char meta[ZS__CKPT_PATH_MAX], old[ZS__CKPT_PATH_MAX], oldname[300];
  if (st == ZS_OK && zs__ckpt_join(meta, sizeof meta, dir, ZS__CKPT_META) ==
                         ZS_OK && !zs__is_file(meta)) {
    snprintf(oldname, sizeof oldname, ".old-%s", text);
    if (zs__ckpt_join(old, sizeof old, path, oldname) == ZS_OK &&
        zs__ckpt_join(meta, sizeof meta, old, ZS__CKPT_META) == ZS_OK &&
        zs__is_file(meta) && strlen(old) < cap) {
      zs__log(ZS_LOG_WARN, "checkpoint '%s' is missing (a save replacing it "
              "was interrupted); using the copy it had moved aside, '%s'",
              dir, old);
      strcpy(dir, old);
    }
  }
  free(text);
  return st;
}

static zs_status zs__parse_meta(const char* file, const cJSON* root,
                                zs__ckpt_meta* m) {
  zs_status st = ZS_OK;
  size_t* unit_end = NULL; /* per unit: where its last listed tensor ends */
  double v;
  const char* s = NULL;
  const cJSON* fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, ZS__CKPT_FORMAT) != 0)
    return zs__error(ZS_ERR_CORRUPT, "'%s' is not ZeroShard checkpoint "
                     "metadata (format is not \"%s\")", file, ZS__CKPT_FORMAT);
  ZS_CHECK(zs__j_int(file, root, "version", 1, 1e9, &v));
  m->version = (int)v;
  if (m->version > ZS__CKPT_VERSION)
    return zs__error(ZS_ERR_UNSUPPORTED, "checkpoint '%s' has format version "
                     "%d; this library (%s) reads up to %d", file, m->version,
                     zs_version_string(), ZS__CKPT_VERSION);
  ZS_CHECK(zs__j_int(file, root, "world_size", 1, 1 << 24, &v));
  m->world = (int)v;
  ZS_CHECK(zs__j_int(file, root, "stage", 0, 3, &v));
  m->stage = (int)v;
  ZS_CHECK(zs__j_str(file, root, "optimizer", &s));
  if (s[0] == '\0' || strlen(s) >= sizeof m->optimizer ||
      (m->version < 2 && strcmp(s, "adamw") != 0 && strcmp(s, "adam") != 0 &&
       strcmp(s, "sgd") != 0))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unknown optimizer "
            "'%s'", file, s);
  snprintf(m->optimizer, sizeof m->optimizer, "%s", s);
  ZS_CHECK(zs__j_int(file, root, "optimizer_states", 0, ZS__CKPT_MAX_STATES, &v));
  m->nstates = (int)v;
  ZS_CHECK(zs__j_int(file, root, "iteration", 0, 9e15, &v));
  m->iteration = (int64_t)v;
  ZS_CHECK(zs__j_int(file, root, "steps_called", 0, 9e15, &v));
  m->steps_called = (int64_t)v;
  ZS_CHECK(zs__j_int(file, root, "steps_applied", 0, 9e15, &v));
  m->steps_applied = (int64_t)v;
  ZS_CHECK(zs__j_int(file, root, "grad_accum_steps", 1, 1e9, &v));
  m->grad_accum_steps = (int)v;
  const cJSON* ls = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler");
  if (!cJSON_IsObject(ls))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': field 'loss_scaler' "
            "is missing", file);
  ZS_CHECK(zs__j_int(file, ls, "mode", 0, 2, &v));
  m->scaler_mode = (int)v;
  const cJSON* sc = cJSON_GetObjectItemCaseSensitive(ls, "scale");
  if (!cJSON_IsNumber(sc) || !(sc->valuedouble > 0))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': loss_scaler.scale is "
            "missing or not positive", file);
  m->loss_scale = sc->valuedouble;
  ZS_CHECK(zs__j_int(file, ls, "clean_steps", 0, 2e9, &v));
  m->scale_clean_steps = (int)v;
  ZS_CHECK(zs__j_int(file, ls, "hysteresis", -2e9, 2e9, &v));
  m->scale_hysteresis = (int)v;

  /* Units. */
  const cJSON* units = cJSON_GetObjectItemCaseSensitive(root, "units");
  if (!cJSON_IsArray(units))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'units' is missing",
            file);
  m->nunits = cJSON_GetArraySize(units);
  m->units = calloc((size_t)m->nunits + 1, sizeof *m->units);
  if (m->units == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "checkpoint metadata");
  uint64_t end = 0; /* bytes of one rank file */
  for (int i = 0; i < m->nunits; i++) {
    const cJSON* o = cJSON_GetArrayItem(units, i);
    zs__ckpt_unit* u = &m->units[i];
    if (!cJSON_IsObject(o))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': units[%d] is not an "
              "object", file, i);
    ZS_CHECK(zs__j_str(file, o, "name", &s));
    snprintf(u->name, sizeof u->name, "%s", s);
    ZS_CHECK(zs__j_str(file, o, "dtype", &s));
    if (!zs__dtype_from_name(s, &u->dtype))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': unknown "
              "dtype '%s'", file, u->name, s);
    ZS_CHECK(zs__j_str(file, o, "weights_dtype", &s));
    if (!zs__dtype_from_name(s, &u->wdtype) || u->wdtype > ZS_FLOAT16)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': bad "
              "weights dtype '%s'", file, u->name, s);
    ZS_CHECK(zs__j_int(file, o, "used", 0, 9e15, &v));
    u->used = (size_t)v;
    ZS_CHECK(zs__j_int(file, o, "padded", 0, 9e15, &v));
    u->padded = (size_t)v;
    ZS_CHECK(zs__j_int(file, o, "shard", 0, 9e15, &v));
    u->shard = (size_t)v;
    if (u->padded != u->shard * (size_t)m->world || u->used > u->padded)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': used %zu, "
              "padded %zu, shard %zu do not fit world size %d", file, u->name,
              u->used, u->padded, u->shard, m->world);
    ZS_CHECK(zs__j_int(file, o, "states", 0, ZS__CKPT_MAX_STATES, &v));
    u->nstates = (int)v;
    ZS_CHECK(zs__j_int(file, o, "weights_offset", 0, 9e15, &v));
    u->field_offset[0] = (uint64_t)v;
    const cJSON* so = cJSON_GetObjectItemCaseSensitive(o, "state_offsets");
    if (!cJSON_IsArray(so) || cJSON_GetArraySize(so) != u->nstates)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': "
              "'state_offsets' does not list %d offsets", file, u->name,
              u->nstates);
    /* Fields follow each other in a rank file, unit after unit. */
    if (u->field_offset[0] != end)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': weights "
              "at byte %llu, expected %llu", file, u->name,
              (unsigned long long)u->field_offset[0], (unsigned long long)end);
    end += (uint64_t)u->shard * zs_dtype_size(u->wdtype);
    for (int k = 0; k < u->nstates; k++) {
      const cJSON* n = cJSON_GetArrayItem(so, k);
      if (!cJSON_IsNumber(n) || n->valuedouble != (double)end)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': unit '%s': state "
                "%d offset is not %llu", file, u->name, k,
                (unsigned long long)end);
      u->field_offset[1 + k] = end;
      end += (uint64_t)u->shard * sizeof(float);
    }
  }

  /* Tensors (ties refer to owners by name: resolved after all are read). */
  const cJSON* tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  if (!cJSON_IsArray(tensors))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'tensors' is missing",
            file);
  m->ntensors = cJSON_GetArraySize(tensors);
  m->tensors = calloc((size_t)m->ntensors + 1, sizeof *m->tensors);
  unit_end = calloc((size_t)m->nunits + 1, sizeof *unit_end);
  if (m->tensors == NULL || unit_end == NULL)
    ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "checkpoint metadata");
  for (int i = 0; i < m->ntensors; i++) {
    const cJSON* o = cJSON_GetArrayItem(tensors, i);
    zs__ckpt_tensor* t = &m->tensors[i];
    if (!cJSON_IsObject(o))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensors[%d] is not "
              "an object", file, i);
    ZS_CHECK(zs__j_str(file, o, "name", &s));
    snprintf(t->name, sizeof t->name, "%s", s);
    ZS_CHECK(zs__j_int(file, o, "unit", 0, m->nunits - 1, &v));
    t->unit = (int)v;
    const cJSON* sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > ZS_MAX_DIMS)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': bad "
              "shape", file, t->name);
    t->ndim = cJSON_GetArraySize(sh);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      const cJSON* n = cJSON_GetArrayItem(sh, d);
      if (!cJSON_IsNumber(n) || n->valuedouble < 0 || n->valuedouble > 9e15 ||
          n->valuedouble != (double)(int64_t)n->valuedouble)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': bad "
                "shape", file, t->name);
      t->shape[d] = (int64_t)n->valuedouble;
      if (__builtin_mul_overflow(numel, (size_t)t->shape[d], &numel) ||
          numel > ((size_t)1 << 53))
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': the "
                "shape's product overflows", file, t->name);
    }
    ZS_CHECK(zs__j_int(file, o, "numel", 0, 9e15, &v));
    t->numel = (size_t)v;
    if (t->numel != numel)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': numel "
              "%zu is not the product of its shape (%zu)", file, t->name,
              t->numel, numel);
    ZS_CHECK(zs__j_str(file, o, "dtype", &s));
    if (!zs__dtype_from_name(s, &t->dtype))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': unknown "
              "dtype '%s'", file, t->name, s);
    const cJSON* fr = cJSON_GetObjectItemCaseSensitive(o, "frozen");
    t->frozen = cJSON_IsTrue(fr);
    ZS_CHECK(zs__j_int(file, o, "group", 0, 1e9, &v));
    t->group = (int)v;
    ZS_CHECK(zs__j_int(file, o, "step", 0, 9e15, &v));
    t->step = (int64_t)v;
    t->tied_to = -1;
    const cJSON* tie = cJSON_GetObjectItemCaseSensitive(o, "tied_to");
    if (tie != NULL) {
      if (!cJSON_IsString(tie))
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s': bad "
                "'tied_to'", file, t->name);
      for (int j = 0; j < i; j++)
        if (strcmp(m->tensors[j].name, tie->valuestring) == 0) t->tied_to = j;
      if (t->tied_to < 0 || m->tensors[t->tied_to].tied_to >= 0)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s' is "
                "tied to '%s', which is not an earlier untied tensor", file,
                t->name, tie->valuestring);
      t->offset = (size_t)-1;
    } else {
      ZS_CHECK(zs__j_int(file, o, "offset", 0, 9e15, &v));
      t->offset = (size_t)v;
      const zs__ckpt_unit* u = &m->units[t->unit];
      if (t->offset > u->used || t->numel > u->used - t->offset)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s' "
                "[%zu, +%zu) is outside unit '%s' (%zu elements)", file,
                t->name, t->offset, t->numel, u->name, u->used);
      /* the layout places a unit's tensors in registration order (the
       * order listed), each after the one before: never overlapping */
      if (t->offset < unit_end[t->unit])
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s' "
                "[%zu, +%zu) overlaps the tensor before it in unit '%s' "
                "(which ends at %zu)", file, t->name, t->offset, t->numel,
                u->name, unit_end[t->unit]);
      unit_end[t->unit] = t->offset + t->numel;
    }
    for (int j = 0; j < i; j++)
      if (strcmp(m->tensors[j].name, t->name) == 0)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': tensor '%s' is "
                "listed twice", file, t->name);
  }

  /* Files. */
  const cJSON* files = cJSON_GetObjectItemCaseSensitive(root, "files");
  if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) != m->world)
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'files' does not list "
            "%d rank files", file, m->world);
  m->rank_xxh64 = calloc((size_t)m->world, sizeof *m->rank_xxh64);
  if (m->rank_xxh64 == NULL) ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "checkpoint metadata");
  for (int r = 0; r < m->world; r++) {
    const cJSON* o = cJSON_GetArrayItem(files, r);
    char want[64];
    if (!cJSON_IsObject(o))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': files[%d] is not an "
              "object", file, r);
    zs__ckpt_rank_file(r, want, sizeof want);
    ZS_CHECK(zs__j_str(file, o, "name", &s));
    if (strcmp(s, want) != 0)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': file %d is '%s', "
              "expected '%s'", file, r, s, want);
    ZS_CHECK(zs__j_int(file, o, "bytes", 0, 9e15, &v));
    if ((uint64_t)v != end)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': %s has %.0f bytes, "
              "the units need %llu", file, want, v, (unsigned long long)end);
    ZS_CHECK(zs__j_hex(file, o, "xxh64", &m->rank_xxh64[r]));
  }
  m->rank_bytes = end;
  const cJSON* ex = cJSON_GetObjectItemCaseSensitive(root, "extras");
  if (!cJSON_IsObject(ex))
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'extras' is missing",
            file);
  ZS_CHECK(zs__j_int(file, ex, "bytes", 0, 9e15, &v));
  m->extras_bytes = (uint64_t)v;
  ZS_CHECK(zs__j_hex(file, ex, "xxh64", &m->extras_xxh64));
  if (m->version >= 2) { /* the groups' rates, the rank blobs */
    const cJSON* groups = cJSON_GetObjectItemCaseSensitive(root, "groups");
    if (!cJSON_IsArray(groups))
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'groups' is missing",
              file);
    m->ngroups = cJSON_GetArraySize(groups);
    m->group_lr = calloc((size_t)m->ngroups + 1, sizeof *m->group_lr);
    m->group_wd = calloc((size_t)m->ngroups + 1, sizeof *m->group_wd);
    m->blob_bytes = calloc((size_t)m->world, sizeof *m->blob_bytes);
    m->blob_xxh64 = calloc((size_t)m->world, sizeof *m->blob_xxh64);
    if (!m->group_lr || !m->group_wd || !m->blob_bytes || !m->blob_xxh64)
      ZS_FAIL(ZS_ERR_OUT_OF_MEMORY, "checkpoint metadata");
    for (int g = 0; g < m->ngroups; g++) {
      const cJSON* o = cJSON_GetArrayItem(groups, g);
      const cJSON* lr = cJSON_GetObjectItemCaseSensitive(o, "lr");
      const cJSON* wd = cJSON_GetObjectItemCaseSensitive(o, "weight_decay");
      if (!cJSON_IsNumber(lr) || !(lr->valuedouble >= 0) ||
          !cJSON_IsNumber(wd) || !(wd->valuedouble >= 0))
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': groups[%d] needs "
                "a non-negative 'lr' and 'weight_decay'", file, g);
      m->group_lr[g] = lr->valuedouble;
      m->group_wd[g] = wd->valuedouble;
    }
    const cJSON* blobs = cJSON_GetObjectItemCaseSensitive(root, "rank_blobs");
    if (!cJSON_IsArray(blobs) || cJSON_GetArraySize(blobs) != m->world)
      ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': 'rank_blobs' does "
              "not list %d files", file, m->world);
    for (int r = 0; r < m->world; r++) {
      const cJSON* o = cJSON_GetArrayItem(blobs, r);
      char want[64];
      zs__ckpt_blob_file(r, want, sizeof want);
      ZS_CHECK(zs__j_str(file, o, "name", &s));
      if (strcmp(s, want) != 0)
        ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s': rank blob %d is "
                "'%s', expected '%s'", file, r, s, want);
      ZS_CHECK(zs__j_int(file, o, "bytes", 0, 9e15, &v));
      m->blob_bytes[r] = (uint64_t)v;
      ZS_CHECK(zs__j_hex(file, o, "xxh64", &m->blob_xxh64[r]));
    }
  }
cleanup:
  free(unit_end);
  return st;
}

zs_status zs__ckpt_meta_read(const char* path, zs__ckpt_meta* m) {
  memset(m, 0, sizeof *m);
  if (path == NULL || path[0] == '\0')
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint path is empty");
  zs_status st = zs__resolve(path, m->dir, sizeof m->dir);
  if (st != ZS_OK) return st;
  char file[ZS__CKPT_PATH_MAX], sumfile[ZS__CKPT_PATH_MAX];
  char *text = NULL, *sum = NULL;
  cJSON* root = NULL;
  size_t n = 0;
  ZS_CHECK(zs__ckpt_join(file, sizeof file, m->dir, ZS__CKPT_META));
  ZS_CHECK(zs__ckpt_join(sumfile, sizeof sumfile, m->dir, ZS__CKPT_META_SUM));
  ZS_CHECK(zs__read_whole(file, ZS__CKPT_META_MAX, &text, &n));
  ZS_CHECK(zs__read_whole(sumfile, 4096, &sum, NULL)); /* 16 hex digits */
  char hex[17];
  zs__hex((uint64_t)XXH64(text, n, 0), hex);
  if (strspn(sum, "0123456789abcdef") < 16)
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata's checksum file '%s' does "
            "not hold 16 hex digits: the file is damaged", sumfile);
  if (strncmp(sum, hex, 16) != 0)
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s' does not match its "
            "checksum in '%s' (xxh64 %s, recorded %.16s): the file is damaged",
            file, sumfile, hex, sum);
  root = cJSON_ParseWithLength(text, n);
  if (root == NULL)
    ZS_FAIL(ZS_ERR_CORRUPT, "checkpoint metadata '%s' is not valid JSON", file);
  ZS_CHECK(zs__parse_meta(file, root, m));
cleanup:
  cJSON_Delete(root);
  free(text);
  free(sum);
  return st;
}

/* ==== Verification and reads ============================================= */

zs_status zs__ckpt_verify_file(const zs__ckpt_meta* m, int file) {
  char name[64], path[ZS__CKPT_PATH_MAX];
  uint64_t want_bytes, want_sum;
  if (file < 0) {
    snprintf(name, sizeof name, "%s", ZS__CKPT_EXTRAS);
    want_bytes = m->extras_bytes;
    want_sum = m->extras_xxh64;
  } else if (file >= m->world) {
    if (m->blob_bytes == NULL || file >= 2 * m->world)
      return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint '%s' has no rank "
                       "blob %d (format version %d, %d ranks)", m->dir,
                       file - m->world, m->version, m->world);
    zs__ckpt_blob_file(file - m->world, name, sizeof name);
    want_bytes = m->blob_bytes[file - m->world];
    want_sum = m->blob_xxh64[file - m->world];
  } else {
    zs__ckpt_rank_file(file, name, sizeof name);
    want_bytes = m->rank_bytes;
    want_sum = m->rank_xxh64[file];
  }
  zs_status st = zs__ckpt_join(path, sizeof path, m->dir, name);
  if (st != ZS_OK) return st;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return zs__error(ZS_ERR_IO, "checkpoint file '%s' cannot be opened: %s%s",
                     path, strerror(errno),
                     errno == ENOENT && file >= 0 ? " (a rank file is missing)"
                                                  : "");
  XXH64_state_t* h = XXH64_createState();
  char* buf = malloc(1 << 20);
  struct stat sb;
  uint64_t total = 0;
  if (h == NULL || buf == NULL) {
    st = zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint: verifying '%s'", path);
    goto done;
  }
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    st = zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s' is not a regular "
                   "file", path);
    goto done;
  }
  if ((uint64_t)sb.st_size != want_bytes) {
    st = zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s' has %lld bytes, the "
                   "metadata says %llu (truncated or replaced)", path,
                   (long long)sb.st_size, (unsigned long long)want_bytes);
    goto done;
  }
  XXH64_reset(h, 0);
  for (;;) {
    ssize_t k = read(fd, buf, 1 << 20);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      st = zs__error(ZS_ERR_IO, "checkpoint file '%s': read error at byte "
                     "%llu: %s", path, (unsigned long long)total,
                     strerror(errno));
      goto done;
    }
    if (k == 0) break;
    XXH64_update(h, buf, (size_t)k);
    total += (uint64_t)k;
  }
  if (total != want_bytes) {
    st = zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s': read %llu bytes, "
                   "expected %llu", path, (unsigned long long)total,
                   (unsigned long long)want_bytes);
  } else if (XXH64_digest(h) != want_sum) {
    st = zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s' does not match its "
                   "checksum (xxh64 %016llx, metadata %016llx): the file is "
                   "damaged", path, (unsigned long long)XXH64_digest(h),
                   (unsigned long long)want_sum);
  }
done:
  free(buf);
  XXH64_freeState(h);
  close(fd);
  return st;
}

zs_status zs__ckpt_reader_open(zs__ckpt_reader* r, const zs__ckpt_meta* m) {
  r->meta = m;
  r->fds = malloc((size_t)m->world * sizeof *r->fds);
  if (r->fds == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint reader");
  for (int i = 0; i < m->world; i++) r->fds[i] = -1;
  return ZS_OK;
}

void zs__ckpt_reader_close(zs__ckpt_reader* r) {
  if (r->fds != NULL)
    for (int i = 0; i < r->meta->world; i++)
      if (r->fds[i] >= 0) close(r->fds[i]);
  free(r->fds);
  r->fds = NULL;
}

static zs_status zs__rank_path(const zs__ckpt_meta* m, int rank, char* path,
                               size_t cap) {
  char name[64];
  zs__ckpt_rank_file(rank, name, sizeof name);
  return zs__ckpt_join(path, cap, m->dir, name);
}

zs_status zs__ckpt_read(zs__ckpt_reader* r, int unit, int field, size_t begin,
                        size_t count, void* out) {
  const zs__ckpt_meta* m = r->meta;
  if (unit < 0 || unit >= m->nunits)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint read: unit %d", unit);
  const zs__ckpt_unit* u = &m->units[unit];
  if (field < 0 || field > u->nstates)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint read: unit '%s' has "
                     "no field %d", u->name, field);
  if (begin > u->padded || count > u->padded - begin)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint read: [%zu, +%zu) "
                     "outside unit '%s'", begin, count, u->name);
  const size_t esz = field == 0 ? zs_dtype_size(u->wdtype) : sizeof(float);
  char* dst = out;
  while (count > 0) {
    const int q = (int)(begin / u->shard);
    const size_t in_shard = begin - (size_t)q * u->shard;
    size_t n = u->shard - in_shard;
    if (n > count) n = count;
    char path[ZS__CKPT_PATH_MAX];
    zs_status st = zs__rank_path(m, q, path, sizeof path);
    if (st != ZS_OK) return st;
    if (r->fds[q] < 0) {
      r->fds[q] = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (r->fds[q] < 0)
        return zs__error(ZS_ERR_IO, "checkpoint file '%s' cannot be opened: "
                         "%s", path, strerror(errno));
    }
    uint64_t off = u->field_offset[field] + (uint64_t)in_shard * esz;
    size_t bytes = n * esz, done = 0;
    while (done < bytes) {
      ssize_t k = pread(r->fds[q], dst + done, bytes - done,
                        (off_t)(off + done));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0)
        return zs__error(ZS_ERR_IO, "checkpoint file '%s': read error at "
                         "byte %llu: %s", path,
                         (unsigned long long)(off + done), strerror(errno));
      if (k == 0)
        return zs__error(ZS_ERR_CORRUPT, "checkpoint file '%s' is truncated: "
                         "no data at byte %llu (needed %zu bytes there)", path,
                         (unsigned long long)(off + done), bytes - done);
      done += (size_t)k;
    }
    dst += bytes;
    begin += n;
    count -= n;
  }
  return ZS_OK;
}

zs_status zs__ckpt_read_weights(zs__ckpt_reader* r, int tensor, size_t first,
                                size_t count, zs_dtype dtype, void* out) {
  const zs__ckpt_meta* m = r->meta;
  const zs__ckpt_tensor* t = &m->tensors[tensor];
  if (t->tied_to >= 0) t = &m->tensors[t->tied_to];
  const zs__ckpt_unit* u = &m->units[t->unit];
  if (first > t->numel || count > t->numel - first)
    return zs__error(ZS_ERR_INVALID_ARGUMENT, "checkpoint read: [%zu, +%zu) "
                     "outside tensor '%s'", first, count, t->name);
  if (u->wdtype == dtype)
    return zs__ckpt_read(r, t->unit, 0, t->offset + first, count, out);
  const size_t chunk = 1 << 18; /* elements per staging pass */
  const size_t esz = zs_dtype_size(u->wdtype), osz = zs_dtype_size(dtype);
  char* stage = malloc(chunk * esz);
  if (stage == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint read staging");
  zs_status st = ZS_OK;
  for (size_t i = 0; i < count && st == ZS_OK; i += chunk) {
    size_t n = count - i < chunk ? count - i : chunk;
    st = zs__ckpt_read(r, t->unit, 0, t->offset + first + i, n, stage);
    if (st == ZS_OK)
      st = zs_convert((char*)out + i * osz, dtype, stage, u->wdtype, n);
  }
  free(stage);
  return st;
}

/* ==== Writing ============================================================= */

zs_status zs__ckpt_writer_open(zs__ckpt_writer* w, const char* path) {
  memset(w, 0, sizeof *w);
  w->fd = -1;
  snprintf(w->path, sizeof w->path, "%s", path);
  w->hash = XXH64_createState();
  if (w->hash == NULL)
    return zs__error(ZS_ERR_OUT_OF_MEMORY, "checkpoint writer for '%s'", path);
  XXH64_reset((XXH64_state_t*)w->hash, 0);
  w->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    zs_status st = zs__error(ZS_ERR_IO, "checkpoint: cannot create '%s': %s",
                             path, strerror(errno));
    XXH64_freeState((XXH64_state_t*)w->hash);
    w->hash = NULL;
    return st;
  }
  return ZS_OK;
}

zs_status zs__ckpt_writer_write(zs__ckpt_writer* w, const void* data,
                                size_t bytes) {
  const char* p = data;
  size_t done = 0;
  while (done < bytes) {
    ssize_t k = write(w->fd, p + done, bytes - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return zs__error(ZS_ERR_IO, "checkpoint: writing '%s' at byte %llu: %s",
                       w->path, (unsigned long long)(w->bytes + done),
                       k < 0 ? strerror(errno) : "no progress");
    done += (size_t)k;
  }
  XXH64_update((XXH64_state_t*)w->hash, data, bytes);
  w->bytes += bytes;
  return ZS_OK;
}

zs_status zs__ckpt_writer_finish(zs__ckpt_writer* w, uint64_t* xxh64) {
  zs_status st = ZS_OK;
  if (fsync(w->fd) != 0)
    st = zs__error(ZS_ERR_IO, "checkpoint: fsync of '%s' failed: %s", w->path,
                   strerror(errno));
  if (close(w->fd) != 0 && st == ZS_OK)
    st = zs__error(ZS_ERR_IO, "checkpoint: closing '%s' failed: %s", w->path,
                   strerror(errno));
  w->fd = -1;
  if (xxh64) *xxh64 = XXH64_digest((XXH64_state_t*)w->hash);
  XXH64_freeState((XXH64_state_t*)w->hash);
  w->hash = NULL;
  return st;
}

void zs__ckpt_writer_abort(zs__ckpt_writer* w) {
  if (w->fd >= 0) {
    close(w->fd);
    unlink(w->path);
  }
  w->fd = -1;
  if (w->hash) XXH64_freeState((XXH64_state_t*)w->hash);
  w->hash = NULL;
}

zs_status zs__ckpt_write_small(const char* path, const void* data,
                               size_t bytes, uint64_t* xxh64) {
  zs__ckpt_writer w;
  zs_status st = zs__ckpt_writer_open(&w, path);
  if (st != ZS_OK) return st;
  st = zs__ckpt_writer_write(&w, data, bytes);
  if (st != ZS_OK) {
    zs__ckpt_writer_abort(&w);
    return st;
  }
  return zs__ckpt_writer_finish(&w, xxh64);
}

zs_status zs__ckpt_fsync_dir(const char* path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return zs__error(ZS_ERR_IO, "checkpoint: cannot open directory '%s': %s",
                     path, strerror(errno));
  zs_status st = ZS_OK;
  if (fsync(fd) != 0)
    st = zs__error(ZS_ERR_IO, "checkpoint: fsync of directory '%s' failed: "
                   "%s", path, strerror(errno));
  close(fd);
  return st;
}

/* A name this format writes into a checkpoint directory. */
int zs__ckpt_own_name(const char* n) {
  if (strcmp(n, ZS__CKPT_META) == 0 || strcmp(n, ZS__CKPT_META_SUM) == 0 ||
      strcmp(n, ZS__CKPT_EXTRAS) == 0)
    return 1;
  int r = -1, len = 0;
  if (sscanf(n, "rank-%5d.bin%n", &r, &len) == 1 && r >= 0 &&
      (size_t)len == strlen(n))
    return 1;
  len = 0;
  return sscanf(n, "rank-%5d.blob%n", &r, &len) == 1 && r >= 0 &&
         (size_t)len == strlen(n);
}

zs_status zs__ckpt_remove_dir(const char* path) {
  /* Two passes: every entry is checked before anything is removed, so a
   * directory holding a file that is not a checkpoint's stays whole (a
   * half-removed checkpoint would be neither the user's nor loadable). */
  for (int pass = 0; pass < 2; pass++) {
    DIR* d = opendir(path);
    if (d == NULL) {
      if (errno == ENOENT && pass == 0) return ZS_OK;
      return zs__error(ZS_ERR_IO, "checkpoint: cannot open directory '%s': %s",
                       path, strerror(errno));
    }
    zs_status st = ZS_OK;
    struct dirent* e;
    while ((e = readdir(d)) != NULL && st == ZS_OK) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char p[ZS__CKPT_PATH_MAX];
      st = zs__ckpt_join(p, sizeof p, path, e->d_name);
      if (st != ZS_OK) break;
      if (!zs__ckpt_own_name(e->d_name)) {
        st = zs__error(ZS_ERR_IO, "checkpoint: not removing '%s': '%s' is not "
                       "a checkpoint file (a checkpoint directory holds only "
                       "meta.json, meta.json.xxh64, extras.bin, rank-*.bin); "
                       "move it out of the way", path, e->d_name);
      } else if (pass == 1 && unlink(p) != 0) {
        st = zs__error(ZS_ERR_IO, "checkpoint: cannot remove '%s': %s", p,
                       strerror(errno));
      }
    }
    closedir(d);
    if (st != ZS_OK) return st;
  }
  if (rmdir(path) != 0)
    return zs__error(ZS_ERR_IO, "checkpoint: cannot remove directory '%s': %s",
                     path, strerror(errno));
  return ZS_OK;
}

void (*zs__ckpt_fault_hook)(int rank, const char* what) = NULL;

void zs__ckpt_crash_point(int rank, const char* what) {
  if (zs__ckpt_fault_hook != NULL) zs__ckpt_fault_hook(rank, what);
}
