// expand_into_jagged_permute (FBGEMM's schema and semantics, docs/ops.md section 1): the element
// permutation that moves a jagged tensor's segments as `permute` moves them (torchrec's
// variable-batch all-to-all recat). Validates, then runs kernels/expand_into_jagged_permute.h.
// Unlike FBGEMM it accepts an empty permute, checks that output_offset stays within
// [0, output_size] (FBGEMM writes past the output otherwise), and zeroes the output entries
// output_offset does not cover (FBGEMM leaves them unwritten).
#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/sparse/kernels/expand_into_jagged_permute.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {

at::Tensor expand_into_jagged_permute(const at::Tensor& permute, const at::Tensor& input_offset,
                                      const at::Tensor& output_offset, int64_t output_size) {
  for (const auto& [t, name] :
       {std::pair{&permute, "permute"}, std::pair{&input_offset, "input_offset"},
        std::pair{&output_offset, "output_offset"}}) {
    check_cpu(*t, name);
    check_dim(*t, 1, name);
    check_index_dtype(*t, name);
  }
  check_same_dtype(input_offset, "input_offset", output_offset, "output_offset");
  const int64_t T = permute.numel();
  TORCH_CHECK_VALUE(input_offset.numel() == T + 1 && output_offset.numel() == T + 1,
                    "input_offset and output_offset must hold permute.numel() + 1 = ", T + 1,
                    " entries, got ", input_offset.numel(), " and ", output_offset.numel());
  const at::Tensor permute_c = permute.contiguous(), input_c = input_offset.contiguous();
  const at::Tensor output_c = output_offset.contiguous();
  const int64_t bad = dispatch_index_kind(index_kind(permute_c.scalar_type()), [&](auto tag) {
    using perm_t = typename decltype(tag)::type;
    return first_out_of_range(permute_c.const_data_ptr<perm_t>(), T, T);
  });
  TORCH_CHECK_VALUE(bad < 0, "permute entries must be in [0, ", T, "), got permute[", bad,
                    "] = ", bad < 0 ? 0 : index_at(permute_c, bad));
  check_offsets_monotonic(output_c, "output_offset");
  const int64_t first = index_at(output_c, 0), last = index_at(output_c, T);
  TORCH_CHECK_VALUE(first >= 0 && last <= output_size,
                    "output_offset must stay within [0, output_size = ", output_size, "], got ",
                    first, " to ", last);

  at::Tensor output = at::empty({output_size}, input_offset.options());
  output.narrow(0, 0, first).zero_();
  output.narrow(0, last, output_size - last).zero_();
  dispatch_index_kind(index_kind(permute_c.scalar_type()), [&](auto perm_tag) {
    using perm_t = typename decltype(perm_tag)::type;
    dispatch_index_kind(index_kind(input_c.scalar_type()), [&](auto offset_tag) {
      using offset_t = typename decltype(offset_tag)::type;
      const perm_t* p = permute_c.const_data_ptr<perm_t>();
      const offset_t* in = input_c.const_data_ptr<offset_t>();
      const offset_t* out = output_c.const_data_ptr<offset_t>();
      if (kernels::expand_into_jagged_permute(p, T, in, out, output.mutable_data_ptr<offset_t>())) {
        return;
      }
      const int64_t t = kernels::first_overflowing_segment(p, T, in, out);
      TORCH_CHECK_VALUE(false, "segment ", t, " runs from input_offset[", index_at(permute_c, t),
                        "] = ", index_at(input_c, index_at(permute_c, t)), " for ",
                        index_at(output_c, t + 1) - index_at(output_c, t),
                        " entries, past the largest ", input_offset.scalar_type());
    });
  });
  return output;
}

}  // namespace recops::sparse
