"""The one model interface every algorithm uses."""

from __future__ import annotations

import hashlib
import json

import torch
from torch import nn

from timerome.backbones.families import HOOK_POINTS, Family
from timerome.errors import TimeromeError

POINTS = HOOK_POINTS + ("embed",)


class Backbone:
    """A masked diffusion LM seen through its family's module-path table.

    `logits` is always aligned (logits[:, i] predicts token i) and always bidirectional;
    `module(layer, point)` resolves a hook point to the module whose output it is.
    """

    def __init__(self, model: nn.Module, tokenizer, family: Family, config: dict, *,
                 mask_id: int, name: str = ""):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.family = family
        self.config = config
        self.mask_id = int(mask_id)
        self.name = name or family.name
        self.n_layers = int(_first(config, family.n_layers_keys, "number of layers"))
        self.hidden_size = int(_first(config, family.hidden_keys, "hidden size"))
        self.max_length = int(_first(config, family.context_keys, "context length"))
        self.vocab_size = int(config.get("embedding_size") or config["vocab_size"])
        self._paths = {"resid": family.block, "attn": family.attn, "mlp": family.mlp}
        self._modules = dict(model.named_modules())
        for layer in (0, self.n_layers - 1):  # fail at load time, not mid-trace
            for point in POINTS:
                self.module(layer, point)

    # ---------------------------------------------------------------- device / dtype
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---------------------------------------------------------------- text
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode([i for i in ids if i != self.mask_id], skip_special_tokens=True)

    # ---------------------------------------------------------------- forward
    def logits(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, L] -> logits [B, L, V], position i predicting token i."""
        if ids.dim() != 2:
            raise TimeromeError(f"ids must be [batch, length], got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.max_length:
            raise TimeromeError(f"sequence of {ids.shape[1]} tokens exceeds the model's context of {self.max_length}")
        kwargs = {}
        if self.family.attention == "bias4d":
            B, L = ids.shape
            keys = attention_mask.bool() if attention_mask is not None else torch.ones(B, L, dtype=torch.bool, device=ids.device)
            kwargs["attention_mask"] = keys[:, None, None, :].expand(B, 1, L, L)  # bidirectional
        elif attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.model(input_ids=ids, **kwargs).logits
        if self.family.logit_shift:
            # Dream/DiffuLLaMA: output j-1 predicts token j
            out = torch.cat([out[:, :1], out[:, :-1]], dim=1)
        return out

    # ---------------------------------------------------------------- hook points
    def module_path(self, layer: int | None, point: str) -> str:
        if point == "embed":
            return self.family.embed
        if point not in self._paths:
            raise TimeromeError(f"unknown hook point {point!r}; hook points are {', '.join(POINTS)}")
        if layer is None or not (-self.n_layers <= layer < self.n_layers):
            raise TimeromeError(f"layer {layer} out of range: the model has {self.n_layers} layers")
        return self._paths[point].format(i=layer % self.n_layers)

    def module(self, layer: int | None, point: str) -> nn.Module:
        path = self.module_path(layer, point)
        try:
            return self._modules[path]
        except KeyError:
            raise TimeromeError(
                f"hook point {point!r} of layer {layer} maps to module {path!r}, which the "
                f"{self.family.name} model does not have"
            ) from None

    def embedding(self) -> nn.Module:
        return self.module(None, "embed")

    # ---------------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """Stable id of the weights: edit memories and caches refuse another model.

        Every parameter contributes its name, shape and a strided sample of its values, so an
        edit or a fine-tune of any layer changes the id (a rank-one or LoRA update touches most
        entries of its matrix), while the cost stays a few small reads per tensor.
        """
        h = hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode())
        with torch.no_grad():
            for name, p in sorted(self.model.named_parameters(), key=lambda t: t[0]):
                flat = p.detach().reshape(-1)
                stride = max(1, flat.numel() // _SAMPLE)
                h.update(f"{name}{tuple(p.shape)}".encode())
                h.update(flat[::stride][:_SAMPLE].float().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"Backbone({self.name!r}, family={self.family.name}, layers={self.n_layers}, "
                f"hidden={self.hidden_size}, mask_id={self.mask_id})")


_SAMPLE = 512  # values hashed per parameter tensor


def _first(config: dict, keys, what: str):
    for k in keys:
        if config.get(k):
            return config[k]
    raise TimeromeError(f"config.json gives no {what} (looked for {', '.join(keys)})")
