"""Building blocks shared by our LLaDA and LLaDA-MoE implementations.

Each piece states the dtype it computes in, because that is what decides whether a bf16/fp16
run agrees with the official code to the last bit: normalise in float32 then scale in the model
dtype; RoPE tables always built in float32, applied in float32 or in the model dtype as the
family's official code does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back to x's dtype, then weight * x (+ bias) in the parameters' dtype.

    This is the order of both LLaDA's `RMSLayerNorm` and LLaDA-MoE's norm. With `affine=False`
    the module has no parameters (LLaDA's `layer_norm_with_affine: false`).
    """

    def __init__(self, size: int, eps: float = 1e-5, *, affine: bool = True, bias: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size)) if affine else None
        self.bias = nn.Parameter(torch.zeros(size)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        if self.weight is None:
            return h
        h = self.weight * h
        return h + self.bias if self.bias is not None else h


def rope_inv_freq(rotary_dim: int, theta: float, device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim))


def rope_tables(positions: torch.Tensor, rotary_dim: int, theta: float):
    """positions [B or 1, L] (int) -> float32 cos, sin [B or 1, 1, L, rotary_dim]."""
    inv = rope_inv_freq(rotary_dim, theta, positions.device)
    ang = positions.float()[..., None] * inv  # one product per entry: the same bits as an outer product
    ang = torch.cat([ang, ang], dim=-1)[:, None]
    return ang.cos(), ang.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] dims of x (all of them unless partial),
    computed in the dtype of the operands (the caller casts)."""
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, keep = x[..., :d], x[..., d:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, keep], dim=-1)


def positions_for(keys: torch.Tensor) -> torch.Tensor:
    """RoPE positions [B, L] counted over the real tokens of a [B, L] key mask: a left-padded row
    sees the positions it has unpadded; padding gets position 1, as in Dream's sampler."""
    pos = keys.long().cumsum(-1) - 1
    return pos.masked_fill(~keys, 1)


def mask_and_positions(input_ids, attention_mask=None, attention_bias=None, position_ids=None, start: int = 0):
    """What our forwards take -> (SDPA mask, RoPE positions).

    attention_bias: a 4-D boolean or additive bias, used as is (MMaDA's convention);
    attention_mask: [B, L] (True = real token, hides padded keys) or a 4-D boolean mask;
    position_ids: [B, L], default 0..L-1.
    start: the absolute position of input_ids[:, 0] (a partial forward over cached keys/values,
        `KVCache`): default positions are start..start+L-1, and a 4-D mask over every position
        keeps only the rows of these queries; a [B, L_all] key mask is read as is.
    """
    if attention_bias is not None:
        mask = attention_bias
    elif attention_mask is None:
        mask = None
    elif attention_mask.dim() == 4:
        mask = attention_mask.bool()
    else:
        mask = attention_mask.bool()[:, None, None, :]
    L = input_ids.shape[1]
    if mask is not None and mask.dim() == 4 and mask.shape[-2] > L:  # rows of every query: keep ours
        mask = mask[:, :, start:start + L]
    if position_ids is None:
        position_ids = torch.arange(start, start + L, device=input_ids.device)[None]
    return mask, position_ids


class KVCache:
    """Every layer's keys and values at every position, for forwards that recompute a window only.

    A refresh (`start` None) is a full forward: each attention layer stores its keys and values
    (after RoPE, before any head repetition) and the model skips its vocabulary head. A partial
    forward (`start` = the absolute position of its first token) computes queries, keys and values
    for its own tokens only, writes those keys and values over the stored ones at their positions
    and attends over all of them: a token outside the window is seen with the keys and values of
    the last refresh (Fast-dLLM's approximate cache). With nothing changed outside the window
    since the refresh, a partial forward's outputs are those of a full forward.
    """

    def __init__(self):
        self.start: int | None = None
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def slot(self, i: int):
        """Layer i's exchange: (k, v) of this forward's tokens -> (k, v) the layer attends over."""

        def exchange(k: torch.Tensor, v: torch.Tensor):
            if self.start is None:
                self.layers[i] = (k, v)
                return k, v
            if i not in self.layers:
                raise RuntimeError("a partial forward needs a refresh first (KVCache.start = None)")
            ck, cv = self.layers[i]
            if ck.shape[0] != k.shape[0]:
                raise RuntimeError(f"cached batch {ck.shape[0]} != batch {k.shape[0]} of the partial forward")
            end = self.start + k.shape[2]
            ck[:, :, self.start:end] = k
            cv[:, :, self.start:end] = v
            return ck, cv

        return exchange

    @property
    def head(self) -> bool:
        """Whether this forward computes logits (a refresh only stores keys and values)."""
        return self.start is not None


def attend(q, k, v, mask):
    """Bidirectional SDPA; q [B, nh, L, hd], k/v [B, nkv, L, hd] repeated per query head
    (head j uses kv head j // (nh / nkv), as repeat_interleave and transformers' repeat_kv).
    mask: None, boolean (True = may attend) or additive, broadcastable to [B, nh, L, L]."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # an additive bias runs in the attention's dtype
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with Llama/OLMoE parameter names (LLaDA-MoE experts)."""

    def __init__(self, d: int, hidden: int, act: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.act = ACTIVATIONS[act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
