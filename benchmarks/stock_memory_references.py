"""gbmw's model-state memory for the stock targets beside the frameworks' own references (issue 12, point 6).

    .venv/bin/python benchmarks/stock_memory_references.py

Megatron: for each published hand-tuned configuration that Megatron runs (recipes/handtuned/, target megatron-core),
gbmw's model states of pipeline stage 0 (the embedding and the first blocks: the most loaded shard) against
Megatron-LM's `theoretical_memory_usage.compute_weight_and_optimizer_memory` (megatron/training/
theoretical_memory_usage.py), restated here: the most loaded shard holds (transformer parameters / PP + the
embedding) / TP parameters — with one embedding more when PP = 1 and the output layer is untied — at 18 bytes each
(bf16 parameters, fp32 main gradients, Adam in fp32), or 6 + 12 / DP with the distributed optimizer. Its
transformer parameters are 10·L·h²·(1 + 1/5 + 2/(5h) + 1/(5·L·h)): 4·h of biases and norms per block where a GPT
block has 13·h, and no position embeddings. gbmw counts the real layers, so stage 0 holds more by the learned
position embeddings (s·h, replicated under TP, 18 bytes each) and by the biases the formula leaves out
(tests/test_stock_memory_references.py checks exactly this).

DeepSpeed: for ZeRO-2 and ZeRO-3 without offload on the same models and 32 devices (pp = 1, DP 32), gbmw's model
states per device against `estimate_zero2_model_states_mem_needs` and `estimate_zero3_model_states_mem_needs`
(called from the installed DeepSpeed; additional_buffer_factor applies to CPU memory only): 2·P + 18·P/N for
ZeRO-2, and 4·(largest layer) + 18·P/N for ZeRO-3. gbmw prices the live layer's gathered 16-bit weights and
gradients as the running layer's backward extra (4 bytes per parameter beyond the shard it holds), so the ZeRO-3
row adds that to the states; and DeepSpeed's 18/N leaves out the partitioned 16-bit weights (2/N) that ZeRO-3 keeps
and gbmw counts. ZeRO-2 agrees to the byte; ZeRO-3 differs by exactly 2·P/N − 4·(largest layer)/N
(tests/test_stock_memory_references.py).

Activations are not compared: Megatron's theoretical activation memory assumes sequence parallelism and selective
recomputation (issue 14), which are not in gbmw's space yet; DeepSpeed's estimators cover model states only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gbmw.cost.estimate import plan_stage_estimates
from gbmw.handwritten.handtuned_config import load_handtuned
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.cluster_spec import load_cluster
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import load_model

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = "a100-80g-x32"


def job_for(model_name: str, precision: str) -> JobSpec:
    model = load_model(resolve_recipe(model_name, "models"), precision)
    cluster = load_cluster(resolve_recipe(CLUSTER, "clusters"))
    return JobSpec(name=f"{model_name}@{CLUSTER}", model=model, cluster=cluster, precision=precision,
                   global_batch=cluster.num_devices * 8, memory_budget_bytes=int(cluster.device.memory))


def megatron_weight_and_optimizer_bytes(layers: int, hidden: int, vocab: int, tp: int, pp: int, dp: int,
                                        distributed_optimizer: bool, untied: bool) -> float:
    """Megatron-LM's theoretical weight + optimizer memory of the most loaded shard (module docstring)."""
    transformer = 10 * layers * hidden**2 * (1 + 1 / 5 + 2 / (5 * hidden) + 1 / (5 * layers * hidden))
    embedding = hidden * vocab
    shard = transformer / pp + embedding
    if untied and pp == 1:
        shard += embedding
    shard /= tp
    return shard * ((6 + 12 / dp) if distributed_optimizer else 18)


def megatron_rows() -> list[tuple[str, float, float]]:
    rows = []
    for path in sorted((ROOT / "recipes" / "handtuned").glob("*.yaml")):
        handtuned = load_handtuned(path)
        if handtuned.target != "megatron-core":
            continue
        job = job_for(handtuned.applies_to, "bf16")
        config = handtuned.uniform
        if job.cluster.num_devices % (config.tp * config.pp) or job.model.is_mixture_of_experts:
            continue  # the restated formula is Megatron's dense one (10·L·h² per model), no experts
        uniform = UniformConfig(tp=config.tp, pp=config.pp, zero=config.zero, ckpt=config.ckpt, micro=1,
                                target="megatron-core")
        plan = uniform.to_plan(job)
        stage = plan_stage_estimates(job, plan)[0]
        architecture = job.model.require_architecture("the Megatron reference")
        dp = job.cluster.num_devices // (config.tp * config.pp)
        reference = megatron_weight_and_optimizer_bytes(
            architecture.num_layers, architecture.hidden_size, architecture.vocab_size, config.tp, config.pp, dp,
            distributed_optimizer=config.zero == 1, untied=not getattr(architecture, "tie_embeddings", True))
        rows.append((f"{handtuned.name}: {handtuned.applies_to} {uniform.describe()}", stage.model_state_bytes,
                     reference))
    return rows


def deepspeed_rows() -> list[tuple[str, float, float]]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    rows = []
    for model_name in ("gpt3-15b", "gpt3-39b", "bert-huge-32"):
        job = job_for(model_name, "fp16")
        devices = job.cluster.num_devices
        parameters = job.model.parameter_count
        largest = max(layer.parameter_count for layer in job.model.layers)
        for zero in (2, 3):
            plan = UniformConfig(zero=zero, micro=1, target="deepspeed").to_plan(job)
            stage = plan_stage_estimates(job, plan)[0]
            if zero == 2:
                _, reference = estimate_zero2_model_states_mem_needs(parameters, devices, 1, cpu_offload=False)
                gbmw_bytes = stage.model_state_bytes
            else:
                _, reference, _ = estimate_zero3_model_states_mem_needs(parameters, largest, devices, 1,
                                                                        cpu_offload=False, cpu_offload_params=False)
                # the live layer's gathered 16-bit weights and gradients: the backward extra of the largest layer
                gbmw_bytes = stage.model_state_bytes + 4 * largest * (1 - 1 / devices)
            rows.append((f"{model_name} fp16, ZeRO-{zero}, DP {devices}", gbmw_bytes, float(reference)))
    return rows


def main() -> int:
    console = Console(highlight=False, width=150)
    for title, rows in (("Megatron-LM theoretical_memory_usage (weights + optimizer, most loaded shard)",
                         megatron_rows()),
                        ("DeepSpeed estimate_zero2/3_model_states_mem_needs (per device, no offload)",
                         deepspeed_rows())):
        table = Table(title=title)
        for column in ("configuration", "gbmw GiB", "reference GiB", "gbmw − reference"):
            table.add_column(column, justify="left" if column == "configuration" else "right")
        for label, gbmw_bytes, reference in rows:
            table.add_row(label, f"{gbmw_bytes / 2**30:.3f}", f"{reference / 2**30:.3f}",
                          f"{(gbmw_bytes - reference) / reference:+.2%}")
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
