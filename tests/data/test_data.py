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
    with pytest.raises(TimeromeError, match="row 0 needs"):
        load_rows(str(g))
    with pytest.raises(TimeromeError, match="neither"):
        load_rows("nowhere.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TimeromeError, match="not JSON"):
        load_rows(str(tmp_path / "bad.json"))
