"""When nothing fits: one message that names the constraint, or the smallest memory budget that would fit,
found by bisecting the budget with the same search."""

from __future__ import annotations

from typing import Callable

import numpy as np

from gbmw.errors import GbmwError

GIB = 2**30


class NothingFitsError(GbmwError):
    """No plan of the searched space fits the memory budget (the message says what would)."""


def nothing_fits_message(where: str, batch: str, label: str, budget_bytes: float, exclusions: dict[str, None],
                         settings_found: bool, fits_with: Callable[[float], bool]) -> str:
    """Why no plan of the space `label` fits: the constraints that excluded every setting (`exclusions`), or,
    when settings were searched and none fit, the smallest budget for which `fits_with(budget)` finds a plan."""
    if not settings_found:
        memory = [key.split(":")[1:] for key in exclusions if key.startswith("memory:")]
        reasons = [key for key in exclusions if not key.startswith("memory:")]
        if memory:
            degrees = ", ".join(pp for pp, _ in memory)
            smallest = min(int(micro) for _, micro in memory)
            reasons.append(
                f"even a micro-batch of {smallest} needs more than {budget_bytes / GIB:.2f} GiB per device "
                f"at every pipeline degree tried ({degrees})"
            )
        reasons = "; ".join(reasons) or "no micro-batch size divides the batch evenly for any strategy"
        if not memory:
            return f"nothing fits: {where} ({label}): {reasons}"
        return f"nothing fits: {where} with {batch} ({label}): {reasons}; {smallest_budget_hint(budget_bytes, fits_with)}"
    return (
        f"nothing fits: no plan for {where} with {batch} fits {budget_bytes / GIB:.2f} GiB per device "
        f"({label}); {smallest_budget_hint(budget_bytes, fits_with)}"
    )


def smallest_budget_hint(budget_bytes: float, fits_with: Callable[[float], bool]) -> str:
    """Bisect the budget (to 1%) for the smallest one where `fits_with` finds a plan."""
    low, high = budget_bytes, max(budget_bytes * 2, GIB)
    for _ in range(12):
        if fits_with(high):
            break
        low, high = high, high * 2
    else:
        return "even 4096× the budget does not fit; check the batch settings and the model"
    while high - low > 0.01 * high:
        middle = (low + high) / 2
        if fits_with(middle):
            high = middle
        else:
            low = middle
    return (f"the smallest per-device memory that fits is about {high / GIB:.2f} GiB "
            f"(--memory {np.ceil(high / GIB * 100) / 100:.2f}GiB)")
