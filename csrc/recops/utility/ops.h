// ATen adapters of the utility family: FBGEMM's small host-side queries that torchrec and
// FBGEMM's Python modules call (feature gates, memory kinds).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace recops::utility {

// Whether the environment variable FBGEMM_<key> holds an integer equal to 1 (read once per key).
bool check_feature_gate_key(const std::string& key);

// Whether t lives in unified (host-mapped) memory: never for a CPU tensor.
bool is_uvm_tensor(const at::Tensor& t);

}  // namespace recops::utility
