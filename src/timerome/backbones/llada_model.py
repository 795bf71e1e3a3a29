"""Our own implementation of the LLaDA structure (LLaDA-8B, MMaDA-8B and the embedded model).

Module and weight names are the release's (`model.transformer.wte`, `...blocks.{i}.attn_out`,
`...ff_out`), so a released checkpoint loads without remote code. Every config key the official
`modeling_llada.py` reads is either implemented here (`input_emb_norm`, `scale_logits`,
`weight_tying`, `attention_layer_norm`, `rope_full_precision`, biases, GQA/MQA, activation) or
refused by `timerome.backbones.flags` before the model is built. Absent keys take the official
`ModelConfig` defaults; our own `timerome-llada` configs take `TIMEROME_DEFAULTS`.

Dtypes follow the official code: norms normalise in float32 and scale in the model dtype; RoPE
runs in float32 when `rope_full_precision` (the default) and is cast back; residual adds,
projections and the logit scaling run in the model dtype.

Attention is bidirectional; a 2-D `attention_mask` [B, L] (True = real token) hides padded keys,
a 4-D boolean or additive `attention_bias` is passed to SDPA as is (MMaDA's convention), and
`position_ids` [B, L] set RoPE positions (default 0..L-1). `kv_cache` (a `layers.KVCache`) makes a
forward a refresh (store every layer's keys and values, no logits) or a partial forward over the
cached keys and values of the other positions; without it nothing changes, to the bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from timerome.backbones.layers import ACTIVATIONS, KVCache, RMSNorm, apply_rope, attend, mask_and_positions, rope_tables
from timerome.backbones.lladamoe_model import LLaDAMoEModelLM
from timerome.errors import TimeromeError

# official modeling_llada ModelConfig defaults, for keys a config leaves out
OFFICIAL_DEFAULTS = dict(
    n_kv_heads=None, mlp_ratio=4, mlp_hidden_size=None, activation_type="swiglu", block_type="sequential",
    block_group_size=1, alibi=False, rope=False, rope_full_precision=True, multi_query_attention=None,
    attention_layer_norm=False, attention_layer_norm_with_affine=True, input_emb_norm=False,
    layer_norm_type="default", layer_norm_with_affine=True, rms_norm_eps=1e-5, rope_theta=10000.0,
    include_qkv_bias=False, include_bias=False, bias_for_layer_norm=None, scale_logits=False,
    vocab_size=50257, embedding_size=50304, weight_tying=True, max_sequence_length=1024,
)
# our own configs (the embedded model, tiny test models) are written without the structural keys
TIMEROME_DEFAULTS = dict(OFFICIAL_DEFAULTS, activation_type="silu", block_type="llama", rope=True,
                         layer_norm_type="rms", weight_tying=False, embedding_size=None)


def llada_settings(config: dict) -> SimpleNamespace:
    """Every field the forward needs, with the defaults of the config's origin filled in."""
    defaults = TIMEROME_DEFAULTS if config.get("model_type") == "timerome-llada" else OFFICIAL_DEFAULTS
    c = {**defaults, **config}  # an explicit null overrides the default, as in the official LLaDAConfig
    nh = c["n_heads"]
    if c["n_kv_heads"] is None:
        nkv = 1 if c["multi_query_attention"] is True else nh
    else:
        nkv = c["n_kv_heads"]
        if c["multi_query_attention"] is not None and nkv != (1 if c["multi_query_attention"] else nh):
            raise TimeromeError(f"n_kv_heads={nkv} contradicts multi_query_attention={c['multi_query_attention']}")
    c["effective_n_kv_heads"] = nkv
    c["head_dim"] = c["d_model"] // nh
    # mlp_ratio * d_model, a whole number (flags.check_values refuses one that is not) even from a float ratio
    c["ff_hidden"] = c["mlp_hidden_size"] if c["mlp_hidden_size"] is not None else int(c["mlp_ratio"] * c["d_model"])
    c["vocab"] = c["embedding_size"] or c["vocab_size"]
    norm_bias = c["bias_for_layer_norm"] if c["bias_for_layer_norm"] is not None else c["include_bias"]
    c["norm_bias"] = bool(norm_bias)
    c["qkv_bias"] = bool(c["include_bias"] or c["include_qkv_bias"])
    return SimpleNamespace(**c)


class LLaDABlock(nn.Module):
    """LLaDA's "llama" block: x + attn_out(attn(attn_norm(x))), then + ff_out(act(ff_proj(h)) * up_proj(h))."""

    def __init__(self, c):
        super().__init__()
        if isinstance(c, dict):
            c = llada_settings(c)
        d, nh, nkv, hd = c.d_model, c.n_heads, c.effective_n_kv_heads, c.head_dim
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.rope_theta, self.rope_fp32 = c.rope_theta, bool(c.rope_full_precision)
        self.act = ACTIVATIONS[c.activation_type]
        norm = dict(eps=c.rms_norm_eps, affine=c.layer_norm_with_affine, bias=c.norm_bias)
        # registration order is the parameter order build_model draws in: keep it
        self.attn_norm = RMSNorm(d, **norm)
        self.ff_norm = RMSNorm(d, **norm)
        self.q_proj = nn.Linear(d, nh * hd, bias=c.qkv_bias)
        self.k_proj = nn.Linear(d, nkv * hd, bias=c.qkv_bias)
        self.v_proj = nn.Linear(d, nkv * hd, bias=c.qkv_bias)
        self.attn_out = nn.Linear(nh * hd, d, bias=c.include_bias)
        self.ff_proj = nn.Linear(d, c.ff_hidden, bias=c.include_bias)
        self.up_proj = nn.Linear(d, c.ff_hidden, bias=c.include_bias)
        self.ff_out = nn.Linear(c.ff_hidden, d, bias=c.include_bias)
        if c.attention_layer_norm:  # over the whole q (d_model) and the whole k (kv width), before heads
            qk = dict(norm, affine=c.attention_layer_norm_with_affine)
            self.q_norm = RMSNorm(d, **qk)
            self.k_norm = RMSNorm(nkv * hd, **qk)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, mask, cos, sin, kv=None):
        B, L, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        if self.q_norm is not None:
            dt = k.dtype
            q, k = self.q_norm(q).to(dt), self.k_norm(k).to(dt)
        q = q.view(B, L, self.nh, self.hd).transpose(1, 2)
        k = k.view(B, L, self.nkv, self.hd).transpose(1, 2)
        v = v.view(B, L, self.nkv, self.hd).transpose(1, 2)
        if self.rope_fp32:
            q, k = apply_rope(q.float(), cos, sin).to(q.dtype), apply_rope(k.float(), cos, sin).to(k.dtype)
        else:
            q, k = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))
        if kv is not None:  # KVCache.slot: store, or attend over the cached keys/values as well
            k, v = kv(k, v)
        a = attend(q, k, v, mask).transpose(1, 2).reshape(B, L, -1)
        x = x + self.attn_out(a)
        h = self.ff_norm(x)
        x = x + self.ff_out(self.act(self.ff_proj(h)) * self.up_proj(h))
        return x, None  # (hidden, cache) like the official block


class LLaDAModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        if isinstance(c, dict):
            c = llada_settings(c)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(c.vocab, c.d_model),
                blocks=nn.ModuleList(LLaDABlock(c) for _ in range(c.n_layers)),
                ln_f=RMSNorm(c.d_model, c.rms_norm_eps, affine=c.layer_norm_with_affine, bias=c.norm_bias),
            )
        )
        if not c.weight_tying:
            self.transformer["ff_out"] = nn.Linear(c.d_model, c.vocab, bias=c.include_bias)


class LLaDAModelLM(nn.Module):
    """LLaDA structure: `model.transformer.{wte, blocks.{i}, ln_f, ff_out}`."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.cfg = dict(config)
        self.settings = llada_settings(config)
        self.model = LLaDAModel(self.settings)

    def forward(self, input_ids, attention_mask=None, attention_bias=None, position_ids=None,
                kv_cache: KVCache | None = None, **_):
        s = self.settings
        t = self.model.transformer
        x = t.wte(input_ids)
        if s.input_emb_norm:
            x = x * (s.d_model ** 0.5)
        start = (kv_cache.start or 0) if kv_cache is not None else 0
        mask, positions = mask_and_positions(input_ids, attention_mask, attention_bias, position_ids, start)
        cos, sin = rope_tables(positions, s.head_dim, s.rope_theta)
        for i, blk in enumerate(t.blocks):
            x, _ = blk(x, mask, cos, sin, None if kv_cache is None else kv_cache.slot(i))
        if kv_cache is not None and not kv_cache.head:
            return SimpleNamespace(logits=None)
        x = t.ln_f(x)
        logits = t["ff_out"](x) if "ff_out" in t else F.linear(x, t.wte.weight)
        if s.scale_logits:
            logits = logits * (1 / math.sqrt(s.d_model))
        return SimpleNamespace(logits=logits)


# ------------------------------------------------------------------------------ build / IO

MODEL_CLASSES = {"llada": LLaDAModelLM, "timerome-llada": LLaDAModelLM, "mmada": LLaDAModelLM,
                 "lladamoe": LLaDAMoEModelLM, "llada_moe": LLaDAMoEModelLM}


def model_class(config: dict):
    """Our class for a config. LLaDA-MoE releases say model_type "llada" too: the keys decide
    (LLaDA's own keys are d_model / n_layers, the MoE's hidden_size / num_hidden_layers)."""
    if "d_model" in config:
        return LLaDAModelLM
    if "num_experts" in config or "hidden_size" in config:
        return LLaDAMoEModelLM
    return MODEL_CLASSES[config.get("model_type", "llada")]


def build_model(config: dict, seed: int | None = 0, init_std: float = 0.02) -> nn.Module:
    """A randomly initialised model of the config's structure (seeded, so tests are exact)."""
    cls = model_class(config)
    gen = torch.Generator().manual_seed(seed or 0)
    model = cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")) or ".ln_f." in name or "layernorm" in name:
                continue
            std = init_std / math.sqrt(2 * _n_layers(config)) if name.endswith(("attn_out.weight", "ff_out.weight", "o_proj.weight", "down_proj.weight")) and "transformer.ff_out" not in name else init_std
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def _n_layers(c: dict) -> int:
    return c.get("n_layers") or c.get("num_hidden_layers") or 1


def save_model(model: nn.Module, directory: str | Path) -> None:
    from timerome.common.cache import save_tensors

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.cfg, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_tensors(d / "model.safetensors", state, metadata={"format": "pt"})
