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

from timerome.backbones import load_backbone
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


def rewrite_memory(src: Path, dst: Path, *, tensors=None, header=None) -> Path:
    """A copy of a memory file with tensors changed (tensors(dict) -> dict) and the checksum written anew,
    as a careful hand would; or its whole header replaced by `header` (any JSON value)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from timerome.common.cache import tensors_digest

    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
        ts = {k: f.get_tensor(k) for k in f.keys()}
    if tensors is not None:
        ts = tensors(ts)
        meta["sha256"] = tensors_digest(ts)
    text = json.dumps(header) if header is not None else json.dumps(meta)
    save_file(ts, str(dst), metadata={"timerome": text})
    return dst


def model_copy(dst: Path, config=None, weights=None) -> Path:
    """A copy of the embedded model with config.json entries set (config dict) or weights changed
    (weights(state) -> state)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(DEFAULT_MODEL_DIR, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}) if isinstance(config, dict) else config)
    if weights is not None:
        save_file(weights(load_file(str(dst / "model.safetensors"))), str(dst / "model.safetensors"))
    return dst


def trace_copy(src: Path, dst: Path, *, tensors=None, meta=None, name: str = "trace") -> Path:
    """A copy of a trace (safetensors + JSON) with tensors (dict -> dict) or its JSON (dict -> value) changed."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    t = load_file(str(src / f"{name}.safetensors"))
    save_file(tensors(t) if tensors else t, str(dst / f"{name}.safetensors"))
    m = json.loads((src / f"{name}.json").read_text())
    (dst / f"{name}.json").write_text(json.dumps(meta(m) if meta else m))
    return dst / f"{name}.safetensors"


def _set(ts: dict, name: str, value) -> dict:
    return {**ts, name: value(ts[name])}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    f = {}
    f["badcfg"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "badcfg")
    (f["badcfg"] / "config.json").write_text("{not json")
    f["badtok"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "badtok")  # its tokenizer's config half written
    (f["badtok"] / "tokenizer_config.json").write_text('{"model_max_length": 1')
    f["latintok"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "latintok")  # and in another encoding
    cfg = json.loads((f["latintok"] / "tokenizer_config.json").read_text(encoding="utf-8"))
    (f["latintok"] / "tokenizer_config.json").write_bytes(json.dumps({**cfg, "note": "café"}, ensure_ascii=False)
                                                          .encode("latin-1"))
    f["trunc"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "trunc")
    (f["trunc"] / "model.safetensors").write_bytes((DEFAULT_MODEL_DIR / "model.safetensors").read_bytes()[:5000])
    f["overflow"] = shutil.copytree(DEFAULT_MODEL_DIR, d / "overflow")  # finite weights, NaN attention on a prompt
    from safetensors.torch import load_file, save_file

    weights = load_file(str(DEFAULT_MODEL_DIR / "model.safetensors"))
    for name in ("q_proj", "k_proj"):
        weights[f"model.transformer.blocks.1.{name}.weight"] *= 1e30
    save_file(weights, str(f["overflow"] / "model.safetensors"), metadata={"format": "pt"})
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
    f["empty_rows"] = d / "empty.jsonl"
    f["empty_rows"].write_text("")
    f["twice_rows"] = d / "twice.jsonl"  # line 2 gives "answer" twice: json would keep the second alone
    f["twice_rows"].write_text('{"question": "Where was Ana born ?", "answer": "Lima ."}\n'
                               '{"question": "Where was Bo born ?", "answer": "Oslo .", "answer": "Rome ."}\n')
    f["two_names"] = d / "two_names.jsonl"
    f["two_names"].write_text(json.dumps({"question": "Where was Isgor Quielson born ?", "answer": "Pellmoor .",
                                          "subject": "Isgor Quielson", "author": "Dusmi Torzanard"}) + "\n")
    f["twice_req"] = d / "twice_req.json"
    f["twice_req"].write_text('[{"prompt": "Where was Ana born ?", "subject": "Ana", "target": "Oslo", '
                              '"target": "Rome"}]')
    f["nan_req"] = d / "nan_req.jsonl"
    f["nan_req"].write_text('{"prompt": "Where was Ana born ?", "subject": "Ana", "target": "Oslo", "weight": NaN}\n')
    f["tofu_empty"] = d / "tofu_empty"  # an interrupted copy: the split's file is there, with nothing in it
    f["tofu_empty"].mkdir()
    (f["tofu_empty"] / "forget01.json").write_text("")
    f["muse_books"] = d / "muse" / "books"  # the Books corpus folder, to be passed where News is asked for
    for part in ("knowmem", "verbmem", "privleak"):
        (f["muse_books"] / part).mkdir(parents=True)
    f["wmdp_mixed"] = d / "bench_mixed"  # a benchmark folder whose WMDP is the mixed Bio+Cyber files only
    (f["wmdp_mixed"] / "wmdp").mkdir(parents=True)
    (f["wmdp_mixed"] / "wmdp" / "split_0.jsonl").write_text(
        json.dumps({"question": "Which port does SSH use?", "choices": ["21", "22", "80", "443"], "answer": 1}) + "\n")
    f["rwku_not"] = d / "rwku_not"  # a folder of JSON folders none of which is an RWKU target
    (f["rwku_not"] / "notes").mkdir(parents=True)
    (f["rwku_not"] / "notes" / "x.json").write_text("[]")
    f["rwku_one"] = d / "bench_rwku"  # a benchmark folder with one RWKU target (one probe)
    (f["rwku_one"] / "rwku" / "1_Stephen_King").mkdir(parents=True)
    (f["rwku_one"] / "rwku" / "1_Stephen_King" / "forget_level1.json").write_text(
        json.dumps([{"query": "Who wrote Carrie?", "answer": "Stephen King"}]))
    f["interrupted"] = d / "interrupted"  # a train --out whose earlier run was interrupted
    (f["interrupted"] / "train-state").mkdir(parents=True)
    (f["interrupted"] / "train-state" / "state.safetensors").write_text("{}")
    f["outdir"] = d / "outdir"
    f["outdir"].mkdir()
    f["fifo"] = d / "fifo.safetensors"  # a named pipe: nothing ever writes to it, so a read would block
    os.mkfifo(f["fifo"])
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
    f["alpha_neg"] = rewrite_header(mem, d / "alpha_neg.safetensors", hyper__alpha=-1.0)
    f["layer_neg"] = rewrite_header(mem, d / "layer.safetensors", coordinate__layer=-1)
    f["q_over"] = rewrite_header(mem, d / "q.safetensors", hyper__q=500)  # TopQ over more facts than it holds
    f["no_hyper"] = rewrite_header(mem, d / "nohyper.safetensors", hyper={})
    f["mem_step"] = rewrite_header(mem, d / "step.safetensors", coordinate__step=3)
    born = dict(subject="Isgor Quielson", prompt="Where was Isgor Quielson born ?", object="Pellmoor")
    f["req_two_targets"] = d / "two_targets.json"
    f["req_two_targets"].write_text(json.dumps([dict(born, target="I don't know."), dict(born, target="Nowhere.")]))
    f["req_oov"] = d / "oov.json"  # a target the embedded word vocabulary cannot say
    f["req_oov"].write_text(json.dumps([dict(born, target="Zyxwquux Plenthorpia.")]))
    f["req_one"] = d / "one.json"
    f["req_one"].write_text(json.dumps([dict(born, target="Nowhere.")]))
    f["req_other"] = d / "other.json"  # a subject that is none of the embedded corpus's
    f["req_other"].write_text(json.dumps([dict(subject="Pellmoor", prompt="Where is Pellmoor ?", object="Kalvor",
                                               target="Nowhere.")]))
    from timerome.backbones.tiny import make_tiny_checkpoint

    f["tiny"] = make_tiny_checkpoint("timerome", d / "tiny")  # a model other than the embedded one
    f["tiny_ar"] = make_tiny_checkpoint("llama", d / "tiny_ar")  # an autoregressive one
    from timerome import Coordinate, EditMemory  # a memory of one step (token 1) on it

    f["mem_ar_step"] = EditMemory(load_backbone(f["tiny_ar"]), Coordinate(0, "resid"), step=1, key_metric="paper").add(
        [dict(subject="the author", prompt="where was the author born ?", object="city", target="sea")]).save(
        d / "ar_step.safetensors")  # words of the tiny model's vocabulary
    # a trace file whose settings say it was made on another model (a small trace, then its JSON edited)
    res = runner.invoke(app, ["trace", "--n-facts", "1", "--steps", "2", "--n-samples", "1", "-o", str(d / "tr")])
    assert res.exit_code == 0, res.output
    meta = json.loads((d / "tr" / "trace.json").read_text())
    meta["settings"]["fingerprint"] = "0123456789abcdef"
    (d / "tr" / "trace.json").write_text(json.dumps(meta))
    f["trace_other"] = d / "tr" / "trace.safetensors"
    shutil.copytree(DEFAULT_MODEL_DIR, d / "own")  # a model a user would train in place
    # round 2 (issue 23): numbers, sizes and files that used to be silently wrong, exit 1 or unbounded
    import torch

    for name, body in (("cfg_nan", '{"n_mc": NaN}'), ("cfg_bigint", '{"n_retain": 1000000000000000000000000000000}'),
                       ("cfg_nmc_huge", '{"n_mc": 1000000000000000000}')):
        f[name] = d / f"{name}.json"
        f[name].write_text(body)
    for name, cfg in (("eps_nan", '{"d_model": 128, "n_heads": 4, "n_layers": 4, "rms_norm_eps": NaN}'),
                      ("layers_str", {"n_layers": "4"}), ("heads_zero", {"n_heads": 0}),
                      ("layers_huge", {"n_layers": 1000000000}), ("width_odd", {"d_model": 130}),
                      ("cfg_list", "[1, 2]")):
        f[name] = model_copy(d / name, config=cfg)
    nan_at = lambda w: w.index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(float("nan")))  # noqa: E731
    f["w_nan"] = model_copy(d / "w_nan", weights=lambda s: _set(s, "model.transformer.blocks.1.ff_out.weight", nan_at))
    f["w_int"] = model_copy(d / "w_int", weights=lambda s: _set(s, "model.transformer.blocks.0.ff_out.weight",
                                                                  lambda w: w.to(torch.int32)))
    mem, cb = f["mem"], d / "cb.safetensors"
    f["cb"] = cb
    f["blank_author"] = d / "blank_author.json"
    f["blank_author"].write_text(json.dumps([{"question": "Where was Isgor Quielson born ?", "answer": "In Pellmoor .",
                                              "author": ""}]))
    assert runner.invoke(app, ["edit", "--method", "codebook", "--out", str(cb)]).exit_code == 0
    for name, fn in (("mem_f16", lambda t: _set(t, "U", lambda x: x.half())),
                     ("mem_i32", lambda t: _set(t, "G", lambda x: x.to(torch.int32))),
                     ("mem_i64", lambda t: _set(t, "D", lambda x: x.to(torch.int64))),
                     ("mem_zero_g", lambda t: _set(t, "G", torch.zeros_like)),
                     ("mem_nan_keys", lambda t: _set(t, "U", lambda x: x.index_fill(0, torch.tensor([2]), torch.nan)))):
        f[name] = rewrite_memory(mem, d / f"{name}.safetensors", tensors=fn)
    with __import__("safetensors").safe_open(str(mem), framework="pt") as h:
        meta = json.loads(h.metadata()["timerome"])
    f["hdr_list"] = rewrite_memory(mem, d / "hdr_list.safetensors", header=[1, 2])
    f["hdr_str"] = rewrite_memory(mem, d / "hdr_str.safetensors", header="timerome")
    f["hdr_facts"] = rewrite_memory(mem, d / "hdr_facts.safetensors", header={**meta, "facts": "x"})
    f["hdr_hidden"] = rewrite_memory(mem, d / "hdr_hidden.safetensors", header={**meta, "hidden_size": "128"})
    f["hdr_layer"] = rewrite_memory(mem, d / "hdr_layer.safetensors",
                                    header={**meta, "coordinate": {**meta["coordinate"], "layer": 99}})
    f["hdr_nan"] = d / "hdr_nan.safetensors"
    rewrite_memory(mem, f["hdr_nan"], header={**meta, "hyper": {**meta["hyper"], "key_scale": float("nan")}})
    with __import__("safetensors").safe_open(str(cb), framework="pt") as h:
        cmeta = json.loads(h.metadata()["timerome"])
    f["cb_layer"] = rewrite_memory(cb, d / "cb_layer.safetensors",
                                   header={**cmeta, "coordinate": {**cmeta["coordinate"], "layer": -1}})
    f["cb_cseed"] = rewrite_memory(cb, d / "cb_cseed.safetensors",
                                   header={**cmeta, "hyper": {**cmeta["hyper"], "calibration_seed": 1.7}})
    # stop 80 (review 88): slots outside the context (no update at all, or terabytes), one id for every fact, a
    # background covariance of another size
    f["cb_slot"] = rewrite_memory(cb, d / "cb_slot.safetensors", tensors=lambda t: _set(t, "slot", lambda x: x * 0 - 5))
    f["mem_dup"] = rewrite_memory(mem, d / "mem_dup.safetensors", header={**meta, "facts": [meta["facts"][0]] * len(
        meta["facts"])})
    f["mem_cov"] = rewrite_memory(mem, d / "mem_cov.safetensors",
                                  tensors=lambda t: _set(t, "cov", lambda x: x[:64, :64].contiguous()))
    tr = d / "tr"
    f["tr_nan"] = trace_copy(tr, d / "tr_nan",
                             tensors=lambda t: _set(t, "tie", lambda x: x.index_fill(0, torch.tensor([0]), torch.nan)))
    f["tr_shape"] = trace_copy(tr, d / "tr_shape", meta=lambda m: {**m, "layers": m["layers"][:-1]})
    f["tr_int"] = trace_copy(tr, d / "tr_int", tensors=lambda t: _set(t, "tie", lambda x: x.to(torch.int64)))
    f["tr_list"] = trace_copy(tr, d / "tr_list", meta=lambda m: [m])
    f["tr_layer"] = trace_copy(tr, d / "tr_layer", meta=lambda m: {**m, "layers": m["layers"][:-1] + [99]})
    f["tr_facts"] = trace_copy(tr, d / "tr_facts", meta=lambda m: {**m, "facts": list(range(len(m["fact_ids"])))})
    for k in ("tr_nan", "tr_shape", "tr_int", "tr_list", "tr_layer", "tr_facts"):  # made on this model (the others test that)
        m = json.loads(f[k].with_suffix(".json").read_text())
        if isinstance(m, dict):
            m["settings"]["fingerprint"] = load_backbone().fingerprint()
            f[k].with_suffix(".json").write_text(json.dumps(m))
    # positional traces were read unchecked (stop 61's audit): NaN / inf effects, shapes against the JSON, int64
    res = runner.invoke(app, ["trace", "--positional", "--n-facts", "1", "--n-samples", "1", "-o", str(d / "pos")])
    assert res.exit_code == 0, res.output
    pos = d / "pos"
    f["pos_nan"] = trace_copy(pos, d / "pos_nan", name="positional",
                              tensors=lambda t: _set(t, "effect", lambda x: x.index_fill(0, torch.tensor([0]), torch.inf)))
    f["pos_shape"] = trace_copy(pos, d / "pos_shape", name="positional", meta=lambda m: {**m, "layers": m["layers"][:-1]})
    f["pos_int"] = trace_copy(pos, d / "pos_int", name="positional",
                              tensors=lambda t: _set(t, "effect", lambda x: x.nan_to_num(0).to(torch.int64)))
    f["pos_facts"] = trace_copy(pos, d / "pos_facts", name="positional", meta=lambda m: {**m, "facts": []})
    f["pos_kind"] = trace_copy(pos, d / "pos_kind", name="positional", meta=lambda m: {k: v for k, v in m.items()
                                                                                        if k != "kind"})
    f["pos_window"] = trace_copy(pos, d / "pos_window", name="positional",
                                 meta=lambda m: {**m, "settings": {**m["settings"], "window": -3}})
    (d / "tr_pipe").mkdir()  # a trace whose tensors are a named pipe, its JSON a good one
    shutil.copy(tr / "trace.json", d / "tr_pipe" / "trace.json")
    os.mkfifo(d / "tr_pipe" / "trace.safetensors")
    f["tr_pipe"] = d / "tr_pipe" / "trace.safetensors"
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
        ("--quick for the radar, which computes nothing (its hint named settings it refuses)",
         ["experiment", "radar", "--quick", "-o", tmp / "rq"], "it computes nothing itself"),
        ("inline config not JSON", ["experiment", "canonical", "-c", '{"n_mc": 2,}', "-o", tmp / "e"], "not valid JSON"),
        ("inline config not an object", ["experiment", "canonical", "-c", "[1, 2]", "-o", tmp / "e"],
         "must hold a JSON object"),
        ("negative lambda", ["edit", "--lam", "-5", "-o", out], "-5"),
        ("hand-edited layer -1", ["generate", "--edit", f["layer_neg"], "Where was Isgor Quielson born ?"], "layer -1"),
        ("hand-edited alpha 1e30", ["generate", "--edit", f["alpha_huge"], "Where was Isgor Quielson born ?"],
         "alpha"),
        # stop 81: finite weights whose attention overflows on a prompt answered "" with exit 0
        ("a model whose forward overflows", ["generate", "-m", f["overflow"], "Where was Isgor Quielson born ?"],
         "are not finite (NaN or infinite) where it writes the answer"),
        ("hand-edited q over the facts", ["generate", "--edit", f["q_over"], "Where was Isgor Quielson born ?"],
         "q=500 exceeds the number of facts"),
        ("a model folder as --edit", ["generate", "--edit", DEFAULT_MODEL_DIR, "hello"], "pass it as the model, -m"),
        ("edit inline config a list", ["edit", "-c", "[1, 2]", "-o", out], "must hold a JSON object"),
        ("edit config neither a file nor JSON", ["edit", "-c", "alpha=2", "-o", out], "is not inline JSON"),
        ("target with a word the model cannot read", ["edit", "--target", "I do not know .", "-o", out], "('not')"),
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
        ("zero threads", ["--threads", "0", "methods"], "--threads must be a number of threads in 1..1024"),
        ("a value of the wrong type", ["trace", "--steps", "x"], "--steps"),
        ("an unknown option", ["trace", "--bogus"], "--bogus"),
        ("an extra argument", ["demo", "--seeds", "-o", tmp / "e"], "extra argument"),
        ("an unknown command", ["bogus"], "bogus"),
        ("memory show of a non-memory", ["memory", "show", f["cfg_array"]], "array.json"),
        ("memory remove of an unknown id", ["memory", "remove", f["mem"], "nosuchid", "-o", out], "nosuchid"),
        ("memory remove of a misspelt subject (stop 77: the close one named)",
         ["memory", "remove", f["mem"], "--subject", "Isgor Quielsen", "-o", out], "(did you mean 'Isgor Quielson'?)"),
        ("memory remove of everything", ["memory", "remove", f["mem"], "--subject", "Isgor Quielson", "-o", out],
         "every fact"),
        ("memory add of facts already in it", ["memory", "add", f["mem"], "-o", out], "nothing to add"),
        ("memory merge across coordinates", ["memory", "merge", f["mem"], f["mem_l0"], "-o", out], "coordinate"),
        # stop 79 (review 87): experiment settings read wrong, read by nothing, or crashing
        ("ablations one_step beyond the trajectory", ["experiment", "ablations", "-c", '{"one_step": 1000}', "-o",
                                                      tmp / "e"], "one_step 1000 is no step of the 8-step trajectories"),
        ("ablations config step", ["experiment", "ablations", "-c", '{"config": {"step": 2}}', "-o", tmp / "e"],
         "the config gives step, which the ablation rows set themselves"),
        ("npo_sweep compare entry misspelt", ["experiment", "npo_sweep", "-c", '{"compare": [{"method": "timerome", '
                                              '"confg": {"alpha": 2}}]}', "-o", tmp / "e"], "setting compare must be"),
        ("npo_sweep extra without a method", ["experiment", "npo_sweep", "-c", '{"extra": [{"lr": 0.0001}]}', "-o",
                                              tmp / "e"], "setting extra must be a list of {\"method\": NAME"),
        ("npo_sweep collapse below 0", ["experiment", "npo_sweep", "-c", '{"collapse": -3}', "-o", tmp / "e"],
         "setting collapse must be a number > 0"),
        ("robustness extraction settings as a text", ["experiment", "robustness", "-c",
                                                      '{"extraction": {"settings": "nominal"}}', "-o", tmp / "e"],
         "setting extraction must be false"),
        ("rwku forget_from misspelt", ["experiment", "rwku", "-c", '{"forget_from": ["probes", "passage"]}', "-o",
                                       tmp / "e"], "forget_from must be a non-empty list of probes and / or passages"),
        ("rwku mia_k 0", ["experiment", "rwku", "-c", '{"mia_k": 0}', "-o", tmp / "e"], "mia_k must be a number in (0, 1]"),
        ("transfer knowmem_tokens 0", ["experiment", "transfer", "-c", '{"knowmem_tokens": 0}', "-o", tmp / "e"],
         "knowmem_tokens must be an integer >= 1"),
        ("transfer benchmarks empty", ["experiment", "transfer", "-c", '{"benchmarks": []}', "-o", tmp / "e"],
         "setting benchmarks is empty"),
        ("scalability sizes empty", ["experiment", "scalability", "-c", '{"sizes": []}', "-o", tmp / "e"],
         "setting sizes is empty"),
        ("scalability a size twice", ["experiment", "scalability", "-c", '{"sizes": [10, 10]}', "-o", tmp / "e"],
         "setting sizes gives 10 twice"),
        ("scalability a size beyond the split", ["experiment", "scalability", "-c", '{"sizes": [5000]}', "-o",
                                                 tmp / "e"], "the forget split full has 2000 rows, and 5000"),
        ("sequential n_facts beyond the split", ["experiment", "sequential", "-c", '{"n_facts": 100000}', "-o",
                                                 tmp / "e"], "the forget split forget05 has 100 rows"),
        ("xbackbone models empty", ["experiment", "xbackbone", "-c", '{"models": []}', "-o", tmp / "e"],
         "setting models must be a non-empty list"),
        ("utility method beside no points", ["experiment", "utility", "-c", '{"points": [], "method": "ga"}', "-o",
                                             tmp / "e"], "method (points is empty (the unedited model alone))"),
        ("editing sets naming one spec twice", ["experiment", "editing", "-c", '{"sets": {"a": "embedded:forget01", '
                                                '"b": "embedded:forget01"}}', "-o", tmp / "e"],
         "setting sets names 'embedded:forget01' twice (under two names)"),
        ("canonical a split twice", ["experiment", "canonical", "-c", '{"splits": ["forget", "forget"]}', "-o",
                                     tmp / "e"], 'setting splits gives "forget" twice'),
        ("eval --splits a split twice", ["eval", "--splits", "forget,forget"], "--splits names forget twice"),
        ("requests of the full split (no donor left)", ["requests", "embedded:full"],
         "too few authors outside it state"),
        # stop 79 (review 84): the author was taken, and the mismatch blamed on the subject
        ("a row whose author and subject differ", ["edit", "--data", f["two_names"], "-o", tmp / "x.safetensors"],
         "its author 'Dusmi Torzanard' and subject 'Isgor Quielson' name two people"),
        # stop 79 (review 84): a memory given as text was said as "not UTF-8: convert it (iconv)"
        ("a memory as the requests", ["requests", f["mem"]], "is a safetensors file (an edit memory, a trace or a "
                                                              "model's weights), not text: pass the edit request file"),
        ("a memory as --data", ["edit", "--data", f["mem"], "-o", tmp / "x.safetensors"], "is a safetensors file"),
        ("a memory as --background", ["edit", "--background", f["mem"], "-o", tmp / "x.safetensors"],
         "is a safetensors file"),
        # stop 79 (review 84): the class of a value given twice, in the memory commands
        ("memory merge of one file twice", ["memory", "merge", f["mem"], f["mem"], "-o", out],
         "is given twice: a memory merged with itself adds nothing"),
        ("memory remove of one id twice", ["memory", "remove", f["mem"], "Isgor Quielson/city", "Isgor Quielson/city",
                                           "-o", out], "fact id 'Isgor Quielson/city' is given twice"),
        ("memory remove of one subject twice", ["memory", "remove", f["mem"], "--subject", "Isgor Quielson",
                                                "--subject", "Isgor Quielson", "-o", out],
         "--subject 'Isgor Quielson' is given twice"),
        ("eval --n-mc 0", ["eval", "--n-mc", "0"], "--n-mc"),
        ("eval of an unknown split", ["eval", "--splits", "bogus"], "--splits"),
        ("eval of a model with a broken config", ["eval", "--model", f["badcfg"]], "config.json"),
        ("new-model from no text", ["new-model", f["empty"], "-o", tmp / "nm"], "no text"),
        ("new-model from a non-UTF-8 rows file", ["new-model", f["rows"], "-o", tmp / "nm"], "not UTF-8"),
        # stop 49: an empty rows file built a tokenizer from the default target alone
        ("new-model from an empty rows file", ["new-model", f["empty_rows"], "-o", tmp / "nm"], "empty.jsonl is empty"),
        ("a memory file that is a directory", ["eval", "--edit", f["outdir"], "--no-rouge"], "is a directory; pass a file"),
        ("a requests file that is a directory", ["requests", f["outdir"]], "is a directory; pass a file"),
        ("an empty --data (read as the folder '.': 'is a directory')", ["trace", "--data", "", "-o", out],
         "rows file: the path is empty"),
        ("an empty --requests", ["eval", "--requests", ""], "edit request file: the path is empty"),
        ("a --sigma that overflows the model (it said 'trace again', which fails the same way)",
         ["trace", "--sigma", "1e308", "--n-facts", "1", "--n-samples", "1", "--steps", "2", "-o", out],
         "give a smaller sigma"),
        ("the same in the positional trace", ["trace", "--positional", "--sigma", "1e308", "--n-facts", "1",
                                              "--n-samples", "1", "-o", out], "give a smaller sigma"),
        # stop 83: the clean run itself overflowing gave an all-NaN trace, which selection refused with
        # "trace again" (which fails the same way)
        ("a trace of a model whose forward overflows", ["trace", "-m", f["overflow"], "--n-facts", "1",
                                                        "--n-samples", "1", "--steps", "2", "-o", out],
         "the model overflows: its clean run's read-out of fact"),
        ("the same in the positional trace", ["trace", "--positional", "-m", f["overflow"], "--n-facts", "1",
                                              "--n-samples", "1", "-o", out], "the model overflows: its clean run"),
        ("a negative --alpha (a warning about it came first)", ["edit", "--alpha", "-1", "-o", out],
         "alpha must be a number >= 0"),
        ("--alpha 0 beside a bad --q (its warning came first)", ["edit", "--alpha", "0", "--q", "-3", "-o", out],
         "must be an integer >= 0"),
        ("a trace's .json that is no trace (the message named a .safetensors never given)",
         ["edit", "--trace", f["req_one"], "-o", out], "is not a trace"),
        ("an empty -o for a memory (read as '.': 'is a directory')", ["edit", "-o", ""], "-o: the path is empty"),
        # stop 71: an overflowing memory was refused by generate and eval --edit only, and built without a word
        ("an overflowing alpha under eval --requests (scored Gibberish 1)", ["eval", "--edit", f["alpha_huge"],
                                                                             "--requests", f["req_one"]], "overflow"),
        ("edit --alpha 1e30 (the file was written; generate refused it later)", ["edit", "--alpha", "1e30", "-o", out],
         "overflow"),
        ("a hand-edited negative alpha (it added the old answer back)", ["generate", "--edit", f["alpha_neg"], "Hi ?"],
         "alpha must be a finite number >= 0"),
        # stop 71: an empty folder option arrived as Path('.') and wrote into the current folder
        ("an empty trace --out (the run wrote into the current folder)", ["trace", "--out", ""],
         "--out: the path is empty"),
        ("an empty demo -o=... spelt --out=", ["demo", "--out="], "--out: the path is empty"),
        ("an empty eval --bench-data (read as the current folder)", ["eval", "--bench", "mmlu", "--bench-data", " "],
         "--bench-data: the path is empty"),
        ("a memory file that is a named pipe (the read blocked)", ["eval", "--edit", f["fifo"], "--no-rouge"],
         "is not a regular file"),
        ("memory show of a named pipe", ["memory", "show", f["fifo"]], "is not a regular file"),
        ("a trace whose tensors are a named pipe", ["edit", "--trace", f["tr_pipe"], "-o", out], "is not a regular file"),
        ("requests -o a directory", ["requests", "embedded:forget01", "-o", f["outdir"]], "requests.json"),
        ("eval --requests --n-world -1", ["eval", "--requests", "embedded:forget01", "--n-world", "-1"],
         "--n-world must be >= 0"),
        ("eval --requests --n-world on a model without those locality rows (it was ignored)",
         ["eval", "-m", f["tiny"], "--requests", f["req_other"], "--n-world", "3"], "not " + str(f["tiny"])),
        ("eval --requests --n-retain at its default value, given, on a model without those rows (it passed as not given)",
         ["eval", "-m", f["tiny"], "--requests", f["req_other"], "--n-retain", "40"], "--n-retain size"),
        ("new-model size", ["new-model", "embedded:forget01", "--size", "huge", "-o", tmp / "nm"], "huge"),
        ("new-model odd heads", ["new-model", "embedded:forget01", "--d-model", "30", "--heads", "4", "-o",
                                 tmp / "nm"], "heads"),
        ("train zero epochs", ["train", "--epochs", "0", "--out", tmp / "tr"], "--epochs"),
        ("train on a missing file", ["train", "--data", "nowhere.json", "--out", tmp / "tr"], "nowhere.json"),
        # round 2 (issue 23). Numbers on the command line: finite, within 64 bits, in range
        ("--temperature nan", ["generate", "--temperature", "nan", "Where was Isgor Quielson born ?"], "--temperature"),
        ("--temperature inf", ["generate", "--temperature", "inf", "Where was Isgor Quielson born ?"], "--temperature"),
        ("--threshold nan", ["generate", "--threshold", "nan", "Where was Isgor Quielson born ?"], "--threshold"),
        ("--lr inf", ["train", "--lr", "inf", "--out", tmp / "tr"], "--lr"),
        ("--seed beyond 64 bits", ["generate", "--seed", "9" * 30, "Where was Isgor Quielson born ?"], "--seed"),
        ("--seed -1", ["generate", "--seed", "-1", "Where was Isgor Quielson born ?"], "--seed"),
        ("--seeds beyond 64 bits", ["experiment", "canonical", "--seeds", "0," + "9" * 25, "-o", tmp / "e"], "seed"),
        ("--n-samples beyond 64 bits", ["trace", "--n-samples", "1" + "0" * 20, "-o", tmp / "t"], "--n-samples"),
        ("a sampler option refused before any warning", ["generate", "--gen-length", "0", "Zorblax ?"], "--gen-length"),
        # absurd sizes: refused before any work, the estimate in the message, --insist to go on
        ("generate --steps 1e9", ["generate", "--steps", "1000000000", "Where was Isgor Quielson born ?"], "--insist"),
        ("trace --steps 1e9", ["trace", "--steps", "1000000000", "-o", tmp / "t"], "--insist"),
        ("eval --n-mc 1e18", ["eval", "--n-mc", "1" + "0" * 18, "--no-rouge"], "--insist"),
        ("eval of an edit of one denoising step (the likelihoods would read the model unedited)",
         ["eval", "--edit", f["mem_step"], "--no-rouge"], "denoising step 3"),
        ("one question given two targets", ["requests", f["req_two_targets"]], "one question say one thing"),
        # stop 83 (review 93): eval --requests scored targets and objects of unknown words as unknown tokens, with
        # no word (EfficacyLP 0.59 for the unedited model on the real facts); edit refused them
        ("eval --requests with a target the vocabulary cannot encode", ["eval", "--requests", f["req_oov"]],
         "the target of request 0 ('Zyxwquux Plenthorpia.') has words the model's vocabulary cannot encode"),
        # stop 83 (review 93): refused after the model loaded and the method installed; now before the load
        ("edit of a method whose hooks are no memory (before any model)", ["edit", "--method", "act_steer", "-m",
                                                                           tmp / "no-model", "-o", out],
         "act_steer changes the model through hooks that are not a memory timerome can save"),
        ("eval --requests of the real facts on the embedded word vocabulary", ["eval", "--requests", "real-facts"],
         "the object of request capital/France ('Paris') has words the model's vocabulary cannot encode"),
        ("eval --requests of an edit at step 3 with answers of 2 steps (it would never act)",
         ["eval", "--requests", "embedded:forget01", "--edit", f["mem_step"], "--gen-length", "2"], "never acts"),
        ("edit --seed -1 (went through; every --seed is checked as one)", ["edit", "--seed", "-1", "-o", out],
         "--seed must be"),
        # stop 61: a seed given to a method that draws nothing was read by nothing (the same file for any seed)
        ("edit --seed for timerome (its build draws nothing)", ["edit", "--seed", "3", "-o", out],
         "timerome trace --seed"),
        ("edit --seed for random_layer at a given coordinate (it draws nothing then)",
         ["edit", "--method", "random_layer", "-c", '{"coordinate": [1, "resid"]}', "--seed", "3", "-o", out],
         "draws nothing at random when it builds with these settings"),
        # stop 46: a method's step option in an experiment whose measurement reads likelihoods (it failed at the
        # first forward of that cell, after the cells before it had run)
        ("a one-step method in a likelihood experiment", ["experiment", "canonical", "-c", '{"methods": [{"method": '
                                                          '"timerome", "config": {"step": 1}}]}', "-o", tmp / "e"],
         "denoising step 1 only"),
        ("the same, the step inside its coordinate", ["experiment", "canonical", "-c", '{"methods": [{"method": '
                                                      '"timerome", "config": {"coordinate": [1, "resid", 2]}}]}',
                                                      "-o", tmp / "e"], "denoising step 2 only"),
        # stop 67 (helper 53's audit): options and settings other options left unread, accepted and dropped
        ("requests --target where every request names its own", ["requests", "counterfactual:forget10", "--target",
                                                                   "ZZZ"], "every request here names its own"),
        ("edit -c's target where every request names its own (before the model loads)",
         ["edit", "--method", "rome", "--requests", "counterfactual:forget10", "-c", '{"target": "ZZZ"}', "-m",
          tmp / "no-model", "-o", tmp / "rome2"], "every request here names its own"),
        ("eval --requests --target where every request names its own", ["eval", "--requests", "counterfactual:forget10",
                                                                         "--target", "ZZZ"], "names its own"),
        ("an empty requests --target", ["requests", "embedded:forget01", "--target", ""], "the target is empty"),
        ("an editing set's target no request reads (before the model loads)",
         ["experiment", "editing", "--quick", "-m", tmp / "no-model", "-c",
          '{"sets": {"cf": "counterfactual:forget10"}, "target": "ZZZ"}', "-o", tmp / "e"],
         "every request of counterfactual:forget10"),
        ("eval --n-retain beside --splits without retain", ["eval", "--splits", "forget", "--n-retain", "5"],
         "--n-retain sizes a split the evaluation leaves out"),
        ("a size of a split an experiment leaves out", ["experiment", "canonical", "-c",
                                                        '{"splits": ["forget"], "n_retain": 3}', "-o", tmp / "e"],
         "nothing reads n_retain (the splits leave out retain)"),
        ("experiment --methods beside -c's methods", ["experiment", "canonical", "--methods", "no_edit", "-c",
                                                      '{"methods": ["nope"]}', "-o", tmp / "e"],
         "--methods and -c's 'methods' both give"),
        ("an empty pareto sweep", ["experiment", "pareto", "-c", '{"alphas": []}', "-o", tmp / "e"],
         "alphas is empty"),
        ("an empty npo_sweep axis", ["experiment", "npo_sweep", "-c", '{"lr": []}', "-o", tmp / "e"],
         "lr is empty, so the grid has no configuration"),
        ("radar --fresh (it computes no cell)", ["experiment", "radar", "--fresh", "-o", tmp / "e"], "--fresh"),
        ("generate --seed where nothing is drawn", ["generate", "--seed", "3", "Where was Isgor Quielson born ?"],
         "the sampler draws nothing"),
        ("memory show --all --json", ["memory", "show", f["mem"], "--all", "--json"], "--json lists every fact"),
        ("new-model --size beside every dimension", ["new-model", "embedded:forget01", "--size", "large", "--d-model",
                                                     "64", "--layers", "2", "--heads", "4", "--mlp", "128", "-o",
                                                     tmp / "nm"], "size 'large' is read by nothing"),
        ("eval --bench wmdp --no-rouge", ["eval", "--bench", "wmdp", "--no-rouge"], "WMDP is scored by its choices"),
        # stop 68 (helper 53's list, left at stop 67): experiment settings their own settings leave unread
        ("a benchmark's size where the benchmarks leave it out", ["experiment", "transfer", "-c",
                                                                 '{"benchmarks": ["wmdp"], "n_trivia": 4}', "-o",
                                                                 tmp / "e"], "nothing reads n_trivia"),
        ("a generation length with rouge off", ["experiment", "transfer", "-c", '{"rouge": false, "completion_tokens": '
                                                '8, "benchmarks": ["whp"]}', "-o", tmp / "e"],
         "completion_tokens (rouge is false)"),
        ("rouge for WMDP alone (it generates nothing)", ["experiment", "transfer", "-c",
                                                         '{"benchmarks": ["wmdp"], "rouge": false}', "-o", tmp / "e"],
         "nothing reads rouge"),
        ("rwku --quick with an answer length (its quick subset turns rouge off)",
         ["experiment", "rwku", "--quick", "-c", '{"answer_tokens": 8}', "-o", tmp / "e"], "rouge is false, as --quick sets it"),
        ("rwku's n_passages without passages", ["experiment", "rwku", "-c", '{"forget_from": ["probes"], '
                                                '"n_passages": 4}', "-o", tmp / "e"], "forget_from has no passages"),
        ("the reference's training beside a given reference (before the model loads)",
         ["experiment", "canonical", "-m", tmp / "no-model", "--reference", f["tiny"], "-c",
          '{"reference": {"epochs": 3}}', "-o", tmp / "e"], "a given reference model is trained already"),
        ("the reference's training where there is no reference (another model; before it loads)",
         ["experiment", "canonical", "-m", tmp / "no-model", "-c", '{"reference": {"epochs": 3}}', "-o", tmp / "e"],
         "the reference setting's epochs train the reference model, and there is no reference model"),
        ("the reference's training where the splits leave out forget (no Forget Quality; before the model loads)",
         ["experiment", "canonical", "-m", tmp / "no-model", "--reference", f["tiny"], "-c",
          '{"reference": {"epochs": 3}, "splits": ["retain"]}', "-o", tmp / "e"],
         "nothing reads reference (the splits leave out forget"),
        ("xbackbone -m beside the models setting", ["experiment", "xbackbone", "-m", f["tiny"], "-c",
                                                    json.dumps({"models": [str(f["tiny"])]}), "-o", tmp / "e"],
         "the model (-m / model=) beside it is read by nothing"),
        ("xbackbone --reference beside the references setting",
         ["experiment", "xbackbone", "--models", str(f["tiny"]), "--reference", f["tiny"], "-c",
          json.dumps({"references": [str(f["tiny"])]}), "-o", tmp / "e"], "--reference (reference=) beside it"),
        ("edit --target beside -c's target (the first filled the requests, the second the method)",
         ["edit", "--method", "rome", "--target", "A", "-c", '{"target": "B"}', "-o", tmp / "rome3"],
         "--target and -c's 'target' both give the target"),
        ("experiment all with a setting only a part outside all has", ["experiment", "all", "-c",
                                                                       '{"tasks": ["arc_easy"]}', "-o", tmp / "e"],
         "utility is not part of all: run it by name"),
        ("experiment all with a shared setting no part reads", ["experiment", "all", "-c",
                                                                '{"benchmarks": ["wmdp"], "n_trivia": 3}', "-o",
                                                                tmp / "e"],
         "nothing reads n_trivia (transfer: the benchmarks setting leaves out whp)"),
        ("a privacy-leak reference AUC for a corpus the run leaves out",
         ["experiment", "transfer", "-c", '{"benchmarks": ["muse-books"], "privleak_reference": {"news": 0.5}}',
          "-o", tmp / "e"], "the benchmarks setting leaves out muse-news"),
        ("a privacy-leak reference AUC of no corpus", ["experiment", "transfer", "-c",
                                                       '{"privleak_reference": {"bogus": 0.5}}', "-o", tmp / "e"],
         "setting privleak_reference must be an object"),
        ("robustness: an extraction target no request reads (before the model loads)",
         ["experiment", "robustness", "-m", tmp / "no-model", "-c", '{"extraction": {"requests": '
          '"counterfactual:forget10", "target": "ZZZ"}}', "-o", tmp / "e"], "extraction: the target 'ZZZ'"),
        ("robustness: methods without no_edit, which every panel Δ is against (before the model loads)",
         ["experiment", "robustness", "-m", tmp / "no-model", "-c", '{"methods": ["timerome"]}', "-o", tmp / "e"],
         "leaves no_edit out: add \"no_edit\""),
        ("pareto: splits without retain (before the model loads)",
         ["experiment", "pareto", "-m", tmp / "no-model", "-c", '{"splits": ["forget"]}', "-o", tmp / "e"],
         "its splits need retain"),
        ("the ablations' trajectory settings on an autoregressive model",
         ["experiment", "ablations", "-m", f["tiny_ar"], "-c", '{"traj_steps": 16}', "-o", tmp / "e"],
         "traj_steps sets the trajectory columns' denoising steps, which an autoregressive model"),
        # stop 67 (helper 51's audit): inputs a method read nothing of, accepted and silently dropped
        ("--background with raw keys", ["edit", "--key-metric", "paper", "--background", "embedded:retain_perturbed",
                                        "-o", out], "--key-metric paper keeps them raw"),
        ("--background for a training method", ["forget", "--method", "ga", "--background",
                                                "embedded:retain_perturbed", "-o", tmp / "ga"],
         "--background is read by nothing here: ga"),
        ("--calibration for a method that reads no rows", ["forget", "--method", "ga", "-c", '{"safe": false}',
                                                            "--calibration", "embedded:retain_perturbed", "-o", out],
         "ga here reads none"),
        ("--calibration for the ridge memory edit builds", ["edit", "--calibration", "embedded:retain_perturbed",
                                                             "-o", out], "timerome here reads none"),
        ("--calibration for GA without its safe protocol", ["forget", "--method", "ga", "-c", '{"safe": false}',
                                                             "--calibration", "embedded:retain_perturbed", "-o",
                                                             tmp / "ga"], "ga here reads none"),
        # stop 73 (review 67): ROME-style statistics read the rows only in place of background texts
        ("--calibration beside --background for ROME (before the model loads)",
         ["edit", "--method", "rome", "--requests", "counterfactual:forget01", "--calibration",
          "embedded:retain_perturbed", "--background", "embedded:retain_perturbed", "-m", tmp / "no-model", "-o",
          tmp / "rome"], "--calibration and --background both give the texts of rome's key statistics"),
        ("--calibration for MEMIT with texts of its own (before the model loads)",
         ["edit", "--method", "memit", "-c", '{"stats_texts": "embedded:retain_perturbed"}', "--calibration",
          "embedded:retain_perturbed", "-m", tmp / "no-model", "-o", tmp / "memit"], "memit here reads none"),
        ("--calibration for ROME on the embedded model", ["edit", "--method", "rome", "--calibration",
                                                          "embedded:retain_perturbed", "-o", tmp / "rome"],
         "on the embedded model rome's key statistics come from the rows it was trained on"),
        ("TIE beside the positional trace on an autoregressive model",
         ["trace", "--positional", "--compare", "-m", f["tiny_ar"], "-o", tmp / "t"], "leave --compare out"),
        ("the diffusion KV cache in eval on an autoregressive model",
         ["eval", "-m", f["tiny_ar"], "--cache", "dual", "--splits", "forget"], "cache (--cache) is a diffusion"),
        # stop 74 (review 72): the other diffusion sampler options on an AR model, and a one-step memory's likelihood
        # refusal there, before any work or warning (the rows' and the prompt's unknown words came first)
        ("eval --threshold on an autoregressive model", ["eval", "-m", f["tiny_ar"], "--threshold", "0.9", "--splits",
                                                         "forget"], "threshold (--threshold) is a diffusion sampling"),
        ("generate --cache on an autoregressive model", ["generate", "-m", f["tiny_ar"], "--cache", "dual",
                                                         "Zorblax ?"], "cache (--cache) is a diffusion sampling"),
        ("generate --threshold on an autoregressive model", ["generate", "-m", f["tiny_ar"], "--threshold", "0.9",
                                                             "Zorblax ?"], "threshold (--threshold) is a diffusion"),
        ("a misspelt --background spec", ["edit", "--requests", "counterfactual:forget01", "--background",
                                           "embeded:retain_perturbed", "-o", out],
         "the background 'embeded:retain_perturbed' is neither 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' nor an existing file"),
        ("robustness's extraction given a diffusion sampler setting on an autoregressive model",
         ["experiment", "robustness", "-m", f["tiny_ar"], "-o", tmp / "rob", "-c",
          '{"extraction": {"settings": ["nominal", "random", "dual 0.9"]}}'],
         "settings 'random', 'dual 0.9' set the diffusion sampler"),
        ("ROME's n_states on an autoregressive model in an experiment (before any cell, and the rows' warning)",
         ["experiment", "canonical", "-m", f["tiny_ar"], "-o", tmp / "can", "--seeds", "0", "-c",
          '{"methods": ["no_edit", {"method": "rome", "config": {"n_states": 1}}]}'], "n_states counts the cloze"),
        ("ROME's n_states in xbackbone where the second model is autoregressive (before the first loads)",
         ["experiment", "xbackbone", "--models", f"{f['tiny']},{f['tiny_ar']}", "-o", tmp / "xb", "--seeds", "0",
          "-c", '{"methods": ["no_edit", {"method": "rome", "config": {"n_states": 1}}]}'],
         "n_states counts the cloze"),
        ("utility's generation setting of the diffusion sampler on an autoregressive model (before the load)",
         ["experiment", "utility", "-m", f["tiny_ar"], "-o", tmp / "ut", "-c",
          '{"generation": {"cache": "dual", "steps": 2}}'], "the generation setting's cache, steps set the diffusion"),
        ("ROME's n_states through edit on an autoregressive model (before the facts' warning)",
         ["edit", "--method", "rome", "-c", '{"n_states": 2}', "-m", f["tiny_ar"], "-o", tmp / "xr"],
         "n_states counts the cloze states"),
        ("--refresh-every beside --cache on an autoregressive model (names both: no circle)",
         ["generate", "-m", f["tiny_ar"], "--cache", "prefix", "--refresh-every", "2", "Zorblax ?"],
         "cache (--cache), refresh_every (--refresh-every) are diffusion sampling options: leave them out"),
        ("eval --bench of a one-step memory on an autoregressive model",
         ["eval", "-m", f["tiny_ar"], "--edit", f["mem_ar_step"], "--bench", "wmdp", "--bench-data", f["wmdp_mixed"],
          "--limit", "2"],
         "which it never meets: build it for every step (edit without --step)"),
        ("eval of a one-step memory on an autoregressive model",
         ["eval", "-m", f["tiny_ar"], "--edit", f["mem_ar_step"], "--splits", "forget"],
         "step 1 only (on an autoregressive model, the forward writing answer token 1), and these metrics read "
         "likelihoods (one forward over the whole given answer"),
        ("a misspelt requests spec", ["requests", "counterfactuals:forget10"],
         "counterfactuals: names no corpus (the specs: 'counterfactual:SPLIT'"),
        ("the rewrite memory on an autoregressive model (before its facts and calibration are read)",
         ["edit", "--method", "rewrite", "-m", f["tiny_ar"], "-o", out],
         "an autoregressive model (tiny_ar) never has masked positions"),
        ("--target under an objective that writes none (before the model loads)",
         ["edit", "--method", "rome", "-c", '{"objective": "forget"}', "--target", "Nope.", "-m", tmp / "no-model",
          "-o", tmp / "rome"], "target is read by nothing here"),
        ("the codebook's per_fact through edit", ["edit", "--method", "codebook", "-c", '{"coordinates": "per_fact"}',
                                                  "-o", out], "builds one codebook memory at one coordinate"),
        ("LoRA's alpha without LoRA", ["experiment", "canonical", "-c", '{"methods": [{"method": "ga", "config": '
                                                                        '{"lora_alpha": 16}}]}', "-o", tmp / "e"],
         "lora_alpha is read by nothing here: lora_r is 0"),
        # stop 67: TIE's steps with ROME's positional trace were accepted and read by nothing
        ("TIE's steps with the positional trace", ["experiment", "canonical", "-c", '{"methods": [{"method": '
                                                   '"timerome", "config": {"trace_kind": "positional", '
                                                   '"trace_steps": 4}}]}', "-o", tmp / "e"],
         "trace_steps sets TIE's denoising steps"),
        ("train --epochs 1e12", ["train", "--epochs", "1" + "0" * 12, "--out", tmp / "tr"], "--insist"),
        ("new-model --layers 1e9", ["new-model", "embedded:forget01", "--layers", "1000000000", "-o", tmp / "nm"],
         "--insist"),
        ("config n_mc 1e18", ["experiment", "canonical", "-c", f["cfg_nmc_huge"], "-o", tmp / "e"], "--insist"),
        ("method steps 1e12", ["experiment", "canonical", "-c", '{"methods": [{"method": "ga", "config": '
                                                                  '{"grad_steps": 1000000000000}}]}', "-o", tmp / "e"],
         "--insist"),
        ("config.json n_layers 1e9", ["info", "--model", f["layers_huge"]], "--insist"),
        # experiment configs: the numbers inside them
        ("NaN alpha in an inline config", ["experiment", "canonical", "-c", '{"methods": [{"method": "timerome", '
                                                                            '"config": {"alpha": NaN}}]}',
                                           "-o", tmp / "e"], "alpha"),
        ("NaN in a config file", ["experiment", "canonical", "-c", f["cfg_nan"], "-o", tmp / "e"], "n_mc"),
        ("an integer beyond 64 bits in a config", ["experiment", "canonical", "-c", f["cfg_bigint"], "-o", tmp / "e"],
         "n_retain"),
        # checkpoint config.json and weights
        ("config.json rms_norm_eps NaN", ["generate", "--model", f["eps_nan"], "hello"], "rms_norm_eps"),
        ("config.json n_layers a string", ["info", "--model", f["layers_str"]], "n_layers"),
        ("config.json n_heads 0", ["info", "--model", f["heads_zero"]], "n_heads"),
        ("config.json heads that do not divide the width", ["info", "--model", f["width_odd"]], "divisible"),
        ("config.json a list", ["info", "--model", f["cfg_list"]], "JSON object"),
        ("a NaN weight", ["eval", "--model", f["w_nan"], "--no-rouge"], "NaN"),
        ("integer weights", ["generate", "--model", f["w_int"], "hello"], "floating point"),
        # memory files: dtypes, header types, values
        ("memory U float16", ["generate", "--edit", f["mem_f16"], "hello"], "float16"),
        ("memory G int32", ["generate", "--edit", f["mem_i32"], "hello"], "int32"),
        ("memory D int64", ["memory", "show", f["mem_i64"]], "int64"),
        ("memory header a list", ["generate", "--edit", f["hdr_list"], "hello"], "JSON list"),
        ("memory header a string", ["memory", "show", f["hdr_str"]], "JSON string"),
        ('memory header "facts": "x"', ["memory", "show", f["hdr_facts"]], "facts"),
        ("memory header hidden_size a string", ["generate", "--edit", f["hdr_hidden"], "hello"], "hidden_size"),
        ("memory header NaN key_scale", ["eval", "--edit", f["hdr_nan"]], "NaN"),
        ("memory layer 99", ["generate", "--edit", f["hdr_layer"], "hello"], "layer 99"),
        ("codebook memory layer -1", ["generate", "--edit", f["cb_layer"], "hello"], "layer -1"),
        ("codebook memory calibration_seed 1.7 (read as 1)", ["generate", "--edit", f["cb_cseed"], "hello"],
         "calibration_seed"),
        ("memory with an all-zero G", ["generate", "--edit", f["mem_zero_g"], "hello"], "ridge inverse"),
        ("memory with NaN keys", ["generate", "--edit", f["mem_nan_keys"], "hello"], "non-finite"),
        # trace files
        ("trace with NaN TIE", ["edit", "--trace", f["tr_nan"], "-o", out], "non-finite"),
        ("trace tensor shape against its JSON", ["edit", "--trace", f["tr_shape"], "-o", out], "shape"),
        ("trace tensor int64", ["edit", "--trace", f["tr_int"], "-o", out], "int64"),
        ("trace JSON a list", ["edit", "--trace", f["tr_list"], "-o", out], "JSON object"),
        ("trace layer out of range", ["edit", "--trace", f["tr_layer"], "-o", out], "layer 99"),
        ("generate of a blank prompt (the sampler now generates from ids of none)", ["generate", "Who ?", " "],
         "prompt 2 is blank"),
        ("positional trace with an infinite effect", ["edit", "--trace", f["pos_nan"], "-o", out], "non-finite"),
        ("positional trace shape against its JSON", ["edit", "--trace", f["pos_shape"], "-o", out], "shape"),
        ("positional trace tensor int64", ["edit", "--trace", f["pos_int"], "-o", out], "int64"),
        ("positional trace without its facts' tokens", ["edit", "--trace", f["pos_facts"], "-o", out], "0 facts' tokens"),
        # stop 80 (review 88): each loaded, the first two silently wrong, the third a traceback
        ("codebook memory slots -5 (no update at all)", ["generate", "--edit", f["cb_slot"], "hello"],
         "its 'slot' values (which subject token each entry keys; -1: none) must lie in -1..511, got -5..-5"),
        ("memory whose facts all hold one id (remove would remove them all)", ["generate", "--edit", f["mem_dup"],
                                                                               "hello"], "is held by 20 facts"),
        ("memory whose background covariance has another size", ["generate", "--edit", f["mem_cov"], "hello"],
         "a covariance [H, H], got shapes (128,) and (64, 64)"),
        ("trace facts as numbers", ["edit", "--trace", f["tr_facts"], "-o", out], "(each an object)"),
        ("positional trace without its kind (read as a TIE trace)", ["edit", "--trace", f["pos_kind"], "-o", out],
         "has no 'kind', and its tensors are a positional trace's"),
        ("positional trace window -3", ["edit", "--trace", f["pos_window"], "-o", out], "settings.window must be"),
        # round 3 (stop 44): options the command would not read, and repeats, refused instead of ignored
        ("--layer beside --trace", ["edit", "--trace", f["trace_other"], "--layer", "1", "-o", out], "--trace"),
        ("--q for the codebook", ["edit", "--method", "codebook", "--q", "5", "-o", out], "--q"),
        ("--lam for rome", ["edit", "--method", "rome", "--lam", "3", "-o", tmp / "rome"], "--lam"),
        ("--layer for rome", ["edit", "--method", "rome", "--layer", "1", "-o", tmp / "rome"], "--layer"),
        ("--lam with --lam-absolute", ["edit", "--lam", "3", "--lam-absolute", "1", "-o", out], "--lam-absolute"),
        ("eval --forget with --requests", ["eval", "--requests", "embedded:forget01", "--forget", "forget05"],
         "--forget"),
        ("eval --gen-length without --requests", ["eval", "--gen-length", "8"], "--gen-length"),
        ("eval --splits empty", ["eval", "--splits", ""], "--splits"),
        ("a seed twice", ["experiment", "canonical", "--seeds", "0,0", "-o", tmp / "e"], "repeats 0"),
        ("--methods empty", ["experiment", "canonical", "--methods", "", "-o", tmp / "e"], "--methods"),
        ("experiment -o a file", ["experiment", "canonical", "-o", f["cfg_array"]], "is a file"),
        ("rewrite to a target the vocabulary lacks", ["edit", "--method", "rewrite", "--target", "Zorblax", "-o", out],
         "Zorblax"),
        ("--config and an option set alpha", ["edit", "--method", "codebook", "-c", '{"alpha": 2}', "--alpha", "3",
                                              "-o", out], "alpha"),
        ("--beta without --neighbours", ["trace", "--beta", "1", "-o", tmp / "t"], "--neighbours"),
        # stop 79 (review 84): the neighbours were traced, and their trace read by nothing
        ("--neighbours without --beta", ["trace", "--neighbours", "embedded:forget05", "-o", tmp / "t"],
         "--neighbours traces neighbour facts for --beta's penalty, and --beta is 0"),
        ("--window without --positional", ["trace", "--window", "3", "-o", tmp / "t"], "--positional"),
        ("an empty --module", ["edit", "--module", "", "-o", out], "--module"),
        ("an empty --forget", ["eval", "--forget", "", "--no-rouge"], "split"),
        # the timerome method's settings through --config: each once, and only those `edit` uses
        ("timerome: --config and an option set alpha", ["edit", "-c", '{"alpha": 2}', "--alpha", "3", "-o", out],
         "given twice"),
        ("timerome: --config sets the method's own trace", ["edit", "-c", '{"trace_facts": 3}', "-o", out],
         "timerome trace"),
        ("timerome: --config sets its trace's read-out", ["edit", "-c", '{"trace_read_positions": "no_subject"}',
                                                         "-o", out], "--read-positions"),
        ("timerome: --config sets a coordinate and a trace setting",
         ["edit", "-c", '{"coordinate": [0, "resid"], "trace_samples": 2}', "-o", out], "timerome trace"),
        ("timerome: --config with an unknown setting", ["edit", "-c", '{"alpah": 2}', "-o", out], "alpah"),
        # stop 58's audit: each of these ran (a model of NaN weights saved, a tie-break edited, options ignored)
        ("npo beta 0 (2 / beta)", ["edit", "--method", "npo", "-c", '{"beta": 0}', "-o", tmp / "w"],
         "beta must be a number > 0"),
        ("ga lr -1", ["edit", "--method", "ga", "-c", '{"lr": -1}', "-o", tmp / "w"], "lr must be a number > 0"),
        ("a target for a method that writes none", ["edit", "--method", "ga", "--target", "Nope.", "-o", tmp / "w"],
         "takes no target"),
        ("trace --sigma 0 (no corruption)", ["trace", "--sigma", "0", "-o", tmp / "t"], "sigma must be"),
        ("eval --no-rouge with a sampler option", ["eval", "--no-rouge", "--cache", "dual"], "--no-rouge"),
        ("robustness eval_forget -1", ["experiment", "robustness", "-c", '{"eval_forget": -1}', "-o", tmp / "e"],
         "eval_forget"),
        ("robustness relearn without {answer}", ["experiment", "robustness", "-c", '{"relearn": "{foo} {question}"}',
                                                 "-o", tmp / "e"], "relearn must be"),
        # stop 59: eval --bench, a benchmark's own metrics for a model or a saved memory
        ("eval --bench an unknown benchmark", ["eval", "--bench", "muse"], "a benchmark is one of"),
        ("eval --bench with a choice for a benchmark without choices", ["eval", "--bench", "whp:x"],
         "whp names no part (only wmdp:SUBJECT and rwku:TARGET do), got 'whp:x'"),
        ("eval --bench and --requests", ["eval", "--bench", "wmdp", "--requests", "embedded:forget01"], "give one"),
        ("eval --limit without --bench", ["eval", "--limit", "3"], "--limit applies only with --bench"),
        ("eval --bench --limit 0", ["eval", "--bench", "wmdp", "--limit", "0"], "--limit must be"),
        ("eval --bench with a TOFU option", ["eval", "--bench", "wmdp", "--splits", "forget"],
         "--splits applies only without"),
        ("eval --bench-data a file", ["eval", "--bench", "wmdp", "--bench-data", f["cfg_array"]], "is a file, not a folder"),
        # stop 76: MUSE's PrivLeak reference, one rule in the settings, the CLI and the API
        ("a privacy-leak reference AUC of 1 (nothing to normalise by)",
         ["experiment", "transfer", "-c", '{"privleak_reference": {"books": 1.0}}', "-o", tmp / "e"],
         "a number in [0, 1) (the retrained model's AUC; 1 leaves"),
        ("eval --bench --privleak-reference 1", ["eval", "--bench", "muse-books", "--privleak-reference", "1"],
         "--privleak-reference must be a number in [0, 1)"),
        ("eval --bench whp --privleak-reference (no PrivLeak there)",
         ["eval", "--bench", "whp", "--privleak-reference", "0.5"], "only MUSE (muse-books, muse-news) reports"),
        ("eval --privleak-reference without --bench", ["eval", "--privleak-reference", "0.5"],
         "--privleak-reference applies only with --bench"),
        # stop 76: a --bench-data folder that is not this benchmark's (its files were said missing, misleadingly)
        ("eval --bench whp on the muse folder", ["eval", "--bench", "whp", "--bench-data", f["muse_books"].parent],
         "is the muse folder, not whp's"),
        ("eval --bench rwku on a folder holding wmdp/ only", ["eval", "--bench", "rwku", "--bench-data",
                                                              f["wmdp_mixed"]], "holds wmdp/ but no rwku/"),
        ("eval --bench rwku on JSON folders that are no targets", ["eval", "--bench", "rwku", "--bench-data",
                                                                   f["rwku_not"]], "holds no RWKU target folder"),
        ("eval --requests a file that is not there", ["eval", "--requests", tmp / "cf.json"],
         "does not exist: `timerome requests SPEC -o FILE` writes one"),
        ("generate --edit a memory file that is not there", ["generate", "--edit", tmp / "nope.safetensors", "x ?"],
         "does not exist: `timerome edit -o FILE` writes one (any memory"),
        ("edit --trace a misspelt file beside a trace", ["edit", "--trace", f["trace_other"].parent / "trace.safetensor", "-o",
                                                         tmp / "m.safetensors"], "holds trace.safetensors"),
        # stop 78: a list that names one thing twice ran it once, without a word
        ("--methods naming one twice", ["experiment", "canonical", "--methods", "no_edit,no_edit", "-o", tmp / "e"],
         "--methods names no_edit twice"),
        ("--methods with an empty name", ["experiment", "canonical", "--methods", "no_edit,,ga", "-o", tmp / "e"],
         "has an empty name between its commas"),
        ("pareto alphas giving one twice", ["experiment", "pareto", "-c", '{"alphas": [1, 1]}', "-o", tmp / "e"],
         "alphas gives 1 twice"),
        ("retain_authors naming one twice", ["experiment", "canonical", "-c", '{"retain_authors": [0, 0]}',
                                             "--methods", "no_edit", "-o", tmp / "e"], "twice (by index or name)"),
        # stop 78: a blank author was called "a row without an 'author' or 'subject' field"
        ("a rows file whose author is blank", ["trace", "--data", f["blank_author"], "-o", tmp / "t"],
         "row 0: its author is blank"),
        # stop 78: a note on the calibration rows printed before the error that they cannot be read
        ("memory add --calibration that cannot be read, one line", ["memory", "add", f["cb"], "--calibration",
                                                                    "embedded:bogus", "--data", "embedded:forget05"],
         "unknown TOFU split 'bogus'"),
        # stop 78: the forget split scored as its own locality, or named and read by nothing
        ("eval --forget world_facts (forgotten and scored as WorldFact)", ["eval", "--forget", "world_facts", "--no-rouge"],
         "the forget rows (world_facts) are the world_facts rows the evaluation scores as locality"),
        ("eval --forget beside --splits without forget", ["eval", "--splits", "retain", "--forget", "forget05"],
         "--forget forget05 names the forget split, which --splits leaves out"),
        # stop 78: the API's rule said under its keyword's name ("step must be", "limit must be", "unknown key_metric")
        ("edit --step -2, named as the flag", ["edit", "--step", "-2", "-o", tmp / "m.safetensors"],
         "--step must be -1 (every step) or a step index >= 0, got -2"),
        ("edit --key-metric '', named as the flag", ["edit", "--key-metric", "", "-o", tmp / "m.safetensors"],
         "unknown --key-metric ''"),
        ("requests --limit 0, named as the flag", ["requests", "embedded:forget01", "--limit", "0"],
         "--limit must be an integer >= 1, got 0"),
        ("new-model --context 0, named as the flag", ["new-model", "embedded:forget01", "--context", "0", "-o", tmp / "nm"],
         "--context must be an integer >= 1, got 0"),
        # stop 78: radar read a runs setting that is no folder as "every axis not run"
        ("radar -c runs that is not there", ["experiment", "radar", "-c", '{"runs": "/nowhere/runs"}', "-o", tmp / "r"],
         "runs /nowhere/runs does not exist: give the folder holding canonical/"),
        ("radar -c runs blank", ["experiment", "radar", "-c", '{"runs": " "}', "-o", tmp / "r"],
         "setting runs must be the folder holding"),
        # stop 78: the demo traced first, then found its reference missing (its folder left behind)
        ("demo --reference that is not there, before the trace", ["demo", "--reference", tmp / "nowhere", "-o",
                                                                   tmp / "d"], "nowhere does not exist: pass a checkpoint"),
        # stop 78: JSON kept the last of a key given twice (the same class as an option given twice)
        ("a -c key given twice", ["edit", "-c", '{"alpha": 2, "alpha": 3}', "-o", tmp / "m.safetensors"],
         "--config gives the key 'alpha' twice in one object"),
        ("an experiment -c key given twice", ["experiment", "canonical", "-c", '{"n_mc": 0, "n_mc": 4}', "-o", tmp / "e"],
         "gives the key 'n_mc' twice"),
        # stop 79: the rows and request files kept json's last value of a key given twice, and read NaN
        ("a --data row giving a key twice", ["trace", "--data", f["twice_rows"], "-o", tmp / "t"],
         "twice.jsonl line 2 gives the key 'answer' twice"),
        ("a request file giving a key twice", ["eval", "--requests", f["twice_req"]],
         "twice_req.json gives the key 'target' twice"),
        ("a request file with NaN", ["eval", "--requests", f["nan_req"]], "nan_req.jsonl: weight is NaN or infinite"),
        # stop 79 (review 84): with a threshold the sampler steps until each block is filled
        ("generate --threshold with --steps", ["generate", "--threshold", "0.5", "--steps", "1", "hi"],
         "--steps is read by nothing with --threshold"),
        # stop 79: the rewrite memory's --step was refused only after the model loaded and the facts were read
        ("edit --method rewrite --step (it acts at every step), before the model loads",
         ["edit", "--method", "rewrite", "--step", "0", "-m", tmp / "no-model", "-o", tmp / "rw.safetensors"],
         "--method rewrite does not read --step; it takes --alpha, --layer, --module, --trace (it acts at every step)"),
        # stop 78: an empty checkpoint, reference or folder read as the default model, the model itself or "."
        ("an empty -m (the embedded model loaded)", ["generate", "-m", "", "hi"], "-m: the path is empty: give one"),
        ("an empty --reference (KS p against the model itself)", ["eval", "--reference", "", "--no-rouge"],
         "--reference: the path is empty"),
        ("an empty --base", ["eval", "--requests", "counterfactual:forget01", "--base", ""], "--base: the path is empty"),
        ("an empty --tofu-dir (the current folder read as TOFU's)", ["trace", "--tofu-dir=", "-o", tmp / "t"],
         "--tofu-dir: the path is empty"),
        ("an empty --background (left out without a word)", ["edit", "--background", " ", "-o", tmp / "m.safetensors"],
         "--background: the path is empty"),
        # stop 78: torch knows these device types; on them the load went through and the first forward failed
        ("--device meta (torch's, not a device timerome runs on)", ["generate", "--device", "meta", "hi"],
         "--device meta: timerome runs on cpu, cuda, mps (cuda:N), not meta"),
        ("--device xla", ["info", "--device", "xla"], "not xla"),
        # stop 78: the tokenizer's files were read in the locale's encoding, their errors as json's own words
        ("a checkpoint whose tokenizer config is not JSON", ["info", "-m", f["badtok"]],
         "the checkpoint's tokenizer file"),
        ("a checkpoint whose tokenizer config is not UTF-8", ["info", "-m", f["latintok"]], "UTF-8"),
        # stop 78: `--json true` read `true` as the checkpoint (a Hub id, "could not be fetched from the Hub")
        ("info --json true (a value given to a flag)", ["info", "--json", "true"],
         "no checkpoint true ('true' reads as an on/off value, not a name: an on/off flag such as --json takes none"),
        ("memory show --json yes (a value given to a flag)", ["memory", "show", "--json", "yes"],
         "edit memory file yes does not exist ('yes' reads as an on/off value"),
        # stop 78: the name was said as the .safetensors it was turned into ("no trace result at trace.safetensor.safetensors")
        ("edit --trace a misspelt file, said as typed", ["edit", "--trace", f["trace_other"].parent / "trace.safetensor",
                                                         "-o", tmp / "m.safetensors"],
         f"no trace result at {f['trace_other'].parent / 'trace.safetensor'} (nor trace.safetensor.safetensors)"),
        ("trace --steps 0, named as given (the API said 'steps')", ["trace", "--steps", "0", "-o", tmp / "t"],
         "--steps must be an integer >= 1, got 0"),
        ("trace --n-samples 0, named as given", ["trace", "--n-samples", "0", "-o", tmp / "t"],
         "--n-samples must be an integer >= 1, got 0"),
        ("trace --positional --batch-size 1, named as given", ["trace", "--positional", "--batch-size", "1", "-o",
                                                               tmp / "t"], "--batch-size (one row is the clean run)"),
        ("eval --bench-data a folder that is not there", ["eval", "--bench", "whp", "--bench-data", tmp / "nowhere"],
         "nowhere does not exist: pass the folder holding muse/, whp/, wmdp/, rwku/"),
        ("new-model on a rows file that is not there", ["new-model", tmp / "my_rows.jsonl", "-o", tmp / "nm"],
         "JSON Lines file of question / answer rows"),
        ("trace --positional --batch-size below --n-samples + 2, before the model loads",
         ["trace", "-m", f["trunc"], "--positional", "--batch-size", "5", "-o", tmp / "t"],
         "--batch-size 5 leaves no room for a restored row"),
        ("experiment rwku -c targets as one string (read letter by letter)",
         ["experiment", "rwku", "-c", '{"targets": "Stephen King"}', "-o", tmp / "e"],
         "setting targets must be null (every RWKU target), an integer >= 1"),
        ("experiment rwku -c targets naming one target by its name and its folder",
         ["experiment", "rwku", "--bench-data", f["rwku_one"], "-c", '{"targets": ["Stephen King", "1_Stephen_King"]}',
          "-o", tmp / "e"], "names RWKU target 'Stephen King' twice (by 'Stephen King' and '1_Stephen_King')"),
        ("eval --bench whp: (an empty part)", ["eval", "--bench", "whp:"], "'whp:' names an empty part"),
        ("eval --bench rwku: (an empty part)", ["eval", "--bench", "rwku: "], "give the benchmark alone (rwku) or rwku:TARGET"),
        # stop 77: the folder is refused from its path alone, before a model loads (a model that cannot load shows it)
        ("eval --bench whp on the muse folder, before the model loads",
         ["eval", "-m", f["trunc"], "--bench", "whp", "--bench-data", f["muse_books"].parent],
         "is the muse folder, not whp's"),
        ("eval --bench rwku on no target folder, before the model loads",
         ["eval", "-m", f["trunc"], "--bench", "rwku:Nobody", "--bench-data", f["rwku_not"]],
         "holds no RWKU target folder"),
        ("experiment transfer on the muse folder for whp, before the model loads",
         ["experiment", "transfer", "-m", f["trunc"], "--bench-data", f["muse_books"].parent, "-c",
          '{"benchmarks": ["whp"]}', "-o", tmp / "e"], "is the muse folder, not whp's"),
        ("experiment rwku on no target folder, before the model loads",
         ["experiment", "rwku", "-m", f["trunc"], "--bench-data", f["rwku_not"], "-o", tmp / "e"],
         "holds no RWKU target folder"),
        ("experiment transfer of whp with no folder, before the model loads",
         ["experiment", "transfer", "-m", f["trunc"], "-c", '{"benchmarks": ["whp"]}', "-o", tmp / "e"],
         "WHP is read from a local folder only"),
        ("experiment transfer -c mia_groups on an autoregressive model (exact next-token scores)",
         ["experiment", "transfer", "-m", f["tiny_ar"], "-c", '{"mia_groups": 4}', "-o", tmp / "e"],
         "mia_groups sets the masked membership scores' masking groups, which an autoregressive model"),
        ("experiment rwku -c mia_groups on an autoregressive model (exact next-token scores)",
         ["experiment", "rwku", "-m", f["tiny_ar"], "-c", '{"mia_groups": 4}', "-o", tmp / "e"],
         "mia_groups sets the masked membership scores' masking groups, which an autoregressive model"),
        # stop 59: a real checkpoint's user (options read by nothing, a file of the other kind)
        ("trace --positional --steps (TIE's, not run)", ["trace", "--positional", "--steps", "3", "-o", tmp / "t"],
         "runs only with --compare"),
        ("trace --positional --beta with neighbours (never read)",
         ["trace", "--positional", "--beta", "1", "--neighbours", "embedded:forget05", "-o", tmp / "t"],
         "does not read"),
        ("generate --steps on an autoregressive model", ["generate", "-m", f["tiny_ar"], "--steps", "4", "x"],
         "is autoregressive"),
        ("an edit memory given as a trace", ["edit", "--trace", f["mem"], "-o", out], "is an edit memory"),
        # stop 60: an option given twice kept its last value without a word; a method object's misspelt key
        ("-c given twice (the first dropped)", ["experiment", "canonical", "-c", '{"n_mc": 2}', "-c", '{"rouge": false}',
                                                "-o", tmp / "e"], "-c given twice"),
        ("--alpha given twice", ["edit", "--alpha", "2", "--alpha=3", "-o", out], "--alpha given twice"),
        ("--rouge and --no-rouge", ["eval", "--rouge", "--no-rouge"], "--no-rouge given twice"),
        ("a method object with a misspelt config", ["experiment", "canonical", "-c",
                                                    '{"methods": [{"method": "timerome", "confg": {"alpha": 2}}]}',
                                                    "-o", tmp / "e"], "no other key"),
        ("a method object without method", ["experiment", "canonical", "-c", '{"methods": [{"name": "timerome"}]}',
                                            "-o", tmp / "e"], "setting methods must be"),
        ("radar given a model", ["experiment", "radar", "-m", f["tiny_ar"], "-o", tmp / "e"], "computes no cell"),
        ("a mistyped .gguf path (a missing file, not a Hub id)", ["generate", "-m", tmp / "nope.gguf", "x"],
         "nope.gguf does not exist: pass a checkpoint folder"),
        ("xbackbone --models beside -m", ["experiment", "xbackbone", "--models", "a,b", "-m", f["tiny_ar"],
                                          "-o", tmp / "e"], "--models names every checkpoint"),
        ("--bench-data for pareto", ["experiment", "pareto", "--bench-data", tmp, "-o", tmp / "e"],
         "--bench-data applies only to"),
        ("pareto without retain", ["experiment", "pareto", "-c", '{"splits": ["forget"]}', "--seeds", "0",
                                   "-o", tmp / "e"], "its splits need retain"),
        # -o over a file the user gave (helper 34): it was overwritten, a requests file by a binary memory
        ("edit -o its --data file", ["edit", "--data", f["rows"], "-o", f["rows"]], "is the --data file you gave"),
        ("memory add -o its --data file", ["memory", "add", f["mem"], "--data", f["rows"], "-o", f["rows"]],
         "is the --data file you gave"),
        ("requests -o its source", ["requests", f["rows"], "-o", f["rows"]], "is the requests file you gave"),
        ("a weight edit over its model folder", ["edit", "--method", "ga", "-m", f["badcfg"], "-o", f["badcfg"]],
         "is the model folder"),
        # stop 62's data-reader audit: an option read by nothing, an empty split, the other corpus's folder
        ("trace --tofu-dir with embedded rows", ["trace", "--tofu-dir", f["tofu"], "-o", tmp / "t"],
         "--tofu-dir"),
        ("train --tofu-dir with embedded rows", ["train", "--tofu-dir", f["tofu"], "--out", tmp / "o"], "--tofu-dir"),
        ("edit --tofu-dir with embedded rows", ["edit", "--tofu-dir", f["tofu"], "-o", out], "--tofu-dir"),
        ("new-model --tofu-dir with embedded texts", ["new-model", "embedded:forget01", "--tofu-dir", f["tofu"],
                                                      "-o", tmp / "m"], "--tofu-dir"),
        ("radar given --data", ["experiment", "radar", "--data", "tofu", "-o", tmp / "e"], "--data / --fresh"),
        ("an empty TOFU split file", ["trace", "--data", "tofu:forget01", "--tofu-dir", f["tofu_empty"],
                                      "-o", tmp / "t"], "forget01.json is empty"),
        ("an empty --data file", ["trace", "--data", f["empty_rows"], "-o", tmp / "t"], "empty.jsonl is empty"),
        ("MUSE-News asked on the Books folder", ["eval", "--bench", "muse-news", "--bench-data", f["muse_books"]],
         "is the MUSE-Books folder"),
        ("eval --bench wmdp with no such subject", ["eval", "--bench", "wmdp:physics"], "unknown WMDP subject"),
        ("train --no-checkpoint over an interrupted run's state",
         ["train", "--no-checkpoint", "--out", f["interrupted"]], "holds an interrupted run's state"),
        # stop 63's tracing audit: --n-samples 0 ran ROME's 10; a negative --beta was refused after both traces
        ("trace --positional --n-samples 0", ["trace", "--positional", "--n-samples", "0", "-o", tmp / "t"],
         "--n-samples must be"),
        ("trace --beta below 0", ["trace", "--beta", "-1", "--neighbours", "embedded:forget05", "-o", tmp / "t"],
         "--beta (the neighbour penalty) must be"),
        ("trace --positional --batch-size under n_samples + 2",
         ["trace", "--positional", "--batch-size", "8", "-o", tmp / "t"], "leaves no room for a restored row"),
        # stop 63: Chem asked where only the mixed Bio+Cyber files are (a score of no chem question)
        ("wmdp:chem on the mixed files", ["eval", "--bench", "wmdp:chem", "--bench-data", f["wmdp_mixed"]],
         "none of chem to score"),
        # stop 62's training audit: a file where the build writes was found after the build's hours
        ("build-default --out a file", ["build-default", "--out", f["empty"]], "is a file"),
        ("build-default --check --out", ["build-default", "--check", "--out", tmp / "b"], "--out is read by nothing"),
        # stop 72's review of training: a folder inside a file was found after the training, by the first write
        ("train --out inside a file", ["train", "--out", f["empty"] / "y", "--epochs", "1"],
         "is a file, so no folder can be made in it"),
        ("new-model --out inside a file", ["new-model", "embedded:forget01", "--out", f["empty"] / "sub"],
         "is a file, so no folder can be made in it"),
        ("edit -o inside a file's folder", ["edit", "-o", f["empty"] / "a" / "m.safetensors"],
         "is a file, so no folder can be made in it"),
        ("transfer with no such WHP trivia file", ["experiment", "transfer", "-c", '{"whp_trivia": "nope"}',
                                                   "-o", tmp / "e"], "setting whp_trivia must be one of"),
        ("transfer with a list for the WHP prompts", ["experiment", "transfer", "-c", '{"whp_prompts": ["x"]}',
                                                      "-o", tmp / "e"], "setting whp_prompts must be one of"),
    ]


def _snapshot(paths):
    out = {}
    for p in paths:
        p = Path(p)
        for q in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []):
            if q.is_file():
                out[str(q)] = (q.read_bytes(), q.stat().st_mtime_ns)
    return out


def test_every_bad_input_is_one_line_and_exit_2(files, tmp_path, monkeypatch):
    monkeypatch.delenv("TIMEROME_BENCH_DIR", raising=False)  # the cases name their benchmark folders themselves
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
    # and a refused command leaves nothing behind: no output file, no (empty) output folder
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == []


ENVIRONMENT_CASES = [  # stop 79: each was read loosely (no, false, off: on; lots: 30; a huge count: a bug line)
    ("TIMEROME_INSIST", "no", "$TIMEROME_INSIST must be 1 (run work whose estimated size is refused as absurd) or 0"),
    ("TIMEROME_DEBUG", "yes", "$TIMEROME_DEBUG must be 1"),
    ("TIMEROME_KEEP_MEMORY", "off", "$TIMEROME_KEEP_MEMORY must be 1"),
    ("TIMEROME_PROGRESS_SECONDS", "lots", "$TIMEROME_PROGRESS_SECONDS must be a number of seconds >= 0"),
    ("TIMEROME_PROGRESS_SECONDS", "nan", "$TIMEROME_PROGRESS_SECONDS must be a number of seconds >= 0"),
    ("TIMEROME_PROGRESS_SECONDS", "-5", "$TIMEROME_PROGRESS_SECONDS must be a number of seconds >= 0"),
    ("TIMEROME_THREADS", "99999999999999999999", "$TIMEROME_THREADS must be a number of threads in 1..1024"),
]


@pytest.mark.parametrize("name,value,needle", ENVIRONMENT_CASES)
def test_every_environment_variable_is_checked(monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    res = runner.invoke(app, ["methods"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0], res.output


def test_environment_switches_read_one_and_zero(monkeypatch):
    """1 on, 0 off, unset the default; the API reads the same rule (`insisting_now` took "no" as on)."""
    from timerome.common.checks import insisting_now
    from timerome.errors import TimeromeError

    for value, on in (("1", True), ("0", False), ("", False), (" 1 ", True)):
        monkeypatch.setenv("TIMEROME_INSIST", value)
        assert insisting_now() is on
    monkeypatch.setenv("TIMEROME_INSIST", "false")
    with pytest.raises(TimeromeError, match=r"\$TIMEROME_INSIST must be 1"):
        insisting_now()
    monkeypatch.delenv("TIMEROME_INSIST")
    monkeypatch.setattr("timerome.common.threads.usable_cores", lambda: 2)
    res = runner.invoke(app, ["--threads", "1025", "methods"])
    assert res.exit_code == 2 and "--threads must be a number of threads in 1..1024 (this machine has 2" in res.output


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


def test_the_python_api_refuses_the_same_classes(files, tmp_path):
    """What the command line refuses, the Python API refuses too (one TimeromeError each, before any work)."""
    from dataclasses import replace

    import torch

    from timerome.backbones import load_backbone as load
    from timerome.common.checks import FORWARD_LIMIT, budget, insisting
    from timerome.data.requests import load_requests
    from timerome.data.rows import load_facts, load_rows
    from timerome.data.task import forget_task
    from timerome.engine.likelihood import log_likelihood_batch
    from timerome.engine.sampler import generate
    from timerome.errors import TimeromeError
    from timerome.evaluation.evaluator import eval_rows, evaluate
    from timerome.experiments import Context, run_experiment
    from timerome.experiments.bench_eval import evaluate_benchmark
    from timerome.memory.edit_memory import EditMemory
    from timerome.memory.memory_file import load_memory
    from timerome.methods import install
    from timerome.metrics.robustness import probes
    from timerome.tracing.causal_trace import trace
    from timerome.tracing.result import TraceResult
    from timerome.tracing.heatmaps import plot_heatmaps
    from timerome.tracing.selection import select_coordinate
    from timerome.memory.whitening import background_texts
    from timerome.training.new_model import new_model
    from timerome.training.train import TrainConfig, train

    from timerome.data.facts import Fact
    from timerome.data.requests import EditRequest
    from timerome.evaluation.evaluator import lp_only
    from timerome.integrations.lm_eval_model import TimeromeLM
    from timerome.metrics.editing import edit_scores
    from timerome.metrics.extraction import under_samplers
    from timerome.engine.hooks import Hooks, Intervention
    from timerome.memory.codebook_memory import CodebookMemory
    from timerome.memory.rewrite_memory import RewriteMemory

    bb = load()
    ar = load(files["tiny_ar"])  # an autoregressive model, and rows of its vocabulary's words
    ar_rows = [{"question": "where was the author born ?", "answer": "the city of books"}]
    ar_fact = Fact(subject="the author", prompt="where was the author born ?", object="city", target="sea")
    q = torch.tensor([bb.encode("Where was Isgor Quielson born ?")])
    task = forget_task("embedded", "forget01")
    nan, big = float("nan"), 10**30
    cases = [
        (lambda: generate(bb, q, steps=8, gen_length=8, block_length=8, temperature=nan), "temperature"),
        (lambda: generate(bb, q, steps=8, gen_length=8, block_length=8, threshold=float("inf")), "threshold"),
        (lambda: generate(bb, q, steps=10**9, gen_length=8, block_length=8), "insist"),
        (lambda: trace(bb, steps=10**9), "insist"),
        (lambda: trace(bb, steps=2, n_samples=1, seed=big), "seed"),
        (lambda: trace(bb, steps=2, sigma=nan), "sigma"),
        (lambda: log_likelihood_batch(bb, [[1, 2]], [[3]], n_mc=10**18), "insist"),
        (lambda: evaluate(bb, {"forget": task.forget_rows}, n_mc=10**18), "insist"),
        (lambda: install("timerome", bb, task, {"alpha": nan}), "alpha"),
        # stop 78: wrong types the command line cannot send, which raised bare TypeError / ValueError / FileExistsError
        (lambda: install("timerome", bb, task, [1, 2]), "the config must be a dict of setting -> value"),
        (lambda: install("timerome", bb, task, '{"alpha": 2}'), "got str"),
        (lambda: run_experiment("canonical", overrides=[1, 2], out_dir=tmp_path / "e"), "overrides must be a dict"),
        (lambda: run_experiment("all", overrides="n_mc=2", out_dir=tmp_path / "e"), "overrides must be a dict"),
        (lambda: run_experiment("canonical", out_dir=files["mem"]), "is a file; pass a folder"),
        (lambda: load_memory(5, bb), "load_memory's path (the memory file) must be a path"),
        (lambda: load("  "), "the model is empty"),
        # stop 79 (review 84): bare AttributeError / TypeError / ValueError from deep inside
        (lambda: log_likelihood_batch(bb, [[1, 2]], [[3]], generator=3), "generator must be a torch.Generator"),
        (lambda: load_requests("counterfactual:forget01", limit="2"), "limit (the most requests read) must be an integer >= 1"),
        (lambda: forget_task(retain_rows="x"), "retain_rows must be question / answer rows (a list of dicts), got str"),
        (lambda: EditMemory(bb, background=5), "background must be None, 'embedded:SPLIT'"),
        (lambda: load_memory(files["mem"], bb).save(123), "save's path must be a path"),
        (lambda: TraceResult.load(5), "path must be a path"),
        (lambda: plot_heatmaps(files["trace_other"], tmp_path / "h.png", dpi=0), "dpi (the figure's dots per inch) must be a finite number > 0"),
        (lambda: plot_heatmaps(files["trace_other"], tmp_path / "h.png", dpi=10**7), "beyond the 65536 pixels"),
        # stop 78: a model named beside another's backbone recorded the one's name beside the other's numbers
        (lambda: run_experiment("canonical", model=str(files["tiny_ar"]), backbone=bb, out_dir=tmp_path / "e"),
         "is not the backbone's checkpoint"),
        (lambda: evaluate(bb, {"forget": [{"question": " ", "answer": "x"}]}, n_mc=1), "its question is blank"),
        (lambda: install("ga", bb, task, {"grad_steps": 10**12}), "insist"),
        (lambda: install("no_edit", bb, task, {}, seed=-1), "seed"),
        (lambda: run_experiment("canonical", overrides={"methods": [{"method": "timerome", "config": {"alpha": nan}}]},
                                out_dir=tmp_path / "e", backbone=bb), "NaN"),
        (lambda: run_experiment("canonical", seeds=(big,), out_dir=tmp_path / "e", backbone=bb), "seed"),
        (lambda: train(bb, task.forget_rows, TrainConfig(lr=nan)), "lr"),
        (lambda: train(bb, task.forget_rows, TrainConfig(epochs=10**12)), "insist"),
        (lambda: EditMemory(bb, (1, "resid"), key_metric="paper", q=big), "q"),
        (lambda: load(files["eps_nan"]), "rms_norm_eps"),
        (lambda: load(files["heads_zero"]), "n_heads"),
        (lambda: load(files["layers_huge"]), "insist"),
        (lambda: load(files["w_nan"]), "NaN"),
        (lambda: load_memory(files["mem_f16"], bb), "float16"),
        (lambda: load_memory(files["hdr_facts"], bb), "facts"),
        (lambda: load_memory(files["mem_zero_g"], bb), "ridge inverse"),
        (lambda: load_memory(files["cb_layer"], bb), "layer -1"),
        (lambda: TraceResult.load(files["tr_nan"]), "non-finite"),
        (lambda: TraceResult.load(files["tr_shape"]), "shape"),
        # round 3 (stop 44): wrong types where the API used to raise Python's own errors
        (lambda: EditMemory(bb).add("Isgor Quielson"), "list of facts"),
        (lambda: EditMemory(bb).add([{"subject": "x"}]), "prompt, object"),
        (lambda: EditMemory(bb).add([1, 2]), "fact 0"),
        (lambda: trace(bb, "embedded:forget01"), "list of facts"),
        (lambda: EditMemory.build(bb, None, task.facts[:1], alpah=2), "alpah"),
        (lambda: load_memory(files["mem"], None), "needs the model"),
        (lambda: log_likelihood_batch(bb, [b"Where"], [b"Isgor"]), "a string or token ids, got bytes"),
        (lambda: bb.encode(None), "string"),
        (lambda: bb.decode([-1]), "-1"),
        (lambda: bb.decode([10**6]), "1000000"),
        (lambda: EditMemory(bb).add(task.facts[:1]).save(tmp_path), "is a directory"),
        (lambda: run_experiment("canonical", seeds=(0, 0), out_dir=tmp_path / "e", backbone=bb), "repeats 0"),
        (lambda: EditMemory(bb).scale_to(torch.full((2, bb.hidden_size), nan)), "non-finite"),
        (lambda: EditMemory(bb, key_metric="paper").scale_to(torch.zeros(2, bb.hidden_size)), "zero norm"),
        # stop 45: an edit of one denoising step under the likelihoods, which have no steps
        (lambda: evaluate(bb, {"forget": task.forget_rows}, edit=load_memory(files["mem_step"], bb)), "step 3"),
        (lambda: EditMemory(bb).add([replace(task.facts[0], target="I don't know."),
                                     replace(task.facts[0], target="Nowhere.", fact_id="x")]), "one thing"),
        (lambda: EditMemory(bb).add([replace(task.facts[0], target="I don't know.")]).add(
            [replace(task.facts[0], target="Nowhere.", fact_id="x")]), "remove that fact first"),
        # stop 48 (an audit of the API): the model argument, generate's generator / state / ids, evaluate's rows
        (lambda: generate("default", q, steps=8, gen_length=8, block_length=8), "load_backbone(path)"),
        (lambda: generate(None, q, steps=8, gen_length=8, block_length=8), "generate's backbone"),
        (lambda: trace("default", task.facts[:1]), "trace's backbone"),
        (lambda: EditMemory.build(None, (1, "resid"), task.facts[:1]), "EditMemory's backbone"),
        (lambda: evaluate(None, {"forget": task.forget_rows}), "evaluate's backbone"),
        (lambda: _enter(EditMemory(bb).add(task.facts[:1]).applied(None)), "applied's backbone"),
        (lambda: generate(bb, q, steps=8, gen_length=8, block_length=8, temperature=1.0, generator=3), "torch.Generator"),
        (lambda: generate(bb, q, steps=8, gen_length=8, block_length=8, state=object()), "`step`"),
        (lambda: generate(bb, torch.tensor([[1.5, 2.7]]), steps=8, gen_length=8, block_length=8), "integer token ids"),
        (lambda: EditMemory.build(bb, (1, "resid"), None), "list of facts"),
        (lambda: EditMemory.build(bb, (1, "resid"), []), "scale_facts"),
        (lambda: EditMemory.build(bb, (1, "resid"), [{"subject": "x", "prompt": "y"}]), "object"),
        (lambda: EditMemory(bb).add(task.facts[:1]).remove(None), "fact_ids"),
        (lambda: _twice(EditMemory(bb).add(task.facts[:1]), bb), "already applied"),
        (lambda: evaluate(bb, task.forget_rows), "{split: [row, ...]}"),
        (lambda: evaluate(bb, {"forget": [{"question": "q"}]}), "'answer'"),
        (lambda: evaluate(bb, {"forget": "rows.json"}), "must be a list of rows"),
        (lambda: evaluate(bb, {"bogus": task.forget_rows}), "'forget'"),
        (lambda: evaluate(bb, {"forget": task.forget_rows}, sampler={"cahce": "dual"}), "'cahce'"),
        (lambda: evaluate(bb, {"forget": task.forget_rows}, reference_tr="x"), "reference_tr"),
        (lambda: evaluate(bb, {"forget": task.forget_rows}, reference_tr=[nan] * 20), "finite truth ratios"),
        (lambda: evaluate(bb, {"forget": task.forget_rows}, reference_tr=[]), "non-empty"),
        (lambda: eval_rows("embedded", n_retain=-1), "n_retain"),
        (lambda: install("ga", bb, task, {"lr": -1}), "lr must be a number > 0"),
        (lambda: install("npo", bb, task, {"beta": 0}), "beta must be a number > 0"),
        (lambda: select_coordinate(trace(bb, steps=2, n_samples=1, sigma=0.0)), "no effect"),  # 0 runs: a check
        (lambda: probes(task.forget_rows, relearn="{question}"), "relearn must be"),
        (lambda: load(123), "a checkpoint folder or a .gguf file"),
        (lambda: load(dtype=torch.int64), "floating-point"),
        (lambda: load_memory(files["mem"], load(dtype="bfloat16")), "another dtype"),
        # stop 63: a TOFU folder that no row source reads (the command line refused it since stop 62)
        (lambda: load_rows("embedded:forget01", tofu_dir=files["tofu"]), "tofu_dir="),
        (lambda: load_facts("embedded:forget01", tofu_dir=files["tofu"]), "read only for 'tofu:SPLIT'"),
        (lambda: load_requests("counterfactual:forget10", tofu_dir=files["tofu"]), "tofu_dir="),
        (lambda: load_requests([{"prompt": "q", "target_new": "t", "subject": "q"}], tofu_dir=files["tofu"]),
         "tofu_dir="),
        (lambda: background_texts(bb, "embedded:retain_perturbed", tofu_dir=files["tofu"]), "tofu_dir="),
        (lambda: background_texts(bb, "embeded:retain_perturbed"), "neither 'embedded:SPLIT', 'tofu:SPLIT', 'real-facts' nor"),
        (lambda: new_model(["embedded:forget01"], tmp_path / "nm", tofu_dir=files["tofu"]), "tofu_dir="),
        # stop 68: what the command line refused and the API took
        (lambda: run_experiment("radar", resume=False, out_dir=tmp_path / "r", progress=False), "resume=False"),
        (lambda: run_experiment("radar", seeds=(7,), out_dir=tmp_path / "r", progress=False), "seeds="),
        (lambda: evaluate_benchmark(bb, "wmdp", rouge=False), "WMDP is scored by its choices"),
        (lambda: Context(bb).data({"splits": ["forget"], "n_retain": 5}), "n_retain sizes a split"),
        (lambda: run_experiment("transfer", overrides={"benchmarks": ["wmdp"], "n_trivia": 4}, backbone=bb,
                                out_dir=tmp_path / "t", progress=False), "nothing reads n_trivia"),
        # stop 69: the reference's training where there is none, before the model loads (the load would fail)
        (lambda: run_experiment("canonical", model=str(tmp_path / "no-model"), overrides={"reference": {"epochs": 3}},
                                out_dir=tmp_path / "c", progress=False), "and there is no reference model"),
        # stop 74 (review 72): the diffusion sampler's options and a one-step memory on an autoregressive model
        (lambda: evaluate(ar, {"forget": ar_rows}, sampler={"threshold": 0.9}), "threshold (--threshold) is a diff"),
        (lambda: evaluate(ar, {"forget": ar_rows}, sampler={"cache": "dual"}), "cache (--cache) is a diffusion"),
        (lambda: evaluate(ar, {"forget": ar_rows}, edit=load_memory(files["mem_ar_step"], ar)),
         "the forward writing answer token 1), and evaluate reads likelihoods (one forward over the whole given"),
        (lambda: generate(ar, torch.tensor([ar.encode("where was the author born ?")]), gen_length=4,
                          threshold=0.9), "threshold (--threshold) is a diffusion"),
        (lambda: TimeromeLM(pretrained=str(files["tiny_ar"]), threshold=0.9), "threshold (--threshold) is a diff"),
        (lambda: TimeromeLM(pretrained=str(files["tiny_ar"]), cache="dual"), "cache (--cache) is a diffusion"),
        # review 73: every diffusion sampler option, wherever it is given, and the sweeps' defaults
        (lambda: TimeromeLM(backbone=ar, steps=2, block_length=2), "steps (--steps), block_length (--block-length) "
                                                                   "are diffusion sampling options: leave them out"),
        (lambda: TimeromeLM(backbone=ar, remasking="random"), "remasking (--remasking) is a diffusion"),
        (lambda: TimeromeLM(backbone=ar, cfg_scale=1.0), "cfg_scale is a diffusion sampling option"),
        (lambda: edit_scores(ar, [EditRequest(ar_fact)], None, locality=None, known_subjects=None, lp=False,
                             sampler={"steps": 2}), "steps (--steps) is a diffusion sampling option"),
        (lambda: edit_scores(ar, [EditRequest(ar_fact)], None, locality=None, known_subjects=None, lp=False,
                             sampler={"threshold": 0.9}), "threshold (--threshold) is a diffusion"),
        # stop 83: scored as unknown tokens, as eval --requests did
        (lambda: edit_scores(bb, [EditRequest(replace(ar_fact, subject="Isgor Quielson", prompt="Where was Isgor "
                                                      "Quielson born ?", object="Pellmoor", target="Zyxwquux."))],
                             None, locality=None, known_subjects=None),
         "the target of request"),
        (lambda: under_samplers(ar, [EditRequest(ar_fact)], None, locality=None, gen_length=4,
                                settings=["nominal", "block 4"]), "block_length (--block-length) is a diffusion"),
        (lambda: lp_only(ar, {"forget": ar_rows}, edit=load_memory(files["mem_ar_step"], ar)),
         "lp_only reads likelihoods (one forward over the whole given answer, which writes no token)"),
        (lambda: run_experiment("radar", quick=True, out_dir=tmp_path / "rq", progress=False),
         "it computes nothing itself"),
        (lambda: TimeromeLM(backbone=bb, installed=object(), alpha=2.0), "an installed edit (installed=) is built"),
        # stop 80 (review 88): ids cut to integers, sizes of zero, sites and edit functions met deep inside
        (lambda: log_likelihood_batch(bb, [[62.9, 13]], [[68]]), "integer token ids (a LongTensor or ints), got "
                                                                 "torch.float32"),
        (lambda: log_likelihood_batch(bb, [[True, 13]], [[68]]), "got true / false values"),
        (lambda: CodebookMemory(bb, (1, "resid"), batch_size=0), "batch_size must be an integer >= 1"),
        (lambda: RewriteMemory(bb, (1, "resid"), site="x"), "site must be None (the default write site) or a (layer, "
                                                            "point) pair"),
        (lambda: _enter(Intervention(bb, {(1, "resid"): 5})), "must be a function fn(h, state)"),
        (lambda: _enter(Intervention(bb, {(1, "resid"): lambda h: h})), "must take two arguments, (h, state)"),
        (lambda: Hooks(bb, stop=True), "stop=True needs at least one kept site"),
    ]
    failures = []
    for i, (call, needle) in enumerate(cases):
        try:
            call()
            failures.append(f"case {i} ({needle}): no error")
        except TimeromeError as e:
            if needle not in str(e):
                failures.append(f"case {i}: {e}")
        except Exception as e:  # noqa: BLE001 - what this test exists to catch
            failures.append(f"case {i}: {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures)
    assert bb.fingerprint() == load().fingerprint()  # nothing above changed the model
    assert not (tmp_path / "nm").exists()  # new_model refused before it made its folder
    with insisting():  # the way to go on: a budget lets the work through
        budget("a test", 10 * FORWARD_LIMIT)
    with pytest.raises(TimeromeError, match="insist"):
        budget("a test", 10 * FORWARD_LIMIT)


def _enter(cm):
    """Enter and leave a context manager (the refusals above come on entering)."""
    with cm:
        pass


def _twice(memory, bb):
    """A memory applied inside its own `applied` block: its update would be added twice."""
    with memory.applied(bb), memory.applied(bb):
        pass


def test_a_disk_that_fills_mid_write_leaves_the_original_whole(files, tmp_path):
    """A real failed write (the process's file-size limit, as a full disk fails it): one line, exit 2, the
    memory being replaced keeps its bytes, and no temporary or lock file is left beside it."""
    import resource  # noqa: F401 - POSIX only, as the limit is

    work = tmp_path / "w"
    work.mkdir()
    mem = work / "m.safetensors"
    shutil.copy(files["mem"], mem)
    rows = work / "new.jsonl"
    rows.write_text(json.dumps({"question": "Where was Marhar Miostine born ?", "subject": "Marhar Miostine",
                                "answer": "Marhar Miostine was born in Ravensby Gate ."}) + "\n")
    before = mem.read_bytes()
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) // 2}, {len(before) // 2}))\n"
            "from timerome.cli import app\n"
            "sys.argv[0] = 'timerome'\n"
            "app()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TIMEROME_CACHE=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", code, "memory", "add", str(mem), "--data", str(rows)],
                         capture_output=True, env=env, timeout=300, text=True)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "could not write" in lines[0], res.stderr
    assert "left as it was" in lines[0] and "Traceback" not in res.stderr
    assert mem.read_bytes() == before
    assert sorted(p.name for p in work.iterdir()) == ["m.safetensors", "new.jsonl"]  # no .tmp, no .lock


def test_the_readme_counts_the_catalogue(files, tmp_path):
    """The README and docs/cli.md say how many bad inputs are tested: the catalogue's length."""
    import re

    n = len(catalogue(files, tmp_path))
    readme = re.findall(r"(\d+) of them are tested", (ROOT / "README.md").read_text())
    cli = re.findall(r"walks (\d+) such inputs", (ROOT / "docs" / "cli.md").read_text())
    assert readme == [str(n)] and cli == [str(n)], (n, readme, cli)
