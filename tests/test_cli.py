"""The command line: each command runs on the embedded model, bad input is one line and exit 2."""

import json

from typer.testing import CliRunner

from timerome.cli import app

runner = CliRunner()


def run(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.output


def test_info_lists_hook_points():
    code, out = run("info")
    assert code == 0 and "resid" in out and "blocks.0" in out


def test_trace_edit_generate_chain(tmp_path):
    code, out = run("trace", "--out", tmp_path / "t", "--n-facts", 2, "--n-samples", 1, "--steps", 4)
    assert code == 0, out
    sel = json.loads((tmp_path / "t" / "selection.json").read_text())
    assert (tmp_path / "t" / "heatmaps.png").stat().st_size > 1000
    assert sel["best"]["module"] in ("resid", "attn", "mlp") and len(sel["per_fact"]) == 2

    mem = tmp_path / "forget.safetensors"
    code, out = run("edit", "--trace", tmp_path / "t" / "trace.safetensors", "--out", mem)
    assert code == 0 and mem.exists(), out
    assert f"layer {sel['best']['layer']} {sel['best']['module']}" in out

    code, out = run("generate", "--edit", mem, "Where was Isgor Quielson born ?")
    assert code == 0 and "answer with edit" in out, out


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (("edit", "--data", "no-such-file.json"),
                 ("trace", "--data", "embedded:forget42"),
                 ("info", "--family", "gpt2"),
                 ("experiment", "nonsense", "--out", tmp_path),
                 ("demo", "--seeds", "a,b")):
        code, out = run(*args)
        assert code == 2 and out.startswith("error:") and "Traceback" not in out, (args, out)
    (tmp_path / "bad.safetensors").write_bytes(b"not a memory")
    code, out = run("generate", "--edit", tmp_path / "bad.safetensors", "hello")
    assert code == 2 and "error:" in out, out
