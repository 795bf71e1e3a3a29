"""The experiments at scale, at toy size: compute accounting in every table, cells computed once,
the converged training-time baseline (npo_sweep), the cross-backbone table on every family's tiny
checkpoint, the consolidated radar, and the executor options of the command line."""

import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES
from typer.testing import CliRunner

from timerome import TimeromeError, load_backbone
from timerome.cli import app
from timerome.experiments import Cell, Context, Runner, run_experiment
from timerome.experiments import runner as runner_module
from timerome.methods.timerome_edit import paper_point
from timerome.experiments.executors import ModelSpec

TOY = dict(n_mc=2, n_retain=3, n_world=1)
FAMILIES = ("llada", "mmada", "llada-moe", "dream", "diffullama")


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def test_cells_sharing_a_key_are_computed_once(bb, tmp_path, monkeypatch):
    calls = []
    real = runner_module.execute

    def counted(cell, ctx):
        calls.append(cell.row)
        return real(cell, ctx)

    monkeypatch.setattr(runner_module, "execute", counted)
    data = dict(splits=["forget"])
    cells = [Cell("lp", "no_edit", seed=0, data=data, options=dict(n_mc=2), row=r) for r in ("a", "b")]
    out = Runner(tmp_path, progress=False).run(cells, Context(bb, progress=False))
    assert calls == ["a"] and out[0] == out[1]
    assert len(list((tmp_path / "cells").glob("*.json"))) == 1


def test_every_table_carries_the_compute_accounting(bb, tmp_path):
    over = dict(n_mc=2, n_retain=3, n_world=2, alphas=(6.0,), paper_point=None, methods=["no_edit"])
    res = run_experiment("pareto", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False, backbone=bb)
    md = (tmp_path / "pareto.md").read_text()
    assert "| install s | wall s | extra MB |" in md and "extra MB = how far installing raised peak memory" in md
    row = res["summary"]["timerome (alpha=6, q=0)"]
    # the cell's wall time holds its install time and the evaluation after it
    assert row["wall_seconds"]["mean"] > row["install_seconds"]["mean"] > 0
    assert "p" not in row["wall_seconds"]  # a cost is never tested against no_edit


@pytest.fixture(scope="module")
def npo_run(bb, runs):
    over = dict(TOY, methods=("npo", "simnpo"), lr=(3e-5,), beta=(0.1,), retain_w=(1.0,), grad_steps=3, extra=(),
                unmitigated=({"method": "npo", "lr": 3e-2, "safe": False, "grad_steps": 6},),
                compare=({"method": "timerome", "config": {}}, {"method": "timerome", "config": paper_point(2.0, 4)}))
    return run_experiment("npo_sweep", seeds=(0, 1), out_dir=runs / "npo_sweep", overrides=over, progress=False,
                          backbone=bb)


def test_npo_sweep_reports_collapse_and_the_best_baseline(npo_run, runs):
    res = npo_run
    saved = json.loads((runs / "npo_sweep" / "npo_sweep.json").read_text())
    kinds = saved["kinds"]
    assert sorted(k for k in kinds.values()) == ["compare", "compare", "reference", "sweep", "sweep", "unmitigated"]
    # the collapse verdict is the per-seed rule applied to the cells' own numbers
    cells = [json.loads(p.read_text()) for p in (runs / "npo_sweep" / "cells").glob("*.json")]
    retain = {(c["cell"]["row"], c["cell"]["seed"]): c["result"]["metrics"]["RetainLP"] for c in cells}
    for row, seeds in res["collapsed"].items():
        expect = [s for s in (0, 1) if retain[("no_edit", s)] - retain[(row, s)] > 5.0]
        assert sorted(seeds) == expect, row
    unmitigated = next(r for r, k in kinds.items() if k == "unmitigated")
    assert res["collapsed"][unmitigated]  # lr 3e-2 without the protocol wrecks the retain set
    sweep = [r for r, k in kinds.items() if k == "sweep"]
    assert res["best"] in sweep and not res["collapsed"][res["best"]]
    d = {r: res["summary"][r]["ForgetLP"]["mean"] - res["summary"]["no_edit"]["ForgetLP"]["mean"] for r in sweep}
    assert saved["best_delta"] == pytest.approx(min(d.values()))
    assert "timerome" in saved["radar"]["converged baseline"]["text"]
    # TimeROME's rows meet the same collapse rule: the paper's point takes the retain answers down too, so the row
    # compared (and on the radar) is the default one (review 71: the collapsed one forgot more and was credited)
    paper = next(r for r, k in kinds.items() if k == "compare" and "alpha=2" in r)
    assert res["collapsed"][paper] and saved["compare"] == "timerome"
    assert saved["radar"]["converged baseline"]["text"].endswith(f"timerome vs {res['best']}")
    assert f"Not compared, as it collapses by the same rule: {paper} (" in res["verdict"]
    assert saved["radar_missing"] is None  # the radar has its entries, so nothing to say why they are missing
    for r in sweep:  # the safe protocol's record: which step's weights were kept, out of how many run
        assert all(kept is not None and kept <= steps for _, kept, steps in saved["early_stopped"][r])
    assert (runs / "npo_sweep" / "npo_sweep.png").stat().st_size > 1000


def test_radar_draws_what_was_run_and_names_what_was_not(bb, runs, npo_run):
    run_experiment("ablations", seeds=(0,), out_dir=runs / "ablations", progress=False, backbone=bb,
                   overrides=dict(TOY, traj_steps=2))
    res = run_experiment("radar", out_dir=runs / "radar", progress=False, backbone=bb)
    assert set(res["axes"]) == {"converged baseline", "install time", "extra memory", "ablations"}
    assert set(res["missing"]) == {"robustness", "utility"}
    assert "not run: timerome experiment utility" in res["missing"]["utility"]
    for axis in res["axes"].values():
        assert 0.0 <= axis["share"] <= 1.0
    abl = json.loads((runs / "ablations" / "ablations.json").read_text())["summary"]
    from timerome.experiments.ablations import AR_ROW

    assert "ForgetLP" in abl[AR_ROW]  # the memory where ROME's positional trace puts it
    assert (runs / "ablations" / "heatmap_compare.png").stat().st_size > 1000  # positional trace beside TIE
    base = abl["no_edit"]["ForgetLP"]["mean"]
    ours = base - abl["resid, all steps, traced layer (TimeROME)"]["ForgetLP"]["mean"]
    assert res["axes"]["ablations"]["value"] == pytest.approx(ours)
    # the comparator is another design: the best of the other rows whose retain is not clearly lower, never
    # TimeROME traced with another read-out
    from timerome.experiments.ablations import ECHO_ROW
    from timerome.experiments.radar import ablation_axis

    ours_retain = abl["resid, all steps, traced layer (TimeROME)"]["RetainLP"]
    others = {r: base - c["ForgetLP"]["mean"] for r, c in abl.items()
              if r not in ("no_edit", ECHO_ROW, "resid, all steps, traced layer (TimeROME)") and "ForgetLP" in c
              and not (base - c["ForgetLP"]["mean"] > ours and c["RetainLP"]["hi"] < ours_retain["lo"]
                       and min(c["RetainLP"]["n"], ours_retain["n"]) > 1)}
    assert res["axes"]["ablations"]["comparator"] == pytest.approx(max(others.values(), default=0.0))
    echo = dict(abl[ECHO_ROW], ForgetLP=dict(abl[ECHO_ROW]["ForgetLP"], mean=base - 1e6))  # it would win by far
    assert ablation_axis(dict(summary={**abl, ECHO_ROW: echo}))["comparator"] == \
        pytest.approx(max(others.values(), default=0.0))
    md = (runs / "radar" / "radar.md").read_text()
    assert "| utility | – |" in md and (runs / "radar" / "radar.png").stat().st_size > 1000


@pytest.mark.slow
def test_xbackbone_runs_on_every_family_checkpoint(tmp_path):
    torch.set_num_threads(1)
    models = [str(FIXTURES / f / "checkpoint") for f in FAMILIES]
    if not all((FIXTURES / f / "checkpoint" / "config.json").exists() for f in FAMILIES):
        pytest.fail(f"backbone fixtures missing: looked in {FIXTURES}")
    methods = ({"method": "no_edit"}, {"method": "simnpo", "config": {"grad_steps": 2}},
               {"method": "timerome", "config": {"alpha": 2.0, "q": 4}})
    refs = [models[1]] + [None] * 4  # llada measured against another model (meaningless, but the KS path runs)
    res = run_experiment("xbackbone", seeds=(0, 1), out_dir=tmp_path, progress=False,
                         overrides=dict(n_mc=2, n_retain=3, models=models, references=refs, methods=methods))
    cols = list(res["summary"])
    assert cols == [f"{f}/checkpoint" for f in FAMILIES]
    assert [m["family"] for m in res["models"].values()] == list(FAMILIES)
    for col, s in res["summary"].items():
        assert set(s) == {"no_edit", "simnpo (grad_steps=2)", "timerome (alpha=2, q=4)"}
        for row in s.values():
            assert np.isfinite(row["ForgetLP"]["mean"]) and row["ForgetLP"]["n"] == 2
        assert ("ForgetQuality" in s["no_edit"]) == (col == "llada/checkpoint")
    md = (tmp_path / "xbackbone.md").read_text()
    assert "| Δ fLP vs no_edit (timerome (alpha=2, q=4)) |" in md and "No reference model" in md
    assert md.count("llada/checkpoint fLP") == 1 and (tmp_path / "xbackbone.png").stat().st_size > 1000
    # a second run reads every cell back: one cache for all checkpoints, keyed by each model's weights
    again = run_experiment("xbackbone", seeds=(0, 1), out_dir=tmp_path, progress=False,
                           overrides=dict(n_mc=2, n_retain=3, models=models, references=refs, methods=methods))
    assert again["summary"] == res["summary"]


def test_a_worker_refuses_weights_changed_in_memory(bb):
    spec = ModelSpec.of(bb)
    assert spec.load("cpu").fingerprint() == bb.fingerprint()
    changed = load_backbone()
    with torch.no_grad():
        next(changed.model.parameters()).add_(1.0)
    with pytest.raises(TimeromeError, match="changed them in memory"):
        ModelSpec.of(changed).load("cpu")


def test_command_line_executor_options_are_checked(tmp_path):
    runner = CliRunner()
    for args, msg in ((["--executor", "spark"], "unknown executor 'spark'"),
                      (["--ray-address", "auto"], "--ray-address needs --executor ray"),
                      (["--models", "a,b"], "has no setting models")):
        res = runner.invoke(app, ["experiment", "pareto", "--out", str(tmp_path), *args])
        assert res.exit_code == 2 and res.output.startswith("error:") and msg in res.output, (args, res.output)
        assert "Traceback" not in res.output


def test_robustness_radar_entry_compares_kept_shares(tmp_path):
    from timerome.experiments.radar import read_axes
    from timerome.experiments.robustness import kept_share, radar_entry

    def row(original, **others):
        conds = {"original": {"change": {"mean": original}}}
        conds.update({c: {"change": {"mean": v}} for c, v in others.items()})
        return conds

    p = {"timerome": row(-10.0, paraphrased_question=-8.0, paraphrased_answer=-12.0, relearn=-5.0),
         "ga": row(-50.0, paraphrased_question=-40.0, paraphrased_answer=+5.0, relearn=-30.0),
         "rome": row(-20.0, paraphrased_question=-20.0, paraphrased_answer=-20.0, relearn=-20.0),
         "act_steer": row(-0.5, relearn=-0.5)}                    # too little forgetting to take a share of
    assert kept_share(p["timerome"]) == pytest.approx(0.5)        # the weakest condition: relearn keeps 5 of 10
    assert kept_share(p["ga"]) == 0.0 and kept_share(p["act_steer"]) is None
    entry = radar_entry(p)
    assert entry["value"] == pytest.approx(0.5) and entry["comparator"] == 0.0 and "vs ga" in entry["text"]
    assert radar_entry({"timerome": p["timerome"]}) is None       # nothing to compare with
    assert "weakest of paraphrased question / paraphrased answer / relearn," in entry["text"]
    # rows with no paraphrase: the share is relearning's alone, and the axis says so
    alone = radar_entry({"timerome": row(-10.0, relearn=-5.0), "ga": p["ga"]})
    assert "weakest of relearn, timerome vs ga" in alone["text"]
    (tmp_path / "robustness").mkdir()
    (tmp_path / "robustness" / "robustness.json").write_text(json.dumps({"radar": {"robustness": entry}}))
    found, _ = read_axes(tmp_path)
    assert found["robustness"]["share"] == pytest.approx(1.0)


def test_robustness_radar_axis_is_one_minus_the_worst_case_extraction():
    from timerome.experiments.robustness import extraction_radar

    s = {"no_edit": {"WorstCase": {"mean": 1.0}}, "timerome": {"WorstCase": {"mean": 0.05}},
         "ga": {"WorstCase": {"mean": 0.40}}, "rewrite": {"WorstCase": {"mean": 0.0}}}
    entry = extraction_radar(s)  # the comparator is the other method with the lowest worst case (no_edit is none)
    assert entry["value"] == pytest.approx(0.95) and entry["comparator"] == pytest.approx(1.0)
    assert "vs rewrite" in entry["text"] and entry["higher_is_better"]
    assert extraction_radar({"timerome": s["timerome"], "no_edit": s["no_edit"]}) is None
    # a method that gives nothing back because it breaks every answer (locality clearly below TimeROME's,
    # bootstrap CIs apart) is set aside, and named; one whose locality overlaps ours stays a comparator
    def loc(lo, hi):
        return {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "n": 3}

    s = {"timerome": {"WorstCase": {"mean": 0.25}, "LocalityWorst": loc(0.92, 0.96)},
         "act_steer": {"WorstCase": {"mean": 0.0}, "LocalityWorst": loc(0.0, 0.0)},
         "ga": {"WorstCase": {"mean": 0.9}, "LocalityWorst": loc(0.95, 1.0)},
         "rome": {"WorstCase": {"mean": 0.3}, "LocalityWorst": loc(0.5, 0.93)}}
    s["bad"] = {"WorstCase": {"mean": 0.8}, "LocalityWorst": loc(0.1, 0.2)}  # extracts more: we beat it on both
    entry = extraction_radar(s)
    assert entry["comparator"] == pytest.approx(0.7) and "vs rome" in entry["text"]
    assert entry["text"].endswith("set aside for clearly lower LocalityWorst: act_steer (1, LocalityWorst 0)")
    entry = extraction_radar({k: s[k] for k in ("timerome", "act_steer")})
    assert entry["comparator"] == 0.0 and "vs no method with as high a LocalityWorst" in entry["text"]


def test_radar_ablations_axis_sets_aside_a_design_that_over_forgets():
    """The paper: TIE's coordinate beats the random layer, "which over-forgets". A design whose RetainLP
    lies clearly below TimeROME's (bootstrap CIs apart) is no comparator however much it forgets; the
    text names it with what it forgot and kept; a design within TimeROME's retain stays one."""
    from timerome.experiments.radar import ABLATED, ablation_axis

    def e(mean, lo=None, hi=None, n=3):
        return {"mean": mean, "lo": mean if lo is None else lo, "hi": mean if hi is None else hi, "n": n}

    summary = {"no_edit": {"ForgetLP": e(-1.0), "RetainLP": e(-0.5)},
               ABLATED: {"ForgetLP": e(-31.0), "RetainLP": e(-0.36, -0.38, -0.34)},
               "random layer / module": {"ForgetLP": e(-41.0), "RetainLP": e(-1.07, -1.5, -0.6)},
               "attn at the traced layer": {"ForgetLP": e(-2.0), "RetainLP": e(-0.35, -0.37, -0.30)},
               "last layer 3 resid": {"ForgetLP": e(-7.0), "RetainLP": e(-0.43, -0.45, -0.37)}}
    axis = ablation_axis({"summary": summary})
    assert axis["value"] == pytest.approx(30.0) and axis["comparator"] == pytest.approx(6.0)
    assert axis["text"].endswith("vs last layer 3 resid; set aside for clearly lower RetainLP: random layer / "
                                 "module (40, RetainLP -1.07)")
    summary["last layer 3 resid"]["RetainLP"] = e(-0.43, -0.45, -0.39)  # wholly below -0.38, but forgets less:
    assert ablation_axis({"summary": summary})["comparator"] == pytest.approx(6.0)  # we beat it on both, it stays
    summary["random layer / module"]["RetainLP"] = e(-0.4, -0.45, -0.3)  # within our retain: a fair comparator
    assert ablation_axis({"summary": summary})["comparator"] == pytest.approx(40.0)
    summary["random layer / module"].pop("RetainLP")  # unknown retain: nothing against it, it stays a comparator
    assert ablation_axis({"summary": summary})["comparator"] == pytest.approx(40.0)
    only = {k: summary[k] for k in ("no_edit", ABLATED)}
    only["over"] = {"ForgetLP": e(-90.0), "RetainLP": e(-3.0)}
    axis = ablation_axis({"summary": only})
    assert axis["comparator"] == 0.0 and "vs no design keeping as much RetainLP" in axis["text"]
    only["over"]["RetainLP"] = e(-3.0, n=1)  # one seed: a point, no interval to be apart by, nothing set aside
    axis = ablation_axis({"summary": only})
    assert axis["comparator"] == pytest.approx(89.0)  # ... and the text says why it may be one only by paying more
    assert axis["text"].endswith("over is kept though its RetainLP is lower (-3 against -0.36): one seed gives no "
                                 "interval to set it aside by (run with more seeds)"), axis["text"]


def test_xbackbone_records_a_method_that_cannot_act_on_a_checkpoint_as_na(tmp_path):
    """AlphaEdit on a mixture of experts (no single down projection) is an n/a cell with its reason;
    the run goes on to the other cells and checkpoints (it stopped at that cell before)."""
    torch.set_num_threads(1)
    models = [str(FIXTURES / f / "checkpoint") for f in ("llada-moe", "llada")]
    methods = ({"method": "no_edit"}, {"method": "alphaedit", "config": {"grad_steps": 2, "stats_samples": 20}})
    row = "alphaedit (grad_steps=2, stats_samples=20)"
    res = run_experiment("xbackbone", seeds=(0,), out_dir=tmp_path, progress=False,
                         overrides=dict(n_mc=2, n_retain=3, models=models, methods=methods))
    moe, dense = res["summary"]["llada-moe/checkpoint"], res["summary"]["llada/checkpoint"]
    assert "ForgetLP" in moe["no_edit"] and not moe.get(row)  # measured / n/a
    assert np.isfinite(dense[row]["ForgetLP"]["mean"])       # the next checkpoint ran it
    saved = json.loads((tmp_path / "xbackbone.json").read_text())["not_applicable"]
    assert list(saved["llada-moe/checkpoint"]) == [row] and saved["llada/checkpoint"] == {}
    assert "single down projection" in saved["llada-moe/checkpoint"][row]
    md = (tmp_path / "xbackbone.md").read_text()
    assert f"| {row} | n/a | n/a | " in md and f"llada-moe/checkpoint: n/a ({row})" in md
    # the same class in a one-model table: canonical on the mixture of experts
    # and the rewrite memory on a model that never says its target's tokens surely (the fixture's random
    # weights): no value to write, so n/a, not the end of `experiment all` (stop 65 found it stopping there)
    res = run_experiment("canonical", model=models[0], seeds=(0,), out_dir=tmp_path / "c", progress=False,
                         overrides=dict(n_mc=2, retain_authors=1, rouge=False, methods=(*methods, {"method": "rewrite"})))
    md = (tmp_path / "c" / "canonical.md").read_text()
    assert f"| {row} | n/a |" in md and f"n/a ({row}): the method cannot act on this model" in md
    assert "| rewrite | n/a |" in md and "n/a (rewrite): the method cannot act on this model" in md
    assert res["not_applicable"][row] == saved["llada-moe/checkpoint"][row] and set(res["not_applicable"]) == {row, "rewrite"}
    assert "never says" in res["not_applicable"]["rewrite"]
    # editing and robustness (what `experiment all` runs next) too: n/a rows, the other rows measured
    short = [{"method": "no_edit"}, {"method": "alphaedit", "config": {"grad_steps": 2, "stats_samples": 20}}]
    res = run_experiment("editing", model=models[0], seeds=(0,), out_dir=tmp_path / "e", progress=False,
                         overrides=dict(methods=short, sets={"f": "embedded:forget01"}, n_mc=2, n_retain=2, n_world=2))
    assert list(res["not_applicable"]["f"]) == [row] and "Efficacy" in res["summary"]["f"]["no_edit"]
    assert f"| {row} | n/a |" in (tmp_path / "e" / "editing.md").read_text()
    res = run_experiment("robustness", model=models[0], seeds=(0,), out_dir=tmp_path / "r", progress=False,
                         overrides=dict(methods=short, n_mc=2, eval_forget=2,
                                        extraction=dict(settings=["nominal"], attacks=["first name"], n_retain=2,
                                                        n_world=2)))
    assert list(res["not_applicable"]) == [row] and "LP_original" in res["summary"]["no_edit"]
    md = (tmp_path / "r" / "robustness.md").read_text()
    assert md.count(f"| {row} | n/a |") == 4 and "single down projection" in md  # panel, LP, extraction, per condition
    # a rerun without the extraction leaves no plot of the earlier one beside its report (review 64)
    assert (tmp_path / "r" / "robustness-extraction.png").is_file()
    run_experiment("robustness", model=models[0], seeds=(0,), out_dir=tmp_path / "r", progress=False,
                   overrides=dict(methods=short, n_mc=2, eval_forget=2, extraction=False))
    assert not (tmp_path / "r" / "robustness-extraction.png").exists()


def test_the_radar_says_why_an_npo_sweep_axis_is_missing(tmp_path):
    """Review 73: where every TimeROME row of the sweep collapsed, its three axes were said to be missing with
    no reason; the sweep now records why, and the radar says it."""
    from timerome.experiments.radar import read_axes

    (tmp_path / "npo_sweep").mkdir()
    why = "every TimeROME row collapsed by the sweep's rule (timerome (alpha=2))"
    (tmp_path / "npo_sweep" / "npo_sweep.json").write_text(json.dumps({"radar": {}, "radar_missing": why}))
    _, missing = read_axes(tmp_path)
    assert missing["converged baseline"].endswith(f"has no 'converged baseline' entry: {why}"), missing
    assert missing["install time"].endswith(why) and missing["extra memory"].endswith(why)


def test_xbackbone_refuses_a_setting_an_autoregressive_model_leaves_unread_before_any_model_loads(tmp_path):
    """ROME's n_states (cloze states) on a list of models whose second is autoregressive: refused, naming that
    model's column, before the first model loads (it was refused only when the run reached that model, after
    every cell of the models before it)."""
    from timerome.backbones.tiny import make_tiny_checkpoint

    ar = make_tiny_checkpoint("llama", tmp_path / "ar" / "checkpoint", layers=2)
    loaded = []
    methods = ({"method": "no_edit"}, {"method": "rome", "config": {"n_states": 1}})
    with pytest.raises(TimeromeError, match=r"experiment 'xbackbone' \(ar/checkpoint\): n_states counts the cloze"):
        run_experiment("xbackbone", seeds=(0,), out_dir=tmp_path / "x", progress=False,
                       load=lambda p: loaded.append(p) or load_backbone(p),
                       overrides=dict(n_mc=2, n_retain=3, methods=methods,
                                      models=[str(FIXTURES / "llada" / "checkpoint"), str(ar)]))
    assert loaded == []
    # without that setting both models run
    res = run_experiment("xbackbone", seeds=(0,), out_dir=tmp_path / "y", progress=False,
                         overrides=dict(n_mc=2, n_retain=3, methods=methods[:1],
                                        models=[str(FIXTURES / "llada" / "checkpoint"), str(ar)]))
    assert set(res["summary"]) == {"llada/checkpoint", "ar/checkpoint"}
