// TBE kernels (csrc/recops/embedding/kernels) against scalar loops: pooled lookup (sum, mean,
// none; weighted or not; fp32 / fp16 / bf16 tables and outputs), the per-sample-weight gradient,
// and the fused exact update of every optimizer, where occurrences of one row (within a bag,
// across bags and across the features sharing a table) are summed before one step. Then every
// instruction-set variant of the entry-point table (variant_{baseline,avx2,avx512}.cpp) against
// the baseline one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/embedding/kernels/tbe.h"
#include "test_util.h"

namespace recops::embedding::kernels {
namespace {

using test::random_floats;
using test::random_integers;

constexpr float kNoClip = std::numeric_limits<float>::infinity();

// Three features on two tables: features 0 and 1 share table A (10 rows), feature 2 has table B
// (7 rows). B bags per feature with empty bags; few rows for many indices, so rows repeat within
// bags, across bags and across the two features of A.
struct Batch {
  std::vector<int32_t> D_offsets;
  std::vector<int64_t> weights_offsets, rows;
  int64_t B = 4;
  int64_t num_weights = 0;
  std::vector<int64_t> indices, offsets;
  std::vector<int32_t> indices32, offsets32;
  std::vector<float> per_sample_weights;
  Pooling pooling = Pooling::kSum;
  IndexKind index_kind = IndexKind::kInt64;

  Batch(Pooling pooling_mode, bool weighted, IndexKind kind = IndexKind::kInt64)
      : pooling(pooling_mode), index_kind(kind) {
    // NONE pooling needs one dim for all features; otherwise table B's 37 columns take every
    // column-block width (128 / 64 / 32, 16, 4, 1) of the variants.
    const int64_t dim_a = 4, dim_b = pooling == Pooling::kNone ? 4 : 37;
    D_offsets = {0, static_cast<int32_t>(dim_a), static_cast<int32_t>(2 * dim_a),
                 static_cast<int32_t>(2 * dim_a + dim_b)};
    weights_offsets = {0, 0, 10 * dim_a};
    rows = {10, 10, 7};
    num_weights = 10 * dim_a + 7 * dim_b;
    const std::vector<int64_t> lengths = {2, 0, 3, 1, 4, 1, 0, 2, 3, 3, 0, 1};
    offsets = test::offsets_of(lengths);
    for (int64_t bag = 0; bag < 3 * B; ++bag) {
      const int64_t t = bag / B;
      for (int64_t p = offsets[bag]; p < offsets[bag + 1]; ++p) {
        indices.push_back(random_integers<int64_t>(1, 0, rows[t] - 1, 100 + p)[0]);
      }
    }
    indices[1] = indices[0];  // a repeat inside a bag
    indices.assign(indices.begin(), indices.end());
    indices32.assign(indices.begin(), indices.end());
    offsets32.assign(offsets.begin(), offsets.end());
    if (weighted) per_sample_weights = random_floats(num_indices(), 7);
  }

  int64_t T() const { return 3; }
  int64_t num_indices() const { return static_cast<int64_t>(indices.size()); }
  int64_t D(int64_t t) const { return D_offsets[t + 1] - D_offsets[t]; }
  int64_t total_D() const { return D_offsets.back(); }
  int64_t max_D() const { return std::max(D(0), D(2)); }
  bool pooled() const { return pooling != Pooling::kNone; }
  int64_t out_rows() const { return pooled() ? B : num_indices(); }
  int64_t out_cols() const { return pooled() ? total_D() : max_D(); }
  int64_t feature_of(int64_t p) const {
    int64_t bag = 0;
    while (offsets[bag + 1] <= p) ++bag;
    return bag / B;
  }
  int64_t bag_of(int64_t p) const {
    int64_t bag = 0;
    while (offsets[bag + 1] <= p) ++bag;
    return bag;
  }
  float sample_weight(int64_t p) const {
    return per_sample_weights.empty() ? 1.0f : per_sample_weights[p];
  }
  float pooling_scale(int64_t bag) const {
    const int64_t length = offsets[bag + 1] - offsets[bag];
    return pooling == Pooling::kMean && length > 0 ? 1.0f / static_cast<float>(length) : 1.0f;
  }
  // The first element of the row of position p in the flat weights.
  int64_t row_begin(int64_t p) const {
    const int64_t t = feature_of(p);
    return weights_offsets[t] + indices[p] * D(t);
  }
  // Where position p's bag (or p itself, unpooled) reads grad_output / writes the output.
  int64_t output_begin(int64_t p) const {
    const int64_t bag = bag_of(p);
    return pooled() ? (bag % B) * total_D() + D_offsets[bag / B] : p * max_D();
  }

  FeatureLayout layout() const {
    FeatureLayout l;
    l.num_features = T();
    l.batch_size = B;
    l.total_D = total_D();
    l.max_D = max_D();
    l.D_offsets = D_offsets.data();
    l.weights_offsets = weights_offsets.data();
    l.rows = rows.data();
    return l;
  }
  Bags bags() const {
    Bags b;
    b.index_kind = index_kind;
    b.indices = index_kind == IndexKind::kInt32 ? static_cast<const void*>(indices32.data())
                                                : static_cast<const void*>(indices.data());
    b.offsets = index_kind == IndexKind::kInt32 ? static_cast<const void*>(offsets32.data())
                                                : static_cast<const void*>(offsets.data());
    b.num_indices = num_indices();
    b.per_sample_weights = per_sample_weights.empty() ? nullptr : per_sample_weights.data();
    b.pooling = pooling;
    return b;
  }
};

template <typename T>
constexpr FloatKind kind_of() {
  return std::is_same_v<T, Fp16>   ? FloatKind::kHalf
         : std::is_same_v<T, Bf16> ? FloatKind::kBFloat16
                                   : FloatKind::kFloat;
}

// Relative precision of a stored type, for comparisons after rounding to it.
template <typename T>
constexpr double precision_of() {
  return std::is_same_v<T, Fp16> ? 1e-3 : std::is_same_v<T, Bf16> ? 8e-3 : 1e-6;
}

template <typename T>
std::vector<T> stored(const std::vector<float>& values) {
  std::vector<T> out;
  for (const float v : values) out.push_back(static_cast<T>(v));
  return out;
}

template <typename T>
std::vector<float> widened(const std::vector<T>& values) {
  std::vector<float> out;
  for (const T& v : values) out.push_back(static_cast<float>(v));
  return out;
}

void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double rtol,
                 const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], rtol * (1 + std::abs(expected[i]))) << what << " at " << i;
  }
}

// ---- Lookup.

std::vector<float> scalar_forward(const Batch& batch, const std::vector<float>& weights) {
  std::vector<float> out(batch.out_rows() * batch.out_cols(), 0.0f);
  for (int64_t p = 0; p < batch.num_indices(); ++p) {
    const int64_t t = batch.feature_of(p);
    const float scale = batch.sample_weight(p) * batch.pooling_scale(batch.bag_of(p));
    for (int64_t d = 0; d < batch.D(t); ++d) {
      out[batch.output_begin(p) + d] += scale * weights[batch.row_begin(p) + d];
    }
  }
  return out;
}

template <typename weight_t, typename out_t>
std::vector<out_t> run_forward(const TbeKernels& kernels, const Batch& batch,
                               const std::vector<weight_t>& weights, int64_t* bad = nullptr) {
  std::vector<out_t> out(batch.out_rows() * batch.out_cols(), static_cast<out_t>(0.0f));
  ForwardArgs args;
  args.layout = batch.layout();
  args.bags = batch.bags();
  args.weights_kind = kind_of<weight_t>();
  args.weights = weights.data();
  args.out_kind = kind_of<out_t>();
  args.out = out.data();
  const int64_t result = kernels.forward(args);
  if (bad != nullptr) {
    *bad = result;
  } else {
    EXPECT_EQ(result, -1);
  }
  return out;
}

template <typename weight_t, typename out_t>
void check_forward(const Batch& batch) {
  const std::vector<weight_t> weights = stored<weight_t>(random_floats(batch.num_weights, 3));
  const std::vector<out_t> out =
      run_forward<weight_t, out_t>(baseline::kTbeKernels, batch, weights);
  const std::vector<float> expected =
      widened(stored<out_t>(scalar_forward(batch, widened(weights))));
  expect_near(widened(out), expected, 4 * precision_of<out_t>(), "forward");
}

TEST(TbeForward, SumAndMeanPoolingWeightedOrNot) {
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (const bool weighted : {false, true}) {
      check_forward<float, float>(Batch(pooling, weighted));
      check_forward<float, float>(Batch(pooling, weighted, IndexKind::kInt32));
      check_forward<Fp16, float>(Batch(pooling, weighted));
      check_forward<Bf16, Bf16>(Batch(pooling, weighted));
      check_forward<float, Fp16>(Batch(pooling, weighted, IndexKind::kInt32));
    }
  }
}

TEST(TbeForward, ReportsTheFirstOutOfRangeIndex) {
  Batch batch(Pooling::kSum, false);
  batch.indices[5] = 10;  // position 5 is feature 0's, whose table has 10 rows
  batch.indices[15] = -1;
  const std::vector<float> weights = random_floats(batch.num_weights);
  int64_t bad = 0;
  run_forward<float, float>(baseline::kTbeKernels, batch, weights, &bad);
  EXPECT_EQ(bad, 5);
}

TEST(TbeForward, EmptyBatch) {
  Batch batch(Pooling::kSum, false);
  batch.B = 0;
  batch.offsets = {0};
  batch.indices.clear();
  const std::vector<float> weights = random_floats(batch.num_weights);
  EXPECT_TRUE((run_forward<float, float>(baseline::kTbeKernels, batch, weights).empty()));
}

// ---- Gradient of the per-sample weights.

std::vector<float> scalar_sample_weights_grad(const Batch& batch, const std::vector<float>& weights,
                                              const std::vector<float>& grad_output, float bound) {
  std::vector<float> grad(batch.num_indices());
  for (int64_t p = 0; p < batch.num_indices(); ++p) {
    const int64_t t = batch.feature_of(p);
    const float scale = batch.pooled() ? batch.pooling_scale(batch.bag_of(p)) : 1.0f;
    float sum = 0;
    for (int64_t d = 0; d < batch.D(t); ++d) {
      const float g = std::min(std::max(grad_output[batch.output_begin(p) + d], -bound), bound);
      sum += g * scale * weights[batch.row_begin(p) + d];
    }
    grad[p] = sum;
  }
  return grad;
}

template <typename weight_t>
std::vector<float> run_sample_weights_grad(const TbeKernels& kernels, const Batch& batch,
                                           const std::vector<weight_t>& weights,
                                           const std::vector<float>& grad_output, float bound) {
  std::vector<float> grad(batch.num_indices(), -1.0f);
  SampleWeightsGradArgs args;
  args.layout = batch.layout();
  args.bags = batch.bags();
  args.weights_kind = kind_of<weight_t>();
  args.weights = weights.data();
  args.grad_output = grad_output.data();
  args.max_gradient = bound;
  args.grad = grad.data();
  EXPECT_EQ(kernels.sample_weights_grad(args), -1);
  return grad;
}

TEST(TbeSampleWeightsGrad, PooledAndUnpooledWithClipping) {
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (const float bound : {kNoClip, 0.5f}) {
      const Batch batch(pooling, true);
      const std::vector<Bf16> weights = stored<Bf16>(random_floats(batch.num_weights, 4));
      const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols(), 5);
      expect_near(
          run_sample_weights_grad(baseline::kTbeKernels, batch, weights, grad_output, bound),
          scalar_sample_weights_grad(batch, widened(weights), grad_output, bound), 1e-5,
          "sample weights grad");
    }
  }
}

// ---- The fused exact update.

struct Problem {
  Optimizer optimizer;
  OptimizerParams params;
  float bound = kNoClip;
};

// Optimizer state: each table's rows x optimizer_state_size elements, tables one after the other.
struct State {
  std::vector<float> buffer[kMaxStates];
  std::vector<int64_t> offsets[kMaxStates];

  State(const Batch& batch, Optimizer optimizer) {
    for (int k = 0; k < kMaxStates; ++k) {
      const int64_t size_a = 10 * optimizer_state_size(optimizer, k, batch.D(0));
      const int64_t size_b = 7 * optimizer_state_size(optimizer, k, batch.D(2));
      offsets[k] = {0, 0, size_a};
      buffer[k] = random_floats(size_a + size_b, 20 + k);
      for (float& s : buffer[k]) s = std::abs(s);  // second moments are non-negative
    }
  }
};

// Rowwise Adagrad with counter (FBGEMM's formulas, docs/embedding.md): m1 the rowwise sum, m2 the
// step the row was last updated at (0: never), m3 its count.
void counter_step(const OptimizerParams& p, float* w, float* m1, float* m2, float* m3,
                  const std::vector<float>& g, int64_t D) {
  const OptimizerParams::Counter& c = p.counter;
  const float gap = m2[0] == 0 ? 1.0f : p.iter - m2[0];
  if (c.halflife > 0) {
    m3[0] = 1 + std::exp2(-gap / c.halflife) * m3[0];
  } else {
    m3[0] = c.halflife == 0 ? 1 : m3[0] + 1;
  }
  const float n = m3[0];
  double g_square = 0, w_square = 0;
  for (int64_t d = 0; d < D; ++d) {
    const float gd = p.weight_decay_mode == WeightDecay::kL2 ? g[d] + p.weight_decay * w[d] : g[d];
    g_square += static_cast<double>(gd) * gd;
    w_square += static_cast<double>(w[d]) * w[d];
  }
  m1[0] += static_cast<float>(g_square / static_cast<double>(D));
  const float base = p.learning_rate / (std::sqrt(m1[0]) + p.eps);
  const bool adjusting = c.adjustment_iter <= 0 || p.iter > c.adjustment_iter;
  float rate = base, keep = 1;
  const float lr_wd = p.learning_rate * p.weight_decay;
  if (c.regularization == CounterRegularization::kCowClip) {
    const float clip =
        n * std::max(c.weight_norm_coefficient * static_cast<float>(std::sqrt(w_square)),
                     c.lower_bound);
    rate = std::min(1.0f, clip / static_cast<float>(std::sqrt(g_square))) * base;
    if (p.weight_decay_mode == WeightDecay::kDecouple) keep = 1 - lr_wd;
    if (p.weight_decay_mode == WeightDecay::kL2) keep = 1 - p.weight_decay * rate;
  } else {
    if (adjusting && n > c.tail_id_threshold) {
      if (c.learning_rate_mode == 0) {
        rate = base * std::clamp(std::pow(c.max_counter / (n + 1), c.adjustment_ub), 1.0f, 10.0f);
      } else if (c.learning_rate_mode == 1) {
        rate = base * std::clamp(std::pow((n + 1) / c.max_counter, c.adjustment_ub), 0.1f, 1.0f);
      } else if (c.learning_rate_mode == 2) {
        rate = p.learning_rate / (std::sqrt(c.adjustment_ub * n) + p.eps);
      }
    }
    if (adjusting && p.weight_decay_mode == WeightDecay::kAdagradW) {
      if (c.halflife == -1) rate = base * std::sqrt(n);
      if (c.halflife == -2) {
        rate = std::min(p.learning_rate * n, c.adjustment_ub) / (std::sqrt(m1[0]) + p.eps);
      }
      const float lazy = std::pow(1 - lr_wd, std::min(gap, p.iter - c.adjustment_iter) - 1);
      rate *= lazy;
      keep = (1 - lr_wd) * lazy;
    } else if (adjusting && p.weight_decay_mode == WeightDecay::kDecouple) {
      keep = 1 - c.halflife / n * lr_wd;
    } else if (adjusting && p.weight_decay_mode == WeightDecay::kL2) {
      keep = 1 - c.halflife / n * p.weight_decay * base;
    }
  }
  m2[0] = p.iter;
  for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - rate * g[d];
}

// One step of `optimizer` on row w (D floats) with its summed gradient g, as documented for the
// TBE optimizers (docs/ops.md section 7).
void scalar_step(const Problem& problem, float* w, float* m1, float* m2, float* m3,
                 std::vector<float> g, int64_t D) {
  const OptimizerParams& p = problem.params;
  // LAMB decays in its update; RMSprop-AR's module passes weight_decay_mode NONE, and its step
  // ignores the mode; the counter optimizer reads the mode its own way.
  const bool lamb = problem.optimizer == Optimizer::kLamb ||
                    problem.optimizer == Optimizer::kPartialRowwiseLamb ||
                    problem.optimizer == Optimizer::kRowwiseRmspropAr ||
                    problem.optimizer == Optimizer::kRowwiseAdagradWithCounter;
  if (!lamb && p.weight_decay_mode == WeightDecay::kL2) {
    for (int64_t d = 0; d < D; ++d) g[d] += p.weight_decay * w[d];
  }
  const float keep = !lamb && p.weight_decay_mode == WeightDecay::kDecouple
                         ? 1.0f - p.learning_rate * p.weight_decay
                         : 1.0f;
  float mean_square = 0;
  for (int64_t d = 0; d < D; ++d) mean_square += g[d] * g[d];
  mean_square /= static_cast<float>(D);
  switch (problem.optimizer) {
    case Optimizer::kSgd:
      for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - p.learning_rate * g[d];
      break;
    case Optimizer::kAdagrad:
      for (int64_t d = 0; d < D; ++d) {
        m1[d] += g[d] * g[d];
        w[d] = keep * w[d] - p.learning_rate * g[d] / (std::sqrt(m1[d]) + p.eps);
      }
      break;
    case Optimizer::kRowwiseAdagrad:
      m1[0] += mean_square;
      for (int64_t d = 0; d < D; ++d) {
        w[d] = keep * w[d] - p.learning_rate / (std::sqrt(m1[0]) + p.eps) * g[d];
      }
      break;
    case Optimizer::kAdam:
    case Optimizer::kPartialRowwiseAdam: {
      const bool rowwise = problem.optimizer == Optimizer::kPartialRowwiseAdam;
      if (rowwise) m2[0] = p.beta2 * m2[0] + (1 - p.beta2) * mean_square;
      for (int64_t d = 0; d < D; ++d) {
        m1[d] = p.beta1 * m1[d] + (1 - p.beta1) * g[d];
        if (!rowwise) m2[d] = p.beta2 * m2[d] + (1 - p.beta2) * g[d] * g[d];
        const float v = rowwise ? m2[0] : m2[d];
        w[d] = keep * w[d] - p.learning_rate * (m1[d] / p.bias_correction1) /
                                 (std::sqrt(v / p.bias_correction2) + p.eps);
      }
      break;
    }
    case Optimizer::kLamb:
    case Optimizer::kPartialRowwiseLamb: {
      // r = Adam's direction + wd * w; w -= lr * (||w|| / ||r||, or 1 at a zero norm) * r.
      const bool rowwise = problem.optimizer == Optimizer::kPartialRowwiseLamb;
      if (rowwise) m2[0] = p.beta2 * m2[0] + (1 - p.beta2) * mean_square;
      std::vector<float> r(D);
      double w_norm = 0, r_norm = 0;
      for (int64_t d = 0; d < D; ++d) {
        m1[d] = p.beta1 * m1[d] + (1 - p.beta1) * g[d];
        if (!rowwise) m2[d] = p.beta2 * m2[d] + (1 - p.beta2) * g[d] * g[d];
        const float v = rowwise ? m2[0] : m2[d];
        r[d] = (m1[d] / p.bias_correction1) / (std::sqrt(v / p.bias_correction2) + p.eps) +
               p.weight_decay * w[d];
        w_norm += static_cast<double>(w[d]) * w[d];
        r_norm += static_cast<double>(r[d]) * r[d];
      }
      const double ratio = w_norm > 0 && r_norm > 0 ? std::sqrt(w_norm / r_norm) : 1.0;
      for (int64_t d = 0; d < D; ++d) w[d] -= static_cast<float>(p.learning_rate * ratio) * r[d];
      break;
    }
    case Optimizer::kRowwiseRmspropAr: {
      // m1: the second moment's EMA; m2: the step the row was last touched (0: never).
      m1[0] = p.ema_beta * m1[0] + (1 - p.ema_beta) * mean_square;
      const float gap = m2[0] == 0 ? 1.0f : p.iter - m2[0];
      const float shrink = std::min(1.0f, std::max(0.0f, p.learning_rate * p.ar_alpha * gap));
      const float decay = std::max(p.min_shrinkage, 1.0f - shrink);
      m2[0] = p.iter;
      for (int64_t d = 0; d < D; ++d) {
        w[d] = decay * w[d] - p.learning_rate / (std::sqrt(m1[0]) + p.eps) * g[d];
      }
      break;
    }
    case Optimizer::kRowwiseAdagradWithCounter:
      counter_step(p, w, m1, m2, m3, g, D);
      break;
  }
}

// Sums every occurrence's (clipped, scaled) gradient per (table, row), then steps each row once.
void scalar_update(const Batch& batch, const Problem& problem, std::vector<float>& weights,
                   State& state, const std::vector<float>& grad_output) {
  struct Row {
    int64_t table_feature;  // the first feature of the row's table
    int64_t row;
    std::vector<float> g;
  };
  std::vector<Row> rows;
  for (int64_t p = 0; p < batch.num_indices(); ++p) {
    const int64_t t = batch.feature_of(p);
    const int64_t table = batch.weights_offsets[t] == 0 ? 0 : 2;
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) {
      return r.table_feature == table && r.row == batch.indices[p];
    });
    if (it == rows.end()) {
      rows.push_back({table, batch.indices[p], std::vector<float>(batch.D(t), 0.0f)});
      it = rows.end() - 1;
    }
    const float scale = batch.sample_weight(p) * batch.pooling_scale(batch.bag_of(p));
    for (int64_t d = 0; d < batch.D(t); ++d) {
      const float g = grad_output[batch.output_begin(p) + d];
      it->g[d] += scale * std::min(std::max(g, -problem.bound), problem.bound);
    }
  }
  for (const Row& r : rows) {
    const int64_t D = batch.D(r.table_feature);
    float* m[kMaxStates];
    for (int k = 0; k < kMaxStates; ++k) {
      m[k] = state.buffer[k].data() + state.offsets[k][r.table_feature] +
             r.row * optimizer_state_size(problem.optimizer, k, D);
    }
    scalar_step(problem, weights.data() + batch.weights_offsets[r.table_feature] + r.row * D, m[0],
                m[1], m[2], r.g, D);
  }
}

template <typename weight_t>
int64_t run_update(const TbeKernels& kernels, const Batch& batch, const Problem& problem,
                   std::vector<weight_t>& weights, State& state,
                   const std::vector<float>& grad_output) {
  UpdateArgs args;
  args.layout = batch.layout();
  args.bags = batch.bags();
  args.grad_output = grad_output.data();
  args.max_gradient = problem.bound;
  args.weights_kind = kind_of<weight_t>();
  args.weights = weights.data();
  for (int k = 0; k < kMaxStates; ++k) {
    if (optimizer_state_size(problem.optimizer, k, 1) == 0) continue;
    args.state[k] = state.buffer[k].data();
    args.state_offsets[k] = state.offsets[k].data();
  }
  args.optimizer = problem.optimizer;
  args.params = problem.params;
  return kernels.exact_update(args);
}

Problem make_problem(Optimizer optimizer, WeightDecay decay = WeightDecay::kNone,
                     float bound = kNoClip) {
  Problem problem{optimizer, {}, bound};
  problem.params.learning_rate = 0.05f;
  problem.params.eps = 1e-2f;
  problem.params.weight_decay = decay == WeightDecay::kNone ? 0.0f : 0.1f;
  problem.params.weight_decay_mode = decay;
  problem.params.beta1 = 0.8f;
  problem.params.beta2 = 0.9f;
  problem.params.bias_correction1 = 1.0f - 0.8f * 0.8f;  // step 2
  problem.params.bias_correction2 = 1.0f - 0.9f * 0.9f;
  problem.params.iter = 7;  // State's random prev_iter values (in [0, 1)) are older steps
  problem.params.ema_beta = 0.7f;
  problem.params.ar_alpha = 3;
  problem.params.min_shrinkage = 0.3f;
  // The counter optimizer: decaying counts, the learning rate of rows counted above 0.5 lowered.
  problem.params.counter.halflife = 3;
  problem.params.counter.learning_rate_mode = 1;
  problem.params.counter.adjustment_ub = 0.5f;
  problem.params.counter.max_counter = 4;
  problem.params.counter.tail_id_threshold = 0.5f;
  return problem;
}

// Every optimizer of the optimizer table, in its order.
std::vector<Optimizer> table_optimizers() {
  std::vector<Optimizer> optimizers;
  for (const OptimizerRow& row : kOptimizerTable) optimizers.push_back(row.optimizer);
  return optimizers;
}
const std::vector<Optimizer> kOptimizers = table_optimizers();

template <typename weight_t>
void check_update(const Batch& batch, const Problem& problem) {
  const std::vector<float> initial = random_floats(batch.num_weights, 8);
  std::vector<weight_t> weights = stored<weight_t>(initial);
  const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols(), 9);
  State state(batch, problem.optimizer), expected_state = state;
  EXPECT_EQ(run_update(baseline::kTbeKernels, batch, problem, weights, state, grad_output), -1);
  std::vector<float> expected = widened(stored<weight_t>(initial));
  scalar_update(batch, problem, expected, expected_state, grad_output);
  expect_near(widened(weights), widened(stored<weight_t>(expected)), 4 * precision_of<weight_t>(),
              "weights");
  for (int k = 0; k < kMaxStates; ++k) {
    expect_near(state.buffer[k], expected_state.buffer[k], 1e-5, "optimizer state");
  }
}

TEST(TbeUpdate, EveryOptimizerAggregatesDuplicateRows) {
  for (const Optimizer optimizer : kOptimizers) {
    for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
      check_update<float>(Batch(pooling, false), make_problem(optimizer));
      check_update<float>(Batch(pooling, true, IndexKind::kInt32), make_problem(optimizer));
    }
    check_update<Fp16>(Batch(Pooling::kSum, true), make_problem(optimizer));
    check_update<Bf16>(Batch(Pooling::kMean, false), make_problem(optimizer));
  }
}

TEST(TbeUpdate, WeightDecayAndClipping) {
  for (const Optimizer optimizer : kOptimizers) {
    check_update<float>(Batch(Pooling::kSum, false), make_problem(optimizer, WeightDecay::kL2));
    check_update<float>(Batch(Pooling::kMean, true),
                        make_problem(optimizer, WeightDecay::kDecouple, 0.3f));
  }
}

// The counter optimizer's other branches: its lazy AdagradW decay (rates from the count and
// capped), the other learning-rate modes, the adjustment delay, and CowClip.
TEST(TbeUpdate, CounterRegularizations) {
  const auto counter_problem = [](WeightDecay decay, auto&& configure) {
    Problem problem = make_problem(Optimizer::kRowwiseAdagradWithCounter, decay);
    configure(problem.params.counter);
    return problem;
  };
  using Counter = OptimizerParams::Counter;
  const Problem problems[] = {
      counter_problem(WeightDecay::kAdagradW, [](Counter& c) { c.halflife = -1; }),
      counter_problem(WeightDecay::kAdagradW,
                      [](Counter& c) { c.halflife = -2, c.adjustment_iter = 5; }),
      counter_problem(WeightDecay::kNone, [](Counter& c) { c.learning_rate_mode = 0; }),
      counter_problem(WeightDecay::kL2, [](Counter& c) { c.learning_rate_mode = 2; }),
      counter_problem(WeightDecay::kDecouple, [](Counter& c) { c.adjustment_iter = 7; }),
      counter_problem(WeightDecay::kL2,
                      [](Counter& c) {
                        c.regularization = CounterRegularization::kCowClip;
                        c.weight_norm_coefficient = 0.2f, c.lower_bound = 0.01f;
                      }),
      counter_problem(WeightDecay::kDecouple,
                      [](Counter& c) {
                        c.regularization = CounterRegularization::kCowClip;
                        c.halflife = 0, c.lower_bound = 0.05f;
                      }),
  };
  for (const Problem& problem : problems) {
    check_update<float>(Batch(Pooling::kSum, true), problem);
    check_update<Bf16>(Batch(Pooling::kMean, false), problem);
  }
}

TEST(TbeUpdate, OutOfRangeIndexWritesNothing) {
  Batch batch(Pooling::kSum, false);
  batch.indices[14] = 7;  // position 14 is feature 2's, whose table has 7 rows
  batch.indices[16] = -3;
  const Problem problem = make_problem(Optimizer::kAdam);
  std::vector<float> weights = random_floats(batch.num_weights);
  const std::vector<float> before = weights;
  State state(batch, problem.optimizer);
  const State state_before = state;
  const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols());
  EXPECT_EQ(run_update(baseline::kTbeKernels, batch, problem, weights, state, grad_output), 14);
  EXPECT_EQ(weights, before);
  EXPECT_EQ(state.buffer[0], state_before.buffer[0]);
  EXPECT_EQ(state.buffer[1], state_before.buffer[1]);
}

TEST(TbeUpdate, EmptyBagsUpdateNothing) {
  Batch batch(Pooling::kSum, false);
  batch.offsets.assign(batch.offsets.size(), 0);
  batch.indices.clear();
  const Problem problem = make_problem(Optimizer::kAdagrad);
  std::vector<float> weights = random_floats(batch.num_weights);
  const std::vector<float> before = weights;
  State state(batch, problem.optimizer);
  const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols());
  EXPECT_EQ(run_update(baseline::kTbeKernels, batch, problem, weights, state, grad_output), -1);
  EXPECT_EQ(weights, before);
}

// ---- Every instruction-set variant against the baseline one.

class TbeVariants : public ::testing::TestWithParam<CpuIsa> {
 protected:
  const TbeKernels& variant() const { return tbe_kernels(GetParam()); }
};

// The variants contract a * b + c into fused multiply-adds where the CPU has them: results agree
// with the baseline's up to rounding.
template <typename weight_t, typename out_t>
void expect_forward_agrees(const TbeKernels& variant, const Batch& batch) {
  const std::vector<weight_t> weights = stored<weight_t>(random_floats(batch.num_weights, 11));
  expect_near(widened(run_forward<weight_t, out_t>(variant, batch, weights)),
              widened(run_forward<weight_t, out_t>(baseline::kTbeKernels, batch, weights)),
              2 * precision_of<out_t>(), "forward");
}

TEST_P(TbeVariants, ForwardAgreesWithBaseline) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (const bool weighted : {false, true}) {
      const Batch batch(pooling, weighted);
      expect_forward_agrees<float, float>(variant(), batch);
      expect_forward_agrees<Fp16, Fp16>(variant(), batch);
      expect_forward_agrees<Bf16, float>(variant(), batch);
      expect_forward_agrees<float, Bf16>(variant(), Batch(pooling, weighted, IndexKind::kInt32));
    }
  }
}

TEST_P(TbeVariants, SampleWeightsGradAgreesWithBaseline) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    const Batch batch(pooling, true);
    const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols(), 12);
    const std::vector<Fp16> weights = stored<Fp16>(random_floats(batch.num_weights, 13));
    // dot() also reduces in vector lanes as wide as the variant's.
    expect_near(run_sample_weights_grad(variant(), batch, weights, grad_output, 0.5f),
                run_sample_weights_grad(baseline::kTbeKernels, batch, weights, grad_output, 0.5f),
                1e-6, "sample weights grad");
  }
}

template <typename weight_t>
void expect_update_agrees(const TbeKernels& variant, const Batch& batch, const Problem& problem) {
  const std::vector<float> initial = random_floats(batch.num_weights, 14);
  const std::vector<float> grad_output = random_floats(batch.out_rows() * batch.out_cols(), 15);
  std::vector<weight_t> weights = stored<weight_t>(initial), baseline_weights = weights;
  State state(batch, problem.optimizer), baseline_state = state;
  EXPECT_EQ(run_update(variant, batch, problem, weights, state, grad_output), -1);
  EXPECT_EQ(run_update(baseline::kTbeKernels, batch, problem, baseline_weights, baseline_state,
                       grad_output),
            -1);
  // Row sums (mean_square) also reduce in vector lanes as wide as the variant's.
  expect_near(widened(weights), widened(baseline_weights), 2 * precision_of<weight_t>(), "weights");
  for (int k = 0; k < kMaxStates; ++k) {
    expect_near(state.buffer[k], baseline_state.buffer[k], 1e-6, "optimizer state");
  }
}

TEST_P(TbeVariants, ExactUpdateAgreesWithBaseline) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  for (const Optimizer optimizer : kOptimizers) {
    for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
      expect_update_agrees<float>(variant(), Batch(pooling, true), make_problem(optimizer));
    }
    expect_update_agrees<Fp16>(variant(), Batch(Pooling::kSum, false),
                               make_problem(optimizer, WeightDecay::kL2, 0.3f));
    expect_update_agrees<Bf16>(variant(), Batch(Pooling::kMean, true, IndexKind::kInt32),
                               make_problem(optimizer, WeightDecay::kDecouple));
  }
}

// ---- The quantized inference lookup against a scalar dequantize-and-pool loop.

// One table of every storage type (dims covering every column-block width), 3 bags each with an
// empty bag and pruned (-1) indices; rows laid out as FBGEMM's inference TBE lays them.
struct QuantizedBatch {
  std::vector<WeightType> types = {WeightType::kInt8, WeightType::kInt4, WeightType::kInt2,
                                   WeightType::kFp16, WeightType::kFp32, WeightType::kFp8};
  std::vector<int32_t> D_offsets = {0};
  std::vector<int64_t> rows = {5, 4, 6, 3, 7, 4};
  std::vector<int64_t> weights_offsets;
  std::vector<uint8_t> bytes;
  std::vector<const uint8_t*> tables;
  std::vector<int64_t> indices, offsets;
  std::vector<float> per_sample_weights;
  int64_t B = 3, row_alignment;
  Pooling pooling;

  QuantizedBatch(Pooling pooling_mode, bool weighted, int64_t alignment)
      : row_alignment(alignment), pooling(pooling_mode) {
    const std::vector<int64_t> dims = {8, 20, 40, 37, 6, 12};
    for (size_t t = 0; t < types.size(); ++t) {
      const int64_t D = pooling == Pooling::kNone ? 40 : dims[t];
      D_offsets.push_back(static_cast<int32_t>(D_offsets.back() + D));
      weights_offsets.push_back(static_cast<int64_t>(bytes.size()));
      const int64_t n = rows[t] * quantized_row_bytes(types[t], D, row_alignment);
      const std::vector<int64_t> random = random_integers<int64_t>(n, 0, 255, 30 + t);
      bytes.insert(bytes.end(), random.begin(), random.end());
      bytes.resize((bytes.size() + 127) / 128 * 128);
    }
    for (size_t t = 0; t < types.size(); ++t) {  // finite fp16 / fp32 values, small scales
      for (int64_t r = 0; r < rows[t]; ++r) {
        uint8_t* row = bytes.data() + weights_offsets[t] + r * row_bytes(t);
        const std::vector<float> values = random_floats(D(t) + 2, 50 + 10 * t + r);
        if (types[t] == WeightType::kFp32) std::memcpy(row, values.data(), 4 * D(t));
        if (types[t] == WeightType::kFp16) {
          for (int64_t d = 0; d < D(t); ++d) {
            const Fp16 h(values[d]);
            std::memcpy(row + 2 * d, &h, 2);
          }
        }
        if (has_scale_bias(types[t])) {
          const Fp16 scale_bias[2] = {Fp16(0.05f * (values[0] + 1.5f)), Fp16(values[1])};
          std::memcpy(row, scale_bias, 4);
        }
      }
    }
    for (size_t t = 0; t < types.size(); ++t) tables.push_back(bytes.data() + weights_offsets[t]);
    const std::vector<int64_t> lengths = {2, 0, 3, 1, 4, 1, 0, 2, 3, 3, 0, 1, 2, 2, 5, 1, 0, 4};
    offsets = test::offsets_of(lengths);
    for (int64_t bag = 0; bag < T() * B; ++bag) {
      for (int64_t p = offsets[bag]; p < offsets[bag + 1]; ++p) {
        indices.push_back(random_integers<int64_t>(1, -1, rows[bag / B] - 1, 200 + p)[0]);
      }
    }
    if (weighted) per_sample_weights = random_floats(static_cast<int64_t>(indices.size()), 9);
  }

  int64_t T() const { return static_cast<int64_t>(types.size()); }
  int64_t D(int64_t t) const { return D_offsets[t + 1] - D_offsets[t]; }
  int64_t row_bytes(int64_t t) const { return quantized_row_bytes(types[t], D(t), row_alignment); }
  int64_t max_D() const {
    int64_t m = 0;
    for (int64_t t = 0; t < T(); ++t) m = std::max(m, D(t));
    return m;
  }
  int64_t out_size() const {
    return pooling == Pooling::kNone ? static_cast<int64_t>(indices.size()) * max_D()
                                     : B * D_offsets.back();
  }

  // Element d of row r of table t, decoded one element at a time in double.
  double element(int64_t t, int64_t r, int64_t d) const {
    const uint8_t* row = tables[t] + r * row_bytes(t);
    switch (types[t]) {
      case WeightType::kFp32: {
        float v;
        std::memcpy(&v, row + 4 * d, 4);
        return v;
      }
      case WeightType::kFp16: {
        Fp16 h;
        std::memcpy(&h, row + 2 * d, 2);
        return static_cast<float>(h);
      }
      case WeightType::kFp8: {  // 4 exponent bits biased by 7, 3 mantissa bits
        const int code = row[d], exponent = (code >> 3) & 15, mantissa = code & 7;
        const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - 7)
                                               : std::ldexp(1 + mantissa / 8.0, exponent - 7);
        return (code & 0x80) != 0 ? -magnitude : magnitude;
      }
      default: {
        Fp16 scale_bias[2];
        std::memcpy(scale_bias, row, 4);
        const int64_t bits = weight_type_bits(types[t]), per_byte = 8 / bits;
        const int code = (row[4 + d / per_byte] >> (bits * (d % per_byte))) & ((1 << bits) - 1);
        return static_cast<float>(scale_bias[0]) * code + static_cast<float>(scale_bias[1]);
      }
    }
  }

  std::vector<float> reference() const {
    std::vector<float> out(out_size(), 0.0f);
    for (int64_t bag = 0; bag < T() * B; ++bag) {
      const int64_t t = bag / B, b = bag % B;
      const int64_t length = offsets[bag + 1] - offsets[bag];
      for (int64_t d = 0; d < D(t); ++d) {
        double sum = 0;
        for (int64_t p = offsets[bag]; p < offsets[bag + 1]; ++p) {
          if (indices[p] == -1) continue;
          const double value = element(t, indices[p], d);
          if (pooling == Pooling::kNone) {
            out[p * max_D() + d] = static_cast<float>(value);
          } else {
            sum += (per_sample_weights.empty() ? 1.0 : per_sample_weights[p]) * value;
          }
        }
        if (pooling == Pooling::kMean && length > 0) sum /= length;
        if (pooling != Pooling::kNone) out[b * D_offsets.back() + D_offsets[t] + d] = sum;
      }
    }
    return out;
  }

  std::vector<float> run(const TbeKernels& kernels, int64_t* bad = nullptr) const {
    std::vector<int32_t> dims = D_offsets;
    if (pooling == Pooling::kNone) {  // every table read with max_D
      for (int64_t t = 0; t <= T(); ++t) dims[t] = static_cast<int32_t>(t * max_D());
    }
    QuantizedForwardArgs args;
    args.layout.num_features = T();
    args.layout.batch_size = B;
    args.layout.total_D = D_offsets.back();
    args.layout.max_D = max_D();
    args.layout.D_offsets = dims.data();
    args.layout.weights_offsets = weights_offsets.data();
    args.layout.rows = rows.data();
    args.bags.indices = indices.data();
    args.bags.offsets = offsets.data();
    args.bags.num_indices = static_cast<int64_t>(indices.size());
    args.bags.per_sample_weights = per_sample_weights.empty() || pooling == Pooling::kNone
                                       ? nullptr
                                       : per_sample_weights.data();
    args.bags.pooling = pooling;
    args.tables.tables = tables.data();
    args.tables.types = types.data();
    args.tables.row_alignment = row_alignment;
    args.tables.fp8_exponent_bits = 4;
    args.tables.fp8_exponent_bias = 7;
    std::vector<float> out(out_size(), 0.0f);
    args.out = out.data();
    const int64_t first_bad = kernels.quantized_forward(args);
    if (bad != nullptr) *bad = first_bad;
    return out;
  }
};

TEST(TbeQuantizedForward, EveryStorageTypeAgainstScalarDequantization) {
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    for (const bool weighted : {false, true}) {
      for (const int64_t alignment : {1, 16}) {
        const QuantizedBatch batch(pooling, weighted, alignment);
        int64_t bad = 0;
        expect_near(batch.run(baseline::kTbeKernels, &bad), batch.reference(), 1e-5, "forward");
        EXPECT_EQ(bad, -1);
      }
    }
  }
}

TEST(TbeQuantizedForward, ReportsAnOutOfRangeIndexButNotMinusOne) {
  QuantizedBatch batch(Pooling::kSum, false, 1);
  batch.indices[5] = -1;
  batch.indices[7] = batch.rows[1];  // position 7 is in a bag of table 1
  int64_t bad = 0;
  batch.run(baseline::kTbeKernels, &bad);
  EXPECT_EQ(bad, 7);
  batch.indices[7] = -2;
  batch.run(baseline::kTbeKernels, &bad);
  EXPECT_EQ(bad, 7);
}

TEST_P(TbeVariants, QuantizedForwardAgreesWithReference) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  for (const Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kNone}) {
    const QuantizedBatch batch(pooling, true, 8);
    expect_near(batch.run(variant()), batch.reference(), 1e-5, "forward");
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, TbeVariants, ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(test::isa_name(info.param)); });

}  // namespace
}  // namespace recops::embedding::kernels
