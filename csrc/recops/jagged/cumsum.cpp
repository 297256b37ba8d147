#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/cumsum.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

// `name` names the tensor in the error for a dtype no scan takes.
template <typename Fn>
void dispatch_cumsum_dtype(const at::Tensor& t, const char* name, Fn&& fn) {
  switch (t.scalar_type()) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
      break;
    default:
      TORCH_CHECK(false, name, " must be an integer (uint8 to int64) or floating tensor, got ",
                  t.scalar_type());
  }
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "recops_cumsum", [&] {
    using kernel_t = kernel_type_t<scalar_t>;
    fn(TypeTag<kernel_t>{}, TypeTag<accumulate_t<kernel_t>>{});
  });
}

template <bool kInclusive>
at::Tensor flat_cumsum(const at::Tensor& t_in) {
  check_cpu(t_in, "t_in");
  const at::Tensor in = t_in.contiguous();
  at::Tensor out = at::empty_like(in);
  dispatch_cumsum_dtype(in, "t_in", [&](auto scalar_tag, auto acc_tag) {
    using scalar_t = typename decltype(scalar_tag)::type;
    using acc_t = typename decltype(acc_tag)::type;
    prefix_sum<kInclusive, acc_t>(data_as<scalar_t>(in), mutable_data_as<scalar_t>(out),
                                  in.numel());
  });
  return out;
}

// The complete cumsum of a 1-D input, or of each row of a 2-D one (`name` names it in errors).
at::Tensor complete_cumsum(const at::Tensor& t, const char* name) {
  const at::Tensor in = t.contiguous();
  const int64_t rows = in.dim() == 1 ? 1 : in.size(0);
  const int64_t n = in.size(-1);
  at::Tensor out =
      in.dim() == 1 ? at::empty({n + 1}, in.options()) : at::empty({rows, n + 1}, in.options());
  dispatch_cumsum_dtype(in, name, [&](auto scalar_tag, auto acc_tag) {
    using scalar_t = typename decltype(scalar_tag)::type;
    using acc_t = typename decltype(acc_tag)::type;
    kernels::complete_cumsum_rows<acc_t>(data_as<scalar_t>(in), mutable_data_as<scalar_t>(out),
                                         rows, n);
  });
  return out;
}

}  // namespace

at::Tensor asynchronous_complete_cumsum(const at::Tensor& t_in) {
  check_cpu(t_in, "t_in");
  TORCH_CHECK(t_in.dim() == 1 || t_in.dim() == 2, "t_in must be 1-D [N] or 2-D [B, N], got shape ",
              t_in.sizes());
  return complete_cumsum(t_in, "t_in");
}

// FBGEMM's batched form: the complete cumsum of each row of a 2-D input.
at::Tensor asynchronous_batched_complete_cumsum(const at::Tensor& values) {
  check_cpu(values, "values");
  TORCH_CHECK(values.dim() == 2, "values must be 2-D [B, N], got shape ", values.sizes());
  return complete_cumsum(values, "values");
}

at::Tensor asynchronous_exclusive_cumsum(const at::Tensor& t_in) {
  return flat_cumsum<false>(t_in);
}

at::Tensor asynchronous_inclusive_cumsum(const at::Tensor& t_in) {
  return flat_cumsum<true>(t_in);
}

}  // namespace recops::jagged
