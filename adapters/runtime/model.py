"""The runtime's Transformer layers, built one plan layer at a time (GPT decoder and BERT encoder stacks).

The planner's ModelSpec (gbmw.specs.models) lists the layers `embedding`, `decoder.<i>` / `encoder.<i>` and
`head`; `build_layer(architecture, name, tp)` builds exactly that layer as a module, so a plan's
per-layer strategies map 1:1 onto modules and parameter names are `<layer>.<parameter>`
(`decoder.3.attention.qkv.weight`) in every plan — the key of plan-independent checkpoints.

Each layer is written once and takes its TP group (`TensorParallel`); with one device it is the plain
single-process layer. Attention keeps Megatron's per-head weight layout ([heads, (q, k, v), head_dim]
rows of the fused QKV matrix) so a column split over TP ranks gives each rank whole heads.

Supported here: GPT-2/3-style decoders (LayerNorm, learned positions, GELU MLP, optional biases), LLaMA-style
decoders (RMSNorm: rms_norm; SwiGLU: gated_mlp; rotary positions: rotary; grouped-query attention; untied head)
and BERT encoders (post-norm, token types, MLM + next-sentence heads). What it cannot build (T5, ViT, Swin) is
refused by `check_runtime_supports` with the sentence `gbmw plan` prints for such a model (gbmw.space.runtime_support).
With grouped-query attention the fused QKV matrix is grouped per key/value head, [kv_heads, (its query heads, k, v),
head_dim] rows (Megatron's layout), so a column split over TP ranks gives each rank whole groups (the planner keeps
the TP degree a divisor of kv_heads). The gated MLP's two up-projections are separate column-parallel matrices
(`mlp.gate`, `mlp.fc1`): a fused one would interleave gate and up rows per TP rank, and its full tensor would
depend on the TP degree — checkpoints hold full tensors that every plan reads alike. The vocabulary is padded to a
multiple of 128 as Megatron does (`--make-vocab-size-divisible-by`), in every plan alike, so any power-of-two TP
degree up to 128 divides it. A mixture-of-experts decoder's MoE blocks (`architecture.is_moe_block(i)`) have a `moe`
MLP in place of `mlp` (gbmw.adapters.runtime.experts: `moe.router`, `moe.experts.<e>.…`, `moe.shared.…`).
A layer with a sequence axis runs on its rank's part of each sample's tokens (`sequence`: a `ulysses` axis,
gbmw.adapters.runtime.ulysses, or a `cp` axis, gbmw.adapters.runtime.context_parallel): the embedding adds the learned
positions of those tokens' global positions, a block's attention sees the whole sequence — Ulysses exchanges Q, K, V
and the output over its group, CP passes K and V round its ring — with rotary angles at global positions, and a head
returns its part's share of the loss.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from gbmw.errors import PlanError
from gbmw.space.runtime_support import runtime_refusal
from gbmw.specs.architectures import BERTArchitecture, GPTArchitecture

from .context_parallel import RING_ATTENTION_DROPOUT, ContextParallel
from .experts import ExpertParallel, MixtureOfExpertsMLP
from .gated_mlp import swiglu
from .rms_norm import RMSNorm
from .rotary import ROTARY_BASE, rotate
from .sequence_parallel import gather_sequence, norm_forward, scatter_sequence
from .tensor_parallel import TensorParallel
from .ulysses import UlyssesParallel

VOCAB_PADDING_MULTIPLE = 128
DROPOUT_PROBABILITY = 0.1
"""Hidden and attention dropout when an architecture says `dropout: true` (GPT-2/3 and BERT's value)."""
INIT_STD = 0.02


def padded_vocab_size(vocab_size: int) -> int:
    return math.ceil(vocab_size / VOCAB_PADDING_MULTIPLE) * VOCAB_PADDING_MULTIPLE


def check_runtime_supports(architecture: Any, precision: str | None = None) -> None:
    """One clear error saying what the runtime cannot train (gbmw.space.runtime_support, also said by `gbmw plan`)."""
    refusal = runtime_refusal(architecture, precision)
    if refusal is not None:
        raise PlanError(refusal)


def layer_names(architecture: Any) -> list[str]:
    """The layer names of the planner's ModelSpec for this architecture, in order."""
    body = "decoder" if isinstance(architecture, GPTArchitecture) else "encoder"
    return ["embedding"] + [f"{body}.{index}" for index in range(architecture.num_layers)] + ["head"]


SequenceSplit = UlyssesParallel | ContextParallel
"""A layer's split of each sample's tokens: `size`, `part`, `head_split`, `token_pieces`, `positions`, `attend`."""


def build_layer(architecture: Any, name: str, tp: TensorParallel, dtype: torch.dtype = torch.float32,
                experts: ExpertParallel | None = None, sequence: SequenceSplit | None = None) -> nn.Module:
    """The module of one plan layer, its parameters uninitialised (see `initial_value`); a mixture-of-experts block
    holds the routed experts of its EP rank `experts` (None: all of them); `sequence`: the layer's Ulysses group or CP
    ring, whose part of each sample's tokens it runs on (None: the whole sequence)."""
    sequence = sequence or UlyssesParallel.single()
    bert = isinstance(architecture, BERTArchitecture)
    dropout = DROPOUT_PROBABILITY if architecture.dropout else 0.0
    if tp.sequence_parallel and (name in ("embedding", "head") or architecture.seq_length % tp.size):
        raise PlanError(f"layer {name}: sequence parallelism (+sp) runs in Transformer blocks whose sequence "
                        f"({architecture.seq_length} tokens) the TP degree {tp.size} divides")
    axis = "cp" if isinstance(sequence, ContextParallel) else "ulysses"
    if architecture.seq_length % sequence.token_pieces:
        raise PlanError(f"layer {name}: {axis}{sequence.size} splits each sample's {architecture.seq_length} tokens "
                        f"into {sequence.token_pieces} equal parts; give a sequence length divisible by "
                        f"{sequence.token_pieces}")
    if axis == "cp" and dropout:
        raise PlanError(f"layer {name}: {RING_ATTENTION_DROPOUT}")
    if name == "embedding":
        return Embedding(architecture, tp, dtype, dropout, sequence)
    if name == "head":
        return (BERTHead if bert else GPTHead)(architecture, tp, dtype, sequence)
    moe = architecture.moe if not bert and architecture.is_moe_block(int(name.split(".")[1])) else None
    return TransformerBlock(
        hidden=architecture.hidden_size,
        heads=architecture.num_heads,
        ffn=architecture.ffn_hidden_size or 4 * architecture.hidden_size,
        bias=getattr(architecture, "bias", True),
        causal=not bert,
        post_norm=bert,
        dropout=dropout,
        tp=tp,
        dtype=dtype,
        kv_heads=getattr(architecture, "num_kv_heads", None),
        head_dim=getattr(architecture, "head_dim", None),
        norm=getattr(architecture, "norm", "layer"),
        gated_mlp=getattr(architecture, "gated_mlp", False),
        rotary_base=_rotary_base(architecture),
        moe=moe,
        experts=experts or ExpertParallel.single(),
        sequence=sequence,
    )


def _rotary_base(architecture: Any) -> float | None:
    """θ's base when the architecture uses rotary positions (None: learned positions)."""
    if getattr(architecture, "position_embedding", "learned") != "rotary":
        return None
    return float(getattr(architecture, "rope_theta", None) or ROTARY_BASE)


def make_norm(kind: str, hidden: int, dtype: torch.dtype) -> nn.Module:
    """The architecture's `norm`: LayerNorm (`layer`) or RMSNorm (`rms`)."""
    return RMSNorm(hidden, dtype) if kind == "rms" else nn.LayerNorm(hidden, dtype=dtype)


def initial_value(parameter_name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The full initial tensor of a parameter, a function of its name and the seed only — so every plan,
    and the single-process model, starts from identical weights. GPT-2's scheme: N(0, 0.02) for
    matrices and embeddings, ones for norm weights, zeros for biases."""
    leaf = parameter_name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if ".norm" in parameter_name or parameter_name.rsplit(".", 2)[-2].endswith("norm"):
        return torch.ones(shape)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(parameter_name.encode())) % 2**63)
    return torch.randn(shape, generator=generator) * INIT_STD


def dropout(x: torch.Tensor, probability: float, training: bool) -> torch.Tensor:
    """Inverted dropout keeping a 1-byte mask for backward on every device (`torch.native_dropout`, what CUDA's
    F.dropout runs); a CPU's F.dropout multiplies by a noise tensor of the input's dtype and keeps that instead."""
    if not training or probability == 0.0:
        return x
    return torch.native_dropout(x, probability, True)[0]


class Embedding(nn.Module):
    """Token (vocabulary-parallel) + learned position (none with rotary positions; + BERT token-type and LayerNorm)
    embeddings."""

    def __init__(self, architecture: Any, tp: TensorParallel, dtype: torch.dtype, dropout: float,
                 sequence: SequenceSplit = UlyssesParallel.single()):
        super().__init__()
        self.sequence = sequence
        hidden = architecture.hidden_size
        self.word = tp.vocab_embedding(padded_vocab_size(architecture.vocab_size), hidden, dtype)
        positions = getattr(architecture, "max_position_embeddings", None) or architecture.seq_length
        learned = getattr(architecture, "position_embedding", "learned") == "learned"
        self.position = nn.Embedding(positions, hidden, dtype=dtype) if learned else None
        bert = isinstance(architecture, BERTArchitecture)
        self.token_type = nn.Embedding(architecture.type_vocab_size, hidden, dtype=dtype) if bert else None
        self.norm = nn.LayerNorm(hidden, dtype=dtype) if bert else None
        self.dropout = dropout

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.word(tokens)
        if self.position is not None:  # (rotary positions are applied in attention); global ones under a split
            hidden = hidden + self.position(self.sequence.positions(tokens.size(1), tokens.device))
        if self.token_type is not None:
            hidden = hidden + self.token_type.weight[0]  # every token of the synthetic data is segment A
        if self.norm is not None:
            hidden = self.norm(hidden)
        return dropout(hidden, self.dropout, self.training)


class TransformerBlock(nn.Module):
    """Self-attention + MLP with Megatron's TP split: QKV (gate and up) column-parallel, proj and fc2 row-parallel."""

    def __init__(self, hidden: int, heads: int, ffn: int, bias: bool, causal: bool, post_norm: bool, dropout: float,
                 tp: TensorParallel, dtype: torch.dtype, *, kv_heads: int | None = None, head_dim: int | None = None,
                 norm: str = "layer", gated_mlp: bool = False, rotary_base: float | None = None, moe: Any = None,
                 experts: ExpertParallel = ExpertParallel.single(),
                 sequence: SequenceSplit = UlyssesParallel.single()):
        super().__init__()
        kv_heads = kv_heads or heads
        if heads % tp.size or kv_heads % tp.size or ffn % tp.size:
            raise PlanError(f"TP degree {tp.size} must divide the heads ({heads}), the key/value heads ({kv_heads}) and "
                            f"the MLP width ({ffn})")
        if kv_heads % (tp.size * sequence.head_split):
            raise PlanError(f"Ulysses gives each of tp({tp.size}) × ulysses({sequence.head_split}) ranks whole "
                            f"key/value groups, but the layer has {kv_heads} key/value heads")
        self.sequence = sequence
        # head_dim: hidden / heads unless the architecture sets its own (Mistral-Nemo's 128 with hidden 5120, 32 heads)
        self.local_groups, self.group_heads = kv_heads // tp.size, heads // kv_heads
        self.head_dim = head_dim or hidden // heads
        self.causal, self.post_norm, self.dropout, self.rotary_base = causal, post_norm, dropout, rotary_base
        self.attention_norm = make_norm(norm, hidden, dtype)
        self.attention = nn.Module()
        self.attention.qkv = tp.column_linear(hidden, (heads + 2 * kv_heads) * self.head_dim, bias, dtype)
        self.attention.proj = tp.row_linear(heads * self.head_dim, hidden, bias, dtype)
        self.mlp_norm = make_norm(norm, hidden, dtype)
        self.moe = None if moe is None else MixtureOfExpertsMLP(hidden, moe, bias, gated_mlp, tp, experts, dtype)
        if moe is None:  # a mixture-of-experts block (gbmw.adapters.runtime.experts) has no dense MLP
            self.mlp = nn.Module()
            if gated_mlp:
                self.mlp.gate = tp.column_linear(hidden, ffn, bias, dtype)
            self.mlp.fc1 = tp.column_linear(hidden, ffn, bias, dtype)
            self.mlp.fc2 = tp.row_linear(ffn, hidden, bias, dtype)
        self.gated_mlp = gated_mlp
        self.tp = tp
        self.recompute_slices = False
        """+sp+ckpt (set by the engine in place of checkpointing the whole layer): recompute from the sequence slice."""
        self.recompute_attention_core = False
        """+sel (set by the engine): recompute the attention core in backward (gbmw.adapters.runtime
        .attention_core_recompute)."""

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V as [batch, tokens, heads, head_dim] from the fused projection (its rows grouped per key/value head).
        Multi-head attention without rotary positions takes views of the projection's output (kept whole for
        backward, as its three parts are). Otherwise each part gets its own storage — the rotated Q and K, a copy of
        V — so the projection's output is freed and backward keeps exactly Q, K and V."""
        qkv = self.attention.qkv(x)  # the whole sequence (+sp: gathered from the slices)
        batch, tokens, _ = qkv.shape
        qkv = qkv.view(batch, tokens, self.local_groups, self.group_heads + 2, self.head_dim)
        if self.group_heads == 1 and self.rotary_base is None:
            return qkv.unbind(3)
        query = qkv[:, :, :, :self.group_heads].reshape(batch, tokens, self.local_groups * self.group_heads,
                                                          self.head_dim)
        key, value = qkv[:, :, :, self.group_heads], qkv[:, :, :, self.group_heads + 1]
        if self.rotary_base is not None:
            # global positions where the rank holds a part of the tokens
            positions = self.sequence.positions(tokens, qkv.device) if self.sequence.size > 1 else None
            query, key = rotate(query, self.rotary_base, positions), rotate(key, self.rotary_base, positions)
        return query.contiguous(), key.contiguous(), value.contiguous()

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        # over the whole sequence: plain, Ulysses' all-to-alls around the core, or CP's ring (`SequenceSplit.attend`)
        context = self.sequence.attend(*self._heads(x), self.causal, self.dropout if self.training else 0.0,
                                       self.recompute_attention_core)
        context = context.reshape(*context.shape[:2], self.local_groups * self.group_heads * self.head_dim)
        return dropout(self.attention.proj(context), self.dropout, self.training)

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return dropout(self.moe(x), self.dropout, self.training)
        if not self.gated_mlp:
            return dropout(self.mlp.fc2(F.gelu(self.mlp.fc1(x))), self.dropout, self.training)
        device = x.device.type
        if torch.is_autocast_enabled(device) and isinstance(self.mlp.gate, nn.Linear):
            # one 16-bit copy of the normalised input for both up-projections (autocast would cast it for each and
            # `nn.Linear` keep both); megatron's TP linears keep the fp32 input they are given, shared by both
            x = x.to(torch.get_autocast_dtype(device))
        return dropout(self.mlp.fc2(swiglu(self.mlp.gate(x), self.mlp.fc1(x))), self.dropout, self.training)

    def _norm(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return norm_forward(norm, x, self.tp.group) if self.tp.sequence_parallel else norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """With sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) the norms, dropout and residual adds run
        on this rank's slice of the sequence: the input is sliced at entry and the output all-gathered at exit, so the
        layer's boundaries are those of every other layer (gbmw.adapters.runtime.sequence_parallel)."""
        if not self.tp.sequence_parallel:
            return self._body(x)
        x = scatter_sequence(x, self.tp.group)
        if self.recompute_slices:  # +sp+ckpt: keep the sequence slice, not the whole input
            x = torch.utils.checkpoint.checkpoint(self._body, x, use_reentrant=False)
        else:
            x = self._body(x)
        return gather_sequence(x, self.tp.group)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_norm:  # BERT
            x = self._norm(self.attention_norm, x + self._attend(x))
            return self._norm(self.mlp_norm, x + self._feed_forward(x))
        x = x + self._attend(self._norm(self.attention_norm, x))
        return x + self._feed_forward(self._norm(self.mlp_norm, x))


class GPTHead(nn.Module):
    """Final norm, vocabulary-parallel output projection and cross-entropy: the mean loss per token."""

    def __init__(self, architecture: GPTArchitecture, tp: TensorParallel, dtype: torch.dtype,
                 sequence: SequenceSplit = UlyssesParallel.single()):
        super().__init__()
        self.tp, self.sequence = tp, sequence
        self.recompute_slices = False
        """+sp+ckpt (set by the engine in place of checkpointing the whole layer): recompute from the sequence slice."""
        self.norm = make_norm(architecture.norm, architecture.hidden_size, dtype)
        self.output = tp.column_linear(architecture.hidden_size, padded_vocab_size(architecture.vocab_size), False,
                                       dtype)

    def forward(self, x: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.output(self.norm(x))
        # the mean over this rank's tokens; split over s ranks 1/s of it, its part's share of the samples' mean (equal
        # parts)
        return self.tp.cross_entropy(logits, labels["tokens"]).mean() / self.sequence.size


class BERTHead(nn.Module):
    """MLM transform (dense, GELU, LayerNorm) and vocabulary projection; pooler and next-sentence classifier.
    The loss is the mean masked-LM loss per token plus the mean next-sentence loss."""

    def __init__(self, architecture: BERTArchitecture, tp: TensorParallel, dtype: torch.dtype,
                 sequence: SequenceSplit = UlyssesParallel.single()):
        super().__init__()
        hidden = architecture.hidden_size
        self.tp, self.sequence = tp, sequence
        self.recompute_slices = False
        """+sp+ckpt (set by the engine in place of checkpointing the whole layer): recompute from the sequence slice."""
        self.transform = nn.Linear(hidden, hidden, dtype=dtype)
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.output = tp.column_linear(hidden, padded_vocab_size(architecture.vocab_size), False, dtype)
        self.pooler = nn.Linear(hidden, hidden, dtype=dtype)
        self.next_sentence = nn.Linear(hidden, 2, dtype=dtype)

    def forward(self, x: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.output(self.norm(F.gelu(self.transform(x))))
        masked_lm = self.tp.cross_entropy(logits, labels["tokens"]).mean() / self.sequence.size
        pooled = torch.tanh(self.pooler(x[:, 0]))
        next_sentence = F.cross_entropy(self.next_sentence(pooled).float(), labels["next_sentence"])
        # under a sequence split only part 0 holds each sample's first token (Ulysses' first part, CP's chunk 0); the
        # others weigh theirs by 0, so the pooler has a (zero) gradient on every rank, as plain DP's all-reduce needs
        return masked_lm + next_sentence * float(self.sequence.part == 0)


def synthetic_batch(architecture: Any, global_batch: int, step: int, seed: int) -> dict[str, torch.Tensor]:
    """A reproducible batch of random tokens (the same on every rank): `inputs` for the embedding and
    `tokens` (+ `next_sentence` for BERT) as labels for the head; every tensor has the batch first."""
    generator = torch.Generator().manual_seed(seed * 7919 + step)
    length, vocab = architecture.seq_length, architecture.vocab_size
    if isinstance(architecture, GPTArchitecture):
        sequence = torch.randint(vocab, (global_batch, length + 1), generator=generator)
        return {"inputs": sequence[:, :-1].contiguous(), "tokens": sequence[:, 1:].contiguous()}
    inputs = torch.randint(vocab, (global_batch, length), generator=generator)
    return {
        "inputs": inputs,
        "tokens": torch.randint(vocab, (global_batch, length), generator=generator),
        "next_sentence": torch.randint(2, (global_batch,), generator=generator),
    }
