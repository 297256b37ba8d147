// permute_multi_embedding and permute_multi_embedding_function (FBGEMM's schemas): `permutes`
// holds one move per row, (in_tensor, out_tensor, in_offset, out_offset, length, next), int32.
// Forward, each move copies columns of pooled_embs[in_tensor] into output out_tensor. Reverse (the
// backward), the roles swap and a move whose `next` is negative adds into its target: the
// gradients of a feature used several times are summed. in_shapes and out_shapes are not read on
// CPU, as in FBGEMM.
#include <ATen/core/Tensor.h>

#include <string>

#include "recops/common/checks.h"
#include "recops/keyed/kernels/regroup_plan.h"
#include "recops/keyed/ops.h"
#include "recops/keyed/segments.h"

namespace recops::keyed {

std::vector<at::Tensor> permute_multi_embedding_function(
    at::TensorList pooled_embs, const at::Tensor& permutes, const at::Tensor& /*in_shapes*/,
    const at::Tensor& /*out_shapes*/, at::IntArrayRef out_lengths, bool reverse) {
  const std::vector<at::Tensor> inputs = checked_pooled(pooled_embs, "pooled_embs");
  check_cpu(permutes, "permutes");
  TORCH_CHECK(permutes.dim() == 2 && permutes.size(1) == kernels::kMoveFields &&
                  permutes.scalar_type() == at::kInt,
              "permutes must be int32 [moves, 6], got ", permutes.scalar_type(), " ",
              permutes.sizes());
  for (size_t j = 0; j < out_lengths.size(); ++j) {
    TORCH_CHECK_VALUE(out_lengths[j] >= 0, "out_lengths[", j, "] must be >= 0, got ",
                      out_lengths[j]);
  }
  const at::Tensor moves = permutes.contiguous();
  const int32_t* p = moves.const_data_ptr<int32_t>();
  const int64_t num_moves = moves.size(0);
  std::vector<kernels::Segment> segments(num_moves);
  for (int64_t m = 0; m < num_moves; ++m) {
    const int32_t* move = p + m * kernels::kMoveFields;
    kernels::Segment& s = segments[m];
    if (reverse) {
      s = {move[1], move[0], move[3], move[2], move[4], move[5] < 0};
    } else {
      s = {move[0], move[1], move[2], move[3], move[4], false};
    }
    check_segment(s, inputs, "pooled_embs", out_lengths, "permutes[" + std::to_string(m) + "]");
  }
  return run_segments(inputs, segments, out_lengths);
}

std::vector<at::Tensor> permute_multi_embedding(at::TensorList pooled_embs,
                                                const at::Tensor& permutes,
                                                const at::Tensor& in_shapes,
                                                const at::Tensor& out_shapes,
                                                at::IntArrayRef out_lengths) {
  return permute_multi_embedding_function(pooled_embs, permutes, in_shapes, out_shapes, out_lengths,
                                          /*reverse=*/false);
}

}  // namespace recops::keyed
