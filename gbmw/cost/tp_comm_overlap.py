"""Transformer Engine's TP communication overlap (megatron-core `--tp-comm-overlap`; NeMo `ub_tp_comm_overlap`).

With sequence parallelism a TP layer all-gathers its input before its column-parallel GEMMs and reduce-scatters the
output of its row-parallel ones, forward and backward (Korthikanti et al. 2022, Sec. 4.2.2). Transformer Engine's
userbuffers split those GEMMs into chunks and move one chunk's slice of the sequence while the previous one
multiplies (ring exchange for the forward and data-gradient GEMMs, a bulk overlap under the weight-gradient GEMMs:
megatron/core/extensions/transformer_engine.py, Megatron-Bridge's `TransformerLayerTPOverlapCfg`), so the collectives
run beside the layer's compute instead of between its kernels. gbmw prices it by the rule it prices every overlap of
communication with compute (gbmw.cost.layer_cost: DP/SDP in backward; paper Sec. 5): the two take
max(c, g) + (f − 1)·min(c, g), f the cluster's `overlap_slowdown` — so a layer's TP collectives cost it
(f − 1)·g while they are shorter than its compute, instead of g. Only +sp layers with TP > 1 overlap: Megatron turns
the option on with sequence parallelism only (megatron/training/arguments.py asserts it)."""

from __future__ import annotations

import numpy as np


def overlapped_s(compute_s: np.ndarray, communication_s: np.ndarray, slowdown: float) -> np.ndarray:
    """Compute and communication run side by side, both slowed by `slowdown` while they share the device:
    max(c, g) + (f − 1)·min(c, g) (paper Sec. 5; gbmw.cost.layer_cost's DP/SDP backward overlap too)."""
    return np.maximum(compute_s, communication_s) + (slowdown - 1.0) * np.minimum(compute_s, communication_s)


def exposed_tp_communication_s(compute_s: np.ndarray, communication_s: np.ndarray, slowdown: float) -> np.ndarray:
    """What the TP collectives add to a pass that computes for `compute_s` when they run beside it (the module's
    rule, less the compute the pass does anyway)."""
    return overlapped_s(compute_s, communication_s, slowdown) - compute_s
