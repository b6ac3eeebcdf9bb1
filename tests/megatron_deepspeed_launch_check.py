"""Run in its own process by tests/test_gpt3_recipes.py: one launch line's arguments through microsoft/Megatron-DeepSpeed's
own `parse_args` + `validate_args` (with pretrain_gpt.py's defaults and the `--local_rank=0` DeepSpeed's launcher adds,
as benchmarks/megatron_deepspeed_arguments.py runs them), then the learning rates of Megatron-DeepSpeed's own
OptimizerParamScheduler for the parsed flags beside those of DeepSpeed's scheduler for the ds_config.

    python tests/megatron_deepspeed_launch_check.py < {"checkout", "argv", "world_size", "environment", "ds_config"}

Prints one JSON object: the parsed values the test compares, and the two learning-rate curves. Its own process:
the checkout's `megatron` package replaces megatron-core in sys.modules, and parse_args reads sys.argv.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHECKED = ("lr", "min_lr", "lr_decay_style", "lr_warmup_iters", "lr_decay_iters", "adam_beta1", "adam_beta2",
           "adam_eps", "weight_decay", "clip_grad", "optimizer", "train_iters", "data_path", "split", "tokenizer_type",
           "vocab_file", "merge_file", "save", "load", "save_interval", "log_interval", "eval_interval", "deepspeed",
           "deepspeed_config", "bf16", "fp16", "global_batch_size", "data_parallel_size", "zero_stage")
CURVE_STEPS = (1, 2, 500, 1999, 2000, 2001, 2500, 150000, 299999, 300000)


def main() -> None:
    job = json.load(sys.stdin)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from megatron_deepspeed_arguments import import_arguments, parse_as_rank_zero

    args = parse_as_rank_zero(import_arguments(job["checkout"]), job["argv"], job["environment"], job["world_size"])
    if isinstance(args, str):
        print(json.dumps({"refused": args}))
        return
    print(json.dumps({"parsed": {key: getattr(args, key, None) for key in CHECKED},
                      "curves": _curves(args, job["ds_config"])}))


def _curves(args, config: dict) -> dict:
    """{"megatron": [...], "deepspeed": [...]}: the learning rate after each of CURVE_STEPS optimizer steps."""
    import torch
    from deepspeed.runtime import lr_schedules
    from megatron.global_vars import set_args
    from megatron.optimizer_param_scheduler import OptimizerParamScheduler

    set_args(args)  # its step() reads consumed_train_tokens from Megatron's global args
    args.consumed_train_tokens = 0

    def optimizer():
        return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)

    # megatron/training.py get_optimizer_param_scheduler, iteration-based training: steps count samples
    samples = args.global_batch_size
    megatron = OptimizerParamScheduler(
        optimizer(), max_lr=args.lr, min_lr=args.min_lr, lr_warmup_steps=args.lr_warmup_iters * samples,
        lr_decay_steps=(args.lr_decay_iters or args.train_iters) * samples, lr_decay_style=args.lr_decay_style,
        start_wd=args.start_weight_decay, end_wd=args.end_weight_decay, wd_incr_steps=args.train_iters * samples,
        wd_incr_style=args.weight_decay_incr_style, use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False)
    deepspeed_optimizer = optimizer()
    deepspeed = getattr(lr_schedules, config["scheduler"]["type"])(deepspeed_optimizer, **config["scheduler"]["params"])
    curves: dict[str, list[float]] = {"megatron": [], "deepspeed": []}
    done = 0
    for step in CURVE_STEPS:  # DeepSpeed's engine steps its scheduler after each optimizer step, as Megatron's does
        megatron.step(increment=(step - done) * samples)
        deepspeed.step(last_batch_iteration=step)
        done = step
        curves["megatron"].append(megatron.get_lr())
        curves["deepspeed"].append(deepspeed_optimizer.param_groups[0]["lr"])
    return curves


if __name__ == "__main__":
    main()
