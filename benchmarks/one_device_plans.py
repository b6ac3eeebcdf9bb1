"""The one-device jobs and plans the GPU scripts share (benchmarks/gpu_step_profile.py, gpu_check_recorded.py): the
H100 recipe reduced to one device, a model of a few blocks, and the plan that runs every layer on that device
(checkpointing the blocks or not), as benchmarks/gpu_check.py builds them."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

import gbmw

GPT = dict(family="gpt", seq_length=2048, vocab_size=50257, dropout=False, attention="flash", tie_embeddings=True)
"""GPT blocks as benchmarks/gpu_check.py trains them (add hidden_size and num_heads)."""
LLAMA = dict(family="gpt", seq_length=2048, vocab_size=32000, dropout=False, attention="flash", tie_embeddings=False,
             gated_mlp=True, bias=False, norm="rms", position_embedding="rotary")
"""LLaMA-style blocks: RMSNorm, rotary positions, SwiGLU, no biases, untied head (add the widths)."""
PROFILED_LLAMA_CASES = {  # name: model fields, blocks, global batch, micro-batches, ckpt (benchmarks/gpu_step_profile.py)
    # dense, and as mixtures of experts (Mixtral-like 8 × top-2, Qwen3-MoE-like 64 × top-8)
    "llama-h4096-L2-b4-m2": (dict(LLAMA, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336),
                             2, 4, 2, False),
    "moe8-h4096-L2-b4-m2": (dict(LLAMA, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=7168,
                                 moe=dict(num_experts=8, top_k=2, expert_ffn_hidden_size=7168)), 2, 4, 2, False),
    "moe64-h2048-L2-b8-m2": (dict(LLAMA, hidden_size=2048, num_heads=16, num_kv_heads=4, ffn_hidden_size=768,
                                  moe=dict(num_experts=64, top_k=8, expert_ffn_hidden_size=768)), 2, 8, 2, False),
}


def one_device_job_and_plan(recipes: Path, out: Path, name: str, model_fields: dict, blocks: int, batch: int,
                            micro_batches: int, ckpt: bool):
    """(job, plan) of `blocks` blocks of `model_fields` on one H100, files written under `out`; every block
    checkpointed with `ckpt`, bf16."""
    cluster = yaml.safe_load((recipes / "clusters" / "h100-80g-x64.yaml").read_text())
    cluster.update(name="h100-x1", nodes=1, devices_per_node=1)
    cluster["links"] = [dict(cluster["links"][0], devices=1)]
    (out / "h100-x1.yaml").write_text(yaml.safe_dump(cluster))
    (out / f"{name}.yaml").write_text(yaml.safe_dump(dict(model_fields, name=name, num_layers=blocks)))
    (out / f"job-{name}.yaml").write_text(yaml.safe_dump(dict(
        model=str(out / f"{name}.yaml"), cluster=str(out / "h100-x1.yaml"), precision="bf16", optimizer="adam",
        global_batch=batch)))
    job = gbmw.load_job(str(out / f"job-{name}.yaml"))
    names = ["single"] + (["single+ckpt"] if ckpt else ["single"]) * blocks + ["single"]
    plan = replace(gbmw.plan_from_strategy_names(job.model, 1, names, [blocks + 2], batch, micro_batches,
                                                 cluster="h100-x1"), precision="bf16")
    return job, plan
