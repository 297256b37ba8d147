// Private ops of the FBGEMM binding in torch.ops.recops, called by recops/_fbgemm.py (and readable
// from C++): the list of FBGEMM ops recops implements and what it defined, and the routes.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "recops/binding/fbgemm_ops.h"
#include "recops/binding/fbgemm_route.h"
#include "recops/binding/fbgemm_schemas.h"

namespace recops::binding {
namespace {

// (every op of kFbgemmOps, its composites, those whose fbgemm:: schema recops defined at load)
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>>
fbgemm_binding() {
  std::vector<std::string> served, composites;
  for (const FbgemmOp& op : kFbgemmOps) {
    served.emplace_back(op.name);
    if (op.kind == kComposite) composites.emplace_back(op.name);
  }
  return {served, composites, fbgemm_ops_defined_at_load()};
}

void route(c10::string_view name, c10::string_view dispatch_key, bool enable) {
  route_fbgemm_op(std::string(name), c10::parseDispatchKey(std::string(dispatch_key)), enable);
}

}  // namespace
}  // namespace recops::binding

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops._fbgemm");
  // Catch-all kernels, as the ops have no tensor input.
  m.def("_fbgemm_binding() -> (str[] served, str[] composites, str[] defined)",
        TORCH_FN(recops::binding::fbgemm_binding));
  m.def("_route_fbgemm_op(str name, str dispatch_key, bool enable) -> ()",
        TORCH_FN(recops::binding::route));
}
