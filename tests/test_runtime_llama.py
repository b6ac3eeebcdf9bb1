"""The runtime's LLaMA-style pieces on one process (gbmw.adapters.runtime: rms_norm, gated_mlp, rotary, grouped-query
attention): each is the exact gradient of its own forward (float64 finite differences), equals an independent
formulation of the same mathematics, and keeps for backward only what the estimator charges."""

import pytest

pytestmark = [pytest.mark.torch]


def _tensor(*shape, seed=0):
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)


def test_rms_norm_is_torchs_rms_norm_with_its_exact_gradient():
    import torch

    from gbmw.adapters.runtime.rms_norm import RMS_NORM_EPS, RMSNorm, _RMSNormFunction

    x, weight = _tensor(3, 5, 16), _tensor(16, seed=1)
    norm = RMSNorm(16, torch.float64)
    reference = torch.nn.RMSNorm(16, eps=RMS_NORM_EPS, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(weight)
        reference.weight.copy_(weight)
    torch.testing.assert_close(norm(x), reference(x), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, RMS_NORM_EPS), (x, weight))


def test_swiglu_is_silu_gate_times_up_with_its_exact_gradient():
    import torch
    import torch.nn.functional as F

    from gbmw.adapters.runtime.gated_mlp import swiglu

    gate, up = _tensor(4, 7), _tensor(4, 7, seed=1)
    torch.testing.assert_close(swiglu(gate, up), F.silu(gate) * up, rtol=0, atol=1e-15)
    assert torch.autograd.gradcheck(swiglu, (gate, up))


def test_rotary_is_roformers_complex_rotation_with_its_exact_gradient():
    """RoFormer Eq. 34 as complex numbers: feature pair (i, i + d/2) times e^{i·p·base^(−2i/d)} at position p."""
    import torch

    from gbmw.adapters.runtime.rotary import rotate

    x = _tensor(2, 6, 3, 8)
    positions = torch.arange(6, dtype=torch.float64)[:, None]
    angles = positions * 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    rotated = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    # the runtime computes the angles in fp32 (as Megatron and Hugging Face do): ≤ 6 · 2^-24 of an angle ≤ 5 rad
    torch.testing.assert_close(rotate(x), torch.cat((rotated.real, rotated.imag), -1), rtol=0, atol=1e-5)
    assert torch.autograd.gradcheck(rotate, (x,))


def test_grouped_query_attention_shares_each_key_value_head_among_its_query_heads():
    import torch

    from gbmw.adapters.runtime.attention import attention

    query, key, value = _tensor(2, 8, 5, 4), _tensor(2, 2, 5, 4, seed=1), _tensor(2, 2, 5, 4, seed=2)
    expanded = [tensor.repeat_interleave(4, dim=1) for tensor in (key, value)]
    for dropout in (0.0, 0.3):  # SDPA's enable_gqa; the CPU's recomputing attention, K and V at their own width
        torch.manual_seed(3)
        grouped = attention(query, key, value, True, dropout)
        torch.manual_seed(3)
        torch.testing.assert_close(grouped, attention(query, *expanded, True, dropout), rtol=0, atol=1e-12)


def _saved_bytes(loss, parameters):
    """Bytes of every distinct storage, not a parameter's, that the autograd graph of `loss` keeps for backward."""
    import torch

    weights = {parameter.untyped_storage().data_ptr() for parameter in parameters}
    storages, seen, stack = {}, set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        tensors = [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
        tensors += list(getattr(node, "saved_tensors", ()) or ())
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in weights:
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        stack += [next_node for next_node, _ in node.next_functions]
    return sum(storages.values())


@pytest.mark.parametrize("model", ["llama-tiny", "gpt-tiny"])
def test_a_block_keeps_what_the_estimator_charges(model):
    """One fp32 block on one device saves exactly the estimator's boundary + intermediate bytes per sample
    (gbmw.specs.transformer_layers; for LLaMA: RMSNorm's one fp32 statistic per token, three ffn-wide SwiGLU tensors,
    Q, K, V at their own widths and flash attention's log-sum-exp; the rotary angle tables are not saved). GPT's
    block, whose accounting the memory benchmarks validate at scale, checks the counting itself."""
    import torch
    from runtime_reference import architecture

    from gbmw.adapters.runtime.model import build_layer, initial_value
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel
    from gbmw.specs.models import build_model

    arch = architecture(model)
    block = build_layer(arch, "decoder.0", TensorParallel.single())
    with torch.no_grad():
        for key, parameter in block.named_parameters():
            parameter.copy_(initial_value(f"decoder.0.{key}", parameter.shape, 0))
    samples = 2
    x = torch.randn(samples, arch.seq_length, arch.hidden_size, requires_grad=True)
    saved = _saved_bytes(block(x).sum(), block.parameters())
    layer = build_model(arch, "fp32").layers[1]
    expected = samples * (layer.boundary_activation_bytes_per_sample + layer.intermediate_activation_bytes_per_sample
                          + layer.intermediate_tp_split_activation_bytes_per_sample)
    # the block's output feeds `.sum()` here, which saves nothing; the estimator counts the second residual add's
    # input (the MLP norm's input) once as a saved tensor of the MLP sub-block
    assert saved == expected


def test_a_head_width_of_its_own_sets_the_attention_width():
    """An architecture's own head_dim (Mistral-Nemo: 128 with hidden 5120 and 32 heads) sizes Q, K, V and the output
    projection's input: 8 heads of 12 on 4 key/value heads with hidden 64."""
    import torch

    from gbmw.adapters.runtime.model import TransformerBlock
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    block = TransformerBlock(64, 8, 176, False, True, False, 0.0, TensorParallel.single(), torch.float32, kv_heads=4,
                             head_dim=12, norm="rms", gated_mlp=True, rotary_base=10000.0)
    assert block.attention.qkv.weight.shape == ((8 + 2 * 4) * 12, 64)
    assert block.attention.proj.weight.shape == (64, 8 * 12)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    x = torch.randn(2, 5, 64, requires_grad=True)
    block(x).sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad).all()
