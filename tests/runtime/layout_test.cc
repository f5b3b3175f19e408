// layout_test.cc — runtime/layout/layout.c: zs__layout_align, zs__layout_unit and
// zs__layout_pieces, single process, no MPI.
//
// Every expectation is either written out by hand (small cases) or found by
// brute force over an ownership array (one entry per buffer element, naming
// the tensor that owns it or kGap), never by the formula layout.c uses:
//  - an offset is the FIRST aligned position at or after the previous
//    tensor's end (found by stepping one element at a time);
//  - padded is the FIRST multiple of world*align at or after used;
//  - the pieces of a span are read off the ownership array element by
//    element, and the union of every rank's pieces must cover each tensor
//    element exactly once and no gap or padding element.
#include <gtest/gtest.h>
#include <zeroshard.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/layout/layout.h"

namespace {

constexpr size_t kFp32Align = 16;  // 64 bytes of 4-byte elements
constexpr size_t kAliasOffset = static_cast<size_t>(-1);
constexpr int kGap = -1;  // an ownership entry for gap or padding
const int kWorlds[] = {1, 2, 3, 4, 8};

// One unit to lay out: per-tensor element counts, alias and skip flags.
struct UnitSpec {
  std::vector<size_t> numels;
  std::vector<int> alias;
  std::vector<int> skip;  // empty: pass NULL
};

UnitSpec Spec(std::vector<size_t> numels, std::vector<int> alias = {},
              std::vector<int> skip = {}) {
  UnitSpec s;
  s.numels = std::move(numels);
  s.alias = alias.empty() ? std::vector<int>(s.numels.size(), 0) : alias;
  s.skip = std::move(skip);
  return s;
}

std::string Describe(const UnitSpec& s, size_t align, int world) {
  std::string d = "align " + std::to_string(align) + ", world " +
                  std::to_string(world) + ", tensors [";
  for (size_t i = 0; i < s.numels.size(); i++) {
    if (i > 0) d += ", ";
    d += std::to_string(s.numels[i]);
    if (s.alias[i]) d += " (alias)";
    if (!s.skip.empty() && s.skip[i]) d += " (skip)";
  }
  return d + "]";
}

struct Laid {
  std::vector<size_t> offsets;
  zs__unit_layout layout;
};

// Runs zs__layout_unit and asserts it succeeds.
Laid LayOut(const UnitSpec& s, size_t align, int world) {
  Laid r;
  r.offsets.assign(s.numels.size(), 12345);
  std::memset(&r.layout, 0xA5, sizeof r.layout);
  zs_status st = zs__layout_unit(s.numels.data(), s.alias.data(),
                                 static_cast<int>(s.numels.size()), align,
                                 world, r.offsets.data(), &r.layout);
  EXPECT_EQ(st, ZS_OK) << Describe(s, align, world) << ": "
                       << zs_last_error();
  return r;
}

// Brute-force checks of one layout; returns the ownership array over
// [0, padded) (kGap for gaps and padding).
std::vector<int> CheckLayout(const UnitSpec& s, size_t align, int world,
                             const Laid& r) {
  SCOPED_TRACE(Describe(s, align, world));
  const zs__unit_layout& l = r.layout;
  size_t prev_end = 0;
  for (size_t i = 0; i < s.numels.size(); i++) {
    if (s.alias[i]) {
      EXPECT_EQ(r.offsets[i], kAliasOffset) << "alias tensor " << i;
      continue;
    }
    size_t first_aligned = prev_end;
    while (first_aligned % align != 0) first_aligned++;
    EXPECT_EQ(r.offsets[i], first_aligned) << "tensor " << i;
    EXPECT_EQ(r.offsets[i] % align, 0u) << "tensor " << i;
    if (align == kFp32Align) {
      EXPECT_EQ((r.offsets[i] * sizeof(float)) % ZS_LAYOUT_ALIGN_BYTES, 0u)
          << "tensor " << i << " (bytes of fp32)";
    }
    prev_end = r.offsets[i] + s.numels[i];
  }
  EXPECT_EQ(l.used, prev_end);

  size_t quantum = align * static_cast<size_t>(world);
  size_t first_multiple = l.used;
  while (first_multiple % quantum != 0) first_multiple++;
  EXPECT_EQ(l.padded, first_multiple);
  EXPECT_EQ(l.padded % quantum, 0u);
  EXPECT_GE(l.padded, l.used);
  EXPECT_EQ(l.shard * static_cast<size_t>(world), l.padded);
  EXPECT_EQ(l.shard % align, 0u) << "every shard must start aligned";
  for (int r2 = 0; r2 < world; r2++)
    EXPECT_EQ(zs__layout_shard_begin(&l, r2), l.shard * r2) << "rank " << r2;

  std::vector<int> owner(l.padded, kGap);
  for (size_t i = 0; i < s.numels.size(); i++) {
    if (s.alias[i]) continue;
    for (size_t k = 0; k < s.numels[i]; k++) {
      size_t pos = r.offsets[i] + k;
      if (pos >= owner.size()) {
        ADD_FAILURE() << "tensor " << i << " element " << k << " at " << pos
                      << " lies past padded " << l.padded;
        continue;
      }
      EXPECT_EQ(owner[pos], kGap) << "element " << pos << " owned by tensor "
                                  << owner[pos] << " and tensor " << i;
      owner[pos] = static_cast<int>(i);
    }
  }
  return owner;
}

// Runs zs__layout_pieces on [begin, end): sizes it with cap 0, then fills.
std::vector<zs__piece> Pieces(const UnitSpec& s, const Laid& r, size_t begin,
                              size_t end) {
  const int* skip = s.skip.empty() ? nullptr : s.skip.data();
  int n = static_cast<int>(s.numels.size());
  size_t count = zs__layout_pieces(r.offsets.data(), s.numels.data(),
                                   s.alias.data(), skip, n, begin, end,
                                   nullptr, 0);
  // One sentinel past the end catches writes beyond cap.
  std::vector<zs__piece> out(count + 1);
  out[count] = zs__piece{-7, 7, 7, 7};
  size_t again = zs__layout_pieces(r.offsets.data(), s.numels.data(),
                                   s.alias.data(), skip, n, begin, end,
                                   out.data(), count);
  EXPECT_EQ(again, count) << "sizing call and filling call disagree";
  EXPECT_EQ(out[count].tensor, -7) << "wrote past cap";
  out.resize(count);
  return out;
}

bool Skipped(const UnitSpec& s, int t) {
  return s.alias[t] || (!s.skip.empty() && s.skip[t]);
}

// Checks the pieces of [begin, end) against the ownership array: each piece
// is a run of one non-skipped tensor's elements, pieces are in buffer order
// and disjoint, and every non-skipped tensor element in the span is in
// exactly one piece (one piece per tensor, since a tensor is contiguous).
// covered[t][k] counts how often element k of tensor t was seen.
void CheckPieces(const UnitSpec& s, const Laid& r,
                 const std::vector<int>& owner, size_t begin, size_t end,
                 std::vector<std::vector<int>>* covered) {
  SCOPED_TRACE("span [" + std::to_string(begin) + ", " + std::to_string(end) +
               ")");
  std::vector<zs__piece> pieces = Pieces(s, r, begin, end);
  std::vector<int> seen(end > begin ? end - begin : 0, 0);
  size_t prev_span_end = 0;
  for (size_t p = 0; p < pieces.size(); p++) {
    const zs__piece& pc = pieces[p];
    SCOPED_TRACE("piece " + std::to_string(p));
    ASSERT_GE(pc.tensor, 0);
    ASSERT_LT(pc.tensor, static_cast<int>(s.numels.size()));
    EXPECT_FALSE(Skipped(s, pc.tensor)) << "tensor " << pc.tensor;
    EXPECT_GT(pc.count, 0u);
    ASSERT_LE(pc.tensor_offset + pc.count, s.numels[pc.tensor]);
    ASSERT_LE(pc.span_offset + pc.count, end - begin);
    EXPECT_GE(pc.span_offset, prev_span_end) << "not in buffer order";
    prev_span_end = pc.span_offset + pc.count;
    EXPECT_EQ(begin + pc.span_offset, r.offsets[pc.tensor] + pc.tensor_offset)
        << "span and tensor offsets name different buffer elements";
    for (size_t k = 0; k < pc.count; k++) {
      size_t pos = begin + pc.span_offset + k;
      int own = pos < owner.size() ? owner[pos] : kGap;
      EXPECT_EQ(own, pc.tensor) << "buffer element " << pos;
      seen[pc.span_offset + k]++;
      (*covered)[pc.tensor][pc.tensor_offset + k]++;
    }
  }
  size_t tensors_in_span = 0;
  std::vector<int> counted(s.numels.size(), 0);
  for (size_t pos = begin; pos < end; pos++) {
    int own = pos < owner.size() ? owner[pos] : kGap;
    bool want = own != kGap && !Skipped(s, own);
    EXPECT_EQ(seen[pos - begin], want ? 1 : 0)
        << "buffer element " << pos << " (owner " << own << ")";
    if (want && !counted[own]) {
      counted[own] = 1;
      tensors_in_span++;
    }
  }
  EXPECT_EQ(pieces.size(), tensors_in_span);
}

// Lays out s at every world size, checks the layout and that the union of
// every rank's shard pieces covers each non-skipped element exactly once.
void CheckAllWorlds(const UnitSpec& s, size_t align = kFp32Align) {
  for (int world : kWorlds) {
    SCOPED_TRACE(Describe(s, align, world));
    Laid r = LayOut(s, align, world);
    std::vector<int> owner = CheckLayout(s, align, world, r);
    std::vector<std::vector<int>> covered(s.numels.size());
    for (size_t t = 0; t < s.numels.size(); t++)
      covered[t].assign(s.numels[t], 0);
    for (int rank = 0; rank < world; rank++) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      size_t begin = zs__layout_shard_begin(&r.layout, rank);
      CheckPieces(s, r, owner, begin, begin + r.layout.shard, &covered);
    }
    for (size_t t = 0; t < s.numels.size(); t++)
      for (size_t k = 0; k < s.numels[t]; k++)
        ASSERT_EQ(covered[t][k], Skipped(s, static_cast<int>(t)) ? 0 : 1)
            << "tensor " << t << " element " << k;
  }
}

// ==== zs__layout_align ===================================================

TEST(LayoutAlign, SixtyFourBytesInElements) {
  EXPECT_EQ(zs__layout_align(4), 16u);  // fp32
  EXPECT_EQ(zs__layout_align(2), 32u);  // bf16 / fp16
  EXPECT_EQ(zs__layout_align(1), 64u);
  EXPECT_EQ(zs__layout_align(8), 8u);
  EXPECT_EQ(zs__layout_align(64), 1u);
  EXPECT_EQ(zs__layout_align(zs_dtype_size(ZS_FLOAT32)), kFp32Align);
}

TEST(LayoutAlign, DegenerateSizesGiveOne) {
  EXPECT_EQ(zs__layout_align(0), 1u);
  EXPECT_EQ(zs__layout_align(65), 1u);
  EXPECT_EQ(zs__layout_align(128), 1u);
}

// ==== zs__layout_unit: hand-computed cases ==============================

TEST(LayoutUnit, HandComputedFp32OffsetsWorld1) {
  // 3 -> [0,3); 16 -> [16,32); 17 -> [32,49); empty at 64; 1 -> [64,65).
  UnitSpec s = Spec({3, 16, 17, 0, 1});
  Laid r = LayOut(s, kFp32Align, 1);
  EXPECT_EQ(r.offsets, (std::vector<size_t>{0, 16, 32, 64, 64}));
  EXPECT_EQ(r.layout.used, 65u);
  EXPECT_EQ(r.layout.padded, 80u);
  EXPECT_EQ(r.layout.shard, 80u);
}

TEST(LayoutUnit, HandComputedPaddingPerWorld) {
  // used 65 elements; padded = first multiple of 16 * world >= 65.
  UnitSpec s = Spec({3, 16, 17, 0, 1});
  struct {
    int world;
    size_t padded, shard;
  } cases[] = {{1, 80, 80}, {2, 96, 48}, {3, 96, 32}, {4, 128, 32},
               {8, 128, 16}};
  for (const auto& c : cases) {
    Laid r = LayOut(s, kFp32Align, c.world);
    EXPECT_EQ(r.layout.used, 65u) << "world " << c.world;
    EXPECT_EQ(r.layout.padded, c.padded) << "world " << c.world;
    EXPECT_EQ(r.layout.shard, c.shard) << "world " << c.world;
  }
}

TEST(LayoutUnit, AliasesTakeNoStorage) {
  // alias(10), 5 -> [0,5), alias(7), 20 -> [16,36), alias(1000).
  UnitSpec s = Spec({10, 5, 7, 20, 1000}, {1, 0, 1, 0, 1});
  Laid r = LayOut(s, kFp32Align, 3);
  EXPECT_EQ(r.offsets,
            (std::vector<size_t>{kAliasOffset, 0, kAliasOffset, 16,
                                 kAliasOffset}));
  EXPECT_EQ(r.layout.used, 36u);
  EXPECT_EQ(r.layout.padded, 48u);
  EXPECT_EQ(r.layout.shard, 16u);
  CheckAllWorlds(s);
}

TEST(LayoutUnit, OnlyAliasesGiveAnEmptyUnit) {
  UnitSpec s = Spec({4, 100}, {1, 1});
  for (int world : kWorlds) {
    Laid r = LayOut(s, kFp32Align, world);
    EXPECT_EQ(r.offsets, (std::vector<size_t>{kAliasOffset, kAliasOffset}));
    EXPECT_EQ(r.layout.used, 0u) << "world " << world;
    EXPECT_EQ(r.layout.padded, 0u) << "world " << world;
    EXPECT_EQ(r.layout.shard, 0u) << "world " << world;
  }
  CheckAllWorlds(s);
}

TEST(LayoutUnit, NoTensors) {
  for (int world : kWorlds) {
    zs__unit_layout l;
    std::memset(&l, 0xA5, sizeof l);
    ASSERT_EQ(zs__layout_unit(nullptr, nullptr, 0, kFp32Align, world, nullptr,
                              &l),
              ZS_OK)
        << zs_last_error();
    EXPECT_EQ(l.used, 0u);
    EXPECT_EQ(l.padded, 0u);
    EXPECT_EQ(l.shard, 0u);
  }
}

TEST(LayoutUnit, EmptyTensorsOnly) {
  UnitSpec s = Spec({0, 0, 0});
  for (int world : kWorlds) {
    Laid r = LayOut(s, kFp32Align, world);
    EXPECT_EQ(r.offsets, (std::vector<size_t>{0, 0, 0}));
    EXPECT_EQ(r.layout.used, 0u);
    EXPECT_EQ(r.layout.padded, 0u);
    EXPECT_EQ(r.layout.shard, 0u);
    EXPECT_EQ(Pieces(s, r, 0, 1000).size(), 0u)
        << "empty tensors have no pieces";
  }
  CheckAllWorlds(s);
}

TEST(LayoutUnit, EmptyTensorsBetweenOthers) {
  // 5 -> [0,5); empty at 16; empty at 16; 1 -> [16,17); empty at 32.
  UnitSpec s = Spec({5, 0, 0, 1, 0});
  Laid r = LayOut(s, kFp32Align, 2);
  EXPECT_EQ(r.offsets, (std::vector<size_t>{0, 16, 16, 16, 32}));
  EXPECT_EQ(r.layout.used, 32u);
  EXPECT_EQ(r.layout.padded, 32u);
  EXPECT_EQ(r.layout.shard, 16u);
  CheckAllWorlds(s);
}

TEST(LayoutUnit, UnitOfTotalSizeOne) {
  UnitSpec s = Spec({1});
  for (int world : kWorlds) {
    Laid r = LayOut(s, kFp32Align, world);
    EXPECT_EQ(r.layout.used, 1u);
    EXPECT_EQ(r.layout.padded, kFp32Align * world) << "world " << world;
    EXPECT_EQ(r.layout.shard, kFp32Align) << "world " << world;
    // Only rank 0 holds the element.
    for (int rank = 0; rank < world; rank++) {
      size_t b = zs__layout_shard_begin(&r.layout, rank);
      std::vector<zs__piece> p = Pieces(s, r, b, b + r.layout.shard);
      ASSERT_EQ(p.size(), rank == 0 ? 1u : 0u) << "rank " << rank;
      if (rank == 0) {
        EXPECT_EQ(p[0].tensor, 0);
        EXPECT_EQ(p[0].tensor_offset, 0u);
        EXPECT_EQ(p[0].span_offset, 0u);
        EXPECT_EQ(p[0].count, 1u);
      }
    }
  }
  CheckAllWorlds(s);
}

TEST(LayoutUnit, NumelSmallerThanWorld) {
  UnitSpec s = Spec({2, 3});  // [0,2), [16,19)
  Laid r = LayOut(s, kFp32Align, 8);
  EXPECT_EQ(r.offsets, (std::vector<size_t>{0, 16}));
  EXPECT_EQ(r.layout.used, 19u);
  EXPECT_EQ(r.layout.padded, 128u);
  EXPECT_EQ(r.layout.shard, 16u);
  CheckAllWorlds(s);
  CheckAllWorlds(Spec({3}));
  CheckAllWorlds(Spec({7}));
}

TEST(LayoutUnit, ExactMultipleNeedsNoPadding) {
  UnitSpec s = Spec({16, 32, 16});
  Laid r = LayOut(s, kFp32Align, 4);
  EXPECT_EQ(r.offsets, (std::vector<size_t>{0, 16, 48}));
  EXPECT_EQ(r.layout.used, 64u);
  EXPECT_EQ(r.layout.padded, 64u);
  EXPECT_EQ(r.layout.shard, 16u);
  CheckAllWorlds(s);
}

TEST(LayoutUnit, OtherAlignments) {
  UnitSpec s = Spec({3, 0, 9, 1, 40, 5}, {0, 0, 0, 1, 0, 0});
  for (size_t align : {size_t{1}, size_t{2}, size_t{8}, size_t{32},
                       size_t{64}}) {
    SCOPED_TRACE("align " + std::to_string(align));
    CheckAllWorlds(s, align);
  }
  // align 1, world 1: tensors are packed back to back, no padding.
  Laid r = LayOut(s, 1, 1);
  EXPECT_EQ(r.offsets,
            (std::vector<size_t>{0, 3, 3, kAliasOffset, 12, 52}));
  EXPECT_EQ(r.layout.used, 57u);
  EXPECT_EQ(r.layout.padded, 57u);
}

// ==== zs__layout_unit: argument errors and overflow =====================

TEST(LayoutUnit, RejectsBadArguments) {
  size_t numels[] = {4};
  int alias[] = {0};
  size_t offsets[1];
  zs__unit_layout l;
  EXPECT_EQ(zs__layout_unit(numels, alias, 1, 0, 1, offsets, &l),
            ZS_ERR_INVALID_ARGUMENT)
      << "align 0";
  EXPECT_NE(std::string(zs_last_error()).find("align 0"), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(zs__layout_unit(numels, alias, 1, 16, 0, offsets, &l),
            ZS_ERR_INVALID_ARGUMENT)
      << "world 0";
  EXPECT_NE(std::string(zs_last_error()).find("world 0"), std::string::npos)
      << zs_last_error();
  EXPECT_EQ(zs__layout_unit(numels, alias, 1, 16, -3, offsets, &l),
            ZS_ERR_INVALID_ARGUMENT)
      << "world -3";
  EXPECT_EQ(zs__layout_unit(numels, alias, -1, 16, 1, offsets, &l),
            ZS_ERR_INVALID_ARGUMENT)
      << "n -1";
}

// Expects zs__layout_unit to report overflow for these tensors.
void ExpectOverflow(const std::vector<size_t>& numels, size_t align,
                    int world) {
  std::vector<int> alias(numels.size(), 0);
  std::vector<size_t> offsets(numels.size());
  zs__unit_layout l;
  std::memset(&l, 0, sizeof l);
  std::string d = Describe(Spec(numels), align, world);
  EXPECT_EQ(zs__layout_unit(numels.data(), alias.data(),
                            static_cast<int>(numels.size()), align, world,
                            offsets.data(), &l),
            ZS_ERR_INVALID_ARGUMENT)
      << d;
  EXPECT_NE(std::string(zs_last_error()).find("overflow"), std::string::npos)
      << d << ": " << zs_last_error();
}

TEST(LayoutUnit, DetectsOverflow) {
  const size_t kMax = SIZE_MAX;
  ExpectOverflow({kMax}, kFp32Align, 1);             // padding wraps
  ExpectOverflow({kMax / 2 + 1, kMax / 2 + 1}, 1, 1);  // sum wraps
  ExpectOverflow({kMax / 2, kMax / 2, 16}, kFp32Align, 1);
  ExpectOverflow({kMax - 20, 1}, kFp32Align, 1);  // aligning tensor 1 wraps
  ExpectOverflow({kMax - 14}, kFp32Align, 1);     // 2^64-15: no multiple of 16
  ExpectOverflow({kMax - 100}, kFp32Align, 8);    // world * align padding
  ExpectOverflow({1}, kMax / 2, 3);               // align * world wraps
  ExpectOverflow({0}, kMax, 2);
}

TEST(LayoutUnit, LargestRepresentableSizesAreAccepted) {
  // 2^64 - 16 is a multiple of 16: fits exactly, no padding needed.
  const size_t kTop = SIZE_MAX - 15;
  size_t numels[] = {kTop};
  int alias[] = {0};
  size_t offsets[1];
  zs__unit_layout l;
  ASSERT_EQ(zs__layout_unit(numels, alias, 1, kFp32Align, 1, offsets, &l),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(offsets[0], 0u);
  EXPECT_EQ(l.used, kTop);
  EXPECT_EQ(l.padded, kTop);
  EXPECT_EQ(l.shard, kTop);
  // With align 1 and world 1 even SIZE_MAX elements fit.
  size_t all[] = {SIZE_MAX};
  ASSERT_EQ(zs__layout_unit(all, alias, 1, 1, 1, offsets, &l), ZS_OK)
      << zs_last_error();
  EXPECT_EQ(l.used, SIZE_MAX);
  EXPECT_EQ(l.padded, SIZE_MAX);
  // Aliases never count, however large.
  size_t huge[] = {SIZE_MAX, 5};
  int huge_alias[] = {1, 0};
  size_t offs2[2];
  ASSERT_EQ(zs__layout_unit(huge, huge_alias, 2, kFp32Align, 4, offs2, &l),
            ZS_OK)
      << zs_last_error();
  EXPECT_EQ(offs2[0], kAliasOffset);
  EXPECT_EQ(offs2[1], 0u);
  EXPECT_EQ(l.used, 5u);
  EXPECT_EQ(l.padded, 64u);
}

// ==== zs__layout_pieces ==================================================

TEST(LayoutPieces, HandComputedShardsWorld3) {
  // Tensors: 20 -> [0,20), 5 -> [32,37), 30 -> [48,78); padded 96, shard 32.
  UnitSpec s = Spec({20, 5, 30});
  Laid r = LayOut(s, kFp32Align, 3);
  ASSERT_EQ(r.offsets, (std::vector<size_t>{0, 32, 48}));
  ASSERT_EQ(r.layout.shard, 32u);
  std::vector<zs__piece> p0 = Pieces(s, r, 0, 32);
  ASSERT_EQ(p0.size(), 1u);
  EXPECT_EQ(p0[0].tensor, 0);
  EXPECT_EQ(p0[0].tensor_offset, 0u);
  EXPECT_EQ(p0[0].span_offset, 0u);
  EXPECT_EQ(p0[0].count, 20u);
  std::vector<zs__piece> p1 = Pieces(s, r, 32, 64);
  ASSERT_EQ(p1.size(), 2u);
  EXPECT_EQ(p1[0].tensor, 1);
  EXPECT_EQ(p1[0].tensor_offset, 0u);
  EXPECT_EQ(p1[0].span_offset, 0u);
  EXPECT_EQ(p1[0].count, 5u);
  EXPECT_EQ(p1[1].tensor, 2);
  EXPECT_EQ(p1[1].tensor_offset, 0u);
  EXPECT_EQ(p1[1].span_offset, 16u);
  EXPECT_EQ(p1[1].count, 16u);
  std::vector<zs__piece> p2 = Pieces(s, r, 64, 96);
  ASSERT_EQ(p2.size(), 1u);
  EXPECT_EQ(p2[0].tensor, 2);
  EXPECT_EQ(p2[0].tensor_offset, 16u);
  EXPECT_EQ(p2[0].span_offset, 0u);
  EXPECT_EQ(p2[0].count, 14u);
}

TEST(LayoutPieces, UnionOfShardsCoversEveryElementOnce) {
  const std::vector<UnitSpec> specs = {
      Spec({1}),
      Spec({17}),
      Spec({16}),
      Spec({100, 1, 2, 3}),
      Spec({768, 3072, 768}),
      Spec({50257, 768}),
      Spec({5, 0, 33, 0, 0, 2}),
      Spec({1, 1, 1, 1, 1, 1, 1, 1, 1}),
      Spec({64, 10, 64}, {0, 1, 0}),
      Spec({7, 300, 9}, {1, 0, 1}),
  };
  for (const UnitSpec& s : specs) CheckAllWorlds(s);
}

TEST(LayoutPieces, SkipLeavesTensorsOut) {
  // Frozen-style skips: skipped tensors still take storage but have no
  // pieces; the rest still tile exactly once.
  UnitSpec s = Spec({40, 17, 3, 90, 1}, {0, 0, 1, 0, 0}, {0, 1, 0, 0, 1});
  CheckAllWorlds(s);
  Laid r = LayOut(s, kFp32Align, 1);
  std::vector<zs__piece> all = Pieces(s, r, 0, r.layout.padded);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].tensor, 0);
  EXPECT_EQ(all[1].tensor, 3);
  // Skipping everything leaves no pieces; a zero skip array equals NULL.
  UnitSpec none = Spec({40, 17, 3}, {}, {1, 1, 1});
  Laid rn = LayOut(none, kFp32Align, 2);
  EXPECT_EQ(Pieces(none, rn, 0, rn.layout.padded).size(), 0u);
  UnitSpec zero_skip = Spec({40, 17, 3}, {}, {0, 0, 0});
  UnitSpec null_skip = Spec({40, 17, 3});
  Laid rz = LayOut(zero_skip, kFp32Align, 2);
  std::vector<zs__piece> a = Pieces(zero_skip, rz, 8, 60);
  std::vector<zs__piece> b = Pieces(null_skip, rz, 8, 60);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i].tensor, b[i].tensor) << "piece " << i;
    EXPECT_EQ(a[i].tensor_offset, b[i].tensor_offset) << "piece " << i;
    EXPECT_EQ(a[i].span_offset, b[i].span_offset) << "piece " << i;
    EXPECT_EQ(a[i].count, b[i].count) << "piece " << i;
  }
}

TEST(LayoutPieces, ArbitrarySpansMatchOwnership) {
  UnitSpec s = Spec({20, 0, 5, 33, 1, 70}, {0, 0, 0, 1, 0, 0});
  Laid r = LayOut(s, kFp32Align, 3);
  std::vector<int> owner = CheckLayout(s, kFp32Align, 3, r);
  std::vector<std::vector<int>> covered(s.numels.size());
  for (size_t t = 0; t < s.numels.size(); t++)
    covered[t].assign(s.numels[t], 0);
  // Every [begin, end) within and a little past the buffer, including
  // empty and reversed spans.
  size_t limit = r.layout.padded + 5;
  for (size_t b = 0; b <= limit; b++)
    for (size_t e = 0; e <= limit; e++) CheckPieces(s, r, owner, b, e, &covered);
  // Reversed or empty spans have no pieces.
  EXPECT_EQ(Pieces(s, r, 40, 40).size(), 0u);
  EXPECT_EQ(Pieces(s, r, 50, 10).size(), 0u);
}

TEST(LayoutPieces, CapLimitsWritesButNotTheCount) {
  UnitSpec s = Spec({3, 3, 3, 3, 3});
  Laid r = LayOut(s, kFp32Align, 1);
  EXPECT_EQ(zs__layout_pieces(r.offsets.data(), s.numels.data(),
                              s.alias.data(), nullptr, 5, 0, r.layout.padded,
                              nullptr, 0),
            5u);
  std::vector<zs__piece> full = Pieces(s, r, 0, r.layout.padded);
  ASSERT_EQ(full.size(), 5u);
  zs__piece some[4];
  for (zs__piece& p : some) p = zs__piece{-7, 7, 7, 7};
  EXPECT_EQ(zs__layout_pieces(r.offsets.data(), s.numels.data(),
                              s.alias.data(), nullptr, 5, 0, r.layout.padded,
                              some, 2),
            5u);
  for (int i = 0; i < 2; i++) {
    EXPECT_EQ(some[i].tensor, full[i].tensor) << "piece " << i;
    EXPECT_EQ(some[i].span_offset, full[i].span_offset) << "piece " << i;
    EXPECT_EQ(some[i].count, full[i].count) << "piece " << i;
  }
  EXPECT_EQ(some[2].tensor, -7) << "wrote past cap 2";
  EXPECT_EQ(some[3].tensor, -7) << "wrote past cap 2";
}

TEST(LayoutPieces, PiecesAreInBufferOrder) {
  UnitSpec s = Spec({9, 40, 2, 0, 18, 1, 100});
  for (int world : kWorlds) {
    Laid r = LayOut(s, kFp32Align, world);
    for (int rank = 0; rank < world; rank++) {
      size_t b = zs__layout_shard_begin(&r.layout, rank);
      std::vector<zs__piece> p = Pieces(s, r, b, b + r.layout.shard);
      for (size_t i = 1; i < p.size(); i++) {
        EXPECT_LT(p[i - 1].tensor, p[i].tensor)
            << "world " << world << " rank " << rank << " piece " << i;
        EXPECT_LE(p[i - 1].span_offset + p[i - 1].count, p[i].span_offset)
            << "world " << world << " rank " << rank << " piece " << i;
      }
    }
  }
}

TEST(LayoutPieces, RandomUnits) {
  std::mt19937 rng(20240611u);
  for (int trial = 0; trial < 200; trial++) {
    int n = static_cast<int>(rng() % 9);  // 0..8 tensors
    UnitSpec s;
    for (int i = 0; i < n; i++) {
      uint32_t kind = rng() % 10;
      size_t numel = kind == 0   ? 0
                     : kind == 1 ? 1
                     : kind < 5  ? rng() % 20
                                 : rng() % 300;
      s.numels.push_back(numel);
      s.alias.push_back(rng() % 6 == 0);
      s.skip.push_back(rng() % 5 == 0);
    }
    if (rng() % 2) s.skip.clear();
    SCOPED_TRACE("trial " + std::to_string(trial));
    CheckAllWorlds(s);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
