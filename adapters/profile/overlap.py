"""Matmul rate and overlap slowdown of the launched processes for `gbmw profile cluster` (torch.distributed
initialised on every rank; torch is imported inside the functions).

- Overlap slowdown (`measure_overlap_slowdown`): a matmul loop and an all-reduce loop of about equal
  length, alone and at once (paper Sec. 5: overlapped compute and communication both slow down). The
  factor f is the one that makes the estimator's overlapped time max(c, g) + (f − 1)·min(c, g)
  (gbmw/cost/layer_cost.py) equal the measured wall time.
- Matmul rate (`measure_matmul_tflops`): a square matmul on every rank at once (the slowest rank's),
  fp32 without TF32 (on CUDA also fp16 and bf16); the device's matmul rate (`sustained_tflops`).
- Memory bandwidth (`measure_memory_bandwidth_gb_per_s`): a STREAM copy of a large tensor on every rank at
  once (bytes read + written over the time); the rate of the memory-bound kernels.
Times are the slowest rank's, fast-quarter means (timing.py).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from gbmw.errors import SpecError

from .collective_timing import _barrier, _Ranks, _ranks, _repeated, _slowest, _timed
from .link_fit import ELEMENT_BYTES
from .timing import fast_mean_s


@dataclass(frozen=True)
class OverlapMeasurement:
    """Compute and communication loops alone and overlapped; times of the slowest rank, fast-quarter means."""

    compute_alone_s: float
    communication_alone_s: float
    compute_overlapped_s: float
    communication_overlapped_s: float
    matmul_dim: int
    message_bytes: int
    matmuls: int
    all_reduces: int

    @property
    def slowdown(self) -> float:
        """f with max(c, g) + (f − 1)·min(c, g) = the overlapped wall time; at least 1.0."""
        alone_long = max(self.compute_alone_s, self.communication_alone_s)
        alone_short = min(self.compute_alone_s, self.communication_alone_s)
        together = max(self.compute_overlapped_s, self.communication_overlapped_s)
        return max(1.0, 1.0 + (together - alone_long) / alone_short)


def _matmul_inputs(ranks: _Ranks, dim: int, dtype: Any):
    import torch

    generator = torch.Generator(device="cpu").manual_seed(ranks.rank)
    return [torch.randn(dim, dim, generator=generator, dtype=torch.float32).to(ranks.device, dtype) for _ in range(2)]


def default_matmul_dim(ranks: _Ranks) -> int:
    return 4096 if ranks.is_cuda else 256


def measure_matmul_tflops(precision: str = "fp32", dim: int | None = None, repeats: int = 5,
                          seconds_per_repeat: float = 0.05) -> float:
    """TFLOP/s of a square matmul on every rank at once; the slowest rank's, fast-quarter mean (fp32 without TF32;
    tf32: fp32 tensors with torch's TF32 switch on)."""
    import torch

    ranks = _ranks()
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    dim = dim or default_matmul_dim(ranks)
    left, right = _matmul_inputs(ranks, dim, dtype)
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        single = _timed(ranks, lambda: left @ right, 3)
        count = int(max(1, _slowest(ranks, [math.ceil(seconds_per_repeat / max(single, 1e-9))])[0]))
        seconds = _timed(ranks, _repeated(lambda: left @ right, count), repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    return 2 * dim**3 * count / seconds / 1e12


def measure_memory_bandwidth_gb_per_s(tensor_bytes: int | None = None, repeats: int = 5,
                                     seconds_per_repeat: float = 0.05) -> float:
    """GB/s of a STREAM copy (`out.copy_(source)`: reads and writes `tensor_bytes` each) on every rank at once;
    the slowest rank's, fast-quarter mean. Default size: 256 MiB on CUDA, 64 MiB on CPU (beyond the caches)."""
    import torch

    ranks = _ranks()
    tensor_bytes = tensor_bytes or (256 if ranks.is_cuda else 64) * 2**20
    source = torch.ones(tensor_bytes // 4, dtype=torch.float32, device=ranks.device)
    out = torch.empty_like(source)
    single = _timed(ranks, lambda: out.copy_(source), 3)
    count = int(max(1, _slowest(ranks, [math.ceil(seconds_per_repeat / max(single, 1e-9))])[0]))
    seconds = _timed(ranks, _repeated(lambda: out.copy_(source), count), repeats)
    return 2 * source.numel() * 4 * count / seconds / 1e9


def measure_overlap_slowdown(message_bytes: int, matmul_dim: int | None = None, phase_seconds: float = 0.2,
                             repeats: int = 3) -> OverlapMeasurement:
    """A matmul loop and an all-reduce loop over all ranks of about equal length: alone, then at once.

    The all-reduces run in a second thread (on a side CUDA stream under NCCL) while this thread
    multiplies; each side's time ends when its own work is done. The loop lengths are agreed across
    ranks (slowest rank's single-step times) so every rank issues the same collectives.
    """
    import torch
    import torch.distributed as dist

    ranks = _ranks()
    if message_bytes < ELEMENT_BYTES or message_bytes % ELEMENT_BYTES:
        raise SpecError(f"overlap message_bytes {message_bytes}: must be a positive multiple of {ELEMENT_BYTES}")
    dim = matmul_dim or default_matmul_dim(ranks)
    left, right = _matmul_inputs(ranks, dim, torch.float32)
    message = torch.ones(message_bytes // ELEMENT_BYTES, device=ranks.device)
    one_reduce = _timed(ranks, _repeated(lambda: dist.all_reduce(message), 4), 3) / 4
    one_matmul = _timed(ranks, _repeated(lambda: left @ right, 8), 3) / 8
    all_reduces = max(1, math.ceil(phase_seconds / one_reduce))
    matmuls = max(1, round(all_reduces * one_reduce / one_matmul))

    def compute() -> float:
        start = time.perf_counter()
        for _ in range(matmuls):
            left @ right
        if ranks.is_cuda:
            torch.cuda.current_stream(ranks.device).synchronize()
        return time.perf_counter() - start

    def communicate(start: float) -> float:
        for _ in range(all_reduces):
            dist.all_reduce(message)
        if ranks.is_cuda:
            torch.cuda.current_stream(ranks.device).synchronize()
        return time.perf_counter() - start

    def overlapped() -> tuple[float, float]:
        result: dict[str, Any] = {}

        def side(start: float) -> None:
            try:
                if ranks.is_cuda:
                    torch.cuda.set_device(ranks.device)  # the current device is per thread
                    with torch.cuda.stream(torch.cuda.Stream(ranks.device)):
                        result["seconds"] = communicate(start)
                else:
                    result["seconds"] = communicate(start)
            except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
                result["error"] = error

        _barrier(ranks)
        start = time.perf_counter()
        thread = threading.Thread(target=side, args=(start,), name="gbmw-overlap-all-reduce")
        thread.start()
        compute_seconds = compute()
        thread.join()
        if "error" in result:
            raise result["error"]
        return compute_seconds, result["seconds"]

    samples = []
    for _ in range(repeats):
        _barrier(ranks)
        compute_alone = compute()
        _barrier(ranks)
        communication_alone = communicate(time.perf_counter())
        compute_together, communication_together = overlapped()
        samples.append(_slowest(ranks, [compute_alone, communication_alone, compute_together, communication_together]))
    fastest = [fast_mean_s(column) for column in zip(*samples)]
    return OverlapMeasurement(*fastest, matmul_dim=dim, message_bytes=message_bytes, matmuls=matmuls,
                              all_reduces=all_reduces)
