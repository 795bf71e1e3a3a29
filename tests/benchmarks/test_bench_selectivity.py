"""benchmarks/bench_selectivity.py end to end at a small size: the --json schema issue 18 gives."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"method", "config", "d_forget", "d_retain", "d_real_authors", "d_world_facts", "weights_changed"}


def test_bench_writes_the_frontier_json_and_png(tmp_path):
    out, png = tmp_path / "sel.json", tmp_path / "sel.png"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TIMEROME_CACHE=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_selectivity.py"), "--models", "embedded",
                          "--methods", "codebook,memit", "--alphas", "4", "--n-mc", "2", "--json", str(out),
                          "--png", str(png), "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())["methods"]
    assert [(r["method"], r["config"].get("alpha")) for r in rows] == [("codebook", None), ("codebook", 4.0),
                                                                        ("memit", None)]
    for r in rows:
        assert set(r) == KEYS and r["config"]["model"] == "embedded"
        assert all(math.isfinite(r[k]) for k in KEYS if k.startswith("d_"))
    assert [r["weights_changed"] for r in rows] == [False, False, True]
    assert rows[0]["d_forget"] < -10 and abs(rows[0]["d_retain"]) < 0.05  # the default point, as in the tests
    assert png.stat().st_size > 10_000 and "MET" in run.stdout
