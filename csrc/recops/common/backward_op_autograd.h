// The autograd of an op whose gradient is computed by another op, its backward, bound in C++ as
// the Autograd kernel of the forward. The backward's schema follows one convention: it takes
// `grad_output` (a Tensor, or a Tensor[] when the forward returns a list) followed by exactly the
// forward's arguments, and names each result `grad_<argument>`. So one boxed kernel serves every
// such op: it runs the forward below autograd, saves the call's arguments (tensors as saved
// variables, checked for in-place changes), and its graph node calls the backward through the
// dispatcher, so compiled and exported graphs see the backward op.
//
// In C++ rather than torch.library.register_autograd: the Python wrapper costs ~0.12 ms per op
// per step (forward and backward), as much as a small step's kernels.
#pragma once

#include <torch/library.h>

#include <string>
#include <vector>

namespace recops {

// The Autograd kernel of a forward op whose backward op is `backward` (qualified, e.g.
// "recops::l2_normalize_backward"). `identity_grads` names forward arguments whose gradient is
// the output's gradient itself (a residual input) rather than a result of the backward.
// An output's missing gradient reaches the backward as zeros.
torch::CppFunction autograd_by_backward_op(std::string backward,
                                           std::vector<std::string> identity_grads = {});

}  // namespace recops
