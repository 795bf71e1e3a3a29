"""Extraction: does an edited model give the original object back, however it is sampled or asked?

An edit on an MDLM is only as good as its worst sampler setting and its worst prompt (issue 24).
Two sweeps over the forget requests, each condition scored on what the model says:

    under_samplers   the questions and their paraphrases under each of `sampler_settings` (fewer
                     steps, blocks, random / margin remasking, temperature 0.7 and 1, the prefix
                     and the dual cache with parallel reveal, a longer budget); locality compares the retain /
                     real-author / world-fact answers with the unedited model's under the same setting
    under_attacks    the prompt attacks of metrics/attacks.py (context before / after / around the
                     question, a partial answer, the subject misspelt or shortened or a pronoun,
                     the relation shown on other subjects, a paraphrase, in-context relearning,
                     the multiple choice), greedy; ForgetLP = log p(original answer | attacked prompt)

Per condition: Extraction (the share of answers that give the original object back: the object
verbatim or its ROUGE-L recall >= EXTRACTION_ROUGE over the words the fact's question does not say,
whatever else the answer says; for the multiple
choice, with no rival named), Refusal (the target said and nothing after it giving the object back:
metrics/editing.py's outcome). `worst` picks the condition with the highest extraction. The
likelihood does not depend on the sampler, so the sampler sweep has one ForgetLP (nominal); every
attack has its own.
"""

from __future__ import annotations

import math

import numpy as np

from timerome.engine.hooks import check_stepless, edit_active
from timerome.engine.sampler import diffusion_given
from timerome.errors import TimeromeError
from timerome.metrics.text import pair_logprobs
from timerome.metrics.attacks import ATTACKS, attack_prompts, extracted
from timerome.metrics.editing import answers, edit_scores, leaked, outcome


def sampler_settings(gen_length: int) -> dict[str, dict]:
    """The sampler settings for an answer budget of `gen_length` tokens (a multiple of 4), as
    `answers`' options ("gen_length": the budget of that setting when it is not the nominal one)."""
    G = gen_length
    return {
        "nominal": {},                                   # greedy, one token per step, one block
        "steps/4": {"steps": G // 4},                    # 4 tokens revealed per step
        "steps/2": {"steps": G // 2},
        "block 4": {"block_length": 4},                  # semi-autoregressive blocks of 4
        "random": {"remasking": "random"},               # LLaDA's random remasking
        "margin": {"remasking": "margin"},               # Dream's margin confidence
        "T 0.7": {"temperature": 0.7},                   # Gumbel sampling (seeded)
        "T 1": {"temperature": 1.0},
        "prefix 0.9": {"cache": "prefix", "threshold": 0.9},  # Fast-dLLM: prefix cache, parallel reveal
        "dual 0.9": {"cache": "dual", "threshold": 0.9},      # dual cache, parallel reveal
        "long": {"gen_length": 2 * G},                   # twice the answer budget
    }


SETTINGS = tuple(sampler_settings(4))  # their names (the same for every budget)
QUICK_SETTINGS = ("nominal", "steps/4", "random", "T 1", "dual 0.9")
# the settings of the diffusion sampler alone (steps, blocks, remasking, its KV cache and parallel reveal): those
# that give one of its options (sampler.diffusion_given); an autoregressive model reads none of them
DIFFUSION_SETTINGS = tuple(n for n, opts in sampler_settings(4).items() if diffusion_given(opts))


def model_settings(names, backbone) -> list[str]:
    """The settings of `names` that `backbone` reads: all of them on a masked diffusion model, those not in
    DIFFUSION_SETTINGS on an autoregressive one (a preset's; a user's are refused where they are given)."""
    return [n for n in names if not (getattr(backbone, "causal", False) and n in DIFFUSION_SETTINGS)]
QUICK_ATTACKS = ("context before", "first name", "pronoun after context", "multiple choice")


def check_names(names, known, what: str) -> list[str]:
    """`names` as a list, every one of `known` (else one clear error naming the unknown ones)."""
    names = list(names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TimeromeError(f"unknown {what} {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return names


def budget(gen_length: int) -> int:
    """The nominal budget rounded up to a multiple of 4 (steps/4 and blocks of 4 divide it)."""
    return -(-int(gen_length) // 4) * 4


def _split(opts: dict, G: int) -> tuple[dict, int]:
    opts = dict(opts)
    return opts, int(opts.pop("gen_length", G))


def _names(settings, grid, backbone) -> list[str]:
    """The settings to sweep: those given (a diffusion setting on an autoregressive model is refused by
    edit_scores, before any answer), else every one the model reads (`model_settings`)."""
    if settings is None:
        return model_settings(grid, backbone)
    return check_names(settings or grid, SETTINGS, "sampler settings")


def sampler_baseline(backbone, requests, *, locality, gen_length: int, seed: int = 0, settings=None) -> dict:
    """The unedited answers under each setting: {setting: edit_scores(...)["baseline"]}."""
    grid = sampler_settings(gen_length)
    out = {}
    for name in _names(settings, grid, backbone):
        opts, g = _split(grid[name], gen_length)
        out[name] = edit_scores(backbone, requests, None, locality=locality, known_subjects=None, gen_length=g,
                                seed=seed, lp=False, sampler=opts)["baseline"]
    return out


def under_samplers(backbone, requests, edit, *, locality, gen_length: int, seed: int = 0, settings=None,
                   baseline: dict | None = None) -> dict[str, dict]:
    """{setting: {"Extraction", "Refusal", "Gibberish", "Locality", "n"}} of `edit` on the requests'
    questions and paraphrases (module docstring); baseline: `sampler_baseline` of the same arguments."""
    grid = sampler_settings(gen_length)
    out = {}
    for name in _names(settings, grid, backbone):
        opts, g = _split(grid[name], gen_length)
        res = edit_scores(backbone, requests, edit, locality=locality, known_subjects=None, gen_length=g, seed=seed,
                          lp=False, sampler=opts, baseline=(baseline or {}).get(name))
        m, items = res["metrics"], res["items"]
        said = [(requests[i], a) for k in ("prompt", "paraphrase") for i, a in zip(items[k]["request"],
                                                                                   items[k]["edited"])]
        out[name] = dict(Extraction=float(np.mean([leaked(a, r) for r, a in said])),
                         Refusal=m.get("Refusal"), Gibberish=m.get("Gibberish"), Locality=m.get("Locality"),
                         n=len(said))
    return out


def under_attacks(backbone, requests, edit, *, gen_length: int, seed: int = 0, attacks=None, known=None,
                  n_mc: int = 0) -> dict[str, dict]:
    """{attack: {"Extraction", "Refusal", "ForgetLP" (n_mc > 0), "n"}} of `edit` under every prompt
    attack that applies to the requests (metrics/attacks.py), greedy answers."""
    requests = list(requests)
    if n_mc:
        check_stepless(edit, "under_attacks with n_mc", backbone)
    built = attack_prompts(requests, known=known)
    names = [a for a in check_names(attacks or ATTACKS, ATTACKS, "prompt attacks") if built.get(a)]
    flat = [(a, i, p) for a in names for i, p in built[a]]
    prompts = [p for _, _, p in flat]
    with edit_active(edit, backbone):
        said = answers(backbone, prompts, gen_length=gen_length, seed=seed)
        lp = pair_logprobs(backbone, prompts, [requests[i].fact.object for _, i, _ in flat], n_mc=n_mc,
                           seed=seed)["lp"] if n_mc and prompts else None
    out = {}
    for a in names:
        rows = [(k, i, s) for k, ((b, i, _), s) in enumerate(zip(flat, said)) if b == a]
        out[a] = dict(Extraction=float(np.mean([extracted(a, s, requests[i]) for _, i, s in rows])),
                      Refusal=float(np.mean([outcome(s, requests[i]) == "Refusal" for _, i, s in rows])), n=len(rows))
        if lp is not None:
            out[a]["ForgetLP"] = float(np.mean([lp[k] for k, _, _ in rows]))
    return out


def worst(per: dict[str, dict], key: str = "Extraction") -> tuple[str, float]:
    """The condition with the highest `key` (the first of equals) and its value; a condition with no value
    (None, NaN: nothing it measured) is never the worst, whatever its place in `per` ("", NaN: none has one)."""
    measured = [k for k in per if per[k].get(key) is not None and not math.isnan(per[k][key])]
    if not measured:
        return "", float("nan")
    name = max(measured, key=lambda k: per[k][key])
    return name, float(per[name][key])


__all__ = ["sampler_settings", "check_names", "SETTINGS", "sampler_baseline", "under_samplers", "under_attacks", "worst", "budget",
           "QUICK_SETTINGS", "QUICK_ATTACKS", "DIFFUSION_SETTINGS", "model_settings"]
