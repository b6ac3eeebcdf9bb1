"""Every Megatron argument set gbmw emits, parsed and validated by Megatron-LM's own `parse_args` and
`validate_args` (megatron/training/arguments.py) — the parser `pretrain_gpt.py` runs (issue 14).

    git clone --branch core_v<megatron-core version> https://github.com/NVIDIA/Megatron-LM /path/to/Megatron-LM
    .venv/bin/pip install six regex triton   # what megatron/training imports beyond gbmw[runtime]
    MEGATRON_LM=/path/to/Megatron-LM .venv/bin/python benchmarks/megatron_lm_arguments.py [--megatron-lm PATH]

The argument sets: gbmw's best megatron-core plan for every bundled GPT job, the published hand-tuned
configurations (recipes/handtuned/) that Megatron-LM or NeMo ran, two interleaved plans (one on the split that
counts the embedding and the loss as layers), and a grid of uniform
configurations over TP, PP, the distributed optimizer, sequence parallelism and every recomputation level. Each
runs as one rank would see it: WORLD_SIZE from the plan, RANK 0, and the environment variables gbmw's launch line
sets in front (CUDA_DEVICE_MAX_CONNECTIONS=1 for TP). validate_args asks the GPU for its architecture (for
CUDA_DEVICE_MAX_CONNECTIONS, and for --moe-grouped-gemm); on a machine without one the answer is the plan's cluster's
(Ampere 8, Hopper 9, Blackwell 10), given by replacing Megatron's `get_device_arch_version` and torch's
`get_device_capability`. After validation, the parsed TP, PP, DP,
virtual stages, sequence parallelism, recomputation and distributed optimizer must be the plan's.

The checkout is only read (its directory goes first on sys.path); nothing of it is copied into gbmw.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import os
import re
import sys
import time
from pathlib import Path

import gbmw
from gbmw.adapters.megatron import launch_line, plan_to_megatron_args
from gbmw.adapters.megatron.layout import megatron_layout
from gbmw.errors import GbmwError
from gbmw.handwritten.handtuned_config import load_handtuned
from gbmw.search.planner import Planner
from gbmw.specs.bundled import RECIPES_DIR

GPT_JOBS = ("gpt3-15b_a100-80g-x32", "gpt3-39b_a100-80g-x32", "gpt3-65b_a100-80g-x32", "gpt3-65b_h100-80g-x64",
            "llama-7b_a100-80g-x32", "llama-7b_a100-80g-x8")
GRID_JOBS = ("gpt3-39b_a100-80g-x32", "llama-7b_a100-80g-x32")
REACH_CONFIGS = {  # issue 26's experts and issue 27's context parallelism, beside gbmw's own plans for these jobs
    "mixtral-8x7b_h100-80g-x64": ("tp=1,pp=4,zero=1,ep=8,micro=1", "tp=2,pp=2,zero=1,ep=4,sp=on,micro=1",
                                  "tp=2,pp=1,zero=0,ep=2,sp=on,ckpt=full,micro=1",
                                  "tp=2,pp=4,zero=1,ep=8,etp=1,sp=on,micro=1",  # experts whole over 8 ranks
                                  "tp=4,pp=2,zero=1,ep=4,etp=2,sp=on,micro=1"),
    "llama3.1-8b-128k_h100-80g-x64": ("tp=2,pp=1,zero=1,cp=8,sp=on,micro=1", "tp=1,pp=2,zero=0,cp=16,ckpt=full,micro=1",
                                      "tp=8,pp=1,zero=1,cp=4,sp=on,micro=1"),
    "mixtral-8x7b-32k_h100-80g-x64": ("tp=2,pp=2,zero=1,cp=4,ep=8,sp=on,micro=1",  # EP over cp · dp (expert grid)
                                      "tp=1,pp=4,zero=1,cp=8,ep=4,ckpt=full,micro=1",
                                      "tp=2,pp=1,zero=0,cp=8,ep=2,sp=on,ckpt=full,micro=1",
                                      "tp=2,pp=4,zero=1,cp=4,ep=8,etp=1,sp=on,ckpt=full,micro=1"),  # +etp1 beside cp
}
FP8_JOBS = ("gpt3-65b_h100-80g-x64", "llama3.1-8b-128k_h100-80g-x64", "mixtral-8x7b_h100-80g-x64")
"""Jobs also checked with `precision: fp8` (issue 28: --bf16 --fp8-format hybrid --fp8-recipe delayed), and with
`gradient_reduce_dtype: bf16` in bf16 and fp8 (--grad-reduce-in-bf16), with `tp_comm_overlap: true`
(--tp-comm-overlap, which Megatron's validate_args accepts with sequence parallelism only), and with
`adam_moments_dtype: bf16` (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)."""
ARCHITECTURES = {"A100": 8, "H100": 9, "H200": 9, "B200": 10, "GB200": 10}
"""GPU name → CUDA major version, as Megatron's get_device_arch_version would read it on that GPU."""


def megatron_lm_checkout(path: str | None) -> Path:
    """The checkout, checked: it has megatron/training/arguments.py; its version against megatron-core's."""
    installed = importlib.metadata.version("megatron-core")
    if not path:
        sys.exit(f"give the Megatron-LM checkout with --megatron-lm PATH or MEGATRON_LM=PATH; for the installed "
                 f"megatron-core {installed}: git clone --branch core_v{installed} https://github.com/NVIDIA/Megatron-LM")
    root = Path(path).expanduser().resolve()
    if not (root / "megatron" / "training" / "arguments.py").is_file():
        sys.exit(f"--megatron-lm {root}: no megatron/training/arguments.py there; clone NVIDIA/Megatron-LM "
                 f"(tag core_v{installed})")
    info = (root / "megatron" / "core" / "package_info.py").read_text()
    parts = {key: re.search(rf"^{key} = (\S+)", info, re.M) for key in ("MAJOR", "MINOR", "PATCH")}
    checkout = ".".join(match.group(1).strip("'\"") if match else "?" for match in parts.values())
    print(f"installed megatron-core {installed}; Megatron-LM checkout {root} is megatron-core {checkout}"
          + ("" if checkout == installed else f" — MISMATCH: check out tag core_v{installed}"))
    return root


def import_from_checkout(root: Path, module: str, what: str):
    """`module` (a megatron.… module) from the checkout at `root`, which goes first on sys.path; `what` names the
    checkout in messages. A missing dependency or a module found elsewhere ends the benchmark with one line."""
    import importlib

    sys.path.insert(0, str(root))
    for name in [name for name in sys.modules if name == "megatron" or name.startswith("megatron.")]:
        del sys.modules[name]  # a megatron-core imported earlier would shadow the checkout's package
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            imported = importlib.import_module(module)
    except ModuleNotFoundError as error:
        sys.exit(f"{what}'s {module} imports {error.name!r}, not installed here: "
                 f".venv/bin/pip install {error.name} torch==2.13.0")
    if not Path(imported.__file__).resolve().is_relative_to(root):
        sys.exit(f"{module} came from {imported.__file__}, not from {root}")
    return imported


def import_arguments(root: Path):
    """Megatron-LM's megatron.training.arguments, from the checkout."""
    return import_from_checkout(root, "megatron.training.arguments", "Megatron-LM")


def argument_sets() -> list[tuple[str, gbmw.JobSpec, gbmw.Plan]]:
    """(label, job, plan) of every megatron-core plan checked."""
    cases = []
    jobs = {name: gbmw.load_job(name) for name in GPT_JOBS + tuple(REACH_CONFIGS)}
    for name, job in jobs.items():
        try:
            cases.append((f"{name}: gbmw plan", job, Planner(job, target="megatron-core").run()))
        except GbmwError as error:
            print(f"skipped {name}: gbmw plan --target megatron-core: {error}")
    for path in sorted((RECIPES_DIR / "handtuned").glob("*.yaml")):
        config = load_handtuned(path)
        job = next((job for job in jobs.values() if job.model.name == config.applies_to), None)
        if config.target == "megatron-core" and job is not None:
            cases.append((f"{job.name}: hand-tuned {config.name}", job, config.uniform.to_plan(job)))
    job = jobs["gpt3-15b_a100-80g-x32"]
    plan = gbmw.uniform_plan(job, "tp=8,pp=2,zero=1,ckpt=selective,sp=on,micro=1,target=megatron-core")
    cases.append((f"{job.name}: interleaved v=3", job, dataclasses.replace(plan, virtual_stages=3)))
    cases.append((f"{job.name}: interleaved v=5, the embedding and the loss counted as layers", job, gbmw.uniform_plan(
        job, "tp=8,pp=2,zero=1,ckpt=selective,sp=on,v=5,split=accounted,micro=1,target=megatron-core")))
    for name, configs in REACH_CONFIGS.items():
        cases += [(f"{name}: {config}", jobs[name], gbmw.uniform_plan(jobs[name], f"{config},target=megatron-core"))
                  for config in configs]
    for name in FP8_JOBS:
        for job in (variant_job(name, "fp8"), variant_job(name, "bf16", "bf16"), variant_job(name, "fp8", "bf16"),
                    variant_job(name, "bf16", tp_comm_overlap=True), variant_job(name, "fp8", "bf16", True),
                    variant_job(name, "bf16", adam_moments_dtype="bf16"), variant_job(name, "fp8", "bf16", True, "bf16")):
            cases.append((f"{job.name}: tp=4,pp=2,zero=1,sp=on", job,
                          gbmw.uniform_plan(job, "tp=4,pp=2,zero=1,sp=on,micro=1" + (",ep=2" if "mixtral" in name else "")
                                            + ",target=megatron-core")))
    for name in GRID_JOBS:
        for tp, pp, zero in ((1, 1, 0), (2, 2, 1), (8, 1, 1), (4, 4, 0)):
            for ckpt in ("none", "full", "selective"):
                for sp in ("off", "on") if tp > 1 else ("off",):
                    config = f"tp={tp},pp={pp},zero={zero},ckpt={ckpt},sp={sp},micro=1,target=megatron-core"
                    cases.append((f"{name}: {config.removesuffix(',target=megatron-core')}", jobs[name],
                                  gbmw.uniform_plan(jobs[name], config)))
    return cases


def variant_job(name: str, precision: str, gradient_reduce_dtype: str = "fp32", tp_comm_overlap: bool = False,
                adam_moments_dtype: str = "fp32") -> gbmw.JobSpec:
    """The bundled job `name` (a bf16 job) in `precision`, its gradients reduced in `gradient_reduce_dtype`, with
    Transformer Engine's TP communication overlap where `tp_comm_overlap` (--tp-comm-overlap), Adam's moments kept in
    `adam_moments_dtype`."""
    import tempfile

    text = (RECIPES_DIR / "jobs" / f"{name}.yaml").read_text().replace(
        "precision: bf16", f"precision: {precision}\ngradient_reduce_dtype: {gradient_reduce_dtype}\n"
                           f"tp_comm_overlap: {str(tp_comm_overlap).lower()}\nadam_moments_dtype: {adam_moments_dtype}")
    suffix = (precision + ("-bf16grads" if gradient_reduce_dtype == "bf16" else "")
              + ("-tpoverlap" if tp_comm_overlap else "") + ("-bf16moments" if adam_moments_dtype == "bf16" else ""))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name.replace('_', f'-{suffix}_', 1)}.yaml"
        path.write_text(text)
        return gbmw.load_job(path)


def check(arguments, job: gbmw.JobSpec, plan: gbmw.Plan, extra: tuple[str, ...] = ()) -> str | None:
    """None if Megatron-LM parses and validates the plan's arguments (+ `extra`) into the plan's layout; else why
    not."""
    words = launch_line(plan, job, "pretrain_gpt.py", "megatron-core").split()
    env = dict(word.split("=", 1) for word in words[:words.index("torchrun")])
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env, WORLD_SIZE=str(plan.num_devices), RANK="0", LOCAL_RANK="0")
    gpu = next((arch for name, arch in ARCHITECTURES.items() if name in job.cluster.device.name), 8)
    arguments.get_device_arch_version = lambda: gpu
    arguments.torch.cuda.get_device_capability = lambda *device: (gpu, 0)  # --moe-grouped-gemm asks it too
    sys.argv = ["pretrain_gpt.py", *plan_to_megatron_args(plan, job, "megatron-core"), *extra]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            args = arguments.parse_args()
            arguments.validate_args(args)
    except SystemExit:
        return "argparse: " + printed.getvalue().strip().splitlines()[-1]
    except (AssertionError, RuntimeError, ValueError, TypeError) as error:
        return f"validate_args: {type(error).__name__}: {error}"
    strategy, accounted = plan.strategies[1], megatron_layout(plan, job, "megatron-core").accounted
    expected = dict(tensor_model_parallel_size=strategy.tp, pipeline_model_parallel_size=plan.pp,
                    data_parallel_size=strategy.data_parallel, sequence_parallel=strategy.sp,
                    recompute_granularity=None if strategy.recompute == "none" else strategy.recompute,
                    use_distributed_optimizer=strategy.degree("z1dp") > 1 or plan.adam_moments_dtype == "bf16",
                    use_precision_aware_optimizer=plan.adam_moments_dtype == "bf16",
                    exp_avg_dtype=getattr(arguments.torch, {"bf16": "bfloat16"}.get(plan.adam_moments_dtype, "float32")),
                    exp_avg_sq_dtype=getattr(arguments.torch, {"bf16": "bfloat16"}.get(plan.adam_moments_dtype,
                                                                                       "float32")),
                    virtual_pipeline_model_parallel_size=plan.virtual_stages if plan.virtual_stages > 1 else None,
                    account_for_embedding_in_pipeline_split=accounted, account_for_loss_in_pipeline_split=accounted,
                    context_parallel_size=strategy.degree("cp"), bf16=plan.precision in ("bf16", "fp8"),
                    fp8="hybrid" if plan.precision == "fp8" else None,
                    accumulate_allreduce_grads_in_fp32=(plan.precision in ("bf16", "fp8")
                                                        and plan.gradient_reduce_dtype == "fp32"),
                    tp_comm_overlap=plan.tp_comm_overlap and strategy.sp)
    if job.model.is_mixture_of_experts:
        expert = next(layer for layer in job.model.layers if layer.num_experts)
        expected.update(num_experts=expert.num_experts, moe_router_topk=expert.experts_per_token,
                        expert_model_parallel_size=max(s.ep for s in plan.strategies),
                        expert_tensor_parallel_size=next(
                            (s.expert_tensor_parallel for s in plan.strategies if s.ep > 1), strategy.tp))
    wrong = [f"{key} {getattr(args, key)!r} (the plan's: {value!r})" for key, value in expected.items()
             if getattr(args, key) != value]
    return "parsed into " + "; ".join(wrong) if wrong else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", default=os.environ.get("MEGATRON_LM"),
                        help="a Megatron-LM checkout (default: $MEGATRON_LM)")
    options = parser.parse_args()
    arguments = import_arguments(megatron_lm_checkout(options.megatron_lm))
    cases = argument_sets()
    # controls: Megatron-LM must refuse what it refuses (else the harness checks nothing)
    _, job, plan = next(case for case in cases if case[2].strategies[1].selective and case[2].strategies[1].tp > 1)
    for extra, refusal in ((("--recompute-method", "uniform"), "recompute method is not yet supported"),
                           (("--no-such-flag",), "unrecognized arguments")):
        problem = check(arguments, job, plan, extra) or ""
        if refusal not in problem:
            sys.exit(f"control: Megatron-LM accepted {plan.strategies[1].name} + {' '.join(extra)} ({problem!r}); "
                     "the check is not running Megatron-LM's validation")
        print(f"control ok: + {' '.join(extra)} is refused ({problem.splitlines()[0][:90]})")
    failures, started = 0, time.perf_counter()
    for label, job, plan in cases:
        problem = check(arguments, job, plan)
        failures += problem is not None
        layout = plan.strategies[1].name + (f", v={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
        print(f"{'ok  ' if problem is None else 'FAIL'} {label} [{layout}, pp={plan.pp}, world {plan.num_devices}]"
              + (f"\n     {problem}" if problem else ""))
    print(f"{len(cases) - failures} of {len(cases)} argument sets parse and validate with Megatron-LM "
          f"({time.perf_counter() - started:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
