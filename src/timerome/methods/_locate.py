"""Shared machinery of the locate-then-edit baselines (rome, memit, alphaedit, unke) on MDLMs.

What changes from the autoregressive recipes (ROME / MEMIT / AlphaEdit / UnKE):
- The model is bidirectional and scored by the masked-diffusion objective, so the target value
  v* is optimised against the MDLM loss of the target answer ("I don't know.") over partially
  masked states (t ~ U(eps, 1), 1/t weighted, as `train.mdlm_loss`), not next-token log-probs;
  objective="forget" / "unlikelihood" instead push the original answer down.
- A fact's key is the down projection's input averaged over the subject's prompt tokens (or its
  last token) and over a few masked states of the cloze [question | answer with t of it masked]:
  what the layer sees while the answer is being denoised.
- The delta is added at every subject token (bidirectional attention reads them all), one
  vector per fact; ROME's KL "essence" term is dropped and only its norm clamp is kept, relative
  to the activation's norm (lr too), so one setting fits models of different scales.
- C = E[k k^T] is measured on the model's own corpus (embedded model: its training rows; else the
  task's background or retain rows), minus the forget rows, and cached on disk.

On a causal (autoregressive) backbone the same recipes run as the AR papers write them: v* is
optimised against the next-token loss of the target answer given the prompt (`masked_objective`,
nothing masked), over one state (every state would be the same), and the keys, read at subject
tokens, do not depend on the answer (causal attention).

Pieces: `down_projection` finds the edited Linear (or GPT-2's Conv1D, its weight transposed); `encode_facts` / `KeyStates` read keys and
residuals; `key_stats` is the cached C; `optimise_deltas` fits v* - v; `rome_update` /
`memit_update` / `alphaedit_update` / `null_projector` are the closed forms; `spread_edit` is
MEMIT's multi-layer procedure (shared with AlphaEdit).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from timerome.common.cache import cache_dir, digest, entry_lock, read_tensors, save_tensors
from timerome.common.progress import progress_bar, wanted
from timerome.data.rows import spread
from timerome.engine.encoding import (DEFAULT_TARGET, collate, encode_fact, mask_answers, pad_id, pad_sequences,
                                      text_ids, uses_leading_space)
from timerome.engine.hooks import Hooks, run_to
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import NotApplicable, TimeromeError
from timerome.memory.whitening import background_texts, rows_to_texts
from timerome.methods.registry import differs, get_method, need_facts, weight_edit

OBJECTIVES = ("target", "forget", "unlikelihood")


# ------------------------------------------------------------------------------ where to edit


@dataclass(frozen=True)
class DownProj:
    """The Linear whose output is block `layer`'s MLP output (its weight is [d_model, d_mlp]; a
    Conv1D's is stored transposed, [d_mlp, d_model], which `apply_update` knows)."""

    layer: int
    path: str
    linear: nn.Module


def _is_projection(m: nn.Module) -> bool:
    """A Linear, or transformers' Conv1D (GPT-2: y = x W + b, W [in, out])."""
    return isinstance(m, nn.Linear) or _is_conv1d(m)


def _is_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and getattr(m, "weight", None) is not None


def in_features(m: nn.Module) -> int:
    return m.weight.shape[0] if _is_conv1d(m) else m.in_features


def down_projection(backbone, layer: int) -> DownProj:
    """The Linear whose output IS the `mlp` hook point's output, found by one probe forward.

    The family table names the MLP module only; when that module is itself a Linear (LLaDA's
    `ff_out`) it is the answer, otherwise every Linear inside it is hooked and the one whose
    output is returned unchanged by the MLP (Llama/Qwen `down_proj`) is picked. A MoE's routed
    sum has no such Linear: an error, not a guess.
    """
    layer = check_layer(backbone, layer)
    path = backbone.module_path(layer, "mlp")
    mlp = backbone.module(layer, "mlp")
    if _is_projection(mlp):
        return DownProj(layer, path, mlp)
    cands = [(f"{path}.{n}", m) for n, m in mlp.named_modules() if _is_projection(m)]
    with torch.no_grad(), Hooks(backbone, [m for _, m in cands] + [mlp]) as seen:
        backbone.logits(torch.full((1, 4), backbone.mask_id, dtype=torch.long, device=backbone.device))
    out = seen[mlp][0]
    for name, m in cands:
        o = seen[m][0] if seen[m] else None
        if o is not None and o.shape == out.shape and torch.equal(o, out):
            return DownProj(layer, name, m)
    raise NotApplicable(f"no Linear inside {path} produces the MLP output of layer {layer} (a mixture of "
                        "experts?): the locate-then-edit baselines need a single down projection")


def default_layers(n_layers: int, lo: float, hi: float) -> list[int]:
    """Layers round(lo * n) .. round(hi * n) (at least one): MEMIT's band sits in the lower part
    of the stack (GPT-J 3-8 of 28, Llama 4-8 of 32); the same fractions for any depth."""
    a = min(n_layers - 1, round(lo * n_layers))
    b = min(n_layers - 1, max(a, round(hi * n_layers)))
    return list(range(a, b + 1))


def check_layer(backbone, layer) -> int:
    """A layer index of the model (negative counts from the end), as 0..n_layers-1; the one check of
    a method's `layer` option (registry's option check has made it an integer)."""
    layer = int(layer)
    if not -backbone.n_layers <= layer < backbone.n_layers:
        raise TimeromeError(f"layer {layer} out of range: the model has {backbone.n_layers} layers")
    return layer % backbone.n_layers


# ------------------------------------------------------------------------------ facts as token ids


def encode_facts(backbone, facts, target: str | None = DEFAULT_TARGET) -> list:
    """Every fact as an EncodedFact with its target answer (encoding.encode_fact's conventions)."""
    facts = need_facts(facts)
    bpe = uses_leading_space(backbone)
    return [encode_fact(backbone, f, i, target=target or DEFAULT_TARGET, bpe=bpe) for i, f in enumerate(facts)]


def slot_positions(item, where: str) -> list[int]:
    """Token positions that receive the fact's delta: its subject tokens, the last one, or the
    whole prompt (UnKE's block-level edit)."""
    if where == "subject":
        return item.subject_pos.tolist()
    if where == "last":
        return [int(item.subject_pos[-1])]
    if where == "prompt":
        return list(range(len(item.prompt_ids)))
    raise TimeromeError(f"positions must be 'subject', 'last' or 'prompt', got {where!r}")


def _batch(backbone, items, rows, answer_of):
    """rows: fact indices, one sequence each -> ids [B, L], answer mask [B, L], attention [B, L]."""
    pairs = [(items[f].prompt_ids.tolist(), answer_of(items[f]).tolist()) for f in rows]
    return collate(pairs, pad_id(backbone), backbone.device)


def _objects(it):
    return it.object_ids


def _targets(it):
    return it.target_ids


# ------------------------------------------------------------------------------ reading sites


CLOZE_STATE_KEYS = ("n_states", "key_states")  # the cloze-state counts, which an autoregressive model leaves unread


def refuse_cloze_states(family, config, method: str) -> None:
    """n_states / key_states count the cloze states (answers partly masked) that v* is fitted over and the
    keys are averaged over; a causal model (its `family`) masks nothing, so every state is the same (v* fits
    one): a count other than the method's default is refused there, not ignored."""
    if not family.causal:
        return
    defaults = get_method(method).defaults
    given = [k for k in CLOZE_STATE_KEYS if k in defaults and differs(config[k], defaults[k])]
    if given:
        raise TimeromeError(f"{' and '.join(given)} {'counts' if len(given) == 1 else 'count'} the cloze states "
                            f"(answers partly masked) {method} fits and reads over, and the {family.name} "
                            "model is autoregressive: it masks nothing, so every state is the same; leave "
                            f"{'it' if len(given) == 1 else 'them'} out")


def cloze_states_check(method: str):
    """The registry's model_check of a method fitting over cloze states: `refuse_cloze_states` for it."""
    return lambda family, config: refuse_cloze_states(family, config, method)


class KeyStates:
    """Fixed cloze states [question | original answer, a fraction t of it masked] per fact: the
    first fully masked (the start of generation), the rest with t ~ U(eps, 1). Built once, so
    every read of the same site during an install sees the same inputs."""

    def __init__(self, backbone, items, *, n_states: int, generator: torch.Generator,
                 positions: str = "subject", eps: float = LIKELIHOOD.eps):
        F_ = len(items)
        rows = [f for _ in range(n_states) for f in range(F_)]
        ids, ans, att = _batch(backbone, items, rows, _objects)
        # state 0 of every fact: every answer token masked
        self.ids, _, _ = mask_answers(ids, ans, backbone.mask_id, generator, eps, fully_masked=F_)
        self.att = att
        self.b, self.p, self.f, _ = _slots(backbone, items, rows, positions, False)
        counts = torch.bincount(self.f, minlength=F_).clamp(min=1)
        self.w = (1.0 / counts.double())[self.f]                 # mean over a fact's positions and states
        self.n_facts, self.backbone = F_, backbone

    @torch.no_grad()
    def means(self, taps: dict) -> dict[str, torch.Tensor]:
        """taps: name -> (module, "in" | "out"); name -> [F, d] float64: each tap's mean over the
        fact's positions and states."""
        ins = Hooks(self.backbone, [m for m, kind in taps.values() if kind == "in"], inputs=True)
        outs = Hooks(self.backbone, [m for m, kind in taps.values() if kind == "out"])
        with ins, outs:
            self.backbone.logits(self.ids, None if bool(self.att.all()) else self.att)
        out = {}
        for name, (mod, kind) in taps.items():
            h = (ins if kind == "in" else outs)[mod][0][self.b, self.p].double() * self.w[:, None]  # [N, d]
            out[name] = h.new_zeros(self.n_facts, h.shape[1]).index_add_(0, self.f, h)
        return out


# ------------------------------------------------------------------------------ key statistic C


def own_statistics(config) -> bool:
    """Whether the key statistic is read from the task's background texts: where `stats_texts` does not
    name its own (`preserved_texts`)."""
    return config.get("stats_texts") is None


def preserved_texts(backbone, task, source=None) -> list[str]:
    """Texts whose keys are to be preserved: `source` (a text/JSON file, a split name or a list),
    else the task's background when it is texts (precomputed ResidualStats hold no keys of the
    down projection, so they are passed over), else the embedded model's training rows (other
    models: the retain rows); the forget rows' own texts are left out either way."""
    src = source if source is not None else task.background
    if not isinstance(src, (str, Path, list, tuple)):
        src = None
    if src is None and not getattr(backbone, "embedded", False):
        texts = rows_to_texts(task.retain_rows)
        if not texts:
            raise TimeromeError("no texts for the key statistic: give stats_texts= or retain rows")
    else:
        texts = background_texts(backbone, src)
    forget = set(rows_to_texts(task.forget_rows))
    return [t for t in texts if t not in forget]


def stats_cache_path(backbone, layer: int, texts: list[str]) -> Path:
    return cache_dir() / "locate" / f"{backbone.cache_id()}-L{layer}-n{len(texts)}-{digest(texts, 12)}.safetensors"


def key_stats(backbone, layer: int, texts: list[str], *, cache: bool = True,
              batch_size: int = 64) -> tuple[torch.Tensor, Path]:
    """C = E[k k^T] [d_mlp, d_mlp] float64 (CPU) of the down projection's input over every token
    of `texts`, and its cache file: read when it exists, else computed and written."""
    return key_stats_layers(backbone, [layer], texts, cache=cache, batch_size=batch_size)[layer]


def key_stats_layers(backbone, layers, texts: list[str], *, cache: bool = True,
                     batch_size: int = 64) -> dict[int, tuple[torch.Tensor, Path]]:
    """key_stats of several layers: those not cached are measured in one pass over `texts`
    (each forward stops at the highest of them). Their cache entries are made under their locks
    (`cache.entry_lock`, taken in layer order, so two processes never wait for each other): a
    process that needs one of them meanwhile waits and reads it."""
    out = {}

    def read(layer) -> bool:
        path = stats_cache_path(backbone, layer, texts)
        if cache and path.is_file():
            out[layer] = (read_tensors(path)[0]["C"], path)
            return True
        return False

    todo = [layer for layer in dict.fromkeys(layers) if not read(layer)]
    with ExitStack() as held:
        if cache and todo:
            for layer in sorted(todo):
                held.enter_context(entry_lock(stats_cache_path(backbone, layer, texts),
                                              f"the key statistics of layer {layer}"))
            todo = [layer for layer in todo if not read(layer)]  # made while this one waited
        for layer, C in (_second_moments(backbone, todo, texts, batch_size) if todo else {}).items():
            path = stats_cache_path(backbone, layer, texts)
            if cache:
                save_tensors(path, {"C": C}, metadata={"n_texts": str(len(texts))})  # atomic, unique temp name
            out[layer] = (C, path)
    return out


def _second_moments(backbone, layers, texts, batch_size) -> dict[int, torch.Tensor]:
    lins = {layer: down_projection(backbone, layer).linear for layer in layers}
    seqs = sorted((s for s in (text_ids(backbone, t) for t in texts) if s), key=len)
    if not seqs:
        raise TimeromeError("the key statistic's corpus is empty")
    S = {layer: torch.zeros(in_features(lin), in_features(lin), dtype=torch.float64, device=backbone.device)
         for layer, lin in lins.items()}
    n = 0
    label = f"key statistics of layer{'s' if len(lins) > 1 else ''} {', '.join(map(str, sorted(lins)))}"
    with torch.no_grad(), Hooks(backbone, list(lins.values()), inputs=True) as got, \
            progress_bar(label, total=len(seqs), enabled=wanted()) as bar:
        for s in range(0, len(seqs), batch_size):
            ids, real = pad_sequences(seqs[s:s + batch_size], backbone)
            run_to(backbone, (max(lins), "resid"), ids, real)       # the layers above never run
            for layer, lin in lins.items():
                k = got[lin].pop()[real].double()                    # [N, d]
                S[layer] += k.T @ k
            n += int(real.sum())
            bar.advance(len(ids))
    return {layer: (m / n).cpu() for layer, m in S.items()}


def block_output(backbone, layer, ids, real) -> torch.Tensor:
    """Block `layer`'s output [B, L, H] on ids [B, L] (padding hidden by `real`), without running
    the layers above, which cannot change it; the autograd graph is kept."""
    return run_to(backbone, (layer, "resid"), ids, real, detach=False)


# ------------------------------------------------------------------------------ target values


def _slots(backbone, items, rows, positions, per_position):
    """Index tensors (batch row, position, fact, delta slot) of every place a delta is added."""
    b_idx, p_idx, f_idx, s_idx = [], [], [], []
    for b, f in enumerate(rows):
        for j, p in enumerate(slot_positions(items[f], positions)):
            b_idx.append(b), p_idx.append(p), f_idx.append(f), s_idx.append(j if per_position else 0)
    return tuple(torch.tensor(x, device=backbone.device) for x in (b_idx, p_idx, f_idx, s_idx))


@torch.no_grad()
def site_norms(backbone, items, site, positions: str = "subject") -> torch.Tensor:
    """[F] mean norm of `site`'s output at each fact's positions, on [question | masked answer]."""
    rows = list(range(len(items)))
    ids, ans, att = _batch(backbone, items, rows, _objects)
    ids = torch.where(ans, torch.full_like(ids, backbone.mask_id), ids)
    b, p, f, _ = _slots(backbone, items, rows, positions, False)
    with Hooks(backbone, [tuple(site)]) as got:
        backbone.logits(ids, None if bool(att.all()) else att)
    n = got[tuple(site)][0].float()[b, p].norm(dim=-1)
    tot = torch.zeros(len(items), device=n.device).index_add_(0, f, n)
    return tot / torch.bincount(f, minlength=len(items)).clamp(min=1)


def optimise_deltas(backbone, items, site, *, positions: str = "subject", objective: str = "target",
                    grad_steps: int, lr: float, n_states: int = 4, clamp: float = 4.0,
                    weight_decay: float = 0.0, eps: float = LIKELIHOOD.eps, generator: torch.Generator,
                    per_position: bool = False, norms: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Deltas added to `site`'s output (layer, point) at each fact's `positions` that minimise
    `masked_objective` (the target answer made likely, or the original answer made unlikely).

    Returns delta [F, S, H] float32 (S = 1, shared by the positions, unless per_position: one per
    prompt position) and a few diagnostics. lr is in units of the site's RMS activation (Adam's
    step per coordinate is about lr), so one value fits models whose scales differ; each delta
    is clamped to `clamp` times `norms` [F] (default: the site's norm at the positions; ROME's
    clamp). Pass the unedited model's norms when editing sequentially, so the clamp cannot grow
    with the edits.
    """
    if objective not in OBJECTIVES:
        raise TimeromeError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    F_, H = len(items), backbone.hidden_size
    answer_of = _targets if objective == "target" else _objects
    if getattr(backbone, "causal", False):  # nothing is masked: every state would be the same
        n_states = 1
    rows = [f for _ in range(n_states) for f in range(F_)]
    ids, ans, att = _batch(backbone, items, rows, answer_of)
    S = max(len(slot_positions(it, positions)) for it in items) if per_position else 1
    b_idx, p_idx, f_idx, s_idx = _slots(backbone, items, rows, positions, per_position)
    norms = site_norms(backbone, items, site, positions) if norms is None else norms.to(backbone.device)
    rms = float(norms.mean()) / H ** 0.5

    delta = torch.zeros(F_, S, H, device=backbone.device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr * rms)
    losses = []

    def add(h, _state):
        extra = torch.zeros(h.shape, device=h.device, dtype=delta.dtype)
        extra = extra.index_put((b_idx, p_idx), delta[f_idx, s_idx], accumulate=True)
        return h + extra.to(h.dtype)

    with Hooks(backbone, edit={tuple(site): add}), \
            progress_bar(f"target values v* of {F_} fact{'s' if F_ > 1 else ''}", total=grad_steps, enabled=wanted()) as bar:
        for _ in range(grad_steps):
            task_loss = masked_objective(backbone, ids, ans, att, generator, eps, objective)
            reg = weight_decay * (delta.pow(2).sum(-1) / norms[:, None].pow(2)).mean()
            (g,) = torch.autograd.grad(task_loss + reg, [delta])  # never touches the weights' .grad
            delta.grad = g
            opt.step()
            with torch.no_grad():  # ROME's clamp: |delta| <= clamp * |h|
                cap = (clamp * norms)[:, None, None]
                delta.mul_((cap / delta.norm(dim=-1, keepdim=True).clamp(min=1e-12)).clamp(max=1.0))
            losses.append(float(task_loss.detach()))
            bar.advance(description=f"target values v* of {F_} fact{'s' if F_ > 1 else ''}, loss {losses[-1]:.3g}")
    k = max(1, len(losses) // 5)
    info = {"loss_first": losses[0], "loss_last": sum(losses[-k:]) / k,
            "delta_norm": float(delta.detach().norm(dim=-1).mean()), "site_norm": float(norms.mean())}
    return delta.detach(), info


def masked_objective(backbone, ids, ans, att, generator, eps: float = LIKELIHOOD.eps, objective: str = "target",
                     cap: float = 6.0) -> torch.Tensor:
    """The MDLM loss on partially masked answers (train.mdlm_loss's masking and 1/t weight),
    nats per answer token, mean over the batch; on a causal backbone the next-token loss of the
    whole answer (nothing masked, t = 1, no draw). Per masked answer token:
      "target":        -log p            make the answer (the target text) likely
      "forget":        max(log p, -cap)  make the answer (the original) unlikely, up to cap nats:
                                         negated cross-entropy is unbounded, the cap stops it
      "unlikelihood":  -log(1 - p)       the same, bounded by construction
    """
    if getattr(backbone, "causal", False):  # aligned logits at i read tokens < i: the clean row is the next-token loss
        noisy, masked, t = ids, ans, torch.ones(len(ids), device=ids.device)
    else:
        noisy, masked, t = mask_answers(ids, ans, backbone.mask_id, generator, eps)
    logits = backbone.logits(noisy, None if bool(att.all()) else att).float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)       # [B, L]
    if objective == "target":
        per_tok = -logp
    elif objective == "forget":
        per_tok = logp.clamp(min=-cap)
    else:  # unlikelihood
        per_tok = -torch.log1p(-logp.exp().clamp(max=1 - 1e-6))
    per = (per_tok * masked / t[:, None]).sum(1) / ans.sum(1).clamp(min=1)             # [B]
    return per.mean()


# ------------------------------------------------------------------------------ closed forms


def rome_update(C_inv: torch.Tensor, k: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """ROME's rank-one update: dW = r (C^-1 k)^T / (k^T C^-1 k), so dW k = r and any key
    orthogonal to k in the C^-1 metric is left alone. k [d], r [H] -> [H, d]."""
    u = C_inv @ k
    return torch.outer(r, u) / (k @ u)


def memit_update(K: torch.Tensor, R: torch.Tensor, C: torch.Tensor, weight: float) -> torch.Tensor:
    """MEMIT's batch least squares: dW = R K^T (w C + K K^T)^-1, i.e. the dW minimising
    |dW K - R|^2 + w E|dW k|^2 over background keys k (w = `weight`, MEMIT's mom2 weight). K [F, d]
    (rows), R [F, H] -> [H, d]."""
    A = weight * C + K.T @ K                                                  # [d, d]
    return torch.linalg.solve(A, K.T @ R).T                                # A sym: (R K^T A^-1)^T = A^-1 K R


def null_projector(C: torch.Tensor, *, rel_threshold: float = 1e-2,
                   energy: float | None = None) -> tuple[torch.Tensor, dict]:
    """AlphaEdit's projector P [d, d] on the (approximate) null space of the preserved keys.

    AlphaEdit keeps eigen-directions of K0 K0^T whose eigenvalue is below an absolute 1e-2,
    which depends on the model's scale. Here: eigenvalue < rel_threshold * max eigenvalue, or
    (energy given) the smallest directions that together hold at most that fraction of the total
    energy. At least one direction is always kept, so P is never all zero.
    """
    evals, evecs = torch.linalg.eigh(C)                                    # ascending
    if energy is not None:
        keep = torch.cumsum(evals.clamp(min=0), 0) <= energy * float(evals.clamp(min=0).sum())
    else:
        keep = evals < rel_threshold * float(evals.max())
    keep[0] = True
    V = evecs[:, keep]
    pos = evals.clamp(min=0)
    info = {"null_rank": int(keep.sum()), "null_energy": float(pos[keep].sum() / pos.sum())}
    return V @ V.T, info


def alphaedit_update(K: torch.Tensor, R: torch.Tensor, P: torch.Tensor, l2: float) -> torch.Tensor:
    """AlphaEdit (one batch, no earlier edits): dW = R^T K P (K^T K P + l2 I)^-1, which equals
    R^T K (P K^T K + l2 I)^-1 P, so dW (I - P) = 0: keys in the preserved span are untouched.
    K [F, d] (rows), R [F, H], P [d, d] -> [H, d]."""
    I = torch.eye(len(P), dtype=P.dtype, device=P.device)
    X = torch.linalg.solve(P @ (K.T @ K) + l2 * I, P @ K.T @ R)          # [d, H] = dW^T
    return X.T


@torch.no_grad()
def apply_update(lin: nn.Module, dW: torch.Tensor) -> None:
    """W += dW (dW [out, in]; a Conv1D stores W transposed)."""
    dW = dW.T if _is_conv1d(lin) else dW
    lin.weight.add_(dW.to(device=lin.weight.device, dtype=lin.weight.dtype))


# ------------------------------------------------------------------------------ MEMIT's spread


def band(backbone, config, lo: float = 0.1, hi: float = 0.25) -> list[int]:
    if config["layers"] is None:
        return default_layers(backbone.n_layers, lo, hi)
    return sorted({check_layer(backbone, l) for l in config["layers"]})


def spread_edit(backbone, task, config, seed, solve, method):
    """MEMIT's procedure (memit.py's docstring) with `solve(K, R, C, layer) -> dW [H, d]` per
    layer; AlphaEdit swaps the solve. Returns the WeightEdit."""
    layers = band(backbone, config)
    projs = [down_projection(backbone, l) for l in layers]
    top = projs[-1].layer
    items = encode_facts(backbone, task.facts, config["target"])
    texts = spread(preserved_texts(backbone, task, config["stats_texts"]), config["stats_samples"])
    stats = key_stats_layers(backbone, [p.layer for p in projs], texts)
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device
    info = {"layers": layers, "modules": [p.path for p in projs], "n_stats_texts": len(texts),
            "stats_files": [str(stats[p.layer][1]) for p in projs], "update_norms": []}
    with weight_edit(backbone, method) as edit:
        delta, info["delta"] = optimise_deltas(
            backbone, items, (top, "mlp"), positions=config["positions"], objective=config["objective"],
            grad_steps=config["grad_steps"], lr=config["lr"], n_states=config["n_states"], clamp=config["clamp"],
            weight_decay=config["weight_decay"], generator=gen)
        states = KeyStates(backbone, items, n_states=config["key_states"], generator=gen,
                           positions=config["positions"])
        top_out = (backbone.module(top, "resid"), "out")
        z = states.means({"h": top_out})["h"].cpu() + delta[:, 0].double().cpu()       # [F, H]
        for i, p in enumerate(projs):
            got = states.means({"k": (p.linear, "in"), "h": top_out})
            K, R = got["k"].cpu(), (z - got["h"].cpu()) / (len(projs) - i)               # [F, d], [F, H]
            dW = solve(K, R, stats[p.layer][0], p.layer)
            apply_update(p.linear, dW)
            info["update_norms"].append(float(dW.norm()))
        info["residual_left"] = float((z - states.means({"h": top_out})["h"].cpu()).norm(dim=-1).mean())
    edit.info = info
    return edit
