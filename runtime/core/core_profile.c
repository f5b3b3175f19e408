/*
 * core_profile.c — the per-rank timeline (docs/profiling.md): memory
 * counter samples at every allocation and free, spans for collectives,
 * gathers, the optimizer and the step, kept in memory and written as one
 * Chrome trace-event JSON file per rank when the context is destroyed
 * (Perfetto UI and chrome://tracing open it). The file is written to a
 * temporary name and renamed, so a reader never sees half of one.
 * Profiling never stops a run: a directory that cannot be written is a
 * warning, once, and profiling is off.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/core/core.h"

typedef struct zs__prof_event {
  double t0, t1;          /* zs__now() seconds; t1 < 0: a counter sample */
  int tid;                /* 0 the caller, 1 communication */
  char name[64];
  const char* cat;        /* static */
  char unit[ZS_NAME_MAX]; /* the whole unit name */
  uint64_t bytes;
  double algbw, busbw;
  size_t mem[ZS_MEM_CATEGORY_COUNT]; /* counter samples */
  size_t buckets;                    /* ... of comm_buffers, buckets */
} zs__prof_event;

struct zs__profiler {
  pthread_mutex_t lock;
  char path[4096];
  int rank, world;
  uint64_t run_id;        /* the same on every rank of one context */
  double t0;              /* zs__now() at creation */
  double wall0;           /* CLOCK_REALTIME seconds at creation */
  zs__prof_event* ev;
  size_t n, cap;
  int dropped;            /* events over ZS__PROF_MAX_EVENTS */
};

/* 4M events (~1.2 GB at ~300 bytes each; not in the accounting) at most;
 * later ones are counted, not kept. */
#define ZS__PROF_MAX_EVENTS ((size_t)1 << 22)

/* Contexts created by this process that profile: the first writes
 * zs_profile_rank<R>.json, later ones zs_profile_rank<R>.ctx<K>.json, so
 * none overwrites another (memreport reads the first kind; pass it a
 * directory per context otherwise). */
static int zs__prof_contexts = 0;

zs_status zs__profiler_create(const char* dir, int rank, int world,
                              uint64_t run_id, zs__profiler** out) {
  *out = NULL;
  if (dir == NULL || dir[0] == '\0') return ZS_OK;
  zs__profiler* p = (zs__profiler*)calloc(1, sizeof *p);
  if (p == NULL) {
    zs__log(ZS_LOG_WARN, "profiling off: out of memory");
    return ZS_OK;
  }
  const int k = __atomic_fetch_add(&zs__prof_contexts, 1, __ATOMIC_RELAXED);
  int n = k == 0 ? snprintf(p->path, sizeof p->path,
                            "%s/zs_profile_rank%d.json", dir, rank)
                 : snprintf(p->path, sizeof p->path,
                            "%s/zs_profile_rank%d.ctx%d.json", dir, rank, k);
  p->run_id = run_id;
  /* Prove the directory writable now, not at the end of the run. */
  char probe[4200];
  snprintf(probe, sizeof probe, "%s.probe%d", p->path, (int)getpid());
  errno = ENAMETOOLONG;
  FILE* f = n > 0 && (size_t)n < sizeof p->path ? fopen(probe, "w") : NULL;
  if (f == NULL) {
    zs__log(ZS_LOG_WARN, "profiling off: cannot write in %s (%s); training "
            "continues", dir, strerror(errno));
    free(p);
    return ZS_OK;
  }
  fclose(f);
  unlink(probe);
  pthread_mutex_init(&p->lock, NULL);
  p->rank = rank;
  p->world = world;
  p->t0 = zs__now();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  p->wall0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  *out = p;
  return ZS_OK;
}

/* A new event slot (lock held), or NULL when full. */
static zs__prof_event* zs__prof_push(zs__profiler* p) {
  if (p->n == p->cap) {
    if (p->cap >= ZS__PROF_MAX_EVENTS) {
      p->dropped++;
      return NULL;
    }
    size_t cap = p->cap == 0 ? 4096 : 2 * p->cap;
    zs__prof_event* e = (zs__prof_event*)realloc(p->ev, cap * sizeof *e);
    if (e == NULL) {
      p->dropped++;
      return NULL;
    }
    p->ev = e;
    p->cap = cap;
  }
  zs__prof_event* e = &p->ev[p->n++];
  memset(e, 0, sizeof *e);
  return e;
}

void zs__profiler_counter(zs__profiler* p, const size_t* current,
                          size_t comm_buckets) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  zs__prof_event* e = zs__prof_push(p);
  if (e != NULL) {
    e->t0 = zs__now();
    e->t1 = -1;
    memcpy(e->mem, current, sizeof e->mem);
    e->buckets = comm_buckets;
  }
  pthread_mutex_unlock(&p->lock);
}

void zs__profiler_span(zs__profiler* p, int tid, const char* name,
                       const char* cat, double t0, double t1,
                       const char* unit, uint64_t bytes, double algbw,
                       double busbw) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  zs__prof_event* e = zs__prof_push(p);
  if (e != NULL) {
    e->t0 = t0;
    e->t1 = t1 >= t0 ? t1 : t0;
    e->tid = tid;
    /* cut at a character boundary, never inside a UTF-8 sequence */
    size_t k = strlen(name);
    if (k >= sizeof e->name) {
      k = sizeof e->name - 1;
      while (k > 0 && ((unsigned char)name[k] & 0xC0) == 0x80) k--;
    }
    memcpy(e->name, name, k);
    e->name[k] = '\0';
    e->cat = cat;
    snprintf(e->unit, sizeof e->unit, "%s", unit != NULL ? unit : "");
    e->bytes = bytes;
    e->algbw = algbw;
    e->busbw = busbw;
  }
  pthread_mutex_unlock(&p->lock);
}

/* JSON string characters of a name (names are ours or the user's unit
 * names: escape quotes, backslashes and control bytes). */
static void zs__prof_str(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s != '\0'; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

void zs__profiler_destroy(zs__profiler* p, const zs_memory_stats* final) {
  if (p == NULL) return;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp%d", p->path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  int ok = f != NULL;
  if (ok) {
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"format\":"
            "\"zeroshard-profile\",\"version\":1,\"rank\":%d,\"world\":%d,"
            "\"run_id\":\"%016llx\",\"start_unix_s\":%.6f,"
            "\"dropped_events\":%d,\"peak_bytes\":{",
            p->rank, p->world, (unsigned long long)p->run_id, p->wall0,
            p->dropped);
    for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++)
      fprintf(f, "\"%s\":%zu,", zs_mem_category_name((zs_mem_category)k),
              final != NULL ? final->peak[k] : 0);
    fprintf(f, "\"total\":%zu}},\n\"traceEvents\":[\n",
            final != NULL ? final->total_peak : 0);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":"
            "{\"name\":\"rank %d\"}},\n{\"name\":\"thread_name\",\"ph\":\"M\","
            "\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"caller\"}},\n{\"name\":"
            "\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":"
            "{\"name\":\"collectives\"}},\n{\"name\":\"thread_name\",\"ph\":"
            "\"M\",\"pid\":%d,\"tid\":2,\"args\":{\"name\":\"phases\"}}",
            p->rank, p->rank, p->rank, p->rank, p->rank);
    for (size_t i = 0; i < p->n; i++) {
      const zs__prof_event* e = &p->ev[i];
      const double ts = (e->t0 - p->t0) * 1e6;
      if (e->t1 < 0) {
        fprintf(f, ",\n{\"name\":\"memory\",\"ph\":\"C\",\"ts\":%.3f,"
                "\"pid\":%d,\"tid\":0,\"args\":{", ts, p->rank);
        for (int k = 0; k < ZS_MEM_CATEGORY_COUNT; k++)
          fprintf(f, "%s\"%s\":%zu", k ? "," : "",
                  zs_mem_category_name((zs_mem_category)k), e->mem[k]);
        /* comm_buffers in detail, on its own track */
        fprintf(f, "}},\n{\"name\":\"comm_buffers detail\",\"ph\":\"C\","
                "\"ts\":%.3f,\"pid\":%d,\"tid\":0,\"args\":{\"buckets\":%zu,"
                "\"accumulation\":%zu}}", ts, p->rank, e->buckets,
                e->mem[ZS_MEM_COMM_BUFFERS] - e->buckets);
        continue;
      }
      fputs(",\n{\"name\":", f);
      zs__prof_str(f, e->name);
      fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
              "\"pid\":%d,\"tid\":%d,\"args\":{\"unit\":",
              e->cat, ts, (e->t1 - e->t0) * 1e6, p->rank, e->tid);
      zs__prof_str(f, e->unit);
      if (e->bytes > 0 || e->tid == 1)
        fprintf(f, ",\"bytes\":%llu,\"algbw_GBps\":%.6g,\"busbw_GBps\":%.6g",
                (unsigned long long)e->bytes, e->algbw, e->busbw);
      fputs("}}", f);
    }
    fputs("\n]}\n", f);
    ok = !ferror(f);
    if (fclose(f) != 0) ok = 0;
  }
  if (ok && rename(tmp, p->path) != 0) ok = 0;
  if (!ok) {
    zs__log(ZS_LOG_WARN, "profile: could not write %s (%s)", p->path,
            strerror(errno));
    unlink(tmp);
  } else if (p->dropped > 0) {
    zs__log(ZS_LOG_WARN, "profile %s: %d events over the limit were dropped",
            p->path, p->dropped);
  }
  free(p->ev);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
