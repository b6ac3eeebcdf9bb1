"""`gbmw train JOB --plan plan.yaml`: run a plan with the hybrid runtime, as one process or under a launcher.

    gbmw train gpt-tiny_cpu-x2 --plan plan.yaml --steps 20                       # a one-device plan
    torchrun --standalone --nproc_per_node 2 -m gbmw train JOB --plan plan.yaml
    deepspeed --num_gpus 2 --module gbmw train JOB --plan plan.yaml               # passes --local_rank=N

Every rank reads the same job, plan and (optionally) checkpoint, builds its stage (engine), and trains on
the same global batch per step (each rank takes its slices): the next `global_batch` samples of `--data`
(token_data: Megatron's indexed dataset or a .npy token array, from the checkpoint's consumed-samples count on),
or a reproducible synthetic batch. Rank 0 prints one
line per step: loss, seconds and samples per second. A rank that loses its peers (one died) stops with one
message instead of waiting forever.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from gbmw.errors import GbmwError, PlanError, TrainingError


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 10
    learning_rate: float = 1e-4
    max_grad_norm: float | None = 1.0
    seed: int = 0
    save: str | None = None
    save_every: int | None = None
    """Also save every this many steps, into the --save folder (adapters/runtime/checkpoint_series.py)."""
    load: str | None = None
    timeout_s: float = 300.0
    local_rank: int | None = None
    data: str | None = None
    """A tokenised dataset (token_data); None: synthetic tokens."""


def launch_hint(num_devices: int, job: str, plan: str) -> str:
    return (f"gbmw train {job} --plan {plan} --nproc-per-node {num_devices}  (one machine), or  "
            f"torchrun --standalone --nproc_per_node {num_devices} -m gbmw train {job} --plan {plan}  or  "
            f"deepspeed --num_gpus {num_devices} --module gbmw train {job} --plan {plan}")


def train(job_reference: str, plan_path: str, settings: TrainSettings) -> list[float]:
    """Train for `settings.steps` steps; returns the losses (on every rank).

    Every rank reads and checks the job, the plan and the --save/--load folders, then the ranks start
    torch.distributed and agree: a problem any rank found stops every rank with the same error (rank 0 prints it,
    all exit with status 2), instead of the others reporting a dead process. The process group is torn down together
    after a run, and at once after a failure (gbmw.adapters.runtime.launch.finish_distributed)."""
    from .launch import agree, finish_distributed, start_after_checking

    (plan, architecture, data), context = start_after_checking(lambda: _read_inputs(job_reference, plan_path, settings),
                                                         settings.timeout_s, settings.local_rank)
    import torch.distributed as dist

    completed = False
    try:
        if context.world_size != plan.num_devices:
            agree(f"{plan_path} is a plan for num_devices={plan.num_devices} but {context.world_size} process(es) "
                  f"were launched; start it with: {launch_hint(plan.num_devices, job_reference, plan_path)}", PlanError)
        losses = _run(plan, architecture, data, settings, context)
        completed = True
        return losses
    except GbmwError as error:
        completed = getattr(error, "all_ranks", False)  # every rank stops here together: meet before tearing down
        raise
    finally:
        if dist.is_initialized():
            finish_distributed(completed)


def refuse_what_the_runtime_does_not_run(plan, plan_path: str) -> None:
    """One PlanError for a plan (planned for a Megatron target) with what gbmw's runtime does not run: an interleaved
    or GPipe schedule, sequence parallelism outside the Transformer blocks, context parallelism (cp) or Ulysses with +sp
    (gbmw.space.runtime_support.runtime_strategy_refusal). (Selective recomputation, +sel, it runs:
    gbmw.adapters.runtime.attention_core_recompute.)"""
    if plan.schedule != "1f1b" or plan.virtual_stages != 1:
        raise PlanError(f"{plan_path}: schedule {plan.schedule} with virtual_stages {plan.virtual_stages} — gbmw's runtime "
                        "runs the plain 1F1B pipeline (schedule 1f1b, virtual_stages 1); plan again for --target runtime")
    last = len(plan.strategies) - 1
    edge = next((index for index, s in enumerate(plan.strategies) if s.sp and index in (0, last)), None)
    if edge is not None:
        raise PlanError(f"{plan_path}: field `strategies`: layer {edge} ({'embedding' if edge == 0 else 'head'}) uses "
                        f"{plan.strategies[edge].name} — gbmw's runtime runs sequence parallelism (+sp) in Transformer "
                        "blocks only; drop +sp there, or plan again for --target runtime")
    from gbmw.space.runtime_support import runtime_strategy_refusal

    for index, strategy in enumerate(plan.strategies):
        refusal = runtime_strategy_refusal(strategy)
        if refusal is not None:
            raise PlanError(f"{plan_path}: field `strategies`: layer {index}: {refusal}")


def _read_inputs(job_reference: str, plan_path: str, settings: TrainSettings):
    """The plan and the architecture the runtime builds, checked against the job and the --save folder."""
    from gbmw.plan import Plan
    from gbmw.space.runtime_support import runtime_refusal
    from gbmw.specs.jobs import load_job

    job = load_job(job_reference)
    plan = Plan.load(plan_path)
    if plan.model != job.model.name:
        raise PlanError(f"{plan_path}: field `model`: value {plan.model!r} — the job trains {job.model.name}; "
                        f"plan it with `gbmw plan {job_reference} -o plan.yaml`")
    plan.check_against(job.model, precision=job.precision)
    refuse_what_the_runtime_does_not_run(plan, plan_path)
    refusal = runtime_refusal(job.model.architecture, plan.precision)  # what `gbmw plan` warned of
    if refusal is not None:
        raise PlanError(refusal)
    architecture = job.model.require_architecture("gbmw train")
    if settings.save and Path(settings.save).exists():
        raise GbmwError(f"--save {settings.save}: exists; gbmw never replaces a checkpoint — choose a new folder")
    from .checkpoint_series import check_save_every

    check_save_every(settings.save, settings.save_every)
    return plan, architecture, _open_data(settings, architecture)


def _open_data(settings: TrainSettings, architecture):
    """The dataset of --data, its files checked (token_data.DataError otherwise); None without --data."""
    if settings.data is None:
        return None
    from .token_data import DataError, TokenData

    if architecture.family != "gpt":
        raise DataError(f"--data {settings.data}: model {architecture.name} is `family: {architecture.family}`; --data "
                        "trains decoder language models (`family: gpt`), whose samples are plain token sequences")
    return TokenData(settings.data, architecture.seq_length, architecture.vocab_size, settings.seed)


def _run(plan, architecture, data, settings: TrainSettings, context) -> list[float]:
    from .launch import is_communication_failure, lost_contact

    def say(text: str) -> None:
        if context.rank == 0:
            print(text, flush=True)

    try:
        return _steps(plan, architecture, data, settings, context, say)
    except RuntimeError as error:  # torch.distributed reports a dead peer as a RuntimeError subclass
        if not is_communication_failure(error):
            raise
        raise lost_contact(error, "outside a training step (building the stages, loading or saving)") from None


def non_finite_step(engine, loss: float, settings: TrainSettings, last_saved: Path | None = None) -> str | None:
    """Why the step just taken cannot go on — a loss or gradient norm that is not finite (its update already spoilt
    the weights) — or None. `last_saved`: the latest checkpoint --save-every wrote, which stays the one to resume."""
    norm = float(engine.last_grad_norm) if engine.last_grad_norm is not None else 0.0
    if math.isfinite(loss) and math.isfinite(norm):
        return None
    shown_norm = f", gradient norm {norm}" if engine.last_grad_norm is not None else ""
    saved = f"--save {settings.save} was not written" if settings.save else "nothing was saved"
    if last_saved is not None:
        saved = f"nothing after it was saved; the last checkpoint is {last_saved}"
    return (f"step {engine.step}: loss {loss}{shown_norm} — training stopped ({saved}); a checkpoint or data "
            "with non-finite values, or a learning rate too high, are the usual causes")


def _steps(plan, architecture, data, settings: TrainSettings, context, say) -> list[float]:
    from .checkpoint_files import load_checkpoint, save_checkpoint
    from .checkpoint_series import checkpoint_to_load, remove_interrupted_step_saves, step_checkpoint
    from .engine import AdamSettings, HybridEngine
    from .groups import GroupPool
    from .launch import agree, is_communication_failure, lost_contact
    from .model import synthetic_batch
    from .token_data import DataError

    pool = GroupPool(plan)
    engine = HybridEngine(plan, architecture, pool, context.device, seed=settings.seed,
                          adam=AdamSettings(learning_rate=settings.learning_rate,
                                            max_grad_norm=settings.max_grad_norm))
    say(f"gbmw train: {plan.model} on {plan.num_devices} {context.device.split(':')[0]} process(es) ({context.backend}), "
        f"pp={plan.pp} partition={list(plan.partition)}, {plan.num_micro_batches} micro-batches of "
        f"{plan.micro_batch}, strategies {_summary(plan)}")
    manifest = None
    if settings.load:
        load_path, note = checkpoint_to_load(settings.load)
        if note is not None:
            if context.rank == 0:
                remove_interrupted_step_saves(Path(settings.load))
            say(note)
        manifest = load_checkpoint(engine, load_path)
        say(f"resumed from {load_path} at step {manifest['step']} (saved under {manifest['saved_under']['num_devices']} "
            f"devices, pp={manifest['saved_under']['pp']})")
    if data is not None and settings.load and manifest["seed"] != data.seed:
        data = data.with_seed(manifest["seed"])  # the order the job's earlier steps read, whatever --seed says now
        say(f"data order: the checkpoint's --seed {manifest['seed']} (not {settings.seed}), as the saved job read it")
    if data is not None:
        say(f"data: {data.path} ({data.tokens} {data.dtype} tokens, {data.samples_per_epoch} samples of "
            f"{architecture.seq_length + 1} tokens per epoch), from sample {engine.consumed_samples}")
    losses, last_saved = [], None
    for _ in range(settings.steps):
        if data is None:
            batch = synthetic_batch(architecture, plan.global_batch, engine.step, settings.seed)
        else:
            try:
                batch = data.batch(engine.consumed_samples, plan.global_batch)
            except DataError as error:  # every rank reads the same batch, finds the same problem and stops here
                agree(str(error), DataError)
        started = time.perf_counter()
        try:
            loss = engine.train_step(batch)
        except RuntimeError as error:  # torch.distributed reports a dead peer as a RuntimeError subclass
            if not is_communication_failure(error):
                raise
            raise lost_contact(error, f"during step {engine.step + 1}",
                               f". Nothing after step {engine.step} was saved.") from None
        seconds = time.perf_counter() - started
        agree(non_finite_step(engine, loss, settings, last_saved), TrainingError)  # the same on every rank
        losses.append(loss)
        norm = f"  grad-norm {float(engine.last_grad_norm):.3f}" if engine.last_grad_norm is not None else ""
        say(f"step {engine.step:>5}/{settings.steps + (engine.step - len(losses))}  loss {loss:.6f}{norm}  "
            f"{seconds:.3f} s  {plan.global_batch / seconds:.1f} samples/s")
        if settings.save_every and (engine.step % settings.save_every == 0 or len(losses) == settings.steps):
            last_saved = save_checkpoint(engine, step_checkpoint(settings.save, engine.step))
            say(f"saved {last_saved} (step {engine.step}; --load {settings.save} resumes from the latest)")
    if settings.save and (not settings.save_every or not losses):  # --steps 0 saves the state it loaded
        saved = save_checkpoint(engine, step_checkpoint(settings.save, engine.step) if settings.save_every
                                else settings.save)
        say(f"saved {saved} (step {engine.step}; loads under any plan)")
    return losses


def _summary(plan) -> str:
    names = [strategy.name for strategy in plan.strategies]
    runs, start = [], 0
    for index in range(1, len(names) + 1):
        if index == len(names) or names[index] != names[start]:
            runs.append(f"{names[start]}×{index - start}" if index - start > 1 else names[start])
            start = index
    return ", ".join(runs)

