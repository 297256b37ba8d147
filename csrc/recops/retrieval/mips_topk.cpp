// mips_topk's adapter (docs/ops.md section 10).
#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/index_scans.h"
#include "recops/retrieval/kernels/mips_topk.h"
#include "recops/retrieval/ops.h"

namespace recops::retrieval {
namespace {

// excluded_offsets [M + 1] and excluded as int64, every candidate they name in [0, N); undefined
// tensors when neither is given.
std::pair<at::Tensor, at::Tensor> checked_exclusions(
    const std::optional<at::Tensor>& excluded_offsets, const std::optional<at::Tensor>& excluded,
    int64_t queries, int64_t candidates) {
  TORCH_CHECK_VALUE(excluded_offsets.has_value() == excluded.has_value(),
                    "excluded_offsets and excluded must be given together");
  if (!excluded_offsets.has_value()) return {};
  check_cpu(*excluded_offsets, "excluded_offsets");
  check_cpu(*excluded, "excluded");
  check_dim(*excluded_offsets, 1, "excluded_offsets");
  check_dim(*excluded, 1, "excluded");
  check_index_dtype(*excluded_offsets, "excluded_offsets");
  check_index_dtype(*excluded, "excluded");
  TORCH_CHECK_VALUE(excluded_offsets->numel() == queries + 1,
                    "excluded_offsets must have one entry per row of queries and one more (",
                    queries + 1, "), got ", excluded_offsets->numel());
  at::Tensor offsets = excluded_offsets->to(at::kLong).contiguous();
  check_offsets_monotonic(offsets, "excluded_offsets");
  const int64_t* o = offsets.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(o[queries] <= excluded->numel(), "excluded_offsets[-1] = ", o[queries],
                    " must be at most the number of entries of excluded (", excluded->numel(), ")");
  at::Tensor values = excluded->to(at::kLong).contiguous();
  const int64_t* v = values.const_data_ptr<int64_t>();
  const int64_t bad = first_out_of_range(v + o[0], o[queries] - o[0], candidates);
  TORCH_CHECK_INDEX(bad < 0, "excluded[", o[0] + bad, "] = ", bad < 0 ? 0 : v[o[0] + bad],
                    " must be a row of candidates, in [0, ", candidates, ")");
  return {offsets, values};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mips_topk(const at::Tensor& queries,
                                             const at::Tensor& candidates, int64_t k,
                                             const std::optional<at::Tensor>& excluded_offsets,
                                             const std::optional<at::Tensor>& excluded) {
  check_cpu(queries, "queries");
  check_cpu(candidates, "candidates");
  check_dim(queries, 2, "queries");
  check_dim(candidates, 2, "candidates");
  TORCH_CHECK_VALUE(queries.scalar_type() == at::kFloat || queries.scalar_type() == at::kDouble,
                    "queries must be float32 or float64 (16-bit states: cast them first), got ",
                    queries.scalar_type());
  check_same_dtype(candidates, "candidates", queries, "queries");
  TORCH_CHECK_VALUE(candidates.size(1) == queries.size(1), "candidates must have queries' ",
                    queries.size(1), " columns, got shape ", candidates.sizes());
  TORCH_CHECK_VALUE(k >= 0 && k <= candidates.size(0), "k must be in [0, ", candidates.size(0),
                    "] (the rows of candidates), got ", k);
  const auto [offsets, exclusions] =
      checked_exclusions(excluded_offsets, excluded, queries.size(0), candidates.size(0));
  const at::Tensor q = with_unit_columns(queries), c = with_unit_columns(candidates);
  at::Tensor values = at::empty({queries.size(0), k}, queries.options());
  at::Tensor indices = at::empty({queries.size(0), k}, queries.options().dtype(at::kLong));
  dispatch_compute_type(queries.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const kernels::MipsTopkProblem<T> problem{
        q.size(0),
        c.size(0),
        q.size(1),
        k,
        data_as<T>(q),
        q.stride(0),
        data_as<T>(c),
        c.stride(0),
        offsets.defined() ? offsets.const_data_ptr<int64_t>() : nullptr,
        exclusions.defined() ? exclusions.const_data_ptr<int64_t>() : nullptr};
    kernels::mips_topk(problem, mutable_data_as<T>(values), indices.mutable_data_ptr<int64_t>());
  });
  return {values, indices};
}

}  // namespace recops::retrieval
