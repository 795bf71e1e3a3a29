"""A catalogue of bad inputs, walked through the command line as a user (and a hostile one) would.

Each must end with exit code 2 and exactly one line, "error: ...", naming what is wrong; never a
traceback; and no file the user gave may change (bytes and modification time).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from timerome.backbones.loading import DEFAULT_MODEL_DIR
from timerome.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def rewrite_header(src: Path, dst: Path, **changes) -> Path:
    """A copy of an edit memory with header fields changed by hand (the checksum covers tensors only)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = meta
        for k in parents:
            target = target[k]
        target[last] = value
    save_file(tensors, str(dst), metadata={"timerome": json.dumps(meta)})
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    f = {}
    f["badcfg"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "badcfg")
    (f["badcfg"] / "config.json").write_text("{not json")
    f["trunc"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "trunc")
    (f["trunc"] / "model.safetensors").write_bytes((DEFAULT_MODEL_DIR / "model.safetensors").read_bytes()[:5000])
    f["noshard"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "noshard")
    (f["noshard"] / "model.safetensors").unlink()
    (f["noshard"] / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model-00001.safetensors"}}')
    f["tofu"] = d / "tofu"
    f["tofu"].mkdir()
    (f["tofu"] / "forget01.json").write_bytes(b'[{"question": "Who is \xff\xfe?", "answer": "x"}]')
    f["rows"] = d / "rows.json"
    f["rows"].write_bytes(b'[{"question": "Where was \xe9 born ?", "answer": "x ."}]')
    f["numq"] = d / "numq.jsonl"
    f["numq"].write_text('{"question": 5, "answer": "x"}\n')
    f["bg"] = d / "bg.txt"
    f["bg"].write_bytes(b"Where was \xff born ?\n")
    f["empty"] = d / "empty.txt"
    f["empty"].write_text("")
    f["outdir"] = d / "outdir"
    f["outdir"].mkdir()
    for name, body in (("nmc_float", {"n_mc": 2.5}), ("nmc_word", {"n_mc": "lots"}), ("unknown", {"nope": 1}),
                       ("methods_str", {"methods": "timerome"}), ("ref_opt", {"reference": {"epoch": 3}})):
        f[name] = d / f"{name}.json"
        f[name].write_text(json.dumps(body))
    f["cfg_array"] = d / "array.json"
    f["cfg_array"].write_text("[1, 2]")
    f["cfg_bad"] = d / "cfgbad.json"
    f["cfg_bad"].write_text("{n_mc: 4")
    f["junk"] = d / "junk.safetensors"
    f["junk"].write_bytes(b"not a memory")
    mem = d / "good.safetensors"
    res = runner.invoke(app, ["edit", "--out", str(mem)])
    assert res.exit_code == 0, res.output
    f["mem"] = mem
    f["mem_l0"] = d / "l0.safetensors"
    assert runner.invoke(app, ["edit", "--layer", "0", "--out", str(f["mem_l0"])]).exit_code == 0
    f["alpha_huge"] = rewrite_header(mem, d / "alpha.safetensors", hyper__alpha=1e30)
    f["layer_neg"] = rewrite_header(mem, d / "layer.safetensors", coordinate__layer=-1)
    f["no_hyper"] = rewrite_header(mem, d / "nohyper.safetensors", hyper={})
    # a trace file whose settings say it was made on another model (a small trace, then its JSON edited)
    res = runner.invoke(app, ["trace", "--n-facts", "1", "--steps", "2", "--n-samples", "1", "-o", str(d / "tr")])
    assert res.exit_code == 0, res.output
    meta = json.loads((d / "tr" / "trace.json").read_text())
    meta["settings"]["fingerprint"] = "0123456789abcdef"
    (d / "tr" / "trace.json").write_text(json.dumps(meta))
    f["trace_other"] = d / "tr" / "trace.safetensors"
    shutil.copytree(DEFAULT_MODEL_DIR, d / "own")  # a model a user would train in place
    return f


def catalogue(f, tmp):
    """(what, argv, text the message must contain)."""
    out = str(tmp / "out.safetensors")
    return [
        ("config.json not JSON", ["info", "--model", f["badcfg"]], "config.json"),
        ("truncated weights", ["info", "--model", f["trunc"]], "model.safetensors"),
        ("missing shard", ["info", "--model", f["noshard"]], "model-00001.safetensors"),
        ("non-UTF-8 TOFU split", ["trace", "--data", "tofu:forget01", "--tofu-dir", f["tofu"], "-o", tmp / "t"],
         "forget01.json is not UTF-8"),
        ("non-UTF-8 rows file", ["trace", "--data", f["rows"], "-o", tmp / "t"], "rows.json is not UTF-8"),
        ("a row whose question is a number", ["trace", "--data", f["numq"], "-o", tmp / "t"], "row 0"),
        ("non-UTF-8 background", ["edit", "--background", f["bg"], "-o", out], "bg.txt is not UTF-8"),
        ("non-UTF-8 prompt (argv bytes)", ["generate", "Where was \udcff born ?"], "prompt 1 is not UTF-8"),
        ("edit -o a directory", ["edit", "-o", f["outdir"]], "is a directory"),
        ("n_mc 2.5", ["experiment", "canonical", "-c", f["nmc_float"], "-o", tmp / "e"], "n_mc"),
        ("n_mc lots", ["experiment", "canonical", "-c", f["nmc_word"], "-o", tmp / "e"], "n_mc"),
        ("unknown setting", ["experiment", "canonical", "-c", f["unknown"], "-o", tmp / "e"], "nope"),
        ("methods as a string", ["experiment", "canonical", "-c", f["methods_str"], "-o", tmp / "e"], "methods"),
        ("reference option typo", ["experiment", "canonical", "-c", f["ref_opt"], "-o", tmp / "e"], "reference"),
        ("config not an object", ["experiment", "canonical", "-c", f["cfg_array"], "-o", tmp / "e"], "JSON object"),
        ("config not JSON", ["experiment", "canonical", "-c", f["cfg_bad"], "-o", tmp / "e"], "not valid JSON"),
        ("config missing", ["experiment", "canonical", "-c", tmp / "none.json", "-o", tmp / "e"], "does not exist"),
        ("train onto its own model", ["train", "--model", f["badcfg"].parent / "own", "--out",
                                      f["badcfg"].parent / "own", "--epochs", "1"], "would overwrite the model"),
        ("a trace of another model", ["edit", "--trace", f["trace_other"], "-o", out], "traced on another model"),
        ("--quick where there is none", ["experiment", "canonical", "--quick", "-o", tmp / "e"], "no --quick subset"),
        ("inline config not JSON", ["experiment", "canonical", "-c", '{"n_mc": 2,}', "-o", tmp / "e"], "not valid JSON"),
        ("inline config not an object", ["experiment", "canonical", "-c", "[1, 2]", "-o", tmp / "e"],
         "must hold a JSON object"),
        ("negative lambda", ["edit", "--lam", "-5", "-o", out], "-5"),
        ("hand-edited layer -1", ["generate", "--edit", f["layer_neg"], "Where was Isgor Quielson born ?"], "layer -1"),
        ("hand-edited alpha 1e30", ["generate", "--edit", f["alpha_huge"], "Where was Isgor Quielson born ?"],
         "alpha"),
        ("header without hyper-parameters", ["generate", "--edit", f["no_hyper"], "Where was Isgor Quielson born ?"],
         "metadata"),
        ("not a memory file", ["generate", "--edit", f["junk"], "hello"], "junk.safetensors"),
        ("q over the facts", ["edit", "--q", "500", "-o", out], "--q 500"),
        ("empty target", ["edit", "--target", " ", "-o", out], "--target"),
        ("target outside the vocabulary", ["edit", "--target", "Zorblax", "-o", out], "Zorblax"),
        ("unknown data file", ["edit", "--data", "no-such-file.json", "-o", out], "no-such-file.json"),
        ("unknown split", ["trace", "--data", "embedded:forget42", "-o", tmp / "t"], "forget42"),
        ("background split unknown", ["edit", "--background", "tofu:nosplit", "-o", out], "nosplit"),
        ("unknown family", ["info", "--family", "gpt2"], "gpt2"),
        ("unknown device", ["info", "--device", "gpu0"], "gpu0"),
        ("unknown dtype", ["info", "--dtype", "float8"], "float8"),
        ("unknown experiment", ["experiment", "nonsense", "-o", tmp / "e"], "nonsense"),
        ("bad seeds", ["demo", "--seeds", "a,b"], "--seeds"),
        ("no seed", ["experiment", "canonical", "--seeds", "", "-o", tmp / "e"], "seed"),
        ("data folder missing", ["experiment", "canonical", "--data", tmp / "nowhere", "-o", tmp / "e"], "--data"),
        ("layer out of range", ["edit", "--layer", "99", "-o", out], "layer"),
        ("unknown module", ["edit", "--module", "ffn", "-o", out], "ffn"),
        ("zero facts", ["trace", "--n-facts", "0", "-o", tmp / "t"], "--n-facts"),
        ("zero threads", ["--threads", "0", "methods"], "at least 1"),
        ("a value of the wrong type", ["trace", "--steps", "x"], "--steps"),
        ("an unknown option", ["trace", "--bogus"], "--bogus"),
        ("an extra argument", ["demo", "--seeds", "-o", tmp / "e"], "extra argument"),
        ("an unknown command", ["bogus"], "bogus"),
        ("memory show of a non-memory", ["memory", "show", f["cfg_array"]], "array.json"),
        ("memory remove of an unknown id", ["memory", "remove", f["mem"], "nosuchid", "-o", out], "nosuchid"),
        ("memory remove of everything", ["memory", "remove", f["mem"], "--subject", "Isgor Quielson", "-o", out],
         "every fact"),
        ("memory add of facts already in it", ["memory", "add", f["mem"], "-o", out], "nothing to add"),
        ("memory merge across coordinates", ["memory", "merge", f["mem"], f["mem_l0"], "-o", out], "coordinate"),
        ("eval --n-mc 0", ["eval", "--n-mc", "0"], "--n-mc"),
        ("eval of an unknown split", ["eval", "--splits", "bogus"], "--splits"),
        ("eval of a model with a broken config", ["eval", "--model", f["badcfg"]], "config.json"),
        ("new-model from no text", ["new-model", f["empty"], "-o", tmp / "nm"], "no text"),
        ("new-model from a non-UTF-8 rows file", ["new-model", f["rows"], "-o", tmp / "nm"], "not UTF-8"),
        ("new-model size", ["new-model", "embedded:forget01", "--size", "huge", "-o", tmp / "nm"], "huge"),
        ("new-model odd heads", ["new-model", "embedded:forget01", "--d-model", "30", "--heads", "4", "-o",
                                 tmp / "nm"], "heads"),
        ("train zero epochs", ["train", "--epochs", "0", "--out", tmp / "tr"], "--epochs"),
        ("train on a missing file", ["train", "--data", "nowhere.json", "--out", tmp / "tr"], "nowhere.json"),
    ]


def _snapshot(paths):
    out = {}
    for p in paths:
        p = Path(p)
        for q in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []):
            if q.is_file():
                out[str(q)] = (q.read_bytes(), q.stat().st_mtime_ns)
    return out


def test_every_bad_input_is_one_line_and_exit_2(files, tmp_path):
    before = _snapshot(files.values())
    failures = []
    for what, argv, needle in catalogue(files, tmp_path):
        res = runner.invoke(app, [str(a) for a in argv])
        lines = [line for line in res.output.splitlines() if line.strip()]
        ok = (res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:")
              and "Traceback" not in res.output and needle in lines[0])
        if not ok:
            failures.append(f"{what}: exit {res.exit_code}, output {res.output[-400:]!r}")
    assert not failures, "\n".join(failures)
    assert _snapshot(files.values()) == before  # no file the user gave was touched


def test_environment_and_argv_bytes_through_a_real_process(tmp_path):
    """What CliRunner cannot show: real argv bytes, and an environment variable, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TIMEROME_THREADS="lots")
    run = lambda args, **kw: subprocess.run([sys.executable, "-m", "timerome", *args], capture_output=True,  # noqa: E731
                                            env=kw.get("env", env), cwd=tmp_path, timeout=120)
    res = run(["methods"])
    assert res.returncode == 2 and res.stdout == b"", res
    assert res.stderr.decode().strip().splitlines() == ["error: $TIMEROME_THREADS must be a whole number of threads, "
                                                         "got 'lots'"]
    env.pop("TIMEROME_THREADS")
    res = run([os.fsencode("generate"), b"Where was \xff born ?"], env=env)
    err = res.stderr.decode()
    assert res.returncode == 2 and len(err.strip().splitlines()) == 1 and "byte 0xff" in err, res


def test_a_bug_is_one_line_with_the_way_to_see_it(monkeypatch):
    """Anything that is not an input problem is a bug: one line naming it (exit 1), traceback on request."""
    import timerome.methods

    def broken(*a, **k):
        raise ZeroDivisionError("deliberately broken")

    monkeypatch.setattr(timerome.methods, "available", broken)
    res = runner.invoke(app, ["methods"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.count("\n") == 1 and "internal error ZeroDivisionError" in res.output
    assert "TIMEROME_DEBUG=1" in res.output
    monkeypatch.setenv("TIMEROME_DEBUG", "1")
    res = runner.invoke(app, ["methods"])
    assert isinstance(res.exception, ZeroDivisionError)


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch):
    import timerome.methods

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(timerome.methods, "available", interrupted)
    res = runner.invoke(app, ["methods"])
    assert res.exit_code == 130 and res.output.startswith("interrupted") and res.output.count("\n") == 1, res.output
