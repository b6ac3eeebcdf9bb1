"""gbmw's estimate today beside the H100 step times and peaks recorded by benchmarks/gpu_check.py (no GPU needed):
the same one-device plans of GPT blocks on the H100 recipe reduced to one device, estimated by the code checked
out, against docs/measurements/h100-gpu-check.json (measured on 2026-11-26; docs/gpu-measurements.md).

Usage: python benchmarks/gpu_check_recorded.py
"""
import json
import tempfile
from pathlib import Path

import gbmw
from one_device_plans import GPT, one_device_job_and_plan

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
    print(f"{'case':22} {'estimate s':>10} {'measured s':>10} {'error':>7} {'estimate GiB':>12} {'measured GiB':>12}")
    errors = []
    for name, (hidden, heads, blocks, batch, micro_batches, ckpt) in CASES.items():
        job, plan = one_device_job_and_plan(ROOT / "recipes", Path(folder), name,
                                            dict(GPT, hidden_size=hidden, num_heads=heads), blocks, batch,
                                            micro_batches, ckpt)
        estimate = gbmw.estimate(job, plan)
        measured = recorded[name]
        error = estimate.iteration_time_s / measured["measured_s"] - 1
        errors.append(error)
        print(f"{name:22} {estimate.iteration_time_s:10.4f} {measured['measured_s']:10.4f} {100 * error:+6.1f}% "
              f"{estimate.stage_peak_memory_bytes[0] / 2**30:12.2f} {measured['measured_peak_gib']:12.2f}")
    print(f"time error: mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, "
          f"signed mean {100 * sum(errors) / len(errors):+.1f}%")

# gbmw's own plans validated on 2026-11-27 (benchmarks/gpu_own_plans.py: every layer on the one device, no
# recomputation, as `gbmw plan` chose), and the LLaMA-style and MoE steps profiled on 2026-11-26
# (benchmarks/gpu_step_profile.py: the fastest profiled step)
from gpu_own_plans import CASES as OWN_CASES  # noqa: E402
from one_device_plans import PROFILED_LLAMA_CASES  # noqa: E402

rows = [(row["case"], OWN_CASES[row["case"]], row["micro_batches"], row["measured_s"])
        for row in json.loads((ROOT / "docs/measurements/own-plans-2026-11-27.json").read_text())]
for name, (fields, blocks, batch, micro_batches, _) in PROFILED_LLAMA_CASES.items():
    profile = json.loads((ROOT / f"docs/measurements/profile-{name}.json").read_text())
    rows.append((name, (fields, blocks, batch), micro_batches, min(profile["wall_s_per_step"])))
with tempfile.TemporaryDirectory() as folder:
    print(f"\n{'LLaMA-style and MoE case':22} {'estimate s':>10} {'measured s':>10} {'error':>7}")
    errors = []
    for name, (fields, blocks, batch), micro_batches, measured_s in rows:
        job, plan = one_device_job_and_plan(ROOT / "recipes", Path(folder), name, fields, blocks, batch,
                                            micro_batches, False)
        estimate = gbmw.estimate(job, plan).iteration_time_s
        errors.append(estimate / measured_s - 1)
        print(f"{name:22} {estimate:10.4f} {measured_s:10.4f} {100 * errors[-1]:+6.1f}%")
    print(f"time error: mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, "
          f"signed mean {100 * sum(errors) / len(errors):+.1f}%")
