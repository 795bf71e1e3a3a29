import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models: thread start-up costs more than it saves, and CI has 2 cores
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def find_tofu():
    """The shared TOFU copy: $TIMEROME_TEST_TOFU, the checkout's ../shared/data/tofu, or /work's."""
    here = Path(__file__).resolve().parents[2]
    for p in (os.environ.get("TIMEROME_TEST_TOFU"), here / "shared" / "data" / "tofu", "/work/shared/data/tofu"):
        if p and (Path(p) / "forget01.json").exists():
            return Path(p)
    return here / "shared" / "data" / "tofu"  # absent: the tests that need it say where they looked


TOFU_DIR = find_tofu()


@pytest.fixture(scope="module")
def task():
    """The embedded forget01 split (1 author x 20 facts) with its retain/real/world rows."""
    from timerome.data.task import forget_task

    return forget_task("embedded", "forget01")


def mean_answer_lp(bb, rows, n_mc: int = 4) -> float:
    """Mean answer log-probability of QA rows (fixed seed, so before/after numbers are paired)."""
    from timerome.metrics import answer_logprobs

    lp, _ = answer_logprobs(bb, [r["question"] for r in rows], [r["answer"] for r in rows], n_mc=n_mc, seed=0)
    return float(lp.mean())


def find_fixtures() -> Path:
    """The golden backbone fixtures (`timerome.backbones.golden.search_roots`: $TIMEROME_TEST_FIXTURES, the
    checkout's ../shared/fixtures, or /work's); where absent, the checkout's path, and the tests say where they looked."""
    from timerome.backbones import golden

    checkout = Path(__file__).resolve().parents[1]
    return golden.find_root(checkout) or checkout.parent / "shared" / "fixtures" / "backbones"


FIXTURES = find_fixtures()


def live_steps(bb, fact, steps=4) -> int:
    """Forwards a fact's rows need with the "decided" read-out (`tie.forwards_read`)."""
    from timerome.engine.encoding import encode_fact
    from timerome.tracing.tie import forwards_read

    return forwards_read(len(encode_fact(bb, fact, 0).object_ids), steps)


@pytest.fixture(scope="module")
def tiny_bb(tmp_path_factory):
    """A tiny random 3-layer checkpoint of timerome's LLaDA structure (the memory tests' model)."""
    from timerome import load_backbone
    from timerome.backbones.tiny import make_tiny_checkpoint

    return load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny") / "m", layers=3))


@pytest.fixture(scope="module")
def tiny_other_bb(tmp_path_factory):
    """Another one (seed 1): what a memory built on tiny_bb must refuse."""
    from timerome import load_backbone
    from timerome.backbones.tiny import make_tiny_checkpoint

    return load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny2") / "m", layers=3, seed=1))


# Seconds each of the heaviest test files took on one worker (stop 53's 2-core AMD EPYC, the CI command
# with `--durations=0` from an empty cache, summed by file; test_editing_cli and test_bench_trace less what
# stop 53 took out of them). CI runs whole files on two workers (`-n 2 --dist loadfile
# --no-loadscope-reorder`), each taking the next file in collection order when it is free: with the
# heaviest files first, the last files to start are short ones, and neither worker finishes long
# before the other (in alphabetical order, one worker ran the training rebuild alone at the end).
# A stale entry costs time, never a test: the other files keep their own order after these.
HEAVY_FILES = {
    "tests/backbones/test_real_model.py": 387, "tests/cli/test_editing_cli.py": 357,
    "tests/memory/test_rewrite_memory.py": 355, "tests/cli/test_demo.py": 275,
    "tests/training/test_default_model.py": 181, "tests/experiments/test_bench_experiments.py": 149,
    "tests/common/test_concurrency.py": 131, "tests/integrations/test_lm_eval_model.py": 118,
    "tests/metrics/test_extraction.py": 101, "tests/experiments/test_scale_experiments.py": 87,
    "tests/experiments/test_ray_executor.py": 73, "tests/test_bad_inputs.py": 68,
    "tests/methods/test_unlearning_baselines.py": 63, "tests/training/test_training.py": 58,
    "tests/methods/test_locate_edit_baselines.py": 44, "tests/tracing/test_causal_trace.py": 37,
    "tests/evaluation/test_evaluation.py": 31, "tests/memory/test_codebook_memory.py": 24,
    "tests/benchmarks/test_bench_selectivity.py": 23,
}


def pytest_collection_modifyitems(config, items):
    """The heaviest files first (HEAVY_FILES), each file's tests in their own order."""
    def weight(item):
        return -HEAVY_FILES.get(item.nodeid.split("::", 1)[0], 0)

    items.sort(key=weight)  # stable: the other files and every file's own tests keep their order


def bare_request(request):
    """An edit request with a bare object and target, as CounterFact's target_true / target_new: the
    words where its answer and its target differ ('Hidden Tower' / 'Crimson Forest')."""
    from dataclasses import replace

    a, b = request.fact.object.split(), request.fact.target.split()
    i = next(k for k in range(min(len(a), len(b))) if a[k] != b[k])
    j = next(k for k in range(min(len(a), len(b)) - i) if a[-1 - k] != b[-1 - k])
    return replace(request, fact=replace(request.fact, object=" ".join(a[i:len(a) - j]),
                                         target=" ".join(b[i:len(b) - j])))
