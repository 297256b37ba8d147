#include "requests.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cpp_serving {
namespace {

int64_t parse_integer(const std::string& text, size_t line) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw std::runtime_error("line " + std::to_string(line) + ": '" + text + "' is not an integer");
  }
  return value;
}

Request parse_request(const std::string& text, size_t line, int64_t num_items) {
  std::istringstream fields(text);
  std::string field;
  fields >> field;
  Request request;
  request.request_time = parse_integer(field, line);
  while (fields >> field) {
    const size_t colon = field.find(':');
    if (colon == std::string::npos) {
      throw std::runtime_error("line " + std::to_string(line) + ": '" + field +
                               "' is not item:timestamp");
    }
    const int64_t item = parse_integer(field.substr(0, colon), line);
    if (item < 1 || item > num_items) {
      throw std::runtime_error("line " + std::to_string(line) + ": item " + std::to_string(item) +
                               " is outside [1, " + std::to_string(num_items) + "]");
    }
    request.items.push_back(item);
    request.timestamps.push_back(parse_integer(field.substr(colon + 1), line));
  }
  if (request.items.empty()) {
    throw std::runtime_error("line " + std::to_string(line) + ": a history needs an item");
  }
  return request;
}

at::Tensor longs(const std::vector<int64_t>& values) {
  return at::tensor(values, at::kLong);
}

}  // namespace

std::vector<Request> read_requests(std::istream& in, int64_t num_items) {
  std::vector<Request> requests;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    requests.push_back(parse_request(text, line, num_items));
  }
  return requests;
}

std::vector<at::Tensor> graph_inputs(const Request* first, size_t count, int64_t max_seq_len) {
  const size_t window = static_cast<size_t>(max_seq_len - 1);
  std::vector<int64_t> items, timestamps, offsets{0}, request_times, seen, seen_offsets{0};
  for (const Request* request = first; request != first + count; ++request) {
    const size_t kept = std::min(window, request->items.size());
    const size_t skipped = request->items.size() - kept;
    items.insert(items.end(), request->items.begin() + skipped, request->items.end());
    timestamps.insert(timestamps.end(), request->timestamps.begin() + skipped,
                      request->timestamps.end());
    offsets.push_back(static_cast<int64_t>(items.size()));
    request_times.push_back(request->request_time);
    seen.insert(seen.end(), request->items.begin(), request->items.end());
    seen_offsets.push_back(static_cast<int64_t>(seen.size()));
  }
  return {longs(items),         longs(timestamps), longs(offsets),
          longs(request_times), longs(seen),       longs(seen_offsets)};
}

}  // namespace cpp_serving
