"""1. Diffusion-time causal tracing: the TIE heatmaps of a set of facts (paper, "Diffusion-time causal tracing").

    result = trace(backbone, facts)        # TraceResult: TIE_bar per fact, module, layer, step
    result.save("trace.safetensors")

What is computed is defined in `timerome.tracing.tie` (the trajectory, Eq. tie, Eq. tie_agg); how it is
computed fast in `timerome.tracing.wavefront`; `naive_tie` runs the definition literally (the tests and
the benchmark compare the two). This file prepares the inputs: tokenized facts (`encode_fact`),
the noise scale sigma and every noise draw, and checks the arguments.
"""

from __future__ import annotations

import hashlib

import torch

from timerome.backbones import HOOK_POINTS, load_backbone
from timerome.backbones.backbone import model_arg
from timerome.common.checks import budget, integer, memory_budget, number
from timerome.common.checks import seed as check_seed
from timerome.common.progress import progress_bar
from timerome.data.facts import facts_from_rows
from timerome.data.tofu import load_split
from timerome.engine.encoding import encode_fact, fact_list, warn_unknown_subjects
from timerome.engine.likelihood import default_max_tokens, head_choice
from timerome.engine.settings import TRACE
from timerome.errors import DiffusionOnly, TimeromeError
from timerome.tracing.result import TraceFile, TraceResult
from timerome.tracing.tie import (NOISE_DRAWS, READOUTS, REMASKING, aggregate, later_steps, literal_tie,
                                  scored_positions)
from timerome.tracing.tie import tie as tie_of
from timerome.tracing.wavefront import (group_facts, rows_can_assemble, rows_can_join, rows_can_pack, rows_can_tile,
                                       trace_facts)

VALIDATION_SIZE = 8  # the paper traces 8 validation facts
ENGINE = 2  # in the cache key of a stored trace: bump when the same inputs give other numbers (2: stop 63,
# rows that commit the mask token read on; the positional trace's small batches)
SIGMA_FACTOR = 3.0   # "s3": sigma = 3 x std of the subject-token embeddings


@torch.no_grad()
def subject_embedding_std(backbone, facts) -> float:
    """std over all entries of the subject tokens' embedding vectors (ROME's noise scale)."""
    ids = torch.cat([f.prompt_ids[f.subject_pos] for f in facts]).to(backbone.device)
    e = backbone.embedding()(ids).float()  # [n_subject_tokens, H]
    return float(e.std()) if e.numel() > 1 else 0.0


def default_facts(n: int = VALIDATION_SIZE) -> list:
    """The embedded model's forget split (forget01), first n facts: the validation subset."""
    facts, _ = facts_from_rows(load_split("forget01", "embedded"))  # every embedded row has its author
    return facts[:n]


def refuse_causal(backbone) -> None:
    """The diffusion-time trace follows a denoising trajectory, which an autoregressive model has not."""
    if getattr(backbone, "causal", False):
        raise DiffusionOnly(f"the diffusion-time trace (TIE) is an MDLM protocol and the {backbone.family.name} model "
                            "is autoregressive: trace it with the positional trace (timerome trace --positional, "
                            "timerome.tracing.positional_trace)")


def _check(backbone, facts, steps, n_samples, sigma, tau, modules, layers, batch_size, readout, seed):
    refuse_causal(backbone)
    integer(steps, "steps", lo=1)
    number(tau, "tau (the decay rate of the later steps' weights exp(-tau (k' - k)); 0: equal weights)", lo=0)
    if readout not in READOUTS:
        raise TimeromeError(f"unknown readout {readout!r}; choose one of {', '.join(READOUTS)}")
    modules, layers = check_common(backbone, facts, n_samples, sigma, modules, layers, batch_size, seed)
    F, C = len(facts), len(modules) * len(layers)
    # a patched row at step k runs the K - k steps left: about N C K^2 / 2 rows per fact
    budget(f"tracing {F} facts over {steps} steps", F * (1 + n_samples + n_samples * C * (steps + 1) / 2) * (steps + 1),
           f"{n_samples} noise samples x {C} sites x the steps left after each of {steps} steps")
    memory_budget(f"tracing {F} facts over {steps} steps (TIE for every step pair)",
                  4 * F * C * steps * (steps + 1) * 2)
    return modules, layers


def check_common(backbone, facts, n_samples, sigma, modules, layers, batch_size, seed):
    """The arguments every trace takes, checked (one line each); returns (modules, layers) normalised."""
    check_seed(seed, "seed")
    integer(n_samples, "n_samples", lo=1)
    if isinstance(sigma, TraceFile):  # another trace's noise scale (`given_sigma`)
        number(sigma.settings.get("sigma"), "sigma (the noise scale of the trace given as sigma)", lo=0)
    else:  # 0 corrupts nothing (every TIE 0: a check of the engine, never selected)
        number(sigma, "sigma", lo=0, none=True)
    if isinstance(modules, str):
        modules = (modules,)
    modules = tuple(modules)
    bad = [m for m in modules if m not in HOOK_POINTS]
    if bad or not modules or len(set(modules)) != len(modules):
        raise TimeromeError(f"modules must be distinct names from {', '.join(HOOK_POINTS)}; got {list(modules)}")
    n = backbone.n_layers
    layers = list(range(n)) if layers is None else [layers] if isinstance(layers, int) else list(layers)
    if not layers or any(not isinstance(l, int) or isinstance(l, bool) or not -n <= l < n for l in layers):
        raise TimeromeError(f"layers must be integers in [0, {n}) (the model has {n} layers); got {layers}")
    layers = [l % n for l in layers]
    if len(set(layers)) != len(layers):
        raise TimeromeError(f"layers are repeated: {layers}")
    integer(batch_size, "batch_size (one row is the clean run)", lo=2)
    if not facts:
        raise TimeromeError("no facts to trace: give at least one (subject, prompt, object) fact")
    return modules, layers


def given_sigma(sigma) -> tuple[float, str]:
    """(sigma, its rule) of a noise scale given to a trace: a number, "fixed"; a trace result (a TraceResult
    or PositionalTrace), its own sigma, "from trace (RULE)" or "from positional trace (RULE)", RULE the
    rule that trace recorded (e.g. "s3": the scale of other facts, which the s3 rule would not give these)."""
    if isinstance(sigma, TraceFile):
        kind = "positional trace" if getattr(sigma, "KIND", None) == "positional" else "trace"
        return float(sigma.settings["sigma"]), f"from {kind} ({sigma.settings.get('sigma_rule', 'not recorded')})"
    return float(sigma), "fixed"


def refuse_overflow(corrupted: torch.Tensor, sigma: float, rule: str, clean: torch.Tensor,
                    fact_ids=(), dtype=None) -> None:
    """Refuse a trace whose clean run read non-finite values (the model itself overflows on the fact's own
    prompt: no noise or trace can help), or whose corrupted run did where the clean run did not (the noise,
    sigma `sigma`, overflowed the model): every TIE would be NaN; tracing again cannot help, a smaller sigma
    can. clean / corrupted: fact-major read-outs; fact_ids / dtype name the first fact and the model's dtype."""
    bad = ~torch.isfinite(clean).reshape(len(clean), -1).all(1)
    if bool(bad.any()):
        f = int(bad.nonzero()[0])
        which = f"fact {fact_ids[f]!r}" if f < len(fact_ids) else f"fact {f}"
        raise TimeromeError(f"the model overflows: its clean run's read-out of {which} is not finite (no noise "
                            f"added: {int(bad.sum())} of {len(bad)} facts), so every TIE would be NaN and tracing "
                            f"again fails the same way; check the model's weights"
                            + (f" or load it in float32 (it is {str(dtype).removeprefix('torch.')})"
                               if dtype in (torch.float16, torch.bfloat16) else ""))
    if not bool(torch.isfinite(corrupted).all()):
        raise TimeromeError(f"the noise overflows the model: the corrupted run's read-outs are not finite at sigma "
                            f"{sigma:g} ({rule}); give a smaller sigma (--sigma; the default s3 rule is 3 x the "
                            "subject embeddings' standard deviation)")


def noise_seed(seed: int, item) -> int:
    """The seed of one fact's own noise generator (noise "per_fact"): a digest of the trace's seed, the
    fact's prompt tokens and its subject's positions, cut to 63 bits."""
    key = f"{int(seed)}|{item.prompt_ids.tolist()}|{item.subject_pos.tolist()}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def prepare(backbone, facts, *, n_samples: int, sigma, seed: int, noise: str = TRACE.noise):
    """Tokenized facts, sigma, its rule, and each fact's noise [N, S, H] (float32, sigma applied).

    sigma: None, the s3 rule (`SIGMA_FACTOR` x `subject_embedding_std` of these facts); a number or a
    trace result (`given_sigma`).

    noise "in_order": all noise comes from one CPU generator seeded with `seed`, drawn fact by fact in
    order; "per_fact": each fact from its own CPU generator (`noise_seed`), whatever its company. Either
    way the same seed gives the same numbers on any device.
    """
    if noise not in NOISE_DRAWS:
        raise TimeromeError(f"unknown noise draw {noise!r}; choose one of {', '.join(NOISE_DRAWS)}")
    items = [encode_fact(backbone, f, i) for i, f in enumerate(facts)]
    warn_unknown_subjects(backbone, facts)  # read silently before: such subjects all trace as one token
    seen: dict[str, int] = {}
    for i, it in enumerate(items):  # a fact given twice counts twice in the mean |TIE| and in sigma's std
        if it.fact_id in seen:
            raise TimeromeError(f"facts {seen[it.fact_id]} and {i} are one fact (id {it.fact_id!r}): trace each "
                                "fact once")
        seen[it.fact_id] = i
    if sigma is None:
        sig, rule = SIGMA_FACTOR * subject_embedding_std(backbone, items), "s3"
    else:
        sig, rule = given_sigma(sigma)
    shared = torch.Generator().manual_seed(int(seed))
    noises = [sig * torch.randn(n_samples, len(it.subject_pos), backbone.hidden_size,
                                generator=shared if noise == "in_order" else
                                torch.Generator().manual_seed(noise_seed(seed, it))) for it in items]
    return items, sig, rule, noises


def trace(backbone=None, facts=None, *, steps: int = TRACE.steps, n_samples: int = TRACE.n_samples, sigma=None,
          tau: float = TRACE.tau, modules=HOOK_POINTS, layers=None, seed: int = 0, batch_size: int = TRACE.batch_size,
          readout: str = TRACE.readout, progress: bool = True, share_rows: bool = True,
          reuse_layers: bool = True, pack_splices: bool = True, assemble_mlp: bool = True, head: str = "auto",
          screen_reveal: bool = True, block_tokens: int | None = None, noise: str = TRACE.noise,
          read_positions: str = TRACE.read_positions) -> TraceResult:
    """Diffusion-time causal trace of `facts` on `backbone` (module docstring: the exact semantics).

    backbone: default the embedded model (`timerome.load_backbone()`).
    facts: Fact-like objects or dicts with subject / prompt / object (and optional fact_id);
        default the first 8 facts of the embedded forget01 split (the validation subset).
    steps: K denoising steps (one block of the object's length); sigma: noise scale, None = s3 rule
        (3 x the std of the subject-token embeddings of the facts traced: ROME takes it over its
        whole known-facts set, so here a fact's TIE depends on the facts traced with it; pass a
        number for a fixed scale, or another trace result to take its sigma, recorded as
        sigma_rule "from trace (s3)": `given_sigma`);
    tau: temporal decay of the TIE aggregation (default `TRACE.tau`); readout: "decided" or "aligned"
        (`timerome.tracing.tie`; default `TRACE.readout`); modules / layers: the sites traced (all by default);
    seed: seeds every noise draw, drawn fact by fact in the order given (another order gives other
        draws to each fact) with noise "in_order" (default), from each fact's own generator with
        noise "per_fact" (`tie.NOISE_DRAWS`: a fact's draws then do not depend on its company); batch_size: most rows per forward (memory knob; results do not
        depend on it beyond float rounding). read_positions: the answer positions log p(o | x_k) sums, "all"
        (default) or "no_subject", every one but where the answer repeats the subject's tokens (`tie.READ_POSITIONS`;
        each fact's info records the positions left out). share_rows / reuse_layers / pack_splices / assemble_mlp /
    screen_reveal: the engine's savings (`timerome.tracing.wavefront`; assemble_mlp: mlp splices above
    layer 0 summed from the block's own outputs, no packed row; screen_reveal: the sampler step's
    float32 screen, `sampler.reveal_masked`), on by default; off only to measure what they save.
    head: "masked" runs the vocabulary head at the answer positions read only, "full" everywhere;
    "auto" (default) is "masked" wherever it applies (`likelihood.masked_head_applies`). Equal up
    to float rounding.
    block_tokens: a forward's blocks run on tiles of at most this many tokens where its batch holds
    more (a batch that leaves the CPU's cache computed in pieces that fit: `hooks.row_tiles`),
    wherever the backbone gives each row the same numbers tiled (`wavefront.rows_can_tile`);
    None (default): on a CPU the likelihood's tokens per forward there (1024,
    `likelihood.default_max_tokens`), elsewhere whole batches (tiles were measured on a CPU only);
    0: whole batches. The numbers do not change.
    """
    if backbone is None:
        backbone = load_backbone()
    model_arg(backbone, "trace's backbone")
    facts = default_facts() if facts is None else fact_list(facts)
    modules, layers = _check(backbone, facts, steps, n_samples, sigma, tau, modules, layers, batch_size, readout,
                             seed)
    integer(block_tokens, "block_tokens (0: whole batches)", lo=0, none=True)
    items, sig, rule, noises = prepare(backbone, facts, n_samples=n_samples, sigma=sigma, seed=seed, noise=noise)
    scored = [scored_positions(it, read_positions) for it in items]  # refuses an unknown read_positions
    sites = [(l, m) for m in modules for l in layers]  # site c = module index * Ly + layer index
    M, Ly, K = len(modules), len(layers), steps
    ties, clean, corrupted, infos = [], [], [], []
    stats = {}
    # a joining row needs its fact's clean row and its corrupted row beside it: 3 rows at least
    reuse_layers = reuse_layers and batch_size >= 3 and rows_can_join(backbone)
    pack = reuse_layers and pack_splices and any(m != "resid" for _, m in sites) and rows_can_pack(backbone, joins=True)
    assemble = pack and assemble_mlp and any(m == "mlp" and l > 0 for l, m in sites) and rows_can_assemble(backbone, True)
    masked_head = head_choice(backbone, head)
    cpu = torch.device(backbone.device).type == "cpu"
    tokens = (default_max_tokens(backbone.device) if cpu else 0) if block_tokens is None else int(block_tokens)
    tokens = tokens if tokens > 0 and rows_can_tile(backbone) else None
    outs = [None] * len(items)
    with progress_bar("causal trace", total=len(items) * (K + 1), enabled=progress) as bar:
        # facts of one length go through the wavefront together, as many as one batch holds
        for group in group_facts(items, 1 + n_samples + len(sites) * n_samples, batch_size):
            per_fact, work = trace_facts(backbone, [items[i] for i in group], [noises[i] for i in group], sites, K,
                                         batch_size, readout, bar, share_rows=share_rows, reuse_layers=reuse_layers,
                                         pack=pack, assemble=assemble, masked_head=masked_head, screen=screen_reveal,
                                         block_tokens=tokens, scored=[scored[i] for i in group])
            for i, out in zip(group, per_fact):
                outs[i] = out
            for k, v in work.items():  # counts add up; a dict of counts adds up key by key
                if isinstance(v, dict):
                    stats[k] = {n: stats.get(k, {}).get(n, 0) + v.get(n, 0) for n in {*stats.get(k, {}), *v}}
                else:
                    stats[k] = stats.get(k, 0) + v
    for it, out, keep in zip(items, outs, scored):
        tie = tie_of(out["patched"], out["corrupted"])  # [K, C, N, K+1] vs [N, K+1] -> [K, C, K+1]
        ties.append(tie.view(K, M, Ly, K + 1).permute(1, 2, 0, 3))
        clean.append(out["clean"])
        corrupted.append(out["corrupted"])
        infos.append(dict(it.info(), clean_answer=backbone.decode(out["clean_ids"][len(it.prompt_ids):]),
                          **({} if keep is None else {"unscored_positions": (~keep).nonzero().flatten().tolist()})))
    clean, corrupted = torch.stack(clean), torch.stack(corrupted)
    refuse_overflow(corrupted, sig, rule, clean, [it.fact_id for it in items], backbone.dtype)
    tie_full = torch.stack(ties)
    # TIE is defined for k' > k only (k' = k is the patched forward's own read-out)
    tie_full = tie_full.masked_fill(~later_steps(K), torch.nan)
    settings = dict(sigma=sig, sigma_rule=rule, tau=float(tau), steps=K, n_samples=n_samples, seed=int(seed),
                    noise=noise, model=backbone.name, family=backbone.family.name, fingerprint=backbone.fingerprint(),
                    dtype=str(backbone.dtype).removeprefix("torch."), device=backbone.device.type,
                    prompt_start=list(backbone.prompt_start),
                    readout=readout, temperature=0.0, remasking=REMASKING, block_length="object length (one block)",
                    **({} if read_positions == TRACE.read_positions else {"read_positions": read_positions}))
    return TraceResult(aggregate(tie_full, tau), tie_full, clean, corrupted,
                       [it.fact_id for it in items], modules, layers, settings, infos, stats)


def naive_tie(backbone, facts, coords, *, steps: int = TRACE.steps, n_samples: int = TRACE.n_samples, sigma=None,
              tau: float = TRACE.tau, seed: int = 0, readout: str = TRACE.readout,
              noise: str = TRACE.noise, read_positions: str = TRACE.read_positions) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition run literally (`tie.literal_tie`) with the same inputs `trace` would draw.

    coords: (layer, step, module) triples. Returns (tie [F, n_coords], tie_full [F, n_coords, K + 1]).
    """
    items, _, _, noises = prepare(backbone, facts, n_samples=n_samples, sigma=sigma, seed=seed, noise=noise)
    return literal_tie(backbone, items, noises, coords, steps=steps, tau=tau, readout=readout,
                       read_positions=read_positions)
