"""Selective recomputation (+sel) in gbmw's runtime: the attention core — from Q, K and V to the context, attention
dropout included — is run again in backward instead of keeping what it saves (Korthikanti et al., "Reducing
Activation Recomputation in Large Transformer Models", 2022, Sec. 5).

How: torch's non-reentrant checkpoint (`torch.utils.checkpoint.checkpoint(use_reentrant=False)`) around the core
alone. Non-reentrant, because it composes with what surrounds the core in the runtime — FSDP2's hooks on the layer,
TP's collectives before and after (none inside the core), +sp's gathered sequence, autocast (its state is recorded
and restored for the recomputation), the pipeline's backward of one micro-batch at a time — and keeps the core's
inputs by reference (Q, K and V, which the core would keep anyway), not as detached copies. The projections, norms
and MLP stay outside: recomputing them is full recomputation (+ckpt), which a strategy never combines with +sel
(gbmw.space.strategy).

Dropout: the checkpoint records the generator states (the CPU's, and the device's of a CUDA core) before the core
and restores them for the recomputation, so it draws exactly the masks the forward drew — on a GPU SDPA's flash /
memory-efficient kernels take their Philox offset from the CUDA generator, on a CPU `RecomputingAttention` takes
the CPU generator's state. Without dropout nothing random runs, and no state is recorded.

Memory, truthfully: the runtime's attention is already flash-like (gbmw.adapters.runtime.attention): it keeps no
s × s scores, only Q, K, V, its output — the very tensor the output projection keeps as its input — and the fp32
log-sum-exp of each row. Recomputing the core therefore frees only that log-sum-exp (a·s fp32 per sample and layer,
split by TP; with dropout a generator state is kept either way: the kernel's, or the checkpoint's), which is what
the estimator prices for the runtime (gbmw.cost.activation_recompute.selective_freed_bytes on the flash-costed model,
gbmw.specs.models.model_as_run), and it repeats the core's forward in backward (`selective_recompute_s`). While the
layer runs backward the recomputed output and log-sum-exp exist again, briefly: the backward of the MLP before it
(whose gradient of the up-projection output the estimator's workspace prices) needs more, so the layer's backward
peak does not grow (gbmw.cost.activation_recompute.selective_rebuilt_bytes). One exception, on a CPU only: the CPU's
recomputing attention materialises s × s chunks of scores in its backward, which at tiny sizes in bf16 with dropout
can make the core's backward the block's peak (tests/test_fake_memory.py names it); a GPU's flash kernel works in
tiles.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint

from .attention import attention


def recomputed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool,
                         dropout_p: float) -> torch.Tensor:
    """`attention(query, key, value, causal, dropout_p)` whose backward runs it again (see the module docstring)."""
    return torch.utils.checkpoint.checkpoint(attention, query, key, value, causal, dropout_p, use_reentrant=False,
                                             preserve_rng_state=dropout_p > 0.0)
