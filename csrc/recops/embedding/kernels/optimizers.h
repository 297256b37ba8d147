// The exact optimizers as policies: one step on one row given the row's summed gradient g (fp32).
// Weight decay is shared: L2 folds wd * w into g first; DECOUPLE scales w by keep = 1 - lr * wd in
// the step (keep = 1 otherwise, which leaves w exactly unscaled); LAMB decays in its own update
// (its row's decays_in_update, optimizer_table.h). Compiled per instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/convert.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// Step<o> steps one row for optimizer o: `s[k]` is the row's state in buffer k, which holds
// optimizer_state_size(o, k, D) elements per row (optimizer_table.h).
template <Optimizer kOptimizer>
struct Step;

// w = keep * w - lr * g
template <>
struct Step<Optimizer::kSgd> {
  static void step(float* __restrict w, float* const* /*s*/, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - p.learning_rate * g[d];
  }
};

// m += g^2; w = keep * w - lr * g / (sqrt(m) + eps), elementwise.
template <>
struct Step<Optimizer::kAdagrad> {
  static void step(float* __restrict w, float* const* s, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    float* __restrict m = s[0];
    for (int64_t d = 0; d < D; ++d) {
      const float sum = m[d] + g[d] * g[d];
      m[d] = sum;
      w[d] = keep * w[d] - p.learning_rate * g[d] / (std::sqrt(sum) + p.eps);
    }
  }
};

inline float mean_square(const float* __restrict g, int64_t D) {
  float square_sum = 0;
#pragma omp simd reduction(+ : square_sum)
  for (int64_t d = 0; d < D; ++d) square_sum += g[d] * g[d];
  return square_sum / static_cast<float>(D);
}

// m += mean_d(g^2); w = keep * w - lr / (sqrt(m) + eps) * g, one m per row.
template <>
struct Step<Optimizer::kRowwiseAdagrad> {
  static void step(float* __restrict w, float* const* s, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    const float sum = s[0][0] + mean_square(g, D);
    s[0][0] = sum;
    const float multiplier = p.learning_rate / (std::sqrt(sum) + p.eps);
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - multiplier * g[d];
  }
};

// The Adam family's moments of one row and its bias-corrected direction, written over g:
// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (kRowwiseSecondMoment: one v per row, from
// mean_d(g^2)); g = (m / c1) / (sqrt(v / c2) + eps), c = 1 - b^iter (FBGEMM's).
template <bool kRowwiseSecondMoment>
void adam_direction(float* const* s, float* __restrict g, int64_t D, const OptimizerParams& p) {
  float* __restrict m = s[0];
  if constexpr (kRowwiseSecondMoment) {
    const float v = p.beta2 * s[1][0] + (1.0f - p.beta2) * mean_square(g, D);
    s[1][0] = v;
    const float denominator = std::sqrt(v / p.bias_correction2) + p.eps;
    for (int64_t d = 0; d < D; ++d) {
      m[d] = p.beta1 * m[d] + (1.0f - p.beta1) * g[d];
      g[d] = (m[d] / p.bias_correction1) / denominator;
    }
  } else {
    float* __restrict v = s[1];
    for (int64_t d = 0; d < D; ++d) {
      m[d] = p.beta1 * m[d] + (1.0f - p.beta1) * g[d];
      v[d] = p.beta2 * v[d] + (1.0f - p.beta2) * g[d] * g[d];
      g[d] = (m[d] / p.bias_correction1) / (std::sqrt(v[d] / p.bias_correction2) + p.eps);
    }
  }
}

// Adam: w = keep * w - lr * direction.
template <bool kRowwiseSecondMoment>
struct AdamStep {
  static void step(float* __restrict w, float* const* s, float* __restrict g, int64_t D,
                   const OptimizerParams& p, float keep) {
    adam_direction<kRowwiseSecondMoment>(s, g, D, p);
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - p.learning_rate * g[d];
  }
};
template <>
struct Step<Optimizer::kAdam> : AdamStep<false> {};
template <>
struct Step<Optimizer::kPartialRowwiseAdam> : AdamStep<true> {};

// LAMB's step on one row (one row is one layer, as in FBGEMM): w -= lr * ratio * r for the
// update direction r, with the trust ratio ||w|| / ||r||, or 1 where either norm is 0 (as the
// paper's reference implementations do: FBGEMM's GPU kernel divides plainly, which freezes an
// all-zero row and turns a zero direction into NaN).
inline void trust_ratio_step(float* __restrict w, const float* __restrict r, int64_t D,
                             float learning_rate) {
  float w_square_sum = 0, r_square_sum = 0;
#pragma omp simd reduction(+ : w_square_sum, r_square_sum)
  for (int64_t d = 0; d < D; ++d) {
    w_square_sum += w[d] * w[d];
    r_square_sum += r[d] * r[d];
  }
  const float ratio = w_square_sum > 0 && r_square_sum > 0
                          ? std::sqrt(w_square_sum) / std::sqrt(r_square_sum)
                          : 1.0f;
  const float multiplier = learning_rate * ratio;
  for (int64_t d = 0; d < D; ++d) w[d] -= multiplier * r[d];
}

// LAMB: r = Adam's direction + weight_decay * w (built in g's place), then trust_ratio_step.
// Weight decay is part of r, so weight_decay_mode does not apply (keep = 1, decays_in_update).
template <bool kRowwiseSecondMoment>
struct LambStep {
  static void step(float* __restrict w, float* const* s, float* __restrict g, int64_t D,
                   const OptimizerParams& p, float /*keep*/) {
    adam_direction<kRowwiseSecondMoment>(s, g, D, p);
    for (int64_t d = 0; d < D; ++d) g[d] += p.weight_decay * w[d];
    trust_ratio_step(w, g, D, p.learning_rate);
  }
};
template <>
struct Step<Optimizer::kLamb> : LambStep<false> {};
template <>
struct Step<Optimizer::kPartialRowwiseLamb> : LambStep<true> {};

// Rowwise RMSprop with adaptive regularization (FBGEMM's): v = ema_beta v + (1 - ema_beta)
// mean_d(g^2); a row last touched at step prev_iter (0: never) shrinks by
// keep = max(min_shrinkage, 1 - clamp(lr * ar_alpha * gap, 0, 1)), gap = iter - prev_iter (1 on
// the first touch), so the decay a row missed while untouched is paid when it is next touched;
// w = keep * w - lr / (sqrt(v) + eps) * g; prev_iter = iter. weight_decay does not apply
// (decays_in_update: weight_decay_mode is NONE).
template <>
struct Step<Optimizer::kRowwiseRmspropAr> {
  static void step(float* __restrict w, float* const* s, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float /*keep*/) {
    const float v = p.ema_beta * s[0][0] + (1.0f - p.ema_beta) * mean_square(g, D);
    s[0][0] = v;
    const float multiplier = p.learning_rate / (std::sqrt(v) + p.eps);
    const float gap = s[1][0] == 0 ? 1.0f : p.iter - s[1][0];
    const float shrink = std::min(std::max(p.learning_rate * p.ar_alpha * gap, 0.0f), 1.0f);
    const float keep = std::max(p.min_shrinkage, 1.0f - shrink);
    s[1][0] = p.iter;
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - multiplier * g[d];
  }
};

// Rowwise Adagrad with counter (FBGEMM's rowwise_adagrad_with_counter), the states being the sum
// m, the step prev_iter the row was last updated at (0: never) and its occurrence count c. With
// gap = iter - prev_iter (1 on the first update):
//   c = 1 + 2^(-gap / halflife) c (halflife > 0), 1 (halflife = 0), c + 1 (halflife < 0);
//   m += mean_d(g'^2), g' = g + wd * w under L2 decay (only there: the step uses g);
//   base = lr / (sqrt(m) + eps); w = keep * w - rate * g, where rate and keep depend on the
//   regularization, as counter_rate() and counter_keep() say.
struct CounterRow {
  float sum;  // m after this step
  float count;
  float gap;
  float base;  // lr / (sqrt(m) + eps)
};

// The learning rate of a row under the counter regularization (COUNTER) or CowClip (COWCLIP).
inline float counter_rate(const CounterRow& row, float g_square_sum, float w_square_sum,
                          bool adjusting, const OptimizerParams& p) {
  const OptimizerParams::Counter& c = p.counter;
  if (c.regularization == CounterRegularization::kCowClip) {
    // The gradient's norm clipped to count * max(coefficient * ||w||, lower_bound).
    const float clip =
        row.count * std::max(c.weight_norm_coefficient * std::sqrt(w_square_sum), c.lower_bound);
    return std::fmin(1.0f, clip / std::sqrt(g_square_sum)) * row.base;
  }
  if (c.learning_rate_mode < 0 || !adjusting || row.count <= c.tail_id_threshold) return row.base;
  switch (c.learning_rate_mode) {
    case 0:  // TAIL_ID_LR_INCREASE
      return row.base *
             std::fmax(std::fmin(std::pow(c.max_counter / (row.count + 1), c.adjustment_ub), 10.0f),
                       1.0f);
    case 1:  // TAIL_ID_LR_DECREASE
      return row.base *
             std::fmin(std::fmax(std::pow((row.count + 1) / c.max_counter, c.adjustment_ub), 0.1f),
                       1.0f);
    default:  // 2, COUNTER_SGD
      return p.learning_rate / (std::sqrt(c.adjustment_ub * row.count) + p.eps);
  }
}

// The weight's scale (1: none) by the counter's weight_decay_mode, and for ADAGRADW the rate it
// rescales: AdagradW decays lazily, paying on update the decay of the gap steps the row missed.
inline float counter_keep(const CounterRow& row, float& rate, bool adjusting,
                          const OptimizerParams& p) {
  const OptimizerParams::Counter& c = p.counter;
  const float lr_decay = p.learning_rate * p.weight_decay;
  if (c.regularization == CounterRegularization::kCowClip) {
    if (p.weight_decay_mode == WeightDecay::kDecouple) return 1.0f - lr_decay;
    if (p.weight_decay_mode == WeightDecay::kL2) return 1.0f - p.weight_decay * rate;
    return 1.0f;
  }
  if (!adjusting) return 1.0f;
  // FBGEMM's frequency factor: halflife / count (negative for a counter without decay).
  const float frequency = c.halflife / row.count;
  switch (p.weight_decay_mode) {
    case WeightDecay::kAdagradW: {
      if (c.halflife == -1) rate = row.base * std::sqrt(row.count);
      if (c.halflife == -2) {
        rate =
            std::fmin(p.learning_rate * row.count, c.adjustment_ub) / (std::sqrt(row.sum) + p.eps);
      }
      const float missed = std::fmin(row.gap, p.iter - c.adjustment_iter) - 1;
      const float lazy = std::pow(1.0f - lr_decay, missed);
      rate *= lazy;
      return (1.0f - lr_decay) * lazy;
    }
    case WeightDecay::kDecouple:
      return 1.0f - frequency * lr_decay;
    case WeightDecay::kL2:
      return 1.0f - frequency * p.weight_decay * row.base;
    default:
      return 1.0f;
  }
}

template <>
struct Step<Optimizer::kRowwiseAdagradWithCounter> {
  static void step(float* __restrict w, float* const* s, const float* __restrict g, int64_t D,
                   const OptimizerParams& p, float /*keep*/) {
    const OptimizerParams::Counter& c = p.counter;
    float& prev_iter = s[1][0];
    float& count = s[2][0];
    const float gap = prev_iter == 0 ? 1.0f : p.iter - prev_iter;
    if (c.halflife > 0) {
      count = 1.0f + std::exp(-gap * (std::log(2.0f) / c.halflife)) * count;
    } else if (c.halflife == 0) {
      count = 1.0f;
    } else {
      count += 1.0f;
    }
    const bool l2 = p.weight_decay_mode == WeightDecay::kL2;
    float g_square_sum = 0, w_square_sum = 0;
#pragma omp simd reduction(+ : g_square_sum, w_square_sum)
    for (int64_t d = 0; d < D; ++d) {
      const float decayed = l2 ? g[d] + p.weight_decay * w[d] : g[d];
      g_square_sum += decayed * decayed;
      w_square_sum += w[d] * w[d];
    }
    const float sum = s[0][0] + g_square_sum / static_cast<float>(D);
    s[0][0] = sum;
    const CounterRow row{sum, count, gap, p.learning_rate / (std::sqrt(sum) + p.eps)};
    const bool adjusting = c.adjustment_iter <= 0 || p.iter > c.adjustment_iter;
    float rate = counter_rate(row, g_square_sum, w_square_sum, adjusting, p);
    const float keep = counter_keep(row, rate, adjusting, p);
    prev_iter = p.iter;
    for (int64_t d = 0; d < D; ++d) w[d] = keep * w[d] - rate * g[d];
  }
};

// Applies optimizer kOptimizer to one stored row, computing in fp32 and rounding once on the store.
// `g` is clobbered (L2 decay); `scratch` holds D floats for rows stored in fp16 / bf16.
template <Optimizer kOptimizer, typename weight_t>
void update_row(weight_t* row, float* const* state, float* g, int64_t D, const OptimizerParams& p,
                float* scratch) {
  float* w;
  if constexpr (std::is_same_v<weight_t, float>) {
    w = row;
  } else {
    to_float(row, scratch, D);
    w = scratch;
  }
  float keep = 1.0f;
  if constexpr (!optimizer_row(kOptimizer).decays_in_update) {
    if (p.weight_decay_mode == WeightDecay::kL2) {
      for (int64_t d = 0; d < D; ++d) g[d] += p.weight_decay * w[d];
    }
    if (p.weight_decay_mode == WeightDecay::kDecouple) {
      keep = 1.0f - p.learning_rate * p.weight_decay;
    }
  }
  Step<kOptimizer>::step(w, state, g, D, p, keep);
  if constexpr (!std::is_same_v<weight_t, float>) from_float(w, row, D);
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS
