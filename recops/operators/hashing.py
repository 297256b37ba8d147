"""Fake kernels of the hashing family (kernels live in csrc/recops/hashing): FBGEMM's
zero-collision hashing ops behind torchrec's ``HashZchManagedCollisionModule``
(docs/jagged_sparse.md)."""

import torch

from recops._fake import register_fake


@register_fake("recops::zero_collision_hash")
def _zero_collision_hash_fake(input, identities, max_probe, *args, **kwargs):
    torch._check(input.dim() == 1, lambda: f"input must be 1-D, got shape {tuple(input.shape)}")
    # The second output (evicted slots) is None in readonly mode, the only mode on CPU.
    return input.new_empty(input.shape, dtype=torch.int64), None
