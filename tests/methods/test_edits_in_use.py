"""Edits as a user handles them: stacked, nested, given a module or a q they cannot take, on every
family (stop 63's audit of the methods: each of these was silently wrong or a traceback before)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import FIXTURES

from timerome import TimeromeError, load_backbone
from timerome.methods import install


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


def test_weight_edits_undo_in_reverse_order_only(bb, task):
    """ga then rome, undone ga first: ga's snapshot (the original weights) dropped rome's edit, then
    rome's snapshot (ga's weights) brought ga back; the model ended as ga left it."""
    before = bb.fingerprint()
    first = install("ga", bb, task, {"grad_steps": 2})
    second = install("rome", bb, task, {"grad_steps": 2})
    with pytest.raises(TimeromeError, match="made before rome, which is not undone: undo the later edits first"):
        first.undo()
    second.undo()
    first.undo()
    assert bb.fingerprint() == before
    # an edit no one holds any more is not in the way of the one before it
    first = install("ga", bb, task, {"grad_steps": 2})
    install("ga", bb, task, {"grad_steps": 2})  # dropped: it can never be undone
    first.undo()
    assert bb.fingerprint() == before


@pytest.mark.parametrize("method", ["act_steer", "rmu_like"])
def test_a_steering_edit_inside_its_own_block_is_refused(bb, task, method):
    """Nested `active()` blocks added the shift twice (a silently stronger edit), as a memory's do not."""
    edit = install(method, bb, task, {})
    q = torch.tensor([bb.encode(task.forget_rows[0]["question"])])
    plain = bb.logits(q)
    with edit.active():
        once = bb.logits(q)
        with pytest.raises(TimeromeError, match="already applied to this model"):
            with edit.active():
                pass
        assert torch.equal(bb.logits(q), once)  # the refused block left the one hook as it was
    with edit.active():  # and it can be applied again after
        assert torch.equal(bb.logits(q), once)
    assert torch.equal(bb.logits(q), plain)


def test_random_layer_takes_its_module(bb, task):
    drawn = install("random_layer", bb, task, {}, seed=2).info
    for module in ("attn", "mlp", "resid"):
        info = install("random_layer", bb, task, {"module": module}, seed=2).info
        assert (info["layer"], info["point"]) == (drawn["layer"], module)  # the same layer drawn, the point given
    info = install("random_layer", bb, task, {"coordinate": [0, "resid"], "module": "attn"}).info
    assert (info["layer"], info["point"]) == (0, "attn")


def test_a_q_over_the_facts_is_said_and_recorded(bb, task):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        edit = install("timerome", bb, task, {"q": 50, "coordinate": [1, "resid"]})
    n = len(task.facts)
    assert any(f"q=50 is more than the {n} facts" in str(w.message) for w in seen)
    assert edit.config["q"] == n and edit.info["q_asked"] == 50


def test_rewrite_names_the_write_site_it_was_given(bb, task):
    with pytest.raises(TimeromeError, match="layer 9 out of range: the model has 4 layers"):
        install("rewrite", bb, task, {"site": [9, "resid"]})  # said "layer 8" (the gate's, below it)
    with pytest.raises(TimeromeError, match="got 1.5"):
        install("rewrite", bb, task, {"site": [1.5, "resid"]})  # said "got 0.5"


def test_rmu_trains_the_down_projection_on_every_family(task):
    """WMDP's RMU updates the MLP's down projection. The `mlp` hook point's module trained gate, up
    and down on Dream / DiffuLLaMA, and on LLaDA-MoE (a parameterless sum) nothing: a refusal."""
    from timerome.methods._unlearn import mlp_out_prefixes

    want = {"llada": "ff_out.", "mmada": "ff_out.", "dream": "mlp.down_proj.", "diffullama": "mlp.down_proj.",
            "llada-moe": "layers.0.mlp."}  # a mixture of experts has no single down projection: its experts
    for family, end in want.items():
        path = FIXTURES / family / "checkpoint"
        if not (path / "config.json").exists():
            pytest.fail(f"backbone fixture missing: {path}")
        model = load_backbone(path)
        assert [p.endswith(end) for p in mlp_out_prefixes(model, 0)] == [True], (family, mlp_out_prefixes(model, 0))
    moe = load_backbone(FIXTURES / "llada-moe" / "checkpoint")
    before = moe.fingerprint()
    for method in ("rmu", "adaptive_rmu"):
        edit = install(method, moe, task, {"grad_steps": 2, "check_rows": 2})
        assert edit.changed()
        edit.undo()
    assert moe.fingerprint() == before
