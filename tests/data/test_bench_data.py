"""Benchmark loaders on the shared data files (read at test time, never copied) and on bad input:
a missing split, a row without its answer, a choice index out of range."""

import json
import re
import warnings

import pytest
from bench_models import BENCH, needs_bench
from typer.testing import CliRunner

from timerome import TimeromeError
from timerome.cli import app
from timerome.data.benchmark import entities, entity_subject
from timerome.data.muse import load_muse
from timerome.data.rwku import load_rwku, passage_rows, rwku_targets, subject_in, target_folder
from timerome.data.whp import load_completions, load_trivia
from timerome.data.wmdp import load_wmdp


@needs_bench
def test_shared_copies_load_with_their_schema():
    kf = load_muse("books", "knowmem/forget_qa", BENCH)
    assert len(kf.rows) == 100 and not kf.skipped and set(kf.rows[0]) == {"question", "answer"}
    assert len(load_muse("news", "knowmem/retain_qa", BENCH).rows) == 100  # the copy names it retain2_qa
    assert set(load_muse("news", "verbmem/forget", BENCH).rows[0]) == {"prompt", "gt"}
    assert set(load_muse("books", "privleak/holdout", BENCH).rows[0]) == {"text"}  # a list of passages there
    assert len(load_trivia(BENCH).rows) == 1239
    c = load_completions(BENCH, "evaluation_prompts_short").rows[0]
    assert c["references"] and isinstance(c["prompt"], str)
    w = load_wmdp(BENCH, "bio")
    assert len(w.rows) == 785 and "mixed" in w.layout and "NOT a WMDP-bio score" in w.layout
    assert rwku_targets(BENCH)[:1] == ["1_Stephen_King"]
    probes = load_rwku("Stephen King", "forget_level1", BENCH)
    assert probes.rows[0]["subject"] == "Stephen King" and "___" in probes.rows[0]["query"]
    assert target_folder("Bruce Lee", BENCH) == target_folder("3_Bruce_Lee", BENCH) == "3_Bruce_Lee"


def test_missing_split_is_one_clear_error(tmp_path):
    (tmp_path / "muse" / "news" / "knowmem").mkdir(parents=True)
    with pytest.raises(TimeromeError, match=r"forget_qa.json is missing; files in .*knowmem: none"):
        load_muse("news", "knowmem/forget_qa", tmp_path)
    with pytest.raises(TimeromeError, match="unknown MUSE split"):
        load_muse("news", "knowmem/nope", tmp_path)
    with pytest.raises(TimeromeError, match="does not exist"):
        load_trivia(tmp_path / "nowhere")
    (tmp_path / "wmdp").mkdir()
    (tmp_path / "wmdp" / "notes.txt").write_text("x")
    with pytest.raises(TimeromeError, match=r"no wmdp-bio.jsonl \(or split_\*.jsonl\).*notes.txt"):
        load_wmdp(tmp_path, "bio")
    (tmp_path / "rwku" / "1_A_B").mkdir(parents=True)
    (tmp_path / "rwku" / "1_A_B" / "forget_level1.json").write_text("[]")
    with pytest.raises(TimeromeError, match="RWKU target 'Nobody' is not in"):
        load_rwku("Nobody", "forget_level1", tmp_path)
    with pytest.raises(TimeromeError, match="passage.json is missing"):
        load_rwku("A B", "passage", tmp_path)


def test_rows_without_their_answer_are_reported_not_dropped(tmp_path):
    d = tmp_path / "muse" / "books" / "knowmem"
    d.mkdir(parents=True)
    (d / "forget_qa.json").write_text(json.dumps([{"question": "q?", "answer": "a"}, {"question": "q2?"},
                                                  {"question": "q3?", "answer": "  "}, "just text"]))
    with pytest.warns(UserWarning, match="3 skipped: row 1: no answer text; row 2: no answer text; row 3: not an"):
        loaded = load_muse("books", "knowmem/forget_qa", tmp_path / "muse")
    assert [r["question"] for r in loaded.rows] == ["q?"] and [i for i, _ in loaded.skipped] == [1, 2, 3]
    assert loaded.info()["skipped"][0] == [1, "no answer text"]
    (d / "forget_qa.json").write_text(json.dumps([{"question": "q2?"}]))
    with pytest.raises(TimeromeError, match="no usable row: row 0: no answer text"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_muse("books", "knowmem/forget_qa", tmp_path)


def test_wmdp_layouts_and_choice_index_out_of_range(tmp_path):
    rows = [{"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 1},
            {"question": "r?", "choices": ["a", "b", "c", "d"], "answer": 7},
            {"question": "s?", "choices": ["a", "b"], "answer": "B"},
            {"question": "t?", "choices": ["a"], "answer": 0},
            {"question": "u?", "choices": list("abcdefghijkl"), "answer": 11}]  # 12 choices: letters A-J name 10
    (tmp_path / "wmdp-bio.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.warns(UserWarning, match="row 1: choice index 7 out of range \\(4 choices\\)"):
        w = load_wmdp(tmp_path, "bio")
    assert w.layout == "official cais/wmdp wmdp-bio" and [r["answer"] for r in w.rows] == [1, 1]
    assert "at least two" in w.skipped[1][1]
    assert w.skipped[2] == (4, "12 choices: a prompt names at most 10 (A-J)")  # it was kept, then an IndexError
    (tmp_path / "split_0.jsonl").write_text(json.dumps(rows[0]))
    mixed = load_wmdp(tmp_path, "mixed")
    assert mixed.layout.startswith("mixed") and len(mixed.rows) == 1
    with pytest.raises(TimeromeError, match="unknown WMDP subject"):
        load_wmdp(tmp_path, "physics")
    with pytest.raises(TimeromeError, match="local only"):
        load_wmdp("hub", "mixed")


def test_muse_reads_the_repositorys_folder_names_and_never_the_other_corpus(tmp_path):
    """MUSE's repository names its corpora data/hp (Books) and data/bbc (News); a Books folder given
    where News was asked for was read, its Harry Potter rows labelled News (stop 62's data audit)."""
    rows = [{"question": "q?", "answer": "a"}]
    for folder in ("hp", "bbc"):
        (tmp_path / "data" / folder / "knowmem").mkdir(parents=True)
        (tmp_path / "data" / folder / "knowmem" / "forget_qa.json").write_text(
            json.dumps([dict(rows[0], answer=folder)]))
    assert load_muse("books", "knowmem/forget_qa", tmp_path / "data").rows[0]["answer"] == "hp"
    assert load_muse("news", "knowmem/forget_qa", tmp_path / "data").rows[0]["answer"] == "bbc"
    assert load_muse("news", "knowmem/forget_qa", tmp_path / "data" / "bbc").rows[0]["answer"] == "bbc"
    with pytest.raises(TimeromeError, match="is the MUSE-Books folder, and MUSE-News was asked for"):
        load_muse("news", "knowmem/forget_qa", tmp_path / "data" / "hp")
    (tmp_path / "books" / "knowmem").mkdir(parents=True)
    with pytest.raises(TimeromeError, match="is the MUSE-Books folder"):
        load_muse("news", "knowmem/forget_qa", tmp_path / "books")


def test_an_empty_benchmark_file_is_named_not_a_blank_reason(tmp_path):
    (tmp_path / "muse" / "books" / "knowmem").mkdir(parents=True)
    (tmp_path / "muse" / "books" / "knowmem" / "forget_qa.json").write_text("\n")
    with pytest.raises(TimeromeError, match="benchmark file .*forget_qa.json is empty"):
        load_muse("books", "knowmem/forget_qa", tmp_path)


def test_subjects_of_questions_without_one():
    assert entities("What is the name of Harry Potter's owl?") == ["Harry Potter"]
    assert entities("In Order of the Phoenix, who taught Defence?") == ["Order of the Phoenix", "Defence"]
    assert entities("what is it?") == []
    rows = [{"question": "Who taught Harry Potter?"}, {"question": "Where did Harry Potter live with Dobby?"},
            {"question": "what year?"}]
    assert entity_subject(rows) == ["Harry Potter", "Harry Potter", None]  # the recurring entity wins
    assert subject_in("Stephen Edwin King (born 1947) is an American ___", "Stephen King") == "King"
    assert subject_in("Who is Bruce Lee?", "Bruce Lee") == "Bruce Lee" and subject_in("x", "Bruce Lee") is None
    rows = passage_rows([{"text": "Dr. A. Smith met X in c. 1990. He wrote it. Then more.", "subject": "X"},
                         {"text": "One sentence only.", "subject": "X"}])
    assert rows == [{"question": "Dr. A. Smith met X in c. 1990.", "answer": "He wrote it.", "subject": "X"}]


def test_cli_bad_benchmark_folder_is_one_red_line(tmp_path):
    def run(*args):
        res = CliRunner().invoke(app, ["experiment", *args])
        return res.exit_code, " ".join(res.output.split())

    code, out = run("transfer", "--bench-data", str(tmp_path / "none"))
    assert code == 2 and "none does not exist: pass the folder holding" in out and "Traceback" not in out
    code, out = run("rwku", "--quick", "--bench-data", str(tmp_path), "--seeds", "0", "-o", str(tmp_path / "out"))
    assert code == 2 and "holds no RWKU target folder" in out and "Traceback" not in out
    code, out = run("transfer", "--quick", "-c", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json does not exist" in out


@needs_bench
def test_rows_a_file_repeats_are_counted_and_said():
    """hp_trivia_1239 holds 76 rows that repeat an earlier one exactly; they are kept (the file is the
    benchmark) and said, since each weighs again in WHP's accuracy (stop 62's data audit)."""
    with pytest.warns(UserWarning, match="76 repeat an earlier row exactly .kept, as the file has them: a repeat that is scored"):
        trivia = load_trivia(BENCH)
    assert len(trivia.rows) == 1239 and trivia.repeated == 76 and trivia.info()["repeated"] == 76
    assert len({json.dumps(r, sort_keys=True) for r in trivia.rows}) == 1239 - 76


def test_a_benchmark_folder_that_is_not_there_is_said_as_it_was_given(tmp_path, monkeypatch):
    """Stop 77 (review 80): a relative path says where it was read from; a $TIMEROME_BENCH_DIR that is no folder
    is named as the variable (it said "or set $TIMEROME_BENCH_DIR" to a user who had)."""
    from timerome.data.benchmark import check_folder
    from timerome.experiments.transfer import bench_source

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TimeromeError, match=rf"the benchmark folder nope does not exist \(a relative path, read from "
                                            rf"{re.escape(str(tmp_path))}\)"):
        check_folder("nope")
    monkeypatch.setenv("TIMEROME_BENCH_DIR", str(tmp_path / "dta"))
    for call in (lambda: bench_source({}), lambda: load_trivia(None)):
        with pytest.raises(TimeromeError, match=r"^\$TIMEROME_BENCH_DIR .*dta does not exist: pass the folder"):
            call()


def test_a_local_only_benchmark_without_a_folder_is_one_message_everywhere(monkeypatch):
    """WHP and RWKU have no Hub copy: their loaders and eval --bench say so in local_only's one message."""
    from timerome.data.benchmark import ENV_DIR, local_only
    from timerome.experiments.bench_eval import bench_folder
    monkeypatch.delenv(ENV_DIR, raising=False)
    for call, name in ((load_trivia, "whp"), (load_completions, "whp"), (rwku_targets, "rwku"),
                       (lambda: load_rwku("Stephen King", "passage"), "rwku"), (lambda: bench_folder("whp"), "whp"),
                       (lambda: bench_folder("rwku"), "rwku")):
        with pytest.raises(TimeromeError) as err:
            call()
        assert str(err.value) == local_only(name)
    assert "WHP is read from a local folder only (of hp_trivia_1239.jsonl" in local_only("whp")
