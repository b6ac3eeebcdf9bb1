"""Plan-independent checkpoints: full tensors by parameter name, Adam states included.

A checkpoint is a folder:

    checkpoint.yaml      manifest: format, model, step, layer names, Adam settings, the plan it was saved under
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
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from gbmw.errors import CheckpointError, GbmwError

from .engine import HybridEngine
from .model import layer_names

CHECKPOINT_FORMAT = 1
MANIFEST = "checkpoint.yaml"


def save_checkpoint(engine: HybridEngine, path: str | Path) -> Path:
    """Write a new checkpoint folder at `path` (collective: every rank calls it)."""
    path = Path(path)
    _agree(None if not path.exists() else
           f"{path} exists; gbmw never replaces a checkpoint — choose a new folder for --save")
    layers = engine.full_state()  # collective inside each stage
    temporary = [None]
    if engine.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary[0] = tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent)
    dist.broadcast_object_list(temporary, src=0)
    folder = Path(temporary[0])
    problem = None
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
            manifest = {
                "format": CHECKPOINT_FORMAT,
                "model": engine.architecture.name,
                "step": engine.step,
                "seed": engine.seed,
                "layers": layer_names(engine.architecture),
                "adam": {"learning_rate": engine.adam.learning_rate, "betas": list(engine.adam.betas),
                         "eps": engine.adam.eps},
                "saved_under": {"num_devices": engine.plan.num_devices, "pp": engine.plan.pp,
                                "partition": list(engine.plan.partition),
                                "strategies": [strategy.name for strategy in engine.plan.strategies]},
            }
            (folder / MANIFEST).write_text(yaml.safe_dump(manifest, sort_keys=False))
            os.rename(folder, path)  # atomic; fails rather than replace a folder that appeared meanwhile
        except OSError as error:
            shutil.rmtree(folder, ignore_errors=True)
            problem = f"cannot complete the checkpoint at {path}: {error.strerror}"
    _agree(problem)
    return path


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no checkpoint there (expected {manifest_path}); give a folder written by "
                              "`gbmw train --save`")
    try:
        manifest = yaml.safe_load(manifest_path.read_text())
    except yaml.YAMLError as error:
        raise CheckpointError(f"{manifest_path}: not valid YAML ({error.__class__.__name__}); the checkpoint "
                              "is corrupt") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise CheckpointError(f"{manifest_path}: field `format`: value {found!r} — this gbmw reads format "
                              f"{CHECKPOINT_FORMAT}")
    return manifest


def load_checkpoint(engine: HybridEngine, path: str | Path) -> dict:
    """Load a checkpoint saved under any plan into `engine` (collective: every rank calls it)."""
    path = Path(path)
    problem, manifest, layers = None, None, {}
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
    except GbmwError as error:
        problem = str(error)
    _agree(problem)
    try:
        engine.load_full_state(layers, int(manifest["step"]))
    except GbmwError as error:
        problem = str(error)
    _agree(problem)
    return manifest


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
    """Raise the same CheckpointError on every rank if any rank has a problem (first rank's message)."""
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    for rank, message in enumerate(problems):
        if message is not None:
            suffix = "" if rank == dist.get_rank() else f" (reported by rank {rank})"
            raise CheckpointError(message + suffix)
