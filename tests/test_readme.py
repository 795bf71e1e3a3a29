"""The README's Python tour runs as a user would copy it: the block under "## Python tour", as it
stands in the README, in a fresh process and an empty folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(section: str) -> str:
    """The first ```python block under the README heading `section`."""
    text = README.read_text()
    start = text.index(f"\n{section}\n")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, f"no python block under {section!r} in the README"
    return found.group(1)


def test_the_readme_python_tour_runs(tmp_path):
    code = python_block("## Python tour")
    (tmp_path / "tour.py").write_text(code)
    env = dict(os.environ, TIMEROME_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("heatmap.png", "trace.safetensors", "api-forget.safetensors"):  # what it says it writes
        assert (tmp_path / name).is_file(), name
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Backbone(") and "Efficacy" in done.stdout and "ForgetLP" in done.stdout
    assert lines[-1] == "torch.Size([1, 6, 128])"  # the hooks' kept residual: one prompt, its tokens, hidden
