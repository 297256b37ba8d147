// Schemas (FBGEMM's, verbatim) and kernel registrations of the hashing family in torch.ops.recops.
// Fake kernels are registered from Python (recops/operators/hashing.py).
#include <torch/library.h>

#include "recops/hashing/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  // The module where the fake kernels are registered.
  m.set_python_module("recops.operators.hashing");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "create_zch_buffer(int size, bool support_evict=False, Device? device=None, "
      "bool long_type=False) -> (Tensor, Tensor)",
      pt2);
  m.def(
      "zero_collision_hash(Tensor input, Tensor identities, int max_probe, "
      "bool circular_probe=False, int exp_hours=-1, bool readonly=False, "
      "Tensor? local_sizes=None, Tensor? offsets=None, Tensor? metadata=None, "
      "bool output_on_uvm=False, bool disable_fallback=False, "
      "bool _modulo_identity_DPRECATED=False, Tensor? input_metadata=None, "
      "int eviction_threshold=-1, int eviction_policy=0, int opt_in_prob=-1, "
      "int num_reserved_slots=-1, Tensor? opt_in_rands=None, Tensor? runtime_meta=None) "
      "-> (Tensor, Tensor)",
      pt2);
}

// No tensor argument to dispatch on: one kernel for every backend, as FBGEMM registers it.
TORCH_LIBRARY_IMPL(recops, CompositeImplicitAutograd, m) {
  m.impl("create_zch_buffer", TORCH_FN(recops::hashing::create_zch_buffer));
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("zero_collision_hash", TORCH_FN(recops::hashing::zero_collision_hash));
}
