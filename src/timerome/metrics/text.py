"""Continuations of prompts, the benchmarks' common ground: their log-likelihood (nats), greedy
generation, and ROUGE-L against a reference.

Encoding is timerome's one convention (encoding.py): the prompt as written, the answer as it
follows the prompt. A pair longer than the model's context loses the start of its prompt (the
part furthest from what is scored), and the answer keeps at most `max_answer` tokens; every cut
is counted in the result, never hidden.

Generation is the sampler at temperature 0 (greedy low-confidence remasking), one token per step
(steps = gen_length, LLaDA's setting) in blocks of `block_length` (default 32, LLaDA's base-model
setting, when it divides gen_length; else one block). A model whose context cannot hold the
requested length generates at most half its context, and says so (`gen_length` in the result).
Prompts of different lengths are left-padded into one batch (padding hidden, positions counted over
real tokens), so a batch gives each prompt what it would get alone. A continuation ends at the first
special token (an MDLM fills what remains of its budget with end-of-text) and at the first stop string.
"""

from __future__ import annotations

import numpy as np
import torch

from timerome.common.progress import progress_bar
from timerome.engine.encoding import answer_ids, pad_id, uses_leading_space
from timerome.engine.likelihood import log_likelihood_batch
from timerome.engine.sampler import generate
from timerome.engine.settings import LIKELIHOOD
from timerome.errors import TimeromeError


def fit(prompt: list[int], answer: list[int], max_length: int) -> tuple[list[int], list[int], bool]:
    """(prompt, answer, cut): the answer's start first, then as much of the prompt's end as fits."""
    cut = len(answer) >= max_length
    answer = answer[: max_length - 1] if cut else answer
    room = max_length - len(answer)
    if len(prompt) > room:
        prompt, cut = prompt[len(prompt) - room:], True
    return prompt, answer, cut


def pair_logprobs(backbone, prompts: list[str], answers: list[str], *, n_mc: int = LIKELIHOOD.n_mc, seed: int = 0,
                  max_answer: int | None = None, progress: bool = False) -> dict:
    """log p(answer | prompt) per pair in nats (likelihood.py's MC estimator, draws from `seed`),
    with the answers' token counts and how many prompts were cut to fit."""
    if len(prompts) != len(answers):
        raise TimeromeError(f"got {len(prompts)} prompts but {len(answers)} answers")
    if not prompts:
        return {"lp": np.zeros(0), "len": np.zeros(0), "cut": 0}
    bpe = uses_leading_space(backbone)
    P, A, cut = [], [], 0
    for p, a in zip(prompts, answers):
        ids = answer_ids(backbone, a, bpe)[:max_answer] if max_answer else answer_ids(backbone, a, bpe)
        if not ids:
            raise TimeromeError(f"the answer {a!r} encodes to no token: there is nothing to score")
        q, ids, was_cut = fit(backbone.encode(p), ids, backbone.max_length)
        P.append(q)
        A.append(ids)
        cut += was_cut
    with torch.no_grad():
        lp = log_likelihood_batch(backbone, P, A, n_mc=n_mc, generator=torch.Generator().manual_seed(seed),
                                  progress=progress)
    return {"lp": lp.double().cpu().numpy(), "len": np.array([len(a) for a in A], dtype=np.float64), "cut": cut}


def truncated(backbone, text: str, n_tokens: int) -> str:
    """`text` as an answer, cut to its first n_tokens tokens (MUSE compares with the reference so cut)."""
    return backbone.decode(answer_ids(backbone, text)[:n_tokens]).strip()


def generation_length(backbone, gen_length: int) -> int:
    """gen_length, or half the model's context when the context cannot hold it with a prompt."""
    if gen_length < 1:
        raise TimeromeError(f"gen_length must be >= 1, got {gen_length}")
    return min(int(gen_length), backbone.max_length // 2)


@torch.no_grad()
def continuations(backbone, prompts: list[str], *, gen_length: int, block_length: int | None = None,
                  batch_size: int = 8, seed: int = 0, stops: tuple[str, ...] = (), progress: bool = False,
                  steps: int | None = None, **sampler) -> dict:
    """Continuations of prompts: {"texts", "gen_length" (used), "cut" (prompts shortened)}.

    Greedy, one token per step, by default; `steps` (default gen_length) and `sampler`
    (temperature, remasking, cache, threshold, refresh_every: sampler.generate's options) change
    that. Each batch draws from a generator seeded `seed`."""
    G = generation_length(backbone, gen_length)
    if block_length is None:
        block = 32 if G % 32 == 0 else G
    else:  # a block as long as the answer (or longer: the length was capped) is one block
        block = min(int(block_length), G)
        if G % block:  # never silently another schedule than the one asked for
            raise TimeromeError(f"block_length {block_length} does not divide the generation length {G}")
    steps = G if steps is None else int(steps)
    ids, cut = [], 0
    for p in prompts:
        q, _, was_cut = fit(backbone.encode(p), [0] * G, backbone.max_length)
        ids.append(q)
        cut += was_cut
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    specials = set(getattr(backbone.tokenizer, "all_special_ids", None) or []) - {backbone.mask_id}
    texts = [""] * len(ids)
    chunks = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    with progress_bar("generating", total=len(chunks), enabled=progress) as bar:
        for chunk in chunks:
            P = max(len(ids[i]) for i in chunk)
            prompt = torch.full((len(chunk), P), pad_id(backbone), dtype=torch.long)
            real = torch.zeros(len(chunk), P, dtype=torch.bool)
            for b, i in enumerate(chunk):
                prompt[b, P - len(ids[i]):] = torch.tensor(ids[i])
                real[b, P - len(ids[i]):] = True
            gen = torch.Generator(device=backbone.device).manual_seed(seed)
            x = generate(backbone, prompt.to(backbone.device), steps=steps, gen_length=G, block_length=block,
                         generator=gen, attention_mask=None if bool(real.all()) else real.to(backbone.device),
                         **sampler)
            for b, i in enumerate(chunk):
                out = x[b, P:].tolist()
                end = next((j for j, t in enumerate(out) if t in specials), len(out))
                texts[i] = cut_at(backbone.decode(out[:end]), stops)
            bar.advance()
    return {"texts": texts, "gen_length": G, "cut": cut}


def cut_at(text: str, stops: tuple[str, ...]) -> str:
    """The text before the first of the stop strings, stripped."""
    for s in stops:
        text = text.split(s)[0]
    return text.strip()


def rouge_l(predictions: list[str], references: list[str], stat: str = "fmeasure") -> np.ndarray:
    """ROUGE-L per pair (rouge_score, no stemming, as MUSE): stat "fmeasure" (MUSE) or "recall" (RWKU)."""
    from rouge_score import rouge_scorer

    if stat not in ("fmeasure", "recall", "precision"):
        raise TimeromeError(f"ROUGE-L statistic must be fmeasure, recall or precision, got {stat!r}")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return np.array([getattr(scorer.score(ref, pred)["rougeL"], stat) for pred, ref in zip(predictions, references)],
                    dtype=np.float64)
