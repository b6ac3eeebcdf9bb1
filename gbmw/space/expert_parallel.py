"""Over which ranks a mixture-of-experts layer's routed experts split (`+epN`, gbmw.space.strategy; Lepikhin et al.,
"GShard", 2020; Rajbhandari et al., "DeepSpeed-MoE", 2022; megatron-core's `--expert-model-parallel-size`).

EP splits the experts over `ep` ranks that hold other tokens: every rank still computes the attention of its own
tokens, and the tokens reach the rank holding their experts by an all-to-all (dispatch) and come back by another
(combine). Without a sequence axis those are `ep` ranks of the layer's one data-parallel axis, innermost among them
(megatron-core's tp-ep-dp order), and the experts' gradients are synchronised over the other dp / ep (the
expert-data-parallel group, EDP). With a sequence axis (cp, ulysses) the experts see the layer as its weights do
(`Strategy.gradient_view`: the sequence ranks merged into the data-parallel axis, `tp2-cp2-dp2+ep4` → `tp2-dp4+ep4`):
every rank routes its own tokens, and EP splits the experts over the merged axis, sequence ranks innermost —
megatron-core's expert grid, which lays the TP · CP · DP ranks out again as ETP · EP · EDP with no cp
(megatron/core/parallel_state.py, `expert_decoder_rank_generator`); EP then divides cp · dp, and EDP = cp · dp / ep.
The experts' TP degree is the layer's unless `+etpN` gives another (gbmw.space.expert_tensor_parallel).
"""

from __future__ import annotations

from gbmw.errors import PlanError


def check_expert_parallel(strategy, data_parallel_axes: tuple[str, ...], sequence_axes: tuple[str, ...]) -> None:
    """The module's rules for `+epN` at the layer's expert TP on a gbmw.space.strategy.Strategy (which calls this
    while it is built, with its axis names), one PlanError each."""
    ep, name = strategy.ep, strategy.name
    data_axes = [(axis, degree) for axis, degree in strategy.dims if axis in data_parallel_axes]
    sequence = [(axis, degree) for axis, degree in strategy.dims if axis in sequence_axes]
    if sequence:  # Strategy has checked: one sequence axis, just inside at most one data-parallel axis
        (axis, degree), = sequence
        if degree * (data_axes[0][1] if data_axes else 1) % ep:
            shown = " × ".join(f"{a}{d}" for a, d in sequence + data_axes)
            raise PlanError(f"strategy {name}: expert parallelism (+ep{ep}) splits the experts over the ranks holding "
                            f"other tokens — the {axis} ranks, then at most one data-parallel axis; {ep} must divide "
                            f"their product ({shown}), e.g. tp2-cp2-dp4+ep8")
    elif len(data_axes) != 1 or data_axes[0][1] % ep:
        shown = " × ".join(f"{axis}{degree}" for axis, degree in data_axes) or "none"
        raise PlanError(f"strategy {name}: expert parallelism (+ep{ep}) splits the experts over data-parallel ranks; "
                        f"it needs one data-parallel axis whose degree {ep} divides (data-parallel axes: {shown}), "
                        "e.g. tp2-dp8+ep4")
