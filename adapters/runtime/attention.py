"""Scaled dot-product attention that keeps what flash attention keeps, on every device.

On a GPU the runtime calls `F.scaled_dot_product_attention`, whose flash / memory-efficient kernels save only
Q, K, V, the output and the log-sum-exp of each row for backward (Dao et al., FlashAttention, Alg. 1–2), with
attention dropout drawn again in backward from a saved RNG state. On a CPU torch's fused kernel has no dropout:
with dropout SDPA falls back to its math path, which saves the s × s scores, probabilities and dropout mask of
every head — memory no GPU run allocates, which would make the CPU's trace of the runtime (gbmw.adapters.profile
.fake_memory) disagree with the GPU's and with the estimator's flash accounting (gbmw.specs.transformer_layers).

`RecomputingAttention` is that missing kernel for the CPU: the same mathematics as the math path (softmax in
fp32, inverted dropout on the probabilities), computed a few (sample, head) pairs at a time so the s × s scores exist
for `CHUNK_SCORE_ELEMENTS` elements at most, saving Q, K, V, the output, the fp32 log-sum-exp and the generator's
state; backward recomputes the probabilities and draws the same dropout masks from that state (FlashAttention
Alg. 2 without the tiling of the rows). With grouped-query attention it keeps K and V at their own width, as SDPA's
`enable_gqa` does, and reads each chunk's key/value heads per query head (a chunk-sized copy).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

CHUNK_SCORE_ELEMENTS = 2**24
"""Score elements (fp32: 64 MiB) one chunk of (sample, head) pairs materialises at once, forward or backward."""


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: bool,
              dropout_p: float) -> torch.Tensor:
    """softmax(Q·Kᵀ/√d [causal]) with dropout on the probabilities, times V; [batch, heads, tokens, head_dim].
    Grouped-query attention when K and V have fewer heads than Q (query head i reads key/value head
    i // (heads / kv_heads); Ainslie et al., GQA, 2023): SDPA's `enable_gqa` keeps K and V at their own width.
    CPU with dropout: `RecomputingAttention` (see the module docstring), which keeps K and V at their own width too;
    otherwise torch's SDPA."""
    if dropout_p == 0.0 or query.device.type != "cpu":
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal, dropout_p=dropout_p,
                                              enable_gqa=key.size(1) != query.size(1))
    if torch.is_autocast_enabled("cpu"):  # as autocast runs SDPA: in the lower precision
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    with torch.autocast("cpu", enabled=False):
        return RecomputingAttention.apply(query, key, value, causal, dropout_p)


def _chunks(batch: int, heads: int, tokens: int, key_tokens: int) -> list[tuple[slice, slice]]:
    """(samples, heads) index pairs whose scores hold at most CHUNK_SCORE_ELEMENTS elements (one head at least)."""
    pairs = max(1, CHUNK_SCORE_ELEMENTS // (tokens * key_tokens))
    if pairs >= heads:
        rows = pairs // heads
        return [(slice(start, start + rows), slice(None)) for start in range(0, batch, rows)]
    return [(slice(sample, sample + 1), slice(start, start + pairs))
            for sample in range(batch) for start in range(0, heads, pairs)]


def _key_heads(chunk: tuple[slice, slice], heads: int, group: int) -> tuple[slice, torch.Tensor | slice]:
    """The (samples, key/value heads) a chunk of query heads reads: query head i reads key/value head i // group."""
    samples, query_heads = chunk
    if group == 1:
        return chunk
    return samples, torch.arange(heads)[query_heads] // group


def _grouped(tensor: torch.Tensor, chunk: tuple[slice, slice], heads: int, group: int) -> torch.Tensor:
    """K or V of one chunk, one head per query head (a copy of the chunk's heads only: K and V stay as given)."""
    samples, key_heads = _key_heads(chunk, heads, group)
    return tensor[samples, key_heads]


def _add_grouped(gradient: torch.Tensor, chunk: tuple[slice, slice], heads: int, group: int,
                 chunk_gradient: torch.Tensor) -> None:
    """Add a chunk's per-query-head gradient of K or V to the key/value heads it was read from (without groups:
    write it, each head read by one query head)."""
    samples, key_heads = _key_heads(chunk, heads, group)
    if group == 1:
        gradient[chunk] = chunk_gradient.to(gradient.dtype)
    else:
        gradient[samples].index_add_(1, key_heads, chunk_gradient)


def _computed(tensor: torch.Tensor) -> torch.Tensor:
    """16-bit inputs are computed in fp32 (as SDPA's math path does); fp32 and fp64 as they are."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _probabilities(query: torch.Tensor, key: torch.Tensor, causal: bool, log_sum_exp: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of the scaled scores of one chunk of heads, at least in fp32 (rows normalised by `log_sum_exp`
    when given)."""
    scores = torch.matmul(_computed(query), _computed(key).transpose(-1, -2)) * (1.0 / math.sqrt(query.size(-1)))
    if causal:
        tokens, key_tokens = scores.shape[-2:]
        future = torch.ones(tokens, key_tokens, dtype=torch.bool, device=scores.device).triu(key_tokens - tokens + 1)
        scores = scores.masked_fill(future, float("-inf"))
    if log_sum_exp is None:
        log_sum_exp = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - log_sum_exp.unsqueeze(-1)), log_sum_exp


def _dropout_scale(probabilities: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """The inverted-dropout factor per probability: 0 or 1 / (1 − p), drawn from the default generator."""
    keep = torch.empty_like(probabilities).bernoulli_(1.0 - dropout_p)
    return keep * (1.0 / (1.0 - dropout_p))


class RecomputingAttention(torch.autograd.Function):
    """Attention with dropout whose backward recomputes the probabilities (see the module docstring)."""

    @staticmethod
    def forward(ctx, query, key, value, causal: bool, dropout_p: float):
        generator_state = torch.get_rng_state()
        output = torch.empty_like(query)
        log_sum_exp = torch.empty(query.shape[:-1], dtype=_computed(query).dtype, device=query.device)
        heads, group = query.size(1), query.size(1) // key.size(1)
        for chunk in _chunks(*query.shape[:3], key.size(2)):
            chunk_key = _grouped(key, chunk, heads, group)
            probabilities, log_sum_exp[chunk] = _probabilities(query[chunk], chunk_key, causal)
            dropped = probabilities * _dropout_scale(probabilities, dropout_p)
            output[chunk] = torch.matmul(dropped, _computed(_grouped(value, chunk, heads, group))).to(output.dtype)
        ctx.save_for_backward(query, key, value, output, log_sum_exp, generator_state)
        ctx.causal, ctx.dropout_p = causal, dropout_p
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, output, log_sum_exp, generator_state = ctx.saved_tensors
        heads, group = query.size(1), query.size(1) // key.size(1)
        grad_query = torch.empty_like(query)
        # with grouped-query attention K's and V's gradients sum over the query heads sharing a key/value head: in fp32
        grad_key, grad_value = (torch.empty_like(tensor) if group == 1 else
                                torch.zeros_like(tensor, dtype=_computed(tensor).dtype) for tensor in (key, value))
        scale = 1.0 / math.sqrt(query.size(-1))
        # Σ_k P_ik dP_ik over the pre-dropout probabilities equals Σ_c dO_ic O_ic (FlashAttention Alg. 2, D_i).
        row_dot = (_computed(grad_output) * _computed(output)).sum(-1)
        # as forward ran: outside autocast (the engine runs a CPU backward under autocast for megatron's layers)
        with torch.autocast("cpu", enabled=False), torch.random.fork_rng(devices=[]):
            torch.set_rng_state(generator_state)  # the forward's dropout masks, drawn again in the same order
            for chunk in _chunks(*query.shape[:3], key.size(2)):
                chunk_key = _computed(_grouped(key, chunk, heads, group))
                probabilities, _ = _probabilities(query[chunk], chunk_key, ctx.causal, log_sum_exp[chunk])
                dropout_scale = _dropout_scale(probabilities, ctx.dropout_p)
                chunk_grad = _computed(grad_output[chunk])
                _add_grouped(grad_value, chunk, heads, group,
                             torch.matmul((probabilities * dropout_scale).transpose(-1, -2), chunk_grad))
                grad_probabilities = torch.matmul(chunk_grad, _computed(_grouped(value, chunk, heads, group)
                                                                        ).transpose(-1, -2)) * dropout_scale
                grad_scores = probabilities * (grad_probabilities - row_dot[chunk].unsqueeze(-1)) * scale
                grad_query[chunk] = torch.matmul(grad_scores, chunk_key).to(grad_query.dtype)
                _add_grouped(grad_key, chunk, heads, group,
                             torch.matmul(grad_scores.transpose(-1, -2), _computed(query[chunk])))
        return grad_query, grad_key.to(key.dtype), grad_value.to(value.dtype), None, None
