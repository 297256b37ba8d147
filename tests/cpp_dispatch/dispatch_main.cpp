// Loads recops' library into a process with no Python and calls its ops through torch's
// dispatcher: every recops:: and fbgemm:: op recops defines resolves with a CPU kernel, recops
// defines every fbgemm:: op it serves (no FBGEMM library is loaded here), and
// fbgemm::asynchronous_complete_cumsum, fbgemm::jagged_to_padded_dense (forward and C++ autograd)
// and recops::hstu_dense_forward equal plain ATen references.
//
// Usage: recops_cpp_dispatch <recops/_C*.so> <file of the expected ops, one qualified name a line>
// Prints a line for each failed check and exits 1 if there is one.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cout << "FAILED: " << what << "\n";
    ++failures;
  }
}

std::optional<c10::OperatorHandle> find(const std::string& qualified_name) {
  return c10::Dispatcher::singleton().findSchema({qualified_name, ""});
}

// Calls the op with `args`, followed by the schema's defaults for the arguments not given;
// returns its results.
std::vector<c10::IValue> call(const std::string& qualified_name, std::vector<c10::IValue> args) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(qualified_name.c_str(), "");
  const std::vector<c10::Argument>& arguments = op.schema().arguments();
  for (size_t i = args.size(); i < arguments.size(); ++i) {
    args.push_back(*arguments[i].default_value());
  }
  op.callBoxed(&args);
  return args;
}

at::Tensor longs(std::vector<int64_t> values) {
  return at::tensor(values, at::kLong);
}

void check_cumsum() {
  const at::Tensor out =
      call("fbgemm::asynchronous_complete_cumsum", {longs({1, 2, 3})})[0].toTensor();
  check(at::equal(out, longs({0, 1, 3, 6})), "fbgemm::asynchronous_complete_cumsum([1, 2, 3])");
}

// Three segments of 2, 0 and 3 rows of 2 columns, padded to 3 rows with -1.
void check_jagged_to_padded_dense() {
  const at::Tensor values = at::arange(10, at::kFloat).reshape({5, 2}).requires_grad_();
  const at::Tensor offsets = longs({0, 2, 2, 5});
  const at::Tensor dense =
      call("fbgemm::jagged_to_padded_dense",
           {values, c10::List<at::Tensor>({offsets}), std::vector<int64_t>{3}, -1.0})[0]
          .toTensor();
  at::Tensor expected = at::full({3, 3, 2}, -1.0, at::kFloat);
  expected[0].narrow(0, 0, 2).copy_(values.detach().narrow(0, 0, 2));
  expected[2].copy_(values.detach().narrow(0, 2, 3));
  check(at::equal(dense.detach(), expected), "fbgemm::jagged_to_padded_dense");
  // Each value lands in one place: its gradient of the sum of the dense tensor is 1.
  dense.sum().backward();
  check(values.grad().defined() && at::equal(values.grad(), at::ones_like(values)),
        "fbgemm::jagged_to_padded_dense's gradient (C++ autograd)");
}

// HSTU attention with its defaults (causal, alpha 1, silu scaled by 1 / max_seq_len): for each
// sequence and head, silu(q k^T) / max_seq_len on and below the diagonal, times v.
void check_hstu_dense_forward() {
  const int64_t rows = 5, heads = 2, dim = 4, max_seq_len = 3;
  const at::Tensor q = at::arange(rows * heads * dim, at::kFloat).sin().reshape({rows, heads, dim});
  const at::Tensor k = at::arange(rows * heads * dim, at::kFloat).cos().reshape({rows, heads, dim});
  const at::Tensor v =
      at::arange(rows * heads * dim, at::kFloat).div(10).reshape({rows, heads, dim});
  const std::vector<int64_t> offsets = {0, 2, 5};
  const at::Tensor out =
      call("recops::hstu_dense_forward", {q, k, v, longs(offsets), c10::IValue(), max_seq_len})[0]
          .toTensor();
  at::Tensor expected = at::zeros_like(v);
  for (size_t b = 0; b + 1 < offsets.size(); ++b) {
    const int64_t start = offsets[b], n = offsets[b + 1] - offsets[b];
    const at::Tensor causal = at::ones({n, n}, at::kFloat).tril();
    for (int64_t h = 0; h < heads; ++h) {
      const at::Tensor qh = q.narrow(0, start, n).select(1, h);
      const at::Tensor kh = k.narrow(0, start, n).select(1, h);
      const at::Tensor vh = v.narrow(0, start, n).select(1, h);
      const at::Tensor attention = at::silu(qh.matmul(kh.t())) / max_seq_len * causal;
      expected.narrow(0, start, n).select(1, h).copy_(attention.matmul(vh));
    }
  }
  check(at::allclose(out, expected, 1e-5, 1e-6), "recops::hstu_dense_forward");
}

std::vector<std::string> read_lines(const char* path) {
  std::ifstream file(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// Every expected op has a schema and a kernel for CPU inputs; recops defined every fbgemm:: op it
// serves, and each is expected.
void check_ops_resolve(const std::vector<std::string>& expected) {
  check(!expected.empty(), "the list of expected ops is not empty");
  for (const std::string& name : expected) {
    const std::optional<c10::OperatorHandle> op = find(name);
    check(op.has_value(), name + " has a schema");
    if (op)
      check(op->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), name + " has a CPU kernel");
  }
  const std::vector<c10::IValue> binding = call("recops::_fbgemm_binding", {});
  const auto served = binding[0].to<std::vector<std::string>>();
  const auto defined = binding[2].to<std::vector<std::string>>();
  check(served == defined, "recops defined every fbgemm:: op it serves");
  for (const std::string& name : served) {
    check(std::find(expected.begin(), expected.end(), "fbgemm::" + name) != expected.end(),
          "fbgemm::" + name + " is expected");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " <recops library> <expected ops file>\n";
    return 2;
  }
  check(!find("fbgemm::asynchronous_complete_cumsum") && !find("recops::hstu_dense_forward"),
        "no fbgemm:: or recops:: op before recops' library is loaded");
  if (dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) == nullptr) {
    std::cout << "FAILED: loading " << argv[1] << ": " << dlerror() << "\n";
    return 1;
  }
  check(dlsym(RTLD_DEFAULT, "Py_IsInitialized") == nullptr, "no Python in the process");
  const std::vector<std::string> expected = read_lines(argv[2]);
  check_ops_resolve(expected);
  check_cumsum();
  check_jagged_to_padded_dense();
  check_hstu_dense_forward();
  if (failures == 0) std::cout << "ok: " << expected.size() << " ops resolve; the calls match\n";
  return failures == 0 ? 0 : 1;
}
