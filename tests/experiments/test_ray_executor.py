"""Experiments on Ray: a local Ray instance computes the same cells, into the same cache, as the local executor.

Ray is a test dependency (pip install -e ".[test]"); where it is missing or cannot start, these tests say why.
"""

import json

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[test]' (or [ray])")

from timerome import TimeromeError, load_backbone  # noqa: E402
from timerome.experiments import Cell, Context, Runner, run_experiment  # noqa: E402
from timerome.experiments.executors import connect, ray_executor  # noqa: E402
from timerome.experiments.report import without_costs  # noqa: E402

SMALL = dict(n_mc=2, n_retain=3, n_world=2, alphas=(6.0,), paper_point=None, methods=["no_edit"])


@pytest.fixture(scope="module")
def local_ray():
    try:
        connect(None, dict(num_cpus=2))
    except TimeromeError as e:
        pytest.skip(f"Ray cannot start a local instance here: {e}")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


def test_ray_gives_the_same_json_as_the_local_executor(bb, tmp_path, local_ray):
    torch.set_num_threads(1)  # the workers run one thread each: the same arithmetic, bit for bit
    kw = dict(seeds=(0, 1), overrides=SMALL, progress=False, backbone=bb)
    run_experiment("pareto", out_dir=tmp_path / "local", **kw)
    run_experiment("pareto", out_dir=tmp_path / "ray", executor=ray_executor(), **kw)
    a = json.loads((tmp_path / "local" / "pareto.json").read_text())
    b = json.loads((tmp_path / "ray" / "pareto.json").read_text())
    assert without_costs(a) == without_costs(b)
    cells = sorted(p.name for p in (tmp_path / "local" / "cells").glob("*.json"))
    assert cells == sorted(p.name for p in (tmp_path / "ray" / "cells").glob("*.json")) and len(cells) == 4
    for name in cells:
        ra = json.loads((tmp_path / "local" / "cells" / name).read_text())
        rb = json.loads((tmp_path / "ray" / "cells" / name).read_text())
        assert without_costs(ra) == without_costs(rb)
        assert ra["result"]["metrics"]["wall_seconds"] > 0 and rb["result"]["metrics"]["wall_seconds"] > 0


def test_a_sweep_resumes_on_another_executor_and_no_cell_runs_twice(bb, tmp_path, local_ray):
    from timerome.experiments.runner import local_executor

    computed = []

    def counting(inner):
        def run(cells, ctx, done, **kw):
            computed.append([(c.row, c.seed) for c in cells])
            inner(cells, ctx, done, **kw)
        return run

    kw = dict(overrides=SMALL, progress=False, backbone=bb, out_dir=tmp_path)
    run_experiment("pareto", seeds=(0,), executor=counting(local_executor), **kw)
    run_experiment("pareto", seeds=(0, 1), executor=counting(ray_executor()), **kw)
    run_experiment("pareto", seeds=(0, 1), executor=counting(local_executor), **kw)
    assert [sorted(s for _, s in c) for c in computed] == [[0, 0], [1, 1], []]


def test_a_failing_cell_on_a_worker_is_one_clear_error(bb, tmp_path, local_ray):
    ctx = Context(bb, progress=False)
    cell = Cell("lp", "timerome", {"coordinate": [99, "resid"]}, data=dict(n_retain=2, n_world=1),
                options=dict(n_mc=2), row="bad layer")
    with pytest.raises(TimeromeError, match="layer 99"):
        Runner(tmp_path, progress=False, executor=ray_executor()).run([cell], ctx)
    assert not list((tmp_path / "cells").glob("*.json"))  # nothing cached for the failed cell
