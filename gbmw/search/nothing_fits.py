"""When nothing fits: one message that names the constraint, or the smallest memory budget that would fit,
found by bisecting the budget with the same search."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from gbmw.errors import GbmwError
from gbmw.specs.schema import format_bytes

GIB = 2**30
MIB = 2**20


class NothingFitsError(GbmwError):
    """No plan of the searched space fits the memory budget (the message says what would)."""


def nothing_fits_message(where: str, batch: str, label: str, budget_bytes: float, exclusions: dict[str, None],
                         settings_found: bool, peak_with: Callable[[float], float | None], exact: bool) -> str:
    """Why no plan of the space `label` fits: the constraints that excluded every setting (`exclusions`), or,
    when settings were searched and none fit, the smallest budget with which `peak_with(budget)` finds a plan (it
    returns that plan's peak bytes, or None); `exact`: the search proves "nothing fits" (see `smallest_budget_hint`)."""
    if not settings_found:
        memory = [key.split(":")[1:] for key in exclusions if key.startswith("memory:")]
        reasons = [key for key in exclusions if not key.startswith("memory:")]
        if memory:
            degrees = ", ".join(pp for pp, _ in memory)
            smallest = min(int(micro) for _, micro in memory)
            reasons.append(
                f"even a micro-batch of {smallest} needs more than {format_bytes(budget_bytes)} per device "
                f"at every pipeline degree tried ({degrees})"
            )
        reasons = "; ".join(reasons) or "no micro-batch size divides the batch evenly for any strategy"
        if not memory:
            return f"nothing fits: {where} ({label}): {reasons}"
        hint = smallest_budget_hint(budget_bytes, peak_with, exact)
        return f"nothing fits: {where} with {batch} ({label}): {reasons}; {hint}"
    return (
        f"nothing fits: no plan for {where} with {batch} fits {format_bytes(budget_bytes)} per device "
        f"({label}); {smallest_budget_hint(budget_bytes, peak_with, exact)}"
    )


EXACT_CHECKS = 4
"""Searches one byte under the best upper end tried before the hint settles for "about"."""


def smallest_budget_hint(budget_bytes: float, peak_with: Callable[[float], float | None], exact: bool) -> str:
    """The smallest budget with which the search finds a plan, bisected from `budget_bytes` (where it found none).

    Each plan found lowers the upper end to its own peak (a budget of that peak fits it), so the bracket closes on
    the least peak of any plan (an approximate search's upper end stays the budget it found a plan with: it may not
    find that plan again under less). With an exact search — one whose "nothing fits" is a proof — the bracket is then
    closed exactly: when a budget one byte under the upper end (rounded up to whole bytes) finds nothing, that
    upper end is the smallest budget that fits, to the byte. An approximate search's answers are not monotone in
    the budget, so its hint stays "about" (1 %)."""
    def upper_end(budget: float, peak: float) -> float:  # where the search surely finds a plan again
        return math.ceil(peak) if exact else budget

    low, probe = budget_bytes, max(budget_bytes * 2, GIB)
    for _ in range(12):
        peak = peak_with(probe)
        if peak is not None:
            high = upper_end(probe, peak)
            break
        low, probe = probe, probe * 2
    else:
        return "even 4096× the budget does not fit; check the batch settings and the model"
    while high - low > 0.01 * high:
        middle = (low + high) / 2
        peak = peak_with(middle)
        if peak is None:
            low = middle
        else:
            high = upper_end(middle, peak)
    for _ in range(EXACT_CHECKS if exact else 0):
        peak = peak_with(high - 1)
        if peak is None:
            return (f"the smallest per-device memory that fits is {high:,} bytes, {format_bytes(high)} "
                    f"(--memory {_flag(high)})")
        high = math.ceil(peak)
    return f"the smallest per-device memory that fits is about {format_bytes(high)} (--memory {_flag(high)})"


def _flag(size_bytes: float) -> str:
    """A --memory value in `format_bytes`' unit, rounded up to a hundredth of it, so the budget it names is never
    below `size_bytes`."""
    scale, unit = (GIB, "GiB") if size_bytes >= GIB else (MIB, "MiB")
    return f"{np.ceil(size_bytes / scale * 100) / 100:.2f}{unit}"
