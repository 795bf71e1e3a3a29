"""EditMemory over the ridge's two forms and the TopQ index: same updates, files without F x F."""

import json

import numpy as np
import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.common.cache import tensors_digest
from timerome.memory.edit_memory import EditMemory
from timerome.memory.topq import top_q_combine
from timerome.memory.whitening import ResidualStats

SITE = (1, "resid")


@pytest.fixture(scope="module")
def bb(tmp_path_factory):
    return load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny") / "m", layers=3))


def synthetic(n, H, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, generator=g, dtype=torch.float64) * 2, torch.randn(n, H, generator=g, dtype=torch.float64)


def background(H, seed=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(4 * H, H, generator=g, dtype=torch.float64)
    return ResidualStats(SITE[0], SITE[1], torch.randn(H, generator=g, dtype=torch.float64),
                         X.T @ X / (4 * H) + 0.1 * torch.eye(H, dtype=torch.float64), 4 * H, 0.0)


def memory(bb, U, D, metric, **kw):
    kw = dict(alpha=1.0, lam_absolute=0.5, key_metric=metric, **kw)
    if metric == "whitened":
        kw["background"] = background(bb.hidden_size)
    return EditMemory(bb, SITE, **kw).add_vectors(U, D, [f"f{i}" for i in range(len(U))])


def coefficients(m, h):
    r = m.ridge
    return (h - r.mean if m.key_metric == "whitened" else h) @ r.A.T


@pytest.mark.parametrize("metric", ["paper", "whitened"])
def test_streaming_across_the_forms_equals_the_batch_solve(bb, metric):
    H = bb.hidden_size
    U, D = synthetic(3 * H, H, seed=1)
    stream = memory(bb, U[:4], D[:4], metric)
    for i in range(4, 3 * H):
        stream.add_vectors(U[i:i + 1], D[i:i + 1], [f"f{i}"])
    assert stream.ridge.form == "hidden"
    h = torch.randn(6, H, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for q in (0, 3):
        stream.q = batch_q = q
        batch = memory(bb, U, D, metric, q=batch_q)
        torch.testing.assert_close(stream.delta(h), batch.delta(h), atol=1e-9, rtol=1e-7)
    left = list(range(5, H // 2 + 5))                    # remove down to H / 2: the facts form again
    stream.remove([f"f{i}" for i in range(3 * H) if i not in left])
    assert stream.ridge.form == "facts" and len(stream) == H // 2
    rest = memory(bb, U[left], D[left], metric, q=3)
    torch.testing.assert_close(stream.delta(h), rest.delta(h), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("metric", ["paper", "whitened"])
def test_index_hook_equals_scoring_every_fact(bb, metric):
    H = bb.hidden_size
    for F in (H // 2 + 3, 5 * H):                        # the facts form and the hidden form
        U, D = synthetic(F, H, seed=F)
        m = memory(bb, U, D, metric)
        h = torch.randn(40, H, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        c = coefficients(m, h)
        m.index_min_facts = 1
        for q in (1, 3):
            m.q = q
            assert m._plan("cpu") == ("scores" if m._index_went_dense() else "index")  # a dense index hands over
            torch.testing.assert_close(m.delta(h), top_q_combine(c, q, m.ridge.D), atol=1e-9, rtol=1e-9)
            with torch.no_grad(), m.applied(bb):          # float32 through the model
                edited = bb.logits(torch.tensor([[3, 5, 7, 9, 11, 4]]))
            m.index_min_facts = 10**9
            assert m._plan("cpu") == "scores"
            with torch.no_grad(), m.applied(bb):
                scored = bb.logits(torch.tensor([[3, 5, 7, 9, 11, 4]]))
            m.index_min_facts = 1
            torch.testing.assert_close(edited, scored, atol=1e-4, rtol=1e-4)


def test_plan(bb):
    H = bb.hidden_size
    m = memory(bb, *synthetic(2 * H, H, seed=5), "paper")
    m.index_min_facts = H
    assert m._plan("cpu") == "map"
    m.alpha = 0.7  # update's fused addmm (alpha in the add) is _change's map, op by op
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    torch.testing.assert_close(m.update(x), m._updated(x), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(m.update(x) - x, m._change(x.reshape(-1, H)).view_as(x), atol=1e-12, rtol=1e-12)
    m.q = 2
    assert m._plan("cpu") == "index"
    assert m._plan("meta") == "scores"                   # the int8 screen is for CPU tensors
    m.g_max = 1.0
    assert m._plan("cpu") == "scores"                    # clipping changes the order: every fact is scored
    m.g_max, m.q = None, 0
    small = memory(bb, *synthetic(H // 4, H, seed=6), "paper")
    assert small._plan("cpu") == "scores"                # 2 F < H: c D is cheaper than the [H, H] map
    # an index that found screening dearer than scoring every fact: the scores follow, without its transform
    m.q = 2
    h = torch.randn(40, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    before = m.delta(h)
    index = m._matrices(torch.device("cpu"), torch.float64, "index")[0]
    index.dense = True
    assert m._plan("cpu") == "scores"
    torch.testing.assert_close(m.delta(h), before, atol=1e-9, rtol=1e-9)
    m.remove(["f0"])                                      # a new version of the memory: a fresh index
    assert m._plan("cpu") == "index"


@pytest.mark.parametrize("metric", ["paper", "whitened"])
def test_a_file_of_more_facts_than_dimensions_holds_no_g(bb, metric, tmp_path):
    from safetensors import safe_open

    H = bb.hidden_size
    for F, has_g in ((3 * H, False), (H, True)):
        m = memory(bb, *synthetic(F, H, seed=F), metric, q=2)
        path = m.save(tmp_path / f"{metric}{F}.safetensors")
        with safe_open(str(path), framework="pt") as f:
            assert ("G" in f.keys()) == has_g
            shapes = [tuple(f.get_slice(k).get_shape()) for k in f.keys()]
        assert all(min(s) <= H for s in shapes if len(s) == 2), shapes
        back = EditMemory.load(path, bb)
        assert back.ridge.form == m.ridge.form and back.fact_ids == m.fact_ids
        h = torch.randn(5, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        torch.testing.assert_close(back.delta(h), m.delta(h), atol=1e-9, rtol=1e-7)


def test_a_file_of_few_facts_without_g_is_refused(bb, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    H = bb.hidden_size
    m = memory(bb, *synthetic(H // 2, H, seed=8), "paper")
    path = m.save(tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["timerome"])
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "G"}
    meta["sha256"] = tensors_digest(tensors)
    save_file(tensors, str(tmp_path / "no_g.safetensors"), metadata={"timerome": json.dumps(meta)})
    with pytest.raises(TimeromeError, match="lacks the tensor G"):
        EditMemory.load(tmp_path / "no_g.safetensors", bb)


def test_update_called_directly_checks_what_applied_checks(bb):
    """EditMemory.update, called on its own, skipped applied()'s checks: q above the facts raised torch's
    "selected index k out of range", a wrong width a reshape error, an alpha set to NaN returned NaN."""
    H = bb.hidden_size
    m = memory(bb, *synthetic(3, H, seed=9), "paper")
    h = torch.randn(1, 3, H, dtype=torch.float64)
    torch.testing.assert_close(m.update(h), h + m.delta(h))
    m.q = 50
    with pytest.raises(TimeromeError, match="q=50 exceeds the number of facts"):
        m.update(h)
    m.q = 0
    with pytest.raises(TimeromeError, match=f"h has hidden size {H + 1}, the memory {H}"):
        m.update(torch.randn(1, 3, H + 1, dtype=torch.float64))
    m.alpha = float("nan")
    with pytest.raises(TimeromeError, match="alpha"):
        m.update(h)
    m.alpha = None
    with pytest.raises(TimeromeError, match="alpha"):
        m.update(h)
    m.alpha, m.q = 1.0, np.int64(2)  # an integer of numpy's: checked, then used
    torch.testing.assert_close(m.update(h), h + m.delta(h))
    empty = EditMemory(bb, SITE, alpha=1.0, lam_absolute=0.5, key_metric="paper")
    with pytest.raises(TimeromeError, match="the edit memory is empty"):
        empty.update(h)
