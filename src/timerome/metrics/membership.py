"""Membership inference: per-token scores (an MDLM's from the masked likelihood, an autoregressive
model's exact next-token ones), Min-K%, AUC and MUSE's PrivLeak.

Per-token scores. An autoregressive model scores token i of a text as log p(x_i | x_<i); an MDLM
has no left-to-right factorisation, so here token i is scored by the masked likelihood with the
rest of the text as context: the text's tokens are dealt into `groups` groups by a seeded random
permutation (group sizes differ by at most one), one forward per group hides that group's tokens
(mask token) and keeps every other token visible, and each hidden token gets

    s_i = log p(x_i | the text with i's group masked)            (nats)

groups = len(text) is the pseudo-log-likelihood (each token alone masked); the default 8 hides an
eighth of the text per forward (BERT's masked-LM hides 15 %), so a passage costs 8 forwards at
any length. `repeats` > 1 deals again with fresh permutations and averages each token's scores:
its mean over the random masks that hid it. A text follows the model's sequence start
(`Backbone.prompt_start`: DiffuLLaMA's `<s>`, nothing for most tokenizers), which is context and
never scored, and is cut to the model's context (the cut count is returned). Draws: text i uses likelihood.pair_generator(seed, i).

An autoregressive model (`backbone.causal`) is scored as MUSE and Min-K% score one: one forward of
the clean text, s_i = log p(x_i | x_<i), exact (`groups`, `repeats` and the seed are not read).
A token is scored only when something precedes it: with a sequence start every text token is, with
none (SmolLM2's tokenizer adds no BOS) the text's first token has no context and is dropped, as
MUSE's shift (logits[:-1] against tokens[1:]) drops it.

Min-K% (Shi et al. 2024, MUSE's privleak attack with k = 0.4): the mean of the k share lowest
token scores (at least one token); higher = more likely the text was trained on.
AUC: P(score of a member text > score of a non-member text) + P(tie) / 2, the Mann-Whitney
statistic: 1 = every forget text is more likely than every holdout text (memorised), 0.5 =
indistinguishable, 0 = the forget texts are the unlikely ones (over-unlearned).
PrivLeak (MUSE): with MUSE's AUC a = 1 - AUC (the convention open-unlearning documents),
privleak = (a - a_ref) / a_ref * 100, a_ref from a model retrained without the forget set: about
-100 for a model that still knows the forget set, 0 for one that behaves like the retrained model,
positive when the forget set became less likely than unseen text. Without a reference it cannot
be normalised: the raw AUC is what there is.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from timerome.common.checks import is_real
from timerome.common.progress import progress_bar
from timerome.engine.encoding import pad_sequences
from timerome.engine.likelihood import logits_at, masked_head_applies, pair_generator
from timerome.errors import TimeromeError

DEFAULT_GROUPS = 8
DEFAULT_K = 0.4  # MUSE's "Min-40%"


def _deal(n_tokens: int, groups: int, repeats: int, generator) -> list[torch.Tensor]:
    """Boolean masks [n_tokens], one per forward: each repeat deals every position into one group."""
    G = max(1, min(groups, n_tokens))
    masks = []
    for _ in range(repeats):
        perm = torch.randperm(n_tokens, generator=generator)
        for g in range(G):
            m = torch.zeros(n_tokens, dtype=torch.bool)
            m[perm[g::G]] = True
            masks.append(m)
    return masks


@torch.no_grad()
def token_scores(backbone, texts: list[str], *, groups: int = DEFAULT_GROUPS, repeats: int = 1, seed: int = 0,
                 max_tokens: int = 8192, progress: bool = False) -> tuple[list[np.ndarray], int]:
    """(per-token scores of each text in nats (module docstring), number of texts cut to the context)."""
    if groups < 1 or repeats < 1:
        raise TimeromeError(f"groups and repeats must be >= 1, got {groups} and {repeats}")
    causal = bool(getattr(backbone, "causal", False))
    # the first scored position: after the sequence start; on an autoregressive model also after a
    # token to read it from (position 0 has no context)
    S = max(len(backbone.prompt_start), 1 if causal else 0)
    whole = [backbone.encode_prompt(t) for t in texts]
    ids = [x[: backbone.max_length] for x in whole]
    cut = sum(len(x) > backbone.max_length for x in whole)
    for i, x in enumerate(ids):
        if len(x) <= len(backbone.prompt_start):
            raise TimeromeError(f"text {i} encodes to no token: there is nothing to score")
        if len(x) <= S:
            raise TimeromeError(f"text {i} encodes to one token, which an autoregressive model reads from "
                                "nothing before it: there is nothing to score")
    if causal:  # every token scored once, from the clean text
        rows = [(i, torch.ones(len(x) - S, dtype=torch.bool)) for i, x in enumerate(ids)]
        repeats = 1
    else:
        rows = [(i, m) for i, x in enumerate(ids) for m in _deal(len(x) - S, groups, repeats, pair_generator(seed, i))]
    rows.sort(key=lambda r: -len(ids[r[0]]))  # longest first: each forward pads to its first row
    sums = [np.zeros(len(x) - S) for x in ids]
    chunks, start = [], 0
    while start < len(rows):
        n = max(1, max_tokens // len(ids[rows[start][0]]))
        chunks.append(rows[start:start + n])
        start += n
    with progress_bar("token scores", total=len(chunks), enabled=progress) as bar:
        for chunk in chunks:
            clean, real = pad_sequences([ids[i] for i, _ in chunk], backbone)
            hidden = torch.zeros_like(real)
            for b, (_, m) in enumerate(chunk):
                hidden[b, S:S + len(m)] = m.to(hidden.device)
            # an autoregressive model reads token i from the clean tokens before it
            noisy = clean if causal else clean.masked_fill(hidden, backbone.mask_id)
            picked = logits_at(backbone, noisy, hidden, attention_mask=None if bool(real.all()) else real,
                               masked_head=causal and masked_head_applies(backbone))
            logp = F.log_softmax(picked.float(), dim=-1).gather(1, clean[hidden][:, None])[:, 0]
            logp = logp.double().cpu().numpy()
            at = 0
            for i, m in chunk:
                k = int(m.sum())
                sums[i][m.numpy()] += logp[at:at + k]
                at += k
            bar.advance()
    return [s / repeats for s in sums], cut


def min_k(scores, k: float = DEFAULT_K) -> float:
    """Mean of the k share lowest token scores (at least one)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if s.size == 0:
        raise TimeromeError("Min-K% of a text without tokens")
    if not 0 < k <= 1:
        raise TimeromeError(f"k must lie in (0, 1], got {k}")
    return float(s[: max(1, int(s.size * k))].mean())


def auc(members, nonmembers) -> float:
    """P(member score > non-member score) + P(tie) / 2 (Mann-Whitney U / (n1 n2))."""
    a, b = np.asarray(members, dtype=np.float64), np.asarray(nonmembers, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise TimeromeError("an AUC needs scores of both member and non-member texts")
    from scipy.stats import rankdata  # here, not at import: scipy.stats costs seconds at every command's start

    ranks = rankdata(np.concatenate([a, b]))  # ties share their mean rank
    u = ranks[: a.size].sum() - a.size * (a.size + 1) / 2
    return float(u / (a.size * b.size))


REFERENCE_WANT = ("a number in [0, 1) (the retrained model's AUC; 1 leaves MUSE's a_ref = 1 - AUC at 0, "
                  "nothing to normalise by)")


def reference_ok(value) -> bool:
    """Whether `value` can be a PrivLeak reference AUC (REFERENCE_WANT): one rule for the API, the
    experiment settings and the CLI."""
    return is_real(value) and 0 <= value < 1


def check_reference(value) -> float:
    if not reference_ok(value):
        raise TimeromeError(f"the PrivLeak reference AUC must be {REFERENCE_WANT}; got {value!r}")
    return float(value)


def privleak(auc_value: float, reference_auc: float) -> float:
    """MUSE's PrivLeak (module docstring) from this model's AUC and the retrained model's, both in
    this module's convention (1 = forget texts more likely)."""
    a, ref = 1.0 - float(auc_value), 1.0 - check_reference(reference_auc)
    return (a - ref) / ref * 100.0


def min_k_auc(backbone, members: list[str], nonmembers: list[str], *, k: float = DEFAULT_K,
              groups: int = DEFAULT_GROUPS, seed: int = 0, progress: bool = False) -> dict:
    """Min-K% scores of both text sets and their AUC, with each text's mean token score (nats/token)."""
    scores, cut = token_scores(backbone, list(members) + list(nonmembers), groups=groups, seed=seed,
                               progress=progress)
    mk = [min_k(s, k) for s in scores]
    n = len(members)
    return {"auc": auc(mk[:n], mk[n:]), "member_min_k": mk[:n], "nonmember_min_k": mk[n:],
            "member_token_lp": [float(s.mean()) for s in scores[:n]],
            "nonmember_token_lp": [float(s.mean()) for s in scores[n:]], "cut": cut, "k": k,
            "groups": None if getattr(backbone, "causal", False) else groups}  # exact next-token scores: none
