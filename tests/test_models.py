"""Analytic layer costs: published formulas, the paper's parameter counts, HF config import."""

import json

import pytest
import yaml

from gbmw.errors import SpecError
from gbmw.specs.architectures import parse_architecture
from gbmw.specs.bundled import RECIPES_DIR
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.models import build_model, load_model

# The paper's Table 2 parameter counts.
PAPER_PARAMETERS = {
    "bert-huge-32": 672e6, "bert-huge-48": 987e6, "bert-xhuge": 10.2e9,
    "vit-huge-32": 632e6, "vit-huge-48": 947e6, "vit-xhuge": 10.1e9,
    "t5-large-32": 502e6, "t5-large-48": 737e6, "t5-512-4-32": 502e6, "t5-512-4-48": 737e6,
    "swin-huge-32": 701e6, "swin-huge-48": 1016e6,
    "gpt3-15b": 15.4e9, "gpt3-39b": 39.1e9, "gpt3-65b": 64.9e9,
}


@pytest.mark.parametrize("name, expected", sorted(PAPER_PARAMETERS.items()))
def test_recipes_reproduce_the_papers_parameter_counts_within_3_percent(name, expected):
    model = load_model(RECIPES_DIR / "models" / f"{name}.yaml", "bf16")
    assert model.parameter_count == pytest.approx(expected, rel=0.03)


def gpt(**overrides):
    data = dict(family="gpt", name="g", num_layers=2, hidden_size=64, num_heads=4, seq_length=32, vocab_size=100)
    data.update(overrides)
    return parse_architecture(data, "test")


def test_gpt_block_activations_follow_korthikanti_et_al():
    # 16-bit activations: s*b*h*(34 + 5*a*s/h) bytes per block, of which s*b*h*10 is not divided by TP; gbmw also
    # counts the two LayerNorms' fp32 mean and 1/std per token (16 bytes per token, which Korthikanti et al. omit;
    # tests/test_profile_model.py measures them).
    s, h, a = 32, 64, 4
    norm_statistics = s * 2 * 2 * 4
    block = build_model(gpt(), "bf16").layers[1]
    assert block.stashed_activation_bytes_per_sample == pytest.approx(s * h * (34 + 5 * a * s / h) + norm_statistics)
    assert (block.boundary_activation_bytes_per_sample + block.intermediate_activation_bytes_per_sample
            == s * h * 10 + norm_statistics)
    assert block.intermediate_tp_split_activation_bytes_per_sample == pytest.approx(s * h * (24 + 5 * a * s / h))
    flash = build_model(gpt(attention="flash"), "bf16").layers[1]
    assert flash.intermediate_tp_split_activation_bytes_per_sample == pytest.approx(s * h * 24 + a * s * 4)
    # the paper's testbed also kept the raw scores QKᵀ: one more 2-byte score per head and query-key pair (an error
    # of one byte per score, or a score tensor counted per layer instead of per attention, changes the total)
    raw = build_model(gpt(attention="standard-with-raw-scores"), "bf16").layers[1]
    assert (raw.intermediate_tp_split_activation_bytes_per_sample
            == block.intermediate_tp_split_activation_bytes_per_sample + a * s * s * 2)


def test_raw_scores_are_kept_per_attention_of_a_t5_decoder_layer():
    data = yaml.safe_load((RECIPES_DIR / "models" / "t5-large-32.yaml").read_text())
    standard = build_model(parse_architecture(data, "t5"), "fp32")
    raw = build_model(parse_architecture({**data, "attention": "standard-with-raw-scores"}, "t5"), "fp32")
    heads, tokens = data["num_heads"], data["encoder_seq_length"]
    extra = [r.stashed_activation_bytes_per_sample - l.stashed_activation_bytes_per_sample
             for l, r in zip(standard.layers, raw.layers)]
    one_attention = heads * tokens * tokens * 4
    # an encoder layer has one attention, a decoder layer two (self and cross over equally long sequences)
    assert sorted(set(extra)) == [0, one_attention, 2 * one_attention]


def test_gpt_model_flops_equal_megatrons_formula():
    # 3 x forward FLOPs = 72 * s * L * h^2 * (1 + s/(6h) + V/(12 h L)) per sample (Narayanan et al., SC21).
    s, h, L, V = 32, 64, 2, 100
    model = build_model(gpt(bias=False), "bf16")
    megatron = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert 3 * model.forward_flops_per_sample == pytest.approx(megatron)


def test_gpt_parameters_and_tying():
    h, V, s = 64, 100, 32
    model = build_model(gpt(), "fp32")
    block = model.layers[1]
    assert block.parameter_count == 12 * h * h + 13 * h
    assert model.layers[-1].tied_to == "embedding"
    assert model.parameter_count == V * h + s * h + 2 * block.parameter_count + 2 * h
    untied = build_model(gpt(tie_embeddings=False), "fp32")
    assert untied.parameter_count == model.parameter_count + V * h


def test_t5_decoder_carries_the_encoder_output_and_is_imbalanced():
    model = load_model(RECIPES_DIR / "models" / "t5-512-4-32.yaml", "fp32")
    encoder = next(layer for layer in model.layers if layer.kind == "encoder")
    decoder = next(layer for layer in model.layers if layer.kind == "cross_decoder")
    assert decoder.side_input_bytes_per_sample == 512 * 1024 * 4
    assert decoder.parameter_count > encoder.parameter_count  # cross-attention
    assert decoder.stashed_activation_bytes_per_sample < encoder.stashed_activation_bytes_per_sample / 5


def test_swin_stages_differ_in_width_and_tokens():
    model = load_model(RECIPES_DIR / "models" / "swin-huge-32.yaml", "fp32")
    first = model.layers[1]
    last_block = model.layers[-2]
    assert first.parameter_count < last_block.parameter_count
    assert first.stashed_activation_bytes_per_sample > last_block.stashed_activation_bytes_per_sample
    assert [layer.kind for layer in model.layers].count("patch_merging") == 3


HF_CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
             "vocab_size": 50257},
    "llama": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 32, "intermediate_size": 11008, "max_position_embeddings": 4096,
              "vocab_size": 32000, "tie_word_embeddings": False},
    "bert": {"model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2},
    "t5": {"model_type": "t5", "num_layers": 6, "num_decoder_layers": 6, "d_model": 512, "num_heads": 8, "d_kv": 64,
           "d_ff": 2048, "vocab_size": 32128, "feed_forward_proj": "relu"},
    "vit": {"model_type": "vit", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
            "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_channels": 3},
}
# Published parameter counts: GPT-2 124M, LLaMA-2-7B 6.74B, BERT-base 110M, T5-small 60M, ViT-B/16 86M.
HF_PARAMETERS = {"gpt2": 124.4e6, "llama": 6.74e9, "bert": 110e6, "t5": 60.5e6, "vit": 86.6e6}


@pytest.mark.parametrize("kind", sorted(HF_CONFIGS))
def test_hf_config_import(tmp_path, kind):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS[kind]))
    model = load_model(path, "bf16")
    assert model.parameter_count == pytest.approx(HF_PARAMETERS[kind], rel=0.03)


def test_hf_config_errors(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON at line 1"):
        import_hf_config(path)
    path.write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(SpecError, match="model_type.*'mamba'.*supported"):
        import_hf_config(path)
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(SpecError, match="field `n_embd` is required"):
        import_hf_config(path)


def test_heads_must_divide_hidden():
    with pytest.raises(SpecError, match="not divisible by 5 attention heads"):
        parse_architecture(dict(family="gpt", name="g", num_layers=2, hidden_size=64, num_heads=5, seq_length=8,
                                vocab_size=10), "m.yaml")


def test_a_profile_in_the_earlier_format_is_one_clear_error(tmp_path):
    from gbmw.errors import SpecError

    old = {"name": "p", "family": "profiled", "precision": "fp32", "sequence_length": 1, "hidden_size": 1,
           "architecture": '{"name": "p"}',
           "layers": [{"name": "l0", "kind": "encoder", "parameter_count": 1, "tp_split_parameter_count": 0,
                       "forward_flops_per_sample": 1.0, "boundary_activation_bytes_per_sample": 1.0,
                       "intermediate_activation_bytes_per_sample": 0.0,
                       "intermediate_tp_split_activation_bytes_per_sample": 0.0, "forward_time_per_sample_s": 1e-3}]}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(SpecError, match="format of an earlier gbmw .*profile the model again"):
        load_model(path, "fp32")
