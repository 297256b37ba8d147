// jagged_index_select: FBGEMM's composite (CompositeImplicitAutograd) over a 2-D jagged tensor
// given by lengths. It selects the segments `indices` with
// <namespace>::jagged_index_select_2d_forward_v2 and its backward adds the gradient back with
// <namespace>::jagged_index_add_2d_forward_v2, so traced graphs hold those two ops. Bound in C++ as
// FBGEMM binds it: the composite does a few microseconds of work around its kernel.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/index_select.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether t's data can be read here: a CPU tensor, not a fake or functional one being traced
// (the composite also runs under torch.compile and on meta tensors, where only shapes are known).
bool readable(const at::Tensor& t) {
  return t.device().is_cpu() && t.has_storage() &&
         !t.key_set().has_any(
             c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// The data rules the composite's own arguments are named in (its 2-D forward would name the
// offsets derived from them): indices within lengths, lengths >= 0.
void check_selection(const at::Tensor& lengths, const at::Tensor& indices) {
  const at::Tensor idx = indices.contiguous();
  const int64_t bad = dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto tag) {
    using index_t = typename decltype(tag)::type;
    return first_out_of_range(idx.const_data_ptr<index_t>(), idx.numel(), lengths.numel());
  });
  TORCH_CHECK_INDEX(bad < 0, "indices must be in [0, lengths.numel() = ", lengths.numel(),
                    "), got indices[", bad, "] = ", bad < 0 ? 0 : index_at(idx, bad));
  const at::Tensor lens = lengths.to(at::kLong).contiguous();
  check_lengths_non_negative(lens, "lengths");
}

template <const char* Namespace>
struct JaggedIndexSelect : public torch::autograd::Function<JaggedIndexSelect<Namespace>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& values,
                               const at::Tensor& lengths, const at::Tensor& indices,
                               std::optional<int64_t> num_dense_output_rows) {
    static const auto select =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow(
                (std::string(Namespace) + "::jagged_index_select_2d_forward_v2").c_str(), "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, std::optional<int64_t>)>();
    TORCH_CHECK(values.dim() == 2, "values must be 2-D [rows, columns], got shape ",
                values.sizes());
    for (const auto& [t, name] : {std::pair{&lengths, "lengths"}, std::pair{&indices, "indices"}}) {
      TORCH_CHECK(t->device() == values.device(), name, " is on ", t->device(),
                  " but values is on ", values.device(),
                  ": jagged_index_select's tensors must share one device");
    }
    check_dim(lengths, 1, "lengths");
    check_dim(indices, 1, "indices");
    check_index_dtype(indices, "indices");
    TORCH_CHECK(at::isIntegralType(lengths.scalar_type(), /*includeBool=*/false),
                "lengths must be an integer tensor, got ", lengths.scalar_type());
    if (readable(lengths) && readable(indices)) check_selection(lengths, indices);
    // Inclusive offsets (no leading 0), int64: what the 2-D kernels take.
    const at::Tensor output_lengths = at::index_select(lengths, 0, indices);
    const at::Tensor output_offsets = output_lengths.cumsum(0);
    const at::Tensor input_offsets = lengths.cumsum(0);
    at::Tensor out =
        select.call(values, indices, input_offsets, output_offsets, num_dense_output_rows);
    ctx->save_for_backward({indices, output_offsets, input_offsets});
    ctx->saved_data["num_input_rows"] = values.sym_size(0);
    ctx->saved_data["num_dense_output_rows"] = out.sym_size(0);
    return {out, output_lengths};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    static const auto add =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow(
                (std::string(Namespace) + "::jagged_index_add_2d_forward_v2").c_str(), "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, c10::SymInt, c10::SymInt)>();
    if (!grad_outputs[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    // The output's segments are the gradient's input; the forward's input receives the sums.
    at::Tensor grad_values = add.call(grad_outputs[0], saved[0], saved[1], saved[2],
                                      ctx->saved_data["num_input_rows"].toSymInt(),
                                      ctx->saved_data["num_dense_output_rows"].toSymInt());
    return {grad_values, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

template <const char* Namespace>
std::vector<at::Tensor> jagged_index_select(const at::Tensor& values, const at::Tensor& lengths,
                                            const at::Tensor& indices,
                                            std::optional<int64_t> num_dense_output_rows) {
  return JaggedIndexSelect<Namespace>::apply(values, lengths, indices, num_dense_output_rows);
}

template std::vector<at::Tensor> jagged_index_select<kRecopsNamespace>(const at::Tensor&,
                                                                       const at::Tensor&,
                                                                       const at::Tensor&,
                                                                       std::optional<int64_t>);
template std::vector<at::Tensor> jagged_index_select<kFbgemmNamespace>(const at::Tensor&,
                                                                       const at::Tensor&,
                                                                       const at::Tensor&,
                                                                       std::optional<int64_t>);

}  // namespace recops::jagged
