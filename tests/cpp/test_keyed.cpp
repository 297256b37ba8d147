// Keyed family kernels (csrc/recops/keyed/kernels) against scalar loops: the column moves of
// permute_multi_embedding (copies, and the backward's in-order adds), the row-wise concatenation
// of merge_pooled_embeddings over every split of the output into tasks, and the regroup plan of
// kt_regroup_arguments (offsets, repeated keys' links, unknown keys).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/keyed/kernels/concatenate.h"
#include "recops/keyed/kernels/move_segments.h"
#include "recops/keyed/kernels/regroup_plan.h"
#include "test_util.h"

namespace recops::keyed::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

// Scalar loops: each segment in order, row by row.
std::vector<std::vector<double>> expected_moves(const std::vector<std::vector<double>>& inputs,
                                                const std::vector<int64_t>& in_columns,
                                                const std::vector<int64_t>& out_columns,
                                                const std::vector<Segment>& segments,
                                                int64_t rows) {
  std::vector<std::vector<double>> outputs;
  for (int64_t columns : out_columns) outputs.emplace_back(rows * columns, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (const Segment& s : segments) {
      for (int64_t j = 0; j < s.width; ++j) {
        const double v = inputs[s.source][r * in_columns[s.source] + s.source_column + j];
        double& out = outputs[s.target][r * out_columns[s.target] + s.target_column + j];
        out = s.accumulate ? out + v : v;
      }
    }
  }
  return outputs;
}

template <typename T>
void check_moves(int64_t rows, bool with_adds) {
  const std::vector<int64_t> in_columns = {5, 0, 9};
  const std::vector<int64_t> out_columns = {7, 6};
  // Output 0 fully overwritten (twice in its first columns), output 1 by copies then adds.
  std::vector<Segment> segments = {
      {0, 0, 1, 0, 4, false},     {2, 0, 0, 4, 3, false}, {2, 0, 5, 0, 2, false},
      {1, 1, 0, 6, 0, false},     {2, 1, 2, 0, 6, false}, {0, 1, 0, 1, 5, with_adds},
      {2, 1, 3, 2, 4, with_adds},
  };
  std::vector<std::vector<double>> inputs_d;
  std::vector<std::vector<T>> inputs;
  for (size_t i = 0; i < in_columns.size(); ++i) {
    const auto values = random_integers<int64_t>(rows * in_columns[i], -20, 20, 7 + i);
    inputs_d.emplace_back(values.begin(), values.end());
    std::vector<T> typed;
    for (int64_t v : values) typed.push_back(static_cast<T>(static_cast<float>(v)));
    inputs.push_back(typed);
  }
  std::vector<std::vector<T>> outputs;
  for (int64_t columns : out_columns) outputs.emplace_back(rows * columns, T(0.0f));
  std::vector<Rows<const T>> in;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back({inputs[i].data(), in_columns[i]});
  std::vector<Rows<T>> out;
  for (size_t j = 0; j < outputs.size(); ++j) out.push_back({outputs[j].data(), out_columns[j]});
  move_segments(rows, in.data(), out.data(), segments.data(),
                static_cast<int64_t>(segments.size()));
  const auto want = expected_moves(inputs_d, in_columns, out_columns, segments, rows);
  for (size_t j = 0; j < outputs.size(); ++j) {
    for (size_t e = 0; e < outputs[j].size(); ++e) {
      ASSERT_EQ(static_cast<double>(static_cast<float>(outputs[j][e])), want[j][e])
          << "output " << j << " element " << e;
    }
  }
}

TEST(KeyedMoves, CopiesAndAddsInOrder) {
  for (bool adds : {false, true}) {
    check_moves<float>(3, adds);
    check_moves<double>(0, adds);
    check_moves<Bf16>(5, adds);
    check_moves<Fp16>(1, adds);
  }
  ScopedThreads threads(4);
  check_moves<float>(5000, true);
  check_moves<Bf16>(4097, false);
}

// Parts of `rows` rows, part p with widths[p] bytes per row; each byte a function of its place.
void check_concatenate(int64_t rows, const std::vector<int64_t>& widths) {
  std::vector<std::vector<char>> parts;
  std::vector<const char*> data;
  for (size_t p = 0; p < widths.size(); ++p) {
    parts.emplace_back(rows * widths[p]);
    for (size_t b = 0; b < parts[p].size(); ++b) parts[p][b] = static_cast<char>(b * 31 + p * 7);
    data.push_back(parts[p].data());
  }
  std::vector<char> want;
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t p = 0; p < widths.size(); ++p) {
      want.insert(want.end(), parts[p].begin() + r * widths[p],
                  parts[p].begin() + (r + 1) * widths[p]);
    }
  }
  std::vector<char> got(want.size(), 0);
  concatenate(data.data(), widths.data(), static_cast<int64_t>(widths.size()), rows, got.data());
  EXPECT_EQ(got, want);
}

TEST(KeyedConcatenate, MatchesRowByRowCopies) {
  check_concatenate(3, {4, 0, 12});
  check_concatenate(0, {4, 8});
  check_concatenate(5, {0, 0});
  ScopedThreads threads(4);
  check_concatenate(1, {300000, 0, 12345, 77});  // one row, split inside its parts
  check_concatenate(7001, {52, 0, 4, 100});      // task boundaries inside rows and parts
  check_concatenate(100, {0, 70000, 0});
}

TEST(KeyedRegroupPlan, MovesOffsetsAndLinks) {
  const std::vector<std::vector<std::string>> keys = {{"a", "b"}, {"c", "a"}};
  const std::vector<std::vector<int64_t>> lengths = {{2, 3}, {4, 1}};
  const std::vector<std::vector<std::string>> groups = {{"c", "a"}, {"b", "a", "a"}, {}};
  RegroupPlan plan;
  const UnknownKey unknown = plan_regroup(keys, lengths, groups, plan);
  EXPECT_EQ(unknown.group, -1);
  EXPECT_EQ(plan.input_widths, (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(plan.output_widths, (std::vector<int64_t>{6, 7, 0}));
  // "a" resolves to tensor 0 (its first place); its three uses link 1 -> 3 -> 4 (stop: -5).
  const std::vector<int64_t> want = {
      1, 0, 0, 0, 4, 0,   // c
      0, 0, 0, 4, 2, 3,   // a, first use: + next
      0, 1, 2, 0, 3, 0,   // b
      0, 1, 0, 3, 2, -4,  // a, middle use: - next
      0, 1, 0, 5, 2, -5,  // a, last use: - number of moves
  };
  EXPECT_EQ(plan.moves, want);
}

TEST(KeyedRegroupPlan, ReportsTheFirstUnknownKey) {
  RegroupPlan plan;
  const UnknownKey unknown = plan_regroup({{"a"}}, {{1}}, {{"a"}, {"a", "x", "y"}}, plan);
  EXPECT_EQ(unknown.group, 1);
  EXPECT_EQ(unknown.position, 1);
}

}  // namespace
}  // namespace recops::keyed::kernels
