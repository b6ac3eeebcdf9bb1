"""The share of a causal attention's scores a flash kernel computes (issue 28: gbmw charged causal attention the
whole square of scores, twice what the kernels run).

A flash kernel walks the scores in tiles of 128 queries × 128 keys and skips each tile wholly above the diagonal
(FlashAttention-2, Dao 2023, Sec. 3.1.1 "Causal masking": "for blocks where all the column indices are more than
the row indices ... we can skip the computation of that block"); the tiles on the diagonal it computes whole. Of n
query tiles, tile i computes i + 1 key tiles — min(i + 1, m + 1) under a sliding window of m key tiles, the window
reaching into m + 1 of them — against the n · m tiles of the whole (windowed) square gbmw counts as the model's
FLOPs. Full causal attention computes (n + 1) / (2n) of them: 0.531 at 2048 tokens, 0.508 at 8192.

Measured on one H100 (benchmarks/gpu_kernels.py, docs/gpu-measurements.md), causal over non-causal
forward + backward time, torch's flash / cuDNN back ends, head dim 128: 0.60 / 0.61 at 2048 tokens, 0.56 / 0.55 at
4096, 0.52 / 0.53 at 8192, 0.51 / 0.52 at 16384, 0.50 / 0.51 at 32768 — the tile count's share, and up to 13 %
more at short sequences, where the diagonal tiles' masking and the shorter loops weigh more.
"""

from __future__ import annotations

import math

FLASH_TILE_TOKENS = 128
"""Queries and keys per tile of the flash kernels (FlashAttention-2's and cuDNN's 128 × 128 blocks at head dim 128)."""


def causal_computed_share(query_tokens: int, attended_tokens: int) -> float:
    """Share of the query_tokens × attended_tokens scores (attended_tokens: the sequence, or a sliding window) a
    flash kernel computes under a causal mask, in whole tiles (module docstring); at most 1."""
    query_tiles = math.ceil(query_tokens / FLASH_TILE_TOKENS)
    window_tiles = math.ceil(min(attended_tokens, query_tokens) / FLASH_TILE_TOKENS)
    if window_tiles >= query_tiles:
        computed = query_tiles * (query_tiles + 1) / 2
    else:
        computed = (window_tiles * (window_tiles + 1) / 2
                    + (query_tiles - window_tiles) * (window_tiles + 1))
    return min(1.0, computed / (query_tiles * window_tiles))
