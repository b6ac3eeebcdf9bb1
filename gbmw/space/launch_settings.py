"""Whether a target runs a job's launch settings — its precision, the dtype its gradients are reduced in, Transformer
Engine's TP communication overlap, the dtype of Adam's moments — and, where it does not, the one line that says which
field, why, and which target or setting would run it (gbmw.space.targets.Target.precision_refusal); and which layer
strategies bf16 Adam moments allow (`runs_with_adam_moments`)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from gbmw.space.strategy import Strategy


def launch_settings_refusal(target: Any, targets: Mapping[str, Any], precision: str,
                            gradient_reduce_dtype: str = "fp32", tp_comm_overlap: bool = False,
                            adam_moments_dtype: str = "fp32") -> str | None:
    """Why `target` (a gbmw.space.targets.Target) cannot train in `precision` with gradients in `gradient_reduce_dtype`
    (and, where asked, Transformer Engine's TP communication overlap), or None; `targets`: every target by name, for
    naming those that would."""
    if precision not in target.precisions:
        runs_it = [name for name, other in targets.items() if precision in other.precisions]
        why, instead = ((f"{target.label}'s configuration cannot turn on torch's TF32 matmuls", "fp32")
                        if precision == "tf32" else (f"{target.label} does not run Transformer Engine's FP8 linears",
                                                     "bf16"))
        return (f"precision {precision}: --target {target.name} plans {', '.join(target.precisions)} ({why}); plan it "
                f"for --target {' or '.join(runs_it) or '…'}, or set the job's precision to {instead}")
    if gradient_reduce_dtype not in target.gradient_reduce_dtypes:
        runs_it = [name for name, other in targets.items() if gradient_reduce_dtype in other.gradient_reduce_dtypes]
        return (f"gradient_reduce_dtype {gradient_reduce_dtype}: --target {target.name} reduces gradients in "
                f"{', '.join(target.gradient_reduce_dtypes)}; plan it for --target {' or '.join(runs_it)}, or drop "
                "the job's gradient_reduce_dtype")
    if tp_comm_overlap and not target.tp_comm_overlap:
        runs_it = [name for name, other in targets.items() if other.tp_comm_overlap]
        return (f"tp_comm_overlap: --target {target.name} does not run Transformer Engine's TP communication overlap "
                f"({target.label} has no such switch); plan it for --target {' or '.join(runs_it)}, or drop the "
                "job's tp_comm_overlap")
    if adam_moments_dtype not in target.adam_moments_dtypes:
        runs_it = [name for name, other in targets.items() if adam_moments_dtype in other.adam_moments_dtypes]
        return (f"adam_moments_dtype {adam_moments_dtype}: --target {target.name} keeps Adam's moments in "
                f"{', '.join(target.adam_moments_dtypes)}; plan it for --target {' or '.join(runs_it)}, or drop the "
                "job's adam_moments_dtype")
    return None


def runs_with_adam_moments(strategy: Strategy, adam_moments_dtype: str) -> bool:
    """Whether a layer under `strategy` can keep Adam's moments in `adam_moments_dtype`: megatron-core runs bf16
    moments only under its distributed optimizer (megatron/core/optimizer/__init__.py: "--use-precision-aware-optimizer
    only supported with distributed optimizer"), so no layer may use plain data parallelism (dp, DDP) of degree > 1."""
    return adam_moments_dtype == "fp32" or strategy.degree("dp") == 1


def adam_moments_layout_problem(strategies: Iterable[Strategy], adam_moments_dtype: str) -> str | None:
    """Why a plan's `strategies` cannot keep Adam's moments in `adam_moments_dtype` (`runs_with_adam_moments`), or
    None."""
    plain = sorted({strategy.name for strategy in strategies if not runs_with_adam_moments(strategy, adam_moments_dtype)})
    if not plain:
        return None
    return (f"adam_moments_dtype {adam_moments_dtype} needs Megatron's distributed optimizer, but layers use plain data "
            f"parallelism ({', '.join(plain[:3])}); use z1dp in their place, or drop the job's adam_moments_dtype")
