// Schema and kernel registration of DeBERTa's relative-position log bucketing in torch.ops.recops
// (the one copy of HF's make_log_bucket_position, kernels/deberta_positions.h). Its fake kernel
// lives in recops/deberta.py.
#include <torch/library.h>

#include "recops/attention/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.deberta");  // where the fake kernel is registered
  m.def(
      "deberta_log_bucket_position(Tensor relative_pos, int bucket_size, int max_position) -> "
      "Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("deberta_log_bucket_position", TORCH_FN(recops::attention::deberta_log_bucket_position));
}
