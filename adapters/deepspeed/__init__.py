"""Plan → DeepSpeed config (`ds_config.json`), drop-in rewrite of a user's config, and validation by
DeepSpeed itself.

Every key below is DeepSpeed's, as documented in "DeepSpeed Configuration JSON"
(https://www.deepspeed.ai/docs/config-json/) and defined in `deepspeed/runtime/config.py`,
`runtime/zero/config.py` (`DeepSpeedZeroConfig`), `runtime/precision_config.py` and
`runtime/activation_checkpointing/config.py` (checked against deepspeed 0.19.8).

What a Plan becomes (a plan DeepSpeed can run: one layout for every layer, gbmw.space.targets):

* Batch — DeepSpeed's identity `train_batch_size = train_micro_batch_size_per_gpu ×
  gradient_accumulation_steps × DP`, with DP = N / (TP × PP) the data-parallel size its engine
  takes from the model-parallel unit. A Plan's `micro_batch` counts all DP replicas together, so
  `train_micro_batch_size_per_gpu = micro_batch / DP`; `gradient_accumulation_steps` is the number
  of pipeline micro-batches and `train_batch_size` the global batch.
* `zero_optimization.stage` — from the data-parallel axis: dp → 0, z1dp → 1, z2dp → 2, sdp → 3.
* `activation_checkpointing` — present when the Transformer blocks recompute (CKPT).
* `bf16` / `fp16` — `enabled` from the job's precision; fp32 enables neither.
* `pipeline.activation_checkpoint_interval` (pp > 1) — DeepSpeed's pipeline engine reads this
  section (`get_pipeline_config`): 1 checkpoints every layer of the PipelineModule, 0 leaves the
  module's own setting. The pipeline *partition* is not a config key: it is the PipelineModule's
  `partition_method` argument, which `pipeline_partition_method` names.

DeepSpeed is imported only inside `validate_with_deepspeed` (the planner never imports torch):
`import deepspeed.runtime.config` costs ~3 s on a 2-core CPU machine, ~2.5 s of it torch.

Files: `ds_config.py` (Plan → ds_config and back, pipeline partition methods), `user_config.py`
(a user's config: reading, batch sizes, the drop-in merge, writing), `kept_settings.py` (what the merge
keeps of the user's although gbmw sets it, and changes although gbmw does not own it), `hf_auto.py`
(HF-Trainer "auto" values), `validation.py` (DeepSpeed's own DeepSpeedConfig), `engine_check.py` and
`engine_worker.py` (DeepSpeed's engine started on a stand-in model in a subprocess, one step). Inside this package
`import deepspeed` is absolute and names the library.
"""

from __future__ import annotations

from .ds_config import (DEEPSPEED_TARGETS, deepspeed_partition_balanced, deepspeed_partition_uniform,
                        deepspeed_partitions, ds_config_to_plan_fields, pipeline_partition_method, plan_layout,
                        plan_to_ds_config)
from .user_config import (BATCH_KEYS, OWNED_KEY_ALIASES, OWNED_KEYS, OWNED_SECTIONS, batch_consistency_problems,
                          check_batch_consistency, dumps_config, load_user_config, merge_into_user_config,
                          resolve_batch, write_ds_config)

# tests/test_deepspeed_adapter.py walks emitted configs with these two helpers (as ds._paths, ds._get).
from .user_config import _get as _get
from .validation import _paths as _paths
from .engine_check import EngineChecker, check_engine_starts
from .validation import deepspeed_warnings_as_notes, validate_with_deepspeed

__all__ = [
    "BATCH_KEYS",
    "EngineChecker",
    "DEEPSPEED_TARGETS",
    "OWNED_KEYS",
    "OWNED_KEY_ALIASES",
    "OWNED_SECTIONS",
    "batch_consistency_problems",
    "check_batch_consistency",
    "check_engine_starts",
    "deepspeed_partition_balanced",
    "deepspeed_partition_uniform",
    "deepspeed_partitions",
    "deepspeed_warnings_as_notes",
    "ds_config_to_plan_fields",
    "dumps_config",
    "load_user_config",
    "merge_into_user_config",
    "pipeline_partition_method",
    "plan_layout",
    "plan_to_ds_config",
    "resolve_batch",
    "validate_with_deepspeed",
    "write_ds_config",
]
