"""torch.compile (fullgraph, dynamic shapes) and torch.export over the jagged / sparse ops.

The graphs below call only operators (no pointwise math), so inductor compiles them without
generating C++ and stays fast; the backward test uses aot_eager.
"""

import pytest
import torch

ops = torch.ops.recops

# torch.ops.fbgemm.* are FBGEMM's own ops when it is loaded and recops' definitions when hidden.
NAMESPACES = ["recops", "fbgemm"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compile_full(fn, backend="inductor"):
    return torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)


def assert_same(actual, expected):
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    elif expected is None:
        assert actual is None
    else:
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def jagged_input(batch, max_length, inner, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_length + 2, (batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randn(int(offsets[-1]), inner, generator=gen)
    return values, offsets


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_compile_cumsum(namespace):
    ns = getattr(torch.ops, namespace)

    def fn(lengths, matrix):
        return (
            ns.asynchronous_complete_cumsum(lengths),
            ns.asynchronous_exclusive_cumsum(lengths),
            ns.asynchronous_inclusive_cumsum(lengths),
            ns.asynchronous_complete_cumsum(matrix),
        )

    compiled = compile_full(fn)
    for n in (5, 9):
        args = (torch.randint(0, 10, (n,)), torch.randint(0, 10, (3, n), dtype=torch.int32))
        assert_same(compiled(*args), fn(*args))


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_compile_jagged_to_dense(namespace):
    ns = getattr(torch.ops, namespace)

    def fn(values, values_1d, offsets, starts):
        dense = ns.jagged_to_padded_dense(values, [offsets], [4], -1.0)
        dense_2d = ns.jagged_2d_to_dense(values, offsets, 3)
        dense_1d = ns.jagged_1d_to_dense(values_1d, offsets, 3, -1)
        positions = ns.offsets_range(starts, values.shape[0])
        grad = ns.jagged_to_padded_dense_backward(dense, [offsets], values.shape[0])
        return dense, dense_2d, dense_1d, positions, grad

    compiled = compile_full(fn)
    for batch, seed in ((4, 0), (7, 1)):
        values, offsets = jagged_input(batch, 4, 3, seed)
        args = (values, torch.arange(values.shape[0]), offsets, offsets[:-1].clone())
        assert_same(compiled(*args), fn(*args))


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_compile_dense_to_jagged_data_dependent(namespace):
    # Without total_L the number of rows is read from the offsets: an unbacked size.
    ns = getattr(torch.ops, namespace)

    def fn(dense, offsets):
        values, out_offsets = ns.dense_to_jagged(dense, [offsets])
        forward = ns.dense_to_jagged_forward(dense, [offsets])
        padded = ns.dense_to_jagged_forward(dense, [offsets], dense.shape[0] * dense.shape[1] + 2)
        return values, out_offsets, forward, padded

    compiled = compile_full(fn)
    for batch, seed in ((4, 0), (6, 1)):
        _, offsets = jagged_input(batch, 3, 2, seed)
        dense = torch.randn(batch, 3, 2)
        assert_same(compiled(dense, offsets), fn(dense, offsets))


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_compile_permute_data_dependent(namespace):
    # Without permuted_lengths_sum the output size is read from lengths: an unbacked size.
    ns = getattr(torch.ops, namespace)

    def fn(permute, lengths, lengths_1d, values, weights):
        out_2d = ns.permute_2D_sparse_data(permute, lengths, values, weights)
        out_1d = ns.permute_1D_sparse_data(permute, lengths_1d, values, None)
        hinted = ns.permute_2D_sparse_data(permute, lengths, values, weights, values.shape[0])
        return out_2d, out_1d, hinted, ns.invert_permute(permute)

    compiled = compile_full(fn)
    for num_features, batch in ((4, 3), (6, 2)):
        lengths = torch.randint(0, 4, (num_features, batch))
        permute = torch.randperm(num_features).to(torch.int32)
        total = int(lengths.sum())
        values = torch.randint(0, 100, (total,))
        args = (permute, lengths, lengths[:, 0].contiguous(), values, torch.randn(total))
        assert_same(compiled(*args), fn(*args))


def test_compile_backward():
    def fn(values, dense, offsets, permute, lengths, weights):
        padded = ops.jagged_to_padded_dense(values, [offsets], [3], 0.0)
        jagged, _ = ops.dense_to_jagged(dense, [offsets])
        _, _, permuted = ops.permute_2D_sparse_data(permute, lengths, jagged[:, 0], weights)
        return padded.square().sum() + jagged.square().sum() + (permuted * permuted).sum()

    compiled = compile_full(fn, backend="aot_eager")
    for batch, seed in ((4, 0), (5, 1)):
        values, offsets = jagged_input(batch, 3, 2, seed)
        total = values.shape[0]
        lengths = torch.tensor([[total // 2], [total - total // 2]])
        permute = torch.tensor([1, 0], dtype=torch.int32)
        grads = []
        for f in (fn, compiled):
            leaves = [
                values.clone().requires_grad_(),
                torch.randn(batch, 3, 2, generator=torch.Generator().manual_seed(seed)),
                torch.randn(total + 1, generator=torch.Generator().manual_seed(seed)),
            ]
            leaves[1].requires_grad_()
            leaves[2].requires_grad_()
            f(leaves[0], leaves[1], offsets, permute, lengths, leaves[2]).backward()
            grads.append([leaf.grad for leaf in leaves])
        for ours, eager in zip(grads[1], grads[0], strict=True):
            torch.testing.assert_close(ours, eager)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_export_jagged_to_padded_dense_single_forward_node(namespace):
    # Through torch.ops.fbgemm the graph holds fbgemm nodes only, whether FBGEMM or recops defined
    # them, so it runs wherever FBGEMM is installed.
    ns = getattr(torch.ops, namespace)

    class Pad(torch.nn.Module):
        def forward(self, values, offsets):
            return ns.jagged_to_padded_dense(values, [offsets], [4], 0.0)

    values, offsets = jagged_input(4, 4, 3, 0)
    # B >= 2: tracing guards the output's batch size (offsets.size(0) - 1) != 1 in torch's
    # contiguity check (FBGEMM's op gets the same guard).
    dims = {"values": {0: torch.export.Dim("L")}, "offsets": {0: torch.export.Dim("B1", min=3)}}
    exported = torch.export.export(Pad(), (values, offsets), dynamic_shapes=dims)
    # The training IR keeps the composite custom op as one node; decomposing it to ATen IR
    # leaves exactly one jagged_to_padded_dense_forward node.
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert targets == [ns.jagged_to_padded_dense.default]
    decomposed = exported.run_decompositions()
    targets = [n.target for n in decomposed.graph.nodes if n.op == "call_function"]
    assert targets == [ns.jagged_to_padded_dense_forward.default]
    for batch, seed in ((4, 0), (9, 1)):
        values, offsets = jagged_input(batch, 4, 3, seed)
        assert_same(decomposed.module()(values, offsets), Pad()(values, offsets))
