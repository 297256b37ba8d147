#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/memory.h"
#include "recops/sparse/kernels/invert.h"
#include "recops/sparse/kernels/permute.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {
namespace {

void check_permute_entries(const at::Tensor& permute, int64_t num_segments) {
  const int64_t bad = dispatch_index_kind(index_kind(permute.scalar_type()), [&](auto tag) {
    using perm_t = typename decltype(tag)::type;
    return first_out_of_range(permute.const_data_ptr<perm_t>(), permute.numel(), num_segments);
  });
  TORCH_CHECK_VALUE(bad < 0, "permute entries must be in [0, ", num_segments, "), got permute[",
                    bad, "] = ", bad < 0 ? 0 : index_at(permute, bad));
}

int64_t row_bytes(const at::Tensor& t) {
  return t.size(0) == 0 ? 0 : t.numel() / t.size(0) * t.element_size();
}

// A tensor (null: absent) and its argument name.
using NamedTensor = std::pair<const at::Tensor*, const char*>;

// A preallocated output: a contiguous CPU tensor of `like`'s dtype, disjoint from the inputs, with
// room for at least `elements` elements (the result fills its front).
void check_out(const at::Tensor& out, const char* name, const at::Tensor& like, int64_t elements,
               std::initializer_list<NamedTensor> inputs) {
  check_cpu(out, name);
  TORCH_CHECK(out.scalar_type() == like.scalar_type(), name, " must have dtype ",
              like.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK(out.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(out.numel() >= elements, name, " must hold at least ", elements,
                    " elements, got ", out.numel());
  for (const auto& [input, input_name] : inputs) {
    if (input == nullptr) continue;
    const at::MemOverlapStatus overlap = at::get_overlap_status(out, *input);
    TORCH_CHECK(overlap == at::MemOverlapStatus::No, name, " must not overlap ", input_name);
  }
}

// Checks `src` (values or weights), allocates its permuted output of `dst_rows` rows (or checks
// the given `out`) and describes both for kernels::permute_segments.
kernels::PermutedStream permuted_stream(const at::Tensor& src, int64_t src_rows, int64_t dst_rows,
                                        const char* name, const std::optional<at::Tensor>& out,
                                        const char* out_name,
                                        std::initializer_list<NamedTensor> inputs,
                                        at::Tensor* src_c, at::Tensor* dst) {
  TORCH_CHECK(src.dim() >= 1, name, " must be at least 1-D, got a scalar");
  TORCH_CHECK(src.size(0) >= src_rows, name, " has ", src.size(0), " rows but lengths sum to ",
              src_rows);
  *src_c = src.contiguous();
  if (out.has_value()) {
    const int64_t row_elements = src.size(0) == 0 ? 0 : src.numel() / src.size(0);
    check_out(*out, out_name, src, dst_rows * row_elements, inputs);
    *dst = *out;
  } else {
    std::vector<int64_t> shape = src_c->sizes().vec();
    shape[0] = dst_rows;
    *dst = at::empty(shape, src_c->options());
    advise_huge_pages(dst->mutable_data_ptr(), dst->nbytes());
  }
  kernels::PermutedStream stream;
  stream.src = static_cast<const char*>(src_c->const_data_ptr());
  stream.src_bytes = src_c->nbytes();
  stream.dst = static_cast<char*>(dst->mutable_data_ptr());
  stream.row_bytes = row_bytes(*src_c);
  return stream;
}

at::Tensor checked_lengths(const at::Tensor& lengths) {
  check_cpu(lengths, "lengths");
  check_index_dtype(lengths, "lengths");
  return lengths.contiguous();
}

}  // namespace

// Every public form: the 2-D forms' segments are rows of lengths [T, B] (a feature's B bags are
// contiguous in values), the 1-D form's segments are single entries (lengths viewed as [T, 1]).
PermutedSparse permute_sparse_segments(const at::Tensor& permute, const at::Tensor& lengths_2d,
                                       const at::Tensor& values,
                                       const std::optional<at::Tensor>& weights,
                                       std::optional<int64_t> permuted_lengths_sum,
                                       const PermuteOutputs& out) {
  check_cpu(values, "values");
  check_dim(permute, 1, "permute");
  check_index_dtype(permute, "permute");
  check_cpu(permute, "permute");
  const at::Tensor permute_c = permute.contiguous();
  check_permute_entries(permute_c, lengths_2d.size(0));
  check_lengths_non_negative(lengths_2d, "lengths");
  if (permuted_lengths_sum.has_value()) {
    TORCH_CHECK_VALUE(*permuted_lengths_sum >= 0, "permuted_lengths_sum must be >= 0, got ",
                      *permuted_lengths_sum);
  }
  if (weights.has_value()) check_cpu(*weights, "weights");

  const int64_t num_out = permute_c.numel();
  at::Tensor permuted_lengths;
  if (out.lengths.has_value()) {
    check_out(*out.lengths, "permuted_lengths_out", lengths_2d, num_out * lengths_2d.size(1),
              {{&permute, "permute"},
               {&lengths_2d, "lengths"},
               {&values, "values"},
               {weights ? &*weights : nullptr, "weights"}});
    permuted_lengths = *out.lengths;
  } else {
    permuted_lengths = at::empty({num_out, lengths_2d.size(1)}, lengths_2d.options());
  }
  const at::Tensor* lengths_out = out.lengths ? &*out.lengths : nullptr;
  at::Tensor values_c, permuted_values, weights_c, permuted_weights;
  // Values and weights are checked against, and their outputs sized by, the row counts the
  // kernel finds in the lengths.
  const auto prepare = [&](const kernels::PermutedRows& rows, kernels::PermutedStream* streams) {
    if (permuted_lengths_sum.has_value()) {
      TORCH_CHECK(*permuted_lengths_sum == rows.dst_rows,
                  "permuted_lengths_sum = ", *permuted_lengths_sum,
                  " does not match the sum of the permuted lengths, ", rows.dst_rows);
    }
    int num_streams = 0;
    streams[num_streams++] = permuted_stream(values, rows.src_rows, rows.dst_rows, "values",
                                             out.values, "permuted_indices_out",
                                             {{&permute, "permute"},
                                              {&lengths_2d, "lengths"},
                                              {&values, "values"},
                                              {weights ? &*weights : nullptr, "weights"},
                                              {lengths_out, "permuted_lengths_out"}},
                                             &values_c, &permuted_values);
    if (weights.has_value()) {
      const at::Tensor* values_out = out.values ? &*out.values : nullptr;
      streams[num_streams++] = permuted_stream(*weights, rows.src_rows, rows.dst_rows, "weights",
                                               out.weights, "permuted_weights_out",
                                               {{&permute, "permute"},
                                                {&lengths_2d, "lengths"},
                                                {&values, "values"},
                                                {&*weights, "weights"},
                                                {lengths_out, "permuted_lengths_out"},
                                                {values_out, "permuted_indices_out"}},
                                               &weights_c, &permuted_weights);
    }
    return num_streams;
  };
  dispatch_index_kind(index_kind(permute_c.scalar_type()), [&](auto perm_tag) {
    using perm_t = typename decltype(perm_tag)::type;
    dispatch_index_kind(index_kind(lengths_2d.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      kernels::permute_sparse(permute_c.const_data_ptr<perm_t>(), num_out,
                              lengths_2d.const_data_ptr<index_t>(), lengths_2d.size(0),
                              lengths_2d.size(1), permuted_lengths.mutable_data_ptr<index_t>(),
                              prepare);
    });
  });
  std::optional<at::Tensor> maybe_weights;
  if (weights.has_value()) maybe_weights = permuted_weights;
  return {permuted_lengths, permuted_values, maybe_weights};
}

PermutedSparse permute_2D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                      const at::Tensor& values,
                                      const std::optional<at::Tensor>& weights,
                                      std::optional<int64_t> permuted_lengths_sum) {
  check_dim(lengths, 2, "lengths");
  return permute_sparse_segments(permute, checked_lengths(lengths), values, weights,
                                 permuted_lengths_sum);
}

PermutedSparse permute_1D_sparse_data(const at::Tensor& permute, const at::Tensor& lengths,
                                      const at::Tensor& values,
                                      const std::optional<at::Tensor>& weights,
                                      std::optional<int64_t> permuted_lengths_sum) {
  // Lengths of any shape are read flat, as FBGEMM's CPU op reads them: [T, B] lengths are T * B
  // segments, and permute indexes those.
  const at::Tensor lengths_2d = checked_lengths(lengths).view({-1, 1});
  auto [permuted_lengths, permuted_values, permuted_weights] =
      permute_sparse_segments(permute, lengths_2d, values, weights, permuted_lengths_sum);
  return {permuted_lengths.view({-1}), permuted_values, permuted_weights};
}

at::Tensor invert_permute(const at::Tensor& permute) {
  check_cpu(permute, "permute");
  check_dim(permute, 1, "permute");
  check_index_dtype(permute, "permute");
  const at::Tensor permute_c = permute.contiguous();
  const int64_t n = permute_c.numel();
  TORCH_CHECK_VALUE(permute_c.scalar_type() == at::kLong || n <= (int64_t{1} << 31),
                    "an int32 permute holds at most 2^31 entries, got ", n, "; use int64");
  at::Tensor inverse = at::empty_like(permute_c);
  // The kernel validates as it inverts; the checks below only name the offending entry.
  const bool inverted = dispatch_index_kind(index_kind(permute_c.scalar_type()), [&](auto tag) {
    using perm_t = typename decltype(tag)::type;
    return kernels::invert_permutation(permute_c.const_data_ptr<perm_t>(), n,
                                       inverse.mutable_data_ptr<perm_t>());
  });
  if (inverted) return inverse;
  check_permute_entries(permute_c, n);
  // A repeated entry would leave some inverse slot unwritten.
  const int64_t repeat = dispatch_index_kind(index_kind(permute_c.scalar_type()), [&](auto tag) {
    using perm_t = typename decltype(tag)::type;
    return kernels::first_repeated_entry(permute_c.const_data_ptr<perm_t>(), n);
  });
  TORCH_CHECK_VALUE(repeat < 0, "permute must be a permutation, but ",
                    repeat < 0 ? 0 : index_at(permute_c, repeat),
                    " appears twice (again at permute[", repeat, "])");
  TORCH_CHECK(false, "invert_permute: internal error, permute is a permutation but not inverted");
}

}  // namespace recops::sparse
