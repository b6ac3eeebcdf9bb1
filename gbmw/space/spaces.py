"""What one search may choose from: the paper's variants, the fixed baselines, and the targets.

A `SearchSpace` says, for each pipeline degree, which strategies a layer may take, whether all
layers must share one (stock frameworks configure one TP/DP/ZeRO setting for the whole model),
which pipeline schedule runs, and how the layers may be partitioned. The planner runs the same
search over any of them, so the paper's ablations (Table 3), the baselines and the targets of
DESIGN.md are costed alike.

Variants (paper Sec. 7.1): DP+TP only and DP+PP only (Galvatron restricted to two axes), Galvatron
(DP, SDP, TP, PP; no CKPT; GPipe-style pipeline; balanced partition), Galvatron-Base (Galvatron with CKPT,
Algorithm 1: the paper defines Galvatron as "a variant of Galvatron-Base that disables CKPT", so its
pipeline is Galvatron's GPipe), 1F1B+Bi-obj (Galvatron with the 1F1B schedule and the bi-objective
partition, Algorithm 2; "Galvatron-BMW but disables CKPT") and Galvatron-BMW (everything).

Baselines (paper Sec. 7.1): PyTorch DDP (pure DP), Megatron (pure TP over all devices), PyTorch
GPipe (pure PP, one device per stage), FSDP/ZeRO-3 (pure SDP) and DeepSpeed 3D (2-way DP × TP × PP).
PyTorch GPipe recomputes every Transformer block: PyTorch's `Pipe` and torchgpipe checkpoint every micro-batch
but the last by default (`checkpoint='except_last'`); gbmw recomputes the last one too, so it charges one
micro-batch's recomputation more per stage and one micro-batch's stash less. The paper's own training scripts pass
`checkpoint='never'` with a few hand-set micro-batches (benchmarks/paper_pipeline_runs.py, which costs Table 3's
GPipe row that way); this baseline keeps the default (docs/cost-model.md, "The paper's own measurements").

Targets (gbmw.space.targets): the same search restricted to what a stock framework can configure — one
strategy for all layers from the target's axes, the target's strategy filter and its pipeline partitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from gbmw.errors import GbmwError
from gbmw.space.runtime_support import runtime_strategy_refusal
from gbmw.space.strategy import SEARCH_AXES, Strategy, enumerate_strategies, pipeline_degrees
from gbmw.space.targets import Target, get_target
from gbmw.specs.cluster_spec import ClusterSpec
from gbmw.specs.files import shown
from gbmw.specs.model_spec import ModelSpec


@dataclass(frozen=True)
class SearchSpace:
    label: str
    axes: tuple[str, ...] = SEARCH_AXES
    ckpt: bool = True
    schedule: str = "1f1b"
    partitioning: tuple[str, ...] = ("time",)
    """Partition methods tried, in order: `time` (time-balanced), `bi-objective` (Alg. 2, from memory-balanced),
    `memory` (memory-balanced alone: the paper's 1F1B+Mem ablation row), or a closed-form rule of
    gbmw.space.stock_partitions (`uniform`, `parameters`, `even`, `first-last`). The exact search searches every
    partition where the methods are `time` and `bi-objective` only (Planner.searches_whole_plans)."""
    uniform: bool = False
    """One strategy for every layer (recomputation on all blocks or none)."""
    recompute_always: bool = False
    """With `uniform`: every Transformer block recomputes (never embeddings or heads) — a framework that
    checkpoints by default, not as a choice of the search."""
    fixed_dims: Callable[[int, int, ClusterSpec], tuple | None] | None = None
    """(devices, pp, cluster) → the one strategy tree of a fixed baseline (None: this pp is not used)."""
    pp_choices: Callable[[int, ClusterSpec], list[int]] | None = None
    strategy_filter: Callable[[Strategy, int], bool] | None = None
    """(strategy, pp) → allowed, for targets."""
    single_data_parallel_axis: bool = False
    """Only trees with at most one data-parallel axis (dp, z1dp, z2dp or sdp): the others are never built (the gbmw
    variants; gbmw.space.strategy.enumerate_strategies)."""
    max_pp: int | None = None
    target: str = "runtime"
    selective: bool = False
    """Offer selective recomputation (+sel) beside none and full."""
    sequence_parallel: bool = False
    """Offer sequence parallelism (+sp) for strategies with TP."""
    expert_parallel: bool = False
    """Offer expert parallelism (+epN) to mixture-of-experts models."""
    expert_tensor_parallel: bool = False
    """With `expert_parallel`: offer the experts whole (+epN+etp1) beside at the layer's TP degree, where the target
    runs an expert TP degree of its own (megatron-core, gbmw's runtime)."""
    sequence_split_where_undominated: bool = False
    """Offer a strategy with a sequence axis (`ulysses`, `cp`) only at micro-batch sizes where its `gradient_view` is
    not usable (`usable`)."""

    @classmethod
    def for_target(cls, target: Target) -> "SearchSpace":
        """What a stock framework can run: one strategy for every layer, from the target's definition."""
        return cls(target.label, axes=target.axes, uniform=True, partitioning=target.partition_rules,
                   target=target.name, strategy_filter=target.allows,
                   selective=target.selective_recompute is not None and target.search_offers_selective,
                   sequence_parallel=target.sequence_parallel, expert_parallel=target.expert_parallel,
                   expert_tensor_parallel=target.expert_tensor_parallel)

    def pipeline_degrees(self, cluster: ClusterSpec, max_pp: int | None) -> list[int]:
        devices = cluster.num_devices
        degrees = self.pp_choices(devices, cluster) if self.pp_choices else pipeline_degrees(devices)
        limits = [limit for limit in (self.max_pp, max_pp) if limit is not None]
        return [pp for pp in degrees if all(pp <= limit for limit in limits)]

    def strategies(self, cluster: ClusterSpec, pp: int, experts: bool = False) -> list[Strategy]:
        """The candidates for every layer at pipeline degree `pp`; with `experts` (a mixture-of-experts model) also
        those with expert parallelism where the space offers it."""
        group = cluster.num_devices // pp
        if self.fixed_dims is not None:
            dims = self.fixed_dims(cluster.num_devices, pp, cluster)
            if dims is None:
                return []
            return [Strategy(tuple(dims), ckpt) for ckpt in ((False, True) if self.recompute_always else (False,))]
        prune = self.strategy_filter is None
        candidates = enumerate_strategies(group, axes=self.axes, prune_dp_with_sdp=prune, ckpt=self.ckpt,
                                          selective=self.selective, sequence_parallel=self.sequence_parallel,
                                          expert_parallel=experts and self.expert_parallel,
                                          expert_tensor_parallel=experts and self.expert_tensor_parallel,
                                          single_data_parallel_axis=self.single_data_parallel_axis)
        if self.strategy_filter is not None:
            candidates = [s for s in candidates if self.strategy_filter(s, pp)]
        if self.expert_tensor_parallel and experts:  # +etp1 only where TP stays inside a node (see the field)
            candidates = [s for s in candidates if s.expert_tp is None or s.tp <= cluster.devices_per_node]
        return candidates

    def usable(self, strategies: list[Strategy], micro_batch: int) -> list[Strategy]:
        """The candidates a micro-batch of `micro_batch` samples allows: their data-parallel degree divides it.

        Dominance rule (`sequence_split_where_undominated`): a strategy S with a sequence axis (Ulysses or CP) of
        degree u and data-parallel degree d gives each rank 1/(u·d) of the micro-batch's tokens; its `gradient_view` —
        the sequence axis merged into the data-parallel one, data-parallel degree u·d — gives each rank the same number
        of tokens as whole samples, so it costs the same compute (attention included: S's causal parts are costed at
        1/u of the work), the same activation memory, the same weights, states and gradient synchronisation (the same
        group), and none of S's all-to-alls, ring sends or key/value buffers (gbmw.cost.context_parallel): no larger
        in any per-layer cost (tests/test_space.py checks it for every strategy over 2 to 8 devices). Wherever the
        micro-batch is divisible by u·d it is usable, so S is left out there; S remains where u·d does not divide the
        micro-batch (long sequences at micro-batch 1, say). The rule is exact per layer, not across layers: from S's
        layout a Slice-Gather to a neighbour's can move less than from the view's (ulysses4 → dp2-tp2 receives half
        an activation, dp4 → dp2-tp2 three quarters) — for Ulysses a saving below its own all-to-alls of Q, K, V and
        the output in forward and again in backward; CP's ring sends can hide behind attention, so there the rule may
        leave out a plan whose Slice-Gathers cost less (CP keeps its two key/value buffers either way)."""
        usable = [s for s in strategies if micro_batch % s.data_parallel == 0]
        if not self.sequence_split_where_undominated:
            return usable
        return [s for s in usable if s.sequence_axis is None or micro_batch % s.gradient_view.data_parallel]

    def groups(self, strategies: list[Strategy], model: ModelSpec) -> list[np.ndarray]:
        """Masks [strategy, layer] of what one search may mix: everything, or for uniform spaces one
        mask per tree (with or without sequence parallelism, per EP and expert TP degree) and recomputation level
        (embeddings and heads never recompute)."""
        if not self.uniform:
            return [np.ones((len(strategies), model.num_layers), bool)]
        is_block = model.is_block
        levels = list(dict.fromkeys(s.recompute for s in strategies))
        if self.recompute_always:
            levels = [level for level in levels if level == "full"]
        rows_of: dict[tuple, list[int]] = {}  # one pass over the strategies (a nested one was quadratic)
        for index, strategy in enumerate(strategies):
            rows_of.setdefault((strategy.dims, strategy.sp, strategy.ep, strategy.expert_tp), []).append(index)
        masks = []
        for rows in rows_of.values():
            for level in levels:
                mask = np.zeros((len(strategies), model.num_layers), bool)
                for index in rows:
                    recompute = strategies[index].recompute
                    mask[index] = np.where(is_block, recompute == level, recompute == "none")
                if mask.any(axis=0).all():
                    masks.append(mask)
        return masks


def _deepspeed_3d_dims(devices: int, pp: int, cluster: ClusterSpec):
    """2-way DP, and TP × PP over the rest with TP the square-root share, inside a node (paper Sec. 7.1)."""
    if devices < 4:
        return None
    rest = devices // 2
    tp = min(cluster.devices_per_node, 2 ** ((rest.bit_length() - 1 + 1) // 2))
    if rest // tp != pp:
        return None
    return (("tp", tp), ("z1dp", 2)) if tp > 1 else (("z1dp", 2),)


def _deepspeed_3d_pp(devices: int, cluster: ClusterSpec) -> list[int]:
    return [pp for pp in pipeline_degrees(devices) if _deepspeed_3d_dims(devices, pp, cluster) is not None]


def _runtime_runs(strategy: Strategy) -> bool:
    """Ulysses and CP without +sp (gbmw.space.runtime_support.runtime_strategy_refusal)."""
    return runtime_strategy_refusal(strategy) is None


VARIANTS: dict[str, SearchSpace] = {
    "dp+tp": SearchSpace("Galvatron (DP+TP)", axes=("dp", "tp"), ckpt=False, schedule="gpipe", max_pp=1),
    "dp+pp": SearchSpace("Galvatron (DP+PP)", axes=("dp",), ckpt=False, schedule="gpipe"),
    "galvatron": SearchSpace("Galvatron", ckpt=False, schedule="gpipe"),
    "base": SearchSpace("Galvatron-Base", schedule="gpipe"),
    "1f1b+bi-obj": SearchSpace("Galvatron (1F1B+Bi-obj)", ckpt=False, partitioning=("time", "bi-objective")),
    "bmw": SearchSpace("Galvatron-BMW", partitioning=("time", "bi-objective")),
    "gbmw": SearchSpace(
        "gbmw (BMW + ZeRO-1/2)", axes=("dp", "z1dp", "z2dp", "sdp", "tp"), partitioning=("time", "bi-objective"),
        single_data_parallel_axis=True, sequence_parallel=True, expert_parallel=True, expert_tensor_parallel=True,
    ),
    # The default leaves Ulysses (and CP) out: offering Ulysses made GPT-3 65B's search on 64 H100s about 4x slower
    # (5 s -> 18-20 s, measured side by side) for a 1.4 % faster plan, and the dominance rule is exact per layer, not
    # across layers.
    "gbmw+ulysses": SearchSpace(
        "gbmw + Ulysses", axes=("dp", "z1dp", "z2dp", "sdp", "tp", "ulysses"), partitioning=("time", "bi-objective"),
        strategy_filter=lambda s, pp: _runtime_runs(s), single_data_parallel_axis=True,
        sequence_parallel=True, expert_parallel=True, expert_tensor_parallel=True,
        sequence_split_where_undominated=True,
    ),
    "gbmw+cp": SearchSpace(
        "gbmw + ring CP", axes=("dp", "z1dp", "z2dp", "sdp", "tp", "cp"), partitioning=("time", "bi-objective"),
        strategy_filter=lambda s, pp: _runtime_runs(s), single_data_parallel_axis=True,
        sequence_parallel=True, expert_parallel=True, expert_tensor_parallel=True,
        sequence_split_where_undominated=True,
    ),
}
DEFAULT_VARIANT = "gbmw"
OPT_IN_VARIANTS = ("gbmw+ulysses", "gbmw+cp")
"""Variants only `--variant` asks for: `gbmw compare` (the paper's table) leaves them out."""

BASELINES: dict[str, SearchSpace] = {
    "ddp": SearchSpace("PyTorch DDP (DP)", ckpt=False, fixed_dims=lambda n, pp, c: (("dp", n),) if pp == 1 else None,
                       pp_choices=lambda n, c: [1]),
    "megatron-tp": SearchSpace("Megatron (TP)", ckpt=False, fixed_dims=lambda n, pp, c: (("tp", n),) if pp == 1 else None,
                               pp_choices=lambda n, c: [1]),
    "gpipe": SearchSpace("PyTorch GPipe (PP)", ckpt=False, schedule="gpipe", fixed_dims=lambda n, pp, c: (),
                         pp_choices=lambda n, c: [n], uniform=True, recompute_always=True),
    "fsdp": SearchSpace("FSDP/ZeRO-3 (SDP)", ckpt=False, fixed_dims=lambda n, pp, c: (("sdp", n),) if pp == 1 else None,
                        pp_choices=lambda n, c: [1]),
    "deepspeed-3d": SearchSpace("DeepSpeed 3D", ckpt=False, fixed_dims=_deepspeed_3d_dims, pp_choices=_deepspeed_3d_pp,
                                partitioning=("even", "uniform")),
}


def search_space(variant: str = DEFAULT_VARIANT, target: str = "runtime") -> SearchSpace:
    """The space for a target (its own constraints) or, for the runtime, a variant or baseline."""
    if get_target(target).name != "runtime":
        return SearchSpace.for_target(get_target(target))
    if variant in VARIANTS:
        return VARIANTS[variant]
    if variant in BASELINES:
        return BASELINES[variant]
    raise GbmwError(
        f"variant {shown(variant)} is unknown; variants: {', '.join(VARIANTS)}; baselines: {', '.join(BASELINES)}"
    )
