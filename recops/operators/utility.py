"""Fake kernels of the utility family (kernels live in csrc/recops/utility): FBGEMM's host-side
queries ``check_feature_gate_key`` (a composite: no fake needed) and ``is_uvm_tensor``."""

from recops._fake import register_fake


@register_fake("recops::is_uvm_tensor")
def _is_uvm_tensor_fake(t):
    return False
