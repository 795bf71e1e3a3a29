"""Editing from the command line: edit requests in, the target said out (edit, generate, eval,
memory add, the editing experiment), every method; bad input is one line and exit 2."""

import json
import shutil

import torch
from conftest import bare_request
from typer.testing import CliRunner

from timerome import load_backbone
from timerome.cli import app
from timerome.data.requests import load_requests
from timerome.metrics.editing import says

runner = CliRunner()


def run(*args):
    """(exit code, output); with --json and success, standard output alone: what a script parses (progress
    lines, which work that lasts writes, go to standard error)."""
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, (res.stdout if "--json" in args and res.exit_code == 0 else res.output)


def counterfact_file(path, n: int, bare: bool = False):
    """n embedded counterfactual requests written in ROME's CounterFact layout (bare: with CounterFact's
    bare objects and targets, the words where the answer and the target differ)."""
    reqs, _ = load_requests("counterfactual:forget10", limit=n)
    if bare:
        reqs = [bare_request(r) for r in reqs]
    records = [{"case_id": r.fact_id, "requested_rewrite": {
        "prompt": r.fact.prompt.replace(r.fact.subject, "{}"), "subject": r.fact.subject,
        "target_new": {"str": r.fact.target}, "target_true": {"str": r.fact.object}},
        "paraphrase_prompts": list(r.paraphrases), "neighborhood_prompts": [p.prompt for p in r.neighbours]}
        for r in reqs]
    path.write_text(json.dumps(records))
    return reqs


def test_rewrite_memory_from_a_counterfact_file_says_the_targets(tmp_path):
    reqs = counterfact_file(tmp_path / "cf.json", 4)
    mem = tmp_path / "rw.safetensors"
    code, out = run("edit", "--method", "rewrite", "--requests", tmp_path / "cf.json", "-o", mem)
    assert code == 0 and mem.exists(), out
    code, out = run("generate", "--edit", mem, "--json", *[r.fact.prompt for r in reqs])
    assert code == 0, out
    shown = json.loads(out)
    assert all(says(a["answer_with_edit"], r.fact.target) and a["target"] == r.fact.target
               for a, r in zip(shown, reqs)), shown
    assert all(not says(a["answer"], r.fact.target) for a, r in zip(shown, reqs))
    code, out = run("memory", "show", mem, "--json")
    shown = json.loads(out)
    assert code == 0 and [f["target"] for f in shown["facts"]] == [r.fact.target for r in reqs]
    # the CLI's gate without --layer is the method's own default (the API and the experiments place it there)
    from timerome.methods import method_config
    from timerome.methods.rewrite import gate_coordinate

    gate = gate_coordinate(load_backbone(), None, method_config("rewrite", {}))[0]
    assert shown["kind"] == "rewrite" and shown["coordinate"]["layer"] == gate.layer, shown["coordinate"]
    code, out = run("memory", "show", mem)
    assert code == 0 and "write site" in out and "per fact (4 distinct" in out and "None" not in out, out
    code, out = run("eval", "--edit", mem, "--requests", tmp_path / "cf.json", "--n-mc", 2, "--json")
    assert code == 0, out
    got = json.loads(out)
    m = got["metrics"]
    assert m["Efficacy"] == 1.0 and m["Locality"] >= 0.95 and m["EfficacyLP"] == 1.0, m
    # every probe's answers, by kind (review 91: Locality's neighbours were not listed): the requests' own
    # neighbours name their request, the corpus's locality rows none
    probes = got["probe_answers"]
    assert len(probes["neighbour"]) == sum(len(r.neighbours) for r in reqs) > 0, probes.keys()
    assert {a["fact_id"] for a in probes["neighbour"]} <= {r.fact_id for r in reqs}
    assert all(a["fact_id"] is None for k in got["n_locality"] for a in probes[k])
    # each prompt's answer names its request and the outcome the rates count (review 93: joined by order only)
    assert [a["fact_id"] for a in got["answers"]] == [r.fact_id for r in reqs], got["answers"]
    assert all(a["outcome"] == "Refusal" for a in got["answers"]) and m["Refusal"] == 1.0, got["answers"]


def test_a_counterfact_file_of_bare_objects_is_said_at_the_default_budget(tmp_path):
    reqs = counterfact_file(tmp_path / "cf.json", 4, bare=True)
    mem = tmp_path / "rw.safetensors"
    code, out = run("edit", "--method", "rewrite", "--requests", tmp_path / "cf.json", "-o", mem)
    assert code == 0 and "the model says the answer of 4 of 4 facts inside an answer of its own" in out, out
    ask = [p for r in reqs for p in (r.fact.prompt, *r.paraphrases)]
    code, out = run("generate", "--edit", mem, "--json", *ask)  # 32 tokens: the gate did not fire here before
    assert code == 0, out
    want = [r.fact.target for r in reqs for _ in (r.fact.prompt, *r.paraphrases)]
    assert all(says(a["answer_with_edit"], t) for a, t in zip(json.loads(out), want)), out
    code, out = run("eval", "--edit", mem, "--requests", tmp_path / "cf.json", "--n-mc", 2, "--json")
    m = json.loads(out)["metrics"]
    assert code == 0 and m["Efficacy"] == m["Generalisation"] == 1.0 and m["Locality"] >= 0.95, m
    code, out = run("memory", "add", mem, "--requests", tmp_path / "cf.json")  # held as the model says them
    assert code == 2 and "nothing to add" in out, out
    # a file written before stop 57 holds each fact as given (its bare object): still nothing to add
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(mem), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["timerome"]), {k: f.get_tensor(k) for k in f.keys()}
    assert [h["object"] for h in meta["facts"]] != [r.fact.object for r in reqs]
    for h, r in zip(meta["facts"], reqs):
        h["object"] = r.fact.object
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata={"timerome": json.dumps(meta)})
    code, out = run("memory", "add", tmp_path / "old.safetensors", "--requests", tmp_path / "cf.json")
    assert code == 2 and "nothing to add" in out, out


def test_memory_add_keeps_each_requests_target(tmp_path, monkeypatch):
    # the facts added are the previous test's: `memory add` measures their radii on the rows that state
    # none of them, the calibration that test's edit made (cached), so this test reads one calibration
    # (minutes), its edit's, not two
    reqs = counterfact_file(tmp_path / "more.json", 4)
    mem = tmp_path / "rw.safetensors"
    code, out = run("edit", "--method", "rewrite", "--requests", "counterfactual:forget01", "-o", mem)
    assert code == 0, out
    code, out = run("memory", "add", mem, "--requests", tmp_path / "more.json", "--json")
    assert code == 0 and json.loads(out)["n_facts"] == 2 + 4, out
    # the file says which rows its radii and token values were read on, and the add read those again
    code, out = run("memory", "show", mem, "--json")
    assert code == 0 and {k: v["rows"] for k, v in json.loads(out)["sources"].items()} == {
        "calibration": "embedded:train", "value_rows": "embedded:train"}, out
    code, out = run("generate", "--edit", mem, "--json", *[r.fact.prompt for r in reqs])
    assert code == 0 and len(json.loads(out)) == len(reqs), out
    assert all(says(a["answer_with_edit"], r.fact.target) for a, r in zip(json.loads(out), reqs)), out
    # every token value, the added facts' too, is the one a build reads: on the embedded model's training
    # rows (not the calibration rows `memory add` was given, which leave out the rows stating its facts)
    from timerome.data import load_split
    from timerome.memory.memory_file import load_memory
    from timerome.memory.rewrite_memory import value_table

    bb = load_backbone()
    back = load_memory(mem, bb)
    ids, vals = value_table(bb, back.site, load_split("train", "embedded"), seed=back.calibration_seed)
    table = dict(zip(ids.tolist(), vals.double()))
    added = {t for target in back.targets[2:] for t in target}  # the 4 added facts' target tokens
    assert added - {t for target in back.targets[:2] for t in target} - {back.eos}  # the add valued new tokens
    assert all(torch.equal(v, table[int(t)]) for t, v in zip(back._value_ids, back._values))
    # a fact asking a held question with another target is refused from the file's header, before the
    # calibration rows a rewrite memory measures (87 s on the audit's 20 facts, 5 s now)
    import timerome.cli.memory as cli_memory

    def never(*_a, **_k):
        raise AssertionError("the calibration ran before the conflict was refused")

    before = mem.read_bytes()
    conflicting = tmp_path / "conflict.json"
    conflicting.write_text(json.dumps([dict(reqs[0].as_record(), target="Pellmoor.")]))
    monkeypatch.setattr(cli_memory, "spare_rows", never)
    code, out = run("memory", "add", mem, "--requests", conflicting)
    assert code == 2 and "remove that fact first" in out and mem.read_bytes() == before, out


def test_a_weight_method_saves_the_edited_model(tmp_path):
    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    counterfact_file(tmp_path / "cf.json", 2)
    out_dir = tmp_path / "edited"
    code, out = run("edit", "--method", "rome", "--requests", tmp_path / "cf.json", "-o", out_dir, "--json")
    assert code == 0 and (out_dir / "model.safetensors").exists(), out
    assert json.loads(out)["kind"] == "model folder"
    from timerome.cli.model import edited_from

    record = edited_from(out_dir)  # how it was made: the method's settings and seed, besides its source
    assert record["method"] == "rome" and record["seed"] == 0 and record["config"] == json.loads(out)["config"]
    assert record["config"]["target"] is None  # each request says its own new object, not the default target
    from timerome.training.train import trained_with_eos_padding

    assert trained_with_eos_padding(out_dir) is True  # the recipe it started from: a fine-tune of it keeps EOS padding
    code, out = run("eval", "-m", out_dir, "--requests", tmp_path / "cf.json", "--base",
                    "src/timerome/assets/default-model", "--n-mc", 2, "--json")
    assert code == 0, out
    m = json.loads(out)["metrics"]
    # without --base, against the model it was edited from (its folder says which), not against itself
    code, alone = run("eval", "-m", out_dir, "--requests", tmp_path / "cf.json", "--n-mc", 2, "--json")
    assert code == 0 and json.loads(alone)["metrics"] == m, alone
    assert json.loads(alone)["base"] == str(DEFAULT_MODEL_DIR), alone
    code, out = run("eval", "-m", out_dir, "--requests", tmp_path / "cf.json", "--base", out_dir)
    assert code == 2 and "is the model being scored" in out, out
    code, out = run("eval", "--requests", tmp_path / "cf.json", "--base", DEFAULT_MODEL_DIR)  # the embedded model
    assert code == 2 and "is the model being scored" in out, out
    assert all(0 <= m[k] <= 1 for k in ("Efficacy", "Generalisation", "Locality", "EfficacyLP")), m
    from safetensors.torch import load_file

    edited, plain = load_file(str(out_dir / "model.safetensors")), load_file(str(DEFAULT_MODEL_DIR / "model.safetensors"))
    changed = [k for k in plain if not torch.equal(plain[k], edited[k])]
    assert changed and all(".ff_out." in k or "ff_out" in k for k in changed), changed  # one MLP down projection
    # off the embedded model, a file's requests need the rows to leave alone only where no background texts are
    # given: ROME's key statistics read one or the other (review 67: it demanded --calibration, then read it not)
    code, out = run("edit", "--method", "rome", "-m", out_dir, "--requests", tmp_path / "cf.json", "-o",
                    tmp_path / "again")
    assert code == 2 and "pass --calibration" in out, out
    assert "or 'real-facts'" in " ".join(out.split()), out  # texts a real model's user has at hand (review 91)
    code, out = run("edit", "--method", "rome", "-m", out_dir, "--requests", tmp_path / "cf.json", "--background",
                    "embedded:retain_perturbed", "-o", tmp_path / "again", "--json")
    assert code == 0 and (tmp_path / "again" / "model.safetensors").exists(), out


def test_a_model_saved_over_an_edited_folder_drops_its_edit_record(tmp_path):
    # finetune into a folder `edit` wrote: the record would name a source and method the new weights no longer have
    from timerome.backbones import load_backbone
    from timerome.cli.model import EDITED_FROM, edited_from, save_backbone

    (tmp_path / EDITED_FROM).write_text(json.dumps(dict(source_model=None, method="rome")))
    assert edited_from(tmp_path) is not None
    save_backbone(load_backbone(), tmp_path)
    assert (tmp_path / "model.safetensors").exists() and edited_from(tmp_path) is None


def test_editing_experiment_tabulates_every_metric(tmp_path):
    config = json.dumps({"methods": ["no_edit", "timerome", "rewrite"], "sets": {"cf": "counterfactual:forget01"},
                         "n_mc": 2, "n_retain": 4})
    code, out = run("experiment", "editing", "--out", tmp_path, "--seeds", "0", "-c", config)
    assert code == 0, out
    summary = json.loads((tmp_path / "editing.json").read_text())["summary"]["cf"]
    assert summary["rewrite"]["Efficacy"]["mean"] == 1.0 and summary["no_edit"]["Efficacy"]["mean"] == 0.0
    assert summary["no_edit"]["Unchanged"]["mean"] == 1.0 and summary["rewrite"]["Unchanged"]["mean"] == 0.0
    md = (tmp_path / "editing.md").read_text()
    # the target said anywhere in the answer, beside its start (rewrite's answers are the targets whole)
    assert summary["rewrite"]["EfficacyNamed"]["mean"] == 1.0 and summary["no_edit"]["EfficacyNamed"]["mean"] == 0.0
    assert "| EfficacyNamed |" in md and "| GeneralisationNamed |" in md
    assert "Efficacy" in md and "LocalitySameSubject" in md and (tmp_path / "editing.png").stat().st_size > 1000
    # --json carries every table and note of the report (it printed only the summary and the paths: review 64)
    code, out = run("experiment", "editing", "--out", tmp_path, "--seeds", "0", "-c", config, "--json")
    assert code == 0, out
    printed, written = json.loads(out)["editing"], json.loads((tmp_path / "editing.json").read_text())
    assert set(written) <= set(printed) and printed["summary"] == written["summary"] and printed["run"] == written["run"]
    assert printed["out_dir"] == str(tmp_path) and printed["files"]["json"].endswith("editing.json")


def test_editing_experiment_prints_what_it_did_not_compute_under_its_table(tmp_path):
    """A one-step edit's likelihood columns are left out with a note (edit_scores); the markdown says so."""
    config = json.dumps({"methods": ["no_edit", {"method": "timerome", "config": {"step": 0}}],
                         "sets": {"cf": "counterfactual:forget01"}, "n_mc": 2, "n_retain": 4})
    code, out = run("experiment", "editing", "--out", tmp_path, "--seeds", "0", "-c", config)
    assert code == 0, out
    md = (tmp_path / "editing.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- timerome (step=0), EfficacyLP, GeneralisationLP: "))
    assert "not computed: the edit acts at denoising step 0 only" in line
    assert md.count("\n- ") == 1  # no_edit computed everything: nothing said of it


def test_bad_editing_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": "x"}]))
    for args in (("edit", "--requests", "counterfactual:forget01", "--data", "embedded:forget01"),
                 ("edit", "--method", "nonsense"),
                 ("edit", "--requests", bad),
                 ("edit", "--requests", tmp_path / "missing.json"),
                 ("edit", "--method", "act_steer", "--requests", "counterfactual:forget01", "-o", tmp_path / "a.st"),
                 ("eval", "--requests", "counterfactual:nope"),
                 ("eval", "--requests", "counterfactual:forget01", "--gen-length", 0),
                 ("edit", "--method", "rome", "-c", "[1]", "-o", tmp_path / "r")):
        code, out = run(*args)
        assert code == 2 and out.startswith("error:") and "Traceback" not in out, (args, out)


def test_timerome_takes_its_settings_through_config_as_every_method_does(tmp_path):
    """`timerome methods` lists timerome's settings and `edit --help` sends --config there, but timerome
    refused --config, and g_max had no option: now any setting `edit` uses can come either way, once."""
    mem = tmp_path / "m.safetensors"
    code, out = run("edit", "-c", '{"g_max": 0.5, "q": 2, "alpha": 2.5, "target": "Pellmoor."}', "-o", mem)
    assert code == 0, out
    code, out = run("memory", "show", mem, "--json")
    hyper = json.loads(out)["hyper"]
    assert (hyper["g_max"], hyper["q"], hyper["alpha"], hyper["target"]) == (0.5, 2, 2.5, "Pellmoor."), hyper
    code, out = run("edit", "-c", '{"q": 2}', "--q", "3", "-o", mem)
    assert code == 2 and "q given twice" in out, out


def test_requests_written_into_a_folder_not_made_yet(tmp_path):
    """Every other -o made its folder; `requests -o` said "No such file or directory"."""
    path = tmp_path / "new" / "deeper" / "cf.json"
    code, out = run("requests", "counterfactual:forget10", "-o", path)
    assert code == 0 and len(load_requests(str(path))[0]) == 20, out


def test_eval_requests_sizes_each_locality_set_by_its_own_option():
    """--n-retain set the retain rows and, silently, half as many real-author and world-fact rows
    (stop 49's audit: --n-retain 5 scored those on 2 rows each); --n-world sizes them now."""
    from timerome.cli.evaluate import _probe_rows

    bb = load_backbone()
    sizes = lambda loc: {k: len(v) for k, v in loc.items()}  # noqa: E731
    reqs = load_requests("embedded:forget01", target="I don't know.")[0]
    assert sizes(_probe_rows(bb, "embedded:forget01", reqs, None, 5, 20)[0]) == {"retain": 5, "real_authors": 20,
                                                                               "world_facts": 20}
    assert sizes(_probe_rows(bb, "embedded:forget01", reqs, None, 40, 3)[0]) == {"retain": 40, "real_authors": 3,
                                                                               "world_facts": 3}
    # 0 for none: the note names the rows read, not the three kinds whatever the sizes (review 74)
    rows, _, note = _probe_rows(bb, "embedded:forget01", reqs, None, 0, 0)
    assert sizes(rows) == {} and "requests' own probes only" in note and "corpus's" not in note
    rows, _, note = _probe_rows(bb, "embedded:forget01", reqs, None, 0, 2)
    assert "corpus's real-author / world-fact rows" in note and "retain /" not in note


def test_eval_requests_probes_do_not_depend_on_how_the_requests_or_the_model_are_named(tmp_path):
    """The locality rows and known subjects (Locality, Confabulation) were chosen by the model's name and by whether
    --requests was typed as a spec: a file written by `timerome requests counterfactual:forget10` scored an edited
    copy of the embedded model with no retain rows and every other answer a confabulation (review 59: Locality
    0.74 / Confabulation 0.40 against 0.78 / 0.03 for the spec). One rule now (metrics.editing.embedded_probes):
    the model or its lineage, or the requests' subjects; the summary says which."""
    from timerome.backbones.tiny import make_tiny_checkpoint
    from timerome.cli.evaluate import _probe_rows

    tiny = load_backbone(make_tiny_checkpoint("timerome", tmp_path / "tiny"))  # not named timerome-default
    path = tmp_path / "cf.json"
    assert run("requests", "counterfactual:forget10", "-o", path)[0] == 0
    from_file, from_spec = load_requests(str(path))[0], load_requests("counterfactual:forget10")[0]
    a, b = _probe_rows(tiny, str(path), from_file, None, 4, 2), _probe_rows(tiny, "counterfactual:forget10",
                                                                             from_spec, None, 4, 2)
    assert a[0] == b[0] and a[1] == b[1] and len(a[0]["retain"]) == 4 and a[1]
    other = load_requests([dict(subject="Pellmoor", prompt="Where is Pellmoor ?", object="Kalvor", target="x")])[0]
    assert _probe_rows(tiny, "other.json", other, None, 4, 2)[:2] == ({}, None)  # none of the corpus's
    edited = _probe_rows(tiny, "other.json", other, {"source_model": None, "method": "rome"}, 4, 2)
    assert len(edited[0]["retain"]) == 4 and edited[1] and "edited from the embedded" in edited[2]
    # the embedded model's folder named by its path (what `edit -m PATH` records), and a chain of edits (review 60)
    from timerome.backbones.loading import DEFAULT_MODEL_DIR
    from timerome.cli.model import EDITED_FROM

    assert _probe_rows(tiny, "other.json", other, {"source_model": str(DEFAULT_MODEL_DIR)}, 4, 2)[1]
    first = tmp_path / "first-edit"
    first.mkdir()
    (first / EDITED_FROM).write_text(json.dumps({"source_model": None, "method": "rome"}))
    assert _probe_rows(tiny, "other.json", other, {"source_model": str(first)}, 4, 2)[1]
    (first / EDITED_FROM).write_text(json.dumps({"source_model": str(first), "method": "rome"}))  # a loop: no
    assert _probe_rows(tiny, "other.json", other, {"source_model": str(first)}, 4, 2)[1] is None
    # a copy of the embedded model's folder: not the embedded model by its place, and a vocabulary that says the
    # requests (the tiny model's cannot: refused since stop 83)
    copy = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "copy")
    code, out = run("eval", "-m", copy, "--requests", path, "--n-retain", 2, "--n-world", 1,
                    "--n-mc", 1, "--gen-length", 4, "--json")
    assert code == 0, out
    summary = json.loads(out[out.index("{"):])
    assert summary["n_locality"] == {"retain": 2, "real_authors": 1, "world_facts": 1}
    assert any("every subject of the requests" in n for n in summary["notes"]), summary["notes"]


def test_the_unchanged_warning_names_the_knobs_of_the_edit_scored():
    """A weight edit that changed no answer was told to check its alpha and its keys, which it has none of."""
    from timerome.cli.evaluate import unchanged

    assert "small alpha" in unchanged(object()) and "layer" in unchanged(None) and "alpha" not in unchanged(None)
