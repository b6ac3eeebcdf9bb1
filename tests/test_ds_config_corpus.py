"""`gbmw tune` on 57 real ds_configs from public repositories (tests/ds_configs/, provenance in its README): every
one tunes, or is refused in the one line DeepSpeed itself would give, naming the key; every tuned one starts
`deepspeed.initialize` on a stand-in model and takes a step.

The job: gpt-tiny on two A100s (the bundled a100-80g-x8 recipe cut to 2 devices, so fp16 and bf16 configs plan).
A config whose batch is HF Trainer's "auto", or that sets no batch, is tuned with `--batch 16`, as tune asks.

For speed (CI has 2 cores) the tunes run in this process with the engine check recorded rather than run, and the
recorded configs are then started together in ONE engine-check process (`start_engines`) — exactly the configs tune
would have checked one at a time. `test_tune_refuses_in_one_line_before_writing` runs one tune end to end with its
own engine check, from the command line.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from small_clusters import small_a100_cluster

from gbmw.cli.main import main

pytestmark = pytest.mark.torch

CORPUS = Path(__file__).parent / "ds_configs"
NEEDS_BATCH = "--batch"
"""The first tune of a config without a global batch ("auto" or absent) asks for it in a line naming this flag."""

REMOVED_FROM_DEEPSPEED = "DeepSpeed 0.19 removed the feature and its DeepSpeedConfig refuses the section"
OFFLOAD_WITH_CLIENT_OPTIMIZER = ("ZeRO-Offload without an `optimizer` section: the script's own optimizer (HF "
                                 "Trainer's torch AdamW) is refused unless zero_force_ds_cpu_optimizer is false")
REMOVED_OPTIMIZER = "the 1-bit / 0/1 optimizers are gone from DeepSpeed 0.19 (DEEPSPEED_OPTIMIZERS); the engine refuses"

EXPECTED_REFUSALS: dict[str, tuple[str, str]] = {
    # file: (the key the one line names, why DeepSpeed refuses it)
    "axolotl__deepspeed_configs-zero1_torch_compile.json":
        ("compile.disable", "DeepSpeed 0.19's `compile` section has no `disable`/`backend` (pydantic: extra inputs)"),
    "axolotl__deepspeed_configs-zero2.json": ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER),
    "deepspeed__BingBertSquad-deepspeed_bsz24_fp16_eigenvalue_quantize_config.json":
        ("quantize_training", REMOVED_FROM_DEEPSPEED),
    "deepspeed__Megatron_GPT2-ds_config_func_bs8_zero2_offload.json":
        ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER + " (the old `cpu_offload: true`)"),
    "dsexamples__bert-ds_config.json": ("compression_training", REMOVED_FROM_DEEPSPEED),
    "dsexamples__bing_bert-deepspeed_bsz4k_progressive_layer_drop_config_seq128.json":
        ("progressive_layer_drop", REMOVED_FROM_DEEPSPEED),
    "dsexamples__bing_bert-deepspeed_bsz64k_lamb_config_seq128.json": ("sparse_attention", REMOVED_FROM_DEEPSPEED),
    "dsexamples__finetune-ds_config_gpt2_TEMPLATE.json":
        ("train_batch_size", "a template: `GB_SIZE` is a placeholder, which hjson (DeepSpeed's reader) takes as text"),
    "dsexamples__nccl-deepspeed_bsz4k_01adam_config_seq128_nccl.json": ("optimizer.type", REMOVED_OPTIMIZER),
    "dsexamples__nccl-deepspeed_bsz64k_onebitlamb_config_seq128_nccl.json": ("optimizer.type", REMOVED_OPTIMIZER),
    "dsexamples__nccl-deepspeed_onebitadam_bsz96_config.json": ("optimizer.type", REMOVED_OPTIMIZER),
    "fastchat__playground-deepspeed_config_s2.json": ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER),
    "fastchat__playground-deepspeed_config_s3.json": ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER),
    "llamafactory__deepspeed-ds_z2_offload_config.json": ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER),
    "llamafactory__deepspeed-ds_z3_fp8_config.json":
        ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER + " (it sets it true)"),
    "llamafactory__deepspeed-ds_z3_offload_config.json":
        ("zero_force_ds_cpu_optimizer", OFFLOAD_WITH_CLIENT_OPTIMIZER),
    "megatron-deepspeed__MoE-ds_config_gpt_TEMPLATE.json":
        ("train_batch_size", "a template: `CONFIG_BATCH_SIZE` is a placeholder, text to hjson"),
    "megatron-deepspeed__curriculum_learning-ds_zero_stage_1_config_baseline.json":
        ("optimizer.params.max_grad_norm", "the engine refuses max_grad_norm among optimizer params (use "
                                           "gradient_clipping); DeepSpeedConfig only warns"),
}


class _RecordingChecker:
    """Stands in for tune's EngineChecker: records the config tune would start, for one shared process later."""

    recorded: dict[str, tuple[dict, bool]] = {}

    def __enter__(self) -> "_RecordingChecker":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def check(self, config: dict, where: str, pipeline: bool = False) -> list[str]:
        self.recorded[Path(where).name] = (config, pipeline)
        return []


def _tune(path: Path, cluster: Path, out: Path, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["tune", "--ds-config", str(path), "--model", "gpt-tiny", "--cluster", str(cluster),
                     "-o", str(out), *extra])
    return code, err.getvalue().strip()


def test_every_real_config_tunes_and_starts_or_gets_deepspeeds_one_line(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    from gbmw.adapters import deepspeed as ds
    from gbmw.adapters.deepspeed.engine_check import EngineCase, start_engines

    monkeypatch.setattr(ds, "EngineChecker", _RecordingChecker)
    _RecordingChecker.recorded.clear()
    paths = sorted(CORPUS.glob("*.json"))
    assert len(paths) >= 40
    assert set(EXPECTED_REFUSALS) <= {path.name for path in paths}
    cluster = small_a100_cluster(tmp_path, 2)
    refused: dict[str, str] = {}
    for path in paths:
        out = tmp_path / path.stem
        code, line = _tune(path, cluster, out)
        if code != 0 and NEEDS_BATCH in line:
            out = tmp_path / f"{path.stem}-batch"
            code, line = _tune(path, cluster, out, "--batch", "16")
        if code != 0:
            assert code == 2 and len(line.splitlines()) == 1, (path.name, line)
            refused[path.name] = line
        else:  # the config started below is the one written
            assert json.loads((out / "ds_config.json").read_text()) == _RecordingChecker.recorded[path.name][0]

    names = sorted(_RecordingChecker.recorded)
    outcomes = start_engines([EngineCase(name, *_RecordingChecker.recorded[name]) for name in names])
    for name, outcome in zip(names, outcomes):
        if outcome.refusal is not None:
            refused[name] = f"gbmw: error: {name}: DeepSpeed's engine refuses the config: {outcome.refusal}"
    for name, line in refused.items():
        assert name in EXPECTED_REFUSALS, f"{name} was refused: {line}"
        key, _why = EXPECTED_REFUSALS[name]
        assert f"{key}:" in line or f"`{key}`" in line, (name, key, line)
    assert sorted(refused) == sorted(EXPECTED_REFUSALS)
    started = [name for name in names if name not in refused]
    assert len(started) == len(paths) - len(EXPECTED_REFUSALS) == 39


def test_tune_refuses_in_one_line_before_writing(tmp_path):
    """End to end, with tune's own engine check: DeepSpeedConfig only warns about `max_grad_norm` among the optimizer's
    params, the engine refuses it; the user sees one line naming the key (no DeepSpeed log lines), and no file."""
    pytest.importorskip("deepspeed")
    path = CORPUS / "megatron-deepspeed__curriculum_learning-ds_zero_stage_1_config_baseline.json"
    out = tmp_path / "tuned"
    done = subprocess.run([sys.executable, "-m", "gbmw", "tune", "--ds-config", str(path), "--model", "gpt-tiny",
                           "--cluster", str(small_a100_cluster(tmp_path, 2)), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"gbmw: error: {path}: DeepSpeed's engine refuses")
    assert "optimizer.params.max_grad_norm: 'max_grad_norm' is not supported" in done.stderr
    assert not out.exists()
