"""How steady this machine's speed is: the same fixed work timed again and again, on 1 and on 2 processes.

    .venv/bin/python benchmarks/machine_noise.py [--seconds 20]

Each process multiplies two 256×256 fp32 matrices 20 times per sample, one thread, for `--seconds`; printed
are the distribution of the sample times and the median of every second. On a machine to itself the
samples sit within a few percent of each other; a shared virtual machine shows phases of a few seconds in
which the same work takes 1.2–1.6× as long. That is why gbmw's profilers and `gbmw validate` interleave
their measurements over many seconds and keep the fast end of each distribution (adapters/profile/timing.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time


def sample(label: str, seconds: float, queue) -> None:
    import torch

    torch.set_num_threads(1)
    left, right = torch.randn(256, 256), torch.randn(256, 256)
    rows = []
    end = time.time() + seconds
    while time.time() < end:
        started = time.perf_counter()
        for _ in range(20):
            left @ right
        rows.append((time.time(), (time.perf_counter() - started) * 1e3))
    queue.put((label, rows))


def describe(label: str, rows) -> None:
    values = [value for _, value in rows]
    cuts = statistics.quantiles(values, n=20)
    print(f"{label}: {len(values)} samples, ms: min {min(values):.2f}, p5 {cuts[0]:.2f}, p25 {cuts[4]:.2f}, "
          f"median {cuts[9]:.2f}, p75 {cuts[14]:.2f}, p95 {cuts[18]:.2f}, max {max(values):.2f}; "
          f"median / min {cuts[9] / min(values):.2f}")
    seconds: dict[int, list[float]] = {}
    for moment, value in rows:
        seconds.setdefault(int(moment), []).append(value)
    print(f"  per-second medians: {' '.join(f'{statistics.median(v):.1f}' for _, v in sorted(seconds.items()))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    for processes in (1, 2):
        queue = context.Queue()
        workers = [context.Process(target=sample, args=(f"{processes} process(es), #{index}", args.seconds, queue))
                   for index in range(processes)]
        for worker in workers:
            worker.start()
        results = sorted(queue.get() for _ in workers)
        for worker in workers:
            worker.join()
        for label, rows in results:
            describe(label, rows)


if __name__ == "__main__":
    main()
