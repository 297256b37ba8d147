// User requests of the served recommender: the text format (one user a line,
// `request_time item:timestamp item:timestamp ...`, oldest first) and the six input tensors of the
// exported graph (recops/export/graph.py) for a batch of them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <istream>
#include <vector>

namespace cpp_serving {

struct Request {
  int64_t request_time = 0;
  std::vector<int64_t> items;       // oldest first, ids in [1, num_items]
  std::vector<int64_t> timestamps;  // one per item
};

// Every line of `in` (blank lines skipped). Throws std::runtime_error naming the line on a
// malformed one, an empty history or an item id outside [1, num_items].
std::vector<Request> read_requests(std::istream& in, int64_t num_items);

// The graph's inputs for `count` requests from `first`: each history's last max_seq_len - 1
// items, their timestamps and offsets, the request times, and every history item as the items
// to exclude.
std::vector<at::Tensor> graph_inputs(const Request* first, size_t count, int64_t max_seq_len);

}  // namespace cpp_serving
