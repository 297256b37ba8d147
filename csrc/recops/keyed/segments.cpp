#include "recops/keyed/segments.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <utility>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"

namespace recops::keyed {
namespace {

// Whether the overwriting segments that target `output` cover all its `columns` columns.
bool covered(const std::vector<kernels::Segment>& segments, int64_t output, int64_t columns) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const kernels::Segment& s : segments) {
    if (s.target == output && !s.accumulate && s.width > 0) {
      spans.emplace_back(s.target_column, s.target_column + s.width);
    }
  }
  std::sort(spans.begin(), spans.end());
  int64_t reached = 0;
  for (const auto& [begin, end] : spans) {
    if (begin > reached) return false;
    reached = std::max(reached, end);
  }
  return reached >= columns;
}

}  // namespace

std::vector<at::Tensor> checked_pooled(at::TensorList tensors, const char* name) {
  TORCH_CHECK(!tensors.empty(), name, " must hold at least one tensor");
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
    check_cpu(t, label.c_str());
    check_dim(t, 2, label.c_str());
    float_kind(t.scalar_type(), label.c_str());
    if (i > 0) {
      check_same_dtype(t, label.c_str(), tensors[0], (std::string(name) + "[0]").c_str());
      TORCH_CHECK(t.size(0) == tensors[0].size(0), label, " must have as many rows as ", name,
                  "[0] (", tensors[0].size(0), "), got ", t.size(0));
    }
    contiguous.push_back(t.contiguous());
  }
  return contiguous;
}

void check_segment(const kernels::Segment& s, const std::vector<at::Tensor>& inputs,
                   const char* inputs_name, at::IntArrayRef out_lengths, const std::string& label) {
  const auto num_inputs = static_cast<int64_t>(inputs.size());
  const auto num_outputs = static_cast<int64_t>(out_lengths.size());
  TORCH_CHECK(s.source >= 0 && s.source < num_inputs, label, " reads tensor ", s.source,
              ", not one of the ", num_inputs, " tensors of ", inputs_name);
  TORCH_CHECK(s.target >= 0 && s.target < num_outputs, label, " writes output ", s.target,
              ", not one of the ", num_outputs, " of out_lengths");
  TORCH_CHECK(s.width >= 0, label, " has a negative length ", s.width);
  const int64_t in_columns = inputs[s.source].size(1);
  TORCH_CHECK(s.source_column >= 0 && s.source_column <= in_columns - s.width, label,
              " reads columns [", s.source_column, ", ", s.source_column + s.width, ") of ",
              inputs_name, "[", s.source, "], which has ", in_columns);
  TORCH_CHECK(s.target_column >= 0 && s.target_column <= out_lengths[s.target] - s.width, label,
              " writes columns [", s.target_column, ", ", s.target_column + s.width, ") of output ",
              s.target, ", which has out_lengths[", s.target, "] = ", out_lengths[s.target]);
}

std::vector<at::Tensor> run_segments(const std::vector<at::Tensor>& inputs,
                                     const std::vector<kernels::Segment>& segments,
                                     at::IntArrayRef out_lengths) {
  const int64_t rows = inputs[0].size(0);
  const at::TensorOptions options = inputs[0].options();
  std::vector<at::Tensor> outputs;
  outputs.reserve(out_lengths.size());
  for (size_t j = 0; j < out_lengths.size(); ++j) {
    const bool full = covered(segments, static_cast<int64_t>(j), out_lengths[j]);
    outputs.push_back(full ? at::empty({rows, out_lengths[j]}, options)
                           : at::zeros({rows, out_lengths[j]}, options));
  }
  dispatch_float_kind(float_kind(inputs[0].scalar_type(), "pooled_embs"), [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    std::vector<kernels::Rows<const scalar_t>> in;
    for (const at::Tensor& t : inputs) in.push_back({data_as<scalar_t>(t), t.size(1)});
    std::vector<kernels::Rows<scalar_t>> out;
    for (const at::Tensor& t : outputs) out.push_back({mutable_data_as<scalar_t>(t), t.size(1)});
    kernels::move_segments(rows, in.data(), out.data(), segments.data(),
                           static_cast<int64_t>(segments.size()));
  });
  return outputs;
}

}  // namespace recops::keyed
