// An op's arguments read by their schema names from a boxed call's stack, so that an op with many
// options declares its argument list once (its schema) and its adapters build their option
// structs from names, never from positions. Used by the ops whose kernels are registered boxed
// (`register_boxed`): the attention ops and the TBE lookup / update ops.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>

namespace recops {

class NamedArgs {
 public:
  NamedArgs(const c10::OperatorHandle& op, const torch::jit::Stack& stack)
      : schema_(op.schema()), first_(stack.data() + stack.size() - schema_.arguments().size()) {}

  // Whether the schema declares `name` (e.g. indice_weights exists in the weighted TBE updates
  // only).
  bool has(std::string_view name) const { return find(name).has_value(); }

  const at::Tensor& tensor(std::string_view name) const { return at(name).toTensor(); }
  // An optional tensor argument; also nullopt when the schema does not declare `name`.
  std::optional<at::Tensor> optional_tensor(std::string_view name) const {
    const std::optional<size_t> index = find(name);
    if (!index || first_[*index].isNone()) return std::nullopt;
    return first_[*index].toTensor();
  }
  // An int or SymInt argument (a kernel always receives a concrete value).
  int64_t integer(std::string_view name) const {
    return at(name).toSymInt().guard_int(__FILE__, __LINE__);
  }
  double real(std::string_view name) const { return at(name).toDouble(); }
  std::optional<double> optional_real(std::string_view name) const {
    const c10::IValue& value = at(name);
    return value.isNone() ? std::nullopt : std::optional<double>(value.toDouble());
  }
  bool flag(std::string_view name) const { return at(name).toBool(); }
  std::string string(std::string_view name) const { return at(name).toStringRef(); }

 private:
  std::optional<size_t> find(std::string_view name) const {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (arguments[i].name() == name) return i;
    }
    return std::nullopt;
  }
  const c10::IValue& at(std::string_view name) const {
    const std::optional<size_t> index = find(name);
    TORCH_INTERNAL_ASSERT(index.has_value(), schema_.name(), " has no argument '", name, "'");
    return first_[*index];
  }

  const c10::FunctionSchema& schema_;
  const c10::IValue* first_;
};

// Replaces a boxed call's arguments on the stack with its result (a value or a tuple of values).
template <typename Result>
void return_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, Result&& result) {
  torch::jit::drop(*stack, op.schema().arguments().size());
  torch::jit::pack(*stack, std::forward<Result>(result));
}

// Pops a boxed call's arguments (an op returning nothing).
inline void return_nothing(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
}

// A kernel `void fn(const c10::OperatorHandle&, torch::jit::Stack*)` as registered with m.impl.
template <auto kFn>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<kFn>();
}

}  // namespace recops
