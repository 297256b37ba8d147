// DeBERTa disentangled attention (deberta/kernels/disentangled_attention.h) with both position
// terms (c2p + p2c) against a scalar softmax attention in double written here from docs/ops.md
// section 6, forward and backward; and the relative-position log buckets
// (kernels/deberta_positions.h) against HF's formula evaluated step by step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/deberta/kernels/deberta_positions.h"
#include "recops/deberta/kernels/disentangled_attention.h"

namespace recops::attention::kernels {
namespace {

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

std::vector<double> sum_parts(const std::vector<double>& parts, size_t n) {
  std::vector<double> out(n, 0.0);
  for (size_t p = 0; p < parts.size() / n; ++p) {
    for (size_t i = 0; i < n; ++i) out[i] += parts[p * n + i];
  }
  return out;
}

struct Shape {
  int64_t batch, heads, q_len, k_len, d, span;
};

class DisentangledKernel : public ::testing::TestWithParam<Shape> {};

// Lengths past one query block (64) and one key tile (256), position tables that clamp.
TEST_P(DisentangledKernel, ForwardAndBackwardMatchScalarSoftmax) {
  const Shape sh = GetParam();
  const int64_t B = sh.batch, H = sh.heads, Sq = sh.q_len, Sk = sh.k_len, D = sh.d;
  const int64_t P = 2 * sh.span;
  const double scale = 1.0 / std::sqrt(3.0 * D);
  const auto q = random_values(B * H * Sq * D, 1), k = random_values(B * H * Sk * D, 2);
  const auto v = random_values(B * H * Sk * D, 3), pk = random_values(P * H * D, 4);
  const auto pq = random_values(P * H * D, 5), go = random_values(B * H * Sq * D, 6);
  // Identity positions: d(i, j) = clamp(i - j + span, 0, 2 span - 1).
  const auto position = [&](int64_t i, int64_t j) {
    return std::clamp<int64_t>(i - j + sh.span, 0, P - 1);
  };

  std::vector<double> out(B * H * Sq * D, 0.0), lse_ref(B * H * Sq), dq(q.size(), 0.0),
      dk(k.size(), 0.0), dv(v.size(), 0.0), dpk(pk.size(), 0.0), dpq(pq.size(), 0.0),
      d_rows(B * H * Sq);
  for (int64_t u = 0; u < B * H; ++u) {
    const int64_t h = u % H;
    const double* qu = &q[u * Sq * D];
    const double* ku = &k[u * Sk * D];
    const double* vu = &v[u * Sk * D];
    for (int64_t i = 0; i < Sq; ++i) {
      std::vector<double> a(Sk);
      for (int64_t j = 0; j < Sk; ++j) {
        const double* pkd = &pk[(position(i, j) * H + h) * D];
        const double* pqd = &pq[(position(i, j) * H + h) * D];
        double s = 0;
        for (int64_t c = 0; c < D; ++c) {
          s += qu[i * D + c] * (ku[j * D + c] + pkd[c]) + ku[j * D + c] * pqd[c];
        }
        a[j] = scale * s;
      }
      const double m = *std::max_element(a.begin(), a.end());
      double sum = 0;
      for (double x : a) sum += std::exp(x - m);
      lse_ref[u * Sq + i] = m + std::log(sum);
      std::vector<double> p(Sk), dp(Sk);
      double drow = 0;
      for (int64_t j = 0; j < Sk; ++j) {
        p[j] = std::exp(a[j] - lse_ref[u * Sq + i]);
        double g = 0;
        for (int64_t c = 0; c < D; ++c) {
          out[(u * Sq + i) * D + c] += p[j] * vu[j * D + c];
          g += go[(u * Sq + i) * D + c] * vu[j * D + c];
        }
        dp[j] = g;
        drow += p[j] * g;
      }
      d_rows[u * Sq + i] = drow;
      for (int64_t j = 0; j < Sk; ++j) {
        const double ds = scale * p[j] * (dp[j] - drow);
        const int64_t d = position(i, j);
        for (int64_t c = 0; c < D; ++c) {
          dq[(u * Sq + i) * D + c] += ds * (ku[j * D + c] + pk[(d * H + h) * D + c]);
          dk[(u * Sk + j) * D + c] += ds * (qu[i * D + c] + pq[(d * H + h) * D + c]);
          dv[(u * Sk + j) * D + c] += p[j] * go[(u * Sq + i) * D + c];
          dpk[(d * H + h) * D + c] += ds * qu[i * D + c];
          dpq[(d * H + h) * D + c] += ds * ku[j * D + c];
        }
      }
    }
  }

  std::vector<int32_t> delta(Sq + Sk - 1);
  relative_position_index(Sq, Sk, -1, -1, sh.span, delta.data());
  const std::vector<int64_t> q_extent(B, Sq), k_extent(B, Sk);
  DisentangledProblem<double> problem;
  problem.shape = DisentangledShape<double>{B, H, Sq, Sk, D, D, P, scale, true, true};
  problem.q = q.data();
  problem.k = k.data();
  problem.v = v.data();
  problem.pos_key = pk.data();
  problem.pos_query = pq.data();
  problem.delta = delta.data();
  problem.mask.q_extent = q_extent.data();
  problem.mask.k_extent = k_extent.data();
  const int64_t chunks = 2, threads = max_threads();
  std::vector<double> got(out.size(), 0.0),
      lse(lse_ref.size(), std::numeric_limits<double>::infinity());
  disentangled_forward(problem, chunks, DisentangledOutputs<double>{got.data(), lse.data()});
  expect_near_all(got, out, 1e-10, "out");
  expect_near_all(lse, lse_ref, 1e-10, "lse");

  std::vector<double> gdq(dq.size(), 0.0), gdk(chunks * dk.size(), 0.0),
      gdv(chunks * dv.size(), 0.0), gpk(threads * pk.size(), 0.0), gpq(threads * pq.size(), 0.0);
  const DisentangledBackwardInputs<double> in{go.data(), nullptr, lse.data(), d_rows.data()};
  disentangled_backward(
      problem, chunks, in,
      DisentangledGrads<double>{gdq.data(), gdk.data(), gdv.data(), gpk.data(), gpq.data()});
  expect_near_all(gdq, dq, 1e-9, "dq");
  expect_near_all(sum_parts(gdk, dk.size()), dk, 1e-9, "dk");
  expect_near_all(sum_parts(gdv, dv.size()), dv, 1e-9, "dv");
  expect_near_all(sum_parts(gpk, pk.size()), dpk, 1e-9, "d pos_key");
  expect_near_all(sum_parts(gpq, pq.size()), dpq, 1e-9, "d pos_query");

  // fp32 on the run-time ISA variant's tiles, within fp32 rounding.
  const std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
      pkf(pk.begin(), pk.end()), pqf(pq.begin(), pq.end());
  DisentangledProblem<float> pf;
  pf.shape = DisentangledShape<float>{B, H, Sq, Sk, D, D, P, float(scale), true, true};
  pf.q = qf.data();
  pf.k = kf.data();
  pf.v = vf.data();
  pf.pos_key = pkf.data();
  pf.pos_query = pqf.data();
  pf.delta = delta.data();
  pf.mask = problem.mask;
  std::vector<float> got_f(out.size(), 0.0f), lse_f(lse.size(), INFINITY);
  disentangled_forward(pf, chunks, DisentangledOutputs<float>{got_f.data(), lse_f.data()});
  expect_near_all(std::vector<double>(got_f.begin(), got_f.end()), out, 1e-4, "fp32 out");
}

INSTANTIATE_TEST_SUITE_P(Shapes, DisentangledKernel,
                         ::testing::Values(Shape{1, 2, 7, 5, 4, 3}, Shape{2, 1, 70, 300, 8, 16},
                                           Shape{1, 1, 130, 40, 16, 80}));

// HF's make_log_bucket_position evaluated step by step as torch does for int64 relative
// positions: float32 division, logarithms (here in double, then rounded), ceil.
int64_t hf_log_bucket(int64_t rel, int64_t bucket_size, int64_t max_position) {
  const int64_t mid = bucket_size / 2;
  const int64_t abs_pos = (rel < mid && rel > -mid) ? mid - 1 : std::llabs(rel);
  if (abs_pos <= mid) return rel;
  const float ratio = float(abs_pos) / float(mid);
  const float log_ratio = float(std::log(double(ratio)));
  const float log_base = float(std::log(double(float(double(max_position - 1) / double(mid)))));
  const float log_pos = std::ceil(log_ratio / log_base * float(mid - 1)) + float(mid);
  return static_cast<int64_t>(log_pos * float(rel > 0 ? 1 : -1));
}

TEST(DebertaPositions, LogBucketsMatchHfFormula) {
  for (const auto& [bucket_size, max_position] :
       {std::pair<int64_t, int64_t>{256, 512}, {8, 24}, {16, 48}, {32, 128}, {2, 4}, {7, 40}}) {
    for (int64_t rel = -3000; rel <= 3000; ++rel) {
      ASSERT_EQ(log_bucket_position(rel, bucket_size, max_position),
                hf_log_bucket(rel, bucket_size, max_position))
          << rel << " " << bucket_size << " " << max_position;
    }
  }
  // Known values of HF's default bucketing: identity up to 128, 255 at 511, monotone, bounded.
  EXPECT_EQ(log_bucket_position(128, 256, 512), 128);
  EXPECT_EQ(log_bucket_position(-128, 256, 512), -128);
  EXPECT_EQ(log_bucket_position(511, 256, 512), 255);
  EXPECT_EQ(log_bucket_position(-511, 256, 512), -255);
  int64_t previous = 0;
  for (int64_t rel = 0; rel < 5000; ++rel) {
    const int64_t b = log_bucket_position(rel, 256, 512);
    EXPECT_GE(b, previous);
    previous = b;
  }
  std::vector<int64_t> rel = {-600, -5, 0, 5, 600}, got(rel.size());
  log_bucket_positions(rel.data(), 5, 8, 24, got.data());
  for (size_t i = 0; i < rel.size(); ++i) EXPECT_EQ(got[i], hf_log_bucket(rel[i], 8, 24));
}

TEST(DebertaPositions, RelativePositionIndexClampsBuckets) {
  const int64_t q_len = 9, k_len = 13, span = 4;
  for (const auto& [bucket_size, max_position] : {std::pair<int64_t, int64_t>{-1, -1}, {4, 12}}) {
    std::vector<int32_t> delta(q_len + k_len - 1);
    relative_position_index(q_len, k_len, bucket_size, max_position, span, delta.data());
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t j = 0; j < k_len; ++j) {
        const int64_t d = bucket_size > 0 ? hf_log_bucket(i - j, bucket_size, max_position) : i - j;
        EXPECT_EQ(delta[q_len - 1 - i + j], std::clamp<int64_t>(d + span, 0, 2 * span - 1));
      }
    }
  }
}

}  // namespace
}  // namespace recops::attention::kernels
