"""One call of a runtime mechanism on the profiling pair for `gbmw profile model`, timed the way training runs
it: on two or more processes, ranks 0 and 1 time one Slice-Gather between a sliced and a replicated layout
(`slice_gather_time_s`) and one pipeline transfer (`p2p_time_s`) of the larger batch's hidden state. The
estimator charges what these show beyond compute and its modelled collectives as a per-call framework cost.
Each call runs in both directions, each after a barrier on the pair; a sample is the mean of the two, and
the mean over the fastest quarter of the samples is kept (timing.py).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.tensor_parallel import TensorParallel
from .layer_timers import _synchronise
from .timing import fast_mean_s


class PairCallTimer:
    """One call of a runtime mechanism on the profiling pair, in both directions per run(): each direction
    after a barrier on the pair, timed on this rank; a sample is the mean of the two directions."""

    def __init__(self, device: torch.device, pair: TensorParallel, message_bytes: int):
        self.device, self.pair, self.bytes = device, pair, message_bytes
        self.samples: list[float] = []
        for _ in range(2):
            self._both()  # warm-up

    def call(self, direction: int) -> None:
        raise NotImplementedError

    def _both(self) -> float:
        total = 0.0
        for direction in (0, 1):
            dist.barrier(group=self.pair.group)
            _synchronise(self.device)
            started = time.perf_counter()
            self.call(direction)
            _synchronise(self.device)
            total += time.perf_counter() - started
        return total / 2

    def run(self) -> None:
        self.samples.append(self._both())

    def fastest(self, chosen: list[int] | None = None) -> float:
        """One call (the mean of the two directions): fast-quarter seconds (or over the runs `chosen`)."""
        return fast_mean_s(self.samples, chosen)


class SliceGatherTimer(PairCallTimer):
    """The runtime's Slice-Gather (gbmw.adapters.runtime.redistribute), forward and backward: a micro-batch's
    hidden state re-laid from sliced in two to replicated (direction 0), and back (direction 1)."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                 pair: TensorParallel):
        from ..runtime.redistribute import BatchLayout

        self.sliced, self.replicated = BatchLayout((0, 1), 2), BatchLayout((0, 0), 1)
        self.full = torch.randn(batch, architecture.seq_length, architecture.hidden_size, device=device, dtype=dtype)
        self.half = self.sliced.take(self.full, pair.rank).clone()
        super().__init__(device, pair, self.full.numel() * self.full.element_size())

    def call(self, direction: int) -> None:
        from ..runtime.redistribute import relayout

        source, target, value = ((self.sliced, self.replicated, self.half) if direction == 0
                                 else (self.replicated, self.sliced, self.full))
        x = value.detach().requires_grad_()
        relayout(x, source, target, self.pair.rank, self.pair.group).sum().backward()


class PipelineSendTimer(PairCallTimer):
    """The runtime's stage-to-stage transfer (gbmw.adapters.runtime.pipeline.PipelineLinks): a micro-batch's
    hidden state from the pair's first rank to its second (direction 0), then back (direction 1)."""

    def __init__(self, architecture: Any, device: torch.device, dtype: torch.dtype, batch: int,
                 pair: TensorParallel):
        from ..runtime.pipeline import PipelineLinks

        peer = dist.get_process_group_ranks(pair.group)[1 - pair.rank]
        self.links = PipelineLinks(peer, peer)
        self.message = torch.randn(batch, architecture.seq_length, architecture.hidden_size, device=device, dtype=dtype)
        super().__init__(device, pair, self.message.numel() * self.message.element_size())

    def call(self, direction: int) -> None:
        if self.pair.rank == direction:
            self.links.exchange([(self.message, self.links.next_rank)], [])
        else:
            self.links.exchange([], [(torch.empty_like(self.message), self.links.previous_rank)])
