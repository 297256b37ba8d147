// Quantize family kernels (csrc/recops/quantize/kernels): the fused 8-bit and N-bit row-wise
// layouts against scalar loops written from the rule (min / max, scale, round half to even,
// saturate, pack, dequantize in double), every instruction-set variant against the baseline one
// (NaN rows included), and the pruned remaps (hash insert then lookup, full slices, array
// lookups out of their slice, values that do not fit) on one and several threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "recops/quantize/kernels/pruned.h"
#include "recops/quantize/kernels/rowwise.h"
#include "test_util.h"

namespace recops::quantize::kernels {
namespace {

using test::random_floats;
using test::random_integers;
using test::ScopedThreads;

std::vector<float> scaled_rows(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> x = random_floats(rows * cols, seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = x[r * cols + c] * (r + 1) + r;
  }
  return x;
}

// One 8-bit row by the rule, for rows without NaN or zeros.
std::vector<uint8_t> scalar_8bit_row(const float* x, int64_t cols) {
  float lo = x[0], hi = x[0];
  for (int64_t c = 1; c < cols; ++c) {
    lo = std::min(lo, x[c]);
    hi = std::max(hi, x[c]);
  }
  const float range = hi - lo;
  const float inverse = 255.0f / (range + 1e-8f);
  std::vector<uint8_t> out(cols + 8);
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = static_cast<uint8_t>(std::clamp(std::nearbyint((x[c] - lo) * inverse), 0.0f, 255.0f));
  }
  const float scale_bias[2] = {range / 255.0f, lo};
  std::memcpy(out.data() + cols, scale_bias, sizeof(scale_bias));
  return out;
}

TEST(Quantize8Bit, MatchesScalarRule) {
  ScopedThreads threads(3);
  for (const int64_t cols : {1, 7, 8, 33, 100}) {
    const int64_t rows = 9;
    const std::vector<float> x = scaled_rows(rows, cols, static_cast<uint32_t>(cols));
    std::vector<uint8_t> out(rows * (cols + 8));
    rowwise_kernels(CpuIsa::kBaseline)
        .quantize_8bit({x.data(), FloatKind::kFloat, rows, cols, 8, out.data()});
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> want = scalar_8bit_row(x.data() + r * cols, cols);
      for (int64_t c = 0; c < cols + 8; ++c) {
        ASSERT_EQ(out[r * (cols + 8) + c], want[c]) << "cols " << cols << " row " << r << " " << c;
      }
    }
  }
}

TEST(QuantizeNBit, RoundTripsWithinHalfAStepAndPacksLowBitsFirst) {
  for (const int bit_rate : {1, 2, 4, 8}) {
    const int64_t per_byte = 8 / bit_rate, rows = 5, cols = 2 * per_byte * 9;
    const std::vector<float> x = scaled_rows(rows, cols, 7);
    const int64_t in_cols = cols / per_byte + 4;
    std::vector<uint8_t> q(rows * in_cols);
    const RowwiseKernels& k = rowwise_kernels(CpuIsa::kBaseline);
    k.quantize_nbit({x.data(), FloatKind::kFloat, rows, cols, bit_rate, q.data()});
    std::vector<float> back(rows * cols);
    k.dequantize_nbit(
        {q.data(), rows, in_cols, bit_rate, true, true, back.data(), FloatKind::kFloat});
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t bits[2];
      std::memcpy(bits, q.data() + r * in_cols + cols / per_byte, sizeof(bits));
      const float scale = static_cast<float>(std::bit_cast<_Float16>(bits[0]));
      const float bias = static_cast<float>(std::bit_cast<_Float16>(bits[1]));
      for (int64_t c = 0; c < cols; ++c) {
        const unsigned code =
            (q[r * in_cols + c / per_byte] >> ((c % per_byte) * bit_rate)) & ((1u << bit_rate) - 1);
        ASSERT_EQ(back[r * cols + c], static_cast<float>(double{scale} * code + double{bias}));
        ASSERT_LE(std::abs(back[r * cols + c] - x[r * cols + c]), scale * 0.5f + 1e-2f * (r + 1))
            << "bit_rate " << bit_rate;
      }
    }
  }
}

TEST(Quantize8Bit, DequantizesBothPaddings) {
  const int64_t rows = 3, codes = 5;
  for (const bool float_scale_bias : {true, false}) {
    const int64_t padding = float_scale_bias ? 4 : 2, in_cols = codes + 2 * padding;
    std::vector<uint8_t> q = random_integers<uint8_t>(rows * in_cols, 0, 255, 3);
    for (int64_t r = 0; r < rows; ++r) {  // scale 0.5, bias -1, in front
      uint8_t* row = q.data() + r * in_cols;
      if (float_scale_bias) {
        const float sb[2] = {0.5f, -1.0f};
        std::memcpy(row, sb, sizeof(sb));
      } else {
        const uint16_t sb[2] = {0x3800, 0xBC00};
        std::memcpy(row, sb, sizeof(sb));
      }
    }
    std::vector<float> out(rows * codes);
    rowwise_kernels(CpuIsa::kBaseline)
        .dequantize_8bit(
            {q.data(), rows, in_cols, 8, false, float_scale_bias, out.data(), FloatKind::kFloat});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < codes; ++c) {
        ASSERT_EQ(out[r * codes + c], 0.5f * q[r * in_cols + 2 * padding + c] - 1.0f);
      }
    }
  }
}

TEST(QuantizeVariants, AgreeWithBaseline) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx2);
  const int64_t rows = 17, cols = 72;
  std::vector<float> x = scaled_rows(rows, cols, 11);
  for (int64_t i = 0; i < rows * cols; i += 13) x[i] = std::numeric_limits<float>::quiet_NaN();
  x[5 * cols] = 0.0f;
  x[5 * cols + 9] = -0.0f;
  std::vector<uint16_t> half(rows * cols);
  for (size_t i = 0; i < x.size(); ++i)
    half[i] = std::bit_cast<uint16_t>(static_cast<_Float16>(x[i]));
  for (const FloatKind kind : {FloatKind::kFloat, FloatKind::kHalf}) {
    const void* input =
        kind == FloatKind::kFloat ? static_cast<const void*>(x.data()) : half.data();
    std::vector<uint8_t> q8[2], q4[2];
    std::vector<uint16_t> out16[2];
    std::vector<float> out32[2];
    for (int v = 0; v < 2; ++v) {
      const RowwiseKernels& k = rowwise_kernels(v == 0 ? CpuIsa::kBaseline : CpuIsa::kAvx2);
      q8[v].resize(rows * (cols + 8));
      q4[v].resize(rows * (cols / 2 + 4));
      k.quantize_8bit({input, kind, rows, cols, 8, q8[v].data()});
      k.quantize_nbit({input, kind, rows, cols, 4, q4[v].data()});
      out32[v].resize(rows * cols);
      out16[v].resize(rows * cols);
      k.dequantize_8bit(
          {q8[v].data(), rows, cols + 8, 8, true, true, out32[v].data(), FloatKind::kFloat});
      k.dequantize_nbit(
          {q4[v].data(), rows, cols / 2 + 4, 4, true, true, out16[v].data(), FloatKind::kHalf});
    }
    EXPECT_EQ(q8[0], q8[1]);
    EXPECT_EQ(q4[0], q4[1]);
    EXPECT_EQ(std::memcmp(out32[0].data(), out32[1].data(), out32[0].size() * 4), 0);
    EXPECT_EQ(out16[0], out16[1]);
  }
}

Bags<int64_t> bags_of(const std::vector<int64_t>& indices, const std::vector<int64_t>& offsets,
                      int64_t num_tables) {
  return {indices.data(), static_cast<int64_t>(indices.size()), offsets.data(), num_tables,
          (static_cast<int64_t>(offsets.size()) - 1) / num_tables};
}

TEST(PrunedHashmap, InsertThenLookupFindsEveryDenseIndex) {
  for (const int threads : {1, 3}) {
    ScopedThreads scoped(threads);
    // Table 0: 64 slots; table 1: not pruned (no slice); table 2: 40 slots.
    const std::vector<int64_t> table_offsets = {0, 64, 64, 104};
    const std::vector<int64_t> keys = random_integers<int64_t>(60, -5, 1000, 5);
    std::vector<int64_t> dense(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) dense[i] = i % 7 == 0 ? -1 : int64_t(i) * 10;
    const std::vector<int64_t> offsets = {0, 15, 30, 40, 45, 50, 60};  // 3 tables x 2 bags
    std::vector<int64_t> table(2 * 104, -1);
    ASSERT_EQ(pruned_hashmap_insert(bags_of(keys, offsets, 3), dense.data(), table.data(),
                                    table_offsets.data()),
              -1);
    std::vector<int64_t> out(keys.size());
    ASSERT_EQ(pruned_hashmap_lookup(bags_of(keys, offsets, 3), table.data(), table_offsets.data(),
                                    out.data()),
              -1);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i >= 30 && i < 45) {
        EXPECT_EQ(out[i], keys[i]);  // table 1 passes indices through
        continue;
      }
      // A key inserted twice in one table keeps its last dense index.
      int64_t want = -1;
      const size_t table_begin = i < 30 ? 0 : 45, table_end = i < 30 ? 30 : 60;
      for (size_t j = table_begin; j < table_end; ++j) {
        if (keys[j] == keys[i] && dense[j] != -1) want = dense[j];
      }
      EXPECT_EQ(out[i], want) << i;
    }
  }
}

TEST(PrunedHashmap, FullSliceLeavesTheTableUnchanged) {
  const std::vector<int64_t> keys = {1, 2, 3}, dense = {10, 20, 30}, offsets = {0, 3};
  const std::vector<int64_t> table_offsets = {0, 2};
  std::vector<int64_t> table(4, -1);
  EXPECT_GE(pruned_hashmap_insert(bags_of(keys, offsets, 1), dense.data(), table.data(),
                                  table_offsets.data()),
            0);
  EXPECT_EQ(table, std::vector<int64_t>(4, -1));
  // A lookup in a full slice without the key ends after every slot.
  const std::vector<int64_t> full = {1, 10, 2, 20}, missing = {7}, one = {0, 1};
  std::vector<int64_t> out(1);
  pruned_hashmap_lookup(bags_of(missing, one, 1), full.data(), table_offsets.data(), out.data());
  EXPECT_EQ(out[0], -1);
}

TEST(PrunedArray, RemapsWithinSlicesAndReportsOutOfRange) {
  const std::vector<int64_t> remap = {5, 6, 7, 100, 101};   // table 0: 3 rows, table 1: none,
  const std::vector<int64_t> remap_offsets = {0, 3, 3, 5};  // table 2: 2 rows
  const std::vector<int64_t> indices = {2, 0, 9, 1, 0}, offsets = {0, 2, 3, 5};
  std::vector<int64_t> out(indices.size());
  ASSERT_EQ(pruned_array_lookup(bags_of(indices, offsets, 3), remap.data(), remap_offsets.data(),
                                out.data()),
            -1);
  EXPECT_EQ(out, (std::vector<int64_t>{7, 5, 9, 101, 100}));
  const std::vector<int64_t> bad = {2, 3, 9, 1, 0};
  EXPECT_EQ(
      pruned_array_lookup(bags_of(bad, offsets, 3), remap.data(), remap_offsets.data(), out.data()),
      1);
}

}  // namespace
}  // namespace recops::quantize::kernels
