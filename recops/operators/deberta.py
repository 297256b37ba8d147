"""DeBERTa disentangled attention (docs/ops.md §6): Python entry point, fake kernels, autograd
and a drop-in for HuggingFace's DebertaV2 ``DisentangledSelfAttention``
(kernels: csrc/recops/deberta/kernels/disentangled_attention.h)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn
from torch.library import register_autograd

from recops._autograd import grads_by_name, named_arguments
from recops._fake import register_fake

ops = torch.ops.recops

_TERMS = ("c2p", "p2c")


def _terms(spec: str) -> set[str]:
    return {t.strip() for t in spec.split("|")} - {""}


def _pos_att_spec(pos_att_type: str | Sequence[str]) -> str:
    if isinstance(pos_att_type, str):
        return pos_att_type
    return "|".join(pos_att_type)


_DEFAULT_SPEC = "c2p|p2c"


_FORWARD = ops.disentangled_attention.default
_BACKWARD = ops.disentangled_attention_backward.default
# The backward's arguments that come from the forward's call rather than from its results.
_FORWARD_NAMES = {a.name for a in _FORWARD._schema.arguments}
_FORWARD_INPUTS = tuple(a.name for a in _BACKWARD._schema.arguments if a.name in _FORWARD_NAMES)


@register_fake("recops::disentangled_attention")
def _forward_fake(*args, **kwargs):
    a = named_arguments(_FORWARD, args, kwargs)
    q, k, v = a["q"], a["k"], a["v"]
    batch, heads, q_len, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_empty((batch, heads, q_len, v.shape[-1]))
    lse = q.new_empty((batch, heads, q_len), dtype=lse_dtype)
    probs = q.new_empty((batch, heads, q_len, k.shape[2])) if a["return_probs"] else None
    return out, lse, probs


@register_fake("recops::disentangled_attention_backward")
def _backward_fake(*args, **kwargs):
    a = named_arguments(_BACKWARD, args, kwargs)
    terms = _terms(a["pos_att_type"])

    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    return (
        like(a["q"]),
        like(a["k"]),
        like(a["v"]),
        like(a["pos_key"]) if "c2p" in terms else None,
        like(a["pos_query"]) if "p2c" in terms else None,
    )


@register_fake("recops::deberta_log_bucket_position")
def _log_bucket_position_fake(relative_pos, bucket_size, max_position):
    return torch.empty_like(relative_pos, dtype=torch.int64, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    arguments = named_arguments(_FORWARD, inputs)
    out, lse, probs = output
    ctx.tensor_names = [n for n in _FORWARD_INPUTS if isinstance(arguments[n], torch.Tensor)]
    ctx.save_for_backward(*(arguments[n] for n in ctx.tensor_names), out, lse, probs)
    ctx.options = {
        n: arguments[n] for n in _FORWARD_INPUTS if not isinstance(arguments[n], torch.Tensor)
    }
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse, grad_probs):
    *tensors, out, lse, probs = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    results = _BACKWARD(
        grad_out,
        grad_probs,
        output=out,
        softmax_lse=lse,
        probs=probs,
        **dict(zip(ctx.tensor_names, tensors, strict=True)),
        **ctx.options,
    )
    return grads_by_name(ctx, _FORWARD, _BACKWARD, results)


register_autograd("recops::disentangled_attention", _backward, setup_context=_setup_context)


def disentangled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_key: torch.Tensor | None,
    pos_query: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    *,
    pos_att_type: str | Sequence[str] = ("c2p", "p2c"),
    position_buckets: int = 256,
    max_relative_positions: int = 512,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_probs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """DeBERTa-v2/v3 disentangled attention (docs/ops.md §6), fused: never builds [S, S] scores.

    ``A[i,j] = scale * (q_i.k_j + [c2p] q_i.pos_key[d] + [p2c] k_j.pos_query[d])`` with
    ``d = clamp(bucket(i - j) + span, 0, 2 span - 1)``, masked, softmax over j, dropout, ``A V``.

    Args:
        q: ``[B, H, Sq, d]``; k: ``[B, H, Sk, d]``; v: ``[B, H, Sk, dv]`` (fp32, bf16, fp16, fp64).
        pos_key, pos_query: projected position tables ``[2 span, H, d]`` (HF: ``key_proj`` /
            ``pos_key_proj`` and ``query_proj`` / ``pos_query_proj`` of the relative embeddings),
            ``span = position_buckets if position_buckets > 0 else max_relative_positions``;
            only the tables of the terms in ``pos_att_type`` are needed (others may be None).
        attention_mask: padding mask ``[B, S]`` (pair (i, j) kept iff both are kept, as HF
            expands it) or ``[B, 1, Sq, Sk]``; bool or numbers (nonzero keeps). Rows that keep no
            key give zero output.
        pos_att_type: any subset of ``("c2p", "p2c")``, or HF's string form ``"c2p|p2c"``.
        position_buckets, max_relative_positions: HF's log-bucketing of relative positions
            (identity when ``position_buckets <= 0``).
        scale: defaults to ``1 / sqrt(d * (1 + len(pos_att_type)))``.
        dropout_p: attention-probability dropout; the mask comes from a seed drawn from torch's
            generator, so ``torch.manual_seed`` reproduces it, and backward regenerates it.
        return_probs: also return the ``[B, H, Sq, Sk]`` probabilities (after dropout, as HF's
            ``output_attentions``); they are differentiable.

    Returns ``out [B, H, Sq, dv]``, or ``(out, probs)`` when ``return_probs``.
    """
    seed = int(torch.randint(0, 2**62, ())) if dropout_p > 0 else 0
    out, _, probs = ops.disentangled_attention(
        q,
        k,
        v,
        pos_key,
        pos_query,
        attention_mask,
        _pos_att_spec(pos_att_type),
        position_buckets,
        max_relative_positions,
        scale,
        dropout_p,
        seed,
        return_probs,
    )
    return (out, probs) if return_probs else out


def make_log_bucket_position(relative_pos, bucket_size: int, max_position: int) -> torch.Tensor:
    """HuggingFace's log bucketing of integer relative positions (float result, as HF returns
    it), computed by the kernel the fused attention uses
    (``torch.ops.recops.deberta_log_bucket_position``, float32 as HF under the default dtype)."""
    buckets = ops.deberta_log_bucket_position(relative_pos, bucket_size, max_position)
    return buckets.to(torch.get_default_dtype())


def build_relative_position(
    query_size: int, key_size: int, bucket_size: int = -1, max_position: int = -1
) -> torch.Tensor:
    """HuggingFace's ``build_relative_position``: ``[1, query_size, key_size]`` int64 ``i - j``,
    log-bucketed when ``bucket_size > 0 and max_position > 0``."""
    rel = torch.arange(query_size)[:, None] - torch.arange(key_size)[None, :]
    if bucket_size > 0 and max_position > 0:
        rel = ops.deberta_log_bucket_position(rel, bucket_size, max_position)
    return rel.unsqueeze(0)


@functools.lru_cache(maxsize=64)
def _default_relative_position(
    query_size: int, key_size: int, bucket_size: int, max_position: int, device: torch.device
) -> torch.Tensor:
    """build_relative_position on ``device``, built once per shape and device: the module checks
    every ``relative_pos`` it is given against it."""
    return build_relative_position(query_size, key_size, bucket_size, max_position).to(device)


def _config_pos_att_type(config) -> list[str]:
    value = getattr(config, "pos_att_type", None) or []
    if isinstance(value, str):
        value = value.lower().split("|")
    return [t.strip() for t in value]


class DisentangledSelfAttention(nn.Module):
    """Drop-in for HuggingFace's DebertaV2 ``DisentangledSelfAttention`` on the fused kernel.

    Built from a ``DebertaV2Config`` (or any object with its attributes); the parameters have HF's
    names and shapes (``query_proj``, ``key_proj``, ``value_proj``, and ``pos_key_proj`` /
    ``pos_query_proj`` unless ``share_att_key``), so ``load_state_dict`` takes an HF layer's
    ``attention.self`` weights. ``forward`` has HF's signature and returns, as HF does,
    ``(context [B, S, H * d], probs [B, H, S, S] or None)``; ``relative_pos``, when given, must be
    HF's default (the kernel computes the positions itself). Dropout (attention probabilities,
    in-kernel; relative embeddings, ``pos_dropout``) applies in training mode. Query rows whose
    keys are all masked give zeros (docs/ops.md section 6) where recent HF versions spread them
    uniformly over the masked keys.
    """

    def __init__(self, config):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"The hidden size ({config.hidden_size}) is not a multiple of the number of "
                f"attention heads ({config.num_attention_heads})"
            )
        self.num_attention_heads = config.num_attention_heads
        head_size = config.hidden_size // config.num_attention_heads
        self.attention_head_size = getattr(config, "attention_head_size", head_size)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query_proj = nn.Linear(config.hidden_size, self.all_head_size, bias=True)
        self.key_proj = nn.Linear(config.hidden_size, self.all_head_size, bias=True)
        self.value_proj = nn.Linear(config.hidden_size, self.all_head_size, bias=True)
        self.share_att_key = getattr(config, "share_att_key", False)
        self.pos_att_type = _config_pos_att_type(config)
        self.relative_attention = getattr(config, "relative_attention", False)
        if self.relative_attention:
            self.position_buckets = getattr(config, "position_buckets", -1)
            self.max_relative_positions = getattr(config, "max_relative_positions", -1)
            if self.max_relative_positions < 1:
                self.max_relative_positions = config.max_position_embeddings
            self.pos_ebd_size = (
                self.position_buckets if self.position_buckets > 0 else self.max_relative_positions
            )
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
            if not self.share_att_key:
                if "c2p" in self.pos_att_type:
                    self.pos_key_proj = nn.Linear(config.hidden_size, self.all_head_size, bias=True)
                if "p2c" in self.pos_att_type:
                    self.pos_query_proj = nn.Linear(config.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # [..., S, H * d] -> [B, H, S, d] (a position table [2 span, H * d] -> [2 span, H, d]).
        x = x.view(*x.shape[:-1], self.num_attention_heads, self.attention_head_size)
        return x.permute(0, 2, 1, 3) if x.dim() == 4 else x

    def _position_tables(self, rel_embeddings: torch.Tensor, terms: list[str]):
        rel = self.pos_dropout(rel_embeddings[: 2 * self.pos_ebd_size])
        key_proj = self.key_proj if self.share_att_key else getattr(self, "pos_key_proj", None)
        query_proj = (
            self.query_proj if self.share_att_key else getattr(self, "pos_query_proj", None)
        )
        pos_key = self._heads(key_proj(rel)) if "c2p" in terms else None
        pos_query = self._heads(query_proj(rel)) if "p2c" in terms else None
        return pos_key, pos_query

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        query_states: torch.Tensor | None = None,
        relative_pos: torch.Tensor | None = None,
        rel_embeddings: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query_states is None:
            query_states = hidden_states
        q = self._heads(self.query_proj(query_states))
        k = self._heads(self.key_proj(hidden_states))
        v = self._heads(self.value_proj(hidden_states))
        # HF counts the position terms in the scale even without relative attention, and takes
        # the square root in float32.
        scale_factor = 1 + sum(t in self.pos_att_type for t in _TERMS)
        size = torch.tensor(self.attention_head_size, dtype=torch.float)
        scale = 1.0 / torch.sqrt(size * scale_factor).item()
        terms = [t for t in _TERMS if t in self.pos_att_type] if self.relative_attention else []
        pos_key = pos_query = None
        buckets, max_positions = -1, 1
        if terms:
            buckets, max_positions = self.position_buckets, self.max_relative_positions
            if relative_pos is not None:
                expected = _default_relative_position(
                    q.shape[2], k.shape[2], buckets, max_positions, relative_pos.device
                )
                if not torch.equal(relative_pos.reshape(expected.shape), expected):
                    raise ValueError(
                        "relative_pos differs from build_relative_position(...) of this layer; "
                        "the fused kernel supports only HF's default relative positions"
                    )
            pos_key, pos_query = self._position_tables(rel_embeddings, terms)
        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = attention_mask.unsqueeze(1)
        out = disentangled_attention(
            q,
            k,
            v,
            pos_key,
            pos_query,
            attention_mask,
            pos_att_type=terms,
            position_buckets=buckets,
            max_relative_positions=max_positions,
            scale=scale,
            dropout_p=self.dropout.p if self.training else 0.0,
            return_probs=output_attentions,
        )
        out, probs = out if output_attentions else (out, None)
        return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1), probs
