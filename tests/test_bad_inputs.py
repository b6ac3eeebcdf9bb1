"""Issue 15: every bad input a user can produce ends in one clear line and exit status 2, with no traceback and
nothing written (how long each takes: benchmarks/bad_input_latency.py) — a corpus of bad inputs across every
command and input kind (job, model, cluster, plan, HF config.json, ds_config, hand-tuned config, every flag), and
property tests that generate malformed YAML/JSON and random field values.

Each case is (id, argv, expected part of the message, files): `files` are written into a fresh folder `{d}` first;
the command runs in-process through `gbmw.cli.main.main`. The checkpoint cases (torch) are in test_bad_checkpoints.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gbmw.cli.main import main

JOB = "model: gpt-tiny\ncluster: cpu-x4\nprecision: fp32\nglobal_batch: 16\nmemory_budget: 2.4MiB\n"
MODEL = ("name: m\nfamily: gpt\nnum_layers: 4\nhidden_size: 64\nnum_heads: 4\nseq_length: 32\nvocab_size: 128\n"
         "dropout: false\n")
CLUSTER = """name: c
nodes: 1
devices_per_node: 4
device:
  name: cpu
  memory: 4GiB
  peak_tflops: {fp32: 0.08}
  sustained_tflops: {fp32: 0.08}
  memory_bandwidth_gb_per_s: 29.7
links:
  - {name: shm, devices: 4, bandwidth_gb_per_s: 1, latency_us: 100}
"""
HF = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32, "vocab_size": 128}
HF_MOE = {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "max_position_embeddings": 32, "vocab_size": 128, "num_local_experts": 4,
          "num_experts_per_tok": 2}
HF_DEEPSEEK = {"model_type": "deepseek_v2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "intermediate_size": 128, "max_position_embeddings": 32, "vocab_size": 128, "q_lora_rank": None,
               "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
               "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "first_k_dense_replace": 1, "moe_layer_freq": 1}
LATENT = ("position_embedding: rotary\nbias: false\nlatent_attention:\n  kv_lora_rank: 16\n  qk_nope_head_dim: 16\n"
          "  qk_rope_head_dim: 8\n  v_head_dim: 16\n")
MOE = "moe:\n  num_experts: 4\n  top_k: 2\n  expert_ffn_hidden_size: 128\n"
DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}
ALIAS_BOMB = ('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
              + "".join(f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")))
DEEP = "a: " + "[" * 200 + "]" * 200 + "\n"


def job_with(**fields: str) -> str:
    """The job with some fields replaced by raw YAML text (a field given None is removed)."""
    lines = dict(line.split(": ", 1) for line in JOB.splitlines())
    for key, value in fields.items():
        if value is None:
            lines.pop(key, None)
        else:
            lines[key] = value
    return "".join(f"{key}: {value}\n" for key, value in lines.items())


def model_job(model_text: str, name: str = "m.yaml") -> dict:
    return {name: model_text, "job.yaml": job_with(model=name, global_batch="16")}


def cluster_job(cluster_text: str) -> dict:
    return {"c.yaml": cluster_text, "job.yaml": job_with(cluster="c.yaml", memory_budget=None)}


def good_plan() -> dict:
    from gbmw.handwritten.uniform_config import UniformConfig
    from gbmw.specs.jobs import load_job

    return UniformConfig.parse("micro=1").to_plan(load_job("gpt-tiny_cpu-x4")).to_dict()


def plan_with(**fields) -> str:
    data = good_plan()
    for key, value in fields.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return yaml.safe_dump(data, sort_keys=False)


def ds_with(**fields) -> str:
    return json.dumps({**DS, **fields})


ESTIMATE = ["estimate", "{d}/job.yaml", "--uniform", "micro=1"]
PLAN_FILE = ["estimate", "gpt-tiny_cpu-x4", "--plan", "{d}/plan.yaml"]
TUNE = ["tune", "--ds-config", "{d}/ds.json", "--model", "gpt-tiny", "--cluster", "cpu-x4"]
TRAIN = ["train", "gpt-tiny_cpu-x4", "--plan", "{d}/plan.yaml"]
EXISTING = {"exists.yaml": "mine\n"}

CASES = [
    # ---- flags
    ("max-pp-0", ["plan", "gpt-tiny_cpu-x4", "--max-pp", "0"], "--max-pp: value 0 — must be a power of two", {}),
    ("max-pp-3", ["plan", "gpt-tiny_cpu-x4", "--max-pp", "3"], "--max-pp: value 3 must be a power of two", {}),
    ("batch-huge", ["plan", "gpt-tiny_cpu-x4", "--batch", "1000000000000"], "--batch: value 1000000000000", {}),
    ("batch-negative", ["plan", "gpt-tiny_cpu-x4", "--batch", "-5"], "--batch: value -5", {}),
    ("batch-text", ["plan", "gpt-tiny_cpu-x4", "--batch", "many"], "--batch: value 'many' is not a whole number", {}),
    ("batch-float", ["plan", "gpt-tiny_cpu-x4", "--batch", "16.0"], "--batch: value '16.0' is not a whole number", {}),
    ("memory-0", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "micro=1", "--memory", "0"],
     "--memory: value '0' — a memory size must be positive", {}),
    ("memory-negative", ["plan", "gpt-tiny_cpu-x4", "--memory=-1GiB"], "--memory: value '-1GiB'", {}),
    ("memory-words", ["plan", "gpt-tiny_cpu-x4", "--memory", "lots"], "--memory: value 'lots' is not a memory size", {}),
    ("memory-huge", ["plan", "gpt-tiny_cpu-x4", "--memory", "9999PiB"], "at most 1PiB", {}),
    ("granularity-0", ["plan", "gpt-tiny_cpu-x4", "--granularity", "0"], "--granularity: value '0'", {}),
    ("plan-output-exists", ["plan", "gpt-tiny_cpu-x4", "-o", "{d}/exists.yaml"], "exists.yaml exists; gbmw does not "
     "overwrite", EXISTING),
    ("figure-exists", ["plan", "gpt-tiny_cpu-x4", "--figure", "{d}/exists.yaml"], "exists; gbmw does not overwrite",
     EXISTING),
    ("output-unwritable", ["plan", "gpt-tiny_cpu-x4", "-o", "/proc/plan.yaml"], "/proc/plan.yaml: cannot write there",
     {}),
    ("output-under-a-file", ["plan", "gpt-tiny_cpu-x4", "-o", "{d}/exists.yaml/plan.yaml"], "cannot write there",
     EXISTING),
    ("variant-unknown", ["plan", "gpt-tiny_cpu-x4", "--variant", "nope"], "variant 'nope' is unknown", {}),
    ("target-unknown", ["plan", "gpt-tiny_cpu-x4", "--target", "horovod"], "--target 'horovod' is unknown", {}),
    ("uniform-empty", ["estimate", "gpt-tiny_cpu-x4", "--uniform", ""], "--uniform '': empty", {}),
    ("uniform-twice", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "tp=8,tp=4"], "tp is given twice", {}),
    ("uniform-text", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "tp=x"], "--uniform tp='x': must be an integer", {}),
    ("uniform-zero-4", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "zero=4"], "ZeRO stages are 0, 1, 2 and 3", {}),
    ("uniform-ckpt", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "ckpt=partial"], "write full", {}),
    ("uniform-ckpt-selective", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "ckpt=selective,target=deepspeed"],
     "selective recomputation (+sel): deepspeed does not run it — use --target megatron-core", {}),
    ("uniform-micro-0", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "micro=0"], "micro=0: must be positive", {}),
    ("uniform-key", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "foo=1"], "cannot read 'foo=1'", {}),
    ("uniform-huge", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "micro=99999999999"], "micro=99999999999: too large",
     {}),
    ("uniform-tp-8", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "tp=8"], "devices(4) % (tp * pp = 8) != 0", {}),
    ("uniform-split", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "split=odd"], "--uniform split='odd': write even", {}),
    ("uniform-split-pp4", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "pp=4,split=accounted,target=megatron-core"],
     "4 Transformer blocks + 2 (the embedding and the loss) are not a multiple of pp", {}),
    ("uniform-v-runtime", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "pp=2,v=2"],
     "virtual_stages 2: runtime runs plain 1F1B, not interleaved — use --target megatron-core", {}),
    ("uniform-v-chunks", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "pp=2,v=4,batch=8,target=megatron-core"],
     "interleaving builds 4 equal chunks per stage", {}),
    ("devices-0", ["space", "--devices", "0"], "--devices: value 0", {}),
    ("devices-6", ["space", "--devices", "6"], "6 devices: the search space needs a power-of-two", {}),
    ("devices-huge", ["space", "--devices", "1000000000"], "--devices: value 1000000000", {}),
    ("compare-memory-list", ["compare", "gpt-tiny_cpu-x4", "--memory", "8GiB,0"], "--memory: value '0'", {}),
    ("lr-inf", TRAIN + ["--lr", "inf"], "--lr: value 'inf' — must be a finite number", {}),
    ("lr-negative", TRAIN + ["--lr", "-1"], "--lr: value '-1'", {}),
    ("lr-zero", TRAIN + ["--lr", "0"], "more than 0", {}),
    ("clip-nan", TRAIN + ["--clip-grad", "nan"], "--clip-grad: value 'nan'", {}),
    ("clip-negative", TRAIN + ["--clip-grad", "-1"], "--clip-grad: value '-1'", {}),
    ("timeout-0", TRAIN + ["--timeout", "0"], "--timeout: value '0'", {}),
    ("timeout-inf", TRAIN + ["--timeout", "inf"], "--timeout: value 'inf'", {}),
    ("steps-negative", TRAIN + ["--steps", "-1"], "--steps: value -1", {}),
    ("seed-negative", TRAIN + ["--seed", "-1"], "--seed: value -1", {}),
    ("save-exists", TRAIN + ["--save", "{d}/exists.yaml"], "exists; gbmw does not overwrite", EXISTING),
    ("tune-current-tp-0", TUNE + ["--current-tp", "0"], "--current-tp: value 0", {"ds.json": ds_with()}),
    ("tune-output-file", TUNE + ["-o", "{d}/exists.yaml"], "exists and is not a folder",
     {"ds.json": ds_with(), **EXISTING}),
    ("tune-output-not-empty", TUNE + ["-o", "{d}"], "the folder exists and is not empty", {"ds.json": ds_with()}),
    ("tune-memory-0", TUNE + ["--memory", "0"], "--memory: value '0'", {"ds.json": ds_with()}),
    ("tune-misspelt-zero-key", TUNE, "key `zero_optimisation` is not DeepSpeed's — did you mean `zero_optimization`?",
     {"ds.json": ds_with(zero_optimisation={"stage": 3})}),
    ("profile-precision", ["profile", "model", "gpt-tiny", "-o", "{d}/p.yaml", "--precision", "fp8"],
     "--precision: invalid choice: 'fp8' (choose from 'fp32', 'bf16')", {}),
    ("profile-repeats-0", ["profile", "model", "gpt-tiny", "-o", "{d}/p.yaml", "--repeats", "0"], "--repeats: value 0",
     {}),
    ("profile-output-exists", ["profile", "model", "gpt-tiny", "-o", "{d}/exists.yaml"], "exists", EXISTING),
    ("validate-steps-0", ["validate", "gpt-tiny_cpu-x4", "--plans", "a.yaml", "--steps", "0"], "--steps: value 0", {}),
    ("validate-json-exists", ["validate", "gpt-tiny_cpu-x4", "--plans", "a.yaml", "--json", "{d}/exists.yaml"],
     "exists", EXISTING),
    ("local-rank-text", ["--local_rank=x", "space", "--devices", "8"], "--local_rank/--local-rank: value 'x'", {}),
    ("command-unknown", ["frobnicate"], "invalid choice: 'frobnicate'", {}),
    ("job-missing-argument", ["plan"], "the following arguments are required: job", {}),
    # ---- job files
    ("job-batch-yes", ESTIMATE, "field `global_batch`: value True — must be a whole number",
     {"job.yaml": job_with(global_batch="yes")}),
    ("job-batch-text", ESTIMATE, "field `global_batch`: value '16'", {"job.yaml": job_with(global_batch='"16"')}),
    ("job-batch-float", ESTIMATE, "field `global_batch`: value 16.5", {"job.yaml": job_with(global_batch="16.5")}),
    ("job-batch-0", ESTIMATE, "field `global_batch`: value 0", {"job.yaml": job_with(global_batch="0")}),
    ("job-batch-huge", ESTIMATE, "field `global_batch`: value 1099511627776",
     {"job.yaml": job_with(global_batch=str(2**40))}),
    ("job-max-batch-huge", ["plan", "{d}/job.yaml", "--sweep"], "field `max_global_batch`",
     {"job.yaml": job_with(max_global_batch="1000000000")}),
    ("job-duplicate-key", ESTIMATE, "key 'global_batch' at line 6 appears twice",
     {"job.yaml": JOB + "global_batch: 8\n"}),
    ("job-precision-fp4", ESTIMATE, "field `precision`: value 'fp4'", {"job.yaml": job_with(precision="fp4")}),
    ("job-precision-fp8", ESTIMATE, "precision fp8: device CPU process (one thread) has no FP8 rate",
     {"job.yaml": job_with(precision="fp8")}),
    ("job-fp8-recipe-without-fp8", ESTIMATE, "fp8_recipe current scales FP8 tensors, but the precision is fp32; set "
     "precision: fp8 or drop fp8_recipe", {"job.yaml": job_with(fp8_recipe="current")}),
    ("job-fp8-recipe-blockwise", ESTIMATE, "field `fp8_recipe`: value 'blockwise'",
     {"job.yaml": job_with(fp8_recipe="blockwise")}),
    ("job-optimizer", ESTIMATE, "field `optimizer`: value 'lamb'", {"job.yaml": job_with(optimizer="lamb")}),
    ("job-memory-0", ESTIMATE, "field `memory_budget`: value 0", {"job.yaml": job_with(memory_budget="0")}),
    ("job-memory-no-unit", ESTIMATE, "field `memory_budget`: value 80 — a number without a unit is bytes",
     {"job.yaml": job_with(memory_budget="80")}),
    ("memory-flag-no-unit", ["plan", "gpt-tiny_cpu-x4", "--memory", "80"], "give the unit: 80GiB or 80GB", {}),
    ("plan-and-figure-one-file", ["plan", "gpt-tiny_cpu-x4", "-o", "{d}/out.png", "--figure", "{d}/out.png"],
     "name the same file; give the figure another name", {}),
    ("job-memory-negative", ESTIMATE, "field `memory_budget`: value '-1GiB'",
     {"job.yaml": job_with(memory_budget="-1GiB")}),
    ("job-memory-words", ESTIMATE, "field `memory_budget`: value 'lots'", {"job.yaml": job_with(memory_budget="lots")}),
    ("job-unknown-field", ESTIMATE, "unknown field `globl_batch`", {"job.yaml": JOB + "globl_batch: 8\n"}),
    ("job-no-model", ESTIMATE, "field `model` is required", {"job.yaml": job_with(model=None)}),
    ("job-model-missing", ESTIMATE, "model 'nosuch': no such file or bundled recipe",
     {"job.yaml": job_with(model="nosuch")}),
    ("job-model-number", ESTIMATE, "field `model`: value 7 — must be text", {"job.yaml": job_with(model="7")}),
    ("job-list", ESTIMATE, "expected a mapping of fields at the top level, got list", {"job.yaml": "- a\n- b\n"}),
    ("job-empty", ESTIMATE, "expected a mapping of fields at the top level, got NoneType", {"job.yaml": ""}),
    ("job-bad-yaml", ESTIMATE, "not valid YAML at line", {"job.yaml": "model: [gpt-tiny\n"}),
    ("job-tab", ESTIMATE, "not valid YAML", {"job.yaml": "model:\tgpt\n\tcluster: x\n"}),
    ("job-not-utf8", ESTIMATE, "not UTF-8 text (byte 0xff", {"job.yaml": b"model: gpt-tiny\xff\xfe\n"}),
    ("job-alias-bomb", ESTIMATE, "once its aliases are expanded", {"job.yaml": ALIAS_BOMB}),
    ("job-python-tag", ESTIMATE, "could not determine a constructor for the tag",
     {"job.yaml": 'model: !!python/object/apply:os.system ["touch pwned"]\n'}),
    ("job-recursive-alias", ESTIMATE, "recursive structure", {"job.yaml": "a: &a [*a]\n"}),
    ("job-deep", ESTIMATE, "nested deeper than 32 levels", {"job.yaml": DEEP}),
    ("job-long-string", ESTIMATE, "a value of 20000 characters", {"job.yaml": job_with(name="x" * 20000)}),
    ("job-folder", ["estimate", "{d}", "--uniform", "micro=1"], "no such file or bundled recipe", {}),
    ("job-too-big", ESTIMATE, "larger than 8 MiB", {"job.yaml": "# " + "x" * (9 * 2**20) + "\n"}),
    # ---- model files
    ("model-layers-huge", ESTIMATE, "field `num_layers`: value 100000000", model_job(MODEL.replace(
        "num_layers: 4", "num_layers: 100000000"))),
    ("model-layers-0", ESTIMATE, "field `num_layers`: value 0", model_job(MODEL.replace("num_layers: 4",
                                                                                           "num_layers: 0"))),
    ("model-layers-float", ESTIMATE, "field `num_layers`: value 4.5", model_job(MODEL.replace("num_layers: 4",
                                                                                                 "num_layers: 4.5"))),
    ("model-heads-divide", ESTIMATE, "hidden size 63 is not divisible by 4 attention heads",
     model_job(MODEL.replace("hidden_size: 64", "hidden_size: 63"))),
    ("model-family", ESTIMATE, "field `family`: value 'lstm'", model_job(MODEL.replace("family: gpt", "family: lstm"))),
    ("model-vocab-yes", ESTIMATE, "field `vocab_size`: value True", model_job(MODEL.replace("vocab_size: 128",
                                                                                              "vocab_size: yes"))),
    ("model-seq-inf", ESTIMATE, "field `seq_length`: value inf", model_job(MODEL.replace("seq_length: 32",
                                                                                           "seq_length: .inf"))),
    ("model-heads-negative", ESTIMATE, "field `num_heads`: value -4", model_job(MODEL.replace("num_heads: 4",
                                                                                                "num_heads: -4"))),
    ("model-kv-heads", ESTIMATE, "num_heads 4 is not a multiple of num_kv_heads 3", model_job(MODEL + "num_kv_heads: 3\n")),
    ("model-bert-positions", ESTIMATE, "seq_length 32 exceeds max_position_embeddings 16",
     model_job(MODEL.replace("family: gpt", "family: bert").replace("dropout: false\n", "max_position_embeddings: 16\n"))),
    ("model-attention", ESTIMATE, "field `attention`: value 'fast'", model_job(MODEL + "attention: fast\n")),
    # ---- long sequences (issue 27): a sequence axis that does not divide heads or tokens, a target without it
    ("seq-length-past-positions", ESTIMATE + ["--seq-length", "64"], "seq_length 64 exceeds max_position_embeddings 32",
     model_job(MODEL + "max_position_embeddings: 32\n")),
    ("ulysses-heads", ["estimate", "{d}/job.yaml", "--uniform", "ulysses=4,micro=1"],
     "Ulysses gives each of tp(1) × ulysses(4) ranks whole heads, but the layer has 2 attention heads",
     model_job(MODEL.replace("num_heads: 4", "num_heads: 2"))),
    ("cp-sequence", ["estimate", "{d}/job.yaml", "--uniform", "cp=4,micro=1,target=megatron-core"],
     "cp4 splits each sample's 36 tokens into 8 equal parts; give a sequence length divisible by 8",
     model_job(MODEL.replace("seq_length: 32", "seq_length: 36") + "attention: flash\n")),
    ("cp-target", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "cp=2,micro=1,target=deepspeed"],
     "context parallelism (cp): deepspeed does not run it — use --target megatron-core", {}),
    ("ulysses-target", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "ulysses=2,micro=1,target=megatron-core"],
     "Ulysses (ulysses): megatron-core does not run it — use --target megatron-deepspeed", {}),
    ("model-duplicate", ESTIMATE, "key 'num_layers' at line 9 appears twice", model_job(MODEL + "num_layers: 8\n")),
    ("model-alias-bomb", ESTIMATE, "once its aliases are expanded", model_job(ALIAS_BOMB)),
    ("model-layer-list-negative", ESTIMATE, "field `layers[0].parameter_count`: value -1",
     model_job("name: m\nfamily: profiled\nprecision: fp32\nsequence_length: 1\nhidden_size: 1\nlayers:\n"
               "  - {name: a, kind: encoder, parameter_count: -1, tp_split_parameter_count: 0,\n"
               "     forward_flops_per_sample: 1, boundary_activation_bytes_per_sample: 1,\n"
               "     intermediate_activation_bytes_per_sample: 1, intermediate_tp_split_activation_bytes_per_sample: 1}\n")),
    ("model-layer-list-empty", ESTIMATE, "field `layers`",
     model_job("name: m\nfamily: profiled\nprecision: fp32\nsequence_length: 1\nhidden_size: 1\nlayers: []\n")),
    ("hf-model-type", ESTIMATE, "field `model_type`: value 'mamba'",
     model_job(json.dumps({**HF, "model_type": "mamba"}), "config.json")),
    ("hf-layers-text", ESTIMATE, "field `n_layer`: value '2'",
     model_job(json.dumps({**HF, "n_layer": "2"}), "config.json")),
    ("hf-5000-digit-integer", ESTIMATE, "not readable as JSON: Exceeds the limit (4300 digits)",
     model_job(json.dumps(HF)[:-1] + ', "x": ' + "9" * 5000 + "}", "config.json")),
    ("yaml-5000-digit-integer", ESTIMATE, "not valid YAML: 'Exceeds the limit (4300 digits)",
     model_job("family: gpt\nnum_layers: " + "9" * 5000 + "\n", "model.yaml")),
    ("hf-nan", ESTIMATE, "NaN is not a number gbmw accepts", model_job(json.dumps(HF)[:-1] + ', "x": NaN}',
                                                                        "config.json")),
    ("hf-duplicate", ESTIMATE, "key 'n_layer' appears twice", model_job(json.dumps(HF)[:-1] + ', "n_layer": 3}',
                                                                          "config.json")),
    ("hf-not-json", ESTIMATE, "not valid JSON at line 1", model_job("{n_layer: 2}", "config.json")),
    ("hf-array", ESTIMATE, "expected a JSON object, got list", model_job("[1, 2]", "config.json")),
    ("hf-not-utf8", ESTIMATE, "not UTF-8 text", {"config.json": b'{"model_type": "\xc3\x28"}',
                                                 "job.yaml": job_with(model="config.json")}),
    ("hf-deep", ESTIMATE, "nested deeper than 32 levels", model_job("[" * 5000 + "]" * 5000, "config.json")),
    ("hf-moe-under-dense-type", ESTIMATE, "field `num_experts`: value 8 — a mixture-of-experts setting under "
                                          "model_type 'gpt2'",
     model_job(json.dumps({**HF, "num_experts": 8}), "config.json")),
    ("hf-moe-nested-under-dense-type", ESTIMATE, "field `ffn_config.moe_num_experts`: value 16 — a mixture-of-experts",
     model_job(json.dumps({**HF, "ffn_config": {"moe_num_experts": 16}}), "config.json")),
    ("hf-moe-unknown-key", ESTIMATE, "field `moe_layer_freq`: value 2 — a mixture-of-experts setting gbmw does not "
                                     "model for model_type 'mixtral'",
     model_job(json.dumps({**HF_MOE, "moe_layer_freq": 2}), "config.json")),
    ("hf-moe-top-k", ESTIMATE, "field `num_experts_per_tok`: value 5 — more experts per token than the 4 of "
                               "`num_local_experts`", model_job(json.dumps({**HF_MOE, "num_experts_per_tok": 5}),
                                                                "config.json")),
    ("hf-moe-one-expert", ESTIMATE, "field `num_local_experts`: value 1 — must be at least 2",
     model_job(json.dumps({**HF_MOE, "num_local_experts": 1, "num_experts_per_tok": 1}), "config.json")),
    ("hf-latent-attention-rank-zero", ESTIMATE, "field `kv_lora_rank`: value 0 — must be at least 1",
     model_job(json.dumps({**HF_DEEPSEEK, "kv_lora_rank": 0}), "config.json")),
    ("hf-latent-attention-under-a-dense-type", ESTIMATE, "field `kv_lora_rank`: value 512 — multi-head latent "
                                                         "attention under model_type 'mixtral'",
     model_job(json.dumps({**HF_MOE, "kv_lora_rank": 512}), "config.json")),
    ("hf-deepseek-moe-layer-freq", ESTIMATE, "field `moe_layer_freq`: value 2 — gbmw makes every block from "
                                             "`first_k_dense_replace` on an MoE block",
     model_job(json.dumps({**HF_DEEPSEEK, "moe_layer_freq": 2}), "config.json")),
    ("hf-deepseek-attention-bias", ESTIMATE, "field `attention_bias`: value True — gbmw models DeepSeek's latent "
                                             "attention without biases",
     model_job(json.dumps({**HF_DEEPSEEK, "attention_bias": True}), "config.json")),
    ("model-latent-attention-groups", ESTIMATE, "num_kv_heads 2 with latent_attention: every one of the 4 heads",
     model_job(MODEL.replace("dropout: false\n", "num_kv_heads: 2\ndropout: false\n") + LATENT)),
    ("model-moe-top-k", ESTIMATE, "top_k 5 > num_experts 4", model_job(MODEL + MOE.replace("top_k: 2", "top_k: 5"))),
    ("model-moe-one-expert", ESTIMATE, "field `moe.num_experts`: value 1 — must be at least 2",
     model_job(MODEL + MOE.replace("num_experts: 4", "num_experts: 1"))),
    ("model-moe-dense-block-past-the-end", ESTIMATE, "moe.dense_blocks [0, 4] names a block past the last of 4",
     model_job(MODEL + MOE + "  dense_blocks: [0, 4]\n")),
    ("hf-seq-too-long", ESTIMATE + ["--seq-length", "64"], "field `n_positions`: value 32 — the model takes at most 32",
     model_job(json.dumps(HF), "config.json")),
    ("hf-seq-too-long-job", ESTIMATE, "field `n_positions`: value 32 — the model takes at most 32",
     {"config.json": json.dumps(HF), "job.yaml": job_with(model="config.json", seq_length="64")}),
    ("job-seq-length-0", ESTIMATE, "field `seq_length`: value 0", {"job.yaml": job_with(seq_length="0")}),
    ("job-flash-text", ESTIMATE, "field `flash_attention`: value 'yes please'",
     {"job.yaml": job_with(flash_attention="yes please")}),
    ("seq-length-flag-0", ESTIMATE + ["--seq-length", "0"], "--seq-length: value 0", {}),
    ("tune-auto-batch", TUNE, "key `train_batch_size`: value \"auto\" — HF Trainer fills it",
     {"ds.json": ds_with(train_batch_size="auto")}),
    ("tune-precision-conflict", TUNE + ["--precision", "fp16"], "the config trains in bf16, but --precision fp16",
     {"ds.json": ds_with(bf16={"enabled": True})}),
    # ---- cluster files
    ("cluster-nodes-0", ESTIMATE, "field `nodes`: value 0", cluster_job(CLUSTER.replace("nodes: 1", "nodes: 0"))),
    ("cluster-devices-huge", ESTIMATE, "field `devices_per_node`: value 1000000",
     cluster_job(CLUSTER.replace("devices_per_node: 4", "devices_per_node: 1000000"))),
    ("cluster-memory-0", ESTIMATE, "field `device.memory`: value 0", cluster_job(CLUSTER.replace("memory: 4GiB",
                                                                                                   "memory: 0"))),
    ("cluster-sustained-above-peak", ESTIMATE, "sustained_tflops.fp32 (0.9) exceeds peak_tflops.fp32 (0.08)",
     cluster_job(CLUSTER.replace("sustained_tflops: {fp32: 0.08}", "sustained_tflops: {fp32: 0.9}"))),
    ("cluster-overlap", ESTIMATE, "field `overlap_slowdown`: value 0.5", cluster_job(CLUSTER + "overlap_slowdown: 0.5\n")),
    ("cluster-bandwidth-nan", ESTIMATE, "field `links[0].bandwidth_gb_per_s`: value nan",
     cluster_job(CLUSTER.replace("bandwidth_gb_per_s: 1,", "bandwidth_gb_per_s: .nan,"))),
    ("cluster-links-span", ESTIMATE, "the outermost link level spans 2 devices",
     cluster_job(CLUSTER.replace("devices: 4,", "devices: 2,"))),
    ("cluster-reserved", ESTIMATE, "leaves no usable memory", cluster_job(CLUSTER + "reserved_memory: 8GiB\n")),
    ("cluster-provenance", ESTIMATE, "field `provenance`: value 'guessed'", cluster_job(CLUSTER + "provenance: guessed\n")),
    ("cluster-precision-missing", ["estimate", "{d}/job.yaml", "--uniform", "micro=1"], "has no bf16 FLOP/s",
     {"c.yaml": CLUSTER, "job.yaml": job_with(cluster="c.yaml", precision="bf16", memory_budget=None)}),
    # ---- plan files
    ("plan-negative-micro", PLAN_FILE, "micro_batch -1: must be a whole number from 1",
     {"plan.yaml": plan_with(micro_batch=-1, num_micro_batches=-16)}),
    ("plan-train-negative-micro", TRAIN, "micro_batch -1: must be a whole number from 1",
     {"plan.yaml": plan_with(micro_batch=-1, num_micro_batches=-16)}),
    ("plan-batch-yes", PLAN_FILE, "field `global_batch`: value True — must be a whole number",
     {"plan.yaml": plan_with(global_batch=True)}),
    ("plan-precision-fp4", PLAN_FILE, "precision 'fp4' is not one of", {"plan.yaml": plan_with(precision="fp4")}),
    ("plan-precision-fp8", PLAN_FILE, "plan is for precision fp8 but the job trains gpt-tiny in fp32",
     {"plan.yaml": plan_with(precision="fp8")}),
    ("plan-precision-other", PLAN_FILE, "plan is for precision bf16 but the job trains gpt-tiny in fp32",
     {"plan.yaml": plan_with(precision="bf16")}),
    ("plan-pp-0", PLAN_FILE, "pp 0: must be a whole number from 1", {"plan.yaml": plan_with(pp=0)}),
    ("plan-partition-sum", PLAN_FILE, "sum(partition [5]) = 5 != 6 strategies", {"plan.yaml": plan_with(partition=[5])}),
    ("plan-partition-text", PLAN_FILE, "field `partition`: value '3,3'", {"plan.yaml": plan_with(partition="3,3")}),
    ("plan-layers-huge", PLAN_FILE, "field `strategies[0].layers`: value 10000000000",
     {"plan.yaml": plan_with(strategies=[{"strategy": "dp4", "layers": 10**10}])}),
    ("plan-layers-0", PLAN_FILE, "field `strategies[0].layers`: value 0",
     {"plan.yaml": plan_with(strategies=[{"strategy": "dp4", "layers": 0}])}),
    ("plan-strategy-name", PLAN_FILE, "layer 0 uses tp3 over 3 devices",
     {"plan.yaml": plan_with(strategies=[{"strategy": "tp3", "layers": 6}])}),
    ("plan-strategy-number", PLAN_FILE, "field `strategies[0].strategy`: value 4",
     {"plan.yaml": plan_with(strategies=[{"strategy": 4, "layers": 6}])}),
    ("plan-model-list", PLAN_FILE, "field `model`: value [1, 2]", {"plan.yaml": plan_with(model=[1, 2])}),
    ("plan-other-model", PLAN_FILE, "field `model`: value 'llama-tiny' — the job trains gpt-tiny; plan it with",
     {"plan.yaml": plan_with(model="llama-tiny")}),
    ("plan-target", PLAN_FILE, "target 'nope' is not one of", {"plan.yaml": plan_with(target="nope")}),
    ("plan-estimate-garbage", PLAN_FILE, "field `estimate`: value 'fast'", {"plan.yaml": plan_with(estimate="fast")}),
    ("plan-unknown-field", PLAN_FILE, "unknown field(s) ['speed']", {"plan.yaml": plan_with(speed=1)}),
    ("plan-missing-field", PLAN_FILE, "field(s) ['pp'] are required", {"plan.yaml": plan_with(pp=None)}),
    ("plan-layers-model", PLAN_FILE, "plan has 7 layer strategies but model gpt-tiny has 6 layers",
     {"plan.yaml": plan_with(strategies=[{"strategy": "dp4", "layers": 7}], partition=[7])}),
    ("plan-devices", PLAN_FILE, "layer 0 uses dp4 over 4 devices, but each stage has num_devices(8)",
     {"plan.yaml": plan_with(num_devices=8)}),
    ("plan-target-cannot-run", PLAN_FILE, "megatron-core cannot run this plan",
     {"plan.yaml": plan_with(target="megatron-core", strategies=[{"strategy": "dp4", "layers": 3},
                                                                 {"strategy": "sdp4", "layers": 3}])}),
    ("plan-train-gpipe", TRAIN, "schedule gpipe with virtual_stages 1 — gbmw's runtime runs the plain 1F1B",
     {"plan.yaml": plan_with(schedule="gpipe")}),
    ("plan-train-sequence-parallel-head", TRAIN,
     "layer 0 (embedding) uses tp2-dp2+sp — gbmw's runtime runs sequence parallelism (+sp) in Transformer blocks only",
     {"plan.yaml": plan_with(target="megatron-core", strategies=[{"strategy": "tp2-dp2+sp", "layers": 6}])}),
    ("plan-validate-sequence-parallel-head", ["validate", "gpt-tiny_cpu-x4", "--plans", "{d}/plan.yaml"],
     "layer 0 (embedding) uses tp2-dp2+sp — gbmw's runtime runs sequence parallelism (+sp) in Transformer blocks",
     {"plan.yaml": plan_with(target="megatron-core", strategies=[{"strategy": "tp2-dp2+sp", "layers": 6}])}),
    ("plan-selective-target-cannot-run", PLAN_FILE, "selective recomputation (+sel): deepspeed does not run it",
     {"plan.yaml": plan_with(target="deepspeed", strategies=[{"strategy": "dp4+sel", "layers": 6}])}),
    ("plan-list", PLAN_FILE, "expected a mapping, got list", {"plan.yaml": "- 1\n"}),
    ("plan-not-utf8", PLAN_FILE, "not UTF-8 text", {"plan.yaml": b"\x80model: x\n"}),
    ("plan-alias-bomb", PLAN_FILE, "once its aliases are expanded", {"plan.yaml": ALIAS_BOMB}),
    ("plan-missing-file", PLAN_FILE, "plan.yaml: no such plan", {}),
    ("plan-train-model", TRAIN, "field `model`: value 'bert-tiny' — the job trains gpt-tiny",
     {"plan.yaml": plan_with(model="bert-tiny")}),
    # ---- ds_config (tune)
    ("ds-stage-three", TUNE, "key `zero_optimization.stage`: value 'three'",
     {"ds.json": ds_with(zero_optimization={"stage": "three"})}),
    ("ds-stage-7", TUNE, "key `zero_optimization.stage`: value 7", {"ds.json": ds_with(zero_optimization={"stage": 7})}),
    ("ds-optimizer-text", TUNE, "key `optimizer`: value 'adam' — must be an object", {"ds.json": ds_with(optimizer="adam")}),
    ("ds-fp16-and-bf16", TUNE, "fp16 and bf16 are both enabled",
     {"ds.json": ds_with(fp16={"enabled": True}, bf16={"enabled": True})}),
    ("ds-bf16-true", TUNE, "key `bf16`: value True — must be an object", {"ds.json": ds_with(bf16=True)}),
    ("ds-enabled-text", TUNE, "key `fp16.enabled`: value 'yes'", {"ds.json": ds_with(fp16={"enabled": "yes"})}),
    ("ds-clipping-text", TUNE, "key `gradient_clipping`: value 'x'", {"ds.json": ds_with(gradient_clipping="x")}),
    ("ds-lr-text", TUNE, "key `optimizer.params.lr`: value 'fast'",
     {"ds.json": ds_with(optimizer={"type": "Adam", "params": {"lr": "fast"}})}),
    ("ds-params-list", TUNE, "key `optimizer.params`: value [1]", {"ds.json": ds_with(optimizer={"params": [1]})}),
    ("ds-batch-bool", TUNE, "key `train_batch_size`: value True", {"ds.json": ds_with(train_batch_size=True)}),
    ("ds-batch-0", TUNE, "key `train_batch_size`: value 0", {"ds.json": ds_with(train_batch_size=0)}),
    ("ds-batch-inconsistent", TUNE, "inconsistent batch sizes", {"ds.json": ds_with(gradient_accumulation_steps=3)}),
    ("ds-nan", TUNE, "NaN is not a number DeepSpeed accepts", {"ds.json": ds_with()[:-1] + ', "gradient_clipping": NaN}'}),
    ("ds-duplicate", TUNE, "key 'train_batch_size' appears twice", {"ds.json": ds_with()[:-1] + ', "train_batch_size": 8}'}),
    ("ds-not-json", TUNE, "not valid JSON at line 1", {"ds.json": "{train_batch_size: [}"}),
    ("ds-list", TUNE, "a DeepSpeed config is a JSON object", {"ds.json": "[1]"}),
    ("ds-not-utf8", TUNE, "not UTF-8 text", {"ds.json": b'{"train_batch_size": 16, "x": "\xff"}'}),
    ("ds-missing", TUNE, "ds.json: no such DeepSpeed config file", {}),
    ("ds-no-batch", TUNE, "sets no batch (neither train_batch_size nor train_micro_batch_size_per_gpu), so it does "
                          "not say the global batch; give it with --batch", {"ds.json": "{}"}),
    ("ds-deep", TUNE, "nested", {"ds.json": '{"a": ' + "[" * 5000 + "]" * 5000 + "}"}),
    # ---- a file of one kind given where another kind goes
    ("plan-as-job", ["estimate", "{d}/plan.yaml", "--uniform", "micro=1"], "this is a plan (it has strategies, "
     "partition), not a job", {"plan.yaml": plan_with()}),
    ("job-as-plan", PLAN_FILE, "this is a job (it has model, cluster, precision), not a plan",
     {"plan.yaml": JOB}),
    ("cluster-as-model", ESTIMATE, "this is a cluster (it has devices_per_node, links), not a model",
     {"c.yaml": CLUSTER, "job.yaml": job_with(model="c.yaml")}),
    ("model-as-cluster", ESTIMATE, "this is a model (it has family), not a cluster",
     {"m.yaml": MODEL, "job.yaml": job_with(cluster="m.yaml")}),
    ("uniform-target", ["estimate", "gpt-tiny_cpu-x4", "--uniform", "target=nope"], "--uniform target='nope'", {}),
    # ---- hand-tuned configurations (compare --handtuned)
    ("handtuned-missing", ["compare", "gpt-tiny_cpu-x4", "--handtuned", "{d}/h.yaml"],
     "hand-tuned configuration '", {}),
    ("handtuned-duplicate", ["compare", "gpt-tiny_cpu-x4", "--handtuned", "{d}/h.yaml"], "appears twice",
     {"h.yaml": "name: h\nname: i\n"}),
]


def write_files(folder: Path, files: dict) -> None:
    for name, content in files.items():
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def snapshot(folder: Path) -> dict:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def run_bad(folder: Path, argv: list[str], capsys) -> tuple[int, str, str]:
    """Run gbmw on a bad input in `folder` (how long it takes is benchmarks/bad_input_latency.py's, not a test's)."""
    argv = [part.replace("{d}", str(folder)) for part in argv]
    before = snapshot(folder)
    status = main(argv)
    captured = capsys.readouterr()
    assert snapshot(folder) == before, "a bad input wrote or changed a file"
    assert not any(folder.parent.glob(".*.partial-*"))
    return status, captured.out, captured.err


def assert_one_line(status: int, err: str, expected: str) -> None:
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gbmw: error: "), err
    assert expected in lines[0], lines[0]
    assert len(lines[0]) < 1200, f"{len(lines[0])} characters"


def test_the_corpus_is_large_and_named_uniquely():
    names = [case[0] for case in CASES]
    assert len(names) >= 80 and len(set(names)) == len(names)


@pytest.mark.parametrize("name, argv, expected, files", CASES, ids=[case[0] for case in CASES])
def test_bad_input_ends_in_one_clear_line(name, argv, expected, files, tmp_path, capsys):
    write_files(tmp_path, files)
    status, out, err = run_bad(tmp_path, argv, capsys)
    assert_one_line(status, err, expected)


# ------------------------------------------------------------------------------------------------ property tests

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=4), max_leaves=12)


def assert_refused(factory, capsys, files: dict, argv: list[str], expected: str) -> None:
    """`files` written into a new folder, then `argv`: one line with `expected` ("{d}" is the folder), status 2."""
    folder = factory.mktemp("case")
    write_files(folder, files)
    status, _, err = run_bad(folder, argv, capsys)
    assert_one_line(status, err, expected.replace("{d}", str(folder)))


@PROPERTY
@given(text=st.text(max_size=200))
def test_any_text_as_a_job_file(text, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"job.yaml": text}, ESTIMATE, "{d}/job.yaml")


@PROPERTY
@given(data=st.binary(max_size=200))
def test_any_bytes_as_a_plan_file(data, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"plan.yaml": data}, PLAN_FILE, "{d}/plan.yaml")


@PROPERTY
@given(text=st.text(max_size=200))
def test_any_text_as_a_ds_config(text, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"ds.json": text}, TUNE, "")


@PROPERTY
@given(config=st.dictionaries(st.sampled_from(["zero_optimization", "optimizer", "fp16", "bf16", "bfloat16",
                                                "activation_checkpointing", "gradient_clipping"]), json_values))
def test_random_ds_config_sections_without_a_batch(config, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"ds.json": json.dumps(config)}, TUNE, "{d}/ds.json")


bad_integers = (st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
                | st.integers(max_value=0) | st.integers(min_value=2**20 + 1) | st.lists(st.integers(), max_size=2)
                | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2))


def yaml_with(text: str, field: str, value) -> str:
    data = yaml.safe_load(text)
    data[field] = value
    return yaml.safe_dump(data)


@PROPERTY
@given(field=st.sampled_from(["global_batch", "max_global_batch"]), value=bad_integers)
def test_random_bad_values_of_a_job_field(field, value, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"job.yaml": yaml_with(JOB, field, value)}, ESTIMATE, f"field `{field}`")


@PROPERTY
@given(field=st.sampled_from(["num_devices", "global_batch", "micro_batch", "num_micro_batches", "pp"]),
       value=bad_integers)
def test_random_bad_values_of_a_plan_field(field, value, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, {"plan.yaml": plan_with(**{field: value})}, PLAN_FILE, field)


@PROPERTY
@given(field=st.sampled_from(["num_layers", "hidden_size", "num_heads", "vocab_size"]), value=bad_integers)
def test_random_bad_values_of_a_model_field(field, value, tmp_path_factory, capsys):
    assert_refused(tmp_path_factory, capsys, model_job(yaml_with(MODEL, field, value)), ESTIMATE, "{d}/m.yaml")


bad_numbers = (st.booleans() | st.floats(max_value=0.99) | st.floats(min_value=11, allow_infinity=True)
               | st.just(float("nan")) | st.text(max_size=6) | st.lists(st.floats(), max_size=2))


@PROPERTY
@given(field=st.sampled_from(["nodes", "devices_per_node", "overlap_slowdown"]), value=bad_integers | bad_numbers)
def test_random_bad_values_of_a_cluster_field(field, value, tmp_path_factory, capsys):
    if field == "overlap_slowdown" and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 1 <= value <= 10:
        return  # a valid slowdown (bad_integers draws floats too: 1.0 is one)
    assert_refused(tmp_path_factory, capsys, cluster_job(yaml_with(CLUSTER, field, value)), ESTIMATE, "{d}/c.yaml")


def _not_a_whole_number(text: str) -> bool:
    try:
        int(text, 10)
    except ValueError:
        return True
    return False


bad_flag_numbers = (st.integers(max_value=0).map(str) | st.integers(min_value=2**60).map(str)
                    | st.sampled_from(["nan", "inf", "-inf", "1e3", "", " ", "0x10", "½", "1,000"])
                    | st.text(max_size=12).filter(_not_a_whole_number))
FLAG_COMMANDS = {
    "--batch": ["plan", "gpt-tiny_cpu-x4"],
    "--max-pp": ["plan", "gpt-tiny_cpu-x4"],
    "--devices": ["space"],
    "--steps": ["train", "gpt-tiny_cpu-x4", "--plan", "p.yaml"],
    "--seed": ["train", "gpt-tiny_cpu-x4", "--plan", "p.yaml"],
    "--current-tp": ["tune", "--ds-config", "d.json", "--model", "gpt-tiny", "--cluster", "cpu-x4"],
}


@PROPERTY
@given(flag=st.sampled_from(sorted(FLAG_COMMANDS)), value=bad_flag_numbers)
def test_random_bad_values_of_whole_number_flags(flag, value, tmp_path_factory, capsys):
    if flag == "--steps" and value.strip() == "0" or flag == "--seed" and value.strip().lstrip("+-0") == "":
        return  # 0 steps and seed 0 are valid
    assert_refused(tmp_path_factory, capsys, {}, FLAG_COMMANDS[flag] + [f"{flag}={value}"], f"argument {flag}")


@PROPERTY
@given(flag=st.sampled_from(["--lr", "--clip-grad", "--timeout"]),
       value=st.sampled_from(["nan", "inf", "-inf", "-1", "1e400", "", "x", "1e9"]) | st.text(max_size=8))
def test_random_bad_values_of_number_flags(flag, value, tmp_path_factory, capsys):
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is not None and (flag == "--lr" and 0 < number <= 10 or flag == "--clip-grad" and 0 <= number <= 1e6
                               or flag == "--timeout" and 1 <= number <= 7 * 86_400):
        return  # a valid value
    assert_refused(tmp_path_factory, capsys, {}, ["train", "gpt-tiny_cpu-x4", "--plan", "p.yaml", f"{flag}={value}"],
                   f"argument {flag}")


@PROPERTY
@given(value=st.text(max_size=12) | st.integers(max_value=0).map(str) | st.sampled_from(["-1GiB", "0B", "nan", "9EiB"]))
def test_random_bad_memory_flags(value, tmp_path_factory, capsys):
    from gbmw.specs.schema import parse_bytes

    try:
        parse_bytes(value, "x")
        return  # a valid size
    except Exception:  # noqa: BLE001 - any refusal: the flag must refuse it too
        pass
    assert_refused(tmp_path_factory, capsys, {}, ["plan", "gpt-tiny_cpu-x4", f"--memory={value}"], "argument --memory")


def test_a_fifo_as_a_plan_does_not_hang(tmp_path, capsys):
    os.mkfifo(tmp_path / "plan.yaml")
    status, _, err = run_bad(tmp_path, PLAN_FILE, capsys)
    assert_one_line(status, err, "plan.yaml: not a regular file")


def test_no_case_runs_a_yaml_tag(tmp_path, capsys):
    """The python tag of the corpus would create `pwned` if it ran."""
    write_files(tmp_path, {"job.yaml": 'model: !!python/object/apply:os.system ["touch pwned"]\n'})
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        status, _, err = run_bad(tmp_path, ESTIMATE, capsys)
    finally:
        os.chdir(cwd)
    assert status == 2 and not (tmp_path / "pwned").exists()
