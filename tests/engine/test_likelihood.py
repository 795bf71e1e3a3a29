"""The LLaDA Monte-Carlo likelihood against exact subset enumeration, on a tiny seeded
bidirectional transformer (padding-aware, so batching with padding can be checked)."""

import math

import pytest
import torch
import torch.nn.functional as F
from toy import MASK, ToyBackbone

from timerome.engine.likelihood import (_stratified_counts, default_max_tokens, exact_log_likelihood, log_likelihood,
                                        log_likelihood_batch, log_likelihood_samples, pair_generator, pair_masks)
from timerome.errors import TimeromeError

PROMPT = [3, 17, 8, 22, 5]


def test_one_token_answer_is_exact_and_one_forward():
    model = ToyBackbone()
    direct = F.log_softmax(model.logits(torch.tensor([PROMPT + [MASK]]))[0, len(PROMPT)], -1)[31].item()
    model.forwards.clear()
    values = [log_likelihood(model, PROMPT, [31], n_mc=n, batch_size=b, generator=torch.Generator().manual_seed(s))
              for n, b, s in [(16, 16, 0), (128, 16, 5), (3, 2, 9)]]
    assert len(model.forwards) == 3  # no sampling: one forward each
    assert values == pytest.approx([direct] * 3, rel=1e-6, abs=1e-6)
    assert exact_log_likelihood(model, PROMPT, [31]) == pytest.approx(direct, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("answer", [[12, 40], [12, 40, 7], [12, 40, 7, 26]])
def test_mc_mean_converges_to_exact_enumeration(answer):
    model = ToyBackbone()
    exact = exact_log_likelihood(model, PROMPT, answer)
    b = 16
    samples = log_likelihood_samples(model, PROMPT, answer, n_mc=4096, batch_size=b,
                                     generator=torch.Generator().manual_seed(1))
    assert samples.shape == (4096,)
    # rows of a stratum share k, so the strata (not the rows) are the independent draws
    strata = samples.view(-1, b).mean(1)
    se = strata.std().item() / math.sqrt(len(strata))
    mean = samples.mean().item()
    assert abs(mean - exact) < 4 * se, (mean, exact, se)
    assert abs(mean - exact) < 0.05 * abs(exact) + 0.05
    assert mean == pytest.approx(log_likelihood(model, PROMPT, answer, n_mc=4096, batch_size=b,
                                                generator=torch.Generator().manual_seed(1)))


def test_exact_enumeration_by_hand_for_two_tokens():
    model = ToyBackbone()
    a, P = [12, 40], len(PROMPT)

    def lp(ids, pos, tok):
        return F.log_softmax(model.logits(torch.tensor([ids]))[0, pos], -1)[tok].item()

    both = lp(PROMPT + [MASK, MASK], P, 12) + lp(PROMPT + [MASK, MASK], P + 1, 40)
    first = lp(PROMPT + [MASK, 40], P, 12)
    second = lp(PROMPT + [12, MASK], P + 1, 40)
    # l = 1: (2 / 1) * mean of the two singletons; l = 2: (2 / 2) * both; then average over l
    expected = 0.5 * (2 * 0.5 * (first + second) + both)
    assert exact_log_likelihood(model, PROMPT, a) == pytest.approx(expected, abs=1e-5)


def test_stratified_counts_are_uniform_for_every_row():
    # the reference's round-half-to-even would give row 4 of (La=2, b=16) the count 2 for both k
    for La in range(1, 7):
        for b in (1, 2, 3, 4, 7, 16):
            per_k = torch.stack([_stratified_counts(k, b, La) for k in range(1, La + 1)])  # [La, b]
            assert torch.equal(per_k.sort(0).values, torch.arange(1, La + 1)[:, None].expand(La, b))


def test_remainder_stratum():
    model = ToyBackbone()
    s = log_likelihood_samples(model, PROMPT, [12, 40, 7], n_mc=20, batch_size=16)
    assert s.shape == (20,)
    assert [f[0] for f in model.forwards] == [16, 4]


PAIRS = [([3, 17, 8], [12, 40, 7]), ([9], [31]), ([3, 17, 8, 22, 5, 6, 1], [12, 40]),
         ([44, 2], [12, 40, 7, 26, 8]), ([3, 17, 8], [12, 40, 7])]


def test_batch_equals_per_pair():
    model = ToyBackbone()
    prompts, answers = [p for p, _ in PAIRS], [a for _, a in PAIRS]
    batch = log_likelihood_batch(model, prompts, answers, n_mc=24, batch_size=8,
                                 generator=torch.Generator().manual_seed(7), max_tokens=10_000)
    assert batch.shape == (len(PAIRS),) and batch.dtype == torch.float64
    assert any(padded for *_, padded in model.forwards)
    single = [log_likelihood(model, p, a, n_mc=24, batch_size=8, generator=pair_generator(7, i))
              for i, (p, a) in enumerate(PAIRS)]
    assert batch.tolist() == pytest.approx(single, abs=1e-5)
    assert batch[0] != batch[4]  # same pair, own draws per index


def test_batch_defaults_match_log_likelihood_for_the_first_pair():
    model = ToyBackbone()
    p, a = PAIRS[0]
    assert log_likelihood_batch(model, [p], [a]).item() == pytest.approx(log_likelihood(model, p, a), abs=1e-5)


def test_forwards_hold_the_device_default_tokens_unless_told():
    """max_tokens None packs a CPU's forwards to 1024 tokens (an accelerator's to 4096)."""
    assert default_max_tokens("cpu") == 1024 and default_max_tokens("cuda") == 4096
    model = ToyBackbone()
    # 40 distinct pairs (identical ones would share their rows): 40 x (at most 7 distinct masks) rows of 6 tokens
    prompts, answers = [[3, 17, k] for k in range(40)], [[12, 40, 7]] * 40
    log_likelihood_batch(model, prompts, answers, generator=torch.Generator().manual_seed(0))
    assert max(b * length for b, length, _ in model.forwards) <= 1024 < sum(b * length for b, length, _ in model.forwards)
    model.forwards.clear()
    log_likelihood_batch(model, prompts, answers, generator=torch.Generator().manual_seed(0), max_tokens=4096)
    assert max(b * length for b, length, _ in model.forwards) > 1024


def test_padding_does_not_change_values():
    model = ToyBackbone()
    p, a = PAIRS[0]
    longer = [([1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13]), ([20] * 12, [21, 22])]
    alone = log_likelihood_batch(model, [p], [a], n_mc=32, generator=torch.Generator().manual_seed(3))
    model.forwards.clear()
    mixed = log_likelihood_batch(model, [p] + [q for q, _ in longer], [a] + [b for _, b in longer], n_mc=32,
                                 generator=torch.Generator().manual_seed(3), max_tokens=100_000)
    # one padded forward holding the distinct rows of all three pairs (identical masks run once)
    masks = pair_masks(model, [3, 4, 2], n_mc=32, generator=torch.Generator().manual_seed(3))
    assert model.forwards == [(sum(len(torch.unique(m, dim=0)) for m in masks), 14, True)]
    one_row_each = log_likelihood_batch(model, [p] + [q for q, _ in longer], [a] + [b for _, b in longer],
                                        n_mc=32, generator=torch.Generator().manual_seed(3), max_tokens=1)
    assert mixed[0].item() == pytest.approx(alone[0].item(), abs=1e-5)
    assert torch.allclose(mixed, one_row_each, atol=1e-5)


def test_deterministic():
    model = ToyBackbone()
    a = log_likelihood(model, PROMPT, [12, 40, 7])
    assert a == log_likelihood(model, PROMPT, [12, 40, 7])
    assert a == log_likelihood(model, PROMPT, [12, 40, 7], generator=torch.Generator().manual_seed(0))
    assert a != log_likelihood(model, PROMPT, [12, 40, 7], generator=torch.Generator().manual_seed(1))
    prompts, answers = [p for p, _ in PAIRS], [a for _, a in PAIRS]
    assert torch.equal(log_likelihood_batch(model, prompts, answers), log_likelihood_batch(model, prompts, answers))


def test_tensor_inputs():
    model = ToyBackbone()
    assert log_likelihood(model, torch.tensor([PROMPT]), torch.tensor([12, 40])) == log_likelihood(model, PROMPT, [12, 40])


@pytest.mark.parametrize("call,match", [
    (lambda m: log_likelihood(m, PROMPT, []), "answer is empty"),
    (lambda m: log_likelihood(m, PROMPT * 12, [1, 2, 3, 4, 5]), "exceeds the model's context"),
    (lambda m: log_likelihood(m, PROMPT, [1, 2], n_mc=0), "n_mc"),
    (lambda m: log_likelihood(m, PROMPT, [1, 2], batch_size=0), "batch_size"),
    (lambda m: log_likelihood(m, PROMPT, [1, 50]), "token ids"),
    (lambda m: log_likelihood_batch(m, [PROMPT], [[1], [2]]), "1 prompts but 2 answers"),
    (lambda m: log_likelihood_batch(m, [PROMPT, PROMPT], [[1], []]), r"empty \(pair 1\)"),
    (lambda m: exact_log_likelihood(m, PROMPT, list(range(9))), "limited to answers"),
])
def test_errors(call, match):
    with pytest.raises(TimeromeError, match=match):
        call(ToyBackbone())
