"""The JSON timerome writes is standard JSON (RFC 8259: no NaN, no Infinity), read by strict parsers;
where a reader needs the non-finite numbers back (an experiment's cell cache), their places are kept."""

import json
import math

import pytest
import torch

from timerome.common.cache import json_text, plain, restore_nonfinite, write_json
from timerome.errors import TimeromeError


def strict(text: str):
    """json.loads as a strict parser reads (JavaScript's JSON.parse): NaN / Infinity refused."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path):
    obj = {"a": float("nan"), "b": [1.5, float("inf"), -float("inf")], "c": torch.tensor([0.5, float("nan")]),
           "d": (1, "x", None), "e": {"deep": float("nan")}}
    got = strict(write_json(tmp_path / "x.json", obj).read_text())
    assert got == {"a": None, "b": [1.5, None, None], "c": [0.5, None], "d": [1, "x", None], "e": {"deep": None}}
    assert strict(json_text({"k": 1})) == {"k": 1}


def test_the_marks_of_non_finite_numbers_put_them_back_and_nothing_else():
    obj = {"metrics": {"FQ": float("nan"), "x": 1.0, "inf": [2.0, float("-inf")]}, "config": {"step": None},
           "t": torch.tensor([[1.0, float("nan")]]), "pair": (float("inf"), 3)}
    marks = []
    text = json_text(obj, marks)
    assert plain(obj) == json.loads(text)  # the marks change nothing written
    assert sorted(map(str, marks)) == sorted(map(str, [["metrics", "FQ", "nan"], ["metrics", "inf", 1, "-inf"],
                                                       ["t", 0, 1, "nan"], ["pair", 0, "inf"]]))
    back = restore_nonfinite(json.loads(text), json.loads(json.dumps(marks)))
    assert math.isnan(back["t"][0][1]) and back["pair"] == [math.inf, 3]
    assert math.isnan(back["metrics"]["FQ"]) and back["metrics"]["inf"] == [2.0, -math.inf]
    assert back["config"]["step"] is None and back["metrics"]["x"] == 1.0  # a real null stays null
    with pytest.raises(ValueError, match="does not point at a null"):
        restore_nonfinite({"a": 1.0}, [["a", "nan"]])


def test_a_cell_with_a_nan_metric_reads_back_as_it_was_computed(tmp_path):
    """The runner's cell files are standard JSON now; a resumed run must still see NaN (not None) where
    a metric was undefined, or its tables would differ from the first run's."""
    from timerome import load_backbone
    from timerome.experiments.runner import Cell, Context, Runner, measurement

    @measurement("nan_test_cell")
    def nan_cell(cell, ctx, rows, task):
        return {"metrics": {"x": float("nan"), "y": 2.0}, "info": {"note": None}}

    ctx = Context(load_backbone(), progress=False)
    cells = [Cell("nan_test_cell", seed=0, data=dict(splits=["forget"]))]
    runner = Runner(tmp_path, progress=False)
    first = runner.run(cells, ctx)
    saved = runner.path(cells[0], ctx).read_text()
    assert strict(saved)["result"]["metrics"]["x"] is None and "NaN" not in saved
    again = runner.run(cells, ctx)  # read from the cell file
    assert math.isnan(again[0]["metrics"]["x"]) and again[0]["metrics"]["y"] == 2.0
    assert again[0]["info"]["note"] is None and math.isnan(first[0]["metrics"]["x"])


def test_the_positional_traces_selection_is_strict_json(tmp_path):
    """Its mean_by_category held bare NaN (a category no fact has), which strict parsers refuse."""
    from typer.testing import CliRunner

    from timerome.cli import app

    res = CliRunner().invoke(app, ["trace", "--positional", "-o", str(tmp_path / "p"), "--n-facts", "1",
                                   "--n-samples", "1"])
    assert res.exit_code == 0, res.output
    sel = strict((tmp_path / "p" / "selection.json").read_text())
    values = [v for m in sel["mean_by_category"].values() for row in m.values() for v in row]
    assert None in values  # the undefined categories, as null


def test_an_unwritable_cache_does_not_stop_a_model_loading(tmp_path, monkeypatch):
    """The weights' fingerprint is cached; a cache folder that cannot be written used to turn into an
    error that stopped the load (write_atomic's TimeromeError is not an OSError)."""
    from timerome import load_backbone

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TIMEROME_CACHE", str(blocked))
    assert len(load_backbone().fingerprint()) == 16


def test_the_radar_reads_a_null_as_no_number(tmp_path):
    from timerome.experiments.radar import read_axes

    (tmp_path / "robustness").mkdir()
    (tmp_path / "robustness" / "robustness.json").write_text(json_text(
        {"radar": {"robustness": dict(value=float("nan"), comparator=0.5, higher_is_better=True, text="t")}}))
    (tmp_path / "ablations").mkdir()
    (tmp_path / "ablations" / "ablations.json").write_text(json_text({"summary": {
        "no_edit": {"ForgetLP": {"mean": -1.0}},
        "resid, all steps, traced layer (TimeROME)": {"ForgetLP": {"mean": float("nan")}},
        "other": {"ForgetLP": {"mean": -2.0}}}}))
    found, missing = read_axes(tmp_path)
    assert "robustness" not in found and "no number" in missing["robustness"]
    assert "ablations" not in found and "ablations" in missing


def test_a_build_record_with_a_diverged_loss_is_strict_json(tmp_path, monkeypatch):
    """build_info.json was json.dumps' own text: a NaN loss (a diverged training) came out as bare NaN."""
    import timerome.training.default_model as dm

    monkeypatch.setattr(dm, "train", lambda *a, **k: {"loss": [float("nan")]})  # no training: a NaN log
    dm.build_default(tmp_path / "m", epochs=1, stage2_epochs=0, show_progress=False)
    text = (tmp_path / "m" / "build_info.json").read_text()
    assert strict(text)["stages"][0]["final_loss_last50"] is None and "NaN" not in text
    assert dm.build_record(tmp_path / "m")["sha256"] == dm.weights_sha256(tmp_path / "m")


def test_eval_json_writes_its_nan_columns_as_null():
    """`timerome eval --json` without --reference: Forget Quality and the absent splits' columns are NaN."""
    from typer.testing import CliRunner

    from timerome.cli import app

    res = CliRunner().invoke(app, ["eval", "--splits", "forget", "--n-mc", "1", "--no-rouge", "--json"])
    assert res.exit_code == 0, res.output
    got = strict(res.stdout)
    assert got["metrics"]["ForgetQuality"] is None and "reference" in got["notes"]["ForgetQuality"]
    assert isinstance(got["metrics"]["ForgetLP"], float)


def test_a_write_through_a_symbolic_link_changes_its_target_and_keeps_the_link(tmp_path):
    """An in-place change (memory add/remove/merge -o the memory itself) through a link: the atomic
    rename replaced the link with a file and left the target as it was."""
    import torch
    from safetensors.torch import load_file

    from timerome.common.cache import save_tensors, write_atomic

    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / "m.json", tmp_path / "m.json"
    target.write_text("old")
    link.symlink_to(target)
    assert write_atomic(link, "new") == target
    assert link.is_symlink() and target.read_text() == "new"
    t_target, t_link = tmp_path / "real" / "m.safetensors", tmp_path / "m.safetensors"
    save_tensors(t_target, {"x": torch.zeros(2)})
    t_link.symlink_to(t_target)
    save_tensors(t_link, {"x": torch.ones(2)})
    assert t_link.is_symlink() and load_file(str(t_target))["x"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["m.json", "m.safetensors"]  # no temporary left


def test_a_pair_written_through_a_link_stays_together_and_a_memory_locks_its_target(tmp_path):
    """A trace's tensors followed a link while its JSON replaced the file beside the link, so the target's
    pair no longer matched; read back through the link, its JSON was looked for beside the link, not its
    target; two memory changes through a link and through its target took two locks."""
    import torch

    from timerome.memory.memory_file import lock_path
    from timerome.tracing.result import TraceFile

    (tmp_path / "real").mkdir()
    target, link = tmp_path / "real" / "t.safetensors", tmp_path / "t.safetensors"
    TraceFile.write(target, {"x": torch.zeros(1)}, {"n": 1})
    link.symlink_to(target)
    assert TraceFile.write(link, {"x": torch.ones(1)}, {"n": 2}) == target
    written = json.loads((tmp_path / "real" / "t.json").read_text())
    assert written["n"] == 2 and written["pair"] == TraceFile.read(link, "pair", lambda t, m: m["pair"])
    assert not (tmp_path / "t.json").exists()
    assert lock_path(link) == lock_path(target)


def test_a_byte_order_mark_is_read_as_the_encoding_it_marks(tmp_path):
    """A file a Windows editor saved (UTF-8 with a byte-order mark) reads as its text: a JSON rows file
    parses (json refuses the mark), a text file's first line has no stray character."""
    from timerome.common.files import read_json, read_text
    from timerome.data.rows import load_rows

    rows = tmp_path / "rows.json"
    rows.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"question": "Q ?", "answer": "A ."}]).encode())
    assert load_rows(str(rows)) == [{"question": "Q ?", "answer": "A ."}]
    assert read_json(rows, "rows") == [{"question": "Q ?", "answer": "A ."}]
    text = tmp_path / "t.txt"
    text.write_bytes("\ufeffHello\n".encode("utf-8"))
    assert read_text(text) == "Hello\n"


def test_json_lines_end_a_line_at_newline_alone(tmp_path):
    """JSON Lines as json.dumps(ensure_ascii=False) writes them: a U+2028, U+0085 or form feed inside a string
    is text, not a line break (str.splitlines broke there: 'line 1 is not JSON'); CRLF endings read too."""
    from timerome.common.files import read_json_documents
    from timerome.data.requests import load_requests
    from timerome.data.tofu import read_rows

    rows = [{"question": "Where was Ana born ?", "answer": "Ana was born\u2028in Lima\u0085 (\x0c) ."},
            {"question": "Where was Bo born ?", "answer": "Oslo ."}]
    f = tmp_path / "rows.jsonl"
    f.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8")
    assert read_json_documents(f, "rows") == rows and read_rows(f) == rows
    req = tmp_path / "req.jsonl"
    req.write_text("\n".join(json.dumps({"prompt": f"Where was {s} born ?", "subject": s, "object": "Lima",
                                         "target": "Rome\u2028x"},
                                        ensure_ascii=False) for s in ("Ana", "Bo")), encoding="utf-8")
    got, _ = load_requests(str(req))
    assert [r.fact.target for r in got] == ["Rome\u2028x"] * 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "b"}\n{"question": \n')
    with pytest.raises(TimeromeError, match=r"bad.jsonl line 2 is not JSON \(Expecting value; column 14\)"):
        read_json_documents(bad, "rows")
    pretty = tmp_path / "pretty.json"  # one indented document with a trailing comma: its own line, not line 1
    pretty.write_text('[\n {"question": "a",\n  "answer": "b"},\n]\n')
    with pytest.raises(TimeromeError, match=r"pretty.json line 4 is not JSON \(Expecting value; column 1\)"):
        read_json_documents(pretty, "rows")
