// Schemas and kernel registrations of the embedding family in torch.ops.recops (docs/ops.md section
// 7). Per optimizer (sgd, adagrad, rowwise_adagrad, adam, partial_rowwise_adam, lamb,
// partial_rowwise_lamb):
//   split_embedding_codegen_lookup_<opt>_function   forward lookup; recops/embedding/ops.py binds
//   its
//                                                   autograd formula to the fused backward below
//   backward_codegen_<opt>_{unweighted,weighted}_exact   backward + optimizer step, in place
// plus the plain forward, the per-sample-weight gradient, the bounds check and checked index
// narrowing they build on, and the huge-page-backed buffers the module keeps tables and optimizer
// state in. The lookup and update kernels read their arguments by name (common/named_args.h), so
// one kernel serves every optimizer's schema. Fake kernels and autograd are registered from Python
// (recops/embedding/ops.py).
#include <torch/library.h>

#include <string>

#include "recops/common/named_args.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

using kernels::Optimizer;

// FBGEMM's schemas, one per line. The lookup only reads the optimizer state; its autograd
// backward (an update op) writes it.
// clang-format off
constexpr const char* kLookupAndUpdateSchemas[] = {
    "split_embedding_codegen_lookup_sgd_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor learning_rate_tensor, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_sgd_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor learning_rate_tensor, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_sgd_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor learning_rate_tensor, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_adagrad_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_adagrad_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_adagrad_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_rowwise_adagrad_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_rowwise_adagrad_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_rowwise_adagrad_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor learning_rate_tensor, float eps=0.0, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_adam_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_adam_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_adam_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_partial_rowwise_adam_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_partial_rowwise_adam_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_partial_rowwise_adam_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_lamb_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_lamb_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_lamb_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "split_embedding_codegen_lookup_partial_rowwise_lamb_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor? indice_weights, Tensor? feature_requires_grad, Tensor momentum1, Tensor momentum1_offsets, Tensor momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0, int output_dtype=0) -> Tensor",
    "backward_codegen_partial_rowwise_lamb_unweighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
    "backward_codegen_partial_rowwise_lamb_weighted_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, Tensor indice_weights, Tensor(b!) momentum1, Tensor momentum1_offsets, Tensor(c!) momentum2, Tensor momentum2_offsets, Tensor learning_rate_tensor, float eps=0.0, float beta1=0.9, float beta2=0.999, int iter=1, float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, float max_gradient=1.0) -> ()",
};
// clang-format on

// Every lookup and update also takes FBGEMM's variable batch size per feature (see
// embedding/batch.h), appended as trailing arguments: the lookup also needs the flat output's size
// to allocate it without reading the batch sizes (fake kernels cannot).
std::string with_variable_batch(const char* schema) {
  std::string s = schema;
  const bool lookup = s.rfind("-> Tensor") != std::string::npos;
  const size_t close = s.rfind(") ->");
  s.insert(close, lookup ? ", Tensor? batch_size_per_feature_per_rank=None, "
                           "SymInt vbe_output_size=-1"
                         : ", Tensor? batch_size_per_feature_per_rank=None");
  return s;
}

// The optimizer state and hyper-parameters a schema declares (SGD's declare none).
OptimizerState read_optimizer_state(const NamedArgs& args) {
  OptimizerState state;
  state.momentum1 = args.optional_tensor("momentum1");
  state.momentum1_offsets = args.optional_tensor("momentum1_offsets");
  state.momentum2 = args.optional_tensor("momentum2");
  state.momentum2_offsets = args.optional_tensor("momentum2_offsets");
  if (args.has("eps")) state.eps = args.real("eps");
  if (args.has("iter")) {
    state.beta1 = args.real("beta1");
    state.beta2 = args.real("beta2");
    state.iter = args.integer("iter");
  }
  return state;
}

void lookup_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  at::Tensor out = split_embedding_codegen_forward(
      args.tensor("weights"), args.tensor("weights_offsets"), args.tensor("D_offsets"),
      args.integer("total_D"), args.integer("max_D"), args.tensor("rows_per_table"),
      args.tensor("indices"), args.tensor("offsets"), args.integer("pooling_mode"),
      args.optional_tensor("indice_weights"), args.integer("output_dtype"),
      args.optional_tensor("batch_size_per_feature_per_rank"), args.integer("vbe_output_size"));
  return_result(op, stack, std::move(out));
}

// indice_weights is declared by the weighted updates only.
template <Optimizer kOptimizer>
void update_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const NamedArgs args(op, *stack);
  backward_exact(kOptimizer, args.tensor("grad_output"), args.tensor("weights"),
                 args.tensor("weights_offsets"), args.tensor("D_offsets"),
                 args.tensor("rows_per_table"), args.tensor("indices"), args.tensor("offsets"),
                 args.integer("pooling_mode"), args.optional_tensor("indice_weights"),
                 read_optimizer_state(args), args.tensor("learning_rate_tensor"),
                 args.real("weight_decay"), args.integer("weight_decay_mode"),
                 args.flag("gradient_clipping"), args.real("max_gradient"),
                 args.optional_tensor("batch_size_per_feature_per_rank"));
  return_nothing(op, stack);
}

template <Optimizer kOptimizer>
void register_optimizer(torch::Library& m, const std::string& name) {
  m.impl(("split_embedding_codegen_lookup_" + name + "_function").c_str(), boxed<&lookup_kernel>());
  for (const char* weighting : {"_weighted", "_unweighted"}) {
    m.impl(("backward_codegen_" + name + weighting + "_exact").c_str(),
           boxed<&update_kernel<kOptimizer>>());
  }
}

}  // namespace
}  // namespace recops::embedding

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module(
      "recops.embedding.ops");  // where the fake kernels and autograd are registered
  using namespace recops::embedding;
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def("embedding_host_zeros(SymInt numel, ScalarType dtype) -> Tensor", pt2);
  m.def("index_to_int32(Tensor t, str name) -> Tensor", pt2);
  m.def(
      "bounds_check_indices(Tensor rows_per_table, Tensor(a!) indices, Tensor(b!) offsets, "
      "int bounds_check_mode, Tensor(c!) warning, "
      "Tensor? batch_size_per_feature_per_rank=None) -> ()",
      pt2);
  m.def(
      "split_embedding_codegen_forward(Tensor weights, Tensor weights_offsets, Tensor D_offsets, "
      "SymInt total_D, SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, "
      "int pooling_mode, Tensor? indice_weights=None, int output_dtype=0, "
      "Tensor? batch_size_per_feature_per_rank=None, SymInt vbe_output_size=-1) -> Tensor",
      pt2);
  m.def(
      "split_embedding_codegen_grad_indice_weights(Tensor grad_output, Tensor weights, "
      "Tensor weights_offsets, Tensor D_offsets, Tensor rows_per_table, Tensor indices, "
      "Tensor offsets, int pooling_mode, Tensor? feature_requires_grad=None, "
      "bool gradient_clipping=False, float max_gradient=1.0, "
      "Tensor? batch_size_per_feature_per_rank=None) -> Tensor",
      pt2);
  for (const char* schema : kLookupAndUpdateSchemas)
    m.def(with_variable_batch(schema).c_str(), pt2);
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
  register_optimizer<Optimizer::kSgd>(m, "sgd");
  register_optimizer<Optimizer::kAdagrad>(m, "adagrad");
  register_optimizer<Optimizer::kRowwiseAdagrad>(m, "rowwise_adagrad");
  register_optimizer<Optimizer::kAdam>(m, "adam");
  register_optimizer<Optimizer::kPartialRowwiseAdam>(m, "partial_rowwise_adam");
  register_optimizer<Optimizer::kLamb>(m, "lamb");
  register_optimizer<Optimizer::kPartialRowwiseLamb>(m, "partial_rowwise_lamb");
}
