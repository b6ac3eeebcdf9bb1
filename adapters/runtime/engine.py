"""The training engine: a Plan and a model architecture → this rank's pipeline stage and its train step.

Composition, in a fixed order for every layer of the stage (torchtitan's order: TP → checkpointing → sharding):
1. build the layer with its strategy's TP group (tensor_parallel, megatron-core layers);
2. wrap it for activation checkpointing when the strategy says `+ckpt` (torch's checkpoint_wrapper: only the layer
   input is stashed, the rest is recomputed in backward), or checkpoint its attention core alone when it says `+sel`
   (attention_core_recompute);
3. shard it over its data-parallel group when the strategy uses sdp/z1dp/z2dp (sharding, FSDP2), an MoE block's
   routed experts under +epN over their expert-data-parallel group (expert_data_parallel);
4. set its weights from full tensors (initial values by parameter name, or a checkpoint), sliced for this rank — so
   every plan, and single-process training, starts from the same model.
A mixture-of-experts block holds the routed experts of its EP rank (`+epN`, experts: tokens reach them by all-to-all),
split over their own TP group under `+etpN`, and sums (or shards, with ZeRO) their gradients over its
expert-data-parallel group, its other gradients over the data-parallel group (expert_data_parallel).
A layer with a `ulysses` or `cp` axis runs on its rank's part of each sample's tokens (ulysses: all-to-alls around the
attention core; context_parallel: ring attention); its weights see those ranks as data-parallel ones (gradient_view):
gradients are summed and parameters sharded over the data-parallel and sequence ranks together.
Between layers whose strategies slice the micro-batch differently the activation is re-laid (redistribute,
Slice-Gather); stages run 1F1B (pipeline); gradients are synchronised after the last micro-batch (sharding); tied
weights are summed across their copies (tied_weights); Adam steps.

Loss arithmetic: the objective is the mean over the global batch of each sample's loss, i.e. the mean
over the m micro-batches of the mean over each micro-batch. A rank whose head sees 1/k of a micro-batch
back-propagates (its local mean) / (k · m): its exact share. Split over u sequence ranks (Ulysses or CP) a rank's
head sees 1/u of the tokens of its slice and back-propagates its part's mean / (u · k · m) (the head divides by u:
the parts are equal). Every gradient is then a partial sum over this rank's samples, and data-parallel groups SUM
them (never average), whatever their degree.
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gbmw.errors import PlanError
from gbmw.plan import Plan
from gbmw.space.strategy import Strategy

from .context_parallel import ContextParallel
from .expert_data_parallel import gradient_parts, shard_layer
from .experts import ExpertParallel, gather_experts, is_expert_parameter
from .gradient_norm import sum_of_squares_float64
from .groups import GroupPool
from .local_adam import LocalShardAdam
from .matmul_precision import in_plan_matmul_precision
from .model import TransformerBlock, build_layer, check_runtime_supports, initial_value, layer_names
from .pipeline import PipelineLinks, backward_from_released, release_sent_output, run_schedule
from .redistribute import BatchLayout, relayout
from .sharding import (LayerDataParallel, ReduceScatterInFlight, data_parallel_flavour, full_value, local_value,
                       shard_like, synchronise_plain_gradients)
from .tensor_parallel import TensorParallel, gather_full, partition_dims, shard_for_rank
from .tied_weights import TiedWeights, share_tied_weight
from .ulysses import UlyssesParallel

PRECISION_DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16}
"""Parameters and optimizer states stay fp32; bf16 runs the layers under autocast, tf32 its matmuls on TF32 cores."""


@dataclass(frozen=True)
class AdamSettings:
    learning_rate: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float | None = None
    """Clip the global gradient norm to this (Megatron's --clip-grad, DeepSpeed's gradient_clipping); None: off."""


@dataclass
class StageLayer:
    """One plan layer as this rank runs it."""

    index: int
    name: str
    strategy: Strategy
    module: nn.Module
    tp: TensorParallel
    data_parallel: LayerDataParallel
    experts: ExpertParallel
    """The EP group of a mixture-of-experts block's routed experts (gbmw.adapters.runtime.experts)."""
    expert_data_parallel: LayerDataParallel
    """Over which ranks the routed experts' gradients are summed (the data-parallel group when ep is 1)."""
    layout: BatchLayout
    """Which slice of each micro-batch every rank of the stage holds for this layer."""
    split_dims: dict[str, int | None]
    """Parameter name (inside the layer) → the dim TP splits it along (None: replicated)."""
    parameters: dict[str, nn.Parameter]
    """Parameter name (inside the layer, wrappers' prefixes removed) → this rank's parameter."""

    def tensor_parallel_of(self, key: str) -> TensorParallel:
        """The TP group that splits parameter `key`: a routed expert's own under +etpN, else the layer's."""
        return self.experts.tensor_parallel(self.tp) if is_expert_parameter(key) else self.tp


class HybridEngine:
    """Runs one Plan on the processes of a GroupPool; every rank constructs it with the same arguments."""

    def __init__(self, plan: Plan, architecture: Any, pool: GroupPool, device: str | torch.device, *, seed: int = 0,
                 adam: AdamSettings = AdamSettings()):
        check_runtime_supports(architecture)
        names = layer_names(architecture)
        if len(names) != len(plan.strategies):
            raise PlanError(f"the plan has {len(plan.strategies)} layer strategies but model {architecture.name} has "
                            f"{len(names)} layers ({names[0]} … {names[-1]}); plan again for this model")
        if plan.precision not in PRECISION_DTYPES:
            raise PlanError(f"plan precision {plan.precision!r}: the runtime trains in {list(PRECISION_DTYPES)} "
                            "(fp16 would need loss scaling); plan the job with precision bf16, tf32 or fp32")
        self.plan, self.architecture, self.pool, self.seed = plan, architecture, pool, seed
        self.device = torch.device(device)
        self.layout = pool.layout
        self.rank = pool.rank
        self.stage = self.layout.stage_of(self.rank)
        self.local_rank = self.layout.local_rank(self.rank)
        self.stage_group = pool.stage_group()
        first, end = plan.stage_bounds[self.stage]
        self.reduce_scatter_in_flight = ReduceScatterInFlight()
        self.layers: list[StageLayer] = []
        for index in range(first, end):
            self.layers.append(self._build(index, names[index], plan.strategies[index]))
        self.previous_layout = (
            BatchLayout.of(plan.strategies[first - 1]) if self.stage > 0 else None
        )
        self.tied = TiedWeights(architecture, plan, pool, self.layers)
        self._set_weights(lambda name, shape: initial_value(self.tied.source_name(name), shape, seed))
        self.adam = adam
        # Adam updates the local shards (local_adam): torch's Adam on FSDP2's DTensors dispatches every
        # element-wise operation through DTensor and took ~8× longer on the tiny GPT sharded over two ranks.
        # foreach (multi-tensor) Adam on every device: torch would pick it for CUDA tensors only, and its
        # parameter-sized temporaries are part of the memory the estimator charges (and the CPU trace shows).
        self.optimizer = LocalShardAdam(self._all_parameters(), lr=adam.learning_rate, betas=adam.betas,
                                        eps=adam.eps, weight_decay=0.0, foreach=True)
        self.links = PipelineLinks(self.layout.previous_stage_rank(self.rank), self.layout.next_stage_rank(self.rank))
        self.autocast_dtype = PRECISION_DTYPES[plan.precision]
        self.step = 0
        self.consumed_samples = 0
        """Samples of all the steps taken (checkpoints keep it: a job resumed under any plan reads on from there)."""
        self.last_grad_norm: torch.Tensor | None = None
        """The global gradient norm before clipping, of the last step (when clipping is on)."""
        self.observer = None
        """Optional measurement hooks (gbmw.adapters.profile.held_memory.HeldMemoryProbe): told when each
        micro-batch's forward runs and ends, when its backward ends, and before gradients are dropped."""

    # ------------------------------------------------------------------ construction

    def _build(self, index: int, name: str, strategy: Strategy) -> StageLayer:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        tp = TensorParallel(self.pool.tensor_group(strategy), strategy.tp,
                            self.layout.digits(self.rank, strategy).get("tp", 0), strategy.sp)
        # Ulysses group or CP ring (each refuses in one line what the runtime does not run with it)
        sequence = ContextParallel.of(self.pool, strategy) or UlyssesParallel.of(self.pool, strategy)
        experts = ExpertParallel.of(self.pool, strategy)
        module = build_layer(self.architecture, name, tp, experts=experts, sequence=sequence)
        if any(parameter.device != self.device for parameter in module.parameters()):
            module = module.to(self.device)  # (under fake tensors `to` the same device would swap a tensor with itself)
        split_dims = partition_dims(module)
        if name == "head" and self.layers and self.layers[0].name == "embedding":
            share_tied_weight(self.architecture, self.layers[0], module, strategy)
        if strategy.selective and isinstance(module, TransformerBlock):  # embeddings and heads have no attention
            module.recompute_attention_core = True
        if strategy.ckpt and strategy.sp:  # recompute from the sequence slice it stashes (Korthikanti et al. Sec. 4.2.2)
            module.recompute_slices = True
        elif strategy.ckpt:
            module = checkpoint_wrapper(module)
        weights = strategy.gradient_view  # Ulysses / CP ranks hold the same weights: data-parallel ranks for them
        data_parallel = LayerDataParallel(data_parallel_flavour(weights), self.pool.data_group(weights),
                                          weights.data_parallel)
        expert_data_parallel = LayerDataParallel(data_parallel.flavour, self.pool.expert_data_group(weights),
                                                 weights.expert_data_parallel)
        module = shard_layer(module, data_parallel, experts, expert_data_parallel,
                             (self.pool.data_mesh(weights), self.pool.expert_data_mesh(weights)),
                             self.reduce_scatter_in_flight)
        parameters = {_canonical(key): parameter for key, parameter in module.named_parameters()}
        return StageLayer(index, name, strategy, module, tp, data_parallel, experts, expert_data_parallel,
                          BatchLayout.of(strategy), split_dims, parameters)

    def _all_parameters(self) -> list[nn.Parameter]:
        """Every distinct parameter of the stage (a tied weight shared by two layers once)."""
        unique = {id(parameter): parameter for layer in self.layers for parameter in layer.parameters.values()}
        return list(unique.values())

    @torch.no_grad()
    def _set_weights(self, full_tensor) -> None:
        """Every parameter from `full_tensor(full name, full shape)`, sliced for this rank's TP and DP."""
        for layer in self.layers:
            for key, parameter in layer.parameters.items():
                dim, tp = layer.split_dims[key], layer.tensor_parallel_of(key)
                shape = list(parameter.shape)
                if dim is not None:
                    shape[dim] *= tp.size
                full = full_tensor(f"{layer.name}.{key}", torch.Size(shape))
                local = shard_for_rank(full, dim, tp)
                local_value(parameter).copy_(local_value(shard_like(local, parameter)))

    # ------------------------------------------------------------------ training

    def train_step(self, batch: dict[str, torch.Tensor]) -> float:
        """One iteration on the global batch (the same full batch on every rank); returns the mean loss."""
        return float(self.run_train_step(batch))

    @in_plan_matmul_precision
    def run_train_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """`train_step` without waiting for the loss: returns it as a tensor on the device (no host
        synchronisation, so the step also runs under fake tensors)."""
        plan = self.plan
        if len(batch["inputs"]) != plan.global_batch:
            raise PlanError(f"batch of {len(batch['inputs'])} samples, but the plan's global batch is "
                            f"{plan.global_batch}")
        micro, count = plan.micro_batch, plan.num_micro_batches
        stashed: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        loss_share = torch.zeros((), device=self.device)

        def micro_slice(key: str, index: int) -> torch.Tensor:
            return batch[key][index * micro:(index + 1) * micro].to(self.device)

        def forward(index: int, received: torch.Tensor | None) -> torch.Tensor | None:
            nonlocal loss_share
            if received is None:
                x, previous, leaf = micro_slice("inputs", index), self.layers[0].layout, None
                x = previous.take(x, self.local_rank).clone()  # its own storage, as a data loader would hand it
            else:
                leaf = received.requires_grad_()
                x, previous = leaf, self.previous_layout
                if self.autocast_dtype is not None:  # the residual stream is fp32 on every stage, as on the first
                    x = x.float()
            observing = self.observer.forward_context(index) if self.observer else contextlib.nullcontext()
            # No cast cache: a TP layer (megatron's autograd function) casts its weight again in backward rather
            # than keeping the 16-bit copy until the stage's forward ends; `nn.Linear` saves its copy either way.
            with observing, torch.autocast(self.device.type, self.autocast_dtype,
                                           enabled=self.autocast_dtype is not None, cache_enabled=False):
                for layer in self.layers:
                    x = relayout(x, previous, layer.layout, self.local_rank, self.stage_group)
                    previous = layer.layout
                    self._seed_dropout(index, layer)
                    if layer.name == "head":
                        labels = {key: layer.layout.take(micro_slice(key, index), self.local_rank).clone()
                                  for key in batch if key != "inputs"}
                        loss = layer.module(x, labels) / (layer.layout.slices * count)
                        loss_share = loss_share + loss.detach() / layer.tp.size
                        stashed[index] = (leaf, loss)
                        return None
                    x = layer.module(x)
            # the root is a fresh copy of what is sent: once the send holds its storage, the root keeps only its
            # graph (megatron-core's deallocate_output_tensor), not a micro-batch's output per micro-batch in flight
            output = x.to(self.boundary_dtype, memory_format=torch.contiguous_format, copy=True)
            stashed[index] = (leaf, output)
            return release_sent_output(output)

        def backward(index: int, grad: torch.Tensor | None) -> torch.Tensor | None:
            for layer in self.layers:
                layer.data_parallel.set_gradient_sync(layer.module, index == count - 1)
            leaf, output = stashed.pop(index)
            # megatron-core's TP linears restore CUDA's autocast state in their backward, not the CPU's: on a CPU
            # the backward runs under autocast as their forward did (16-bit saved inputs meet fp32 weights there)
            with torch.autocast("cpu", self.autocast_dtype or torch.bfloat16,
                                enabled=self.device.type == "cpu" and self.autocast_dtype is not None,
                                cache_enabled=False):
                if grad is None:
                    torch.autograd.backward(output)
                else:
                    backward_from_released(output, grad.to(self.boundary_dtype))
            if self.observer:
                self.observer.backward_finished(index)
            return None if leaf is None else leaf.grad

        run_schedule(self.stage, self.plan.pp, count, self.links, forward, backward, self._boundary_shape)
        synchronise_plain_gradients([part for layer in self.layers for part in gradient_parts(layer)],
                                    group_key=lambda data_parallel: id(data_parallel.group))
        self.tied.synchronise_gradients()
        if self.adam.max_grad_norm is not None:
            self.last_grad_norm = self._clip_gradients(self.adam.max_grad_norm)
        self.optimizer.step()
        if self.observer:
            self.observer.step_finished()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.consumed_samples += plan.global_batch
        dist.all_reduce(loss_share)  # only the last stage holds loss shares; TP copies were divided out
        return loss_share

    @torch.no_grad()
    def _clip_gradients(self, max_norm: float) -> torch.Tensor:
        """Scale every gradient by min(1, max_norm / (‖g‖ + 1e-6)) with ‖g‖ the norm of the whole model's gradient
        (torch.nn.utils.clip_grad_norm_'s rule, applied as it does: always, by a clamped factor on the device). Each rank adds the squares of its gradient elements, each
        weighted by 1 / (ranks holding a copy of it): TP-replicated parameters are on every rank of the TP
        group, plain-DP gradients on every rank of the data-parallel group, ZeRO shards on one; the tied head
        copy is left out (it equals the embedding's). One all-reduce over all ranks gives the exact norm."""
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for layer in self.layers:
            for key, parameter in layer.parameters.items():
                if parameter.grad is None or self.tied.is_copy(f"{layer.name}.{key}"):
                    continue
                data = layer.expert_data_parallel if is_expert_parameter(key) else layer.data_parallel
                copies = (1 if data.sharded else data.size) * (
                    layer.tensor_parallel_of(key).size if layer.split_dims[key] is None else 1)
                squares += sum_of_squares_float64(local_value(parameter.grad)) / copies
        dist.all_reduce(squares)
        norm = squares.sqrt()
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for parameter in self._all_parameters():
            if parameter.grad is not None:
                local_value(parameter.grad).mul_(scale)
        return norm

    def _boundary_shape(self, which: str) -> tuple[tuple[int, ...], torch.dtype, torch.device]:
        """Shape of the activation received from the previous stage ("in") or its gradient from the next ("out")."""
        layout = self.previous_layout if which == "in" else self.layers[-1].layout
        rows, tokens = self.plan.micro_batch // layout.slices, self.architecture.seq_length // layout.parts
        return (rows, tokens, self.architecture.hidden_size), self.boundary_dtype, self.device

    @property
    def boundary_dtype(self) -> torch.dtype:
        """What stages send each other: the autocast dtype, fp32 without autocast."""
        return self.autocast_dtype or torch.float32

    def _seed_dropout(self, micro_index: int, layer: StageLayer) -> None:
        """Dropout masks are a function of (seed, step, micro-batch, layer, batch slice, sequence part if split):
        identical on the TP ranks that share a slice, reproduced exactly when a checkpointed layer is recomputed."""
        if not getattr(self.architecture, "dropout", False):
            return
        slice_index = layer.layout.slice_of_rank[self.local_rank]
        key = f"{self.seed}/{self.step}/{micro_index}/{layer.index}/{slice_index}"
        if layer.layout.parts > 1:
            key += f"/{layer.layout.part(self.local_rank)}"
        torch.manual_seed(zlib.crc32(key.encode()))

    # ------------------------------------------------------------------ full tensors (checkpoints, tests)

    def full_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per layer of this stage: full parameters and Adam states by name (collective over the stage)."""
        result = {}
        for layer in self.layers:
            tensors: dict[str, torch.Tensor] = {}
            for key, parameter in layer.parameters.items():
                if self.tied.is_copy(f"{layer.name}.{key}"):
                    continue  # restored from the embedding's copy
                dim, tp = layer.split_dims[key], layer.tensor_parallel_of(key)
                tensors[key] = gather_full(full_value(parameter.detach()), dim, tp).cpu()
                state = self.optimizer.state.get(parameter, {})
                for moment in ("exp_avg", "exp_avg_sq"):
                    if moment in state:
                        tensors[f"{key}#{moment}"] = gather_full(full_value(state[moment]), dim, tp).cpu()
            result[layer.name] = gather_experts(tensors, layer.experts, self.device)  # every EP rank's experts
        return result

    @torch.no_grad()
    def load_full_state(self, layers: dict[str, dict[str, torch.Tensor]], step: int,
                        consumed_samples: int | None = None) -> None:
        """Set parameters and Adam states from full tensors (as `full_state` returns), resharded for this plan;
        `consumed_samples` None: `step` steps of this plan's global batch."""
        self._set_weights(lambda name, shape: _lookup(layers, self.tied.source_name(name), shape))
        for layer in self.layers:
            for key, parameter in layer.parameters.items():
                dim = layer.split_dims[key]
                moments = {}
                name = self.tied.source_name(f"{layer.name}.{key}")
                full_shape = _lookup(layers, name, None).shape  # checked against the model by _set_weights
                for moment in ("exp_avg", "exp_avg_sq"):
                    full = _lookup(layers, f"{name}#{moment}", full_shape)
                    # clone: tied copies must not share one moment tensor (Adam updates it in place)
                    moments[moment] = shard_like(shard_for_rank(full, dim, layer.tensor_parallel_of(key)), parameter
                                                 ).detach().clone()
                self.optimizer.state[parameter] = {"step": torch.tensor(float(step)), **moments}
        self.step = step
        self.consumed_samples = step * self.plan.global_batch if consumed_samples is None else consumed_samples


def _lookup(layers: dict[str, dict[str, torch.Tensor]], full_name: str, shape) -> torch.Tensor:
    layer_name, key = _split_layer(layers, full_name)
    if key not in layers[layer_name]:
        raise PlanError(f"checkpoint layer {layer_name} has no tensor {key!r}: the checkpoint is of another model")
    tensor = layers[layer_name][key]
    if not tensor.is_floating_point():
        raise PlanError(f"checkpoint tensor {full_name} holds {tensor.dtype} values, not floating point: the checkpoint "
                        "is corrupt")
    if shape is not None and tensor.shape != shape:
        raise PlanError(f"checkpoint tensor {full_name} has shape {tuple(tensor.shape)}, the model needs "
                        f"{tuple(shape)}: the checkpoint is of another model")
    return tensor


def _split_layer(layers: dict[str, Any], full_name: str) -> tuple[str, str]:
    for layer_name in layers:
        if full_name.startswith(layer_name + "."):
            return layer_name, full_name[len(layer_name) + 1:]
    raise PlanError(f"checkpoint has no tensor {full_name}")


def _canonical(name: str) -> str:
    """A parameter's name inside its layer, without wrapper prefixes (checkpoint_wrapper's)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX

    return name.replace(_CHECKPOINT_PREFIX, "")

