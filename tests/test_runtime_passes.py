"""The bytes gbmw.cost.runtime_passes charges for the runtime's unfused RMSNorm, SwiGLU and rotary functions, counted
independently: every aten operator the function runs (forward, then backward through autograd) under a dispatch
mode that adds the bytes of its tensor inputs and outputs — what a kernel reads and writes, views excepted.

Tolerance: 0.5 bytes per element. The count also holds what the constants leave out on purpose — the per-token
1/rms (1/1024 of the elements here, a few reads), the weight and the rotary angle tables (1/256 of the elements,
each built and read in a few passes), 0-d scalars — at most a few tenths of a byte per element with these shapes;
one pass the constants forgot or invented moves the count by at least 2 bytes per element (a read or a write of a
16-bit element)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from gbmw.adapters.runtime.gated_mlp import swiglu  # noqa: E402
from gbmw.adapters.runtime.rms_norm import RMSNorm  # noqa: E402
from gbmw.adapters.runtime.rotary import rotate  # noqa: E402
from gbmw.cost.runtime_passes import (  # noqa: E402
    ROTARY_PASS_BYTES_PER_ACTIVATION_BYTE, RMS_NORM_PASS_BYTES, SWIGLU_PASS_BYTES)

pytestmark = pytest.mark.torch
TOLERANCE_BYTES_PER_ELEMENT = 0.5


class ByteCount(TorchDispatchMode):
    """Sums the bytes of every non-view operator's tensor inputs and outputs."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.bytes += sum(leaf.numel() * leaf.element_size()
                              for leaf in tree_leaves((args, kwargs, output)) if isinstance(leaf, torch.Tensor))
        return output


def _bytes_per_element(function, inputs: list, elements: int) -> tuple[float, float]:
    """(forward, backward) bytes per element of `function(*inputs)`, the output's gradient given in its dtype."""
    with ByteCount() as forward:
        output = function(*inputs)
    grad_output = torch.randn_like(output)
    leaves = [tensor for tensor in inputs if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
    with ByteCount() as backward:
        torch.autograd.grad(output, leaves, grad_output)
    return forward.bytes / elements, backward.bytes / elements


def test_rms_norm_on_the_fp32_residual_stream():
    norm = RMSNorm(1024)
    torch.nn.init.ones_(norm.weight)
    x = torch.randn(2, 1024, 1024, requires_grad=True)
    counted = _bytes_per_element(lambda value: norm(value), [x], x.numel())
    assert counted == pytest.approx(RMS_NORM_PASS_BYTES, abs=TOLERANCE_BYTES_PER_ELEMENT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_swiglu_on_autocast_and_fp32_inputs(dtype):
    gate = torch.randn(2048, 1024, dtype=dtype, requires_grad=True)
    up = torch.randn(2048, 1024, dtype=dtype, requires_grad=True)
    counted = _bytes_per_element(swiglu, [gate, up], gate.numel())
    expected = SWIGLU_PASS_BYTES[gate.element_size()]
    assert counted == pytest.approx(expected, abs=TOLERANCE_BYTES_PER_ELEMENT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotary_rotation_of_queries(dtype):
    x = torch.randn(8, 256, 32, 64, dtype=dtype, requires_grad=True)  # batch, tokens, heads, head_dim
    counted = _bytes_per_element(rotate, [x], x.numel())
    expected = tuple(share * x.element_size() for share in ROTARY_PASS_BYTES_PER_ACTIVATION_BYTE)
    assert counted == pytest.approx(expected, abs=TOLERANCE_BYTES_PER_ELEMENT)
