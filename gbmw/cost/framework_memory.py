"""What a framework allocates beyond its model states (gbmw.cost.model_states) and the layers' stashed activations.

gbmw's runtime, as torch's MemTracker sees its real train step (benchmarks/memory_at_scale.py,
gbmw.adapters.profile.fake_memory):
* 16-bit training runs the layers under autocast over fp32 weights. Autocast casts each weight a layer uses to
  16 bits once per forward and `nn.Linear` saves that copy for backward, so every micro-batch in flight keeps a
  16-bit copy of the weights of its one-device layers (2 bytes per parameter) — except an embedding (the lookup
  runs in fp32) and a checkpointed layer, which makes its copy again during the recomputation in backward.
  (The engine runs autocast without its cast cache, so a copy nobody saves is freed at once.)
* Under autocast the residual stream stays fp32 (the embedding looks up fp32 weights; a later stage casts the
  16-bit activation it receives to fp32 and keeps the received tensor for its backward too), and each norm saves
  its fp32 input: every sub-block keeps its input in 4 bytes where a 16-bit framework keeps 2
  (`fp32_residual_extra_share`: (4 − d) / d more than the layer's 16-bit accounting, gbmw.specs.transformer_layers).
  A stage after the first also holds the received 16-bit input itself (`keeps_received_input`).
  Its TP layers (megatron-core's autograd functions) save their input as given — a norm's fp32 output, where
  `nn.Linear` saves a 16-bit cast — so a TP layer keeps each sub-block's normalised input in 4 bytes too
  (`fp32_tp_input_extra_share`); they give 16-bit outputs as `nn.Linear` does (gbmw.adapters.runtime
  .tensor_parallel) and cast their weights again in backward rather than keep a copy.
* ZeRO-1/2 layers (FSDP2 with `reshard_after_forward=False`) keep the gathered fp32 weights from the first
  forward to the backward: while micro-batches run they hold whole weights, as ZeRO-1/2's model states say
  (the shard alone only between iterations), and their own shard beside them (`kept_shard_bytes_per_parameter`).
  With one micro-batch, ZeRO-1 reduce-scatters each layer's gradients right after its backward, as ZeRO-2 does,
  and holds less than the unsharded gradients priced.
* A sharded layer (FSDP2: ZeRO-1/2/3) gathers its weights into one flat buffer of the whole layer's weights and
  copies them out to the layer's parameters: while the layer gathers, the buffer and the copies exist at once
  (`gather_buffer_bytes_per_parameter`). In forward FSDP2 frees a unit's buffer only at the next unit's copy-out
  (to overlap that copy-out with the next all-gather), so a layer computes its forward beside its own buffer — the
  routed experts' own unit's while they run (`gated_activation_forward_bytes`; traced, stage 3 of the Mixtral plan
  with ZeRO-2 beside EP and recomputation: its peak is the experts' forward, beside their 1.3 GiB buffer — −3.1 %
  before this was priced, −2.3 % after). In backward the buffer is freed once copied out, before the layer computes; a block's
  backward is charged a buffer of its own size beside what it computes (FSDP2 prefetches the next layer's all-gather
  in backward, about the layer's own size in a run of like blocks; the traces agree: charging the larger of buffer
  and backward instead put GPT-3 65B's ZeRO-2 stages 1.7–3.3 % under them). A ZeRO-3 head is the first layer of its
  stage's backward: it gathers again before its backward computes and frees its buffer first, and its neighbour's
  buffer (a block's) is not the vocabulary's: it holds the larger of its own buffer and its backward (a sharded
  Mixtral head on the last stage: +2.2 % with both charged, +0.8 % with the larger). A ZeRO-1/2 head gathers in
  forward beside its loss's working set and keeps the sum (charging it the larger put a Llama 3.1 plan's last stage
  from +0.8 % to −1.9 %; benchmarks/memory_at_scale.py). A ZeRO-1/2 layer that recomputes (+ckpt) also holds the
  larger: its parameters stay gathered from forward, so its recomputation gathers nothing, and the buffer-sized
  reduce-scatter of its gradients comes after its rebuilt stash is freed (traced, stage 3 of the Mixtral plans:
  z2dp8+ep4+ckpt and z1dp8+ep4+ckpt +5.1 % with both charged, −1.9 % with the larger, as dp8+ep4+ckpt's −1.6 %; GPT-3 15B
  with tp4-z2dp4+ckpt / tp2-z1dp8+ckpt blocks on its first stage +0.3 / +0.9 % → −1.0 / −0.6 %).
  Routed experts under EP are their own FSDP2 unit (gbmw.adapters.runtime.expert_data_parallel), run after the
  layer's dense part: next in backward order after them is that dense part, so a ZeRO-3 MoE layer's experts compute
  their backward beside the dense part's buffer, not a whole layer's; the experts' buffer, prefetched beside the dense
  part's backward, is at most what their own gathered weights and gradients held (EDP ≥ 2: 2·(1 − 1/EDP) ≥ 1 of
  them). Traced (the Mixtral plan with ZeRO-3 beside EP, stages 0–2): +1.8 / +2.9 / +3.0 % with the whole layer's
  buffer, −0.9 / −0.7 / +0.4 % with the dense part's.
  ZeRO-1/2 layers are resharded after each micro-batch's backward, so every micro-batch's forward gathers them
  again.
* A layer's backward holds, beside the stash, the gradients of its output (received) and its input (sent on),
  its widest activation gradient and the gradient of its largest weight before that is added to the
  parameter's gradient (gbmw.specs.transformer_layers' backward workspace;
  `prices_backward_workspace`). Megatron accumulates weight gradients straight into its fp32 main gradients; the
  stock targets' workspaces are not modelled.
* The gated activation (gbmw.adapters.runtime.gated_mlp.swiglu) forms SiLU(gate) ∘ up in fp32 at least: with 16-bit
  inputs it holds four fp32 tensors of the activation's size at once — gate and up cast to fp32, gate·σ(gate), the
  product — beside the 16-bit gate and up it keeps, before its 16-bit output exists (16 bytes per element); with
  fp32 inputs σ(gate) and gate·σ(gate), then gate·σ(gate) and the product (8; `gated_activation_working_bytes_per
  _element`). It runs in forward (`gated_activation_forward_bytes`: beside the unit's all-gather buffer; in a
  checkpointed layer, whose forward keeps nothing, beside its own 16-bit gate and up too), and again in a checkpointed
  layer's recomputation, where the rebuilt stash and the layer's output gradient wait beside it
  (`gated_activation_peak_bytes`); a mixture of experts runs it once per expert on that expert's copies, or once on
  all the rank's copies where the runtime groups them. Where either moment holds more than the layer's backward, it
  is the layer's peak. The recomputation is a forward again, so a ZeRO-3 layer (FSDP2, resharded after forward)
  gathers its weights whole — copies beside its own shard, not the (1 − 1/n) the layer's backward is charged — and
  keeps the flat all-gather buffer of the unit running the call (the routed experts' own unit under EP, else the
  layer's) to the next unit's copy-out, as in forward; and a layer under ZeRO-3 or ZeRO-2 recomputes beside the
  reduce-scatter input of the unit above it in backward (its dense part where the experts are a unit of their own),
  the one buffer in flight (gbmw.adapters.runtime.sharding.ReduceScatterInFlight). `recomputation_weight_bytes`.
  Traced (benchmarks/memory_at_scale.py, the long-context Mixtral plan's `cp4-sdp4+ep8+ckpt` stage at 32k tokens,
  its peak in the experts' SwiGLU recomputed): the experts' 0.66 GiB buffer, their whole weights and the dense part's
  reduce-scatter input were 1.0 GiB above the estimate's (1 − 1/n) weights and one dense buffer (−5.9 % before).
* A head's cross-entropy holds, beside the fp32 softmax of the logits it keeps for backward, a working set that
  depends on who computes it (`cross_entropy_workspace_bytes_per_logit`, per TP-local logit): on one device torch's
  `F.cross_entropy` on the fp32 logits, whose backward holds nll_loss's fp32 gradient and log_softmax's fp32
  gradient at once (8 bytes); under TP megatron-core's vocabulary-parallel cross-entropy, which works in place on
  one fp32 copy of the logits — the softmax it keeps and, in backward, the gradient — so beyond it only a 16-bit
  logit tensor exists: the layer's output beside the copy in forward, autograd's cast of the gradient to that dtype
  in backward (2 bytes under autocast; none in fp32 training, where the copy is the logits).
* A sequence-parallel layer (+sp; Korthikanti et al. 2022, Sec. 4.2.2) stashes its column-parallel linears' inputs
  as sequence slices and all-gathers them again (16-bit) for the weight gradients in backward: beside its backward
  workspace it holds one whole-sequence 16-bit input (`sequence_parallel_gather_share`; Megatron keeps the same
  all-gather buffer, not modelled for the stock targets).
* Sharded layers (FSDP2) shard a tied weight separately in each of its two layers, so a stage holding both
  holds its states twice; unsharded layers share one tensor.
* The optimizer step: torch's multi-tensor Adam computes √v into a new fp32 tensor (4 bytes per parameter it
  steps) before the update (torch.optim.adam._multi_tensor_adam). The runtime steps ADAM_CHUNK_ELEMENTS
  elements at a time (gbmw.adapters.runtime.local_adam), so a stage needs 4 bytes × min(the parameters it
  steps, ADAM_CHUNK_ELEMENTS) beside its states at the step: a reserve it keeps free (`step_reserve_bytes`).
  The same reserve holds the flat buckets in which it all-reduces plain-DP gradients just before the step (at most
  ADAM_CHUNK_ELEMENTS fp32 elements, and no more than the parameters it steps: gbmw.adapters.runtime.sharding).
Megatron's and DeepSpeed's fused Adam update in place, and their 16-bit weights are what the layers compute with.
"""

from __future__ import annotations

import numpy as np

from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import STORAGE_PRECISION, ModelSpec

AUTOCAST_COPY_BYTES = 2
ADAM_SQRT_TEMPORARY_BYTES = 4
ADAM_CHUNK_ELEMENTS = 2**24
"""Elements gbmw's runtime updates in one multi-tensor Adam call (64 MiB of √v temporaries)."""
FP32_BYTES = 4


def runs_autocast(framework: str, precision: str) -> bool:
    """gbmw's runtime in 16 bits: fp32 weights, layers under autocast."""
    return framework == "gbmw-runtime" and precision in ("bf16", "fp16")


def autocast_weight_copy_bytes(framework: str, precision: str, tp: int) -> int:
    """Bytes per (TP-local) parameter of the 16-bit weight copy a micro-batch keeps from forward to backward:
    `nn.Linear` (one device) saves it; megatron-core's TP linears (tp > 1) save the fp32 weight and cast again."""
    return AUTOCAST_COPY_BYTES if runs_autocast(framework, precision) and tp == 1 else 0


def fp32_residual_extra_share(framework: str, precision: str, activation_bytes: int) -> float:
    """Extra bytes per byte of a layer's residual-stream inputs (16-bit accounting) that the framework keeps."""
    return (FP32_BYTES - activation_bytes) / activation_bytes if runs_autocast(framework, precision) else 0.0


def fp32_tp_input_extra_share(framework: str, precision: str, activation_bytes: int, tp: int) -> float:
    """Extra bytes per byte of a layer's residual-stream inputs (16-bit accounting) for the fp32 normalised inputs
    its TP linears save (gbmw's runtime under autocast with tp > 1: one per sub-block, the size of its input)."""
    return fp32_residual_extra_share(framework, precision, activation_bytes) if tp > 1 else 0.0


def keeps_received_input(framework: str, precision: str) -> bool:
    """Whether a stage after the first keeps the 16-bit activation it received beside its fp32 copy."""
    return runs_autocast(framework, precision)


def kept_shard_bytes_per_parameter(framework: str, strategy: Strategy, weight_bytes: float) -> float:
    """Weight bytes per (TP-local) parameter a ZeRO-1/2 layer holds beside its gathered weights: gbmw's runtime
    (FSDP2 without resharding after forward) keeps its own shard too, 1/(ZeRO degree) of the weights."""
    shards = strategy.degree("z1dp") * strategy.degree("z2dp")
    if framework != "gbmw-runtime" or shards == 1 or strategy.degree("sdp") > 1:
        return 0.0
    return weight_bytes / shards


def gather_buffer_bytes_per_parameter(framework: str, strategy: Strategy, weight_bytes: float) -> float:
    """Bytes per (TP-local) parameter of the flat all-gather buffer a sharded layer holds while it gathers."""
    sharded = any(strategy.degree(axis) > 1 for axis in ("sdp", "z1dp", "z2dp"))
    return weight_bytes if framework == "gbmw-runtime" and sharded else 0.0


def prices_backward_workspace(framework: str) -> bool:
    """Whether a layer's backward workspace (gbmw.specs.model_spec.LayerSpec) is priced for this framework: gbmw's
    runtime, where the memory benchmark checks it (benchmarks/memory_at_scale.py)."""
    return framework == "gbmw-runtime"


def shares_tied_weights(framework: str, strategy: Strategy) -> bool:
    """Whether a stage whose two tied layers use `strategy` holds the tied weight (and its states) once."""
    sharded = any(strategy.degree(axis) > 1 for axis in ("sdp", "z1dp", "z2dp"))
    return not (framework == "gbmw-runtime" and sharded)


def step_temporary_bytes(framework: str, optimizer: str) -> int:
    """Bytes of the optimizer step's temporaries per parameter it steps (before the chunk cap)."""
    return ADAM_SQRT_TEMPORARY_BYTES if framework == "gbmw-runtime" and optimizer == "adam" else 0


def step_reserve_bytes(bytes_per_parameter: float, stepped_parameters: float) -> float:
    """What a stage stepping `stepped_parameters` keeps free for the step: its temporaries, one chunk at most."""
    return bytes_per_parameter * min(stepped_parameters, ADAM_CHUNK_ELEMENTS)


def gated_activation_working_bytes_per_element(framework: str, precision: str) -> float:
    """Bytes per element of the gated activation that gbmw's runtime holds while it computes it, beside its inputs
    (the module docstring): four fp32 tensors for 16-bit inputs, two for fp32 ones. 0 where the backward workspace
    is not priced (Megatron's fused bias-SwiGLU keeps no fp32 tensors; the stock targets' workspaces are not
    modelled)."""
    if not prices_backward_workspace(framework):
        return 0.0
    return (4 if runs_autocast(framework, precision) else 2) * FP32_BYTES


def cross_entropy_workspace_bytes_per_logit(framework: str, precision: str, tp: int) -> float:
    """Bytes per (TP-local) logit a head's cross-entropy holds beside the fp32 softmax it keeps (the module
    docstring): torch's on one device, megatron-core's vocabulary-parallel one, in place, under TP. 0 where the
    backward workspace is not priced."""
    if not prices_backward_workspace(framework):
        return 0.0
    if tp == 1:
        return 2 * FP32_BYTES  # nll_loss's gradient and log_softmax's backward output
    return AUTOCAST_COPY_BYTES if runs_autocast(framework, precision) else 0.0


def sequence_parallel_gather_share(framework: str, strategy: Strategy) -> float:
    """Bytes per byte of a layer's 16-bit input (per sample) that its backward holds as the all-gathered input of
    its column-parallel linears under +sp: gbmw's runtime's (gbmw.adapters.runtime.sequence_parallel)."""
    return 1.0 if framework == "gbmw-runtime" and strategy.sp else 0.0


def groups_experts(framework: str, precision: str) -> bool:
    """Whether gbmw's runtime runs a rank's routed experts as grouped products at expert TP 1 (gbmw.adapters.runtime
    .grouped_experts: bf16 products, and fp32 ones on a CPU), so that one gated activation call covers the copies of
    all its local experts, not one expert's."""
    return framework == "gbmw-runtime" and STORAGE_PRECISION.get(precision, precision) in ("bf16", "fp32")


def expert_call_rows(framework: str, precision: str, expert_tp, ep, load, num_experts):
    """Copies of one gated activation call of the routed experts, in units of one expert's share of a rank's own
    copies: one expert (the loop) receives the copies of its EP group's ep ranks (the busiest `load` times the mean;
    its own rank's alone at EP 1); grouped (`groups_experts` at expert TP 1: TP 1, or +etp1 beside the layer's TP)
    all the rank's E/ep experts' at once — E shares (× load under EP). Arrays broadcast."""
    one_expert = np.where(ep > 1, ep * load, 1.0)
    if not groups_experts(framework, precision):
        return one_expert
    return np.where(expert_tp == 1, num_experts * np.where(ep > 1, load, 1.0), one_expert)


def gated_activation_peak_bytes(framework: str, precision: str, model: ModelSpec, strategy: Strategy, samples: float,
                                activation_bytes: int, held_bytes: np.ndarray) -> np.ndarray:
    """[layer] what a checkpointed layer holds beyond its forward stash (O_f) while its gated activation runs again
    in the recomputation (`gated_activation_working_bytes_per_element`): the working set on the largest call —
    the dense MLP or the shared experts on the rank's tokens, or one routed expert on its copies (under EP e, each of
    a rank's experts receives the copies of e ranks, the busiest rank `expert_load_factor` times the mean; all of a
    rank's experts at once where the runtime groups them, `expert_call_rows`) — less the
    activation's own output, which is part of O_f but not made yet, plus `held_bytes`: what else exists then (the
    gathered weights, the prefetched gather buffer, the rebuilt stash and the output's gradient). 0 for layers
    without a gated MLP, and where the framework's working set is not priced."""
    per_element = gated_activation_working_bytes_per_element(framework, precision)
    arrays = model.arrays
    if not per_element:
        return np.zeros(model.num_layers)
    expert_rows = expert_call_rows(framework, precision, strategy.expert_tensor_parallel, strategy.ep,
                                   arrays.expert_load_factor, arrays.num_experts)
    elements = np.maximum(arrays.gated_activation_elements_per_sample,
                          arrays.expert_gated_activation_elements_per_sample * expert_rows) * samples / strategy.tp
    return np.where(elements > 0, elements * (per_element - activation_bytes) + held_bytes, 0.0)


def recomputation_weight_bytes(regathers, reduce_scatters, experts_own_unit, dense_weight_bytes, expert_weight_bytes,
                               gather_buffer_bytes, experts_buffer_bytes, dense_gradient_bytes, expert_gradient_bytes):
    """[layer] weight and gradient buffers beside a checkpointed layer's recomputation (the module docstring): under
    ZeRO-3 (`regathers`) its whole gathered weights (`dense_weight_bytes`, `expert_weight_bytes`: the sharded parts,
    whole) and the running unit's all-gather buffer (`experts_buffer_bytes` where the experts are a unit of their own,
    else the layer's `gather_buffer_bytes`); under ZeRO-3 or ZeRO-2 (`reduce_scatters`: every micro-batch) the reduce-
    scatter input of the unit above, taken as this layer's dense part (`dense_gradient_bytes`) where the experts are
    their own unit, else the whole layer's sharded gradients. Arrays broadcast."""
    unit_buffer = np.where(experts_own_unit, experts_buffer_bytes, gather_buffer_bytes)
    in_flight = np.where(experts_own_unit, dense_gradient_bytes, dense_gradient_bytes + expert_gradient_bytes)
    return (np.where(regathers, dense_weight_bytes + expert_weight_bytes + unit_buffer, 0.0)
            + np.where(reduce_scatters, in_flight, 0.0))


def gated_activation_forward_bytes(framework: str, precision: str, model: ModelSpec, tp, ep, expert_tp, samples,
                                   activation_bytes: int, recomputes, gathered_bytes, dense_call_buffer_bytes,
                                   expert_call_buffer_bytes):
    """[layer] what a layer holds beyond the stash before it while its gated activation runs in forward (the
    module docstring): the working set of each call (the dense MLP or shared experts on the rank's tokens, the routed
    experts on `expert_call_rows` shares of its copies) — less its output, part of O_f but not made yet; in a
    checkpointed layer, whose forward keeps nothing, plus its 16-bit gate and up — beside the gathered ZeRO-3 weights
    (`gathered_bytes`) and the all-gather buffer of the FSDP2 unit running the call (FSDP2 frees a unit's buffer in
    forward only at the next unit's copy-out): the whole layer's, or the experts' own unit's for the routed experts
    (`expert_call_buffer_bytes`). The larger call; 0 without a gated MLP or where the working set is not priced.
    `expert_tp`: the experts' TP degree (where they are grouped). Arrays broadcast over layers."""
    per_element = gated_activation_working_bytes_per_element(framework, precision)
    arrays = model.arrays
    if not per_element:
        return np.zeros(model.num_layers)
    own_bytes = np.where(recomputes, per_element + 2 * activation_bytes, per_element - activation_bytes)
    expert_rows = expert_call_rows(framework, precision, expert_tp, ep, arrays.expert_load_factor, arrays.num_experts)
    dense_elements = arrays.gated_activation_elements_per_sample * samples / tp
    expert_elements = arrays.expert_gated_activation_elements_per_sample * expert_rows * samples / tp
    dense_call = np.where(dense_elements > 0, dense_elements * own_bytes + dense_call_buffer_bytes, 0.0)
    expert_call = np.where(expert_elements > 0, expert_elements * own_bytes + expert_call_buffer_bytes, 0.0)
    calls = np.maximum(dense_call, expert_call)
    return np.where(calls > 0, calls + gathered_bytes, 0.0)
