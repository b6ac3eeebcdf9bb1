"""Plan-independent checkpoints: full tensors by parameter name, Adam states included.

A checkpoint is a folder:

    checkpoint.yaml      manifest: format, model, step, consumed samples, layer names, Adam settings, the plan
                         it was saved under
    layers/<layer>.pt    per layer: {"<param>": full tensor, "<param>#exp_avg": …, "<param>#exp_avg_sq": …}

Tensors are whole (TP slices gathered, ZeRO shards gathered), keyed by the names of the planner's layers,
so a job saved under one plan resumes under any other plan or device count: each rank reads the layers
of its stage and slices them for its own strategies. The first rank of each stage writes its stage's
layers; the folder is written under a temporary name and renamed when complete, and an existing
checkpoint is never replaced. Files are read with `torch.load(weights_only=True)`; manifests with
`yaml.safe_load`. Any rank's failure is shared with every rank, so all stop with the same message
instead of some waiting forever in a collective.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import torch
import torch.distributed as dist
import yaml
from pydantic import AfterValidator, Field, model_validator

from gbmw.errors import CheckpointError, GbmwError
from gbmw.specs.files import permissions_as_created, read_yaml, shown
from gbmw.specs.schema import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_LAYERS, Frozen, Items, validate_as

from .engine import HybridEngine
from .experts import is_expert_parameter
from .launch import agree
from .partial_saves import PARTIAL_PREFIX, mark_as_ours, remove_interrupted_saves, unmark
from .model import layer_names

CHECKPOINT_FORMAT = 1
MANIFEST = "checkpoint.yaml"


def save_checkpoint(engine: HybridEngine, path: str | Path) -> Path:
    """Write a new checkpoint folder at `path` (collective: every rank calls it). It is written under a temporary
    name (`.NAME.partial-*`, marked as gbmw's) and renamed when complete; a save that fails removes it, and one killed
    midway leaves it for the next save or load into the same folder to report and remove
    (adapters/runtime/partial_saves.py: only what its marker proves gbmw wrote)."""
    path = Path(path)
    _agree(None if not path.exists() else
           f"{path} exists; gbmw never replaces a checkpoint — choose a new folder for --save")
    layers = engine.full_state()  # collective inside each stage
    temporary, problem = [None], None
    if engine.rank == 0:
        remove_interrupted_saves(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary[0] = tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX.format(name=path.name)}", dir=path.parent)
            mark_as_ours(Path(temporary[0]), path.name)  # what proves a leftover is gbmw's (partial_saves)
            os.chmod(temporary[0], permissions_as_created(0o777))  # mkdtemp's 0700 would hide it from the group
        except OSError as error:
            temporary[0] = ""
            problem = f"cannot create the checkpoint folder {path}: {error.strerror}"
    dist.broadcast_object_list(temporary, src=0)
    if not temporary[0]:
        _agree(problem if engine.rank == 0 else None)
    folder = Path(temporary[0])
    completed = False
    try:
        if engine.local_rank == 0:
            try:
                (folder / "layers").mkdir(exist_ok=True)
                for name, tensors in layers.items():
                    torch.save(tensors, folder / "layers" / f"{name}.pt")
            except OSError as error:
                problem = f"cannot write {folder}: {error.strerror}"
        _agree(problem)
        if engine.rank == 0:
            try:
                (folder / MANIFEST).write_text(yaml.safe_dump(_manifest(engine), sort_keys=False))
                unmark(folder)
                os.rename(folder, path)  # atomic; fails rather than replace a folder that appeared meanwhile
            except OSError as error:
                problem = f"cannot complete the checkpoint at {path}: {error.strerror}"
        _agree(problem)
        completed = True
    finally:
        if not completed and engine.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return path


def _manifest(engine: HybridEngine) -> dict:
    return {
        "format": CHECKPOINT_FORMAT,
        "model": engine.architecture.name,
        "step": engine.step,
        "consumed_samples": engine.consumed_samples,
        "seed": engine.seed,
        "layers": layer_names(engine.architecture),
        "adam": {"learning_rate": engine.adam.learning_rate, "betas": list(engine.adam.betas),
                 "eps": engine.adam.eps},
        "saved_under": {"num_devices": engine.plan.num_devices, "pp": engine.plan.pp,
                        "partition": list(engine.plan.partition),
                        "strategies": [strategy.name for strategy in engine.plan.strategies]},
    }


class _Adam(Frozen):
    learning_rate: float = Field(gt=0, le=10)
    betas: Items[Annotated[float, Field(ge=0, lt=1)]] = Field(min_length=2, max_length=2)
    eps: float = Field(gt=0, le=1)


class _SavedUnder(Frozen):
    num_devices: int = Field(ge=1, le=MAX_DEVICES)
    pp: int = Field(ge=1, le=MAX_DEVICES)
    partition: Items[Annotated[int, Field(ge=1, le=MAX_LAYERS + 16)]] = Field(max_length=MAX_DEVICES)
    strategies: Items[Annotated[str, Field(max_length=200)]] = Field(max_length=MAX_LAYERS + 16)


LAYER_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
"""A layer's name as gbmw's runtime gives it (`embedding`, `decoder.3`, `head`): no path separators, no `..`."""


def _layer_name(name: str) -> str:
    if not LAYER_NAME.fullmatch(name):
        raise ValueError("not a layer name (letters, digits and _ joined by single dots, e.g. decoder.3): a layer "
                         "file is read by its name")
    return name


class Manifest(Frozen):
    """checkpoint.yaml: what `save_checkpoint` writes, every field checked on load."""

    format: int
    model: str = Field(min_length=1, max_length=200)
    step: int = Field(ge=0, le=2**53)
    """Optimizer steps taken before the save."""
    consumed_samples: int | None = Field(default=None, ge=0, le=2**62)
    """Training samples of those steps (the data position, gbmw.adapters.runtime.token_data); None in checkpoints
    written before it was recorded: the steps × the resuming plan's global batch."""
    seed: int = Field(ge=0, le=2**32 - 1)
    layers: Items[Annotated[str, Field(max_length=200), AfterValidator(_layer_name)]] = Field(
        min_length=1, max_length=MAX_LAYERS + 16)
    adam: _Adam
    saved_under: _SavedUnder

    @model_validator(mode="after")
    def _counters_agree(self) -> "Manifest":
        """Each step trains at least one sample and at most the largest global batch a job can have."""
        if self.consumed_samples is not None and not (
                self.step <= self.consumed_samples <= self.step * MAX_GLOBAL_BATCH):
            raise ValueError(f"field `consumed_samples`: value {self.consumed_samples} after {self.step} steps — a "
                             f"step trains 1 to {MAX_GLOBAL_BATCH} samples, so it lies in [{self.step}, "
                             f"{self.step * MAX_GLOBAL_BATCH}]")
        return self


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no checkpoint there (expected {manifest_path}); give a folder written by "
                              "`gbmw train --save`")
    manifest = read_yaml(manifest_path, "checkpoint manifest", CheckpointError)
    if manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{manifest_path}: field `format`: value {shown(manifest.get('format'))} — this gbmw "
                              f"reads format {CHECKPOINT_FORMAT}")
    try:
        return validate_as(Manifest, manifest, manifest_path).model_dump(mode="json")
    except GbmwError as error:
        raise CheckpointError(f"{error}; the checkpoint is corrupt or was edited") from None


def load_checkpoint(engine: HybridEngine, path: str | Path) -> dict:
    """Load a checkpoint saved under any plan into `engine` (collective: every rank calls it)."""
    path = Path(path)
    problem, manifest, layers = None, None, {}
    if engine.rank == 0:
        remove_interrupted_saves(path)
    try:
        manifest = read_manifest(path)
        expected = layer_names(engine.architecture)
        if manifest.get("model") != engine.architecture.name or manifest.get("layers") != expected:
            raise CheckpointError(
                f"{path / MANIFEST}: field `model`: value {manifest.get('model')!r} with "
                f"{len(manifest.get('layers') or [])} layers — this job trains {engine.architecture.name} with "
                f"{len(expected)} layers"
            )
        for layer in engine.layers:
            for name in engine.tied.layers_read_by(layer.name):
                layers[name] = _read_layer(path / "layers" / f"{name}.pt")
        problem = _unexpected_tensor(engine, layers, path)
    except GbmwError as error:
        problem = str(error)
    _agree(problem)
    try:
        engine.load_full_state(layers, int(manifest["step"]), manifest.get("consumed_samples"))
    except GbmwError as error:
        problem = str(error)
    _agree(problem)
    return manifest


def _unexpected_tensor(engine: HybridEngine, layers: dict[str, dict[str, torch.Tensor]], path: Path) -> str | None:
    """A tensor in the file of a layer this rank holds that no parameter of it (or its Adam moments) is saved as —
    the checkpoint is another model's or was edited — or None. Routed experts' tensors are left to the experts'
    own lookup (every EP rank's experts are in the file)."""
    for layer in engine.layers:
        saved = {key for key in layer.parameters if not engine.tied.is_copy(f"{layer.name}.{key}")}
        for name in layers.get(layer.name, {}):
            key, _, moment = name.partition("#")
            if is_expert_parameter(key) or key in saved and moment in ("", "exp_avg", "exp_avg_sq"):
                continue
            return (f"{path / 'layers' / f'{layer.name}.pt'}: tensor {name!r} is no parameter (or Adam moment) of layer "
                    f"{layer.name}: the checkpoint is of another model or was edited")
    return None


def _read_layer(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise CheckpointError(f"{file}: missing; the checkpoint is incomplete")
    try:
        tensors = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch.load raises many kinds on damaged files
        raise CheckpointError(f"{file}: cannot be read ({error.__class__.__name__}: {str(error)[:120]}); the "
                              "checkpoint is corrupt or truncated") from None
    if not isinstance(tensors, dict) or not all(isinstance(value, torch.Tensor) for value in tensors.values()):
        raise CheckpointError(f"{file}: expected a mapping of names to tensors; the checkpoint is corrupt")
    return tensors


def _agree(problem: str | None) -> None:
    """Raise the same CheckpointError on every rank if any rank has a problem (gbmw.adapters.runtime.launch.agree)."""
    agree(problem, CheckpointError)
