"""transfer, rwku and robustness end to end on tiny models with the real data files, and TimeROME's
forget-vs-neighbour selectivity on a small model trained in the test on one RWKU target's probes."""

import json
import warnings

import numpy as np
import pytest
from bench_models import BENCH, needs_bench

from timerome.data.muse import load_muse
from timerome.data.rwku import load_rwku, passage_rows
from timerome.data.tofu import load_split
from timerome.data.whp import load_trivia
from timerome.data.wmdp import load_wmdp
from timerome.errors import TimeromeError
from timerome.experiments import QUICK, experiment_config, run_experiment
from timerome.metrics.rwku import qa_rows
from timerome.training.small_model import tiny_model, trained_model

TIMEROME_AT_LAYER_1 = {"method": "timerome", "config": {"coordinate": [1, "resid"]}}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    warnings.simplefilter("ignore", UserWarning)  # the loaders' notes on skipped rows: asserted elsewhere


@pytest.fixture(scope="module")
def random_bb(tmp_path_factory):
    """A random model with a byte-level BPE tokenizer trained on a few rows of every benchmark."""
    if not (BENCH / "muse").is_dir():
        pytest.skip(f"no benchmark data in {BENCH}")
    texts = [r["question"] + " " + r["answer"] for r in load_muse("news", "knowmem/forget_qa", BENCH).rows[:20]]
    texts += [r["question"] + " " + r["true_answer"] for r in load_trivia(BENCH).rows[:20]]
    texts += [r["question"] + " " + " ".join(r["choices"]) for r in load_wmdp(BENCH, "mixed").rows[:20]]
    texts += [r["question"] + " " + r["answer"] for r in load_split("forget01_perturbed", "embedded")]
    return tiny_model(texts, tmp_path_factory.mktemp("random"))


def test_quick_settings_are_settings_of_their_experiment():
    for name in ("transfer", "rwku", "robustness"):
        assert QUICK[name] and set(QUICK[name]) <= set(experiment_config(name))
        assert experiment_config(name, quick=True)["n_mc"] == QUICK[name]["n_mc"]


@needs_bench
def test_transfer_end_to_end_and_resumable(random_bb, tmp_path, monkeypatch):
    over = dict(bench_dir=str(BENCH), methods=["no_edit", TIMEROME_AT_LAYER_1], n_mc=2, n_knowmem=3, n_verbmem=2,
                n_privleak=3, n_trivia=4, n_completions=2, n_wmdp=4, knowmem_tokens=4, verbmem_tokens=8,
                completion_tokens=4, mia_groups=2, privleak_reference={"books": 0.5})
    out = tmp_path / "transfer"
    res = run_experiment("transfer", seeds=(0,), out_dir=out, overrides=over, progress=False, backbone=random_bb)
    groups = [f"{b}|{k}" for b in ("muse-books", "muse-news", "whp", "wmdp") for k in ("tofu", "own")]
    assert list(res["summary"]) == groups
    books = res["summary"]["muse-books|tofu"]
    for row in ("no_edit", "timerome (coordinate=[1, 'resid'])"):
        for col in ("KnowMemLP", "VerbMemLP", "KnowMemROUGE", "VerbMemROUGE", "RetainKnowMemLP", "PrivLeakAUC",
                    "PrivLeak"):
            assert np.isfinite(books[row][col]["mean"]), (row, col)
        assert 0 <= books[row]["PrivLeakAUC"]["mean"] <= 1
    assert "PrivLeak" not in res["summary"]["muse-news|tofu"]["no_edit"]  # no reference AUC given for News
    assert res["summary"]["wmdp|tofu"]["no_edit"]["WMDP_Acc"]["mean"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    # the TimeROME edit acts on the transfer data (the same TOFU-built memory for every benchmark)
    whp = res["summary"]["whp|tofu"]
    assert whp["timerome (coordinate=[1, 'resid'])"]["WHP_LP"]["mean"] != whp["no_edit"]["WHP_LP"]["mean"]
    md = (out / "transfer.md").read_text()
    assert "Transfer table (paper layout" in md and "TOFU forget01 (20 facts): transfer" in md
    assert "scored: mixed Bio+Cyber" in md and "NOT a WMDP-bio score" in md and "own forget set" in md
    assert (out / "transfer.png").stat().st_size > 0
    cell = json.loads(next((out / "cells").glob("*.json")).read_text())["result"]
    assert cell["data"]["unknown_token_share"] == 0.0  # byte-level BPE: nothing unknown, so no warning
    n_cells = len(list((out / "cells").glob("*.json")))
    assert n_cells == 16

    def no_recompute(*a, **k):
        raise AssertionError("a cached cell was recomputed")

    monkeypatch.setattr("timerome.experiments.runner.execute", no_recompute)
    again = run_experiment("transfer", seeds=(0,), out_dir=out, overrides=over, progress=False, backbone=random_bb)
    assert again["summary"] == res["summary"]


def test_embedded_model_says_benchmark_numbers_mean_nothing(tmp_path):
    if not (BENCH / "wmdp").is_dir():
        pytest.skip(f"no benchmark data in {BENCH}")
    from timerome.backbones import load_backbone

    over = dict(bench_dir=str(BENCH), benchmarks=["wmdp"], own=False, methods=["no_edit"], n_wmdp=3, n_mc=1)
    res = run_experiment("transfer", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False,
                         backbone=load_backbone(None))
    assert res["markdown"].startswith("**Warning:")  # above the tables, not only under them
    md = " ".join(res["markdown"].split())
    assert (f"of this benchmark's tokens are unknown to the model's vocabulary ({load_backbone(None).vocab_size} "
            "tokens): its numbers mean nothing") in md


@needs_bench
def test_robustness_end_to_end(random_bb, tmp_path):
    over = dict(methods=["no_edit", TIMEROME_AT_LAYER_1], n_mc=2, eval_forget=4,
                extraction=dict(settings=["nominal", "random"], attacks=["context before", "multiple choice"]))
    res = run_experiment("robustness", seeds=(0, 1), out_dir=tmp_path, overrides=over, progress=False,
                         backbone=random_bb)
    row = "timerome (coordinate=[1, 'resid'])"
    p = res["panel"][row]
    assert set(p) == {"original", "paraphrased_question", "paraphrased_answer", "relearn"}
    assert p["original"]["weakening"]["mean"] == 0.0 and p["relearn"]["change"]["n"] == 2
    s = res["summary"]
    # the panel's change is the summary's difference to no_edit (same rows, same seeds)
    delta = s[row]["LP_relearn"]["mean"] - s["no_edit"]["LP_relearn"]["mean"]
    assert p["relearn"]["change"]["mean"] == pytest.approx(delta)
    assert "Robustness panel" in res["markdown"] and (tmp_path / "robustness.png").exists()
    table = [line for line in res["markdown"].split("## Extraction")[0].splitlines() if line.startswith(f"| {row} | ")]
    assert "(p=" in table[-1].split("|")[-2] or "same on every seed" in table[-1]  # the Δ column of every row
    # the extraction cells: nominal and worst case per method, over both seeds, the worst at least the nominal
    ex = res["extraction"]
    assert set(ex) == {"no_edit", row}
    for r in ex:
        assert ex[r]["WorstCase"]["n"] == 2 and ex[r]["WorstCase"]["mean"] >= ex[r]["ExtractionNominal"]["mean"]
        assert 0 <= ex[r]["LocalityWorst"]["mean"] <= 1
    assert ex["no_edit"]["LocalityWorst"]["mean"] == 1.0  # the unedited model against itself
    assert "## Extraction" in res["markdown"] and "multiple choice" in res["markdown"]
    assert (tmp_path / "robustness-extraction.png").exists()
    saved = json.loads((tmp_path / "robustness.json").read_text())
    assert saved["extraction"][row]["WorstCase"]["mean"] == ex[row]["WorstCase"]["mean"]
    assert saved["radar"] == {}  # no other method than TimeROME to compare with


def test_robustness_says_which_prompts_it_cut_to_fit_the_context(tmp_path):
    """On a 40-token context the relearn prompt (question, answer, question) loses its oldest tokens where the
    original question does not: the report counts them per condition, under its table and in its JSON."""
    import re

    texts = [r["question"] + " " + r["answer"] for r in load_split("forget01_perturbed", "embedded")]
    bb = tiny_model(texts, tmp_path / "short", max_length=40)
    over = dict(methods=["no_edit", TIMEROME_AT_LAYER_1], n_mc=2, eval_forget=3, extraction=False)
    res = run_experiment("robustness", seeds=(0,), out_dir=tmp_path / "o", overrides=over, progress=False,
                         backbone=bb)
    said = re.search(r"Prompts cut to fit the model's context \(their oldest tokens dropped after the sequence "
                     r"start\): ([^;]*); a cut relearn prompt shows less", res["markdown"])
    assert said, res["markdown"]
    counts = dict(part.rsplit(" ", 1) for part in said.group(1).split(", "))
    assert set(counts) == {"relearn"} and 1 <= int(counts["relearn"]) <= 3, counts  # the originals fit
    assert said.group(0) in (tmp_path / "o" / "robustness.md").read_text()
    saved = json.loads((tmp_path / "o" / "robustness.json").read_text())  # per condition, zeros included
    assert {c: n for c, n in saved["cut"].items() if n} == {"relearn": int(counts["relearn"])}, saved["cut"]
    assert saved["cut"]["original"] == 0 and set(saved["missing"]) <= set(saved["cut"])


@pytest.fixture(scope="module")
def rwku_bb(tmp_path_factory):
    """A small model trained on Stephen King's forget and neighbour probes (levels 1-2); its word
    tokenizer also covers the other targets' passages (the retain rows) and the level-3 probes."""
    if not (BENCH / "rwku").is_dir():
        pytest.skip(f"no benchmark data in {BENCH}")
    parts = ("forget_level1", "forget_level2", "neighbor_level1", "neighbor_level2")
    rows = qa_rows([r for p in parts for r in load_rwku("Stephen King", p, BENCH).rows])
    extra = [r["question"] + " " + r["answer"] for t in ("Confucius", "Bruce Lee")
             for r in passage_rows(load_rwku(t, "passage", BENCH).rows)]
    extra += [r["query"] for r in load_rwku("Stephen King", "forget_level3", BENCH).rows]
    return trained_model(rows, tmp_path_factory.mktemp("rwku"), epochs=80, words=True, extra_texts=extra)


@needs_bench
def test_rwku_timerome_lowers_forget_probes_more_than_neighbours(rwku_bb, tmp_path):
    """Seeded (training, tokenizer, Monte-Carlo masks). alpha 16: the operating point of this 2-layer
    model, where alpha 4 (the embedded model's) barely moves it; the claim is the ordering."""
    over = dict(bench_dir=str(BENCH), targets=["Stephen King"], forget_from=["probes"], rouge=False, mia=True,
                mia_groups=2, n_mc=4, methods=["no_edit", {"method": "timerome", "config": {"alpha": 16.0}}])
    res = run_experiment("rwku", seeds=(0,), out_dir=tmp_path, overrides=over, progress=False, backbone=rwku_bb)
    s = res["summary"]["Stephen King"]
    assert s["no_edit"]["ForgetL1LP"]["mean"] > -2 and s["no_edit"]["NeighbourL1LP"]["mean"] > -2  # learnt
    sel = res["selectivity"]["timerome (alpha=16)"]
    forget = (sel["ForgetL1LP"] + sel["ForgetL2LP"]) / 2
    neighbour = (sel["NeighbourL1LP"] + sel["NeighbourL2LP"]) / 2
    assert forget < -3 and forget < neighbour - 2, sel
    assert 0 <= s["no_edit"]["MIA_AUC"]["mean"] <= 1 and np.isfinite(s["no_edit"]["ForgetMIA_LP"]["mean"])
    md = res["markdown"]
    assert "Forget vs neighbour drop" in md and "own forget set: 18 rows" in md


@needs_bench
def test_whp_with_rouge_off_reads_no_completion_prompts(tmp_path):
    """Stop 68 (helper 55): with rouge off nothing generates WHP's completions, so they are not loaded (the file
    had to exist, yet choosing another was refused as unread); with rouge on the spec is as before."""
    import shutil

    from timerome.backbones import load_backbone
    from timerome.experiments import Context, experiment_config
    from timerome.experiments.transfer import data_spec

    (tmp_path / "whp").mkdir()
    shutil.copy(BENCH / "whp" / "hp_trivia_1239.jsonl", tmp_path / "whp")  # no completion prompts at all
    off = data_spec(experiment_config("transfer", {"rouge": False, "bench_dir": str(tmp_path)}), "whp", "none")
    assert off["completions"] is False and "prompts" not in off and "n_completions" not in off
    rows, _ = Context(load_backbone(), progress=False).data(off)
    assert set(rows["splits"]) == {"trivia"} and len(rows["splits"]["trivia"]) > 0
    on = data_spec(experiment_config("transfer", {"bench_dir": str(tmp_path)}), "whp", "none")
    assert on["prompts"] == "evaluation_prompts" and "completions" not in on
    # the API and `timerome eval --bench whp --no-rouge` alike (helper 56)
    import timerome

    bb = load_backbone()
    scored = timerome.evaluate_benchmark(bb, "whp", bench_data=tmp_path, limit=2, n_mc=1, rouge=False)
    assert "WHP_LP" in scored["metrics"] and scored["n_items"] == {"trivia": 2}
    rows = timerome.load_benchmark(bb, "whp", bench_data=tmp_path, limit=2, rouge=False)
    with pytest.raises(TimeromeError, match="loaded with rouge=False"):
        timerome.evaluate_benchmark(bb, rows)
