"""ROME's causal trace by token position (Meng et al. 2022, "Locating and Editing Factual
Associations in GPT", Sec. 2), for every backbone: the AR protocol the paper contrasts with TIE.

    result = positional_trace(backbone, facts)     # PositionalTrace: effect per (module, layer, token)
    choice = select_positional(result)              # ROME's site: the MLP layer with the largest
                                                    # effect at the last subject token

One forward per row, no denoising trajectory. A fact (subject s, prompt, object o) is read where
the model predicts o's first token o_1: the next token after the prompt for a causal model; the
first answer position of [prompt | mask * G], the answer fully masked, for an MDLM (the transplant
the paper criticises: an MDLM answers over many steps, this reads one forward). Then, as ROME:
- clean run: p(o_1);
- corrupted run: e_i + sigma * eps_i at the subject tokens' embeddings (sigma = 3 x the std of the
  subject tokens' embeddings over the traced facts, ROME's "3 x std" rule; eps drawn once per noise
  sample and reused for every restoration, as ROME's seeded generator does);
- restored run at (token t, layer l, module m): the corrupted run with m's output at token t set
  to the clean run's, for "resid" at block l alone, for "attn" / "mlp" at the `window` layers
  max(0, l - window // 2) .. min(L, l + window // 2) - 1 (ROME's window of 10);
- indirect effect IE(t, l, m) = p_restored(o_1) - p_corrupted(o_1), averaged over noise samples.

Computed in batches: the clean row leads each forward and restorations read the clean h from it
in the same forward, as ROME does; a restoring row is its corrupted row below its first restored
layer, so it joins the batch there (`trace_engine.joiners`, checked by `rows_can_join`); a row
whose restored values equal the corrupted ones for every noise sample changes nothing (on a causal
model, every token before the subject), so it is not run and its effect is exactly 0.

Averaged over facts, positions fall in ROME's six categories (`CATEGORIES`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from timerome.backbones import HOOK_POINTS
from timerome.backbones.backbone import model_arg
from timerome.common.checks import finite_tensor, integer, is_int, shown
from timerome.common.progress import progress_bar
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import fact_list
from timerome.engine.hooks import Hooks
from timerome.engine.settings import TRACE
from timerome.errors import TimeromeError
from timerome.tracing.causal_trace import check_common, default_facts, prepare, refuse_overflow
from timerome.tracing.result import TraceFile, _check_meta, check_stored, meta_path, module_names
from timerome.tracing.tie import add_noise, subject_noise
from timerome.tracing.wavefront import Rows, joiners, rows_can_join

WINDOW = 10  # ROME's window of restored attn / mlp layers
BATCH_SIZE = 128  # most rows per forward (a memory knob: the effects do not depend on it, tested)
N_SAMPLES = 10  # ROME's noise samples per fact
CATEGORIES = ("first subject token", "middle subject tokens", "last subject token", "first subsequent token",
              "further tokens", "last token")
LAST_SUBJECT = "last subject token"


@dataclass
class PositionalTrace(TraceFile):
    """Indirect effects of a set of facts, in probability of the object's first token.

    effect       [F, M, Ly, T]  mean over noise samples of p_restored - p_corrupted; T = the longest
                                prompt, NaN past a fact's own prompt
    clean_p      [F]            p(o_1) of the clean run
    corrupted_p  [F, N]         p(o_1) of the corrupted run, per noise sample
    """

    effect: torch.Tensor
    clean_p: torch.Tensor
    corrupted_p: torch.Tensor
    fact_ids: list[str]
    modules: tuple[str, ...]
    layers: list[int]
    settings: dict
    facts: list[dict] = field(default_factory=list)  # per fact: tokens, subject positions, prompt length
    stats: dict = field(default_factory=dict)

    KIND = "positional"
    CATEGORIES = CATEGORIES  # the rows of `mean()` (what the figures label them)

    def categories(self) -> torch.Tensor:
        """[F, M, Ly, 6]: the effect averaged over the positions of each of ROME's categories (NaN where a
        fact has none, e.g. no middle subject token)."""
        F_, M, Ly, _ = self.effect.shape
        out = torch.full((F_, M, Ly, len(CATEGORIES)), torch.nan)
        for f, info in enumerate(self.facts):
            for c, pos in enumerate(category_positions(info["subject_positions"], info["prompt_length"])):
                if pos:
                    out[f, :, :, c] = self.effect[f, :, :, pos].mean(-1)
        return out

    def mean(self) -> torch.Tensor:
        """[M, Ly, 6]: the categories averaged over facts (facts without a category left out)."""
        return self.categories().nanmean(0)

    def save(self, path: str | Path) -> Path:
        """Tensors to PATH (.safetensors), the rest to the same name with .json (kind "positional")."""
        return self.write(path, dict(effect=self.effect, clean_p=self.clean_p, corrupted_p=self.corrupted_p),
                          dict(fact_ids=self.fact_ids, modules=list(self.modules), layers=self.layers,
                               settings=self.settings, facts=self.facts, stats=self.stats), kind=self.KIND)

    @classmethod
    def load(cls, path: str | Path) -> "PositionalTrace":
        """Read a saved positional trace, checked as a TIE trace is (`result._check_meta`,
        `result.check_stored`): its JSON, its facts' prompt lengths and subject positions, its tensors
        (float32 / float64, of the shapes the JSON names, finite where a fact has tokens, probabilities
        in [0, 1])."""
        def build(t, meta):
            if not isinstance(meta, dict) or meta.get("kind") != cls.KIND:
                raise TimeromeError(f"{path}: its kind is {meta.get('kind') if isinstance(meta, dict) else None!r}, "
                                    "not a positional trace")
            fact_ids, modules, layers, settings = _check_meta(meta, meta_path(path))
            integer(settings.get("window", 1), f"{meta_path(path)}: settings.window", lo=1)
            if not isinstance(settings.get("causal", False), bool):
                raise TimeromeError(f"{meta_path(path)}: settings.causal must be true or false, got "
                                    f"{shown(settings['causal'])} (was it edited by hand?)")
            facts = list(meta.get("facts", []))
            _check_tensors(t, fact_ids, modules, layers, facts, path)
            return cls(t["effect"], t["clean_p"], t["corrupted_p"], fact_ids, tuple(modules), layers, settings, facts,
                       dict(meta.get("stats", {})))

        return cls.read(path, "positional trace", build)


def _check_tensors(t: dict, fact_ids, modules, layers, facts, where) -> None:
    F, M, Ly = len(fact_ids), len(modules), len(layers)
    effect, corrupted = t.get("effect"), t.get("corrupted_p")
    T = effect.shape[-1] if effect is not None and effect.dim() == 4 else -1
    N = corrupted.shape[-1] if corrupted is not None and corrupted.dim() == 2 else -1
    check_stored(t, dict(effect=(F, M, Ly, T), clean_p=(F,), corrupted_p=(F, N)), "positional trace",
                 f"{F} facts, {M} modules and {Ly} layers", where)
    if len(facts) != F:
        raise TimeromeError(f"{where}: its JSON lists {len(facts)} facts' tokens for {F} fact ids (was it edited?)")
    for f, info in enumerate(facts):
        P, subject = (info.get("prompt_length"), info.get("subject_positions")) if isinstance(info, dict) else (None, None)
        if not (is_int(P) and 1 <= P <= T and isinstance(subject, list) and subject
                and all(is_int(i) and 0 <= i < P for i in subject)):
            raise TimeromeError(f"{where}: fact {f} needs a prompt_length in 1..{T} and subject_positions inside it, "
                                f"got {shown(P)} and {shown(subject)} (was its JSON edited?)")
        finite_tensor(effect[f, ..., :P], f"{where}: tensor effect (fact {f}, its {P} prompt tokens)")
    for name in ("clean_p", "corrupted_p"):
        finite_tensor(t[name], f"{where}: tensor {name}")
        if bool(((t[name] < 0) | (t[name] > 1)).any()):
            raise TimeromeError(f"{where}: tensor {name} holds values outside [0, 1]; it is a probability")


def is_positional(path: str | Path) -> bool:
    """Whether a trace file (its .json beside it) holds a positional trace."""
    meta = meta_path(path)
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("kind") == PositionalTrace.KIND
    except (OSError, ValueError, AttributeError):
        return False


def category_positions(subject: list[int], prompt_length: int) -> list[list[int]]:
    """Token positions of each of ROME's six categories (first / middle / last subject token, first
    subsequent token, further tokens, last token) for a subject spanning `subject` in a prompt."""
    b, e, last = subject[0], subject[-1] + 1, prompt_length - 1
    return [[b], list(range(b + 1, e - 1)), [e - 1], [e] if e < last else [], list(range(e + 1, last)),
            [last] if last >= e else []]


@dataclass(frozen=True)
class PositionalChoice:
    """Where the AR protocol edits: the (layer, module) of the largest mean effect in one category."""

    coordinate: Coordinate
    effect: float
    category: str

    layer = property(lambda self: self.coordinate.layer)
    module = property(lambda self: self.coordinate.point)

    @property
    def edit_coordinate(self) -> Coordinate:
        return self.coordinate

    def as_dict(self) -> dict:
        return dict(layer=self.layer, module=self.module, effect=self.effect, category=self.category)


def select_positional(result: PositionalTrace, modules=("mlp",), category: str = LAST_SUBJECT) -> PositionalChoice:
    """ROME's choice: the (layer, module) among `modules` whose mean effect (over facts) at `category`
    is largest (ROME edits the MLP at the last subject token); ties go to the lower layer."""
    if category not in CATEGORIES:
        raise TimeromeError(f"unknown category {category!r}; one of {', '.join(CATEGORIES)}")
    modules = module_names(modules, result.modules, "the positional trace")
    keep = [i for i, m in enumerate(result.modules) if m in modules]
    scores = result.mean()[keep][:, :, CATEGORIES.index(category)]  # [M', Ly]
    seen = scores[torch.isfinite(scores)]
    if not seen.numel() or not bool(seen.ne(0).any()):  # a tie-break would name layer 0
        raise TimeromeError(f"the positional trace found no effect at the {category} tokens in {', '.join(modules)} "
                            "(every mean effect 0 or NaN): no layer can be selected")
    scores = torch.nan_to_num(scores, nan=-math.inf)
    flat = int(torch.sort(scores.flatten(), descending=True, stable=True).indices[0])
    m, li = divmod(flat, scores.shape[1])
    return PositionalChoice(Coordinate(int(result.layers[li]), result.modules[keep[m]]), float(scores[m, li]), category)


# ------------------------------------------------------------------------------ the trace


def window_layers(layer: int, kind: str, n_layers: int, window: int) -> list[int]:
    """The layers whose `kind` output a restoration at `layer` sets (ROME: one block for the residual
    stream, `window` layers centred on it for attn / mlp)."""
    if kind == "resid" or window <= 1:
        return [layer]
    return list(range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2))))


def check_room(batch_size: int, n_samples: int, names=("batch_size", "n_samples")) -> None:
    """Every forward runs the clean row and the n_samples corrupted ones again, then restored ones: a batch below
    n_samples + 2 holds none. `names`: the batch size's and the samples' names as the caller's user typed them."""
    if batch_size < n_samples + 2:
        raise TimeromeError(f"{names[0]} {batch_size} leaves no room for a restored row: the positional trace runs "
                            f"the clean row and the {n_samples} corrupted ones ({names[1]}) in every forward, so "
                            f"give at least {n_samples + 2}")


def _check(backbone, facts, n_samples, sigma, window, modules, layers, batch_size, seed):
    integer(window, "window", lo=1)
    checked = check_common(backbone, facts, n_samples, sigma, modules, layers, batch_size, seed)
    check_room(batch_size, n_samples)
    return checked


@torch.no_grad()
def positional_trace(backbone=None, facts=None, *, n_samples: int = N_SAMPLES, sigma=None,
                     window: int = WINDOW, modules=HOOK_POINTS, layers=None, seed: int = 0, batch_size: int = BATCH_SIZE,
                     progress: bool = True, noise: str = TRACE.noise) -> PositionalTrace:
    """ROME's positional causal trace of `facts` (module docstring: what is computed).

    backbone: default the embedded model. facts: Fact-like objects or dicts (subject, prompt, object);
    default the embedded validation facts, as `tracing.trace`. n_samples: noise samples (ROME: 10);
    sigma: noise scale, None = 3 x the subject tokens' embedding std (a number, or another trace result
    to take its sigma: `causal_trace.given_sigma`); window: attn / mlp layers
    restored together (ROME: 10); modules / layers: what is traced (all by default); seed: every noise
    draw (the same draws as `tracing.trace` with this seed and `noise`: "in_order" or "per_fact",
    `tie.NOISE_DRAWS`); batch_size: most rows per forward.
    """
    from timerome.backbones import load_backbone

    if backbone is None:
        backbone = load_backbone()
    model_arg(backbone, "positional_trace's backbone")
    facts = default_facts() if facts is None else fact_list(facts)
    modules, layers = _check(backbone, facts, n_samples, sigma, window, modules, layers, batch_size, seed)
    items, sig, rule, noises = prepare(backbone, facts, n_samples=n_samples, sigma=sigma, seed=seed, noise=noise)
    T = max(len(it.prompt_ids) for it in items)
    effect = torch.full((len(items), len(modules), len(layers), T), torch.nan)
    clean_p, corrupted_p, infos = torch.zeros(len(items)), torch.zeros(len(items), n_samples), []
    join = rows_can_join(backbone)
    stats = dict(rows_run=0, rows_skipped=0, forwards=0)
    # a fact's work grows as its prompt's square (a restored row per position, each a forward over the prompt): the
    # bar counts facts, each advancing by its share of that work, so the time left is not read off the short ones
    work = [len(it.prompt_ids) ** 2 for it in items]
    share = [len(items) * w / sum(work) for w in work]
    share[-1] = len(items) - sum(share[:-1])  # the last one fills the bar (to the float: the sum is the bar's own)
    with progress_bar("positional trace (facts)", total=len(items), enabled=progress) as bar:
        for f, (it, draws) in enumerate(zip(items, noises)):
            eff, cp, kp, st = _trace_fact(backbone, it, draws, modules, layers, window, batch_size, join)
            effect[f, :, :, :eff.shape[-1]] = eff
            clean_p[f], corrupted_p[f] = cp, kp
            for k, v in st.items():
                stats[k] += v
            P = len(it.prompt_ids)
            infos.append(dict(it.info(), prompt_length=P,
                              tokens=[backbone.decode([i]) for i in it.prompt_ids.tolist()]))
            bar.advance(share[f])
    refuse_overflow(corrupted_p, sig, rule, clean_p, [it.fact_id for it in items], backbone.dtype)
    settings = dict(sigma=sig, sigma_rule=rule, n_samples=n_samples, window=window, seed=int(seed), noise=noise,
                    model=backbone.name, family=backbone.family.name, fingerprint=backbone.fingerprint(),
                    prompt_start=list(backbone.prompt_start),
                    causal=getattr(backbone, "causal", False),
                    readout=("next token after the prompt" if getattr(backbone, "causal", False) else
                             "first answer position of [prompt | mask * G] (one forward, answer fully masked)"),
                    measure="p(o_1) restored - p(o_1) corrupted, mean over noise samples")
    return PositionalTrace(effect, clean_p, corrupted_p, [it.fact_id for it in items], modules, layers, settings,
                           infos, stats)


def _inputs(backbone, item) -> tuple[torch.Tensor, int]:
    """The ids read by one forward and the aligned position of the object's first token."""
    P = len(item.prompt_ids)
    x = item.prompt_ids if getattr(backbone, "causal", False) else item.start(backbone.mask_id)
    return x.to(backbone.device), P


def _object_p(backbone, ids: torch.Tensor, P: int, token: int) -> torch.Tensor:
    """p(token) at aligned position P for every row of ids [B, L] -> [B] float32."""
    logits = backbone.next_logits(ids[:, :P]) if getattr(backbone, "causal", False) else backbone.logits(ids)[:, P]
    return logits.float().softmax(-1)[:, token].cpu()


def _trace_fact(backbone, item, noise, modules, layers, window, batch_size, join):
    """(effect [M, Ly, P], clean p, corrupted p [N], work counts) of one fact."""
    n_layers, N = backbone.n_layers, noise.shape[0]
    x, P = _inputs(backbone, item)
    token = int(item.object_ids[0])
    noise_rows = torch.zeros(N + 1, len(x), backbone.hidden_size, dtype=backbone.dtype, device=backbone.device)
    noise_rows[1:] = subject_noise(noise, item.subject_pos, len(x), backbone)  # row 0: the clean row
    sites = [(l, m) for m in modules for l in range(n_layers)]
    rows = Rows()

    # the clean row and the corrupted rows, every site kept: p, and which restorations change nothing
    rows.noise = noise_rows
    with Hooks(backbone, edit={(None, "embed"): add_noise(lambda: rows.noise)}), Hooks(backbone, sites) as kept:
        base_p = _object_p(backbone, x.expand(N + 1, -1), P, token)
    same = {s: (kept[s][0][1:, :P] == kept[s][0][:1, :P]).all(-1) for s in sites}  # [N, P] per site
    plan = []  # (module index, layer index, position, sample, restored sites, first block it computes)
    for mi, m in enumerate(modules):
        for li, l in enumerate(layers):
            w = window_layers(l, m, n_layers, window)
            for t in range(P):
                for s in range(N):
                    if all(bool(same[(lw, m)][s, t]) for lw in w):
                        continue  # restores nothing: the effect is exactly 0
                    plan.append((mi, li, t, s, w, (w[0] + (m == "resid")) if join else 0))
    plan.sort(key=lambda r: r[5])
    effect = torch.zeros(len(modules), len(layers), P)
    n_base = N + 1
    width = batch_size - n_base  # restored rows per forward (_check: at least 1)
    for start in range(0, len(plan), width):
        chunk = plan[start:start + width]
        p = _run_chunk(backbone, x, P, token, chunk, noise_rows, modules, rows, n_base)
        for (mi, li, t, s, _, _), pr in zip(chunk, p):
            effect[mi, li, t] += (pr - base_p[1 + s]) / N
    skipped = len(modules) * len(layers) * P * N - len(plan)
    n_forwards = 1 + math.ceil(len(plan) / width)
    return effect, base_p[0], base_p[1:], dict(rows_run=n_base * n_forwards + len(plan), rows_skipped=skipped,
                                                forwards=n_forwards)


def _run_chunk(backbone, x, P, token, chunk, noise_rows, modules, rows: Rows, n_base) -> torch.Tensor:
    """p(o_1) of each planned row of `chunk`: the clean and corrupted rows lead the batch, then the rows
    that start at the embedding (with their sample's noise), then, block by block, the joining ones."""
    first = [j for j, r in enumerate(chunk) if r[5] == 0]
    B0 = n_base + len(first)
    rows.noise = torch.cat([noise_rows, noise_rows[[1 + chunk[j][3] for j in first]]])
    where = {j: n_base + k for k, j in enumerate(first)}  # chunk index -> batch row
    rows.join, top = {}, B0
    for b in sorted({r[5] for r in chunk if r[5] > 0}):
        these = [j for j, r in enumerate(chunk) if r[5] == b]
        rows.join[b - 1] = torch.tensor([1 + chunk[j][3] for j in these], device=backbone.device)  # corrupted copies
        where.update({j: top + k for k, j in enumerate(these)})
        top += len(these)
    splice: dict = {}  # site -> (batch rows, positions)
    for j, r in enumerate(chunk):
        for l in r[4]:
            idx, pos = splice.setdefault((l, modules[r[0]]), ([], []))
            idx.append(where[j])
            pos.append(r[2])
    dev = backbone.device
    fns = {site: _restorer(torch.tensor(i, device=dev), torch.tensor(p, device=dev)) for site, (i, p) in splice.items()}
    blocks = [backbone.module(i, "resid") for i in range(backbone.n_layers)] if rows.join else []
    # the joins first: at a block's output rows join before the resid restoration there acts on them
    with Hooks(backbone, edit=joiners(blocks, rows), raw=True), \
            Hooks(backbone, edit={(None, "embed"): add_noise(lambda: rows.noise), **fns}):
        p = _object_p(backbone, x.expand(B0, -1), P, token)
    rows.join = {}
    return p[torch.tensor([where[j] for j in range(len(chunk))], dtype=torch.long)]


def _restorer(idx: torch.Tensor, pos: torch.Tensor):
    def fn(h, _state):  # h [B, L, H]: row idx[j] takes the clean row's (row 0) h at token pos[j]
        h[idx, pos] = h[0, pos]
        return h

    return fn
