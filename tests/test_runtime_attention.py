"""The runtime's CPU attention with dropout (gbmw.adapters.runtime.attention): the exact gradient of its own
forward, torch's SDPA without dropout, and flash attention's memory — nothing of size tokens × tokens is saved."""

import pytest

pytestmark = [pytest.mark.torch]


def _inputs(dtype, batch=2, heads=3, tokens=5, head_dim=4, seed=0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, tokens, head_dim, generator=generator, dtype=dtype, requires_grad=True)
            for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk_elements", [50, 75, 10**6])  # 5 × 5 scores: heads 2 + 1; one sample; all at once
def test_backward_is_the_gradient_of_the_forward_with_its_dropout_masks(causal, chunk_elements, monkeypatch):
    import torch

    from gbmw.adapters.runtime import attention as module

    monkeypatch.setattr(module, "CHUNK_SCORE_ELEMENTS", chunk_elements)

    def seeded(query, key, value):
        torch.manual_seed(7)  # the same masks at every evaluation: a function of the inputs alone
        return module.RecomputingAttention.apply(query, key, value, causal, 0.3)

    # float64 finite differences against the analytic backward (gradcheck's default tolerances); a mask drawn
    # differently in backward, or a missing dropout factor, changes the gradient by O(1).
    assert torch.autograd.gradcheck(seeded, _inputs(torch.float64))


@pytest.mark.parametrize("causal", [True, False])
def test_without_dropout_it_equals_torch_sdpa(causal):
    import torch
    import torch.nn.functional as F

    from gbmw.adapters.runtime.attention import RecomputingAttention

    ours, theirs = _inputs(torch.float64), _inputs(torch.float64)
    out = RecomputingAttention.apply(*ours, causal, 0.0)
    expected = F.scaled_dot_product_attention(*theirs, is_causal=causal)
    out.sum().backward()
    expected.sum().backward()
    # float64 throughout: both sides agree to ~1e-15; 1e-10 still catches a wrong scale or mask (O(1) changes)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-10, atol=1e-10)


def test_dropout_drops_the_expected_share_and_keeps_the_mean():
    import torch

    from gbmw.adapters.runtime.attention import attention

    torch.manual_seed(0)
    value = torch.ones(1, 4, 64, 8)
    query = key = torch.zeros(1, 4, 64, 8)  # uniform probabilities: each output is the mean kept weight
    out = attention(query, key, value, False, 0.5)
    # 4 × 64 rows of 64 draws: the mean output is 1 ± ~0.01 (a missing 1/(1−p) gives 0.5, no dropout gives exactly 1)
    assert abs(out.mean().item() - 1.0) < 0.05
    assert out.std().item() > 0.05


def test_saves_what_flash_attention_saves():
    import torch

    from gbmw.adapters.runtime.attention import attention

    query, key, value = _inputs(torch.bfloat16, batch=1, heads=2, tokens=64, head_dim=8)
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autocast("cpu", torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attention(query, key, value, True, 0.1)
    activations = [tensor for tensor in saved if tensor.dtype != torch.uint8]  # the generator's state aside
    shapes = sorted(tuple(tensor.shape) for tensor in activations)
    # Q, K, V, the output and the per-row log-sum-exp: no tokens × tokens tensor
    assert shapes == sorted([(1, 2, 64, 8)] * 4 + [(1, 2, 64)]), shapes


def test_backward_under_autocast_computes_as_without_it():
    import torch

    from gbmw.adapters.runtime.attention import RecomputingAttention

    # the engine runs a CPU backward under autocast; the attention's backward must not drop to bf16 there
    gradients = []
    for autocast in (False, True):
        inputs = _inputs(torch.float32)
        torch.manual_seed(3)
        out = RecomputingAttention.apply(*inputs, True, 0.2)
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            out.backward(torch.ones_like(out))
        gradients.append([tensor.grad for tensor in inputs])
    for plain, under_autocast in zip(*gradients):
        torch.testing.assert_close(under_autocast, plain, rtol=0.0, atol=0.0)  # bf16 matmuls would differ at ~1e-3


@pytest.mark.parametrize("chunk_elements", [50, 75, 10**6])  # 5 × 5 scores: query heads 2 + 2; one sample; all at once
def test_grouped_query_backward_sums_over_the_query_heads_of_each_key_value_head(chunk_elements, monkeypatch):
    """Grouped-query attention (4 query heads on 2 key/value heads) with K and V kept at their own width: the exact
    gradient of its own forward (gradcheck in float64; a query head paired with the wrong key/value head, or a
    key/value gradient written instead of summed over its group, changes the gradient by O(1)), and what the
    autograd of K and V repeated per query head gives (what the CPU path computed before it kept their width)."""
    import torch

    from gbmw.adapters.runtime import attention as module

    monkeypatch.setattr(module, "CHUNK_SCORE_ELEMENTS", chunk_elements)
    query, key, value = _inputs(torch.float64, heads=4)
    key, value = (tensor.detach()[:, :2].requires_grad_() for tensor in (key, value))

    def seeded(query, key, value, repeat=False):
        torch.manual_seed(7)  # the same masks at every evaluation: a function of the inputs alone
        if repeat:
            key, value = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
        return module.RecomputingAttention.apply(query, key, value, True, 0.3)

    assert torch.autograd.gradcheck(seeded, (query, key, value))
    grouped = torch.autograd.grad(seeded(query, key, value).square().sum(), (query, key, value))
    repeated = torch.autograd.grad(seeded(query, key, value, repeat=True).square().sum(), (query, key, value))
    for mine, expected in zip(grouped, repeated):
        torch.testing.assert_close(mine, expected, rtol=1e-12, atol=1e-12)
