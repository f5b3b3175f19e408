/*
 * data.c — loading and batching of the byte-level dataset (data.h).
 */
#include "examples/gpt2/data.h"

#include <errno.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gpt2_data_load(const char* path, int T, gpt2_data* d, char* err,
                   size_t cap) {
  memset(d, 0, sizeof *d);
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    snprintf(err, cap, "--data %s is not a regular file", path);
    return -1;
  }
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, cap, "--data %s: %s", path, strerror(errno));
    return -1;
  }
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
    snprintf(err, cap, "--data %s: cannot determine its size", path);
    fclose(f);
    return -1;
  }
  d->bytes = (unsigned char*)malloc((size_t)size + 1);
  if (d->bytes == NULL ||
      fread(d->bytes, 1, (size_t)size, f) != (size_t)size) {
    snprintf(err, cap, "--data %s: cannot read %ld bytes", path, size);
    fclose(f);
    gpt2_data_free(d);
    return -1;
  }
  fclose(f);
  d->size = (size_t)size;
  d->train_size = d->size / 10 * 9;
  size_t need = (size_t)T + 1;
  if (d->train_size < need || d->size - d->train_size < need) {
    snprintf(err, cap,
             "--data %s has %zu bytes: too short for --seq %d (each split "
             "needs at least %zu bytes; the val split is 10%% of the file)",
             path, d->size, T, need);
    gpt2_data_free(d);
    return -1;
  }
  return 0;
}

void gpt2_data_free(gpt2_data* d) {
  free(d->bytes);
  memset(d, 0, sizeof *d);
}

static uint64_t gpt2__hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void gpt2__copy_seq(const unsigned char* src, int T, int* tokens,
                           int* targets) {
  for (int t = 0; t < T; t++) {
    tokens[t] = src[t];
    targets[t] = src[t + 1];
  }
}

void gpt2_data_train_batch(const gpt2_data* d, unsigned long long seed,
                           long step, int first, int count, int T, int* tokens,
                           int* targets) {
  const uint64_t span = d->train_size - (size_t)T; /* valid start offsets */
  for (int j = 0; j < count; j++) {
    uint64_t key = gpt2__hash(gpt2__hash(seed) ^ gpt2__hash((uint64_t)step) ^
                              (uint64_t)(first + j) * 0x100000001b3ull);
    size_t start = (size_t)(key % span);
    gpt2__copy_seq(d->bytes + start, T, tokens + (size_t)j * T,
                   targets + (size_t)j * T);
  }
}

void gpt2_data_val_batch(const gpt2_data* d, int first, int count, int total,
                         int T, int* tokens, int* targets) {
  const size_t val = d->size - d->train_size;
  const size_t span = val - (size_t)T; /* valid start offsets, >= 1 */
  for (int j = 0; j < count; j++) {
    size_t i = (size_t)(first + j);
    size_t start = d->train_size + (total > 1 ? i * (span - 1) / (size_t)(total - 1) : 0);
    gpt2__copy_seq(d->bytes + start, T, tokens + (size_t)j * T,
                   targets + (size_t)j * T);
  }
}
