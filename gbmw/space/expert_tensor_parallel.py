"""Expert tensor parallelism other than the layer's (`+etpN`; megatron-core's `--expert-tensor-parallel-size`,
megatron/core/parallel_state.py: a second rank generator for the experts) decomposes the stage's W = TP · DP ranks
again, for the experts only, as W = ETP · EP · EDP — ETP innermost (consecutive ranks), then EP, then the
expert-data-parallel ranks. A rank holds E / EP experts, 1/ETP of each; the EP group (EP ranks, ETP apart) may span
TP ranks and data-parallel ranks — ETP 1 with TP 2 (Qwen3-235B's and DeepSeek-V3's recipes) exchanges tokens
among all EP consecutive ranks, each holding its own 1/TP of its replica's tokens under sequence parallelism; the
experts' gradients are synchronised over EDP = W / (ETP · EP) ranks, ETP · EP apart. That layout is megatron's only
where TP is innermost and one data-parallel axis lies outside it, so `+etpN` needs: ETP dividing TP, TP the
innermost axis, at most one data-parallel axis, ETP · EP dividing W, expert parallelism (+epN, N >= 2) and sequence
parallelism (+sp, each rank's tokens its own). A sequence axis (cp, ulysses) may lie between TP and the data-parallel
axis: megatron-core's expert grid has no cp, its TP · CP · DP ranks laid out again as ETP · EP · EDP
(parallel_state.py, `expert_decoder_rank_generator`), which is the same W ranks in the same order — each rank routes
its own tokens (its TP slice of its sequence chunk). `+etpN` is shown only where N differs from TP: `tp2-dp4+ep2` and
`tp2-dp4+ep2+etp2` are one strategy.
"""

from __future__ import annotations

from gbmw.errors import PlanError


def check_expert_tp(strategy, data_parallel_axes: tuple[str, ...]) -> None:
    """The rules of the module for `+etpN` (an expert TP degree other than the layer's) on a gbmw.space.strategy
    .Strategy (which calls this while it is built, with its data-parallel axes), one PlanError each."""
    etp, ep, tp, name = strategy.expert_tp, strategy.ep, strategy.tp, strategy.name
    if isinstance(etp, bool) or not isinstance(etp, int) or etp < 1:
        raise PlanError(f"strategy {name}: the experts' TP degree (+etpN) must be a whole number ≥ 1")
    if tp == 1:
        raise PlanError(f"strategy {name}: +etp{etp} without a tp axis; the experts' TP degree divides the layer's — "
                        "leave +etpN out")
    if tp % etp:
        raise PlanError(f"strategy {name}: the experts' TP degree {etp} must divide the layer's TP degree {tp} "
                        f"(megatron-core splits the TP ranks' experts inside them), e.g. "
                        f"+etp{next(d for d in range(tp // 2 + 1, 0, -1) if tp % d == 0)}")
    if ep < 2:
        raise PlanError(f"strategy {name}: +etp{etp} sets the TP degree of experts split over ranks; give expert "
                        "parallelism with it (+epN, N ≥ 2), e.g. tp2-dp4+ep8+etp1+sp")
    axes = [axis for axis, _ in strategy.dims]
    data = [axis for axis in axes if axis in data_parallel_axes]
    sequence = [axis for axis in axes if axis == strategy.sequence_axis]
    if axes[0] != "tp" or len(data) > 1 or len(axes) > 1 + len(data) + len(sequence):
        raise PlanError(f"strategy {name}: +etp{etp} lays the experts out as megatron-core does (ETP, then EP, then "
                        "expert-data-parallel ranks over the layer's TP, sequence and data-parallel ranks); it needs "
                        "TP innermost and at most one data-parallel axis outside it, e.g. tp2-dp8+ep8+etp1+sp")
    if strategy.group_size % (etp * ep):
        raise PlanError(f"strategy {name}: etp({etp}) * ep({ep}) = {etp * ep} must divide the {strategy.group_size} "
                        "ranks of the stage (they are the experts' ETP · EP · EDP)")
    if not strategy.sp:
        raise PlanError(f"strategy {name}: +etp{etp} needs sequence parallelism (+sp): the EP group exchanges each "
                        "TP rank's own tokens (megatron-core requires --sequence-parallel with EP and TP)")
