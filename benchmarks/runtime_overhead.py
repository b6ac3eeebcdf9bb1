"""What gbmw's hybrid runtime costs per training step against stock implementations of the same plan.

    .venv/bin/python benchmarks/runtime_overhead.py                      # zero3, fsdp2, dp, tp (~2 min)
    .venv/bin/python benchmarks/runtime_overhead.py --cases zero3,zero2 --steps 40 --warmup 3

Each case trains one small GPT (MODEL below, fp32, global batch GLOBAL_BATCH, one micro-batch) on
WORLD_SIZE CPU processes over torch.distributed gloo, once with gbmw's HybridEngine running a uniform plan
and once with a stock implementation of that plan, in the same processes, from the same initial weights
(gbmw.adapters.runtime.model.initial_value by parameter name), on the same batches, with Adam of the same
arithmetic (gbmw steps FSDP2 shards on their local tensors, adapters/runtime/local_adam.py):

- zero3: every layer `sdp2` (gbmw: FSDP2 on each layer) vs DeepSpeed ZeRO stage 3;
- fsdp2: every layer `sdp2` vs torch FSDP2 applied the usual way (every layer, then the whole model as
  root) with torch Adam's defaults: the same sharding library, so the difference is how gbmw drives it;
- zero2: every layer `z2dp2` vs DeepSpeed ZeRO stage 2;
- dp: every layer `dp2` (gbmw: one all-reduce per layer) vs DeepSpeed ZeRO stage 0 (bucketed all-reduce);
- tp: every layer `tp2` vs the same blocks with megatron-core's ColumnParallelLinear / RowParallelLinear /
  VocabParallelEmbedding / vocab_parallel_cross_entropy on megatron's global parallel_state
  (initialize_model_parallel(tensor_model_parallel_size=2)), trained in a direct loop: forward, backward,
  torch Adam step — no gbmw engine (pipeline schedule, loss shares, Slice-Gather) involved.

The stock sides train gbmw's runtime layers (gbmw.adapters.runtime.model.build_layer: plain torch modules
with TensorParallel.single(), megatron-core's with megatron's global group for tp), stacked into one
module: the model code is shared, so the difference measured is the engine's. DeepSpeed runs with
"torch_adam", weight decay 0 and "gradient_clipping": 0 (DeepSpeed 0.19 clips to norm 1.0 by default).

How it is timed: the two sides alternate step by step (gbmw first on even steps, stock first on odd ones),
so a change of load on the machine hits both; every process runs one torch thread; a barrier precedes
each timed step; a step is timed with time.perf_counter from the call until its loss is back (the global
mean loss on both sides), and its time is the slowest rank's. The table shows the median over the timed
steps (warm-up steps excluded) and the ratio gbmw / stock, against the target ratio ≤ TARGET_RATIO; the
paired ratio (each gbmw step over the stock step next to it) and its quartiles show how noisy the machine
was; the process CPU time per step (all threads) is less sensitive to other load on the machine. Losses of
both sides are printed per step for the first case and as the largest difference for every case: they
train the same thing.

The first run builds DeepSpeed's shared-memory communication op with g++ (deepspeed.init_distributed,
30–45 s, cached afterwards in TORCH_EXTENSIONS_DIR); it is timed separately and not part of any step.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

console = Console(highlight=False, width=170)

MODEL = {
    "name": "gpt-overhead-bench",
    "family": "gpt",
    "source": "benchmarks/runtime_overhead.py (not from any paper: a GPT-2-style decoder whose CPU step takes ~0.1 s)",
    "num_layers": 4,
    "hidden_size": 256,
    "num_heads": 8,
    "seq_length": 128,
    "vocab_size": 1024,
    "dropout": False,
    "tie_embeddings": False,
}
WORLD_SIZE = 2
GLOBAL_BATCH = 8
SEED = 0
LEARNING_RATE = 1e-4
BETAS = (0.9, 0.999)
EPS = 1e-8
TARGET_RATIO = 1.05


@dataclass(frozen=True)
class Case:
    key: str
    strategy: str
    """The strategy of every layer of gbmw's plan."""
    stock: str
    """What the stock side is, for the table."""


CASES = {
    "zero3": Case("zero3", "sdp2", "DeepSpeed ZeRO-3"),
    "fsdp2": Case("fsdp2", "sdp2", "torch FSDP2"),
    "zero2": Case("zero2", "z2dp2", "DeepSpeed ZeRO-2"),
    "dp": Case("dp", "dp2", "DeepSpeed ZeRO-0"),
    "tp": Case("tp", "tp2", "megatron-core TP"),
}
DEEPSPEED_STAGE = {"zero3": 3, "zero2": 2, "dp": 0}


# ---------------------------------------------------------------------------------------------- worker side


def _architecture():
    from gbmw.specs.architectures import parse_architecture

    return parse_architecture(MODEL, MODEL["name"])


class GbmwSide:
    """gbmw's HybridEngine running every layer with one strategy, one micro-batch."""

    def __init__(self, strategy: str):
        from gbmw.adapters.runtime.engine import AdamSettings, HybridEngine
        from gbmw.adapters.runtime.groups import GroupPool
        from gbmw.plan import plan_from_strategy_names
        from gbmw.specs.models import build_model

        architecture = _architecture()
        spec = build_model(architecture, "fp32")
        plan = plan_from_strategy_names(spec, WORLD_SIZE, [strategy] * len(spec.layers), [len(spec.layers)],
                                        GLOBAL_BATCH, 1)
        self.engine = HybridEngine(plan, architecture, GroupPool(plan), "cpu", seed=SEED,
                                   adam=AdamSettings(learning_rate=LEARNING_RATE, betas=BETAS, eps=EPS))

    def step(self, batch) -> float:
        return self.engine.train_step(batch)

    def close(self) -> None:
        self.engine = None


def _stacked_model(tp, split_dim):
    """gbmw's runtime layers (embedding, blocks, head) built with `tp`, stacked into one module whose forward
    returns the loss; every weight set from initial_value by its full parameter name, this rank's block of
    it along `split_dim(parameter)` (None: the whole tensor)."""
    import torch
    from torch import nn

    from gbmw.adapters.runtime.model import build_layer, initial_value, layer_names

    architecture = _architecture()

    class StackedLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer_names = layer_names(architecture)
            self.layers = nn.ModuleList(build_layer(architecture, name, tp) for name in self.layer_names)

        def forward(self, inputs, tokens):
            x = inputs
            for layer in self.layers[:-1]:
                x = layer(x)
            return self.layers[-1](x, {"tokens": tokens})

    model = StackedLayers()
    with torch.no_grad():
        for name, layer in zip(model.layer_names, model.layers):
            for key, parameter in layer.named_parameters():
                dim = split_dim(parameter)
                shape = list(parameter.shape)
                if dim is not None:
                    shape[dim] *= tp.size
                full = initial_value(f"{name}.{key}", torch.Size(shape), SEED)
                parameter.copy_(full if dim is None else full.chunk(tp.size, dim)[tp.rank])
    return model


class DeepSpeedSide:
    """DeepSpeed's engine at one ZeRO stage on the single-process model; each rank takes its half of the batch."""

    def __init__(self, stage: int):
        import deepspeed
        import torch.distributed as dist

        model = _stacked_model(_single_tp(), lambda parameter: None)
        config = {
            "train_batch_size": GLOBAL_BATCH,
            "train_micro_batch_size_per_gpu": GLOBAL_BATCH // WORLD_SIZE,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {
                "lr": LEARNING_RATE, "betas": list(BETAS), "eps": EPS,
                "weight_decay": 0.0,  # DeepSpeed's "Adam" is AdamW with weight decay 0.01 by default
                "torch_adam": True,  # torch's Adam, as gbmw (its own CPU Adam would be JIT-built)
            }},
            "zero_optimization": {"stage": stage},
            "gradient_clipping": 0.0,  # DeepSpeed 0.19 clips to norm 1.0 by default; gbmw does not clip
            "steps_per_print": 10**9,
        }
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        self.rank, self.dist = dist.get_rank(), dist

    def step(self, batch) -> float:
        rows = GLOBAL_BATCH // WORLD_SIZE
        part = slice(self.rank * rows, (self.rank + 1) * rows)
        loss = self.engine(batch["inputs"][part], batch["tokens"][part])
        self.engine.backward(loss)
        self.engine.step()
        mean = loss.detach().clone()
        self.dist.all_reduce(mean)  # the global mean, as gbmw's train_step returns it
        return float(mean) / WORLD_SIZE

    def close(self) -> None:
        self.engine.destroy()
        self.engine = None


class FSDP2Side:
    """torch FSDP2 as its documentation applies it: fully_shard on every layer, then on the whole model (the
    root: it prefetches and orders the layers' all-gathers), torch Adam with its defaults; each rank takes its
    half of the batch and FSDP2 averages the gradients."""

    def __init__(self):
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.model = _stacked_model(_single_tp(), lambda parameter: None)
        mesh = init_device_mesh("cpu", (WORLD_SIZE,))
        for layer in self.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE, betas=BETAS, eps=EPS)
        self.rank, self.dist = dist.get_rank(), dist

    def step(self, batch) -> float:
        rows = GLOBAL_BATCH // WORLD_SIZE
        part = slice(self.rank * rows, (self.rank + 1) * rows)
        loss = self.model(batch["inputs"][part], batch["tokens"][part])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        self.dist.all_reduce(mean)
        return float(mean) / WORLD_SIZE

    def close(self) -> None:
        self.model = self.optimizer = None


def _single_tp():
    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    return TensorParallel.single()


def _megatron_tp():
    """A TensorParallel whose layers are megatron-core's, on megatron's global TP group (no explicit group)."""
    import torch
    from megatron.core import ModelParallelConfig, parallel_state
    from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                               vocab_parallel_cross_entropy)

    from gbmw.adapters.runtime.tensor_parallel import TensorParallel

    size = parallel_state.get_tensor_model_parallel_world_size()

    def config(dtype):
        return ModelParallelConfig(tensor_model_parallel_size=size, use_cpu_initialization=True,
                                   perform_initialization=True, params_dtype=dtype, gradient_accumulation_fusion=False)

    def keep(weight: torch.Tensor) -> None:
        """Weights are set from initial_value after construction."""

    class Column(ColumnParallelLinear):
        def forward(self, x):
            return super().forward(x)[0]

    class Row(RowParallelLinear):
        def forward(self, x):
            return super().forward(x)[0]

    @dataclass(frozen=True)
    class MegatronGlobalTP(TensorParallel):
        def column_linear(self, in_features, out_features, bias, dtype):
            return Column(in_features, out_features, config=config(dtype), init_method=keep, bias=bias,
                          gather_output=False)

        def row_linear(self, in_features, out_features, bias, dtype):
            return Row(in_features, out_features, config=config(dtype), init_method=keep, bias=bias,
                       input_is_parallel=True, skip_bias_add=False)

        def vocab_embedding(self, vocab_size, hidden_size, dtype):
            return VocabParallelEmbedding(vocab_size, hidden_size, init_method=keep, config=config(dtype))

        def cross_entropy(self, logits, target):
            return vocab_parallel_cross_entropy(logits, target)

    return MegatronGlobalTP(parallel_state.get_tensor_model_parallel_group(), size,
                            parallel_state.get_tensor_model_parallel_rank())


class MegatronTPSide:
    """The same layers with megatron-core's TP modules on its global parallel state, trained in a direct loop."""

    def __init__(self, tp_size: int):
        import torch
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
        tp = _megatron_tp()

        def split_dim(parameter):
            """megatron-core marks the parameters it splits over the TP group and the dim it splits."""
            return parameter.partition_dim if getattr(parameter, "tensor_model_parallel", False) else None

        self.model = _stacked_model(tp, split_dim)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LEARNING_RATE, betas=BETAS, eps=EPS)

    def step(self, batch) -> float:
        loss = self.model(batch["inputs"], batch["tokens"])  # every TP rank holds the full batch and the same loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def close(self) -> None:
        from megatron.core import parallel_state

        self.model = self.optimizer = None
        parallel_state.destroy_model_parallel()


def _stock_side(case: Case):
    if case.key in DEEPSPEED_STAGE:
        return DeepSpeedSide(DEEPSPEED_STAGE[case.key])
    if case.key == "fsdp2":
        return FSDP2Side()
    return MegatronTPSide(WORLD_SIZE)


def _run_case(case: Case, steps: int, warmup: int) -> dict:
    import torch
    import torch.distributed as dist

    from gbmw.adapters.runtime.model import synthetic_batch

    architecture = _architecture()
    started = time.perf_counter()
    gbmw_side = GbmwSide(case.strategy)
    gbmw_setup_s = time.perf_counter() - started
    started = time.perf_counter()
    stock_side = _stock_side(case)
    stock_setup_s = time.perf_counter() - started
    sides = {"gbmw": gbmw_side, "stock": stock_side}
    wall_s = {name: [] for name in sides}
    cpu_s = {name: [] for name in sides}
    losses = {name: [] for name in sides}
    for step in range(warmup + steps):
        batch = synthetic_batch(architecture, GLOBAL_BATCH, step, SEED)
        order = ("gbmw", "stock") if step % 2 == 0 else ("stock", "gbmw")
        for name in order:
            dist.barrier()
            started, started_cpu = time.perf_counter(), time.process_time()
            losses[name].append(sides[name].step(batch))
            wall_s[name].append(time.perf_counter() - started)
            cpu_s[name].append(time.process_time() - started_cpu)
    for side in sides.values():
        side.close()
    slowest = torch.tensor([wall_s["gbmw"], wall_s["stock"], cpu_s["gbmw"], cpu_s["stock"]], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {
        "case": case.key,
        "warmup": warmup,
        "gbmw_s": slowest[0].tolist(),
        "stock_s": slowest[1].tolist(),
        "gbmw_cpu_s": slowest[2].tolist(),
        "stock_cpu_s": slowest[3].tolist(),
        "gbmw_loss": losses["gbmw"],
        "stock_loss": losses["stock"],
        "gbmw_setup_s": gbmw_setup_s,
        "stock_setup_s": stock_setup_s,
    }


def _worker(rank: int, port: int, case_keys: list[str], steps: int, warmup: int, results, errors) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        import logging
        import warnings

        for noise in (r".*is deprecated\. Please use `torch\.distributed", r"When using async grad allreduce",
                      r"Transformer Engine and Apex are not installed"):
            warnings.filterwarnings("ignore", message=noise)
        import torch

        torch.set_num_threads(1)
        import torch.distributed as dist

        from gbmw.adapters.runtime.launch import init_distributed

        init_distributed(timeout_s=300)
        started = time.perf_counter()
        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo")
        deepspeed_init_s = time.perf_counter() - started
        import megatron.core  # noqa: F401 - imported here so its import time is not a case's set-up

        for key in case_keys:
            result = _run_case(CASES[key], steps, warmup)
            if rank == 0:
                results.put(("case", {**result, "deepspeed_init_s": deepspeed_init_s}))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        errors.put((rank, traceback.format_exc()))
        raise


# ---------------------------------------------------------------------------------------------- parent side


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(case_keys: list[str], steps: int, warmup: int, timeout_s: float) -> list[dict]:
    """Spawn WORLD_SIZE processes, run every case in them, return rank 0's results (one dict per case)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results, errors = context.SimpleQueue(), context.SimpleQueue()
    port = _free_port()
    processes = [context.Process(target=_worker, args=(rank, port, case_keys, steps, warmup, results, errors))
                 for rank in range(WORLD_SIZE)]
    for process in processes:
        process.start()
    collected: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(collected) < len(case_keys) and time.monotonic() < deadline:
        if not errors.empty():
            break
        if not results.empty():
            collected.append(results.get()[1])
            console.print(f"   case {collected[-1]['case']} done", style="dim")
            continue
        if not any(process.is_alive() for process in processes):
            break
        time.sleep(0.2)
    for process in processes:
        process.join(max(0.0, min(30.0, deadline - time.monotonic())))
    for process in processes:
        if process.is_alive():
            process.kill()
    if not errors.empty():
        rank, text = errors.get()
        raise SystemExit(f"rank {rank} failed:\n{text}")
    if len(collected) < len(case_keys):
        raise SystemExit(f"only {len(collected)} of {len(case_keys)} cases finished within {timeout_s:.0f} s "
                         f"(exit codes {[process.exitcode for process in processes]})")
    return collected


def _median_and_quartiles(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    low, median, high = statistics.quantiles(values, n=4)
    return f"{median:.3f} ({low:.2f}–{high:.2f})"


def print_report(results: list[dict], steps: int, warmup: int) -> None:
    table = Table(title=f"gbmw runtime vs stock, same plan, {WORLD_SIZE} CPU processes (gloo): median over {steps} "
                        f"steps after {warmup} warm-up, each step the slowest rank's")
    for column in ("case", "gbmw plan", "stock", "gbmw s/step", "stock s/step", "gbmw / stock", f"≤ {TARGET_RATIO}",
                   "paired ratio (IQR)", "CPU s/step gbmw / stock", "max |Δloss|", "set-up s gbmw / stock"):
        table.add_column(column, justify="left" if column in ("case", "gbmw plan", "stock") else "right",
                         no_wrap=column != "set-up s gbmw / stock")
    for result in results:
        case = CASES[result["case"]]
        timed = slice(result["warmup"], None)
        gbmw_s, stock_s = result["gbmw_s"][timed], result["stock_s"][timed]
        ratio = statistics.median(gbmw_s) / statistics.median(stock_s)
        paired = [a / b for a, b in zip(gbmw_s, stock_s)]
        gbmw_cpu_s = statistics.median(result["gbmw_cpu_s"][timed])
        stock_cpu_s = statistics.median(result["stock_cpu_s"][timed])
        delta = max(abs(a - b) for a, b in zip(result["gbmw_loss"], result["stock_loss"]))
        table.add_row(case.key, f"{case.strategy} ×all", case.stock, f"{statistics.median(gbmw_s):.4f}",
                      f"{statistics.median(stock_s):.4f}", f"{ratio:.3f}", "PASS" if ratio <= TARGET_RATIO else "FAIL",
                      _median_and_quartiles(paired),
                      f"{gbmw_cpu_s:.3f} / {stock_cpu_s:.3f} ({gbmw_cpu_s / stock_cpu_s:.2f})",
                      f"{delta:.1e}", f"{result['gbmw_setup_s']:.1f} / {result['stock_setup_s']:.1f}")
    console.print(table)
    console.print("   gbmw / stock: ratio of the median wall times (the target); paired ratio: gbmw's step over the "
                  "stock step run next to it,\n   median and quartiles (its spread is the noise of this machine); "
                  "CPU: process CPU time of a step (all threads), slowest rank, median")

    first = results[0]
    warm_up = f"; steps 0–{first['warmup'] - 1} are warm-up" if first["warmup"] else ""
    losses = Table(title=f"Loss per step, case {first['case']} (both sides, same batches{warm_up})")
    for column in ("step", "gbmw loss", "stock loss", "|Δ|", "gbmw s", "stock s"):
        losses.add_column(column, justify="right")
    for step, (a, b) in enumerate(zip(first["gbmw_loss"], first["stock_loss"])):
        losses.add_row(str(step), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}", f"{first['gbmw_s'][step]:.4f}",
                       f"{first['stock_s'][step]:.4f}")
    console.print(losses)
    console.print(f"import deepspeed + deepspeed.init_distributed (builds or loads its shm op; not in any step): "
                  f"{first['deepspeed_init_s']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="zero3,fsdp2,dp,tp", help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side and case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side and case first")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up after this many seconds in all")
    args = parser.parse_args()
    case_keys = [key.strip() for key in args.cases.split(",") if key.strip()]
    unknown = [key for key in case_keys if key not in CASES]
    if unknown or not case_keys:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be ≥ 1 and --warmup ≥ 0")
    started = time.perf_counter()
    console.print(f"model {MODEL['name']}: {MODEL['num_layers']} blocks, hidden {MODEL['hidden_size']}, "
                  f"seq {MODEL['seq_length']}, vocab {MODEL['vocab_size']}, fp32; global batch {GLOBAL_BATCH}, "
                  f"1 micro-batch; {WORLD_SIZE} processes × 1 thread on {os.cpu_count()} cores")
    results = run(case_keys, args.steps, args.warmup, args.timeout_s)
    print_report(results, args.steps, args.warmup)
    console.print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
