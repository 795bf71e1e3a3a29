"""benchmarks/bench_trace.py at a tiny size (--tiny, 2 facts, 2 steps, 2 rounds): every figure of its JSON is
there and finite, and its "rest" is, per round, the trace less its block calls timed at their shapes and the
head's floor (the median of the two rounds)."""

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_trace_tiny_reports_a_floor_and_where_the_time_goes(monkeypatch, capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_trace", ROOT / "benchmarks" / "bench_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out_json = tmp_path / "t.json"
    monkeypatch.setattr("sys.argv", ["bench", "--tiny", "--no-ablations", "--repeats", "1", "--facts", "2",
                                     "--steps", "2", "--samples", "2", "--json", str(out_json)])
    assert mod.main() == 0
    text = capsys.readouterr().out
    assert "cost multiple" in text and "where it goes" in text
    d = json.loads(out_json.read_text())
    assert len(d["fast_runs"]) == len(d["floor_runs"]) == len(d["block_calls_at_their_shapes_runs"]) == 2
    for key in ("cost_multiple", "fast_seconds", "floor_seconds", "block_calls_at_their_shapes_seconds",
                "computed_at_best_seconds", "head_floor_seconds", "rest_seconds"):
        assert math.isfinite(d[key]), key
    assert d["cost_multiple"] > 0 and d["block_rows"] >= d["min_block_rows"] > 0
    # per round, the rest is what the trace spent beyond its block calls and the head's floor
    rests = sorted(t - b - d["head_floor_seconds"] for t, b in zip(d["fast_runs"], d["block_calls_at_their_shapes_runs"]))
    assert d["rest_seconds"] == sum(rests) / 2
