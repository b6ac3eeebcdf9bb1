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
