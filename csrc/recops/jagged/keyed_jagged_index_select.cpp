// keyed_jagged_index_select_dim1's adapter: validates, allocates and dispatches to
// kernels/keyed_jagged_index_select.h. FBGEMM has this op on CUDA only; this is its CPU kernel.
#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/keyed_jagged_index_select.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

at::Tensor checked_1d(const at::Tensor& t, const char* name, bool index) {
  check_cpu(t, name);
  check_dim(t, 1, name);
  if (index) check_index_dtype(t, name);
  return t.contiguous();
}

kernels::ByteStream stream_of(const at::Tensor& src, const at::Tensor& dst) {
  kernels::ByteStream stream;
  stream.src = static_cast<const char*>(src.const_data_ptr());
  stream.src_elements = src.numel();
  stream.dst = static_cast<char*>(dst.mutable_data_ptr());
  stream.element_bytes = src.element_size();
  return stream;
}

// Raises for output segment `bad` (>= 0) whose input segment reaches outside the values.
void check_selected_segment(int64_t bad, const kernels::KeyedSelection& sel, const at::Tensor& idx,
                            const at::Tensor& offs, const at::Tensor& lens, int64_t num_values,
                            bool has_weights) {
  if (bad < 0) return;
  const int64_t segment =
      (bad / sel.num_indices) * sel.batch_size + index_at(idx, bad % sel.num_indices);
  TORCH_CHECK_INDEX(false, "segment ", segment, " (offsets[", segment,
                    "] = ", index_at(offs, segment), ", lengths[", segment,
                    "] = ", index_at(lens, segment), ") reaches outside the ", num_values,
                    " values", has_weights ? " and weights" : "");
}

}  // namespace

std::vector<at::Tensor> keyed_jagged_index_select_dim1(
    const at::Tensor& values, const at::Tensor& lengths, const at::Tensor& offsets,
    const at::Tensor& indices, int64_t batch_size, const std::optional<at::Tensor>& weights,
    std::optional<int64_t> selected_lengths_sum) {
  const at::Tensor vals = checked_1d(values, "values", false);
  const at::Tensor lens = checked_1d(lengths, "lengths", true);
  const at::Tensor offs = checked_1d(offsets, "offsets", true);
  const at::Tensor idx = checked_1d(indices, "indices", true);
  at::Tensor wts;
  if (weights.has_value()) {
    wts = checked_1d(*weights, "weights", false);
    TORCH_CHECK(wts.numel() == vals.numel(), "weights must have one entry per value (",
                vals.numel(), "), got ", wts.numel());
  }
  TORCH_CHECK(offs.numel() == lens.numel() + 1,
              "offsets must hold lengths.numel() + 1 = ", lens.numel() + 1, " entries, got ",
              offs.numel());
  TORCH_CHECK_VALUE(batch_size > 0, "batch_size must be > 0, got ", batch_size);
  TORCH_CHECK_VALUE(lens.numel() % batch_size == 0, "lengths.numel() = ", lens.numel(),
                    " must be a multiple of batch_size = ", batch_size);
  if (selected_lengths_sum.has_value()) {
    TORCH_CHECK_VALUE(*selected_lengths_sum >= 0, "selected_lengths_sum must be >= 0, got ",
                      *selected_lengths_sum);
  }
  const int64_t bad_index = dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto tag) {
    using index_t = typename decltype(tag)::type;
    return first_out_of_range(idx.const_data_ptr<index_t>(), idx.numel(), batch_size);
  });
  TORCH_CHECK_INDEX(bad_index < 0, "indices must be in [0, batch_size = ", batch_size,
                    "), got indices[", bad_index,
                    "] = ", bad_index < 0 ? 0 : index_at(idx, bad_index));
  check_lengths_non_negative(lens, "lengths");

  kernels::KeyedSelection sel;
  sel.batch_size = batch_size;
  sel.num_indices = idx.numel();
  const int64_t num_out_segments = lens.numel() / batch_size * idx.numel();
  at::Tensor out_lengths = at::empty({num_out_segments}, lens.options());
  at::Tensor out_ends = at::empty({num_out_segments}, lens.options().dtype(at::kLong));
  const int64_t bad_segment =
      dispatch_index_kind(index_kind(lens.scalar_type()), [&](auto length_tag) {
        using length_t = typename decltype(length_tag)::type;
        return dispatch_index_kind(index_kind(offs.scalar_type()), [&](auto offset_tag) {
          using offset_t = typename decltype(offset_tag)::type;
          return dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto index_tag) {
            using index_t = typename decltype(index_tag)::type;
            return kernels::select_keyed_lengths(
                sel, lens.const_data_ptr<length_t>(), offs.const_data_ptr<offset_t>(),
                idx.const_data_ptr<index_t>(), num_out_segments, vals.numel(),
                out_lengths.mutable_data_ptr<length_t>(), out_ends.mutable_data_ptr<int64_t>());
          });
        });
      });
  check_selected_segment(bad_segment, sel, idx, offs, lens, vals.numel(), weights.has_value());
  const int64_t total =
      num_out_segments == 0 ? 0 : out_ends.const_data_ptr<int64_t>()[num_out_segments - 1];
  if (selected_lengths_sum.has_value()) {
    TORCH_CHECK_VALUE(*selected_lengths_sum == total,
                      "selected_lengths_sum = ", *selected_lengths_sum,
                      " does not match the sum of the selected lengths, ", total);
  }
  std::vector<at::Tensor> result;
  result.push_back(at::empty({total}, vals.options()));
  result.push_back(out_lengths);
  kernels::ByteStream streams[2];
  int num_streams = 0;
  streams[num_streams++] = stream_of(vals, result[0]);
  if (weights.has_value()) {
    result.push_back(at::empty({total}, wts.options()));
    streams[num_streams++] = stream_of(wts, result[2]);
  }
  const int64_t bad = dispatch_index_kind(index_kind(offs.scalar_type()), [&](auto offset_tag) {
    using offset_t = typename decltype(offset_tag)::type;
    return dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      return kernels::select_keyed_segments(
          sel, offs.const_data_ptr<offset_t>(), idx.const_data_ptr<index_t>(),
          out_ends.const_data_ptr<int64_t>(), num_out_segments, streams, num_streams);
    });
  });
  check_selected_segment(bad, sel, idx, offs, lens, vals.numel(), weights.has_value());
  return result;
}

}  // namespace recops::jagged
