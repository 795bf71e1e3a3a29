import json
import sys

import pytest
from conftest import TOFU_DIR as TOFU

from timerome import TimeromeError
from timerome.data import SPLITS, load_split, make_corpus

needs_tofu = pytest.mark.skipif(not TOFU.exists(), reason=f"the TOFU copy is not at {TOFU}")

SIZES = {"forget01": 40, "forget05": 200, "forget10": 400, "retain90": 3600, "retain95": 3800,
         "retain99": 3960, "holdout01": 40, "holdout05": 200, "holdout10": 400, "full": 4000,
         "real_authors": 100, "world_facts": 117, "forget01_perturbed": 40, "forget05_perturbed": 200,
         "forget10_perturbed": 400, "retain_perturbed": 400, "real_authors_perturbed": 100,
         "world_facts_perturbed": 117}


def _pairs(rows):
    return [(r["question"], r["answer"]) for r in rows]


@needs_tofu
def test_every_real_split_loads_with_its_tofu_size():
    assert set(SIZES) == set(SPLITS)
    for name, n in SIZES.items():
        rows = load_split(name, TOFU)
        assert len(rows) == n, name
        assert all(isinstance(r["question"], str) and r["answer"] for r in rows), name


@needs_tofu
def test_real_splits_relate_as_in_tofu():
    full = load_split("full", str(TOFU))  # full.json is 4 lines, each an array of 1000 rows
    for pct in (1, 5, 10):
        k = 40 * pct
        forget = load_split(f"forget{pct:02d}", TOFU)
        assert _pairs(forget) == _pairs(full[-k:]) == _pairs(load_split(f"forget{pct:02d}_perturbed", TOFU))
        assert _pairs(load_split(f"retain{100 - pct}", TOFU)) == _pairs(full[:-k])
    assert _pairs(load_split("retain_perturbed", TOFU)) == _pairs(full[:400])
    row = load_split("forget01_perturbed", TOFU)[0]
    assert len(row["perturbed_answer"]) == 5 and row["paraphrased_answer"] and row["paraphrased_question"]
    assert len(load_split("world_facts_perturbed", TOFU)[0]["perturbed_answer"]) == 3
    assert {"option1", "option4"} <= set(load_split("real_authors", TOFU)[0])


def test_embedded_source_serves_the_corpus_and_copies_it():
    corpus = make_corpus()
    for name in SPLITS:
        assert load_split(name, "embedded") == corpus[name], name
    rows = load_split("forget01", "embedded")
    rows[0]["perturbed_answer"].append("changed")
    assert load_split("forget01", "embedded")[0] == corpus["forget01"][0]


def test_default_source_is_the_environment_directory(tmp_path, monkeypatch):
    (tmp_path / "holdout01.json").write_text('{"question": "q ?", "answer": "a ."}\n')
    monkeypatch.setenv("TIMEROME_TOFU_DIR", str(tmp_path))
    assert load_split("holdout01") == [{"question": "q ?", "answer": "a ."}]
    monkeypatch.setenv("TIMEROME_TOFU_DIR", "embedded")
    assert len(load_split("holdout01")) == 20


def test_hub_without_datasets_says_to_pass_a_directory(monkeypatch):
    monkeypatch.delenv("TIMEROME_TOFU_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # importing it now raises ImportError
    for source in ("locuslab/TOFU", None):
        with pytest.raises(TimeromeError, match="local directory"):
            load_split("forget01", source)


def test_file_layouts_and_field_names_are_normalised(tmp_path):
    rows = [{"prompt": f"q{i} ?", "response": f"a{i} ."} for i in range(4)]
    (tmp_path / "forget01.json").write_text(json.dumps(rows[:2]) + "\n" + json.dumps(rows[2:]) + "\n\n")
    (tmp_path / "forget05.json").write_text(json.dumps(rows, indent=2))  # one pretty-printed array
    (tmp_path / "forget10.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # plain JSONL
    want = [{"question": f"q{i} ?", "answer": f"a{i} ."} for i in range(4)]
    for name in ("forget01", "forget05", "forget10"):
        assert load_split(name, tmp_path) == want, name


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(TimeromeError, match="unknown TOFU split 'forget02'.*forget01.*retain_perturbed"):
        load_split("forget02", "embedded")
    with pytest.raises(TimeromeError, match="does not exist"):
        load_split("forget01", tmp_path / "nowhere")
    (tmp_path / "full.json").write_text('{"question": "q ?", "answer": "a ."}\n')
    with pytest.raises(TimeromeError, match="forget01.json is missing.*available.*: full"):
        load_split("forget01", tmp_path)
    (tmp_path / "forget01.json").write_text('{"question": "q ?", "answer": "a ."}\n{"question": "q2 ?"}\n')
    with pytest.raises(TimeromeError, match=r"forget01.json row 1 lacks question/answer: no answer field"):
        load_split("forget01", tmp_path)
    (tmp_path / "forget05.json").write_text('{"question": "q ?", "answer": "a ."}\n{oops\n')
    with pytest.raises(TimeromeError, match="forget05.json line 2 is not JSON"):
        load_split("forget05", tmp_path)
    (tmp_path / "forget10.json").write_text('[{"question": "q ?", "answer": "a ."}, "text"]')
    with pytest.raises(TimeromeError, match="row 1 lacks question/answer: it is a str"):
        load_split("forget10", tmp_path)
