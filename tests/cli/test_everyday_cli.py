"""Everyday commands: memory show/add/remove/merge, eval, --json everywhere, interrupted experiments,
experiment settings checked before work, the retain authors evaluated, thread defaults."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from timerome import load_backbone
from timerome.cli import app
from timerome.errors import Interrupted, TimeromeError

runner = CliRunner()


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.output


@pytest.fixture(scope="module")
def memories(tmp_path_factory):
    d = tmp_path_factory.mktemp("mem")
    for name, data in (("f1", "embedded:forget01"), ("f5", "embedded:forget05")):
        code, _, out = run("edit", "--data", data, "--out", d / f"{name}.safetensors")
        assert code == 0, out
    return d


def test_forget_is_edit_for_a_forget_set(memories, tmp_path):
    """`timerome forget` (the unlearning field's word) builds what `timerome edit` builds from the same
    forget set, takes every option of it but --requests, and refuses that one in one line."""
    from safetensors.torch import load_file

    code, stdout, out = run("forget", "--data", "embedded:forget01", "--out", tmp_path / "f.safetensors", "--json")
    assert code == 0, out
    assert json.loads(stdout)["n_facts"] == 20
    mine, edits = load_file(tmp_path / "f.safetensors"), load_file(memories / "f1.safetensors")
    assert mine.keys() == edits.keys() and all(torch.equal(mine[k], edits[k]) for k in mine)
    code, _, out = run("forget", "--requests", "x.json")
    assert code == 2 and "No such option: --requests" in out and len(out.strip().splitlines()) == 1, out
    code, _, out = run("forget", "--help")
    options = [line.split()[1] for line in out.splitlines() if line.startswith("│ --")]
    assert code == 0 and "--method" in options and "--data" in options and "--requests" not in options


def test_memory_show_reads_the_header_alone(memories):
    code, stdout, out = run("memory", "show", memories / "f1.safetensors", "--json")
    assert code == 0, out
    d = json.loads(stdout)
    assert d["n_facts"] == 20 and d["coordinate"] == {"layer": 1, "point": "resid", "step": None}
    from timerome.memory.edit_memory import DEFAULT_ALPHA

    assert d["hyper"]["alpha"] == DEFAULT_ALPHA and d["fingerprint"] == load_backbone().fingerprint()
    assert d["facts"][0]["fact_id"] == "Isgor Quielson/city"
    code, stdout, out = run("memory", "show", memories / "f1.safetensors")
    assert code == 0 and "layer 1 resid, every step" in out and "Quielson/city" in out


def test_memory_remove_add_merge_match_the_api(memories, tmp_path):
    from timerome.memory.edit_memory import EditMemory

    bb = load_backbone()
    f5 = memories / "f5.safetensors"
    code, _, out = run("memory", "remove", f5, "--subject", "Isgor Quielson", "-o", tmp_path / "without.safetensors")
    assert code == 0 and "removed 20 facts: 80 facts" in out, out
    code, _, out = run("memory", "add", tmp_path / "without.safetensors", "--data", "embedded:forget01",
                       "-o", tmp_path / "back.safetensors")
    assert code == 0 and "added 20 facts: 100 facts" in out, out
    # a downdate then an insert of the same facts gives the memory back (same lambda scale, block updates)
    h = torch.randn(7, bb.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    original, back = EditMemory.load(f5, bb), EditMemory.load(tmp_path / "back.safetensors", bb)
    assert sorted(back.fact_ids) == sorted(original.fact_ids)
    # (up to float32 capture rounding: the facts were captured in other batches)
    scale = float(original.delta(h).abs().max())
    assert torch.allclose(original.delta(h), back.delta(h), rtol=0, atol=1e-6 * scale)
    code, _, out = run("memory", "merge", tmp_path / "without.safetensors", memories / "f1.safetensors",
                       "-o", tmp_path / "merged.safetensors")
    assert code == 0 and "merged 2 memories: 100 facts" in out, out
    merged = EditMemory.load(tmp_path / "merged.safetensors", bb)
    assert torch.allclose(merged.delta(h), back.delta(h), rtol=0, atol=1e-6 * scale)
    # a merge's --json lists the facts it skipped, as add's does (f1's 20 facts are all in f5)
    code, stdout, out = run("memory", "merge", f5, memories / "f1.safetensors", "-o", tmp_path / "same.safetensors",
                            "--json")
    d = json.loads(stdout)
    assert code == 0 and d["n_facts"] == 100 and d["renamed"] == {}, out
    assert len(d["skipped"]) == 20 and {r["file"] for r in d["skipped"]} == {str(memories / "f1.safetensors")}
    before = f5.read_bytes()
    code, _, out = run("memory", "remove", f5, "nosuchid", "-o", tmp_path / "x.safetensors")
    assert code == 2 and f5.read_bytes() == before and not (tmp_path / "x.safetensors").exists()


def test_memory_merge_renames_a_fact_whose_id_is_taken_and_lists_it(memories, tmp_path):
    """A fact of another content under an id the first memory holds is added as ID#digest, and
    --json lists it under its file (stop 49 added the list; this path was untested)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(dict(fact_id="Isgor Quielson/city", subject="Isgor Quielson",
                                    question="What colour does Isgor Quielson like?", answer="blue")) + "\n")
    other = tmp_path / "other.safetensors"
    code, _, out = run("edit", "--data", rows, "--layer", 1, "-o", other)
    assert code == 0, out
    code, stdout, out = run("memory", "merge", memories / "f1.safetensors", other, "-o", tmp_path / "m.safetensors",
                            "--json")
    assert code == 0, out
    d = json.loads(stdout)
    (old, new), = d["renamed"][str(other)].items()
    assert old == "Isgor Quielson/city" and new.startswith("Isgor Quielson/city#") and d["skipped"] == []
    assert d["n_facts"] == 21 and new in d["fact_ids"] and old in d["fact_ids"]


def test_eval_a_saved_memory_without_rebuilding_it(memories, monkeypatch):
    import timerome.memory.capture
    import timerome.tracing.causal_trace

    def never(*a, **k):
        raise AssertionError("eval must not trace or capture")

    monkeypatch.setattr(timerome.memory.capture, "capture_facts", never)
    monkeypatch.setattr(timerome.tracing.causal_trace, "trace", never)
    args = ("--n-mc", 2, "--n-retain", 4, "--n-world", 2, "--no-rouge", "--json")
    code, stdout, out = run("eval", *args)
    assert code == 0, out
    plain = json.loads(stdout)
    code, stdout, out = run("eval", "--edit", memories / "f1.safetensors", *args)
    assert code == 0, out
    edited = json.loads(stdout)
    assert edited["n_items"] == {"forget": 20, "retain": 4, "real_authors": 2, "world_facts": 2}
    assert edited["metrics"]["ForgetLP"] < plain["metrics"]["ForgetLP"] - 1  # the memory forgets
    assert edited["metrics"]["ForgetQuality"] is None and "--reference" in edited["notes"]["ForgetQuality"]
    assert edited["reference"] is None and "holds" not in out  # every forget01 row asks one of its facts
    # the notes go to stderr with --json too, as docs/cli.md says (helper 70: they were in the JSON only)
    assert any(line.startswith("ForgetQuality –") for line in out.splitlines()), out  # JSON lines are indented
    # on a split it was not built for, a note says how many rows it holds; the reference is recorded, and
    # named when it is the model being scored
    from timerome.backbones import DEFAULT_MODEL_DIR

    code, stdout, out = run("eval", "--edit", memories / "f1.safetensors", "--forget", "forget05", "--reference",
                            DEFAULT_MODEL_DIR, *args)
    assert code == 0 and "holds 20 facts; 20 of the 100 forget rows evaluated" in out, out
    got = json.loads(stdout)
    assert got["reference"].startswith(str(DEFAULT_MODEL_DIR.resolve())) and "itself" in got["reference"], got
    assert "is the model being evaluated" in out and got["metrics"]["ForgetQuality"] is not None


def test_evaluate_explains_every_nan(task):
    from timerome.evaluation.evaluator import eval_rows, evaluate

    rows = {k: v[:2] for k, v in eval_rows("embedded", n_retain=2, n_world=2).items() if k != "world_facts"}
    res = evaluate(load_backbone(), rows, n_mc=2, rouge=False)
    nan = {k for k, v in res["metrics"].items() if v != v}
    assert nan == set(res["notes"]) - {"ModelUtility"} == {"WorldFact", "ForgetQuality"}
    assert "reference_tr" in res["notes"]["ForgetQuality"]
    # a utility of fewer than TOFU's nine terms is a number with a note naming what it lacks
    assert res["metrics"]["ModelUtility"] == res["metrics"]["ModelUtility"]
    assert "4 of TOFU's 9 terms" in res["notes"]["ModelUtility"] and "world_facts prob" in res["notes"]["ModelUtility"]
    full = evaluate(load_backbone(), {k: v[:2] for k, v in eval_rows("embedded", n_retain=2, n_world=2).items()},
                    n_mc=2)
    assert "ModelUtility" not in full["notes"], full["notes"]
    only = evaluate(load_backbone(), {"forget": rows["forget"]}, n_mc=2, rouge=False)
    assert "no 'retain'" in only["notes"]["ModelUtility"], only["notes"]


def test_settings_are_checked_before_any_work(monkeypatch, tmp_path):
    import timerome.experiments.runner as R
    from timerome.experiments import experiment_config, run_experiment

    for bad in ({"n_mc": 2.5}, {"n_mc": "lots"}, {"n_retain": 0}, {"rouge": "yes"}, {"methods": "timerome"},
                {"retain_authors": "all"}):
        with pytest.raises(TimeromeError, match=next(iter(bad))):
            experiment_config("canonical", bad) if "retain_authors" not in bad else run_experiment(
                "canonical", overrides=bad, seeds=(0,), out_dir=tmp_path, progress=False)
    assert experiment_config("scalability", {"sizes": [1, 2]})["sizes"] == [1, 2]
    with pytest.raises(TimeromeError, match="sizes"):
        experiment_config("scalability", {"sizes": [1, 0]})

    def no_work(*a, **k):
        raise AssertionError("a cell ran before the options were checked")

    monkeypatch.setattr(R, "execute", no_work)
    ctx = R.Context(load_backbone(), progress=False)
    cells = [R.Cell("lp", "no_edit", {}, 0, {}, {"n_mc": 4}), R.Cell("lp", "no_edit", {}, 0, {}, {"n_mc": 2.5})]
    with pytest.raises(TimeromeError, match="option n_mc must be an integer"):
        R.Runner(tmp_path, progress=False).run(cells, ctx)
    with pytest.raises(TimeromeError, match="forget42"):
        R.Runner(tmp_path, progress=False).run([R.Cell("lp", data={"forget": "forget42"})], ctx)


def test_retain_authors_choose_whose_rows_are_evaluated():
    from timerome.data.tofu import load_split
    from timerome.experiments.data import resolve_data, retain_of_authors

    rows = load_split("retain_perturbed", "embedded")
    two = retain_of_authors(rows, 2)
    assert len({r["author"] for r in two}) == 2 and two == rows[:40]
    names = [rows[0]["author"], rows[45]["author"]]
    assert {r["author"] for r in retain_of_authors(rows, names)} == set(names)
    assert retain_of_authors(rows, [0, 2]) == rows[:20] + rows[40:60]
    tofu_like = [{"question": f"q{i}", "answer": "a"} for i in range(60)]  # TOFU rows: 20-row author blocks
    assert retain_of_authors(tofu_like, [2]) == tofu_like[40:]
    with pytest.raises(TimeromeError, match="retain_authors"):
        retain_of_authors(rows, ["Nobody Atall"])
    out, _ = resolve_data(dict(retain_authors=1, n_retain=40), "embedded", load_backbone())
    assert len({r["author"] for r in out["retain"]}) == 1


def test_an_interrupted_experiment_says_what_is_cached(monkeypatch, tmp_path):
    import timerome.experiments.runner as R

    ctx = R.Context(load_backbone(), progress=False)
    seen = []

    def stop_at_third(cell, c):
        if len(seen) == 2:
            raise KeyboardInterrupt
        seen.append(cell.seed)
        return {"metrics": {"x": 1.0}}

    monkeypatch.setattr(R, "execute", stop_at_third)
    cells = [R.Cell("lp", "no_edit", {}, s, {}, {"n_mc": 2}) for s in range(5)]
    with pytest.raises(Interrupted, match=r"2 of 5 .* cells are cached in .*cells; run the same command again"
                                          r"[^;]*go on from there$"):  # no report there yet: none named
        R.Runner(tmp_path, progress=False).run(cells, ctx)
    # an earlier complete run's report stays, as it was: the message says whose it is (stop 70's item)
    (tmp_path / "lp.md").write_text("# an earlier run\n")
    (tmp_path / "lp.json").write_text("{}")
    (tmp_path / "notes.md").write_text("the user's own notes, no report (review 72: named as one)\n")
    seen.clear()
    with pytest.raises(Interrupted, match=r"go on from there; lp.md \(and its .json / .png\) in it is the last "
                                          r"complete run's, not this one's$"):
        R.Runner(tmp_path, progress=False, resume=False).run(cells, ctx)
    seen.clear()
    todo = []
    runner = R.Runner(tmp_path, progress=False, executor=lambda cs, c, done, **k: todo.extend(cs) or [
        done(i, {"metrics": {"x": 1.0}}) for i in range(len(cs))])
    runner.run(cells, ctx)
    assert [c.seed for c in todo] == [2, 3, 4]  # the progress bar (and its ETA) counts only these


def test_thread_default_is_not_one_per_core(monkeypatch):
    from timerome.common.threads import choose_threads, default_threads

    assert default_threads(cores=2, load=0.0) == 1        # a 2-core machine: 1 thread
    assert default_threads(cores=2, load=3.0) == 1
    assert default_threads(cores=32, load=0.0) == 16      # an idle server: half its cores
    assert default_threads(cores=32, load=28.0) == 4      # a busy one: what is free
    assert default_threads(cores=1, load=5.0) == 1
    monkeypatch.setenv("TIMEROME_THREADS", "3")
    assert choose_threads(None) == (3, "$TIMEROME_THREADS") and choose_threads(2) == (2, "--threads")
    monkeypatch.setenv("TIMEROME_THREADS", "many")
    with pytest.raises(TimeromeError, match="TIMEROME_THREADS"):
        choose_threads(None)


def test_json_output_is_json_alone(tmp_path):
    code, stdout, out = run("trace", "--out", tmp_path / "t", "--n-facts", 1, "--n-samples", 1, "--steps", 2, "--json")
    assert code == 0, out
    sel = json.loads(stdout)
    assert sel["edit"]["module"] == "resid" and sel["files"]["trace"].endswith("trace.safetensors")
    # every file written is listed, the trace's JSON half too (`edit --trace` needs it), and each exists
    assert set(sel["files"]) == {"trace", "trace_meta", "heatmaps", "selection"}
    assert all(Path(f).is_file() for f in sel["files"].values())
    code, stdout, out = run("edit", "--trace", tmp_path / "t" / "trace.safetensors", "-o", tmp_path / "m.safetensors",
                            "--json")
    built = json.loads(stdout)["coordinate"]
    assert code == 0 and built["layer"] == sel["edit"]["layer"], out
    # "edit" is what was built: every step (the step whose TIE chose it apart), as the file says too
    assert sel["edit"]["step"] is None is built["step"] and sel["edit"]["traced_step"] in range(2)
    assert json.loads((tmp_path / "t" / "selection.json").read_text())["edit"] == sel["edit"]


def test_a_refused_run_leaves_no_output_folder(tmp_path):
    """trace and experiment used to make their -o folder before checking their inputs: a refused run
    left an empty folder behind."""
    for args in (("trace", "--steps", 0, "-o", tmp_path / "t1"),
                 ("trace", "--readout", "foo", "-o", tmp_path / "t2"),
                 ("experiment", "editing", "--quick", "--methods", "no_edit,foo", "-o", tmp_path / "e1")):
        code, _, out = run(*args)
        assert code == 2 and "error:" in out, out
    assert list(tmp_path.iterdir()) == []


def test_a_runner_refused_at_its_cells_check_removes_the_folder_it_made(tmp_path):
    """A refusal inside Runner.run (after its lock made the folder) leaves nothing; a folder that was
    there before stays."""
    from timerome.experiments.runner import Cell, Context, Runner

    ctx = Context(load_backbone(), progress=False)
    bad = [Cell("no_such_measurement", seed=0, data=dict(splits=["forget"]))]
    for out, existed in ((tmp_path / "new" / "run", False), (tmp_path / "old", True)):
        if existed:
            out.mkdir()
        with pytest.raises(TimeromeError, match="no_such_measurement"):
            Runner(out, progress=False).run(bad, ctx)
        assert out.is_dir() == existed
    assert not (tmp_path / "new").exists()  # nor the folder above it that was made with it


def test_progress_lines_off_a_terminal(monkeypatch, capsys):
    import timerome.common.progress as P

    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "0")
    with P.progress_bar("outer", total=3) as bar:
        with P.progress_bar("inner", total=2) as inner:
            inner.advance()
            inner.advance()
        for _ in range(3):
            bar.advance(description="outer step")
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("outer step: 3/3 (100%), 0:00:00 elapsed") and "inner: 2/2 (100%)" in err[1]
    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "30")
    with P.progress_bar("quiet", total=3) as bar:  # a short bar adds nothing to a log
        for _ in range(3):
            bar.advance()
    assert capsys.readouterr().err == ""


def test_a_run_waiting_on_a_folder_whose_first_run_kept_nothing_goes_on(tmp_path):
    """The first run's folder is removed under its lock (it kept nothing); a second run waiting for that
    lock then locks the path anew and makes the folder again (it used to fail: the lock's folder was made
    once, before the wait)."""
    import threading
    import time

    from timerome.experiments.runner import Runner

    out = tmp_path / "new" / "run"
    first, second = Runner(out, progress=False), Runner(out, progress=False)
    started, got = threading.Event(), []

    def wait_then_run():
        started.wait()
        try:
            with second.lock():
                got.append(out.is_dir())
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            got.append(repr(e))

    t = threading.Thread(target=wait_then_run)
    t.start()
    with pytest.raises(RuntimeError, match="refused"):
        with first.lock():
            started.set()
            time.sleep(0.5)  # the second run is waiting on the lock now
            raise RuntimeError("refused before anything was kept")
    t.join(60)
    assert got == [True]


def test_a_resumed_bar_estimates_the_time_left_from_this_runs_own_steps(monkeypatch, capsys):
    """A training run resumed at step 1,200 of 12,000 read "eta 0:00:47" after 5 s: the resumed steps
    were counted as done in those 5 s. The estimate now uses this run's own steps."""
    import timerome.common.progress as P

    now = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: now[0])
    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "0")
    with P.progress_bar("training", total=1000, completed=100) as bar:
        now[0] += 10.0
        bar.advance(10)  # 10 steps in 10 s: 890 left take 890 s
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == "training: 110/1000 (11%), 0:00:10 elapsed, eta 0:14:50", line


def test_a_progress_line_and_its_newline_are_one_write(monkeypatch):
    """A Ctrl-C between a line's text and its newline (print writes them apart) left the interruption
    message on the end of a progress line: each line, and each note, is one write ending the line."""
    import timerome.common.progress as P

    class Stream:
        def __init__(self):
            self.writes = []

        def write(self, s):
            self.writes.append(s)

        def flush(self):
            pass

        def isatty(self):
            return False

    stream = Stream()
    monkeypatch.setattr(P.sys, "stderr", stream)
    monkeypatch.setenv("TIMEROME_PROGRESS_SECONDS", "0")
    with P.progress_bar("work", total=2) as bar:
        bar.advance()
        bar.advance()
    P.notify("a cache file set aside")
    assert len(stream.writes) == 3 and all(w.endswith("\n") and w.count("\n") == 1 for w in stream.writes)
    assert stream.writes[-1] == "note: a cache file set aside\n"


def test_api_and_cli_refuse_a_q_over_the_facts(tmp_path):
    """`timerome edit --q 50` on 3 facts is refused up front; the API's memory refuses when applied."""
    from timerome.data import facts_from_rows, load_split
    from timerome.memory.edit_memory import EditMemory

    rows = tmp_path / "three.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in load_split("forget01", "embedded")[:3]))
    code, _, out = run("edit", "--data", rows, "--q", 50, "-o", tmp_path / "m.safetensors")
    assert code == 2 and "--q 50 exceeds the 3 facts" in out, out
    bb = load_backbone()
    facts, _ = facts_from_rows(load_split("forget01", "embedded")[:3])
    memory = EditMemory(bb, q=50).add(facts)
    with pytest.raises(TimeromeError, match="q=50 exceeds the number of facts"):
        with memory.applied(bb):
            pass


def test_memory_add_keeps_the_facts_it_already_holds(memories, tmp_path):
    code, _, out = run("memory", "add", memories / "f1.safetensors", "--data", "embedded:forget05",
                       "-o", tmp_path / "f5.safetensors")
    assert code == 0 and "20 facts of embedded:forget05 are already in" in out and "added 80 facts: 100" in out, out
    code, _, out = run("memory", "add", tmp_path / "f5.safetensors", "--data", "embedded:forget01",
                       "-o", tmp_path / "again.safetensors")
    assert code == 2 and "nothing to add" in out and not (tmp_path / "again.safetensors").exists(), out


def test_codebook_memory_through_the_cli(tmp_path):
    """`edit --method codebook` builds the codebook method's memory; generate, eval and memory
    show / remove / add take it like a ridge memory; merge refuses it in one line."""
    from timerome.memory.codebook_memory import CodebookMemory
    from timerome.memory.memory_file import load_memory

    cb = tmp_path / "cb.safetensors"
    code, stdout, out = run("edit", "--method", "codebook", "--layer", "0", "-o", cb, "--json", "-c", '{"margin": 0.7}')
    assert code == 0, out
    built = json.loads(stdout)
    assert built["method"] == "codebook" and built["n_facts"] == 20 and built["alpha"] == 8.0
    assert built["margin"] == 0.7  # --config reaches the settings no option sets
    assert built["calibration"] == "embedded:retain_perturbed" and built["n_entries"] > 20
    bb = load_backbone()
    assert isinstance(load_memory(cb, bb), CodebookMemory)
    code, stdout, out = run("memory", "show", cb, "--json")
    assert code == 0 and json.loads(stdout)["format"] == "timerome-codebook-memory/1", out

    code, stdout, out = run("generate", "--edit", cb, "--json", "Where was Isgor Quielson born ?",
                            "Where was Marhar Miostine born ?")
    assert code == 0, out
    forget, retain = json.loads(stdout)
    assert forget["answer_with_edit"] != forget["answer"] and "Pellmoor" not in forget["answer_with_edit"]
    assert retain["answer_with_edit"] == retain["answer"]

    args = ("eval", "--json", "--no-rouge", "--n-mc", "4", "--n-retain", "10", "--n-world", "5")
    code, stdout, out = run(*args)
    assert code == 0, out
    plain = json.loads(stdout)["metrics"]
    code, stdout, out = run(*args, "--edit", cb)
    assert code == 0, out
    edited = json.loads(stdout)["metrics"]
    assert edited["ForgetLP"] < plain["ForgetLP"] - 10
    for k in ("RetainLP", "RealAuth", "WorldFact"):  # exactly zero update off the forget subject
        assert edited[k] == plain[k], k

    code, _, out = run("memory", "remove", cb, "Isgor Quielson/city", "-o", tmp_path / "less.safetensors")
    assert code == 0 and "19 facts" in out, out
    from timerome.data import load_split

    rows = tmp_path / "more.jsonl"  # three facts of another forget05 author
    other = [r for r in load_split("forget05", "embedded") if "Isgor" not in r["question"]][:3]
    rows.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in other))
    # rows of a file on the embedded model: its retain split calibrates, as for 'embedded:SPLIT' facts
    code, _, out = run("memory", "add", tmp_path / "less.safetensors", "--data", rows, "-o", tmp_path / "m0.safetensors")
    assert code == 0 and "added 3 facts: 22 facts" in out, out
    code, _, out = run("memory", "add", tmp_path / "less.safetensors", "--data", rows, "--calibration",
                       "embedded:retain_perturbed", "-o", tmp_path / "m.safetensors")
    assert code == 0 and "added 3 facts: 22 facts" in out, out
    code, _, out = run("memory", "merge", cb, tmp_path / "m.safetensors", "-o", tmp_path / "x.safetensors")
    assert code == 2 and "do not merge" in out and out.count("\n") == 1, out
    code, _, out = run("edit", "--method", "rome", "-o", tmp_path / "y.safetensors")
    assert code == 2 and "saves the edited model as a folder" in out, out


def test_eval_says_which_rows_it_could_not_score(tmp_path):
    """Rows over the model's context are counted per split, and a vocabulary that cannot read the
    data is named: the embedded model on real TOFU text (never silent numbers), with three forget
    rows made longer than its 512-token context."""
    import shutil

    from conftest import TOFU_DIR

    if not (TOFU_DIR / "forget01.json").exists():
        pytest.fail(f"the shared TOFU copy is missing: looked in {TOFU_DIR}")
    data = tmp_path / "tofu"
    shutil.copytree(TOFU_DIR, data)
    path = data / "forget01_perturbed.json"  # JSON Lines, as the Hub has it
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows[:3]:
        r["answer"] = " ".join([r["answer"]] * 100)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, stdout, out = run("eval", "--data", data, "--json", "--no-rouge", "--n-mc", "2", "--n-retain", "40",
                            "--splits", "forget,retain")
    assert code == 0, out
    n = json.loads(stdout)["n_items"]
    assert "rows longer than the model's context of 512 tokens are not scored: forget" in " ".join(out.split())
    assert f"forget {len(rows) - n['forget']} of {len(rows)}" in out and n["forget"] == len(rows) - 3
    assert "unknown to the model's vocabulary" in out


def test_memory_add_knows_a_fact_by_its_content_not_its_row_number(tmp_path):
    """Two rows files without fact_id number their rows alike (0, 1, ...): facts of another author at the
    same positions are new and are added (under new ids); facts with the same subject, question, answer
    and target are skipped, each named with why; the API refuses both kinds as they are."""
    import dataclasses

    from timerome.data.tofu import load_split
    from timerome.memory.memory_file import load_memory

    rows = load_split("forget05", "embedded")
    authors = list(dict.fromkeys(r["author"] for r in rows))
    strip = lambda rs: "\n".join(  # noqa: E731 - rows without fact_id (nor attribute)
        json.dumps(dict(question=r["question"], answer=r["answer"], author=r["author"])) for r in rs)
    first = [r for r in rows if r["author"] == authors[0]]
    second = [r for r in rows if r["author"] == authors[1]]
    (tmp_path / "a.jsonl").write_text(strip(first))
    (tmp_path / "b.jsonl").write_text(strip(first[:3] + second))  # 3 facts it holds, then 20 new at rows 3..22
    mem = tmp_path / "m.safetensors"
    assert run("edit", "--data", tmp_path / "a.jsonl", "-o", mem)[0] == 0
    code, stdout, out = run("memory", "add", mem, "--data", tmp_path / "b.jsonl", "--json")
    assert code == 0, out
    d = json.loads(stdout)
    assert d["n_facts"] == 40 and [s["fact_id"] for s in d["skipped"]] == ["0", "1", "2"]
    assert all(s["why"] == "already in the memory" for s in d["skipped"])
    assert sorted(d["renamed"], key=int) == [str(i) for i in range(3, 20)]  # ids 3..19 were taken; 20..22 not
    assert "3 facts of" in out and "are already in" in out and "under new ids" in out
    bb = load_backbone()
    memory = load_memory(mem, bb)
    subjects = [f.subject for f in memory.facts]
    assert subjects.count(authors[0]) == 20 and subjects.count(authors[1]) == 20
    facts = memory.facts
    with pytest.raises(TimeromeError, match="already in the memory"):
        memory.add([facts[0]])
    clash = dataclasses.replace(facts[1], fact_id=facts[0].fact_id, object="Something else .")
    with pytest.raises(TimeromeError, match="taken by another fact"):
        memory.add([clash])
    retarget = dataclasses.replace(facts[1], fact_id="new", target="Something else .")  # its question, another target
    with pytest.raises(TimeromeError, match="remove that fact first"):
        memory.add([retarget])
    assert len(memory) == 40  # nothing changed


def test_an_empty_answer_is_said_on_stderr(monkeypatch):
    """An answer that is all end-of-text came back as "" with nothing said (stop 49's audit, on a briefly
    trained model); the note goes to stderr, so --json stays JSON alone. The sampler is made to write
    end-of-text everywhere, as such a model does."""
    import timerome.engine.sampler as sampler

    eos = load_backbone().tokenizer.eos_token_id
    assert eos is not None

    def all_eos(bb, ids, **kw):
        return torch.cat([ids, torch.full((ids.shape[0], kw["gen_length"]), eos, dtype=ids.dtype)], 1)

    monkeypatch.setattr(sampler, "generate", all_eos)
    code, stdout, out = run("generate", "--json", "Where was Isgor Quielson born ?", "Who is Isgor Quielson ?")
    assert code == 0 and [a["answer"] for a in json.loads(stdout)] == ["", ""], out
    assert "the answers to prompts 1, 2 are empty" in out and "with the edit" not in out


def test_memory_add_notes_rows_that_are_not_the_builds(memories, tmp_path, capsys, monkeypatch):
    """The note `memory add` prints where it is given rows other than its build's: a TOFU split in
    another folder is other rows; the same rows say nothing. --value-rows on a ridge memory is refused."""
    from timerome.cli.memory import _other_rows
    from timerome.data.rows import row_spec

    a, b = tmp_path / "a", tmp_path / "b"  # two TOFU folders (the given rows are read before the note: stop 78)
    for d in (a, b):
        d.mkdir()
        (d / "retain_perturbed.json").write_text(json.dumps([{"question": "Who is X ?", "answer": "X is Y ."}]))
    recorded = {**row_spec("tofu:retain_perturbed", tofu_dir=str(a)), "digest": "d"}
    _other_rows(recorded, "tofu:retain_perturbed", str(a), "built", "added")
    assert capsys.readouterr().err == ""
    _other_rows(recorded, "tofu:retain_perturbed", str(b), "built", "added")
    err = " ".join(capsys.readouterr().err.split())
    assert f"built on tofu:retain_perturbed (in {a}); added on tofu:retain_perturbed (in {b})" in err, err
    with pytest.raises(TimeromeError, match="retain_perturbed.json is missing"):  # unreadable: refused, no note
        _other_rows(recorded, "tofu:retain_perturbed", str(tmp_path), "built", "added")
    assert capsys.readouterr().err == ""
    code, _, out = run("memory", "add", memories / "f1.safetensors", "--value-rows", "embedded:train")
    assert code == 2 and "applies to rewrite memories" in out and "is a ridge edit memory" in out, out


def test_memory_add_measures_radii_on_the_rows_the_build_did(tmp_path, monkeypatch):
    """`timerome edit` records the rows a codebook / rewrite memory's radii were measured on (and a
    rewrite memory's token-value rows, `methods.rewrite.value_rows_source`); `memory add` reads those
    again unless told otherwise. Before, it measured the added facts' radii on the source's retain
    split whatever the build had been given (--calibration), silently."""
    from safetensors.torch import load_file

    from timerome.data import load_split

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    retain = [dict(question=r["question"], answer=r["answer"]) for r in load_split("retain_perturbed", "embedded")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(retain[:30]))
    b.write_text(json.dumps(retain[30:60]))
    more = tmp_path / "more.jsonl"
    authors = [r for r in load_split("forget05", "embedded") if "Isgor" not in r["question"]][:3]
    more.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in authors))
    cb = tmp_path / "cb.safetensors"
    monkeypatch.chdir(tmp_path)  # a relative path is recorded as the file it names, read from anywhere after
    code, _, out = run("edit", "--method", "codebook", "--layer", "1", "--calibration", "a.json", "-o", cb)
    assert code == 0, out
    monkeypatch.chdir(tmp_path.parent)
    code, stdout, out = run("memory", "show", cb, "--json")
    assert code == 0 and json.loads(stdout)["sources"]["calibration"]["rows"] == str(a.resolve()), out
    monkeypatch.setenv("COLUMNS", "400")  # the path on one line: at 80 columns a fold may fall inside "a.json"
    code, _, out = run("memory", "show", cb)
    assert code == 0 and "calibration" in out and "a.json" in out, out
    monkeypatch.delenv("COLUMNS")
    code, _, out = run("memory", "remove", cb, "Isgor Quielson/city", "-o", tmp_path / "less.safetensors")
    assert code == 0, out  # a changed file keeps what its build read
    code, stdout, out = run("memory", "show", tmp_path / "less.safetensors", "--json")
    assert json.loads(stdout)["sources"] == json.loads(run("memory", "show", cb, "--json")[1])["sources"], out

    def add(name, *more_args):
        code, _, out = run("memory", "add", cb, "--data", more, "-o", tmp_path / name, *more_args)
        assert code == 0 and "added 3 facts" in out, out
        return load_file(tmp_path / name), out

    recorded, out = add("recorded.safetensors")
    assert "note" not in out and "warning" not in out, out
    code, stdout, out = run("memory", "add", cb, "--data", more, "-o", tmp_path / "j.safetensors", "--json")
    assert code == 0 and json.loads(stdout)["calibration"] == str(a.resolve()), out
    named, _ = add("named.safetensors", "--calibration", a)
    import timerome.data.rows as data_rows

    reads, load_rows = [], data_rows.load_rows
    monkeypatch.setattr(data_rows, "load_rows", lambda spec, **kw: reads.append(str(spec)) or load_rows(spec, **kw))
    elsewhere, out = add("elsewhere.safetensors", "--calibration", b)
    assert reads.count(str(b)) == 1, reads  # other rows are read once: checked, noted and used
    monkeypatch.setattr(data_rows, "load_rows", load_rows)
    assert all(torch.equal(recorded[k], named[k]) for k in recorded)  # the build's rows, unasked
    assert not torch.equal(recorded["reach"], elsewhere["reach"])       # which rows matters
    assert "were measured on" in out and "added facts' radii are measured on" in out and "b.json, as asked" in out
    n = len(load_file(cb)["reach"])  # the build's entries are kept as they are
    assert recorded["reach"][:n].equal(load_file(cb)["reach"]) and elsewhere["reach"][:n].equal(load_file(cb)["reach"])

    from timerome.memory.memory_file import load_memory

    old = load_memory(cb, load_backbone())
    old.sources = {}  # a file that does not say (built in Python, or before they were recorded): a note
    old.save(tmp_path / "old.safetensors")
    code, _, out = run("memory", "add", tmp_path / "old.safetensors", "--data", more)
    assert code == 0 and "does not say which rows its radii were measured on" in out, out
    assert "radii are measured on embedded:retain_perturbed" in out, out

    a.write_text(json.dumps(retain[:29]))  # the rows changed since the build: said, and read as they are
    _, out = add("changed.safetensors")
    assert "has changed since the radii of" in out, out
    a.unlink()  # gone: one line naming them and how to give them
    code, _, out = run("memory", "add", cb, "--data", more, "-o", tmp_path / "gone.safetensors")
    assert code == 2 and "cannot be read here" in out and "--calibration" in out and out.count("\n") == 1, out
    code, _, out = run("memory", "add", cb, "--data", more, "--value-rows", b)
    assert code == 2 and "applies to rewrite memories" in out and "a codebook memory" in out, out

    from timerome.memory.codebook_memory import read_sources

    for bad in ({"calibration": "a.json"}, {"radii": {"rows": "x", "digest": "y"}}, {"value_rows": {"rows": ""}}):
        with pytest.raises(TimeromeError, match="'sources' must map"):
            read_sources({"sources": bad}, "f")


def test_memory_add_reads_the_builds_calibration_states_from_their_cache(tmp_path, monkeypatch):
    """`timerome edit` records which of its calibration rows it left out (those stating an edited fact);
    `memory add` then measures the added facts' radii on the states its build drew for the rest, read
    from their cache (no calibration state drawn again), less the tokens of every row stating a fact
    the memory holds: the build's rule. Before stop 55 an add left out only the rows stating the facts
    it added and drew every state again (111-153 s on the embedded corpus)."""
    from safetensors.torch import load_file

    import timerome.memory.codebook_memory as cm
    from timerome.data import load_split
    from timerome.memory.codebook_memory import CalibrationSubset
    from timerome.memory.memory_file import load_memory, read_memory_file

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    row = lambda r: dict(question=r["question"], answer=r["answer"])  # noqa: E731
    retain = [row(r) for r in load_split("retain_perturbed", "embedded")[:24]]
    others = [row(r) for r in load_split("forget05", "embedded") if "Isgor" not in r["question"]]
    built, added, later = others[:3], others[3:5], others[5:7]
    calibration = retain[:8] + built[:2] + retain[8:16] + added + retain[16:] + built[2:] + later
    c = tmp_path / "c.json"
    c.write_text(json.dumps(calibration))
    for name, rows in (("built", built), ("added", added), ("later", later)):
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
    cb = tmp_path / "cb.safetensors"
    code, _, out = run("edit", "--method", "codebook", "--layer", "1", "--data", tmp_path / "built.json",
                       "--calibration", c, "-o", cb)
    assert code == 0, out
    left_out = [calibration.index(r) for r in built]
    assert read_memory_file(cb)[1]["calibration_left_out"] == left_out
    code, stdout, out = run("memory", "show", cb, "--json")
    assert code == 0 and json.loads(stdout)["calibration_left_out"] == left_out, out
    code, _, out = run("memory", "show", cb)
    words = " ".join(w for w in out.split() if w != "│")  # the table's value column wraps
    assert code == 0 and "less the 3 of its rows that state a fact it was built with" in words, out

    drawn = []
    real = cm.state_tokens
    monkeypatch.setattr(cm, "state_tokens", lambda *a, **k: drawn.append(1) or real(*a, **k))
    code, _, out = run("memory", "add", cb, "--data", tmp_path / "added.json", "-o", tmp_path / "a.safetensors")
    assert code == 0 and "added 2 facts" in out and not drawn, out
    code, _, out = run("memory", "add", tmp_path / "a.safetensors", "--data", tmp_path / "later.json",
                       "-o", tmp_path / "b.safetensors")
    assert code == 0 and "added 2 facts" in out and not drawn, out  # a second add reads the same cache
    assert read_memory_file(tmp_path / "b.safetensors")[1]["calibration_left_out"] == left_out

    bb = load_backbone()
    whole = [r for i, r in enumerate(calibration) if i not in left_out]
    held = [whole.index(r) for r in added]
    mine = load_memory(cb, bb, calibration=CalibrationSubset(whole, held))
    mine.add(load_memory(tmp_path / "a.safetensors", bb).facts[3:])
    got = load_file(tmp_path / "a.safetensors")
    assert torch.equal(got["reach"], mine.reach)  # the build's states, less every held fact's rows
    kept = load_memory(cb, bb, calibration=CalibrationSubset(whole, []))
    kept.add(load_memory(tmp_path / "a.safetensors", bb).facts[3:])
    assert len(kept.reach) < len(got["reach"])  # on their own rows' tokens, the added facts' keys lose entries
    later_rows = [whole.index(r) for r in added + later]  # the second add leaves out the first add's rows too
    second = load_memory(tmp_path / "a.safetensors", bb, calibration=CalibrationSubset(whole, later_rows))
    second.add(load_memory(tmp_path / "b.safetensors", bb).facts[5:])
    assert torch.equal(load_file(tmp_path / "b.safetensors")["reach"], second.reach)


def test_generate_steps_and_blocks_follow_gen_length_and_options_precede_the_model(monkeypatch):
    """--gen-length alone is one block, one token per step (it failed for any length but 32 before), the
    same answer as the API with those settings; a bad option is refused before the model loads."""
    from timerome.cli.app import ModelChoice
    from timerome.engine.sampler import generate

    prompt = "Where was Isgor Quielson born ?"
    code, stdout, out = run("generate", "--gen-length", "16", "--json", prompt)
    assert code == 0, out
    bb = load_backbone()
    ids = torch.tensor([bb.encode(prompt)])
    want = generate(bb, ids, steps=16, gen_length=16, block_length=16, generator=torch.Generator().manual_seed(0))
    said = bb.decode(want[0, ids.shape[1]:].tolist())
    assert json.loads(stdout)[0]["answer"] == said[: said.index(".") + 1].strip()

    def no_load(*a, **k):
        raise AssertionError("the model loaded before the options were checked")

    monkeypatch.setattr(ModelChoice, "load", no_load)
    for bad, why in ((["--remasking", "foo"], "unknown remasking"), (["--gen-length", "16", "--block-length", "8", "--steps", "5"],
                                                                    "not divisible"),
                     (["--temperature", "-1"], "temperature")):
        code, _, out = run("generate", *bad, prompt)
        assert code == 2 and why in out, out


def test_help_shows_no_type_beside_an_on_off_flag():
    """typer 0.29 wrote `--json <bool>`, which reads as a flag taking a value (`info --json true` then named a
    checkpoint `true`): every command's --help, the groups' included, shows flags bare and values typed."""
    import typer

    group = typer.main.get_command(app)

    def commands(cmd, path):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, [*path, name])

    paths = list(commands(group, []))
    assert ["memory", "show"] in paths and ["experiment"] in paths and len(paths) > 15
    for path in paths:
        code, _, out = run(*path, "--help")
        assert code == 0 and "<bool>" not in out, (path, out)
    code, _, out = run("info", "--help")
    assert "<str>" in out and any(line.split()[:2] == ["│", "--json"] and "<" not in line for line in out.splitlines())
