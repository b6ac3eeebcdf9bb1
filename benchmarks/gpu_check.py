"""GPU check: one-device plans of GPT blocks at GPT-3 widths, trained by gbmw's runtime on a CUDA GPU and
measured against gbmw's own estimate for that GPU (the H100 recipe reduced to one device): iteration
time, and peak memory split into forward+backward and the optimizer step (torch.cuda.max_memory_allocated).

Usage, on a machine with a CUDA GPU and gbmw installed: python benchmarks/gpu_check.py recipes OUT_DIR [CASE,...]
(from shared/tools/gpu_check.py, with the imports of the restructured package)
"""
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

recipes, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)

cluster = yaml.safe_load((recipes / "clusters" / "h100-80g-x64.yaml").read_text())
cluster.update(name="h100-x1", nodes=1, devices_per_node=1)
cluster["links"] = [dict(cluster["links"][0], devices=1)]
(out / "h100-x1.yaml").write_text(yaml.safe_dump(cluster))

import gbmw  # noqa: E402
from gbmw.specs.models import load_architecture  # noqa: E402
from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine  # noqa: E402
from gbmw.adapters.runtime.groups import GroupPool  # noqa: E402
from gbmw.adapters.runtime.launch import init_distributed  # noqa: E402
from gbmw.adapters.runtime.model import synthetic_batch  # noqa: E402

context = init_distributed()
print("device", context.device, context.backend, torch.cuda.get_device_name(), flush=True)

ONLY = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
CASES = [  # name, hidden, heads, blocks, global batch, micro-batches, ckpt
    ("h4096-L4-b4-m4", 4096, 32, 4, 4, 4, False),
    ("h4096-L4-b8-m2", 4096, 32, 4, 8, 2, False),
    ("h4096-L4-b8-m2-ckpt", 4096, 32, 4, 8, 2, True),
    ("h5120-L4-b8-m4", 5120, 40, 4, 8, 4, False),
    ("h5120-L4-b8-m4-ckpt", 5120, 40, 4, 8, 4, True),
    ("h8192-L2-b4-m2", 8192, 64, 2, 4, 2, False),
    ("h8192-L2-b8-m2-ckpt", 8192, 64, 2, 8, 2, True),
]
rows = []
for name, hidden, heads, blocks, batch, micro_batches, ckpt in CASES:
    if ONLY and name not in ONLY:
        continue
    model = dict(name=name, family="gpt", num_layers=blocks, hidden_size=hidden, num_heads=heads,
                 seq_length=2048, vocab_size=50257, dropout=False, attention="flash", tie_embeddings=True)
    (out / f"{name}.yaml").write_text(yaml.safe_dump(model))
    job = dict(model=str(out / f"{name}.yaml"), cluster=str(out / "h100-x1.yaml"), precision="bf16",
               optimizer="adam", global_batch=batch)
    (out / f"job-{name}.yaml").write_text(yaml.safe_dump(job))
    spec = gbmw.load_job(str(out / f"job-{name}.yaml"))
    names = ["single"] + (["single+ckpt"] if ckpt else ["single"]) * blocks + ["single"]
    plan = gbmw.plan_from_strategy_names(spec.model, 1, names, [blocks + 2], batch, micro_batches, cluster="h100-x1")
    plan = replace(plan, precision="bf16")
    estimate = gbmw.estimate(spec, plan)
    architecture = load_architecture(out / f"{name}.yaml")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        engine = HybridEngine(plan, architecture, GroupPool(plan), context.device,
                              adam=AdamSettings(learning_rate=1e-4, max_grad_norm=1.0))
        torch.cuda.synchronize()
        states_bytes = torch.cuda.memory_allocated()
        phase_peaks = {}
        original_step = engine.optimizer.step

        def step_with_peaks(*args, **kwargs):  # peak of forward+backward, then of the optimizer step alone
            torch.cuda.synchronize()
            phase_peaks["forward_backward"] = torch.cuda.max_memory_allocated()
            phase_peaks["before_optimizer"] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            result = original_step(*args, **kwargs)
            torch.cuda.synchronize()
            phase_peaks["optimizer"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return result

        engine.optimizer.step = step_with_peaks
        times = []
        for step in range(8):
            data = synthetic_batch(architecture, batch, step, 0)
            if step == 3:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            engine.train_step(data)
            torch.cuda.synchronize()
            if step >= 3:
                times.append(time.perf_counter() - started)
        measured_s = statistics.median(times)
        peak = max(phase_peaks["forward_backward"], phase_peaks["optimizer"])
        held_after = torch.cuda.memory_allocated()
        error = None
    except Exception as failure:  # report and go on
        measured_s, peak, held_after, states_bytes, error = float("nan"), 0, 0, 0, repr(failure)[:300]
        phase_peaks = {}
    finally:
        engine = None
    row = dict(case=name, predicted_s=estimate.iteration_time_s, measured_s=measured_s,
               time_error=(estimate.iteration_time_s / measured_s - 1) if measured_s == measured_s else None,
               predicted_peak_gib=estimate.stage_peak_memory_bytes[0] / 2**30,
               predicted_states_gib=estimate.stage_model_state_bytes[0] / 2**30,
               predicted_act_gib=estimate.stage_activation_bytes[0] / 2**30,
               measured_peak_gib=peak / 2**30, measured_after_init_gib=states_bytes / 2**30,
               measured_held_after_step_gib=held_after / 2**30,
               memory_error=(estimate.stage_peak_memory_bytes[0] / peak - 1) if peak else None,
               mfu_predicted=estimate.mfu, error=error,
               **{f"peak_{k}_gib": v / 2**30 for k, v in phase_peaks.items()})
    rows.append(row)
    print(json.dumps(row), flush=True)

(out / "gpu_check.json").write_text(json.dumps(rows, indent=1))
print(f"{'case':24} {'pred s':>8} {'meas s':>8} {'t err':>7} {'pred GiB':>9} {'meas GiB':>9} {'m err':>7}")
for r in rows:
    te = f"{100 * r['time_error']:+.1f}%" if r["time_error"] is not None else "-"
    me = f"{100 * r['memory_error']:+.1f}%" if r["memory_error"] is not None else "-"
    print(f"{r['case']:24} {r['predicted_s']:8.4f} {r['measured_s']:8.4f} {te:>7} {r['predicted_peak_gib']:9.2f} "
          f"{r['measured_peak_gib']:9.2f} {me:>7}")
