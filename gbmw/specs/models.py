"""The planner's view of each Transformer family: an architecture (gbmw.specs.architectures) → a ModelSpec of
LayerSpecs for a training precision — embedding, blocks and head are each one layer, costed by
gbmw.specs.transformer_layers — and loading a model from a recipe, a layer list or a Hugging Face config.json.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

from gbmw.errors import SpecError
from gbmw.specs.architectures import (BERTArchitecture, GPTArchitecture, SwinArchitecture, T5Architecture,
                                      ViTArchitecture, apply_training_settings)
from gbmw.specs.files import read_yaml
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.model_spec import ACTIVATION_DTYPE_BYTES, LayerSpec, Matmul, ModelSpec
from gbmw.specs.schema import validate_as
from gbmw.specs.transformer_layers import (BlockShape, block_layer, classifier_head, embedding_layer, lm_head_layer,
                                           norm_parameter_count)


def build_model(arch: Any, precision: str) -> ModelSpec:
    """The ModelSpec of an architecture under a training precision."""
    builder = {
        "gpt": _build_gpt,
        "bert": _build_bert,
        "t5": _build_t5,
        "vit": _build_vit,
        "swin": _build_swin,
    }[arch.family]
    if precision == "fp8" and arch.family != "gpt":
        raise SpecError(f"model {arch.name}: precision fp8 is costed as megatron-core runs it (Transformer Engine's FP8 "
                        f"linears in GPT-style decoders), not for `family: {arch.family}`; train it in bf16")
    if precision == "fp8":
        builder = functools.partial(_build_gpt, fp8=True)
    layers, sequence_length, hidden_size = builder(arch, ACTIVATION_DTYPE_BYTES[precision])
    return ModelSpec(
        name=arch.name,
        family=arch.family,
        precision=precision,
        sequence_length=sequence_length,
        hidden_size=hidden_size,
        layers=tuple(layers),
        source=arch.source,
        architecture=arch,
    )


def model_as_run(model: ModelSpec, fused_attention: bool) -> ModelSpec:
    """The model as a target runs it: with flash attention's costs (gbmw.specs.transformer_layers) where the target's
    attention is fused (gbmw.space.targets.Target.fused_attention) and the model was built from an architecture that
    declares standard attention; otherwise the model itself (a profile's measured layers stay as measured)."""
    arch = model.architecture
    if not fused_attention or arch is None or model.timings is not None or arch.attention == "flash":
        return model
    return build_model(arch.model_copy(update={"attention": "flash"}), model.precision)


def _build_gpt(arch: GPTArchitecture, d: int, fp8: bool = False) -> tuple[list[LayerSpec], int, int]:
    """`fp8`: the blocks' linear layers are Transformer Engine's FP8 ones (precision fp8); embedding and head stay
    bf16."""
    s, h = arch.seq_length, arch.hidden_size
    latent = arch.latent_attention
    latent_fields = {} if latent is None else dict(
        head_dim=latent.qk_head_dim, q_lora_rank=latent.q_lora_rank or 0, kv_lora_rank=latent.kv_lora_rank,
        qk_rope_head_dim=latent.qk_rope_head_dim, v_head_dim=latent.v_head_dim)
    shape = BlockShape(**{
        **dict(tokens=s, hidden=h, heads=arch.num_heads, head_dim=arch.attention_head_dim,
               kv_heads=arch.num_kv_heads or arch.num_heads, ffn=arch.ffn_hidden_size or 4 * h,
               attended_tokens=s, gated_mlp=arch.gated_mlp, bias=arch.bias, qkv_bias=arch.qkv_bias,
               norm=arch.norm, norm_bias=arch.norm_bias, qk_norm=arch.qk_norm, attention_sinks=arch.attention_sinks,
               fp8_linears=fp8, causal=True, mlp_activation=arch.mlp_activation,
               parallel_norms=arch.parallel_attention_norms, score_dropout=arch.attention_dropout,
               rotary=arch.position_embedding == "rotary"),
        **latent_fields})
    flash, raw_scores = arch.attention == "flash", arch.attention == "standard-with-raw-scores"
    learned = arch.position_embedding == "learned"
    positions = (arch.max_position_embeddings or s) + arch.position_offset if learned else 0
    layers = [embedding_layer("embedding", s, h, arch.vocab_size, positions, 0, d, arch.dropout,
                              norm=arch.embedding_norm, scaled=arch.scaled_embeddings)]
    moe = arch.moe
    expert_shape = shape if moe is None else replace(
        shape, experts=moe.num_experts, top_k=moe.top_k, expert_ffn=moe.expert_ffn_hidden_size,
        shared_ffn=moe.shared_experts * moe.shared_ffn_hidden_size, shared_gate=moe.shared_expert_gate,
        expert_score_bias=moe.expert_score_bias, router_bias=moe.router_bias,
        capacity_factor=moe.capacity_factor, load_imbalance=moe.load_imbalance)
    # each block with its own keys per query: a window's, or the sequence's (GPT-OSS alternates them)
    layers += [block_layer(f"decoder.{i}", "decoder",
                           replace(expert_shape if arch.is_moe_block(i) else shape,
                                   attended_tokens=arch.attended_tokens(i)),
                           d, arch.dropout, flash, raw_scores)
               for i in range(arch.num_layers)]
    norm_params = norm_parameter_count(shape, h)
    tied = "embedding" if arch.tie_embeddings else None
    layers.append(lm_head_layer("head", s, h, arch.vocab_size, d, tied, transform=False, norm_params=norm_params,
                                norm_statistics=2 if arch.norm == "layer" else 1))
    return layers, s, h


def _build_bert(arch: BERTArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    s, h = arch.seq_length, arch.hidden_size
    shape = BlockShape(
        tokens=s, hidden=h, heads=arch.num_heads, head_dim=h // arch.num_heads, kv_heads=arch.num_heads,
        ffn=arch.ffn_hidden_size or 4 * h, attended_tokens=s,
    )
    flash, raw_scores = arch.attention == "flash", arch.attention == "standard-with-raw-scores"
    positions = arch.max_position_embeddings or s
    layers = [
        embedding_layer("embedding", s, h, arch.vocab_size, positions, arch.type_vocab_size, d, arch.dropout, norm=True)
    ]
    layers += [block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash, raw_scores)
               for i in range(arch.num_layers)]
    head = lm_head_layer("head", s, h, arch.vocab_size, d, "embedding", transform=True, norm_params=0)
    # The pooler (dense h×h + bias) and next-sentence classifier (h×2 + bias) sit on the head too.
    pooler_params = h * h + h + 2 * h + 2
    head = head.model_copy(
        update=dict(
            parameter_count=head.parameter_count + pooler_params,
            forward_flops_per_sample=head.forward_flops_per_sample + 2 * (h * h + 2 * h),
        )
    )
    layers.append(head)
    return layers, s, h


def _build_t5(arch: T5Architecture, d: int) -> tuple[list[LayerSpec], int, int]:
    h = arch.hidden_size
    head_dim = arch.head_dim or h // arch.num_heads
    flash, raw_scores = arch.attention == "flash", arch.attention == "standard-with-raw-scores"
    s_enc, s_dec = arch.encoder_seq_length, arch.decoder_seq_length
    relative_bias = 32 * arch.num_heads  # T5's relative-position buckets, in the first block of each stack
    common = dict(hidden=h, heads=arch.num_heads, head_dim=head_dim, kv_heads=arch.num_heads,
                  ffn=arch.ffn_hidden_size, gated_mlp=arch.gated_mlp, bias=False, norm="rms")
    encoder = BlockShape(tokens=s_enc, attended_tokens=s_enc, **common)
    decoder = BlockShape(tokens=s_dec, attended_tokens=s_dec, cross_attention_tokens=s_enc, causal=True, **common)
    layers = [embedding_layer("encoder_embedding", s_enc, h, arch.vocab_size, 0, 0, d, arch.dropout, norm=False)]
    for i in range(arch.num_encoder_layers):
        shape = encoder if i else BlockShape(**{**encoder.__dict__, "extra_params": relative_bias})
        layers.append(block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash, raw_scores))
    decoder_embedding = embedding_layer("decoder_embedding", s_dec, h, arch.vocab_size, 0, 0, d, arch.dropout, norm=False)
    layers.append(
        decoder_embedding.model_copy(
            update=dict(
                tied_to="encoder_embedding",
                tied_parameter_count=arch.vocab_size * h,
                # The encoder's final norm runs here, on the encoder output the decoder carries along.
                parameter_count=decoder_embedding.parameter_count + h,
                side_input_bytes_per_sample=float(s_enc * h * d),
            )
        )
    )
    for i in range(arch.num_decoder_layers):
        shape = decoder if i else BlockShape(**{**decoder.__dict__, "extra_params": relative_bias})
        layers.append(block_layer(f"decoder.{i}", "cross_decoder", shape, d, arch.dropout, flash, raw_scores))
    tied = "encoder_embedding" if arch.tie_embeddings else None
    layers.append(lm_head_layer("head", s_dec, h, arch.vocab_size, d, tied, transform=False, norm_params=h))
    return layers, s_enc, h


def _build_vit(arch: ViTArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    h = arch.hidden_size
    patches = (arch.image_size // arch.patch_size) ** 2
    s = patches + 1  # the class token
    patch_weights = arch.patch_size**2 * arch.num_channels * h
    pixels = arch.image_size**2 * arch.num_channels
    embedding = LayerSpec(
        name="embedding",
        kind="embedding",
        parameter_count=patch_weights + h + h + s * h,  # patch projection + bias, class token, positions
        tp_split_parameter_count=0,
        forward_flops_per_sample=float(2 * patches * patch_weights),
        boundary_activation_bytes_per_sample=float(pixels * d),
        intermediate_activation_bytes_per_sample=float(s * h * (1 if arch.dropout else 0)),
        intermediate_tp_split_activation_bytes_per_sample=0.0,
    )
    shape = BlockShape(tokens=s, hidden=h, heads=arch.num_heads, head_dim=h // arch.num_heads,
                       kv_heads=arch.num_heads, ffn=arch.ffn_hidden_size or 4 * h, attended_tokens=s)
    flash, raw_scores = arch.attention == "flash", arch.attention == "standard-with-raw-scores"
    layers = [embedding]
    layers += [block_layer(f"encoder.{i}", "encoder", shape, d, arch.dropout, flash, raw_scores)
               for i in range(arch.num_layers)]
    layers.append(classifier_head(s, h, arch.num_classes, d))
    return layers, s, h


def _build_swin(arch: SwinArchitecture, d: int) -> tuple[list[LayerSpec], int, int]:
    side = arch.image_size // arch.patch_size
    c = arch.embed_dim
    flash, raw_scores = arch.attention == "flash", arch.attention == "standard-with-raw-scores"
    window_tokens = arch.window_size**2
    patch_weights = arch.patch_size**2 * arch.num_channels * c
    layers = [
        LayerSpec(
            name="embedding",
            kind="embedding",
            parameter_count=patch_weights + c + 2 * c,  # projection + bias, norm
            tp_split_parameter_count=0,
            forward_flops_per_sample=float(2 * side * side * patch_weights),
            boundary_activation_bytes_per_sample=float(arch.image_size**2 * arch.num_channels * d),
            intermediate_activation_bytes_per_sample=float(side * side * c * d * 2),
            intermediate_tp_split_activation_bytes_per_sample=0.0,
        )
    ]
    for stage, (depth, heads) in enumerate(zip(arch.depths, arch.num_heads)):
        width, tokens = c * 2**stage, (side // 2**stage) ** 2
        if stage:
            # Patch merging: concatenate 2×2 neighbours (4·C/2 channels), norm, project to C.
            in_width, out_tokens = 2 * width, tokens
            layers.append(
                LayerSpec(
                    name=f"merge.{stage}",
                    kind="patch_merging",
                    parameter_count=4 * (width // 2) * width + 2 * 4 * (width // 2),
                    tp_split_parameter_count=4 * (width // 2) * width,
                    forward_flops_per_sample=float(2 * out_tokens * 4 * (width // 2) * width),
                    matmuls=(Matmul(rows_per_sample=out_tokens, out_features=width, in_features=4 * (width // 2),
                                    tp_split="in"),),
                    boundary_activation_bytes_per_sample=float(4 * out_tokens * (width // 2) * d),
                    intermediate_activation_bytes_per_sample=float(out_tokens * in_width * 2 * d),
                    intermediate_tp_split_activation_bytes_per_sample=0.0,
                    tp_allreduce_bytes_per_sample=float(out_tokens * width * d),
                )
            )
        shape = BlockShape(
            tokens=tokens, hidden=width, heads=heads, head_dim=width // heads, kv_heads=heads,
            ffn=int(width * arch.mlp_ratio), attended_tokens=min(window_tokens, tokens),
            extra_params=(2 * arch.window_size - 1) ** 2 * heads,  # relative position bias table
        )
        for block in range(depth):
            layers.append(block_layer(f"stage{stage}.{block}", "encoder", shape, d, arch.dropout, flash, raw_scores))
    last_width, last_tokens = c * 2 ** (len(arch.depths) - 1), (side // 2 ** (len(arch.depths) - 1)) ** 2
    layers.append(classifier_head(last_tokens, last_width, arch.num_classes, d))
    return layers, side * side, last_width


def load_model(path: str | Path, precision: str, seq_length: int | None = None,
               flash_attention: bool | None = None, notes: list[str] | None = None) -> ModelSpec:
    """A ModelSpec from a model recipe (architecture YAML), a profiled layer list, or an HF config.json, trained at
    `seq_length` tokens per sample and with flash attention or not (None: as the file says; an HF config's maximum
    and standard attention, with a line appended to `notes`)."""
    path = Path(path)
    if path.suffix == ".json":
        return build_model(import_hf_config(path, seq_length, flash_attention, notes), precision)
    data = read_yaml(path)
    if "layers" in data:  # a profiled or hand-written layer list
        _refuse_the_previous_profile_format(data, path)
        spec = validate_as(ModelSpec, data, str(path))
        if spec.precision != precision:
            raise SpecError(
                f"{path}: field `precision`: value {spec.precision!r} — its activation bytes were measured "
                f"for {spec.precision}, but the job trains in {precision}; profile again in {precision}"
            )
        _check_measured_settings(spec, path, seq_length, flash_attention)
        return spec
    return build_model(apply_training_settings(data, seq_length, flash_attention, str(path)), precision)


def _check_measured_settings(spec: ModelSpec, path: Path, seq_length: int | None,
                             flash_attention: bool | None) -> None:
    """A layer list was measured (or written) at one sequence length and attention kind; asking for others is an
    error, not a silent mismatch."""
    if seq_length is not None and seq_length != spec.sequence_length:
        raise SpecError(f"{path}: field `sequence_length`: value {spec.sequence_length} — its layers were measured at "
                        f"that length, not the {seq_length} asked for; profile the model again at {seq_length} tokens")
    attention = spec.architecture.attention if spec.architecture is not None else None
    if flash_attention is not None and attention is not None and (attention == "flash") != flash_attention:
        raise SpecError(f"{path}: its layers were measured with {attention} attention; drop --flash-attention / "
                        "`flash_attention` or profile the model again")


def _refuse_the_previous_profile_format(data: dict[str, Any], path: Path) -> None:
    """Profiles written before LayerTimings carried their timings on each layer and the architecture as a JSON
    string; say so, rather than listing every unknown field."""
    layers = data.get("layers")
    old_layer = isinstance(layers, list) and any(isinstance(layer, dict) and "forward_time_per_sample_s" in layer
                                                 for layer in layers)
    if old_layer or isinstance(data.get("architecture"), str):
        raise SpecError(f"{path}: a profile in the format of an earlier gbmw (timings on each layer, the architecture "
                        "as JSON text); profile the model again with `gbmw profile model`")


def load_architecture(path: str | Path, seq_length: int | None = None, flash_attention: bool | None = None) -> Any:
    """The architecture of a model recipe, model YAML or HF config.json (what the runtime builds modules from);
    a layer list (a profile) gives the architecture it was measured from."""
    path = Path(path)
    if path.suffix == ".json":
        return import_hf_config(path, seq_length, flash_attention)
    data = read_yaml(path)
    if "layers" in data:
        return validate_as(ModelSpec, data, str(path)).require_architecture("the runtime")
    return apply_training_settings(data, seq_length, flash_attention, str(path))
