// Latency percentiles of a run.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace cpp_serving {

// The nearest-rank `percent` percentile of `values` (sorted in place); 0 when empty.
inline double percentile(std::vector<double>& values, double percent) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(percent / 100.0 * static_cast<double>(values.size()));
  const size_t index = static_cast<size_t>(std::max(rank, 1.0)) - 1;
  return values[std::min(index, values.size() - 1)];
}

}  // namespace cpp_serving
