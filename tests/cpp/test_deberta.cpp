// DeBERTa disentangled attention (deberta/kernels/disentangled_attention.h) with both position
// terms (c2p + p2c) against a scalar softmax attention in double written here from docs/ops.md
// section 6, forward and backward; its bf16-operand kernel (disentangled_attention_bf16.h)
// against the fp32 kernel on the same bf16 values; and the relative-position log buckets
// (kernels/deberta_positions.h) against HF's formula evaluated step by step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/deberta/kernels/deberta_positions.h"
#include "recops/deberta/kernels/disentangled_attention.h"
#include "recops/deberta/kernels/disentangled_attention_bf16.h"
#include "test_util.h"

namespace recops::attention::kernels {
namespace {

using test::expect_near_all;
using test::sum_parts;

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
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
      dk(k.size(), 0.0), dv(v.size(), 0.0), dpk(pk.size(), 0.0), dpq(pq.size(), 0.0);
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
  const DisentangledBackwardInputs<double> in{
      .grad_out = go.data(), .out = got.data(), .lse = lse.data()};
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

// The bf16-operand kernel against the fp32 kernel fed the same (bf16) values: outputs and every
// gradient within bf16 rounding of the products' operands. Shapes with head dims, query blocks,
// key tiles and position tables off the 16-value granule (padded), several key tiles, each
// position-term subset, a dense mask with a fully masked row, dropout and probability gradients.
struct Bf16Case {
  int64_t batch, heads, q_len, k_len, dqk, dv, span;
  bool c2p, p2c, masked;
  double dropout_p;
};

class DisentangledBf16Kernel : public ::testing::TestWithParam<Bf16Case> {};

// Bf16 values and the same values as float.
struct Bf16Values {
  std::vector<Bf16> bits;
  std::vector<float> values;
  Bf16Values(int64_t n, uint32_t seed) : bits(n), values(n) {
    const auto x = random_values(n, seed);
    for (int64_t i = 0; i < n; ++i) {
      bits[i] = Bf16(static_cast<float>(x[i]));
      values[i] = static_cast<float>(bits[i]);
    }
  }
};

// max |got - want| <= tol * max |want| (and the same NaN-free shape).
void expect_close_to_scale(const std::vector<float>& got, const std::vector<float>& want,
                           double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    scale = std::max(scale, std::abs(double(want[i])));
    err = std::max(err, std::abs(double(got[i]) - double(want[i])));
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-6)) << what << " (scale " << scale << ")";
}

std::vector<float> bf16_to_float(const std::vector<Bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

TEST_P(DisentangledBf16Kernel, MatchesFp32KernelOnBf16Values) {
  const Bf16Case c = GetParam();
  const int64_t B = c.batch, H = c.heads, Sq = c.q_len, Sk = c.k_len, P = 2 * c.span;
  const Bf16Values q(B * H * Sq * c.dqk, 11), k(B * H * Sk * c.dqk, 12), v(B * H * Sk * c.dv, 13),
      pk(P * H * c.dqk, 14), pq(P * H * c.dqk, 15), go(B * H * Sq * c.dv, 16),
      gp(B * H * Sq * Sk, 17);
  std::vector<int32_t> delta(Sq + position_index_keys(Sk) - 1);
  relative_position_index(Sq, position_index_keys(Sk), -1, -1, c.span, delta.data());
  // Batch row 0 keeps every pair but row 3 (which sees no key); the others keep about 70%.
  std::vector<uint8_t> keep(B * Sq * Sk, 1);
  std::mt19937 rng(5);
  for (int64_t b = 1; c.masked && b < B; ++b) {
    for (int64_t i = 0; i < Sq * Sk; ++i) keep[b * Sq * Sk + i] = rng() % 10 < 7;
  }
  if (c.masked) std::fill(keep.begin() + 3 * Sk, keep.begin() + 4 * Sk, uint8_t(0));
  const std::vector<int64_t> q_extent(B, Sq), k_extent(B, Sk);
  DisentangledMask mask;
  mask.dense = c.masked ? keep.data() : nullptr;
  mask.q_extent = q_extent.data();
  mask.k_extent = k_extent.data();
  const float scale = 1.0f / std::sqrt(float(c.dqk) * 3);
  const DisentangledShape<float> shape{B, H, Sq, Sk, c.dqk, c.dv, P, scale, c.c2p, c.p2c};
  const auto problem = [&](auto tag, const auto& pick) {
    DisentangledProblem<typename decltype(tag)::type> p;
    p.shape = shape;
    p.q = pick(q);
    p.k = pick(k);
    p.v = pick(v);
    p.pos_key = c.c2p ? pick(pk) : nullptr;
    p.pos_query = c.p2c ? pick(pq) : nullptr;
    p.delta = c.c2p || c.p2c ? delta.data() : nullptr;
    p.mask = mask;
    p.dropout_p = float(c.dropout_p);
    p.seed = 99;
    return p;
  };
  const auto fp32 = problem(TypeTag<float>{}, [](const Bf16Values& x) { return x.values.data(); });
  const auto bf16 = problem(TypeTag<Bf16>{}, [](const Bf16Values& x) { return x.bits.data(); });
  const int64_t chunks = 2, threads = max_threads(), units = B * H;

  std::vector<float> out(units * Sq * c.dv, 0.0f), lse(units * Sq, INFINITY),
      probs(units * Sq * Sk, 0.0f);
  disentangled_forward(fp32, chunks,
                       DisentangledOutputs<float>{out.data(), lse.data(), probs.data()});
  std::vector<Bf16> out_b(out.size(), Bf16(0.0f));
  std::vector<float> lse_b(lse.size(), INFINITY), probs_b(probs.size(), 0.0f);
  disentangled_forward(bf16, chunks,
                       DisentangledOutputs<Bf16>{out_b.data(), lse_b.data(), probs_b.data()});
  expect_close_to_scale(bf16_to_float(out_b), out, 1e-2, "out");
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_EQ(std::isinf(lse_b[i]), std::isinf(lse[i])) << "lse at " << i;
    if (!std::isinf(lse[i])) {
      ASSERT_NEAR(lse_b[i], lse[i], 1e-2 * (1 + std::abs(lse[i]))) << "lse at " << i;
    }
  }
  expect_close_to_scale(probs_b, probs, 1e-2, "probs");

  // Backward from the bf16 forward's results (as the adapter passes them), on both kernels.
  std::vector<float> out_f = bf16_to_float(out_b), probs_f(probs_b.size());
  std::vector<Bf16> probs_bits(probs_b.size());
  for (size_t i = 0; i < probs_b.size(); ++i) {
    probs_bits[i] = Bf16(probs_b[i]);
    probs_f[i] = static_cast<float>(probs_bits[i]);
  }
  const auto grads = [&](auto tag, const auto& problem_of, const auto& in) {
    using E = typename decltype(tag)::type;
    std::vector<E> dq(q.values.size(), E(0.0f));
    std::vector<float> dk(chunks * k.values.size(), 0.0f), dv(chunks * v.values.size(), 0.0f),
        dpk(threads * pk.values.size(), 0.0f), dpq(threads * pq.values.size(), 0.0f);
    disentangled_backward(
        problem_of, chunks, in,
        DisentangledGrads<E>{dq.data(), dk.data(), dv.data(), dpk.data(), dpq.data()});
    std::vector<float> dq_f(dq.size());
    for (size_t i = 0; i < dq.size(); ++i) dq_f[i] = static_cast<float>(dq[i]);
    return std::vector<std::vector<float>>{
        dq_f, sum_parts(dk, k.values.size()), sum_parts(dv, v.values.size()),
        sum_parts(dpk, pk.values.size()), sum_parts(dpq, pq.values.size())};
  };
  const auto want = grads(TypeTag<float>{}, fp32,
                          DisentangledBackwardInputs<float>{.grad_out = go.values.data(),
                                                            .grad_probs = gp.values.data(),
                                                            .probs = probs_f.data(),
                                                            .out = out_f.data(),
                                                            .lse = lse_b.data()});
  const auto got = grads(TypeTag<Bf16>{}, bf16,
                         DisentangledBackwardInputs<Bf16>{.grad_out = go.bits.data(),
                                                          .grad_probs = gp.bits.data(),
                                                          .probs = probs_bits.data(),
                                                          .out = out_b.data(),
                                                          .lse = lse_b.data()});
  const char* names[] = {"dq", "dk", "dv", "d pos_key", "d pos_query"};
  for (int i = 0; i < 5; ++i) expect_close_to_scale(got[i], want[i], 1.5e-2, names[i]);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DisentangledBf16Kernel,
    ::testing::Values(Bf16Case{1, 2, 7, 5, 4, 3, 3, true, true, false, 0.0},
                      Bf16Case{2, 1, 70, 300, 8, 5, 16, true, true, true, 0.0},
                      Bf16Case{1, 1, 130, 40, 16, 16, 80, true, false, false, 0.0},
                      Bf16Case{2, 2, 33, 47, 20, 12, 9, false, true, true, 0.3},
                      Bf16Case{1, 1, 64, 272, 32, 32, 8, false, false, false, 0.0}));

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
