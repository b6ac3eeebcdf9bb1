"""Adam's step on FSDP2-sharded layers: torch.optim.Adam on the DTensors vs gbmw's LocalShardAdam on the
local shards (adapters/runtime/local_adam.py), side by side on the same engine.

    .venv/bin/python benchmarks/optimizer_step.py [--steps 200]

Two gloo processes build gbmw's runtime for the tiny GPT with every layer `sdp2` (ZeRO-3 over both), run one
training step so every parameter has a gradient, then time the two optimizers' steps alternately (each on
its own copy of the moments); printed are the median step of each and the ratio, and the largest
difference between the parameters the two produce from the same start (they run the same arithmetic).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time


def worker(rank: int, port: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from gbmw.adapters.runtime.engine import HybridEngine
    from gbmw.adapters.runtime.groups import GroupPool
    from gbmw.adapters.runtime.local_adam import LocalShardAdam
    from gbmw.adapters.runtime.model import synthetic_batch
    from gbmw.plan import plan_from_strategy_names
    from gbmw.specs.bundled import resolve_recipe
    from gbmw.specs.jobs import load_job
    from gbmw.specs.models import load_architecture

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    job = load_job("gpt-tiny_cpu-x4")
    architecture = load_architecture(resolve_recipe("gpt-tiny", "models"))
    plan = plan_from_strategy_names(job.model, 2, ["sdp2"] * job.model.num_layers, [job.model.num_layers], 16, 2)
    engine = HybridEngine(plan, architecture, GroupPool(plan), "cpu")
    engine.optimizer.step = lambda: None  # keep the gradients of one step; the optimizers below update copies
    engine.optimizer.zero_grad = lambda set_to_none=True: None
    engine.train_step(synthetic_batch(architecture, plan.global_batch, 0, 0))
    parameters = engine._all_parameters()
    start = [parameter.detach().clone() for parameter in parameters]
    optimizers = {"torch.optim.Adam (DTensor)": torch.optim.Adam(parameters, lr=1e-4),
                  "LocalShardAdam (local shards)": LocalShardAdam(parameters, lr=1e-4)}
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    finals = {}
    for name, optimizer in optimizers.items():  # same start, same number of steps: compare the results
        with torch.no_grad():
            for parameter, value in zip(parameters, start):
                parameter.copy_(value)
        for _ in range(3):
            optimizer.step()
        finals[name] = [parameter.detach().clone() for parameter in parameters]
    for _ in range(steps):
        for name, optimizer in optimizers.items():
            dist.barrier()
            started = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - started)
    first, second = finals.values()
    difference = max(float((a.to_local() - b.to_local()).abs().max()) for a, b in zip(first, second))
    if rank == 0:
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, seconds in medians.items():
            print(f"{name:32s} median step {seconds * 1e3:7.3f} ms over {steps} steps")
        old, new = medians.values()
        print(f"ratio LocalShardAdam / torch.optim.Adam: {new / old:.3f}; largest parameter difference after 3 "
              f"steps from the same start: {difference:.2e}")
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(worker, args=(port, args.steps), nprocs=2)


if __name__ == "__main__":
    main()
