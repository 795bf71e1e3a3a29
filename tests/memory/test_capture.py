"""memory/capture.py: the paper's u, v_o, v_t (and d = v_t - v_o), batched, equal to one forward each."""

import dataclasses

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.engine.encoding import encode_fact
from timerome.engine.hooks import run_to
from timerome.memory.capture import capture_facts


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def facts(bb):
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split

    facts, _ = facts_from_rows(load_split("forget01", "embedded")[:3])
    return facts


def one_by_one(bb, fact, site, target):
    """u = mean of h over the subject tokens of prompt + object; v = mean of h over the answer's tokens."""
    it = encode_fact(bb, fact, 0, target=target)
    P = len(it.prompt_ids)
    out = []
    for answer in (it.object_ids, it.target_ids):
        h = run_to(bb, site, torch.cat([it.prompt_ids, answer])[None]).double()[0]
        out.append((h[it.subject_pos].mean(0), h[P:P + len(answer)].mean(0)))
    (u, v_o), (_, v_t) = out
    return u, v_o, v_t


def test_batched_capture_equals_one_forward_per_sequence(bb, facts):
    cap = capture_facts(bb, facts, (1, "resid"), target="I don't know.", batch_size=2)
    assert cap.keys.shape == cap.v_orig.shape == cap.v_target.shape == (len(facts), bb.hidden_size)
    assert cap.keys.dtype == torch.float64
    for i, f in enumerate(facts):
        u, v_o, v_t = one_by_one(bb, f, (1, "resid"), "I don't know.")
        # batches of two round apart from lone sequences (up to 1.8e-5 on an Intel Xeon's kernels); a wrong
        # token or position moves these means by far more
        torch.testing.assert_close(cap.keys[i], u, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(cap.v_orig[i], v_o, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(cap.deltas[i], v_t - v_o, atol=1e-4, rtol=1e-5)


def test_a_facts_own_target_wins(bb, facts):
    other = facts[1].object                      # a text the embedded vocabulary encodes
    own = [dataclasses.replace(facts[0], target=other)]
    a = capture_facts(bb, own, (1, "resid"), target="I don't know.")
    b = capture_facts(bb, facts[:1], (1, "resid"), target=other)
    torch.testing.assert_close(a.v_target, b.v_target)
    torch.testing.assert_close(a.keys, b.keys)


def test_bad_input_is_one_clear_error(bb, facts):
    with pytest.raises(TimeromeError, match="empty"):
        capture_facts(bb, [], (1, "resid"))
    with pytest.raises(TimeromeError, match="batch_size"):
        capture_facts(bb, facts, (1, "resid"), batch_size=0)
    with pytest.raises(TimeromeError, match="target"):
        capture_facts(bb, facts, (1, "resid"), target=None)
