"""A Hugging Face config.json (GPT-2, LLaMA/Mistral/Qwen2, BERT/RoBERTa, T5/mT5, ViT) read into gbmw's
architecture types, from the file alone (no transformers import, nothing downloaded or executed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gbmw.architectures import parse_architecture
from gbmw.errors import SpecError
from gbmw.files import read_json, shown


def import_hf_config(path: str | Path) -> Any:
    """An architecture from a Hugging Face config.json (GPT-2, LLaMA-style, BERT/RoBERTa, T5, ViT)."""
    path = Path(path)
    config = read_json(path, "Hugging Face config.json")
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    name = config.get("_name_or_path") or path.parent.name or path.stem
    source = f"Hugging Face config {path}"
    where = str(path)

    def need(*keys: str) -> Any:
        for key in keys:
            if key in config:
                return config[key]
        raise SpecError(f"{where}: field `{keys[0]}` is required for model_type {shown(model_type)}")

    if model_type == "gpt2":
        data = dict(
            family="gpt", num_layers=need("n_layer"), hidden_size=need("n_embd"), num_heads=need("n_head"),
            ffn_hidden_size=config.get("n_inner"), seq_length=need("n_positions", "n_ctx"),
            vocab_size=need("vocab_size"), tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type in ("llama", "mistral", "qwen2"):
        data = dict(
            family="gpt", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), num_kv_heads=config.get("num_key_value_heads"),
            ffn_hidden_size=need("intermediate_size"), seq_length=need("max_position_embeddings"),
            vocab_size=need("vocab_size"), gated_mlp=True, bias=False, norm="rms", position_embedding="rotary",
            tie_embeddings=config.get("tie_word_embeddings", False), dropout=False,
        )
    elif model_type in ("bert", "roberta"):
        data = dict(
            family="bert", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            seq_length=need("max_position_embeddings"), max_position_embeddings=need("max_position_embeddings"),
            vocab_size=need("vocab_size"), type_vocab_size=config.get("type_vocab_size", 2),
        )
    elif model_type in ("t5", "mt5"):
        seq = config.get("n_positions", 512)
        data = dict(
            family="t5", num_encoder_layers=need("num_layers"),
            num_decoder_layers=config.get("num_decoder_layers") or need("num_layers"),
            hidden_size=need("d_model"), num_heads=need("num_heads"), head_dim=need("d_kv"),
            ffn_hidden_size=need("d_ff"), encoder_seq_length=seq, decoder_seq_length=seq,
            vocab_size=need("vocab_size"),
            gated_mlp=str(config.get("feed_forward_proj", "relu")).startswith("gated"),
            tie_embeddings=config.get("tie_word_embeddings", True),
        )
    elif model_type == "vit":
        data = dict(
            family="vit", num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
            num_heads=need("num_attention_heads"), ffn_hidden_size=need("intermediate_size"),
            image_size=need("image_size"), patch_size=need("patch_size"),
            num_channels=config.get("num_channels", 3),
            num_classes=len(config["id2label"]) if isinstance(config.get("id2label"), dict) else 1000,
        )
    else:
        raise SpecError(
            f"{where}: field `model_type`: value {shown(model_type)} — supported: gpt2, llama, mistral, qwen2, "
            "bert, roberta, t5, mt5, vit; or write a model recipe YAML (see recipes/models/)"
        )
    data = {key: value for key, value in data.items() if value is not None}
    return parse_architecture({"name": str(name), "source": source, **data}, where)
