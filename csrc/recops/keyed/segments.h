// The part of the keyed adapters shared by permute_multi_embedding and regroup_keyed_tensor:
// checking the pooled embeddings and a list of column moves, and running the moves.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "recops/keyed/kernels/move_segments.h"

namespace recops::keyed {

// The tensors of `name` (pooled_embs), contiguous: at least one, CPU, 2-D, one floating dtype and
// one row count.
std::vector<at::Tensor> checked_pooled(at::TensorList tensors, const char* name);

// Checks that `segment` (described by `label`, e.g. "permutes[3]") reads inside its input and
// writes inside its output (out_lengths columns).
void check_segment(const kernels::Segment& segment, const std::vector<at::Tensor>& inputs,
                   const char* inputs_name, at::IntArrayRef out_lengths, const std::string& label);

// Outputs of inputs[0].size(0) rows and out_lengths columns, written by the checked segments;
// columns no overwriting segment reaches are zero.
std::vector<at::Tensor> run_segments(const std::vector<at::Tensor>& inputs,
                                     const std::vector<kernels::Segment>& segments,
                                     at::IntArrayRef out_lengths);

}  // namespace recops::keyed
