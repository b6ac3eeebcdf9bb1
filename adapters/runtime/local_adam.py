"""Adam on each rank's local shards: torch's Adam arithmetic, without DTensor dispatch per operation.

FSDP2 parameters, their gradients and their Adam moments are DTensors. torch.optim.Adam on DTensors sends
every element-wise operation of the update (about ten per parameter) through DTensor's sharding
propagation, although Adam never communicates: the update of a shard needs only that shard.
`benchmarks/optimizer_step.py` (the tiny GPT, every layer sdp2 over two gloo processes) measured a median
step of 16.1 ms with torch.optim.Adam on the DTensors and 2.7 ms here, with identical parameters after three
steps from the same start; the estimator's optimizer term is per parameter and cannot see the difference.
So the update runs torch's own functional Adam (`torch.optim.adam.adam`, the function torch.optim.Adam.step
calls) on the local tensors; the parameters, gradients and moments stay DTensors for everything else (checkpoints gather them, the held-memory probe
reads them). The state keeps torch.optim.Adam's format ({"step", "exp_avg", "exp_avg_sq"}), so loading and
saving are unchanged.

The update runs ADAM_CHUNK_ELEMENTS elements at a time (whole tensors, or slices of a larger one): torch's
multi-tensor Adam allocates √v for every element it updates at once, so one call over a stage would need 4 bytes
per parameter beside the states; chunks bound that to 64 MiB (the reserve gbmw.cost.framework_memory prices). The
arithmetic is element-wise, so the result is the same bit for bit.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam as functional_adam

from gbmw.cost.framework_memory import ADAM_CHUNK_ELEMENTS

from .sharding import local_value


class LocalShardAdam(torch.optim.Adam):
    """torch.optim.Adam (no amsgrad, no fused/capturable) whose update runs on `to_local()` views."""

    def __init__(self, params, **settings) -> None:
        for unsupported in ("amsgrad", "fused", "capturable", "differentiable", "maximize"):
            if settings.get(unsupported):
                raise ValueError(f"LocalShardAdam does not implement {unsupported}=True")
        super().__init__(params, **settings)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("LocalShardAdam.step takes no closure")
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                state = self.state[parameter]
                if not state:  # torch.optim.Adam's lazy initialisation, same keys, dtypes and devices
                    state["step"] = torch.tensor(0.0, dtype=torch.get_default_dtype())
                    state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                tensors = [local_value(t) for t in (parameter, parameter.grad, state["exp_avg"], state["exp_avg_sq"])]
                for start in range(0, max(1, tensors[0].numel()), ADAM_CHUNK_ELEMENTS):
                    pieces = [_flat(t)[start:start + ADAM_CHUNK_ELEMENTS] if tensors[0].numel() > ADAM_CHUNK_ELEMENTS
                              else t for t in tensors]
                    for collected, piece in zip((params, grads, exp_avgs, exp_avg_sqs), pieces):
                        collected.append(piece)
                    # each slice advances its own copy of the count, the first the parameter's own: one step in all
                    steps.append(state["step"] if start == 0 else state["step"].clone())
            if not params:
                continue
            beta1, beta2 = group["betas"]
            for first, end in _chunks([p.numel() for p in params]):
                functional_adam(params[first:end], grads[first:end], exp_avgs[first:end], exp_avg_sqs[first:end], [],
                                steps[first:end], foreach=group["foreach"], amsgrad=False, beta1=beta1, beta2=beta2,
                                lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                                decoupled_weight_decay=group.get("decoupled_weight_decay", False))
        return None


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view (updates through it reach the tensor): parameters, gradients and moments are contiguous."""
    if not tensor.is_contiguous():
        raise ValueError("LocalShardAdam slices contiguous tensors only")
    return tensor.view(-1)


def _chunks(sizes: list[int]) -> list[tuple[int, int]]:
    """Consecutive [first, end) runs of tensors of at most ADAM_CHUNK_ELEMENTS elements together (one tensor
    alone may reach it: larger ones were sliced)."""
    runs, first, total = [], 0, 0
    for index, size in enumerate(sizes):
        if index > first and total + size > ADAM_CHUNK_ELEMENTS:
            runs.append((first, index))
            first, total = index, 0
        total += size
    if sizes:
        runs.append((first, len(sizes)))
    return runs
