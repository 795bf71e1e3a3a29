"""The likelihood skips work nobody needs without changing its value: identical rows (same prompt,
answer and mask) run once, and the vocabulary head runs only at the scored positions."""

from itertools import combinations

import pytest
import torch
from toy import ToyBackbone

from timerome.backbones import load_backbone
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.hooks import Hooks
from timerome.engine.likelihood import (exact_log_likelihood, log_likelihood, log_likelihood_batch, masked_head_applies,
                                        pair_generator, pair_masks)
from timerome.errors import TimeromeError

# short answers: La = 2 has 3 distinct masks, La = 3 has 7, so n_mc = 16 repeats most rows
PAIRS = [([3, 17, 8], [12, 40]), ([9, 4], [31]), ([3, 17, 8, 22, 5, 6, 1], [12, 40, 7]),
         ([44, 2], [12, 40]), ([3, 17, 8], [12, 40])]  # the last repeats the first pair's text
PROMPTS, ANSWERS = [p for p, _ in PAIRS], [a for _, a in PAIRS]


def every_row(model, prompts, answers, n_mc, seed):
    """The estimator with every row run: log_likelihood of each pair under its own generator."""
    return [log_likelihood(model, p, a, n_mc=n_mc, generator=pair_generator(seed, i, model.device))
            for i, (p, a) in enumerate(zip(prompts, answers))]


def test_identical_rows_run_once_and_give_the_same_value():
    model = ToyBackbone()
    n_mc, seed = 16, 4
    want = every_row(model, PROMPTS, ANSWERS, n_mc, seed)
    model.forwards.clear()
    got = log_likelihood_batch(model, PROMPTS, ANSWERS, n_mc=n_mc, generator=torch.Generator().manual_seed(seed))
    # the same value up to float32 rounding: the rows run in other batches, which a CPU BLAS may sum in another
    # order (an AMD EPYC gave 1 ulp off, 1.9e-6 at -18.5, where abs=1e-6 alone had held on the machines before)
    assert got.tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)
    # rows run: one per distinct (prompt, answer, mask), counted here from the masks themselves
    masks = pair_masks(model, [len(a) for a in ANSWERS], n_mc=n_mc, generator=torch.Generator().manual_seed(seed))
    distinct = {(tuple(p), tuple(a), tuple(m.tolist())) for p, a, ms in zip(PROMPTS, ANSWERS, masks) for m in ms}
    run = sum(rows for rows, _, _ in model.forwards)
    assert run == len(distinct)
    assert run <= 3 + 1 + 7 + 3  # the fifth pair's masks are among the first's three
    assert run < sum(len(m) for m in masks) == 4 * n_mc + 1


def test_identical_pairs_share_rows_but_keep_their_own_draws():
    model = ToyBackbone()
    got = log_likelihood_batch(model, [[3, 17, 8]] * 2, [[12, 40]] * 2, n_mc=16)
    assert sum(rows for rows, _, _ in model.forwards) == 3  # the three masks of a two-token answer
    assert got.tolist() == pytest.approx(every_row(model, [[3, 17, 8]] * 2, [[12, 40]] * 2, 16, 0), rel=1e-6, abs=1e-6)
    assert got[0] != got[1]  # own draws: other strata, other weights on the same three scores


def test_pair_masks_are_the_draws_the_estimator_weighs():
    """The masks pair_masks reports reproduce log_likelihood_batch's value when scored by hand."""
    model = ToyBackbone()
    p, a = PAIRS[2]
    (masks,) = pair_masks(model, [len(a)], n_mc=8, generator=torch.Generator().manual_seed(2))
    assert masks.shape == (8, 3) and bool(masks.any(1).all())
    rows = []
    for m in masks:
        ids = torch.tensor([p + [model.mask_id if m[j] else t for j, t in enumerate(a)]])
        logp = torch.log_softmax(model.logits(ids)[0].double(), -1)
        rows.append(len(a) / int(m.sum()) * sum(float(logp[len(p) + j, a[j]]) for j in range(3) if m[j]))
    got = log_likelihood_batch(model, [p], [a], n_mc=8, generator=torch.Generator().manual_seed(2)).item()
    assert got == pytest.approx(sum(rows) / len(rows), abs=1e-5)


# ------------------------------------------------------------------------------ the head at scored positions

FAMILIES = ["timerome", "llada", "dream", "diffullama", "llama", "gpt2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lik")
    return {f: load_backbone(make_tiny_checkpoint(f, root / f, layers=2)) for f in FAMILIES}


def _pairs(bb, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = bb.vocab_size
    ok = [t for t in range(V) if t != bb.mask_id]
    pick = lambda k: [ok[int(j)] for j in torch.randint(0, len(ok), (k,), generator=g)]
    prompts = [pick(int(k)) for k in torch.randint(0, 6, (n,), generator=g)]  # an empty prompt included
    prompts[0] = []
    if bb.causal:  # an AR model refuses an empty prompt (tested below): each gets a token
        prompts = [q or pick(1) for q in prompts]
    answers = [pick(int(k)) for k in torch.randint(1, 5, (n,), generator=g)]
    return prompts, answers


@pytest.mark.parametrize("fam", FAMILIES)
def test_masked_head_equals_the_full_logits(tiny, fam):
    """Every family, shifted (Dream, DiffuLLaMA, the causal ones) or not, with padding and an empty
    prompt: the head at the scored positions gives the full forward's value within float rounding."""
    bb = tiny[fam]
    assert masked_head_applies(bb)
    prompts, answers = _pairs(bb)
    if bb.causal:  # its first answer token would be read from its own position: refused, not a wrong number
        with pytest.raises(TimeromeError, match="the prompt is empty"):
            log_likelihood_batch(bb, [[]], answers[:1], n_mc=8)
        assert all(prompts)
    with torch.no_grad():
        full = log_likelihood_batch(bb, prompts, answers, n_mc=8, head="full", max_tokens=40)
        masked = log_likelihood_batch(bb, prompts, answers, n_mc=8, head="masked", max_tokens=40)
        assert torch.allclose(full, masked, rtol=0, atol=1e-6), (full - masked).abs().max()
        if not bb.causal:
            p, a = prompts[1], answers[1][:3]
            assert exact_log_likelihood(bb, p, a) == pytest.approx(_exact_full(bb, p, a), rel=1e-6, abs=1e-6)


def _exact_full(bb, prompt, answer):
    """exact_log_likelihood by hand from the full logits: every subset, weight 1 / (C(La, l) l)."""
    import math

    La, P, total = len(answer), len(prompt), 0.0
    for l in range(1, La + 1):
        for S in combinations(range(La), l):
            ids = torch.tensor([prompt + [bb.mask_id if j in S else t for j, t in enumerate(answer)]])
            logp = torch.log_softmax(bb.logits(ids)[0].float(), -1)
            total += sum(float(logp[P + j, answer[j]]) for j in S) / (math.comb(La, l) * l)
    return total


def test_masked_head_reads_only_the_scored_positions(tiny, monkeypatch):
    bb = tiny["llada"]
    prompts, answers = _pairs(bb, seed=3)
    seen = []
    readout = bb.readout
    monkeypatch.setattr(bb, "readout", lambda h: seen.append(tuple(h.shape)) or readout(h))
    masks = pair_masks(bb, [len(a) for a in answers], n_mc=4)
    with torch.no_grad():
        log_likelihood_batch(bb, prompts, answers, n_mc=4, head="masked", max_tokens=10_000)
    distinct = {(tuple(p), tuple(a), tuple(m.tolist())) for p, a, ms in zip(prompts, answers, masks) for m in ms}
    assert seen == [(sum(sum(m) for *_, m in distinct), bb.hidden_size)]  # one forward, [M, H]
    seen.clear()
    with torch.no_grad():
        log_likelihood_batch(bb, prompts, answers, n_mc=4, head="full")
    assert seen == []


def test_edits_still_apply_and_see_the_answer_region(tiny):
    """An edit on the last block changes both paths alike, and reads where each row's answer starts."""
    bb = tiny["llada"]
    prompts, answers = _pairs(bb, seed=5)
    starts = []

    def fn(h, state):
        starts.append(state.answer_starts.tolist())
        return h * 0.5

    out = {}
    with torch.no_grad():
        plain = log_likelihood_batch(bb, prompts, answers, n_mc=4)
        for head in ("masked", "full"):
            starts.clear()
            with Hooks(bb, edit={(bb.n_layers - 1, "resid"): fn}):
                out[head] = log_likelihood_batch(bb, prompts, answers, n_mc=4, head=head, max_tokens=10_000)
            assert len(starts) == 1 and sorted(set(starts[0])) == sorted({len(p) for p in prompts})
    assert torch.allclose(out["masked"], out["full"], atol=1e-6)
    assert not torch.allclose(out["masked"], plain, atol=1e-3)


def test_a_hook_on_the_head_keeps_the_full_forward(tiny):
    bb = tiny["llada"]
    prompts, answers = _pairs(bb, seed=6)
    head = bb.model.get_submodule(bb.family.head)
    with torch.no_grad():
        want = log_likelihood_batch(bb, prompts, answers, n_mc=4, head="full")
        with Hooks(bb, keep=[head]) as kept:
            assert not masked_head_applies(bb)
            got = log_likelihood_batch(bb, prompts, answers, n_mc=4)  # auto: the full forward
            with pytest.raises(TimeromeError, match="head='masked' needs"):
                log_likelihood_batch(bb, prompts, answers, n_mc=4, head="masked")
    assert len(kept[head]) >= 1 and kept[head][0].dim() == 3  # the hook saw [B, L, V]
    assert torch.equal(got, want)
    assert masked_head_applies(bb)


def test_head_argument_is_checked():
    model = ToyBackbone()
    assert not masked_head_applies(model)
    with pytest.raises(TimeromeError, match="head must be"):
        log_likelihood_batch(model, [[1]], [[2]], head="some")
    with pytest.raises(TimeromeError, match="head='masked' needs"):
        log_likelihood_batch(model, [[1]], [[2]], head="masked")
    assert log_likelihood_batch(model, [[1]], [[2, 3]], head="full").shape == (1,)


def test_default_draws_are_on_the_cpu_whatever_the_backbones_device():
    """A seed draws the same masks for a backbone on a GPU as on the CPU (the default generators are
    CPU ones; a GPU generator draws other numbers from the same seed, and on this CPU-only build
    asking for one raises): the estimates agree up to float rounding across devices."""
    cpu, gpu = ToyBackbone(), ToyBackbone()
    gpu.device = torch.device("cuda")  # never run here: only the draws are asked for
    lengths = [len(a) for a in ANSWERS]
    want = pair_masks(cpu, lengths, n_mc=16)
    got = pair_masks(gpu, lengths, n_mc=16)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(torch.equal(g, w) for g, w in zip(pair_masks(cpu, lengths, n_mc=16, generator=torch.Generator()
                                                            .manual_seed(0)), want))
