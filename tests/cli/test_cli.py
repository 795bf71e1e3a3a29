"""The command line: each command runs on the embedded model, bad input is one line and exit 2."""

import json
import shutil

import pytest
from typer.testing import CliRunner

import timerome
from timerome.cli import app

runner = CliRunner()


def run(*args):
    """(exit code, output); with --json and success, standard output alone: what a script parses (notes and
    warnings go to standard error, with --json too)."""
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, (res.stdout if "--json" in map(str, args) and res.exit_code == 0 else res.output)


def test_info_lists_hook_points():
    code, out = run("info")
    assert code == 0 and "resid" in out and "blocks.0" in out


def test_methods_say_what_each_changes_and_whether_it_installs_on_an_autoregressive_model():
    """Measured on a random AR Llama (stop 81): every method installs with its defaults but the TIE-traced
    ones (timerome, codebook: trace_kind 'positional' or a coordinate) and the rewrite memory (refused)."""
    from timerome.methods import available, get_method

    code, out = run("methods")
    rows, name = {}, None
    for line in out.splitlines():  # a row wraps over several lines: each cell's pieces joined
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 4:
            name = cells[0] or name
            rows[name] = [" ".join(filter(None, (a, b))) for a, b in zip(rows.get(name, [""] * 4), cells)]
    rows = {k: " | ".join(v) for k, v in rows.items()}
    assert code == 0 and set(available()) <= set(rows), out
    assert "no: it writes answer positions" in rows["rewrite"] and "weights" in rows["rome"], out
    assert "hooks" in rows["codebook"] and get_method("codebook").autoregressive.startswith("with trace_kind")
    assert sum(get_method(m).autoregressive == "yes" for m in available()) == len(available()) - 3


def test_trace_edit_generate_chain(tmp_path):
    code, out = run("trace", "--out", tmp_path / "t", "--n-facts", 2, "--n-samples", 1, "--steps", 4)
    assert code == 0, out
    sel = json.loads((tmp_path / "t" / "selection.json").read_text())
    assert (tmp_path / "t" / "heatmap.png").stat().st_size > 1000
    assert sel["best"]["module"] in ("resid", "attn", "mlp") and len(sel["per_fact"]) == 2

    mem = tmp_path / "forget.safetensors"
    code, out = run("edit", "--trace", tmp_path / "t" / "trace.safetensors", "--out", mem)
    assert code == 0 and mem.exists(), out
    assert " resid " in out  # the edited hook point is resid unless --module says otherwise

    code, out = run("generate", "--edit", mem, "Where was Isgor Quielson born ?")
    assert code == 0 and "answer with edit" in out, out


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (("edit", "--data", "no-such-file.json"),
                 ("trace", "--data", "embedded:forget42", "--out", tmp_path / "t"),
                 ("info", "--family", "gpt2"),
                 ("experiment", "nonsense", "--out", tmp_path),
                 ("demo", "--seeds", "a,b")):
        code, out = run(*args)
        assert code == 2 and out.startswith("error:") and "Traceback" not in out, (args, out)
    (tmp_path / "bad.safetensors").write_bytes(b"not a memory")
    code, out = run("generate", "--edit", tmp_path / "bad.safetensors", "hello")
    assert code == 2 and "error:" in out, out


def test_edit_follows_the_trace_for_the_chosen_module(tmp_path):
    # --trace picks the best layer among the edited hook point (resid by default), like the method
    from timerome.methods.timerome_edit import select
    from timerome.tracing.causal_trace import TraceResult

    code, out = run("trace", "--out", tmp_path / "t", "--n-facts", 2, "--n-samples", 1, "--steps", 4)
    assert code == 0, out
    result = TraceResult.load(tmp_path / "t" / "trace.safetensors")
    for module in ("resid", "mlp"):
        mem = tmp_path / f"{module}.safetensors"
        code, out = run("edit", "--trace", tmp_path / "t" / "trace.safetensors", "--module", module, "--out", mem)
        assert code == 0, out
        assert f"layer {select(result, (module,)).layer} {module}" in out


def test_generate_passes_the_step_to_a_step_only_edit(tmp_path):
    import torch

    from timerome import load_backbone
    from timerome.engine.sampler import generate
    from timerome.memory.edit_memory import EditMemory

    mem = tmp_path / "k6.safetensors"
    code, out = run("edit", "--layer", 1, "--step", 6, "--alpha", 20, "--out", mem)
    assert code == 0, out
    prompt = "Where was Isgor Quielson born ?"
    code, out = run("generate", "--edit", mem, "--steps", 8, "--gen-length", 8, "--block-length", 8, prompt)
    assert code == 0, out
    # the CLI's edited answer is the API's answer with the step state passed along
    bb = load_backbone()
    memory = EditMemory.load(mem, bb)
    ids = torch.tensor([bb.encode(prompt)])
    kw = dict(steps=8, gen_length=8, block_length=8, generator=torch.Generator().manual_seed(0))
    with memory.applied(bb) as state:
        edited = bb.decode(generate(bb, ids, state=state, **kw)[0, ids.shape[1]:])
    with torch.no_grad():
        plain = bb.decode(generate(bb, ids, **{**kw, "generator": torch.Generator().manual_seed(0)})[0, ids.shape[1]:])
    assert edited != plain  # an edit at step 6 alone changes the answer
    with memory.applied(bb):  # no state handed to generate: the sampler publishes its step to the hooks all the same
        again = generate(bb, ids, **{**kw, "generator": torch.Generator().manual_seed(0)})
        unhanded = bb.decode(again[0, ids.shape[1]:])
    assert unhanded == edited
    flat = " ".join(out.split())
    assert edited.split()[-1] in flat and plain.split()[-1] in flat, out

    # a run too short to reach the edited step is refused, not silently unedited
    code, out = run("generate", "--edit", mem, "--steps", 4, "--gen-length", 4, "--block-length", 4, prompt)
    assert code == 2 and "step 6" in out, out


def test_a_one_step_edit_is_scored_by_its_answers_not_by_likelihoods(tmp_path):
    """eval --requests of an edit of one step: Efficacy from its generations; the likelihood columns,
    which it never meets, absent with a note (never the unedited model's numbers under its name)."""
    mem = tmp_path / "k2.safetensors"
    code, out = run("edit", "--layer", 1, "--step", 2, "--alpha", 20, "--out", mem)
    assert code == 0, out
    code, out = run("eval", "--requests", "embedded:forget01", "--edit", mem, "--n-retain", 2, "--n-world", 1, "--json")
    assert code == 0, out
    got = json.loads(out[out.index("{"):])
    assert got["n_locality"] == {"retain": 2, "real_authors": 1, "world_facts": 1}  # each set by its own option
    assert "Efficacy" in got["metrics"] and "EfficacyLP" not in got["metrics"]
    assert any(a["answer_with_edit"] != a["answer"] for a in got["answers"])  # the one edited step acted
    assert any(n.startswith("EfficacyLP: not computed") and "step 2" in n for n in got["notes"]), got["notes"]


def test_eval_requests_flags_an_edit_that_changed_no_answer(tmp_path):
    """An edit whose answers are all the unedited model's did nothing, whatever its log-probabilities:
    eval --requests says so (Unchanged = 1, a warning and a note), as the editing experiment does."""
    mem = tmp_path / "a0.safetensors"
    code, out = run("edit", "--alpha", 0, "--out", mem)
    assert code == 0, out
    args = ("eval", "--requests", "embedded:forget01", "--edit", mem, "--n-retain", 1, "--n-world", 1, "--n-mc", 1)
    res = runner.invoke(app, [str(a) for a in args] + ["--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)  # the JSON alone on stdout; its warning on stderr too (docs/cli.md)
    assert got["metrics"]["Unchanged"] == 1.0 and any(n.startswith("Unchanged: every answer") for n in got["notes"])
    assert "warning: Unchanged" in " ".join(res.stderr.split()), res.stderr
    assert all(a["answer_with_edit"] == a["answer"] for a in got["answers"])
    code, out = run(*args)
    assert code == 0 and "warning: Unchanged" in " ".join(out.split()), out


def test_edit_warns_of_a_lambda_that_swamps_the_keys(tmp_path):
    code, out = run("edit", "--lam", "1e6", "--out", tmp_path / "m.safetensors")
    assert code == 0 and "warning" in out and "1/1e+06" in " ".join(out.split()), out
    code, out = run("edit", "--out", tmp_path / "m.safetensors")
    assert code == 0 and "warning" not in out and "note" not in out, out  # the embedded model's default site: its trace's


def test_edit_rejects_bad_coordinates_and_q(tmp_path):
    for args in (("--layer", 99), ("--layer", -5), ("--module", "ffn"), ("--q", 500)):
        code, out = run("edit", *args, "--out", tmp_path / "m.safetensors")
        assert code == 2 and out.startswith("error:"), (args, out)
    code, out = run("edit", "--layer", -1, "--out", tmp_path / "m.safetensors")  # counted from the top, as the API
    assert code == 0 and "at layer 3 resid" in out, out


def test_device_and_dtype_options(tmp_path):
    code, out = run("info", "--dtype", "bfloat16", "--device", "cpu")
    assert code == 0, out
    for args in (("--device", "gpu0"), ("--device", "cuda:7"), ("--dtype", "float8")):
        code, out = run("info", *args)
        assert code == 2 and out.startswith("error:"), (args, out)
    code, out = run("generate", "--dtype", "bfloat16", "Where was Isgor Quielson born ?")
    assert code == 0 and "Quielson" in out, out


def test_edit_on_another_model_asks_for_a_background(tmp_path):
    import shutil

    from timerome.backbones.loading import DEFAULT_MODEL_DIR

    ckpt = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "copy")  # same weights, not "the embedded model"
    code, out = run("edit", "--model", ckpt, "--layer", 0, "--out", tmp_path / "m.safetensors")
    assert code == 2 and "--background" in out, out
    (tmp_path / "bg.txt").write_text("Where was Isgor Quielson born ?\nWhat does Isgor Quielson write ?\n")
    code, out = run("edit", "--model", ckpt, "--layer", 0, "--background", tmp_path / "bg.txt",
                    "--out", tmp_path / "m.safetensors")
    assert code == 0 and (tmp_path / "m.safetensors").exists(), out


def test_trace_with_a_neighbour_penalty_and_the_edit_at_its_coordinate(tmp_path):
    """edit --trace selected without the penalty the trace chose with: it printed layer 2 and edited
    layer 1 (stop 61's audit). The neighbours' trace is saved beside it and read back."""
    from timerome.tracing.result import TraceResult
    from timerome.tracing.selection import select_coordinate

    code, out = run("trace", "--out", tmp_path / "t", "--n-facts", 4, "--n-samples", 2, "--steps", 4,
                    "--neighbours", "embedded:retain90", "--beta", 1.0)
    assert code == 0, out
    sel = json.loads((tmp_path / "t" / "selection.json").read_text())
    assert sel["beta"] == 1.0 and sel["best"]["neighbour_abs_tie"] >= 0.0
    assert sel["runner_up"]["layer"] != sel["edit"]["layer"] and sel["runner_up"]["margin"] >= 0
    facts_trace = TraceResult.load(tmp_path / "t" / "trace.safetensors")
    plain = select_coordinate(facts_trace, modules=("resid",)).best
    assert plain.layer != sel["edit"]["layer"]  # the penalty moves this choice: what the edit must follow
    near = TraceResult.load(tmp_path / "t" / "neighbours.safetensors").settings  # the facts' sigma, said so
    assert near["sigma"] == facts_trace.settings["sigma"] and near["sigma_rule"] == "from trace (s3)"
    assert facts_trace.settings["sigma_rule"] == "s3"
    code, out = run("edit", "--trace", tmp_path / "t", "-o", tmp_path / "m.safetensors", "--json")
    assert code == 0, out
    assert json.loads(out)["coordinate"]["layer"] == sel["edit"]["layer"]
    # a neighbours' trace of another run in its place (the new one written, the trace not yet: an interrupted
    # run over an earlier one), each half of it whole: refused, not selected against
    near_files = [tmp_path / "t" / f"neighbours.{x}" for x in ("safetensors", "json")]
    kept = [f.read_bytes() for f in near_files]
    other = TraceResult.load(tmp_path / "t" / "neighbours.safetensors")
    other.tie = other.tie * 2
    other.tie_full = other.tie_full * 2
    other.save(tmp_path / "t" / "neighbours.safetensors")
    code, out = run("edit", "--trace", tmp_path / "t", "-o", tmp_path / "m.safetensors")
    assert code == 2 and "against another neighbour trace" in out, out
    for f, b in zip(near_files, kept):
        f.write_bytes(b)
    linked = tmp_path / "linked"  # the trace given through a link: its neighbours are found beside its target
    linked.mkdir()
    (linked / "trace.safetensors").symlink_to(tmp_path / "t" / "trace.safetensors")
    code, out = run("edit", "--trace", linked / "trace.safetensors", "-o", tmp_path / "m2.safetensors", "--json")
    assert code == 0 and json.loads(out)["coordinate"]["layer"] == sel["edit"]["layer"], out
    near_files[0].unlink()
    code, out = run("edit", "--trace", tmp_path / "t", "-o", tmp_path / "m.safetensors")
    assert code == 2 and "neighbour facts' trace" in out and "not there" in out, out
    code, out = run("trace", "--out", tmp_path / "u", "--n-facts", 0)
    assert code == 2 and "--n-facts" in out, out
    code, out = run("trace", "--out", tmp_path / "u", "--noise", "shuffled")
    assert code == 2 and "--noise must be one of in_order, per_fact" in out and not (tmp_path / "u").exists(), out
    code, out = run("trace", "--out", tmp_path / "p", "--n-facts", 2, "--n-samples", 2, "--steps", 4,
                    "--noise", "per_fact")
    assert code == 0, out
    assert TraceResult.load(tmp_path / "p" / "trace.safetensors").settings["noise"] == "per_fact"
    code, out = run("trace", "--out", tmp_path / "u", "--read-positions", "object")
    assert code == 2 and "--read-positions must be one of all, no_subject" in out and not (tmp_path / "u").exists(), out
    code, out = run("trace", "--out", tmp_path / "r", "--n-facts", 2, "--n-samples", 2, "--steps", 4,
                    "--read-positions", "no_subject")
    assert code == 0 and "the subject's repeat in each answer not scored" in " ".join(out.split()), out
    got = TraceResult.load(tmp_path / "r" / "trace.safetensors")
    assert got.settings["read_positions"] == "no_subject" and got.facts[0]["unscored_positions"] == [0, 1]
    code, out = run("trace", "--positional", "--out", tmp_path / "u", "--read-positions", "no_subject")
    assert code == 2 and "--read-positions sets the TIE trace" in out, out


def test_a_trace_stopped_before_its_selection_leaves_no_earlier_selection(tmp_path, monkeypatch):
    """selection.json is written last: a trace stopped after its tensors over an earlier run's --out left that
    run's selection beside the new trace, as if it were this one's. It goes before the new files are written."""
    import timerome.tracing.heatmaps as heatmaps
    from timerome.tracing.result import TraceResult

    args = ("trace", "--out", tmp_path / "t", "--n-facts", 2, "--n-samples", 2, "--steps", 4)
    code, out = run(*args)
    assert code == 0 and (tmp_path / "t" / "selection.json").exists(), out

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(heatmaps, "plot_heatmaps", stopped)  # the trace is written, its figure and selection not
    code, out = run(*args[:-2], "--steps", 3)
    assert code == 130, out
    assert TraceResult.load(tmp_path / "t" / "trace.safetensors").steps == 3  # the new trace, with no old selection
    assert not (tmp_path / "t" / "selection.json").exists()


def test_a_trace_leaves_no_earlier_runs_files_in_its_folder(tmp_path, monkeypatch):
    """Every file `timerome trace` writes in --out is one run's: a run stopped before its heatmaps left the
    earlier ones; fewer facts left earlier per-fact heatmaps; a positional run over a TIE one left two traces
    (`edit --trace` on the folder then asked which); a run without --neighbours left the earlier neighbours'
    trace. Files this command does not write, and a link's target, are kept."""
    import timerome.tracing.heatmaps as heatmaps

    t = tmp_path / "t"
    code, out = run("trace", "--out", t, "--n-facts", 3, "--n-samples", 1, "--steps", 3, "--per-fact",
                    "--neighbours", "embedded:retain90", "--beta", "0.5")
    assert code == 0, out
    assert sorted(p.name for p in (t / "per_fact").iterdir()) == [f"heatmap-{i}.png" for i in range(3)]
    assert (t / "neighbours.safetensors").exists()
    (t / "notes.txt").write_text("mine")
    (t / "per_fact" / "mine.png").write_bytes(b"x")
    elsewhere = tmp_path / "kept.png"
    elsewhere.write_bytes(b"target")
    (t / "heatmap_compare.png").symlink_to(elsewhere)  # a name this run does not write, as a link

    code, out = run("trace", "--out", t, "--n-facts", 2, "--n-samples", 1, "--steps", 3, "--per-fact")
    assert code == 0, out
    assert sorted(p.name for p in (t / "per_fact").iterdir()) == ["heatmap-0.png", "heatmap-1.png", "mine.png"]
    assert not (t / "neighbours.safetensors").exists() and not (t / "neighbours.json").exists()
    assert not (t / "heatmap_compare.png").is_symlink() and elsewhere.read_bytes() == b"target"
    assert (t / "notes.txt").read_text() == "mine"

    code, out = run("trace", "--positional", "--out", t, "--n-facts", 2, "--n-samples", 1)
    assert code == 0, out
    assert not (t / "trace.safetensors").exists() and not (t / "trace.json").exists()
    assert not (t / "per_fact").exists() or not any((t / "per_fact").glob("heatmap-*.png"))
    code, out = run("edit", "--trace", t, "--module", "mlp", "--out", tmp_path / "m.safetensors")
    assert code == 0, out  # one trace in the folder: no question which

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(heatmaps, "plot_heatmaps", stopped)  # the trace is written, its figure not
    code, out = run("trace", "--out", t, "--n-facts", 2, "--n-samples", 1, "--steps", 3)
    assert code == 130, out
    assert not (t / "heatmap.png").exists() and not (t / "positional.safetensors").exists()
    assert (t / "trace.safetensors").exists()
    monkeypatch.undo()

    # an input given in --out under a name the command writes is refused before any work, never removed (review 60)
    from timerome.data import load_split

    (t / "neighbours.json").write_text(json.dumps(load_split("retain_perturbed", "embedded")[:3]))
    code, out = run("trace", "--out", t, "--n-facts", 1, "--n-samples", 1, "--steps", 2, "--neighbours",
                    t / "neighbours.json", "--beta", "0.5")
    assert code == 2 and "--neighbours" in out and "give another --out" in out, out
    assert len(json.loads((t / "neighbours.json").read_text())) == 3
    # a per_fact that is a link: its target's files are not ours to clear
    (t / "neighbours.json").unlink()
    shutil.rmtree(t / "per_fact", ignore_errors=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "heatmap-7.png").write_bytes(b"theirs")
    (t / "per_fact").symlink_to(target)
    code, out = run("trace", "--out", t, "--n-facts", 1, "--n-samples", 1, "--steps", 2)
    assert code == 0 and (target / "heatmap-7.png").read_bytes() == b"theirs", out


def test_an_exact_tie_with_the_runner_up_is_said_to_be_one(tmp_path):
    """Two cells that restore the same (here both give the clean answer back) were said to "lead by 0.000
    (standard error 0.000)", with no note that the cells' order, not the trace, chose (review 59)."""
    code, out = run("trace", "--read-positions", "no_subject", "-o", tmp_path / "t", "--n-facts", 2,
                    "--n-samples", 1)
    assert code == 0, out
    sel = json.loads((tmp_path / "t" / "selection.json").read_text())["runner_up"]
    assert sel["margin"] == 0 and sel["tie"] and sel["within_noise"]
    assert "ties with the runner-up" in out and "leads the runner-up" not in out, out
    # with --json the note goes to stderr too, as docs/cli.md says of every note (it was in the JSON only)
    res = runner.invoke(app, ["trace", "--read-positions", "no_subject", "-o", str(tmp_path / "t"), "--n-facts", "2",
                              "--n-samples", "1", "--json"])
    assert res.exit_code == 0 and "ties with the runner-up" in res.stderr, res.stderr
    assert json.loads(res.stdout)["runner_up"]["tie"] and "ties with" not in res.stdout


def test_eval_sizes_above_the_rows_there_are_are_said(tmp_path):
    """--n-world 1000 evaluated the 50 rows there are and said nothing (trace --n-facts says so; review 59)."""
    from timerome.cli.evaluate import fewer_rows

    code, out = run("eval", "--splits", "real_authors", "--n-world", 1000, "--no-rouge", "--n-mc", 1)
    assert code == 0 and "--n-world 1000: there are fewer rows (real_authors 50)" in out, out
    code, out = run("eval", "--splits", "real_authors", "--n-world", 10, "--no-rouge", "--n-mc", 1)
    assert code == 0 and "fewer rows" not in out, out
    assert fewer_rows({"--n-retain": 5, "--n-world": 60}, {"retain": 5, "real_authors": 50, "world_facts": 70}) == [
        "--n-world 60: there are fewer rows (real_authors 50): all of them are evaluated"]


def test_subjects_the_vocabulary_does_not_know_are_said_once_by_the_cli_and_by_the_api(tmp_path):
    """The CLI warned about such subjects on loading facts; the API's trace read them as <|unk|> silently (review
    60). The trace says it now, and the CLI, which traces, says it once (the positional trace with --compare too)."""
    import pytest

    import timerome
    from timerome.data.facts import Fact

    rows = tmp_path / "unk.json"
    rows.write_text(json.dumps([
        {"question": "Where was Zzqxv Plorp born ?", "answer": "Pellmoor .", "subject": "Zzqxv Plorp"},
        {"question": "Where was Isgor Quielson born ?", "answer": "Pellmoor .", "subject": "Isgor Quielson"}]))
    for extra in ((), ("--positional", "--compare")):
        code, out = run("trace", "--data", rows, "-o", tmp_path / "t", "--n-samples", 1, "--steps", 2, *extra)
        assert code == 0 and out.count("facts have subjects with words") == 1 and "Zzqxv, Plorp" in out, out
    bb = timerome.load_backbone()
    with pytest.warns(UserWarning, match=r"1 of 1 facts have subjects .*\(Zzqxv, Plorp\)"):
        timerome.trace(bb, [Fact("Zzqxv Plorp", "Where was Zzqxv Plorp born ?", "Pellmoor .")], steps=2,
                       n_samples=1, progress=False)


def test_threads_option():
    import torch

    before = torch.get_num_threads()
    try:
        code, out = run("--threads", 1, "methods")
        assert code == 0 and "timerome" in out and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    code, out = run("--threads", 0, "methods")
    assert code == 2 and "must be a number of threads in 1..1024" in out and "Traceback" not in out


def test_positional_trace_compare_and_edit(tmp_path):
    out = tmp_path / "p"
    code, text = run("trace", "--positional", "--compare", "--out", out, "--n-facts", 2, "--n-samples", 2,
                     "--steps", 3, "--json")
    assert code == 0, text
    sel = json.loads(text)
    assert sel["kind"] == "positional" and sel["edit"]["module"] == "mlp"
    assert "nothing to restore" not in text, text  # the embedded model knows its facts
    assert set(sel["mean_by_category"]["resid"]) >= {"last subject token", "last token"}
    for name in ("heatmap.png", "heatmap_compare.png", "positional.safetensors", "trace.safetensors"):
        assert (out / name).stat().st_size > 500, name
    mem = tmp_path / "m.safetensors"
    code, text = run("edit", "--trace", out / "positional.safetensors", "--module", "mlp", "--out", mem)
    assert code == 0 and f"layer {sel['edit']['layer']} mlp" in text, text
    code, text = run("trace", "--compare", "--out", tmp_path / "q")
    assert code == 2 and "--positional" in text


def test_an_autoregressive_model_on_the_command_line(tmp_path):
    from timerome.backbones.tiny import make_tiny_checkpoint

    d = make_tiny_checkpoint("llama", tmp_path / "ar", layers=2)
    code, text = run("info", "-m", d, "--json")
    assert code == 0 and json.loads(text)["causal"] is True
    code, text = run("generate", "-m", d, "the author was born in", "--json")
    assert code == 0 and json.loads(text)[0]["answer"], text
    code, text = run("trace", "-m", d, "--data", "real-facts", "--out", tmp_path / "t")
    assert code == 2 and "autoregressive" in text and "--positional" in text  # TIE refuses in one line
    code, text = run("generate", "-m", d, "--cache", "dual", "the author")
    assert code == 2 and "autoregressive" in text
    code, text = run("eval", "-m", d, "--splits", "forget", "--cache", "dual")  # the model's kind, not its class
    assert code == 2 and "is autoregressive" in text and "appending" not in text, text
    # the seed draws only the likelihood's masks, which an AR model has none of: said, and measured (same numbers);
    # requests in the words of its vocabulary (the embedded corpus's are refused there since stop 83: it cannot
    # say them, and scored them as unknown tokens)
    said = tmp_path / "ar_eval.json"
    said.write_text(json.dumps([{"subject": "the author", "prompt": "where was the author born ?", "object": "city",
                                 "target": "sea", "neighbours": [{"prompt": "where was the sea ?", "answer": "city"}]}]))
    got = {}
    for seed in (0, 3):
        code, text = run("eval", "-m", d, "--requests", said, "--n-mc", 2, "--seed", seed, "--json")
        assert code == 0, text
        got[seed] = json.loads(text)
    assert got[0]["metrics"] == got[3]["metrics"] and got[0]["answers"] == got[3]["answers"]
    # room for a sentence of its own around the object (review 91: cut at the expected answer's length + 4)
    from timerome.metrics.editing import SENTENCE_TOKENS

    assert got[0]["gen_length"] == SENTENCE_TOKENS == 16, got[0]["gen_length"]
    assert any("--n-mc 2 changes nothing" in n for n in got[0]["notes"])
    assert any("as many characters as its expected answer has" in n for n in got[0]["notes"])  # what its Locality reads
    assert any("--n-mc 2 and --seed 3 (which draws only those masks" in n for n in got[3]["notes"])
    # the paper's memory on an AR model, at no traced site: both said (review 91: it printed "try it" alone)
    (tmp_path / "ar.json").write_text(json.dumps([{"subject": "the author", "prompt": "where was the author born ?",
                                                   "object": "city", "target": "sea"}]))
    code, text = run("edit", "-m", d, "--requests", tmp_path / "ar.json", "--key-metric", "paper", "-o",
                     tmp_path / "ar.safetensors")
    text = " ".join(text.split())
    assert code == 0 and "not a traced site (`timerome trace --positional` finds one" in text, text
    assert "moves likelihoods but seldom what the model says" in text, text
    # and in the JSON a script reads (stop 81: --json printed the memory and neither note)
    code, text = run("edit", "-m", d, "--requests", tmp_path / "ar.json", "--key-metric", "paper", "-o",
                     tmp_path / "ar2.safetensors", "--json")
    notes = json.loads(text)["notes"] if code == 0 else text
    assert len(notes) == 2 and "not a traced site" in notes[0] and "seldom what the model says" in notes[1], notes
    # ROME's trace of a model that does not know the fact: every effect about 0, and said (review 91: "ROME edits
    # here" marked layer 0 at 0.000 without a word); the embedded model's trace has no such note (below)
    (tmp_path / "ar_rows.json").write_text(json.dumps([{"subject": "the author", "question": "where was the author "
                                                        "born ?", "answer": "the author was born in the city ."}]))
    code, text = run("trace", "--positional", "-m", d, "--data", tmp_path / "ar_rows.json", "--n-samples", 1, "-o",
                     tmp_path / "pos", "--json")
    notes = json.loads(text)["notes"] if code == 0 else text
    assert len(notes) == 1 and "there is nothing to restore" in notes[0], notes
    # a weight edit's record: the cloze-state counts an AR model leaves unread are none (review 91: n_states 2)
    (tmp_path / "bg.txt").write_text("the author was born in the city .\nthe sea was in the city .\n")
    code, text = run("edit", "-m", d, "--method", "rome", "--requests", tmp_path / "ar.json", "--background",
                     tmp_path / "bg.txt", "-o", tmp_path / "rome", "--json")
    config = json.loads(text)["config"] if code == 0 else text
    assert config["n_states"] is None and config["key_states"] is None and config["grad_steps"] > 0, config
    record = json.loads((tmp_path / "rome" / "timerome-edit.json").read_text())
    assert record["config"]["n_states"] is None, record
    # the default --n-mc, which nobody gave, is named nowhere (review 91: every AR eval said "--n-mc 16 changes nothing")
    code, text = run("eval", "-m", d, "--requests", said, "--json")
    assert code == 0 and not any("--n-mc" in n for n in json.loads(text)["notes"]), text
    # a weight-edited AR model is saved as what it is: no mask token written, reloaded autoregressive (it came
    # back as a masked diffusion model, its EOS taken for the mask, and said gibberish)
    from timerome.cli.model import save_backbone

    save_backbone(timerome.load_backbone(d), tmp_path / "saved")
    assert "mask_token_id" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    again = timerome.load_backbone(tmp_path / "saved")
    assert again.causal and again.family.name == timerome.load_backbone(d).family.name
    # the API's generate on it: no block to divide gen_length by (gen_length 8 was refused for LLaDA's 128-token
    # block), and a remasking order, which it has no masks for, refused rather than ignored
    from timerome.engine.sampler import generate

    assert generate(again, "the author was born in", gen_length=8).shape[1] == len(again.encode_prompt(
        "the author was born in")) + 8
    with pytest.raises(timerome.TimeromeError, match="remasking 'random'.*autoregressive"):
        generate(again, "the author", gen_length=8, remasking="random")


def test_an_option_given_twice_is_found_and_a_repeatable_options_value_is_not():
    """click kept the last of two values without a word; a repeatable option's value that looks like an
    option (memory remove --subject -o) is a value, not a second -o."""
    import typer

    from timerome.cli.app import repeated_option

    cmd = typer.main.get_command(app)
    remove, ev = cmd.commands["memory"].commands["remove"], cmd.commands["eval"]
    assert repeated_option(remove, ["F", "-o", "a", "-o", "b"]) == "-o"
    assert repeated_option(remove, ["F", "-o", "out", "--subject", "-o"]) is None
    assert repeated_option(remove, ["F", "--subject", "-o", "-o", "out"]) is None
    assert repeated_option(remove, ["F", "-o", "a", "--", "-o"]) is None
    assert repeated_option(ev, ["--rouge", "--rouge"]) is None and repeated_option(ev, ["--rouge", "--no-rouge"]) == "--no-rouge"
    assert repeated_option(ev, ["--n-mc=2", "--n-mc", "3"]) == "--n-mc"


def test_an_empty_path_option_is_found_and_an_empty_text_option_is_not():
    """typer turned `--out ""` into Path("") == Path("."): a folder option then wrote into the current folder."""
    import typer

    from timerome.cli.app import empty_path_option

    cmd = typer.main.get_command(app)
    trace, merge, ev = cmd.commands["trace"], cmd.commands["memory"].commands["merge"], cmd.commands["eval"]
    assert empty_path_option(trace, ["--out", ""]) == "--out" and empty_path_option(trace, ["-o", " "]) == "-o"
    assert empty_path_option(trace, ["--out="]) == "--out" and empty_path_option(trace, ["--out", "."]) is None
    assert empty_path_option(trace, ["--data", "", "--out", "x"]) is None  # a text option: its own check says so
    assert empty_path_option(trace, ["--", "--out", ""]) is None  # after --, a value
    assert empty_path_option(merge, ["a", "b", "-o", ""]) == "-o"
    assert empty_path_option(ev, ["--bench", "mmlu", "--edit", "", "--no-rouge"]) == "--edit"


def test_eval_requests_notes_requests_the_memory_does_not_hold_or_holds_with_another_target():
    """eval --edit M --requests R said nothing when M held none of R, or held R's question with another target."""
    from types import SimpleNamespace as NS

    from timerome.cli.evaluate import held_requests_notes
    from timerome.data.requests import load_requests

    reqs = load_requests("counterfactual:forget10", limit=3)[0]
    f = reqs[0].fact
    same = NS(target="I don't know.", facts=[NS(prompt=r.fact.prompt, target=r.fact.target) for r in reqs])
    assert held_requests_notes(same, reqs, "m") == []
    one = NS(target="I don't know.", facts=[NS(prompt=f.prompt, target=None)])
    notes = held_requests_notes(one, reqs, "m")
    assert notes[0] == "m holds 1 facts; 1 of the 3 requests ask one of them, and the metrics count the others too"
    assert notes[1].startswith(f"1 requests ask a question m holds with another target ('{reqs[0].fact_id}')")
    assert held_requests_notes(NS(target="x", facts=["id-only"]), reqs, "m") == []  # facts known by id alone


def test_memory_remove_refuses_to_leave_fewer_facts_than_q(tmp_path):
    """It wrote a file that nothing could apply ("q=4 exceeds the number of facts (3)"), and no command
    changes q (helper 34's audit); its --json lists the ids it removed."""
    mem = tmp_path / "q4.safetensors"
    code, out = run("edit", "--q", 4, "--out", mem)
    assert code == 0, out
    code, out = run("memory", "show", mem, "--json")
    ids = json.loads(out[out.index("{"):])["facts"]
    ids = [f["fact_id"] for f in ids]
    code, out = run("memory", "remove", mem, *ids[:17], "-o", tmp_path / "q4_3.safetensors")
    assert code == 2 and "leaves 3 facts" in out and "q=4" in out, out
    assert not (tmp_path / "q4_3.safetensors").exists()
    code, out = run("memory", "remove", mem, *ids[:16], "-o", tmp_path / "q4_4.safetensors", "--json")
    assert code == 0, out
    got = json.loads(out[out.index("{"):])
    assert got["n_facts"] == 4 and got["removed"] == ids[:16]


def test_memory_merge_notes_one_relative_lambda_over_two_key_scales(tmp_path):
    """Two memories with the same relative lam but different keys solve with different lambdas: the second's
    facts join the first's solve, which merge now says (helper 34's audit)."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert run("edit", "--data", "embedded:forget01", "-o", a)[0] == 0
    assert run("edit", "--data", "embedded:forget05", "-o", b)[0] == 0
    code, out = run("memory", "merge", a, b, "-o", tmp_path / "ab.safetensors")
    assert code == 0 and "solves with lambda" in out and "join" in out, out


def test_the_cli_says_each_warning_once_even_when_a_library_resets_pythons_filters(capsys):
    """Python's once-per-place filter forgets what it said whenever the filters change (a library's
    `warnings.catch_warnings`), so one run could print the same warning twice; the CLI's printer keeps what
    it said. Another text, or another category, is still said."""
    import warnings

    from timerome.cli.app import OneLineWarnings

    saved = warnings.showwarning
    warnings.showwarning = OneLineWarnings()
    try:
        def say(text, category=UserWarning):
            warnings.warn(text, category, stacklevel=1)

        with warnings.catch_warnings():
            warnings.simplefilter("default")
            say("2 of 2 facts have subjects   with words")
            with warnings.catch_warnings():  # what a tokenizer's load does between two traces
                warnings.simplefilter("ignore", FutureWarning)
            say("2 of 2 facts have subjects with words")  # the same text (white space aside), the same place
            say("another text")
            say("another text", FutureWarning)
    finally:
        warnings.showwarning = saved
    err = capsys.readouterr().err
    assert err.count("facts have subjects with words") == 1 and err.count("another text") == 2, err
    assert "(FutureWarning)" in err


def test_a_ctrl_c_while_the_command_line_loads_is_one_line():
    """The `timerome` command's entry imports the CLI (torch: seconds) inside its own guard: a Ctrl-C
    there ends in one line and status 130. The interrupt is raised by an import hook on torch, so the
    test does not depend on when a signal lands; `import timerome` itself loads no torch."""
    import subprocess
    import sys

    code = ("import sys\n"
            "class Stop:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n"
            "import timerome, timerome.__main__\n"
            "assert 'torch' not in sys.modules and 'Backbone' in dir(timerome)\n"
            "sys.argv = ['timerome', '--help']\n"
            "timerome.__main__.main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted (Ctrl-C) while timerome was starting\n"
    assert done.stdout == ""


def test_generate_ends_an_answer_at_any_special_token_as_the_editing_metrics_do(tmp_path, monkeypatch):
    """Review 72: generate cut an answer at EOS only, and a budget of other special tokens (padding) decoded to
    nothing and was said to be "spaces and line breaks"; the editing metrics (sampler.continuations, until_special)
    end an answer at any special token. Now generate cuts where they do: an answer of padding ended at once, and what comes
    before a padding token is the answer."""
    import torch

    import timerome.engine.sampler as sampler
    from timerome.backbones.tiny import make_tiny_checkpoint

    d = make_tiny_checkpoint("timerome", tmp_path / "m", layers=2)
    tok = timerome.load_backbone(d).tokenizer
    pad, word = tok.convert_tokens_to_ids("<|pad|>"), tok.convert_tokens_to_ids("books")
    assert pad in tok.all_special_ids and pad != tok.eos_token_id
    written = {}

    def fake(bb, ids, **kw):  # the answer the test decides: `written["ids"]`, padded to the budget
        tail = written["ids"] + [pad] * (kw["gen_length"] - len(written["ids"]))
        return torch.cat([ids, torch.tensor([tail] * ids.shape[0])], 1)

    monkeypatch.setattr(sampler, "generate", fake)
    argv = ["generate", "-m", str(d), "--gen-length", "4", "who wrote the night", "--json"]
    written["ids"] = []
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0 and "nothing before the model's end of answer" in res.output, res.output
    assert "spaces and line breaks" not in res.output
    written["ids"] = [word, pad, word]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0 and json.loads(res.output[res.output.index("["):])[0]["answer"] == "books", res.output
