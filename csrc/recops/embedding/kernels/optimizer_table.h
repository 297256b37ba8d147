// The fused TBE optimizers, one row each: the only list of them. Registration (ops.cpp composes
// each optimizer's lookup and update schemas from its row), the adapter's checks (backward.cpp),
// the kernels' dispatch (variant.h: the row's Optimizer picks its Step<> policy in
// optimizers.h) and, through the tbe_optimizer_table op, the Python module and the tests read it.
// Adding an optimizer is one enum value and one row here, plus its Step<> policy.
#pragma once

#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

namespace recops::embedding::kernels {

// Row order: an optimizer's value is its row's index in kOptimizerTable.
enum class Optimizer {
  kSgd,
  kAdagrad,
  kRowwiseAdagrad,
  kAdam,
  kPartialRowwiseAdam,
  kLamb,
  kPartialRowwiseLamb,
  kRowwiseRmspropAr,
  kRowwiseAdagradWithCounter
};
// Optimizer-state buffers: momentum1, then momentum2 or prev_iter, then row_counter.
constexpr int kMaxStates = 3;

// Values per table row in an optimizer-state buffer: none (unused), D, or one.
enum class StateWidth { kUnused, kElementwise, kRowwise };

struct OptimizerRow {
  Optimizer optimizer;
  // Op suffix: split_embedding_codegen_lookup_<name>_function, backward_codegen_<name>_*_exact.
  const char* name;
  // FBGEMM's EmbOptimType member and its value.
  const char* optim_type;
  const char* optim_type_value;
  // State buffer k: its width, its name in the ops' schemas and the module's buffers (FBGEMM's:
  // <buffer>_host, <buffer>_offsets), and get_optimizer_state's (torch.optim's) name for it.
  StateWidth state[kMaxStates];
  const char* buffers[kMaxStates];
  const char* state_names[kMaxStates];
  // Schema text of the hyper-parameters the optimizer reads besides learning_rate_tensor,
  // weight_decay and weight_decay_mode, in schema order (after learning_rate_tensor). The module
  // passes each from its attribute of that name; `iter` is its step count.
  const char* hyper_parameters;
  // Bias-corrected by the step count `iter` (the Adam family): the module saves its step count.
  bool bias_corrected;
  // The weight_decay_mode the module passes (WeightDecayMode's value), or -1 for the module's own.
  int weight_decay_mode;
  // Decays in its own update rather than by the shared rule of optimizers.h update_row: LAMB adds
  // weight_decay * w to its direction, RMSprop-AR shrinks stale rows by ar_alpha instead, and the
  // counter optimizer reads weight_decay_mode its own way.
  bool decays_in_update;
  // The largest weight_decay_mode it accepts: 2 (DECOUPLE) under the shared rule, 0 (NONE) where
  // it decays in its update, 3 for the counter optimizer (FBGEMM's CounterWeightDecayMode, whose
  // 3 is ADAGRADW).
  int max_weight_decay_mode;
  // FBGEMM's CPU module implements it too (agreement tests and benchmarks run beside it).
  bool fbgemm_cpu;
};

constexpr const char* kAdamHyperParameters =
    "float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1";

// clang-format off
inline constexpr OptimizerRow kOptimizerTable[] = {
    {Optimizer::kSgd, "sgd", "EXACT_SGD", "exact_sgd",
     {StateWidth::kUnused, StateWidth::kUnused, StateWidth::kUnused}, {}, {},
     "", false, -1, false, 2, true},
    {Optimizer::kAdagrad, "adagrad", "EXACT_ADAGRAD", "exact_adagrad",
     {StateWidth::kElementwise, StateWidth::kUnused, StateWidth::kUnused}, {"momentum1"}, {"sum"},
     "float eps=0.0", false, -1, false, 2, true},
    {Optimizer::kRowwiseAdagrad, "rowwise_adagrad", "EXACT_ROWWISE_ADAGRAD", "exact_row_wise_adagrad",
     {StateWidth::kRowwise, StateWidth::kUnused, StateWidth::kUnused}, {"momentum1"}, {"sum"},
     "float eps=0.0", false, -1, false, 2, true},
    // FBGEMM's Adam decays decoupled, whatever the module's weight_decay_mode.
    {Optimizer::kAdam, "adam", "ADAM", "adam",
     {StateWidth::kElementwise, StateWidth::kElementwise, StateWidth::kUnused}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 2, false, 2, false},
    {Optimizer::kPartialRowwiseAdam, "partial_rowwise_adam", "PARTIAL_ROWWISE_ADAM", "partial_row_wise_adam",
     {StateWidth::kElementwise, StateWidth::kRowwise, StateWidth::kUnused}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 2, false, 2, false},
    {Optimizer::kLamb, "lamb", "LAMB", "lamb",
     {StateWidth::kElementwise, StateWidth::kElementwise, StateWidth::kUnused}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 0, true, 0, false},
    {Optimizer::kPartialRowwiseLamb, "partial_rowwise_lamb", "PARTIAL_ROWWISE_LAMB", "partial_row_wise_lamb",
     {StateWidth::kElementwise, StateWidth::kRowwise, StateWidth::kUnused}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 0, true, 0, false},
    // FBGEMM's rowwise RMSprop with adaptive regularization: weight_decay does not apply (its
    // decay is the staleness-scaled shrink of ar_alpha; FBGEMM's op has no weight_decay).
    {Optimizer::kRowwiseRmspropAr, "rowwise_rmsprop_ar", "ROWWISE_RMSPROP_AR", "row_wise_rmsprop_ar",
     {StateWidth::kRowwise, StateWidth::kRowwise, StateWidth::kUnused}, {"momentum1", "prev_iter"}, {"sum", "prev_iter"},
     "float eps=0.0, float ar_alpha=0.0, int iter=1, float ema_beta=0.99, float min_shrinkage=0.1",
     false, 0, true, 0, true},
    // EXACT_ROWWISE_ADAGRAD under FBGEMM's weight_decay_mode COUNTER or COWCLIP (the one row that
    // repeats an optim_type: the module picks it by weight_decay_mode). weight_decay_mode is the
    // counter's own (CounterWeightDecayMode), regularization_mode the module's (3 or 4).
    {Optimizer::kRowwiseAdagradWithCounter, "rowwise_adagrad_with_counter", "EXACT_ROWWISE_ADAGRAD", "exact_row_wise_adagrad",
     {StateWidth::kRowwise, StateWidth::kRowwise, StateWidth::kRowwise}, {"momentum1", "prev_iter", "row_counter"}, {"sum", "prev_iter", "row_counter"},
     "float eps=0.0, int iter=1, int counter_halflife=-1, int adjustment_iter=-1, float adjustment_ub=1.0, "
     "int learning_rate_mode=-1, float max_counter=1.0, float tail_id_threshold=0.0, int is_tail_id_thresh_ratio=0, "
     "int regularization_mode=3, float weight_norm_coefficient=0.0, float lower_bound=0.0",
     false, -1, true, 3, true},
};
// clang-format on
constexpr int kNumOptimizers = static_cast<int>(std::size(kOptimizerTable));

constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumOptimizers; ++i) {
    if (static_cast<int>(kOptimizerTable[i].optimizer) != i) return false;
  }
  return true;
}
static_assert(rows_in_enum_order(), "kOptimizerTable's rows must follow enum Optimizer's order");

constexpr const OptimizerRow& optimizer_row(Optimizer optimizer) {
  return kOptimizerTable[static_cast<int>(optimizer)];
}

// Elements per row of D in optimizer-state buffer k (0: momentum1, 1: momentum2); 0 for a buffer
// the optimizer does not use.
constexpr int64_t optimizer_state_size(Optimizer optimizer, int k, int64_t D) {
  switch (optimizer_row(optimizer).state[k]) {
    case StateWidth::kElementwise:
      return D;
    case StateWidth::kRowwise:
      return 1;
    default:
      return 0;
  }
}

// Calls fn(std::integral_constant<Optimizer, o>{}) for o = `optimizer`: a run-time choice of the
// compile-time optimizer a template is instantiated for, one instantiation per row.
template <typename Fn, int... kRows>
void dispatch_optimizer_rows(Optimizer optimizer, Fn&& fn, std::integer_sequence<int, kRows...>) {
  ((static_cast<int>(optimizer) == kRows
        ? (fn(std::integral_constant<Optimizer, static_cast<Optimizer>(kRows)>{}), true)
        : false) ||
   ...);
}

template <typename Fn>
void dispatch_optimizer(Optimizer optimizer, Fn&& fn) {
  dispatch_optimizer_rows(optimizer, std::forward<Fn>(fn),
                          std::make_integer_sequence<int, kNumOptimizers>{});
}

}  // namespace recops::embedding::kernels
