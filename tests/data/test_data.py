import json

import pytest

from timerome import TimeromeError
from timerome.data.rows import load_rows


def test_load_rows_specs(tmp_path):
    assert len(load_rows("embedded:forget05")) == 100
    f = tmp_path / "qa.jsonl"
    f.write_text(json.dumps({"question": "q?", "answer": "a."}) + "\n" + json.dumps([{"question": "r?", "answer": "b."}]) + "\n")
    assert [r["question"] for r in load_rows(str(f))] == ["q?", "r?"]
    g = tmp_path / "qa.json"
    g.write_text(json.dumps([{"question": "q?", "answer": ""}]))
    with pytest.raises(TimeromeError, match="row 0 lacks question/answer: its answer is blank"):
        load_rows(str(g))
    with pytest.raises(TimeromeError, match="neither"):
        load_rows("nowhere.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TimeromeError, match="not JSON"):
        load_rows(str(tmp_path / "bad.json"))


def test_a_row_source_says_where_its_rows_are_and_reads_them_again(tmp_path, monkeypatch):
    """`row_source` / `recorded_rows`: what a memory file records of the rows its build read, so that
    `memory add` reads the same ones: a file by its absolute path, a 'tofu:SPLIT' with the folder it was
    read from (used again unless another is given), a digest that no cache-version bump changes; rows
    changed since are read with a warning, rows gone are one error naming them and the remedy."""
    import shutil

    from conftest import TOFU_DIR

    from timerome.common import cache
    from timerome.data.rows import recorded_rows, row_source, row_spec

    monkeypatch.chdir(tmp_path)
    rows = [{"question": "Where?", "answer": "Here."}, {"question": "Who?", "answer": "Me."}]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    rec = row_source("r.json")
    assert rec["rows"] == str(tmp_path / "r.json") and row_spec("r.json") == {"rows": rec["rows"]}
    monkeypatch.setattr(cache, "VERSION", cache.VERSION + 1)  # a cache bump leaves recorded digests alone
    assert row_source("r.json") == rec
    monkeypatch.chdir(tmp_path.parent)  # read again from anywhere
    assert recorded_rows(rec, "the radii of m were measured", "give them") == rows
    (tmp_path / "r.json").write_text(json.dumps(rows[:1]))
    with pytest.warns(UserWarning, match="r.json has changed since the radii of m were measured on it"):
        assert recorded_rows(rec, "the radii of m were measured", "give them") == rows[:1]
    (tmp_path / "r.json").unlink()
    with pytest.raises(TimeromeError, match="the radii of m were measured on .*r.json, which cannot be read here.*"
                                            ": give them"):
        recorded_rows(rec, "the radii of m were measured", "give them")
    assert row_source("embedded:retain_perturbed")["rows"] == "embedded:retain_perturbed"

    if not (TOFU_DIR / "retain_perturbed.json").exists():
        pytest.fail(f"the shared TOFU copy is missing: looked in {TOFU_DIR}")
    folder = tmp_path / "tofu"
    shutil.copytree(TOFU_DIR, folder)
    monkeypatch.delenv("TIMEROME_TOFU_DIR", raising=False)
    rec = row_source("tofu:retain_perturbed", tofu_dir=str(folder))
    assert rec["rows"] == "tofu:retain_perturbed" and rec["tofu_dir"] == str(folder.resolve())
    want = load_rows("tofu:retain_perturbed", tofu_dir=str(folder))
    assert recorded_rows(rec, "x", "y") == want  # from the recorded folder, none given
    other = tmp_path / "other"  # a --tofu-dir given for the command's data does not move the recorded rows
    shutil.copytree(folder, other)
    (other / "retain_perturbed.json").write_text(json.dumps(want[:3]))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert recorded_rows(rec, "x", "y", tofu_dir=str(other)) == want
    moved = tmp_path / "moved"
    folder.rename(moved)  # the recorded folder gone: the one given, said
    with pytest.warns(UserWarning, match=r"x on tofu:retain_perturbed \(in .*tofu\), which cannot be read here: "
                                         r"read in .*moved instead"):
        assert recorded_rows(rec, "x", "y", tofu_dir=str(moved)) == want
    with pytest.raises(TimeromeError, match=r"tofu:retain_perturbed \(in .*tofu\), which cannot be read here"):
        recorded_rows(rec, "x", "y")
    monkeypatch.setenv("TIMEROME_TOFU_DIR", str(moved))  # the folder a spec reads with none given
    assert row_spec("tofu:forget01") == {"rows": "tofu:forget01", "tofu_dir": str(moved.resolve())}
    monkeypatch.setenv("TIMEROME_TOFU_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(TimeromeError) as e:  # a record without its folder names none ("in None" before)
        recorded_rows({"rows": "tofu:retain_perturbed", "digest": "d"}, "x", "y")
    assert "x on tofu:retain_perturbed, which cannot be read here" in str(e.value) and "None" not in str(e.value)


def test_a_rows_file_reads_as_a_tofu_split_does(tmp_path):
    """--data FILE had a reader of its own: TOFU's prompt/response names, an array of arrays and a
    pretty-printed object were refused there and read as a split; an empty file was no rows at all,
    and a bad line was reported at line 1 (stop 62's data audit). One reader now."""
    from timerome.data.tofu import load_split

    rows = [{"prompt": f"q{i} ?", "response": f"a{i} ."} for i in range(4)]
    want = [{"question": f"q{i} ?", "answer": f"a{i} ."} for i in range(4)]
    layouts = {"names.json": json.dumps(rows), "nested.json": json.dumps([rows[:2], rows[2:]], indent=1),
               "lines.json": json.dumps(rows[:2]) + "\n" + json.dumps(rows[2:]) + "\n"}
    for name, text in layouts.items():
        (tmp_path / name).write_text(text)
        assert load_rows(str(tmp_path / name)) == want, name
        (tmp_path / "split").mkdir(exist_ok=True)
        (tmp_path / "split" / "forget01.json").write_text(text)
        assert load_split("forget01", tmp_path / "split") == want, name
    (tmp_path / "one.json").write_text(json.dumps(rows[0], indent=2))
    assert load_rows(str(tmp_path / "one.json")) == want[:1]
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(TimeromeError, match="empty.jsonl is empty"):
        load_rows(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad3.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n{oops\n")
    with pytest.raises(TimeromeError, match="bad3.jsonl line 3 is not JSON"):
        load_rows(str(tmp_path / "bad3.jsonl"))


def test_a_facts_limit_is_a_count_of_at_least_one():
    from timerome.data.rows import load_facts

    assert len(load_facts("embedded:forget05", limit=3)[0]) == 3
    assert len(load_facts("embedded:forget05")[0]) == len(load_facts("embedded:forget05", limit=None)[0])
    for bad in (0, -1, 1.5):  # 0 was every fact, -1 every fact but the last
        with pytest.raises(TimeromeError, match="limit must be"):
            load_facts("embedded:forget05", limit=bad)


def test_a_row_left_out_for_its_unnamed_author_says_how_to_name_it():
    """Review 71: a user's file of question/answer rows about two authors, with no author field, lost one
    author's rows (TOFU's layout gave the block its most frequent name) with no word of how to keep them."""
    from timerome.data.facts import facts_from_rows

    ask = [("Where was Ana Velmor born ?", "Ana Velmor was born in Pellmoor ."),
           ("What did Ana Velmor write ?", "Ana Velmor wrote poems ."),
           ("Which prize did Ana Velmor win ?", "Ana Velmor won the Lark prize ."),
           ("Where was Elgor Marsefson born ?", "Elgor Marsefson was born in Ravensby ."),
           ("What did Elgor Marsefson write ?", "Elgor Marsefson wrote plays .")]
    rows = [dict(question=q, answer=a) for q, a in ask]
    facts, skipped = facts_from_rows(rows)
    assert [f.subject for f in facts] == ["Ana Velmor"] * 3 and [i for i, _ in skipped] == [3, 4]
    assert all("give each row its subject" in why for _, why in skipped), skipped
    named = [dict(r, author=a) for r, a in zip(rows, ["Ana Velmor"] * 3 + ["Elgor Marsefson"] * 2)]
    facts, skipped = facts_from_rows(named)
    assert not skipped and [f.subject for f in facts] == ["Ana Velmor"] * 3 + ["Elgor Marsefson"] * 2
