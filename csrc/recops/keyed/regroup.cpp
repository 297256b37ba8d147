// kt_regroup_arguments and regroup_keyed_tensor (FBGEMM's schemas): keyed tensors described by
// their keys and per-key widths (lengths), regrouped into `groups` (kernels/regroup_plan.h).
// Widths are int32 in FBGEMM's permutes: every offset and width must fit, never wrap.
#include <ATen/ops/empty.h>

#include <cstring>
#include <limits>
#include <string>

#include "recops/common/checks.h"
#include "recops/keyed/kernels/regroup_plan.h"
#include "recops/keyed/ops.h"
#include "recops/keyed/segments.h"

namespace recops::keyed {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

kernels::RegroupPlan checked_plan(const std::vector<std::vector<std::string>>& keys,
                                  const std::vector<std::vector<int64_t>>& lengths,
                                  const std::vector<std::vector<std::string>>& groups) {
  TORCH_CHECK_VALUE(keys.size() == lengths.size(), "keys and lengths must describe as many keyed ",
                    "tensors, got ", keys.size(), " and ", lengths.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    TORCH_CHECK_VALUE(keys[i].size() == lengths[i].size(), "keys[", i, "] and lengths[", i,
                      "] must have one entry per key, got ", keys[i].size(), " and ",
                      lengths[i].size());
    int64_t width = 0;
    for (size_t k = 0; k < lengths[i].size(); ++k) {
      TORCH_CHECK_VALUE(lengths[i][k] >= 0, "lengths[", i, "][", k, "] must be >= 0, got ",
                        lengths[i][k]);
      TORCH_CHECK_VALUE(lengths[i][k] <= kInt32Max - width, "lengths[", i,
                        "] must sum to at most 2^31 - 1 (int32 offsets), exceeded at lengths[", i,
                        "][", k, "] = ", lengths[i][k]);
      width += lengths[i][k];
    }
  }
  kernels::RegroupPlan plan;
  const kernels::UnknownKey unknown = kernels::plan_regroup(keys, lengths, groups, plan);
  TORCH_CHECK_INDEX(unknown.group < 0, "groups[", unknown.group, "][", unknown.position, "] = '",
                    unknown.group < 0 ? "" : groups[unknown.group][unknown.position],
                    "' is not one of the keys");
  for (size_t j = 0; j < plan.output_widths.size(); ++j) {
    TORCH_CHECK_VALUE(plan.output_widths[j] <= kInt32Max, "groups[", j,
                      "] must have widths (lengths) summing to at most 2^31 - 1, got ",
                      plan.output_widths[j]);
  }
  const auto num_moves = static_cast<int64_t>(plan.moves.size()) / kernels::kMoveFields;
  TORCH_CHECK_VALUE(num_moves <= kInt32Max, "groups must name at most 2^31 - 1 keys, got ",
                    num_moves);
  return plan;
}

at::Tensor int32_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kInt));
  int32_t* out = t.mutable_data_ptr<int32_t>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<int32_t>(values[i]);
  return t;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<int64_t>> kt_regroup_arguments(
    const at::Tensor& /*embs*/, const std::vector<std::vector<std::string>>& keys,
    const std::vector<std::vector<int64_t>>& lengths,
    const std::vector<std::vector<std::string>>& groups) {
  const kernels::RegroupPlan plan = checked_plan(keys, lengths, groups);
  const auto num_moves = static_cast<int64_t>(plan.moves.size()) / kernels::kMoveFields;
  return {int32_tensor(plan.moves, {num_moves, kernels::kMoveFields}),
          int32_tensor(plan.input_widths, {static_cast<int64_t>(plan.input_widths.size())}),
          int32_tensor(plan.output_widths, {static_cast<int64_t>(plan.output_widths.size())}),
          plan.output_widths};
}

std::vector<at::Tensor> regroup_keyed_tensor(at::TensorList pooled_embs,
                                             const std::vector<std::vector<std::string>>& keys,
                                             const std::vector<std::vector<int64_t>>& lengths,
                                             const std::vector<std::vector<std::string>>& groups) {
  const std::vector<at::Tensor> inputs = checked_pooled(pooled_embs, "pooled_embs");
  const kernels::RegroupPlan plan = checked_plan(keys, lengths, groups);
  TORCH_CHECK(keys.size() == inputs.size(), "keys must have one entry per tensor of pooled_embs (",
              inputs.size(), "), got ", keys.size());
  const auto num_moves = static_cast<int64_t>(plan.moves.size()) / kernels::kMoveFields;
  std::vector<kernels::Segment> segments(num_moves);
  int64_t m = 0;
  for (size_t j = 0; j < groups.size(); ++j) {
    for (size_t k = 0; k < groups[j].size(); ++k, ++m) {
      const int64_t* move = plan.moves.data() + m * kernels::kMoveFields;
      segments[m] = {move[0], move[1], move[2], move[3], move[4], false};
      check_segment(segments[m], inputs, "pooled_embs", plan.output_widths,
                    "groups[" + std::to_string(j) + "][" + std::to_string(k) + "] ('" +
                        groups[j][k] + "', per keys and lengths)");
    }
  }
  return run_segments(inputs, segments, plan.output_widths);
}

}  // namespace recops::keyed
