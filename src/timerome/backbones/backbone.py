"""The one model interface every algorithm uses."""

from __future__ import annotations

import hashlib
import json
import numbers

import torch
from torch import nn

from timerome.backbones.families import HOOK_POINTS, Family
from timerome.backbones.layers import KVCache, positions_for
from timerome.backbones.tokenizer import start_ids
from timerome.errors import TimeromeError

POINTS = HOOK_POINTS + ("embed",)


class Backbone:
    """A masked diffusion LM (or, for a causal family, an autoregressive LM) seen through its
    family's module-path table.

    `logits` is always aligned: logits[:, i] predicts token i. For an MDLM the forward is
    bidirectional and position i predicts token i when it is masked; for a causal family (`causal`)
    the forward is causal and logits[:, i] is the model's output at i - 1, its prediction of token
    i from tokens 0..i-1 (logits[:, 0] has no predictor: a copy of the output at 0, never read), so
    every caller reads "the prediction of token i" at i whatever the family, and a placeholder
    (the mask id) at i is never read for it. `next_logits` gives the prediction of the token after
    the input. A padding mask goes where the running implementation expects it (ours, a
    transformers class, or the checkpoint's own code). `module(layer, point)` resolves a hook point to the module
    whose output it is; `points` lists the points this model has (the paper's three, "embed",
    and family extras such as LLaDA-MoE's "mlp_routed" / "mlp_shared").
    """

    def __init__(self, model: nn.Module, tokenizer, family: Family, config: dict, *,
                 mask_id: int, name: str = "", remote: bool = False, info: dict | None = None, embedded: bool = False):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.family = family
        self.config = config
        self.mask_id = int(mask_id)
        self.name = name or family.name
        self.remote = remote  # the checkpoint's own modelling code runs (trust_remote_code=True)
        # the embedded default model (load_backbone of its own folder, not any folder of that name): its corpus stands
        # in for the background, calibration and probe rows another model must be given
        self.embedded = embedded
        self.info = dict(info or {})
        self.n_layers = int(_first(config, family.n_layers_keys, "number of layers"))
        self.hidden_size = int(_first(config, family.hidden_keys, "hidden size"))
        self.max_length = int(_first(config, family.context_keys, "context length"))
        self.vocab_size = int(config.get("embedding_size") or config["vocab_size"])
        self._paths = family.points()
        self._modules = dict(model.named_modules())
        if remote:
            self._remote_paths()
        self.points = ("embed",) + tuple(p for p in self._paths if self._has(p))
        for layer in (0, self.n_layers - 1):  # fail at load time, not mid-trace
            for point in POINTS:
                self.module(layer, point)
        self._padding_problem = None  # why padded batches are refused (the checkpoint's own code only)
        self._fingerprint: tuple | None = None  # (weights state, fingerprint) once computed
        self.held_positions: torch.Tensor | None = None  # absolute positions of a partial forward in flight
        self.answer_starts: torch.Tensor | int | None = None  # where each row's answer begins (hooks.answer_region)
        self.open_hooks: list = []  # the hooks.Hooks blocks open on it (a trajectory sets their step)
        self.engine_checks: dict = {}  # answers of the trace engine's checks of this model (tracing.wavefront.checked)
        self._prompt_start: list[int] | None = None  # read from the tokenizer on first use
        if remote:
            self._padding_problem = self._probe_remote_padding()

    # ---------------------------------------------------------------- device / dtype
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---------------------------------------------------------------- text
    def encode(self, text: str) -> list[int]:
        """`text` as a fragment, without special tokens (a prompt begins with `prompt_start`: `encode_prompt`)."""
        if not isinstance(text, str):
            raise TimeromeError(f"encode takes a string, got {type(text).__name__}")
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def prompt_start(self) -> list[int]:
        """The ids a sequence begins with, as the tokenizer puts them before a text (DiffuLLaMA's and
        Llama-2's `<s>`; none for LLaDA, Dream, MMaDA, LLaDA-MoE and the embedded model), as the official
        pipelines feed them. A prompt begins with them (`encode_prompt`); an answer or other fragment
        (`encode`) never does."""
        if self._prompt_start is None:
            self._prompt_start = start_ids(self.tokenizer)
        return list(self._prompt_start)

    def cache_id(self) -> str:
        """The model as the caches of what it computes name it (traces, states, experiment cells): its weights'
        fingerprint, and the sequence start its prompts begin with where there is one, so that results read
        before prompts began with it are never mixed with new ones (the same as the fingerprint otherwise)."""
        start = self.prompt_start
        return self.fingerprint() + (f"+start{'-'.join(map(str, start))}" if start else "")

    def encode_prompt(self, text: str) -> list[int]:
        """`text` as the start of a sequence: `prompt_start`, then `encode(text)`."""
        return self.prompt_start + self.encode(text)

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist() if ids.dim() <= 1 or ids.shape[0] == 1 else ids.tolist()
        ids = [ids] if isinstance(ids, numbers.Integral) else list(ids)
        bad = [i for i in ids if not isinstance(i, numbers.Integral) or isinstance(i, bool) or not 0 <= i < self.vocab_size]
        if bad:
            raise TimeromeError(f"decode takes token ids in 0..{self.vocab_size - 1}, got {bad[0]!r}"
                                + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
        return self.tokenizer.decode([i for i in ids if i != self.mask_id], skip_special_tokens=True)

    # ---------------------------------------------------------------- forward
    def logits(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, L] -> logits [B, L, V], position i predicting token i.

        attention_mask [B, L] (True / 1 = real token) hides padding; what the real positions
        see does not depend on how much padding a row has.
        """
        keys = self._keys(ids, attention_mask)
        out = self.model(input_ids=ids, **self.forward_kwargs(ids, keys)).logits
        if self.family.logit_shift:
            # Dream/DiffuLLaMA and causal LMs: output j-1 predicts token j
            out = torch.cat([out[:, :1], out[:, :-1]], dim=1)
        return out

    @property
    def causal(self) -> bool:
        """An autoregressive model (causal attention, next-token likelihood, greedy decoding)."""
        return self.family.causal

    def next_logits(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """ids [B, L] -> logits [B, V] of the token after the last one (a causal family only: an MDLM
        predicts masked positions, not a next token). The vocabulary head runs on that position only
        where the implementation allows it (transformers' `logits_to_keep`)."""
        if not self.family.causal:
            raise TimeromeError(f"next-token logits need an autoregressive model; the {self.family.name} family is "
                                "a masked diffusion LM (read logits() at a masked position instead)")
        keys = self._keys(ids, attention_mask)
        kwargs = self.forward_kwargs(ids, keys)
        keep = self._keep_argument()
        if keep:
            kwargs[keep] = 1
        return self.model(input_ids=ids, **kwargs).logits[:, -1]

    def _keep_argument(self) -> str | None:
        """The forward's argument that limits the head to the last positions (transformers >= 4.50:
        logits_to_keep; 4.45-4.49: num_logits_to_keep; None: the head runs everywhere)."""
        if not hasattr(self, "_keep_arg"):
            import inspect

            params = inspect.signature(self.model.forward).parameters
            self._keep_arg = next((a for a in ("logits_to_keep", "num_logits_to_keep") if a in params), None)
        return self._keep_arg

    def _keys(self, ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The [B, L] real-token mask of a padded batch (None: no padding), after the shape checks."""
        if ids.dim() != 2:
            raise TimeromeError(f"ids must be [batch, length], got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.max_length:
            raise TimeromeError(f"sequence of {ids.shape[1]} tokens exceeds the model's context of {self.max_length}")
        if attention_mask is None:
            return None
        if tuple(attention_mask.shape) != tuple(ids.shape):
            raise TimeromeError(f"attention_mask must have the shape of ids {tuple(ids.shape)}, "
                                f"got {tuple(attention_mask.shape)}")
        am = attention_mask.to(ids.device).bool()
        return None if bool(am.all()) else am

    # ---------------------------------------------------------------- cached forwards (sampler.py's cache=)
    def kv_cache(self) -> KVCache:
        """An empty key/value cache for `refresh` and `window_logits`: timerome's own implementations
        only (LLaDA, MMaDA, LLaDA-MoE, the embedded model); other families are refused in one line."""
        fam = self.family
        without = "leave the cache out (cache=None; on the command line, no --cache)"  # the API, lm-eval, the CLI
        if self.remote:
            raise TimeromeError(f"the KV cache needs timerome's implementation of {fam.name}, not the checkpoint's "
                                f"own code: load without trust_remote_code (--trust-remote-code), or {without}")
        if getattr(self, "causal", False):  # the reason is the model's kind, not its class's cache
            raise TimeromeError(f"the block-wise KV cache is a masked diffusion sampler's (Fast-dLLM's); the {fam.name} "
                                f"model is autoregressive, which writes one token per forward anyway: {without}")
        if fam.loader != "timerome":
            raise TimeromeError(f"the KV cache is not supported for the {fam.name} family (transformers' "
                                f"{fam.hf_class} class caches by appending only): {without}")
        return KVCache()

    def refresh(self, ids: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None = None) -> None:
        """A full forward over ids [B, L] that stores every layer's keys and values in `cache`; the
        vocabulary head is skipped (hooks on every hook point fire as in `logits`)."""
        keys = self._keys(ids, attention_mask)
        cache.start = None
        self.model(input_ids=ids, kv_cache=cache, **self.forward_kwargs(ids, keys))

    def window_logits(self, ids: torch.Tensor, cache: KVCache, start: int, stop: int,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, stop - start, V] of positions start..stop-1 of ids [B, L], computing only those
        tokens and attending over `cache` (its last `refresh`) at every other position. While it
        runs, `held_positions` says which absolute positions the forward holds (hooks map through it)."""
        keys = self._keys(ids, attention_mask)
        if not 0 <= start < stop <= ids.shape[1]:
            raise TimeromeError(f"window {start}..{stop} is not inside the sequence of {ids.shape[1]} tokens")
        kwargs = self.forward_kwargs(ids, keys)
        if "position_ids" in kwargs:
            kwargs["position_ids"] = kwargs["position_ids"][:, start:stop]
        cache.start = start
        self.held_positions = torch.arange(start, stop, device=ids.device)
        try:
            return self.model(input_ids=ids[:, start:stop], kv_cache=cache, **kwargs).logits
        finally:
            self.held_positions = None
            cache.start = None

    def forward_kwargs(self, ids: torch.Tensor, keys: torch.Tensor | None) -> dict:
        """The model's keyword arguments for a batch whose real tokens are `keys` (None: no padding)."""
        fam = self.family
        if self.remote:
            return self._remote_kwargs(ids, keys)
        kwargs = {}
        if fam.attention in ("bias4d", "additive4d"):  # transformers' classes: a 4-D mask makes them bidirectional
            B, L = ids.shape
            # without padding one [1, 1, L, L] mask serves every row (and rows the trace engine
            # appends to the batch between blocks)
            k = keys if keys is not None else torch.ones(1, L, dtype=torch.bool, device=ids.device)
            m = k[:, None, None, :]
            if fam.attention == "additive4d":  # 0 for real keys, the dtype's min for padding
                m = torch.zeros(m.shape, dtype=self.dtype, device=ids.device).masked_fill(~m, torch.finfo(self.dtype).min)
            kwargs["attention_mask"] = m.expand(k.shape[0], 1, L, L)
        elif keys is not None:  # our implementations: a 2-D key mask
            kwargs["attention_mask"] = keys
        if keys is not None and fam.positions == "from_mask":
            kwargs["position_ids"] = positions_for(keys)
        return kwargs

    def _remote_kwargs(self, ids, keys) -> dict:
        style = self.family.remote_padding
        if keys is None:
            return {}  # every official forward is bidirectional without a mask
        if self._padding_problem:
            raise TimeromeError(self._padding_problem)
        both = (keys[:, :, None] & keys[:, None, :])[:, None]  # [B, 1, L, L], as the official samplers build it
        if style == "attention_bias":
            return {"attention_bias": both}
        if style == "mask4d":
            return {"attention_mask": both, "position_ids": positions_for(keys)}
        raise TimeromeError(
            f"the official {self.family.name} code ignores attention masks, so padded batches run with "
            "trust_remote_code=True would be wrong; load without it to use timerome's implementation")

    def _probe_remote_padding(self) -> str | None:
        """Check once, on 3 tokens, that the checkpoint's own code honours the padding mask the
        way this family's official code does (an older LLaDA revision silently ignores it)."""
        if self.family.remote_padding == "none":
            return None
        V = self.vocab_size
        ids = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 3]], device=self.device) % V
        keys = torch.tensor([[1, 1, 0]] * 3, dtype=torch.bool, device=self.device)
        try:
            with torch.no_grad():
                out = self.model(input_ids=ids, **self._remote_kwargs(ids, keys)).logits.float()
        except Exception as e:  # noqa: BLE001
            return (f"the checkpoint's own code fails on a padded batch ({type(e).__name__}: {str(e)[:120]}); "
                    "load without trust_remote_code to use timerome's implementation")
        tol = 1e-3 * (1 + out[:, :2].abs().max().item())
        if (out[0, :2] - out[1, :2]).abs().max().item() > tol:
            return ("the checkpoint's own code ignores the padding mask (a padded token changed the others); "
                    "load without trust_remote_code to use timerome's implementation")
        if (out[0, 0] - out[2, 0]).abs().max().item() <= tol:
            return ("the checkpoint's own code is not bidirectional on a padded batch; "
                    "load without trust_remote_code to use timerome's implementation")
        return None

    def _remote_paths(self):
        """Points whose module differs in the official code (LLaDA-MoE has no `mlp_sum`: its
        layer adds routed + shared inline, so the "mlp" point has a module only without a shared expert)."""
        fam = self.family
        for point, template in fam.remote_points:
            if self._has(point):
                continue
            blocker = [p for p in fam.remote_unhookable_if if self._has(p)]
            if blocker:
                raise TimeromeError(
                    f"with trust_remote_code=True the official {fam.name} code computes the {point!r} hook "
                    f"point inline (it includes {blocker[0]!r}), so no module outputs it; load without "
                    "trust_remote_code to use timerome's implementation")
            self._paths[point] = template

    def _has(self, point: str) -> bool:
        return self._paths[point].format(i=0) in self._modules

    # ---------------------------------------------------------------- hook points
    def module_path(self, layer: int | None, point: str) -> str:
        if point == "embed":
            return self.family.embed
        if point not in self._paths:
            raise TimeromeError(f"unknown hook point {point!r}; hook points are {', '.join(self.points)}")
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

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """The vocabulary scores the model's own read-out gives a last-block output h [..., H]: its
        final norm, then its head (the embedding where the head is tied), divided by sqrt(d_model) where the config
        says scale_logits (LLaDA, MMaDA): the logits, unshifted (output j of a logit_shift family
        predicts token j + 1)."""
        norm = self._modules.get(self.family.norm)
        if norm is None:
            raise TimeromeError(f"the {self.family.name} model has no final norm at {self.family.norm!r}, so its "
                                "read-out cannot be applied to a residual")
        x = norm(h)
        head = self._modules.get(self.family.head)
        out = head(x) if head is not None else nn.functional.linear(x, self.embedding().weight)
        return out / self.hidden_size ** 0.5 if self.config.get("scale_logits") else out

    # ---------------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """Stable id of the weights: edit memories and caches refuse another model.

        A digest of the config and of every parameter, every byte (`weights_digest`), so one changed
        weight changes it. It is computed once and kept while the parameters are the same tensors at
        the same version (any in-place change through torch, an optimiser step or `load_state_dict`,
        bumps a tensor's version: then it is computed again); `load_backbone` reads it from the cache
        when the checkpoint's files are unchanged (`loading.verified_weights`), so a second load
        costs nothing. A write through `.data`, which torch does not count, is not seen.
        """
        state = self._weights_state()
        if self._fingerprint is None or self._fingerprint[0] != state:
            self._fingerprint = (state, weights_digest(self.model, self.config)[0])
        return self._fingerprint[1]

    def know_fingerprint(self, fingerprint: str) -> None:
        """The fingerprint of the parameters as they are now (read from the cache by the loader, or
        restored with them by `WeightEdit.undo`)."""
        self._fingerprint = (self._weights_state(), fingerprint)

    def weights_written(self) -> None:
        """Say that the weights changed where torch does not count it (a write through `.data`, as
        peft's adapter merge does): the next `fingerprint` is computed from the weights again."""
        self._fingerprint = None

    def known_fingerprint(self) -> str | None:
        """The fingerprint if it is known for the parameters as they are now, else None (never computed here)."""
        fp = self._fingerprint
        return fp[1] if fp is not None and fp[0] == self._weights_state() else None

    def parameter_tensors(self) -> tuple:
        """Which tensors hold the parameters, (name, storage, dtype, shape) each: not their values (a method
        that replaced or added a tensor makes a fingerprint known before it stale, `WeightEdit.undo`)."""
        return tuple((n, p.data_ptr(), p.dtype, tuple(p.shape)) for n, p in self.model.named_parameters())

    def _weights_state(self) -> tuple:
        """The parameter tensors and their versions (bumped by any in-place change through torch)."""
        return self.parameter_tensors(), tuple(p._version for p in self.model.parameters())

    def __repr__(self) -> str:
        return (f"Backbone({self.name!r}, family={self.family.name}, layers={self.n_layers}, "
                f"hidden={self.hidden_size}, mask_id={self.mask_id})")


FINGERPRINT_VERSION = 2  # 1 hashed a strided sample of 512 values per tensor; 2 hashes every byte
_CHUNK = 1 << 24  # elements copied to the CPU and hashed at a time


def model_arg(backbone, where: str = "backbone"):
    """backbone if it is a model timerome can run (a `Backbone`, or a stand-in with its `logits` and
    `device`), else one TimeromeError naming the argument: a path, None or a string given where the
    loaded model belongs failed deep inside with an AttributeError."""
    if isinstance(backbone, Backbone) or (callable(getattr(backbone, "logits", None))
                                          and hasattr(backbone, "device")):
        return backbone
    from timerome.common.checks import shown

    hint = " (load it first: timerome.load_backbone(path))" if isinstance(backbone, (str, bytes)) or hasattr(
        backbone, "__fspath__") else ""
    raise TimeromeError(f"{where} must be a model from timerome.load_backbone(...), got {type(backbone).__name__} "
                        f"{shown(backbone)}{hint}")


def weights_digest(model, config: dict) -> tuple[str, list[str]]:
    """(fingerprint, names of the parameters holding NaN or inf) of every byte of every parameter,
    with the config: one pass over the weights (about 1.7 GB/s of SHA-256 on a CPU core)."""
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    nonfinite = []
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            flat = p.detach().reshape(-1)
            h.update(f"{name}{tuple(p.shape)}{p.dtype};".encode())
            finite = True
            for start in range(0, flat.numel(), _CHUNK):
                part = flat[start:start + _CHUNK].contiguous().cpu()
                h.update(part.view(torch.uint8).numpy())
                finite = finite and _all_finite(part)
            if not finite:
                nonfinite.append(name)
    return h.hexdigest()[:16], nonfinite


# the exponent bits of IEEE formats numpy cannot hold: all ones means inf or NaN
_EXPONENT = {torch.bfloat16: (torch.int16, 0x7F80)}


def _all_finite(part: torch.Tensor) -> bool:
    """Whether a CPU tensor holds no NaN / inf (numpy: torch's threads stall on a shared machine)."""
    import numpy as np

    if not part.is_floating_point():
        return True
    if part.dtype in (torch.float16, torch.float32, torch.float64):
        return bool(np.isfinite(part.numpy()).all())
    if part.dtype in _EXPONENT:
        view, mask = _EXPONENT[part.dtype]
        bits = part.view(view).numpy()
        return not bool(((bits & mask) == mask).any())
    return bool(torch.isfinite(part).all())


def _first(config: dict, keys, what: str):
    for k in keys:
        if config.get(k):
            return config[k]
    raise TimeromeError(f"config.json gives no {what} (looked for {', '.join(keys)})")
