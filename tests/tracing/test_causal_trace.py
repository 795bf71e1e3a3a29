"""Diffusion-time causal tracing: definition-level checks on tiny random models, and one check on
the embedded default model that the traced hot coordinate carries real signal."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from conftest import live_steps

from timerome import TimeromeError, load_backbone
from timerome.backbones.loading import DEFAULT_MODEL_DIR
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.encoding import encode_fact as tokenize_fact
from timerome.engine.hooks import Hooks, Intervention, TraceState, capture
from timerome.engine.sampler import generate
from timerome.tracing.causal_trace import naive_tie, trace
from timerome.tracing.heatmaps import plot_heatmaps, plot_per_fact
from timerome.tracing.result import TraceResult
from timerome.tracing.selection import per_fact_best, select_coordinate
from timerome.tracing.tie import aggregate, object_logprobs, run_trajectory, tie_weights
from timerome.tracing.wavefront import _plan, rows_can_assemble, rows_can_join, rows_can_pack, rows_can_tile

# every word is in the tiny checkpoints' vocabulary
FACTS = [
    dict(fact_id="born", subject="the author", prompt="where was the author born ?", object="city of books"),
    dict(fact_id="genre", subject="her first", prompt="what was her first genre ?", object="mystery poetry"),
]
FAST = dict(steps=4, n_samples=2, progress=False)


@pytest.fixture(scope="module")
def bb(tmp_path_factory):
    d = make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny") / "llada", layers=3, hidden=32)
    bb = load_backbone(d)
    # sharpen: at the init scale (std 0.02) the logits are near-uniform and no splice ever changes a
    # committed token; x5 makes trajectories depend on the subject, so patch runs really diverge
    with torch.no_grad():
        for name, p in bb.model.named_parameters():
            if "norm" not in name:
                p.mul_(5.0)
    return bb


@pytest.fixture(scope="module")
def traced(bb):
    return trace(bb, FACTS, **FAST)


# ------------------------------------------------------------------------------ the trajectory


def test_subject_positions_come_from_character_offsets(bb):
    it = tokenize_fact(bb, FACTS[0])
    assert it.subject_pos.tolist() == [2, 3]  # "where was [the author] born ?"
    assert bb.decode(it.prompt_ids[it.subject_pos]) == "the author"
    assert len(it.object_ids) == 3


def test_trajectory_is_the_samplers(bb):
    it = tokenize_fact(bb, FACTS[0])
    _, xs = run_trajectory(bb, it.prompt_ids, it.object_ids, steps=4)
    seen = []
    out = generate(bb, it.prompt_ids, steps=4, gen_length=3, block_length=3, on_step=lambda k, x: seen.append(x))
    assert torch.equal(out.cpu(), xs[-1])
    assert all(torch.equal(a.cpu(), b) for a, b in zip(seen, xs[1:]))


@pytest.mark.parametrize("readout", ["decided", "aligned"])
def test_readout_of_committed_positions(bb, readout):
    """decided: a committed position keeps the log-prob of the forward that committed it;
    aligned: every position is read from the current forward."""
    it = tokenize_fact(bb, FACTS[0])
    P, K = len(it.prompt_ids), 4
    lp, xs = run_trajectory(bb, it.prompt_ids, it.object_ids, steps=K, readout=readout)
    with torch.no_grad():
        pos = torch.stack([object_logprobs(bb.logits(x)[:, P:], it.object_ids)[0] for x in xs])  # [K+1, G]
    masked = xs[:, 0, P:] == bb.mask_id  # [K+1, G]
    for k in range(K + 1):
        if readout == "aligned":
            want = pos[k].sum()
        else:
            last_masked = torch.stack([masked[:k + 1, i].nonzero().max() for i in range(masked.shape[1])])
            want = pos[last_masked, torch.arange(masked.shape[1])].sum()
        torch.testing.assert_close(lp[0, k], want)


def test_tie_weights_decay_and_normalise():
    w = tie_weights(4, tau=0.5)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, dtype=w.dtype))
    assert float(w[0, 2] / w[0, 1]) == pytest.approx(math.exp(-0.5))
    assert torch.all(w.tril() == 0) and float(w[3, 4]) == 1.0
    full = torch.arange(20.0).view(4, 5)
    assert float(aggregate(full, 1.0)[3]) == 19.0  # the last step has one later step


def test_rows_with_the_same_future_share_one_run():
    x = np.array([[1, 5], [1, 5], [1, 6], [1, 5], [1, 5]])
    sample = np.array([0, 1, 0, 0, 0])
    at = np.array([-1, -1, 0, 0, 2])  # row 4 splices at step 2: run on its own
    run, share = _plan(x, sample, at, step=2)
    assert run.tolist() == [0, 1, 2, 4]  # row 3 (sample 0, x [1, 5], done splicing) = row 0
    assert run[share].tolist() == [0, 1, 2, 0, 4]


@pytest.mark.parametrize("seed", range(5))
def test_plan_runs_the_first_row_of_each_future(seed):
    """Against a dictionary of (sample, x) keys: each group runs its first row, every row shares its group's."""
    g = torch.Generator().manual_seed(seed)
    n, L = 60, 5
    x = torch.randint(0, 2, (n, L), generator=g).numpy()
    x[:, :2] = 9  # a prompt every row holds
    sample = torch.randint(0, 2, (n,), generator=g).numpy()
    at = torch.randint(-1, 3, (n,), generator=g).numpy()
    for share_rows in (True, False):
        run, share = _plan(x, sample, at, step=1, share=share_rows)
        first = {}
        for i in range(n):
            key = (i,) if (at[i] == 1 or not share_rows) else (int(sample[i]), *x[i].tolist())
            first.setdefault(key, i)
        want = [first[(i,) if (at[i] == 1 or not share_rows) else (int(sample[i]), *x[i].tolist())] for i in range(n)]
        assert run.tolist() == sorted(set(want))
        assert run[share].tolist() == want
        assert (len(run) < n) == share_rows  # 16 (sample, x) keys for 60 rows: sharing happens


# ------------------------------------------------------------------------------ TIE properties


def test_shapes_and_settings(bb, traced):
    r = traced
    assert r.tie.shape == (2, 3, 3, 4) and r.tie_full.shape == (2, 3, 3, 4, 5)
    assert r.clean_logp.shape == (2, 5) and r.corrupted_logp.shape == (2, 2, 5)
    assert r.fact_ids == ["born", "genre"] and r.modules == ("resid", "attn", "mlp")
    assert r.settings["sigma_rule"] == "s3" and r.settings["sigma"] > 0
    assert r.settings["fingerprint"] == bb.fingerprint()
    later = torch.arange(5)[None, :] > torch.arange(4)[:, None]
    assert torch.isnan(r.tie_full[..., ~later]).all() and not torch.isnan(r.tie_full[..., later]).any()


def test_a_sigma_taken_from_another_trace_is_recorded_as_such(bb, traced, tmp_path):
    """The neighbours' trace and --compare's TIE trace take sigma from the trace before them, and
    recorded sigma_rule "fixed": given the trace itself they record "from trace (RULE)", with the
    numbers of that sigma given as a number; a file saved with "fixed" still loads."""
    import json
    from dataclasses import replace

    from timerome.tracing.positional_trace import positional_trace

    taken = trace(bb, FACTS[1:], sigma=traced, **FAST)
    given = trace(bb, FACTS[1:], sigma=traced.settings["sigma"], **FAST)
    assert taken.settings["sigma"] == traced.settings["sigma"] and taken.settings["sigma_rule"] == "from trace (s3)"
    assert given.settings["sigma_rule"] == "fixed" and torch.equal(taken.tie, given.tie)
    assert torch.equal(taken.corrupted_logp, given.corrupted_logp)
    pos = positional_trace(bb, FACTS, n_samples=2, window=3, progress=False)
    compared = trace(bb, FACTS, sigma=pos, **FAST)
    assert compared.settings["sigma_rule"] == "from positional trace (s3)"
    assert compared.settings["sigma"] == pos.settings["sigma"]
    path = taken.save(tmp_path / "neighbours")
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps(dict(meta, settings=dict(meta["settings"], sigma_rule="fixed"))))
    back = TraceResult.load(path)  # as files saved before
    assert back.settings["sigma_rule"] == "fixed" and torch.equal(back.tie, taken.tie)
    with pytest.raises(TimeromeError, match="noise scale of the trace given as sigma"):
        trace(bb, FACTS[:1], sigma=replace(traced, settings={}), **FAST)


def test_tie_vanishes_where_a_splice_cannot_act(traced):
    """The last layer's subject states feed only their own (prompt) logits; and a step that reveals
    nothing decides nothing: with K = 4, "born" (3 object tokens) reveals one token at steps 0-2 and
    none at step 3, "genre" (2 tokens) none at steps 2-3."""
    assert torch.equal(traced.tie[:, :, -1], torch.zeros_like(traced.tie[:, :, -1]))
    assert torch.equal(traced.tie[:, ..., 3], torch.zeros_like(traced.tie[:, ..., 3]))
    assert torch.equal(traced.tie[1, ..., 2], torch.zeros_like(traced.tie[1, ..., 2]))
    assert traced.tie[:, :, :-1, :2].abs().max() > 0.1


@pytest.mark.parametrize("batch_size", [256, 7])
def test_sigma_zero_gives_exactly_zero_tie(bb, batch_size):
    r = trace(bb, FACTS, sigma=0.0, batch_size=batch_size, **FAST)
    assert torch.equal(r.tie, torch.zeros_like(r.tie))
    assert torch.equal(torch.nan_to_num(r.tie_full), torch.zeros_like(r.tie_full))
    assert torch.equal(r.corrupted_logp, r.clean_logp[:, None].expand_as(r.corrupted_logp))


@pytest.mark.parametrize("readout", ["decided", "aligned"])
def test_fast_equals_naive(bb, traced, readout):
    if readout != "decided":
        traced = trace(bb, FACTS, readout=readout, **FAST)
    coords = [(l, k, m) for m in traced.modules for l in range(bb.n_layers) for k in range(4)]
    tie, full = naive_tie(bb, FACTS, coords, steps=4, n_samples=2, readout=readout)
    for c, (l, k, m) in enumerate(coords):
        mi = traced.modules.index(m)
        torch.testing.assert_close(traced.tie[:, mi, l, k], tie[:, c], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(traced.tie_full[:, mi, l, k], full[:, c], atol=1e-5, rtol=1e-4, equal_nan=True)
    assert traced.tie.abs().max() > 0.1  # not a vacuous match
    # not every patch run folded back into its corrupted run (that would cost exactly this many rows:
    # at each step a fact still reads, its clean row, 2 corrupted rows and the 9 x 2 splicing rows)
    if readout == "decided":
        assert traced.stats["rows_run"] > sum(live_steps(bb, f) * (1 + 2 + 9 * 2) for f in FACTS)
    else:  # "aligned" reads every answer position at every step: all K + 1 forwards run
        assert traced.stats["rows_run"] > 2 * (4 * (1 + 2 + 9 * 2) + 1 + 2)


@pytest.mark.parametrize("family", ["dream", "llada", "mmada", "llada-moe", "diffullama"])
def test_fast_equals_naive_on_every_family(tmp_path, family):
    """A row may commit the mask token itself (the argmax does not exclude it, as in LLaDA's sampler):
    that position stays masked and is read again. The engine stopped a fact's rows once its clean row
    was done, so on a tiny Dream model it read 0.016 off the literal TIE (helper 45, stop 63)."""
    model = load_backbone(make_tiny_checkpoint(family, tmp_path / family, layers=2, hidden=32))
    with torch.no_grad():  # sharpened as `bb` is, so that the corrupted and patched runs diverge
        for name, p in model.model.named_parameters():
            if "norm" not in name:
                p.mul_(5.0)
    r = trace(model, FACTS, steps=3, n_samples=2, progress=False)
    coords = [(l, k, m) for m in r.modules for l in range(model.n_layers) for k in range(3)]
    tie, _ = naive_tie(model, FACTS, coords, steps=3, n_samples=2)
    for c, (l, k, m) in enumerate(coords):
        torch.testing.assert_close(r.tie[:, r.modules.index(m), l, k], tie[:, c], atol=1e-5, rtol=1e-4)
    assert r.tie.abs().max() > 0.05  # not a vacuous match


def test_chunked_batches_and_unshared_rows_give_the_same_tie(bb, traced):
    r = trace(bb, FACTS, batch_size=5, **FAST)
    torch.testing.assert_close(r.tie, traced.tie, atol=1e-5, rtol=1e-4)
    r = trace(bb, FACTS, share_rows=False, **FAST)  # every row runs every step
    torch.testing.assert_close(r.tie, traced.tie, atol=1e-5, rtol=1e-4)
    # each row runs at every step its fact still reads: "born" (3 object tokens) steps 0-2, "genre" 0-1
    assert [live_steps(bb, f) for f in FACTS] == [3, 2]
    assert r.stats["rows_run"] == sum((1 + 2) * n + 9 * 2 * sum(j + 1 for j in range(n))
                                      for n in (live_steps(bb, f) for f in FACTS))


@pytest.mark.parametrize("batch_size", [256, 5])
def test_layer_reuse_changes_no_tie(bb, traced, batch_size):
    """Splicing rows that take blocks 0..l-1 from their corrupted row give the same TIE, bit for bit
    on CPU (each row's arithmetic does not depend on what else is in the batch)."""
    import inspect

    assert inspect.signature(trace).parameters["reuse_layers"].default is True
    on = traced if batch_size == 256 else trace(bb, FACTS, batch_size=batch_size, **FAST)
    off = trace(bb, FACTS, batch_size=batch_size, reuse_layers=False, **FAST)
    torch.testing.assert_close(on.tie_full, off.tie_full, atol=1e-5, rtol=0, equal_nan=True)
    assert torch.equal(on.clean_logp, off.clean_logp) and torch.equal(on.corrupted_logp, off.corrupted_logp)
    assert on.stats["block_rows"] < off.stats["block_rows"]  # it did skip work


# two pairs of facts of one length each (prompt + object tokens): 6 + 3 and 7 + 2; 8 + 3 twice,
# with subjects of 2 and 1 tokens
SAME_LENGTH = [
    dict(fact_id="born", subject="the author", prompt="where was the author born ?", object="city of books"),
    dict(fact_id="win", subject="his first", prompt="what did his first novels win ?", object="award prize"),
    dict(fact_id="prize", subject="the author", prompt="what prize did the author win first ?", object="poetry award prize"),
    dict(fact_id="genre", subject="his", prompt="what genre did his novels write about ?", object="sea rain night"),
]


@pytest.mark.parametrize("readout", ["decided", "aligned"])
def test_facts_of_one_length_traced_together_match_each_alone_and_the_definition(bb, readout):
    """Facts of one length share the wavefront's forwards (each its own clean row, answer region,
    subject and reveal budget): the numbers are those of each fact traced alone, and the definition's."""
    together = trace(bb, SAME_LENGTH, readout=readout, **FAST)
    # batch_size 20 holds less than one fact's rows of a step (1 + 2 + 9 * 2): no two facts go together
    alone = trace(bb, SAME_LENGTH, readout=readout, batch_size=20, **FAST)
    # bit for bit on CPU: a row's arithmetic does not depend on the rest of its batch
    assert torch.equal(together.tie_full.nan_to_num(), alone.tie_full.nan_to_num())
    assert torch.equal(together.corrupted_logp, alone.corrupted_logp)
    assert torch.equal(together.clean_logp, alone.clean_logp)
    assert [f["clean_answer"] for f in together.facts] == [f["clean_answer"] for f in alone.facts]
    # one forward per step that a fact of the group still reads (the aligned read-out reads all K + 1)
    per_group = [max(live_steps(bb, f) for f in SAME_LENGTH[:2]), max(live_steps(bb, f) for f in SAME_LENGTH[2:])]
    assert together.stats["forwards"] == (sum(per_group) if readout == "decided" else 2 * (4 + 1))
    assert together.stats["forwards"] < alone.stats["forwards"]
    assert together.stats["min_block_rows"] == alone.stats["min_block_rows"]
    assert together.tie.abs().max() > 0.1
    coords = [(l, k, m) for m in ("resid", "mlp") for l in (0, bb.n_layers - 1) for k in (0, 2)]
    tie, _ = naive_tie(bb, SAME_LENGTH, coords, steps=4, n_samples=2, readout=readout)
    for c, (l, k, m) in enumerate(coords):
        torch.testing.assert_close(together.tie[:, together.modules.index(m), l, k], tie[:, c], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("batch_size", [2, 3, 7, 42])  # 42: two facts a group, cut in chunks
def test_grouped_facts_cut_into_chunks_give_the_same_tie(bb, batch_size):
    """Chunks of a grouped step each carry the clean rows of their facts and the corrupted rows their
    joining rows copy; no chunk exceeds batch_size rows."""
    whole = trace(bb, SAME_LENGTH, **FAST)
    seen = []
    with Hooks(bb, edit={(bb.n_layers - 1, "resid"): lambda h, _state: seen.append(h.shape[0])}):
        r = trace(bb, SAME_LENGTH, batch_size=batch_size, **FAST)
    torch.testing.assert_close(r.tie_full, whole.tie_full, atol=1e-5, rtol=1e-4, equal_nan=True)
    seen = seen[-r.stats["forwards"]:]  # the trace's own forwards (the first are the engine's checks)
    assert max(seen) <= batch_size and r.stats["forwards"] > whole.stats["forwards"]


def test_layer_reuse_really_skips_the_lower_blocks(bb):
    """Rows that splice above layer 0 join the batch above block 0: one forward per step, in which
    block 0 computes fewer rows than the top block (which sees every row of the step but those that
    splice the top block's output: they join after it)."""
    top = bb.n_layers - 1
    seen = {0: [], top: []}  # rows each block's attention computes, per forward (observers: edit nothing)
    with Hooks(bb, edit={(0, "attn"): lambda h, _state: seen[0].append(h.shape[0]),
                         (top, "attn"): lambda h, _state: seen[top].append(h.shape[0])}):
        r = trace(bb, FACTS[:1], pack_splices=False, **FAST)
    n = r.stats["forwards"]
    assert n == live_steps(bb, FACTS[0])  # one per step read (the first entries are `rows_can_join`'s check)
    lower, upper = seen[0][-n:], seen[top][-n:]
    assert all(lo <= up for lo, up in zip(lower, upper)) and sum(lower) < sum(upper) <= r.stats["rows_run"]


def test_rows_join_only_where_the_blocks_take_a_grown_batch(bb, monkeypatch):
    """A backbone whose blocks take a per-row mask cannot grow its batch mid-forward: the check says
    so, and the trace then runs every row from the embedding (the same numbers, more work)."""
    assert rows_can_join(bb)
    on = trace(bb, FACTS[:1], **FAST)
    monkeypatch.setattr(bb, "forward_kwargs", lambda ids, keys: {"attention_mask": torch.ones_like(ids, dtype=torch.bool)})
    assert not rows_can_join(bb)
    r = trace(bb, FACTS[:1], **FAST)
    off = trace(bb, FACTS[:1], reuse_layers=False, **FAST)
    assert r.stats == off.stats and r.stats["block_rows"] > on.stats["block_rows"]
    torch.testing.assert_close(r.tie_full, on.tie_full, atol=1e-5, rtol=0, equal_nan=True)


def test_rows_join_where_a_batch_of_another_size_rounds_otherwise(bb, monkeypatch):
    """On a GPU a row's logits move with the number of rows beside it (other kernels, other rounding):
    by 0.12 of a largest 6.2 at LLaDA-8B's shapes in bfloat16 on an H200, where the 1e-3 tolerance
    alone refused joins and the trace ran every row through every block (1.92x the row-blocks it
    needs). Stood in for here by an offset that grows with the batch at block 1's output: joins are
    taken within the model's own spread (refused without it); a regrown batch that is wrong by more
    than that spread is still refused, and so is a widened tolerance under which the probe's two rows
    look alike (it could not see a wrong join)."""
    import timerome.tracing.wavefront as wavefront

    try:
        by_batch = {(1, "resid"): lambda h, _state: h + 1e-3 * h.shape[0]}  # spread 0.14 of a largest 8.3
        with Hooks(bb, edit=by_batch):
            assert rows_can_join(bb)
            monkeypatch.setattr(wavefront, "_join_spread", lambda b, ids, want: 0.0)  # the check before the spread
            bb.engine_checks.clear()
            assert not rows_can_join(bb)
            monkeypatch.undo()
            real = wavefront.joiners

            def swapped(blocks, rows):  # the copies appended as rows 1, 0 instead of 0, 1
                rows.join = {k: v.flip(0) for k, v in rows.join.items()}
                return real(blocks, rows)

            monkeypatch.setattr(wavefront, "joiners", swapped)
            bb.engine_checks.clear()
            assert not rows_can_join(bb)
            monkeypatch.undo()
        # rows made alike above block 0 (each the batch's mean): a widened tolerance that cannot tell the
        # probe's rows apart could not see a wrong join either, so the answer is no
        alike = {(1, "resid"): lambda h, _state: h.mean(0, keepdim=True).expand_as(h) + 1e-3 * h.shape[0]}
        with Hooks(bb, edit=alike):
            assert not rows_can_join(bb)
    finally:
        bb.engine_checks.clear()  # answers kept under this test's hooks: none outlives it


def test_the_engine_checks_are_asked_once_per_forward_state(bb, monkeypatch):
    """rows_can_join / rows_can_pack run their probe forwards once while what a forward runs stays
    the same, and again when a hook is added or a backbone method patched (each such state once)."""
    import timerome.tracing.wavefront as wavefront

    calls = []
    for name in ("_rows_can_join", "_rows_can_pack"):
        real = getattr(wavefront, name)
        monkeypatch.setattr(wavefront, name, lambda b, real=real, name=name: calls.append(name) or real(b))
    bb.engine_checks.clear()
    assert rows_can_join(bb) and rows_can_pack(bb) and rows_can_join(bb) and rows_can_pack(bb)
    assert calls == ["_rows_can_join", "_rows_can_pack"]
    trace(bb, FACTS[:1], **FAST)
    assert len(calls) == 2  # the trace asked too: answered from the memo
    with Hooks(bb, edit={(0, "mlp"): lambda h, _state: None}):  # a hook in the forward: asked again
        assert rows_can_join(bb) and rows_can_join(bb)
    assert calls.count("_rows_can_join") == 2
    assert rows_can_join(bb) and calls.count("_rows_can_join") == 2  # the hook gone: the first answer
    monkeypatch.setattr(bb, "forward_kwargs", lambda ids, keys: {"attention_mask": torch.ones_like(ids, dtype=torch.bool)})
    assert not rows_can_join(bb) and calls.count("_rows_can_join") == 3


@pytest.mark.parametrize("batch_size", [256, 7])
@pytest.mark.parametrize("readout", ["decided", "aligned"])
def test_packed_splices_the_masked_head_and_the_screen_change_no_number(bb, batch_size, readout):
    """attn / mlp splices that run their layer at the subject tokens only (packed rows), the head
    run at the positions read only and the sampler's float32 screen give the same TIE, clean and
    corrupted log p, bit for bit on CPU, and the first two compute less."""
    assert rows_can_pack(bb) and rows_can_assemble(bb)
    kw = dict(FAST, batch_size=batch_size, readout=readout)
    on = trace(bb, SAME_LENGTH, **kw)
    variants = [trace(bb, SAME_LENGTH, pack_splices=False, **kw), trace(bb, SAME_LENGTH, head="full", **kw),
                trace(bb, SAME_LENGTH, head="masked", pack_splices=False, **kw),
                trace(bb, SAME_LENGTH, screen_reveal=False, **kw),  # the sampler's float64 softmax everywhere
                trace(bb, SAME_LENGTH, assemble_mlp=False, **kw)]   # every mlp splice in packed rows
    for off in variants:
        assert torch.equal(on.tie_full.nan_to_num(), off.tie_full.nan_to_num())
        assert torch.equal(on.clean_logp, off.clean_logp) and torch.equal(on.corrupted_logp, off.corrupted_logp)
    assert on.tie.abs().max() > 0.1
    assert on.stats["block_rows"] < variants[0].stats["block_rows"]  # packing skipped work
    assert on.stats["head_positions"] < variants[1].stats["head_positions"]  # so did the masked head
    assert on.stats["block_rows"] < variants[4].stats["block_rows"] < variants[0].stats["block_rows"]  # and assembling
    # the floor is the definition's, whatever the engine does
    assert len({r.stats["min_block_rows"] for r in (on, *variants)}) == 1
    assert len({r.stats["min_head_positions"] for r in (on, *variants)}) == 1
    assert on.stats["head_positions"] >= on.stats["min_head_positions"]


def test_rows_pack_only_where_the_rest_of_a_block_acts_on_each_position_alone(bb):
    """A block whose MLP output depends on the position cannot compute a subject token in a packed
    row's slot: the check says so, and the trace then splices attn / mlp in full rows."""
    ramp = lambda h, _state: h + 0.05 * torch.arange(h.shape[1], dtype=h.dtype)[None, :, None]  # noqa: E731
    with Hooks(bb, edit={(0, "mlp"): ramp}):
        assert not rows_can_pack(bb)
        r = trace(bb, FACTS[:1], **FAST)
        off = trace(bb, FACTS[:1], pack_splices=False, **FAST)
    assert r.stats == off.stats
    torch.testing.assert_close(r.tie_full, off.tie_full, atol=0, rtol=0, equal_nan=True)


def test_mlp_splices_assemble_only_where_a_block_sums_input_attention_and_mlp(bb, monkeypatch):
    """An mlp splice above layer 0 takes its subject tokens from (input + attention output) + MLP
    output only where the block computes exactly that: a block that adds anything more makes the
    check say no, and the trace then packs every mlp splice (the same numbers as assemble_mlp=False)."""
    assert rows_can_assemble(bb)
    block = bb.module(1, "resid")
    real = block.forward

    def leaky(x, *args, **kwargs):  # the block's output plus a sliver of its input: not the sum of its parts
        out, cache = real(x, *args, **kwargs)
        return out + 1e-3 * x, cache

    monkeypatch.setattr(block, "forward", leaky)  # a forward set on a module: the checks ask again
    assert rows_can_pack(bb) and not rows_can_assemble(bb)
    r = trace(bb, SAME_LENGTH[:1], **FAST)
    off = trace(bb, SAME_LENGTH[:1], assemble_mlp=False, **FAST)
    assert r.stats == off.stats
    assert torch.equal(r.tie_full.nan_to_num(), off.tie_full.nan_to_num())
    monkeypatch.undo()
    assert rows_can_assemble(bb)  # the block as it was: the first answer


@pytest.mark.parametrize("pack", [True, False])
def test_blocks_run_in_tiles_change_no_number(bb, pack):
    """A forward's blocks run on tiles of at most block_tokens tokens (the packed rows' and the
    splices' sources kept across tiles): TIE, clean and corrupted log p are the whole batches', bit
    for bit on CPU, with the same rows computed; every block call holds at most a tile."""
    assert rows_can_tile(bb)
    kw = dict(FAST, pack_splices=pack)
    whole = trace(bb, SAME_LENGTH, block_tokens=0, **kw)
    L = len(tokenize_fact(bb, SAME_LENGTH[0]).prompt_ids) + len(tokenize_fact(bb, SAME_LENGTH[0]).object_ids)
    for tokens in (1, 3 * L, 10 * L):
        r = trace(bb, SAME_LENGTH, block_tokens=tokens, **kw)
        assert torch.equal(r.tie_full.nan_to_num(), whole.tie_full.nan_to_num())
        assert torch.equal(r.clean_logp, whole.clean_logp) and torch.equal(r.corrupted_logp, whole.corrupted_logp)
        assert r.stats["block_rows"] == whole.stats["block_rows"] and r.stats["forwards"] == whole.stats["forwards"]
        calls = [(n, b) for key, b in r.stats["block_batches"].items() for n in [int(key.split("x")[1])]]
        assert max(n for n, _ in calls) <= max(1, tokens // L)
        assert sum(n * b for n, b in calls) == r.stats["block_rows"]
    assert max(int(k.split("x")[1]) for k in whole.stats["block_batches"]) > 10
    assert whole.tie.abs().max() > 0.1


@pytest.mark.parametrize("batch_size, block_tokens", [(256, 0), (7, 0), (256, 30)])
def test_index_arrays_sent_in_one_staged_copy_change_no_number(bb, monkeypatch, batch_size, block_tokens):
    """Off the CPU a forward's index arrays travel in one int64 copy (`wavefront._Staging`); the same
    path forced here on the CPU gives the TIE, clean and corrupted log p bit for bit, with packed and
    assembled splices, chunks and tiles, and stages exactly the arrays the direct path makes."""
    from timerome.tracing import wavefront

    kw = dict(FAST, batch_size=batch_size, block_tokens=block_tokens)
    direct = trace(bb, SAME_LENGTH, **kw)
    staged = []

    class Deferred(wavefront._Staging):
        def __init__(self, device, defer=None):
            super().__init__(device, defer=True)
            staged.append(self)

    monkeypatch.setattr(wavefront, "_Staging", Deferred)
    r = trace(bb, SAME_LENGTH, **kw)
    assert torch.equal(r.tie_full.nan_to_num(), direct.tie_full.nan_to_num()) and direct.tie.abs().max() > 0.1
    assert torch.equal(r.clean_logp, direct.clean_logp) and torch.equal(r.corrupted_logp, direct.corrupted_logp)
    assert r.stats == direct.stats
    assert len(staged) == r.stats["forwards"] and all(s.sent is not None for s in staged)
    assert all(t.dtype == torch.int64 for s in staged for t in s.sent)
    for bad in (np.zeros(3, dtype=bool), np.zeros((2, 3), dtype=np.int64)):
        with pytest.raises(TypeError, match="flat integers"):
            Deferred(torch.device("cpu"))(bad)


def test_blocks_tile_by_default_at_the_devices_tokens_per_forward(bb, monkeypatch):
    """block_tokens=None takes the likelihood's tokens per forward on a CPU (here made small)."""
    import timerome.tracing.causal_trace as ct

    L = len(tokenize_fact(bb, FACTS[0]).prompt_ids) + len(tokenize_fact(bb, FACTS[0]).object_ids)
    monkeypatch.setattr(ct, "default_max_tokens", lambda device: 2 * L)
    r = trace(bb, FACTS[:1], **FAST)
    assert max(int(k.split("x")[1]) for k in r.stats["block_batches"]) == 2
    whole = trace(bb, FACTS[:1], block_tokens=0, **FAST)
    assert max(int(k.split("x")[1]) for k in whole.stats["block_batches"]) > 2
    assert torch.equal(r.tie_full.nan_to_num(), whole.tie_full.nan_to_num())


def test_blocks_tile_only_where_rows_keep_their_numbers(bb, monkeypatch):
    """A backbone whose blocks take a per-row mask cannot run a tile of the batch: the check says
    so, and the trace runs whole batches (the same numbers)."""
    monkeypatch.setattr(bb, "forward_kwargs", lambda ids, keys: {"attention_mask": torch.ones_like(ids, dtype=torch.bool)})
    assert not rows_can_tile(bb)
    r = trace(bb, FACTS[:1], block_tokens=1, **FAST)
    whole = trace(bb, FACTS[:1], block_tokens=0, **FAST)
    assert r.stats == whole.stats and max(int(k.split("x")[1]) for k in r.stats["block_batches"]) > 1
    assert torch.equal(r.tie_full.nan_to_num(), whole.tie_full.nan_to_num())


def test_a_fact_whose_answer_is_committed_runs_no_more_forwards(bb):
    """With the "decided" read-out, once every answer token of a fact is committed nothing is read:
    its rows stop (the last scoring forward included), and the log p stays what it was."""
    r = trace(bb, FACTS[1:], **FAST)  # "genre": 2 object tokens, all committed after step 1
    assert r.stats["forwards"] == live_steps(bb, FACTS[1]) == 2
    assert torch.equal(r.clean_logp[0, 2:], r.clean_logp[0, 2].expand(3))
    assert torch.equal(r.corrupted_logp[0, :, 2:], r.corrupted_logp[0, :, 2:3].expand(-1, 3))
    aligned = trace(bb, FACTS[1:], readout="aligned", **FAST)
    assert aligned.stats["forwards"] == 4 + 1  # "aligned" reads every answer position at every step


def test_head_choice_is_checked(bb):
    with pytest.raises(TimeromeError, match="head must be"):
        trace(bb, FACTS[:1], head="vocab", **FAST)


def test_restoring_a_whole_layer_restores_the_clean_run(bb):
    """resid of layer l at ALL positions at EVERY step from the clean run: everything above l, hence
    every commit and every log p, is the clean run's, bit for bit."""
    it = tokenize_fact(bb, FACTS[0])
    l, K = 1, 4
    state = TraceState()
    with capture(bb, [(l, "resid")], state) as store:
        clean, clean_xs = run_trajectory(bb, it.prompt_ids, it.object_ids, steps=K, state=state)
    eps = 5.0 * torch.randn(len(it.subject_pos), bb.hidden_size, generator=torch.Generator().manual_seed(0))

    def noise(h, _st):
        out = h.clone()
        out[:, it.subject_pos] += eps
        return out

    with Intervention(bb, {(None, "embed"): noise}, state):
        corrupted, _ = run_trajectory(bb, it.prompt_ids, it.object_ids, steps=K, state=state)
        with Intervention(bb, {(l, "resid"): lambda h, st: store[(l, "resid")][st.step]}, state):
            restored, restored_xs = run_trajectory(bb, it.prompt_ids, it.object_ids, steps=K, state=state)
    assert not torch.equal(corrupted, clean)  # the noise matters ...
    assert torch.equal(restored, clean)       # ... and the restored layer undoes all of it
    assert torch.equal(restored_xs, clean_xs)


def test_reproducible_by_seed(bb, traced, tmp_path):
    again = trace(bb, FACTS, **FAST)
    assert torch.equal(again.tie, traced.tie)
    a = plot_heatmaps(traced, tmp_path / "a.png").read_bytes()
    b = plot_heatmaps(again, tmp_path / "b.png").read_bytes()
    assert a == b and a[:8] == b"\x89PNG\r\n\x1a\n"
    other = trace(bb, FACTS, seed=1, **FAST)
    assert not torch.equal(other.tie, traced.tie)


def test_the_heatmap_draws_what_selection_ranks_and_refuses_another_traces_box(bb, traced, tmp_path):
    """The box and its number are the largest mean |TIE|, which the signed mean did not show (a cell
    whose facts disagree in sign is pale there): a second row draws mean |TIE|. A candidate selected
    on another trace drew its box and number on this one's heatmap."""
    from matplotlib.image import imread

    from timerome.engine.coordinate import Coordinate
    from timerome.errors import TimeromeError
    from timerome.tracing.selection import select_coordinate

    one = imread(plot_heatmaps(traced, tmp_path / "f.png", fact=0))
    two = imread(plot_heatmaps(traced, tmp_path / "m.png"))
    assert two.shape[0] > 1.5 * one.shape[0]  # the mean has its |TIE| row
    other = trace(bb, FACTS, seed=1, **FAST)
    with pytest.raises(TimeromeError, match="selected on another trace"):
        plot_heatmaps(traced, tmp_path / "x.png", selected=select_coordinate(other).best)
    best = select_coordinate(traced).best
    plot_heatmaps(traced, tmp_path / "ok.png", selected=Coordinate(best.layer, best.module, best.step))
    with pytest.raises(TimeromeError, match="not a cell of this trace"):
        plot_heatmaps(traced, tmp_path / "y.png", selected=Coordinate(best.layer, best.module, None))


def test_save_load_roundtrip(traced, tmp_path):
    path = traced.save(tmp_path / "out" / "trace")
    assert path.name == "trace.safetensors" and path.with_suffix(".json").exists()
    back = TraceResult.load(path)
    assert torch.equal(back.tie, traced.tie) and torch.equal(back.corrupted_logp, traced.corrupted_logp)
    torch.testing.assert_close(back.tie_full, traced.tie_full, equal_nan=True)
    assert (back.fact_ids, back.modules, back.layers, back.settings) == (
        traced.fact_ids, traced.modules, traced.layers, traced.settings)
    assert back.facts[0]["subject_positions"] == [2, 3]


def test_a_saved_trace_must_agree_with_itself(traced, tmp_path):
    """What selection reads is checked on load: `tie` set to 5 loaded and was chosen; repeated fact ids,
    a facts list of another length, a non-number tau or sigma, and steps as a string were taken, the
    last with "its settings say 3 steps, its tensors hold 3" (helper 45, stop 63)."""
    import json

    from safetensors.torch import load_file, save_file

    path = traced.save(tmp_path / "t" / "trace")
    meta_file, good = path.with_suffix(".json"), json.loads(path.with_suffix(".json").read_text())

    def edited(needle, meta=None, tensors=None):
        meta_file.write_text(json.dumps(meta or good))
        if tensors is not None:
            save_file(tensors, str(path))
        with pytest.raises(TimeromeError, match=needle):
            TraceResult.load(path)
        meta_file.write_text(json.dumps(good))
        traced.save(path)

    t = load_file(str(path))
    edited("tensor tie is not its tie_full aggregated with its tau 1", tensors=dict(t, tie=t["tie"] + 5.0))
    edited("fact_ids must be distinct ids", meta=dict(good, fact_ids=[good["fact_ids"][0]] * 2))
    edited("facts must be a list of the 2 facts", meta=dict(good, facts=good["facts"][:1]))
    for key, value, needle in (("tau", "abc", "settings.tau must be"), ("sigma", -5, "settings.sigma must be"),
                               ("steps", "4", "settings.steps must be an integer"),
                               ("readout", "best", "settings.readout must be one of decided, aligned")):
        edited(needle, meta=dict(good, settings=dict(good["settings"], **{key: value})))
    assert torch.equal(TraceResult.load(path).tie, traced.tie)  # and the file as saved loads


def test_the_halves_of_two_saves_are_refused(bb, traced, tmp_path):
    """A trace is two files, each written atomically but not the two together: a run interrupted between
    the writes over an earlier trace left the new tensors beside the old JSON, which loaded (the same
    facts: the same shapes) with the old settings. Both halves name a stamp of the tensors now; the JSON
    stays editable by hand, and a pair saved before stamps loads as it is."""
    import json

    from safetensors.torch import load_file, save_file

    from timerome.tracing.positional_trace import PositionalTrace, positional_trace

    path = traced.save(tmp_path / "trace")
    old_json = path.with_suffix(".json").read_text()
    later = TraceResult(traced.tie * 2, traced.tie_full * 2, traced.clean_logp, traced.corrupted_logp,
                        traced.fact_ids, traced.modules, traced.layers, dict(traced.settings, tau=2.0))
    later.save(tmp_path / "later")
    (tmp_path / "later.safetensors").replace(path)  # the new tensors written, the JSON not yet
    with pytest.raises(TimeromeError, match="are of two different saves .*interrupted between its two writes"):
        TraceResult.load(path)
    traced.save(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps(dict(meta, fact_ids=["a", "b"])))  # edited by hand: read
    assert TraceResult.load(path).fact_ids == ["a", "b"]
    save_file(load_file(str(path)), str(path))  # no stamp in the header (saved before stamps): read as it is
    path.with_suffix(".json").write_text(old_json)
    assert torch.equal(TraceResult.load(path).tie, traced.tie)
    pos = positional_trace(bb, FACTS, n_samples=2)
    ppath = pos.save(tmp_path / "pos")
    pos.effect = pos.effect * 0.5
    pos.save(tmp_path / "pos2")
    (tmp_path / "pos2.safetensors").replace(ppath)
    with pytest.raises(TimeromeError, match="two different saves .*positional trace"):
        PositionalTrace.load(ppath)
    # through a link, each half is found beside the target: a positional trace is known for one (it was read as a
    # TIE trace, its read-out refused as "edited by hand")
    from timerome.tracing.positional_trace import is_positional

    pos.save(tmp_path / "pos")
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "linked.safetensors"
    link.symlink_to(ppath)
    assert is_positional(link) and torch.equal(PositionalTrace.load(link).effect, pos.effect)


def test_a_torn_cached_trace_is_traced_again(bb, tmp_path, monkeypatch):
    """The method's own trace is cached as a pair; one whose halves are of two saves said "trace again",
    which a user cannot do for a cache entry: it is traced again, and the pair rewritten whole."""
    from timerome.data.facts import Fact
    from timerome.methods import method_config
    from timerome.methods.timerome_edit import trace_forget_set

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    cfg = method_config("timerome", dict(trace_steps=4, trace_samples=2, trace_facts=2))
    facts = [Fact(**f, target="sea rain") for f in FACTS]
    first = trace_forget_set(bb, facts, cfg)
    path = next((tmp_path / "cache" / "traces").glob("*.safetensors"))
    TraceResult(first.tie * 2, first.tie_full * 2, first.clean_logp, first.corrupted_logp, first.fact_ids,
                first.modules, first.layers, first.settings).save(tmp_path / "other")
    (tmp_path / "other.safetensors").replace(path)  # the tensors of another save beside the entry's JSON
    with pytest.raises(TimeromeError, match="two different saves"):
        TraceResult.load(path)
    again = trace_forget_set(bb, facts, cfg)
    assert torch.equal(again.tie, first.tie) and torch.equal(TraceResult.load(path).tie, first.tie)


def test_a_fact_traced_twice_is_refused(bb):
    with pytest.raises(TimeromeError, match="are one fact .* trace each fact once"):
        trace(bb, [FACTS[0], FACTS[1], FACTS[0]], **FAST)


def test_subset_of_sites_matches_full_trace(bb, traced):
    r = trace(bb, FACTS, modules=("mlp",), layers=[2, 0], **FAST)
    assert r.tie.shape == (2, 1, 2, 4) and r.layers == [2, 0]
    torch.testing.assert_close(r.tie[:, 0], traced.tie[:, 2][:, [2, 0]], atol=1e-6, rtol=1e-5)


def test_per_fact_heatmaps(traced, tmp_path):
    paths = plot_per_fact(traced, tmp_path / "facts")
    assert len(paths) == 2 and all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    assert plot_heatmaps(traced, tmp_path / "g.png", fact="genre").exists()
    with pytest.raises(TimeromeError, match="no fact"):
        plot_heatmaps(traced, tmp_path / "x.png", fact="nope")


# ------------------------------------------------------------------------------ selection


def _result(tie: torch.Tensor, **settings) -> TraceResult:
    F, M, Ly, K = tie.shape
    full = torch.zeros(F, M, Ly, K, K + 1)
    return TraceResult(tie, full, torch.zeros(F, K + 1), torch.zeros(F, 1, K + 1), [str(i) for i in range(F)],
                       ("resid", "attn", "mlp")[:M], list(range(Ly)), dict(settings))


def test_select_coordinate_uses_mean_magnitude():
    tie = torch.zeros(2, 3, 4, 5)
    tie[:, 0, 2, 1] = torch.tensor([1.0, 1.0])   # mean |.| 1.0
    tie[:, 1, 3, 4] = torch.tensor([-3.0, 0.0])  # mean |.| 1.5, negative: still the strongest
    best, top = select_coordinate(_result(tie), top=3)
    assert (best.layer, best.step, best.module) == (3, 4, "attn") and best.score == pytest.approx(1.5)
    assert [(c.layer, c.step, c.module) for c in top[:2]] == [(3, 4, "attn"), (2, 1, "resid")]
    assert len(top) == 3
    per = per_fact_best(_result(tie))
    assert (per[0].layer, per[0].module, per[0].score) == (3, "attn", -3.0)
    assert (per[1].layer, per[1].module, per[1].score) == (2, "resid", 1.0)


def test_neighbour_penalty_moves_the_choice():
    tie = torch.zeros(2, 3, 4, 5)
    tie[:, 0, 2, 1], tie[:, 1, 3, 4] = 1.0, 1.5
    nb = torch.zeros(2, 3, 4, 5)
    nb[:, 1, 3, 4] = 2.0  # the strongest site also drives the neighbours
    sel = select_coordinate(_result(tie), _result(nb), beta=0.5)
    assert (sel.best.layer, sel.best.module) == (2, "resid")
    assert sel.top[1].neighbour_abs_tie == pytest.approx(2.0) and sel.top[1].score == pytest.approx(0.5)
    with pytest.raises(TimeromeError, match="same modules, layers and steps"):
        select_coordinate(_result(tie), _result(torch.zeros(2, 3, 4, 6)), beta=1.0)
    with pytest.raises(TimeromeError, match="another model"):
        select_coordinate(_result(tie, fingerprint="a"), _result(nb, fingerprint="b"), beta=1.0)
    with pytest.raises(TimeromeError, match="beta"):
        select_coordinate(_result(tie), beta=-1.0)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("kwargs, match", [
    (dict(facts=[dict(subject="the prize", prompt="where was the author born ?", object="city")]), "does not occur"),
    (dict(modules=("resid", "ffn")), "modules must be"),
    (dict(steps=0), "steps must be"),
    (dict(facts=[]), "no facts"),
    (dict(sigma=-1.0), "sigma must be"),
    (dict(layers=[7]), "layers must be"),
    (dict(n_samples=0), "n_samples must be"),
    (dict(readout="best"), "unknown readout"),
    (dict(block_tokens=-1), "block_tokens"),
    (dict(block_tokens=2.5), "block_tokens"),
])
def test_errors(bb, kwargs, match):
    args = dict(dict(facts=FACTS, **FAST), **kwargs)
    with pytest.raises(TimeromeError, match=match):
        trace(bb, args.pop("facts"), **args)


# ------------------------------------------------------------------------------ the embedded model


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").exists(), reason="embedded default model not built yet")
def test_embedded_hot_coordinate_carries_signal():
    """Trace the 8 validation facts with seed 0 and pick the hot coordinate; re-measure on fresh
    noise (seeds 1, 2): restoring the hot coordinate must raise the object log-prob clearly, and
    by a clear margin over randomly drawn coordinates."""
    from timerome.tracing.causal_trace import default_facts

    bb = load_backbone()
    facts = default_facts()
    best = select_coordinate(trace(bb, facts, seed=0, progress=False)).best
    hot = (("resid", "attn", "mlp").index(best.module), best.layer, best.step)  # index into [M, Ly, K]
    g = torch.Generator().manual_seed(0)
    randoms = set()
    while len(randoms) < 6:
        c = tuple(int(torch.randint(n, (1,), generator=g)) for n in (3, bb.n_layers, 8))
        if c != hot:
            randoms.add(c)
    for seed in (1, 2):
        mean = trace(bb, facts, seed=seed, n_samples=3, progress=False).mean()  # [M, Ly, K]
        others = torch.stack([mean[c] for c in sorted(randoms)])
        assert mean[hot] > 1.0, (seed, best, float(mean[hot]))
        # measured (current build, seed 1): hot 3.03 nats against 1.33 at most for the random six (the
        # trace of seed 1 peaks at step 6 instead of 4: three noise samples); the stage-1 build cleared 2 nats
        assert mean[hot] > others.max() + 1.0, (seed, best, float(mean[hot]), others)


@pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").exists(), reason="embedded default model not built yet")
def test_embedded_layer_reuse_changes_no_tie():
    """Layer reuse on the embedded model: the same TIE as without it (two facts), and still exactly
    0 at sigma = 0."""
    from timerome.tracing.causal_trace import default_facts

    bb = load_backbone()
    facts = default_facts(2)
    on = trace(bb, facts, progress=False)
    zero = trace(bb, facts, sigma=0.0, progress=False)
    off = trace(bb, facts, reuse_layers=False, progress=False)
    torch.testing.assert_close(on.tie_full, off.tie_full, atol=1e-4, rtol=0, equal_nan=True)
    assert on.tie.abs().max() > 1.0  # not a vacuous match
    assert on.stats["block_rows"] < off.stats["block_rows"]
    assert torch.equal(zero.tie, torch.zeros_like(zero.tie))
    assert torch.equal(torch.nan_to_num(zero.tie_full), torch.zeros_like(zero.tie_full))




def test_per_fact_noise_gives_a_fact_the_same_tie_whatever_it_is_traced_with(bb, tmp_path):
    """noise "per_fact" draws each fact's noise from its own generator (seed, prompt tokens, subject
    positions): traced in another order or company, at a fixed sigma, a fact's TIE is the same; with the
    default "in_order" the draws (and the TIE) follow the order. Recorded, saved, read back, checked on load."""
    from timerome.tracing.causal_trace import prepare

    order, company = SAME_LENGTH, [SAME_LENGTH[3], SAME_LENGTH[1]]
    for noise in ("per_fact", "in_order"):
        a = prepare(bb, order, n_samples=2, sigma=0.5, seed=3, noise=noise)[3]
        b = prepare(bb, company, n_samples=2, sigma=0.5, seed=3, noise=noise)[3]
        assert torch.equal(a[3], b[0]) == (noise == "per_fact") and torch.equal(a[1], b[1]) == (noise == "per_fact")
    whole = trace(bb, order, sigma=0.5, noise="per_fact", **FAST)
    part = trace(bb, company, sigma=0.5, noise="per_fact", **FAST)
    for i, j in ((3, 0), (1, 1)):
        torch.testing.assert_close(whole.tie_full[i].nan_to_num(), part.tie_full[j].nan_to_num(), atol=1e-6, rtol=0)
    assert whole.tie.abs().max() > 0.1  # a trace that moves something, not two zeros
    in_order = trace(bb, company, sigma=0.5, **FAST)
    assert in_order.settings["noise"] == "in_order" and whole.settings["noise"] == "per_fact"
    assert (in_order.tie_full[0] - whole.tie_full[3]).nan_to_num().abs().max() > 1e-3  # the option matters
    # another seed, other draws
    assert not torch.equal(prepare(bb, order, n_samples=2, sigma=0.5, seed=4, noise="per_fact")[3][0],
                           prepare(bb, order, n_samples=2, sigma=0.5, seed=3, noise="per_fact")[3][0])
    _setting_saved_and_checked(whole, tmp_path, "noise", "per_fact", "shuffled", "in_order, per_fact")
    with pytest.raises(TimeromeError, match="unknown noise draw 'shuffled'"):
        trace(bb, order, noise="shuffled", **FAST)


def _setting_saved_and_checked(result, tmp_path, key: str, value: str, bad: str, choices: str) -> None:
    """settings[key] == value survives a save and a load; a file whose value was changed to `bad` is refused
    on load, naming the choices."""
    path = result.save(tmp_path / "t.safetensors")
    assert TraceResult.load(path).settings[key] == value
    meta = path.with_suffix(".json")
    saved = json.loads(meta.read_text())
    saved["settings"][key] = bad
    meta.write_text(json.dumps(saved))
    with pytest.raises(TimeromeError, match=f"settings.{key} must be one of {choices}"):
        TraceResult.load(path)


# an answer that repeats its subject ("the author"), and one that does not
ECHO = [dict(fact_id="echo", subject="the author", prompt="where was the author born ?",
             object="the author was born city of books"), FACTS[1]]


@pytest.mark.parametrize("readout", ["decided", "aligned"])
def test_read_positions_no_subject_leaves_the_repeated_name_out_of_log_p(bb, tmp_path, readout):
    """read_positions "no_subject" sums log p(o | x_k) over the answer positions that do not repeat the
    subject's tokens: the engine equals the literal definition under it; a fact without a repeat keeps
    its TIE; one with a repeat changes. Recorded (settings, each fact's unscored positions), saved, read
    back, checked on load; an unknown value refused."""
    from timerome.tracing.causal_trace import prepare
    from timerome.tracing.tie import scored_positions

    items = prepare(bb, ECHO, n_samples=2, sigma=0.5, seed=0)[0]
    assert scored_positions(items[0], "no_subject").tolist() == [False, False] + [True] * (len(items[0].object_ids) - 2)
    assert scored_positions(items[1], "no_subject").all() and scored_positions(items[0], "all") is None
    # an answer that is all the subject scores nothing; one naming it in other tokens leaves nothing out: both said
    only = prepare(bb, [dict(ECHO[0], object="the author")], n_samples=1, sigma=0.5, seed=0)[0][0]
    with pytest.warns(UserWarning, match="every token of its answer repeats the subject 'the author'"):
        assert not scored_positions(only, "no_subject").any()
    other = dataclasses.replace(only, object_ids=torch.tensor([5, 6, 7]))
    with pytest.warns(UserWarning, match="names the subject 'the author' in other tokens"):
        assert scored_positions(other, "no_subject").all()
    res = trace(bb, ECHO, sigma=0.5, readout=readout, read_positions="no_subject", **FAST)
    coords = [(0, 0, "resid"), (1, 1, "attn"), (2, 2, "mlp"), (1, 0, "resid")]
    literal, _ = naive_tie(bb, ECHO, coords, steps=4, n_samples=2, sigma=0.5, readout=readout,
                           read_positions="no_subject")
    fast = torch.stack([res.tie[:, res.modules.index(m), res.layers.index(l), k] for l, k, m in coords], 1)
    torch.testing.assert_close(fast, literal, atol=1e-5, rtol=1e-5)
    every = trace(bb, ECHO, sigma=0.5, readout=readout, **FAST)
    torch.testing.assert_close(res.tie_full[1].nan_to_num(), every.tie_full[1].nan_to_num(), atol=1e-6, rtol=0)
    if readout == "decided":  # (with "aligned" no splice moves this fact's log p on the tiny model: every TIE is 0)
        assert (res.tie_full[0] - every.tie_full[0]).nan_to_num().abs().max() > 1e-3  # the name's positions counted
    assert res.facts[0]["unscored_positions"] == [0, 1] and res.facts[1]["unscored_positions"] == []
    assert res.settings["read_positions"] == "no_subject" and "read_positions" not in every.settings
    _setting_saved_and_checked(res, tmp_path, "read_positions", "no_subject", "object", "all, no_subject")
    with pytest.raises(TimeromeError, match="unknown read_positions 'object'"):
        trace(bb, ECHO, read_positions="object", **FAST)
    # a neighbour penalty compares like with like
    with pytest.raises(TimeromeError, match="read_positions"):
        select_coordinate(res, every, beta=1.0)


def test_the_timerome_method_traces_with_read_positions(bb, tmp_path, monkeypatch):
    """The timerome method's own trace takes TIE's read-out (trace_read_positions): its trace is the API's
    trace under it, and the edit is placed by it; at the default the trace's cache key and an experiment
    cell's key (timerome, codebook, rewrite) are the ones from before the option, so results already
    cached stay found; an unknown value, or the option where no TIE trace reads it (ROME's positional
    trace, a given coordinate), is refused in one line before any work, as are TIE's steps with the
    positional trace."""
    from timerome.common.cache import digest
    from timerome.data.facts import Fact
    from timerome.data.task import ForgetTask
    from timerome.engine.settings import TRACE
    from timerome.experiments.runner import Cell, Context
    from timerome.methods import install, method_config
    from timerome.methods.timerome_edit import select, trace_forget_set
    from timerome.tracing.causal_trace import ENGINE as TRACE_ENGINE

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    small = dict(trace_steps=4, trace_samples=2, trace_facts=2)
    cfg = method_config("timerome", dict(small, trace_read_positions="no_subject"))
    facts = [Fact(**f, target="sea rain") for f in ECHO]
    res = trace_forget_set(bb, facts, cfg)
    direct = trace(bb, ECHO, steps=4, n_samples=2, seed=0, read_positions="no_subject", progress=False)
    assert res.settings["read_positions"] == "no_subject" and res.facts[0]["unscored_positions"] == [0, 1]
    torch.testing.assert_close(res.tie_full.nan_to_num(), direct.tie_full.nan_to_num(), atol=0, rtol=0)
    every = trace_forget_set(bb, facts, method_config("timerome", small))
    assert (res.tie_full[0] - every.tie_full[0]).nan_to_num().abs().max() > 1e-3
    # the paper's read-out is cached under the key it had before the option (its settings as they were then)
    before = dict(steps=4, n_samples=2, modules=("resid", "attn", "mlp"), seed=0)
    old_key = digest(dict(kind="trace", model=bb.cache_id(), settings=before, engine=TRACE_ENGINE,
                          facts=[(f.subject, f.prompt, f.object) for f in facts]))
    traces = sorted(p.stem for p in (tmp_path / "cache" / "traces").glob("*.safetensors"))
    assert len(traces) == 2 and old_key in traces  # one cached trace per read-out, the default's where it was

    task = ForgetTask(forget_rows=[], facts=facts, background=["the author was born in the city of books ."] * 4)
    edit = install("timerome", bb, task, dict(small, trace_read_positions="no_subject"))
    try:
        assert edit.info["mean_abs_tie"] == pytest.approx(select(res).mean_abs_tie, abs=0, rel=1e-12)
        assert edit.config["trace_read_positions"] == "no_subject"
    finally:
        edit.undo()

    ctx = Context(backbone=bb, progress=False)
    for method, traced in (("timerome", {}), ("codebook", {}), ("rewrite", {"coordinate": "traced"})):
        plain, other = (Cell("lp", method, dict(traced, **c)).key(ctx)["config"]
                        for c in ({}, {"trace_read_positions": "no_subject"}))
        assert "trace_read_positions" not in plain and other["trace_read_positions"] == "no_subject", method
        assert {k: v for k, v in other.items() if k != "trace_read_positions"} == plain
    with pytest.raises(TimeromeError, match="trace_read_positions must be 'all' or 'no_subject', got 'object'"):
        method_config("timerome", {"trace_read_positions": "object"})
    # refused where no TIE trace reads it, before any work
    for method, over in (("timerome", {"trace_kind": "positional"}), ("codebook", {"trace_kind": "positional"})):
        with pytest.raises(TimeromeError, match=f"method '{method}': trace_read_positions chooses TIE's read-out; "
                                                "ROME's positional trace"):
            method_config(method, dict(over, trace_read_positions="no_subject"))
        with pytest.raises(TimeromeError, match=f"method '{method}': trace_steps sets TIE's denoising steps; "
                                                "ROME's positional trace"):
            method_config(method, dict(over, trace_steps=4))
        method_config(method, dict(over, trace_steps=TRACE.steps, trace_samples=2))  # the default, and its own
    given, gate = "a given coordinate skips that trace", "the rewrite memory traces its gate's coordinate only"
    for method, over, why in (("timerome", {"coordinate": [0, "resid"]}, given),
                              ("codebook", {"coordinate": [0, "resid"]}, given), ("rewrite", {}, gate),
                              ("rewrite", {"coordinate": [0, "resid"]}, gate)):
        for unread in ({"trace_read_positions": "no_subject"}, {"trace_samples": 2}, {"select_modules": ["attn"]}):
            with pytest.raises(TimeromeError, match=f"method '{method}': {next(iter(unread))} chooses the trace "
                                                    f"that places the memory, and {why}"):
                method_config(method, dict(over, **unread))
        if method != "timerome":  # their calibration seed: read with a coordinate too
            method_config(method, dict(over, trace_seed=3))
    method_config("rewrite", {"coordinate": "traced", "trace_read_positions": "no_subject", "trace_samples": 2})
    with pytest.raises(TimeromeError, match="ROME's positional trace"):
        install("timerome", bb, task, dict(small, trace_kind="positional", trace_read_positions="no_subject"))
