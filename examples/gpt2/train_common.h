/*
 * train_common.h — what the plain and the sharded GPT-2 trainers share and
 * is not model code: command-line flags, progress lines, the JSON report
 * (written atomically: a temporary file renamed into place), the memory
 * table, and text sampling helpers.
 */
#ifndef ZS_EXAMPLES_GPT2_TRAIN_COMMON_H
#define ZS_EXAMPLES_GPT2_TRAIN_COMMON_H

#include <stddef.h>
#include <stdio.h>

#include <zeroshard.h>

#include "examples/gpt2/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt2_args {
  int stage;           /* ZeRO stage (sharded trainer) */
  int steps;           /* optimizer steps */
  unsigned long long seed;
  int batch;           /* GLOBAL batch: sequences per optimizer step */
  int seq;             /* T */
  int layers, channels, heads;
  double lr;
  double weight_decay; /* on matrices and embeddings only */
  int eval_every;      /* steps between val evaluations (0: only at the end) */
  int val_batches;     /* val sequences = val_batches * batch */
  int log_every;       /* steps between progress lines */
  int sample_bytes;    /* bytes of text sampled at the end */
  const char* data;    /* path of the byte-level text */
  const char* report;  /* JSON report path, or NULL */
  int quiet;           /* no progress lines */
  int checkpoint_activations; /* sharded: recompute blocks in backward */
  int checkpoint_verify; /* sharded, with checkpoint_activations: compare
                            each recompute with the first forward, bitwise
                            (ZS_CHECKPOINT_VERIFY) */
  int prefetch_depth;  /* sharded: zs_config.prefetch_depth */
  double collective_timeout; /* sharded: zs_config.collective_timeout_s (-1:
                                the library's default) */
  int shard_group_size;      /* sharded: zs_config.shard_group_size (0:
                                all ranks; -1: ZS_SHARD_GROUP_NODE) */
  int host_collectives;      /* sharded: zs_config.host_collectives (-1:
                                the library's default, AUTO) */
  const char* host_collectives_used; /* sharded: "shm" or "mpi", what the
                                context uses (zs_context_config), for the
                                report; NULL before the context exists */
  double heartbeat_timeout;  /* sharded: zs_config.heartbeat_timeout_s (-1:
                                the library's default; 0: off) */
  long persistence_threshold; /* sharded: -1 (default): each block's
                           LayerNorms in the block's unit; >= 0: in a unit
                           of their own ("block.L.ln", 4C elements, tied
                           into the block), replicated when it has at most
                           this many elements
                           (zs_model_set_persistence_threshold) */
  long bucket_elements; /* sharded: zs_config.bucket_elements */
  int progress_thread; /* sharded: zs_config.progress_thread */
  int dtype;           /* sharded: parameter dtype (zs_dtype: 0 fp32, 1 bf16,
                          2 fp16); gradients fp32 */
  int grad_accum;      /* sharded: K micro-batches per optimizer step */
  int grad_accum_local; /* sharded: 1 accumulates the K locally, reducing
                           at the K-th (zs_config.grad_accum_local) */
  double clip;         /* sharded: max global gradient norm, 0 = off */
  int offload;         /* sharded: optimizer offload: 0 none, 1 cpu, 2 nvme */
  const char* nvme_path; /* sharded, --offload nvme: swap directory */
  long nvme_sub_group; /* sharded, --offload nvme: sub-group elements (0:
                          a buffer's worth) */
  int offload_param;   /* sharded, stage 3: parameter shards too (0 none,
                          1 cpu, 2 nvme) */
  int nvme_param_buffers; /* sharded, --offload-param nvme: pinned buffers
                             (zs_config.nvme.param_buffer_count) [5] */
  int device;          /* sharded: 0 cpu, 1 cuda (one GPU per rank) */
  int kernel_times;    /* sharded, --device cuda: time every kernel (rank 0's
                          totals in the report and the log) */
  int tf32;            /* sharded, --device cuda: GEMMs on TF32 tensor cores */
  const char* save;    /* sharded: checkpoint root to save into, or NULL */
  int save_every;      /* sharded: save every N steps (0: at the end only) */
  const char* resume;  /* sharded: checkpoint (or root) to resume from */
  const char* describe; /* sharded: write the model description JSON
                           (tools/zs estimate --model) here and exit */
  int check_ranks;     /* sharded: check the flags for this many ranks and
                          exit, without MPI (0: train) */
} gpt2_args;

/* --nvme-path DIR: must be an existing directory this process can create
 * files in (each rank makes its swap directory there), so a bad path fails
 * before any rank starts. NULL is accepted. Returns 0, or -1 with a
 * message. */
int gpt2_nvme_path_check(const char* dir, char* err, size_t cap);

/* Parses argv. Returns 0 on success, 1 for --help (printed if print_help),
 * -1 on a bad flag or value (message in err naming the flag). `sharded` adds
 * --stage and --checkpoint-activations. */
int gpt2_args_parse(int argc, char** argv, int sharded, gpt2_args* a,
                    char* err, size_t cap, int print_help);
/* Checks up front that the report can be written where asked: the path
 * must be new or a regular file (never a device, a symlink or the data
 * file), and its directory writable. Returns 0, or -1 with a message. */
int gpt2_report_check(const char* report, const char* data, char* err,
                      size_t cap);
/* The same check for the output file of any flag (--report, --describe),
 * the flag named in the message. */
int gpt2_output_check(const char* flag, const char* path, const char* data,
                      char* err, size_t cap);
/* The model configuration the flags describe. */
gpt2_config gpt2_args_model(const gpt2_args* a);
/* Prints the configuration (one block, for the log). */
void gpt2_args_print(const gpt2_args* a, const char* trainer, int ranks,
                     int threads, FILE* out);

/* ---- Report ---------------------------------------------------------------- */

typedef struct gpt2_report gpt2_report;

gpt2_report* gpt2_report_create(const gpt2_args* a, const char* trainer,
                                int ranks, int threads, size_t params);
void gpt2_report_step(gpt2_report* r, int step, double loss, double lr);
/* The sharded trainer's optimizer outcome of the step just reported
 * (its K-th zs_step): "applied" (false: skipped on inf/NaN gradients),
 * "loss_scale" for the next step (with fp16's loss scaling) and
 * "grad_norm" (the unscaled global norm, when clipping or loss scaling
 * computed it). */
void gpt2_report_step_info(gpt2_report* r, const zs_step_info* info,
                           int loss_scaling);
void gpt2_report_val(gpt2_report* r, int step, double loss);
/* One row per rank: its accounting snapshot (peaks over the run). */
void gpt2_report_rank(gpt2_report* r, int rank, const zs_memory_stats* m);
/* tokens_per_s = steps x tokens_per_step / train_s: the steps this run
 * timed (a resumed run's, not the total) over their training time
 * (seconds, evaluation excluded); also written: steps_timed, train_s and
 * wall_s (seconds, start-up included). */
void gpt2_report_timing(gpt2_report* r, int steps, double tokens_per_step,
                        double train_s, double wall_s);
/* The seconds of the step just reported (gpt2_report_step), as its
 * "seconds": host wall time from the first micro-batch to the return of
 * the K-th zs_step. */
void gpt2_report_step_seconds(gpt2_report* r, double seconds);
/* GPU time per kernel kind over the last `steps` steps (--kernel-times):
 * "kernel_times" with steps, train_s (their training time, seconds),
 * kernel_s (the kinds' sum) and one row per kind (name, calls, seconds,
 * share = seconds / train_s), n rows from names/calls/seconds. */
void gpt2_report_kernel_times(gpt2_report* r, int steps, double train_s,
                              int n, const char* const* names,
                              const long* calls, const double* seconds);
/* NVMe offload of one rank (after gpt2_report_rank for every rank): its
 * zs_offload_info's bytes on disk and parameter shards read (of which
 * ahead), as "nvme" in its row. */
void gpt2_report_nvme(gpt2_report* r, int rank, const uint64_t counts[3]);
/* Activation memory of rank 0: the measured peak, and the peak the same
 * run would have without checkpointing (the driver's buffers swapped). */
void gpt2_report_activations(gpt2_report* r, int checkpointing,
                             size_t peak_bytes, size_t unchecked_bytes);
/* Rank 0's communication counters (calls, bytes, seconds, wait seconds per
 * collective) under "comm". */
/* The communication summary: per collective calls, bytes (the full size
 * per rank, as nccl-tests counts), time, algbw/busbw, and per step. */
/* report.comm.groups: bytes per step of this rank's collectives among all
 * ranks ("world"), in its shard group and across its replica group
 * (zs_comm_record.group), with the groups' sizes. */
void gpt2_report_comm_groups(gpt2_report* r, const double bytes[3], int steps,
                             int shard_ranks, int replicas);
void gpt2_report_comm(gpt2_report* r, const zs_comm_counters* c, int ranks,
                      int steps);
/* The n sampled bytes, as Latin-1 code points (valid UTF-8 JSON). */
void gpt2_report_text(gpt2_report* r, const char* sample, size_t n);
/* Writes path.tmp, fsyncs it and renames it to path, so a reader never sees
 * a half-written report. Returns 0, or -1 with a message in err. */
int gpt2_report_write(gpt2_report* r, const char* path, char* err, size_t cap);
void gpt2_report_free(gpt2_report* r);

/* ---- Printing ---------------------------------------------------------------- */

/* "step 100/1200 | loss 2.4512 | lr 1.00e-03 | 4400 tok/s | eta 3m12s" */
void gpt2_print_progress(FILE* out, int step, int steps, double loss,
                         double lr, double tokens_per_s, double eta_s);
/* The n sampled bytes, with unprintable ones shown as '?'. */
void gpt2_print_text(FILE* out, const char* sample, size_t n);
/* The per-rank table of peak bytes by category. rows: `ranks` snapshots. */
void gpt2_print_memory_table(FILE* out, const zs_memory_stats* rows,
                             int ranks);

/* Monotonic seconds. */
double gpt2_now(void);

/* Samples the next byte from probabilities probs (V) with a uniform draw
 * from (seed, k). */
int gpt2_sample_byte(const float* probs, int V, unsigned long long seed,
                     long k);
/* Softmax of logits (V) into probs (V). */
void gpt2_softmax(const float* logits, float* probs, int V);

#ifdef __cplusplus
}
#endif

#endif /* ZS_EXAMPLES_GPT2_TRAIN_COMMON_H */
