"""Per-layer strategies and the decision-tree search space (paper Sec. 3.2, Takeaways #1–#3, Fig. 3).

A `Strategy` is the parallelisation of one layer over the device group of its pipeline stage
(N / pp devices): ordered `(axis, degree)` pairs, innermost — fastest links, consecutive ranks —
first, whether its TP runs sequence-parallel, over how many ranks a mixture-of-experts layer splits its experts and
at which TP degree, and how much of it recomputes. Its short name is the dims joined by `-`, then `+epN` for expert
parallelism, `+etpN` for an expert TP degree other than the layer's, `+sp` for sequence parallelism, then `+ckpt`
(full recomputation) or `+sel` (selective): `tp2-dp4`, `sdp8+ckpt`, `tp4-z1dp2+sp+sel`, `tp2-z1dp8+ep4+sp`,
`tp2-z1dp16+ep32+etp1+sp`. A group of one device is `single`.

Expert parallelism (`+epN`) splits a mixture-of-experts layer's routed experts over `ep` ranks holding other tokens
(data-parallel ones, and the sequence ranks first beside cp or ulysses): gbmw.space.expert_parallel.

An expert TP degree other than the layer's (`+etpN`, megatron-core's `--expert-tensor-parallel-size`) lays the
experts out over the stage's ranks a second time: gbmw.space.expert_tensor_parallel.

Recomputation levels (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
2022): none; full (Sec. 3, the paper's CKPT: stash the layer input, recompute the whole layer); selective
(Sec. 5: recompute only the attention core — QKᵀ, softmax, dropout, scores × V — whose s×s tensors are
most of the memory and little of the FLOPs). Sequence parallelism (Sec. 4.2.2) splits the regions TP
replicates — norms, dropout, residual adds — over the TP ranks along the sequence; an all-gather and a
reduce-scatter replace each all-reduce.

Axes:
  dp       data parallel, gradients all-reduced (PyTorch DDP)
  z1dp     data parallel with optimizer states sharded (ZeRO-1 / Megatron's distributed optimizer)
  z2dp     data parallel with optimizer states and gradients sharded (ZeRO-2)
  sdp      sharded data parallel: parameters, gradients and optimizer states sharded (ZeRO-3 / FSDP)
  tp       tensor parallel (Megatron)
  cp       context parallel: each rank holds 1/c of every sample's tokens (load-balanced causal chunks) and the
           keys and values travel round a ring of P2P sends during attention (megatron-core's
           --context-parallel-size; Liu et al., "Ring Attention", 2023)
  ulysses  Ulysses sequence parallel: each rank holds 1/u of every sample's tokens and an all-to-all gives each
           rank the whole sequence of 1/u of the heads for attention, another brings it back (DeepSpeed-Ulysses,
           Jacobs et al. 2023; Megatron-DeepSpeed's --ds-sequence-parallel-size)

The two sequence axes split tokens, not samples: their ranks share the same samples, and hold the same weights,
so gradients are synchronised over them together with the data-parallel axis (megatron-core's and DeepSpeed's
data-parallel group spans dp × cp, resp. dp × sp). A strategy has at most one of them, placed immediately inside
its data-parallel axis (or outermost, with none): the ranks of one data-parallel replica are then consecutive, and
the gradient group is one strided group (`gradient_view`).

The default space (`enumerate_strategies`) is the paper's: dp, sdp and tp, each at most once per
tree, power-of-two degrees >= 2 whose product is the group size, every order, CKPT on and off,
and — Takeaway #3 — no tree with both dp and sdp. z1dp/z2dp appear only in hand-written configs
(`--uniform zero=1`) and stock-framework targets.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import cache, cached_property

from gbmw.errors import PlanError
from gbmw.space.expert_parallel import check_expert_parallel
from gbmw.space.expert_tensor_parallel import check_expert_tp

AXES = ("dp", "z1dp", "z2dp", "sdp", "tp", "cp", "ulysses")
DATA_PARALLEL_AXES = ("dp", "z1dp", "z2dp", "sdp")
SEQUENCE_AXES = ("cp", "ulysses")
SEARCH_AXES = ("dp", "sdp", "tp")
SINGLE_DEVICE_NAME = "single"
_TOKEN = re.compile(r"^(dp|z1dp|z2dp|sdp|tp|cp|ulysses)(\d+)$")
_EXPERT_SUFFIX = re.compile(r"^ep(\d+)$")
_EXPERT_TP_SUFFIX = re.compile(r"^etp(\d+)$")
RECOMPUTE_LEVELS = ("none", "full", "selective")
_SUFFIXES = {"sp": "sequence parallelism", "ckpt": "full recomputation", "sel": "selective recomputation"}


def is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@dataclass(frozen=True)
class Strategy:
    """One layer's parallelisation inside its pipeline stage's device group."""

    dims: tuple[tuple[str, int], ...]
    """`(axis, degree)` pairs, innermost (consecutive ranks) first; empty for a one-device group."""
    ckpt: bool = False
    """Activation checkpointing (full recomputation): stash only the layer input and recompute the rest in
    backward."""
    selective: bool = False
    """Selective recomputation (Korthikanti et al. Sec. 5): stash everything but the attention core's score-sized
    tensors and recompute QKᵀ, softmax, dropout and scores × V in backward. Exclusive with `ckpt`."""
    sp: bool = False
    """Sequence parallelism with TP (Korthikanti et al. Sec. 4.2.2): the activations TP replicates are split over
    the TP ranks along the sequence. Needs a tp axis."""
    ep: int = 1
    """Expert parallelism: a mixture-of-experts layer's routed experts split over `ep` of its data-parallel ranks
    (see the module). 1: every rank holds every expert. Needs one data-parallel axis whose degree `ep` divides."""
    expert_tp: int | None = None
    """The experts' TP degree where it differs from the layer's (`+etpN`, megatron-core's ETP; see the module); None:
    the layer's TP. A value equal to the TP degree is stored as None, so that both spellings are one strategy."""

    def __post_init__(self) -> None:
        if self.expert_tp is not None and self.expert_tp == dict(self.dims).get("tp", 1) and not isinstance(
                self.expert_tp, bool):
            object.__setattr__(self, "expert_tp", None)  # the layer's TP: one strategy, one name
        axes = [axis for axis, _ in self.dims]
        for axis, degree in self.dims:
            if axis not in AXES:
                raise PlanError(f"strategy axis {axis!r} is unknown; axes are {list(AXES)}")
            if degree < 2:  # the search enumerates powers of two (Alg. 1); a given plan may use any degree
                raise PlanError(f"strategy {axis}{degree}: a degree is at least 2 (leave the axis out for 1)")
        if len(set(axes)) != len(axes):
            raise PlanError(f"strategy {self.name}: each axis may appear once")
        sequence = [axis for axis in axes if axis in SEQUENCE_AXES]
        if len(sequence) > 1:
            raise PlanError(f"strategy {self.name}: context parallelism (cp) and Ulysses (ulysses) both split the "
                            "sequence; give one")
        if sequence:
            position, data = axes.index(sequence[0]), [axes.index(a) for a in axes if a in DATA_PARALLEL_AXES]
            if (data and data != [position + 1]) or (not data and position != len(axes) - 1):
                raise PlanError(f"strategy {self.name}: the {sequence[0]} axis goes immediately inside the one "
                                "data-parallel axis (or outermost without one), e.g. tp2-cp2-dp4 or tp4-cp2: its ranks "
                                "and the data-parallel ones synchronise gradients as one group")
        if self.ckpt and self.selective:
            raise PlanError(f"strategy {self.name}: full (+ckpt) and selective (+sel) recomputation exclude each "
                            "other; give one")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise PlanError(f"strategy {self.name}: the expert-parallel degree must be a whole number ≥ 1")
        if self.ep > 1 and self.expert_tp is None:
            check_expert_parallel(self, DATA_PARALLEL_AXES, SEQUENCE_AXES)
        if self.sp and self.degree("tp") < 2:
            raise PlanError(f"strategy {self.name}: sequence parallelism (+sp) splits TP's replicated regions; it "
                            "needs a tp axis of degree >= 2")
        if self.expert_tp is not None:
            check_expert_tp(self, DATA_PARALLEL_AXES)

    @classmethod
    def parse(cls, name: str) -> "Strategy":
        """The inverse of `name`: `tp2-dp4+ckpt` → Strategy((('tp', 2), ('dp', 4)), ckpt=True)."""
        text = name.strip()
        body, *suffixes = text.split("+")
        expert = [suffix for suffix in suffixes if _EXPERT_SUFFIX.match(suffix)]
        suffixes = [suffix for suffix in suffixes if not _EXPERT_SUFFIX.match(suffix)]
        if len(expert) > 1:
            raise PlanError(f"strategy {name!r}: expert parallelism is given {len(expert)} times; give one +epN")
        ep = int(_EXPERT_SUFFIX.match(expert[0]).group(1)) if expert else 1
        expert_tp = [suffix for suffix in suffixes if _EXPERT_TP_SUFFIX.match(suffix)]
        suffixes = [suffix for suffix in suffixes if not _EXPERT_TP_SUFFIX.match(suffix)]
        if len(expert_tp) > 1:
            raise PlanError(f"strategy {name!r}: the experts' TP degree is given {len(expert_tp)} times; give one +etpN")
        unknown = [suffix for suffix in suffixes if suffix not in _SUFFIXES]
        if unknown or len(set(suffixes)) != len(suffixes):
            raise PlanError(
                f"strategy {name!r}: cannot read the suffix {'+' + unknown[0] if unknown else 'given twice'}; "
                "suffixes are " + ", ".join(f"+{key} ({what})" for key, what in _SUFFIXES.items())
                + ", +epN (expert parallelism over N ranks), +etpN (the experts' TP degree), e.g. tp4-dp2+sp+sel")
        flags = dict(ckpt="ckpt" in suffixes, selective="sel" in suffixes, sp="sp" in suffixes, ep=ep,
                     expert_tp=int(_EXPERT_TP_SUFFIX.match(expert_tp[0]).group(1)) if expert_tp else None)
        if body == SINGLE_DEVICE_NAME:
            return cls((), **flags)
        dims = []
        for token in body.split("-"):
            match = _TOKEN.match(token)
            if match is None:
                raise PlanError(
                    f"strategy {name!r}: cannot read {token!r}; write axis+degree tokens joined by '-' "
                    f"with an optional '+ckpt', axes {list(AXES)}, e.g. tp2-dp4, sdp8+ckpt, single"
                )
            dims.append((match.group(1), int(match.group(2))))
        return cls(tuple(dims), **flags)

    @cached_property
    def name(self) -> str:
        return self.layout_name + ("+ckpt" if self.ckpt else "+sel" if self.selective else "")

    @cached_property
    def layout_name(self) -> str:
        """The name without the recomputation suffix: what a stock framework configures for every layer."""
        body = "-".join(f"{axis}{degree}" for axis, degree in self.dims) or SINGLE_DEVICE_NAME
        return (body + (f"+ep{self.ep}" if self.ep > 1 else "")
                + (f"+etp{self.expert_tp}" if self.expert_tp is not None else "") + ("+sp" if self.sp else ""))

    @property
    def recompute(self) -> str:
        """`none`, `full` (+ckpt) or `selective` (+sel)."""
        return "full" if self.ckpt else "selective" if self.selective else "none"

    def __str__(self) -> str:
        return self.name

    def degree(self, axis: str) -> int:
        """Degree of one axis (1 when the axis is absent)."""
        return self._degrees.get(axis, 1)

    @cached_property
    def _degrees(self) -> dict[str, int]:
        return dict(self.dims)

    @cached_property
    def group_size(self) -> int:
        size = 1
        for _, degree in self.dims:
            size *= degree
        return size

    @cached_property
    def tp(self) -> int:
        return self.degree("tp")

    @cached_property
    def data_parallel(self) -> int:
        """Ways the batch is split: the product of all data-parallel axes (dp, z1dp, z2dp, sdp)."""
        size = 1
        for axis, degree in self.dims:
            if axis in DATA_PARALLEL_AXES:
                size *= degree
        return size

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours of `axis`' groups: the product of the inner degrees."""
        stride = 1
        for name, degree in self.dims:
            if name == axis:
                return stride
            stride *= degree
        raise PlanError(f"strategy {self.name} has no {axis} axis")

    @cached_property
    def sequence_axis(self) -> str | None:
        """`cp` or `ulysses` where the strategy splits each sample's tokens, else None."""
        return next((axis for axis, _ in self.dims if axis in SEQUENCE_AXES), None)

    @cached_property
    def sequence_parallel_degree(self) -> int:
        """Ways each sample's tokens are split (the cp or ulysses degree; 1 without)."""
        return self.degree(self.sequence_axis) if self.sequence_axis else 1

    @cached_property
    def gradient_view(self) -> "Strategy":
        """The strategy as its weights see it: the sequence axis merged into the data-parallel axis (whose ZeRO
        flavour then spans both; plain DP without one), since both hold the same weights — `tp2-cp2-z1dp4` →
        `tp2-z1dp8`. Itself without a sequence axis."""
        if self.sequence_axis is None:
            return self
        dims, merged = [], self.sequence_parallel_degree
        data = [axis for axis, _ in self.dims if axis in DATA_PARALLEL_AXES]
        for axis, degree in self.dims:
            if axis == self.sequence_axis:
                if not data:
                    dims.append(("dp", degree))
                continue
            dims.append((axis, degree * merged) if axis in DATA_PARALLEL_AXES else (axis, degree))
        return Strategy(tuple(dims), self.ckpt, self.selective, self.sp, self.ep, self.expert_tp)

    @cached_property
    def expert_tensor_parallel(self) -> int:
        """The experts' TP degree (ETP): `expert_tp`, or the layer's TP."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @cached_property
    def expert_data_parallel(self) -> int:
        """Ways a mixture-of-experts layer's expert gradients are synchronised: the data-parallel degree (times the
        sequence degree: `gradient_view`'s) over EP, or W / (ETP · EP) under `+etpN`."""
        if self.expert_tp is not None:
            return self.group_size // (self.expert_tp * self.ep)
        return self.data_parallel * self.sequence_parallel_degree // self.ep

    def with_ckpt(self, ckpt: bool) -> "Strategy":
        """The same layout with full recomputation on, or with no recomputation."""
        return Strategy(self.dims, ckpt, sp=self.sp, ep=self.ep, expert_tp=self.expert_tp)

    def with_recompute(self, level: str) -> "Strategy":
        """The same layout with recomputation `level` (RECOMPUTE_LEVELS)."""
        return Strategy(self.dims, level == "full", level == "selective", self.sp, self.ep, self.expert_tp)

    def with_expert_parallel(self, ep: int, expert_tp: int | None = None) -> "Strategy":
        """The same strategy with its experts split over `ep` ranks (1: none), at TP degree `expert_tp` (None: the
        layer's)."""
        return Strategy(self.dims, self.ckpt, self.selective, self.sp, ep, expert_tp)


@cache
def _ordered_factorisations(group_size: int, parts: int) -> tuple[tuple[int, ...], ...]:
    """All ordered tuples of `parts` powers of two >= 2 whose product is `group_size` (cached: every permutation of
    axes asks again, and a search over 64 devices asked 2,275 times for a few dozen answers)."""
    exponent = group_size.bit_length() - 1
    return tuple(tuple(2**e for e in split) for split in itertools.product(range(1, exponent + 1), repeat=parts)
                 if sum(split) == exponent)


def enumerate_strategies(
    group_size: int, axes: tuple[str, ...] = SEARCH_AXES, prune_dp_with_sdp: bool = True, ckpt: bool = True,
    selective: bool = False, sequence_parallel: bool = False, expert_parallel: bool = False,
    expert_tensor_parallel: bool = False, single_data_parallel_axis: bool = False,
) -> list[Strategy]:
    """The decision trees over one stage's `group_size` devices (see `_enumerated_strategies`), a new list each call
    of the same (frozen) Strategy objects: searches of one process share them and what they cache."""
    return list(_enumerated_strategies(group_size, tuple(axes), prune_dp_with_sdp, ckpt, selective, sequence_parallel,
                                       expert_parallel, expert_tensor_parallel, single_data_parallel_axis))


@cache
def _enumerated_strategies(
    group_size: int, axes: tuple[str, ...], prune_dp_with_sdp: bool, ckpt: bool, selective: bool,
    sequence_parallel: bool, expert_parallel: bool, expert_tensor_parallel: bool = False,
    single_data_parallel_axis: bool = False,
) -> tuple[Strategy, ...]:
    """The decision trees over one stage's `group_size` devices (Sec. 3.2 construction rules).

    Each tree uses each axis at most once, innermost first, degrees from {2, 4, 8, …}; each tree
    appears without and (if `ckpt`) with activation checkpointing, and (if `selective`) with selective
    recomputation; with `sequence_parallel`, every tree with TP appears again with +sp at each level.
    Takeaway #3 drops trees that hold both dp and sdp unless `prune_dp_with_sdp` is False;
    `single_data_parallel_axis` drops every tree with more than one data-parallel axis (dp, z1dp, z2dp, sdp). With
    `expert_parallel` (a mixture-of-experts model), every strategy with one data-parallel axis of degree d appears
    again with +epN for each power of two N from 2 to d (to c · d with a sequence axis of degree c, and c without a
    data-parallel axis: the ranks holding other tokens, `gradient_view`); with `expert_tensor_parallel` too, every
    +sp strategy whose layout megatron-core's expert ranks follow (TP innermost, at most one data-parallel axis)
    appears again with +epN+etp1 — the experts whole, split over N consecutive ranks across TP and data-parallel
    ranks — for each power of two N from 2 to the group size (gbmw.space.expert_tensor_parallel). The paper's
    candidates come first, in the paper's order (of equally fast plans the first found wins).
    """
    if not is_power_of_two(group_size):
        raise PlanError(f"group size {group_size} is not a power of two; the decision trees need 1, 2, 4, 8, …")
    trees: list[tuple[tuple[str, int], ...]] = []
    if group_size == 1:
        trees.append(())
    for count in range(1, len(axes) + 1):
        for chosen in itertools.permutations(axes, count):
            if prune_dp_with_sdp and "dp" in chosen and "sdp" in chosen:
                continue
            if single_data_parallel_axis and sum(axis in DATA_PARALLEL_AXES for axis in chosen) > 1:
                continue
            if not _sequence_axis_placed(chosen):
                continue
            for degrees in _ordered_factorisations(group_size, count):
                trees.append(tuple(zip(chosen, degrees)))
    levels = ("none",) + (("full",) if ckpt else ()) + (("selective",) if selective else ())
    strategies = [Strategy(tree).with_recompute(level) for level in levels for tree in trees]
    if sequence_parallel:
        strategies += [Strategy(tree, sp=True).with_recompute(level) for level in levels for tree in trees
                       if dict(tree).get("tp", 1) > 1]
    if expert_parallel:
        plain = list(strategies)
        strategies += [strategy.with_expert_parallel(2**e) for strategy in plain
                       for e in range(1, _token_split_degree(strategy).bit_length())]
        if expert_tensor_parallel:
            strategies += [strategy.with_expert_parallel(2**e, expert_tp=1) for strategy in plain
                           if _expert_ranks_follow_megatron(strategy) for e in range(1, group_size.bit_length())]
    return tuple(strategies)


def _expert_ranks_follow_megatron(strategy: Strategy) -> bool:
    """Whether `strategy` may take `+etpN` (gbmw.space.expert_tensor_parallel): +sp, TP innermost and at least 2, at
    most one data-parallel axis and a sequence axis (folded into the expert grid's ranks), no other."""
    axes = [axis for axis, _ in strategy.dims]
    others = [axis for axis in axes[1:] if axis not in DATA_PARALLEL_AXES and axis != strategy.sequence_axis]
    data = [axis for axis in axes if axis in DATA_PARALLEL_AXES]
    return strategy.sp and strategy.tp > 1 and axes[0] == "tp" and len(data) <= 1 and not others


def _sequence_axis_placed(axes: tuple[str, ...]) -> bool:
    """At most one sequence axis, immediately inside the one data-parallel axis or outermost without one (the rule
    Strategy checks)."""
    sequence = [index for index, axis in enumerate(axes) if axis in SEQUENCE_AXES]
    if not sequence:
        return True
    data = [index for index, axis in enumerate(axes) if axis in DATA_PARALLEL_AXES]
    return len(sequence) == 1 and (data == [sequence[0] + 1] if data else sequence[0] == len(axes) - 1)


def _token_split_degree(strategy: Strategy) -> int:
    """Over how many ranks EP may split the experts: the degree of the one data-parallel axis of the strategy's
    weights (`gradient_view`: a sequence axis merged into it); 1 where they have none or several (no EP then)."""
    degrees = [degree for axis, degree in strategy.gradient_view.dims if axis in DATA_PARALLEL_AXES]
    return degrees[0] if len(degrees) == 1 else 1


def pipeline_degrees(num_devices: int, max_pp: int | None = None) -> list[int]:
    """PP degrees the planner tries: the powers of two that divide the device count (Alg. 1 l.4)."""
    if not is_power_of_two(num_devices):
        raise PlanError(f"{num_devices} devices: the search space needs a power-of-two device count")
    limit = num_devices if max_pp is None else min(max_pp, num_devices)
    return [2**e for e in range(num_devices.bit_length()) if 2**e <= limit]


def space_by_pipeline_degree(num_devices: int, prune_dp_with_sdp: bool = True) -> dict[int, list[Strategy]]:
    """{pp degree: candidate strategies over num_devices / pp devices} — the paper's Fig. 3 count."""
    return {
        pp: enumerate_strategies(num_devices // pp, prune_dp_with_sdp=prune_dp_with_sdp)
        for pp in pipeline_degrees(num_devices)
    }
