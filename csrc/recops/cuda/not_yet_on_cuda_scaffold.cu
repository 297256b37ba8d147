// Compile-only scaffolding of the CUDA backend: nothing in this file has run on a GPU, and it holds
// no device code. It registers, for the CUDA dispatch key, a kernel that raises NotImplementedError
// naming the op for every op whose family has no CUDA kernel yet (the TBE and the attention
// families: later slices of the CUDA backend), instead of the dispatcher's generic "could not run
// ... with arguments from the 'CUDA' backend". It is also the translation unit through which CI
// proves that a CUDA build of recops (nvcc + a CUDA torch) compiles and links.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace recops {
namespace {

void no_cuda_kernel_yet(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(),
                              " has no CUDA kernel yet (recops' TBE and attention ops run on CPU "
                              "only for now): pass CPU tensors");
}

}  // namespace
}  // namespace recops

TORCH_LIBRARY_IMPL(recops, CUDA, m) {
  for (const char* name : {
           "hstu_dense_forward",
           "hstu_dense_backward",
           "hstu_dense_forward_fuxi",
           "hstu_dense_backward_fuxi",
           "relative_attn_bias_time_forward",
           "relative_attn_bias_pos",
           "relative_attn_bias_backward",
           "disentangled_attention",
           "disentangled_attention_backward",
           "bounds_check_indices",
           "split_embedding_codegen_forward",
           "split_embedding_codegen_grad_indice_weights",
           "split_embedding_codegen_lookup_sgd_function",
           "split_embedding_codegen_lookup_adagrad_function",
           "split_embedding_codegen_lookup_rowwise_adagrad_function",
           "backward_codegen_sgd_weighted_exact",
           "backward_codegen_sgd_unweighted_exact",
           "backward_codegen_adagrad_weighted_exact",
           "backward_codegen_adagrad_unweighted_exact",
           "backward_codegen_rowwise_adagrad_weighted_exact",
           "backward_codegen_rowwise_adagrad_unweighted_exact",
           "split_embedding_codegen_lookup_adam_function",
           "split_embedding_codegen_lookup_partial_rowwise_adam_function",
           "backward_codegen_adam_weighted_exact",
           "backward_codegen_adam_unweighted_exact",
           "backward_codegen_partial_rowwise_adam_weighted_exact",
           "backward_codegen_partial_rowwise_adam_unweighted_exact",
       }) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&recops::no_cuda_kernel_yet>());
  }
}
