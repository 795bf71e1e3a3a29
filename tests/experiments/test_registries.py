"""The experiments' registries: experiments found without a list, measurements with their cost."""

import dataclasses
import json

import pytest

from timerome import TimeromeError, load_backbone
from timerome.experiments import EXPERIMENTS
from timerome.experiments.runner import MEASURES, Cell, Context, check_cells, measurement, measurement_of


def test_every_experiment_is_found_without_a_list():
    names = list(EXPERIMENTS)
    assert names[0] == "canonical" and names[-1] == "radar"   # radar reads the others' outputs: last
    assert {"editing", "robustness", "sequential", "utility", "xbackbone"} <= set(names)
    orders = [m.ORDER for m in EXPERIMENTS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_a_measurement_brings_its_own_cost_to_the_budget():
    assert measurement_of("sequential").forwards is not measurement_of("lp").forwards  # its own, in sequential.py
    assert not measurement_of("reference").uses_method and measurement_of("reference").uses_reference
    ctx = Context(backbone=load_backbone())
    try:
        @measurement("probe_cost", forwards=lambda cell, rows, task: cell.options["n"])
        def probe(cell, ctx, rows, task):
            return {}

        check_cells([Cell("probe_cost", options={"n": 10})], ctx)          # within the budget
        with pytest.raises(TimeromeError, match="probe_cost|cells"):
            check_cells([Cell("probe_cost", options={"n": 10**12})], ctx)  # the registered cost is what counts
    finally:
        MEASURES.pop("probe_cost", None)
    with pytest.raises(TimeromeError, match="unknown measurement"):
        measurement_of("no_such_measurement")


def test_a_measurements_version_is_in_its_cells_keys_only():
    """Bumping one measurement's version retires its cached cells and no other's (sequential: 1, since its
    insert order came from torch's seeded generator); at 0 the key is as before versions existed."""
    ctx = Context(backbone=load_backbone())
    seq, full = Cell("sequential", "timerome"), Cell("full", "timerome")
    assert seq.key(ctx)["measure_version"] == measurement_of("sequential").version == 1
    assert measurement_of("full").version == 0 and "measure_version" not in full.key(ctx)
    # the benchmarks' measurements: 1 since stop 76 (an AR model's exact membership scores, the cut counts), so a
    # run into an earlier --out computes them again instead of reading the old numbers
    for kind in ("muse", "whp", "wmdp", "rwku"):
        assert measurement_of(kind).version == 1 and Cell(kind, "no_edit").key(ctx)["measure_version"] == 1
    try:
        @measurement("probe_version", version=2)
        def probe(cell, ctx, rows, task):
            return {}

        a = Cell("probe_version").key(ctx)
        MEASURES["probe_version"] = dataclasses.replace(MEASURES["probe_version"], version=3)
        assert Cell("probe_version").key(ctx) != a
    finally:
        MEASURES.pop("probe_version", None)


def test_the_cli_lists_the_experiments_the_registry_runs():
    from timerome.cli.run import experiment_names

    assert experiment_names() == list(EXPERIMENTS)  # read from the files: the help costs no import


def test_a_one_step_edit_is_refused_before_any_cell_where_its_measurement_reads_likelihoods():
    """A method's `step` option makes an edit of that denoising step only: likelihood measurements (lp,
    robustness, the benchmarks' ...) never meet it, so check_cells refuses them before the first cell
    (the forward would raise OutsideTrajectory mid-run); the trajectory and editing measurements read
    steps, and pass."""
    assert {n for n, m in MEASURES.items() if m.reads_steps} == {"traj", "editing", "lm_eval"}
    ctx = Context(backbone=load_backbone())
    for measure in ("lp", "full", "robustness"):
        with pytest.raises(TimeromeError, match=rf"one-step row: the edit acts at denoising step 2 only, and the "
                                                rf"'{measure}' measurement reads likelihoods.*leave step out .*the editing experiment"):
            check_cells([Cell("lp", "no_edit"), Cell(measure, "timerome", {"step": 2}, row="one-step row")], ctx)
    check_cells([Cell("traj", "timerome", {"step": 2}), Cell("lp", "timerome", {"step": None})], ctx)


def test_the_experiment_cli_refuses_a_one_step_method_in_a_likelihood_experiment(tmp_path):
    from typer.testing import CliRunner

    from timerome.cli import app

    cfg = '{"methods": ["no_edit", {"method": "timerome", "config": {"step": 1}}], "extraction": false}'
    res = CliRunner().invoke(app, ["experiment", "robustness", "-c", cfg, "--out", str(tmp_path / "exp")])
    assert res.exit_code != 0
    assert res.output.startswith("error: timerome (step=1): the edit acts at denoising step 1 only, and the "
                                 "'robustness' measurement reads likelihoods"), res.output
    assert len(res.output.strip().splitlines()) == 1
    cells = tmp_path / "exp" / "cells"
    assert not cells.exists() or not any(cells.iterdir())  # refused before the first cell


def test_the_robustness_experiment_takes_extraction_false_as_its_docs_say():
    from timerome.experiments.robustness import CONFIG
    from timerome.experiments.settings import check_settings

    check_settings("robustness", {"extraction": False}, CONFIG)
    check_settings("robustness", {"extraction": {"settings": ["greedy"], "n_retain": 5}}, CONFIG)
    for bad in (True, "no", {"setings": []}):
        with pytest.raises(TimeromeError, match="setting extraction must be false .no extraction cells. or an object"):
            check_settings("robustness", {"extraction": bad}, CONFIG)


def test_a_reference_folder_keys_the_cells_by_its_files_and_a_loaded_copy_of_the_model_is_caught(tmp_path):
    """Cells measured against a reference folder were keyed by its path alone: new weights in the same
    folder met the old cells (stop 60's audit: KS p 1.000 from the cache, 0.255 fresh). A copy of the
    evaluated model as the reference was not seen as the model itself."""
    import shutil

    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    bb = load_backbone()
    ref = tmp_path / "ref"
    shutil.copytree(DEFAULT_MODEL_DIR, ref)
    ctx = Context(backbone=bb, reference=str(ref))
    cell = Cell("reference", seed=0, data={"forget": "forget01"}, options={"n_mc": 1})
    before = cell.key(ctx)
    assert before == cell.key(Context(backbone=bb, reference=str(ref)))  # a resume finds its cells
    weights = ref / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # rewritten: the files' times change, whatever they hold
    assert cell.key(ctx) != before
    assert not ctx.reference_is_model()  # another folder, not loaded yet
    ctx.reference_backbone()
    assert ctx.reference_is_model() and "itself" in ctx.reference_label  # its weights are the model's


def test_a_table_says_when_seeds_collapsed_were_two_or_it_has_no_no_edit_row():
    """A seed whose value was NaN / inf left the mean, CI and test without a mark; with 2 seeds the
    "bootstrap 95% CI" is the two values' range; without no_edit every Δ read "–" unexplained."""
    from timerome.experiments.report import DROPPED_MARK, markdown, summarise

    three = {"no_edit": {0: {"ForgetLP": -1.0}, 1: {"ForgetLP": -1.1}, 2: {"ForgetLP": -0.9}},
             "ga": {0: {"ForgetLP": -5.0}, 1: {"ForgetLP": float("-inf")}, 2: {"ForgetLP": -5.5}}}
    s = summarise(three, ["ForgetLP"])
    assert s["ga"]["ForgetLP"]["dropped"] == [1] and s["ga"]["ForgetLP"]["n"] == 2
    assert "dropped" not in s["no_edit"]["ForgetLP"]
    md = markdown(s, ["ForgetLP"], "t")
    ga_row = next(line for line in md.splitlines() if line.startswith("| ga "))
    assert DROPPED_MARK in ga_row and "NaN or infinite" in md and "range of the two values" in md
    full = {k: {seed: v for seed, v in rows.items() if seed != 1} for k, rows in three.items()}
    assert "range of the two values" in markdown(summarise(full, ["ForgetLP"]), ["ForgetLP"], "t")
    alone = markdown(summarise({"ga": three["ga"]}, ["ForgetLP"]), ["ForgetLP"], "t")
    assert "no no_edit row" in alone
    assert "no no_edit row" not in md and DROPPED_MARK not in markdown(summarise(
        {k: {0: v[0], 2: v[2]} for k, v in three.items()}, ["ForgetLP"]), ["ForgetLP"], "t").split("\n\n")[1]


def test_the_radar_names_each_source_run_and_warns_when_they_differ():
    """The radar combined outputs of other models, seeds and settings without a word (stop 60's audit:
    an ablations run on another model, one seed, n_mc 2)."""
    from timerome.experiments.radar import provenance

    run = dict(model="timerome-default", fingerprint="43d2634625f6bf33", seeds=[0, 1, 2])
    same = {"ablations": {"source": "runs/ablations/ablations.json", "run": run},
            "utility": {"source": "runs/utility/utility.json", "run": run}}
    lines = provenance(same)
    assert lines[0].startswith("Sources: ablations: timerome-default (weights 43d2634625f6)") and len(lines) == 2
    other = dict(same, utility={"source": "runs/utility/utility.json", "run": dict(run, fingerprint="ffff", seeds=[0])})
    assert "different models or seeds" in "\n".join(provenance(other))
    old = dict(same, utility={"source": "runs/utility/utility.json", "run": None})
    assert "not recorded" in provenance(old)[0] and "different models or seeds" in "\n".join(provenance(old))


def test_an_experiment_json_records_its_run(tmp_path):
    from timerome.experiments import run_experiment

    cfg = {"n_mc": 1, "n_retain": 2, "alphas": [1.0], "methods": ["no_edit"], "splits": ["forget", "retain"]}
    out = run_experiment("pareto", seeds=[0], out_dir=tmp_path / "p", overrides=cfg, progress=False)
    import json

    run = json.loads((tmp_path / "p" / "pareto.json").read_text())["run"]
    bb = load_backbone()
    import torch

    assert run == dict(model="timerome-default", fingerprint=bb.fingerprint(), seeds=[0], data="embedded", reference=None,
                       threads=[torch.get_num_threads()])
    assert out["files"]["json"].endswith("pareto.json")
    # cached cells computed under another thread count: a greedy answer may differ by that alone, said
    cell = sorted((tmp_path / "p" / "cells").glob("*.json"))[0]
    saved = json.loads(cell.read_text())
    saved["result"]["cost"]["threads"] = torch.get_num_threads() + 1
    cell.write_text(json.dumps(saved))
    with pytest.warns(UserWarning, match="computed under .* CPU threads"):
        run_experiment("pareto", seeds=[0], out_dir=tmp_path / "p", overrides=cfg, progress=False)
    run = json.loads((tmp_path / "p" / "pareto.json").read_text())["run"]
    assert run["threads"] == sorted({torch.get_num_threads(), torch.get_num_threads() + 1})
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    run_experiment("xbackbone", seeds=[0], out_dir=tmp_path / "x", progress=False,
                   overrides={"models": [str(DEFAULT_MODEL_DIR)], "methods": ["no_edit"], "n_mc": 1, "n_retain": 2})
    xrun = json.loads((tmp_path / "x" / "xbackbone.json").read_text())["run"]
    assert xrun["seeds"] == [0] and xrun["data"] == "embedded"
    assert [m["fingerprint"] for m in xrun["models"].values()] == [bb.fingerprint()]
    with pytest.raises(TimeromeError, match="computes no Forget Quality"):
        run_experiment("pareto", seeds=[0], out_dir=tmp_path / "p", overrides=cfg, progress=False, reference="x")
    with pytest.raises(TimeromeError, match="has no quick subset"):
        run_experiment("pareto", seeds=[0], out_dir=tmp_path / "p", overrides=cfg, progress=False, quick=True)


def test_a_data_spec_refuses_a_key_it_does_not_read():
    """A custom cell's data {"n_retian": 2} ran the default 40 retain rows, and splits="forget" was read as
    a substring test on the string."""
    ctx = Context(backbone=load_backbone())
    with pytest.raises(TimeromeError, match="no key 'n_retian'"):
        ctx.data({"forget": "forget01", "n_retian": 2})
    with pytest.raises(TimeromeError, match="splits must be a list"):
        ctx.data({"forget": "forget01", "splits": "forget"})
    rows, _ = ctx.data({"forget": "forget01", "n_retain": 2, "splits": ["forget", "retain"]})
    assert len(rows["retain"]) == 2 and set(rows) == {"forget", "retain"}


def test_a_split_size_or_a_reference_no_split_reads_is_refused_or_left_out():
    """Stop 67 (helper 53's audit): retain_authors where the splits leave retain out is refused by the data
    spec (n_retain and n_world, always in a spec, by the experiments that take them: test_bad_inputs); the
    canonical table builds no reference cell where its splits leave forget out (the reference model was
    trained, then its cell failed with an internal KeyError on the missing split)."""
    from timerome.experiments.canonical import CONFIG, cells

    ctx = Context(backbone=load_backbone())
    with pytest.raises(TimeromeError, match="the data spec: retain_authors sizes a split the evaluation leaves out"):
        ctx.data({"forget": "forget01", "retain_authors": 2, "splits": ["forget"]})
    assert ctx.auto_reference() is not None  # the embedded model's: reference cells where forget is scored
    made = {tuple(s) if s else None: [c.measure for c in cells(dict(CONFIG, splits=s, methods=["no_edit"]), [0], ctx)]
            for s in (None, ["forget", "retain"], ["retain", "world_facts"])}
    assert made == {None: ["reference", "full"], ("forget", "retain"): ["reference", "full"],
                    ("retain", "world_facts"): ["full"]}
    lp = Cell("lp", "no_edit", options={"n_mc": 2}, data={"n_retain": 2, "splits": ["retain"]})
    with pytest.raises(TimeromeError, match="a reference cell scores the forget split's truth ratios"):  # before any
        check_cells([lp, Cell("reference", options={"n_mc": 2}, data={"splits": ["retain"]})], ctx)


def test_a_cell_option_its_measurement_does_not_read_is_refused():
    """Cell("lp", options={"nmc": 2}) ran at the default n_mc, silently (stop 60's audit)."""
    ctx = Context(backbone=load_backbone())
    data = {"forget": "forget01", "n_retain": 2, "n_world": 1}
    with pytest.raises(TimeromeError, match="the 'lp' measurement reads no option 'nmc'; it reads n_mc"):
        check_cells([Cell("lp", "no_edit", options={"nmc": 2}, data=data)], ctx)
    with pytest.raises(TimeromeError, match="reads no option 'rouge'"):
        check_cells([Cell("lp", "no_edit", options={"n_mc": 2, "rouge": False}, data=data)], ctx)
    check_cells([Cell("lp", "no_edit", options={"n_mc": 2}, data=data),
                 Cell("full", "no_edit", options={"n_mc": 2, "rouge": False}, data=data)], ctx)


def test_every_measurement_declares_its_options_and_those_it_needs():
    """extraction, lm_eval and the benchmarks took any option (stop 60's Not done): a misspelt one ran
    the default, and a cell lacking extraction's settings failed mid-run with a KeyError."""
    import importlib

    for name in ("robustness", "transfer", "utility"):  # their @measurement
        importlib.import_module(f"timerome.experiments.{name}")
    from timerome.experiments.runner import MEASURES
    from timerome.experiments.transfer import options

    ours = {k: m for k, m in MEASURES.items() if m.run.__module__.startswith("timerome.")}  # not tests' own cells
    assert len(ours) >= 13 and all(m.options is not None for m in ours.values()), [
        k for k, m in ours.items() if m.options is None]
    ctx = Context(backbone=load_backbone())
    data = {"forget": "forget01", "n_retain": 2, "n_world": 1}
    with pytest.raises(TimeromeError, match="the 'extraction' measurement needs the option.*'attacks'"):
        check_cells([Cell("extraction", "no_edit", options={"settings": ["nominal"]}, data=data)], ctx)
    with pytest.raises(TimeromeError, match="the 'lm_eval' measurement reads no option 'fewshot'"):
        check_cells([Cell("lm_eval", "no_edit", options={"fewshot": 5}, data=data)], ctx)
    with pytest.raises(TimeromeError, match="the 'wmdp' measurement reads no option 'choice_txt'"):
        check_cells([Cell("wmdp", "no_edit", options={"choice_txt": False}, data=data)], ctx)
    from timerome.experiments.transfer import CONFIG

    assert set(options(CONFIG)) <= set(MEASURES["muse"].options)  # what transfer gives each cell


def bench_folders(tmp_path):
    """What `experiment all` checks of its benchmark folder before the load, its paths alone: muse/, whp/, wmdp/ and
    an RWKU target (a folder with one of its part files). Nothing is read from them here."""
    root = tmp_path / "bench"
    for name in ("muse", "whp", "wmdp"):
        (root / name).mkdir(parents=True)
    (root / "rwku" / "1_X").mkdir(parents=True)
    (root / "rwku" / "1_X" / "forget_level1.json").write_text("[]")
    return root


def test_an_interrupted_all_names_the_folder_the_user_gave(tmp_path, monkeypatch):
    """Ctrl-C in `experiment all` said to rerun with the part's own folder (…/all/canonical)."""
    from timerome.errors import Interrupted
    from timerome.experiments import run_experiment
    from timerome.experiments.runner import Runner

    def stop(self, cells, ctx, title=""):
        raise Interrupted(f"0 of {len(cells)} {title} cells are cached; run the same command again with the same "
                          f"output folder ({self.out_dir}) to go on from there")

    monkeypatch.setattr(Runner, "run", stop)
    monkeypatch.setenv("TIMEROME_BENCH_DIR", str(bench_folders(tmp_path)))  # all's transfer and rwku parts' folders
    with pytest.raises(Interrupted, match=rf"canonical's part of `experiment all`: rerun `experiment all` with the "
                                          rf"same -o \({tmp_path / 'all'}\)"):
        run_experiment("all", seeds=[0], out_dir=tmp_path / "all", progress=False, overrides={"n_mc": 1})


def test_experiment_all_refuses_a_shared_setting_only_where_no_part_reads_it(tmp_path, monkeypatch):
    """Stop 68 (helper 55): `all` hands each part the settings it has, and a setting one part leaves unread may be
    read by another (mia_k: rwku's with mia off, transfer's privacy-leak test): refused only where every part
    that has it leaves it unread; settings of the parts outside all (utility, xbackbone) are refused."""
    from timerome.experiments import run_experiment

    class Loaded(Exception):
        pass

    def load(path):  # every check passed: the one shared model would load now
        raise Loaded

    monkeypatch.delenv("TIMEROME_BENCH_DIR", raising=False)
    with pytest.raises(TimeromeError, match="experiment all, its transfer part: WHP is read from a local folder only"):
        run_experiment("all", load=load, out_dir=tmp_path, progress=False)  # before the load, since stop 77
    monkeypatch.setenv("TIMEROME_BENCH_DIR", str(bench_folders(tmp_path)))

    for over in ({"mia": False, "mia_k": 0.3}, {"benchmarks": ["wmdp"], "rouge": False},
                 {"splits": ["forget", "retain"], "n_world": 20}):
        with pytest.raises(Loaded):
            run_experiment("all", overrides=over, load=load, out_dir=tmp_path, progress=False)
    with pytest.raises(TimeromeError, match=r"nothing reads mia_k \(transfer: privleak is false; rwku: mia is false\)"):
        run_experiment("all", overrides={"mia": False, "privleak": False, "mia_k": 0.3}, load=load, out_dir=tmp_path)
    with pytest.raises(TimeromeError, match="xbackbone is not part of all"):
        run_experiment("all", overrides={"references": ["x"]}, load=load, out_dir=tmp_path)


def test_experiment_all_hands_each_part_only_the_settings_it_reads(tmp_path, monkeypatch):
    """Helper 56: a shared setting one part leaves unread (mia_k with transfer's privleak off) went into that
    part's cells' keys all the same, recomputing its cached cells for a value it never read."""
    import timerome.experiments as experiments

    real, given = experiments.run_experiment, {}

    def part(name, *args, **kwargs):  # what `all` hands each part
        given[name] = args[5] if len(args) > 5 else kwargs.get("overrides")
        return {}

    monkeypatch.setattr(experiments, "run_experiment", part)
    monkeypatch.setenv("TIMEROME_BENCH_DIR", str(bench_folders(tmp_path)))
    real("all", overrides={"privleak": False, "mia_k": 0.3}, backbone=object(), out_dir=tmp_path, progress=False,
         seeds=iter((0, 1)))  # a one-shot iterator is read once
    assert given["transfer"] == {"privleak": False} and given["rwku"] == {"mia_k": 0.3}



def test_an_autoregressive_models_cells_are_keyed_by_its_answer_rule(tmp_path):
    """Stop 73 changed what an AR model's answers are (cut at its end of text) and how its Locality reads
    them: its cells cached before are not served under the new rule; an MDLM's keys are as they were."""
    import timerome
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.experiments.runner import Context

    ar = timerome.load_backbone(make_tiny_checkpoint("llama", tmp_path / "ar"))
    mdlm = timerome.load_backbone(make_tiny_checkpoint("timerome", tmp_path / "m", layers=2))
    assert Context(ar, progress=False).tag.get("ar_answers") == 1
    assert set(Context(mdlm, progress=False).tag) == {"model", "source"}


def test_robustness_on_an_autoregressive_model_reads_only_the_sampler_settings_it_has(tmp_path):
    """Review 72: the extraction's presets hold diffusion sampler settings (steps/4, random remasking, the dual
    cache), which an AR model refused mid-run, after the first cells. A preset's are now left out there (the report
    says so); a user's are refused before any work, in one line."""
    from typer.testing import CliRunner

    import timerome
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.cli import app
    from timerome.metrics.extraction import DIFFUSION_SETTINGS, QUICK_SETTINGS

    ar = make_tiny_checkpoint("llama", tmp_path / "ar")
    # requests in its vocabulary's words (the embedded corpus's, which it cannot say, are refused since stop 83)
    said = tmp_path / "ar.json"
    said.write_text(json.dumps([{"subject": "the author", "prompt": "where was the author born ?", "object": "city",
                                 "target": "sea", "neighbours": [{"prompt": "where was the sea ?", "answer": "city"}]}]))
    res = timerome.run_experiment("robustness", model=str(ar), quick=True, seeds=(0,), out_dir=tmp_path / "r",
                                  overrides={"methods": ["no_edit", "ga"], "extraction": {"requests": str(said)}},
                                  progress=False)
    assert set(res["extraction"]) == {"no_edit", "ga", "ga (safe=False, lr=0.003)"}, res["extraction"]  # ran to its end
    read = [n for n in QUICK_SETTINGS if n not in DIFFUSION_SETTINGS]
    assert read == ["nominal", "T 1"]
    # the API's sweep at its default reads the same (review 73: it failed at 'random', after four settings)
    from timerome.metrics.extraction import _names, sampler_settings

    grid = sampler_settings(4)
    assert _names(None, grid, timerome.load_backbone(ar)) == ["nominal", "T 0.7", "T 1", "long"]
    assert _names(None, grid, None) == list(grid)  # a masked diffusion model: every setting
    md = (tmp_path / "r" / "robustness.md").read_text()
    assert "On an autoregressive model (" in md and "the diffusion sampler's" in md
    table = md.split("Extraction per condition")[1]
    assert all(n in table for n in read) and not any(f"| {n} |" in table for n in DIFFUSION_SETTINGS), table
    res = CliRunner().invoke(app, ["experiment", "robustness", "-m", str(ar), "-o", str(tmp_path / "x"), "-c",
                                   '{"extraction": {"settings": ["nominal", "dual 0.9"]}}'])
    assert res.exit_code == 2 and res.output.startswith("error: robustness: the extraction's sampler setting "
                                                        "'dual 0.9' sets the diffusion sampler"), res.output
    assert "leave it out" in res.output and not (tmp_path / "x").exists()


def test_a_model_named_beside_its_own_backbone_is_taken():
    """refuse_other_model refuses another checkpoint's name only: the backbone's own folder (however written), a Hub
    id and no model pass."""
    import os

    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.experiments import refuse_other_model

    bb = load_backbone()
    for model in (None, str(DEFAULT_MODEL_DIR), os.path.relpath(DEFAULT_MODEL_DIR), "org/some-hub-model"):
        refuse_other_model(model, bb)
