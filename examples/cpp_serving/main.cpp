// Serves a recommender exported by `python -m recops.export` (an AOTInductor package) from C++,
// without Python: reads user requests, answers each user's top-k items and scores, and reports
// per-batch latency percentiles and throughput on stderr as one JSON line.
//
// Usage: recops_cpp_serving --package model.pt2 --library recops/_C*.so
//            [--requests FILE] [--out FILE] [--workers N] [--threads T] [--batch-size U]
//            [--repeat R]
// Requests (default stdin): one user a line, `request_time item:timestamp ...` oldest first.
// Answers (default stdout): one line a user, in request order, `item:score ...` best first.
// N workers (default 1) take batches of U users (default 1) from a shared queue, each with T
// intra-op threads (default 1); the requests are answered R times (default 1) after one warm-up
// batch, and the last pass's answers are written.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "latency.h"
#include "requests.h"

namespace {

using cpp_serving::Request;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string package, library, requests = "-", out = "-";
  int workers = 1, threads = 1, batch_size = 1, repeat = 1;
};

int positive(const std::string& name, const std::string& value) {
  const int parsed = std::stoi(value);
  if (parsed < 1) throw std::runtime_error(name + " must be at least 1, got " + value);
  return parsed;
}

Options parse_options(int argc, char** argv) {
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0 || i + 1 >= argc) {
      throw std::runtime_error("expected --flag value pairs, got '" + flag + "'");
    }
    given[flag.substr(2)] = argv[i + 1];
  }
  Options options;
  for (const auto& [name, value] : given) {
    if (name == "package")
      options.package = value;
    else if (name == "library")
      options.library = value;
    else if (name == "requests")
      options.requests = value;
    else if (name == "out")
      options.out = value;
    else if (name == "workers")
      options.workers = positive("--workers", value);
    else if (name == "threads")
      options.threads = positive("--threads", value);
    else if (name == "batch-size")
      options.batch_size = positive("--batch-size", value);
    else if (name == "repeat")
      options.repeat = positive("--repeat", value);
    else
      throw std::runtime_error("unknown flag --" + name);
  }
  if (options.package.empty() || options.library.empty()) {
    throw std::runtime_error("--package and --library are required");
  }
  return options;
}

// recops' library defines the recops:: and fbgemm:: ops the package calls through the
// dispatcher; it must be loaded before the package runs.
void load_library(const std::string& path) {
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    throw std::runtime_error("cannot load " + path + ": " + dlerror());
  }
}

int64_t metadata_integer(const std::unordered_map<std::string, std::string>& metadata,
                         const std::string& key) {
  const auto found = metadata.find(key);
  if (found == metadata.end()) {
    throw std::runtime_error("the package's metadata has no " + key +
                             ": was it made by python -m recops.export?");
  }
  return std::stoll(found->second);
}

std::vector<Request> read_all(const std::string& path, int64_t num_items) {
  if (path == "-") return cpp_serving::read_requests(std::cin, num_items);
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return cpp_serving::read_requests(in, num_items);
}

void write_answers(std::ostream& out, const std::vector<std::vector<at::Tensor>>& answers) {
  for (const std::vector<at::Tensor>& answer : answers) {
    const at::Tensor items = answer[0].contiguous(), scores = answer[1].contiguous();
    const int64_t* item = items.data_ptr<int64_t>();
    const float* score = scores.data_ptr<float>();
    for (int64_t user = 0; user < items.size(0); ++user) {
      for (int64_t j = 0; j < items.size(1); ++j) {
        char pair[64];
        const int64_t at = user * items.size(1) + j;
        std::snprintf(pair, sizeof pair, "%s%lld:%.9g", j ? " " : "",
                      static_cast<long long>(item[at]), static_cast<double>(score[at]));
        out << pair;
      }
      out << "\n";
    }
  }
}

int serve(const Options& options) {
  load_library(options.library);
  torch::inductor::AOTIModelPackageLoader loader(options.package, "model", false,
                                                 static_cast<size_t>(options.workers));
  const auto metadata = loader.get_metadata();
  const int64_t max_seq_len = metadata_integer(metadata, "recops.max_seq_len");
  const std::vector<Request> requests =
      read_all(options.requests, metadata_integer(metadata, "recops.num_items"));
  const size_t batch_size = static_cast<size_t>(options.batch_size);
  const size_t batches = (requests.size() + batch_size - 1) / batch_size;

  auto answer = [&](size_t batch) {
    const size_t first = batch * batch_size;
    const size_t count = std::min(batch_size, requests.size() - first);
    return loader.run(cpp_serving::graph_inputs(requests.data() + first, count, max_seq_len));
  };
  at::set_num_threads(options.threads);
  if (batches > 0) answer(0);  // warm-up: first-call initialisation stays out of the timings

  std::vector<std::vector<at::Tensor>> answers(batches);
  std::vector<double> latencies_ms(batches * static_cast<size_t>(options.repeat));
  std::atomic<size_t> next{0};
  const Clock::time_point begin = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < options.workers; ++w) {
    workers.emplace_back([&] {
      at::set_num_threads(options.threads);  // the intra-op thread count is per calling thread
      for (size_t task = next++; task < latencies_ms.size(); task = next++) {
        const Clock::time_point start = Clock::now();
        std::vector<at::Tensor> result = answer(task % batches);
        latencies_ms[task] =
            std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        if (task / batches + 1 == static_cast<size_t>(options.repeat)) {
          answers[task % batches] = std::move(result);
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();

  if (options.out == "-") {
    write_answers(std::cout, answers);
  } else {
    std::ofstream out(options.out);
    write_answers(out, answers);
    if (!out) throw std::runtime_error("cannot write " + options.out);
  }
  using cpp_serving::percentile;
  const double users = static_cast<double>(requests.size()) * options.repeat;
  std::fprintf(stderr,
               "{\"users\": %zu, \"batches\": %zu, \"repeat\": %d, \"workers\": %d, "
               "\"threads\": %d, \"batch_size\": %d, \"latency_ms\": {\"p50\": %.4f, "
               "\"p90\": %.4f, \"p99\": %.4f, \"max\": %.4f}, \"users_per_second\": %.2f}\n",
               requests.size(), batches, options.repeat, options.workers, options.threads,
               options.batch_size, percentile(latencies_ms, 50), percentile(latencies_ms, 90),
               percentile(latencies_ms, 99), percentile(latencies_ms, 100),
               seconds > 0 ? users / seconds : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return serve(parse_options(argc, argv));
  } catch (const std::exception& error) {
    std::cerr << "recops_cpp_serving: " << error.what() << "\n";
    return 2;
  }
}
