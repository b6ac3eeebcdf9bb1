"""`gbmw tune`: a drop-in replacement for the parallel settings of an existing DeepSpeed or
Megatron-DeepSpeed job.

It reads the user's ds_config (never changing it), costs their current configuration, plans the
best configuration the chosen target can run at the same global batch, and writes NEW files into
an output folder: the merged ds_config (every key gbmw does not own kept as the user wrote it), the
plan, the Megatron arguments and a launch line — then says what changed, why, and the estimated
speed-up, both costed by the same estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gbmw.baselines import UniformConfig
from gbmw.bundled import resolve_recipe
from gbmw.cluster_spec import load_cluster
from gbmw.estimate import estimate_plan
from gbmw.errors import GbmwError
from gbmw.files import shown, write_new_file
from gbmw.jobs import JobSpec
from gbmw.models import load_model
from gbmw.plan import Plan, replace_estimate
from gbmw.planner import Planner
from gbmw.schema import parse_bytes
from gbmw.targets import STOCK_TARGETS

from . import deepspeed as ds
from . import megatron


@dataclass
class TuneResult:
    job: JobSpec
    current: Plan | None
    """The user's configuration as gbmw costs it (None if it cannot be costed, see current_problem)."""
    current_problem: str
    plan: Plan
    ds_config: dict | None
    changes: list[str]
    megatron_args: list[str] = field(default_factory=list)
    launch: str = ""
    written: list[Path] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.current is None or not self.current.estimate.fits:
            return None
        return self.plan.estimate.samples_per_s / self.current.estimate.samples_per_s


def precision_of(config: dict) -> str:
    """bf16 / fp16 / fp32 from a ds_config's precision sections."""
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled") in (True, "auto"):
            return name
    return "fp32"


def tune(ds_config_path: str, model: str, cluster: str, target: str = "deepspeed", output: str | None = None,
         memory: str | None = None, current_tp: int = 1, current_pp: int = 1, current_ckpt: str | None = None,
         script: str = "pretrain_gpt.py") -> TuneResult:
    if target == "runtime":
        raise GbmwError("--target runtime: tune rewrites an existing DeepSpeed job's config, which cannot express "
                        "gbmw's per-layer plans; tune for deepspeed, megatron-deepspeed or megatron-core, or plan and "
                        "run with gbmw's runtime: `gbmw plan JOB -o plan.yaml` then `gbmw train JOB --plan plan.yaml`")
    if target not in STOCK_TARGETS:
        raise GbmwError(f"--target {shown(target)} is unknown; targets: {', '.join(STOCK_TARGETS)}")
    if output is not None and Path(output).exists() and any(Path(output).iterdir()):
        raise GbmwError(f"-o {output}: the folder exists and is not empty; gbmw writes only new files — choose a new folder")
    user = ds.load_user_config(ds_config_path)
    cluster_spec = load_cluster(resolve_recipe(cluster, "clusters"))
    world = cluster_spec.num_devices
    if current_tp < 1 or current_pp < 1 or world % (current_tp * current_pp):
        raise GbmwError(f"--current-tp {current_tp} × --current-pp {current_pp} must divide the cluster's {world} devices")
    ds.check_batch_consistency(user, world, current_tp * current_pp, where=ds_config_path)
    data_parallel = world // (current_tp * current_pp)
    global_batch, micro_per_gpu, accumulation = ds.resolve_batch(user, data_parallel)
    precision = precision_of(user)
    model_spec = load_model(resolve_recipe(model, "models"), precision)
    budget = parse_bytes(memory, "--memory") if memory else cluster_spec.usable_memory_bytes
    job = JobSpec(name=f"{model_spec.name}_{cluster_spec.name}", model=model_spec, cluster=cluster_spec,
                  precision=precision, optimizer=_optimizer_of(user), global_batch=global_batch,
                  memory_budget_bytes=budget)

    if not _has_auto_values(user):  # HF Trainer fills "auto" values before DeepSpeed reads the config
        try:  # DeepSpeed's own schema on the user's config as it runs today: refused before a search, not after
            ds.validate_with_deepspeed(user, world, current_tp, current_pp)
        except GbmwError as error:
            raise GbmwError(f"{ds_config_path}: {error}") from None

    current, problem = None, ""
    zero = int((user.get("zero_optimization") or {}).get("stage", 0) or 0)
    ckpt = current_ckpt or ("full" if user.get("activation_checkpointing") else "none")
    try:
        uniform = UniformConfig(tp=current_tp, pp=current_pp, zero=zero, ckpt=ckpt, micro=micro_per_gpu, target=target,
                                batch=global_batch)
        current = uniform.to_plan(job)
        current = replace_estimate(current, estimate_plan(job, current))
    except GbmwError as error:
        problem = str(error)

    plan = Planner(job, batch=global_batch, target=target).run()
    result = TuneResult(job, current, problem, plan, None, [])
    if target in ds.DEEPSPEED_TARGETS:
        generated = ds.plan_to_ds_config(plan, job, target)
        merged, changes = ds.merge_into_user_config(user, generated)
        tp, pp, _ = ds.plan_layout(plan, job.model)
        ds.validate_with_deepspeed(merged, world, tp, pp)
        result.ds_config, result.changes = merged, changes
    if target in ("megatron-deepspeed", "megatron-core"):
        result.megatron_args = megatron.plan_to_megatron_args(plan, job, target)
        result.launch = megatron.launch_line(plan, job, script, target)
    elif target == "deepspeed":
        result.launch = _deepspeed_launch(job, script)
    if output is not None:
        folder = Path(output)
        files = {"plan.yaml": plan.to_yaml()}
        if result.ds_config is not None:
            files["ds_config.json"] = ds.dumps_config(result.ds_config)
        if result.megatron_args:
            files["megatron_args.txt"] = "\n".join(result.megatron_args) + "\n"
        if result.launch:
            files["launch.sh"] = "#!/usr/bin/env bash\n" + result.launch + "\n"
        for name, text in files.items():
            result.written.append(write_new_file(folder / name, text))
    return result


def _has_auto_values(config) -> bool:
    if isinstance(config, dict):
        return any(_has_auto_values(value) for value in config.values())
    if isinstance(config, list):
        return any(_has_auto_values(value) for value in config)
    return config == "auto"


def _optimizer_of(config: dict) -> str:
    kind = str((config.get("optimizer") or {}).get("type", "adam")).lower()
    return "sgd" if kind == "sgd" else "adam"


def _deepspeed_launch(job: JobSpec, script: str) -> str:
    cluster = job.cluster
    if cluster.nodes == 1:
        return f"deepspeed --num_gpus {cluster.devices_per_node} {script} --deepspeed --deepspeed_config ds_config.json"
    return (f"deepspeed --hostfile hostfile --num_nodes {cluster.nodes} --num_gpus {cluster.devices_per_node} "
            f"{script} --deepspeed --deepspeed_config ds_config.json")
