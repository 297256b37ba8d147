#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "recops/utility/ops.h"

namespace recops::utility {
namespace {

// FBGEMM_<key> parsed as std::stoi parses it (leading blanks, a sign, digits; the rest ignored):
// enabled iff that integer is 1. Text with no leading integer is disabled; an integer beyond int's
// range raises, as FBGEMM's does.
bool env_enables(const std::string& key) {
  const char* value = std::getenv(("FBGEMM_" + key).c_str());
  if (value == nullptr) return false;
  try {
    return std::stoi(value) == 1;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

}  // namespace

bool check_feature_gate_key(const std::string& key) {
  // Each key is read once per process, as FBGEMM caches it: a later change of the variable does
  // not flip a gate that code has already branched on.
  static std::mutex mutex;
  static auto* cache = new std::unordered_map<std::string, bool>();
  std::lock_guard<std::mutex> guard(mutex);
  const auto found = cache->find(key);
  if (found != cache->end()) return found->second;
  const bool enabled = env_enables(key);
  cache->emplace(key, enabled);
  return enabled;
}

bool is_uvm_tensor(const at::Tensor& /*t*/) {
  return false;
}

}  // namespace recops::utility
