"""How the tests compare an op's floating-point result with its reference: one tolerance per result
dtype, and flash-attention's accuracy rule for attention in low precision."""

import torch

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

# Per result dtype, (rtol, atol) against a reference computed in float64: about one rounding to
# half / bfloat16 (their eps is 9.8e-4 / 7.8e-3), fp32 accumulation in float32, reassociated
# sums in float64. A test whose computation rounds more often scales atol by a factor it explains.
TOLERANCE = {F64: (1e-12, 1e-12), F32: (1e-5, 1e-5), F16: (1e-3, 1e-3), BF16: (8e-3, 8e-3)}


def assert_close(actual, expected, dtype=None, *, atol_factor=1.0, relative_to_max=False, msg=None):
    """actual (of dtype, default its own) within TOLERANCE[dtype] of expected, compared in
    float64. atol_factor scales atol (sums whose terms cancel); relative_to_max makes it a fraction
    of expected's largest magnitude (long reductions, whose error follows the size of their terms
    rather than of their result)."""
    rtol, atol = TOLERANCE[dtype or actual.dtype]
    atol *= atol_factor
    if relative_to_max:
        atol = atol * (expected.abs().max().item() if expected.numel() else 0.0) + 1e-30
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=rtol, atol=atol, check_dtype=False, msg=msg
    )


def assert_errors_within_rule(names, exact, low_reference, actual, factor=2.0):
    """flash-attention's accuracy rule, per result (output, gradients, ...): against the float64
    reference fed the same low-precision values (`exact`), the op's error is at most `factor`
    times the error of the plain-PyTorch reference run in the low precision (`low_reference`),
    plus a floor of 1e-6 of the result's magnitude. A result that does not exist (None in
    `exact`, an unused input's gradient) must be None or zero in `actual`."""
    for name, e, r, g in zip(names, exact, low_reference, actual, strict=True):
        if e is None:
            assert g is None or not g.abs().any(), name
            continue
        ref_err = (r - e).abs().max().item() if e.numel() else 0.0
        err = (g - e).abs().max().item() if e.numel() else 0.0
        floor = 1e-6 * (e.abs().max().item() if e.numel() else 0.0) + 1e-30
        assert err <= factor * ref_err + floor, (
            f"{name}: error {err:.3e}, {factor:g} x the low-precision reference's {ref_err:.3e}"
        )
