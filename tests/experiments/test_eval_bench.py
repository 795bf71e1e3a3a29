"""`timerome eval --bench` / `timerome.evaluate_benchmark`: a saved edit memory scored on a benchmark
reads the numbers the transfer experiment gives the same memory installed as its method."""

import json
import warnings

import pytest
from bench_models import BENCH, needs_bench
from typer.testing import CliRunner

import timerome
from timerome.backbones import load_backbone
from timerome.cli import app
from timerome.errors import TimeromeError
from timerome.experiments import run_experiment
from timerome.experiments.runner import Context
from timerome.methods import install

TIMEROME_AT_LAYER_1 = {"method": "timerome", "config": {"coordinate": [1, "resid"]}}
ROW = "timerome (coordinate=[1, 'resid'])"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    warnings.simplefilter("ignore", UserWarning)


@pytest.fixture(scope="module")
def bb():
    return load_backbone(None)


@pytest.fixture(scope="module")
def saved(bb, tmp_path_factory):
    """The transfer experiment's TimeROME memory (TOFU forget01, layer 1 resid, seed 0), saved."""
    _, task = Context(bb).data({"forget": "forget01", "splits": ["forget"]})
    edit = install("timerome", bb, task, TIMEROME_AT_LAYER_1["config"], 0)
    path = tmp_path_factory.mktemp("mem") / "transfer.safetensors"
    edit.memory.save(path)
    edit.undo()
    return path


@needs_bench
def test_a_saved_memory_reads_the_transfer_experiments_numbers(bb, saved, tmp_path):
    over = dict(bench_dir=str(BENCH), benchmarks=["whp", "wmdp"], own=False, rouge=False, n_mc=2, n_trivia=4,
                n_wmdp=4, methods=["no_edit", TIMEROME_AT_LAYER_1])
    res = run_experiment("transfer", seeds=(0,), out_dir=tmp_path / "t", overrides=over, progress=False, backbone=bb)
    for bench, group, col, split in (("whp", "whp|tofu", "WHP_LP", "trivia"),
                                     ("wmdp", "wmdp|tofu", "WMDP_AccChoice", "wmdp")):
        rouge = bench == "wmdp"  # WMDP generates nothing either way, and refuses rouge=False
        plain = timerome.evaluate_benchmark(bb, bench, bench_data=BENCH, limit=4, n_mc=2, rouge=rouge)
        edited = timerome.evaluate_benchmark(bb, bench, bench_data=BENCH, limit=4, n_mc=2, rouge=rouge,
                                             edit=saved)
        assert plain["metrics"][col] == res["summary"][group]["no_edit"][col]["mean"]
        assert edited["metrics"][col] == res["summary"][group][ROW][col]["mean"]
        assert plain["n_items"][split] == 4
    whp_plain = timerome.evaluate_benchmark(bb, "whp", bench_data=BENCH, limit=4, n_mc=2, rouge=False)
    whp_edit = timerome.evaluate_benchmark(bb, "whp", bench_data=BENCH, limit=4, n_mc=2, rouge=False, edit=saved)
    assert whp_edit["metrics"]["WHP_LP"] != whp_plain["metrics"]["WHP_LP"]
    # a method installed by the caller reads the same as its saved memory
    _, task = Context(bb).data({"forget": "forget01", "splits": ["forget"]})
    installed = install("timerome", bb, task, TIMEROME_AT_LAYER_1["config"], 0)
    try:
        live = timerome.evaluate_benchmark(bb, "whp", bench_data=BENCH, limit=4, n_mc=2, rouge=False, edit=installed)
    finally:
        installed.undo()
    assert live["metrics"] == whp_edit["metrics"]
    # the memory was applied while scoring only: the model reads as before afterwards
    again = timerome.evaluate_benchmark(bb, "whp", bench_data=BENCH, limit=4, n_mc=2, rouge=False)
    assert again["metrics"] == whp_plain["metrics"]
    # what the data held is said (the embedded vocabulary does not know these words; WMDP's letters)
    wmdp = timerome.evaluate_benchmark(bb, "wmdp", bench_data=BENCH, limit=4, n_mc=2)
    assert "WMDP_Acc" not in wmdp["metrics"] and any("WMDP_Acc not scored" in n for n in wmdp["notes"])
    assert any("its numbers mean nothing" in n for n in wmdp["notes"])


@needs_bench
def test_eval_bench_cli_prints_the_api_numbers(bb, saved):
    want = timerome.evaluate_benchmark(bb, "rwku", bench_data=BENCH, limit=2, n_mc=2, rouge=False, edit=saved)
    res = CliRunner().invoke(app, ["eval", "--bench", "rwku", "--bench-data", str(BENCH), "--limit", "2", "--n-mc",
                                   "2", "--no-rouge", "--edit", str(saved), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["metrics"] == want["metrics"] and got["bench"] == want["bench"] == "rwku:Stephen King"
    assert got["n_items"]["forget_level1"] == 2 and got["edit"] == str(saved)
    assert set(want["metrics"]) >= {"ForgetL1LP", "NeighbourL1LP", "MIA_AUC"}
    # a named target and a MUSE corpus; the table form names the benchmark
    res = CliRunner().invoke(app, ["eval", "--bench", "muse-news", "--bench-data", str(BENCH), "--limit", "2",
                                   "--n-mc", "1", "--no-rouge"])
    assert res.exit_code == 0, res.output
    assert "on muse-news" in res.stdout and "KnowMemLP" in res.stdout and "VerbMemLP" in res.stdout
    # a retrained model's AUC turns the raw AUC into MUSE's PrivLeak, through the CLI as through the API
    res = CliRunner().invoke(app, ["eval", "--bench", "muse-news", "--bench-data", str(BENCH), "--limit", "2",
                                   "--n-mc", "1", "--no-rouge", "--privleak-reference", "0.4", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["metrics"]
    assert got["PrivLeak"] == pytest.approx(((1 - got["PrivLeakAUC"]) - 0.6) / 0.6 * 100)
    api = timerome.evaluate_benchmark(bb, "muse-news", bench_data=BENCH, limit=2, n_mc=1, rouge=False,
                                      privleak_reference=0.4)
    assert api["metrics"]["PrivLeak"] == got["PrivLeak"]
    for bad, why in ((1.0, "in \\[0, 1\\)"), (float("nan"), "in \\[0, 1\\)")):
        with pytest.raises(TimeromeError, match=why):
            timerome.evaluate_benchmark(bb, "muse-news", bench_data=BENCH, limit=2, privleak_reference=bad)
    with pytest.raises(TimeromeError, match="only MUSE"):
        timerome.evaluate_benchmark(bb, "whp", bench_data=BENCH, limit=2, privleak_reference=0.5)
    other = timerome.load_benchmark(bb, "rwku:Confucius", bench_data=BENCH, limit=1)
    assert other["bench"] == "rwku:Confucius" and len(other["splits"]["neighbor_level1"]) == 1


def test_eval_bench_says_what_repeats_and_what_it_cut(bb, tmp_path):
    """A row the file repeats, and a prompt cut to fit the model's context (512 tokens here), are said in
    the notes: the API's, the CLI's (--json and stderr), as the experiments' tables say them."""
    row = {"question": "who wrote the book ?", "choices": ["an author", "a poet"], "answer": 0}
    long = dict(row, question=" ".join(["the"] * 600))
    (tmp_path / "bench" / "wmdp").mkdir(parents=True)
    (tmp_path / "bench" / "wmdp" / "wmdp-bio.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (row, row, long)))
    out = timerome.evaluate_benchmark(bb, "wmdp:bio", bench_data=tmp_path / "bench", n_mc=1)
    assert out["n_items"]["wmdp"] == 3 and out["data"]["cut"] == {"wmdp": {"scored pairs": 1}}
    assert sum("WMDP-bio: 1 repeats an earlier row exactly" in n for n in out["notes"]) == 1
    assert sum(n.startswith("cut to fit the model's context") and n.endswith("wmdp 1 scored pairs")
               for n in out["notes"]) == 1
    res = CliRunner().invoke(app, ["eval", "--bench", "wmdp:bio", "--bench-data", str(tmp_path / "bench"), "--n-mc",
                                   "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["notes"] == out["notes"]
    assert "wmdp 1 scored pairs" in res.stderr.replace("\n", " ")


def test_evaluate_benchmark_refuses_bad_input(bb, saved, tmp_path):
    for bad, why in (("musex", "a benchmark is one of"), ("whp:x", "whp names no part")):
        with pytest.raises(TimeromeError, match=why):
            timerome.evaluate_benchmark(bb, bad, bench_data=BENCH)
    with pytest.raises(TimeromeError, match="the row limit"):
        timerome.load_benchmark(bb, "wmdp", bench_data=BENCH, limit=0)
    with pytest.raises(TimeromeError, match="the benchmark folder .*nowhere does not exist: pass the folder holding"):
        timerome.load_benchmark(bb, "wmdp", bench_data=tmp_path / "nowhere")
    with pytest.raises(TimeromeError, match="n_mc"):
        timerome.evaluate_benchmark(bb, "wmdp", bench_data=BENCH, limit=1, n_mc=0)
    with pytest.raises(TimeromeError, match="bench must be a benchmark's name"):
        timerome.evaluate_benchmark(bb, {"splits": {}})
    with pytest.raises(TimeromeError, match="edit must be an edit memory"):
        timerome.evaluate_benchmark(bb, "wmdp", bench_data=BENCH, limit=1, edit=3)
    if (BENCH / "wmdp").is_dir():
        rows = timerome.load_benchmark(bb, "wmdp", bench_data=BENCH, limit=1)
        with pytest.raises(TimeromeError, match="loaded already"):
            timerome.evaluate_benchmark(bb, rows, limit=2)
