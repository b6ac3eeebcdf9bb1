"""The runtime's routed experts, grouped products against the expert-by-expert loop, side by side in one run
(gbmw.adapters.runtime.grouped_experts): for each case, one forward + backward of a rank's local experts (SwiGLU,
fp32 weights, bf16 autocast) on the same rows and weights through both paths — the time (median of the timed
repetitions after warm-ups, the GPU synchronised around each), the launches the profiler counts per pass, and the
largest difference of the outputs and gradients relative to their scale.

Usage, on a machine with a CUDA GPU and gbmw installed:
    python benchmarks/gpu_grouped_experts.py OUT.json
    python benchmarks/gpu_grouped_experts.py OUT.json --smoke      # tiny cases on this CPU (checks the script)
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from gbmw.adapters.runtime.experts import ExpertMLP
from gbmw.adapters.runtime.grouped_experts import grouped_expert_mlps
from gbmw.adapters.runtime.tensor_parallel import TensorParallel

CASES = {  # name: (experts, hidden, expert ffn, routed rows = tokens × top-k)
    "qwen3-30b-like 64 experts h2048 ffn768, 16384 tokens top-8": (64, 2048, 768, 16384 * 8),
    "gpt-oss-like 32 local experts h2880 ffn2880, 8192 tokens top-4": (32, 2880, 2880, 8192 * 4),
    "mixtral-like 8 experts h4096 ffn14336, 8192 tokens top-2": (8, 4096, 14336, 8192 * 2),
}
SMOKE = {"tiny 8 experts h64 ffn96, 64 tokens top-2": (8, 64, 96, 128)}


def one_pass(experts, rows, counts, grouped: bool, device: torch.device):
    rows = rows.detach().requires_grad_()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        output = (grouped_expert_mlps(experts, rows, counts) if grouped else
                  torch.cat([expert(part) for expert, part in zip(experts, rows.split(counts))]))
    output.float().sum().backward()
    return output.float(), rows.grad.float()


def timed(experts, rows, counts, grouped, device, warmup, repeats):
    for _ in range(warmup):
        one_pass(experts, rows, counts, grouped, device)
    seconds = []
    for _ in range(repeats):
        for expert in experts:
            expert.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        one_pass(experts, rows, counts, grouped, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def launches(experts, rows, counts, grouped, device) -> int:
    activity = torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as profile:
        one_pass(experts, rows, counts, grouped, device)
    if device.type == "cuda":
        return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)
    return len(profile.events())


def main() -> int:
    out = sys.argv[1]
    smoke = "--smoke" in sys.argv
    device = torch.device("cpu" if smoke else "cuda")
    warmup, repeats = (1, 2) if smoke else (3, 10)
    rows_out = []
    for name, (count, hidden, ffn, routed) in (SMOKE if smoke else CASES).items():
        torch.manual_seed(0)
        experts = [ExpertMLP(hidden, ffn, False, True, TensorParallel.single(), torch.float32).to(device)
                   for _ in range(count)]
        for expert in experts:
            for parameter in expert.parameters():
                torch.nn.init.normal_(parameter, std=0.02)
        # routing-like counts (a multinomial over the experts: unaligned, uneven), the rows expert-major
        counts = torch.bincount(torch.randint(count, (routed,)), minlength=count).tolist()
        rows = torch.randn(routed, hidden, device=device).to(torch.bfloat16)
        results = {}
        for grouped in (False, True):
            for expert in experts:
                expert.zero_grad(set_to_none=True)
            output, grad_rows = one_pass(experts, rows, counts, grouped, device)
            grads = [parameter.grad.float().clone() for expert in experts for parameter in expert.parameters()]
            results[grouped] = dict(output=output, grad_rows=grad_rows, grads=grads,
                                    seconds=timed(experts, rows, counts, grouped, device, warmup, repeats),
                                    launches=launches(experts, rows, counts, grouped, device))
        loop, grouped = results[False], results[True]

        def relative(a, b):
            return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

        row = dict(case=name, experts=count, hidden=hidden, ffn=ffn, routed_rows=routed,
                   loop_s=loop["seconds"], grouped_s=grouped["seconds"],
                   speedup=loop["seconds"] / grouped["seconds"],
                   loop_launches=loop["launches"], grouped_launches=grouped["launches"],
                   output_difference=relative(grouped["output"], loop["output"]),
                   input_gradient_difference=relative(grouped["grad_rows"], loop["grad_rows"]),
                   weight_gradient_difference=max(relative(g, w) for g, w in zip(grouped["grads"], loop["grads"])))
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        del experts, rows, results
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(out, "w") as handle:
        json.dump(dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                       torch=torch.__version__, cases=rows_out), handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
