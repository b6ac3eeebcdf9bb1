"""Selective recomputation and sequence parallelism: what they change in one layer's stash and time
(Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022).

Per sample, a GPT block with 16-bit activations and 1-byte dropout masks stashes (their Sec. 4, Table 2; s tokens,
h hidden, a heads, TP degree t):

    no parallelism                      s·h·(34 + 5·a·s/h)
    TP                                  s·h·(10 + 24/t + 5·a·s/(h·t))
    TP + sequence parallelism (SP)      s·h·(34/t + 5·a·s/(h·t))
    TP + selective recomputation        s·h·(10 + 24/t)
    TP + SP + selective                 s·h·34/t

gbmw's layers (gbmw.specs.transformer_layers) hold the same terms: the 10·s·h TP replicates are the boundary and the
intermediate activations, the 24·s·h/t + 5·a·s²/t it splits are the TP-split intermediates, and the 5·a·s² of the
attention core (softmax output, dropout mask, dropout output) are `attention_core_activation_bytes_per_sample`.
Besides these, gbmw counts what Korthikanti et al. leave out: each LayerNorm's fp32 mean and 1/std per token
(8 bytes per token and norm; SP splits them too).

Selective recomputation (Sec. 5) recomputes the attention core in backward: its FLOPs (QKᵀ and scores × V, split
by TP) and its memory-bound softmax and dropout traffic. Sequence parallelism (Sec. 4.2.2) splits the replicated
regions along the sequence, so their stash and their memory-bound kernels (norms, dropout, residual adds) shrink
by t; an all-gather before and a reduce-scatter after each TP region replace its all-reduce, and on a ring those
move the same bytes in the same time ((t−1)/t·M each against 2(t−1)/t·M, gbmw.cost.comm), so TP's communication time
is unchanged.
"""

from __future__ import annotations

import numpy as np

from gbmw.space.strategy import Strategy
from gbmw.specs.model_spec import ModelSpec


def sequence_parallel_divisor(strategy: Strategy) -> int:
    """What sequence parallelism divides TP's replicated activations and traffic by: t under +sp, else 1."""
    return strategy.tp if strategy.sp else 1


def selective_recompute_s(model: ModelSpec, samples: float, strategy: Strategy, matmul_flops_per_s: float,
                          attention_flops_per_s: float, memory_bytes_per_s: float) -> np.ndarray:
    """[layer] time of recomputing the attention core of `samples` samples in backward under selective
    recomputation (0 for other strategies): its FLOPs at the matmul rate (a flash kernel's at the attention rate)
    plus its softmax/dropout traffic at the memory bandwidth, both split by TP."""
    if not strategy.selective:
        return np.zeros(model.num_layers)
    arrays = model.arrays
    rate = np.where(arrays.forward_flash_attention_flops_per_sample > 0, attention_flops_per_s, matmul_flops_per_s)
    per_sample = (arrays.attention_core_flops_per_sample / rate
                  + arrays.attention_core_memory_traffic_bytes_per_sample / memory_bytes_per_s)
    return per_sample * samples / strategy.tp


def selective_freed_bytes(model: ModelSpec, samples: float, strategy: Strategy) -> np.ndarray:
    """[layer] bytes of the attention core's stash that selective recomputation does not keep (0 otherwise)."""
    if not strategy.selective:
        return np.zeros(model.num_layers)
    return model.arrays.attention_core_activation_bytes_per_sample * samples / strategy.tp


def selective_rebuilt_bytes(model: ModelSpec, samples: float, strategy: Strategy, workspace_priced: bool) -> np.ndarray:
    """[layer] what the attention core rebuilt by selective recomputation adds to the layer's backward peak (0 for
    other strategies). Unfused attention rebuilds its s×s stash, which backward needs at once: all of it. A fused
    (flash) core rebuilds its output and fp32 log-sum-exp, a few bytes per token, only when backward reaches the
    attention — after the MLP's backward has freed the MLP's stash and the gradient of its up-projection output,
    which are larger (s·ffn against s·a·d_head per sample) — so where the backward workspace is priced
    (gbmw.cost.framework_memory.prices_backward_workspace: gbmw's runtime) the rebuilt core stays below the peak already
    priced and adds nothing; the traced peaks agree to the byte (tests/test_fake_memory.py)."""
    rebuilt = selective_freed_bytes(model, samples, strategy)
    if not workspace_priced:
        return rebuilt
    return np.where(model.arrays.forward_flash_attention_flops_per_sample > 0, 0.0, rebuilt)
