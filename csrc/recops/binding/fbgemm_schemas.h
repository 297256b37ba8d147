// The fbgemm:: schemas recops defines when its library loads (fbgemm_schemas.cpp).
#pragma once

#include <string>
#include <vector>

namespace recops::binding {

// The ops of kFbgemmOps whose fbgemm:: schema recops defined when its library was loaded, because
// no library loaded before it (FBGEMM's) had defined them; each is served by recops' C++ kernels.
const std::vector<std::string>& fbgemm_ops_defined_at_load();

}  // namespace recops::binding
