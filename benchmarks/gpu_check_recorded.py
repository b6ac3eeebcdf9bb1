"""gbmw's estimate today beside the H100 step times and peaks recorded by benchmarks/gpu_check.py (no GPU needed):
the same one-device plans of GPT blocks on the H100 recipe reduced to one device, estimated by the code checked
out, against docs/measurements/h100-gpu-check.json (measured on 2026-11-26; docs/gpu-measurements.md).

Usage: python benchmarks/gpu_check_recorded.py
"""
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

import gbmw

ROOT = Path(__file__).resolve().parent.parent
CASES = {  # name: hidden, heads, blocks, global batch, micro-batches, ckpt (benchmarks/gpu_check.py's CASES)
    "h4096-L4-b4-m4": (4096, 32, 4, 4, 4, False),
    "h4096-L4-b8-m2": (4096, 32, 4, 8, 2, False),
    "h4096-L4-b8-m2-ckpt": (4096, 32, 4, 8, 2, True),
    "h5120-L4-b8-m4": (5120, 40, 4, 8, 4, False),
    "h5120-L4-b8-m4-ckpt": (5120, 40, 4, 8, 4, True),
    "h8192-L2-b4-m2": (8192, 64, 2, 4, 2, False),
    "h8192-L2-b8-m2-ckpt": (8192, 64, 2, 8, 2, True),
}

recorded = {row["case"]: row for row in json.loads((ROOT / "docs/measurements/h100-gpu-check.json").read_text())}
with tempfile.TemporaryDirectory() as folder:
    out = Path(folder)
    cluster = yaml.safe_load((ROOT / "recipes/clusters/h100-80g-x64.yaml").read_text())
    cluster.update(name="h100-x1", nodes=1, devices_per_node=1)
    cluster["links"] = [dict(cluster["links"][0], devices=1)]
    (out / "h100-x1.yaml").write_text(yaml.safe_dump(cluster))
    print(f"{'case':22} {'estimate s':>10} {'measured s':>10} {'error':>7} {'estimate GiB':>12} {'measured GiB':>12}")
    errors = []
    for name, (hidden, heads, blocks, batch, micro_batches, ckpt) in CASES.items():
        model = dict(name=name, family="gpt", num_layers=blocks, hidden_size=hidden, num_heads=heads,
                     seq_length=2048, vocab_size=50257, dropout=False, attention="flash", tie_embeddings=True)
        (out / f"{name}.yaml").write_text(yaml.safe_dump(model))
        (out / f"job-{name}.yaml").write_text(yaml.safe_dump(dict(
            model=str(out / f"{name}.yaml"), cluster=str(out / "h100-x1.yaml"), precision="bf16", optimizer="adam",
            global_batch=batch)))
        job = gbmw.load_job(str(out / f"job-{name}.yaml"))
        names = ["single"] + (["single+ckpt"] if ckpt else ["single"]) * blocks + ["single"]
        plan = replace(gbmw.plan_from_strategy_names(job.model, 1, names, [blocks + 2], batch, micro_batches,
                                                     cluster="h100-x1"), precision="bf16")
        estimate = gbmw.estimate(job, plan)
        measured = recorded[name]
        error = estimate.iteration_time_s / measured["measured_s"] - 1
        errors.append(error)
        print(f"{name:22} {estimate.iteration_time_s:10.4f} {measured['measured_s']:10.4f} {100 * error:+6.1f}% "
              f"{estimate.stage_peak_memory_bytes[0] / 2**30:12.2f} {measured['measured_peak_gib']:12.2f}")
    print(f"time error: mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, "
          f"signed mean {100 * sum(errors) / len(errors):+.1f}%")
