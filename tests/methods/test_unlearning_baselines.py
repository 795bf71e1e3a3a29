"""Unlearning baselines (act_steer, rmu_like, ga, gd, npo, simnpo, rmu, adaptive_rmu) on the embedded model.

Each method is installed once with its defaults (module-scoped, then undone at once) and checked
for: forget LP down by a clear margin vs no edit, exact restoration (undo for weight methods,
leaving the `with` block for inference methods). Then the safe protocol against the unmitigated
setting, seeding, the LoRA path and the frozen reference.
"""

from __future__ import annotations

import pytest
import torch
from conftest import mean_answer_lp

import timerome
from timerome.data.rows import spread
from timerome.methods import available, get_method, install

INFERENCE = ("act_steer", "rmu_like")
WEIGHTS = ("ga", "gd", "npo", "simnpo", "rmu", "adaptive_rmu")
MARGIN = 2.0  # nats of forget-LP drop that count as "clearly down" (every method but simnpo clears it at its defaults)
# simnpo at its defaults (40 steps at lr 1e-3, all run, no early stop) moved the stage-1 build's forget rows
# down by 2.8 nats; on the two-stage build it moves them UP (-0.69 -> -0.01, retain -0.17 -> -0.003): its
# retain term sharpens every answer and its saturated forget term does not hold them back. A measured
# failure of the baseline on this model (reported in the canonical table), kept as a strict xfail so
# that a fix shows.
SIMNPO_FAILS = pytest.mark.xfail(strict=True, reason="simnpo's defaults raise the forget LP on the two-stage "
                                                      "embedded build (measured -0.69 -> -0.01 nats)")


def _marked(names):
    return [pytest.param(n, marks=SIMNPO_FAILS) if n == "simnpo" else n for n in names]


@pytest.fixture(scope="module")
def bb():
    return timerome.load_backbone()


@pytest.fixture(scope="module")
def rows(task):
    # retain rows other than the ones the safe protocol checks (spread(retain, 8)), so its early
    # stop is judged on rows it never saw
    return {"forget": spread(task.forget_rows, 6), "retain": task.retain_rows[3::50]}


def _probe(bb, rows):
    r = rows["forget"][0]
    ids = torch.tensor([bb.encode(r["question"] + " " + r["answer"])], device=bb.device)
    with torch.no_grad():
        return bb.logits(ids)


@pytest.fixture(scope="module")
def base(bb, rows):
    return {"forget": mean_answer_lp(bb, rows["forget"]), "retain": mean_answer_lp(bb, rows["retain"]), "logits": _probe(bb, rows)}


@pytest.fixture(scope="module")
def outcome(bb, task, rows, base):
    """method -> what installing it with its defaults (seed 0) did; the model is restored at once."""
    done = {}

    def get(name):
        if name not in done:
            edit = install(name, bb, task, seed=0)
            with edit.active():
                res = {"forget": mean_answer_lp(bb, rows["forget"]), "retain": mean_answer_lp(bb, rows["retain"]),
                       "logits_on": _probe(bb, rows)}
            res["logits_inside_after"] = _probe(bb, rows)   # weights: still edited; hooks: gone
            edit.undo()
            res["logits_undone"] = _probe(bb, rows)
            res["edit"] = edit
            done[name] = res
        return done[name]

    return get


def test_registered():
    names = available()
    for name in INFERENCE + WEIGHTS:
        assert name in names
        m = get_method(name)
        assert m.kind == ("inference" if name in INFERENCE else "weights")
        # ga and npo also show the paper's unmitigated setting in the canonical table
        unsafe = ({"safe": False, "lr": 3e-3},) if name in ("ga", "npo") else ()
        assert m.canonical == ({},) + unsafe
    for name in WEIGHTS:
        d = get_method(name).defaults
        assert d["safe"] is True and d["grad_clip"] == 1.0 and d["drift"] == 5.0 and d["lora_r"] == 0


@pytest.mark.parametrize("name", _marked(INFERENCE + WEIGHTS))
def test_forget_goes_down(name, outcome, base):
    res = outcome(name)
    drop = base["forget"] - res["forget"]
    assert drop > MARGIN, f"{name}: forget LP {base['forget']:.2f} -> {res['forget']:.2f}"


@pytest.mark.parametrize("name", _marked(("rmu_like",) + WEIGHTS))
def test_forget_drops_more_than_retain(name, outcome, base):
    # act_steer is left out: one global vector moves every answer alike (that is the point of it)
    res = outcome(name)
    assert base["forget"] - res["forget"] > (base["retain"] - res["retain"]) + MARGIN


@pytest.mark.parametrize("name", WEIGHTS)
def test_weight_undo_is_exact(name, outcome, base):
    res = outcome(name)
    assert not torch.equal(res["logits_on"], base["logits"])          # the weights did change
    assert torch.equal(res["logits_inside_after"], res["logits_on"])  # and stay changed until undo
    assert torch.equal(res["logits_undone"], base["logits"])
    info = res["edit"].info
    assert info["steps_run"] >= 1 and isinstance(info["early_stopped"], bool)
    assert res["edit"].install_seconds > 0


@pytest.mark.parametrize("name", INFERENCE)
def test_leaving_the_block_restores(name, bb, outcome, base):
    res = outcome(name)
    assert not torch.equal(res["logits_on"], base["logits"])          # the hook acted
    assert torch.equal(res["logits_inside_after"], base["logits"])    # and was removed
    assert all(len(m._forward_hooks) == 0 for m in bb.model.modules())


def test_rmu_like_gate_is_selective(outcome):
    info = outcome("rmu_like")["edit"].info
    assert info["gated_forget"] > 0.2 and info["gated_forget"] > 5 * info["gated_background"]


def test_inference_restores_when_the_body_raises(bb, task, rows, base):
    edit = install("rmu_like", bb, task, seed=0)
    with pytest.raises(RuntimeError):
        with edit.active():
            raise RuntimeError("boom")
    assert torch.equal(_probe(bb, rows), base["logits"])


def test_safe_protocol_prevents_the_collapse(bb, task, rows, base):
    # a learning rate at which plain GA destroys the model within a few dozen steps
    hot = {"lr": 3e-3, "grad_steps": 30}
    unsafe = install("ga", bb, task, dict(hot, safe=False), seed=0)
    collapsed = mean_answer_lp(bb, rows["retain"])
    unsafe.undo()
    safe = install("ga", bb, task, hot, seed=0)
    kept = mean_answer_lp(bb, rows["retain"])
    safe.undo()
    assert base["retain"] - collapsed > 20.0
    assert safe.info["early_stopped"] and safe.info["kept_step"] < safe.info["steps_run"]
    # the protocol bounds the drift (5 nats) on the retain rows it checks; on these 8 other rows the
    # sharp embedded default drifts further (12.5 nats measured), still far from the collapse
    assert base["retain"] - kept < 20.0 and base["retain"] - kept < (base["retain"] - collapsed) / 10
    assert not unsafe.info["early_stopped"] and unsafe.info["steps_run"] == 30
    assert torch.equal(_probe(bb, rows), base["logits"])
    assert safe.info["check_rows_held_out"]  # forget01's task has hundreds of retain rows to spare
    assert not unsafe.info["check_rows_held_out"]  # no check runs: the retain term would read every row
    assert unsafe.info["retain_rows_trained"] == 0  # GA has no retain term; safe, the anchor reads the rest
    assert safe.info["retain_rows_trained"] == len(task.retain_rows) - 20
    plain = install("npo", bb, task, {"safe": False, "grad_steps": 1}, seed=0)  # NPO's own retain term: every row
    plain.undo()                                  # (stop 67 held out the 20 rows of a check that never runs)
    assert plain.info["retain_rows_trained"] == len(task.retain_rows) and not plain.info["check_rows_held_out"]
    assert all(p.grad is None for p in bb.model.parameters())  # no stale gradients left behind


def test_seeded(bb, task, rows):
    def run(name, seed, cfg=None):
        edit = install(name, bb, task, cfg, seed=seed)
        with edit.active():
            out = _probe(bb, rows)
        edit.undo()
        return out

    short = {"grad_steps": 3}
    assert torch.equal(run("ga", 0, short), run("ga", 0, short))
    assert not torch.equal(run("ga", 0, short), run("ga", 1, short))
    lora = {"grad_steps": 3, "lora_r": 4, "lr": 1e-2, "safe": False}   # peft's adapter init is seeded too
    assert torch.equal(run("ga", 0, lora), run("ga", 0, lora))
    assert torch.equal(run("rmu_like", 0), run("rmu_like", 0))
    assert not torch.equal(run("rmu_like", 0), run("rmu_like", 1))   # another random direction


@pytest.mark.parametrize("lora_r", [0, 4])
def test_npo_reference_is_the_model_before_training(bb, task, rows, base, lora_r):
    # at step 1 the model equals its reference and both are scored on the same masks
    edit = install("npo", bb, task, {"grad_steps": 1, "lora_r": lora_r}, seed=0)
    edit.undo()
    assert edit.info["last_log_ratio"] == 0.0
    assert torch.equal(_probe(bb, rows), base["logits"])


def test_lora_training_merges_and_undoes(bb, task, rows, base):
    before = dict(bb.model.named_parameters())
    edit = install("rmu", bb, task, {"grad_steps": 5, "lora_r": 4, "lr": 1e-2, "safe": False}, seed=0)
    after = dict(bb.model.named_parameters())
    assert set(after) == set(before)                        # adapters merged away, paths unchanged
    # only the MLPs of the updated layers moved
    layers = edit.info["update_layers"]
    moved = {n for n, p in after.items() if not torch.equal(p, edit.snapshot[n])}
    assert moved and all(any(f"blocks.{j}.ff_out" in n for j in layers) for n in moved)
    edit.undo()
    assert torch.equal(_probe(bb, rows), base["logits"])


def test_adaptive_coefficient_follows_the_activation_scale(bb, task):
    cs = []
    for scale in (2.0, 5.0):
        edit = install("adaptive_rmu", bb, task, {"grad_steps": 1, "scale": scale, "safe": False}, seed=0)
        edit.undo()
        cs.append(edit.info["last_c"])
    assert cs[1] / cs[0] == pytest.approx(2.5, rel=1e-6)
    assert cs[0] > 0


def test_loss_formulas_match_their_papers():
    from timerome.methods import _unlearn as U

    cur, old = torch.tensor([3.0, 0.5, 10.0]), torch.tensor([2.0, 1.5, 10.0])  # -log p, -log p_ref
    beta = 0.1
    ratio = torch.exp(-cur) / torch.exp(-old)                                   # p / p_ref
    npo = (2 / beta) * torch.log1p(ratio ** beta).mean()
    assert torch.allclose(U.npo_loss(cur, old, beta), npo)
    # NPO's gradient pushes the model's -log p up (forgetting), more where p / p_ref is large
    c = cur.clone().requires_grad_(True)
    U.npo_loss(c, old, beta).backward()
    assert (c.grad < 0).all() and c.grad[1] < c.grad[0]

    per_tok, b, delta = torch.tensor([0.2, 1.0, 4.0]), 4.5, 0.5
    simnpo = (2 / b) * torch.log1p(torch.exp(-b * (per_tok - delta))).mean()
    assert torch.allclose(U.simnpo_loss(per_tok, b, delta), simnpo)

    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])             # [B=1, L=2, H=2]
    keep = torch.tensor([[True, False]])
    assert torch.allclose(U.activation_mse(h, torch.zeros(2), keep), torch.tensor(2.5))   # (1 + 4) / 2


def test_undo_hands_back_the_fingerprint_of_the_weights_it_restores(bb, task, monkeypatch):
    """A weight method's undo restores every weight bit for bit into the same tensors, so it hands the
    fingerprint known before back with them: the next memory bound to the model does not hash every
    weight again. Where a tensor was replaced meanwhile, it does not (the fingerprint is computed again)."""
    from timerome.backbones import backbone as backbone_module

    fp = bb.fingerprint()
    real, calls = backbone_module.weights_digest, []
    monkeypatch.setattr(backbone_module, "weights_digest", lambda *a: calls.append(1) or real(*a))
    edit = install("ga", bb, task, {"grad_steps": 2, "lr": 1e-2, "safe": False}, seed=0)
    assert edit.info["weights_changed"] and bb.known_fingerprint() is None  # changed: not known any more
    edit.undo()
    assert bb.known_fingerprint() == fp and bb.fingerprint() == fp and calls == []  # handed back, not hashed
    bb._fingerprint = None  # forgotten: computed again from the restored weights
    assert bb.fingerprint() == fp and len(calls) == 1  # and right: hashing the restored weights gives it

    edit = install("ga", bb, task, {"grad_steps": 2, "lr": 1e-2, "safe": False}, seed=0)
    name, p = next(iter(bb.model.named_parameters()))
    owner, attr = bb.model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]
    setattr(owner, attr, torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))  # a new tensor
    edit.undo()
    assert bb.known_fingerprint() is None and bb.fingerprint() == fp and len(calls) == 2  # computed again


def test_a_non_finite_loss_stops_training_at_the_last_finite_weights(bb, task):
    # lr 1e30 makes the second step's loss NaN: before, every later step wrote NaN and the model was saved so
    edit = install("ga", bb, task, {"lr": 1e30, "safe": False, "grad_steps": 4}, seed=0)
    try:
        assert edit.info["diverged_at_step"] == 2 and edit.info["steps_run"] == 1, edit.info
        assert edit.info["weights_changed"] and all(torch.isfinite(p).all() for p in bb.model.parameters())
    finally:
        edit.undo()
    safe = install("ga", bb, task, {"lr": 1e30, "grad_steps": 4}, seed=0)  # the safe protocol: its last kept weights
    try:
        assert safe.info["early_stopped"] and safe.info["kept_step"] == 0, safe.info  # stopped by its drift check
        assert all(torch.isfinite(p).all() for p in bb.model.parameters())
    finally:
        safe.undo()
