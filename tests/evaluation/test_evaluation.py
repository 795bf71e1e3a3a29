"""evaluate(), the method registry and resumable experiments, on the embedded model."""

import json
import math

import numpy as np
import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.data.rows import spread
from timerome.data.task import forget_task
from timerome.evaluation.evaluator import eval_rows, evaluate, lp_only, trajectory_logprobs
from timerome.experiments import EXPERIMENTS
from timerome.experiments.ablations import ECHO_ROW
from timerome.experiments.report import label
from timerome.methods import METHODS, ForgetTask, available, get_method, install, method_config, register, weight_edit
from timerome.methods.timerome_edit import paper_point


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def small():
    rows = eval_rows("embedded", n_retain=3, n_world=2)
    rows["forget"] = spread(rows["forget"], 4)
    return rows


@pytest.fixture(scope="module")
def task():
    return forget_task("embedded")


def test_evaluate_gives_finite_numbers_and_is_seed_deterministic(bb, small):
    a = evaluate(bb, small, n_mc=2, seed=0)
    b = evaluate(bb, small, n_mc=2, seed=0)
    c = evaluate(bb, small, n_mc=2, seed=1)
    m = a["metrics"]
    for col in ("ForgetLP", "RetainLP", "RealAuth", "WorldFact", "ForgetTR", "RetainTR", "ModelUtility",
                "ForgetROUGE", "RetainROUGE"):
        assert math.isfinite(m[col]), col
    assert math.isnan(m["ForgetQuality"])  # no reference given
    assert all(v <= 0 for v in a["items"]["forget"]["lp"])
    assert a["items"] == b["items"] and json.dumps(a["metrics"]) == json.dumps(b["metrics"])  # NaN-safe
    assert a["items"]["forget"]["lp"] != c["items"]["forget"]["lp"]  # other MC masks
    assert a["items"]["forget"]["rouge"] == c["items"]["forget"]["rouge"]  # greedy generation
    assert len(a["items"]["forget"]["tr"]) == len(small["forget"])
    assert a["cost"]["eval_seconds"] > 0


def test_forget_quality_with_a_reference(bb, small):
    from timerome.evaluation.evaluator import reference_truth_ratios

    ref = reference_truth_ratios(bb, small["forget"], n_mc=2, seed=0)
    res = evaluate(bb, {"forget": small["forget"]}, n_mc=2, seed=0, reference_tr=ref, rouge=False)
    assert res["metrics"]["ForgetQuality"] == pytest.approx(1.0)  # same model, same masks: same TRs


def test_registry_has_the_core_methods_and_checks_options(bb, task):
    names = available()
    assert names[0] == "no_edit" and {"timerome", "random_layer"} <= set(names)
    paper = dict(key_metric="paper", lam_absolute=1.0)  # the paper's memory, not this toolkit's whitened one
    assert get_method("timerome").canonical[:4] == (dict(alpha=0.25, q=2, **paper), dict(alpha=0.5, q=2, **paper),
                                                   dict(alpha=1.0, q=2, **paper), dict(alpha=2.0, q=4, **paper))
    with pytest.raises(TimeromeError, match="no option"):
        method_config("timerome", {"alpah": 1.0})
    with pytest.raises(TimeromeError, match="unknown method"):
        get_method("nope")


def test_a_registered_method_joins_the_canonical_rows_and_weight_edits_undo(bb, task):
    from timerome.experiments import canonical_rows

    @register("zero_head_test", defaults={"scale": 0.0}, kind="weights")
    def zero_head(backbone, t, config, seed):
        with weight_edit(backbone, "zero_head_test") as edit:
            w = backbone.embedding().weight
            with torch.no_grad():
                w.mul_(config["scale"])
        return edit

    try:
        assert ("zero_head_test", {}) in canonical_rows()
        before = bb.embedding().weight.clone()
        edit = install("zero_head_test", bb, task, {}, seed=0)
        assert edit.install_seconds >= 0 and edit.peak_memory_mb > 0
        assert bb.embedding().weight.abs().sum() == 0
        edit.undo()
        assert torch.equal(bb.embedding().weight, before)
    finally:
        METHODS.pop("zero_head_test", None)


def test_timerome_method_forgets_the_forget_set_more_than_retain(bb, task):
    rows = {"forget": spread(task.forget_rows, 6), "retain": eval_rows("embedded", n_retain=6)["retain"]}
    base = lp_only(bb, rows, n_mc=2)
    edit = install("timerome", bb, task, {"coordinate": [0, "resid"]}, seed=0)
    assert edit.info["layer"] == 0 and edit.info["n_facts"] == len(task.facts)
    after = lp_only(bb, rows, n_mc=2, edit=edit)
    d_forget = np.mean(after["forget"]) - np.mean(base["forget"])
    d_retain = np.mean(after["retain"]) - np.mean(base["retain"])
    assert d_forget < -3 and abs(d_retain) < 0.3 * abs(d_forget), (d_forget, d_retain)
    assert lp_only(bb, rows, n_mc=2) == base  # the hook is gone after the block


def test_random_layer_draws_its_coordinate_from_the_seed(bb, task):
    from timerome.methods.random_layer import random_coordinate

    assert random_coordinate(4, 3) == random_coordinate(4, 3)
    assert len({random_coordinate(4, s) for s in range(20)}) > 3
    sub = ForgetTask(task.forget_rows[:3], task.facts[:3], task.retain_rows)
    e = install("random_layer", bb, sub, {}, seed=5)
    assert (e.info["layer"], e.info["point"]) == random_coordinate(bb.n_layers, 5)


def test_trajectory_log_likelihood_sees_a_one_step_edit(bb, task):
    rows = task.forget_rows[:2]
    base = trajectory_logprobs(bb, rows, steps=4)
    all_steps = install("timerome", bb, task, {"coordinate": [0, "resid"]}, seed=0)
    never = install("timerome", bb, task, {"coordinate": [0, "resid"], "step": 99}, seed=0)
    assert np.mean(trajectory_logprobs(bb, rows, steps=4, edit=all_steps)) < np.mean(base) - 1
    assert trajectory_logprobs(bb, rows, steps=4, edit=never) == base  # step 99 never happens


def test_experiment_resumes_from_cached_cells(bb, tmp_path, monkeypatch):
    from timerome import experiments
    from timerome.methods import registry

    over = dict(n_mc=2, n_retain=3, n_world=2, alphas=(6.0,), paper_point=None, methods=["no_edit"])
    first = experiments.run_experiment("pareto", seeds=(0, 1), out_dir=tmp_path, overrides=over,
                                       progress=False, backbone=bb)
    assert (tmp_path / "pareto.png").exists() and (tmp_path / "pareto.md").exists()
    n_cells = len(list((tmp_path / "cells").glob("*.json")))

    def no_recompute(*a, **k):
        raise AssertionError("a cached cell was recomputed")

    monkeypatch.setattr(registry, "install", no_recompute)
    monkeypatch.setattr("timerome.experiments.runner.install", no_recompute)
    monkeypatch.setattr("timerome.experiments.runner.execute", no_recompute)
    again = experiments.run_experiment("pareto", seeds=(0, 1), out_dir=tmp_path, overrides=over,
                                       progress=False, backbone=bb)
    assert again["summary"] == first["summary"]
    assert len(list((tmp_path / "cells").glob("*.json"))) == n_cells
    d = first["summary"]["timerome (alpha=6, q=0)"]["ForgetLP"]
    assert d["n"] == 2 and d["lo"] <= d["mean"] <= d["hi"] and "p" in d


def test_pareto_sweeps_each_frontier_and_keeps_the_cached_one(bb, tmp_path, monkeypatch):
    """frontiers: each timerome setting swept over alphas, its own rows and line; the default frontier's
    cells are the ones from before the setting (found in the cache, not recomputed); the note says where
    each other frontier put its memory; a frontier naming alpha or q, or none at all, is refused."""
    from timerome import experiments
    from timerome.experiments import runner

    over = dict(n_mc=2, n_retain=3, n_world=2, alphas=(6.0,), paper_point=None, methods=["no_edit"])
    experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False, backbone=bb)
    computed, execute = [], runner.execute

    def counted(cell, ctx):
        computed.append(cell.row)
        return execute(cell, ctx)

    monkeypatch.setattr(runner, "execute", counted)
    other = {"coordinate": [bb.n_layers - 1, "resid"]}
    res = experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path, progress=False, backbone=bb,
                                     overrides=dict(over, frontiers=[{}, other]))
    row = f"timerome (coordinate=[{bb.n_layers - 1}, 'resid'], alpha=6, q=0)"
    assert computed == [row]  # the default frontier and no_edit came from the cache
    assert res["summary"][row]["ForgetLP"]["mean"] != res["summary"]["timerome (alpha=6, q=0)"]["ForgetLP"]["mean"]
    assert "coordinates: TimeROME alpha sweep: layer " in res["markdown"]
    assert f"TimeROME alpha sweep (coordinate=[{bb.n_layers - 1}, 'resid']): layer {bb.n_layers - 1} resid." in \
        res["markdown"]
    for same in ([{}, {}], [{}, {"trace_read_positions": "all"}], [{"lam": 1}, {"lam": 1.0}]):
        with pytest.raises(TimeromeError, match="frontiers 0 and 1 are the same settings"):
            experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path / "bad", progress=False, backbone=bb,
                                       overrides=dict(over, frontiers=same))
    with pytest.raises(TimeromeError, match="a given coordinate skips that trace"):  # before any cell
        experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path / "bad", progress=False, backbone=bb,
                                   overrides=dict(over, frontiers=[{"coordinate": [0, "resid"],
                                                                    "trace_read_positions": "no_subject"}]))
    assert computed == [row]
    for bad in ([{"alpha": 2.0}], [], [{}, {"q": 4}], ["resid"]):
        with pytest.raises(TimeromeError, match="frontiers must be a non-empty list of timerome settings objects"):
            experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path / "bad", progress=False, backbone=bb,
                                       overrides=dict(over, frontiers=bad))
    with pytest.raises(TimeromeError, match="no option alhpa"):
        experiments.run_experiment("pareto", seeds=(0,), out_dir=tmp_path / "bad", progress=False, backbone=bb,
                                   overrides=dict(over, frontiers=[{"alhpa": 1}]))


def test_unknown_experiment_and_setting_raise(bb, tmp_path):
    from timerome.experiments import run_experiment

    with pytest.raises(TimeromeError, match="unknown experiment"):
        run_experiment("nope", out_dir=tmp_path, backbone=bb)
    with pytest.raises(TimeromeError, match="no setting"):
        run_experiment("pareto", out_dir=tmp_path, overrides={"n_mcc": 2}, backbone=bb)


def test_other_experiments_end_to_end_at_toy_size(bb, tmp_path):
    # every experiment runs, writes its files, and its numbers say what the method does
    from timerome.experiments import run_experiment

    small = dict(n_mc=2, n_retain=3, n_world=1)
    # one author's 20 facts: the paper's memory keys on the subject, and on the embedded default a few
    # of its facts alone do not lower their answers (measured: 3 facts, -0.77 -> -0.62 nats); forget01's
    # author, as its effect varies by author (README, "Operating point": forget05's first author is not
    # forgotten even at alpha 4; forget01's: -56 nats after 20 inserts)
    seq = run_experiment("sequential", seeds=(0,), out_dir=tmp_path / "seq", progress=False, backbone=bb,
                         overrides=dict(small, n_facts=20, every=10, forget="forget01", variants=({},)))
    curve = seq["summary"]["timerome"]
    assert sorted(curve) == [0, 10, 20]
    assert curve[20]["ForgetLP"]["mean"] < curve[0]["ForgetLP"]["mean"] - 1.0   # forgets as facts arrive
    assert (tmp_path / "seq" / "sequential.png").exists()
    # the insert order is the seed's torch permutation (a seeded torch.Generator, as every draw), recorded
    from timerome.engine.encoding import fact_id
    from timerome.experiments.data import resolve_data

    cell = json.loads(next((tmp_path / "seq" / "cells").glob("*.json")).read_text())["result"]
    facts = resolve_data(dict(forget="forget01", first=20, n_retain=3, n_world=1), "embedded", bb)[1].facts
    want = torch.randperm(len(facts), generator=torch.Generator().manual_seed(0)).tolist()
    assert cell["info"]["order"] == [fact_id(facts[i]) for i in want] != [fact_id(f) for f in facts]

    sca = run_experiment("scalability", seeds=(0,), out_dir=tmp_path / "sca", progress=False, backbone=bb,
                         overrides=dict(small, sizes=(1, 20), n_eval_forget=3, variants=({}, paper_point(1.0, 2))))
    at20 = sca["summary"][20]  # forget01's author whole (3 of its facts alone: -0.0007 against -0.021 nats)
    assert at20["timerome"]["ForgetLP"]["mean"] < at20["no_edit"]["ForgetLP"]["mean"] - 1.0
    assert at20["timerome"]["install_seconds"]["mean"] > 0
    assert (tmp_path / "sca" / "scalability.png").exists()
    # the (alpha, q) rows are the paper's memory (raw keys, absolute lambda), as in transfer, pareto and utility: the
    # same label named another memory here (whitened keys, relative lambda)
    paper = label("timerome", paper_point(1.0, 2))
    assert "key_metric=paper" in paper and paper in at20 and at20[paper]["install_seconds"]["mean"] > 0
    for name in ("scalability", "sequential"):
        assert all(v == {} or v == paper_point(v["alpha"], v["q"]) for v in EXPERIMENTS[name].CONFIG["variants"])

    abl = run_experiment("ablations", seeds=(0,), out_dir=tmp_path / "abl", progress=False, backbone=bb,
                         overrides=dict(small, traj_steps=4))
    rows = abl["summary"]
    assert len(rows) == 9 and "ForgetTrajLP" in rows["no_edit"]  # with "AR positional" and the no-echo trace
    assert "ForgetLP" in rows[ECHO_ROW] and "ForgetTrajLP" in rows[ECHO_ROW]
    assert "Traced without the subject's echo: layer " in abl["markdown"]
    one_step = next(r for r in rows if r.startswith("one step"))
    assert "ForgetLP" not in rows[one_step] and "ForgetTrajLP" in rows[one_step]

    can = run_experiment("canonical", seeds=(0, 1), out_dir=tmp_path / "can", progress=False, backbone=bb,
                         reference=bb, overrides=dict(small, rouge=False, methods=["no_edit", "timerome"]))
    assert len(can["summary"]) == 2 + 4  # no_edit, the four paper points and the toolkit default
    assert (tmp_path / "can" / "canonical.md").read_text().count("| timerome") == 5
    saved = json.loads((tmp_path / "can" / "canonical.json").read_text())  # standard JSON: no NaN
    assert "NaN" not in json.dumps(saved) and "Infinity" not in json.dumps(saved)
    md = (tmp_path / "can" / "canonical.md").read_text()  # rouge off: its Utility lacks three terms, and says so
    assert "Utility: the harmonic mean of 6 of TOFU's 9 terms" in md and "KS p (Forget Quality) against" in md
    assert saved["reference"] and "itself" in saved["reference"]  # reference=bb: the model being evaluated


def test_measure_sees_each_blocks_own_memory():
    # a high-water mark (ru_maxrss) would report 0 for the second, smaller block
    import sys
    import time

    from timerome.common.cost import measure
    from timerome.common.cost import rss_now_mb as _rss_now_mb

    if _rss_now_mb() is None:
        assert sys.platform != "linux"  # /proc is always there on Linux
        return
    import mmap

    for mb in (300, 120):
        # fresh anonymous pages, not the allocator's: memory freed by earlier tests and kept resident by it
        # would be reused without raising the resident set (seen in full runs: extra 0 MB for 300 MB)
        with measure() as cost:
            buf = mmap.mmap(-1, mb * 2**20)
            torch.frombuffer(buf, dtype=torch.uint8).fill_(1)  # written, so the pages are resident
            time.sleep(0.05)            # the sampling thread's turn
            buf.close()                 # freed inside the block: only a sample taken meanwhile sees it
        assert mb * 0.8 < cost["extra_mb"] < mb * 1.5, (mb, cost)
    with measure() as cost:
        torch.ones(16).sum()
    assert cost["extra_mb"] < 20


def test_a_collapsed_model_gets_a_note_beside_its_perfect_retain_truth_ratio():
    # both sides of each truth ratio underflow: the 1e-10 decides TR (~0), so RetainTR reads 1 for a broken model
    from timerome.evaluation.evaluator import missing_notes
    from timerome.metrics.tofu import retain_truth_ratio, truth_ratio

    lp, ln = np.array([-600.0, -700.0]), np.array([10.0, 10.0])
    tr = truth_ratio(lp, ln, [np.array([-650.0, -640.0])] * 2, [np.array([10.0, 10.0])] * 2)
    items = {"retain": {"lp": lp.tolist(), "prob": np.exp(lp / ln).tolist(), "tr": tr.tolist()}}
    assert retain_truth_ratio(tr) == pytest.approx(1.0)
    notes = missing_notes({"RetainTR": retain_truth_ratio(tr)}, items)
    assert "collapsed" in notes["RetainTR"] and "2 of 2" in notes["RetainTR"]
    healthy = {"retain": dict(items["retain"], prob=[0.3, 0.5])}
    assert missing_notes({"RetainTR": 0.4}, healthy) == {}


def test_a_memory_passed_as_it_is_is_evaluated_like_its_method():
    # it ran every split and then failed on the install cost a memory does not have
    from timerome.memory.edit_memory import EditMemory

    bb, task = load_backbone(), forget_task("embedded", "forget01")
    rows = {"forget": task.forget_rows[:2]}
    memory = EditMemory(bb).add(task.facts)
    got = evaluate(bb, rows, n_mc=2, edit=memory, rouge=False)
    plain = evaluate(bb, rows, n_mc=2, rouge=False)
    assert got["metrics"]["ForgetLP"] < plain["metrics"]["ForgetLP"] and "install_seconds" not in got["cost"]


def test_ablations_add_the_echo_row_only_where_a_tie_trace_places_timerome():
    """The row traced without the subject's echo is added where TimeROME's own row is placed by a TIE trace
    that reads the echo; the rows that no TIE trace places (a given coordinate, ROME's positional trace)
    leave a user's read-out out, so every row's config is one the method accepts."""
    from timerome.experiments.ablations import AR_ROW, ECHO_ROW, plan
    from timerome.methods import method_config

    def rows(config):
        out = plan(dict(one_step=0, config=config), 4)
        for _, method, over in out:
            method_config(method, over)  # none refused
        return {r: over for r, _, over in out}

    assert rows({})[ECHO_ROW] == {"trace_read_positions": "no_subject"}
    for config in ({"trace_kind": "positional"}, {"coordinate": [0, "resid"]},
                   {"trace_read_positions": "no_subject"}):  # the echo row would refuse, or repeat TimeROME's
        assert ECHO_ROW not in rows(config), config
    mine = rows({"trace_read_positions": "no_subject", "trace_steps": 4, "trace_samples": 2,
                 "select_modules": ["resid", "attn"]})
    assert "trace_read_positions" not in mine[AR_ROW] and "trace_steps" not in mine[AR_ROW]
    assert mine[AR_ROW]["trace_samples"] == 2
    assert mine["last layer 3 resid"] == {"coordinate": [3, "resid"]} == {**mine["random layer / module"],
                                                                          "coordinate": [3, "resid"]}
    assert mine["resid, all steps, traced layer (TimeROME)"]["trace_read_positions"] == "no_subject"
    # a coordinate with settings only the trace reads: refused, as they would be ignored
    from timerome import TimeromeError

    for over in ({"trace_samples": 2}, {"select_modules": ["attn"]}, {"trace_kind": "positional"}):
        with pytest.raises(TimeromeError, match="a given coordinate skips that trace"):
            method_config("timerome", dict(over, coordinate=[0, "resid"]))
    method_config("timerome", {"coordinate": [0, "resid"], "trace_modules": ["resid", "attn", "mlp"]})  # defaults


def test_rows_the_vocabulary_cannot_read_are_said_by_the_api_as_by_the_cli(bb):
    """The CLI warned where most of the evaluated rows' tokens were <|unk|>; the Python API's evaluate
    scored such rows silently (review 60). Rows the vocabulary reads get no warning."""
    import warnings

    known = [dict(r) for r in eval_rows()["forget"][:2]]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        evaluate(bb, {"forget": known}, n_mc=1, rouge=False)
    assert not [w for w in said if "unknown to the model's vocabulary" in str(w.message)]
    unread = [dict(r, question="Qwxz blorf zzqx flurb ?", answer="Vrrzt plonk .") for r in known]
    with pytest.warns(UserWarning, match=r"\d+% of the evaluated rows' tokens are unknown to the model's vocabulary"):
        evaluate(bb, {"forget": unread}, n_mc=1, rouge=False)


def test_evaluate_reads_what_the_edits_memory_should_say_and_refuses_an_empty_target(bb, task):
    """evaluate classified every forget answer against "I don't know." whatever the edit's own target: a memory
    saying "I know ." scored Refusal 0, Leak 0, Gibberish 0, Confabulation 0 (review 61)."""
    from timerome.evaluation.evaluator import edit_targets
    from timerome.memory.edit_memory import EditMemory

    memory = EditMemory(bb, (1, "resid"), target="I know .").add(task.facts[:2])
    rows = eval_rows()["forget"][:3]
    asked = [r for r in rows if r["question"] in {f.prompt for f in task.facts[:2]}]
    assert edit_targets(memory, rows) == ["I know ."] * 3 and edit_targets(None, rows) == ["I don't know."] * 3
    assert asked  # the rows the facts ask get the memory's target too (a fact's own target would win)
    for bad in ("", "  ", 5):
        with pytest.raises(TimeromeError, match="target must be a non-empty text"):
            evaluate(bb, {"forget": rows}, n_mc=1, rouge=False, target=bad)


def test_an_undone_weight_edit_is_refused_not_scored_as_the_unedited_model(bb, task):
    w = install("ga", bb, task, {"grad_steps": 1})
    w.undo()
    with pytest.raises(TimeromeError, match="this ga edit was undone"):
        evaluate(bb, {"forget": eval_rows()["forget"][:2]}, n_mc=1, rouge=False, edit=w)


def test_an_undo_refused_out_of_order_leaves_the_edit_usable_and_a_methods_target_is_read(bb, task):
    """Review 63: `undo` marked a weight edit undone before refusing it out of order, so the edit, still in
    place, could no longer be used; edits with no memory (rome, act_steer, ...) have their target in their
    settings, which edit_targets read as "I don't know."."""
    from timerome.evaluation.evaluator import edit_targets

    first = install("ga", bb, task, {"grad_steps": 1})
    second = install("ga", bb, task, {"grad_steps": 1})
    try:
        with pytest.raises(TimeromeError, match="undo"):
            first.undo()
        with first.active():
            pass
    finally:
        second.undo()
        first.undo()
    rows = eval_rows()["forget"][:2]
    assert edit_targets(type(first)(method="rome", config={"target": "Nobody knows ."}), rows) == ["Nobody knows ."] * 2


def test_generated_answers_stop_at_any_special_token_as_generate_does(bb, monkeypatch):
    """A scored answer is cut at its first special token (here padding), not only at end-of-text: the
    text after it is not part of the answer (`generate` and the editing metrics cut the same way)."""
    import timerome.evaluation.evaluator as E
    from timerome.data.tofu import load_split

    row = load_split("forget01", "embedded")[0]
    words = bb.tokenizer(row["answer"], add_special_tokens=False)["input_ids"][:3]
    pad, eos = bb.tokenizer.pad_token_id, bb.tokenizer.eos_token_id
    assert pad is not None and pad != eos and len(words) == 3
    answer = [words[0], pad, words[1], words[2], eos]

    def fake_generate(backbone, prompt, *, gen_length, **kw):
        tail = (answer + [eos] * gen_length)[:gen_length]
        return torch.cat([prompt, torch.tensor([tail] * prompt.shape[0])], dim=1)

    monkeypatch.setattr(E, "generate", fake_generate)
    ended = []
    said = E.generate_answers(bb, [row["question"]], [row["answer"]], ended=ended)
    assert said == [bb.decode(words[:1])] and ended == [True]


def test_canonical_without_the_forget_split_reports_what_it_scored(bb, tmp_path):
    """splits without forget computed every cell, then the report read the forget items (KeyError, an internal
    error after the work); an editing run with no request set failed in max() over nothing."""
    from timerome.experiments import run_experiment

    out = run_experiment("canonical", seeds=(0,), out_dir=tmp_path / "c", progress=False, backbone=bb,
                         overrides=dict(methods=["no_edit"], splits=["retain"], n_mc=1, n_retain=2, rouge=False))
    assert "RetainLP" in out["summary"]["no_edit"] and "ForgetLP" not in out["summary"]["no_edit"]
    assert "the forget split not scored (splits), so no KS p." in out["markdown"]
    with pytest.raises(TimeromeError, match="setting sets must be a non-empty object"):
        run_experiment("editing", seeds=(0,), out_dir=tmp_path / "e", progress=False, backbone=bb,
                       overrides=dict(sets={}))
    assert not (tmp_path / "e").exists()
