/*
 * config_caller_v0_3.c — a program written and built against ZeroShard
 * 0.3's header (commit a774898's runtime/include/zeroshard.h, the last of
 * 0.3, kept unchanged in tests/compat/v0_3/: zs_config is 352 bytes,
 * without 0.4's shard_group_size and reserved_0_4), linked with this
 * library: init, validate, resolve and JSON accept its 352-byte struct,
 * keep the values of its fields (0.3's own included), give it the
 * defaults for the rest and write nothing past it; a local context made
 * from it keeps 0.3's release; a JSON key for a field 0.4 appended is
 * refused, naming the key, and leaves the config unchanged. Exit status 0
 * when every check holds.
 */
#include <stdio.h>
#include <string.h>
#include <zeroshard.h> /* 0.3's */

#include "tests/compat/check.h"

_Static_assert(ZS_VERSION_CODE == 300, "tests/compat/v0_3 is 0.3's header");
_Static_assert(sizeof(zs_config) == 352, "0.3's zs_config is 352 bytes");

#define CANARY 0xC5
typedef struct {
  zs_config c;
  unsigned char canary[64];
} guarded;

static int intact(const guarded* g) {
  for (int i = 0; i < 64; i++)
    if (g->canary[i] != CANARY) return 0;
  return 1;
}

/* 0.3's fields, as this program set them */
static int kept_0_3(const zs_config* c, size_t threshold, double heartbeat,
                    zs_host_collectives hc) {
  return c->struct_size == 352 && c->version == 300 &&
         c->param_persistence_threshold == threshold &&
         c->heartbeat_timeout_s == heartbeat && c->host_collectives == hc &&
         c->reserved_0_3 == 0;
}

/* a JSON text for a field 0.4 appended: refused, naming KEY; the config
 * and the bytes past it unchanged */
static void refused(const char* text, const char* key) {
  guarded g, before;
  memset(&g, CANARY, sizeof g);
  CHECK(zs_config_init(&g.c) == ZS_OK, "%s", zs_last_error());
  memcpy(&before, &g, sizeof g);
  CHECK(zs_config_from_json(text, &g.c) == ZS_ERR_INVALID_ARGUMENT,
        "%s: accepted for a 0.3 caller", text);
  const char* e = zs_last_error();
  CHECK(strstr(e, key) != NULL, "%s: the error does not name %s: %s", text,
        key, e);
  CHECK(strstr(e, "version 0.3, 352 bytes") != NULL,
        "%s: the error does not name the caller's release: %s", text, e);
  CHECK(memcmp(&g, &before, sizeof g) == 0, "%s: config changed on error",
        text);
}

int main(void) {
  printf("caller: header %d, zs_config %zu bytes; library %s\n",
         ZS_VERSION_CODE, sizeof(zs_config), zs_version_string());
  CHECK(zs_version() > ZS_VERSION_CODE, "the library is %d, not newer",
        zs_version());

  /* init: 0.3's size and version, the defaults of 0.3's fields */
  guarded g;
  memset(&g, CANARY, sizeof g);
  CHECK(zs_config_init(&g.c) == ZS_OK, "%s", zs_last_error());
  CHECK(kept_0_3(&g.c, 0, 30.0, ZS_HOST_COLLECTIVES_AUTO),
        "init: %zu bytes, version %u, threshold %zu, heartbeat %g, host "
        "collectives %d", g.c.struct_size, g.c.version,
        g.c.param_persistence_threshold, g.c.heartbeat_timeout_s,
        (int)g.c.host_collectives);
  CHECK(g.c.optimizer.lr == 1e-3 && g.c.prefetch_depth == 2, "defaults");
  CHECK(intact(&g), "zs_config_init wrote past the caller's struct");

  /* validate and resolve: a non-default value in 0.3's fields and others */
  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.optimizer.lr = 0.25;
  c.prefetch_depth = 5;
  c.param_persistence_threshold = 64;
  c.heartbeat_timeout_s = 7.0;
  c.host_collectives = ZS_HOST_COLLECTIVES_MPI;
  CHECK(c.struct_size == 352 && c.version == 300, "ZS_CONFIG_INIT: %zu %u",
        c.struct_size, c.version);
  CHECK(zs_config_validate(&c) == ZS_OK, "%s", zs_last_error());
  memset(&g, CANARY, sizeof g);
  g.c.struct_size = sizeof(zs_config);
  g.c.version = ZS_VERSION_CODE;
  CHECK(zs_config_resolve(&c, &g.c) == ZS_OK, "%s", zs_last_error());
  CHECK(kept_0_3(&g.c, 64, 7.0, ZS_HOST_COLLECTIVES_MPI) && g.c.stage == 3 &&
            g.c.optimizer.lr == 0.25 && g.c.prefetch_depth == 5 &&
            g.c.bucket_elements == ((size_t)1 << 22),
        "resolved");
  CHECK(intact(&g), "zs_config_resolve wrote past the caller's struct");

  /* JSON: 0.3's keys set 0.3's fields; the rest kept */
  memset(&g, CANARY, sizeof g);
  g.c = c;
  CHECK(zs_config_from_json(
            "{\"zero_optimization\": {\"stage\": 1, "
            "\"stage3_param_persistence_threshold\": 128}, "
            "\"heartbeat_timeout\": 9, \"host_collectives\": \"shm\", "
            "\"optimizer\": {\"params\": {\"lr\": 0.5}}}",
            &g.c) == ZS_OK,
        "%s", zs_last_error());
  CHECK(kept_0_3(&g.c, 128, 9.0, ZS_HOST_COLLECTIVES_SHM) && g.c.stage == 1 &&
            g.c.optimizer.lr == 0.5 && g.c.prefetch_depth == 5,
        "from_json");
  CHECK(intact(&g), "zs_config_from_json wrote past the caller's struct");

  /* 0.4's keys: this program's struct has no field for them */
  refused("{\"shard_group_size\": 2}", "shard_group_size");
  refused("{\"shard_group_size\": \"node\"}", "shard_group_size");
  refused("{\"zero_optimization\": {\"mics_shard_size\": 2}}",
          "zero_optimization.mics_shard_size");

  /* a context made from it keeps 0.3's release and fields */
  zs_context* ctx = NULL;
  CHECK(zs_context_create_local(&c, &ctx) == ZS_OK, "%s", zs_last_error());
  if (ctx != NULL) {
    const zs_config* got = zs_context_config(ctx);
    CHECK(got != NULL && kept_0_3(got, 64, 7.0, ZS_HOST_COLLECTIVES_MPI) &&
              got->stage == 3 && got->optimizer.lr == 0.25,
          "zs_context_config: %zu bytes, version %u",
          got != NULL ? got->struct_size : 0, got != NULL ? got->version : 0);
    zs_context_destroy(ctx);
  }
  printf("a 0.3 caller against this library: %d checks, %d failed\n", checks,
         failures);
  return failures != 0;
}
