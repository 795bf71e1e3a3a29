"""benchmarks/device_check.py runs (here on the CPU against the CPU: on a GPU it is the device check)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def test_device_check_runs_the_fixture_part_and_writes_its_rows(tmp_path):
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TIMEROME_TEST_FIXTURES=str(FIXTURES.parent))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--device", "cpu",
                          "--parts", "fixtures", "--json", str(out)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 12 and all(r["ok"] for r in rows)  # six cases x (fp32 against official, bf16 bound)
    assert all(r["value"] <= 1e-5 for r in rows if "sites" in r["check"])
    assert "12 of 12 checks passed" in run.stdout


def test_a_misspelt_part_is_refused_not_passed_with_nothing_checked():
    """`--parts fixture` ran nothing and exited 0 with "0 of 0 checks passed" (stop 61's audit)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"), "--device", "cpu",
                          "--parts", "fixture"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "--parts takes fixtures and/or embedded" in run.stderr
