"""What the drop-in merge keeps of a user's ds_config although gbmw would set it, and what it must change
although gbmw does not own it (gbmw.adapters.deepspeed.user_config.merge_into_user_config applies these).

* Bucket sizes the user set to a number stay: `reduce_bucket_size` (and ZeRO-3's prefetch bucket and persistence
  threshold) trade memory for overlap, a choice the user may have tuned on their machines; gbmw fills them (HF's
  hidden-size rule) only when they are absent or "auto".
* `bfloat16`, DeepSpeed's older name of the `bf16` section, stays spelled as the user spelled it.
* `data_types.grad_accum_dtype`: without ZeRO (stage 0) DeepSpeed's engine accumulates gradients in the model's
  dtype only — `deepspeed.initialize` refuses bf16 weights with fp32 accumulation there
  (DeepSpeedEngine._do_optimizer_sanity_check: "unsupported mix of model_dtype and grad_accum_dtype"), which
  Megatron-DeepSpeed's universal-checkpointing configs set. When the plan drops to ZeRO-0 the key follows the
  model's dtype, and the change line says so.
"""

from __future__ import annotations

from typing import Any

USER_TUNED_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
"""Owned keys whose number, where the user wrote one, is kept."""

_DTYPE_NAMES = {
    "fp32": ("torch.float32", "fp32", "float32", "float"),
    "fp16": ("torch.float16", "fp16", "float16", "half"),
    "bf16": ("torch.bfloat16", "bf16", "bfloat16"),
}
"""DeepSpeed's DtypeEnum spellings (deepspeed/runtime/config.py)."""


def user_tuned(user: dict[str, Any], path: str, aliases: dict[str, str]) -> bool:
    """Whether the user set the key at `path` (or its alias) to a number: then it stays as written."""
    for candidate in (path, aliases.get(path)):
        if candidate is None:
            continue
        node: Any = user
        for part in candidate.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return True
    return False


def in_users_spelling(path: str, user: dict[str, Any]) -> str:
    """`bf16.…` as `bfloat16.…` when the user's config names the section `bfloat16`."""
    if path.startswith("bf16.") and "bfloat16" in user and "bf16" not in user:
        return "bfloat16" + path[len("bf16"):]
    return path


def grad_accum_dtype_change(config: dict[str, Any], precision: str, zero_stage: int) -> str | None:
    """Set `data_types.grad_accum_dtype` to the model's dtype where DeepSpeed would refuse it (ZeRO-0 and another
    dtype); the change line, or None when nothing changed."""
    data_types = config.get("data_types")
    if zero_stage != 0 or not isinstance(data_types, dict) or "grad_accum_dtype" not in data_types:
        return None
    old = data_types["grad_accum_dtype"]
    if str(old) in _DTYPE_NAMES[precision]:
        return None
    data_types["grad_accum_dtype"] = precision
    return (f"data_types.grad_accum_dtype: \"{old}\" -> \"{precision}\" (the plan uses ZeRO-0, where DeepSpeed "
            f"accumulates gradients in the model's {precision} only: deepspeed.initialize refuses {old} there; DeepSpeed "
            "keeps it only with ZeRO stage 1 or more)")
