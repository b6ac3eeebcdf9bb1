"""`gbmw tune`: a drop-in replacement for the parallel settings of an existing DeepSpeed or
Megatron-DeepSpeed job.

It reads the user's ds_config (never changing it), costs their current configuration, plans the
best configuration the chosen target can run at the same global batch, and writes NEW files into
an output folder: the merged ds_config (every key gbmw does not own kept as the user wrote it), the
plan, the Megatron arguments and a launch line — then says what changed, why, and the estimated
speed-up, both costed by the same estimator.
"""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from gbmw.cost.estimate import estimate_plan
from gbmw.errors import GbmwError
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import Plan, replace_estimate
from gbmw.search.planner import Planner
from gbmw.space.targets import STOCK_TARGETS
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.cluster_spec import load_cluster
from gbmw.specs.files import shown, write_new_file
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import load_model
from gbmw.specs.schema import parse_bytes

from . import deepspeed as ds
from . import megatron
from .deepspeed import hf_auto


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
    notes: list[str] = field(default_factory=list)
    """What tune assumed or re-planned that the user should hear (printed before the result)."""
    trainer_arguments: list[str] = field(default_factory=list)
    """For an HF-Trainer config: the TrainingArguments that must match the plan's batch numbers."""

    @property
    def speedup(self) -> float | None:
        if self.current is None or not self.current.estimate.fits:
            return None
        return self.plan.estimate.samples_per_s / self.current.estimate.samples_per_s


DEFAULT_SCRIPT = "pretrain_gpt.py"
"""The training script of the launch line when none is given: Megatron(-DeepSpeed)'s."""
HF_TRAINER_SCRIPT = "train.py"
"""… and for an HF Trainer config, a stand-in name for the user's own script."""


def tune(ds_config_path: str, model: str, cluster: str, target: str = "deepspeed", output: str | None = None,
         memory: str | None = None, current_tp: int = 1, current_pp: int = 1, current_ckpt: str | None = None,
         script: str = DEFAULT_SCRIPT, *, batch: int | None = None, seq_length: int | None = None,
         flash_attention: bool | None = None, precision: str | None = None, current: str | None = None) -> TuneResult:
    """Tune the job of `ds_config_path` for `target` (see the module docstring).

    The job's current layout is `current`, in `gbmw estimate --uniform`'s keys (tp, pp, sp, cp, ulysses, ep, zero,
    ckpt), or `current_tp`/`current_pp`/`current_ckpt`; what it leaves out comes from the ds_config (zero: its
    ZeRO stage; ulysses: its `sequence_parallel_size`, DeepSpeed's Ulysses degree for HF models; ckpt: whether
    it has an activation_checkpointing section) or is 1 / off.
    """
    if target == "runtime":
        raise GbmwError("--target runtime: tune rewrites an existing DeepSpeed job's config, which cannot express "
                        "gbmw's per-layer plans; tune for deepspeed, megatron-deepspeed or megatron-core, or plan and "
                        "run with gbmw's runtime: `gbmw plan JOB -o plan.yaml` then `gbmw train JOB --plan plan.yaml`")
    if target not in STOCK_TARGETS:
        raise GbmwError(f"--target {shown(target)} is unknown; targets: {', '.join(STOCK_TARGETS)}")
    if output is not None and Path(output).exists() and any(Path(output).iterdir()):
        raise GbmwError(f"-o {output}: the folder exists and is not empty; gbmw writes only new files — choose a new folder")
    # The engine check's process starts now, so that its imports (~10 s) overlap reading the files and planning.
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(ds.EngineChecker()) if target in ds.DEEPSPEED_TARGETS else None
        notes: list[str] = []
        user = ds.load_user_config(ds_config_path)
        cluster_spec = load_cluster(resolve_recipe(cluster, "clusters"))
        world = cluster_spec.num_devices
        layout = _current_layout(user, ds_config_path, current, current_tp, current_pp, current_ckpt)
        width = layout.tp * layout.cp * layout.ulysses  # the ranks of a stage that share samples
        if world % (width * layout.pp):
            raise GbmwError(f"{_describe(layout, current, user)}: tp × pp × cp × ulysses = {width * layout.pp} must divide the "
                            f"cluster's {world} devices")
        precision = hf_auto.precision_of(user, precision, notes, ds_config_path)
        global_batch, micro_per_gpu = _batch_of(user, world, width, layout.pp, batch, ds_config_path, notes)
        # The model file is read as a file (an HF config's `_name_or_path` names it, it does not locate it).
        model_spec = load_model(resolve_recipe(model, "models"), precision, seq_length, flash_attention, notes)
        budget = parse_bytes(memory, "--memory") if memory else cluster_spec.usable_memory_bytes
        job = JobSpec(name=f"{model_spec.name}_{cluster_spec.name}", model=model_spec, cluster=cluster_spec,
                      precision=precision, optimizer=_optimizer_of(user), global_batch=global_batch,
                      memory_budget_bytes=budget, notes=tuple(notes))

        current_plan, problem = None, ""
        try:
            if micro_per_gpu is None:
                raise GbmwError("the config does not fix train_micro_batch_size_per_gpu (\"auto\" for HF Trainer's "
                                "per_device_train_batch_size, or absent)")
            uniform = replace(layout, micro=micro_per_gpu, target=target, batch=global_batch)
            current_plan = uniform.to_plan(job)
            current_plan = replace_estimate(current_plan, estimate_plan(job, current_plan))
        except GbmwError as error:
            problem = str(error)

        hf_trainer = target == "deepspeed" and bool(hf_auto.auto_paths(user))  # an HF Trainer / Accelerate job
        if hf_trainer:
            notes.append(f"{ds_config_path}: an HF Trainer config (\"auto\" values): planned without a pipeline, which "
                         "HF Trainer cannot run (DeepSpeed's pipeline engine needs its own training loop)")
            if script == DEFAULT_SCRIPT:
                script = HF_TRAINER_SCRIPT
                notes.append(f"the launch line runs {HF_TRAINER_SCRIPT}: give your HF Trainer script with --script")
        plan = Planner(job, batch=global_batch, target=target, max_pp=1 if hf_trainer else None).run()
        result = TuneResult(job, current_plan, problem, plan, None, [], notes=notes)
        config_path = "ds_config.json"
        if target in ds.DEEPSPEED_TARGETS:
            generated = ds.plan_to_ds_config(plan, job, target)
            if SEQUENCE_PARALLEL_KEY in user:  # DeepSpeed divides the devices by it for the data-parallel size
                generated[SEQUENCE_PARALLEL_KEY] = plan.strategies[0].degree("ulysses")
            if isinstance(user.get("tensor_parallel"), dict) and AUTOTP_KEY in user["tensor_parallel"]:
                # … and by AutoTP's degree: 1, as neither target's plans split layers with AutoTP (plain DeepSpeed's
                # have no TP, Megatron-DeepSpeed's split them with Megatron's own layers)
                generated["tensor_parallel"] = {AUTOTP_KEY: 1}
            merged, changes = ds.merge_into_user_config(user, generated)
            changes += hf_auto.fill_precision_switches(merged, precision)
            tp, pp, _ = ds.plan_layout(plan, job.model)
            try:  # the keys DeepSpeed refuses here are the user's (gbmw's own are checked): named in their file
                with ds.deepspeed_warnings_as_notes(notes):
                    ds.validate_with_deepspeed(merged, world, tp, pp)
            except GbmwError as error:
                raise GbmwError(f"{ds_config_path}: {error}") from None
            # DeepSpeed's engine on a stand-in model, before anything is written: it refuses what its config schema passes
            notes += engine.check(merged, ds_config_path, pipeline=pp > 1)
            result.ds_config, result.changes = merged, changes
            if hf_trainer:  # an HF Trainer script; Megatron's take flags
                result.trainer_arguments = hf_auto.trainer_arguments(merged, precision)
        if target in ("megatron-deepspeed", "megatron-core"):
            # Megatron builds its own optimizer and schedule (Megatron-DeepSpeed's win over the ds_config's): the
            # user's are restated as flags, and what no flag says is a note
            training = megatron.plan_training_arguments(result.ds_config or user, plan, job, target, ds_config_path)
            notes.extend(training.notes)
            result.megatron_args = megatron.plan_to_megatron_args(plan, job, target) + list(training.arguments)
            result.launch = megatron.launch_line(plan, job, script, target, extra_args=training.arguments)
            script_line = megatron.launch_line(plan, job, script, target, deepspeed_config=f"$HERE/{config_path}",
                                               extra_args=training.arguments)
        else:
            trainer = result.trainer_arguments
            result.launch = _deepspeed_launch(job, script, config_path, trainer)
            script_line = _deepspeed_launch(job, script, f"$HERE/{config_path}", trainer)
        if output is not None:
            folder = Path(output)
            files = {"plan.yaml": plan.to_yaml()}
            if result.ds_config is not None:
                files[config_path] = ds.dumps_config(result.ds_config)
            if result.megatron_args:
                files["megatron_args.txt"] = "\n".join(result.megatron_args) + "\n"
            # The files gbmw wrote are found next to the script, wherever it is run from; the training script and a
            # hostfile are the user's, relative to the folder it is run in.
            files["launch.sh"] = ("#!/usr/bin/env bash\n# Written by gbmw tune: run it from your training folder.\n"
                                  'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n' + script_line + "\n")
            for name, text in files.items():
                result.written.append(write_new_file(folder / name, text))
        return result


SEQUENCE_PARALLEL_KEY = "sequence_parallel_size"
"""DeepSpeed's Ulysses degree in a ds_config (ALST, deepspeed.runtime.sequence_parallel.ulysses_sp: without a
Megatron mpu, DeepSpeedConfig takes world size / sequence_parallel_size as the data-parallel size)."""
AUTOTP_KEY = "autotp_size"
"""DeepSpeed AutoTP's tensor-parallel degree (`tensor_parallel.autotp_size`, for HF models): the engine's data-parallel
size is the world size / it (deepspeed.utils.groups._init_tp_mesh_device), so it is the job's current TP and the
written config carries the plan's."""
_LAYOUT_KEYS = ("tp", "pp", "sp", "cp", "ulysses", "ep", "zero", "ckpt")


def _current_layout(user: dict, where: str, current: str | None, tp: int, pp: int, ckpt: str | None) -> UniformConfig:
    """The job's current layout: `--current` (or --current-tp/-pp/-ckpt) over what the ds_config says."""
    given: set[str] = set()
    if current is not None:
        if (tp, pp, ckpt) != (1, 1, None):
            raise GbmwError("--current: give the current layout there or with --current-tp/--current-pp/--current-ckpt, "
                            "not both")
        given = {item.partition("=")[0].strip() for item in current.split(",") if item.strip()}
        foreign = sorted(given - set(_LAYOUT_KEYS))
        if foreign:
            raise GbmwError(f"--current {shown(current)}: key {foreign[0]} is not a layout key; the batch and micro-batch "
                            f"come from the ds_config and the target from --target (keys: {', '.join(_LAYOUT_KEYS)})")
        layout = UniformConfig.parse(current)
    else:
        layout = UniformConfig(tp=tp, pp=pp)
    defaults: dict[str, object] = {}
    if "zero" not in given:
        defaults["zero"] = int((user.get("zero_optimization") or {}).get("stage", 0) or 0)
    if "ckpt" not in given:
        defaults["ckpt"] = ckpt or ("full" if user.get("activation_checkpointing") else "none")
    section = user.get("tensor_parallel")
    autotp = section.get(AUTOTP_KEY, 1) if isinstance(section, dict) else 1
    if "tp" not in given and tp == 1 and autotp != 1:
        if isinstance(autotp, bool) or not isinstance(autotp, int) or autotp < 1:
            raise GbmwError(f"{where}: key `tensor_parallel.{AUTOTP_KEY}`: value {shown(autotp)} is not a positive whole "
                            "number (DeepSpeed AutoTP's tensor-parallel degree; 1 without)")
        defaults["tp"] = autotp
    degree = user.get(SEQUENCE_PARALLEL_KEY, 1)
    if "ulysses" not in given and degree != 1:
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise GbmwError(f"{where}: key `{SEQUENCE_PARALLEL_KEY}`: value {shown(degree)} is not a positive whole "
                            "number (DeepSpeed's Ulysses degree; 1 without)")
        defaults["ulysses"] = degree
    return replace(layout, **defaults)


def _describe(layout: UniformConfig, current: str | None, user: dict) -> str:
    given = f"--current {shown(current)}" if current is not None else f"--current-tp {layout.tp} × --current-pp {layout.pp}"
    if layout.ulysses > 1 and user.get(SEQUENCE_PARALLEL_KEY) == layout.ulysses and "ulysses" not in (current or ""):
        given += f" with the ds_config's {SEQUENCE_PARALLEL_KEY} {layout.ulysses}"
    return given


def _batch_of(user: dict, world: int, tp: int, pp: int, batch: int | None, where: str,
              notes: list[str]) -> tuple[int, int | None]:
    """(global batch, the config's micro-batch per GPU or None when "auto") to plan at.

    `--batch` wins; an HF-Trainer config whose batch is "auto" needs it. A config whose batch keys do not add up
    on this cluster was written for another cluster size: re-planned at its `train_batch_size`, with a note."""
    micro = user.get("train_micro_batch_size_per_gpu")
    micro = None if micro == "auto" else micro
    if user.get("train_batch_size") is None and user.get("train_micro_batch_size_per_gpu") is None:
        if batch is None:  # DeepSpeed needs one of them; the job's script sets it some other way, or not at all
            raise GbmwError(f"{where}: sets no batch (neither train_batch_size nor train_micro_batch_size_per_gpu), so "
                            "it does not say the global batch; give it with --batch")
        notes.append(f"{where}: sets no batch; planned at --batch {batch}, and the written config gets all three "
                     "batch keys from the plan")
        return batch, None
    if hf_auto.has_auto_batch(user):
        if batch is None:
            auto = [key for key in ds.BATCH_KEYS if user.get(key) == "auto"]
            raise GbmwError(f"{where}: key `{auto[0]}`: value \"auto\" — HF Trainer fills it from TrainingArguments, "
                            "so the config does not say the global batch; give it with --batch")
        return batch, micro
    problems = ds.batch_consistency_problems(user, world, tp * pp)
    written_for = None if not problems else _data_parallel_written_for(user)
    if not problems or written_for is not None:
        try:  # DeepSpeed's own schema on the user's config as it runs today (on the devices it was written for):
            # refused before a search, not after
            with ds.deepspeed_warnings_as_notes(notes):
                ds.validate_with_deepspeed(user, (written_for or world // (tp * pp)) * tp * pp, tp, pp)
        except GbmwError as error:
            raise GbmwError(f"{where}: {error}") from None
    if not problems:
        global_batch, micro, _ = ds.resolve_batch(user, world // (tp * pp))
    elif written_for is not None:
        global_batch = user["train_batch_size"]
        notes.append(f"{where}: its batch keys add up for a data-parallel size of {written_for} ({written_for * tp * pp} "
                     f"devices with TP {tp} × PP {pp}), not on this cluster's {world}: written for another cluster "
                     f"size; re-planned at its global batch {global_batch} on {world} devices")
    else:
        ds.check_batch_consistency(user, world, tp * pp, where=where)
    if batch is not None and batch != global_batch:
        notes.append(f"{where}: planned at --batch {batch}, not the config's global batch {global_batch}")
        return batch, micro
    return global_batch, micro


def _data_parallel_written_for(user: dict) -> int | None:
    """A data-parallel size a config's batch keys add up for (train = micro × accumulation × DP), or None when they
    add up for none (a config inconsistent on every cluster) or do not fix the global batch. A key left out is
    derived as DeepSpeed derives it (DeepSpeedConfig._set_batch_related_parameters), so it adds up wherever the given
    ones divide the batch: DP = train / (micro × accumulation), a missing micro-batch or accumulation counted as 1."""
    train, micro, accumulation = (user.get(key, 1) if key != ds.BATCH_KEYS[0] else user.get(key)
                                  for key in ds.BATCH_KEYS)
    if micro is None:
        micro = 1
    if accumulation is None:
        accumulation = 1
    if not all(isinstance(value, int) and not isinstance(value, bool) and value > 0
               for value in (train, micro, accumulation)):
        return None
    data_parallel, remainder = divmod(train, micro * accumulation)
    return data_parallel if remainder == 0 and data_parallel > 0 else None


def _optimizer_of(config: dict) -> str:
    kind = str((config.get("optimizer") or {}).get("type", "adam")).lower()
    return "sgd" if kind == "sgd" else "adam"


def _deepspeed_launch(job: JobSpec, script: str, config_path: str, trainer_arguments: list[str]) -> str:
    """DeepSpeed's launcher on the job's cluster; an HF Trainer script takes the config as `--deepspeed FILE` and the
    TrainingArguments that must match it, a DeepSpeed script `--deepspeed --deepspeed_config FILE`."""
    cluster = job.cluster
    config = f'"{config_path}"' if "$" in config_path else shlex.quote(config_path)
    nodes = "" if cluster.nodes == 1 else f"--hostfile hostfile --num_nodes {cluster.nodes} "
    arguments = (f"--deepspeed {config} " + " ".join(trainer_arguments) if trainer_arguments
                 else f"--deepspeed --deepspeed_config {config}")
    return f"deepspeed {nodes}--num_gpus {cluster.devices_per_node} {shlex.quote(script)} {arguments}"
