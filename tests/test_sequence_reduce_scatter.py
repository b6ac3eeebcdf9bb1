"""Sequence parallelism's reduce-scatter (gbmw.adapters.runtime.sequence_parallel.reduce_scatter_sequence): the
backend's own reduce-scatter, one per batch row, gives what the all-reduce and a slice give — the sum over the group
of each rank's tensor, this rank's slice of the tokens — on 2 and 4 processes, on the whole group and on TP-like
subgroups, with different integer values on every rank and position (sums of integers this small are exact in fp32
and bf16, so the comparison is exact whatever order a backend adds in). gloo runs its emulated reduce-scatter
(`has_reduce_scatter` is False there, and the runtime all-reduces): what this checks on a CPU is gbmw's arrangement
of rows and slices, which NCCL's reduce-scatter receives unchanged; the `gpu` test runs it on NCCL where one is
lent. A +sp plan trained with the reduce-scatter path forced on gloo still trains what one process trains."""

import pytest

torch = pytest.importorskip("torch")

from dist_fixture import run_distributed  # noqa: E402

pytestmark = pytest.mark.dist

SHAPE = (3, 8, 5)  # [batch, tokens, hidden]; 8 tokens split over 2 or 4 ranks


def _rank_input(rank: int, dtype, device: str = "cpu") -> "torch.Tensor":
    """Rank `rank`'s tensor: integers in [-50, 50], different on every rank and position (|sum of 4| ≤ 200 < 256:
    exact in bf16's 8-bit significand)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-50, 51, SHAPE, generator=generator).to(device=device, dtype=dtype)


def _both_paths(rank, world_size, device="cpu"):
    import torch.distributed as dist

    from gbmw.adapters.runtime.sequence_parallel import has_reduce_scatter, reduce_scatter_sequence

    groups = [(dist.group.WORLD, list(range(world_size)))]
    if world_size > 1:  # and each half of the ranks, as TP groups are (every rank creates both)
        halves = [list(range(start, start + world_size // 2)) for start in (0, world_size // 2)]
        created = [dist.new_group(members) for members in halves]
        groups.append(next((group, members) for group, members in zip(created, halves) if rank in members))
    results = []
    for group, members in groups:
        for dtype in (torch.float32, torch.bfloat16):
            expected = sum(_rank_input(member, torch.float32) for member in members)
            expected = expected.chunk(len(members), 1)[members.index(rank)].to(dtype)
            ours = reduce_scatter_sequence(_rank_input(rank, dtype, device), group, True)
            reference = reduce_scatter_sequence(_rank_input(rank, dtype, device), group, False)
            results.append((ours.cpu(), reference.cpu(), expected, ours.is_contiguous()))
    return dist.get_backend(), has_reduce_scatter(dist.group.WORLD), results


@pytest.mark.parametrize("processes", [2, 4])
def test_reduce_scatter_gives_the_all_reduce_and_slice(processes):
    for backend, chosen, results in run_distributed(processes, _both_paths, timeout_s=180):
        assert (backend, chosen) == ("gloo", False)  # gloo's reduce-scatter is an all-reduce of a clone
        assert len(results) == 4
        for ours, reference, expected, contiguous in results:  # torch.equal: the same shape and values
            assert torch.equal(ours, expected) and torch.equal(reference, expected) and contiguous


def _train_forcing_reduce_scatter(rank, world_size, strategies):
    from runtime_reference import distributed_training

    import gbmw.adapters.runtime.sequence_parallel as sequence_parallel

    sequence_parallel.has_reduce_scatter = lambda group: True  # the NCCL path, on gloo's emulated collective
    return distributed_training(rank, world_size, "gpt-tiny", strategies, [6], 8, 2, 3)


def test_sequence_parallel_training_with_the_reduce_scatter_path():
    from runtime_reference import collect
    from test_runtime_equivalence import assert_same_training, reference

    strategies = ["tp2", "tp2+sp", "sdp2", "tp2+sp+ckpt", "tp2+sp", "tp2"]
    per_rank = run_distributed(2, _train_forcing_reduce_scatter, strategies, timeout_s=300)
    # test_runtime_sequence_parallel's tolerances (derived there); the integer test above pins the values exactly
    assert_same_training(*collect(per_rank), *reference("gpt-tiny"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reduce_scatter_on_nccl():
    """One process per CUDA device (NCCL refuses two ranks on one device): with one device the group has one rank
    and the collective is a copy, still NCCL's reduce_scatter_single on the same rows and slices."""
    processes = torch.cuda.device_count()
    for backend, chosen, results in run_distributed(processes, _both_paths, "cuda", timeout_s=180):
        assert (backend, chosen) == ("nccl", True)
        for ours, reference, expected, contiguous in results:
            assert torch.equal(ours, expected) and torch.equal(reference, expected) and contiguous


@pytest.mark.parametrize("batch", [1, 3])
def test_a_sequence_slice_never_keeps_the_whole_sequence_alive(monkeypatch, batch):
    """With one sample the slice of a [1, tokens, hidden] tensor is contiguous already; it must still be a copy, or
    a norm that saves it for backward keeps the whole sequence's tensor alive (t times the slice: at full scale 24 MiB
    per LLaMA-7B +sp block more than the estimate). Fails if `_shard` returns a view."""
    import torch.distributed as dist

    from gbmw.adapters.runtime import sequence_parallel

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    whole = torch.arange(batch * 8 * 2, dtype=torch.float32).reshape(batch, 8, 2)
    piece = sequence_parallel._shard(whole, None)
    assert torch.equal(piece, whole[:, 2:4])
    assert piece.untyped_storage().nbytes() == piece.numel() * piece.element_size()
    assert piece.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
