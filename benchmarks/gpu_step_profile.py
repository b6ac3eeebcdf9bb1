"""Where one training step of gbmw's runtime spends its GPU time, beside gbmw's estimate of the same plan (issue
28: the estimate of one-device plans is 21–47 % faster than the step measured by benchmarks/gpu_check.py).

One case (GPT blocks as benchmarks/gpu_check.py's, or LLaMA-style dense and MoE blocks; seq 2048, bf16 autocast,
Adam, flash attention) is built, run
3 steps, then 2 steps under torch.profiler; every CUDA kernel is put in one class by its name (matmul, attention,
optimizer, collective, other) and the classes' summed times are printed per step beside the step's wall time
(what the kernels leave idle is launch and Python time). The 25 longest kernels are listed.

Usage, on a machine with a CUDA GPU and gbmw installed: python benchmarks/gpu_step_profile.py recipes OUT_DIR [CASE]
(--estimate-only: the estimate alone, on any machine)
"""
import collections
import json
import sys
import time
from pathlib import Path

import torch

import gbmw
from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
from gbmw.adapters.runtime.groups import GroupPool
from gbmw.adapters.runtime.launch import init_distributed
from gbmw.adapters.runtime.model import synthetic_batch
from gbmw.specs.models import load_architecture
from one_device_plans import GPT, PROFILED_LLAMA_CASES, one_device_job_and_plan

CASES = {  # name: model fields, blocks, global batch, micro-batches, ckpt (the GPT ones: benchmarks/gpu_check.py's)
    "h4096-L4-b4-m4": (dict(GPT, hidden_size=4096, num_heads=32), 4, 4, 4, False),
    "h4096-L4-b8-m2": (dict(GPT, hidden_size=4096, num_heads=32), 4, 8, 2, False),
    "h8192-L2-b8-m2-ckpt": (dict(GPT, hidden_size=8192, num_heads=64), 2, 8, 2, True),
    **PROFILED_LLAMA_CASES,
}
CLASSES = [("attention", ("flash", "fmha", "attention", "cudnn")),
           ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "sm90", "sm80", "cublas", "matmul")),
           ("optimizer", ("adam", "multi_tensor", "foreach", "l2norm", "norm_kernel")),
           ("collective", ("nccl",))]


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for label, keys in CLASSES:
        if any(key in lowered for key in keys):
            return label
    return "other"


recipes, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
case = sys.argv[3] if len(sys.argv) > 3 else "h4096-L4-b4-m4"
fields, blocks, batch, micro_batches, ckpt = CASES[case]
spec, plan = one_device_job_and_plan(recipes, out, case, fields, blocks, batch, micro_batches, ckpt)
estimate = gbmw.estimate(spec, plan)
print(case, "estimate", estimate.iteration_time_s, "s, peak", estimate.stage_peak_memory_bytes[0] / 2**30, "GiB",
      flush=True)
if "--estimate-only" in sys.argv:
    sys.exit(0)
context = init_distributed()
architecture = load_architecture(out / f"{case}.yaml")
engine = HybridEngine(plan, architecture, GroupPool(plan), context.device,
                      adam=AdamSettings(learning_rate=1e-4, max_grad_norm=1.0))
for step in range(3):
    engine.train_step(synthetic_batch(architecture, batch, step, 0))
torch.cuda.synchronize()
walls = []
activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=activities, record_shapes=True) as profiler:
    for step in range(3, 5):
        started = time.perf_counter()
        engine.train_step(synthetic_batch(architecture, batch, step, 0))
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - started)
totals, per_kernel, kernels = collections.Counter(), collections.Counter(), 0
for event in profiler.events():
    # the optimizer's record_function range shows on the GPU timeline too (a span, not a kernel): not counted
    if event.device_type == torch.autograd.DeviceType.CUDA and not event.name.startswith("Optimizer."):
        seconds = event.device_time / 1e6 / len(walls)
        totals[kernel_class(event.name)] += seconds
        per_kernel[event.name[:200]] += seconds
        kernels += 1
# per operator and input shapes: the GPU time of the kernels each aten op launched itself, and its calls, per step
# (which pass a memory-bound kernel belongs to: a norm's, rotary's or SwiGLU's, by the shapes it ran on)
operators = sorted(((average.self_device_time_total / 1e6 / len(walls), average.count / len(walls), average.key,
                     str(average.input_shapes)[:160]) for average in profiler.key_averages(group_by_input_shape=True)
                    if average.self_device_time_total > 0), reverse=True)[:80]
summary = dict(case=case, estimated_s=estimate.iteration_time_s, wall_s_per_step=walls,
               estimated_peak_gib=estimate.stage_peak_memory_bytes[0] / 2**30,
               measured_peak_gib=torch.cuda.max_memory_allocated() / 2**30,
               kernel_s_per_step=dict(totals), kernels_total_s=sum(totals.values()),
               kernel_launches_per_step=kernels / len(walls), top_kernels=per_kernel.most_common(40),
               operators=operators)
print(json.dumps(summary, indent=1))
(out / f"profile-{case}.json").write_text(json.dumps(summary, indent=1))
