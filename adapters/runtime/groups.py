"""The communication group pool (paper Sec. 6): every process group a plan uses, created once, in the same
order on every rank, and passed explicitly. Which ranks form each group is gbmw.ranks' pure rank math."""

from __future__ import annotations

from gbmw.errors import PlanError
from gbmw.plan import Plan
from gbmw.ranks import RankLayout, plan_group_ranks
from gbmw.space.strategy import Strategy


class GroupPool:
    """Every process group a plan uses, created once, in the same order on every rank (paper Sec. 6:
    creating communicator groups is expensive, so the pool is built up front and passed explicitly).

    `GroupPool(plan)` must be called on every rank after torch.distributed is initialised; `get(ranks)`
    returns the group of exactly those global ranks (None for a single rank). The one-dimensional device meshes
    FSDP2 shards over are made here too, for this rank's data-parallel and expert-data-parallel groups (routed experts
    under EP shard over the latter: gbmw.adapters.runtime.expert_data_parallel): a DeviceMesh holds a real tensor
    of ranks, so it must exist before a fake-tensor trace of the train step (gbmw.adapters.profile.fake_memory).
    """

    def __init__(self, plan: Plan, backend: str | None = None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise PlanError("GroupPool needs torch.distributed initialised (see gbmw.adapters.runtime.launch)")
        if dist.get_world_size() != plan.num_devices:
            raise PlanError(
                f"the plan is for {plan.num_devices} devices but {dist.get_world_size()} processes were launched; "
                f"launch {plan.num_devices} or plan again for {dist.get_world_size()}"
            )
        self.plan = plan
        self.layout = RankLayout(plan.num_devices, plan.pp)
        self.rank = dist.get_rank()
        self._groups = {ranks: dist.new_group(list(ranks), backend=backend) for ranks in plan_group_ranks(plan)}
        self.device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        self._meshes = {}
        first, end = plan.stage_bounds[self.layout.stage_of(self.rank)]
        for strategy in dict.fromkeys(plan.strategies[first:end]):
            weights = strategy.gradient_view  # with Ulysses' ranks
            for ranks in (self.layout.data_group(self.rank, weights), self.layout.expert_data_group(self.rank, weights)):
                if len(ranks) > 1 and ranks not in self._meshes:
                    from torch.distributed.device_mesh import DeviceMesh

                    self._meshes[ranks] = DeviceMesh.from_group(self.get(ranks), self.device_type)

    def get(self, ranks: tuple[int, ...]):
        if len(ranks) == 1:
            return None
        try:
            return self._groups[tuple(sorted(ranks))]
        except KeyError:
            raise PlanError(f"ranks {ranks} are not a group of this plan") from None

    def stage_group(self):
        """All ranks of this rank's pipeline stage (None for a one-device stage)."""
        stage = self.layout.stage_of(self.rank)
        size = self.layout.stage_size
        return self.get(tuple(range(stage * size, (stage + 1) * size)))

    def tensor_group(self, strategy: Strategy):
        return self.get(self.layout.tensor_group(self.rank, strategy))

    def data_group(self, strategy: Strategy):
        return self.get(self.layout.data_group(self.rank, strategy))

    def expert_group(self, strategy: Strategy):
        """The ranks exchanging tokens for a mixture-of-experts layer's experts under `strategy` (+epN; None: ep 1)."""
        return self.get(self.layout.expert_group(self.rank, strategy))

    def expert_data_group(self, strategy: Strategy):
        """The ranks holding the same experts under `strategy`, over which expert gradients are summed."""
        return self.get(self.layout.expert_data_group(self.rank, strategy))

    def data_mesh(self, strategy: Strategy):
        """The device mesh of this rank's data-parallel group under `strategy` (a layer of this rank's stage)."""
        return self._meshes.get(self.layout.data_group(self.rank, strategy))

    def expert_data_mesh(self, strategy: Strategy):
        """The device mesh of this rank's expert-data-parallel group under `strategy` (None for one rank)."""
        return self._meshes.get(self.layout.expert_data_group(self.rank, strategy))

    def __len__(self) -> int:
        return len(self._groups)
