/*
 * config_caller.c — a program built against this release's header,
 * linked (config_future_test) with the configuration code of a future
 * release whose zs_config has a field appended (tests/compat/BUILD makes
 * that header: a copy of this one with `int future_field;` at the end of
 * zs_config and version 0.5): the library accepts the smaller struct,
 * gives the caller's fields their values and never writes past its
 * struct_size. Exit status 0 when every check holds.
 */
#include <stdio.h>
#include <string.h>
#include <zeroshard.h>

#include "tests/compat/check.h"

typedef struct {
  zs_config c;
  unsigned char canary[64];
} guarded;

static int intact(const guarded* g) {
  for (int i = 0; i < 64; i++)
    if (g->canary[i] != 0xC5) return 0;
  return 1;
}

int main(void) {
  printf("caller: header %d, zs_config %zu bytes; library %s\n",
         ZS_VERSION_CODE, sizeof(zs_config), zs_version_string());
  CHECK(zs_version() > ZS_VERSION_CODE, "the library is %d, not newer",
        zs_version());
  guarded g;
  memset(&g, 0xC5, sizeof g);
  CHECK(zs_config_init(&g.c) == ZS_OK, "%s", zs_last_error());
  CHECK(g.c.struct_size == sizeof(zs_config) && g.c.version == ZS_VERSION_CODE,
        "init stamped %zu %u", g.c.struct_size, g.c.version);
  CHECK(g.c.optimizer.lr == 1e-3 && g.c.prefetch_depth == 2, "defaults");
  CHECK(intact(&g), "zs_config_init wrote past the caller's struct");

  zs_config c = ZS_CONFIG_INIT;
  c.stage = 3;
  c.optimizer.lr = 0.25;
  c.prefetch_depth = 5;
  CHECK(zs_config_validate(&c) == ZS_OK, "%s", zs_last_error());
  memset(&g, 0xC5, sizeof g);
  g.c.struct_size = sizeof(zs_config);
  g.c.version = ZS_VERSION_CODE;
  CHECK(zs_config_resolve(&c, &g.c) == ZS_OK, "%s", zs_last_error());
  CHECK(g.c.stage == 3 && g.c.optimizer.lr == 0.25 && g.c.prefetch_depth == 5 &&
            g.c.bucket_elements == ((size_t)1 << 22) &&
            g.c.struct_size == sizeof(zs_config),
        "resolved");
  CHECK(intact(&g), "zs_config_resolve wrote past the caller's struct");

  memset(&g, 0xC5, sizeof g);
  g.c = c;
  CHECK(zs_config_from_json("{\"zero_optimization\": {\"stage\": 1}, "
                            "\"optimizer\": {\"params\": {\"lr\": 0.5}}}",
                            &g.c) == ZS_OK,
        "%s", zs_last_error());
  CHECK(g.c.stage == 1 && g.c.optimizer.lr == 0.5 && g.c.prefetch_depth == 5,
        "from_json");
  CHECK(intact(&g), "zs_config_from_json wrote past the caller's struct");
  printf("this release's caller against a library with a field appended: "
         "%d checks, %d failed\n", checks, failures);
  return failures != 0;
}
