// Serving torch.ops.fbgemm.<op> with recops' kernels at one dispatch key (fbgemm_route.cpp).
#pragma once

#include <c10/core/DispatchKey.h>

#include <string>

namespace recops::binding {

// Registers (enable) or removes (!enable) recops' kernel for fbgemm::<name> at `key`: a composite
// of kFbgemmOps at CompositeImplicitAutograd gets its fbgemm:: composite, every other route a
// redispatch to recops::<name>. Registering a route twice keeps the first; removing gives the key
// back to whichever kernel held it before (FBGEMM's, if any).
void route_fbgemm_op(const std::string& name, c10::DispatchKey key, bool enable);

}  // namespace recops::binding
