"""What gbmw's runtime allocates beyond model states and activations (gbmw.cost.framework_memory), priced exactly: the
16-bit weight copy each micro-batch keeps under autocast, a checkpointed layer's copy during recomputation, the fp32
residual stream, the received input a later stage keeps, ZeRO-1/2's own shard, the optimizer step's √v reserve,
and a tied weight held twice by sharded layers."""

from __future__ import annotations

import pytest
from conftest import make_cluster, make_layer, make_model

from gbmw.cost.comm import CommModel
from gbmw.cost.layer_cost import CostSettings
from gbmw.cost.layer_cost_batch import layer_costs
from gbmw.cost.stage_cost import StageCosts, stage_estimate, strategy_tables
from gbmw.space.strategy import Strategy

pytestmark = pytest.mark.unit


def costs(name: str, precision: str, framework: str):
    cluster = make_cluster()
    # a block of two sub-blocks: two residual-stream inputs of 100 bytes (16-bit) per sample, the first its boundary
    model = make_model([make_layer("embedding", kind="embedding"), make_layer("block", tp_allreduce_bytes_per_sample=200.0)],
                       precision)
    return layer_costs(model, Strategy.parse(name), 8, CostSettings(cluster, precision, framework=framework),
                       CommModel(cluster))


def test_autocast_keeps_one_device_weight_copies_and_an_fp32_residual_stream():
    # one device per layer (nn.Linear): a 16-bit copy of the 1000 parameters, and both residual inputs in 4 bytes
    # (100 more each) for the one sample of the micro-batch of 8 on each of the 8 data-parallel ranks
    plain, runtime = costs("dp8", "bf16", "megatron"), costs("dp8", "bf16", "gbmw-runtime")
    assert runtime.forward_memory_bytes[1] - plain.forward_memory_bytes[1] == pytest.approx(2 * 1000 + 2 * 100)
    assert runtime.forward_memory_bytes[0] == plain.forward_memory_bytes[0]  # an embedding keeps token ids
    # TP layers (megatron-core's) save the fp32 weight and cast again: no copy; but they save the fp32 normalised
    # input of each sub-block as well (100 more each); 2 samples per rank
    plain, runtime = costs("tp2-dp4", "bf16", "megatron"), costs("tp2-dp4", "bf16", "gbmw-runtime")
    assert runtime.forward_memory_bytes[1] - plain.forward_memory_bytes[1] == pytest.approx(2 * (2 * 100 + 2 * 100))
    # checkpointed: the fp32 input is stashed; the copy and the second fp32 input come back in recomputation
    checkpointed, plain_checkpointed = costs("dp8+ckpt", "bf16", "gbmw-runtime"), costs("dp8+ckpt", "bf16", "megatron")
    assert checkpointed.forward_memory_bytes[1] - plain_checkpointed.forward_memory_bytes[1] == pytest.approx(100)
    # (and, as any runtime backward, the output's and input's gradients: 2 × 100 bytes in fp32, 400)
    assert checkpointed.backward_memory_bytes[1] - plain_checkpointed.backward_memory_bytes[1] == pytest.approx(
        2 * 1000 + 100 + 400)
    assert costs("dp8", "fp32", "gbmw-runtime").forward_memory_bytes[1] == costs(
        "dp8", "fp32", "megatron").forward_memory_bytes[1]  # no autocast in fp32


def test_whole_experts_beside_tp_keep_their_16_bit_copies():
    # +etp1: the rank's routed experts are nn.Linear (grouped), so they keep a 16-bit copy of their 400 / 4 = 100
    # weights (200 bytes) where the layer's TP linears keep none; the rest of the layer as without +etp1
    cluster = make_cluster()
    moe = make_layer("block", kind="decoder", num_experts=8, experts_per_token=2, expert_parameter_count=400)

    def forward(name, framework="gbmw-runtime"):
        return layer_costs(make_model([moe], "bf16"), Strategy.parse(name), 8, CostSettings(cluster, "bf16",
                           framework=framework), CommModel(cluster)).forward_memory_bytes[0]

    assert forward("tp2-dp4+ep4+etp1+sp") - forward("tp2-dp4+ep4+sp") == pytest.approx(100 * 2)
    assert forward("tp2-dp4+ep4+etp1+sp", "megatron") == forward("tp2-dp4+ep4+sp", "megatron")


def test_the_runtime_backward_holds_the_gradients_in_and_out_and_the_layer_workspace():
    cluster = make_cluster()
    layer = make_layer("block", backward_workspace_tp_split_bytes_per_sample=300.0,
                       largest_weight_gradient_tp_split_bytes=1600.0)
    model = make_model([layer], "fp32")
    backward = {framework: layer_costs(model, Strategy.parse("tp2-dp4"), 8, CostSettings(cluster, "fp32", framework=framework),
                                       CommModel(cluster)).backward_memory_bytes[0]
                for framework in ("gbmw-runtime", "megatron")}
    # 2 samples per rank: output and input gradients (100 bytes each per sample), the widest activation gradient
    # (300 per sample) and the largest weight's gradient (1600), both halved by TP; stock targets: not modelled
    assert backward["gbmw-runtime"] == pytest.approx(2 * 100 * 2 + (300 * 2 + 1600) / 2)
    assert backward["megatron"] == 0


def test_block_workspace_is_the_mlp_up_projection_and_the_largest_matrix():
    from gbmw.specs.transformer_layers import BlockShape, block_layer

    shape = BlockShape(tokens=16, hidden=8, heads=2, head_dim=4, kv_heads=2, ffn=32, attended_tokens=16)
    layer = block_layer("b", "decoder", shape, 2, dropout=False, flash=True)
    assert layer.backward_workspace_tp_split_bytes_per_sample == 16 * 32 * 2  # gradient of the 4h-wide output
    assert layer.largest_weight_gradient_tp_split_bytes == 8 * 32 * 2  # an MLP matrix (h × ffn) beats QKV (h × 3h)
    assert layer.gated_activation_elements_per_sample == 0  # a GELU MLP
    gated = block_layer("b", "decoder", BlockShape(tokens=16, hidden=8, heads=2, head_dim=4, kv_heads=2, ffn=32,
                                                   attended_tokens=16, gated_mlp=True), 2, dropout=False, flash=True)
    assert gated.gated_activation_elements_per_sample == 16 * 32


def test_zero_1_and_2_layers_keep_their_shard_beside_the_gathered_weights():
    # the runtime's 4 + 4 + 8 bytes per parameter; ZeRO-1 over 8: whole weights and gradients, 1/8 of Adam's
    # states, and the runtime's own 1/8 shard of the weights (4/8); ZeRO-3 keeps the shard alone
    for name, per_parameter in (("z1dp8", 4 + 4 + 8 / 8 + 4 / 8), ("z2dp8", 4 + 4 / 8 + 8 / 8 + 4 / 8),
                                ("sdp8", 16 / 8), ("dp8", 16)):
        assert costs(name, "bf16", "gbmw-runtime").model_state_bytes[1] == pytest.approx(1000 * per_parameter), name
    assert costs("z1dp8", "bf16", "megatron").model_state_bytes[1] == pytest.approx(1000 * (2 + 4 + 12 / 8))


def test_a_later_stage_keeps_the_received_16_bit_input_beside_its_fp32_copy():
    cluster = make_cluster()
    comm = CommModel(cluster)
    model = make_model([make_layer("block.0"), make_layer("block.1")], "bf16")
    for framework, kept in (("gbmw-runtime", 100.0), ("megatron", 0.0)):
        tables = strategy_tables(model, [Strategy.parse("dp8")], 8, CostSettings(cluster, "bf16", framework=framework),
                                 comm)
        stage_costs = StageCosts(model, tables, 2, 4, "1f1b", comm)
        first, second = (stage_estimate(stage_costs, stage, stage, [0]) for stage in (0, 1))
        # one sample per rank: the first stage receives nothing, the second keeps the 100-byte input per micro-batch
        assert second.stashed_activation_bytes == pytest.approx(
            second.in_flight_micro_batches * (tables.forward_memory_bytes[0, 1] + kept)), framework
        assert first.stashed_activation_bytes == pytest.approx(
            first.in_flight_micro_batches * tables.forward_memory_bytes[0, 0]), framework


def _tied_stage(name: str):
    cluster = make_cluster()
    comm = CommModel(cluster)
    model = make_model([make_layer("embedding", kind="embedding"), make_layer("block"),
                        make_layer("head", kind="head", tied_to="embedding", tied_parameter_count=800)], "bf16")
    tables = strategy_tables(model, [Strategy.parse(name)], 8, CostSettings(cluster, "bf16"), comm)
    return tables, stage_estimate(StageCosts(model, tables, 1, 1, "1f1b", comm), 0, 0, [0, 0, 0])


def test_sharded_layers_hold_a_tied_weight_twice_and_every_stage_keeps_the_step_reserve():
    tables, sharded = _tied_stage("sdp8")
    assert sharded.model_state_bytes == pytest.approx(tables.model_state_bytes[0].sum())  # nothing shared
    tables, replicated = _tied_stage("dp8")
    shared = 800 * tables.state_bytes_per_parameter[0]
    assert replicated.model_state_bytes == pytest.approx(tables.model_state_bytes[0].sum() - shared)
    # Adam's √v (4 bytes) for every parameter the stage steps — the tied weight once — up to the runtime's chunk
    assert replicated.peak_memory_bytes == pytest.approx(replicated.forward_backward_peak_bytes + 4 * (3000 - 800))
    assert sharded.peak_memory_bytes == pytest.approx(sharded.forward_backward_peak_bytes + 4 * 3000 / 8)
    from gbmw.cost.framework_memory import step_reserve_bytes
    assert step_reserve_bytes(4, 10**9) == 4 * 2**24


def _backward(layer, name: str, precision: str, framework: str = "gbmw-runtime") -> float:
    cluster = make_cluster()
    return layer_costs(make_model([layer], precision), Strategy.parse(name), 8,
                       CostSettings(cluster, precision, framework=framework), CommModel(cluster)).backward_memory_bytes[0]


def test_cross_entropy_workspace_depends_on_who_computes_it():
    # a head of 1000 logits per sample; the same head without a loss gives everything else of its backward
    def extra(name, precision, framework="gbmw-runtime"):
        head = dict(kind="head", tp_split_parameter_count=800)
        return (_backward(make_layer("head", loss_logits_per_sample=1000.0, **head), name, precision, framework)
                - _backward(make_layer("head", **head), name, precision, framework))

    # one device: torch's cross-entropy holds nll_loss's and log_softmax's fp32 gradients, 8 bytes per logit (1 sample)
    assert extra("dp8", "bf16") == pytest.approx(8 * 1000)
    # TP 2 (megatron-core's, in place): one 16-bit logit tensor beside the kept fp32 one, per TP-local logit (2 samples
    # per rank, half the vocabulary); two fp32 tensors here were the 128k-token plan's 12 GiB over-estimate
    assert extra("tp2-dp4", "bf16") == pytest.approx(2 * 2 * 1000 / 2)
    assert extra("tp2-dp4", "fp32") == 0  # in fp32 the copy is the logits themselves
    assert extra("dp8", "bf16", "megatron") == 0  # the stock targets' workspaces are not modelled


def test_gated_activation_working_set_is_the_peak_where_it_exceeds_the_backward():
    # 10 000 activation elements per sample; one sample per rank (dp8), 2 per rank at TP 2 (1 per TP-local sample)
    gated = make_layer("block", kind="decoder", gated_activation_elements_per_sample=10_000.0)
    # 16-bit: four fp32 tensors while it runs, less its 16-bit output (part of the stash, not made yet): 14 bytes each;
    # this dwarfs the backward's 2 × 200 bytes of fp32 residual gradients, so it is the layer's extra
    assert _backward(gated, "dp8", "bf16") == pytest.approx(10_000 * (16 - 2))
    assert _backward(gated, "tp2-dp4", "bf16") == pytest.approx(2 * 10_000 / 2 * (16 - 2))
    # fp32: σ(gate) and gate·σ(gate) (8 bytes), less the 4-byte output
    assert _backward(gated, "dp8", "fp32") == pytest.approx(10_000 * (8 - 4))
    # a checkpointed layer's forward keeps nothing: its 16-bit gate and up (2 × 2 bytes) exist beside the four fp32
    # tensors there, and nothing of the call is in the stash (20 bytes each); this toy's 250-byte intermediates do
    # not hold them, so that moment is the larger (the recomputation's below would catch an estimate without it)
    assert _backward(gated, "dp8+ckpt", "bf16") == pytest.approx(10_000 * (16 + 4))
    # with a rebuilt stash that holds them (100 000 + 200 bytes of intermediates) the recomputation is the larger:
    # the call less its output beside that stash, a 16-bit copy of its 1000 weights and its output's gradient (100
    # bytes in fp32: 200)
    stashed = make_layer("block", kind="decoder", gated_activation_elements_per_sample=10_000.0,
                         intermediate_activation_bytes_per_sample=100_000.0)
    assert _backward(stashed, "dp8+ckpt", "bf16") == pytest.approx(10_000 * 14 + 100_200 + 2 * 1000 + 200)
    # ZeRO-2 (FSDP2): in forward the layer computes beside its own all-gather buffer (freed only at the next unit's
    # copy-out): its 1000 fp32 weights, 4000 bytes; its recomputation gathers nothing (the weights stay gathered)
    assert _backward(gated, "z2dp8+ckpt", "bf16") == pytest.approx(10_000 * (16 + 4) + 4 * 1000)
    assert _backward(gated, "dp8", "bf16", "megatron") == 0  # Megatron's fused SwiGLU keeps no fp32 tensors


def test_one_routed_expert_runs_its_gated_activation_on_the_copies_of_its_ep_group():
    # 1000 elements per sample for one expert's share of a rank's own copies; the shared experts' 3000 per sample
    moe = make_layer("block", kind="decoder", num_experts=8, experts_per_token=2, expert_parameter_count=400,
                     expert_gated_activation_elements_per_sample=1000.0, gated_activation_elements_per_sample=3000.0)
    # expert by expert (under TP, where the runtime does not group them): at EP 1 each expert on the rank's own copies,
    # the shared experts' larger call the peak; at EP 8 each of the rank's experts receives the copies of 8 ranks —
    # 8000 elements in one call (not the sum over experts, which run one after another)
    assert _backward(moe, "tp2-dp4", "bf16") == pytest.approx(3000 / 2 * 14 * 2)
    assert _backward(moe, "tp2-dp4+ep4", "bf16") == pytest.approx(4 * 1000 / 2 * 14 * 2)
    # grouped (TP 1: gbmw.adapters.runtime.grouped_experts): one call on all the rank's copies — the 8 experts' shares
    # at EP 1 and at EP 8 alike, × the busiest rank's load under EP
    assert _backward(moe, "dp8", "bf16") == pytest.approx(8 * 1000 * 14)
    assert _backward(moe, "dp8+ep8", "bf16") == pytest.approx(8 * 1000 * 14)
    # the experts whole beside TP 2 (+etp1): grouped as at TP 1, on the rank's own copies (its sequence slice's, 2
    # samples / TP 2 of them); the layer's TP experts (+sp without +etp) run one by one on the TP group's gathered copies
    assert _backward(moe, "tp2-dp4+ep4+etp1+sp", "bf16") == pytest.approx(8 * 1000 * 2 / 2 * 14)
    assert _backward(moe, "tp2-dp4+ep4+sp", "bf16") == pytest.approx(4 * 1000 * 2 / 2 * 14)
    loaded = moe.model_copy(update={"expert_load_factor": 1.5})  # the busiest rank of the group: 1.5 × the mean
    assert _backward(loaded, "dp8+ep4", "bf16") == pytest.approx(8 * 1.5 * 1000 * 14)
    # in a checkpointed layer's forward (8000 elements × (16 + 2 × 2), its 16-bit gate and up beside the call) the
    # routed experts run beside their own FSDP2 unit's all-gather buffer — ZeRO-2 over an expert-data-parallel group
    # of 2: the rank's 2 of 8 experts, 100 fp32 weights, 400 bytes — and beside the whole layer's where nothing shards
    # them apart (EP 8 = DP: the layer's 600 other weights, 2400 bytes)
    assert _backward(moe, "z2dp8+ep4+ckpt", "bf16") == pytest.approx(8000 * 20 + 4 * 100)
    assert _backward(moe, "z2dp8+ep8+ckpt", "bf16") == pytest.approx(8000 * 20 + 4 * 600)



def test_a_zero_3_recomputation_gathers_whole_weights_beside_the_running_units_buffer_and_a_reduce_scatter():
    # the MoE layer above with a rebuilt stash large enough that the recomputation is the layer's peak; its 600 dense
    # and 400 expert weights, fp32 (4 bytes), gradients too. ZeRO-1 recomputes beside no weight buffer (its weights
    # stay gathered from forward, priced as states), so each line is what the flavour adds at that moment
    moe = make_layer("block", kind="decoder", num_experts=8, experts_per_token=2, expert_parameter_count=400,
                     expert_gated_activation_elements_per_sample=1000.0, intermediate_activation_bytes_per_sample=1e6)

    def beyond_zero_1(name: str) -> float:
        zero_1 = name.replace("sdp", "z1dp").replace("z2dp", "z1dp")
        return _backward(moe, name, "bf16") - _backward(moe, zero_1, "bf16")

    # ZeRO-3 with EP 4 (the rank's 2 experts, 100 weights, their own unit over EDP 2): the dense part whole (2400 bytes,
    # not 7/8 of it) and the experts whole (400, not 1/2) beside the experts' flat all-gather buffer (400), and the
    # reduce-scatter input of the unit above — a dense part's gradients (2400). An estimate with (1 − 1/n) weights
    # and a dense buffer in their place (4700) fails here
    assert beyond_zero_1("sdp8+ep4+ckpt") == pytest.approx(2400 + 400 + 400 + 2400)
    # one unit (no EP): the layer whole (4000), its buffer (4000), the layer above's gradients (4000)
    assert beyond_zero_1("sdp8+ckpt") == pytest.approx(3 * 4000)
    # ZeRO-2 gathers nothing in the recomputation but reduce-scatters every micro-batch: the dense part's gradients
    assert beyond_zero_1("z2dp8+ep4+ckpt") == pytest.approx(2400)

def test_a_mixture_of_experts_keeps_one_fp32_residual_input_per_sub_block():
    from gbmw.specs.transformer_layers import BlockShape, block_layer

    # top-2 of 4 experts: the experts' TP all-reduces 2 copies per token, but only the attention's and the MoE MLP's
    # inputs are residual-stream tensors: 2 × s·h in 16 bits, which the runtime keeps in fp32 (and, at TP 2, the fp32
    # normalised input of each sub-block's TP linears too). The all-reduce standing for them charged a third.
    shape = BlockShape(tokens=16, hidden=8, heads=2, head_dim=4, kv_heads=2, ffn=32, attended_tokens=16, gated_mlp=True,
                       experts=4, top_k=2, expert_ffn=32)
    layer = block_layer("b", "decoder", shape, 2, dropout=False, flash=True)
    assert layer.residual_input_bytes_per_sample == 2 * 16 * 8 * 2
    # one expert's SwiGLU runs on its share of the copies: 16 tokens × top-2 / 4 experts, × its width
    assert layer.expert_gated_activation_elements_per_sample == 16 * 2 / 4 * 32
    assert layer.gated_activation_elements_per_sample == 0  # no shared experts
    assert layer.tp_allreduce_bytes_per_sample == (16 + 2 * 16) * 8 * 2
    cluster = make_cluster()

    def stash(spec, name):
        return layer_costs(make_model([spec], "bf16"), Strategy.parse(name), 8,
                           CostSettings(cluster, "bf16", framework="gbmw-runtime"), CommModel(cluster)
                           ).forward_memory_bytes[0]

    fallback = layer.model_copy(update={"residual_input_bytes_per_sample": 0.0})  # the all-reduce stands for them
    one_copy = 16 * 8 * 2  # the copies beyond the first, per sample (one sample per rank at dp8, two at tp2-dp4)
    assert stash(fallback, "dp8") - stash(layer, "dp8") == pytest.approx(one_copy)
    assert stash(fallback, "tp2-dp4") - stash(layer, "tp2-dp4") == pytest.approx(2 * 2 * one_copy)
