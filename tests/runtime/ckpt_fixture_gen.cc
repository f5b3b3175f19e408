// ckpt_fixture_gen.cc — writes a checkpoint fixture of the current format:
// the model of ckpt_fixture_model.h after 2 steps, learning rate of group
// 0 set to 5e-3 before the save, extras "fixture extras", into ROOT/step-2.
// Run once per format version, with the library of that version:
//   bazel run //tests/runtime:ckpt_fixture_gen -- $PWD/tests/runtime/testdata/ckpt_vN
// (ckpt_v1 was written at commit edc743f's library, format version 1).
#include <cstdio>
#include <cstring>

#include "tests/runtime/ckpt_fixture_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ROOT\n", argv[0]);
    return 2;
  }
  zsfixture::Fixture f;
  zs_status st = zsfixture::Build(&f);
  for (int s = 0; s < 2 && st == ZS_OK; s++) st = zsfixture::Step(&f, s);
  if (st == ZS_OK) st = zs_model_set_lr(f.m, 0, 5e-3);
  const char extras[] = "fixture extras";
  if (st == ZS_OK)
    st = zs_checkpoint_save(f.m, argv[1], "step-2", extras, sizeof extras);
  if (st != ZS_OK)
    std::fprintf(stderr, "ckpt_fixture_gen: %s\n", zs_last_error());
  zsfixture::Destroy(&f);
  return st == ZS_OK ? 0 : 1;
}
