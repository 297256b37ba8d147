// ATen adapters of the layer family (docs/ops.md section 8): the counter-based dropout and the
// fused input projection and output of an HSTU / FuXi-alpha layer. Validate, allocate, dispatch to
// kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace recops::layer {

// The seed is a one-element int64 tensor (drawn from torch's generator, in a compiled graph too).
// x with element (r, j) of its [numel / last dim, last dim] rows kept iff the counter hash of
// (seed, offset, r, j) says so, kept values scaled by 1 / (1 - p). Its own gradient: the
// backward calls it on grad_output with the same key.
at::Tensor counter_dropout(const at::Tensor& x, double p, const at::Tensor& seed, int64_t offset);

// silu(norm(x) weight + bias), norm "layer_norm" or "rms_norm" (no affine): a layer's input
// projection, weight [x.size(1), width], as the column pieces of split (sizes summing to width;
// empty: one piece), each a tensor of its own (a layer's u, v, q, k).
std::vector<at::Tensor> hstu_layer_input(const at::Tensor& x, const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias,
                                         std::string_view norm, double eps, c10::IntArrayRef split);

// (grad_x, grad_weight, grad_bias) from the gradients of the output's pieces.
std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> hstu_layer_input_backward(
    at::TensorList grad_output, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, std::string_view norm, double eps,
    c10::IntArrayRef split);

// dropout(scale * x + position_weight[positions]) (x [rows, cols], positions [rows] int64): a
// sequence model's input features, its dropout counter_dropout's for [rows, cols] with the same
// seed and offset.
at::Tensor positional_input_features(const at::Tensor& x, const at::Tensor& positions,
                                     const at::Tensor& position_weight, double scale,
                                     double dropout_p, const std::optional<at::Tensor>& seed,
                                     int64_t offset);

// (grad_x, grad_position_weight).
std::tuple<at::Tensor, at::Tensor> positional_input_features_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& positions,
    const at::Tensor& position_weight, double scale, double dropout_p,
    const std::optional<at::Tensor>& seed, int64_t offset);

// x / max(|x|, eps) row by row (x [rows, cols]), as F.normalize(x, dim=-1, eps=eps).
at::Tensor l2_normalize(const at::Tensor& x, double eps);

// grad_x.
at::Tensor l2_normalize_backward(const at::Tensor& grad_output, const at::Tensor& x, double eps);

// x + dropout(u * norm(attn)) weight^T + bias, norm "layer_norm" or "rms_norm" (no affine).
at::Tensor hstu_layer_output(const at::Tensor& x, const at::Tensor& u, const at::Tensor& attn,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             std::string_view norm, double eps, double dropout_p,
                             const std::optional<at::Tensor>& seed, int64_t offset);

// (grad_u, grad_attn, grad_weight, grad_bias); x's gradient is grad_output.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>>
hstu_layer_output_backward(const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& u,
                           const at::Tensor& attn, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, std::string_view norm, double eps,
                           double dropout_p, const std::optional<at::Tensor>& seed, int64_t offset);

// x + (silu(h gate^T) * (h up^T)) down^T with h = dropout(norm(x)): FuXi-alpha's feed-forward
// stage (MFFN stage 2, SwiGLU); gate, up [hidden, D], down [D, hidden] (nn.Linear's weights).
at::Tensor fuxi_layer_ffn(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                          const at::Tensor& down, std::string_view norm, double eps,
                          double dropout_p, const std::optional<at::Tensor>& seed, int64_t offset);

// (grad_x, grad_gate, grad_up, grad_down); grad_x includes the residual's grad_output.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fuxi_layer_ffn_backward(
    const at::Tensor& grad_output, const at::Tensor& x, const at::Tensor& gate,
    const at::Tensor& up, const at::Tensor& down, std::string_view norm, double eps,
    double dropout_p, const std::optional<at::Tensor>& seed, int64_t offset);

}  // namespace recops::layer
