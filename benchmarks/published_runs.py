"""gbmw's estimate of published training runs, each costed in its own configuration on its own cluster.

    .venv/bin/python benchmarks/published_runs.py            # every costable run of both data files (~10 s)
    .venv/bin/python benchmarks/published_runs.py --json out.json

The runs, their sources and their clusters as published are in benchmarks/published_runs.yaml (every number quoted
from its source). For each run this builds the model from its published architecture, the cluster from its
published hardware, and the plan from its published parallelism (TP, PP, DP, ZeRO stage or FSDP, micro-batch,
recomputation — full or selective —, sequence parallelism, interleaving), and prints gbmw's predicted iteration time against the published one (given, or
implied by the published tokens/s or TFLOP/s per GPU with the source's own FLOP formula) and the signed error
(+ = gbmw predicts slower). Target (issue 12): mean |error| ≤ 10 %, max ≤ 20 %.

Nothing here is calibrated to these runs. The devices come from the bundled cluster recipes — measured matmul
rates and STREAM bandwidths (recipes/clusters/*.yaml, benchmarks/kernel_rates.yaml) — and the inter-node links
from NCCL's measured bandwidth per NIC (below); the runs are only compared with.

FP8 runs (issue 28) are costed as Transformer Engine's FP8 on megatron-core where the device has an FP8 rate
(gbmw.specs.transformer_layers), with delayed scaling, or current scaling where the row (FP8-CS) or the recipe
committed with it says so (gbmw.cost.fp8); blockwise and MXFP8 scaling are refused by name. A third table costs the context-parallel runs of
benchmarks/published_long_context_runs.yaml (fields their table omits taken from the recipe the data file quotes,
printed as assumptions). Runs that cannot be costed are listed with the reason: FP8 on a device without a bundled FP8
rate or with another scaling recipe, an unstated configuration (micro-batch, recomputation, TP/PP split, precision)
or an unstated network, or numbers the collector could not verify in a primary source.

Mixture-of-experts runs (issue 26) are in benchmarks/published_moe_runs.yaml and get a table of their own below the
dense one, against the same targets; the dense table and its summary are those of the dense runs alone. An MoE run
is costed with its published expert-parallel degree (`--uniform ep=N`) on the framework's nearest gbmw target; each
one that cannot be costed names every reason (FP8, multi-head latent attention, context parallelism, a device without
a bundled recipe, an unstated field…); GPT-OSS is costed with its windowed and full blocks, sinks and biases. A field its results table
omits is taken from the benchmark recipe committed with that row only where the data file quotes the recipe
(`assumed_from_recipe`), and the table prints it as an assumption. The exit status is 0 when both tables meet
the targets.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gbmw.cli.trust import FEATURES, plan_regime
from gbmw.cost.estimate import estimate_plan
from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.plan import Plan
from gbmw.space.stock_partitions import megatron_partition
from gbmw.space.targets import get_target
from gbmw.specs.architectures import GPTArchitecture, MixtureOfExperts
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.cluster_spec import ClusterSpec, load_cluster
from gbmw.specs.jobs import JobSpec
from gbmw.specs.models import build_model

DATA = Path(__file__).with_name("published_runs.yaml")
MEAN_TARGET, MAX_TARGET = 0.10, 0.20

# NCCL's all-reduce bus bandwidth per NIC across nodes, measured (benchmarks/kernel_rates.yaml): "peak NCCL
# bandwidth per 200G HDR NIC (12 GB/s per 100G NIC)" — NVIDIA/nccl-tests issue #119; 8 x HDR on DGX A100 reach
# 192 GB/s — NVIDIA/nccl issue #812. A 100 Gb/s Omni-Path NIC is taken at the 100G rate (no OPA measurement found).
NIC_GB_PER_S = {400: 46.0, 200: 24.0, 100: 12.0}
"""400: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA/nccl-tests issue #290, as
recipes/clusters/h100-80g-x64.yaml cites it)."""
DGX_H100_NICS = (8, 400)
"""A DGX-H100 node's compute fabric: eight single-port ConnectX-7 at 400 Gb/s (the DGX BasePOD reference architecture
recipes/clusters/h100-80g-x64.yaml cites), for rows that name the system, not its NICs."""
DEVICE_RECIPES = {"A100 80GB": "a100-80g-x32", "A100 40GB": "a100-40g-x64", "H100": "h100-80g-x64"}
TARGET_OF_FRAMEWORK = {"megatron-lm": "megatron-core", "megatron-deepspeed": "megatron-deepspeed",
                       "composer/llm-foundry": "runtime", "nemo": "megatron-core"}
"""FSDP (llm-foundry) keeps fp32 parameters sharded, as gbmw's runtime does, but computes with bf16 weights gathered in
bf16 (COMPOSER_WEIGHTS_TARGET), where the runtime gathers fp32 and casts under autocast: no gbmw target is Composer."""


REGIMES: dict[str, dict[str, str]] = {}
"""Each costed run's regime (gbmw.cli.trust.plan_regime), by run name."""
TP_COMM_OVERLAP: dict[str, bool | None] = {}
"""Each costed TP > 1 run's Transformer Engine TP communication overlap as its recipe sets it (None: not stated), by
run name (print_tp_comm_overlap)."""


@dataclass(frozen=True)
class Costed:
    name: str
    source: str
    config: str
    measured_s: float
    measured_from: str
    predicted_s: float
    assumptions: tuple[str, ...]
    peak_memory_gib: float
    """gbmw's peak memory of the busiest pipeline stage."""
    usable_gib: float
    """What gbmw gives the plan on the run's device (the cluster's usable memory): a run that trained should fit it."""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def memory_gib(estimate, job: JobSpec) -> tuple[float, float]:
    """(the busiest stage's peak, the usable memory) in GiB."""
    return max(estimate.stage_peak_memory_bytes) / 2**30, job.memory_budget_bytes / 2**30


def _framework(run: dict) -> str | None:
    framework = str(run["parallelism"].get("framework") or "")
    return next((key for key in TARGET_OF_FRAMEWORK if framework.startswith(key)), None)


def why_not_costable(run: dict) -> str | None:
    """The reason a run cannot be costed as published (None: it can); for an MoE run, every reason."""
    if run["model"].get("moe"):
        return "; ".join(why_moe_run_not_costable(run)) or None
    parallelism, cluster, model = run["parallelism"], run["cluster"], run["model"]
    precision = str(run.get("precision") or "").lower()
    if run.get("verified") is False:
        return "numbers not verified in the primary source"
    run, _ = with_recipe_fields(run)
    parallelism, model = run["parallelism"], run["model"]
    if "fp8" in precision and _device_recipe(cluster) != "h100-80g-x64":
        return f"FP8 on {cluster.get('gpu')!r}, which has no bundled FP8 rate"
    if not any(word in precision for word in ("fp16", "bf16", "16-bit", "fp8")):
        return f"precision not stated ({run.get('precision')!r})"
    missing = [key for key in ("tensor", "pipeline", "data", "micro_batch", "global_batch", "recompute")
               if parallelism.get(key) is None]
    missing += [key for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
                if model.get(key) is None]
    if missing:
        return f"configuration not stated: {', '.join(missing)}"
    if _framework(run) is None:
        return f"framework {parallelism.get('framework')!r} not mapped to a gbmw target"
    if _device_recipe(cluster) is None:
        return f"device {cluster.get('gpu')!r} has no bundled recipe"
    if cluster["gpus"] > (cluster.get("gpus_per_node") or 8) and _node_bandwidth(cluster) is None:
        return "inter-node network not stated"
    return None


def with_recipe_fields(run: dict) -> tuple[dict, list[str]]:
    """`run` with each field its table leaves out (null) taken from the recipe its data file quotes
    (`assumed_from_recipe`: field → value, quote, recipe), and one assumption line per field taken."""
    recipe = run.get("assumed_from_recipe") or {}
    taken = {field: entry for field, entry in recipe.items() if entry.get("quote") and entry.get("recipe")}
    if not taken:
        return run, []
    filled = dict(run, parallelism=dict(run["parallelism"]), model=dict(run["model"]))
    lines = []
    for field, entry in taken.items():
        line = f"{field}={entry['value']}" + (f" ({entry['costed_as']})" if entry.get("costed_as") else "")
        if field in ("fp8_recipe", "gradient_reduce_dtype", "adam_moments_dtype"):  # the run's own, by its precision
            if filled.get(field) is None:
                filled[field] = entry["value"]
                lines.append(line)
            continue
        part = "model" if field in filled["model"] else "parallelism"
        if filled[part].get(field) is None:
            filled[part][field] = entry["value"]
            lines.append(line)
    where = "; ".join(dict.fromkeys(entry["recipe"] for entry in taken.values()))
    return filled, [f"from the recipe {where}: {', '.join(lines)}"] if lines else []


def _device_recipe(cluster: dict) -> str | None:
    gpu = str(cluster.get("gpu") or "")
    return next((recipe for key, recipe in DEVICE_RECIPES.items() if key in gpu), None)


def _node_bandwidth(cluster: dict) -> float | None:
    """NCCL bus bandwidth of one node's NICs (GB/s), from the published NICs and the measured rate per NIC."""
    if cluster.get("nics_per_node") and cluster.get("nic_gbps") in NIC_GB_PER_S:
        return cluster["nics_per_node"] * NIC_GB_PER_S[cluster["nic_gbps"]]
    if "Omni-Path" in str(cluster.get("interconnect")) and cluster.get("nics_per_node"):
        return cluster["nics_per_node"] * NIC_GB_PER_S[100]
    if cluster.get("node_injection_gbps"):  # e.g. "1600 Gbps node-node": 8 x 200 Gb/s
        return cluster["node_injection_gbps"] / 200 * NIC_GB_PER_S[200]
    if "DGX-H100" in str(cluster.get("gpu")):
        return DGX_H100_NICS[0] * NIC_GB_PER_S[DGX_H100_NICS[1]]
    return None


def build_cluster(run: dict, assumptions: list[str]) -> ClusterSpec:
    published = run["cluster"]
    recipe = load_cluster(resolve_recipe(_device_recipe(published), "clusters"))
    per_node = published.get("gpus_per_node")
    if per_node is None:
        per_node = recipe.devices_per_node
        assumptions.append(f"{per_node} GPUs per node (not stated)")
    nodes = max(1, published["gpus"] // per_node)
    intra = recipe.links[0].model_copy(update={"devices": min(per_node, published["gpus"])})
    links = [intra]
    if nodes > 1:
        links.append(recipe.links[-1].model_copy(update={
            "name": "inter_node", "devices": nodes * per_node, "bandwidth_gb_per_s": _node_bandwidth(published)}))
    return recipe.model_copy(update={"name": run["name"], "nodes": nodes, "devices_per_node": per_node,
                                     "links": tuple(links), "sources": ()})


def build_job(run: dict, cluster: ClusterSpec, assumptions: list[str]) -> JobSpec:
    model, precision_text = run["model"], str(run["precision"]).lower()
    precision = "fp8" if "fp8" in precision_text else "bf16" if "bf16" in precision_text else "fp16"
    if "16-bit" in precision_text and "bf16" not in precision_text and "fp16" not in precision_text:
        assumptions.append("fp16 (the source says 16-bit)")
    ffn = model.get("ffn_hidden_size") or 4 * model["hidden_size"]
    if str(model.get("architecture")).lower() == "llama":
        architecture = llama_architecture(run)
    elif str(model.get("architecture")).lower().startswith("nemotron"):
        architecture = nemotron_architecture(run)
    else:
        # NeMo's megatron-core runs attention through Transformer Engine's fused kernels
        fused = _framework(run) == "composer/llm-foundry" or "nemo" in str(run["parallelism"].get("framework")).lower()
        architecture = GPTArchitecture(
            name=run["name"], family="gpt", num_layers=model["num_layers"], hidden_size=model["hidden_size"],
            num_heads=model["num_attention_heads"], ffn_hidden_size=ffn, seq_length=model["seq_length"],
            vocab_size=model["vocab_size"], attention="flash" if fused else "standard",
            bias=_framework(run) != "composer/llm-foundry",
            position_embedding="rotary" if "alibi" in str(model.get("architecture")).lower() else "learned")
    spec = build_model(architecture, precision)
    return JobSpec(name=run["name"], model=spec, cluster=cluster, precision=precision, fp8_recipe=fp8_recipe(run),
                   gradient_reduce_dtype=gradient_reduce_dtype(run), tp_comm_overlap=tp_comm_overlap(run),
                   adam_moments_dtype=run.get("adam_moments_dtype") or "fp32",
                   global_batch=run["parallelism"]["global_batch"], memory_budget_bytes=cluster.usable_memory_bytes)


def llama_architecture(run: dict) -> GPTArchitecture:
    """A LLaMA-style decoder as NeMo / megatron-core define Llama 2 and 3 (nemo/collections/llm/gpt/model/llama.py):
    RMSNorm, SwiGLU, rotary positions, no biases, untied embeddings, no dropout, grouped-query attention, and
    Transformer Engine's fused (flash) attention."""
    model = run["model"]
    return GPTArchitecture(
        name=run["name"], family="gpt", num_layers=model["num_layers"], hidden_size=model["hidden_size"],
        num_heads=model["num_attention_heads"], num_kv_heads=model.get("num_kv_heads") or model.get("num_query_groups"),
        ffn_hidden_size=model["ffn_hidden_size"], seq_length=model["seq_length"], vocab_size=model["vocab_size"],
        gated_mlp=True, bias=False, norm="rms", position_embedding="rotary", tie_embeddings=False, dropout=False,
        attention="flash")


def nemotron_architecture(run: dict) -> GPTArchitecture:
    """Nemotron-4 as NeMo-Framework-Launcher 24.07 trains it (launcher_scripts/conf/training/nemotron/*.yaml:
    `bias: false`, `activation: squared-relu`, `normalization: layernorm1p`, `position_embedding_type: rope` with
    `rotary_percentage: 0.5`, `share_embeddings_and_output_weights: false`, dropouts 0.0, `num_query_groups`):
    LayerNorm with its shift (layernorm1p adds one to the scale, the same pass), a dense MLP whose squared ReLU keeps
    one FFN-wide tensor beside FC2's input as GELU does (`mlp_activation: gelu`; relu(x) for the square's backward),
    rotary positions (on half of each head's width: a pass over half the elements, priced whole), untied embeddings,
    grouped-query attention where the recipe sets it, and Transformer Engine's fused (flash) attention."""
    model = run["model"]
    return GPTArchitecture(
        name=run["name"], family="gpt", num_layers=model["num_layers"], hidden_size=model["hidden_size"],
        num_heads=model["num_attention_heads"], num_kv_heads=model.get("num_kv_heads"),
        ffn_hidden_size=model["ffn_hidden_size"], seq_length=model["seq_length"], vocab_size=model["vocab_size"],
        gated_mlp=False, mlp_activation="gelu", bias=False, norm="layer", position_embedding="rotary",
        tie_embeddings=False, dropout=False, attention="flash")


def measured_iteration_s(run: dict) -> tuple[float, str]:
    """The published iteration time, or the one the published throughput implies (the source's formula)."""
    measured, model, parallelism = run["measured"], run["model"], run["parallelism"]
    if measured.get("iteration_seconds"):
        return float(measured["iteration_seconds"]), "iteration time"
    tokens = parallelism["global_batch"] * model["seq_length"]
    if measured.get("tokens_per_second"):
        return tokens / measured["tokens_per_second"], "tokens/s"
    if measured.get("tflops_per_gpu"):
        # Narayanan et al. (SC21) Eq. (3), which counts full recomputation's extra forward (4 passes):
        # 96·B·s·l·h²·(1 + s/6h + V/16lh) FLOPs per iteration.
        b, s, l, h, v = (parallelism["global_batch"], model["seq_length"], model["num_layers"],
                         model["hidden_size"], model["vocab_size"])
        flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        return flops / (measured["tflops_per_gpu"] * 1e12 * run["cluster"]["gpus"]), "TFLOP/s per GPU (SC21 Eq. 3)"
    raise ValueError(f"{run['name']}: no measured time, tokens/s or TFLOP/s")


FUSED_ELEMENTWISE = True
"""No published run ran gbmw's runtime: the runs costed in its layout (FSDP2 in NeMo AutoModel, LLM Foundry) run
fused norms, activations and rotary kernels (Transformer Engine's), not the runtime's own unfused passes
(gbmw.cost.layer_cost.CostSettings.fused_elementwise)."""


def _plan_with_partition(config: UniformConfig, job: JobSpec, partition: tuple[int, ...]) -> Plan:
    """`config`'s uniform plan with a given partition (one DeepSpeed's PipelineModule makes, not Megatron's)."""
    devices, pp = job.cluster.num_devices, len(partition)
    dp = devices // (config.tp * pp)
    return Plan(model=job.model.name, cluster=job.cluster.name, num_devices=devices, precision=job.precision,
                global_batch=config.batch, micro_batch=config.micro * dp,
                num_micro_batches=config.batch // (config.micro * dp), pp=pp, partition=partition,
                strategies=config.layer_strategies(job.model, dp), target=config.target)


def _interleaved(plan: Plan, parallelism: dict, job: JobSpec) -> tuple[Plan, int]:
    """`plan` with the run's virtual pipeline stages (interleaved 1F1B), checked by its target; and their number."""
    virtual = parallelism.get("virtual_stages") or 1
    if virtual > 1:
        plan = replace(plan, virtual_stages=virtual)
        get_target(plan.target).check(plan, job.model)
    return plan, virtual


def with_attention_slowed(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    """`cluster` with its devices' fused-attention rate divided by `factor` (TRITON_ATTENTION_SLOWDOWNS)."""
    table = cluster.device.attention_tflops
    slower = table.model_copy(update={precision: rate / factor for precision, rate in table.model_dump().items()
                                      if rate is not None})
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"attention_tflops": slower})})


def cost(run: dict, target: str | None = None, attention_slowdown: float = 1.0) -> Costed:
    """`run` costed on the gbmw target its framework maps to (TARGET_OF_FRAMEWORK), or on `target`; with
    `attention_slowdown`, its devices' attention rate divided by it (print_triton_attention)."""
    if run["model"].get("moe"):
        return cost_moe(run)
    run, assumptions = with_recipe_fields(run)
    parallelism = run["parallelism"]
    cluster = build_cluster(run, assumptions)
    if attention_slowdown != 1.0:
        cluster = with_attention_slowed(cluster, attention_slowdown)
    job = build_job(run, cluster, assumptions)
    framework = _framework(run)
    zero = parallelism.get("zero_stage")
    if zero is None:
        zero = 1 if parallelism.get("distributed_optimizer") else 0
    dp = parallelism["data"]
    if parallelism["global_batch"] % (parallelism["micro_batch"] * dp):
        raise ValueError(f"{run['name']}: global batch not a multiple of micro-batch × DP")
    config = UniformConfig(tp=parallelism["tensor"], pp=parallelism["pipeline"], zero=zero,
                           ckpt=parallelism["recompute"], sp=bool(parallelism.get("sequence_parallel")),
                           micro=parallelism["micro_batch"], batch=parallelism["global_batch"],
                           target=target or TARGET_OF_FRAMEWORK[framework])
    if "type:transformer|embedding" in " ".join(run.get("notes") or []):
        # DeepSpeed's `type:transformer|embedding` partition weighs the embeddings like blocks: an even split of
        # all layers (BLOOM: embedding + 5 blocks on the first and last stage, 6 blocks elsewhere)
        count, pp = job.model.num_layers, parallelism["pipeline"]
        plan = _plan_with_partition(config, job, (count // pp,) * pp)
    else:
        plan = config.to_plan(job)
    plan, virtual = _interleaved(plan, parallelism, job)
    if target is None:
        REGIMES[run["name"]] = plan_regime(plan, job)
        _record_tp_comm_overlap(run)
    estimate = estimate_plan(job, plan, fused_elementwise=FUSED_ELEMENTWISE)
    measured, measured_from = measured_iteration_s(run)
    described = config.describe() + (f",v={virtual}" if virtual > 1 else "") + f",gpus={run['cluster']['gpus']}"
    return Costed(run["name"], run["source"]["title"].split(",")[0][:40], described, measured, measured_from,
                  estimate.iteration_time_s, tuple(assumptions), *memory_gib(estimate, job))


# ---- mixture-of-experts runs (issue 26): benchmarks/published_moe_runs.yaml ---------------------------------------

MOE_DATA = Path(__file__).with_name("published_moe_runs.yaml")
MOE_TARGET_OF_FRAMEWORK = (("megatron-bridge", "megatron-core"), ("nemo 2.0 / megatron-core", "megatron-core"),
                           ("megatron-core", "megatron-core"), ("megatron-lm", "megatron-core"),
                           ("nemo automodel", "runtime"))
"""A published framework → the gbmw target that runs as it does (matched on the start of `parallelism.framework`).
Megatron-Bridge and NeMo 2.0 train on megatron-core. NeMo AutoModel trains with PyTorch FSDP2 (per-parameter
sharding, bf16 compute, experts split over its EP mesh and sharded by FSDP over what remains): of gbmw's targets
only its runtime shards every parameter FSDP-style with expert parallelism (`zero=3,ep=N`) — the stock targets
that run EP (megatron-core, megatron-deepspeed) pipeline with ZeRO 1 at most — so it is the nearest."""



def _moe_target(run: dict) -> str | None:
    framework = str(run["parallelism"].get("framework") or "").lower()
    return next((target for key, target in MOE_TARGET_OF_FRAMEWORK if framework.startswith(key)), None)


def _dense_blocks(run: dict) -> tuple[int, ...] | None:
    """The blocks whose MLP stays dense, read from the collector's `moe_layer_freq_or_first_dense_layers` (None: not
    read)."""
    layout = str(run["model"]["moe"].get("moe_layer_freq_or_first_dense_layers") or "").lower()
    if layout.startswith("all "):
        return ()
    first = re.match(r"first (\d+) layers dense", layout)
    return tuple(range(int(first.group(1)))) if first else None


def _gpt_oss(run: dict) -> bool:
    """Whether the run trains GPT-OSS (its architecture read from Megatron-Bridge's GPTOSSProvider, as the notes say)."""
    return "gpt_oss_provider.py" in " ".join(run.get("notes") or [])


def why_moe_run_not_costable(run: dict) -> list[str]:
    """Every reason an MoE run cannot be costed as published (empty: it can), with the fields its recipe gives."""
    run, _ = with_recipe_fields(run)
    parallelism, cluster, model, moe = run["parallelism"], run["cluster"], run["model"], run["model"]["moe"]
    precision = str(run.get("precision") or "").lower()
    notes = " ".join(run.get("notes") or []).lower()
    reasons = []
    if run.get("verified") is False:
        reasons.append("numbers not verified in the primary source (a headline claim without its configuration)")
    if (parallelism.get("context") or 1) > 1:
        reasons.append(f"context parallelism (CP {parallelism['context']}) not modelled (issue 27)")
    if "fp8" in precision and "parenthesised" in precision:
        reasons.append("FP8 recipe of the main figure not stated (the parenthesised one is blockwise 1x128/128x128)")
    elif "fp8" in precision and re.search(r"block|fine-grained|128x128", precision):
        reasons.append("FP8 with blockwise scaling (gbmw costs Transformer Engine's delayed and current scaling)")
    elif "fp8" in precision and "recipe not stated" in precision and run.get("fp8_recipe") is None:
        reasons.append("FP8 recipe not stated")
    elif "fp8" not in precision and "bf16" not in precision and "fp16" not in precision:
        reasons.append(f"precision not stated ({run.get('precision')!r})")
    if "mla" in str(model.get("architecture")).lower():
        reasons.append("multi-head latent attention (DeepSeek MLA): modelled (gbmw.specs.latent_attention), not yet "
                       "built by this benchmark")
    if not isinstance(moe.get("capacity_factor"), (int, float, type(None))):
        reasons.append(f"capacity factor {moe['capacity_factor']!r}: token dropping at an unstated capacity")
    if _dense_blocks(run) is None:
        reasons.append(f"MoE layer layout {moe.get('moe_layer_freq_or_first_dense_layers')!r} not read")
    if cluster.get("gpu") is None:
        reasons.append("device not stated")
    elif _device_recipe(cluster) is None:
        reasons.append(f"device {cluster['gpu']!r} has no bundled recipe")
    missing = [key for key in ("tensor", "pipeline", "data", "expert", "micro_batch", "global_batch", "recompute")
               if parallelism.get(key) is None]
    missing += [key for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
                if model.get(key) is None]
    if missing:
        reasons.append(f"configuration not stated: {', '.join(missing)}")
    tp, etp = parallelism.get("tensor"), parallelism.get("expert_tensor")
    if etp is not None and tp is not None and (etp < 1 or tp % etp):
        reasons.append(f"expert tensor parallelism ETP {etp} does not divide TP {tp} (megatron-core's expert layout "
                       "needs it: gbmw.space.expert_tensor_parallel)")
    pp, virtual = parallelism.get("pipeline"), parallelism.get("virtual_stages") or 1
    accounted = 2 if parallelism.get("pipeline_split") == "accounted" else 0  # the embedding and the loss as layers
    if pp and model.get("num_layers") and (model["num_layers"] + accounted) % (pp * virtual):
        chunks = f"pp {pp} × {virtual} virtual stages" if virtual > 1 else f"pp {pp}"
        reasons.append(f"{model['num_layers']} Transformer blocks do not split into {chunks} equal chunks: the run's "
                       "uneven pipeline layout (a custom --pipeline-model-parallel-layout, or a recipe's split not "
                       "read) is not one gbmw's uniform configurations express")
    if _moe_target(run) is None:
        reasons.append(f"framework {parallelism.get('framework')!r} not mapped to a gbmw target")
    elif _moe_target(run) == "megatron-core" and parallelism.get("sequence_parallel") is False and (tp or 1) > 1:
        reasons.append("EP with TP and no sequence parallelism: megatron-core requires it")
    if cluster.get("gpus") and cluster["gpus"] > (cluster.get("gpus_per_node") or 8) and _node_bandwidth(cluster) is None:
        reasons.append("inter-node network not stated")
    measured = run["measured"]
    if not (measured.get("iteration_seconds") or measured.get("tokens_per_second_per_gpu")):
        reasons.append("no measured iteration time or tokens/s (TFLOP/s only)")
    return reasons


def build_moe_job(run: dict, cluster: ClusterSpec, assumptions: list[str]) -> JobSpec:
    """The model as its provider defines it: grouped-query attention with its head width, a SwiGLU MLP (Mixtral,
    Qwen3-MoE, DeepSeek, GPT-OSS alike), RMSNorm, rotary positions, no biases, untied embeddings, flash attention
    (Transformer Engine's fused attention in every framework here), no dropout, and the routed experts. GPT-OSS
    (Megatron-Bridge's GPTOSSProvider, transformers' modeling_gpt_oss.py) adds biases on every linear and on the
    router, a learned softmax sink per head, and a 128-token window in every even block (the odd ones attend to the
    whole sequence)."""
    model, moe = run["model"], run["model"]["moe"]
    notes = " ".join(run.get("notes") or []).lower()
    if "balance" in notes:
        assumptions.append("load_imbalance 1.0 (the source balances the routing)")
    else:
        assumptions.append("load_imbalance 1.0 (routing balance not stated)")
    if "qk_layernorm" in notes:
        assumptions.append("q/k RMSNorm (qk_layernorm) not costed")
    experts = MixtureOfExperts(
        num_experts=moe["num_experts"], top_k=moe["top_k"], expert_ffn_hidden_size=moe["expert_ffn_hidden_size"],
        shared_experts=moe.get("shared_experts") or 0,
        shared_expert_ffn_hidden_size=moe.get("shared_expert_ffn_hidden_size"),
        dense_blocks=_dense_blocks(run), capacity_factor=moe.get("capacity_factor"), router_bias=_gpt_oss(run))
    gpt_oss = dict(bias=True, attention_sinks=True, sliding_window=128,
                   full_attention_blocks=tuple(range(1, model["num_layers"], 2))) if _gpt_oss(run) else {}
    architecture = GPTArchitecture(
        name=run["name"], family="gpt", num_layers=model["num_layers"], hidden_size=model["hidden_size"],
        num_heads=model["num_attention_heads"], num_kv_heads=model.get("num_kv_heads"), head_dim=model.get("head_dim"),
        ffn_hidden_size=model.get("ffn_hidden_size"), seq_length=model["seq_length"], vocab_size=model["vocab_size"],
        gated_mlp=True, norm="rms", position_embedding="rotary", tie_embeddings=False, dropout=False,
        attention="flash", moe=experts, **{"bias": False, **gpt_oss})
    precision = "fp8" if "fp8" in str(run.get("precision")).lower() else "bf16"
    spec = build_model(architecture, precision)
    return JobSpec(name=run["name"], model=spec, cluster=cluster, precision=precision, fp8_recipe=fp8_recipe(run),
                   gradient_reduce_dtype=gradient_reduce_dtype(run), tp_comm_overlap=tp_comm_overlap(run),
                   adam_moments_dtype=run.get("adam_moments_dtype") or "fp32",
                   global_batch=run["parallelism"]["global_batch"], memory_budget_bytes=cluster.usable_memory_bytes)


def fp8_recipe(run: dict) -> str:
    """The run's FP8 scaling: current where the source says current scaling (FP8-CS) or the recipe committed with it
    does (`fp8_recipe`), else delayed (Transformer Engine's default in megatron-core)."""
    precision = str(run.get("precision")).lower()
    if "fp8" not in precision:
        return "delayed"
    if run.get("fp8_recipe"):
        return run["fp8_recipe"]
    return "current" if re.search(r"current scaling|fp8-cs", precision) else "delayed"


def gradient_reduce_dtype(run: dict) -> str:
    """The dtype the run reduces its gradients in: bf16 where its recipe says so (`gradient_reduce_dtype`, quoted in
    the data file), else fp32 (Megatron's default)."""
    return run.get("gradient_reduce_dtype") or "fp32"


def tp_comm_overlap(run: dict) -> bool:
    """Whether the run overlaps its TP collectives with its GEMMs (Transformer Engine's userbuffers): where its recipe
    says so (`tp_comm_overlap`, quoted in the data file), on its TP > 1 sequence-parallel layers (gbmw.cost
    .tp_comm_overlap); else not (Megatron's default)."""
    return bool(run["parallelism"].get("tp_comm_overlap")) and bool(run["parallelism"].get("sequence_parallel"))


def moe_measured_iteration_s(run: dict) -> tuple[float, str]:
    """The published iteration time, or the one the published tokens/s per GPU implies:
    global batch × sequence length / (tokens/s/GPU × GPUs)."""
    measured = run["measured"]
    if measured.get("iteration_seconds"):
        return float(measured["iteration_seconds"]), "iteration time"
    tokens = run["parallelism"]["global_batch"] * run["model"]["seq_length"]
    return tokens / (measured["tokens_per_second_per_gpu"] * run["cluster"]["gpus"]), "tokens/s per GPU"


def cost_moe(run: dict) -> Costed:
    run, assumptions = with_recipe_fields(run)
    parallelism = run["parallelism"]
    cluster = build_cluster(run, assumptions)
    job = build_moe_job(run, cluster, assumptions)
    target = _moe_target(run)
    tp, ep = parallelism["tensor"], parallelism["expert"]
    recompute = parallelism["recompute"]
    if target == "runtime":
        zero = 3  # FSDP2: every parameter sharded over the data-parallel (FSDP) group
    else:
        zero = 1 if parallelism.get("distributed_optimizer") else 0
        if parallelism.get("distributed_optimizer") is None:
            assumptions.append("no distributed optimizer (not stated)")
    sp = bool(parallelism.get("sequence_parallel"))
    if target == "megatron-core" and tp > 1 and ep > 1 and parallelism.get("sequence_parallel") is None:
        sp = True
        assumptions.append("sp=on (megatron-core requires sequence parallelism with EP and TP; not stated)")
    etp = parallelism.get("expert_tensor")
    if tp > 1 and etp is None:
        assumptions.append(f"expert TP = TP {tp} (megatron-core's default; ETP not stated)")
    if parallelism["global_batch"] % (parallelism["micro_batch"] * parallelism["data"]):
        raise ValueError(f"{run['name']}: global batch not a multiple of micro-batch × DP")
    config = UniformConfig(tp=tp, pp=parallelism["pipeline"], zero=zero, ckpt=recompute, sp=sp, ep=ep, etp=etp,
                           split=parallelism.get("pipeline_split") or "even", micro=parallelism["micro_batch"],
                           batch=parallelism["global_batch"], target=target)
    if target == "runtime":
        # FSDP2 with EP (NeMo AutoModel) is costed as gbmw's runtime runs it (its FSDP2 shards the experts over their
        # expert-data-parallel group, gbmw.adapters.runtime.expert_data_parallel), on Megatron's partition
        plan = _plan_with_partition(config, job, tuple(megatron_partition(job.model, config.pp)))
        get_target("runtime").check(plan, job.model)
        assumptions.append("costed as gbmw's runtime runs FSDP + EP")
    else:
        plan = config.to_plan(job)
    plan, virtual = _interleaved(plan, parallelism, job)
    REGIMES[run["name"]] = plan_regime(plan, job)
    estimate = estimate_plan(job, plan, fused_elementwise=FUSED_ELEMENTWISE)
    measured, measured_from = moe_measured_iteration_s(run)
    described = config.describe() + (f",v={virtual}" if virtual > 1 else "") + f",gpus={run['cluster']['gpus']}"
    return Costed(run["name"], run["source"]["title"].split(",")[0][:40], described, measured, measured_from,
                     estimate.iteration_time_s, tuple(assumptions), *memory_gib(estimate, job))


# ---- long-context runs (issues 27/28): benchmarks/published_long_context_runs.yaml ----------------------------------

LONG_CONTEXT_DATA = Path(__file__).with_name("published_long_context_runs.yaml")
NEMO_LLAMA_FLOPS = ("NVIDIA/NeMo nemo/utils/flops_formulas.py llama2() @ 8cfedd72 (the long-sequence page's commit): "
                    "gbs·s·L·h²·(12 + 12·g/a + 18·f/h + 12·s/h · 0.5 (causal) + 6·V/(L·h))")


def why_long_context_run_not_costable(run: dict) -> list[str]:
    """Every reason a context-parallel run cannot be costed as published (empty: it can)."""
    run, _ = with_recipe_fields(run)
    parallelism, cluster, model, measured = run["parallelism"], run["cluster"], run["model"], run["measured"]
    precision = str(run.get("precision") or "").lower()
    notes = " ".join(run.get("notes") or [])
    reasons = []
    if "INCONSISTENT ROW" in notes:
        reasons.append("TP·PP·DP·CP is not the stated GPU count")
    if _device_recipe(cluster) is None:
        reasons.append(f"device {cluster.get('gpu')!r} has no bundled recipe")
    if "fp8" in precision and re.search(r"block|mxfp8|fp8-mx", precision):
        reasons.append("FP8 with blockwise or MXFP8 scaling (gbmw costs delayed and current scaling)")
    target = _long_context_target(run)
    if target is None:
        reasons.append(f"framework {parallelism.get('framework')!r}: gbmw costs CP as megatron-core (Megatron, NeMo) or "
                       "its runtime (NeMo AutoModel's FSDP2) run it")
    keys = ("tensor", "pipeline", "data", "context", "micro_batch", "global_batch", "recompute", "sequence_parallel")
    missing = [key for key in keys + (("distributed_optimizer",) if target == "megatron-core" else ())
               if parallelism.get(key) is None]
    if missing:
        reasons.append(f"configuration not stated: {', '.join(missing)}")
    if not (measured.get("iteration_seconds") or measured.get("tokens_per_second_per_gpu")):
        reasons.append("TFLOP/s only (no iteration time or tokens/s)")
    return reasons


def _long_context_target(run: dict) -> str | None:
    """The gbmw target that runs a context-parallel run as its framework does: megatron-core for Megatron and NeMo
    (megatron-core's CP), gbmw's runtime for NeMo AutoModel (PyTorch FSDP2 with CP: every parameter sharded over the
    data-parallel × CP ranks, as the runtime's `sdp` with a `cp` axis shards them, Strategy.gradient_view)."""
    framework = str(run["parallelism"].get("framework") or "").lower()
    if "megatron-core" in framework:
        return "megatron-core"
    return "runtime" if framework.startswith("nemo automodel") else None


def cost_long_context(run: dict) -> Costed:
    """A context-parallel run in its own configuration (TP, PP, DP, CP, interleaving, recomputation, sequence
    parallelism, distributed optimizer or FSDP) on the target that runs it (`_long_context_target`), in FP8 where the
    run is."""
    run, assumptions = with_recipe_fields(run)
    parallelism = run["parallelism"]
    target = _long_context_target(run)
    cluster = build_cluster(run, assumptions)
    if cluster.nodes > 1 and run["cluster"].get("nics_per_node") is None:
        assumptions.append("8 x 400 Gb/s NDR per DGX-H100 node")
    precision = "fp8" if "fp8" in str(run["precision"]).lower() else "bf16"
    job = JobSpec(name=run["name"], model=build_model(llama_architecture(run), precision), cluster=cluster,
                  precision=precision, fp8_recipe=fp8_recipe(run), global_batch=parallelism["global_batch"],
                  gradient_reduce_dtype=gradient_reduce_dtype(run), tp_comm_overlap=tp_comm_overlap(run),
                  adam_moments_dtype=run.get("adam_moments_dtype") or "fp32",
                  memory_budget_bytes=cluster.usable_memory_bytes)
    zero = 3 if target == "runtime" else 1 if parallelism["distributed_optimizer"] else 0
    config = UniformConfig(tp=parallelism["tensor"], pp=parallelism["pipeline"], zero=zero, ckpt=parallelism["recompute"],
                           sp=bool(parallelism["sequence_parallel"]) and parallelism["tensor"] > 1,
                           cp=parallelism["context"], micro=parallelism["micro_batch"],
                           batch=parallelism["global_batch"], target=target)
    plan, virtual = _interleaved(config.to_plan(job), parallelism, job)
    if target == "runtime":
        get_target("runtime").check(plan, job.model)
        assumptions.append("costed as gbmw's runtime runs FSDP2 + CP (sdp with a cp axis)")
    REGIMES[run["name"]] = plan_regime(plan, job)
    _record_tp_comm_overlap(run)
    estimate = estimate_plan(job, plan, fused_elementwise=FUSED_ELEMENTWISE)
    measured, measured_from = moe_measured_iteration_s(run)
    described = config.describe() + (f",v={virtual}" if virtual > 1 else "") + f",gpus={run['cluster']['gpus']}"
    return Costed(run["name"], run["source"]["title"].split(",")[0][:40], described, measured, measured_from,
                     estimate.iteration_time_s, tuple(assumptions), *memory_gib(estimate, job))


def print_long_context_table(console: Console) -> list[Costed]:
    """The context-parallel table and its summary; the runs not costed, each with every reason."""
    runs = yaml.safe_load(LONG_CONTEXT_DATA.read_text())["runs"]
    costed, skipped = [], []
    for run in runs:
        reasons = why_long_context_run_not_costable(run)
        if reasons:
            skipped.append((run["name"], "; ".join(reasons)))
        else:
            costed.append(cost_long_context(run))
    table = Table(title="published long-context (context-parallel) runs: gbmw's predicted iteration time vs the "
                        "published one")
    for column in ("run", "config", "published s", "from", "predicted s", "error", "peak GiB", "assumed"):
        table.add_column(column, justify="right" if column in ("published s", "predicted s", "error", "peak GiB")
                         else "left", overflow="fold")
    for row in costed:
        table.add_row(row.name, row.config, f"{row.measured_s:.3f}", row.measured_from, f"{row.predicted_s:.3f}",
                      f"{row.error:+.1%}", f"{row.peak_memory_gib:.1f}", "; ".join(row.assumptions))
    console.print(table)
    console.print(_summary(costed, "long-context ")[0])
    console.print(f"long-context runs not costed ({len(skipped)}):")
    for name, reason in skipped:
        console.print(f"  {name}: {reason}")
    return costed


def _summary(rows: list[Costed], label: str) -> tuple[str, bool]:
    """The summary line of `rows` against the targets, and whether they are met."""
    if not rows:
        return f"no {label}run could be costed: FAIL (targets mean |error| ≤ {MEAN_TARGET:.0%}, max ≤ {MAX_TARGET:.0%})", False
    errors = [abs(row.error) for row in rows]
    mean, worst = statistics.mean(errors), max(errors)
    met = mean <= MEAN_TARGET and worst <= MAX_TARGET
    sources = {row.source for row in rows}
    return (f"{len(rows)} {label}runs from {len(sources)} sources: mean |error| {mean:.1%} (target ≤ {MEAN_TARGET:.0%}), "
            f"max {worst:.1%} (target ≤ {MAX_TARGET:.0%}), signed mean {statistics.mean(r.error for r in rows):+.1%}"), met


def print_moe_table(console: Console) -> tuple[list[Costed], bool]:
    """The MoE table, its summary against issue 26's targets and the runs not costed; whether the targets are met."""
    runs = yaml.safe_load(MOE_DATA.read_text())["runs"]
    costed, skipped = [], []
    for run in runs:
        reasons = why_moe_run_not_costable(run)
        if reasons:
            skipped.append((run["name"], "; ".join(reasons)))
        else:
            costed.append(cost_moe(run))
    table = Table(title="published mixture-of-experts runs: gbmw's predicted iteration time vs the published one")
    for column in ("run", "source", "config", "published s", "from", "predicted s", "error", "peak GiB", "assumed"):
        table.add_column(column, justify="right" if column in ("published s", "predicted s", "error", "peak GiB")
                         else "left", overflow="fold")
    for row in costed:
        table.add_row(row.name, row.source, row.config, f"{row.measured_s:.3f}", row.measured_from,
                      f"{row.predicted_s:.3f}", f"{row.error:+.1%}", f"{row.peak_memory_gib:.1f}",
                      escape("; ".join(row.assumptions)))
    console.print(table)
    line, met = _summary(costed, "MoE ")
    sources = len({row.source for row in costed})
    enough = len(costed) >= 6 and sources >= 2
    console.print(f"{line} — issue 26 target {'PASS' if met else 'FAIL'}; issue 26 asks for ≥ 6 costed runs from "
                  f"≥ 2 sources: {len(costed)} from {sources} ({'met' if enough else 'not met'})")
    console.print(f"MoE runs not costed ({len(skipped)}):")
    for name, reason in skipped:
        console.print(f"  {name}: {escape(reason)}")
    return costed, met and enough


COMPOSER_WEIGHTS_TARGET = "deepspeed"
"""The gbmw target whose framework holds what Composer's FSDP holds under mixed_precision DEFAULT or PURE: both set
FSDP's param_dtype to bf16 (mosaicml/composer v0.16.4 composer/trainer/mosaic_fsdp_utils.py `get_mixed_precision`,
which llm-foundry v0.3.0 — what its October 2023 sweep ran, `git_branch: v0.3.0` in scripts/train/benchmarking/
submit_benchmarks.py — pins as mosaicml>=0.16.3,<0.17; v0.16.3's DEFAULT too; PURE likewise in composer v0.14.1,
the release beside the May 2023 rows: composer/trainer/mosaic_fsdp.py), so the layers compute with bf16 weights
gathered in bf16 — as DeepSpeed's ZeRO-3 does — not with the runtime's fp32 weights under autocast, which keeps a bf16
copy of every weight in flight and gathers fp32. Neither target is Composer:
DeepSpeed keeps 20 bytes of states per parameter where FSDP keeps 16 (fp32 shard, fp32 gradient shard, Adam's two
moments), steps a fused Adam where llm-foundry's DecoupledAdamW loops over tensors, and reduces in bf16 where DEFAULT
reduces in fp32 (composer v0.16.4). The benchmark costs the runs on the runtime and prints them on this target beside."""


def print_composer_weights(console: Console, runs: list[dict], costed: list[Costed]) -> None:
    """The Composer (llm-foundry) runs costed on COMPOSER_WEIGHTS_TARGET beside the runtime: time and memory."""
    by_name = {row.name: row for row in costed}
    composer = [run for run in runs if _framework(run) == "composer/llm-foundry" and run["name"] in by_name]
    if not composer:
        return
    table = Table(title="Composer's FSDP runs: gbmw's runtime (fp32 weights under autocast) beside DeepSpeed ZeRO-3 "
                        "(bf16 weights, as Composer's param_dtype) — see COMPOSER_WEIGHTS_TARGET")
    for column in ("run", "runtime error", "runtime peak GiB", "deepspeed error", "deepspeed peak GiB", "usable GiB"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for run in composer:
        runtime, bf16_weights = by_name[run["name"]], cost(run, COMPOSER_WEIGHTS_TARGET)
        table.add_row(run["name"], f"{runtime.error:+.1%}", f"{runtime.peak_memory_gib:.1f}",
                      f"{bf16_weights.error:+.1%}", f"{bf16_weights.peak_memory_gib:.1f}", f"{runtime.usable_gib:.1f}")
    console.print(table)


TRITON_ATTENTION_SLOWDOWNS = (1.3, 2.5)
"""How much slower than FlashAttention-2 "FlashAttention in Triton" runs on an A100: FlashAttention-2 is "1.3-2.5×
faster than FlashAttention in Triton" (Dao, FlashAttention-2, 2023, Sec. 4). That Triton kernel (Tri Dao's
flash_attn_triton.py for triton 2.0.0.dev20221202) is what llm-foundry's benchmark sweeps ran (`attn_impl: triton`,
submit_benchmarks.py's default), while the A100 recipe carries FlashAttention-2's measured rate. No measurement of the
Triton kernel at MPT's shapes (ALiBi bias, head dim 64 or 128, causal) exists here, so the headline keeps the recipe's
rate and `print_triton_attention` prints the A100 Composer rows at both ends of the range beside it (the range is an
A100 one: the H100 row is left out of it)."""


def print_triton_attention(console: Console, runs: list[dict], costed: list[Costed]) -> None:
    """The A100 Composer (llm-foundry) runs with their attention at FlashAttention-2's rate divided by each of
    TRITON_ATTENTION_SLOWDOWNS, beside the headline error: a bracket, not a costing."""
    by_name = {row.name: row for row in costed}
    composer = [run for run in runs if _framework(run) == "composer/llm-foundry" and run["name"] in by_name
                and "A100" in run["cluster"]["gpu"]]
    if not composer:
        return
    table = Table(title="llm-foundry's A100 runs with its Triton FlashAttention at FlashAttention-2's rate ÷ 1.3 and "
                        "÷ 2.5 (the FlashAttention-2 paper's range) — see TRITON_ATTENTION_SLOWDOWNS")
    for column in ("run", "headline error", *(f"attention ÷ {factor}" for factor in TRITON_ATTENTION_SLOWDOWNS)):
        table.add_column(column, justify="left" if column == "run" else "right")
    for run in composer:
        slowed = [cost(run, attention_slowdown=factor).error for factor in TRITON_ATTENTION_SLOWDOWNS]
        table.add_row(run["name"], f"{by_name[run['name']].error:+.1%}", *(f"{error:+.1%}" for error in slowed))
    console.print(table)


def _record_tp_comm_overlap(run: dict) -> None:
    """Note a TP > 1 run's TP communication overlap (its recipe's, filled in by with_recipe_fields) in TP_COMM_OVERLAP."""
    if run["parallelism"]["tensor"] > 1:
        TP_COMM_OVERLAP[run["name"]] = run["parallelism"].get("tp_comm_overlap")


def print_tp_comm_overlap(console: Console, rows: list[Costed]) -> None:
    """The TP > 1 runs split by whether their recipe turns on Transformer Engine's TP communication overlap
    (userbuffers: the sequence-parallel collectives under the TP GEMMs; costed, gbmw.cost.tp_comm_overlap)."""
    groups = {"on": True, "off": False, "not stated": None}
    parts = []
    for label, value in groups.items():
        errors = [row.error for row in rows if row.name in TP_COMM_OVERLAP and TP_COMM_OVERLAP[row.name] is value]
        if errors:
            parts.append(f"{label} {len(errors)} runs, signed mean {statistics.mean(errors):+.1%}, "
                         f"mean |error| {statistics.mean(abs(e) for e in errors):.1%}")
    console.print("TP communication overlap (the recipe's `tp_comm_overlap`, costed as gbmw.cost.tp_comm_overlap "
                  "prices it), TP > 1 runs: " + "; ".join(parts))


def print_regime_table(console: Console, rows: list[Costed]) -> None:
    """The error per regime (issue 28): for each feature of gbmw.cli.trust.plan_regime and each of its values, the
    costed runs (dense, MoE and long-context together) that have it."""
    table = Table(title="error per regime: all costed runs with each feature value (gbmw.cli.trust.plan_regime)")
    for column in ("feature", "value", "runs", "mean |error|", "signed mean", "worst"):
        table.add_column(column, justify="left" if column in ("feature", "value") else "right")
    for feature in FEATURES:
        values = sorted({REGIMES[row.name][feature] for row in rows})
        for value in values:
            errors = [row.error for row in rows if REGIMES[row.name][feature] == value]
            table.add_row(feature, value, str(len(errors)), f"{statistics.mean(map(abs, errors)):.1%}",
                          f"{statistics.mean(errors):+.1%}", f"{max(errors, key=abs):+.1%}")
        table.add_section()
    console.print(table)


def regimes_yaml(rows: list[Costed]) -> str:
    """Every costed run's name, source, error and regime, as recipes/published_errors.yaml holds them."""
    header = ("# Written by `python benchmarks/published_runs.py --regimes FILE` (do not edit by hand): each published\n"
              "# run gbmw costs, its error (estimate / measured - 1) and its regime (gbmw.cli.trust.plan_regime).\n")
    return header + yaml.safe_dump({"runs": [
        dict(name=row.name, source=row.source, error=round(row.error, 4), regime=REGIMES[row.name])
        for row in rows]}, sort_keys=False, allow_unicode=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this new file")
    parser.add_argument("--regimes", type=Path, help="also write each costed run's error and regime to this new "
                        "file (what recipes/published_errors.yaml holds for `plan`, `estimate` and `compare`)")
    args = parser.parse_args()
    for option, path in (("--json", args.json), ("--regimes", args.regimes)):
        if path is not None and (path.exists() or path.is_symlink()):  # said before the minutes of work, not after
            parser.error(f"{option} {path}: exists; the benchmark writes new files only — choose a new name")
    runs = yaml.safe_load(DATA.read_text())["runs"]
    console = Console(highlight=False, width=180)
    costed, skipped = [], []
    for run in runs:
        reason = why_not_costable(run)
        if reason:
            skipped.append((run["name"], reason))
        else:
            costed.append(cost(run))
    table = Table(title="published runs: gbmw's predicted iteration time vs the published one")
    for column in ("run", "config", "published s", "from", "predicted s", "error", "peak GiB", "assumed"):
        table.add_column(column, justify="right" if column in ("published s", "predicted s", "error", "peak GiB")
                         else "left")
    for row in costed:
        table.add_row(row.name, row.config, f"{row.measured_s:.3f}", row.measured_from, f"{row.predicted_s:.3f}",
                      f"{row.error:+.1%}", f"{row.peak_memory_gib:.1f}", "; ".join(row.assumptions))
    console.print(table)
    errors = [abs(row.error) for row in costed]
    sources = {row.source for row in costed}
    mean, worst = statistics.mean(errors), max(errors)
    console.print(f"{len(costed)} runs from {len(sources)} sources: mean |error| {mean:.1%} (target ≤ {MEAN_TARGET:.0%}), "
                  f"max {worst:.1%} (target ≤ {MAX_TARGET:.0%}), signed mean {statistics.mean(r.error for r in costed):+.1%}")
    console.print(f"not costed ({len(skipped)}):")
    for name, reason in skipped:
        console.print(f"  {name}: {reason}")
    console.print()
    moe_costed, moe_met = print_moe_table(console)
    console.print()
    long_context_costed = print_long_context_table(console)
    fp8 = [row for row in costed + moe_costed + long_context_costed if "fp8" in row.name]
    console.print(f"FP8 runs (issue 28, target |error| ≤ 10 %): {_summary(fp8, 'FP8 ')[0]}" if fp8 else
                  "no FP8 run costed")
    print_regime_table(console, costed + moe_costed + long_context_costed)
    print_tp_comm_overlap(console, costed + long_context_costed)
    over = [row for row in costed + moe_costed + long_context_costed if row.peak_memory_gib > row.usable_gib]
    console.print(f"memory (issue 28: configurations that trained are estimated to fit): {len(over)} of "
                  f"{len(costed + moe_costed + long_context_costed)} costed runs over the memory gbmw gives them" +
                  "".join(f"\n  {row.name}: {row.peak_memory_gib:.1f} GiB of {row.usable_gib:.1f}" for row in over))
    print_composer_weights(console, runs, costed)
    print_triton_attention(console, runs, costed)
    if args.regimes:
        from gbmw.specs.files import write_new_file

        write_new_file(args.regimes, regimes_yaml(costed + moe_costed + long_context_costed))
    if args.json:
        from gbmw.specs.files import write_new_file

        write_new_file(args.json, json.dumps([dict(vars(row), error=row.error) for row in costed] + [
            dict(vars(row), error=row.error, table="moe") for row in moe_costed] + [
            dict(vars(row), error=row.error, table="long-context") for row in long_context_costed], indent=1))
    return 0 if mean <= MEAN_TARGET and worst <= MAX_TARGET and moe_met else 1


if __name__ == "__main__":
    sys.exit(main())
