"""The dtypes a 16-bit model's gradients and Adam's moments are kept in — job and plan fields that change the model
states O_ms of Eq. (2) (gbmw.cost.model_states) — and the one line that says why a value does not go with a job."""

from __future__ import annotations

from typing import Literal

GradientReduceDtype = Literal["fp32", "bf16"]
GRADIENT_REDUCE_DTYPES: tuple[str, ...] = ("fp32", "bf16")
"""The dtype a 16-bit model's gradients are accumulated and reduced in (gbmw.cost.model_states): `fp32` (Megatron's
default under bf16: fp32 main gradients, 4 bytes per parameter) or `bf16` (megatron-core's `--grad-reduce-in-bf16`,
NeMo's `optim.grad_sync_dtype: bf16`: the gradient buffer in bf16, 2 bytes)."""

AdamMomentsDtype = Literal["fp32", "bf16"]
ADAM_MOMENTS_DTYPES: tuple[str, ...] = ("fp32", "bf16")
"""The dtype Adam's two moments (exp_avg, exp_avg_sq) are kept in (gbmw.cost.model_states): `fp32` (the default) or
`bf16` (megatron-core's precision-aware optimizer: `--use-precision-aware-optimizer --exp-avg-dtype bf16
--exp-avg-sq-dtype bf16`, Transformer Engine's FusedAdam; the fp32 main weights stay, 8 bytes of optimizer state per
parameter instead of 12). Megatron runs it only under its distributed optimizer (ZeRO-1)."""

BF16_GRADIENT_PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
"""The precisions whose gradients Megatron accumulates in fp32 unless told bf16 (fp8 keeps bf16 weights)."""


def gradient_reduce_dtype_problem(precision: str, gradient_reduce_dtype: str) -> str | None:
    """Why `gradient_reduce_dtype` does not go with `precision` (one line naming the field and what works), or None."""
    if gradient_reduce_dtype not in GRADIENT_REDUCE_DTYPES:
        return f"gradient_reduce_dtype {gradient_reduce_dtype!r} is not one of {list(GRADIENT_REDUCE_DTYPES)}"
    if gradient_reduce_dtype == "bf16" and precision not in BF16_GRADIENT_PRECISIONS:
        return (f"gradient_reduce_dtype bf16 reduces the gradients of a bf16 model (precision bf16 or fp8), but the "
                f"precision is {precision}; set precision: bf16 or drop gradient_reduce_dtype")
    return None


def adam_moments_dtype_problem(precision: str, optimizer: str, adam_moments_dtype: str) -> str | None:
    """Why `adam_moments_dtype` does not go with `precision` and `optimizer` (one line naming the field and what works),
    or None."""
    if adam_moments_dtype not in ADAM_MOMENTS_DTYPES:
        return f"adam_moments_dtype {adam_moments_dtype!r} is not one of {list(ADAM_MOMENTS_DTYPES)}"
    if adam_moments_dtype == "bf16" and optimizer != "adam":
        return (f"adam_moments_dtype bf16 keeps Adam's moments in bf16, but the optimizer is {optimizer}, which keeps "
                "none; set optimizer: adam or drop adam_moments_dtype")
    if adam_moments_dtype == "bf16" and precision not in BF16_GRADIENT_PRECISIONS:
        return (f"adam_moments_dtype bf16 is megatron-core's precision-aware optimizer for a bf16 model (precision bf16 "
                f"or fp8), but the precision is {precision}; set precision: bf16 or drop adam_moments_dtype")
    return None
