"""Continuations of prompts, the benchmarks' common ground: their log-likelihood (nats) and ROUGE-L
against a reference (their greedy generation: `engine.sampler.continuations`).

Encoding is timerome's one convention (encoding.py): the prompt as written, the answer as it
follows the prompt. A pair longer than the model's context loses the start of its prompt (the
part furthest from what is scored), and the answer keeps at most `max_answer` tokens; every cut
is counted in the result, never hidden.

Generation is `engine.sampler.continuations`, read here by the metrics: the sampler at temperature
0 (greedy low-confidence remasking), one token per step (steps = gen_length, LLaDA's setting) in
blocks of `block_length` (default 32, LLaDA's base-model setting, when it divides gen_length; else
one block), prompts left-padded into one batch, each answer ending at its first special token.
"""

from __future__ import annotations

import numpy as np
import torch

from timerome.engine.encoding import answer_ids, fit, uses_leading_space
from timerome.engine.likelihood import log_likelihood_batch
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError


def pair_logprobs(backbone, prompts: list[str], answers: list[str], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0,
                  max_answer: int | None = None, progress: bool = False) -> dict:
    """log p(answer | prompt) per pair in nats (likelihood.py's MC estimator, draws from `seed`),
    with the answers' token counts, how many pairs were cut to fit the context ("cut") and which
    ("was_cut", a bool per pair)."""
    if len(prompts) != len(answers):
        raise TimeromeError(f"got {len(prompts)} prompts but {len(answers)} answers")
    if not prompts:
        return {"lp": np.zeros(0), "len": np.zeros(0), "cut": 0, "was_cut": np.zeros(0, dtype=bool)}
    bpe = uses_leading_space(backbone)
    P, A, cut = [], [], []
    for p, a in zip(prompts, answers):
        ids = answer_ids(backbone, a, bpe)[:max_answer] if max_answer else answer_ids(backbone, a, bpe)
        if not ids:
            raise TimeromeError(f"the answer {a!r} encodes to no token: there is nothing to score")
        q, ids, was_cut = fit(backbone.encode_prompt(p), ids, backbone.max_length, len(backbone.prompt_start))
        P.append(q)
        A.append(ids)
        cut.append(was_cut)
    with torch.no_grad():
        lp = log_likelihood_batch(backbone, P, A, n_mc=n_mc, generator=torch.Generator().manual_seed(seed),
                                  progress=progress)
    return {"lp": lp.double().cpu().numpy(), "len": np.array([len(a) for a in A], dtype=np.float64),
            "cut": int(sum(cut)), "was_cut": np.array(cut, dtype=bool)}


def truncated(backbone, text: str, n_tokens: int) -> str:
    """`text` as an answer, cut to its first n_tokens tokens (MUSE compares with the reference so cut)."""
    return backbone.decode(answer_ids(backbone, text)[:n_tokens]).strip()


def rouge_l(predictions: list[str], references: list[str], stat: str = "fmeasure", stemmer: bool = False) -> np.ndarray:
    """ROUGE-L per pair (rouge_score: lower case, letters and digits only): stat "fmeasure" (MUSE) or
    "recall" (RWKU, TOFU); stemmer: Porter stemming (TOFU's `rouge_l_recall`), off as in MUSE."""
    from rouge_score import rouge_scorer

    if stat not in ("fmeasure", "recall", "precision"):
        raise TimeromeError(f"ROUGE-L statistic must be fmeasure, recall or precision, got {stat!r}")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=stemmer)
    return np.array([getattr(scorer.score(ref, pred)["rougeL"], stat) for pred, ref in zip(predictions, references)],
                    dtype=np.float64)
