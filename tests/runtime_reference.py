"""Single-process training of the runtime's models in plain torch, and a distributed driver that reports
losses and full weights: what the runtime's equivalence tests compare.

The reference shares nothing with the runtime's engine (no pipeline, no loss shares, no Slice-Gather, no
gradient synchronisation): one module list, the embedding and head weights tied by sharing one Parameter,
the loss of the whole global batch, torch Adam.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gbmw.adapters.runtime.model import build_layer, initial_value, layer_names, synthetic_batch
from gbmw.adapters.runtime.tensor_parallel import TensorParallel
from gbmw.adapters.runtime.tied_weights import HEAD_WEIGHT, ties_embeddings
from gbmw.plan import plan_from_strategy_names
from gbmw.specs.models import build_model, load_architecture

RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "models"
LEARNING_RATE = 1e-3
ADAM_EPS = 1e-3
"""Adam's ε on both sides. With torch's default 1e-8 a gradient element within fp32 rounding noise of zero gets
an update of ±lr whose sign is that noise; with ε = 1e-3 an update changes by at most about lr·δ/ε for a gradient
that changes by δ, so the weights compare at a tolerance that still means something (test_runtime_equivalence)."""


VARIANTS = {"tied": {"tie_embeddings": True}, "dropout": {"dropout": True}}
"""`NAME+tied`: the head tied to the token embedding; `NAME+dropout`: hidden and attention dropout on."""


def architecture(name: str):
    """A bundled model recipe, or a variant of one (`VARIANTS`)."""
    base, _, variant = name.partition("+")
    arch = load_architecture(RECIPES / f"{base}.yaml")
    return arch.model_copy(update=VARIANTS[variant]) if variant else arch


def reference_training(model: str, global_batch: int, steps: int, seed: int = 0, max_grad_norm=None, batches=None,
                       learning_rate: float = LEARNING_RATE, eps: float = ADAM_EPS):
    """(losses per step, {full parameter name: tensor, "<name>#exp_avg"/"#exp_avg_sq": Adam's moments} after
    the last step). Adam's update is invariant to a gradient's scale; its moments are not, so comparing
    them catches a gradient summed or averaged over the wrong ranks. `batches(step)` gives each step's batch
    (default: the runtime's synthetic batches)."""
    arch = architecture(model)
    names = layer_names(arch)
    layers = torch.nn.ModuleList(build_layer(arch, name, TensorParallel.single()) for name in names)
    with torch.no_grad():
        for name, layer in zip(names, layers):
            for key, parameter in layer.named_parameters():
                parameter.copy_(initial_value(f"{name}.{key}", parameter.shape, seed))
    if ties_embeddings(arch):
        layers[-1].output.weight = layers[0].word.weight
    optimizer = torch.optim.Adam(layers.parameters(), lr=learning_rate, eps=eps, weight_decay=0.0, foreach=False)
    losses = []
    for step in range(steps):
        batch = synthetic_batch(arch, global_batch, step, seed) if batches is None else batches(step)
        x = batch["inputs"]
        for layer in layers[:-1]:
            x = layer(x)
        loss = layers[-1](x, {key: value for key, value in batch.items() if key != "inputs"})
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(layers.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    weights = {}
    for name, layer in zip(names, layers):
        for key, parameter in layer.named_parameters():
            full_name = f"{name}.{key}"
            if ties_embeddings(arch) and full_name == HEAD_WEIGHT:
                continue  # the same Parameter as the embedding's (checkpoints keep that one)
            weights[full_name] = parameter.detach().clone()
            for moment in ("exp_avg", "exp_avg_sq"):  # scale-sensitive, unlike Adam's updates
                weights[f"{full_name}#{moment}"] = optimizer.state[parameter][moment].clone()
    return losses, weights


def make_plan(model: str, world_size: int, strategies: list[str], partition: list[int], global_batch: int,
              micro_batches: int):
    spec = build_model(architecture(model), "fp32")
    return plan_from_strategy_names(spec, world_size, strategies, partition, global_batch, micro_batches)


def distributed_training(rank, world_size, model, strategies, partition, global_batch, micro_batches, steps,
                         save=None, load=None, seed=0, max_grad_norm=None):
    """Run on every rank (see dist_fixture.run_distributed): train, then return the losses and, from the first rank
    of each stage, the stage's full weights and Adam moments."""
    from gbmw.adapters.runtime.checkpoint_files import load_checkpoint, save_checkpoint
    from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool

    arch = architecture(model)
    plan = make_plan(model, world_size, strategies, partition, global_batch, micro_batches)
    adam = AdamSettings(LEARNING_RATE, eps=ADAM_EPS, max_grad_norm=max_grad_norm)
    engine = HybridEngine(plan, arch, GroupPool(plan), "cpu", seed=seed, adam=adam)
    if load:
        load_checkpoint(engine, load)
    losses = [engine.train_step(synthetic_batch(arch, global_batch, engine.step, seed)) for _ in range(steps)]
    if save:
        save_checkpoint(engine, save)
    state = engine.full_state()
    weights = {f"{layer}.{key}": tensor for layer, tensors in state.items() for key, tensor in tensors.items()}
    return {"losses": losses, "weights": weights if engine.local_rank == 0 else {}}


def collect(results: list[dict]):
    """Losses (from rank 0) and the union of every stage's full weights, from every rank's result."""
    weights = {}
    for result in results:
        weights.update(result["weights"])
    return results[0]["losses"], weights
