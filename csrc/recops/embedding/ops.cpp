// Schemas and kernel registrations of the embedding family in torch.ops.recops (docs/ops.md section
// 7). Per optimizer (sgd, adagrad, rowwise_adagrad, adam, partial_rowwise_adam):
//   split_embedding_codegen_lookup_<opt>_function   forward lookup; recops/embedding.py binds its
//                                                   autograd formula to the fused backward below
//   backward_codegen_<opt>_{unweighted,weighted}_exact   backward + optimizer step, in place
// plus the plain forward, the per-sample-weight gradient, the bounds check and checked index
// narrowing they build on, and the huge-page-backed buffers the module keeps tables and optimizer
// state in. Fake kernels and autograd are registered from Python (recops/embedding.py).
#include <torch/library.h>

#include <string>

#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

using kernels::Optimizer;

// Schema fragments shared by the ops.
constexpr const char* kTables = "Tensor weights_offsets, Tensor D_offsets, ";
constexpr const char* kBatch = "Tensor rows_per_table, Tensor indices, Tensor offsets, ";
constexpr const char* kHyper =
    "float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, "
    "float max_gradient=1.0";

struct OptimizerSchema {
  const char* name;
  const char* state;  // optimizer-state arguments, between the batch and the learning rate
  const char* eps;
};

constexpr const char* kMomentum1 = "Tensor(b!) momentum1, Tensor momentum1_offsets, ";
constexpr const char* kMomenta =
    "Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, "
    "Tensor momentum2_offsets, ";
constexpr const char* kAdamHyper =
    "float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, ";

constexpr OptimizerSchema kOptimizers[] = {
    {"sgd", "", ""},
    {"adagrad", kMomentum1, "float eps=0.0, "},
    {"rowwise_adagrad", kMomentum1, "float eps=0.0, "},
    {"adam", kMomenta, kAdamHyper},
    {"partial_rowwise_adam", kMomenta, kAdamHyper},
};

// The lookup function only reads the optimizer state; its autograd backward updates it.
std::string without_alias(std::string s) {
  for (const std::string alias : {"(b!)", "(c!)"}) {
    for (size_t at = s.find(alias); at != std::string::npos; at = s.find(alias)) {
      s.erase(at, alias.size());
    }
  }
  return s;
}

std::string backward_schema(const OptimizerSchema& opt, bool weighted) {
  return std::string("backward_codegen_") + opt.name + (weighted ? "_weighted" : "_unweighted") +
         "_exact(Tensor grad_output, Tensor(a!) weights, " + kTables + kBatch +
         "int pooling_mode, " + (weighted ? "Tensor indice_weights, " : "") + opt.state +
         "Tensor learning_rate_tensor, " + opt.eps + kHyper + ") -> ()";
}

std::string lookup_schema(const OptimizerSchema& opt) {
  return std::string("split_embedding_codegen_lookup_") + opt.name + "_function(Tensor weights, " +
         kTables + "SymInt total_D, SymInt max_D, " + kBatch +
         "int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, " +
         without_alias(opt.state) + "Tensor learning_rate_tensor, " + opt.eps + kHyper +
         ", int output_dtype=0) -> Tensor";
}

// Kernels with each schema's exact signature, forwarding to the shared adapters.
template <Optimizer kOptimizer>
void backward_stateless(const at::Tensor& grad_output, const at::Tensor& weights,
                        const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                        const at::Tensor& rows_per_table, const at::Tensor& indices,
                        const at::Tensor& offsets, int64_t pooling_mode,
                        const std::optional<at::Tensor>& indice_weights,
                        const at::Tensor& learning_rate_tensor, double weight_decay,
                        int64_t weight_decay_mode, bool gradient_clipping, double max_gradient) {
  backward_exact(kOptimizer, grad_output, weights, weights_offsets, D_offsets, rows_per_table,
                 indices, offsets, pooling_mode, indice_weights, OptimizerState{},
                 learning_rate_tensor, weight_decay, weight_decay_mode, gradient_clipping,
                 max_gradient);
}

template <Optimizer kOptimizer>
void backward_stateful(const at::Tensor& grad_output, const at::Tensor& weights,
                       const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                       const at::Tensor& rows_per_table, const at::Tensor& indices,
                       const at::Tensor& offsets, int64_t pooling_mode,
                       const std::optional<at::Tensor>& indice_weights, const at::Tensor& momentum1,
                       const at::Tensor& momentum1_offsets, const at::Tensor& learning_rate_tensor,
                       double eps, double weight_decay, int64_t weight_decay_mode,
                       bool gradient_clipping, double max_gradient) {
  backward_exact(
      kOptimizer, grad_output, weights, weights_offsets, D_offsets, rows_per_table, indices,
      offsets, pooling_mode, indice_weights,
      OptimizerState{momentum1, momentum1_offsets, eps, std::nullopt, std::nullopt, 0, 0, 0},
      learning_rate_tensor, weight_decay, weight_decay_mode, gradient_clipping, max_gradient);
}

template <Optimizer kOptimizer>
void backward_adam(const at::Tensor& grad_output, const at::Tensor& weights,
                   const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                   const at::Tensor& rows_per_table, const at::Tensor& indices,
                   const at::Tensor& offsets, int64_t pooling_mode,
                   const std::optional<at::Tensor>& indice_weights, const at::Tensor& momentum1,
                   const at::Tensor& momentum1_offsets, const at::Tensor& momentum2,
                   const at::Tensor& momentum2_offsets, const at::Tensor& learning_rate_tensor,
                   double eps, double beta1, double beta2, int64_t iter, double weight_decay,
                   int64_t weight_decay_mode, bool gradient_clipping, double max_gradient) {
  backward_exact(kOptimizer, grad_output, weights, weights_offsets, D_offsets, rows_per_table,
                 indices, offsets, pooling_mode, indice_weights,
                 OptimizerState{momentum1, momentum1_offsets, eps, momentum2, momentum2_offsets,
                                beta1, beta2, iter},
                 learning_rate_tensor, weight_decay, weight_decay_mode, gradient_clipping,
                 max_gradient);
}

// The schemas' kernels around a backward above: the weighted ones take indice_weights, the
// unweighted ones lack it.
template <auto kBackward, typename... Rest>
struct Bound {
  static void weighted(const at::Tensor& grad_output, const at::Tensor& weights,
                       const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                       const at::Tensor& rows_per_table, const at::Tensor& indices,
                       const at::Tensor& offsets, int64_t pooling_mode,
                       const at::Tensor& indice_weights, Rest... rest) {
    kBackward(grad_output, weights, weights_offsets, D_offsets, rows_per_table, indices, offsets,
              pooling_mode, indice_weights, rest...);
  }
  static void unweighted(const at::Tensor& grad_output, const at::Tensor& weights,
                         const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
                         const at::Tensor& rows_per_table, const at::Tensor& indices,
                         const at::Tensor& offsets, int64_t pooling_mode, Rest... rest) {
    kBackward(grad_output, weights, weights_offsets, D_offsets, rows_per_table, indices, offsets,
              pooling_mode, std::nullopt, rest...);
  }
};

template <auto kBackward, typename... Rest>
constexpr Bound<kBackward, Rest...> bind(void (*)(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, int64_t, const std::optional<at::Tensor>&, Rest...)) {
  return {};
}

constexpr auto kSgdBackward = &backward_stateless<Optimizer::kSgd>;
constexpr auto kAdagradBackward = &backward_stateful<Optimizer::kAdagrad>;
constexpr auto kRowwiseBackward = &backward_stateful<Optimizer::kRowwiseAdagrad>;
using SgdBackward = decltype(bind<kSgdBackward>(kSgdBackward));
using AdagradBackward = decltype(bind<kAdagradBackward>(kAdagradBackward));
using RowwiseBackward = decltype(bind<kRowwiseBackward>(kRowwiseBackward));
constexpr auto kAdamBackward = &backward_adam<Optimizer::kAdam>;
constexpr auto kPartialRowwiseAdamBackward = &backward_adam<Optimizer::kPartialRowwiseAdam>;
using AdamBackward = decltype(bind<kAdamBackward>(kAdamBackward));
using PartialRowwiseAdamBackward =
    decltype(bind<kPartialRowwiseAdamBackward>(kPartialRowwiseAdamBackward));

at::Tensor lookup_stateless(const at::Tensor& weights, const at::Tensor& weights_offsets,
                            const at::Tensor& D_offsets, int64_t total_D, int64_t max_D,
                            const at::Tensor& rows_per_table, const at::Tensor& indices,
                            const at::Tensor& offsets, int64_t pooling_mode,
                            const std::optional<at::Tensor>& indice_weights,
                            const std::optional<at::Tensor>& /*feature_requires_grad*/,
                            const at::Tensor& /*learning_rate_tensor*/, double /*weight_decay*/,
                            int64_t /*weight_decay_mode*/, bool /*gradient_clipping*/,
                            double /*max_gradient*/, int64_t output_dtype) {
  return split_embedding_codegen_forward(weights, weights_offsets, D_offsets, total_D, max_D,
                                         rows_per_table, indices, offsets, pooling_mode,
                                         indice_weights, output_dtype);
}

at::Tensor lookup_stateful(const at::Tensor& weights, const at::Tensor& weights_offsets,
                           const at::Tensor& D_offsets, int64_t total_D, int64_t max_D,
                           const at::Tensor& rows_per_table, const at::Tensor& indices,
                           const at::Tensor& offsets, int64_t pooling_mode,
                           const std::optional<at::Tensor>& indice_weights,
                           const std::optional<at::Tensor>& /*feature_requires_grad*/,
                           const at::Tensor& /*momentum1*/, const at::Tensor& /*momentum1_offsets*/,
                           const at::Tensor& /*learning_rate_tensor*/, double /*eps*/,
                           double /*weight_decay*/, int64_t /*weight_decay_mode*/,
                           bool /*gradient_clipping*/, double /*max_gradient*/,
                           int64_t output_dtype) {
  return split_embedding_codegen_forward(weights, weights_offsets, D_offsets, total_D, max_D,
                                         rows_per_table, indices, offsets, pooling_mode,
                                         indice_weights, output_dtype);
}

at::Tensor lookup_adam(const at::Tensor& weights, const at::Tensor& weights_offsets,
                       const at::Tensor& D_offsets, int64_t total_D, int64_t max_D,
                       const at::Tensor& rows_per_table, const at::Tensor& indices,
                       const at::Tensor& offsets, int64_t pooling_mode,
                       const std::optional<at::Tensor>& indice_weights,
                       const std::optional<at::Tensor>& /*feature_requires_grad*/,
                       const at::Tensor& /*momentum1*/, const at::Tensor& /*momentum1_offsets*/,
                       const at::Tensor& /*momentum2*/, const at::Tensor& /*momentum2_offsets*/,
                       const at::Tensor& /*learning_rate_tensor*/, double /*eps*/, double /*beta1*/,
                       double /*beta2*/, int64_t /*iter*/, double /*weight_decay*/,
                       int64_t /*weight_decay_mode*/, bool /*gradient_clipping*/,
                       double /*max_gradient*/, int64_t output_dtype) {
  return split_embedding_codegen_forward(weights, weights_offsets, D_offsets, total_D, max_D,
                                         rows_per_table, indices, offsets, pooling_mode,
                                         indice_weights, output_dtype);
}

}  // namespace
}  // namespace recops::embedding

TORCH_LIBRARY_FRAGMENT(recops, m) {
  using namespace recops::embedding;
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("embedding_host_zeros(SymInt numel, ScalarType dtype) -> Tensor", pt2);
  m.def("index_to_int32(Tensor t, str name) -> Tensor", pt2);
  m.def(
      "bounds_check_indices(Tensor rows_per_table, Tensor(a!) indices, Tensor(b!) offsets, "
      "int bounds_check_mode, Tensor(c!) warning) -> ()",
      pt2);
  m.def((std::string("split_embedding_codegen_forward(Tensor weights, ") + kTables +
         "SymInt total_D, SymInt max_D, " + kBatch +
         "int pooling_mode, Tensor? indice_weights=None, int output_dtype=0) -> Tensor")
            .c_str(),
        pt2);
  m.def((std::string("split_embedding_codegen_grad_indice_weights(Tensor grad_output, ") +
         "Tensor weights, " + kTables + kBatch +
         "int pooling_mode, Tensor? feature_requires_grad=None, bool gradient_clipping=False, "
         "float max_gradient=1.0) -> Tensor")
            .c_str(),
        pt2);
  for (const OptimizerSchema& opt : kOptimizers) {
    m.def(lookup_schema(opt).c_str(), pt2);
    m.def(backward_schema(opt, /*weighted=*/false).c_str(), pt2);
    m.def(backward_schema(opt, /*weighted=*/true).c_str(), pt2);
  }
}

// No tensor argument to dispatch on: the buffer is a CPU tensor by construction.
TORCH_LIBRARY_IMPL(recops, CompositeExplicitAutograd, m) {
  m.impl("embedding_host_zeros", TORCH_FN(recops::embedding::embedding_host_zeros));
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  using namespace recops::embedding;
  m.impl("bounds_check_indices", TORCH_FN(bounds_check_indices));
  m.impl("index_to_int32", TORCH_FN(index_to_int32));
  m.impl("split_embedding_codegen_forward", TORCH_FN(split_embedding_codegen_forward));
  m.impl("split_embedding_codegen_grad_indice_weights",
         TORCH_FN(split_embedding_codegen_grad_indice_weights));
  m.impl("split_embedding_codegen_lookup_sgd_function", TORCH_FN(lookup_stateless));
  m.impl("split_embedding_codegen_lookup_adagrad_function", TORCH_FN(lookup_stateful));
  m.impl("split_embedding_codegen_lookup_rowwise_adagrad_function", TORCH_FN(lookup_stateful));
  m.impl("backward_codegen_sgd_weighted_exact", TORCH_FN(SgdBackward::weighted));
  m.impl("backward_codegen_sgd_unweighted_exact", TORCH_FN(SgdBackward::unweighted));
  m.impl("backward_codegen_adagrad_weighted_exact", TORCH_FN(AdagradBackward::weighted));
  m.impl("backward_codegen_adagrad_unweighted_exact", TORCH_FN(AdagradBackward::unweighted));
  m.impl("backward_codegen_rowwise_adagrad_weighted_exact", TORCH_FN(RowwiseBackward::weighted));
  m.impl("backward_codegen_rowwise_adagrad_unweighted_exact",
         TORCH_FN(RowwiseBackward::unweighted));
  m.impl("split_embedding_codegen_lookup_adam_function", TORCH_FN(lookup_adam));
  m.impl("split_embedding_codegen_lookup_partial_rowwise_adam_function", TORCH_FN(lookup_adam));
  m.impl("backward_codegen_adam_weighted_exact", TORCH_FN(AdamBackward::weighted));
  m.impl("backward_codegen_adam_unweighted_exact", TORCH_FN(AdamBackward::unweighted));
  m.impl("backward_codegen_partial_rowwise_adam_weighted_exact",
         TORCH_FN(PartialRowwiseAdamBackward::weighted));
  m.impl("backward_codegen_partial_rowwise_adam_unweighted_exact",
         TORCH_FN(PartialRowwiseAdamBackward::unweighted));
}
