"""Every benchmark script refuses a bad option, or input the package refuses, in one line with exit
status 2, before any work: never a traceback (stop 61's leftovers: bench_rwku, bench_selectivity,
bench_default_model took a misspelt list and failed half-way with a Python traceback)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "benchmarks").glob("*.py"))

CASES = [  # (script, arguments, what the one line says)
    ("bench_rwku.py", ["--bench-data", "/nonexistent-bench"], "benchmark directory /nonexistent-bench does not exist"),
    ("bench_rwku.py", ["--bench-data", "x", "--alphas", "4,b"], "--alphas takes comma-separated numbers"),
    ("bench_rwku.py", ["--bench-data", "x", "--parts", "costs"], "--parts takes distinct names"),
    ("bench_rwku.py", ["--bench-data", "x", "--rounds", "0"], "--rounds must be >= 1"),
    ("bench_selectivity.py", ["--methods", "rome,romee"], "--methods takes distinct names"),
    ("bench_selectivity.py", ["--seeds", "0,0"], "--seeds takes distinct whole numbers"),
    ("bench_selectivity.py", ["--alphas", "inf"], "--alphas takes finite numbers > 0"),
    ("bench_default_model.py", ["--splits", "forget02"], "--splits takes distinct splits"),
    ("bench_default_model.py", ["--slack", "4,x"], "--slack takes comma-separated whole numbers"),
    ("bench_bare_objects.py", ["--budgets", "15,0"], "--budgets and --n must be >= 1"),
    ("bench_malloc.py", ["--parts", "likelihood,sampling"], "--parts takes a comma-separated subset"),
    ("bench_malloc.py", ["--pairs", "0"], "--pairs must be >= 1"),
]


def run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("script,args,says", CASES, ids=[f"{c[0]}:{' '.join(c[1])}" for c in CASES])
def test_a_bad_option_is_one_line_and_exit_2(script, args, says):
    got = run(script, args)
    assert got.returncode == 2, got.stdout[-1000:] + got.stderr[-1000:]
    assert says in got.stderr and "Traceback" not in got.stderr, got.stderr[-1000:]
    assert got.stderr.strip().splitlines()[-1].startswith(("error:", f"{script}: error:"))


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_every_benchmark_runs_its_main_through_script(bench):
    """`timerome.errors.script` is what turns the package's refusal into one line: a script whose
    `__main__` calls main() bare shows the same refusal as a traceback."""
    tree = ast.parse(bench.read_text(encoding="utf-8"))
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(mains) == 1, f"{bench.name}: no `if __name__ == '__main__':` block"
    assert "script(main)" in ast.unparse(mains[0]), f"{bench.name}: __main__ does not run script(main)"


def test_script_turns_a_refusal_into_one_line(capsys):
    from timerome.errors import TimeromeError, script

    def refuses():
        raise TimeromeError("no such\n   folder")

    assert script(refuses) == 2 and capsys.readouterr().err == "error: no such folder\n"
    assert script(lambda: None) == 0 and script(lambda: 3) == 3
    with pytest.raises(ValueError):  # not a refusal: a bug, shown in full
        script(lambda: int("x"))
