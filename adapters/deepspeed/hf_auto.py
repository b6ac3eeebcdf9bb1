"""HF-Trainer-style ds_configs: `"auto"` values, and what gbmw fills in for them.

Hugging Face's DeepSpeed integration (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig) replaces
each `"auto"` before DeepSpeed reads the config: the batch keys from TrainingArguments
(`train_micro_batch_size_per_gpu` ← per_device_train_batch_size, `gradient_accumulation_steps`,
`train_batch_size` = world size × both), `bf16.enabled` / `fp16.enabled` from --bf16 / --fp16, `gradient_clipping`,
`optimizer.params` (lr, betas, eps, weight_decay) and `scheduler.params` from the other TrainingArguments, and
`zero_optimization.reduce_bucket_size` (hidden²), `stage3_prefetch_bucket_size` (0.9·hidden²),
`stage3_param_persistence_threshold` (10·hidden) from the model. A value that is not "auto" must equal the
TrainingArguments one, or HF refuses to start.

gbmw fills what its plan decides — the batch keys, the precision switches, the bucket sizes — with the plan's
numbers (the ones HF would compute for the same model), and leaves every other "auto" for HF to fill. Since HF
checks the plan's batch numbers against TrainingArguments, `trainer_arguments` says which arguments to pass.
"""

from __future__ import annotations

from typing import Any

from gbmw.errors import GbmwError

from .user_config import BATCH_KEYS, PRECISION_SECTIONS

FILLED_FROM_THE_PLAN = (*BATCH_KEYS, "bf16.enabled", "bfloat16.enabled", "fp16.enabled",
                        "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                        "zero_optimization.stage3_param_persistence_threshold")
"""The "auto" values gbmw replaces with the plan's; any other "auto" stays for HF Trainer."""


def auto_paths(config: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every "auto" value in a config."""
    if isinstance(config, dict):
        return [path for key, value in config.items() for path in auto_paths(value, f"{prefix}{key}.")]
    if isinstance(config, list):
        return [path for index, value in enumerate(config) for path in auto_paths(value, f"{prefix}{index}.")]
    return [prefix[:-1]] if config == "auto" else []


def has_auto_batch(config: dict[str, Any]) -> bool:
    """Whether HF Trainer decides the batch (any batch key "auto")."""
    return any(config.get(key) == "auto" for key in BATCH_KEYS)


def precision_of(config: dict[str, Any], asked: str | None, notes: list[str], where: str) -> str:
    """The precision a config trains in: the enabled section (bf16 / bfloat16 / fp16), else `asked`; with a switch
    left "auto" (HF's --bf16 / --fp16 decide) and nothing asked, bf16 with a note."""
    enabled = [key for key in PRECISION_SECTIONS if _enabled(config, key) is True]
    auto = [key for key in PRECISION_SECTIONS if _enabled(config, key) == "auto"]
    stated = "fp16" if enabled == ["fp16"] else "bf16" if enabled else None
    if asked is not None:
        if stated is not None and stated != asked:
            raise GbmwError(f"{where}: key `{enabled[0]}.enabled`: value true — the config trains in {stated}, but "
                            f"--precision {asked} was given; drop --precision or change the config")
        return asked
    if stated is not None:
        return stated
    if auto:
        notes.append(f"{where}: {' and '.join(f'{key}.enabled' for key in auto)} \"auto\" (HF Trainer's --bf16 / "
                     "--fp16 decide); planned for bf16 — give --precision fp16 or fp32 if you train otherwise")
        return "bf16"
    return "fp32"


def _enabled(config: dict[str, Any], section: str) -> Any:
    value = config.get(section)
    return value.get("enabled", False) if isinstance(value, dict) else False


def fill_precision_switches(config: dict[str, Any], precision: str) -> list[str]:
    """Set every "auto" precision switch left in a merged config from the plan's precision (one line per change)."""
    changes = []
    for section in PRECISION_SECTIONS:
        if _enabled(config, section) == "auto":
            value = (precision == "fp16") if section == "fp16" else (precision == "bf16")
            config[section]["enabled"] = value
            changes.append(f"{section}.enabled: \"auto\" -> {str(value).lower()} (the plan trains in {precision})")
    return changes


def trainer_arguments(config: dict[str, Any], precision: str) -> list[str]:
    """The TrainingArguments an HF Trainer run must be given so that HF accepts the plan's batch numbers."""
    args = ["--per_device_train_batch_size", str(config["train_micro_batch_size_per_gpu"]),
            "--gradient_accumulation_steps", str(config["gradient_accumulation_steps"])]
    return args + ([f"--{precision}"] if precision != "fp32" else [])
