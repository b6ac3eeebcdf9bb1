"""Every Megatron-DeepSpeed argument set gbmw emits, parsed and validated by microsoft/Megatron-DeepSpeed's own
`parse_args` and `validate_args` (megatron/arguments.py) — what its pretrain_gpt.py runs in initialize_megatron,
with pretrain_gpt's defaults (issue 14; benchmarks/megatron_lm_arguments.py does the same for Megatron-LM).

    git clone https://github.com/microsoft/Megatron-DeepSpeed /path/to/Megatron-DeepSpeed
    # what its megatron package imports beyond gbmw[runtime] (the tokenizer: transformers, six, regex); torch stays
    # pinned in the same command, else pip may replace the CPU build. The benchmark's alone: not a gbmw dependency.
    .venv/bin/pip install transformers six regex torch==2.13.0
    MEGATRON_DEEPSPEED=/path/to/Megatron-DeepSpeed .venv/bin/python benchmarks/megatron_deepspeed_arguments.py

The argument sets: gbmw's best megatron-deepspeed plan for every bundled GPT job, the published hand-tuned
configurations that Megatron-DeepSpeed ran (recipes/handtuned/), and a grid of uniform configurations over TP, PP,
every ZeRO stage, sequence parallelism and every recomputation level (those gbmw refuses for the target are listed
apart). Each runs as one rank sees it under DeepSpeed's launcher: WORLD_SIZE from the plan, RANK 0,
`--local_rank=0` in front of the arguments, and the environment variables gbmw's launch line sets in front.

One shim, because the machine has no GPU: validate_args checks CUDA_DEVICE_MAX_CONNECTIONS (sequence parallelism
needs it to be 1) only when DeepSpeed's accelerator is CUDA, so during validation the accelerator's device_name
answers "cuda" as on the GPU machine (a control checks that the check then runs). After validation, the parsed TP,
PP, DP, ZeRO stage, DeepSpeed pipeline, sequence parallelism, recomputation, batch sizes and model widths must be
the plan's. The checkout is only read (its directory goes first on sys.path); nothing of it is copied into gbmw.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

import gbmw
from gbmw.adapters.megatron import launch_line, plan_to_megatron_args
from gbmw.errors import GbmwError
from gbmw.handwritten.handtuned_config import load_handtuned
from gbmw.search.planner import Planner
from gbmw.specs.bundled import RECIPES_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_lm_arguments import GPT_JOBS, GRID_JOBS, import_from_checkout  # noqa: E402

TARGET = "megatron-deepspeed"
PRETRAIN_GPT_DEFAULTS = {"tokenizer_type": "GPT2BPETokenizer"}
"""pretrain_gpt.py's `args_defaults`, which initialize_megatron hands to validate_args."""
REACH_CONFIGS = {  # issue 26's experts and issue 27's Ulysses, beside gbmw's own plans for these jobs
    "mixtral-8x7b_h100-80g-x64": ("tp=1,pp=4,zero=1,ep=8,micro=1", "tp=2,pp=1,zero=2,ep=2,sp=on,ckpt=full,micro=1"),
    "llama3.1-8b-128k_h100-80g-x64": ("tp=1,pp=1,zero=1,ulysses=8,micro=1", "tp=2,pp=2,zero=1,ulysses=4,ckpt=full,micro=1",
                                      "tp=1,pp=1,zero=3,ulysses=8,micro=1"),
}
GRID = ((1, 1, 0), (2, 2, 1), (8, 1, 1), (4, 4, 0), (2, 1, 2), (4, 1, 3), (1, 1, 3))
"""(TP, PP, ZeRO stage) of the uniform grid: every stage, with and without a pipeline (ZeRO ≤ 1 under one)."""


def import_arguments(path: str | None):
    """Megatron-DeepSpeed's megatron.arguments, from the checkout (which goes first on sys.path)."""
    if not path:
        sys.exit("give the Megatron-DeepSpeed checkout with --megatron-deepspeed PATH or MEGATRON_DEEPSPEED=PATH: "
                 "git clone https://github.com/microsoft/Megatron-DeepSpeed")
    root = Path(path).expanduser().resolve()
    if not (root / "megatron" / "arguments.py").is_file():
        sys.exit(f"--megatron-deepspeed {root}: no megatron/arguments.py there; clone microsoft/Megatron-DeepSpeed")
    return import_from_checkout(root, "megatron.arguments", "Megatron-DeepSpeed")


def argument_sets() -> tuple[list[tuple[str, gbmw.JobSpec, gbmw.Plan]], list[str]]:
    """(label, job, plan) of every Megatron-DeepSpeed plan checked; and the grid points gbmw refuses, with why."""
    cases, refused = [], []
    jobs = {name: gbmw.load_job(name) for name in GPT_JOBS + tuple(REACH_CONFIGS)}
    for name, job in jobs.items():
        try:
            cases.append((f"{name}: gbmw plan", job, Planner(job, target=TARGET).run()))
        except GbmwError as error:
            refused.append(f"{name}: gbmw plan --target {TARGET}: {error}")
    for path in sorted((RECIPES_DIR / "handtuned").glob("*.yaml")):
        config = load_handtuned(path)
        job = next((job for job in jobs.values() if job.model.name == config.applies_to), None)
        if config.target == TARGET and job is not None:
            cases.append((f"{job.name}: hand-tuned {config.name}", job, config.uniform.to_plan(job)))
    for name, configs in REACH_CONFIGS.items():
        cases += [(f"{name}: {config}", jobs[name], gbmw.uniform_plan(jobs[name], f"{config},target={TARGET}"))
                  for config in configs]
    for name in GRID_JOBS:
        for tp, pp, zero in GRID:
            for ckpt in ("none", "full", "selective"):
                for sp in ("off", "on") if tp > 1 else ("off",):
                    config = f"tp={tp},pp={pp},zero={zero},ckpt={ckpt},sp={sp},micro=1"
                    try:
                        cases.append((f"{name}: {config}", jobs[name],
                                      gbmw.uniform_plan(jobs[name], f"{config},target={TARGET}")))
                    except GbmwError as error:
                        refused.append(f"{name}: {config}: {error}")
    return cases, refused


@contextlib.contextmanager
def accelerator_named_cuda(arguments):
    """DeepSpeed's accelerator, its device_name answering "cuda" (see the module docstring)."""
    accelerator_module = arguments.deepspeed.accelerator
    real = accelerator_module.get_accelerator

    class _Cuda:
        def __getattr__(self, name):
            return getattr(real(), name)

        def device_name(self, *args):
            return "cuda"

    accelerator_module.get_accelerator = _Cuda
    try:
        yield
    finally:
        accelerator_module.get_accelerator = real


def expected_values(job: gbmw.JobSpec, plan: gbmw.Plan) -> dict:
    """{args attribute: value} validate_args must leave for the plan."""
    from gbmw.adapters.megatron.layout import gpt_architecture, megatron_layout

    layout, arch = megatron_layout(plan, job, TARGET), gpt_architecture(job)
    experts = {} if arch.moe is None else dict(
        num_experts=[arch.moe.num_experts], topk=arch.moe.top_k, moe_expert_parallel_size=layout.expert_parallel,
        enable_expert_tensor_parallelism=layout.tensor_parallel > 1, moe_token_dropping=arch.moe.capacity_factor is not None)
    return experts | dict(ds_sequence_parallel_size=layout.ulysses, tensor_model_parallel_size=layout.tensor_parallel, pipeline_model_parallel_size=layout.pipeline_parallel,
                data_parallel_size=layout.data_parallel, zero_stage=layout.zero_stage, deepspeed=True,
                ds_pipeline_enabled=layout.pipeline_parallel > 1, sequence_parallel=layout.sequence_parallel,
                recompute_granularity=None if layout.recompute == "none" else layout.recompute,
                deepspeed_activation_checkpointing=layout.recompute == "full",
                micro_batch_size=layout.micro_batch_size, global_batch_size=layout.global_batch_size,
                num_layers=arch.num_layers, hidden_size=arch.hidden_size, num_attention_heads=arch.num_heads,
                num_key_value_heads=arch.num_kv_heads or arch.num_heads,
                ffn_hidden_size=arch.ffn_hidden_size or 4 * arch.hidden_size, seq_length=arch.seq_length)


def parse_as_rank_zero(arguments, argv: list[str], environment: dict[str, str], world_size: int):
    """Megatron-DeepSpeed's parse_args + validate_args on `argv` as rank 0 of `world_size` sees it under DeepSpeed's
    launcher (`--local_rank=0` first, the launch line's `environment` set): the parsed arguments, or why it refused."""
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(environment, WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0")
    sys.argv = ["pretrain_gpt.py", "--local_rank=0", *argv]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), accelerator_named_cuda(arguments):
            args = arguments.parse_args()
            arguments.validate_args(args, dict(PRETRAIN_GPT_DEFAULTS))
    except SystemExit:
        return "argparse: " + printed.getvalue().strip().splitlines()[-1]
    except (AssertionError, RuntimeError, ValueError, TypeError, AttributeError) as error:
        return f"validate_args: {type(error).__name__}: {error}"
    return args


def check(arguments, job: gbmw.JobSpec, plan: gbmw.Plan, extra: tuple[str, ...] = (),
          launch_environment: bool = True) -> str | None:
    """None if Megatron-DeepSpeed parses and validates the plan's arguments (+ `extra`) into the plan's layout;
    else why not. `launch_environment` False leaves out the variables the launch line sets (a control)."""
    words = launch_line(plan, job, "pretrain_gpt.py", TARGET).split()
    environment = dict(word.split("=", 1) for word in words[:words.index("deepspeed")])
    args = parse_as_rank_zero(arguments, [*plan_to_megatron_args(plan, job, TARGET), *extra],
                              environment if launch_environment else {}, plan.num_devices)
    if isinstance(args, str):
        return args
    wrong = [f"{key} {getattr(args, key, '(absent)')!r} (the plan's: {value!r})"
             for key, value in expected_values(job, plan).items() if getattr(args, key, None) != value]
    return "parsed into " + "; ".join(wrong) if wrong else None


def run_controls(arguments, cases) -> None:
    """Megatron-DeepSpeed must refuse what it refuses, else the harness checks nothing."""
    _, job, selective = next(case for case in cases if case[2].strategies[1].selective)
    _, sp_job, sequence_parallel = next(case for case in cases if case[2].strategies[1].sp)
    controls = [(job, selective, ("--recompute-method", "uniform"), True, "recompute method is not yet supported"),
                (job, selective, ("--no-such-flag",), True, "unrecognized arguments"),
                (sp_job, sequence_parallel, (), False, "CUDA_DEVICE_MAX_CONNECTIONS")]
    for control_job, plan, extra, environment, refusal in controls:
        problem = check(arguments, control_job, plan, extra, environment) or ""
        what = " ".join(extra) or "no CUDA_DEVICE_MAX_CONNECTIONS"
        if refusal not in problem:
            sys.exit(f"control: Megatron-DeepSpeed accepted {plan.strategies[1].name} + {what} ({problem!r}); the "
                     "check is not running Megatron-DeepSpeed's validation")
        print(f"control ok: {plan.strategies[1].name} + {what} is refused ({problem.splitlines()[0][:100]})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-deepspeed", default=os.environ.get("MEGATRON_DEEPSPEED"),
                        help="a microsoft/Megatron-DeepSpeed checkout (default: $MEGATRON_DEEPSPEED)")
    options = parser.parse_args()
    arguments = import_arguments(options.megatron_deepspeed)
    cases, refused = argument_sets()
    run_controls(arguments, cases)
    failures, started = 0, time.perf_counter()
    for label, job, plan in cases:
        problem = check(arguments, job, plan)
        failures += problem is not None
        print(f"{'ok  ' if problem is None else 'FAIL'} {label} [{plan.strategies[1].name}, pp={plan.pp}, world "
              f"{plan.num_devices}]" + (f"\n     {problem}" if problem else ""))
    for line in refused:
        print(f"not emitted (gbmw refuses): {line}")
    print(f"{len(cases) - failures} of {len(cases)} argument sets parse and validate with Megatron-DeepSpeed "
          f"({time.perf_counter() - started:.1f} s; {len(refused)} grid points gbmw refuses for {TARGET})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
