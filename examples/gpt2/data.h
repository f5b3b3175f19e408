/*
 * data.h — byte-level Tiny Shakespeare batches for the GPT-2 example.
 *
 * The file is split 90/10 into train and val bytes. A step's GLOBAL batch is
 * `batch` sequences of T+1 bytes (inputs and next-byte targets); sequence j
 * of step s starts at an offset that is a pure function of (seed, s, j), so
 * every rank can read its own slice [rank*batch/W, (rank+1)*batch/W) and the
 * global batch is the same at every world size. Validation uses a fixed set
 * of sequences spread evenly over the val split, the same for every run.
 */
#ifndef ZS_EXAMPLES_GPT2_DATA_H
#define ZS_EXAMPLES_GPT2_DATA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt2_data {
  unsigned char* bytes; /* the whole file */
  size_t size;          /* bytes */
  size_t train_size;    /* the first 90% */
  /* val: bytes[train_size, size) */
} gpt2_data;

/* Reads the file. Returns 0, or -1 with a message in err naming the file
 * (missing, unreadable, or too short for sequences of T+1 bytes in both
 * splits). */
int gpt2_data_load(const char* path, int T, gpt2_data* d, char* err,
                   size_t cap);
void gpt2_data_free(gpt2_data* d);

/* Sequences [first, first+count) of step `step`'s global batch: tokens and
 * targets, each (count, T). */
void gpt2_data_train_batch(const gpt2_data* d, unsigned long long seed,
                           long step, int first, int count, int T, int* tokens,
                           int* targets);

/* Validation sequences [first, first+count) out of `total` sequences spread
 * evenly over the val split. */
void gpt2_data_val_batch(const gpt2_data* d, int first, int count, int total,
                         int T, int* tokens, int* targets);

#ifdef __cplusplus
}
#endif

#endif /* ZS_EXAMPLES_GPT2_DATA_H */
