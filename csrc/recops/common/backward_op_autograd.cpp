#include "recops/common/backward_op_autograd.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace recops {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

constexpr int64_t kNoEdge = -1;

// A graph node is held by std::shared_ptr up to torch 2.10 and by c10::intrusive_ptr after it; an
// edge's `function` has whichever this torch uses.
using NodeHandle = decltype(torch::autograd::Edge::function);

template <typename N, typename... Args>
NodeHandle make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<N>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  }
}

// What the forward's and the backward's schemas say, read at the first call (the two ops may be
// defined by different translation units, after this kernel is registered).
struct Binding {
  c10::OperatorHandle backward;
  // Per forward argument: its graph edge (each Tensor / Tensor? argument has one, in order), or
  // kNoEdge.
  std::vector<int64_t> edge_of_argument;
  std::vector<size_t> edge_arguments;   // the argument of each edge
  std::vector<int64_t> edge_of_result;  // per backward result: the edge its gradient goes to
  std::vector<int64_t> identity_edges;  // edges whose gradient is the output's gradient
  bool list_output = false;
};

bool is_tensor_argument(const c10::Argument& argument) {
  return argument.type()->isSubtypeOf(*c10::OptionalType::ofTensor());
}

Binding read_binding(const c10::FunctionSchema& forward, const std::string& backward_name,
                     const std::vector<std::string>& identity_grads) {
  const auto name = c10::OperatorName(backward_name, "");
  const std::optional<c10::OperatorHandle> backward = c10::Dispatcher::singleton().findSchema(name);
  TORCH_INTERNAL_ASSERT(backward.has_value(), forward.name(), "'s backward op ", backward_name,
                        " is not defined");
  Binding b{*backward, {}, {}, {}, {}, false};
  const auto& arguments = forward.arguments();
  const auto& backward_arguments = backward->schema().arguments();
  TORCH_INTERNAL_ASSERT(backward_arguments.size() == arguments.size() + 1 &&
                            backward_arguments[0].name() == "grad_output",
                        backward_name, " must take grad_output, then ", forward.name(),
                        "'s arguments");
  for (size_t a = 0; a < arguments.size(); ++a) {
    TORCH_INTERNAL_ASSERT(backward_arguments[a + 1].name() == arguments[a].name(), backward_name,
                          "'s argument ", a + 1, " must be ", arguments[a].name());
    if (is_tensor_argument(arguments[a])) {
      b.edge_of_argument.push_back(static_cast<int64_t>(b.edge_arguments.size()));
      b.edge_arguments.push_back(a);
    } else {
      b.edge_of_argument.push_back(kNoEdge);
    }
  }
  const auto edge_named = [&](const std::string& argument) {
    for (size_t a = 0; a < arguments.size(); ++a) {
      if (arguments[a].name() == argument && b.edge_of_argument[a] != kNoEdge) {
        return b.edge_of_argument[a];
      }
    }
    TORCH_INTERNAL_ASSERT(false, forward.name(), " has no tensor argument ", argument);
  };
  for (const c10::Argument& result : backward->schema().returns()) {
    TORCH_INTERNAL_ASSERT(result.name().rfind("grad_", 0) == 0, backward_name, "'s result ",
                          result.name(), " is not named grad_<argument>");
    b.edge_of_result.push_back(edge_named(result.name().substr(5)));
  }
  for (const std::string& argument : identity_grads)
    b.identity_edges.push_back(edge_named(argument));
  TORCH_INTERNAL_ASSERT(forward.returns().size() == 1, forward.name(), " must return one value");
  b.list_output = forward.returns()[0].type()->kind() == c10::TypeKind::ListType;
  return b;
}

// The graph node of one forward call: the call's arguments (its tensors as saved variables, so a
// later in-place change to one is an error, not a wrong gradient) and the backward to call.
class BackwardOpNode final : public torch::autograd::Node {
 public:
  BackwardOpNode(const Binding& binding, torch::autograd::edge_list&& edges)
      : Node(std::move(edges)), binding_(binding) {}

  std::string name() const override { return binding_.backward.schema().name(); }

  // Keeps the arguments of the call, once the forward has run (and validated them).
  void save(std::vector<c10::IValue> arguments) {
    saved_.resize(binding_.edge_arguments.size());
    for (size_t e = 0; e < saved_.size(); ++e) {
      c10::IValue& argument = arguments[binding_.edge_arguments[e]];
      if (argument.isTensor()) {
        saved_[e].emplace(argument.toTensor(), /*is_output=*/false);
        argument = c10::IValue();
      }
    }
    arguments_ = std::move(arguments);
  }

  variable_list apply(variable_list&& grads) override {
    torch::jit::Stack stack;
    stack.reserve(arguments_.size() + 1);
    if (binding_.list_output) {
      c10::List<at::Tensor> list;
      list.reserve(grads.size());
      for (size_t i = 0; i < grads.size(); ++i) list.push_back(gradient(grads, i));
      stack.emplace_back(std::move(list));
    } else {
      stack.emplace_back(gradient(grads, 0));
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t a = 0; a < arguments_.size(); ++a) {
        const int64_t e = binding_.edge_of_argument[a];
        if (e != kNoEdge && saved_[e].has_value()) {
          stack.emplace_back(saved_[e]->unpack());
        } else {
          stack.push_back(arguments_[a]);
        }
      }
    }
    binding_.backward.callBoxed(stack);
    variable_list input_grads(num_outputs());
    for (size_t r = 0; r < stack.size(); ++r) {
      if (stack[r].isTensor()) input_grads[binding_.edge_of_result[r]] = stack[r].toTensor();
    }
    for (const int64_t e : binding_.identity_edges) input_grads[e] = gradient(grads, 0);
    return input_grads;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& saved : saved_) {
      if (saved.has_value()) saved->reset_data();
    }
  }

 private:
  // The gradient of output i as the backward takes it: contiguous, zeros where none flowed.
  at::Tensor gradient(const variable_list& grads, size_t i) const {
    return grads[i].defined() ? grads[i].contiguous() : input_metadata(i).zeros_like();
  }

  const Binding& binding_;
  std::vector<std::optional<SavedVariable>> saved_;  // per edge: its tensor, when given
  std::vector<c10::IValue> arguments_;               // tensors' places left empty
};

class BackwardOpAutograd final : public c10::OperatorKernel {
 public:
  BackwardOpAutograd(std::string backward, std::vector<std::string> identity_grads)
      : backward_(std::move(backward)), identity_grads_(std::move(identity_grads)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    std::call_once(
        bound_, [&] { binding_.emplace(read_binding(op.schema(), backward_, identity_grads_)); });
    const Binding& binding = *binding_;
    const auto arguments = torch::jit::last(*stack, op.schema().arguments().size());
    std::vector<at::Tensor> inputs;
    inputs.reserve(binding.edge_arguments.size());
    for (const size_t a : binding.edge_arguments) {
      inputs.push_back(arguments[a].isTensor() ? arguments[a].toTensor() : at::Tensor());
    }
    if (!torch::autograd::compute_requires_grad(inputs)) {
      forward(op, keys, stack);
      return;
    }
    std::vector<c10::IValue> kept(arguments.begin(), arguments.end());
    forward(op, keys, stack);
    const NodeHandle node =
        make_node<BackwardOpNode>(binding, torch::autograd::collect_next_edges(inputs));
    const c10::IValue& result = stack->back();
    if (result.isTensorList()) {
      for (const at::Tensor& output : result.toTensorVector()) {
        torch::autograd::set_history(output, node);
      }
    } else {
      torch::autograd::set_history(result.toTensor(), node);
    }
    static_cast<BackwardOpNode&>(*node).save(std::move(kept));
  }

 private:
  static void forward(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
  }

  std::string backward_;
  std::vector<std::string> identity_grads_;
  std::once_flag bound_;
  std::optional<Binding> binding_;
};

}  // namespace

torch::CppFunction autograd_by_backward_op(std::string backward,
                                           std::vector<std::string> identity_grads) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<BackwardOpAutograd>(std::move(backward), std::move(identity_grads)));
}

}  // namespace recops
