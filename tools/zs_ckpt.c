/*
 * ckpt.c — `tools/zs consolidate` and `tools/zs inspect`: offline tools over
 * a sharded checkpoint (docs/checkpoint.md). No MPI, no model.
 *
 *   tools/zs consolidate CKPT OUT.safetensors [--dtype fp32|bf16]
 *                       [--duplicate-tied]
 *   tools/zs inspect CKPT [--json] [--verify]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zeroshard.h>

#include "runtime/ckpt/ckpt_format.h"

static const char kUsage[] =
    "usage: zs consolidate CKPT OUT.safetensors [--dtype fp32|bf16] "
    "[--duplicate-tied]\n"
    "       zs inspect CKPT [--json] [--verify]\n"
    "       (tools/zs in a source tree; a flag given twice is refused)\n"
    "CKPT: a checkpoint directory, or a root whose `latest` names one.\n"
    "consolidate: the full weights (fp32 master, or their bf16 rounding),\n"
    "  padding removed; a tied tensor once under its owner's name (listed in\n"
    "  __metadata__ as tied:ALIAS), or twice with --duplicate-tied.\n"
    "inspect: the metadata as a table (--json: meta.json as saved);\n"
    "  --verify also checks every file's size and xxHash64 (exit status 1\n"
    "  if one does not match; with --json its line goes to stderr).\n";

/* The command as the user typed it: "zs inspect", "zs consolidate". */
static const char* g_cmd = "zs";

static int usage_error(const char* msg, const char* arg) {
  fprintf(stderr, "%s: %s%s%s\n%s", g_cmd, msg, arg ? " " : "", arg ? arg : "",
          kUsage);
  return 2;
}

/* --help anywhere: usage on stdout (1); a flag given twice: a usage
 * error (2); else 0. */
static int help_or_repeat(int argc, char** argv, int* rc) {
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(kUsage, stdout);
      *rc = 0;
      return 1;
    }
    if (strncmp(argv[i], "--", 2) != 0) continue;
    for (int k = 0; k < i; k++)
      if (strcmp(argv[k], argv[i]) == 0) {
        fprintf(stderr, "%s: %s given twice (give each flag once)\n%s",
                g_cmd, argv[i], kUsage);
        *rc = 2;
        return 1;
      }
  }
  return 0;
}

static int consolidate(int argc, char** argv) {
  int rc = 0;
  if (help_or_repeat(argc, argv, &rc)) return rc;
  const char *in = NULL, *out = NULL;
  zs_dtype dtype = ZS_FLOAT32;
  int dup = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      const char* d = argv[++i];
      if (strcmp(d, "fp32") == 0) dtype = ZS_FLOAT32;
      else if (strcmp(d, "bf16") == 0) dtype = ZS_BFLOAT16;
      else return usage_error("--dtype: expected fp32 or bf16, got", d);
    } else if (strcmp(argv[i], "--duplicate-tied") == 0) {
      dup = 1;
    } else if (argv[i][0] == '-') {
      return usage_error("unknown flag", argv[i]);
    } else if (in == NULL) {
      in = argv[i];
    } else if (out == NULL) {
      out = argv[i];
    } else {
      return usage_error("unexpected argument", argv[i]);
    }
  }
  if (in == NULL || out == NULL)
    return usage_error("consolidate needs CKPT and OUT", NULL);
  zs_status st = zs_checkpoint_consolidate(in, out, dtype, dup);
  if (st != ZS_OK) {
    fprintf(stderr, "zs %s\n", zs_last_error()); /* "consolidate: ..." */
    return 1;
  }
  printf("wrote %s (%s%s)\n", out, zs_dtype_name(dtype),
         dup ? ", tied tensors duplicated" : "");
  return 0;
}

static void print_shape(const zs__ckpt_tensor* t) {
  printf("[");
  for (int d = 0; d < t->ndim; d++)
    printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
  printf("]");
}

static int inspect(int argc, char** argv) {
  int rc = 0;
  if (help_or_repeat(argc, argv, &rc)) return rc;
  const char* in = NULL;
  int json = 0, verify = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--verify") == 0) verify = 1;
    else if (argv[i][0] == '-') return usage_error("unknown flag", argv[i]);
    else if (in == NULL) in = argv[i];
    else return usage_error("unexpected argument", argv[i]);
  }
  if (in == NULL) return usage_error("inspect needs CKPT", NULL);
  zs__ckpt_meta m;
  zs_status st = zs__ckpt_meta_read(in, &m);
  if (st != ZS_OK) {
    fprintf(stderr, "zs inspect: %s\n", zs_last_error());
    zs__ckpt_meta_free(&m);
    return 1;
  }
  if (json) {
    char path[ZS__CKPT_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", m.dir, ZS__CKPT_META);
    FILE* f = fopen(path, "r");
    int c;
    while (f != NULL && (c = fgetc(f)) != EOF) putchar(c);
    if (f) fclose(f);
    printf("\n");
  } else {
    static const char* kScaler[] = {"none", "static", "dynamic"};
    printf("checkpoint   %s\n", m.dir);
    printf("format       %s version %d\n", ZS__CKPT_FORMAT, m.version);
    printf("saved by     %d ranks at ZeRO stage %d\n", m.world, m.stage);
    printf("optimizer    %s (%d states)\n", m.optimizer, m.nstates);
    printf("iteration    %lld (zs_step calls %lld, optimizer steps applied "
           "%lld, grad_accum_steps %d)\n", (long long)m.iteration,
           (long long)m.steps_called, (long long)m.steps_applied,
           m.grad_accum_steps);
    printf("loss scaler  %s, scale %g, clean steps %d, hysteresis %d\n",
           kScaler[m.scaler_mode], m.loss_scale, m.scale_clean_steps,
           m.scale_hysteresis);
    printf("rank files   %d x %llu bytes; extras %llu bytes\n", m.world,
           (unsigned long long)m.rank_bytes,
           (unsigned long long)m.extras_bytes);
    size_t params = 0;
    printf("\n%-4s %-28s %-6s %-7s %12s %12s %12s %s\n", "unit", "name",
           "dtype", "weights", "used", "padded", "shard", "states");
    for (int i = 0; i < m.nunits; i++) {
      const zs__ckpt_unit* u = &m.units[i];
      printf("%-4d %-28s %-6s %-7s %12zu %12zu %12zu %d\n", i, u->name,
             zs_dtype_name(u->dtype), zs_dtype_name(u->wdtype), u->used,
             u->padded, u->shard, u->nstates);
    }
    printf("\n%-36s %-4s %12s %12s %6s  %s\n", "tensor", "unit", "numel",
           "offset", "step", "shape / notes");
    for (int i = 0; i < m.ntensors; i++) {
      const zs__ckpt_tensor* t = &m.tensors[i];
      if (t->tied_to < 0) params += t->numel;
      printf("%-36s %-4d %12zu ", t->name, t->unit, t->numel);
      if (t->tied_to >= 0) printf("%12s ", "-");
      else printf("%12zu ", t->offset);
      printf("%6lld  ", (long long)t->step);
      print_shape(t);
      if (t->tied_to >= 0) printf(" tied to %s", m.tensors[t->tied_to].name);
      if (t->frozen) printf(" frozen");
      printf("\n");
    }
    printf("\n%zu parameters in %d tensors (%d units)\n", params, m.ntensors,
           m.nunits);
  }
  rc = 0;
  if (verify) {
    for (int f = -1; f < m.world; f++) {
      if (zs__ckpt_verify_file(&m, f) != ZS_OK) {
        fprintf(stderr, "zs inspect: %s\n", zs_last_error());
        rc = 1;
      }
    }
    /* with --json, stdout is the metadata alone (one JSON document) */
    if (rc == 0) fprintf(json ? stderr : stdout, "verified: %d rank files and "
                         "extras match their sizes and xxHash64\n", m.world);
  }
  zs__ckpt_meta_free(&m);
  return rc;
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "consolidate") == 0) {
    g_cmd = "zs consolidate";
    return consolidate(argc - 2, argv + 2);
  }
  if (strcmp(argv[1], "inspect") == 0) {
    g_cmd = "zs inspect";
    return inspect(argc - 2, argv + 2);
  }
  return usage_error("unknown command", argv[1]);
}
