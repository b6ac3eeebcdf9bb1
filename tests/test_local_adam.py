"""The runtime's Adam (gbmw.adapters.runtime.local_adam) steps in chunks, slicing tensors larger than a chunk, so
its √v temporaries stay within the reserve the estimator keeps (gbmw.cost.framework_memory) — with the same result,
bit for bit, as torch.optim.Adam over whole tensors (the update is element-wise; each slice advances a copy of
the step count, the parameter's own count once)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gbmw.adapters.runtime import local_adam  # noqa: E402

pytestmark = pytest.mark.torch


def test_chunked_steps_equal_torch_adam_bit_for_bit():
    # chunks of 7 (the fixture below): 20 elements → three slices; 5×4 → three
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 4)), torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(20))]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    optimizer = local_adam.LocalShardAdam(ours, lr=0.1, foreach=True)
    torch_adam = torch.optim.Adam(reference, lr=0.1, foreach=True)
    for _ in range(3):
        for mine, theirs in zip(ours, reference):
            gradient = torch.randn_like(mine)
            mine.grad, theirs.grad = gradient.clone(), gradient.clone()
        optimizer.step()
        torch_adam.step()
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(ours, reference))
    for mine, theirs in zip(ours, reference):
        assert torch.equal(optimizer.state[mine]["exp_avg_sq"], torch_adam.state[theirs]["exp_avg_sq"])
        assert optimizer.state[mine]["step"].item() == 3.0


def test_chunks_group_whole_tensors_up_to_the_chunk():
    assert local_adam._chunks([3, 3, 3, 10, 1]) == [(0, 2), (2, 3), (3, 4), (4, 5)]  # chunk 7 (set below)


@pytest.fixture(autouse=True)
def small_chunk(monkeypatch):
    monkeypatch.setattr(local_adam, "ADAM_CHUNK_ELEMENTS", 7)
