// Serves torch.ops.fbgemm.<op> with recops' kernels at one dispatch key, registered and removed on
// request: when recops defines the fbgemm schemas itself (fbgemm_schemas.cpp at load, completed by
// recops/_fbgemm.py with the autograd kernels registered from Python), and when a user routes
// FBGEMM's own CPU ops to recops with recops.use_for_fbgemm. The kernel is a boxed C++ redispatch
// to torch.ops.recops.<op>, so no Python runs on the call path; removing the registration gives the
// key back to whichever kernel held it before (FBGEMM's, if any).
#include "recops/binding/fbgemm_route.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "recops/binding/fbgemm_ops.h"
#include "recops/jagged/ops.h"

namespace recops::binding {
namespace {

// fbgemm::<op> at one key runs recops::<op>'s kernel for the same key set.
class RedispatchToRecops final : public c10::OperatorKernel {
 public:
  explicit RedispatchToRecops(c10::OperatorHandle recops_op) : recops_op_(std::move(recops_op)) {}

  void operator()(const c10::OperatorHandle& /*fbgemm_op*/, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    recops_op_.redispatchBoxed(keys, stack);
  }

 private:
  c10::OperatorHandle recops_op_;
};

// The jagged composites call fbgemm::<op>_forward (_2d_forward_v2), so a graph traced through
// torch.ops.fbgemm holds fbgemm nodes only.
torch::CppFunction fbgemm_composite(const std::string& name) {
  using jagged::kFbgemmNamespace;
  if (name == "jagged_to_padded_dense") {
    return torch::CppFunction(TORCH_FN(jagged::jagged_to_padded_dense<kFbgemmNamespace>));
  }
  if (name == "jagged_index_select") {
    return torch::CppFunction(TORCH_FN(jagged::jagged_index_select<kFbgemmNamespace>));
  }
  TORCH_CHECK(name == "dense_to_jagged", "recops has no fbgemm composite for op '", name, "'");
  return torch::CppFunction(TORCH_FN(jagged::dense_to_jagged<kFbgemmNamespace>));
}

struct Routes {
  std::mutex mutex;
  std::map<std::pair<std::string, c10::DispatchKey>, std::unique_ptr<torch::Library>> libraries;
};

Routes& routes() {
  static Routes* instance = new Routes();  // never destroyed: the dispatcher may outlive statics
  return *instance;
}

}  // namespace

void route_fbgemm_op(const std::string& name, c10::DispatchKey key, bool enable) {
  Routes& state = routes();
  std::lock_guard<std::mutex> guard(state.mutex);
  auto found = state.libraries.find({name, key});
  if (!enable) {
    if (found != state.libraries.end()) state.libraries.erase(found);
    return;
  }
  if (found != state.libraries.end()) return;
  auto library =
      std::make_unique<torch::Library>(torch::Library::IMPL, "fbgemm", key, __FILE__, __LINE__);
  if (key == c10::DispatchKey::CompositeImplicitAutograd && is_fbgemm_composite(name)) {
    library->impl(name.c_str(), fbgemm_composite(name));
  } else {
    // Every other route redispatches to the twin, at CompositeImplicitAutograd too: an op with no
    // tensor argument (create_zch_buffer, check_feature_gate_key) has one kernel for every key.
    c10::OperatorHandle recops_op =
        c10::Dispatcher::singleton().findSchemaOrThrow(("recops::" + name).c_str(), "");
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                    std::make_unique<RedispatchToRecops>(recops_op)));
  }
  state.libraries.emplace(std::make_pair(name, key), std::move(library));
}

}  // namespace recops::binding
