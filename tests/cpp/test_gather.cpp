// Gather family kernels (csrc/recops/gather/kernels) against scalar loops: gather_for_rank1's
// y = x[index] and its backward, the scatter-add, on both of its strategies (per-chunk partial
// histograms and owner-computes ranges), for every floating type; bad indices are reported by
// position. The row gathers of the index_select_dim0 family (index_select_rows.h): several
// tables at once, with strided output rows, and the row scatter-add on its serial and
// owner-computes paths.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/gather/kernels/gather.h"
#include "recops/gather/kernels/index_select_rows.h"
#include "test_util.h"

namespace recops::gather::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

template <typename value_t, typename index_t>
void check_gather(int64_t n, int64_t num_indices) {
  std::vector<value_t> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<value_t>(i * 7 + 3);
  const std::vector<index_t> index = random_integers<index_t>(num_indices, 0, n - 1);
  std::vector<value_t> y(num_indices), expected(num_indices);
  for (int64_t i = 0; i < num_indices; ++i) expected[i] = x[index[i]];
  EXPECT_EQ(gather(x.data(), n, index.data(), num_indices, y.data()), -1);
  EXPECT_EQ(y, expected);
}

TEST(Gather, GathersEveryWidthAndIndexType) {
  check_gather<uint32_t, int32_t>(10, 25);
  check_gather<uint64_t, int64_t>(1000, 3);
  check_gather<uint16_t, int64_t>(5, 0);
  ScopedThreads threads(4);
  check_gather<uint32_t, int64_t>(100000, 300000);
}

TEST(Gather, ReportsTheFirstBadIndex) {
  ScopedThreads threads(4);
  const std::vector<uint32_t> x = {1, 2, 3};
  for (const int64_t num_indices : {int64_t{6}, int64_t{200000}}) {
    std::vector<int64_t> index(num_indices, 1);
    index[num_indices - 2] = 3;
    index[num_indices - 1] = -1;
    std::vector<uint32_t> y(num_indices);
    EXPECT_EQ(gather(x.data(), 3, index.data(), num_indices, y.data()), num_indices - 2);
  }
}

template <typename T>
double as_double(T x) {
  return static_cast<double>(static_cast<accumulate_t<T>>(x));
}

// out[k] = sum of grad[i] over index[i] == k, accumulated in double.
template <typename scalar_t, typename index_t>
std::vector<double> scalar_scatter_add(const std::vector<scalar_t>& grad,
                                       const std::vector<index_t>& index, int64_t n) {
  std::vector<double> out(n, 0.0);
  for (size_t i = 0; i < index.size(); ++i) out[index[i]] += as_double(grad[i]);
  return out;
}

template <typename scalar_t, typename index_t>
void check_scatter_add(int64_t n, int64_t num_indices, double tolerance) {
  using acc_t = accumulate_t<scalar_t>;
  const std::vector<float> values = test::random_floats(num_indices);
  std::vector<scalar_t> grad;
  for (const float v : values) grad.push_back(static_cast<scalar_t>(v));
  // Runs of one index, as neighbouring elements often share a bin.
  std::vector<index_t> index = random_integers<index_t>(num_indices, 0, n - 1);
  for (int64_t i = 1; i < num_indices; i += 3) index[i] = index[i - 1];
  std::vector<scalar_t> out(n, static_cast<scalar_t>(99.0f));
  EXPECT_EQ(scatter_add<acc_t>(grad.data(), index.data(), num_indices, n, out.data()), -1);
  const std::vector<double> expected = scalar_scatter_add(grad, index, n);
  for (int64_t k = 0; k < n; ++k) {
    ASSERT_NEAR(as_double(out[k]), expected[k], tolerance * (1 + std::abs(expected[k])))
        << "slot " << k << " of " << n;
  }
}

TEST(ScatterAdd, PartialHistogramsEveryFloatingType) {
  check_scatter_add<float, int32_t>(7, 50, 1e-6);
  check_scatter_add<double, int64_t>(129, 1000, 1e-12);
  check_scatter_add<float, int64_t>(3, 0, 0);  // no indices: all zero
  ScopedThreads threads(4);
  // Several chunks, few slots: partial tables, with (n = 129) and without interleaved lanes.
  check_scatter_add<float, int64_t>(129, 400000, 1e-5);
  check_scatter_add<double, int32_t>(5000, 400000, 1e-12);
  check_scatter_add<Fp16, int32_t>(129, 100000, 2e-3);
  check_scatter_add<Bf16, int64_t>(129, 100000, 1e-2);
}

TEST(ScatterAdd, OwnerComputesRangesWhenSlotsOutnumberIndices) {
  ScopedThreads threads(4);
  check_scatter_add<float, int64_t>(200000, 100000, 1e-6);
  check_scatter_add<double, int32_t>(100001, 70000, 1e-12);
  check_scatter_add<Bf16, int32_t>(300000, 50000, 1e-2);
}

TEST(ScatterAdd, ReportsTheFirstBadIndex) {
  ScopedThreads threads(4);
  for (const int64_t n : {int64_t{10}, int64_t{500000}}) {  // partial tables, owned ranges
    const int64_t num_indices = 100000;
    std::vector<int32_t> index = random_integers<int32_t>(num_indices, 0, n - 1);
    index[70000] = static_cast<int32_t>(n);
    index[90000] = -1;
    const std::vector<float> grad(num_indices, 1.0f);
    std::vector<float> out(n);
    EXPECT_EQ(scatter_add<float>(grad.data(), index.data(), num_indices, n, out.data()), 70000);
  }
}

// ---------------------------------------------------------------- row gathers of several tables
struct Table {
  int64_t rows, width;
  std::vector<float> values;
  std::vector<int64_t> index;
};

std::vector<Table> random_tables(const std::vector<std::array<int64_t, 3>>& shapes) {
  std::vector<Table> tables;
  uint32_t seed = 5;
  for (const auto& [rows, width, count] : shapes) {
    Table t{rows, width, {}, random_integers<int64_t>(count, 0, rows - 1, seed++)};
    for (int64_t e = 0; e < rows * width; ++e) t.values.push_back(static_cast<float>(e % 1009));
    tables.push_back(std::move(t));
  }
  return tables;
}

// Gathers every table's rows side by side (row j of the output: table 0's row, table 1's, ...),
// as batch_index_select_dim0's permuted output, and checks it against a scalar loop.
void check_row_gather(const std::vector<std::array<int64_t, 3>>& shapes) {
  std::vector<Table> tables = random_tables(shapes);
  const int64_t count = shapes[0][2];
  int64_t total_width = 0;
  for (const Table& t : tables) total_width += t.width;
  std::vector<float> out(count * total_width, -1.0f);
  std::vector<RowGather> groups;
  int64_t column = 0;
  for (const Table& t : tables) {
    groups.push_back({reinterpret_cast<const char*>(t.values.data()), t.rows,
                      t.width * int64_t{sizeof(float)}, RowIndex{t.index.data(), true}, count,
                      reinterpret_cast<char*>(out.data() + column),
                      total_width * int64_t{sizeof(float)}});
    column += t.width;
  }
  const BadIndex bad = gather_row_groups(groups.data(), static_cast<int64_t>(groups.size()));
  EXPECT_EQ(bad.group, -1);
  column = 0;
  for (const Table& t : tables) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t d = 0; d < t.width; ++d) {
        ASSERT_EQ(out[j * total_width + column + d], t.values[t.index[j] * t.width + d]);
      }
    }
    column += t.width;
  }
}

TEST(RowGather, GathersSeveralTablesIntoStridedRows) {
  check_row_gather({{5, 3, 7}, {9, 1, 7}, {2, 4, 7}});
  check_row_gather({{5, 3, 0}, {1, 2, 0}});
  check_row_gather({{7, 0, 4}, {3, 2, 4}});  // rows of zero width
  ScopedThreads threads(4);
  check_row_gather({{3000, 16, 50000}, {10, 8, 50000}});
}

TEST(RowGather, ReportsTheFirstBadIndexByGroupAndPosition) {
  ScopedThreads threads(4);
  std::vector<Table> tables = random_tables({{100, 4, 30000}, {50, 2, 40000}});
  tables[1].index[25000] = 50;
  tables[1].index[30000] = -1;
  std::vector<float> out0(30000 * 4), out1(40000 * 2);
  std::vector<RowGather> groups;
  float* outs[] = {out0.data(), out1.data()};
  for (int g = 0; g < 2; ++g) {
    const Table& t = tables[g];
    const int64_t row_bytes = t.width * int64_t{sizeof(float)};
    groups.push_back({reinterpret_cast<const char*>(t.values.data()), t.rows, row_bytes,
                      RowIndex{t.index.data(), true}, static_cast<int64_t>(t.index.size()),
                      reinterpret_cast<char*>(outs[g]), row_bytes});
  }
  const BadIndex bad = gather_row_groups(groups.data(), 2);
  EXPECT_EQ(bad.group, 1);
  EXPECT_EQ(bad.position, 25000);
}

template <typename scalar_t>
void check_scatter_add_rows(int64_t rows, int64_t width, int64_t count, int64_t grad_stride,
                            double tolerance) {
  const std::vector<int32_t> index = random_integers<int32_t>(count, 0, rows - 1);
  std::vector<scalar_t> grad(count * grad_stride);
  for (int64_t e = 0; e < count * grad_stride; ++e) {
    grad[e] = static_cast<scalar_t>(static_cast<float>((e * 37) % 101) / 16.0f - 3.0f);
  }
  std::vector<double> expected(rows * width, 0.0);
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t d = 0; d < width; ++d) {
      expected[index[j] * width + d] +=
          static_cast<double>(static_cast<float>(grad[j * grad_stride + d]));
    }
  }
  std::vector<scalar_t> out(rows * width, static_cast<scalar_t>(99.0f));
  EXPECT_EQ(
      (scatter_add_rows<accumulate_t<scalar_t>>(
          grad.data(), grad_stride, RowIndex{index.data(), false}, count, rows, width, out.data())),
      -1);
  for (int64_t e = 0; e < rows * width; ++e) {
    ASSERT_NEAR(static_cast<double>(static_cast<float>(out[e])), expected[e],
                tolerance * (1.0 + std::abs(expected[e])))
        << "element " << e;
  }
}

TEST(ScatterAddRows, SerialAndOwnedRangesMatchScalarLoop) {
  check_scatter_add_rows<float>(10, 3, 40, 3, 1e-6);
  check_scatter_add_rows<double>(1, 5, 17, 8, 1e-12);  // one row, strided gradient rows
  check_scatter_add_rows<float>(6, 2, 0, 2, 0);        // nothing to add: zeros
  ScopedThreads threads(4);
  check_scatter_add_rows<float>(5000, 16, 60000, 16, 1e-5);
  check_scatter_add_rows<double>(37, 8, 80000, 24, 1e-12);  // hot rows, permuted layout
  check_scatter_add_rows<Fp16>(3000, 8, 50000, 8, 2e-3);
  check_scatter_add_rows<Bf16>(200000, 2, 20000, 2, 1e-2);  // a large table, few rows touched
}

TEST(ScatterAddRows, ReportsTheFirstBadIndex) {
  ScopedThreads threads(4);
  for (const int64_t rows : {int64_t{1}, int64_t{10}, int64_t{500000}}) {
    const int64_t count = 100000;
    std::vector<int64_t> index = random_integers<int64_t>(count, 0, rows - 1);
    index[70000] = rows;
    index[90000] = -1;
    const std::vector<float> grad(count * 2, 1.0f);
    std::vector<float> out(rows * 2);
    EXPECT_EQ(scatter_add_rows<float>(grad.data(), 2, RowIndex{index.data(), true}, count, rows, 2,
                                      out.data()),
              70000);
  }
}

}  // namespace
}  // namespace recops::gather::kernels
