"""Precision `tf32`: fp32 training whose matmuls run on TF32 tensor cores (gbmw.specs.model_spec.PRECISIONS).

torch decides it per process (`torch.backends.cuda.matmul.allow_tf32`, off by default since torch 1.12; cuDNN's
convolutions have their own switch, which gbmw's Transformers do not use). The runtime turns it on for the steps of a
tf32 plan and puts back what it found, so that nothing else in the process changes; an fp32 plan runs with it off, as
its estimate assumes. On a CPU the switch changes nothing (CPU matmuls have no TF32).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """Within the block, CUDA matmuls of fp32 tensors use TF32 exactly when `precision` is `tf32`."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def in_plan_matmul_precision(step):
    """Decorates an engine method whose `self.plan` says the precision: the method runs within `matmul_precision`."""

    @functools.wraps(step)
    def run(self, *args, **kwargs):
        with matmul_precision(self.plan.precision):
            return step(self, *args, **kwargs)

    return run
