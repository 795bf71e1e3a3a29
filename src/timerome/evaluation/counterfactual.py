"""Did a counterfactual edit take, and did it leave unrelated facts alone? Greedy answers, compared.

The one place this measurement lives (docs/ar-contrast.md, tests/backbones/test_real_model.py):

    before = greedy_ids(bb, [u.prompt for u in unrelated], [n_tokens(bb, u.object) for u in unrelated])
    edit = install("memit", bb, task)
    scores = counterfactual_scores(bb, task.facts, unrelated, before, edit=edit)   # {"efficacy", "locality", ...}
    each_edit_alone(bb, "rome", task, {}, unrelated, before)                       # ROME's protocol, mean scores

efficacy: the share of edited facts whose greedy answer starts with the fact's target (its first
len(target tokens) greedy tokens are the target's tokens); named: the share whose longer greedy answer
(NAMED_TOKENS tokens, or the target's if longer) names the target anywhere as whole words and does not
name the original object (metrics/editing.py's EfficacyNamed rule: "The capital of France is Rome."
for Rome, which the prefix test does not count); locality: the share of unrelated prompts
whose greedy answer (as many tokens as their object has) is the same token for token as the unedited
model's. Greedy = the sampler at temperature 0: left to right on an autoregressive model; on an MDLM,
one block of that length, one token revealed per step.

Beside metrics/editing.py: there Efficacy is read on the decoded answer text (the target said at a
word boundary, answers cut at end-of-text), which a model that ends its answers needs; here it is a
token prefix of a fixed length, ROME's protocol for a next-token model that never stops (SmolLM2's
completions). The two agree when the answer is exactly the target; unifying them is left open.
"""

from __future__ import annotations

import torch

from timerome.engine.encoding import answer_ids
from timerome.engine.hooks import edit_active
from timerome.engine.sampler import generate
from timerome.metrics.editing import SENTENCE_TOKENS, names

NAMED_TOKENS = SENTENCE_TOKENS  # the answer `named` reads: room for a sentence of the model's own around the target


def n_tokens(backbone, text: str) -> int:
    """How many tokens `text` has as an answer (encoding.answer_ids)."""
    return len(answer_ids(backbone, text))


@torch.no_grad()
def greedy_ids(backbone, prompts: list[str], lengths: list[int]) -> list[list[int]]:
    """The greedy answer of each prompt, lengths[i] tokens; the prompts of one answer length share one
    batched call (left-padded: a padded row decodes as it does alone)."""
    groups: dict[int, list[int]] = {}
    encoded = [backbone.encode_prompt(p) for p in prompts]
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for n, idx in groups.items():
        P = max(len(encoded[i]) for i in idx)
        ids = torch.full((len(idx), P), backbone.mask_id, dtype=torch.long)
        real = torch.zeros(len(idx), P, dtype=torch.bool)
        for b, i in enumerate(idx):
            ids[b, P - len(encoded[i]):] = torch.tensor(encoded[i])
            real[b, P - len(encoded[i]):] = True
        x = generate(backbone, ids.to(backbone.device), steps=n, gen_length=n, block_length=n,
                     attention_mask=None if bool(real.all()) else real.to(backbone.device))
        for b, i in enumerate(idx):
            out[i] = x[b, P:].tolist()
    return out


def counterfactual_scores(backbone, facts, unrelated, before: list[list[int]], *, edit=None) -> dict:
    """Efficacy on `facts` (each with its target) and locality on `unrelated` against `before` (their
    greedy answers without the edit), with `edit` active (anything with `active()`; a weight edit is
    already in the weights). Returns the two shares and the per-fact outcomes."""
    targets = [answer_ids(backbone, f.target) for f in facts]
    ctx = edit_active(edit, backbone)
    with ctx:
        got = greedy_ids(backbone, [f.prompt for f in facts], [len(t) for t in targets])
        longer = greedy_ids(backbone, [f.prompt for f in facts], [max(NAMED_TOKENS, len(t)) for t in targets])
        after = greedy_ids(backbone, [u.prompt for u in unrelated], [len(b) for b in before])
    hit = [g == t for g, t in zip(got, targets)]
    said = [backbone.decode(x) for x in longer]
    named = [names(s, f.target) and not names(s, f.object) for s, f in zip(said, facts)]
    kept = [a == b for a, b in zip(after, before)]
    return dict(efficacy=sum(hit) / max(1, len(hit)), named=sum(named) / max(1, len(named)),
                locality=sum(kept) / max(1, len(kept)), n_facts=len(hit), n_unrelated=len(kept),
                answers=[backbone.decode(g) for g in got], said=said,
                missed=[f.fact_id for f, h in zip(facts, hit) if not h],
                changed=[u.fact_id for u, k in zip(unrelated, kept) if not k])


def each_edit_alone(backbone, method: str, task, config: dict, unrelated, before, *, seed: int = 0) -> dict:
    """ROME's protocol: each fact of the task edited alone (install, `counterfactual_scores`, undo);
    the mean efficacy and locality over the facts, and each edit's."""
    from timerome.data.task import ForgetTask
    from timerome.methods import install

    per = []
    for f in task.facts:
        one = ForgetTask(task.forget_rows, [f], task.retain_rows, background=task.background)
        edit = install(method, backbone, one, config, seed=seed)
        try:
            per.append(counterfactual_scores(backbone, [f], unrelated, before, edit=edit))
        finally:
            edit.undo()
    n = max(1, len(per))
    return dict(efficacy=sum(s["efficacy"] for s in per) / n, named=sum(s["named"] for s in per) / n,
                locality=sum(s["locality"] for s in per) / n, n_facts=len(per), missed=[m for s in per for m in s["missed"]],
                changed=[sorted(s["changed"]) for s in per])
