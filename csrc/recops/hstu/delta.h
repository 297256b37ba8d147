// A delta step of HSTU-family attention (serving over cached keys): the validation and the
// sequences of hstu_delta_attention / fuxi_delta_attention, whose keys are jagged rows or the pages
// of a paged cache (options.h, kDeltaArguments). Forward only; the bodies are the training ops'.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "recops/hstu/inputs.h"
#include "recops/hstu/options.h"

namespace recops::attention {

// Where a delta step's queries and keys are: delta_offsets [B + 1] (the new rows of q), and
// either seq_offsets [B + 1] (keys as jagged rows of k, v; seq_lengths may shorten them) or
// page_table [B, max_pages] with seq_lengths [B] (keys in the pages of k, v).
struct DeltaKeys {
  at::Tensor delta_offsets;
  std::optional<at::Tensor> seq_offsets, page_table, seq_lengths;
};

// A checked delta step: its sequences and mask, the keys and values as the kernels read them
// (k, v [rows, H, D]: the jagged rows, the pool's rows, or the batch's pages gathered into jagged
// rows when the kernels would otherwise convert the whole pool to their compute type) and the
// options with the timestamps aligned with those rows.
struct DeltaAttention {
  PreparedAttention attention;
  at::Tensor k, v;
  HstuOptions options;
};

DeltaAttention prepare_delta_attention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const DeltaKeys& keys,
                                       const HstuOptions& options);

}  // namespace recops::attention
