// Relative attention bias kernels (hstu/kernels/relative_bias.h, relative_bias_math.h)
// against scalar loops written here from docs/ops.md section 3: the log bucket of a time delta,
// the bucket matrix of dense and jagged sequences (with and without the query-time shift), the
// bias lookup and the tables' gradients, for float, double and Bf16 tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/hstu/kernels/relative_bias.h"

namespace recops::attention::kernels {
namespace {

int64_t reference_bucket(double magnitude, double divisor, int64_t num_buckets) {
  const double q = std::floor(std::log(std::max(magnitude, 1.0)) / divisor);
  return std::min<int64_t>(static_cast<int64_t>(q), num_buckets);
}

TEST(RelativeBias, LogBucketizerMatchesTheFormula) {
  for (const auto& [divisor, num_buckets] :
       {std::pair<double, int32_t>{0.301, 128}, {1.0, 10}, {0.05, 400}, {1e-4, 50}, {2.0, 0}}) {
    const LogBucketizer bucketizer(divisor, num_buckets);
    const auto bucket = bucketizer.view();
    std::mt19937_64 rng(7);
    for (int i = 0; i < 20000; ++i) {
      const double m =
          i < 2000 ? double(i) : std::exp(std::uniform_real_distribution<>(0, 45)(rng));
      ASSERT_EQ(bucket(m), reference_bucket(m, divisor, num_buckets)) << m << " " << divisor;
    }
    EXPECT_EQ(bucket(std::nan("")), 0);
    EXPECT_EQ(bucket(INFINITY), num_buckets);
  }
}

// A batch of B sequences of timestamps, dense [B, N] or jagged with offsets.
struct TimestampBatch {
  int64_t batch = 3, n = 70;
  std::vector<int64_t> offsets = {0, 70, 75, 150};  // jagged: lengths 70, 5, 75 (> N: truncated)
  std::vector<int64_t> ts;

  explicit TimestampBatch(bool jagged) {
    std::mt19937 rng(5);
    const int64_t total = jagged ? offsets.back() : batch * n;
    ts.resize(total);
    int64_t t = 100;
    for (auto& x : ts) x = (t += std::uniform_int_distribution<int>(0, 3000)(rng));
    if (!jagged) offsets.clear();
  }
  Lengths lengths() const { return {offsets.empty() ? nullptr : offsets.data(), n}; }
};

class BucketMatrix : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(BucketMatrix, LookupAndGradientsMatchScalarLoops) {
  const auto [jagged, shift] = GetParam();
  const TimestampBatch seqs(jagged);
  const Lengths lengths = seqs.lengths();
  const int64_t B = seqs.batch, N = seqs.n, nb = 20;
  const double divisor = 0.7;
  const LogBucketizer bucketizer(divisor, static_cast<int32_t>(nb));
  std::vector<int32_t> buckets(B * N * N, -1);
  compute_buckets(seqs.ts.data(), lengths, B, shift, bucketizer, buckets.data());
  std::vector<int32_t> want(B * N * N, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = lengths.start(b), length = lengths.length(b), valid = lengths.valid(b);
    for (int64_t i = 0; i < valid; ++i) {
      const int64_t qi = shift && i + 1 < length ? i + 1 : i;
      for (int64_t j = 0; j < valid; ++j) {
        const double dt = std::abs(double(seqs.ts[start + qi]) - double(seqs.ts[start + j]));
        want[(b * N + i) * N + j] = static_cast<int32_t>(reference_bucket(dt, divisor, nb));
      }
    }
  }
  ASSERT_EQ(buckets, want);

  // Two stacked layers of tables; double and float lookups and gradients.
  const BiasShape shape{2, B, N, nb};
  std::mt19937 rng(9);
  std::normal_distribution<double> dist;
  std::vector<double> ts_w(2 * (nb + 1)), pos_w(2 * (2 * N - 1)), grad(2 * B * N * N);
  for (auto* v : {&ts_w, &pos_w, &grad}) {
    for (double& x : *v) x = dist(rng);
  }
  std::vector<Bf16> grad_b;
  for (double x : grad) grad_b.push_back(Bf16(float(x)));
  std::vector<double> out(grad.size()), bias_ref(grad.size(), 0.0);
  std::vector<double> dts(ts_w.size(), 0.0), dpos(pos_w.size(), 0.0), dts_b(ts_w.size(), 0.0);
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t valid = lengths.valid(b);
      for (int64_t i = 0; i < valid; ++i) {
        for (int64_t j = 0; j < valid; ++j) {
          const int64_t at = shape.row_offset(l, b, i) + j;
          const int32_t k = want[(b * N + i) * N + j];
          bias_ref[at] = ts_w[l * (nb + 1) + k] + pos_w[l * (2 * N - 1) + N - 1 + j - i];
          dts[l * (nb + 1) + k] += grad[at];
          dts_b[l * (nb + 1) + k] += float(grad_b[at]);
          dpos[l * (2 * N - 1) + N - 1 + j - i] += grad[at];
        }
      }
    }
  }
  lookup<double>(buckets.data(), lengths, ts_w.data(), pos_w.data(), shape, out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], bias_ref[i]) << i;
  std::vector<double> gts(ts_w.size()), gpos(pos_w.size());
  ASSERT_EQ(relative_bias_backward<double>(grad.data(), shape, lengths, buckets.data(), gts.data(),
                                           gpos.data()),
            -1);
  for (size_t i = 0; i < gts.size(); ++i) ASSERT_NEAR(gts[i], dts[i], 1e-9) << i;
  for (size_t i = 0; i < gpos.size(); ++i) ASSERT_NEAR(gpos[i], dpos[i], 1e-9) << i;
  // Both passes from the timestamps (uint8 scratch buckets here, int32 past 255 buckets).
  std::vector<double> gts2(ts_w.size()), gpos2(pos_w.size());
  ASSERT_EQ(
      relative_bias_backward_from_timestamps<double>(grad.data(), shape, lengths, seqs.ts.data(),
                                                     shift, bucketizer, gts2.data(), gpos2.data()),
      -1);
  EXPECT_EQ(gts2, gts);
  EXPECT_EQ(gpos2, gpos);

  // Bf16 tables: lookups add in float and round once; gradients accumulate in float.
  std::vector<Bf16> ts_b, pos_b;
  for (double x : ts_w) ts_b.push_back(Bf16(float(x)));
  for (double x : pos_w) pos_b.push_back(Bf16(float(x)));
  std::vector<Bf16> out_b(grad.size());
  lookup<float>(buckets.data(), lengths, ts_b.data(), pos_b.data(), shape, out_b.data());
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          const int64_t at = shape.row_offset(l, b, i) + j;
          const bool inside = i < lengths.valid(b) && j < lengths.valid(b);
          const float sum = inside ? float(ts_b[l * (nb + 1) + want[(b * N + i) * N + j]]) +
                                         float(pos_b[l * (2 * N - 1) + N - 1 + j - i])
                                   : 0.0f;
          ASSERT_EQ(out_b[at].bits, Bf16(sum).bits) << at;
        }
      }
    }
  }
  std::vector<Bf16> gts_b(ts_w.size()), gpos_b(pos_w.size());
  ASSERT_EQ(relative_bias_backward<float>(grad_b.data(), shape, lengths, buckets.data(),
                                          gts_b.data(), gpos_b.data()),
            -1);
  for (size_t i = 0; i < gts_b.size(); ++i) {
    // The float sum of the Bf16 gradients, rounded to Bf16 once.
    EXPECT_NEAR(float(gts_b[i]), dts_b[i], 1e-3 + std::abs(dts_b[i]) / 128) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sequences, BucketMatrix,
                         ::testing::Values(std::pair{false, false}, std::pair{false, true},
                                           std::pair{true, false}, std::pair{true, true}),
                         [](const ::testing::TestParamInfo<std::pair<bool, bool>>& info) {
                           return std::string(info.param.first ? "Jagged" : "Dense") +
                                  (info.param.second ? "Shifted" : "Unshifted");
                         });

TEST(RelativeBias, BackwardReportsTheFirstBadBucket) {
  const int64_t N = 4;
  const Lengths lengths{nullptr, N};
  std::vector<int32_t> buckets(N * N, 1);
  buckets[6] = 9;  // outside [0, 3]
  std::vector<float> grad(N * N, 1.0f), gts(4);
  EXPECT_EQ(relative_bias_backward<float>(grad.data(), BiasShape{1, 1, N, 3}, lengths,
                                          buckets.data(), gts.data(), static_cast<float*>(nullptr)),
            6);
}

TEST(RelativeBias, PositionBiasRowsAreWindowsOfTheTable) {
  const int64_t n = 33;
  std::vector<float> pos_w(2 * (2 * n - 1)), out(2 * n * n);
  for (size_t i = 0; i < pos_w.size(); ++i) pos_w[i] = float(i);
  position_bias(pos_w.data(), 2, n, out.data());
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(out[(l * n + i) * n + j], pos_w[l * (2 * n - 1) + n - 1 + j - i]);
      }
    }
  }
}

}  // namespace
}  // namespace recops::attention::kernels
