"""engine/hooks.py: keep, edit and stop in one mechanism, removed when the block ends."""

import pytest
import torch

from timerome import load_backbone
from timerome.engine.coordinate import Coordinate
from timerome.engine.hooks import Hooks, OutsideTrajectory, TraceState, row_tiles, run_to, tile_sizes
from timerome.engine.likelihood import log_likelihood
from timerome.engine.sampler import generate


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


def test_the_sampler_publishes_its_step_to_hooks_it_was_not_handed(bb, ids):
    """An edit installed on its own (no state handed to generate, as the evaluation's generations do)
    meets its step: the step-2 edit runs once, at step 2; after the generation no step is left
    behind, and a forward of no step (a likelihood's) under it is refused, not left unedited."""
    seen, plain_seen = [], []

    def fn(h, st):
        seen.append(st.step)
        return -5 * h

    with torch.no_grad():
        plain = generate(bb, ids, steps=4, gen_length=4, block_length=4)
        with Hooks(bb, edit={Coordinate(1, "resid", step=2): fn}):
            edited = generate(bb, ids, steps=4, gen_length=4, block_length=4)
            with pytest.raises(OutsideTrajectory, match="step 2 only"):
                log_likelihood(bb, ids[0].tolist(), ids[0, :2].tolist(), n_mc=2)
        # a state handed to generate is set at each step and given back as it was
        state = TraceState()
        with Hooks(bb, edit={Coordinate(1, "resid", step=0): lambda h, st: plain_seen.append(st.step)}, state=state):
            generate(bb, ids, steps=4, gen_length=4, block_length=4, state=state)
    assert seen == [2] and plain_seen == [0]
    assert not torch.equal(plain, edited)  # the one edited step changed what was revealed
    assert state.step is None and bb.open_hooks == []


def test_every_trajectory_sets_the_step_of_open_hooks_and_gives_it_back(bb, ids):
    """The sampler, tie.run_trajectory (with a state of its own) and the trace engine all reach an
    edit they were not handed the state of; after a trajectory a tracer's own step on the same state
    stands (the step the sampler left is given back at its end, not guessed later)."""
    from timerome.tracing.causal_trace import default_facts, trace
    from timerome.tracing.tie import run_trajectory

    seen, driven = [], TraceState()
    with torch.no_grad():
        with Hooks(bb, edit={Coordinate(1, "resid", step=1): lambda h, st: seen.append(st.step)}):
            generate(bb, ids, steps=2, gen_length=2, block_length=2)
            run_trajectory(bb, ids[0], ids[0, :2], steps=2, state=TraceState())
            n = len(seen)
            trace(bb, default_facts(1), steps=2, n_samples=1, progress=False)
        assert seen[:n] == [1, 1] and len(seen) > n and set(seen) == {1}
        with Hooks(bb, edit={Coordinate(1, "resid", step=0): lambda h, st: seen.append("tracer")}, state=driven):
            generate(bb, ids, steps=1, gen_length=1, block_length=1)
            driven.step = 0  # a tracer drives the same state after the generation
            bb.logits(ids)
    assert seen[-2:] == ["tracer", "tracer"] and driven.step == 0


def test_stop_runs_no_layer_above_the_kept_site(bb, ids):
    with torch.no_grad(), Hooks(bb, keep=[(3, "resid")]) as above, Hooks(bb, keep=[(0, "resid")], stop=True) as tr:
        bb.logits(ids)
    assert len(tr[(0, "resid")]) == 1 and above[(3, "resid")] == []


def test_tile_sizes_are_few_near_equal_and_cover_the_batch():
    for batch in range(0, 60):
        for rows in (1, 2, 5, 7, 16, 64):
            sizes = tile_sizes(batch, rows)
            assert sum(sizes) == batch and max(sizes) <= rows
            assert len(sizes) == max(1, -(-batch // rows)) and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)


def test_row_tiles_runs_a_block_in_pieces_and_gives_the_whole_batch_back(bb):
    """Inside row_tiles a block runs tile by tile: the hooks inside it see each tile (state.rows),
    its own hooks the whole batch once, the numbers are the untiled ones, and the block's forward is
    its own again after the `with`, also when the body raises."""
    ids = torch.randint(5, bb.vocab_size, (7, 6), generator=torch.Generator().manual_seed(0))
    blocks = [bb.module(i, "resid") for i in range(bb.n_layers)]
    state, inner, outer = TraceState(), [], []
    with torch.no_grad():
        plain = bb.logits(ids)
        with Hooks(bb, edit={(1, "mlp"): lambda h, st: inner.append((h.shape[0], st.rows))}, state=state), \
                Hooks(bb, edit={(1, "resid"): lambda h, st: outer.append((h.shape[0], st.rows))}, state=state), \
                row_tiles(blocks, 3, state):
            tiled = bb.logits(ids)
            small = bb.logits(ids[:3])  # a batch that fits one tile runs whole
        # a CPU whose kernels give a row the same numbers in any batch gives the untiled numbers to the
        # bit; one that rounds a row by its batch's size (an Intel Xeon's MKL does, for a few rows) gives
        # them to that rounding: the engine asks (`wavefront.rows_can_tile`) before it tiles
        alone = all(torch.equal(bb.logits(ids[a:b]), plain[a:b]) for a, b in ((0, 3), (3, 5), (5, 7)))
        if alone:
            assert torch.equal(tiled, plain) and torch.equal(small, plain[:3])
        else:
            torch.testing.assert_close(tiled, plain, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(small, plain[:3], rtol=1e-5, atol=1e-4)
        assert inner == [(3, (0, 3)), (2, (3, 5)), (2, (5, 7)), (3, None)]
        assert outer == [(7, None), (3, None)] and state.rows is None
        assert all("forward" not in b.__dict__ for b in blocks)
        with pytest.raises(RuntimeError, match="boom"):
            with row_tiles(blocks, 2, state):
                raise RuntimeError("boom")
        assert all("forward" not in b.__dict__ for b in blocks) and torch.equal(bb.logits(ids), plain)
