/*
 * ckpt_format.h — the sharded checkpoint format (docs/checkpoint.md): metadata
 * (meta.json through cJSON, its own checksum in meta.json.xxh64), one file
 * of raw shards per rank of the saving world, an extras file, xxHash64 per
 * file, and the crash-safe write protocol's file helpers. No MPI and no
 * model: the engine's save/load (engine_ckpt.c) and the offline tools
 * (consolidate, inspect) share it.
 *
 * A checkpoint directory:
 *   meta.json          format, world size, stage, optimizer, step counts,
 *                      loss scaler, units (layout and the byte offset of
 *                      each field in every rank file), tensors (name,
 *                      shape, dtype, unit, offset, tie, group, step), files
 *   meta.json.xxh64    the xxHash64 of meta.json (16 hex digits)
 *   rank-RRRRR.bin     rank R's shard [R*shard, (R+1)*shard) of every unit,
 *                      unit after unit: the weights (fp32 master weights, or
 *                      the parameters in their dtype when a unit has no
 *                      master copy), then each optimizer state (fp32). The
 *                      layout is the same in every rank file (all shards of
 *                      a unit have one size), so an element's place is
 *                      arithmetic: rank = e / shard, byte = field offset +
 *                      (e % shard) * element size.
 *   extras.bin         the caller's extras blob (may be empty)
 *   rank-RRRRR.blob    (version 2) rank R's own blob
 *                      (zs_checkpoint_set_rank_blob; may be empty)
 * Version 2 adds to meta.json the optimizer's name (a callback's, or the
 * built-in one), the param groups' learning rates and weight decays
 * ("groups") and the rank blobs ("rank_blobs"); version 1 checkpoints
 * still load (their groups keep the model's rates, their blobs are empty).
 * A checkpoint root holds checkpoint directories and `latest`, a one-line
 * file naming the newest complete one.
 *
 * All sizes in BYTES unless named `elems`/`count`/`numel` (ELEMENTS).
 */
#ifndef ZS_RUNTIME_CKPT_FORMAT_H_
#define ZS_RUNTIME_CKPT_FORMAT_H_

#include <stdint.h>
#include <stdio.h>

#include <zeroshard.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS__CKPT_FORMAT "zeroshard-checkpoint"
#define ZS__CKPT_VERSION 2
#define ZS__CKPT_META "meta.json"
#define ZS__CKPT_META_SUM "meta.json.xxh64"
#define ZS__CKPT_EXTRAS "extras.bin"
#define ZS__CKPT_LATEST "latest"
#define ZS__CKPT_PATH_MAX 4096
/* The largest meta.json read (bytes): about a million tensors' entries;
 * a larger file is refused as damaged before it is read. */
#define ZS__CKPT_META_MAX ((size_t)256 << 20)
#define ZS__CKPT_MAX_STATES ZS_OPTIM_MAX_STATES

typedef struct zs__ckpt_tensor {
  char name[ZS_NAME_MAX];
  int unit;  /* index into meta units */
  int ndim;
  int64_t shape[ZS_MAX_DIMS];
  size_t numel;    /* elements */
  zs_dtype dtype;  /* the parameter dtype */
  int frozen;
  int tied_to;     /* index of the owner tensor, or -1 */
  int group;
  size_t offset;   /* elements into its unit's flat buffer (-1 for a tie) */
  int64_t step;    /* optimizer updates applied */
} zs__ckpt_tensor;

typedef struct zs__ckpt_unit {
  char name[ZS_NAME_MAX];
  zs_dtype dtype;   /* parameter dtype */
  zs_dtype wdtype;  /* stored weights: fp32 master, or dtype */
  size_t used, padded, shard; /* elements, of the saving world */
  int nstates;      /* optimizer states stored (fp32 each) */
  uint64_t field_offset[1 + ZS__CKPT_MAX_STATES]; /* bytes into a rank file:
                                                     weights, state 0, 1 */
} zs__ckpt_unit;

typedef struct zs__ckpt_meta {
  char dir[ZS__CKPT_PATH_MAX]; /* the checkpoint directory */
  int version;
  int world;  /* ranks that saved it: rank files */
  int stage;
  char optimizer[64]; /* "adamw", "adam", "sgd" or a callback's name */
  int nstates;
  int64_t iteration;     /* optimizer boundaries passed (steps_called / K) */
  int64_t steps_called;  /* zs_step calls */
  int64_t steps_applied; /* optimizer steps that ran */
  int grad_accum_steps;
  int scaler_mode;       /* zs_loss_scaling */
  double loss_scale;
  int scale_clean_steps;
  int scale_hysteresis;
  int nunits, ntensors;
  zs__ckpt_unit* units;
  zs__ckpt_tensor* tensors;
  uint64_t rank_bytes;   /* every rank file's size */
  uint64_t* rank_xxh64;  /* world entries */
  uint64_t extras_bytes, extras_xxh64;
  /* version 2 (0 / NULL for version 1) */
  int ngroups;
  double* group_lr;       /* ngroups entries */
  double* group_wd;
  uint64_t* blob_bytes;   /* world entries: rank-RRRRR.blob */
  uint64_t* blob_xxh64;
} zs__ckpt_meta;

/* "rank-00003.bin" etc. into buf; and "rank-00003.blob". */
void zs__ckpt_rank_file(int rank, char* buf, size_t cap);
void zs__ckpt_blob_file(int rank, char* buf, size_t cap);
/* a + "/" + b into out; INVALID_ARGUMENT if it does not fit. */
zs_status zs__ckpt_join(char* out, size_t cap, const char* a, const char* b);

/* Resolves `path` to a checkpoint directory (it holds meta.json, or it is a
 * root whose `latest` names one), reads meta.json, checks it against
 * meta.json.xxh64 and parses it. Errors: IO (missing files, naming them),
 * CORRUPT (checksum mismatch, bad JSON, a field missing or out of range,
 * naming the file and the field), UNSUPPORTED (a newer format version).
 * Free with zs__ckpt_meta_free (also after an error). */
zs_status zs__ckpt_meta_read(const char* path, zs__ckpt_meta* out);
void zs__ckpt_meta_free(zs__ckpt_meta* m);

/* Serializes meta (dir unused) to a JSON text, malloc'd into *out.
 * Errors: OUT_OF_MEMORY. */
zs_status zs__ckpt_meta_json(const zs__ckpt_meta* m, char** out);

/* Checks one file of the checkpoint against the metadata: its size, then
 * its xxHash64 streamed over the whole file. file: a rank (0..world-1), or
 * -1 for extras.bin, or world + R for rank R's blob (version 2). Errors: IO (missing/unreadable), CORRUPT (size or
 * checksum), each naming the file's path. */
zs_status zs__ckpt_verify_file(const zs__ckpt_meta* m, int file);

/* Open rank files of one checkpoint, opened on first use. */
typedef struct zs__ckpt_reader {
  const zs__ckpt_meta* meta;
  int* fds; /* world entries, -1 until opened */
} zs__ckpt_reader;
zs_status zs__ckpt_reader_open(zs__ckpt_reader* r, const zs__ckpt_meta* m);
void zs__ckpt_reader_close(zs__ckpt_reader* r);

/* Reads elements [begin, begin + count) of field `field` (0: weights in
 * the unit's wdtype; k >= 1: optimizer state k-1, fp32) of saved unit
 * `unit`'s flat buffer into out, from the rank files holding them
 * (pread, synchronous). Errors: INVALID_ARGUMENT (out of the unit, a field
 * it does not have), IO/CORRUPT naming the file and byte offset (a short
 * read is CORRUPT: the file is truncated). */
zs_status zs__ckpt_read(zs__ckpt_reader* r, int unit, int field, size_t begin,
                        size_t count, void* out);

/* Reads `count` elements of saved tensor `tensor`'s weights from element
 * `first` on, converted to `dtype` (fp32/bf16/fp16, zs_convert's rounding),
 * into out. A tie reads its owner. Uses a bounded staging buffer.
 * Errors: as zs__ckpt_read, OUT_OF_MEMORY. */
zs_status zs__ckpt_read_weights(zs__ckpt_reader* r, int tensor, size_t first,
                                size_t count, zs_dtype dtype, void* out);

/* ---- Writing ---- */

/* A file being written with a running xxHash64. */
typedef struct zs__ckpt_writer {
  int fd;
  char path[ZS__CKPT_PATH_MAX];
  uint64_t bytes;
  void* hash; /* XXH64_state_t* */
} zs__ckpt_writer;

/* Creates path exclusively (O_EXCL: never writes over an existing file).
 * Errors: IO naming the path and errno's text. */
zs_status zs__ckpt_writer_open(zs__ckpt_writer* w, const char* path);
/* Appends bytes (retrying short writes and EINTR). Errors: IO naming the
 * path and the byte offset (disk full etc.). */
zs_status zs__ckpt_writer_write(zs__ckpt_writer* w, const void* data,
                                size_t bytes);
/* fsyncs and closes; *xxh64 receives the checksum of all bytes written.
 * Errors: IO naming the path. Always closes. */
zs_status zs__ckpt_writer_finish(zs__ckpt_writer* w, uint64_t* xxh64);
/* Closes and removes a file being written (after an error). */
void zs__ckpt_writer_abort(zs__ckpt_writer* w);

/* Writes a whole small file (create exclusively, write, fsync, close).
 * Errors: IO naming the path. */
zs_status zs__ckpt_write_small(const char* path, const void* data,
                               size_t bytes, uint64_t* xxh64);
/* fsyncs a directory (so created/renamed entries are durable). */
zs_status zs__ckpt_fsync_dir(const char* path);
/* Whether n (a file name, no directory) is one this format writes into a
 * checkpoint directory: meta.json, meta.json.xxh64, extras.bin,
 * rank-NNNNN.bin, rank-NNNNN.blob. */
int zs__ckpt_own_name(const char* n);
/* Removes a checkpoint-shaped directory: the files this format writes
 * (meta, checksums, extras, rank files) and then the directory. If it holds
 * anything else, nothing is removed (IO naming the entry), so a wrong path
 * never loses user data and a checkpoint is never left half-removed. A
 * missing directory is OK. */
zs_status zs__ckpt_remove_dir(const char* path);

/* A durable step of a save (a file finished, a rename) on `rank`: calls
 * zs__ckpt_fault_hook when one is set. The crash-safety tests set it
 * (tests/testing/ckpt_faults.c: ZS_CKPT_CRASH_AFTER kills the process
 * there, as a crash would); the library never does, so shipped builds
 * carry no fault injection. */
void zs__ckpt_crash_point(int rank, const char* what);
extern void (*zs__ckpt_fault_hook)(int rank, const char* what);

#ifdef __cplusplus
}
#endif

#endif /* ZS_RUNTIME_CKPT_FORMAT_H_ */
