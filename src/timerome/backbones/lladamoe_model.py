"""Our own implementation of the LLaDA-MoE structure (inclusionAI/LLaDA-MoE-7B-A1B).

Names are the release's: `model.embed_tokens`, `model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
self_attn.{q,k}_norm, post_attention_layernorm, mlp.gate, mlp.experts.{e}.{gate,up,down}_proj}`,
`model.layers.{i}.shared_expert.*` (a sibling of `mlp`, fed the same normed input), `model.norm`,
`lm_head`. One parameterless module is ours: `model.layers.{i}.mlp_sum`, an identity applied to
routed + shared, so the "mlp" hook point (what the layer adds to the residual stream) is a module.

Semantics of the official code, all pinned by the golden fixture: q/k RMSNorm per head over
head_dim before RoPE; routing softmax over all experts in float32, optional expert bias added to
those weights, top-k, NO renormalisation (the official block hard-codes it off), weights cast to
the activations' dtype, experts summed in expert order with index_add_; RoPE tables cast to the
model dtype and applied there; `moe_layer_freq[i] == 0` gives layer i a dense MLP and no shared expert.
`kv_cache` works as in our LLaDA implementation (`layers.KVCache`).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from timerome.backbones.layers import GatedMLP, KVCache, RMSNorm, apply_rope, attend, mask_and_positions, rope_tables


def moe_settings(config: dict) -> SimpleNamespace:
    c = dict(num_key_value_heads=None, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0,
             partial_rotary_factor=1.0, attention_bias=False, clip_qkv=None, qk_layernorm=False,
             moe_layer_freq=None, moe_router_enable_expert_bias=False, shared_expert_intermediate_size=None,
             dense_intermediate_size=None, tie_word_embeddings=False, num_experts_per_tok=2)
    c.update({k: v for k, v in config.items() if v is not None or k not in c})
    nh = c["num_attention_heads"]
    c["num_key_value_heads"] = c["num_key_value_heads"] or nh
    c["head_dim"] = c["hidden_size"] // nh
    c["rotary_dim"] = int(c["head_dim"] * c["partial_rotary_factor"])
    n = c["num_hidden_layers"]
    c["moe_layers"] = [bool(f) for f in c["moe_layer_freq"]] if c["moe_layer_freq"] else [True] * n
    return SimpleNamespace(**c)


class SparseMoE(nn.Module):
    """Top-k routed experts (the official `mlp` module): the "mlp_routed" hook point."""

    def __init__(self, s: SimpleNamespace):
        super().__init__()
        self.top_k = s.num_experts_per_tok
        self.gate = nn.Linear(s.hidden_size, s.num_experts, bias=False)
        self.experts = nn.ModuleList(GatedMLP(s.hidden_size, s.expert_intermediate_size, s.hidden_act)
                                     for _ in range(s.num_experts))
        if s.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(s.num_experts))
        else:
            self.expert_bias = None

    def forward(self, x):
        B, L, d = x.shape
        flat = x.reshape(-1, d)
        weights = F.softmax(self.gate(flat), dim=1, dtype=torch.float32)
        if self.expert_bias is not None:
            weights = weights + self.expert_bias
        top_w, top_i = weights.topk(self.top_k, dim=-1)  # [N, k]; no renormalisation, as the official block
        top_w = top_w.to(x.dtype)
        out = torch.zeros_like(flat)
        chosen = top_i.t()  # [k, N]: tokens of one expert come slot by slot, as the official loop takes them
        for e, expert in enumerate(self.experts):
            slot, tok = (chosen == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, (expert(flat[tok]) * top_w[tok, slot, None]).to(x.dtype))
        return out.view(B, L, d)


class MoEAttention(nn.Module):
    def __init__(self, s: SimpleNamespace):
        super().__init__()
        d, nh, nkv, hd = s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.head_dim
        self.nh, self.nkv, self.hd, self.clip = nh, nkv, hd, s.clip_qkv
        self.q_proj = nn.Linear(d, nh * hd, bias=s.attention_bias)
        self.k_proj = nn.Linear(d, nkv * hd, bias=s.attention_bias)
        self.v_proj = nn.Linear(d, nkv * hd, bias=s.attention_bias)
        self.o_proj = nn.Linear(nh * hd, d, bias=s.attention_bias)
        if s.qk_layernorm:
            self.q_norm = RMSNorm(hd, s.rms_norm_eps)
            self.k_norm = RMSNorm(hd, s.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, mask, cos, sin, kv=None):
        B, L, _ = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        if self.q_norm is not None:  # per head, over head_dim
            q = self.q_norm(q.reshape(-1, self.hd)).reshape(B, L, -1)
            k = self.k_norm(k.reshape(-1, self.hd)).reshape(B, L, -1)
        v = self.v_proj(x)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = q.view(B, L, self.nh, self.hd).transpose(1, 2)
        k = k.view(B, L, self.nkv, self.hd).transpose(1, 2)
        v = v.view(B, L, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:  # KVCache.slot
            k, v = kv(k, v)
        a = attend(q, k, v, mask).transpose(1, 2).reshape(B, L, -1)
        return self.o_proj(a), None  # (output, attention weights) like transformers' attention


class MoELayer(nn.Module):
    def __init__(self, s: SimpleNamespace, i: int):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = MoEAttention(s)
        if s.moe_layers[i]:
            self.mlp = SparseMoE(s)
            if s.shared_expert_intermediate_size is not None:
                self.shared_expert = GatedMLP(s.hidden_size, s.shared_expert_intermediate_size, s.hidden_act)
        else:
            self.mlp = GatedMLP(s.hidden_size, s.dense_intermediate_size, s.hidden_act)
        self.mlp_sum = nn.Identity()  # no parameters: gives "routed + shared" a module to hook

    def forward(self, x, mask, cos, sin, kv=None):
        x = x + self.self_attn(self.input_layernorm(x), mask, cos, sin, kv)[0]
        h = self.post_attention_layernorm(x)
        m = self.mlp(h)
        if hasattr(self, "shared_expert"):
            m = m + self.shared_expert(h)
        return (x + self.mlp_sum(m),)


class MoEModel(nn.Module):
    def __init__(self, s: SimpleNamespace):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(MoELayer(s, i) for i in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)


class LLaDAMoEModelLM(nn.Module):
    """LLaDA-MoE structure: `model.{embed_tokens, layers.{i}, norm}`, `lm_head` (tied when the config says so)."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = SimpleNamespace(**config)
        self.cfg = dict(config)
        self.settings = s = moe_settings(config)
        self.model = MoEModel(s)
        if not s.tie_word_embeddings:
            self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, attention_bias=None, position_ids=None,
                kv_cache: KVCache | None = None, **_):
        s = self.settings
        x = self.model.embed_tokens(input_ids)
        start = (kv_cache.start or 0) if kv_cache is not None else 0
        mask, positions = mask_and_positions(input_ids, attention_mask, attention_bias, position_ids, start)
        cos, sin = rope_tables(positions, s.rotary_dim, s.rope_theta)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # the official tables are cast to the model dtype
        for i, layer in enumerate(self.model.layers):
            x = layer(x, mask, cos, sin, None if kv_cache is None else kv_cache.slot(i))[0]
        if kv_cache is not None and not kv_cache.head:
            return SimpleNamespace(logits=None)
        x = self.model.norm(x)
        logits = self.lm_head(x) if hasattr(self, "lm_head") else F.linear(x, self.model.embed_tokens.weight)
        return SimpleNamespace(logits=logits)
