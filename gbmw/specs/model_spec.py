"""What the planner knows of a model: a ModelSpec of LayerSpecs (shapes), measured timings where a profile
gave them (their own types), and the architecture it was built from.

Units are in the field names (`_bytes`, `_flops`, `_s`). Terms follow the paper (Sec. 3.1): a layer's
*boundary* activation is its input tensor, its *intermediate* activations are what its backward pass needs
from inside it; model states are parameters, gradients and optimizer states. A ModelSpec is built from an
architecture by `gbmw.specs.models`, or read from a layer list (a profile, or written by hand).
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from gbmw.errors import SpecError
from gbmw.specs.architectures import Architecture
from gbmw.specs.layer_arrays import LayerArrays
from gbmw.specs.layer_timings import LayerTimings
from gbmw.specs.schema import (MAX_COUNT, MAX_LAYERS, MAX_QUANTITY, MAX_SEQUENCE, MAX_WIDTH, Frozen,
                               Items)

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
"""`fp8` is Transformer Engine's FP8 training as megatron-core runs it: the linear layers' GEMMs in FP8, everything
else — attention core, norms, softmax, embeddings, the LM head, the optimizer — in bf16 (`HIGHER_PRECISION`).
`tf32` is fp32 training whose matmuls run on TF32 tensor cores (Ampere and later; torch's
`torch.backends.cuda.matmul.allow_tf32`, on by default in torch 1.7–1.11): every tensor is stored and every other
kernel runs as under fp32 (`STORAGE_PRECISION`), the matmuls at the device's TF32 rate."""

STORAGE_PRECISION: dict[str, str] = {"tf32": "fp32"}
"""The precision a training precision stores its weights, gradients and activations in, where it differs."""

Fp8Recipe = Literal["delayed", "current"]
FP8_RECIPES: tuple[str, ...] = ("delayed", "current")
"""How Transformer Engine scales FP8 tensors under precision fp8 (gbmw.cost.fp8): `delayed` (DelayedScaling: each
cast uses a scale from the amax history of earlier iterations; megatron-core `--fp8-recipe delayed`) or `current`
(Float8CurrentScaling: each tensor's amax is computed right before its cast; `--fp8-recipe tensorwise`). Blockwise
and MXFP8 scaling are not costed."""

HIGHER_PRECISION: dict[str, str] = {"fp8": "bf16"}
"""The precision of everything but the FP8 linear layers' GEMMs, where it differs from the training precision."""

#: Bytes of one activation element under each training precision (16-bit activations in mixed precision; bf16 ones
#: under FP8, whose linear layers alone stash their inputs in 1 byte: gbmw.specs.transformer_layers).
ACTIVATION_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 2}

NON_BLOCK_KINDS = ("embedding", "head")
"""Layer kinds that are not Transformer blocks: stock frameworks recompute blocks only, and Megatron's
pipeline split counts blocks only."""


class Matmul(Frozen):
    """One linear layer's matmul in the forward pass: an input of `rows_per_sample` rows per sample times an
    `in_features` × `out_features` weight (gbmw.cost.matmul_waves prices its shape)."""

    rows_per_sample: int = Field(ge=1, le=MAX_SEQUENCE)
    """Input rows per sample (tokens; 1 for a pooled classifier)."""
    out_features: int = Field(ge=1, le=MAX_WIDTH)
    in_features: int = Field(ge=1, le=MAX_WIDTH)
    tp_split: Literal["out", "in", "none"]
    """Which dimension TP divides: `out` for a column-parallel (or vocabulary-parallel) linear, `in` for a
    row-parallel one, `none` for a linear whole on every TP rank (latent attention's down-projections), whose rows
    sequence parallelism divides instead."""


class LayerSpec(Frozen):
    """One layer of the model as the planner sees it (an embedding, a Transformer block, a head)."""

    name: str
    """Unique name, e.g. `decoder.17`; used in plans, tables and the runtime's parameter names."""
    kind: str
    """What the layer is: `embedding`, `encoder`, `decoder`, `cross_decoder`, `patch_merging`, `head`…"""
    parameter_count: int = Field(ge=0, le=MAX_COUNT)
    """All parameters of the layer (a tied copy included: see `tied_to`)."""
    tp_split_parameter_count: int = Field(ge=0, le=MAX_COUNT)
    """The part of `parameter_count` that tensor parallelism divides (weights of column/row-parallel
    linears, vocabulary-parallel embeddings); the rest (norms, some biases) is replicated."""
    forward_flops_per_sample: float = Field(ge=0, le=MAX_QUANTITY)
    """Floating-point operations of one forward pass for one sample."""
    tp_replicated_forward_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `forward_flops_per_sample` every TP rank computes whole — linears duplicated across the TP group
    (latent attention's down-projections, gbmw.specs.latent_attention) — which only sequence parallelism divides (each
    rank then runs its share of the tokens); the rest TP divides."""
    boundary_activation_bytes_per_sample: float = Field(ge=0, le=MAX_QUANTITY)
    """The layer's input, stashed for backward and sent between pipeline stages (Sec. 3.1 `bnd`).
    Replicated across the ranks of a TP group."""
    intermediate_activation_bytes_per_sample: float = Field(ge=0, le=MAX_QUANTITY)
    """Activations stashed inside the layer that TP does not divide (norm inputs, dropout masks of
    the residual stream)."""
    intermediate_tp_split_activation_bytes_per_sample: float = Field(ge=0, le=MAX_QUANTITY)
    """Activations stashed inside the layer that TP divides (attention scores, MLP hidden)."""
    side_input_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """A second input carried alongside the boundary, e.g. the encoder output every T5 decoder layer
    reads. Stashed once per pipeline stage and sent between stages with the boundary."""
    forward_flash_attention_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `forward_flops_per_sample` a fused (flash) attention kernel runs — scores QKᵀ and scores × V —
    at the device's attention rate rather than its matmul rate; 0 without flash attention."""
    flash_attention_skipped_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `forward_flash_attention_flops_per_sample` a causal flash kernel skips (the score tiles above the
    diagonal: gbmw.specs.causal_attention); counted in the model's FLOPs, not in its time."""
    attention_core_activation_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `intermediate_tp_split_activation_bytes_per_sample` the attention core stashes — softmax output,
    dropout mask and dropout output, a·s² per sample each (a flash kernel: its fp32 log-sum-exp) — which selective
    recomputation does not stash (Korthikanti et al. 2022, Sec. 5: the 5·a·s²·b of Eq. (1)). 0: no attention."""
    attention_core_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Forward FLOPs of the attention core (QKᵀ and scores × V): what selective recomputation repeats in backward."""
    attention_core_memory_traffic_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The attention core's memory-bound traffic (softmax, dropout over the scores; part of
    `forward_tp_split_memory_traffic_bytes_per_sample`), repeated by selective recomputation."""
    forward_memory_traffic_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Bytes the forward pass's memory-bound kernels (norms, dropout, residual adds) read and write for one sample
    outside the TP-split regions; they run at the device's memory bandwidth. 0: time from the matmuls alone."""
    forward_tp_split_memory_traffic_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same inside the TP-split regions (attention core, MLP activation, the vocabulary's logits): TP divides it."""
    backward_workspace_tp_split_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The widest activation gradient the layer's backward holds beside its stash, per sample (the MLP's
    up-projection gradient; a head's cross-entropy is `loss_logits_per_sample`); TP divides it. 0: not modelled."""
    residual_input_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The inputs of the layer's sub-blocks from the residual stream, per sample in the activation dtype (a block:
    one tokens × hidden tensor per sub-block, its boundary the first): what a framework keeping the residual stream in
    fp32 keeps wider (gbmw.cost.framework_memory.fp32_residual_extra_share). 0: the TP all-reduce's bytes stand for
    them (one per sub-block in a dense block; not in a mixture of experts, whose experts all-reduce their copies)."""
    gated_activation_elements_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Elements of the gated activation (SwiGLU: SiLU(gate) ∘ up) the layer's dense MLP — or a mixture of experts'
    shared experts — computes in one call per sample (tokens × width); TP divides it. The framework may hold a
    working set of several tensors of that size while it runs (gbmw.cost.framework_memory
    .gated_activation_working_bytes_per_element). 0: no gated MLP."""
    expert_input_activation_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Of the routed experts' whole stash (`expert_activation_bytes_per_sample`), the permuted copies their first
    linear keeps as its input, per sample. Under sequence parallelism megatron-core all-gathers them over the expert
    TP group before the experts run, so a rank keeps ETP/TP of its TP group's copies (gbmw.cost.expert_parallel)."""
    rms_norm_elements_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Elements the layer's RMSNorms normalise per sample (tokens × hidden per norm; a head's final norm): whole on
    every TP rank (a sequence slice under +sp). A framework running RMSNorm unfused makes several passes over each
    (gbmw.cost.runtime_passes). 0: no RMSNorm (LayerNorm runs as one fused kernel)."""
    rotary_elements_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Elements of Q and K that rotary position embeddings rotate per sample (tokens × (query + key width)); TP
    divides it. 0: no rotary positions (or latent attention, whose rotary part is not counted)."""
    expert_gated_activation_elements_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same for one routed expert, whose call computes its share of the routed copies (tokens × top-k / experts,
    × the capacity factor; × the expert width) — per sample of the rank's own tokens, before expert parallelism
    brings it the copies of the other ranks of its EP group. 0: no gated routed experts."""
    loss_logits_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Logits a head's cross-entropy reads per sample (tokens × vocabulary; TP divides them): its working set beside
    the kept softmax is so many times what the framework holds per logit (gbmw.cost.framework_memory
    .cross_entropy_workspace_bytes_per_logit). 0: no loss over a vocabulary."""
    largest_weight_gradient_tp_split_bytes: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The gradient of the layer's largest weight matrix in the dtype backward computes it in, whole before it is
    added to the parameter's gradient (bytes; TP divides it). 0: not modelled."""
    expert_largest_weight_gradient_bytes: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same for one routed expert's largest weight (counted in the above, which TP divides): the experts' TP
    degree divides it where it differs from the layer's (gbmw.cost.expert_parallel, `+etpN`). 0: no routed experts."""
    fp8_forward_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `forward_flops_per_sample` that runs as FP8 GEMMs (Transformer Engine's linear layers under
    precision fp8: QKV, output projection, MLP and routed-expert FC1/FC2; the TP-split part); 0: none."""
    fp8_parameter_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    """The weights of those linear layers (TP divides them; the routed experts' are `expert_parameter_count`'s, which
    EP divides too): Transformer Engine keeps an FP8 copy of each and casts it once per iteration."""
    fp8_tp_replicated_parameter_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    """The part of `fp8_parameter_count` whole on every TP rank (latent attention's down-projections)."""
    fp8_forward_cast_traffic_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Bytes the forward pass's FP8 casts read and write for one sample (inputs of the linears no norm kernel
    quantises); TP divides it (gbmw.specs.transformer_layers)."""
    fp8_backward_cast_traffic_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same for the backward pass's casts of the linears' output gradients; TP divides it."""
    fp8_norm_cast_elements_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Elements of the linear inputs a norm kernel quantises itself (a LayerNormLinear's: QKV's and FC1's inputs,
    latent attention's latents): free under delayed scaling, a cast pass of their own under current scaling
    (gbmw.cost.fp8); TP divides it."""
    matmuls: Items[Matmul] = Field(default=(), max_length=16)
    """The layer's linear matmuls, whose FLOPs are part of `forward_flops_per_sample`, for their shape-dependent
    rate (gbmw.cost.matmul_waves); empty: every FLOP at the sustained rate."""
    tp_allreduce_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """Bytes all-reduced within the TP group per sample in the forward pass (the backward pass
    all-reduces as many); 0 for layers TP cannot split."""
    num_experts: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """Routed experts of a mixture-of-experts block; 0: a dense layer (every `expert_*` field is then 0)."""
    experts_per_token: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """Experts each token is routed to (top-k)."""
    expert_parameter_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    """The routed experts' parameters: the part of `tp_split_parameter_count` that expert parallelism divides too
    (the experts' TP is the layer's); their gradients are synchronised over the expert-data-parallel group."""
    expert_forward_flops_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The routed experts' forward FLOPs for one sample's tokens (part of `forward_flops_per_sample`): top-k
    expert MLPs per token (capacity × the mean under a capacity factor)."""
    expert_dispatch_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """One sample's routed token copies (tokens × top-k × hidden in the activation dtype): what a dispatch
    all-to-all sends, and a combine all-to-all returns, when the experts are split over ranks."""
    expert_activation_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The part of `intermediate_activation_bytes_per_sample` that grows with the routed tokens a rank receives
    (the permuted expert inputs and outputs)."""
    expert_tp_split_activation_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The same part of `intermediate_tp_split_activation_bytes_per_sample` (the experts' MLP hidden)."""
    expert_load_factor: float = Field(default=1.0, ge=1.0, le=64)
    """Routed tokens on the busiest rank of an EP group over the mean, when the experts are split over ranks: the
    stated load-imbalance assumption of a dropless model, 1 under a capacity factor (its padding is in the counts)."""
    attention_heads: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """Query heads of the layer's attention (0: no attention); TP must divide it."""
    kv_heads: int = Field(default=0, ge=0, le=MAX_WIDTH)
    """Key/value heads (grouped-query attention; 0: as many as attention_heads); TP must divide it."""
    attention_query_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The self-attention's queries for one sample (tokens × heads × head_dim in the activation dtype; its output
    is as wide): what Ulysses' all-to-alls move with the keys and values (gbmw.cost.context_parallel). 0: not
    modelled (no sequence splitting)."""
    attention_key_value_bytes_per_sample: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    """The self-attention's keys and values for one sample: what context parallelism's ring passes round."""
    tied_to: str | None = None
    """Name of a layer whose parameters this one shares (an output head tied to the embedding)."""
    tied_parameter_count: int = Field(default=0, ge=0, le=MAX_COUNT)
    """The part of `parameter_count` shared with `tied_to` (TP divides it): not counted again in the
    model's parameter total, nor in a stage that holds both layers."""
    timings: LayerTimings | None = None
    """Measured times (a profile); None: times follow from the FLOPs (analytic models)."""

    @property
    def is_block(self) -> bool:
        """A Transformer block (or a patch merging between Swin stages), not an embedding or a head."""
        return self.kind not in NON_BLOCK_KINDS

    @property
    def active_parameter_count(self) -> float:
        """Parameters one token passes through: all but the routed experts it is not sent to."""
        if not self.num_experts:
            return float(self.parameter_count)
        return self.parameter_count - self.expert_parameter_count * (1 - self.experts_per_token / self.num_experts)

    @property
    def stashed_activation_bytes_per_sample(self) -> float:
        """Boundary + intermediate activations of one sample with no TP and no checkpointing."""
        return (
            self.boundary_activation_bytes_per_sample
            + self.intermediate_activation_bytes_per_sample
            + self.intermediate_tp_split_activation_bytes_per_sample
        )

    @model_validator(mode="after")
    def _split_within_total(self) -> "LayerSpec":
        if self.tied_parameter_count and self.tied_to is None:
            raise ValueError(f"tied_parameter_count ({self.tied_parameter_count}) needs tied_to: the layer it shares with")
        if self.tied_parameter_count > self.tp_split_parameter_count:
            raise ValueError(
                f"tied_parameter_count ({self.tied_parameter_count}) > tp_split_parameter_count "
                f"({self.tp_split_parameter_count}): tied weights are vocabulary-parallel under TP"
            )
        if self.expert_parameter_count > self.tp_split_parameter_count - self.tied_parameter_count:
            raise ValueError(f"expert_parameter_count ({self.expert_parameter_count}) > the untied TP-split "
                             f"parameters ({self.tp_split_parameter_count - self.tied_parameter_count}): the experts' "
                             "weights are split by TP")
        if (self.num_experts == 0) != (self.experts_per_token == 0) or self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be from 1 to num_experts "
                             f"({self.num_experts}) in a mixture-of-experts layer, and both 0 in a dense one")
        if self.num_experts == 0 and (self.expert_parameter_count or self.expert_forward_flops_per_sample):
            raise ValueError("expert parameters or FLOPs in a layer with num_experts 0; give its num_experts")
        if self.tp_replicated_forward_flops_per_sample > self.forward_flops_per_sample:
            raise ValueError(f"tp_replicated_forward_flops_per_sample ({self.tp_replicated_forward_flops_per_sample:g}) > "
                             f"forward_flops_per_sample ({self.forward_flops_per_sample:g}): it is a part of them")
        if self.fp8_tp_replicated_parameter_count > self.fp8_parameter_count:
            raise ValueError(f"fp8_tp_replicated_parameter_count ({self.fp8_tp_replicated_parameter_count}) > "
                             f"fp8_parameter_count ({self.fp8_parameter_count}): it is a part of them")
        if self.tp_split_parameter_count > self.parameter_count:
            raise ValueError(
                f"tp_split_parameter_count ({self.tp_split_parameter_count}) > "
                f"parameter_count ({self.parameter_count}): TP can divide at most all parameters"
            )
        return self


class ModelTimings(Frozen):
    """What `gbmw profile model` measured of the model as a whole (the optimizer step) and, on the profiling
    pair of processes, of one runtime call between layers (Slice-Gather) and between stages (p2p)."""

    optimizer_step_s_per_parameter: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """Optimizer step time per parameter on the profiled device; the estimator adds the slowest stage's
    step to each iteration."""
    slice_gather_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """One Slice-Gather of the runtime (forward and backward) between a layout sliced in two and a replicated
    one, on a micro-batch's hidden state of `slice_gather_bytes`. What the exchange model does not explain of
    it is charged to every transition R."""
    slice_gather_bytes: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """The full micro-batch's boundary activation in that measurement (bytes)."""
    p2p_time_s: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """One pipeline transfer of the runtime (paired isend/irecv, waited) of `p2p_bytes`; what the cluster's
    p2p model does not explain of it is charged to every stage-to-stage transfer."""
    p2p_bytes: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    """The message of that measurement (bytes)."""


class ModelSpec(Frozen):
    """A model as a sequence of layers, with the precision its activation bytes were computed for."""

    name: str
    family: str
    """`gpt`, `bert`, `t5`, `vit`, `swin`, `profiled`, …"""
    precision: Precision
    """Training precision the activation bytes assume (16-bit activations for fp16/bf16)."""
    sequence_length: int = Field(ge=1, le=MAX_SEQUENCE)
    """Tokens per sample of the main stack (encoder length for T5; patches for vision models)."""
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    """Width of the main stack (the widest stage for Swin); used by Megatron-style formulas."""
    layers: Items[LayerSpec] = Field(min_length=1, max_length=MAX_LAYERS + 16)
    source: str = ""
    """Where the shape comes from (paper, HF config, profile)."""
    architecture: Architecture | None = None
    """The architecture the layers were built (or profiled) from: what the runtime builds modules from and
    the Megatron emitter reads its model flags from. None for a hand-written layer list."""
    timings: ModelTimings | None = None
    """Model-wide measurements of a profile; None for analytic models (those costs are then not modelled)."""

    @model_validator(mode="after")
    def _layers_consistent(self) -> "ModelSpec":
        names = [layer.name for layer in self.layers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"layer names must be unique; repeated: {duplicates}")
        for index, layer in enumerate(self.layers):
            if layer.tied_to is not None and layer.tied_to not in names:
                raise ValueError(
                    f"layers[{index}] ({layer.name}) is tied_to {layer.tied_to!r}, which is not a layer "
                    f"of this model; known layers include {names[:3]}…"
                )
            if layer.tied_to is not None and names.index(layer.tied_to) >= index:
                raise ValueError(
                    f"layers[{index}] ({layer.name}) is tied_to {layer.tied_to!r}, which does not come before it; "
                    "name the tie on the later layer (a head names the embedding it shares weights with)"
                )
        return self

    def model_copy(self, *, update=None, deep: bool = False) -> "ModelSpec":
        """pydantic's copy, without the cached `arrays` of the original (they would describe the old layers)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("arrays", None)
        return copy

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def parameter_count(self) -> int:
        """Unique parameters: a layer tied to another is not counted twice."""
        return sum(layer.parameter_count - layer.tied_parameter_count for layer in self.layers)

    @property
    def active_parameter_count(self) -> float:
        """Unique parameters one token passes through (a mixture of experts: its top-k routed experts only)."""
        return sum(layer.active_parameter_count - layer.tied_parameter_count for layer in self.layers)

    @property
    def is_mixture_of_experts(self) -> bool:
        return any(layer.num_experts for layer in self.layers)

    @property
    def forward_flops_per_sample(self) -> float:
        return float(sum(layer.forward_flops_per_sample for layer in self.layers))

    @property
    def is_block(self) -> np.ndarray:
        """[layer]: whether each layer is a Transformer block (LayerSpec.is_block)."""
        return np.array([layer.is_block for layer in self.layers])

    def require_architecture(self, needed_by: str) -> Architecture:
        """The architecture, or one SpecError saying that `needed_by` cannot do without it."""
        if self.architecture is None:
            raise SpecError(
                f"model {self.name}: a layer list (hand-written, or a profile without `architecture`) has costs but "
                f"no architecture; {needed_by} needs the model recipe it was made from (family, hidden_size, …)"
            )
        return self.architecture

    def measured(self, field: str) -> float | None:
        """A model-wide measurement of `timings` (None for analytic models or when not measured)."""
        return None if self.timings is None else getattr(self.timings, field)

    @functools.cached_property
    def arrays(self) -> LayerArrays:
        return LayerArrays(self.layers)
