"""The routed experts as grouped products (gbmw.adapters.runtime.grouped_experts) compute what the expert-by-expert
loop computes: outputs and every weight's, bias's and input's gradient, gated and not, with experts that receive no
token, and with counts that take either branch of the weights' backward (one grouped product where every count is a
multiple of 16 bytes, expert by expert otherwise). The equivalence tests of the MoE runtime (test_runtime_moe*.py)
train TP-1 experts through this path on both sides; `test_the_moe_models_of_the_runtime_tests_take_the_grouped_path`
says they do."""

import pytest

pytestmark = pytest.mark.torch

# fp32: the same dot products in another blocking, so outputs and gradients agree to a few fp32 ulps of their scale
# (1e-5 relative leaves a 100× margin); a wrong expert's weights, a shifted group end, a transposed weight or a lost
# bias moves them by O(1) of their scale. bf16 (autocast): each product rounds to bf16 once either way (2⁻⁸ relative),
# so 2e-2 of the scale; the same errors still move them by O(1).
TOLERANCES = {"float32": 1e-5, "bfloat16": 2e-2}


def _experts(gated: bool, bias: bool, count: int, hidden: int = 32, ffn: int = 48):
    import torch

    from gbmw.adapters.runtime.experts import ExpertMLP
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    torch.manual_seed(0)
    experts = [ExpertMLP(hidden, ffn, bias, gated, TensorParallel.single(), torch.float32) for _ in range(count)]
    for expert in experts:
        for parameter in expert.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    return experts


def _run(experts, rows, counts, grouped: bool, dtype):
    import torch

    from gbmw.adapters.runtime.grouped_experts import grouped_expert_mlps

    for expert in experts:
        expert.zero_grad(set_to_none=True)
    rows = rows.clone().requires_grad_()
    with torch.autocast(rows.device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        if grouped:
            output = grouped_expert_mlps(experts, rows, counts)
            assert output is not None
        else:
            output = torch.cat([expert(part) for expert, part in zip(experts, rows.split(counts))])
    torch.manual_seed(1)
    (output.float() * torch.randn(output.shape).to(output.device)).sum().backward()
    return output.float(), rows.grad.float(), [parameter.grad.float() for e in experts for parameter in e.parameters()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gated, bias", [(True, False), (False, True)])
@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [8, 0, 16, 8]], ids=["unaligned", "aligned"])
def test_grouped_products_equal_the_expert_loop(dtype, gated, bias, counts, device="cpu"):
    import torch

    experts = [expert.to(device) for expert in _experts(gated, bias, len(counts))]
    torch.manual_seed(2)
    rows = torch.randn(sum(counts), 32).to(device)
    grouped = _run(experts, rows, counts, True, dtype)
    loop = _run(experts, rows, counts, False, dtype)
    tolerance = TOLERANCES[dtype]
    for name, got, want in (("output", grouped[0], loop[0]), ("input gradient", grouped[1], loop[1])):
        assert (got - want).abs().max() <= tolerance * want.abs().max(), name
    for index, (got, want) in enumerate(zip(grouped[2], loop[2])):
        scale = max(want.abs().max().item(), 1e-30)
        assert (got - want).abs().max() <= tolerance * scale, f"parameter {index}"
    empty = [index for index, count in enumerate(counts) if count == 0]
    weights_per_expert = len(list(experts[0].parameters()))
    for index in empty:  # an expert without tokens has a zero gradient, not None
        assert all(grad.abs().max() == 0 for grad in grouped[2][index * weights_per_expert:(index + 1) * weights_per_expert])


@pytest.mark.gpu
@pytest.mark.parametrize("gated, bias", [(True, False), (False, True)])
@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [8, 0, 16, 8]], ids=["unaligned", "aligned"])
def test_grouped_products_equal_the_expert_loop_on_cuda(gated, bias, counts):
    """The same check with CUDA's grouped kernel (bf16 under autocast; fp32 runs the loop there)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    test_grouped_products_equal_the_expert_loop("bfloat16", gated, bias, counts, device="cuda")


def test_experts_whose_rows_are_not_16_byte_aligned_run_one_by_one():
    import torch

    from gbmw.adapters.runtime.grouped_experts import grouped_expert_mlps

    experts = _experts(True, False, 2, hidden=6, ffn=10)  # 6 fp32 = 24 bytes: not a multiple of 16
    assert grouped_expert_mlps(experts, torch.randn(4, 6), [2, 2]) is None


def test_the_moe_models_of_the_runtime_tests_take_the_grouped_path(monkeypatch):
    """llama-moe-tiny's experts (TP 1, fp32) run as grouped products: the runtime's MoE equivalence tests train them
    through this path; under TP 2 they are megatron-core linears and run one by one."""
    import torch
    from runtime_reference import architecture

    import gbmw.adapters.runtime.grouped_experts as grouped_experts
    from gbmw.adapters.runtime.experts import ExpertParallel, MixtureOfExpertsMLP
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    calls = []
    original = grouped_experts.grouped_linear
    monkeypatch.setattr(grouped_experts, "grouped_linear", lambda *args: calls.append(1) or original(*args))
    arch = architecture("llama-moe-tiny")
    layer = MixtureOfExpertsMLP(arch.hidden_size, arch.moe, arch.bias, arch.gated_mlp, TensorParallel.single(),
                                ExpertParallel.single(), torch.float32)
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    layer(torch.randn(2, 8, arch.hidden_size)).sum().backward()
    assert len(calls) == 3  # gate, fc1, fc2
