"""engine/hooks.py: keep, edit and stop in one mechanism, removed when the block ends."""

import pytest
import torch

from timerome import load_backbone
from timerome.engine.coordinate import Coordinate
from timerome.engine.hooks import Hooks, TraceState, run_to


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def ids(bb):
    return torch.tensor([bb.encode("where was the author born ?")])


def test_keep_records_one_tensor_per_forward(bb, ids):
    with torch.no_grad(), Hooks(bb, keep=[(1, "resid"), (2, "mlp")]) as tr:
        bb.logits(ids)
        bb.logits(ids[:, :3])
    assert [t.shape[1] for t in tr[(1, "resid")]] == [ids.shape[1], 3]
    assert len(tr[(2, "mlp")]) == 2
    torch.testing.assert_close(tr[(1, "resid")][0], run_to(bb, (1, "resid"), ids), rtol=0, atol=0)


def test_an_edit_changes_the_output_and_is_gone_after_the_block(bb, ids):
    with torch.no_grad():
        plain = bb.logits(ids)
        with Hooks(bb, edit={(0, "resid"): lambda h, _s: h + 1.0}):
            edited = bb.logits(ids)
        with Hooks(bb, edit={(0, "resid"): lambda h, _s: None}):  # None: unchanged
            untouched = bb.logits(ids)
        after = bb.logits(ids)
    assert not torch.allclose(edited, plain)
    assert torch.equal(untouched, plain) and torch.equal(after, plain)


def test_hooks_are_removed_when_the_body_raises(bb, ids):
    with torch.no_grad():
        plain = bb.logits(ids)
        with pytest.raises(RuntimeError, match="boom"):
            with Hooks(bb, edit={(0, "resid"): lambda h, _s: h * 0}):
                raise RuntimeError("boom")
        assert torch.equal(bb.logits(ids), plain)


def test_a_coordinate_with_a_step_edits_only_at_that_step(bb, ids):
    state, seen = TraceState(), []

    def fn(h, st):
        seen.append(st.step)
        return h

    with torch.no_grad(), Hooks(bb, edit={Coordinate(1, "resid", step=2): fn}, state=state):
        for k in range(4):
            state.step = k
            bb.logits(ids)
    assert seen == [2]


def test_stop_runs_no_layer_above_the_kept_site(bb, ids):
    with torch.no_grad(), Hooks(bb, keep=[(3, "resid")]) as above, Hooks(bb, keep=[(0, "resid")], stop=True) as tr:
        bb.logits(ids)
    assert len(tr[(0, "resid")]) == 1 and above[(3, "resid")] == []
