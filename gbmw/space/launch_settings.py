"""Whether a target runs a job's launch settings — its precision, the dtype its gradients are reduced in, Transformer
Engine's TP communication overlap — and, where it does not, the one line that says which field, why, and which
target or setting would run it (gbmw.space.targets.Target.precision_refusal)."""

from __future__ import annotations

from typing import Any, Mapping


def launch_settings_refusal(target: Any, targets: Mapping[str, Any], precision: str,
                            gradient_reduce_dtype: str = "fp32", tp_comm_overlap: bool = False) -> str | None:
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
    return None
