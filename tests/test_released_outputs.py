"""A pipeline stage keeps each micro-batch's sent output as the root of its backward only, not its data
(gbmw.adapters.runtime.pipeline.release_sent_output, megatron-core's deallocate_output_tensor): the backward from
the released root is the backward from the whole output, and a stage before the last releases every micro-batch's
root."""

import pytest


@pytest.mark.torch
def test_the_backward_from_a_released_root_is_the_whole_outputs():
    """y = tanh(x·W) copied to bf16 as the engine copies what it sends: after the release the root holds one element,
    the sent tensor the values, and back-propagating g from the root gives x and W the gradients that
    torch.autograd.backward(y_copy, g) gives (the same graph, the same operations: equal to the bit)."""
    import torch

    from gbmw.adapters.runtime.pipeline import backward_from_released, release_sent_output

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=generator, requires_grad=True)
    weight = torch.randn(8, 8, generator=generator, requires_grad=True)
    grad = torch.randn(3, 5, 8, generator=generator).to(torch.bfloat16)

    def root():
        return torch.tanh(x @ weight).to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True)

    whole = root()
    expected_values = whole.detach().clone()
    torch.autograd.backward(whole, grad)
    expected = (x.grad.clone(), weight.grad.clone())
    x.grad, weight.grad = None, None

    released = root()
    sent = release_sent_output(released)
    assert released.numel() == 1 and torch.equal(sent, expected_values)
    backward_from_released(released, grad)
    assert torch.equal(x.grad, expected[0]) and torch.equal(weight.grad, expected[1])


def _released_roots(rank, world_size):
    """Stage 0 of a two-stage plan with 4 micro-batches: the element count of each root the engine released."""
    import gbmw.adapters.runtime.engine as engine_module
    from runtime_reference import architecture, make_plan

    from gbmw.adapters.runtime.engine import HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.model import synthetic_batch

    release, roots = engine_module.release_sent_output, []

    def recording_release(output):
        sent = release(output)
        roots.append((output.numel(), sent.numel()))
        return sent

    engine_module.release_sent_output = recording_release
    plan = make_plan("gpt-tiny", world_size, ["single"] * 6, [3, 3], 8, 4)
    engine = HybridEngine(plan, architecture("gpt-tiny"), GroupPool(plan), "cpu")
    engine.train_step(synthetic_batch(architecture("gpt-tiny"), 8, 0, 0))
    return roots


@pytest.mark.dist
def test_a_stage_before_the_last_releases_every_micro_batchs_root():
    from dist_fixture import run_distributed

    first, last = run_distributed(2, _released_roots, timeout_s=150)
    assert len(first) == 4 and all(root == 1 and sent > 1 for root, sent in first)
    assert last == []  # the last stage's root is its loss
