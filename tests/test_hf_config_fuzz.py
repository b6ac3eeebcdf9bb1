"""Issue 31: Hypothesis-generated HF config.json files. Each case takes one of the real config.json files in
tests/hf_configs, replaces one key's value with a random JSON value (or removes the key), and imports and builds
the model: the result is a model or one GbmwError line naming the file — never another exception (a traceback to
the user) and never a line without the file's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gbmw.errors import GbmwError
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.models import build_model

CONFIGS = sorted(path for path in (Path(__file__).parent / "hf_configs").glob("*.json"))
REMOVED = object()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | st.text(max_size=8)
    | st.sampled_from([0, -1, 1, 2**31, 2**63, 10**4000, 0.5, 1e308, "auto", "", "64"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)


def _mutated(data: st.DataObject) -> tuple[Path, dict]:
    source = data.draw(st.sampled_from(CONFIGS), label="config")
    config = json.loads(source.read_text())
    if not isinstance(config, dict) or not config:
        return source, config
    key = data.draw(st.sampled_from(sorted(config)), label="key")
    value = data.draw(st.just(REMOVED) | json_values, label="value")
    if value is REMOVED:
        del config[key]
    else:
        config[key] = value
    return source, config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_real_config_is_a_model_or_one_line(data, tmp_path_factory):
    """Catches: a TypeError/KeyError/OverflowError/ZeroDivisionError from a value of the wrong type or size reaching
    arithmetic, and an error that does not say which file it is about."""
    source, config = _mutated(data)
    folder = tmp_path_factory.mktemp("hf")
    path = folder / "config.json"
    path.write_text(json.dumps(config, allow_nan=True))
    try:
        build_model(import_hf_config(path), "bf16")
    except GbmwError as error:
        message = str(error)
        assert "\n" not in message and str(path) in message, (source.name, message)


@pytest.mark.parametrize("source", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_every_real_config_imports_or_is_refused_in_one_line(source, tmp_path):
    """The unmutated files: what the property mutates must itself be a starting point that imports (or, for the
    files kept as refusal examples, is one line)."""
    try:
        build_model(import_hf_config(source), "bf16")
    except GbmwError as error:
        assert "\n" not in str(error) and str(source) in str(error)


FOUND = [  # what the property (and a longer run of it) found, kept as cases: each was a traceback or a hang
    ("Qwen3-30B-A3B", "model_type", []),  # TypeError: unhashable type (the experts' key lookup)
    ("opt-1.3b", "activation_function", []),  # TypeError: unhashable type
    ("Meta-Llama-3-8B", "rope_theta", 10**400),  # OverflowError: int too large to convert to float
    ("Qwen2-57B-A14B", "num_hidden_layers", 2**63),  # listed 2**63 blocks before any check: a hang
    ("Qwen3-30B-A3B", "num_hidden_layers", 2**31),
    ("DeepSeek-V3", "num_hidden_layers", 2**70),
    ("Qwen3-14B", "head_dim", 18725),  # pydantic's ValidationError: the fused QKV projection 56 × 18725 > 2^20 wide
]


@pytest.mark.parametrize(("stem", "key", "value"), FOUND, ids=[f"{case[0]}-{case[1]}" for case in FOUND])
def test_what_the_property_found_is_one_line(stem, key, value, tmp_path):
    config = json.loads((Path(__file__).parent / "hf_configs" / f"{stem}.json").read_text())
    config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(GbmwError) as raised:
        build_model(import_hf_config(path), "bf16")
    assert "\n" not in str(raised.value) and str(path) in str(raised.value) and key in str(raised.value)
