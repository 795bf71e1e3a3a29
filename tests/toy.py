"""A tiny bidirectional transformer with seeded random weights, the stand-in backbone of the sampler
and likelihood tests: argmax depends on context, and `attention_mask` hides padding keys."""

import math

import torch
import torch.nn.functional as F

VOCAB, MASK = 50, 49


class ToyBackbone:
    """`forwards` logs (rows, length, padded?) per forward; `calls` logs (rows, state.step or None)
    when a sampler `state` is attached. `never_predict_mask` makes it behave like a trained MDLM."""

    def __init__(self, d=32, n_layers=2, n_heads=4, max_length=64, seed=0, never_predict_mask=False):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale
        self.tok, self.pos = r(VOCAB, d), r(max_length, d)
        self.layers = [dict(qkv=r(d, 3 * d, scale=2 * d ** -0.5), o=r(d, d, scale=2 * d ** -0.5),
                            w1=r(d, 4 * d, scale=d ** -0.5), w2=r(4 * d, d, scale=(4 * d) ** -0.5))
                       for _ in range(n_layers)]
        self.head = r(d, VOCAB, scale=3 * d ** -0.5)
        self.n_heads, self.mask_id, self.vocab_size, self.max_length = n_heads, MASK, VOCAB, max_length
        self.device = torch.device("cpu")
        self.never_predict_mask = never_predict_mask
        self.forwards, self.calls, self.state = [], [], None

    def logits(self, ids, attention_mask=None):
        B, L = ids.shape
        self.forwards.append((B, L, attention_mask is not None and not bool(attention_mask.all())))
        self.calls.append((B, None if self.state is None else self.state.step))
        h = self.tok[ids] + self.pos[:L]
        for w in self.layers:
            q, k, v = (F.layer_norm(h, h.shape[-1:]) @ w["qkv"]).chunk(3, dim=-1)
            q, k, v = (t.view(B, L, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
            att = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, L, L], no causal mask
            if attention_mask is not None:
                att = att.masked_fill(~attention_mask[:, None, None, :].bool(), -torch.inf)
            h = h + (att.softmax(-1) @ v).transpose(1, 2).reshape(B, L, -1) @ w["o"]
            h = h + F.gelu(F.layer_norm(h, h.shape[-1:]) @ w["w1"]) @ w["w2"]
        out = F.layer_norm(h, h.shape[-1:]) @ self.head
        if self.never_predict_mask:
            out[..., MASK] = -1e4
        return out
