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
  kRowwiseRmspropAr
};
constexpr int kMaxStates = 2;  // optimizer-state buffers (momentum1, and momentum2 or prev_iter)

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
  // Decays in its own update, so the shared weight_decay_mode must be NONE: LAMB adds
  // weight_decay * w to its direction, RMSprop-AR shrinks stale rows by ar_alpha instead.
  bool decays_in_update;
  // FBGEMM's CPU module implements it too (agreement tests and benchmarks run beside it).
  bool fbgemm_cpu;
};

constexpr const char* kAdamHyperParameters =
    "float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1";

// clang-format off
inline constexpr OptimizerRow kOptimizerTable[] = {
    {Optimizer::kSgd, "sgd", "EXACT_SGD", "exact_sgd",
     {StateWidth::kUnused, StateWidth::kUnused}, {nullptr, nullptr}, {nullptr, nullptr},
     "", false, -1, false, true},
    {Optimizer::kAdagrad, "adagrad", "EXACT_ADAGRAD", "exact_adagrad",
     {StateWidth::kElementwise, StateWidth::kUnused}, {"momentum1", nullptr}, {"sum", nullptr},
     "float eps=0.0", false, -1, false, true},
    {Optimizer::kRowwiseAdagrad, "rowwise_adagrad", "EXACT_ROWWISE_ADAGRAD", "exact_row_wise_adagrad",
     {StateWidth::kRowwise, StateWidth::kUnused}, {"momentum1", nullptr}, {"sum", nullptr},
     "float eps=0.0", false, -1, false, true},
    // FBGEMM's Adam decays decoupled, whatever the module's weight_decay_mode.
    {Optimizer::kAdam, "adam", "ADAM", "adam",
     {StateWidth::kElementwise, StateWidth::kElementwise}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 2, false, false},
    {Optimizer::kPartialRowwiseAdam, "partial_rowwise_adam", "PARTIAL_ROWWISE_ADAM", "partial_row_wise_adam",
     {StateWidth::kElementwise, StateWidth::kRowwise}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 2, false, false},
    {Optimizer::kLamb, "lamb", "LAMB", "lamb",
     {StateWidth::kElementwise, StateWidth::kElementwise}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 0, true, false},
    {Optimizer::kPartialRowwiseLamb, "partial_rowwise_lamb", "PARTIAL_ROWWISE_LAMB", "partial_row_wise_lamb",
     {StateWidth::kElementwise, StateWidth::kRowwise}, {"momentum1", "momentum2"}, {"exp_avg", "exp_avg_sq"},
     kAdamHyperParameters, true, 0, true, false},
    // FBGEMM's rowwise RMSprop with adaptive regularization: weight_decay does not apply (its
    // decay is the staleness-scaled shrink of ar_alpha; FBGEMM's op has no weight_decay).
    {Optimizer::kRowwiseRmspropAr, "rowwise_rmsprop_ar", "ROWWISE_RMSPROP_AR", "row_wise_rmsprop_ar",
     {StateWidth::kRowwise, StateWidth::kRowwise}, {"momentum1", "prev_iter"}, {"sum", "prev_iter"},
     "float eps=0.0, float ar_alpha=0.0, int iter=1, float ema_beta=0.99, float min_shrinkage=0.1",
     false, 0, true, true},
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
