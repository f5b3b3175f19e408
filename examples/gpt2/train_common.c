/*
 * train_common.c — flags, report, progress and memory table, sampling
 * helpers shared by train_plain.c and train_sharded.c.
 */
#define _GNU_SOURCE
#include "examples/gpt2/train_common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ==== Flags ================================================================ */

static const char* const kUsage =
    "flags (defaults in brackets):\n"
    "  --steps K           optimizer steps, up to 10^6 [1000]\n"
    "  --batch B           global batch: sequences per step [16]\n"
    "  --seq T             sequence length [64]\n"
    "  --layers L          transformer blocks [4]\n"
    "  --channels C        channels [128]\n"
    "  --heads H           attention heads, divides C [4]\n"
    "  --lr X              AdamW learning rate [1e-3]\n"
    "  --weight-decay X    AdamW weight decay of matrices [0]\n"
    "  --seed S            data order and initialization [1337]\n"
    "  --eval-every K      steps between val evaluations, 0: end only [100]\n"
    "  --val-batches K     val sequences = K * batch [4]\n"
    "  --log-every K       steps between progress lines [10]\n"
    "  --sample-bytes K    bytes of text sampled at the end [200]\n"
    "  --data PATH         byte-level text [data/tinyshakespeare.txt]\n"
    "  --report FILE       write a JSON report\n"
    "  --quiet             no progress lines\n";

static void gpt2__defaults(gpt2_args* a) {
  memset(a, 0, sizeof *a);
  a->stage = 3;
  a->steps = 1000;
  a->seed = 1337;
  a->batch = 16;
  a->seq = 64;
  a->layers = 4;
  a->channels = 128;
  a->heads = 4;
  a->lr = 1e-3;
  a->weight_decay = 0.0;
  a->eval_every = 100;
  a->val_batches = 4;
  a->log_every = 10;
  a->sample_bytes = 200;
  a->prefetch_depth = 2;
  a->persistence_threshold = -1;
  a->collective_timeout = -1;
  a->heartbeat_timeout = -1;
  a->host_collectives = -1;
  a->nvme_param_buffers = 5;
  a->bucket_elements = 1L << 22;
  a->progress_thread = 1;
  a->dtype = 0;
  a->grad_accum = 1;
  a->clip = 0.0;
  a->data = "data/tinyshakespeare.txt";
}

/* Parses an integer flag value in [lo, hi]. */
static int gpt2__int(const char* flag, const char* v, long lo, long hi,
                     int* out, char* err, size_t cap) {
  char* end = NULL;
  errno = 0;
  long x = v != NULL ? strtol(v, &end, 10) : 0;
  if (v == NULL || *v == '\0' || *end != '\0' || errno != 0 || x < lo ||
      x > hi) {
    snprintf(err, cap, "%s: expected an integer in [%ld, %ld], got '%s'", flag,
             lo, hi, v != NULL ? v : "(missing)");
    return -1;
  }
  *out = (int)x;
  return 0;
}

static int gpt2__double(const char* flag, const char* v, double lo, double hi,
                        double* out, char* err, size_t cap) {
  char* end = NULL;
  errno = 0;
  double x = v != NULL ? strtod(v, &end) : 0;
  if (v == NULL || *v == '\0' || *end != '\0' || errno != 0 || !isfinite(x) ||
      x < lo || x > hi) {
    snprintf(err, cap, "%s: expected a number in [%g, %g], got '%s'", flag, lo,
             hi, v != NULL ? v : "(missing)");
    return -1;
  }
  *out = x;
  return 0;
}

int gpt2_args_parse(int argc, char** argv, int sharded, gpt2_args* a,
                    char* err, size_t cap, int print_help) {
  gpt2__defaults(a);
  int sub_group_given = 0, param_buffers_given = 0;
  const char* seen[128]; /* the flags so far: a repeated one is refused */
  int nseen = 0;
  for (int i = 1; i < argc; i++) {
    const char* f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int rc = 0, takes = 1;
    if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0) {
      if (print_help)
        printf("usage: %s [flags]\n%s%s", argv[0],
               sharded ? "  --stage S           ZeRO stage 0..3 [3]\n"
                         "  --checkpoint-activations\n"
                         "                      recompute each block's "
                         "activations in backward\n"
                         "  --checkpoint-verify with --checkpoint-activations: "
                         "fail a backward whose recompute\n"
                         "                      differs from the first "
                         "forward by a bit (a debugging aid)\n"
                         "  --prefetch-depth N  stage 3: units all-gathered "
                         "ahead of use, 0..64 [2]\n"
                         "  --collective-timeout S\n"
                         "                      seconds a collective waits "
                         "for ranks that are alive but elsewhere [1800]\n"
                         "  --heartbeat-timeout S\n"
                         "                      seconds a rank may be silent "
                         "(stopped, hung) before the others fail naming it;\n"
                         "                      0: off [30] "
                         "(docs/running.md)\n"
                         "  --host-collectives M auto|shm|mpi: collectives "
                         "between the ranks of one host through a\n"
                         "                      shared-memory segment (shm) "
                         "or MPI's; auto: shm when all ranks are on\n"
                         "                      one host "
                         "(docs/running.md) [auto]\n"
                         "  --shard-group-size G G ranks (or node: those of "
                         "one host) share each unit's shards;\n"
                         "                      the groups are replicas, "
                         "gradients all-reduced across them\n"
                         "                      (hybrid sharding, "
                         "docs/running.md) [all ranks]\n"
                         "  --persistence-threshold N\n"
                         "                      put each block's LayerNorms "
                         "(4*channels elements) in a unit of their own,\n"
                         "                      replicated (never "
                         "all-gathered before use) when at most N elements\n"
                         "                      (0: own units, sharded; "
                         "--resume needs the saved run's setting) [off]\n"
                         "  --bucket-elements N reduce-scatter bucket size "
                         "[4194304]\n"
                         "  --progress-thread B 1: a thread drives MPI "
                         "progress, 0: only ZeroShard calls do [1]\n"
                         "  --dtype D           parameters in fp32, bf16 or "
                         "fp16 (fp32 master weights and gradients; fp16 with "
                         "dynamic loss scaling) [fp32]\n"
                         "  --grad-accum K      micro-batches per step: each "
                         "rank runs batch/(ranks*K) sequences K times, and "
                         "each micro-batch's gradients\n"
                         "                      are reduced (DeepSpeed's "
                         "way) [1]\n"
                         "  --grad-accum-local  with --grad-accum K > 1: "
                         "accumulate locally, reduce at the K-th\n"
                         "                      (FSDP's no_sync: fewer "
                         "collectives, every unit's gradients held)\n"
                         "  --clip X            clip the global gradient norm "
                         "to X > 0 [off]\n"
                         "  --offload D         none|cpu|nvme: fp32 master "
                         "weights, optimizer states and the step in\n"
                         "                      NUMA-placed host memory on "
                         "worker threads; nvme: the states in a\n"
                         "                      swap file under --nvme-path "
                         "[none]\n"
                         "  --nvme-path DIR     with --offload nvme: the "
                         "directory for the swap files\n"
                         "  --nvme-sub-group N  with --offload nvme: elements "
                         "per sub-group [0: 4M]\n"
                         "  --offload-param D   none|cpu|nvme (stage 3, with "
                         "--offload cpu or nvme): parameter\n"
                         "                      shards too; nvme: in a swap "
                         "file under --nvme-path [none]\n"
                         "  --nvme-param-buffers N  with --offload-param nvme: "
                         "pinned buffers caching shards [5]\n"
                         "  --device D          cpu|cuda: run the layers and "
                         "ZeroShard's buffers on the CPU or on one\n"
                         "                      GPU per rank (cuBLAS, NCCL) "
                         "[cpu]\n"
                         "  --kernel-times      with --device cuda: GPU time "
                         "per kernel kind over the steps after\n"
                         "                      the first (CUDA events; slows "
                         "the run a little), in the log and report\n"
                         "  --tf32              with --device cuda: GEMMs on "
                         "TF32 tensor cores (faster; ~1e-3\n"
                         "                      relative from fp32, so not for "
                         "CPU parity) [off]\n"
                         "  --save DIR          checkpoint root: save at the "
                         "end (and every --save-every steps); DIR/latest\n"
                         "                      names the newest\n"
                         "  --save-every N      with --save: also every N "
                         "steps [0: end only]\n"
                         "  --resume DIR        continue from a checkpoint "
                         "(or DIR/latest) at any --ranks and --stage;\n"
                         "                      --steps is the total to "
                         "reach\n"
                         "  --describe FILE     write the model description "
                         "(units, tensors, activations per rank) for\n"
                         "                      tools/zs estimate --model, "
                         "then exit without training\n"
                         "  --check-ranks W     check the flags, data and "
                         "paths as W ranks would, then exit\n"
                         "                      (0, or 2 with the message); "
                         "run without mpirun\n"
                       : "",
               kUsage);
      return 1;
    } else if (sharded && strcmp(f, "--checkpoint-verify") == 0) {
      a->checkpoint_verify = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--checkpoint-activations") == 0) {
      a->checkpoint_activations = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--prefetch-depth") == 0) {
      rc = gpt2__int(f, v, 0, 64, &a->prefetch_depth, err, cap);
    } else if (sharded && strcmp(f, "--dtype") == 0) {
      if (v != NULL && strcmp(v, "fp32") == 0) a->dtype = 0;
      else if (v != NULL && strcmp(v, "bf16") == 0) a->dtype = 1;
      else if (v != NULL && strcmp(v, "fp16") == 0) a->dtype = 2;
      else {
        snprintf(err, cap, "--dtype: expected fp32, bf16 or fp16, got '%s'",
                 v != NULL ? v : "(missing)");
        return -1;
      }
    } else if (sharded && (strcmp(f, "--offload") == 0 ||
                           strcmp(f, "--offload-param") == 0)) {
      const int opt = strcmp(f, "--offload") == 0;
      int* dst = opt ? &a->offload : &a->offload_param;
      if (v != NULL && strcmp(v, "none") == 0) *dst = 0;
      else if (v != NULL && strcmp(v, "cpu") == 0) *dst = 1;
      else if (v != NULL && strcmp(v, "nvme") == 0) *dst = 2;
      else {
        snprintf(err, cap, "%s: expected none, cpu or nvme, got '%s'", f,
                 v != NULL ? v : "(missing)");
        return -1;
      }
    } else if (sharded && strcmp(f, "--nvme-param-buffers") == 0) {
      rc = gpt2__int(f, v, 1, 4096, &a->nvme_param_buffers, err, cap);
      param_buffers_given = 1;
    } else if (sharded && strcmp(f, "--nvme-path") == 0) {
      if (v == NULL || v[0] == '\0') {
        snprintf(err, cap, "--nvme-path: expected a directory");
        return -1;
      }
      a->nvme_path = v;
    } else if (sharded && strcmp(f, "--nvme-sub-group") == 0) {
      int n = 0;
      rc = gpt2__int(f, v, 0, 2147483647, &n, err, cap);
      a->nvme_sub_group = n;
      sub_group_given = 1;
    } else if (sharded && strcmp(f, "--device") == 0) {
      if (v != NULL && strcmp(v, "cpu") == 0) a->device = 0;
      else if (v != NULL && strcmp(v, "cuda") == 0) a->device = 1;
      else {
        snprintf(err, cap, "--device: expected cpu or cuda, got '%s'",
                 v != NULL ? v : "(missing)");
        return -1;
      }
    } else if (sharded && strcmp(f, "--kernel-times") == 0) {
      a->kernel_times = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--tf32") == 0) {
      a->tf32 = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--grad-accum") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 20, &a->grad_accum, err, cap);
    } else if (sharded && strcmp(f, "--grad-accum-local") == 0) {
      a->grad_accum_local = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--clip") == 0) {
      /* one message for every refused value: the range's low end, 0,
       * is itself refused */
      rc = gpt2__double(f, v, 0.0, 1e30, &a->clip, err, cap);
      if (rc != 0 || !(a->clip > 0.0)) {
        snprintf(err, cap, "--clip: expected a max norm in (0, 1e+30], got "
                 "'%s'", v != NULL ? v : "(missing)");
        return -1;
      }
    } else if (sharded && strcmp(f, "--progress-thread") == 0) {
      rc = gpt2__int(f, v, 0, 1, &a->progress_thread, err, cap);
    } else if (sharded && (strcmp(f, "--collective-timeout") == 0 ||
                           strcmp(f, "--heartbeat-timeout") == 0)) {
      /* 0 (off), or whole seconds' worth: a fraction of a second would
       * fail collectives that are merely slow */
      const int hb = f[2] == 'h';
      const double hi = hb ? 86400.0 : 1e9;
      double* out = hb ? &a->heartbeat_timeout : &a->collective_timeout;
      rc = gpt2__double(f, v, 0.0, hi, out, err, cap);
      if (rc != 0 || (*out > 0 && *out < 1)) {
        snprintf(err, cap, "%s: expected 0 (off) or seconds in [1, %g], got "
                 "'%s'", f, hi, v != NULL ? v : "(missing)");
        rc = -1;
      }
    } else if (sharded && strcmp(f, "--host-collectives") == 0) {
      static const char* const modes[3] = {"auto", "shm", "mpi"};
      a->host_collectives = -1;
      for (int k = 0; k < 3 && v != NULL; k++)
        if (strcmp(v, modes[k]) == 0) a->host_collectives = k;
      if (a->host_collectives < 0) {
        snprintf(err, cap, "--host-collectives: expected auto, shm or mpi, "
                 "got '%s'", v != NULL ? v : "(missing)");
        rc = -1;
      }
    } else if (sharded && strcmp(f, "--shard-group-size") == 0) {
      if (v != NULL && strcmp(v, "node") == 0) {
        a->shard_group_size = -1;
      } else {
        int g = 0;
        rc = gpt2__int(f, v, 1, 1 << 30, &g, err, cap);
        if (rc != 0)
          snprintf(err, cap, "--shard-group-size: expected a rank count >= 1 "
                   "or node, got '%s'", v != NULL ? v : "(missing)");
        a->shard_group_size = g;
      }
    } else if (sharded && strcmp(f, "--persistence-threshold") == 0) {
      int n = 0;
      rc = gpt2__int(f, v, 0, 1L << 30, &n, err, cap);
      a->persistence_threshold = n;
    } else if (sharded && strcmp(f, "--bucket-elements") == 0) {
      int b = 0;
      rc = gpt2__int(f, v, 1, 2147483647, &b, err, cap);
      a->bucket_elements = b;
    } else if (strcmp(f, "--quiet") == 0) {
      a->quiet = 1;
      takes = 0;
    } else if (sharded && strcmp(f, "--stage") == 0) {
      rc = gpt2__int(f, v, 0, 3, &a->stage, err, cap);
    } else if (strcmp(f, "--steps") == 0) {
      rc = gpt2__int(f, v, 0, 1000000, &a->steps, err, cap);
    } else if (strcmp(f, "--batch") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 20, &a->batch, err, cap);
    } else if (strcmp(f, "--seq") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 20, &a->seq, err, cap);
    } else if (strcmp(f, "--layers") == 0) {
      rc = gpt2__int(f, v, 0, 1024, &a->layers, err, cap);
    } else if (strcmp(f, "--channels") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 16, &a->channels, err, cap);
    } else if (strcmp(f, "--heads") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 16, &a->heads, err, cap);
    } else if (strcmp(f, "--eval-every") == 0) {
      rc = gpt2__int(f, v, 0, 100000000, &a->eval_every, err, cap);
    } else if (strcmp(f, "--val-batches") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 20, &a->val_batches, err, cap);
    } else if (strcmp(f, "--log-every") == 0) {
      rc = gpt2__int(f, v, 1, 100000000, &a->log_every, err, cap);
    } else if (strcmp(f, "--sample-bytes") == 0) {
      rc = gpt2__int(f, v, 0, 1 << 20, &a->sample_bytes, err, cap);
    } else if (strcmp(f, "--lr") == 0) {
      rc = gpt2__double(f, v, 0.0, 10.0, &a->lr, err, cap);
    } else if (strcmp(f, "--weight-decay") == 0) {
      rc = gpt2__double(f, v, 0.0, 10.0, &a->weight_decay, err, cap);
    } else if (strcmp(f, "--seed") == 0) {
      int s = 0;
      rc = gpt2__int(f, v, 0, 2147483647, &s, err, cap);
      a->seed = (unsigned long long)s;
    } else if (sharded && strcmp(f, "--check-ranks") == 0) {
      rc = gpt2__int(f, v, 1, 1 << 20, &a->check_ranks, err, cap);
    } else if (sharded && strcmp(f, "--save-every") == 0) {
      rc = gpt2__int(f, v, 0, 1000000, &a->save_every, err, cap); /* 0: end only */
    } else if (strcmp(f, "--data") == 0 || strcmp(f, "--report") == 0 ||
               (sharded && (strcmp(f, "--describe") == 0 ||
                            strcmp(f, "--save") == 0 ||
                            strcmp(f, "--resume") == 0))) {
      if (v == NULL || v[0] == '\0' || strncmp(v, "--", 2) == 0) {
        snprintf(err, cap, "%s: expected a path, got '%s'", f,
                 v != NULL ? v : "(missing)");
        return -1;
      }
      *(strcmp(f, "--data") == 0     ? &a->data
        : strcmp(f, "--report") == 0 ? &a->report
        : strcmp(f, "--save") == 0   ? &a->save
        : strcmp(f, "--resume") == 0 ? &a->resume
                                     : &a->describe) = v;
    } else {
      snprintf(err, cap, "unknown flag '%s' (try --help)", f);
      return -1;
    }
    if (rc != 0) return -1;
    /* (after its value's own check, which names the problem better) */
    for (int k = 0; k < nseen; k++)
      if (strcmp(seen[k], f) == 0) {
        snprintf(err, cap, "%s given twice (give each flag once: the later "
                 "value would silently win)", f);
        return -1;
      }
    if (nseen < (int)(sizeof seen / sizeof *seen)) seen[nseen++] = f;
    i += takes;
  }
  if (a->checkpoint_verify && !a->checkpoint_activations) {
    snprintf(err, cap, "--checkpoint-verify checks the recomputes of "
             "activation checkpointing: it needs --checkpoint-activations");
    return -1;
  }
  if (a->kernel_times && !a->device) {
    snprintf(err, cap, "--kernel-times times the GPU's kernels: it needs "
             "--device cuda");
    return -1;
  }
  if (a->tf32 && !a->device) {
    snprintf(err, cap, "--tf32 sets how cuBLAS multiplies on the GPU: it "
             "needs --device cuda");
    return -1;
  }
  if (a->save_every > 0 && a->save == NULL) {
    snprintf(err, cap, "--save-every needs --save DIR");
    return -1;
  }
  if (a->grad_accum_local && a->grad_accum < 2) {
    snprintf(err, cap, "--grad-accum-local accumulates over micro-batches: "
             "it needs --grad-accum K > 1");
    return -1;
  }
  const int nvme = a->offload == 2 || a->offload_param == 2;
  if (nvme && a->nvme_path == NULL) {
    snprintf(err, cap, "--%s nvme needs --nvme-path DIR (a directory on "
             "the fast device for the swap files)",
             a->offload == 2 ? "offload" : "offload-param");
    return -1;
  }
  if (!nvme && a->nvme_path != NULL) {
    snprintf(err, cap, "--nvme-path goes with --offload nvme or "
             "--offload-param nvme");
    return -1;
  }
  if (a->offload != 2 && sub_group_given) {
    snprintf(err, cap, "--nvme-sub-group goes with --offload nvme");
    return -1;
  }
  if (a->offload_param != 0 && (a->stage != 3 || a->offload == 0)) {
    snprintf(err, cap, "--offload-param %s needs --stage 3 (where the "
             "parameters are sharded) and --offload cpu or nvme (the "
             "optimizer steps the shards on the host); got --stage %d, "
             "--offload %s", a->offload_param == 1 ? "cpu" : "nvme",
             a->stage, a->offload == 0 ? "none" : a->offload == 1 ? "cpu" : "nvme");
    return -1;
  }
  if (a->offload_param != 2 && param_buffers_given) {
    snprintf(err, cap, "--nvme-param-buffers goes with --offload-param nvme");
    return -1;
  }

  if ((long long)a->val_batches * a->batch > (1 << 20)) {
    snprintf(err, cap, "--val-batches %d x --batch %d: more than 2^20 val "
             "sequences", a->val_batches, a->batch);
    return -1;
  }
  return 0;
}

int gpt2_nvme_path_check(const char* dir, char* err, size_t cap) {
  if (dir == NULL) return 0;
  struct stat sb;
  if (stat(dir, &sb) != 0) {
    snprintf(err, cap, "--nvme-path %s: %s (the directory for the swap "
             "files must exist)", dir, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(sb.st_mode)) {
    snprintf(err, cap, "--nvme-path %s: not a directory (the swap files "
             "go in a directory on the fast device)", dir);
    return -1;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    snprintf(err, cap, "--nvme-path %s: cannot create files there: %s", dir,
             strerror(errno));
    return -1;
  }
  return 0;
}

int gpt2_output_check(const char* flag, const char* path, const char* data,
                      char* err, size_t cap) {
  if (path == NULL) return 0;
  struct stat rs, ds;
  if (lstat(path, &rs) == 0) {
    if (!S_ISREG(rs.st_mode)) {
      snprintf(err, cap, "%s %s exists and is not a regular file (refusing "
               "to replace it)", flag, path);
      return -1;
    }
    if (stat(data, &ds) == 0 && ds.st_dev == rs.st_dev &&
        ds.st_ino == rs.st_ino) {
      snprintf(err, cap, "%s %s is the data file", flag, path);
      return -1;
    }
  }
  /* Can the temporary file be created next to it? Find out now, not after
   * training. */
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    snprintf(err, cap, "%s %s: cannot write there: %s", flag, path,
             strerror(errno));
    return -1;
  }
  close(fd);
  unlink(tmp);
  return 0;
}

int gpt2_report_check(const char* report, const char* data, char* err,
                      size_t cap) {
  return gpt2_output_check("--report", report, data, err, cap);
}

gpt2_config gpt2_args_model(const gpt2_args* a) {
  gpt2_config c = {a->seq, GPT2_VOCAB, a->layers, a->heads, a->channels};
  return c;
}

void gpt2_args_print(const gpt2_args* a, const char* trainer, int ranks,
                     int threads, FILE* out) {
  gpt2_config c = gpt2_args_model(a);
  char stage[320] = "";
  static const char* const dtypes[3] = {"fp32", "bf16", "fp16"};
  if (strcmp(trainer, "sharded") == 0)
    snprintf(stage, sizeof stage, ", ZeRO stage %d, %s parameters%s",
             a->stage, dtypes[a->dtype % 3],
             a->checkpoint_activations ? ", activation checkpointing" : "");
  if (a->grad_accum > 1)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", %d micro-batches of %d per rank%s", a->grad_accum,
             a->batch / (ranks > 0 ? ranks : 1) / a->grad_accum,
             a->grad_accum_local ? " (accumulated locally)" : "");
  if (a->clip > 0)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", clip %g", a->clip);
  if (a->shard_group_size < 0)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", a shard group per host");
  else if (a->shard_group_size > 0 && a->shard_group_size < ranks)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", shard groups of %d (%d replicas)", a->shard_group_size,
             ranks / a->shard_group_size);
  if (a->offload)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", %s offload%s", a->offload == 2 ? "NVMe" : "CPU",
             a->offload_param == 2 ? " (+params on NVMe)"
             : a->offload_param ? " (+params on the CPU)" : "");
  if (a->device)
    snprintf(stage + strlen(stage), sizeof stage - strlen(stage),
             ", on CUDA GPUs%s", a->tf32 ? " (TF32 GEMMs)" : "");
  char eval[64];
  if (a->eval_every > 0) snprintf(eval, sizeof eval, "every %d steps", a->eval_every);
  else snprintf(eval, sizeof eval, "at the end");
  fprintf(out,
          "%s: GPT-2 L=%d C=%d H=%d T=%d V=%d (%zu parameters)\n"
          "  %d rank(s) x %d OpenMP thread(s)%s, global batch %d (%d per "
          "rank), steps %d\n"
          "  AdamW lr %g weight decay %g, seed %llu, eval %s on "
          "%d val sequences\n  data %s\n",
          trainer, c.layers, c.channels, c.heads, c.max_seq, c.vocab,
          gpt2_num_params(&c), ranks, threads, stage, a->batch,
          a->batch / (ranks > 0 ? ranks : 1), a->steps, a->lr,
          a->weight_decay, a->seed, eval, a->val_batches * a->batch,
          a->data);
}

/* ==== Report =============================================================== */

struct gpt2_report {
  cJSON* root;
  cJSON* steps;
  cJSON* val;
  cJSON* ranks;
};

gpt2_report* gpt2_report_create(const gpt2_args* a, const char* trainer,
                                int ranks, int threads, size_t params) {
  gpt2_report* r = (gpt2_report*)calloc(1, sizeof *r);
  if (r == NULL) return NULL;
  r->root = cJSON_CreateObject();
  cJSON* c = cJSON_AddObjectToObject(r->root, "config");
  cJSON_AddStringToObject(c, "trainer", trainer);
  cJSON_AddNumberToObject(c, "ranks", ranks);
  cJSON_AddNumberToObject(c, "threads_per_rank", threads);
  cJSON_AddNumberToObject(c, "stage", a->stage);
  cJSON_AddBoolToObject(c, "checkpoint_activations", a->checkpoint_activations);
  cJSON_AddBoolToObject(c, "checkpoint_verify", a->checkpoint_verify);
  cJSON_AddNumberToObject(c, "prefetch_depth", a->prefetch_depth);
  cJSON_AddNumberToObject(c, "collective_timeout_s", a->collective_timeout);
  cJSON_AddNumberToObject(c, "heartbeat_timeout_s", a->heartbeat_timeout);
  if (a->host_collectives_used != NULL)
    cJSON_AddStringToObject(c, "host_collectives", a->host_collectives_used);
  /* what was asked ("node", a count, or all ranks: 0); comm.groups has
   * the G in use */
  if (a->shard_group_size < 0)
    cJSON_AddStringToObject(c, "shard_group_size", "node");
  else
    cJSON_AddNumberToObject(c, "shard_group_size", a->shard_group_size);
  cJSON_AddNumberToObject(c, "persistence_threshold",
                          (double)a->persistence_threshold);
  cJSON_AddNumberToObject(c, "bucket_elements", (double)a->bucket_elements);
  cJSON_AddNumberToObject(c, "progress_thread", a->progress_thread);
  static const char* const dtypes[3] = {"fp32", "bf16", "fp16"};
  cJSON_AddStringToObject(c, "dtype", dtypes[a->dtype % 3]);
  cJSON_AddNumberToObject(c, "grad_accum", a->grad_accum);
  cJSON_AddBoolToObject(c, "grad_accum_local", a->grad_accum_local);
  cJSON_AddNumberToObject(c, "clip", a->clip);
  cJSON_AddStringToObject(c, "offload", a->offload == 2 ? "nvme"
                                         : a->offload ? "cpu" : "none");
  cJSON_AddStringToObject(c, "offload_param", a->offload_param == 2 ? "nvme"
                                               : a->offload_param ? "cpu" : "none");
  if (a->nvme_path != NULL) {
    cJSON_AddStringToObject(c, "nvme_path", a->nvme_path);
    cJSON_AddNumberToObject(c, "nvme_sub_group", (double)a->nvme_sub_group);
    cJSON_AddNumberToObject(c, "nvme_param_buffers", a->nvme_param_buffers);
  }
  cJSON_AddStringToObject(c, "device", a->device ? "cuda" : "cpu");
  cJSON_AddBoolToObject(c, "kernel_times", a->kernel_times);
  cJSON_AddBoolToObject(c, "tf32", a->tf32);
  cJSON_AddNumberToObject(c, "steps", a->steps);
  cJSON_AddNumberToObject(c, "seed", (double)a->seed);
  cJSON_AddNumberToObject(c, "batch", a->batch);
  cJSON_AddNumberToObject(c, "seq", a->seq);
  cJSON_AddNumberToObject(c, "layers", a->layers);
  cJSON_AddNumberToObject(c, "channels", a->channels);
  cJSON_AddNumberToObject(c, "heads", a->heads);
  cJSON_AddNumberToObject(c, "lr", a->lr);
  cJSON_AddNumberToObject(c, "weight_decay", a->weight_decay);
  cJSON_AddNumberToObject(c, "eval_every", a->eval_every);
  cJSON_AddNumberToObject(c, "val_sequences", a->val_batches * a->batch);
  cJSON_AddNumberToObject(c, "params", (double)params);
  cJSON_AddStringToObject(c, "data", a->data);
  r->steps = cJSON_AddArrayToObject(r->root, "steps");
  r->val = cJSON_AddArrayToObject(r->root, "val");
  r->ranks = cJSON_AddArrayToObject(r->root, "ranks");
  return r;
}

void gpt2_report_step(gpt2_report* r, int step, double loss, double lr) {
  cJSON* s = cJSON_CreateObject();
  cJSON_AddNumberToObject(s, "step", step);
  cJSON_AddNumberToObject(s, "loss", loss);
  cJSON_AddNumberToObject(s, "lr", lr);
  cJSON_AddItemToArray(r->steps, s);
}

void gpt2_report_step_info(gpt2_report* r, const zs_step_info* info,
                           int loss_scaling) {
  cJSON* s = cJSON_GetArrayItem(r->steps, cJSON_GetArraySize(r->steps) - 1);
  if (s == NULL) return;
  cJSON_AddBoolToObject(s, "applied", info->applied);
  if (loss_scaling) cJSON_AddNumberToObject(s, "loss_scale", info->loss_scale);
  /* (JSON has no inf: an overflow's norm is null; -1: not computed) */
  if (!isfinite(info->grad_norm))
    cJSON_AddNullToObject(s, "grad_norm");
  else if (info->grad_norm >= 0)
    cJSON_AddNumberToObject(s, "grad_norm", info->grad_norm);
}

void gpt2_report_val(gpt2_report* r, int step, double loss) {
  cJSON* s = cJSON_CreateObject();
  cJSON_AddNumberToObject(s, "step", step);
  cJSON_AddNumberToObject(s, "loss", loss);
  cJSON_AddItemToArray(r->val, s);
}

void gpt2_report_rank(gpt2_report* r, int rank, const zs_memory_stats* m) {
  cJSON* s = cJSON_CreateObject();
  cJSON_AddNumberToObject(s, "rank", rank);
  cJSON_AddNumberToObject(s, "model_state_bytes", (double)m->model_state_bytes);
  cJSON* peak = cJSON_AddObjectToObject(s, "peak_bytes");
  for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++)
    cJSON_AddNumberToObject(peak, zs_mem_category_name((zs_mem_category)k),
                            (double)m->peak[k]);
  cJSON_AddNumberToObject(peak, "total", (double)m->total_peak);
  /* Peaks per phase of the last step, and the process's resident set */
  cJSON* phases = cJSON_AddObjectToObject(s, "phase_peak_bytes");
  for (int p = 0; p < ZS_PHASE_COUNT; p++) {
    cJSON* o = cJSON_AddObjectToObject(phases, zs_phase_name((zs_phase)p));
    for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++)
      cJSON_AddNumberToObject(o, zs_mem_category_name((zs_mem_category)k),
                              (double)m->phase_peak[p][k]);
    cJSON_AddNumberToObject(o, "total", (double)m->phase_peak_total[p]);
  }
  cJSON_AddNumberToObject(s, "resident_bytes", (double)m->resident_bytes);
  cJSON_AddNumberToObject(s, "comm_bucket_peak_bytes", (double)m->comm_bucket_peak);
  cJSON_AddItemToArray(r->ranks, s);
}

void gpt2_report_nvme(gpt2_report* r, int rank, const uint64_t counts[3]) {
  cJSON* row = cJSON_GetArrayItem(r->ranks, rank);
  if (row == NULL) return;
  cJSON* n = cJSON_AddObjectToObject(row, "nvme");
  cJSON_AddNumberToObject(n, "file_bytes", (double)counts[0]);
  cJSON_AddNumberToObject(n, "param_reads", (double)counts[1]);
  cJSON_AddNumberToObject(n, "param_reads_ahead", (double)counts[2]);
}

void gpt2_report_timing(gpt2_report* r, int steps, double tokens_per_step,
                        double train_s, double wall_s) {
  cJSON_AddNumberToObject(r->root, "tokens_per_s",
                          train_s > 0 ? steps * tokens_per_step / train_s : 0);
  cJSON_AddNumberToObject(r->root, "steps_timed", steps);
  cJSON_AddNumberToObject(r->root, "train_s", train_s);
  cJSON_AddNumberToObject(r->root, "wall_s", wall_s);
}

void gpt2_report_step_seconds(gpt2_report* r, double seconds) {
  cJSON* s = cJSON_GetArrayItem(r->steps, cJSON_GetArraySize(r->steps) - 1);
  if (s != NULL) cJSON_AddNumberToObject(s, "seconds", seconds);
}

void gpt2_report_kernel_times(gpt2_report* r, int steps, double train_s,
                              int n, const char* const* names,
                              const long* calls, const double* seconds) {
  cJSON* k = cJSON_AddObjectToObject(r->root, "kernel_times");
  cJSON_AddNumberToObject(k, "steps", steps);
  cJSON_AddNumberToObject(k, "train_s", train_s);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += seconds[i];
  cJSON_AddNumberToObject(k, "kernel_s", sum);
  cJSON* rows = cJSON_AddArrayToObject(k, "kernels");
  for (int i = 0; i < n; i++) {
    cJSON* row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, "name", names[i]);
    cJSON_AddNumberToObject(row, "calls", (double)calls[i]);
    cJSON_AddNumberToObject(row, "seconds", seconds[i]);
    cJSON_AddNumberToObject(row, "share", train_s > 0 ? seconds[i] / train_s : 0);
    cJSON_AddItemToArray(rows, row);
  }
}

void gpt2_report_activations(gpt2_report* r, int checkpointing,
                             size_t peak_bytes, size_t unchecked_bytes) {
  cJSON* a = cJSON_AddObjectToObject(r->root, "activations");
  cJSON_AddBoolToObject(a, "checkpointing", checkpointing);
  cJSON_AddNumberToObject(a, "peak_bytes", (double)peak_bytes);
  cJSON_AddNumberToObject(a, "unchecked_bytes", (double)unchecked_bytes);
  cJSON_AddNumberToObject(a, "ratio_to_unchecked",
                          unchecked_bytes > 0
                              ? (double)peak_bytes / (double)unchecked_bytes
                              : 1.0);
}

void gpt2_report_comm_groups(gpt2_report* r, const double bytes[3], int steps,
                             int shard_ranks, int replicas) {
  cJSON* comm = cJSON_GetObjectItemCaseSensitive(r->root, "comm");
  if (comm == NULL) comm = cJSON_AddObjectToObject(r->root, "comm");
  cJSON* g = cJSON_AddObjectToObject(comm, "groups");
  static const char* const names[3] = {"world", "shard", "replica"};
  cJSON_AddNumberToObject(g, "shard_ranks", shard_ranks);
  cJSON_AddNumberToObject(g, "replicas", replicas);
  for (int k = 0; k < 3; k++) {
    cJSON* o = cJSON_AddObjectToObject(g, names[k]);
    cJSON_AddNumberToObject(o, "bytes_per_step", steps > 0 ? bytes[k] / steps : 0);
  }
}

void gpt2_report_comm(gpt2_report* r, const zs_comm_counters* c, int ranks,
                      int steps) {
  cJSON* comm = cJSON_AddObjectToObject(r->root, "comm");
  cJSON_AddNumberToObject(comm, "ranks", ranks);
  for (int k = 0; k < ZS_COLL_OP_COUNT; k++) {
    cJSON* o = cJSON_AddObjectToObject(comm, zs_coll_op_name((zs_coll_op)k));
    cJSON_AddNumberToObject(o, "calls", (double)c->calls[k]);
    cJSON_AddNumberToObject(o, "bytes", (double)c->bytes[k]);
    cJSON_AddNumberToObject(o, "seconds", c->seconds[k]);
    cJSON_AddNumberToObject(o, "wait_seconds", c->wait_seconds[k]);
    /* nccl-tests' definitions: algbw = bytes / time; busbw = algbw *
     * (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce,
     * 1 for broadcast. Times are issue to completion (overlapped ones
     * included), so these are lower bounds of the link's speed. */
    const double algbw = c->seconds[k] > 0 ? c->bytes[k] / c->seconds[k] / 1e9 : 0;
    cJSON_AddNumberToObject(o, "algbw_GBps", algbw);
    cJSON_AddNumberToObject(o, "busbw_GBps",
                            algbw * zs_busbw_factor((zs_coll_op)k, ranks));
    cJSON_AddNumberToObject(o, "calls_per_step", steps > 0 ? (double)c->calls[k] / steps : 0);
    cJSON_AddNumberToObject(o, "bytes_per_step", steps > 0 ? (double)c->bytes[k] / steps : 0);
  }
}

void gpt2_report_text(gpt2_report* r, const char* sample, size_t n) {
  /* Bytes are Latin-1 code points: bytes >= 0x80 become two-byte UTF-8, so
   * the report stays valid JSON whatever the model samples; a 0 byte, which
   * JSON strings cannot hold raw, becomes U+2400 (symbol for null). */
  char* utf8 = (char*)malloc(3 * n + 1);
  if (utf8 == NULL) return;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)sample[i];
    if (b == 0) {
      utf8[k++] = (char)0xE2;
      utf8[k++] = (char)0x90;
      utf8[k++] = (char)0x80;
    } else if (b < 0x80) {
      utf8[k++] = (char)b;
    } else {
      utf8[k++] = (char)(0xC0 | (b >> 6));
      utf8[k++] = (char)(0x80 | (b & 0x3F));
    }
  }
  utf8[k] = '\0';
  cJSON_AddStringToObject(r->root, "sample", utf8);
  free(utf8);
}

void gpt2_print_text(FILE* out, const char* sample, size_t n) {
  fprintf(out, "---- sample ----\n");
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)sample[i];
    fputc(b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7f) ? b : '?', out);
  }
  fprintf(out, "\n----------------\n");
}

int gpt2_report_write(gpt2_report* r, const char* path, char* err,
                      size_t cap) {
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    snprintf(err, cap, "--report %s is not a regular file", path);
    return -1;
  }
  char* text = cJSON_Print(r->root);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = text != NULL ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
  size_t len = text != NULL ? strlen(text) : 0;
  int ok = fd >= 0 && write(fd, text, len) == (ssize_t)len &&
           write(fd, "\n", 1) == 1 && fsync(fd) == 0;
  if (fd >= 0 && close(fd) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    snprintf(err, cap, "cannot write report %s: %s", path, strerror(errno));
    if (fd >= 0) unlink(tmp);
  }
  free(text);
  return ok ? 0 : -1;
}

void gpt2_report_free(gpt2_report* r) {
  if (r == NULL) return;
  cJSON_Delete(r->root);
  free(r);
}

/* ==== Printing ============================================================= */

void gpt2_print_progress(FILE* out, int step, int steps, double loss,
                         double lr, double tokens_per_s, double eta_s) {
  int eta = eta_s > 0 ? (int)(eta_s + 0.5) : 0;
  fprintf(out,
          "step %5d/%d | loss %.4f | lr %.2e | %6.0f tok/s | eta %dm%02ds\n",
          step, steps, loss, lr, tokens_per_s, eta / 60, eta % 60);
  fflush(out);
}

static void gpt2__mib(char* buf, size_t cap, size_t bytes) {
  snprintf(buf, cap, "%.2f", (double)bytes / (1024.0 * 1024.0));
}

void gpt2_print_memory_table(FILE* out, const zs_memory_stats* rows,
                             int ranks) {
  zs_mem_category cols[] = {
      ZS_MEM_PARAMS,          ZS_MEM_PARAMS_GATHERED, ZS_MEM_GRADS,
      ZS_MEM_MASTER_WEIGHTS,  ZS_MEM_OPTIMIZER_STATES, ZS_MEM_COMM_BUFFERS,
      ZS_MEM_ACTIVATIONS,     ZS_MEM_OFFLOAD_HOST,     ZS_MEM_OTHER,
      ZS_MEM_NVME_STAGING};
  /* the NVMe staging column only when some rank has it */
  int nvme = 0;
  for (int r = 0; r < ranks; r++) nvme |= rows[r].peak[ZS_MEM_NVME_STAGING] > 0;
  const int ncol = (int)(sizeof cols / sizeof cols[0]) - (nvme ? 0 : 1);
  fprintf(out, "peak memory per rank (MiB):\n%4s", "rank");
  for (int k = 0; k < ncol; k++)
    fprintf(out, " %16s", zs_mem_category_name(cols[k]));
  fprintf(out, " %16s %16s\n", "total", "model_states");
  char b[32];
  for (int r = 0; r < ranks; r++) {
    fprintf(out, "%4d", r);
    for (int k = 0; k < ncol; k++) {
      gpt2__mib(b, sizeof b, rows[r].peak[cols[k]]);
      fprintf(out, " %16s", b);
    }
    gpt2__mib(b, sizeof b, rows[r].total_peak);
    fprintf(out, " %16s", b);
    gpt2__mib(b, sizeof b, rows[r].model_state_bytes);
    fprintf(out, " %16s\n", b);
  }
}

double gpt2_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ==== Sampling ============================================================= */

void gpt2_softmax(const float* logits, float* probs, int V) {
  float mx = logits[0];
  for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
  double sum = 0;
  for (int v = 0; v < V; v++) sum += probs[v] = expf(logits[v] - mx);
  for (int v = 0; v < V; v++) probs[v] = (float)(probs[v] / sum);
}

int gpt2_sample_byte(const float* probs, int V, unsigned long long seed,
                     long k) {
  uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  double u = (double)(x >> 11) / 9007199254740992.0, cdf = 0;
  for (int v = 0; v < V; v++) {
    cdf += probs[v];
    if (u < cdf) return v;
  }
  return V - 1;
}
