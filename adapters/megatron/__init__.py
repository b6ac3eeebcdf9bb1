"""Plan → Megatron-LM / Megatron-DeepSpeed arguments and megatron-core configs, and back.

A stock Megatron job runs a *uniform 3D* plan: one layout for every layer — TP on consecutive
ranks, data parallelism outside it, pipeline stages outermost — one recomputation setting for all
Transformer blocks, and Megatron's pipeline split. `gbmw.space.targets` decides whether a
plan is one; this package only translates the plans it accepts. Targets:

* ``megatron-core`` (alias ``megatron-lm``): NVIDIA Megatron-LM's ``pretrain_gpt.py``, whose model is
  megatron-core's GPTModel built from a ``TransformerConfig``. Flags from
  ``megatron/training/arguments.py`` (``_add_distributed_args``, ``_add_training_args``,
  ``_add_network_size_args``, ``_add_mixed_precision_args``, ``_add_data_args``).
* ``megatron-deepspeed``: Microsoft's Megatron-DeepSpeed fork; DeepSpeed's engine holds ZeRO and the
  pipeline. Flags from its ``megatron/arguments.py`` (``--zero-stage`` in ``_add_zero_args``),
  DeepSpeed's ``add_config_arguments`` (``--deepspeed``, ``--deepspeed_config``) and the fork's
  ``examples_deepspeed`` scripts (``--no-pipeline-parallel``, ``--deepspeed-activation-checkpointing``,
  ``--normalization rmsnorm``, ``--use-rotary-position-embeddings``, ``--num-key-value-heads``).

What a plan says, and the flag that says it::

    Plan                              megatron-core / Megatron-LM            Megatron-DeepSpeed
    tp of the layout                  --tensor-model-parallel-size           same
    pp                                --pipeline-model-parallel-size         same; pp = 1: --no-pipeline-parallel
    micro_batch / DP                  --micro-batch-size                     same
    global_batch                      --global-batch-size                    same
    z1dp (ZeRO-1)                     --use-distributed-optimizer            --zero-stage 1
    dp / z2dp / sdp                   (plain DDP) / refused / refused        --zero-stage 0 / 2 / 3
    +ckpt on every block              --recompute-granularity full --recompute-method uniform
                                      --recompute-num-layers 1               same + --deepspeed-activation-checkpointing
    +sel on every block               --recompute-granularity selective      same; refused with flash attention
                                                                             (its flash path recomputes nothing)
    +sp on every layer (TP > 1)       --sequence-parallel                    same
    uneven first/last stages          --decoder-first-pipeline-num-layers    refused (even split only)
                                      --decoder-last-pipeline-num-layers
    virtual_stages v > 1              --num-layers-per-virtual-pipeline-stage refused (plain 1F1B)
                                      (blocks per stage / v)
    v > 1 on the split counting       --account-for-embedding-in-pipeline-split
    the embedding and the loss as     --account-for-loss-in-pipeline-split   refused
    layers (first and last stages     --num-layers-per-virtual-pipeline-stage
    one block short)                  ((blocks + 2) / pp / v)
    precision                         --bf16 / --fp16 (none for fp32)        same
    precision fp8                     --bf16 --fp8-format hybrid              refused (no Transformer Engine FP8)
                                      --fp8-recipe delayed (fp8_recipe
                                      current: tensorwise)
    gradient_reduce_dtype bf16        --grad-reduce-in-bf16                  refused (DeepSpeed's bf16 optimizer)
    tp_comm_overlap (with +sp)        --tp-comm-overlap                      refused (no Transformer Engine overlap)
    adam_moments_dtype bf16 (z1dp     --use-precision-aware-optimizer        refused (no precision-aware optimizer)
    or no data parallelism)           --exp-avg-dtype bf16
                                      --exp-avg-sq-dtype bf16
                                      --use-distributed-optimizer

Megatron places the embedding on the first stage and the output layer on the last, and
``--num-layers`` counts Transformer blocks only; in a Plan the embedding and head are layers, so
stage 0 of ``partition`` holds one more layer than its blocks and the last stage one more.

Files: `layout.py` (targets, the architecture, the layout read off a plan, blocks per stage),
`arguments.py` (Plan → arguments), `arguments_to_plan.py` (the argument parser mirror and
arguments → Plan), `core_configs.py` (megatron-core's config dataclasses), `launch.py` (the launch
line), `optimizer_arguments.py` (a ds_config's optimizer, schedule, clipping, loss scaling and offload as
Megatron flags). Inside this package `import megatron` is absolute and names the megatron-core library.
"""

from __future__ import annotations

from .arguments import plan_to_megatron_args
from .arguments_to_plan import DEEPSPEED_REFUSED_FLAGS, UNMODELLED_FLAGS, megatron_args_to_plan
from .core_configs import plan_to_megatron_core_configs
from .launch import LAUNCHERS, launch_line
from .optimizer_arguments import TrainingArguments, ds_config_training_arguments, plan_training_arguments
from .layout import TARGETS, MegatronLayout, gpt_architecture, megatron_blocks_per_stage, megatron_layout, plan_target

__all__ = [
    "DEEPSPEED_REFUSED_FLAGS",
    "LAUNCHERS",
    "MegatronLayout",
    "TARGETS",
    "TrainingArguments",
    "UNMODELLED_FLAGS",
    "ds_config_training_arguments",
    "gpt_architecture",
    "launch_line",
    "megatron_args_to_plan",
    "megatron_blocks_per_stage",
    "megatron_layout",
    "plan_target",
    "plan_to_megatron_args",
    "plan_to_megatron_core_configs",
    "plan_training_arguments",
]
