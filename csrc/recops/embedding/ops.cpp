// Schemas and kernel registrations of the embedding family in torch.ops.recops (docs/ops.md section
// 7). Per optimizer of kernels/optimizer_table.h (schemas composed from its row):
//   split_embedding_codegen_lookup_<opt>_function   forward lookup; recops/embedding/ops.py binds
//   its
//                                                   autograd formula to the fused backward below
//   backward_codegen_<opt>_{unweighted,weighted}_exact   backward + optimizer step, in place
// plus FBGEMM's quantized inference lookup (int_nbit_split_embedding_codegen_lookup_function),
// the plain forward, the per-sample-weight gradient, the bounds check and checked index
// narrowing they build on, and the huge-page-backed buffers the module keeps tables and optimizer
// state in. The lookup and update kernels read their arguments by name (common/named_args.h), so
// one kernel serves every optimizer's schema; tbe_optimizer_table() hands the table to Python.
// Fake kernels and autograd are registered from Python (recops/embedding/ops.py).
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

#include "recops/common/named_args.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

using kernels::Optimizer;

// Each optimizer's lookup and update schemas, composed from its row of kOptimizerTable: the
// shared arguments, then its state buffers (momentum1, momentum2: mutable in the updates) and its
// hyper-parameters after learning_rate_tensor. The lookup only reads the optimizer state; its
// autograd backward (an update op) writes it.
std::string state_arguments(const kernels::OptimizerRow& row, bool updated) {
  std::string text;
  for (int k = 0; k < kernels::kMaxStates; ++k) {
    if (row.state[k] == kernels::StateWidth::kUnused) continue;
    const std::string name = row.buffers[k];
    // Alias sets b, c, ...: weights are a.
    const std::string alias = updated ? std::string("(") + static_cast<char>('b' + k) + "!)" : "";
    text += "Tensor" + alias + " " + name + ", Tensor " + name + "_offsets, ";
  }
  return text;
}

std::string hyper_parameters(const kernels::OptimizerRow& row) {
  return *row.hyper_parameters == '\0' ? "" : std::string(row.hyper_parameters) + ", ";
}

constexpr const char* kWeightDecayAndClipping =
    "float weight_decay=0.0, int weight_decay_mode=0, bool gradient_clipping=False, "
    "float max_gradient=1.0";
// FBGEMM's variable batch size per feature (see embedding/batch.h), last in every lookup and
// update; the lookup also takes the flat output's size, which its fake kernel cannot compute.
constexpr const char* kVariableBatch = ", Tensor? batch_size_per_feature_per_rank=None";

std::string lookup_schema(const kernels::OptimizerRow& row) {
  return std::string("split_embedding_codegen_lookup_") + row.name +
         "_function(Tensor weights, Tensor weights_offsets, Tensor D_offsets, SymInt total_D, "
         "SymInt max_D, Tensor rows_per_table, Tensor indices, Tensor offsets, int pooling_mode, "
         "Tensor? indice_weights, Tensor? feature_requires_grad, " +
         state_arguments(row, false) + "Tensor learning_rate_tensor, " + hyper_parameters(row) +
         kWeightDecayAndClipping + ", int output_dtype=0" + kVariableBatch +
         ", SymInt vbe_output_size=-1) -> Tensor";
}

std::string update_schema(const kernels::OptimizerRow& row, bool weighted) {
  return std::string("backward_codegen_") + row.name + (weighted ? "_weighted" : "_unweighted") +
         "_exact(Tensor grad_output, Tensor(a!) weights, Tensor weights_offsets, "
         "Tensor D_offsets, Tensor rows_per_table, Tensor indices, Tensor offsets, "
         "int pooling_mode, " +
         (weighted ? "Tensor indice_weights, " : "") + state_arguments(row, true) +
         "Tensor learning_rate_tensor, " + hyper_parameters(row) + kWeightDecayAndClipping +
         kVariableBatch + ") -> ()";
}

// The names of a row's hyper_parameters ("float eps=0.0, int iter=1" -> eps, iter).
std::vector<std::string> hyper_parameter_names(const kernels::OptimizerRow& row) {
  std::vector<std::string> names;
  const std::string text = row.hyper_parameters;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find(", ", begin);
    if (end == std::string::npos) end = text.size();
    const std::string declaration = text.substr(begin, end - begin);  // "<type> <name>=<default>"
    const size_t name_begin = declaration.find(' ') + 1;
    names.push_back(declaration.substr(name_begin, declaration.find('=') - name_begin));
    begin = end + 2;
  }
  return names;
}

// kOptimizerTable for Python (recops/embedding/optimizers.py), as JSON: one object per row.
std::string tbe_optimizer_table() {
  const auto quoted = [](const char* text) { return std::string("\"") + text + "\""; };
  std::string json = "[";
  for (const kernels::OptimizerRow& row : kernels::kOptimizerTable) {
    if (json.size() > 1) json += ", ";
    std::string states;
    for (int k = 0; k < kernels::kMaxStates; ++k) {
      if (row.state[k] == kernels::StateWidth::kUnused) continue;
      if (!states.empty()) states += ", ";
      const bool rowwise = row.state[k] == kernels::StateWidth::kRowwise;
      states += std::string("[") + quoted(rowwise ? "rowwise" : "elementwise") + ", " +
                quoted(row.buffers[k]) + ", " + quoted(row.state_names[k]) + "]";
    }
    std::string hyper_parameters;
    for (const std::string& name : hyper_parameter_names(row)) {
      if (!hyper_parameters.empty()) hyper_parameters += ", ";
      hyper_parameters += quoted(name.c_str());
    }
    json += std::string("{\"name\": ") + quoted(row.name) +
            ", \"optim_type\": " + quoted(row.optim_type) +
            ", \"optim_type_value\": " + quoted(row.optim_type_value) + ", \"states\": [" + states +
            "], \"hyper_parameters\": [" + hyper_parameters +
            "], \"bias_corrected\": " + (row.bias_corrected ? "true" : "false") +
            ", \"weight_decay_mode\": " + std::to_string(row.weight_decay_mode) +
            ", \"decays_in_update\": " + (row.decays_in_update ? "true" : "false") +
            ", \"max_weight_decay_mode\": " + std::to_string(row.max_weight_decay_mode) +
            ", \"fbgemm_cpu\": " + (row.fbgemm_cpu ? "true" : "false") + "}";
  }
  return json + "]";
}

// The optimizer state buffers of `row` and the hyper-parameters its schemas declare (the others
// keep OptimizerState's defaults).
OptimizerState read_optimizer_state(const NamedArgs& args, const kernels::OptimizerRow& row) {
  OptimizerState state;
  for (int k = 0; k < kernels::kMaxStates; ++k) {
    if (row.state[k] == kernels::StateWidth::kUnused) continue;
    state.buffers[k] = args.optional_tensor(row.buffers[k]);
    state.offsets[k] = args.optional_tensor(std::string(row.buffers[k]) + "_offsets");
  }
  for (auto [name, field] : {std::pair{"eps", &state.eps},
                             {"beta1", &state.beta1},
                             {"beta2", &state.beta2},
                             {"ar_alpha", &state.ar_alpha},
                             {"ema_beta", &state.ema_beta},
                             {"min_shrinkage", &state.min_shrinkage},
                             {"adjustment_ub", &state.adjustment_ub},
                             {"max_counter", &state.max_counter},
                             {"tail_id_threshold", &state.tail_id_threshold},
                             {"weight_norm_coefficient", &state.weight_norm_coefficient},
                             {"lower_bound", &state.lower_bound}}) {
    if (args.has(name)) *field = args.real(name);
  }
  for (auto [name, field] : {std::pair{"iter", &state.iter},
                             {"counter_halflife", &state.counter_halflife},
                             {"adjustment_iter", &state.adjustment_iter},
                             {"learning_rate_mode", &state.learning_rate_mode},
                             {"is_tail_id_thresh_ratio", &state.is_tail_id_thresh_ratio},
                             {"regularization_mode", &state.regularization_mode}}) {
    if (args.has(name)) *field = args.integer(name);
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
                 read_optimizer_state(args, kernels::optimizer_row(kOptimizer)),
                 args.tensor("learning_rate_tensor"), args.real("weight_decay"),
                 args.integer("weight_decay_mode"), args.flag("gradient_clipping"),
                 args.real("max_gradient"),
                 args.optional_tensor("batch_size_per_feature_per_rank"));
  return_nothing(op, stack);
}

void define_optimizers(torch::Library& m, const std::vector<at::Tag>& tags) {
  for (const kernels::OptimizerRow& row : kernels::kOptimizerTable) {
    m.def(lookup_schema(row).c_str(), tags);
    for (const bool weighted : {false, true}) m.def(update_schema(row, weighted).c_str(), tags);
  }
}

template <int kRow>
void register_optimizer(torch::Library& m) {
  const std::string name = kernels::kOptimizerTable[kRow].name;
  m.impl(("split_embedding_codegen_lookup_" + name + "_function").c_str(), boxed<&lookup_kernel>());
  for (const char* weighting : {"_weighted", "_unweighted"}) {
    m.impl(("backward_codegen_" + name + weighting + "_exact").c_str(),
           boxed<&update_kernel<static_cast<Optimizer>(kRow)>>());
  }
}

template <int... kRows>
void register_optimizers(torch::Library& m, std::integer_sequence<int, kRows...>) {
  (register_optimizer<kRows>(m), ...);
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
      "int bounds_check_mode, Tensor(c!) warning, Tensor(d!)? weights=None, "
      "Tensor? B_offsets=None, SymInt max_B=-1, Tensor? b_t_map=None, int info_B_num_bits=-1, "
      "int info_B_mask=-1, int bounds_check_version=1, bool prefetch_pipeline=False) -> ()",
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
  define_optimizers(m, pt2);
  m.def(
      "int_nbit_split_embedding_codegen_lookup_function(Tensor dev_weights, Tensor uvm_weights, "
      "Tensor weights_placements, Tensor weights_offsets, Tensor weights_tys, Tensor D_offsets, "
      "SymInt total_D, int max_int2_D, int max_int4_D, int max_int8_D, int max_float16_D, "
      "int max_float32_D, Tensor indices, Tensor offsets, int pooling_mode, "
      "Tensor? indice_weights, int output_dtype=1, Tensor? lxu_cache_weights=None, "
      "Tensor? lxu_cache_locations=None, int? row_alignment=None, int? max_float8_D=0, "
      "int? fp8_exponent_bits=-1, int? fp8_exponent_bias=-1) -> Tensor",
      pt2);
  // The optimizer table as JSON (recops/embedding/optimizers.py reads it): no tensor argument,
  // so a catch-all kernel.
  m.def("tbe_optimizer_table() -> str", TORCH_FN(tbe_optimizer_table));
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
  m.impl("int_nbit_split_embedding_codegen_lookup_function",
         TORCH_FN(int_nbit_split_embedding_codegen_lookup_function));
  register_optimizers(m, std::make_integer_sequence<int, kernels::kNumOptimizers>{});
}
