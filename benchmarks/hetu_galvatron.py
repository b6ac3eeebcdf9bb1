"""Run hetu-galvatron 2.4.0's search on a gbmw job, side by side with gbmw.

hetu-galvatron (PyPI `hetu-galvatron`, the reference implementation of Galvatron-BMW) lives in its
own virtual environment (benchmarks/setup_hetu_venv.sh, default <repo>/.venv-hetu); it is never a
dependency of gbmw. This module has two halves:

* In gbmw's environment: `write_hetu_inputs` turns a gbmw JobSpec into the JSON profiles hetu's
  search reads (layer times and memory, collective bandwidths, overlap coefficient), so that both
  tools see the same layer costs, bandwidths, memory budget and batch; `run_hetu_search` runs the
  search as a subprocess with the venv's python and times it; `hetu_plan_to_gbmw` converts hetu's
  output config into a gbmw Plan that `gbmw.cost.estimate` can cost.
* In hetu's environment: `python hetu_galvatron.py --hetu-runner HETU-ARGS...` is the subprocess.
  It replaces the GPU-only modules that `galvatron.core` imports eagerly (apex, flash-attn, ...)
  with inert placeholders, runs the search through hetu's llama_hf entry points, and prints one
  `HETU_TIMING {json}` line. That half imports nothing from gbmw.

Unit conventions of hetu's files (read from its search engine): times in ms, memory in MiB,
bandwidths in MiB/ms (it multiplies message MiB by 1/bandwidth to get ms), so the bandwidths
written here are gbmw's bytes/s divided by 2**20 * 1e3.

`python benchmarks/hetu_galvatron.py [JOB] [--batch B]` runs one job end to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # gbmw is imported lazily: the runner half runs in hetu's venv, without gbmw
    import gbmw

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_ENV_VAR = "GBMW_HETU_VENV"
MiB = 2**20
RUNNER_FLAG = "--hetu-runner"
TIMING_TAG = "HETU_TIMING "

#: hetu's llama_hf model name used for file names; its `llama-7b` preset (hidden 4096, 32 layers,
#: 32 heads, SwiGLU FFN 11008, 2048 positions, 32000 tokens: the LLaMA paper's 7B shape).
HETU_MODEL_SIZE = "llama-7b"
HETU_LLAMA_7B_SHAPE = {"hidden": 4096, "layers": 32, "heads": 32, "ffn": 11008, "seq": 2048, "vocab": 32000}

#: The flags of the timed command in shared/peers/hetu-galvatron/NOTES.md that do not depend on the job.
SEARCH_FLAGS = [
    "--settle_bsz", "-1", "--recommend_min_bsz", "0",
    "--search_space", "full", "--disable_dp", "0", "--disable_tp", "0", "--disable_pp", "0",
    "--disable_sdp", "0", "--disable_ckpt", "0", "--disable_vtp", "0", "--disable_tp_consec", "1",
    "--max_tp_deg", "8", "--max_pp_deg", "16", "--fine_grained_mode", "1",
    "--time_profile_mode", "batch", "--memory_profile_mode", "static",
    "--pipeline_type", "pipedream_flush", "--default_dp_type", "zero2",
]
MAX_TP = 8
#: hetu's per-stage allowance for the CUDA context (TrainArgs.pytorch_context_mem, MiB).
HETU_CONTEXT_MIB = 1024


def default_venv_python() -> Path:
    venv = Path(os.environ.get(VENV_ENV_VAR, REPO_ROOT / ".venv-hetu"))
    return venv / "bin" / "python"


# ==============================================================================================
# Inputs: gbmw JobSpec -> hetu's JSON profiles
# ==============================================================================================


def _powers_of_two(limit: int, start: int = 1) -> list[int]:
    values, value = [], start
    while value <= limit:
        values.append(value)
        value *= 2
    return values


def _split_layers(model: "gbmw.ModelSpec"):
    """(embedding, blocks, head) of a decoder-only model as hetu's llama_hf entry expects."""
    layers = model.layers
    if len(layers) < 3 or layers[0].kind != "embedding" or layers[-1].kind != "head":
        raise ValueError(
            f"model {model.name}: hetu's llama_hf search needs embedding + blocks + head; "
            f"got kinds {[layer.kind for layer in layers[:2]]}…{layers[-1].kind}"
        )
    blocks = layers[1:-1]
    kinds = {block.kind for block in blocks}
    if len(kinds) != 1:
        raise ValueError(f"model {model.name}: hetu's llama_hf search has one block type; got {sorted(kinds)}")
    reference = blocks[0].model_dump(exclude={"name"})
    for block in blocks[1:]:
        if block.model_dump(exclude={"name"}) != reference:
            raise ValueError(f"model {model.name}: block {block.name} differs from {blocks[0].name}; hetu's "
                             "search gives every block of a type the same profile")
    return layers[0], blocks, layers[-1]


def model_shape(job: "gbmw.JobSpec") -> dict[str, int]:
    """hidden, layers, heads, seq, vocab of the job's model (ffn when the block is a LLaMA block)."""
    model = job.model
    embedding, blocks, _ = _split_layers(model)
    hidden = model.hidden_size
    block = blocks[0]
    shape = {
        "hidden": hidden,
        "layers": len(blocks),
        "heads": block.attention_heads,
        "seq": model.sequence_length,
        "vocab": embedding.tp_split_parameter_count // hidden,
    }
    # SwiGLU block without biases: 4h^2 (attention) + 3h*ffn (MLP) TP-split parameters.
    attention = 4 * hidden * hidden
    if (block.tp_split_parameter_count - attention) % (3 * hidden) == 0:
        shape["ffn"] = (block.tp_split_parameter_count - attention) // (3 * hidden)
    return shape


def _activation_mib_per_sample(layer: "gbmw.LayerSpec", tp: int) -> float:
    """gbmw's forward stash of one sample (boundary + intermediate, TP-split part / tp), MiB."""
    return (
        layer.boundary_activation_bytes_per_sample
        + layer.intermediate_activation_bytes_per_sample
        + layer.intermediate_tp_split_activation_bytes_per_sample / tp
    ) / MiB


def _local_parameters(layer: "gbmw.LayerSpec", tp: int) -> float:
    return layer.tp_split_parameter_count / tp + (layer.parameter_count - layer.tp_split_parameter_count)


def hetu_memory_constraint_gb(budget_bytes: int) -> tuple[int, float]:
    """--memory_constraint (integer GB as hetu reads it) whose usable memory is closest to the
    budget without exceeding it, and that usable memory in MiB.

    hetu takes C * 1024 MiB, reserves 20 % of it for the allocator cache when C > 20
    (DpOnModel.mem_cache), and charges each stage its CUDA-context allowance (1024 MiB); the
    rest is for model states and activations, which is what gbmw's budget bounds."""
    budget_mib = budget_bytes / MiB

    def usable(c: int) -> float:
        total = c * 1024
        cache = int(total * 0.2) if total // 1024 > 20 else 0
        return total - cache - HETU_CONTEXT_MIB

    # usable(c) drops when the cache reserve starts (c = 21): take the c with the most usable memory
    fitting = [c for c in range(1, 4096) if usable(c) <= budget_mib] or [1]
    best = max(fitting, key=lambda c: (usable(c), -c))
    return best, usable(best)


def write_hetu_inputs(job: "gbmw.JobSpec", folder: str | os.PathLike, batch: int, *,
                      sequence_parallel: bool = True) -> dict[str, Any]:
    """Write every JSON input of hetu's search for `job` under `folder` and return
    {"args": the search's command-line arguments (all but --output_config_path/--log_dir),
     "files": written paths, "memory_constraint_gb", "hetu_usable_mib", "notes": what differs}.

    Layer time: hetu reads per-sample forward ms of one block (fitted over batch sizes; every
    size gets the same per-sample time, so the fit is exact) and of the vocabulary layers; both
    are gbmw's `forward_time_per_sample_s` (profiled time or FLOPs / sustained FLOP/s).
    Layer memory: parameter size such that hetu's 4x (model states) equals gbmw's bytes of
    model states per parameter, forward stash per sample for each TP degree, and the checkpointed
    stash (the block's input). Hardware: bus bandwidths and collective times from gbmw.cost.comm.CommModel.
    """
    from gbmw.cost.comm import CommModel
    from gbmw.cost.layer_cost import CostSettings, forward_time_per_sample_s
    from gbmw.cost.model_states import state_bytes

    folder = Path(folder)
    profiles, hardware = folder / "profiles", folder / "hardware"
    profiles.mkdir(parents=True, exist_ok=True)
    hardware.mkdir(parents=True, exist_ok=True)
    model, cluster = job.model, job.cluster
    embedding, blocks, head = _split_layers(model)
    shape = model_shape(job)
    seq, precision = model.sequence_length, job.precision
    num_devices, nodes, per_node = cluster.num_devices, cluster.nodes, cluster.devices_per_node
    tps = _powers_of_two(min(MAX_TP, num_devices))
    notes: list[str] = []

    # ---------------------------------------------------------------- computation profile
    settings = CostSettings(cluster, precision, job.optimizer)
    per_sample_s = forward_time_per_sample_s(model, settings)
    block_ms = float(per_sample_s[1]) * 1e3
    other_ms = float(per_sample_s[0] + per_sample_s[-1]) * 1e3
    computation = {}
    for bsz in range(1, 17):  # hetu fits a line over >= 8 batch sizes
        computation[f"layertype_0_bsz{bsz}_seq{seq}"] = block_ms
        computation[f"layertype_other_0_bsz{bsz}_seq{seq}"] = other_ms

    # ---------------------------------------------------------------- memory profile
    bytes_per_parameter = state_bytes("gbmw-runtime", precision, job.optimizer).total
    block = blocks[0]
    # hetu: model states = 4 x parameter_size (MiB); gradients in DP messages = parameter_size / 2 in mixed precision
    parameter_size = block.parameter_count * bytes_per_parameter / 4 / MiB
    layer_entry = {
        "parameter_size": parameter_size,
        "tp_activation_per_bsz_dict": {
            **{str(tp): _activation_mib_per_sample(block, tp) for tp in tps},
            "checkpoint": block.boundary_activation_bytes_per_sample / MiB,
        },
    }

    def states_mib(layers, tp):
        return sum(_local_parameters(layer, tp) for layer in layers) * bytes_per_parameter / MiB

    def other_entry(layers):
        return {
            "model_states": {str(tp): states_mib(layers, tp) for tp in tps},
            "activation": {str(tp): sum(_activation_mib_per_sample(layer, tp) for layer in layers) for tp in tps},
        }

    memory = {}
    for suffix in ("", "_sp"):
        memory[f"layertype_0{suffix}"] = {str(seq): layer_entry}
        memory[f"other_memory_pp_off{suffix}"] = {str(seq): other_entry([embedding, head])}
        memory[f"other_memory_pp_on_first{suffix}"] = {str(seq): other_entry([embedding])}
        memory[f"other_memory_pp_on_last{suffix}"] = {str(seq): other_entry([head])}

    # ---------------------------------------------------------------- hardware
    comm = CommModel(cluster)

    def mib_per_ms(bytes_per_s: float) -> float:
        return bytes_per_s / MiB / 1e3

    def allreduce_busbw(size: int, stride: int) -> float:  # nccl-tests bus bandwidth, bytes/s
        per_byte = comm.allreduce_s(1.0, size, stride) - comm.allreduce_s(0.0, size, stride)
        return 2 * (size - 1) / size / per_byte

    allreduce = {}
    for size in reversed(_powers_of_two(num_devices, 2)):
        # hetu's profile: consec_1 = groups of consecutive ranks, consec_0 = ranks N/size apart
        allreduce[f"allreduce_size_{size}_consec_1"] = mib_per_ms(allreduce_busbw(size, 1))
        if size < num_devices:
            allreduce[f"allreduce_size_{size}_consec_0"] = mib_per_ms(allreduce_busbw(size, num_devices // size))
    p2p = {}
    for pp in _powers_of_two(num_devices, 2):
        stage_devices = num_devices // pp
        per_byte = comm.p2p_s(2.0, stage_devices) - comm.p2p_s(1.0, stage_devices)
        p2p[f"pp_size_{pp}"] = mib_per_ms(1.0 / per_byte)
    sp_time = {}
    for size in reversed(_powers_of_two(num_devices, 2)):
        for mb in _powers_of_two(1024):
            sp_time[f"allreduce_size_{size}_{mb}MB_time"] = comm.allreduce_s(mb * MiB, size, 1) * 1e3
    for size in reversed(_powers_of_two(num_devices, 2)):
        for mb in _powers_of_two(1024):
            # all-to-all: each rank exchanges (n-1)/n of its buffer, the bytes of a ring all-gather
            sp_time[f"all2all_size_{size}_{mb}MB_time"] = comm.allgather_s(mb * MiB, size, 1) * 1e3

    files = {
        "computation": profiles / f"computation_profiling_{precision}_{HETU_MODEL_SIZE}.json",
        "memory": profiles / f"memory_profiling_{precision}_{HETU_MODEL_SIZE}.json",
        "allreduce": hardware / f"allreduce_bandwidth_{nodes}nodes_{per_node}gpus_per_node.json",
        "p2p": hardware / f"p2p_bandwidth_{nodes}nodes_{per_node}gpus_per_node.json",
        "overlap": hardware / "overlap_coefficient.json",
        "sp_time": hardware / f"sp_time_{nodes}nodes_{per_node}gpus_per_node.json",
    }
    contents = {
        "computation": computation, "memory": memory, "allreduce": allreduce, "p2p": p2p,
        "overlap": {"overlap_coe": cluster.overlap_slowdown}, "sp_time": sp_time,
    }
    for key, path in files.items():
        path.write_text(json.dumps(contents[key], indent=2) + "\n")

    # ---------------------------------------------------------------- arguments
    constraint_gb, usable_mib = hetu_memory_constraint_gb(job.memory_budget_bytes)
    if shape == HETU_LLAMA_7B_SHAPE:
        model_args = ["--model_size", HETU_MODEL_SIZE, "--set_model_config_manually", "0",
                      "--set_layernum_manually", "0", "--set_seqlen_manually", "0"]
    else:
        model_args = ["--model_size", HETU_MODEL_SIZE, "--set_model_config_manually", "1",
                      "--set_layernum_manually", "0", "--set_seqlen_manually", "0",
                      "--hidden_size", str(shape["hidden"]), "--num_hidden_layers", str(shape["layers"]),
                      "--num_attention_heads", str(shape["heads"]), "--seq_length", str(shape["seq"]),
                      "--vocab_size", str(shape["vocab"])]
        notes.append(f"hetu's manual model config fixes ffn = 8h/3 = {shape['hidden'] * 8 // 3} "
                     f"(ours {shape.get('ffn', '?')}); its search reads layer costs only from the profiles")
    bsz_scale = 16 if batch % 16 == 0 else batch
    args = [
        *model_args,
        "--min_bsz", str(batch), "--max_bsz", str(batch), "--bsz_scale", str(bsz_scale),
        *SEARCH_FLAGS,
        "--sp_space", "tp+sp",
        *(["--sequence_parallel"] if sequence_parallel else []),
        "--num_nodes", str(nodes), "--num_gpus_per_node", str(per_node),
        "--memory_constraint", str(constraint_gb), "--mixed_precision", precision,
        "--memory_profiling_path", str(profiles), "--time_profiling_path", str(profiles),
        "--allreduce_bandwidth_config_path", str(hardware), "--p2p_bandwidth_config_path", str(hardware),
        "--overlap_coe_path", str(hardware), "--sp_time_path", str(hardware),
    ]
    budget_mib = job.memory_budget_bytes / MiB
    if abs(usable_mib - budget_mib) > 0.5:
        notes.append(f"memory: hetu's --memory_constraint is whole GB; {constraint_gb} leaves it {usable_mib:.0f} MiB "
                     f"for states+activations (after its {HETU_CONTEXT_MIB} MiB context"
                     f"{' and 20% cache reserve' if constraint_gb > 20 else ''}) vs gbmw's budget {budget_mib:.0f} MiB")
    if bytes_per_parameter != 16:
        notes.append(f"{precision}/{job.optimizer}: {bytes_per_parameter} state bytes/param; hetu's DP message sizes assume "
                     "16 (Adam), so its gradient traffic is scaled by the same factor")
    if sequence_parallel:
        notes.append("--sequence_parallel (as timed in NOTES.md): hetu divides checkpointed stashes by TP and adds a "
                     "Megatron-SP all-gather buffer; gbmw replicates the block input across TP")
    return {"args": args, "files": {k: str(v) for k, v in files.items()}, "memory_constraint_gb": constraint_gb,
            "hetu_usable_mib": usable_mib, "shape": shape, "notes": notes}


# ==============================================================================================
# Running the search
# ==============================================================================================


@dataclasses.dataclass
class HetuResult:
    """One run of hetu's search."""

    job: str
    batch: int
    command: list[str]
    returncode: int
    wall_s: float
    """The whole subprocess: interpreter start, imports, profile reading, search, output."""
    search_s: float | None
    """`parallelism_optimization()` alone (hetu's outer loop, cost models and DP)."""
    init_s: float | None
    import_s: float | None
    strategies: int | None
    """Size of hetu's per-layer strategy set over all PP degrees."""
    hetu_throughput: float | None
    """hetu's own predicted samples/s of its best plan."""
    config: dict[str, Any] | None
    config_path: str | None
    log_path: str
    inputs: dict[str, Any]
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.config is not None


def run_hetu_search(job: "gbmw.JobSpec", batch: int | None = None, venv_python: str | os.PathLike | None = None,
                    workdir: str | os.PathLike | None = None, timeout_s: float = 1800, *,
                    sequence_parallel: bool = True) -> HetuResult:
    """Write the inputs for `job` under `workdir`, run hetu's search in its venv, time it and read
    its output config (HetuResult.config is None when it found no plan or failed)."""
    batch = batch if batch is not None else job.global_batch
    if batch is None:
        raise ValueError(f"job {job.name} fixes no global batch; pass batch=")
    venv_python = Path(venv_python) if venv_python is not None else default_venv_python()
    if not venv_python.exists():
        raise FileNotFoundError(f"{venv_python}: no hetu venv; run benchmarks/setup_hetu_venv.sh")
    workdir = Path(workdir).resolve() if workdir is not None else REPO_ROOT / "out" / "hetu" / f"{job.name}_b{batch}"
    workdir.mkdir(parents=True, exist_ok=True)
    inputs = write_hetu_inputs(job, workdir, batch, sequence_parallel=sequence_parallel)
    output_dir, log_dir = workdir / "output", workdir / "logs"
    output_dir.mkdir(exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    for stale in output_dir.glob("galvatron_config_*.json"):
        stale.unlink()
    command = [str(venv_python), str(Path(__file__).resolve()), RUNNER_FLAG, *inputs["args"],
               "--output_config_path", str(output_dir), "--log_dir", str(log_dir)]
    log_path = workdir / "search.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    timed_out = False
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
            timed_out = True
    wall_s = time.perf_counter() - started

    timing: dict[str, Any] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith(TIMING_TAG):
            timing = json.loads(line[len(TIMING_TAG):])
    configs = sorted(output_dir.glob("galvatron_config_*.json"))
    config = json.loads(configs[-1].read_text()) if configs else None
    return HetuResult(
        job=job.name, batch=batch, command=command, returncode=returncode, wall_s=wall_s,
        search_s=timing.get("search_s"), init_s=timing.get("init_s"), import_s=timing.get("import_s"),
        strategies=timing.get("strategies"), hetu_throughput=timing.get("throughput"),
        config=config, config_path=str(configs[-1]) if configs else None, log_path=str(log_path),
        inputs=inputs, timed_out=timed_out,
    )


# ==============================================================================================
# hetu's plan -> gbmw Plan
# ==============================================================================================


def _int_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(v) for v in str(value).split(",") if v.strip() != ""]


def _strategy_name(group: int, tp: int, data_axis: str, tp_consecutive: bool, ckpt: bool) -> str:
    dp = group // tp
    if group == 1:
        body = "single"
    elif tp == 1:
        body = f"{data_axis}{dp}"
    elif dp == 1:
        body = f"tp{tp}"
    elif tp_consecutive:
        body = f"tp{tp}-{data_axis}{dp}"
    else:
        body = f"{data_axis}{dp}-tp{tp}"
    return body + ("+ckpt" if ckpt else "")


def hetu_plan_to_gbmw(job: "gbmw.JobSpec", hetu_config: dict[str, Any]) -> "gbmw.Plan":
    """hetu's output config as a gbmw Plan over the job's layers (embedding + blocks + head).

    Blocks: tp_sizes_enc[i] ways TP, the rest of the stage's devices data-parallel as ZeRO-3
    (`sdp`, dp_types_enc 1) or the default DP type (zero2 -> `z2dp`, ddp -> `dp`); TP innermost
    when tp_consecutive_flags[i] is 1, else the DP axis innermost. A block with use_sp = 1 runs
    Ulysses sequence parallelism over its TP group (parameters not split, ZeRO over the whole
    stage); gbmw has no sequence axis, so it becomes data parallelism over the whole stage
    (same compute and model-state split, all-to-alls replaced by gradient traffic).
    Embedding (first stage) and head (last stage): vocabulary TP of degree `vtp` with the rest
    data-parallel (`sdp` when embed_sdp, else the default DP type); with vsp = 1 (sequence
    parallel vocabulary layers) as a use_sp block. Never checkpointed.
    """
    import gbmw

    model = job.model
    _, blocks, _ = _split_layers(model)
    num_devices = job.cluster.num_devices
    pp = int(hetu_config["pp_deg"])
    group = num_devices // pp
    count = len(blocks)
    tp_sizes = _int_list(hetu_config["tp_sizes_enc"])
    consecutive = _int_list(hetu_config.get("tp_consecutive_flags")) or [1] * count
    dp_types = _int_list(hetu_config.get("dp_types_enc")) or [0] * count
    use_sp = _int_list(hetu_config.get("use_sp")) or [0] * count
    checkpoint = _int_list(hetu_config.get("checkpoint")) or [0] * count
    for name, values in (("tp_sizes_enc", tp_sizes), ("tp_consecutive_flags", consecutive),
                         ("dp_types_enc", dp_types), ("use_sp", use_sp), ("checkpoint", checkpoint)):
        if len(values) != count:
            raise ValueError(f"hetu config {name} has {len(values)} entries; the model has {count} blocks")
    default_axis = {"zero2": "z2dp", "ddp": "dp"}.get(str(hetu_config.get("default_dp_type", "zero2")), "z2dp")

    global_batch = int(hetu_config["global_bsz"])
    chunks = int(hetu_config["chunks"])
    if chunks < 1 or global_batch % chunks:
        raise ValueError(f"hetu's global_bsz {global_batch} is not a multiple of its chunks {chunks}; gbmw's "
                         "micro-batches are equal")
    micro_batch = global_batch // chunks
    # Sequence-parallel layers become data parallel over the stage where each device still gets whole
    # samples; otherwise (micro-batch smaller than the stage) the TP layout over the same devices.
    sp_as_tp = 0

    def sequence_parallel_tp(tp: int) -> int:
        nonlocal sp_as_tp
        if micro_batch % group == 0:
            return 1
        sp_as_tp += 1
        return tp

    names = []
    for i in range(count):
        axis = "sdp" if dp_types[i] == 1 else default_axis
        tp = sequence_parallel_tp(tp_sizes[i]) if use_sp[i] else tp_sizes[i]
        names.append(_strategy_name(group, tp, axis, bool(consecutive[i]), bool(checkpoint[i])))
    vtp = max(1, int(hetu_config.get("vtp", 1) or 1))
    vsp = int(hetu_config.get("vsp", 0) or 0)
    vocab_axis = "sdp" if int(hetu_config.get("embed_sdp", 0) or 0) else default_axis
    vocab_tp = sequence_parallel_tp(min(vtp, group)) if vsp else min(vtp, group)
    vocab = _strategy_name(group, vocab_tp, vocab_axis, True, False)
    names = [vocab] + names + [vocab]

    division = _int_list(hetu_config["pp_division"])
    if len(division) != pp or sum(division) != count:
        raise ValueError(f"hetu pp_division {division} does not split {count} blocks into pp_deg={pp} stages")
    partition = list(division)
    partition[0] += 1
    partition[-1] += 1
    plan = gbmw.plan_from_strategy_names(
        model, num_devices, names, partition, global_batch, chunks, cluster=job.cluster.name,
    )
    return dataclasses.replace(plan, provenance={
        "made_by": "hetu-galvatron 2.4.0 search (benchmarks/hetu_galvatron.py)",
        "hetu_pp_division": division, "hetu_vtp": vtp,
        "hetu_vsp": int(hetu_config.get("vsp", 0) or 0), "hetu_embed_sdp": int(hetu_config.get("embed_sdp", 0) or 0),
        "hetu_use_sp_layers": sum(use_sp), "hetu_sp_layers_kept_as_tp": sp_as_tp,
    })


def plan_summary(plan: "gbmw.Plan") -> str:
    """pp, partition and the per-layer strategies collapsed into runs."""
    runs = ", ".join(f"{strategy.name} x{count}" for _, count, strategy in plan.runs())
    return (f"pp={plan.pp} partition={list(plan.partition)} micro_batch={plan.micro_batch} "
            f"x{plan.num_micro_batches} | {runs}")


# ==============================================================================================
# The runner (hetu's venv)
# ==============================================================================================

#: Top-level modules that `galvatron.core` imports for its GPU runtime and the search never uses.
_GPU_ONLY_MODULES = frozenset({
    "apex", "amp_C", "flash_attn", "fused_dense_lib", "dropout_layer_norm", "rotary_emb",
    "xentropy_cuda_lib", "transformer_engine", "fused_layer_norm_cuda",
    "scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda",
})


def _install_placeholders() -> None:
    """Make imports of the GPU-only modules succeed with inert placeholder modules whose every
    attribute is a do-nothing class (usable as a base class, a decorator or a function)."""
    import importlib.abc
    import importlib.machinery
    import types

    class Placeholder(types.ModuleType):
        __path__: list[str] = []

        def __getattr__(self, attribute: str):
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            inert = type(attribute, (), {"__init__": lambda self, *a, **k: None,
                                         "__call__": lambda self, *a, **k: None})
            setattr(self, attribute, inert)
            return inert

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path=None, target=None):
            if fullname.partition(".")[0] in _GPU_ONLY_MODULES:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            return Placeholder(spec.name)

        def exec_module(self, module):
            return None

    sys.meta_path.insert(0, Finder())


def _runner(hetu_args: list[str]) -> int:
    _install_placeholders()
    started = time.perf_counter()
    from galvatron.core import GalvatronSearchEngine, initialize_galvatron
    from galvatron.models.llama_hf.arguments import model_args
    from galvatron.models.llama_hf.meta_configs import (config_from_meta, model_layer_configs, model_name,
                                                        set_model_config)
    import_s = time.perf_counter() - started
    sys.argv = [sys.argv[0], *hetu_args]
    args = initialize_galvatron(model_args, mode="search")
    config = set_model_config(config_from_meta(args.model_size), args, overwrite_args=True)
    engine = GalvatronSearchEngine(args)
    engine.set_search_engine_info(os.getcwd(), model_layer_configs(config), model_name(config))
    engine.set_model_type("gpt")
    started = time.perf_counter()
    engine.initialize_search_engine()
    init_s = time.perf_counter() - started
    started = time.perf_counter()
    throughput = engine.parallelism_optimization()
    search_s = time.perf_counter() - started
    timing = {"import_s": import_s, "init_s": init_s, "search_s": search_s,
              "strategies": len(engine.strategies), "throughput": float(throughput)}
    print(TIMING_TAG + json.dumps(timing), flush=True)
    return 0


# ==============================================================================================
# Command line
# ==============================================================================================


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run hetu-galvatron's search on a gbmw job and cost its plan with gbmw.")
    parser.add_argument("job", nargs="?", default="llama-7b_a100-80g-x8", help="a job recipe name or YAML path")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default: the job's)")
    parser.add_argument("--venv-python", default=None, help=f"hetu venv python (default ${VENV_ENV_VAR}/bin/python "
                                                            "or <repo>/.venv-hetu/bin/python)")
    parser.add_argument("--workdir", default=None, help="folder for inputs, logs and output (default <repo>/out/hetu/…)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--no-sequence-parallel", action="store_true",
                        help="run hetu without --sequence_parallel (its activation model then matches gbmw's)")
    parser.add_argument("--gbmw", action="store_true", help="also run gbmw's planner and print its plan")
    options = parser.parse_args(argv)

    import gbmw
    import gbmw.search.planner

    job = gbmw.load_job(options.job)
    batch = options.batch if options.batch is not None else job.global_batch
    result = run_hetu_search(job, batch, options.venv_python, options.workdir, options.timeout,
                             sequence_parallel=not options.no_sequence_parallel)
    print("command:", " ".join(result.command))
    search = f"{result.search_s:.1f}" if result.search_s is not None else "?"
    print(f"hetu search: wall {result.wall_s:.1f} s (search only {search} s), strategies {result.strategies}, "
          f"rc {result.returncode}{' TIMED OUT' if result.timed_out else ''}; log {result.log_path}")
    for note in result.inputs["notes"]:
        print("input note:", note)
    if not result.ok:
        print("hetu found no plan (or failed); see the log")
        return 1
    plan = hetu_plan_to_gbmw(job, result.config)
    estimate = gbmw.estimate(job, plan)
    print(f"hetu plan: {plan_summary(plan)}")
    print(f"hetu's own prediction: {result.hetu_throughput:.3f} samples/s")
    gib = [f"{b / 2**30:.2f}" for b in estimate.stage_peak_memory_bytes]
    print(f"gbmw estimate of hetu's plan: {estimate.samples_per_s:.3f} samples/s, fits={estimate.fits} "
          f"(budget {estimate.memory_budget_bytes / 2**30:.2f} GiB), stage peak GiB {gib}")
    if options.gbmw:
        started = time.perf_counter()
        ours = gbmw.search.planner.Planner(job, batch=batch).run()
        elapsed = time.perf_counter() - started
        ours_estimate = gbmw.estimate(job, ours)
        gib = [f"{b / 2**30:.2f}" for b in ours_estimate.stage_peak_memory_bytes]
        print(f"gbmw plan ({elapsed:.1f} s): {plan_summary(ours)}")
        print(f"gbmw estimate of its plan: {ours_estimate.samples_per_s:.3f} samples/s, fits={ours_estimate.fits}, "
              f"stage peak GiB {gib}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RUNNER_FLAG:
        sys.exit(_runner(sys.argv[2:]))
    sys.exit(main())
