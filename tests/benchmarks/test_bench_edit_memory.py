"""benchmarks/bench_edit_memory.py's scale8b part at a small stand-in for LLaDA-8B's shapes: the composed
forward and --whole (every block run) both build their model, install the memory and print a finite ratio
per configuration."""

import importlib.util
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_edit_memory", ROOT / "benchmarks" / "bench_edit_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "LLADA_8B", dict(hidden=64, mlp=128, heads=4, layers=3, vocab=300))
    return mod


@pytest.mark.parametrize("whole", [False, True])
def test_scale8b_prints_a_ratio_per_configuration(bench, monkeypatch, capsys, whole):
    argv = ["bench", "--parts", "scale8b", "--scale-facts", "200", "--gen-length", "16"] + (["--whole"] if whole else [])
    monkeypatch.setattr("sys.argv", argv)
    assert bench.main() == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.search(r"(whitened|paper) q=4", line)]
    assert len(rows) == (4 if whole else 2), out
    if whole:
        assert "model built on cpu, hook site (1, 'resid')" in out  # the middle of 3 blocks: all of them exist
        assert [r.split()[0] for r in rows] == ["float32"] * 2 + ["bfloat16"] * 2
    for r in rows:
        ratios = [float(x) for x in r.split() if re.fullmatch(r"\d+\.\d{4}", x)]
        assert ratios and all(math.isfinite(x) and x > 0.5 for x in ratios), r
