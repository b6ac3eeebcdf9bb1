"""Which number stands for a repeated timing: the mean of its fastest quarter, on every side of a comparison.

Contention only ever adds time. On the shared 2-core machine this project is developed on, the same fixed
matmul loop runs in two states that alternate every few seconds, about 7.4 ms and 9–12 ms per loop
(benchmarks/machine_noise.py prints the distribution); a median then says which state dominated the
seconds it ran in, and a profile taken in one state mispredicts a run taken in the other by up to 60 %.
The fast end of the distribution is the time of the work itself (the rule of Python's timeit: "the lowest
value gives a lower bound for how fast your machine can run the given code snippet; higher values … are
typically not caused by variability in Python's speed, but by other processes interfering").

Not the minimum, though: gbmw adds up parts (layers of a pass), and a part that waits on another rank
(a TP all-reduce, an FSDP2 gather) has a luckiest repetition far below its usual fast time — on the tiny
GPT with TP 2, the per-layer minima summed to 20 ms while no whole pass took less than 34 ms. So whole
repetitions are ranked, the fastest quarter is kept (`fast_quarter`), and a part's time is its mean over
those repetitions; a sum of parts is then the mean of the same fast repetitions. The profilers (`gbmw
profile model`, `gbmw profile cluster`) and `gbmw validate` all use it, so predicted and measured describe
the same uncontended machine; validate prints the median beside it, so contention stays visible.
"""

from __future__ import annotations

from collections.abc import Sequence

FAST_FRACTION = 0.25


def fast_quarter(totals_s: Sequence[float]) -> list[int]:
    """Indices of the fastest quarter of repetitions by their total time (at least one)."""
    if not totals_s:
        raise ValueError("no timings")
    keep = max(1, round(len(totals_s) * FAST_FRACTION))
    return sorted(range(len(totals_s)), key=lambda index: totals_s[index])[:keep]


def fast_mean_s(seconds: Sequence[float], chosen: Sequence[int] | None = None) -> float:
    """The mean of the fastest quarter of repeated timings of the same work (seconds), or of the repetitions
    `chosen` elsewhere (the fast rounds of an interleaved measurement, so every part comes from the same
    rounds)."""
    values = list(seconds)
    chosen = fast_quarter(values) if chosen is None else chosen
    return sum(values[index] for index in chosen) / len(chosen)
