"""Tied input and output embeddings across layers, stages and strategies (GPT-2/3, BERT).

The output projection of the head shares its matrix with the token embedding. In a gbmw plan the two
layers may sit on different pipeline stages, with different TP degrees and data-parallel flavours, so
each holds its own copy (as Megatron keeps one on the first and one on the last stage), both start
from the same tensor (the embedding's), and after every backward the gradient of each copy is
replaced by the sum of both: every rank of the stages holding a copy assembles the full gradient of
its copies (gathering TP slices and ZeRO shards), the sums are all-reduced over the union of those
stages, and each rank keeps its slice again. The copies then take identical Adam steps and stay equal. When both layers use the same
strategy (the common case) their slices line up rank by rank, and the sum needs no gathering: it is taken
locally (one stage) or all-reduced between each first-stage rank and its last-stage partner.
Checkpoints store the embedding's copy only; the head's is restored from it. When both layers are on one
stage, slice alike and are not ZeRO-sharded, the head simply uses the embedding's Parameter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gbmw.plan import Plan
from gbmw.ranks import tie_group_ranks, tie_partner_pairs

from .sharding import full_value, local_value, shard_like
from .tensor_parallel import gather_full, shard_for_rank

EMBEDDING_WEIGHT = "embedding.word.weight"
HEAD_WEIGHT = "head.output.weight"


def ties_embeddings(architecture: Any) -> bool:
    """GPT recipes say `tie_embeddings`; BERT's MLM decoder is always tied to the word embedding."""
    return bool(getattr(architecture, "tie_embeddings", True))


def _same_slicing(first, second) -> bool:
    """Both layers' strategies slice weights identically (checkpointing does not matter)."""
    return first.dims == second.dims


def share_tied_weight(architecture: Any, embedding_layer, head_module, head_strategy) -> bool:
    """When the head sits on the embedding's stage with the same slicing and no ZeRO sharding, make it use the
    embedding's Parameter itself: one copy in memory (what the estimator charges) and no gradient exchange."""
    from .sharding import SHARDED_FLAVOURS, data_parallel_flavour

    if not ties_embeddings(architecture) or not _same_slicing(embedding_layer.strategy, head_strategy):
        return False
    if data_parallel_flavour(head_strategy) in SHARDED_FLAVOURS:
        return False  # FSDP2 shards each layer's parameters on its own: it cannot share one across two layers
    head_module.output.weight = embedding_layer.parameters["word.weight"]
    return True


class TiedWeights:
    def __init__(self, architecture: Any, plan: Plan, pool, layers: list) -> None:
        self.enabled = ties_embeddings(architecture)
        self.copies = []
        if not self.enabled:
            return
        for layer in layers:
            for key in layer.parameters:
                if f"{layer.name}.{key}" in (EMBEDDING_WEIGHT, HEAD_WEIGHT):
                    self.copies.append((layer, key))
        if len({id(layer.parameters[key]) for layer, key in self.copies}) < len(self.copies):
            self.copies = []  # one shared Parameter (share_tied_weight): autograd already sums both uses
        ranks = tie_group_ranks(plan)
        self.group = pool.get(ranks) if pool.rank in ranks else None
        self.copy_holders = plan.num_devices // plan.pp
        self.aligned = _same_slicing(plan.strategies[0], plan.strategies[-1])
        partner = [pair for pair in tie_partner_pairs(plan) if pool.rank in pair]
        self.partner_group = pool.get(partner[0]) if partner else None

    def source_name(self, full_name: str) -> str:
        """The checkpoint / initial-value name a parameter is read from (the head's copy reads the embedding's)."""
        return EMBEDDING_WEIGHT if self.enabled and full_name == HEAD_WEIGHT else full_name

    def layers_read_by(self, layer_name: str) -> list[str]:
        """The checkpoint layers a layer's tensors come from (the head's tied copy comes from the embedding)."""
        if self.enabled and layer_name == HEAD_WEIGHT.split(".")[0]:
            return [layer_name, EMBEDDING_WEIGHT.split(".")[0]]
        return [layer_name]

    def is_copy(self, full_name: str) -> bool:
        return self.enabled and full_name == HEAD_WEIGHT

    @torch.no_grad()
    def synchronise_gradients(self) -> None:
        """grad(copy) ← grad(embedding copy) + grad(head copy), on every rank holding either."""
        if not self.copies:
            return
        if self.aligned:  # slices line up: sum them where they are
            local = sum(local_value(layer.parameters[key].grad) for layer, key in self.copies)
            if self.partner_group is not None:
                dist.all_reduce(local, group=self.partner_group)
            for layer, key in self.copies:
                local_value(layer.parameters[key].grad).copy_(local)
            return
        total = None
        for layer, key in self.copies:
            parameter = layer.parameters[key]
            full = gather_full(full_value(parameter.grad), layer.split_dims[key], layer.tp)
            total = full.clone() if total is None else total + full
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
            total /= self.copy_holders  # every rank of a stage contributed its copy's full gradient
        for layer, key in self.copies:
            parameter = layer.parameters[key]
            local = shard_for_rank(total, layer.split_dims[key], layer.tp)
            parameter.grad = shard_like(local, parameter.grad).detach()
