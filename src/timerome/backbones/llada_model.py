"""Our own small implementation of the LLaDA and LLaDA-MoE structures.

Two uses: the embedded default model (a ~1M-parameter LLaDA), and tiny random models for the
adapter tests. Module and weight names follow the public checkpoints
(`model.transformer.blocks.{i}.attn_out`, `model.layers.{i}.mlp.shared_expert`, ...), so a
real LLaDA checkpoint loads into `LLaDAModelLM` without remote code.

Attention is bidirectional: a mask only hides padding (2-D [B, L] or 4-D [B, 1, L, L] boolean,
True = may attend).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in float32 whatever the model dtype, as the reference implementations do
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).to(x.dtype)


def rope_tables(length: int, head_dim: int, theta: float, device, dtype):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)  # [L, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                               # [L, hd]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    # x: [B, nh, L, hd]; rotate-half convention (Llama / LLaDA)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attention_mask_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dim() == 2:  # [B, L] keys that exist -> [B, 1, 1, L]
        return mask.bool()[:, None, None, :]
    return mask.bool()


def sdpa(q, k, v, mask):
    # q: [B, nh, L, hd]; k, v: [B, nkv, L, hd]
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)


# ----------------------------------------------------------------------------------- LLaDA


class LLaDABlock(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d, nh, nkv = c["d_model"], c["n_heads"], c.get("n_kv_heads") or c["n_heads"]
        hd = d // nh
        bias = c.get("include_bias", False)
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.attn_norm = RMSNorm(d, c.get("rms_norm_eps", 1e-5))
        self.ff_norm = RMSNorm(d, c.get("rms_norm_eps", 1e-5))
        self.q_proj = nn.Linear(d, nh * hd, bias=bias)
        self.k_proj = nn.Linear(d, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(d, nkv * hd, bias=bias)
        self.attn_out = nn.Linear(nh * hd, d, bias=bias)
        self.ff_proj = nn.Linear(d, c["mlp_hidden_size"], bias=bias)
        self.up_proj = nn.Linear(d, c["mlp_hidden_size"], bias=bias)
        self.ff_out = nn.Linear(c["mlp_hidden_size"], d, bias=bias)

    def forward(self, x, mask, cos, sin):
        B, L, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(B, L, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, L, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, L, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = sdpa(q, k, v, mask).transpose(1, 2).reshape(B, L, -1)
        x = x + self.attn_out(a)
        h = self.ff_norm(x)
        x = x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))
        return x, None  # (hidden, cache) like the reference block


class LLaDAModel(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        vocab = c.get("embedding_size") or c["vocab_size"]
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, c["d_model"]),
                blocks=nn.ModuleList(LLaDABlock(c) for _ in range(c["n_layers"])),
                ln_f=RMSNorm(c["d_model"], c.get("rms_norm_eps", 1e-5)),
            )
        )
        if not c.get("weight_tying", False):
            self.transformer["ff_out"] = nn.Linear(c["d_model"], vocab, bias=False)


class LLaDAModelLM(nn.Module):
    """LLaDA structure: `model.transformer.{wte, blocks.{i}, ln_f, ff_out}`."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.cfg = dict(config)
        self.model = LLaDAModel(config)

    def forward(self, input_ids, attention_mask=None, attention_bias=None, **_):
        t = self.model.transformer
        x = t.wte(input_ids)
        L = input_ids.shape[1]
        c = self.cfg
        cos, sin = rope_tables(L, c["d_model"] // c["n_heads"], c.get("rope_theta", 10000.0), x.device, x.dtype)
        mask = attention_mask_4d(attention_bias if attention_bias is not None else attention_mask)
        for blk in t.blocks:
            x, _ = blk(x, mask, cos, sin)
        x = t.ln_f(x)
        head = t["ff_out"] if "ff_out" in t else None
        logits = head(x) if head is not None else x @ t.wte.weight.T
        return SimpleNamespace(logits=logits)


# ------------------------------------------------------------------------------- LLaDA-MoE


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """Top-k routed experts plus an always-on shared expert, summed: the "mlp" hook point."""

    def __init__(self, c: dict):
        super().__init__()
        d = c["hidden_size"]
        self.top_k = c.get("num_experts_per_tok", 2)
        self.gate = nn.Linear(d, c["num_experts"], bias=False)
        self.experts = nn.ModuleList(SwiGLU(d, c["expert_intermediate_size"]) for _ in range(c["num_experts"]))
        self.shared_expert = SwiGLU(d, c["shared_expert_intermediate_size"])

    def forward(self, x):
        B, L, d = x.shape
        flat = x.reshape(-1, d)
        w = self.gate(flat).float().softmax(-1)
        top_w, top_i = w.topk(self.top_k, dim=-1)  # [N, k]
        top_w = (top_w / top_w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (top_i == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * top_w[rows, slot, None])
        return (out + self.shared_expert(flat)).view(B, L, d)


class MoEAttention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d, nh = c["hidden_size"], c["num_attention_heads"]
        nkv = c.get("num_key_value_heads") or nh
        self.nh, self.nkv, self.hd = nh, nkv, d // nh
        self.q_proj = nn.Linear(d, nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(nh * self.hd, d, bias=False)

    def forward(self, x, mask, cos, sin):
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = sdpa(q, k, v, mask).transpose(1, 2).reshape(B, L, -1)
        return self.o_proj(a), None  # (output, attention weights) like transformers' attention


class MoELayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        eps = c.get("rms_norm_eps", 1e-5)
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = MoEAttention(c)
        self.mlp = SparseMoE(c)

    def forward(self, x, mask, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin)[0]
        return (x + self.mlp(self.post_attention_layernorm(x)),)


class MoEModel(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(MoELayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c.get("rms_norm_eps", 1e-5))


class LLaDAMoEModelLM(nn.Module):
    """LLaDA-MoE structure: `model.{embed_tokens, layers.{i}.{self_attn, mlp}, norm}`, `lm_head`."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.cfg = dict(config)
        self.model = MoEModel(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids, attention_mask=None, attention_bias=None, **_):
        c = self.cfg
        x = self.model.embed_tokens(input_ids)
        nh = c["num_attention_heads"]
        cos, sin = rope_tables(input_ids.shape[1], c["hidden_size"] // nh, c.get("rope_theta", 10000.0), x.device, x.dtype)
        mask = attention_mask_4d(attention_bias if attention_bias is not None else attention_mask)
        for layer in self.model.layers:
            x = layer(x, mask, cos, sin)[0]
        return SimpleNamespace(logits=self.lm_head(self.model.norm(x)))


# ------------------------------------------------------------------------------ build / IO

MODEL_CLASSES = {"llada": LLaDAModelLM, "timerome-llada": LLaDAModelLM, "mmada": LLaDAModelLM,
                 "lladamoe": LLaDAMoEModelLM, "llada_moe": LLaDAMoEModelLM}


def build_model(config: dict, seed: int | None = 0, init_std: float = 0.02) -> nn.Module:
    """A randomly initialised model of the config's structure (seeded, so tests are exact)."""
    cls = MODEL_CLASSES[config["model_type"]]
    gen = torch.Generator().manual_seed(seed or 0)
    model = cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_f." in name or "layernorm" in name:
                continue
            std = init_std / math.sqrt(2 * _n_layers(config)) if name.endswith(("attn_out.weight", "ff_out.weight", "o_proj.weight", "down_proj.weight")) and "transformer.ff_out" not in name else init_std
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def _n_layers(c: dict) -> int:
    return c.get("n_layers") or c.get("num_hidden_layers") or 1


def save_model(model: nn.Module, directory: str | Path) -> None:
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.cfg, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
