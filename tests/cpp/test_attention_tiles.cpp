// The attention tiles' element-wise passes (attention/kernels/tile_variants.h): the baseline
// variant against scalar loops written here from the passes' contracts, and every other
// instruction-set variant the CPU runs against the baseline, entry by entry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "recops/attention/kernels/tile_variants.h"

namespace recops::attention::kernels {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> random_mask(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (rng() % 4 == 0) ? 0.0f : 1.0f;
  return v;
}

// The bf16 bits nearest to x, ties to even (x finite), from its double value.
uint16_t reference_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t lower = u & 0xffffu, upper = u >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0)) return upper + 1;
  return upper;
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " at " << i;
  }
}

// ---------------------------------------------------------------- baseline vs scalar loops
const TileOps<float>& baseline_ops() {
  return baseline::kTileKernels.fp32;
}

TEST(AttentionTiles, SiluScoresWithAndWithoutBias) {
  const int64_t n = 203;
  const auto s0 = random_values(n, 1), bias = random_values(n, 2), mask = random_mask(n, 3);
  for (const bool with_bias : {false, true}) {
    std::vector<float> s = s0;
    baseline_ops().silu_scores(s.data(), with_bias ? bias.data() : nullptr, mask.data(), n, 0.7f,
                               0.25f);
    std::vector<double> want(n);
    for (int64_t j = 0; j < n; ++j) {
      const double x = 0.7 * s0[j] + (with_bias ? bias[j] : 0.0);
      want[j] = silu(x) * 0.25 * mask[j];
    }
    expect_close(s, want, 1e-5, 1e-6, with_bias ? "with bias" : "no bias");
  }
}

TEST(AttentionTiles, SiluScoreGrads) {
  const int64_t n = 131;
  const auto s0 = random_values(n, 4), dp0 = random_values(n, 5), bias = random_values(n, 6);
  const auto mask = random_mask(n, 7);
  for (const bool with_bias : {false, true}) {
    std::vector<float> s = s0, dp = dp0;
    baseline_ops().silu_score_grads(s.data(), dp.data(), with_bias ? bias.data() : nullptr,
                                    mask.data(), n, 1.3f, 0.5f);
    std::vector<double> want_a(n), want_dx(n);
    for (int64_t j = 0; j < n; ++j) {
      const double x = 1.3 * s0[j] + (with_bias ? bias[j] : 0.0);
      const double sig = 1.0 / (1.0 + std::exp(-x));
      want_a[j] = x * sig * 0.5 * mask[j];
      want_dx[j] = dp0[j] * 0.5 * mask[j] * sig * (1.0 + x * (1.0 - sig));
    }
    expect_close(s, want_a, 1e-5, 1e-6, "a");
    expect_close(dp, want_dx, 1e-5, 1e-6, "dx");
  }
}

TEST(AttentionTiles, MaskAndExpRows) {
  const int64_t n = 77;
  const auto s0 = random_values(n, 8, -5.0f, 5.0f);
  std::vector<uint8_t> keep(n);
  for (int64_t j = 0; j < n; ++j) keep[j] = j % 3 != 1;
  std::vector<float> s = s0;
  const float m = baseline_ops().mask_row(s.data(), n, keep.data());
  double want_max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (keep[j]) {
      want_max = std::max<double>(want_max, s0[j]);
      EXPECT_EQ(s[j], s0[j]);
    } else {
      EXPECT_EQ(s[j], -std::numeric_limits<float>::infinity());
    }
  }
  EXPECT_EQ(m, want_max);
  std::vector<float> unmasked = s0;
  EXPECT_EQ(baseline_ops().mask_row(unmasked.data(), n, nullptr),
            *std::max_element(s0.begin(), s0.end()));

  const float sum = baseline_ops().exp_row(s.data(), n, m);
  std::vector<double> want(n);
  double want_sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    want[j] = keep[j] ? std::exp(double(s0[j]) - m) : 0.0;
    want_sum += want[j];
  }
  expect_close(s, want, 1e-5, 1e-7, "exp");
  EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum);
}

TEST(AttentionTiles, DropoutAndSoftmaxGradRows) {
  const int64_t n = 90, j0 = 17;
  const RowDropout<float> dropout{CounterRow::make(42, 5), keep_threshold(0.3), 1.0f / 0.7f};
  const auto p0 = random_values(n, 9, 0.0f, 1.0f);
  std::vector<float> p = p0;
  baseline_ops().dropout_row(p.data(), n, dropout, j0);
  std::vector<double> factor(n);
  int64_t dropped = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t bits = dropout.rng.bits(static_cast<uint32_t>(j0 + j));
    factor[j] = (bits >> 8) >= dropout.threshold ? 1.0 / 0.7 : 0.0;
    dropped += factor[j] == 0.0;
    EXPECT_NEAR(p[j], p0[j] * factor[j], 1e-6) << j;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, n);

  const auto s0 = random_values(n, 10), dp0 = random_values(n, 11);
  const float lse = 2.5f, d = 0.3f, scale = 0.125f;
  for (const bool with_dropout : {false, true}) {
    std::vector<float> s = s0, dp = dp0;
    baseline_ops().softmax_grad_row(s.data(), dp.data(), n, lse, d, scale,
                                    with_dropout ? &dropout : nullptr, j0);
    std::vector<double> want_p(n), want_dp(n);
    for (int64_t j = 0; j < n; ++j) {
      const double prob = std::exp(double(s0[j]) - lse);
      const double f = with_dropout ? factor[j] : 1.0;
      want_dp[j] = scale * prob * (f * dp0[j] - d);
      want_p[j] = f * prob;
    }
    expect_close(s, want_p, 1e-5, 1e-7, "dropped probabilities");
    expect_close(dp, want_dp, 1e-5, 1e-7, "score gradients");
  }
}

// The diagonal-layout passes (softmax_tile_ops.h) on a rows x n tile, against the pair-by-pair
// definition: diagonal c = j - r + rows - 1 of lane r, position index delta[c].
struct DiagonalCase {
  int64_t rows, n;
};

class DiagonalLayout : public ::testing::TestWithParam<DiagonalCase> {};

TEST_P(DiagonalLayout, ExpandUnshearShearAccumulate) {
  const auto [rows, n] = GetParam();
  const int64_t lanes = rows, diagonals = n + rows - 1, positions = 9, first = 3;
  std::vector<int32_t> delta(diagonals);
  for (int64_t c = 0; c < diagonals; ++c) delta[c] = static_cast<int32_t>((c * 7) % positions);
  const int64_t c2p_ld = rows, p2c_ld = first + n + rows;
  const auto c2p = random_values(positions * c2p_ld, 12),
             p2c = random_values(positions * p2c_ld, 13);
  const auto tile0 = random_values(rows * n, 14);

  // expand + unshear_add: tile[r, j] += c2p[delta, r] + p2c[delta, first + j].
  std::vector<float> diag(diagonals * lanes, 0.0f), tile = tile0;
  baseline_ops().expand_position_terms(diag.data(), rows, n, lanes, delta.data(), c2p.data(),
                                       c2p_ld, p2c.data(), p2c_ld, first);
  baseline_ops().unshear_add(diag.data(), rows, n, lanes, tile.data());
  std::vector<double> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const int32_t d = delta[j - r + rows - 1];
      want[r * n + j] = tile0[r * n + j] + double(c2p[d * c2p_ld + r]) +
                        p2c[d * p2c_ld + first + (j - r + rows - 1) + r];
    }
  }
  expect_close(tile, want, 1e-6, 1e-6, "expand + unshear_add");

  // shear + accumulate: the transposes, into zeroed gradient tables.
  std::vector<float> dc2p(positions * c2p_ld, 0.0f), dp2c(positions * p2c_ld, 0.0f);
  baseline_ops().shear_tile(tile0.data(), rows, n, diag.data(), lanes);
  baseline_ops().accumulate_position_grads(diag.data(), rows, n, lanes, delta.data(), dc2p.data(),
                                           c2p_ld, dp2c.data(), p2c_ld, first);
  std::vector<double> want_c2p(dc2p.size(), 0.0), want_p2c(dp2c.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t c = j - r + rows - 1;
      EXPECT_EQ(diag[c * lanes + r], tile0[r * n + j]);
      want_c2p[delta[c] * c2p_ld + r] += tile0[r * n + j];
      want_p2c[delta[c] * p2c_ld + first + c + r] += tile0[r * n + j];
    }
  }
  expect_close(dc2p, want_c2p, 1e-5, 1e-5, "d c2p");
  expect_close(dp2c, want_p2c, 1e-5, 1e-5, "d p2c");
}

// Sizes around the 16 x 16 register blocks of the fp32 shear (full blocks from n = 31 on).
INSTANTIATE_TEST_SUITE_P(Tiles, DiagonalLayout,
                         ::testing::Values(DiagonalCase{1, 1}, DiagonalCase{5, 40},
                                           DiagonalCase{16, 16}, DiagonalCase{16, 31},
                                           DiagonalCase{32, 47}, DiagonalCase{37, 100},
                                           DiagonalCase{64, 256}));

TEST(AttentionTiles, UniformPositionTerms) {
  const int64_t rows = 7, n = 19;
  const auto c2p = random_values(rows, 15), p2c = random_values(n, 16);
  const auto tile0 = random_values(rows * n, 17);
  std::vector<float> tile = tile0;
  baseline_ops().add_uniform_position_terms(tile.data(), rows, n, c2p.data(), p2c.data());
  std::vector<double> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) want[r * n + j] = double(tile0[r * n + j]) + c2p[r] + p2c[j];
  }
  expect_close(tile, want, 1e-6, 1e-6, "terms");
  tile = tile0;
  baseline_ops().add_uniform_position_terms(tile.data(), rows, n, nullptr, p2c.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) want[r * n + j] = double(tile0[r * n + j]) + p2c[j];
  }
  expect_close(tile, want, 1e-6, 1e-6, "p2c only");

  std::vector<float> dc2p(rows, 1.0f), dp2c(n, -1.0f);
  baseline_ops().accumulate_uniform_position_grads(tile0.data(), rows, n, dc2p.data(), dp2c.data());
  std::vector<double> want_c2p(rows, 1.0), want_p2c(n, -1.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      want_c2p[r] += tile0[r * n + j];
      want_p2c[j] += tile0[r * n + j];
    }
  }
  expect_close(dc2p, want_c2p, 1e-5, 1e-5, "row sums");
  expect_close(dp2c, want_p2c, 1e-5, 1e-5, "column sums");
}

TEST(AttentionTiles, Bf16Operands) {
  const TileKernels& k = baseline::kTileKernels;
  const int64_t rows = 6, cols = 21, n = rows * cols;
  const auto src = random_values(n, 18), ds = random_values(n, 19), bias = random_values(n, 20);
  const auto mask = random_mask(n, 21);
  std::vector<uint16_t> dst(n);
  k.to_bf16(src.data(), dst.data(), n, 0.5f);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dst[i], reference_bf16(0.5f * src[i])) << i;
  k.to_bf16_vnni(src.data(), rows, cols, dst.data(), 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(dst[((r / 2) * cols + c) * 2 + r % 2], reference_bf16(2.0f * src[r * cols + c]));
    }
  }
  std::vector<uint16_t> out(n);
  k.silu_scores_to_bf16(src.data(), bias.data(), mask.data(), n, 0.9f, 0.5f, out.data());
  for (int64_t j = 0; j < n; ++j) {
    const double want = silu(0.9 * src[j] + bias[j]) * 0.5 * mask[j];
    EXPECT_NEAR(from_bf16(out[j]), want, 1e-6 + std::abs(want) / 128) << j;
  }
  std::vector<uint16_t> a_vnni(n), ds_rows(n), ds_vnni(n);
  k.backward_operands_to_bf16(src.data(), ds.data(), rows, cols, 3.0f, a_vnni.data(),
                              ds_rows.data(), ds_vnni.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t v = ((r / 2) * cols + c) * 2 + r % 2;
      EXPECT_EQ(a_vnni[v], reference_bf16(src[r * cols + c]));
      EXPECT_EQ(ds_rows[r * cols + c], reference_bf16(3.0f * ds[r * cols + c]));
      EXPECT_EQ(ds_vnni[v], reference_bf16(3.0f * ds[r * cols + c]));
    }
  }
}

// transpose_bf16 and transpose_bf16_pairs of `k` on shapes with full 16 x 16 blocks and edges,
// with row strides past the columns read, against element-by-element transposes.
void expect_bf16_transposes(const TileKernels& k) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 45}, {16, 32}, {5, 3}, {0, 7}}) {
    const int64_t ld_src = 2 * cols + 3, ld_dst = rows + 5;
    std::vector<uint16_t> src(std::max<int64_t>(rows, 1) * ld_src);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 7919 + 13);
    std::vector<uint16_t> dst(cols * ld_dst, 0), pairs(cols * ld_dst * 2, 0);
    k.transpose_bf16(src.data(), rows, cols, ld_src, dst.data(), ld_dst);
    k.transpose_bf16_pairs(src.data(), rows, cols, ld_src, pairs.data(), ld_dst);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(dst[c * ld_dst + r], src[r * ld_src + c]) << rows << "x" << cols;
        for (int64_t e = 0; e < 2; ++e) {
          ASSERT_EQ(pairs[(c * ld_dst + r) * 2 + e], src[r * ld_src + 2 * c + e]) << rows;
        }
      }
    }
    // Nothing past the transposed rows is written.
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = rows; r < ld_dst; ++r) ASSERT_EQ(dst[c * ld_dst + r], 0);
    }
  }
}

TEST(AttentionTiles, Bf16Transposes) {
  expect_bf16_transposes(baseline::kTileKernels);
}

TEST(AttentionTiles, DoubleTilesRunTheBaselineBodies) {
  const TileOps<double>& ops = tile_ops<double>(CpuIsa::kAvx512);
  EXPECT_EQ(&ops, &baseline::kDoubleTileOps);
  std::vector<double> s = {0.5, -1.0, 2.0}, mask = {1.0, 0.0, 1.0};
  ops.silu_scores(s.data(), nullptr, mask.data(), 3, 2.0, 1.0);
  EXPECT_NEAR(s[0], silu(1.0), 1e-15);
  EXPECT_EQ(s[1], 0.0);
  EXPECT_NEAR(s[2], silu(4.0), 1e-15);
}

// ---------------------------------------------------------------- every variant vs baseline
// An instruction set's table; native_bf16: the AVX-512 table for CPUs with AVX512_BF16.
struct VariantCase {
  CpuIsa isa;
  bool native_bf16;
  const char* name;
};

class TileVariant : public ::testing::TestWithParam<VariantCase> {
 protected:
  void SetUp() override {
    if (static_cast<int>(supported_cpu_isa()) < static_cast<int>(GetParam().isa) ||
        (GetParam().native_bf16 && !cpu_has_avx512_bf16())) {
      GTEST_SKIP() << "the CPU lacks this instruction set";
    }
  }
  const TileKernels& variant() const {
    return tile_kernels(GetParam().isa, GetParam().native_bf16);
  }
  const TileKernels& base() const { return baseline::kTileKernels; }
};

// FMA contraction and vector reductions change roundings between instruction sets.
void expect_agree(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what, double rtol = 2e-6, double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " at " << i;
  }
}

TEST_P(TileVariant, SiluPasses) {
  const int64_t n = 517;  // vector bodies and tails
  const auto s0 = random_values(n, 30, -6.0f, 6.0f), dp0 = random_values(n, 31);
  const auto bias = random_values(n, 32), mask = random_mask(n, 33);
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    std::vector<float> s1 = s0, s2 = s0, d1 = dp0, d2 = dp0;
    variant().fp32.silu_scores(s1.data(), b, mask.data(), n, 0.8f, 0.3f);
    base().fp32.silu_scores(s2.data(), b, mask.data(), n, 0.8f, 0.3f);
    expect_agree(s1, s2, "silu_scores");
    s1 = s0;
    s2 = s0;
    variant().fp32.silu_score_grads(s1.data(), d1.data(), b, mask.data(), n, 0.8f, 0.3f);
    base().fp32.silu_score_grads(s2.data(), d2.data(), b, mask.data(), n, 0.8f, 0.3f);
    expect_agree(s1, s2, "silu_score_grads a");
    expect_agree(d1, d2, "silu_score_grads dx");
  }
}

// A few query rows against key / value rows read in place (strided rows, dims with tails, runs
// shorter and longer than the prefetch distance; row counts that make whole groups of four, a
// remainder, or both), each instruction set against the baseline and the baseline against plain
// loops in double.
class FewRowProducts : public ::testing::TestWithParam<std::tuple<CpuIsa, int64_t, int64_t>> {
 protected:
  void SetUp() override {
    if (static_cast<int>(supported_cpu_isa()) < static_cast<int>(std::get<0>(GetParam()))) {
      GTEST_SKIP() << "the CPU lacks this instruction set";
    }
  }
  const TileKernels& variant() const { return tile_kernels(std::get<0>(GetParam()), false); }
  const TileKernels& base() const { return baseline::kTileKernels; }
};

TEST_P(FewRowProducts, AgreeWithDouble) {
  const int64_t rows = std::get<1>(GetParam()), n = std::get<2>(GetParam());
  const int64_t d = 70, ld = 80, ld_out = 75;
  const auto q = random_values(rows * ld, 40), k = random_values(n * ld, 41);
  const auto w = random_values(rows * n, 42), v = random_values(n * ld, 43);
  std::vector<float> s1(rows * n), s2(rows * n);
  variant().fp32.key_row_dots(q.data(), ld, rows, k.data(), ld, n, d, s1.data(), n);
  base().fp32.key_row_dots(q.data(), ld, rows, k.data(), ld, n, d, s2.data(), n);
  expect_agree(s1, s2, "key_row_dots", 1e-5, 1e-5);
  std::vector<float> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += double(q[r * ld + c]) * k[j * ld + c];
      want[r * n + j] = static_cast<float>(dot);
    }
  }
  expect_agree(s2, want, "key_row_dots vs double", 1e-5, 1e-5);
  // Value widths of whole vectors (32), a masked last one (47), and past one block of 64 (69).
  for (const int64_t dv : {32, 47, 69}) {
    std::vector<float> o1(rows * ld_out, 1.0f), o2 = o1, o_want = o1;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < dv; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += double(w[r * n + j]) * v[j * ld + c];
        o_want[r * ld_out + c] = static_cast<float>(sum);
      }
    }
    for (const bool accumulate : {true, false}) {
      variant().fp32.weighted_value_rows(w.data(), n, rows, v.data(), ld, n, dv, o1.data(), ld_out,
                                         accumulate);
      base().fp32.weighted_value_rows(w.data(), n, rows, v.data(), ld, n, dv, o2.data(), ld_out,
                                      accumulate);
      expect_agree(o1, o2, "weighted_value_rows", 1e-5, 1e-5);
    }
    // The last call overwrote the rows' first dv columns (accumulate false) and left the rest.
    expect_agree(o2, o_want, "weighted_value_rows vs double", 1e-5, 1e-5);
  }
}

// TileOps::transpose, exact: strided rows on both sides, whole 16 x 16 blocks with edges of rows
// and columns, and the destination's padding left as it was; the variants' fp32 and the
// baseline's float64.
TEST_P(TileVariant, TransposeTile) {
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 16}, {64, 48}, {5, 3}, {20, 33}}) {
    const int64_t ld_src = cols + 7, ld_dst = rows + 5;
    const auto src = random_values(rows * ld_src, 50);
    std::vector<float> got((cols + 1) * ld_dst, -7.0f), want = got;
    std::vector<double> got64(got.begin(), got.end()), want64 = got64;
    const std::vector<double> src64(src.begin(), src.end());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        want[c * ld_dst + r] = src[r * ld_src + c];
        want64[c * ld_dst + r] = src64[r * ld_src + c];
      }
    }
    variant().fp32.transpose(src.data(), rows, cols, ld_src, got.data(), ld_dst);
    baseline::kDoubleTileOps.transpose(src64.data(), rows, cols, ld_src, got64.data(), ld_dst);
    EXPECT_EQ(got, want) << rows << " x " << cols;
    EXPECT_EQ(got64, want64) << rows << " x " << cols;
  }
}

// TileOps::transpose_scaled against its element-by-element definition (scale times the value,
// then the add, which the compiler may fuse into one rounding: to a rounding), written and
// accumulated, strided rows, whole blocks with edges; the variants' fp32 and the baseline's
// float64.
TEST_P(TileVariant, TransposeScaled) {
  for (const bool accumulate : {false, true}) {
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{50, 37}, {64, 48}, {5, 3}, {16, 16}}) {
      const int64_t ld_src = cols + 7, ld_dst = rows + 5;
      const auto src = random_values(rows * ld_src, 51);
      std::vector<float> got = random_values((cols + 1) * ld_dst, 52), want = got;
      std::vector<double> got64(got.begin(), got.end()), want64 = got64;
      const std::vector<double> src64(src.begin(), src.end());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float x = 0.75f * src[r * ld_src + c];
          const double x64 = 0.75 * src64[r * ld_src + c];
          float& w = want[c * ld_dst + r];
          double& w64 = want64[c * ld_dst + r];
          w = accumulate ? w + x : x;
          w64 = accumulate ? w64 + x64 : x64;
        }
      }
      variant().fp32.transpose_scaled(src.data(), rows, cols, ld_src, got.data(), ld_dst, 0.75f,
                                      accumulate);
      baseline::kDoubleTileOps.transpose_scaled(src64.data(), rows, cols, ld_src, got64.data(),
                                                ld_dst, 0.75, accumulate);
      SCOPED_TRACE(::testing::Message() << rows << " x " << cols << ", accumulate " << accumulate);
      expect_agree(got, want, "transpose_scaled");
      for (size_t i = 0; i < got64.size(); ++i) {
        ASSERT_NEAR(got64[i], want64[i], 1e-14 * (1.0 + std::abs(want64[i]))) << "at " << i;
      }
    }
  }
}

// Checks a variant's add_time_bias against the scalar bucketizer key by key: the buckets, and the
// tile `start` plus each key's weight; returns the expected buckets.
std::vector<int32_t> expect_time_bias_as_scalar(const TileOps<float>& ops,
                                                const std::vector<double>& key_time,
                                                double query_time,
                                                const LogBucketizer::View& bucket,
                                                const std::vector<float>& ts_w,
                                                const std::vector<float>& start) {
  const int64_t n = static_cast<int64_t>(key_time.size());
  std::vector<float> got = start, want = start;
  std::vector<int32_t> got_buckets(n, -1), want_buckets(n);
  for (int64_t j = 0; j < n; ++j) {
    want_buckets[j] = bucket(std::abs(query_time - key_time[j]));
    want[j] += ts_w[want_buckets[j]];
  }
  ops.add_time_bias(key_time.data(), n, query_time, bucket, ts_w.data(), got.data(),
                    got_buckets.data());
  EXPECT_EQ(got_buckets, want_buckets);
  EXPECT_EQ(got, want);
  return want_buckets;
}

// n key times from 1e9 on, mostly chronological (runs of one bucket), with keys 100 to 179 at one
// time, huge (saturating) times, a NaN, magnitudes below 1 from 1e9 and just above 1 (among a
// small divisor's thresholds); *last is the last chronological time.
std::vector<double> mixed_key_times(int64_t n, std::mt19937_64& rng, double* last) {
  std::vector<double> key_time(n);
  double t = 1e9;
  for (int64_t j = 0; j < n; ++j) {
    // Keys 100 to 179 at one time: groups that stay in the previous group's bucket.
    const bool burst = j >= 100 && j < 180;
    t += burst ? 0.0
               : static_cast<double>(rng() % 4 == 0 ? 0 : rng() % (uint64_t{1} << (rng() % 24)));
    key_time[j] = j % 29 == 7 ? std::ldexp(static_cast<double>(rng() % 1000), 900) : t;
  }
  if (n > 5) key_time[5] = std::numeric_limits<double>::quiet_NaN();
  if (n > 3) key_time[3] = 1e9 + 0.5;  // |delta| below 1 from the first query time
  if (n > 9) {                         // just above 1, among the small divisor's thresholds
    key_time[8] = 1e9 - 1.0011;
    key_time[9] = 1e9 + 1.0004;
  }
  *last = t;
  return key_time;
}

// TileOps::add_time_bias against the bucketizer key by key, exact: chronological keys (runs of
// one bucket), keys on both sides of the query time, repeated times, magnitudes below 1, huge and
// NaN ones; a divisor whose cells hold one threshold each (the vectorised path) and one whose
// cells hold several.
TEST_P(TileVariant, AddTimeBias) {
  std::mt19937_64 rng(11);
  for (const double divisor : {0.301, 1e-5}) {
    const LogBucketizer bucketizer(divisor, 128);
    const LogBucketizer::View bucket = bucketizer.view();
    std::vector<float> ts_w(129);
    for (int k = 0; k <= 128; ++k) ts_w[k] = 0.25f * static_cast<float>(k) - 3.0f;
    const std::vector<double> ts_w64(ts_w.begin(), ts_w.end());
    for (const int64_t n : {0, 1, 15, 16, 37, 300}) {
      double t = 0.0;
      const std::vector<double> key_time = mixed_key_times(n, rng, &t);
      for (const double query_time : {1e9, t / 2 + 5e8, t + 1.0}) {
        SCOPED_TRACE("divisor " + std::to_string(divisor) + ", n = " + std::to_string(n));
        const auto pos = random_values(n, 60);
        const std::vector<int32_t> want_buckets =
            expect_time_bias_as_scalar(variant().fp32, key_time, query_time, bucket, ts_w, pos);
        std::vector<double> got64(pos.begin(), pos.end()), want64 = got64;
        for (int64_t j = 0; j < n; ++j) want64[j] += ts_w64[want_buckets[j]];
        std::vector<int32_t> got_buckets(n, -1);
        baseline::kDoubleTileOps.add_time_bias(key_time.data(), n, query_time, bucket,
                                               ts_w64.data(), got64.data(), got_buckets.data());
        EXPECT_EQ(got64, want64);
      }
    }
  }
}

// TileOps::add_time_bias on keys nearing the query time, exact: the magnitudes shrink by a fifth
// of a bucket a key, so most groups of eight keys step down one bucket from the previous group
// (the vectorised path's second test) and end either in the lower bucket or, a key before the
// step, in the upper one; down to bucket 0, where no bucket lies below.
TEST_P(TileVariant, AddTimeBiasNearingTheQuery) {
  const LogBucketizer bucketizer(0.301, 128);
  const LogBucketizer::View bucket = bucketizer.view();
  std::vector<float> ts_w(129);
  for (int k = 0; k <= 128; ++k) ts_w[k] = 0.5f * static_cast<float>(k) + 1.0f;
  const double query_time = 1e12;
  for (const double shift : {0.0, 0.13, 0.37}) {
    const int64_t n = 640;
    std::vector<double> key_time(n);
    for (int64_t j = 0; j < n; ++j) {
      key_time[j] = query_time - std::exp(0.301 * (static_cast<double>(n - j) / 5.0 + shift));
    }
    SCOPED_TRACE(shift);
    const std::vector<int32_t> buckets = expect_time_bias_as_scalar(
        variant().fp32, key_time, query_time, bucket, ts_w, std::vector<float>(n, 0.25f));
    EXPECT_EQ(buckets.back(), 0) << "the keys reach bucket 0";
  }
}

// TileOps::add_time_bias on groups of eight keys whose magnitudes lie up to eight buckets below
// the group before them, in random order within a group (not only stepping down), and on groups
// that jump further, down to bucket 0: every path of the vector pass, in any order.
TEST_P(TileVariant, AddTimeBiasGroupsAcrossBuckets) {
  const LogBucketizer bucketizer(0.301, 128);
  const LogBucketizer::View bucket = bucketizer.view();
  std::vector<float> ts_w(129);
  for (int k = 0; k <= 128; ++k) ts_w[k] = 0.75f * static_cast<float>(k) - 20.0f;
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double query_time = 1e12;
  const int64_t n = 1203;
  std::vector<double> key_time(n);
  double level = 60.0;  // in buckets, falling to 0
  for (int64_t j = 0; j < n; ++j) {
    if (j % 8 == 0) level = std::max(0.0, level - (rng() % 5 == 0 ? 12.0 : 4.0 * unit(rng)));
    const double magnitude = std::exp(0.301 * std::max(0.0, level - 8.0 * unit(rng)));
    key_time[j] = query_time - magnitude;
  }
  const std::vector<int32_t> buckets = expect_time_bias_as_scalar(
      variant().fp32, key_time, query_time, bucket, ts_w, std::vector<float>(n, 0.5f));
  EXPECT_EQ(buckets.back(), 0) << "the keys reach bucket 0";
}

// TileOps::add_time_bias on magnitudes at every threshold and one double on either side of it,
// exact, for several divisors and bucket counts (ln(m) / divisor lies at an integer there, or
// within a double's rounding of one), up to magnitudes past the float range.
TEST_P(TileVariant, AddTimeBiasAtThresholds) {
  for (const double divisor : {0.301, 0.05, 0.04, 1.0}) {
    for (const int32_t buckets : {128, 256, 300}) {
      const LogBucketizer bucketizer(divisor, buckets);
      const LogBucketizer::View bucket = bucketizer.view();
      std::vector<float> ts_w(buckets + 1);
      for (int k = 0; k <= buckets; ++k) ts_w[k] = 0.125f * static_cast<float>(k) - 1.0f;
      std::vector<double> key_time;  // query time 0: magnitude = -key time
      for (int32_t k = 0; k <= buckets; ++k) {
        const double t = bucket.thresholds[k];
        for (const double m : {std::nextafter(t, 0.0), t, std::nextafter(t, HUGE_VAL)}) {
          key_time.push_back(-m);
        }
      }
      key_time.push_back(-1.5 * bucket.saturation);
      SCOPED_TRACE("divisor " + std::to_string(divisor) + ", " + std::to_string(buckets) +
                   " buckets");
      expect_time_bias_as_scalar(variant().fp32, key_time, 0.0, bucket, ts_w,
                                 std::vector<float>(key_time.size(), 0.5f));
    }
  }
}

// Checks TileOps::time_bucket_runs against the bucketizer key by key: the runs tile keys
// [key, key + n) in order, each key's bucket is its run's, and neighbouring runs differ.
template <typename T>
void expect_runs_as_scalar(const TileOps<T>& ops, const std::vector<double>& key_time,
                           double query_time, const LogBucketizer::View& bucket) {
  const int64_t n = static_cast<int64_t>(key_time.size()), key = 1000;
  std::vector<TimeRun> runs(std::max<int64_t>(n, 1));
  const int64_t count =
      ops.time_bucket_runs(key_time.data(), n, key, query_time, bucket, runs.data());
  int64_t next = key;
  for (int64_t k = 0; k < count; ++k) {
    ASSERT_EQ(runs[k].begin, next) << "run " << k;
    ASSERT_LT(runs[k].begin, runs[k].end) << "run " << k;
    if (k > 0) EXPECT_NE(runs[k].bucket, runs[k - 1].bucket) << "run " << k << " is not maximal";
    for (int64_t j = runs[k].begin; j < runs[k].end; ++j) {
      ASSERT_EQ(runs[k].bucket, bucket(std::abs(query_time - key_time[j - key]))) << "key " << j;
    }
    next = runs[k].end;
  }
  EXPECT_EQ(next, key + n);
}

// TileOps::time_bucket_runs on the keys of the add_time_bias tests: mixed ones (both divisors),
// keys nearing the query (a step down a bucket every five keys, into bucket 0) and falling by up
// to twelve buckets at once.
TEST_P(TileVariant, TimeBucketRuns) {
  std::mt19937_64 rng(12);
  for (const double divisor : {0.301, 1e-5}) {
    const LogBucketizer bucketizer(divisor, 128);
    for (const int64_t n : {0, 1, 15, 16, 37, 300}) {
      double t = 0.0;
      const std::vector<double> key_time = mixed_key_times(n, rng, &t);
      for (const double query_time : {1e9, t / 2 + 5e8, t + 1.0}) {
        SCOPED_TRACE("divisor " + std::to_string(divisor) + ", n = " + std::to_string(n));
        expect_runs_as_scalar(variant().fp32, key_time, query_time, bucketizer.view());
        expect_runs_as_scalar(baseline::kDoubleTileOps, key_time, query_time, bucketizer.view());
      }
    }
  }
  const LogBucketizer bucketizer(0.301, 128);
  const double query_time = 1e12;
  std::vector<double> nearing(640), falling(1203);
  for (int64_t j = 0; j < 640; ++j) {
    nearing[j] = query_time - std::exp(0.301 * static_cast<double>(640 - j) / 5.0);
  }
  double level = 60.0;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int64_t j = 0; j < 1203; ++j) {
    if (j % 8 == 0) level = std::max(0.0, level - (rng() % 5 == 0 ? 12.0 : 4.0 * unit(rng)));
    falling[j] = query_time - std::exp(0.301 * std::max(0.0, level - 8.0 * unit(rng)));
  }
  for (const auto* keys : {&nearing, &falling}) {
    expect_runs_as_scalar(variant().fp32, *keys, query_time, bucketizer.view());
  }
}

// TileOps::time_runs_forward / time_runs_backward against plain loops in double: runs of one key
// and of many, touching and apart (gaps a mask hides), value rows of 1, 7, 50 and 70 values (tails
// of the forward's vectors; 70 past its four), with and without the table's gradient.
TEST_P(TileVariant, TimeRunsForwardAndBackward) {
  std::mt19937_64 rng(13);
  const std::vector<TimeRun> runs = {{0, 1, 3},   {1, 40, 5},   {40, 41, 0},
                                     {45, 90, 7}, {90, 120, 3}, {131, 132, 9}};
  const int64_t keys = 140, count = static_cast<int64_t>(runs.size());
  std::vector<float> ts_w(10);
  for (int k = 0; k < 10; ++k) ts_w[k] = 0.3f * static_cast<float>(k) - 1.1f;
  const std::vector<double> ts_w64(ts_w.begin(), ts_w.end());
  std::uniform_real_distribution<double> value(-2.0, 2.0);
  for (const int64_t dv : {1, 7, 50, 70}) {
    SCOPED_TRACE("dv = " + std::to_string(dv));
    // Running sums of random value rows, padded as time_runs.h pads them.
    std::vector<double> sums((keys + 1) * dv + kTimeRunVectors * kTimeRunLanes, 0.0);
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t d = 0; d < dv; ++d) sums[(j + 1) * dv + d] = sums[j * dv + d] + value(rng);
    }
    std::vector<double> g(dv);
    for (double& x : g) x = value(rng);
    std::vector<double> want(dv, 0.0), want_grad(10, 0.25), want_diffs((keys + 1) * dv, 0.5);
    for (const TimeRun& run : runs) {
      double dot = 0.0;
      for (int64_t d = 0; d < dv; ++d) {
        const double sum = sums[run.end * dv + d] - sums[run.begin * dv + d];
        want[d] += ts_w64[run.bucket] * sum;
        dot += g[d] * sum;
        want_diffs[run.begin * dv + d] += ts_w64[run.bucket] * g[d];
        want_diffs[run.end * dv + d] -= ts_w64[run.bucket] * g[d];
      }
      want_grad[run.bucket] += dot;
    }
    for (const TileOps<float>* ops : {&variant().fp32, &base().fp32}) {
      std::vector<double> acc(dv, -1.0), grad(10, 0.25), diffs((keys + 1) * dv, 0.5);
      ops->time_runs_forward(runs.data(), count, ts_w.data(), sums.data(), dv, acc.data());
      ops->time_runs_backward(runs.data(), count, ts_w.data(), sums.data(), dv, g.data(),
                              diffs.data(), grad.data());
      for (int64_t d = 0; d < dv; ++d) EXPECT_NEAR(acc[d], want[d], 1e-12) << d;
      for (int k = 0; k < 10; ++k) EXPECT_NEAR(grad[k], want_grad[k], 1e-12) << k;
      for (size_t i = 0; i < diffs.size(); ++i) EXPECT_NEAR(diffs[i], want_diffs[i], 1e-12) << i;
      std::vector<double> diffs_only((keys + 1) * dv, 0.5);
      ops->time_runs_backward(runs.data(), count, ts_w.data(), sums.data(), dv, g.data(),
                              diffs_only.data(), nullptr);
      EXPECT_EQ(diffs_only, diffs);
    }
  }
}

// TileOps::add_by_bucket (the time table's gradient) against a scatter key by key: runs of one
// bucket shorter and longer than the vector groups, single keys between them, and a row of one
// key; the values are exact in any summation order.
TEST_P(TileVariant, AddByBucket) {
  for (const int64_t n : {0, 1, 3, 16, 37, 200, 401}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::vector<int32_t> buckets(n);
    std::vector<float> g(n);
    for (int64_t j = 0; j < n; ++j) {
      buckets[j] = j % 9 == 4 ? static_cast<int32_t>(rng() % 5) : static_cast<int32_t>(j / 40);
      g[j] = static_cast<float>(rng() % 1000) / 64.0f - 7.0f;
    }
    std::vector<double> got(16, 0.5), want(16, 0.5), got64(16, 0.5);
    const std::vector<double> g64(g.begin(), g.end());
    variant().fp32.add_by_bucket(g.data(), buckets.data(), n, got.data());
    baseline::kDoubleTileOps.add_by_bucket(g64.data(), buckets.data(), n, got64.data());
    for (int64_t j = 0; j < n; ++j) want[buckets[j]] += g[j];
    EXPECT_EQ(got, want) << "n = " << n;
    EXPECT_EQ(got64, want) << "n = " << n;
  }
}

TEST_P(TileVariant, SoftmaxRows) {
  const int64_t n = 301;
  const auto s0 = random_values(n, 34, -8.0f, 8.0f), dp0 = random_values(n, 35);
  std::vector<uint8_t> keep(n);
  for (int64_t j = 0; j < n; ++j) keep[j] = (j * 13) % 5 != 0;
  std::vector<float> s1 = s0, s2 = s0;
  const float m1 = variant().fp32.mask_row(s1.data(), n, keep.data());
  const float m2 = base().fp32.mask_row(s2.data(), n, keep.data());
  EXPECT_EQ(m1, m2);
  expect_agree(s1, s2, "mask_row");
  const float sum1 = variant().fp32.exp_row(s1.data(), n, m1);
  const float sum2 = base().fp32.exp_row(s2.data(), n, m2);
  EXPECT_NEAR(sum1, sum2, 1e-5 * sum2);
  expect_agree(s1, s2, "exp_row");
  const RowDropout<float> dropout{CounterRow::make(7, 3), keep_threshold(0.2), 1.25f};
  variant().fp32.dropout_row(s1.data(), n, dropout, 5);
  base().fp32.dropout_row(s2.data(), n, dropout, 5);
  expect_agree(s1, s2, "dropout_row");
  for (const RowDropout<float>* d : {static_cast<const RowDropout<float>*>(nullptr), &dropout}) {
    std::vector<float> a1 = s0, a2 = s0, g1 = dp0, g2 = dp0;
    variant().fp32.softmax_grad_row(a1.data(), g1.data(), n, 9.0f, 0.1f, 0.5f, d, 11);
    base().fp32.softmax_grad_row(a2.data(), g2.data(), n, 9.0f, 0.1f, 0.5f, d, 11);
    expect_agree(a1, a2, "softmax_grad_row p");
    expect_agree(g1, g2, "softmax_grad_row dp");
  }
}

TEST_P(TileVariant, DiagonalLayoutPasses) {
  for (const auto& [rows, n] : {std::pair<int64_t, int64_t>{64, 256}, {37, 100}, {16, 31}}) {
    const int64_t lanes = 64, diagonals = n + rows - 1, positions = 11, first = 2;
    std::vector<int32_t> delta(diagonals);
    for (int64_t c = 0; c < diagonals; ++c) delta[c] = static_cast<int32_t>((c * 5) % positions);
    const int64_t ld = first + n + rows;
    const auto c2p = random_values(positions * lanes, 36), p2c = random_values(positions * ld, 37);
    const auto tile0 = random_values(rows * n, 38);
    std::vector<float> diag1(diagonals * lanes, 0.0f), diag2 = diag1, t1 = tile0, t2 = tile0;
    variant().fp32.expand_position_terms(diag1.data(), rows, n, lanes, delta.data(), c2p.data(),
                                         lanes, p2c.data(), ld, first);
    base().fp32.expand_position_terms(diag2.data(), rows, n, lanes, delta.data(), c2p.data(), lanes,
                                      p2c.data(), ld, first);
    expect_agree(diag1, diag2, "expand_position_terms", 0, 0);
    variant().fp32.unshear_add(diag1.data(), rows, n, lanes, t1.data());
    base().fp32.unshear_add(diag2.data(), rows, n, lanes, t2.data());
    expect_agree(t1, t2, "unshear_add", 0, 0);
    variant().fp32.shear_tile(tile0.data(), rows, n, diag1.data(), lanes);
    base().fp32.shear_tile(tile0.data(), rows, n, diag2.data(), lanes);
    expect_agree(diag1, diag2, "shear_tile", 0, 0);
    std::vector<float> dc1(positions * lanes, 0.0f), dc2 = dc1, dp1(positions * ld, 0.0f),
                                                     dp2 = dp1;
    variant().fp32.accumulate_position_grads(diag1.data(), rows, n, lanes, delta.data(), dc1.data(),
                                             lanes, dp1.data(), ld, first);
    base().fp32.accumulate_position_grads(diag2.data(), rows, n, lanes, delta.data(), dc2.data(),
                                          lanes, dp2.data(), ld, first);
    expect_agree(dc1, dc2, "accumulate_position_grads c2p", 0, 0);
    expect_agree(dp1, dp2, "accumulate_position_grads p2c", 0, 0);
    t1 = tile0;
    t2 = tile0;
    variant().fp32.add_uniform_position_terms(t1.data(), rows, n, c2p.data(), p2c.data());
    base().fp32.add_uniform_position_terms(t2.data(), rows, n, c2p.data(), p2c.data());
    expect_agree(t1, t2, "add_uniform_position_terms", 0, 0);
    std::vector<float> u1(rows, 0.0f), u2 = u1, v1(n, 0.0f), v2 = v1;
    variant().fp32.accumulate_uniform_position_grads(tile0.data(), rows, n, u1.data(), v1.data());
    base().fp32.accumulate_uniform_position_grads(tile0.data(), rows, n, u2.data(), v2.data());
    expect_agree(u1, u2, "accumulate_uniform_position_grads rows", 1e-5, 1e-4);
    expect_agree(v1, v2, "accumulate_uniform_position_grads columns", 0, 0);
  }
}

TEST_P(TileVariant, Bf16Operands) {
  const int64_t rows = 10, cols = 45, n = rows * cols;
  const auto src = random_values(n, 39), ds = random_values(n, 40), bias = random_values(n, 41);
  const auto mask = random_mask(n, 42);
  std::vector<uint16_t> o1(n), o2(n);
  variant().to_bf16(src.data(), o1.data(), n, 0.75f);
  base().to_bf16(src.data(), o2.data(), n, 0.75f);
  EXPECT_EQ(o1, o2);
  variant().to_bf16_vnni(src.data(), rows, cols, o1.data(), 1.5f);
  base().to_bf16_vnni(src.data(), rows, cols, o2.data(), 1.5f);
  EXPECT_EQ(o1, o2);
  // With and without bias and mask (a null mask: all visible, as an all-ones mask), every length
  // up to two vectors past the 32-score body (the tails).
  const std::vector<float> ones(n, 1.0f);
  o1.resize(n + 1);  // a sentinel past the longest run
  for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
    for (const float* m : {static_cast<const float*>(nullptr), mask.data()}) {
      for (const int64_t len :
           {n, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{33}, int64_t{63}}) {
        std::fill(o1.begin(), o1.end(), uint16_t(0xdead));
        variant().silu_scores_to_bf16(src.data(), b, m, len, 0.9f, 0.5f, o1.data());
        base().silu_scores_to_bf16(src.data(), b, m == nullptr ? ones.data() : m, len, 0.9f, 0.5f,
                                   o2.data());
        for (int64_t j = 0; j < len; ++j) {
          // One bf16 step at most: the fp32 values differ by roundings only.
          EXPECT_NEAR(from_bf16(o1[j]), from_bf16(o2[j]), 1e-7 + std::abs(from_bf16(o2[j])) / 128)
              << j << " of " << len;
        }
        EXPECT_EQ(o1[len], uint16_t(0xdead)) << "wrote past " << len;
      }
    }
  }
  std::vector<uint16_t> a1(n), a2(n), r1(n), r2(n), v1(n), v2(n);
  variant().backward_operands_to_bf16(src.data(), ds.data(), rows, cols, 2.5f, a1.data(), r1.data(),
                                      v1.data());
  base().backward_operands_to_bf16(src.data(), ds.data(), rows, cols, 2.5f, a2.data(), r2.data(),
                                   v2.data());
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(r1, r2);
  EXPECT_EQ(v1, v2);
}

TEST_P(TileVariant, SiluToBf16AtExtremes) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> s = {-1e30f,  -1e4f, -100.0f, -88.0f, -80.0f,       -30.0f,
                                -1e-30f, 0.0f,  1e-30f,  30.0f,  80.0f,        88.0f,
                                100.0f,  1e4f,  1e30f,   inf,    std::nanf("")};
  const int64_t n = static_cast<int64_t>(s.size());
  std::vector<uint16_t> out(n);
  variant().silu_scores_to_bf16(s.data(), nullptr, nullptr, n, 1.0f, 0.5f, out.data());
  for (int64_t j = 0; j + 2 < n; ++j) {
    const double want = silu(s[j]) * 0.5;
    EXPECT_NEAR(from_bf16(out[j]), want, 1e-7 + std::abs(want) / 128) << s[j];
  }
  EXPECT_EQ(from_bf16(out[n - 2]), inf);
  EXPECT_TRUE(std::isnan(from_bf16(out[n - 1])));
}

TEST_P(TileVariant, Bf16Transposes) {
  expect_bf16_transposes(variant());
}

// ---------------------------------------------------------------- fused AMX tile
struct FusedCase {
  int64_t dqk, dv, keys;
  bool bias, mask, blocked;  // blocked: K^T in blocks of 32 keys, else one [Dqk, keys] layout
};

class FusedTile : public ::testing::TestWithParam<FusedCase> {};

// The fused tile against plain loops in double on the same bf16 operands: S = Q K^T,
// P = silu(alpha S + bias) * scale * mask where visible (else 0), O = P V. P is rounded to bf16
// by the kernel, so the tolerance is a bf16 step of each output's sum of |P V| terms.
TEST_P(FusedTile, MatchesPlainLoops) {
  if (!native_bf16::amx_tiles_available()) GTEST_SKIP() << "no AMX tiles here";
  const FusedCase c = GetParam();
  constexpr int64_t kRows = 16, kG = native_bf16::kFusedGranule;
  const auto to_bits = [](const std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = reference_bf16(x[i]);
    return b;
  };
  const auto q = to_bits(random_values(kRows * c.dqk, 50));
  const auto k = to_bits(random_values(c.keys * c.dqk, 51));  // [keys, dqk]
  const auto v = to_bits(random_values(c.keys * c.dv, 52));   // [keys, dv]
  const auto bias = random_values(kRows * c.keys, 53), mask = random_mask(kRows * c.keys, 54);
  // K^T in VNNI layout, blocked or not; V in VNNI layout.
  const int64_t ld_k_t = c.blocked ? kG : c.keys, k_t_step = c.blocked ? c.dqk * kG : 2 * kG;
  std::vector<uint16_t> k_t(c.dqk * c.keys), v_vnni(c.keys * c.dv);
  for (int64_t j = 0; j < c.keys; ++j) {
    for (int64_t d = 0; d < c.dqk; ++d) {
      k_t[(j / kG) * k_t_step + ((d / 2) * ld_k_t + j % kG) * 2 + d % 2] = k[j * c.dqk + d];
    }
    for (int64_t d = 0; d < c.dv; ++d) v_vnni[((j / 2) * c.dv + d) * 2 + j % 2] = v[j * c.dv + d];
  }
  // Visibility: row r sees keys [r, r + keys / 2) and key 0, so some chunks are empty for all.
  const int64_t words = c.keys / kG;
  std::vector<uint32_t> visible(kRows * words, 0u);
  const auto sees = [&](int64_t r, int64_t j) { return j == 0 || (j >= r && j < r + c.keys / 2); };
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < c.keys; ++j) {
      if (sees(r, j)) visible[r * words + j / kG] |= 1u << (j % kG);
    }
  }
  const float alpha = 0.7f, scale = 0.25f;
  std::vector<float> o(kRows * c.dv, -1.0f);
  native_bf16::silu_attention_tile({q.data(), k_t.data(), ld_k_t, k_t_step, v_vnni.data(), c.dqk,
                                    c.dv, c.keys, visible.data(), c.bias ? bias.data() : nullptr,
                                    c.mask ? mask.data() : nullptr, c.keys, alpha, scale,
                                    o.data()});
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t d = 0; d < c.dv; ++d) {
      double want = 0.0, magnitude = 0.0;
      for (int64_t j = 0; j < c.keys; ++j) {
        if (!sees(r, j)) continue;
        double s = 0.0;
        for (int64_t e = 0; e < c.dqk; ++e) {
          s += double(from_bf16(q[r * c.dqk + e])) * from_bf16(k[j * c.dqk + e]);
        }
        const double x = alpha * s + (c.bias ? bias[r * c.keys + j] : 0.0);
        const double p = silu(x) * scale * (c.mask ? mask[r * c.keys + j] : 1.0);
        want += p * from_bf16(v[j * c.dv + d]);
        magnitude += std::abs(p * from_bf16(v[j * c.dv + d]));
      }
      EXPECT_NEAR(o[r * c.dv + d], want, 1e-6 + magnitude / 128) << "row " << r << " col " << d;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedTile,
                         ::testing::Values(FusedCase{64, 64, 96, false, false, true},
                                           FusedCase{64, 64, 96, true, true, false},
                                           FusedCase{32, 16, 32, true, false, true},
                                           FusedCase{96, 48, 160, false, true, true},
                                           FusedCase{32, 32, 64, true, true, false}));

INSTANTIATE_TEST_SUITE_P(RowsAndKeys, FewRowProducts,
                         ::testing::Combine(::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                                            ::testing::Values(1, 3, 4, 6, 8),
                                            ::testing::Values(5, 37)));

INSTANTIATE_TEST_SUITE_P(Isa, TileVariant,
                         ::testing::Values(VariantCase{CpuIsa::kAvx2, false, "avx2"},
                                           VariantCase{CpuIsa::kAvx512, false, "avx512"},
                                           VariantCase{CpuIsa::kAvx512, true, "avx512_bf16"}),
                         [](const ::testing::TestParamInfo<VariantCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace recops::attention::kernels
