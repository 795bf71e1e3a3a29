"""End to end: the reduced demo on the embedded model, and the pipeline on real TOFU files with the
embedded architecture trained on a small TOFU subset (forget01's 2 authors + 2 retain authors)."""

import json

import numpy as np
import pytest
from conftest import TOFU_DIR
from scipy import stats as sps

from timerome import load_backbone
from timerome.data.facts import facts_from_rows
from timerome.data.tofu import FULL_OFFSET
from timerome.evaluation.evaluator import evaluate, fits
from timerome.methods import ForgetTask, install
from timerome.training.from_scratch import tofu_subset, train_tofu_model


def test_reduced_demo_end_to_end(tmp_path, monkeypatch):
    from timerome.demo import run_demo

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))  # its reference model goes here
    out = tmp_path / "demo"
    res = run_demo(out, quick=True, progress=False)
    for name in ("heatmap.png", "heatmap-fact0.png", "pareto.png", "demo.json", "demo.md", "trace.safetensors"):
        assert (out / name).exists(), name
    s = res["summary"]
    assert set(s) == {"no_edit", "timerome", "rewrite"}
    assert s["rewrite"]["Refusal"]["mean"] == 1.0 and s["no_edit"]["Refusal"]["mean"] == 0.0  # it says the target
    f = s["timerome"]["ForgetLP"]
    assert f["n"] == 2 and f["delta"] < -3 and "p" in f  # forgets, with a paired test on 2 seeds
    assert np.isfinite(s["timerome"]["ForgetQuality"]["mean"])
    assert "ForgetLP" in (out / "demo.md").read_text()
    assert json.loads((out / "demo.json").read_text())["coordinate"] == res["coordinate"]


def test_a_demo_stopped_after_its_trace_leaves_no_earlier_demos_table(tmp_path, monkeypatch):
    """A demo over an earlier one's folder, stopped after its new trace: the earlier table and plots went on
    beside the new trace as if they were this run's. They go before the new files are written; other files
    (the cells' cache, a user's own) stay."""
    import timerome.demo as demo

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    out.mkdir()
    for name in ("demo.md", "demo.json", "pareto.png", "heatmap-fact0.png"):
        (out / name).write_text("an earlier demo's")
    (out / "mine.txt").write_text("kept")

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "plot_heatmaps", stopped)  # the trace is written, its figures not
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(out, quick=True, progress=False)
    assert (out / "trace.safetensors").exists() and (out / "mine.txt").read_text() == "kept"
    assert not any((out / n).exists() for n in ("demo.md", "demo.json", "pareto.png", "heatmap-fact0.png"))


@pytest.fixture(scope="module")
def tofu_model(tmp_path_factory):
    if not (TOFU_DIR / "forget01.json").exists():
        pytest.skip(f"no TOFU files in {TOFU_DIR}")
    return load_backbone(train_tofu_model(TOFU_DIR, tmp_path_factory.mktemp("tofu") / "model"))


def test_tofu_pipeline_forgets_forget01_more_than_retain(tofu_model):
    bb = tofu_model
    sub = tofu_subset(TOFU_DIR, 2)
    facts, skipped = facts_from_rows(sub["forget"], offset=FULL_OFFSET["forget01"])
    assert len(facts) >= 30, skipped
    rows = {"forget": [r for r in sub["forget_perturbed"] if fits(bb, r)],
            "retain": [r for r in sub["retain"] if fits(bb, r)]}
    assert len(rows["forget"]) >= 30 and len(rows["retain"]) >= 30

    base = evaluate(bb, rows, n_mc=4, seed=0, rouge=False)
    assert base["metrics"]["ForgetLP"] > -60  # the fixture did learn its rows
    task = ForgetTask(sub["forget"], facts, sub["retain"])
    # alpha 4: the default (1.5) is calibrated on the embedded default, and on this weaker fixture it
    # lowers forget and retain alike (measured: -3.76 vs -3.06 nats, p = 0.16); 4 was the default it
    # was calibrated with before the embedded default was rebuilt (README, "Operating point")
    edit = install("timerome", bb, task, {"trace_facts": 4, "alpha": 4.0}, seed=0)  # trace -> select -> memory
    assert edit.info["coordinate_source"] == "traced"
    after = evaluate(bb, rows, n_mc=4, seed=0, edit=edit, rouge=False)

    drop = {k: np.subtract(after["items"][k]["lp"], base["items"][k]["lp"]) for k in rows}
    # paired over forget items (same MC masks): the edit lowers the forget answers' likelihood ...
    t, p = sps.ttest_rel(after["items"]["forget"]["lp"], base["items"]["forget"]["lp"])
    assert t < 0 and p < 0.05, (t, p)
    # ... and significantly more than it lowers the retain answers'
    t, p = sps.ttest_ind(drop["forget"], drop["retain"], equal_var=False)
    assert drop["forget"].mean() < drop["retain"].mean() and p < 0.05, (drop["forget"].mean(), drop["retain"].mean(), p)
    assert np.isfinite(after["metrics"]["ForgetTR"]) and np.isfinite(after["metrics"]["RetainTR"])
