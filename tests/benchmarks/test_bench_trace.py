"""benchmarks/bench_trace.py at a tiny size (--tiny, 2 facts, 2 steps, 2 rounds): every figure of its JSON is
there and finite, and its "rest" is, per round, the trace less its block calls timed at their shapes and the
head's floor (the median of the two rounds)."""

import importlib.util
import json
import math
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench_module(monkeypatch):
    """bench_trace.py as a module, its floor's rate searches held to small sizes: these tests check the
    bench's figures and code paths (the searches themselves: tests/engine/test_throughput.py); in
    bfloat16 on a CPU the full searches took 54 of the --llada8b test's 58 s."""
    spec = importlib.util.spec_from_file_location("bench_trace", ROOT / "benchmarks" / "bench_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "best_throughput", partial(mod.best_throughput, max_rows=16))
    monkeypatch.setattr(mod, "head_throughput", partial(mod.head_throughput, max_positions=256))
    return mod


def test_bench_trace_tiny_reports_a_floor_and_where_the_time_goes(monkeypatch, capsys, tmp_path):
    mod = _bench_module(monkeypatch)
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


def test_bench_trace_llada8b_shapes_runs_copies_of_one_block_in_bfloat16(monkeypatch, capsys, tmp_path):
    import torch

    from timerome.backbones import tiny

    mod = _bench_module(monkeypatch)
    # a stand-in for LLaDA-8B's shapes that a CPU test can build; the code path is --llada8b's
    monkeypatch.setattr(tiny, "LLADA_8B", dict(hidden=64, mlp=192, heads=4, layers=3, vocab=300))
    built = []
    real = tiny.random_backbone
    monkeypatch.setattr(tiny, "random_backbone", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    out_json = tmp_path / "t.json"
    monkeypatch.setattr("sys.argv", ["bench", "--llada8b", "--dtype", "bfloat16", "--no-ablations", "--repeats", "1",
                                     "--facts", "2", "--steps", "2", "--samples", "2", "--json", str(out_json)])
    assert mod.main() == 0
    assert "model random-llada8b-shapes (3 layers, d=64, bfloat16)" in capsys.readouterr().out
    d = json.loads(out_json.read_text())
    assert (d["layers"], d["hidden"], d["dtype"]) == (3, 64, "bfloat16") and math.isfinite(d["cost_multiple"])
    blocks = built[0].model.model.transformer.blocks
    assert len(blocks) == 3 and blocks[1] is not blocks[0]  # copies, each hooked apart
    assert all(torch.equal(a, b) for a, b in zip(blocks[0].parameters(), blocks[2].parameters()))
    assert built[0].mask_id == built[0].tokenizer.mask_token_id < 300
