"""FSDP from one node to sixteen: torchtitan's published scaling beside gbmw's (issue 28, pattern 3).

torchtitan's docs/performance.md (pytorch/torchtitan d4c86e375, 2025-01-30; runs with torchtitan 9dec370, torch
1963fc8) trains Llama 3.1 8B with FSDP2 alone, local batch 2 at 8192 tokens, selective ("op") activation
checkpointing, in Table 1 on 8 GPUs (global batch 16) and in Table 3 on 128 (global batch 256): 5,762 and 5,605
tokens/s per GPU — 2.7 % slower per GPU on sixteen nodes. The machines are Grand Teton hosts: 8 H100s with 96 GB of
HBM2e at a 500 W power limit ("the actual peak TFLOPs number is between SXM and NVL, and we don't know its exact
value"), 400 Gb/s of RDMA per GPU. No kernel measurement of that device exists, so the runs' times are not costed
(benchmarks/published_runs.py costs only devices with a measured recipe); what this prints is the ratio of the two
runs' throughput, per GPU, with the same per-GPU work — which the device's compute rate mostly cancels out of — on
the H100-SXM recipe with the source's network (8 × 400 Gb/s per node).

What the two sides run differently (from their code, not fitted):
* torchtitan wraps each block with `fully_shard` and the model in one more (torchtitan/parallelisms/
  parallelize_llama.py `apply_fsdp`): one FSDP2 root, whose next block's all-gather is issued while the current
  block's forward runs, in bf16 (`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`, its defaults).
* gbmw's runtime makes each layer its own FSDP2 root (gbmw.adapters.runtime.sharding), and a root's pre-forward makes
  the all-gather streams wait for the compute stream (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_state.py
  `_root_pre_forward`), so each layer's forward all-gather starts when the previous layer's forward is done; it
  gathers the fp32 weights (no mixed-precision policy) and casts them under autocast. The estimator prices exactly
  that: every forward all-gather in series with the forward (gbmw.cost.layer_cost_batch), fp32 bytes.
* DeepSpeed's ZeRO-3 as gbmw configures it gathers bf16, but prefetches only `stage3_prefetch_bucket_size` =
  0.9·hidden² parameters (gbmw.adapters.deepspeed.ds_config) — 15 M of a Llama 3.1 8B block's 218 M — so it too is
  priced with its forward all-gathers in series.

torchtitan's selective "op" checkpointing (recompute every other matmul and the elementwise work, keep attention)
lies between gbmw's `ckpt=none` and `ckpt=full`, so both are printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_runs import build_cluster  # noqa: E402  (the published runs' cluster builder)

from gbmw.cost.comm import CommModel  # noqa: E402
from gbmw.cost.estimate import estimate_plan  # noqa: E402
from gbmw.cost.model_states import state_bytes  # noqa: E402
from gbmw.handwritten.uniform_config import UniformConfig  # noqa: E402
from gbmw.space.targets import get_target  # noqa: E402
from gbmw.specs.bundled import resolve_recipe  # noqa: E402
from gbmw.specs.jobs import JobSpec  # noqa: E402
from gbmw.specs.models import build_model, load_model  # noqa: E402

SEQ_LENGTH, LOCAL_BATCH = 8192, 2
MEASURED_TOKENS_PER_S_PER_GPU = {8: 5762, 128: 5605}
"""torchtitan docs/performance.md Tables 1 and 3, row "FSDP" (eager, bf16)."""
TARGETS = ("runtime", "deepspeed")
RECOMPUTATION = ("none", "full")


def job_for(devices: int) -> JobSpec:
    run = {"name": f"torchtitan-llama3.1-8b-{devices}gpu",
           "cluster": {"gpu": "NVIDIA H100", "gpus": devices, "gpus_per_node": 8, "nics_per_node": 8,
                       "nic_gbps": 400}}
    cluster = build_cluster(run, [])
    architecture = load_model(resolve_recipe("llama3.1-8b", "models"), "bf16").architecture
    model = build_model(architecture.model_copy(update={"seq_length": SEQ_LENGTH}), "bf16")
    return JobSpec(name=run["name"], model=model, cluster=cluster, precision="bf16",
                   global_batch=LOCAL_BATCH * devices, memory_budget_bytes=cluster.usable_memory_bytes)


def tokens_per_s_per_gpu(job: JobSpec, target: str, ckpt: str) -> float:
    config = UniformConfig(tp=1, pp=1, zero=3, ckpt=ckpt, sp=False, micro=LOCAL_BATCH,
                           batch=job.global_batch, target=target)
    estimate = estimate_plan(job, config.to_plan(job), fused_elementwise=True)
    return job.global_batch * SEQ_LENGTH / estimate.iteration_time_s / job.cluster.num_devices


def forward_gathers_s(job: JobSpec, target: str) -> float:
    """One forward's all-gathers of every layer's weights over all the devices (what gbmw prices in series)."""
    weight_bytes = state_bytes(get_target(target).framework, "bf16", "adam").weights
    comm, devices = CommModel(job.cluster), job.cluster.num_devices
    return sum(comm.allgather_s(layer.parameter_count * weight_bytes, devices, 1) for layer in job.model.layers)


def main() -> int:
    console = Console(highlight=False, width=160)
    jobs = {devices: job_for(devices) for devices in MEASURED_TOKENS_PER_S_PER_GPU}
    measured = MEASURED_TOKENS_PER_S_PER_GPU[128] / MEASURED_TOKENS_PER_S_PER_GPU[8]
    table = Table(title="Llama 3.1 8B, FSDP, local batch 2 × 8192 tokens: tokens/s per GPU on 8 and 128 H100s")
    for column in ("target", "recomputation", "8 GPUs", "128 GPUs", "128 / 8", "forward all-gathers 8 → 128 GPUs"):
        table.add_column(column, justify="left" if column in ("target", "recomputation") else "right")
    table.add_row("torchtitan (measured, 96 GB HBM2e at 500 W)", "selective (op)",
                  f"{MEASURED_TOKENS_PER_S_PER_GPU[8]:,}", f"{MEASURED_TOKENS_PER_S_PER_GPU[128]:,}",
                  f"{measured:.3f}", "overlapped (one root)")
    for target in TARGETS:
        gathers = f"{forward_gathers_s(jobs[8], target):.3f} → {forward_gathers_s(jobs[128], target):.3f} s"
        for ckpt in RECOMPUTATION:
            rates = {devices: tokens_per_s_per_gpu(job, target, ckpt) for devices, job in jobs.items()}
            table.add_row(f"gbmw, {target} (H100 SXM recipe)", ckpt, f"{rates[8]:,.0f}", f"{rates[128]:,.0f}",
                          f"{rates[128] / rates[8]:.3f}", gathers)
    console.print(table)
    console.print("The absolute rates are not comparable (another device); the ratio is. gbmw prices each forward "
                  "all-gather in series, as its runtime's per-layer FSDP2 roots and its DeepSpeed ZeRO-3 configs run "
                  "them; torchtitan's one root overlaps them (see the module docstring).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
