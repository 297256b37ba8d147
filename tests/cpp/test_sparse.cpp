// Sparse family kernels (csrc/recops/sparse/kernels) against scalar loops: permute_sparse (the
// 2-D form's feature segments and the 1-D form's single-entry segments, with a weights stream),
// permute_column_blocks (permute_pooled_embs) and invert_permutation, whose AVX-512 variant
// (invert_avx512.cpp) must agree with the portable one.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "recops/sparse/kernels/invert.h"
#include "recops/sparse/kernels/permute.h"
#include "recops/sparse/kernels/permute_pooled.h"
#include "test_util.h"

namespace recops::sparse::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

template <typename T>
struct Permuted {
  std::vector<T> lengths;
  std::vector<T> values;
  std::vector<float> weights;
};

// Segment t of lengths [segments, cols] is row t: its rows of values follow each other.
template <typename perm_t, typename T>
Permuted<T> scalar_permute(const std::vector<perm_t>& permute, const std::vector<T>& lengths,
                           int64_t cols, const std::vector<T>& values,
                           const std::vector<float>& weights, int64_t values_per_row) {
  const int64_t segments = cols == 0 ? 0 : static_cast<int64_t>(lengths.size()) / cols;
  std::vector<int64_t> offsets(segments + 1, 0);
  for (int64_t t = 0; t < segments; ++t) {
    offsets[t + 1] = offsets[t];
    for (int64_t c = 0; c < cols; ++c) offsets[t + 1] += lengths[t * cols + c];
  }
  Permuted<T> out;
  for (const perm_t p : permute) {
    for (int64_t c = 0; c < cols; ++c) out.lengths.push_back(lengths[p * cols + c]);
    for (int64_t r = offsets[p]; r < offsets[p + 1]; ++r) {
      for (int64_t k = 0; k < values_per_row; ++k)
        out.values.push_back(values[r * values_per_row + k]);
      if (!weights.empty()) out.weights.push_back(weights[r]);
    }
  }
  return out;
}

// Runs permute_sparse on values rows of `values_per_row` T's (and weights when given).
template <typename perm_t, typename T>
void check_permute(const std::vector<perm_t>& permute, const std::vector<T>& lengths, int64_t cols,
                   int64_t values_per_row, bool with_weights) {
  const int64_t segments = cols == 0 ? 0 : static_cast<int64_t>(lengths.size()) / cols;
  int64_t total_rows = 0;
  for (const T l : lengths) total_rows += l;
  std::vector<T> values(total_rows * values_per_row);
  std::iota(values.begin(), values.end(), T{1});
  std::vector<float> weights;
  if (with_weights) weights = test::random_floats(total_rows);
  const Permuted<T> expected =
      scalar_permute(permute, lengths, cols, values, weights, values_per_row);

  int64_t dst_rows = 0;
  for (const T l : expected.lengths) dst_rows += l;
  const int64_t num_out = static_cast<int64_t>(permute.size());
  std::vector<T> permuted_lengths(num_out * cols, T{-1});
  Permuted<T> out;
  int prepared = 0;
  permute_sparse(permute.data(), num_out, lengths.data(), segments, cols, permuted_lengths.data(),
                 [&](const PermutedRows& rows, PermutedStream* streams) {
                   ++prepared;
                   EXPECT_EQ(rows.src_rows, total_rows);
                   EXPECT_EQ(rows.dst_rows, dst_rows);
                   out.values.assign(rows.dst_rows * values_per_row, T{-1});
                   streams[0] = {reinterpret_cast<const char*>(values.data()),
                                 static_cast<int64_t>(values.size() * sizeof(T)),
                                 reinterpret_cast<char*>(out.values.data()),
                                 static_cast<int64_t>(values_per_row * sizeof(T))};
                   if (!with_weights) return 1;
                   out.weights.assign(rows.dst_rows, -1.0f);
                   streams[1] = {reinterpret_cast<const char*>(weights.data()),
                                 static_cast<int64_t>(weights.size() * sizeof(float)),
                                 reinterpret_cast<char*>(out.weights.data()), sizeof(float)};
                   return 2;
                 });
  EXPECT_EQ(prepared, 1);
  EXPECT_EQ(permuted_lengths, expected.lengths);
  EXPECT_EQ(out.values, expected.values);
  EXPECT_EQ(out.weights, expected.weights);
}

TEST(PermuteSparse, TwoDimensionalFeatureSegments) {
  // 4 features x 3 bags, with empty bags and an empty feature; permute repeats and drops features.
  const std::vector<int32_t> lengths = {2, 0, 1, 0, 0, 0, 3, 1, 4, 1, 1, 0};
  check_permute<int64_t, int32_t>({2, 0, 3, 3, 1}, lengths, 3, 1, true);
  check_permute<int32_t, int32_t>({3, 2, 1, 0}, lengths, 3, 3, false);  // 12-byte rows
  check_permute<int64_t, int64_t>({1, 1}, {0, 0, 0, 5, 0, 2}, 3, 2, true);
}

TEST(PermuteSparse, OneDimensionalSingleEntrySegments) {
  check_permute<int32_t, int64_t>({4, 0, 2, 1, 3}, {1, 0, 7, 2, 3}, 1, 1, true);
  check_permute<int64_t, int32_t>({0}, {0}, 1, 1, false);
}

TEST(PermuteSparse, EmptyInputs) {
  check_permute<int64_t, int32_t>({}, {3, 1, 2}, 1, 1, true);  // no output segments
  check_permute<int32_t, int64_t>({}, {}, 1, 1, false);        // no segments at all
  check_permute<int32_t, int32_t>({}, {}, 4, 1, true);
}

TEST(PermuteSparse, ManySegmentsInParallel) {
  ScopedThreads threads(4);
  const int64_t segments = 30000;
  const std::vector<int32_t> lengths = random_integers<int32_t>(segments, 0, 9);
  std::vector<int64_t> permute(segments);
  std::iota(permute.begin(), permute.end(), 0);
  std::shuffle(permute.begin(), permute.end(), std::mt19937(3));
  std::sort(permute.begin() + 100, permute.begin() + 2000);  // runs contiguous in the source too
  check_permute<int64_t, int32_t>(permute, lengths, 1, 1, true);
  check_permute<int64_t, int32_t>(permute, lengths, 1, 40, false);  // long runs: memcpy
  // 3000 features of 10 bags each, permuted with repeats.
  const std::vector<int64_t> lengths_2d = random_integers<int64_t>(segments, 0, 3, 5);
  check_permute<int32_t, int64_t>(random_integers<int32_t>(4000, 0, 2999, 6), lengths_2d, 10, 1,
                                  true);
}

TEST(PermutePooled, ColumnBlocks) {
  // 4 blocks of widths 2, 0, 3, 1 in rows of 6 floats; output block i is input block source[i].
  const std::vector<int64_t> widths = {2, 0, 3, 1};
  const std::vector<int64_t> source = {2, 0, 3, 1};
  std::vector<int64_t> in_offsets = {0}, out_offsets = {0};
  for (const int64_t w : widths) in_offsets.push_back(in_offsets.back() + w);
  for (const int64_t s : source) out_offsets.push_back(out_offsets.back() + widths[s]);
  for (const int64_t rows : {0, 1, 5}) {
    const int64_t width = 6;
    std::vector<float> in(rows * width);
    std::iota(in.begin(), in.end(), 0.0f);
    std::vector<float> out(in.size(), -1.0f), expected;
    for (int64_t r = 0; r < rows; ++r) {
      for (const int64_t s : source) {
        for (int64_t c = in_offsets[s]; c < in_offsets[s + 1]; ++c)
          expected.push_back(in[r * width + c]);
      }
    }
    permute_column_blocks(reinterpret_cast<const char*>(in.data()),
                          reinterpret_cast<char*>(out.data()), rows, width, sizeof(float),
                          in_offsets.data(), out_offsets.data(), source.data(), 4);
    EXPECT_EQ(out, expected);
  }
}

template <typename perm_t>
std::vector<perm_t> random_permutation(int64_t n, uint32_t seed) {
  std::vector<perm_t> p(n);
  std::iota(p.begin(), p.end(), perm_t{0});
  std::shuffle(p.begin(), p.end(), std::mt19937(seed));
  return p;
}

template <typename perm_t>
void check_inverts(const std::vector<perm_t>& permute) {
  const int64_t n = static_cast<int64_t>(permute.size());
  std::vector<perm_t> inverse(n, -7);
  ASSERT_TRUE(invert_permutation(permute.data(), n, inverse.data()));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(inverse[permute[i]], i);
}

TEST(InvertPermute, InvertsPermutations) {
  check_inverts<int32_t>({});
  check_inverts<int64_t>({0});
  check_inverts<int32_t>({2, 0, 1});
  check_inverts(random_permutation<int64_t>(1000, 1));
  ScopedThreads threads(4);
  check_inverts(random_permutation<int32_t>(200000, 2));
  check_inverts(random_permutation<int64_t>(200000, 3));
}

TEST(InvertPermute, RejectsNonPermutations) {
  ScopedThreads threads(4);
  for (const int64_t n : {int64_t{5}, int64_t{100000}}) {
    std::vector<int64_t> permute = random_permutation<int64_t>(n, 4);
    std::vector<int64_t> inverse(n);
    const int64_t kept = permute[n - 1];
    permute[n - 1] = n;  // out of range
    EXPECT_FALSE(invert_permutation(permute.data(), n, inverse.data()));
    permute[n - 1] = -1;
    EXPECT_FALSE(invert_permutation(permute.data(), n, inverse.data()));
    permute[n - 1] = permute[n / 2];  // a repeat: `kept` is missing
    EXPECT_FALSE(invert_permutation(permute.data(), n, inverse.data()));
    EXPECT_EQ(first_repeated_entry(permute.data(), n), n - 1);
    permute[n - 1] = kept;
    EXPECT_EQ(first_repeated_entry(permute.data(), n), -1);
  }
  const std::vector<int32_t> twice = {1, 0, 1, 2};
  EXPECT_EQ(first_repeated_entry(twice.data(), 4), 2);
}

#if RECOPS_X86_VARIANTS
// The AVX-512 owned-slice kernel (scatter_owned_avx512) against the portable entry-slice kernel.
template <typename perm_t>
void check_variants_agree(const std::vector<perm_t>& permute, bool valid) {
  const int64_t n = static_cast<int64_t>(permute.size());
  std::vector<perm_t> baseline(n, -7), avx512(n, -7);
  EXPECT_EQ(invert_by_entry_slices(permute.data(), n, baseline.data()), valid);
  EXPECT_EQ(invert_by_owned_slices(permute.data(), n, avx512.data()), valid);
  if (valid) {
    EXPECT_EQ(avx512, baseline);
  }
}

TEST(InvertPermute, Avx512VariantAgreesWithBaseline) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(CpuIsa::kAvx512);
  ScopedThreads threads(4);
  for (const int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
    check_variants_agree(random_permutation<int32_t>(n, 5), true);
    check_variants_agree(random_permutation<int64_t>(n, 6), true);
    std::vector<int64_t> bad = random_permutation<int64_t>(n, 7);
    bad[n / 2] = n + 3;
    check_variants_agree(bad, false);
    std::vector<int32_t> repeat = random_permutation<int32_t>(n, 8);
    if (n > 1) {
      repeat[0] = repeat[n - 1];
      check_variants_agree(repeat, false);
    }
  }
}
#endif

}  // namespace
}  // namespace recops::sparse::kernels
