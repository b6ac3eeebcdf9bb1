"""Expert-data parallelism: the data parallelism of a mixture-of-experts layer's routed experts under EP (`+epN`).

With EP of degree e inside a data-parallel group of d ranks, each rank holds E/e routed experts
(gbmw.adapters.runtime.experts), and the d/e ranks holding the same experts — the expert-data-parallel group
(gbmw.ranks.RankLayout.expert_data_group: the same position in their EP groups) — are the only ones whose gradients of
those experts must be summed (DeepSpeed-MoE, Rajbhandari et al. 2022, Sec. 5: "expert-parallelism + data
parallelism"; megatron-core's expert-data-parallel group). Attention, norms, router and shared experts stay data
parallel over the whole group of d ranks. Each part follows the layer's one data-parallel flavour:

- `dp`: both are summed by plain all-reduces after the last micro-batch (`gradient_parts` gives the engine each part
  with its group; gbmw.adapters.runtime.sharding.synchronise_plain_gradients buckets them per group).
- `sdp`, `z2dp`, `z1dp` (ZeRO-3/2/1): torch FSDP2 `fully_shard` on the rank's `LocalExperts` module over the one-
  dimensional mesh of the expert-data-parallel group, then on the whole layer over the data-parallel group's mesh
  (`shard_layer`). fully_shard leaves out of a module the parameters an inner fully_shard already manages, so the
  experts are gathered, reduce-scattered and stepped as shards of d/e, everything else as shards of d — the states
  gbmw.cost.expert_parallel.expert_view prices. (torchtitan shards MoE experts the same way, on a mesh of the data-
  parallel ranks that hold the same experts.) The inner module keeps the layer's flavour: `sdp` frees its gathered
  experts after forward, `z1dp`/`z2dp` keep them to backward; `z1dp` reduce-scatters on the last micro-batch only
  (set_requires_gradient_sync recurses into it); gradients are summed, never averaged (sharding's module docstring).
  Where d = e every rank holds different experts: there is nothing to shard them over, so the layer's fully_shard
  ignores them (`ignored_params`) and their gradients are this rank's alone.
"""

from __future__ import annotations

from torch import nn

from .experts import ExpertParallel, LocalExperts, is_expert_parameter
from .sharding import LayerDataParallel, ReduceScatterInFlight


def shard_layer(module: nn.Module, data_parallel: LayerDataParallel, experts: ExpertParallel,
                expert_data_parallel: LayerDataParallel, meshes: tuple, in_flight: ReduceScatterInFlight) -> nn.Module:
    """Shard one layer over its data-parallel group for the sharded flavours (nothing for `dp`), its routed experts
    over their expert-data-parallel group when EP splits them; `meshes`: (data-parallel, expert-data-parallel) device
    meshes. In place; returns the module (the root FSDP2 module when sharded)."""
    data_mesh, expert_mesh = meshes
    if not data_parallel.sharded or data_parallel.size == 1:
        return module
    local_experts = [part for part in module.modules() if isinstance(part, LocalExperts)]
    if experts.size == 1 or not local_experts:  # every expert on every rank: one FSDP2 unit over the whole group
        return data_parallel.wrap(module, data_mesh, in_flight)
    ignored = set()
    for part in local_experts:  # inner units first: the layer's fully_shard then skips their parameters
        if expert_data_parallel.size > 1:
            expert_data_parallel.wrap(part, expert_mesh, None)
        else:
            ignored.update(part.parameters())
    return data_parallel.wrap(module, data_mesh, in_flight, ignored)


def gradient_parts(layer) -> list[tuple[LayerDataParallel, list[nn.Parameter]]]:
    """A StageLayer's parameters by the group their gradients are summed over: (data-parallel group, the dense ones),
    (expert-data-parallel group, the routed experts')."""
    dense = [parameter for key, parameter in layer.parameters.items() if not is_expert_parameter(key)]
    routed = [parameter for key, parameter in layer.parameters.items() if is_expert_parameter(key)]
    return [(layer.data_parallel, dense), (layer.expert_data_parallel, routed)]
