// Defines torch.ops.fbgemm's schemas when recops' library loads, for each op of kFbgemmOps that no
// library loaded before (FBGEMM's) has defined, and serves it with recops' C++ kernels: a process
// with no Python that loads recops' library has every fbgemm:: op recops implements. Each schema is
// its recops:: twin's, renamed (one copy of every schema).
//
// Order: this runs among the library's static initialisers, after every family's (setup.py links
// the binding's sources last), so that the twins and their kernels are registered. FBGEMM's library
// must be loaded before recops' (recops/__init__.py imports it first): loaded after, it would find
// its schemas defined and fail.
#include "recops/binding/fbgemm_schemas.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

#include "recops/binding/fbgemm_ops.h"
#include "recops/binding/fbgemm_route.h"

namespace recops::binding {
namespace {

// What serves a defined op: a composite's fbgemm:: composite; an op whose twin is one composite
// kernel for every key (no tensor argument: create_zch_buffer) at that key; otherwise the twin's
// backends and its C++ autograd. recops/_fbgemm.py adds the autograd kernels registered from Python
// and the fake kernels.
void serve_defined(const FbgemmOp& op, const c10::OperatorHandle& twin) {
  using c10::DispatchKey;
  if (op.kind == kComposite ||
      twin.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd)) {
    route_fbgemm_op(op.name, DispatchKey::CompositeImplicitAutograd, true);
    return;
  }
  for (DispatchKey key : {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::Autograd}) {
    if (twin.hasKernelForDispatchKey(key)) route_fbgemm_op(op.name, key, true);
  }
}

std::vector<std::string> define_missing_schemas() {
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  // Never destroyed, like the routes: the schemas stay for the life of the process.
  static torch::Library* library =
      new torch::Library(torch::Library::FRAGMENT, "fbgemm", std::nullopt, __FILE__, __LINE__);
  // Their fake kernels are registered by recops/_fbgemm.py (on `import recops`), which torch names
  // to whoever traces one of them without it.
  library->set_python_module("recops._fbgemm");
  std::vector<std::string> defined;
  for (const FbgemmOp& op : kFbgemmOps) {
    const std::string name = op.name;
    if (dispatcher.findSchema({"fbgemm::" + name, ""})) continue;  // FBGEMM's
    const std::optional<c10::OperatorHandle> twin = dispatcher.findSchema({"recops::" + name, ""});
    // A twin is missing only if the link order broke; recops/_fbgemm.py and the C++ dispatch test
    // report the undefined fbgemm:: op.
    if (!twin) continue;
    c10::FunctionSchema schema = twin->schema().cloneWithName("fbgemm::" + name, "");
    schema.setAliasAnalysis(twin->schema().aliasAnalysis());
    library->def(std::move(schema), {at::Tag::pt2_compliant_tag});
    serve_defined(op, *twin);
    defined.push_back(name);
  }
  return defined;
}

// The definition, run as the library loads (see the order at the top of this file).
[[maybe_unused]] const std::vector<std::string>& defined_at_load = fbgemm_ops_defined_at_load();

}  // namespace

const std::vector<std::string>& fbgemm_ops_defined_at_load() {
  static const std::vector<std::string>* defined =
      new std::vector<std::string>(define_missing_schemas());
  return *defined;
}

}  // namespace recops::binding
