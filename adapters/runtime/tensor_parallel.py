"""Tensor parallelism (Megatron-LM; paper Sec. 2.2): one layer's weights split over its TP group.

Every layer of a gbmw plan may use its own TP group (paper Sec. 3: strategies are per layer), so the
megatron-core layers here are built with an explicit `tp_group` rather than megatron's global
parallel state. A one-device "group" uses plain torch modules with the same parameter names and
shapes, so a model built with `TensorParallel.single()` is the ordinary single-process model.

What comes from megatron-core: `ColumnParallelLinear`, `RowParallelLinear`, `VocabParallelEmbedding`
(all accept `tp_group`), and the arithmetic of its vocabulary-parallel cross-entropy
(`VocabParallelCrossEntropy`'s static steps); megatron's own autograd wrapper of that loss reads the
global TP group, so `vocab_parallel_cross_entropy` below re-runs the same steps with the layer's
group. On CPU megatron-core needs `use_cpu_initialization` (its GPU initialiser calls
`torch.cuda.current_device()`); weights are loaded afterwards from full tensors
(`shard_for_rank`), so megatron's initialisers and its CUDA-only RNG tracker are never used.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

PARTITION_DIM_ATTRIBUTE = "partition_dim"
"""megatron-core marks a TP-split parameter with `tensor_model_parallel=True` and this attribute."""


@dataclass(frozen=True)
class TensorParallel:
    """The TP group of one layer on this rank."""

    group: Any
    """torch.distributed ProcessGroup, None for one device."""
    size: int
    rank: int
    sequence_parallel: bool = False
    """Korthikanti et al.'s sequence parallelism (+sp): the layer's TP linears take / give sequence slices
    (gbmw.adapters.runtime.sequence_parallel)."""

    @classmethod
    def single(cls) -> "TensorParallel":
        return cls(None, 1, 0)

    def _config(self, dtype: torch.dtype):
        from megatron.core import ModelParallelConfig

        return ModelParallelConfig(
            tensor_model_parallel_size=self.size,
            use_cpu_initialization=True,
            perform_initialization=True,  # megatron marks TP-split weights (partition_dim) only when it initialises them
            params_dtype=dtype,
            gradient_accumulation_fusion=False,
        )

    def column_linear(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Module:
        """Y = X·Aᵀ with A split by rows (output features) across the group; output stays split."""
        if self.size == 1:
            return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
        return self._sequence_parallel(_megatron_linears()[0](
            in_features, out_features, config=self._config(dtype), init_method=_no_init, bias=bias,
            gather_output=False, tp_group=self.group))

    def row_linear(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Module:
        """Y = X·Aᵀ with A split by columns (input features); partial outputs all-reduced (Megatron's g)."""
        if self.size == 1:
            return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
        return self._sequence_parallel(_megatron_linears()[1](
            in_features, out_features, config=self._config(dtype), init_method=_no_init, bias=bias,
            input_is_parallel=True, skip_bias_add=False, tp_group=self.group))

    def _sequence_parallel(self, module: nn.Module) -> nn.Module:
        """Marks a TP linear to run with sequence slices (its weights and their layout unchanged)."""
        module.sequence_parallel_group = self.group if self.sequence_parallel else None
        return module

    def vocab_embedding(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> nn.Module:
        if self.size == 1:
            return nn.Embedding(vocab_size, hidden_size, dtype=dtype)
        from megatron.core.tensor_parallel import VocabParallelEmbedding

        return VocabParallelEmbedding(vocab_size, hidden_size, init_method=_no_init, config=self._config(dtype),
                                      tp_group=self.group)

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-token loss from logits split over the vocabulary (full logits for one device)."""
        if self.size == 1:
            return nn.functional.cross_entropy(logits.float().flatten(0, -2), target.flatten(), reduction="none"
                                               ).view_as(target)
        return _VocabParallelCrossEntropy.apply(logits, target, self.group, self.rank, self.size)


def _no_init(weight: torch.Tensor) -> None:
    """Weights are loaded from full tensors after construction (see `shard_for_rank`)."""


@functools.cache
def _megatron_linears() -> tuple[type, type]:
    """megatron-core's Column/RowParallelLinear returning only the output (the bias is added inside).
    Built on first use: importing megatron.core takes seconds, and plans without TP never need it."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from .sequence_parallel import column_linear_forward, row_linear_forward

    class ColumnLinear(ColumnParallelLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.sequence_parallel_group is not None:
                return column_linear_forward(self, x, self.sequence_parallel_group)
            return _as_autocast_linear(super().forward, x)

    class RowLinear(RowParallelLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.sequence_parallel_group is not None:
                return row_linear_forward(self, x, self.sequence_parallel_group)
            return _as_autocast_linear(super().forward, x)

    return ColumnLinear, RowLinear


def _as_autocast_linear(forward, x: torch.Tensor) -> torch.Tensor:
    """megatron-core's linear (output only), giving what autocast makes `nn.Linear` give on one device: an output
    in the autocast dtype. megatron adds its fp32 bias after the 16-bit matmul, an fp32 output the next op would
    save at twice the bytes of the single-device layer's. Its input stays as given (a norm's fp32 output, which
    megatron's autograd function saves: gbmw.cost.framework_memory prices it)."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return forward(x)[0]
    return forward(x)[0].to(torch.get_autocast_dtype(device))


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """megatron-core's vocabulary-parallel cross-entropy steps, all-reduced over an explicit group."""

    @staticmethod
    def forward(ctx, logits, target, group, rank, size):
        from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as Steps

        logits, logits_max = Steps.calculate_logits_max(logits)
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        part = logits.size(-1)
        target_mask, masked_target_1d, predicted, sum_exp, exp_logits = Steps.calculate_predicted_logits(
            logits, target, logits_max, rank * part, (rank + 1) * part
        )
        dist.all_reduce(predicted, group=group)
        dist.all_reduce(sum_exp, group=group)
        softmax, loss = Steps.calculate_cross_entropy_loss(exp_logits, predicted, sum_exp)
        ctx.save_for_backward(softmax, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy as Steps

        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        operands = Steps.prepare_gradient_calculation_operands(softmax, target_mask)
        grad_2d, arange_1d, softmax_update, grad_input = operands
        grad = Steps.calculate_gradients(grad_2d, arange_1d, masked_target_1d, softmax_update, grad_input, grad_output)
        return grad, None, None, None, None


def partition_dims(module: nn.Module) -> dict[str, int | None]:
    """Parameter name → the dim megatron-core split it along (None: replicated over the TP group)."""
    result = {}
    for name, parameter in module.named_parameters():
        split = getattr(parameter, "tensor_model_parallel", False)
        result[name] = getattr(parameter, PARTITION_DIM_ATTRIBUTE) if split else None
    return result


def shard_for_rank(full: torch.Tensor, dim: int | None, tp: TensorParallel) -> torch.Tensor:
    """This rank's TP slice of a full tensor (equal contiguous blocks, rank order, as megatron-core)."""
    if dim is None or tp.size == 1:
        return full
    if full.size(dim) % tp.size:
        raise ValueError(f"dimension {dim} of size {full.size(dim)} does not split {tp.size} ways")
    return full.chunk(tp.size, dim)[tp.rank]


def gather_full(local: torch.Tensor, dim: int | None, tp: TensorParallel) -> torch.Tensor:
    """The full tensor from every rank's TP slice (a collective over the TP group)."""
    if dim is None or tp.size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(tp.size)]
    dist.all_gather(parts, local.contiguous(), group=tp.group)
    return torch.cat(parts, dim)
